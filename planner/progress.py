"""The one progress bar: a line on stderr, redrawn in place, for a person at a terminal.

``planner plan`` feeds it the search's fraction done (``bar(0.4)``), ``planner whatif`` the points done
(``bar.count(3, 8)``). It appears only once a run has lasted ``delay_s`` (a quick run prints nothing) and
:func:`terminal_bar` makes one only when stderr is a terminal, so a script reading stderr sees logs and, on
exit 2, exactly the one error line. Dependency-free, and imports nothing from planner.
"""

from __future__ import annotations

import sys
import time
from typing import TextIO


class ProgressBar:
    """``planner: LABEL [#####.....] 50% 1.2 s``; ``close()`` ends the line if anything was drawn."""

    def __init__(self, label: str = "searching", delay_s: float = 1.0, stream: TextIO | None = None,
                 width: int = 30) -> None:
        self.label, self.delay_s, self.width = label, delay_s, width
        self.stream = stream if stream is not None else sys.stderr
        self.start = time.perf_counter()
        self.shown = False
        self._last: tuple[int, str] | None = None

    def __call__(self, fraction: float) -> None:
        """The work is ``fraction`` (0..1) done."""
        self._draw(fraction, f"{max(0.0, min(1.0, fraction)):4.0%}")

    def count(self, done: int, total: int) -> None:
        """``done`` of ``total`` items are done (a :data:`planner.sweep.runner.Progress` callback)."""
        self._draw(done / max(total, 1), f"{done}/{total} points")

    def _draw(self, fraction: float, amount: str) -> None:
        elapsed = time.perf_counter() - self.start
        if elapsed < self.delay_s:
            return
        filled = int(max(0.0, min(1.0, fraction)) * self.width)
        if (filled, amount) == self._last and fraction < 1.0:
            return
        self._last = (filled, amount)
        self.shown = True
        bar = "#" * filled + "." * (self.width - filled)
        self.stream.write(f"\rplanner: {self.label} [{bar}] {amount} {elapsed:5.1f} s")
        self.stream.flush()

    def close(self) -> None:
        if self.shown:
            self.stream.write("\n")
            self.stream.flush()
            self.shown = False


def terminal_bar(label: str) -> ProgressBar | None:
    """A bar on stderr when stderr is a terminal, else None (draw nothing)."""
    return ProgressBar(label) if sys.stderr.isatty() else None
