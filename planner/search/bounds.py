"""Lower bounds on the DP bound of :mod:`planner.search.backend` for every plan with a given set of stage
blocks, valid for any layer partition and any order of the blocks. The search visits blocks in increasing
bound order and stops once the bound reaches its K-th best plan, so these bounds must never exceed the true
iteration time of any plan they cover.

For option o let f_l(o), b_l(o) be layer l's forward and backward time per micro-batch. For any partition:
  * sum_k S_k >= sum_l min_o (f_l + b_l)(o)                                     (transfers >= 0)
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
"""

from __future__ import annotations

from dataclasses import dataclass

import itertools

import numpy as np

from planner.search.backend import Backend
from planner.search.interleave import least_delta
from planner.search.space import Settings, StageOption


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


def option_profile(backend: Backend, option: StageOption, settings: Settings) -> OptionProfile:
    t = backend.layer_table(option, settings)
    probe = np.array([0.0, 1e9, 2e9])
    static = np.asarray(backend.static_bytes(probe, option, settings), dtype=float)
    c0, c1 = static[0], (static[1] - static[0]) / 1e9
    affine = bool(np.isclose(static[2], c0 + 2e9 * c1, rtol=1e-9, atol=1.0))
    room = backend.capacity_bytes(option) - c0
    n = len(t.forward_s)
    if not affine:
        units = [np.zeros(n)] * 3
    elif room <= 0:
        units = [np.full(n, np.inf)] * 3
    else:
        units = [c1 * np.asarray(t.params_per_rank, dtype=float) / room, np.asarray(t.act_bytes, dtype=float) / room,
                 np.asarray(t.peak_bytes, dtype=float) / room]
    return OptionProfile(option=option, forward_s=np.asarray(t.forward_s, dtype=float),
                         backward_s=np.asarray(t.backward_s, dtype=float), static_unit=units[0], act_unit=units[1],
                         peak_unit=units[2])


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


def lower_bounds(profiles: list[OptionProfile], counts: np.ndarray, num_micro_batches: int, vpp: int = 1
                 ) -> np.ndarray:
    """Bounds for every row of ``counts`` (stages per option, shape (n, len(profiles)); 0 = option unused);
    inf = infeasible. Rows are grouped by their set of options. ``vpp > 1``: the interleaved schedule's
    weights (b_l / vpp in the sum, (m - 1/vpp) b_l and stage 0's forward weight in q); its memory holds at
    least the 1F1B micro-batches in flight, so the memory bounds below stay valid."""
    counts = np.asarray(counts, dtype=int).reshape(-1, len(profiles))
    out = np.full(len(counts), np.inf)
    if len(counts) == 0:
        return out
    m = num_micro_batches
    fwd = np.stack([p.forward_s for p in profiles])  # (O, L)
    bwd = np.stack([p.backward_s for p in profiles])
    both = fwd + bwd if vpp == 1 else fwd + bwd / vpp
    gamma = (m - 1) if vpp == 1 else m - 1.0 / vpp
    static = np.stack([p.static_unit for p in profiles])
    act = np.stack([p.act_unit for p in profiles])
    alone = static + act + np.stack([p.peak_unit for p in profiles])
    O, L = fwd.shape
    with np.errstate(divide="ignore", invalid="ignore"):
        spare = 1.0 - static - np.stack([p.peak_unit for p in profiles])
        max_in_flight = np.where(spare < 0, -1.0, np.where(act > 0, np.floor(spare / np.where(act > 0, act, 1.0)),
                                                            np.inf))
    # rho[ref, o]: q_l(o) >= rho * q_l(ref) for q = (m - 1) b + x f with any x >= 0
    rho = np.stack([np.minimum(speed_ratio(bwd, ref), speed_ratio(fwd, ref)) for ref in range(O)])
    with np.errstate(divide="ignore"):
        inverse = np.where(rho > 0, 1.0 / rho, np.inf)
    sums_b, sums_f = bwd.sum(axis=1), fwd.sum(axis=1)
    members = counts > 0
    keys, group = np.unique(members, axis=0, return_inverse=True)
    for g, key in enumerate(keys):
        rows = np.flatnonzero(group.reshape(-1) == g)
        M = np.flatnonzero(key)
        if len(M) == 0:
            continue
        c = counts[rows].astype(float)
        total = c.sum(axis=1)
        extra = np.maximum(0.0, m - total) if vpp == 1 else np.array([least_delta(int(p), m, vpp) for p in total])
        sum_min = float(both[M].min(axis=0).sum())
        q = gamma * bwd[M][None] + extra[:, None, None] * fwd[M][None]  # (r, |M|, L)
        max_g = q.min(axis=1).max(axis=1)
        with np.errstate(invalid="ignore"):
            capacity = c @ inverse.T  # (r, ref)
        totals = gamma * sums_b[None, :] + extra[:, None] * sums_f[None, :]
        with np.errstate(divide="ignore", invalid="ignore"):
            fluid = np.where((capacity > 0) & np.isfinite(capacity), totals / capacity, 0.0)
        max_g = np.maximum(max_g, fluid.max(axis=1))
        # memory
        base_use = float((static[M] + act[M]).min(axis=0).sum())
        smallest_act = np.sort(act[M].min(axis=0))
        P_rows = total.astype(int)
        # pairing[P] = sum_{i < P-1} (min(P - i, m) - 1) * smallest_act[i]
        span = np.arange(L + 1)[:, None] - np.arange(L)[None, :]  # P - i
        weights = np.where(span >= 2, np.minimum(span, m) - 1, 0).astype(float)
        with np.errstate(invalid="ignore"):
            pairing = weights @ np.where(np.isfinite(smallest_act), smallest_act, 1e300)
        worst = float(alone[M].min(axis=0).max())
        subsets = np.array([[i in t for i in range(len(M))] for size in range(1, len(M) + 1)
                            for t in itertools.combinations(range(len(M)), size)], dtype=bool)
        carry = max_in_flight[M]  # (|M|, L)
        ok = np.stack([_hall_table(carry[t].max(axis=0), m) for t in subsets])  # (subsets, L + 1)
        need = (c[:, M] @ subsets.T.astype(float)).astype(int)  # (rows, subsets): stages on each subset
        hall = ok[np.arange(len(subsets))[None, :], np.minimum(need, L + 1 - 1)].all(axis=1) & (need <= L).all(axis=1)
        feasible = (worst <= 1.0) & hall & (base_use + pairing[P_rows] <= P_rows * (1 + 1e-12))
        out[rows] = np.where(feasible, sum_min + max_g, np.inf)
    return out
