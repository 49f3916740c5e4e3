"""Builder keys: declared once per family, validated by one function that writes every error message.

A :class:`Key` says a setting's name, kind, default and range; :func:`resolve` turns user settings (strings
from ``--set KEY=VALUE`` or Python values) into a complete, checked ``dict`` of the family's keys, raising
:class:`~planner.errors.ConfigError` that names the key at fault and what is valid.

Every number key has a maximum: a builder's time and file size grow with its keys (a block per layer, a
position table of ``seq_len`` rows), and the importer refuses tensors past its own limits as corrupted. The
maxima are far above any published model, and :func:`check_elements` lets a family's cross-key check refuse
a combination whose largest tensor the importer would refuse, before anything is built.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Mapping, Union

from planner.errors import ConfigError, suggest
from planner.graph.validate import MAX_BOUND_TENSOR_ELEMENTS, MAX_INPUT_DIM, MAX_TENSOR_ELEMENTS

if TYPE_CHECKING:
    import onnx

Value = Union[int, float, str, tuple[int, ...]]

# kinds of key values
INT = "int"
FLOAT = "float"
STR = "str"
INT_LIST = "int list"
FILE = "file"

# the importer's limits, which a built model must stay within: one axis of a data input (so the largest
# seq_len), one weight's elements, and one activation's elements for one sample
MAX_SEQ_LEN = MAX_INPUT_DIM
MAX_WEIGHT_ELEMENTS = MAX_TENSOR_ELEMENTS
MAX_ACTIVATION_ELEMENTS = MAX_BOUND_TENSOR_ELEMENTS

# the largest sizes a builder takes, each far beyond published models (whose deepest stacks have about 100
# blocks, widest hidden sizes about 2**14, vocabularies about 2**18 and MoE layers a few hundred experts)
MAX_LAYERS = 1024
MAX_HIDDEN = 2**17  # also the largest low rank of a projection (mla's q_lora_rank, kv_lora_rank)
MAX_HEADS = 1024
MAX_HEAD_DIM = 4096
MAX_FFN = 2**20  # an MLP's (or one expert's) inner width
MAX_VOCAB = 2**22  # also the largest token-type vocabulary
MAX_EXPERTS = 4096  # routed experts per layer; also the most shared experts and the largest top_k


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
    max_items: int | None = None  # the longest INT_LIST

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
        bounds = [text for text in ("" if self.minimum is None else f">= {_number_text(self.minimum)}",
                                    "" if self.maximum is None else f"<= {_number_text(self.maximum)}") if text]
        bound = " and ".join(bounds)
        if self.kind == INT_LIST:
            count = "" if self.max_items is None else f"up to {self.max_items} "
            return f"a comma list of {count}integers" + (f", each {bound}" if bound else "")
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


def _number_text(number: float) -> str:
    """A bound as written in a message: whole numbers in full (4194304, not 4.19e+06)."""
    return str(int(number)) if float(number).is_integer() else f"{number:g}"


def check_elements(family: str, what: str, elements: int, limit: int, fix: str) -> None:
    """Raise a ConfigError when the tensor ``what`` of a model about to be built would hold more than
    ``limit`` elements (:data:`MAX_WEIGHT_ELEMENTS` or :data:`MAX_ACTIVATION_ELEMENTS`), which the importer
    would refuse; ``fix`` names the keys to lower."""
    if elements > limit:
        raise ConfigError(f"{family}: {what} would hold {elements:,} elements, over the {limit:,} the model "
                          f"importer accepts in one tensor; {fix}")


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
        if not math.isfinite(value):  # nan passes every comparison, inf is no setting
            raise _range_error(family, key, raw)
        _in_range(family, key, value, raw)
        return value
    if key.kind == INT_LIST:
        items = raw.split(",") if isinstance(raw, str) else raw
        if not isinstance(items, (list, tuple)) or not items:
            raise _range_error(family, key, raw)
        if key.max_items is not None and len(items) > key.max_items:
            raise ConfigError(f"{family}: key '{key.name}' has {len(items)} items; expected {key.valid_text()}")
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
