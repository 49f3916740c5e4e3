"""Transformer families: ``gpt`` (pre-LN, GELU MLP, learned positions, LM head tied to the word embedding),
``llama`` (pre-RMSNorm, rotary positions, grouped-query attention, SwiGLU MLP, untied LM head) and ``bert``
(post-LN encoder, learned positions and token types, padding mask, tied masked-LM head).

Shapes: ``input_ids`` is ``[batch, seq]``; hidden states ``[batch, seq, hidden]``; attention scores
``[batch, heads, seq, seq]``. Weights are fp16 (the training precision the cost model assumes).
Dropout nodes sit where Megatron-LM (and Korthikanti et al. 2022, "Reducing Activation Recomputation in
Large Transformer Models", Sec. 4.1) put them: on the attention probabilities, after the attention output
projection and after the MLP, plus after the embeddings; they are left out when ``dropout`` is 0.

Per layer of ``gpt`` with ffn = 4h the matmul FLOPs per sequence are 24·s·h² + 4·s²·h and the parameters
12·h² + 13·h, the counts of Narayanan et al. 2021 ("Efficient Large-Scale Language Model Training on GPU
Clusters Using Megatron-LM", Sec. 5.1).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Mapping

import numpy as np
import onnx
from onnx import TensorProto

from planner.builders._onnx import GraphBuilder
from planner.builders._spec import (FLOAT, INT, MAX_ACTIVATION_ELEMENTS, MAX_FFN, MAX_HEADS, MAX_HIDDEN,
                                    MAX_LAYERS, MAX_SEQ_LEN, MAX_VOCAB, Family, Key, Value, check_elements)
from planner.errors import ConfigError

DTYPE = TensorProto.FLOAT16
BATCH, SEQ = "batch", "seq"
LN_EPSILON = 1e-5
ROPE_THETA = 10000.0  # Su et al. 2021 (RoFormer) / Llama's rotary base
LLAMA_FFN_MULTIPLE = 256  # Llama's ``multiple_of``: ffn = 256 * ceil((8/3 * hidden) / 256) (Touvron et al. 2023)


@dataclass(frozen=True)
class _Arch:
    """What distinguishes the three families inside the shared block code."""

    norm: str  # "layer" | "rms"
    pre_norm: bool
    fused_qkv: bool
    bias: bool
    mlp: str  # "gelu" | "swiglu"
    causal: bool
    rotary: bool


_ARCH = {
    "gpt": _Arch(norm="layer", pre_norm=True, fused_qkv=True, bias=True, mlp="gelu", causal=True, rotary=False),
    "llama": _Arch(norm="rms", pre_norm=True, fused_qkv=False, bias=False, mlp="swiglu", causal=True, rotary=True),
    "bert": _Arch(norm="layer", pre_norm=False, fused_qkv=False, bias=True, mlp="gelu", causal=False,
                  rotary=False),
}


# ---------------------------------------------------------------------------------------------- pieces
def _linear(g: GraphBuilder, name: str, x: str, n_in: int, n_out: int, bias: bool) -> str:
    with g.scope(name):
        y = g.op("MatMul", [x, g.weight("weight", [n_in, n_out])])
        return g.op("Add", [y, g.weight("bias", [n_out])]) if bias else y


def _dropout(g: GraphBuilder, x: str, ratio: float) -> str:
    if ratio <= 0.0:
        return x
    ratio_t = g.const(ratio, TensorProto.FLOAT)
    training = g.const(True, TensorProto.BOOL)
    return g.op_n("Dropout", [x, ratio_t, training], 2)[0]  # output and the mask saved for backward


def _norm(g: GraphBuilder, arch: _Arch, name: str, x: str, hidden: int) -> str:
    with g.scope(name):
        gamma = g.weight("weight", [hidden])
        if arch.norm == "layer":
            return g.op("LayerNormalization", [x, gamma, g.weight("bias", [hidden])], axis=-1,
                        epsilon=LN_EPSILON)
        # RMSNorm as the exporters write it: x * 1/sqrt(mean(x^2) + eps) * weight
        square = g.op("Pow", [x, g.const(2.0, DTYPE)])
        mean = g.op("ReduceMean", [square, g.const([-1], TensorProto.INT64)], keepdims=1)
        rms = g.op("Sqrt", [g.op("Add", [mean, g.const(LN_EPSILON, DTYPE)])])
        return g.op("Mul", [g.op("Mul", [x, g.op("Reciprocal", [rms])]), gamma])


def _gelu(g: GraphBuilder, x: str) -> str:
    """erf GELU as one ``Gelu`` node (as torch's dynamo exporter writes it): one op that saves only its input
    for backward, as a fused GELU kernel does (Korthikanti et al.'s 8sbh for the 4h-wide GELU input)."""
    return g.op("Gelu", [x])


def _heads(g: GraphBuilder, x: str, n_heads: int, head_dim: int) -> str:
    """[batch, seq, n*d] -> [batch, n, seq, d]"""
    split = g.op("Reshape", [x, g.const([0, 0, n_heads, head_dim], TensorProto.INT64)])
    return g.op("Transpose", [split], perm=[0, 2, 1, 3])


def _rotary(g: GraphBuilder, x: str, q: str, k: str, head_dim: int) -> tuple[str, str]:
    """Rotary position embedding (RoFormer): q*cos + rotate_half(q)*sin, likewise k."""
    with g.scope("rotary"):
        seq = g.op("Squeeze", [g.op("Shape", [x], start=1, end=2)])
        positions = g.op("Cast", [g.op("Range", [g.const(0, TensorProto.INT64), seq,
                                                 g.const(1, TensorProto.INT64)])], to=TensorProto.FLOAT)
        inv_freq = ROPE_THETA ** (-np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
        freqs = g.op("Mul", [g.op("Unsqueeze", [positions, g.const([1], TensorProto.INT64)]),
                             g.const(inv_freq.astype(np.float32), TensorProto.FLOAT)])
        angles = g.op("Concat", [freqs, freqs], axis=-1)  # [seq, head_dim]
        cos = g.op("Cast", [g.op("Cos", [angles])], to=DTYPE)
        sin = g.op("Cast", [g.op("Sin", [angles])], to=DTYPE)
        half = head_dim // 2
        rotated = []
        for t in (q, k):
            axes = g.const([-1], TensorProto.INT64)
            x1 = g.op("Slice", [t, g.const([0], TensorProto.INT64), g.const([half], TensorProto.INT64), axes])
            x2 = g.op("Slice", [t, g.const([half], TensorProto.INT64), g.const([head_dim], TensorProto.INT64),
                                axes])
            turned = g.op("Concat", [g.op("Neg", [x2]), x1], axis=-1)
            rotated.append(g.op("Add", [g.op("Mul", [t, cos]), g.op("Mul", [turned, sin])]))
        return rotated[0], rotated[1]


def _repeat_kv(g: GraphBuilder, t: str, heads: int, kv_heads: int, head_dim: int) -> str:
    """[batch, kv, seq, d] -> [batch, heads, seq, d] (each kv head serves heads/kv query heads)."""
    if kv_heads == heads:
        return t
    grown = g.op("Expand", [g.op("Unsqueeze", [t, g.const([2], TensorProto.INT64)]),
                            g.const([1, 1, heads // kv_heads, 1, 1], TensorProto.INT64)])
    return g.op("Reshape", [grown, g.const([0, heads, -1, head_dim], TensorProto.INT64)])


def _attention(g: GraphBuilder, arch: _Arch, cfg: Mapping[str, Value], x: str, mask_bias: str | None) -> str:
    hidden, heads, kv_heads = int(cfg["hidden"]), int(cfg["heads"]), int(cfg["kv_heads"])
    head_dim = hidden // heads
    q_width, kv_width = heads * head_dim, kv_heads * head_dim
    with g.scope("attn"):
        if arch.fused_qkv:
            qkv = _linear(g, "qkv", x, hidden, q_width + 2 * kv_width, arch.bias)
            sizes = g.const([q_width, kv_width, kv_width], TensorProto.INT64)
            q, k, v = g.op_n("Split", [qkv, sizes], 3, axis=-1)
        else:
            q = _linear(g, "q_proj", x, hidden, q_width, arch.bias)
            k = _linear(g, "k_proj", x, hidden, kv_width, arch.bias)
            v = _linear(g, "v_proj", x, hidden, kv_width, arch.bias)
        q, k, v = _heads(g, q, heads, head_dim), _heads(g, k, kv_heads, head_dim), _heads(g, v, kv_heads, head_dim)
        if arch.rotary:
            q, k = _rotary(g, x, q, k, head_dim)
        k = _repeat_kv(g, k, heads, kv_heads, head_dim)
        v = _repeat_kv(g, v, heads, kv_heads, head_dim)
        scores = g.op("MatMul", [q, g.op("Transpose", [k], perm=[0, 1, 3, 2])])
        scores = g.op("Mul", [scores, g.const(1.0 / math.sqrt(head_dim), DTYPE)])
        if arch.causal:
            square = g.op("Shape", [scores], start=2)
            ones = g.op("ConstantOfShape", [square], value=onnx.helper.make_tensor("", TensorProto.BOOL, [1], [1]))
            lower = g.op("Trilu", [ones], upper=0)
            scores = g.op("Where", [lower, scores, g.const(float(np.finfo(np.float16).min), DTYPE)])
        if mask_bias is not None:
            scores = g.op("Add", [scores, mask_bias])
        probs = _dropout(g, g.op("Softmax", [scores], axis=-1), float(cfg["dropout"]))
        context = g.op("Transpose", [g.op("MatMul", [probs, v])], perm=[0, 2, 1, 3])
        context = g.op("Reshape", [context, g.const([0, 0, q_width], TensorProto.INT64)])
        out = _linear(g, "out_proj", context, q_width, hidden, arch.bias)
        return _dropout(g, out, float(cfg["dropout"]))


def _mlp(g: GraphBuilder, arch: _Arch, cfg: Mapping[str, Value], x: str) -> str:
    hidden, ffn = int(cfg["hidden"]), int(cfg["ffn"])
    with g.scope("mlp"):
        if arch.mlp == "gelu":
            inner = _gelu(g, _linear(g, "fc1", x, hidden, ffn, arch.bias))
            out = _linear(g, "fc2", inner, ffn, hidden, arch.bias)
        else:  # SwiGLU (Shazeer 2020): down(silu(gate(x)) * up(x))
            gate = _linear(g, "gate_proj", x, hidden, ffn, arch.bias)
            up = _linear(g, "up_proj", x, hidden, ffn, arch.bias)
            silu = g.op("Mul", [gate, g.op("Sigmoid", [gate])])
            out = _linear(g, "down_proj", g.op("Mul", [silu, up]), ffn, hidden, arch.bias)
        return _dropout(g, out, float(cfg["dropout"]))


def _block(g: GraphBuilder, arch: _Arch, cfg: Mapping[str, Value], x: str, mask_bias: str | None) -> str:
    hidden = int(cfg["hidden"])
    if arch.pre_norm:
        x = g.op("Add", [x, _attention(g, arch, cfg, _norm(g, arch, "attn_norm", x, hidden), mask_bias)])
        return g.op("Add", [x, _mlp(g, arch, cfg, _norm(g, arch, "mlp_norm", x, hidden))])
    x = _norm(g, arch, "attn_norm", g.op("Add", [x, _attention(g, arch, cfg, x, mask_bias)]), hidden)
    return _norm(g, arch, "mlp_norm", g.op("Add", [x, _mlp(g, arch, cfg, x)]), hidden)


def _positions(g: GraphBuilder, ids: str) -> str:
    """0..seq-1 as int64, from the runtime sequence length."""
    seq = g.op("Squeeze", [g.op("Shape", [ids], start=1, end=2)])
    return g.op("Range", [g.const(0, TensorProto.INT64), seq, g.const(1, TensorProto.INT64)])


# ---------------------------------------------------------------------------------------------- models
def _embed(g: GraphBuilder, family: str, arch: _Arch, cfg: Mapping[str, Value]) -> tuple[str, str, str | None]:
    """The embedding layer; returns (hidden states, word-embedding weight, attention-mask bias or None)."""
    hidden, vocab = int(cfg["hidden"]), int(cfg["vocab"])
    ids = g.input("input_ids", TensorProto.INT64, [BATCH, SEQ])
    mask_bias = types = mask = None
    if family == "bert":
        types = g.input("token_type_ids", TensorProto.INT64, [BATCH, SEQ])
        mask = g.input("attention_mask", TensorProto.INT64, [BATCH, SEQ])
    with g.scope("embed"):
        with g.scope("word"):
            wte = g.weight("weight", [vocab, hidden])
            x = g.op("Gather", [wte, ids])
        if family in ("gpt", "bert"):
            with g.scope("position"):
                wpe = g.weight("weight", [int(cfg["seq_len"]), hidden])
                x = g.op("Add", [x, g.op("Gather", [wpe, _positions(g, ids)])])
        if types is not None and mask is not None:  # bert
            with g.scope("token_type"):
                x = g.op("Add", [x, g.op("Gather", [g.weight("weight", [int(cfg["type_vocab"]), hidden]), types])])
            x = _norm(g, arch, "norm", x, hidden)
            with g.scope("mask"):  # (1 - mask) * -10000 broadcast over heads and query positions
                extended = g.op("Cast", [g.op("Unsqueeze", [mask, g.const([1, 2], TensorProto.INT64)])], to=DTYPE)
                mask_bias = g.op("Mul", [g.op("Sub", [g.const(1.0, DTYPE), extended]), g.const(-10000.0, DTYPE)])
        x = _dropout(g, x, float(cfg["dropout"]))
    return x, wte, mask_bias


def _head(g: GraphBuilder, family: str, arch: _Arch, cfg: Mapping[str, Value], x: str, wte: str) -> str:
    hidden, vocab = int(cfg["hidden"]), int(cfg["vocab"])
    with g.scope("head"):
        if family == "bert":  # masked-LM head: dense, GELU, LayerNorm, tied decoder with its own bias
            x = _norm(g, arch, "norm", _gelu(g, _linear(g, "transform", x, hidden, hidden, True)), hidden)
        else:
            x = _norm(g, arch, "norm", x, hidden)
        if family == "llama":
            return _linear(g, "lm_head", x, hidden, vocab, False)
        with g.scope("lm_head"):
            logits = g.op("MatMul", [x, g.op("Transpose", [wte], perm=[1, 0])])  # tied to the word embedding
            return g.op("Add", [logits, g.weight("bias", [vocab])]) if family == "bert" else logits


def build_transformer(family: str, cfg: Mapping[str, Value], weights_file: str) -> onnx.ModelProto:
    arch = _ARCH[family]
    g = GraphBuilder(weights_file, DTYPE)
    x, wte, mask_bias = _embed(g, family, arch, cfg)
    for index in range(int(cfg["layers"])):
        with g.scope(f"layers.{index}"):
            x = _block(g, arch, cfg, x, mask_bias)
    logits = _head(g, family, arch, cfg, x, wte)
    g.output(logits, DTYPE, [BATCH, SEQ, int(cfg["vocab"])])
    metadata = {
        "planner.family": family,
        "planner.config": json.dumps(dict(cfg), sort_keys=True),
        "planner.default_dims": json.dumps({SEQ: int(cfg["seq_len"])}, sort_keys=True),
    }
    return g.model(f"{family}-{cfg['layers']}l-{cfg['hidden']}h", metadata)


# ------------------------------------------------------------------------------------------ registries
def _llama_ffn(hidden: int) -> int:
    return LLAMA_FFN_MULTIPLE * math.ceil(8 * hidden / 3 / LLAMA_FFN_MULTIPLE)


def _checker(family: str):
    def check(cfg: dict[str, Value]) -> None:
        hidden, heads = int(cfg["hidden"]), int(cfg["heads"])
        if hidden % heads:
            raise ConfigError(f"{family}: key 'hidden' = {hidden} must be divisible by 'heads' = {heads}")
        cfg.setdefault("kv_heads", heads)
        kv_heads = int(cfg["kv_heads"])
        if kv_heads > heads or heads % kv_heads:
            raise ConfigError(f"{family}: key 'kv_heads' = {kv_heads} must divide 'heads' = {heads}")
        if family == "llama" and (hidden // heads) % 2:
            raise ConfigError(f"llama: head size hidden/heads = {hidden // heads} must be even for rotary "
                              f"positions; change 'hidden' or 'heads'")
        cfg.setdefault("ffn", _llama_ffn(hidden) if family == "llama" else 4 * hidden)
        # the key maxima keep every weight and every other activation within the importer's limits
        check_attention_scores(family, heads, int(cfg["seq_len"]))
    return check


def check_attention_scores(family: str, heads: int, seq_len: int) -> None:
    """The attention scores of one sequence, ``heads x seq_len x seq_len``, the largest activation of a
    long sequence, within what the importer accepts at the default 'seq' (= seq_len)."""
    check_elements(family, f"the attention scores of one sequence (heads x seq_len x seq_len = {heads} x "
                   f"{seq_len} x {seq_len})", heads * seq_len * seq_len, MAX_ACTIVATION_ELEMENTS,
                   "lower 'seq_len' or 'heads'")


def _keys(layers: int, hidden: int, heads: int, vocab: int, seq_len: int, ffn_text: str,
          dropout: float) -> tuple[Key, ...]:
    return (
        Key("layers", INT, "transformer blocks", layers, minimum=1, maximum=MAX_LAYERS),
        Key("hidden", INT, "hidden size h", hidden, minimum=1, maximum=MAX_HIDDEN),
        Key("heads", INT, "attention heads a (must divide hidden)", heads, minimum=1, maximum=MAX_HEADS),
        Key("kv_heads", INT, "key/value heads (grouped-query attention; must divide heads)",
            default_text="heads", minimum=1, maximum=MAX_HEADS),
        Key("ffn", INT, "MLP inner size", default_text=ffn_text, minimum=1, maximum=MAX_FFN),
        Key("vocab", INT, "vocabulary size V", vocab, minimum=1, maximum=MAX_VOCAB),
        Key("seq_len", INT, "sequence length s (default of the symbolic 'seq' dimension; position table size)",
            seq_len, minimum=1, maximum=MAX_SEQ_LEN),
        Key("dropout", FLOAT, "dropout probability; 0 leaves the Dropout nodes out", dropout, minimum=0.0,
            maximum=0.9),
    )


def _family(name: str, description: str, keys: tuple[Key, ...]) -> Family:
    return Family(name, description, keys, lambda cfg, weights: build_transformer(name, cfg, weights),
                  _checker(name))


FAMILIES = (
    _family("gpt", "decoder-only GPT (pre-LN, GELU MLP, learned positions, tied LM head); defaults: GPT-3 125M",
            _keys(12, 768, 12, 51200, 2048, "4*hidden", 0.1)),
    _family("llama", "Llama (RMSNorm, rotary, grouped-query attention, SwiGLU, untied head); defaults: Llama-2 7B",
            _keys(32, 4096, 32, 32000, 4096, "256*ceil(8*hidden/3/256)", 0.0)),
    _family("bert", "BERT encoder (post-LN, token types, padding mask, tied MLM head); defaults: BERT-base",
            _keys(12, 768, 12, 30522, 512, "4*hidden", 0.1)
            + (Key("type_vocab", INT, "token-type vocabulary", 2, minimum=1, maximum=MAX_VOCAB),)),
)
