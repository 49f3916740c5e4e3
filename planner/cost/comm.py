"""Communication of a training iteration: tensor-parallel collectives, data-parallel gradient
synchronisation (bucketed, overlapped with the backward pass) and ZeRO gathers, on the tier they run on.

The collective formulas themselves (alpha-beta, ring/hierarchical, slowest link) live in
``planner.hardware.collectives``; this module decides which collectives an iteration issues, over which
group of ranks, and how much of them the computation hides.

Groups. A tensor-parallel group lies inside one node. A data-parallel group of a stage has one rank per
replica (``planner.hardware.collectives.comm_group``: when several such groups share a node, one per
tensor-parallel rank, they share its NICs).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Sequence

import numpy as np

from planner.cost.calibration import DeviceCalibration
from planner.cost.memory import dtype_bytes
from planner.errors import ConfigError
from planner.hardware.collectives import CommGroup, collective_time_s, comm_group
from planner.types import Cluster, NodeProfile

# Megatron-Core's DistributedDataParallelConfig: gradient buckets of max(40M, 1M x dp) parameters
# (megatron/core/distributed/distributed_data_parallel.py); the last bucket cannot overlap the backward.
BUCKET_PARAMS = 40_000_000


def tp_group(node: NodeProfile, tp: int, cal: DeviceCalibration) -> CommGroup:
    """A tensor-parallel group: ``tp`` ranks inside one node, at the node's achieved intra-node bandwidth."""
    intra = node.intra_node_bandwidth_Bps * node.intra_node_efficiency * cal.comm_scale
    return CommGroup(size=tp, ranks_per_node=tp, intra_bandwidth_Bps=intra, intra_latency_s=node.intra_node_latency_s,
                     inter_bandwidth_Bps=intra, inter_latency_s=node.intra_node_latency_s)


def dp_group(cluster: Cluster, leaders: Sequence[int], cal: DeviceCalibration) -> CommGroup:
    """The data-parallel group formed by ``leaders`` (the first device of each replica's tensor-parallel
    group; the groups of the other tensor-parallel ranks run alike and at once), as the estimator times it:
    ``planner.hardware.collectives.comm_group`` (NIC share, slowest node, fabric latency, oversubscription)
    with the calibrated ``comm_scale``. For a replica group ``devices``: ``dp_group(cluster, devices[::tp], cal)``."""
    return scaled_group(comm_group(cluster, list(leaders)), cal)


def scaled_group(group: CommGroup, cal: DeviceCalibration) -> CommGroup:
    """``group`` with both tiers' bandwidths multiplied by the calibrated ``comm_scale``."""
    if cal.comm_scale == 1.0:
        return group
    return replace(group, intra_bandwidth_Bps=group.intra_bandwidth_Bps * cal.comm_scale,
                   inter_bandwidth_Bps=group.inter_bandwidth_Bps * cal.comm_scale)


def tp_collective_time_s(kind: str, size_bytes: float, node: NodeProfile, tp: int, cal: DeviceCalibration) -> float:
    """One tensor-parallel collective of ``size_bytes`` (the full, unsharded tensor) inside a node.
    ``kind`` is ``all_reduce`` or ``reduce_scatter+all_gather`` (sequence parallelism)."""
    if tp <= 1 or size_bytes <= 0:
        return 0.0
    group = tp_group(node, tp, cal)
    if kind == "all_reduce":
        return collective_time_s("all_reduce", size_bytes, group)
    if kind == "reduce_scatter+all_gather":
        return collective_time_s("reduce_scatter", size_bytes, group) + collective_time_s("all_gather", size_bytes, group)
    raise ValueError(f"unknown tensor-parallel collective {kind!r}")


def dp_comm_total_s(params_per_rank: float, group: CommGroup, zero: int, dtype: str) -> tuple[float, float]:
    """(gradient reduction, parameter gather) seconds of one iteration's data-parallel synchronisation.

    ZeRO 0: all-reduce of the gradients. ZeRO 1-2: reduce-scatter of the gradients, then all-gather of the
    updated weights. ZeRO 3: reduce-scatter only (weights stay sharded; their per-micro-batch gathers are
    counted with the stage's forward and backward by the estimator, see ``zero3_gather_time_s``).
    """
    if zero not in (0, 1, 2, 3):
        raise ConfigError(f"zero={zero} is not a ZeRO stage; use 0, 1, 2 or 3")
    if group.size <= 1 or params_per_rank <= 0:
        return 0.0, 0.0
    nbytes = params_per_rank * dtype_bytes(dtype)
    if zero == 0:
        return collective_time_s("all_reduce", nbytes, group), 0.0
    reduce = collective_time_s("reduce_scatter", nbytes, group)
    gather = collective_time_s("all_gather", nbytes, group) if zero in (1, 2) else 0.0
    return reduce, gather


def exposed_sync_s(reduce_s: np.ndarray | float, gather_s: np.ndarray | float, params_per_rank: np.ndarray | float,
                   overlap_window_s: np.ndarray | float, gather_window_s: np.ndarray | float = 0.0
                   ) -> np.ndarray | float:
    """What the computation does not hide of a synchronisation (numpy arrays welcome): the gradient
    reduction past ``overlap_window_s`` and the weight gather past ``gather_window_s``, each at least one
    bucket's worth (the last bucket to reduce, the first to gather)."""
    buckets = np.maximum(1.0, np.asarray(params_per_rank, dtype=float) / BUCKET_PARAMS)
    reduce = np.maximum(reduce_s - np.maximum(0.0, overlap_window_s), reduce_s / buckets)
    gather = np.maximum(gather_s - np.maximum(0.0, gather_window_s), gather_s / buckets)
    return reduce + gather


def dp_sync_time_s(params_per_rank: float, group: CommGroup, zero: int, dtype: str, overlap_window_s: float,
                   gather_window_s: float = 0.0) -> float:
    """Exposed seconds of the data-parallel synchronisation of one iteration.

    Gradients are reduced in buckets of ``BUCKET_PARAMS`` as the last micro-batch's backward pass produces
    them, so up to ``overlap_window_s`` of the reduction hides behind it; the last bucket always shows. The
    weight all-gather of ZeRO 1-2 (after the optimizer step) hides, bucket by bucket, behind up to
    ``gather_window_s`` of the next iteration's first forward pass (Megatron-Core's overlap-param-gather),
    its first bucket always showing; ``gather_window_s = 0`` exposes it whole.
    """
    reduce, gather = dp_comm_total_s(params_per_rank, group, zero, dtype)
    return float(exposed_sync_s(reduce, gather, params_per_rank, overlap_window_s, gather_window_s))


def zero3_gather_time_s(params_per_rank: float, group: CommGroup, dtype: str) -> float:
    """One all-gather of a ZeRO-3 stage's weights (done before each micro-batch's forward and backward)."""
    if group.size <= 1 or params_per_rank <= 0:
        return 0.0
    return collective_time_s("all_gather", params_per_rank * dtype_bytes(dtype), group)
