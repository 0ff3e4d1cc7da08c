"""`zerolaunch train` on CPU workers, for real (subprocesses, torch elastic, gloo).

Covers: the tiny GPT trains on 2 workers and its loss falls; the run dir holds the resolved recipe,
metrics.jsonl, per-rank logs and the final checkpoint; only rank 0 reaches the terminal; bad flags are
clear errors with exit code 2, and so is a per-group scheduler list that does not fit the built-in loop's 2
param groups (refused by the launcher). Leaves out: failures, signals, restarts, multi-node
(test_train_failures.py, test_train_restart.py, test_train_multinode.py).
"""

import json
import math

import pytest

pytestmark = pytest.mark.e2e


def test_tiny_gpt_trains_on_two_cpu_workers_and_loss_falls(cli, tiny_recipe, tmp_path):
    run_dir = tmp_path / "run"
    proc = cli.run(tiny_recipe(steps=25), "--cpu", "2", "--run-dir", run_dir)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    metrics = cli.metrics(run_dir)
    assert [m["step"] for m in metrics] == list(range(1, 26))
    first, last = metrics[0]["loss"], metrics[-1]["loss"]
    assert abs(first - math.log(64)) < 0.3
    assert last < first - 1.0, (first, last)
    resolved = json.loads((run_dir / "recipe.resolved.json").read_text())
    assert resolved["train"]["steps"] == 25
    assert (run_dir / "checkpoints" / "latest").is_file()
    logs = sorted(p.relative_to(run_dir / "logs").as_posix() for p in (run_dir / "logs").rglob("*.log"))
    assert [p.split("/", 1)[1] for p in logs] == [
        "attempt_0/0/stderr.log",
        "attempt_0/0/stdout.log",
        "attempt_0/1/stderr.log",
        "attempt_0/1/stdout.log",
    ]
    assert "step 25/25" in proc.stdout
    assert "[rank" not in proc.stdout  # rank 0 only, no prefixes


@pytest.mark.parametrize(
    "args, words",
    [
        (["--cpu", "0"], "--cpu needs a worker count >= 1"),
        (["--cpu", "1", "--gpus", "1"], "not both"),
        (["--gpus", "1"], "--cpu N"),
        (["--cpu", "1", "--nnodes", "2"], "--rdzv-endpoint"),
        (["--cpu", "1", "--set", "train.stepz=3"], "train.stepz"),
    ],
)
def test_bad_flags_are_clear_errors(cli, tiny_recipe, tmp_path, args, words):
    proc = cli.run(tiny_recipe(), *args, "--run-dir", tmp_path / "run", timeout=60, CUDA_VISIBLE_DEVICES="")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert words in proc.stderr
    assert "Traceback" not in proc.stderr


def test_a_per_group_list_that_is_not_two_groups_is_refused_before_the_workers(cli, tiny_recipe, tmp_path):
    # the built-in loop has 2 param groups (decay, no-decay): DeepSpeed's per-group warmup_min_lr list of 3
    # values cannot fit; the launcher says so (exit 2, no traceback) before any worker starts.
    text = tiny_recipe().read_text()
    assert "  lr_schedule: constant\n" in text
    text = text.replace("  lr_schedule: constant\n", "")
    text += "\n  scheduler: {type: WarmupLR, params: {warmup_min_lr: [0, 1.0e-4, 0], warmup_num_steps: 2}}\n"
    recipe = tmp_path / "lists.yaml"
    recipe.write_text(text)
    proc = cli.run(recipe, "--cpu", "1", "--run-dir", tmp_path / "run", timeout=60, CUDA_VISIBLE_DEVICES="")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "warmup_min_lr is a list of 3 values" in proc.stderr and "2 param groups" in proc.stderr
    assert "decay and no-decay" in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "run" / "logs").exists()
