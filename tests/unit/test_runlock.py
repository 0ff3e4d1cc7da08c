"""RunLock: one holder per run_dir lock file; a second acquire names the holder; a dead holder's leftover
record is taken over with a note; release empties the file and frees the lock.

flock locks belong to an open file description, so two RunLocks in one process contend like two
processes would.
"""

import json
import os
import socket

import pytest

from zerolaunch.config.errors import UserError
from zerolaunch.launch.runlock import LOCK_NAME, RunLock, lock_name


def test_a_second_lock_on_the_same_run_dir_is_refused_naming_the_holder(tmp_path):
    with RunLock(tmp_path) as first:
        record = json.loads((tmp_path / LOCK_NAME).read_text())
        assert record["pid"] == os.getpid() and record["host"] == socket.gethostname()
        with pytest.raises(UserError) as err:
            RunLock(tmp_path).acquire()
        assert err.value.exit_code == 2
        message = err.value.message
        assert f"pid {os.getpid()}" in message and socket.gethostname() in message
        assert f"since {record['since']}" in message and "--run-dir" in message
        assert first.note is None
    assert (tmp_path / LOCK_NAME).read_text() == ""
    RunLock(tmp_path).acquire().release()  # free again


def test_a_leftover_record_without_a_live_flock_is_taken_over_with_a_note(tmp_path):
    (tmp_path / LOCK_NAME).write_text(json.dumps({"host": "node7", "pid": 99999, "since": "then"}))
    lock = RunLock(tmp_path).acquire()
    try:
        assert lock.note is not None and "host node7, pid 99999, since then" in lock.note
        assert json.loads((tmp_path / LOCK_NAME).read_text())["pid"] == os.getpid()
    finally:
        lock.release()


def test_an_unreadable_record_still_refuses_while_locked(tmp_path):
    with RunLock(tmp_path):
        # someone scribbles over the record: the flock, not the content, decides
        os.truncate(tmp_path / LOCK_NAME, 0)
        (tmp_path / LOCK_NAME).write_text("garbage{")
        with pytest.raises(UserError, match="in use by another run"):
            RunLock(tmp_path).acquire()


def test_each_node_of_a_multi_node_job_locks_its_own_file():
    assert lock_name(1, None) == LOCK_NAME
    assert lock_name(2, 0) != lock_name(2, 1)
