"""A zerolaunch.hf Trainer script started four ways on 2 CPU ranks: torchrun, `accelerate launch` (no
DeepSpeed plugin, and with one), and `zerolaunch train recipe.yaml` with `entrypoint:` naming the script.

The same script, data and seed under each launcher must train at world size 2 and log the same losses (the
launchers differ only in how the ranks and the group start). Also: accelerate launch with a DeepSpeed plugin
(`distributed_type: DEEPSPEED`) whose `deepspeed_config_file` runs on the engine, one line saying so; a plugin
without a config file refused with the fix named; accelerate asked for 2 processes that starts 1 says so.
Leaves out: CUDA/nccl, multi-node, the numbers themselves (the side-by-side tests).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from _helpers import free_port, torchrun_cmd

pytest.importorskip("accelerate")
pytest.importorskip("transformers", minversion="5.17")  # the Trainer hooks zerolaunch.hf replaces
pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
SCRIPT = Path(__file__).with_name("_hf_launch_train.py")
# the config _hf_launch_train.py gives TrainingArguments(deepspeed=...) itself
DS_CONFIG = {"zero_optimization": {"stage": 2, "reduce_bucket_size": "auto"}, "train_batch_size": "auto"}
KINDS = ["torchrun", "accelerate", "zerolaunch", "accelerate-deepspeed"]


def _env(**extra) -> dict:
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(REPO), COLUMNS="200")
    env.pop("ZEROLAUNCH_RECIPE", None)
    env.pop("DS_ACCELERATOR", None)  # as on a user's machine: DeepSpeed, where installed, picks its own
    env.update(extra)
    return env


def _launch(kind: str, cwd: Path, **env) -> subprocess.CompletedProcess:
    if kind == "torchrun":
        cmd = torchrun_cmd(SCRIPT, "--from", kind)
    elif kind == "accelerate-deepspeed":
        # the seed's own accelerate flow: a DeepSpeed plugin whose config file the script runs on the engine
        (cwd / "ds_config.json").write_text(json.dumps(DS_CONFIG))
        (cwd / "accelerate.yaml").write_text(
            "distributed_type: DEEPSPEED\n"
            "deepspeed_config:\n  deepspeed_config_file: ds_config.json\n  zero3_init_flag: false\n"
            "num_machines: 1\nnum_processes: 2\nmachine_rank: 0\nmixed_precision: 'no'\nuse_cpu: false\n"
        )
        cmd = [
            sys.executable,
            "-m",
            "accelerate.commands.launch",
            "--config_file",
            "accelerate.yaml",
            "--main_process_port",
            str(free_port()),
            str(SCRIPT),
            "--from",
            kind,
            "--ds-from-accelerate",
        ]
    elif kind == "accelerate":
        cmd = [
            sys.executable,
            "-m",
            "accelerate.commands.launch",
            # accelerate's torchrun launcher (its --cpu one starts several processes only through mpirun); the
            # script's use_cpu=True keeps the ranks on the CPU, with gloo
            "--multi_gpu",
            "--num_processes",
            "2",
            "--num_machines",
            "1",
            "--mixed_precision",
            "no",
            "--dynamo_backend",
            "no",
            "--main_process_port",
            str(free_port()),
            str(SCRIPT),
            "--from",
            kind,
        ]
    else:
        recipe = cwd / "recipe.yaml"
        recipe.write_text(
            json.dumps({"entrypoint": f"{SCRIPT} --from {kind}", "train": {"run_dir": str(cwd / "run")}})
        )
        cmd = [sys.executable, "-m", "zerolaunch", "train", str(recipe), "--cpu", "2"]
    return subprocess.run(cmd, cwd=cwd, env=_env(**env), capture_output=True, text=True, timeout=400)


@pytest.fixture(scope="module")
def launched(tmp_path_factory):
    out = {}
    for kind in KINDS:
        cwd = tmp_path_factory.mktemp(kind)
        proc = _launch(kind, cwd)
        assert proc.returncode == 0, f"{kind}:\n{proc.stdout[-3000:]}\n{proc.stderr[-4000:]}"
        out[kind] = [json.loads((cwd / f"hf_{r}.json").read_text()) for r in (0, 1)]
        out[kind + " output"] = proc.stdout + proc.stderr
    return out


@pytest.mark.parametrize("kind", KINDS)
def test_trains_at_world_size_two(launched, kind):
    for seen in launched[kind]:
        assert seen["world"] == 2 and seen["argv"][:2] == ["--from", kind]
        assert len(seen["losses"]) == 3


def test_same_losses_under_every_launcher(launched):
    for kind in KINDS[1:]:
        assert launched[kind][0]["losses"] == launched["torchrun"][0]["losses"], kind


def test_zerolaunch_cpu_workers_do_not_print_deepspeeds_accelerator_warning(launched):
    # the Trainer (accelerate's unwrap_model) imports DeepSpeed wherever it is installed, and DeepSpeed then
    # warns that it found no GPU; `zerolaunch train --cpu` asked for the CPU, so its workers say which
    import importlib.util

    if importlib.util.find_spec("deepspeed") is None:
        pytest.skip("DeepSpeed is not installed: nothing imports it")
    assert "Setting accelerator to CPU" not in launched["zerolaunch output"]
    assert "Setting accelerator to CPU" in launched["torchrun output"]  # the import did happen


def test_accelerate_deepspeed_config_file_runs_on_the_engine_saying_so(launched):
    lines = [
        line for line in launched["accelerate-deepspeed output"].splitlines() if "ds_config.json" in line
    ]
    assert len(lines) == 1 and "zerolaunch" in lines[0], lines  # one line, from rank 0 only


def test_accelerate_deepspeed_plugin_without_a_config_file_is_refused(tmp_path):
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--ds-from-accelerate"],
        cwd=tmp_path,
        env=_env(ACCELERATE_USE_DEEPSPEED="true"),
        capture_output=True,
        text=True,
        timeout=200,
    )
    assert proc.returncode != 0
    assert "deepspeed_config_file" in proc.stderr and "TrainingArguments(deepspeed=...)" in proc.stderr


def test_accelerate_asked_for_two_processes_that_starts_one_says_so(tmp_path):
    """The README's old form on a host without GPUs: accelerate's plain launcher runs one process."""
    import torch

    if torch.cuda.device_count() > 1:
        pytest.skip("accelerate picks its multi-GPU launcher here by itself")
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--num_processes", "2", "--num_machines", "1"]
    cmd += ["--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port", str(free_port())]
    proc = subprocess.run(
        [*cmd, str(SCRIPT), "--from", "one"],
        cwd=tmp_path,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert json.loads((tmp_path / "hf_0.json").read_text())["world"] == 1  # what the warning is about
    assert not (tmp_path / "hf_1.json").exists()
    warning = " ".join(proc.stderr.split())
    assert "ONE process" in warning and "--multi_gpu --num_processes N" in warning
