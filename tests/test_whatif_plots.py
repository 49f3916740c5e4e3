"""What-if plots, Gantt chart and memory chart render real images (opened, sized, not blank)."""

from __future__ import annotations

import sys
from collections import namedtuple

import pytest

from planner.errors import ConfigError
from planner.report._figure import DPI, pyplot, save
from planner.report.gantt import (MEMORY_SIZE_IN, SCHEDULE_SIZE_IN, draw_memory, draw_schedule,
                                  schedule_height_in)
from planner.report.plots import figure_size_px, write_whatif_plot
from planner.types import MemoryBreakdown
from planner.sweep.whatif import WhatIfResult

from whatif_fakes import result_for, mixed_cluster

image = pytest.importorskip("matplotlib.image", reason="matplotlib (the plot extra) is not installed")

Event = namedtuple("Event", "stage micro_batch kind start_s end_s")


def _open_png(path, width, height):
    pixels = image.imread(str(path))
    assert pixels.shape[:2] == (height, width)
    assert pixels[..., :3].var() > 0  # not one flat colour
    return pixels


def write_gantt(events, path, stage_labels=None):
    """The schedule panel of ``planner plan --gantt`` alone, in its own figure."""
    stages = max((e.stage for e in events), default=0) + 1
    figure, ax = pyplot().subplots(figsize=(SCHEDULE_SIZE_IN[0], schedule_height_in(stages)), layout="constrained")
    draw_schedule(ax, events, stage_labels)
    return save(figure, path, "--gantt")


def write_memory_chart(stages_memory, path, capacities_bytes=None):
    """The memory panel of ``planner plan --gantt`` alone, in its own figure."""
    figure, ax = pyplot().subplots(figsize=MEMORY_SIZE_IN, layout="constrained")
    draw_memory(ax, stages_memory, capacities_bytes)
    return save(figure, path, "--gantt")


def _two_key_result(price=True):
    return result_for({"fake-a100.count": ["0", "1", "2", "4"], "fake-h100.count": ["1", "2", "4"]},
                   cluster=mixed_cluster(price=price))


def test_whatif_png_with_prices_has_two_panels(tmp_path):
    result = _two_key_result()
    assert result.priced
    path = write_whatif_plot(result, tmp_path / "sweep.png")
    _open_png(path, *figure_size_px(2, DPI))


def test_whatif_png_without_prices_has_one_panel(tmp_path):
    result = _two_key_result(price=False)
    assert not result.priced
    _open_png(write_whatif_plot(result, tmp_path / "sweep.png"), *figure_size_px(1, DPI))


def test_whatif_svg_and_categorical_key(tmp_path):
    result = result_for({"fake-a100.node": ["fake-a100", "fake-h100"]})
    path = write_whatif_plot(result, tmp_path / "sweep.svg")
    text = path.read_text()
    assert text.startswith("<?xml") and "<svg" in text and "fake-h100" in text
    assert path.read_bytes() == write_whatif_plot(result, tmp_path / "again.svg").read_bytes()


def test_whatif_plot_errors(tmp_path):
    result = _two_key_result()
    with pytest.raises(ConfigError, match="png or .svg"):
        write_whatif_plot(result, tmp_path / "sweep.jpg")
    with pytest.raises(ConfigError, match="does not exist"):
        write_whatif_plot(result, tmp_path / "no" / "sweep.png")
    with pytest.raises(ConfigError, match="not a swept key"):
        write_whatif_plot(result, tmp_path / "sweep.png", x_key="seq_len")
    none = WhatIfResult(points=tuple(p for p in result.points if not p.feasible), keys=result.keys)
    with pytest.raises(ConfigError, match="no point of the sweep is feasible"):
        write_whatif_plot(none, tmp_path / "sweep.png")


def _one_f_one_b_events(stages=4, micro_batches=6, forward_s=1.0, backward_s=2.0, send_s=0.1):
    """A hand-made 1F1B-like schedule (not a simulator: enough for the picture)."""
    events = []
    for s in range(stages):
        t = s * (forward_s + send_s)
        for m in range(micro_batches):
            events.append(Event(s, m, "forward", t, t + forward_s))
            if s < stages - 1:
                events.append(Event(s, m, "send", t + forward_s, t + forward_s + send_s))
            events.append(Event(s, m, "backward", t + forward_s + send_s, t + forward_s + send_s + backward_s))
            t += forward_s + send_s + backward_s
    return events


def test_gantt_png(tmp_path):
    events = _one_f_one_b_events()
    path = write_gantt(events, tmp_path / "gantt.png", stage_labels=[f"a100 s{i}" for i in range(4)])
    pixels = _open_png(path, round(SCHEDULE_SIZE_IN[0] * DPI), round(schedule_height_in(4) * DPI))
    # the forward colour (tab:blue, #1f77b4) is on the picture
    rgb = (pixels[..., :3] * 255).round()
    assert ((abs(rgb[..., 0] - 0x1F) < 3) & (abs(rgb[..., 1] - 0x77) < 3) & (abs(rgb[..., 2] - 0xB4) < 3)).any()


def test_gantt_rejects_bad_input(tmp_path):
    with pytest.raises(ConfigError, match="no events"):
        write_gantt([], tmp_path / "g.png")
    with pytest.raises(ValueError, match="unknown pipeline event kinds"):
        write_gantt([Event(0, 0, "idle", 0.0, 1.0)], tmp_path / "g.png")


def test_memory_chart_png(tmp_path):
    gib = 2.0**30
    stages = [(f"stage {i}", MemoryBreakdown(weights_bytes=10 * gib, gradients_bytes=10 * gib,
                                             optimizer_bytes=40 * gib, activations_bytes=(4 - i) * 3 * gib,
                                             other_bytes=2 * gib)) for i in range(4)]
    path = write_memory_chart(stages, tmp_path / "mem.png", capacities_bytes=[80 * gib] * 4)
    _open_png(path, 1000, 350)


def test_missing_matplotlib_names_the_extra(monkeypatch, tmp_path):
    from planner.errors import PlannerError
    from planner.report._figure import pyplot

    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    with pytest.raises(PlannerError, match=r'pip install "planner\[plot\]"'):
        pyplot()
