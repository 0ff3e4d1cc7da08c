"""The import directions between zerolaunch's packages (docs/ARCHITECTURE.md "Tree and import direction"),
checked with ast over every import, module-level and lazy: a lower layer never reaches up, util/ imports
nothing of ours outside util/, the layers import each other without a circle, and so do the modules of each
package. zero/ has its own test (test_zero_imports.py)."""

import ast
import pathlib

import pytest

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
    # report/ prints what the layers that run hand it; it reaches into none of them.
    "report": {"api", "checkpoint", "cli", "config", "data", "hf", "launch", "memory", "train", "worker"},
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


# The Trainer door brings its own model and data: its engine options come from config's
# deepspeed_engine_options, never from a whole Recipe (with the built-in model and synthetic data) kept for
# its `.engine`.
HF_MUST_NOT_USE = {
    "zerolaunch.config.load_recipe",
    "zerolaunch.config.load.load_recipe",
    "zerolaunch.config.Recipe",
    "zerolaunch.config.schema.Recipe",
}


def _recipe_uses(imports: set[str]) -> list[str]:
    return sorted(imports & HF_MUST_NOT_USE)


def test_the_hf_door_builds_no_recipe():
    bad = [
        f"{path.relative_to(ROOT)} imports {module}"
        for path in sorted((ROOT / "hf").rglob("*.py"))
        for module in _recipe_uses(_imports(path))
    ]
    assert not bad, bad


def test_the_recipe_check_sees_one():
    assert _recipe_uses({"zerolaunch.config", "zerolaunch.config.load_recipe"}) == [
        "zerolaunch.config.load_recipe"
    ]
    assert _recipe_uses({"zerolaunch.config", "zerolaunch.config.deepspeed_engine_options"}) == []


def _layer(path: pathlib.Path) -> str:
    """The top-level package or module of zerolaunch that `path` belongs to ("report", "api", ...)."""
    return path.relative_to(ROOT).parts[0].removesuffix(".py")


def test_util_imports_nothing_of_ours_outside_util():
    bad = [
        f"{path.relative_to(ROOT)} imports {module}"
        for path in sorted((ROOT / "util").rglob("*.py"))
        for module in sorted(_imports(path))
        if module != "zerolaunch" and module.split(".")[1] != "util"
    ]
    assert not bad, bad


def test_layers_import_each_other_without_a_circle():
    """A circle between layers (report/ -> disk_errors.py -> report/format.py, say) means one of them sits on
    the wrong floor: the shared piece belongs below both."""
    layers = {_layer(p) for p in _files()}
    edges = {name: set() for name in layers}
    for path in _files():
        for module in _imports(path):
            target = module.split(".")[1] if module.count(".") else ""
            if target in layers and target != _layer(path):
                edges[_layer(path)].add(target)
    _assert_no_circle(edges)


PACKAGES = sorted(str(p.relative_to(ROOT)) for p in ROOT.rglob("*") if (p / "__init__.py").is_file())


@pytest.mark.parametrize("package", PACKAGES)
def test_a_package_s_modules_import_each_other_without_a_circle(package):
    modules = {_module_name(p): p for p in (ROOT / package).glob("*.py") if p.name != "__init__.py"}
    edges = {
        name: {m for m in modules if any(i == m or i.startswith(m + ".") for i in _imports(path))} - {name}
        for name, path in modules.items()
    }
    _assert_no_circle(edges)


def _assert_no_circle(edges: dict[str, set[str]]) -> None:
    """Depth-first over `edges`; the first circle found fails with its names in order."""
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

    for name in sorted(edges):
        visit(name)


def test_the_check_sees_a_reach_up(tmp_path):
    """The resolver of relative imports, on a made-up module two levels down."""
    fake = ROOT / "checkpoint" / "_probe_not_a_module.py"
    assert _module_name(fake) == "zerolaunch.checkpoint._probe_not_a_module"
    source = tmp_path / "m.py"
    source.write_text("from ..memory.arch import x\nimport zerolaunch.train.loop\n")
    tree_imports = set()
    for node in ast.walk(ast.parse(source.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level == 2:
            tree_imports.add("zerolaunch." + node.module)
        elif isinstance(node, ast.Import):
            tree_imports |= {a.name for a in node.names}
    assert tree_imports == {"zerolaunch.memory.arch", "zerolaunch.train.loop"}


# Swept for function-level imports: each one of our own modules says why it waits ("# lazy: ...").
SWEPT = ("checkpoint", "data", "launch", "models", "report", "train", "util")
NOT_YET_SWEPT = {"train/measure_memory.py", "train/loss_norm.py"}


def _unexplained_lazy_imports(path: pathlib.Path) -> list[int]:
    """Lines of function-level imports of zerolaunch in `path` with no `# lazy:` comment above them (through
    the imports, blank lines, comments and try/except lines that lead to them)."""
    lines = path.read_text().splitlines()
    bad = []
    for node in ast.walk(ast.parse("\n".join(lines))):
        if not isinstance(node, (ast.Import, ast.ImportFrom)) or node.col_offset == 0:
            continue
        relative = isinstance(node, ast.ImportFrom) and node.level > 0
        names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
        if not relative and not any(n == "zerolaunch" or n.startswith("zerolaunch.") for n in names):
            continue
        i = node.lineno - 1
        explained = False
        while i >= 0:
            text = lines[i].strip()
            if "# lazy:" in text:
                explained = True
                break
            if not (
                text == "" or text.startswith(("#", "from ", "import ", "try:", "except")) or text == ")"
            ):
                break
            i -= 1
        if not explained:
            bad.append(node.lineno)
    return bad


def test_function_level_imports_of_ours_say_why():
    bad = [
        f"{path.relative_to(ROOT)}:{line}"
        for package in SWEPT
        for path in sorted((ROOT / package).rglob("*.py"))
        if str(path.relative_to(ROOT)) not in NOT_YET_SWEPT
        for line in _unexplained_lazy_imports(path)
    ]
    assert not bad, f"import at module level, or write `# lazy: <why>` above: {bad}"


def test_the_lazy_import_check_sees_one(tmp_path):
    source = tmp_path / "m.py"
    source.write_text(
        "def f():\n    from zerolaunch.util import atomic\n\n\n"
        "def g():\n    # lazy: torch\n    from zerolaunch.checkpoint import save\n"
    )
    assert _unexplained_lazy_imports(source) == [2]
