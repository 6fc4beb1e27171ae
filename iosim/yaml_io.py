"""Reading the files people write: GPU and CPU profiles, kernel descriptions, scenarios (YAML, or JSON by suffix).

One loader for all of them, loaded safely, refusing what YAML and JSON readers take silently or crash on: a key given
twice in one mapping (YAML keeps the last, so the first value would be lost without a word) and nesting more than
:data:`MAX_DEPTH` levels deep (the recursive readers would raise RecursionError). Errors name the file and say
what is wrong; each caller passes its own error class (ProfileError, KernelError, ScenarioError).
:func:`validated` then checks the data against the file's pydantic model and words every bad field one way for all
of them: ``where: invalid <kind>`` and one line per field, ``problems[0].seq_len: what is wrong``.

    >>> profile = validated(Profile, read_data("my-gpu.yaml", ProfileError), "my-gpu.yaml", ProfileError, "profile")
"""

from __future__ import annotations

import json
import typing
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

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


# -- validating what was read, and wording what is wrong ----------------------------------------------------

Model = TypeVar("Model", bound=BaseModel)


def validated(model: type[Model], data: Any, where: str, error: type[Exception], kind: str) -> Model:
    """``data`` as a ``model``; else ``error`` naming ``where`` and, one line each, every bad field
    (:func:`worded_errors`)."""
    if not isinstance(data, dict):
        raise error(f"{where}: a {kind} must be a mapping of fields, got {type(data).__name__}")
    try:
        return model.model_validate(data)
    except ValidationError as err:
        raise error(worded_errors(err, where, kind, model)) from None


def worded_errors(err: ValidationError, where: str, kind: str, model: type[BaseModel] | None = None) -> str:
    """``where: invalid <kind>``, then per bad field its path (``problems[0].seq_len``) and what is wrong: the value
    given where pydantic's words do not show it, the keys accepted beside an unknown one (where ``model``, the
    top-level model, shows them unambiguously)."""
    lines = [f"{where}: invalid {kind}"]
    for e in err.errors():
        if e["type"] == "literal_error" and isinstance(e.get("input"), dict):
            continue  # the other member of a union (tiles: 'default' or a mapping) says what is wrong
        loc = tuple(p for p in e["loc"] if not _union_member(p))
        msg = e["msg"].removeprefix("Value error, ")
        if e["type"] == "extra_forbidden":
            known = _model_at(model, loc)
            accepted = ", ".join(f.alias or k for k, f in known.model_fields.items()) if known else ""
            msg = "unknown key: remove it or check its spelling" + (f" (accepted: {accepted})" if accepted else "")
        elif e["type"] == "missing":
            msg = "required field is missing: add it"
        elif "input" in e and not isinstance(e["input"], (dict, list)) and repr(e["input"]) not in msg:
            msg = f"{e['input']!r}: {msg}"  # the value given, where the message does not already say it
        lines.append(f"  {_path(loc)}: {msg}")
    return "\n".join(lines)


def _union_member(part) -> bool:
    """pydantic's name for the member of a union it tried (``str``, ``function-after[...]``): not a field."""
    return isinstance(part, str) and part != "[key]" and ("[" in part or part in ("str", "int"))


def _path(parts) -> str:
    """``problems[0].seq_len``; a mapping's bad key (pydantic's ``[key]``) as ``value[0] (key)``."""
    out = ""
    for p in parts:
        if p == "[key]":
            out += " (key)"
        else:
            out += f"[{p}]" if isinstance(p, int) else ("." if out else "") + str(p)
    return out or "(top level)"


def _model_at(model: Any, loc) -> type[BaseModel] | None:
    """The model whose field is at ``loc[:-1]`` below ``model``; None where a union leaves it open."""
    for part in loc[:-1]:
        if isinstance(part, int):
            continue
        if not (isinstance(model, type) and issubclass(model, BaseModel)) or part not in model.model_fields:
            return None
        model = _only_model(model.model_fields[part].annotation)
    return model if isinstance(model, type) and issubclass(model, BaseModel) else None


def _only_model(annotation) -> type[BaseModel] | None:
    """The one model class an annotation (``X``, ``list[X]``, ``X | None``, ``dict[str, X]``) holds, else None."""
    found, todo = set(), [annotation]
    while todo:
        tp = todo.pop()
        if isinstance(tp, type) and issubclass(tp, BaseModel):
            found.add(tp)
        todo.extend(typing.get_args(tp))
    return found.pop() if len(found) == 1 else None
