"""Alpha-beta model of collective communication over any group of devices.

A group spans ``N = size / ranks_per_node`` nodes with ``r = ranks_per_node`` ranks on each. Two tiers:
intra-node (``B_i`` per rank each way, latency ``a_i`` per step) and inter-node (``B_n`` per node each way,
for this group's ranks on the node, latency ``a_n`` per step). Bandwidths in a :class:`CommGroup` are the
*achieved* ones (line rate x the tier's efficiency, the slowest node, oversubscription applied).

Algorithms (the fastest applicable one is used), for a buffer of ``S`` bytes:

* ring (node-contiguous rank order, one ring per NIC as NCCL builds them): every rank sends
  ``2(n-1)/n S`` for all-reduce, ``(n-1)/n S`` for reduce-scatter / all-gather. Each node's network traffic is
  the same ``2(n-1)/n S`` whatever ``r`` is, so the bound is ``min(B_i, B_n)``. Latency follows NCCL's tuning
  model (src/graph/tuning.cc): ``(steps - inter_steps) a_i + inter_steps a_n`` with ``2(n-1)`` steps of which
  ``2(N-1)`` cross nodes.
* tree (pipelined, NCCL's double binary tree between nodes, a chain inside a node): all-reduce moves
  ``2 S`` over the slowest tier; latency ``2((r-1) a_i + log2(N) a_n)``.
* hierarchical all-reduce (intra-node reduce-scatter over NVLink, inter-node all-reduce of the ``S/r``
  shards by all ``r`` ranks at once, each over its share ``B_n/r`` of the node's NICs, intra-node all-gather):
  crosses the network with ``2(N-1)/N S`` per node and pays the latency of ``N`` nodes (ring ``2(N-1)`` steps
  or tree ``2 log2 N``) rather than ``n`` ranks. Reduce-scatter and all-gather have no such form: NCCL runs
  them as rings over every rank (src/graph/tuning.cc offers them Ring, PAT with one rank per node, NVLS in
  one node and CollNet on SHARP switches only), so they pay the ring's ``n - 1`` steps.
* NVLS (NVLink SHARP, all-reduce inside one node whose switches reduce and multicast: NVSwitch 3 on Hopper
  and later): each rank reduces its ``1/n`` share through the switch, which reads that share from every rank,
  and writes the result once for the switch to multicast, so a rank's link carries ``(1 + 1/n) S`` each way
  against the ring's ``2(n-1)/n S``, at the node's own NVLS efficiency of the line rate
  (``NodeProfile.nvls_efficiency``), so it beats the ring only on the larger groups, as NCCL's measured
  busbw by group size shows (NVIDIA/nccl#1455; benchmarks/bench_collectives.py compares). Latency: NCCL's
  NVLS base latency.
* all-to-all: direct pairwise exchange; ``S`` is what each rank sends in total, ``(r-1)/n`` of it stays on the
  node and ``(n-r)/n`` leaves it; both tiers run at once.

Every algorithm is affine in ``S`` once the group is fixed, and the group's time is their minimum, so the
time of one collective grows with the group: the bandwidth term through the busbw factors of nccl-tests'
doc/PERFORMANCE.md (``2(n-1)/n`` all-reduce, ``(n-1)/n`` reduce-scatter/all-gather, which rise towards 2 and
1 as the group grows) and the latency term through the step counts (ring ``2(n-1)``, tree ``log2 N``).
``collective_times_s`` evaluates them for an array of sizes at once (the search's prefix sums).

Closed forms are in the tests (tests/test_hardware_collectives.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Callable, Sequence

import numpy as np

from planner.errors import ConfigError
from planner.hardware.cluster import locate
from planner.types import Cluster, NodeProfile

KINDS = ("all_reduce", "reduce_scatter", "all_gather", "all_to_all", "broadcast", "send_recv")


@dataclass(frozen=True)
class CommGroup:
    size: int  # ranks in the group
    ranks_per_node: int  # ranks of the group on one node (1 if every rank on its own node); size % ranks_per_node == 0
    intra_bandwidth_Bps: float  # per-rank intra-node bandwidth each way (slowest node of the group), achieved
    intra_latency_s: float
    inter_bandwidth_Bps: float  # per-NODE network bandwidth each way available to this group's ranks on a node
    inter_latency_s: float
    nvls_bandwidth_Bps: float = 0.0  # per-rank NVLink SHARP bandwidth each way (0: no NVLS on the nodes)

    @property
    def nodes(self) -> int:
        return self.size // self.ranks_per_node


# ------------------------------------------------------------------------------------------- algorithms
# Each returns the time in seconds, or math.inf where the algorithm does not apply; ``s`` is a float or a
# numpy array of sizes (the arithmetic broadcasts).

def _bottleneck(g: CommGroup) -> float:
    """Bandwidth bound of a pipelined ring/tree: the slowest tier it crosses."""
    if g.nodes == 1:
        return g.intra_bandwidth_Bps
    if g.ranks_per_node == 1:
        return g.inter_bandwidth_Bps
    return min(g.intra_bandwidth_Bps, g.inter_bandwidth_Bps)


def _ring_latency(g: CommGroup, steps: int, inter_steps: int) -> float:
    if g.nodes == 1:
        return steps * g.intra_latency_s
    return (steps - inter_steps) * g.intra_latency_s + inter_steps * g.inter_latency_s


def _ring(kind: str, s: float, g: CommGroup) -> float:
    n, nn = g.size, g.nodes
    b = _bottleneck(g)
    if kind == "all_reduce":
        return 2 * (n - 1) / n * s / b + _ring_latency(g, 2 * (n - 1), 2 * (nn - 1))
    if kind in ("reduce_scatter", "all_gather"):
        return (n - 1) / n * s / b + _ring_latency(g, n - 1, nn - 1)
    if kind == "broadcast":  # pipelined chain
        return s / b + _ring_latency(g, n - 1, nn - 1)
    return math.inf


def _tree(kind: str, s: float, g: CommGroup) -> float:
    if kind not in ("all_reduce", "broadcast"):
        return math.inf
    b = _bottleneck(g)
    depth = (g.ranks_per_node - 1) * g.intra_latency_s + math.ceil(math.log2(g.nodes)) * g.inter_latency_s
    if g.nodes == 1:
        depth = math.ceil(math.log2(g.size)) * g.intra_latency_s
    if kind == "all_reduce":
        return 2 * s / b + 2 * depth
    return s / b + depth


def _hierarchical(kind: str, s: float, g: CommGroup) -> float:
    r, nn = g.ranks_per_node, g.nodes
    if nn == 1 or r == 1 or kind != "all_reduce":
        return math.inf
    intra = CommGroup(r, r, g.intra_bandwidth_Bps, g.intra_latency_s, g.intra_bandwidth_Bps, g.intra_latency_s)
    # the inter-node phase: r concurrent all-reduces over nn nodes, each on S/r bytes with B_n/r
    inter = CommGroup(nn, 1, g.intra_bandwidth_Bps, g.intra_latency_s, g.inter_bandwidth_Bps / r, g.inter_latency_s)
    shard = s / r
    return (2 * _best("reduce_scatter", s, intra)
            + np.minimum(_ring("all_reduce", shard, inter), _tree("all_reduce", shard, inter)))


# NCCL's base latency of an NVLS collective, Simple protocol (src/graph/tuning.cc, baseLatencies; the per-hop
# NVLink latency of NVLS is 0 there)
NVLS_LATENCY_S = 25e-6


def _nvls(kind: str, s: float, g: CommGroup) -> float:
    """NVLink SHARP all-reduce inside one node: ``(1 + 1/n) S`` each way per rank (module docstring)."""
    if kind != "all_reduce" or g.nodes != 1 or g.nvls_bandwidth_Bps <= 0:
        return math.inf
    return (1 + 1 / g.size) * s / g.nvls_bandwidth_Bps + NVLS_LATENCY_S


def _all_to_all(kind: str, s: float, g: CommGroup) -> float:
    if kind != "all_to_all":
        return math.inf
    n, r, nn = g.size, g.ranks_per_node, g.nodes
    intra = (r - 1) / n * s / g.intra_bandwidth_Bps if r > 1 else 0.0
    inter = r * (n - r) / n * s / g.inter_bandwidth_Bps if nn > 1 else 0.0
    latency = (r - 1) * g.intra_latency_s + (nn - 1) * g.inter_latency_s
    return max(intra, inter) + latency


def _send_recv(kind: str, s: float, g: CommGroup) -> float:
    """Every rank sends ``s`` bytes to a neighbour at once (pipeline hand-off); across nodes the node's
    bandwidth is shared by its ``r`` senders."""
    if kind != "send_recv":
        return math.inf
    if g.nodes == 1:
        return s / g.intra_bandwidth_Bps + g.intra_latency_s
    return s / (g.inter_bandwidth_Bps / g.ranks_per_node) + g.inter_latency_s


ALGORITHMS: dict[str, Callable[[str, float, CommGroup], float]] = {
    "ring": _ring, "tree": _tree, "hierarchical": _hierarchical, "nvls": _nvls, "pairwise": _all_to_all,
    "direct": _send_recv,
}


def _best(kind: str, s: float | np.ndarray, g: CommGroup) -> float | np.ndarray:
    out: float | np.ndarray = math.inf
    for f in ALGORITHMS.values():
        out = np.minimum(out, f(kind, s, g))
    return out


def _validate(kind: str, group: CommGroup) -> None:
    if kind not in KINDS:
        raise ConfigError(f"unknown collective {kind!r}; one of {', '.join(KINDS)}")
    if group.size < 1 or group.ranks_per_node < 1 or group.size % group.ranks_per_node:
        raise ConfigError(f"bad communication group: size {group.size} is not a multiple of ranks_per_node "
                          f"{group.ranks_per_node}")


@lru_cache(maxsize=1 << 16)
def collective_algorithm(kind: str, size_bytes: float, group: CommGroup) -> tuple[str, float]:
    """(name of the fastest algorithm, its time in seconds)."""
    _validate(kind, group)
    if group.size == 1 or size_bytes <= 0:
        return "none", 0.0
    times = {name: f(kind, float(size_bytes), group) for name, f in ALGORITHMS.items()}
    name = min(times, key=lambda key: (times[key], key))
    return name, times[name]


def collective_time_s(kind: str, size_bytes: float, group: CommGroup) -> float:
    """Seconds for one collective. ``size_bytes``: all_reduce the per-rank buffer; all_gather/reduce_scatter
    the gathered full buffer; all_to_all what each rank sends in total; broadcast the buffer; send_recv what
    each rank sends."""
    return collective_algorithm(kind, size_bytes, group)[1]


def collective_times_s(kind: str, sizes_bytes: np.ndarray, group: CommGroup) -> np.ndarray:
    """``collective_time_s`` of every size in an array at once (the same algorithms, the fastest per size)."""
    _validate(kind, group)
    sizes = np.asarray(sizes_bytes, dtype=float)
    if group.size == 1:
        return np.zeros_like(sizes)
    return np.where(sizes > 0, np.broadcast_to(_best(kind, np.maximum(sizes, 0.0), group), sizes.shape), 0.0)


def sent_bytes(kind: str, size_bytes: float | np.ndarray, group_size: int) -> float | np.ndarray:
    """Bytes each rank sends in one collective of ``size_bytes`` (the same meaning as for
    ``collective_time_s``) by a bandwidth-optimal algorithm: nccl-tests doc/PERFORMANCE.md's busbw factors,
    ``2(n-1)/n S`` for all-reduce, ``(n-1)/n S`` for reduce-scatter and all-gather (so that an all-reduce
    moves what a reduce-scatter plus an all-gather move: Rajbhandari et al. 2020, Section 7)."""
    if group_size <= 1:
        return 0.0 * size_bytes
    return _busbw_factor(kind, group_size) * size_bytes


def algorithm_time_s(algorithm: str, kind: str, size_bytes: float, group: CommGroup) -> float:
    """One named algorithm (``ring``, ``tree``, ``hierarchical``, ...); inf where it does not apply."""
    _validate(kind, group)
    if group.size == 1 or size_bytes <= 0:
        return 0.0
    return ALGORITHMS[algorithm](kind, float(size_bytes), group)


def _busbw_factor(kind: str, n: int) -> float:
    """nccl-tests doc/PERFORMANCE.md: busbw = algbw x 2(n-1)/n for all-reduce, x (n-1)/n for reduce-scatter,
    all-gather and all-to-all, x 1 for broadcast."""
    return {"all_reduce": 2 * (n - 1) / n, "reduce_scatter": (n - 1) / n, "all_gather": (n - 1) / n,
            "all_to_all": (n - 1) / n}.get(kind, 1.0)


def bus_bandwidth_Bps(kind: str, size_bytes: float, group: CommGroup, time_s: float) -> float:
    """nccl-tests' bus bandwidth (doc/PERFORMANCE.md) of a collective that took ``time_s``."""
    return size_bytes / time_s * _busbw_factor(kind, group.size)


# ------------------------------------------------------------------------------------ groups of a cluster

def intra_group_Bps(node: NodeProfile, ranks: int) -> float:
    """Achieved bandwidth per device, each way, among ``ranks`` devices of one group on ``node``. On a switched
    fabric every group reaches the node's whole per-device bandwidth; on a direct-link fabric a device reaches
    its group's peers over its links to them only (``NodeProfile.intra_node_group_fraction``, the fraction
    of the smallest listed group size that holds ``ranks``), the same for groups of other devices; a group of
    every device of the node uses all of their links."""
    fraction = 1.0 if ranks >= node.devices_per_node else next(
        (f for size, f in node.intra_node_group_fraction if ranks <= size), 1.0)
    return node.intra_node_bandwidth_Bps * fraction * node.intra_node_efficiency


def nvls_Bps(node: NodeProfile) -> float:
    """Achieved NVLink SHARP bandwidth per device, each way, on ``node`` (0 where it has none)."""
    return node.intra_node_bandwidth_Bps * node.nvls_efficiency


def _inter_per_device_Bps(node: NodeProfile, cluster: Cluster) -> float:
    """The network bandwidth one device of the node gets when all its devices communicate at once."""
    return node.inter_node_bandwidth_Bps * node.inter_node_efficiency / node.devices_per_node / cluster.oversubscription


_GROUP_CACHE: dict[tuple[int, tuple[int, ...]], tuple[Cluster, CommGroup]] = {}
_GROUP_CACHE_SIZE = 1 << 14


def comm_group(cluster: Cluster, devices: Sequence[int]) -> CommGroup:
    """The CommGroup of a set of global device ids: ranks per node (the gcd of the per-node counts), the
    slowest node's links, and the network share of the group's ranks on a node. Every device of a node is
    assumed to communicate at once in parallel groups of the same shape (as in 3-D parallelism), so a group
    with ``r`` ranks on a node of ``d`` devices gets ``r/d`` of the node's NICs, divided by the fabric's
    oversubscription; the inter-node latency includes the fabric's. Results are cached per (cluster,
    devices); the cache holds the cluster, so its id cannot be reused while the entry lives."""
    key = (id(cluster), tuple(devices))
    hit = _GROUP_CACHE.get(key)
    if hit is not None and hit[0] is cluster:
        return hit[1]
    group = _comm_group(cluster, key[1])
    if len(_GROUP_CACHE) >= _GROUP_CACHE_SIZE:
        _GROUP_CACHE.clear()
    _GROUP_CACHE[key] = (cluster, group)
    return group


def _comm_group(cluster: Cluster, devices: tuple[int, ...]) -> CommGroup:
    if not devices:
        raise ConfigError("communication group is empty")
    if len(set(devices)) != len(devices):
        raise ConfigError(f"communication group lists a device twice: {sorted(devices)}")
    per_node: dict[int, int] = {}
    nodes: dict[int, NodeProfile] = {}
    for device in devices:
        gi, node_index = locate(cluster, device)
        per_node[node_index] = per_node.get(node_index, 0) + 1
        nodes[node_index] = cluster.groups[gi].node
    ranks_per_node = math.gcd(*per_node.values())
    spanned = list({id(node): node for node in nodes.values()}.values())
    return CommGroup(
        size=len(devices),
        ranks_per_node=ranks_per_node,
        intra_bandwidth_Bps=min(intra_group_Bps(node, ranks_per_node) for node in spanned),
        intra_latency_s=max(node.intra_node_latency_s for node in spanned),
        inter_bandwidth_Bps=min(_inter_per_device_Bps(node, cluster) for node in spanned) * ranks_per_node,
        inter_latency_s=max(node.inter_node_latency_s for node in spanned) + cluster.fabric_latency_s,
        nvls_bandwidth_Bps=min(nvls_Bps(node) for node in spanned),
    )


def p2p_time_s(cluster: Cluster, src_device: int, dst_device: int, size_bytes: float) -> float:
    """One point-to-point transfer (a pipeline-stage hand-off). Across nodes each device gets its share of
    its node's NICs (every device of a stage sends at once); the slower end bounds it."""
    if src_device == dst_device or size_bytes <= 0:
        return 0.0
    gs, ns = locate(cluster, src_device)
    gd, nd = locate(cluster, dst_device)
    src, dst = cluster.groups[gs].node, cluster.groups[gd].node
    if ns == nd:
        return size_bytes / intra_group_Bps(src, 2) + src.intra_node_latency_s
    bandwidth = min(_inter_per_device_Bps(src, cluster), _inter_per_device_Bps(dst, cluster))
    latency = max(src.inter_node_latency_s, dst.inter_node_latency_s) + cluster.fabric_latency_s
    return size_bytes / bandwidth + latency
