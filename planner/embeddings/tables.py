"""Embedding-table statistics from a table file (``--tables FILE``, format in CONTRACT.md).

One reader serves the whole project: planner.builders.tables (which also accepts a workload entry of
``reference/embedding_workloads.json``, or that whole file with ``workload=NAME``). Bad files raise a
PlannerError naming the file and field.
"""

from __future__ import annotations

from os import PathLike

from planner.builders.tables import load_tables as _read_spec
from planner.types import EmbeddingTable


def load_tables(path: str | PathLike, workload: str | None = None) -> tuple[EmbeddingTable, ...]:
    """The tables of a JSON/YAML table file, in file order."""
    return _read_spec(str(path), workload).tables
