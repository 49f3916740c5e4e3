"""The greedy's first feasible choice where memory is short: tables give up their favourite options in a fixed
order (the moves that relieve the memory pressure most cheaply), and the fewest moves that fit are found in a
logarithmic number of greedy runs."""

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
    """Per memory: (bytes / capacity) and (pieces over half a device / devices) to the power PRESSURE_POWER, and
    PRESSURE_POWER times the sum over the pieces of units not on every device of how far their share of a device
    and the share the units on every device take exceed the whole device."""
    dev, power = problem.dev, heuristic.PRESSURE_POWER
    capacity = (dev.hbm_capacity_bytes, dev.host_capacity_bytes)
    used, big, shared, shares = [0.0, 0.0], [0, 0], [0.0, 0.0], ([], [])
    for t, o in enumerate(choice):
        option = problem.options[t][o]
        k = int(option.host)
        position = problem.positions(option)[0]
        for _ in range(option.units):
            u = problem.unit(t, o, position)
            held = u.host_bytes if option.host else u.hbm_bytes
            share = held / (capacity[k].max() if option.scope == "device" else capacity[k][u.devices])
            used[k] += held.sum()
            big[k] += int(np.count_nonzero(share > heuristic.BIG_FILL))
            if option.scope == "global":
                shared[k] += share.max()
            else:
                shares[k].extend([share.max()] * len(u.devices))
    return sum((used[k] / capacity[k].sum()) ** power + (big[k] / len(capacity[k])) ** power
               + power * sum(max(0.0, share + shared[k] - 1.0) for share in shares[k])
               for k in (0, 1) if capacity[k].sum() > 0)


def check_moves(problem: Problem, start: list[int], moves: list[tuple[int, int]]) -> None:
    """Every move lowers the memory pressure and fills no more than half a device or than the table's option
    before it."""
    fill = heuristic._fill
    choice = list(start)
    for t, o in moves:
        before = pressure(problem, choice)
        assert fill(problem, t, o) <= max(fill(problem, t, choice[t]), heuristic.BIG_FILL)
        choice[t] = o
        assert pressure(problem, choice) < before


def four_devices(tables: tuple[EmbeddingTable, ...], allow_host: bool = True, hbm_bytes: int | None = None
                 ) -> Problem:
    """``tables`` (Adagrad, global batch 4096) on 2 nodes x 2 devices of 1 GiB HBM (``hbm_bytes`` if given) and
    2 GiB of host memory."""
    c = cluster((small_node(node("dgx-a100-80gb"), 2, memory_bytes=1 * GiB), 2))
    budget = None if hbm_bytes is None else {i: hbm_bytes for i in range(4)}
    return build_problem(tables, device_arrays(c, None, budget, allow_host), 4096, "adagrad")


def first_option(problem: Problem, sharding: str, host: bool | None = False) -> list[int]:
    """Per table, its first option of ``sharding`` (in HBM, host memory, or either where ``host`` is None)."""
    return [next(o for o, option in enumerate(options)
                 if option.sharding == sharding and (host is None or option.host == host))
            for options in problem.options]


def first_feasible(problem: Problem, start: list[int]) -> tuple[list[int], object] | None:
    """The relief moves from ``start``, checked, and the first feasible choice from them."""
    check_moves(problem, start, heuristic._relief_moves(problem, start))
    prefs = [[o] + [other for other in range(len(problem.options[t])) if other != o] for t, o in enumerate(start)]
    return heuristic._first_feasible(problem, prefs, heuristic.Work(np.inf))


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
    # doubling up to the first count that fits, then bisecting below it; a count that does not fit is tried
    # twice (in the greedy's order, then with units over half a device first)
    assert len(runs) <= 2 * (2 * math.ceil(math.log2(len(moves) + 1)) + 1)


COLD = tuple(EmbeddingTable(f"cold{i}", 838_860, 64, 1.0) for i in range(12))  # 0.4 GiB each with Adagrad


@pytest.mark.parametrize("tables, cold_first", [
    # six hot tables of 0.4 GiB (50 lookups per sample) and six cold ones: 4.8 GiB in HBM does not fit, and host
    # memory has room for all of them
    (tuple(EmbeddingTable(f"hot{i}", 838_860, 64, 50.0) for i in range(6)) + COLD[:6], 6),
    # one hot table filling 0.6 of a device and twelve cold ones: 5.4 GiB does not fit. One unit over half a
    # device has four devices to choose from, so splitting it relieves little
    ((EmbeddingTable("hot", 1_258_291, 64, 50.0),) + COLD, 4),
], ids=["hot-and-cold", "one-big-hot"])
def test_cold_tables_leave_hbm_first(tables, cold_first):
    problem = four_devices(tables)
    start = first_option(problem, "table_wise")
    moves = heuristic._relief_moves(problem, start)
    check_moves(problem, start, moves)
    assert all(tables[t].name.startswith("cold") and problem.options[t][o].host for t, o in moves[:cold_first])


def test_units_over_half_a_device_are_placed_before_node_wide_ones():
    # three table-row-wise tables in host memory take 0.3 of each device of their node, one table-wise table 0.9
    # of a device; placed first, the node-wide units leave no device with 0.9 free
    tables = (EmbeddingTable("big", 3_774_873, 64, 1.0),) + tuple(
        EmbeddingTable(f"wide{i}", 2_516_582, 64, 1.0) for i in range(3))
    problem = four_devices(tables)
    choice = first_option(problem, "table_row_wise", host=True)
    choice[0] = first_option(problem, "table_wise", host=True)[0]
    assert heuristic._fill(problem, 0, choice[0]) > 0.85
    unlimited = heuristic.Work(np.inf)
    assert heuristic.greedy(problem, choice, unlimited) is None
    state = heuristic.greedy(problem, choice, unlimited, big_first=True)
    assert state is not None and problem.fits(state.loads())
    assert first_feasible(problem, choice)[0] == choice  # the favourites fit: no table gives them up


def test_units_spread_over_every_device_leave_room_for_the_largest_other():
    # no room in HBM: four row-wise tables in host memory take 0.6 of every device and one table-wise table 0.45
    # of one; the bytes fit (3.3 of 8 GiB) and no unit fills over half a device, but placed after the row-wise
    # units the table-wise one finds no room
    tables = (EmbeddingTable("single", 1_887_436, 64, 1.0),) + tuple(
        EmbeddingTable(f"spread{i}", 2_516_582, 64, 1.0) for i in range(4))
    problem = four_devices(tables, hbm_bytes=1024 ** 2)
    assert all(option.host for options in problem.options for option in options)
    start = first_option(problem, "row_wise", host=True)
    start[0] = first_option(problem, "table_wise", host=True)[0]
    assert heuristic.greedy(problem, start, heuristic.Work(np.inf)) is None
    found = first_feasible(problem, start)
    assert found is not None and problem.fits(found[1].loads())


def test_units_over_half_a_device_are_split_where_they_outnumber_the_devices():
    # no host memory: five tables of 0.6 GiB each fit in bytes (3 of 4 GiB), but whole they need five devices
    problem = four_devices(tuple(EmbeddingTable(f"t{i}", 1_258_291, 64, 1.0) for i in range(5)), allow_host=False)
    start = first_option(problem, "table_wise")
    assert heuristic.greedy(problem, start, heuristic.Work(np.inf)) is None
    found = first_feasible(problem, start)
    assert found is not None and problem.fits(found[1].loads())
    assert sum(problem.options[t][o].sharding == "table_wise" for t, o in enumerate(found[0])) >= 3


def test_a_replicated_table_is_not_made_one_slow_unit_while_others_can_move():
    # a small hot table replicated on every device and twelve cold tables of 0.4 GiB that do not fit. Whole on
    # one device the hot table would take less work summed over devices than replicated, but one device would
    # carry all its lookups: it moves only to options whose unit alone is no slower than the slowest unit of the
    # start while other moves relieve the memory
    problem = four_devices((EmbeddingTable("replicated", 5_000, 64, 200.0),) + COLD)
    start = first_option(problem, "table_wise")
    start[0] = first_option(problem, "data_parallel")[0]
    slowest = max(problem.unit_alone_s(t, o) for t, o in enumerate(start))
    assert any(problem.unit_alone_s(0, o) > slowest for o in range(len(problem.options[0])))
    moves = heuristic._relief_moves(problem, start)
    check_moves(problem, start, moves)
    first = next(o for t, o in moves if t == 0)
    assert problem.unit_alone_s(0, first) <= slowest
