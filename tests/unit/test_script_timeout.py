"""The collective timeout of a process group zerolaunch starts inside a user's script: ZEROLAUNCH_TIMEOUT
(launch/env.py `script_timeout_s`, which `zerolaunch train --timeout` sets for an entrypoint script) is read
as seconds, a bad value is a UserError naming the variable, and the HF arguments' ddp_timeout (the group
accelerate starts) takes it unless the script set its own; a script's rank that timed out names the ranks that
never timed out with it (launch/hang_census.py).

Leaves out: the groups themselves timing out (tests/e2e/test_hangs_orphans.py).
"""

import pytest

from zerolaunch.config.errors import UserError
from zerolaunch.launch import env


def test_the_variable_is_read_as_seconds_and_unset_is_none(monkeypatch):
    monkeypatch.delenv(env.TIMEOUT_ENV, raising=False)
    assert env.script_timeout_s() is None
    monkeypatch.setenv(env.TIMEOUT_ENV, "12.5")
    assert env.script_timeout_s() == 12.5


@pytest.mark.parametrize("raw", ["soon", "0", "-3", "inf", "nan"])
def test_a_bad_value_names_the_variable(monkeypatch, raw):
    monkeypatch.setenv(env.TIMEOUT_ENV, raw)
    with pytest.raises(UserError) as err:
        env.script_timeout_s()
    assert (
        f"ZEROLAUNCH_TIMEOUT={raw!r}" in err.value.message
        and "positive number of seconds" in err.value.message
    )


def test_entrypoint_env_sets_and_restores_it(monkeypatch):
    monkeypatch.delenv(env.TIMEOUT_ENV, raising=False)
    with env.entrypoint_env("/r.json", "gloo", 20.0):
        assert env.script_timeout_s() == 20.0
    assert env.script_timeout_s() is None


def test_hf_arguments_take_it_unless_the_script_set_ddp_timeout(monkeypatch, tmp_path):
    from zerolaunch.hf import TrainingArguments

    monkeypatch.setenv(env.TIMEOUT_ENV, "20")
    assert TrainingArguments(output_dir=str(tmp_path), use_cpu=True).ddp_timeout == 20
    assert TrainingArguments(output_dir=str(tmp_path), use_cpu=True, ddp_timeout=77).ddp_timeout == 77
    monkeypatch.delenv(env.TIMEOUT_ENV)
    assert TrainingArguments(output_dir=str(tmp_path), use_cpu=True).ddp_timeout == 1800


def test_the_census_names_the_ranks_that_never_timed_out_with_this_one():
    import torch.distributed as dist

    from zerolaunch.launch.hang_census import looks_like_timeout, missing_ranks

    store = dist.HashStore()
    assert missing_ranks(store, 0, 3, attempt=0, wait_s=0.2) == [1, 2]
    assert missing_ranks(store, 2, 3, attempt=0, wait_s=0.2) == [1]
    assert missing_ranks(store, 1, 3, attempt=1, wait_s=0.2) == [0, 2]  # a restart's census starts afresh
    assert looks_like_timeout(RuntimeError("[gloo] Timed out waiting 5000ms for recv operation to complete"))
    assert not looks_like_timeout(RuntimeError("Connection closed by peer"))
