"""The operator graph: nodes in topological order, tensor shapes for ONE sample, and which tensors are
weights or constants.

Built once per import with plain dict/list passes (a 100k-node graph takes about a second). Symbolic
dimensions are bound before ONNX shape inference runs: the batch dimension to 1 (numbers are per sample),
every other one to the user's ``--dim`` value or the model's ``planner.default_dims`` metadata.
"""

from __future__ import annotations

import ast
import heapq
import json
import logging
from dataclasses import dataclass, field
from typing import Mapping

import onnx
from onnx import TensorProto, numpy_helper

from planner.errors import ModelError

log = logging.getLogger(__name__)

FLOAT_TYPES = frozenset({TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.BFLOAT16, TensorProto.DOUBLE,
                         TensorProto.FLOAT8E4M3FN, TensorProto.FLOAT8E5M2})
# bytes per element as stored for integer/bool tensors; floats are costed at 2 bytes (bf16 training)
_INT_BYTES = {TensorProto.INT64: 8, TensorProto.UINT64: 8, TensorProto.INT32: 4, TensorProto.UINT32: 4,
              TensorProto.INT16: 2, TensorProto.UINT16: 2, TensorProto.INT8: 1, TensorProto.UINT8: 1,
              TensorProto.BOOL: 1}
_STORED_FLOAT_BYTES = {TensorProto.FLOAT: 4, TensorProto.FLOAT16: 2, TensorProto.BFLOAT16: 2, TensorProto.DOUBLE: 8,
                       TensorProto.FLOAT8E4M3FN: 1, TensorProto.FLOAT8E5M2: 1}
ACT_BYTES = 2  # bf16 activations and weights (planner.types conventions)

# (op_type, input index) slots that hold parameters (used to tell weight graph inputs from data inputs)
PARAM_SLOTS = {
    "Conv": (1, 2), "ConvTranspose": (1, 2), "Gemm": (1, 2), "BatchNormalization": (1, 2, 3, 4),
    "LayerNormalization": (1, 2), "InstanceNormalization": (1, 2), "GroupNormalization": (1, 2),
    "SimplifiedLayerNormalization": (1,), "RMSNormalization": (1,), "SkipLayerNormalization": (2, 3, 4),
    "Gather": (0,), "EmbeddingBag": (0,), "PRelu": (1,),
}
# running statistics are buffers, not trainable parameters
_NOT_PARAMS = {"BatchNormalization": (3, 4)}
_ELEMENTWISE_BINARY = frozenset({"Add", "Sub", "Mul", "Div"})
# ops whose output is constant once every dimension is bound
_SHAPE_OPS = frozenset({"Shape", "Size"})


def stored_bytes(elem_type: int) -> int:
    """Bytes per element of a tensor as stored on disk (for embedding-table sizes)."""
    return _STORED_FLOAT_BYTES.get(elem_type) or _INT_BYTES.get(elem_type, 4)


def act_bytes(elem_type: int | None) -> int:
    """Bytes per element of an activation in training: 2 for floats (bf16), the stored size otherwise."""
    if elem_type is None or elem_type in FLOAT_TYPES:
        return ACT_BYTES
    return _INT_BYTES.get(elem_type, ACT_BYTES)


@dataclass
class Node:
    index: int  # position in topological order
    name: str
    op_type: str
    domain: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    proto: onnx.NodeProto
    scope: tuple[str, ...] = ()

    def attr(self, name: str, default):
        """An attribute's value, of the same kind as ``default`` (int, list of ints, or bytes)."""
        for a in self.proto.attribute:
            if a.name == name:
                value = onnx.helper.get_attribute_value(a)
                if isinstance(default, int) and isinstance(value, int):
                    return value
                if isinstance(default, list) and isinstance(value, list) and all(isinstance(v, int) for v in value):
                    return value
                if isinstance(default, bytes) and isinstance(value, (bytes, str)):
                    return value
                raise ModelError(f"node '{self.name or self.op_type}' ({self.op_type}): attribute '{name}' has "
                                 f"an unexpected type; the file is corrupted or not valid ONNX")
        return default


@dataclass
class OpGraph:
    name: str
    nodes: list[Node]
    shapes: dict[str, tuple[int, ...] | None]
    types: dict[str, int]
    const: set[str]  # tensors that do not depend on the data inputs (weights, shapes, constants)
    params: dict[str, int]  # parameter tensor -> element count
    param_roots: dict[str, tuple[str, ...]]  # constant tensor -> the parameters it is computed from
    data_inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    producer: dict[str, int] = field(default_factory=dict)
    consumers: dict[str, list[int]] = field(default_factory=dict)
    batch: int = 1  # bound batch (reporting)
    static_batch: int = 1  # a batch fixed inside the graph; costs are divided by it
    dims: dict[str, int] = field(default_factory=dict)
    family: str | None = None
    warnings: list[str] = field(default_factory=list)
    _numels: dict[str, int | None] = field(default_factory=dict, repr=False)

    def numel(self, tensor: str) -> int | None:
        cache = self._numels
        if tensor in cache:
            return cache[tensor]
        shape = self.shapes.get(tensor)
        n = None if shape is None else _numel(shape)
        cache[tensor] = n
        return n

    def is_compute(self, node: Node) -> bool:
        return not all((t in self.const) for t in node.outputs if t)


# ------------------------------------------------------------------------------------------ building


def build(model: onnx.ModelProto, dims: Mapping[str, int] | None, name: str) -> OpGraph:
    graph = model.graph
    init_names = {t.name for t in graph.initializer}
    nodes = _topological(graph, init_names, name)
    consumers: dict[str, list[tuple[Node, int]]] = {}
    for node in nodes:
        for slot, t in enumerate(node.inputs):
            if t:
                consumers.setdefault(t, []).append((node, slot))

    weight_inputs, data_inputs = _classify_inputs(graph, init_names, consumers)
    meta = {p.key: p.value for p in model.metadata_props}
    family = meta.get("planner.family") or None
    bound, user_batch, static_batch = _bind_dims(graph, data_inputs, dims or {}, meta, name)
    batch_dim = _batch_name(graph, data_inputs)
    declared = _prepare(model, bound, data_inputs)
    shapes, types = _infer_shapes(model, declared, name)
    const, param_roots, params = _constants(graph, nodes, init_names, weight_inputs, types, shapes, consumers)
    shapes, types = _fold_and_reinfer(model, nodes, const, shapes, types, declared, name)
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
    _fill_shape_gaps(op)
    return op


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
        stuck = next(i for i in range(len(protos)) if waiting[i] > 0)
        p = protos[stuck]
        raise ModelError(f"{name}: the graph has a cycle through node '{p.name or p.op_type}' "
                         f"({p.op_type}); ONNX graphs must be acyclic")
    nodes = []
    for k, i in enumerate(order):
        p = protos[i]
        nodes.append(Node(k, p.name, p.op_type, p.domain, inputs_of[i], tuple(p.output), p, _scope(p)))
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


_VIEW_CHAIN = frozenset({"Transpose", "Reshape", "Identity", "Cast", "Unsqueeze", "Squeeze", "Flatten", "CastLike"})


def _classify_inputs(graph: onnx.GraphProto, init_names: set[str],
                     consumers: dict[str, list[tuple[Node, int]]]) -> tuple[set[str], list[str]]:
    """Split graph inputs into weights (exports with export_params=False) and data inputs.

    A data input has a symbolic dim or a non-float type. A float input with static dims is a weight when it
    reaches a parameter slot (a Conv/Gemm weight, a MatMul's 2-D right operand, a norm's scale...) directly
    or through view ops (``MatMul(x, Transpose(W))`` of every TorchScript ``nn.Linear``), or when the graph
    already has a data input (a ViT's class token and position embeddings used by Expand/Concat/Add); the
    first float input of a graph without any other data input is data (a fixed-shape image)."""
    weights: set[str] = set()
    data: list[str] = []
    for vi in graph.input:
        if vi.name in init_names:
            continue
        ttype = vi.type.tensor_type
        dims = ttype.shape.dim if ttype.HasField("shape") else ()
        symbolic = any(not d.HasField("dim_value") for d in dims) or not ttype.HasField("shape")
        if ttype.elem_type not in FLOAT_TYPES or symbolic or not consumers.get(vi.name):
            data.append(vi.name)
        elif data or _reaches_param_slot(vi.name, len(dims), consumers):
            weights.add(vi.name)
        else:
            data.append(vi.name)
    return weights, data


def _reaches_param_slot(tensor: str, rank: int, consumers: dict[str, list[tuple[Node, int]]]) -> bool:
    frontier = [tensor]
    for _ in range(4):
        following: list[str] = []
        for t in frontier:
            for node, slot in consumers.get(t, ()):
                if _param_slot(node, slot, rank):
                    return True
                if node.op_type in _VIEW_CHAIN and slot == 0:
                    following.extend(o for o in node.outputs if o)
        frontier = following
    return False


def _param_slot(node: Node, slot: int, rank: int) -> bool:
    if slot in PARAM_SLOTS.get(node.op_type, ()):
        return True
    if node.op_type == "MatMul" and slot == 1 and rank == 2:
        return True
    if node.op_type in _ELEMENTWISE_BINARY and rank <= 1:
        return True
    return False


def _batch_name(graph: onnx.GraphProto, data_inputs: list[str]) -> str | None:
    names = _input_dim_names(graph, data_inputs)
    if any(d == "batch" for _, _, d in names):
        return "batch"
    for _, pos, d in names:
        if pos == 0:
            return d
    return None


def _input_dim_names(graph: onnx.GraphProto, data_inputs: list[str]) -> list[tuple[str, int, str]]:
    wanted = set(data_inputs)
    out = []
    for vi in graph.input:
        if vi.name in wanted and vi.type.tensor_type.HasField("shape"):
            for pos, d in enumerate(vi.type.tensor_type.shape.dim):
                if not d.HasField("dim_value"):
                    out.append((vi.name, pos, d.dim_param or f"{vi.name}[{pos}]"))
    return out


def _bind_dims(graph: onnx.GraphProto, data_inputs: list[str], dims: Mapping[str, int], meta: dict[str, str],
               name: str) -> tuple[dict[str, int], int, int]:
    """Values for every symbolic dim of the data inputs; the batch dim is bound to 1 (costs are per sample).

    Returns (bindings used for shape inference, the user's batch, a batch fixed inside the graph)."""
    defaults: dict[str, int] = {}
    if "planner.default_dims" in meta:
        try:
            raw = json.loads(meta["planner.default_dims"])
            defaults = {str(k): int(v) for k, v in raw.items()}
        except (ValueError, TypeError, AttributeError):
            raise ModelError(f"{name}: metadata 'planner.default_dims' is not a JSON object of integers; "
                             f"rebuild the model with 'planner models build'") from None
    batch_dim = _batch_name(graph, data_inputs)
    user_batch = int(dims.get(batch_dim or "batch", dims.get("batch", 1)))
    bound: dict[str, int] = {}
    for inp, pos, dim in _input_dim_names(graph, data_inputs):
        if dim == batch_dim:
            bound[dim] = 1
        elif dim in dims:
            bound[dim] = int(dims[dim])
        elif dim in defaults:
            bound[dim] = defaults[dim]
        elif dim not in bound:
            raise ModelError(f"{name}: symbolic dimension '{dim}' of input '{inp}' is not bound; "
                             f"pass --dim {dim}=INT (Python: dims={{'{dim}': INT}})")
    known = {d for _, _, d in _input_dim_names(graph, data_inputs)} | {"batch"}
    for dim in dims:
        if dim not in known:
            log.info("%s: --dim %s does not name a symbolic dimension of the model; ignored", name, dim)
    static_batch = 1
    if batch_dim is None:
        leading = set()
        wanted = set(data_inputs)
        for vi in graph.input:
            if vi.name in wanted and vi.type.tensor_type.HasField("shape"):
                d = vi.type.tensor_type.shape.dim
                if len(d) >= 2 and d[0].HasField("dim_value"):
                    leading.add(d[0].dim_value)
                else:
                    leading.add(None)
        if len(leading) == 1 and None not in leading and next(iter(leading)) > 1:
            static_batch = next(iter(leading))
    return bound, user_batch, static_batch


def _prepare(model: onnx.ModelProto, bound: dict[str, int], data_inputs: list[str]):
    """Bind every symbolic input dim, in place on a model the importer owns (no copy of a 100k-node graph):
    large initializers keep their dims and type but lose their data (never used), and the exporter's own
    value_info is set aside (returned), to be used only where inference leaves a gap."""
    g = model.graph
    data_set = set(data_inputs)
    for vi in g.input:
        if vi.name in data_set:
            for d in vi.type.tensor_type.shape.dim:
                if not d.HasField("dim_value"):
                    value = bound.get(d.dim_param, 1)
                    d.Clear()
                    d.dim_value = value
    for t in g.initializer:
        if t.data_location == TensorProto.EXTERNAL or _numel(t.dims) > 4096:
            keep = (t.name, t.data_type, list(t.dims))
            t.Clear()
            t.name, t.data_type = keep[0], keep[1]
            t.dims.extend(keep[2])
    declared = _read_shapes(list(g.value_info) + list(g.output), bound)
    del g.value_info[:]
    for vi in g.output:
        vi.type.tensor_type.ClearField("shape")
    return declared


def _infer_shapes(model: onnx.ModelProto, declared, name: str):
    """ONNX shape inference (with data propagation); declared shapes fill its gaps."""
    try:
        inferred = onnx.shape_inference.infer_shapes(model, check_type=False, strict_mode=False, data_prop=True)
    except (onnx.shape_inference.InferenceError, RuntimeError, ValueError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ModelError(f"{name}: ONNX shape inference failed: {first}") from None
    ig = inferred.graph
    shapes, types = _read_shapes(list(ig.input) + list(ig.value_info) + list(ig.output), {})
    for t in model.graph.initializer:
        shapes[t.name] = tuple(t.dims)
        types[t.name] = t.data_type
    for tensor, shape in declared[0].items():
        if shapes.get(tensor) is None and shape is not None:
            shapes[tensor] = shape
            types.setdefault(tensor, declared[1].get(tensor, 0))
    return shapes, types


def _fold_and_reinfer(model: onnx.ModelProto, nodes: list[Node], const: set[str], shapes: dict, types: dict,
                      declared, name: str):
    """Where inference left compute tensors unknown, evaluate the (now constant) shape arithmetic and run
    inference again, until nothing more is learnt (at most three more passes)."""
    from planner.graph import fold

    def unknown() -> int:
        return sum(1 for n in nodes if n.outputs and n.outputs[0] and n.outputs[0] not in const
                   and shapes.get(n.outputs[0]) is None)

    missing = unknown()
    for _ in range(3):
        if not missing:
            break
        initial = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer
                   if t.data_location != TensorProto.EXTERNAL and 0 < _numel(t.dims) <= fold.MAX_ELEMENTS
                   and _has_data(t)}
        values = fold.evaluate(nodes, const, shapes, initial)
        if not fold.inject(nodes, values):
            break
        shapes, types = _infer_shapes(model, declared, name)
        now = unknown()
        if now >= missing:
            break
        missing = now
    return shapes, types


def _has_data(t: TensorProto) -> bool:
    return bool(t.raw_data or t.float_data or t.int32_data or t.int64_data or t.double_data or t.uint64_data)


def _read_shapes(infos: list[onnx.ValueInfoProto], bound: dict[str, int]):
    """(shape or None, elem type) of tensor value infos; symbolic dims resolved through ``bound``."""
    shapes: dict[str, tuple[int, ...] | None] = {}
    types: dict[str, int] = {}
    for vi in infos:
        if not vi.type.HasField("tensor_type"):
            continue
        tt = vi.type.tensor_type
        if tt.elem_type:
            types[vi.name] = tt.elem_type
        if not tt.HasField("shape"):
            continue
        dims = [d.dim_value for d in tt.shape.dim]
        if 0 in dims:
            dims = [d.dim_value if d.HasField("dim_value") else bound.get(d.dim_param, -1) for d in tt.shape.dim]
        shapes[vi.name] = tuple(dims) if -1 not in dims else None
    return shapes, types


def _numel(dims) -> int:
    n = 1
    for d in dims:
        n *= d
    return n


def _constants(graph: onnx.GraphProto, nodes: list[Node], init_names: set[str], weight_inputs: set[str],
               types: dict[str, int], shapes: dict, consumers: dict[str, list[tuple[Node, int]]]):
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
        return n > 1 or _reaches_param_slot(tensor, 1, consumers)

    for t in graph.initializer:
        n = _numel(t.dims)
        if t.data_type in FLOAT_TYPES and counts(t.name, n) and len(t.dims) > 0:
            params[t.name] = n
            roots[t.name] = (t.name,)
    for t in weight_inputs:
        shape = shapes.get(t)
        n = _numel(shape) if shape else 0
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
                    n = _numel(shape) if shape else 0
                    if counts(out, n):
                        params[out] = n
                        roots[out] = (out,)
                        continue
                if rs and node.op_type not in _SHAPE_OPS:
                    roots[out] = rs
    return const, roots, params


# ------------------------------------------------------------------------------ shape gap filling

_UNARY_SAME_SHAPE = frozenset({
    "Relu", "Sigmoid", "Tanh", "Erf", "Gelu", "Exp", "Log", "Sqrt", "Neg", "Abs", "Reciprocal", "Cast",
    "Identity", "Dropout", "Softmax", "LogSoftmax", "LayerNormalization", "BatchNormalization", "LeakyRelu",
    "Elu", "Selu", "HardSigmoid", "HardSwish", "Softplus", "Mish", "Clip", "Sin", "Cos", "Not", "Floor", "Ceil",
    "Round", "Sign", "SimplifiedLayerNormalization", "RMSNormalization", "InstanceNormalization",
    "GroupNormalization", "CumSum", "IsNaN", "IsInf", "FastGelu", "QuickGelu", "BiasGelu",
})
_BROADCAST = frozenset({"Add", "Sub", "Mul", "Div", "Pow", "Max", "Min", "Sum", "Mean", "Where", "Equal", "Less",
                        "Greater", "LessOrEqual", "GreaterOrEqual", "And", "Or", "Xor", "Mod", "PRelu"})


def _fill_shape_gaps(op: OpGraph) -> None:
    """Propagate shapes through simple ops where ONNX inference left a gap (custom domains, functions)."""
    shapes = op.shapes
    missing: dict[str, int] = {}
    for node in op.nodes:
        if not node.outputs or not node.outputs[0] or shapes.get(node.outputs[0]) is not None:
            continue
        ins = [shapes.get(t) for t in node.inputs if t]
        out = None
        if node.op_type in _UNARY_SAME_SHAPE and ins and ins[0] is not None:
            out = ins[0]
        elif node.op_type in _BROADCAST and ins and all(s is not None for s in ins):
            out = _broadcast([s for s in ins if s is not None])
        if out is not None:
            shapes[node.outputs[0]] = out
            if node.outputs[0] not in op.types and node.inputs and node.inputs[0] in op.types:
                op.types[node.outputs[0]] = op.types[node.inputs[0]]
        elif op.is_compute(node):
            missing[node.op_type] = missing.get(node.op_type, 0) + 1
    if missing:
        which = ", ".join(f"{k} {v}" for k, v in sorted(missing.items()))
        msg = (f"{sum(missing.values())} computed tensors have unknown shapes after shape inference ({which}); "
               f"their ops are costed as zero")
        log.warning("%s: %s", op.name, msg)
        op.warnings.append(msg)


def _broadcast(shapes: list[tuple[int, ...]]) -> tuple[int, ...]:
    rank = max(len(s) for s in shapes)
    out = []
    for i in range(rank):
        d = 1
        for s in shapes:
            j = i - (rank - len(s))
            if j >= 0 and s[j] != 1:
                d = s[j]
        out.append(d)
    return tuple(out)
