"""Expert parallelism (planner.cost.moe): the laws of dispatch and combine, expert memory, expert gradient
synchronisation and FLOPs, by hand counts independent of the cost model's numbers; the rules of ep and
expert_tp; their flags and exports."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from functools import lru_cache

import pytest

from planner.builders import build
from planner.cost import estimate, layer_costs
from planner.cost.comm import dp_group
from planner.cost.moe import (ALL_TO_ALLS_PER_LAYER, ExpertParallel, dispatch_bytes, ep_group_devices, expert_dp,
                              expert_gemm_s)
from planner.errors import ConfigError, PlannerError
from planner.export.deepspeed import render_deepspeed
from planner.export.megatron import megatron_args
from planner.graph.importer import import_model_proto
from planner.graph.moe import ROUTED_EXPERT
from planner.hardware import load_cluster
from planner.hardware.collectives import collective_time_s
from planner.runtime import Runtime, get_runtime
from planner.search.api import plan
from planner.search.explain import bottleneck
from planner.plans import schema_errors
from planner.types import LayerGraph, ParallelConfig

H, F, E, K, S, HEADS = 256, 512, 8, 2, 128, 8
KEYS = {"layers": 2, "hidden": H, "heads": HEADS, "kv_heads": 4, "vocab": 512, "seq_len": S, "experts": E,
        "top_k": K, "expert_ffn": F}
BALANCED = dataclasses.replace(get_runtime("megatron-core"), name="megatron-core-balanced", moe_load_imbalance=1.0)


@lru_cache(maxsize=None)
def moe_model() -> LayerGraph:
    return import_model_proto(build("moe", KEYS), {"batch": 1}, name="moe-test")


@lru_cache(maxsize=None)
def dense_model() -> LayerGraph:
    keys = {k: v for k, v in KEYS.items() if k not in ("experts", "top_k", "expert_ffn")}
    return import_model_proto(build("llama", keys), {"batch": 1}, name="dense-test")


def moe_layers(model: LayerGraph) -> list[int]:
    return [i for i, layer in enumerate(model.layers) if layer.moe is not None]


# ------------------------------------------------------------------------------------------- the laws


def test_dispatch_bytes_are_tokens_times_top_k_times_hidden_times_width():
    moe = moe_model().layers[moe_layers(moe_model())[0]].moe
    for mb, tp, dtype, width in ((1, 1, "bf16", 2), (4, 2, "bf16", 2), (2, 4, "fp32", 4)):
        tokens = S * mb / tp  # each tensor-parallel rank dispatches its share of the micro-batch's tokens
        assert dispatch_bytes(moe, H, mb, tp, dtype) == tokens * K * H * width


@pytest.mark.parametrize("ep", [2, 4, 8])
def test_four_all_to_alls_per_moe_layer_and_micro_batch(ep):
    """Dispatch and combine, forward and backward: 4 all-to-alls of tokens x top_k x hidden x bytes each over
    the expert-parallel group; none in the dense layers; full recompute runs the forward pair again."""
    model, cluster = moe_model(), load_cluster("dgx-h100*2")
    node = cluster.groups[0].node
    group = dp_group(cluster, ep_group_devices(range(16), ep, 1), _cal(node))
    mb = 2
    lc = layer_costs(model, node, 1, mb, "none", False, "bf16", _cal(node), BALANCED, ep=ep, expert_tp=1,
                     ep_group=group)
    one = collective_time_s("all_to_all", S * mb * K * H * 2, group)
    for i in moe_layers(model):
        assert lc.ep_comm_s[i] == pytest.approx(ALL_TO_ALLS_PER_LAYER * one, rel=1e-12)
    assert all(lc.ep_comm_s[i] == 0 for i in range(len(model.layers)) if i not in moe_layers(model))
    redo = layer_costs(model, node, 1, mb, "full", False, "bf16", _cal(node), BALANCED, ep=ep, expert_tp=1,
                       ep_group=group)
    assert redo.ep_comm_s[moe_layers(model)[0]] == pytest.approx(6 * one, rel=1e-12)


def test_an_expert_parallel_group_inside_a_node_runs_on_nvlink():
    cluster = load_cluster("dgx-h100*2")
    inside = dp_group(cluster, ep_group_devices(range(16), 8, 1), _cal(cluster.groups[0].node))
    across = dp_group(cluster, ep_group_devices(range(16), 8, 2), _cal(cluster.groups[0].node))
    assert inside.nodes == 1 and across.nodes == 2
    size = 64e6
    assert collective_time_s("all_to_all", size, across) > collective_time_s("all_to_all", size, inside)


def test_expert_parameters_are_divided_by_ep_and_expert_tp():
    model, node = moe_model(), load_cluster("dgx-h100*1").groups[0].node
    base = layer_costs(model, node, 2, 1, "none", False, "bf16", _cal(node), BALANCED, ep=1, expert_tp=2)
    for ep, etp in ((2, 2), (4, 1), (8, 1), (4, 2)):
        lc = layer_costs(model, node, 2, 1, "none", False, "bf16", _cal(node), BALANCED, ep=ep, expert_tp=etp)
        for i in moe_layers(model):
            experts = model.layers[i].moe.expert_params
            assert lc.expert_params_per_rank[i] == pytest.approx(experts / (ep * etp))
            # the rest of the layer is split over tp as before
            assert lc.params_per_rank[i] - lc.expert_params_per_rank[i] == pytest.approx(
                base.params_per_rank[i] - base.expert_params_per_rank[i])


def test_expert_gradients_synchronise_over_expert_data_parallel_ranks_only():
    """ZeRO-0 all-reduce bytes per rank: the dense parameters over dp, the experts over expert dp =
    tp x dp / (ep x expert_tp); with ep = dp the experts have no replica and send nothing. Megatron-Core
    reduces bf16 training's gradients in fp32."""
    model, cluster = moe_model(), load_cluster("dgx-h100*1")
    width = 4
    experts = sum(layer.moe.expert_params for layer in model.layers if layer.moe is not None)
    dense = model.params - experts
    for ep in (1, 2, 4, 8):
        est = estimate(model, cluster, ParallelConfig(global_batch=16, tp=1, pp=1, dp=8, zero=0, ep=ep, expert_tp=1,
                                                       micro_batch=2))
        edp = expert_dp(1, 8, ep, 1)
        expected = 2 * 7 / 8 * dense * width + (2 * (edp - 1) / edp * experts / ep * width if edp > 1 else 0.0)
        assert est.stages[0].dp_bytes == pytest.approx(expected, rel=1e-9), ep


def test_expert_flops_per_rank_do_not_depend_on_ep_or_expert_tp():
    """A rank runs experts / ep experts of ep x expert_tp x T x top_k / experts rows, split expert_tp ways:
    the FLOPs of T x top_k rows through one expert, as with every expert on every rank."""
    model = moe_model()
    layer = model.layers[moe_layers(model)[0]]
    ops = [op for op in layer.ops if op.role == ROUTED_EXPERT]
    assert len(ops) == 3  # gate, up, down

    def flops(m, n, k):
        return 2.0 * m * n * k

    tp, mb = 4, 2
    hand = 3 * 2 * (S * mb / tp) * K * H * F  # T x top_k rows through one expert's three matrices
    for ep, etp in ((1, 4), (1, 1), (2, 2), (8, 1), (4, 4)):
        par = ExpertParallel(ep, etp, None, 1.0)
        forward = sum(expert_gemm_s(op, layer.moe, mb, tp, par, flops)[0] for op in ops)
        backward = sum(expert_gemm_s(op, layer.moe, mb, tp, par, flops)[1] for op in ops)
        assert forward == pytest.approx(hand) and backward == pytest.approx(2 * hand)
    # the busiest rank of an imbalanced routing does imbalance times the mean (only where experts are split)
    heavy = ExpertParallel(4, 1, None, 1.25)
    assert sum(expert_gemm_s(op, layer.moe, mb, tp, heavy, flops)[0] for op in ops) == pytest.approx(1.25 * hand)


def test_layer_flops_are_the_active_parameters_hand_count():
    """Forward FLOPs of a MoE block's routed experts: 2 x tokens x top_k x (3 h f) per sample."""
    model = moe_model()
    layer = model.layers[moe_layers(model)[0]]
    routed = sum(op.flops for op in layer.ops if op.role == ROUTED_EXPERT)
    assert routed == 2 * S * K * 3 * H * F


# ------------------------------------------------------------------------------------------------ rules


@pytest.mark.parametrize("config, words", [
    (dict(tp=1, dp=8, ep=3), "ep=3 does not divide the 8 routed experts; valid: 1, 2, 4, 8"),
    (dict(tp=2, dp=2, ep=8), "does not divide the stage's tp x cp x dp = 4 ranks"),
    (dict(tp=2, dp=4, ep=2, expert_tp=4), "expert_tp=4 does not divide tp=2"),
    (dict(tp=1, dp=8, ep=2, runtime="deepspeed"), "the deepspeed runtime has no expert parallelism"),
])
def test_rules_name_the_constraint_and_the_valid_values(config, words):
    with pytest.raises(ConfigError, match=words.replace("(", r"\(").replace(")", r"\)")):
        estimate(moe_model(), load_cluster("dgx-h100*1"), ParallelConfig(global_batch=16, pp=1, **config))


def test_ep_on_a_dense_model_is_refused():
    with pytest.raises(ConfigError, match="no mixture-of-experts layers"):
        estimate(dense_model(), load_cluster("dgx-h100*1"), ParallelConfig(global_batch=16, tp=1, dp=8, ep=2))
    with pytest.raises(ConfigError, match="no mixture-of-experts layers"):
        plan(dense_model(), load_cluster("dgx-h100*1"), 16, pinned=ParallelConfig(global_batch=16, tp=0, pp=0,
                                                                                    dp=0, ep=2))


def test_estimate_resolves_ep_and_a_dense_model_keeps_ep_one():
    est = estimate(moe_model(), load_cluster("dgx-h100*1"), ParallelConfig(global_batch=16, tp=1, dp=8))
    assert est.config.ep in (1, 2, 4, 8) and est.config.expert_tp == 1
    dense = estimate(dense_model(), load_cluster("dgx-h100*1"), ParallelConfig(global_batch=16, tp=2, dp=4))
    assert dense.config.ep == 1 and dense.breakdown.ep_comm_s == 0


@pytest.mark.parametrize("ep, expert_tp, says, not_says", [
    (1, 2, "gathers the tokens over the expert_tp=2 ranks", "all-to-all"),
    (4, 1, "all-to-all over ep=4 ranks", "gathers"),
    (2, 2, "all-to-all over ep=2 ranks and gathers the tokens over the expert_tp=2 ranks", "ep=1"),
])
def test_the_bottleneck_names_the_expert_traffic_the_configuration_has(ep, expert_tp, says, not_says):
    est = estimate(moe_model(), load_cluster("dgx-h100*1"),
                   ParallelConfig(global_batch=16, tp=2, dp=4, ep=ep, expert_tp=expert_tp, sequence_parallel=True))
    # the sentence of the part that is the largest overhead; expert communication made the largest here
    parts = dataclasses.replace(est.breakdown, ep_comm_s=est.iteration_time_s)
    text = bottleneck(dataclasses.replace(est, breakdown=parts), 4)
    assert "expert dispatch and combine" in text and says in text and not_says not in text


# ------------------------------------------------------------------------------------- search and export


def test_the_search_enumerates_ep_and_exports_it_to_megatron():
    cluster = load_cluster("dgx-h100*2")
    best = plan(moe_model(), cluster, 64, pinned=ParallelConfig(global_batch=64, tp=0, pp=0, dp=0, ep=4))
    assert all(stage.ep == 4 for stage in best.stages)
    args = megatron_args(best)
    for flag, value in (("--num-experts", "8"), ("--moe-router-topk", "2"), ("--expert-model-parallel-size", "4"),
                        ("--expert-tensor-parallel-size", str(best.stages[0].expert_tp)),
                        ("--moe-token-dispatcher-type", "alltoall")):  # the dispatch the cost model times
        assert args[args.index(flag) + 1] == value
    document = json.loads(best.to_json())
    assert document["stages"][0]["ep"] == 4 and document["model"]["experts"] == 8
    # the layers Megatron builds are the model's: expert width, and no shared expert nor dense layer here
    assert args[args.index("--moe-ffn-hidden-size") + 1] == str(KEYS["expert_ffn"])
    assert "--moe-shared-expert-intermediate-size" not in args and "--moe-layer-freq" not in args
    with pytest.raises(PlannerError, match="AutoEP .* the planner does not model or export yet; use --format "
                                           "megatron"):
        render_deepspeed(best)


def test_megatron_builds_the_same_moe_layers():
    # a DeepSeek-like stack: a dense first block, two shared experts, sigmoid routing
    keys = dict(KEYS, layers=4, shared_experts=2, dense_layers=1, router="sigmoid")
    model = import_model_proto(build("moe", keys), {"batch": 1}, name="moe-shared")
    best = plan(model, load_cluster("dgx-h100*1"), 16)
    args = megatron_args(best)
    assert args[args.index("--moe-ffn-hidden-size") + 1] == str(keys["expert_ffn"])
    assert args[args.index("--moe-shared-expert-intermediate-size") + 1] == str(2 * keys["expert_ffn"])
    assert args[args.index("--moe-layer-freq") + 1] == "([0]*1+[1]*3)"
    assert args[args.index("--moe-router-score-function") + 1] == "sigmoid"
    assert best.model["moe_layer_pattern"] == [0, 1, 1, 1] and schema_errors(json.loads(best.to_json())) == []


def test_cli_ep_flag_errors_in_one_line():
    out = subprocess.run([sys.executable, "-m", "planner", "estimate", _moe_file(), "--cluster", "dgx-h100*1",
                          "--global-batch", "16", "--tp", "1", "--pp", "1", "--dp", "8", "--ep", "3"],
                         capture_output=True, text=True)
    assert out.returncode == 2
    assert out.stderr.strip().count("\n") == 0 and "valid: 1, 2, 4, 8" in out.stderr


# -------------------------------------------------------------------------------------------- helpers


def _cal(node):
    from planner.cost.calibration import calibration_for
    return calibration_for(node.device.name, "megatron-core")


@lru_cache(maxsize=None)
def _moe_file() -> str:
    import os
    import tempfile
    import onnx
    path = os.path.join(tempfile.mkdtemp(), "moe-test.onnx")
    onnx.save(build("moe", KEYS), path)
    return path


@pytest.mark.parametrize("ep", [1, 2, None])
def test_tensor_parallel_moe_layers_need_sequence_parallelism_whatever_ep(ep):
    """Megatron-Core's MoELayer refuses to train with tp > 1 and sequence parallelism off, ep 1 included;
    tp 1 runs without it, and left free, sequence parallelism is taken."""
    cluster = load_cluster("dgx-h100*1")
    with pytest.raises(ConfigError, match="tp=2 without sequence parallelism"):
        estimate(moe_model(), cluster, ParallelConfig(global_batch=16, tp=2, dp=4, ep=ep, sequence_parallel=False,
                                                      runtime="megatron-core"))
    assert estimate(moe_model(), cluster, ParallelConfig(global_batch=16, tp=2, dp=4, ep=ep)).config.sequence_parallel
    estimate(moe_model(), cluster, ParallelConfig(global_batch=16, tp=1, dp=8, ep=ep, sequence_parallel=False))
    best = plan(moe_model(), cluster, 16, pinned=ParallelConfig(global_batch=16, tp=2, pp=0, dp=0, ep=ep))
    assert best.sequence_parallel


def test_the_search_finds_expert_parallelism_with_tensor_parallelism_under_sequence_parallelism():
    """MoE with tp > 1 exists only with sequence parallelism: the search, with sequence parallelism left free,
    must find it (the stage options of one settings are not those of the same settings without it)."""
    model, cluster = moe_model(), load_cluster("dgx-h100*2")
    best = plan(model, cluster, 64, pinned=ParallelConfig(global_batch=64, tp=2, pp=0, dp=0, ep=8, expert_tp=1))
    assert best.sequence_parallel and all((s.tp, s.ep, s.expert_tp) == (2, 8, 1) for s in best.stages)
    free = plan(model, cluster, 64)  # the pinned space is part of the free one (up to the tie rule's tolerance)
    assert free.iteration_time_s <= best.iteration_time_s * 1.005


def test_a_pinned_expert_tp_no_tp_takes_is_named_before_the_search():
    # it used to search, find nothing, and say the model did not fit in memory
    with pytest.raises(ConfigError, match="--expert-tp 3 divides none of the tp degrees"):
        plan(moe_model(), load_cluster("dgx-h100*1"), 64, pinned=ParallelConfig(global_batch=64, tp=0, pp=0, dp=0,
                                                                                 expert_tp=3))


def test_a_mixture_of_experts_is_refused_on_a_runtime_without_moe_layers():
    cluster = load_cluster("dgx-h100*1")
    with pytest.raises(ConfigError, match="do not run on megatron-lm-2021"):
        plan(moe_model(), cluster, 64, pinned=ParallelConfig(global_batch=64, tp=0, pp=0, dp=0,
                                                             runtime="megatron-lm-2021"))
    with pytest.raises(ConfigError, match="do not run on megatron-lm-2021"):
        estimate(moe_model(), cluster, ParallelConfig(global_batch=64, dp=8, runtime="megatron-lm-2021"))


def test_the_optimizer_step_updates_each_experts_share_over_the_expert_data_parallel_group():
    """Under ZeRO-1 a rank updates 1/dp of the dense parameters and 1/expert_dp of its experts'; with tp 1 a
    rank holds experts/ep of them and expert_dp = dp/ep, so its share of the experts, and the step's time,
    does not change with ep. Without ZeRO every rank updates all it holds, which falls with ep."""
    cluster = load_cluster("dgx-h100*2")
    sharded = [estimate(moe_model(), cluster, ParallelConfig(global_batch=16, tp=1, dp=16, micro_batch=1, ep=ep,
                                                             zero=1)).breakdown.optimizer_s for ep in (1, 2, 4, 8)]
    assert sharded == pytest.approx([sharded[0]] * 4, rel=1e-9)
    whole = [estimate(moe_model(), cluster, ParallelConfig(global_batch=16, tp=1, dp=16, micro_batch=1, ep=ep,
                                                           zero=0)).breakdown.optimizer_s for ep in (1, 8)]
    assert whole[1] < whole[0] / 2
    assert sharded[0] < whole[1]


def test_the_busiest_ranks_expert_intermediates_carry_the_routing_imbalance():
    """The busiest expert-parallel rank routes 1.25x the mean rows through its experts: its dispatch buffer
    and the routed experts' saved intermediates (SwiGLU: gate and up outputs plus the GEMM input, 2 + 2 + 2
    bytes per element in bf16) are both that much larger, per MoE block and micro-batch in flight."""
    model, cluster = moe_model(), load_cluster("dgx-h100*2")
    node = cluster.groups[0].node
    group = dp_group(cluster, ep_group_devices(range(16), 8, 1), _cal(node))

    def activations(runtime: Runtime) -> float:
        lc = layer_costs(model, node, 1, 1, "none", False, "bf16", _cal(node), runtime, ep=8, expert_tp=1,
                         ep_group=group)
        return float(sum(lc.activation_bytes[i] for i in moe_layers(model)))

    extra = activations(get_runtime("megatron-core")) - activations(BALANCED)
    per_block = 0.25 * (K * F * S * (2 + 2 + 2) + S * K * H * 2)  # intermediates + dispatch buffer
    assert extra == pytest.approx(len(moe_layers(model)) * per_block, rel=1e-12)


def test_the_bottleneck_names_each_replica_group_of_a_mixed_stage():
    est = estimate(dense_model(), load_cluster("dgx-h100*1"), ParallelConfig(global_batch=16, tp=2, dp=4))
    stage = est.stages[0]
    groups = (dataclasses.replace(stage.replicas[0], device_type="h100-sxm", tp=1, dp=2),
              dataclasses.replace(stage.replicas[0], device_type="a100-40gb", tp=2, dp=1))
    mixed = dataclasses.replace(stage, device_type="h100-sxm+a100-40gb", replicas=groups)
    text = bottleneck(dataclasses.replace(est, stages=(mixed, *est.stages[1:])), 4)
    assert "on h100-sxm tp=1 dp=2 + a100-40gb tp=2 dp=1)" in text and "+a100" not in text
    assert "on h100-sxm, tp=2)" in bottleneck(est, 4)  # one replica group: as before
