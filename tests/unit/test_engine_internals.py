"""Outside zerolaunch/zero/ the engine is used through its public members only: no `engine._x` and no
`engine.sharding.x` (the strategy is the engine's own business), read or written, and no attribute of an
engine assigned (its state changes through its methods: `set_schedule`, not `engine.scheduler = ...`), in any
module of the package. Checked with ast over every file but zero/'s, on attribute chains that end in a name
holding an engine (`engine`, `self.engine`, `self.zero_engine`, ...), and on getattr / setattr / hasattr of
such a name with a private or `sharding` literal. Leaves out: what the public members do (the engine's own
tests)."""

from __future__ import annotations

import ast
import pathlib

import zerolaunch

ROOT = pathlib.Path(zerolaunch.__file__).parent
ATTRIBUTE_CALLS = ("getattr", "setattr", "hasattr", "delattr")


def _holds_engine(node: ast.AST) -> bool:
    """`engine`, `x.engine`, `self.zero_engine`, `inner_engine`: a name or attribute ending in "engine"."""
    if isinstance(node, ast.Name):
        return node.id.lower().endswith("engine")
    if isinstance(node, ast.Attribute):
        return node.attr.lower().endswith("engine")
    return False


def _internal(name: str) -> bool:
    return name == "sharding" or (name.startswith("_") and not name.startswith("__"))


def internal_uses(source: str) -> list[str]:
    """`line: expression` for each read or write of an engine internal in `source`."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute) and _holds_engine(node.value):
            if _internal(node.attr) or isinstance(node.ctx, ast.Store | ast.Del):
                found.append(f"{node.lineno}: {ast.unparse(node)}")
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in ATTRIBUTE_CALLS
            and len(node.args) >= 2
            and _holds_engine(node.args[0])
            and isinstance(node.args[1], ast.Constant)
            and isinstance(node.args[1].value, str)
            and _internal(node.args[1].value)
        ):
            found.append(f"{node.lineno}: {ast.unparse(node)}")
    return found


def test_no_engine_internals_outside_zero():
    problems = []
    for path in sorted(ROOT.rglob("*.py")):
        relative = path.relative_to(ROOT)
        if relative.parts[0] == "zero":
            continue
        problems += [f"{relative}:{use}" for use in internal_uses(path.read_text())]
    assert not problems, "\n".join(problems)


def test_the_scan_sees_reads_writes_and_getattr():
    source = (
        "engine._lr = 1\n"
        "x = self.zero_engine._lr\n"
        "engine.sharding.begin_forward()\n"
        "s = getattr(engine.sharding, 'schedule', None)\n"
        "t = getattr(self.engine, '_held')\n"
        "engine.scheduler = s\n"  # a write, even of a public member
        "engine.set_schedule(s)\n"  # public: allowed
        "engine.__class__\n"  # dunder: allowed
        "other._x\n"  # not an engine
        "self.engine = engine\n"  # an attribute of something else
    )
    assert sorted(int(use.split(":")[0]) for use in internal_uses(source)) == [1, 2, 3, 4, 5, 6]
