"""The greedy's first feasible choice where memory is short: tables give up their favourite options in a fixed
order (units over half a device first, then the moves that relieve the memory pressure most cheaply), and the
fewest moves that fit are found in a logarithmic number of greedy runs."""

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


def pressure(problem: Problem, choice: list[int]) -> float:
    hbm = sum(heuristic._memory_bytes(problem, t, o)[0] for t, o in enumerate(choice))
    host = sum(heuristic._memory_bytes(problem, t, o)[1] for t, o in enumerate(choice))
    return ((hbm / problem.dev.hbm_capacity_bytes.sum()) ** heuristic.PRESSURE_POWER
            + (host / problem.dev.host_capacity_bytes.sum()) ** heuristic.PRESSURE_POWER)


def check_moves(problem: Problem, start: list[int], moves: list[tuple[int, int]]) -> None:
    """Units over half a device move first, each to an option filling at most half; every later move lowers
    the memory pressure and fills no more than half a device or than the table's option before it."""
    fill = heuristic._fill
    big = {t for t, o in enumerate(start) if fill(problem, t, o) > heuristic.BIG_FILL}
    first = moves[:len([t for t in big if any(fill(problem, t, o) <= heuristic.BIG_FILL
                                              for o in range(len(problem.options[t])))])]
    assert all(t in big and fill(problem, t, o) <= heuristic.BIG_FILL for t, o in first)
    assert len({t for t, _ in first}) == len(first)
    choice = with_moves([[o] for o in start], moves, len(first))
    for t, o in moves[len(first):]:
        before = pressure(problem, choice)
        assert fill(problem, t, o) <= max(fill(problem, t, choice[t]), heuristic.BIG_FILL)
        choice[t] = o
        assert pressure(problem, choice) < before


@pytest.mark.parametrize("seed", range(8))
def test_fewest_moves_that_fit_in_few_greedy_runs(seed, monkeypatch):
    problem = tight_problem(seed)
    prefs = heuristic.preferences(problem, None)
    start = [p[0] for p in prefs]
    moves = heuristic._relief_moves(problem, start)
    unlimited = heuristic.Work(np.inf)
    assert heuristic.greedy(problem, start, unlimited) is None  # the favourites do not fit
    check_moves(problem, start, moves)

    runs = []
    greedy = heuristic.greedy
    monkeypatch.setattr(heuristic, "greedy", lambda *args, **kw: runs.append(1) or greedy(*args, **kw))
    choice, state = heuristic._first_feasible(problem, prefs, unlimited)
    assert problem.fits(state.loads())
    count = next(k for k in range(len(moves) + 1) if with_moves(prefs, moves, k) == choice)
    assert count >= 1 and greedy(problem, with_moves(prefs, moves, count - 1), unlimited) is None
    # doubling up to the first count that fits, then bisecting below it
    assert len(runs) <= 2 * math.ceil(math.log2(len(moves) + 1)) + 1


def test_cold_tables_leave_hbm_before_hot_ones():
    # 2 nodes x 2 devices of 1 GiB HBM; 12 tables of 0.4 GiB each (Adagrad), half looked up 50 times per
    # sample, half once: 4.8 GiB in HBM does not fit, and host memory has room for all of them
    c = cluster((small_node(node("dgx-a100-80gb"), 2, memory_bytes=1 * GiB), 2))
    tables = tuple(EmbeddingTable(f"{kind}{i}", 838_860, 64, pooling) for i in range(6)
                   for kind, pooling in (("hot", 50.0), ("cold", 1.0)))
    problem = build_problem(tables, device_arrays(c, None, None, True), 4096, "adagrad")
    start = [next(o for o, option in enumerate(options) if option.sharding == "table_wise" and not option.host)
             for options in problem.options]
    assert all(heuristic._fill(problem, t, o) <= heuristic.BIG_FILL for t, o in enumerate(start))
    moves = heuristic._relief_moves(problem, start)
    check_moves(problem, start, moves)
    first = moves[:6]
    assert all(tables[t].name.startswith("cold") and problem.options[t][o].host for t, o in first)
