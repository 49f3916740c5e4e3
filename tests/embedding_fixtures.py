"""Hand-built clusters for the embedding tests (datasheet numbers, so the tests need no catalog).

A100-SXM4-80GB: 80 GiB HBM2e, 2,039 GB/s (NVIDIA A100 datasheet); NVLink 3: 600 GB/s total = 300 GB/s each
way per GPU; DGX A100: 8 x 200 Gb/s HDR InfiniBand = 200 GB/s per node each way (DGX A100 user guide).
V100-SXM2-32GB: 32 GiB HBM2, 900 GB/s (NVIDIA V100 datasheet); NVLink 2: 300 GB/s total = 150 GB/s each
way; DGX-1: 4 x 100 Gb/s EDR InfiniBand = 50 GB/s per node (DGX-1 datasheet).
"""

from __future__ import annotations

import dataclasses

from planner.types import Cluster, DeviceGroup, DeviceProfile, NodeProfile

GiB = 1024 ** 3

A100 = DeviceProfile(name="a100-80gb", peak_flops_per_s={"bf16": 312e12}, memory_bytes=80 * GiB,
                     memory_bandwidth_Bps=2039e9, memory_efficiency=0.8, source="NVIDIA A100 datasheet")
V100 = DeviceProfile(name="v100-32gb", peak_flops_per_s={"fp16": 125e12}, memory_bytes=32 * GiB,
                     memory_bandwidth_Bps=900e9, memory_efficiency=0.8, source="NVIDIA V100 datasheet")
A100_NODE = NodeProfile(name="dgx-a100-80gb", device=A100, devices_per_node=8, intra_node_bandwidth_Bps=300e9,
                        intra_node_latency_s=5e-6, inter_node_bandwidth_Bps=200e9, inter_node_latency_s=10e-6)
V100_NODE = NodeProfile(name="hgx-v100-32gb", device=V100, devices_per_node=8, intra_node_bandwidth_Bps=150e9,
                        intra_node_latency_s=5e-6, inter_node_bandwidth_Bps=50e9, inter_node_latency_s=10e-6)


def cluster(*groups: tuple[NodeProfile, int]) -> Cluster:
    """A cluster of (node profile, node count) groups, numbered in order."""
    out, first = [], 0
    for node, count in groups:
        out.append(DeviceGroup(name=node.name, node=node, count=count, first_device=first))
        first += node.devices_per_node * count
    return Cluster(groups=tuple(out), name="+".join(f"{n.name}*{c}" for n, c in groups))


def small_node(node: NodeProfile, devices: int, memory_bytes: int | None = None) -> NodeProfile:
    """``node`` with fewer devices (and optionally less memory per device), for tiny test instances."""
    device = node.device if memory_bytes is None else dataclasses.replace(node.device, memory_bytes=memory_bytes)
    return dataclasses.replace(node, devices_per_node=devices, device=device)
