"""Matplotlib, imported lazily (an optional extra), and the one place figures are written to disk."""

from __future__ import annotations

import atexit
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

from planner.errors import PlannerError
from planner.outputs import atomic_open, check_output_file, write_error

FORMATS = (".png", ".svg")
DPI = 100


def _private_config_dir() -> None:
    """Point matplotlib's config and cache folder at a temporary one, removed at exit, unless the user chose
    one (``MPLCONFIGDIR``): by default matplotlib creates ``~/.config/matplotlib`` and writes its font cache to
    ``~/.cache/matplotlib``, and the planner writes only where the user asked. Read at matplotlib's import,
    so it is set before."""
    if "matplotlib" in sys.modules or os.environ.get("MPLCONFIGDIR"):
        return
    folder = tempfile.mkdtemp(prefix="planner-matplotlib-")
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    os.environ["MPLCONFIGDIR"] = folder


def pyplot() -> Any:
    """matplotlib.pyplot on the non-interactive Agg backend, or a PlannerError saying what to install."""
    _private_config_dir()
    try:
        import matplotlib  # noqa: PLC0415 - optional extra
    except ImportError:
        raise PlannerError('plots need matplotlib: pip install "planner[plot]"') from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    return plt


def check_path(path: str | Path, flag: str) -> Path:
    """The output path, if a figure can be written there (checked before any work is done)."""
    return check_output_file(path, flag, FORMATS)


def save(figure: Any, path: str | Path, flag: str) -> Path:
    """Write ``figure`` to ``path`` (PNG or SVG by suffix) and close it. The image is exactly figsize x DPI
    pixels (layout is the figure's own, no tight bounding box); SVG output carries no date."""
    target = check_path(path, flag)
    plt = pyplot()
    metadata = {"Date": None} if target.suffix.lower() == ".svg" else {"Software": None}
    try:
        with plt.rc_context({"svg.hashsalt": "planner"}), atomic_open(target, binary=True) as handle:
            # fixed SVG element ids: same figure, same bytes; written whole or not at all
            figure.savefig(handle, format=target.suffix.lower()[1:], dpi=DPI, metadata=metadata)
    except OSError as exc:
        raise write_error(path, flag, exc) from None
    finally:
        plt.close(figure)
    return target
