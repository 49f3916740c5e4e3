"""A stronger lower bound than the plain LP relaxation, by thresholds on the unit-alone time.

The LP relaxation may mix, for one table, an option whose unit alone already takes longer than the LP's
value (say table-wise, cheap in total work) with a finely split one; no integer plan can. Let ``alone(t, o)``
be the time of one unit of option o alone on its best position (a valid lower bound on the slowest device
whenever o is used), and ``F(tau)`` the LP value with only the options whose ``alone <= tau``. The optimum
``T*`` uses only options with ``alone <= T*``, so ``T* >= F(T*)``. ``F`` is a non-increasing step function that
changes only at the alone values ``a_1 < a_2 < ...``; if ``T*`` lies in ``[a_k, a_{k+1})`` then ``T* >=
max(a_k, F(a_k))``. The first k with ``F(a_k) < a_{k+1}`` (a monotone predicate, found by bisection) gives the
bound ``max(a_k, F(a_k))``. Options with ``alone`` above a known plan's time are dropped from the start (the
optimum cannot use them). Each ``F`` is a re-solve of the same HiGHS model with some columns fixed to zero,
warm-started from the previous basis.
"""

from __future__ import annotations

import logging
import time

import highspy
import numpy as np

from planner.embeddings.milp import SolveResult
from planner.embeddings.problem import Problem

log = logging.getLogger(__name__)
_US = 1e6  # the model is in microseconds (milp.py)


def threshold_bound(problem: Problem, relaxed: SolveResult, upper_s: float, deadline: float
                    ) -> tuple[float, tuple[tuple[float, ...], ...]]:
    """(lower bound, LP weights at the bound's threshold); falls back to the plain LP's value and weights."""
    if relaxed.handle is None:
        return relaxed.objective_s, relaxed.weights
    lp, choice = relaxed.handle
    highs = lp.solverModel
    alone = {key: problem.unit_alone_s(*key) for key in choice}
    floor = max(min(alone[t, o] for o in range(len(options))) for t, options in enumerate(problem.options))
    values = sorted({a for a in alone.values() if floor <= a <= upper_s})
    if not values:
        return relaxed.objective_s, relaxed.weights
    cache: dict[int, tuple[float, tuple]] = {}

    def value(k: int) -> tuple[float, tuple]:
        if k not in cache:
            cache[k] = _restricted(highs, problem, choice, alone, values[k])
        return cache[k]

    def feasible_interval(k: int) -> bool:
        upper = values[k + 1] if k + 1 < len(values) else upper_s * (1 + 1e-12)
        return value(k)[0] < upper

    low, high = 0, len(values) - 1
    if not feasible_interval(high):
        return relaxed.objective_s, relaxed.weights
    while low < high and time.perf_counter() < deadline:
        mid = (low + high) // 2
        if feasible_interval(mid):
            high = mid
        else:
            low = mid + 1
    objective, weights = value(high)
    bound = max(values[high], objective, relaxed.objective_s) if low == high else relaxed.objective_s
    log.info("embeddings: threshold LP bound %.6f s (plain LP %.6f s) after %d re-solves",
             bound, relaxed.objective_s, len(cache))
    return bound, weights if low == high else relaxed.weights


def _restricted(highs, problem: Problem, choice, alone, tau: float) -> tuple[float, tuple]:
    """F(tau): the LP with only options whose unit-alone time is at most ``tau``."""
    for t, options in enumerate(problem.options):
        if not any(alone[t, o] <= tau for o in range(len(options))):
            return np.inf, ()
    for key, var in choice.items():
        highs.changeColBounds(var.index, 0.0, 1.0 if alone[key] <= tau else 0.0)
    highs.run()
    if highs.getModelStatus() != highspy.HighsModelStatus.kOptimal:
        return np.inf, ()
    values = highs.getSolution().col_value
    weights = tuple(tuple(float(values[choice[t, o].index]) for o in range(len(options)))
                    for t, options in enumerate(problem.options))
    return float(highs.getInfo().objective_function_value) / _US, weights
