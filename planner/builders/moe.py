"""Mixture-of-experts decoder family ``moe``: Mixtral, Qwen3-MoE and DeepSeek-V3 shapes.

A Llama-style decoder (pre-RMSNorm, rotary positions, untied LM head) whose MLP is a sparse mixture of
SwiGLU experts (Shazeer et al. 2017; Fedus et al. 2021, "Switch Transformers"):

* router: a gating GEMM ``[hidden, experts]`` (``mlp.gate.weight``), Softmax (Mixtral, Qwen3) or Sigmoid
  (DeepSeek-V3) scores, ``TopK(top_k)`` over the experts; the chosen scores are renormalised to sum to 1;
* dispatch with a fixed capacity, as GShard (Lepikhin et al. 2020) and Switch do, at capacity factor 1:
  each expert takes, per sequence, the ``capacity = ceil(seq * top_k / experts)`` tokens with the highest
  gate for it (``TopK`` over the tokens of the dense gate matrix), gathered into ``[batch, experts,
  capacity, hidden]``; tokens beyond an expert's capacity are dropped (the residual carries them);
* experts: 3-D weights ``[experts, in, out]`` (``mlp.experts.gate_proj`` ...) applied by one batched MatMul
  each (the "grouped"/"batched_mm" form of Hugging Face's Mixtral experts): SwiGLU ``down(silu(gate(x)) *
  up(x))``. The MatMuls' FLOPs are therefore the routed ones, ``2 * seq * top_k * hidden * expert_ffn`` per
  projection and sequence, not those of every expert on every token;
* combine: the expert outputs times their gates are added back to their tokens (``ScatterElements`` with
  ``reduction="add"``); ``shared_experts`` (DeepSeek) are one dense SwiGLU MLP of width
  ``shared_experts * expert_ffn`` on every token, added to the routed output;
* the first ``dense_layers`` blocks keep a dense SwiGLU MLP of width ``dense_ffn`` (DeepSeek-V3's first 3).

Attention is ``mha``/``gqa`` (``kv_heads`` key/value heads, head size ``head_dim``) or ``mla``, DeepSeek's
multi-head latent attention (DeepSeek-V2 report, arXiv:2405.04434, Sec. 2.1): queries through a
``q_lora_rank`` bottleneck, keys and values from one ``kv_lora_rank`` latent (plus a shared rotary key of
``qk_rope_head_dim``), each head's query/key ``qk_nope_head_dim + qk_rope_head_dim`` wide and its value
``v_head_dim``.

Defaults are Mixtral 8x7B (Jiang et al. 2024, "Mixtral of Experts", arXiv:2401.04088, Table 1: 32 layers,
dim 4096, 32 heads, 8 kv heads, hidden_dim 14336, 8 experts, top 2, vocab 32000; 46.7B parameters, 12.9B
active per token per the Mistral AI release "Mixtral of experts", 2023-12-11).
"""

from __future__ import annotations

import json
import math
from typing import Mapping

import numpy as np
import onnx
from onnx import TensorProto

from planner.builders._onnx import GraphBuilder
from planner.builders._spec import (INT, MAX_ACTIVATION_ELEMENTS, MAX_EXPERTS, MAX_FFN, MAX_HEAD_DIM, MAX_HEADS,
                                    MAX_HIDDEN, MAX_LAYERS, MAX_SEQ_LEN, MAX_VOCAB, MAX_WEIGHT_ELEMENTS, STR,
                                    Family, Key, Value, check_elements)
from planner.builders.transformer import (_ARCH, BATCH, DTYPE, SEQ, _heads, _linear, _norm, _repeat_kv,
                                          _rotary, check_attention_scores)
from planner.errors import ConfigError

NAME = "moe"
_LLAMA = _ARCH["llama"]  # RMSNorm, rotary, no biases, SwiGLU
_I64 = TensorProto.INT64

# DeepSeek-V3's MLA sizes (config.json of deepseek-ai/DeepSeek-V3: q_lora_rank, kv_lora_rank,
# qk_rope_head_dim, qk_nope_head_dim, v_head_dim)
MLA_DEFAULTS = {"q_lora_rank": 1536, "kv_lora_rank": 512, "qk_rope_head_dim": 64, "qk_nope_head_dim": 128,
                "v_head_dim": 128}


# ---------------------------------------------------------------------------------------------- attention
def _scaled_scores(g: GraphBuilder, q: str, k: str, v: str, head_dim: int, width: int) -> str:
    """Causal softmax(q·kᵀ/sqrt(d))·v for [batch, heads, seq, d] tensors, back to [batch, seq, width]."""
    scores = g.op("Mul", [g.op("MatMul", [q, g.op("Transpose", [k], perm=[0, 1, 3, 2])]),
                          g.const(1.0 / math.sqrt(head_dim), DTYPE)])
    square = g.op("Shape", [scores], start=2)
    ones = g.op("ConstantOfShape", [square], value=onnx.helper.make_tensor("", TensorProto.BOOL, [1], [1]))
    scores = g.op("Where", [g.op("Trilu", [ones], upper=0), scores, g.const(float(np.finfo(np.float16).min), DTYPE)])
    context = g.op("Transpose", [g.op("MatMul", [g.op("Softmax", [scores], axis=-1), v])], perm=[0, 2, 1, 3])
    return g.op("Reshape", [context, g.const([0, 0, width], _I64)])


def _gqa(g: GraphBuilder, cfg: Mapping[str, Value], x: str) -> str:
    hidden, heads, kv_heads, d = (int(cfg[k]) for k in ("hidden", "heads", "kv_heads", "head_dim"))
    with g.scope("attn"):
        q = _heads(g, _linear(g, "q_proj", x, hidden, heads * d, False), heads, d)
        k = _heads(g, _linear(g, "k_proj", x, hidden, kv_heads * d, False), kv_heads, d)
        v = _heads(g, _linear(g, "v_proj", x, hidden, kv_heads * d, False), kv_heads, d)
        q, k = _rotary(g, x, q, k, d)
        k, v = _repeat_kv(g, k, heads, kv_heads, d), _repeat_kv(g, v, heads, kv_heads, d)
        return _linear(g, "o_proj", _scaled_scores(g, q, k, v, d, heads * d), heads * d, hidden, False)


def _mla(g: GraphBuilder, cfg: Mapping[str, Value], x: str) -> str:
    """Multi-head latent attention as DeepSeek-V3's modeling code computes it in training (no latent cache)."""
    hidden, heads = int(cfg["hidden"]), int(cfg["heads"])
    q_rank, kv_rank = int(cfg["q_lora_rank"]), int(cfg["kv_lora_rank"])
    rope, nope, v_dim = int(cfg["qk_rope_head_dim"]), int(cfg["qk_nope_head_dim"]), int(cfg["v_head_dim"])
    qk = nope + rope
    with g.scope("attn"):
        if q_rank:
            latent_q = _norm(g, _LLAMA, "q_a_layernorm", _linear(g, "q_a_proj", x, hidden, q_rank, False), q_rank)
            q = _linear(g, "q_b_proj", latent_q, q_rank, heads * qk, False)
        else:
            q = _linear(g, "q_proj", x, hidden, heads * qk, False)
        q = _heads(g, q, heads, qk)
        q_nope, q_rope = g.op_n("Split", [q, g.const([nope, rope], _I64)], 2, axis=-1)
        compressed = _linear(g, "kv_a_proj_with_mqa", x, hidden, kv_rank + rope, False)
        latent, k_rope = g.op_n("Split", [compressed, g.const([kv_rank, rope], _I64)], 2, axis=-1)
        kv = _linear(g, "kv_b_proj", _norm(g, _LLAMA, "kv_a_layernorm", latent, kv_rank), kv_rank,
                     heads * (nope + v_dim), False)
        k_nope, v = g.op_n("Split", [_heads(g, kv, heads, nope + v_dim), g.const([nope, v_dim], _I64)], 2, axis=-1)
        k_rope = _heads(g, k_rope, 1, rope)  # one rotary key shared by every head
        q_rope, k_rope = _rotary(g, x, q_rope, k_rope, rope)
        k_rope = g.op("Expand", [k_rope, g.const([1, heads, 1, 1], _I64)])
        q = g.op("Concat", [q_nope, q_rope], axis=-1)
        k = g.op("Concat", [k_nope, k_rope], axis=-1)
        return _linear(g, "o_proj", _scaled_scores(g, q, k, v, qk, heads * v_dim), heads * v_dim, hidden, False)


# ---------------------------------------------------------------------------------------------- MLPs
def _swiglu(g: GraphBuilder, name: str, x: str, hidden: int, ffn: int) -> str:
    """down(silu(gate(x)) * up(x)) with 2-D weights."""
    with g.scope(name):
        gate = _linear(g, "gate_proj", x, hidden, ffn, False)
        up = _linear(g, "up_proj", x, hidden, ffn, False)
        return _linear(g, "down_proj", g.op("Mul", [g.op("Mul", [gate, g.op("Sigmoid", [gate])]), up]), ffn,
                       hidden, False)


def _router(g: GraphBuilder, cfg: Mapping[str, Value], x: str) -> str:
    """Dense gates [batch, seq, experts]: the top_k renormalised scores of each token, zero elsewhere."""
    hidden, experts, top_k = int(cfg["hidden"]), int(cfg["experts"]), int(cfg["top_k"])
    with g.scope("gate"):
        logits = g.op("MatMul", [x, g.weight("weight", [hidden, experts])])
    scores = g.op("Softmax" if cfg["router"] == "softmax" else "Sigmoid", [logits], **(
        {"axis": -1} if cfg["router"] == "softmax" else {}))
    top_scores, top_index = g.op_n("TopK", [scores, g.const([top_k], _I64)], 2, axis=-1)
    total = g.op("ReduceSum", [top_scores, g.const([-1], _I64)], keepdims=1)
    chosen = g.op("ReduceMax", [g.op("OneHot", [top_index, g.const(experts, _I64), g.const([0, 1], DTYPE)],
                                     axis=-1), g.const([-2], _I64)], keepdims=0)  # [batch, seq, experts]
    return g.op("Div", [g.op("Mul", [scores, chosen]), total])


def _sparse_experts(g: GraphBuilder, cfg: Mapping[str, Value], x: str) -> str:
    hidden, experts, top_k, ffn = (int(cfg[k]) for k in ("hidden", "experts", "top_k", "expert_ffn"))
    gates = _router(g, cfg, x)
    with g.scope("dispatch"):
        # capacity = ceil(seq * top_k / experts), from the runtime sequence length
        seq = g.op("Shape", [x], start=1, end=2)
        capacity = g.op("Div", [g.op("Add", [g.op("Mul", [seq, g.const([top_k], _I64)]),
                                             g.const([experts - 1], _I64)]), g.const([experts], _I64)])
        by_expert = g.op("Transpose", [gates], perm=[0, 2, 1])  # [batch, experts, seq]
        weight, token = g.op_n("TopK", [by_expert, capacity], 2, axis=-1)  # [batch, experts, capacity]
        rows = g.op("Expand", [g.op("Reshape", [token, g.const([0, -1, 1], _I64)]), g.const([1, 1, hidden], _I64)])
        picked = g.op("GatherElements", [x, rows], axis=1)  # [batch, experts * capacity, hidden]
        picked = g.op("Reshape", [picked, g.const([0, experts, -1, hidden], _I64)])
    with g.scope("experts"):
        gate = g.op("MatMul", [picked, g.weight("gate_proj", [experts, hidden, ffn])])
        up = g.op("MatMul", [picked, g.weight("up_proj", [experts, hidden, ffn])])
        inner = g.op("Mul", [g.op("Mul", [gate, g.op("Sigmoid", [gate])]), up])
        out = g.op("MatMul", [inner, g.weight("down_proj", [experts, ffn, hidden])])  # [batch, e, capacity, h]
    with g.scope("combine"):
        weighted = g.op("Mul", [out, g.op("Unsqueeze", [weight, g.const([-1], _I64)])])
        # summed in fp32, as Hugging Face's MoE blocks add their routed outputs (index_add_ in float32)
        flat = g.op("Cast", [g.op("Reshape", [weighted, g.const([0, -1, hidden], _I64)])], to=TensorProto.FLOAT)
        zeros = g.op("ConstantOfShape", [g.op("Shape", [x])],
                     value=onnx.helper.make_tensor("", TensorProto.FLOAT, [1], [0]))
        routed = g.op("Cast", [g.op("ScatterElements", [zeros, rows, flat], axis=1, reduction="add")], to=DTYPE)
    shared = int(cfg["shared_experts"])
    if shared:
        routed = g.op("Add", [routed, _swiglu(g, "shared_experts", x, hidden, shared * ffn)])
    return routed


def _block(g: GraphBuilder, cfg: Mapping[str, Value], index: int, x: str) -> str:
    hidden = int(cfg["hidden"])
    attention = _mla if cfg["attention"] == "mla" else _gqa
    x = g.op("Add", [x, attention(g, cfg, _norm(g, _LLAMA, "attn_norm", x, hidden))])
    normed = _norm(g, _LLAMA, "mlp_norm", x, hidden)
    if index < int(cfg["dense_layers"]):
        mlp = _swiglu(g, "mlp", normed, hidden, int(cfg["dense_ffn"]))
    else:
        with g.scope("mlp"):
            mlp = _sparse_experts(g, cfg, normed)
    return g.op("Add", [x, mlp])


def build_moe(cfg: Mapping[str, Value], weights_file: str) -> onnx.ModelProto:
    hidden, vocab = int(cfg["hidden"]), int(cfg["vocab"])
    g = GraphBuilder(weights_file, DTYPE)
    ids = g.input("input_ids", _I64, [BATCH, SEQ])
    with g.scope("embed"), g.scope("word"):
        x = g.op("Gather", [g.weight("weight", [vocab, hidden]), ids])
    for index in range(int(cfg["layers"])):
        with g.scope(f"layers.{index}"):
            x = _block(g, cfg, index, x)
    with g.scope("head"):
        logits = _linear(g, "lm_head", _norm(g, _LLAMA, "norm", x, hidden), hidden, vocab, False)
    g.output(logits, DTYPE, [BATCH, SEQ, vocab])
    metadata = {
        "planner.family": NAME,
        "planner.config": json.dumps(dict(cfg), sort_keys=True),
        "planner.default_dims": json.dumps({SEQ: int(cfg["seq_len"])}, sort_keys=True),
    }
    return g.model(f"{NAME}-{cfg['layers']}l-{cfg['experts']}e-top{cfg['top_k']}", metadata)


# ------------------------------------------------------------------------------------------ keys
def _bad(key: str, value: object, valid: str) -> ConfigError:
    return ConfigError(f"{NAME}: key '{key}' = {value} is invalid; expected {valid}")


def _quarter_divisor(heads: int) -> int:
    """The default kv_heads of gqa: the largest divisor of heads up to heads/4 (Mixtral's 8 of 32)."""
    return max(d for d in range(1, max(heads // 4, 1) + 1) if heads % d == 0)


def _check(cfg: dict[str, Value]) -> None:
    hidden, heads, experts, top_k = (int(cfg[k]) for k in ("hidden", "heads", "experts", "top_k"))
    if top_k > experts:
        raise _bad("top_k", top_k, f"an integer from 1 to 'experts' = {experts}")
    if cfg["attention"] == "mla":
        if "head_dim" in cfg:
            raise ConfigError(f"{NAME}: key 'head_dim' applies to attention=mha/gqa; with mla give "
                              f"qk_nope_head_dim, qk_rope_head_dim and v_head_dim")
        for key, default in MLA_DEFAULTS.items():
            cfg.setdefault(key, default)
        if int(cfg["qk_rope_head_dim"]) % 2:
            raise _bad("qk_rope_head_dim", cfg["qk_rope_head_dim"], "an even integer (rotary pairs)")
        cfg.setdefault("kv_heads", heads)
    else:
        for key in MLA_DEFAULTS:
            if key in cfg:
                raise ConfigError(f"{NAME}: key '{key}' applies only to attention=mla (attention is "
                                  f"{cfg['attention']}); drop it or set attention=mla")
        cfg.setdefault("kv_heads", heads if cfg["attention"] == "mha" else _quarter_divisor(heads))
        kv_heads = int(cfg["kv_heads"])
        if kv_heads > heads or heads % kv_heads:
            divisors = [str(d) for d in range(1, heads + 1) if heads % d == 0]
            raise _bad("kv_heads", kv_heads, f"a divisor of 'heads' = {heads}: one of {', '.join(divisors)}")
        if cfg["attention"] == "mha" and kv_heads != heads:
            raise _bad("kv_heads", kv_heads, f"'heads' = {heads} with attention=mha (or set attention=gqa)")
        if "head_dim" not in cfg:
            if hidden % heads:
                raise _bad("heads", heads, f"a divisor of 'hidden' = {hidden}, or give head_dim")
            cfg["head_dim"] = hidden // heads
        if int(cfg["head_dim"]) % 2:
            raise _bad("head_dim", cfg["head_dim"], "an even integer (rotary pairs)")
    layers, dense = int(cfg["layers"]), int(cfg["dense_layers"])
    if dense > layers:
        raise _bad("dense_layers", dense, f"an integer from 0 to 'layers' = {layers}")
    cfg.setdefault("dense_ffn", int(cfg["expert_ffn"]) * (top_k + int(cfg["shared_experts"])))
    _check_sizes(cfg)


def _check_sizes(cfg: dict[str, Value]) -> None:
    """The tensors that can grow past the importer's limits within the keys' maxima (one sample of
    seq_len tokens): the attention scores, the batched expert weights and activations, and the MLPs whose
    width is a product of keys. The other weights and activations stay within the limits by the maxima."""
    hidden, heads, seq_len = int(cfg["hidden"]), int(cfg["heads"]), int(cfg["seq_len"])
    experts, top_k, ffn = int(cfg["experts"]), int(cfg["top_k"]), int(cfg["expert_ffn"])
    check_attention_scores(NAME, heads, seq_len)
    check_elements(NAME, f"one batched expert weight (experts x hidden x expert_ffn = {experts} x {hidden} x "
                   f"{ffn})", experts * hidden * ffn, MAX_WEIGHT_ELEMENTS,
                   "lower 'experts', 'hidden' or 'expert_ffn'")
    capacity = -(-seq_len * top_k // experts)  # tokens per expert, as the dispatch computes it
    check_elements(NAME, f"the expert activations of one sequence (experts x capacity x max(hidden, expert_ffn)"
                   f" = {experts} x {capacity} x {max(hidden, ffn)})", experts * capacity * max(hidden, ffn),
                   MAX_ACTIVATION_ELEMENTS, "lower 'seq_len', 'top_k', 'hidden' or 'expert_ffn'")
    widths = [("(shared_experts x expert_ffn)", int(cfg["shared_experts"]) * ffn, "'shared_experts' or 'expert_ffn'")]
    if int(cfg["dense_layers"]):
        widths.append(("dense_ffn", int(cfg["dense_ffn"]), "'dense_ffn'"))
    for name, width, keys in widths:
        check_elements(NAME, f"an MLP weight (hidden x {name} = {hidden} x {width})", hidden * width,
                       MAX_WEIGHT_ELEMENTS, f"lower 'hidden', {keys}")
        check_elements(NAME, f"an MLP activation of one sequence (seq_len x {name} = {seq_len} x {width})",
                       seq_len * width, MAX_ACTIVATION_ELEMENTS, f"lower 'seq_len', {keys}")


FAMILY = Family(
    NAME,
    "mixture-of-experts decoder (router + top-k SwiGLU experts, GQA or MLA attention); defaults: Mixtral 8x7B",
    (
        Key("layers", INT, "transformer blocks", 32, minimum=1, maximum=MAX_LAYERS),
        Key("hidden", INT, "hidden size h", 4096, minimum=1, maximum=MAX_HIDDEN),
        Key("heads", INT, "attention (query) heads", 32, minimum=1, maximum=MAX_HEADS),
        Key("kv_heads", INT, "key/value heads (gqa; must divide heads)", default_text="heads/4 (gqa), heads",
            minimum=1, maximum=MAX_HEADS),
        Key("head_dim", INT, "size of one attention head (mha/gqa)", default_text="hidden/heads", minimum=2,
            maximum=MAX_HEAD_DIM),
        Key("vocab", INT, "vocabulary size V", 32000, minimum=1, maximum=MAX_VOCAB),
        Key("seq_len", INT, "sequence length s (default of the symbolic 'seq' dimension)", 4096, minimum=1,
            maximum=MAX_SEQ_LEN),
        Key("attention", STR, "attention kind", "gqa", choices=("mha", "gqa", "mla")),
        Key("experts", INT, "routed experts per MoE layer", 8, minimum=1, maximum=MAX_EXPERTS),
        Key("top_k", INT, "experts each token is routed to (1..experts)", 2, minimum=1, maximum=MAX_EXPERTS),
        Key("shared_experts", INT, "experts every token goes through (DeepSeek)", 0, minimum=0,
            maximum=MAX_EXPERTS),
        Key("expert_ffn", INT, "inner (SwiGLU) width of one expert", 14336, minimum=1, maximum=MAX_FFN),
        Key("router", STR, "router scoring before top-k", "softmax", choices=("softmax", "sigmoid")),
        Key("dense_layers", INT, "first blocks with a dense MLP instead of experts", 0, minimum=0,
            maximum=MAX_LAYERS),
        Key("dense_ffn", INT, "inner width of the dense MLP of those blocks",
            default_text="expert_ffn*(top_k+shared_experts)", minimum=1, maximum=MAX_FFN),
        Key("q_lora_rank", INT, "mla: query bottleneck rank (0: a full query projection)",
            default_text=str(MLA_DEFAULTS["q_lora_rank"]), minimum=0, maximum=MAX_HIDDEN),
        Key("kv_lora_rank", INT, "mla: key/value latent rank", default_text=str(MLA_DEFAULTS["kv_lora_rank"]),
            minimum=1, maximum=MAX_HIDDEN),
        Key("qk_rope_head_dim", INT, "mla: rotary part of each query/key head",
            default_text=str(MLA_DEFAULTS["qk_rope_head_dim"]), minimum=2, maximum=MAX_HEAD_DIM),
        Key("qk_nope_head_dim", INT, "mla: non-rotary part of each query/key head",
            default_text=str(MLA_DEFAULTS["qk_nope_head_dim"]), minimum=1, maximum=MAX_HEAD_DIM),
        Key("v_head_dim", INT, "mla: value head size", default_text=str(MLA_DEFAULTS["v_head_dim"]), minimum=1,
            maximum=MAX_HEAD_DIM),
    ),
    build_moe,
    _check,
)
