"""Reading embedding-table statistics from a table file (``--tables FILE``).

The format is the one in CONTRACT.md: JSON or YAML ``{"tables": [{"name", "rows", "dim", "pooling_factor"}]}``,
the shape of ``reference/embedding_workloads.json`` entries (so a workload object from that file, with its
extra keys such as ``source`` or ``bottom_mlp``, is accepted as it is). ``dtype_bytes`` is optional (4, fp32).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from planner.errors import PlannerError
from planner.types import EmbeddingTable

_FIELDS = ("name", "rows", "dim", "pooling_factor", "dtype_bytes")


def load_tables(path: str | Path) -> tuple[EmbeddingTable, ...]:
    """The tables of a JSON/YAML table file, in file order. Bad files raise PlannerError naming the field."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise PlannerError(f"--tables {path}: no such file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise PlannerError(f"--tables {path}: cannot read the file ({exc})") from exc
    document = _parse(path, text)
    return tables_from_document(document, str(path))


def _parse(path: Path, text: str) -> Any:
    if path.suffix.lower() == ".json":
        try:
            return json.loads(text)
        except json.JSONDecodeError as exc:
            raise PlannerError(f"--tables {path}: not valid JSON (line {exc.lineno}, column {exc.colno}: "
                               f"{exc.msg})") from exc
    try:
        import yaml
    except ImportError:  # pragma: no cover - pyyaml is a runtime dependency
        raise PlannerError("reading a YAML table file needs pyyaml: pip install pyyaml") from None
    try:
        return yaml.safe_load(text)  # YAML is a superset of JSON, so .yaml/.yml/.txt all land here
    except yaml.YAMLError as exc:
        raise PlannerError(f"--tables {path}: not valid YAML/JSON ({' '.join(str(exc).split())})") from exc


def tables_from_document(document: Any, source: str) -> tuple[EmbeddingTable, ...]:
    """Validate a parsed ``{"tables": [...]}`` document (``source`` names it in error messages)."""
    if not isinstance(document, dict) or "tables" not in document:
        raise PlannerError(f"--tables {source}: expected an object with a 'tables' list, e.g. "
                           '{"tables": [{"name": "t0", "rows": 1000, "dim": 64, "pooling_factor": 1}]}')
    entries = document["tables"]
    if not isinstance(entries, list) or not entries:
        raise PlannerError(f"--tables {source}: 'tables' must be a non-empty list of tables")
    tables: list[EmbeddingTable] = []
    seen: set[str] = set()
    for index, entry in enumerate(entries):
        where = f"--tables {source}: tables[{index}]"
        if not isinstance(entry, dict):
            raise PlannerError(f"{where}: expected an object with name, rows, dim, pooling_factor")
        unknown = sorted(set(entry) - set(_FIELDS))
        if unknown:
            raise PlannerError(f"{where}: unknown field {unknown[0]!r}; the fields are {', '.join(_FIELDS)}")
        for key in ("name", "rows", "dim"):
            if key not in entry:
                raise PlannerError(f"{where}: missing field {key!r}")
        name = entry["name"]
        if not isinstance(name, str) or not name.strip():
            raise PlannerError(f"{where}.name: expected a non-empty string, got {name!r}")
        where = f"--tables {source}: table {name!r}"
        if name in seen:
            raise PlannerError(f"{where}: the name appears twice; table names must be unique")
        seen.add(name)
        rows = _positive_int(entry["rows"], f"{where}.rows")
        dim = _positive_int(entry["dim"], f"{where}.dim")
        pooling = entry.get("pooling_factor", 1.0)
        if isinstance(pooling, bool) or not isinstance(pooling, (int, float)) or not math.isfinite(pooling) \
                or pooling <= 0:
            raise PlannerError(f"{where}.pooling_factor: expected a positive number (lookups per sample), "
                               f"got {pooling!r}")
        dtype_bytes = _positive_int(entry.get("dtype_bytes", 4), f"{where}.dtype_bytes")
        if dtype_bytes not in (1, 2, 4, 8):
            raise PlannerError(f"{where}.dtype_bytes: expected 1, 2, 4 or 8, got {dtype_bytes}")
        tables.append(EmbeddingTable(name=name, rows=rows, dim=dim, pooling_factor=float(pooling),
                                     dtype_bytes=dtype_bytes))
    return tuple(tables)


def _positive_int(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or value != int(value) or value <= 0:
        raise PlannerError(f"{where}: expected a positive integer, got {value!r}")
    return int(value)
