"""Lower bounds on the objective of every plan with a given set of stage blocks, valid for any layer partition
and any order of the blocks. The search visits blocks in increasing bound order and stops once the bound
reaches its K-th best plan, so these bounds must never exceed a true objective.

For option o let s_l(o) be layer l's time per micro-batch. For any partition:
  * sum_k a_k >= sum_l min_o s_l(o)                                          (p2p >= 0)
  * max_k a_k >= max_l min_o s_l(o)                                          (every layer is somewhere)
  * max_k a_k >= W_ref / sum_k 1/rho_k, rho_k = min_l s_l(o_k)/s_l(ref)      (a_k >= rho_k * its share of W_ref)
  * max_k r_k >= tail(sum_l ppr_l / P) on one option (some stage holds the mean), else min_o tail(min_l ppr_l)
and memory: with static(x) = c0 + c1 x, a stage needs sum over its layers of
u_l(o) = (c1 ppr_l(o) + act_l(o) * in_flight_min) / (cap_o - c0) <= 1; summing, sum_l min_o u_l(o) <= P.
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
    step_s: np.ndarray
    params_per_rank: np.ndarray
    usage: np.ndarray  # u_l(o) above with in_flight_min = 1 (inf when the option cannot hold a layer)
    usage_alone: np.ndarray  # u_l(o) plus the layer's own transient peak: a stage holding l needs <= 1
    static_affine: bool


def option_profile(backend: Backend, option: StageOption, settings: Settings) -> OptionProfile:
    t = backend.layer_table(option, settings)
    probe = np.array([0.0, 1e9, 2e9])
    static = np.asarray(backend.static_bytes(probe, option, settings), dtype=float)
    c0, c1 = static[0], (static[1] - static[0]) / 1e9
    affine = bool(np.isclose(static[2], c0 + 2e9 * c1, rtol=1e-9, atol=1.0))
    room = backend.capacity_bytes(option) - c0
    if not affine:
        usage = alone = np.zeros_like(t.step_s, dtype=float)
    elif room <= 0:
        usage = alone = np.full_like(t.step_s, np.inf, dtype=float)
    else:
        usage = (c1 * t.params_per_rank + t.act_bytes) / room
        alone = usage + t.peak_bytes / room
    return OptionProfile(option=option, step_s=np.asarray(t.step_s, dtype=float),
                         params_per_rank=np.asarray(t.params_per_rank, dtype=float), usage=usage,
                         usage_alone=alone, static_affine=affine)


def lower_bounds(backend: Backend, profiles: list[OptionProfile], counts: np.ndarray, settings: Settings,
                 num_micro_batches: int) -> np.ndarray:
    """Bounds for every row of ``counts`` (stages per option, shape (n, len(profiles))); inf = infeasible."""
    steps = np.stack([p.step_s for p in profiles])  # (O, L)
    min_step = steps.min(axis=0)
    sum_min = float(min_step.sum())
    single = float(min_step.max())
    counts = np.asarray(counts, dtype=float)
    total = counts.sum(axis=1)
    fluid = np.zeros(len(counts))
    for ref in range(len(profiles)):
        base = steps[ref]
        pos = base > 0
        if not pos.any():
            continue
        rho = np.array([float((steps[o][pos] / base[pos]).min()) for o in range(len(profiles))])
        with np.errstate(divide="ignore"):
            capacity = counts @ np.where(rho > 0, 1.0 / rho, np.inf)
        fluid = np.maximum(fluid, np.where(capacity > 0, float(base.sum()) / capacity, 0.0))
    max_a = np.maximum(single, fluid)
    usage = float(np.stack([p.usage for p in profiles]).min(axis=0).sum())
    alone = float(np.stack([p.usage_alone for p in profiles]).min(axis=0).max())
    if len(profiles) == 1:
        p = profiles[0]
        r = np.asarray(backend.tail_s(p.params_per_rank.sum() / total, p.option, settings), dtype=float)
    else:
        r = np.full(len(counts), min(float(np.asarray(backend.tail_s(np.array([p.params_per_rank.min()]),
                                                                     p.option, settings))[0])
                                     for p in profiles))
    coeff = {int(P): backend.coefficients(int(P), num_micro_batches, settings) for P in np.unique(total)}
    alpha = np.array([coeff[int(P)][0] for P in total])
    beta = np.array([coeff[int(P)][1] for P in total])
    feasible = (alone <= 1.0) & (usage <= total * (1 + 1e-12))
    return np.where(feasible, beta * sum_min + alpha * max_a + r, np.inf)
