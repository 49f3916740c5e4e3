"""Clusters for the embedding tests: catalog nodes (hardware_profiles/), and shrunken copies of them for
instances small enough to brute-force."""

from __future__ import annotations

import dataclasses

from planner.hardware import load_cluster
from planner.types import Cluster, DeviceGroup, NodeProfile

GiB = 1024 ** 3


def node(name: str) -> NodeProfile:
    return load_cluster(f"{name}*1").groups[0].node


def cluster(*groups: tuple[NodeProfile, int]) -> Cluster:
    """A cluster of (node profile, node count) groups, devices numbered in order."""
    out, first = [], 0
    for profile, count in groups:
        out.append(DeviceGroup(name=profile.name, node=profile, count=count, first_device=first))
        first += profile.devices_per_node * count
    return Cluster(groups=tuple(out), name="+".join(f"{p.name}*{c}" for p, c in groups))


def small_node(profile: NodeProfile, devices: int, memory_bytes: int | None = None) -> NodeProfile:
    """``profile`` with fewer devices (and optionally less memory per device)."""
    device = profile.device if memory_bytes is None else dataclasses.replace(profile.device, memory_bytes=memory_bytes)
    return dataclasses.replace(profile, devices_per_node=devices, device=device)
