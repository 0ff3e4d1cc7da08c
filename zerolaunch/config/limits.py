"""How big, how deep and what shape a recipe may be before any of it is read as settings.

A recipe is a few KB of settings. These checks run on the file or tree before the loader walks it, so that
a damaged or generated file is refused in well under a second with the limit named, instead of a
RecursionError, a crash inside the YAML library (its C composer recurses without a guard), a TypeError on a
key YAML read as `true`, or minutes of parsing. The meaning of keys lives in schema.py / deepspeed.py; the
bounds on integer settings live in values.py.
"""

from __future__ import annotations

from typing import Any

import yaml

from .errors import RecipeError

MAX_RECIPE_BYTES = 256 * 1024
"""A recipe or DeepSpeed config is a few KB; data belongs in files that data.args points to."""
MAX_DEPTH = 32
"""Mappings and lists nested inside each other; real recipes stay under 8."""
MAX_VALUES = 20_000
"""Keys, values and list items together, YAML anchors counted each time they are used. Real recipes hold
under 200; the bound keeps the worst file under a second to read."""

_YAML_KEY_KINDS = {
    "tag:yaml.org,2002:bool": "a boolean",
    "tag:yaml.org,2002:null": "null (no value)",
    "tag:yaml.org,2002:int": "an integer",
    "tag:yaml.org,2002:float": "a number",
    "tag:yaml.org,2002:timestamp": "a date",
    "tag:yaml.org,2002:binary": "binary data",
}
_STR = "tag:yaml.org,2002:str"
_MERGE = "tag:yaml.org,2002:merge"  # `<<: *defaults`: the constructor merges it away


def _where(path: tuple[str, ...]) -> str:
    return f"under `{'.'.join(path)}`" if path else "at the top level"


def check_size(size_bytes: int, name: str) -> None:
    if size_bytes > MAX_RECIPE_BYTES:
        raise RecipeError(
            f"{name} is {size_bytes:,} bytes; a recipe is limited to {MAX_RECIPE_BYTES:,} bytes "
            f"({MAX_RECIPE_BYTES // 1024} KiB). A recipe holds settings; put data in a file and name it in "
            "data.args."
        )


def too_deep(name: str, line: int | None) -> RecipeError:
    where = f"{name} line {line}" if line is not None else name
    return RecipeError(
        f"{where}: mappings and lists nest deeper than {MAX_DEPTH} levels, the limit for a recipe. "
        "Check for unclosed brackets or an indentation that runs away."
    )


def _too_many(name: str) -> RecipeError:
    return RecipeError(
        f"{name} holds more than {MAX_VALUES:,} keys, values and list items (YAML anchors counted each time "
        "they are used), the limit for a recipe. A recipe holds settings; put data in a file and name it in "
        "data.args."
    )


def scan_yaml_events(text: str, name: str, loader: type) -> None:
    """Depth and size from the parser's event stream, before anything is composed.

    The event parser keeps its own stack, so any nesting is safe to scan; composing a 100k-deep flow list
    crashes the C composer outright. Newer libyaml scanners stop at their own nesting cap (1000) while
    looking ahead, before the parser hands over the 33rd event. So the text up to a syntax error is scanned
    again with the pure-Python parser, which has no cap: deep nesting is named as this limit on every
    version, and any other error stays the library's own."""
    try:
        _scan_events(text, name, loader)
    except yaml.YAMLError as exc:
        if loader is yaml.SafeLoader:
            raise
        mark = getattr(exc, "problem_mark", None)
        head = text if mark is None else text[: mark.index + 1]  # the cap is met before the error's place
        try:
            _scan_events(head, name, yaml.SafeLoader)
        except yaml.YAMLError:
            pass
        raise


def _scan_events(text: str, name: str, loader: type) -> None:
    depth = 0
    count = 0
    for event in yaml.parse(text, Loader=loader):
        if isinstance(event, (yaml.MappingStartEvent, yaml.SequenceStartEvent)):
            depth += 1
            if depth > MAX_DEPTH:
                raise too_deep(name, event.start_mark.line + 1 if event.start_mark else None)
        elif isinstance(event, (yaml.MappingEndEvent, yaml.SequenceEndEvent)):
            depth -= 1
            continue
        elif not isinstance(event, (yaml.ScalarEvent, yaml.AliasEvent)):
            continue
        count += 1
        if count > MAX_VALUES * 2:  # keys are scalar events too; check_yaml_nodes counts values exactly
            raise _too_many(name)


def check_yaml_nodes(root: yaml.Node, name: str) -> None:
    """Every mapping key is a plain string; anchors expanded stay under MAX_VALUES.

    YAML 1.1 reads `on:`, `no:`, `null:`, `1:` and `1.5:` as a boolean, null or a number, which no recipe key
    is; the error quotes the key as written, with its line."""
    stack: list[tuple[yaml.Node, tuple[str, ...]]] = [(root, ())]
    count = 0
    while stack:
        node, path = stack.pop()
        count += 1
        if count > MAX_VALUES:
            raise _too_many(name)
        if isinstance(node, yaml.SequenceNode):
            stack.extend((item, path) for item in node.value)
        elif isinstance(node, yaml.MappingNode):
            for key_node, value_node in node.value:
                if key_node.tag == _MERGE:
                    stack.append((value_node, path))
                    continue
                if not isinstance(key_node, yaml.ScalarNode) or key_node.tag != _STR:
                    raise _bad_key(key_node, path, name)
                stack.append((value_node, (*path, key_node.value)))


def _bad_key(key_node: yaml.Node, path: tuple[str, ...], name: str) -> RecipeError:
    line = key_node.start_mark.line + 1
    if not isinstance(key_node, yaml.ScalarNode):
        return RecipeError(
            f"{name} line {line}: a key {_where(path)} is a {'list' if isinstance(key_node, yaml.SequenceNode) else 'mapping'}; "
            "recipe keys are names. Write `name: value`."
        )
    written = key_node.value
    kind = _YAML_KEY_KINDS.get(key_node.tag, f"a value of tag {key_node.tag}")
    why = {
        "tag:yaml.org,2002:bool": " (YAML 1.1 reads on, off, yes, no, true and false as booleans)",
        "tag:yaml.org,2002:null": " (YAML reads null, ~ and an empty key as null)",
    }.get(key_node.tag, "")
    return RecipeError(
        f"{name} line {line}: the key `{written}` {_where(path)} is read by YAML as {kind}, not as a "
        f'name{why}. Quote it ("{written}": ...) if you mean that name, or fix the key.'
    )


def check_tree(data: Any, name: str) -> None:
    """The same limits for a tree that did not come from YAML (JSON, a dict, a --set value)."""
    stack: list[tuple[Any, tuple[str, ...], int]] = [(data, (), 1)]
    count = 0
    while stack:
        node, path, depth = stack.pop()
        count += 1
        if count > MAX_VALUES:
            raise _too_many(name)
        if isinstance(node, (list, tuple, dict)) and depth > MAX_DEPTH:
            raise too_deep(name, None)
        if isinstance(node, (list, tuple)):
            stack.extend((item, path, depth + 1) for item in node)
        elif isinstance(node, dict):
            for key, value in node.items():
                if not isinstance(key, str):
                    kind = {bool: "a boolean", int: "an integer", float: "a number", type(None): "null"}.get(
                        type(key), f"a {type(key).__name__}"
                    )
                    raise RecipeError(
                        f"{name}: the key {key!r} {_where(path)} is {kind}, not a name. Recipe keys are "
                        "strings; quote it."
                    )
                stack.append((value, (*path, key), depth + 1))
