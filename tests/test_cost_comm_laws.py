"""Laws the data-parallel communication must obey, whatever its constants: how ZeRO's traffic scales with
the micro-batches (Rajbhandari et al., SC'20: ZeRO-3 moves 3 Psi per pass against ZeRO-1's 2 Psi), how the
gradient all-reduce scales with the data-parallel group, what overlap may and may not hide, and that the
README's GPT-1.3B case does not prefer ZeRO-3. Each test compares the model with itself, not with numbers."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from planner.cost import estimate, estimate_pipeline
from planner.cost.comm import bucket_params, dp_group, dp_sync, exposed_s, zero3_exposed_s
from planner.cost.calibration import calibration_for
from planner.cost.memory import dtype_bytes
from planner.errors import ConfigError
from planner.graph import load_model
from planner.hardware import load_cluster
from planner.hardware.collectives import collective_time_s
from planner.runtime import get_runtime
from planner.types import ParallelConfig, PipelineSpec, ReplicaSpec, StageSpec
from tests.cost_models import gpt

MODEL = gpt(4, 1024, 16, 512, 32000)


def _no_overlap(name: str):
    """The runtime ``name`` with every overlap off (its calibration and buckets unchanged)."""
    return dataclasses.replace(get_runtime(name), overlap_grad_reduce=False, overlap_param_gather=False,
                               zero3_prefetch_layers=0)


def _one_stage(cluster, dp: int, zero: int, runtime, micro_batches: int, micro_batch: int = 1,
               model=MODEL, pp: int = 1):
    """estimate_pipeline of ``model`` over ``pp`` stages of ``dp`` replicas (tp 1), ``micro_batches`` each."""
    n = len(model.layers)
    cuts = np.linspace(0, n, pp + 1).astype(int)
    stages = tuple(StageSpec(int(cuts[s]), int(cuts[s + 1]) - 1,
                             (ReplicaSpec(devices=tuple(range(s * dp, (s + 1) * dp)), tp=1, dp=dp),))
                   for s in range(pp))
    spec = PipelineSpec(stages=stages, global_batch=dp * micro_batch * micro_batches, micro_batch=micro_batch,
                        zero=zero, runtime=runtime)
    return estimate_pipeline(model, cluster, spec)


@pytest.fixture(scope="module")
def two_nodes():
    return load_cluster("dgx-a100-80gb*2")


@pytest.mark.parametrize("zero,runtime", [(2, "deepspeed"), (3, "deepspeed"), (2, "pytorch-fsdp2"),
                                          (3, "pytorch-fsdp2")])
def test_zero2_and_zero3_traffic_grows_linearly_with_the_micro_batches(two_nodes, zero, runtime):
    bytes_, times = [], []
    for m in (1, 2, 3, 5):
        est = _one_stage(two_nodes, 16, zero, _no_overlap(runtime), m)
        bytes_.append(est.stages[0].dp_bytes)
        times.append(est.breakdown.dp_comm_s)
    for series in (bytes_, times):
        per = series[1] - series[0]
        assert per > 0
        assert series[2] - series[1] == pytest.approx(per, rel=1e-9)
        assert series[3] - series[2] == pytest.approx(2 * per, rel=1e-9)


@pytest.mark.parametrize("zero", [0, 1])
def test_zero0_and_zero1_communicate_once_per_iteration(two_nodes, zero):
    one, four = (_one_stage(two_nodes, 16, zero, _no_overlap("deepspeed"), m) for m in (1, 4))
    assert four.stages[0].dp_bytes == pytest.approx(one.stages[0].dp_bytes, rel=1e-12)
    assert four.breakdown.dp_comm_s == pytest.approx(one.breakdown.dp_comm_s, rel=1e-12)


def test_zero3_moves_one_and_a_half_times_zero1_and_again_per_micro_batch(two_nodes):
    runtime = get_runtime("deepspeed")
    z1, z3, z3_twice = (_one_stage(two_nodes, 16, zero, runtime, m).stages[0].dp_bytes
                        for zero, m in ((1, 1), (3, 1), (3, 2)))
    assert z3 == pytest.approx(1.5 * z1, rel=1e-12)  # 3 Psi against 2 Psi
    assert z3_twice == pytest.approx(2 * z3, rel=1e-12)  # each micro-batch gathers twice and reduces again
    z2, z2_twice = (_one_stage(two_nodes, 16, 2, runtime, m).stages[0].dp_bytes for m in (1, 2))
    assert z2 == pytest.approx(z1, rel=1e-12)
    assert z2_twice - z2 == pytest.approx(z1 / 2, rel=1e-12)  # one more reduce-scatter: Psi


def test_zero3_with_pipeline_stages_gathers_per_micro_batch_per_stage():
    cluster = load_cluster("dgx-a100-80gb*2")
    runtime = dataclasses.replace(get_runtime("pytorch-fsdp2"), pipeline_defers_grad_reduce=False)
    one, three = (_one_stage(cluster, 8, 3, runtime, m, pp=2) for m in (1, 3))
    for s in range(2):
        assert three.stages[s].dp_bytes == pytest.approx(3 * one.stages[s].dp_bytes, rel=1e-12)
    assert three.breakdown.dp_comm_s > one.breakdown.dp_comm_s > 0


def test_deferred_zero3_pipeline_gathers_once_per_micro_batch_and_reduces_once():
    """torch.distributed.pipelining leaves FSDP2's weights unsharded and gradients unreduced after every
    backward but the last: one micro-batch moves what an undeferred one does (two gathers, one reduction),
    each further one a single gather, and the per-micro-batch collectives cost less time than undeferred."""
    cluster = load_cluster("dgx-a100-80gb*2")
    deferred = get_runtime("pytorch-fsdp2")
    undeferred = dataclasses.replace(deferred, pipeline_defers_grad_reduce=False)
    d1, d2, d3 = (_one_stage(cluster, 8, 3, deferred, m, pp=2) for m in (1, 2, 3))
    u1, u3 = (_one_stage(cluster, 8, 3, undeferred, m, pp=2) for m in (1, 3))
    for s in range(2):
        gather = d2.stages[s].dp_bytes - d1.stages[s].dp_bytes
        assert d1.stages[s].dp_bytes == pytest.approx(u1.stages[s].dp_bytes, rel=1e-12)
        assert d3.stages[s].dp_bytes - d2.stages[s].dp_bytes == pytest.approx(gather, rel=1e-12)
        # the reduction is at fp32, the gathers in bf16: one micro-batch's two gathers and one reduction
        assert u1.stages[s].dp_bytes == pytest.approx(4 * gather, rel=1e-12)
    assert d3.breakdown.dp_comm_s < u3.breakdown.dp_comm_s
    assert d3.iteration_time_s < u3.iteration_time_s


@pytest.mark.parametrize("runtime", ["megatron-lm-2021", "megatron-core", "deepspeed", "pytorch-fsdp2"])
def test_data_parallel_time_grows_with_the_nodes_at_fixed_per_gpu_batch(runtime):
    """Weak scaling: 4 samples per GPU on 1..64 nodes. The synchronisation never gets cheaper with more
    nodes, and grows at least by what the latency terms of one collective alone add (overlap hides the
    bandwidth of all but the last bucket, never its latency)."""
    times, latency = [], []
    for nodes in (1, 2, 4, 8, 16, 32, 64):
        cluster = load_cluster(f"dgx-a100-80gb*{nodes}")
        dp = 8 * nodes
        config = ParallelConfig(global_batch=4 * dp, dp=dp, micro_batch=4, zero=0, recompute="none",
                                sequence_parallel=False, runtime=runtime)
        times.append(estimate(MODEL, cluster, config).breakdown.dp_comm_s)
        group = dp_group(cluster, list(range(dp)), calibration_for("a100-80gb", runtime))
        latency.append(collective_time_s("all_reduce", 1.0, group))  # one byte: the latency terms alone
    assert all(b >= a * (1 - 1e-12) for a, b in zip(times, times[1:])), times
    assert times[-1] > times[0]
    assert all(tb - ta >= (lb - la) * (1 - 1e-9)
               for ta, tb, la, lb in zip(times, times[1:], latency, latency[1:])), (times, latency)


@pytest.mark.parametrize("zero", [0, 1])
def test_overlap_hides_at_most_all_but_the_last_bucket(zero):
    cluster = load_cluster("dgx-a100-80gb*4")
    group = dp_group(cluster, list(range(32)), calibration_for("a100-80gb", "megatron-core"))
    runtime = get_runtime("megatron-core")
    params = np.array([1e6, 4e7, 1e8, 3e8, 1.3e9])
    sync = dp_sync(zero, params, group, "bf16", runtime)
    kind = "all_reduce" if zero == 0 else "reduce_scatter"
    size = bucket_params(runtime, 32)
    bucket = params / np.ceil(params / size)  # the runtime's buckets, the parameters split evenly over them
    last = np.array([collective_time_s(kind, p * dtype_bytes("bf16"), group) for p in bucket])
    for window in (0.0, 1e-4, 1e-2, 1.0):
        hidden = exposed_s(sync.grad.total_s, sync.grad.edge_s, window, True)
        whole = exposed_s(sync.grad.total_s, sync.grad.edge_s, window, False)
        assert np.all(hidden <= whole * (1 + 1e-12))
        assert np.all(hidden >= last * (1 - 1e-6))
    # and in the estimate: overlapping the reduction never costs more than running it after the backward
    on = _one_stage(cluster, 32, zero, runtime, 2)
    off = _one_stage(cluster, 32, zero, dataclasses.replace(runtime, overlap_grad_reduce=False), 2)
    assert on.breakdown.dp_comm_s <= off.breakdown.dp_comm_s


def test_readme_gpt13b_on_16_a100s_resolves_to_zero1_not_zero3():
    """The README's case under the default runtime: ZeRO is left free and resolves to the distributed
    optimizer; ZeRO-3 is not Megatron-Core's to run (the rule book refuses it where megatron-core is named)."""
    model = load_model("models/gpt-1.3b.onnx")
    cluster = load_cluster("dgx-a100-80gb*2")
    est = estimate(model, cluster, ParallelConfig(global_batch=256, tp=1, pp=1, dp=16))
    assert est.feasible and est.config.runtime == "megatron-core" and est.config.zero <= 1
    with pytest.raises(ConfigError):
        estimate(model, cluster, ParallelConfig(global_batch=256, tp=1, pp=1, dp=16, zero=3, runtime="megatron-core"))


def test_zero3_recurrence_hides_a_gather_only_behind_the_compute_before_it():
    rng = np.random.default_rng(7)
    compute = rng.uniform(1.0, 2.0, size=(3, 12))
    small = rng.uniform(0.1, 0.9, size=(3, 12))  # every gather shorter than any layer's compute
    zeros = np.zeros_like(compute)
    # prefetched one layer ahead, only the first layer's gather shows (the backward's first is the last layer)
    forward, backward = zero3_exposed_s(compute, compute, small, zeros, 1, True)
    assert forward == pytest.approx(small[:, 0])
    assert backward == pytest.approx(small[:, -1])
    # without prefetch every gather shows; without overlap every reduce-scatter too
    forward, backward = zero3_exposed_s(compute, compute, small, small, 0, False)
    assert forward == pytest.approx(small.sum(axis=1))
    assert backward == pytest.approx(2 * small.sum(axis=1))
    # gathers longer than the compute: the link is the bound, and prefetching deeper cannot beat it
    large = small + 3.0
    for k in (1, 2, 4):
        forward, backward = zero3_exposed_s(compute, compute, large, large, k, True)
        assert np.all(forward >= large.sum(axis=1) - compute.sum(axis=1) + compute[:, -1] - 1e-12)
        assert np.all(backward >= 2 * large.sum(axis=1) - compute.sum(axis=1) - 1e-12)
    # deeper prefetch never hurts
    shallow, deep = (zero3_exposed_s(compute, compute, large - 2.0, zeros, k, True)[0] for k in (1, 3))
    assert np.all(deep <= shallow + 1e-12)
    # deferred (a pipeline stage keeping its weights gathered and gradients unreduced after a backward): the
    # forward gathers nothing, the backward only gathers, whatever the reduce-scatters would take
    forward, backward = zero3_exposed_s(compute, compute, large, large, 0, False, deferred=True)
    assert forward == pytest.approx(np.zeros(3))
    assert backward == pytest.approx(zero3_exposed_s(compute, compute, large, zeros, 0, False)[1])


def test_deepspeed_without_a_zero_optimizer_reduces_after_the_backward(two_nodes):
    """DeepSpeed overlaps the gradient reduction only in its ZeRO optimizer (overlap_comm); at ZeRO-0 its engine
    all-reduces after the backward, so the whole all-reduce is exposed, as with overlap switched off."""
    runtime = get_runtime("deepspeed")
    assert not runtime.overlaps_grad_reduce(0) and runtime.overlaps_grad_reduce(1)
    model = gpt(8, 4096, 32, 512, 32000)  # 1.6B parameters: several of DeepSpeed's 5e8-element buckets

    def dp_s(rt) -> float:
        return _one_stage(two_nodes, 16, 0, rt, 2, model=model).breakdown.dp_comm_s

    assert dp_s(runtime) == pytest.approx(dp_s(dataclasses.replace(runtime, overlap_grad_reduce=False)), rel=1e-12)
    assert dp_s(runtime) > dp_s(dataclasses.replace(runtime, overlap_grad_reduce_min_zero=0))


def test_deepspeed_pipeline_reduces_after_the_backward(two_nodes):
    """DeepSpeed's engine turns overlap_comm off for a PipelineModule: with pp > 1 the ZeRO-1 reduction is
    exposed whole, as with overlap switched off; one stage still overlaps it."""
    runtime = get_runtime("deepspeed")
    assert runtime.overlaps_grad_reduce(1) and not runtime.overlaps_grad_reduce(1, pipelined=True)
    model = gpt(8, 4096, 32, 512, 32000)
    no_overlap = dataclasses.replace(runtime, name="deepspeed-no-overlap", overlap_grad_reduce=False)

    def dp_s(rt, pp: int) -> float:
        return _one_stage(two_nodes, 16 // pp, 1, rt, 4, model=model, pp=pp).breakdown.dp_comm_s

    assert dp_s(runtime, 2) == pytest.approx(dp_s(no_overlap, 2), rel=1e-12)
    assert dp_s(runtime, 1) < dp_s(no_overlap, 1)


def test_deepspeed_bf16_pipeline_without_zero_also_gathers_its_weights(two_nodes):
    """DeepSpeed's BF16_Optimizer (a bf16 pipeline at ZeRO-0) all-reduces the gradients and, its states
    sharded, all-gathers the updated weights: (n-1)/n x (2 + 1) weights' bytes sent against ZeRO-1's
    reduce-scatter and all-gather, (n-1)/n x (1 + 1). In fp16 ZeRO-0 is the all-reduce alone."""
    runtime = get_runtime("deepspeed")

    def sent(zero: int, dtype: str) -> float:
        n = len(MODEL.layers)
        stages = tuple(StageSpec(a, b, (ReplicaSpec(devices=tuple(range(s * 8, s * 8 + 8)), tp=1, dp=8),))
                       for s, (a, b) in enumerate(((0, n // 2 - 1), (n // 2, n - 1))))
        spec = PipelineSpec(stages=stages, global_batch=32, micro_batch=1, zero=zero, runtime=runtime, dtype=dtype)
        return estimate_pipeline(MODEL, two_nodes, spec).stages[0].dp_bytes

    assert sent(0, "bf16") == pytest.approx(1.5 * sent(1, "bf16"), rel=1e-9)
    assert sent(0, "fp16") == pytest.approx(sent(1, "fp16"), rel=1e-9)


def test_fsdp2_in_a_pipeline_reduces_its_gradients_once(two_nodes):
    """With pp > 1 FSDP2's ZeRO-2 gradients are reduce-scattered once after the last backward (the pipelining
    stage's REDUCE_GRAD action), not in every micro-batch: the bytes sent do not grow with the micro-batches,
    and the reduction is exposed whole."""
    runtime = get_runtime("pytorch-fsdp2")
    sent = [_one_stage(two_nodes, 8, 2, runtime, m, pp=2).stages[0].dp_bytes for m in (2, 4, 8)]
    assert sent[0] == pytest.approx(sent[1], rel=1e-12) and sent[1] == pytest.approx(sent[2], rel=1e-12)
    one = [_one_stage(two_nodes, 16, 2, runtime, m).stages[0].dp_bytes for m in (2, 4)]
    assert one[1] > one[0]  # one stage still reduces every micro-batch
    group = dp_group(two_nodes, tuple(range(8)), calibration_for("a100-80gb", runtime.name))
    sync = dp_sync(2, np.asarray(1e9), group, "bf16", runtime, pipelined=True)
    assert sync.grad_once and not sync.overlap_grad
