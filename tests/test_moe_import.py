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
    if model.startswith("moe_modulelist"):  # no attention; a ModuleList of 4 experts of width 96
        experts, ffn = 4, 96
        expert_params = experts * 3 * h * ffn
        flops = layers * (2 * s * h * experts + 3 * 2 * (s * k) * h * ffn) + 2 * s * h * v
        params = layers * (h * experts + expert_params + h) + 2 * v * h + h
        return float(flops), params, params - layers * expert_params * (experts - k) // experts
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
        if "kv_heads" in cfg:
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
    """The eager (per-expert loop) form of transformers' Mixtral and Qwen3-MoE exists for the TorchScript
    exporter only: torch.export cannot trace their data-dependent loop over the experts hit (failures.json
    says why); the ModuleList form loops over every expert and exports both ways."""
    assert {"mixtral_eager.torchscript", "qwen3_moe_eager.torchscript", "mixtral_batched_mm.dynamo",
            "qwen3_moe_batched_mm.dynamo", "moe_modulelist_eager.torchscript",
            "moe_modulelist_eager.dynamo"} <= set(FIXTURES)
    with open(os.path.join(MOE, "failures.json")) as handle:
        assert set(json.load(handle)) == {"mixtral_eager.dynamo", "qwen3_moe_eager.dynamo"}
    for path in glob.glob(os.path.join(MOE, "*.onnx")):
        assert os.path.getsize(path) < 200_000


def test_eager_experts_split_like_megatron_mlps():
    graph = load_model(os.path.join(MOE, "mixtral_eager.torchscript.onnx"), dims={"batch": 1, "seq": 16})
    block = next(layer for layer in graph.layers if layer.moe is not None)
    splits = [op.tp_split for op in block.ops if "/mlp/" in op.name and op.op_type == "MatMul"]
    # the router, then per expert its fused gate-and-up (column) and its down projection (row)
    assert sorted(splits) == ["column"] * 4 + ["replicated"] + ["row"] * 4


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
        # each expert split as a Megatron MLP (gate, up by columns; down by rows); the router replicated
        assert [op.tp_split for op in experts] == ["column", "column", "row"]
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


@pytest.mark.parametrize("q_lora_rank", [24, 80])  # below and above hidden
def test_latent_attention_splits_as_megatron_core_does(q_lora_rank):
    """Multi-head latent attention under tensor parallelism: the down-projections to the latents run whole on
    every rank (Megatron-Core's duplicated linear_q_down_proj / linear_kv_down_proj, the latents normalised
    whole), the up-projections split by columns, the output projection by rows: one all-reduce per attention,
    as in ordinary attention, not one after each up-projection."""
    from planner.cost import layer_costs
    from planner.cost.calibration import calibration_for
    from planner.hardware import load_cluster

    cfg = {"layers": 1, "hidden": 64, "heads": 4, "vocab": 100, "seq_len": 32, "attention": "mla",
           "q_lora_rank": q_lora_rank, "kv_lora_rank": 16, "qk_rope_head_dim": 8, "qk_nope_head_dim": 16,
           "v_head_dim": 16, "experts": 8, "top_k": 2, "expert_ffn": 32, "dense_layers": 1, "dense_ffn": 128}
    graph = import_model_proto(build("moe", cfg), {"batch": 1})
    block = next(layer for layer in graph.layers if layer.kind == "block")
    splits = {op.name.split("/")[-2]: op.tp_split for op in block.ops if op.gemm and op.role != "attention-core"}
    assert splits == {"q_a_proj": "replicated", "q_b_proj": "column", "kv_a_proj_with_mqa": "replicated",
                      "kv_b_proj": "column", "o_proj": "row", "gate_proj": "column", "up_proj": "column",
                      "down_proj": "row"}
    llama = import_model_proto(build("llama", {"layers": 1, "hidden": 64, "heads": 4, "vocab": 100, "seq_len": 32,
                                               "ffn": 128}), {"batch": 1})
    node = load_cluster("dgx-h100*1").groups[0].node
    cal = calibration_for(node.device.name, "megatron-core")

    def tp_comm_s(model) -> float:
        costs = layer_costs(model, node, 2, 1, "none", True, "bf16", cal, "megatron-core")
        return float(sum(t for t, layer in zip(costs.tp_comm_s, model.layers) if layer.kind == "block"))

    assert tp_comm_s(graph) == pytest.approx(tp_comm_s(llama), rel=1e-12)


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


# ------------------------------------------------------------------------------------------ a Loop form
def _loop_moe(s: int = 8, h: int = 16, f: int = 24, e: int = 4, k: int = 2):
    """x -> router MatMul [h, e] -> Softmax -> TopK(k); a Loop over the e experts whose body Gathers expert
    i's [h, f] and [f, h] matrices from 3-D weights and adds relu(x W_up[i]) W_down[i], masked by whether
    the token chose expert i, to a carried sum (a scripted per-expert loop); then an output MatMul."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    def weight(name, shape):
        tensor = TensorProto(name=name, data_type=TensorProto.FLOAT, dims=list(shape))
        tensor.data_location = TensorProto.EXTERNAL
        for key, value in (("location", "loop.weights"), ("offset", "0"), ("length", str(4 * np.prod(shape)))):
            entry = tensor.external_data.add()
            entry.key, entry.value = key, value
        return tensor

    body = helper.make_graph(
        [helper.make_node("Gather", ["w_up", "i"], ["up_i"], axis=0),
         helper.make_node("Gather", ["w_down", "i"], ["down_i"], axis=0),
         helper.make_node("MatMul", ["x", "up_i"], ["a"]),
         helper.make_node("Relu", ["a"], ["r"]),
         helper.make_node("MatMul", ["r", "down_i"], ["y"]),
         helper.make_node("Cast", ["i"], ["i_f"], to=TensorProto.FLOAT),
         helper.make_node("Equal", ["idx_f", "i_f"], ["hit"]),
         helper.make_node("Cast", ["hit"], ["hit_f"], to=TensorProto.FLOAT),
         helper.make_node("ReduceSum", ["hit_f", "axis_last"], ["m"], keepdims=1),
         helper.make_node("Mul", ["y", "m"], ["ym"]),
         helper.make_node("Add", ["acc_in", "ym"], ["acc_out"]),
         helper.make_node("Identity", ["cond_in"], ["cond_out"])],
        "experts",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []),
         helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
         helper.make_tensor_value_info("acc_in", TensorProto.FLOAT, [1, s, h])],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("acc_out", TensorProto.FLOAT, [1, s, h])])
    nodes = [
        helper.make_node("MatMul", ["x", "w_router"], ["logits"]),
        helper.make_node("Softmax", ["logits"], ["probs"], axis=-1),
        helper.make_node("TopK", ["probs", "k"], ["top", "idx"], axis=-1),
        helper.make_node("Cast", ["idx"], ["idx_f"], to=TensorProto.FLOAT),
        helper.make_node("Loop", ["trips", "", "zeros"], ["moe_out"], body=body),
        helper.make_node("MatMul", ["moe_out", "w_out"], ["y"]),
    ]
    inits = [weight("w_router", [h, e]), weight("w_up", [e, h, f]), weight("w_down", [e, f, h]),
             weight("w_out", [h, h]),
             numpy_helper.from_array(np.array([k], np.int64), "k"),
             numpy_helper.from_array(np.array(e, np.int64), "trips"),
             numpy_helper.from_array(np.zeros((1, s, h), np.float32), "zeros"),
             numpy_helper.from_array(np.array([-1], np.int64), "axis_last")]
    graph = helper.make_graph(nodes, "loop_moe", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, s, h])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, s, h])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)




def _dense_gated_moe(s: int = 8, h: int = 16, f: int = 24, e: int = 4, k: int = 2):
    """x -> router MatMul [h, e] -> Softmax -> TopK(k) -> the top scores scattered into a dense [s, e] gate;
    every expert on every token, relu(x W_up[i]) W_down[i] on 2-D weights, times its gate column, summed (the
    form that exports without data-dependent shapes); then an output MatMul."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    nodes = [
        helper.make_node("MatMul", ["x", "w_router"], ["logits"]),
        helper.make_node("Softmax", ["logits"], ["probs"], axis=-1),
        helper.make_node("TopK", ["probs", "k"], ["top", "idx"], axis=-1),
        helper.make_node("ScatterElements", ["zeros_gate", "idx", "top"], ["gate"], axis=-1),
    ]
    parts = []
    for i in range(e):
        nodes += [helper.make_node("MatMul", ["x", f"w_up_{i}"], [f"a_{i}"]),
                  helper.make_node("Relu", [f"a_{i}"], [f"r_{i}"]),
                  helper.make_node("MatMul", [f"r_{i}", f"w_down_{i}"], [f"y_{i}"]),
                  helper.make_node("Slice", ["gate", f"start_{i}", f"stop_{i}", "axis_last"], [f"g_{i}"]),
                  helper.make_node("Mul", [f"y_{i}", f"g_{i}"], [f"part_{i}"])]
        parts.append(f"part_{i}")
    nodes += [helper.make_node("Sum", parts, ["moe_out"]), helper.make_node("MatMul", ["moe_out", "w_out"], ["y"])]
    rng = np.random.default_rng(0)

    def array(name, *shape):
        return numpy_helper.from_array(rng.standard_normal(shape).astype(np.float32), name)

    inits = [array("w_router", h, e), array("w_out", h, h),
             numpy_helper.from_array(np.array([k], np.int64), "k"),
             numpy_helper.from_array(np.zeros((1, s, e), np.float32), "zeros_gate"),
             numpy_helper.from_array(np.array([-1], np.int64), "axis_last")]
    for i in range(e):
        inits += [array(f"w_up_{i}", h, f), array(f"w_down_{i}", f, h),
                  numpy_helper.from_array(np.array([i], np.int64), f"start_{i}"),
                  numpy_helper.from_array(np.array([i + 1], np.int64), f"stop_{i}")]
    graph = helper.make_graph(nodes, "dense_gated_moe",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, s, h])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, s, h])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


@pytest.mark.parametrize("build, expert_ops", [
    (_loop_moe, lambda ops: [op for op in ops if op.op_type == "Loop"]),  # a scripted per-expert loop
    (_dense_gated_moe, lambda ops: [op for op in ops if op.op_type == "MatMul"][1:]),  # after the router's
])
def test_experts_in_a_loop_or_run_densely_under_a_gate_are_found_and_routed(build, expert_ops):
    s, h, f, e, k = 8, 16, 24, 4, 2
    graph = import_model_proto(build(s, h, f, e, k), {})
    layer = next(layer for layer in graph.layers if layer.moe is not None)
    assert (layer.moe.experts, layer.moe.top_k, layer.moe.expert_ffn, layer.moe.tokens) == (e, k, f, s)
    assert layer.moe.expert_params == e * 2 * h * f
    # s*k (token, expert) pairs through up and down, not every token through every expert
    assert sum(op.flops for op in expert_ops(layer.ops)) == pytest.approx(2 * (s * k) * (h * f + f * h))


@pytest.mark.parametrize("stem", ["moe_modulelist_eager.torchscript", "moe_modulelist_eager.dynamo"])
def test_routed_tensors_of_unknown_shape_count_in_the_saved_activations(stem):
    # the eager loop's per-expert rows are data-dependent, so their shapes are unknown: each routed (token,
    # expert) pair still saves at least its input to the expert's first matrix and the input to its last
    cfg = _record(stem)["config"]
    graph = load_model(os.path.join(MOE, f"{stem}.onnx"), dims={"batch": 1, "seq": 16})
    pairs = 16 * cfg["top_k"]
    for layer in (layer for layer in graph.layers if layer.moe is not None):
        assert layer.activation_bytes >= pairs * (cfg["hidden"] + cfg["expert_ffn"]) * 2
