"""Packing against a target time (heuristic.target_pack): valid plans, and the case LPT cannot solve."""

from __future__ import annotations

import copy
import itertools

import numpy as np
import pytest

from embedding_fixtures import cluster, node, small_node, small_problem
from planner.embeddings.devices import device_arrays
from planner.embeddings.heuristic import Work, greedy, guide_choice, target_pack
from planner.embeddings.milp import class_bins, solve
from planner.embeddings.problem import Problem, build_problem
from planner.types import EmbeddingTable


def _table_wise_only(tables: tuple[EmbeddingTable, ...], devices: int) -> Problem:
    """``tables`` on one node of ``devices`` A100s, each table only table-wise (one unit, on one device)."""
    dev = device_arrays(cluster((small_node(node("dgx-a100-80gb"), devices), 1)))
    full = build_problem(tables, dev, 4096, "adagrad")
    options = tuple(tuple(o for o in opts if o.sharding == "table_wise" and not o.host) for opts in full.options)
    return Problem(full.tables, dev, full.global_batch, full.optimizer, options)


def test_packing_reaches_the_best_placement_where_lpt_does_not():
    # unit times about 3, 3, 2, 2, 2 on two devices: LPT puts a 3 on each device, then 2 + 2 on one (7 against
    # 5), while packing to a target of 6 puts both 3s on one device and the three 2s on the other
    tables = tuple(EmbeddingTable(f"t{i}", 1000, 64, pooling) for i, pooling in enumerate((60, 60, 40, 40, 40)))
    problem = _table_wise_only(tables, 2)
    choice = [0] * len(tables)
    best = min(problem.makespan_s(tuple((0, (p,)) for p in placement))
               for placement in itertools.product(range(2), repeat=len(tables)))
    lpt = greedy(problem, choice, Work(np.inf)).makespan()
    lower = solve(problem, class_bins(problem), integer=False).bound_s
    packed = target_pack(problem, choice, lower, lpt, Work(np.inf), steps=20)
    assert lpt > best * 1.05
    assert problem.makespan_s(packed) == pytest.approx(best, rel=1e-6)


@pytest.mark.parametrize("seed", range(6))
def test_packed_plans_are_whole_and_within_memory(seed):
    problem = small_problem(seed, 7, memory_bytes=2 * 1024 ** 3)
    relaxed = solve(problem, class_bins(problem), integer=False)
    packed = target_pack(problem, guide_choice(problem, relaxed.weights), relaxed.bound_s, 4 * relaxed.bound_s,
                         Work(50_000))
    assert packed is not None
    for t, (o, positions) in enumerate(packed):
        assert len(positions) == problem.options[t][o].units
    value = problem.makespan_s(packed)  # inf when some device is over its memory
    assert np.isfinite(value) and value >= relaxed.bound_s * (1 - 1e-9)


def test_packing_is_deterministic():
    problem = small_problem(3, 8)
    relaxed = solve(problem, class_bins(problem), integer=False)
    choice = guide_choice(problem, relaxed.weights)
    runs = {target_pack(problem, choice, relaxed.bound_s, 3 * relaxed.bound_s, Work(20_000)) for _ in range(2)}
    assert len(runs) == 1


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_trial_placement_is_the_time_after_adding_the_unit_and_changes_nothing(seed):
    """unit_worst_time(t, o, p) is, to the last bit, the slowest touched device's time once the unit is added
    (inf when it overflows memory), it spends one evaluation when it fits, and the state is bitwise the same
    afterwards (adding and then removing a unit would leave rounding behind); unit_worst_times gives every
    position's (or the tried ones') in one call, for the same work."""
    problem = small_problem(seed, 6)
    choice = guide_choice(problem, [tuple(1.0 if o == 0 else 0.0 for o in range(len(options)))
                                    for options in problem.options])
    state = greedy(problem, choice, Work(np.inf))
    assert state is not None
    state.work = Work(1e9)  # finite, so that what each trial spends shows
    fields = ("compute", "ids_recv", "pool_send", "hbm", "host", "latency")
    trials = 0
    for t, options in enumerate(problem.options):
        for o, option in enumerate(options):
            if option.scope == "device":
                continue
            for p in problem.positions(option):
                before = {name: getattr(state, name).copy() for name in fields}
                fused, left = dict(state.fused), state.work.left
                got = state.unit_worst_time(t, o, p)
                for name in fields:
                    assert np.array_equal(getattr(state, name), before[name]), name
                assert state.fused == fused
                reference = copy.deepcopy(state)
                reference.apply_unit(t, o, p, 1.0)
                unit = problem.unit(t, o, p)
                overflow = (np.any(reference.hbm[unit.devices] > problem.dev.hbm_capacity_bytes[unit.devices]
                                   * (1 + 1e-12))
                            or np.any(reference.host[unit.devices] > problem.dev.host_capacity_bytes[unit.devices]
                                      * (1 + 1e-12)))
                expected = np.inf if overflow else float(reference.times()[unit.devices].max())
                assert got == expected
                assert state.work.left == left - (0 if overflow else 1)
                trials += 1
            # every position at once: the same values, the same work, and only the positions tried
            left = state.work.left
            each = [state.unit_worst_time(t, o, p) for p in problem.positions(option)]
            spent = left - state.work.left
            together = state.unit_worst_times(t, o)
            assert together.tolist() == each and left - state.work.left == 2 * spent
            tried = np.arange(len(each)) % 2 == 0
            assert state.unit_worst_times(t, o, tried).tolist() == [w if k else np.inf for w, k in zip(each, tried)]
    assert trials > 0
