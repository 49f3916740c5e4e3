"""Hand-built clusters, plans and a fake point evaluator for the what-if unit tests (no graph/search needed)."""

from __future__ import annotations

import logging

from planner.errors import ClusterError, InfeasibleError
from planner.plans import Plan, StagePlan
from planner.sweep.keys import PointInputs, check_groups, parse_sweeps, point_inputs
from planner.sweep.runner import run_tasks
from planner.types import Cluster, DeviceGroup, DeviceProfile, NodeProfile
from planner.sweep.whatif import PointTask, WhatIfPoint, WhatIfResult, infeasible, summarize


def device(name: str, tflops: float, memory_gib: int) -> DeviceProfile:
    return DeviceProfile(name=name, peak_flops_per_s={"bf16": tflops * 1e12}, memory_bytes=memory_gib * 2**30,
                         memory_bandwidth_Bps=2e12, source="test fixture")


def node(name: str, dev: DeviceProfile, per_node: int = 8, inter_GBps: float = 25.0) -> NodeProfile:
    return NodeProfile(name=name, device=dev, devices_per_node=per_node, intra_node_bandwidth_Bps=300e9,
                       intra_node_latency_s=1e-6, inter_node_bandwidth_Bps=inter_GBps * 1e9,
                       inter_node_latency_s=5e-6, source="test fixture")


NODES = {
    "fake-a100": node("fake-a100", device("a100", 312, 80)),
    "fake-h100": node("fake-h100", device("h100", 989, 80), inter_GBps=50.0),
}


class FakeCatalog:
    """Stands in for planner.hardware.catalog."""

    @staticmethod
    def get_node(name: str) -> NodeProfile:
        if name not in NODES:
            raise ClusterError(f"unknown node profile {name!r}")
        return NODES[name]

    @staticmethod
    def get_device(name: str) -> DeviceProfile:
        devices = {n.device.name: n.device for n in NODES.values()}
        if name not in devices:
            raise ClusterError(f"unknown device {name!r}")
        return devices[name]


def mixed_cluster(a100: int = 2, h100: int = 2, price: bool = True) -> Cluster:
    groups = (DeviceGroup("fake-a100", NODES["fake-a100"], a100, 0, 20.0 if price else None),
              DeviceGroup("fake-h100", NODES["fake-h100"], h100, 8 * a100, 60.0 if price else None))
    return Cluster(groups=groups, name="fake mix")


def fake_plan(cluster: Cluster, global_batch: int) -> Plan:
    """A deterministic 'plan': throughput proportional to summed peak FLOP/s (a toy, not a cost model)."""
    flops = sum(g.num_devices * g.node.device.peak_flops_per_s["bf16"] for g in cluster.groups)
    throughput = flops / 1e15 * min(1.0, sum(g.node.inter_node_bandwidth_Bps for g in cluster.groups) / 50e9)
    stages = tuple(StagePlan(index=i, first_layer=i, last_layer=i, layer_names=(f"l{i}",),
                             device_type=g.node.device.name,
                             devices=tuple(range(g.first_device, g.first_device + g.num_devices)), tp=8,
                             dp=g.count, recompute="none", memory_bytes_per_device=1e9, time_s=0.1)
                   for i, g in enumerate(cluster.groups))
    return Plan(model={"name": "fake"}, cluster={}, global_batch=global_batch, micro_batch=1,
                num_micro_batches=global_batch, schedule="1f1b", zero=0, iteration_time_s=global_batch / throughput,
                throughput_samples_per_s=throughput, stages=stages, breakdown={})


def fake_evaluate(task: PointTask) -> WhatIfPoint:
    """Stands in for evaluate_point: infeasible below 16 devices, like a model that needs 16 GPUs."""
    inputs: PointInputs = task.inputs
    if inputs.cluster is None:
        return infeasible(inputs, inputs.reason)
    if inputs.cluster.num_devices < 16:
        return infeasible(inputs, str(InfeasibleError("the model needs at least 16 devices")))
    seq = dict(inputs.dims).get("seq")
    return summarize(inputs.settings, fake_plan(inputs.cluster, inputs.global_batch), inputs.cluster,
                     inputs.global_batch, seq)


def warning_evaluate(task: PointTask) -> WhatIfPoint:
    """fake_evaluate, warning once about every point and once about the point itself (as the model import and
    a point's own search do)."""
    logging.getLogger("planner.fake").warning("the model's tables are not the file's")
    logging.getLogger("planner.fake").warning("point %s", dict(task.inputs.settings))
    return fake_evaluate(task)


def failing_evaluate(task: PointTask) -> WhatIfPoint:
    raise ClusterError("bad model file (raised in a worker)")


def points_for(sweeps, cluster=None, batch=64, dims=None):
    cluster = cluster or mixed_cluster()
    parsed = parse_sweeps(sweeps)
    check_groups(cluster, parsed, FakeCatalog)
    return point_inputs(cluster, batch, dims or {"seq": 1024}, parsed, FakeCatalog)


def result_for(sweeps, workers=1, **kwargs):
    points = points_for(sweeps, **kwargs)
    tasks = [PointTask("fake.onnx", p) for p in points]
    results = run_tasks(fake_evaluate, tasks, workers=workers)
    return WhatIfResult(points=tuple(results), keys=tuple(sweeps), model="fake.onnx", cluster="fake mix")
