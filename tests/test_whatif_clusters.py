"""Sweep cluster transforms on real catalog clusters (planner.hardware)."""

from __future__ import annotations

import logging

import pytest

from planner.errors import ConfigError
from planner.hardware import catalog, load_cluster
from planner.sweep.keys import check_groups, parse_sweeps, point_inputs


def _inputs(spec, sweeps):
    cluster = load_cluster(spec)
    parsed = parse_sweeps(sweeps)
    check_groups(cluster, parsed, catalog)
    return point_inputs(cluster, 512, {}, parsed, catalog)


def test_mixed_shorthand_group_counts_and_ids():
    points = _inputs("dgx-a100-80gb*2+dgx-h100*3", {"dgx-a100-80gb.count": ["0", "4"], "dgx-h100.count": ["1"]})
    only_h100 = points[0].cluster
    assert [(g.name, g.count, g.first_device) for g in only_h100.groups] == [("dgx-h100", 1, 0)]
    both = points[1].cluster
    assert [(g.name, g.count, g.first_device) for g in both.groups] == [("dgx-a100-80gb", 4, 0), ("dgx-h100", 1, 32)]
    assert both.num_devices == 40
    # a point's cluster is named by what it holds, so a message about the point names it
    assert (only_h100.name, both.name) == ("dgx-h100*1", "dgx-a100-80gb*4+dgx-h100*1")


def test_a_device_swap_is_named_in_the_points_cluster():
    point = _inputs("dgx-a100-80gb*1", {"device": ["v100-16gb"]})[0]
    assert point.cluster.name == "dgx-a100-80gb[v100-16gb]*1"


def test_node_swap_and_network_and_price():
    point = _inputs("dgx-a100-80gb*4", {"node": ["dgx-h200"], "inter_node_bandwidth_GBps": ["12.5"],
                                        "price_per_node_hour": ["98.3"]})[0]
    group = point.cluster.groups[0]
    assert group.node.device.name == "h200" and group.count == 4 and point.cluster.name == "dgx-h200*4"
    assert group.node.inter_node_bandwidth_Bps == pytest.approx(12.5e9)
    assert group.price_per_node_hour == pytest.approx(98.3)


def test_catalog_errors_are_config_errors_with_suggestions():
    with pytest.raises(ConfigError, match="dgx-h100"):
        _inputs("dgx-a100-80gb*4", {"node": ["dgx-h10"]})
    with pytest.raises(ConfigError, match="no group 'dgx-h100'"):
        _inputs("dgx-a100-80gb*4", {"dgx-h100.count": ["1"]})


def test_a_node_swept_in_gets_the_groups_link_overrides(tmp_path):
    path = tmp_path / "c50.yaml"
    path.write_text("groups:\n  - {node: dgx-a100-80gb, count: 2, inter_node_bandwidth_GBps: 50, "
                    "intra_node_bandwidth_GBps: 100}\n")
    same, other = _inputs(str(path), {"node": ["dgx-a100-80gb", "dgx-h100"]})
    assert same.cluster.groups == load_cluster(str(path)).groups
    node = other.cluster.groups[0].node
    assert node.device.name == "h100-sxm"
    assert (node.inter_node_bandwidth_Bps, node.intra_node_bandwidth_Bps) == (50e9, 100e9)
    # a swept bandwidth still wins over the file's, whatever the flag order
    swept = _inputs(str(path), {"inter_node_bandwidth_GBps": ["25"], "node": ["dgx-h100"]})[0]
    assert swept.cluster.groups[0].node.inter_node_bandwidth_Bps == 25e9


PRICED = "groups:\n  - {node: hgx-v100-32gb, count: 2, price_per_node_hour: 8.0}\n  - {node: dgx-h100, count: 1}\n"


def test_a_priced_group_given_other_hardware_loses_its_price_once_warned(tmp_path, caplog):
    path = tmp_path / "v100p.yaml"
    path.write_text(PRICED)
    with caplog.at_level(logging.WARNING, logger="planner.sweep.keys"):
        points = _inputs(str(path), {"hgx-v100-32gb.node": ["hgx-v100-32gb", "dgx-a100-80gb"],
                                     "device": ["v100-32gb", "a100-80gb"]})
    prices = [[g.price_per_node_hour for g in p.cluster.groups] for p in points]
    assert prices == [[8.0, None], [None, None], [None, None], [None, None]]
    (record,) = caplog.records  # one warning for the whole sweep, naming the group and the way to price it
    message = record.getMessage()
    assert ("group 'hgx-v100-32gb' on hgx-v100-32gb (a100-80gb), dgx-a100-80gb (v100-32gb), "
            "dgx-a100-80gb (a100-80gb)") in message
    assert "--sweep hgx-v100-32gb.price_per_node_hour=" in message


def test_a_price_swept_with_the_hardware_holds(tmp_path, caplog):
    path = tmp_path / "v100p.yaml"
    path.write_text(PRICED)
    with caplog.at_level(logging.WARNING, logger="planner.sweep.keys"):
        points = _inputs(str(path), {"node": ["dgx-a100-80gb"], "hgx-v100-32gb.price_per_node_hour": ["20"]})
        points += _inputs(str(path), {"dgx-h100.count": ["2"], "inter_node_bandwidth_GBps": ["25"]})
    assert [[g.price_per_node_hour for g in p.cluster.groups] for p in points] == [[20.0, None], [8.0, None]]
    assert caplog.records == []
