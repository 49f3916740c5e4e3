"""The search against exhaustive enumeration of the same space, on seeded random small instances."""

import dataclasses

import numpy as np
import pytest

from planner.rules import unit_flags
from planner.search import engine
from planner.search.interleave import partition_allowed
from planner.search.space import Pins
from search_synthetic import SyntheticBackend
from tests.search_fixtures import cluster, random_model
from tests.solvers.exhaustive import enumerate_best

# (layers, cluster groups (device, devices per node, nodes), global batch, pins); pins keep the enumeration
# of the larger instances within seconds (the search runs under the same pins)
CASES = [
    (4, (("mid", 2, 1), ("slow", 2, 1)), 8, Pins()),
    (6, (("fast", 4, 1), ("slow", 2, 2)), 16, Pins()),
    (8, (("fast", 8, 1), ("slow", 8, 1)), 8, Pins(micro_batch=1, recompute="none", sequence_parallel=False, zero=0)),
    (8, (("fast", 2, 2), ("mid", 2, 2), ("slow", 4, 2)), 16,
     Pins(micro_batch=1, zero=1, recompute="selective", sequence_parallel=False, schedule="1f1b")),
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


def _with_ends(model):
    """The model with its first layer an embedding and its last a head (not pipeline units)."""
    layers = list(model.layers)
    layers[0] = dataclasses.replace(layers[0], kind="embedding")
    layers[-1] = dataclasses.replace(layers[-1], kind="head")
    return dataclasses.replace(model, layers=tuple(layers))


def _both(model, ends: bool, groups, global_batch: int, pins: Pins):
    """The model's pipeline units, the exhaustive optimum and the search's outcome on ``groups``."""
    model = _with_ends(model) if ends else model
    units = unit_flags([layer.kind for layer in model.layers])
    c = cluster(*groups)
    backend = SyntheticBackend(model, c)
    layers = len(model.layers)
    return units, enumerate_best(backend, c, layers, global_batch, pins, units), \
        engine.run(backend, c, layers, global_batch, pins, units=units)


# (layers, cluster groups, global batch, pins, model seed, embedding/head ends): instances whose exhaustive
# optimum interleaves (vpp > 1), on one and on two device types
VPP_CASES = [
    (8, (("mid", 2, 2),), 16, Pins(), 1, False),
    (8, (("mid", 2, 2),), 16, Pins(), 2, True),
    (8, (("mid", 2, 2),), 16, Pins(), 3, True),
    (8, (("mid", 2, 2), ("slow", 2, 2)), 32, Pins(recompute="none", sequence_parallel=False), 1, False),
    (8, (("mid", 2, 2), ("slow", 2, 2)), 32, Pins(recompute="none", sequence_parallel=False, zero=1), 2, False),
]


@pytest.mark.parametrize("case", range(len(VPP_CASES)))
def test_search_finds_interleaved_optima(case):
    layers, groups, global_batch, pins, seed, ends = VPP_CASES[case]
    units, truth, found = _both(random_model(seed, layers), ends, groups, global_batch, pins)
    assert truth.best_spec.vpp > 1  # the case exercises interleaving
    assert found.candidates[0].time_s == pytest.approx(truth.best_time_s, rel=1e-9)
    assert found.candidates[0].settings.vpp == truth.best_spec.vpp
    assert found.bound_violations == 0 and found.proven_optimal
    assert partition_allowed(units, found.candidates[0].last_layers, found.candidates[0].settings.vpp)


def _compute_heavy(model, factor: float):
    """The model with ``factor`` times the FLOPs per layer (same parameters and activations)."""
    return dataclasses.replace(model, layers=tuple(dataclasses.replace(layer, flops_forward=layer.flops_forward * factor)
                                                   for layer in model.layers))


# (layers, cluster groups, global batch, pins, model seed): compute-heavy models whose exhaustive optimum is
# one stage with replicas on two device types (heterogeneous data parallelism)
HETERO_CASES = [
    (6, (("fast", 4, 1), ("mid", 4, 1)), 16, Pins(), 0),
    (6, (("mid", 2, 2), ("slow", 2, 2)), 32, Pins(recompute="none", sequence_parallel=False), 1),
]


@pytest.mark.parametrize("case", range(len(HETERO_CASES)))
def test_search_finds_heterogeneous_data_parallel_optima(case):
    layers, groups, global_batch, pins, seed = HETERO_CASES[case]
    model = _compute_heavy(random_model(seed, layers, scale=0.1), 10.0)
    c = cluster(*groups)
    backend = SyntheticBackend(model, c)
    truth = enumerate_best(backend, c, layers, global_batch, pins)
    found = engine.run(backend, c, layers, global_batch, pins)
    assert len(truth.best_spec.stages[0].replicas) == 2  # the case exercises heterogeneous replicas
    best = found.candidates[0]
    assert best.time_s == pytest.approx(truth.best_time_s, rel=1e-9)
    assert len(best.spec.stages[0].replicas) == 2 and best.groups
    assert found.bound_violations == 0 and found.proven_optimal
    assert backend.evaluate(best.spec).feasible


# (layers, cluster groups, global batch, pins, model seed, scale, embedding/head ends, what the optimum shows):
# an optimum interleaving more than four chunks per stage, and one whose stages hold different layer counts
WIDE_CASES = [
    (26, (("mid", 2, 1),), 16, Pins(recompute="none", sequence_parallel=False, micro_batch=1, tp=1, dp=1), 1, 0.15,
     True, "vpp > 4"),
    (12, (("mid", 4, 1),), 16, Pins(recompute="none", sequence_parallel=False, micro_batch=1, tp=1, dp=1), 2, 0.5,
     False, "uneven"),
]


@pytest.mark.parametrize("case", range(len(WIDE_CASES)))
def test_search_covers_wide_interleaving_and_uneven_stages(case):
    """The search's space holds every vpp the rules allow (beyond four) and stages of their own layer counts:
    it finds the exhaustive optimum there, and its lower bound stays at or below every plan."""
    layers, groups, global_batch, pins, seed, scale, ends, shows = WIDE_CASES[case]
    _, truth, found = _both(random_model(seed, layers, scale=scale), ends, groups, global_batch, pins)
    sizes = [s.last_layer - s.first_layer + 1 for s in truth.best_spec.stages]
    assert truth.best_spec.vpp > 4 if shows == "vpp > 4" else len(set(sizes)) > 1  # the case shows it
    assert found.candidates[0].time_s == pytest.approx(truth.best_time_s, rel=1e-9)
    assert found.lower_bound_s <= truth.best_time_s * (1 + 1e-9)
    assert found.bound_violations == 0 and found.proven_optimal
