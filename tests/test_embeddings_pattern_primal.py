"""Option choices from device patterns (planner/embeddings/pattern_primal.py): the primal LP holds the optimal plan
at its own corner (so its times are not too dear), has no solution below the certified pattern bound (so they are
not too cheap), dives to whole option counts, and shard_tables' step (7) keeps only faster plans."""

from __future__ import annotations

import dataclasses

import functools

import numpy as np
import pytest

from embedding_checks import check_plan_memory
from planner.embeddings import shard
from planner.embeddings.heuristic import Work, greedy
from planner.embeddings.pattern_bound import PatternBound, PatternBoundSettings
from planner.embeddings.pattern_primal import PrimalLP, choices, without_node_units
from test_embeddings_milp import brute_force_plan
from test_embeddings_pattern_bound import CASES, EXACT, _class_lp_s, _small, _with_a_tiny_table


def _counts(bound: PatternBound, plan) -> np.ndarray:
    """Option counts per (kind, option) row of ``plan``."""
    model = bound.model
    row_of = {key: r for r, key in enumerate(model.rows)}
    counts = np.zeros(len(model.rows))
    for k, tables in enumerate(model.problem.table_kinds):
        for t in tables:
            counts[row_of[(k, plan[t][0])]] += 1
    return counts


PROBLEMS = [_small(seed, mixed) for seed, mixed in CASES] + [_with_a_tiny_table(120)]


@functools.lru_cache(maxsize=None)
def _optimal(index: int):
    return brute_force_plan(PROBLEMS[index])


@pytest.mark.parametrize("index", range(len(PROBLEMS)))
def test_the_primal_lp_holds_the_optimal_plan_and_nothing_below_the_bound(index):
    problem = PROBLEMS[index]
    optimum, plan = _optimal(index)
    bound = PatternBound(problem, EXACT)
    certified = bound.bound_s(_class_lp_s(problem), 1.5 * optimum)
    primal = PrimalLP(bound)
    counts = _counts(bound, plan)
    corner = primal.corner(counts)
    fixed = {r: int(v) for r, v in enumerate(counts)}
    assert primal.solve(optimum * 1e6 * (1 + 1e-6), corner, fixed) is not None
    assert primal.solve(optimum * 1e6 * (1 + 1e-6), corner, {}) is not None
    assert primal.solve(certified * 1e6 * 0.99, corner, {}) is None


def test_a_dive_gives_whole_option_counts_within_the_corner():
    problem = PROBLEMS[-1]  # A100 + V100 and a tiny table
    optimum, plan = _optimal(len(PROBLEMS) - 1)
    bound = PatternBound(problem, EXACT)
    primal = PrimalLP(bound)
    corner = primal.corner(_counts(bound, plan))
    counts = primal.dive(optimum * 1e6 * 1.01, corner)
    assert counts is not None and np.array_equal(counts, np.round(counts))
    assert [sum(counts[r] for r in rows) for rows in primal.rows_of_kind] == bound.model.kinds
    assert primal.solve(optimum * 1e6 * 1.01, corner, {r: int(v) for r, v in enumerate(counts)}) is not None


def test_choices_follow_the_last_feasible_box():
    problem = _small(0)
    optimum, _ = brute_force_plan(problem)
    bound = PatternBound(problem, PatternBoundSettings(pricing_solves=2000))
    assert choices(bound) == []  # no box found feasible yet
    assert not bound.certify(1.05 * optimum * 1e6)  # above the optimum: a feasible box
    found = choices(bound)
    assert found and all(0 <= o < len(problem.options[t]) for choice in found for t, o in enumerate(choice))


def _first_option_plan(problem):
    """A plan to start steps 6-7 from: every table's first option, placed by the greedy alone."""
    state = greedy(problem, [0] * len(problem.tables), Work(np.inf))
    assert state is not None
    return state.assignment(), state.makespan()


def _deep_budget():
    """The default's stages with 2,000 pricing solves for the deep stage."""
    from planner.embeddings.budget import budget
    from planner.solver import SolverOptions

    return dataclasses.replace(budget(SolverOptions()), pricing_solves=2000)


def test_the_deep_stage_keeps_only_a_faster_plan():
    problem = _small(3)
    optimum, _ = brute_force_plan(problem)
    start, start_s = _first_option_plan(problem)
    stepped = shard.deep_stage(problem, start, start_s, _class_lp_s(problem), _deep_budget())
    assert stepped.bound_s <= optimum * (1 + 1e-9)
    if stepped.assignment is None:
        assert stepped.best_s == start_s
    else:
        assert stepped.best_s == pytest.approx(problem.makespan_s(stepped.assignment))
        assert optimum * (1 - 1e-9) <= stepped.best_s < start_s
        check_plan_memory(problem, stepped.assignment)


def test_the_deep_stage_starts_with_the_option_search_from_the_plan(monkeypatch):
    # the deep option search by kind runs first, from the plan given; what it finds is kept
    problem = _small(3)
    start, start_s = _first_option_plan(problem)
    calls = []
    original = shard.improve_choice

    def spy(problem_, assignment, *args, **kwargs):
        calls.append(assignment)
        return original(problem_, assignment, *args, **kwargs)

    monkeypatch.setattr(shard, "improve_choice", spy)
    stepped = shard.deep_stage(problem, start, start_s, _class_lp_s(problem), _deep_budget())
    assert calls and calls[0] == start
    searched = original(problem, start, _class_lp_s(problem), (), _deep_budget().deep_choice())
    assert stepped.best_s <= problem.makespan_s(searched) * (1 + 1e-9)


def test_the_deep_stage_places_each_choice_by_device_configurations_too(monkeypatch):
    # without the heuristics' placements, the deep stage still finds a faster plan: the exact placement of a choice by
    # device configurations (patterns.pattern_place), which it tries below the best plan so far
    problem = _small(3)
    optimum, _ = brute_force_plan(problem)
    placed = []
    original = shard.pattern_place

    def spy(*args, **kwargs):
        plan = original(*args, **kwargs)
        placed.append(plan)
        return plan

    start, start_s = _first_option_plan(problem)
    monkeypatch.setattr(shard, "_place_heuristically", lambda *args: None)
    monkeypatch.setattr(shard, "improve_choice", lambda problem_, assignment, *args: assignment)
    monkeypatch.setattr(shard, "pattern_place", spy)
    stepped = shard.deep_stage(problem, start, start_s, _class_lp_s(problem), _deep_budget())
    assert placed and stepped.assignment is not None and stepped.assignment in placed
    assert stepped.best_s == pytest.approx(problem.makespan_s(stepped.assignment))
    assert optimum * (1 - 1e-9) <= stepped.best_s < start_s
    check_plan_memory(problem, stepped.assignment)


def test_variants_without_node_units_move_only_a_kinds_node_wide_tables():
    problem = _small(0, mixed=False)  # two A100 nodes: table-row-wise is an option
    node_option = {t: next(o for o, option in enumerate(problem.options[t]) if option.scope == "node")
                   for t in range(len(problem.tables))}
    choice = [node_option[0]] + [0] * (len(problem.tables) - 1)
    variants = without_node_units(problem, choice)
    shardings = sorted(problem.options[0][v[0]].sharding for v in variants)
    assert shardings == ["data_parallel", "table_wise"]
    assert all(v[1:] == choice[1:] and not problem.options[0][v[0]].host for v in variants)
    device_wide = [next(o for o, option in enumerate(problem.options[t]) if option.scope == "device")
                   for t in range(len(problem.tables))]
    assert without_node_units(problem, device_wide) == []
