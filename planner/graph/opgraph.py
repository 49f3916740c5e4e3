"""Build the :class:`~planner.graph.ir.OpGraph` of an ONNX model: nodes in topological order (a cycle or a
dangling tensor is a ModelError), exporter name scopes, weights and data inputs, bound dims, shapes for one
sample, and which tensors are constants or parameters.

Built once per import with plain dict/list passes. Symbolic dimensions are bound before ONNX shape inference
runs: the batch dimension to 1 (numbers are per sample), every other one to the user's ``--dim`` value or the
model's ``planner.default_dims`` metadata.
"""

from __future__ import annotations

import ast
import heapq
import logging
from typing import Mapping

import onnx

from planner.errors import ModelError
from planner.graph import gather_bounds
from planner.graph.inputs import batch_dim_name, bind_dims, classify_inputs, reaches_param_slot
from planner.graph.ir import FLOAT_TYPES, Node, OpGraph, node_labels, numel_of
from planner.graph.validate import check_input_dims, check_model
from planner.graph.shapes import Shapes, Types, fill_shape_gaps, fold_and_reinfer, infer_shapes, prepare, \
    small_initializers

log = logging.getLogger(__name__)

_NOT_PARAMS = {"BatchNormalization": (3, 4)}
_SHAPE_OPS = frozenset({"Shape", "Size"})
# a lookup table indexed by position whose rows multiply activations: a rotary cache (cos/sin per position),
# which exporters store as an initializer (a module's non-persistent buffer) though nothing trains it
_LOOKUPS = frozenset({"Slice", "Gather"})
_PASS_THROUGH = frozenset({"Reshape", "Squeeze", "Unsqueeze", "Flatten", "Identity", "Cast", "Expand", "Transpose"})


# ------------------------------------------------------------------------------------------ building


def build(model: onnx.ModelProto, dims: Mapping[str, int] | None, name: str) -> OpGraph:
    graph = model.graph
    init_names = {t.name for t in graph.initializer}
    nodes = _topological(graph, init_names, name)
    check_model(model, nodes, name)
    consumers: dict[str, list[tuple[Node, int]]] = {}
    for node in nodes:
        for slot, t in enumerate(node.inputs):
            if t:
                consumers.setdefault(t, []).append((node, slot))

    weight_inputs, data_inputs = classify_inputs(graph, init_names, consumers)
    meta = {p.key: p.value for p in model.metadata_props}
    family = meta.get("planner.family") or None
    bound, user_batch, static_batch = bind_dims(graph, data_inputs, dims or {}, meta, name)
    batch_dim = batch_dim_name(graph, data_inputs)
    declared = prepare(model, bound, data_inputs)
    check_input_dims(graph, data_inputs, name)
    shapes, types = infer_shapes(model, declared, name)
    const, param_roots, params = _constants(graph, nodes, init_names, weight_inputs, types, shapes, consumers)
    shapes, types = fold_and_reinfer(model, nodes, const, shapes, types, declared, name)
    producer = {t: node.index for node in nodes for t in node.outputs if t}
    cons = {t: [n.index for n, _ in lst] for t, lst in consumers.items()}
    outputs = tuple(o.name for o in graph.output)
    shown = dict(bound)
    if batch_dim is not None:
        shown[batch_dim] = user_batch
    op = OpGraph(name=name, nodes=nodes, shapes=shapes, types=types, const=const, params=params,
                 param_roots=param_roots, data_inputs=tuple(data_inputs), outputs=outputs, producer=producer,
                 consumers=cons, batch=user_batch if static_batch == 1 else static_batch,
                 static_batch=static_batch, dims=shown, family=family)
    fill_shape_gaps(op)
    op.warnings.extend(gather_bounds.overruns(op, small_initializers(model)))
    return op


def _first_on_a_cycle(waiting: list[int], users: dict[int, list[int]]) -> int:
    """The first node (in file order) of a cycle among the nodes Kahn's algorithm left waiting; nodes that
    only wait downstream of a cycle are not on it, so they are not named."""
    import networkx as nx  # only on this error path: the import itself stays free of it

    stuck = nx.DiGraph((i, u) for i, count in enumerate(waiting) if count > 0
                       for u in users.get(i, ()) if waiting[u] > 0)
    return min(edge[0] for edge in nx.find_cycle(stuck))


def _topological(graph: onnx.GraphProto, init_names: set[str], name: str) -> list[Node]:
    """Kahn's algorithm; a cycle or a tensor that nothing produces is a ModelError naming the node."""
    protos = list(graph.node)
    _check_text(graph, name)
    inputs_of = [tuple(p.input) + _implicit_inputs(p) if p.op_type in _SUBGRAPH_OPS or p.domain not in ("", "ai.onnx")
                 else tuple(p.input) for p in protos]
    available = {i.name for i in graph.input} | init_names | {""}
    producer: dict[str, int] = {}
    for i, p in enumerate(protos):
        for t in p.output:
            if t:
                if t in producer or t in available:
                    raise ModelError(f"{name}: tensor '{t}' is produced twice (by node "
                                     f"'{p.name or p.op_type}'); the graph is not valid ONNX")
                producer[t] = i
    waiting = [0] * len(protos)
    users: dict[int, list[int]] = {}
    for i, p in enumerate(protos):
        deps = {producer[t] for t in inputs_of[i] if t not in available and t in producer}
        missing = [t for t in inputs_of[i] if t not in available and t not in producer]
        if missing:
            raise ModelError(f"{name}: node '{p.name or p.op_type}' reads tensor '{missing[0]}' that no node, "
                             f"input or initializer provides (an export without its weights? keep the "
                             f"initializers, e.g. torch.onnx.export(..., external_data=True); their data "
                             f"is never read)")
        waiting[i] = len(deps)
        for d in deps:
            users.setdefault(d, []).append(i)
    ready = [i for i in range(len(protos)) if waiting[i] == 0]  # a heap: file order among ready nodes
    heapq.heapify(ready)
    order: list[int] = []
    while ready:
        i = heapq.heappop(ready)
        order.append(i)
        for u in users.get(i, ()):
            waiting[u] -= 1
            if waiting[u] == 0:
                heapq.heappush(ready, u)
    if len(order) != len(protos):
        p = protos[_first_on_a_cycle(waiting, users)]
        raise ModelError(f"{name}: the graph has a cycle through node '{p.name or p.op_type}' "
                         f"({p.op_type}); ONNX graphs must be acyclic")
    labels = node_labels(protos)
    nodes = []
    for k, i in enumerate(order):
        p = protos[i]
        nodes.append(Node(k, p.name, p.op_type, p.domain, inputs_of[i], tuple(p.output), p, _scope(p), labels[i]))
    return nodes


_SUBGRAPH_OPS = frozenset({"Loop", "If", "Scan", "SequenceMap"})


def _check_text(graph: onnx.GraphProto, name: str) -> None:
    """Protobuf hands back bytes for strings that are not valid UTF-8 (a corrupted file)."""
    texts: set[type] = set()
    for p in graph.node:
        texts.update(map(type, (p.name, p.op_type, p.domain)))
        texts.update(map(type, p.input))
        texts.update(map(type, p.output))
    texts.update(type(vi.name) for vi in list(graph.input) + list(graph.output) + list(graph.initializer))
    if texts - {str}:
        raise ModelError(f"{name}: a node or tensor name is not valid UTF-8; the file is corrupted")


def _implicit_inputs(proto: onnx.NodeProto) -> tuple[str, ...]:
    """Outer-scope tensors a Loop/If/Scan body reads (they are real inputs of the node)."""
    bodies = [a.g for a in proto.attribute if a.type == onnx.AttributeProto.GRAPH]
    bodies += [g for a in proto.attribute if a.type == onnx.AttributeProto.GRAPHS for g in a.graphs]
    if not bodies:
        return ()
    used: dict[str, None] = {}
    for body in bodies:
        defined = {v.name for v in body.input} | {t.name for t in body.initializer}
        for node in body.node:
            for t in list(node.input) + list(_implicit_inputs(node)):
                if t and t not in defined:
                    used[t] = None
            defined.update(node.output)
        for v in body.output:
            if v.name not in defined:
                used[v.name] = None
    return tuple(t for t in used if t not in proto.input)


def _scope(proto: onnx.NodeProto) -> tuple[str, ...]:
    """The exporter's module path of a node, split at dots: ``("transformer", "h", "0", "attn")``.

    The dynamo exporter writes ``pkg.torch.onnx.name_scopes`` metadata, a list of cumulative module paths
    ending with the node's own name (``['', 'h.0', 'h.0.mlp', 'linear_2']``); TorchScript names nodes
    ``/transformer/h.0/attn/MatMul``."""
    for prop in proto.metadata_props:
        if prop.key == "pkg.torch.onnx.name_scopes":
            try:
                scopes = ast.literal_eval(prop.value)
            except (ValueError, SyntaxError):
                return ()
            if not isinstance(scopes, (list, tuple)) or len(scopes) < 2:
                return ()
            return tuple(p for p in str(scopes[-2]).split(".") if p)
    name = proto.name
    if name.startswith("/"):
        return tuple(p for part in name.split("/")[1:-1] for p in part.split(".") if p)
    return ()


def _constants(graph: onnx.GraphProto, nodes: list[Node], init_names: set[str], weight_inputs: set[str],
               types: Types, shapes: Shapes, consumers: dict[str, list[tuple[Node, int]]]
               ) -> tuple[set[str], dict[str, tuple[str, ...]], dict[str, int]]:
    """Constant tensors, parameter tensors and, for each constant, the parameters it derives from."""
    const: set[str] = set(init_names) | set(weight_inputs) | {""}
    params: dict[str, int] = {}
    roots: dict[str, tuple[str, ...]] = {}

    def not_param(tensor: str) -> bool:
        uses = consumers.get(tensor, [])
        return bool(uses) and all(slot in _NOT_PARAMS.get(n.op_type, ()) for n, slot in uses)

    def counts(tensor: str, n: int) -> bool:
        """More than one element, or a single element in a parameter slot (a Gemm's 1-wide bias); scalar
        constants (a scale, an epsilon) are not parameters."""
        if not_param(tensor) or n == 0:
            return False
        return n > 1 or reaches_param_slot(tensor, 1, consumers, elementwise=False)

    for t in graph.initializer:
        n = numel_of(t.dims)
        if t.data_type in FLOAT_TYPES and counts(t.name, n) and len(t.dims) > 0:
            params[t.name] = n
            roots[t.name] = (t.name,)
    for t in weight_inputs:
        shape = shapes.get(t)
        n = numel_of(shape) if shape else 0
        if counts(t, n):
            params[t] = n
            roots[t] = (t,)
    for node in nodes:
        ins = [t for t in node.inputs if t]
        if node.op_type in _SHAPE_OPS or all(t in const for t in ins):
            if node.op_type in ("RandomNormalLike", "RandomUniformLike", "Multinomial") and ins:
                continue
            rs: tuple[str, ...] = ()
            for t in ins:
                r = roots.get(t)
                if r:
                    rs = r if not rs else tuple(dict.fromkeys(rs + r))
            for out in node.outputs:
                if not out:
                    continue
                const.add(out)
                # the light model zoo stores weights as ConstantOfShape(an initializer holding the shape)
                if node.op_type == "ConstantOfShape" and ins and ins[0] in init_names and types.get(out) in FLOAT_TYPES:
                    shape = shapes.get(out)
                    n = numel_of(shape) if shape else 0
                    if counts(out, n):
                        params[out] = n
                        roots[out] = (out,)
                        continue
                if rs and node.op_type not in _SHAPE_OPS:
                    roots[out] = rs
    caches = {t for t in params if _multiplier_table(t, consumers, const)}
    if caches:
        params = {t: n for t, n in params.items() if t not in caches}
        roots = {t: kept for t, rs in roots.items() if (kept := tuple(r for r in rs if r not in caches))}
    return const, roots, params


def _multiplier_table(tensor: str, consumers: dict[str, list[tuple[Node, int]]], const: set[str]) -> bool:
    """Whether ``tensor`` is read only as rows looked up (``Slice``/``Gather`` of its data input) that then
    only multiply activations, through reshapes and casts: a rotary-embedding cache, not a weight. A learned
    position table is added to the activations, a token embedding's rows are scaled by a constant, and a norm's
    weight multiplies without a lookup, so each stays a parameter."""
    uses = consumers.get(tensor, [])
    if not uses or not all(n.op_type in _LOOKUPS and slot == 0 for n, slot in uses):
        return False
    frontier = [out for n, _ in uses for out in n.outputs if out]
    seen: set[str] = set()
    multiplies = False
    while frontier:
        t = frontier.pop()
        if t in seen:
            continue
        seen.add(t)
        for node, slot in consumers.get(t, []):
            if node.op_type in _PASS_THROUGH and slot == 0:
                frontier.extend(out for out in node.outputs if out)
            elif node.op_type == "Mul" and len(node.inputs) == 2 and node.inputs[1 - slot] not in const:
                multiplies = True
            else:
                return False
    return multiplies


# ------------------------------------------------------------------------------ shape gap filling
