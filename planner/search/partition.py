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

_BATCH_ELEMENTS = 400_000  # thresholds solved together in one vectorised DP: batch x stages x layers^2 at most


def _batch(S: np.ndarray) -> int:
    P, L, _ = S.shape
    return int(max(1, min(32, _BATCH_ELEMENTS // (P * L * L))))


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


def _min_sum(S: np.ndarray, G: np.ndarray, R: np.ndarray, t_g: np.ndarray, t_r: np.ndarray | float,
             pointers: bool = True) -> tuple[np.ndarray, list[np.ndarray]]:
    """Least sum of S under thresholds ``t_g`` and ``t_r`` (a batch each, or a scalar t_r); with
    back-pointers when asked."""
    P, L, _ = S.shape
    B = len(t_g)
    t_r = np.broadcast_to(np.asarray(t_r, dtype=float), (B,))
    f = np.full((B, L + 1), np.inf)
    f[:, 0] = 0.0
    back = []
    r_free = bool(np.isposinf(t_r).all())  # every R admitted: only G constrains (the common case)
    for k in range(P):
        allowed = G[k][None, :, :] <= t_g[:, None, None]
        if not r_free:
            allowed &= R[k][None, :, :] <= t_r[:, None, None]
        cand = f[:, :L, None] + np.where(allowed, S[k][None, :, :], np.inf)  # (B, i, j)
        if pointers:
            arg = np.argmin(cand, axis=1)  # (B, j)
            g = np.take_along_axis(cand, arg[:, None, :], axis=1)[:, 0, :]
            back.append(arg)
        else:
            g = cand.min(axis=1)
        f[:, 1:] = g
        f[:, 0] = np.inf
    return f[:, L], back


def _min_max(S: np.ndarray, G: np.ndarray, R: np.ndarray, t_r: float) -> float:
    """The least possible max over stages of G among partitions that fit (and have every R <= t_r):
    a bottleneck DP, h[j] = min_i max(h[i], G_k[i, j - 1])."""
    P, L, _ = S.shape
    h = np.full(L + 1, np.inf)
    h[0] = -np.inf
    for k in range(P):
        Gk = np.where(np.isfinite(S[k]) & (R[k] <= t_r) if np.isfinite(t_r) else np.isfinite(S[k]), G[k], np.inf)
        cand = np.maximum(h[:L, None], Gk)
        h = np.concatenate(([np.inf], cand.min(axis=0)))
    return float(h[L])


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


def _first_feasible(values: np.ndarray, feasible: Callable[[np.ndarray], np.ndarray], batch: int
                    ) -> tuple[int, int]:
    """Index of the least value that is feasible (feasibility grows with the value; ``len(values)`` if none),
    by a search that tests up to ``batch`` values per vectorised DP; and the DP runs spent."""
    lo, hi, runs = 0, len(values), 0
    while lo < hi:
        count = min(batch, hi - lo)
        probe = np.unique(lo + ((hi - lo) * np.arange(1, count + 1)) // (count + 1))  # interior points
        ok = feasible(values[probe])
        runs += 1
        hit = np.flatnonzero(ok)
        if len(hit) == 0:
            lo = int(probe[-1]) + 1
        else:
            p = int(hit[0])
            hi = int(probe[p])
            lo = int(probe[p - 1]) + 1 if p > 0 else lo
    return lo, runs


def _scan(S, G, R, t_r: float, incumbent: tuple[tuple[int, ...] | None, float],
          value: Callable[[tuple[int, ...]], float]) -> tuple[tuple[int, ...] | None, float, int]:
    """Best partition by ``value`` among those with every R <= t_r, over all thresholds t_g.

    Branch and bound over intervals [a, b] of the sorted G values: V(t) (least sum under G <= t) does not
    increase with t, so every threshold in [a, b] scores at least V(g_b) + g_a; an interval whose V is
    constant is best at its left end. The score at t bounds the value of the partition the DP returns there.
    """
    L = S.shape[1]
    best_last, best_val = incumbent
    allowed = np.isfinite(S) & (R <= t_r)
    if not allowed.any():
        return best_last, best_val, 0
    tr_term = 0.0 if t_r == np.inf else t_r
    g_values = np.unique(G[allowed])
    solved: dict[int, float] = {}
    runs = 0

    def V(index: int) -> float:
        nonlocal runs
        if index not in solved:
            sums, _ = _min_sum(S, G, R, g_values[index:index + 1], t_r, pointers=False)
            runs += 1
            solved[index] = float(sums[0])
        return solved[index]

    def consider(index: int) -> None:
        nonlocal best_last, best_val, runs
        if np.isfinite(V(index)) and V(index) + g_values[index] + tr_term < best_val:
            _, ptr = _min_sum(S, G, R, g_values[index:index + 1], t_r)
            runs += 1
            last = _backtrack(ptr, 0, L)
            val = value(last)
            if val < best_val:
                best_val, best_last = val, last

    top = len(g_values) - 1
    v_low = V(top)  # least sum under t_r: bounds every threshold
    if not np.isfinite(v_low):
        return best_last, best_val, runs
    start = int(np.searchsorted(g_values, _min_max(S, G, R, t_r), side="left"))
    runs += 1
    # thresholds above best - v_low cannot win
    end = min(top, int(np.searchsorted(g_values, best_val - v_low - tr_term, side="right")))
    end = max(end, start)
    stack = [(start, end)]
    while stack:
        a, b = stack.pop()
        va, vb = V(a), V(b)
        if vb + g_values[a] + tr_term >= best_val:
            continue
        if va <= vb * (1 + 1e-12) or b - a <= 1:
            consider(a)
            if b != a and va > vb * (1 + 1e-12):
                consider(b)
            continue
        mid = (a + b) // 2
        stack.append((mid, b))
        stack.append((a, mid))
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
    g_star = _min_max(S, G, R, np.inf)  # every partition has max G >= g_star and sum S >= v_all
    runs += 1
    if float(v_all[0]) + g_star + float(R[finite].min()) >= min(best, cutoff):
        return Partition(best_last, best, runs) if best < cutoff else None

    def objective(last: tuple[int, ...]) -> float:
        return score(S, G, R, last)[0]

    def without_r(last: tuple[int, ...]) -> float:
        s, g, r = score(S, G, R, last)
        return s - r

    # Pass 1 (t_r = +inf): W = min over partitions of sum S + max G, ignoring R. Its minimiser has some max R
    # = r_w; a threshold t_r >= r_w cannot give less than W + r_w, that partition's own objective.
    # (every objective is at least its S + G + the least R: values of S + G from cutoff - min R on cannot win)
    r_min = float(R[finite].min())
    w_last, w_val, spent = _scan(S, G, R, np.inf, (first, min(without_r(first), cutoff - r_min)), without_r)
    runs += spent
    if w_val >= cutoff - r_min:
        return None  # no partition has S + G below it
    w_obj, _, r_w = score(S, G, R, w_last)
    if w_obj < best:
        best_last, best = w_last, w_obj
    # Pass 2: every R threshold below r_w that admits a partition, ascending, while it can still win.
    r_values = np.unique(R[finite])
    r_values = r_values[r_values < r_w]
    g_min = float(G[finite].min())
    start, spent = _first_feasible(
        r_values, lambda t: np.isfinite(_min_sum(S, G, R, np.full(len(t), np.inf), t, pointers=False)[0]),
        _batch(S))
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
