"""checkpoint's name for zerolaunch/util/atomic.py ([Note: atomic save] is there), which config/ and launch/
use too: the crash-safe filesystem steps live below every layer."""

from zerolaunch.util.atomic import (
    TMP_PREFIX,
    TRASH_PREFIX,
    clean_stale,
    fsync_path,
    publish,
    remove_path,
    remove_tree,
    write_json,
    write_text_atomic,
    writer_unique_name,
)

__all__ = [
    "TMP_PREFIX",
    "TRASH_PREFIX",
    "clean_stale",
    "fsync_path",
    "publish",
    "remove_path",
    "remove_tree",
    "write_json",
    "write_text_atomic",
    "writer_unique_name",
]
