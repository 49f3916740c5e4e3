"""Segment tables: for a layout and settings, the (stage, first layer, last layer) matrices the partition DP
reads, built from a backend's per-layer costs with prefix sums (no Python loop over segments)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from planner.search.backend import Backend, segment_max, segment_sums
from planner.search.space import Layout, Settings, StageOption


@dataclass(frozen=True, eq=False)
class OptionSegments:
    """One option's segment matrices (L x L, NaN below the diagonal)."""

    step_s: np.ndarray
    tail_s: np.ndarray
    static_bytes: np.ndarray
    act_bytes: np.ndarray
    peak_bytes: np.ndarray
    output_bytes: np.ndarray  # per layer: the boundary tensor after it


class SegmentCache:
    """Memoised :class:`OptionSegments` per (option, settings)."""

    def __init__(self, backend: Backend) -> None:
        self.backend = backend
        self._segments: dict[tuple[StageOption, Settings], OptionSegments] = {}

    def get(self, option: StageOption, settings: Settings) -> OptionSegments:
        key = (option, settings)
        hit = self._segments.get(key)
        if hit is None:
            t = self.backend.layer_table(option, settings)
            params = segment_sums(t.params_per_rank)
            hit = OptionSegments(
                step_s=segment_sums(t.step_s),
                tail_s=np.asarray(self.backend.tail_s(params, option, settings), dtype=float),
                static_bytes=np.asarray(self.backend.static_bytes(params, option, settings), dtype=float),
                act_bytes=segment_sums(t.act_bytes), peak_bytes=segment_max(t.peak_bytes),
                output_bytes=np.asarray(t.output_bytes, dtype=float))
            self._segments[key] = hit
        return hit


def stage_matrices(cache: SegmentCache, layout: Layout, settings: Settings, num_micro_batches: int
                   ) -> tuple[np.ndarray, np.ndarray]:
    """``A[k, i, j]`` (stage time per micro-batch, inf where infeasible) and ``R[k, i, j]`` (tail)."""
    backend = cache.backend
    P = layout.num_stages
    first = cache.get(layout.options[0], settings)
    L = first.step_s.shape[0]
    A = np.empty((P, L, L))
    R = np.empty((P, L, L))
    for k, option in enumerate(layout.options):
        seg = cache.get(option, settings)
        a = seg.step_s.copy()
        if k + 1 < P:
            a += np.asarray(backend.p2p_s(seg.output_bytes, option, layout.options[k + 1], settings))[None, :]
        in_flight = backend.in_flight(k, P, num_micro_batches, settings)
        memory = seg.static_bytes + seg.act_bytes * in_flight + seg.peak_bytes
        ok = memory <= backend.capacity_bytes(option)  # NaN (i > j) compares False
        A[k] = np.where(ok, a, np.inf)
        R[k] = np.where(ok, seg.tail_s, np.inf)
    return A, R
