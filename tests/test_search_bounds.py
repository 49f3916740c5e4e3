"""The pruning bounds against brute force: every block bound, corner bound and settings bound is at most the
least iteration time of the plans it covers (every order of the pools, every layer partition), on seeded
random instances whose small first and last layers exercise the core-layer count; and the work budget."""

import dataclasses
import itertools

import numpy as np
import pytest

from planner.search import engine
from planner.search.bounds import Profiles, layout_floor, lower_bounds, position_count_bound
from planner.search.interleave import partition_allowed, pipeline_allowed, schedule_for
from planner.search.partition import score
from planner.search.space import Layout, Pins, Settings, StageOption, ordered_layouts
from planner.solver import SolverOptions
from search_synthetic import SyntheticBackend
from tests.search_fixtures import cluster, random_model


def model_with_small_ends(seed: int, layers: int, scale: float):
    """A random model whose first and last layers are small (an embedding and a head)."""
    model = random_model(seed, layers, scale=scale)
    small = [dataclasses.replace(model.layers[i], params=model.layers[i].params // 20,
                                 flops_forward=model.layers[i].flops_forward / 20) for i in (0, layers - 1)]
    return dataclasses.replace(model, layers=(small[0], *model.layers[1:-1], small[1]))


def best_time(backend, settings: Settings, options, counts, layers: int, global_batch: int) -> float:
    """The least bound-model time (sum S + max G, what the synthetic backend times) over every order
    of the blocks and every partition (interleaved: every stage whole chunks of layers): inf when none fits."""
    blocks = [(o.pool, o.tp, c) for o, c in zip(options, counts)]
    return min(layout_time(backend, settings, layout, layers, global_batch) for layout in ordered_layouts(blocks))


def layout_time(backend, settings: Settings, layout, layers: int, global_batch: int) -> float:
    """The least bound-model time of one layout over its partitions (inf when none fits)."""
    best = np.inf
    S, G = backend.stage_matrices(layout, settings, global_batch)
    for cuts in itertools.combinations(range(layers - 1), layout.num_stages - 1):
        if partition_allowed((1,) * layers, (*cuts, layers - 1), settings.vpp):
            best = min(best, score(S, G, (*cuts, layers - 1))[0])
    return best


def instance(seed: int):
    rng = np.random.default_rng(seed)
    layers = int(rng.integers(4, 8))
    model = model_with_small_ends(seed, layers, scale=float(rng.choice([0.3, 1.0, 3.0])))
    c = cluster(("fast", 2, 2), ("slow", 2, 2))
    settings = Settings(micro_batch=1, dp=int(rng.choice([1, 2])), zero=int(rng.integers(0, 2)),
                        recompute=str(rng.choice(["none", "full"])), sequence_parallel=False)
    global_batch = int(rng.choice([4, 8, 16])) * settings.dp
    return model, c, settings, global_batch, layers


@pytest.mark.parametrize("seed", range(8))
def test_block_and_corner_bounds_never_exceed_the_optimum(seed):
    model, c, settings, global_batch, layers = instance(seed)
    backend = SyntheticBackend(model, c)
    profiles = Profiles(backend)
    options = [StageOption(0, 1), StageOption(1, 2)]
    caps = [min(layers, c.groups[o.pool].num_devices // (o.tp * settings.dp)) for o in options]
    m = settings.num_micro_batches(global_batch)
    plist = [profiles.get(o, settings) for o in options]
    corner = lower_bounds(plist, np.array([caps]), m, corners=True)[0]
    checked = 0
    for counts in itertools.product(*[range(0, cap + 1) for cap in caps]):
        if not 0 < sum(counts) <= layers:
            continue
        used = [i for i, n in enumerate(counts) if n]
        truth = best_time(backend, settings, [options[i] for i in used], [counts[i] for i in used], layers,
                          global_batch)
        bound = lower_bounds(plist, np.array([counts]), m)[0]
        assert bound <= truth * (1 + 1e-9), (counts, bound, truth)
        if all(counts):  # the corner covers the counts of its own choice (both options)
            assert corner <= truth * (1 + 1e-9), (counts, corner, truth)
        checked += np.isfinite(truth)
    assert checked  # some plan fits, so the check above compared numbers


def check_interleaved_and_box_bounds(seed: int) -> int:
    """Block bounds of the interleaved schedule (its stages' larger in-flight memory, whole chunks of layers
    per stage), each layout's floor (the block's bound with the layout's least transfers) and box bounds (a choice's counts from ``lows`` to its corner: the layers every stage holds
    taken at the least counts) stay at or below every plan they cover; returns the plans that fit."""
    rng = np.random.default_rng(500 + seed)
    layers = int(rng.integers(4, 9))
    model = model_with_small_ends(seed, layers, scale=float(rng.choice([1.0, 3.0, 6.0])))
    c = cluster(("fast", 4, 2), ("slow", 4, 2))
    vpp = int(rng.choice([1, 2, 3]))
    settings = Settings(micro_batch=1, dp=1, zero=0, recompute=str(rng.choice(["none", "full"])),
                        sequence_parallel=False, schedule=schedule_for(vpp), vpp=vpp)
    global_batch = int(rng.choice([4, 6, 8, 12]))
    m = settings.num_micro_batches(global_batch)
    backend = SyntheticBackend(model, c)
    profiles = Profiles(backend)
    options = [StageOption(0, 1), StageOption(1, 1)]
    plist = [profiles.get(o, settings) for o in options]
    caps = [min(layers // vpp, 4), min(layers // vpp, 4)]
    truths = {}
    for counts in itertools.product(*[range(1, cap + 1) for cap in caps]):
        P = sum(counts)
        if P * vpp > layers or (vpp > 1 and (P < 2 or not pipeline_allowed(P, m, vpp, layers))):
            continue
        bound = lower_bounds(plist, np.array([counts]), m, vpp=vpp)[0]
        times = []
        for layout in ordered_layouts([(o.pool, o.tp, n) for o, n in zip(options, counts)]):
            times.append(layout_time(backend, settings, layout, layers, global_batch))
            floor = layout_floor(profiles, layout, settings, m, bound)  # the block's bound with its transfers
            assert bound <= floor <= times[-1] * (1 + 1e-9), (counts, layout, bound, floor, times[-1])
        truths[counts] = truth = min(times)
        assert bound <= truth * (1 + 1e-9), (counts, bound, truth)
    for lows in itertools.product(*[range(1, cap + 1) for cap in caps]):
        highs = tuple(int(rng.integers(lo, cap + 1)) for lo, cap in zip(lows, caps))
        covered = [t for counts, t in truths.items() if all(lo <= n <= hi for lo, n, hi in zip(lows, counts, highs))]
        box = lower_bounds(plist, np.array([highs]), m, corners=True, vpp=vpp, lows=np.array([lows]))[0]
        assert box <= min(covered, default=np.inf) * (1 + 1e-9), (lows, highs, box, covered)
    return sum(bool(np.isfinite(t)) for t in truths.values())


def test_interleaved_and_box_bounds_never_exceed_the_optimum():
    fitted = [check_interleaved_and_box_bounds(seed) for seed in range(12)]
    assert sum(fitted) >= 12  # plans fit on most instances, so the checks compared numbers


@pytest.mark.parametrize("seed", range(6))
def test_settings_bound_never_exceeds_the_optimum(seed):
    model, c, settings, global_batch, layers = instance(seed)
    backend = SyntheticBackend(model, c)
    profiles = Profiles(backend)
    bound = engine.settings_bound(profiles, c, settings, layers, global_batch, Pins(), 0.0, layers)
    truth = np.inf
    options = [StageOption(p, tp) for p in (0, 1) for tp in (1, 2) if tp * settings.dp <= c.groups[p].num_devices]
    for a, b in itertools.product([None, *[o for o in options if o.pool == 0]], [None, *[o for o in options
                                                                                           if o.pool == 1]]):
        chosen = [o for o in (a, b) if o is not None]
        if not chosen:
            continue
        for counts in itertools.product(*[range(1, min(layers, c.groups[o.pool].num_devices // (o.tp * settings.dp))
                                                + 1) for o in chosen]):
            if sum(counts) <= layers:
                truth = min(truth, best_time(backend, settings, chosen, counts, layers, global_batch))
    assert bound <= truth * (1 + 1e-9)


def test_budget_is_deterministic_and_never_ends_without_a_plan():
    model = random_model(5, 8)
    c = cluster(("fast", 2, 2), ("mid", 2, 2), ("slow", 4, 2))
    backend = SyntheticBackend(model, c)
    full = engine.run(backend, c, 8, 16, Pins())
    for budget in (1, 200, 2000):
        first = engine.run(SyntheticBackend(model, c), c, 8, 16, Pins(), budget=budget)
        again = engine.run(SyntheticBackend(model, c), c, 8, 16, Pins(), budget=budget)
        assert first.candidates  # a plan exists, so a limit never ends the search without one
        assert [x.time_s for x in first.candidates] == [x.time_s for x in again.candidates]
        assert (first.work, first.lower_bound_s, first.proven_optimal) == \
            (again.work, again.lower_bound_s, again.proven_optimal)
        assert first.candidates[0].time_s >= full.candidates[0].time_s
        assert first.lower_bound_s <= full.candidates[0].time_s * (1 + 1e-9)
        if first.timed_out:
            assert not first.proven_optimal
    assert engine.run(backend, c, 8, 16, Pins(), time_limit_s=1e-9).candidates


def test_work_limits_the_search_and_a_budget_caps_it_further():
    """SolverOptions.work scales the work limit (engine.DEFAULT_WORK_UNITS x work): a small work stops the search
    there with a plan that is not proven optimal, and of the work limit and an explicit budget the smaller
    applies."""
    model = random_model(5, 8)
    c = cluster(("fast", 2, 2), ("mid", 2, 2), ("slow", 4, 2))

    def run(**limits):
        return engine.run(SyntheticBackend(model, c), c, 8, 16, Pins(), **limits)

    whole = run()
    assert not whole.timed_out and whole.proven_optimal and whole.work < engine.DEFAULT_WORK_UNITS
    limit = whole.work // 4
    little = SolverOptions(work=limit / engine.DEFAULT_WORK_UNITS)
    short = run(options=little)
    assert short.timed_out and not short.proven_optimal and short.candidates
    assert limit <= short.work < whole.work
    assert short.lower_bound_s <= whole.candidates[0].time_s * (1 + 1e-9) <= short.candidates[0].time_s * (1 + 1e-9)
    assert run(budget=limit).work == run(budget=limit, options=SolverOptions(work=2.0)).work == short.work
    assert run(budget=10 * whole.work, options=little).work == short.work


@pytest.mark.parametrize("work,units", [(1.0, engine.DEFAULT_WORK_UNITS), (0.5, engine.DEFAULT_WORK_UNITS // 2),
                                        (1e-12, 1), (1e308, None)])
def test_work_limit_in_units(work, units):
    """The nearest whole number of units, at least one; none when the work is past any count."""
    assert engine.Limits.of(None, None, SolverOptions(work=work)).units == units


@pytest.mark.parametrize("seed", range(20))
def test_one_row_layer_count_equals_the_vectorised_one(seed):
    """The scalar path of one row (settings bounds) gives the vectorised path's value."""
    from planner.search.bounds import count_tables, layer_count_bound

    rng = np.random.default_rng(seed)
    O, L = int(rng.integers(1, 5)), int(rng.integers(2, 12))
    fwd, bwd = rng.uniform(0.1, 1, (O, L)), rng.uniform(0.2, 2, (O, L))
    static, act, peak = rng.uniform(0, 0.3, (O, L)), rng.uniform(0, 0.1, (O, L)), rng.uniform(0, 0.2, (O, L))
    counts = rng.integers(0, 5, (1, O))
    counts[0, 0] = max(1, counts[0, 0])
    pools = rng.integers(0, 2, O)
    m = int(rng.integers(1, 20))
    tables = count_tables(fwd, bwd, static, act, peak, np.ones(L, dtype=bool), counts.max(axis=0), m)
    total = np.array([int(counts.sum())])
    floor = np.array([float(rng.uniform(0, 5))])
    one = layer_count_bound(tables, np.arange(O), counts, pools, total, m, floor)
    two = layer_count_bound(tables, np.arange(O), np.repeat(counts, 2, axis=0), pools, np.repeat(total, 2), m,
                            np.repeat(floor, 2))
    assert one[0] == two[0] == two[1]


@pytest.mark.parametrize("seed", range(40))
def test_closed_form_count_bound_equals_the_bisection(seed):
    """Without a memory limit, the closed form of the quick settings bound gives the layer-count bound's
    value exactly (one to three pools, ties in the layer times, interleaved weights)."""
    from planner.search.bounds import CountTables, compute_count_bound, layer_count_bound

    rng = np.random.default_rng(seed)
    O, size = int(rng.integers(1, 6)), int(rng.integers(1, 20))
    bwd, fwd = rng.random((O, size)) * rng.choice([1, 3], size=(O, 1)), rng.random((O, size))
    if seed % 3 == 0:  # ties
        bwd, fwd = np.round(bwd, 1), np.round(fwd, 1)
    sb = np.concatenate([np.zeros((O, 1)), np.cumsum(np.sort(bwd, axis=1), axis=1)], axis=1)
    sf = np.concatenate([np.zeros((O, 1)), np.cumsum(np.sort(fwd, axis=1), axis=1)], axis=1)
    caps, pools = rng.integers(0, 6, O), rng.integers(0, int(rng.integers(1, 4)), O)
    caps[0] = max(1, caps[0])
    m, vpp, P = int(rng.integers(1, 12)), int(rng.choice([1, 1, 2, 3])), int(rng.integers(1, 12))
    lo = float(rng.random() * 3)
    unlimited = CountTables(size, sb, sf, tuple(np.full(int(c), size) for c in caps),
                            tuple(np.arange(int(c) + 1) * size for c in caps))
    bisected = layer_count_bound(unlimited, np.arange(O), caps[None, :], pools, np.array([P]), m, np.array([lo]), vpp)
    assert compute_count_bound(size, sb, sf, caps, pools, P, m, lo, vpp) == float(bisected[0])


@pytest.mark.parametrize("seed", range(30))
def test_layer_count_stop_keeps_values_below_it(seed):
    """With a stop value, a row's bound is unchanged when it is below the stop, and otherwise between the
    stop and the full bound (still a lower bound, still pruned by a cutoff at the stop)."""
    from planner.search.bounds import count_tables, layer_count_bound

    rng = np.random.default_rng(100 + seed)
    O, L = int(rng.integers(1, 5)), int(rng.integers(2, 12))
    fwd, bwd = rng.uniform(0.1, 1, (O, L)), rng.uniform(0.2, 2, (O, L))
    static, act, peak = rng.uniform(0, 0.3, (O, L)), rng.uniform(0, 0.1, (O, L)), rng.uniform(0, 0.2, (O, L))
    counts = rng.integers(0, 5, (1, O))
    counts[0, 0] = max(1, counts[0, 0])
    pools, m = rng.integers(0, 2, O), int(rng.integers(1, 20))
    tables = count_tables(fwd, bwd, static, act, peak, np.ones(L, dtype=bool), counts.max(axis=0), m)
    args = (tables, np.arange(O), counts, pools, np.array([int(counts.sum())]), m, np.array([0.0]))
    full = float(layer_count_bound(*args)[0])
    stops = (0.0, 0.5 * full, full * (1 - 1e-9), full, 2 * full, float(rng.uniform(0, 3 * full))) \
        if np.isfinite(full) else (0.0, 1.0, 1e6)  # inf: the stages cannot hold the layers
    for stop in stops:
        value = float(layer_count_bound(*args, 1, stop)[0])
        assert value == full if full < stop else stop <= value <= full


def test_in_flight_counts_by_hand():
    """1F1B: stage k of P holds min(P - k, m); interleaved (P = 4, m = 8, vpp = 2): stage k warms up
    2 (P - k - 1) + (vpp - 1) P chunks, holds one more, each half a stage's activations."""
    from planner.search.bounds import in_flight_ascending

    assert in_flight_ascending(5, 3).tolist() == [1, 2, 3, 3, 3]
    assert in_flight_ascending(4, 8, 2).tolist() == [2.5, 3.5, 4.5, 5.5]


def test_neighbouring_groups_of_one_node_plan_as_one_pool():
    """Racks of one node type listed apart are one pool to the search (a stage spans at most two pools), so
    they plan as the shorthand with their count does; the plan still lists the groups as given."""
    import planner
    from planner.builders import build
    from planner.graph import import_model_proto

    model = import_model_proto(build("gpt", {"layers": 4, "hidden": 64, "heads": 2, "vocab": 128, "seq_len": 64}),
                               {"batch": 1})
    apart = planner.plan(model, planner.load_cluster("+".join(["dgx-a100-80gb*1"] * 4)), global_batch=64)
    together = planner.plan(model, planner.load_cluster("dgx-a100-80gb*4"), global_batch=64)
    assert apart.iteration_time_s == together.iteration_time_s and apart.search.proven_optimal
    assert [s.devices for s in apart.stages] == [s.devices for s in together.stages]
    assert len(apart.cluster["groups"]) == 4


def test_groups_of_one_node_listed_apart_plan_as_one_pool():
    """Groups of one node with another type between them are moved next to each other for the search (a
    pool's devices run in one block of ids), so they plan as if listed together; the plan names the devices
    by their ids as listed, each stage on devices of its own type."""
    import planner
    from planner.hardware.cluster import arranged, locate

    cluster = planner.load_cluster("dgx-h100*1+dgx-a100-80gb*1+dgx-h100*2")
    moved, ids = arranged(cluster)
    assert [g.name for g in moved.groups] == ["dgx-h100", "dgx-h100_2", "dgx-a100-80gb"]
    assert ids == (*range(0, 8), *range(16, 32), *range(8, 16))
    assert arranged(planner.load_cluster("dgx-h100*1+dgx-h100*2+dgx-a100-80gb*1"))[1] is None
    model = planner.load_model("models/llama2-7b.onnx")  # untied: its stages need no all-reduce between them
    listed = planner.load_cluster("dgx-h100*2+dgx-a100-80gb*2+dgx-h100*2")
    apart = planner.plan(model, listed, global_batch=256)
    together = planner.plan(model, planner.load_cluster("dgx-h100*4+dgx-a100-80gb*2"), global_batch=256)
    assert apart.iteration_time_s == pytest.approx(together.iteration_time_s, rel=1e-12)
    assert apart.search.proven_optimal and len(apart.cluster["groups"]) == 3 and len(apart.stages) > 1
    for stage in apart.stages:
        assert {listed.groups[locate(listed, d)[0]].node.device.name for d in stage.devices} == {stage.device_type}
    # re-timed as placed, on the cluster as listed (what `planner estimate --plan` does)
    assert planner.estimate_plan(model, listed, apart).iteration_time_s == pytest.approx(apart.iteration_time_s,
                                                                                          rel=1e-9)


def model_with_heavy_head(seed: int, layers: int, scale: float):
    """A random model whose last layer (a head) does three times a block's work."""
    model = random_model(seed, layers, scale=scale)
    last = model.layers[-1]
    head = dataclasses.replace(last, flops_forward=3 * last.flops_forward)
    return dataclasses.replace(model, layers=(*model.layers[:-1], head))


def position_case(seed: int) -> tuple[float, float, float]:
    """(the layers' least work plus the layout's position count bound, the layout's least bound over its
    partitions, the order-free block bound) of a seeded layout (1F1B, or interleaved on every third seed)."""
    rng = np.random.default_rng(900 + seed)
    layers = int(rng.integers(4, 9))
    scale = float(rng.choice([0.3, 1.0, 3.0]))
    model = (model_with_heavy_head if seed % 2 else model_with_small_ends)(seed, layers, scale)
    c = cluster(("fast", 4, 2), ("slow", 4, 2))
    vpp = 2 if seed % 3 == 0 else 1
    stages = int(rng.integers(2, layers // vpp + 1))
    global_batch = stages * int(rng.choice([1, 2, 4])) if vpp > 1 else int(rng.choice([2, 4, 8, 16]))
    settings = Settings(micro_batch=1, dp=1, zero=int(rng.integers(0, 2)), recompute=str(rng.choice(["none", "full"])),
                        sequence_parallel=False, schedule=schedule_for(vpp), vpp=vpp)
    m = settings.num_micro_batches(global_batch)
    layout = Layout(tuple(StageOption(int(rng.integers(0, 2)), 1) for _ in range(stages)))
    backend = SyntheticBackend(model, c)
    profiles = Profiles(backend)
    distinct = sorted(set(layout.options))
    plist = [profiles.get(o, settings) for o in distinct]
    least = float(np.minimum.reduce([p.forward_s + p.backward_s / vpp for p in plist]).sum())
    bound = least + position_count_bound(profiles, layout, settings, m)
    block = lower_bounds(plist, np.array([[layout.options.count(o) for o in distinct]]), m, vpp=vpp)[0]
    return bound, layout_time(backend, settings, layout, layers, global_batch), block


def test_position_count_bound_never_exceeds_the_layouts_bound():
    """The layer-count bound of a layout's own positions (each stage's delta and in-flight memory, the first
    and last layers on the end stages, whole chunks), on top of the layers' least work, stays at or below the
    layout's least bound over its partitions, is infinite only where no partition fits, and lifts the
    order-free block bound on some layouts."""
    fitted = lifted = 0
    for seed in range(36):
        bound, truth, block = position_case(seed)
        assert bound <= truth * (1 + 1e-9) or np.isinf(truth), (seed, bound, truth)
        fitted += bool(np.isfinite(truth))
        lifted += bool(np.isfinite(truth) and bound > block * (1 + 1e-6))
    assert fitted >= 12 and lifted >= 3, (fitted, lifted)
