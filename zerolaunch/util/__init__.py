"""Low-level helpers every layer may import: the standard library only, nothing of zerolaunch outside util/.

- `atomic.py`: crash-safe filesystem steps ([Note: atomic save]).
- `sizes.py`: sizes and counts as users write them ("80GiB", "1.3b"), dtype names and their bytes; `fmt_bytes`.
- `hf_env.py`: the Hugging Face environment zerolaunch runs under (offline).
- `exit_codes.py`: the worker's documented exit codes.
- `errors.py`: `UserError`, the base of every error in the user's input.
- `disk_errors.py`: a write the disk refused (full, read-only, no permission) as one `DiskError` paragraph.
- `filelock.py`: an exclusive flock whose file names its holder (run locks, prepare-data's OUT lock).
- `overlap.py`: whether an output path is, holds or lies inside an input path.
"""
