"""A dependency-free progress bar on stderr that appears only when a search runs longer than a second."""

from __future__ import annotations

import sys
import time
from typing import TextIO


class ProgressBar:
    def __init__(self, label: str = "searching", delay_s: float = 1.0, stream: TextIO | None = None,
                 width: int = 30) -> None:
        self.label, self.delay_s, self.width = label, delay_s, width
        self.stream = stream if stream is not None else sys.stderr
        self.start = time.perf_counter()
        self.shown = False
        self._last = -1

    def __call__(self, fraction: float) -> None:
        elapsed = time.perf_counter() - self.start
        if elapsed < self.delay_s:
            return
        filled = int(max(0.0, min(1.0, fraction)) * self.width)
        if filled == self._last and fraction < 1.0:
            return
        self._last = filled
        self.shown = True
        bar = "#" * filled + "." * (self.width - filled)
        self.stream.write(f"\rplanner: {self.label} [{bar}] {fraction:4.0%} {elapsed:5.1f} s")
        self.stream.flush()

    def close(self) -> None:
        if self.shown:
            self.stream.write("\n")
            self.stream.flush()
