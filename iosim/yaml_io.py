"""Reading the files people write: GPU and CPU profiles, kernel descriptions, scenarios (YAML, or JSON by suffix).

One loader for all of them, loaded safely, refusing what YAML and JSON readers take silently or crash on: a key given
twice in one mapping (YAML keeps the last, so the first value would be lost without a word) and nesting more than
:data:`MAX_DEPTH` levels deep (the recursive readers would raise RecursionError). Errors name the file and say
what is wrong; each caller passes its own error class (ProfileError, KernelError, ScenarioError).

    >>> data = read_data("my-gpu.yaml", ProfileError)
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

MAX_DEPTH = 100  # our files nest a few levels; a hundred leaves room for any hand-written file


class DataFileError(ValueError):
    """A YAML or JSON file that cannot be read as data (the default error class of :func:`parse_data`)."""


class _Refused(Exception):
    """Nesting too deep or a key twice: worded here, then raised as the caller's error naming the file."""


class _Loader(yaml.SafeLoader):
    """PyYAML's safe loader, counting the depth of nodes as it composes them and refusing keys given twice."""

    def __init__(self, stream):
        super().__init__(stream)
        self._depth = 0

    def compose_node(self, parent, index):
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                mark = self.peek_event().start_mark
                raise _Refused(f"nested more than {MAX_DEPTH} levels deep (line {mark.line + 1})")
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def construct_mapping(self, node, deep=False):
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            if not isinstance(key_node, yaml.ScalarNode) or key_node.tag == "tag:yaml.org,2002:merge":
                continue  # a merge (<<) may be overridden by the keys beside it
            key = self.construct_object(key_node)
            line = key_node.start_mark.line + 1
            if key in seen:
                raise _Refused(f"key {key!r} given twice (line {line}; first on line {seen[key]}): give each "
                               "key once")
            seen[key] = line
        return super().construct_mapping(node, deep=deep)


def _json_pairs(pairs):
    out = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"key {key!r} given twice: give each key once")
        out[key] = value
    return out


def _json_depth(text: str) -> int:
    """The deepest nesting of brackets outside strings, without recursion."""
    depth = deepest = 0
    in_string = escaped = False
    for ch in text:
        if escaped:
            escaped = False
        elif in_string:
            escaped, in_string = ch == "\\", ch != '"'
        elif ch == '"':
            in_string = True
        elif ch in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif ch in "]}":
            depth -= 1
    return deepest


def parse_data(text: str, where: str, *, is_json: bool = False, error: type[Exception] = DataFileError) -> Any:
    """The data in ``text`` (YAML, or JSON with ``is_json``); ``error`` naming ``where`` if it is not valid, has a
    key twice, or nests more than MAX_DEPTH levels."""
    kind = "JSON" if is_json else "YAML"
    try:
        if is_json:
            if _json_depth(text) > MAX_DEPTH:
                raise _Refused(f"nested more than {MAX_DEPTH} levels deep")
            return json.loads(text, object_pairs_hook=_json_pairs)
        return yaml.load(text, Loader=_Loader)  # a SafeLoader: no arbitrary objects
    except _Refused as exc:
        raise error(f"{where}: not valid {kind}: {exc}") from None
    except (yaml.YAMLError, ValueError) as exc:  # json.JSONDecodeError is a ValueError
        text = " ".join(str(exc).replace('in "<unicode string>", ', "at ").split())
        raise error(f"{where}: not valid {kind}: {text}") from None


def read_data(path: str | Path, error: type[Exception] = DataFileError) -> Any:
    """The data of the file at ``path`` (JSON for ``.json``, else YAML), as :func:`parse_data` reads it."""
    path = Path(path)
    return parse_data(path.read_text(), str(path), is_json=path.suffix == ".json", error=error)
