"""The worker's exit codes that the launcher reads (documented in the README): both sides import them from
here, so the launcher does not import the training loop."""

NONFINITE_EXIT_CODE = 3
"""The exit code of a run stopped by train.max_nonfinite_steps."""
