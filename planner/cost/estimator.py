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

Iteration time = pipeline (simulated or closed form) + what each stage's once-per-iteration data-parallel
synchronisation and optimizer step add after its last backward (a stage that finishes its backward early
hides them in the remaining drain of the stages before it). ZeRO-2's gradient reduce-scatter and ZeRO-3's
per-layer gathers and reduce-scatters run in every micro-batch: what the computation does not hide of them
is part of each micro-batch's forward and backward (``planner.cost.comm``). The breakdown charges the busiest
stage's work: compute and tensor-parallel communication of its ``M`` micro-batches, the pipeline transfers and
bubble the schedule adds, and the synchronisation and optimizer time past the pipeline's end. It sums to the
total.
"""

from __future__ import annotations

import itertools
import logging
import math
from dataclasses import dataclass, field, replace
from functools import lru_cache
from typing import Mapping

import numpy as np

from planner.cost.calibration import DeviceCalibration, calibration_for
from planner.cost.comm import (ZERO_STAGES, DpSync, Pass, dp_bytes_per_iteration, dp_group, dp_sync,
                               layer_collective_s, micro_batch_reduce_s, one_after_other, sync_tail_s,
                               tied_grad_sync_s, zero3_exposed_s)
from planner.cost.compute import layer_costs
from planner.cost.context import layers_exchange_s
from planner.cost.moe import ep_group_devices, expert_dp_devices, merged_ratio, resolved_expert_tp
from planner.cost.memory import (dtype_bytes, gradient_reduce_bytes, memory_terms, micro_batches_in_flight,
                                 stage_tied_params)
from planner.cost.optimizer import optimizer_time_s
from planner.cost.schedule import SCHEDULES, pipeline_time
from planner.errors import ConfigError
from planner.hardware.cluster import locate
from planner.hardware.efficiency import resolve_dtype
from planner.hardware.fp8 import base_dtype, cost_dtype, recipe_name, resolve_fp8_recipe
from planner.hardware.collectives import CommGroup, p2p_time_s
from planner.rules import (MAX_PIPELINE_MICRO_BATCHES, TIE_TOLERANCE, ModelShape, check_config, check_ep_overlap,
                           check_pipeline_micro_batches, divisors, ep_overlap_choices, ep_overlap_pipeline_fits,
                           ep_values, even_split_fits, expert_tp_values, layer_chunks, micro_batch_choices,
                           pipeline_units, recompute_choices, resolve_runtime, simplicity_key, stage_blocks,
                           tp_zero_fits, unit_flags, vpp_fits, zero_stages)
from planner.runtime import Runtime, get_runtime
from planner.types import (Batching, Breakdown, Cluster, Estimate, LayerGraph, MemoryBreakdown, NodeProfile,
                           ParallelConfig, PipelineSpec, ReplicaEstimate, ReplicaSpec, StageEstimate, StageSpec)
from planner.units import GIB

log = logging.getLogger(__name__)

Calibrations = Mapping[str, DeviceCalibration]
FINALIST_MARGIN = 0.02  # candidates this close to the best by the fast formula are timed exactly
# the best candidate of each other vpp this close is timed exactly too (the fast formula's error grows with vpp:
# 40% on gpt-1.3b tp2 pp2 dp4, where vpp 2 and vpp 12 were 0.2% apart by the formula)
VPP_MARGIN = 0.10


# ------------------------------------------------------------------------------------------ devices


def _device_location(cluster: Cluster, device: int) -> tuple[NodeProfile, int]:
    """(node profile, global node index) of a device id."""
    group_index, node_index = locate(cluster, device)
    return cluster.groups[group_index].node, node_index


def _cal(node: NodeProfile, calibrations: Calibrations | None, runtime: Runtime) -> DeviceCalibration:
    if calibrations is not None and node.device.name in calibrations:
        return calibrations[node.device.name]
    return calibration_for(node.device.name, runtime.name)


# ------------------------------------------------------------------------------ placement and work


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
            if r.tp < 1 or r.dp < 1 or r.cp < 1 or len(r.devices) != r.tp * r.cp * r.dp:
                cp = f", cp={r.cp}" if r.cp != 1 else ""
                raise ConfigError(f"stage {s}: a replica group with tp={r.tp}{cp}, dp={r.dp} needs "
                                  f"{r.tp * r.cp * r.dp} devices, got {len(r.devices)}")
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


@dataclass(frozen=True, eq=False)
class _Placement:
    """What does not depend on the micro-batch, recompute or sequence parallelism: which devices serve which
    layers, their groups, and per ZeRO stage the data-parallel passes and optimizer times. Arrays are per
    replica group ("row"; rows are ordered by stage), or per stage where named so; [row, layer] arrays hold
    a row's stage layers in order, padded with zeros to the longest stage."""

    stages: tuple[StageSpec, ...]
    rows: tuple[ReplicaSpec, ...]
    nodes: tuple[NodeProfile, ...]
    cals: tuple[DeviceCalibration, ...]
    row_stage: np.ndarray
    single: bool  # one row per stage
    stage_dp: tuple[int, ...]  # ranks of a stage's gradient reduction: its replicas x their cp ranks
    stage_replicas: tuple[int, ...]  # data-parallel replicas of a stage
    row_dp: np.ndarray
    capacity: np.ndarray
    params: np.ndarray
    largest_layer_params: np.ndarray
    syncs: tuple[DpSync, ...]  # [zero], arrays per row
    tied_sync_s: np.ndarray  # per row: the all-reduce of a tied weight's copies, after the syncs
    optimizer_s: tuple[np.ndarray, ...]  # [zero][row]
    zero3_gather_s: np.ndarray  # [row, layer]: one layer's all-gather
    zero3_reduce_s: np.ndarray  # [row, layer]: one layer's gradient reduce-scatter
    optimizer: str
    dtype: str
    runtime: Runtime
    # mixture of experts (planner.cost.moe): per row, (ep, expert_tp, expert-parallel group), its routed
    # experts' parameters per rank and their data-parallel degree
    experts: tuple[tuple[int, int, CommGroup | None], ...] = ()
    expert_params: np.ndarray | float = 0.0
    row_expert_dp: np.ndarray | float = 1.0
    has_experts: bool = False  # the model has mixture-of-experts layers
    # per stage, which of its layers are pipeline units (planner.rules.unit_flags), and how many
    stage_unit_flags: tuple[tuple[int, ...], ...] = ()
    stage_units: tuple[int, ...] = ()

    def layout(self, vpp: int) -> bool:
        """Whether ``vpp`` chunks per stage make a pipeline layout: some stage's units do not split evenly."""
        return any(n % vpp for n in self.stage_units)


def _expert_groups(model: LayerGraph, cluster: Cluster, r: ReplicaSpec, cal: DeviceCalibration, ep: int,
                   expert_tp: int) -> tuple[tuple[int, int, CommGroup | None], CommGroup | None]:
    """((ep, expert_tp, expert-parallel group), expert-data-parallel group) of a replica group, Megatron-Core's
    folding of its ranks (planner.cost.moe); the expert-data-parallel group is None where it is the replica
    group's data-parallel group (or the model has no experts)."""
    etp = resolved_expert_tp(r.tp, expert_tp)
    if not any(layer.moe is not None for layer in model.layers):
        return (1, r.tp, None), None
    if len(r.devices) % (ep * etp):
        raise ConfigError(f"ep={ep} x expert_tp={etp} does not divide the {len(r.devices)} devices of a replica "
                          f"group (tp={r.tp}, dp={r.dp}); use an ep that divides tp x dp / expert_tp")
    group = dp_group(cluster, ep_group_devices(r.devices, ep, etp), cal) if ep > 1 else None
    edp = dp_group(cluster, expert_dp_devices(r.devices, ep, etp), cal) if ep * etp != r.tp else None
    return (ep, etp, group), edp


def _placement(model: LayerGraph, cluster: Cluster, stages: tuple[StageSpec, ...], optimizer: str, dtype: str,
               calibrations: Calibrations | None, runtime: Runtime, ep: int = 1, expert_tp: int = 0) -> _Placement:
    rows, nodes, cals, row_stage, groups, stage_dp, row_dp, stage_replicas = [], [], [], [], [], [], [], []
    params, largest, layer_params = [], [], []
    experts, expert_params, edp_groups, row_edp = [], [], [], []
    for s, stage in enumerate(stages):
        sl = slice(stage.first_layer, stage.last_layer + 1)
        first_row = len(rows)
        for r in stage.replicas:
            node = _device_location(cluster, r.devices[0])[0]
            cal = _cal(node, calibrations, runtime)
            par, edp = _expert_groups(model, cluster, r, cal, ep, expert_tp)
            lc = layer_costs(model, node, r.tp, 1, "none", False, dtype, cal, runtime, ep=par[0], expert_tp=par[1],
                             ep_group=par[2])
            rows.append(r)
            nodes.append(node)
            cals.append(cal)
            row_stage.append(s)
            params.append(float(lc.params_per_rank[sl].sum())
                          + stage_tied_params(model, stage.first_layer, stage.last_layer, r.tp))
            largest.append(float(lc.params_per_rank[sl].max()))
            layer_params.append(lc.params_per_rank[sl])
            experts.append(par)
            expert_params.append(float(lc.expert_params_per_rank[sl].sum()) if edp is not None else 0.0)
            edp_groups.append(edp)
            row_edp.append(edp.size if edp is not None else 0)
        # one rank per tp group: with context parallelism the dp x cp ranks that hold a copy of the weights
        ranks = [d for r in stage.replicas for d in r.devices[::r.tp]]
        slowest = min(cals[first_row:], key=lambda c: c.comm_scale)
        groups.append(dp_group(cluster, ranks, slowest))
        stage_dp.append(len(ranks))
        stage_replicas.append(sum(r.dp for r in stage.replicas))
        row_dp.extend([len(ranks)] * len(stage.replicas))
    row_edp = [e or d for e, d in zip(row_edp, row_dp)]
    p_expert = np.array(expert_params)
    p = np.array(params)
    # per layer, each row's collectives over its data-parallel group: [kind][row, layer]; rows whose groups
    # are alike (every stage of a uniform pipeline) are timed in one call
    padded = np.zeros((len(rows), max(len(x) for x in layer_params)))
    for i, x in enumerate(layer_params):
        padded[i, :len(x)] = x
    alike: dict[CommGroup, list[int]] = {}
    for i in range(len(rows)):
        alike.setdefault(groups[row_stage[i]], []).append(i)
    per_layer = {kind: np.zeros_like(padded) for kind in ("all_reduce", "reduce_scatter", "all_gather")}
    for group, idx in alike.items():
        for kind, out in per_layer.items():
            out[idx] = layer_collective_s(kind, padded[idx], group, dtype, runtime)
    syncs, opt_s = [], []
    pipelined = len(stages) > 1
    for zero in ZERO_STAGES:
        grad = per_layer["all_reduce" if zero == 0 else "reduce_scatter"]
        gather = per_layer["all_gather"]
        dense = p - p_expert if zero < 3 else p
        parts = [(idx, dp_sync(zero, dense[idx], group, dtype, runtime, grad[idx].sum(axis=1),
                               grad[idx, 0], gather[idx].sum(axis=1), gather[idx, 0], pipelined))
                 for group, idx in alike.items()]
        sync = _gather_rows(len(rows), parts)
        if p_expert.any() and zero < 3:  # the experts' gradients over their own data-parallel group
            expert = [([i], dp_sync(zero, p_expert[[i]], edp_groups[i], dtype, runtime, pipelined=pipelined))
                      for i in range(len(rows)) if edp_groups[i] is not None]
            sync = one_after_other(sync, _gather_rows(len(rows), expert))
        syncs.append(sync)
        opt_s.append(np.array([optimizer_time_s(p[i], nodes[i].device, optimizer, zero, row_dp[i], dtype, cals[i],
                                                runtime, p_expert[i], row_edp[i], pipelined)
                               for i in range(len(rows))]))
    tied = _tied_sync_rows(model, cluster, stages, rows, row_stage, cals, dtype, runtime)
    units = unit_flags([layer.kind for layer in model.layers])
    flags = tuple(units[stage.first_layer:stage.last_layer + 1] for stage in stages)
    return _Placement(
        stages=stages, rows=tuple(rows), nodes=tuple(nodes), cals=tuple(cals), row_stage=np.array(row_stage),
        single=len(rows) == len(stages), stage_dp=tuple(stage_dp), stage_replicas=tuple(stage_replicas),
        row_dp=np.array(row_dp, dtype=float),
        capacity=np.array([float(n.device.memory_bytes) for n in nodes]), params=p,
        largest_layer_params=np.array(largest), syncs=tuple(syncs), tied_sync_s=tied, optimizer_s=tuple(opt_s),
        zero3_gather_s=per_layer["all_gather"], zero3_reduce_s=per_layer["reduce_scatter"],
        optimizer=optimizer, dtype=dtype, runtime=runtime, experts=tuple(experts), expert_params=p_expert,
        row_expert_dp=np.array(row_edp, dtype=float),
        has_experts=any(layer.moe is not None for layer in model.layers),
        stage_unit_flags=flags, stage_units=tuple(sum(f) for f in flags))


def _chunk_shares(pl: _Placement, work: _Work, pick: np.ndarray, vpp: int) -> tuple[tuple[float, ...], ...] | None:
    """Each stage's share of its time per model chunk where some stage's units do not split into ``vpp``
    equal chunks (a pipeline layout): the forward and backward time of the layers each chunk holds
    (planner.rules.layer_chunks: the embedding in the first chunk, the head in the last), on the stage's
    slowest replica group (``pick``). None where every stage's chunks are whole: each then takes 1/vpp, the
    share the search's bound assumes (the embedding and head spread over their stage's chunks)."""
    if not pl.layout(vpp):
        return None
    shares = []
    for s, flags in enumerate(pl.stage_unit_flags):
        times = work.layer_forward_s[pick[s], :len(flags)] + work.layer_backward_s[pick[s], :len(flags)]
        total = float(times.sum())
        per_chunk = np.bincount(layer_chunks(flags, vpp, s == 0), weights=times, minlength=vpp)
        shares.append(tuple(float(x) / total for x in per_chunk) if total > 0 else (1.0 / vpp,) * vpp)
    return tuple(shares)


def _tied_sync_rows(model: LayerGraph, cluster: Cluster, stages: tuple[StageSpec, ...], rows: list[ReplicaSpec],
                    row_stage: list[int], cals: list[DeviceCalibration], dtype: str, runtime: Runtime) -> np.ndarray:
    """Per row, the all-reduce of tied weights between the stage that owns them and the later stage that keeps
    a copy (``planner.cost.comm.tied_grad_sync_s``; every row of both stages takes part), over the two
    stages' first devices as the pipeline hand-offs are timed."""
    out = np.zeros(len(rows))
    stage_of = {layer: s for s, st in enumerate(stages) for layer in range(st.first_layer, st.last_layer + 1)}
    for k, layer in enumerate(model.layers):
        for owner, p in layer.tied_params:
            ends = (stage_of[owner], stage_of[k])
            if ends[0] == ends[1]:
                continue
            leaders = [stages[s].replicas[0].devices[0] for s in ends]
            for i in (i for i, s in enumerate(row_stage) if s in ends):
                out[i] += float(tied_grad_sync_s(p / rows[i].tp, dp_group(cluster, leaders, cals[i]), dtype,
                                                 runtime))
    return out


def _gather_rows(count: int, parts: list[tuple[list[int], DpSync]]) -> DpSync:
    """One DpSync over ``count`` rows from the DpSyncs of groups of rows (``parts``: row indices, their sync,
    at least one; every part runs the same ZeRO stage under the same runtime)."""
    def rows_of(name: str) -> Pass:
        fields = []
        for attribute in ("total_s", "edge_s", "sent_bytes"):
            out = np.zeros(count)
            for idx, sync in parts:
                out[idx] = getattr(getattr(sync, name), attribute)
            fields.append(out)
        return Pass(*fields)
    return replace(parts[0][1], grad=rows_of("grad"), gather=rows_of("gather"))


@dataclass(frozen=True, eq=False)
class _Work:
    """The per-micro-batch costs of every replica group for one (micro-batch, recompute, sequence
    parallelism)."""

    placement: _Placement
    global_batch: int
    micro_batch: int
    recompute: str
    sequence_parallel: bool
    forward_s: np.ndarray
    backward_s: np.ndarray
    tp_comm_s: np.ndarray
    activation_bytes: np.ndarray
    transient_bytes: np.ndarray
    cp_comm_s: np.ndarray  # of forward_s + backward_s: the exposed context-parallel exchange
    row_micro_batches: np.ndarray  # m_r
    num_micro_batches: int  # M
    p2p_s: np.ndarray  # per stage, to stage (s + 1) % pp
    layer_forward_s: np.ndarray  # [row, layer] as the placement's per-layer arrays
    layer_backward_s: np.ndarray
    memo: dict = field(default_factory=dict, compare=False, repr=False)  # ZeRO-3's exposed gathers
    ep_comm_s: np.ndarray | float = 0.0  # expert-parallel communication in forward_s + backward_s
    # forward_s + backward_s as one merged step of expert-parallel overlap (planner.cost.moe.merged_layer_s)
    merged_s: np.ndarray | None = None


def _work(model: LayerGraph, cluster: Cluster, placement: _Placement, global_batch: int, micro_batch: int,
          recompute: str, sequence_parallel: bool) -> _Work:
    n = len(placement.rows)
    f, b, tpc, act, extra, m_r, cpc, epc, merged = (np.empty(n) for _ in range(9))
    layer_f, layer_b = np.zeros_like(placement.zero3_gather_s), np.zeros_like(placement.zero3_gather_s)
    out_bytes = np.zeros(len(placement.stages))
    batching = Batching(global_batch, micro_batch, int(placement.stage_dp[0]))
    for i, (r, node, cal) in enumerate(zip(placement.rows, placement.nodes, placement.cals)):
        stage = placement.stages[placement.row_stage[i]]
        sl = slice(stage.first_layer, stage.last_layer + 1)
        ep, etp, group = placement.experts[i]
        lc = layer_costs(model, node, r.tp, micro_batch, recompute, sequence_parallel, placement.dtype, cal,
                         placement.runtime, cp=r.cp, ep=ep, expert_tp=etp, ep_group=group)
        cp_f, cp_b = layers_exchange_s(model.layers[sl], lc.attention_kernel_forward_s[sl],
                                       lc.attention_kernel_backward_s[sl], cluster, r.devices, r.tp, r.cp,
                                       micro_batch, placement.dtype, recompute, cal.comm_scale)
        layer_f[i, :sl.stop - sl.start] = lc.forward_s[sl] + cp_f
        layer_b[i, :sl.stop - sl.start] = lc.backward_s[sl] + cp_b
        f[i] = lc.forward_s[sl].sum() + cp_f.sum()
        b[i] = lc.backward_s[sl].sum() + cp_b.sum()
        cpc[i] = cp_f.sum() + cp_b.sum()
        tpc[i] = lc.tp_comm_s[sl].sum()
        epc[i] = lc.ep_comm_s[sl].sum()
        merged[i] = lc.merged_s[sl].sum() + cpc[i]
        act[i] = lc.activation_bytes[sl].sum()
        extra[i] = lc.peak_extra_bytes[sl].max()
        m_r[i] = batching.replica_micro_batches(r.batch_share, r.dp)
        if r is stage.replicas[0]:
            last_stage = placement.row_stage[i] == len(placement.stages) - 1
            # the last stage's transfer is the interleaved schedule's wrap-around: a chunk of the last stage
            # hands its output to the first stage's next chunk. That tensor is a chunk boundary, never the
            # model's own output (a language model's logits are vocabulary/hidden times larger); it is taken
            # as the largest output of any layer but the last, which does not depend on where stages are cut
            # (the search's bound uses the same figure)
            out_bytes[placement.row_stage[i]] = (lc.output_bytes[:-1].max(initial=0.0) if last_stage
                                                 else lc.output_bytes[stage.last_layer])
    m = max(1, math.ceil(float(m_r.max()) - 1e-9))
    pp = len(placement.stages)
    p2p = np.zeros(pp)
    if pp > 1:
        for s, stage in enumerate(placement.stages):
            first_row = int(np.searchsorted(placement.row_stage, s))
            src = stage.replicas[0].devices[0]
            dst = placement.stages[(s + 1) % pp].replicas[0].devices[0]
            p2p[s] = p2p_time_s(cluster, src, dst, out_bytes[s]) / placement.cals[first_row].comm_scale
    return _Work(placement, global_batch, micro_batch, recompute, sequence_parallel, f, b, tpc, act, extra, cpc,
                 m_r, m, p2p, layer_f, layer_b, ep_comm_s=epc, merged_s=merged)


# ------------------------------------------------------------------------------------------ timing


@dataclass(frozen=True, eq=False)
class _Result:
    schedule: str
    vpp: int
    zero: int
    iteration_s: float
    pipeline_s: float
    stage_forward_s: np.ndarray  # per stage, one micro-batch slot (slowest replica group, load-scaled)
    stage_backward_s: np.ndarray
    stage_tp_s: np.ndarray
    stage_ep_s: np.ndarray
    stage_zero_s: np.ndarray  # what ZeRO-2/3's per-micro-batch collectives add to a slot
    stage_sync_s: np.ndarray
    stage_optimizer_s: np.ndarray
    critical_sync_s: float
    critical_optimizer_s: float
    row_forward_s: np.ndarray  # one of the row's own micro-batches, with ZeRO-2/3's collectives
    row_backward_s: np.ndarray
    memory_terms: tuple[np.ndarray, ...]  # (weights, gradients, states, activations, other) per row
    memory_total: np.ndarray
    feasible: bool
    stage_cp_s: np.ndarray  # the exposed context-parallel exchange of a slot
    ep_overlap: bool = False
    stage_merged_s: np.ndarray | None = None  # a slot's forward and backward as one merged step (ep_overlap)


def _per_stage_max(values: np.ndarray, row_stage: np.ndarray, pp: int) -> np.ndarray:
    out = np.full(pp, -np.inf)
    np.maximum.at(out, row_stage, values)
    return out


@lru_cache(maxsize=4096)
def _in_flight(pp: int, m: int, schedule: str, vpp: int, all_forwards_at_pp: bool, ep_overlap: bool = False
               ) -> np.ndarray:
    return np.array([micro_batches_in_flight(s, pp, m, schedule, vpp, all_forwards_at_pp, ep_overlap)
                     for s in range(pp)])


def _approximate_pipeline(f: np.ndarray, b: np.ndarray, m: int, vpp: int, p2p: np.ndarray, schedule: str,
                          merged: np.ndarray | None = None) -> float:
    """Fast estimate used to rank candidates: ``m`` periods of the slowest stage plus the others' fill and
    drain (exact for uniform stages without transfers) plus the transfers of one fill and drain. With
    ``merged`` (expert-parallel overlap) a period is the merged step, and one forward and backward run alone
    (exact for one stage: the first forward and the last backward)."""
    per = f + b if merged is None else merged
    alone = 0.0 if merged is None else float((f + b - merged).max())
    hops = float(p2p.sum() if schedule == "interleaved" else p2p[:-1].sum())
    fill = (per.sum() - per.max()) / (vpp if schedule == "interleaved" else 1)
    return float(m * per.max() + alone + fill + 2 * hops)


def _evaluate(work: _Work, schedule: str, vpp: int, zero: int, exact: bool,
              pipelines: dict | None = None, ep_overlap: bool = False) -> _Result:
    """Time and memory of ``work`` under one schedule and ZeRO stage, with or without expert-parallel overlap.
    ``pipelines`` memoises the pipeline part, which depends on the ZeRO stage only through ZeRO-2/3's
    per-micro-batch collectives."""
    pl = work.placement
    rt = pl.runtime
    pp, m = len(pl.stages), work.num_micro_batches
    sync = pl.syncs[zero]
    # what ZeRO-2's reduce-scatter and ZeRO-3's gathers and reduce-scatters add to every micro-batch
    if zero == 3:
        if "zero3" not in work.memo:
            work.memo["zero3"] = zero3_exposed_s(work.layer_forward_s, work.layer_backward_s, pl.zero3_gather_s,
                                                 pl.zero3_reduce_s, rt.zero3_prefetch_layers,
                                                 rt.overlaps_grad_reduce(3, pp > 1), sync.grad_once)
        extra_f, extra_b = work.memo["zero3"]
        f, b = work.forward_s + extra_f, work.backward_s + extra_b
    elif zero == 2:
        f, b = work.forward_s, work.backward_s + micro_batch_reduce_s(sync, work.backward_s)
    else:
        f, b = work.forward_s, work.backward_s
    load = work.row_micro_batches / m
    slot_f, slot_b = f * load, b * load
    if pl.single:
        pick = np.arange(pp)
    else:
        order = np.lexsort((-(slot_f + slot_b), pl.row_stage))
        pick = order[np.searchsorted(pl.row_stage[order], np.arange(pp))]
    stage_f, stage_b = slot_f[pick], slot_b[pick]
    stage_tp = (work.tp_comm_s * load)[pick]
    stage_cp = (work.cp_comm_s * load)[pick]
    stage_ep = (np.broadcast_to(work.ep_comm_s, load.shape) * load)[pick]
    stage_z3 = ((f - work.forward_s) + (b - work.backward_s))[pick] * load[pick]
    stage_merged = ratio = None
    if ep_overlap and work.merged_s is not None:
        # ZeRO-2/3's per-micro-batch collectives stay on the computation stream, outside the merged step's overlap
        stage_merged = (work.merged_s[pick] * load[pick]) + stage_z3
        ratio = merged_ratio(stage_merged, stage_f, stage_b)
    p2p = work.p2p_s
    # a stage whose units do not split into vpp equal chunks runs chunks of their own sizes (a layout)
    shares = _chunk_shares(pl, work, pick, vpp) if schedule == "interleaved" else None
    key = (id(work), schedule, vpp, zero if zero >= 2 else 0, exact, ep_overlap)
    pipeline = pipelines.get(key) if pipelines is not None else None
    if pipeline is None:
        if exact:
            pipeline, _ = pipeline_time(stage_f, stage_b, m, schedule, vpp, p2p, shares,
                                        rt.interleaved_all_forwards_at_pp, ratio)
        else:
            pipeline = _approximate_pipeline(stage_f, stage_b, m, vpp, p2p, schedule, stage_merged)
        if pipelines is not None:
            pipelines[key] = pipeline
    # each stage synchronises and steps once its own last backward is done (earlier stages drain later)
    # the gradient reduction overlaps the last micro-batch's backward, the weights' gather the next
    # iteration's first forward, as far as the runtime overlaps them at all. With vpp chunks the whole of
    # them: Megatron-Core's interleaved schedule launches each chunk's reduction as soon as that chunk's
    # last backward ends (grad_sync_func per chunk in the cooldown, param_sync_func per chunk in the warm-up:
    # megatron/core/pipeline_parallel/schedules.py), so the chunks' reductions follow one another
    sync_rows = sync_tail_s(sync, rt, work.backward_s, work.forward_s) + pl.tied_sync_s
    stage_sync = _per_stage_max(sync_rows, pl.row_stage, pp)
    stage_opt = _per_stage_max(pl.optimizer_s[zero], pl.row_stage, pp)
    # a stage's last operation is its first chunk's last backward
    last_backward = stage_b / vpp if shares is None else stage_b * np.array([row[0] for row in shares])
    drained = np.concatenate(([0.0], np.cumsum(last_backward + p2p)[:-1]))
    finish = pipeline - drained
    ends = finish + stage_sync + stage_opt
    crit = int(np.argmax(ends))
    critical_sync = critical_opt = 0.0
    iteration = pipeline
    if ends[crit] > pipeline:
        iteration = float(ends[crit])
        critical_sync = max(0.0, float(stage_sync[crit] - drained[crit]))
        critical_opt = iteration - pipeline - critical_sync
    # memory
    flight = np.minimum(_in_flight(pp, m, schedule, vpp, rt.interleaved_all_forwards_at_pp, ep_overlap)[pl.row_stage],
                        np.ceil(work.row_micro_batches - 1e-9))
    transient = work.transient_bytes
    if zero == 3 and not sync.grad_once:  # the layer gathered and the ones prefetched (deferred: held whole)
        transient = transient + (1.0 + rt.zero3_prefetch_layers) * pl.largest_layer_params * dtype_bytes(pl.dtype)
    if zero >= 2 and rt.grad_bucket_params <= 0:
        # a runtime that reduce-scatters layer by layer (FSDP) stages one layer's gradient twice as it
        # reduces it: autograd's unsharded gradient in the training dtype and the reduce-scatter input at the
        # reduction width (torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py, foreach_reduce, which
        # keeps that input alive until the next layer's reduction)
        transient = transient + pl.largest_layer_params * (dtype_bytes(pl.dtype) + gradient_reduce_bytes(pl.dtype, rt))
    terms = memory_terms(pl.params, work.activation_bytes, flight, zero, pl.row_dp, pl.optimizer, pl.dtype, transient,
                         pl.runtime, expert_params_per_rank=pl.expert_params, expert_dp=pl.row_expert_dp,
                         pipelined=pp > 1)
    total = sum(terms)
    return _Result(schedule, vpp, zero, iteration, float(pipeline), stage_f, stage_b, stage_tp, stage_ep, stage_z3,
                   stage_sync, stage_opt, critical_sync, critical_opt, f, b, terms, total,
                   bool(np.all(total <= pl.capacity)), stage_cp, ep_overlap and stage_merged is not None,
                   stage_merged)


def _rank_key(result: _Result, capacity: np.ndarray) -> tuple[int, float]:
    """Feasible first, fastest first; then the least memory relative to capacity."""
    if result.feasible:
        return 0, result.iteration_s
    return 1, float(np.max(result.memory_total / capacity))


# ------------------------------------------------------------------------------------------ results


def _to_estimate(work: _Work, result: _Result) -> Estimate:
    pl = work.placement
    m, pp = work.num_micro_batches, len(pl.stages)
    f, b = result.stage_forward_s, result.stage_backward_s
    c = int(np.argmax(f + b))
    busy = m * float(f[c] + b[c])
    # expert-parallel overlap hides what the merged steps save, counted as if every step were merged
    hidden = m * float(f[c] + b[c] - result.stage_merged_s[c]) if result.stage_merged_s is not None else 0.0
    ep_exposed = max(0.0, m * float(result.stage_ep_s[c]) - hidden)
    busy -= hidden
    bubble_all = max(0.0, result.pipeline_s - busy)
    hops = float(work.p2p_s.sum() if result.schedule == "interleaved" else work.p2p_s[:-1].sum())
    pp_comm = min(bubble_all, 2.0 * hops)
    breakdown = Breakdown(compute_s=busy - m * float(result.stage_tp_s[c] + result.stage_zero_s[c]
                                                     + result.stage_cp_s[c]) - ep_exposed,
                          tp_comm_s=m * float(result.stage_tp_s[c]), cp_comm_s=m * float(result.stage_cp_s[c]),
                          ep_comm_s=ep_exposed,
                          pp_comm_s=pp_comm,
                          dp_comm_s=m * float(result.stage_zero_s[c]) + result.critical_sync_s,
                          bubble_s=bubble_all - pp_comm, optimizer_s=result.critical_optimizer_s)
    memories = [MemoryBreakdown(*(float(t[i]) for t in result.memory_terms)) for i in range(len(pl.rows))]
    dp_bytes = dp_bytes_per_iteration(pl.syncs[result.zero], np.ceil(work.row_micro_batches - 1e-9))
    reason = ""
    stages_out: list[StageEstimate] = []
    for s, stage in enumerate(pl.stages):
        reps = []
        for i in np.flatnonzero(pl.row_stage == s):
            r, node, mem = pl.rows[i], pl.nodes[i], memories[i]
            capacity = float(pl.capacity[i])
            reps.append(ReplicaEstimate(
                device_type=node.device.name, devices=r.devices, tp=r.tp, dp=r.dp, batch_share=r.batch_share,
                num_micro_batches=float(work.row_micro_batches[i]), forward_s=float(result.row_forward_s[i]),
                backward_s=float(result.row_backward_s[i]), memory=mem, memory_capacity_bytes=capacity, cp=r.cp,
                ep=pl.experts[i][0], expert_tp=pl.experts[i][1]))
            if mem.total_bytes > capacity and not reason:
                reason = (f"stage {s} (layers {stage.first_layer}-{stage.last_layer}) on {node.device.name} needs "
                          f"{mem.total_bytes / GIB:.1f} GiB per device (weights {mem.weights_bytes / GIB:.1f}, "
                          f"gradients {mem.gradients_bytes / GIB:.1f}, optimizer {mem.optimizer_bytes / GIB:.1f}, "
                          f"activations {mem.activations_bytes / GIB:.1f}, other {mem.other_bytes / GIB:.1f}) "
                          f"but has {capacity / GIB:.1f} GiB")  # GiB, as every other memory figure printed
        top = max(reps, key=lambda x: x.memory.total_bytes / x.memory_capacity_bytes)
        stages_out.append(StageEstimate(
            index=s, first_layer=stage.first_layer, last_layer=stage.last_layer,
            device_type="+".join(dict.fromkeys(x.device_type for x in reps)),
            devices=tuple(d for x in reps for d in x.devices), tp=stage.replicas[0].tp, dp=pl.stage_replicas[s],
            forward_s=float(f[s]), backward_s=float(b[s]), memory=top.memory,
            memory_capacity_bytes=top.memory_capacity_bytes, replicas=tuple(reps),
            tp_comm_s=float(result.stage_tp_s[s]), p2p_s=float(work.p2p_s[s]),
            dp_sync_s=float(result.stage_sync_s[s]), optimizer_s=float(result.stage_optimizer_s[s]),
            dp_bytes=float(dp_bytes[pl.row_stage == s].max()), cp=stage.replicas[0].cp,
            cp_comm_s=float(result.stage_cp_s[s]), ep=reps[0].ep, expert_tp=reps[0].expert_tp,
            ep_comm_s=float(result.stage_ep_s[s]),
            merged_s=float(result.stage_merged_s[s]) if result.stage_merged_s is not None else 0.0))
    config = ParallelConfig(global_batch=work.global_batch, tp=pl.rows[0].tp, pp=pp, dp=pl.stage_replicas[0],
                            micro_batch=work.micro_batch, vpp=result.vpp, zero=result.zero,
                            recompute=work.recompute, sequence_parallel=work.sequence_parallel,
                            schedule=result.schedule, optimizer=pl.optimizer, dtype=base_dtype(pl.dtype),
                            runtime=pl.runtime.name, fp8_recipe=recipe_name(pl.dtype), cp=pl.rows[0].cp,
                            ep=pl.experts[0][0], expert_tp=pl.experts[0][1], ep_overlap=result.ep_overlap)
    notes = tuple(sorted({f"{cal_name}: no calibration of its own under the {pl.runtime.name} runtime; the "
                          "mean of the fitted (runtime, device) entries' efficiency parameters is used"
                          for cal_name, cal in ((n.device.name, c) for n, c in zip(pl.nodes, pl.cals))
                          if not cal.fitted}))
    if work.recompute == "selective" and pl.runtime.selective_recomputes_nothing:
        notes += (f"recompute=selective under {pl.runtime.name}'s FlashAttention: no attention scores are kept, "
                  "so there is nothing to recompute; time and memory are those of recompute=none",)
    if result.schedule == "interleaved" and pl.layout(result.vpp):
        runs = [(n, len(list(group))) for n, group in itertools.groupby(pl.stage_units)]
        counts = ", ".join(f"{n} x {k}" if k > 1 else str(n) for n, k in runs)
        notes += (f"vpp={result.vpp} on stages of {counts} pipeline units: each stage runs chunks of their own sizes "
                  "(planner.rules.layer_chunks), a pipeline layout (Megatron-Core --pipeline-model-parallel-layout, "
                  "torchtitan module_fqns_per_model_part)",)
    iteration = result.iteration_s
    return Estimate(config=config, iteration_time_s=iteration,
                    throughput_samples_per_s=work.global_batch / iteration if iteration > 0 else 0.0,
                    feasible=not reason, memory_per_device_bytes=float(np.max(result.memory_total)),
                    breakdown=breakdown, stages=tuple(stages_out), reason=reason, notes=notes)


def estimate_pipeline(model: LayerGraph, cluster: Cluster, spec: PipelineSpec,
                      calibration: Calibrations | None = None, exact: bool = True) -> Estimate:
    """Time and memory of an explicit pipeline (see the module docstring for heterogeneous replicas).
    Memory that does not fit gives ``feasible=False`` with a reason naming the stage, not an exception.
    ``exact=False`` replaces the pipeline simulation by the fast bottleneck formula (for screening many
    candidates; exact for uniform stages without transfers)."""
    _check_spec(model, cluster, spec)
    placement = _placement(model, cluster, spec.stages, spec.optimizer, spec.dtype, calibration,
                           get_runtime(spec.runtime), spec.ep, spec.expert_tp)
    work = _work(model, cluster, placement, spec.global_batch, spec.micro_batch, spec.recompute,
                 bool(spec.sequence_parallel))
    check_pipeline_micro_batches(len(spec.stages), work.num_micro_batches)
    if spec.schedule == "interleaved" and spec.vpp > 1 and work.num_micro_batches % len(spec.stages):
        raise ConfigError(f"the interleaved schedule needs the number of micro-batches "
                          f"({work.num_micro_batches}) to be a multiple of pp={len(spec.stages)}")
    if spec.ep_overlap:
        check_ep_overlap(True, spec.ep, len(spec.stages), spec.vpp, spec.recompute, spec.dtype, placement.runtime,
                         spec.schedule)
    return _to_estimate(work, _evaluate(work, spec.schedule, spec.vpp, spec.zero, exact, ep_overlap=spec.ep_overlap))


# --------------------------------------------------------------------------- estimate(ParallelConfig)


def balanced_split(model: LayerGraph, pp: int, vpp: int = 1, first_blocks: int | None = None,
                   last_blocks: int | None = None) -> list[tuple[int, int]]:
    """Megatron-LM's split: the transformer blocks evenly over ``pp`` stages (the first stages of an uneven
    split take one more), layers before the first block on stage 0, the rest with the block before them.
    With ``vpp`` > 1 the blocks are dealt out in whole ``vpp``-block chunks, so every stage holds a multiple
    of vpp (Megatron's pipeline layout where the chunks do not split evenly). ``first_blocks`` /
    ``last_blocks``: an uneven pipeline (:func:`planner.rules.stage_blocks`), whose stages need not hold whole
    chunks."""
    n = len(model.layers)
    blocks = [i for i, layer in enumerate(model.layers) if layer.kind == "block"] or list(range(n))
    per, extra = divmod(len(blocks) // vpp, pp)
    counts = [(per + (1 if s < extra else 0)) * vpp for s in range(pp)]
    if first_blocks is not None or last_blocks is not None:
        counts = stage_blocks(len(blocks), pp, vpp, first_blocks, last_blocks)
    bounds: list[tuple[int, int]] = []
    start_block = 0
    for s in range(pp):
        count = counts[s]
        last_block = blocks[start_block + count - 1]
        first = 0 if s == 0 else bounds[-1][1] + 1
        last = n - 1 if s == pp - 1 else last_block
        bounds.append((first, last))
        start_block += count
    return bounds


def _splits(units: int, pp: int, vpp: int, config: ParallelConfig) -> bool:
    """Whether the uneven split of ``config`` can run ``vpp`` chunks per stage (:func:`planner.rules.stage_blocks`)."""
    try:
        stage_blocks(units, pp, vpp, config.first_stage_layers, config.last_stage_layers)
    except ConfigError:
        return False
    return True


def _megatron_spec_stages(model: LayerGraph, cluster: Cluster, tp: int, pp: int, dp: int,
                          vpp: int = 1, cp: int = 1, ends: tuple[int | None, int | None] = (None, None)
                          ) -> tuple[StageSpec, ...]:
    """Devices in Megatron-LM's order (tp fastest, then cp, then dp, then pp); a stage whose replicas fall on
    several device types gets one replica group per type, each with its share of the batch."""
    stages = []
    width = tp * cp  # devices of one replica
    for s, (first, last) in enumerate(balanced_split(model, pp, vpp, *ends)):
        base = s * width * dp
        groups: dict[str, list[int]] = {}
        for k in range(dp):
            devices = list(range(base + k * width, base + (k + 1) * width))
            node = _device_location(cluster, devices[0])[0]
            groups.setdefault(node.name, []).extend(devices)
        replicas = tuple(ReplicaSpec(devices=tuple(devs), tp=tp, dp=len(devs) // width,
                                     batch_share=len(devs) / (width * dp), cp=cp)
                         for devs in groups.values())
        stages.append(StageSpec(first, last, replicas))
    return tuple(stages)


def _candidates(model: LayerGraph, config: ParallelConfig) -> dict[str, list]:
    """Every value of each free field that the rules (planner.rules) allow for this tp, pp, dp and runtime."""
    tp, pp, dp, g = config.tp, config.pp, config.dp, config.global_batch
    runtime = get_runtime(config.runtime)
    per_replica = g // dp
    mbs = [config.micro_batch] if config.micro_batch else micro_batch_choices(per_replica)
    # a pipeline is timed for at most MAX_PIPELINE_MICRO_BATCHES per replica: a free micro-batch skips smaller
    # ones, and where every choice leaves more the rule says so
    piped = [b for b in mbs if pp == 1 or per_replica // b <= MAX_PIPELINE_MICRO_BATCHES]
    if not piped:
        check_pipeline_micro_batches(pp, min(per_replica // b for b in mbs))
    mbs = piped
    units = pipeline_units(model)
    if config.vpp is not None:
        vpps = [config.vpp]
    elif pp == 1 or config.schedule in ("1f1b", "gpipe") or not runtime.interleaved:
        vpps = [1]
    else:
        # left free: 1F1B and every interleaving the search tries, whole vpp-layer chunks on every stage
        # (planner.rules.vpp_fits), split evenly where the runtime has no uneven pipeline
        vpps = [1] + [v for v in divisors(units) if v > 1 and vpp_fits(units, pp, v, runtime.interleaved_min_stages)
                      and (runtime.uneven_pipeline or even_split_fits(units, pp, v))]
        if config.first_stage_layers is not None or config.last_stage_layers is not None:
            vpps = [v for v in range(1, units + 1) if _splits(units, pp, v, config)]  # a layout's chunks
        if config.schedule == "interleaved":
            vpps = [v for v in vpps if v > 1]
            if not vpps:
                raise ConfigError(f"the interleaved schedule needs the {units} layers to split into whole chunks of "
                                  f"vpp > 1 layers, at least one on each of the pp={pp} stages, and none does; use "
                                  "--schedule 1f1b")
    zeros = [z for z in zero_stages(runtime, pp) if tp_zero_fits(tp, z, runtime)]
    shape = ModelShape.of(model)
    sp = (bool(config.sequence_parallel) if config.sequence_parallel is not None
          else tp > 1 and runtime.sequence_parallel)
    etps = [config.expert_tp] if config.expert_tp is not None else (expert_tp_values(shape, tp, runtime) or [0])
    experts = [(ep, etp) for etp in etps
               for ep in ([config.ep] if config.ep is not None else ep_values(shape, tp, dp, etp or tp, runtime,
                                                                              config.cp or 1))]
    return {
        # ep and expert_tp left out: every pair the rules allow (1 and none on a dense model)
        "experts": experts,
        "micro_batch": mbs,
        "recompute": [config.recompute] if config.recompute else list(recompute_choices(runtime)),
        # sequence parallelism is taken whenever tp > 1: its reduce-scatter plus all-gather move the bytes of
        # the all-reduce it replaces, and it divides the remaining activations and element-wise work by tp
        # (Korthikanti et al. 2022); pass sequence_parallel=False to estimate without it
        "sequence_parallel": [sp],
        "vpp": vpps,
        # ZeRO shards over data-parallel ranks: with dp = 1 every stage is the plan of the lowest
        "zero": [config.zero] if config.zero is not None else (list(zeros) if dp > 1 else [min(zeros)]),
    }


def _ep_overlaps(config: ParallelConfig, placement: _Placement, recompute: str, pp: int, vpp: int) -> list[bool]:
    """The expert-parallel overlap choices of one candidate: the pinned one, else every one the rules allow
    (planner.rules.ep_overlap_choices; a pipeline overlaps only interleaved)."""
    if config.ep_overlap is not None:
        choices = [config.ep_overlap]
    else:
        choices = list(ep_overlap_choices(placement.runtime, placement.experts[0][0], recompute, placement.dtype))
    return [c for c in choices if not c or ep_overlap_pipeline_fits(pp, vpp)]


def _schedule_for(config: ParallelConfig, vpp: int) -> str:
    if vpp > 1:
        return "interleaved"
    return config.schedule if config.schedule in ("1f1b", "gpipe") else "1f1b"


def _simpler_first(finalists: list[_Result], works: list[_Work]) -> int:
    """The finalist to return: the fastest feasible one, or a simpler one (lower ZeRO, less recompute:
    planner.rules.simplicity_key) within TIE_TOLERANCE of it, at an equal time the one without expert-parallel
    overlap (with one micro-batch it merges nothing); with none feasible, the least memory."""
    best = min(range(len(finalists)), key=lambda i: (_rank_key(finalists[i], works[i].placement.capacity), i))
    if not finalists[best].feasible:
        return best
    limit = finalists[best].iteration_s * (1.0 + TIE_TOLERANCE)
    near = [i for i, r in enumerate(finalists) if r.feasible and r.iteration_s <= limit]
    pp = len(works[best].placement.stages)
    return min(near, key=lambda i: (simplicity_key(finalists[i].zero, works[i].recompute, 1, pp),
                                    finalists[i].iteration_s, finalists[i].ep_overlap, i))


def estimate(model: LayerGraph, cluster: Cluster, config: ParallelConfig,
             calibration: Calibrations | None = None) -> Estimate:
    """Predict one configuration. The degrees left None (tp, pp, dp, cp) are 1; the runtime left None is
    resolved by ``planner.rules.resolve_runtime`` (the default, or the first runtime that runs the pinned
    choices, which a note then names). Other fields left None (micro_batch, recompute, sequence_parallel, vpp,
    zero, schedule) resolve to the fastest feasible choice (if none fits, the one needing the least memory,
    with ``feasible=False``); ``Estimate.config`` says what they resolved to. Within
    ``planner.rules.TIE_TOLERANCE`` of the fastest, the simpler choice (lower ZeRO, less recompute) wins.

    Candidates are ranked with a fast pipeline formula; the best few are then timed exactly (closed form or
    simulation) and the best of those returned.
    """
    devices = [g.node.device for g in cluster.groups]
    dtype = resolve_dtype(devices, config.dtype)
    config = replace(config.with_unit_degrees(), dtype=dtype,
                     fp8_recipe=resolve_fp8_recipe(devices, dtype, config.fp8_recipe))
    runtime, runtime_note = resolve_runtime(
        config.runtime, lambda name: check_config(model, cluster, replace(config, runtime=name)))
    config = replace(config, runtime=runtime)
    check_config(model, cluster, config)
    numerics = cost_dtype(config.dtype, config.fp8_recipe)  # the recipe rides on the cost model's dtype key
    tp, pp, dp = config.tp, config.pp, config.dp
    cp = 1 if config.cp is None else config.cp
    options = _candidates(model, config)
    # a pinned vpp whose chunks do not split evenly over the stages places its own layers
    placements: dict[tuple, tuple[_Placement, list[int]]] = {}
    ends = (config.first_stage_layers, config.last_stage_layers)
    for ep, etp in options["experts"]:
        for vpp in options["vpp"]:
            split = (tuple(balanced_split(model, pp, vpp, *ends)), ep, etp)
            if split not in placements:
                stages = _megatron_spec_stages(model, cluster, tp, pp, dp, vpp, cp, ends)
                placements[split] = (_placement(model, cluster, stages, config.optimizer, numerics, calibration,
                                                get_runtime(config.runtime), ep, etp), [])
            placements[split][1].append(vpp)
    ranked: list[tuple[tuple[int, float], int, _Work, str, int, int, bool]] = []
    approximate: dict = {}
    for placement, vpps in placements.values():
        for recompute in options["recompute"]:
            for sp in options["sequence_parallel"]:
                for mb in options["micro_batch"]:
                    work = _work(model, cluster, placement, config.global_batch, mb, recompute, sp)
                    any_fits = False
                    for vpp in vpps:
                        if vpp > 1 and work.num_micro_batches % pp:
                            continue
                        schedule = _schedule_for(config, vpp)
                        overlaps = _ep_overlaps(config, placement, recompute, pp, vpp)
                        for zero in options["zero"]:
                            for overlap in overlaps:
                                result = _evaluate(work, schedule, vpp, zero, False, approximate, overlap)
                                any_fits = any_fits or result.feasible
                                ranked.append((_rank_key(result, placement.capacity), len(ranked), work, schedule,
                                               vpp, zero, overlap))
                    if not any_fits and config.micro_batch is None:
                        break  # larger micro-batches only need more memory
    if not ranked:
        raise ConfigError(f"no schedule fits: the interleaved schedule needs the number of micro-batches to be "
                          f"a multiple of pp={pp}; use vpp 1 or another micro-batch")
    ranked.sort(key=lambda item: (item[0], item[1]))
    log.debug("estimate: %d candidates ranked, best %s", len(ranked), ranked[0][0])
    # time exactly the candidates within FINALIST_MARGIN of the best by the fast formula (at most three), and
    # the best of every other vpp within VPP_MARGIN: the fast formula counts the interleaved schedule's
    # transfers once, while each of its vpp chunks waits on them, so it can rank a large vpp first that the
    # exact timing rejects
    top = ranked[0][0]
    head = [item for item in ranked[:3] if item[0][0] == top[0] and item[0][1] <= top[1] * (1.0 + FINALIST_MARGIN)]
    seen_vpps = {item[4] for item in head}
    for item in ranked:
        if item[0][0] == top[0] and item[4] not in seen_vpps and item[0][1] <= top[1] * (1.0 + VPP_MARGIN):
            seen_vpps.add(item[4])
            head.append(item)
    # and the simpler choices (lower ZeRO, less recompute) of the best's shape that may tie with it
    if top[0] == 0:
        lead, taken = head[0], {item[1] for item in head}
        lead_key = simplicity_key(lead[5], lead[2].recompute, tp, pp)
        simpler: set[tuple] = set()  # the fastest of each simpler (ZeRO, recompute)
        for item in ranked:
            key = simplicity_key(item[5], item[2].recompute, tp, pp)
            if item[0][0] == 0 and item[0][1] <= top[1] * (1.0 + FINALIST_MARGIN) and item[1] not in taken \
                    and item[4] == lead[4] and key < lead_key and key not in simpler:
                simpler.add(key)
                head.append(item)
    pipelines: dict = {}  # the works stay alive in `ranked`, so their ids are stable keys
    finalists = [_evaluate(work, schedule, vpp, zero, True, pipelines, overlap)
                 for _, _, work, schedule, vpp, zero, overlap in head]
    works = [item[2] for item in head]
    best = _simpler_first(finalists, works)
    result = _to_estimate(works[best], finalists[best])
    return replace(result, notes=(runtime_note, *result.notes)) if runtime_note else result
