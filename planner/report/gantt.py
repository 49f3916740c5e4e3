"""Pictures of one plan: the pipeline schedule (a Gantt chart from the event simulator, one row per stage,
forward, backward and point-to-point sends coloured) and memory per device by kind (stacked bars per stage).

``write_plan_gantt`` draws both for a Plan in ONE file, schedule on top and memory below, so that
``planner plan --gantt FILE`` writes exactly the file the user named.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol, Sequence

from planner.errors import ConfigError
from planner.plans import Plan, pipeline_spec
from planner.report._figure import check_path, pyplot, save
from planner.runtime import get_runtime
from planner.units import GIB
from planner.types import Cluster, LayerGraph, MemoryBreakdown, PipelineSpec, StageEstimate

KIND_COLOURS = {"forward": "tab:blue", "backward": "tab:orange", "send": "tab:grey"}
MEMORY_KINDS = (("weights_bytes", "weights", "tab:blue"), ("gradients_bytes", "gradients", "tab:orange"),
                ("optimizer_bytes", "optimizer states", "tab:green"),
                ("activations_bytes", "activations", "tab:red"), ("other_bytes", "other", "tab:grey"))
MAX_LABELLED_EVENTS = 160  # write micro-batch numbers on the bars up to this many events
SCHEDULE_SIZE_IN = (10.0, 0.5)  # width, height per stage row (plus a fixed margin)
MEMORY_SIZE_IN = (10.0, 3.5)


class Event(Protocol):
    """What the chart reads of ``planner.cost.PipelineEvent``."""

    stage: int
    micro_batch: int
    kind: str  # "forward" | "backward" | "send"
    start_s: float
    end_s: float
    # optional ``chunk`` (interleaved schedule's model chunk), read with getattr


def schedule_height_in(num_stages: int) -> float:
    return 1.4 + SCHEDULE_SIZE_IN[1] * num_stages


def draw_schedule(ax: Any, events: Sequence[Event], stage_labels: Sequence[str] | None) -> None:
    """The pipeline schedule on ``ax``: one row per stage (stage 0 on top), forward, backward and sends coloured."""
    if not events:
        raise ConfigError("--gantt: the schedule has no events to draw")
    stages = max(e.stage for e in events) + 1
    labels = list(stage_labels) if stage_labels is not None else [f"stage {i}" for i in range(stages)]
    if len(labels) < stages:
        raise ValueError(f"{len(labels)} stage labels for {stages} stages")
    unknown = sorted({e.kind for e in events} - set(KIND_COLOURS))
    if unknown:
        raise ValueError(f"unknown pipeline event kinds {unknown}")
    few = len(events) <= MAX_LABELLED_EVENTS
    chunks = sorted({getattr(e, "chunk", 0) for e in events})
    end_s = max(e.end_s for e in events)
    unit, scale = next((u, f) for u, f in (("s", 1.0), ("ms", 1e3), ("us", 1e6)) if end_s * f >= 1.0 or u == "us")
    for kind, colour in KIND_COLOURS.items():
        # sends sit in the lower part of the sender's row, compute fills the rest
        height, offset = (0.2, 0.35) if kind == "send" else (0.6, -0.35)
        for stage in range(stages):
            for chunk in chunks:  # interleaved schedule: later model chunks drawn lighter
                bars = [(e.start_s * scale, (e.end_s - e.start_s) * scale) for e in events
                        if e.kind == kind and e.stage == stage and getattr(e, "chunk", 0) == chunk]
                if bars:
                    ax.broken_barh(bars, (stage + offset, height), facecolors=colour,
                                   alpha=1.0 - 0.5 * chunk / max(len(chunks) - 1, 1),
                                   edgecolor="white" if few else "none", linewidth=0.5 if few else 0.0)
    if few:
        for e in events:
            if e.kind != "send":
                ax.text((e.start_s + e.end_s) / 2 * scale, e.stage - 0.05, str(e.micro_batch), ha="center",
                        va="center", fontsize="xx-small", color="white")
    ax.set_yticks(range(stages), labels[:stages])
    ax.set_ylim(stages - 0.4, -0.6)  # stage 0 on top
    ax.set_xlim(0, end_s * scale)
    ax.set_xlabel(f"time ({unit})")
    note = "numbers: micro-batch" if few else f"{len(events)} operations"
    if len(chunks) > 1:
        note += f"; {len(chunks)} model chunks per stage, later ones lighter"
    ax.set_title(f"Pipeline schedule ({note})", loc="left")
    ax.grid(True, axis="x", alpha=0.3)
    from matplotlib.patches import Patch  # noqa: PLC0415 - matplotlib is loaded by now

    ax.legend(handles=[Patch(color=c, label=k) for k, c in KIND_COLOURS.items()], loc="upper left",
              bbox_to_anchor=(1.01, 1.0), fontsize="x-small")


def draw_memory(ax: Any, stages_memory: Sequence[tuple[str, MemoryBreakdown]],
                capacities_bytes: Sequence[float] | None) -> None:
    """Stacked bars on ``ax`` of one device's memory per stage (label, MemoryBreakdown), capacity marked."""
    if not stages_memory:
        raise ConfigError("--gantt: no stage memory to draw")
    positions = range(len(stages_memory))
    bottom = [0.0] * len(stages_memory)
    for attr, name, colour in MEMORY_KINDS:
        heights = [getattr(memory, attr) / GIB for _, memory in stages_memory]
        ax.bar(positions, heights, bottom=bottom, color=colour, label=name, width=0.6)
        bottom = [b + h for b, h in zip(bottom, heights)]
    if capacities_bytes is not None:
        ax.scatter(positions, [c / GIB for c in capacities_bytes], marker="_", s=900, color="black",
                   label="capacity", zorder=3)
    ax.set_xticks(positions, [label for label, _ in stages_memory], fontsize="small")
    ax.set_ylabel("GiB per device")
    ax.set_title("Memory per device by kind")
    ax.grid(True, axis="y", alpha=0.3)
    ax.legend(fontsize="x-small", loc="upper left", bbox_to_anchor=(1.01, 1.0), markerscale=0.3)


# ------------------------------------------------------------------------------------------- a Plan


def plan_pipeline_specs(plan: Plan) -> dict[str, PipelineSpec]:
    """The PipelineSpec a Plan was estimated with, one per recompute mode its stages use (a PipelineSpec has
    one mode; the cost model times and sizes each stage from its own layers, so stage ``s`` is read from the
    spec of its own mode): :func:`planner.plans.pipeline_spec` for each."""
    return {mode: pipeline_spec(plan, mode) for mode in sorted({s.recompute for s in plan.stages})}


def plan_stage_estimates(plan: Plan, model: LayerGraph, cluster: Cluster) -> tuple[StageEstimate, ...]:
    """Each pipeline stage of ``plan`` as the cost model sees it (times per micro-batch, memory by kind)."""
    from planner.cost import estimate_pipeline  # noqa: PLC0415

    specs = plan_pipeline_specs(plan)
    estimates = {mode: estimate_pipeline(model, cluster, spec) for mode, spec in specs.items()}
    modes = [s.recompute for s in plan.stages][:len(next(iter(specs.values())).stages)]
    return tuple(estimates[mode].stages[i] for i, mode in enumerate(modes))


def _stage_label(stage: StageEstimate) -> str:
    return (f"{stage.index}: {stage.device_type} tp{stage.tp} dp{stage.dp}\n"
            f"layers {stage.first_layer}-{stage.last_layer}")


def _memory_bars(stages: Sequence[StageEstimate]) -> tuple[list[tuple[str, MemoryBreakdown]], list[float]]:
    """One bar per stage, or per replica group of a stage on mixed hardware."""
    bars: list[tuple[str, MemoryBreakdown]] = []
    capacities: list[float] = []
    for stage in stages:
        groups = stage.replicas if len(stage.replicas) > 1 else ()
        for r in groups:
            bars.append((f"stage {stage.index}\n{r.device_type}", r.memory))
            capacities.append(r.memory_capacity_bytes)
        if not groups:
            bars.append((f"stage {stage.index}\n{stage.device_type}", stage.memory))
            capacities.append(stage.memory_capacity_bytes)
    return bars, capacities


def write_plan_gantt(plan: Plan, model: LayerGraph, cluster: Cluster, path: str | Path) -> Path:
    """Re-estimate ``plan`` with the cost model, simulate its pipeline schedule, and write ONE figure: the
    schedule on top (one row per stage), memory per device by kind below (one bar per stage, or per replica
    group on mixed hardware, capacity marked)."""
    from planner.cost import simulate_pipeline  # noqa: PLC0415
    from planner.cost.moe import merged_ratio  # noqa: PLC0415

    check_path(path, "--gantt")
    stages = plan_stage_estimates(plan, model, cluster)
    # expert-parallel overlap: each steady-state forward and backward drawn as one merged step of its own length
    ratio = merged_ratio([s.merged_s for s in stages], [s.forward_s for s in stages],
                         [s.backward_s for s in stages]) if plan.ep_overlap else None
    simulation = simulate_pipeline([s.forward_s for s in stages], [s.backward_s for s in stages],
                                   plan.num_micro_batches, plan.schedule, max(plan.vpp, 1),
                                   [s.p2p_s for s in stages],
                                   all_forwards_at_pp=get_runtime(plan.runtime).interleaved_all_forwards_at_pp,
                                   overlap_ratio=ratio)
    bars, capacities = _memory_bars(stages)
    top = schedule_height_in(len(stages))
    figure, (schedule_ax, memory_ax) = pyplot().subplots(
        2, 1, figsize=(SCHEDULE_SIZE_IN[0], top + MEMORY_SIZE_IN[1]), layout="constrained",
        gridspec_kw={"height_ratios": [top, MEMORY_SIZE_IN[1]]})
    draw_schedule(schedule_ax, simulation.events, [_stage_label(s) for s in stages])
    draw_memory(memory_ax, bars, capacities)
    return save(figure, path, "--gantt")
