"""Why a plan is what it is: the bottleneck sentence, and a readable table of the plan."""

from __future__ import annotations

from planner.plan import Plan
from planner.types import Estimate

GIB = 1024 ** 3
_PARTS = (("compute_s", "compute"), ("tp_comm_s", "tensor-parallel communication"),
          ("pp_comm_s", "pipeline send/receive"), ("dp_comm_s", "data-parallel gradient sync"),
          ("bubble_s", "pipeline bubble"), ("optimizer_s", "optimizer step"), ("embedding_s", "embeddings"))


def bottleneck(estimate: Estimate, num_micro_batches: int) -> str:
    """One sentence: which stage sets the pace, and which non-compute part costs most and why."""
    if not estimate.stages:
        return ""
    per_mb = [s.forward_s + s.backward_s for s in estimate.stages]
    slow = max(range(len(per_mb)), key=lambda k: (per_mb[k], -k))
    stage = estimate.stages[slow]
    total = estimate.iteration_time_s or 1.0
    parts = estimate.breakdown.to_dict()
    overhead = max((p for p in _PARTS if p[0] != "compute_s"), key=lambda p: (parts.get(p[0], 0.0), p[0]))
    share = parts.get(overhead[0], 0.0) / total
    memory = max(estimate.stages, key=lambda s: s.memory.total_bytes / max(s.memory_capacity_bytes, 1.0))
    why = {
        "bubble_s": f"{len(per_mb)} stages fill and drain around {num_micro_batches} micro-batches",
        "tp_comm_s": f"tensor parallelism all-reduces activations inside tp={stage.tp} groups every layer",
        "dp_comm_s": "gradients are synchronised across data-parallel replicas after the last micro-batch",
        "pp_comm_s": "boundary activations cross between stages on the slower link",
        "optimizer_s": "the optimizer step reads and writes the optimizer states once per iteration",
        "embedding_s": "embedding lookups and their all-to-all run outside the dense pipeline",
    }.get(overhead[0], "")
    sentence = (f"Stage {slow} (layers {stage.first_layer}-{stage.last_layer} on {stage.device_type}, "
                f"tp={stage.tp}) is the slowest at {per_mb[slow] * 1e3:.1f} ms per micro-batch and sets the "
                f"pipeline's pace")
    if share > 0.0:
        sentence += f"; the largest overhead is {overhead[1]} ({share:.0%} of the iteration): {why}"
    fill = memory.memory.total_bytes / max(memory.memory_capacity_bytes, 1.0)
    sentence += (f"; memory is tightest on stage {memory.index} ({memory.memory.total_bytes / GIB:.1f} of "
                 f"{memory.memory_capacity_bytes / GIB:.1f} GiB, {fill:.0%}).")
    return sentence


def device_ranges(devices: tuple[int, ...]) -> str:
    """``(0, 1, 2, 5)`` -> ``"0-2,5"``."""
    out: list[str] = []
    ids = sorted(devices)
    start = prev = ids[0] if ids else 0
    for d in ids[1:] + [None]:  # type: ignore[operator]
        if d is not None and d == prev + 1:
            prev = d
            continue
        out.append(f"{start}" if start == prev else f"{start}-{prev}")
        if d is not None:
            start = prev = d
    return ",".join(out)


def render_table(plan: Plan, capacity_bytes: dict[str, float] | None = None) -> str:
    """The plan as a fixed-width text table with its breakdown, bottleneck and search summary."""
    lines = [
        f"Plan: {plan.model.get('name', 'model')} on {plan.cluster.get('name') or 'cluster'} "
        f"({plan.cluster.get('num_devices', '?')} devices), global batch {plan.global_batch}",
        f"  iteration {plan.iteration_time_s:.4g} s, {plan.throughput_samples_per_s:.4g} samples/s; "
        f"micro-batch {plan.micro_batch} x {plan.num_micro_batches}, schedule {plan.schedule}, ZeRO-{plan.zero}, "
        f"sequence parallel {'on' if plan.sequence_parallel else 'off'}",
        "",
    ]
    header = ("stage", "layers", "device", "devices", "tp", "dp", "recompute", "memory/device", "time/micro-batch")
    rows = [header]
    for s in plan.stages:
        cap = (capacity_bytes or {}).get(s.device_type)
        mem = f"{s.memory_bytes_per_device / GIB:.1f} GiB" + (f" / {cap / GIB:.0f}" if cap else "")
        rows.append((str(s.index), f"{s.first_layer}-{s.last_layer} ({s.last_layer - s.first_layer + 1})",
                     s.device_type, device_ranges(s.devices), str(s.tp), str(s.dp), s.recompute, mem,
                     f"{s.time_s * 1e3:.2f} ms"))
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    for r in rows:
        lines.append("  " + "  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip())
    total = plan.iteration_time_s or 1.0
    parts = [f"{label} {plan.breakdown.get(key, 0.0):.3g} s ({plan.breakdown.get(key, 0.0) / total:.0%})"
             for key, label in _PARTS if plan.breakdown.get(key, 0.0) > 0]
    lines += ["", "time: " + ", ".join(parts)]
    if plan.bottleneck:
        lines.append("bottleneck: " + plan.bottleneck)
    info = plan.search
    status = "proven optimal under the cost model" if info.proven_optimal else "best found (not proven optimal)"
    lines.append(f"search: {status}; lower bound {info.lower_bound_s:.4g} s, physical bound "
                 f"{plan.physical_bound_s:.4g} s; {info.candidates_evaluated} candidates in {info.time_s:.2f} s "
                 f"({info.algorithm})")
    return "\n".join(lines)
