"""The devices an embedding plan may use, as flat numpy arrays (one entry per participating device).

Everything the sharding cost model needs to know about a device sits here: its lookup bandwidth (HBM and host),
its memory capacities, which node it is in, and the seconds per byte of its share of an all-to-all. Devices in
the same *class* (same device group and the same number of participating devices in their node) are
interchangeable; the LP bound aggregates them.

Collectives (reduce-scatter, all-gather, all-reduce) use planner.hardware.collectives; the all-to-all is
written per device here, because the placement MILP needs each device's share linear in its bytes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterator, Mapping, Sequence

import numpy as np

from planner.errors import ConfigError
from planner.hardware.collectives import CommGroup, collective_time_s, comm_group, intra_group_Bps
from planner.types import Cluster, DeviceGroup

# Host memory reachable per GPU for UVM placement, when a node profile gives none (``host_memory_GB``): twice
# the GPU's memory. Source: NVIDIA DGX-1 (V100) datasheet, 512 GB system memory for 8 x 32 GB GPUs (DGX A100
# and DGX H100 have 2 TB for 8 x 80 GB, 3.2x); nodes below 2x (DGX H200 1.77x, DGX B200 1.39x) give their own.
HOST_MEMORY_PER_GPU_MEMORY = 2.0
# GPU <-> host bandwidth for UVM lookups, when a device profile gives none: PCIe 4.0 x16, 16 GT/s x 16 lanes
# x 128/130 encoding = 31.5 GB/s each way (PCI-SIG PCIe 4.0 base specification).
PCIE4_X16_Bps = 31.5e9


def collective_latency_s(kind: str, group: CommGroup) -> float:
    """The latency part of a collective: what it costs on a one-byte buffer."""
    return collective_time_s(kind, 1.0, group)


def bandwidth_time_s(kind: str, size_bytes: float, group: CommGroup) -> float:
    """The bandwidth part of a collective: a table's share of a collective fused across tables."""
    return max(collective_time_s(kind, size_bytes, group) - collective_latency_s(kind, group), 0.0)


@dataclass(frozen=True)
class DeviceArrays:
    """Participating devices, index ``i`` = position in ``ids`` (global device ids, ascending)."""

    cluster: Cluster
    ids: tuple[int, ...]
    names: tuple[str, ...]  # device type per device
    node_of: np.ndarray  # int, node index per device
    nodes: tuple[tuple[int, ...], ...]  # device indices of each node (only nodes with participating devices)
    class_of: np.ndarray  # int, class index per device
    num_classes: int
    lookup_Bps: np.ndarray  # achieved HBM bandwidth for lookups
    host_Bps: np.ndarray  # host (UVM) bandwidth for lookups
    a2a_s_per_byte: np.ndarray  # seconds per byte a device sends (or receives) in an all-to-all of all devices
    a2a_latency_s: np.ndarray  # latency of one all-to-all phase
    hbm_capacity_bytes: np.ndarray  # bytes available to embeddings per device
    host_capacity_bytes: np.ndarray  # host bytes reachable per device (0 when host placement is off)
    intra_Bps: np.ndarray
    intra_latency_s: np.ndarray
    inter_Bps: np.ndarray  # per device share of the node's network bandwidth
    inter_latency_s: np.ndarray
    _groups: dict[tuple[int, ...], CommGroup] = field(default_factory=dict, compare=False, repr=False)

    @property
    def count(self) -> int:
        return len(self.ids)

    def group(self, members: Sequence[int]) -> CommGroup:
        """The CommGroup of some device indices (slowest member's links for a mixed group)."""
        key = tuple(np.asarray(members, dtype=np.int64).tolist())
        group = self._groups.get(key)
        if group is None:
            group = self._groups[key] = comm_group(self.cluster, [self.ids[i] for i in key])
        return group


def device_arrays(cluster: Cluster, devices: Sequence[int] | None = None,
                  memory_budget_bytes: Mapping[int, float] | None = None, allow_host: bool = True) -> DeviceArrays:
    """Flatten the participating devices of ``cluster`` (all of them when ``devices`` is None)."""
    located = list(_locate(cluster))
    by_id = {dev_id: (group, node) for dev_id, group, node in located}
    if devices is None:
        ids = [dev_id for dev_id, _, _ in located]
    else:
        ids = sorted(set(int(d) for d in devices))
        unknown = [d for d in ids if d not in by_id]
        if unknown:
            raise ConfigError(f"embedding devices: device {unknown[0]} is not in the cluster "
                              f"(it has devices 0..{cluster.num_devices - 1})")
    if not ids:
        raise ConfigError("embedding devices: the list of devices for the embedding tables is empty")
    node_keys = sorted({by_id[d][1] for d in ids})
    node_index = {key: k for k, key in enumerate(node_keys)}
    node_of = np.array([node_index[by_id[d][1]] for d in ids], dtype=int)
    nodes = tuple(tuple(int(i) for i in np.flatnonzero(node_of == k)) for k in range(len(node_keys)))
    groups = [by_id[d][0] for d in ids]
    # class = (group, participating devices in the node): such devices are interchangeable
    class_keys = [(id(g), len(nodes[node_of[i]])) for i, g in enumerate(groups)]
    class_index = {key: c for c, key in enumerate(dict.fromkeys(class_keys))}
    class_of = np.array([class_index[key] for key in class_keys], dtype=int)

    dev = [g.node.device for g in groups]
    lookup = np.array([d.memory_bandwidth_Bps * d.memory_efficiency for d in dev])
    host_bw = np.array([d.host_bandwidth_Bps or PCIE4_X16_Bps for d in dev])
    # achieved bandwidths, as planner.hardware.collectives uses them
    intra = np.array([intra_group_Bps(g.node, len(nodes[node_of[i]])) for i, g in enumerate(groups)])
    intra_lat = np.array([g.node.intra_node_latency_s for g in groups])
    inter = np.array([g.node.inter_node_bandwidth_Bps * g.node.inter_node_efficiency / g.node.devices_per_node
                      for g in groups]) / max(cluster.oversubscription, 1.0)
    inter_lat = np.array([g.node.inter_node_latency_s + cluster.fabric_latency_s for g in groups])
    n = len(ids)
    # all-to-all: a device sends 1/n of its bytes to each device; the same node's share crosses the intra-node
    # link, every other node's share crosses this node's NIC share, at the slower of the two ends' NIC shares.
    node_sizes = np.array([len(m) for m in nodes])
    node_inter = np.array([inter[m[0]] for m in nodes])
    a2a = np.empty(n)
    for i in range(n):
        k = node_of[i]
        rate = np.minimum(inter[i], node_inter)
        others = np.arange(len(nodes)) != k
        a2a[i] = (node_sizes[k] - 1) / n / intra[i] + float(np.sum(node_sizes[others] / n / rate[others]))
    multi_node = len(nodes) > 1
    a2a_lat = intra_lat + (inter_lat if multi_node else 0.0)

    capacity = np.array([float(d.memory_bytes) for d in dev])
    if memory_budget_bytes is not None:
        capacity = np.array([float(memory_budget_bytes.get(d, capacity[i])) for i, d in enumerate(ids)])
    host_cap = np.array([g.node.host_memory_bytes / g.node.devices_per_node
                         or HOST_MEMORY_PER_GPU_MEMORY * g.node.device.memory_bytes for g in groups])
    if not allow_host:
        host_cap = np.zeros(n)
    return DeviceArrays(cluster=cluster, ids=tuple(ids), names=tuple(d.name for d in dev), node_of=node_of, nodes=nodes,
                        class_of=class_of, num_classes=len(class_index), lookup_Bps=lookup, host_Bps=host_bw,
                        a2a_s_per_byte=a2a, a2a_latency_s=a2a_lat, hbm_capacity_bytes=np.maximum(capacity, 0.0),
                        host_capacity_bytes=host_cap, intra_Bps=intra, intra_latency_s=intra_lat, inter_Bps=inter,
                        inter_latency_s=inter_lat)


def _locate(cluster: Cluster) -> Iterator[tuple[int, DeviceGroup, tuple[int, int]]]:
    """(global device id, group, (group index, node index)) for every device of the cluster, numbered from
    each group's ``first_device`` as planner.hardware.cluster.locate does."""
    for gi, group in enumerate(cluster.groups):
        per_node = group.node.devices_per_node
        for local in range(group.num_devices):
            yield group.first_device + local, group, (gi, local // per_node)
