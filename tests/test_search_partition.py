"""The partition DP against brute force and against the ILP, on seeded random instances."""

import itertools

import numpy as np
import pytest

from planner.search.backend import segment_sums
from planner.search.partition import partitions_below, score, solve_partition, stage_bounds
from tests.solvers.ilp import solve_partition_ilp


def random_instance(seed: int, max_layers: int = 8):
    rng = np.random.default_rng(seed)
    L = int(rng.integers(1, max_layers + 1))
    P = int(rng.integers(1, L + 1))
    S = np.full((P, L, L), np.inf)
    G = np.full((P, L, L), np.inf)
    for k in range(P):
        s = segment_sums(rng.uniform(0.5, 2, L)) * rng.uniform(0.5, 2)
        g = segment_sums(rng.uniform(0, 3, L)) * rng.integers(0, 20)
        S[k] = np.where(np.isnan(s), np.inf, s)
        G[k] = np.where(np.isnan(g), np.inf, g)
        S[k][rng.random((L, L)) < 0.15] = np.inf  # segments that do not fit
    return S, G


def brute_force(S, G) -> float:
    P, L, _ = S.shape
    best = np.inf
    for cuts in itertools.combinations(range(L - 1), P - 1):
        last = (*cuts, L - 1)
        if all(np.isfinite(S[k, i, j]) for k, (i, j) in enumerate(stage_bounds(last))):
            best = min(best, score(S, G, last)[0])
    return best


@pytest.mark.parametrize("seed", range(60))
def test_dp_equals_brute_force(seed):
    S, G = random_instance(seed)
    expected = brute_force(S, G)
    got = solve_partition(S, G)
    if not np.isfinite(expected):
        assert got is None
    else:
        assert got is not None
        assert got.objective == pytest.approx(expected, rel=1e-12)
        assert score(S, G, got.last_layers)[0] == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("seed", range(8))
def test_dp_and_ilp_agree(seed):
    S, G = random_instance(1000 + seed, max_layers=7)
    dp = solve_partition(S, G)
    ilp = solve_partition_ilp(S, G, time_limit_s=20)
    if dp is None:
        assert ilp is None
    else:
        assert ilp is not None and ilp.proven
        assert ilp.objective == pytest.approx(dp.objective, rel=1e-6)


def test_cutoff_prunes_only_what_cannot_win():
    S, G = random_instance(7)
    best = solve_partition(S, G)
    assert best is not None
    assert solve_partition(S, G, cutoff=best.objective) is None
    again = solve_partition(S, G, cutoff=best.objective * 1.001 + 1e-9)
    assert again is not None and again.objective == pytest.approx(best.objective)


@pytest.mark.parametrize("seed", range(40))
def test_partitions_below_equals_brute_force(seed):
    """Every partition below the cutoff under each (S, G) pair, none other; None past the node limit."""
    rng = np.random.default_rng(900 + seed)
    P = int(rng.integers(1, 5))
    L = int(rng.integers(P, 9))
    pairs = []
    for _ in range(int(rng.integers(1, 3))):
        allowed = np.triu(np.ones((L, L), dtype=bool)) & (rng.uniform(size=(L, L)) > 0.1)
        pairs.append((np.where(allowed[None], rng.uniform(0, 1, (P, L, L)), np.inf), rng.uniform(0, 3, (P, L, L))))
    cutoff = float(rng.uniform(1, 6))
    want = [(*cuts, L - 1) for cuts in itertools.combinations(range(L - 1), P - 1)
            if all(score(S, G, (*cuts, L - 1))[0] < cutoff for S, G in pairs)]
    found, nodes = partitions_below(pairs, cutoff, 10 ** 6)
    assert sorted(found) == want and nodes >= len(want)
    if want and P > 1:
        assert partitions_below(pairs, cutoff, 1) == (None, 1)
