"""The partition DP's critical-path bound (planner.search.backend) against the event simulation of the
pipeline (planner.cost.schedule): never above it, and lifted by the steady state's hand-offs over slow
links."""

import numpy as np
import pytest

from planner.cost import simulate_pipeline
from planner.search.backend import FIRST, HANDOFFS, bound_matrices, handoff_cycles, segment_sums
from planner.search.partition import score


def one_layer_stages(f, b, c, m, vpp=1, exposure=FIRST, all_forwards_at_pp=True, ep_overlap=False):
    """The bound of P stages holding one layer each, stage k taking f[k], b[k] and sending in c[k]
    (``ep_overlap``: the warm-up of expert-parallel overlap)."""
    P = len(f)
    full = [segment_sums(np.full(P, x)) for x in f], [segment_sums(np.full(P, x)) for x in b]
    sends = [np.full(P, c[k]) if k + 1 < P or vpp > 1 else None for k in range(P)]
    fits = [np.ones((P, P), dtype=bool)] * P
    tails = [np.zeros((P, P))] + [None] * (P - 1)
    S, G = bound_matrices(*full, sends, fits, tails, m, vpp, exposure, all_forwards_at_pp, ep_overlap)
    return score(S, G, tuple(range(P)))[0]


@pytest.mark.parametrize("seed", range(200))
def test_bound_never_exceeds_the_simulated_pipeline(seed):
    rng = np.random.default_rng(seed)
    P = int(rng.integers(2, 7))
    vpp = 1 if seed % 4 else int(rng.integers(2, 4))
    m = P * int(rng.integers(1, 5)) if vpp > 1 else int(rng.integers(1, 25))
    f = rng.uniform(0.1, 2.0, P)
    b = f * rng.uniform(1.5, 3.0, P)
    c = rng.uniform(0.0, 4.0, P) * (10.0 if seed % 3 == 0 else 1.0)
    links = c if vpp > 1 else np.append(c[:-1], 0.0)
    schedule = "interleaved" if vpp > 1 else "1f1b"
    for everything in (False, True):  # the runtime's warm-up where m = P (planner.cost.schedule)
        simulated = simulate_pipeline(f, b, m, schedule, vpp, links, record_events=False,
                                      all_forwards_at_pp=everything).iteration_time_s
        for exposure in (FIRST, HANDOFFS):
            assert one_layer_stages(f, b, c, m, vpp, exposure, everything) <= simulated * (1 + 1e-12)
            # the default warm-up (every forward first) holds under either schedule
            assert one_layer_stages(f, b, c, m, vpp, exposure) <= simulated * (1 + 1e-12)


def test_the_runtime_warm_up_lifts_the_bound_where_m_equals_the_stages():
    """Megatron-Core warms up 2 (P - s - 1) + (V - 1) P chunks at m = P, not every forward: stage P - 1 then
    runs forwards after its first backward, which the bound counts (planner.search.interleave.warmup)."""
    f, b, c = [1.0] * 4, [2.0] * 4, [0.0] * 4
    simulated = simulate_pipeline(f, b, 4, "interleaved", 2, c, record_events=False).iteration_time_s
    weak, strong = (one_layer_stages(f, b, c, 4, 2, FIRST, flag) for flag in (True, False))
    assert weak < strong <= simulated * (1 + 1e-12)


def test_slow_link_bounds_the_steady_state():
    """Two stages, f 1, b 2, a 5 s link, 9 micro-batches: the simulation takes (m + 1)(f + b + c) = 80 s;
    the bound counts the fill (2 (f + b) + 2c = 16) and four hand-off cycles of 2c + f + b on one side
    (52), where the link-blind bound had (m - 1) b + (m - 2) f = 23; with both sides, all of it."""
    assert simulate_pipeline([1, 1], [2, 2], 9, "1f1b", 1, [5, 0], record_events=False).iteration_time_s == 80
    assert one_layer_stages([1.0, 1.0], [2.0, 2.0], [5.0, 0.0], 9) == pytest.approx(68.0)
    # half on the largest G (52), half on the mean of the links' whole chains, both stages' f + b in each
    # cycle (here one link: 64, and 16 + 64 is the simulation's 80)
    assert one_layer_stages([1.0, 1.0], [2.0, 2.0], [5.0, 0.0], 9, exposure=HANDOFFS) == pytest.approx(74.0)


def test_slow_link_bounds_the_interleaved_steady_state():
    """Two stages of two chunks, f 1, b 2, a 5 s link, 8 micro-batches: stage 0 warms up with 4 chunks and
    stage 1 with 2, so a hand-off cycle spans 3 backward chunks and 4 of them fit; the link-blind bound
    was 45.5 against the simulated 99.5."""
    assert simulate_pipeline([1, 1], [2, 2], 8, "interleaved", 2, [5, 5], record_events=False).iteration_time_s == 99.5
    assert handoff_cycles(2, 8, 2) == [(4, 3)]
    assert one_layer_stages([1.0, 1.0], [2.0, 2.0], [5.0, 5.0], 8, vpp=2) == pytest.approx(73.5)
