"""Mixture-of-experts import: real torch.onnx exports of tiny Mixtral / Qwen3-MoE models (tests/fixtures/moe,
made by make_moe_exports.py), the builders' moe family through the importer, inspect's MoE fields, and the
dense models importing exactly as before (no experts found, the same FLOPs and parameters)."""

from __future__ import annotations

import glob
import json
import os

import pytest

from planner.builders import build
from planner.commands.inspect import to_document
from planner.graph import import_model_proto, load_model

HERE = os.path.dirname(__file__)
MOE = os.path.join(HERE, "fixtures", "moe")
EXPORTS = os.path.join(HERE, "fixtures", "exports")
FIXTURES = sorted(os.path.basename(p)[:-len(".onnx")] for p in glob.glob(os.path.join(MOE, "*.onnx")))


def _record(stem: str) -> dict:
    with open(os.path.join(MOE, f"{stem}.json")) as handle:
        return json.load(handle)


def _matmul_flops(graph) -> float:
    return sum(op.flops for layer in graph.layers for op in layer.ops if op.gemm is not None)


# ---------------------------------------------------------------------------------------- real exports
def _hand_count(model: str) -> tuple[float, int, int]:
    """(matmul FLOPs per sample, parameters, active parameters) of the fixtures' configs, written out:
    2 layers, hidden h=64, 4 heads, 2 kv heads, vocab V=256, seq s=16, top-2, untied LM head."""
    s, h, a, kv, v, layers, k = 16, 64, 4, 2, 256, 2, 2
    if model.startswith("mixtral"):
        experts, ffn, d, qk_norms = 4, 128, 16, 0
    else:  # qwen3_moe: head_dim 16 given explicitly, RMSNorm on each query and key head
        experts, ffn, d, qk_norms = 8, 32, 16, 2 * 16
    attention = 2 * 2 * s * h * (a * d) + 2 * 2 * s * h * (kv * d) + 4 * s * s * (a * d)  # q, o; k, v; QK, PV
    router = 2 * s * h * experts
    routed = 3 * 2 * (s * k) * h * ffn  # gate, up, down: s*top_k token rows through one expert's matrices
    flops = layers * (attention + router + routed) + 2 * s * h * v
    expert_params = experts * 3 * h * ffn
    per_layer = (h * a * d * 2 + h * kv * d * 2) + h * experts + expert_params + 2 * h + qk_norms
    params = layers * per_layer + 2 * v * h + h  # embedding, LM head, final norm
    active = params - layers * expert_params * (experts - k) // experts
    return float(flops), params, active


@pytest.mark.parametrize("stem", FIXTURES)
def test_real_export_experts_and_routed_flops(stem):
    record = _record(stem)
    cfg = record["config"]
    graph = load_model(os.path.join(MOE, f"{stem}.onnx"), dims={"batch": 1, "seq": 16})  # refuses on unknown ops
    blocks = [layer for layer in graph.layers if layer.kind == "block"]
    assert len(blocks) == 2
    for layer in blocks:
        assert layer.moe is not None, layer.name
        assert (layer.moe.experts, layer.moe.top_k, layer.moe.expert_ffn, layer.moe.shared_experts) == \
            (cfg["experts"], cfg["top_k"], cfg["expert_ffn"], 0)
        assert layer.moe.router == "softmax" and layer.moe.tokens == 16
        assert layer.transformer is not None and layer.transformer.kv_heads == cfg["kv_heads"]
        assert layer.transformer.ffn == cfg["top_k"] * cfg["expert_ffn"]
    flops, params, active = _hand_count(record["model"])
    assert flops == record["analytic_matmul_flops_per_sample"]
    assert _matmul_flops(graph) == pytest.approx(flops, rel=1e-9)
    assert params == record["params"]
    # the dynamo exports keep the rotary inv_freq buffer (head_dim/2 floats) as an initializer
    extra = graph.params - params
    assert extra in (0, 8)
    assert graph.active_params - extra == active


def test_eager_exports_are_there():
    """The eager (per-expert loop) form exists for the TorchScript exporter; torch.export cannot trace its
    data-dependent loop over the experts hit (failures.json says why)."""
    assert {"mixtral_eager.torchscript", "qwen3_moe_eager.torchscript", "mixtral_batched_mm.dynamo",
            "qwen3_moe_batched_mm.dynamo"} <= set(FIXTURES)
    with open(os.path.join(MOE, "failures.json")) as handle:
        assert set(json.load(handle)) == {"mixtral_eager.dynamo", "qwen3_moe_eager.dynamo"}
    for path in glob.glob(os.path.join(MOE, "*.onnx")):
        assert os.path.getsize(path) < 200_000


def test_inspect_json_reports_experts_and_active_params():
    graph = load_model(os.path.join(MOE, "mixtral_eager.torchscript.onnx"), dims={"batch": 1, "seq": 16})
    doc = to_document(graph)
    _, params, active = _hand_count("mixtral")
    assert doc["params"] == params and doc["active_params"] == active
    block = next(layer for layer in doc["layers"] if layer["kind"] == "block")
    assert {k: block[k] for k in ("experts", "top_k", "shared_experts", "expert_ffn")} == \
        {"experts": 4, "top_k": 2, "shared_experts": 0, "expert_ffn": 128}
    assert block["active_params"] == block["params"] - 4 * 3 * 64 * 128 // 2
    dense = next(layer for layer in doc["layers"] if layer["kind"] == "head")
    assert "experts" not in dense and dense["active_params"] == dense["params"]


# ---------------------------------------------------------------------------------------- the builder
TINY = {"layers": 3, "hidden": 64, "heads": 4, "kv_heads": 2, "vocab": 100, "seq_len": 32, "experts": 4,
        "top_k": 2, "expert_ffn": 48}


def test_built_moe_imports_with_routed_expert_flops():
    graph = import_model_proto(build("moe", TINY), {"batch": 1})
    s, h, e, k, f = 32, 64, 4, 2, 48
    blocks = [layer for layer in graph.layers if layer.kind == "block"]
    assert len(blocks) == 3
    for layer in blocks:
        assert layer.moe is not None
        assert (layer.moe.experts, layer.moe.top_k, layer.moe.expert_ffn, layer.moe.tokens) == (e, k, f, s)
        assert layer.moe.expert_params == e * 3 * h * f
        experts = [op for op in layer.ops if "/experts/" in op.name and op.op_type == "MatMul"]
        assert len(experts) == 3
        # capacity s*k/e = 16 rows per expert, 4 experts: s*k rows through one expert's [64, 48] matrix
        assert all(op.flops == 2 * s * k * h * f for op in experts)
        router = next(op for op in layer.ops if "/mlp/gate/" in op.name and op.op_type == "MatMul")
        assert router.flops == 2 * s * h * e and router.tp_split == "replicated"
        assert layer.transformer.kv_heads == 2 and layer.transformer.ffn == k * f


def test_built_deepseek_like_dense_layers_shared_experts_and_mla():
    cfg = {"layers": 3, "hidden": 64, "heads": 4, "vocab": 100, "seq_len": 32, "attention": "mla",
           "q_lora_rank": 24, "kv_lora_rank": 16, "qk_rope_head_dim": 8, "qk_nope_head_dim": 16,
           "v_head_dim": 16, "experts": 8, "top_k": 2, "shared_experts": 1, "expert_ffn": 32,
           "dense_layers": 1, "dense_ffn": 160, "router": "sigmoid"}
    graph = import_model_proto(build("moe", cfg), {"batch": 1})
    blocks = [layer for layer in graph.layers if layer.kind == "block"]
    assert blocks[0].moe is None and blocks[0].transformer.ffn == 160
    for layer in blocks[1:]:
        assert layer.moe is not None
        assert (layer.moe.experts, layer.moe.top_k, layer.moe.shared_experts, layer.moe.expert_ffn,
                layer.moe.router) == (8, 2, 1, 32, "sigmoid")
        assert layer.transformer.heads == 4 and layer.transformer.kv_heads == 4
        assert layer.transformer.ffn == (2 + 1) * 32
        assert layer.active_params == layer.params - 8 * 3 * 64 * 32 * 6 // 8


def test_estimate_runs_on_a_built_moe_with_its_active_flops():
    from planner.cost.estimator import estimate
    from planner.hardware.cluster import load_cluster
    from planner.types import ParallelConfig

    graph = import_model_proto(build("moe", TINY), {"batch": 1})
    cluster = load_cluster(os.path.join(HERE, "..", "hardware_profiles", "clusters", "dgx-a100-16.yaml"))
    result = estimate(graph, cluster, ParallelConfig(global_batch=8, tp=2, pp=1, dp=8))
    assert result.feasible and result.iteration_time_s > 0


# ----------------------------------------------------------------------------------------- dense models
# (params, forward FLOPs per sample) as imported before mixture-of-experts detection existed
DENSE = {
    "gpt2.dynamo": (557568, 72253440.0), "gpt2.torchscript": (557568, 72257536.0),
    "llama.dynamo": (625296, 68621248.0), "llama.torchscript": (625280, 68625344.0),
    "bert.dynamo": (575592, 74562048.0), "t5.torchscript": (1047296, 104500832.0),
    "dlrm.dynamo": (61329, 8517.0), "resnet18.torchscript": (11691432, 3638007272.0),
    "vit.dynamo": (425098, 14759882.0),
}


@pytest.mark.parametrize("stem", DENSE)
def test_dense_exports_import_as_before(stem):
    with open(os.path.join(EXPORTS, f"{stem}.json")) as handle:
        dims = json.load(handle)["dims"]
    graph = load_model(os.path.join(EXPORTS, f"{stem}.onnx"), dims=dims)
    assert all(layer.moe is None for layer in graph.layers)
    assert (graph.params, graph.flops_forward) == DENSE[stem]
    assert graph.active_params == graph.params


@pytest.mark.parametrize("family,params,flops,kv_heads", [
    ("gpt", 125950464, 669571350528.0, 12), ("llama", 6738415616, 63059381727232.0, 32),
    ("bert", 109514298, 121860683776.0, 12),
])
def test_dense_builders_import_as_before(family, params, flops, kv_heads):
    graph = import_model_proto(build(family), {"batch": 1})
    assert all(layer.moe is None for layer in graph.layers)
    assert (graph.params, graph.flops_forward) == (params, flops)
    assert next(layer for layer in graph.layers if layer.transformer).transformer.kv_heads == kv_heads
