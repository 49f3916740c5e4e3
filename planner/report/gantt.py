"""Pictures of one plan: the pipeline schedule (a Gantt chart from the event simulator, one row per stage,
forward, backward and point-to-point sends coloured) and memory per device by kind (stacked bars per stage).

``write_plan_gantt`` draws both for a Plan in ONE file, schedule on top and memory below, so that
``planner plan --gantt FILE`` writes exactly the file the user named.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol, Sequence

from planner.errors import ConfigError
from planner.report._figure import check_path, pyplot, save
from planner.types import MemoryBreakdown

GIB = 2.0**30
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


def schedule_height_in(num_stages: int) -> float:
    return 1.4 + SCHEDULE_SIZE_IN[1] * num_stages


def _draw_schedule(ax: Any, events: Sequence[Event], stage_labels: Sequence[str] | None) -> None:
    if not events:
        raise ConfigError("--gantt: the schedule has no events to draw")
    stages = max(e.stage for e in events) + 1
    labels = list(stage_labels) if stage_labels is not None else [f"stage {i}" for i in range(stages)]
    if len(labels) < stages:
        raise ValueError(f"{len(labels)} stage labels for {stages} stages")
    unknown = sorted({e.kind for e in events} - set(KIND_COLOURS))
    if unknown:
        raise ValueError(f"unknown pipeline event kinds {unknown}")
    for kind, colour in KIND_COLOURS.items():
        # sends sit in the lower part of the sender's row, compute fills the rest
        height, offset = (0.2, 0.35) if kind == "send" else (0.6, -0.35)
        for stage in range(stages):
            bars = [(e.start_s, e.end_s - e.start_s) for e in events if e.kind == kind and e.stage == stage]
            if bars:
                ax.broken_barh(bars, (stage + offset, height), facecolors=colour, edgecolor="white",
                               linewidth=0.5)
    if len(events) <= MAX_LABELLED_EVENTS:
        for e in events:
            if e.kind != "send":
                ax.text((e.start_s + e.end_s) / 2, e.stage - 0.05, str(e.micro_batch), ha="center",
                        va="center", fontsize="xx-small", color="white")
    ax.set_yticks(range(stages), labels[:stages])
    ax.set_ylim(stages - 0.4, -0.6)  # stage 0 on top
    ax.set_xlim(0, max(e.end_s for e in events))
    ax.set_xlabel("time (s)")
    ax.set_title("Pipeline schedule (numbers: micro-batch)", loc="left")
    ax.grid(True, axis="x", alpha=0.3)
    from matplotlib.patches import Patch  # noqa: PLC0415 - matplotlib is loaded by now

    ax.legend(handles=[Patch(color=c, label=k) for k, c in KIND_COLOURS.items()], loc="lower right",
              bbox_to_anchor=(1.0, 1.0), fontsize="x-small", ncol=3, frameon=False)


def _draw_memory(ax: Any, stages_memory: Sequence[tuple[str, MemoryBreakdown]],
                 capacities_bytes: Sequence[float] | None) -> None:
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


def write_gantt(events: Sequence[Event], path: str | Path, stage_labels: Sequence[str] | None = None) -> Path:
    """The pipeline schedule: one row per stage (stage 0 on top), forward, backward and sends coloured."""
    check_path(path, "--gantt")
    stages = max((e.stage for e in events), default=0) + 1
    figure, ax = pyplot().subplots(figsize=(SCHEDULE_SIZE_IN[0], schedule_height_in(stages)),
                                   layout="constrained")
    _draw_schedule(ax, events, stage_labels)
    return save(figure, path, "--gantt")


def write_memory_chart(stages_memory: Sequence[tuple[str, MemoryBreakdown]], path: str | Path,
                       capacities_bytes: Sequence[float] | None = None) -> Path:
    """Stacked bars of one device's memory per stage (label, MemoryBreakdown), with its capacity marked."""
    check_path(path, "--gantt")
    figure, ax = pyplot().subplots(figsize=MEMORY_SIZE_IN, layout="constrained")
    _draw_memory(ax, stages_memory, capacities_bytes)
    return save(figure, path, "--gantt")
