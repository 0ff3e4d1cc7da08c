"""Reading recipes: YAML/JSON files (with line numbers), the `deepspeed:` block or file, --set overrides.

`load_recipe` is the one entry point: file -> limits (limits.py: size, depth, key types) -> raw tree ->
overrides -> key-name checks -> resolution (auto.py, engine_options.py) -> builder args -> frozen `Recipe`. Precedence is stated once: --set > file > defaults. `save_resolved` /
`load_resolved` write and read run_dir/recipe.resolved.json. `deepspeed_engine_options` takes the same path for
a DeepSpeed config dict alone and stops at the engine options (the Hugging Face door brings its own model and
data). This module owns file formats and paths; the
meaning of keys lives in schema.py / deepspeed.py, their resolution in auto.py / engine.py.
"""

from __future__ import annotations

import copy
import json
import os
import re
import shlex
from collections.abc import Iterable
from pathlib import Path as FsPath
from typing import TYPE_CHECKING, Any

import yaml

from . import deepspeed as ds_vocab
from . import limits
from .auto import check_compile_scope, resolve_compile_optimizer, resolve_train
from .builders import DATA_PASSED, args_problem, check_builder_spec, import_builder
from .engine_options import resolve_engine_options
from .errors import RecipeError, did_you_mean
from .hidden import ModelHidden, gpt_hidden_sizes
from .paths import resolve_path_args
from .peft_section import resolve_peft
from .schema import (
    DEFAULT_DATA_BUILDER,
    DEFAULT_MODEL_BUILDER,
    PREFETCH_MODES,
    TOP_LEVEL_KEYS,
    CheckpointSection,
    DataSection,
    ModelSection,
    Recipe,
    TrainSection,
    section_keys,
)
from .tree import MISSING, Path, RawTree
from .values import DS, Resolver, check_builtin_args, check_model_dims

if TYPE_CHECKING:
    from zerolaunch.zero.options import EngineOptions

RESOLVED_NAME = "recipe.resolved.json"


# libyaml's parser when present: the pure-Python one takes seconds on a file near limits.MAX_RECIPE_BYTES.
_SafeLoader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class _Loader(_SafeLoader):
    """Safe YAML with DeepSpeed-style floats (1e9, 3e-4 are floats, not strings) and no duplicate keys."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None,
                    None,
                    f"duplicate key {key!r} (the second one would silently win)",
                    key_node.start_mark,
                )
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


# YAML 1.1 wants a dot in a float; DeepSpeed configs write 5e8 and people type --set train.lr=3e-4.
_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*\.?[0-9_]*|\.[0-9_]+)[eE][-+]?[0-9]+$"),
    list("-+0123456789."),
)


def parse_text(text: str, name: str, is_json: bool) -> tuple[Any, dict[Path, int]]:
    """Parse a recipe / DeepSpeed file; syntax errors name the file and line."""
    limits.check_size(len(text.encode("utf-8", "surrogatepass")), name)
    if is_json:
        try:
            data = json.loads(text, object_pairs_hook=lambda pairs: _no_duplicates(pairs, name))
        except json.JSONDecodeError as exc:
            raise RecipeError(
                f"{name} line {exc.lineno}, column {exc.colno}: not valid JSON ({exc.msg}). Fix the syntax there "
                "(JSON wants double quotes and no trailing commas)."
            ) from None
        except RecursionError:
            raise limits.too_deep(name, None) from None
        limits.check_tree(data, name)
        return data, _key_lines(text)
    try:
        limits.scan_yaml_events(text, name, _Loader)
        loader = _Loader(text)
        try:
            root = loader.get_single_node()
            if root is None:
                return None, {}
            limits.check_yaml_nodes(root, name)
            data = loader.construct_document(root)
        finally:
            loader.dispose()
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f"{name} line {mark.line + 1}, column {mark.column + 1}" if mark else name
        raise RecipeError(f"{where}: not valid YAML ({exc.problem or exc}). Fix the syntax there.") from None
    except yaml.YAMLError as exc:
        raise RecipeError(f"{name}: not valid YAML ({exc}). Fix the syntax.") from None
    return data, _node_lines(root)


def _no_duplicates(pairs: list[tuple[str, Any]], name: str) -> dict:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise RecipeError(f"{name}: duplicate key {key!r} (the second one would silently win). Keep one.")
        out[key] = value
    return out


def _key_lines(text: str) -> dict[Path, int]:
    """Line of every mapping key of a JSON file (JSON is YAML), for error messages; empty if it does not
    compose as YAML. The text passed the size and depth checks, so composing it is safe."""
    try:
        root = yaml.compose(text, Loader=_Loader)
    except yaml.YAMLError:
        return {}
    return _node_lines(root)


def _node_lines(root: Any) -> dict[Path, int]:
    """Line of every mapping key, by path."""
    lines: dict[Path, int] = {}
    stack: list[tuple[Any, Path]] = [(root, ())]
    while stack:
        node, path = stack.pop()
        if isinstance(node, yaml.MappingNode):
            for key_node, value_node in node.value:
                sub = path + (str(key_node.value),)
                lines.setdefault(sub, key_node.start_mark.line + 1)
                stack.append((value_node, sub))
    return lines


def read_file(path: FsPath, what: str = "recipe") -> tuple[Any, dict[Path, int]]:
    if not path.exists():
        raise RecipeError(
            f"The {what} file {path} does not exist. Check the path (and the current directory)."
        )
    if not path.is_file():
        raise RecipeError(f"The {what} path {path} is not a file. Pass a .yaml, .yml or .json file.")
    try:
        limits.check_size(path.stat().st_size, str(path))  # before reading: a huge file is refused at once
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise RecipeError(f"Cannot read the {what} file {path}: {exc}.") from None
    data, lines = parse_text(text, str(path), is_json=path.suffix.lower() == ".json")
    if data is None:
        raise RecipeError(f"The {what} file {path} is empty. Give at least one section (e.g. `train:`).")
    return data, lines


def parse_override(text: str) -> tuple[Path, Any]:
    """`train.lr=3e-4` -> (("train", "lr"), 0.0003); a DeepSpeed key may omit the `deepspeed.` prefix."""
    key, sep, value_text = text.partition("=")
    path = tuple(part.strip() for part in key.strip().split("."))
    if not sep or not all(path):
        raise RecipeError(
            f"--set {text!r} is not KEY=VALUE with a dotted KEY. Write e.g. --set train.lr=3e-4."
        )
    head = path[0]
    if head in ds_vocab.TOP and head not in TOP_LEVEL_KEYS:
        path = DS + path
    elif head not in TOP_LEVEL_KEYS:
        raise RecipeError(
            f"--set {text}: unknown key `{head}`." + did_you_mean(head, [*TOP_LEVEL_KEYS, *ds_vocab.TOP])
        )
    name = f"--set {'.'.join(path)}=..."  # the value itself may be the problem: too long to quote
    try:
        if value_text.strip():
            limits.scan_yaml_events(value_text, name, _Loader)
        value = yaml.load(value_text, Loader=_Loader) if value_text.strip() else None  # noqa: S506
    except yaml.YAMLError:
        raise RecipeError(f"--set {text}: cannot parse the value {value_text!r} as YAML. Quote it.") from None
    limits.check_tree(value, name)
    return path, value


def build_tree(raw: Any, name: str, lines: dict[Path, int], base_dir: FsPath) -> tuple[RawTree, bool]:
    """The raw tree of one recipe; returns (tree, is_bare_deepspeed_config)."""
    if not isinstance(raw, dict):
        raise RecipeError(f"{name}: a recipe must be a mapping of sections, got {type(raw).__name__}.")
    bare = bool(raw) and not any(k in TOP_LEVEL_KEYS for k in raw) and any(k in ds_vocab.TOP for k in raw)
    if bare:
        return _deepspeed_tree(raw, name, lines), True
    tree = RawTree()
    tree.put((), raw, "file", name, lines)
    for key in raw:
        if key in ds_vocab.TOP and key not in TOP_LEVEL_KEYS:
            raise RecipeError(
                f"{tree.where((key,))}: `{key}` is a DeepSpeed key; in a recipe it goes under `deepspeed:` "
                f"(or pass the DeepSpeed file itself as the recipe)."
            )
    block = raw.get("deepspeed")
    if isinstance(block, str):
        ds_path = (base_dir / block).resolve()
        data, ds_lines = read_file(ds_path, what="DeepSpeed config (from `deepspeed:`)")
        if not isinstance(data, dict):
            raise RecipeError(
                f"{ds_path}: a DeepSpeed config must be a JSON object, got {type(data).__name__}."
            )
        tree.put(DS, data, "file", str(ds_path), ds_lines)
    elif block is not None and not isinstance(block, dict):
        raise RecipeError(
            f"{tree.where(DS)}: `deepspeed` must be a mapping of DeepSpeed keys or a path to a ds_config.json, "
            f"got {block!r}."
        )
    return tree, False


def _deepspeed_tree(raw: dict, name: str, lines: dict[Path, int]) -> RawTree:
    """The tree of a bare DeepSpeed config: its keys under `deepspeed:`, shown without that prefix."""
    tree = RawTree()
    tree.put((), {"deepspeed": raw}, "file", name)
    tree.put(DS, raw, "file", name, lines)
    tree.bare_deepspeed = True
    return tree


def _normalize(tree: RawTree, notes: dict[str, str]) -> None:
    """Old DeepSpeed spellings -> current ones, noted."""
    zero = tree.get(DS + ("zero_optimization",))
    if isinstance(zero, bool):
        tree.put(DS + ("zero_optimization",), {"stage": 1 if zero else 0}, tree.origin(DS), tree.where(DS))
        notes["deepspeed.zero_optimization"] = (
            f"legacy `zero_optimization: {str(zero).lower()}` = stage {int(zero)}"
        )
    if isinstance(tree.get(DS), dict) and "bfloat16" in tree.get(DS):
        if tree.has(DS + ("bf16",)):
            raise RecipeError(
                f"{tree.where(DS + ('bfloat16',))}: both `bf16` and its old name `bfloat16` are given. Keep `bf16`."
            )
        tree.rename(DS + ("bfloat16",), DS + ("bf16",))
        notes["deepspeed.bf16"] = "given under its old name `bfloat16`"
    zero = tree.get(DS + ("zero_optimization",))
    if isinstance(zero, dict):
        _zero_field_names(tree, zero, notes)
        _cpu_offload_flags(tree, zero, notes)


def _zero_field_names(tree: RawTree, zero: dict, notes: dict[str, str]) -> None:
    """DeepSpeed's unprefixed field names (`max_live_parameters`) -> the stage3_* keys, noted."""
    Z = DS + ("zero_optimization",)
    for name, key in ds_vocab.ZERO_FIELD_NAMES.items():
        if name not in zero:
            continue
        if key in zero:
            raise RecipeError(
                f"{tree.where(Z + (name,))}: both `{name}` and `{key}` are given (the same DeepSpeed setting "
                f"under its field name and its alias). Keep `{key}`."
            )
        tree.rename(Z + (name,), Z + (key,))
        notes[f"deepspeed.zero_optimization.{key}"] = (
            f"given as `{name}`, DeepSpeed's field name for this key"
        )


def _cpu_offload_flags(tree: RawTree, zero: dict, notes: dict[str, str]) -> None:
    """The deprecated `cpu_offload: true` -> offload_optimizer {device: cpu}, as DeepSpeed maps it (noted)."""
    Z = DS + ("zero_optimization",)
    for flag, block in (("cpu_offload", "offload_optimizer"), ("cpu_offload_param", "offload_param")):
        if zero.get(flag) is not True:
            continue  # false / absent: deepspeed.py notes or refuses it
        if zero.get(block) not in (None, {}):
            raise RecipeError(
                f"{tree.where(Z + (flag,))}: the deprecated `{flag}: true` and `{block}` are both given. "
                f"Keep `{block}` only."
            )
        origin, where = tree.origin(Z + (flag,)), tree.where(Z + (flag,))
        del zero[flag]
        tree.put(Z + (block,), {"device": "cpu"}, origin, where)
        tree.put(Z + (block, "device"), "cpu", origin, where)
        notes[f"deepspeed.zero_optimization.{block}.device"] = (
            f"from the deprecated `{flag}: true` (DeepSpeed maps it to {block}: {{device: cpu}})"
        )


def check_recipe_names(tree: RawTree) -> None:
    for key, value in tree.get(()).items():
        if key not in TOP_LEVEL_KEYS:
            raise RecipeError(
                f"{tree.where((key,))}: unknown top-level key `{key}`." + did_you_mean(key, TOP_LEVEL_KEYS)
            )
        if key in ("entrypoint", "deepspeed") or value is None:
            continue
        if not isinstance(value, dict):
            raise RecipeError(f"{tree.where((key,))}: section `{key}` must be a mapping, got {value!r}.")
        valid = section_keys(key)
        for sub in value:
            if sub not in valid:
                raise RecipeError(
                    f"{tree.where((key, sub))}: unknown key `{key}.{sub}`." + did_you_mean(str(sub), valid)
                )


def _record_leaves(r: Resolver, key: str, path: Path, value: Any, default: bool) -> None:
    if isinstance(value, dict) and value:
        for sub, item in value.items():
            _record_leaves(r, f"{key}.{sub}", path + (str(sub),), item, default)
    else:
        r.record(key, "default" if default or not r.tree.has(path) else r.tree.origin(path))


def _local_path(r: Resolver, key: str, path: Path, base_dir: FsPath, must_be_file: bool) -> str | None:
    value = r.value(key, path, "optional_str", None)
    if value is None:
        return None
    full = (base_dir / os.path.expanduser(value)).resolve()
    if not full.exists() or (must_be_file and not full.is_file()):
        raise r.fail(
            path,
            f"names {full}, which does not exist",
            "Fix the path (relative paths start at the recipe's folder)",
        )
    return str(full)


def _sections(
    r: Resolver, train: TrainSection, base_dir: FsPath
) -> tuple[ModelSection, DataSection, CheckpointSection, str | None]:
    built: dict[str, Any] = {}
    for section, default_builder in (("model", DEFAULT_MODEL_BUILDER), ("data", DEFAULT_DATA_BUILDER)):
        builder = r.value(f"{section}.builder", (section, "builder"), "str", default_builder)
        check_builder_spec(builder, base_dir, key=f"{section}.builder")
        path = (section, "args")
        default_args = {"size": "tiny"} if section == "model" and builder == DEFAULT_MODEL_BUILDER else {}
        args = r.convert(path, r.raw(path), "mapping") if r.tree.has(path) else copy.deepcopy(default_args)
        _record_leaves(r, f"{section}.args", path, args, default=not r.tree.has(path))
        args = resolve_path_args(r, section, builder, args, base_dir)  # config/paths.py: one rule for all
        check_model_dims(r, path, args)
        check_builtin_args(r, path, builder, args, tuple(gpt_hidden_sizes()))
        built[section] = (builder, args)
    init_from = _local_path(r, "model.init_from", ("model", "init_from"), base_dir, must_be_file=False)
    model = ModelSection(builder=built["model"][0], args=built["model"][1], init_from=init_from)
    prefetch = r.value(
        "data.prefetch",
        ("data", "prefetch"),
        "choice",
        "auto",
        auto=lambda: ("auto", "a worker process on CUDA, a thread on the CPU"),
        default_note="process on CUDA, thread on the CPU",
        choices=PREFETCH_MODES,
    )
    eval_path: Path = ("data", "eval")
    eval_args = r.convert(eval_path, r.raw(eval_path), "mapping") if r.tree.has(eval_path) else {}
    _record_leaves(r, "data.eval", eval_path, eval_args, default=not r.tree.has(eval_path))
    eval_args = resolve_path_args(r, "data", built["data"][0], eval_args, base_dir, args_key="eval")
    allow_change = r.value("data.allow_change", ("data", "allow_change"), "bool", False)
    data = DataSection(
        builder=built["data"][0],
        args=built["data"][1],
        prefetch=prefetch,
        eval=eval_args,
        allow_change=allow_change,
    )
    c: Path = ("checkpoint",)
    ckpt_dir = r.value("checkpoint.dir", c + ("dir",), "optional_str", None)
    if ckpt_dir is None:
        ckpt_dir = f"{train.run_dir}/checkpoints"
        r.record("checkpoint.dir", "derived", "run_dir/checkpoints")
    checkpoint = CheckpointSection(
        dir=ckpt_dir,
        every=r.value("checkpoint.every", c + ("every",), "int", 0, default_note="only at the end", min=0),
        keep=r.value("checkpoint.keep", c + ("keep",), "int", 3, min=0),
        keep_best=r.value(
            "checkpoint.keep_best", c + ("keep_best",), "optional_choice", None, choices=("eval_loss",)
        ),
    )
    if checkpoint.keep_best and not (train.eval_every and data.eval):
        raise r.fail(
            c + ("keep_best",),
            "needs evaluations, but train.eval_every or data.eval is not set",
            "Set train.eval_every: N and data.eval (e.g. {path: DIR} or {split: eval}), or drop keep_best",
        )
    if train.eval_every and not data.eval:
        raise r.fail(
            ("train", "eval_every"),
            "is set but data.eval is empty, so there is nothing to evaluate on",
            "Set data.eval: {path: PREPARED_DIR} or {split: eval} with data.args.holdout",
        )
    entrypoint = _entrypoint(r, base_dir)
    return model, data, checkpoint, entrypoint


def _entrypoint(r: Resolver, base_dir: FsPath) -> str | None:
    """`entrypoint:` a script path, a command line ("train.py --foo 1", split like a shell) or a list.

    Resolved to one string: the script's absolute path alone, or shell-quoted with its arguments
    (train/entrypoint.py splits it back). The script must be a file now, before any worker starts."""
    path: Path = ("entrypoint",)
    raw = r.raw(path)
    if raw is MISSING or raw is None:
        r.record("entrypoint", "default")
        return None
    if isinstance(raw, list) and raw and all(isinstance(a, str | int | float) for a in raw):
        argv = [str(a) for a in raw]
    elif isinstance(raw, str):
        whole = (base_dir / os.path.expanduser(raw.strip())).resolve()
        try:  # a path with spaces that exists as written is one path, not a command line
            argv = [raw.strip()] if whole.is_file() else shlex.split(raw)
        except ValueError as err:
            raise r.fail(
                path, f"cannot be split like a shell command line ({err})", "Fix the quoting"
            ) from None
    else:
        raise r.fail(path, f"is {raw!r}", 'Give a script path, a command line ("train.py --lr 1") or a list')
    if not argv:
        raise r.fail(path, "is empty", "Give the path of your training script, e.g. entrypoint: train.py")
    script = (base_dir / os.path.expanduser(argv[0])).resolve()
    if not script.is_file():
        raise r.fail(
            path,
            f"names {script}, which does not exist" + ("" if not script.exists() else " as a file"),
            "Fix the script path (relative paths start at the recipe's folder); arguments follow it, "
            'e.g. entrypoint: "train.py --lr 1"',
        )
    r.record("entrypoint", r.tree.origin(path))
    return str(script) if len(argv) == 1 else shlex.join([str(script), *argv[1:]])


def _check_world_size(world_size: Any) -> None:
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise RecipeError(f"world size must be a positive integer, got {world_size!r}.")


def _resolve_options(
    tree: RawTree, world_size: int, stem: str | None, model_hidden: ModelHidden | None
) -> tuple[Resolver, TrainSection, EngineOptions]:
    """Spellings normalized, key names checked, then the train section and the engine options resolved: what
    a recipe and a bare DeepSpeed config share (the model, data and checkpoint sections are the recipe's)."""
    notes: dict[str, str] = {}
    _normalize(tree, notes)
    check_recipe_names(tree)
    if isinstance(tree.get(DS), dict):
        ds_vocab.check_names(tree, DS, notes)
    r = Resolver(tree, world_size)
    r.notes.update(notes)
    optimizer = ds_vocab.optimizer_name(tree, DS)
    has_scheduler = ds_vocab.scheduler_name(tree, DS) is not None
    train = resolve_train(r, stem, has_scheduler, optimizer)
    engine = resolve_engine_options(r, train, model_hidden)
    check_compile_scope(r, train, engine)
    train, engine = resolve_compile_optimizer(r, train, engine)
    return r, train, engine


def deepspeed_engine_options(
    config: dict[str, Any],
    *,
    world_size: int,
    model_hidden: ModelHidden,
    source: str = "the DeepSpeed config",
) -> EngineOptions:
    """The engine options of a DeepSpeed config dict, for a door that brings its own model and data (the
    Hugging Face Trainer's): the checks, "auto"s and errors of `load_recipe` on the same dict, without a
    Recipe's model, data or checkpoint sections. Every top-level key is a DeepSpeed key, `checkpoint`
    included (DeepSpeed's own block, noted). `model_hidden`: the trained model's hidden size, which the
    bucket "auto"s need (required: there is no recipe model section to fall back on). `source`: what every
    error message names the config as (the door knows where the user wrote it: a file, an argument)."""
    _check_world_size(world_size)
    if not isinstance(config, dict):
        raise RecipeError(f"{source}: a DeepSpeed config must be a mapping, got {type(config).__name__}.")
    limits.check_tree(config, source)  # before deepcopy, which recurses
    tree = _deepspeed_tree(copy.deepcopy(config), source, {})
    return _resolve_options(tree, world_size, None, model_hidden)[2]


def load_recipe(
    source: str | os.PathLike[str] | dict[str, Any],
    overrides: Iterable[str] = (),
    world_size: int = 1,
    check_builders: bool = False,
    model_hidden: ModelHidden | None = None,
) -> Recipe:
    """Load, override (--set > file > defaults), check and resolve a recipe for `world_size` ranks.
    `model_hidden`: the hidden size of a model the caller holds, which the bucket "auto"s take instead of
    the recipe's model section (the Hugging Face door takes `deepspeed_engine_options`)."""
    _check_world_size(world_size)
    if isinstance(source, dict):
        limits.check_tree(source, "the recipe")  # before deepcopy, which recurses
        raw, lines, name, base_dir, stem = copy.deepcopy(source), {}, "the recipe", FsPath.cwd(), None
    else:
        file = FsPath(source)
        raw, lines = read_file(file)
        name, base_dir, stem = str(file), file.resolve().parent, file.stem
    tree, bare = build_tree(raw, name, lines, base_dir)
    for text in overrides:
        path, value = parse_override(text)
        tree.put(path, value, "--set", f"--set {text}")
    block = tree.get(DS)
    if isinstance(block, str):
        # `--set deepspeed=ds.json`: a path on the command line is relative to the working directory.
        where = tree.where(DS)
        data, _ = read_file(FsPath(block).resolve(), what=f"DeepSpeed config (from {where})")
        if not isinstance(data, dict):
            raise RecipeError(
                f"{block}: a DeepSpeed config must be a JSON object, got {type(data).__name__}."
            )
        tree.put(DS, data, "--set", where)
    r, train, engine = _resolve_options(tree, world_size, stem, model_hidden)
    model, data, checkpoint, entrypoint = _sections(r, train, base_dir)
    peft = resolve_peft(r, entrypoint)
    if bare:
        r.notes["model.builder"] = (
            "a bare DeepSpeed config: the built-in tiny GPT on synthetic data (defaults)"
        )
    if check_builders:
        for section, passed in (("model", ()), ("data", DATA_PASSED)):
            spec, args = (model.builder, model.args) if section == "model" else (data.builder, data.args)
            fn = import_builder(spec, base_dir, key=f"{section}.builder")
            problem = args_problem(fn, args, passed)
            if problem is not None:
                name, what, fix = problem
                path = (section, "args", name)
                at = path if r.tree.has(path) else (section, "args")
                end = "" if fix.endswith((".", "?")) else "."
                raise RecipeError(f"{r.where(at)}: `{section}.args.{name}` {what} ({spec}). {fix}{end}")
    return Recipe(
        model=model,
        data=data,
        train=train,
        checkpoint=checkpoint,
        engine=engine,
        entrypoint=entrypoint,
        origins=r.origins,
        notes=r.notes,
        source=None if isinstance(source, dict) else str(FsPath(source).resolve()),
        base_dir=str(base_dir),
        peft=peft,
    )


def save_resolved(recipe: Recipe, run_dir: str | os.PathLike[str]) -> FsPath:
    """Write run_dir/recipe.resolved.json (via a temp file + rename, so a reader never sees half a file).

    Every node of a multi-node run writes it into the shared run_dir at about the same moment: each writer
    uses its own temp name (see util.atomic.writer_unique_name), or one node's rename fails and that
    launcher dies before the rendezvous while its peers wait for it."""
    from zerolaunch.util.atomic import write_text_atomic

    folder = FsPath(run_dir)
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / RESOLVED_NAME
    write_text_atomic(target, json.dumps(recipe.to_json(), indent=2) + "\n")
    return target


def load_resolved(path: str | os.PathLike[str]) -> Recipe:
    """The recipe exactly as `save_resolved` wrote it (no re-resolution)."""
    file = FsPath(path)
    if file.is_dir():
        file = file / RESOLVED_NAME
    if not file.is_file():
        raise RecipeError(f"{file} does not exist. Pass the run dir or its {RESOLVED_NAME}.")
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise RecipeError(
            f"{file} cannot be read as JSON ({exc}). Re-create it with `zerolaunch train`."
        ) from None
    return Recipe.from_json(data, where=str(file))
