"""``shard_tables``: place embedding tables on (possibly mixed) devices, with a proven bound.

The order of work: (1) the LP relaxation over classes of identical devices; (2) the same with integral option
choices (a stronger bound that is still a relaxation, and a plan sketch; where it chose node-wide options, also
its choice without them); (3) greedy + local search guided by each, then ruin-and-recreate on the best plan,
then (3c) a large-neighbourhood search of exact sub-MILPs on up to 32 devices, (3d) option changes by table
kind, each placed exactly by device configurations (planner/embeddings/patterns.py); (4) on clusters of a few nodes,
the MILP with nodes as bins (a stronger bound still); (5) the exact per-device MILP on small instances,
started from the best plan so far; (6) with a large budget, the option search by kind again with more work
and configurations, then the bound of the configuration LP over device patterns
(planner/embeddings/pattern_bound.py), first at the plan within 3%; where that fails, (7) option
choices from that LP's last feasible box (planner/embeddings/pattern_primal.py), placed by the heuristics and,
with their variants without node-wide tables, exactly by device configurations, the best then improved by the
option search, and the bound's steps from the better plan. A budget past the default first runs steps (1)-(5) at the
default budget and starts its own steps from that plan where it is better, so it is never slower than the
default's. Every step is bounded by a count of work, not by the clock, so the answer does not depend on the
machine's speed. The result reports the slowest device's time, the best proven lower bound, and the gap between
them.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Mapping, NamedTuple, Sequence

import numpy as np

from planner.embeddings.devices import device_arrays
from planner.embeddings.heuristic import (Assignment, Work, greedy, heuristic, least_work_guide, local_search,
                                          rebuild)
from planner.embeddings.milp import (PIGEONHOLE_MAX_VARIABLES, Bins, SolveResult, class_bins, device_bins, node_bins,
                                    resolve_integer, solve)
from planner.embeddings.neighbourhood import LnsSettings, improve
from planner.embeddings.pattern_bound import PatternBound, PatternBoundSettings
from planner.embeddings.pattern_primal import choices as pattern_choices
from planner.embeddings.pattern_primal import without_node_units
from planner.embeddings.patterns import ChoiceSettings, PatternSettings, improve_choice, pattern_place
from planner.embeddings.problem import Problem, build_problem, even_split
from planner.errors import ConfigError, InfeasibleError
from planner.plans import EmbeddingPlacement, EmbeddingShard
from planner.types import Cluster, EmbeddingTable

log = logging.getLogger(__name__)

# The exact MILP runs when it has at most this many placement variables (tables x options x devices): up to
# here HiGHS closes the gap within a few seconds on the reference workloads; past it the heuristic's answer,
# with its gap to the LP bound, is the result. A larger time_limit_s raises it in proportion (time_limit_s = 60:
# 24,000, which takes in HugeCTR on 8 GPUs, 9,547 variables, whose root cuts alone lift the bound by 3%).
MILP_MAX_VARIABLES = 4000
# The node-level MILP (step 4) runs on clusters of at most this many nodes (past it HiGHS rarely closes it).
NODE_MILP_MAX_NODES = 4
# Work limits at time_limit_s = 10 (they scale with it): HiGHS interrupt checks per MILP (milp._WorkLimit) and
# device-time evaluations per heuristic run and for the final ruin-and-recreate (heuristic.Work). Counts, not
# seconds, so that the same input gives the same plan on any machine; sized so that every reference workload
# and the 1,000-table instance on 128 GPUs take at most about 10 s of CPU on a 2-core x86 machine
# (benchmarks/results/embeddings.md).
# A check costs more on bigger models (one re-solve of the LP relaxation is the typical work between two), so
# past LARGE_MILP_VARIABLES variables each MILP gets its _LARGE count.
MILP_WORK = 200
MILP_WORK_LARGE = 20
# The exact MILP of step (5) starts from the heuristic's plan (a first incumbent to prune against) and gets
# most of the budget where it is small: after its root (~2-3 s on DCNv2 on 8 GPUs) each check is about one
# branch-and-bound node, and on DCNv2 on 8 A100s it takes ~2,000 of them to lift the dual bound from the class
# bound (3.415 ms) to 3.449 ms; on 4 A100 + 4 V100 3,000 prove the optimum (9.968 ms; the bound was 9.725).
# Past LARGE_MILP_VARIABLES its root alone takes ~10 s (DCNv2 on 16 mixed GPUs), so it gets the small count.
EXACT_MILP_WORK = 3000
EXACT_MILP_WORK_LARGE = 40
LARGE_MILP_VARIABLES = 2000
# The class MILP of step (2) keeps the full count up to CLASS_LARGE_MILP_VARIABLES: there the extra checks lift
# the bound (HugeCTR on 128 A100s: 13.196 -> 13.249 ms for 0.6 s more CPU; on 64 A100s 24.208 -> 24.236 ms for
# 2.8 s; on 4 A100 + 4 V100, 4,243 variables, where the memory cut (f5) binds: 267.26 -> 274.96 ms for 5.4 s),
# past it they cost seconds for nothing (the 1,000-table instance). The guides without the cut (f4) are built
# only up to the size that still carries the cuts (f3), (f4) (milp.PIGEONHOLE_MAX_VARIABLES).
CLASS_LARGE_MILP_VARIABLES = 5000
# Small class MILPs (up to CLASS_SMALL_MILP_VARIABLES) get CLASS_MILP_WORK_SMALL checks: there each check is cheap
# and 200 stop short of optimality (Criteo on 64 A100 + 64 V100: bound 0.7939 ms at 200 checks, 1.1 s of CPU;
# 0.8035 ms, proven, at 5,000, 2.1 s; Criteo on 32 + 32: 1.2283 -> 1.2298 ms for 3 s more; every other
# reference workload closes it within 200).
CLASS_SMALL_MILP_VARIABLES = 1000
CLASS_MILP_WORK_SMALL = 5000
HEURISTIC_WORK = 8000
REBUILD_WORK = 8000
# The large-neighbourhood search (step 3c, planner/embeddings/neighbourhood.py): its work in HiGHS simplex
# iterations (60-370 us of CPU each here), and where it runs. Only on plans more than LNS_MIN_GAP above the
# bound so far (the 3% target) and on up to LNS_MAX_DEVICES devices: on the 64- and 128-GPU reference
# cases no neighbourhood (up to 32 devices, 2,000 checks, option changes included) improved the plan, while a
# round costs 0.5-3.5 s there. The steps before it spend CPU about in proportion to the tables (HugeCTR's 177
# tables on 8 GPUs: 5.9 s in the class and node MILPs), so past LNS_FULL_WORK_TABLES tables its work shrinks in
# proportion. DCNv2 on 4 A100 + 4 V100 reaches its proven optimum (9.968 ms) with about this much work.
LNS_WORK = 30_000
LNS_FULL_WORK_TABLES = 30
LNS_MIN_GAP = 0.03
LNS_MAX_DEVICES = 32
# The search over option choices by table kind (step 3d, planner/embeddings/patterns.py): each choice is placed
# exactly by device configurations; its work counts configurations, MILP columns, simplex iterations and HiGHS
# interrupt checks (patterns.ChoiceSettings). Runs on plans more than LNS_MIN_GAP above the bound, past
# LNS_MAX_DEVICES devices (below it the neighbourhood search and the exact MILP take that role; on DCNv2 on 8
# A100s it found nothing better there for 4 s of CPU). At this work it takes 1.6-3.0 s of CPU on HugeCTR on 64
# and 128 GPUs; 2x the work takes HugeCTR on 128 A100s from 14.304 to 14.216 ms, 6x to 14.107 ms.
CHOICE_WORK = 500_000
# The bound from device patterns (step 6, planner/embeddings/pattern_bound.py): a configuration LP by column
# generation whose pricing problems are small MILPs of ~0.03-0.3 s each, so it gets work only past
# PATTERN_BOUND_FREE_S of time_limit_s, PATTERN_BOUND_PRICING_PER_S pricing solves per second beyond (about what
# a 2-core x86 machine solves per second on HugeCTR on 64-128 GPUs); it runs where the plan is still more than
# LNS_MIN_GAP above the bound, and tries the plan within LNS_MIN_GAP first (with step 7, pattern_steps). With 3,000
# pricing solves (time_limit_s=360) DCNv2 on 64 A100s certifies 2.192 ms (class bound 2.167, plan 2.247; 333 s of
# CPU), HugeCTR on 32 A100 + 32 V100 gets a plan of 54.683 ms and a bound of 53.090 (215 s; BENCHMARKS.md).
PATTERN_BOUND_FREE_S = 60.0
PATTERN_BOUND_PRICING_PER_S = 10.0
# Step 7 also places each choice, and its variants without node-wide tables (pattern_primal.without_node_units),
# exactly by device configurations (patterns.pattern_place), until one beats the best plan so far, with more
# configurations and HiGHS checks than step 3d's (it places a few choices, not thousands of trial changes): on
# HugeCTR on 128 A100s the LP's choices need 30,000-40,000 configurations, and the first MILP of the one that
# places is not shown feasible within step 3d's 20 checks (30 do). More checks are not safe: the checks come
# ever further apart on some of these MILPs (another variant there: 34 s of CPU at 20 checks, over 3 minutes at
# 30 after a better plan was found -- hence the stop at the first success). The plan found then gets the option
# search by kind (step 3d's descent, no kicks) with 60 checks per trial. There, from the 60 s budget's plan of
# 14.153 ms: the LP's first choice with its 10-row tables data-parallel places at 13.968 ms, and the search
# takes it to 13.907 ms (about 250 s of CPU for the search). The same search (STEP7_CHOICE) also runs first,
# from the plan of steps 1-5, before the bound: its larger configuration limit reaches changes step 3d's cannot
# judge exactly (HugeCTR on 64 A100 + 64 V100: 5 tables of one kind table-wise -> table-row-wise and two
# 4-way column-wise, 29.625 -> 29.430 ms in 26 s of CPU, which the bound then certifies within 3%).
STEP7_PATTERNS = PatternSettings(configurations=100_000, checks=30, steps=4)
STEP7_CHOICE = ChoiceSettings(work=3_000_000, start=STEP7_PATTERNS,
                              pattern=PatternSettings(configurations=100_000, checks=60), kicks=0)


@dataclass(frozen=True)
class EmbeddingResult:
    placements: tuple[EmbeddingPlacement, ...]
    embedding_time_s: float  # the slowest device: forward + backward lookups and communication
    lower_bound_s: float  # the best proven bound: LP relaxation, integral-choice and node MILPs, exact MILP
    per_device_time_s: Mapping[int, float]  # global device id -> seconds
    per_device_memory_bytes: Mapping[int, float]  # global device id -> HBM bytes (weights + optimizer state)
    proven_optimal: bool
    method: str  # "milp" | "heuristic"
    gap: float  # (embedding_time_s - lower_bound_s) / lower_bound_s
    per_device_host_memory_bytes: Mapping[int, float] = field(default_factory=dict)  # UVM shards
    solve_time_s: float = 0.0
    optimizer: str = "adagrad"


DEFAULT_TIME_LIMIT_S = 10.0  # the work budget when none is given (planner plan without --time-limit)


def shard_tables(tables: Sequence[EmbeddingTable], cluster: Cluster, devices: Sequence[int] | None,
                 global_batch: int, *, optimizer: str = "adagrad",
                 memory_budget_bytes: Mapping[int, float] | None = None, time_limit_s: float = DEFAULT_TIME_LIMIT_S,
                 seed: int = 0, allow_host: bool = True) -> EmbeddingResult:
    """Shard ``tables`` over ``devices`` of ``cluster`` (all when None) for ``global_batch`` samples.

    ``memory_budget_bytes`` gives the bytes per device left for embeddings (default: the device's memory).
    ``time_limit_s`` sets how much work the search may do (the work limits above, scaled by time_limit_s / 10,
    up to 60; past 60 the rest goes to steps 6-7, PATTERN_BOUND_PRICING_PER_S pricing solves per second); the
    search never reads the clock, so the same input gives the same plan whatever the machine's speed. The wall
    time is about ``time_limit_s`` or less on the reference workloads (2-core x86) up to 60; past it, steps 6-7
    take what the bound needs (see benchmarks/results/embeddings.md).
    ``seed`` is accepted for API symmetry; the search is deterministic (ties broken by index).
    """
    del seed
    start = time.perf_counter()
    if not tables:
        raise ConfigError("shard_tables: no embedding tables were given")
    if global_batch <= 0:
        raise ConfigError(f"global batch must be a positive integer, got {global_batch}")
    if time_limit_s <= 0:
        raise ConfigError(f"--time-limit must be positive, got {time_limit_s}")
    names = [t.name for t in tables]
    if len(set(names)) != len(names):
        dup = next(n for n in names if names.count(n) > 1)
        raise ConfigError(f"embedding table {dup!r} appears twice; table names must be unique")
    dev = device_arrays(cluster, devices, memory_budget_bytes, allow_host)
    problem = build_problem(tables, dev, global_batch, optimizer)
    found = search_steps(problem, time_limit_s)
    assignment, bound, best, method, proven = found
    # (6)-(7) the bound from device patterns, and option choices from its LP, with a large budget
    pricing = int(PATTERN_BOUND_PRICING_PER_S * (time_limit_s - PATTERN_BOUND_FREE_S))
    if assignment is not None and pricing > 0 and best > bound * (1 + LNS_MIN_GAP) and not proven:
        stepped = pattern_steps(problem, assignment, best, bound, pricing)
        bound = max(bound, stepped.bound_s)
        if stepped.assignment is not None:
            assignment, best, method = stepped.assignment, stepped.best_s, "heuristic"
    if assignment is None:
        raise InfeasibleError(
            f"no placement of the {len(tables)} embedding tables fits the devices' memory within the "
            f"work limit of --time-limit {time_limit_s:g}; add devices, raise --time-limit, or use a smaller optimizer")
    bound = min(bound, best)  # HiGHS's tolerances can put a proven bound a hair above the plan it proves
    proven = proven or best <= bound * (1 + 1e-9)
    gap = (best - bound) / bound if bound > 0 else 0.0
    loads = problem.evaluate(assignment)
    times = problem.device_time_s(loads)
    log.info("embeddings: %d tables on %d devices, %.6f s (bound %.6f s, gap %.2f%%, %s) in %.2f s",
             len(tables), dev.count, best, bound, 100 * gap, method, time.perf_counter() - start)
    return EmbeddingResult(
        placements=placements(problem, assignment),
        embedding_time_s=float(best),
        lower_bound_s=float(bound),
        per_device_time_s={d: float(times[i]) for i, d in enumerate(dev.ids)},
        per_device_memory_bytes={d: float(loads.hbm_bytes[i]) for i, d in enumerate(dev.ids)},
        proven_optimal=bool(proven),
        method=method,
        gap=float(max(gap, 0.0)),
        per_device_host_memory_bytes={d: float(loads.host_bytes[i]) for i, d in enumerate(dev.ids)},
        solve_time_s=time.perf_counter() - start,
        optimizer=optimizer,
    )


def search_steps(problem: Problem, time_limit_s: float) -> _Found:
    """Steps (1)-(5) at the work of ``time_limit_s`` (see shard_tables), at most PATTERN_BOUND_FREE_S's (the rest
    of a larger budget goes to steps 6-7); past the default budget, from the default budget's plan."""
    effort = min(time_limit_s, PATTERN_BOUND_FREE_S) / 10.0
    default = None
    if effort > 1.0:
        # a larger budget first finds the default budget's plan and starts its own search from it where that
        # is better, so more time never gives a slower plan than the default (each step's search depends on its
        # start: on HugeCTR on 128 A100s 6x the work of every step alone gave 14.394 ms, the default 14.195 ms)
        default = _search(problem, 1.0, None)
    if default is not None and default.proven:
        found = default
    else:
        found = _search(problem, effort, default.assignment if default is not None else None)
        if default is not None:
            found = found._replace(bound_s=max(found.bound_s, default.bound_s))
            if default.assignment is not None and found.best_s >= default.best_s:  # nothing better
                found = default._replace(bound_s=found.bound_s, proven=found.proven or default.proven)
    return found


class _Found(NamedTuple):
    """What steps (1)-(5) found: the plan (None when none fits), the best proven bound, the plan's slowest
    device, how it was found ("heuristic" | "milp") and whether it is proven optimal."""

    assignment: Assignment | None
    bound_s: float
    best_s: float
    method: str
    proven: bool


def _search(problem: Problem, effort: float, seed: Assignment | None) -> _Found:
    """Steps (1)-(5) with every work limit scaled by ``effort``, from the best of the heuristic's plans and
    ``seed``."""

    def scaled(work: float) -> int:
        return max(int(round(work * effort)), 1)

    classes = class_bins(problem)
    class_size = _milp_size(problem, classes)
    # (1) the LP relaxation over classes of identical devices: a bound, and each table's preferred options
    relaxed = solve(problem, classes, integer=False, keep=True)
    if relaxed.status == "infeasible":
        raise _too_big_in_total(problem)
    bound = relaxed.bound_s if relaxed.status in ("optimal", "feasible") else 0.0
    # (2) the same with one option per table and whole units per class: still a relaxation of the per-device
    # problem (any plan aggregates to a solution of it), but it cannot mix options within a table
    guides = []
    class_work = (CLASS_MILP_WORK_SMALL if class_size <= CLASS_SMALL_MILP_VARIABLES
                  else _milp_work(class_size, threshold=CLASS_LARGE_MILP_VARIABLES))
    guide_work = scaled(_milp_work(class_size))  # the MILPs that only make guides get the plain count
    chosen = resolve_integer(problem, relaxed, work_limit=scaled(class_work))
    bound = max(bound, chosen.bound_s if chosen.status != "infeasible" else bound)
    if chosen.weights:
        guides.append(chosen.weights)
    guides.append(relaxed.weights)
    if class_size <= PIGEONHOLE_MAX_VARIABLES:
        # guides from the class LP and MILP without the excess cut (f4), which moves the option weights, not
        # always toward options whole devices can balance (Criteo on 64 A100 + 64 V100: 0.889 ms from the
        # guides with it, 0.840 ms with these too); only a guide, so the MILP gets the smaller work count
        plain = solve(problem, classes, integer=False, keep=True, excess=False)
        plain_chosen = resolve_integer(problem, plain, work_limit=guide_work)
        guides.extend(g for g in (plain_chosen.weights, plain.weights) if g)
    if chosen.weights and _uses_node_options(problem, chosen.weights):
        guides.append(_guide_without_node_options(problem, guide_work))
    guides.append(least_work_guide(problem))
    # (3) greedy + local search from each guide
    assignment, best = None, np.inf
    for guide in guides:
        candidate = heuristic(problem, guide, Work(scaled(HEURISTIC_WORK)))
        value = problem.makespan_s(candidate) if candidate is not None else np.inf
        if value < best:
            assignment, best = candidate, value
    seed_s = problem.makespan_s(seed) if seed is not None else np.inf
    if seed_s < best:
        assignment, best = seed, seed_s
    # (3b) ruin and recreate on the best plan so far
    if assignment is not None and best > bound * (1 + 1e-6):
        assignment = rebuild(problem, assignment, Work(scaled(REBUILD_WORK)))
        best = problem.makespan_s(assignment)
    # (3c) large-neighbourhood search: re-place (and re-shard) the units of a few devices at once, exactly
    if assignment is not None and best > bound * (1 + LNS_MIN_GAP) and problem.dev.count <= LNS_MAX_DEVICES:
        share = min(1.0, LNS_FULL_WORK_TABLES / len(problem.tables))
        assignment = improve(problem, assignment, LnsSettings(work=scaled(LNS_WORK * share)), target_s=bound)
        best = problem.makespan_s(assignment)
    # (3d) option changes by table kind, each placed exactly by device configurations, from the best plan's
    # option choice and the guides'
    if assignment is not None and best > bound * (1 + LNS_MIN_GAP) and problem.dev.count > LNS_MAX_DEVICES:
        starts = [[max(range(len(row)), key=lambda o: (row[o], -o)) for row in guide] for guide in guides]
        assignment = improve_choice(problem, assignment, bound, starts, ChoiceSettings(work=scaled(CHOICE_WORK)))
        best = problem.makespan_s(assignment)
    method, proven = "heuristic", False
    # (4) nodes as bins: which node carries which table is exact, devices inside a node are pooled
    nodes = node_bins(problem)
    if best > bound * (1 + 1e-6) and 1 < len(problem.dev.nodes) <= NODE_MILP_MAX_NODES \
            and not _same_bins(nodes, classes):  # one class per node: step (2) solved this model
        by_node = solve(problem, nodes, integer=True, work_limit=scaled(_milp_work(_milp_size(problem, nodes))))
        bound = max(bound, by_node.bound_s if by_node.status != "infeasible" else bound)
        if by_node.weights:
            candidate = heuristic(problem, by_node.weights, Work(scaled(HEURISTIC_WORK)))
            value = problem.makespan_s(candidate) if candidate is not None else np.inf
            if value < best:
                assignment, best = candidate, value
    # (5) the exact per-device MILP on small instances
    exact_size = _milp_size(problem)
    if exact_size <= MILP_MAX_VARIABLES * max(effort, 1.0) and best > bound * (1 + 1e-6):
        exact_work = _milp_work(exact_size, EXACT_MILP_WORK, EXACT_MILP_WORK_LARGE)
        exact: SolveResult = solve(problem, device_bins(problem), integer=True, work_limit=scaled(exact_work),
                                  incumbent=assignment)
        value = problem.makespan_s(exact.assignment) if exact.assignment is not None else np.inf
        if exact.assignment is not None and value > exact.objective_s * (1 + 1e-6):
            # the MILP's own slowest-device time bounds its plan's time under the cost model; if HiGHS hands
            # back a plan slower than its objective (seen in HiGHS 1.16 with a start solution and
            # presolve on other models), neither its bound nor its status can be trusted
            log.warning("embeddings: the exact MILP's objective %.6g s is below its plan's time %.6g s; "
                        "its bound is ignored", exact.objective_s, value)
        else:
            bound = max(bound, min(exact.bound_s, exact.objective_s))
            if exact.assignment is not None:
                if value < best * (1 - 1e-9) or assignment is None:
                    assignment, best, method = exact.assignment, value, "milp"
                proven = exact.status == "optimal"
                if proven:
                    bound = max(bound, min(best, exact.objective_s))
    return _Found(assignment, bound, best, method, proven)


class PatternSteps(NamedTuple):
    """What steps (6)-(7) found: a faster plan (None when none) and its slowest device, the bound certified, the
    pricing solves used."""

    assignment: Assignment | None
    best_s: float
    bound_s: float
    pricing_used: int


def pattern_steps(problem: Problem, assignment: Assignment, best_s: float, bound_s: float,
                  pricing: int) -> PatternSteps:
    """First the option search by kind (STEP7_CHOICE) from ``assignment``, the plan of steps 1-5 (``best_s``).
    (6) The bound from device patterns with ``pricing`` pricing solves, first at the best plan within
    LNS_MIN_GAP; where that fails, (7) option choices from the pattern LP's box it failed on (pattern_primal.py:
    the LP with exact per-device global units, its option counts fixed by diving), each placed by the greedy, local
    search, ruin and recreate and the option search by kind, at the default budget's work; then each, and its
    variants without node-wide tables, placed exactly by device configurations until one beats the best plan so
    far (STEP7_PATTERNS); a plan found there gets the option search by kind (STEP7_CHOICE). If one is faster, the
    bound tries the new plan within LNS_MIN_GAP first; then the bound's steps with what is left."""
    found, found_s = None, best_s

    def keep(candidate: Assignment | None) -> bool:
        nonlocal found, found_s
        value = problem.makespan_s(candidate) if candidate is not None else np.inf
        log.debug("pattern choice placed at %.6f s (best %.6f s)", value, found_s)
        if value < found_s * (1 - 1e-9):
            found, found_s = candidate, value
            return True
        return False

    keep(improve_choice(problem, assignment, bound_s, (), STEP7_CHOICE))
    searched = found
    patterns = PatternBound(problem, PatternBoundSettings(pricing_solves=pricing))
    tried_s = _goal_s(found_s)
    if bound_s < tried_s and patterns.goal(tried_s):
        return PatternSteps(found, found_s, patterns.steps(tried_s, found_s), pricing - patterns.pricing_left)
    starts = []
    for choice in pattern_choices(patterns):
        keep(_place_heuristically(problem, choice, bound_s))
        starts += [choice] + without_node_units(problem, choice)
    for start in starts:  # until one places below the best plan so far
        if keep(pattern_place(problem, start, bound_s, found_s, STEP7_PATTERNS)):
            break
    if found is not searched:
        keep(improve_choice(problem, found, bound_s, (), STEP7_CHOICE))
    start_s = bound_s
    goal_s = _goal_s(found_s)
    if goal_s < tried_s and bound_s < goal_s and patterns.goal(goal_s):
        start_s = goal_s
    return PatternSteps(found, found_s, patterns.steps(start_s, found_s), pricing - patterns.pricing_left)


def _place_heuristically(problem: Problem, choice: Sequence[int], bound_s: float) -> Assignment | None:
    """Option ``choice`` placed by the greedy, local search, ruin and recreate and the option search by kind, at
    the default budget's work; None when the greedy finds no placement within memory."""
    state = greedy(problem, choice, Work(HEURISTIC_WORK))
    if state is None:
        return None
    candidate = rebuild(problem, local_search(state).assignment(), Work(REBUILD_WORK))
    return improve_choice(problem, candidate, bound_s, [choice], ChoiceSettings(work=CHOICE_WORK))


def _goal_s(best_s: float) -> float:
    """The bound that puts ``best_s`` within LNS_MIN_GAP of it, a hair above (so the gap is below, not at it
    up to rounding)."""
    return best_s / (1 + LNS_MIN_GAP) * (1 + 1e-9)


def _uses_node_options(problem: Problem, weights) -> bool:
    return any(w > 0.5 and problem.options[t][o].scope == "node"
               for t, row in enumerate(weights) for o, w in enumerate(row))


def _guide_without_node_options(problem: Problem, work_limit: int) -> tuple[tuple[float, ...], ...]:
    """The class MILP's option choice when no table may be table-row-wise, as weights over all options.

    The class model spreads a node-wide (table-row-wise) table's load over every device of its class, although
    it loads only the devices of one node, so its choices can lean on node-wide options whole devices cannot
    balance. On Criteo on 64 A100 + 64 V100 the class MILP makes 5 tables table-row-wise; without that option it
    chooses 4 tables 16-way and 8 tables 8-way column-wise, from which the greedy finds 0.808 ms (0.840 from the
    other guides)."""
    keep = [tuple(o for o, option in enumerate(options) if option.scope != "node") for options in problem.options]
    flat = Problem(problem.tables, problem.dev, problem.global_batch, problem.optimizer,
                   tuple(tuple(problem.options[t][o] for o in kept) for t, kept in enumerate(keep)))
    relaxed = solve(flat, class_bins(flat), integer=False, keep=True)
    if relaxed.status == "infeasible":
        return tuple(tuple(0.0 for _ in options) for options in problem.options)
    chosen = resolve_integer(flat, relaxed, work_limit=work_limit)
    weights = chosen.weights or relaxed.weights
    guide = []
    for t, options in enumerate(problem.options):
        row = [0.0] * len(options)
        for j, o in enumerate(keep[t]):
            row[o] = weights[t][j]
        guide.append(tuple(row))
    return tuple(guide)


def _same_bins(a: Bins, b: Bins) -> bool:
    """Whether two binnings group the devices alike (then their MILPs are the same model)."""
    return sorted(tuple(m) for m in a.members) == sorted(tuple(m) for m in b.members)


def _milp_size(problem: Problem, bins: Bins | None = None) -> int:
    """Choice and placement variables of the MILP over ``bins`` (default: one bin per device)."""
    n_bins = problem.dev.count if bins is None else len(bins.members)
    n_nodes = len(problem.node_positions) if bins is None else len(bins.node_positions)
    size = 0
    for options in problem.options:
        for option in options:
            size += 1 + (n_bins if option.scope == "device" else n_nodes if option.scope == "node" else 0)
    return size


def _milp_work(size: int, small: int = MILP_WORK, large: int = MILP_WORK_LARGE,
               threshold: int = LARGE_MILP_VARIABLES) -> int:
    """The work limit (HiGHS interrupt checks, before scaling) of a MILP of ``size`` variables."""
    return small if size <= threshold else large


def _too_big_in_total(problem: Problem) -> InfeasibleError:
    from planner.embeddings.problem import shard_memory_bytes

    need = sum(shard_memory_bytes(t.rows, t.dim, t.dtype_bytes, problem.optimizer) for t in problem.tables)
    have = float(problem.dev.hbm_capacity_bytes.sum() + problem.dev.host_capacity_bytes.sum())
    biggest = max(problem.tables, key=lambda t: t.rows * t.dim * t.dtype_bytes)
    return InfeasibleError(
        f"the {len(problem.tables)} embedding tables need {need / 1e9:.3g} GB with their {problem.optimizer} "
        f"state (the largest, {biggest.name!r}, {shard_memory_bytes(biggest.rows, biggest.dim, biggest.dtype_bytes, problem.optimizer) / 1e9:.3g} GB), "
        f"but the {problem.dev.count} devices offer {have / 1e9:.3g} GB; add devices or use a smaller optimizer")


def placements(problem: Problem, assignment) -> tuple[EmbeddingPlacement, ...]:
    """The Plan's view of an assignment: per table its sharding, shards (device, rows, cols, memory) and kernel."""
    dev = problem.dev
    out = []
    for t, (o, positions) in enumerate(assignment):
        table, option = problem.tables[t], problem.options[t][o]
        memory = "host" if option.host else "hbm"
        shards: list[EmbeddingShard] = []
        sharding = option.sharding
        if option.sharding == "data_parallel":
            shards = [EmbeddingShard(d, (0, table.rows), (0, table.dim), memory) for d in dev.ids]
        elif option.scope == "device":
            cols = even_split(table.dim, option.units)
            for (c0, c1), p in zip(cols, positions):
                shards.append(EmbeddingShard(dev.ids[p], (0, table.rows), (c0, c1), memory))
            if option.sharding == "column_wise" and len({dev.node_of[p] for p in positions}) == 1 \
                    and len(dev.nodes) > 1:
                sharding = "table_column_wise"  # TorchRec's TWCW: every column shard inside one node
        else:
            members = dev.nodes[positions[0]] if option.scope == "node" else range(dev.count)
            for (r0, r1), i in zip(even_split(table.rows, len(members)), members):
                shards.append(EmbeddingShard(dev.ids[i], (r0, r1), (0, table.dim), memory))
        kernel = "fused_uvm" if option.host else "fused"
        out.append(EmbeddingPlacement(table=table.name, sharding=sharding, shards=tuple(shards),
                                      compute_kernel=kernel))
    return tuple(out)
