"""Read an embedding-table file (the ``--tables`` format, ``planner/schemas/tables.schema.json``).

Accepted shapes (JSON or YAML):

* ``{"tables": [{"name", "rows", "dim", "pooling_factor"}, ...]}``, optionally with ``dense_features``,
  ``bottom_mlp`` and ``top_mlp`` beside ``tables`` (an entry of ``benchmarks/data/embedding_workloads.json``);
* ``{"workloads": [entry, ...]}`` (that whole file), from which ``workload`` picks one entry by name.

The file is read and checked by :mod:`planner.hardware.documents` (size, nesting, aliases, every number
finite and in its range), so a bad file is a ConfigError naming the file, the field and the accepted range.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from numbers import Integral
from typing import Any

from planner.errors import ConfigError, suggest
from planner.hardware.documents import Document, check, load_json, parse_text, read_input
from planner.types import EmbeddingTable

FORMAT = '{"tables": [{"name", "rows", "dim", "pooling_factor"}]}'


@dataclass(frozen=True)
class TablesSpec:
    """The tables of one workload and the dense-network sizes the file gives (None where it gives none)."""

    tables: tuple[EmbeddingTable, ...]
    dense_features: int | None = None
    bottom_mlp: tuple[int, ...] | None = None
    top_mlp: tuple[int, ...] | None = None
    interaction: str | None = None  # the feature interaction the file names, as written (e.g. "dcn(3 layers, ...)")


def _read(path: str) -> Document:
    """The file as a checked Document (a ``.json`` file is read as JSON, any other as YAML)."""
    if os.path.isdir(path):
        raise ConfigError(f"tables file '{path}' is a folder; give a JSON/YAML file {FORMAT}")
    if not os.path.isfile(path):
        what = "is not a regular file" if os.path.exists(path) else "does not exist"
        raise ConfigError(f"tables file '{path}' {what}; give a JSON/YAML file {FORMAT}")
    text = read_input(path, ConfigError)
    if path.lower().endswith(".json"):
        document = Document(data=load_json(text, path, ConfigError), where=path, lines={})
    else:
        document = parse_text(text, path, ConfigError)
    if not isinstance(document.data, dict):
        raise ConfigError(f"tables file '{path}' must be a mapping {FORMAT}")
    check(document, "tables", error=ConfigError)
    return document


def _table(entry: dict[str, Any], dtype_bytes: int = 4) -> EmbeddingTable:
    return EmbeddingTable(name=entry["name"], rows=int(entry["rows"]), dim=int(entry["dim"]),
                          pooling_factor=float(entry.get("pooling_factor", 1)), dtype_bytes=dtype_bytes)


def _check_unique(tables: tuple[EmbeddingTable, ...], where: str) -> None:
    seen: set[str] = set()
    for table in tables:
        if table.name in seen:
            raise ConfigError(f"{where}: table name '{table.name}' appears twice; names must be unique")
        seen.add(table.name)


def check_tables(tables: Any, where: str = "tables") -> tuple[EmbeddingTable, ...]:
    """EmbeddingTables given from Python, held to a table file's rules (the same schema, unique names) and
    a stored width (``dtype_bytes``) of 1 to 8 bytes; returned with integral sizes."""
    if isinstance(tables, (str, bytes, dict)) or not isinstance(tables, Iterable):
        raise ConfigError(f"{where}: got a {type(tables).__name__}; give a table file's path or a sequence of "
                          "planner.types.EmbeddingTable")
    items = tuple(tables)
    for i, table in enumerate(items):
        if not isinstance(table, EmbeddingTable):
            raise ConfigError(f"{where}[{i}]: got a {type(table).__name__}; give planner.types.EmbeddingTable("
                              "name=, rows=, dim=, pooling_factor=)")
        width = table.dtype_bytes
        if isinstance(width, bool) or not isinstance(width, Integral) or not 1 <= width <= 8:
            raise ConfigError(f"{where}[{i}] ('{table.name}'): dtype_bytes={width!r} must be an integer from 1 "
                              "to 8 (4 for fp32, 2 for fp16 or bf16)")
    entries = [{"name": t.name, "rows": _plain(t.rows), "dim": _plain(t.dim),
                "pooling_factor": _plain(t.pooling_factor)} for t in items]
    check(Document(data={"tables": entries}, where=where, lines={}), "tables", error=ConfigError)
    checked = tuple(_table(entry, int(t.dtype_bytes)) for entry, t in zip(entries, items))
    _check_unique(checked, where)
    return checked


def _plain(value: Any) -> Any:
    """A numpy scalar as the Python number the schema checks (any other value as it is)."""
    return value.item() if hasattr(value, "item") and not isinstance(value, (str, bytes)) else value


def _widths(value: list[Any] | None) -> tuple[int, ...] | None:
    return None if value is None else tuple(int(width) for width in value)


def load_tables(path: str, workload: str | None = None) -> TablesSpec:
    """Parse ``path``; ``workload`` names the entry to use when the file lists several ``workloads``."""
    entry: dict[str, Any] = _read(path).data
    if "workloads" in entry:
        names = [item["name"] for item in entry["workloads"]]
        if workload is None:
            raise ConfigError(f"tables file '{path}' lists several workloads; pick one with --workload NAME "
                              f"('planner models build': --set workload=NAME), one of: {', '.join(names)}")
        if workload not in names:
            raise ConfigError(f"tables file '{path}' has no workload '{workload}'{suggest(workload, names)}; "
                              f"known: {', '.join(names)}")
        entry = entry["workloads"][names.index(workload)]
    elif workload is not None:
        raise ConfigError(f"workload='{workload}' given but tables file '{path}' has no 'workloads' list")
    tables = tuple(_table(item) for item in entry["tables"])
    _check_unique(tables, f"tables file '{path}'")
    dense = entry.get("dense_features")
    interaction = entry.get("interaction")
    return TablesSpec(tables=tables, dense_features=None if dense is None else int(dense),
                      bottom_mlp=_widths(entry.get("bottom_mlp")), top_mlp=_widths(entry.get("top_mlp")),
                      interaction=None if interaction is None else str(interaction))
