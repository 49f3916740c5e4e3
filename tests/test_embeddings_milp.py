"""The MILP against brute force on tiny instances, the LP bound against every solution, the aggregated LP
against the per-device LP."""

from __future__ import annotations

import itertools
from types import SimpleNamespace

import numpy as np
import pytest

from embedding_checks import check_plan_memory, check_result
from embedding_fixtures import GiB, cluster, node, small_node
from planner.embeddings import milp, shard_tables
from planner.embeddings.devices import device_arrays
from planner.embeddings.highs import CheckLimit
from planner.embeddings.milp import class_bins, device_bins, model_rows, node_bins, resolve_integer, solve
from planner.embeddings.problem import Problem, build_options, build_problem
from planner.types import EmbeddingTable
from planner.solver import SolverOptions

A100 = node("dgx-a100-80gb")
V100 = node("hgx-v100-32gb")


def random_tables(rng: np.random.Generator, count: int) -> tuple[EmbeddingTable, ...]:
    return tuple(EmbeddingTable(f"t{i}", int(rng.integers(10, 2_000_000)), int(rng.choice([8, 16, 32])),
                                float(rng.choice([1, 4, 20]))) for i in range(count))


def brute_force(problem) -> float:
    """The best makespan over every option and every placement of its units."""
    return brute_force_plan(problem)[0]


def every_assignment(problem):
    """Every option of every table with every placement of its units."""
    per_table = []
    for t, options in enumerate(problem.options):
        choices = []
        for o, option in enumerate(options):
            positions = list(problem.positions(option))
            for combo in itertools.combinations_with_replacement(positions, option.units):
                choices.append((o, combo))
        per_table.append(choices)
    return itertools.product(*per_table)


def brute_force_plan(problem):
    """(the best makespan over every option and every placement of its units, a plan that has it)."""
    best, plan = np.inf, None
    for assignment in every_assignment(problem):
        loads = problem.evaluate(assignment)
        if problem.fits(loads):
            value = float(problem.device_time_s(loads).max())
            if value < best:
                best, plan = value, assignment
    return best, plan


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_milp_matches_brute_force(seed):
    rng = np.random.default_rng(seed)
    # 2 nodes x 2 devices (A100 + V100): table-wise, column-wise, table-row-wise, row-wise, data-parallel
    c = cluster((small_node(A100, 2), 1), (small_node(V100, 2), 1))
    tables = random_tables(rng, 2)
    problem = build_problem(tables, device_arrays(c), 4096, "adagrad")
    exact = solve(problem, device_bins(problem), integer=True)
    assert exact.status == "optimal"
    best = brute_force(problem)
    assert exact.objective_s == pytest.approx(best, rel=1e-6)
    loads = problem.evaluate(exact.assignment)
    assert float(problem.device_time_s(loads).max()) == pytest.approx(best, rel=1e-6)
    lp = solve(problem, class_bins(problem), integer=False)
    assert lp.objective_s <= best * (1 + 1e-9)


@pytest.mark.parametrize("seed", range(6))
def test_every_bound_is_below_the_brute_force_optimum(seed):
    """The class LP, its integral-choice MILP and the node MILP (all with the per-table cuts (f), which add the
    global work of the other tables) never exceed the true optimum, with global options in play: one table is
    tiny (data-parallel is cheap) and one has a large pooling factor (row-wise is attractive)."""
    rng = np.random.default_rng(200 + seed)
    c = cluster((small_node(A100, 2), 1), (small_node(V100, 2), 1))
    tiny = EmbeddingTable("tiny", int(rng.integers(2, 200)), int(rng.choice([8, 16])), float(rng.choice([1, 4])))
    hot = EmbeddingTable("hot", int(rng.integers(1000, 3_000_000)), int(rng.choice([8, 16, 32])),
                         float(rng.choice([20, 60, 100])))
    problem = build_problem((tiny, hot), device_arrays(c), 8192, "adagrad")
    best = brute_force(problem)
    relaxed = solve(problem, class_bins(problem), integer=False, keep=True)
    assert relaxed.bound_s <= best * (1 + 1e-7)
    chosen = resolve_integer(problem, relaxed)
    assert chosen.bound_s <= best * (1 + 1e-7)
    by_node = solve(problem, node_bins(problem), integer=True)
    assert by_node.bound_s <= best * (1 + 1e-7)
    result = shard_tables((tiny, hot), c, None, 8192, options=SolverOptions(work=0.5))
    assert result.lower_bound_s <= best * (1 + 1e-7) <= result.embedding_time_s * (1 + 2e-7)


@pytest.mark.parametrize("seed", range(4))
def test_pigeonhole_cuts_stay_below_the_brute_force_optimum(seed):
    """The class and node MILPs with the pigeonhole cuts (f3): more column shards than devices per class, so
    some device must hold two; on one node of 3 devices (one class) and on 2 + 2 mixed devices."""
    rng = np.random.default_rng(300 + seed)
    # dims 8: table-wise or 2 column shards; every table looked up enough that sharding matters
    tables = tuple(EmbeddingTable(f"t{i}", int(rng.integers(1000, 2_000_000)), 8, float(rng.choice([1, 20, 60])))
                   for i in range(3))
    for c in (cluster((small_node(A100, 3), 1)), cluster((small_node(A100, 2), 1), (small_node(V100, 2), 1))):
        problem = build_problem(tables, device_arrays(c), 8192, "adagrad")
        best = brute_force(problem)
        relaxed = solve(problem, class_bins(problem), integer=False, keep=True)
        chosen = resolve_integer(problem, relaxed)
        assert relaxed.bound_s <= chosen.bound_s * (1 + 1e-9)
        assert chosen.bound_s <= best * (1 + 1e-7)
        if len(c.groups) > 1:
            assert solve(problem, node_bins(problem), integer=True).bound_s <= best * (1 + 1e-7)


@pytest.mark.parametrize("seed", range(3))
def test_excess_cut_lifts_the_lp_and_stays_below_the_brute_force_optimum(seed, monkeypatch):
    """(f4): a table-wise shard of a hot table receives more ids than every device sends, which the class LP
    averages away; the cut charges that excess, lifting the one-class LP, and stays below brute force (on one
    class and on two, where each class's bin gets the excess of its own units)."""
    from planner.embeddings import milp

    rng = np.random.default_rng(400 + seed)
    hot = EmbeddingTable("hot", int(rng.integers(1000, 2_000_000)), 8, float(rng.choice([60, 100, 200])))
    tables = (hot,) + tuple(EmbeddingTable(f"t{i}", int(rng.integers(1000, 2_000_000)), int(rng.choice([8, 16, 32])),
                                           1.0) for i in range(2))
    for c in (cluster((small_node(A100, 3), 1)), cluster((small_node(A100, 2), 1), (small_node(V100, 2), 1))):
        problem = build_problem(tables, device_arrays(c), 8192, "adagrad")
        best = brute_force(problem)
        relaxed = solve(problem, class_bins(problem), integer=False, keep=True)
        assert relaxed.bound_s <= resolve_integer(problem, relaxed).bound_s * (1 + 1e-9) <= best * (1 + 1e-7)
        assert solve(problem, node_bins(problem), integer=True).bound_s <= best * (1 + 1e-7)
        if len(c.groups) == 1:
            with monkeypatch.context() as m:
                m.setattr(milp, "_excess_terms", lambda lp, problem, nb, *args: ([[]] * nb, [[]] * nb))
                without = solve(problem, class_bins(problem), integer=False)
            assert relaxed.bound_s > without.bound_s * (1 + 1e-4)


@pytest.mark.parametrize("seed", [5, 6, 8])
def test_memory_pigeonhole_cut_lifts_and_stays_below_the_brute_force_optimum(seed, monkeypatch):
    """(f5): three tables of 51-60% of a device's memory each on 2 devices fit the class's memory (2 x 100%)
    but not table-wise on whole devices; the cut (at most one unit of more than half the memory per device)
    lifts the class MILP to the brute-force optimum here and never past it. Claiming one unit per device for
    units of more than a quarter of the memory (slack 3: invalid) overshoots the optimum."""
    from planner.embeddings import milp
    from planner.embeddings.problem import shard_memory_bytes

    rng = np.random.default_rng(500 + seed)
    tables = tuple(EmbeddingTable(f"t{i}", int(rng.integers(1_000_000, 1_200_000)), 8,
                                  float(rng.choice([1, 20, 60]))) for i in range(3))
    memory = [shard_memory_bytes(t.rows, t.dim, t.dtype_bytes, "adagrad") for t in tables]
    capacity = min(memory) / float(rng.uniform(0.51, 0.6))
    devices = device_arrays(cluster((small_node(A100, 2), 1)), None, {0: capacity, 1: capacity}, allow_host=False)
    problem = build_problem(tables, devices, 8192, "adagrad")
    best = brute_force(problem)
    bound = solve(problem, class_bins(problem), integer=True).bound_s
    assert bound <= best * (1 + 1e-7)
    assert bound == pytest.approx(best, rel=1e-6)
    relaxed = solve(problem, class_bins(problem), integer=False, keep=True)
    assert relaxed.bound_s <= resolve_integer(problem, relaxed).bound_s * (1 + 1e-9) <= best * (1 + 1e-7)
    original = milp._add_memory_pigeonhole_cuts
    with monkeypatch.context() as m:
        m.setattr(milp, "_add_memory_pigeonhole_cuts", lambda *args: None)
        assert solve(problem, class_bins(problem), integer=True).bound_s < best * (1 - 1e-4)
        m.setattr(milp, "_add_memory_pigeonhole_cuts", lambda *args: original(*args, slack=3))
        assert solve(problem, class_bins(problem), integer=True).bound_s > best * (1 + 1e-4)


def _beside_forced_blocks(seed: int, forced_scale: float = 1.0, devices: int = 2, other_rows: int = 400_000):
    """``devices`` devices; ``forced`` fits only row-wise (too big for one device, too narrow to split by columns),
    its blocks taking 1.0-1.1 of a device's memory (times ``forced_scale``) spread over all devices; ``big``'s
    table-wise shard 80-90% of one."""
    from planner.embeddings.problem import shard_memory_bytes

    rng = np.random.default_rng(900 + seed)
    big = EmbeddingTable("big", int(rng.integers(4_000_000, 4_800_000)), 4, float(rng.choice([100, 200])))
    capacity = shard_memory_bytes(big.rows, big.dim, big.dtype_bytes, "adagrad") / float(rng.uniform(0.8, 0.9))
    rows = int(forced_scale * float(rng.uniform(1.0, 1.1)) * capacity / shard_memory_bytes(1, 4, 4, "adagrad"))
    forced = EmbeddingTable("forced", rows, 4, float(rng.choice([1, 2])))
    other = EmbeddingTable("other", other_rows, 4, big.pooling_factor)
    budget = {i: capacity for i in range(devices)}
    return (big, other, forced), device_arrays(cluster((small_node(A100, 1), devices)), None, budget, allow_host=False)


@pytest.mark.parametrize("seed", [0, 4, 5])
def test_units_that_cannot_sit_beside_forced_blocks_are_dropped(seed):
    """A table left only row-wise puts its blocks on every device, so ``big``'s table-wise shard fits on none
    beside them: the option goes (and so on, as tables are left only row-wise), and the class MILP (which sums
    memory over the class and would take the shard) proves the brute-force optimum over every option."""
    from planner.embeddings.problem import _every_option

    tables, devices = _beside_forced_blocks(seed)
    problem = build_problem(tables, devices, 8192, "adagrad", for_search=True)
    # big's shard cannot sit beside forced's blocks, so big is left row-wise too, and other's shard, small beside
    # forced's blocks alone, cannot sit beside both
    assert [[o.sharding for o in options] for options in problem.options] == [["row_wise"]] * 3
    best = brute_force(_every_option(tables, devices, 8192, "adagrad"))
    assert np.isfinite(best) and brute_force(problem) == pytest.approx(best, rel=1e-12)
    assert solve(problem, class_bins(problem), integer=True).bound_s == pytest.approx(best, rel=1e-6)


@pytest.mark.parametrize("seed, scale, devices", [(0, 0.6, 2), (4, 0.6, 2), (0, 1.0, 4), (4, 1.0, 4)])
def test_every_option_some_plan_fits_with_survives_the_forced_blocks(seed, scale, devices):
    """Only options that no plan fitting in memory uses are dropped: every option of every fitting plan (all
    enumerated) is still offered."""
    from planner.embeddings.problem import _every_option

    tables, devices = _beside_forced_blocks(seed, forced_scale=scale, devices=devices, other_rows=2_000_000)
    every = _every_option(tables, devices, 8192, "adagrad")
    used = set()
    for assignment in every_assignment(every):
        if every.fits(every.evaluate(assignment)):
            used.update((t, every.options[t][o]) for t, (o, _) in enumerate(assignment))
    kept = build_problem(tables, devices, 8192, "adagrad", for_search=True).options
    assert used and all(option in kept[t] for t, option in used)


def test_a_given_placement_beside_forced_blocks_is_timed_as_not_fitting():
    """Only the search's problem drops the options: a plan that puts big's table-wise shard beside the blocks is
    retimed as not fitting (the caller reports it infeasible), not refused as a sharding that does not exist."""
    from planner.embeddings.retime import retime_placements
    from planner.embeddings.shard import placements

    tables, devices = _beside_forced_blocks(0)
    capacity = float(devices.hbm_capacity_bytes[0])
    two = cluster((small_node(A100, 1), 2))
    problem = build_problem(tables, devices, 8192, "adagrad")
    shardings = [[o.sharding for o in options] for options in problem.options]
    plan = ((shardings[0].index("table_wise"), (0,)), (shardings[1].index("row_wise"), (0,)),
            (shardings[2].index("row_wise"), (0,)))
    given = retime_placements(tables, two, range(2), 8192, placements(problem, plan), optimizer="adagrad",
                              memory_budget_bytes={0: capacity, 1: capacity})
    assert given.embedding_time_s == np.inf


def test_a_table_that_fits_nowhere_beside_forced_blocks_keeps_its_options():
    """Where no option of a table fits beside the blocks, the table keeps them (the placement reports that the set
    does not fit) rather than being left with none."""
    tables, devices = _beside_forced_blocks(0, forced_scale=1.7)
    problem = build_problem(tables, devices, 8192, "adagrad", for_search=True)
    assert [o.sharding for o in problem.options[2]] == ["row_wise"]
    assert {o.sharding for o in problem.options[0]} == {"table_wise", "row_wise"}


def test_aggregated_lp_equals_device_lp():
    rng = np.random.default_rng(5)
    c = cluster((small_node(A100, 4), 2), (small_node(V100, 4), 1))
    tables = random_tables(rng, 6)
    problem = build_problem(tables, device_arrays(c), 8192, "adam")
    aggregated = solve(problem, class_bins(problem), integer=False)
    per_device = solve(problem, device_bins(problem), integer=False)
    assert aggregated.objective_s == pytest.approx(per_device.objective_s, rel=1e-6)


@pytest.mark.parametrize("seed", range(4))
def test_bound_never_exceeds_the_plan(seed):
    rng = np.random.default_rng(100 + seed)
    c = cluster((small_node(A100, 4), 1), (small_node(V100, 4), 1))
    tables = random_tables(rng, 12)
    result = shard_tables(tables, c, None, 16384, options=SolverOptions(work=0.2))
    check_result(result, tables, c)
    if result.proven_optimal:
        assert result.gap <= 1e-6


def test_solves_after_another_highs_model_ran_in_the_process():
    """HiGHS keeps one thread scheduler per process. A solve with the default threads first (as the search's
    partition ILP does, or a user's own HiGHS model) made every later threads=1 solve of ours 'Not Solved'
    (a DLRM planned after a dense model in one process failed)."""
    import highspy

    from planner.embeddings.highs import stdout_silenced

    with stdout_silenced():
        other = highspy.Highs()  # the default threads
    other.setOptionValue("output_flag", False)
    other.addCol(1.0, 3.0, 10.0, 0, np.zeros(0, dtype=np.int32), np.zeros(0))
    other.changeColIntegrality(0, highspy.HighsVarType.kInteger)
    other.run()
    assert other.getModelStatus() == highspy.HighsModelStatus.kOptimal
    c = cluster((small_node(A100, 2), 1), (small_node(V100, 2), 1))
    problem = build_problem(random_tables(np.random.default_rng(0), 2), device_arrays(c), 4096, "adagrad")
    assert solve(problem, class_bins(problem), integer=False).status == "optimal"
    assert solve(problem, device_bins(problem), integer=True).status == "optimal"


def three_identical_nodes_and_one_more(seed: int, count: int):
    """``count`` random tables on 3 identical 2-A100 nodes (which (g) orders) and one 2-V100 node."""
    c = cluster((small_node(A100, 2), 3), (small_node(V100, 2), 1))
    return build_problem(random_tables(np.random.default_rng(seed), count), device_arrays(c), 16384, "adagrad")


def test_the_exact_milp_starts_from_a_given_plan():
    """A plan handed to the per-device MILP is its first incumbent (relabelled to satisfy the node-order
    constraints (g)): with almost no work allowed, the MILP still returns a plan at least as good."""
    problem = three_identical_nodes_and_one_more(7, 10)
    # a deliberately lopsided plan: every table whole on the last A100 node's second device, else data-parallel
    start = []
    for t, options in enumerate(problem.options):
        o = next(o for o, option in enumerate(options) if option.sharding == "data_parallel")
        start.append((o, (0,)))
    start[0] = (next(o for o, option in enumerate(problem.options[0]) if option.sharding == "table_wise"), (5,))
    start = tuple(start)
    loads = problem.evaluate(start)
    assert problem.fits(loads)
    value = float(problem.device_time_s(loads).max())
    cold = solve(problem, device_bins(problem), integer=True, work_limit=1)
    warm = solve(problem, device_bins(problem), integer=True, work_limit=1, incumbent=start)
    assert warm.assignment is not None and warm.objective_s <= value * (1 + 1e-6)
    check_plan_memory(problem, warm.assignment)
    assert cold.assignment is None or cold.objective_s >= warm.objective_s * (1 - 1e-9)


def test_symmetric_order_only_relabels_identical_nodes():
    from planner.embeddings.milp import _symmetric_order

    problem = three_identical_nodes_and_one_more(8, 8)
    # every table whole on a device of the third A100 node
    assignment = []
    for t, options in enumerate(problem.options):
        o = next(o for o, option in enumerate(options) if option.sharding == "table_wise")
        assignment.append((o, (4 + t % 2,)))
    before = problem.evaluate(assignment)
    after_plan = _symmetric_order(problem, assignment)
    after = problem.evaluate(after_plan)
    # the heaviest A100 node (the third) becomes the first; the V100 node (6, 7) keeps its devices
    assert sorted(problem.device_time_s(before)) == pytest.approx(sorted(problem.device_time_s(after)))
    assert after.compute_s[:2].sum() >= after.compute_s[2:4].sum() >= after.compute_s[4:6].sum()
    assert after.compute_s[6:] == pytest.approx(before.compute_s[6:])
    assert problem.fits(after) == problem.fits(before)


def test_an_exact_milp_whose_plan_is_slower_than_its_objective_is_not_trusted(monkeypatch):
    """If HiGHS hands back a plan slower than its own objective, its bound and 'optimal' status are ignored:
    the result equals one where the exact MILP found nothing."""
    import dataclasses

    import planner.embeddings.shard as shard

    problem = three_identical_nodes_and_one_more(9, 6)
    tables = problem.tables
    c = cluster((small_node(A100, 2), 3), (small_node(V100, 2), 1))
    real = shard.solve

    def broken(problem, bins, **kwargs):
        result = real(problem, bins, **kwargs)
        if bins.aggregated or not kwargs.get("integer"):
            return result
        fake = result.objective_s * 0.5
        return dataclasses.replace(result, status="optimal", objective_s=fake, bound_s=fake)

    def nothing(problem, bins, **kwargs):
        if bins.aggregated or not kwargs.get("integer"):
            return real(problem, bins, **kwargs)
        return dataclasses.replace(real(problem, bins, **kwargs), status="not_solved", objective_s=float("inf"),
                                   bound_s=0.0, assignment=None)

    monkeypatch.setattr(shard, "solve", broken)
    distrusted = shard_tables(tables, c, None, 16384, options=SolverOptions(work=0.1))
    monkeypatch.setattr(shard, "solve", nothing)
    without = shard_tables(tables, c, None, 16384, options=SolverOptions(work=0.1))
    assert distrusted.lower_bound_s == without.lower_bound_s
    assert distrusted.embedding_time_s == without.embedding_time_s
    assert distrusted.proven_optimal == without.proven_optimal


def test_the_guide_without_node_options_chooses_one_other_option_per_table():
    """The extra guide (the class MILP with table-row-wise forbidden) puts no weight on node-wide options and
    one whole option per table, and plans built from it are real plans of the full problem."""
    from planner.embeddings.heuristic import Work, heuristic
    from planner.embeddings.budget import budget
    from planner.embeddings.shard import _guide_without_node_options, _uses_node_options

    c = cluster((small_node(A100, 2), 2), (small_node(V100, 2), 2))
    problem = build_problem(random_tables(np.random.default_rng(11), 6), device_arrays(c), 16384, "adagrad")
    assert any(option.scope == "node" for options in problem.options for option in options)
    guide = _guide_without_node_options(problem, budget(SolverOptions()), 1)
    assert not _uses_node_options(problem, guide)
    for t, row in enumerate(guide):
        assert sum(row) == pytest.approx(1.0)
        assert all(w == 0.0 for o, w in enumerate(row) if problem.options[t][o].scope == "node")
    plan = heuristic(problem, guide, Work(2000))
    assert plan is not None and np.isfinite(problem.makespan_s(plan))
    node_weights = tuple(tuple(1.0 if o == next(j for j, x in enumerate(options) if x.scope == "node") else 0.0
                               for o in range(len(options))) for options in problem.options)
    assert _uses_node_options(problem, node_weights)


def test_rows_load_without_their_zero_coefficients():
    """load_rows drops zero coefficients and moves the later rows' starts back over them; empty rows stay."""
    from planner.embeddings.highs import load_rows, quiet_highs

    highs = quiet_highs()
    highs.addVars(3, np.zeros(3), np.full(3, 10.0))
    inf = float("inf")
    # rows: [x0 + 0 x1], [] (empty), [0 x0 + 2 x2 - x1]
    load_rows(highs, [1.0, -inf, 0.0], [inf, 5.0, inf], [0, 2, 2], [0, 1, 0, 2, 1], [1.0, 0.0, 0.0, 2.0, -1.0])
    lp = highs.getLp()
    assert lp.num_row_ == 3
    matrix = lp.a_matrix_
    entries = {(r, int(matrix.index_[k])): matrix.value_[k]
               for r in range(3) for k in range(matrix.start_[r], matrix.start_[r + 1])}
    assert entries == {(0, 0): 1.0, (2, 2): 2.0, (2, 1): -1.0}


@pytest.mark.parametrize("seed", range(3))
def test_an_lp_no_milp_follows_adds_only_violated_floors_and_keeps_the_value_of_every_floor(seed):
    """An LP that no MILP follows (``milp_checks`` gives none) writes a table's floor (f2) only once its
    solution violates it. Its value is the LP's with every floor, although it leaves most floors out on 4
    nodes of 8 A100s and 40 tables; it reports the rows of the model with every floor (model_rows), and a MILP
    re-solved from it gets the floors it left out. With checks for a MILP, the LP has every floor."""
    rng = np.random.default_rng(seed)
    tables = tuple(EmbeddingTable(f"t{i}", int(10 ** rng.uniform(2, 8)), int(rng.choice([16, 64, 128])),
                                  float(rng.choice([1, 20, 100]))) for i in range(40))
    problem = build_problem(tables, device_arrays(cluster((A100, 4))), 65536, "adagrad")
    sizes = []
    lazy = solve(problem, class_bins(problem), integer=False, keep=True,
                 milp_checks=lambda rows: sizes.append(rows) or 0)
    left_out = len(lazy.handle.floors[1])
    assert 0 < left_out < len(tables)  # some floors bind here, most do not
    full = solve(problem, class_bins(problem), integer=False, keep=True, milp_checks=lambda rows: 20)
    assert full.handle.floors is None
    assert lazy.objective_s == pytest.approx(full.objective_s, rel=1e-9)
    assert sizes == [model_rows(lazy)] and model_rows(lazy) == model_rows(full) == int(full.handle.highs.getNumRow())
    # the re-solves' pricing (Devex) is not left on for the MILP re-solved from the kept model
    strategy = "simplex_dual_edge_weight_strategy"
    assert _option(lazy.handle.highs, strategy) == _option(full.handle.highs, strategy)
    resolve_integer(problem, lazy, work_limit=20)
    assert int(lazy.handle.highs.getNumRow()) == model_rows(full)


def _option(highs, name: str):
    value = highs.getOptionValue(name)
    return value[1] if isinstance(value, tuple) else value


def test_moving_rows_keeps_each_row_whole():
    from planner.embeddings.milp import _Model

    lp = _Model()
    columns = [lp.var(f"x{i}", 0, None) for i in range(4)]
    rows = [((0, 1), (1.0, 2.0), 0.0, 1.0), ((2,), (3.0,), 1.0, 2.0), ((1, 2, 3), (4.0, 5.0, 6.0), 2.0, 3.0),
            ((3,), (7.0,), 3.0, 4.0), ((0, 3), (8.0, 9.0), 4.0, 5.0)]
    for row in rows:
        lp.row(*row)
    lp.move_rows(3, 1)  # rows 3 and 4 go ahead of rows 1 and 2
    got = [(tuple(lp.index[lp.starts[r]:(lp.starts + [len(lp.index)])[r + 1]]),
            tuple(lp.values[lp.starts[r]:(lp.starts + [len(lp.index)])[r + 1]]), lp.row_lower[r], lp.row_upper[r])
           for r in range(lp.rows)]
    assert got == [rows[0], rows[3], rows[4], rows[1], rows[2]] and len(columns) == 4


def test_fit_checks_carry_over_to_the_kept_options():
    """build_problem drops the options that fit nowhere and renumbers the rest; the fit checks it made carry over
    under the new numbers and agree with a fresh problem's own checks."""
    c = cluster((small_node(A100, 2, GiB), 1), (small_node(V100, 2, GiB), 1))
    tables = (EmbeddingTable("big", 3_000_000, 64, 4.0), EmbeddingTable("small", 1_000, 16, 20.0))
    dev = device_arrays(c)
    problem = build_problem(tables, dev, 4096, "adagrad")
    offered = build_options(0, tables[0], dev, 4096, "adagrad", False)
    assert len(problem.options[0]) < len(offered)  # table-wise and data-parallel fit nowhere: dropped
    fresh = Problem(problem.tables, dev, 4096, "adagrad", problem.options)
    assert problem._fits
    for (t, o, p), fits in problem._fits.items():
        assert fits == fresh.fits_at(t, o, p)


def _interrupted_at(limit: CheckLimit, reports) -> int | None:
    """Feed ``limit`` one interrupt check per (dual bound, primal bound) report, as HiGHS's callback would: the
    number of the first check it interrupts at (None: it never does)."""
    for number, (dual, primal) in enumerate(reports, 1):
        data_in = SimpleNamespace(user_interrupt=False)
        limit(None, "", SimpleNamespace(mip_dual_bound=dual, mip_primal_bound=primal), data_in, None)
        if data_in.user_interrupt:
            return number
    return None


INF = float("inf")
# checks 1-4: the sub-MIP completing the LP's solution (its own bounds), which finds 8.0; 5-6: the search
# starts, no dual bound yet; 7: the root LP; 8, 9, ...: one per cut round
COMPLETION = [(-INF, INF), (5.0, INF), (6.0, 9.0), (7.0, 8.0)]
ROOT = [(-INF, 8.0), (-INF, 8.0), (5.5, 8.0), (5.6, 8.0), (5.7, 8.0), (5.8, 8.0)]


def test_a_check_limit_with_root_rounds_stops_after_that_many_rounds_of_the_search():
    assert _interrupted_at(CheckLimit(100), COMPLETION + ROOT) is None
    assert _interrupted_at(CheckLimit(100, root_rounds=1), COMPLETION + ROOT) == 8
    assert _interrupted_at(CheckLimit(100, root_rounds=2), COMPLETION + ROOT) == 9
    assert _interrupted_at(CheckLimit(6, root_rounds=1), COMPLETION + ROOT) == 6  # the checks still bound it


def test_a_check_limit_counts_no_round_before_the_search_has_an_incumbent():
    """Without an incumbent when the search starts (the completion found none), only the checks stop it: the
    rounds' guide would be missing."""
    no_incumbent = [(dual, INF) for dual, _ in COMPLETION + ROOT]
    assert _interrupted_at(CheckLimit(100, root_rounds=1), no_incumbent) is None
    assert _interrupted_at(CheckLimit(8, root_rounds=1), no_incumbent) == 8


def test_a_root_only_class_milp_stops_in_its_root_with_an_incumbent_and_a_bound(monkeypatch):
    """The bound stage's class MILP on a model past ROOT_ONLY_MIN_VARIABLES (lowered here) stops after its root
    LP and first cut round, through HiGHS's own callback: it holds an incumbent (the guide) and a bound between
    the LP's and the full MILP's."""
    rng = np.random.default_rng(5)
    tables = tuple(EmbeddingTable(f"t{i}", int(10 ** rng.uniform(2, 8)), int(rng.choice([16, 64, 128])),
                                  float(rng.choice([1, 20, 100]))) for i in range(40))
    problem = build_problem(tables, device_arrays(cluster((A100, 4), (V100, 4))), 65536, "adagrad")
    limits = []

    class Recorded(CheckLimit):
        def __init__(self, *args) -> None:
            super().__init__(*args)
            limits.append(self)

    monkeypatch.setattr(milp, "CheckLimit", Recorded)
    full = resolve_integer(problem, solve(problem, class_bins(problem), integer=False, keep=True), work_limit=500)
    monkeypatch.setattr(milp, "ROOT_ONLY_MIN_VARIABLES", 0)
    relaxed = solve(problem, class_bins(problem), integer=False, keep=True)
    root = resolve_integer(problem, relaxed, work_limit=500, root_only=True)
    assert limits[1].root_rounds == milp.ROOT_ROUNDS and limits[1].bounded == milp.ROOT_ROUNDS + 1
    assert limits[1].seen < limits[0].seen
    assert root.status in ("feasible", "optimal") and root.weights
    assert relaxed.bound_s * (1 - 1e-9) <= root.bound_s <= full.bound_s * (1 + 1e-9)
    assert root.bound_s <= root.objective_s * (1 + 1e-9)
