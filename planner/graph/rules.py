"""Per-op forward cost rules, keyed by ONNX op type.

A rule returns ``(flops, gemm)`` for one node from the shapes of its inputs and outputs (one sample);
bytes read and written are the element counts of its inputs and outputs (2 bytes per float element,
bf16 training), except for view ops (Reshape, Squeeze, ...), which move nothing. Counting conventions:
a multiply-add is 2 FLOPs; an element-wise op costs ``FLOPS_PER_ELEMENT[op]`` per output element (1 for
plain arithmetic; the composite ops below are counted as the arithmetic of their usual decomposition).

An op type without a rule is costed as memory-bound (0 FLOPs, its bytes read and written) and named once in
a warning by the importer.

``saved_for_backward`` says which tensors an op keeps for its backward pass (PyTorch autograd's choices),
used for the activation memory of a layer.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Sequence

from planner.graph.ir import FLOAT_TYPES, Node, OpGraph, act_bytes


class View:
    """What a rule sees of a node: shapes (None when unknown) of its inputs and outputs."""

    __slots__ = ("node", "graph")

    def __init__(self, node: Node, graph: OpGraph) -> None:
        self.node = node
        self.graph = graph

    def in_shape(self, i: int) -> tuple[int, ...] | None:
        if i >= len(self.node.inputs) or not self.node.inputs[i]:
            return None
        return self.graph.shapes.get(self.node.inputs[i])

    def out_shape(self, i: int = 0) -> tuple[int, ...] | None:
        if i >= len(self.node.outputs) or not self.node.outputs[i]:
            return None
        return self.graph.shapes.get(self.node.outputs[i])

    def out_numel(self) -> int:
        total = 0
        for t in self.node.outputs:
            if t:
                total += self.graph.numel(t) or 0
        return total

    def in_numel(self, i: int) -> int:
        if i >= len(self.node.inputs) or not self.node.inputs[i]:
            return 0
        return self.graph.numel(self.node.inputs[i]) or 0

    def bytes_of(self, tensor: str) -> float:
        """Bytes of a tensor at its training width (``act_bytes``), 0 where absent or of unknown shape."""
        return float((self.graph.numel(tensor) or 0) * act_bytes(self.graph.types.get(tensor))) if tensor else 0.0

    def in_bytes(self, i: int) -> float:
        return self.bytes_of(self.node.inputs[i]) if i < len(self.node.inputs) else 0.0


Gemm = tuple[int, int, int]
Rule = Callable[[View], tuple[float, "Gemm | None"]]


def _prod(xs: Sequence[int]) -> int:
    return math.prod(xs) if xs else 1


# ------------------------------------------------------------------------------------- matrix products


def _matmul(v: View) -> tuple[float, Gemm | None]:
    a, out = v.in_shape(0), v.out_shape()
    if a is None or out is None or not out:
        return 0.0, None
    b = v.in_shape(1)
    k = a[-1]
    n = b[-1] if b is not None and len(b) >= 2 else 1
    m = _prod(out) // max(n, 1)
    return 2.0 * m * n * k, (m, n, k)


def _gemm(v: View) -> tuple[float, Gemm | None]:
    a, out = v.in_shape(0), v.out_shape()
    if a is None or out is None or len(a) != 2:
        return 0.0, None
    k = a[0] if v.node.attr("transA", 0) else a[1]
    m, n = out
    flops = 2.0 * m * n * k
    if len(v.node.inputs) > 2 and v.node.inputs[2]:
        flops += m * n
    return flops, (m, n, k)


def _conv(v: View) -> tuple[float, Gemm | None]:
    w, out = v.in_shape(1), v.out_shape()
    if w is None or out is None:
        return 0.0, None
    per_output = _prod(w[1:])  # Cin/groups * kernel
    flops = 2.0 * _prod(out) * per_output
    if len(v.node.inputs) > 2 and v.node.inputs[2]:
        flops += _prod(out)
    m = _prod(out) // max(out[1], 1)
    return flops, (m, out[1], per_output)


def _conv_transpose(v: View) -> tuple[float, Gemm | None]:
    x, w = v.in_shape(0), v.in_shape(1)
    if x is None or w is None:
        return 0.0, None
    group = v.node.attr("group", 1)
    cout_per_group = w[1]
    flops = 2.0 * _prod(x) * cout_per_group * _prod(w[2:])
    m = _prod(x) // max(x[1], 1)
    return flops, (m, cout_per_group * group * _prod(w[2:]), x[1] // group)


def einsum_terms(node: Node, graph: OpGraph) -> tuple[list[str], str, dict[str, int]] | None:
    """(operand subscripts, output subscripts, size of each index) of an Einsum whose operand shapes are
    known, an ellipsis written out as one index per dimension it covers; None otherwise."""
    eq = node.attr("equation", b"") or b""
    eq = (eq.decode() if isinstance(eq, bytes) else eq).replace(" ", "")
    lhs, arrow, rhs = eq.partition("->")
    terms = lhs.split(",")
    if len(terms) != len(node.inputs):
        return None
    sizes: dict[str, int] = {}
    ellipsis = 0
    for i, term in enumerate(terms):
        shape = graph.shapes.get(node.inputs[i]) if node.inputs[i] else None
        if shape is None:
            return None
        if "..." in term:
            covered = len(shape) - (len(term) - 3)
            if covered < 0:
                return None
            ellipsis = max(ellipsis, covered)
            # the ellipsis dims align from the right, as broadcasting does
            term = term.replace("...", "".join(_ELLIPSIS[ellipsis - covered:ellipsis]))
            terms[i] = term
        if len(term) != len(shape):
            return None
        for letter, d in zip(term, shape):
            sizes[letter] = max(sizes.get(letter, 1), d)
    if arrow:
        out = rhs.replace("...", "".join(_ELLIPSIS[:ellipsis]))
    else:  # implicit output: the ellipsis, then the indices that occur once, in alphabetical order
        letters = "".join(terms)
        out = "".join(_ELLIPSIS[:ellipsis]) + "".join(sorted(c for c in set(letters)
                                                              if letters.count(c) == 1 and c not in _ELLIPSIS))
    return terms, out, sizes


# stand-in indices for the dims an ellipsis covers (outside the letters an equation may use)
_ELLIPSIS = tuple(chr(0x100 + i) for i in range(16))


def einsum_product(terms: list[str], out: str, sizes: dict[str, int], a: int = 0) -> Gemm | None:
    """The (m, n, k) of a two-operand einsum as a (batched) matrix product, batch folded into ``m`` as for
    MatMul: indices in both operands and not the output are ``k`` (summed), those in both and the output
    batch, those of operand ``a`` (of the other operand) alone that the output keeps ``m`` (``n``). None
    where nothing is summed over both operands (an element-wise or outer product)."""
    if len(terms) != 2:
        return None
    first, second = terms[a], terms[1 - a]
    k = {c for c in first if c in second and c not in out}
    if not k:
        return None
    batch = {c for c in first if c in second and c in out}
    m = {c for c in first if c not in second and c in out}
    n = {c for c in second if c not in first and c in out}
    return (_prod([sizes[c] for c in batch | m]), _prod([sizes[c] for c in n]), _prod([sizes[c] for c in k]))


def einsum_weight_slot(node: Node, graph: OpGraph) -> int | None:
    """The operand of a two-operand Einsum that is a weight (the other one is not), else None."""
    if len(node.inputs) != 2:
        return None
    weights = [t in graph.param_roots for t in node.inputs]
    return weights.index(True) if weights.count(True) == 1 else None


def _einsum(v: View) -> tuple[float, Gemm | None]:
    parsed = einsum_terms(v.node, v.graph)
    if parsed is None:
        return float(v.out_numel()), None
    terms, out, sizes = parsed
    if len(terms) < 2:
        return float(_prod(v.in_shape(0) or ())), None
    # a weight operand gives the product's n (its output features), as the second operand of a MatMul does
    weight_first = einsum_weight_slot(v.node, v.graph) == 0
    return 2.0 * _prod(list(sizes.values())), einsum_product(terms, out, sizes, 1 if weight_first else 0)


# ------------------------------------------------------------------------------------------- attention


@dataclass(frozen=True)
class AttentionShape:
    """The sizes of one ONNX ``Attention`` node (opset 23): Q ``[batch, q_heads, q_seq, head_dim]``, or 3-D
    ``[batch, q_seq, q_heads x head_dim]`` with the heads in the ``q_num_heads`` attribute; K and V likewise
    with ``kv_heads`` (``kv_num_heads``; fewer than ``q_heads`` is grouped-query attention); ``kv_seq``
    counts a ``past_key`` cache's keys too."""

    batch: int
    q_heads: int
    kv_heads: int
    q_seq: int
    kv_seq: int
    head_dim: int
    v_head_dim: int
    causal: bool  # the ``is_causal`` attribute
    masked: bool  # an ``attn_mask`` input
    softcap: bool  # scores soft-capped (``softcap`` > 0)


def _heads_seq_width(shape: tuple[int, ...], heads: int) -> tuple[int, int, int] | None:
    """(heads, sequence, width per head) of an Attention operand, 4-D or 3-D with ``heads`` given."""
    if len(shape) == 4:
        return shape[1], shape[2], shape[3]
    if len(shape) == 3 and heads > 0 and shape[2] % heads == 0:
        return heads, shape[1], shape[2] // heads
    return None


def attention_shape(node: Node, graph: OpGraph) -> AttentionShape | None:
    """The sizes of an ``Attention`` node whose Q, K and V shapes are known, else None."""
    if node.op_type != "Attention" or len(node.inputs) < 3 or not all(node.inputs[:3]):
        return None
    shapes = [graph.shapes.get(t) for t in node.inputs[:3]]
    if any(shape is None for shape in shapes):
        return None
    kv_attr = node.attr("kv_num_heads", 0)
    q = _heads_seq_width(shapes[0], node.attr("q_num_heads", 0))  # type: ignore[arg-type]
    k = _heads_seq_width(shapes[1], kv_attr)  # type: ignore[arg-type]
    v = _heads_seq_width(shapes[2], kv_attr)  # type: ignore[arg-type]
    if q is None or k is None or v is None:
        return None
    past = graph.shapes.get(node.inputs[4]) if len(node.inputs) > 4 and node.inputs[4] else None
    return AttentionShape(batch=shapes[0][0], q_heads=q[0], kv_heads=k[0], q_seq=q[1],  # type: ignore[index]
                          kv_seq=k[1] + (past[2] if past and len(past) == 4 else 0), head_dim=q[2],
                          v_head_dim=v[2], causal=bool(node.attr("is_causal", 0)),
                          masked=len(node.inputs) > 3 and bool(node.inputs[3]),
                          softcap=node.attr("softcap", 0.0) > 0)


@dataclass(frozen=True)
class Stage:
    """One kernel of a fused node as its unfused form runs it (bytes at the importer's activation width)."""

    op_type: str
    flops: float
    bytes_read: float
    bytes_written: float
    gemm: Gemm | None


def attention_stages(v: View) -> tuple[Stage, ...]:
    """An ``Attention`` node as the kernels of the graph it fuses, as an unfused (math) attention runs them:
    Q·Kᵀ (``MatMul``), the mask added to the scores (``Add``, where there is one: an ``attn_mask`` or the
    causal triangle), the soft cap and softmax with the scale (``Softmax``: 1 + 3 + 5 FLOPs per score, the cap
    where present), and P·V (``MatMul``); every query head against its group's K and V head. A fused runtime
    (FlashAttention, the fused softmax) times them as one kernel. Empty where the shapes are unknown."""
    shape = attention_shape(v.node, v.graph)
    if shape is None:
        return ()
    rows = shape.batch * shape.q_heads * shape.q_seq
    scores = rows * shape.kv_seq
    per_score = FLOPS_PER_ELEMENT["Softmax"] + 1 + (3 if shape.softcap else 0)
    score_bytes = float(scores * act_bytes(None))
    written = sum(v.bytes_of(t) for t in v.node.outputs)
    masks = (Stage("Add", float(scores), 2 * score_bytes if shape.causal else score_bytes + v.in_bytes(3),
                   score_bytes, None),) if shape.causal or shape.masked else ()
    return (Stage("MatMul", 2.0 * scores * shape.head_dim, v.in_bytes(0) + v.in_bytes(1) + v.in_bytes(4),
                  score_bytes, (rows, shape.kv_seq, shape.head_dim)),
            *masks,
            Stage("Softmax", float(per_score * scores), score_bytes, score_bytes, None),
            Stage("MatMul", 2.0 * scores * shape.v_head_dim, score_bytes + v.in_bytes(2) + v.in_bytes(5), written,
                  (rows, shape.v_head_dim, shape.kv_seq)))


def _attention(v: View) -> tuple[float, Gemm | None]:
    stages = attention_stages(v)
    if not stages:
        return 0.0, None
    return sum(stage.flops for stage in stages), stages[0].gemm


# ------------------------------------------------------------------------------------------ element-wise

# FLOPs per output element; composite ops counted as the arithmetic of their decomposition
FLOPS_PER_ELEMENT = {
    **dict.fromkeys(("Add", "Sub", "Mul", "Div", "Pow", "Neg", "Abs", "Relu", "Sqrt", "Reciprocal", "Exp",
                     "Log", "Erf", "Tanh", "Sin", "Cos", "Floor", "Ceil", "Round", "Sign", "Max", "Min", "Mod",
                     "Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual", "Not", "And", "Or", "Xor",
                     "Where", "Clip", "IsNaN", "IsInf", "PRelu", "LeakyRelu", "Dropout", "CumSum", "BitShift",
                     "Trilu"), 1),
    "Sigmoid": 4,  # exp, add, reciprocal, (neg)
    "HardSigmoid": 3, "HardSwish": 4, "Softplus": 3, "Elu": 3, "Selu": 4, "Celu": 4, "Mish": 6,
    "Gelu": 8,  # tanh form: x^3, 2 mul-add, tanh, add, 2 mul
    "FastGelu": 8, "BiasGelu": 9, "QuickGelu": 5,
    "Softmax": 5, "LogSoftmax": 5,  # max, subtract, exp, sum, divide
    "BatchNormalization": 2,  # inference form: scale and shift
    "InstanceNormalization": 8, "GroupNormalization": 8,
    "LayerNormalization": 8,  # mean, subtract, square, mean, rsqrt, multiply, scale, shift
    "SimplifiedLayerNormalization": 6, "RMSNormalization": 6, "SkipLayerNormalization": 9,
}


def _elementwise(per: float) -> Rule:
    def rule(v: View) -> tuple[float, Gemm | None]:
        out = v.out_shape()
        return (per * _prod(out) if out is not None else 0.0), None
    return rule


def _variadic(v: View) -> tuple[float, Gemm | None]:
    """Sum/Mean/Max/Min with n inputs: n-1 operations per output element (Mean: one more divide)."""
    out = v.out_shape()
    if out is None:
        return 0.0, None
    n = len([t for t in v.node.inputs if t])
    extra = 1 if v.node.op_type == "Mean" else 0
    return float((max(n - 1, 1) + extra) * _prod(out)), None


def _reduce(v: View) -> tuple[float, Gemm | None]:
    """Reductions read every input element once."""
    return float(v.in_numel(0)), None


def _pool(v: View) -> tuple[float, Gemm | None]:
    out = v.out_shape()
    if out is None:
        return 0.0, None
    kernel = v.node.attr("kernel_shape", []) or []
    return float(_prod(out) * _prod(kernel)), None


def _global_pool(v: View) -> tuple[float, Gemm | None]:
    return float(v.in_numel(0)), None


def _lrn(v: View) -> tuple[float, Gemm | None]:
    """Square, sum over ``size`` channels, scale, add bias, power, divide."""
    size = v.node.attr("size", 5)
    return float((size + 5) * v.out_numel()), None


def _zero(v: View) -> tuple[float, Gemm | None]:
    return 0.0, None


def _per_output(v: View) -> tuple[float, Gemm | None]:
    return float(v.out_numel()), None


def _resize(v: View) -> tuple[float, Gemm | None]:
    mode = v.node.attr("mode", b"nearest")
    mode = mode.decode() if isinstance(mode, bytes) else mode
    return float((1 if mode == "nearest" else 4 * 2) * v.out_numel()), None


def _recurrent(gates: int) -> Rule:
    """LSTM (4 gates) / GRU (3) / RNN (1): per step and direction 2*gates*hidden*(input+hidden) + gate math."""
    def rule(v: View) -> tuple[float, Gemm | None]:
        x, w = v.in_shape(0), v.in_shape(1)
        if x is None or w is None:
            return 0.0, None
        seq, batch, inp = x
        directions, gh, _ = w
        hidden = gh // gates
        per_step = 2.0 * gh * (inp + hidden) + 4 * gh
        return per_step * seq * batch * directions, (seq * batch, gh, inp + hidden)
    return rule


def _fold_over_data(v: View) -> tuple[float, Gemm | None]:
    """Loop / Scan not recognised as an embedding bag: one FLOP per element of the largest data input they
    are handed (an exporter's bag sum walks the rows gathered outside once); their bodies are not costed."""
    data = [i for i, t in enumerate(v.node.inputs) if t and t not in v.graph.const]
    return float(max((v.in_numel(i) for i in data), default=0)), None


# ops whose rule reads only the shapes of their data inputs (their outputs' shapes do not matter)
INPUT_RULES = frozenset({"Loop", "Scan"})

# ops that move data (bytes) but do no arithmetic
_MOVE_OPS = ("Transpose", "Concat", "Split", "Slice", "Gather", "GatherElements", "GatherND", "Expand", "Tile",
             "Pad", "Cast", "CastLike", "ScatterND", "ScatterElements", "Scatter", "DepthToSpace", "SpaceToDepth",
             "OneHot", "NonZero", "Compress", "ReverseSequence", "Range", "ConstantOfShape", "Constant", "Shape",
             "Size", "EyeLike", "RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike",
             "Bernoulli", "SequenceConstruct", "SplitToSequence", "ConcatFromSequence", "SequenceAt",
             "SequenceEmpty", "SequenceInsert", "SequenceErase", "SequenceLength",
             "Upsample", "EmbeddingBag", "TopK", "ArgMax", "ArgMin", "Unique", "GridSample")
# ops that are views: no data moved
VIEW_OPS = frozenset({"Reshape", "Squeeze", "Unsqueeze", "Flatten", "Identity"})
# ops whose FLOPs are zero whatever their shapes (an unknown shape there loses no arithmetic)
ZERO_FLOP_OPS = frozenset(_MOVE_OPS) | VIEW_OPS

RULES: dict[str, Rule] = {
    "MatMul": _matmul, "Gemm": _gemm, "Conv": _conv, "ConvTranspose": _conv_transpose, "Einsum": _einsum,
    "Attention": _attention,
    "FusedMatMul": _matmul, "MatMulInteger": _matmul, "QLinearMatMul": _matmul,
    "FusedGemm": _gemm,  # com.microsoft: Gemm with its activation fused (counted as the Gemm's arithmetic)
    **{op: _elementwise(per) for op, per in FLOPS_PER_ELEMENT.items()},
    **dict.fromkeys(("Sum", "Mean"), _variadic),
    **dict.fromkeys(("ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1", "ReduceL2",
                     "ReduceSumSquare", "ReduceLogSum", "ReduceLogSumExp"), _reduce),
    **dict.fromkeys(("MaxPool", "AveragePool", "LpPool"), _pool),
    **dict.fromkeys(("GlobalAveragePool", "GlobalMaxPool", "GlobalLpPool"), _global_pool),
    "LRN": _lrn, "Resize": _resize, "LSTM": _recurrent(4), "GRU": _recurrent(3), "RNN": _recurrent(1),
    "Loop": _fold_over_data, "Scan": _fold_over_data,
    **dict.fromkeys(_MOVE_OPS, _zero),
    **dict.fromkeys(VIEW_OPS, _zero),
}
# Max/Min take any number of inputs
RULES["Max"] = RULES["Min"] = _variadic
RULES["Where"] = _per_output


# ------------------------------------------------------------------------------- saved for backward

Saved = list[tuple[str, float]]  # (tensor, bytes per element); "tensor#mask" for dropout masks


def _needs_grad(v: View, i: int) -> bool:
    t = v.node.inputs[i] if i < len(v.node.inputs) else ""
    return bool(t) and (t not in v.graph.const or t in v.graph.param_roots)


def _act(v: View, t: str) -> tuple[str, float]:
    return t, float(act_bytes(v.graph.types.get(t)))


def _data_inputs(v: View, idx: tuple[int, ...] = (0,)) -> Saved:
    return [_act(v, v.node.inputs[i]) for i in idx
            if i < len(v.node.inputs) and v.node.inputs[i] and v.node.inputs[i] not in v.graph.const
            and v.graph.types.get(v.node.inputs[i], 1) in FLOAT_TYPES]


def _save_output(v: View) -> Saved:
    return [_act(v, v.node.outputs[0])] if v.node.outputs and v.node.outputs[0] else []


def _save_products(v: View) -> Saved:
    """x*y, x@y: the gradient of each operand needs the other one."""
    a, b = v.node.inputs[0], v.node.inputs[1] if len(v.node.inputs) > 1 else ""
    saved: Saved = []
    if a and a not in v.graph.const and _needs_grad(v, 1):
        saved.append(_act(v, a))
    if b and b not in v.graph.const and _needs_grad(v, 0):
        saved.append(_act(v, b))
    return saved


def _save_div(v: View) -> Saved:
    if len(v.node.inputs) < 2 or v.node.inputs[1] in v.graph.const:
        return []
    return _data_inputs(v, (0, 1))


def _save_dropout(v: View) -> Saved:
    return [(v.node.outputs[0] + "#mask", 1.0)] if v.node.outputs and v.node.outputs[0] else []


def _save_where(v: View) -> Saved:
    cond = v.node.inputs[0]
    return [(cond, 1.0)] if cond and cond not in v.graph.const else []


def _save_indices(v: View) -> Saved:
    idx = v.node.inputs[1] if len(v.node.inputs) > 1 else ""
    if idx and idx not in v.graph.const and v.node.inputs[0] in v.graph.param_roots:
        return [_act(v, idx)]
    return []


SAVED: dict[str, Callable[[View], Saved]] = {
    **dict.fromkeys(("MatMul", "Gemm", "Mul", "Einsum", "FusedMatMul"), _save_products),
    **dict.fromkeys(("Conv", "ConvTranspose", "LayerNormalization", "SimplifiedLayerNormalization",
                     "RMSNormalization", "BatchNormalization", "InstanceNormalization", "GroupNormalization",
                     "Gelu", "FastGelu", "QuickGelu", "Erf", "Log", "Pow", "LeakyRelu", "Elu", "Selu", "Celu",
                     "HardSigmoid", "HardSwish", "Softplus", "Mish", "Clip", "Sin", "Cos", "Abs", "PRelu", "LRN",
                     "MaxPool", "ReduceMax", "ReduceMin", "LSTM", "GRU", "RNN"), _data_inputs),
    **dict.fromkeys(("Relu", "Sigmoid", "Tanh", "Exp", "Sqrt", "Reciprocal", "Softmax", "LogSoftmax"),
                    _save_output),
    "Div": _save_div, "Dropout": _save_dropout, "Where": _save_where, "Gather": _save_indices,
    "EmbeddingBag": _save_indices,
}
SAVED["SkipLayerNormalization"] = lambda v: _data_inputs(v, (0, 1))
# a fused attention kernel keeps Q, K, V and its output (and the softmax's row statistics, negligible)
SAVED["Attention"] = lambda v: _data_inputs(v, (0, 1, 2)) + _save_output(v)
SAVED["Max"] = SAVED["Min"] = lambda v: _data_inputs(v, tuple(range(len(v.node.inputs))))


# Element-wise ops (and the row reductions of a decomposed norm) that a training framework fuses into one
# kernel: TorchScript exports GeLU as Div/Erf/Add/Mul/Mul, GPT-2's gelu_new as Pow/Mul/Add/Tanh/..., older
# opsets LayerNorm and RMSNorm as ReduceMean/Sub/Pow/Sqrt/Div/Mul. Korthikanti et al. count such a fused
# op as keeping only its input for backward.
POINTWISE = frozenset({"Add", "Sub", "Mul", "Div", "Pow", "Sqrt", "Reciprocal", "Exp", "Log", "Tanh", "Erf",
                       "Sigmoid", "Neg", "Abs", "Cast", "Gelu", "ReduceMean", "Softplus", "HardSigmoid",
                       "HardSwish", "Relu", "LeakyRelu", "Elu", "Clip", "Max", "Min"})


def fused_sources(graph: OpGraph, compute: list[Node]) -> dict[int, str]:
    """Node index -> input tensor of the single-input element-wise region the node belongs to (regions of
    two or more nodes computed from one data tensor and constants)."""
    source: dict[str, str] = {}
    members: dict[str, list[int]] = {}
    for node in compute:
        if node.op_type not in POINTWISE:
            continue
        data = {source.get(t, t) for t in node.inputs if t and t not in graph.const}
        if len(data) != 1:
            continue
        x = data.pop()
        for out in node.outputs:
            if out:
                source[out] = x
        members.setdefault(x, []).append(node.index)
    return {i: x for x, nodes in members.items() if len(nodes) >= 2 for i in nodes}


def nan_guards(graph: OpGraph, compute: list[Node]) -> dict[str, str]:
    """``Where(IsNaN(x), c, x)`` outputs -> ``x``: the exporters' guard after an attention softmax
    (``scaled_dot_product_attention``'s math path) changes no value, and a fused kernel keeps no copy."""
    aliases: dict[str, str] = {}
    for node in compute:
        if node.op_type != "Where" or len(node.inputs) != 3:
            continue
        cond, _, x = node.inputs
        src = graph.producer.get(cond)
        if src is not None and graph.nodes[src].op_type == "IsNaN" and graph.nodes[src].inputs[:1] == (x,):
            aliases[node.outputs[0]] = aliases.get(x, x)
    return aliases


def saved_for_backward(view: View, fused: dict[int, str], aliases: dict[str, str]) -> Saved:
    """What ``view.node`` keeps for backward; a member of a fused region keeps the region's input instead,
    and a NaN guard keeps nothing (what reads its output keeps the guarded tensor)."""
    if view.node.outputs and view.node.outputs[0] in aliases:
        return []
    saver = SAVED.get(view.node.op_type)
    saved = saver(view) if saver is not None else []
    source = fused.get(view.node.index)
    if source is not None and saved:
        saved = [_act(view, source)]
    return [(aliases.get(t, t), b) for t, b in saved]
