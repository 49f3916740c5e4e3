"""The greedy's first feasible choice where memory is short: tables give up their favourite options in a fixed
order, each move filling less of a device, and the fewest moves that fit are found in a logarithmic number of
greedy runs."""

from __future__ import annotations

import math

import numpy as np
import pytest

from embedding_fixtures import GiB, cluster, node, small_node
from planner.embeddings import heuristic
from planner.embeddings.devices import device_arrays
from planner.embeddings.problem import Problem, build_problem
from planner.types import EmbeddingTable


def tight_problem(seed: int) -> Problem:
    """80 seeded tables on 2 nodes x 4 devices of 1 GiB HBM (host memory allowed): the tables' favourite
    options do not fit together."""
    rng = np.random.default_rng(seed)
    c = cluster((small_node(node("dgx-a100-80gb"), 4, memory_bytes=1 * GiB), 2))
    tables = tuple(EmbeddingTable(f"t{i}", int(10 ** rng.uniform(3, 6.7)), int(rng.choice([16, 32, 64])),
                                  float(rng.choice([1, 10, 50]))) for i in range(80))
    return build_problem(tables, device_arrays(c, None, None, True), 4096, "adagrad")


def with_moves(prefs: list[list[int]], moves: list[tuple[int, int]], count: int) -> list[int]:
    choice = [p[0] for p in prefs]
    for t, o in moves[:count]:
        choice[t] = o
    return choice


@pytest.mark.parametrize("seed", range(8))
def test_fewest_moves_that_fit_in_few_greedy_runs(seed, monkeypatch):
    problem = tight_problem(seed)
    prefs = heuristic.preferences(problem, None)
    moves = heuristic._relief_moves(problem, prefs)
    unlimited = heuristic.Work(np.inf)
    assert heuristic.greedy(problem, [p[0] for p in prefs], unlimited) is None  # the favourites do not fit

    # each move takes a table to an option later in its preferences that fills less of a device
    ranks = [0] * len(prefs)
    for t, o in moves:
        before = prefs[t][ranks[t]]
        ranks[t] = prefs[t].index(o)
        assert heuristic._fill(problem, t, o) < heuristic._fill(problem, t, before)

    runs = []
    greedy = heuristic.greedy
    monkeypatch.setattr(heuristic, "greedy", lambda *args, **kw: runs.append(1) or greedy(*args, **kw))
    choice, state = heuristic._first_feasible(problem, prefs, unlimited)
    assert problem.fits(state.loads())
    count = next(k for k in range(len(moves) + 1) if with_moves(prefs, moves, k) == choice)
    assert count >= 1 and greedy(problem, with_moves(prefs, moves, count - 1), unlimited) is None
    # doubling up to the first count that fits, then bisecting below it
    assert len(runs) <= 2 * math.ceil(math.log2(len(moves) + 1)) + 1
