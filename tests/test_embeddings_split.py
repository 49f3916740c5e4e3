"""Finer shards for the slowest device's units (heuristic.split_bottleneck): an option change followed by the
moves it makes possible, where the local search alone has stopped."""

from __future__ import annotations

import numpy as np
import pytest

from embedding_fixtures import GiB, cluster, node, small_node
from planner.embeddings import heuristic
from planner.embeddings.devices import device_arrays
from planner.embeddings.problem import Problem, build_problem
from planner.types import EmbeddingTable


def seeded_problem(seed: int) -> Problem:
    """40 seeded tables (Adagrad, global batch 8192) on 2 nodes x 4 devices of 1 GiB HBM, host memory allowed."""
    rng = np.random.default_rng(seed)
    c = cluster((small_node(node("dgx-a100-80gb"), 4, memory_bytes=1 * GiB), 2))
    tables = tuple(EmbeddingTable(f"t{i}", int(10 ** rng.uniform(2, 6.5)), int(rng.choice([16, 64, 128, 256])),
                                  float(rng.choice([1, 10, 50, 100]))) for i in range(40))
    return build_problem(tables, device_arrays(c, None, None, True), 8192, "adagrad")


def settled(problem: Problem) -> heuristic.Assignment:
    """A plan the local search can no longer improve."""
    start = heuristic.heuristic(problem, None, heuristic.Work(20000))
    assert start is not None
    return heuristic.local_search(heuristic.state_of(problem, start, heuristic.Work(np.inf))).assignment()


def alone(problem: Problem, assignment: heuristic.Assignment, t: int) -> float:
    return problem.unit_alone_s(t, assignment[t][0])


@pytest.mark.parametrize("seed", [13, 20, 23])
def test_finer_shards_beat_a_settled_local_search(seed: int) -> None:
    problem = seeded_problem(seed)
    before = settled(problem)
    before_s = problem.makespan_s(before)
    again = heuristic.local_search(heuristic.state_of(problem, before, heuristic.Work(np.inf)))
    assert problem.makespan_s(again.assignment()) == pytest.approx(before_s, rel=1e-12)

    after = heuristic.split_bottleneck(problem, before, heuristic.Work(20000))
    loads = problem.evaluate(after)  # one option per table, every unit placed
    assert problem.fits(loads)
    assert float(problem.device_time_s(loads).max()) < 0.99 * before_s
    changed = [t for t in range(len(problem.tables)) if after[t][0] != before[t][0]]
    assert any(alone(problem, after, t) < alone(problem, before, t) for t in changed)


@pytest.mark.parametrize("seed", range(6))
def test_never_slower_and_within_memory(seed: int) -> None:
    problem = seeded_problem(100 + seed)
    start = settled(problem)  # where most finer options, placed and polished, end slower
    after = heuristic.split_bottleneck(problem, start, heuristic.Work(5000))
    assert problem.fits(problem.evaluate(after))
    assert problem.makespan_s(after) <= problem.makespan_s(start)


def test_no_work_no_change() -> None:
    problem = seeded_problem(23)
    before = settled(problem)
    assert heuristic.split_bottleneck(problem, before, heuristic.Work(0)) == before


def test_keeps_a_plan_no_finer_option_improves() -> None:
    """Eight alike tables, one whole table per device: any finer option of one of them (more column shards, a
    node's rows, every device's rows) leaves some device as slow or slower, so the plan's time stays."""
    c = cluster((small_node(node("dgx-a100-80gb"), 4, memory_bytes=1 * GiB), 2))
    tables = tuple(EmbeddingTable(f"t{i}", 1_000_000, 64, 10.0) for i in range(8))
    problem = build_problem(tables, device_arrays(c, None, None, True), 8192, "adagrad")
    before = settled(problem)
    assert sorted(p for _, (p,) in before) == list(range(8))  # one table per device
    after = heuristic.split_bottleneck(problem, before, heuristic.Work(5000))
    assert problem.makespan_s(after) <= problem.makespan_s(before)
