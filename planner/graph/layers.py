"""Layer detection: cut the compute nodes of an :class:`OpGraph` into ordered pipeline units.

1. Name scopes (TorchScript's ``/transformer/h.0/attn/MatMul`` node names, the dynamo exporter's
   ``pkg.torch.onnx.name_scopes`` metadata): the numbered children of a module list (``h.0``, ``h.1``...,
   ``encoder.block.3``, ``layer2.1``) become blocks; the nodes between them (embeddings, final norm, head)
   become their own units, placed by data flow.
2. Otherwise graph structure: cut after every node where a single data tensor is live (the residual
   stream of a transformer, the output of a ResNet block), merge weight-less pieces into the piece before,
   and group a repeated run of pieces (attention + MLP, attention + MLP, ...) into blocks.
"""

from __future__ import annotations

import os
import re
from collections import Counter
from dataclasses import dataclass

from planner.graph.ir import Node, OpGraph

_MIN_SHARE = 0.05  # a module list with a single member must hold this share of the FLOPs to define a block
_MAX_PERIOD = 8  # longest repeated run of structural pieces grouped into one block


@dataclass(frozen=True)
class Unit:
    """A detected pipeline unit: a name, a provisional kind and its compute nodes (topological order)."""

    name: str
    kind: str
    nodes: tuple[int, ...]


def detect(graph: OpGraph, compute: list[Node], flops: dict[int, float], anchors: set[int],
           table_nodes: set[int]) -> list[Unit]:
    """Ordered pipeline units. ``flops`` is keyed by node index; ``anchors`` are the nodes that carry a unit
    (matrix products and table lookups: a normalisation or an activation alone does not make a unit)."""
    if not compute:
        return []
    units = _by_scope(graph, compute, flops, anchors, table_nodes)
    if units is None:
        units = _by_structure(graph, compute, anchors, table_nodes)
    return units


# ------------------------------------------------------------------------------------------ name scopes


def _scope_key(scope: tuple[str, ...], depth: int) -> tuple[tuple[str, ...], int] | None:
    comp = scope[depth]
    if comp.isdigit() and depth > 0:
        return scope[:depth], int(comp)
    return None


def _by_scope(graph: OpGraph, compute: list[Node], flops: dict[int, float], anchors: set[int],
              table_nodes: set[int]) -> list[Unit] | None:
    total = sum(flops.values()) or 1.0
    covered: dict[tuple[str, ...], dict[int, float]] = {}
    for node in compute:
        for depth in range(len(node.scope)):
            key = _scope_key(node.scope, depth)
            if key:
                covered.setdefault(key[0], {}).setdefault(key[1], 0.0)
                covered[key[0]][key[1]] += flops.get(node.index, 0.0)
    ranked = sorted(((sum(v.values()), k) for k, v in covered.items()), key=lambda x: (-x[0], x[1]))
    chosen: list[tuple[str, ...]] = []
    for share, key in ranked:
        if share < _MIN_SHARE * total and len(covered[key]) < 2:
            continue
        if any(key[:len(c)] == c or c[:len(key)] == key for c in chosen):
            continue
        chosen.append(key)
    if not chosen:
        return None

    def unit_of(node: Node) -> tuple[tuple[str, ...], int] | None:
        for depth in range(len(node.scope)):
            key = _scope_key(node.scope, depth)
            if key and key[0] in chosen:
                return key
        return None

    # blocks in order of first appearance; position 2k+1 for block k, even positions for the gaps
    order: dict[tuple[tuple[str, ...], int], int] = {}
    pos: dict[int, int] = {}
    producer = graph.producer
    for node in compute:
        key = unit_of(node)
        if key is not None:
            if key not in order:
                order[key] = len(order)
            pos[node.index] = 2 * order[key] + 1
    # a node without a scope goes where data flow puts it: inside a block when it both reads from and
    # feeds that block (exporters drop the scope of some Split/Concat nodes), else in the gap after its inputs
    scoped = set(pos)
    lo: dict[int, int] = {}
    for node in compute:
        if node.index not in scoped:
            lo[node.index] = max((pos.get(producer.get(t, -1), lo.get(producer.get(t, -1), 0))
                                  for t in node.inputs if t), default=0)
    hi: dict[int, float] = {}
    for node in reversed(compute):
        if node.index in scoped:
            continue
        bound = float("inf")
        for t in node.outputs:
            for user in graph.consumers.get(t, ()):
                bound = min(bound, pos[user] if user in scoped else hi.get(user, float("inf")))
        hi[node.index] = bound
    for i, low in lo.items():
        pos[i] = low if low % 2 == 0 or hi[i] <= low else low + 1
    groups: dict[int, list[int]] = {}
    for node in compute:
        groups.setdefault(pos[node.index], []).append(node.index)
    # numbered modules that are a detail (a Sequential stem before named, unnumbered blocks) leave most
    # matrix products between them: then the layers come from the graph's structure instead
    products = {p: sum(1 for i in members if i in anchors and i not in table_nodes) for p, members in groups.items()}
    in_gaps = max((v for p, v in products.items() if p % 2 == 0), default=0)
    if in_gaps > max((v for p, v in products.items() if p % 2), default=1) and in_gaps > 1:
        return None
    names = {2 * k + 1: ".".join(key[0] + (str(key[1]),)) for key, k in order.items()}
    last = max(groups)
    units: list[Unit] = []
    for p in sorted(groups):
        members = tuple(groups[p])
        anchored = any(i in anchors for i in members)
        if p % 2:
            if any(i in table_nodes for i in members):
                kind = "embedding"
            elif all(graph.nodes[i].op_type in _MLP_OPS for i in members):
                kind = "mlp"
            else:
                kind = "block"
            unit = Unit(names[p], kind, members)
        elif p == 0:
            table = any(i in table_nodes for i in members)
            unit = Unit("embedding" if table else "stem", "embedding" if table else "other", members)
        elif p == last:
            unit = Unit("head", "head", members)
        else:
            unit = Unit(f"between.{p // 2}", "other", members)
        if not anchored and units and not (p == last and p % 2 == 0):
            # no matrix product or lookup of its own (an activation module, a residual add): joins the unit before
            prev = units[-1]
            units[-1] = Unit(prev.name, prev.kind, tuple(sorted(prev.nodes + members)))
        elif units and unit.kind == "embedding" and units[-1].kind == "embedding":
            # one embedding unit for the lookups of several tables (each table is placed on its own anyway)
            units[-1] = Unit("embedding", "embedding", tuple(sorted(units[-1].nodes + members)))
        else:
            units.append(unit)
    if len(units) > 1 and not any(i in anchors for i in units[0].nodes):
        # index arithmetic before the first unit with work of its own (slicing the sparse inputs)
        units[1] = Unit(units[1].name, units[1].kind, tuple(sorted(units[0].nodes + units[1].nodes)))
        units = units[1:]
    return units


# ------------------------------------------------------------------------------------ graph structure


def _by_structure(graph: OpGraph, compute: list[Node], anchors: set[int], table_nodes: set[int]) -> list[Unit]:
    where = {node.index: i for i, node in enumerate(compute)}
    n = len(compute)
    # live[b] = number of data tensors crossing the boundary after position b
    diff = [0] * (n + 1)
    graph_outputs = set(graph.outputs)
    seen: set[str] = set()
    for i, node in enumerate(compute):
        for t in node.inputs:
            if t and t not in graph.const and t not in seen and t not in graph.producer:
                seen.add(t)  # a data input of the graph, live from the start
                last = max((where.get(c, -1) for c in graph.consumers.get(t, ())), default=-1)
                diff[0] += 1
                diff[max(last, 0)] -= 1
        for t in node.outputs:
            if not t or t in graph.const:
                continue
            last = max((where.get(c, -1) for c in graph.consumers.get(t, ())), default=i)
            if t in graph_outputs:
                last = n
            if last > i:
                diff[i] += 1
                diff[last] -= 1
    live = 0
    cuts: list[int] = []
    for b in range(n - 1):
        live += diff[b]
        if live == 1:
            cuts.append(b)
    pieces: list[list[int]] = []
    start = 0
    for b in cuts:
        pieces.append([node.index for node in compute[start:b + 1]])
        start = b + 1
    pieces.append([node.index for node in compute[start:]])
    pieces = _merge_weightless(graph, pieces, anchors)
    sigs = [_signature(graph, piece) for piece in pieces]
    start, period, count = _best_run(sigs)
    units: list[Unit] = []
    blocks = 0
    i = 0
    while i < len(pieces):
        if period > 1 and i == start:
            for _ in range(count):
                members = tuple(x for piece in pieces[i:i + period] for x in piece)
                units.append(Unit(f"block.{blocks}", "block", members))
                blocks += 1
                i += period
            continue
        units.append(Unit("", "", tuple(pieces[i])))
        i += 1
    repeated = {s for s, count in Counter(sigs).items() if count >= 2}
    named: list[Unit] = []
    counters: dict[str, int] = {}
    for k, unit in enumerate(units):
        kind = unit.kind
        if not kind:
            members = unit.nodes
            if any(i in table_nodes for i in members):
                kind = "embedding"
            elif k == len(units) - 1 and len(units) > 1:
                kind = "head"
            elif _signature(graph, list(members)) in repeated:
                kind = "block"
            elif all(graph.nodes[i].op_type in _MLP_OPS for i in members):
                kind = "mlp"
            else:
                kind = "other"
        if kind in ("embedding", "head"):
            name = kind if kind not in counters else f"{kind}.{counters[kind]}"
        else:
            name = f"{kind}.{counters.get(kind, 0)}"
        counters[kind] = counters.get(kind, 0) + 1
        named.append(Unit(name, kind, unit.nodes))
    return _names_from_weights(graph, named)


_WEIGHT_SUFFIX = re.compile(r"([._/-]?(weight|bias|w|b|W|B|kernel|scale|gamma|beta|bn_s|bn_b|s)(_\d+)?)+$")


def _names_from_weights(graph: OpGraph, units: list[Unit]) -> list[Unit]:
    """Name structural units after their weights where those share a module-like prefix
    (``res2_0_branch2a_w_0`` + ``res2_0_branch2b_w_0`` -> ``res2_0``, ``h.3.attn.c_attn.weight`` ... -> ``h.3``);
    otherwise keep ``block.N`` / ``other.N``. Names stay unique."""
    proposals: list[str] = []
    for unit in units:
        roots = sorted({r for i in unit.nodes for t in graph.nodes[i].inputs for r in graph.param_roots.get(t, ())})
        prefix = os.path.commonprefix(roots) if roots else ""
        if len(roots) == 1:
            prefix = _WEIGHT_SUFFIX.sub("", prefix)
        else:
            cut = max(prefix.rfind(c) for c in "._/")
            prefix = prefix[:cut] if cut > 0 and roots[0][cut] in "._/" else ""
        proposals.append(prefix)
    taken = [p for p in proposals if p]
    out = []
    for unit, prefix in zip(units, proposals):
        keep_kind_name = unit.kind in ("embedding", "head") or not prefix or taken.count(prefix) > 1
        out.append(unit if keep_kind_name else Unit(prefix, unit.kind, unit.nodes))
    return out


_MLP_OPS = frozenset({"MatMul", "Gemm", "Add", "Relu", "Gelu", "Sigmoid", "Tanh", "Dropout", "Reshape", "Flatten",
                      "Mul", "Erf", "Div", "LayerNormalization", "BatchNormalization", "Concat", "Identity", "Cast",
                      "Squeeze", "Unsqueeze", "LeakyRelu"})


def _merge_weightless(graph: OpGraph, pieces: list[list[int]], anchors: set[int]) -> list[list[int]]:
    """A piece without a matrix product joins the piece before it; the first ones join the next, and so
    does a piece with parameters just before the last anchored piece (a final norm belongs to the head)."""
    anchored = [any(i in anchors for i in piece) for piece in pieces]
    last_anchor = max((k for k, a in enumerate(anchored) if a), default=-1)
    merged: list[list[int]] = []
    pending: list[int] = []
    for k, piece in enumerate(pieces):
        if anchored[k]:
            merged.append(pending + piece)
            pending = []
        elif not merged or (k == last_anchor - 1 and _has_params(graph, piece)):
            pending.extend(piece)
        else:
            merged[-1].extend(piece)
    if pending:
        merged.append(pending)
    return merged


def _has_params(graph: OpGraph, piece: list[int]) -> bool:
    return any(t in graph.param_roots for i in piece for t in graph.nodes[i].inputs)


def _signature(graph: OpGraph, piece: list[int]) -> int:
    parts = []
    for i in piece:
        node = graph.nodes[i]
        shapes = tuple(graph.shapes.get(t) for t in node.inputs if t in graph.param_roots)
        parts.append((node.op_type, shapes))
    return hash(tuple(parts))


def _best_run(sigs: list[int]) -> tuple[int, int, int]:
    """(start, period, count) of the longest run of a repeated group of pieces; period 1 means none."""
    best = (0, 1, 1)
    best_cover = 1
    n = len(sigs)
    for period in range(1, min(_MAX_PERIOD, n // 2) + 1):
        i = 0
        while i + period < n:
            j = i
            while j + period < n and sigs[j] == sigs[j + period]:
                j += 1
            count = (j - i + period) // period
            if count >= 2 and count * period > best_cover:
                best, best_cover = (i, period, count), count * period
            i = max(j, i + 1) if j > i else i + 1
    return best
