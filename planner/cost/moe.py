"""Mixture-of-experts layers under expert parallelism: token dispatch and combine, grouped expert GEMMs,
expert tensor parallelism, and the expert weights' data-parallel group.

Groups (Megatron-Core, megatron/core/parallel_state.py ``initialize_model_parallel``): the dense layers
decompose a pipeline stage's ``tp x cp x dp`` ranks as tensor x context x data parallel; the experts
decompose the same ranks again as ``expert_tp x ep x expert_dp`` (expert tensor parallel fastest, then
expert parallel, then expert data parallel: the expert RankGenerator with ``tp=expert_tensor_parallel_size,
ep=expert_model_parallel_size``), so ``expert_tp x ep`` divides ``tp x cp x dp`` (it asserts that the world
size is a multiple of ``expert_tp x ep x pp``) and ``expert_dp = tp x cp x dp / (ep x expert_tp)``;
``expert_tensor_parallel_size`` defaults to ``tensor_model_parallel_size``. Devices of a stage are numbered
tensor-parallel fastest, so the expert-parallel group of a stage's first rank is its devices
``0, expert_tp, 2 expert_tp, ...`` (``ep`` of them) and its expert-data-parallel group every
``ep x expert_tp``-th device.

Per MoE layer and micro-batch, on one rank (Megatron-Core's ``MoEAlltoAllTokenDispatcher``): the rank holds
``T = tokens x micro_batch / tp`` tokens (sequence parallelism splits them over the tensor-parallel ranks;
with tp > 1 Megatron-Core trains MoE layers only under it: ``planner.rules``), and sends each to its ``top_k``
experts: the dispatch all-to-all over the expert-parallel group moves ``T x top_k x hidden`` elements per
rank, the combine all-to-all the same back; the backward pass runs both again on the gradients, so four
all-to-alls per layer and micro-batch (``A = T x top_k x hidden x bytes`` each, what each rank sends in
``planner.hardware.collectives``' convention). With ``expert_tp > 1`` the received tokens are all-gathered
over the expert-tensor-parallel group before the experts and reduce-scattered after them (and the reverse
in the backward pass), on ``expert_tp x A`` bytes. The busiest rank receives ``imbalance`` times the mean
(``Runtime.moe_load_imbalance``; dropless routing), so its all-to-alls, gathers and expert GEMMs are that
much longer; with ``ep = 1`` every rank holds every expert and the imbalance between experts cancels.

Expert GEMMs: a rank holds ``experts / ep`` experts, each taking ``m = ep x expert_tp x T x top_k / experts``
rows (the mean), its matrices split ``expert_tp`` ways (column- or row-parallel, as the importer marked
them); it runs them as one grouped GEMM, timed as ``experts / ep`` GEMMs of ``m`` rows at the device's
shape efficiency (``planner.hardware.efficiency.gemm_shape_efficiency`` at that m), the rows a small
per-expert count where the dense view would have seen every routed row in one GEMM. The FLOPs per rank are
``T x top_k`` rows through one expert's matrices split ``expert_tp`` ways and gathered ``expert_tp``
times: those of the active parameters split over tp, as without expert parallelism.

Overlap (Megatron-Core's ``--overlap-moe-expert-parallel-comm``, "EP A2A overlap": the steady state's
forward of one micro-batch and backward of another run as one merged step, layer by layer, on two CUDA
streams; ``megatron/core/models/common/model_chunk_schedule_plan.py``, ``TransformerLayerSchedulePlan.run``).
A MoE layer is four parts each way: the pre-dispatch computation ``A`` (attention, the pre-MLP norm, the
router and the shared experts: ``megatron/core/models/gpt/fine_grained_callables.py``), the dispatch ``D``, the
routed experts ``M`` and the combine ``C``. The merged step runs

    communication stream:  C_b            | D_f -> D_b        | C_f
    computation stream:    A_f            | M_b -> M_f        | A_b

(``_b`` the backward's, ``_f`` the forward's), each part once its input is ready: ``M_b`` after ``C_b``,
``D_f`` after ``A_f``, ``D_b`` after ``M_b``'s input gradient (its weight gradient is deferred,
``--delay-wgrad-compute``), ``M_f`` after ``D_f``, ``A_b`` after ``D_b``, ``C_f`` after ``M_f``; the next
layer's step starts when both the forward's output (``C_f``) and the backward's input gradient (``A_b``) are
there. :func:`merged_layer_s` is that step's length: at least the longer of the two streams' sums, at most
the forward and backward one after the other.

Memory per rank: the routed experts' parameters over ``ep x expert_tp``, the rest of the layer as before;
the received (permuted) tokens, the experts' input the weight gradient reads, are held for the backward
pass: ``imbalance x expert_tp x A`` per micro-batch in flight.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from planner.cost.calibration import DeviceCalibration
from planner.cost.comm import tp_group
from planner.cost.memory import dtype_bytes
from planner.hardware.collectives import CommGroup, collective_time_s
from planner.types import Layer, MoEDims, NodeProfile, OpCost

ALL_TO_ALLS_PER_LAYER = 4  # dispatch and combine, forward and backward


@dataclass(frozen=True)
class ExpertParallel:
    """How a replica group runs its MoE layers: ``ep`` expert-parallel ranks, experts split ``expert_tp``
    ways, the expert-parallel group ``group`` (None: ``ep`` 1) and the busiest rank's load ``imbalance``."""

    ep: int = 1
    expert_tp: int = 1
    group: CommGroup | None = None
    imbalance: float = 1.0

    @property
    def load(self) -> float:
        """The busiest rank's routed rows over the mean: the imbalance, where experts are split over ranks."""
        return self.imbalance if self.ep > 1 else 1.0


def resolved_expert_tp(tp: int, expert_tp: int | None) -> int:
    """``expert_tp``, or the tensor-parallel degree where it is left out (0 or None: Megatron-Core's
    default, ``expert_tensor_parallel_size = tensor_model_parallel_size``)."""
    return expert_tp or tp


def expert_dp(tp: int, dp: int, ep: int, expert_tp: int, cp: int = 1) -> int:
    """Ranks that hold the same expert shard and all-reduce its gradients: ``tp x cp x dp / (ep x expert_tp)``
    (module docstring; planner.rules checks the division)."""
    return max(1, (tp * cp * dp) // (ep * expert_tp))


def ep_group_devices(devices: Sequence[int], ep: int, expert_tp: int) -> tuple[int, ...]:
    """The expert-parallel group of the first rank of a replica group's ``devices`` (tensor-parallel fastest)."""
    return tuple(devices[0:ep * expert_tp:expert_tp])


def expert_dp_devices(devices: Sequence[int], ep: int, expert_tp: int) -> tuple[int, ...]:
    """The expert-data-parallel group of the first rank of ``devices``: every ``ep x expert_tp``-th device."""
    return tuple(devices[::ep * expert_tp])


def tokens_per_rank(moe: MoEDims, micro_batch: int, tp: int) -> float:
    """Tokens one rank dispatches per micro-batch: the micro-batch's tokens over the tensor-parallel ranks."""
    return moe.tokens * micro_batch / tp


def dispatch_bytes(moe: MoEDims, hidden: int, micro_batch: int, tp: int, dtype: str) -> float:
    """What one rank sends in one dispatch (or combine) all-to-all: ``tokens x top_k x hidden x bytes``."""
    return tokens_per_rank(moe, micro_batch, tp) * moe.top_k * hidden * dtype_bytes(dtype)


def layer_hidden(layer: Layer) -> int:
    """The hidden width tokens are dispatched at: the block's, else the router's input width."""
    if layer.transformer is not None:
        return layer.transformer.hidden
    return 0


def expert_params_per_rank(layer: Layer, par: ExpertParallel) -> float:
    """A layer's routed-expert parameters on one rank: all of them over ``ep x expert_tp``."""
    if layer.moe is None:
        return 0.0
    return layer.moe.expert_params / (par.ep * par.expert_tp)


def _experts_covered(op: OpCost, moe: MoEDims) -> int:
    """How many experts one routed MatMul computes: all (a batched ``[experts, in, out]`` weight, the routed
    rows ``tokens x top_k``) or one (a per-expert weight, a share of them)."""
    pairs = moe.tokens * moe.top_k
    rows = op.gemm[0] if op.gemm is not None else pairs
    return moe.experts if rows * moe.experts >= pairs * 1.5 else 1


def expert_gemm_s(op: OpCost, moe: MoEDims, micro_batch: int, tp: int, par: ExpertParallel,
                  gemm_s: Callable[[float, float, float], float]) -> tuple[float, float]:
    """(forward, backward) seconds of one routed MatMul on the busiest rank: ``covered / ep`` GEMMs of the
    per-expert row count, split ``expert_tp`` ways by the op's column/row split (module docstring)."""
    m_op, n, k = (float(x) for x in op.gemm)  # type: ignore[misc]
    covered = _experts_covered(op, moe)
    rows = par.ep * par.expert_tp * m_op * micro_batch / (tp * covered) * par.load
    if op.tp_split == "column":
        n /= par.expert_tp
    elif op.tp_split == "row":
        k /= par.expert_tp
    count = covered / par.ep
    forward = count * gemm_s(rows, n, k)
    backward = count * (gemm_s(rows, k, n) + gemm_s(k, n, rows))
    return forward, backward


def moe_comm_s(layer: Layer, node: NodeProfile, micro_batch: int, tp: int, dtype: str, par: ExpertParallel,
               cal: DeviceCalibration) -> tuple[float, float]:
    """(forward, backward) seconds of a MoE layer's expert communication on the busiest rank: the dispatch and
    combine all-to-alls over the expert-parallel group, and with ``expert_tp > 1`` the gather and
    reduce-scatter of the received tokens over the expert-tensor-parallel group (module docstring)."""
    moe, hidden = layer.moe, layer_hidden(layer)
    if moe is None or not hidden:
        return 0.0, 0.0
    sent = dispatch_bytes(moe, hidden, micro_batch, tp, dtype) * par.load
    one_way = 0.0
    if par.ep > 1 and par.group is not None:
        one_way += 2.0 * collective_time_s("all_to_all", sent, par.group)  # dispatch + combine
    if par.expert_tp > 1:
        group = tp_group(node, par.expert_tp, cal)
        gathered = par.expert_tp * sent
        one_way += (collective_time_s("all_gather", gathered, group)
                    + collective_time_s("reduce_scatter", gathered, group))
    return one_way, one_way


def merged_layer_s(pre_forward_s: float, experts_forward_s: float, comm_forward_s: float,
                   pre_backward_s: float, experts_backward_s: float, comm_backward_s: float) -> float:
    """One MoE layer's merged step (module docstring): the forward of one micro-batch and the backward of
    another, given each one's pre-dispatch computation, routed experts and expert communication (dispatch
    plus combine, each half of it). The experts' backward is half input gradient (which the backward's
    dispatch waits for) and half weight gradient (its two GEMMs have the same FLOPs)."""
    a_f, m_f, d_f = pre_forward_s, experts_forward_s, comm_forward_s / 2.0
    a_b, m_b, d_b = pre_backward_s, experts_backward_s, comm_backward_s / 2.0
    start = max(a_f, d_b)  # A_f on one stream, C_b on the other
    dispatched = start + d_f
    dispatched_back = max(dispatched, start + m_b / 2.0) + d_b
    experts_done = max(start + m_b, dispatched) + m_f
    return max(experts_done, dispatched_back) + max(a_b, d_f)


def merged_ratio(merged_s: np.ndarray, forward_s: np.ndarray, backward_s: np.ndarray) -> np.ndarray:
    """Each merged step's time over its forward and backward one after the other (1 where both are 0): the
    share of the two operations a step of expert-parallel overlap takes (planner.cost.schedule)."""
    merged, total = np.asarray(merged_s, dtype=float), np.asarray(forward_s, dtype=float) + backward_s
    return np.divide(merged, total, out=np.ones_like(total), where=total > 0)


def dispatch_buffer_bytes(layer: Layer, micro_batch: int, tp: int, dtype: str, par: ExpertParallel) -> float:
    """The received tokens a rank holds for the backward pass per micro-batch: the experts' gathered input."""
    moe, hidden = layer.moe, layer_hidden(layer)
    if moe is None or not hidden:
        return 0.0
    return dispatch_bytes(moe, hidden, micro_batch, tp, dtype) * par.load * par.expert_tp
