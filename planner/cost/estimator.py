"""The estimator: one iteration of a resolved configuration, from layer costs to an Estimate.

``estimate_pipeline`` times an explicit PipelineSpec (uneven layer splits, a device type per stage,
heterogeneous replicas with batch shares). ``estimate`` builds the spec Megatron-LM would use for a
ParallelConfig (balanced split, devices in order) and resolves the choices left out to the best feasible.

Heterogeneous replicas (several ReplicaSpecs on one stage). Replica group ``r`` of a stage has ``dp_r``
replicas of a ``tp_r``-way group and processes ``share_r x global_batch`` samples, so each of its replicas
runs ``m_r = share_r x global_batch / (dp_r x micro_batch)`` micro-batches of ``micro_batch`` samples. The
pipeline is simulated with ``M = ceil(max m_r)`` micro-batch slots (over all stages); a stage's time per
slot is that of its slowest replica group scaled by its load, ``max_r t_r x m_r / M`` (for one replica group
with share 1 this is just its micro-batch time). The data-parallel gradient synchronisation of a stage spans
all its replicas across device types (``sum dp_r`` ranks, the largest per-rank gradient) over the slowest
link among them; each replica group's memory holds its own weights, states and in-flight micro-batches.

Iteration time = pipeline (simulated or closed form) + what each stage's data-parallel synchronisation and
optimizer step add after its last backward (a stage that finishes its backward early hides them in the
remaining drain of the stages before it). The breakdown charges the busiest stage's work: compute and
tensor-parallel communication of its ``M`` micro-batches, the pipeline transfers and bubble the schedule
adds, and the synchronisation and optimizer time past the pipeline's end. It sums to the total.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, replace
from typing import Mapping, Sequence

import numpy as np

from planner.cost.calibration import DeviceCalibration, calibration_for
from planner.cost.comm import dp_sync_time_s, node_group, zero3_gather_time_s
from planner.cost.compute import layer_costs
from planner.cost.memory import dtype_bytes, micro_batches_in_flight, stage_memory
from planner.cost.optimizer import optimizer_time_s
from planner.cost.schedule import SCHEDULES, pipeline_time
from planner.cost.validate import check_config, divisors, pipeline_units
from planner.errors import ConfigError
from planner.hardware.collectives import CommGroup, p2p_time_s
from planner.types import (Breakdown, Cluster, Estimate, LayerGraph, NodeProfile,
                           ParallelConfig, PipelineSpec, ReplicaEstimate, ReplicaSpec, StageEstimate, StageSpec)

log = logging.getLogger(__name__)

Calibrations = Mapping[str, DeviceCalibration]
MAX_MICRO_BATCH = 64  # largest micro-batch the resolution tries


# ------------------------------------------------------------------------------------------ devices


def _device_location(cluster: Cluster, device: int) -> tuple[NodeProfile, int]:
    """(node profile, global node index) of a device id."""
    node_base = 0
    for group in cluster.groups:
        first = group.first_device
        if first <= device < first + group.num_devices:
            return group.node, node_base + (device - first) // group.node.devices_per_node
        node_base += group.count
    raise ConfigError(f"device {device} is not in the cluster (devices 0..{cluster.num_devices - 1})")


def _cal(node: NodeProfile, calibrations: Calibrations | None) -> DeviceCalibration:
    if calibrations is not None and node.device.name in calibrations:
        return calibrations[node.device.name]
    return calibration_for(node.device.name)


# ---------------------------------------------------------------------------------- phase 1: work


@dataclass(frozen=True)
class _Replica:
    spec: ReplicaSpec
    node: NodeProfile
    cal: DeviceCalibration
    forward_s: float  # one of its micro-batches, compute + tp comm
    backward_s: float
    tp_comm_s: float
    params_per_rank: float
    activation_bytes: float  # per micro-batch in flight
    transient_bytes: float
    num_micro_batches: float  # m_r


@dataclass(frozen=True)
class _Stage:
    spec: StageSpec
    replicas: tuple[_Replica, ...]
    dp_group: CommGroup
    dp: int
    p2p_s: float  # to the next stage ((s + 1) % pp)


@dataclass(frozen=True)
class _Work:
    """Everything that does not depend on the schedule, vpp or ZeRO stage."""

    spec: PipelineSpec
    stages: tuple[_Stage, ...]
    num_micro_batches: int


def _check_spec(model: LayerGraph, cluster: Cluster, spec: PipelineSpec) -> None:
    n = len(model.layers)
    if not spec.stages:
        raise ConfigError("the pipeline spec has no stages")
    if spec.micro_batch < 1 or spec.global_batch < 1:
        raise ConfigError("global_batch and micro_batch must be positive")
    if spec.schedule not in SCHEDULES:
        raise ConfigError(f"schedule {spec.schedule!r} is not one of {', '.join(SCHEDULES)}")
    expected = 0
    seen: set[int] = set()
    for s, stage in enumerate(spec.stages):
        if stage.first_layer != expected or stage.last_layer < stage.first_layer or stage.last_layer >= n:
            raise ConfigError(f"stage {s}: layers {stage.first_layer}..{stage.last_layer} do not continue the "
                              f"previous stage (expected to start at layer {expected}, of {n})")
        expected = stage.last_layer + 1
        if not stage.replicas:
            raise ConfigError(f"stage {s} has no replica groups")
        share = sum(r.batch_share for r in stage.replicas)
        if abs(share - 1.0) > 1e-6:
            raise ConfigError(f"stage {s}: the batch shares of its replica groups sum to {share:g}, not 1")
        for r in stage.replicas:
            if r.tp < 1 or r.dp < 1 or len(r.devices) != r.tp * r.dp:
                raise ConfigError(f"stage {s}: a replica group with tp={r.tp}, dp={r.dp} needs {r.tp * r.dp} "
                                  f"devices, got {len(r.devices)}")
            if r.batch_share <= 0:
                raise ConfigError(f"stage {s}: batch_share must be positive, got {r.batch_share}")
            nodes = {_device_location(cluster, d)[1] for d in r.devices[:r.tp]}
            if len(nodes) > 1:
                raise ConfigError(f"stage {s}: the tensor-parallel group {list(r.devices[:r.tp])} spans "
                                  f"{len(nodes)} nodes; keep each tp group inside one node")
            for d in r.devices:
                if d in seen:
                    raise ConfigError(f"stage {s}: device {d} is used twice")
                seen.add(d)
    if expected != n:
        raise ConfigError(f"the stages end at layer {expected - 1} but the model has {n} layers (0..{n - 1})")
    if spec.vpp > 1 and spec.schedule != "interleaved":
        raise ConfigError(f"vpp={spec.vpp} needs the interleaved schedule")


def _dp_group(stage: StageSpec, cluster: Cluster, replicas: Sequence[_Replica]) -> tuple[CommGroup, int]:
    """The data-parallel group of one tensor-parallel rank position, over the slowest link among the
    stage's device types (see the module docstring)."""
    dp = sum(r.spec.dp for r in replicas)
    per_node: dict[int, int] = {}
    stage_devices_on_node: dict[int, int] = {}
    slowest: tuple[float, NodeProfile, DeviceCalibration] | None = None
    for r in replicas:
        for i, d in enumerate(r.spec.devices):
            node_index = _device_location(cluster, d)[1]
            stage_devices_on_node[node_index] = stage_devices_on_node.get(node_index, 0) + 1
            if i % r.spec.tp == 0:
                per_node[node_index] = per_node.get(node_index, 0) + 1
        rate = r.node.inter_node_bandwidth_Bps * r.cal.comm_scale
        if slowest is None or rate < slowest[0]:
            slowest = (rate, r.node, r.cal)
    assert slowest is not None
    ranks_per_node = min(per_node.values())
    share = min(per_node[k] / stage_devices_on_node[k] for k in per_node)
    return node_group(slowest[1], dp, ranks_per_node, slowest[2], nic_share=share), dp


def _work(model: LayerGraph, cluster: Cluster, spec: PipelineSpec, calibrations: Calibrations | None) -> _Work:
    g, mb = spec.global_batch, spec.micro_batch
    built: list[tuple[StageSpec, tuple[_Replica, ...], float]] = []
    for stage in spec.stages:
        sl = slice(stage.first_layer, stage.last_layer + 1)
        replicas = []
        for r in stage.replicas:
            node = _device_location(cluster, r.devices[0])[0]
            cal = _cal(node, calibrations)
            lc = layer_costs(model, node, r.tp, mb, spec.recompute, spec.sequence_parallel, spec.dtype, cal)
            replicas.append(_Replica(
                spec=r, node=node, cal=cal, forward_s=float(lc.forward_s[sl].sum()),
                backward_s=float(lc.backward_s[sl].sum()), tp_comm_s=float(lc.tp_comm_s[sl].sum()),
                params_per_rank=float(lc.params_per_rank[sl].sum()),
                activation_bytes=float(lc.activation_bytes[sl].sum()),
                transient_bytes=float(lc.peak_extra_bytes[sl].max()),
                num_micro_batches=r.batch_share * g / (r.dp * mb)))
        built.append((stage, tuple(replicas), float(lc.output_bytes[stage.last_layer])))
    m = max(1, math.ceil(max(r.num_micro_batches for _, reps, _ in built for r in reps) - 1e-9))
    stages = []
    pp = len(built)
    for s, (stage, replicas, out_bytes) in enumerate(built):
        group, dp = _dp_group(stage, cluster, replicas)
        nxt = built[(s + 1) % pp][0].replicas[0].devices[0]
        src = stage.replicas[0].devices[0]
        p2p = 0.0
        if pp > 1:
            p2p = p2p_time_s(cluster, src, nxt, out_bytes) / replicas[0].cal.comm_scale
        stages.append(_Stage(stage, replicas, group, dp, p2p))
    return _Work(spec, tuple(stages), m)


# ------------------------------------------------------------------------------- phase 2: timing


def _approximate_pipeline(f: np.ndarray, b: np.ndarray, m: int, vpp: int, p2p: Sequence[float],
                          schedule: str) -> float:
    """Fast estimate used to rank candidates: fill and drain of every stage plus ``m - 1`` periods of the
    slowest (exact for uniform stages without transfers)."""
    per = f + b
    hops = sum(p2p) if schedule == "interleaved" else sum(p2p[:-1])
    fill = (per.sum() - per.max()) / (vpp if schedule == "interleaved" else 1)
    return float(m * per.max() + fill + 2 * hops)


def _finish(model: LayerGraph, work: _Work, schedule: str, vpp: int, zero: int, exact: bool) -> Estimate:
    spec = replace(work.spec, schedule=schedule, vpp=vpp, zero=zero)
    m, pp, dtype = work.num_micro_batches, len(work.stages), spec.dtype
    width = dtype_bytes(dtype)
    fwd = np.empty(pp)
    bwd = np.empty(pp)
    tp_slot = np.empty(pp)
    z3_slot = np.zeros(pp)
    for s, st in enumerate(work.stages):
        f_max = b_max = tp_max = z3_max = 0.0
        for r in st.replicas:
            load = r.num_micro_batches / m
            f, b = r.forward_s, r.backward_s
            z3 = 0.0
            if zero == 3:
                gather = zero3_gather_time_s(r.params_per_rank, st.dp_group, dtype)
                z3 = max(0.0, gather - r.cal.dp_overlap * f) + max(0.0, gather - r.cal.dp_overlap * b)
                f += max(0.0, gather - r.cal.dp_overlap * f)
                b += max(0.0, gather - r.cal.dp_overlap * r.backward_s)
            if (f + b) * load > (f_max + b_max):
                f_max, b_max, tp_max, z3_max = f * load, b * load, r.tp_comm_s * load, z3 * load
        fwd[s], bwd[s], tp_slot[s], z3_slot[s] = f_max, b_max, tp_max, z3_max
    p2p = [st.p2p_s for st in work.stages]
    if exact:
        total_pipe, _ = pipeline_time(fwd, bwd, m, schedule, vpp, p2p)
    else:
        total_pipe = _approximate_pipeline(fwd, bwd, m, vpp, p2p, schedule)
    # after the pipeline: each stage synchronises and steps once its own last backward is done
    drained = 0.0
    tail_end = total_pipe
    critical_sync = critical_opt = 0.0
    stage_sync: list[float] = []
    stage_opt: list[float] = []
    for s, st in enumerate(work.stages):
        finish = total_pipe - drained
        drained += bwd[s] / vpp + st.p2p_s
        sync = opt = 0.0
        for r in st.replicas:
            window = r.cal.dp_overlap * r.backward_s / vpp
            sync = max(sync, dp_sync_time_s(r.params_per_rank, st.dp_group, zero, dtype, window))
            opt = max(opt, optimizer_time_s(r.params_per_rank, r.node.device, spec.optimizer, zero, st.dp,
                                            dtype, r.cal))
        stage_sync.append(sync)
        stage_opt.append(opt)
        if finish + sync + opt > tail_end:
            tail_end = finish + sync + opt
            slack = total_pipe - finish
            critical_sync = max(0.0, sync - slack)
            critical_opt = tail_end - total_pipe - critical_sync
    iteration = tail_end
    # breakdown on the busiest stage
    c = int(np.argmax(fwd + bwd))
    busy = m * (fwd[c] + bwd[c])
    bubble_all = max(0.0, total_pipe - busy)
    hops = sum(p2p) if schedule == "interleaved" else sum(p2p[:-1])
    pp_comm = min(bubble_all, 2.0 * hops)
    breakdown = Breakdown(compute_s=busy - m * (tp_slot[c] + z3_slot[c]), tp_comm_s=m * tp_slot[c],
                          pp_comm_s=pp_comm, dp_comm_s=m * z3_slot[c] + critical_sync,
                          bubble_s=bubble_all - pp_comm, optimizer_s=critical_opt)
    # memory
    stages_out: list[StageEstimate] = []
    worst = 0.0
    reason = ""
    for s, st in enumerate(work.stages):
        in_flight = micro_batches_in_flight(s, pp, m, schedule, vpp)
        reps: list[ReplicaEstimate] = []
        for r in st.replicas:
            transient = r.transient_bytes
            if zero == 3:
                layer_params = max(layer.params for layer in
                                   model.layers[st.spec.first_layer:st.spec.last_layer + 1]) / r.spec.tp
                transient += 2 * layer_params * width  # the gathered layer and the next one prefetched
            flight = min(in_flight, math.ceil(r.num_micro_batches - 1e-9))
            mem = stage_memory(r.params_per_rank, r.activation_bytes, flight, zero, st.dp, spec.optimizer,
                               dtype, transient)
            capacity = float(r.node.device.memory_bytes)
            reps.append(ReplicaEstimate(
                device_type=r.node.device.name, devices=r.spec.devices, tp=r.spec.tp, dp=r.spec.dp,
                batch_share=r.spec.batch_share, num_micro_batches=r.num_micro_batches, forward_s=r.forward_s,
                backward_s=r.backward_s, memory=mem, memory_capacity_bytes=capacity))
            worst = max(worst, mem.total_bytes)
            if mem.total_bytes > capacity and not reason:
                reason = (f"stage {s} (layers {st.spec.first_layer}-{st.spec.last_layer}) on "
                          f"{r.node.device.name} needs {mem.total_bytes / 1e9:.1f} GB per device "
                          f"(weights {mem.weights_bytes / 1e9:.1f}, gradients {mem.gradients_bytes / 1e9:.1f}, "
                          f"optimizer {mem.optimizer_bytes / 1e9:.1f}, activations "
                          f"{mem.activations_bytes / 1e9:.1f}, other {mem.other_bytes / 1e9:.1f}) but has "
                          f"{capacity / 1e9:.1f} GB")
        top = max(reps, key=lambda x: x.memory.total_bytes / x.memory_capacity_bytes)
        names = "+".join(dict.fromkeys(x.device_type for x in reps))
        stages_out.append(StageEstimate(
            index=s, first_layer=st.spec.first_layer, last_layer=st.spec.last_layer, device_type=names,
            devices=tuple(d for x in reps for d in x.devices), tp=st.replicas[0].spec.tp, dp=st.dp,
            forward_s=float(fwd[s]), backward_s=float(bwd[s]), memory=top.memory,
            memory_capacity_bytes=top.memory_capacity_bytes, replicas=tuple(reps), tp_comm_s=float(tp_slot[s]),
            p2p_s=st.p2p_s, dp_sync_s=stage_sync[s], optimizer_s=stage_opt[s]))
    config = ParallelConfig(global_batch=spec.global_batch, tp=work.stages[0].replicas[0].spec.tp, pp=pp,
                            dp=work.stages[0].dp, micro_batch=spec.micro_batch, vpp=vpp, zero=zero,
                            recompute=spec.recompute, sequence_parallel=spec.sequence_parallel,
                            schedule=schedule, optimizer=spec.optimizer, dtype=dtype)
    notes = tuple(sorted({f"{r.node.device.name}: no fitted calibration, profile efficiencies used as written"
                          for st in work.stages for r in st.replicas if not r.cal.fitted}))
    return Estimate(config=config, iteration_time_s=iteration,
                    throughput_samples_per_s=spec.global_batch / iteration if iteration > 0 else 0.0,
                    feasible=not reason, memory_per_device_bytes=worst, breakdown=breakdown,
                    stages=tuple(stages_out), reason=reason, notes=notes)


def estimate_pipeline(model: LayerGraph, cluster: Cluster, spec: PipelineSpec,
                      calibration: Calibrations | None = None) -> Estimate:
    """Time and memory of an explicit pipeline (see the module docstring for heterogeneous replicas).
    Memory that does not fit gives ``feasible=False`` with a reason naming the stage, not an exception."""
    _check_spec(model, cluster, spec)
    if spec.schedule == "interleaved" and spec.vpp > 1 and len(spec.stages) > 1:
        m = _work(model, cluster, spec, calibration).num_micro_batches
        if m % len(spec.stages):
            raise ConfigError(f"the interleaved schedule needs the number of micro-batches ({m}) to be a "
                              f"multiple of pp={len(spec.stages)}")
    work = _work(model, cluster, spec, calibration)
    return _finish(model, work, spec.schedule, spec.vpp, spec.zero, exact=True)


# --------------------------------------------------------------------------- estimate(ParallelConfig)


def balanced_split(model: LayerGraph, pp: int) -> list[tuple[int, int]]:
    """Megatron-LM's split: the transformer blocks evenly over ``pp`` stages (the first stages of an uneven
    split take one more), layers before the first block on stage 0, the rest with the block before them."""
    n = len(model.layers)
    blocks = [i for i, layer in enumerate(model.layers) if layer.kind == "block"] or list(range(n))
    per, extra = divmod(len(blocks), pp)
    bounds: list[tuple[int, int]] = []
    start_block = 0
    for s in range(pp):
        count = per + (1 if s < extra else 0)
        last_block = blocks[start_block + count - 1]
        first = 0 if s == 0 else bounds[-1][1] + 1
        last = n - 1 if s == pp - 1 else last_block
        bounds.append((first, last))
        start_block += count
    return bounds


def _megatron_spec_stages(model: LayerGraph, cluster: Cluster, tp: int, pp: int, dp: int) -> tuple[StageSpec, ...]:
    """Devices in Megatron-LM's order (tp fastest, then dp, then pp); a stage whose replicas fall on several
    device types gets one replica group per type, each with its share of the batch."""
    stages = []
    for s, (first, last) in enumerate(balanced_split(model, pp)):
        base = s * tp * dp
        groups: dict[str, list[int]] = {}
        for k in range(dp):
            devices = list(range(base + k * tp, base + (k + 1) * tp))
            node = _device_location(cluster, devices[0])[0]
            groups.setdefault(node.name, []).extend(devices)
        replicas = tuple(ReplicaSpec(devices=tuple(devs), tp=tp, dp=len(devs) // tp, batch_share=len(devs) / (tp * dp))
                         for devs in groups.values())
        stages.append(StageSpec(first, last, replicas))
    return tuple(stages)


def _candidates(model: LayerGraph, config: ParallelConfig) -> dict[str, list]:
    tp, pp, dp, g = config.tp, config.pp, config.dp, config.global_batch
    per_replica = g // dp
    mbs = [config.micro_batch] if config.micro_batch else [d for d in divisors(per_replica) if d <= MAX_MICRO_BATCH]
    units = pipeline_units(model)
    if config.vpp is not None:
        vpps = [config.vpp]
    elif pp == 1 or config.schedule in ("1f1b", "gpipe"):
        vpps = [1]
    else:
        vpps = [v for v in divisors(units // pp) if units % (pp * v) == 0] if units % pp == 0 else [1]
        if config.schedule == "interleaved":
            vpps = [v for v in vpps if v > 1] or [1]
    return {
        "micro_batch": mbs,
        "recompute": [config.recompute] if config.recompute else ["none", "selective", "full"],
        "sequence_parallel": [bool(config.sequence_parallel)] if config.sequence_parallel is not None or tp == 1
        else [False, True],
        "vpp": vpps,
        "zero": [config.zero] if config.zero is not None else ([0, 1, 2, 3] if dp > 1 else [0]),
    }


def _schedule_for(config: ParallelConfig, vpp: int) -> str:
    if vpp > 1:
        return "interleaved"
    return config.schedule if config.schedule in ("1f1b", "gpipe") else "1f1b"


def estimate(model: LayerGraph, cluster: Cluster, config: ParallelConfig,
             calibration: Calibrations | None = None) -> Estimate:
    """Predict one configuration. Fields left None (micro_batch, recompute, sequence_parallel, vpp, zero,
    schedule) resolve to the fastest feasible choice (if none fits, the one needing the least memory,
    with ``feasible=False``); ``Estimate.config`` says what they resolved to."""
    check_config(model, cluster, config)
    tp, pp, dp = config.tp, config.pp, config.dp
    stages = _megatron_spec_stages(model, cluster, tp, pp, dp)
    options = _candidates(model, config)
    ranked: list[tuple[tuple, Estimate, _Work, str, int, int]] = []
    for recompute in options["recompute"]:
        for sp in options["sequence_parallel"]:
            for mb in options["micro_batch"]:
                spec = PipelineSpec(stages=stages, global_batch=config.global_batch, micro_batch=mb,
                                    recompute=recompute, sequence_parallel=sp, optimizer=config.optimizer,
                                    dtype=config.dtype)
                work = _work(model, cluster, spec, calibration)
                any_fits = False
                for vpp in options["vpp"]:
                    if vpp > 1 and work.num_micro_batches % pp:
                        continue
                    schedule = _schedule_for(config, vpp)
                    for zero in options["zero"]:
                        est = _finish(model, work, schedule, vpp, zero, exact=False)
                        any_fits = any_fits or est.feasible
                        key = (0, est.iteration_time_s) if est.feasible else (1, est.memory_per_device_bytes)
                        ranked.append((key, est, work, schedule, vpp, zero))
                if not any_fits and config.micro_batch is None and ranked:
                    break  # larger micro-batches only need more memory
    if not ranked:
        raise ConfigError(f"no schedule fits: the interleaved schedule needs the number of micro-batches to be "
                          f"a multiple of pp={pp}; use vpp 1 or another micro-batch")
    ranked.sort(key=lambda item: item[0])
    best: Estimate | None = None
    for key, _, work, schedule, vpp, zero in ranked[:3]:
        exact = _finish(model, work, schedule, vpp, zero, exact=True)
        if best is None or (not exact.feasible, exact.iteration_time_s if exact.feasible
                            else exact.memory_per_device_bytes) < \
                (not best.feasible, best.iteration_time_s if best.feasible else best.memory_per_device_bytes):
            best = exact
    assert best is not None
    return best


__all__ = ["estimate", "estimate_pipeline", "balanced_split"]
