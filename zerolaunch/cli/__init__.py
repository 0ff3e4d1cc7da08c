"""The `zerolaunch` command line: typer + rich only, one module per command, no torch at import time."""
