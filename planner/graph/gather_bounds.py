"""Gathers that would read past the end of their table at the dims the user bound.

A model exported with learned position embeddings (GPT-2, BERT) looks its positions up with
``Gather(table, Range(0, seq))``: bound to a sequence longer than the table, the graph still has consistent
shapes, so shape inference and the cost model accept it, but no runtime can run it (the lookup indexes rows
that do not exist). This module finds such lookups from shapes and small integer arithmetic alone (never
weight data): for every Gather of a table with constant indices (positions, not data), the largest index
those indices can hold, followed back through the ops that keep values (Unsqueeze, Reshape, Expand, Cast,
...) to a ``Range`` or a small constant. The importer reports each as a warning: the costs stand for a model
whose table is long enough, which is what a user asking about a longer sequence would train.
"""

from __future__ import annotations

import math

import numpy as np

from planner.graph import fold
from planner.graph.ir import Node, OpGraph

Values = dict[str, np.ndarray]

# ops whose output holds only values of their first input (so its largest value bounds theirs)
_KEEPS_VALUES = frozenset({"Unsqueeze", "Squeeze", "Reshape", "Expand", "Cast", "Identity", "Flatten", "Tile",
                           "Transpose"})


def overruns(graph: OpGraph, initial: Values) -> list[str]:
    """One warning per Gather whose constant indices reach past its table's first dimension (axis 0);
    ``initial``: the small initializers' values (``planner.graph.shapes.small_initializers``)."""
    const, shapes = graph.const, graph.shapes
    lookups = [node for node in graph.nodes
               if node.op_type == "Gather" and len(node.inputs) >= 2 and node.attr("axis", 0) == 0
               and node.inputs[1] in const and shapes.get(node.inputs[0])]
    if not lookups:
        return []
    values = fold.evaluate(_ancestors(lookups, graph), const, shapes, initial)
    out = []
    for node in lookups:
        rows = shapes[node.inputs[0]][0]
        top = _largest(node.inputs[1], graph, values)
        if top is not None and top >= rows:
            out.append(f"Gather '{node.name or node.inputs[0]}' reads row {top} of '{node.inputs[0]}', which has "
                       f"{rows} rows, at the dims given: the model as exported cannot run at them (a learned "
                       f"position table shorter than the sequence?); the costs are those of a table of "
                       f"{top + 1} rows or more")
    return out


def _producer(graph: OpGraph, tensor: str) -> Node | None:
    index = graph.producer.get(tensor)
    return None if index is None else graph.nodes[index]


def _ancestors(lookups: list[Node], graph: OpGraph) -> list[Node]:
    """The constant nodes the lookups' indices are computed from, in topological order."""
    seen: dict[int, Node] = {}
    stack = [node.inputs[1] for node in lookups]
    while stack:
        node = _producer(graph, stack.pop())
        if node is None or node.index in seen or not all(t in graph.const for t in node.outputs if t):
            continue
        seen[node.index] = node
        stack.extend(t for t in node.inputs if t)
    return [seen[i] for i in sorted(seen)]


def _largest(tensor: str, graph: OpGraph, values: Values) -> int | None:
    """The largest value ``tensor`` can hold (None: not known without evaluating a large tensor)."""
    for _ in range(64):  # chains of value-keeping ops are short; a bound stops a corrupted cycle
        known = values.get(tensor)
        if known is not None:
            return int(np.max(known)) if known.size and known.dtype.kind in "iu" else None
        node = _producer(graph, tensor)
        if node is None:
            return None
        if node.op_type == "Range":
            return _range_top(*(values.get(t) for t in node.inputs[:3]))
        if node.op_type not in _KEEPS_VALUES:
            return None
        tensor = node.inputs[0]
    return None


def _range_top(start: np.ndarray | None, limit: np.ndarray | None, delta: np.ndarray | None) -> int | None:
    """The last value of ``Range(start, limit, delta)`` (None: unknown or empty)."""
    if start is None or limit is None or delta is None:
        return None
    s, lim, d = (np.asarray(v).reshape(-1)[0].item() for v in (start, limit, delta))
    if not all(isinstance(v, int) for v in (s, lim, d)) or d == 0:
        return None
    count = max(0, math.ceil((lim - s) / d))
    return max(s, s + d * (count - 1)) if count else None
