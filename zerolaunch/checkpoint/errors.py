"""The one exception type of the checkpoint package.

Every bad input (not a checkpoint, missing or truncated rank file, shape mismatch, refused overwrite) is a
`CheckpointError` whose message names the file and the fix. It is a `UserError` (util/errors.py, a leaf
module with no imports of ours), so every command -- train resuming, convert-checkpoint -- prints it as one
red paragraph and exits 2 without a traceback.
"""

from __future__ import annotations

from zerolaunch.util.errors import UserError


class CheckpointError(UserError):
    """A checkpoint could not be written, read or converted; the message says why and what to do."""
