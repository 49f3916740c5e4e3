"""ONNX model -> :class:`planner.types.LayerGraph`: cost every op, detect layers and embedding tables."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Iterator, Mapping

import onnx

from planner.collector import collector_paused
from planner.errors import ModelError
from planner.graph import layers as layer_detection
from planner.graph.inputs import check_dims
from planner.graph.moe import ROUTED_EXPERT, MoEMatch, detect_moe
from planner.graph.loader import check_external_data, check_structure, read_model
from planner.graph.ir import ACT_BYTES, FLOAT_TYPES, INT_BYTES, Node, OpGraph, stored_bytes
from planner.graph.opgraph import build
from planner.graph.shapes import COSTED_AS_ZERO
from planner.graph.rules import (RULES, VIEW_OPS, View, attention_stages, fused_sources, nan_guards,
                                 saved_for_backward)
from planner.graph.transformer import (attention_core, detect_dims, output_layer_tensors, tp_splits,
                                      weighted_matmul)
from planner.graph.unknown import check_unknown_ops
from planner.graph.validate import check_sizes
from planner.types import EmbeddingTable, Layer, LayerGraph, OpCost, TransformerDims

log = logging.getLogger(__name__)

# ops that read only the rows/elements they output (plus their indices), not the whole data input
_READS_OUTPUT = frozenset({"Gather", "GatherElements", "GatherND", "EmbeddingBag", "Slice"})


def load_model(path: str | os.PathLike, dims: Mapping[str, int] | None = None, *,
               allow_unknown_ops: bool = False) -> LayerGraph:
    """Import an ONNX file (no weight data is read) with symbolic dims bound by ``dims``.

    A model the ONNX checker rejects is a ModelError; so is one where ops that could not be costed (no
    cost rule, unknown shapes) carry over ``UNKNOWN_SHARE_LIMIT`` of the FLOPs, unless
    ``allow_unknown_ops`` (then they cost zero and a warning gives their share)."""
    if not isinstance(path, (str, os.PathLike)):
        raise ModelError(f"model path: got a {type(path).__name__}; give the path of an .onnx file (an in-memory "
                         "ModelProto goes to planner.graph.import_model_proto)")
    model = read_model(path)
    return _import(model, dims, Path(path).stem, str(path), allow_unknown_ops)


def import_model_proto(model: onnx.ModelProto, dims: Mapping[str, int] | None = None, name: str = "model",
                       base_dir: str | os.PathLike | None = None, *, allow_unknown_ops: bool = False) -> LayerGraph:
    """Import an in-memory model; ``base_dir`` is the folder external-data locations must stay inside;
    ``allow_unknown_ops`` as for :func:`load_model`."""
    check_structure(model, name)
    check_external_data(model, Path(base_dir).resolve() if base_dir is not None else None, name)
    own = onnx.ModelProto()
    own.CopyFrom(model)  # the import strips weight data and binds dims in place
    return _import(own, dims, name, name, allow_unknown_ops)


# the import allocates a few objects per node and frees nothing until the end: the cyclic garbage collector's full
# passes over a 100k-node graph cost a quarter of the time and find nothing
@collector_paused()
def _import(model: onnx.ModelProto, dims: Mapping[str, int] | None, name: str, where: str,
            allow_unknown_ops: bool) -> LayerGraph:
    check_dims(dims, where)
    graph = build(model, dims, where)
    check_sizes(graph, where)
    compute = [node for node in graph.nodes if graph.is_compute(node)]
    if not compute:
        raise ModelError(f"{where}: no node computes on the model's inputs "
                         f"({', '.join(graph.data_inputs) or 'it has none'}); nothing to plan")
    tables, table_nodes, bag_loops = _tables(graph, compute)
    costs = {node.index: _cost(graph, node, bag_loops.get(node.index)) for node in compute}
    _warn_unknown(graph, [node for node in compute if node.index not in bag_loops])
    graph.name = name
    # pieces of the structural cut are anchored at matrix products and table lookups (a normalisation's
    # scale alone does not make a pipeline unit); graphs without any fall back to any parameter use
    anchors = {i for i, c in costs.items() if c.gemm is not None} | table_nodes
    if not anchors:
        anchors = {node.index for node in compute if any(t in graph.param_roots for t in node.inputs)}
    units = layer_detection.detect(graph, compute, {i: c.flops for i, c in costs.items()}, anchors, table_nodes)
    # mixtures of experts are found per layer before the unknown-op check: their routed token counts are
    # data-dependent in eager exports, and the routed costs replace the graph's own
    moe: dict[int, MoEMatch] = {}
    for k, unit in enumerate(units):
        match = detect_moe(graph, [graph.nodes[i] for i in sorted(unit.nodes)], costs)
        if match is not None:
            moe[k] = match
            costs.update(match.costs)
    routed = {i for match in moe.values() for i in match.costs}
    if routed:
        _note_routed(graph, len(moe))
    check_unknown_ops(graph, compute, costs, set(bag_loops) | routed, allow_unknown_ops, where)
    layer_list = _layers(graph, units, costs, moe)
    # warnings are logged only now: a refused model gets one error line on stderr and nothing before it
    for msg in graph.warnings:
        log.warning("%s: %s", where, msg)
    return LayerGraph(name=name, layers=tuple(layer_list), embedding_tables=tuple(tables), batch=graph.batch,
                      dims=tuple(sorted(graph.dims.items())), family=graph.family,
                      warnings=tuple(graph.warnings))


def _note_routed(graph: OpGraph, layers: int) -> None:
    """The unknown-shapes warning says the expert ops with data-dependent token counts are costed as routed."""
    for k, msg in enumerate(graph.warnings):
        if msg.endswith(COSTED_AS_ZERO):
            graph.warnings[k] = (msg[:-len(COSTED_AS_ZERO)]
                                 + f"those in the experts of the {layers} mixture-of-experts layers (data-dependent "
                                 f"token counts) are costed as routed (tokens x top_k rows), any others as zero")


def _cost(graph: OpGraph, node: Node, bag: EmbeddingTable | None = None) -> OpCost:
    view = View(node, graph)
    name = node.label
    if bag is not None:
        # a Loop that sums embedding bags (TorchScript's nn.EmbeddingBag): per sample, pooling_factor rows
        # of the table read and added up into one row written
        return OpCost(name=name, op_type=node.op_type, flops=float(bag.pooling_factor * bag.dim),
                      bytes_read=float(bag.pooling_factor * bag.dim * ACT_BYTES),
                      bytes_written=float(bag.dim * ACT_BYTES))
    rule = RULES.get(node.op_type)
    flops, gemm = rule(view) if rule is not None else (0.0, None)
    written = sum(view.bytes_of(t) for t in node.outputs)
    if node.op_type in VIEW_OPS:
        read = written = 0.0
    elif node.op_type in _READS_OUTPUT:
        read = written + sum(view.bytes_of(t) for t in node.inputs[1:])
    else:
        read = sum(view.bytes_of(t) for t in node.inputs)
    return _per_sample(graph, OpCost(name, node.op_type, float(flops), read, written, gemm))


def _per_sample(graph: OpGraph, op: OpCost) -> OpCost:
    """``op`` divided by the batch fixed inside the graph (its numbers are per sample)."""
    b = graph.static_batch
    if b <= 1:
        return op
    gemm = (max(op.gemm[0] // b, 1), op.gemm[1], op.gemm[2]) if op.gemm else None
    return OpCost(op.name, op.op_type, op.flops / b, op.bytes_read / b, op.bytes_written / b, gemm, op.tp_split,
                  op.role)


def _stages(graph: OpGraph, node: Node, op: OpCost) -> tuple[OpCost, ...]:
    """A fused ``Attention`` node as the kernels of the graph it fuses (Q·Kᵀ, scale-mask-softmax, P·V), each
    named after the node and with its split and role, so that the cost model times it as it times an
    attention core written out (FlashAttention, the fused softmax or unfused kernels, as the runtime runs
    it); any other node as itself."""
    stages = attention_stages(View(node, graph)) if node.op_type == "Attention" else ()
    if not stages:
        return (op,)
    return tuple(_per_sample(graph, OpCost(op.name, stage.op_type, stage.flops, stage.bytes_read, stage.bytes_written,
                                           stage.gemm, op.tp_split, op.role)) for stage in stages)


def _warn_unknown(graph: OpGraph, compute: list[Node]) -> None:
    unknown: dict[str, int] = {}
    for node in compute:
        if node.op_type not in RULES:
            key = f"{node.domain}::{node.op_type}" if node.domain not in ("", "ai.onnx") else node.op_type
            unknown[key] = unknown.get(key, 0) + 1
    for op_type, count in sorted(unknown.items()):
        msg = f"no cost rule for op type {op_type} ({count} nodes); costed as memory-bound (0 FLOPs)"
        graph.warnings.append(msg)


def _tables(graph: OpGraph, compute: list[Node]) -> tuple[list[EmbeddingTable], set[int], dict[int, EmbeddingTable]]:
    """Gather / EmbeddingBag lookups of data-dependent indices in a 2-D parameter, also inside the body of
    a Loop (TorchScript's export of ``nn.EmbeddingBag``). Returns the tables, the lookup nodes, and the
    Loops that sum bags of one table (costed as those lookups)."""
    tables: dict[str, EmbeddingTable] = {}
    nodes: set[int] = set()
    bag_loops: dict[int, EmbeddingTable] = {}

    def add(weight: str, pooling: float) -> bool:
        roots = graph.param_roots.get(weight)
        shape = graph.shapes.get(weight)
        if not roots or len(roots) != 1 or shape is None or len(shape) != 2:
            return False
        if roots[0] not in tables:
            tables[roots[0]] = EmbeddingTable(
                name=roots[0], rows=shape[0], dim=shape[1], pooling_factor=float(pooling),
                dtype_bytes=stored_bytes(graph.types.get(roots[0], onnx.TensorProto.FLOAT)))
        return True

    for node in compute:
        if node.op_type in ("Gather", "EmbeddingBag") and len(node.inputs) >= 2:
            indices = node.inputs[1]
            if indices in graph.const or (node.op_type == "Gather" and node.attr("axis", 0) != 0):
                continue
            count = graph.numel(indices)
            if add(node.inputs[0], count / graph.static_batch if count else 1.0):
                nodes.add(node.index)
        elif node.op_type in ("Loop", "Scan"):
            outer = set(node.inputs)
            index_sizes = [graph.numel(t) or 0 for t in node.inputs
                           if t and t not in graph.const and graph.types.get(t) not in FLOAT_TYPES]
            pooling = max(index_sizes, default=0) / graph.static_batch or 1.0
            for inner in _body_nodes(node.proto):
                if inner.op_type == "Gather" and len(inner.input) >= 2 and inner.input[0] in outer:
                    if add(inner.input[0], pooling):
                        nodes.add(node.index)
                        bag_loops[node.index] = tables[graph.param_roots[inner.input[0]][0]]
    return list(tables.values()), nodes, bag_loops


def _body_nodes(proto: onnx.NodeProto) -> Iterator[onnx.NodeProto]:
    for attr in proto.attribute:
        bodies = [attr.g] if attr.type == onnx.AttributeProto.GRAPH else list(attr.graphs)
        for body in bodies:
            for inner in body.node:
                yield inner
                yield from _body_nodes(inner)


def _layers(graph: OpGraph, units: list[layer_detection.Unit], costs: dict[int, OpCost],
            moe: dict[int, MoEMatch]) -> list[Layer]:
    layer_of: dict[int, int] = {}
    for k, unit in enumerate(units):
        for i in unit.nodes:
            layer_of[i] = k
    n = len(units)
    params = [0] * n
    saved_bytes = [0.0] * n
    logit_bytes = [0.0] * n  # of saved_bytes: a head's output-layer product and what is computed from it
    integer_bytes = [0.0] * n  # of saved_bytes: integer and boolean tensors (token indices)
    head_outputs: list[set[str]] = []  # per layer: a head's output-layer tensors (output_layer_tensors)
    owner: dict[str, int] = {}  # parameter root -> the layer that counts it (its first user)
    tied: list[dict[int, int]] = [{} for _ in range(n)]  # per layer: owner layer -> parameters it reads there
    b = graph.static_batch
    members = [graph.nodes[i] for i in sorted(layer_of)]
    fused, aliases = fused_sources(graph, members), nan_guards(graph, members)
    for k, unit in enumerate(units):
        counted: set[str] = set()  # a tensor saved by ops of two layers lives on both their stages
        read_roots: set[str] = set()  # roots of earlier layers this layer reads (counted once per layer)
        logits = output_layer_tensors(graph, [graph.nodes[i] for i in unit.nodes]) if unit.kind == "head" else set()
        head_outputs.append(logits)
        for i in sorted(unit.nodes):
            node = graph.nodes[i]
            for t in node.inputs:
                for root in graph.param_roots.get(t, ()):
                    if root not in owner:
                        owner[root] = k
                        params[k] += graph.params.get(root, 0)
                    elif owner[root] != k and root not in read_roots:
                        read_roots.add(root)
                        tied[k][owner[root]] = tied[k].get(owner[root], 0) + graph.params.get(root, 0)
            for tensor, per_elem in saved_for_backward(View(node, graph), fused, aliases):
                if tensor in counted:
                    continue
                counted.add(tensor)
                base = tensor.split("#mask")[0]
                known = graph.numel(base)
                if known is not None:
                    saved_bytes[k] += known * per_elem / b
                    if base in logits:
                        logit_bytes[k] += known * per_elem / b
                    elif base == tensor and graph.types.get(base) in INT_BYTES:
                        integer_bytes[k] += known * per_elem / b
                elif k in moe:  # a shape the routing decides: the routed size, per sample already
                    saved_bytes[k] += moe[k].routed_sizes.get(base, 0) * per_elem
    # boundary tensors: live from the producing layer to the last consuming layer (a difference array)
    diff = [0.0] * (n + 2)  # crossing[k] = bytes passed from layer k-1 to layer k (k=0: graph inputs)
    handed_on: dict[int, tuple[int, str]] = {}  # layer -> (producer index, tensor) of its output
    outputs = set(graph.outputs)
    spans = [(t, users) for t, users in graph.consumers.items() if t not in graph.const]
    spans += [(t, []) for t in outputs if t not in graph.consumers and t not in graph.const]
    for tensor, users in spans:
        src = graph.producer.get(tensor)
        first = layer_of.get(src, -1) if src is not None else -1
        last = max((layer_of[u] for u in users if u in layer_of), default=first)
        if tensor in outputs:
            last = n
        if last <= first:
            continue
        elements = graph.numel(tensor) or 0
        size = elements * 2.0 / b
        diff[first + 1] += size
        diff[last + 1] -= size
        # a block's output is the last float tensor it hands on (the residual stream, not a position bias
        # computed in the first block and shared with the others)
        if first >= 0 and graph.types.get(tensor) in FLOAT_TYPES and src > handed_on.get(first, (-1, ""))[0]:
            handed_on[first] = (src, tensor)
    crossing = [0.0] * (n + 1)
    running = 0.0
    for k in range(n + 1):
        running += diff[k]
        crossing[k] = running
    result: list[Layer] = []
    for k, unit in enumerate(units):
        members = [graph.nodes[i] for i in sorted(unit.nodes)]
        ops = [costs[node.index] for node in members]
        transformer = None
        kind = unit.kind
        match = moe.get(k)
        if kind == "block":
            transformer = _block_dims(graph, members, handed_on.get(k, (0, None))[1], match)
            if transformer is not None:
                split = tp_splits(graph, members, transformer, {match.router} if match else set(),
                                  set(match.experts | match.shared) if match else set())
                role = attention_core(graph, members)
                if match is not None:
                    role.update({i: ROUTED_EXPERT for i in match.experts})
                ops = [_with_split(op, split.get(node.index, "replicated"), role.get(node.index, ""))
                       for op, node in zip(ops, members)]
        elif kind == "head":
            # the output layer is vocabulary-parallel (column); a projection before it is computed whole
            ops = [_with_split(op, "column", op.role) if weighted_matmul(graph, node)
                   and any(t in head_outputs[k] for t in node.outputs if t) else op for op, node in zip(ops, members)]
        ops = [stage for op, node in zip(ops, members) for stage in _stages(graph, node, op)]
        result.append(Layer(index=k, name=unit.name, kind=kind, params=params[k],
                            flops_forward=float(sum(op.flops for op in ops)), activation_bytes=saved_bytes[k],
                            output_bytes=crossing[k + 1], ops=tuple(ops), transformer=transformer,
                            input_bytes=crossing[k], moe=match.dims if match else None,
                            tied_params=tuple(sorted(tied[k].items())), logit_activation_bytes=logit_bytes[k],
                            integer_activation_bytes=integer_bytes[k]))
    return result


def _block_dims(graph: OpGraph, members: list[Node], output: str | None,
                match: MoEMatch | None) -> TransformerDims | None:
    """A block's transformer dims; in a mixture-of-experts block the router and expert MatMuls are not
    attention or MLP projections, and the MLP width is the active one: (top_k + shared) experts' width."""
    if match is None:
        return detect_dims(graph, members, output)
    skip = {match.router} | match.experts | match.shared
    active = (match.dims.top_k + match.dims.shared_experts) * match.dims.expert_ffn
    return detect_dims(graph, [node for node in members if node.index not in skip], output, mlp_ffn=active)


def _with_split(op: OpCost, split: str, role: str = "") -> OpCost:
    return OpCost(op.name, op.op_type, op.flops, op.bytes_read, op.bytes_written, op.gemm, split, role)
