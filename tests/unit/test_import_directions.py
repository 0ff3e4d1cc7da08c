"""The import directions between zerolaunch's packages (docs/ARCHITECTURE.md "Tree and import direction"),
checked with ast over every import, module-level and lazy: a lower layer never reaches up, util/ imports
nothing of ours, and config/'s modules import each other without a circle. zero/ has its own test
(test_zero_imports.py)."""

import ast
import pathlib

import zerolaunch

ROOT = pathlib.Path(zerolaunch.__file__).parent

MUST_NOT_IMPORT = {
    "util": {
        "api",
        "checkpoint",
        "cli",
        "config",
        "data",
        "launch",
        "memory",
        "models",
        "report",
        "train",
        "worker",
        "zero",
        "dtypes",
    },
    "checkpoint": {"memory", "launch", "train", "cli", "config", "api"},
    "models": {"launch", "train", "cli", "config", "checkpoint", "api"},
    "data": {"launch", "train", "cli", "config", "api"},
    "launch": {"train"},
    "config": {"checkpoint", "train", "launch", "cli"},
    "memory": {"train", "launch", "cli", "config"},
    # the Trainer door builds on the engine and checkpoint/ as any door does, not on the script API
    "hf": {"api", "train", "cli", "worker"},
    # the script API wires the engine, checkpoint/ and launch/; the built-in loop is another door beside it
    "api": {"train", "cli", "hf", "worker"},
}


def _module_name(path: pathlib.Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports(path: pathlib.Path) -> set[str]:
    """Every zerolaunch module `path` imports, relative imports resolved."""
    package = _module_name(path).split(".")
    if path.name != "__init__.py":
        package = package[:-1]
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
                out |= {module} | {f"{module}.{a.name}" for a in node.names}
            elif node.module:
                out |= {node.module} | {f"{node.module}.{a.name}" for a in node.names}
    return {m for m in out if m.split(".")[0] == "zerolaunch"}


def _files():
    return sorted(ROOT.rglob("*.py"))


def test_lower_layers_do_not_reach_up():
    bad = []
    for path in _files():
        layer = path.relative_to(ROOT).parts[0].removesuffix(".py")
        forbidden = MUST_NOT_IMPORT.get(layer, set())
        for module in sorted(_imports(path)):
            target = module.split(".")[1] if module.count(".") else ""
            if target in forbidden:
                bad.append(f"{path.relative_to(ROOT)} imports {module}")
    assert not bad, bad


def test_config_modules_import_each_other_without_a_circle():
    config = {_module_name(p): p for p in (ROOT / "config").glob("*.py") if p.name != "__init__.py"}
    edges = {
        name: {m for m in config if any(i == m or i.startswith(m + ".") for i in _imports(path))} - {name}
        for name, path in config.items()
    }
    done, on_path = set(), []

    def visit(name):
        if name in on_path:
            raise AssertionError(" -> ".join(on_path[on_path.index(name) :] + [name]))
        if name in done:
            return
        on_path.append(name)
        for nxt in sorted(edges[name]):
            visit(nxt)
        on_path.pop()
        done.add(name)

    for name in sorted(config):
        visit(name)


def test_the_check_sees_a_reach_up(tmp_path):
    """The resolver of relative imports, on a made-up module two levels down."""
    fake = ROOT / "checkpoint" / "_probe_not_a_module.py"
    assert _module_name(fake) == "zerolaunch.checkpoint._probe_not_a_module"
    source = tmp_path / "m.py"
    source.write_text("from ..memory.sizes import parse_bytes\nimport zerolaunch.train.loop\n")
    tree_imports = set()
    for node in ast.walk(ast.parse(source.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level == 2:
            tree_imports.add("zerolaunch." + node.module)
        elif isinstance(node, ast.Import):
            tree_imports |= {a.name for a in node.names}
    assert tree_imports == {"zerolaunch.memory.sizes", "zerolaunch.train.loop"}
