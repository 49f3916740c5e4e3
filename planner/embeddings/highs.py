"""HiGHS plumbing shared by every solver of the sharding search: silent one-thread models, a deterministic
work limit counted in interrupt checks, bulk row loading, and the units the models are written in.

Every model of planner.embeddings (the placement MILP, the sub-MILPs, pattern LPs and pricing problems, all
built directly on ``highspy``) is created here, so they share one way of staying quiet, of staying
deterministic (one thread, limits counted in work, never in seconds) and of scaling coefficients.
"""

from __future__ import annotations

import contextlib
import math
import os
import sys
from typing import Iterator

import numpy as np
from numpy.typing import ArrayLike

# HiGHS drops matrix entries below 1e-9, and seconds-per-byte are ~1e-12: the models are written in microseconds,
# megabytes of all-to-all traffic and gigabytes of memory, which keeps every coefficient within a few decades of 1.
US_PER_S = 1e6
MB_PER_BYTE = 1e-6
GB_PER_BYTE = 1e-9


def have_highs() -> bool:
    """Whether HiGHS (the ``highspy`` package) is importable; the searches that need nothing but HiGHS are
    skipped without it."""
    try:
        import highspy  # noqa: F401
    except ImportError:
        return False
    return True


class CheckLimit:
    """A deterministic work limit for HiGHS's MIP solver: interrupt it after ``checks`` of its interrupt checks.

    HiGHS checks for an interrupt at fixed points of its search (root cut rounds, heuristics, nodes), so the
    count of checks measures work done, as a node limit does, but it also bounds the root node, which a node
    limit does not. With one thread HiGHS is deterministic, so the same model stops at the same point on a fast
    or a slow machine, unlike a time limit.

    ``root_rounds`` also stops it once its search holds an incumbent and its root node has run that many cut
    rounds. A MILP started from a solution (a re-solve after its LP) first completes it into an incumbent, by a
    sub-MIP whose checks report the sub-MIP's bounds; its own search then reports no dual bound until the root
    LP is solved, and a new one at the check that opens each cut round. The checks carry no round count, so the
    rounds are counted as the checks that report a dual bound once the search has started with an incumbent
    (the root LP's, then one per round); without an incumbent at the start, only ``checks`` stops it."""

    def __init__(self, checks: int, root_rounds: int | None = None) -> None:
        self.checks = max(int(checks), 1)
        self.root_rounds = root_rounds
        self.seen = 0
        self.searching = False  # HiGHS's own search has started, with an incumbent
        self.bounded = 0  # checks since then that reported a dual bound

    def __call__(self, kind, message, data_out, data_in, user_data) -> None:
        self.seen += 1
        if self.seen >= self.checks:
            data_in.user_interrupt = True
        if self.root_rounds is None:
            return
        if math.isinf(data_out.mip_dual_bound):
            self.searching = self.searching or math.isfinite(data_out.mip_primal_bound)
        elif self.searching:
            self.bounded += 1
            if self.bounded > self.root_rounds:  # the root LP's check, then one per round
                data_in.user_interrupt = True

    def attach(self, highs) -> None:
        import highspy

        highs.setCallback(self, None)
        highs.startCallback(highspy.cb.HighsCallbackType.kCallbackMipInterrupt)


def has_incumbent(highs) -> bool:
    """Whether a solved ``highspy.Highs`` model holds a feasible solution."""
    import highspy

    return highs.getInfo().primal_solution_status == highspy.kSolutionStatusFeasible


@contextlib.contextmanager
def stdout_silenced() -> Iterator[None]:
    """Point the C-level stdout at /dev/null (HiGHS prints its banner there when a model is created)."""
    sys.stdout.flush()
    saved = os.dup(1)
    try:
        with open(os.devnull, "w") as sink:
            os.dup2(sink.fileno(), 1)
            try:
                yield
            finally:
                os.dup2(saved, 1)
    finally:
        os.close(saved)


def quiet_highs():
    """A new, silent, one-thread ``highspy.Highs`` for a model built directly, deterministic like every solve
    here."""
    import highspy

    # HiGHS keeps one thread scheduler per process: once another solve in this process (the search's ILP, a
    # user's own HiGHS model) has started it with more threads, a model asking for threads=1 refuses to run
    # ("Not Solved"). Dropping the scheduler lets this solve start its own with the threads it asks for.
    highspy.Highs.resetGlobalScheduler(True)
    with stdout_silenced():
        highs = highspy.Highs()
    highs.setOptionValue("output_flag", False)
    highs.setOptionValue("threads", 1)
    return highs


def add_rows(highs, rows) -> None:
    """Load ``rows`` into a ``highspy.Highs`` model in one call: each row is (coefficients, lower, upper), the
    coefficients a dict column -> value or a dense array; zero coefficients are left out."""
    starts, index, values = [], [], []
    for coefficients, _, _ in rows:
        starts.append(len(index))
        if isinstance(coefficients, dict):
            for j in sorted(coefficients):
                index.append(j)
                values.append(coefficients[j])
        else:
            nonzero = np.flatnonzero(coefficients)
            index.extend(int(j) for j in nonzero)
            values.extend(float(coefficients[j]) for j in nonzero)
    load_rows(highs, [r[1] for r in rows], [r[2] for r in rows], starts, index, values)


def load_rows(highs, lower: ArrayLike, upper: ArrayLike, starts: ArrayLike, index: ArrayLike,
              values: ArrayLike) -> None:
    """Load rows given as compressed rows (row i's entries are ``index``/``values`` from ``starts[i]`` to the
    next row's start) into a ``highspy.Highs`` model in one call; zero coefficients are left out."""
    index = np.asarray(index, dtype=np.int32)
    values = np.asarray(values, dtype=float)
    starts = np.asarray(starts, dtype=np.int64)
    keep = values != 0
    if not keep.all():
        kept_before = np.concatenate(([0], np.cumsum(keep)))  # kept entries before each position
        starts = kept_before[starts]
        index, values = index[keep], values[keep]
    highs.addRows(len(starts), np.asarray(lower, dtype=float), np.asarray(upper, dtype=float), len(index),
                  starts.astype(np.int32), index, values)


def set_integer(highs, columns: ArrayLike) -> None:
    """Declare ``columns`` of a ``highspy.Highs`` model integer."""
    import highspy

    columns = np.sort(np.asarray(columns, dtype=np.int32))
    highs.changeColsIntegrality(len(columns), columns, np.array([highspy.HighsVarType.kInteger] * len(columns)))
