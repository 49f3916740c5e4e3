"""``shard_tables``: place embedding tables on (possibly mixed) devices, with a proven lower bound.

The search runs in stages, each named by what it does:

- **bound**: the LP relaxation over classes of identical devices, then the same with one option per table and
  whole units per class (a stronger bound that is still a relaxation; on large models only its incumbent, the
  root LP and its first cut round: milp.ROOT_ONLY_MIN_VARIABLES); their option weights, and those of a
  few variants (without the excess cut, without node-wide options, the least-work choice), are the *guides*;
- **placement**: from each guide, a greedy placement and local search (heuristic.py), then ruin and recreate on
  the best plan, then the first guides' choices packed against target times below it (heuristic.target_pack);
- **improvement**: on clusters of up to budget.NEIGHBOURHOOD_MAX_DEVICES devices, a large-neighbourhood search
  of exact sub-MILPs (neighbourhood.py); on larger ones, option changes by table kind, each placed exactly by
  device configurations (patterns.py); the improved plan's option choice packed against target times; then,
  on clusters of a few nodes, the MILP with nodes as bins (a stronger bound, and a guide), and where the
  budget covers it the exact per-device MILP, started from the best plan (a bound, and proof of optimality
  where it closes); where it does not, option changes followed by a local search: finer shards for the slowest
  device's units, then other options for the tables whose units pay all-to-all excess (heuristic.py);
- **branching** (once the plan is final, where it is not at its bound): best-first branching on the class LP's
  option choices, without cuts (branching.py), which lifts the bound where the LP splits a table between
  options and the class MILP stopped inside its root;
- **deep** (only with a budget past budget.STAGE_WORK_CAP times the default): the option search again with more
  configurations, then the bound of the configuration LP over device patterns (pattern_bound.py), and option
  choices from its LP (pattern_primal.py) placed by the heuristics and by device configurations.

Every stage's work is a count sized from the problem and ``SolverOptions.work`` (budget.py), never the clock, and
every random choice is drawn from ``SolverOptions.seed``: the same input gives the same plan on any machine. The
result reports the slowest device's time, the best proven lower bound, and the gap between them.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Mapping, NamedTuple, Sequence

import numpy as np

from planner.collector import collector_paused
from planner.embeddings.budget import (NEIGHBOURHOOD_MAX_DEVICES, NODE_MILP_MAX_NODES, DEEP_PATTERNS, Budget,
                                       budget)
from planner.embeddings.devices import DeviceArrays, device_arrays
from planner.embeddings.heuristic import (Assignment, Work, greedy, heuristic, least_work_guide, local_search,
                                          guide_choice, rebuild, reshard_excess, split_bottleneck,
                                          target_pack)
from planner.embeddings.branching import branch_bound
from planner.embeddings.milp import (PIGEONHOLE_MAX_VARIABLES, Bins, Kept, SolveResult, class_bins,
                                    copy_relaxation, device_bins, model_rows, node_bins, resolve_integer, solve)
from planner.embeddings.neighbourhood import improve
from planner.embeddings.pattern_bound import PatternBound, PatternBoundSettings
from planner.embeddings.pattern_primal import choices as pattern_choices
from planner.embeddings.pattern_primal import without_node_units
from planner.embeddings.patterns import improve_choice, pattern_place
from planner.embeddings.problem import (Problem, block_split, build_problem, check_tables_fit, even_split,
                                        shard_memory_bytes)
from planner.errors import ConfigError, InfeasibleError
from planner.plans import EmbeddingPlacement, EmbeddingShard
from planner.solver import SolverOptions
from planner.types import Cluster, EmbeddingTable

log = logging.getLogger(__name__)

# The deep stage first asks the pattern bound to certify the plan within this gap: one target's pricing, where
# climbing from the known bound in steps takes many; it climbs only where that fails.
DEEP_FIRST_GAP = 0.03
# Relative tolerance under which a plan counts as at its bound (float noise of the solvers).
AT_BOUND = 1e-6
# The placement stage ends by packing the first guides' choices (the class MILP's integral choice and the class
# LP's) against target times below its plan; with no plan yet, the bisection's upper end is this multiple of the
# bound.
PACKED_GUIDES = 2
PACK_NO_PLAN = 4.0
# The improvement stage's searches run on plans more than this above their bound: the cost model's own
# accuracy is coarser than this, so closer plans are not worth their work (the exact MILP still runs, for its
# proof).
IMPROVE_ABOVE_GAP = 0.01


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
    solve_time_s: float = 0.0  # wall time of the search (reported only; the search never reads the clock)
    optimizer: str = "adagrad"


# the search keeps its caches and candidates until it returns: the cyclic collector's full passes would walk
# them all and free nothing
@collector_paused()
def shard_tables(tables: Sequence[EmbeddingTable], cluster: Cluster, devices: Sequence[int] | None,
                 global_batch: int, *, optimizer: str = "adagrad",
                 memory_budget_bytes: Mapping[int, float] | None = None,
                 options: SolverOptions = SolverOptions(), allow_host: bool = True) -> EmbeddingResult:
    """Shard ``tables`` over ``devices`` of ``cluster`` (all when None) for ``global_batch`` samples.

    ``memory_budget_bytes`` gives the bytes per device left for embeddings (default: the device's memory).
    ``options.work`` sets how much work the search may do (a multiple of the default budget, budget.py) and
    ``options.seed`` seeds its random choices; the search never reads the clock, so the same input and options
    give the same plan whatever the machine's speed."""
    start = time.perf_counter()
    if not tables:
        raise ConfigError("shard_tables: no embedding tables were given")
    if global_batch <= 0:
        raise ConfigError(f"global batch must be a positive integer, got {global_batch}")
    names = [t.name for t in tables]
    if len(set(names)) != len(names):
        dup = next(n for n in names if names.count(n) > 1)
        raise ConfigError(f"embedding table {dup!r} appears twice; table names must be unique")
    dev = device_arrays(cluster, devices, memory_budget_bytes, allow_host)
    problem = build_problem(tables, dev, global_batch, optimizer, for_search=True)
    assignment, bound, best, method, proven = search(problem, options)
    plan_budget = budget(options)
    if assignment is not None and plan_budget.pricing_solves > 0 and best > bound * (1 + DEEP_FIRST_GAP) \
            and not proven:
        deep = deep_stage(problem, assignment, best, bound, plan_budget)
        bound = max(bound, deep.bound_s)
        if deep.assignment is not None:
            assignment, best, method = deep.assignment, deep.best_s, "heuristic"
    if assignment is None:
        raise InfeasibleError(
            f"no placement of the {len(tables)} embedding tables fits the devices' memory within the "
            f"search's work budget (work {options.work:g}); add devices, give the search more work, or use a "
            "smaller optimizer")
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


def check_capacity(tables: Sequence[EmbeddingTable], cluster: Cluster, devices: Sequence[int] | None,
                   global_batch: int, *, optimizer: str = "adagrad",
                   memory_budget_bytes: Mapping[int, float] | None = None, allow_host: bool = True) -> None:
    """Raise InfeasibleError where no placement of ``tables`` on ``devices`` (all when None) can fit, as
    :func:`shard_tables` takes them: a table that fits no device even row-sharded over all of them, or tables
    that need more than the devices' memory together. A quick test that :func:`shard_tables` may pass (it has
    finer constraints) but never fails where this passes for lack of capacity alone."""
    dev = device_arrays(cluster, devices, memory_budget_bytes, allow_host)
    check_tables_fit(tables, dev, global_batch, optimizer)
    need, have = _need_and_have(tables, dev, optimizer)
    if need > have:
        raise _too_big_in_total(tables, dev, optimizer)


class Found(NamedTuple):
    """What the bound, placement and improvement stages found: the plan (None when none fits), the best proven
    bound, the plan's slowest device, how it was found ("heuristic" | "milp") and whether it is proven optimal."""

    assignment: Assignment | None
    bound_s: float
    best_s: float
    method: str
    proven: bool


def search(problem: Problem, options: SolverOptions) -> Found:
    """The bound, placement and improvement stages at the budget of ``options`` (at most budget.STAGE_WORK_CAP
    times the default; the rest of a larger budget goes to the deep stage). A budget past the default first
    runs the default's stages and starts its own from that plan where it is better, so more work never gives a
    slower plan than the default (each stage's search depends on where it starts)."""
    if options.work <= 1.0:
        return run_stages(problem, budget(options), None)
    default = run_stages(problem, budget(options, stage_work=1.0), None)
    if default.proven:
        return default
    found = run_stages(problem, budget(options), default.assignment)
    bound = max(found.bound_s, default.bound_s)
    if default.assignment is not None and found.best_s >= default.best_s:  # nothing better
        return default._replace(bound_s=bound, proven=found.proven or default.proven)
    return found._replace(bound_s=bound)


def run_stages(problem: Problem, plan_budget: Budget, start: Assignment | None) -> Found:
    """The bound, placement and improvement stages within ``plan_budget``, from the best of the placements and
    ``start``."""
    clock = time.perf_counter()
    classes = class_bins(problem)
    bound, guides, relaxation = bound_stage(problem, classes, plan_budget)
    log.debug("embeddings: bound stage %.6f s, %d guides (%.2f s)", bound, len(guides), time.perf_counter() - clock)
    assignment, best = placement_stage(problem, guides, plan_budget, start, bound)
    log.debug("embeddings: placement stage %.6f s (%.2f s)", best, time.perf_counter() - clock)
    found = improvement_stage(problem, classes, guides, plan_budget, Found(assignment, bound, best, "heuristic", False))
    log.debug("embeddings: improvement stage %.6f s, bound %.6f s (%.2f s)", found.best_s, found.bound_s,
              time.perf_counter() - clock)
    if relaxation is not None and found.assignment is not None and not found.proven \
            and found.best_s > found.bound_s * (1 + AT_BOUND):
        # the plan is final; branching on the class LP's option choices only lifts the bound
        found = found._replace(bound_s=branch_bound(problem, relaxation, found.bound_s, found.best_s,
                                                    plan_budget.branch_evaluations()))
        log.debug("embeddings: branching on choices, bound %.6f s (%.2f s)", found.bound_s,
                  time.perf_counter() - clock)
    return found


def bound_stage(problem: Problem, classes: Bins, plan_budget: Budget) -> tuple[float, list, Kept | None]:
    """The class LP's bound and the class MILP's (integral option choices), the guides (per table, weights over
    its options that the placement starts from), and a copy of the class LP to branch on once the plan is final
    (None where the class MILP does not run)."""
    class_size = milp_size(problem, classes)
    relaxed = solve(problem, classes, integer=False, keep=True, milp_checks=plan_budget.bound_checks)
    if relaxed.status == "infeasible":
        raise _too_big_in_total(problem.tables, problem.dev, problem.optimizer)
    bound = relaxed.bound_s if relaxed.status in ("optimal", "feasible") else 0.0
    # one option per table and whole units per class: still a relaxation of the per-device problem (any plan
    # aggregates to a solution of it), but it cannot mix options within a table
    checks = plan_budget.bound_checks(model_rows(relaxed))
    # the LP to branch on once the plan is final (the MILP changes the kept model); where the budget does not
    # cover the MILP, one re-solve of its LP with every floor costs more than the branching's share too
    relaxation = copy_relaxation(relaxed) if checks else None
    chosen = resolve_integer(problem, relaxed, work_limit=checks, root_only=True) if checks else None
    guides = []
    if chosen is not None:
        bound = max(bound, chosen.bound_s if chosen.status != "infeasible" else bound)
        if chosen.weights:
            guides.append(chosen.weights)
    guides.append(relaxed.weights)
    plain_guides = class_size <= PIGEONHOLE_MAX_VARIABLES
    node_free = chosen is not None and bool(chosen.weights) and _uses_node_options(problem, chosen.weights)
    guide_milps = int(plain_guides) + int(node_free)
    if plain_guides:
        # the class LP and MILP without the excess cut (f4), which moves the option weights, not always toward
        # options whole devices can balance; only guides, so from the guides' share of the budget
        plain = solve(problem, classes, integer=False, keep=True, excess=False,
                      milp_checks=lambda rows: plan_budget.guide_checks(rows, guide_milps))
        plain_checks = plan_budget.guide_checks(model_rows(plain), guide_milps)
        if plain_checks:
            guides.extend(g for g in (resolve_integer(problem, plain, work_limit=plain_checks).weights,) if g)
        if plain.weights:
            guides.append(plain.weights)
    if node_free:
        guides.append(_guide_without_node_options(problem, plan_budget, guide_milps))
    guides.append(least_work_guide(problem))
    return bound, guides, relaxation


def placement_stage(problem: Problem, guides: list, plan_budget: Budget, start: Assignment | None,
                    bound: float) -> tuple[Assignment | None, float]:
    """The best of the greedy + local search from each guide and ``start``, then ruin and recreate on it, then
    packing against target times where that finds a faster plan."""
    assignment, best = None, np.inf
    evaluations = plan_budget.placement_evaluations(len(guides))
    for guide in guides:
        assignment, best = _faster(problem, heuristic(problem, guide, Work(evaluations)), assignment, best)
    start_s = problem.makespan_s(start) if start is not None else np.inf
    if start_s < best:
        assignment, best = start, start_s
    if assignment is not None and best > bound * (1 + AT_BOUND):
        assignment = rebuild(problem, assignment, Work(plan_budget.rebuild_evaluations()), seed=plan_budget.seed)
        best = problem.makespan_s(assignment)
    for guide in guides[:PACKED_GUIDES]:  # the same choices packed against targets between the bound and the plan
        if best <= bound * (1 + AT_BOUND):
            break
        candidate = target_pack(problem, guide_choice(problem, guide), bound,
                                best if np.isfinite(best) else PACK_NO_PLAN * bound, Work(evaluations))
        assignment, best = _faster(problem, candidate, assignment, best)
    return assignment, best


def _faster(problem: Problem, candidate: Assignment | None, assignment: Assignment | None,
            best: float) -> tuple[Assignment | None, float]:
    """``candidate`` and its slowest device's time where it is faster than ``best``, else ``assignment`` and
    ``best`` (a candidate that is None, or over memory, never is)."""
    value = problem.makespan_s(candidate) if candidate is not None else np.inf
    return (candidate, value) if value < best else (assignment, best)


def improvement_stage(problem: Problem, classes: Bins, guides: list, plan_budget: Budget, found: Found) -> Found:
    """The neighbourhood search (small clusters) or the option search by kind (large ones) on the best plan, then
    the node MILP and the exact per-device MILP where the budget covers them (where it does not cover the exact
    MILP, finer shards for the slowest device's units, then other options for the tables whose units pay
    all-to-all excess)."""
    assignment, bound, best, method, proven = found
    if assignment is not None and best > bound * (1 + IMPROVE_ABOVE_GAP):
        if problem.dev.count <= NEIGHBOURHOOD_MAX_DEVICES:
            # re-place (and re-shard) the units of a few devices at once, exactly
            assignment = improve(problem, assignment, plan_budget.neighbourhood(), target_s=bound)
        else:
            # option changes by table kind, each placed exactly by device configurations, from the best plan's
            # option choice and the guides'
            starts = [[max(range(len(row)), key=lambda o: (row[o], -o)) for row in guide] for guide in guides]
            assignment = improve_choice(problem, assignment, bound, starts, plan_budget.choice())
        best = problem.makespan_s(assignment)
        # the improved plan's own option choice packed against targets below it (heuristic.target_pack)
        candidate = target_pack(problem, [o for o, _ in assignment], bound, best,
                                Work(plan_budget.placement_evaluations(1)))
        assignment, best = _faster(problem, candidate, assignment, best)
    # nodes as bins: which node carries which table is exact, devices inside a node are pooled
    nodes = node_bins(problem)
    node_checks = plan_budget.node_checks(milp_size(problem, nodes))
    if best > bound * (1 + AT_BOUND) and 1 < len(problem.dev.nodes) <= NODE_MILP_MAX_NODES and node_checks \
            and not _same_bins(nodes, classes):  # one class per node: the class MILP solved this model
        by_node = solve(problem, nodes, integer=True, work_limit=node_checks)
        bound = max(bound, by_node.bound_s if by_node.status != "infeasible" else bound)
        if by_node.weights:
            candidate = heuristic(problem, by_node.weights, Work(plan_budget.placement_evaluations(1)))
            assignment, best = _faster(problem, candidate, assignment, best)
    exact_checks = plan_budget.exact_checks(milp_size(problem))
    if not exact_checks and assignment is not None and best > bound * (1 + AT_BOUND):
        # too large for the exact MILP: its share goes to finer shards for the slowest device's units, then (what
        # is left of it) to other options for the tables whose units pay all-to-all excess
        work = Work(plan_budget.split_evaluations())
        assignment = reshard_excess(problem, split_bottleneck(problem, assignment, work), work)
        best = problem.makespan_s(assignment)
    if exact_checks and best > bound * (1 + AT_BOUND):
        exact: SolveResult = solve(problem, device_bins(problem), integer=True, work_limit=exact_checks,
                                  incumbent=assignment)
        value = problem.makespan_s(exact.assignment) if exact.assignment is not None else np.inf
        if exact.assignment is not None and value > exact.objective_s * (1 + 1e-6):
            # the MILP's own slowest-device time bounds its plan's time under the cost model; if HiGHS hands
            # back a plan slower than its objective (seen in HiGHS 1.16 with a start solution and presolve on
            # other models), neither its bound nor its status can be trusted
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
    return Found(assignment, bound, best, method, proven)


class DeepResult(NamedTuple):
    """What the deep stage found: a faster plan (None when none) and its slowest device, the bound certified,
    the pricing solves used."""

    assignment: Assignment | None
    best_s: float
    bound_s: float
    pricing_used: int


def deep_stage(problem: Problem, assignment: Assignment, best_s: float, bound_s: float,
               plan_budget: Budget) -> DeepResult:
    """The option search by kind with more configurations (Budget.deep_choice) from ``assignment`` (slowest
    device ``best_s``); then the bound from device patterns with the budget's pricing solves, first at the
    target that puts the best plan within DEEP_FIRST_GAP. Where that fails, option choices from the pattern LP's
    box it failed on (pattern_primal.py), each placed by the greedy, local search, ruin and recreate and the
    option search at the default budget's work; then each, and its variants without node-wide tables, placed
    exactly by device configurations until one beats the best plan so far; a plan found there gets the deep
    option search. Then the bound's climb from the known bound (or from the new plan's first target)."""
    found, found_s = None, best_s
    pricing = plan_budget.pricing_solves

    def keep(candidate: Assignment | None) -> bool:
        nonlocal found, found_s
        value = problem.makespan_s(candidate) if candidate is not None else np.inf
        log.debug("pattern choice placed at %.6f s (best %.6f s)", value, found_s)
        if value < found_s * (1 - 1e-9):
            found, found_s = candidate, value
            return True
        return False

    keep(improve_choice(problem, assignment, bound_s, (), plan_budget.deep_choice()))
    searched = found
    patterns = PatternBound(problem, PatternBoundSettings(pricing_solves=pricing))
    tried_s = _goal_s(found_s)
    if bound_s < tried_s and patterns.goal(tried_s):
        return DeepResult(found, found_s, patterns.steps(tried_s, found_s), pricing - patterns.pricing_left)
    default = budget(SolverOptions(seed=plan_budget.seed))
    starts = []
    for choice in pattern_choices(patterns):
        keep(_place_heuristically(problem, choice, bound_s, default))
        starts += [choice] + without_node_units(problem, choice)
    for start in starts:  # until one places below the best plan so far
        if keep(pattern_place(problem, start, bound_s, found_s, DEEP_PATTERNS)):
            break
    if found is not searched:
        keep(improve_choice(problem, found, bound_s, (), plan_budget.deep_choice()))
    start_s = bound_s
    goal_s = _goal_s(found_s)
    if goal_s < tried_s and bound_s < goal_s and patterns.goal(goal_s):
        start_s = goal_s
    return DeepResult(found, found_s, patterns.steps(start_s, found_s), pricing - patterns.pricing_left)


def _place_heuristically(problem: Problem, choice: Sequence[int], bound_s: float,
                         plan_budget: Budget) -> Assignment | None:
    """Option ``choice`` placed by the greedy, local search, ruin and recreate and the option search by kind,
    within ``plan_budget``; None when the greedy finds no placement within memory."""
    state = greedy(problem, choice, Work(plan_budget.placement_evaluations(1)))
    if state is None:
        return None
    candidate = rebuild(problem, local_search(state).assignment(), Work(plan_budget.rebuild_evaluations()),
                        seed=plan_budget.seed)
    return improve_choice(problem, candidate, bound_s, [choice], plan_budget.choice())


def _goal_s(best_s: float) -> float:
    """The bound that puts ``best_s`` within DEEP_FIRST_GAP of it, a hair above (so the gap is below, not at it
    up to rounding)."""
    return best_s / (1 + DEEP_FIRST_GAP) * (1 + 1e-9)


def _uses_node_options(problem: Problem, weights) -> bool:
    return any(w > 0.5 and problem.options[t][o].scope == "node"
               for t, row in enumerate(weights) for o, w in enumerate(row))


def _guide_without_node_options(problem: Problem, plan_budget: Budget, guide_milps: int
                                ) -> tuple[tuple[float, ...], ...]:
    """The class MILP's option choice when no table may be table-row-wise, as weights over all options.

    The class model spreads a node-wide (table-row-wise) table's load over every device of its class, although
    it loads only the devices of one node, so its choices can lean on node-wide options whole devices cannot
    balance; without that option it chooses finer column splits, which whole devices can."""
    keep = [tuple(o for o, option in enumerate(options) if option.scope != "node") for options in problem.options]
    flat = Problem(problem.tables, problem.dev, problem.global_batch, problem.optimizer,
                   tuple(tuple(problem.options[t][o] for o in kept) for t, kept in enumerate(keep)))
    relaxed = solve(flat, class_bins(flat), integer=False, keep=True,
                    milp_checks=lambda rows: plan_budget.guide_checks(rows, guide_milps))
    if relaxed.status == "infeasible":
        return tuple(tuple(0.0 for _ in options) for options in problem.options)
    checks = plan_budget.guide_checks(model_rows(relaxed), guide_milps)
    chosen = resolve_integer(flat, relaxed, work_limit=checks) if checks else None
    weights = (chosen.weights if chosen is not None else ()) or relaxed.weights
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


def milp_size(problem: Problem, bins: Bins | None = None) -> int:
    """Choice and placement variables of the MILP over ``bins`` (default: one bin per device)."""
    n_bins = problem.dev.count if bins is None else len(bins.members)
    n_nodes = len(problem.node_positions) if bins is None else len(bins.node_positions)
    size = 0
    for options in problem.options:
        for option in options:
            size += 1 + (n_bins if option.scope == "device" else n_nodes if option.scope == "node" else 0)
    return size


def _need_and_have(tables: Sequence[EmbeddingTable], dev: DeviceArrays, optimizer: str) -> tuple[float, float]:
    """The bytes the tables need with their optimizer state, one copy each, and the devices' memory for them."""
    need = sum(shard_memory_bytes(t.rows, t.dim, t.dtype_bytes, optimizer) for t in tables)
    return float(need), float(dev.hbm_capacity_bytes.sum() + dev.host_capacity_bytes.sum())


def _too_big_in_total(tables: Sequence[EmbeddingTable], dev: DeviceArrays, optimizer: str) -> InfeasibleError:
    need, have = _need_and_have(tables, dev, optimizer)
    biggest = max(tables, key=lambda t: t.rows * t.dim * t.dtype_bytes)
    biggest_bytes = shard_memory_bytes(biggest.rows, biggest.dim, biggest.dtype_bytes, optimizer)
    return InfeasibleError(
        f"the {len(tables)} embedding tables need {need / 1e9:.3g} GB with their {optimizer} "
        f"state (the largest, {biggest.name!r}, {biggest_bytes / 1e9:.3g} GB), "
        f"but the {dev.count} devices offer {have / 1e9:.3g} GB; add devices or use a smaller optimizer")


def placements(problem: Problem, assignment) -> tuple[EmbeddingPlacement, ...]:
    """The Plan's view of an assignment: per table its sharding, shards (device, rows, cols, memory) and kernel."""
    dev = problem.dev
    out = []
    for t, (o, positions) in enumerate(assignment):
        table, option = problem.tables[t], problem.options[t][o]
        memory = "host" if option.host else "hbm"
        shards: list[EmbeddingShard] = []
        sharding = option.sharding
        # one range object per table serves all its shards: a data-parallel table on a thousand devices has a
        # thousand shards, and a plan may hold a million
        all_rows, all_cols = (0, table.rows), (0, table.dim)
        if option.sharding == "data_parallel":
            shards = [EmbeddingShard(d, all_rows, all_cols, memory) for d in dev.ids]
        elif option.scope == "device":
            cols = even_split(table.dim, option.units)
            for (c0, c1), p in zip(cols, positions):
                shards.append(EmbeddingShard(dev.ids[p], all_rows, (c0, c1), memory))
            if option.sharding == "column_wise" and len({dev.node_of[p] for p in positions}) == 1 \
                    and len(dev.nodes) > 1:
                sharding = "table_column_wise"  # TorchRec's TWCW: every column shard inside one node
        else:
            # TorchRec's row blocks over the members in device order (problem.block_sizes); a member whose block
            # is empty holds no shard (a Plan's shard ranges are non-empty), and the TorchRec export writes its
            # empty shard back
            members = dev.nodes[positions[0]] if option.scope == "node" else range(dev.count)
            for (r0, r1), i in zip(block_split(table.rows, len(members)), members):
                if r1 > r0:
                    shards.append(EmbeddingShard(dev.ids[i], (r0, r1), all_cols, memory))
        # TorchRec's kernels: a data-parallel table is a dense replica its optimizer updates with the dense
        # part's (the one kernel its DP sharder takes); a sharded table's lookup and update are fused
        kernel = "dense" if option.sharding == "data_parallel" else "fused_uvm" if option.host else "fused"
        out.append(EmbeddingPlacement(table=table.name, sharding=sharding, shards=tuple(shards),
                                      compute_kernel=kernel))
    return tuple(out)
