"""Branch and bound over the search space (see :mod:`planner.search.space`).

1. Enumerate every settings (micro-batch, dp, ZeRO, recompute, sequence parallelism) and, for each, every set of
   stage blocks (which pools, at which tp, with how many stages each); bound each one from below
   (:mod:`planner.search.bounds`) without choosing a layer partition.
2. Visit the blocks in increasing bound order. For each order of its pools, solve the layer partition exactly
   (:func:`planner.search.partition.solve_partition`) with the current K-th best as cutoff.
3. Stop when the next bound reaches the K-th best: every unvisited plan is provably no better. The result is
   then optimal under the backend's objective. A time limit stops the scan early; the bound of the first
   unvisited block is then a valid lower bound on the optimum.
"""

from __future__ import annotations

import itertools
import logging
import time
from dataclasses import dataclass
from typing import Callable

import numpy as np

from planner.search.backend import Backend
from planner.search.bounds import lower_bounds, option_profile
from planner.search.partition import solve_partition
from planner.search.space import Layout, Pins, Settings, StageOption, enumerate_settings, ordered_layouts, \
    tp_choices
from planner.search.tables import SegmentCache, stage_matrices
from planner.types import Cluster

log = logging.getLogger(__name__)

MAX_GRID = 20000  # stage-count combinations per pool set before mixed layouts fall back to whole pools


@dataclass(frozen=True, order=True)
class Candidate:
    """A solved plan shape: its objective under the backend, and what defines it."""

    objective_s: float
    settings: Settings
    layout: Layout
    last_layers: tuple[int, ...]


@dataclass(frozen=True)
class Outcome:
    candidates: tuple[Candidate, ...]  # best first
    proven_optimal: bool
    lower_bound_s: float
    bounded: int  # plan shapes (settings x blocks) bounded
    solved: int  # layouts whose partition was solved exactly
    dp_runs: int
    complete_space: bool  # False when mixed layouts were restricted to whole pools
    timed_out: bool
    time_s: float


@dataclass(frozen=True, order=True)
class _Entry:
    bound_s: float
    settings_index: int
    options: tuple[StageOption, ...]
    counts: tuple[int, ...]


def _count_grid(caps: list[int], num_layers: int, pinned_pp: int) -> tuple[np.ndarray, bool]:
    """Stage counts per option: every combination of 1..cap (restricted to whole pools when too many)."""
    if pinned_pp:
        rows = [c for c in itertools.product(*[range(1, cap + 1) for cap in caps]) if sum(c) == pinned_pp] \
            if np.prod([float(c) for c in caps]) <= MAX_GRID * 10 else [tuple(caps)] * (sum(caps) == pinned_pp)
        return np.array(rows, dtype=int).reshape(-1, len(caps)), True
    if float(np.prod([float(c) for c in caps])) <= MAX_GRID:
        grid = np.array(list(itertools.product(*[range(1, cap + 1) for cap in caps])), dtype=int)
        grid = grid[grid.sum(axis=1) <= num_layers]
        return grid.reshape(-1, len(caps)), True
    full = np.array([caps], dtype=int)
    return full[full.sum(axis=1) <= num_layers], False


def _entries(backend: Backend, cluster: Cluster, settings: Settings, index: int, num_layers: int, global_batch: int,
             pins: Pins) -> tuple[list[_Entry], bool]:
    m = settings.num_micro_batches(global_batch)
    per_pool: list[list[StageOption | None]] = []
    for pool, group in enumerate(cluster.groups):
        opts: list[StageOption | None] = [None]
        opts += [StageOption(pool, tp) for tp in tp_choices(cluster, pool, pins)
                 if tp * settings.dp <= group.num_devices]
        per_pool.append(opts)
    entries: list[_Entry] = []
    complete = True
    for choice in itertools.product(*per_pool):
        options = tuple(o for o in choice if o is not None)
        if not options:
            continue
        if settings.sequence_parallel and all(o.tp == 1 for o in options):
            continue  # identical to the plan without sequence parallelism
        caps = [min(num_layers, cluster.groups[o.pool].num_devices // (o.tp * settings.dp)) for o in options]
        counts, full = _count_grid(caps, num_layers, pins.pp)
        complete &= full
        if len(counts) == 0:
            continue
        profiles = [option_profile(backend, o, settings) for o in options]
        bounds = lower_bounds(backend, profiles, counts, settings, m)
        for row, bound in zip(counts, bounds):
            if np.isfinite(bound):
                entries.append(_Entry(float(bound), index, options, tuple(int(c) for c in row)))
    return entries, complete


def run(backend: Backend, cluster: Cluster, num_layers: int, global_batch: int, pins: Pins, top_k: int = 1,
        time_limit_s: float | None = None, progress: Callable[[float], None] | None = None) -> Outcome:
    start = time.perf_counter()
    settings_list = [s for s in enumerate_settings(cluster, global_batch, pins)
                     if not (s.dp == 1 and s.zero > 0 and pins.zero is None)]  # ZeRO shards across dp ranks
    entries: list[_Entry] = []
    complete = True
    for index, settings in enumerate(settings_list):
        found, full = _entries(backend, cluster, settings, index, num_layers, global_batch, pins)
        entries.extend(found)
        complete &= full
    entries.sort()
    log.info("search: %d settings, %d bounded plan shapes", len(settings_list), len(entries))
    cache = SegmentCache(backend)
    best: list[Candidate] = []
    solved = dp_runs = 0
    timed_out = False
    lower = np.inf
    for position, entry in enumerate(entries):
        cutoff = best[-1].objective_s if len(best) >= top_k else np.inf
        if entry.bound_s >= cutoff:
            break
        if time_limit_s is not None and time.perf_counter() - start > time_limit_s:
            timed_out, lower = True, entry.bound_s
            break
        if progress is not None:
            progress(position / len(entries))
        settings = settings_list[entry.settings_index]
        m = settings.num_micro_batches(global_batch)
        blocks = [(o.pool, o.tp, c) for o, c in zip(entry.options, entry.counts)]
        for layout in ordered_layouts(blocks):
            cutoff = best[-1].objective_s if len(best) >= top_k else np.inf
            A, R = stage_matrices(cache, layout, settings, m)
            alpha, beta = backend.coefficients(layout.num_stages, m, settings)
            part = solve_partition(A, R, alpha, beta, cutoff)
            solved += 1
            if part is None:
                continue
            dp_runs += part.dp_runs
            best.append(Candidate(part.objective, settings, layout, part.last_layers))
            best.sort()
            del best[top_k:]
    if progress is not None:
        progress(1.0)
    optimum = best[0].objective_s if best else np.inf
    lower = min(lower, optimum)
    return Outcome(candidates=tuple(best), proven_optimal=bool(best) and not timed_out and complete,
                   lower_bound_s=float(lower), bounded=len(entries), solved=solved, dp_runs=dp_runs,
                   complete_space=complete, timed_out=timed_out, time_s=time.perf_counter() - start)
