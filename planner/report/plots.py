"""What-if plots: throughput against a swept key and, where prices are known, time against cost with the
Pareto front. One PNG or SVG file; two panels side by side when prices are known, else one.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

from planner.errors import ConfigError
from planner.report._figure import check_path, pyplot, save

if TYPE_CHECKING:
    from planner.sweep.whatif import WhatIfPoint, WhatIfResult

PANEL_SIZE_IN = (6.4, 4.8)
MAX_LABELLED_FRONT = 12  # label Pareto points with their settings up to this many


def _per_token(result: "WhatIfResult") -> bool:
    """Plot per token when every feasible point knows its sequence length, else per sample."""
    feasible = [p for p in result.points if p.feasible]
    return bool(feasible) and all(p.seq_len for p in feasible)


def _throughput(point: "WhatIfPoint", per_token: bool) -> float | None:
    return point.tokens_per_s if per_token else point.throughput_samples_per_s


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _series(result: "WhatIfResult", x_key: str) -> dict[tuple[tuple[str, Any], ...], list["WhatIfPoint"]]:
    """Points grouped by the values of every key other than ``x_key`` (grid order kept)."""
    groups: dict[tuple[tuple[str, Any], ...], list["WhatIfPoint"]] = {}
    for point in result.points:
        rest = tuple((k, v) for k, v in point.settings if k != x_key)
        groups.setdefault(rest, []).append(point)
    return groups


def _draw_throughput(ax: Any, result: "WhatIfResult", x_key: str) -> None:
    per_token = _per_token(result)
    x_values = list(dict.fromkeys(dict(p.settings)[x_key] for p in result.points))
    numeric = all(_is_number(v) for v in x_values)
    position = {v: (v if numeric else i) for i, v in enumerate(x_values)}
    series = _series(result, x_key)
    colours = pyplot().get_cmap("viridis" if len(series) > 10 else "tab10")
    for n, (rest, points) in enumerate(series.items()):
        xs = [position[dict(p.settings)[x_key]] for p in points if p.feasible]
        ys = [_throughput(p, per_token) for p in points if p.feasible]
        colour = colours(n / max(len(series) - 1, 1)) if len(series) > 10 else colours(n % 10)
        label = ", ".join(f"{k}={v}" for k, v in rest) or None
        ax.plot(xs, ys, marker="o", color=colour, label=label)
        failed = [position[dict(p.settings)[x_key]] for p in points if not p.feasible]
        ax.plot(failed, [0.0] * len(failed), linestyle="none", marker="x", color=colour)
    if not numeric:
        ax.set_xticks(range(len(x_values)), [str(v) for v in x_values], rotation=30, ha="right")
    elif len(x_values) <= 16:
        ax.set_xticks(x_values, [f"{v:g}" for v in x_values])  # the swept values, not 1.5 nodes
    ax.set_xlabel(x_key)
    ax.set_ylabel("tokens / s" if per_token else "samples / s")
    infeasible = sum(not p.feasible for p in result.points)
    note = f" ({infeasible} infeasible, x at 0)" if infeasible else ""
    ax.set_title(f"Throughput vs {x_key}{note}")
    ax.set_ylim(bottom=0)
    ax.grid(True, alpha=0.3)
    if 1 < len(series) <= 16:
        ax.legend(fontsize="x-small")


def _draw_cost(ax: Any, result: "WhatIfResult") -> None:
    per_token = _per_token(result)
    unit = 1e6  # per million tokens (or samples)

    def coords(point: "WhatIfPoint") -> tuple[float, float]:
        rate = _throughput(point, per_token)
        hours = unit / rate / 3600.0  # type: ignore[operator]
        return hours, point.cost_per_hour * hours  # type: ignore[operator]

    priced = [p for p in result.points if p.feasible and p.cost_per_hour is not None and _throughput(p, per_token)]
    xs, ys = zip(*(coords(p) for p in priced))
    ax.scatter(xs, ys, color="tab:grey", alpha=0.6, label="points")
    front = [result.points[i] for i in result.pareto_front()]
    fx, fy = zip(*(coords(p) for p in front))
    ax.plot(fx, fy, color="tab:red", marker="o", drawstyle="steps-post", label="Pareto front")
    if len(front) <= MAX_LABELLED_FRONT:
        for point, x, y in zip(front, fx, fy):
            ax.annotate(", ".join(f"{k}={v}" for k, v in point.settings), (x, y), fontsize="xx-small",
                        textcoords="offset points", xytext=(4, 4))
    what = "1M tokens" if per_token else "1M samples"
    ax.set_xlabel(f"hours per {what}")
    ax.set_ylabel(f"cost per {what}")
    ax.set_title("Time vs cost")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize="x-small")


def check_whatif_plot(result: "WhatIfResult", path: str | Path, x_key: str | None = None) -> str:
    """Raise what would stop :func:`write_whatif_plot` before it draws (the path, a key that was not swept, a
    sweep with no feasible point, matplotlib missing), so a command can check it before writing any other
    output. Returns the key of the x axis."""
    check_path(path, "--plot")
    key = x_key or (result.keys[0] if result.keys else "")
    if key not in result.keys:
        raise ConfigError(f"--plot: {key!r} is not a swept key (swept: {', '.join(result.keys)})")
    if not any(p.feasible for p in result.points):  # the command prints no table then: give the first reason
        first = result.points[0].reason if result.points else "the sweep has no points"
        raise ConfigError(f"--plot: no point of the sweep is feasible, so there is nothing to plot (the first: "
                          f"{first}); drop --plot to see every point's reason")
    pyplot()
    return key


def write_whatif_plot(result: "WhatIfResult", path: str | Path, x_key: str | None = None) -> Path:
    """Throughput against ``x_key`` (default: the first swept key; one line per combination of the other
    keys; infeasible points as x at 0) and, when prices are known, time against cost per million tokens
    (or samples) with the Pareto front."""
    key = check_whatif_plot(result, path, x_key)
    plt = pyplot()
    panels = 2 if result.priced else 1
    figure, axes = plt.subplots(1, panels, figsize=(PANEL_SIZE_IN[0] * panels, PANEL_SIZE_IN[1]),
                                layout="constrained", squeeze=False)
    _draw_throughput(axes[0][0], result, key)
    if panels == 2:
        _draw_cost(axes[0][1], result)
    return save(figure, path, "--plot")


def figure_size_px(panels: int, dpi: int) -> tuple[int, int]:
    """Width and height in pixels of a what-if figure with ``panels`` panels (for callers and tests)."""
    return round(PANEL_SIZE_IN[0] * panels * dpi), round(PANEL_SIZE_IN[1] * dpi)


__all__: Sequence[str] = ("check_whatif_plot", "write_whatif_plot", "figure_size_px")
