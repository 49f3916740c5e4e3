"""The placement MILP and its LP relaxation (HiGHS, loaded from arrays), written like the paper.

Bins are the places loads are counted: single devices (the exact MILP), classes of interchangeable devices
(averaging any solution over the permutations of identical devices keeps it feasible without raising the
slowest device's time, so the class LP equals the per-device LP and is much smaller; with integral choices it
is a relaxation of the MILP that cannot mix options within a table), or whole nodes (node-wide units exact,
per-device units pooled inside their node: a relaxation between the two).

Variables
  z[t,o]    in {0,1}   table t uses option o
  u[t,o,b]  in {0..k}  column/table shards (units) of option o of table t placed in bin b   (device scope)
  v[t,o,m]  in {0,1}   option o of table t sits on node m (node class m for the LP)           (node scope)
  A[b], P[b] >= 0      the bin's ids and pooled all-to-all bytes: max(sent, received), summed over its devices
  T >= 0               the slowest device's embedding time
Objective  min T
Constraints
  (a) sum_o z[t,o] = 1                                             one option per table
  (b) sum_b u[t,o,b] = units(o) z[t,o];  sum_m v[t,o,m] = z[t,o]   every unit of the chosen option placed
  (c) A[b] >= n_b * IS;  A[b] >= IR[b];  P[b] >= n_b * PR;  P[b] >= PS[b]
        (IS/PR: ids sent / pooled bytes received by every device; IR/PS: ids received / pooled sent in bin b)
  (d) n_b T >= n_b base_b + C[b] + a2a_s_per_byte_b (A[b] + 2 P[b])          time of each device
  (e) HBM[b] <= sum of HBM capacities in b;  HOST[b] <= host capacities      memory, optimizer state included
  (f) T >= sum_o z[t,o] alone(t,o) + G - (t's own share of G) + sum_k y[k] latency_k  (valid cut): a table's
      unit alone on its best device, plus G, the lookups and collectives of every table sharded over all
      devices (row-wise, data-parallel; least over devices), and the global fused collectives' latency
  (f2) T >= base + compute(t,o) + G + latency + a2a_s_per_byte (A_t + 2 P_t), A_t >= max(IS, ids t's unit
      receives), P_t >= max(PR, pooled bytes t's unit sends): (f) with the all-to-all floor that follows every
      table's choice (each term its least over devices; valid cut, the main one on 64-128 devices); an LP no
      MILP follows gets only the floors its solution violates (see _Floors)
  (f3) (class and node bins, models up to PIGEONHOLE_MAX_VARIABLES) T >= base + G + latency + k c
      + a2a_s_per_byte (A + 2 P) for the device that holds k >= U / n_b of the U units of width >= w in bin b,
      k integer in the MILP (pigeonhole; valid cut)
  (f4) (class and node bins, models up to PIGEONHOLE_MAX_VARIABLES) A[b] >= n_b IS + the excess of each
      device-scope unit in b over IS, (ids it receives - IS)^+; P[b] alike with PR (superadditive per device;
      the products z x IS are bounded by w <= IS, w <= IS_max z; valid cut)
  (f5) (class and node bins) a device holds at most j device-scope units of more than 1/(j+1) of its memory
      (HBM units against HBM, host units against host memory), so bin b holds at most j n_b of them, j = 1, 2, 3
      (pigeonhole on memory; valid cut; the class model only sums memory over a bin)
  (g) (MILP) nodes of one class are interchangeable: their loads are ordered (symmetry breaking)
  (h) y[k] >= z or v for every table using fused collective k (data-parallel all-reduce, row-wise RS/AG,
      a node's table-row-wise RS/AG); its latency, y[k] x latency, joins C[b] of the devices it spans
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from planner.embeddings.highs import (GB_PER_BYTE, MB_PER_BYTE, US_PER_S, CheckLimit, has_incumbent, load_rows,
                                      quiet_highs, set_integer)
from planner.embeddings.problem import Problem

log = logging.getLogger(__name__)

# The pigeonhole cuts (f3) and the excess cut (f4) go into models of up to this many integer variables: past it
# they slow HiGHS's root node (more rows per variable) far more than they lift the bound.
PIGEONHOLE_MAX_VARIABLES = 3000
# The bound stage's class MILP stops after ROOT_ROUNDS cut rounds of its root on models of more than
# ROOT_ONLY_MIN_VARIABLES integer variables: it already holds its incumbent (HiGHS's completion of the LP's
# solution), the guide the placement needs, and the root LP with its first round gives most of the lift the
# root gives; on models this large each later round takes up to a second, and the analytic centre and central
# rounding HiGHS runs after the fifth 4 to 27 s, for a lift of tenths of a percent (benchmarks/results/
# embeddings.md, "The class MILP's root on large models").
ROOT_ONLY_MIN_VARIABLES = 5000
ROOT_ROUNDS = 1
# HiGHS's simplex_dual_edge_weight_strategy values: Devex, and HiGHS's own choice (its default).
DEVEX_EDGE_WEIGHTS, CHOSEN_EDGE_WEIGHTS = 1, -1


@dataclass(frozen=True)
class Bins:
    members: tuple[np.ndarray, ...]  # device indices per bin
    bin_of: np.ndarray  # bin per device
    node_positions: tuple[int, ...]  # representative node per node position
    aggregated: bool


@dataclass(frozen=True)
class SolveResult:
    status: str  # "optimal" | "feasible" | "infeasible" | "not_solved"
    objective_s: float
    bound_s: float  # best proven lower bound (the LP value for an LP)
    assignment: tuple[tuple[int, tuple[int, ...]], ...] | None
    time_s: float
    weights: tuple[tuple[float, ...], ...] = ()  # z[t][o], the LP's preference for each option
    handle: Kept | None = None  # the solved model, when kept for re-solving (resolve_integer)


INF = float("inf")


class _Model:
    """The model's columns and rows, collected in lists and loaded into HiGHS in one call each. Columns are
    numbered in creation order; a row is (columns, coefficients, lower, upper), its columns distinct.

    HiGHS gets the rows in the order they were written and the columns sorted by name: the LPs are degenerate,
    and which optimal vertex HiGHS returns (the guides' option weights, hence the plans) depends on the order,
    so the order is fixed by the names alone."""

    def __init__(self) -> None:
        self.names: list[str] = []
        self.lower: list[float] = []
        self.upper: list[float] = []
        self.integer: list[int] = []  # columns declared integer in this solve
        self.row_lower: list[float] = []
        self.row_upper: list[float] = []
        self.starts: list[int] = []
        self.index: list[int] = []
        self.values: list[float] = []

    def var(self, name: str, low: float, high: float | None, integer: bool = False) -> int:
        column = len(self.names)
        self.names.append(name)
        self.lower.append(low)
        self.upper.append(INF if high is None else high)
        if integer:
            self.integer.append(column)
        return column

    def row(self, columns: Sequence[int], coefficients: Sequence[float], low: float, high: float) -> None:
        self.starts.append(len(self.index))
        self.index.extend(columns)
        self.values.extend(coefficients)
        self.row_lower.append(low)
        self.row_upper.append(high)

    @property
    def rows(self) -> int:
        return len(self.starts)

    def move_rows(self, first: int, to: int) -> None:
        """Move the rows from ``first`` on to position ``to``, ahead of the rows from ``to`` to ``first``."""
        a, b = self.starts[to], self.starts[first]
        tail = len(self.index) - b
        self.starts[to:] = [s - b + a for s in self.starts[first:]] + [s + tail for s in self.starts[to:first]]
        self.index[a:] = self.index[b:] + self.index[a:b]
        self.values[a:] = self.values[b:] + self.values[a:b]
        self.row_lower[to:] = self.row_lower[first:] + self.row_lower[to:first]
        self.row_upper[to:] = self.row_upper[first:] + self.row_upper[to:first]

    def load(self, highs, objective: int) -> np.ndarray:
        """Send the model to ``highs`` (minimise column ``objective``); returns each column's HiGHS index."""
        n = len(self.names)
        order = np.array(sorted(range(n), key=self.names.__getitem__), dtype=np.int64)
        position = np.empty(n, dtype=np.int64)
        position[order] = np.arange(n)
        cost = np.zeros(n)
        cost[position[objective]] = 1.0
        highs.addCols(n, cost, np.array(self.lower)[order], np.array(self.upper)[order], 0,
                      np.zeros(n, dtype=np.int32), np.zeros(0, dtype=np.int32), np.zeros(0))
        if self.integer:
            set_integer(highs, position[self.integer])
        load_rows(highs, self.row_lower, self.row_upper, self.starts, position[np.array(self.index, dtype=np.int64)],
                  self.values)
        return position


@dataclass(frozen=True)
class Kept:
    """A solved model kept for re-solving as a MILP: HiGHS columns of the choices z[t,o] and of the variables
    that are integers in the MILP."""

    highs: object  # highspy.Highs
    choice: dict[tuple[int, int], int]
    integral: np.ndarray
    bins: Bins
    floors: tuple[_Floors, tuple[int, ...]] | None = None  # a lazy LP's floors (f2), and those it left out


def device_bins(problem: Problem) -> Bins:
    n = problem.dev.count
    return Bins(tuple(np.array([i]) for i in range(n)), np.arange(n), tuple(problem.node_positions), False)


def _grouped(problem: Problem, group_of: np.ndarray) -> tuple[tuple[np.ndarray, ...], np.ndarray]:
    """Bins of the devices that share ``group_of`` and their capacities: (members per bin, bin per device)."""
    dev = problem.dev
    keys = [(int(group_of[i]), float(dev.hbm_capacity_bytes[i]), float(dev.host_capacity_bytes[i]))
            for i in range(dev.count)]
    index = {key: b for b, key in enumerate(dict.fromkeys(keys))}
    bin_of = np.array([index[key] for key in keys], dtype=int)
    return tuple(np.flatnonzero(bin_of == b) for b in range(len(index))), bin_of


def class_bins(problem: Problem) -> Bins:
    """Bins of interchangeable devices (same class and same capacities); node positions by node class."""
    dev = problem.dev
    members, bin_of = _grouped(problem, dev.class_of)
    node_classes: dict[tuple[int, ...], int] = {}
    for k in problem.node_positions:
        node_classes.setdefault(tuple(sorted(bin_of[list(dev.nodes[k])])), k)
    return Bins(members, bin_of, tuple(node_classes.values()), True)


def node_bins(problem: Problem) -> Bins:
    """One bin per node (per node and capacity, where budgets differ): node-wide and global units land
    exactly, per-device units only up to their node. A relaxation of the per-device MILP that keeps which
    node carries which table, and a much smaller one."""
    members, bin_of = _grouped(problem, problem.dev.node_of)
    return Bins(members, bin_of, tuple(problem.node_positions), True)


def solve(problem: Problem, bins: Bins, *, integer: bool, work_limit: int | None = None,
          time_limit_s: float | None = None, keep: bool = False, excess: bool = True,
          incumbent: Sequence[tuple[int, Sequence[int]]] | None = None,
          milp_checks: Callable[[int], int] | None = None) -> SolveResult:
    """Solve the LP (``integer=False``) or the MILP over ``bins``. ``work_limit`` stops a MILP after that many
    of HiGHS's interrupt checks (deterministic, see :class:`CheckLimit`; None: to optimality);
    ``time_limit_s`` is a wall-clock limit for callers that want one (benchmarks), off by default because it
    makes the answer depend on the machine's speed. ``excess=False`` leaves the cut (f4) out (a guide for the
    heuristic: the cut moves the LP's option weights, not always toward options whole devices balance).
    ``incumbent`` (per-device bins only) is a plan handed to HiGHS as its first incumbent: its integer variables
    are fixed from it and HiGHS completes the rest, so the search prunes against it from the start.
    ``milp_checks`` gives the interrupt checks a MILP re-solved from this LP would get for the model's rows;
    where it gives none, no MILP follows and the LP leaves out the floors (f2) its solution does not violate
    (see :class:`_Floors`)."""
    import highspy

    start = time.perf_counter()
    dev = problem.dev
    nb = len(bins.members)
    size = np.array([len(m) for m in bins.members], dtype=float)
    rep = np.array([m[0] for m in bins.members])
    hbm_cap = np.array([dev.hbm_capacity_bytes[m].sum() for m in bins.members])
    host_cap = np.array([dev.host_capacity_bytes[m].sum() for m in bins.members])
    lp = _Model()
    T = lp.var("T", 0, None)
    # per bin: column -> coefficient (a dict, since a global unit touches several devices of one bin)
    compute: list[dict] = [defaultdict(float) for _ in range(nb)]
    ids_recv: list[dict] = [defaultdict(float) for _ in range(nb)]
    pool_send: list[dict] = [defaultdict(float) for _ in range(nb)]
    hbm: list[dict] = [defaultdict(float) for _ in range(nb)]
    host: list[dict] = [defaultdict(float) for _ in range(nb)]
    ids_send: list[tuple[int, float]] = []
    pool_recv: list[tuple[int, float]] = []
    choice: dict[tuple[int, int], int] = {}
    integral: list[int] = []  # the columns that are integers in the MILP
    fused: dict[tuple[str, int], int] = {}

    def use_fused(var: int, option, position: int) -> None:
        """(h) y[key] >= var: a fused collective's latency is paid once it carries any table."""
        key = problem.fused_key(option, position)
        if key is None:
            return
        y = fused.get(key)
        if y is None:
            y = fused[key] = lp.var(f"y_{key[0]}_{key[1]}", 0, 1, integer)
            integral.append(y)
            members, seconds = problem.fused_latency(key)
            for d in members:
                compute[bins.bin_of[d]][y] += seconds * US_PER_S
        lp.row((y, var), (1.0, -1.0), 0.0, INF)
    placed: dict[tuple[int, int], list[tuple[int, int]]] = {}

    def add_unit(var: int, t: int, o: int, position: int) -> None:
        unit = problem.unit(t, o, position)
        if len(unit.devices) == 1:
            b = bins.bin_of[unit.devices[0]]
            compute[b][var] += unit.compute_s[0] * US_PER_S
            if unit.ids_recv_bytes[0]:
                ids_recv[b][var] += unit.ids_recv_bytes[0] * MB_PER_BYTE
            if unit.pool_send_bytes[0]:
                pool_send[b][var] += unit.pool_send_bytes[0] * MB_PER_BYTE
            if unit.hbm_bytes[0]:
                hbm[b][var] += unit.hbm_bytes[0] * GB_PER_BYTE
            if unit.host_bytes[0]:
                host[b][var] += unit.host_bytes[0] * GB_PER_BYTE
            return
        # per bin, the sum over its devices in device order (bincount adds its weights in order); the bins of
        # the sparse loads only where some device has a nonzero load
        where = bins.bin_of[unit.devices]
        for loads, values, sparse in ((compute, unit.compute_s * US_PER_S, False),
                                      (ids_recv, unit.ids_recv_bytes * MB_PER_BYTE, True),
                                      (pool_send, unit.pool_send_bytes * MB_PER_BYTE, True),
                                      (hbm, unit.hbm_bytes * GB_PER_BYTE, True),
                                      (host, unit.host_bytes * GB_PER_BYTE, True)):
            touched = np.bincount(where, weights=values != 0, minlength=nb) if sparse else np.bincount(where)
            if not touched.any():
                continue
            sums = np.bincount(where, weights=values, minlength=nb)
            for b in np.flatnonzero(touched):
                loads[b][var] += sums[b]

    alones: list[list[tuple[int, float]]] = []
    for t, options in enumerate(problem.options):
        zs = []
        alone = []
        for o, option in enumerate(options):
            z = lp.var(f"z_{t}_{o}", 0, 1, integer)
            integral.append(z)
            choice[t, o] = z
            zs.append(z)
            alone.append((z, problem.unit_alone_s(t, o) * US_PER_S))
            if option.ids_send_bytes:
                ids_send.append((z, option.ids_send_bytes * MB_PER_BYTE))
            if option.pool_recv_bytes:
                pool_recv.append((z, option.pool_recv_bytes * MB_PER_BYTE))
            if option.scope == "global":
                use_fused(z, option, 0)
                add_unit(z, t, o, 0)
                placed[t, o] = [(0, z)]
                continue
            positions: Sequence[int] = (tuple(range(nb)) if option.scope == "device" else bins.node_positions)
            pos_vars = []
            for p in positions:
                target = int(rep[p]) if option.scope == "device" else p
                if not problem.fits_at(t, o, target):
                    continue  # one unit alone already overflows this position
                upper = option.units if option.scope == "device" else 1
                if bins.aggregated and option.scope == "device":
                    upper = None  # a class takes any number of units (bounded by (b))
                var = lp.var(f"u_{t}_{o}_{p}", 0, upper, integer)
                integral.append(var)
                pos_vars.append((p, var))
                use_fused(var, option, target)
                add_unit(var, t, o, target)
            placed[t, o] = pos_vars
            units = float(option.units)
            lp.row([var for _, var in pos_vars] + [z], [1.0] * len(pos_vars) + [-units], 0.0, 0.0)  # (b)
        lp.row(zs, [1.0] * len(zs), 1.0, 1.0)  # (a)
        alones.append(alone)
    G = _add_table_cuts(lp, problem, T, choice, fused, alones)
    IS, PR, latency, floors = _add_traffic_cuts(lp, problem, T, G, choice, fused, ids_send, pool_recv)
    floors_at = lp.rows
    if bins.aggregated and len(integral) <= PIGEONHOLE_MAX_VARIABLES:
        integral.extend(_add_pigeonhole_cuts(lp, problem, bins, T, G, IS, PR, latency, placed, integer))

    ids_excess: list[list[int]] = [[] for _ in range(nb)]
    pool_excess: list[list[int]] = [[] for _ in range(nb)]
    if excess and bins.aggregated and len(integral) <= PIGEONHOLE_MAX_VARIABLES:
        ids_excess, pool_excess = _excess_terms(lp, problem, nb, IS, PR, choice, placed)

    base = problem.base_time_s() * US_PER_S
    coef = dev.a2a_s_per_byte * US_PER_S / MB_PER_BYTE
    for b in range(nb):
        r = int(rep[b])
        A = lp.var(f"A_{b}", 0, None)
        P = lp.var(f"P_{b}", 0, None)
        if ids_excess[b]:  # (f4)
            lp.row([A, IS] + ids_excess[b], [1.0, -size[b]] + [-1.0] * len(ids_excess[b]), 0.0, INF)
        if pool_excess[b]:
            lp.row([P, PR] + pool_excess[b], [1.0, -size[b]] + [-1.0] * len(pool_excess[b]), 0.0, INF)
        lp.row((A, IS), (1.0, -size[b]), 0.0, INF)  # (c)
        lp.row([A, *ids_recv[b]], [1.0] + [-c for c in ids_recv[b].values()], 0.0, INF)
        lp.row((P, PR), (1.0, -size[b]), 0.0, INF)
        lp.row([P, *pool_send[b]], [1.0] + [-c for c in pool_send[b].values()], 0.0, INF)
        lp.row([T, A, P, *compute[b]], [size[b], -coef[r], -2.0 * coef[r]] + [-c for c in compute[b].values()],
               size[b] * base[r], INF)  # (d)
        if hbm[b]:  # (e)
            lp.row(list(hbm[b]), list(hbm[b].values()), -INF, hbm_cap[b] * GB_PER_BYTE)
        if host[b]:
            lp.row(list(host[b]), list(host[b].values()), -INF, host_cap[b] * GB_PER_BYTE)
    if bins.aggregated:
        _add_memory_pigeonhole_cuts(lp, problem, bins, placed)
    lazy = not integer and milp_checks is not None and not milp_checks(lp.rows + FLOOR_ROWS * len(floors.tables))
    if not lazy:  # every floor, in its place after (f)
        end = lp.rows
        floors.write(lp)
        lp.move_rows(end, floors_at)
    start_values: dict[int, float] = {}
    if integer:
        if incumbent is not None and not bins.aggregated:
            start_values = _start_values(problem, _symmetric_order(problem, incumbent), choice, placed, fused)
        _break_node_symmetry(lp, problem, bins, compute)

    highs = quiet_highs()
    if integer:
        highs.setOptionValue("mip_rel_gap", 1e-6)
    if time_limit_s is not None:
        highs.setOptionValue("time_limit", float(time_limit_s))
    if integer and work_limit is not None:
        CheckLimit(work_limit).attach(highs)
    position = lp.load(highs, T)
    if start_values:  # a partial solution (the integer variables): HiGHS completes it as its first incumbent
        highs.setSolution(len(start_values), position[np.array(list(start_values), dtype=np.int64)].astype(np.int32),
                          np.array(list(start_values.values()), dtype=np.float64))
    highs.run()
    pending = _lazy_floors(highs, floors.in_columns(position)) if lazy else None
    elapsed = time.perf_counter() - start
    solved, infeasible = _outcome(highs)
    if not solved or (integer and not has_incumbent(highs)):
        kind = "infeasible" if infeasible else "not_solved"
        return SolveResult(kind, float("inf"), _dual_bound(highs, integer, 0.0) / US_PER_S, None, elapsed)
    values = np.asarray(highs.getSolution().col_value)[position]  # per column, in creation order
    objective = float(values[T]) / US_PER_S
    proven = highs.getModelStatus() == highspy.HighsModelStatus.kOptimal
    bound = _dual_bound(highs, integer, objective * US_PER_S) / US_PER_S if integer else objective
    assignment = _extract(problem, bins, choice, placed, values) if integer else None
    weights = tuple(tuple(float(values[choice[t, o]]) or 0.0 for o in range(len(options)))
                    for t, options in enumerate(problem.options))
    kept = None
    if keep:
        kept = Kept(highs, {key: int(position[var]) for key, var in choice.items()},
                    position[np.array(integral, dtype=np.int64)], bins, pending)
    return SolveResult("optimal" if proven else "feasible", objective, bound, assignment, elapsed, weights, kept)


def _lazy_floors(highs, floors: _Floors) -> tuple[_Floors, tuple[int, ...]]:
    """Add to a solved LP the floors (f2) its solution violates and solve it again, until it violates none (see
    :class:`_Floors`); returns the floors and those still left out. The re-solves price with Devex weights: with
    HiGHS's default (dual steepest edge) each one first computes every row's weight afresh after the rows and
    columns are added, which on models of tens of thousands of rows costs about as much as the first solve, even
    where the re-solve then takes a few iterations."""
    import highspy

    left = set(range(len(floors.tables)))
    highs.setOptionValue("simplex_dual_edge_weight_strategy", DEVEX_EDGE_WEIGHTS)
    while left and highs.getModelStatus() == highspy.HighsModelStatus.kOptimal:
        values = np.asarray(highs.getSolution().col_value)
        violated = [t for t in floors.violated(values) if t in left]
        if not violated:
            break
        floors.add(highs, violated)
        left.difference_update(violated)
        highs.run()
    highs.setOptionValue("simplex_dual_edge_weight_strategy", CHOSEN_EDGE_WEIGHTS)
    return floors, tuple(sorted(left))


def _outcome(highs) -> tuple[bool, bool]:
    """(whether the solve left values to read, whether the model is infeasible) by HiGHS's model status: values
    are read at an optimum and where a limit or an interrupt stopped the solve (with a finite objective, for the
    time and iteration limits)."""
    import highspy

    status = highs.getModelStatus()
    s = highspy.HighsModelStatus
    if status in (s.kInfeasible, s.kUnboundedOrInfeasible):
        return False, True
    if status in (s.kTimeLimit, s.kIterationLimit):
        return highs.getObjectiveValue() != INF, False
    return status in (s.kOptimal, s.kObjectiveBound, s.kObjectiveTarget, s.kInterrupt), False


def copy_relaxation(relaxed: SolveResult) -> Kept:
    """A copy of the LP ``relaxed`` kept (solved with ``keep=True``) and its basis, for re-solving under other
    column bounds while the original goes on to its MILP. Floors (f2) a lazy LP left out stay out of the copy
    (a weaker relaxation, still a bound)."""
    kept = relaxed.handle
    highs = quiet_highs()
    highs.passModel(kept.highs.getModel())
    highs.setBasis(kept.highs.getBasis())
    return Kept(highs, kept.choice, kept.integral, kept.bins)


def model_rows(relaxed: SolveResult) -> int:
    """The constraints of the model ``relaxed`` kept (solved with ``keep=True``): what one of its re-solves
    costs grows with them."""
    kept = relaxed.handle
    left = len(kept.floors[1]) if kept.floors is not None else 0
    return int(kept.highs.getNumRow()) + FLOOR_ROWS * left  # the MILP gets the floors the LP left out


def resolve_integer(problem: Problem, relaxed: SolveResult, *, work_limit: int | None = None,
                    root_only: bool = False) -> SolveResult:
    """The MILP of the same bins as ``relaxed`` (an LP solved with ``keep=True``): the kept HiGHS model gets
    its choice, placement and latency variables declared integer and is solved again from the LP's basis,
    with no rebuild, for at most ``work_limit`` interrupt checks. ``root_only`` (with a ``work_limit``) stops it
    sooner on models of more than ROOT_ONLY_MIN_VARIABLES integer variables, after ROOT_ROUNDS cut rounds of its
    root. Returns the MILP's incumbent value, its dual bound and its option choices."""
    import highspy

    kept = relaxed.handle
    start = time.perf_counter()
    highs = kept.highs
    if kept.floors is not None and kept.floors[1]:
        kept.floors[0].add(highs, kept.floors[1])
    set_integer(highs, kept.integral)
    highs.setOptionValue("mip_rel_gap", 1e-6)
    if work_limit is not None:
        large = len(kept.integral) > ROOT_ONLY_MIN_VARIABLES
        CheckLimit(work_limit, ROOT_ROUNDS if root_only and large else None).attach(highs)
    highs.run()
    info = highs.getInfo()
    bound = float(info.mip_dual_bound) / US_PER_S if np.isfinite(info.mip_dual_bound) else relaxed.objective_s
    status = highs.getModelStatus()
    found = has_incumbent(highs)
    elapsed = time.perf_counter() - start
    if status == highspy.HighsModelStatus.kInfeasible:
        return SolveResult("infeasible", float("inf"), float("inf"), None, elapsed)
    if not found:
        return SolveResult("not_solved", float("inf"), max(bound, relaxed.objective_s), None, elapsed)
    values = highs.getSolution().col_value
    weights = tuple(tuple(float(round(values[kept.choice[t, o]])) for o in range(len(options)))
                    for t, options in enumerate(problem.options))
    objective = float(info.objective_function_value) / US_PER_S
    proven = status == highspy.HighsModelStatus.kOptimal
    return SolveResult("optimal" if proven else "feasible", objective,
                       objective if proven else max(bound, relaxed.objective_s), None, elapsed, weights)


def _add_table_cuts(lp: _Model, problem: Problem, T: int, choice: dict, fused: dict,
                    alones: list[list[tuple[int, float]]]) -> int:
    """(f) per table t: T >= alone(t, o) + the global work every device carries besides t (valid cut).

    Some device d carries a unit of t's chosen option o. Its time is at least t's unit alone on d (the
    all-to-all traffic every plan has included), plus the lookups and collectives of every other table
    sharded over all devices (row-wise, data-parallel: they touch every device, d included), plus the latency
    of each global fused collective in use (paid once on every device). Taking each term's minimum over the
    devices keeps it a lower bound. G = sum of the other tables' global work is one auxiliary variable, so the
    cut has O(options) terms per table. The latency of t's own global collective is counted once (in y, not
    in alone)."""
    global_keys = {key: y for key, y in fused.items() if key[0] in ("data_parallel", "row_wise")}
    work: list[tuple[int, float]] = []
    own: dict[int, dict] = defaultdict(dict)
    for (t, o), z in choice.items():
        option = problem.options[t][o]
        if option.scope == "global":
            least = float(np.min(problem.unit(t, o, 0).compute_s)) * US_PER_S
            work.append((z, least))
            own[t][z] = least
    G = lp.var("G", 0, None)
    lp.row([G] + [z for z, _ in work], [1.0] + [-c for _, c in work], 0.0, 0.0)
    latency = [(y, -problem.fused_latency(key)[1] * US_PER_S) for key, y in sorted(global_keys.items())]
    for t, alone in enumerate(alones):
        terms: dict = defaultdict(float)
        terms[T] += 1.0
        terms[G] -= 1.0
        for o, (z, a) in enumerate(alone):
            key = problem.fused_key(problem.options[t][o], 0) if problem.options[t][o].scope == "global" else None
            if key in global_keys:  # its latency is in y below
                a -= problem.fused_latency(key)[1] * US_PER_S
            terms[z] -= a
            terms[z] += own[t].get(z, 0.0)
        for y, c in latency:
            terms[y] += c
        lp.row(list(terms), list(terms.values()), 0.0, INF)
    return G


def _add_traffic_cuts(lp: _Model, problem: Problem, T: int, G: int, choice: dict, fused: dict,
                      ids_send: list[tuple[int, float]], pool_recv: list[tuple[int, float]]
                      ) -> tuple[int, int, list[tuple[int, float]], _Floors]:
    """(f2) per table t, the device d that carries a unit of t's option o (valid cut):

        T >= base + compute(t, o) + G + latency + a2a_s_per_byte x (A_t + 2 P_t)
        A_t >= ids every device sends (IS, all tables' choices),  A_t >= ids the unit receives
        P_t >= pooled bytes every device receives (PR),  P_t >= pooled bytes the unit sends

    where G is the global work of (f) (t's own included when t's option is global). Unlike (f), the
    all-to-all floor follows the other tables' choices instead of their least. Each term is its least over
    the devices (and positions) the unit may take, so the sum stays below every plan's slowest device.

    Returns IS, PR, the global collectives' latency terms and the floors, which the caller writes: all of them,
    except into an LP no MILP follows, which gets those its solution violates (see :class:`_Floors`)."""
    dev = problem.dev
    base = float(problem.base_time_s().min()) * US_PER_S
    coef = float(dev.a2a_s_per_byte.min()) * US_PER_S / MB_PER_BYTE
    IS = lp.var("IS", 0, None)
    PR = lp.var("PR", 0, None)
    lp.row([IS] + [z for z, _ in ids_send], [1.0] + [-c for _, c in ids_send], 0.0, 0.0)
    lp.row([PR] + [z for z, _ in pool_recv], [1.0] + [-c for _, c in pool_recv], 0.0, 0.0)
    latency = [(y, problem.fused_latency(key)[1] * US_PER_S) for key, y in sorted(fused.items())
               if key[0] in ("data_parallel", "row_wise")]
    floors = []
    for t, options in enumerate(problem.options):
        compute, recv, send = [], [], []
        for o, option in enumerate(options):
            z = choice[t, o]
            if option.scope == "device":
                c = float(problem.lookup_s(option).min())
                r, q = option.ids_recv_bytes, option.pool_send_bytes
            else:
                units = [problem.unit(t, o, p) for p in problem.distinct_positions(option)]
                c = 0.0 if option.scope == "global" else min(
                    float(u.compute_s.min()) + problem.fused_latency(problem.fused_key(option, p))[1]
                    for u, p in zip(units, problem.distinct_positions(option)))
                r = min(float(u.ids_recv_bytes.min()) for u in units)
                q = min(float(u.pool_send_bytes.min()) for u in units)
            if c:
                compute.append((z, -c * US_PER_S))
            if r:
                recv.append((z, -r * MB_PER_BYTE))
            if q:
                send.append((z, -q * MB_PER_BYTE))
        floors.append(_Floor(tuple(compute), tuple(recv), tuple(send)))
    return IS, PR, latency, _Floors(T, G, IS, PR, coef, base, tuple(latency), tuple(floors))


def _add_pigeonhole_cuts(lp: _Model, problem: Problem, bins: Bins, T: int, G: int, IS: int, PR: int,
                         latency: list[tuple[int, float]], placed: dict, integer: bool) -> list[int]:
    """(f3) per bin b of n_b devices and per width w (valid cut): if the bin holds U device-scope units (table
    or column shards) of width >= w, some device of b holds k >= U / n_b of them (k an integer in the MILP:
    the pigeonhole principle), so that device sends >= k x the pooled bytes of a width-w unit, receives >= k x
    the fewest ids of those units and looks up >= k x the least traffic of those units:

        T >= base + G + latency + k c_min + a2a_s_per_byte x (A_w + 2 P_w),
        A_w >= IS,  A_w >= k r_min,  P_w >= PR,  P_w >= k x batch x w x output bytes

    (each term its least over b's devices). The class LP averages units over a class; with whole units per
    class this puts them back on whole devices. Returns the k variables (integers in the MILP)."""
    dev = problem.dev
    counts = []
    for b, members in enumerate(bins.members):
        n_b = len(members)
        if n_b < 2:
            continue
        units = []  # (placement variable, option) of device-scope units that may go to bin b
        for (t, o), pos_vars in sorted(placed.items()):
            option = problem.options[t][o]
            if option.scope != "device":
                continue
            for p, var in pos_vars:
                if p == b:
                    units.append((var, option))
        base = float(problem.base_time_s()[members].min()) * US_PER_S
        coef = float(dev.a2a_s_per_byte[members].min()) * US_PER_S / MB_PER_BYTE
        for width in sorted({option.width for _, option in units}):
            chosen = [(var, option) for var, option in units if option.width >= width]
            if sum(option.units for _, option in chosen) <= n_b:
                continue  # never more than one per device: the per-table cuts (f2) already cover it
            send = min(option.pool_send_bytes for _, option in chosen)
            recv = min(option.ids_recv_bytes for _, option in chosen)
            work = min(float(problem.lookup_s(option, members).min()) for _, option in chosen)
            k = lp.var(f"k_{b}_{width}", 0, None, integer)
            counts.append(k)
            A = lp.var(f"Ak_{b}_{width}", 0, None)
            P = lp.var(f"Pk_{b}_{width}", 0, None)
            lp.row([k] + [var for var, _ in chosen], [float(n_b)] + [-1.0] * len(chosen), 0.0, INF)
            _add_floor_rows(lp, T, G, A, P, IS, PR, coef, base, latency, [(k, -work * US_PER_S)],
                            [(k, -recv * MB_PER_BYTE)], [(k, -send * MB_PER_BYTE)])
    return counts


def _excess_terms(lp: _Model, problem: Problem, nb: int, IS: int, PR: int, choice: dict, placed: dict
                  ) -> tuple[list[list[int]], list[list[int]]]:
    """(f4) the all-to-all excess of whole units, per bin (valid cut): per bin, the variables whose sum the
    bin's ids (pooled) all-to-all bytes exceed ``n_b IS`` (``n_b PR``) by at least.

    Device d's all-to-all bytes are ``max(IR_d, IS) + 2 max(PS_d, PR) = IS + 2 PR + (IR_d - IS)^+ + 2 (PS_d -
    PR)^+``. The bin constraints (c) average IR and PS over a bin, which loses both excess terms; but
    ``(sum_u r_u - IS)^+ >= sum_u (r_u - IS)^+`` over the units u on one device (IS >= 0), so the devices of a
    bin carry at least the excess of each of its device-scope units on its own (a table-wise shard of a
    pooling-200 table receives 105 MB of ids where every device sends 60 MB):

        A_b >= n_b IS + sum_(t,o) e_tob,   e_tob >= r_o x_tob - units(o) w_to,   e_tob >= 0,
        w_to <= IS,   w_to <= IS_max(t,o) z_to                                 (P_b, PR, f, v alike)

    where x_tob counts o's units in bin b and w_to stands for z_to x IS: with z_to = 1 the LP may take w = IS,
    so e >= r x - units IS, below the truth when one unit is in the bin and weaker when more are (valid; exact
    for table-wise units); with z_to = 0 both x and the bound vanish. IS_max(t,o) is the most ids any plan with
    option o sends. Options whose unit never exceeds the least IS (PR) of any plan with them are left out."""
    most_ids = sum(max(o.ids_send_bytes for o in options) for options in problem.options)
    least_ids = sum(min(o.ids_send_bytes for o in options) for options in problem.options)
    most_pool = sum(max(o.pool_recv_bytes for o in options) for options in problem.options)
    least_pool = sum(min(o.pool_recv_bytes for o in options) for options in problem.options)
    ids_excess: list[list[int]] = [[] for _ in range(nb)]
    pool_excess: list[list[int]] = [[] for _ in range(nb)]
    for t, options in enumerate(problem.options):
        own_ids = (max(o.ids_send_bytes for o in options), min(o.ids_send_bytes for o in options))
        own_pool = (max(o.pool_recv_bytes for o in options), min(o.pool_recv_bytes for o in options))
        for o, option in enumerate(options):
            if option.scope != "device":
                continue
            z = choice[t, o]
            for kind, unit_bytes, shared, most, least, out in (
                    ("e", option.ids_recv_bytes, IS, most_ids - own_ids[0] + option.ids_send_bytes,
                     least_ids - own_ids[1] + option.ids_send_bytes, ids_excess),
                    ("f", option.pool_send_bytes, PR, most_pool - own_pool[0] + option.pool_recv_bytes,
                     least_pool - own_pool[1] + option.pool_recv_bytes, pool_excess)):
                if unit_bytes <= least * (1 + 1e-9):
                    continue  # never above what every device sends (receives) anyway
                w = lp.var(f"w{kind}_{t}_{o}", 0, None)
                lp.row((w, shared), (1.0, -1.0), -INF, 0.0)
                lp.row((w, z), (1.0, -most * MB_PER_BYTE), -INF, 0.0)
                for b, x in placed[t, o]:
                    e = lp.var(f"{kind}_{t}_{o}_{b}", 0, None)
                    lp.row((e, x, w), (1.0, -unit_bytes * MB_PER_BYTE, float(option.units)), 0.0, INF)
                    out[b].append(e)
    return ids_excess, pool_excess


def _add_memory_pigeonhole_cuts(lp: _Model, problem: Problem, bins: Bins, placed: dict,
                                slack: int = 1) -> None:
    """(f5) per bin b and j = 1, 2, 3 (valid cut): a device holds at most j device-scope units of more than
    1 / (j + 1) of its memory (j + 1 of them would overflow it; HBM units against HBM, host units against host
    memory), so bin b holds at most j n_b of them. The class model only sums memory over a bin, which lets it
    put 3 tables of 60% of a device's memory on 2 devices. ``slack`` = 1 is the cut; tests pass a larger one
    (units of more than 1 / (j + slack): invalid) to check that brute force catches an invalid cut."""
    dev = problem.dev
    # per bin, its device-scope placement variables (by table and option) with their unit's memory
    in_bin: list[list[tuple[bool, float, int]]] = [[] for _ in bins.members]
    for (t, o), pos_vars in sorted(placed.items()):
        option = problem.options[t][o]
        if option.scope == "device":
            for p, var in pos_vars:
                in_bin[p].append((option.host, option.memory_bytes, var))
    for b, members in enumerate(bins.members):
        n_b = len(members)
        for host in (False, True):
            capacity = float((dev.host_capacity_bytes if host else dev.hbm_capacity_bytes)[members].max())
            for j in (1, 2, 3):
                big = [var for on_host, memory, var in in_bin[b] if on_host == host and memory * (j + slack) > capacity]
                if big:
                    lp.row(big, [1.0] * len(big), -INF, j * n_b)


Terms = tuple[tuple[int, float], ...]  # (column, minus its coefficient) pairs
FLOOR_ROWS = 5  # the rows of one floor (_floor_rows)


def _floor_rows(T: int, G: int, A: int, P: int, IS: int, PR: int, coef: float, base: float, latency: Terms,
                compute: Terms, recv: Terms, send: Terms) -> list[tuple[list[int], list[float], float, float]]:
    """The rows of one all-to-all floor, (f2) and (f3): A >= IS, A >= ids received, P >= PR, P >= pooled bytes
    sent, T >= base + G + latency + compute + coef (A + 2 P); ``compute``, ``recv`` and ``send`` are
    (column, minus its coefficient) pairs, ``latency`` (column, coefficient) pairs."""
    return [([A, IS], [1.0, -1.0], 0.0, INF),
            ([A] + [v for v, _ in recv], [1.0] + [c for _, c in recv], 0.0, INF),
            ([P, PR], [1.0, -1.0], 0.0, INF),
            ([P] + [v for v, _ in send], [1.0] + [c for _, c in send], 0.0, INF),
            ([T, G, A, P] + [v for v, _ in compute] + [y for y, _ in latency],
             [1.0, -1.0, -coef, -2.0 * coef] + [c for _, c in compute] + [-c for _, c in latency], base, INF)]


def _add_floor_rows(lp: _Model, T: int, G: int, A: int, P: int, IS: int, PR: int, coef: float, base: float,
                    latency: Terms, compute: Terms, recv: Terms, send: Terms) -> None:
    """Write one all-to-all floor's rows (:func:`_floor_rows`) into ``lp``."""
    for row in _floor_rows(T, G, A, P, IS, PR, coef, base, latency, compute, recv, send):
        lp.row(*row)


@dataclass(frozen=True)
class _Floor:
    """One table's all-to-all floor (f2): its options' compute, ids received and pooled bytes sent, each as
    (choice column, minus its coefficient) pairs."""

    compute: Terms
    recv: Terms
    send: Terms


@dataclass(frozen=True)
class _Floors:
    """The per-table floors (f2) and the columns and constants they share.

    An LP that no MILP follows gets them lazily: most floors of a model of thousands of tables are far from
    binding, and their 5 rows and 2 columns per table double the LP's solve. The LP is solved without them, the
    floors its solution violates are added, and it is solved again from its basis until none is violated; the
    last solution is then feasible for the model with every floor, and optimal for it since that model is more
    constrained, so the bound is the same. Every other model gets every floor, in its place after (f)."""

    T: int
    G: int
    IS: int
    PR: int
    coef: float
    base: float
    latency: Terms
    tables: tuple[_Floor, ...]

    def write(self, lp: _Model) -> None:
        """Every floor into ``lp``, with its own A and P columns."""
        for t, floor in enumerate(self.tables):
            A = lp.var(f"At_{t}", 0, None)
            P = lp.var(f"Pt_{t}", 0, None)
            _add_floor_rows(lp, self.T, self.G, A, P, self.IS, self.PR, self.coef, self.base, self.latency,
                            floor.compute, floor.recv, floor.send)

    def in_columns(self, position: np.ndarray) -> _Floors:
        """The same floors over HiGHS's column indices (``position``: creation index -> HiGHS index)."""
        def terms(pairs: Terms) -> Terms:
            return tuple((int(position[v]), c) for v, c in pairs)
        return _Floors(int(position[self.T]), int(position[self.G]), int(position[self.IS]), int(position[self.PR]),
                       self.coef, self.base, terms(self.latency),
                       tuple(_Floor(terms(f.compute), terms(f.recv), terms(f.send)) for f in self.tables))

    def violated(self, values: np.ndarray) -> list[int]:
        """The floors above the objective T in the solution ``values`` (per column), by a relative 1e-9."""
        def total(pairs: Terms) -> float:
            return -sum(c * values[v] for v, c in pairs)
        shared = self.base + values[self.G] + sum(c * values[y] for y, c in self.latency)
        limit = values[self.T] * (1 + 1e-9) + 1e-9
        return [t for t, f in enumerate(self.tables)
                if shared + total(f.compute) + self.coef * (max(values[self.IS], total(f.recv))
                                                            + 2.0 * max(values[self.PR], total(f.send))) > limit]

    def add(self, highs, which: Sequence[int]) -> None:
        """Floors ``which`` into a loaded ``highspy.Highs`` model (this object over its columns), each with two new
        columns."""
        first = int(highs.getNumCol())
        n = 2 * len(which)
        highs.addCols(n, np.zeros(n), np.zeros(n), np.full(n, INF), 0, np.zeros(0, dtype=np.int32),
                      np.zeros(0, dtype=np.int32), np.zeros(0))
        starts, index, values, lower, upper = [], [], [], [], []
        for i, t in enumerate(which):
            f = self.tables[t]
            for columns, coefficients, low, high in _floor_rows(
                    self.T, self.G, first + 2 * i, first + 2 * i + 1, self.IS, self.PR, self.coef, self.base,
                    self.latency, f.compute, f.recv, f.send):
                starts.append(len(index))
                index.extend(columns)
                values.extend(coefficients)
                lower.append(low)
                upper.append(high)
        load_rows(highs, lower, upper, starts, index, values)


def _dual_bound(highs, integer: bool, fallback: float) -> float:
    if not integer:
        return fallback
    value = float(highs.getInfo().mip_dual_bound)
    return value if np.isfinite(value) else 0.0


def _break_node_symmetry(lp: _Model, problem: Problem, bins: Bins, compute: list[dict]) -> None:
    """(g) Identical nodes (same bins pattern) carry non-increasing compute: swapping whole identical nodes
    maps a solution to one of equal value, so this keeps at least one optimum."""
    dev = problem.dev
    for nodes in _identical_nodes(problem):
        for k1, k2 in zip(nodes, nodes[1:]):
            terms: dict = defaultdict(float)
            for i in dev.nodes[k1]:
                for v, c in compute[bins.bin_of[i]].items():
                    terms[v] += c
            for i in dev.nodes[k2]:
                for v, c in compute[bins.bin_of[i]].items():
                    terms[v] -= c
            lp.row(list(terms), list(terms.values()), 0.0, INF)


def _identical_nodes(problem: Problem) -> list[list[int]]:
    """Nodes that can trade places (the same device classes and capacities, in order), grouped."""
    dev = problem.dev
    by_pattern: dict[tuple, list[int]] = {}
    for k, members in enumerate(dev.nodes):
        key = tuple((int(dev.class_of[i]), float(dev.hbm_capacity_bytes[i]), float(dev.host_capacity_bytes[i]))
                    for i in members)
        by_pattern.setdefault(key, []).append(k)
    return list(by_pattern.values())


def _symmetric_order(problem: Problem, assignment: Sequence[tuple[int, Sequence[int]]]):
    """The same plan with identical nodes relabelled so that their compute is non-increasing, as (g) requires
    (a relabelling of interchangeable nodes leaves every device's time and memory as they were)."""
    dev = problem.dev
    loads = problem.evaluate(assignment)
    compute = loads.compute_s + loads.latency_s  # as the MILP counts it: fused collectives' latency included
    device_map: dict[int, int] = {}
    node_map: dict[int, int] = {}
    for nodes in _identical_nodes(problem):
        order = sorted(nodes, key=lambda k: (-float(compute[list(dev.nodes[k])].sum()), k))
        for old, new in zip(order, nodes):
            node_map[old] = new
            device_map.update({int(a): int(b) for a, b in zip(dev.nodes[old], dev.nodes[new])})
    relabelled = []
    for t, (o, positions) in enumerate(assignment):
        scope = problem.options[t][o].scope
        mapping = device_map if scope == "device" else node_map if scope == "node" else {}
        relabelled.append((o, tuple(mapping.get(p, p) for p in positions)))
    return tuple(relabelled)


def _start_values(problem: Problem, assignment, choice, placed, fused) -> dict[int, float]:
    """Values of the per-device MILP's integer variables (column -> value) for ``assignment``."""
    values: dict[int, float] = {var: 0.0 for var in choice.values()}
    values.update({var: 0.0 for var in fused.values()})
    for (t, o), pos_vars in placed.items():
        for _, var in pos_vars:
            values.setdefault(var, 0.0)
    for t, (o, positions) in enumerate(assignment):
        option = problem.options[t][o]
        values[choice[t, o]] = 1.0
        counts: dict[int, int] = defaultdict(int)
        for p in positions:
            counts[p] += 1
            key = problem.fused_key(option, p)
            if key is not None:
                values[fused[key]] = 1.0
        if option.scope == "global":
            continue
        for p, var in placed[t, o]:
            values[var] = float(counts.get(p, 0))
    return values


def _extract(problem: Problem, bins: Bins, choice, placed, values: np.ndarray
             ) -> tuple[tuple[int, tuple[int, ...]], ...]:
    """The plan of a MILP solution (``values``: per column, in creation order)."""
    assignment = []
    for t, options in enumerate(problem.options):
        o = max(range(len(options)), key=lambda j: (float(values[choice[t, j]]), -j))
        positions: list[int] = []
        for p, var in placed[t, o]:
            count = int(round(float(values[var])))
            target = p if options[o].scope != "device" else int(bins.members[p][0])
            positions.extend([target] * count)
        assignment.append((o, tuple(positions)))
    return tuple(assignment)
