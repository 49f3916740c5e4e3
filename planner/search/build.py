"""From a timed plan (PipelineSpec + the cost model's Estimate) to the user-facing Plan."""

from __future__ import annotations

from dataclasses import replace

from planner.hardware.cluster import locate
from planner.hardware.efficiency import peak_flops_per_s
from planner.hardware.fp8 import base_dtype, recipe_name
from planner.plans import Plan, ReplicaPlan, SearchInfo, StagePlan, cluster_summary, moe_summary, \
    shape_summary
from planner.types import Cluster, Estimate, LayerGraph, PipelineSpec


def physical_bound_s(model: LayerGraph, cluster: Cluster, spec: PipelineSpec) -> float:
    """Training FLOPs of one iteration (forward + backward = 3x forward) over the summed peak FLOP/s of the
    devices the plan uses."""
    peak = 0.0
    for stage in spec.stages:
        for replica in stage.replicas:
            for device in replica.devices:
                profile = cluster.groups[locate(cluster, device)[0]].node.device
                peak += peak_flops_per_s(profile, spec.dtype)
    return 3.0 * model.flops_forward * spec.global_batch / peak if peak else 0.0


def to_plan(model: LayerGraph, cluster: Cluster, spec: PipelineSpec, estimate: Estimate, search: SearchInfo,
            bottleneck: str) -> Plan:
    stages = []
    for k, (stage, est) in enumerate(zip(spec.stages, estimate.stages)):
        replica = stage.replicas[0]
        groups = tuple(ReplicaPlan(device_type=r.device_type, devices=r.devices, tp=r.tp, dp=r.dp,
                                   batch_share=r.batch_share, memory_bytes_per_device=float(r.memory.total_bytes),
                                   time_s=float(r.forward_s + r.backward_s), cp=r.cp, ep=r.ep,
                                   expert_tp=r.expert_tp)
                       for r in est.replicas) if len(stage.replicas) > 1 else ()
        stages.append(StagePlan(
            index=k, first_layer=stage.first_layer, last_layer=stage.last_layer,
            layer_names=tuple(layer.name for layer in model.layers[stage.first_layer:stage.last_layer + 1]),
            layer_kinds=tuple(layer.kind for layer in model.layers[stage.first_layer:stage.last_layer + 1]),
            device_type=est.device_type, devices=tuple(d for r in stage.replicas for d in r.devices), tp=replica.tp,
            dp=sum(r.dp for r in stage.replicas), recompute=spec.recompute,
            memory_bytes_per_device=float(est.memory.total_bytes), time_s=float(est.forward_s + est.backward_s),
            replicas=groups, cp=replica.cp, ep=est.ep, expert_tp=est.expert_tp))
    # micro-batches per data-parallel replica (on average over a heterogeneous stage's replica groups)
    m = spec.batching.num_micro_batches
    return Plan(
        model={"name": model.name, "params": model.params, "flops_per_sample": model.flops_forward,
               "layers": len(model.layers), **moe_summary(model), **shape_summary(model)},
        cluster=cluster_summary(cluster), global_batch=spec.global_batch, micro_batch=spec.micro_batch,
        num_micro_batches=m, schedule=spec.schedule, zero=spec.zero,
        iteration_time_s=float(estimate.iteration_time_s),
        throughput_samples_per_s=float(estimate.throughput_samples_per_s), stages=tuple(stages),
        breakdown={k: float(v) for k, v in estimate.breakdown.to_dict().items()}, search=search,
        vpp=spec.vpp, sequence_parallel=spec.sequence_parallel, optimizer=spec.optimizer,
        dtype=base_dtype(spec.dtype), fp8_recipe=recipe_name(spec.dtype), runtime=spec.runtime,
        memory_per_device_bytes=float(estimate.memory_per_device_bytes), bottleneck=bottleneck,
        physical_bound_s=physical_bound_s(model, cluster, spec), ep_overlap=spec.ep_overlap)


def relabelled(spec: PipelineSpec, estimate: Estimate, ids: tuple[int, ...]) -> tuple[PipelineSpec, Estimate]:
    """A plan's spec and estimate with every device id ``d`` replaced by ``ids[d]`` (the search's arranged
    cluster back to the listed one, :func:`planner.hardware.cluster.arranged`)."""
    def mapped(devices: tuple[int, ...]) -> tuple[int, ...]:
        return tuple(ids[d] for d in devices)

    stages = tuple(replace(stage, replicas=tuple(replace(r, devices=mapped(r.devices)) for r in stage.replicas))
                   for stage in spec.stages)
    timed = tuple(replace(stage, devices=mapped(stage.devices),
                          replicas=tuple(replace(r, devices=mapped(r.devices)) for r in stage.replicas))
                  for stage in estimate.stages)
    return replace(spec, stages=stages), replace(estimate, stages=timed)
