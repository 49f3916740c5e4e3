"""A lower bound by branching on option choices over the class LP: best first, no cuts.

The class LP (milp.py) may split a table between options, and a split is often worth more to it than any whole
option: a table whose column shards each receive every id of the table, say, taken 70% column-wise and 30%
table-row-wise. The class MILP makes every choice whole, but HiGHS spends its root node separating cuts, whose
cost per interrupt check varies a hundredfold between models of one size, so on all but small models the
budget stops it inside its root. Here the LP itself is branched on, as a MILP solver would without cuts:

- a *node* fixes some tables' choices (z[t,o] = 1, or z[t,o] = 0); its LP value bounds every plan whose choices
  agree with the fixings, and the two children of a node cover all of its plans, so the least value over the
  open nodes bounds every plan;
- each step takes the open node of least value, picks the table whose choice its LP splits most (how far the
  heaviest weight is from 1, times the bytes the table's options can move: lookups, ids and pooled outputs), and
  solves the LP of both children for the option o its LP weights most: z[t,o] = 1 and z[t,o] = 0;
- nodes whose value reaches the best plan's time are dropped (no plan under them is faster), and a node whose
  LP has every choice whole stays open with its value (it bounds its plans; branching on it would not lift it).

Each child's LP starts from its parent's basis: a child differs from its parent by one column's bounds, so a
few dual simplex iterations restore optimality, where the basis of whichever node was solved last (best first
jumps across the tree) may be far from it. The LP prices with Devex weights: HiGHS's default, dual steepest
edge, computes every row's weight afresh after a basis is set, which on these models costs more than the
iterations the parent's basis saves.

The work is simplex iterations, charged LP_ITERATION_EVALUATIONS_PER_ROW evaluations (the search's work unit,
heuristic.Work) per iteration and row of the LP; each solve may use only what is left, and a solve the limit
stops keeps its parent's value, which still bounds its plans.
"""

from __future__ import annotations

import heapq
import itertools
import logging

import numpy as np

from planner.embeddings.heuristic import Work
from planner.embeddings.highs import US_PER_S
from planner.embeddings.milp import DEVEX_EDGE_WEIGHTS, Kept
from planner.embeddings.problem import Option, Problem

log = logging.getLogger(__name__)

# What one simplex iteration of the class LP costs, per row of the LP, in evaluations of every device's time:
# both measured on the generated cases of benchmarks/embedding_generated.py (see benchmarks/results/embeddings.md).
LP_ITERATION_EVALUATIONS_PER_ROW = 1.0 / 400.0


def _bytes_moved(option: Option, devices: int) -> float:
    """The bytes ``option`` moves: its units' lookups, ids received and pooled outputs sent, and the ids and
    pooled outputs every device sends and receives for it."""
    own = option.units * (option.lookup_bytes + option.ids_recv_bytes + 2 * option.pool_send_bytes)
    return own + devices * (option.ids_send_bytes + 2 * option.pool_recv_bytes)


def branch_bound(problem: Problem, lp: Kept, lower_s: float, cutoff_s: float, evaluations: float) -> float:
    """The least LP value over the open nodes once ``evaluations`` are spent (or ``cutoff_s`` when no node below
    it is left), branching on the option choices of the class LP ``lp`` (milp.copy_relaxation; its column
    bounds are changed) whose value ``lower_s`` is known. A lower bound on every plan faster than ``cutoff_s``,
    in seconds, and never below ``lower_s``."""
    import highspy

    highs = lp.highs
    work = Work(evaluations)
    per_iteration = highs.getNumRow() * LP_ITERATION_EVALUATIONS_PER_ROW
    columns = [np.array([lp.choice[t, o] for o in range(len(options))], dtype=np.int64)
               for t, options in enumerate(problem.options)]
    moved = np.array([max(_bytes_moved(o, problem.dev.count) for o in options) for options in problem.options])
    everything = np.concatenate(columns)
    model = highs.getLp()
    lower = np.asarray(model.col_lower_)[everything]
    upper = np.asarray(model.col_upper_)[everything]
    cutoff = cutoff_s * US_PER_S  # the model's unit
    optimal = highspy.HighsModelStatus.kOptimal
    highs.setOptionValue("simplex_dual_edge_weight_strategy", DEVEX_EDGE_WEIGHTS)
    infeasible = (highspy.HighsModelStatus.kInfeasible, highspy.HighsModelStatus.kUnboundedOrInfeasible)

    def solve(fixings: tuple[tuple[int, float], ...], parent: float,
              basis: highspy.HighsBasis | None = None) -> tuple[float, list[np.ndarray] | None]:
        """The LP of a node (its value, and per table its choice weights; None when not solved to its end), from
        ``basis`` (its parent's) where given."""
        highs.changeColsBounds(len(everything), everything, lower, upper)
        for column, value in fixings:
            highs.changeColBounds(column, value, value)
        if basis is not None:
            highs.setBasis(basis)
        highs.setOptionValue("simplex_iteration_limit", max(int(work.left / per_iteration), 1))
        highs.run()
        work.spend(float(highs.getInfo().simplex_iteration_count) * per_iteration)
        status = highs.getModelStatus()
        if status in infeasible:
            return np.inf, None
        if status != optimal:
            return parent, None
        values = np.asarray(highs.getSolution().col_value)
        return max(float(highs.getInfo().objective_function_value), parent), [values[c] for c in columns]

    def branch_table(weights: list[np.ndarray]) -> int | None:
        split = np.array([1.0 - w.max() for w in weights])
        score = np.where(split > 1e-6, split * moved, 0.0)
        return int(np.argmax(score)) if score.max() > 0 else None

    order = itertools.count()
    value, weights = solve((), lower_s * US_PER_S)
    heap = [(value, next(order), (), weights, highs.getBasis())]  # the basis its children start from
    while heap and heap[0][0] < cutoff and not work.done:
        value, _, fixings, weights, basis = heap[0]
        table = branch_table(weights) if weights is not None else None
        if table is None:  # whole choices, or an LP the limit stopped: this node's value is final here
            break
        heapq.heappop(heap)
        column = int(columns[table][int(np.argmax(weights[table]))])
        for fixed in (1.0, 0.0):
            child = fixings + ((column, fixed),)
            child_value, child_weights = solve(child, value, basis)
            if child_value < cutoff:
                heapq.heappush(heap, (child_value, next(order), child, child_weights, highs.getBasis()))
    bound = min(heap[0][0], cutoff) if heap else cutoff
    log.debug("embeddings: branching on choices, %d open nodes, bound %.6f s", len(heap), bound / US_PER_S)
    return max(bound / US_PER_S, lower_s)
