"""Kind-aware placement by device configurations (cutting-stock style), for a fixed option per table.

Large workloads repeat a few kinds of tables (same rows, dim, pooling: e.g. many hashed tables of one size), and
large clusters repeat a few kinds of nodes and devices. Units of one kind (same option, same loads) are
interchangeable, and so are the devices of one node class. So a placement is a choice, per node class, of how
many nodes take each *node pattern* (a multiset of node-wide, table-row-wise, unit kinds) and, per pattern,
how many of those nodes' devices take each *device configuration* (a multiset of device-scope unit kinds).
A device's time then depends only on its node class, its node's pattern and its own configuration, and is
computed exactly (the per-device all-to-all maxima included, which the class models average away).

For a target time T, the configurations and patterns whose device time is at most T (within memory) are
enumerated, and a small MILP asks for integers

  u[g,q] >= 0   nodes of class g with pattern q          sum_q u[g,q] = nodes of class g
  x[g,q,c] >= 0 devices of those nodes with configuration c   sum_c x[g,q,c] = devices per node x u[g,q]
  every node kind k:   sum u[g,q] (units of k in q) >= count of k
  every device kind j: sum x[g,q,c] (units of j in c) >= count of j

(covering, not equality: removing a unit never makes a device slower, so surplus slots are left empty).
A first MILP at the largest configuration time below the plan to beat says whether any better plan exists
(its LP relaxation is solved first, which alone rejects most trial choices); if one
does, a few bisection steps over the distinct configuration times lower T (with enough steps and checks, the
least T: exact for the option choice, tested against brute force). The plan is read off the last feasible
solution. Loads of a node-wide unit on a node are taken as their largest over the node's devices and the
global (data-parallel, row-wise) loads as their largest over the node class, so the plan's true time is at most
T. Applies to clusters whose nodes each hold identical devices; the enumeration and the solves are bounded by
counts (configurations, HiGHS interrupt checks), never by the clock.

At a fixed option choice this placement is rarely better than the greedy + local search; what it adds is an
exact and fast judge of option choices. :func:`improve_choice` uses it for compound changes by table kind
(several tables of one kind change option at once, finest splits first), from the best plan's choice and the
guides' (the class MILP's and LP's).
"""

from __future__ import annotations

import itertools
import logging
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np

from planner.embeddings.heuristic import Assignment, Work, greedy, local_search
from planner.embeddings.highs import CheckLimit, have_highs, quiet_highs, set_integer
from planner.embeddings.problem import Problem

log = logging.getLogger(__name__)

# What one HiGHS simplex iteration and one HiGHS interrupt check count in the work of this search, against one
# configuration enumerated or one MILP column (a column costs ~2 us to build; a check, about one branch-and-
# bound node of these models).
_SIMPLEX_ITERATION_WORK = 1.0
_CHECK_WORK = 2000.0
# What one device-time evaluation of the greedy + local search (heuristic.Work's unit) counts in this search's
# work: an evaluation costs about five of its units of CPU
EVALUATION_WORK = 5.0

# The relative margin by which a sum of loads counted without listing it must stay inside a limit (the sums'
# rounding is far below it).
SURE_MARGIN = 1e-9

# places an option choice below a bound, charging a work count: (choice, upper_s, work) -> plan or None
Placer = Callable[[Sequence[int], float, Work], "Assignment | None"]


@dataclass(frozen=True)
class PatternSettings:
    """Work of one pattern placement: at most ``configurations`` enumerated (over all node classes and
    patterns; past it the method gives up), ``checks`` HiGHS interrupt checks per feasibility MILP (not shown
    feasible within them counts as infeasible), at most ``steps`` bisection steps after the first test, which
    asks for a plan at least ``min_gain`` (relative) faster than the bound to beat."""

    configurations: int = 20_000
    # past about 20 checks a single check can take seconds on models at the edge of feasibility (HiGHS's root
    # separation), so the count stays small
    checks: int = 20
    steps: int = 4
    min_gain: float = 1e-3


@dataclass
class _Loads:
    """A device's loads (seconds of compute, bytes of ids received and pooled outputs sent, memory)."""

    compute_s: float = 0.0
    ids_recv: float = 0.0
    pool_send: float = 0.0
    hbm: float = 0.0
    host: float = 0.0


@dataclass
class _NodeClass:
    """Nodes alike in every device (class, capacities, links) and in what the global units load on them."""

    nodes: list[int]
    size: int  # devices per node
    rep: int  # a representative node
    can_hold_node_units: bool
    base: _Loads = field(default_factory=_Loads)  # global units' loads (largest over the class's devices)
    fixed_s: float = 0.0  # all-to-all latency + global fused collectives' latency
    node_latency_s: float = 0.0  # the node's table-row-wise fused collective, paid once any node unit is there
    s_per_byte: float = 0.0
    hbm_cap: float = 0.0
    host_cap: float = 0.0


@dataclass(frozen=True)
class _Configurations:
    """Device configurations, sparse (a configuration holds few of the many kinds): configuration c holds
    counts[r] units of kind kinds[r] for r in starts[c]:starts[c + 1], kinds ascending."""

    starts: np.ndarray
    kinds: np.ndarray
    counts: np.ndarray  # float, as the MILP's coefficients

    @classmethod
    def of(cls, configurations: Sequence[Sequence[tuple[int, int]]]) -> "_Configurations":
        """From each configuration's (kind, count) pairs, kinds ascending."""
        n = len(configurations)
        starts = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(np.fromiter(map(len, configurations), dtype=np.int64, count=n), out=starts[1:])
        pairs = np.fromiter(itertools.chain.from_iterable(itertools.chain.from_iterable(configurations)),
                            dtype=np.int64, count=2 * int(starts[-1])).reshape(-1, 2)
        return cls(starts, pairs[:, 0].copy(), pairs[:, 1].astype(float))

    def units(self, c: int) -> list[tuple[int, int]]:
        """Configuration c's (kind, count) pairs, kinds ascending."""
        runs = slice(int(self.starts[c]), int(self.starts[c + 1]))
        return list(zip(self.kinds[runs].tolist(), self.counts[runs].astype(int).tolist()))

    def select(self, chosen: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Configurations ``chosen`` (indices, in that order): each one's number of kinds, and their kinds and
        counts, concatenated."""
        lengths = self.starts[chosen + 1] - self.starts[chosen]
        offsets = np.arange(int(lengths.sum())) - np.repeat(np.cumsum(lengths) - lengths, lengths)
        runs = np.repeat(self.starts[chosen], lengths) + offsets
        return lengths, self.kinds[runs], self.counts[runs]


def pattern_place(problem: Problem, choice: Sequence[int], lower_s: float, upper_s: float,
                  settings: PatternSettings = PatternSettings(), work: Work | None = None,
                  fallback: Placer | None = None) -> Assignment | None:
    """A plan with option ``choice[t]`` for table t, placed by device configurations, whose slowest device is
    below ``upper_s``; None when the cluster does not suit the method (nodes of mixed devices), the work runs
    out, or no such plan was found. ``lower_s``: a lower bound (where the bisection starts). ``work`` is charged
    one unit per configuration enumerated and per MILP column, and HiGHS's simplex iterations and interrupt
    checks (see _CHECK_WORK). Where the configurations are too many, ``fallback(choice, upper_s, work)`` (when
    given) places the choice instead."""
    if not have_highs():
        return None
    work = work if work is not None else Work(np.inf)
    model = _Model.build(problem, choice)
    if model is None:
        return None
    enumerated = model.enumerate(upper_s, settings.configurations)
    work.spend(settings.configurations if enumerated is None else
               sum(len(times) for per_class in enumerated for _, _, times in per_class))
    if enumerated is None:
        log.debug("pattern placement: over %d configurations, %s", settings.configurations,
                  "skipped" if fallback is None else "the fallback places it")
        return fallback(choice, upper_s, work) if fallback is not None else None
    times = sorted({t for cls in enumerated for q in cls for t in q[2] if t < upper_s * (1 - settings.min_gain)})
    lo = int(np.searchsorted(times, lower_s * (1 - 1e-9)))
    hi = len(times) - 1
    if not times:
        return None
    best = model.feasible(enumerated, times[-1], settings.checks, work)  # no plan below upper_s: one MILP says so
    if best is None:
        return None
    hi -= 1
    for _ in range(settings.steps):
        if lo > hi or work.done:
            break
        mid = (lo + hi) // 2
        solution = model.feasible(enumerated, times[mid], settings.checks, work)
        if solution is not None:
            best, hi = solution, mid - 1
        else:
            lo = mid + 1
    plan = model.realize(best)
    if problem.makespan_s(plan) >= upper_s * (1 - 1e-9):  # inf when out of memory
        return None
    return plan


@dataclass
class _Model:
    problem: Problem
    choice: list[int]
    classes: list[_NodeClass]
    node_kinds: list[list[int]]  # per node kind: its tables
    node_loads: list[list[_Loads]]  # per node class, per node kind: per-device loads
    device_kinds: list[list[tuple[int, int]]]  # per device kind: its units (table, option), one per unit
    device_loads: list[list[_Loads]]  # per node class, per device kind
    ids_send: float
    pool_recv: float

    @classmethod
    def build(cls, problem: Problem, choice: Sequence[int]) -> "_Model | None":
        dev = problem.dev
        choice = [int(o) for o in choice]
        # global units: their loads on every device
        g_compute, g_ids, g_pool = np.zeros(dev.count), np.zeros(dev.count), np.zeros(dev.count)
        g_hbm, g_host = np.zeros(dev.count), np.zeros(dev.count)
        g_keys: set = set()
        node_kind_of: dict[tuple, int] = {}
        device_kind_of: dict[tuple, int] = {}
        node_kinds: list[list[int]] = []
        device_kinds: list[list[tuple[int, int]]] = []
        for t, o in enumerate(choice):
            option, table = problem.options[t][o], problem.tables[t]
            if option.scope == "global":
                u = problem.unit(t, o, 0)
                g_compute[u.devices] += u.compute_s
                g_ids[u.devices] += u.ids_recv_bytes
                g_pool[u.devices] += u.pool_send_bytes
                g_hbm[u.devices] += u.hbm_bytes
                g_host[u.devices] += u.host_bytes
                key = problem.fused_key(option, 0)
                if key is not None:
                    g_keys.add(key)
            elif option.scope == "node":
                key = (table.rows, table.dim, table.pooling_factor, table.dtype_bytes, option.sharding, option.host)
                if key not in node_kind_of:
                    node_kind_of[key] = len(node_kinds)
                    node_kinds.append([])
                node_kinds[node_kind_of[key]].append(t)
            else:
                key = (option.lookup_bytes, option.output_bytes, option.ids_recv_bytes, option.pool_send_bytes,
                       option.memory_bytes, option.host)
                if key not in device_kind_of:
                    device_kind_of[key] = len(device_kinds)
                    device_kinds.append([])
                device_kinds[device_kind_of[key]].extend([(t, o)] * option.units)
        g_latency = np.zeros(dev.count)
        for key in sorted(g_keys):
            members, seconds = problem.fused_latency(key)
            g_latency[members] += seconds
        positions = set(problem.node_positions)
        groups: dict[tuple, list[int]] = {}
        for k, members in enumerate(dev.nodes):
            first = members[0]
            for i in members:
                if (dev.class_of[i], dev.hbm_capacity_bytes[i], dev.host_capacity_bytes[i], dev.lookup_Bps[i],
                        dev.host_Bps[i]) != (dev.class_of[first], dev.hbm_capacity_bytes[first],
                                             dev.host_capacity_bytes[first], dev.lookup_Bps[first],
                                             dev.host_Bps[first]):
                    return None  # a node of mixed devices: configurations would differ inside it
            key = (int(dev.class_of[first]), float(dev.hbm_capacity_bytes[first]),
                   float(dev.host_capacity_bytes[first]), float(dev.lookup_Bps[first]), float(dev.host_Bps[first]),
                   len(members), k in positions)
            groups.setdefault(key, []).append(k)
        classes = []
        for key in sorted(groups, key=lambda g: groups[g][0]):
            nodes = groups[key]
            members = np.array([i for k in nodes for i in dev.nodes[k]])
            node_class = _NodeClass(nodes, len(dev.nodes[nodes[0]]), nodes[0], nodes[0] in positions)
            node_class.base = _Loads(float(g_compute[members].max()), float(g_ids[members].max()),
                                     float(g_pool[members].max()), float(g_hbm[members].max()),
                                     float(g_host[members].max()))
            node_class.fixed_s = float((problem.base_time_s()[members] + g_latency[members]).max())
            node_class.s_per_byte = float(dev.a2a_s_per_byte[members].max())
            node_class.hbm_cap = float(dev.hbm_capacity_bytes[members].min())
            node_class.host_cap = float(dev.host_capacity_bytes[members].min())
            if node_class.can_hold_node_units:
                node_class.node_latency_s = max(
                    problem.fused_latency(("table_row_wise", k))[1] for k in nodes)
            classes.append(node_class)
        node_loads, device_loads = [], []
        for node_class in classes:
            per_kind = []
            for tables in node_kinds:
                t = tables[0]
                worst = _Loads()
                if node_class.can_hold_node_units:
                    for k in node_class.nodes:
                        u = problem.unit(t, choice[t], k)
                        worst = _Loads(max(worst.compute_s, float(u.compute_s.max())),
                                       max(worst.ids_recv, float(u.ids_recv_bytes.max())),
                                       max(worst.pool_send, float(u.pool_send_bytes.max())),
                                       max(worst.hbm, float(u.hbm_bytes.max())),
                                       max(worst.host, float(u.host_bytes.max())))
                per_kind.append(worst)
            node_loads.append(per_kind)
            device = dev.nodes[node_class.rep][0]
            per_device_kind = []
            for units in device_kinds:
                t, o = units[0]
                u = problem.unit(t, o, device)
                per_device_kind.append(_Loads(float(u.compute_s[0]), float(u.ids_recv_bytes[0]),
                                              float(u.pool_send_bytes[0]), float(u.hbm_bytes[0]),
                                              float(u.host_bytes[0])))
            device_loads.append(per_device_kind)
        ids_send = sum(problem.options[t][o].ids_send_bytes for t, o in enumerate(choice))
        pool_recv = sum(problem.options[t][o].pool_recv_bytes for t, o in enumerate(choice))
        return cls(problem, choice, classes, node_kinds, node_loads, device_kinds, device_loads, ids_send, pool_recv)

    # ------------------------------------------------------------------------------ enumeration
    def enumerate(self, limit_s: float, budget: int):
        """Per node class: a list of (pattern, configurations, configuration times) of every pattern and
        configuration whose device time is at most ``limit_s`` within memory; None past ``budget``
        configurations. A pattern is its (node kind, count) pairs, kinds ascending; the configurations of a
        pattern are a :class:`_Configurations`."""
        left = [budget]
        out = []
        for g, node_class in enumerate(self.classes):
            patterns: list = [((), node_class.base, 0.0)]
            if node_class.can_hold_node_units and self.node_kinds:
                patterns = []
                caps = [len(tables) for tables in self.node_kinds]
                self._multisets(node_class, self.node_loads[g], caps, node_class.base, limit_s, False, True,
                                patterns, left)
                if left[0] < 0:
                    return None
            per_class = []
            caps = [len(units) for units in self.device_kinds]
            for pattern, loads, _ in patterns:
                configs: list = []
                self._multisets(node_class, self.device_loads[g], caps, loads, limit_s, bool(pattern), False,
                                configs, left)
                if left[0] < 0:
                    return None
                if configs:
                    per_class.append((pattern, _Configurations.of([c for c, _, _ in configs]),
                                      np.array([t for _, _, t in configs])))
            out.append(per_class)
        return out

    def _multisets(self, node_class: _NodeClass, kinds: Sequence[_Loads], caps: Sequence[int], start: _Loads,
                   limit_s: float, has_node_units: bool, node_level: bool, out: list, left: list[int]) -> None:
        """Every multiset of ``kinds`` (at most caps[j] of kind j) whose device time on top of ``start`` is at
        most ``limit_s`` within memory, as (its (kind, count) pairs, kinds ascending; loads; time), depth first:
        each multiset is followed by those that add kinds no lower than its highest. Node patterns when
        ``node_level`` (then the node's fused latency counts once any is there). The time is :meth:`time_s`,
        written out on plain floats (this loop is most of the enumeration's work)."""
        count = len(kinds)
        steps = [(k.compute_s, k.ids_recv, k.pool_send, k.hbm, k.host) for k in kinds]
        ids_send, pool_recv, s_per_byte = self.ids_send, self.pool_recv, node_class.s_per_byte
        hbm_cap, host_cap = node_class.hbm_cap * (1 + 1e-12), node_class.host_cap * (1 + 1e-12)
        fixed = node_class.fixed_s
        fixed_any = fixed + node_class.node_latency_s

        def time_of(c: float, ir: float, ps: float, any_node: bool) -> float:
            a2a = (ir if ir > ids_send else ids_send) + 2.0 * (ps if ps > pool_recv else pool_recv)
            return (fixed_any if any_node else fixed) + c + s_per_byte * a2a

        counts = [0] * count
        runs: list[tuple[int, int]] = []  # the multiset at the walk's step, as (kind, count), kinds ascending
        first_time = time_of(start.compute_s, start.ids_recv, start.pool_send, has_node_units)
        if start.hbm > hbm_cap or start.host > host_cap or first_time > limit_s:
            return
        any_node = has_node_units or node_level
        # with non-negative steps every load only grows down the walk, and so (rounding being monotone) does
        # each kind's time and memory on top of it: a kind that does not fit at a step (or is used up) does not
        # fit below it either, so each step hands down only the kinds that fit at it, not all kinds
        grows = s_per_byte >= 0 and min(map(min, steps), default=0.0) >= 0
        if grows and 1 + _surely_listed(steps, caps, start, any_node, time_of, limit_s, s_per_byte, hbm_cap,
                                        host_cap) > left[0]:
            left[0] = -1  # the walk would pass the budget: what it would find is not used
            return
        out.append(((), start, first_time))
        left[0] -= 1

        def walk(candidates: list[int], c: float, ir: float, ps: float, hbm: float, host: float) -> None:
            fitting: list[int] = []  # the candidates that fit, and the loads and time with each
            states: list[tuple[float, float, float, float, float, float]] = []
            for j in candidates:
                if counts[j] >= caps[j]:
                    continue
                dc, dir_, dps, dhbm, dhost = steps[j]
                nc, nir, nps, nhbm, nhost = c + dc, ir + dir_, ps + dps, hbm + dhbm, host + dhost
                if nhbm > hbm_cap or nhost > host_cap:
                    continue
                t = time_of(nc, nir, nps, any_node)
                if t > limit_s:
                    continue
                fitting.append(j)
                states.append((nc, nir, nps, nhbm, nhost, t))
            for i, j in enumerate(fitting):
                if left[0] < 0:
                    return
                nc, nir, nps, nhbm, nhost, t = states[i]
                # j is the highest kind so far: a second unit of it extends the last run
                counts[j] += 1
                if counts[j] > 1:
                    runs[-1] = (j, counts[j])
                else:
                    runs.append((j, 1))
                out.append((tuple(runs), _Loads(nc, nir, nps, nhbm, nhost), t))
                left[0] -= 1
                walk(fitting[i:] if grows else candidates[candidates.index(j):], nc, nir, nps, nhbm, nhost)
                counts[j] -= 1
                if counts[j]:
                    runs[-1] = (j, counts[j])
                else:
                    runs.pop()

        walk(list(range(count)), start.compute_s, start.ids_recv, start.pool_send, start.hbm, start.host)
        # walk refers to itself through its closure, a cycle that would keep every configuration it saw alive
        # until the cyclic garbage collector's next full pass: clearing the name frees them now
        del walk

    # --------------------------------------------------------------------------------- the MILP
    def feasible(self, enumerated, limit_s: float, checks: int, work: Work):
        """Integers u, x covering every kind with configurations of time <= ``limit_s``; None when HiGHS finds
        none within ``checks`` interrupt checks. Rows: per node class its node count, per (class, pattern) the
        link of devices to nodes, per node kind and per device kind its count (covering). Built by columns."""
        import highspy

        n_classes, n_node_kinds, n_device_kinds = len(self.classes), len(self.node_kinds), len(self.device_kinds)
        links = [(g, q) for g, per_class in enumerate(enumerated) for q in range(len(per_class))]
        link_row = {key: n_classes + i for i, key in enumerate(links)}
        node_row0 = n_classes + len(links)
        device_row0 = node_row0 + n_node_kinds
        n_rows = device_row0 + n_device_kinds
        starts, index, value, upper, columns = [], [], [], [], []
        for g, per_class in enumerate(enumerated):
            node_class = self.classes[g]
            for q, (pattern, configs, times) in enumerate(per_class):
                usable = np.flatnonzero(times <= limit_s)
                if times[0] > limit_s or not len(usable):
                    continue
                starts.append(len(index))
                index.extend([g, link_row[g, q]] + [node_row0 + k for k, _ in pattern])
                value.extend([1.0, -float(node_class.size)] + [float(n) for _, n in pattern])
                upper.append(float(len(node_class.nodes)))
                columns.append(("u", g, q))
                # each configuration's column: its link row, then its device kinds
                lengths, kinds, counts = configs.select(usable)
                first = np.concatenate(([0], np.cumsum(lengths + 1)[:-1]))
                block_index = np.empty(len(usable) + len(kinds), dtype=np.int64)
                block_value = np.empty(len(block_index))
                block_index[first] = link_row[g, q]
                block_value[first] = 1.0
                rest = np.ones(len(block_index), dtype=bool)
                rest[first] = False
                block_index[rest] = device_row0 + kinds
                block_value[rest] = counts
                starts.extend((len(index) + first).tolist())
                index.extend(block_index.tolist())
                value.extend(block_value.tolist())
                upper.extend([float(node_class.size * len(node_class.nodes))] * len(usable))
                columns.extend(("x", g, q, int(c)) for c in usable)
        n = len(columns)
        work.spend(n)
        if not n:
            return None
        inf = highspy.kHighsInf
        lows = np.zeros(n_rows)
        highs_ = np.zeros(n_rows)
        for g, node_class in enumerate(self.classes):
            lows[g] = highs_[g] = float(len(node_class.nodes))
        for k, tables in enumerate(self.node_kinds):
            lows[node_row0 + k], highs_[node_row0 + k] = float(len(tables)), inf
        for j, units in enumerate(self.device_kinds):
            lows[device_row0 + j], highs_[device_row0 + j] = float(len(units)), inf
        highs = quiet_highs()
        highs.addRows(n_rows, lows, highs_, 0, np.zeros(0, dtype=np.int32), np.zeros(0, dtype=np.int32),
                      np.zeros(0))
        highs.addCols(n, np.zeros(n), np.zeros(n), np.array(upper), len(index), np.array(starts, dtype=np.int32),
                      np.array(index, dtype=np.int32), np.array(value))
        # the LP relaxation first: where it is infeasible (most trial changes) so is the MILP
        highs.run()
        lp = highs.getInfo()
        work.spend(_SIMPLEX_ITERATION_WORK * float(lp.simplex_iteration_count))
        if highs.getModelStatus() == highspy.HighsModelStatus.kInfeasible:
            return None
        set_integer(highs, np.arange(n))
        limit = CheckLimit(checks)
        limit.attach(highs)
        highs.run()
        info = highs.getInfo()
        work.spend(_SIMPLEX_ITERATION_WORK * float(info.simplex_iteration_count) + _CHECK_WORK * limit.seen)
        log.debug("pattern MILP: %d columns, %d simplex iterations, %d nodes", n, info.simplex_iteration_count,
                  info.mip_node_count)
        if info.primal_solution_status != highspy.kSolutionStatusFeasible:
            return None
        values = np.rint(np.array(highs.getSolution().col_value)).astype(int)
        return [(columns[i], int(values[i])) for i in range(n) if values[i] > 0], enumerated

    # ------------------------------------------------------------------------------ the plan
    def realize(self, solution) -> Assignment:
        """Nodes take patterns and devices configurations in index order; kinds hand out their tables and
        units in table order (surplus slots stay empty)."""
        chosen, enumerated = solution
        problem, dev = self.problem, self.problem.dev
        positions: list[list[int]] = [[] for _ in self.choice]
        for t, o in enumerate(self.choice):
            if problem.options[t][o].scope == "global":
                positions[t] = [0]
        node_pool = [list(tables) for tables in self.node_kinds]
        device_pool = [list(units) for units in self.device_kinds]
        patterns = {(g, q): n for (kind, g, q, *_), n in chosen if kind == "u"}
        configs: dict[tuple[int, int], list[tuple[int, int]]] = {}
        for (kind, g, q, *rest), n in chosen:
            if kind == "x":
                configs.setdefault((g, q), []).append((rest[0], n))
        for g, node_class in enumerate(self.classes):
            free_nodes = list(node_class.nodes)
            for (gg, q), n in sorted(patterns.items()):
                if gg != g:
                    continue
                pattern, configurations, _ = enumerated[g][q]
                slots = [c for c, m in configs.get((g, q), []) for _ in range(m)]
                for _ in range(n):
                    k = free_nodes.pop(0)
                    for kind, m in pattern:
                        for _ in range(m):
                            if node_pool[kind]:
                                positions[node_pool[kind].pop(0)].append(k)
                    for i in dev.nodes[k]:
                        c = slots.pop(0)
                        for kind, m in configurations.units(c):
                            for _ in range(m):
                                if device_pool[kind]:
                                    t, _o = device_pool[kind].pop(0)
                                    positions[t].append(int(i))
        return tuple((int(o), tuple(positions[t])) for t, o in enumerate(self.choice))


def _surely_listed(steps: Sequence[tuple[float, float, float, float, float]], caps: Sequence[int], start: _Loads,
                   any_node: bool, time_of: Callable[[float, float, float, bool], float], limit_s: float,
                   s_per_byte: float, hbm_cap: float, host_cap: float) -> int:
    """How many nonempty multisets the configuration walk lists on top of ``start`` at least: every kind that
    fits alone (timed as the walk times it, ``any_node`` saying whether the node's latency is paid below the
    start), and every pair of them that fits for sure. A pair fits for sure when each of its kinds takes at
    most half the memory left and the start's time plus each kind's own lookups and all-to-all bytes, counted
    as if no other traffic hid them, stays within ``limit_s`` (a kind adds at most that to any device's time);
    a relative margin keeps the sums' rounding inside. Counting them costs a sort, where listing them walks every
    configuration up to the budget."""
    fits = [j for j, (dc, dir_, dps, dhbm, dhost) in enumerate(steps)
            if caps[j] >= 1 and start.hbm + dhbm <= hbm_cap and start.host + dhost <= host_cap
            and time_of(start.compute_s + dc, start.ids_recv + dir_, start.pool_send + dps, any_node) <= limit_s]
    sure = 1.0 - SURE_MARGIN
    room_hbm, room_host = (hbm_cap * sure - start.hbm) / 2.0, (host_cap * sure - start.host) / 2.0
    half = np.array([j for j in fits if steps[j][3] <= room_hbm and steps[j][4] <= room_host], dtype=int)
    if not half.size:
        return len(fits)
    kinds = np.asarray(steps, dtype=float)[half]
    alone = kinds[:, 0] + s_per_byte * (kinds[:, 1] + 2.0 * kinds[:, 2])
    room = limit_s * sure - time_of(start.compute_s, start.ids_recv, start.pool_send, any_node)
    twice = int(np.count_nonzero((2.0 * alone <= room) & (np.asarray(caps)[half] >= 2)))
    alone.sort()
    # per kind (in sorted order), the later kinds whose time added to its own stays within the room
    within = np.searchsorted(alone, room - alone, side="right") - np.arange(1, len(alone) + 1)
    return len(fits) + twice + int(np.maximum(within, 0).sum())


@dataclass(frozen=True)
class ChoiceSettings:
    """Work of the search over option choices: ``work`` in the units :func:`pattern_place` charges
    (configurations, MILP columns, simplex iterations, interrupt checks x _CHECK_WORK; shard_tables sizes it
    from its budget, budget.Budget.choice), and the settings of each placement: ``start`` for the
    starting choices, ``pattern`` for the trial changes, ``final`` (with ``final_work``) for the choice kept."""

    work: float = 1_000_000.0
    pattern: PatternSettings = PatternSettings()
    # the few starting choices get more checks per MILP (a guide's choice can need more than the trial changes'
    # count to be shown feasible)
    start: PatternSettings = PatternSettings(checks=30)
    # the best choice at the end: bisection down to the least configuration time HiGHS shows feasible
    final: PatternSettings = PatternSettings(steps=16, min_gain=0.0)
    final_work: float = 100_000.0
    # where a trial choice has too many configurations to enumerate, the greedy + ``greedy_rounds`` rounds of
    # local search (at most ``greedy_evaluations`` device-time evaluations) place it instead
    greedy_rounds: int = 300
    greedy_evaluations: int = 20_000
    # iterated local search once the first descent ends with work left: at most ``kicks`` random changes, each
    # placed within ``kick`` (relative) of the best plan
    kicks: int = 1000
    kick: float = 0.01
    seed: int = 0  # of the kicks' random changes


def improve_choice(problem: Problem, assignment: Assignment, lower_s: float, starts: Sequence[Sequence[int]] = (),
                   settings: ChoiceSettings = ChoiceSettings()) -> Assignment:
    """The configuration placement of ``assignment``'s option choice and of each choice in ``starts`` (e.g. the
    class MILP's), then compound option changes by table kind (tables with the same rows, dim, pooling and
    options are interchangeable), each judged by its exact configuration placement (:func:`pattern_place`):
    move 1, half (rounded down and up) or all of a kind's tables that share an option to another option; keep
    the first change whose placement beats the best plan so far and start over (kinds on the slowest devices
    first), until the work is spent or no change helps. Then, while work is left, iterated local search: a seeded
    random change of one kind, placed within ``settings.kick`` of the best plan, and the same descent from there; a
    better end is the new best. Every new best choice gets a deeper bisection (``settings.final``). Returns a plan
    no slower than ``assignment``, within memory whenever it is (the same plan when nothing helped).
    """
    if not have_highs():
        return assignment
    best_s = problem.makespan_s(assignment)
    if not np.isfinite(best_s):  # out of memory
        return assignment
    choice = [int(o) for o, _ in assignment]
    current = assignment
    work = Work(settings.work)
    for start in [choice] + [list(s) for s in starts]:
        if work.done:
            break
        plan = pattern_place(problem, start, lower_s, best_s, settings.start, work)
        if plan is not None:
            current, best_s, choice = plan, problem.makespan_s(plan), [int(o) for o in start]
    kinds = _table_kinds(problem)
    fallback = _greedy_placement(problem, settings)
    current, best_s, choice = _descend(problem, current, best_s, choice, kinds, lower_s, settings, work, fallback)
    if current is assignment:  # nothing kept: the first test already found no better placement of it
        best = current
    else:
        best, best_s = _polish(problem, current, best_s, choice, lower_s, settings)
    rng = np.random.default_rng(settings.seed)
    for kick in range(settings.kicks):
        if work.done or best_s <= lower_s * (1 + 1e-6):
            break
        work.spend(1.0)
        moves = list(_kind_moves(problem, kinds[int(rng.integers(len(kinds)))], choice))
        if not moves:
            continue
        trial = moves[int(rng.integers(len(moves)))]
        plan = pattern_place(problem, trial, lower_s, best_s * (1 + settings.kick), settings.pattern, work, fallback)
        if plan is None:
            continue
        current, current_s, trial = _descend(problem, plan, problem.makespan_s(plan), trial, kinds, lower_s,
                                             settings, work, fallback)
        if current_s < best_s * (1 - 1e-9):
            log.debug("option search: kick %d ends at %.6f s", kick, current_s)
            best, best_s = _polish(problem, current, current_s, trial, lower_s, settings)
            choice = trial
    return best


def _descend(problem: Problem, current: Assignment, current_s: float, choice: list[int], kinds: list[list[int]],
             lower_s: float, settings: ChoiceSettings, work: Work, fallback: Placer
             ) -> tuple[Assignment, float, list[int]]:
    """First-improvement descent over :func:`_kind_moves` from ``current`` (option ``choice``, slowest device
    ``current_s``), kinds on the slowest devices first: keep the first change whose placement beats the plan so
    far and start over, until no change helps or the work is spent."""
    kinds = _bottleneck_first(problem, current, kinds)
    improved = True
    while improved and not work.done and current_s > lower_s * (1 + 1e-6):
        improved = False
        for tables in kinds:
            for trial in _kind_moves(problem, tables, choice):
                if work.done:
                    break
                plan = pattern_place(problem, trial, lower_s, current_s, settings.pattern, work, fallback)
                if plan is not None:
                    changed = [t for t in tables if trial[t] != choice[t]]
                    current, current_s, choice, improved = plan, problem.makespan_s(plan), trial, True
                    log.debug("option search: %.6f s, %d tables of kind %s to %s", current_s, len(changed),
                              problem.tables[changed[0]].name, problem.options[changed[0]][trial[changed[0]]])
                    break
            if improved:
                kinds = _bottleneck_first(problem, current, kinds)
                break
    return current, current_s, choice


def _polish(problem: Problem, current: Assignment, current_s: float, choice: list[int], lower_s: float,
            settings: ChoiceSettings) -> tuple[Assignment, float]:
    """The changes were judged with a few bisection steps; a new best choice gets more, with work of its own."""
    plan = pattern_place(problem, choice, lower_s, current_s, settings.final, Work(settings.final_work))
    return (plan, problem.makespan_s(plan)) if plan is not None else (current, current_s)


def _greedy_placement(problem: Problem, settings: ChoiceSettings) -> Placer:
    """The judge of trial choices whose configurations are too many to enumerate (many kinds on mixed
    clusters): the greedy placement and a short local search, a plan
    when it beats the bound to beat by ``settings.pattern.min_gain``; its evaluations are charged to the search's
    work (EVALUATION_WORK each)."""

    def place(choice: Sequence[int], upper_s: float, work: Work) -> Assignment | None:
        own = Work(settings.greedy_evaluations)
        state = greedy(problem, list(choice), own)
        if state is not None:
            state = local_search(state, max_rounds=settings.greedy_rounds)
        work.spend(EVALUATION_WORK * (settings.greedy_evaluations - own.left))
        if state is None:
            return None
        plan = state.assignment()
        return plan if problem.makespan_s(plan) < upper_s * (1 - settings.pattern.min_gain) else None

    return place


def _bottleneck_first(problem: Problem, assignment: Assignment, kinds: list[list[int]]) -> list[list[int]]:
    """``kinds`` with those that have a unit on a device within 0.5% of the slowest first (each part in its
    order): changing what the slowest devices hold is what can lower them."""
    dev = problem.dev
    times = problem.device_time_s(problem.evaluate(assignment))
    slow = set(np.flatnonzero(times >= float(times.max()) * (1 - 5e-3)).tolist())
    slow_nodes = {int(dev.node_of[i]) for i in slow}
    on_slow = set()
    for t, (o, positions) in enumerate(assignment):
        scope = problem.options[t][o].scope
        if (scope == "device" and slow.intersection(positions)) or (scope == "node" and slow_nodes.intersection(
                positions)):
            on_slow.add(t)
    first = [tables for tables in kinds if on_slow.intersection(tables)]
    return first + [tables for tables in kinds if not on_slow.intersection(tables)]


def _table_kinds(problem: Problem) -> list[list[int]]:
    """Tables alike in everything the cost model reads (rows, dim, pooling, dtype) and so in their options,
    largest (by rows x dim x pooling) first."""
    def size(ts) -> tuple[float, int]:
        table = problem.tables[ts[0]]
        return -table.rows * table.dim * table.pooling_factor, ts[0]

    return sorted((list(ts) for ts in problem.table_kinds), key=size)


def _kind_moves(problem: Problem, tables: list[int], choice: list[int]):
    """Trial choices for one kind: for each option its tables hold, 1, half (rounded down and up) or all of
    those tables (the last ones first) to each other option, the finest splits first (many small units are
    what balances devices whose big units differ)."""
    options = problem.options[tables[0]]
    targets = sorted(range(len(options)), key=lambda o: (-options[o].units, o))
    for a in sorted({choice[t] for t in tables}):
        holders = [t for t in tables if choice[t] == a]
        n = len(holders)
        for r in sorted({1, n // 2, (n + 1) // 2, n} - {0}):
            for b in targets:
                if b == a:
                    continue
                trial = list(choice)
                for t in holders[len(holders) - r:]:
                    trial[t] = b
                yield trial
