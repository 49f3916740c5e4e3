"""Branch and bound over the search space (see :mod:`planner.search.space`), best bound first.

One heap of nodes, each with a lower bound on every plan below it (:mod:`planner.search.bounds`):
1. settings (micro-batch, dp, ZeRO, recompute, sequence parallelism), first with a quick compute-only bound,
   then, when they come up, with the strong one (memory, layer counts per stage);
2. a settings' choices of options (one pool-and-tp per used pool), bounded at their corner (every pool at
   its largest stage count) by the parts of the bound that cannot increase with more stages;
3. a choice's stage-count grid, as boxes of counts: a box of more than ``BOX_GRID`` combinations is cut in
   halves, each bounded at its corners (what falls with the counts at its largest, the layers every stage
   must hold at its least); a smaller one has each set of stage blocks bounded exactly (every combination
   of counts, or whole pools past ``MAX_GRID`` combinations, which makes the space incomplete);
4. a set of blocks: for each order of its pools, unless the blocks' bound with that layout's least
   transfers and its stages' positions already reaches the cutoff (:func:`planner.search.bounds.layout_floor`,
   no matrices built), the
   partition DP (:func:`planner.search.partition.solve_partition`) finds the partition minimising the lower
   bound of :mod:`planner.search.backend` (the layout's bound), and the cost model times that partition
   exactly.
The search stops when the least bound in the heap reaches the K-th best time: every unvisited plan is
provably no faster. Nodes whose bound already reaches it when they are created are never stored. Then the
visited layouts whose bound is below the K-th best, least bound first, have their other partitions below it
timed too (:meth:`_Search.exhaust`): the bound's best partition need not be the fastest, above all over slow
links, where the bound is loosest.

With a tie tolerance (``run(tie_tolerance=...)``, which ``planner.plan`` sets to
``planner.rules.TIE_TOLERANCE``) the cutoff is at least that fraction above the fastest time, so every plan
within it is timed, and the simplest of those (lower ZeRO, less recompute, smaller tp, fewer stages) is
returned first.

The best plan is proven optimal under the cost model when its time does not exceed the least bound of any
layout (visited or not) whose partitions below that bound were not all timed; otherwise the plan's
``lower_bound_s`` says how far from optimal it can be.
:class:`Limits` (the work limit of planner.solver.SolverOptions, an explicit work budget, a wall-clock time) may
stop it earlier, never before a plan is found.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import math
import time
from dataclasses import dataclass, field, replace
from typing import Callable, Iterator

import numpy as np

from planner.rules import simplicity_key
from planner.search import hetero
from planner.search.backend import Backend
from planner.search.interleave import chunk_mask, partition_allowed, pipeline_allowed
from planner.search.bounds import Profiles, QuickSettingsBound, layout_floor, lower_bounds, settings_lower_bound
from planner.search.partition import Partition, partitions_below, score, solve_partition, stage_bounds
from planner.search.space import Layout, Pins, Settings, StageOption, enumerate_settings, even_split, \
    interleaved_min_stages, max_stages, may_interleave, options_allowed, ordered_layouts, pool_options, \
    settings_allowed
from planner.search.tables import allocate
from planner.solver import SolverOptions
from planner.types import Cluster, Estimate, PipelineSpec, ReplicaSpec, StageSpec

log = logging.getLogger(__name__)
#: the attribute that marks the log record saying a limit stopped a search (a sweep says it once)
LIMIT_STOP = "search_limit_stop"
#: what raises each limit of a search, as its messages say
BUDGET_FIX = "raise the budget (--budget, budget=)"
WORK_FIX = "give it more work (--work, SolverOptions.work)"
TIME_FIX = "raise the time limit (--time-limit, time_limit_s=)"

# settings queue items: quick bound, counted bound, strong bound, heterogeneous stages (compute floor, then
# balanced floor)
_QUICK, _COUNTED, _STRONG, _HETERO, _HETERO_READY = 0, 1, 2, 3, 4
MAX_GRID = 20000  # stage-count combinations per choice before mixed layouts fall back to whole pools
# a box of stage counts with more combinations than this is split in halves (each bounded at its corners)
# rather than bounded count by count: large boxes are mostly pruned whole
BOX_GRID = 256
# partial partitions a visited layout's enumeration below the K-th best may take before the layout keeps its bound,
# and how many of them make a work unit (a unit is about one partition DP or one timing by the cost model; a
# partial partition costs a small fraction of that, measured in benchmarks/results/search.md)
EXHAUST_NODES = 20_000
NODES_PER_WORK_UNIT = 200
# layouts bounded by their floor per work unit (a floor costs a small fraction of a partition DP)
FLOORS_PER_WORK_UNIT = 8
# partial partitions all the enumerations of one search may take: past it the layouts left keep their bounds
EXHAUST_TOTAL_NODES = 200_000
# partitions below the K-th best a layout may have for them all to be timed (each timing is a cost-model estimate):
# past it the layout keeps its bound
EXHAUST_PLANS = 256
_REL_TOL = 1e-9
# The work limit (in work units, see Limits) of SolverOptions(work=1); SolverOptions.work multiplies it. An exact
# search gains nothing from stopping early, so the default is a deterministic safety stop rather than a trade of
# quality for time: sized so that every measured search (benchmarks/results/search.md) runs to completion far
# below it, it only ends a search larger than any measured.
DEFAULT_WORK_UNITS = 50_000


@dataclass(frozen=True, order=True)
class Candidate:
    """A timed plan: its iteration time under the cost model, and what defines it."""

    time_s: float
    settings: Settings
    layout: Layout
    last_layers: tuple[int, ...]
    bound_s: float = field(compare=False)  # the layout's lower bound (DP optimum)
    spec: PipelineSpec = field(compare=False, repr=False)
    estimate: Estimate = field(compare=False, repr=False)
    groups: tuple = ()  # a heterogeneous stage's replica groups (planner.search.hetero); () otherwise


@dataclass(frozen=True)
class Outcome:
    candidates: tuple[Candidate, ...]  # best first
    proven_optimal: bool
    lower_bound_s: float
    bounded: int  # plan shapes (settings x blocks) bounded
    solved: int  # layouts whose partition DP ran
    timed: int  # plans timed by the cost model
    complete_space: bool  # False when mixed layouts were restricted to whole pools
    timed_out: bool
    bound_violations: int  # plans the cost model timed below their bound (a backend inconsistency)
    time_s: float
    work: int = 0  # work units spent (see Limits)
    # the fastest plan found, where the first candidate is a simpler one within the tie tolerance of it
    fastest: Candidate | None = None
    vpp_values: tuple[int, ...] = ()  # the vpp values of the settings searched
    uneven: bool = False  # whether some settings allowed two stages or more (each its own layer count)


@dataclass(frozen=True, order=True)
class _Entry:
    """A heap node: a set of stage blocks (``counts[i]`` stages on ``options[i]``), or with ``choice`` a
    choice of options whose stage counts from ``lows`` up to ``counts`` (a box of the grid) are not bounded
    yet, or with ``hetero`` a
    heterogeneous single stage (:mod:`planner.search.hetero`) to time."""

    bound_s: float
    settings_index: int
    options: tuple[StageOption, ...]
    counts: tuple[int, ...]
    choice: bool = False
    lows: tuple[int, ...] = ()  # a choice's least stage counts (its box of counts is lows..counts)
    hetero: hetero.HeteroStage | None = field(default=None, compare=False)


def pipeline_spec(cluster: Cluster, global_batch: int, settings: Settings, layout: Layout,
                  last_layers: tuple[int, ...]) -> PipelineSpec:
    stages = tuple(StageSpec(first_layer=first, last_layer=last,
                             replicas=(ReplicaSpec(devices=devices, tp=option.tp, dp=settings.dp, cp=option.cp),))
                   for option, devices, (first, last) in zip(layout.options, allocate(cluster, layout, settings),
                                                             stage_bounds(last_layers)))
    return settings.pipeline(stages, global_batch)


def _count_grid(caps: list[int], num_layers: int, pinned_pp: int, max_stages: int,
                lows: tuple[int, ...] | None = None) -> tuple[np.ndarray, bool]:
    """Stage counts per option: every combination of low..cap (restricted to whole pools when too many)."""
    caps = [min(c, max_stages) for c in caps]
    lows = lows or (1,) * len(caps)
    size = float(np.prod([float(c - lo + 1) for c, lo in zip(caps, lows)]))
    if size <= MAX_GRID or len(caps) == 1:  # one pool: every stage count (at most one per layer)
        grid = np.array(list(itertools.product(*[range(lo, cap + 1) for lo, cap in zip(lows, caps)])), dtype=int)
        grid = grid.reshape(-1, len(caps))
        total = grid.sum(axis=1)
        grid = grid[(total <= num_layers) & (total <= max_stages) & ((total == pinned_pp) if pinned_pp else True)]
        return grid, True
    full = np.array([caps], dtype=int)
    total = full.sum(axis=1)
    return full[(total <= num_layers) & ((total == pinned_pp) if pinned_pp else True)], False


def _choices(profiles: Profiles, cluster: Cluster, settings: Settings, index: int, num_layers: int,
             global_batch: int, pins: Pins, cutoff: float = np.inf) -> list[_Entry]:
    """Every choice of options (one per used pool) under one settings whose corner bound is below ``cutoff``.

    A choice is bounded at its corner, every pool at its largest stage count, by the parts of the bound that
    do not increase with the stage counts (more stages hold more layers and leave fewer micro-batches
    outside the warm-up), so the corner bounds every count of the choice; a choice whose corner reaches the
    cutoff is dropped whole (the cutoff only decreases)."""
    m = settings.num_micro_batches(global_batch)
    stages_cap = min(num_layers, max_stages(settings, pins.shape.num_units, global_batch))
    per_pool = pool_options(cluster, settings, pins)
    options = [o for opts in per_pool for o in opts]
    column = {o: c for c, o in enumerate(options)}
    choices = []
    for choice in itertools.product(*[[None, *opts] for opts in per_pool]):
        chosen = tuple(o for o in choice if o is not None)
        if not options_allowed(settings, chosen, pins.uniform) or (stages_cap == 1 and len(chosen) > 1):
            continue
        caps = tuple(min(num_layers, stages_cap, o.most_stages(cluster, settings.dp)) for o in chosen)
        if (pins.pp and sum(caps) < pins.pp) or (settings.vpp > 1 and sum(caps) < 2):
            continue
        choices.append((chosen, caps))
    if not choices:
        return []
    corners = np.zeros((len(choices), len(options)), dtype=int)
    for r, (chosen, caps) in enumerate(choices):
        corners[r, [column[o] for o in chosen]] = caps
    bounds = lower_bounds(profiles.get_all(tuple(options), settings), corners, m, corners=True, vpp=settings.vpp,
                          memo=profiles.count_memo, cutoff_s=cutoff, ep_overlap=settings.ep_overlap)
    return [_Entry(float(b), index, chosen, caps, True, (1,) * len(caps))
            for (chosen, caps), b in zip(choices, bounds) if b < cutoff]


def _split(profiles: Profiles, settings: Settings, box: _Entry, num_layers: int, global_batch: int, pins: Pins,
           cutoff: float, num_units: int) -> list[_Entry]:
    """A box of stage counts cut in halves along every count with more than one value, each part bounded at
    its corners (:func:`planner.search.bounds.lower_bounds`: the parts that fall with the counts at its
    largest, those that grow at its least) and at least the box's bound; those below ``cutoff``."""
    stages_cap = min(num_layers, max_stages(settings, pins.shape.num_units, global_batch))
    halves = [[(lo, hi)] if lo == hi else [(lo, (lo + hi) // 2), ((lo + hi) // 2 + 1, hi)]
              for lo, hi in zip(box.lows, box.counts)]
    parts = []
    for part in itertools.product(*halves):
        lows, highs = tuple(p[0] for p in part), tuple(p[1] for p in part)
        if sum(lows) > stages_cap or (pins.pp and not sum(lows) <= pins.pp <= sum(highs)) \
                or (settings.vpp > 1 and sum(highs) < 2):
            continue
        parts.append((lows, highs))
    if not parts:
        return []
    m = settings.num_micro_batches(global_batch)
    bounds = lower_bounds(profiles.get_all(box.options, settings), np.array([h for _, h in parts]), m,
                          corners=True, vpp=settings.vpp, memo=profiles.count_memo, cutoff_s=cutoff,
                          lows=np.array([lo for lo, _ in parts]), ep_overlap=settings.ep_overlap)
    return [_Entry(max(float(b), box.bound_s), box.settings_index, box.options, highs, True, lows)
            for (lows, highs), b in zip(parts, bounds) if max(float(b), box.bound_s) < cutoff]


def _blocks(profiles: Profiles, cluster: Cluster, settings: Settings, choice: _Entry, num_layers: int,
            global_batch: int, pins: Pins, cutoff: float, num_units: int) -> tuple[list[_Entry], bool]:
    """The stage-count grid of one choice, each count bounded (one vectorised call), those below ``cutoff``;
    and whether the grid is complete (not restricted to whole pools). Interleaved settings keep the stage
    counts that may interleave (:func:`planner.search.interleave.pipeline_allowed`)."""
    cap = min(num_layers, max_stages(settings, pins.shape.num_units, global_batch))
    counts, full = _count_grid(list(choice.counts), num_layers, pins.pp, cap, choice.lows)
    m = settings.num_micro_batches(global_batch)
    even = even_split(settings)
    if settings.vpp > 1 or even:
        totals = counts.sum(axis=1)
        stage_counts = np.unique(totals)
        least = interleaved_min_stages(settings)
        allowed = stage_counts[[pipeline_allowed(int(t), m, settings.vpp, num_units, even, least)
                                for t in stage_counts]]
        counts = counts[np.isin(totals, allowed)]
    if not len(counts):
        return [], full
    bounds = lower_bounds(profiles.get_all(choice.options, settings), counts, m, vpp=settings.vpp,
                          memo=profiles.count_memo, cutoff_s=cutoff, ep_overlap=settings.ep_overlap)
    return [_Entry(float(bounds[r]), choice.settings_index, choice.options, tuple(int(c) for c in counts[r]))
            for r in np.flatnonzero(bounds < cutoff)], full


class _Search:
    """Mutable state of one branch-and-bound run (kept out of module globals)."""

    def __init__(self, backend: Backend, cluster: Cluster, global_batch: int, top_k: int, limits: Limits,
                 start: float, units: tuple[int, ...], tie_tolerance: float = 0.0,
                 admit: Callable[[Candidate], bool] | None = None) -> None:
        self.backend, self.cluster, self.global_batch, self.top_k = backend, cluster, global_batch, top_k
        self.admit = admit
        self.units = units
        self.limits, self.start = limits, start
        self.tie_tolerance = tie_tolerance
        self.best: list[Candidate] = []
        self.near: list[Candidate] = []  # every plan within the tie tolerance of the fastest so far
        self.timed = self.violations = self.work = 0
        self.least_layout_bound = np.inf

    def out_of_limits(self) -> bool:
        """Whether a limit is reached and a plan is in hand (without one, the search goes on)."""
        if not self.best:
            return False
        if self.limits.units is not None and self.work >= self.limits.units:
            return True
        return self.limits.time_s is not None and time.perf_counter() - self.start > self.limits.time_s

    def kth(self) -> float:
        """The K-th best time (inf until K plans are found): what a plan must beat to enter the result."""
        return self.best[-1].time_s if len(self.best) >= self.top_k else np.inf

    def cutoff(self) -> float:
        """Plans at or above this time cannot enter the result: the K-th best time, or past it the tie
        tolerance above the fastest (the simpler plans there are still wanted)."""
        if self.tie_tolerance > 0 and self.best:
            return max(self.kth(), self.best[0].time_s * (1.0 + self.tie_tolerance))
        return self.kth()

    def time(self, settings: Settings, layout: Layout, last: tuple[int, ...], bound: float | None,
             check: bool = True) -> Candidate | None:
        """Time a plan with the cost model. ``bound`` is the layout's lower bound (None: the plan is its
        layout's only partition, so its time is the bound); ``check``: the DP chose this partition, so the
        cost model must accept it and time it at or above the bound."""
        spec = pipeline_spec(self.cluster, self.global_batch, settings, layout, last)
        timed = self._evaluate(spec, bound, "a plan" if bound is not None and check else None, violation=True)
        if timed is None:
            return None
        time_s, estimate = timed
        return Candidate(time_s, settings, layout, last, time_s if bound is None else bound, spec, estimate)

    def _evaluate(self, spec: PipelineSpec, bound: float | None, admitted: str | None, violation: bool = False
                  ) -> tuple[float, Estimate] | None:
        """The cost model's time and estimate of ``spec`` (None when it does not fit), counted as work.
        ``admitted`` names what a bound admitted: its rejection is logged (and counted as a bound violation
        when ``violation``); a time below ``bound`` is always one."""
        estimate = self.backend.evaluate(spec)
        self.timed += 1
        self.work += 1
        if not estimate.feasible:
            if admitted is not None:
                log.info("search: the cost model rejects %s the bound admitted (%s)", admitted, estimate.reason)
                self.violations += violation
            return None
        time_s = float(estimate.iteration_time_s)
        if bound is not None and time_s < bound * (1 - 1e-6):
            log.warning("search: the cost model times a plan at %.6g s, below its bound %.6g s", time_s, bound)
            self.violations += 1
        return time_s, estimate

    def offer(self, cand: Candidate) -> None:
        if any(_same(c, cand) for c in self.best) or any(_same(c, cand) for c in self.near):
            return
        if self.admit is not None and not self.admit(cand):  # e.g. the sparse tables do not fit beside it
            return
        self.best.append(cand)
        self.best.sort()
        del self.best[self.top_k:]
        if self.tie_tolerance > 0:
            limit = self.best[0].time_s * (1.0 + self.tie_tolerance)
            self.near = [c for c in (*self.near, cand) if c.time_s <= limit]

    def chosen(self) -> tuple[list[Candidate], Candidate | None]:
        """The candidates best first, the simplest plan within the tie tolerance of the fastest first; and the
        fastest where it is not that plan."""
        if not self.best or self.tie_tolerance <= 0:
            return list(self.best), None
        fastest = self.best[0]
        limit = fastest.time_s * (1.0 + self.tie_tolerance)
        pick = min((c for c in (*self.near, fastest) if c.time_s <= limit), key=lambda c: (simplicity(c), c))
        if pick is fastest:
            return list(self.best), None
        return [pick, *[c for c in self.best if not _same(c, pick)]][:self.top_k], fastest

    def time_hetero(self, settings: Settings, stage: hetero.HeteroStage, bound: float,
                    num_layers: int) -> Candidate | None:
        """Time a heterogeneous single-stage plan; ``bound`` is its lower bound."""
        spec = hetero.hetero_spec(self.cluster, self.global_batch, settings, stage, num_layers)
        timed = self._evaluate(spec, bound, "a heterogeneous stage")
        if timed is None:
            return None
        time_s, estimate = timed
        first = stage.groups[0]
        return Candidate(time_s, settings, Layout((StageOption(first.pool, first.tp),)), (num_layers - 1,), time_s,
                         spec, estimate, stage.groups)

    def exhaust(self, visited: list[_Visited], settings_list: list[Settings], masks: dict) -> bool:
        """Time the other partitions of the visited layouts whose bound is below the K-th best time, least
        bound first (:func:`planner.search.partition.partitions_below`): the DP timed only the partition that
        minimises the layout's bound, and another may time faster. A layout whose partitions below it are all
        timed no longer bounds the result; the others (too many partitions, the enumerations' share of work
        spent, or a limit reached) keep their bound in ``least_layout_bound``. Returns whether a limit stopped
        it."""
        left = EXHAUST_TOTAL_NODES
        for visit in sorted(visited):
            if visit.bound_s >= self.kth():
                return False  # the rest are bounded at or above the K-th best
            # fewer than K plans (every partition would be wanted), or the enumerations' share spent
            if not np.isfinite(self.kth()) or left <= 0:
                return self._keep(visit, stopped=False)
            if self.out_of_limits():
                return self._keep(visit, stopped=True)
            settings = settings_list[visit.settings_index]
            pairs = list(_masked_matrices(self.backend, visit.layout, settings, self.global_batch,
                                          masks[visit.mask_key]))
            found, nodes = partitions_below(pairs, self.kth(), min(EXHAUST_NODES, left))
            left -= nodes
            self.work += 1 + nodes // NODES_PER_WORK_UNIT
            if found is None or len(found) > EXHAUST_PLANS:
                self._keep(visit, stopped=False)
                continue
            bounds = {last: max(score(S, G, last)[0] for S, G in pairs) for last in found}
            for last in sorted(found, key=lambda last: (bounds[last], last)):
                if last == visit.last_layers:
                    continue
                if self.out_of_limits():
                    return self._keep(visit, stopped=True)
                if bounds[last] >= self.kth():
                    break  # the K-th best improved since the enumeration: the rest are bounded above it
                cand = self.time(settings, visit.layout, last, bounds[last])
                if cand is not None:
                    self.offer(cand)
        return False

    def _keep(self, visit: _Visited, stopped: bool) -> bool:
        """A visited layout keeps its bound in ``least_layout_bound`` (with a limit's stop logged when
        ``stopped``); returns ``stopped``."""
        self.least_layout_bound = min(self.least_layout_bound, visit.bound_s)
        if stopped:
            self.limits.log_stop(self.work)
        return stopped

    def refine(self, cand: Candidate) -> Candidate:
        """Hill-climb the layer cuts of a plan whose time exceeds its layout's bound (the bound is exact for
        identical stages; uneven ones may time better after moving a cut by one layer). Stops at a local
        optimum or a limit."""
        current = cand
        L = current.last_layers[-1] + 1
        # the layout's bound matrices: a move whose partition's bound exceeds the current time cannot time
        # below it, so only the others are timed
        S, G = self.backend.stage_matrices(cand.layout, cand.settings, self.global_batch)
        improved = True
        while improved and current.time_s > cand.bound_s * (1 + _REL_TOL):
            improved = False
            cuts = current.last_layers[:-1]
            V = current.settings.vpp
            per_stage = sum(self.units) // len(current.last_layers) if even_split(current.settings) else None
            for k in range(len(cuts)):
                for step in ((-1, 1) if V == 1 else (-V, V)):
                    if self.out_of_limits():
                        return current
                    moved = list(cuts)
                    moved[k] += step
                    lo = moved[k - 1] + 1 if k > 0 else 0
                    hi = moved[k + 1] - 1 if k + 1 < len(moved) else L - 2
                    if not lo <= moved[k] <= hi or not partition_allowed(self.units, (*moved, L - 1), V, per_stage):
                        continue
                    if score(S, G, (*moved, L - 1))[0] * (1 - 1e-6) > current.time_s:
                        continue  # its bound already exceeds the time to beat: not timed
                    trial = self.time(current.settings, current.layout, (*moved, L - 1), cand.bound_s,
                                      check=False)
                    if trial is not None and trial < current:
                        current, improved = trial, True
                        break
                if improved:
                    break
        return current


@dataclass(frozen=True, order=True)
class _Visited:
    """A layout the search partitioned: its least bound, the order it came in (ties), its settings' index, the
    chunk mask's key and the partition the DP chose (timed)."""

    bound_s: float
    order: int
    settings_index: int = field(compare=False)
    layout: Layout = field(compare=False)
    mask_key: tuple = field(compare=False)
    last_layers: tuple[int, ...] = field(compare=False)


def _masked_matrices(backend: Backend, layout: Layout, settings: Settings, global_batch: int,
                    mask: np.ndarray | None) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """The layout's (S, G) under each of the backend's weightings, S infinite where ``mask`` (whole chunks per
    stage, :func:`planner.search.interleave.chunk_mask`) forbids a segment; built as they are read."""
    for exposure in backend.exposures(settings):
        S, G = backend.stage_matrices(layout, settings, global_batch, exposure)
        yield (S if mask is None else np.where(mask[None], S, np.inf)), G


def _least_bound_partition(backend: Backend, layout: Layout, settings: Settings, global_batch: int,
                           mask: np.ndarray | None, cutoff: float) -> Partition | None:
    """The partition minimising the layout's bound under each of the backend's weightings of the stages'
    synchronisation (:data:`planner.search.backend.EXPOSURES`), the one whose optimum is highest, with that
    optimum: every partition's time is at least each optimum. None when no partition fits or a weighting
    proves that none beats ``cutoff``."""
    best = None
    for S, G in _masked_matrices(backend, layout, settings, global_batch, mask):
        part = solve_partition(S, G, cutoff)
        if part is None:
            return None
        if best is None or part.objective > best.objective:
            best = part
    return best


def _same(a: Candidate, b: Candidate) -> bool:
    return a.settings == b.settings and a.layout == b.layout and a.last_layers == b.last_layers \
        and a.groups == b.groups


def simplicity(cand: Candidate) -> tuple[int, int, int, int]:
    """The tie rule's order of a plan (:func:`planner.rules.simplicity_key`): ZeRO, recompute, its largest
    tp, its stage count."""
    tps = [o.tp for o in cand.layout.options] + [g.tp for g in cand.groups]
    return simplicity_key(cand.settings.zero, cand.settings.recompute, max(tps), cand.layout.num_stages)


def settings_bound(profiles: Profiles, cluster: Cluster, settings: Settings, num_layers: int, global_batch: int,
                   pins: Pins, floor_s: float, num_units: int | None = None, cutoff_s: float = np.inf,
                   options: tuple[StageOption, ...] | None = None) -> float:
    """A lower bound for every plan with these settings (:func:`planner.search.bounds.settings_lower_bound`);
    inf for interleaved settings that no stage count may interleave. ``options``: every pool's options under
    these settings when the caller has them."""
    m = settings.num_micro_batches(global_batch)
    num_units = num_layers if num_units is None else num_units
    if settings.vpp > 1 and not may_interleave(m, settings.vpp, num_units, num_layers, 0, even_split(settings),
                                               interleaved_min_stages(settings)):
        return np.inf
    if options is None:
        options = tuple(o for opts in pool_options(cluster, settings, pins) for o in opts)
    caps = np.array([o.most_stages(cluster, settings.dp) for o in options], dtype=int)
    stages_cap = min(num_layers, max_stages(settings, num_units, global_batch))
    return settings_lower_bound(profiles.get_all(options, settings), caps,
                                settings.num_micro_batches(global_batch), num_layers, stages_cap,
                                cluster.num_devices, settings.dp, floor_s, settings.vpp, profiles.count_memo,
                                cutoff_s, settings.ep_overlap)


@dataclass(frozen=True)
class Limits:
    """When to stop before the search is complete, once it holds a plan (a limit never ends a search that has
    found none). Work units are deterministic on any machine: one per layout whose partition the DP solves and
    one per plan the cost model times (the costly steps), one per ``FLOORS_PER_WORK_UNIT`` layouts skipped by
    their transfers' bound and one per ``NODES_PER_WORK_UNIT`` partial partitions enumerated (bounding
    settings and stage-count grids is not counted). ``work_units`` is the work limit of the search's
    SolverOptions (:meth:`of`; None: past any count), ``budget`` an explicit cap in work units; the smaller of
    the two applies (:attr:`units`), since either asks the search to stop there. ``time_s`` is wall clock."""

    time_s: float | None = None
    budget: int | None = None
    work_units: int | None = DEFAULT_WORK_UNITS

    @classmethod
    def of(cls, time_s: float | None, budget: int | None, options: SolverOptions) -> Limits:
        """The limits of a search given ``options``: DEFAULT_WORK_UNITS x ``options.work`` work units, the
        nearest whole number and at least one (the search never stops before its first plan anyway)."""
        scaled = DEFAULT_WORK_UNITS * options.work
        return cls(time_s, budget, max(1, round(scaled)) if math.isfinite(scaled) else None)

    @property
    def units(self) -> int | None:
        """The work units the search may spend: the smaller of ``budget`` and ``work_units`` (None: no cap)."""
        return min((c for c in (self.budget, self.work_units) if c is not None), default=None)

    def log_stop(self, work: int) -> None:
        """Say which limit stopped a search after ``work`` units: info for a time limit (wall clock, whose stop
        depends on the machine's load), a warning naming the fix for a work limit, the budget's or the
        SolverOptions' (the same stop on any machine, leaving a plan that is not proven optimal; the default
        work limit is reached only by a search larger than any measured)."""
        marked = {LIMIT_STOP: True}
        if self.units is None or work < self.units:
            log.info("search: stopped at the time limit of %g s", self.time_s, extra=marked)
            return
        limit, fix = ("budget", BUDGET_FIX) if self.units == self.budget else ("work limit", WORK_FIX)
        log.warning("search: stopped at the %s of %d work units before the search was complete, so the plan is the "
                    "best found, not proven optimal; %s to search further", limit, self.units, fix, extra=marked)


def run(backend: Backend, cluster: Cluster, num_layers: int, global_batch: int, pins: Pins, top_k: int = 1,
        time_limit_s: float | None = None, progress: Callable[[float], None] | None = None,
        budget: int | None = None, units: tuple[int, ...] | None = None, interleave: bool = True,
        tie_tolerance: float = 0.0, options: SolverOptions | None = None,
        admit: Callable[[Candidate], bool] | None = None) -> Outcome:
    """Search the whole space, best bound first (see the module docstring); stop early at ``time_limit_s``
    seconds, ``budget`` work units or the work limit of ``options`` (:class:`Limits`; None:
    ``SolverOptions()``), whichever comes first, once a plan is found.
    ``units[l]`` is 1 when layer l is a pipeline unit (interleaved chunks split those;
    :func:`planner.rules.unit_flags`), default every layer; ``interleave``: search vpp > 1
    (unpinned) too. ``tie_tolerance`` > 0: every plan within that fraction of the fastest is searched too, and
    the simplest of them (:func:`simplicity`) comes first (``Outcome.fastest`` then holds the fastest); the
    lower bound stays one on every plan. ``admit`` (None: every plan that fits) may turn a timed plan away, as
    if it did not fit: the search goes on to the next plans, and the lower bound still counts the plans turned
    away (it is a bound on the plans the cost model accepts)."""
    limits = Limits.of(time_limit_s, budget, options or SolverOptions())
    start = time.perf_counter()
    units = tuple(units) if units is not None else (1,) * num_layers
    num_units = sum(units)
    pins = replace(pins, shape=replace(pins.shape, num_units=num_units))  # the stage cap reads the units
    settings_list = [s for s in enumerate_settings(cluster, global_batch, pins, num_units=num_units,
                                                   interleave=interleave) if settings_allowed(s, pins)]
    log.info("search: %d settings", len(settings_list))
    profiles = Profiles(backend)
    state = _Search(backend, cluster, global_batch, top_k, limits, start, units, tie_tolerance, admit)
    masks: dict[tuple[int, int | None], np.ndarray | None] = {}
    # every pool's options, by the settings' fields pool_options reads (dp; ep, expert tp, sequence parallelism)
    per_dp: dict[tuple, tuple[StageOption, ...]] = {}

    def options_of(s: Settings) -> tuple[StageOption, ...]:
        key = (s.dp, s.ep, s.expert_tp, s.sequence_parallel)  # what pool_options reads of the settings
        hit = per_dp.get(key)
        if hit is None:
            hit = per_dp[key] = tuple(o for opts in pool_options(cluster, s, pins) for o in opts)
        return hit

    # settings in increasing bound order: first a quick compute-only bound, then, when a settings comes up,
    # its strong bound (memory, layer counts); its blocks are bounded only when that can still win
    quick = QuickSettingsBound(backend, np.array([g.num_devices for g in cluster.groups], dtype=float), num_layers)
    queue: list[tuple[float, int, int]] = []
    floors: dict = {}  # heterogeneous stages' compute floors, per layer-table settings
    # the quick bounds depend on compute alone: the ZeRO stages (and optimizers) share them
    quick_memo: dict[tuple, float] = {}

    def quick_bound(s: Settings, counted: bool) -> float:
        stages = min(num_layers, max_stages(s, num_units, global_batch)) if counted else 0
        key = (s.dp, s.micro_batch, s.recompute, s.sequence_parallel, s.dtype, s.runtime, s.vpp, counted and stages,
               s.ep, s.expert_tp, s.ep_overlap)
        hit = quick_memo.get(key)
        if hit is None:
            options = options_of(s)
            m = s.num_micro_batches(global_batch)
            if counted:
                hit = quick.bound(options, s, m, [o.most_stages(cluster, s.dp) for o in options], stages)
            else:
                hit = quick.bound(options, s, m)
            quick_memo[key] = hit
        return hit

    for i, s in enumerate(settings_list):
        queue.append((quick_bound(s, False), i, _QUICK))
        if len(cluster.groups) > 1 and hetero.hetero_allowed(s, pins):  # its heterogeneous stages, when due
            queue.append((hetero.settings_floor(backend.layer_table, cluster, s, global_batch, pins, floors), i,
                          _HETERO))
    heapq.heapify(queue)
    heap: list[_Entry] = []
    visited: list[_Visited] = []  # the layouts partitioned, with their bounds
    expanded = bounded = solved = floored = 0
    complete = True
    timed_out = False
    unvisited = np.inf
    while True:
        top = heap[0].bound_s if heap else np.inf
        upcoming = queue[0][0] if queue else np.inf
        if min(top, upcoming) >= state.cutoff():
            break
        if state.out_of_limits():
            timed_out, unvisited = True, min(top, upcoming)
            limits.log_stop(state.work)
            break
        if upcoming <= top:
            quick_s, index, kind = heapq.heappop(queue)
            if kind == _QUICK:  # the layer-count bound on compute alone (shared by the ZeRO stages) next
                heapq.heappush(queue, (max(quick_bound(settings_list[index], True), quick_s), index, _COUNTED))
                continue
            if kind == _COUNTED:
                bound = settings_bound(profiles, cluster, settings_list[index], num_layers, global_batch, pins,
                                       quick_s, num_units, state.cutoff(), options_of(settings_list[index]))
                if np.isfinite(bound):
                    heapq.heappush(queue, (bound, index, _STRONG))
                continue
            if kind == _HETERO:  # its balanced floor first: most settings stop here
                floor = hetero.balanced_floor(profiles.get, cluster, settings_list[index], global_batch, pins)
                if np.isfinite(floor):
                    heapq.heappush(queue, (max(floor, quick_s), index, _HETERO_READY))
                continue
            if kind == _HETERO_READY:
                for bound, stage in hetero.candidates(profiles.get, cluster, settings_list[index], global_batch,
                                                      pins):
                    if bound < state.cutoff():
                        heapq.heappush(heap, _Entry(bound, index, (), (), hetero=stage))
                        bounded += 1
                continue
            expanded += 1
            found = _choices(profiles, cluster, settings_list[index], index, num_layers, global_batch, pins,
                             state.cutoff())
            bounded += len(found)
            for entry in found:
                heapq.heappush(heap, entry)
            if progress is not None:  # settings no longer waiting (their share never goes back)
                progress(expanded / max(expanded + len(queue), 1))
            continue
        entry = heapq.heappop(heap)
        settings = settings_list[entry.settings_index]
        if entry.hetero is not None:
            cand = state.time_hetero(settings, entry.hetero, entry.bound_s, num_layers)
            if cand is not None:
                state.least_layout_bound = min(state.least_layout_bound, cand.time_s)
                state.offer(cand)
            continue
        if entry.choice and np.prod([hi - lo + 1 for lo, hi in zip(entry.lows, entry.counts)]) > BOX_GRID:
            found = _split(profiles, settings, entry, num_layers, global_batch, pins, state.cutoff(), num_units)
            bounded += len(found)
            for box in found:
                heapq.heappush(heap, box)
            continue
        if entry.choice:
            found, full = _blocks(profiles, cluster, settings, entry, num_layers, global_batch, pins, state.cutoff(),
                                  num_units)
            complete &= full
            bounded += len(found)
            for block in found:
                heapq.heappush(heap, block)
            continue
        blocks = [(o.pool, o.tp, c, o.cp) for o, c in zip(entry.options, entry.counts)]
        even = even_split(settings)
        for layout in ordered_layouts(blocks):
            solved += 1
            if layout.num_stages == 1:
                state.work += 1
                cand = state.time(settings, layout, (num_layers - 1,), None)
                if cand is not None:
                    state.least_layout_bound = min(state.least_layout_bound, cand.time_s)
                    state.offer(cand)
                continue
            # every stage a whole number of equal chunks; the same number of units on every stage where the
            # runtime has no uneven pipeline
            per_stage = num_units // layout.num_stages if even else None
            floored += 1
            state.work += floored % FLOORS_PER_WORK_UNIT == 0
            if layout_floor(profiles, layout, settings, settings.num_micro_batches(global_batch),
                            entry.bound_s) >= state.cutoff():
                continue  # the layout's floor (transfers, stage positions) cannot beat the K-th best
            state.work += 1
            key = (settings.vpp, per_stage)
            if key not in masks:
                masks[key] = chunk_mask(units, settings.vpp, per_stage)
            part = _least_bound_partition(backend, layout, settings, global_batch, masks[key], state.cutoff())
            if part is None:
                continue  # no partition fits, or none can beat the K-th best
            visited.append(_Visited(part.objective, len(visited), entry.settings_index, layout, key,
                                    part.last_layers))
            cand = state.time(settings, layout, part.last_layers, part.objective)
            if cand is not None:
                state.offer(cand)
    if timed_out:
        state.least_layout_bound = min([state.least_layout_bound, *(v.bound_s for v in visited)])
    else:
        timed_out = state.exhaust(visited, settings_list, masks)
    if state.best and state.best[0].time_s > state.best[0].bound_s * (1 + _REL_TOL):
        state.offer(state.refine(state.best[0]))
    if progress is not None:
        progress(1.0)
    best_time = state.best[0].time_s if state.best else np.inf
    lower = min(best_time, state.least_layout_bound, unvisited)
    proven = bool(state.best) and complete and not timed_out and state.violations == 0 \
        and best_time <= lower * (1 + 1e-6)
    candidates, fastest = state.chosen()
    return Outcome(candidates=tuple(candidates), proven_optimal=proven, lower_bound_s=float(lower),
                   bounded=bounded, solved=solved, timed=state.timed, complete_space=complete,
                   timed_out=timed_out, bound_violations=state.violations, time_s=time.perf_counter() - start,
                   work=state.work, fastest=fastest, vpp_values=tuple(sorted({s.vpp for s in settings_list})),
                   uneven=any(min(num_layers, max_stages(s, num_units, global_batch)) > 1 and not even_split(s)
                              for s in settings_list))
