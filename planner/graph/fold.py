"""Evaluate the shape arithmetic of a graph once every dimension is bound.

Exporters compute sizes at run time (``Range(0, Cast(Gather(Shape(ids), 1)), 1)`` for positions,
``Min(256, seq)`` for a slice end); ONNX data propagation does not follow all of these ops, which leaves
attention tensors with unknown shapes. With every symbolic dimension bound these subgraphs are constant:
this module evaluates them with numpy (small integer tensors only, never weights) so that the importer can
hand the values back to shape inference as ``Constant`` nodes.
"""

from __future__ import annotations

from typing import Callable

import numpy as np
import onnx
from onnx import numpy_helper

from planner.graph.ir import Node, numel_of

_ONNX_TYPES = frozenset(onnx.TensorProto.DataType.values())
MAX_ELEMENTS = 4096  # evaluate only small tensors (shapes, indices, positions), never weights or masks

Value = np.ndarray
Evaluator = Callable[[Node, list], "Value | None"]


def _np_dtype(elem_type: int) -> np.dtype:
    return onnx.helper.tensor_dtype_to_np_dtype(elem_type)


def _constant(node: Node, ins: list) -> Value | None:
    for a in node.proto.attribute:
        if a.name == "value" and a.type == onnx.AttributeProto.TENSOR:
            t = a.t
            if t.data_location == onnx.TensorProto.EXTERNAL or numel_of(t.dims) > MAX_ELEMENTS:
                return None
            return numpy_helper.to_array(t)
        if a.name == "value_int":
            return np.array(a.i, np.int64)
        if a.name == "value_ints":
            return np.array(list(a.ints), np.int64)
        if a.name == "value_float":
            return np.array(a.f, np.float32)
        if a.name == "value_floats":
            return np.array(list(a.floats), np.float32)
    return None


def _axes(node: Node, ins: list, slot: int) -> list[int] | None:
    if len(ins) > slot and ins[slot] is not None:
        return [int(v) for v in np.atleast_1d(ins[slot])]
    axes = node.attr("axes", [])
    return list(axes) if axes else None


def _unsqueeze(node: Node, ins: list) -> Value:
    x = ins[0]
    axes = _axes(node, ins, 1) or []
    rank = x.ndim + len(axes)
    for axis in sorted(a % rank for a in axes):
        x = np.expand_dims(x, axis)
    return x


def _squeeze(node: Node, ins: list) -> Value:
    axes = _axes(node, ins, 1)
    return np.squeeze(ins[0], axis=tuple(axes) if axes else None)


def _slice(node: Node, ins: list) -> Value:
    x = ins[0]
    if len(ins) >= 3:
        starts, ends = [int(v) for v in ins[1]], [int(v) for v in ins[2]]
        axes = [int(v) for v in ins[3]] if len(ins) > 3 and ins[3] is not None else list(range(len(starts)))
        steps = [int(v) for v in ins[4]] if len(ins) > 4 and ins[4] is not None else [1] * len(starts)
    else:
        starts, ends = node.attr("starts", []), node.attr("ends", [])
        axes = node.attr("axes", []) or list(range(len(starts)))
        steps = [1] * len(starts)
    index = [slice(None)] * x.ndim
    for start, end, axis, step in zip(starts, ends, axes, steps):
        index[axis] = slice(start, end, step)
    return x[tuple(index)]


def _div(node: Node, ins: list) -> Value:
    a, b = ins
    if np.issubdtype(a.dtype, np.integer):
        return (np.trunc(a / b)).astype(a.dtype)
    return a / b


def _reshape(node: Node, ins: list) -> Value:
    shape = [int(v) for v in ins[1]]
    shape = [ins[0].shape[i] if v == 0 else v for i, v in enumerate(shape)]
    return ins[0].reshape(shape)


def _range(node: Node, ins: list) -> Value | None:
    start, limit, delta = (np.asarray(v).reshape(-1)[0].item() for v in ins)
    if delta == 0 or not 0 <= (limit - start) / delta <= MAX_ELEMENTS:
        return None
    return np.arange(start, limit, delta, dtype=np.asarray(ins[0]).dtype)


def _target(shape: Value) -> list[int] | None:
    """A shape operand as a list of ints, or None when it would make a tensor too large to evaluate."""
    dims = [int(v) for v in np.atleast_1d(shape)]
    if any(d < 0 for d in dims) or numel_of(dims) > MAX_ELEMENTS:
        return None
    return dims


def _cast(node: Node, ins: list) -> Value | None:
    to = node.attr("to", 1)
    if to not in _ONNX_TYPES or to in (onnx.TensorProto.UNDEFINED, onnx.TensorProto.STRING):
        return None  # not an ONNX type: a corrupted file
    return ins[0].astype(_np_dtype(to))


def _constant_of_shape(node: Node, ins: list) -> Value | None:
    value = np.zeros(1, np.float32)
    for a in node.proto.attribute:
        if a.name == "value":
            value = numpy_helper.to_array(a.t)
    dims = _target(ins[0])
    if dims is None or value.size == 0:
        return None
    return np.full(dims, value.reshape(-1)[0], dtype=value.dtype)


def _expand(node: Node, ins: list) -> Value | None:
    dims = _target(ins[1])
    if dims is None:
        return None
    return ins[0] * np.ones(dims, dtype=ins[0].dtype)


def _tile(node: Node, ins: list) -> Value | None:
    repeats = _target(ins[1])
    if repeats is None or ins[0].size * numel_of(repeats) > MAX_ELEMENTS:
        return None
    return np.tile(ins[0], repeats)


def _reduce(fn: Callable[..., np.ndarray]) -> Evaluator:
    def run(node: Node, ins: list) -> Value:
        axes = _axes(node, ins, 1)
        keep = bool(node.attr("keepdims", 1))
        return np.asarray(fn(ins[0], axis=tuple(axes) if axes else None, keepdims=keep))
    return run


EVALUATORS: dict[str, Evaluator] = {
    "Constant": _constant,
    "Identity": lambda n, i: i[0],
    "Cast": _cast,
    "Gather": lambda n, i: np.take(i[0], i[1].astype(np.int64), axis=n.attr("axis", 0)),
    "Unsqueeze": _unsqueeze,
    "Squeeze": _squeeze,
    "Concat": lambda n, i: np.concatenate([np.atleast_1d(v) for v in i], axis=n.attr("axis", 0)),
    "Slice": _slice,
    "Range": _range,
    "Reshape": _reshape,
    "Expand": _expand,
    "ConstantOfShape": _constant_of_shape,
    "Add": lambda n, i: i[0] + i[1],
    "Sub": lambda n, i: i[0] - i[1],
    "Mul": lambda n, i: i[0] * i[1],
    "Div": _div,
    "Mod": lambda n, i: np.fmod(i[0], i[1]) if n.attr("fmod", 0) else np.mod(i[0], i[1]),
    "Neg": lambda n, i: -i[0],
    "Abs": lambda n, i: np.abs(i[0]),
    "Min": lambda n, i: np.minimum.reduce(i),
    "Max": lambda n, i: np.maximum.reduce(i),
    "Equal": lambda n, i: np.equal(i[0], i[1]),
    "Less": lambda n, i: np.less(i[0], i[1]),
    "LessOrEqual": lambda n, i: np.less_equal(i[0], i[1]),
    "Greater": lambda n, i: np.greater(i[0], i[1]),
    "GreaterOrEqual": lambda n, i: np.greater_equal(i[0], i[1]),
    "Not": lambda n, i: np.logical_not(i[0]),
    "And": lambda n, i: np.logical_and(i[0], i[1]),
    "Or": lambda n, i: np.logical_or(i[0], i[1]),
    "Where": lambda n, i: np.where(i[0], i[1], i[2]),
    "Floor": lambda n, i: np.floor(i[0]),
    "Ceil": lambda n, i: np.ceil(i[0]),
    "Sqrt": lambda n, i: np.sqrt(i[0]),
    "Transpose": lambda n, i: np.transpose(i[0], n.attr("perm", []) or None),
    "ReduceProd": _reduce(np.prod),
    "ReduceSum": _reduce(np.sum),
    "ReduceMax": _reduce(np.max),
    "ReduceMin": _reduce(np.min),
    "Tile": _tile,
}


def evaluate(nodes: list[Node], const: set[str], shapes: dict, initial: dict[str, Value]) -> dict[str, Value]:
    """Values of the small constant tensors (topological order). ``initial`` holds the initializers with
    data; Shape and Size read ``shapes``. A node that cannot be evaluated leaves its outputs unknown."""
    values = dict(initial)
    for node in nodes:
        if not node.outputs or node.outputs[0] not in const:
            continue
        # the proto's op and inputs: an earlier pass may have turned this node into a Constant (inject), whose
        # attributes and inputs are no longer those of its op_type (a Shape's start and end)
        op_type = node.proto.op_type
        if op_type in ("Shape", "Size"):
            shape = shapes.get(node.inputs[0])
            if shape is None:
                continue
            if op_type == "Size":
                values[node.outputs[0]] = np.array(numel_of(shape), np.int64)
            else:
                start, end = node.attr("start", 0), node.attr("end", len(shape))
                values[node.outputs[0]] = np.array(shape[start:end], np.int64)
            continue
        fn = EVALUATORS.get(op_type)
        if fn is None or len(node.outputs) != 1:
            continue
        inputs = node.proto.input  # none once turned into a Constant
        ins = [values.get(t) if t else None for t in inputs]
        required = [v for t, v in zip(inputs, ins) if t]
        if any(v is None or v.dtype.kind not in "biuf" for v in required):
            continue
        try:
            with np.errstate(all="ignore"):
                out = fn(node, ins)
        except (ValueError, IndexError, TypeError, KeyError):
            # arithmetic numpy refuses (mismatched shapes, bad axes in a corrupted or unusual graph): the
            # tensor stays unknown, exactly as when ONNX inference cannot follow it
            continue
        if out is not None and np.asarray(out).size <= MAX_ELEMENTS:
            values[node.outputs[0]] = np.asarray(out)
    return values


def inject(nodes: list[Node], values: dict[str, Value]) -> int:
    """Turn the nodes that computed integer values into ``Constant`` nodes of the model (in place), so the
    next shape-inference pass sees them. Returns how many nodes were rewritten."""
    count = 0
    for node in nodes:
        if node.proto.op_type == "Constant" or len(node.outputs) != 1:
            continue
        value = values.get(node.outputs[0])
        if value is None or value.dtype.kind not in "iub":
            continue
        proto = node.proto
        del proto.input[:]
        del proto.attribute[:]
        proto.op_type, proto.domain = "Constant", ""
        proto.attribute.append(onnx.helper.make_attribute("value", numpy_helper.from_array(value)))
        count += 1
    return count
