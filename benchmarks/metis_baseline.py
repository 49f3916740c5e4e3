"""A Metis-style baseline planner for mixed GPU clusters (after the idea of Um et al., "Metis: Fast
Automatic Distributed Training on Heterogeneous GPUs", ATC 2024; our own simplified code).

What it does, as Metis does it: enumerate orderings of the device types along the pipeline and, for each,
data-parallel degree and tensor-parallel degree per type; every device of every type is used (each type
contributes devices / (tp x dp) stages); layers are split across stages in proportion to each stage's
compute capacity (peak FLOP/s x tp), a load balancer by speed rather than by the cost model; micro-batch,
ZeRO-1 and recompute are enumerated. Every candidate is timed by our cost model (``estimate_pipeline``) and
the fastest feasible one is returned. Unlike ``planner plan`` it does not optimise the layer split against
the cost model, never leaves a slow type idle, and proves nothing.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

from planner.cost import estimate_pipeline
from planner.types import Cluster, Estimate, LayerGraph, PipelineSpec, ReplicaSpec, StageSpec


@dataclass(frozen=True)
class Baseline:
    estimate: Estimate | None
    spec: PipelineSpec | None
    candidates: int


def _powers_of_two(limit: int) -> list[int]:
    out, v = [], 1
    while v <= limit:
        out.append(v)
        v *= 2
    return out


def proportional_split(num_layers: int, weights: list[float]) -> list[int] | None:
    """Layers per stage proportional to ``weights`` (largest remainder), at least one each."""
    P = len(weights)
    if P > num_layers:
        return None
    spare = num_layers - P
    total = sum(weights)
    raw = [spare * w / total for w in weights]
    counts = [1 + math.floor(r) for r in raw]
    order = sorted(range(P), key=lambda k: (-(raw[k] - math.floor(raw[k])), k))
    for k in order[:num_layers - sum(counts)]:
        counts[k] += 1
    return counts


def metis_plan(model: LayerGraph, cluster: Cluster, global_batch: int, micro_batches=(1, 2, 4),
               recomputes=("selective", "full")) -> Baseline:
    L = len(model.layers)
    best: tuple[float, Estimate, PipelineSpec] | None = None
    tried = 0
    pools = list(range(len(cluster.groups)))
    for order in itertools.permutations(pools):
        for dp in [d for d in range(1, global_batch + 1) if global_batch % d == 0]:
            choices = [[t for t in _powers_of_two(cluster.groups[g].node.devices_per_node)
                        if cluster.groups[g].num_devices % (t * dp) == 0] for g in order]
            if any(not c for c in choices):
                continue
            for tps in itertools.product(*choices):
                stages, weights, devices_of = [], [], []
                for g, tp in zip(order, tps):
                    group = cluster.groups[g]
                    peak = group.node.device.peak_flops_per_s.get("bf16", max(group.node.device.peak_flops_per_s.values()))
                    for s in range(group.num_devices // (tp * dp)):
                        first = group.first_device + s * tp * dp
                        devices_of.append((tuple(range(first, first + tp * dp)), tp))
                        weights.append(peak * tp)
                counts = proportional_split(L, weights)
                if counts is None:
                    continue
                first = 0
                for (devices, tp), n in zip(devices_of, counts):
                    stages.append(StageSpec(first, first + n - 1, (ReplicaSpec(devices=devices, tp=tp, dp=dp),)))
                    first += n
                for mb in micro_batches:
                    if global_batch % (mb * dp):
                        continue
                    for rc in recomputes:
                        spec = PipelineSpec(stages=tuple(stages), global_batch=global_batch, micro_batch=mb, zero=1,
                                            recompute=rc, sequence_parallel=any(tp > 1 for tp in tps))
                        est = estimate_pipeline(model, cluster, spec)
                        tried += 1
                        if est.feasible and (best is None or est.iteration_time_s < best[0]):
                            best = (est.iteration_time_s, est, spec)
    if best is None:
        return Baseline(None, None, tried)
    return Baseline(best[1], best[2], tried)
