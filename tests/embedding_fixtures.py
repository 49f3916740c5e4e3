"""Clusters for the embedding tests: catalog nodes (hardware_profiles/), and shrunken copies of them for
instances small enough to brute-force."""

from __future__ import annotations

import dataclasses

import numpy as np

from planner.embeddings.devices import device_arrays
from planner.embeddings.problem import Problem, build_problem
from planner.hardware import load_cluster
from planner.types import Cluster, DeviceGroup, EmbeddingTable, NodeProfile

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


def small_problem(seed: int, count: int, memory_bytes: int | None = None,
                  second: str = "hgx-v100-32gb") -> Problem:
    """2 nodes x 2 devices (a dgx-a100-80gb node and a ``second`` node) and ``count`` seeded tables, small
    enough to brute-force; rows a multiple of 4 so that row splits are even."""
    rng = np.random.default_rng(seed)
    c = cluster((small_node(node("dgx-a100-80gb"), 2, memory_bytes), 1), (small_node(node(second), 2, memory_bytes), 1))
    tables = tuple(EmbeddingTable(f"t{i}", 4 * int(rng.integers(10, 500_000)), int(rng.choice([8, 16])),
                                  float(rng.choice([1, 4, 20, 80]))) for i in range(count))
    return build_problem(tables, device_arrays(c), 4096, "adagrad")
