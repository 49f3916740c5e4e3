"""The placement MILP and its LP relaxation (pulp + HiGHS), written like the paper.

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
      table's choice (each term its least over devices; valid cut, the main one on 64-128 devices)
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
from typing import Sequence

import numpy as np
import pulp

from planner.embeddings.highs import (GB_PER_BYTE, MB_PER_BYTE, US_PER_S, CheckLimit, QuietHiGHS, have_highs,
                                      has_incumbent)
from planner.embeddings.problem import Problem

log = logging.getLogger(__name__)

# The pigeonhole cuts (f3) and the excess cut (f4) go into models of up to this many integer variables: past it
# they slow HiGHS's root node (more rows per variable) far more than they lift the bound.
PIGEONHOLE_MAX_VARIABLES = 3000


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
    handle: object = None  # (pulp problem, choice variables) when kept for re-solving (see bound.py)


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
          incumbent: Sequence[tuple[int, Sequence[int]]] | None = None) -> SolveResult:
    """Solve the LP (``integer=False``) or the MILP over ``bins``. ``work_limit`` stops a MILP after that many
    of HiGHS's interrupt checks (deterministic, see :class:`CheckLimit`; None: to optimality);
    ``time_limit_s`` is a wall-clock limit for callers that want one (benchmarks), off by default because it
    makes the answer depend on the machine's speed. ``excess=False`` leaves the cut (f4) out (a guide for the
    heuristic: the cut moves the LP's option weights, not always toward options whole devices balance).
    ``incumbent`` (per-device bins only) is a plan handed to HiGHS as its first incumbent: its integer variables
    are fixed from it and HiGHS completes the rest, so the search prunes against it from the start."""
    start = time.perf_counter()
    dev = problem.dev
    nb = len(bins.members)
    size = np.array([len(m) for m in bins.members], dtype=float)
    rep = np.array([m[0] for m in bins.members])
    hbm_cap = np.array([dev.hbm_capacity_bytes[m].sum() for m in bins.members])
    host_cap = np.array([dev.host_capacity_bytes[m].sum() for m in bins.members])
    cat = pulp.LpInteger if integer else pulp.LpContinuous
    lp = pulp.LpProblem("embedding_sharding", pulp.LpMinimize)
    T = _var(lp, "T", 0, None)
    lp += T
    # per bin: variable -> coefficient (a dict, since a global unit touches several devices of one bin)
    compute: list[dict] = [defaultdict(float) for _ in range(nb)]
    ids_recv: list[dict] = [defaultdict(float) for _ in range(nb)]
    pool_send: list[dict] = [defaultdict(float) for _ in range(nb)]
    hbm: list[dict] = [defaultdict(float) for _ in range(nb)]
    host: list[dict] = [defaultdict(float) for _ in range(nb)]
    ids_send: list = []
    pool_recv: list = []
    choice: dict[tuple[int, int], pulp.LpVariable] = {}
    integral: list[pulp.LpVariable] = []  # the variables that are integers in the MILP
    fused: dict[tuple[str, int], pulp.LpVariable] = {}

    def use_fused(var: pulp.LpVariable, option, position: int) -> None:
        """(h) y[key] >= var: a fused collective's latency is paid once it carries any table."""
        key = problem.fused_key(option, position)
        if key is None:
            return
        y = fused.get(key)
        if y is None:
            y = fused[key] = _var(lp, f"y_{key[0]}_{key[1]}", 0, 1, pulp.LpBinary if integer else pulp.LpContinuous)
            integral.append(y)
            members, seconds = problem.fused_latency(key)
            for d in members:
                compute[bins.bin_of[d]][y] += seconds * US_PER_S
        lp.addConstraint(pulp.LpAffineExpression([(y, 1.0), (var, -1.0)]) >= 0)
    placed: dict[tuple[int, int], list[tuple[int, pulp.LpVariable]]] = {}

    def add_unit(var: pulp.LpVariable, t: int, o: int, position: int) -> None:
        unit = problem.unit(t, o, position)
        for j, d in enumerate(unit.devices):
            b = bins.bin_of[d]
            compute[b][var] += unit.compute_s[j] * US_PER_S
            if unit.ids_recv_bytes[j]:
                ids_recv[b][var] += unit.ids_recv_bytes[j] * MB_PER_BYTE
            if unit.pool_send_bytes[j]:
                pool_send[b][var] += unit.pool_send_bytes[j] * MB_PER_BYTE
            if unit.hbm_bytes[j]:
                hbm[b][var] += unit.hbm_bytes[j] * GB_PER_BYTE
            if unit.host_bytes[j]:
                host[b][var] += unit.host_bytes[j] * GB_PER_BYTE

    alones: list[list[tuple[pulp.LpVariable, float]]] = []
    for t, options in enumerate(problem.options):
        zs = []
        alone = []
        for o, option in enumerate(options):
            z = _var(lp, f"z_{t}_{o}", 0, 1, pulp.LpBinary if integer else pulp.LpContinuous)
            integral.append(z)
            choice[t, o] = z
            zs.append((z, 1.0))
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
                unit = problem.unit(t, o, target)
                if np.any(unit.hbm_bytes > dev.hbm_capacity_bytes[unit.devices]) or np.any(
                        unit.host_bytes > dev.host_capacity_bytes[unit.devices]):
                    continue  # one unit alone already overflows this position
                upper = option.units if option.scope == "device" else 1
                if bins.aggregated and option.scope == "device":
                    upper = None  # a class takes any number of units (bounded by (b))
                var = _var(lp, f"u_{t}_{o}_{p}", 0, upper, cat)
                integral.append(var)
                pos_vars.append((p, var))
                use_fused(var, option, target)
                add_unit(var, t, o, target)
            placed[t, o] = pos_vars
            units = float(option.units)
            lp += pulp.LpAffineExpression([(var, 1.0) for _, var in pos_vars] + [(z, -units)]) == 0, f"b_{t}_{o}"
        lp += pulp.LpAffineExpression(zs) == 1, f"a_{t}"
        alones.append(alone)
    G = _add_table_cuts(lp, problem, T, choice, fused, alones)
    IS, PR, latency = _add_traffic_cuts(lp, problem, T, G, choice, fused, ids_send, pool_recv)
    if bins.aggregated and len(integral) <= PIGEONHOLE_MAX_VARIABLES:
        integral.extend(_add_pigeonhole_cuts(lp, problem, bins, T, G, IS, PR, latency, placed, integer))

    ids_excess: list[list] = [[] for _ in range(nb)]
    pool_excess: list[list] = [[] for _ in range(nb)]
    if excess and bins.aggregated and len(integral) <= PIGEONHOLE_MAX_VARIABLES:
        ids_excess, pool_excess = _excess_terms(lp, problem, nb, IS, PR, choice, placed)

    base = problem.base_time_s() * US_PER_S
    coef = dev.a2a_s_per_byte * US_PER_S / MB_PER_BYTE
    for b in range(nb):
        r = int(rep[b])
        A = _var(lp, f"A_{b}", 0, None)
        P = _var(lp, f"P_{b}", 0, None)
        if ids_excess[b]:  # (f4)
            lp += pulp.LpAffineExpression([(A, 1.0), (IS, -size[b])] + [(e, -1.0) for e in ids_excess[b]]) >= 0, \
                f"f4_A_{b}"
        if pool_excess[b]:
            lp += pulp.LpAffineExpression([(P, 1.0), (PR, -size[b])] + [(e, -1.0) for e in pool_excess[b]]) >= 0, \
                f"f4_P_{b}"
        lp += pulp.LpAffineExpression([(A, 1.0)] + [(z, -size[b] * c) for z, c in ids_send]) >= 0, f"cIS_{b}"
        lp += pulp.LpAffineExpression([(A, 1.0)] + [(v, -c) for v, c in ids_recv[b].items()]) >= 0, f"cIR_{b}"
        lp += pulp.LpAffineExpression([(P, 1.0)] + [(z, -size[b] * c) for z, c in pool_recv]) >= 0, f"cPR_{b}"
        lp += pulp.LpAffineExpression([(P, 1.0)] + [(v, -c) for v, c in pool_send[b].items()]) >= 0, f"cPS_{b}"
        lp += pulp.LpAffineExpression(
            [(T, size[b]), (A, -coef[r]), (P, -2.0 * coef[r])] + [(v, -c) for v, c in compute[b].items()]
        ) >= size[b] * base[r], f"d_{b}"
        if hbm[b]:
            lp += pulp.LpAffineExpression(list(hbm[b].items())) <= hbm_cap[b] * GB_PER_BYTE, f"eH_{b}"
        if host[b]:
            lp += pulp.LpAffineExpression(list(host[b].items())) <= host_cap[b] * GB_PER_BYTE, f"eU_{b}"
    if bins.aggregated:
        _add_memory_pigeonhole_cuts(lp, problem, bins, placed)
    start_values: dict[pulp.LpVariable, float] = {}
    if integer:
        if incumbent is not None and not bins.aggregated:
            start_values = _start_values(problem, _symmetric_order(problem, incumbent), choice, placed, fused)
        _break_node_symmetry(lp, problem, bins, compute)

    highs = have_highs()
    if highs:
        limit = CheckLimit(work_limit) if integer and work_limit is not None else None
        solver = QuietHiGHS(mip=integer, msg=False, timeLimit=time_limit_s, threads=1,
                             gapRel=1e-6 if integer else None, work=limit, start=start_values)
    else:  # pulp's bundled CBC (slower; no dual bound is read back from it); its node limit stands in for work
        solver = pulp.PULP_CBC_CMD(mip=integer, msg=False, timeLimit=time_limit_s, threads=1,
                                   gapRel=1e-6 if integer else None,
                                   maxNodes=work_limit if integer and work_limit is not None else None)
    lp.solve(solver)
    elapsed = time.perf_counter() - start
    status = pulp.LpStatus[lp.status]
    no_incumbent = highs and integer and not has_incumbent(lp.solverModel)
    if status != "Optimal" or T.varValue is None or no_incumbent:
        kind = "infeasible" if status == "Infeasible" else "not_solved"
        return SolveResult(kind, float("inf"), _dual_bound(lp, integer, 0.0) / US_PER_S, None, elapsed)
    objective = float(T.varValue) / US_PER_S
    if highs:
        import highspy

        proven = lp.solverModel.getModelStatus() == highspy.HighsModelStatus.kOptimal
        bound = _dual_bound(lp, integer, objective * US_PER_S) / US_PER_S if integer else objective
    else:  # CBC reports values to 8 significant digits: keep the bound safely below the true optimum
        proven = lp.sol_status == pulp.LpSolutionOptimal
        bound = objective * (1 - 1e-7) if (proven or not integer) else 0.0
    assignment = _extract(problem, bins, choice, placed) if integer else None
    weights = tuple(tuple(float(choice[t, o].varValue or 0.0) for o in range(len(options)))
                    for t, options in enumerate(problem.options))
    return SolveResult("optimal" if proven else "feasible", objective, bound, assignment, elapsed, weights,
                       (lp, choice, integral, bins) if keep else None)


def model_rows(relaxed: SolveResult) -> int:
    """The constraints of the model ``relaxed`` kept (solved with ``keep=True``): what one of its re-solves
    costs grows with them."""
    lp = relaxed.handle[0]
    model = getattr(lp, "solverModel", None)
    return int(model.getNumRow()) if model is not None else int(lp.numConstraints())


def resolve_integer(problem: Problem, relaxed: SolveResult, *, work_limit: int | None = None) -> SolveResult:
    """The MILP of the same bins as ``relaxed`` (an LP solved with ``keep=True``): the kept HiGHS model gets
    its choice, placement and latency variables declared integer and is solved again from the LP's basis,
    with no rebuild, for at most ``work_limit`` interrupt checks. Returns the MILP's incumbent value, its dual
    bound and its option choices."""
    lp, choice, integral, bins = relaxed.handle
    if not have_highs():  # no model to re-solve: build the MILP afresh
        return solve(problem, bins, integer=True, work_limit=work_limit)
    import highspy

    start = time.perf_counter()
    highs = lp.solverModel
    for var in integral:
        highs.changeColIntegrality(var.index, highspy.HighsVarType.kInteger)
    highs.setOptionValue("mip_rel_gap", 1e-6)
    if work_limit is not None:
        CheckLimit(work_limit).attach(highs)
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
    weights = tuple(tuple(float(round(values[choice[t, o].index])) for o in range(len(options)))
                    for t, options in enumerate(problem.options))
    objective = float(info.objective_function_value) / US_PER_S
    proven = status == highspy.HighsModelStatus.kOptimal
    return SolveResult("optimal" if proven else "feasible", objective,
                       objective if proven else max(bound, relaxed.objective_s), None, elapsed, weights)


def _add_table_cuts(lp: pulp.LpProblem, problem: Problem, T: pulp.LpVariable, choice: dict, fused: dict,
                    alones: list[list[tuple[pulp.LpVariable, float]]]) -> pulp.LpVariable:
    """(f) per table t: T >= alone(t, o) + the global work every device carries besides t (valid cut).

    Some device d carries a unit of t's chosen option o. Its time is at least t's unit alone on d (the
    all-to-all traffic every plan has included), plus the lookups and collectives of every other table
    sharded over all devices (row-wise, data-parallel: they touch every device, d included), plus the latency
    of each global fused collective in use (paid once on every device). Taking each term's minimum over the
    devices keeps it a lower bound. G = sum of the other tables' global work is one auxiliary variable, so the
    cut has O(options) terms per table. The latency of t's own global collective is counted once (in y, not
    in alone)."""
    global_keys = {key: y for key, y in fused.items() if key[0] in ("data_parallel", "row_wise")}
    work: list[tuple[pulp.LpVariable, float]] = []
    own: dict[int, dict] = defaultdict(dict)
    for (t, o), z in choice.items():
        option = problem.options[t][o]
        if option.scope == "global":
            least = float(np.min(problem.unit(t, o, 0).compute_s)) * US_PER_S
            work.append((z, least))
            own[t][z] = least
    G = _var(lp, "G", 0, None)
    lp += pulp.LpAffineExpression([(G, 1.0)] + [(z, -c) for z, c in work]) == 0, "f_G"
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
        lp += pulp.LpAffineExpression(list(terms.items())) >= 0, f"f_{t}"
    return G


def _add_traffic_cuts(lp: pulp.LpProblem, problem: Problem, T: pulp.LpVariable, G: pulp.LpVariable,
                      choice: dict, fused: dict, ids_send: list, pool_recv: list) -> None:
    """(f2) per table t, the device d that carries a unit of t's option o (valid cut):

        T >= base + compute(t, o) + G + latency + a2a_s_per_byte x (A_t + 2 P_t)
        A_t >= ids every device sends (IS, all tables' choices),  A_t >= ids the unit receives
        P_t >= pooled bytes every device receives (PR),  P_t >= pooled bytes the unit sends

    where G is the global work of (f) (t's own included when t's option is global). Unlike (f), the
    all-to-all floor follows the other tables' choices instead of their least. Each term is its least over
    the devices (and positions) the unit may take, so the sum stays below every plan's slowest device."""
    dev = problem.dev
    base = float(problem.base_time_s().min()) * US_PER_S
    coef = float(dev.a2a_s_per_byte.min()) * US_PER_S / MB_PER_BYTE
    IS = _var(lp, "IS", 0, None)
    PR = _var(lp, "PR", 0, None)
    lp += pulp.LpAffineExpression([(IS, 1.0)] + [(z, -c) for z, c in ids_send]) == 0, "f2_IS"
    lp += pulp.LpAffineExpression([(PR, 1.0)] + [(z, -c) for z, c in pool_recv]) == 0, "f2_PR"
    latency = [(y, problem.fused_latency(key)[1] * US_PER_S) for key, y in sorted(fused.items())
               if key[0] in ("data_parallel", "row_wise")]
    for t, options in enumerate(problem.options):
        A = _var(lp, f"At_{t}", 0, None)
        P = _var(lp, f"Pt_{t}", 0, None)
        compute, recv, send = [], [], []
        for o, option in enumerate(options):
            z = choice[t, o]
            if option.scope == "device":
                bw = dev.host_Bps if option.host else dev.lookup_Bps
                c = option.lookup_bytes / float(bw.max())
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
        lp += pulp.LpAffineExpression([(A, 1.0), (IS, -1.0)]) >= 0, f"f2_AS_{t}"
        lp += pulp.LpAffineExpression([(A, 1.0)] + recv) >= 0, f"f2_AR_{t}"
        lp += pulp.LpAffineExpression([(P, 1.0), (PR, -1.0)]) >= 0, f"f2_PR_{t}"
        lp += pulp.LpAffineExpression([(P, 1.0)] + send) >= 0, f"f2_PS_{t}"
        lp += pulp.LpAffineExpression([(T, 1.0), (G, -1.0), (A, -coef), (P, -2.0 * coef)] + compute
                                      + [(y, -c) for y, c in latency]) >= base, f"f2_{t}"
    return IS, PR, latency


def _add_pigeonhole_cuts(lp: pulp.LpProblem, problem: Problem, bins: Bins, T: pulp.LpVariable,
                         G: pulp.LpVariable, IS: pulp.LpVariable, PR: pulp.LpVariable, latency: list,
                         placed: dict, integer: bool) -> list[pulp.LpVariable]:
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
            work = min(option.lookup_bytes / float((dev.host_Bps if option.host else dev.lookup_Bps)[members].max())
                       for _, option in chosen)
            k = _var(lp, f"k_{b}_{width}", 0, None, pulp.LpInteger if integer else pulp.LpContinuous)
            counts.append(k)
            A = _var(lp, f"Ak_{b}_{width}", 0, None)
            P = _var(lp, f"Pk_{b}_{width}", 0, None)
            lp += pulp.LpAffineExpression([(k, float(n_b))] + [(var, -1.0) for var, _ in chosen]) >= 0, \
                f"f3_k_{b}_{width}"
            lp += pulp.LpAffineExpression([(A, 1.0), (IS, -1.0)]) >= 0, f"f3_AS_{b}_{width}"
            lp += pulp.LpAffineExpression([(A, 1.0), (k, -recv * MB_PER_BYTE)]) >= 0, f"f3_AR_{b}_{width}"
            lp += pulp.LpAffineExpression([(P, 1.0), (PR, -1.0)]) >= 0, f"f3_PR_{b}_{width}"
            lp += pulp.LpAffineExpression([(P, 1.0), (k, -send * MB_PER_BYTE)]) >= 0, f"f3_PS_{b}_{width}"
            lp += pulp.LpAffineExpression([(T, 1.0), (G, -1.0), (k, -work * US_PER_S), (A, -coef), (P, -2.0 * coef)]
                                          + [(y, -c) for y, c in latency]) >= base, f"f3_{b}_{width}"
    return counts


def _excess_terms(lp: pulp.LpProblem, problem: Problem, nb: int, IS: pulp.LpVariable, PR: pulp.LpVariable,
                  choice: dict, placed: dict) -> tuple[list[list], list[list]]:
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
    ids_excess: list[list] = [[] for _ in range(nb)]
    pool_excess: list[list] = [[] for _ in range(nb)]
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
                w = _var(lp, f"w{kind}_{t}_{o}", 0, None)
                lp += pulp.LpAffineExpression([(w, 1.0), (shared, -1.0)]) <= 0, f"f4_{kind}w_{t}_{o}"
                lp += pulp.LpAffineExpression([(w, 1.0), (z, -most * MB_PER_BYTE)]) <= 0, f"f4_{kind}z_{t}_{o}"
                for b, x in placed[t, o]:
                    e = _var(lp, f"{kind}_{t}_{o}_{b}", 0, None)
                    lp += pulp.LpAffineExpression([(e, 1.0), (x, -unit_bytes * MB_PER_BYTE), (w, float(option.units))]) \
                        >= 0, f"f4_{kind}_{t}_{o}_{b}"
                    out[b].append(e)
    return ids_excess, pool_excess


def _add_memory_pigeonhole_cuts(lp: pulp.LpProblem, problem: Problem, bins: Bins, placed: dict,
                                slack: int = 1) -> None:
    """(f5) per bin b and j = 1, 2, 3 (valid cut): a device holds at most j device-scope units of more than
    1 / (j + 1) of its memory (j + 1 of them would overflow it; HBM units against HBM, host units against host
    memory), so bin b holds at most j n_b of them. The class model only sums memory over a bin, which lets it
    put 3 tables of 60% of a device's memory on 2 devices. ``slack`` = 1 is the cut; tests pass a larger one (units of more than 1 / (j + slack): invalid) to check
    that brute force catches an invalid cut."""
    dev = problem.dev
    for b, members in enumerate(bins.members):
        n_b = len(members)
        for host in (False, True):
            capacity = float((dev.host_capacity_bytes if host else dev.hbm_capacity_bytes)[members].max())
            for j in (1, 2, 3):
                big = []
                for (t, o), pos_vars in sorted(placed.items()):
                    option = problem.options[t][o]
                    if option.scope != "device" or option.host != host or option.memory_bytes * (j + slack) <= capacity:
                        continue
                    big.extend(var for p, var in pos_vars if p == b)
                if big:
                    lp += pulp.LpAffineExpression([(var, 1.0) for var in big]) <= j * n_b, f"f5_{b}_{int(host)}_{j}"


def _var(lp: pulp.LpProblem, name: str, low: float | None, high: float | None,
         cat: str = pulp.LpContinuous) -> pulp.LpVariable:
    """A variable of ``lp`` (pulp >= 3.3 attaches variables to their model; older pulp builds them alone)."""
    if hasattr(lp, "add_variable"):
        return lp.add_variable(name, low, high, cat=cat)
    return pulp.LpVariable(name, low, high, cat)


def _dual_bound(lp: pulp.LpProblem, integer: bool, fallback: float) -> float:
    model = getattr(lp, "solverModel", None)
    if not integer or model is None:
        return fallback
    value = float(model.getInfo().mip_dual_bound)
    return value if np.isfinite(value) else 0.0


def _break_node_symmetry(lp: pulp.LpProblem, problem: Problem, bins: Bins, compute: list[dict]) -> None:
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
            lp += pulp.LpAffineExpression(list(terms.items())) >= 0, f"g_{k1}_{k2}"


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


def _start_values(problem: Problem, assignment, choice, placed, fused) -> dict[pulp.LpVariable, float]:
    """Values of the per-device MILP's integer variables for ``assignment``."""
    values: dict[pulp.LpVariable, float] = {var: 0.0 for var in choice.values()}
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


def _extract(problem: Problem, bins: Bins, choice, placed) -> tuple[tuple[int, tuple[int, ...]], ...]:
    assignment = []
    for t, options in enumerate(problem.options):
        o = max(range(len(options)), key=lambda j: (choice[t, j].varValue or 0.0, -j))
        positions: list[int] = []
        for p, var in placed[t, o]:
            count = int(round(var.varValue or 0.0))
            target = p if options[o].scope != "device" else int(bins.members[p][0])
            positions.extend([target] * count)
        assignment.append((o, tuple(positions)))
    return tuple(assignment)
