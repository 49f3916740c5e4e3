"""Lower bounds on the DP bound of :mod:`planner.search.backend` for every plan with a given set of stage
blocks, valid for any layer partition and any order of the blocks. The search visits blocks in increasing
bound order and stops once the bound reaches its K-th best plan, so these bounds must never exceed the true
iteration time of any plan they cover.

For option o let f_l(o), b_l(o) be layer l's forward and backward time per micro-batch. For any partition:
  * sum_k S_k >= sum_l min_o (f_l + b_l)(o)                                     (transfers >= 0)
  * G_k >= sum_{l in k} q_l(o_k),  q_l = (m - 1) b_l + max(0, m - P) f_l          (w_k <= P - 1), so
    max_k G_k >= max_l min_o q_l(o)  and  >= Q_ref / sum_k 1/rho_k, rho_k = min_l q_l(o_k) / q_l(ref)
  * R >= 0
and memory: with static(x) = c0 + c1 x, a stage needs the sum over its layers of
u_l(o) = (c1 ppr_l(o) + act_l(o)) / (cap_o - c0) to be <= 1 (one micro-batch in flight at least), so
sum_l min_o u_l(o) <= P, and every layer's own u_l plus its transient peak must be <= 1 on some option.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from planner.search.backend import Backend
from planner.search.space import Settings, StageOption


@dataclass(frozen=True, eq=False)
class OptionProfile:
    """Per-layer vectors of one option under one settings, for bounding."""

    option: StageOption
    forward_s: np.ndarray
    backward_s: np.ndarray
    usage: np.ndarray  # u_l(o) above (inf when the option cannot hold anything)
    usage_alone: np.ndarray  # u_l(o) plus the layer's transient peak


def option_profile(backend: Backend, option: StageOption, settings: Settings) -> OptionProfile:
    t = backend.layer_table(option, settings)
    probe = np.array([0.0, 1e9, 2e9])
    static = np.asarray(backend.static_bytes(probe, option, settings), dtype=float)
    c0, c1 = static[0], (static[1] - static[0]) / 1e9
    affine = bool(np.isclose(static[2], c0 + 2e9 * c1, rtol=1e-9, atol=1.0))
    room = backend.capacity_bytes(option) - c0
    if not affine:
        usage = alone = np.zeros(len(t.forward_s))
    elif room <= 0:
        usage = alone = np.full(len(t.forward_s), np.inf)
    else:
        usage = (c1 * np.asarray(t.params_per_rank) + np.asarray(t.act_bytes)) / room
        alone = usage + np.asarray(t.peak_bytes) / room
    return OptionProfile(option=option, forward_s=np.asarray(t.forward_s, dtype=float),
                         backward_s=np.asarray(t.backward_s, dtype=float), usage=usage, usage_alone=alone)


def _rho(values: np.ndarray, ref: int) -> np.ndarray:
    """min_l values[o, l] / values[ref, l] over layers where the reference is positive, per option o."""
    base = values[ref]
    pos = base > 0
    if not pos.any():
        return np.zeros(len(values))
    return (values[:, pos] / base[pos]).min(axis=1)


def lower_bounds(profiles: list[OptionProfile], counts: np.ndarray, num_micro_batches: int) -> np.ndarray:
    """Bounds for every row of ``counts`` (stages per option, shape (n, len(profiles))); inf = infeasible."""
    m = num_micro_batches
    fwd = np.stack([p.forward_s for p in profiles])  # (O, L)
    bwd = np.stack([p.backward_s for p in profiles])
    sum_min = float((fwd + bwd).min(axis=0).sum())
    counts = np.asarray(counts, dtype=float)
    total = counts.sum(axis=1)
    extra = np.maximum(0.0, m - total)  # max(0, m - P) per row
    # rho for q = (m-1) b + x f with any x >= 0 is at least min(rho_b, rho_f)
    rho = np.full((len(profiles), len(profiles)), np.inf)
    for ref in range(len(profiles)):
        rho[ref] = np.minimum(_rho(bwd, ref), _rho(fwd, ref))
    q = (m - 1) * bwd[None, :, :] + extra[:, None, None] * fwd[None, :, :]  # (rows, O, L)
    max_g = q.min(axis=1).max(axis=1)
    with np.errstate(divide="ignore"):
        inverse = np.where(rho > 0, 1.0 / rho, np.inf)  # (ref, O)
        capacity = counts @ inverse.T  # (rows, ref)
    totals = (m - 1) * bwd.sum(axis=1)[None, :] + extra[:, None] * fwd.sum(axis=1)[None, :]  # (rows, ref)
    with np.errstate(divide="ignore", invalid="ignore"):
        fluid = np.where((capacity > 0) & np.isfinite(capacity), totals / capacity, 0.0)
    max_g = np.maximum(max_g, fluid.max(axis=1))
    usage = float(np.stack([p.usage for p in profiles]).min(axis=0).sum())
    alone = float(np.stack([p.usage_alone for p in profiles]).min(axis=0).max())
    feasible = (alone <= 1.0) & (usage <= total * (1 + 1e-12))
    return np.where(feasible, sum_min + max_g, np.inf)
