"""What the search needs from a cost model, as one small interface (:class:`Backend`).

The search minimises, over layer partitions of a :class:`~planner.search.space.Layout`,

    T = beta * sum_k a_k + alpha * max_k a_k + max_k r_k           (alpha, beta from ``Backend.coefficients``)

where ``a_k`` is stage k's time for one micro-batch (forward + backward + recompute + tensor-parallel
communication + the point-to-point send of its boundary tensors) and ``r_k`` its tail after the last
micro-batch (data-parallel gradient synchronisation not hidden behind compute, plus the optimizer step).
A stage is feasible when ``static_bytes(params) + act_bytes * in_flight_k + peak_bytes`` fits its device.

Every backend must make ``evaluate(spec).iteration_time_s`` equal to that T for the spec (the search
re-evaluates its winners and checks it). ``planner.search.costmodel`` adapts ``planner.cost``; tests also use
``planner.search.synthetic``, a small closed-form model.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np

from planner.search.space import Settings, StageOption
from planner.types import Estimate, PipelineSpec


@dataclass(frozen=True, eq=False)
class LayerTable:
    """Per-layer costs of one stage option under one settings, for ONE micro-batch on one replica.
    Arrays have one entry per layer."""

    step_s: np.ndarray  # forward + backward (+ recompute) + tensor-parallel communication
    params_per_rank: np.ndarray  # parameters held by each tensor-parallel rank
    act_bytes: np.ndarray  # bytes kept per micro-batch in flight
    peak_bytes: np.ndarray  # transient bytes while the layer runs (the stage holds the max of these once)
    output_bytes: np.ndarray  # boundary tensor handed to the next layer, per micro-batch


class Backend(Protocol):
    """The cost model as the search sees it. Array arguments are evaluated element-wise."""

    def layer_table(self, option: StageOption, settings: Settings) -> LayerTable: ...

    def static_bytes(self, params_per_rank: np.ndarray, option: StageOption, settings: Settings) -> np.ndarray:
        """Weights, gradients, optimizer states and fixed overheads per device (ZeRO over ``settings.dp``)."""
        ...

    def tail_s(self, params_per_rank: np.ndarray, option: StageOption, settings: Settings) -> np.ndarray:
        """Exposed data-parallel synchronisation plus optimizer step of a stage holding these parameters."""
        ...

    def p2p_s(self, output_bytes: np.ndarray, src: StageOption, dst: StageOption, settings: Settings
              ) -> np.ndarray:
        """Point-to-point time per micro-batch (forward activation + backward gradient) between stages."""
        ...

    def capacity_bytes(self, option: StageOption) -> float: ...

    def in_flight(self, stage: int, num_stages: int, num_micro_batches: int, settings: Settings) -> int:
        """Micro-batches whose activations stage ``stage`` holds at its peak."""
        ...

    def coefficients(self, num_stages: int, num_micro_batches: int, settings: Settings) -> tuple[float, float]:
        """(alpha, beta) of the objective above."""
        ...

    def evaluate(self, spec: PipelineSpec) -> Estimate:
        """The full cost-model estimate of an explicit plan."""
        ...


def prefix(values: np.ndarray) -> np.ndarray:
    """Cumulative sums with a leading zero: segment i..j sums to ``c[j + 1] - c[i]``."""
    return np.concatenate(([0.0], np.cumsum(values, dtype=np.float64)))


def segment_sums(values: np.ndarray) -> np.ndarray:
    """``S[i, j]`` = sum of values[i..j] for i <= j (upper triangle), NaN below the diagonal."""
    c = prefix(values)
    out = c[None, 1:] - c[:-1, None]
    out[np.tril_indices(len(values), -1)] = np.nan
    return out


def segment_max(values: np.ndarray) -> np.ndarray:
    """``M[i, j]`` = max of values[i..j] for i <= j, NaN below the diagonal."""
    n = len(values)
    out = np.full((n, n), np.nan)
    for i in range(n):
        out[i, i:] = np.maximum.accumulate(values[i:])
    return out
