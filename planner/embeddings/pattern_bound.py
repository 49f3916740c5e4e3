"""A lower bound from device patterns: the configuration LP of the per-device problem, by column generation.

The class LP and MILP (milp.py) pool the devices of a class: a class's all-to-all excess (a device receiving
more ids than every device sends, or sending more pooled outputs than every device receives) is charged on the
class's sums, while the excess is a convex function of each device's own loads. Here every device is a
*pattern*: how many units of each (table kind, option) it carries -- device-scope shards, its share of the
node-wide (table-row-wise) tables of its node, and the data-parallel and row-wise tables every device carries.
Tables of one kind (same rows, dim, pooling factor, element size) are interchangeable, so the LP is over kinds.

For a target time T and a box of the quantities every device shares -- the ids each device sends (IS), the pooled
bytes each device receives (PR) and, per class, the time of the global (data-parallel, row-wise) units every device
of the class carries (G_c), all linear in the option choices -- and a *mode* (which global sharding types are chosen
at all: each then costs every device its fused collective's latency), the LP asks for option counts per kind and
devices per pattern (at most the devices of each class) that place every unit, using only patterns whose device
time, with IS, PR and G at the box's low corner, is at most T. Every plan with slowest device below T gives a
solution of the LP of the box that holds its IS, PR, G_c and mode (its devices' patterns, its option counts), so T
is a valid lower bound when the LP of every box is infeasible. The boxes are split in two until each is infeasible
or small (then T is not certified); the half that holds the LP's solution is tried first, so that where T is not
certified a small feasible box (and its option counts, which pattern_primal.py turns into plans) is found sooner.
Targets rise from the best bound known in steps of 0.5% while they are certified. Four aggregate rows bound the
option counts directly: summed over devices, time = base + latency + compute + G + s x (max(IS, ids received) + 2
max(PR, pooled sent)) <= T, each max taken as its first term on every device or as the summed second terms; they let
the master reject most boxes before any pricing. Four rows per class do the same over the class's devices with each
pattern's own compute, latency, ids and pooled bytes (the pricing MILPs pay their duals too). G has a side per
class: on mixed clusters a slower class pays far more for small data-parallel tables than any fixed ratio to
another class's G would say.

Cost: a pricing MILP is small (tenths of a second at most); shard_tables runs this bound only in its deep stage,
with a budget past budget.STAGE_WORK_CAP times the default.

Relaxations, each valid: global units are counted per class for memory and ids, not per device (their time is
G, on every device); node-wide shares are not tied to one node; a table-row-wise fused collective's latency is
paid by a device that carries a unit of the kind; per-device terms take the least over the class.

Column generation: the master's phase-one LP (least uncovered units) gives duals; the pricing problem per class
is a small MILP (the pattern within T and memory that the duals value most). A box is infeasible when the
master still leaves units uncovered and the pricing's dual bound proves that no pattern can help (the
Lagrangian bound of the phase-one LP is positive). Work is counted in pricing solves and HiGHS interrupt
checks, never the clock. Column generation tails off (the master is degenerate: many pricing solves leave its
value unchanged), so each pricing solve adds several columns of positive reduced cost, each within T and memory:
its pattern, the other patterns HiGHS found on the way, and the patterns one unit away (one unit more, or one
given up for another) from its pattern and from the master's most used patterns of the class; a longer solve,
to prove that no pattern helps, runs only where none of them is new (several columns per solve need far fewer
pricing solves for the same bound than one).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np

from planner.embeddings.highs import GB_PER_BYTE, MB_PER_BYTE, US_PER_S, CheckLimit, add_rows, quiet_highs, set_integer
from planner.embeddings.milp import class_bins
from planner.embeddings.problem import Problem

log = logging.getLogger(__name__)

_FEASIBLE = 1e-6  # uncovered units below this: the box's LP is feasible


@dataclass(frozen=True)
class PatternBoundSettings:
    pricing_solves: int = 3000  # over all targets
    pricing_checks: int = 2000  # HiGHS interrupt checks per pricing MILP that must prove its value
    quick_checks: int = 20  # per pricing MILP that only looks for a pattern
    step: float = 0.005  # targets rise from the known bound in steps of this share of it
    box_tolerance: float = 0.002  # a box is small when IS and PR spread move a device's time by this share of T
    max_boxes: int = 400  # per target
    neighbours: int = 10  # per pricing: columns one unit away from its pattern (see PatternBound._neighbours)
    used_patterns: int = 10  # per pricing: the master's most used patterns of the class whose neighbours are tried
    used_neighbours: int = 2  # columns per such pattern


@dataclass(frozen=True)
class _Unit:
    row: int  # coverage row (kind, option)
    scope: str  # device | node | global
    per_table: float  # coverage coefficient: units per table (device), 1/node size (node), 1 (global)
    upper: int  # most a device can carry
    latency: int  # fused collective it uses: -1 none, else index into _Class.latency_us
    compute_us: float
    ids_mb: float
    pooled_mb: float
    hbm_gb: float
    host_gb: float


@dataclass(frozen=True)
class _Class:
    devices: int
    base_us: float
    s_per_mb: float
    hbm_gb: float
    host_gb: float
    latency_us: tuple[float, ...]
    units: tuple[_Unit, ...]
    shared_us: tuple[float, ...]  # per (kind, option) row: compute of a global unit on every device, else 0


class _Model:
    """Kinds, options and classes of a problem in pattern form."""

    def __init__(self, problem: Problem) -> None:
        self.problem = problem
        self.kinds = [len(ts) for ts in problem.table_kinds]
        self.first = [ts[0] for ts in problem.table_kinds]
        self.rows: list[tuple[int, int]] = []  # (kind, option index)
        for k, t in enumerate(self.first):
            self.rows.extend((k, o) for o in range(len(problem.options[t])))
        row_options = [problem.options[self.first[k]][o] for k, o in self.rows]
        self.ids_mb = np.array([option.ids_send_bytes * MB_PER_BYTE for option in row_options])
        self.pooled_mb = np.array([option.pool_recv_bytes * MB_PER_BYTE for option in row_options])
        self.global_latency_us: dict[str, float] = {}  # per global sharding type: its fused collective's latency
        self.classes = self._classes()
        self.global_types = tuple(sorted(self.global_latency_us))
        self.global_rows = {g: [r for r, (k, o) in enumerate(self.rows)
                                if problem.options[self.first[k]][o].sharding == g] for g in self.global_types}

    def _classes(self) -> list[_Class] | None:
        problem, dev = self.problem, self.problem.dev
        bins = class_bins(problem)
        classes = []
        base = problem.base_time_s()
        for members in bins.members:
            member_set = {int(i) for i in members}
            nodes = [k for k in problem.node_positions if member_set & set(dev.nodes[k])]
            if any(not set(dev.nodes[k]) <= member_set for k in nodes) or len({len(dev.nodes[k]) for k in nodes}) > 1:
                return None  # a node-wide unit would load devices of two classes
            latency: dict[tuple[str, int], int] = {}
            latency_us: list[float] = []
            shared_us = [0.0] * len(self.rows)

            def latency_index(key) -> int:
                if key is None:
                    return -1
                if key[0] == "table_row_wise":
                    key = ("table_row_wise", -1)
                    seconds = problem.fused_latency(("table_row_wise", nodes[0]))[1]
                else:
                    seconds = problem.fused_latency(key)[1]
                if key not in latency:
                    latency[key] = len(latency_us)
                    latency_us.append(seconds * US_PER_S)
                return latency[key]

            units = []
            for row, (k, o) in enumerate(self.rows):
                t = self.first[k]
                option = problem.options[t][o]
                if option.scope == "device":
                    loads = [problem.unit(t, o, int(i)) for i in members]
                    per_table, upper = float(option.units), self.kinds[k] * option.units
                    key = None
                elif option.scope == "node":
                    if not nodes:
                        continue
                    loads = [problem.unit(t, o, k_) for k_ in nodes[:1]]
                    per_table, upper = 1.0 / len(dev.nodes[nodes[0]]), self.kinds[k]
                    key = problem.fused_key(option, nodes[0])
                else:
                    loads = [problem.unit(t, o, 0)]
                    per_table, upper = 1.0, self.kinds[k]
                    key = problem.fused_key(option, 0)
                compute, ids, pooled, hbm, host = (
                    min(float(np.min(getattr(u, name)[np.isin(u.devices, members)])) for u in loads)
                    for name in ("compute_s", "ids_recv_bytes", "pool_send_bytes", "hbm_bytes", "host_bytes"))
                if option.scope == "global":  # every device carries it: its time is shared, not a pattern's
                    shared_us[row] = compute * US_PER_S
                    self.global_latency_us[option.sharding] = problem.fused_latency(key)[1] * US_PER_S
                    units.append(_Unit(row, option.scope, per_table, int(upper), -1, 0.0, ids * MB_PER_BYTE,
                                       pooled * MB_PER_BYTE, hbm * GB_PER_BYTE, host * GB_PER_BYTE))
                    continue
                units.append(_Unit(row, option.scope, per_table, int(upper), latency_index(key), compute * US_PER_S,
                                   ids * MB_PER_BYTE, pooled * MB_PER_BYTE, hbm * GB_PER_BYTE, host * GB_PER_BYTE))
            classes.append(_Class(
                len(members), float(base[members].min()) * US_PER_S,
                float(dev.a2a_s_per_byte[members].min()) * US_PER_S / MB_PER_BYTE,
                float(dev.hbm_capacity_bytes[members].max()) * GB_PER_BYTE,
                float(dev.host_capacity_bytes[members].max()) * GB_PER_BYTE,
                tuple(latency_us), tuple(units), tuple(shared_us)))
        return classes

    def mode_latency_us(self, mode: int) -> float:
        """The fused collectives' latency every device pays for the global sharding types of bit mask ``mode``."""
        return float(sum(self.global_latency_us[g] for j, g in enumerate(self.global_types) if mode >> j & 1))

    def range_mb(self, values: np.ndarray) -> tuple[float, float]:
        """Least and most of a per-option quantity summed over the tables' choices."""
        low = high = 0.0
        for k, count in enumerate(self.kinds):
            chosen = [values[r] for r, (kk, _) in enumerate(self.rows) if kk == k]
            low += count * min(chosen)
            high += count * max(chosen)
        return low, high


@dataclass(frozen=True)
class Pattern:
    cls: int
    counts: tuple[int, ...]  # per unit of the class
    compute_us: float
    ids_mb: float
    pooled_mb: float
    latency_us: float

    @classmethod
    def of(cls, ci: int, c: _Class, counts: tuple[int, ...]) -> "Pattern":
        n = np.array(counts, dtype=float)
        used = {u.latency for k, u in zip(counts, c.units) if k and u.latency >= 0}
        return cls(ci, counts, float(n @ np.array([u.compute_us for u in c.units])),
                   float(n @ np.array([u.ids_mb for u in c.units])),
                   float(n @ np.array([u.pooled_mb for u in c.units])),
                   sum(c.latency_us[j] for j in sorted(used)))

    def time_us(self, c: _Class, ids_floor_mb: float, pooled_floor_mb: float) -> float:
        return (c.base_us + self.latency_us + self.compute_us
                + c.s_per_mb * (max(ids_floor_mb, self.ids_mb) + 2.0 * max(pooled_floor_mb, self.pooled_mb)))


class _Pricing:
    """The pricing MILP of one class, built once: per call its objective, time limit and floors change."""

    def __init__(self, c: _Class, checks: int) -> None:
        import highspy

        self.c = c
        self.checks = checks
        inf = highspy.kHighsInf
        nu, nl = len(c.units), len(c.latency_us)
        self.nu = nu
        self.ncol = ncol = nu + 2 + nl  # counts, A (ids MB), P (pooled MB), latency indicators
        self.upper = np.array([float(u.upper) for u in c.units] + [inf, inf] + [1.0] * nl)
        self.compute_us, self.ids_mb, self.pooled_mb, self.hbm_gb, self.host_gb = (
            np.array([getattr(u, name) for u in c.units], dtype=float)
            for name in ("compute_us", "ids_mb", "pooled_mb", "hbm_gb", "host_gb"))
        self.uses = np.zeros((nu, nl))  # unit -> the fused collective whose latency it costs
        for j, u in enumerate(c.units):
            if u.latency >= 0:
                self.uses[j, u.latency] = 1.0
        highs = self.highs = quiet_highs()
        highs.setOptionValue("mip_rel_gap", 1e-6)
        highs.setOptionValue("mip_improving_solution_save", True)  # more columns per solve (best's ``found``)
        # presolve stays on: off, a target is cheaper, but the patterns found differ and the same count of
        # pricing solves certifies a lower bound
        highs.addVars(ncol, np.zeros(ncol), self.upper)
        ints = list(range(nu)) + list(range(nu + 2, ncol))
        set_integer(highs, ints)
        rows = []
        time_row = np.zeros(ncol)
        time_row[:nu] = [u.compute_us for u in c.units]
        time_row[nu] = c.s_per_mb
        time_row[nu + 1] = 2.0 * c.s_per_mb
        time_row[nu + 2:] = c.latency_us
        rows.append((time_row, -inf, inf))  # row 0: its upper bound is T - base, set per call
        ids = np.zeros(ncol)
        ids[:nu] = [-u.ids_mb for u in c.units]
        ids[nu] = 1.0
        rows.append((ids, 0.0, inf))
        pooled = np.zeros(ncol)
        pooled[:nu] = [-u.pooled_mb for u in c.units]
        pooled[nu + 1] = 1.0
        rows.append((pooled, 0.0, inf))
        hbm = np.zeros(ncol)
        hbm[:nu] = [u.hbm_gb for u in c.units]
        rows.append((hbm, -inf, c.hbm_gb))
        if any(u.host_gb for u in c.units):
            host = np.zeros(ncol)
            host[:nu] = [u.host_gb for u in c.units]
            rows.append((host, -inf, c.host_gb))
        for j, u in enumerate(c.units):
            if u.latency >= 0:
                link = np.zeros(ncol)
                link[j] = 1.0
                link[nu + 2 + u.latency] = -float(u.upper)
                rows.append((link, -inf, 0.0))
        add_rows(highs, rows)

    def worth(self, counts, value: np.ndarray, latency_value: np.ndarray) -> float:
        """What ``value`` (per unit) and ``latency_value`` (per fused collective the pattern pays) give
        ``counts``."""
        used = sorted({u.latency for n, u in zip(counts, self.c.units) if n and u.latency >= 0})
        return float(value @ np.array(counts, dtype=float)) + float(sum(latency_value[j] for j in used))

    def best(self, value: np.ndarray, latency_value: np.ndarray, target_us: float, ids_floor_mb: float,
             pooled_floor_mb: float, checks: int | None = None, hbm_gb: float | None = None):
        """(the pattern the values ``value`` (per unit) and ``latency_value`` (per fused collective it pays, at
        most 0) favour most within target and memory (``hbm_gb`` where given, else the class's), a proven upper
        bound on its value); the pattern is None where none was found. ``self.found`` holds every pattern the
        solve found on the way (its improving incumbents, the last one included): each fits target and memory."""
        import highspy

        highs, nu = self.highs, self.nu
        self.found: list[tuple[int, ...]] = []
        if not np.any(value > 1e-12):
            return (0,) * nu, 0.0  # the empty pattern
        cost = np.zeros(self.ncol)
        cost[:nu] = -value
        cost[nu + 2:] = -latency_value
        highs.changeColsCost(self.ncol, np.arange(self.ncol, dtype=np.int32), cost)
        highs.changeRowBounds(0, -highspy.kHighsInf, target_us - self.c.base_us)
        lower = np.zeros(self.ncol)
        lower[nu] = ids_floor_mb
        lower[nu + 1] = pooled_floor_mb
        upper = self.upper.copy()
        upper[:nu][value <= 1e-12] = 0.0  # a unit nobody pays for only adds time and memory
        highs.changeColsBounds(self.ncol, np.arange(self.ncol, dtype=np.int32), lower, upper)
        highs.clearSolver()
        highs.changeRowBounds(3, -highspy.kHighsInf, self.c.hbm_gb if hbm_gb is None else hbm_gb)
        CheckLimit(checks or self.checks).attach(highs)
        highs.run()
        info = highs.getInfo()
        if highs.getModelStatus() == highspy.HighsModelStatus.kInfeasible:
            return None, -np.inf
        dual = float(info.mip_dual_bound)
        proven = -dual if np.isfinite(dual) else float(value[value > 0] @ upper[:nu][value > 0])
        if info.primal_solution_status != highspy.kSolutionStatusFeasible:
            return None, proven
        self.found = [tuple(int(x) for x in np.round(np.array(solution.col_value[:nu])))
                      for solution in highs.getSavedMipSolutions()]
        counts = tuple(int(x) for x in np.round(np.array(highs.getSolution().col_value[:nu])))
        return counts, proven


    def neighbours(self, counts, value: np.ndarray, device_dual: float, target_us: float, ids_floor_mb: float,
                   pooled_floor_mb: float, limit: int,
                   latency_value: np.ndarray | None = None) -> list[tuple[int, ...]]:
        """Up to ``limit`` patterns one unit away from ``counts`` (one more unit j, or one unit i given up for a
        unit j) that fit ``target_us`` (with the floors) and memory, as the pricing MILP's constraints say, and
        whose reduced cost -- ``value`` per unit, ``latency_value`` per fused collective the pattern pays (none:
        0), plus ``device_dual`` -- is positive, best first. They cost no solve: a pricing's pattern is one vertex
        of a flat face, and its neighbours are columns the master takes next."""
        c, n = self.c, np.array(counts, dtype=float)
        units = self.upper[:self.nu]
        gain = np.flatnonzero((value > 1e-12) & (n < units))  # units j worth one more
        if limit <= 0 or not len(gain):
            return []
        drop = np.concatenate([[-1], np.flatnonzero(n)])  # units i given up, -1: none
        given = drop >= 0
        at = np.maximum(drop, 0)

        def after(per_unit: np.ndarray) -> np.ndarray:  # (drop, gain) -> the neighbour's sum
            return float(n @ per_unit) + per_unit[gain][None, :] - np.where(given, per_unit[at], 0.0)[:, None]

        if self.uses.shape[1]:
            used = (n @ self.uses)[None, None, :] + self.uses[gain][None, :, :] \
                - np.where(given[:, None], self.uses[at], 0.0)[:, None, :]
            latency_us = (used > 0.5) @ np.array(c.latency_us)
            paid = 0.0 if latency_value is None else (used > 0.5) @ latency_value
        else:
            latency_us = paid = 0.0
        time_us = (c.base_us + latency_us + after(self.compute_us)
                   + c.s_per_mb * (np.maximum(ids_floor_mb, after(self.ids_mb))
                                   + 2.0 * np.maximum(pooled_floor_mb, after(self.pooled_mb))))
        reduced = after(value) + paid + device_dual
        fits = ((time_us <= target_us) & (after(self.hbm_gb) <= c.hbm_gb) & (after(self.host_gb) <= c.host_gb)
                & (reduced > 1e-9) & (drop[:, None] != gain[None, :]))
        i, j = np.nonzero(fits)
        out = []
        for k in np.argsort(-reduced[i, j], kind="stable")[:limit]:
            m = np.array(counts)
            if given[i[k]]:
                m[drop[i[k]]] -= 1
            m[gain[j[k]]] += 1
            out.append(tuple(int(x) for x in m))
        return out


def _g_sides(box) -> list[tuple[float, float]]:
    """A box's G sides, one per class: (least, most) global units' time of a device of the class."""
    return [(box[j], box[j + 1]) for j in range(4, len(box) - 1, 2)]


class PatternBound:
    """The master LP, built once; patterns are added as columns, and each (target, box) sets the bounds of the
    IS and PR rows and which patterns are usable (column upper bound 0 or infinity)."""

    def __init__(self, problem: Problem, settings: PatternBoundSettings = PatternBoundSettings()) -> None:
        self.model = _Model(problem)
        self.settings = settings
        self.pricing_left = settings.pricing_solves
        self.exhausted = False
        self.feasible_counts: np.ndarray | None = None  # option counts of the last box whose LP was feasible
        self.feasible_target_us = 0.0  # and the target it was feasible at
        self._feasible_here = False  # whether the last box_feasible call found its LP feasible
        self.patterns: list[Pattern] = []
        self._seen: set[tuple[int, tuple[int, ...]]] = set()
        if self.model.classes is None:
            return
        self._pricing = [_Pricing(c, settings.pricing_checks) for c in self.model.classes]
        self._build_master()
        for ci, c in enumerate(self.model.classes):
            self._add(ci, (0,) * len(c.units))

    @property
    def usable(self) -> bool:
        return self.model.classes is not None

    def pricing(self, ci: int) -> _Pricing:
        """The pricing MILP of class ``ci`` (pattern_primal.py prices with it too)."""
        return self._pricing[ci]

    def _build_master(self) -> None:
        import highspy

        inf = highspy.kHighsInf
        model = self.model
        nr = len(model.rows)
        # columns: z per (kind, option) row, then uncovered per row; patterns are appended
        upper = np.array([float(model.kinds[k]) for k, _ in model.rows] + [inf] * nr)
        highs = self.master = quiet_highs()
        highs.addVars(2 * nr, np.zeros(2 * nr), upper)
        cost = np.concatenate([np.zeros(nr), np.ones(nr)])
        highs.changeColsCost(2 * nr, np.arange(2 * nr, dtype=np.int32), cost)
        rows = []
        self.cover_row: dict[int, int] = {}  # (kind, option) row -> master row (device and node scope)
        self.global_row: dict[tuple[int, int], int] = {}  # ((kind, option) row, class) -> master row
        for r, (k, o) in enumerate(model.rows):
            option = model.problem.options[model.first[k]][o]
            if option.scope != "global":
                self.cover_row[r] = len(rows)
                needed = float(option.units) if option.scope == "device" else 1.0
                rows.append(({r: -needed, nr + r: 1.0}, 0.0, inf))
        for ci, c in enumerate(model.classes):
            for u in c.units:
                if u.scope == "global":
                    self.global_row[(u.row, ci)] = len(rows)
                    rows.append(({u.row: -float(c.devices), nr + u.row: float(c.devices)}, 0.0, inf))
        for k, count in enumerate(model.kinds):
            rows.append(({r: 1.0 for r, (kk, _) in enumerate(model.rows) if kk == k}, float(count), float(count)))
        self.is_row = len(rows)
        rows.append(({r: float(v) for r, v in enumerate(model.ids_mb)}, -inf, inf))
        self.pr_row = len(rows)
        rows.append(({r: float(v) for r, v in enumerate(model.pooled_mb)}, -inf, inf))
        self.shared_row = len(rows)  # per class: the global units' time on every device of the class
        rows.extend(({r: v for r, v in enumerate(c.shared_us) if v}, -inf, inf) for c in model.classes)
        self.type_row = {}  # per global sharding type: how many tables take it (0, or at least 1)
        for g in model.global_types:
            self.type_row[g] = len(rows)
            rows.append(({r: 1.0 for r in model.global_rows[g]}, -inf, inf))
        self.aggregate_rows = len(rows)
        rows.extend(({r: float(v) for r, v in enumerate(coefficients) if v}, -inf, inf)
                    for coefficients in self._aggregate())
        self.class_rows = len(rows)  # per class, four rows: see _class_rows
        rows.extend(({r: float(v) for r, v in enumerate(coefficients) if v}, -inf, inf)
                    for coefficients in self._class_rows())
        self.device_row = len(rows)
        for c in model.classes:
            rows.append(({}, -inf, float(c.devices)))
        add_rows(highs, rows)
        self.first_pattern = 2 * nr
        self._pattern_arrays = {"cls": [], "compute": [], "ids": [], "pooled": [], "latency": []}

    def _aggregate(self) -> list[np.ndarray]:
        """Per (kind, option) row: its share of the devices' summed time, four ways. Every device waits at least
        base + latency + its compute + global units + s x (max(IS, ids received) + 2 max(PR, pooled sent)); summed
        over devices, each max is at least its first term on every device, or the summed second terms (total ids
        received, total pooled sent, wherever the units go). The sums are linear in the option counts, so each
        of the four ways is a row of the master, at most sum over devices of (target - base - latency)."""
        model, classes = self.model, self.model.classes
        nr = len(model.rows)
        compute, ids, pooled = (np.full((nr, len(classes)), np.inf) for _ in range(3))
        for ci, c in enumerate(classes):
            for u in c.units:
                copies = {"device": u.per_table, "node": 1.0 / u.per_table, "global": float(c.devices)}[u.scope]
                compute[u.row, ci], ids[u.row, ci], pooled[u.row, ci] = (copies * u.compute_us, copies * u.ids_mb,
                                                                         copies * u.pooled_mb)
        n = np.array([float(c.devices) for c in classes])
        s = np.array([c.s_per_mb for c in classes])
        shared = np.array([c.shared_us for c in classes]).T @ n
        least = compute.min(axis=1) + shared
        every_ids, every_pooled = model.ids_mb * float(n @ s), 2.0 * model.pooled_mb * float(n @ s)
        total_ids, total_pooled = s.min() * ids.min(axis=1), 2.0 * s.min() * pooled.min(axis=1)
        out = [least + a + b for a in (every_ids, total_ids) for b in (every_pooled, total_pooled)]
        return [np.where(np.isfinite(v), v, 0.0) for v in out]

    def _class_rows(self) -> list[np.ndarray]:
        """Per class and (kind, option) row: the option's share of the class's summed device time, four ways (the
        option count's coefficient; the patterns' are :meth:`_class_coefficients`). Every device of class c waits
        at least base + latency + its pattern's compute + its class's global units' time G_c + s x (max(IS, its
        ids received) + 2 max(PR, its pooled sent)); summed over the class's devices, each max is at least its
        first term on every device (IS and PR are linear in the option counts), or its second term summed over the
        devices' patterns. G_c is linear in the option counts, so each way is a row, at most the class's devices x
        (target - base - the mode's latency). Unlike the box, which checks each pattern at its low corner, the
        rows charge the class's devices their exact global units' time and shared traffic on average."""
        model = self.model
        out = []
        for c in model.classes:
            shared = np.array(c.shared_us) * c.devices
            for j in range(4):
                out.append(shared + (c.devices * c.s_per_mb * model.ids_mb if j & 1 else 0.0)
                           + (2.0 * c.devices * c.s_per_mb * model.pooled_mb if j & 2 else 0.0))
        return out

    @staticmethod
    def _class_coefficients(c: _Class, pattern: "Pattern") -> list[float]:
        """A pattern's coefficients in its class's four rows of :meth:`_class_rows`."""
        fixed = pattern.compute_us + pattern.latency_us
        return [fixed + (0.0 if j & 1 else c.s_per_mb * pattern.ids_mb)
                + (0.0 if j & 2 else 2.0 * c.s_per_mb * pattern.pooled_mb) for j in range(4)]

    def _add(self, ci: int, counts) -> bool:
        key = (ci, tuple(int(x) for x in counts))
        if key in self._seen:
            return False
        self._seen.add(key)
        c = self.model.classes[ci]
        pattern = Pattern.of(ci, c, key[1])
        self.patterns.append(pattern)
        arrays = self._pattern_arrays
        for name, v in (("cls", ci), ("compute", pattern.compute_us), ("ids", pattern.ids_mb),
                        ("pooled", pattern.pooled_mb), ("latency", pattern.latency_us)):
            arrays[name].append(v)
        entries: dict[int, float] = {self.device_row + ci: 1.0}
        for j, v in enumerate(self._class_coefficients(c, pattern)):
            if v:
                entries[self.class_rows + 4 * ci + j] = v
        for n, u in zip(key[1], c.units):
            if not n:
                continue
            if u.scope == "global":
                entries[self.global_row[(u.row, ci)]] = float(n)
            else:
                entries[self.cover_row[u.row]] = n * (1.0 if u.scope == "device" else u.per_table)
        index = np.array(sorted(entries), dtype=np.int32)
        self.master.addCol(0.0, 0.0, 0.0, len(index), index, np.array([entries[i] for i in index]))
        return True

    def _columns(self, ci: int, counts, value: np.ndarray, latency_value: np.ndarray, device_dual: float,
                 target_us: float, ids_floor_mb: float, pooled_floor_mb: float,
                 used: np.ndarray) -> list[tuple[int, ...]]:
        """The new columns of positive reduced cost a pricing of class ``ci`` gives: its pattern, the other
        patterns its solve found, the pattern's neighbours, and those of the master's most used patterns of the
        class (settings ``neighbours``, ``used_patterns``, ``used_neighbours``). More columns per pricing solve:
        column generation tails off less. Any column is safe -- a pattern that did not fit would only weaken the
        Lagrangian bound, never make it wrong -- but every one here fits, as the pricing MILP's do."""
        settings, pricing = self.settings, self._pricing[ci]
        found = [] if counts is None else [counts, *pricing.found]
        out = [p for p in found if pricing.worth(p, value, latency_value) + device_dual > 1e-9]
        if counts is not None:
            out += pricing.neighbours(counts, value, device_dual, target_us, ids_floor_mb, pooled_floor_mb,
                                      settings.neighbours, latency_value)
        active = np.flatnonzero(used > 1e-9)
        most = [int(j) for j in active[np.argsort(-used[active], kind="stable")] if self.patterns[j].cls == ci]
        for j in most[:settings.used_patterns]:
            out += pricing.neighbours(self.patterns[j].counts, value, device_dual, target_us, ids_floor_mb,
                                      pooled_floor_mb, settings.used_neighbours, latency_value)
        new = []
        for p in out:
            if (ci, p) not in self._seen and p not in new:
                new.append(p)
        return new

    def _times_us(self, ids_floor_mb: float, pooled_floor_mb: float) -> np.ndarray:
        a = self._pattern_arrays
        classes = self.model.classes
        cls = np.array(a["cls"])
        base = np.array([c.base_us for c in classes])[cls]
        s = np.array([c.s_per_mb for c in classes])[cls]
        ids = np.maximum(ids_floor_mb, np.array(a["ids"]))
        pooled = np.maximum(pooled_floor_mb, np.array(a["pooled"]))
        return base + np.array(a["latency"]) + np.array(a["compute"]) + s * (ids + 2.0 * pooled)

    def _shared_us(self, box) -> np.ndarray:
        """Per class: the least time every device spends on global units in ``box`` (its G side's low end, and
        the fused collectives' latency of the global sharding types its mode chooses)."""
        return np.array([low for low, _ in _g_sides(box)]) + self.model.mode_latency_us(box[-1])

    def _set_box(self, target_us: float, box) -> None:
        import highspy

        is_lo, is_hi, pr_lo, pr_hi, mode = box[0], box[1], box[2], box[3], box[-1]
        self.master.changeRowBounds(self.is_row, is_lo, is_hi)
        self.master.changeRowBounds(self.pr_row, pr_lo, pr_hi)
        for ci, (g_lo, g_hi) in enumerate(_g_sides(box)):
            self.master.changeRowBounds(self.shared_row + ci, g_lo, g_hi)
        for j, g in enumerate(self.model.global_types):
            self.master.changeRowBounds(self.type_row[g], 1.0 if mode >> j & 1 else 0.0,
                                        highspy.kHighsInf if mode >> j & 1 else 0.0)
        shared = self._shared_us(box)
        classes = self.model.classes
        latency = self.model.mode_latency_us(mode)
        room = sum(c.devices * (target_us - c.base_us - latency) for c in classes)
        for j in range(4):
            self.master.changeRowBounds(self.aggregate_rows + j, -highspy.kHighsInf, room)
        for ci, c in enumerate(classes):
            for j in range(4):
                self.master.changeRowBounds(self.class_rows + 4 * ci + j, -highspy.kHighsInf,
                                            c.devices * (target_us - c.base_us - latency))
        usable = self._times_us(is_lo, pr_lo) + shared[np.array(self._pattern_arrays["cls"], dtype=int)] <= target_us
        n = len(self.patterns)
        index = np.arange(self.first_pattern, self.first_pattern + n, dtype=np.int32)
        self.master.changeColsBounds(n, index, np.zeros(n), np.where(usable, highspy.kHighsInf, 0.0))

    def box_feasible(self, target_us: float, box) -> bool:
        """False when the pattern LP of ``box`` is proven infeasible at ``target_us``."""
        import highspy

        model = self.model
        is_lo, pr_lo = box[0], box[2]
        self._set_box(target_us, box)
        shared = self._shared_us(box)
        self._feasible_here = False
        while True:
            self.master.run()
            if self.master.getModelStatus() == highspy.HighsModelStatus.kInfeasible:
                return False  # the option counts cannot meet the box at all
            uncovered = float(self.master.getInfo().objective_function_value)
            if uncovered <= _FEASIBLE:
                self.feasible_counts = np.array(self.master.getSolution().col_value[:len(model.rows)])
                self.feasible_target_us = target_us
                self._feasible_here = True
                return True
            duals = np.array(self.master.getSolution().row_dual)
            # a lower bound on the least uncovered units over all patterns: with the master's duals y, every
            # solution of the box's full LP (patterns of class c at most devices_c) uncovers at least the master's
            # value minus, per class, devices_c x its best reduced cost max(0, proven_c + device dual_c); the
            # master's own columns only enter through its value and duals, so any column added is safe for it
            lagrangian = uncovered
            added = False
            used = np.array(self.master.getSolution().col_value[self.first_pattern:])
            for ci, c in enumerate(model.classes):
                if self.pricing_left <= 0:
                    self.exhausted = True
                    return True
                self.pricing_left -= 1
                value, latency_value = self._values(ci, duals)
                pricing = self._pricing[ci]
                room_us = target_us - shared[ci]
                device_dual = duals[self.device_row + ci]
                counts, proven = pricing.best(value, latency_value, room_us, is_lo, pr_lo, self.settings.quick_checks)
                new = self._columns(ci, counts, value, latency_value, device_dual, room_us, is_lo, pr_lo, used)
                if not new and proven + device_dual > 1e-9:  # prove there is none
                    counts, proven = pricing.best(value, latency_value, room_us, is_lo, pr_lo)
                    new = self._columns(ci, counts, value, latency_value, device_dual, room_us, is_lo, pr_lo, used)
                gain = proven + device_dual
                if gain > 1e-9:
                    lagrangian -= c.devices * gain
                for pattern in new:
                    self._add(ci, pattern)
                    self.master.changeColBounds(len(self.patterns) - 1 + self.first_pattern, 0.0, highspy.kHighsInf)
                    added = True
            if lagrangian > _FEASIBLE:
                return False
            if not added:
                return True  # cannot prove it either way: count it as feasible (the bound stays valid)

    def _values(self, ci: int, duals: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """What the master's duals give a unit of class ``ci`` in a pattern (its coverage rows' duals and its
        share of the class rows'), and each of the class's fused collectives (its latency in the class rows)."""
        c = self.model.classes[ci]
        d = duals[self.class_rows + 4 * ci: self.class_rows + 4 * ci + 4]
        value = np.array([duals[self.global_row[(u.row, ci)]] if u.scope == "global" else
                          duals[self.cover_row[u.row]] * (1.0 if u.scope == "device" else u.per_table)
                          for u in c.units])
        pricing = self._pricing[ci]  # the class's per-unit loads, as arrays
        compute, ids, pooled = pricing.compute_us, c.s_per_mb * pricing.ids_mb, 2.0 * c.s_per_mb * pricing.pooled_mb
        value += sum(d[j] * (compute + (0.0 if j & 1 else ids) + (0.0 if j & 2 else pooled)) for j in range(4))
        return value, float(d.sum()) * np.array(c.latency_us)

    def _trim(self, target_us: float, box):
        """``box`` narrowed to what a plan within ``target_us`` can have -- every device of every class waits at
        least base + global units + what it sends (IS) + twice what it receives (PR) -- or None when empty."""
        is_lo, is_hi, pr_lo, pr_hi = box[:4]
        classes = self.model.classes
        shared = self._shared_us(box)
        base = np.array([c.base_us for c in classes]) + shared
        s = np.array([c.s_per_mb for c in classes])
        is_hi = min(is_hi, float(np.min((target_us - base - 2.0 * s * pr_lo) / s)))
        pr_hi = min(pr_hi, float(np.min((target_us - base - s * is_lo) / (2.0 * s))))
        g = [(g_lo, min(g_hi, g_lo + target_us - base[ci] - s[ci] * (is_lo + 2.0 * pr_lo)))
             for ci, (g_lo, g_hi) in enumerate(_g_sides(box))]
        if is_hi < is_lo or pr_hi < pr_lo or any(hi < lo for lo, hi in g):
            return None
        return (is_lo, is_hi, pr_lo, pr_hi) + tuple(v for side in g for v in side) + (box[-1],)

    def certify(self, target_us: float) -> bool:
        """True when no plan has its slowest device below ``target_us`` (every box infeasible)."""
        model = self.model
        is_range = model.range_mb(model.ids_mb)
        pr_range = model.range_mb(model.pooled_mb)
        s = max(c.s_per_mb for c in model.classes)
        stack = []
        for mode in range(1 << len(model.global_types)):  # which global sharding types the tables take
            g = []
            for c in model.classes:
                shared = np.array(c.shared_us)
                g.append(sum(float(shared[model.global_rows[t]].min()) for j, t in enumerate(model.global_types)
                             if mode >> j & 1))
                g.append(model.range_mb(shared)[1] if mode else 0.0)
            stack.append((is_range[0], is_range[1], pr_range[0], pr_range[1]) + tuple(g) + (mode,))
        boxes = 0
        while stack:
            box = self._trim(target_us, stack.pop())
            if box is None:
                continue
            boxes += 1
            if boxes > self.settings.max_boxes:
                return False
            if not self.box_feasible(target_us, box):
                continue
            if self.exhausted:
                return False
            spreads = (s * (box[1] - box[0]), 2.0 * s * (box[3] - box[2])) + tuple(
                hi - lo for lo, hi in _g_sides(box))  # in us
            if sum(spreads) <= self.settings.box_tolerance * target_us:
                return False
            j = 2 * int(np.argmax(spreads))  # halve the widest side
            middle = 0.5 * (box[j] + box[j + 1])
            upper, lower = list(box), list(box)
            upper[j], lower[j + 1] = middle, middle
            # the half that holds the LP's solution first: where the target is not certified, a small feasible
            # box is found sooner (the order changes nothing else: every box is shown infeasible either way)
            halves = [tuple(upper), tuple(lower)]
            if self._feasible_here and self._side_value(j // 2, self.feasible_counts) >= middle:
                halves.reverse()
            stack.extend(halves)
        return True

    def _side_value(self, side: int, counts: np.ndarray) -> float:
        """Box side ``side`` (IS, PR, then G per class) of option counts ``counts``."""
        model = self.model
        if side == 0:
            return float(model.ids_mb @ counts)
        if side == 1:
            return float(model.pooled_mb @ counts)
        return float(np.array(model.classes[side - 2].shared_us) @ counts)

    def bound_s(self, low_s: float, high_s: float, goal_s: float | None = None) -> float:
        """The largest of the targets ``start x (1 + step k)``, k = 1, 2, ... (below ``high_s``) certified in
        turn; ``low_s`` (a known bound) where none is. ``start`` is ``goal_s`` where :meth:`goal` certifies it
        first, else ``low_s``. Each certified target is a valid bound, so the answer is valid wherever the work
        runs out."""
        if not self.usable:
            return low_s
        start = goal_s if goal_s is not None and low_s < goal_s < high_s and self.goal(goal_s) else low_s
        return self.steps(start, high_s)

    def goal(self, goal_s: float) -> bool:
        """Whether ``goal_s`` is certified, with at most two thirds of the pricing solves left: a target worth
        reaching, such as the plan within 3%, in one pass instead of a pass per step; a goal above the LP's value
        must not take all the steps' work. Where it is not certified, :attr:`feasible_counts` holds the option
        counts of the feasible box it ended on."""
        if not self.usable:
            return False
        kept = self.pricing_left // 3
        self.pricing_left -= kept
        certified = self.certify(goal_s * US_PER_S)
        if certified:
            log.debug("pattern bound: goal %.6f s certified, %d pricing solves left", goal_s, self.pricing_left)
        self.pricing_left += kept
        self.exhausted = self.pricing_left <= 0
        return certified

    def steps(self, start_s: float, high_s: float) -> float:
        """The largest of the targets ``start_s x (1 + step k)``, k = 1, 2, ... (below ``high_s``) certified in
        turn; ``start_s`` (a known bound) where none is."""
        certified = start_s
        k = 1
        while self.usable and not self.exhausted:
            target = start_s * (1.0 + self.settings.step * k)
            if target >= high_s or not self.certify(target * US_PER_S):
                break
            certified = target
            log.debug("pattern bound: %.6f s certified, %d patterns, %d pricing solves left", target,
                      len(self.patterns), self.pricing_left)
            k += 1
        return certified
