"""Reading YAML/JSON hardware documents and checking them against their JSON Schema, with line numbers.

One validator writes every message: :func:`check` interprets the small subset of JSON Schema our schemas
use (``type``, ``properties``, ``required``, ``additionalProperties``, ``items``/``prefixItems``,
``minItems``/``maxItems``, ``minimum``/``exclusiveMinimum``/``maximum``, ``enum``, ``minLength``,
``minProperties``, ``oneOf``, local ``$ref``). The schemas ship in ``planner/schemas/`` and are the
published description of the formats; tests check the examples against them with ``jsonschema`` too.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from difflib import get_close_matches
from functools import lru_cache
from pathlib import Path
from typing import Any

import yaml

from planner.errors import ClusterError

SCHEMA_DIR = Path(__file__).resolve().parent.parent / "schemas"
QUOTE_CHARS = 60  # how much of a wrong text value an error message quotes

JsonPath = tuple[object, ...]


@lru_cache(maxsize=None)
def load_schema(name: str) -> dict[str, Any]:
    """``name`` is ``cluster``, ``device`` or ``node``."""
    with open(SCHEMA_DIR / f"{name}.schema.json", encoding="utf-8") as fh:
        return json.load(fh)


@dataclass(frozen=True)
class Document:
    """A parsed YAML/JSON document and the line of every value in it (1-based), keyed by its JSON path."""

    data: Any
    where: str  # the file name, or a short description of where the text came from
    lines: dict[JsonPath, int]

    def at(self, path: JsonPath) -> str:
        """``file:line`` for a value (or its closest ancestor that has a line)."""
        for cut in range(len(path), -1, -1):
            line = self.lines.get(tuple(path[:cut]))
            if line is not None:
                return f"{self.where}:{line}"
        return self.where


def _index_lines(node: yaml.Node, path: JsonPath, out: dict[JsonPath, int], where: str = "") -> None:
    out[path] = node.start_mark.line + 1
    if isinstance(node, yaml.MappingNode):
        seen: set[str] = set()
        for key_node, value_node in node.value:
            key = key_node.value
            if key in seen:  # YAML would silently keep the last one
                raise ClusterError(f"{where}:{key_node.start_mark.line + 1}: the key {key!r} appears twice; keep one")
            seen.add(key)
            _index_lines(value_node, path + (key,), out, where)
            out[path + (key,)] = key_node.start_mark.line + 1  # a value's errors point at its key's line
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            _index_lines(item, path + (i,), out, where)


def parse_text(text: str, where: str) -> Document:
    """Parse YAML (JSON is YAML) safely. Malformed text raises ClusterError naming the line."""
    try:
        data = yaml.safe_load(text)
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = f":{mark.line + 1}" if mark is not None else ""
        problem = exc.problem or exc.context or "malformed"
        raise ClusterError(f"{where}{line}: malformed YAML/JSON: {problem}") from None
    except yaml.YAMLError as exc:
        raise ClusterError(f"{where}: malformed YAML/JSON: {exc}") from None
    lines: dict[JsonPath, int] = {}
    if root is not None:
        _index_lines(root, (), lines, where)
    return Document(data=data, where=where, lines=lines)


def read_document(path: Path) -> Document:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ClusterError(f"{path}: no such file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ClusterError(f"{path}: cannot be read ({exc})") from None
    return parse_text(text, str(path))


# --------------------------------------------------------------------------------------------- validation

_TYPES: dict[str, tuple[type, ...]] = {
    "object": (dict,), "array": (list,), "string": (str,), "number": (int, float), "integer": (int,),
    "boolean": (bool,),
}


def _type_ok(value: Any, type_name: str) -> bool:
    if isinstance(value, bool) and type_name in ("number", "integer"):
        return False
    return isinstance(value, _TYPES[type_name])


def _describe(value: Any) -> str:
    if value is None:
        return "empty"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return f"{value!r}"
    if isinstance(value, str):
        # an error message quotes the start of a text, never a whole file (a device_file pointing at the
        # wrong file parses as one long string)
        shown = value if len(value) <= QUOTE_CHARS else value[:QUOTE_CHARS] + "..."
        return f"the text {shown!r}"
    return {dict: "a mapping", list: "a list"}.get(type(value), type(value).__name__)


def _field(path: JsonPath) -> str:
    if not path:
        return "the document"
    text = ""
    for part in path:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return f"'{text}'"


def _resolve(schema: dict[str, Any], root: dict[str, Any]) -> dict[str, Any]:
    while "$ref" in schema:
        ref = schema["$ref"]
        target: Any = root
        for part in ref.lstrip("#/").split("/"):
            target = target[part]
        schema = target
    return schema


Error = tuple[JsonPath, str] | None


def _first_error(value: Any, schema: dict[str, Any], root: dict[str, Any], path: JsonPath) -> Error:
    """The first violation as (path, message), or None."""
    schema = _resolve(schema, root)
    if "oneOf" in schema:
        error = _one_of(value, schema, root, path)
        if error:
            return error
    type_name = schema.get("type")
    if type_name and not _type_ok(value, type_name):
        article = "an" if type_name[0] in "aeiou" else "a"
        return path, f"{_field(path)} must be {article} {type_name}, got {_describe(value)}"
    if "enum" in schema and value not in schema["enum"]:
        return path, f"{_field(path)} must be one of {', '.join(map(str, schema['enum']))}; got {value!r}"
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if "exclusiveMinimum" in schema and not value > schema["exclusiveMinimum"]:
            return path, f"{_field(path)} must be greater than {schema['exclusiveMinimum']}, got {value!r}"
        if "minimum" in schema and not value >= schema["minimum"]:
            return path, f"{_field(path)} must be at least {schema['minimum']}, got {value!r}"
        if "maximum" in schema and not value <= schema["maximum"]:
            return path, f"{_field(path)} must be at most {schema['maximum']}, got {value!r}"
    if isinstance(value, str) and len(value) < schema.get("minLength", 0):
        return path, f"{_field(path)} must not be empty"
    if isinstance(value, dict):
        return _object_error(value, schema, root, path)
    if isinstance(value, list):
        return _array_error(value, schema, root, path)
    return None


def _one_of(value: Any, schema: dict[str, Any], root: dict[str, Any], path: JsonPath) -> Error:
    branches = [_resolve(b, root) for b in schema["oneOf"]]
    if all(set(b) == {"required"} for b in branches):  # "exactly one of these keys"
        keys = [b["required"][0] for b in branches]
        present = [k for k in keys if isinstance(value, dict) and k in value]
        if len(present) == 1 or not isinstance(value, dict):
            return None
        if not present:
            return path, f"{_field(path)} needs one of: {', '.join(keys)}"
        return path, f"{_field(path)} must give only one of: {', '.join(present)}"
    typed = [b for b in branches if "type" in b and _type_ok(value, b["type"])]
    if not typed:
        kinds = " or ".join(b.get("type", "?") for b in branches)
        return path, f"{_field(path)} must be {kinds}, got {_describe(value)}"
    return _first_error(value, typed[0], root, path)


def _object_error(value: dict, schema: dict[str, Any], root: dict[str, Any], path: JsonPath) -> Error:
    properties: dict[str, Any] = schema.get("properties", {})
    for key in value:
        if not isinstance(key, str):
            return path, f"{_field(path)} has a non-text key {key!r}"
        if key not in properties and schema.get("additionalProperties") is False:
            close = get_close_matches(key, sorted(properties), n=3, cutoff=0.5)
            known = ", ".join(sorted(properties))
            hint = f" (did you mean {', '.join(close)}?)" if close else f" (known keys: {known})"
            return path + (key,), f"{_field(path)} has an unknown key {key!r}{hint}"
    for key in schema.get("required", []):
        if key not in value:
            return path, f"{_field(path)} is missing the required field {key!r}"
    if len(value) < schema.get("minProperties", 0):
        return path, f"{_field(path)} must not be empty"
    extra = schema.get("additionalProperties")
    for key, item in value.items():
        sub = properties.get(key, extra if isinstance(extra, dict) else None)
        if sub is not None:
            error = _first_error(item, sub, root, path + (key,))
            if error:
                return error
    return None


def _array_error(value: list, schema: dict[str, Any], root: dict[str, Any], path: JsonPath) -> Error:
    if len(value) < schema.get("minItems", 0):
        return path, f"{_field(path)} needs at least {schema['minItems']} item(s), got {len(value)}"
    if "maxItems" in schema and len(value) > schema["maxItems"]:
        return path, f"{_field(path)} takes at most {schema['maxItems']} items, got {len(value)}"
    prefix = schema.get("prefixItems", [])
    for i, item in enumerate(value):
        sub = prefix[i] if i < len(prefix) else schema.get("items")
        if sub is not None:
            error = _first_error(item, sub, root, path + (i,))
            if error:
                return error
    return None


def check(document: Document, schema_name: str, base: JsonPath = ()) -> None:
    """Raise ClusterError (``file:line: message``) at the first violation of the named schema."""
    schema = load_schema(schema_name)
    value: Any = document.data
    for part in base:
        value = value[part]
    error = _first_error(value, schema, schema, base)
    if error:
        path, message = error
        raise ClusterError(f"{document.at(path)}: {message}")
