"""Attention and experts written as single ops: the opset-23 ``Attention`` node (what the dynamo exporter
makes of ``F.scaled_dot_product_attention``) and ``Einsum`` products. Real exports of tiny decoders
(tests/fixtures/attention, made by make_attention_exports.py) against counts written out here, and small
hand-built graphs for the forms torch does not export (3-D Attention inputs, a key/value cache, einsum
ellipses)."""

from __future__ import annotations

import dataclasses
import glob
import json
import os

import numpy as np
import pytest
from onnx import TensorProto as T
from onnx import helper as h

from _graph_util import GraphBuilder
from planner.cli import main
from planner.cost.compute import layer_costs
from planner.graph import import_model_proto, load_model
from planner.hardware import load_cluster
from planner.runtime import get_runtime

HERE = os.path.join(os.path.dirname(__file__), "fixtures", "attention")
FIXTURES = sorted(os.path.basename(p)[:-len(".onnx")] for p in glob.glob(os.path.join(HERE, "*.onnx")))
LAYERS, HIDDEN, HEADS, KV_HEADS, HEAD_DIM, FFN, VOCAB = 2, 64, 4, 2, 16, 96, 256
EXPERTS, TOP_K, EXPERT_FFN = 4, 2, 48


def _record(stem: str) -> dict:
    with open(os.path.join(HERE, f"{stem}.json"), encoding="utf-8") as handle:
        return json.load(handle)


def _hand_count(stem: str, seq: int) -> tuple[float, int]:
    """(matrix-product FLOPs per sample, parameters) of the fixtures' config: q, o 2*2*s*h*(a*d); k, v
    2*2*s*h*(kv*d); Q·Kᵀ and P·V 4*s^2*(a*d) (no causal halving); SwiGLU 3*2*s*h*ffn, or the router 2*s*h*E,
    the routed experts 3*2*(s*top_k)*h*expert_ffn and the combine einsum over every expert 2*E*s*h (a
    weighted sum the graph writes as a product); the head 2*s*h*V."""
    s, h, a, kv, d = seq, HIDDEN, HEADS, KV_HEADS, HEAD_DIM
    attention = 2 * 2 * s * h * (a * d) + 2 * 2 * s * h * (kv * d) + 4 * s * s * (a * d)
    attention_params = 2 * h * (a * d) + 2 * h * (kv * d)
    if stem.startswith("moe"):
        mlp = 2 * s * h * EXPERTS + 3 * 2 * (s * TOP_K) * h * EXPERT_FFN + 2 * EXPERTS * s * h
        mlp_params = h * EXPERTS + EXPERTS * 3 * h * EXPERT_FFN
    else:
        mlp, mlp_params = 3 * 2 * s * h * FFN, 3 * h * FFN
    flops = LAYERS * (attention + mlp) + 2 * s * h * VOCAB
    params = VOCAB * h + LAYERS * (attention_params + mlp_params + 2 * h) + h + h * VOCAB
    return float(flops), params


def _matmul_flops(graph) -> float:
    return sum(op.flops for layer in graph.layers for op in layer.ops if op.gemm is not None)


def test_fixtures_cover_each_form():
    assert {"llama_sdpa.dynamo", "llama_sdpa_gqa.dynamo", "llama_einsum.torchscript", "moe_einsum.torchscript",
            "llama_sdpa.torchscript"} <= set(FIXTURES), "run tests/fixtures/attention/make_attention_exports.py"
    assert sum(os.path.getsize(os.path.join(HERE, f"{stem}.onnx")) for stem in FIXTURES) < 1_000_000


@pytest.mark.parametrize("stem", FIXTURES)
@pytest.mark.parametrize("seq", [64, 2048])
def test_flops_params_and_dims_match_the_config(stem, seq):
    record = _record(stem)
    graph = load_model(os.path.join(HERE, f"{stem}.onnx"), dims={"batch": 1, "seq": seq})
    flops, params = _hand_count(stem, seq)
    assert graph.params == params == record["params"]
    assert _matmul_flops(graph) == pytest.approx(flops, rel=1e-9)
    assert not graph.warnings
    blocks = [layer for layer in graph.layers if layer.kind == "block"]
    assert len(blocks) == LAYERS
    for block in blocks:
        dims = block.transformer
        assert dims is not None
        assert (dims.hidden, dims.heads, dims.kv_heads, dims.head_dim, dims.v_head_dim, dims.seq_len, dims.causal) \
            == (HIDDEN, HEADS, KV_HEADS, HEAD_DIM, HEAD_DIM, seq, True)
        if stem.startswith("moe"):
            assert block.moe is not None
            assert (block.moe.experts, block.moe.top_k, block.moe.expert_ffn, block.moe.shared_experts) == \
                (EXPERTS, TOP_K, EXPERT_FFN, 0)
            assert block.moe.expert_params == EXPERTS * 3 * HIDDEN * EXPERT_FFN
        else:
            assert block.moe is None and dims.ffn == FFN and dims.gated_mlp


def _block_times(stem: str, attention: str) -> tuple[float, float]:
    """(attention kernel forward, backward) seconds of the first block, tp 2, on an A100."""
    graph = load_model(os.path.join(HERE, f"{stem}.onnx"), dims={"batch": 1, "seq": 256})
    node = load_cluster("dgx-a100-80gb*1").groups[0].node
    runtime = dataclasses.replace(get_runtime("megatron-core"), name=f"test-{attention}", attention=attention)
    costs = layer_costs(graph, node, 2, 4, "none", False, "bf16", runtime=runtime)
    block = next(k for k, layer in enumerate(graph.layers) if layer.kind == "block")
    return float(costs.attention_kernel_forward_s[block]), float(costs.attention_kernel_backward_s[block])


@pytest.mark.parametrize("attention", ["flash", "fused-softmax"])
@pytest.mark.parametrize("stem", ["llama_sdpa.dynamo", "llama_sdpa_gqa.dynamo", "llama_einsum.torchscript"])
def test_single_op_attention_is_timed_as_the_matmul_softmax_core(stem, attention):
    """The same attention exported as MatMul/Softmax (TorchScript's decomposition of the SDPA call) is the
    reference: the Attention node and the einsum products cost what it costs, tensor-parallel split included."""
    reference = _block_times("llama_sdpa.torchscript", attention)
    assert reference[0] > 0
    assert _block_times(stem, attention) == pytest.approx(reference, rel=1e-9)


@pytest.mark.parametrize("stem", ["llama_sdpa.dynamo", "llama_sdpa_gqa.dynamo"])
def test_an_unfused_attention_op_runs_the_kernels_of_its_decomposition(stem):
    """Unfused, the Attention node is its graph's kernels one by one (Q·Kᵀ, the causal mask's add, the
    softmax, P·V), as the MatMul/Softmax export runs them."""
    assert _block_times(stem, "unfused") == pytest.approx(_block_times("llama_sdpa.torchscript", "unfused"),
                                                          rel=1e-9)


@pytest.mark.parametrize("stem", ["llama_sdpa.dynamo", "llama_sdpa_gqa.dynamo"])
def test_tp_beyond_the_kv_heads_is_refused(stem, capsys):
    code = main(["plan", os.path.join(HERE, f"{stem}.onnx"), "--dim", "seq=64", "--cluster", "dgx-a100-80gb*1",
                 "--global-batch", "8", "--tp", "4"])
    assert code != 0
    assert f"does not divide the model's {KV_HEADS} key/value heads" in capsys.readouterr().err


# ------------------------------------------------------------------------------------- hand-built graphs
def _attention_graph(three_d: bool, past: int = 0, **attrs) -> tuple:
    """x [batch, 8, 64] -> Q (4 heads of 16), K and V (2 heads) projections -> Attention -> output
    projection; with ``past`` cached keys and values."""
    g = GraphBuilder()
    q = g.op("MatMul", ["x", g.weight("wq", [64, 64])])
    k = g.op("MatMul", ["x", g.weight("wk", [64, 32])])
    v = g.op("MatMul", ["x", g.weight("wv", [64, 32])])
    if not three_d:  # [batch, heads, 8, 16]
        q, k, v = (g.op("Transpose", [g.op("Reshape", [t, g.const(f"heads{i}", np.array([0, 8, n, 16]))])],
                        perm=[0, 2, 1, 3]) for i, (t, n) in enumerate(((q, 4), (k, 2), (v, 2))))
    inputs = [q, k, v]
    data = [h.make_tensor_value_info("x", T.FLOAT, ["batch", 8, 64])]
    if past:
        data += [h.make_tensor_value_info(n, T.FLOAT, ["batch", 2, past, 16]) for n in ("past_k", "past_v")]
        inputs += ["", "past_k", "past_v"]
        attrs.update(n_out=3)
    if three_d:
        attrs.update(q_num_heads=4, kv_num_heads=2)
    out = g.op("Attention", inputs, **attrs)
    y = out[0] if past else out
    if not three_d:
        y = g.op("Reshape", [g.op("Transpose", [y], perm=[0, 2, 1, 3]),
                             g.const("back", np.array([0, 8, 64]))])
    y = g.op("MatMul", [y, g.weight("wo", [64, 64])])
    return g.model(data, [y], opset=23)


@pytest.mark.parametrize("three_d", [False, True])
@pytest.mark.parametrize("past", [0, 24])
def test_attention_node_flops_and_kernels(three_d, past):
    graph = import_model_proto(_attention_graph(three_d, past, is_causal=1))
    ops = [op for layer in graph.layers for op in layer.ops]
    keys = 8 + past
    scores = 4 * 8 * keys
    qk, mask, softmax, pv = [op for op in ops if op.name.startswith("Attention")]  # its kernels, named after it
    assert (qk.op_type, mask.op_type, softmax.op_type, pv.op_type) == ("MatMul", "Add", "Softmax", "MatMul")
    assert qk.gemm == (4 * 8, keys, 16) and pv.gemm == (4 * 8, 16, keys)
    assert qk.flops == pv.flops == 2 * scores * 16
    assert mask.flops == scores  # the causal triangle added
    assert softmax.flops == (5 + 1) * scores  # softmax and scale
    assert softmax.bytes_read == softmax.bytes_written == mask.bytes_written == 2 * scores
    projections = 2 * 8 * 64 * (64 + 32 + 32 + 64)
    assert graph.flops_forward == pytest.approx(projections + 4 * scores * 16 + 7 * scores)


@pytest.mark.parametrize("equation, shapes, gemm", [
    ("bhqd,bhkd->bhqk", (["batch", 4, 8, 16], ["batch", 4, 10, 16]), (4 * 8, 10, 16)),
    ("bhqk,bhkd->bhqd", (["batch", 4, 8, 10], ["batch", 4, 10, 16]), (4 * 8, 16, 10)),
    ("...qd,...kd->...qk", (["batch", 4, 8, 16], ["batch", 4, 10, 16]), (4 * 8, 10, 16)),
    ("bik,bkj", (["batch", 8, 16], ["batch", 16, 10]), (8, 10, 16)),  # implicit output ij: b summed too
    ("bteh,bte->bth", (["batch", 8, 4, 16], ["batch", 8, 4]), (8 * 16, 1, 4)),  # a weighted sum over e
    ("bij,bij->bij", (["batch", 8, 16], ["batch", 8, 16]), None),  # element-wise: nothing summed
])
def test_einsum_products_carry_their_gemm(equation, shapes, gemm):
    g = GraphBuilder()
    data = [h.make_tensor_value_info(n, T.FLOAT, s) for n, s in zip("ab", shapes)]
    y = g.op("Einsum", ["a", "b"], equation=equation)
    (op,) = [op for layer in import_model_proto(g.model(data, [y])).layers for op in layer.ops]
    assert op.gemm == gemm


def test_einsum_weight_gives_output_features_either_side():
    """``kn,bsk->bsn``: the weight first; its output width is the product's n, as a MatMul's weight gives."""
    for equation, operands in (("bsk,kn->bsn", ["x", "w"]), ("kn,bsk->bsn", ["w", "x"])):
        g = GraphBuilder()
        g.weight("w", [32, 16])
        y = g.op("Einsum", operands, equation=equation)
        model = g.model([h.make_tensor_value_info("x", T.FLOAT, ["batch", 8, 32])], [y])
        (op,) = [op for layer in import_model_proto(model).layers for op in layer.ops]
        assert op.gemm == (8, 16, 32) and op.flops == 2 * 8 * 32 * 16
