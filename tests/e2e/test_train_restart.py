"""`--max-restarts`: a worker that dies once (the test's faulty model builder fires on the first attempt only) is restarted
with its whole group, which resumes from the latest checkpoint and finishes, on both rendezvous backends
(c10d needs TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1, pytorch issue 135712, which the launcher sets).

The launcher announces the restart (rank, signal, last step, checkpoint) and metrics.jsonl holds each step
once. Also covers --resume auto on a finished run's checkpoint. Leaves out: resume at another world size
(checkpoint tests).
"""

import pytest

pytestmark = pytest.mark.e2e


@pytest.mark.parametrize("backend", ["c10d", "static"])
def test_crashed_group_restarts_and_resumes_from_latest(cli, tiny_recipe, tmp_path, backend):
    run_dir = tmp_path / "run"
    proc = cli.run(
        tiny_recipe(steps=6, every=2, fault={"step": 4, "rank": 1, "mode": "kill"}),
        "--cpu",
        "2",
        "--run-dir",
        run_dir,
        "--max-restarts",
        "1",
        "--rdzv-backend",
        backend,
        timeout=180,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    # attempt 1 logged steps 1-3 and died at the start of 4; the launcher says who, how, and from where
    assert "attempt 2/2: rank 1 died (SIGKILL) after step 3; resuming from step_000002" in out
    assert "resumed from" in out and "step_000002" in out
    metrics = cli.metrics(run_dir)
    # attempt 2 resumed after step 2: the crashed attempt's step 3 is dropped, each step is there once
    assert [m["step"] for m in metrics] == [1, 2, 3, 4, 5, 6]
    assert (run_dir / "checkpoints" / "latest").read_text().strip() == "step_000006"
