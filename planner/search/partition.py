"""Exact layer partition of a pipeline with a fixed stage layout: a dynamic program over (stages x layers),
vectorised with numpy, inside an enumeration of the bottleneck values (Alpa's idea, made exact).

Problem. Stages k = 0..P-1 are given. ``A[k, i, j]`` is stage k's per-micro-batch time if it holds layers
i..j (``inf`` where that is not allowed: i > j, or out of memory), ``R[k, i, j]`` its tail. Find cut points
minimising

    T = beta * sum_k a_k + alpha * max_k a_k + max_k r_k.

Method. For thresholds (t_a, t_r), let S(t_a, t_r) be the least sum of stage times over partitions whose
stages all satisfy a <= t_a and r <= t_r (a plain min-sum DP). The optimum pi* with bottleneck values
(a*, r*) is admissible at (t_a, t_r) = (a*, r*), both of which are entries of A and R, so
min over candidate thresholds of  beta * S + alpha * t_a + t_r  equals the optimum. Thresholds are scanned in
ascending order and the scan stops as soon as  beta * S_min + alpha * t_a + t_r  (a lower bound for every
larger threshold) reaches the best objective found: no optimum is discarded.

DP table: ``f[b, j]`` = least sum of stage times covering layers 0..j-1 with the stages placed so far, for
the b-th threshold of a batch; stage k turns f into ``g[b, j] = min_i f[b, i] + A_k[i, j - 1]``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

_BATCH = 32  # thresholds solved together in one vectorised DP


@dataclass(frozen=True)
class Partition:
    """An optimal partition: ``last_layers[k]`` is the last layer (inclusive) of stage k."""

    last_layers: tuple[int, ...]
    objective: float
    sum_a: float
    max_a: float
    max_r: float
    dp_runs: int  # DP evaluations (each over a batch of thresholds) spent


def stage_bounds(last_layers: tuple[int, ...]) -> list[tuple[int, int]]:
    first = 0
    out = []
    for last in last_layers:
        out.append((first, last))
        first = last + 1
    return out


def _min_sum(A: np.ndarray, R: np.ndarray, t_a: np.ndarray, t_r: float) -> tuple[np.ndarray, list[np.ndarray]]:
    """Least sum of stage times under thresholds ``t_a`` (a batch) and ``t_r``; with back-pointers."""
    P, L, _ = A.shape
    B = len(t_a)
    f = np.full((B, L + 1), np.inf)
    f[:, 0] = 0.0
    pointers = []
    for k in range(P):
        Ak = np.where(R[k] <= t_r, A[k], np.inf)
        masked = np.where(Ak[None, :, :] <= t_a[:, None, None], Ak[None, :, :], np.inf)  # (B, i, j)
        cand = f[:, :L, None] + masked
        arg = np.argmin(cand, axis=1)  # (B, j)
        g = np.take_along_axis(cand, arg[:, None, :], axis=1)[:, 0, :]
        f = np.concatenate((np.full((B, 1), np.inf), g), axis=1)
        pointers.append(arg)
    return f[:, L], pointers


def _backtrack(pointers: list[np.ndarray], b: int, num_layers: int) -> tuple[int, ...]:
    last = []
    j = num_layers - 1
    for arg in reversed(pointers):
        last.append(j)
        j = int(arg[b, j]) - 1
    return tuple(reversed(last))


def _score(A: np.ndarray, R: np.ndarray, last_layers: tuple[int, ...], alpha: float, beta: float
           ) -> tuple[float, float, float, float]:
    a = [A[k, i, j] for k, (i, j) in enumerate(stage_bounds(last_layers))]
    r = [R[k, i, j] for k, (i, j) in enumerate(stage_bounds(last_layers))]
    return beta * sum(a) + alpha * max(a) + max(r), float(sum(a)), float(max(a)), float(max(r))


def solve_partition(A: np.ndarray, R: np.ndarray, alpha: float, beta: float, cutoff: float = np.inf
                    ) -> Partition | None:
    """The optimal partition, or None when no partition fits (or none can beat ``cutoff``)."""
    P, L, _ = A.shape
    if P > L or P == 0:
        return None
    runs = 0
    inf1 = np.array([np.inf])
    s_all, ptr = _min_sum(A, R, inf1, np.inf)
    runs += 1
    if not np.isfinite(s_all[0]):
        return None
    s_min = float(s_all[0])
    best_last = _backtrack(ptr, 0, L)
    best = _score(A, R, best_last, alpha, beta)
    finite = np.isfinite(A)
    a_min = float(A[finite].min())

    def bound() -> float:
        return min(best[0], cutoff)

    if beta * s_min + alpha * a_min + float(R[finite].min()) >= bound():
        return _result(best_last, best, runs) if best[0] < cutoff else None

    # Pass 1 (t_r = +inf): V = min over partitions of beta * sum a + alpha * max a, ignoring r. Its minimiser
    # has some max r = r_inf; no threshold t_r >= r_inf can give less than V + r_inf, its own objective.
    v_last, v_runs = _scan_bottleneck(A, R, alpha, beta, np.inf, s_min, a_min, best_last,
                                      lambda last: beta * _score(A, R, last, alpha, beta)[1]
                                      + alpha * _score(A, R, last, alpha, beta)[2], np.inf)
    runs += v_runs
    v_score = _score(A, R, v_last, alpha, beta)
    if v_score[0] < best[0]:
        best, best_last = v_score, v_last
    r_inf = v_score[3]
    # Pass 2: every r threshold below r_inf, ascending, while it can still beat the best.
    r_values = np.unique(R[finite])
    r_values = r_values[r_values < r_inf]
    # the least feasible t_r (feasibility only grows with t_r), by bisection
    lo, hi = 0, len(r_values)
    while lo < hi:
        mid = (lo + hi) // 2
        s_mid, _ = _min_sum(A, R, np.array([np.inf]), float(r_values[mid]))
        runs += 1
        if np.isfinite(s_mid[0]):
            hi = mid
        else:
            lo = mid + 1
    for t_r in r_values[lo:]:
        if t_r >= r_inf or beta * s_min + alpha * a_min + t_r >= bound():
            break
        last, t_runs = _scan_bottleneck(A, R, alpha, beta, float(t_r), s_min, a_min, None,
                                        lambda last: _score(A, R, last, alpha, beta)[0], bound())
        runs += t_runs
        if last is not None:
            score = _score(A, R, last, alpha, beta)
            if score[0] < best[0]:
                best, best_last = score, last
    if best[0] >= cutoff:
        return None
    return _result(best_last, best, runs)


def _scan_bottleneck(A: np.ndarray, R: np.ndarray, alpha: float, beta: float, t_r: float, s_min: float,
                     a_min: float, incumbent: tuple[int, ...] | None, value, limit: float):
    """Best partition (by ``value``) among those with every r <= t_r, scanning t_a upwards.

    Objective bound at threshold t_a: beta * S(t_a, t_r) + alpha * t_a (+ t_r when finite). Returns the
    partition attaining the least bound (None if none beats ``limit``/the incumbent) and the DP runs spent."""
    L = A.shape[1]
    finite = np.isfinite(A)
    allowed = finite & (R <= t_r)
    runs = 0
    if not allowed.any():
        return incumbent, runs
    tr_term = 0.0 if t_r == np.inf else t_r
    best_last = incumbent
    best_val = value(incumbent) if incumbent is not None else limit
    s_hi, _ = _min_sum(A, R, np.array([np.inf]), t_r)
    runs += 1
    if not np.isfinite(s_hi[0]):
        return incumbent, runs
    s_low = float(s_hi[0])  # least sum of stage times under t_r: bounds every t_a below
    num_stages = A.shape[0]
    a_values = np.unique(A[allowed])
    # the bottleneck is at least the mean stage time; below that no t_a is feasible
    a_values = a_values[a_values >= s_low / num_stages * (1 - 1e-12)]
    if len(a_values) == 0 or beta * s_low + alpha * a_values[0] + tr_term >= best_val:
        return best_last, runs
    # first feasible t_a by bisection (feasibility only grows with t_a)
    lo, hi = 0, len(a_values) - 1
    while lo < hi:
        mid = (lo + hi) // 2
        s_mid, _ = _min_sum(A, R, a_values[mid:mid + 1], t_r)
        runs += 1
        if np.isfinite(s_mid[0]):
            hi = mid
        else:
            lo = mid + 1
    start = lo
    while start < len(a_values):
        if beta * s_low + alpha * a_values[start] + tr_term >= best_val:
            break
        batch = a_values[start:start + _BATCH]
        sums, ptr = _min_sum(A, R, batch, t_r)
        runs += 1
        bounds_b = beta * sums + alpha * batch + tr_term
        b = int(np.argmin(bounds_b))
        if bounds_b[b] < best_val:
            last = _backtrack(ptr, b, L)
            val = value(last)
            if val < best_val:
                best_val, best_last = val, last
        start += _BATCH
    return best_last, runs


def _result(last: tuple[int, ...], score: tuple[float, float, float, float], runs: int) -> Partition:
    return Partition(last_layers=last, objective=score[0], sum_a=score[1], max_a=score[2], max_r=score[3],
                     dp_runs=runs)
