"""Heterogeneous data parallelism in the search: one stage whose replicas span several device pools (GPU
types), each pool's replicas taking a share of the batch in proportion to its speed.

Space. For settings (micro-batch ``b``, data-parallel degree ``D``, ZeRO, recompute, sequence parallelism;
1F1B, no interleaving) and two pools A and B of a mixed cluster: ``dp_A + dp_B = D`` replicas, those on
pool A ``tp_A``-way tensor parallel (the first ``tp_A dp_A`` devices of A), those on B ``tp_B``-way, the
whole model on every replica (a single pipeline stage). The ``D m = G / b`` micro-batches of an iteration
are split into whole micro-batches per replica: ``m_A`` on each replica of A and ``m_B`` on each of B, with
``dp_A m_A + dp_B m_B = D m`` (the ReplicaSpec batch shares are ``dp_r m_r / (D m)``). ZeRO shards over all
``D`` replicas, and their gradient synchronisation spans both pools over the slower link (the cost model's
rules for replica groups, :mod:`planner.cost.estimator`).

Which splits. The cost model times such a stage as ``max_r m_r t_r`` (``t_r``: one micro-batch's forward
and backward on a replica of r) plus the synchronisation and optimizer step, and neither those nor the
memory (one micro-batch in flight) depend on the split. ``max(m_A t_A, m_B t_B)`` is smallest at one of
the two feasible splits around the balance point ``m_A t_A = m_B t_B``, so only those two are timed.
(``t_r`` is taken from the search's per-layer tables; under ZeRO-3 the cost model adds the weight gathers
each micro-batch waits for, which can move the balance point by a fraction of a micro-batch.)

Bound. ``max_r m_r t_r`` is a lower bound on the cost model's time of such a plan, and a replica group
whose stage does not fit in its devices' memory (with one micro-batch in flight) makes it infeasible;
:func:`settings_floor` bounds all of them for one settings. The search's best-first loop generates the
candidates of a settings when its floor comes up and times each candidate whose bound is below its K-th
best plan, in bound order, so these plans do not weaken the proof of optimality. Stages of a multi-stage pipeline
on several pools are not searched (a pool serves whole stages there).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Callable, Iterator

import numpy as np

from planner import rules
from planner.runtime import get_runtime
from planner.search.bounds import OptionProfile
from planner.search.space import Pins, Settings, StageOption, tp_choices
from planner.search.tables import pool_offsets
from planner.types import Cluster, PipelineSpec, ReplicaSpec, StageSpec


@dataclass(frozen=True, order=True)
class ReplicaGroup:
    """``dp`` replicas of a ``tp``-way group on pool ``pool``, each running ``micro_batches`` micro-batches."""

    pool: int
    tp: int
    dp: int
    micro_batches: int


@dataclass(frozen=True, order=True)
class HeteroStage:
    """A single stage whose replica groups lie on different pools."""

    groups: tuple[ReplicaGroup, ...]


def hetero_allowed(settings: Settings, pins: Pins) -> bool:
    """Heterogeneous data parallelism: 1F1B, two replicas at least, no pinned pipeline; replica groups of one
    tp x 1 group each (a pinned context parallelism is left to the uniform layouts), and no expert
    parallelism (an expert-parallel group lies in one replica group's devices, planner.cost.moe); never where
    every stage must be served by one replica group (``pins.uniform``)."""
    return (not pins.uniform and settings.vpp == 1 and settings.dp >= 2 and pins.pp in (0, 1) and pins.cp in (0, 1)
            and settings.ep == 1)


def settings_floor(layer_table: Callable[[StageOption, Settings], object], cluster: Cluster, settings: Settings,
                   global_batch: int, pins: Pins, memo: dict | None = None) -> float:
    """A quick lower bound on every heterogeneous stage of these settings, from compute alone (the search
    queues it first; :func:`balanced_floor` adds memory). The groups' micro-batch counts average
    m = G / (b D) (weighted by dp), so some group runs m_r >= m of them: T >= m min_o t_o. And T >= m_r t_r
    for every group, with dp_r tp_r devices of its pool, so D m = sum_r dp_r m_r <= T sum_pools
    max_o devices / (tp_o t_o). ``layer_table(option, settings)`` gives per-layer forward_s and backward_s,
    which depend on the settings' micro-batch, recompute, sequence parallelism and dtype (``memo`` keeps the
    fastest time and the rate per those)."""
    key = (settings.micro_batch, settings.recompute, settings.sequence_parallel, settings.dtype, settings.runtime,
           settings.ep, settings.expert_tp, settings.ep_overlap)
    hit = memo.get(key) if memo is not None else None
    if hit is None:
        per_pool = []
        for pool in range(len(cluster.groups)):
            options = [StageOption(pool, tp) for tp in tp_choices(cluster, pool, pins)]
            per_pool.append([(o, _whole_model_s(layer_table(o, settings))) for o in options])
        usable = [opts for opts in per_pool if opts]
        hit = (np.inf, 0.0) if len(usable) < 2 else \
            (min(t for opts in usable for _, t in opts),
             sum(max(cluster.groups[o.pool].num_devices / (o.tp * t) for o, t in opts) for opts in usable))
        if memo is not None:
            memo[key] = hit
    fastest, rate = hit
    if not np.isfinite(fastest):
        return np.inf
    m = settings.num_micro_batches(global_batch)
    return m * max(fastest, settings.dp / rate) * (1 - 1e-9)


def _whole_model_s(table) -> float:
    """Forward + backward of the whole model for one micro-batch on one replica."""
    return float(np.sum(table.forward_s) + np.sum(table.backward_s))


def _time_and_fit(profile: OptionProfile) -> tuple[float, bool]:
    """(the whole model's time per micro-batch, whether it fits in memory with one micro-batch in flight)."""
    fits = float(profile.static_unit.sum() + profile.act_unit.sum() + profile.peak_unit.max()) <= 1.0
    return _whole_model_s(profile), fits


def balanced_floor(profile_of: Callable[[StageOption, Settings], OptionProfile], cluster: Cluster,
                   settings: Settings, global_batch: int, pins: Pins) -> float:
    """A lower bound on every heterogeneous stage of these settings, at least :func:`settings_floor`: a stage
    of options (A, B) with dp_A replicas on A needs max(m_A t_A, m_B t_B) >= D m / (dp_A / t_A + dp_B / t_B)
    (the split's micro-batches add up to D m), and the rate dp_A / t_A + (D - dp_A) / t_B is largest at an
    end of dp_A's range; inf when no pair of options fits (each replica holds the whole model)."""
    if not hetero_allowed(settings, pins):
        return np.inf
    D = settings.dp
    total = settings.num_micro_batches(global_batch) * D
    best = np.inf
    per_option: dict[StageOption, tuple[float, bool]] = {}
    for oa, ob, lo, hi in _pairs(cluster, D, pins):
        for option in (oa, ob):
            if option not in per_option:
                per_option[option] = _time_and_fit(profile_of(option, settings))
        (t_a, fa), (t_b, fb) = per_option[oa], per_option[ob]
        if not (fa and fb) or t_a <= 0 or t_b <= 0:
            continue
        rate = max(da / t_a + (D - da) / t_b for da in (lo, hi))
        best = min(best, total / rate * (1 - 1e-9))
    return best


def _pairs(cluster: Cluster, D: int, pins: Pins) -> Iterator[tuple[StageOption, StageOption, int, int]]:
    """Every (option on pool A, option on pool B), A < B, with the range lo..hi of replicas dp_A on A for
    which both pools' devices suffice for D replicas (pairs with an empty range are left out)."""
    for a, b in itertools.combinations(range(len(cluster.groups)), 2):
        for ta, tb in itertools.product(tp_choices(cluster, a, pins), tp_choices(cluster, b, pins)):
            lo = max(1, D - cluster.groups[b].num_devices // tb)
            hi = min(D - 1, cluster.groups[a].num_devices // ta)
            if lo <= hi:
                yield StageOption(a, ta), StageOption(b, tb), lo, hi


def splits(times: tuple[float, float], dps: tuple[int, int], total: int) -> list[tuple[int, int]]:
    """The feasible whole-micro-batch splits ``(m_A, m_B)`` (``dp_A m_A + dp_B m_B = total``, both >= 1)
    next to the balance point ``m_A t_A = m_B t_B``: the last one with ``m_A t_A <= m_B t_B`` and the first
    one past it (one of them minimises ``max(m_A t_A, m_B t_B)``)."""
    ta, tb = times
    feasible = all_splits(dps, total)
    if not feasible:
        return []
    below = [s for s in feasible if s[0] * ta <= s[1] * tb]
    above = [s for s in feasible if s[0] * ta > s[1] * tb]
    return ([below[-1]] if below else []) + ([above[0]] if above else [])


def all_splits(dps: tuple[int, int], total: int) -> list[tuple[int, int]]:
    """Every feasible split (for exhaustive enumeration)."""
    da, db = dps
    return [(ma, (total - da * ma) // db) for ma in range(1, (total - db) // da + 1) if (total - da * ma) % db == 0]


def stage_shapes(cluster: Cluster, settings: Settings, pins: Pins) -> Iterator[tuple[StageOption, StageOption, int]]:
    """Every (option on pool A, option on pool B, dp_A) of two pools, A < B, whose devices suffice and whose
    tp the runtime runs with the settings' ZeRO."""
    runtime = get_runtime(pins.runtime)
    for oa, ob, lo, hi in _pairs(cluster, settings.dp, pins):
        if not all(rules.tp_zero_fits(o.tp, settings.zero, runtime) for o in (oa, ob)):
            continue
        for da in range(lo, hi + 1):
            yield oa, ob, da


def candidates(profile_of: Callable[[StageOption, Settings], OptionProfile], cluster: Cluster, settings: Settings,
               global_batch: int, pins: Pins, exhaustive: bool = False) -> list[tuple[float, HeteroStage]]:
    """Every heterogeneous stage of these settings with its lower bound (inf: does not fit), bound order;
    ``profile_of`` gives an option's per-layer profile (:mod:`planner.search.bounds`). ``exhaustive``: every
    split instead of the two next to the balance point."""
    if not hetero_allowed(settings, pins):
        return []
    total = settings.num_micro_batches(global_batch) * settings.dp
    out = []
    per_option: dict[StageOption, tuple[float, bool]] = {}
    for oa, ob, da in stage_shapes(cluster, settings, pins):
        for option in (oa, ob):
            if option not in per_option:
                per_option[option] = _time_and_fit(profile_of(option, settings))
        (ta, fa), (tb, fb) = per_option[oa], per_option[ob]
        if not (fa and fb or exhaustive):
            continue  # its replicas do not fit: every split is infeasible
        dps = (da, settings.dp - da)
        for ma, mb in (all_splits(dps, total) if exhaustive else splits((ta, tb), dps, total)):
            bound = max(ma * ta, mb * tb) if fa and fb else np.inf
            out.append((bound, HeteroStage((ReplicaGroup(oa.pool, oa.tp, da, ma),
                                            ReplicaGroup(ob.pool, ob.tp, dps[1], mb)))))
    out.sort()
    return out


def hetero_spec(cluster: Cluster, global_batch: int, settings: Settings, stage: HeteroStage,
                num_layers: int) -> PipelineSpec:
    """The single-stage PipelineSpec: each group on the first ``tp dp`` devices of its pool."""
    offsets = pool_offsets(cluster)
    total = sum(g.dp * g.micro_batches for g in stage.groups)
    replicas = tuple(ReplicaSpec(devices=tuple(range(offsets[g.pool], offsets[g.pool] + g.tp * g.dp)), tp=g.tp,
                                 dp=g.dp, batch_share=g.dp * g.micro_batches / total) for g in stage.groups)
    return settings.pipeline((StageSpec(0, num_layers - 1, replicas),), global_batch)  # vpp 1: hetero_allowed
