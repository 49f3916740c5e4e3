"""How hard a search works and which random choices it makes: one value for the dense and the sparse searches.

``work`` is a multiple of each search's default work budget (1.0 = the default). Every search counts its own
work in deterministic units (never the clock), so the same input and options give the same plan on any
machine; ``seed`` seeds every random choice a search makes (neighbourhoods, ruin-and-recreate picks, kicks).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from planner.errors import ConfigError


@dataclass(frozen=True)
class SolverOptions:
    """The search's work (a multiple of its default budget) and the seed of its random choices."""

    work: float = 1.0
    seed: int = 0

    def __post_init__(self) -> None:
        if isinstance(self.work, bool) or not isinstance(self.work, (int, float)) or not math.isfinite(self.work) \
                or self.work <= 0:
            raise ConfigError(f"solver work {self.work!r}: must be a positive multiple of the default budget "
                              "(1 = the default, 2 = twice its work)")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0:
            raise ConfigError(f"solver seed {self.seed!r}: must be a whole number >= 0, e.g. 0")
