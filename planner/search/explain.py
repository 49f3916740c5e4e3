"""Why a plan is what it is: the bottleneck sentence (tables and other renderings live in ``planner.report``)."""

from __future__ import annotations

from typing import Any

from planner.types import BREAKDOWN_PARTS, Estimate
from planner.units import GIB, seconds


def bottleneck(estimate: Estimate, num_micro_batches: int, embedding_s: float = 0.0,
               joined_memory_bytes: float | None = None) -> str:
    """One sentence: which stage sets the pace, and which non-compute part costs most and why.
    ``embedding_s``: the sparse tables' time joined to the dense ``estimate`` (a DLRM's plan); shares are of
    the whole iteration, embeddings included. ``joined_memory_bytes``: the plan's peak per device with those
    tables placed, said beside the dense stage's."""
    if not estimate.stages:
        return ""
    per_mb = [s.forward_s + s.backward_s for s in estimate.stages]
    slow = max(range(len(per_mb)), key=lambda k: (per_mb[k], -k))
    stage = estimate.stages[slow]
    parts = estimate.breakdown.to_dict()
    parts["embedding_s"] = float(parts.get("embedding_s", 0.0) or 0.0) + embedding_s
    total = (estimate.iteration_time_s + embedding_s) or 1.0
    overhead = max((p for p in BREAKDOWN_PARTS if p[0] != "compute_s"),
                   key=lambda p: (parts.get(p[0], 0.0), p[0]))
    share = parts.get(overhead[0], 0.0) / total
    memory = max(estimate.stages, key=lambda s: s.memory.total_bytes / max(s.memory_capacity_bytes, 1.0))
    why = {
        "bubble_s": f"{len(per_mb)} stages fill and drain around {num_micro_batches} micro-batches",
        "tp_comm_s": f"tensor parallelism all-reduces activations inside tp={stage.tp} groups every layer",
        "dp_comm_s": "gradients are synchronised across data-parallel replicas after the last micro-batch",
        "pp_comm_s": "boundary activations cross between stages on the slower link",
        "optimizer_s": "the optimizer step reads and writes the optimizer states once per iteration",
        "embedding_s": "embedding lookups and their all-to-all run outside the dense pipeline",
        "cp_comm_s": f"passing K and V around the ring of cp={stage.cp} ranks takes longer than the attention "
                     "step each transfer overlaps",
        "ep_comm_s": _expert_traffic(stage.ep, stage.expert_tp),
    }.get(overhead[0], "")
    context = f", cp={stage.cp}" if stage.cp > 1 else ""
    # a stage served by several replica groups (mixed hardware): each group's own device type, tp and dp, as the
    # stage's own fields only sum them up
    where = (f"{stage.device_type}, tp={stage.tp}" if len(stage.replicas) <= 1 else
             " + ".join(f"{r.device_type} tp={r.tp} dp={r.dp}" for r in stage.replicas))
    sentence = (f"Stage {slow} (layers {stage.first_layer}-{stage.last_layer} on {where}{context}) is the slowest "
                f"at {seconds(per_mb[slow])} per micro-batch and sets the pipeline's pace")
    if share >= 0.005:
        sentence += f"; the largest overhead is {overhead[1]} ({share:.0%} of the iteration): {why}"
    elif share > 0.0:
        sentence += f"; compute is nearly all of it (the largest overhead, {overhead[1]}, is under 1%)"
    fill = memory.memory.total_bytes / max(memory.memory_capacity_bytes, 1.0)
    dense = (f"stage {memory.index} ({memory.memory.total_bytes / GIB:.1f} of "
             f"{memory.memory_capacity_bytes / GIB:.1f} GiB, {fill:.0%})")
    if joined_memory_bytes is None:
        return sentence + f"; memory is tightest on {dense}."
    return sentence + (f"; memory peaks at {joined_memory_bytes / GIB:.1f} GiB per device with the embedding "
                       f"tables placed (the dense part's tightest: {dense}).")


def _expert_traffic(ep: int, expert_tp: int) -> str:
    """What a MoE layer's expert communication is (planner.cost.moe): the all-to-alls over ``ep`` ranks, the
    gathers and reduce-scatters of the received tokens over ``expert_tp`` ranks, or both."""
    parts = []
    if ep > 1:
        parts.append(f"sends its tokens to their experts and back by all-to-all over ep={ep} ranks")
    if expert_tp > 1:
        parts.append(f"gathers the tokens over the expert_tp={expert_tp} ranks that split each expert and "
                     "reduce-scatters the outputs")
    return f"every MoE layer {' and '.join(parts)}, forward and backward" if parts else ""


def tie_note(chosen: Any, fastest: Any, tolerance: float) -> str:
    """The sentence saying the tie rule took ``chosen`` over the faster ``fastest`` (``engine.Candidate``s,
    which this module cannot import: the engine's users import it): what is simpler, by how little slower."""
    def described(cand: Any) -> dict[str, str]:
        tps = [o.tp for o in cand.layout.options] + [g.tp for g in cand.groups]
        return {"zero": f"ZeRO-{cand.settings.zero}", "recompute": f"recompute {cand.settings.recompute}",
                "tp": f"tp={max(tps)}", "pp": f"pp={cand.layout.num_stages}"}
    mine, theirs = described(chosen), described(fastest)
    changes = [f"{mine[k]} instead of {theirs[k]}" for k in mine if mine[k] != theirs[k]]
    what = ", ".join(changes) if changes else "a simpler plan"
    slower = chosen.time_s / fastest.time_s - 1.0
    return (f"{what[0].upper()}{what[1:]}: within {tolerance:.1%} of the fastest plan found ({slower:.2%} slower "
            f"than its {seconds(fastest.time_s)}), the simpler plan is taken (lower ZeRO stage, less recompute, "
            "smaller tp, then fewer stages).")
