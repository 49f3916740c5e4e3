"""Large-neighbourhood search: re-place (and re-shard) the units of a few devices at once, exactly, with a
small MILP.

The greedy and local search (heuristic.py) move one or two units at a time and stop where every such move
raises some device above the maximum. Here each round picks a set S of devices (the slowest devices with some
of the least loaded ones, or the slowest device's node with one of the least loaded nodes, so that node-wide
table-row-wise units can move too), takes out the units placed on S (up to a limit, those of the slowest
device first), and solves the per-device placement MILP over S with everything else fixed as constants. A few
tables may also change their option: tables whose units all sit on S, and tables on every device (data-
parallel, row-wise). That changes what every device sends, receives and computes, so the devices outside S
then join the model too (those alike in every term once).

Sub-MILP (times in microseconds, traffic in MB, memory in GB, as in milp.py):
  z[t,o]   in {0,1}     table t (one of the few that may change) uses option o; the others keep theirs
  x[t,o,i] in {0..k}    units of (t, o) on device i of S                           (device-scope options)
  v[t,o,m] in {0,1}     (t, o) sits on node m (a node whose devices are all in S)   (node-scope options)
                        (a global option is placed once chosen: its load is z[t,o] x its unit's load)
  y[k]     in {0,1}     fused collective k (a node's table-row-wise RS/AG, the row-wise RS/AG, the data-
                        parallel all-reduce) is in use, where no fixed table uses it
  A_i, P_i >= 0         device i's ids and pooled all-to-all bytes: max(sent, received)
  tau_i                 device i's embedding time;  T >= tau_i
  (a) sum_o z[t,o] = 1;  sum_i x[t,o,i] = k(t,o) z[t,o];  sum_m v[t,o,m] = z[t,o]   (fixed tables: z = 1)
  (b) A_i >= IR_i (fixed + placed units),  A_i >= IS (fixed + chosen options);  P_i alike with PS, PR
  (c) tau_i = base_i + latency_i + sum_k y[k] latency_k + compute_i + a2a_s_per_byte_i (A_i + 2 P_i)
  (d) HBM_i <= capacity_i, host_i <= host capacity_i
  (e) y[k] >= every x, v, z that uses k
Objective: min T + (a small weight) x sum_(i in S) tau_i, so that where the slowest device cannot get faster
the others still get lighter. T covers S, plus the devices outside S when the options can change.

A round's plan is kept when it is better in the leximax order (its device times sorted slowest first,
compared in order), which lowers the slowest device or, where it cannot, the next one: many devices often
share the maximum. Every plan kept fits in memory (Problem.fits). Each sub-MILP starts from the current plan
(a feasible solution of it), so HiGHS always has an incumbent. The work is bounded by HiGHS simplex
iterations summed over the rounds, by interrupt checks per round (highs.CheckLimit) and by rounds, never by the
clock: the same input gives the same plan.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from planner.embeddings.heuristic import Assignment, Work, state_of
from planner.embeddings.highs import (GB_PER_BYTE, MB_PER_BYTE, US_PER_S, CheckLimit, add_rows, have_highs, quiet_highs,
                                      set_integer)
from planner.embeddings.problem import Problem

log = logging.getLogger(__name__)

# Weight of the sum of S's device times in the objective, per device, relative to the slowest device's time.
_SPREAD_WEIGHT = 0.01
# Relative tolerance of the leximax comparison (float noise of evaluate()).
_TOLERANCE = 1e-9
# What one simplex iteration of a sub-MILP costs, per row of the sub-MILP, in the search's work unit (one
# evaluation of every device's time, heuristic.Work): the work the search charges for its solves.
ITERATION_EVALUATIONS_PER_ROW = 1.0 / 30.0


@dataclass(frozen=True)
class Neighbourhood:
    """The devices of one round, the nodes among them whose node-wide units may move, and the tables that may
    change their option."""

    devices: tuple[int, ...]
    nodes: tuple[int, ...]
    flexible: tuple[int, ...]
    kept: tuple[int, ...] = ()  # tables whose units on S stay where they are


@dataclass(frozen=True)
class LnsSettings:
    """Work of one search. ``work``: in evaluations (heuristic.Work's unit), which the sub-MILPs' simplex
    iterations are charged in (ITERATION_EVALUATIONS_PER_ROW per iteration and row); the search starts no round
    once it is spent. ``checks``: at most this many HiGHS interrupt checks per round; ``rounds``: at most this
    many rounds; ``patience``: the search stops after this many rounds in a row that kept nothing;
    ``flexible``: tables that may change their option per round; ``devices``: size of a neighbourhood (a
    device set is at most half the cluster; a node pair is used when it is at most this big); ``units``: at
    most this many units freed per round; ``seed``: of the random picks of devices and tables."""

    work: float = 75_000.0
    checks: int = 60
    rounds: int = 200
    patience: int = 3
    flexible: int = 6
    devices: int = 12
    units: int = 1000
    seed: int = 0


def improve(problem: Problem, assignment: Assignment, settings: LnsSettings = LnsSettings(),
            target_s: float = 0.0) -> Assignment:
    """A plan no worse than ``assignment`` (leximax over the device times; so its slowest device is no
    slower), within memory whenever ``assignment`` is. Stops after ``settings.rounds`` rounds, after
    ``settings.patience`` failed rounds in a row, or when the slowest device reaches ``target_s`` (a lower
    bound). Without HiGHS (the ``highspy`` package) it returns ``assignment`` unchanged."""
    if not have_highs() or problem.dev.count < 2:
        return assignment
    current = tuple((int(o), tuple(int(p) for p in positions)) for o, positions in assignment)
    loads = problem.evaluate(current)
    if not problem.fits(loads):
        return assignment
    times = problem.device_time_s(loads)
    rng = np.random.default_rng(settings.seed)
    fails = kept = done = 0
    budget = Work(settings.work)
    for round_ in range(settings.rounds):
        if float(times.max()) <= target_s * (1 + 1e-6) or fails >= settings.patience or budget.done:
            break
        done += 1
        hood = choose_neighbourhood(problem, current, times, rng, round_, fails, settings)
        candidate = solve_neighbourhood(problem, current, hood, settings.checks, budget)
        if candidate is None:
            fails += 1
            continue
        new_loads = problem.evaluate(candidate)
        new_times = problem.device_time_s(new_loads)
        if problem.fits(new_loads) and leximax_less(new_times, times):
            current, times, fails = candidate, new_times, 0
            kept += 1
        else:
            fails += 1
    log.debug("neighbourhood search: %d rounds, %d kept, slowest device %.6f s", done, kept, float(times.max()))
    return current


def leximax_less(a: np.ndarray, b: np.ndarray) -> bool:
    """Whether device times ``a`` beat ``b``: sorted slowest first, the first entry that differs (beyond float
    noise) is smaller in ``a``."""
    sa, sb = np.sort(a)[::-1], np.sort(b)[::-1]
    scale = float(max(sa[0], sb[0], 1e-30))
    for x, y in zip(sa, sb):
        if x < y - _TOLERANCE * scale:
            return True
        if x > y + _TOLERANCE * scale:
            return False
    return False


# ------------------------------------------------------------------------------------------ neighbourhoods
def choose_neighbourhood(problem: Problem, assignment: Assignment, times: np.ndarray, rng: np.random.Generator,
                         round_: int, fails: int, settings: LnsSettings) -> Neighbourhood:
    """Round by round, alternately (where the cluster has table-row-wise positions) the slowest device's node
    with one of the least loaded nodes, and the slowest devices with some of the least loaded devices (at most
    half the cluster). The partners are drawn from the least loaded few with ``rng``, more widely after failed
    rounds. Of the units on S, those of the slowest device and then others drawn with ``rng`` are freed, up
    to ``settings.units``."""
    dev = problem.dev
    order = np.argsort(times, kind="stable")  # fastest first
    worst = int(order[-1])
    size = min(settings.devices, max(2, dev.count // 2))
    pair = 2 * max(len(dev.nodes[k]) for k in problem.node_positions) if problem.node_positions else 0
    if len(problem.node_positions) >= 2 and pair <= settings.devices and round_ % 2 == 0:
        home = int(dev.node_of[worst])
        others = sorted((k for k in problem.node_positions if k != home),
                        key=lambda k: (float(times[list(dev.nodes[k])].mean()), k))
        pool = others[:min(len(others), 2 + fails)]
        partner = pool[int(rng.integers(len(pool)))]
        devices = set(dev.nodes[home]) | set(dev.nodes[partner])
    else:
        top = [int(i) for i in order[::-1][:max(size // 3, 1)] if times[i] >= times[worst] * (1 - 1e-3)]
        need = size - len(top)
        low = [int(i) for i in order if int(i) not in top]
        pool = low[:min(len(low), need + need * min(fails, 4) // 2 + 1)]
        picked = rng.permutation(len(pool))[:need]
        devices = set(top) | {pool[int(j)] for j in picked}
    nodes = tuple(k for k in problem.node_positions if set(dev.nodes[k]) <= devices)
    flexible = _flexible_tables(problem, assignment, devices, nodes, times, settings.flexible, rng)
    return Neighbourhood(tuple(sorted(devices)), nodes, flexible,
                         _kept_tables(problem, assignment, devices, nodes, flexible, worst, settings.units, rng))


def _kept_tables(problem: Problem, assignment: Assignment, devices: set[int], nodes: tuple[int, ...],
                 flexible: tuple[int, ...], worst: int, limit: int, rng: np.random.Generator) -> tuple[int, ...]:
    """The tables whose units on S stay where they are, so that at most ``limit`` units are freed (those of
    the flexible tables and of the slowest device first, then others drawn with ``rng``)."""
    on_s = []
    for t, (o, positions) in enumerate(assignment):
        option = problem.options[t][o]
        if t in flexible:
            continue
        if option.scope == "device":
            count = sum(1 for p in positions if p in devices)
            first = worst in positions
        elif option.scope == "node" and positions[0] in nodes:
            count, first = 1, worst in problem.dev.nodes[positions[0]]
        else:
            continue
        if count:
            on_s.append((t, count, first))
    free = sum(problem.options[t][assignment[t][0]].units for t in flexible)
    ranked = [entry for entry in on_s if entry[2]]
    rest = [entry for entry in on_s if not entry[2]]
    ranked += [rest[int(j)] for j in rng.permutation(len(rest))]
    kept = []
    for t, count, _ in ranked:
        if free + count <= limit:
            free += count
        else:
            kept.append(t)
    return tuple(sorted(kept))


def _flexible_tables(problem: Problem, assignment: Assignment, devices: set[int], nodes: tuple[int, ...],
                     times: np.ndarray, limit: int, rng: np.random.Generator) -> tuple[int, ...]:
    """Up to ``limit`` tables that may change their option: about half among those whose units all sit on
    ``devices`` (device-scope, or node-wide on ``nodes``), those on the slowest device of S first, then by
    size; the rest drawn with ``rng`` among the tables on every device (data-parallel, row-wise)."""
    dev = problem.dev
    slowest = max(devices, key=lambda i: (float(times[i]), -i))
    local, spread = [], []
    for t, (o, positions) in enumerate(assignment):
        option = problem.options[t][o]
        if len(problem.options[t]) < 2:
            continue
        if option.scope == "global":
            spread.append(t)
            continue
        if option.scope == "device" and set(positions) <= devices:
            on = set(positions)
        elif option.scope == "node" and positions[0] in nodes:
            on = set(dev.nodes[positions[0]])
        else:
            continue
        local.append((slowest not in on, -problem.unit_size_s(t, o) * option.units, t))
    local.sort()
    picked = [t for _, _, t in local[:max(limit - min(len(spread), limit // 2), 0)]]
    picked += [spread[int(j)] for j in rng.permutation(len(spread))[:limit - len(picked)]]
    return tuple(sorted(picked))


# ------------------------------------------------------------------------------------------ the sub-MILP
@dataclass
class _Model:
    """Columns and rows of a HiGHS model, collected before one bulk load."""

    lower: list[float] = field(default_factory=list)
    upper: list[float] = field(default_factory=list)
    cost: list[float] = field(default_factory=list)
    integer: list[int] = field(default_factory=list)
    start: list[float] = field(default_factory=list)  # the warm start (the current plan)
    rows: list[tuple[dict[int, float], float, float]] = field(default_factory=list)

    def var(self, low: float, high: float, start: float, integer: bool = False, cost: float = 0.0) -> int:
        self.lower.append(low)
        self.upper.append(high)
        self.cost.append(cost)
        self.start.append(start)
        if integer:
            self.integer.append(len(self.lower) - 1)
        return len(self.lower) - 1

    def row(self, terms: dict[int, float], low: float, high: float) -> None:
        self.rows.append((terms, low, high))

    def solve(self, checks: int, budget: Work | None = None) -> np.ndarray | None:
        """The best solution within ``checks`` interrupt checks; its simplex iterations are taken from
        ``budget``. None when none was found."""
        import highspy

        inf = highspy.kHighsInf
        highs = quiet_highs()
        highs.setOptionValue("mip_rel_gap", 1e-7)
        # HiGHS 1.16's presolve mishandles a user solution on these models (it reported an objective below the
        # true optimum and returned the start unchanged); the sub-MILPs are small enough to solve without it
        highs.setOptionValue("presolve", "off")
        n = len(self.lower)
        highs.addVars(n, np.array(self.lower), np.array([min(u, inf) for u in self.upper]))
        highs.changeColsCost(n, np.arange(n, dtype=np.int32), np.array(self.cost))
        add_rows(highs, self.rows)
        if self.integer:
            set_integer(highs, self.integer)
        solution = highspy.HighsSolution()
        solution.col_value = list(self.start)
        solution.value_valid = True
        highs.setSolution(solution)
        CheckLimit(checks).attach(highs)
        highs.run()
        if budget is not None:
            budget.spend(float(highs.getInfo().simplex_iteration_count) * len(self.rows)
                         * ITERATION_EVALUATIONS_PER_ROW)
        if highs.getInfo().primal_solution_status != highspy.kSolutionStatusFeasible:
            return None
        return np.array(highs.getSolution().col_value)


def solve_neighbourhood(problem: Problem, assignment: Assignment, hood: Neighbourhood, checks: int,
                        budget: Work | None = None) -> Assignment | None:
    """The sub-MILP over ``hood`` (module docstring), warm-started from ``assignment``; the plan it gives,
    or None when HiGHS found none within ``checks`` interrupt checks. The simplex iterations the solve took are
    taken from ``budget``."""
    dev = problem.dev
    in_s = np.zeros(dev.count, dtype=bool)
    in_s[list(hood.devices)] = True
    node_set = set(hood.nodes)
    loads = problem.evaluate(assignment)
    times = problem.device_time_s(loads)
    # what stays: every unit not freed, as _State's loads (and the fused collectives the plan uses now)
    state = state_of(problem, assignment, Work(np.inf))
    in_use = {key for key, count in state.fused.items() if count > 0}
    freed: list[tuple[int, list[int], int]] = []  # (table, candidate options, units to place; -1: all)
    for t, (o, positions) in enumerate(assignment):
        option = problem.options[t][o]
        if t in hood.kept:
            continue
        if t in hood.flexible:
            state.remove_table(t)
            options = [j for j, other in enumerate(problem.options[t]) if other.scope != "node" or hood.nodes]
            freed.append((t, options, -1))
        elif option.scope == "device":
            mine = [p for p in positions if in_s[p]]
            for p in mine:
                state.apply_unit(t, o, p, -1.0)
            if mine:
                freed.append((t, [o], len(mine)))
        elif option.scope == "node" and positions[0] in node_set:
            state.apply_unit(t, o, positions[0], -1.0)
            freed.append((t, [o], 1))
    if not freed:
        return None
    model = _Model()
    T = model.var(0.0, np.inf, float(times.max()) * US_PER_S, cost=1.0)
    # per device touched: column -> coefficient of its compute (us), ids received, pooled sent (MB), memory (GB)
    compute: dict[int, dict[int, float]] = defaultdict(dict)
    ids_recv: dict[int, dict[int, float]] = defaultdict(dict)
    pool_send: dict[int, dict[int, float]] = defaultdict(dict)
    hbm: dict[int, dict[int, float]] = defaultdict(dict)
    host: dict[int, dict[int, float]] = defaultdict(dict)
    ids_send: dict[int, float] = {}
    pool_recv: dict[int, float] = {}
    fused: dict[tuple[str, int], int] = {}  # fused collective -> its y column
    placed: list[tuple[int, int, int | None, list[tuple[int, int]]]] = []  # (t, o, z column, [(position, col)])

    def add(target: dict[int, dict[int, float]], col: int, values: np.ndarray, devices: np.ndarray,
            unit: float) -> None:
        for d, value in zip(devices, values):
            if value:
                row = target[int(d)]
                row[col] = row.get(col, 0.0) + float(value) * unit

    for t, options, count in freed:
        o_now, positions_now = assignment[t]
        z_cols = []
        for o in options:
            option = problem.options[t][o]
            z = None
            if count < 0:
                z = model.var(0.0, 1.0, 1.0 if o == o_now else 0.0, integer=True)
                z_cols.append(z)
                if option.ids_send_bytes:
                    ids_send[z] = option.ids_send_bytes * MB_PER_BYTE
                if option.pool_recv_bytes:
                    pool_recv[z] = option.pool_recv_bytes * MB_PER_BYTE
            units = option.units if count < 0 else count
            targets = hood.devices if option.scope == "device" else hood.nodes if option.scope == "node" else (0,)
            cols = []
            for p in targets:
                if not problem.fits_at(t, o, p):
                    continue
                unit = problem.unit(t, o, p)
                if option.scope == "global":
                    col = z  # a global option is placed once it is chosen
                else:
                    start = sum(1 for q in positions_now if q == p) if o == o_now else 0
                    col = model.var(0.0, float(units), float(start), integer=True)
                cols.append((p, col))
                add(compute, col, unit.compute_s, unit.devices, US_PER_S)
                add(ids_recv, col, unit.ids_recv_bytes, unit.devices, MB_PER_BYTE)
                add(pool_send, col, unit.pool_send_bytes, unit.devices, MB_PER_BYTE)
                add(hbm, col, unit.hbm_bytes, unit.devices, GB_PER_BYTE)
                add(host, col, unit.host_bytes, unit.devices, GB_PER_BYTE)
                key = problem.fused_key(option, p)
                if key is not None and state.fused.get(key, 0) == 0:
                    y = fused.get(key)
                    if y is None:
                        y = fused[key] = model.var(0.0, 1.0, 1.0 if key in in_use else 0.0, integer=True)
                        members, seconds = problem.fused_latency(key)
                        add(compute, y, np.full(len(members), seconds), members, US_PER_S)
                    model.row({y: 1.0, col: -1.0}, 0.0, np.inf)  # (e)
            # (a) every unit of the chosen option placed
            if option.scope == "global":
                if not cols:
                    model.row({z: 1.0}, 0.0, 0.0)
            elif z is not None:
                model.row({**{col: 1.0 for _, col in cols}, z: -float(units)}, 0.0, 0.0)
            elif not cols:
                return None
            else:
                model.row({col: 1.0 for _, col in cols}, float(units), float(units))
            placed.append((t, o, z, cols))
        if z_cols:
            model.row({z: 1.0 for z in z_cols}, 1.0, 1.0)

    a2a = dev.a2a_s_per_byte * US_PER_S / MB_PER_BYTE
    fixed_time = (problem.base_time_s() + state.latency + state.compute) * US_PER_S
    a2a_now = (np.maximum(loads.ids_recv_bytes, loads.ids_send_bytes) * MB_PER_BYTE,
               np.maximum(loads.pool_send_bytes, loads.pool_recv_bytes) * MB_PER_BYTE)
    # the devices outside S count when the options of S's tables change what every device carries (the
    # all-to-all totals IS and PR, global units); devices alike in every term are modelled once
    modelled = list(hood.devices)
    if ids_send or pool_recv or any(not in_s[d] for d in compute):
        seen: dict[tuple, int] = {}
        for d in np.flatnonzero(~in_s):
            d = int(d)
            key = (float(fixed_time[d]), float(state.ids_recv[d]), float(state.pool_send[d]), float(a2a[d]),
                   float(dev.hbm_capacity_bytes[d] - state.hbm[d]), float(dev.host_capacity_bytes[d] - state.host[d]),
                   tuple(sorted(compute[d].items())), tuple(sorted(hbm[d].items())), tuple(sorted(host[d].items())))
            seen.setdefault(key, d)
        modelled.extend(sorted(seen.values()))
    weight = _SPREAD_WEIGHT
    for d in modelled:
        A = model.var(0.0, np.inf, float(a2a_now[0][d]))
        P = model.var(0.0, np.inf, float(a2a_now[1][d]))
        # (b)
        model.row({A: 1.0, **{c: -v for c, v in ids_recv[d].items()}}, float(state.ids_recv[d]) * MB_PER_BYTE, np.inf)
        model.row({A: 1.0, **{c: -v for c, v in ids_send.items()}}, state.ids_send * MB_PER_BYTE, np.inf)
        model.row({P: 1.0, **{c: -v for c, v in pool_send[d].items()}}, float(state.pool_send[d]) * MB_PER_BYTE, np.inf)
        model.row({P: 1.0, **{c: -v for c, v in pool_recv.items()}}, state.pool_recv * MB_PER_BYTE, np.inf)
        # (c) tau = fixed + compute + a2a;  T >= tau
        tau = model.var(0.0, np.inf, float(times[d]) * US_PER_S, cost=weight if in_s[d] else 0.0)
        terms = {tau: 1.0, A: -float(a2a[d]), P: -2.0 * float(a2a[d])}
        for c, v in compute[d].items():
            terms[c] = terms.get(c, 0.0) - v
        model.row(terms, float(fixed_time[d]), float(fixed_time[d]))
        model.row({T: 1.0, tau: -1.0}, 0.0, np.inf)
        # (d)
        if hbm[d]:
            model.row(dict(hbm[d]), -np.inf, (float(dev.hbm_capacity_bytes[d]) - float(state.hbm[d])) * GB_PER_BYTE)
        if host[d]:
            model.row(dict(host[d]), -np.inf, (float(dev.host_capacity_bytes[d]) - float(state.host[d])) * GB_PER_BYTE)
    values = model.solve(checks, budget)
    if values is None:
        return None
    return _read_plan(problem, assignment, placed, values, in_s)


def _read_plan(problem: Problem, assignment: Assignment,
               placed: Sequence[tuple[int, int, int | None, list[tuple[int, int]]]], values: np.ndarray,
               in_s: np.ndarray) -> Assignment:
    """The assignment the sub-MILP's solution describes."""
    chosen: dict[int, tuple[int, list[int]]] = {}
    for t, o, z, cols in placed:
        if z is not None and values[z] < 0.5:
            continue
        positions = []
        for p, col in cols:
            positions.extend([int(p)] * int(round(values[col])))
        o_now, positions_now = assignment[t]
        if z is None and problem.options[t][o].scope == "device":
            positions = [p for p in positions_now if not in_s[p]] + positions
        chosen[t] = (o, positions)
    out = []
    for t, (o, positions) in enumerate(assignment):
        if t in chosen:
            o, positions = chosen[t]
        out.append((int(o), tuple(int(p) for p in positions)))
    return tuple(out)
