"""Rendering a Plan for people and for training frameworks: ``render(plan, fmt)``.

``planner plan --format`` and ``planner show --format`` both call :func:`render`.
"""

from __future__ import annotations

from typing import Callable

from planner.errors import ConfigError, suggest
from planner.plans import Plan

FORMATS = ("table", "json", "megatron", "deepspeed", "torchtitan", "torchrec")


def _renderer(fmt: str) -> Callable[[Plan], str]:
    if fmt == "table":
        from planner.report.table import render_table
        return render_table
    if fmt == "json":
        return lambda plan: plan.to_json() + "\n"
    if fmt == "megatron":
        from planner.export.megatron import render_megatron
        return render_megatron
    if fmt == "deepspeed":
        from planner.export.deepspeed import render_deepspeed
        return render_deepspeed
    if fmt == "torchtitan":
        from planner.export.torchtitan import render_torchtitan
        return render_torchtitan
    if fmt == "torchrec":
        from planner.export.torchrec import render_torchrec
        return render_torchrec
    raise ConfigError(f"--format {fmt!r} is not a known format; use one of {', '.join(FORMATS)}"
                      f"{suggest(fmt, FORMATS)}")


def render(plan: Plan, fmt: str = "table") -> str:
    """``plan`` as text in format ``fmt`` (one of :data:`FORMATS`), ending with a newline."""
    return _renderer(fmt)(plan)
