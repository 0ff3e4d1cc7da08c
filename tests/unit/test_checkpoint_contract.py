"""checkpoint/contract.py: the engines meet the checkpoint contract, and the contract covers what the
checkpoint code really uses.

Tests: (1) the checkpoint code, read with `ast` (not run): every `engine.<member>` in zerolaunch/checkpoint/
is declared in CheckpointEngine (or, in model16.py, Model16Engine), every `getattr(engine, "<member>", ...)`
is in OPTIONAL_MEMBERS, each declared member is used somewhere (no stale entries), and every function
parameter named `engine` is annotated with a contract class; the scanner itself flags a planted unknown
member. (2) FakeEngine, the stage 0-2 engine and the stage 3 engine (one process, CPU, no process group)
are instances of the Protocols, and their param specs and fragments of ParamSpecLike / FragmentLike.
Leaves out: what the members do (tests/unit/test_checkpoint_format.py, tests/dist/test_checkpoint_resume.py).
"""

from __future__ import annotations

import ast
import os
import sys
from pathlib import Path
from typing import Generic, Protocol

import pytest
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(__file__)), "dist"))

from _fake_engine import FakeEngine, FakeTensorSpec  # noqa: E402
from _zero_models import Net  # noqa: E402

from zerolaunch.checkpoint import contract  # noqa: E402
from zerolaunch.checkpoint.contract import (  # noqa: E402
    OPTIONAL_MEMBERS,
    CheckpointEngine,
    FragmentLike,
    Model16Engine,
    ParamSpecLike,
)
from zerolaunch.zero import Engine  # noqa: E402
from zerolaunch.zero.options import EngineOptions, ZeroOptions  # noqa: E402

CHECKPOINT_DIR = Path(contract.__file__).resolve().parent
CONTRACT_NAMES = {"CheckpointEngine", "Model16Engine"}


def _members(proto) -> set[str]:
    """The public names a Protocol declares (methods and annotated attributes), its bases' included."""
    out: set[str] = set()
    for cls in proto.__mro__:
        if cls in (Protocol, Generic, object):
            continue
        out |= {k for k in vars(cls) if not k.startswith("_")}
        out |= {k for k in getattr(cls, "__annotations__", {}) if not k.startswith("_")}
    return out


def _engine_uses(source: str) -> tuple[set[str], set[str], list[str]]:
    """(members read as engine.<m>, members read as getattr(engine, "<m>", ...), unannotated `engine` args)."""
    direct, optional, untyped = set(), set(), []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "engine":
            direct.add(node.attr)
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in ("getattr", "hasattr")
            and node.args
            and isinstance(node.args[0], ast.Name)
            and node.args[0].id == "engine"
        ):
            name = node.args[1]
            assert isinstance(name, ast.Constant), f"getattr(engine, <not a literal>) at line {node.lineno}"
            optional.add(name.value)
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            for arg in node.args.args + node.args.kwonlyargs + node.args.posonlyargs:
                if arg.arg == "engine":
                    hint = ast.unparse(arg.annotation) if arg.annotation is not None else ""
                    if hint not in CONTRACT_NAMES:
                        untyped.append(f"{node.name}(engine: {hint or '<none>'})")
    return direct, optional, untyped


def _uses_by_file() -> dict[str, tuple[set[str], set[str], list[str]]]:
    return {p.name: _engine_uses(p.read_text()) for p in sorted(CHECKPOINT_DIR.glob("*.py"))}


def test_the_scanner_sees_direct_optional_and_untyped_uses():
    direct, optional, untyped = _engine_uses(
        "def f(engine: CheckpointEngine, engine2):\n"
        "    engine.bogus_member()\n"
        "    getattr(engine, 'maybe', None)\n"
        "def g(engine):\n"
        "    return engine.param_specs\n"
    )
    assert direct == {"bogus_member", "param_specs"}
    assert optional == {"maybe"}
    assert untyped == ["g(engine: <none>)"]


def test_every_member_the_checkpoint_code_uses_is_declared():
    uses = _uses_by_file()
    base, with16 = _members(CheckpointEngine), _members(Model16Engine)
    problems = []
    for name, (direct, optional, untyped) in uses.items():
        allowed = with16 if name == "model16.py" else base
        problems += [f"{name}: engine.{m} is not in the contract" for m in sorted(direct - allowed)]
        problems += [
            f"{name}: getattr(engine, {m!r}) is not in OPTIONAL_MEMBERS"
            for m in optional - set(OPTIONAL_MEMBERS)
        ]
        problems += [f"{name}: {u} is not typed with a contract class" for u in untyped]
        problems += [f"{name}: {m} is read both ways" for m in direct & optional]
    assert not problems, "\n".join(problems)
    # and nothing is declared that no checkpoint code uses (a stale contract demands what nobody needs).
    used_direct = set().union(*(d for d, _, _ in uses.values()))
    used_optional = set().union(*(o for _, o, _ in uses.values()))
    assert with16 == used_direct, (sorted(with16 - used_direct), sorted(used_direct - with16))
    assert set(OPTIONAL_MEMBERS) == used_optional
    assert with16 - base == set(uses["model16.py"][0]) - base == {"dtype", "iter_full_state"}
    # the engine-taking entry points are all typed (the scan saw them).
    assert "save.py" in uses and "load.py" in uses and uses["save.py"][0] and uses["load.py"][0]


def _check_engine(engine, *, model16: bool) -> None:
    assert isinstance(engine, CheckpointEngine)
    assert isinstance(engine, Model16Engine) == model16
    specs = list(engine.param_specs())
    assert specs and all(isinstance(s, ParamSpecLike) for s in specs)
    fragments = list(engine.owned_fragments())
    assert fragments and all(isinstance(f, FragmentLike) for f in fragments)


def test_fake_engine_meets_the_contract():
    specs = [
        FakeTensorSpec("w", (3, 4), torch.float32, True),
        FakeTensorSpec("b", (4,), torch.float32, False),
    ]
    _check_engine(FakeEngine(specs, rank=0, world_size=1, bucket_numel=100), model16=False)


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_real_engines_meet_the_contract(stage):
    engine = Engine(Net(0), EngineOptions(zero=ZeroOptions(stage=stage)))
    # one Engine class for every stage; the stage picks its Sharding strategy (#18)
    assert type(engine.sharding).__name__ == ("UnitSharding" if stage == 3 else "FlatSharding")
    _check_engine(engine, model16=True)
    for member in OPTIONAL_MEMBERS:  # the real engines have the optional ones too: none is silently off
        assert hasattr(engine, member), member


def test_an_engine_missing_a_member_is_not_an_instance():
    class Partial:
        def param_specs(self):
            return []

    assert not isinstance(Partial(), CheckpointEngine)
