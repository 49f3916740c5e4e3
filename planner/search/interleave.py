"""Interleaved (virtual) pipeline stages in the search: which plans may interleave, how a stage's layers map
to its model chunks, and the coefficients of the critical-path bound for either schedule.

Rules (:mod:`planner.rules`, as ``planner.cost`` times them). ``vpp > 1`` needs a runtime with the
interleaved schedule, at least two stages (``Runtime.interleaved_min_stages``: three on Megatron-LM v2.5), a
number of micro-batches ``m`` that is a multiple of the stage count ``P`` (the cost model refuses the
interleaved schedule otherwise) and a ZeRO stage the runtime combines with a pipeline
(``Runtime.max_pipeline_zero``). Each stage's pipeline units
(transformer blocks, or every layer of a model without blocks) must be a positive multiple of ``vpp``: the
stage runs them as ``vpp`` chunks of equal size, chunk ``v`` of stage ``s`` being virtual stage ``v P + s``.
The cost model gives each chunk ``1/vpp`` of its stage's forward and backward time, which is exactly that
even split for identical blocks; the plan lists a stage's layers as one range (how much of the model it
holds), and the Megatron exporter writes the chunks. Uneven splits stay allowed across stages (stage ``s``
has ``n_s / vpp`` units per chunk, ``n_s`` its own), which Megatron-LM expresses with a pipeline layout, except
on a runtime without an uneven pipeline (``Runtime.uneven_pipeline``), where every stage holds the same units.

Searched values: every ``vpp`` the rule book allows for the model's transformer blocks
(:func:`planner.rules.valid_vpps`: the blocks split into whole chunks over at least two stages, so ``vpp``
divides the block count), as Megatron-LM interleaves transformer layers; other models are planned with
1F1B unless ``--vpp`` is pinned, and a pin may ask for any legal value. Larger values shrink the bubble
``(P - 1)(f + b) / vpp`` further but add a point-to-point transfer per chunk and memory per stage; the
bounds cover every value searched, so a plan's lower bound holds for all of them.

Bound. Let stage k take f_k forward and b_k backward per micro-batch (each chunk a ``1/V`` share), c_k the
transfer to stage k+1 (c_{P-1} from the last stage back to stage 0, used between chunks), and w_k the
forward chunks stage k runs before its first backward (Megatron-LM's warm-up). Stage s's first backward is
chunk V-1 of micro-batch 0: that micro-batch went forward through all P V virtual stages (sum_k f_k and
V sum_{k<P-1} c_k + (V-1) c_{P-1}) and back through the stages after s in its last chunk. From then s runs
all m V backward chunks and its remaining m V - w_s - 1 forward chunks; its last operation is a backward of
chunk 0, whose gradient still crosses stages s-1..0. Every term lies on one dependency chain, so

    pipeline >= sum_k (f_k + b_k / V) + (m - 1/V) b_s + max(0, m V - w_s - 1) f_s / V
                + (V + 1) sum_{k<P-1} c_k + (V - 1) c_{P-1}                          for every s,

which for V = 1 is the 1F1B bound of :mod:`planner.search.backend` (w_s = min(P - s - 1, m)) and is exact
for identical stages without transfers (s = P - 1 gives m (f + b) + (P - 1)(f + b) / V).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from planner.cost.schedule import warmup_forwards
from planner.rules import INTERLEAVED, stages_allowed, valid_vpps

def schedule_for(vpp: int) -> str:
    return INTERLEAVED if vpp > 1 else "1f1b"


def vpp_choices(pinned_vpp: int | None, pinned_schedule: str | None, num_units: int, min_stages: int = 2
                ) -> list[int]:
    """The vpp values the search tries under the pins (``num_units`` pipeline units in the model): 1 and
    every value whose chunks fit ``min_stages`` stages or more (the runtime's ``interleaved_min_stages``)."""
    if pinned_vpp is not None:
        return [pinned_vpp]
    values = sorted({1, *valid_vpps(num_units, max(2, min_stages))})
    if pinned_schedule == INTERLEAVED:
        return [v for v in values if v > 1]
    if pinned_schedule is not None:
        return [1]
    return values


def warmup(stage: int, num_stages: int, num_micro_batches: int, vpp: int = 1, all_forwards_at_pp: bool = True,
           ep_overlap: bool = False) -> int:
    """Forward operations (model chunks) a stage runs before its first backward, as the bound takes them:
    1F1B's, and the interleaved schedule's (:func:`planner.cost.schedule.warmup_forwards`; one more under
    expert-parallel overlap, ``ep_overlap``). Where there are as many micro-batches as stages,
    ``all_forwards_at_pp`` runs every forward first (``Runtime.interleaved_all_forwards_at_pp``); the search
    passes its runtime's own. The default, the larger warm-up, leaves fewer forwards after the first backward
    (a smaller ``delta``) and no steady-state hand-offs, so a bound built with it stays below both schedules.
    Under overlap a bound from this warm-up and the merged steps' per-layer times (the forward and backward
    scaled to the merged step's, planner.search.costmodel) stays below the merged schedule, whose steps hand
    on their forward's output no earlier than the two operations one after the other would."""
    return warmup_forwards(stage, num_stages, num_micro_batches, schedule_for(vpp), vpp, all_forwards_at_pp,
                           ep_overlap)


def pipeline_allowed(num_stages: int, num_micro_batches: int, vpp: int, num_units: int, even: bool = False,
                     min_stages: int = 2) -> bool:
    """Whether ``num_stages`` stages may interleave ``vpp`` chunks each (always true for vpp = 1; at least
    ``min_stages`` stages) and, with ``even`` (a runtime without an uneven pipeline), split the units evenly:
    :func:`planner.rules.stages_allowed`."""
    return stages_allowed(num_stages, num_micro_batches, vpp, num_units, even, min_stages)


@dataclass(frozen=True)
class BoundCoefficients:
    """The bound's weights for P stages: S_k = f_k + backward_weight b_k + hops[k] c_k and
    G_k = gamma b_k + delta[k] f_k (see the module docstring)."""

    backward_weight: float
    gamma: float
    delta: np.ndarray  # per stage
    hops: np.ndarray  # per stage: transfers of c_k on the critical path


def bound_coefficients(num_stages: int, num_micro_batches: int, vpp: int = 1, all_forwards_at_pp: bool = True,
                       ep_overlap: bool = False) -> BoundCoefficients:
    P, m, V = num_stages, num_micro_batches, vpp
    delta = np.array([max(0, m * V - warmup(k, P, m, V, all_forwards_at_pp, ep_overlap) - 1) / V for k in range(P)],
                     dtype=float)
    hops = np.full(P, V + 1.0)
    hops[-1] = V - 1.0
    return BoundCoefficients(backward_weight=1.0 / V, gamma=m - 1.0 / V, delta=delta, hops=hops)


@functools.lru_cache(maxsize=65536)
def least_delta(num_stages: int, num_micro_batches: int, vpp: int = 1, ep_overlap: bool = False) -> float:
    """min_k delta_k (stage 0's: its warm-up is the longest), for bounds valid at any stage position (memoised:
    the bounds ask for the same few stage counts many times)."""
    return max(0, num_micro_batches * vpp - warmup(0, num_stages, num_micro_batches, vpp, ep_overlap=ep_overlap)
               - 1) / vpp


def chunk_mask(units: Sequence[int], vpp: int, per_stage: int | None = None) -> np.ndarray | None:
    """``ok[i, j]``: a stage holding layers i..j has a positive multiple of ``vpp`` pipeline units
    (``units[l]`` is 1 for a pipeline unit, 0 for an embedding or head layer), exactly ``per_stage`` of them
    where given (a runtime that splits the units evenly); None when neither restricts."""
    if vpp == 1 and per_stage is None:
        return None
    c = np.concatenate(([0], np.cumsum(np.asarray(units, dtype=int))))
    count = c[None, 1:] - c[:-1, None]
    upper = np.triu(np.ones((len(units), len(units)), dtype=bool))
    ok = upper & (count > 0) & (count % vpp == 0)
    return ok if per_stage is None else ok & (count == per_stage)


def partition_allowed(units: Sequence[int], last_layers: Sequence[int], vpp: int, per_stage: int | None = None
                      ) -> bool:
    """Whether every stage of a partition (``last_layers``, inclusive) holds whole chunks, ``per_stage`` units
    each where given (:func:`chunk_mask`)."""
    if vpp == 1 and per_stage is None:
        return True
    first = 0
    for last in last_layers:
        count = sum(units[first:last + 1])
        if count == 0 or count % vpp or (per_stage is not None and count != per_stage):
            return False
        first = last + 1
    return True


def searched_units(kinds: Sequence[str]) -> int:
    """The unit count the search offers interleaving for: the transformer blocks (0 without any: no vpp > 1
    unless pinned)."""
    return sum(1 for kind in kinds if kind == "block")
