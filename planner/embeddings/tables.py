"""Embedding-table statistics from a table file (``--tables FILE``, format in planner/schemas/tables.schema.json)
or from Python (``check_tables``).

One reader serves the whole project: planner.builders.tables (which also accepts a workload entry of
``benchmarks/data/embedding_workloads.json``, or that whole file with ``workload=NAME``). Bad files raise a
PlannerError naming the file and field.
"""

from __future__ import annotations

from os import PathLike
from typing import Any

from planner.builders.tables import check_tables
from planner.builders.tables import load_tables as _read_spec
from planner.types import EmbeddingTable

__all__ = ["check_tables", "given_tables", "load_tables"]


def load_tables(path: str | PathLike, workload: str | None = None) -> tuple[EmbeddingTable, ...]:
    """The tables of a JSON/YAML table file, in file order."""
    return _read_spec(str(path), workload).tables


def given_tables(tables: Any) -> tuple[EmbeddingTable, ...]:
    """The tables a caller passed as ``tables=``: a table file's path (read), or EmbeddingTables (checked as a
    file's are); None or an empty sequence give none."""
    if tables is None or (isinstance(tables, (list, tuple)) and not tables):
        return ()
    if isinstance(tables, (str, PathLike)):
        return load_tables(tables)
    return check_tables(tables)
