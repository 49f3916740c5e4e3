"""What the search needs from a cost model, as one small interface (:class:`Backend`), and the algebra of
the lower bound its dynamic program minimises.

The cost model times a pipeline with an event simulation (1F1B order, point-to-point transfers) plus what
each stage's data-parallel synchronisation and optimizer step add after its last backward. That total does
not decompose over stages, so the partition DP minimises a lower bound on it that does, and every plan it
picks is re-timed by the cost model itself (``Backend.evaluate``).

The bound (a critical-path argument). Let stage k take f_k forward and b_k backward per micro-batch, c_k
to send to stage k+1, hold w_k = min(P - k - 1, m) warm-up micro-batches. Stage s cannot start the backward
of micro-batch 0 before that micro-batch went forward through stages >= s and back through stages > s; from
then it still runs m backwards and m - w_s - 1 forwards, and its last gradient must travel back to stage 0:

    pipeline >= sum_k (f_k + b_k) + 2 sum_{k<P-1} c_k + (m - 1) b_s + max(0, m - w_s - 1) f_s   for every s.

Stage 0 finishes its backward last, so its exposed synchronisation and optimizer step r_0 follow the
pipeline: T >= pipeline + r_0. Since r_0 depends on stage 0's segment alone it is added to S_0, so
T >= sum_k S_k + max_k G_k with

    S_k = f_k + b_k + 2 c_k (+ r_0 for k = 0; c_{P-1} = 0),  G_k = (m - 1) b_k + max(0, m - w_k - 1) f_k,

which is exact for identical stages (the textbook (m + P - 1)(f + b)) and is what
:func:`planner.search.partition.solve_partition` minimises. The interleaved schedule has a bound of the same
shape with other weights (:mod:`planner.search.interleave`); ``bound_matrices`` builds either.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np

from planner.search.interleave import bound_coefficients
from planner.search.space import Layout, Settings, StageOption
from planner.types import Estimate, PipelineSpec


@dataclass(frozen=True, eq=False)
class LayerTable:
    """Per-layer costs of one stage option under one settings, for ONE micro-batch on one replica."""

    forward_s: np.ndarray  # including tensor-parallel communication
    backward_s: np.ndarray  # including recompute and tensor-parallel communication
    params_per_rank: np.ndarray
    act_bytes: np.ndarray  # kept per micro-batch in flight
    peak_bytes: np.ndarray  # transient while the layer runs (a stage holds the largest once)
    output_bytes: np.ndarray  # boundary tensor handed to the next layer, per micro-batch


class Backend(Protocol):
    """The cost model as the search sees it."""

    def layer_table(self, option: StageOption, settings: Settings) -> LayerTable: ...

    def static_bytes(self, params_per_rank: np.ndarray, option: StageOption, settings: Settings) -> np.ndarray:
        """A lower bound on a device's memory other than activations (weights, gradients, optimizer states
        under ZeRO over ``settings.dp``), element-wise, affine in the parameters."""
        ...

    def capacity_bytes(self, option: StageOption) -> float: ...

    def stage_bytes(self, params_per_rank: np.ndarray, act_bytes: np.ndarray, in_flight: float,
                    peak_bytes: np.ndarray, option: StageOption, settings: Settings) -> np.ndarray:
        """Memory per device of a stage whose layers sum to ``params_per_rank`` parameters and ``act_bytes``
        activations per micro-batch, with ``in_flight`` micro-batches held and a largest transient of
        ``peak_bytes`` (element-wise). Affine in each of the parameters, ``act_bytes * in_flight`` and the
        transient; a segment fits when this is at most ``capacity_bytes``."""
        ...

    def stage_matrices(self, layout: Layout, settings: Settings, global_batch: int
                       ) -> tuple[np.ndarray, np.ndarray]:
        """(S, G) of the bound above, shape (P, L, L), S = inf where a segment does not fit in memory."""
        ...

    def evaluate(self, spec: PipelineSpec) -> Estimate:
        """The full cost-model estimate of an explicit plan."""
        ...


def prefix(values: np.ndarray) -> np.ndarray:
    """Cumulative sums with a leading zero: segment i..j sums to ``c[j + 1] - c[i]``."""
    return np.concatenate(([0.0], np.cumsum(values, dtype=np.float64)))


_BELOW: dict[int, np.ndarray] = {}


def _below_diagonal(n: int) -> np.ndarray:
    """Boolean mask of the entries i > j of an n x n matrix (memoised; read-only)."""
    mask = _BELOW.get(n)
    if mask is None:
        mask = np.tri(n, n, -1, dtype=bool)
        mask.setflags(write=False)
        _BELOW[n] = mask
    return mask


def segment_sums(values: np.ndarray) -> np.ndarray:
    """``S[i, j]`` = sum of values[i..j] for i <= j (upper triangle), NaN below the diagonal."""
    c = prefix(np.asarray(values, dtype=float))
    out = c[None, 1:] - c[:-1, None]
    out[_below_diagonal(len(values))] = np.nan
    return out


def segment_max(values: np.ndarray) -> np.ndarray:
    """``M[i, j]`` = max of values[i..j] for i <= j, NaN below the diagonal."""
    n = len(values)
    out = np.full((n, n), np.nan)
    for i in range(n):
        out[i, i:] = np.maximum.accumulate(np.asarray(values[i:], dtype=float))
    return out


def warmup(stage: int, num_stages: int, num_micro_batches: int) -> int:
    """Forwards a 1F1B stage runs before its first backward."""
    return min(num_stages - stage - 1, num_micro_batches)


def bound_matrices(forward: list[np.ndarray], backward: list[np.ndarray], p2p: list[np.ndarray | None],
                   fits: list[np.ndarray], tail0: np.ndarray, num_micro_batches: int, vpp: int = 1
                   ) -> tuple[np.ndarray, np.ndarray]:
    """(S, G) from per-stage segment matrices: ``forward[k][i, j]``, ``backward[k][i, j]``, the send time
    ``p2p[k][j]`` after layer j (for the last stage: back to stage 0, used only between interleaved chunks;
    None = no transfer), ``fits[k][i, j]`` and stage 0's tail ``tail0[j]`` when it holds layers 0..j. With
    ``vpp > 1`` the interleaved schedule's bound (:mod:`planner.search.interleave`)."""
    P = len(forward)
    L = forward[0].shape[0]
    co = bound_coefficients(P, num_micro_batches, vpp)
    S = np.empty((P, L, L))
    G = np.empty((P, L, L))
    for k in range(P):
        f, b = forward[k], backward[k]
        s = f + co.backward_weight * b if vpp > 1 else f + b
        if p2p[k] is not None and co.hops[k] > 0:
            s = s + co.hops[k] * np.asarray(p2p[k])[None, :]
        if k == 0:
            s = s + np.asarray(tail0, dtype=float)[None, :]
        g = co.gamma * b + co.delta[k] * f
        ok = fits[k] & np.isfinite(s)
        S[k] = np.where(ok, s, np.inf)
        G[k] = np.where(ok, g, np.inf)
    return S, G
