"""Communication of a training iteration: tensor-parallel collectives, data-parallel gradient
synchronisation and ZeRO gathers, on the tier they run on, as the training runtime issues and overlaps them.

The collective formulas themselves (alpha-beta, ring/tree/hierarchical, slowest link) live in
``planner.hardware.collectives``; this module decides which collectives an iteration issues, over which
group of ranks, how often (per iteration or per micro-batch) and how much of them the computation hides,
from the runtime's flags (``planner.runtime.Runtime``), with no fitted overlap fraction.

Groups. A tensor-parallel group lies inside one node. A data-parallel group of a stage has one rank per
replica (``planner.hardware.collectives.comm_group``: when several such groups share a node, one per
tensor-parallel rank, they share its NICs).

What each ZeRO stage issues, with ``m`` micro-batches per iteration and ``Psi`` the stage's parameters per
rank (Rajbhandari et al., "ZeRO", SC'20, Sections 5 and 7; the runtimes' code cited at each function):

* ZeRO-0: one bucketed all-reduce of the gradients per iteration, during/after the last micro-batch's
  backward (Megatron-Core DDP, DeepSpeed stage 0: gradients accumulate locally between micro-batches). A
  runtime that shards its ZeRO-0 optimizer states in a pipeline (DeepSpeed's BF16_Optimizer,
  ``Runtime.shards_optimizer_states``) all-gathers the updated weights after the step as well.
* ZeRO-1: one bucketed reduce-scatter of the gradients per iteration, one all-gather of the updated weights
  after the optimizer step (Megatron-Core distributed optimizer; DeepSpeed stage 1).
* ZeRO-2: the reduce-scatter in EVERY micro-batch's backward (the gradients are kept sharded, so each
  micro-batch's must be reduced before the next one's arrive: DeepSpeed stage_1_and_2.py reduces the
  ipg buckets in every backward and waits for them in its epilogue; FSDP2 with
  reshard_after_forward=False reduce-scatters after every backward), the weights' all-gather once. In a
  pipeline whose stages defer it (``Runtime.pipeline_defers_grad_reduce``: torch.distributed.pipelining with
  FSDP2) the gradients accumulate unsharded and are reduce-scattered once, after the last backward.
* ZeRO-3 / FSDP FULL_SHARD: per layer, an all-gather of the weights before its forward and again before
  its backward, and a reduce-scatter of its gradients after its backward, in every micro-batch:
  ``m (2 + 1) Psi`` sent per iteration, 3 Psi for one micro-batch against ZeRO-1's 2 Psi. In a pipeline
  whose stages defer the reduction, the backward leaves the weights unsharded as well, so the forward that
  follows a backward finds them gathered and only the backward gathers again (1F1B's steady state: about
  one gather per micro-batch, m + 1 in all), and the gradients are reduce-scattered once: ``m Psi + Psi``.

Overlap. A bucketed gradient reduction runs while the backward pass produces the next buckets, so it hides
behind the backward of the micro-batch that produced it (``overlap_grad_reduce``), never the last bucket;
without the flag it runs after the backward, whole (so in DeepSpeed's pipelines, whose engine turns the
overlap off: ``Runtime.pipeline_overlap_grad_reduce``). The weights' all-gather of ZeRO-1/2 hides behind the
next forward, bucket by bucket, never the first (``overlap_param_gather``). ZeRO-3's per-layer gathers are
timed by a layer-pipelined recurrence (:func:`zero3_exposed_s`).

Widths. The gradients are reduced at the runtime's reduction width (Megatron and FSDP2 as torchtitan runs
it: fp32 for 16-bit bf16 training; ``planner.cost.memory.gradient_reduce_bytes``), the weights gathered in
the training dtype.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Sequence

import numpy as np

from planner.cost.calibration import DeviceCalibration
from planner.cost.memory import dtype_bytes, gradient_reduce_bytes, weights_dtype
from planner.errors import ConfigError
from planner.hardware.collectives import (CommGroup, collective_time_s, collective_times_s, comm_group,
                                         intra_group_Bps, nvls_Bps, sent_bytes)
from planner.runtime import Runtime, get_runtime
from planner.types import Cluster, NodeProfile

ZERO_STAGES = (0, 1, 2, 3)


def tp_group(node: NodeProfile, tp: int, cal: DeviceCalibration) -> CommGroup:
    """A tensor-parallel group: ``tp`` ranks inside one node, at the node's achieved intra-node bandwidth."""
    intra = intra_group_Bps(node, tp) * cal.comm_scale
    return CommGroup(size=tp, ranks_per_node=tp, intra_bandwidth_Bps=intra, intra_latency_s=node.intra_node_latency_s,
                     inter_bandwidth_Bps=intra, inter_latency_s=node.intra_node_latency_s,
                     nvls_bandwidth_Bps=nvls_Bps(node) * cal.comm_scale)


def dp_group(cluster: Cluster, leaders: Sequence[int], cal: DeviceCalibration) -> CommGroup:
    """The data-parallel group formed by ``leaders`` (the first device of each replica's tensor-parallel
    group; the groups of the other tensor-parallel ranks run alike and at once), as the estimator times it:
    ``planner.hardware.collectives.comm_group`` (NIC share, slowest node, fabric latency, oversubscription)
    with the calibrated ``comm_scale``. For a replica group ``devices``: ``dp_group(cluster, devices[::tp], cal)``."""
    return scaled_group(comm_group(cluster, list(leaders)), cal)


def scaled_group(group: CommGroup, cal: DeviceCalibration) -> CommGroup:
    """``group`` with its bandwidths (both tiers, NVLS) multiplied by the calibrated ``comm_scale``."""
    if cal.comm_scale == 1.0:
        return group
    return replace(group, intra_bandwidth_Bps=group.intra_bandwidth_Bps * cal.comm_scale,
                   inter_bandwidth_Bps=group.inter_bandwidth_Bps * cal.comm_scale,
                   nvls_bandwidth_Bps=group.nvls_bandwidth_Bps * cal.comm_scale)


def tp_collective_time_s(kind: str, size_bytes: float, node: NodeProfile, tp: int, cal: DeviceCalibration) -> float:
    """One tensor-parallel collective of ``size_bytes`` (the full, unsharded tensor) inside a node.
    ``kind`` is ``all_reduce`` or ``reduce_scatter+all_gather`` (sequence parallelism)."""
    if tp <= 1 or size_bytes <= 0:
        return 0.0
    group = tp_group(node, tp, cal)
    if kind == "all_reduce":
        return collective_time_s("all_reduce", size_bytes, group)
    if kind == "reduce_scatter+all_gather":
        return (collective_time_s("reduce_scatter", size_bytes, group)
                + collective_time_s("all_gather", size_bytes, group))
    raise ValueError(f"unknown tensor-parallel collective {kind!r}")


# ------------------------------------------------------------------------------ bucketed passes


def bucket_params(runtime: Runtime, dp: int, overlap: bool | None = None) -> float:
    """Parameters per bucket of a pass the runtime overlaps (``overlap``, default its
    ``overlap_grad_reduce``): 0 = one bucket per layer (FSDP), ``inf`` = one bucket for all.

    Megatron-Core sizes buckets max(40M, 1M x dp) and, without overlap, reduces the whole buffer in one
    call (megatron/core/distributed/distributed_data_parallel.py: bucket_size None); so did Megatron-LM's
    local DDP (one all-reduce of its contiguous buffer)."""
    if not (runtime.overlap_grad_reduce if overlap is None else overlap):
        return math.inf
    if runtime.grad_bucket_params <= 0:
        return 0.0
    return float(max(runtime.grad_bucket_params, runtime.grad_bucket_params_per_rank * dp))


@dataclass(frozen=True)
class Pass:
    """One pass of a bucketed collective over a stage's parameters: the gradients reduced once, or the
    weights gathered once (arrays of any shape: per row of the estimator, per segment i..j of the search)."""

    total_s: np.ndarray  # every bucket, one after the other on the link (a latency per bucket)
    edge_s: np.ndarray  # the one bucket no computation can hide: the last to reduce, the first to gather
    sent_bytes: np.ndarray  # what each rank sends


def param_bytes(kind: str, dtype: str, runtime: Runtime) -> int:
    """Bytes per parameter a data-parallel collective of ``kind`` moves: the gradients' reduction width for
    a reduction, the training dtype for the weights' all-gather (module docstring, Widths)."""
    return dtype_bytes(dtype) if kind == "all_gather" else gradient_reduce_bytes(dtype, runtime)


def layer_collective_s(kind: str, layer_params: np.ndarray, group: CommGroup, dtype: str,
                       runtime: Runtime) -> np.ndarray:
    """One collective per layer over its own parameters (FSDP's per-module collectives, ZeRO-3)."""
    return collective_times_s(kind, np.asarray(layer_params, dtype=float) * param_bytes(kind, dtype, runtime),
                              group)


def bucketed_pass(kind: str, params: np.ndarray, group: CommGroup, dtype: str, runtime: Runtime, bucket: float,
                  layers_s: np.ndarray | float = 0.0, first_layer_s: np.ndarray | float = 0.0) -> Pass:
    """A pass of ``kind`` over ``params`` parameters per rank in buckets of ``bucket`` parameters (equal
    buckets, ``ceil(params / bucket)`` of them). ``bucket = 0``: one bucket per layer, whose times the caller
    gives summed over the pass's layers (``layers_s``) and for the first layer of the stage (the last one
    the backward reaches, the first one the forward needs: ``first_layer_s``)."""
    params = np.asarray(params, dtype=float)
    width = param_bytes(kind, dtype, runtime)
    sent = np.asarray(sent_bytes(kind, params * width, group.size), dtype=float)
    if group.size <= 1:
        zero = np.zeros_like(params)
        return Pass(zero, zero, zero)
    if bucket <= 0:
        total = np.broadcast_to(np.asarray(layers_s, dtype=float), params.shape)
        return Pass(total, np.minimum(total, np.broadcast_to(first_layer_s, params.shape)), sent)
    count = np.maximum(1.0, np.ceil(params / bucket - 1e-9)) if math.isfinite(bucket) else np.ones_like(params)
    each = collective_times_s(kind, params / count * width, group)
    return Pass(count * each, each, sent)


def exposed_s(total_s: np.ndarray | float, edge_s: np.ndarray | float, window_s: np.ndarray | float,
              overlap: bool) -> np.ndarray:
    """What the computation does not hide of a bucketed pass that may run during ``window_s`` of it:
    without ``overlap`` all of it; with it, what runs past the window, and never less than the edge bucket
    (nor more than the whole pass)."""
    total = np.asarray(total_s, dtype=float)
    if not overlap:
        return total
    return np.minimum(total, np.maximum(total - np.maximum(0.0, window_s), edge_s))


@dataclass(frozen=True)
class DpSync:
    """The data-parallel communication of a stage under one ZeRO stage (see the module docstring)."""

    zero: int
    grad: Pass  # one reduction of the gradients: all-reduce (ZeRO-0) or reduce-scatter
    gather: Pass  # one all-gather of the weights (ZeRO-1/2 after the step; ZeRO-3 one layer after another)
    overlap_grad: bool = False  # the gradient reduction overlaps the backward (``Runtime.overlaps_grad_reduce``)
    gather_after_step: bool = False  # ``gather`` runs once after the step (``Runtime.gathers_weights_after_step``)
    grad_once: bool = False  # ZeRO-2/3's reduction runs once after the last backward (``Runtime.defers_grad_reduce``)


def dp_sync(zero: int, params: np.ndarray, group: CommGroup, dtype: str, runtime: Runtime,
            layer_grad_s: np.ndarray | float = 0.0, first_grad_s: np.ndarray | float = 0.0,
            layer_gather_s: np.ndarray | float = 0.0, first_gather_s: np.ndarray | float = 0.0,
            pipelined: bool = False) -> DpSync:
    """The passes of ``zero`` over ``params`` per rank. Per-layer buckets (FSDP, and ZeRO-3 always: it
    gathers and reduces one layer's parameters at a time) take the layers' own collective times:
    ``layer_grad_s`` (reduce-scatter, or all-reduce for ZeRO-0) and ``layer_gather_s`` (all-gather) summed
    over the pass's layers, ``first_*`` of the stage's first layer (:func:`layer_collective_s`).
    ``pipelined``: pp > 1, where a runtime may overlap less or shard its ZeRO-0 states (``Runtime``)."""
    if zero not in ZERO_STAGES:
        raise ConfigError(f"zero={zero} is not a ZeRO stage; use 0, 1, 2 or 3")
    # a deferred ZeRO-2/3 reduction runs once, after every micro-batch's backward: nothing left to hide it
    once = runtime.defers_grad_reduce(zero, pipelined)
    overlap = runtime.overlaps_grad_reduce(zero, pipelined) and not once
    after_step = runtime.gathers_weights_after_step(zero, pipelined, weights_dtype(dtype))
    bucket = 0.0 if zero == 3 else bucket_params(runtime, group.size, overlap)
    grad_kind = "all_reduce" if zero == 0 else "reduce_scatter"
    grad = bucketed_pass(grad_kind, params, group, dtype, runtime, bucket, layer_grad_s, first_grad_s)
    if zero == 0 and not after_step:
        none = np.zeros_like(grad.total_s)
        return DpSync(zero, grad, Pass(none, none, none), overlap)
    # ZeRO-1/2 gather the weights in the same buckets when they overlap the gather (Megatron-Core's
    # overlap-param-gather runs per bucket), else in one call after the step
    gather_bucket = 0.0 if zero == 3 else bucket_params(runtime, group.size, runtime.overlap_param_gather)
    return DpSync(zero, grad, bucketed_pass("all_gather", params, group, dtype, runtime, gather_bucket,
                                            layer_gather_s, first_gather_s), overlap, after_step, once)


def one_after_other(a: DpSync, b: DpSync) -> DpSync:
    """Two buffers' synchronisations one after the other on the link (Megatron-Core keeps the experts'
    gradients in their own buffers, reduced over the expert-data-parallel group): the times and bytes add,
    the unhidden edge bucket is the larger one."""
    def join(x: Pass, y: Pass) -> Pass:
        return Pass(x.total_s + y.total_s, np.maximum(x.edge_s, y.edge_s), x.sent_bytes + y.sent_bytes)
    return replace(a, grad=join(a.grad, b.grad), gather=join(a.gather, b.gather))


def sync_tail_s(sync: DpSync, runtime: Runtime, last_backward_s: np.ndarray | float,
                first_forward_s: np.ndarray | float) -> np.ndarray:
    """What the once-per-iteration synchronisation adds after a stage's last backward: the gradient
    reduction of ZeRO-0/1 past the last micro-batch's backward (``last_backward_s``) and the weights'
    all-gather of ZeRO-1/2 past the next iteration's first forward (``first_forward_s``), and a deferred
    ZeRO-2/3 reduction whole (``DpSync.grad_once``). Otherwise ZeRO-2 reduces in every micro-batch
    (:func:`micro_batch_reduce_s`) and ZeRO-3 gathers in every micro-batch (:func:`zero3_exposed_s`); neither
    is part of the tail."""
    tail = np.zeros_like(sync.grad.total_s)
    if sync.zero in (0, 1) or sync.grad_once:
        tail = tail + exposed_s(sync.grad.total_s, sync.grad.edge_s, last_backward_s, sync.overlap_grad)
    if sync.gather_after_step:
        tail = tail + exposed_s(sync.gather.total_s, sync.gather.edge_s, first_forward_s,
                                runtime.overlap_param_gather)
    return tail


def tied_grad_sync_s(tied_params: np.ndarray | float, group: CommGroup, dtype: str,
                     runtime: Runtime) -> np.ndarray:
    """The all-reduce that keeps a tied weight's two copies in step (a tied LM head's copy of the word
    embedding on a later stage, ``planner.cost.memory.stage_tied_params``): ``tied_params`` per rank, at the
    gradients' reduction width, over ``group`` (the owner's rank and the copy's). Megatron-Core runs it once
    per iteration after the data-parallel reduction has finished and before the optimizer step, on the whole
    gradient, overlapped with nothing (megatron/core/distributed/finalize_model_grads.py:
    ``finish_grad_sync`` then ``_allreduce_word_embedding_grads``); both stages wait for it."""
    size_bytes = np.asarray(tied_params, dtype=float) * gradient_reduce_bytes(dtype, runtime)
    return collective_times_s("all_reduce", size_bytes, group)


def micro_batch_reduce_s(sync: DpSync, backward_s: np.ndarray | float) -> np.ndarray:
    """ZeRO-2: what each micro-batch's gradient reduce-scatter adds to its backward (0 for other stages)."""
    if sync.zero != 2 or sync.grad_once:
        return np.zeros_like(sync.grad.total_s)
    return exposed_s(sync.grad.total_s, sync.grad.edge_s, backward_s, sync.overlap_grad)


def dp_bytes_per_iteration(sync: DpSync, micro_batches: np.ndarray | float) -> np.ndarray:
    """Bytes each data-parallel rank sends per iteration: ZeRO-0/1 one pass of each kind, ZeRO-2 the
    reduce-scatter per micro-batch and one gather, ZeRO-3 two gathers and a reduce-scatter per micro-batch
    (deferred, ``DpSync.grad_once``: one reduce-scatter, ZeRO-3 one gather per micro-batch and one more)."""
    grad, gather = sync.grad.sent_bytes, sync.gather.sent_bytes
    if sync.zero == 3 and sync.grad_once:
        return (micro_batches + 1.0) * gather + grad
    if sync.zero == 3:
        return micro_batches * (grad + 2.0 * gather)
    if sync.zero == 2 and not sync.grad_once:
        return micro_batches * grad + gather
    return grad + gather


def dp_sync_time_s(params_per_rank: float, group: CommGroup, zero: int, dtype: str, overlap_window_s: float,
                   gather_window_s: float = 0.0, runtime: Runtime | str | None = None) -> float:
    """Exposed seconds of the data-parallel synchronisation of an iteration of one micro-batch under ZeRO
    0-2, in the runtime's buckets: the gradient reduction past ``overlap_window_s`` of backward and the
    weights' gather past ``gather_window_s`` of forward, as the runtime's flags allow (ZeRO-3's per-layer
    collectives: :func:`zero3_exposed_s`)."""
    if zero == 3:
        raise ConfigError("ZeRO-3 gathers and reduces layer by layer; time it with zero3_exposed_s")
    rt = get_runtime(runtime)
    sync = dp_sync(zero, np.asarray(float(params_per_rank)), group, dtype, rt)
    return float(sync_tail_s(sync, rt, overlap_window_s, gather_window_s)
                 + micro_batch_reduce_s(sync, overlap_window_s))


# ------------------------------------------------------------------------------------------ ZeRO-3


def zero3_exposed_s(forward_s: np.ndarray, backward_s: np.ndarray, gather_s: np.ndarray, reduce_s: np.ndarray,
                    prefetch_layers: int, overlap_grad_reduce: bool, deferred: bool = False
                    ) -> tuple[np.ndarray, np.ndarray]:
    """(forward, backward) seconds that ZeRO-3's per-layer collectives add to one micro-batch.

    Arrays are [row, layer] in forward order (rows padded with zero layers at the end). One stream gathers
    layer after layer, each issued when the layer ``prefetch_layers`` = k before it starts computing (FSDP2's
    implicit prefetch issues the next layer's all-gather while the current one computes; DeepSpeed's
    stage3 prefetch likewise; k = 0: on demand, once the previous layer ends), so a layer's gather hides
    only behind the compute before it:

        gather_end[l] = max(gather_end[l-1], start[l-k]) + g_l,   start[l] = max(end[l-1], gather_end[l]),
        end[l] = start[l] + c_l.

    The backward runs the layers in reverse with the same gathers; each layer's reduce-scatter starts when
    its backward ends (on its own stream; after the whole backward without ``overlap_grad_reduce``), and
    the gathers and reduce-scatters share the node's links, so the backward takes at least their sum.

    ``deferred`` (``Runtime.defers_grad_reduce``): a pipeline stage whose backward leaves the weights
    unsharded and the gradients unreduced; the forward after a backward finds them gathered, so only the
    backward gathers, and no reduce-scatter runs until the last micro-batch (``DpSync.grad_once``).
    """
    k = max(0, int(prefetch_layers))

    def run(compute: np.ndarray, gathers: np.ndarray, reduces: np.ndarray | None) -> np.ndarray:
        rows, layers = compute.shape
        starts = np.zeros((rows, layers))
        gather_end = np.zeros(rows)
        end = np.zeros(rows)
        reduce_end = np.zeros(rows)
        for layer in range(layers):
            # issued when the layer k before starts; without prefetch, when the previous layer ends
            issue = end if k == 0 else (starts[:, layer - k] if layer - k >= 0 else 0.0)
            gather_end = np.maximum(gather_end, issue) + gathers[:, layer]
            starts[:, layer] = np.maximum(end, gather_end)
            end = starts[:, layer] + compute[:, layer]
            if reduces is not None and overlap_grad_reduce:
                reduce_end = np.maximum(reduce_end, end) + reduces[:, layer]
        if reduces is not None:
            if not overlap_grad_reduce:
                reduce_end = end + reduces.sum(axis=1)
            end = np.maximum.reduce([end, reduce_end, gathers.sum(axis=1) + reduces.sum(axis=1)])
        return end - compute.sum(axis=1)

    if deferred:
        return np.zeros(forward_s.shape[0]), run(backward_s[:, ::-1], gather_s[:, ::-1], None)
    forward = run(forward_s, gather_s, None)
    backward = run(backward_s[:, ::-1], gather_s[:, ::-1], reduce_s[:, ::-1])
    return forward, backward


def zero3_exposed_lower_s(forward_sum_s: np.ndarray, backward_sum_s: np.ndarray, gather_sum_s: np.ndarray,
                          reduce_sum_s: np.ndarray, last_forward_s: np.ndarray, first_gather_s: np.ndarray,
                          last_gather_s: np.ndarray, first_reduce_s: np.ndarray, deferred: bool = False
                          ) -> tuple[np.ndarray, np.ndarray]:
    """Lower bounds on :func:`zero3_exposed_s` of a stage from its sums and its first and last layers
    (element-wise, e.g. per segment i..j): the forward waits for the first layer's gather, and its last
    layer computes after every gather; the backward waits for the last layer's gather and ends with the
    first layer's reduce-scatter, and takes at least the link time of all its collectives. ``deferred``: as
    :func:`zero3_exposed_s`, the backward's gathers only."""
    if deferred:
        backward = np.maximum(0.0, np.maximum(last_gather_s, gather_sum_s - backward_sum_s))
        return np.zeros_like(backward), backward
    forward = np.maximum(first_gather_s, gather_sum_s + last_forward_s - forward_sum_s)
    backward = np.maximum(last_gather_s + first_reduce_s, gather_sum_s + reduce_sum_s - backward_sum_s)
    return np.maximum(0.0, forward), np.maximum(0.0, backward)
