"""Exact layer partition of a pipeline with a fixed stage layout: a dynamic program over (stages x layers),
vectorised with numpy, inside an enumeration of the bottleneck values (Alpa's idea, made exact).

Problem. Stages k = 0..P-1 are given. For stage k holding layers i..j, ``S[k, i, j]`` is what it adds to the
objective and ``G[k, i, j]`` its candidate for the pipeline's bottleneck term (``S = inf`` where the segment
is not allowed: i > j, or out of memory). Find cut points minimising

    T = sum_k S_k + max_k G_k.

Method. For a threshold t, let V(t) be the least sum of S over partitions whose stages all satisfy G <= t
(a plain min-sum DP). The optimum pi* with bottleneck value g* is admissible at t = g*, an entry of G, so
the minimum over candidate thresholds of V + t is the optimum. Thresholds are scanned by branch and bound
over the sorted G values, and a threshold is skipped only when V_min + t (a lower bound for it) cannot beat
the best objective found, so no optimum is discarded.

DP table: ``f[j]`` = least sum of S covering layers 0..j-1 with the stages placed so far, under one threshold;
stage k turns f into ``g[j] = min_i f[i] + S_k[i, j - 1]`` (admissible entries). Every stage holds a layer, so
stage k starts and ends within layers k..L-P+k, and only that band of S_k is read.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

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


def _min_sum(S: np.ndarray, G: np.ndarray, t_g: float, pointers: bool = True
             ) -> tuple[float, list[np.ndarray]]:
    """Least sum of S over partitions whose stages all have G <= ``t_g``; with back-pointers when asked
    (``back[k][j]``: the first layer of stage k when it ends at layer j). Stage k starts and ends within layers
    k..L-P+k (each stage holds a layer), so only that band of each S[k] is read: S is infinite where i > j."""
    P, L, _ = S.shape
    f = np.full(L + 1, np.inf)
    f[0] = 0.0
    back = []
    for k in range(P):
        lo, hi = k, L - P + k + 1  # first and last layers of stage k lie in lo..hi-1
        Sk = S[k, lo:hi, lo:hi]
        if t_g != np.inf:
            Sk = np.where(G[k, lo:hi, lo:hi] <= t_g, Sk, np.inf)
        cand = f[lo:hi, None] + Sk  # (i, j)
        g = np.full(L, np.inf)
        if pointers:
            arg = cand.argmin(axis=0)  # (j,)
            g[lo:hi] = cand[arg, np.arange(hi - lo)]
            full = np.zeros(L, dtype=int)
            full[lo:hi] = arg + lo
            back.append(full)
        else:
            g[lo:hi] = cand.min(axis=0)
        f[1:] = g
        f[0] = np.inf
    return float(f[L]), back


def _min_max(S: np.ndarray, G: np.ndarray) -> float:
    """The least possible max over stages of G among partitions that fit: a bottleneck DP,
    h[j] = min_i max(h[i], G_k[i, j - 1]), over the band of layers stage k may start and end at (as
    :func:`_min_sum`)."""
    P, L, _ = S.shape
    h = np.full(L + 1, np.inf)
    h[0] = -np.inf
    for k in range(P):
        lo, hi = k, L - P + k + 1
        Gk = np.where(np.isfinite(S[k, lo:hi, lo:hi]), G[k, lo:hi, lo:hi], np.inf)
        cand = np.maximum(h[lo:hi, None], Gk)
        h = np.full(L + 1, np.inf)
        h[lo + 1:hi + 1] = cand.min(axis=0)
    return float(h[L])


def _backtrack(pointers: list[np.ndarray], num_layers: int) -> tuple[int, ...]:
    last = []
    j = num_layers - 1
    for arg in reversed(pointers):
        last.append(j)
        j = int(arg[j]) - 1
    return tuple(reversed(last))


def score(S: np.ndarray, G: np.ndarray, last_layers: tuple[int, ...]) -> tuple[float, float]:
    """(objective, max G) of one partition."""
    bounds = list(enumerate(stage_bounds(last_layers)))
    s = sum(S[k, i, j] for k, (i, j) in bounds)
    g = max(G[k, i, j] for k, (i, j) in bounds)
    return float(s + g), float(g)


def _scan(S: np.ndarray, G: np.ndarray, incumbent: tuple[tuple[int, ...], float],
          value: Callable[[tuple[int, ...]], float]) -> tuple[tuple[int, ...], float, int]:
    """Best partition by ``value`` over all thresholds t, starting from ``incumbent`` (partition, value).

    Branch and bound over intervals [a, b] of the sorted G values: V(t) (least sum under G <= t) does not
    increase with t, so every threshold in [a, b] scores at least V(g_b) + g_a; an interval whose V is
    constant is best at its left end. The score at t bounds the value of the partition the DP returns there.
    """
    L = S.shape[1]
    best_last, best_val = incumbent
    allowed = np.isfinite(S)
    if not allowed.any():
        return best_last, best_val, 0
    g_values = np.unique(G[allowed])
    solved: dict[int, float] = {}
    runs = 0

    def V(index: int) -> float:
        nonlocal runs
        if index not in solved:
            solved[index], _ = _min_sum(S, G, float(g_values[index]), pointers=False)
            runs += 1
        return solved[index]

    def consider(index: int) -> None:
        nonlocal best_last, best_val, runs
        if np.isfinite(V(index)) and V(index) + g_values[index] < best_val:
            _, ptr = _min_sum(S, G, float(g_values[index]))
            runs += 1
            last = _backtrack(ptr, L)
            val = value(last)
            if val < best_val:
                best_val, best_last = val, last

    top = len(g_values) - 1
    v_low = V(top)  # least sum of all: bounds every threshold
    if not np.isfinite(v_low):
        return best_last, best_val, runs
    start = int(np.searchsorted(g_values, _min_max(S, G), side="left"))
    runs += 1
    # thresholds above best - v_low cannot win
    end = min(top, int(np.searchsorted(g_values, best_val - v_low, side="right")))
    end = max(end, start)
    stack = [(start, end)]
    while stack:
        a, b = stack.pop()
        va, vb = V(a), V(b)
        if vb + g_values[a] >= best_val:
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


def solve_partition(S: np.ndarray, G: np.ndarray, cutoff: float = np.inf) -> Partition | None:
    """The optimal partition, or None when no partition fits or none beats ``cutoff``."""
    P, L, _ = S.shape
    if P > L or P == 0:
        return None
    v_all, ptr = _min_sum(S, G, np.inf)
    runs = 1
    if not np.isfinite(v_all):
        return None
    first = _backtrack(ptr, L)
    best_last, best = first, score(S, G, first)[0]
    g_star = _min_max(S, G)  # every partition has max G >= g_star and sum S >= v_all
    runs += 1
    if v_all + g_star >= min(best, cutoff):
        return Partition(best_last, best, runs) if best < cutoff else None

    def objective(last: tuple[int, ...]) -> float:
        return score(S, G, last)[0]

    best_last, best, spent = _scan(S, G, (first, min(best, cutoff)), objective)
    runs += spent
    if best >= cutoff:
        return None
    return Partition(best_last, best, runs)


def partitions_below(pairs: list[tuple[np.ndarray, np.ndarray]], cutoff: float, max_nodes: int
                     ) -> tuple[list[tuple[int, ...]] | None, int]:
    """Every partition whose objective under each (S, G) pair is below ``cutoff`` (depth first over the
    stages' last layers, a branch dropped once a pair's partial sum of S plus its least completion, plus the
    larger of the partial max of G and its least completion, reaches the cutoff), as tuples of last layers
    (None when that takes more than ``max_nodes`` partial partitions), and the partial partitions visited."""
    P, L, _ = pairs[0][0].shape
    if P > L or P == 0:
        return [], 0
    rests, tops = [], []
    for S, G in pairs:
        # rest[k, i], top[k, i]: least sum of S and least max of G over stages k.. holding layers i..
        rest = np.full((P + 1, L + 1), np.inf)
        top = np.full((P + 1, L + 1), np.inf)
        rest[P, L], top[P, L] = 0.0, -np.inf
        for k in range(P - 1, -1, -1):
            rest[k, :L] = (S[k] + rest[k + 1, 1:][None, :]).min(axis=1)
            top[k, :L] = np.maximum(np.where(np.isfinite(S[k]), G[k], np.inf), top[k + 1, 1:][None, :]).min(axis=1)
        rests.append(rest.tolist())
        tops.append(top.tolist())
    pairs_range = range(len(pairs))
    rows: dict[tuple[int, int], tuple[list[list[float]], list[list[float]]]] = {}  # (k, i): S and G rows, as read
    out: list[tuple[int, ...]] = []
    nodes = 0
    stack: list[tuple[int, int, tuple[float, ...], tuple[float, ...], tuple[int, ...]]] = [
        (0, 0, (0.0,) * len(pairs), (-np.inf,) * len(pairs), ())]
    while stack:
        k, i, partial, worst, cuts = stack.pop()
        hit = rows.get((k, i))
        if hit is None:
            hit = rows[k, i] = ([S[k, i].tolist() for S, _ in pairs], [G[k, i].tolist() for _, G in pairs])
        s_rows, g_rows = hit
        rest_rows = [r[k + 1] for r in rests]
        top_rows = [t[k + 1] for t in tops]
        ends = range(L - 1, L) if k == P - 1 else range(i, L - P + k + 1)
        for j in ends:
            nodes += 1
            if nodes > max_nodes:
                return None, max_nodes
            s = tuple(partial[e] + s_rows[e][j] for e in pairs_range)
            g = tuple(max(worst[e], g_rows[e][j]) for e in pairs_range)
            if any(s[e] + rest_rows[e][j + 1] + max(g[e], top_rows[e][j + 1]) >= cutoff for e in pairs_range):
                continue
            if k == P - 1:
                out.append((*cuts, j))
            else:
                stack.append((k + 1, j + 1, s, g, (*cuts, j)))
    return out, nodes
