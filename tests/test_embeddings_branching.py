"""Branching on the class LP's option choices (branching.py): below brute force, equal to the least LP over every
whole choice when it runs to its end, above the LP where the LP splits a table, no plan changes, and children
solved from their parents' bases."""

from __future__ import annotations

import dataclasses
import itertools

import highspy
import numpy as np
import pytest

from embedding_fixtures import cluster, node, small_node
from planner.embeddings import branching as branching_module
from planner.embeddings import budget as budget_module
from planner.embeddings import shard_tables
from planner.embeddings.branching import branch_bound
from planner.embeddings.devices import device_arrays
from planner.embeddings.highs import US_PER_S
from planner.embeddings.milp import class_bins, copy_relaxation, solve
from planner.embeddings.problem import build_problem
from planner.solver import SolverOptions
from planner.types import EmbeddingTable
from test_embeddings_milp import brute_force

A100 = node("dgx-a100-80gb")
V100 = node("hgx-v100-32gb")
UNLIMITED = 1e12


def hot_tables(seed: int) -> tuple[EmbeddingTable, ...]:
    """A hot table (a table-wise or column shard of it receives more ids than every device sends) beside two
    plain ones: the class LP likes to split the hot one between options."""
    rng = np.random.default_rng(500 + seed)
    hot = EmbeddingTable("hot", int(rng.integers(1000, 2_000_000)), 16, float(rng.choice([60, 100, 200])))
    return (hot,) + tuple(EmbeddingTable(f"t{i}", int(rng.integers(1000, 2_000_000)), int(rng.choice([8, 16])),
                                         float(rng.choice([1, 4]))) for i in range(2))


def mixed_problem(seed: int):
    c = cluster((small_node(A100, 2), 1), (small_node(V100, 2), 1))
    return c, build_problem(hot_tables(seed), device_arrays(c), 8192, "adagrad")


def least_lp_over_whole_choices(problem, relaxed) -> float:
    """The least class-LP value over every option per table, each solved with the choices fixed."""
    best = np.inf
    for choice in itertools.product(*(range(len(options)) for options in problem.options)):
        lp = copy_relaxation(relaxed)
        for t, options in enumerate(problem.options):
            for o in range(len(options)):
                value = 1.0 if o == choice[t] else 0.0
                lp.highs.changeColBounds(lp.choice[t, o], value, value)
        lp.highs.run()
        if lp.highs.getModelStatus() == highspy.HighsModelStatus.kOptimal:
            best = min(best, lp.highs.getInfo().objective_function_value / US_PER_S)
    return best


@pytest.mark.parametrize("seed", range(4))
def test_branching_to_its_end_is_the_least_lp_over_whole_choices_and_below_brute_force(seed):
    _, problem = mixed_problem(seed)
    best = brute_force(problem)
    relaxed = solve(problem, class_bins(problem), integer=False, keep=True)
    bound = branch_bound(problem, copy_relaxation(relaxed), relaxed.bound_s, 10 * best, UNLIMITED)
    assert relaxed.bound_s * (1 - 1e-9) <= bound <= best * (1 + 1e-7)
    assert bound == pytest.approx(least_lp_over_whole_choices(problem, relaxed), rel=1e-6)


def test_branching_lifts_the_lp_where_it_splits_a_table():
    lifted = []
    for seed in range(4):
        _, problem = mixed_problem(seed)
        relaxed = solve(problem, class_bins(problem), integer=False, keep=True)
        split = any(0 < w < 1 - 1e-6 for row in relaxed.weights for w in row)
        bound = branch_bound(problem, copy_relaxation(relaxed), relaxed.bound_s, np.inf, UNLIMITED)
        lifted.append(split and bound > relaxed.bound_s * (1 + 1e-4))
    assert all(lifted)


def test_a_node_at_the_cutoff_is_dropped_and_no_work_keeps_the_known_bound():
    _, problem = mixed_problem(0)
    relaxed = solve(problem, class_bins(problem), integer=False, keep=True)
    at_lp = relaxed.bound_s * (1 + 1e-9)
    assert branch_bound(problem, copy_relaxation(relaxed), relaxed.bound_s, at_lp, UNLIMITED) == at_lp
    assert branch_bound(problem, copy_relaxation(relaxed), relaxed.bound_s, np.inf, 0.0) == relaxed.bound_s


@pytest.mark.parametrize("seed", range(2))
def test_branching_changes_the_bound_only(seed, monkeypatch):
    c, problem = mixed_problem(seed)
    tables = hot_tables(seed)
    result = shard_tables(tables, c, None, 8192, options=SolverOptions(work=0.3))
    monkeypatch.setattr(budget_module, "BRANCH_SHARE", 0.0)
    without = shard_tables(tables, c, None, 8192, options=SolverOptions(work=0.3))
    assert result.placements == without.placements
    assert result.embedding_time_s == without.embedding_time_s
    assert without.lower_bound_s <= result.lower_bound_s <= brute_force(problem) * (1 + 1e-7)


class _Spent:
    """A stand-in for heuristic.Work that records what the branching spends."""

    total = 0.0

    def __init__(self, evaluations: float) -> None:
        self.left = evaluations

    def spend(self, amount: float = 1.0) -> None:
        _Spent.total += amount
        self.left -= amount

    @property
    def done(self) -> bool:
        return self.left <= 0


class _NoBasis:
    """A HiGHS model that ignores the bases it is given: every solve starts where the last one ended."""

    def __init__(self, highs) -> None:
        self._highs = highs

    def setBasis(self, basis) -> None:
        pass

    def __getattr__(self, name):
        return getattr(self._highs, name)


def test_children_start_from_their_parents_basis(monkeypatch):
    """Run to its end, the branching reaches the same bound whether or not a child's LP starts from its
    parent's basis, and with it in fewer simplex iterations over the four table sets."""
    monkeypatch.setattr(branching_module, "Work", _Spent)
    spent = {}
    for warm in (True, False):
        _Spent.total = 0.0
        bounds = []
        for seed in range(4):
            _, problem = mixed_problem(seed)
            relaxed = solve(problem, class_bins(problem), integer=False, keep=True)
            lp = copy_relaxation(relaxed)
            if not warm:
                lp = dataclasses.replace(lp, highs=_NoBasis(lp.highs))
            bounds.append(branch_bound(problem, lp, relaxed.bound_s, np.inf, UNLIMITED))
        spent[warm] = (_Spent.total, bounds)
    assert spent[True][1] == pytest.approx(spent[False][1], rel=1e-9)
    assert spent[True][0] < spent[False][0]
