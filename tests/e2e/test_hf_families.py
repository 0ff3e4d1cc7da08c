"""Every Hugging Face causal LM family of _hf_families.py, in and out, at ZeRO stages 2 and 3 on 2 gloo ranks.

Each family is written by transformers' own save_pretrained (the originals), loaded by `hf.build(path=...)`
(stage 3: on meta, filled unit by unit through transformers' conversion mapping; stage 2: from_pretrained),
trained 2 steps, then written by convert-checkpoint and by save_hf_pretrained. Checked against references
that do not come from the code under test:
- before training, the engine's logits equal plain from_pretrained's of the originals (the stage 3 loader);
- the written folders hold save_pretrained's tensor names and shapes (the originals' files: per-expert MoE
  tensors, GPT-NeoX's embed_out), from_pretrained loads them with no missing or unexpected keys, and its
  tensors and logits equal the trained engine's (its gathered full state and its own forward);
- stages 2 and 3 train to the same losses;
- transformers 4.57 (installed beside the main environment, see _old_transformers) loads the converted
  folders with no missing or unexpected keys, every tensor equal to the files and logits equal to 5.x's.
One spawn of 2 ranks trains every family at both stages, so the whole matrix costs one process start-up.
Leaves out: GPUs, bf16 (test_convert_hf.py covers dtype), the CLI (test_hf_train.py).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "dist"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from _hf_families import FAMILIES  # noqa: E402
from _spawn import run_ranks  # noqa: E402

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
STAGES = (2, 3)
STEPS = 2
CASES = [(f, s) for f in FAMILIES for s in STAGES]
IDS = [f"{f}-stage{s}" for f, s in CASES]


def _ids(seed):
    return torch.randint(0, 64, (2, 12), generator=torch.Generator().manual_seed(seed))


def _forward_logits(model_or_engine, ids):
    module = getattr(model_or_engine, "module", model_or_engine)
    # the ranks compute with one thread (_spawn); a bit-for-bit compare needs the same reduction order here,
    # whatever OMP_NUM_THREADS the suite was started with
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    module.eval()
    try:
        with torch.no_grad():
            out = model_or_engine(input_ids=ids).logits
    finally:
        module.train()
        torch.set_num_threads(threads)
    return out


def _train_every_family(rank, world_size, root):
    """On each rank: every family at both stages, one engine at a time; rank 0 returns what it saw."""
    import zerolaunch
    from zerolaunch.api import save_hf_pretrained
    from zerolaunch.models import hf

    root = Path(root)
    seen = {}
    for family in FAMILIES:
        for stage in STAGES:
            model = hf.build(path=str(root / family / "orig"), meta=stage == 3)
            engine = zerolaunch.initialize(
                model,
                {
                    "zero_optimization": {"stage": stage, "stage3_param_persistence_threshold": 0},
                    "train_micro_batch_size_per_gpu": 2,
                    "optimizer": {"type": "AdamW", "params": {"lr": 1e-2}},
                },
                device="cpu",
            )
            before = _forward_logits(engine, _ids(0))
            losses = []
            for step in range(STEPS):
                x = _ids(100 + 10 * step + rank)  # each rank its own batch: the grads must be reduced
                loss = engine(input_ids=x, labels=x).loss
                engine.backward(loss)
                engine.step()
                losses.append(loss.detach().clone())
            after = _forward_logits(engine, _ids(0))
            out = root / family / f"stage{stage}"
            engine.save_checkpoint(out / "ck")
            save_hf_pretrained(engine, out / "saved")
            full = {n: t.detach().clone() for n, t in engine.engine.iter_full_state()}
            if rank == 0:
                seen[(family, stage)] = {"before": before, "after": after, "losses": losses, "full": full}
    return seen


@pytest.fixture(scope="module")
def matrix(tmp_path_factory):
    """{(family, stage): what rank 0 saw} after one 2-rank run over every family, plus the converted folders."""
    from zerolaunch.checkpoint.convert import convert_checkpoint
    from zerolaunch.models import hf

    root = tmp_path_factory.mktemp("families")
    for family, config in FAMILIES.items():
        torch.manual_seed(0)
        hf.build(config=config).save_pretrained(root / family / "orig")
    seen = run_ranks(_train_every_family, 2, str(root), timeout_s=600)[0]
    for family, stage in CASES:
        out = root / family / f"stage{stage}"
        convert_checkpoint(out / "ck", out / "converted")
    return root, seen


def _files(folder: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    tensors = {}
    for f in sorted(folder.glob("*.safetensors")):
        tensors.update(load_file(f))
    return tensors


def _load(folder):
    from transformers import AutoModelForCausalLM

    model, info = AutoModelForCausalLM.from_pretrained(
        folder, local_files_only=True, output_loading_info=True
    )
    return model, info


@pytest.mark.parametrize(("family", "stage"), CASES, ids=IDS)
def test_loaded_then_trained_then_written_as_save_pretrained_writes(matrix, family, stage):
    root, seen = matrix
    got = seen[(family, stage)]
    orig, orig_info = _load(root / family / "orig")
    # the loader: the engine's first forward is the originals' as from_pretrained loads them
    assert torch.equal(got["before"], _forward_logits(orig, _ids(0))), "logits before training"
    on_disk = {n: tuple(t.shape) for n, t in _files(root / family / "orig").items()}
    for writer in ("converted", "saved"):
        folder = root / family / f"stage{stage}" / writer
        files = _files(folder)
        # save_pretrained's names and layout (per-expert MoE tensors, embed_out), not the in-memory ones
        assert {n: tuple(t.shape) for n, t in files.items()} == on_disk, writer
        model, info = _load(folder)
        assert not info["missing_keys"] and not info["unexpected_keys"], (writer, info)
        state = model.state_dict()
        assert set(state) == set(orig.state_dict()), writer
        full = got["full"]
        # the engine yields a tied weight once and non-persistent buffers (rotary tables) too
        nonpersistent = {n for n, _ in model.named_buffers()} - set(state)
        assert set(full) - set(state) <= nonpersistent, writer
        for name in set(state) - set(full):
            assert any(state[name].data_ptr() == state[n].data_ptr() for n in full if n in state), name
        for name in set(full) & set(state):
            assert torch.equal(state[name], full[name]), (writer, name)
        assert torch.equal(_forward_logits(model, _ids(0)), got["after"]), (writer, "logits")


@pytest.mark.parametrize("family", list(FAMILIES))
def test_stages_2_and_3_train_to_the_same_losses(matrix, family):
    _, seen = matrix
    for a, b in zip(seen[(family, 2)]["losses"], seen[(family, 3)]["losses"], strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    assert seen[(family, 2)]["losses"][0] != seen[(family, 2)]["losses"][1]  # the step changed the weights


# ---- transformers 4.57 reads what 5.x code wrote ----------------------------------------------------------
OLD_TRANSFORMERS = Path(os.environ.get("ZEROLAUNCH_OLD_TRANSFORMERS", REPO / ".hf-old"))
"""A folder holding transformers 4.57 (+ its tokenizers and huggingface_hub), installed by `make hf-old`
with pip --target: put first on PYTHONPATH it shadows 5.x for one subprocess, and nothing else sees it."""

_OLD_SCRIPT = """
import json, sys
import torch
from safetensors.torch import load_file
import transformers
from transformers import AutoModelForCausalLM

cases = json.loads(sys.argv[1])
ids = torch.load(sys.argv[2])
report = {"version": transformers.__version__, "file": transformers.__file__, "cases": {}}
for key, folder in cases.items():
    try:
        model, info = AutoModelForCausalLM.from_pretrained(folder, output_loading_info=True, local_files_only=True)
    except Exception as e:
        report["cases"][key] = {"error": f"{type(e).__name__}: {e}"[-600:]}
        continue
    model.eval()
    files = {}
    for f in sorted(__import__("pathlib").Path(folder).glob("*.safetensors")):
        files.update(load_file(f))
    state = model.state_dict()
    differ = [n for n, t in files.items() if n not in state or not torch.equal(state[n], t)]
    with torch.no_grad():
        logits = model(input_ids=ids).logits
    torch.save(logits, folder + "/logits-old.pt")
    report["cases"][key] = {
        "missing": sorted(info["missing_keys"]),
        "unexpected": sorted(info["unexpected_keys"]),
        "differ": differ,
    }
print(json.dumps(report))
"""


@pytest.fixture(scope="module")
def old_transformers(matrix):
    """One subprocess of transformers 4.57 loading every converted folder; its report and the 4.57 logits."""
    import transformers

    if not (OLD_TRANSFORMERS / "transformers").is_dir():
        if os.environ.get("CI") == "true":
            pytest.fail(f"{OLD_TRANSFORMERS} holds no transformers 4.57: `make hf-old` installs it")
        pytest.skip(f"no transformers 4.57 in {OLD_TRANSFORMERS} (`make hf-old` installs it)")
    # the side folder must leave this environment's transformers alone
    assert transformers.__version__.startswith("5.")
    assert OLD_TRANSFORMERS.resolve() not in Path(transformers.__file__).resolve().parents
    root, _ = matrix
    cases = {f"{f}-stage{s}": str(root / f / f"stage{s}" / "converted") for f, s in CASES}
    torch.save(_ids(0), root / "ids.pt")
    env = dict(os.environ, HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1", PYTHONPATH=str(OLD_TRANSFORMERS))
    proc = subprocess.run(
        [sys.executable, "-c", _OLD_SCRIPT, json.dumps(cases), str(root / "ids.pt")],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["version"].startswith("4.57."), report["version"]
    assert OLD_TRANSFORMERS.resolve() in Path(report["file"]).resolve().parents
    return report


@pytest.mark.parametrize(("family", "stage"), CASES, ids=IDS)
def test_transformers_4_57_loads_the_converted_folder(matrix, old_transformers, family, stage):
    root, seen = matrix
    case = old_transformers["cases"][f"{family}-stage{stage}"]
    assert "error" not in case, case
    assert case["missing"] == [] and case["unexpected"] == [], case
    assert case["differ"] == [], case  # every tensor in the files is the model's, bit for bit
    old_logits = torch.load(root / family / f"stage{stage}" / "converted" / "logits-old.pt")
    # another implementation of the same math (attention, routing): equal up to float rounding
    torch.testing.assert_close(old_logits, seen[(family, stage)]["after"], rtol=1e-5, atol=1e-5)
