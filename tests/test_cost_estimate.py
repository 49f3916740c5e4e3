"""The estimator: breakdown sums, resolution of choices, explicit (heterogeneous) pipelines, components."""

import dataclasses
import math

import pytest

from planner.cost import (dp_sync_time_s, estimate, estimate_pipeline, layer_costs, optimizer_time_s)
from planner.cost.calibration import DeviceCalibration, calibration_for
from planner.cost.estimator import balanced_split
from planner.errors import ConfigError
from planner.hardware import catalog, load_cluster
from planner.hardware.collectives import CommGroup
from planner.types import ParallelConfig, PipelineSpec, ReplicaSpec, StageSpec
from tests.cost_models import gpt

SMALL = dict(layers=8, hidden=1024, heads=16, seq_len=1024, vocab=32000)


def small():
    return gpt(**SMALL)


def breakdown_total(est):
    return sum(est.breakdown.to_dict().values())


@pytest.mark.parametrize("cluster,config", [
    ("dgx-a100-80gb*2", ParallelConfig(global_batch=64, tp=2, pp=4, dp=2)),
    ("dgx-a100-80gb*2", ParallelConfig(global_batch=64, tp=4, pp=2, dp=2, micro_batch=2, vpp=2, zero=1,
                                       recompute="full")),
    ("dgx-h100*1", ParallelConfig(global_batch=32, tp=1, pp=1, dp=8, zero=1, recompute="selective")),
    ("dgx-a100-80gb*1+hgx-v100-32gb*1", ParallelConfig(global_batch=64, tp=2, pp=2, dp=4, schedule="gpipe")),
    ("dgx-a100-80gb*1+hgx-v100-32gb*1", ParallelConfig(global_batch=64, tp=2, pp=1, dp=8)),  # mixed replicas
])
def test_breakdown_sums_to_total(cluster, config):
    est = estimate(small(), load_cluster(cluster), config)
    assert breakdown_total(est) == pytest.approx(est.iteration_time_s, rel=1e-9)
    assert all(v >= 0 for v in est.breakdown.to_dict().values())
    assert est.throughput_samples_per_s == pytest.approx(config.global_batch / est.iteration_time_s)


def test_mixed_replicas_in_one_stage_are_timed_by_the_slower_type():
    model = small()
    mixed = estimate(model, load_cluster("dgx-a100-80gb*1+hgx-v100-32gb*1"),
                     ParallelConfig(global_batch=64, tp=2, pp=1, dp=8, micro_batch=2, recompute="none", zero=0))
    a100 = estimate(model, load_cluster("dgx-a100-80gb*2"),
                    ParallelConfig(global_batch=64, tp=2, pp=1, dp=8, micro_batch=2, recompute="none", zero=0))
    stage = mixed.stages[0]
    assert [r.device_type for r in stage.replicas] == ["a100-80gb", "v100-32gb"]
    assert [r.batch_share for r in stage.replicas] == [0.5, 0.5]
    assert mixed.iteration_time_s > a100.iteration_time_s
    v100 = stage.replicas[1]
    assert stage.forward_s + stage.backward_s == pytest.approx(v100.forward_s + v100.backward_s)


def test_left_out_choices_are_resolved():
    est = estimate(small(), load_cluster("dgx-a100-80gb*2"), ParallelConfig(global_batch=64, tp=2, pp=2, dp=4))
    cfg = est.config
    assert cfg.fp8_recipe is None  # an fp8 recipe only under dtype fp8
    # every choice resolved (the uneven split's first/last counts stay None: the even split was asked for)
    assert None not in [getattr(cfg, f.name) for f in dataclasses.fields(cfg)
                        if f.name not in ("fp8_recipe", "first_stage_layers", "last_stage_layers")]
    assert cfg.recompute in ("none", "selective", "full") and cfg.schedule in ("1f1b", "interleaved", "gpipe")
    assert 64 % (cfg.dp * cfg.micro_batch) == 0
    # the resolved choice is at least as fast as every pinned alternative that fits
    for mb in (1, 2, 4):
        for recompute in ("none", "full"):
            pinned = estimate(small(), load_cluster("dgx-a100-80gb*2"),
                              ParallelConfig(global_batch=64, tp=2, pp=2, dp=4, micro_batch=mb, recompute=recompute,
                                             vpp=1, zero=0, sequence_parallel=True))
            if pinned.feasible:
                assert est.iteration_time_s <= pinned.iteration_time_s * 1.03


def test_explicit_spec_matches_estimate():
    model, cluster = small(), load_cluster("dgx-a100-80gb*2")
    est = estimate(model, cluster, ParallelConfig(global_batch=64, tp=2, pp=2, dp=4, micro_batch=2, vpp=1, zero=1,
                                                  recompute="selective", sequence_parallel=True))
    stages = tuple(StageSpec(first, last, (ReplicaSpec(tuple(range(s * 8, s * 8 + 8)), 2, 4),))
                   for s, (first, last) in enumerate(balanced_split(model, 2)))
    spec = PipelineSpec(stages=stages, global_batch=64, micro_batch=2, zero=1, recompute="selective",
                        sequence_parallel=True)
    assert estimate_pipeline(model, cluster, spec).iteration_time_s == pytest.approx(est.iteration_time_s)


def test_uneven_split_and_heterogeneous_replicas():
    model = small()  # embedding, 8 blocks, head: 10 layers
    cluster = load_cluster("dgx-a100-80gb*1+hgx-v100-32gb*1")  # devices 0-7 A100, 8-15 V100
    even = PipelineSpec(stages=(
        StageSpec(0, 4, (ReplicaSpec(tuple(range(0, 4)), 2, 2, 0.5), ReplicaSpec(tuple(range(8, 12)), 2, 2, 0.5))),
        StageSpec(5, 9, (ReplicaSpec(tuple(range(4, 8)), 2, 2, 0.5), ReplicaSpec(tuple(range(12, 16)), 2, 2, 0.5))),
    ), global_batch=64, micro_batch=2, recompute="selective", sequence_parallel=True)
    skewed = dataclasses.replace(even, stages=tuple(
        StageSpec(st.first_layer, st.last_layer, (dataclasses.replace(st.replicas[0], batch_share=0.7),
                                                  dataclasses.replace(st.replicas[1], batch_share=0.3)))
        for st in even.stages))
    e_even, e_skew = estimate_pipeline(model, cluster, even), estimate_pipeline(model, cluster, skewed)
    # the faster A100s taking a larger share shortens the iteration
    assert e_skew.iteration_time_s < e_even.iteration_time_s
    stage = e_skew.stages[0]
    assert stage.device_type == "a100-80gb+v100-32gb" and len(stage.replicas) == 2
    a100, v100 = stage.replicas
    assert a100.num_micro_batches == pytest.approx(0.7 * 64 / (2 * 2))
    # a stage's slot time is that of its slowest replica group, scaled by its load
    m = math.ceil(max(r.num_micro_batches for s in e_skew.stages for r in s.replicas))  # M micro-batch slots
    assert stage.forward_s + stage.backward_s == pytest.approx(max(
        (r.forward_s + r.backward_s) * r.num_micro_batches / m for r in stage.replicas))
    assert sum(e_skew.breakdown.to_dict().values()) == pytest.approx(e_skew.iteration_time_s)


def test_explicit_spec_infeasible_memory_names_stage():
    model = gpt(4, 8192, 64, 2048, 51200)
    cluster = load_cluster("hgx-v100-16gb*1")
    # stage 0: the embedding only (fits); stage 1: four 0.8B-parameter blocks (16 bytes each with Adam)
    spec = PipelineSpec(stages=(StageSpec(0, 0, (ReplicaSpec((0,), 1, 1),)), StageSpec(1, 5, (ReplicaSpec((1,), 1, 1),))),
                        global_batch=4, micro_batch=1)
    est = estimate_pipeline(model, cluster, spec)
    assert not est.feasible and est.reason.startswith("stage 1 (layers 1-5) on v100-16gb needs")
    # binary units throughout, as the memory column and the "memory ... GiB per device" line beside it
    assert "but has 16.0 GiB" in est.reason and " GiB per device (weights " in est.reason
    assert " GB" not in est.reason
    assert est.stages[0].memory.total_bytes < est.stages[0].memory_capacity_bytes


def test_explicit_spec_errors():
    model, cluster = small(), load_cluster("dgx-a100-80gb*1")
    bad = PipelineSpec(stages=(StageSpec(0, 3, (ReplicaSpec((0, 1), 2, 1),)),), global_batch=8, micro_batch=1)
    with pytest.raises(ConfigError, match="model has 10 layers"):
        estimate_pipeline(model, cluster, bad)


def test_layer_costs_tensor_parallel_and_recompute():
    model = gpt(2, 2048, 16, 2048, 32000)
    node = catalog.get_node("dgx-a100-80gb")
    one = layer_costs(model, node, 1, 1, "none", False)
    two = layer_costs(model, node, 2, 1, "none", False)
    full = layer_costs(model, node, 2, 1, "full", False)
    block = 1
    assert two.forward_s[block] < one.forward_s[block]
    assert two.params_per_rank[block] == pytest.approx(one.params_per_rank[block] / 2)
    assert one.tp_comm_s[block] == 0.0 and two.tp_comm_s[block] > 0.0
    assert full.backward_s[block] == pytest.approx(two.backward_s[block] + two.forward_s[block])
    assert layer_costs(model, node, 2, 1, "none", False) is two  # cached


def test_dp_sync_overlap_and_optimizer():
    group = CommGroup(8, 1, 300e9, 2e-6, 25e9, 5e-6)
    exposed = dp_sync_time_s(1e9, group, 0, "bf16", 0.0)
    hidden = dp_sync_time_s(1e9, group, 0, "bf16", 10.0)
    assert 0 < hidden < exposed
    assert hidden == pytest.approx(exposed / (1e9 / 40e6))  # the last bucket stays exposed
    profile = catalog.get_device("a100-80gb")
    assert optimizer_time_s(1e9, profile, "adam", 1, 8) == pytest.approx(optimizer_time_s(1e9, profile, "adam", 0, 8) / 8)
    assert optimizer_time_s(1e9, profile, "sgd", 0, 1) < optimizer_time_s(1e9, profile, "adam", 0, 1)


def test_calibration_is_used():
    model, cluster = small(), load_cluster("dgx-a100-80gb*1")
    config = ParallelConfig(global_batch=16, tp=2, pp=1, dp=4, micro_batch=1, zero=0, recompute="none",
                            sequence_parallel=True)
    base = estimate(model, cluster, config, {"a100-80gb": DeviceCalibration(gemm_scale=0.5)})
    faster = estimate(model, cluster, config, {"a100-80gb": DeviceCalibration(gemm_scale=1.0)})
    assert faster.iteration_time_s < base.iteration_time_s
    assert calibration_for("a100-80gb", "megatron-lm-2021").fitted
    assert calibration_for("h100-sxm", "megatron-core").fitted
    assert not calibration_for("a100-80gb", "deepspeed").fitted


def test_deterministic():
    model, cluster = small(), load_cluster("dgx-a100-80gb*2")
    config = ParallelConfig(global_batch=64, tp=2, pp=2, dp=4)
    assert estimate(model, cluster, config) == estimate(model, cluster, config)


def _gpt_1_3b():
    return gpt(24, 2048, 16, 2048, 51200)


def test_interleaved_wraparound_sends_a_chunk_boundary_not_the_logits():
    # stage 1 -> stage 0 (the interleaved schedule's wrap-around) crosses the same node link as stage 0 -> 1
    # and carries a block's output, b*s*h; the head's logits (b*s*V, 25x larger) never travel
    est = estimate(_gpt_1_3b(), load_cluster("dgx-a100-80gb*2"),
                   ParallelConfig(global_batch=256, tp=2, pp=2, dp=4, micro_batch=2, vpp=12, zero=1,
                                  recompute="none", sequence_parallel=True))
    assert est.stages[1].p2p_s == pytest.approx(est.stages[0].p2p_s, rel=1e-6)


def test_left_out_vpp_resolves_to_the_fastest():
    # the fast ranking formula favours the largest vpp; the exact timing must decide between the vpps
    model, cluster = _gpt_1_3b(), load_cluster("dgx-a100-80gb*2")
    fixed = dict(global_batch=256, tp=2, pp=2, dp=4, micro_batch=2, zero=1, recompute="none",
                 sequence_parallel=True)
    resolved = estimate(model, cluster, ParallelConfig(**fixed))
    pinned = [estimate(model, cluster, ParallelConfig(**fixed, vpp=v)).iteration_time_s for v in (1, 2, 3, 4, 6, 12)]
    assert resolved.iteration_time_s <= min(pinned) * (1 + 1e-9)


def test_left_out_vpp_tries_every_interleaving_the_search_tries():
    # 30 blocks over 4 stages: no vpp > 1 splits them into equal chunks, yet whole 2-block chunks (4, 4, 4
    # and 3 per stage) interleave, and the search plans them; the estimate resolves the same choices
    from planner.builders import build
    from planner.graph import import_model_proto
    from planner.rules import pipeline_units
    from planner.search.interleave import vpp_choices

    settings = dict(layers=30, hidden=1024, heads=16, kv_heads=4, ffn=2816, seq_len=1024, vocab=1000)
    model = import_model_proto(build("llama", settings), {"batch": 1}, name="llama-30")
    cluster = load_cluster("dgx-a100-80gb*1")
    fixed = dict(global_batch=8, tp=1, pp=4, dp=2, micro_batch=1, zero=0, recompute="none")
    choices = [v for v in vpp_choices(None, None, pipeline_units(model)) if 30 // v >= 4]
    assert choices == [1, 2, 3, 5, 6]
    pinned = {v: estimate(model, cluster, ParallelConfig(**fixed, vpp=v)).iteration_time_s for v in choices}
    resolved = estimate(model, cluster, ParallelConfig(**fixed))
    assert resolved.iteration_time_s == pytest.approx(min(pinned.values()), rel=1e-9)
    assert resolved.config.vpp == min(pinned, key=pinned.get) > 1
