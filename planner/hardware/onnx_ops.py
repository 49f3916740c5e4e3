"""A minimal per-op cost table of a shape-complete ONNX graph, for the profiler and its benchmark.

For each node: its op class, FLOPs, bytes moved and, for GEMM-like ops, the implicit (m, n, k). Shapes come
from ``onnx.shape_inference`` on a model whose inputs have fixed sizes. This is deliberately small: the
planner's own importer (``planner.graph``) carries the full rule set; this table only has to cover the ops
that onnxruntime runs for the profiler's models.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable

import onnx
from onnx import TensorProto, helper

from planner.errors import ModelError

OP_CLASSES: dict[str, str] = {}
for _op in ("MatMul", "Gemm", "FusedMatMul", "MatMulInteger"):
    OP_CLASSES[_op] = "gemm"
for _op in ("Conv", "ConvTranspose", "FusedConv"):
    OP_CLASSES[_op] = "conv"
for _op in ("Add", "Sub", "Mul", "Div", "Relu", "Sigmoid", "Tanh", "Erf", "Gelu", "Pow", "Sqrt", "Exp", "Log", "Neg",
            "Abs", "Clip", "Where", "Cast", "LeakyRelu", "HardSigmoid", "Dropout", "Not", "Equal", "Less", "Greater",
            "Reciprocal", "Min", "Max", "Sum", "Mean", "FastGelu", "BiasGelu", "HardSwish", "Softplus", "Elu"):
    OP_CLASSES[_op] = "elementwise"
for _op in ("LayerNormalization", "BatchNormalization", "InstanceNormalization", "SkipLayerNormalization",
            "SimplifiedLayerNormalization", "RMSNormalization", "ReduceMean", "ReduceSum", "ReduceMax", "ReduceL2"):
    OP_CLASSES[_op] = "normalization"
for _op in ("Softmax", "LogSoftmax"):
    OP_CLASSES[_op] = "softmax"
for _op in ("MaxPool", "AveragePool", "GlobalAveragePool", "GlobalMaxPool"):
    OP_CLASSES[_op] = "pooling"
for _op in ("Transpose", "Concat", "Split", "Slice", "Gather", "Expand", "Tile", "Pad", "Resize"):
    OP_CLASSES[_op] = "data_movement"
VIEW_OPS = frozenset({"Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity", "Shape", "Constant"})
for _op in VIEW_OPS:
    OP_CLASSES[_op] = "view"
# ops that reduce rows of their input (along ``axis``, by default the last): onnxruntime's kernels loop over
# rows (a max or mean pass, a sum, a reciprocal, loop setup per row), so short rows cost more than their elements
ROW_REDUCTIONS = frozenset({"Softmax", "LogSoftmax", "LayerNormalization", "SkipLayerNormalization",
                            "SimplifiedLayerNormalization", "RMSNormalization"})

# FLOPs per output element of element-wise and normalisation ops (a multiply-add is 2). A transcendental
# function counts as TRANSCENDENTAL_FLOPS: the arithmetic of the polynomial approximations that vector math
# libraries use (a range reduction plus a degree 5-7 polynomial); one for everything else.
TRANSCENDENTAL_FLOPS = 8.0
PER_ELEMENT_FLOPS = {"LayerNormalization": 8.0, "BatchNormalization": 2.0, "InstanceNormalization": 8.0,
                     "SkipLayerNormalization": 9.0, "SimplifiedLayerNormalization": 6.0, "RMSNormalization": 6.0,
                     "Softmax": 4.0 + TRANSCENDENTAL_FLOPS, "LogSoftmax": 4.0 + TRANSCENDENTAL_FLOPS,
                     "Erf": TRANSCENDENTAL_FLOPS, "Tanh": TRANSCENDENTAL_FLOPS, "Sigmoid": TRANSCENDENTAL_FLOPS,
                     "Exp": TRANSCENDENTAL_FLOPS, "Log": TRANSCENDENTAL_FLOPS, "Pow": TRANSCENDENTAL_FLOPS,
                     "Gelu": 4.0 + TRANSCENDENTAL_FLOPS, "FastGelu": 4.0 + TRANSCENDENTAL_FLOPS,
                     "Softplus": 2.0 + TRANSCENDENTAL_FLOPS, "Elu": 2.0 + TRANSCENDENTAL_FLOPS}

_DTYPE_BYTES = {TensorProto.FLOAT: 4, TensorProto.FLOAT16: 2, TensorProto.BFLOAT16: 2, TensorProto.DOUBLE: 8,
                TensorProto.INT64: 8, TensorProto.INT32: 4, TensorProto.INT8: 1, TensorProto.UINT8: 1,
                TensorProto.BOOL: 1}


@dataclass(frozen=True)
class NodeCost:
    name: str
    op_type: str
    op_class: str
    flops: float
    bytes: float
    gemm: tuple[int, int, int] | None = None
    # rows of a last-axis reduction (softmax, layer norm): each row pays a fixed cost (reductions, reciprocal)
    rows: int = 0
    outputs: int = 1  # output tensors the node writes
    # a view op's input and output bytes: free in a model (its output aliases its input), but a view timed
    # alone returns a graph output, which onnxruntime fills by copying (see profiler.predict_op_s)
    view_bytes: float = 0.0

    @property
    def kind(self) -> str:
        """The compute rate that applies (``planner.hardware.efficiency.OP_KINDS``)."""
        return self.op_class if self.op_class in ("gemm", "conv") else "vector"


def _shape_table(model: onnx.ModelProto) -> dict[str, tuple[tuple[int, ...], int]]:
    try:
        inferred = onnx.shape_inference.infer_shapes(model, strict_mode=False, data_prop=True)
    except Exception as exc:  # onnx raises several internal types for bad graphs
        raise ModelError(f"shape inference failed: {exc}") from None
    table: dict[str, tuple[tuple[int, ...], int]] = {}
    graph = inferred.graph
    for value in list(graph.input) + list(graph.value_info) + list(graph.output):
        tensor_type = value.type.tensor_type
        dims = tuple(d.dim_value if d.HasField("dim_value") else -1 for d in tensor_type.shape.dim)
        table[value.name] = (dims, _DTYPE_BYTES.get(tensor_type.elem_type, 4))
    for init in graph.initializer:
        table[init.name] = (tuple(init.dims), _DTYPE_BYTES.get(init.data_type, 4))
    return table


def _numel(shape: tuple[int, ...]) -> int:
    return math.prod(max(d, 1) for d in shape)


def _attr(node: onnx.NodeProto, name: str, default):
    for attribute in node.attribute:
        if attribute.name == name:
            return helper.get_attribute_value(attribute)
    return default


def node_costs(model: onnx.ModelProto) -> list[NodeCost]:
    """Cost of every node, in graph order. Every tensor must have a fixed shape (bind dims first)."""
    shapes = _shape_table(model)
    costs = []
    for index, node in enumerate(model.graph.node):
        name = node.name or f"{node.op_type}_{index}"
        costs.append(_node_cost(node, name, shapes))
    return costs


def _tensor(shapes, name: str) -> tuple[tuple[int, ...], int]:
    if not name:
        return (), 0
    if name not in shapes or any(d < 0 for d in shapes[name][0]):
        raise ModelError(f"tensor {name!r} has no fixed shape; bind symbolic dimensions with --dim NAME=INT")
    return shapes[name]


def _node_cost(node: onnx.NodeProto, name: str, shapes) -> NodeCost:
    op = node.op_type
    op_class = OP_CLASSES.get(op, "other")
    ins = [_tensor(shapes, i) for i in node.input]
    outs = [_tensor(shapes, o) for o in node.output]
    in_bytes = sum(_numel(s) * b for s, b in ins if b)
    out_bytes = sum(_numel(s) * b for s, b in outs if b)
    out_elems = sum(_numel(s) for s, b in outs if b)
    gemm = None
    if op in ("MatMul", "FusedMatMul"):
        (a, _), (b, _) = ins[0], ins[1]
        m, k = (a[-2] if len(a) > 1 else 1), a[-1]
        n = b[-1] if len(b) > 1 else 1
        batch = _numel(outs[0][0]) // max(m * n, 1)
        gemm = (batch * m, n, k)
        flops = 2.0 * batch * m * n * k
    elif op == "Gemm":
        (a, _), (b, _) = ins[0], ins[1]
        k = a[0] if _attr(node, "transA", 0) else a[1]
        m, n = outs[0][0][0], outs[0][0][1]
        gemm = (m, n, k)
        flops = 2.0 * m * n * k + (m * n if len(ins) > 2 else 0)
    elif op in ("Conv", "FusedConv"):
        weight = ins[1][0]
        out = outs[0][0]
        per_output = weight[1] * _numel(weight[2:])  # (Cin/groups) * kernel volume: W is [Cout, Cin/groups, k...]
        gemm = (out[0] * _numel(out[2:]), out[1], per_output)
        flops = 2.0 * _numel(out) * per_output + (_numel(out) if len(ins) > 2 else 0)
    elif op in ("MaxPool", "AveragePool"):
        flops = float(out_elems * _numel(tuple(_attr(node, "kernel_shape", [1]))))
    elif op in ("GlobalAveragePool", "GlobalMaxPool"):
        flops = float(_numel(ins[0][0]))
    elif op_class in ("elementwise", "normalization", "softmax"):
        per = PER_ELEMENT_FLOPS.get(op, 1.0)
        flops = per * max(out_elems, _numel(ins[0][0]) if ins else 0)
    else:
        flops = 0.0
    rows = 0
    if op in ROW_REDUCTIONS and ins and ins[0][0]:
        data = ins[0][0]
        axis = _attr(node, "axis", -1) % len(data)
        # softmax reduces one axis; the layer norms reduce every axis from ``axis`` on
        reduced = data[axis] if op in ("Softmax", "LogSoftmax") else _numel(data[axis:])
        rows = _numel(data) // max(reduced, 1)
    view_bytes = 2.0 * out_bytes if op in VIEW_OPS else 0.0  # one copy: read the input, write the output
    nbytes = 0.0 if op in VIEW_OPS else float(in_bytes + out_bytes)
    return NodeCost(name=name, op_type=op, op_class=op_class, flops=flops, bytes=nbytes, gemm=gemm, rows=rows,
                    outputs=max(1, sum(1 for o in node.output if o)), view_bytes=view_bytes)


def bind_inputs(model: onnx.ModelProto, dims: dict[str, int], default: int = 1) -> tuple[onnx.ModelProto, list[str]]:
    """A copy of the model whose graph inputs have fixed sizes: named symbolic dims from ``dims``, the rest
    ``default``. Returns the model and the names of dims that took the default."""
    bound = onnx.ModelProto()
    bound.CopyFrom(model)
    defaulted: list[str] = []
    initializers = {i.name for i in bound.graph.initializer}
    for value in bound.graph.input:
        if value.name in initializers:
            continue
        for dim in value.type.tensor_type.shape.dim:
            if dim.HasField("dim_value") and dim.dim_value > 0:
                continue
            symbol = dim.dim_param
            size = dims.get(symbol, default)
            if symbol not in dims:
                defaulted.append(symbol or "?")
            dim.Clear()
            dim.dim_value = size
    del bound.graph.value_info[:]
    for output in bound.graph.output:  # symbolic output shapes would clash with the bound ones
        if any(not d.HasField("dim_value") for d in output.type.tensor_type.shape.dim):
            output.type.tensor_type.ClearField("shape")
    return bound, sorted(set(defaulted))


def classes(costs: Iterable[NodeCost]) -> list[str]:
    return sorted({c.op_class for c in costs})
