"""Small ONNX graphs built with onnx.helper for the graph-import tests (no weight data: initializers carry
shapes only where the importer allows it, weights are graph inputs as with export_params=False)."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper


class GraphBuilder:
    def __init__(self, named: bool = True) -> None:
        self.nodes: list[onnx.NodeProto] = []
        self.inputs: list[onnx.ValueInfoProto] = []
        self.inits: list[onnx.TensorProto] = []
        self.named = named
        self.scope: list[str] = []
        self._n = 0

    def weight(self, name: str, shape: list[int]) -> str:
        """A parameter as a graph input (export_params=False style)."""
        self.inputs.append(h.make_tensor_value_info(name, T.FLOAT, shape))
        return name

    def const(self, name: str, array: np.ndarray) -> str:
        self.inits.append(numpy_helper.from_array(array, name))
        return name

    def op(self, op_type: str, inputs: list[str], n_out: int = 1, **attrs) -> str | list[str]:
        self._n += 1
        outs = [f"t{self._n}_{i}" for i in range(n_out)]
        name = ("/" + "/".join(self.scope) + f"/{op_type}_{self._n}") if self.named and self.scope else ""
        self.nodes.append(h.make_node(op_type, inputs, outs, name=name, **attrs))
        return outs[0] if n_out == 1 else outs

    def model(self, data_inputs: list[onnx.ValueInfoProto], outputs: list[str], opset: int = 20,
              metadata: dict[str, str] | None = None) -> onnx.ModelProto:
        graph = h.make_graph(self.nodes, "g", data_inputs + self.inputs,
                             [h.make_tensor_value_info(o, T.FLOAT, None) for o in outputs], self.inits)
        model = h.make_model(graph, opset_imports=[h.make_opsetid("", opset)])
        for key, value in (metadata or {}).items():
            model.metadata_props.add(key=key, value=value)
        return model


def _linear(g: GraphBuilder, x: str, prefix: str, k: int, n: int) -> str:
    y = g.op("MatMul", [x, g.weight(f"{prefix}.weight", [k, n])])
    return g.op("Add", [y, g.weight(f"{prefix}.bias", [n])])


def _dropout(g: GraphBuilder, x: str, dropout: bool) -> str:
    if not dropout:
        return x
    ratio = g.const(f"ratio{g._n}", np.array(0.1, np.float32))
    train = g.const(f"train{g._n}", np.array(True))
    return g.op("Dropout", [x, ratio, train])


def _gelu(g: GraphBuilder, x: str, form: str) -> str:
    """GeLU as one op, or decomposed as TorchScript exports it: erf form x*0.5*(1+erf(x/sqrt2)), or
    GPT-2's tanh form 0.5*x*(1+tanh(sqrt(2/pi)*(x+0.044715*x^3)))."""
    if form == "op":
        return g.op("Gelu", [x])
    c = lambda v: g.op("Constant", [], value=numpy_helper.from_array(np.array(v, np.float32)))  # noqa: E731
    if form == "erf":
        inner = g.op("Add", [g.op("Erf", [g.op("Div", [x, c(np.sqrt(2.0))])]), c(1.0)])
        return g.op("Mul", [g.op("Mul", [x, inner]), c(0.5)])
    cube = g.op("Mul", [g.op("Pow", [x, c(3.0)]), c(0.044715)])
    t = g.op("Tanh", [g.op("Mul", [g.op("Add", [x, cube]), c(np.sqrt(2 / np.pi))])])
    return g.op("Mul", [g.op("Mul", [x, c(0.5)]), g.op("Add", [t, c(1.0)])])


def gpt_block(g: GraphBuilder, x: str, i: int, hidden: int, heads: int, seq: int, ffn: int, dropout: bool,
              kv_heads: int | None = None, gelu: str = "op") -> str:
    d = hidden // heads
    kv = kv_heads or heads
    g.scope = ["transformer", f"h.{i}"]
    ln1 = g.op("LayerNormalization", [x, g.weight(f"h.{i}.ln_1.weight", [hidden]),
                                      g.weight(f"h.{i}.ln_1.bias", [hidden])], axis=-1)
    g.scope = ["transformer", f"h.{i}", "attn"]
    if kv == heads:
        qkv = _linear(g, ln1, f"h.{i}.attn.c_attn", hidden, 3 * hidden)
        q, k, v = g.op("Split", [qkv, g.const(f"split{i}", np.array([hidden] * 3, np.int64))], n_out=3, axis=2)
    else:
        q = _linear(g, ln1, f"h.{i}.attn.q", hidden, hidden)
        k = _linear(g, ln1, f"h.{i}.attn.k", hidden, kv * d)
        v = _linear(g, ln1, f"h.{i}.attn.v", hidden, kv * d)
        rep = heads // kv
        k = g.op("Tile", [k, g.const(f"rep_k{i}", np.array([1, 1, rep], np.int64))])
        v = g.op("Tile", [v, g.const(f"rep_v{i}", np.array([1, 1, rep], np.int64))])
    shape4 = g.const(f"shape4_{i}", np.array([0, 0, heads, d], np.int64))
    qh = g.op("Transpose", [g.op("Reshape", [q, shape4])], perm=[0, 2, 1, 3])
    kh = g.op("Transpose", [g.op("Reshape", [k, shape4])], perm=[0, 2, 3, 1])
    vh = g.op("Transpose", [g.op("Reshape", [v, shape4])], perm=[0, 2, 1, 3])
    scores = g.op("MatMul", [qh, kh])
    scores = g.op("Div", [scores, g.const(f"scale{i}", np.array(np.sqrt(d), np.float32))])
    mask = np.triu(np.full((seq, seq), -1e4, np.float32), 1)
    scores = g.op("Add", [scores, g.op("Constant", [], value=numpy_helper.from_array(mask))])
    probs = _dropout(g, g.op("Softmax", [scores], axis=-1), dropout)
    ctx = g.op("MatMul", [probs, vh])
    ctx = g.op("Reshape", [g.op("Transpose", [ctx], perm=[0, 2, 1, 3]),
                           g.const(f"shape3_{i}", np.array([0, 0, hidden], np.int64))])
    attn = _dropout(g, _linear(g, ctx, f"h.{i}.attn.c_proj", hidden, hidden), dropout)
    g.scope = ["transformer", f"h.{i}"]
    x1 = g.op("Add", [x, attn])
    ln2 = g.op("LayerNormalization", [x1, g.weight(f"h.{i}.ln_2.weight", [hidden]),
                                       g.weight(f"h.{i}.ln_2.bias", [hidden])], axis=-1)
    g.scope = ["transformer", f"h.{i}", "mlp"]
    fc1 = _gelu(g, _linear(g, ln2, f"h.{i}.mlp.c_fc", hidden, ffn), gelu)
    fc2 = _dropout(g, _linear(g, fc1, f"h.{i}.mlp.c_proj", ffn, hidden), dropout)
    g.scope = ["transformer", f"h.{i}"]
    return g.op("Add", [x1, fc2])


def tiny_gpt(layers: int = 2, hidden: int = 64, heads: int = 4, seq: int = 16, vocab: int = 1000,
             named: bool = True, dropout: bool = True, symbolic_seq: bool = False,
             kv_heads: int | None = None, ffn: int | None = None, gelu: str = "op") -> onnx.ModelProto:
    """A GPT-2-like decoder: token + position embeddings, ``layers`` pre-LN blocks, final LN, LM head."""
    g = GraphBuilder(named)
    ffn = ffn or 4 * hidden
    g.scope = ["transformer", "wte"]
    tok = g.op("Gather", [g.weight("wte.weight", [vocab, hidden]), "input_ids"])
    g.scope = ["transformer", "wpe"]
    pos = g.op("Gather", [g.weight("wpe.weight", [seq, hidden]), g.const("pos", np.arange(seq, dtype=np.int64))])
    g.scope = ["transformer"]
    x = g.op("Add", [tok, pos])
    for i in range(layers):
        x = gpt_block(g, x, i, hidden, heads, seq, ffn, dropout, kv_heads, gelu)
    g.scope = ["transformer", "ln_f"]
    x = g.op("LayerNormalization", [x, g.weight("ln_f.weight", [hidden]), g.weight("ln_f.bias", [hidden])], axis=-1)
    g.scope = ["lm_head"]
    logits = g.op("MatMul", [x, g.weight("lm_head.weight", [hidden, vocab])])
    ids = h.make_tensor_value_info("input_ids", T.INT64, ["batch", "seq" if symbolic_seq else seq])
    return g.model([ids], [logits])


def gpt_params(layers: int, hidden: int, seq: int, vocab: int, ffn: int | None = None) -> int:
    """Parameter count of :func:`tiny_gpt`, by hand: token and position tables, per block 2 LNs (4h),
    QKV (3h^2+3h), proj (h^2+h), FC1 (h*f+f), FC2 (f*h+h); final LN (2h), LM head (h*V)."""
    f = ffn or 4 * hidden
    block = 4 * hidden + 3 * hidden * hidden + 3 * hidden + hidden * hidden + hidden + 2 * hidden * f + f + hidden
    return vocab * hidden + seq * hidden + layers * block + 2 * hidden + hidden * vocab


def gpt_block_flops(hidden: int, heads: int, seq: int, ffn: int | None = None) -> float:
    """Forward FLOPs of one block for one sample, by hand (multiply-add = 2):
    matmuls 2*s*(3h^2 + h^2 + 2hf) + attention 2*2*s^2*h, plus element-wise work:
    LN 2x8sh, biases 3h+h+f+h per token, softmax 5as^2, scale+mask 2as^2, gelu 8sf, dropout as^2+2sh,
    residual adds 2sh."""
    h_, a, s = hidden, heads, seq
    f = ffn or 4 * h_
    matmul = 2 * s * (3 * h_ * h_ + h_ * h_ + 2 * h_ * f) + 2 * 2 * s * s * h_
    elementwise = (2 * 8 * s * h_ + s * (3 * h_ + h_ + f + h_) + 5 * a * s * s + 2 * a * s * s + 8 * s * f
                   + a * s * s + 2 * s * h_ + 2 * s * h_)
    return float(matmul + elementwise)
