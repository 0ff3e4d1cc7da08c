"""Fuzz: mutated recipes and DeepSpeed configs end in exit 0 or exit 2 with one paragraph, each within 5 s.

Each case goes through the launcher's own pre-flight, in-process: `load_recipe(check_builders=True)` then
`launch.preflight.preflight` (the model built on the meta device, one batch drawn), exactly what
`zerolaunch train` runs before any worker starts. Exit 0 = both pass; exit 2 = a `UserError`, whose message
must be one paragraph naming no Python exception class and holding no traceback. Anything else, or a case
slower than 5 s, fails the test with the case. The mutations are the ones a user meets: keys YAML reads as
booleans / null / numbers, nesting thousands deep, lists of hundreds of thousands of items, sizes of 1e30
and 2**40, DeepSpeed keys of the wrong type, junk bytes. Seeded, so every run tries the same cases; the counts
are printed. A handful go through the real CLI in a subprocess.

Leaves out: the workers (no run is started), and checkpoints (test_fuzz.py).
"""

from __future__ import annotations

import copy
import json
import random
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch  # noqa: F401 -- imported once here, not inside the first case that builds a model (seconds)
import yaml
from _helpers import tiny_gpt_recipe
from _mutate import add_unknown, drop_key, leaves, overwrite_bytes, retype, set_at

from zerolaunch.config import load_recipe
from zerolaunch.config.errors import UserError
from zerolaunch.launch.preflight import preflight

SEED = 20261206
RECIPE_CASES = 300
DEEPSPEED_CASES = 100
CASE_SECONDS = 5.0

BASE_RECIPE = tiny_gpt_recipe(
    seq_len=16,
    train={
        "steps": 10,
        "micro_batch_size": 2,
        "gradient_accumulation_steps": 2,
        "lr": 1.0e-2,
        "warmup_steps": 2,
        "seed": 1234,
        "log_every": 1,
        "precision": "fp32",
    },
    checkpoint={"every": 5, "keep": 2},
    deepspeed={
        "zero_optimization": {"stage": 2, "reduce_bucket_size": 5e8, "contiguous_gradients": True},
        "steps_per_print": 10,
    },
)
BASE_DEEPSPEED = {
    "train_micro_batch_size_per_gpu": 2,
    "gradient_accumulation_steps": "auto",
    "train_batch_size": "auto",
    "gradient_clipping": 1.0,
    "steps_per_print": 100,
    "wall_clock_breakdown": False,
    "optimizer": {
        "type": "AdamW",
        "params": {"lr": 3e-4, "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.1},
    },
    "scheduler": {
        "type": "WarmupLR",
        "params": {"warmup_min_lr": 0, "warmup_max_lr": 3e-4, "warmup_num_steps": 2},
    },
    "bf16": {"enabled": False},
    "zero_optimization": {
        "stage": 3,
        "overlap_comm": True,
        "contiguous_gradients": True,
        "reduce_scatter": True,
        "reduce_bucket_size": "auto",
        "stage3_prefetch_bucket_size": "auto",
        "stage3_param_persistence_threshold": "auto",
        "sub_group_size": 1e9,
        "stage3_max_live_parameters": 1e9,
    },
}
JUNK = ["abc", "", [1], [1, 2], {"x": 1}, None, True, False, 1.5, -1, 0, 10**30, 1e30, 2**40, "auto", "1e3"]
YAML_KEYS = ["on", "off", "yes", "no", "null", "~", "1.5", "1", "2024-01-01", "true"]
SIZE_KEYS = [
    ("train", "micro_batch_size"),
    ("train", "gradient_accumulation_steps"),
    ("train", "steps"),
    ("train", "warmup_steps"),
    ("model", "args", "vocab_size"),
    ("model", "args", "seq_len"),
    ("model", "args", "d_model"),
    ("data", "args", "vocab_size"),
    ("data", "args", "seq_len"),
    ("deepspeed", "zero_optimization", "reduce_bucket_size"),
    ("checkpoint", "every"),
]
ABSURD = [1e30, 2**40, 2**63, 10**100, -(10**30), 1e300]
# a Python exception's class name in a message means a raw exception leaked through
RAW_CLASS = re.compile(r"\b[A-Z][A-Za-z]*(Error|Exception)\b|\bTraceback\b")


def _with_text_at(text: str, rng: random.Random, line: str) -> str:
    """Insert `line` (one YAML mapping entry) at the indentation of a random existing key line."""
    lines = text.splitlines()
    i = rng.randrange(len(lines))
    indent = len(lines[i]) - len(lines[i].lstrip())
    lines.insert(i, " " * indent + line)
    return "\n".join(lines) + "\n"


def mutate(rng: random.Random, base: dict, deepspeed: bool) -> tuple[str, str]:
    """(kind, file text) of one mutation of `base`."""
    tree = copy.deepcopy(base)
    kinds = ["type", "drop", "unknown", "key", "deep", "big", "absurd", "ds_type", "junk", "auto"]
    kind = rng.choice(kinds)
    if kind == "type":
        retype(rng, tree, JUNK)
    elif kind == "drop":
        drop_key(rng, tree)
    elif kind == "unknown":
        add_unknown(rng, tree, ["lr", "stage", "stepz", "zero", "bogus", "train_batch_size"], JUNK)
    elif kind == "absurd":
        path = rng.choice(SIZE_KEYS)
        if deepspeed:
            path = rng.choice(
                [
                    ("train_micro_batch_size_per_gpu",),
                    ("gradient_accumulation_steps",),
                    ("train_batch_size",),
                    ("zero_optimization", "stage3_prefetch_bucket_size"),
                    ("zero_optimization", "sub_group_size"),
                    ("scheduler", "params", "warmup_num_steps"),
                ]
            )
        set_at(tree, path, rng.choice(ABSURD))
    elif kind == "ds_type":
        zero = tree["zero_optimization"] if deepspeed else tree["deepspeed"]["zero_optimization"]
        top = tree if deepspeed else tree["deepspeed"]
        target = rng.choice([zero, top])
        names = (
            [
                "contiguous_gradients",
                "reduce_scatter",
                "sub_group_size",
                "round_robin_gradients",
                "overlap_comm",
                "stage",
            ]
            if target is zero
            else ["steps_per_print", "wall_clock_breakdown", "gradient_clipping", "dump_state", "timers"]
        )
        target[rng.choice(names)] = rng.choice(JUNK)
    elif kind == "auto":
        path, _ = rng.choice(list(leaves(tree)))
        set_at(tree, path, "auto")
    text = json.dumps(tree, indent=2) if deepspeed else yaml.safe_dump(tree, sort_keys=False)
    if kind == "key":
        key = rng.choice(YAML_KEYS)
        text = (
            _with_text_at(text, rng, f"{key}: {rng.choice(['1', 'x', '{a: 1}'])}")
            if not deepspeed
            else (text.replace("{", "{" + rng.choice(["1: 2, ", "true: 1, ", "null: 3, ", '"": 1, ']), 1))
        )
    elif kind == "deep":
        depth = rng.choice([33, 200, 5000, 100_000])
        value = "[" * depth + "]" * depth
        text = (
            _with_text_at(text, rng, f"deep: {value}")
            if not deepspeed
            else text.replace("{", '{"deep": ' + value + ", ", 1)
        )
    elif kind == "big":
        items = rng.choice([1000, 15_000, 50_000, 150_000, 5_000_000])
        value = "[" + "1," * items + "1]"
        text = (
            _with_text_at(text, rng, f"big: {value}")
            if not deepspeed
            else text.replace("{", '{"big": ' + value + ", ", 1)
        )
    elif kind == "junk":
        text = overwrite_bytes(rng, text.encode(), 8, range(32, 127)).decode("ascii", "replace")
    return kind, text


def preflight_exit(file: Path, world_size: int) -> tuple[int, str]:
    """What `zerolaunch train` does before it starts workers: (0, "") or (2, the message)."""
    try:
        recipe = load_recipe(file, world_size=world_size, check_builders=True)
        preflight(recipe, None, world_size=world_size)
    except UserError as exc:
        return exc.exit_code, exc.message
    return 0, ""


def assert_one_paragraph(message: str, case: str) -> None:
    assert message.strip(), f"{case}: an empty message"
    assert "\n\n" not in message.strip(), f"{case}: more than one paragraph:\n{message}"
    assert message.count("\n") <= 2, f"{case}: a message of {message.count(chr(10)) + 1} lines:\n{message}"
    raw = RAW_CLASS.search(message)
    assert raw is None, f"{case}: the message names {raw.group(0)}:\n{message}"


def run_cases(tmp_path: Path, rng: random.Random, count: int, base: dict, deepspeed: bool) -> dict:
    counts = {"exit 0": 0, "exit 2": 0, "max_s": 0.0, "slowest": "", "kinds": {}}
    suffix = ".json" if deepspeed else ".yaml"
    # untimed: the first model build and batch pay one-off imports (seconds on a busy machine)
    warm = tmp_path / f"warm{suffix}"
    warm.write_text(json.dumps(base))
    assert preflight_exit(warm, 1) == (0, "")
    for case in range(count):
        kind, text = mutate(rng, base, deepspeed)
        file = tmp_path / f"case{case}{suffix}"
        file.write_text(text)
        name = f"{'deepspeed' if deepspeed else 'recipe'} case {case} ({kind}, {len(text):,} bytes)"
        start = time.perf_counter()
        try:
            code, message = preflight_exit(file, world_size=rng.choice([1, 2, 3]))
        except Exception as exc:  # noqa: BLE001 -- the point: anything but a UserError is a bug
            pytest.fail(f"{name}: {type(exc).__name__}: {exc}\n{text[:400]!r}")
        seconds = time.perf_counter() - start
        assert seconds < CASE_SECONDS, f"{name} took {seconds:.1f} s\n{text[:400]!r}"
        if seconds > counts["max_s"]:
            counts["max_s"], counts["slowest"] = seconds, name
        if code:
            assert code == 2, f"{name}: exit {code}"
            assert_one_paragraph(message, name)
        counts[f"exit {code}"] += 1
        counts["kinds"].setdefault(kind, [0, 0])[bool(code)] += 1
        file.unlink()
    return counts


def _report(what: str, counts: dict, capsys) -> None:
    with capsys.disabled():
        print(
            f"\nfuzz {what}: exit 0 {counts['exit 0']}, exit 2 {counts['exit 2']}, slowest {counts['max_s']:.2f} s ({counts['slowest']}); "
            + ", ".join(f"{k} {ok}/{err}" for k, (ok, err) in sorted(counts["kinds"].items()))
        )


def test_fuzz_recipes_through_preflight(tmp_path, capsys):
    counts = run_cases(tmp_path, random.Random(SEED), RECIPE_CASES, BASE_RECIPE, deepspeed=False)
    _report(f"{RECIPE_CASES} recipes", counts, capsys)
    assert counts["exit 0"] and counts["exit 2"]  # both outcomes were reached
    assert len(counts["kinds"]) == 10, counts["kinds"]  # every kind of mutation was tried


def test_fuzz_deepspeed_configs_through_preflight(tmp_path, capsys):
    counts = run_cases(tmp_path, random.Random(SEED + 1), DEEPSPEED_CASES, BASE_DEEPSPEED, deepspeed=True)
    _report(f"{DEEPSPEED_CASES} DeepSpeed configs", counts, capsys)
    assert counts["exit 0"] and counts["exit 2"]


def test_the_bases_pass(tmp_path):
    """The unmutated recipe and config pass: the exit 2s above come from the mutations."""
    recipe, ds = tmp_path / "r.yaml", tmp_path / "ds.json"
    recipe.write_text(yaml.safe_dump(BASE_RECIPE))
    ds.write_text(json.dumps(BASE_DEEPSPEED))
    assert preflight_exit(recipe, 2) == (0, "")
    assert preflight_exit(ds, 2) == (0, "")


CLI_CASES = [
    ("on: 1\ntrain: {steps: 2}\n", "the key `on` at the top level is read by YAML as a boolean"),
    ("train: {gradient_accumulation_steps: 1e30}\n", "above the limit of 2**20"),
    ("deepspeed: {zero_optimization: {reduce_scatter: auto}}\n", "must be true or false"),
    ("train:\n  x: " + "[" * 5000 + "]" * 5000 + "\n", "nest deeper than 32 levels"),
]


@pytest.mark.parametrize("text,expected", CLI_CASES, ids=["yaml-bool-key", "accum-1e30", "ds-type", "deep"])
def test_the_real_cli(tmp_path, text, expected):
    """`zerolaunch train` in a subprocess: exit 2, the paragraph on stderr, no traceback, no run dir written."""
    recipe = tmp_path / "r.yaml"
    recipe.write_text(text)
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "zerolaunch",
            "train",
            str(recipe),
            "--cpu",
            "1",
            "--run-dir",
            str(tmp_path / "run"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert expected in " ".join(proc.stderr.split()), proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr
    assert not (tmp_path / "run").exists() or not any((tmp_path / "run").iterdir())
