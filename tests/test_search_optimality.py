"""The search against exhaustive enumeration of the same space, on seeded random small instances."""

import numpy as np
import pytest

from planner.search import engine
from planner.search.exhaustive import enumerate_best
from planner.search.space import Pins
from search_synthetic import SyntheticBackend
from tests.search_fixtures import cluster, random_model

# (layers, cluster groups (device, devices per node, nodes), global batch, pins); pins keep the enumeration
# of the larger instances within seconds (the search runs under the same pins)
CASES = [
    (4, (("mid", 2, 1), ("slow", 2, 1)), 8, Pins()),
    (6, (("fast", 4, 1), ("slow", 2, 2)), 16, Pins()),
    (8, (("fast", 8, 1), ("slow", 8, 1)), 8, Pins(micro_batch=1, recompute="none", sequence_parallel=False, zero=0)),
    (8, (("fast", 2, 2), ("mid", 2, 2), ("slow", 4, 2)), 16,
     Pins(micro_batch=1, zero=1, recompute="selective", sequence_parallel=False)),
    (5, (("fast", 2, 1), ("mid", 2, 1), ("slow", 2, 2)), 8, Pins(recompute="full")),
]


@pytest.mark.parametrize("case", range(len(CASES)))
@pytest.mark.parametrize("seed", [0, 1])
def test_search_equals_exhaustive_enumeration(case, seed):
    layers, groups, global_batch, pins = CASES[case]
    model = random_model(seed * 100 + case, layers)
    c = cluster(*groups)
    backend = SyntheticBackend(model, c)
    truth = enumerate_best(backend, c, layers, global_batch, pins)
    found = engine.run(backend, c, layers, global_batch, pins)
    if not np.isfinite(truth.best_time_s):
        assert not found.candidates
        return
    assert found.candidates[0].time_s == pytest.approx(truth.best_time_s, rel=1e-9)
    assert found.bound_violations == 0
    assert found.proven_optimal == found.complete_space  # the synthetic model's time is the DP's bound
    assert found.lower_bound_s == pytest.approx(truth.best_time_s, rel=1e-9) or not found.proven_optimal


def test_memory_is_never_exceeded_by_a_returned_plan():
    model = random_model(3, 6, scale=6.0)  # large layers: memory decides
    c = cluster(("mid", 2, 2), ("slow", 2, 2))
    backend = SyntheticBackend(model, c)
    out = engine.run(backend, c, 6, 16, Pins(), top_k=5)
    for cand in out.candidates:
        estimate = backend.evaluate(cand.spec)
        assert estimate.feasible
        assert all(s.memory.total_bytes <= s.memory_capacity_bytes for s in estimate.stages)
