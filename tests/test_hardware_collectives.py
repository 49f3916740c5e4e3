"""The collective model against its closed forms, and the properties the planner relies on."""

from __future__ import annotations

import dataclasses
import math

import pytest

from planner.errors import ConfigError
from planner.hardware import load_cluster
from planner.cost.calibration import DeviceCalibration
from planner.cost.comm import tp_group
from planner.hardware.collectives import (KINDS, CommGroup, algorithm_time_s, bus_bandwidth_Bps, collective_algorithm,
                                          collective_time_s, comm_group, intra_group_Bps, p2p_time_s)

S = 2.0 ** 30
B, A = 100e9, 2e-6  # intra: 100 GB/s, 2 us
BN, AN = 40e9, 10e-6  # inter: 40 GB/s per node, 10 us


def one_node(n: int) -> CommGroup:
    return CommGroup(size=n, ranks_per_node=n, intra_bandwidth_Bps=B, intra_latency_s=A,
                     inter_bandwidth_Bps=BN, inter_latency_s=AN)


def nodes(n_nodes: int, per_node: int) -> CommGroup:
    return CommGroup(size=n_nodes * per_node, ranks_per_node=per_node, intra_bandwidth_Bps=B, intra_latency_s=A,
                     inter_bandwidth_Bps=BN, inter_latency_s=AN)


@pytest.mark.parametrize("n", [2, 4, 8])
def test_ring_closed_forms_in_one_node(n):
    g = one_node(n)
    assert algorithm_time_s("ring", "all_reduce", S, g) == pytest.approx(2 * (n - 1) / n * S / B + 2 * (n - 1) * A)
    assert algorithm_time_s("ring", "reduce_scatter", S, g) == pytest.approx((n - 1) / n * S / B + (n - 1) * A)
    assert algorithm_time_s("ring", "all_gather", S, g) == pytest.approx((n - 1) / n * S / B + (n - 1) * A)
    assert algorithm_time_s("ring", "broadcast", S, g) == pytest.approx(S / B + (n - 1) * A)


def test_tree_closed_form_and_small_messages_prefer_it():
    g = one_node(8)
    assert algorithm_time_s("tree", "all_reduce", S, g) == pytest.approx(2 * S / B + 2 * 3 * A)
    # tiny message: latency dominates, log2(8)=3 steps beat 7
    assert collective_algorithm("all_reduce", 8.0, g)[0] == "tree"
    # large message: ring's 2(n-1)/n S beats the tree's 2 S
    assert collective_algorithm("all_reduce", S, g)[0] == "ring"


def test_ring_across_nodes_uses_nccl_step_split_and_slowest_tier():
    g = nodes(4, 8)  # 32 ranks: 2*31 steps, 2*3 of them cross nodes
    expected = 2 * 31 / 32 * S / min(B, BN) + (62 - 6) * A + 6 * AN
    assert algorithm_time_s("ring", "all_reduce", S, g) == pytest.approx(expected)
    one_rank_per_node = nodes(4, 1)
    assert algorithm_time_s("ring", "all_reduce", S, one_rank_per_node) == pytest.approx(
        2 * 3 / 4 * S / BN + 6 * AN)


def test_hierarchical_closed_form():
    g = nodes(4, 8)
    intra = 7 / 8 * S / B + 7 * A  # reduce-scatter (and the all-gather) inside a node
    inter_ring = 2 * 3 / 4 * (S / 8) / (BN / 8) + 6 * AN  # 8 concurrent rings over 4 nodes on S/8 each
    inter_tree = 2 * (S / 8) / (BN / 8) + 2 * 2 * AN
    expected = 2 * intra + min(inter_ring, inter_tree)
    assert algorithm_time_s("hierarchical", "all_reduce", S, g) == pytest.approx(expected)


@pytest.mark.parametrize("kind", ["reduce_scatter", "all_gather"])
def test_reduce_scatter_and_all_gather_run_as_rings_across_nodes(kind):
    """NCCL has no hierarchical reduce-scatter or all-gather (src/graph/tuning.cc): across nodes they pay a
    ring's n - 1 steps even for a medium buffer over many nodes, where a hierarchical form would pay N - 1."""
    big = nodes(64, 8)
    size = 2.0 ** 20
    assert math.isinf(algorithm_time_s("hierarchical", kind, size, big))
    name, seconds = collective_algorithm(kind, size, big)
    assert name == "ring"
    assert seconds == pytest.approx(511 / 512 * size / BN + 448 * A + 63 * AN)


def test_hierarchical_beats_flat_across_nodes():
    # slow network, fast NVLink: crossing the slow tier once with 2(N-1)/N S beats the flat ring's 2(n-1)/n S
    g = CommGroup(size=16, ranks_per_node=8, intra_bandwidth_Bps=250e9, intra_latency_s=2e-6,
                  inter_bandwidth_Bps=12.5e9, inter_latency_s=5e-6)
    assert algorithm_time_s("hierarchical", "all_reduce", S, g) < algorithm_time_s("ring", "all_reduce", S, g)
    assert collective_algorithm("all_reduce", S, g)[0] == "hierarchical"
    # many nodes, medium message: the flat ring pays 2(n-1) steps, hierarchical 2(r-1) + 2 log2(N)
    big = nodes(64, 8)
    size = 2.0 ** 20
    assert algorithm_time_s("hierarchical", "all_reduce", size, big) < algorithm_time_s("ring", "all_reduce", size, big)


def test_all_to_all_and_send_recv_closed_forms():
    g = nodes(4, 8)
    n, r = 32, 8
    intra = (r - 1) / n * S / B
    inter = r * (n - r) / n * S / BN
    assert collective_time_s("all_to_all", S, g) == pytest.approx(max(intra, inter) + 7 * A + 3 * AN)
    assert collective_time_s("all_to_all", S, one_node(8)) == pytest.approx(7 / 8 * S / B + 7 * A)
    assert collective_time_s("send_recv", S, one_node(2)) == pytest.approx(S / B + A)
    assert collective_time_s("send_recv", S, nodes(2, 1)) == pytest.approx(S / BN + AN)


def test_size_one_and_empty_buffers_are_free():
    for kind in KINDS:
        assert collective_time_s(kind, S, one_node(1)) == 0.0
        assert collective_time_s(kind, 0.0, one_node(8)) == 0.0


def test_bad_groups_and_kinds():
    with pytest.raises(ConfigError, match="unknown collective"):
        collective_time_s("allreduce", S, one_node(2))
    with pytest.raises(ConfigError, match="multiple of ranks_per_node"):
        collective_time_s("all_reduce", S, CommGroup(6, 4, B, A, BN, AN))


def test_time_grows_with_size_and_busbw_saturates():
    g = one_node(8)
    times = [collective_time_s("all_reduce", 2.0 ** p, g) for p in range(10, 34, 2)]
    assert times == sorted(times)
    assert bus_bandwidth_Bps("all_reduce", 2.0 ** 36, g, collective_time_s("all_reduce", 2.0 ** 36, g)) == \
        pytest.approx(B, rel=1e-3)


# --------------------------------------------------------------------------------------------- clusters

def test_comm_group_of_a_dgx_node_and_of_a_dp_group():
    cluster = load_cluster("dgx-a100-80gb*4")
    g = comm_group(cluster, list(range(8)))
    assert (g.size, g.ranks_per_node) == (8, 8)
    assert g.intra_bandwidth_Bps == pytest.approx(300e9 * 0.822)
    dp = comm_group(cluster, [0, 8, 16, 24])  # one rank per node, the other 7 GPUs busy in their own groups
    assert dp.ranks_per_node == 1
    assert dp.inter_bandwidth_Bps == pytest.approx(200e9 * 0.96 / 8)
    assert dp.inter_latency_s == pytest.approx(4.5e-6 + cluster.fabric_latency_s)
    two_per_node = comm_group(cluster, [0, 1, 8, 9])
    assert two_per_node.ranks_per_node == 2
    assert two_per_node.inter_bandwidth_Bps == pytest.approx(2 * 200e9 * 0.96 / 8)


def test_mixed_group_runs_at_the_slowest_link():
    cluster = load_cluster("dgx-a100-80gb*1+hgx-v100-32gb*1")
    mixed = comm_group(cluster, list(range(16)))
    v100 = comm_group(cluster, list(range(8, 16)))
    a100 = comm_group(cluster, list(range(8)))
    assert mixed.intra_bandwidth_Bps == v100.intra_bandwidth_Bps < a100.intra_bandwidth_Bps
    assert mixed.inter_bandwidth_Bps == pytest.approx(50e9 * 0.96)  # the V100 node's 4 EDR NICs
    assert collective_time_s("all_reduce", S, mixed) > collective_time_s("all_reduce", S, a100)


def test_oversubscription_slows_inter_node_traffic_only():
    base = load_cluster("dgx-h100*2")
    text = "groups:\n  - {node: dgx-h100, count: 2}\nfabric: {oversubscription: 4}\n"
    import tempfile, pathlib
    with tempfile.TemporaryDirectory() as tmp:
        path = pathlib.Path(tmp) / "c.yaml"
        path.write_text(text)
        over = load_cluster(path)
    span = list(range(16))
    assert comm_group(over, span).inter_bandwidth_Bps == pytest.approx(comm_group(base, span).inter_bandwidth_Bps / 4)
    assert comm_group(over, list(range(8))).intra_bandwidth_Bps == comm_group(base, list(range(8))).intra_bandwidth_Bps


def test_p2p_intra_and_inter_node():
    cluster = load_cluster("dgx-a100-80gb*1+hgx-v100-32gb*1")
    assert p2p_time_s(cluster, 0, 0, S) == 0.0
    assert p2p_time_s(cluster, 0, 1, S) == pytest.approx(S / (300e9 * 0.822) + 1.9e-6)
    # A100 node -> V100 node: the V100 node's per-GPU NIC share (50 GB/s / 8) bounds it
    assert p2p_time_s(cluster, 0, 8, S) == pytest.approx(S / (50e9 * 0.96 / 8) + 4.5e-6 + cluster.fabric_latency_s)


def test_group_errors():
    cluster = load_cluster("t4*2")
    with pytest.raises(ConfigError, match="twice"):
        comm_group(cluster, [0, 0])
    with pytest.raises(Exception, match="not in the cluster"):
        comm_group(cluster, [0, 5])


def test_dgx_a100_allreduce_near_published_nccl_tests():
    """The benchmark's two checks (benchmarks/bench_collectives.py has the sources)."""
    for spec, n, published in (("dgx-a100-80gb", 8, 232.54e9), ("dgx-a100-80gb*16", 128, 192e9)):
        g = comm_group(load_cluster(spec), list(range(n)))
        busbw = bus_bandwidth_Bps("all_reduce", S, g, collective_time_s("all_reduce", S, g))
        assert busbw == pytest.approx(published, rel=0.20)
        assert math.isfinite(busbw)


def test_a_direct_link_fabric_gives_a_group_its_links_to_its_peers_only():
    # a DGX-1 V100 pair of consecutive GPUs shares one NVLink of each GPU's six, a quad four; a switched DGX A100
    # gives every group the whole; the tensor-parallel group and the p2p hand-off read the same
    v100, a100 = load_cluster("hgx-v100-32gb*1"), load_cluster("dgx-a100-80gb*1")
    node = v100.groups[0].node
    whole = node.intra_node_bandwidth_Bps * node.intra_node_efficiency
    assert intra_group_Bps(node, 2) == pytest.approx(whole / 6, rel=1e-3)
    assert intra_group_Bps(node, 4) == pytest.approx(whole * 4 / 6, rel=1e-3)
    assert intra_group_Bps(node, 8) == whole
    assert comm_group(v100, [0, 1]).intra_bandwidth_Bps == intra_group_Bps(node, 2)
    assert comm_group(v100, list(range(8))).intra_bandwidth_Bps == whole
    assert tp_group(node, 2, DeviceCalibration()).intra_bandwidth_Bps == intra_group_Bps(node, 2)
    size = 1e9
    assert p2p_time_s(v100, 0, 1, size) == pytest.approx(size / intra_group_Bps(node, 2) + node.intra_node_latency_s)
    switched = a100.groups[0].node
    assert {intra_group_Bps(switched, r) for r in (2, 4, 8)} == {
        switched.intra_node_bandwidth_Bps * switched.intra_node_efficiency}
    # the pair's all-reduce is the slower for it: six times the bandwidth term of the whole node's rate
    pair = comm_group(v100, [0, 1])
    assert collective_time_s("all_reduce", size, pair) > 5 * collective_time_s(
        "all_reduce", size, dataclasses.replace(pair, intra_bandwidth_Bps=whole, inter_bandwidth_Bps=whole))


def test_nvls_closed_form_and_where_it_applies():
    """NVLink SHARP moves (1 + 1/n) S each way per rank against the ring's 2(n-1)/n S: all-reduce only, in one
    node that has it; with the nodes' NVLS bandwidth e x line, it beats a ring at efficiency 0.822 only
    where 2(n-1)/n / 0.822 > (1 + 1/n) / e."""
    g = dataclasses.replace(one_node(8), nvls_bandwidth_Bps=0.7 * B / 0.822)
    assert algorithm_time_s("nvls", "all_reduce", S, g) == pytest.approx((1 + 1 / 8) * S / g.nvls_bandwidth_Bps
                                                                        + 25e-6)
    for kind in ("reduce_scatter", "all_gather", "all_to_all", "broadcast"):
        assert math.isinf(algorithm_time_s("nvls", kind, S, g))
    assert math.isinf(algorithm_time_s("nvls", "all_reduce", S, dataclasses.replace(nodes(2, 4),
                                                                                   nvls_bandwidth_Bps=B)))
    assert math.isinf(algorithm_time_s("nvls", "all_reduce", S, one_node(8)))  # the node has none
    small = dataclasses.replace(one_node(2), nvls_bandwidth_Bps=g.nvls_bandwidth_Bps)
    assert collective_algorithm("all_reduce", S, small)[0] == "ring"  # 2 ranks: S each way beats 1.5 S
    assert collective_algorithm("all_reduce", S, g)[0] == "nvls"


@pytest.mark.parametrize("gpus, published_GBps", [(4, 370), (5, 420), (6, 440), (7, 460), (8, 480)])
def test_h100_allreduce_follows_nccl_with_nvls(gpus, published_GBps):
    """8x H100 all-reduce busbw by group size (NVIDIA/nccl#1455, 2-4 GB buffers): rings at 365-370 GB/s up to
    4 GPUs, NVLS above; the node's one NVLS efficiency gives each within 3%."""
    g = comm_group(load_cluster("dgx-h100"), list(range(gpus)))
    size = 4 * S
    busbw = bus_bandwidth_Bps("all_reduce", size, g, collective_time_s("all_reduce", size, g))
    assert busbw == pytest.approx(published_GBps * 1e9, rel=0.03)
    # no NVLS on A100's NVSwitch 2, and none for the reduce-scatter / all-gather pair sequence parallelism uses
    a100 = comm_group(load_cluster("dgx-a100-80gb"), list(range(gpus)))
    assert collective_algorithm("all_reduce", size, a100)[0] != "nvls"
    assert collective_algorithm("reduce_scatter", size, g)[0] != "nvls"
    # a tensor-parallel group of the node runs its all-reduce the same way
    tp = tp_group(load_cluster("dgx-h100").groups[0].node, gpus, DeviceCalibration())
    assert collective_time_s("all_reduce", size, tp) == pytest.approx(collective_time_s("all_reduce", size, g))
