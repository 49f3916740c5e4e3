"""Reading YAML/JSON input documents safely and checking them against their JSON Schema, with line numbers.

Every YAML/JSON file the planner reads (cluster files, device and node profiles, table files, plan files)
goes through :func:`read_input` and :func:`load_yaml` / :func:`load_json`: the file's size is checked before
it is read, YAML aliases are refused (a few hundred bytes of nested aliases expand to billions of nodes) and
nesting is capped, so a hostile or broken file is answered in a second, never after minutes.

One validator writes every message: :func:`check` interprets the small subset of JSON Schema our schemas
use (``type``, ``properties``, ``required``, ``additionalProperties``, ``items``/``prefixItems``,
``minItems``/``maxItems``, ``minimum``/``exclusiveMinimum``/``maximum``, ``enum``, ``minLength``,
``minProperties``, ``oneOf``, local ``$ref``) plus ``x-range``: the name of one of the physical limits below,
which :func:`load_schema` turns into ``minimum`` and ``maximum``. Every number must be finite. The schemas
ship in ``planner/schemas/`` and are the published description of the formats; tests check the examples
against them with ``jsonschema`` too.
"""

from __future__ import annotations

import json
import math
import os
import re
import sys
from dataclasses import dataclass
from difflib import get_close_matches
from functools import lru_cache
from pathlib import Path
from typing import Any

import yaml

from planner.errors import ClusterError, PlannerError

SCHEMA_DIR = Path(__file__).resolve().parent.parent / "schemas"
QUOTE_CHARS = 60  # how much of a wrong text value an error message quotes

# ------------------------------------------------------------------------------------ input limits
# libyaml builds about 150,000 nodes a second on a busy 2-core machine and the checks walk them again, so
# 256 KiB (at worst about 130,000 nodes) keeps any YAML input under two seconds; hand-written cluster
# files and profiles are a few KB, a `planner profile --model` profile some tens.
MAX_YAML_BYTES = 256 << 10
# JSON (table files, other JSON inputs) parses at 100 MB/s when it holds numbers, but builds only about 1.5
# million lists or mappings a second: 4 MiB (at worst 1.4 million of them) keeps it under two seconds and
# holds the stages of a plan for a hundred thousand devices.
MAX_JSON_BYTES = 4 << 20
# A plan file lists every embedding shard (about 200 bytes each as Plan.to_json writes it), one per device of a
# data-parallel or row-wise table: thousands of tables on a thousand devices write hundreds of MiB, which the
# planner must read back. 1 GiB holds five million shards (a few minutes to read and check).
MAX_PLAN_JSON_BYTES = 1 << 30
# No format of ours nests deeper than 6 levels (a table of a workload of a table file: workloads[0].tables
# [0].rows); 32 leaves room for free-form records and stops pathological nesting before any recursion.
MAX_NESTING_DEPTH = 32

# ---------------------------------------------------------------------------------- physical limits
# Generous bounds on the numbers of a hardware, table or plan file: wider than any machine built or
# announced, narrow enough that no product or quotient the cost model forms overflows a float. A schema
# field names one by ``"x-range": "NAME"``; the value is (lowest, highest), both accepted (for a list: its
# length).
RANGES: dict[str, tuple[float, float]] = {
    # 1 MB/s (below 10 Mb/s Ethernet) .. 100 TB/s (over 100x NVLink 5's 900 GB/s per GPU)
    "link_bandwidth_GBps": (1e-3, 1e5),
    # up to one second per communication step: over 10x an intercontinental round trip
    "latency_us": (0.0, 1e6),
    # an achieved fraction of a peak; a millionth is already no longer a useful device
    "efficiency": (1e-6, 1.0),
    # 1 byte .. 1 PiB of memory on one device (an H200 has 141 GB)
    "memory_bytes": (1, 2**50),
    # 1 MB/s .. 1 PB/s device memory bandwidth (over 100x HBM3e's 8 TB/s)
    "memory_bandwidth_Bps": (1e6, 1e15),
    # 1 MFLOP/s .. 10 EFLOP/s on one device (over 100x a GB200 GPU's dense FP4)
    "flops_per_s": (1e6, 1e19),
    # the size axis of an efficiency curve (a GEMM's FLOPs, an op's bytes): up to 10^21
    "curve_size": (1.0, 1e21),
    # fixed cost of launching one op: up to a second
    "op_overhead_s": (0.0, 1.0),
    # nodes of one group: 10^6 is 100x the largest supercomputer's (Frontier: 9,408 nodes)
    "nodes": (1, 10**6),
    # devices of one node: a whole 576-GPU NVLink domain counted as one node fits
    "devices_per_node": (1, 1024),
    # one NIC per GPU of a whole NVLink domain counted as one node (GB200 NVL72: 72 ConnectX-7)
    "nics_per_node": (1, 1024),
    # a node's system memory: 100 TB is 25x the largest DGX option (DGX B200, 4 TB)
    "host_memory_GB": (1, 1e5),
    # an NVIDIA GPU's compute capability (major.minor): 3.0 (Kepler) .. 99.9
    "compute_capability": (3.0, 99.9),
    # US dollars per node-hour: a DGX node rents for about 100
    "price_per_node_hour": (0.0, 1e6),
    # network oversubscription ratio, 1 = full bisection; 1000:1 is already no network for training
    "oversubscription": (1.0, 1e3),
    # embedding-table rows: the largest production tables hold about 10^10
    "table_rows": (1, 10**12),
    # embedding width: 65,536 columns, over 100x any published model's
    "table_dim": (1, 2**16),
    # lookups of one table per sample (multi-hot features reach thousands)
    "pooling_factor": (1e-6, 1e6),
    # dense features and MLP layer widths, and the layers of one MLP
    "dense_width": (1, 10**6),
    "mlp_layers": (1, 1000),
    # list lengths: groups of a cluster, points of an efficiency curve, tables of a table file
    "groups": (1, 1024),
    "curve_points": (1, 10**4),
    "tables": (1, 10**5),
    # a plan's device ids and counts of devices, layers, stages and samples: 1024 groups x 10^6 nodes x
    # 1024 devices is below 2^40
    "plan_count": (0, 2**40),
    # seconds in a plan: 10^18 s is longer than the age of the universe (4 x 10^17 s)
    "plan_seconds": (0.0, 1e18),
    # bytes in a plan (per device, or a model's): 2^70 is a thousand times 1 EiB
    "plan_bytes": (0.0, 2.0**70),
    # a plan's parameter and FLOP counts, candidates and samples per second: 10^30 is 10^6 times GPT-3's
    # 3 x 10^23 training FLOPs
    "plan_quantity": (0.0, 1e30),
}

JsonPath = tuple[object, ...]


def expand_ranges(schema: Any) -> Any:
    """``schema`` with every ``"x-range": NAME`` also written as the standard keywords it stands for."""
    if isinstance(schema, list):
        return [expand_ranges(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    out = {key: expand_ranges(value) for key, value in schema.items()}
    if "x-range" in out:
        low, high = RANGES[out["x-range"]]
        lowest, highest = ("minItems", "maxItems") if out.get("type") == "array" else ("minimum", "maximum")
        out[lowest] = max(out.get(lowest, low), low)  # a field's own bounds stay where they are tighter
        out[highest] = min(out.get(highest, high), high)
    return out


@lru_cache(maxsize=None)
def _schema(name: str) -> dict[str, Any]:
    with open(SCHEMA_DIR / f"{name}.schema.json", encoding="utf-8") as fh:
        return expand_ranges(json.load(fh))


def load_schema(name: str) -> dict[str, Any]:
    """``name`` is ``cluster``, ``device``, ``node`` or ``tables``, its ``x-range`` keywords expanded (a copy
    is not made: do not change it)."""
    return _schema(name)


# ----------------------------------------------------------------------------------------- reading

def _size_text(size: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if size >= scale:
            return f"{size / scale:.1f} {unit}".replace(".0 ", " ")
    return f"{size} bytes"


def _kind(file: Path, max_bytes: int) -> str:
    return "JSON" if file.suffix.lower() == ".json" and max_bytes in (MAX_JSON_BYTES, MAX_PLAN_JSON_BYTES) \
        else "YAML/JSON"


def read_input(path: str | os.PathLike, error: type[PlannerError] = ClusterError,
               max_bytes: int | None = None) -> str:
    """The text of an input file, its size checked before it is read (the limit: :data:`MAX_YAML_BYTES`
    for YAML, :data:`MAX_JSON_BYTES` for a ``.json`` file, or ``max_bytes``)."""
    file = Path(path)
    if max_bytes is None:
        max_bytes = MAX_JSON_BYTES if file.suffix.lower() == ".json" else MAX_YAML_BYTES
    try:
        size = os.stat(file).st_size
        if not file.is_file():
            raise error(f"{file}: is not a file; give a YAML/JSON file")
        if size > max_bytes:
            raise error(f"{file}: the file is {_size_text(size)}, over the limit of {_size_text(max_bytes)} "
                        f"for a {_kind(file, max_bytes)} input file; check that it is the file meant")
        with open(file, encoding="utf-8") as handle:
            text = handle.read(max_bytes + 1)
    except FileNotFoundError:
        raise error(f"{file}: no such file") from None
    except UnicodeDecodeError:
        raise error(f"{file}: is not a UTF-8 text file (a binary file such as an ONNX model?); give a YAML/JSON "
                    "file") from None
    except OSError as exc:
        raise error(f"{file}: cannot be read ({exc})") from None
    if len(text) > max_bytes:  # the file grew while it was read
        raise error(f"{file}: over the limit of {_size_text(max_bytes)} for a {_kind(file, max_bytes)} input file")
    return text


class _Loader(yaml.SafeLoader):
    """The pure-Python safe loader (used where libyaml is missing) with aliases refused and nesting capped
    while it composes, before its recursion could run deep."""

    depth = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            raise yaml.composer.ComposerError(None, None, _ALIAS_PROBLEM, event.start_mark)
        self.depth += 1
        try:
            if self.depth > MAX_NESTING_DEPTH:
                raise yaml.composer.ComposerError(None, None, _DEPTH_PROBLEM, self.peek_event().start_mark)
            return super().compose_node(parent, index)
        finally:
            self.depth -= 1


_ALIAS_PROBLEM = "anchors and aliases (&name, *name) are not accepted; write each value out in full"
_DEPTH_PROBLEM = f"nested deeper than {MAX_NESTING_DEPTH} levels"
_TOO_LONG = (f"a number in the file has over {sys.get_int_max_str_digits()} digits; no field accepts one that "
             "large (see the field's range)")


def _value_problem(exc: ValueError) -> str:
    """What a ValueError raised while building the file's values means for the user."""
    if "digits" in str(exc):  # int(): "Exceeds the limit (4300 digits) for integer string conversion"
        return _TOO_LONG
    return f"a value cannot be read ({exc}); write it as plain text or a number"


# libyaml composes in C (and stops at 1000 levels itself); aliases and depth are then checked on the nodes
_FAST_LOADER = getattr(yaml, "CSafeLoader", None)


def _malformed(exc: yaml.YAMLError, where: str, error: type[PlannerError]) -> PlannerError:
    """The error for text YAML cannot parse: where, what the parser says and, for a syntax error (not one of
    the refusals that say their own fix), where to fix it."""
    if isinstance(exc, yaml.MarkedYAMLError):
        mark = exc.problem_mark or exc.context_mark
        line = f":{mark.line + 1}" if mark is not None else ""
        problem = exc.problem or exc.context or "malformed"
        # the parser marks where it noticed the error, often after it (an unclosed bracket: at the end)
        fix = "" if problem in (_ALIAS_PROBLEM, _DEPTH_PROBLEM) else "; fix the syntax at or before that line"
        return error(f"{where}{line}: malformed YAML/JSON: {problem}{fix}")
    return error(f"{where}: malformed YAML/JSON: {exc}")


def _check_keys(node: yaml.MappingNode, where: str, error: type[PlannerError]) -> None:
    """Refuse a key that is not plain text and a key given twice in one mapping (YAML would silently keep the
    last one, Python's json too)."""
    keys: set[str] = set()
    for key_node, _ in node.value:
        key_line = key_node.start_mark.line + 1
        if not isinstance(key_node, yaml.ScalarNode):
            raise error(f"{where}:{key_line}: a key must be plain text, not a list or a mapping")
        if key_node.value in keys:
            raise error(f"{where}:{key_line}: {_repeated(key_node.value)}")
        keys.add(key_node.value)


def _repeated(key: str) -> str:
    return f"the key {key[:QUOTE_CHARS]!r} appears twice; keep one"


_YAML_INT = "tag:yaml.org,2002:int"
_YAML_FLOAT = "tag:yaml.org,2002:float"
_DECIMAL = re.compile(r"[-+]?(0|[1-9][0-9]*)")


def _check_number(node: yaml.Node, where: str, error: type[PlannerError]) -> None:
    """Refuse a number YAML 1.1 reads other than as written in decimal: ``010`` is octal 8, ``0x10`` 16,
    ``1:30`` (base 60) 90, ``1:30.5`` 90.5 and ``1_000`` 1000, which a cluster file's count or bandwidth would
    take silently."""
    if not isinstance(node, yaml.ScalarNode) or node.style:
        return
    other_base = (node.tag == _YAML_INT and not _DECIMAL.fullmatch(node.value)) \
        or (node.tag == _YAML_FLOAT and ":" in node.value)
    if other_base:
        raise error(f"{where}:{node.start_mark.line + 1}: the number {node.value[:QUOTE_CHARS]!r} is not plain "
                    "decimal (YAML reads 010 as 8, 0x10 as 16, 1:30 as 90); write it in decimal without leading "
                    "zeros, colons or underscores")


def _check_nodes(root: yaml.Node, where: str, error: type[PlannerError]) -> None:
    """Refuse a node reached twice (an alias), nesting deeper than MAX_NESTING_DEPTH and the keys
    :func:`_check_keys` refuses, without recursion."""
    seen: set[int] = set()
    stack: list[tuple[yaml.Node, int]] = [(root, 0)]
    while stack:
        node, depth = stack.pop()
        line = node.start_mark.line + 1
        if id(node) in seen:
            raise error(f"{where}:{line}: malformed YAML/JSON: {_ALIAS_PROBLEM}")
        seen.add(id(node))
        if depth > MAX_NESTING_DEPTH:
            raise error(f"{where}:{line}: malformed YAML/JSON: {_DEPTH_PROBLEM}")
        _check_number(node, where, error)
        if isinstance(node, yaml.MappingNode):
            _check_keys(node, where, error)
            stack.extend((part, depth + 1) for pair in node.value for part in pair)
        elif isinstance(node, yaml.SequenceNode):
            stack.extend((item, depth + 1) for item in node.value)


def load_yaml(text: str, where: str, error: type[PlannerError] = ClusterError,
              lines: dict[JsonPath, int] | None = None) -> tuple[Any, yaml.Node | None]:
    """Parse YAML (JSON is YAML) safely: ``(data, root node)``, and into ``lines`` (when given) the line of
    every value by its path. Aliases, nesting deeper than :data:`MAX_NESTING_DEPTH` and malformed text raise
    ``error`` naming the line; all is checked on the nodes before any Python value is built."""
    loader = (_FAST_LOADER or _Loader)(text)
    try:
        root = loader.get_single_node()
        if root is None:
            return None, None
        if lines is None:
            _check_nodes(root, where, error)
        else:
            _index_lines(root, (), lines, where, error, set())
        return loader.construct_document(root), root
    except yaml.YAMLError as exc:
        raise _malformed(exc, where, error) from None
    except ValueError as exc:  # a tagged value YAML cannot convert: an over-long integer, 2024-13-45
        raise error(f"{where}: {_value_problem(exc)}") from None
    finally:
        loader.dispose()


_JSON_STRING = re.compile(r'"(?:[^"\\]|\\.)*"')
_NOT_BRACKETS = bytes(set(range(256)) - set(b"[]{}"))  # (UTF-8 never puts these bytes inside a character)
_INNERMOST = re.compile(rb"\[\]|\{\}")


def _json_too_deep(text: str) -> bool:
    """Whether JSON text nests deeper than MAX_NESTING_DEPTH, found on the text before it is parsed: the
    brackets outside strings, innermost pairs removed once per level (each pass a regex over what is left)."""
    brackets = _JSON_STRING.sub("", text).encode("utf-8", "surrogatepass").translate(None, _NOT_BRACKETS)
    for _ in range(MAX_NESTING_DEPTH):
        if not brackets:
            return False
        brackets, count = _INNERMOST.subn(b"", brackets)
        if not count:
            return False  # unbalanced: the parser reports where
    return bool(brackets)


class _RepeatedKey(Exception):
    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.key = key


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object's mapping; a key given twice raises _RepeatedKey (json would keep the last one)."""
    mapping = dict(pairs)
    if len(mapping) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise _RepeatedKey(key)
            seen.add(key)
    return mapping


def _repeated_key_error(text: str, key: str, where: str, error: type[PlannerError]) -> PlannerError:
    """The error for ``key`` given twice in one object of JSON ``text``: as YAML reports it, with its line, where
    the text is small enough to compose as YAML (JSON is YAML) quickly and YAML reads it so."""
    root = None
    if len(text) <= MAX_YAML_BYTES:
        loader = (_FAST_LOADER or _Loader)(text)
        try:
            root = loader.get_single_node()
        except yaml.YAMLError:
            pass  # JSON that YAML reads otherwise: the message goes without its line
        finally:
            loader.dispose()
    if root is not None:
        try:
            _check_nodes(root, where, error)
        except PlannerError as exc:
            return exc
    return error(f"{where}: {_repeated(key)}")


def load_json(text: str, where: str, error: type[PlannerError] = ClusterError) -> Any:
    """Parse JSON: malformed text, a key given twice in one object and nesting deeper than
    :data:`MAX_NESTING_DEPTH` raise ``error``."""
    if _json_too_deep(text):
        raise error(f"{where}: malformed JSON: {_DEPTH_PROBLEM}")
    try:
        data = json.loads(text, object_pairs_hook=_unique_keys)
    except _RepeatedKey as exc:
        raise _repeated_key_error(text, exc.key, where, error) from None
    except json.JSONDecodeError as exc:
        # a file named .json is read as JSON: YAML in it fails here
        hint = " (a YAML file must be named .yaml or .yml)" if where.lower().endswith(".json") else ""
        raise error(f"{where}: not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg}); fix the syntax "
                    f"at that line{hint}") from None
    except RecursionError:
        raise error(f"{where}: malformed JSON: {_DEPTH_PROBLEM}") from None
    except ValueError as exc:  # an integer of more digits than Python converts
        raise error(f"{where}: {_value_problem(exc)}") from None
    return data


def non_finite(data: Any) -> tuple[JsonPath, float] | None:
    """The path and value of a number in ``data`` that is not finite (inf, nan), or None. One pass; a path
    is built per list or mapping, not per number."""
    if isinstance(data, float):
        return ((), data) if data - data != 0.0 else None
    stack: list[tuple[JsonPath, Any]] = [((), data)] if isinstance(data, (dict, list)) else []
    while stack:
        path, value = stack.pop()
        for key, item in (value.items() if isinstance(value, dict) else enumerate(value)):
            kind = type(item)
            if kind is float:
                if item - item != 0.0:  # inf - inf and nan - nan are nan
                    return path + (key,), item
            elif kind is dict or kind is list:
                stack.append((path + (key,), item))
    return None


def load_data(path: str | os.PathLike, error: type[PlannerError] = ClusterError) -> Any:
    """The data of a YAML/JSON file: a ``.json`` file is read as JSON, any other as YAML (both safely,
    size and nesting capped)."""
    text = read_input(path, error)
    if str(path).lower().endswith(".json"):
        return load_json(text, str(path), error)
    return load_yaml(text, str(path), error)[0]


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


def _index_lines(node: yaml.Node, path: JsonPath, out: dict[JsonPath, int], where: str,
                 error: type[PlannerError], seen: set[int]) -> None:
    """Record the line of every value; refuse aliases (a node reached twice), nesting deeper than
    MAX_NESTING_DEPTH (checked before recursing, so the recursion stays shallow), keys that are not text
    and repeated keys."""
    line = node.start_mark.line + 1
    if id(node) in seen:
        raise error(f"{where}:{line}: malformed YAML/JSON: {_ALIAS_PROBLEM}")
    seen.add(id(node))
    if len(path) > MAX_NESTING_DEPTH:
        raise error(f"{where}:{line}: malformed YAML/JSON: {_DEPTH_PROBLEM}")
    out[path] = line
    _check_number(node, where, error)
    if isinstance(node, yaml.MappingNode):
        _check_keys(node, where, error)
        for key_node, value_node in node.value:
            key = key_node.value
            _index_lines(value_node, path + (key,), out, where, error, seen)
            out[path + (key,)] = key_node.start_mark.line + 1  # a value's errors point at its key's line
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            _index_lines(item, path + (i,), out, where, error, seen)


def parse_text(text: str, where: str, error: type[PlannerError] = ClusterError) -> Document:
    """Parse YAML (JSON is YAML) safely (:func:`load_yaml`), with the line of every value."""
    lines: dict[JsonPath, int] = {}
    data, _ = load_yaml(text, where, error, lines)
    return Document(data=data, where=where, lines=lines)


def read_document(path: Path, error: type[PlannerError] = ClusterError) -> Document:
    """A YAML/JSON file as a Document (:func:`read_input`, then :func:`parse_text`). A ``.json`` file's
    values are read as JSON (where ``1e+20`` and ``Infinity`` are numbers, not texts as in YAML), its lines
    as YAML."""
    text = read_input(path, error, MAX_YAML_BYTES)
    if path.suffix.lower() != ".json":
        return parse_text(text, str(path), error)
    data = load_json(text, str(path), error)
    try:
        lines = parse_text(text, str(path), error).lines
    except PlannerError:  # JSON that YAML cannot read (a key over 1024 characters): messages go without lines
        lines = {}
    return Document(data=data, where=str(path), lines=lines)


# --------------------------------------------------------------------------------------------- validation

_TYPES: dict[str, tuple[type, ...]] = {
    "object": (dict,), "array": (list,), "string": (str,), "number": (int, float), "integer": (int,),
    "boolean": (bool,),
}


def _type_ok(value: Any, type_name: str) -> bool:
    if isinstance(value, bool) and type_name in ("number", "integer"):
        return False
    if type_name == "integer" and isinstance(value, float):  # JSON Schema: 4.0 is an integer, 2.5 is not
        return not math.isfinite(value) or value.is_integer()  # inf and nan: reported with the range
    return isinstance(value, _TYPES[type_name])


def _describe(value: Any) -> str:
    if value is None:
        return "empty"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return _number(value)
    if isinstance(value, str):
        # an error message quotes the start of a text, never a whole file (a device_file pointing at the
        # wrong file parses as one long string)
        shown = value if len(value) <= QUOTE_CHARS else value[:QUOTE_CHARS] + "..."
        return f"the text {shown!r}"
    return {dict: "a mapping", list: "a list"}.get(type(value), type(value).__name__)


_EXPONENT = re.compile(r"([-+]?[0-9]+)(?:\.([0-9]*))?([eE])([-+]?)([0-9]+)")
_RESOLVER = yaml.resolver.Resolver()  # the tags PyYAML gives plain (unquoted) scalars


def _yaml_number(value: float) -> str:
    """``value`` spelled so that YAML 1.1 reads it as a number: ``50``, ``0.0015``, ``1.0e-07`` (PyYAML takes an
    exponent only after a dot and with a sign, and Python's repr always writes the sign)."""
    if value.is_integer() and abs(value) < 1e16:
        return str(int(value))
    text = repr(value)
    mantissa, e, exponent = text.partition("e")
    return f"{mantissa}.0e{exponent}" if e and "." not in mantissa else text


def _number_text_hint(text: str) -> str:
    """For a text found where a number belongs: how to write it as a number when Python reads it as one (YAML
    1.1 reads ``5e1`` as text: it needs ``5.0e+1``; a quoted ``"50"`` is text too), else nothing."""
    text = text.strip()
    if len(text) > QUOTE_CHARS:
        return ""
    try:
        value = float(text)
    except ValueError:
        return ""
    if not math.isfinite(value):  # nan, inf: no number of a field's range
        return ""
    plain = _yaml_number(value)
    if _RESOLVER.resolve(yaml.ScalarNode, text, (True, False)) != "tag:yaml.org,2002:str":
        return f"; write {plain} without quotes"  # a number YAML reads, quoted
    exponent = _EXPONENT.fullmatch(text)
    if exponent is None:
        return f"; write {plain}"
    whole, fraction, e, sign, power = exponent.groups()
    spelled = f"{whole}.{fraction or '0'}{e}{sign or '+'}{power}"
    return f"; write {plain} (YAML reads {text} as text; {spelled} is a number)"


def _number(value: float) -> str:
    """A number as a message shows it: short, whatever its size (an integer of 4000 digits included)."""
    if isinstance(value, int) and abs(value) >= 10**16:
        return f"{float(value):g}" if value.bit_length() <= 1024 else "a number of over 300 digits"
    return f"{value:g}" if isinstance(value, float) else str(value)


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


def _span(schema: dict[str, Any]) -> str:
    """The bounds a number field accepts, e.g. ``" from 1 to 1000000"`` (empty without bounds)."""
    low, high, above = schema.get("minimum"), schema.get("maximum"), schema.get("exclusiveMinimum")
    if low is not None and above is not None:  # the tighter of the two lower bounds
        low, above = (low, None) if low > above else (None, above)
    if low is not None and high is not None:
        return f" from {_number(low)} to {_number(high)}"
    lower = f" greater than {_number(above)}" if above is not None else (
        f" at least {_number(low)}" if low is not None else "")
    if high is None:
        return lower
    return f"{lower} and at most {_number(high)}" if lower else f" at most {_number(high)}"


def _number_error(value: float, schema: dict[str, Any], path: JsonPath) -> Error:
    """A number outside the schema's bounds, or not finite: the message states the accepted range."""
    low, high, above = schema.get("minimum"), schema.get("maximum"), schema.get("exclusiveMinimum")
    finite = not isinstance(value, float) or math.isfinite(value)  # (isfinite of a 400-digit int overflows)
    if finite and (low is None or value >= low) and (high is None or value <= high) and (
            above is None or value > above):
        return None
    kind = "an integer" if schema.get("type") == "integer" else "a finite number"
    return path, f"{_field(path)} must be {kind}{_span(schema)}, got {_describe(value)}"


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
        numeric = type_name in ("number", "integer")
        span = _span(schema) if numeric else ""
        hint = _number_text_hint(value) if numeric and isinstance(value, str) else ""
        return path, f"{_field(path)} must be {article} {type_name}{span}, got {_describe(value)}{hint}"
    if "enum" in schema and value not in schema["enum"]:
        return path, f"{_field(path)} must be one of {', '.join(map(str, schema['enum']))}; got {_describe(value)}"
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        error = _number_error(value, schema, path)
        if error:
            return error
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
            return path + (key,), f"{_field(path)} has an unknown key {_describe(key)[len('the text '):]}{hint}"
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


def check(document: Document, schema_name: str, base: JsonPath = (), error: type[PlannerError] = ClusterError) -> None:
    """Raise ``error`` (``file:line: message``) at the first violation of the named schema."""
    schema = load_schema(schema_name)
    value: Any = document.data
    for part in base:
        value = value[part]
    found = _first_error(value, schema, schema, base)
    if found:
        path, message = found
        raise error(f"{document.at(path)}: {message}")
