"""Exhaustive enumeration of the search space, for cross-checking the search on small instances.

Every settings (interleaved ones included), every set of pool blocks (any tp per pool, any stage counts),
every order of the pools and every layer partition (whole chunks per stage when interleaved), and every
heterogeneous data-parallel stage (every pair of pools, tp per pool, dp split and micro-batch split) becomes an explicit PipelineSpec timed by the backend's ``evaluate``: no bound, no DP.
The number of plans grows combinatorially; use it with a handful of layers and devices.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Iterator

from planner.search import hetero
from planner.search.backend import Backend
from planner.search.bounds import option_profile
from planner.search.engine import pipeline_spec
from planner.search.interleave import partition_allowed, pipeline_allowed
from planner.search.space import Layout, Pins, Settings, enumerate_settings, max_stages, options_allowed, \
    ordered_layouts, pool_options, settings_allowed
from planner.types import Cluster, Estimate, PipelineSpec


@dataclass(frozen=True)
class Enumerated:
    best_time_s: float  # inf when nothing fits
    best_spec: PipelineSpec | None
    plans: int  # plans timed


def plans(cluster: Cluster, num_layers: int, global_batch: int, pins: Pins, units: tuple[int, ...] | None = None,
          interleave: bool = True) -> Iterator[tuple[Settings, Layout, tuple[int, ...]]]:
    units = tuple(units) if units is not None else (1,) * num_layers
    for settings in enumerate_settings(cluster, global_batch, pins, num_units=sum(units), interleave=interleave):
        m = settings.num_micro_batches(global_batch)
        if not settings_allowed(settings, pins):
            continue
        cap = min(num_layers, max_stages(settings, sum(units), global_batch))
        for choice in itertools.product(*[[None, *opts] for opts in pool_options(cluster, settings, pins)]):
            options = tuple(o for o in choice if o is not None)
            if not options_allowed(settings, options):
                continue
            ranges = [range(1, o.most_stages(cluster, settings.dp) + 1) for o in options]
            for counts in itertools.product(*ranges):
                P = sum(counts)
                if P > min(cap, num_layers) or (pins.pp and P != pins.pp) \
                        or not pipeline_allowed(P, m, settings.vpp, sum(units)):
                    continue
                blocks = [(o.pool, o.tp, c) for o, c in zip(options, counts)]
                for layout in ordered_layouts(blocks):
                    for cuts in itertools.combinations(range(num_layers - 1), P - 1):
                        if partition_allowed(units, (*cuts, num_layers - 1), settings.vpp):
                            yield settings, layout, (*cuts, num_layers - 1)


def hetero_specs(backend: Backend, cluster: Cluster, num_layers: int, global_batch: int, pins: Pins,
                 units: tuple[int, ...] | None = None) -> Iterator[PipelineSpec]:
    """Every heterogeneous single-stage plan (:mod:`planner.search.hetero`) with every whole-micro-batch split."""
    num_units = sum(units) if units is not None else num_layers
    for settings in enumerate_settings(cluster, global_batch, pins, num_units=num_units):
        if settings_allowed(settings, pins):
            for _, stage in hetero.candidates(lambda o, s: option_profile(backend, o, s), cluster, settings,
                                              global_batch, pins, exhaustive=True):
                yield hetero.hetero_spec(cluster, global_batch, settings, stage, num_layers)


def enumerate_best(backend: Backend, cluster: Cluster, num_layers: int, global_batch: int, pins: Pins = Pins(),
                   units: tuple[int, ...] | None = None) -> Enumerated:
    best_time, best_spec, count = float("inf"), None, 0
    specs = itertools.chain(
        (pipeline_spec(cluster, global_batch, settings, layout, last)
         for settings, layout, last in plans(cluster, num_layers, global_batch, pins, units)),
        hetero_specs(backend, cluster, num_layers, global_batch, pins, units))
    for spec in specs:
        estimate: Estimate = backend.evaluate(spec)
        count += 1
        if estimate.feasible and estimate.iteration_time_s < best_time:
            best_time, best_spec = estimate.iteration_time_s, spec
    return Enumerated(best_time, best_spec, count)
