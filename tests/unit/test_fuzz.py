"""Fuzz: mutated recipes and damaged checkpoints end in success or a clear error, never a traceback.

Seeded mutations of a valid recipe (wrong types, dropped keys, unknown keys, out-of-range values, junk
bytes) go through `load_recipe` in-process; mutations of a valid checkpoint (truncated or flipped rank files,
edited or junk manifest JSON) go through `CheckpointReader` and a full read. A case passes when it raises a
`UserError` with a message, or succeeds with the right data: a recipe that loads must hold the mutated value
as given (a wrong type accepted silently fails), a checkpoint that reads must give the pristine tensors.
The manifest's own crc32 covers its JSON, `extra` included, so the ranks' extras are compared too.
Anything else (a TypeError, a KeyError, a wrong tensor) fails the test with the case that caused it.
A handful of cases also go through the CLI (CliRunner): exit 0 or 2 and no traceback. Prints the counts.

Leaves out: DeepSpeed checkpoints, and recipes whose builders run (only their import is checked).
"""

from __future__ import annotations

import copy
import json
import math
import random
import shutil
from pathlib import Path

import pytest
import torch
import yaml
from _fake_engine import FakeTensorSpec, fake_ranks, save_fake
from _helpers import tiny_gpt_recipe
from _mutate import add_unknown, drop_key, leaves, overwrite_bytes, retype, set_at
from typer.testing import CliRunner

from zerolaunch.checkpoint.reader import CheckpointReader
from zerolaunch.cli.app import app
from zerolaunch.config import load_recipe
from zerolaunch.config.errors import UserError
from zerolaunch.config.schema import flat_items

SEED = 20261203
RECIPE_CASES = 300
CHECKPOINT_CASES = 150

BASE_RECIPE = tiny_gpt_recipe(
    seq_len=32,
    train={
        "steps": 10,
        "micro_batch_size": 4,
        "gradient_accumulation_steps": 2,
        "lr": 1.0e-2,
        "lr_schedule": "constant",
        "seed": 1234,
        "log_every": 1,
        "gradient_clipping": 1.0,
        "weight_decay": 0.1,
        "precision": "fp32",
    },
    checkpoint={"every": 5, "keep": 2},
    deepspeed={
        "zero_optimization": {"stage": 2, "reduce_bucket_size": 5e8, "overlap_comm": True},
        "gradient_clipping": 1.0,
    },
)
JUNK_VALUES = ["abc", "", [1, 2], {"x": 1}, None, True, False, 1.5, -1, 0, 10**30, float("nan"), "auto"]
SPECS = [
    FakeTensorSpec("a.weight", (17, 31), torch.float32, True),
    FakeTensorSpec("a.bias", (31,), torch.float32, True),
    FakeTensorSpec("b.weight", (31, 9), torch.float32, True),
    FakeTensorSpec("frozen", (7,), torch.bfloat16, False),
]


def mutate_recipe(rng: random.Random) -> tuple[str, bytes, tuple | None, object]:
    """(kind, file bytes, mutated leaf path or None, its new value)."""
    tree = copy.deepcopy(BASE_RECIPE)
    kind = rng.choice(["type", "drop", "unknown", "range", "junk"])
    path, value = None, None
    if kind == "type":
        path, value = retype(rng, tree, JUNK_VALUES)
    elif kind == "drop":
        drop_key(rng, tree)
    elif kind == "unknown":
        names = ["lr", "stage", "steps", "zero", "bogus", "train_batch_size", "x" * rng.randint(1, 9)]
        add_unknown(rng, tree, names, JUNK_VALUES, suffixes=["", "_", "s", "2"])
    elif kind == "range":
        numeric = [(p, v) for p, v in leaves(tree) if isinstance(v, (int, float)) and not isinstance(v, bool)]
        path, _ = rng.choice(numeric)
        value = rng.choice([-1, 0, -1e-3, 1e30, 2**63, float("inf"), 7])
        set_at(tree, path, value)
    text = yaml.safe_dump(tree, sort_keys=False).encode()
    if kind == "junk":
        text = overwrite_bytes(rng, text, 8)
        if rng.random() < 0.2:
            text = rng.randbytes(rng.randint(0, 200))
    return kind, text, path, value


def _check_recipe_success(recipe, path: tuple | None, value) -> None:
    """A recipe that loaded must hold the mutated value as written (no silent default, no silent cast)."""
    if path is None:
        return
    flat = dict(flat_items(recipe))
    key = ".".join(path)
    if key not in flat:
        return  # a key the recipe renames on resolution (deepspeed.*): its checks live in test_config_*
    got = flat[key]
    if isinstance(value, bool) or isinstance(got, bool):
        assert got is value, f"{key}: wrote {value!r}, the recipe holds {got!r}"
    elif isinstance(value, float) and math.isnan(value):
        assert isinstance(got, float) and math.isnan(got), f"{key}: wrote nan, the recipe holds {got!r}"
    else:
        assert got == value, f"{key}: wrote {value!r}, the recipe holds {got!r}"


def test_fuzz_recipes(tmp_path, capsys):
    rng = random.Random(SEED)
    counts = {"ok": 0, "error": 0}
    for case in range(RECIPE_CASES):
        kind, data, path, value = mutate_recipe(rng)
        file = tmp_path / f"case{case}.yaml"
        file.write_bytes(data)
        try:
            recipe = load_recipe(file, world_size=rng.choice([1, 2, 3]), check_builders=True)
        except UserError as exc:
            assert exc.message.strip(), f"case {case} ({kind}): empty message"
            counts["error"] += 1
            continue
        except Exception as exc:  # noqa: BLE001 -- the point: anything else is a bug
            pytest.fail(
                f"recipe case {case} ({kind}, {path}={value!r}): {type(exc).__name__}: {exc}\n{data[:600]!r}"
            )
        _check_recipe_success(recipe, path, value)
        counts["ok"] += 1
    with capsys.disabled():
        print(f"\nfuzz: {RECIPE_CASES} recipe cases, {counts['ok']} loaded, {counts['error']} clear errors")
    assert counts["ok"] and counts["error"]  # both outcomes were reached


def make_checkpoint(root: Path, world_size: int = 2) -> Path:
    engines = fake_ranks(SPECS, world_size, bucket_numel=200)
    return save_fake(engines, root, 5, extras={r: {"data": {"position": r}} for r in range(world_size)})


def read_everything(folder: Path) -> dict:
    with CheckpointReader(folder) as reader:
        out = {}
        for p in reader.manifest.params:
            if p.trainable:
                for kind in reader.manifest.kinds:
                    if reader.is_scalar(kind, p.name):  # the optimizer step: one value per fragment
                        out[f"{kind}/{p.name}"] = reader.read(kind, p.name, 0, p.numel)
                    else:
                        out[f"{kind}/{p.name}"] = reader.full_param(p.name, kind)
        out.update({f"replicated/{k}": v for k, v in reader.replicated_state().items()})
        out.update({f"extra/{r}": reader.extra(r) for r in range(reader.manifest.world_size)})
        return out


def _edit_manifest(rng: random.Random, d: dict) -> None:
    containers = []

    def walk(node):
        containers.append(node)
        children = node.values() if isinstance(node, dict) else node
        for child in children:
            if isinstance(child, (dict, list)):
                walk(child)

    walk(d)
    node = rng.choice([c for c in containers if c])
    key = rng.choice(list(node)) if isinstance(node, dict) else rng.randrange(len(node))
    action = rng.choice(["set", "set", "delete"])
    if action == "delete":
        del node[key]
    else:
        old = node[key]
        if isinstance(old, int) and not isinstance(old, bool) and rng.random() < 0.5:
            node[key] = old + rng.choice([-1, 1, 1000, -(10**6)])
        else:
            node[key] = rng.choice(JUNK_VALUES)


def mutate_checkpoint(rng: random.Random, folder: Path) -> str:
    rank_files = sorted(folder.glob("rank_*.safetensors"))
    manifest = folder / "manifest.json"
    kind = rng.choice(["truncate", "flip", "manifest", "manifest", "manifest_junk"])
    if kind == "truncate":
        f = rng.choice(rank_files)
        f.write_bytes(f.read_bytes()[: rng.randrange(f.stat().st_size)])
    elif kind == "flip":
        f = rng.choice(rank_files)
        data = bytearray(f.read_bytes())
        for _ in range(rng.choice([1, 1, 4, 64])):
            data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
        f.write_bytes(bytes(data))
    elif kind == "manifest":
        d = json.loads(manifest.read_text())
        _edit_manifest(rng, d)
        manifest.write_text(json.dumps(d))
    else:
        manifest.write_bytes(overwrite_bytes(rng, manifest.read_bytes(), 4))
    return kind


def _same(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return (
            isinstance(b, list) and len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
        )
    return a == b


def test_fuzz_checkpoints(tmp_path, capsys):
    rng = random.Random(SEED + 1)
    pristine = make_checkpoint(tmp_path / "pristine")
    expected = read_everything(pristine)
    counts = {"ok": 0, "error": 0}
    for case in range(CHECKPOINT_CASES):
        folder = tmp_path / f"case{case}"
        shutil.copytree(pristine, folder)
        kind = mutate_checkpoint(rng, folder)
        try:
            got = read_everything(folder)
        except UserError as exc:
            assert exc.message.strip(), f"case {case} ({kind}): empty message"
            counts["error"] += 1
        except Exception as exc:  # noqa: BLE001 -- the point: anything else is a bug
            pytest.fail(f"checkpoint case {case} ({kind}): {type(exc).__name__}: {exc}")
        else:
            # read without complaint: then it must be the checkpoint as saved (a flip the crc missed is a bug)
            assert _same(expected, got), f"checkpoint case {case} ({kind}) read without error but wrong data"
            counts["ok"] += 1
        shutil.rmtree(folder)
    with capsys.disabled():
        print(
            f"\nfuzz: {CHECKPOINT_CASES} checkpoint cases, {counts['ok']} read intact, {counts['error']} clear errors"
        )
    assert counts["error"]


def test_fuzz_through_the_cli(tmp_path, capsys):
    """A few of the same mutations through the commands: exit 0 or 2, one message, no traceback."""
    rng = random.Random(SEED + 2)
    runner = CliRunner()
    cases = 0
    for case in range(6):
        _, data, _, _ = mutate_recipe(rng)
        file = tmp_path / f"cli{case}.yaml"
        file.write_bytes(data)
        r = runner.invoke(app, ["recipe", "show", str(file)])
        assert r.exit_code in (0, 2), r.output
        assert r.exception is None or isinstance(r.exception, SystemExit), repr(r.exception)
        assert "Traceback" not in r.output
        cases += 1
    pristine = make_checkpoint(tmp_path / "pristine")
    for case in range(4):
        folder = tmp_path / f"ck{case}"
        shutil.copytree(pristine, folder)
        mutate_checkpoint(rng, folder)
        out = tmp_path / f"out{case}"
        r = runner.invoke(app, ["convert-checkpoint", str(folder), str(out), "--no-progress"])
        assert r.exit_code in (0, 2), r.output
        assert r.exception is None or isinstance(r.exception, SystemExit), repr(r.exception)
        assert "Traceback" not in r.output
        cases += 1
    with capsys.disabled():
        print(f"\nfuzz: {cases} cases through the CLI")
