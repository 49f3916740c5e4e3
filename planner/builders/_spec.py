"""Builder keys: declared once per family, validated by one function that writes every error message.

A :class:`Key` says a setting's name, kind, default and range; :func:`resolve` turns user settings (strings
from ``--set KEY=VALUE`` or Python values) into a complete, checked ``dict`` of the family's keys, raising
:class:`~planner.errors.ConfigError` that names the key at fault and what is valid.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Mapping, Union

from planner.errors import ConfigError, suggest

if TYPE_CHECKING:
    import onnx

Value = Union[int, float, str, tuple[int, ...]]

# kinds of key values
INT = "int"
FLOAT = "float"
STR = "str"
INT_LIST = "int list"
FILE = "file"


@dataclass(frozen=True)
class Key:
    """One builder setting. ``default`` None with ``default_text`` means "derived from other keys";
    ``default`` None without it means "optional, absent unless given"."""

    name: str
    kind: str
    help: str
    default: Value | None = None
    default_text: str = ""
    minimum: float | None = None
    maximum: float | None = None
    choices: tuple[str, ...] = ()
    required: bool = False

    def describe_default(self) -> str:
        if self.required:
            return "(required)"
        if self.default_text:
            return self.default_text
        if self.default is None:
            return "(none)"
        if isinstance(self.default, tuple):
            return ",".join(str(v) for v in self.default)
        return str(self.default)

    def valid_text(self) -> str:
        if self.choices:
            return "one of " + ", ".join(self.choices)
        bounds = [text for text in ("" if self.minimum is None else f">= {self.minimum:g}",
                                    "" if self.maximum is None else f"<= {self.maximum:g}") if text]
        bound = " and ".join(bounds)
        if self.kind == INT_LIST:
            return "a comma list of integers" + (f", each {bound}" if bound else "")
        what = {INT: "an integer", FLOAT: "a number", STR: "a name", FILE: "a file path"}[self.kind]
        return f"{what} {bound}" if bound else what


@dataclass(frozen=True)
class Family:
    """A model family: its keys and the function that builds a resolved configuration."""

    name: str
    description: str
    keys: tuple[Key, ...]
    build: Callable[[Mapping[str, Value], str], "onnx.ModelProto"]  # (resolved settings, weights file name)
    check: Callable[[dict[str, Value]], None] | None = None  # cross-key checks and derived defaults

    def key(self, name: str) -> Key:
        for key in self.keys:
            if key.name == name:
                return key
        raise KeyError(name)


def _range_error(family: str, key: Key, raw: object) -> ConfigError:
    return ConfigError(f"{family}: key '{key.name}' = {raw!r} is invalid; expected {key.valid_text()}")


def _in_range(family: str, key: Key, number: float, raw: object) -> None:
    if (key.minimum is not None and number < key.minimum) or (key.maximum is not None and number > key.maximum):
        raise _range_error(family, key, raw)


def _parse_int(family: str, key: Key, raw: object) -> int:
    if isinstance(raw, bool):
        raise _range_error(family, key, raw)
    if isinstance(raw, int):
        value = raw
    elif isinstance(raw, float) and raw.is_integer():
        value = int(raw)
    elif isinstance(raw, str):
        try:
            value = int(raw.strip().replace("_", ""))
        except ValueError:
            raise _range_error(family, key, raw) from None
    else:
        raise _range_error(family, key, raw)
    _in_range(family, key, value, raw)
    return value


def _parse_value(family: str, key: Key, raw: object) -> Value:
    if key.kind == INT:
        return _parse_int(family, key, raw)
    if key.kind == FLOAT:
        try:
            value = float(raw)  # type: ignore[arg-type]
        except (TypeError, ValueError):
            raise _range_error(family, key, raw) from None
        _in_range(family, key, value, raw)
        return value
    if key.kind == INT_LIST:
        items = raw.split(",") if isinstance(raw, str) else raw
        if not isinstance(items, (list, tuple)) or not items:
            raise _range_error(family, key, raw)
        return tuple(_parse_int(family, key, item) for item in items)
    if not isinstance(raw, str) or not raw.strip():
        raise _range_error(family, key, raw)
    if key.choices and raw not in key.choices:
        raise ConfigError(f"{family}: key '{key.name}' = {raw!r} is invalid; expected {key.valid_text()}"
                          f"{suggest(raw, key.choices)}")
    return raw


def resolve(family: Family, settings: Mapping[str, object]) -> dict[str, Value]:
    """Every key of ``family`` with a checked value: the user's where given, else the default."""
    valid = [key.name for key in family.keys]
    for name in settings:
        if name not in valid:
            raise ConfigError(f"{family.name}: unknown key '{name}'{suggest(str(name), valid)}; "
                              f"valid keys: {', '.join(valid)}")
    resolved: dict[str, Value] = {}
    for key in family.keys:
        if key.name in settings:
            resolved[key.name] = _parse_value(family.name, key, settings[key.name])
        elif key.required:
            raise ConfigError(f"{family.name}: key '{key.name}' is required ({key.help}); "
                              f"give it as --set {key.name}=...")
        elif key.default is not None:
            resolved[key.name] = key.default
    if family.check is not None:
        family.check(resolved)
    return resolved
