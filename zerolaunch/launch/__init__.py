"""Starting a run: `launch(...)` (launcher.py) resolves the recipe, writes the run dir and runs the workers
under torch's elastic agent. ports.py (free ports), devices.py (--gpus / --cpu), logs.py (per-rank log
files, what reaches the terminal), failures.py (the root-cause panel). env.py is the one module that reads
zerolaunch's and torchelastic's environment variables (the launcher, worker.py and the library API call it).
"""
