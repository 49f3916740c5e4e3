"""Read an embedding-table file (the ``--tables`` format).

Accepted shapes (JSON or YAML):

* ``{"tables": [{"name", "rows", "dim", "pooling_factor"}, ...]}``, optionally with ``dense_features``,
  ``bottom_mlp`` and ``top_mlp`` beside ``tables`` (an entry of ``reference/embedding_workloads.json``);
* ``{"workloads": [entry, ...]}`` (that whole file), from which ``workload`` picks one entry by name.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from typing import Any

from planner.errors import ConfigError, suggest
from planner.types import EmbeddingTable


@dataclass(frozen=True)
class TablesSpec:
    """The tables of one workload and the dense-network sizes the file gives (None where it gives none)."""

    tables: tuple[EmbeddingTable, ...]
    dense_features: int | None = None
    bottom_mlp: tuple[int, ...] | None = None
    top_mlp: tuple[int, ...] | None = None


def _read(path: str) -> Any:
    if not os.path.isfile(path):
        raise ConfigError(f"tables file '{path}' does not exist; give a JSON/YAML file "
                          '{"tables": [{"name", "rows", "dim", "pooling_factor"}]}')
    with open(path, encoding="utf-8") as handle:
        text = handle.read()
    if path.lower().endswith(".json"):
        try:
            return json.loads(text)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"tables file '{path}' is not valid JSON: {exc}") from None
    import yaml  # YAML is a superset of JSON, so any other extension goes through safe_load

    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"tables file '{path}' is not valid YAML/JSON: {' '.join(str(exc).split())}") from None


def _positive(path: str, where: str, field: str, value: Any, integral: bool) -> float:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > 0
    if ok and integral:
        ok = float(value).is_integer()
    if not ok:
        kind = "a positive integer" if integral else "a positive number"
        raise ConfigError(f"tables file '{path}': {where} field '{field}' = {value!r} must be {kind}")
    return value


def _int_list(path: str, field: str, value: Any) -> tuple[int, ...] | None:
    if value is None:
        return None
    if not isinstance(value, list) or not value:
        raise ConfigError(f"tables file '{path}': field '{field}' must be a non-empty list of integers")
    return tuple(int(_positive(path, field, field, item, True)) for item in value)


def _table(path: str, index: int, entry: Any) -> EmbeddingTable:
    where = f"tables[{index}]"
    if not isinstance(entry, dict):
        raise ConfigError(f"tables file '{path}': {where} must be a mapping with name, rows, dim, pooling_factor")
    missing = [field for field in ("name", "rows", "dim") if field not in entry]
    if missing:
        raise ConfigError(f"tables file '{path}': {where} lacks field(s) {', '.join(missing)}")
    name = entry["name"]
    if not isinstance(name, str) or not name:
        raise ConfigError(f"tables file '{path}': {where} field 'name' must be a non-empty string")
    return EmbeddingTable(
        name=name,
        rows=int(_positive(path, where, "rows", entry["rows"], True)),
        dim=int(_positive(path, where, "dim", entry["dim"], True)),
        pooling_factor=float(_positive(path, where, "pooling_factor", entry.get("pooling_factor", 1), False)),
    )


def load_tables(path: str, workload: str | None = None) -> TablesSpec:
    """Parse ``path``; ``workload`` names the entry to use when the file lists several ``workloads``."""
    document = _read(path)
    if isinstance(document, dict) and "workloads" in document:
        entries = document["workloads"] if isinstance(document["workloads"], list) else []
        names = [entry.get("name") for entry in entries if isinstance(entry, dict)]
        if workload is None:
            raise ConfigError(f"tables file '{path}' lists several workloads; pick one with --workload NAME "
                              f"('planner models build': --set workload=NAME), one of: "
                              f"{', '.join(str(n) for n in names)}")
        if workload not in names:
            raise ConfigError(f"tables file '{path}' has no workload '{workload}'{suggest(workload, names)}; "
                              f"known: {', '.join(str(n) for n in names)}")
        document = entries[names.index(workload)]
    elif workload is not None:
        raise ConfigError(f"workload='{workload}' given but tables file '{path}' has no 'workloads' list")
    if not isinstance(document, dict) or not isinstance(document.get("tables"), list) or not document["tables"]:
        raise ConfigError(f"tables file '{path}' must hold a non-empty list under 'tables' "
                          '({"tables": [{"name", "rows", "dim", "pooling_factor"}]})')
    tables = tuple(_table(path, i, entry) for i, entry in enumerate(document["tables"]))
    seen: set[str] = set()
    for table in tables:
        if table.name in seen:
            raise ConfigError(f"tables file '{path}': table name '{table.name}' appears twice; names must be unique")
        seen.add(table.name)
    dense = document.get("dense_features")
    return TablesSpec(
        tables=tables,
        dense_features=None if dense is None else int(_positive(path, "the file", "dense_features", dense, True)),
        bottom_mlp=_int_list(path, "bottom_mlp", document.get("bottom_mlp")),
        top_mlp=_int_list(path, "top_mlp", document.get("top_mlp")),
    )
