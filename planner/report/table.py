"""A Plan as a plain-text report: summary, one row per stage (and per replica group), the time breakdown,
the bottleneck, the embedding placement and what the search proved."""

from __future__ import annotations

from planner.plans import Plan, StagePlan
from planner.units import id_ranges, seconds, size
from planner.types import BREAKDOWN_PARTS


def _grid(header: list[str], rows: list[list[str]]) -> list[str]:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    return ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in [header, *rows]]


def _stage_rows(stage: StagePlan, plan: Plan) -> list[list[str]]:
    layers = f"{stage.first_layer}-{stage.last_layer} ({stage.last_layer - stage.first_layer + 1})"
    if len(stage.replicas) <= 1:
        return [[str(stage.index), layers, stage.device_type, id_ranges(stage.devices), str(stage.tp), str(stage.dp),
                 stage.recompute, size(stage.memory_bytes_per_device), seconds(stage.time_s)]]
    # each replica group's own degrees and memory are on its row below (the stage's fields only sum them up)
    rows = [[str(stage.index), layers, "mixed", id_ranges(stage.devices), "", "", stage.recompute, "",
             seconds(stage.time_s)]]
    for replica in stage.replicas:
        per_replica = plan.batching.replica_micro_batches(replica.batch_share, replica.dp)
        rows.append(["", f"  {replica.batch_share:.0%} of batch, {per_replica:g} mb each", replica.device_type,
                     id_ranges(replica.devices),
                     str(replica.tp), str(replica.dp), "", size(replica.memory_bytes_per_device),
                     seconds(replica.time_s)])
    return rows


def replica_groups(stage: StagePlan) -> str:
    """A stage's devices in a few words: ``DEVICE tpT`` for a stage on one replica group; for a stage served by
    several (mixed hardware), each group's own device type, tp and dp, ``DEVICE tpT dpD + ...``, as the table's
    replica-group rows give them (the stage's own fields only sum them up: device types joined by '+', the
    first group's tp, the groups' dp added)."""
    if len(stage.replicas) <= 1:
        return f"{stage.device_type} tp{stage.tp}"
    return " + ".join(f"{group.device_type} tp{group.tp} dp{group.dp}" for group in stage.replicas)


def _experts(plan: Plan) -> list[str]:
    """The mixture-of-experts line: routed experts, top-k, and the expert-parallel degrees (none if dense)."""
    if not plan.model.get("experts"):
        return []
    first = plan.stages[0]
    overlap = "; all-to-alls under another micro-batch's computation (ep overlap)" if plan.ep_overlap else ""
    return [f"  experts {plan.model['experts']} routed, top-{plan.model.get('top_k', '?')}: ep {first.ep}, expert tp "
            f"{first.expert_tp}, expert dp {first.tp * first.dp // (first.ep * first.expert_tp)}{overlap}"]


def render_table(plan: Plan) -> str:
    model = plan.model.get("name", "model")
    peak_bytes = max([plan.memory_per_device_bytes] + [s.memory_bytes_per_device for s in plan.stages])
    replicas = plan.batching.dp
    cluster = plan.cluster.get("name", "cluster")
    # a stage with replica groups on several device types gives each group its own micro-batch count
    mixed = " (on average: see the replica groups)" if any(len(s.replicas) > 1 for s in plan.stages) else ""
    lines = [
        f"Plan for {model} on {cluster} ({plan.num_devices} of {plan.cluster.get('num_devices', '?')} devices)",
        f"  global batch {plan.global_batch} = micro-batch {plan.micro_batch} x {plan.num_micro_batches} "
        f"micro-batches x {replicas:g} replicas{mixed}; schedule {plan.schedule}, vpp {plan.vpp}, ZeRO-{plan.zero}, "
        f"{plan.dtype}{f' ({plan.fp8_recipe} scaling)' if plan.fp8_recipe else ''}, "
        f"sequence parallel {'on' if plan.sequence_parallel else 'off'}",
        f"  runtime {plan.runtime}{_sharding(plan)}",
        *_experts(plan),
        f"  iteration {seconds(plan.iteration_time_s)}, {plan.throughput_samples_per_s:.4g} samples/s, "
        f"peak memory {size(peak_bytes)} per device",
        "",
    ]
    header = ["stage", "layers", "device", "devices", "tp", "dp", "recompute", "memory/device", "time/micro-batch"]
    rows = [row for stage in plan.stages for row in _stage_rows(stage, plan)]
    context = any(group.cp > 1 for stage in plan.stages for group in (stage, *stage.replicas))
    if context:  # a cp column where the plan splits sequences (tp x cp x dp devices per stage)
        header.insert(5, "cp")
        cps = [str(group.cp) for stage in plan.stages
               for group in ((stage,) if len(stage.replicas) <= 1 else (stage, *stage.replicas))]
        rows = [[*row[:5], cp if row[4] else "", *row[5:]] for row, cp in zip(rows, cps)]
    lines += _grid(header, rows)
    total = sum(plan.breakdown.get(key, 0.0) for key, _ in BREAKDOWN_PARTS)
    # under expert-parallel overlap the part is what the merged steps leave exposed
    parts = [(key, f"{label} (exposed)" if key == "ep_comm_s" and plan.ep_overlap else label)
             for key, label in BREAKDOWN_PARTS]
    width = max(len(label) for _, label in parts)
    lines += ["", "Time per iteration:"]
    for key, label in parts:
        value = plan.breakdown.get(key, 0.0)
        if key == "cp_comm_s" and not context:
            continue
        if key == "ep_comm_s" and not value and not plan.model.get("experts"):
            continue  # a dense model has no experts to dispatch to
        share = f"{value / total:6.1%}" if total > 0 else "     -"
        lines.append(f"  {label:<{width}} {seconds(value):>11}  {share}")
    if plan.bottleneck:
        lines += ["", f"Bottleneck: {plan.bottleneck}"]
    if plan.embeddings:
        lines += ["", "Embedding tables:"]
        rows = []
        for placement in plan.embeddings:
            devices = id_ranges(s.device for s in placement.shards)
            memory = "/".join(sorted({s.memory for s in placement.shards}))
            rows.append([placement.table, placement.sharding, str(len(placement.shards)), devices, memory])
        lines += ["  " + line for line in _grid(["table", "sharding", "shards", "devices", "memory"], rows)]
    lines += ["", _search_line(plan)]
    return "\n".join(lines) + "\n"


# how FSDP2 (torch.distributed.fsdp.fully_shard) runs each ZeRO stage of a plan, as torchtitan applies it
# (torchtitan/models/llama3/infra/parallelize.py: fully_shard on every decoder layer, ZeRO-0 over a replicate x
# shard mesh whose shard dimension is 1)
_FSDP2_SHARDING = {
    0: "fully_shard over a shard group of one rank (torchtitan's data_parallel_replicate_degree = dp): "
       "parameters, gradients and optimizer states replicated, gradients all-reduced",
    2: "fully_shard(reshard_after_forward=False): gradients and optimizer states sharded, parameters kept "
       "gathered from forward to backward",
    3: "fully_shard(reshard_after_forward=True): parameters, gradients and optimizer states sharded, "
       "parameters gathered per layer",
}


def _sharding(plan: Plan) -> str:
    """What the runtime's sharding is called, where the runtime names it (FSDP2)."""
    if plan.runtime == "pytorch-fsdp2" and plan.zero in _FSDP2_SHARDING:
        return f"; {_FSDP2_SHARDING[plan.zero]}"
    return ""


def _search_line(plan: Plan) -> str:
    info = plan.search
    parts = [f"Search: {info.candidates_evaluated} candidates in {seconds(info.time_s)}"
             + (f" ({info.algorithm})" if info.algorithm else "")]
    if info.proven_optimal:
        parts.append("proven optimal under the cost model")
    elif info.lower_bound_s > 0 and plan.iteration_time_s > 0:
        gap = plan.iteration_time_s / info.lower_bound_s - 1.0
        parts.append(f"not proven optimal, within {gap * 100:.2g}% of the lower bound")  # 2 digits: 23%, 0.43%
    else:
        parts.append("not proven optimal")
    if info.lower_bound_s > 0:
        parts.append(f"lower bound {seconds(info.lower_bound_s)}")
    if info.embedding_lower_bound_s is not None:
        parts.append(f"embedding lower bound {seconds(info.embedding_lower_bound_s)}")
    if info.vpp_searched:  # the space the bound covers
        parts.append(f"space: vpp {', '.join(map(str, info.vpp_searched))}"
                     + ("; every stage its own layer count" if info.uneven_stages_searched else ""))
    if plan.physical_bound_s > 0:
        parts.append(f"physical bound {seconds(plan.physical_bound_s)} (all FLOPs at peak on the devices used; "
                     f"the plan takes {plan.iteration_time_s / plan.physical_bound_s:.2f}x it)")
    return "; ".join(parts)
