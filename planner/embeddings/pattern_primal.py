"""Option choices from device patterns: the pattern bound's LP made conservative, its option counts fixed by diving.

The pattern bound (pattern_bound.py) proves targets by showing an LP infeasible; where it fails, the LP of the box
it failed on is feasible, and its option counts say which options a plan near the bound would use. This module
turns such counts into option choices for the placement heuristics:

- A *corner* fixes the quantities every device shares at the counts' values: the ids every device sends (IS),
  the pooled bytes it receives (PR), and per class the global units' time, memory, ids received and pooled bytes
  sent. Every device then carries every global unit in full (not per class, as in the bound), and a local pattern
  (its device-scope and node-wide units) is usable at target T when its device time at the corner -- each term at
  its most -- is at most T. So a solution of the *primal LP* (option counts within the corner, devices per usable
  pattern, every unit placed) is a fractional plan whose slowest device is at most T.
- The primal LP is solved by column generation with the bound's pricing MILPs (global units priced at zero, the
  memory row lowered by the global units' memory, the time by their time and traffic).
- A *dive* fixes the option counts kind by kind (the most fractional kind first; the largest remainders rounded
  up, else the next ones), solving the LP again after each; a kind that cannot be fixed is rounded at the end.

The choices are only guides: the caller places each (greedy, local search, ruin and recreate, option search), and
each and its variants without node-wide tables (:func:`without_node_units`) exactly by device configurations,
and keeps a plan only if it is faster. Work is counted in column generation rounds, never the clock.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from planner.embeddings.highs import add_rows, quiet_highs
from planner.embeddings.pattern_bound import Pattern, PatternBound
from planner.embeddings.problem import Problem

log = logging.getLogger(__name__)

_FEASIBLE = 1e-6  # uncovered units below this: the LP is feasible


@dataclass(frozen=True)
class PrimalSettings:
    """``targets``: the dives' targets, relative to the target the bound's last feasible box had; ``rounds``:
    column generation rounds (a pricing MILP per class each) per LP solve; ``roundings``: how many roundings of a
    kind a dive tries before leaving it to the end."""

    targets: tuple[float, ...] = (1.0, 1.01, 1.02, 1.03)
    rounds: int = 200
    roundings: int = 3


@dataclass(frozen=True)
class _Corner:
    ids_mb: float  # IS
    pooled_mb: float  # PR
    # per class, the global units' (time us, HBM GB, host GB, ids MB received, pooled MB sent) on each device
    per_class: tuple[tuple[float, float, float, float, float], ...]
    mode: int  # global sharding types chosen (bit mask over model.global_types)


class PrimalLP:
    """The primal LP over the local patterns of a :class:`PatternBound` (its pool, plus what pricing adds)."""

    def __init__(self, bound: PatternBound, settings: PrimalSettings = PrimalSettings()) -> None:
        self.bound = bound
        self.model = bound.model
        self.settings = settings
        model = self.model
        self.rows_of_kind = [[r for r, (k, _) in enumerate(model.rows) if k == kind]
                             for kind in range(len(model.kinds))]
        self.local: list[tuple[int, tuple[int, ...]]] = []
        # per local pattern: its loads (time terms, HBM GB, host GB), computed once
        self._loads: dict[tuple[int, tuple[int, ...]], tuple[Pattern, float, float]] = {}
        for pattern in bound.patterns:
            self._add(pattern.cls, pattern.counts)

    def _add(self, ci: int, counts: Sequence[int]) -> bool:
        units = self.model.classes[ci].units
        added = False
        for keep in (("device", "node"), ("node",)):  # the pattern's local part, and its node-wide part alone
            key = (ci, tuple(int(n) if u.scope in keep else 0 for n, u in zip(counts, units)))
            if key not in self._loads:
                n = np.array(key[1], dtype=float)
                self._loads[key] = (Pattern.of(ci, self.model.classes[ci], key[1]),
                                    float(n @ np.array([u.hbm_gb for u in units])),
                                    float(n @ np.array([u.host_gb for u in units])))
                self.local.append(key)
                added = True
        return added

    def corner(self, counts: np.ndarray, slack: float = 0.0) -> _Corner:
        """The shared quantities of option counts ``counts`` (per (kind, option) row), ``slack`` (relative) above."""
        model = self.model
        grow = 1.0 + slack
        per_class = []
        for c in model.classes:
            totals = [float(np.array(c.shared_us) @ counts)]
            for name in ("hbm_gb", "host_gb", "ids_mb", "pooled_mb"):
                totals.append(sum(counts[u.row] * getattr(u, name) for u in c.units if u.scope == "global"))
            per_class.append(tuple(v * grow for v in totals))
        mode = sum(1 << j for j, g in enumerate(model.global_types)
                   if sum(counts[r] for r in model.global_rows[g]) > 0.5)
        return _Corner(float(model.ids_mb @ counts) * grow, float(model.pooled_mb @ counts) * grow, tuple(per_class),
                       mode)

    def time_us(self, ci: int, local: Sequence[int], corner: _Corner) -> float:
        """A device of class ``ci`` carrying ``local`` and every global unit, each shared quantity at its corner;
        inf when out of memory."""
        c = self.model.classes[ci]
        g_time, g_hbm, g_host, g_ids, g_pooled = corner.per_class[ci]
        pattern, hbm_gb, host_gb = self._loads[(ci, tuple(local))]
        if hbm_gb + g_hbm > c.hbm_gb * (1 + 1e-9) or host_gb + g_host > c.host_gb * (1 + 1e-9):
            return np.inf
        # max(IS, ids + g_ids) = g_ids + max(IS - g_ids, ids), and alike for the pooled bytes
        return (pattern.time_us(c, corner.ids_mb - g_ids, corner.pooled_mb - g_pooled)
                + c.s_per_mb * (g_ids + 2.0 * g_pooled) + self.model.mode_latency_us(corner.mode) + g_time)

    def solve(self, target_us: float, corner: _Corner, fixed: dict[int, int]) -> np.ndarray | None:
        """The option counts of a solution of the primal LP at ``target_us`` within ``corner`` (rows in ``fixed``
        at their values), by column generation; None when it has none (or the pricing solves run out first)."""
        import highspy

        model = self.model
        nr = len(model.rows)
        for _ in range(self.settings.rounds + 1):
            usable = [(ci, local) for ci, local in self.local if self.time_us(ci, local, corner) <= target_us]
            highs, cover, device_row = self._master(usable, corner, fixed)
            highs.run()
            if highs.getModelStatus() == highspy.HighsModelStatus.kInfeasible:
                return None
            counts = np.array(highs.getSolution().col_value[:nr])
            if highs.getInfo().objective_function_value <= _FEASIBLE:
                return counts
            duals = np.array(highs.getSolution().row_dual)
            added = False
            for ci, c in enumerate(model.classes):
                g_time, g_hbm, _, g_ids, g_pooled = corner.per_class[ci]
                value = np.array([0.0 if u.scope == "global" else
                                  duals[cover[u.row]] * (1.0 if u.scope == "device" else u.per_table) for u in c.units])
                room = (target_us - self.model.mode_latency_us(corner.mode) - g_time
                        - c.s_per_mb * (g_ids + 2.0 * g_pooled))
                found = self.bound.pricing(ci).best(value, np.zeros(len(c.latency_us)), room, corner.ids_mb - g_ids,
                                                    corner.pooled_mb - g_pooled, hbm_gb=c.hbm_gb - g_hbm)[0]
                if found is not None and float(value @ np.array(found)) + duals[device_row + ci] > 1e-9:
                    added = self._add(ci, found) or added
            if not added:
                return None
        return None

    def _master(self, usable, corner: _Corner, fixed: dict[int, int]):
        """Phase one of the primal LP: least uncovered units. Columns: option counts, uncovered units, devices
        per usable pattern."""
        import highspy

        inf = highspy.kHighsInf
        model = self.model
        nr, nx = len(model.rows), len(usable)
        upper = np.array([float(model.kinds[k]) for k, _ in model.rows] + [inf] * (nr + nx))
        lower = np.zeros(2 * nr + nx)
        for r, v in fixed.items():
            lower[r] = upper[r] = float(v)
        highs = quiet_highs()
        highs.addVars(2 * nr + nx, lower, upper)
        highs.changeColsCost(nr, np.arange(nr, 2 * nr, dtype=np.int32), np.ones(nr))
        rows, cover = [], {}
        entries: dict[int, dict[int, float]] = {}
        for j, (ci, local) in enumerate(usable):
            for n, u in zip(local, model.classes[ci].units):
                if n:
                    per = entries.setdefault(u.row, {})
                    per[2 * nr + j] = per.get(2 * nr + j, 0.0) + n * (1.0 if u.scope == "device" else u.per_table)
        for r, (k, o) in enumerate(model.rows):
            option = model.problem.options[model.first[k]][o]
            if option.scope != "global":
                cover[r] = len(rows)
                rows.append(({r: -(float(option.units) if option.scope == "device" else 1.0), nr + r: 1.0,
                              **entries.get(r, {})}, 0.0, inf))
        for kind_rows, count in zip(self.rows_of_kind, model.kinds):
            rows.append(({r: 1.0 for r in kind_rows}, float(count), float(count)))
        rows.append(({r: float(v) for r, v in enumerate(model.ids_mb) if v}, -inf, corner.ids_mb * (1 + 1e-9)))
        rows.append(({r: float(v) for r, v in enumerate(model.pooled_mb) if v}, -inf, corner.pooled_mb * (1 + 1e-9)))
        for ci, c in enumerate(model.classes):
            rows.append(({r: v for r, v in enumerate(c.shared_us) if v}, -inf, corner.per_class[ci][0] * (1 + 1e-9)))
            for name, most in zip(("hbm_gb", "host_gb", "ids_mb", "pooled_mb"), corner.per_class[ci][1:]):
                terms = {u.row: getattr(u, name) for u in c.units if u.scope == "global" and getattr(u, name)}
                if terms:
                    rows.append((terms, -inf, most * (1 + 1e-9)))
        for j, g in enumerate(model.global_types):
            if not corner.mode >> j & 1:
                rows.append(({r: 1.0 for r in model.global_rows[g]}, 0.0, 0.0))
        device_row = len(rows)  # every device takes a pattern (an idle one still carries the global units)
        for ci, c in enumerate(model.classes):
            rows.append(({2 * nr + j: 1.0 for j, (cj, _) in enumerate(usable) if cj == ci}, float(c.devices),
                         float(c.devices)))
        add_rows(highs, rows)
        return highs, cover, device_row

    def dive(self, target_us: float, corner: _Corner) -> np.ndarray | None:
        """Integer option counts per row: the primal LP's, fixed kind by kind; None when its LP is infeasible."""
        counts = self.solve(target_us, corner, {})
        if counts is None:
            return None
        fixed: dict[int, int] = {}
        skipped: set[int] = set()
        while True:
            for kind_rows in self.rows_of_kind:  # kinds the LP already counts whole
                if all(abs(counts[r] - round(counts[r])) < 1e-6 for r in kind_rows):
                    fixed.update({r: int(round(counts[r])) for r in kind_rows})
            open_kinds = [k for k, kind_rows in enumerate(self.rows_of_kind)
                          if k not in skipped and any(r not in fixed for r in kind_rows)]
            if not open_kinds:
                break
            k = max(open_kinds,
                    key=lambda k: (sum(abs(counts[r] - round(counts[r])) for r in self.rows_of_kind[k]), -k))
            for rounding in _roundings(counts, self.rows_of_kind[k], self.model.kinds[k], self.settings.roundings):
                trial = {**fixed, **rounding}
                solved = self.solve(target_us, corner, trial)
                if solved is not None:
                    fixed, counts = trial, solved
                    break
            else:
                skipped.add(k)
        for k in sorted(skipped):
            fixed.update(next(iter(_roundings(counts, self.rows_of_kind[k], self.model.kinds[k], 1))))
        return np.array([fixed[r] for r in range(len(self.model.rows))])


def _roundings(counts: np.ndarray, rows: Sequence[int], total: int, tries: int):
    """Integer counts of one kind summing to ``total`` near ``counts``: floors, plus one for the rows with the
    largest remainders (then the ones after them, cyclically)."""
    floors = {r: int(np.floor(counts[r] + 1e-6)) for r in rows}
    left = total - sum(floors.values())
    order = sorted(rows, key=lambda r: (-(counts[r] - np.floor(counts[r] + 1e-6)), r))
    for shift in range(min(tries, len(order))):
        rounding = dict(floors)
        for r in (order[shift:] + order[:shift])[:max(left, 0)]:
            rounding[r] += 1
        yield rounding


def choices(bound: PatternBound, settings: PrimalSettings = PrimalSettings()) -> list[list[int]]:
    """Option choices (per table) from dives at ``settings.targets`` times the target of the last box the pattern
    bound found feasible, at the corner of that box's option counts; none when it found none."""
    if not bound.usable or bound.feasible_counts is None:
        return []
    primal = PrimalLP(bound, settings)
    corner = primal.corner(bound.feasible_counts)
    model = bound.model
    out = []
    for share in settings.targets:
        counts = primal.dive(bound.feasible_target_us * share, corner)
        if counts is None:
            continue
        choice = [0] * len(model.problem.tables)
        for k, tables in enumerate(model.problem.table_kinds):
            options = [model.rows[r][1] for r in primal.rows_of_kind[k] for _ in range(int(counts[r]))]
            for t, o in zip(tables, options):
                choice[t] = o
        if choice not in out:
            out.append(choice)
    log.debug("pattern primal: %d choices", len(out))
    return out


def without_node_units(problem: Problem, choice: Sequence[int]) -> list[list[int]]:
    """Variants of ``choice``, one per kind of table it makes node-wide (table-row-wise) and per replacement:
    all of that kind's node-wide tables data-parallel instead, or all table-wise (in device memory).

    The pattern LP counts a node-wide unit as an eighth of a table on each of any eight device patterns; a plan
    puts it on the eight devices of one node, which must then match each other. So the LP's choices lean on
    node-wide options more than plans can, and the variant without them often places where the choice cannot."""
    variants = []
    for tables in problem.table_kinds:
        node_wide = [t for t in tables if problem.options[t][choice[t]].scope == "node"]
        if not node_wide:
            continue
        for sharding in ("data_parallel", "table_wise"):
            other = next((o for o, option in enumerate(problem.options[node_wide[0]])
                          if option.sharding == sharding and not option.host), None)
            if other is not None:
                variants.append([other if t in node_wide else o for t, o in enumerate(choice)])
    return variants
