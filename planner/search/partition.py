"""Exact layer partition of a pipeline with a fixed stage layout: a dynamic program over (stages x layers),
vectorised with numpy, inside an enumeration of the bottleneck values (Alpa's idea, made exact).

Problem. Stages k = 0..P-1 are given. For stage k holding layers i..j, ``S[k, i, j]`` is what it adds to the
objective, ``G[k, i, j]`` its candidate for the pipeline's bottleneck term and ``R[k, i, j]`` for the tail term
(``S = inf`` where the segment is not allowed: i > j, or out of memory). Find cut points minimising

    T = sum_k S_k + max_k G_k + max_k R_k.

Method. For thresholds (t_g, t_r), let V(t_g, t_r) be the least sum of S over partitions whose stages all
satisfy G <= t_g and R <= t_r (a plain min-sum DP). The optimum pi* with bottleneck values (g*, r*) is
admissible at (t_g, t_r) = (g*, r*), both entries of G and R, so the minimum over candidate thresholds of
V + t_g + t_r is the optimum. Thresholds are scanned in ascending order and a scan stops as soon as
V_min + t_g + t_r (a lower bound for every larger threshold) reaches the best objective found, so no optimum
is discarded.

DP table: ``f[b, j]`` = least sum of S covering layers 0..j-1 with the stages placed so far, for the b-th
threshold of a batch; stage k turns f into ``g[b, j] = min_i f[b, i] + S_k[i, j - 1]`` (admissible entries).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

_BATCH = 32  # thresholds solved together in one vectorised DP


@dataclass(frozen=True)
class Partition:
    """An optimal partition: ``last_layers[k]`` is the last layer (inclusive) of stage k."""

    last_layers: tuple[int, ...]
    objective: float
    dp_runs: int  # DP evaluations (each over a batch of thresholds) spent


def stage_bounds(last_layers: tuple[int, ...]) -> list[tuple[int, int]]:
    first = 0
    out = []
    for last in last_layers:
        out.append((first, last))
        first = last + 1
    return out


def _min_sum(S: np.ndarray, G: np.ndarray, R: np.ndarray, t_g: np.ndarray, t_r: float
             ) -> tuple[np.ndarray, list[np.ndarray]]:
    """Least sum of S under thresholds ``t_g`` (a batch) and ``t_r``; with back-pointers."""
    P, L, _ = S.shape
    B = len(t_g)
    f = np.full((B, L + 1), np.inf)
    f[:, 0] = 0.0
    pointers = []
    for k in range(P):
        Sk = np.where(R[k] <= t_r, S[k], np.inf)
        masked = np.where(G[k][None, :, :] <= t_g[:, None, None], Sk[None, :, :], np.inf)  # (B, i, j)
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


def score(S: np.ndarray, G: np.ndarray, R: np.ndarray, last_layers: tuple[int, ...]) -> tuple[float, float, float]:
    """(objective, max G, max R) of one partition."""
    bounds = list(enumerate(stage_bounds(last_layers)))
    s = sum(S[k, i, j] for k, (i, j) in bounds)
    g = max(G[k, i, j] for k, (i, j) in bounds)
    r = max(R[k, i, j] for k, (i, j) in bounds)
    return float(s + g + r), float(g), float(r)


def _first_feasible(values: np.ndarray, feasible: Callable[[float], bool]) -> tuple[int, int]:
    """Index of the least value that is feasible (feasibility grows with the value), and the DP runs spent."""
    lo, hi, runs = 0, len(values), 0
    while lo < hi:
        mid = (lo + hi) // 2
        runs += 1
        if feasible(float(values[mid])):
            hi = mid
        else:
            lo = mid + 1
    return lo, runs


def _scan(S, G, R, t_r: float, incumbent: tuple[tuple[int, ...] | None, float],
          value: Callable[[tuple[int, ...]], float]) -> tuple[tuple[int, ...] | None, float, int]:
    """Best partition by ``value`` among those with every R <= t_r, scanning t_g upwards. The bound at t_g is
    V(t_g, t_r) + t_g (+ t_r when finite), never above the value of the partition it returns."""
    L = S.shape[1]
    best_last, best_val = incumbent
    allowed = np.isfinite(S) & (R <= t_r)
    if not allowed.any():
        return best_last, best_val, 0
    tr_term = 0.0 if t_r == np.inf else t_r
    v_all, _ = _min_sum(S, G, R, np.array([np.inf]), t_r)
    runs = 1
    v_low = float(v_all[0])  # least sum under t_r: bounds every t_g
    if not np.isfinite(v_low):
        return best_last, best_val, runs
    g_values = np.unique(G[allowed])
    start, spent = _first_feasible(
        g_values, lambda t: bool(np.isfinite(_min_sum(S, G, R, np.array([t]), t_r)[0][0])))
    runs += spent
    while start < len(g_values):
        if v_low + g_values[start] + tr_term >= best_val:
            break
        batch = g_values[start:start + _BATCH]
        sums, ptr = _min_sum(S, G, R, batch, t_r)
        runs += 1
        bounds = sums + batch + tr_term
        b = int(np.argmin(bounds))
        if bounds[b] < best_val:
            last = _backtrack(ptr, b, L)
            val = value(last)
            if val < best_val:
                best_val, best_last = val, last
        start += _BATCH
    return best_last, best_val, runs


def solve_partition(S: np.ndarray, G: np.ndarray, R: np.ndarray, cutoff: float = np.inf) -> Partition | None:
    """The optimal partition, or None when no partition fits or none beats ``cutoff``."""
    P, L, _ = S.shape
    if P > L or P == 0:
        return None
    v_all, ptr = _min_sum(S, G, R, np.array([np.inf]), np.inf)
    runs = 1
    if not np.isfinite(v_all[0]):
        return None
    finite = np.isfinite(S)
    first = _backtrack(ptr, 0, L)
    best_last, best = first, score(S, G, R, first)[0]
    if float(v_all[0]) + float(G[finite].min()) + float(R[finite].min()) >= min(best, cutoff):
        return Partition(best_last, best, runs) if best < cutoff else None

    def objective(last: tuple[int, ...]) -> float:
        return score(S, G, R, last)[0]

    def without_r(last: tuple[int, ...]) -> float:
        s, g, r = score(S, G, R, last)
        return s - r

    # Pass 1 (t_r = +inf): W = min over partitions of sum S + max G, ignoring R. Its minimiser has some max R
    # = r_w; a threshold t_r >= r_w cannot give less than W + r_w, that partition's own objective.
    w_last, _, spent = _scan(S, G, R, np.inf, (first, without_r(first)), without_r)
    runs += spent
    w_obj, _, r_w = score(S, G, R, w_last)
    if w_obj < best:
        best_last, best = w_last, w_obj
    # Pass 2: every R threshold below r_w that admits a partition, ascending, while it can still win.
    r_values = np.unique(R[finite])
    r_values = r_values[r_values < r_w]
    g_min = float(G[finite].min())
    start, spent = _first_feasible(
        r_values, lambda t: bool(np.isfinite(_min_sum(S, G, R, np.array([np.inf]), t)[0][0])))
    runs += spent
    for t_r in r_values[start:]:
        if float(v_all[0]) + g_min + t_r >= min(best, cutoff):
            break
        last, val, spent = _scan(S, G, R, float(t_r), (best_last, min(best, cutoff)), objective)
        runs += spent
        if last is not None and val < best:
            best_last, best = last, val
    if best >= cutoff:
        return None
    return Partition(best_last, best, runs)
