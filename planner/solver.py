"""How hard a search works and which random choices it makes: one value for the dense and the sparse searches.

``work`` is a multiple of each search's default work limit (1.0 = the default), and both searches read it. Each
counts its own work in deterministic units (never the clock), so the same input and options give the same plan
on any machine:

- the dense search (planner.search) counts layouts partitioned plus plans timed (and, in smaller shares,
  layouts skipped by their transfers' bound and partial partitions enumerated:
  :class:`planner.search.engine.Limits`); its limit is ``planner.search.engine.DEFAULT_WORK_UNITS x work``,
  sized so that the default runs every measured case to completion with a wide margin (the same plan as a
  search without a limit). Less work may stop it early with the best plan found and its lower bound (then not
  proven optimal); more only matters to a search larger than any measured. An explicit ``budget``
  (``planner plan --budget N``) caps it further: the smaller applies;
- the embedding-table sharder (planner.embeddings) counts evaluations of every device's time; its default budget
  (planner.embeddings.budget.DEFAULT_EVALUATIONS) buys a plan near its bound, and more work gets closer.

``seed`` seeds every random choice of the sharder (neighbourhoods, ruin-and-recreate picks, kicks). The dense
search has nothing to seed: it is branch and bound whose order is fixed by its bounds and a deterministic tie
order, with no random choice, so it does not read ``seed`` and its plan is the same for every seed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from planner.errors import ConfigError


@dataclass(frozen=True)
class SolverOptions:
    """Both searches' work (a multiple of each one's default limit) and the seed of the sharder's random choices
    (the dense search makes none; see the module docstring)."""

    work: float = 1.0
    seed: int = 0

    def __post_init__(self) -> None:
        if isinstance(self.work, bool) or not isinstance(self.work, (int, float)) or not math.isfinite(self.work) \
                or self.work <= 0:
            raise ConfigError(f"solver work {self.work!r} (--work): must be a finite positive multiple of the "
                              "default work limit, e.g. 1 (the default) or 2 (twice its work)")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0:
            raise ConfigError(f"solver seed {self.seed!r}: must be a whole number >= 0, e.g. 0")
