"""The cost-model backend's DP bound against the cost model itself: never above ``estimate_pipeline``,
equal to it for a single stage (where the 1F1B closed form is exact)."""

import itertools

import numpy as np
import pytest

from planner.builders import build
from planner.cost import estimate_pipeline
from planner.graph import import_model_proto
from planner.hardware import load_cluster
from planner.rules import unit_flags
from planner.search.backend import FIRST, MEAN
from planner.search.bounds import Profiles, layout_floor, lower_bounds
from planner.search.costmodel import CostModelBackend
from planner.search.engine import pipeline_spec
from planner.search.interleave import partition_allowed
from planner.search.partition import score
from planner.search.space import Layout, Settings, StageOption


@pytest.fixture(scope="module")
def setup():
    model = import_model_proto(build("gpt", {"layers": 6, "hidden": 1024, "heads": 16, "vocab": 32000,
                                             "seq_len": 512}), {"batch": 1, "seq": 512}, name="gpt6")
    cluster = load_cluster("dgx-a100-80gb*1+hgx-v100-32gb*1")
    return model, cluster, CostModelBackend(model, cluster)


@pytest.mark.parametrize("seed", range(12))
def test_bound_never_exceeds_the_cost_model(setup, seed):
    model, cluster, backend = setup
    rng = np.random.default_rng(seed)
    L = len(model.layers)
    P = int(rng.integers(2, 5))
    options = tuple(StageOption(int(rng.integers(0, 2)), int(rng.choice([1, 2]))) for _ in range(P))
    settings = Settings(micro_batch=int(rng.choice([1, 2])), dp=1, zero=int(rng.integers(0, 2)),
                        recompute=str(rng.choice(["none", "selective", "full"])), sequence_parallel=False)
    layout = Layout(tuple(sorted(options)))
    last = tuple(sorted(rng.choice(np.arange(L - 1), size=P - 1, replace=False))) + (L - 1,)
    _assert_bound_at_most_the_cost_model(model, cluster, backend, settings, layout, last, 16)


@pytest.mark.parametrize("seed", range(8))
def test_bound_with_per_micro_batch_zero_never_exceeds_the_cost_model(setup, seed):
    """ZeRO-2's reduce-scatter and ZeRO-3's gathers run in every micro-batch of every stage; the bound
    counts ZeRO-2's exactly and a lower bound of ZeRO-3's."""
    model, cluster, backend = setup
    rng = np.random.default_rng(200 + seed)
    L = len(model.layers)
    P = int(rng.integers(1, 4))
    options = tuple(StageOption((k + seed) % 2, int(rng.choice([1, 2]))) for k in range(P))  # <= 8 per pool
    settings = Settings(micro_batch=int(rng.choice([1, 2])), dp=2, zero=2 + seed % 2,
                        recompute=str(rng.choice(["none", "selective", "full"])), sequence_parallel=False,
                        runtime=["pytorch-fsdp2", "deepspeed"][seed // 2 % 2])
    layout = Layout(tuple(sorted(options)))
    last = tuple(sorted(rng.choice(np.arange(L - 1), size=P - 1, replace=False))) + (L - 1,)
    _assert_bound_at_most_the_cost_model(model, cluster, backend, settings, layout, last, 16)


@pytest.mark.parametrize("zero", [0, 1, 2])
@pytest.mark.parametrize("pool", [0, 1])
def test_bound_is_exact_for_one_stage(setup, zero, pool):
    model, cluster, backend = setup
    settings = Settings(micro_batch=1, dp=4, zero=zero, recompute="selective", sequence_parallel=False)
    layout = Layout((StageOption(pool, 2),))
    S, G = backend.stage_matrices(layout, settings, 32)
    last = (len(model.layers) - 1,)
    estimate = estimate_pipeline(model, cluster, pipeline_spec(cluster, 32, settings, layout, last))
    assert score(S, G, last)[0] == pytest.approx(estimate.iteration_time_s, rel=1e-9)


@pytest.mark.parametrize("seed", range(10))
def test_interleaved_bound_never_exceeds_the_cost_model(setup, seed):
    model, cluster, backend = setup
    rng = np.random.default_rng(100 + seed)
    L = len(model.layers)
    units = unit_flags([layer.kind for layer in model.layers])
    V, P = [(2, 2), (3, 2), (2, 3)][seed % 3]
    allowed = [(*cuts, L - 1) for cuts in itertools.combinations(range(L - 1), P - 1)
               if partition_allowed(units, (*cuts, L - 1), V)]
    last = allowed[int(rng.integers(len(allowed)))]
    options = tuple(StageOption(int(rng.integers(0, 2)), int(rng.choice([1, 2]))) for _ in range(P))
    settings = Settings(micro_batch=int(rng.choice([1, 2])), dp=1, zero=int(rng.integers(0, 2)),
                        recompute=str(rng.choice(["none", "selective", "full"])), sequence_parallel=False,
                        schedule="interleaved", vpp=V)
    global_batch = settings.micro_batch * P * int(rng.integers(1, 4))
    layout = Layout(options)
    _assert_bound_at_most_the_cost_model(model, cluster, backend, settings, layout, last, global_batch)


def _assert_bound_at_most_the_cost_model(model, cluster, backend, settings, layout, last, global_batch):
    """The partition's bound under each weighting of the stages' synchronisation is finite exactly when the
    cost model accepts the plan, and never above its time."""
    estimate = estimate_pipeline(model, cluster, pipeline_spec(cluster, global_batch, settings, layout, last))
    for exposure in backend.exposures(settings):
        S, G = backend.stage_matrices(layout, settings, global_batch, exposure)
        bound = score(S, G, last)[0]
        if np.isfinite(bound):
            assert estimate.feasible
            assert bound <= estimate.iteration_time_s * (1 + 1e-9)
        else:
            assert not estimate.feasible


@pytest.fixture(scope="module")
def slow_links(tmp_path_factory):
    """The fixture's model on four nodes of two types whose network is 10 GB/s per node: transfers and the
    data-parallel synchronisation are long next to a micro-batch."""
    path = tmp_path_factory.mktemp("slow") / "slow.yaml"
    path.write_text("name: slow\ngroups:\n"
                    "  - {node: dgx-h100, count: 2, inter_node_bandwidth_GBps: 10}\n"
                    "  - {node: dgx-a100-40gb, count: 2, inter_node_bandwidth_GBps: 10}\n")
    model = import_model_proto(build("gpt", {"layers": 6, "hidden": 1024, "heads": 16, "vocab": 32000,
                                             "seq_len": 512}), {"batch": 1, "seq": 512}, name="gpt6")
    cluster = load_cluster(path)
    return model, cluster, CostModelBackend(model, cluster)


@pytest.mark.parametrize("seed", range(16))
def test_bound_over_slow_links_never_exceeds_the_cost_model(slow_links, seed):
    """Every stage's synchronisation (the mean weighting) and the steady state's hand-offs, 1F1B and
    interleaved, on plans whose stages cross nodes and synchronise over them."""
    model, cluster, backend = slow_links
    rng = np.random.default_rng(300 + seed)
    L = len(model.layers)
    units = unit_flags([layer.kind for layer in model.layers])
    layout, settings, global_batch = slow_layout(rng, seed, varied=False)
    P, V = layout.num_stages, settings.vpp
    allowed = [(*cuts, L - 1) for cuts in itertools.combinations(range(L - 1), P - 1)
               if partition_allowed(units, (*cuts, L - 1), V)]
    last = allowed[int(rng.integers(len(allowed)))]
    _assert_bound_at_most_the_cost_model(model, cluster, backend, settings, layout, last, global_batch)


def slow_layout(rng: np.random.Generator, seed: int, varied: bool) -> tuple[Layout, Settings, int]:
    """A seeded layout over the slow links: two stages of a node or both nodes of a type each (a data-parallel
    group across nodes at dp 8, tp 2), or more of a node each, the types alternating; ``varied``: micro-batches
    of 1 or 2, and two one-node stages on one type too. Every third seed interleaves two stages."""
    V = 1 if seed % 3 else 2
    P = int(rng.integers(2, 5)) if V == 1 else 2
    dp, tp = (8, int(rng.choice([1, 2]))) if P == 2 else (int(rng.choice([4, 8])), 0)
    pools = [int(rng.integers(0, 2))] * 2 if varied and P == 2 and tp == 1 else \
        [(k + (seed if varied else 0)) % 2 for k in range(P)]
    micro_batch = int(rng.choice([1, 2])) if varied else 1
    settings = Settings(micro_batch=micro_batch, dp=dp, zero=int(rng.integers(0, 3)),
                        recompute=str(rng.choice(["none", "full"])), sequence_parallel=False,
                        schedule="interleaved" if V > 1 else "1f1b", vpp=V)
    global_batch = dp * micro_batch * P * int(rng.integers(2, 9))
    return Layout(tuple(StageOption(pool, tp or 8 // dp) for pool in pools)), settings, global_batch


def test_later_stages_synchronisation_lifts_the_bound(slow_links):
    """Stage 0 holds the embedding alone and stage 1 the rest with its copy of the tied word embedding, each
    synchronising over two nodes and both all-reducing the tied weight's gradient: the mean weighting, which
    counts stage 1's larger synchronisation too, lifts the bound above stage 0's alone, to within 20% of
    the plan's time."""
    model, cluster, backend = slow_links
    settings = Settings(micro_batch=1, dp=8, zero=1, recompute="none", sequence_parallel=False)
    layout = Layout((StageOption(0, 2), StageOption(1, 2)))
    last = (0, len(model.layers) - 1)
    time_s = estimate_pipeline(model, cluster, pipeline_spec(cluster, 32, settings, layout, last)).iteration_time_s
    first, mean = (score(*backend.stage_matrices(layout, settings, 32, e), last)[0] for e in (FIRST, MEAN))
    assert first < mean <= time_s
    assert mean > 0.8 * time_s


def layout_floor_case(slow_links, seed: int) -> tuple[float, float, float]:
    """(the block's bound, the layout's floor, the least DP bound over the layout's partitions and weightings)
    of a seeded layout over 10 GB/s links."""
    model, cluster, backend = slow_links
    rng = np.random.default_rng(700 + seed)
    L = len(model.layers)
    units = unit_flags([layer.kind for layer in model.layers])
    layout, settings, global_batch = slow_layout(rng, seed, varied=True)
    P, V, options = layout.num_stages, settings.vpp, layout.options
    m = settings.num_micro_batches(global_batch)
    profiles = Profiles(backend)
    distinct = sorted(set(options))
    block = lower_bounds([profiles.get(o, settings) for o in distinct],
                         np.array([[options.count(o) for o in distinct]]), m, vpp=V)[0]
    floor = layout_floor(profiles, layout, settings, m, block)
    least = np.inf
    for cuts in itertools.combinations(range(L - 1), P - 1):
        if partition_allowed(units, (*cuts, L - 1), V):
            least = min(least, max(score(*backend.stage_matrices(layout, settings, global_batch, e),
                                         (*cuts, L - 1))[0] for e in backend.exposures(settings)))
    return block, floor, least


def test_layout_floor_never_exceeds_the_layouts_bound(slow_links):
    """A layout's floor from its block's bound and its least transfers (what the search prunes layouts by
    before building their matrices) is at most the DP bound of every partition of that layout under every
    weighting, and over these slow links the transfers lift it well above the block's bound on some."""
    lifted = 0
    for seed in range(12):
        block, floor, least = layout_floor_case(slow_links, seed)
        assert floor <= least * (1 + 1e-9), (seed, floor, least)
        lifted += floor > 1.05 * block
    assert lifted >= 3


@pytest.mark.parametrize("zero", [0, 1])
@pytest.mark.parametrize("tp, ep", [(2, 8), (1, 4), (2, 2)])
def test_bound_is_exact_for_one_stage_of_experts(zero, tp, ep):
    """The routed experts' gradients are reduced over their own data-parallel group (every ep x expert_tp-th
    rank) where it differs from the stage's: the bound's synchronisation is the cost model's."""
    model = import_model_proto(build("moe", {"layers": 2, "hidden": 256, "heads": 8, "kv_heads": 4, "vocab": 512,
                                             "seq_len": 128, "experts": 8, "top_k": 2, "expert_ffn": 512}),
                               {"batch": 1}, name="moe-test")
    cluster = load_cluster("dgx-h100*2")
    backend = CostModelBackend(model, cluster)
    settings = Settings(micro_batch=1, dp=16 // tp, zero=zero, recompute="none", sequence_parallel=tp > 1, ep=ep,
                        expert_tp=1)
    layout = Layout((StageOption(0, tp),))
    S, G = backend.stage_matrices(layout, settings, 64)
    last = (len(model.layers) - 1,)
    estimate = estimate_pipeline(model, cluster, pipeline_spec(cluster, 64, settings, layout, last))
    assert score(S, G, last)[0] == pytest.approx(estimate.iteration_time_s, rel=1e-9)


@pytest.mark.parametrize("cut", [0, 2, 4])
def test_stage_memory_of_the_search_is_the_cost_models_with_a_tied_head(slow_links, cut):
    """The search's memory of a segment (affine in the micro-batches in flight) is the cost model's, the last
    stage's copy of the tied word embedding included (the fixture's GPT ties its head)."""
    model, cluster, backend = slow_links
    assert model.layers[-1].tied_params
    settings = Settings(micro_batch=1, dp=8, zero=1, recompute="none", sequence_parallel=False)
    layout = Layout((StageOption(0, 2), StageOption(1, 2)))
    last = (cut, len(model.layers) - 1)
    est = estimate_pipeline(model, cluster, pipeline_spec(cluster, 32, settings, layout, last))
    for stage, option, (i, j) in zip(est.stages, layout.options, ((0, cut), (cut + 1, last[1]))):
        fixed, per_micro_batch = backend._memory_of(option, settings, True)
        in_flight = len(est.stages) - stage.index  # 1F1B
        assert stage.memory.total_bytes == pytest.approx(fixed[i, j] + in_flight * per_micro_batch[i, j], rel=1e-9)
