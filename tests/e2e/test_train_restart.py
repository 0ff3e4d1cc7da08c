"""`--max-restarts`: a worker that dies once (the test hook fires on the first attempt only) is restarted
with its whole group, which resumes from the latest checkpoint and finishes, on both rendezvous backends
(c10d needs TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1, pytorch issue 135712, which the launcher sets).

Also covers --resume auto on a finished run's checkpoint. Leaves out: resume at another world size
(checkpoint tests).
"""

import pytest

pytestmark = pytest.mark.e2e


@pytest.mark.parametrize("backend", ["c10d", "static"])
def test_crashed_group_restarts_and_resumes_from_latest(cli, tiny_recipe, tmp_path, backend):
    run_dir = tmp_path / "run"
    proc = cli.run(
        tiny_recipe(steps=6, every=2),
        "--cpu",
        "2",
        "--run-dir",
        run_dir,
        "--max-restarts",
        "1",
        "--rdzv-backend",
        backend,
        timeout=180,
        ZEROLAUNCH_TEST_FAIL_AT_STEP="4",
        ZEROLAUNCH_TEST_FAIL_RANK="1",
        ZEROLAUNCH_TEST_FAIL_MODE="kill",
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    assert "restart 1 of 1" in out
    assert "resumed from" in out and "step_000002" in out
    metrics = cli.metrics(run_dir)
    # attempt 0 logged steps 1-3 (died at the start of 4); attempt 1 resumed after step 2
    assert [m["step"] for m in metrics] == [1, 2, 3, 3, 4, 5, 6]
    # step 3 ran twice from the same state (weights, optimizer, data position): the same loss, exactly
    assert metrics[2]["loss"] == metrics[3]["loss"]
    assert (run_dir / "checkpoints" / "latest").read_text().strip() == "step_000006"
