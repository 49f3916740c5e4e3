"""The bound from device patterns (planner/embeddings/pattern_bound.py): never above the true optimum (brute
force), tighter than the class LP where devices' all-to-all excess matters, and where every device carries the
global (data-parallel, row-wise) tables; a deliberately wrong device time, global units' time or aggregate row
breaks it; deterministic; and shard_tables' deep stage uses it only with work past budget.STAGE_WORK_CAP."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from embedding_fixtures import cluster, node, small_node, small_problem
from planner.embeddings import budget as budget_module
from planner.embeddings import pattern_bound, shard
from planner.embeddings.devices import device_arrays
from planner.embeddings.milp import class_bins, solve
from planner.embeddings.pattern_bound import PatternBound, PatternBoundSettings
from planner.embeddings.problem import build_problem
from planner.types import EmbeddingTable
from test_embeddings_milp import brute_force

A100 = node("dgx-a100-80gb")
V100 = node("hgx-v100-32gb")
EXACT = PatternBoundSettings(pricing_solves=100_000, step=0.002)


def _small(seed: int, mixed: bool = True):
    """2 nodes x 2 devices (A100 + V100, or two A100 nodes), 3 tables: every option, brute force in < 1 s."""
    return small_problem(seed, 3, second="hgx-v100-32gb" if mixed else "dgx-a100-80gb")


def _class_lp_s(problem) -> float:
    return solve(problem, class_bins(problem), integer=False).bound_s


CASES = [(0, True), (2, True), (3, True), (0, False), (3, False)]


@pytest.mark.parametrize("seed,mixed", CASES)
def test_pattern_bound_is_at_most_the_optimum_and_at_least_the_class_lp(seed, mixed):
    problem = _small(seed, mixed)
    optimum = brute_force(problem)
    lp = _class_lp_s(problem)
    bound = PatternBound(problem, EXACT).bound_s(lp, 1.5 * optimum)
    assert lp <= bound <= optimum * (1 + 1e-9)


def test_pattern_bound_is_tighter_than_the_class_lp():
    # seed 0 on A100 + V100: class LP 58.67 us, patterns 59.72 us, optimum 59.81 us (measured)
    problem = _small(0)
    lp = _class_lp_s(problem)
    bound = PatternBound(problem, EXACT).bound_s(lp, 1.5 * brute_force(problem))
    assert bound > lp * 1.01


def test_a_wrong_device_time_breaks_the_bound(monkeypatch):
    # all-to-all 30% dearer than the cost model: the bound must then exceed a true optimum somewhere, or the
    # brute-force test above could not catch a wrong term
    classes = pattern_bound._Model._classes

    def dearer(model):
        return [dataclasses.replace(c, s_per_mb=1.3 * c.s_per_mb) for c in classes(model)]

    monkeypatch.setattr(pattern_bound._Model, "_classes", dearer)
    assert _cases_above_the_optimum() > 0


def _cases_above_the_optimum() -> int:
    """How many of CASES get a bound above their brute-force optimum."""
    broken = 0
    for seed, mixed in CASES:
        problem = _small(seed, mixed)
        optimum = brute_force(problem)
        broken += PatternBound(problem, EXACT).bound_s(_class_lp_s(problem), 1.5 * optimum) > optimum * (1 + 1e-9)
    return broken


def _with_a_tiny_table(seed: int):
    """2 nodes x 2 devices (A100 + V100), two seeded tables and a tiny one (8-196 rows) that data-parallel suits."""
    rng = np.random.default_rng(seed)
    tables = [EmbeddingTable(f"t{i}", 4 * int(rng.integers(10, 500_000)), int(rng.choice([8, 16])),
                             float(rng.choice([1, 4, 20, 80]))) for i in range(2)]
    tables.append(EmbeddingTable("tiny", 4 * int(rng.integers(2, 50)), 16, float(rng.choice([20, 80]))))
    c = cluster((small_node(A100, 2), 1), (small_node(V100, 2), 1))
    return build_problem(tuple(tables), device_arrays(c), 4096, "adagrad")


def test_global_units_time_30_percent_dearer_breaks_the_bound(monkeypatch):
    # every device carries the global units' time (pattern_bound._shared_us); seed 107 is an instance where a
    # 30% dearer one exceeds the optimum (measured: by 4.5%); the true one stays below it
    problem = _with_a_tiny_table(107)
    optimum = brute_force(problem)
    lp = _class_lp_s(problem)
    assert PatternBound(problem, EXACT).bound_s(lp, 1.5 * optimum) <= optimum * (1 + 1e-9)
    shared = PatternBound._shared_us
    monkeypatch.setattr(PatternBound, "_shared_us", lambda self, box: 1.3 * shared(self, box))
    assert PatternBound(problem, EXACT).bound_s(lp, 1.5 * optimum) > optimum * (1 + 1e-9)


def test_aggregate_rows_30_percent_dearer_break_the_bound(monkeypatch):
    aggregate = PatternBound._aggregate
    monkeypatch.setattr(PatternBound, "_aggregate", lambda self: [1.3 * row for row in aggregate(self)])
    assert _cases_above_the_optimum() > 0


def test_class_rows_30_percent_dearer_break_the_bound(monkeypatch):
    rows, coefficients = PatternBound._class_rows, PatternBound._class_coefficients
    monkeypatch.setattr(PatternBound, "_class_rows", lambda self: [1.3 * row for row in rows(self)])
    monkeypatch.setattr(PatternBound, "_class_coefficients",
                        staticmethod(lambda c, pattern: [1.3 * v for v in coefficients(c, pattern)]))
    assert _cases_above_the_optimum() > 0


@pytest.mark.parametrize("seed,least_s", [(120, 104e-6), (103, 103.3e-6)])
def test_each_class_pays_its_own_global_units(seed, least_s):
    # A100 + V100 and a tiny table. Seed 120: with the G floor on the V100s the least ratio of a global unit's time
    # there to the A100s' (one G side, as before) 99.12 us; with a G side per class 105.27 us; optimum 105.30 us.
    # Seed 103: the class rows (each class's exact global units' time and traffic, on average) lift 103.23 us to
    # the optimum, 103.42 us (measured)
    problem = _with_a_tiny_table(seed)
    optimum = brute_force(problem)
    bound = PatternBound(problem, EXACT).bound_s(_class_lp_s(problem), 1.5 * optimum)
    assert least_s <= bound <= optimum * (1 + 1e-9)


def _eight_devices():
    """two 4-A100 nodes, 8 seeded tables; shard_tables proves its plan optimal there (372.86 us, exact MILP)."""
    rng = np.random.default_rng(4)
    tables = tuple(EmbeddingTable(f"t{i}", 4 * int(rng.integers(10, 2_000_000)), int(rng.choice([16, 32, 64])),
                                  float(rng.choice([1, 4, 20, 80]))) for i in range(8))
    return build_problem(tables, device_arrays(cluster((small_node(A100, 4), 2))), 8192, "adagrad")


OPTIMUM_8 = 372.86e-6


def test_every_device_pays_the_global_units():
    # counting the global units per class, as before, stalled at 364.32 us (1,000 solves); with every device
    # paying them, 368.64 us within 300 solves; 372.24 us with the class rows and the neighbours columns (measured)
    bound = PatternBound(_eight_devices(), PatternBoundSettings(pricing_solves=300, step=0.002)).bound_s(
        360e-6, OPTIMUM_8)
    assert 366e-6 <= bound <= OPTIMUM_8 * (1 + 1e-9)


@pytest.mark.parametrize("goal_s,solves,least_s", [(370e-6, 600, 370e-6), (380e-6, 300, 365e-6)])
def test_a_goal_is_tried_first_with_at_most_two_thirds_of_the_work(goal_s, solves, least_s):
    # 370 us is below the optimum and certified first, then the steps go on from it (372.22 us, measured);
    # 380 us is above it: its pass fails within two thirds of the solves and the steps from 360 us get the rest
    # (372.24 us, measured; 360 us if the failed pass took all)
    settings = PatternBoundSettings(pricing_solves=solves, step=0.002)
    bound = PatternBound(_eight_devices(), settings).bound_s(360e-6, 1.1 * OPTIMUM_8, goal_s=goal_s)
    assert least_s <= bound <= OPTIMUM_8 * (1 + 1e-9)


def test_pattern_bound_is_deterministic_and_valid_wherever_its_work_runs_out():
    problem = _small(0)
    lp = _class_lp_s(problem)
    optimum = brute_force(problem)
    short = PatternBoundSettings(pricing_solves=3, step=0.002)
    first = PatternBound(problem, short).bound_s(lp, 1.5 * optimum)
    assert PatternBound(problem, short).bound_s(lp, 1.5 * optimum) == first
    assert lp <= first <= PatternBound(problem, EXACT).bound_s(lp, 1.5 * optimum) <= optimum * (1 + 1e-9)


def test_shard_tables_uses_the_pattern_bound_only_past_its_free_budget(monkeypatch):
    # two 4-A100 nodes, 5 tables; the node and exact MILPs off so that a gap is left (seed 0: 8.8% without the
    # pattern bound, measured)
    rng = np.random.default_rng(0)
    tables = tuple(EmbeddingTable(f"t{i}", 4 * int(rng.integers(10, 500_000)), int(rng.choice([8, 16])),
                                  float(rng.choice([1, 4, 20, 80]))) for i in range(5))
    c = cluster((small_node(A100, 4), 2))
    goals = []
    real = PatternBound.goal

    def spy(self, goal_s):
        goals.append((self.settings.pricing_solves, goal_s))
        return real(self, goal_s)

    monkeypatch.setattr(PatternBound, "goal", spy)
    monkeypatch.setattr(budget_module, "EXACT_SHARE", 0.0)
    for name, value in (("NODE_MILP_MAX_NODES", 0), ("NEIGHBOURHOOD_MAX_DEVICES", 0)):
        monkeypatch.setattr(shard, name, value)
    plain = shard.shard_tables(tables, c, None, 4096)
    assert goals == [] and plain.gap > 0.03
    real_budget = shard.budget
    monkeypatch.setattr(shard, "budget", lambda options, stage_work=None: dataclasses.replace(
        real_budget(options, stage_work), pricing_solves=100))  # the deep stage at the default's stages
    with_patterns = shard.shard_tables(tables, c, None, 4096)
    # the first goal is the plan within 3%: what step (6) is there to prove
    assert goals[0] == (100, pytest.approx(plain.embedding_time_s / 1.03))
    assert with_patterns.embedding_time_s <= plain.embedding_time_s
    assert plain.lower_bound_s * 1.005 <= with_patterns.lower_bound_s <= with_patterns.embedding_time_s


def _one_unit_away(pricing, counts, value, latency_value, device_dual, target_us, ids_floor_mb, pooled_floor_mb):
    """Brute force: every pattern one unit away from ``counts`` with positive reduced cost, and what excludes
    the others (time, and within it a fused collective's latency or the IS, PR floors; memory), each recomputed
    from the class's units and pattern_bound.Pattern."""
    c = pricing.c
    fits, reasons = {}, set()
    for drop in [-1] + [i for i, k in enumerate(counts) if k]:
        for add, unit in enumerate(c.units):
            m = list(counts)
            if drop >= 0:
                m[drop] -= 1
            m[add] += 1
            if add == drop or value[add] <= 1e-12 or m[add] > unit.upper:
                continue
            pattern = pattern_bound.Pattern.of(0, c, tuple(m))
            time_us = pattern.time_us(c, ids_floor_mb, pooled_floor_mb)
            hbm = sum(k * u.hbm_gb for k, u in zip(m, c.units))
            host = sum(k * u.host_gb for k, u in zip(m, c.units))
            paid = {u.latency for k, u in zip(m, c.units) if k and u.latency >= 0}
            reduced = float(np.dot(value, m)) + sum(latency_value[j] for j in paid) + device_dual
            if reduced <= 1e-9:
                continue
            if time_us > target_us * (1 + 1e-12):
                reasons.add("time")
                if time_us - pattern.latency_us <= target_us:
                    reasons.add("latency")
                if pattern.time_us(c, 0.0, 0.0) <= target_us:
                    reasons.add("floor")
            elif hbm > c.hbm_gb * (1 + 1e-12) or host > c.host_gb * (1 + 1e-12):
                reasons.add("memory")
            else:
                fits[tuple(m)] = reduced
    return fits, reasons


def test_neighbours_are_exactly_the_fitting_patterns_one_unit_away():
    # the columns PatternBound._columns adds besides the pricing's own: each must fit time (latency of the fused
    # collectives and the IS, PR floors included) and memory, and have a positive reduced cost (with a value per
    # fused collective paid, or none); checked against brute force on seeded duals, on a class whose memory is
    # cut so that memory, not only time, excludes some
    c = PatternBound(_eight_devices()).model.classes[0]
    reasons = set()
    for seed in range(4):
        rng = np.random.default_rng(seed)
        value = rng.uniform(0.0, 1.0, len(c.units)) * (rng.uniform(size=len(c.units)) < 0.7)
        target_us = c.base_us + rng.uniform(300.0, 1500.0)
        counts, _ = pattern_bound._Pricing(c, 2000).best(value, np.zeros(len(c.latency_us)), target_us, 0.0, 0.0)
        pattern = pattern_bound.Pattern.of(0, c, counts)
        floors = (pattern.ids_mb * 0.9, pattern.pooled_mb * 0.9)  # some neighbours send or receive less
        hbm = sum(k * u.hbm_gb for k, u in zip(counts, c.units))
        alone = tuple(0 if u.latency >= 0 else k for k, u in zip(counts, c.units))  # a neighbour adds latency
        for start in (counts, tuple(max(k - 1, 0) for k in counts), alone):
            pricing = pattern_bound._Pricing(dataclasses.replace(c, hbm_gb=hbm + 0.8), 2000)
            device_dual = -0.9 * float(np.dot(value, start))
            tight_us = pattern_bound.Pattern.of(0, c, start).time_us(c, *floors) + 8.0  # < one latency (11.4 us)
            for latency_value in (np.zeros(len(c.latency_us)), np.full(len(c.latency_us), -0.6)):
                fits, why = _one_unit_away(pricing, start, value, latency_value, device_dual, tight_us, *floors)
                reasons |= why
                found = pricing.neighbours(start, value, device_dual, tight_us, *floors, 10_000, latency_value)
                assert set(found) == set(fits) and len(found) == len(fits)
                best = pricing.neighbours(start, value, device_dual, tight_us, *floors, 3, latency_value)
                assert [fits[p] for p in best] == sorted(fits.values(), reverse=True)[:3]
    assert reasons == {"time", "latency", "floor", "memory"}


def test_neighbours_certify_a_target_with_fewer_pricing_solves():
    # 370 us on two 4-A100 nodes: 37 pricing solves with the neighbours, 69 without (measured)
    def solves(**settings) -> int:
        bound = PatternBound(_eight_devices(), PatternBoundSettings(pricing_solves=1000, **settings))
        assert bound.certify(370.0)
        return 1000 - bound.pricing_left

    assert solves() < 0.7 * solves(neighbours=0, used_patterns=0)
