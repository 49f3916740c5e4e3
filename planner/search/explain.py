"""Why a plan is what it is: the bottleneck sentence (tables and other renderings live in ``planner.report``)."""

from __future__ import annotations

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
