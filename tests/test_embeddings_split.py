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


# both option changes followed by a local search: finer shards for the slowest device, other options for the
# tables whose units pay all-to-all excess
CHANGES = {"split_bottleneck": heuristic.split_bottleneck, "reshard_excess": heuristic.reshard_excess}


@pytest.mark.parametrize("change", sorted(CHANGES))
@pytest.mark.parametrize("seed", range(6))
def test_never_slower_and_within_memory(change: str, seed: int) -> None:
    problem = seeded_problem(100 + seed)
    start = settled(problem)  # where most option changes, placed and polished, end slower
    after = CHANGES[change](problem, start, heuristic.Work(5000))
    assert problem.fits(problem.evaluate(after))
    assert problem.makespan_s(after) <= problem.makespan_s(start)


@pytest.mark.parametrize("change", sorted(CHANGES))
def test_no_work_no_change(change: str) -> None:
    problem = seeded_problem(23)
    before = settled(problem)
    assert CHANGES[change](problem, before, heuristic.Work(0)) == before


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


# ---------------------------------------------------------------------------- other options for excess tables
def table_wise_plan(problem: Problem) -> heuristic.Assignment:
    """Every table whole on one device (only device-scope units), greedily placed."""
    choice = [next(o for o, option in enumerate(options) if option.sharding == "table_wise")
              for options in problem.options]
    state = heuristic.greedy(problem, choice, heuristic.Work(np.inf))
    assert state is not None
    return state.assignment()


@pytest.mark.parametrize("seed", [6, 13, 22])
def test_excess_is_each_devices_excess_split_among_its_units(seed: int) -> None:
    problem = seeded_problem(seed)
    plan = table_wise_plan(problem)
    loads = problem.evaluate(plan)
    per_byte = problem.dev.a2a_s_per_byte
    devices = per_byte * (np.maximum(loads.ids_recv_bytes - loads.ids_send_bytes, 0.0)
                          + 2.0 * np.maximum(loads.pool_send_bytes - loads.pool_recv_bytes, 0.0))
    excess = heuristic.excess_s(problem, plan)
    assert devices.sum() > 0.0
    assert sum(excess.values()) == pytest.approx(float(devices.sum()), rel=1e-9)
    for t, value in excess.items():  # a table's share is at most its devices' excess
        assert value <= float(devices[list(plan[t][1])].sum()) * (1 + 1e-9)
    quiet = [t for t, (_, positions) in enumerate(plan) if not devices[list(positions)].any()]
    assert quiet and not any(t in excess for t in quiet)


@pytest.mark.parametrize("seed", [0, 2])
def test_other_options_for_excess_tables_beat_a_settled_local_search(seed: int) -> None:
    problem = seeded_problem(seed)
    before = settled(problem)
    excess = heuristic.excess_s(problem, before)
    after = heuristic.reshard_excess(problem, before, heuristic.Work(5000))
    loads = problem.evaluate(after)
    assert problem.fits(loads)
    assert float(problem.device_time_s(loads).max()) < 0.99 * problem.makespan_s(before)
    changed = [t for t in range(len(problem.tables)) if after[t][0] != before[t][0]]
    assert any(t in excess for t in changed)
