"""Expert-parallel overlap (Megatron-Core's --overlap-moe-expert-parallel-comm): the merged layer step's laws
(planner.cost.moe), the merged pipeline schedule (planner.cost.schedule) against hand counts and as an upper
bound of the split one the search bounds, the rules, and the option through estimate, plan and the exports."""

from __future__ import annotations

import dataclasses
import itertools
import json
from functools import lru_cache

import numpy as np
import pytest

from planner.builders import build
from planner.cli import main
from planner.cost import estimate, estimate_pipeline, simulate_pipeline
from planner.cost.memory import micro_batches_in_flight
from planner.cost.moe import merged_layer_s
from planner.cost.schedule import operation_order
from planner.errors import ConfigError
from planner.export.megatron import megatron_args, render_megatron
from planner.graph.importer import import_model_proto
from planner.hardware import load_cluster
from planner.plans import Plan, pipeline_spec
from planner.rules import TIE_TOLERANCE, check_ep_overlap, ep_overlap_choices, unit_flags
from planner.runtime import get_runtime
from planner.search.api import plan
from planner.search.backend import FIRST, HANDOFFS
from planner.search.costmodel import CostModelBackend
from planner.search.engine import pipeline_spec as search_spec
from planner.search.interleave import partition_allowed
from planner.search.partition import score
from planner.search.space import Layout, Settings, StageOption
from planner.types import LayerGraph, ParallelConfig
from test_search_pipeline_bound import one_layer_stages

KEYS = {"layers": 4, "hidden": 512, "heads": 8, "kv_heads": 4, "vocab": 1024, "seq_len": 512, "experts": 16,
        "top_k": 4, "expert_ffn": 512}


@lru_cache(maxsize=None)
def moe_model() -> LayerGraph:
    return import_model_proto(build("moe", KEYS), {"batch": 1}, name="moe-overlap")


@lru_cache(maxsize=None)
def dense_model() -> LayerGraph:
    keys = {k: v for k, v in KEYS.items() if k not in ("experts", "top_k", "expert_ffn")}
    return import_model_proto(build("llama", keys), {"batch": 1}, name="dense")


# ------------------------------------------------------------------------------------------ the merged step


@pytest.mark.parametrize("seed", range(300))
def test_a_merged_step_lies_between_its_streams_and_the_two_passes_one_after_the_other(seed):
    rng = np.random.default_rng(seed)
    a_f, m_f, c_f, a_b, m_b, c_b = rng.uniform(0.0, 3.0, 6) * (rng.uniform(size=6) > 0.2)
    merged = merged_layer_s(a_f, m_f, c_f, a_b, m_b, c_b)
    serial = a_f + m_f + c_f + a_b + m_b + c_b
    assert max(a_f + m_f + a_b + m_b, c_f + c_b) - 1e-12 <= merged <= serial + 1e-12
    # more of any part never shortens the step
    for i in range(6):
        parts = [a_f, m_f, c_f, a_b, m_b, c_b]
        parts[i] += 0.5
        assert merged_layer_s(*parts) >= merged - 1e-12


def test_a_merged_step_by_hand():
    # no communication: the computation stream alone; no computation: the communication stream alone
    assert merged_layer_s(1.0, 2.0, 0.0, 3.0, 4.0, 0.0) == pytest.approx(10.0)
    assert merged_layer_s(0.0, 0.0, 2.0, 0.0, 0.0, 6.0) == pytest.approx(8.0)
    # transfers of 1 each: A_f 0-1 beside C_b 0-1; M_b 1-5 (input gradient at 3) beside D_f 1-2 and D_b 3-4;
    # M_f 5-7; A_b 7-10 beside C_f 7-8: the computation stream's 10, every transfer hidden
    assert merged_layer_s(1.0, 2.0, 2.0, 3.0, 4.0, 2.0) == pytest.approx(10.0)
    # transfers of 2 each: C_b 0-2 holds M_b to 2-6 (its input gradient at 4); D_f 2-4, D_b 4-6; M_f 6-8; A_b 8-11
    # beside C_f 8-10: 11, one more than the computation stream's 10
    assert merged_layer_s(1.0, 2.0, 4.0, 3.0, 4.0, 4.0) == pytest.approx(11.0)


# --------------------------------------------------------------------------------------- the merged pipeline


@pytest.mark.parametrize("ratio", [1.0, 0.6])
def test_one_stage_runs_a_forward_then_merged_steps_then_a_backward(ratio):
    f, b, m = 1.0, 2.0, 8
    sim = simulate_pipeline([f], [b], m, "1f1b", overlap_ratio=[ratio])
    assert sim.iteration_time_s == pytest.approx(f + (m - 1) * ratio * (f + b) + b)
    assert sim.stage_busy_s[0] == pytest.approx(sim.iteration_time_s)
    assert operation_order(0, 1, 3, "1f1b", ep_overlap=True) == [
        (False, 0, 0), (False, 0, 1), (True, 0, 0), (False, 0, 2), (True, 0, 1), (True, 0, 2)]


def test_overlap_warms_up_one_more_forward_and_holds_one_more_micro_batch():
    plain = operation_order(1, 4, 8, "interleaved", 2)
    merged = operation_order(1, 4, 8, "interleaved", 2, ep_overlap=True)
    assert [op[0] for op in plain].index(True) + 1 == [op[0] for op in merged].index(True)
    assert sorted(plain) == sorted(merged)
    for stage in range(4):
        assert micro_batches_in_flight(stage, 4, 8, "interleaved", 2, ep_overlap=True) == pytest.approx(
            micro_batches_in_flight(stage, 4, 8, "interleaved", 2) + 0.5)
    assert micro_batches_in_flight(0, 1, 8, "1f1b", ep_overlap=True) == 2.0


@pytest.mark.parametrize("seed", range(120))
def test_the_merged_pipeline_is_never_faster_than_its_split_bound(seed):
    """The search bounds a plan with overlap by the split schedule of the same order (one more warm-up
    forward) with each forward and backward scaled to the merged step's share: never above the merged
    simulation, whose steps hand on the forward's output no earlier than the two operations would."""
    rng = np.random.default_rng(seed)
    P = int(rng.integers(1, 6))
    vpp = 1 if P == 1 or seed % 3 else int(rng.integers(2, 4))
    m = P * int(rng.integers(1, 5)) if vpp > 1 else int(rng.integers(1, 20))
    f = rng.uniform(0.1, 2.0, P)
    b = f * rng.uniform(1.5, 3.0, P)
    ratio = rng.uniform(0.5, 1.0, P)
    c = rng.uniform(0.0, 2.0, P)
    links = c if vpp > 1 else np.append(c[:-1], 0.0)
    schedule = "interleaved" if vpp > 1 else "1f1b"
    merged = simulate_pipeline(f, b, m, schedule, vpp, links, record_events=False,
                               overlap_ratio=ratio).iteration_time_s
    split = simulate_pipeline(f * ratio, b * ratio, m, schedule, vpp, links, record_events=False,
                              overlap_ratio=np.ones(P)).iteration_time_s
    assert split <= merged * (1 + 1e-12)
    assert merged <= simulate_pipeline(f, b, m, schedule, vpp, links, record_events=False,
                                       overlap_ratio=np.ones(P)).iteration_time_s * (1 + 1e-12)
    if P > 1:
        for exposure in (FIRST, HANDOFFS):
            S_bound = one_layer_stages(f * ratio, b * ratio, c, m, vpp, exposure, ep_overlap=True)
            assert S_bound <= merged * (1 + 1e-12)


def test_gpipe_has_no_steps_to_merge():
    with pytest.raises(ConfigError, match="GPipe has none"):
        simulate_pipeline([1.0, 1.0], [2.0, 2.0], 4, "gpipe", overlap_ratio=[0.5, 0.5])


# --------------------------------------------------------------------------------------------------- rules


@pytest.mark.parametrize("kwargs, words", [
    ({"runtime": "deepspeed"}, "does not overlap"),
    ({"ep": 1}, "no expert-parallel all-to-all"),
    ({"recompute": "full"}, "without full recomputation"),
    ({"dtype": "fp32"}, "bf16 or fp16 weights"),
    ({"pp": 2, "vpp": 1}, "interleaved schedule only"),
    ({"pp": 2, "schedule": "1f1b"}, "interleaved schedule only"),
])
def test_the_rules_name_what_refuses_the_overlap(kwargs, words):
    args = {"ep": 4, "pp": 1, "vpp": None, "recompute": None, "dtype": "bf16", "schedule": None,
            "runtime": "megatron-core", **kwargs}
    runtime = get_runtime(args.pop("runtime"))
    with pytest.raises(ConfigError, match=words):
        check_ep_overlap(True, runtime=runtime, **args)
    check_ep_overlap(False, runtime=runtime, **args)  # off, nothing to refuse


def test_overlap_is_a_choice_only_where_the_rules_allow_it():
    core = get_runtime("megatron-core")
    assert ep_overlap_choices(core, 4, "none", "bf16") == (False, True)
    assert ep_overlap_choices(core, None, None, "fp8") == (False, True)
    for args in ((core, 1, "none", "bf16"), (core, 4, "full", "bf16"), (core, 4, "none", "fp32"),
                 (get_runtime("pytorch-fsdp2"), 4, "none", "bf16")):
        assert ep_overlap_choices(*args) == (False,)


# ------------------------------------------------------------------------------------------------ estimate


def _config(**kwargs) -> ParallelConfig:
    return ParallelConfig(**{"global_batch": 32, "tp": 1, "pp": 1, "dp": 16, "ep": 8, "recompute": "none",
                             **kwargs})


def test_estimate_hides_expert_traffic_under_the_overlap_and_takes_it_where_faster():
    cluster = load_cluster("dgx-h100*2")
    off = estimate(moe_model(), cluster, _config(ep_overlap=False, micro_batch=1))
    on = estimate(moe_model(), cluster, _config(ep_overlap=True, micro_batch=1))
    free = estimate(moe_model(), cluster, _config(micro_batch=1))
    assert not off.config.ep_overlap and on.config.ep_overlap and free.config.ep_overlap
    assert on.iteration_time_s < off.iteration_time_s and free.iteration_time_s == on.iteration_time_s
    assert on.breakdown.ep_comm_s < off.breakdown.ep_comm_s
    hidden = off.breakdown.ep_comm_s - on.breakdown.ep_comm_s
    assert 0.0 < hidden <= off.iteration_time_s - on.iteration_time_s + off.breakdown.ep_comm_s
    # one more micro-batch in flight: the activations of two micro-batches where 1F1B of one stage holds one
    assert on.stages[0].memory.activations_bytes == pytest.approx(2 * off.stages[0].memory.activations_bytes)


def test_a_pipeline_overlaps_only_when_interleaved():
    cluster = load_cluster("dgx-h100*2")
    config = _config(pp=2, dp=8, global_batch=64, micro_batch=1)
    best = estimate(moe_model(), cluster, dataclasses.replace(config, ep_overlap=True))
    assert best.config.ep_overlap and best.config.vpp > 1
    with pytest.raises(ConfigError, match="interleaved schedule only"):
        estimate(moe_model(), cluster, dataclasses.replace(config, ep_overlap=True, vpp=1))


def test_a_dense_model_has_nothing_to_overlap():
    with pytest.raises(ConfigError, match="no mixture-of-experts layers"):
        estimate(dense_model(), load_cluster("dgx-h100*2"),
                 ParallelConfig(global_batch=32, tp=1, pp=1, dp=16, ep_overlap=True))
    assert estimate(dense_model(), load_cluster("dgx-h100*2"),
                    ParallelConfig(global_batch=32, tp=1, pp=1, dp=16)).config.ep_overlap is False


# ------------------------------------------------------------------------------------------ search, exports


@pytest.fixture(scope="module")
def overlapped_plan() -> Plan:
    pinned = ParallelConfig(global_batch=64, tp=1, ep=8, recompute="none", ep_overlap=True)
    return plan(moe_model(), load_cluster("dgx-h100*2"), 64, pinned=pinned)


def test_the_search_space_holds_both_choices(overlapped_plan):
    cluster = load_cluster("dgx-h100*2")
    free = plan(moe_model(), cluster, 64, pinned=ParallelConfig(global_batch=64, tp=1, ep=8, recompute="none"))
    off = plan(moe_model(), cluster, 64,
               pinned=ParallelConfig(global_batch=64, tp=1, ep=8, recompute="none", ep_overlap=False))
    assert free.iteration_time_s <= min(off.iteration_time_s, overlapped_plan.iteration_time_s) * (1 + TIE_TOLERANCE)


def test_the_search_takes_the_overlap_and_the_megatron_export_writes_it(overlapped_plan):
    best = overlapped_plan
    assert best.ep_overlap
    args = megatron_args(best)
    assert "--overlap-moe-expert-parallel-comm" in args and "--delay-wgrad-compute" in args
    assert "CUDA_DEVICE_MAX_CONNECTIONS above 1" in render_megatron(best)
    document = json.loads(best.to_json())
    assert document["ep_overlap"] is True
    assert Plan.from_dict(document) == best
    # the plan re-timed by the cost model is the plan the search timed
    again = estimate_pipeline(moe_model(), load_cluster("dgx-h100*2"), pipeline_spec(best))
    assert again.iteration_time_s == pytest.approx(best.iteration_time_s, rel=1e-12)


def test_a_plan_without_the_overlap_writes_no_field():
    best = plan(moe_model(), load_cluster("dgx-h100*2"), 64,
                pinned=ParallelConfig(global_batch=64, tp=1, ep=8, ep_overlap=False))
    assert not best.ep_overlap and "ep_overlap" not in json.loads(best.to_json())
    assert "--overlap-moe-expert-parallel-comm" not in megatron_args(best)


@pytest.mark.parametrize("seed", range(6))
def test_the_search_bound_of_an_overlapped_plan_never_exceeds_the_cost_model(seed):
    model, cluster = moe_model(), load_cluster("dgx-h100*2")
    backend = CostModelBackend(model, cluster)
    rng = np.random.default_rng(seed)
    L = len(model.layers)
    P, vpp = [(1, 1), (2, 2)][seed % 2]  # a pipeline overlaps only interleaved; 4 blocks hold 2 x 2 chunks
    settings = Settings(micro_batch=1, dp=4, zero=int(rng.integers(0, 2)), recompute="none",
                        sequence_parallel=False, ep=4, expert_tp=1, ep_overlap=True,
                        schedule="interleaved" if vpp > 1 else "1f1b", vpp=vpp)
    units = unit_flags([layer.kind for layer in model.layers])
    allowed = [(*cuts, L - 1) for cuts in itertools.combinations(range(L - 1), P - 1)
               if partition_allowed(units, (*cuts, L - 1), vpp)]
    last = allowed[int(rng.integers(len(allowed)))]
    layout = Layout(tuple(StageOption(0, 1) for _ in range(P)))
    global_batch = 4 * P * 2
    timed = estimate_pipeline(model, cluster, search_spec(cluster, global_batch, settings, layout, last))
    for exposure in backend.exposures(settings):
        S, G = backend.stage_matrices(layout, settings, global_batch, exposure)
        bound = score(S, G, last)[0]
        assert bound <= timed.iteration_time_s * (1 + 1e-9)


def test_cli_flag_and_its_errors_in_one_line(tmp_path, capsys):
    path = tmp_path / "moe.onnx"
    assert main(["models", "build", "moe", *[x for k, v in KEYS.items() for x in ("--set", f"{k}={v}")],
                 "--out", str(path)]) == 0
    capsys.readouterr()
    common = [str(path), "--cluster", "dgx-h100*2", "--global-batch", "32", "--tp", "1", "--pp", "1", "--dp", "16",
              "--ep", "8", "--recompute", "none"]
    assert main(["estimate", *common, "--ep-overlap"]) == 0
    assert "ep-overlap=yes" in capsys.readouterr().out
    assert main(["estimate", *common[:-1], "full", "--ep-overlap"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "without full recomputation" in err[0]


def test_the_gantt_draws_merged_steps_of_their_own_length(overlapped_plan):
    from planner.report.gantt import plan_stage_estimates
    stages = plan_stage_estimates(overlapped_plan, moe_model(), load_cluster("dgx-h100*2"))
    assert all(0.0 < s.merged_s < s.forward_s + s.backward_s for s in stages)


def test_the_table_says_the_traffic_left_is_what_the_overlap_exposes(overlapped_plan):
    from planner.report import render
    text = render(overlapped_plan, "table")
    assert "expert dispatch and combine (exposed)" in text and "(ep overlap)" in text


def test_with_one_micro_batch_there_is_nothing_to_merge_and_the_overlap_is_left_off():
    cluster = load_cluster("dgx-h100*2")
    one = estimate(moe_model(), cluster, _config(global_batch=16, micro_batch=1))
    assert not one.config.ep_overlap
    assert one.iteration_time_s == estimate(moe_model(), cluster, _config(global_batch=16, micro_batch=1,
                                                                           ep_overlap=True)).iteration_time_s
