"""Placement by device configurations and the option search by table kind (planner/embeddings/patterns.py):
exact against brute force at a fixed option choice, never worse, within memory, deterministic."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from embedding_checks import check_plan_memory
from embedding_fixtures import GiB, cluster, node, small_node, small_problem
from planner.embeddings.devices import device_arrays
from planner.embeddings import patterns
from planner.embeddings.patterns import ChoiceSettings, PatternSettings, improve_choice, pattern_place
from planner.embeddings.problem import Problem, build_problem
from planner.types import EmbeddingTable
from planner.solver import SolverOptions
from test_embeddings_milp import brute_force
from test_embeddings_neighbourhood import _greedy_start

A100 = node("dgx-a100-80gb")
V100 = node("hgx-v100-32gb")
EXACT = PatternSettings(configurations=10 ** 6, checks=10 ** 5, steps=100, min_gain=0.0)


def _slowest(problem, assignment) -> float:
    return float(problem.device_time_s(problem.evaluate(assignment)).max())


def _brute_force_at(problem, choice) -> float:
    """The best makespan over every placement of the units of the options in ``choice``."""
    return brute_force(Problem(problem.tables, problem.dev, problem.global_batch, problem.optimizer,
                               tuple((problem.options[t][o],) for t, o in enumerate(choice))))


def _small(seed: int, count: int, memory_bytes: int | None = None):
    """An A100 node and a V100 node of 2 devices each: two node classes (the configuration model takes a
    node-wide unit's largest per-device load; the rows are multiples of 4, so row splits are even)."""
    return small_problem(seed, count, memory_bytes)


@pytest.mark.parametrize("seed", range(6))
def test_configuration_placement_reaches_the_brute_force_optimum_at_a_fixed_choice(seed, monkeypatch):
    # the model's own time of the plan (the least target its MILP met) must be the plan's evaluated time: a
    # wrong term in the configuration times shows there even where the placement happens to be right
    problem = _small(seed, 4)
    rng = np.random.default_rng(100 + seed)
    choice = [int(rng.integers(len(options))) for options in problem.options]
    best = _brute_force_at(problem, choice)
    assert np.isfinite(best)
    met = []
    feasible = patterns._Model.feasible

    def spy(model, enumerated, limit_s, checks, work):
        solution = feasible(model, enumerated, limit_s, checks, work)
        if solution is not None:
            met.append(limit_s)
        return solution

    monkeypatch.setattr(patterns._Model, "feasible", spy)
    plan = pattern_place(problem, choice, 0.0, best * 1.05, EXACT)
    assert plan is not None
    assert [o for o, _ in plan] == choice
    check_plan_memory(problem, plan)
    assert _slowest(problem, plan) == pytest.approx(best, rel=1e-9)
    assert min(met) == pytest.approx(best, rel=1e-9)
    # nothing beats the optimum: asked for a plan below it, the placement says there is none
    assert pattern_place(problem, choice, 0.0, best, EXACT) is None


def test_configuration_placement_keeps_memory_where_it_binds():
    # 4 tables of 3 M rows x 64 (1.5 GB each with Adagrad state) on devices of 2 GB: one unit per device at
    # most, so every table-wise table needs its own device
    c = cluster((small_node(A100, 2, 2 * GiB), 1), (small_node(V100, 2, 2 * GiB), 1))
    tables = tuple(EmbeddingTable(f"t{i}", 3_000_000, 64, 10.0) for i in range(4))
    problem = build_problem(tables, device_arrays(c), 4096, "adagrad")
    table_wise = [next(o for o, option in enumerate(options) if option.sharding == "table_wise" and not option.host)
                  for options in problem.options]
    plan = pattern_place(problem, table_wise, 0.0, 1.0, EXACT)
    assert plan is not None
    loads = problem.evaluate(plan)
    assert problem.fits(loads)
    assert sorted(p for _, positions in plan for p in positions) == [0, 1, 2, 3]
    assert _slowest(problem, plan) == pytest.approx(_brute_force_at(problem, table_wise), rel=1e-9)


@pytest.mark.parametrize("seed", range(3))
def test_enumeration_lists_exactly_the_configurations_within_time_and_memory(seed):
    # every multiset of device units (at most the count of each kind) on top of every node pattern, checked by
    # evaluating a plan that holds just those units on one device: listed iff that device fits in memory and
    # is within the limit
    rng = np.random.default_rng(400 + seed)
    c = cluster((small_node(A100, 2, GiB // 8), 1), (small_node(V100, 2, GiB // 8), 1))
    tables = tuple(EmbeddingTable(f"t{i}", 4 * int(rng.integers(10_000, 200_000)), int(rng.choice([8, 16])),
                                  float(rng.choice([1, 4, 20, 80]))) for i in range(4))
    problem = build_problem(tables, device_arrays(c), 4096, "adagrad")
    device_table_wise = [next(o for o, option in enumerate(options) if option.sharding == "table_wise"
                              and not option.host) for options in problem.options]
    model = patterns._Model.build(problem, device_table_wise)
    limit = 1.2 * max(problem.unit_alone_s(t, o) for t, o in enumerate(device_table_wise))
    enumerated = model.enumerate(limit, 10 ** 6)
    for g, per_class in enumerate(enumerated):
        device = problem.dev.nodes[model.classes[g].rep][0]
        (pattern, configs, times), = per_class  # no node-wide units: one (empty) pattern
        listed = {}
        for c, time in enumerate(times):
            combo = [0] * len(model.device_kinds)
            for kind, n in configs.units(c):
                combo[kind] = n
            listed[tuple(combo)] = time
        # depth first, kinds ascending (the order of the MILP's columns): each configuration's units by kind,
        # a kind once per unit, come in lexicographic order
        sequences = [tuple(kind for kind, n in configs.units(c) for _ in range(n)) for c in range(len(times))]
        assert sequences == sorted(sequences)
        for combo in itertools.product(*(range(len(units) + 1) for units in model.device_kinds)):
            units = [unit for kind, n in enumerate(combo) for unit in model.device_kinds[kind][:n]]
            loads = _device_only(problem, device_table_wise, units, device)
            inside = loads[0] <= limit and loads[1]
            assert (combo in listed) == inside
            if inside:
                assert listed[combo] == pytest.approx(loads[0], rel=1e-12)


def _device_only(problem, choice, units, device):
    """(time, fits) of ``device`` holding just ``units`` (the other tables' units parked on another device),
    with every table's all-to-all traffic."""
    other = next(i for i in range(problem.dev.count) if i != device)
    placed = {t: [] for t in range(len(problem.tables))}
    for t, _ in units:
        placed[t].append(device)
    assignment = tuple((o, tuple(placed[t]) + (other,) * (problem.options[t][o].units - len(placed[t])))
                       for t, o in enumerate(choice))
    loads = problem.evaluate(assignment)
    fits = bool(loads.hbm_bytes[device] <= problem.dev.hbm_capacity_bytes[device] * (1 + 1e-12))
    return float(problem.device_time_s(loads)[device]), fits


def _kinds(seed: int, memory_bytes: int | None = None):
    """4 nodes x 2 devices (two A100 nodes, two V100 nodes), 3 kinds of tables with 3 copies each."""
    rng = np.random.default_rng(seed)
    c = cluster((small_node(A100, 2, memory_bytes), 2), (small_node(V100, 2, memory_bytes), 2))
    shapes = [(4 * int(rng.integers(1_000, 500_000)), int(rng.choice([16, 32, 64])), float(rng.choice([1, 5, 30])))
              for _ in range(3)]
    tables = tuple(EmbeddingTable(f"t{k}_{i}", *shape) for k, shape in enumerate(shapes) for i in range(3))
    return build_problem(tables, device_arrays(c), 16384, "adagrad")


@pytest.mark.parametrize("seed", range(4))
def test_option_search_never_returns_a_worse_plan_fits_memory_and_is_deterministic(seed):
    problem = _kinds(seed, memory_bytes=2 * GiB)
    start = _greedy_start(problem, seed)
    assert start is not None
    plan = improve_choice(problem, start, 0.0, settings=ChoiceSettings(work=200_000))
    loads = problem.evaluate(plan)
    assert problem.fits(loads)
    assert _slowest(problem, plan) <= _slowest(problem, start) * (1 + 1e-12)
    assert improve_choice(_kinds(seed, memory_bytes=2 * GiB), start, 0.0,
                          settings=ChoiceSettings(work=200_000)) == plan


@pytest.mark.parametrize("seed", range(3))
def test_option_search_reaches_the_brute_force_optimum_of_one_kind(seed):
    # three tables of one kind on 2 nodes x 2 devices, started from every table row-wise: moving 1, half or
    # all of a kind's tables to another option, each placed exactly, reaches the optimum over every option
    # and placement
    rng = np.random.default_rng(300 + seed)
    c = cluster((small_node(A100, 2), 1), (small_node(V100, 2), 1))
    shape = (4 * int(rng.integers(10, 500_000)), 8, float(rng.choice([4, 20, 80])))
    tables = tuple(EmbeddingTable(f"t{i}", *shape) for i in range(3))
    problem = build_problem(tables, device_arrays(c), 4096, "adagrad")
    row_wise = next(o for o, option in enumerate(problem.options[0]) if option.sharding == "row_wise"
                    and not option.host)
    start = tuple((row_wise, (0,)) for _ in tables)
    plan = improve_choice(problem, start, 0.0, settings=ChoiceSettings(work=10 ** 7, pattern=EXACT))
    check_plan_memory(problem, plan)
    assert _slowest(problem, plan) == pytest.approx(brute_force(problem), rel=1e-6)


@pytest.mark.parametrize("seed, work", [(4, 250_000)])
def test_iterated_local_search_goes_past_where_the_descent_stops(seed, work):
    # on this instance (measured; seed 8 with 400,000 too) the first descent stops at a choice that no single
    # change improves; the seeded random changes and descents from them (the work is left for them) find a
    # lower plan, which is within memory and deterministic
    problem = _kinds(seed, memory_bytes=2 * GiB)
    start = _greedy_start(problem, seed)
    descent = improve_choice(problem, start, 0.0, settings=ChoiceSettings(work=work, kicks=0))
    plan = improve_choice(problem, start, 0.0, settings=ChoiceSettings(work=work))
    check_plan_memory(problem, plan)
    assert _slowest(problem, plan) < _slowest(problem, descent) * (1 - 1e-3)
    assert improve_choice(problem, start, 0.0, settings=ChoiceSettings(work=work)) == plan


def test_pattern_place_hands_a_choice_with_too_many_configurations_to_its_fallback():
    problem = _kinds(0)
    start = _greedy_start(problem, 0)
    choice = [o for o, _ in start]
    few = PatternSettings(configurations=1)  # every choice has more
    seen = []

    def fallback(trial, upper_s, work):
        seen.append((list(trial), upper_s))
        return start

    assert pattern_place(problem, choice, 0.0, 1.0, few) is None
    assert pattern_place(problem, choice, 0.0, 1.0, few, fallback=fallback) is start
    assert seen == [(choice, 1.0)]
    assert pattern_place(problem, choice, 0.0, 1.0, EXACT, fallback=fallback) is not None
    assert len(seen) == 1  # enumerable: placed by configurations, the fallback not asked


@pytest.mark.parametrize("seed", range(3))
def test_option_search_judges_by_the_greedy_where_configurations_are_too_many(seed, monkeypatch):
    # with every trial choice over the configuration limit, the changes are judged by the greedy placement and
    # a short local search: the plan is within memory, deterministic, and well below the greedy start (by 48-92%
    # on these seeds; without the fallback every trial is skipped and the start comes back)
    problem = _kinds(seed, memory_bytes=2 * GiB)
    start = _greedy_start(problem, seed)
    settings = ChoiceSettings(work=50_000, pattern=PatternSettings(configurations=1))
    calls = []
    greedy = patterns.greedy

    def spy(*args, **kwargs):
        calls.append(1)
        return greedy(*args, **kwargs)

    monkeypatch.setattr(patterns, "greedy", spy)
    plan = improve_choice(problem, start, 0.0, settings=settings)
    assert calls
    check_plan_memory(problem, plan)
    assert _slowest(problem, plan) < _slowest(problem, start) * 0.9
    assert improve_choice(problem, start, 0.0, settings=settings) == plan


def test_shard_tables_with_the_option_search_fits_memory_is_deterministic_and_no_worse(monkeypatch):
    # 36 devices (5 A100 nodes and 4 V100 nodes of 4), 4 kinds of tables: past 32 devices and more than 3% above
    # the bound after ruin-and-recreate, so the option search by kind runs (and here lowers the slowest device)
    from embedding_checks import check_result
    from planner.embeddings import shard as shard_module
    from planner.embeddings import shard_tables

    rng = np.random.default_rng(2)
    c = cluster((small_node(A100, 4), 5), (small_node(V100, 4), 4))
    shapes = [(int(rng.integers(1000, 4_000_000)), int(rng.choice([32, 64, 128])),
               float(rng.choice([5, 20, 60, 200]))) for _ in range(4)]
    tables = tuple(EmbeddingTable(f"t{k}_{i}", *shape) for k, shape in enumerate(shapes)
                   for i in range(int(rng.integers(3, 9))))
    calls = []

    def spy(problem, assignment, lower_s, starts, settings):
        out = improve_choice(problem, assignment, lower_s, starts, settings)
        calls.append((_slowest(problem, assignment), _slowest(problem, out)))
        return out

    monkeypatch.setattr(shard_module, "improve_choice", spy)
    result = shard_tables(tables, c, None, 16384, options=SolverOptions(work=0.1))
    check_result(result, tables, c)  # every device's memory recomputed from rows x dim x bytes x optimizer
    assert len(calls) == 1 and calls[0][1] < calls[0][0] * (1 - 1e-6)
    assert result.embedding_time_s == pytest.approx(calls[0][1], rel=1e-12)
    again = shard_tables(tables, c, None, 16384, options=SolverOptions(work=0.1))
    assert again.placements == result.placements and again.embedding_time_s == result.embedding_time_s
    monkeypatch.setattr(shard_module, "improve_choice", lambda problem, assignment, *args: assignment)
    without = shard_tables(tables, c, None, 16384, options=SolverOptions(work=0.1))
    assert result.embedding_time_s < without.embedding_time_s


@pytest.mark.parametrize("seed", range(3))
def test_the_count_that_skips_a_walk_never_exceeds_what_the_walk_lists(seed, monkeypatch):
    """The walk of device configurations is skipped when a count of the configurations it surely lists (every
    kind that fits alone, every pair that fits for sure) passes its budget. The count never exceeds what the
    walk lists, and with it enumeration gives up at exactly the budgets it gave up at without it."""
    problem = _kinds(seed, memory_bytes=GiB)
    choice = [next(o for o, option in enumerate(options) if option.sharding == "table_wise" and not option.host)
              for options in problem.options]
    model = patterns._Model.build(problem, choice)
    slowest = max(problem.unit_alone_s(t, o) for t, o in enumerate(choice))
    original = patterns._surely_listed
    calls, counted = [], []

    def recorded(*args):
        calls.append(args)
        return 0

    def spied(*args):
        counted.append(original(*args))
        return counted[-1]

    for limit in (0.9 * slowest, 1.5 * slowest, 3.0 * slowest, np.inf):
        calls.clear()
        with monkeypatch.context() as m:
            m.setattr(patterns, "_surely_listed", recorded)
            full = model.enumerate(limit, 10 ** 6)
        listed = [len(times) for per_class in full for _, _, times in per_class]
        assert len(calls) == len(listed)  # one walk of device configurations per (node class, node pattern)
        for args, count in zip(calls, listed):
            assert 1 + original(*args) <= count
        total = sum(listed)
        for budget in sorted({1, total // 3, total // 2, total - 1, total, total + 1} - {0}):
            with monkeypatch.context() as m:
                m.setattr(patterns, "_surely_listed", lambda *args: 0)
                without = model.enumerate(limit, budget)
            with monkeypatch.context() as m:
                m.setattr(patterns, "_surely_listed", spied)
                counted.clear()
                with_count = model.enumerate(limit, budget)
            assert (with_count is None) == (without is None) == (total > budget)
            if budget == 1 and total > 2:
                assert 1 + counted[0] > budget  # the first walk is skipped, not walked to its budget
