"""`zerolaunch estimate-memory` through the real command tree: the three inputs, --json, and bad input.

Tests: --params (table + recommendation, no torch), --model (exact count of the built-in GPT), a recipe file
(its micro-batch, seq_len and stage-3 units), a DeepSpeed config with --model / --params (its settings, pure
bf16 included) and alone (refused, not sized as the default model), every kind of bad input -> one error line
and exit 2.
Leaves out: --measure (test_estimate_measure.py).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from _helpers import tiny_llama
from typer.testing import CliRunner

from zerolaunch.cli.app import app

pytestmark = pytest.mark.e2e
ROOT = Path(__file__).resolve().parents[2]
runner = CliRunner()


def _run(*args):
    return runner.invoke(app, ["estimate-memory", *args])


def _json(*args) -> dict:
    result = _run(*args, "--json")
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


def test_params_prints_the_table_and_a_recommendation():
    result = _run("--params", "7e9", "--gpus", "8", "--gpu-memory", "80GiB")
    assert result.exit_code == 0, result.output
    out = result.output
    assert "per GPU, GiB" in out and "per CPU node" in out and "DS GPU" in out
    # stage 0 needs ~156 GiB per GPU for 7B; stages 1 and 2 communicate the same, stage 2 leaves more room
    assert "Recommended: zero stage 2 (" in out and "10% headroom" in out


def test_params_json_has_every_stage_and_offload_row():
    data = _json("--params", "7B", "--gpus", "4", "--nodes", "2", "--gpu-memory", "80GB", "--dtype", "bf16")
    assert data["model"]["params"] == 7 * 10**9 and data["setup"]["world_size"] == 8
    labels = [r["label"] for r in data["rows"]]
    assert labels[0] == "stage 0" and "stage 3 + optimizer+params-cpu" in labels
    assert {r["stage"] for r in data["rows"]} == {0, 1, 2, 3}
    assert data["recommended"]["stage"] == 2
    s3 = next(r for r in data["rows"] if r["label"] == "stage 3")
    assert s3["gpu_total_bytes"] < next(r for r in data["rows"] if r["label"] == "stage 0")["gpu_total_bytes"]


def test_model_counts_the_builtin_gpt_exactly():
    import torch

    from zerolaunch.models.gpt import build

    with torch.device("meta"):
        model = build(size="125m", vocab_size=50304, seq_len=1024)
    want = sum(p.numel() for p in model.parameters())
    data = _json("--model", "gpt-125m", "--gpus", "2", "--micro-batch", "4", "--seq-len", "1024")
    assert data["model"]["params"] == want and data["model"]["exact"] is True
    assert data["rows"][0]["activation_bytes"] > 0
    assert data["recommended"] is None  # no GPU here and no --gpu-memory given


def _peak(row):
    return row["gpu_total_bytes"]


def test_recipe_takes_its_batch_and_sequence_and_builds_on_meta():
    data = _json(str(ROOT / "recipes" / "tiny-gpt.yaml"), "--gpus", "2", "--gpu-memory", "1GiB")
    assert data["setup"]["micro_batch"] == 8 and data["setup"]["seq_len"] == 64
    roomiest = min((r for r in data["rows"] if r["offload"] == "none" and r["stage"] < 3), key=_peak)
    assert data["model"]["exact"] and data["recommended"] == {
        "stage": roomiest["stage"],
        "offload": "none",
        "activation_checkpointing": False,
    }


def test_recipe_set_override_reaches_the_estimate():
    data = _json(str(ROOT / "recipes" / "tiny-gpt.yaml"), "--set", "train.micro_batch_size=2")
    assert data["setup"]["micro_batch"] == 2


DS_PURE_BF16 = {
    "train_micro_batch_size_per_gpu": 4,
    "bf16": {"enabled": True, "bf16_master_weights_and_grads": True, "bf16_optimizer_states": True},
    "zero_optimization": {"stage": 2},
}


def test_a_deepspeed_config_sizes_the_model_given_by_flag(tmp_path):
    # a bare ds_config.json has no model: its engine and batch settings, the shape from --model / --params
    config = tmp_path / "ds_config.json"
    config.write_text(json.dumps(DS_PURE_BF16))
    data = _json(str(config), "--model", "1.3b", "--gpus", "1")
    assert (
        data["setup"]["engine"]["precision"]["master_dtype"] == "bf16" and data["setup"]["micro_batch"] == 4
    )
    assert "settings from" in data["model"]["source"] and "gpt-1.3b" in data["model"]["source"]
    alone = _json("--model", "1.3b", "--gpus", "1")
    # pure bf16: 2 + 4 bytes of master and moments per element where the default keeps 4 + 8
    row = {r["label"]: r for r in data["rows"]}["stage 2"]
    fp32 = {r["label"]: r for r in alone["rows"]}["stage 2"]
    assert row["gpu"]["optimizer"] * 2 == fp32["gpu"]["optimizer"]
    assert (
        _json(str(config), "--params", "7e9", "--gpus", "8")["setup"]["engine"]["precision"]["master_dtype"]
        == "bf16"
    )


@pytest.mark.parametrize(
    "extra, message",
    [
        ([], "names no model (a DeepSpeed config?): add --model"),  # not a silent tiny-GPT stand-in
        (["--params", "1e9", "--measure"], "--measure runs real steps of a RECIPE's own model"),
    ],
)
def test_a_deepspeed_config_alone_is_refused(tmp_path, extra, message):
    config = tmp_path / "ds_config.json"
    config.write_text(json.dumps(DS_PURE_BF16))
    result = _run(str(config), *extra)
    assert result.exit_code == 2 and message in result.output, result.output


def test_a_recipe_with_its_own_model_refuses_another():
    result = _run(str(ROOT / "recipes" / "tiny-gpt.yaml"), "--model", "1.3b")
    assert result.exit_code == 2 and "names its model already; drop --model" in result.output


@pytest.mark.parametrize(
    "args, message",
    [
        (["--params", "0"], "positive"),
        (["--params", "-5"], "positive"),
        (["--params", "lots"], "cannot read 'lots'"),
        (["--params", "1e9", "--gpus", "0"], "--gpus"),
        (["--params", "1e9", "--nodes", "-1"], "--nodes"),
        (["--params", "1e9", "--gpu-memory", "80gigs"], "80GiB"),
        (["--params", "1e9", "--micro-batch", "0"], "--micro-batch"),
        (["--params", "1e9", "--dtype", "int8"], "bf16, fp16, fp32"),
        (["--model", "gpt-13b"], "Did you mean gpt-1.3b"),
        ([], "exactly one of RECIPE, --params or --model"),
        (["--params", "1e9", "--model", "gpt-tiny"], "got --params and --model"),
        (["no/such/recipe.yaml"], "no/such/recipe.yaml"),
        (["--params", "1e9", "--measure"], "--measure"),
        (["--params", "1e9", "--headroom", "1.5"], "--headroom must be a fraction"),
        (["--params", "1e9", "--cpu-memory", "24G"], "ambiguous"),
    ],
)
def test_bad_input_is_one_clear_error_and_exit_2(args, message):
    result = _run(*args)
    assert result.exit_code == 2, result.output
    assert message in result.output
    assert "Traceback" not in result.output


def test_console_script_answers_without_torch():
    code = (
        "import sys\n"
        "from zerolaunch.cli.app import main\n"
        "sys.argv = ['zerolaunch', 'estimate-memory', '--params', '7e9', '--gpus', '8', '--json']\n"
        "try:\n"
        "    main()\n"
        "except SystemExit as e:\n"
        "    assert not e.code, e.code\n"
        "assert 'torch' not in sys.modules\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["model"]["params"] == 7 * 10**9


def test_gpu_memory_defaults_to_the_visible_gpu(tmp_path, monkeypatch):
    fake = tmp_path / "nvidia-smi"
    fake.write_text("#!/bin/sh\necho 81559\necho 81559\n")  # MiB per GPU, one line per GPU
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    data = _json("--params", "1e9")
    assert data["setup"]["gpu_memory_bytes"] == 81559 * 2**20
    roomiest = min((r for r in data["rows"] if r["offload"] == "none" and r["stage"] < 3), key=_peak)
    assert data["recommended"]["stage"] == roomiest["stage"]


def test_recipe_with_a_custom_model_counts_it_and_says_activations_are_unknown(tmp_path):
    (tmp_path / "net.py").write_text(
        "import torch\n"
        "def build(width=31):\n"
        "    return torch.nn.Sequential(torch.nn.Linear(17, width), torch.nn.Linear(width, 5))\n"
    )
    recipe = tmp_path / "r.yaml"
    recipe.write_text("model:\n  builder: net.py:build\n  args: {width: 29}\n")
    result = _run(str(recipe), "--gpus", "3", "--gpu-memory", "1GiB")
    assert result.exit_code == 0, result.output
    assert "activations not estimated" in result.output
    data = _json(str(recipe), "--gpus", "3")
    assert data["model"]["params"] == 17 * 29 + 29 + 29 * 5 + 5
    assert data["rows"][0]["activation_bytes"] is None


def _tiny_hf_folder(tmp_path):
    transformers = pytest.importorskip("transformers")
    cfg = transformers.AutoConfig.for_model(
        **tiny_llama(intermediate_size=40, num_hidden_layers=2, tie_word_embeddings=False)
    )
    model = transformers.LlamaForCausalLM(cfg)
    model.save_pretrained(tmp_path / "hf")
    # counted independently: every parameter of the real model, each once
    return tmp_path / "hf", sum(p.numel() for p in model.parameters())


def test_hf_path_recipe_and_hf_model_option_are_built_on_meta(tmp_path):
    folder, numel = _tiny_hf_folder(tmp_path)
    recipe = tmp_path / "r.yaml"
    recipe.write_text(
        f"model:\n  builder: zerolaunch.models.hf:build\n  args: {{path: {folder}}}\n"
        "data:\n  builder: zerolaunch.data.synthetic:build\n  args: {vocab_size: 64, seq_len: 16}\n"
    )
    for args in ([str(recipe)], ["--model", str(folder)], ["--model", str(folder / "config.json")]):
        data = _json(*args, "--gpu-memory", "1GiB")
        assert data["model"]["params"] == numel and data["model"]["exact"], args
    result = _run("--model", str(tmp_path / "nothing.json"))
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output


def test_host_ram_defaults_to_this_machine_and_is_named_when_short():
    with open("/proc/meminfo") as f:
        total = next(int(line.split()[1]) * 1024 for line in f if line.startswith("MemTotal:"))
    data = _json("--params", "1e9", "--gpu-memory", "80GiB")
    assert data["setup"]["cpu_memory_bytes"] == total and data["setup"]["headroom"] == 0.1
    result = _run("--params", "7e9", "--gpu-memory", "80GiB", "--cpu-memory", "24GiB")
    assert result.exit_code == 0, result.output
    out = " ".join(result.output.split())  # rich wraps lines
    assert "Nothing fits with 10% headroom: host RAM: needs" in out and "has 24.0 GiB" in out
    assert "Nothing fits in" not in out and "GPU: needs" not in out


def test_headroom_option_decides_what_fits():
    loose = _json("--params", "7e9", "--gpu-memory", "80GiB", "--cpu-memory", "1TiB", "--headroom", "0")
    row = next(r for r in loose["rows"] if r["label"] == "stage 2 + optimizer-cpu")
    # a GPU exactly the size of the row's peak: fits with no headroom, not with 5%
    size = str(row["gpu_total_bytes"])
    exact = _json("--params", "7e9", "--gpu-memory", size, "--cpu-memory", "1TiB", "--headroom", "0")
    assert next(r for r in exact["rows"] if r["label"] == row["label"])["fits"] is True
    tight = _json("--params", "7e9", "--gpu-memory", size, "--cpu-memory", "1TiB", "--headroom", "0.05")
    tight_row = next(r for r in tight["rows"] if r["label"] == row["label"])
    assert tight_row["fits"] is False and tight_row["misfit"] == "GPU"


def test_table_has_the_param_nvme_row_and_largest_micro_batch():
    result = _run("--params", "7e9", "--gpu-memory", "80GiB", "--cpu-memory", "1TiB")
    assert result.exit_code == 0, result.output
    assert "opt+p:nvme" in result.output and "mb*" in result.output
    data = _json("--params", "7e9", "--gpu-memory", "80GiB", "--cpu-memory", "1TiB")
    row = next(r for r in data["rows"] if r["label"] == "stage 3 + optimizer+params-nvme")
    # one rank: fp32 master + two Adam moments (12 bytes/param) + the 16-bit unit shards (2), less the small
    # persistent params, which stay in memory
    assert 13.99 * 7e9 < row["nvme_bytes"] <= 14 * 7e9
    assert row["max_micro_batch_ckpt"] > row["max_micro_batch"] > 0


def test_help_states_the_recommendation_rule():
    result = runner.invoke(app, ["estimate-memory", "--help"], terminal_width=200)
    text = " ".join(result.output.split())
    assert "least offload" in text and "most GPU memory left" in text and "--headroom" in text
