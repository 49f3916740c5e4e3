"""Lower bounds on the DP bound of :mod:`planner.search.backend` for every plan with a given set of stage
blocks, valid for any layer partition and any order of the blocks. The search visits blocks in increasing
bound order and stops once the bound reaches its K-th best plan, so these bounds must never exceed the true
iteration time of any plan they cover.

For option o let f_l(o), b_l(o) be layer l's forward and backward time per micro-batch. For any partition:
  * sum_k S_k >= sum_l min_o (f_l + b_l)(o) + sum_o E_o(c_o)                     (transfers >= 0)
    where e_l(o) = (f_l + b_l)(o) - min_o' (f_l + b_l)(o') is what layer l loses on o and E_o(c) the sum of
    o's c smallest: the c_o stages of o hold at least c_o distinct layers (every stage holds one), and the
    stages of different options hold different layers
  * G_k >= sum_{l in k} q_l(o_k),  q_l = (m - 1) b_l + max(0, m - P) f_l          (w_k <= P - 1), so
    max_k G_k >= max_l min_o q_l(o)  and  >= Q_ref / sum_k 1/rho_k, rho_k = min_l q_l(o_k) / q_l(ref)
Memory: with static(x) = c0 + c1 x and room_o = capacity - c0, stage k holding segment S_k with n_k
micro-batches in flight (1F1B: n_k = min(P - k, m)) needs
    sum_{l in S_k} (c1 ppr_l + n_k act_l) / room <= 1.
Summing over stages, sum_l min_o (c1 ppr_l + act_l)/room + sum_k (n_k - 1) act(S_k)/room <= P; every stage
but the last holds at least one layer, so the second sum is at least the rearrangement pairing of the
P - 1 largest (n_k - 1) with the P - 1 smallest per-layer act/room. Each layer alone (with its transient
peak) must also fit on some option, and the stages of any subset T of options need distinct layers that
fit on one of them (Hall's condition: every stage holds at least one layer). In any order, T's c_T stages
sit at distinct positions, so for i = 1..c_T at least c_T - i + 1 of them hold min(i, m) or more
micro-batches: the i-th layer best able to carry in-flight micro-batches on T must carry min(c_T - i + 1, m).
Layer counts (:func:`layer_count_bound`): stage capacities are whole layers. A stage holding k layers of a
subset U has G >= the sum of U's k smallest q and holds no more layers of U than fit in its memory, so the
stages must be able to hold all of U below the bottleneck value t; the least such t bounds max_k G_k (exact
for identical layers, where the fluid bound above loses the rounding). U is every layer and, for models
with a few small layers (an embedding, a head), the core layers, since each stage could otherwise count
the same small layers.
Memory is in units of the room the backend's ``stage_bytes`` leaves (its affine coefficients are probed),
so fragmentation margins and reserves tighten the bounds as they tighten the plans.
"""

from __future__ import annotations

import dataclasses
import functools

from dataclasses import dataclass
from typing import Sequence

import bisect
import itertools
import math

import numpy as np

from planner.cost.memory import micro_batches_in_flight
from planner.runtime import get_runtime
from planner.search.backend import Backend, handoff_cycles, handoff_g, warmups
from planner.search.interleave import bound_coefficients, least_delta, schedule_for
from planner.search.space import Layout, Settings, StageOption


@dataclass(frozen=True, eq=False)
class OptionProfile:
    """Per-layer vectors of one option under one settings, for bounding (memory in units of the option's
    room; inf when even an empty stage does not fit; zeros when the backend's static memory is not affine)."""

    option: StageOption
    forward_s: np.ndarray
    backward_s: np.ndarray
    static_unit: np.ndarray  # c1 ppr_l / room
    act_unit: np.ndarray  # act_l / room
    peak_unit: np.ndarray  # transient peak / room


def memory_coefficients(backend: Backend, option: StageOption, settings: Settings
                        ) -> tuple[float, float, float, float] | None:
    """(bytes per parameter, per activation byte in flight, per transient byte, room) of a stage's memory,
    probed from ``backend.stage_bytes``; None when it is not affine (memory is then not bounded)."""

    def probe(params: float, act: float, peak: float, in_flight: float = 1.0) -> float:
        return float(np.asarray(backend.stage_bytes(np.array([params]), np.array([act]), in_flight,
                                                    np.array([peak]), option, settings))[0])

    base = probe(0.0, 0.0, 0.0)
    c_params, c_act, c_peak = ((probe(*x) - base) / 1e9 for x in ((1e9, 0, 0), (0, 1e9, 0), (0, 0, 1e9)))
    affine = bool(np.isclose(probe(2e9, 3e9, 5e9, 2.0), base + 2e9 * c_params + 6e9 * c_act + 5e9 * c_peak,
                             rtol=1e-9, atol=1.0)) and min(c_params, c_act, c_peak) >= 0
    return (c_params, c_act, c_peak, backend.capacity_bytes(option) - base) if affine else None


def option_profile(backend: Backend, option: StageOption, settings: Settings,
                   coefficients: tuple[float, float, float, float] | None = None) -> OptionProfile:
    """Per-layer vectors of ``option`` under ``settings``, memory in units of the room left by the stage's
    fixed memory, so that a segment fits exactly when sum(static + n act) + max(peak) <= 1."""
    t = backend.layer_table(option, settings)
    if coefficients is None:
        coefficients = memory_coefficients(backend, option, settings)
    n = len(t.forward_s)
    if coefficients is None:
        units = [np.zeros(n)] * 3
    elif coefficients[3] <= 0:
        units = [np.full(n, np.inf)] * 3
    else:
        c_params, c_act, c_peak, room = coefficients
        units = [c * np.asarray(v, dtype=float) / room
                 for c, v in ((c_params, t.params_per_rank), (c_act, t.act_bytes), (c_peak, t.peak_bytes))]
    return OptionProfile(option=option, forward_s=np.asarray(t.forward_s, dtype=float),
                         backward_s=np.asarray(t.backward_s, dtype=float), static_unit=units[0], act_unit=units[1],
                         peak_unit=units[2])


class Profiles:
    """Memo of :func:`option_profile` per (option, settings) for one search; memory coefficients are shared
    by the settings that differ only in what they do not depend on (micro-batch, recompute, sequence
    parallelism)."""

    def __init__(self, backend: Backend) -> None:
        self.backend = backend
        self._memo: dict[tuple[StageOption, Settings], OptionProfile] = {}
        self._memory: dict[tuple, tuple[float, float, float, float] | None] = {}
        self._twins: dict[Settings, Settings] = {}
        self.count_memo: dict[tuple, object] = {}  # count tables and stacks of profile lists (shared by vpp twins)
        self._lists: dict[tuple, tuple[OptionProfile, ...]] = {}

    def get(self, option: StageOption, settings: Settings) -> OptionProfile:
        # a profile does not depend on the schedule: interleaved settings share their 1F1B twin's
        twin = self._twins.get(settings)
        if twin is None:
            twin = self._twins[settings] = settings if settings.vpp == 1 else \
                dataclasses.replace(settings, vpp=1, schedule="1f1b")
        key = (option, twin)
        hit = self._memo.get(key)
        if hit is None:
            mkey = (option, settings.dp, settings.zero, settings.optimizer, settings.dtype, settings.runtime,
                    settings.ep, settings.expert_tp)
            if mkey not in self._memory:
                self._memory[mkey] = memory_coefficients(self.backend, option, settings)
            hit = option_profile(self.backend, option, settings, self._memory[mkey])
            self._memo[key] = hit
        return hit

    def get_all(self, options: tuple[StageOption, ...], settings: Settings) -> tuple[OptionProfile, ...]:
        """:meth:`get` of every option of ``options``, memoised as a whole (the search asks for the same
        options of a settings for its bound, its choices and its stage-count grids)."""
        key = (options, settings)
        hit = self._lists.get(key)
        if hit is None:
            hit = self._lists[key] = tuple(self.get(o, settings) for o in options)
        return hit


def _hall_table(carry: np.ndarray, num_micro_batches: int) -> np.ndarray:
    """``ok[c]``: c stages can each get a distinct layer, the i-th (0-based) carrying min(c - i, m)
    micro-batches, given each layer's ``carry`` (the most micro-batches it can hold alone). Taking layers
    best-first, layer i limits c to i + carry[i] unless it carries m or more; so ok[c] holds when every
    layer before position c allows c."""
    L = len(carry)
    best = np.sort(carry)[::-1]
    limit = np.where(best >= num_micro_batches, np.inf, np.arange(L) + best)
    ok = np.ones(L + 1, dtype=bool)
    ok[1:] = np.minimum.accumulate(limit) >= np.arange(1, L + 1)
    return ok


def speed_ratio(values: np.ndarray, ref: int) -> np.ndarray:
    """min_l values[o, l] / values[ref, l] over layers where the reference is positive, per option o."""
    base = values[ref]
    pos = base > 0
    if not pos.any():
        return np.zeros(len(values))
    return (values[:, pos] / base[pos]).min(axis=1)


def core_layers(work: np.ndarray) -> np.ndarray:
    """The layers whose work (f + b, shape (options, layers)) is at least half the median on every option:
    the blocks of a transformer, without its small embedding and head. The layer-count bound below counts
    only these, because each stage could otherwise claim the same few small layers."""
    return (work >= 0.5 * np.median(work, axis=1, keepdims=True)).all(axis=0)


def in_flight_ascending(num_stages: int, num_micro_batches: int, vpp: int = 1) -> np.ndarray:
    """The micro-batches each of ``num_stages`` stages holds in flight at its peak (in units of its
    activations per micro-batch, :func:`planner.cost.memory.micro_batches_in_flight`), smallest first:
    min(1..P, m) under 1F1B; more under the interleaved schedule, whose warm-up grows with P."""
    P = num_stages
    return np.array([micro_batches_in_flight(k, P, num_micro_batches, schedule_for(vpp), vpp)
                     for k in range(P - 1, -1, -1)], dtype=float)


def _memory_counts(static: np.ndarray, act: np.ndarray, peak: np.ndarray, count: int, m: int,
                   in_flight: np.ndarray | None = None, held: float = 0.0) -> np.ndarray:
    """``k[i]``: the most layers of this set a stage can hold with ``in_flight[i]`` (default min(i + 1, m))
    micro-batches in flight (the sum of the smallest static + n act, plus ``held``, what the stage holds
    besides, and the least transient, within one room); non-increasing when ``in_flight`` is non-decreasing."""
    if count == 0:
        return np.zeros(0, dtype=int)
    n = np.minimum(np.arange(1, count + 1), m).astype(float) if in_flight is None else \
        np.asarray(in_flight[:count], dtype=float)
    with np.errstate(invalid="ignore"):
        use = np.sort(static[None, :] + n[:, None] * act[None, :], axis=1)
        fits = np.cumsum(use, axis=1) + (held + (peak.min() if len(peak) else 0.0)) <= 1.0 + 1e-9
    return fits.sum(axis=1)


@dataclass(frozen=True, eq=False)
class CountTables:
    """What the layer-count bound needs per option, for one layer subset U: prefix sums of the sorted
    backward and forward times on U (``sb``, ``sf``: (options, |U| + 1)), and per option the layers of U a
    stage holds with 1, 2, ... micro-batches in flight (``kmem``) with their prefix sums (``kmem_sums``);
    :meth:`memory` gives the same for the interleaved schedule's in-flight counts of a P-stage pipeline."""

    size: int
    sb: np.ndarray
    sf: np.ndarray
    kmem: tuple[np.ndarray, ...]
    kmem_sums: tuple[np.ndarray, ...]
    m: int = 1
    units: tuple = ()  # per option: (static, act, peak) on U, the most stages
    _lists: dict = dataclasses.field(default_factory=dict, compare=False, repr=False)

    def memory(self, option: int, num_stages: int, vpp: int) -> tuple[np.ndarray, np.ndarray]:
        """``kmem`` and ``kmem_sums`` of ``option`` when its stages sit among ``num_stages`` stages of the
        schedule with ``vpp`` chunks (vpp = 1: the 1F1B tables, valid for any schedule and stage count)."""
        if vpp == 1:
            return self.kmem[option], self.kmem_sums[option]
        key = ("memory", option, num_stages, vpp)
        hit = self._lists.get(key)
        if hit is None:
            static, act, peak, most = self.units[option]
            n = in_flight_ascending(num_stages, self.m, vpp)
            n = np.concatenate([n, np.full(max(0, most - len(n)), n[-1] if len(n) else 1.0)])
            k = _memory_counts(static, act, peak, most, self.m, n)
            hit = self._lists[key] = (k, np.concatenate(([0], np.cumsum(k))))
        return hit

    def lists(self, option: int, num_stages: int = 0, vpp: int = 1) -> tuple[list, list]:
        """Option ``option``'s ``kmem`` reversed (non-decreasing) and ``kmem_sums`` (:meth:`memory`), as
        Python lists (memoised: :func:`_one_row` bisects them in scalars)."""
        key = (option, num_stages if vpp > 1 else 0, vpp)
        hit = self._lists.get(key)
        if hit is None:
            kmem, sums = self.memory(option, num_stages, vpp)
            hit = self._lists[key] = (kmem[::-1].tolist(), sums.tolist())
        return hit


def _sorted_prefix(x: np.ndarray, layers: np.ndarray) -> np.ndarray:
    """Per option (row): 0 and the prefix sums of its times on ``layers``, smallest first."""
    return np.concatenate([np.zeros((len(x), 1)), np.cumsum(np.sort(x[:, layers], axis=1), axis=1)], axis=1)


def count_tables(fwd: np.ndarray, bwd: np.ndarray, static: np.ndarray, act: np.ndarray, peak: np.ndarray,
                 layers: np.ndarray, most_stages: np.ndarray, m: int) -> CountTables:
    """:class:`CountTables` for options with at most ``most_stages[o]`` stages each."""
    O = len(fwd)
    size = int(layers.sum())
    sb, sf = _sorted_prefix(bwd, layers), _sorted_prefix(fwd, layers)
    kmem = tuple(_memory_counts(static[o, layers], act[o, layers], peak[o, layers], int(most_stages[o]), m)
                 for o in range(O))
    sums = tuple(np.concatenate(([0], np.cumsum(k))) for k in kmem)
    units = tuple((static[o, layers], act[o, layers], peak[o, layers], int(most_stages[o])) for o in range(O))
    return CountTables(size, sb, sf, kmem, sums, m, units)


def _count_tables_memo(memo: dict | None, profiles: Sequence[OptionProfile], fwd: np.ndarray, bwd: np.ndarray,
                       static: np.ndarray, act: np.ndarray, peak: np.ndarray, layers: np.ndarray,
                       most_stages: np.ndarray, m: int) -> CountTables:
    """:func:`count_tables`, memoised in ``memo`` by the profile objects (memoised themselves by
    :class:`Profiles`, so settings that differ only in their schedule share them)."""
    if memo is None:
        return count_tables(fwd, bwd, static, act, peak, layers, most_stages, m)
    # tables for more stages serve fewer (the bounds read the first counts[o] entries): one per profile list,
    # grown when a row needs more
    key = (tuple(id(p) for p in profiles), layers.tobytes(), m)
    most_stages = np.asarray(most_stages, dtype=int)
    hit = memo.get(key)
    if hit is None or any(u[3] < n for u, n in zip(hit.units, most_stages)):
        if hit is not None:
            most_stages = np.maximum(most_stages, [u[3] for u in hit.units])
        hit = memo[key] = count_tables(fwd, bwd, static, act, peak, layers, most_stages, m)
    return hit


def layer_count_bound(tables: CountTables, options: np.ndarray, counts: np.ndarray, pools: np.ndarray,
                      totals: np.ndarray, m: int, floor: np.ndarray, vpp: int = 1, stop: float = np.inf,
                      in_flight_vpp: int = 1, ep_overlap: bool = False) -> np.ndarray:
    """A lower bound on max_k G_k per row, at least ``floor[r]`` (inf: the stages cannot hold the layers),
    from stage capacities. A row searched alone (the only one with its stage count) whose bound exceeds
    ``stop`` may get any value from ``stop`` up to its bound (the caller prunes it either way; the search
    passes what is left of its cutoff).

    Row r has ``counts[r, j]`` stages of option ``options[j]`` (an index into ``tables``), of which only the
    largest count per pool is used (``pools[j]``: a pool serves one option per plan, so the coverage of a
    row is, per pool, the best of its options) and ``totals[r]`` pipeline stages. A stage on option o holding
    k layers of U has G >= (m - 1) SB_o(k) + max(0, m - P) SF_o(k) and, holding n micro-batches, at most
    Kmem_o(n) of them; the c_o stages of o hold at least 1, 2, ..., c_o micro-batches (1F1B positions are
    distinct), so at threshold t they hold at most sum_i min(K_o(t), Kmem_o(min(i, m))) layers of U. The
    bound is the least t at which the stages can hold all of U (only t above the row's floor are tried).
    ``in_flight_vpp`` > 1: the rows are exactly ``totals[r]`` stages of the interleaved schedule with that
    many chunks, whose stages hold more micro-batches in flight (:func:`in_flight_ascending`); 1: 1F1B's
    counts, which no schedule holds fewer than at any stage count.
    """
    rows = len(counts)
    out = np.asarray(floor, dtype=float).copy()
    if tables.size == 0 or rows == 0:
        return out
    if rows == 1:  # one row (a settings bound, a choice's corner): a binary search in scalars
        if out[0] >= stop:
            return out
        P = int(totals[0])
        out[0] = _one_row(tables, options, counts[0], pools,
                          _weights(tables.sb, tables.sf, options, P, m, vpp, ep_overlap),
                          float(out[0]), stop, P, in_flight_vpp)
        return out
    pool_ids = np.unique(pools)
    for P in np.unique(totals):
        sel = np.flatnonzero(totals == P)
        lo = float(out[sel].min())
        g = _weights(tables.sb, tables.sf, options, int(P), m, vpp, ep_overlap)
        if len(sel) == 1:  # one row (a settings bound): a binary search over the thresholds, in scalars
            out[sel] = _one_row(tables, options, counts[sel[0]], pools, g, lo, stop, int(P), in_flight_vpp)
            continue
        # g is non-decreasing in k; interleaved: (m - 1/vpp) SB + stage 0's forward weight SF (its in-flight
        # micro-batches are at least 1F1B's, so the memory counts stay valid)
        cands = np.unique(g[:, 1:])
        cands = np.concatenate(([lo], cands[cands > lo]))
        cover = np.zeros((len(sel), len(cands)))
        for pool in pool_ids:
            best = np.zeros((len(sel), len(cands)))
            for j in np.flatnonzero(pools == pool):
                c = counts[sel, j].astype(int)
                if not c.any():
                    continue
                o = options[j]
                k_time = np.searchsorted(g[j], cands, side="right") - 1  # layers of U within t
                kmem, sums = tables.memory(o, int(P), in_flight_vpp)
                # stages 1..i0 hold at least k_time layers in memory (kmem is non-increasing)
                i0 = np.searchsorted(-kmem, -k_time, side="right")
                upto = np.minimum(c[:, None], i0[None, :])
                best = np.maximum(best, k_time[None, :] * upto + sums[c][:, None] - sums[upto])
            cover += best
        enough = cover >= tables.size
        first = np.argmax(enough, axis=1)
        value = np.where(first == 0, lo, cands[first] * (1 - 1e-9))
        out[sel] = np.maximum(out[sel], np.where(enough.any(axis=1), value, np.inf))
    return out


def _weight_coefficients(P: int, m: int, vpp: int, ep_overlap: bool = False) -> tuple[float, float]:
    """The factors of SB and SF in G = a SB + b SF with P stages (:func:`_weights`)."""
    if vpp == 1:
        return m - 1, max(0, m - P - int(ep_overlap))
    return m - 1.0 / vpp, least_delta(P, m, vpp, ep_overlap)


def _weights(sb: np.ndarray, sf: np.ndarray, options: np.ndarray, P: int, m: int, vpp: int,
             ep_overlap: bool = False) -> np.ndarray:
    """G of a stage holding its k smallest layers of U, per option (rows) and k (columns), with P stages
    (``sb``, ``sf`` as in :class:`CountTables`; ``ep_overlap``: one more warm-up forward)."""
    a, b = _weight_coefficients(P, m, vpp, ep_overlap)
    return a * sb[options] + b * sf[options]


def _one_row(tables: CountTables, options: np.ndarray, counts: np.ndarray, pools: np.ndarray, g: np.ndarray,
             lo: float, stop: float = np.inf, num_stages: int = 0, in_flight_vpp: int = 1) -> float:
    """:func:`layer_count_bound` of one row: the same coverage, evaluated at O(log) thresholds; at least
    ``stop`` without searching further when the thresholds up to ``stop`` do not cover."""
    g_rows = g.tolist()
    # per pool, its used options: (G per layer count, stages, kmem reversed (non-decreasing), kmem's prefix sums)
    per_pool: dict[int, list[tuple[list[float], int, list[int], list[int]]]] = {}
    for j, (option, count, pool) in enumerate(zip(np.asarray(options).tolist(), np.asarray(counts).tolist(),
                                                  np.asarray(pools).tolist())):
        if count > 0:
            per_pool.setdefault(pool, []).append((g_rows[j], int(count),
                                                  *tables.lists(option, num_stages, in_flight_vpp)))
    groups = list(per_pool.values())
    bisect_left, bisect_right = bisect.bisect_left, bisect.bisect_right

    def cover(t: float) -> int:
        covered = 0
        for group in groups:
            best = 0  # a pool's best option (a pool whose every option holds nothing adds nothing)
            for gj, c, rising, sums in group:
                k = bisect_right(gj, t) - 1  # layers of U within t
                i0 = len(rising) - bisect_left(rising, k)  # stages holding k or more in memory
                upto = c if c < i0 else i0
                value = k * upto + sums[c] - sums[upto]
                if value > best:
                    best = value
            covered += best
        return covered

    if cover(lo) >= tables.size:
        return lo
    if lo >= stop:  # the bound exceeds lo >= stop
        return lo
    top = np.inf
    if math.isfinite(stop):
        top = stop / (1 - 1e-9) if stop > 0 else stop
        if cover(top) < tables.size:
            return stop  # the first covering threshold t exceeds top: the bound t (1 - 1e-9) > stop
    if lo >= 0:
        # the coverage changes only at the used options' values of G, it does not cover at lo and it covers at
        # top: the first of every option's values above lo that covers is among the used options' values in
        # (lo, top]
        cands = []
        for group in groups:
            for entry in group:
                gj = entry[0]
                cands += gj[max(1, bisect_right(gj, lo)):bisect_right(gj, top)]
        cands.sort()  # repeated values do not change the first that covers
    else:
        above = g[:, 1:].ravel()
        cands = np.sort(above[above > lo]).tolist()
    a, b = 0, len(cands)  # the first threshold that covers, by bisection (coverage grows with t)
    while a < b:
        mid = (a + b) // 2
        if cover(cands[mid]) >= tables.size:
            b = mid
        else:
            a = mid + 1
    return cands[a] * (1 - 1e-9) if a < len(cands) else np.inf


def compute_count_bound(size: int, sb: np.ndarray, sf: np.ndarray, caps: np.ndarray, pools: np.ndarray, P: int,
                        m: int, lo: float, vpp: int = 1, ep_overlap: bool = False) -> float:
    """:func:`layer_count_bound` of one row when memory does not limit a stage (``caps[o]`` stages of option
    o, each able to hold every layer of U; ``sb``, ``sf`` as in :class:`CountTables`), in closed form.

    The c_o stages of o then hold c_o k_o(t) layers of U at threshold t (k_o(t): the most layers whose G
    stays within t), a pool the best of its options. Pool p covers a layers from T_p(a) = min_o
    G_o(ceil(a / c_o)) on (G non-decreasing in k), so the least covering t is the min over the splits of U
    among the pools of the max of their T_p: the same threshold the bisection of :func:`_one_row` finds."""
    if size == 0:
        return lo
    caps = np.asarray(caps, dtype=int)
    a_w, b_w = _weight_coefficients(P, m, vpp, ep_overlap)
    t = _least_covering(size, sb.tolist(), sf.tolist(), caps.tolist(), np.asarray(pools).tolist(), a_w, b_w)
    if t is not None:
        return _covering(t, lo)
    options = np.flatnonzero(caps > 0)
    g = _weights(sb, sf, options, P, m, vpp, ep_overlap)  # (used options, size + 1)
    amount = np.arange(size + 1)
    # per used option and amount a: G of its stages holding ceil(a / c_o) layers each
    held = np.take_along_axis(g, np.minimum(-(-amount[None, :] // caps[options][:, None]), size), axis=1)
    best: np.ndarray | None = None  # least threshold at which the pools so far cover a layers, per a
    used_pools = pools[options]
    pool_ids = np.unique(used_pools)
    for n, pool in enumerate(pool_ids):
        T = held[used_pools == pool].min(axis=0)
        if best is None:
            best = T
        elif n + 1 == len(pool_ids):  # the last pool: only the split of all of U matters
            return _covering(float(np.maximum(best, T[::-1]).min()), lo)
        else:  # min-max convolution: a layers split between the pools so far and this one
            best = np.array([np.maximum(best[:a + 1], T[a::-1]).min() for a in range(size + 1)])
    return _covering(float(best[size]) if best is not None else np.inf, lo)


def _least_covering(size: int, sb: list[list[float]], sf: list[list[float]], caps: list[int], pools: list[int],
                    a_w: float, b_w: float) -> float | None:
    """The least covering threshold of :func:`compute_count_bound` (inf: none) for one or two pools, in
    scalars (``sb``, ``sf`` as Python lists, G = ``a_w`` SB + ``b_w`` SF); None for more pools.

    T_p(a) is non-decreasing in a, so max(T_1(a), T_2(size - a)) is least where the two cross: the first a
    with T_1(a) >= T_2(size - a) (by bisection) or the one before it. Only min and max act on the values of
    G, so the threshold is the same number as the vectorised min-max's."""
    per_pool: dict[int, list[tuple[int, list[float], list[float]]]] = {}
    for o, c in enumerate(caps):
        if c > 0:
            per_pool.setdefault(pools[o], []).append((c, sb[o], sf[o]))
    if len(per_pool) > 2:
        return None
    if not per_pool:
        return np.inf

    def held(entries: list[tuple[int, list[float], list[float]]], a: int) -> float:
        """T_p(a): the least G of a pool's options whose stages hold ``a`` layers of U."""
        least = None
        for c, b, f in entries:
            k = -(-a // c)  # ceil(a / c) layers per stage
            value = a_w * b[k] + b_w * f[k]
            if least is None or value < least:
                least = value
        return least

    if len(per_pool) == 1:
        return held(next(iter(per_pool.values())), size)
    first, second = (per_pool[p] for p in sorted(per_pool))
    lo_a, hi_a = 0, size + 1
    while lo_a < hi_a:
        mid = (lo_a + hi_a) // 2
        if held(first, mid) >= held(second, size - mid):
            hi_a = mid
        else:
            lo_a = mid + 1
    values = ([held(first, lo_a)] if lo_a <= size else []) + ([held(second, size - lo_a + 1)] if lo_a > 0 else [])
    return min(values)


def _covering(t: float, lo: float) -> float:
    """The bound from the least covering threshold ``t`` and the floor ``lo`` (as :func:`_one_row`)."""
    if t <= lo:
        return lo
    return t * (1 - 1e-9) if np.isfinite(t) else np.inf


def _layer_sets(work: np.ndarray) -> list[np.ndarray]:
    """The layer subsets the layer-count bound covers: every layer, and the core layers when they differ."""
    every = np.ones(work.shape[1], dtype=bool)
    core = core_layers(work)
    return [every] if core.all() else [every, core]


class _Stack:
    """The per-layer vectors of a list of option profiles stacked (options x layers), and what the bounds
    derive from them alone (computed when first asked); memoised per profile list (:func:`_stack`), since the
    settings bound, the choices' corners and the stage-count grids of a settings and of its interleaved twins
    reuse it."""

    def __init__(self, profiles: Sequence[OptionProfile]) -> None:
        self.fwd = np.stack([p.forward_s for p in profiles])
        self.bwd = np.stack([p.backward_s for p in profiles])
        self.static = np.stack([p.static_unit for p in profiles])
        self.act = np.stack([p.act_unit for p in profiles])
        self.peak = np.stack([p.peak_unit for p in profiles])
        self.pools = np.array([p.option.pool for p in profiles])
        self.tps = np.array([p.option.ranks for p in profiles], dtype=float)  # devices of a replica
        self._fit: dict[tuple[int, int], bool] = {}
        self._work: dict[int, np.ndarray] = {}

    def states_fit(self, dp: int, num_devices: int) -> bool:
        """Whether ``num_devices`` can hold the model's states and one micro-batch of activations with dp
        replicas: sum_l min_o tp_o dp (c1 ppr_l + act_l)(o) / room_o <= devices (memoised per dp and
        devices)."""
        key = (dp, num_devices)
        hit = self._fit.get(key)
        if hit is None:
            # dp > 0 scales every option's share alike (rounding is monotone), so the least share times dp is
            # the least of the shares times dp
            hit = self._fit[key] = float((self.least_share * dp).sum()) <= num_devices * (1 + 1e-12)
        return hit

    @functools.cached_property
    def least_share(self) -> np.ndarray:
        """Per layer: the least over the options of tp (c1 ppr + act) / room (:meth:`states_fit`)."""
        return ((self.static + self.act) * self.tps[:, None]).min(axis=0)

    def work(self, vpp: int) -> np.ndarray:
        """Each layer's work per option with ``vpp`` chunks: f + b / vpp (memoised)."""
        hit = self._work.get(vpp)
        if hit is None:
            hit = self._work[vpp] = self.fwd + self.bwd if vpp == 1 else self.fwd + self.bwd / vpp
        return hit

    @functools.cached_property
    def alone(self) -> np.ndarray:
        """(O, L): a layer alone in a stage's memory (static, one micro-batch of activations, its peak)."""
        return self.static + self.act + self.peak

    @functools.cached_property
    def sums_b(self) -> np.ndarray:
        return self.bwd.sum(axis=1)

    @functools.cached_property
    def sums_f(self) -> np.ndarray:
        return self.fwd.sum(axis=1)

    @functools.cached_property
    def layer_sets(self) -> list[np.ndarray]:
        return _layer_sets(self.fwd + self.bwd)

    @functools.cached_property
    def inverse(self) -> np.ndarray:
        """1 / rho[ref, o] (inf where rho = 0): q_l(o) >= rho * q_l(ref) for q = (m - 1) b + x f, any x >= 0."""
        rho = np.stack([np.minimum(speed_ratio(self.bwd, ref), speed_ratio(self.fwd, ref))
                        for ref in range(len(self.fwd))])
        with np.errstate(divide="ignore"):
            return np.where(rho > 0, 1.0 / rho, np.inf)

    @functools.cached_property
    def max_in_flight(self) -> np.ndarray:
        """(O, L): the micro-batches a layer alone can hold in flight on each option (-1: none)."""
        act = self.act
        with np.errstate(divide="ignore", invalid="ignore"):
            spare = 1.0 - self.static - self.peak
            return np.where(spare < 0, -1.0, np.where(act > 0, np.floor(spare / np.where(act > 0, act, 1.0)),
                                                       np.inf))


def _stack(profiles: Sequence[OptionProfile], memo: dict | None) -> _Stack:
    key = ("stack", tuple(id(p) for p in profiles))
    hit = memo.get(key) if memo is not None else None
    if hit is None:
        hit = _Stack(profiles)
        if memo is not None:
            memo[key] = hit
    return hit


def layout_floor(profiles: Profiles, layout: Layout, settings: Settings, num_micro_batches: int, block_s: float
                 ) -> float:
    """A lower bound on one layout's DP bound from its block's (``block_s``, a bound of this module, which
    leaves transfers out) and the stages' least send times (:meth:`Backend.send_floors`), without the
    layout's matrices: the fill holds each stage's least send times its hops on the critical path
    (:func:`planner.search.interleave.bound_coefficients`); on top of the fill's least work, the largest G is
    at least a link's steady-state hand-off chain (:func:`planner.search.backend.handoff_g`, with the side's
    least layer) and the layer-count bound of the layout's own stage positions (:func:`position_count_bound`)."""
    P, m, V = layout.num_stages, num_micro_batches, settings.vpp
    all_forwards = get_runtime(settings.runtime).interleaved_all_forwards_at_pp
    floors = profiles.backend.send_floors(layout, settings)
    fill = sum(h * c for h, c in zip(_hops(P, m, V), floors))
    if P == 1:
        return block_s + fill
    memo = profiles.count_memo
    key = ("least work", frozenset(layout.options), settings)
    least = memo.get(key)
    if least is None:
        work = [p.forward_s + p.backward_s / V for p in (profiles.get(o, settings) for o in key[1])]
        least = memo[key] = float(np.minimum.reduce(work).sum())
    largest_g = position_count_bound(profiles, layout, settings, m)
    if any(floors):
        cycles = handoff_cycles(P, m, V, all_forwards, settings.ep_overlap)
        warm = warmups(P, m, V, all_forwards, settings.ep_overlap)
        passes = {o: _least_passes(profiles, o, settings) for o in key[1]}
        for k, (n, span) in enumerate(cycles):
            if n == 0 or floors[k] == 0:
                continue
            for side in (k, k + 1):
                f, b = passes[layout.options[side]]
                largest_g = max(largest_g, handoff_g(f, b, floors[k], m, V, warm[side], (n, span)))
    return max(block_s, least + largest_g) + fill


def position_count_bound(profiles: Profiles, layout: Layout, settings: Settings, num_micro_batches: int) -> float:
    """A lower bound on max_k G_k of one layout from its stages' positions (0 for a single stage; inf when no
    partition fits): stage k on option o_k holding layers A has G_k >= gamma b(A) + delta_k f(A)
    (:func:`planner.search.interleave.bound_coefficients`, the delta of its own position, where the
    order-free bounds take the least) and holds n_k micro-batches in flight, the cost model's count at its
    position; stage 0 holds layer 0 and stage P - 1 the last layer, and every stage holds at least vpp
    layers (whole chunks). At a threshold t, stage k holds at most as many of the other layers as its
    smallest ones within t and within its memory; the least t at which the stages can hold all the other
    layers bounds the largest G (exact for identical layers but the ends')."""
    P, m, V = layout.num_stages, num_micro_batches, settings.vpp
    if P < 2:
        return 0.0
    all_forwards = get_runtime(settings.runtime).interleaved_all_forwards_at_pp
    co = bound_coefficients(P, m, V, all_forwards, settings.ep_overlap)
    in_flight = _positions_in_flight(P, m, settings.schedule, V, all_forwards, settings.ep_overlap)
    rows, most = [], []
    for k, option in enumerate(layout.options):
        ends = (k == 0, k == P - 1)
        sb, sf, end_b, end_f = _inner_prefix(profiles, option, settings, ends)
        rows.append(co.gamma * (sb + end_b) + co.delta[k] * (sf + end_f))
        most.append(_inner_memory_count(profiles, option, settings, ends, in_flight[k]))
    g = np.stack(rows)  # (P, inner layers + 1): G_k holding its end layers and its n smallest others
    most_inner = np.array(most)
    least_inner = np.full(P, V)  # whole chunks; the end stages' own end layers may be one of them
    least_inner[[0, -1]] = V - 1
    size = g.shape[1] - 1
    if (most_inner < least_inner).any() or least_inner.sum() > size:
        return np.inf
    cands = np.unique(g)
    cands = cands[cands >= g[np.arange(P), least_inner].max()]

    def covers(t: float) -> bool:
        held = (g <= t).sum(axis=1) - 1
        return bool((held >= least_inner).all()) and int(np.minimum(held, most_inner).sum()) >= size

    if not len(cands) or not covers(cands[-1]):
        return np.inf
    lo, hi = 0, len(cands) - 1
    while lo < hi:
        mid = (lo + hi) // 2
        if covers(cands[mid]):
            hi = mid
        else:
            lo = mid + 1
    return float(cands[lo]) * (1 - 1e-9)


@functools.lru_cache(maxsize=4096)
def _positions_in_flight(num_stages: int, num_micro_batches: int, schedule: str, vpp: int, all_forwards_at_pp: bool,
                         ep_overlap: bool) -> tuple[float, ...]:
    """The micro-batches each stage position holds in flight, as the cost model counts them."""
    return tuple(micro_batches_in_flight(k, num_stages, num_micro_batches, schedule, vpp, all_forwards_at_pp,
                                         ep_overlap) for k in range(num_stages))


def _inner_prefix(profiles: Profiles, option: StageOption, settings: Settings, ends: tuple[bool, bool]
                  ) -> tuple[np.ndarray, np.ndarray, float, float]:
    """For a stage on ``option`` holding the first layer (``ends[0]``) and/or the last (``ends[1]``): the
    prefix sums of the other layers' sorted backward and forward times (0 first), and its end layers'."""
    key = ("inner prefix", option, settings, ends)
    hit = profiles.count_memo.get(key)
    if hit is None:
        prof = profiles.get(option, settings)
        b, f = prof.backward_s, prof.forward_s
        fixed = _end_layers(len(b), ends)
        inner = np.ones(len(b), dtype=bool)
        inner[[0, -1]] = False
        hit = profiles.count_memo[key] = (_sorted_prefix(b[None, :], inner)[0], _sorted_prefix(f[None, :], inner)[0],
                                          float(b[fixed].sum()), float(f[fixed].sum()))
    return hit


def _inner_memory_count(profiles: Profiles, option: StageOption, settings: Settings, ends: tuple[bool, bool],
                        in_flight: float) -> int:
    """The most of the layers other than the first and last a stage on ``option`` holds beside its end layers
    (``ends`` as :func:`_inner_prefix`) with ``in_flight`` micro-batches (its smallest static + n act, plus
    the least transient, within one room); -1 when its end layers alone do not fit."""
    key = ("inner memory", option, settings, ends, in_flight)
    hit = profiles.count_memo.get(key)
    if hit is None:
        prof = profiles.get(option, settings)
        static, act, peak = prof.static_unit, prof.act_unit, prof.peak_unit
        held = float((static + in_flight * act)[_end_layers(len(static), ends)].sum())
        with np.errstate(invalid="ignore"):
            fits = held + float(peak.min()) <= 1.0 + 1e-9
        hit = profiles.count_memo[key] = int(_memory_counts(static[1:-1], act[1:-1], peak, 1, 1, np.array([in_flight]),
                                                            held)[0]) if fits else -1
    return hit


def _end_layers(num_layers: int, ends: tuple[bool, bool]) -> list[int]:
    """The end layers a stage holds: the first (``ends[0]``) and the last (``ends[1]``)."""
    return [i for i, held in zip((0, num_layers - 1), ends) if held]


@functools.lru_cache(maxsize=4096)
def _hops(num_stages: int, num_micro_batches: int, vpp: int) -> tuple[float, ...]:
    """Each stage's transfers on the critical path (:func:`planner.search.interleave.bound_coefficients`)."""
    return tuple(bound_coefficients(num_stages, num_micro_batches, vpp).hops.tolist())


def _least_passes(profiles: Profiles, option: StageOption, settings: Settings) -> tuple[float, float]:
    """The least forward and backward of one layer of ``option``: a stage's, since it holds a layer or more."""
    key = ("least passes", option, settings)
    hit = profiles.count_memo.get(key)
    if hit is None:
        prof = profiles.get(option, settings)
        hit = profiles.count_memo[key] = (float(prof.forward_s.min()), float(prof.backward_s.min()))
    return hit


def lower_bounds(profiles: Sequence[OptionProfile], counts: np.ndarray, num_micro_batches: int,
                 corners: bool = False, vpp: int = 1, memo: dict | None = None, cutoff_s: float = np.inf,
                 lows: np.ndarray | None = None, ep_overlap: bool = False) -> np.ndarray:
    """Bounds for every row of ``counts`` (stages per option, shape (n, len(profiles)); 0 = option unused);
    inf = infeasible. Rows are grouped by their set of options. ``corners``: only the parts that do not
    increase with any stage count (compute, layer counts, a layer alone in memory), so that each row
    bounds every smaller count of its options too, down to ``lows`` (default one stage per used option),
    where the parts that grow with the counts (the layers each stage must hold) are taken. ``vpp > 1``: the
    interleaved schedule's weights (b_l / vpp in the sum, (m - 1/vpp) b_l and stage 0's forward weight in q,
    both non-increasing in the stage count), every stage holding at least ``vpp`` layers (whole chunks), and a
    row's memory bounds with the in-flight counts of its own stage count (:func:`in_flight_ascending`; corners:
    1F1B's, which are smaller for every stage count, since the interleaved warm-up grows with the stage count).
    A row whose bound reaches ``cutoff_s`` may get any value from ``cutoff_s`` up to its bound (the caller drops it)."""
    counts = np.asarray(counts, dtype=int).reshape(-1, len(profiles))
    out = np.full(len(counts), np.inf)
    if len(counts) == 0:
        return out
    m = num_micro_batches
    st = _stack(profiles, memo)
    fwd, bwd, static, act, peak = st.fwd, st.bwd, st.static, st.act, st.peak  # (O, L)
    work = st.work(vpp)
    gamma = (m - 1) if vpp == 1 else m - 1.0 / vpp
    O, L = fwd.shape
    inverse, pools = st.inverse, st.pools
    sums_b, sums_f = st.sums_b, st.sums_f
    most = counts.max(axis=0)
    count_sets = [_count_tables_memo(memo, profiles, fwd, bwd, static, act, peak, layers, most, m)
                  for layers in st.layer_sets]
    groups = [(M, rows) for M, rows in _row_groups(counts > 0) if len(M)]
    if not groups:
        return out
    # what depends on a group's options alone, for every group at once (min and max are exact, and the sorted
    # prefix sums and the sums over the layers add the same numbers in the same order as one group's would)
    masks = np.zeros((len(groups), O), dtype=bool)
    for g, (M, _) in enumerate(groups):
        masks[g, M] = True
    hide = np.where(masks[:, :, None], 0.0, np.inf)  # (groups, O, 1): + inf leaves an option out of a min
    worsts = (st.alone[None] + hide).min(axis=1).max(axis=1)
    leasts = (work[None] + hide).min(axis=1)  # (groups, L)
    sum_mins = leasts.sum(axis=1)
    # per group and option: 0 and the prefix sums of what the option's layers lose, smallest first
    prefixes = np.concatenate([np.zeros((len(groups), O, 1)),
                               np.cumsum(np.sort(work[None] - leasts[:, None, :], axis=2), axis=2)], axis=2)
    for g, (M, rows) in enumerate(groups):
        worst = float(worsts[g])
        if worst > 1.0:  # some layer fits on none of the options: infeasible, whatever the counts
            out[rows] = np.inf
            continue
        c = counts[rows].astype(float)
        total = c.sum(axis=1)
        extra = np.maximum(0.0, m - total - int(ep_overlap)) if vpp == 1 else \
            np.array([least_delta(int(p), m, vpp, ep_overlap) for p in total.tolist()])
        sum_min = float(sum_mins[g])
        # what the layers every stage must hold (vpp of them, a chunk each) lose on their stage's option
        # (corners: at the least counts)
        held = c[:, M] if not corners else np.minimum(c[:, M], 1) if lows is None else \
            np.asarray(lows, dtype=int).reshape(-1, O)[rows][:, M]
        sums = sum_min + _pick_sums(prefixes[g, M], vpp * held)
        q = gamma * bwd[M][None] + extra[:, None, None] * fwd[M][None]  # (r, |M|, L)
        max_g = q.min(axis=1).max(axis=1)
        with np.errstate(invalid="ignore"):
            capacity = c @ inverse.T  # (r, ref)
        totals = gamma * sums_b[None, :] + extra[:, None] * sums_f[None, :]
        with np.errstate(divide="ignore", invalid="ignore"):
            fluid = np.where((capacity > 0) & np.isfinite(capacity), totals / capacity, 0.0)
        max_g = np.maximum(max_g, fluid.max(axis=1))
        P_rows = total.astype(int)
        # max G at or above a row's stop puts its bound at or above the cutoff (the margin covers the rounding)
        stops = cutoff_s - sums + 1e-9 * abs(cutoff_s) if np.isfinite(cutoff_s) else np.full(len(rows), np.inf)
        for tables in count_sets:
            live = np.flatnonzero(max_g < stops)  # the rows that may still beat the cutoff
            if not len(live):
                break
            max_g[live] = layer_count_bound(tables, M, c[live][:, M], pools[M], P_rows[live], m, max_g[live], vpp,
                                            float(stops[live].max()), 1 if corners else vpp, ep_overlap)
        if corners:
            out[rows] = sums + max_g  # worst <= 1: the group was skipped otherwise
            continue
        # memory
        base_use = float((static[M] + act[M]).min(axis=0).sum())
        smallest_act = np.sort(act[M].min(axis=0))
        # pairing[P] = sum_{i < P} (n_i - 1) * smallest_act[i], n the stages' in-flight counts largest first
        # (1F1B: min(P - i, m))
        acts = np.where(np.isfinite(smallest_act), smallest_act, 1e300)
        if vpp == 1:
            span = np.arange(L + 1)[:, None] - np.arange(L)[None, :]  # P - i
            weights = np.where(span >= 2, np.minimum(span, m) - 1, 0).astype(float)
            with np.errstate(invalid="ignore"):
                pairing = weights @ acts
        else:
            pairing = np.full(L + 1, np.inf)
            for P in np.unique(P_rows[P_rows <= L]):
                pairing[P] = float((in_flight_ascending(int(P), m, vpp)[::-1] - 1.0) @ acts[:P])
        subsets = np.array([[i in t for i in range(len(M))] for size in range(1, len(M) + 1)
                            for t in itertools.combinations(range(len(M)), size)], dtype=bool)
        carry = st.max_in_flight[M]  # (|M|, L)
        ok = np.stack([_hall_table(carry[t].max(axis=0), m) for t in subsets])  # (subsets, L + 1)
        need = (c[:, M] @ subsets.T.astype(float)).astype(int)  # (rows, subsets): stages on each subset
        hall = ok[np.arange(len(subsets))[None, :], np.minimum(need, L + 1 - 1)].all(axis=1) & (need <= L).all(axis=1)
        feasible = hall & (base_use + pairing[P_rows] <= P_rows * (1 + 1e-12))
        out[rows] = np.where(feasible, sums + max_g, np.inf)
    return out


def _pick_sums(prefix: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """Per row: sum over options j of ``prefix[j, counts[r, j]]`` (``prefix[j]``: 0 and the running sums of
    option j's excess over the fastest work, smallest first): the least that distinct layers, ``counts[r, j]``
    of them on option j, can add above their fastest work."""
    n = np.minimum(np.asarray(counts, dtype=int), prefix.shape[1] - 1)
    return prefix[np.arange(len(prefix))[None, :], n].sum(axis=1)


def _row_groups(members: np.ndarray) -> list[tuple[np.ndarray, np.ndarray]]:
    """The rows of ``members`` (rows x options, bool) grouped by their set of options: per group, its options
    and its rows (ascending)."""
    n, O = members.shape
    if n == 1 or bool((members == members[0]).all()):
        return [(np.flatnonzero(members[0]), np.arange(n))]
    if O <= 62:  # each set of options as one integer
        _, inverse = np.unique(members.astype(np.int64) @ (1 << np.arange(O, dtype=np.int64)), return_inverse=True)
    else:
        _, inverse = np.unique(members, axis=0, return_inverse=True)
    inverse = inverse.reshape(-1)
    order = np.argsort(inverse, kind="stable")
    ends = np.cumsum(np.bincount(inverse))
    return [(np.flatnonzero(members[order[start]]), order[start:end])
            for start, end in zip(itertools.chain([0], ends[:-1].tolist()), ends.tolist())]


def _stage_caps(caps: np.ndarray, pools: np.ndarray, num_layers: int, max_stages: int
                ) -> tuple[np.ndarray, np.ndarray, int]:
    """Each option's most stages capped by the layers and ``max_stages``; the pools (all one when a plan has
    one stage: one option in all); the most stages a plan can have (a pool serves one option per plan)."""
    capped, pool_list, most = _stage_caps_list(np.asarray(caps, dtype=int).tolist(), np.asarray(pools).tolist(),
                                               num_layers, max_stages)
    return np.array(capped, dtype=int), np.array(pool_list, dtype=np.asarray(pools).dtype), most


def _stage_caps_list(caps: list[int], pools: list[int], num_layers: int, max_stages: int
                     ) -> tuple[list[int], list[int], int]:
    """:func:`_stage_caps` on Python lists."""
    limit = min(num_layers, max_stages)
    caps = [min(c, limit) for c in caps]
    if max_stages == 1:
        pools = [0] * len(pools)
    most: dict[int, int] = {}
    for c, pool in zip(caps, pools):
        most[pool] = max(most.get(pool, c), c)
    return caps, pools, min(num_layers, max_stages, sum(most.values()))


def settings_lower_bound(profiles: Sequence[OptionProfile], caps: np.ndarray, m: int, num_layers: int, max_stages: int,
                         num_devices: int, dp: int, floor_s: float, vpp: int = 1, memo: dict | None = None,
                         cutoff_s: float = np.inf, ep_overlap: bool = False) -> float:
    """A lower bound for every plan of one settings (any pools, tp, stage counts and partition), at least
    ``floor_s`` (:class:`QuickSettingsBound`), from the options of every pool (``caps[o]``: the most stages
    option o can have): the layer-count bound with each pool at its best option's largest count and at most
    one stage per layer; inf when the model cannot fit (then also: a stage of tp x dp devices holds at most
    one unit of (c1 ppr + act) / room, so sum_l min_o tp_o dp (c1 ppr_l + act_l)(o) / room_o <= devices).
    Once the bound is known to reach ``cutoff_s`` it stops refining it (a value of at least ``cutoff_s``)."""
    if not profiles:
        return np.inf
    st = _stack(profiles, memo)
    fwd, bwd, static, act, peak, pools = st.fwd, st.bwd, st.static, st.act, st.peak, st.pools
    if not st.states_fit(dp, num_devices):
        return np.inf
    sum_min = float(st.work(vpp).min(axis=0).sum())
    best = floor_s - sum_min
    caps, pools, most = _stage_caps(caps, pools, num_layers, max_stages)
    total = np.array([most])
    options = np.arange(len(profiles))
    # max G at or above stop puts the bound at or above the cutoff (the margin covers the rounding)
    stop = cutoff_s - sum_min + 1e-9 * abs(cutoff_s) if np.isfinite(cutoff_s) else np.inf
    for layers in st.layer_sets:
        tables = _count_tables_memo(memo, profiles, fwd, bwd, static, act, peak, layers, caps, m)
        best = float(layer_count_bound(tables, options, caps[None, :], pools, total, m, np.array([best]), vpp,
                                       stop, ep_overlap=ep_overlap)[0])
        if not np.isfinite(best):
            return np.inf
        if best >= stop:
            break
    return sum_min + best


class QuickSettingsBound:
    """A cheap lower bound for every plan of one settings, from compute alone (no memory): the per-layer
    least work plus the fluid bound of :func:`settings_lower_bound`. Its tables depend only on the options
    and the layer tables (micro-batch, recompute, sequence parallelism, dtype), so the settings that differ
    in dp and ZeRO share them; the search orders settings by it and computes the strong bound lazily."""

    def __init__(self, backend: Backend, pool_devices: np.ndarray, num_layers: int) -> None:
        self.backend, self.pool_devices, self.num_layers = backend, pool_devices, num_layers
        # per tuple of options (found by its id first: the search passes the same tuples over and over), the
        # tables per layer-table fields of the settings
        self._by_id: dict[int, tuple[tuple[StageOption, ...], dict]] = {}
        self._by_options: dict[tuple[StageOption, ...], dict] = {}

    def _tables(self, options: tuple[StageOption, ...], settings: Settings) -> _QuickTables:
        entry = self._by_id.get(id(options))
        if entry is None or entry[0] is not options:  # keep the tuple alive with its id
            entry = self._by_id[id(options)] = (options, self._by_options.setdefault(options, {}))
        key = (settings.micro_batch, settings.recompute, settings.sequence_parallel, settings.dtype,
               settings.runtime, settings.ep, settings.expert_tp, settings.ep_overlap)
        hit = entry[1].get(key)
        if hit is None:
            tabs = [self.backend.layer_table(o, settings) for o in options]
            fwd = np.stack([np.asarray(t.forward_s, dtype=float) for t in tabs])
            bwd = np.stack([np.asarray(t.backward_s, dtype=float) for t in tabs])
            widest = float(bwd.min(axis=0).max())
            pools = sorted({o.pool for o in options})
            per_pool = np.zeros((len(options), len(pools)))  # [ref, pool]: max over its options 1/(rho tp)
            longest = np.zeros(len(options))
            usable = np.zeros(len(options), dtype=bool)
            for ref in range(len(options)):
                rho = np.minimum(speed_ratio(bwd, ref), speed_ratio(fwd, ref))
                usable[ref] = bool((rho > 0).all())
                if usable[ref]:
                    longest[ref] = float((1.0 / rho).max())
                    for o, r in zip(options, rho):
                        j = pools.index(o.pool)
                        per_pool[ref, j] = max(per_pool[ref, j], 1.0 / (r * o.ranks))
            # per reference option (Python scalars: a settings then divides by its dp): the devices'
            # capacity, the layer-count cap on it, backward sum; the reference options that bound
            devices = per_pool @ self.pool_devices[np.array(pools)]
            refs = [(float(d), float(self.num_layers * lg), float(sb)) for d, lg, sb, ok
                    in zip(devices, longest, bwd.sum(axis=1), usable) if ok]
            hit = entry[1][key] = _QuickTables(widest, refs, fwd, bwd, [o.pool for o in options])
        return hit

    def bound(self, options: tuple[StageOption, ...], settings: Settings, m: int,
              caps: Sequence[int] | None = None, max_stages: int | None = None) -> float:
        """The bound; with ``caps`` (the most stages of each option) and ``max_stages``, also the layer-count
        bound on compute alone (no memory limit), shared by the settings that differ only in ZeRO."""
        if not options:
            return np.inf
        tables = self._tables(options, settings)
        sum_min = tables.least_work(settings.vpp)
        fluid = 0.0
        for devices, most_layers, sum_b in tables.refs:
            capacity = min(devices / settings.dp, most_layers)
            if capacity > 0:
                fluid = max(fluid, sum_b / capacity)
        gamma = (m - 1) if settings.vpp == 1 else m - 1.0 / settings.vpp  # G_k >= gamma b_k
        best = gamma * max(tables.widest, fluid)
        if caps is None or max_stages is None:
            return sum_min + best
        # (not cached here: the search caches this bound per settings, which determines every argument)
        caps, option_pools, total = _stage_caps_list([int(c) for c in caps], tables.pools, self.num_layers,
                                                     max_stages)
        a_w, b_w = _weight_coefficients(total, m, settings.vpp)
        for size, sb, sf, sb_rows, sf_rows in tables.sorted():
            t = _least_covering(size, sb_rows, sf_rows, caps, option_pools, a_w, b_w) if size else None
            best = compute_count_bound(size, sb, sf, np.array(caps), np.array(option_pools), total, m, best,
                                       settings.vpp) if t is None else _covering(t, best)
        return sum_min + best


@dataclass(eq=False)
class _QuickTables:
    """What :class:`QuickSettingsBound` keeps per options and layer tables: the widest layer's least
    backward, the reference options' (capacity, layer cap, backward sum), the stacked times, each option's
    pool, and (when first asked) the least work per chunk count and the sorted prefix sums."""

    widest: float
    refs: list[tuple[float, float, float]]
    fwd: np.ndarray
    bwd: np.ndarray
    pools: list[int]
    _least: dict[int, float] = dataclasses.field(default_factory=dict)
    _sorted: list | None = None

    def least_work(self, vpp: int) -> float:
        """The least work per layer summed: the one part that depends on the chunks."""
        hit = self._least.get(vpp)
        if hit is None:
            fwd, bwd = self.fwd, self.bwd
            hit = self._least[vpp] = float((fwd + bwd).min(axis=0).sum()) if vpp == 1 else \
                float((fwd + bwd / vpp).min(axis=0).sum())
        return hit

    def sorted(self) -> list[tuple[int, np.ndarray, np.ndarray, list, list]]:
        """Per layer set of :func:`_layer_sets`: its size and the prefix sums of sorted backward and forward
        times (the time part of :class:`CountTables`), as arrays and as Python lists."""
        if self._sorted is None:
            self._sorted = []
            for layers in _layer_sets(self.fwd + self.bwd):
                sb, sf = _sorted_prefix(self.bwd, layers), _sorted_prefix(self.fwd, layers)
                self._sorted.append((int(layers.sum()), sb, sf, sb.tolist(), sf.tolist()))
        return self._sorted
