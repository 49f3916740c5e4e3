"""Small seeded models and clusters for the search tests (no ONNX, no hardware files needed)."""

from __future__ import annotations

import numpy as np

from planner.types import Cluster, DeviceGroup, DeviceProfile, Layer, LayerGraph, NodeProfile
from planner.units import GIB

# illustrative device shapes for solver tests (not a hardware catalog)
DEVICES = {
    "fast": DeviceProfile(name="fast", peak_flops_per_s={"bf16": 900e12}, memory_bytes=80 * GIB,
                          memory_bandwidth_Bps=3.0e12),
    "mid": DeviceProfile(name="mid", peak_flops_per_s={"bf16": 300e12}, memory_bytes=40 * GIB,
                         memory_bandwidth_Bps=1.5e12),
    "slow": DeviceProfile(name="slow", peak_flops_per_s={"bf16": 100e12}, memory_bytes=16 * GIB,
                          memory_bandwidth_Bps=0.8e12),
}


def node(device: str, per_node: int) -> NodeProfile:
    return NodeProfile(name=f"{device}-x{per_node}", device=DEVICES[device], devices_per_node=per_node,
                       intra_node_bandwidth_Bps=200e9, intra_node_latency_s=2e-6,
                       inter_node_bandwidth_Bps=25e9 * per_node, inter_node_latency_s=5e-6)


def cluster(*groups: tuple[str, int, int]) -> Cluster:
    """``cluster(("fast", 4, 2), ("slow", 2, 4))``: (device, devices per node, nodes) per group."""
    out, first = [], 0
    for i, (device, per_node, count) in enumerate(groups):
        out.append(DeviceGroup(name=f"g{i}", node=node(device, per_node), count=count, first_device=first))
        first += per_node * count
    return Cluster(groups=tuple(out), name="test")


def random_model(seed: int, num_layers: int, scale: float = 1.0) -> LayerGraph:
    """Transformer-like layers with random sizes (per sample)."""
    rng = np.random.default_rng(seed)
    layers = []
    for i in range(num_layers):
        params = int(rng.uniform(0.2e9, 1.5e9) * scale)
        flops = float(2 * params * 2048 * rng.uniform(0.8, 1.2))
        layers.append(Layer(index=i, name=f"layer{i}", kind="block", params=params, flops_forward=flops,
                            activation_bytes=float(rng.uniform(0.5e9, 3e9) * scale),
                            output_bytes=float(2048 * 4096 * 2 * rng.uniform(0.5, 1.5))))
    return LayerGraph(name=f"random{seed}", layers=tuple(layers))
