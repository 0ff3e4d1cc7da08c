"""The `zerolaunch` command line: typer + rich only, one module per command, no torch at import time.

So the machinery (config, launch, memory, checkpoint, data) is imported inside the command that needs it, and
`zerolaunch --help` answers without loading it; a test checks that no cli module imports torch at module level.
"""
