"""Tensor shapes for one sample: ONNX shape inference on the model with its dims bound, the evaluation of
shape arithmetic it cannot follow (see fold.py), the exporter's declared shapes, and simple propagation
through ops inference does not know."""

from __future__ import annotations

import onnx
from onnx import TensorProto, numpy_helper

from planner.errors import ModelError
from planner.graph import fold
from planner.graph.inputs import dim_name
from planner.graph.ir import FLOAT_TYPES, INT_BYTES, Node, OpGraph, numel_of

Shapes = dict[str, "tuple[int, ...] | None"]  # tensor -> its shape for one sample (None: unknown)
Types = dict[str, int]  # tensor -> ONNX element type
Declared = tuple[Shapes, Types]  # what the exporter's own value_info says

def prepare(model: onnx.ModelProto, bound: dict[str, int], data_inputs: list[str]) -> Declared:
    """Bind every symbolic input dim, in place on a model the importer owns (no copy of a 100k-node graph):
    large initializers keep their dims and type but lose their data (never used), and the exporter's own
    value_info is set aside (returned), to be used only where inference leaves a gap."""
    g = model.graph
    data_set = set(data_inputs)
    for vi in g.input:
        if vi.name in data_set:
            for pos, d in enumerate(vi.type.tensor_type.shape.dim):
                if not d.HasField("dim_value"):
                    value = bound.get(dim_name(vi.name, pos, d), 1)
                    d.Clear()
                    d.dim_value = value
    for t in g.initializer:
        if t.data_location == TensorProto.EXTERNAL or numel_of(t.dims) > fold.MAX_ELEMENTS:
            keep = (t.name, t.data_type, list(t.dims))
            t.Clear()
            t.name, t.data_type = keep[0], keep[1]
            t.dims.extend(keep[2])
    declared = _read_shapes(list(g.value_info) + list(g.output), bound)
    del g.value_info[:]
    for vi in g.output:
        vi.type.tensor_type.ClearField("shape")
    return declared


def infer_shapes(model: onnx.ModelProto, declared: Declared, name: str) -> tuple[Shapes, Types]:
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


def fold_and_reinfer(model: onnx.ModelProto, nodes: list[Node], const: set[str], shapes: Shapes, types: Types,
                      declared: Declared, name: str) -> tuple[Shapes, Types]:
    """Where inference left compute tensors unknown, evaluate the (now constant) shape arithmetic and run
    inference again, until nothing more is learnt (at most three more passes)."""

    def unknown() -> int:
        return sum(1 for n in nodes if n.outputs and n.outputs[0] and n.outputs[0] not in const
                   and shapes.get(n.outputs[0]) is None)

    missing = unknown()
    for _ in range(3):
        if not missing:
            break
        values = fold.evaluate(nodes, const, shapes, small_initializers(model))
        if not fold.inject(nodes, values):
            break
        shapes, types = infer_shapes(model, declared, name)
        now = unknown()
        if now >= missing:
            break
        missing = now
    return shapes, types


_NUMERIC = FLOAT_TYPES | frozenset(INT_BYTES)


def small_initializers(model: onnx.ModelProto) -> dict[str, "fold.Value"]:
    """The values of the initializers small enough for :mod:`planner.graph.fold` to read (inline numeric data
    of at most ``fold.MAX_ELEMENTS`` elements that matches its dims: shapes and indices, never weights)."""
    return {t.name: numpy_helper.to_array(t) for t in model.graph.initializer
            if t.data_location != TensorProto.EXTERNAL and 0 < numel_of(t.dims) <= fold.MAX_ELEMENTS
            and t.data_type in _NUMERIC and has_data(t) and _data_size_ok(t)}


def _data_size_ok(t: TensorProto) -> bool:
    """Does the stored data match the dims (a corrupted file may say otherwise)?"""
    n = numel_of(t.dims)
    if t.raw_data:
        return len(t.raw_data) == n * onnx.helper.tensor_dtype_to_np_dtype(t.data_type).itemsize
    typed = len(t.float_data) + len(t.int32_data) + len(t.int64_data) + len(t.double_data) + len(t.uint64_data)
    return typed == n


def has_data(t: TensorProto) -> bool:
    """Does ``t`` hold inline data? (HasField and len, so that a large tensor's bytes are not copied.)"""
    return t.HasField("raw_data") or any(len(field) for field in (t.float_data, t.int32_data, t.int64_data,
                                                                   t.double_data, t.uint64_data))


def _read_shapes(infos: list[onnx.ValueInfoProto], bound: dict[str, int]) -> tuple[Shapes, Types]:
    """(shape or None, elem type) of tensor value infos; symbolic dims resolved through ``bound``."""
    shapes: Shapes = {}
    types: Types = {}
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


_UNARY_SAME_SHAPE = frozenset({
    "Relu", "Sigmoid", "Tanh", "Erf", "Gelu", "Exp", "Log", "Sqrt", "Neg", "Abs", "Reciprocal", "Cast",
    "Identity", "Dropout", "Softmax", "LogSoftmax", "LayerNormalization", "BatchNormalization", "LeakyRelu",
    "Elu", "Selu", "HardSigmoid", "HardSwish", "Softplus", "Mish", "Clip", "Sin", "Cos", "Not", "Floor", "Ceil",
    "Round", "Sign", "SimplifiedLayerNormalization", "RMSNormalization", "InstanceNormalization",
    "GroupNormalization", "CumSum", "IsNaN", "IsInf", "FastGelu", "QuickGelu", "BiasGelu",
})


_BROADCAST = frozenset({"Add", "Sub", "Mul", "Div", "Pow", "Max", "Min", "Sum", "Mean", "Where", "Equal", "Less",
                        "Greater", "LessOrEqual", "GreaterOrEqual", "And", "Or", "Xor", "Mod", "PRelu"})


COSTED_AS_ZERO = "their ops are costed as zero"  # the end of the unknown-shapes warning


def fill_shape_gaps(op: OpGraph) -> None:
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
               f"{COSTED_AS_ZERO}")
        op.warnings.append(msg)  # logged by the importer once the import succeeds


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
