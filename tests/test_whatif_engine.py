"""What-if engine with injected fakes: keys, grid, cluster transforms, parallel runner, outputs."""

from __future__ import annotations

import csv
import io
import json
import logging
import re
from dataclasses import replace

import pytest

from planner.errors import ClusterError, ConfigError
from planner.progress import ProgressBar
from planner.sweep.keys import grid, parse_key, parse_sweep_args, parse_sweeps, renumber
from planner.sweep.runner import run_tasks
from planner.sweep.whatif import PointTask, cluster_cost_per_hour

from whatif_fakes import (NODES, points_for, result_for, failing_evaluate, fake_evaluate, fake_plan, mixed_cluster,
                          warning_evaluate)


# ---------------------------------------------------------------------------------------------- keys


def test_parse_key_forms():
    assert parse_key("count").group is None and parse_key("count").field == "count"
    key = parse_key("fake-h100.count")
    assert (key.group, key.field, key.text) == ("fake-h100", "count", "fake-h100.count")
    assert parse_key("seq_len").field == "seq_len"


@pytest.mark.parametrize("bad", ["cuont", "a.b.nope", "seq", ".count", "global_batch.count2"])
def test_unknown_key_names_valid_keys(bad):
    with pytest.raises(ConfigError) as exc:
        parse_key(bad)
    assert "valid keys" in str(exc.value) and "inter_node_bandwidth_GBps" in str(exc.value)


def test_unknown_key_suggests():
    with pytest.raises(ConfigError, match="did you mean count"):
        parse_key("cont")


@pytest.mark.parametrize("values,match", [(["x"], "not an integer"), (["-1"], "at least 0"), (["1", "1"], "repeated"),
                                          ([""], "empty value")])
def test_bad_values(values, match):
    with pytest.raises(ConfigError, match=match):
        parse_sweeps({"count": values})


def test_bad_float_values():
    with pytest.raises(ConfigError, match="positive"):
        parse_sweeps({"inter_node_bandwidth_GBps": ["0"]})
    with pytest.raises(ConfigError, match="non-negative"):
        parse_sweeps({"price_per_node_hour": ["nan"]})


def test_sweep_args_twice_is_an_error():
    assert parse_sweep_args(["count=1,2", "seq_len=8"]) == {"count": ["1", "2"], "seq_len": ["8"]}
    with pytest.raises(ConfigError, match="given twice"):
        parse_sweep_args(["count=1", "count=2"])
    with pytest.raises(ConfigError, match="KEY=V1"):
        parse_sweep_args(["count"])


def test_grid_order_first_key_slowest():
    sweeps = parse_sweeps({"count": ["1", "2"], "seq_len": ["8", "16", "32"]})
    settings = grid(sweeps)
    assert len(settings) == 6
    assert settings[0] == (("count", 1), ("seq_len", 8))
    assert settings[1] == (("count", 1), ("seq_len", 16))
    assert settings[3] == (("count", 2), ("seq_len", 8))


# ------------------------------------------------------------------------------------- cluster changes


def test_renumber_is_consecutive():
    cluster = mixed_cluster(a100=3, h100=1)
    groups = renumber(reversed(cluster.groups))
    assert [g.first_device for g in groups] == [0, 8]
    assert [g.node.name for g in groups] == ["fake-h100", "fake-a100"]


def test_group_count_changes_one_group_and_renumbers():
    points = points_for({"fake-a100.count": ["0", "1", "4"]})
    first = points[0].cluster
    assert [g.name for g in first.groups] == ["fake-h100"]  # count 0 drops the group
    assert first.groups[0].first_device == 0
    last = points[2].cluster
    assert [(g.name, g.count, g.first_device) for g in last.groups] == [("fake-a100", 4, 0), ("fake-h100", 2, 32)]
    assert last.num_devices == 48


def test_unprefixed_group_key_changes_every_group():
    points = points_for({"inter_node_bandwidth_GBps": ["100"], "count": ["3"]})
    cluster = points[0].cluster
    assert all(g.node.inter_node_bandwidth_Bps == 100e9 and g.count == 3 for g in cluster.groups)
    assert [g.first_device for g in cluster.groups] == [0, 24]


def test_node_type_and_price_and_global_keys():
    points = points_for({"fake-a100.node": ["fake-h100"], "fake-a100.price_per_node_hour": ["7.5"],
                      "global_batch": ["128"], "seq_len": ["4096"]})
    point = points[0]
    assert point.cluster.groups[0].node is NODES["fake-h100"] and point.cluster.groups[0].name == "fake-a100"
    assert point.cluster.groups[0].price_per_node_hour == 7.5
    assert point.global_batch == 128 and dict(point.dims)["seq"] == 4096


def test_keys_apply_node_first_whatever_the_flag_order():
    """A node replaces the whole profile, so a link or device change given before it must not be lost: the
    flags in either order give the same cluster."""
    orders = ({"inter_node_bandwidth_GBps": ["1"], "fake-a100.node": ["fake-h100"], "fake-a100.device": ["a100"]},
              {"fake-a100.device": ["a100"], "fake-a100.node": ["fake-h100"], "inter_node_bandwidth_GBps": ["1"]})
    clusters = [points_for(sweeps)[0].cluster for sweeps in orders]
    assert clusters[0] == clusters[1]
    group = clusters[0].groups[0]
    assert group.node.inter_node_bandwidth_Bps == 1e9 and group.node.device.name == "a100"


def test_two_keys_setting_one_field_of_a_group_are_refused():
    with pytest.raises(ConfigError, match="--sweep count and --sweep fake-a100.count both set the count of group"):
        points_for({"count": ["1", "2"], "fake-a100.count": ["4"]})
    points_for({"fake-h100.count": ["1"], "fake-a100.count": ["4"]})  # different groups: fine


def test_all_counts_zero_is_an_infeasible_point_not_a_crash():
    points = points_for({"count": ["0"]})
    assert points[0].cluster is None and "no nodes" in points[0].reason


def test_unknown_group_and_node_fail_early():
    with pytest.raises(ConfigError, match="no group 'fake-h10'.*did you mean fake-h100"):
        points_for({"fake-h10.count": ["1"]})
    with pytest.raises(ConfigError, match="unknown node profile"):
        points_for({"node": ["nope"]})


def test_base_cluster_is_not_mutated():
    cluster = mixed_cluster()
    before = repr(cluster)
    points_for({"count": ["0", "5"], "inter_node_bandwidth_GBps": ["1"]}, cluster=cluster)
    assert repr(cluster) == before


def test_cost_per_hour_needs_every_price():
    assert cluster_cost_per_hour(mixed_cluster(2, 1)) == pytest.approx(2 * 20.0 + 1 * 60.0)
    assert cluster_cost_per_hour(mixed_cluster(price=False)) is None


def test_cost_counts_only_the_nodes_a_plan_uses():
    cluster = mixed_cluster(2, 1)  # A100 devices 0-15 (two nodes at 20/h), H100 devices 16-23 (one at 60/h)
    assert cluster_cost_per_hour(cluster, [0, 1, 2]) == pytest.approx(20.0)
    assert cluster_cost_per_hour(cluster, [7, 8]) == pytest.approx(40.0)
    assert cluster_cost_per_hour(cluster, [0, 23]) == pytest.approx(80.0)
    partly_priced = replace(cluster, groups=(cluster.groups[0], replace(cluster.groups[1], price_per_node_hour=None)))
    assert cluster_cost_per_hour(partly_priced, [0]) == pytest.approx(20.0)  # the unpriced group is not used
    assert cluster_cost_per_hour(partly_priced, [0, 16]) is None


# ---------------------------------------------------------------------------------------------- runner


def test_one_and_two_workers_give_identical_results():
    sweeps = {"fake-a100.count": ["0", "1", "2", "3"], "fake-h100.count": ["0", "1", "2", "4"]}
    one = result_for(sweeps, workers=1)
    two = result_for(sweeps, workers=2)
    assert one.points == two.points
    assert one.to_json() == two.to_json().replace('"workers": 2', '"workers": 1')


def test_worker_error_propagates_as_planner_error():
    tasks = [PointTask("x.onnx", p) for p in points_for({"count": ["1", "2", "3"]})]
    with pytest.raises(ClusterError, match="raised in a worker"):
        run_tasks(failing_evaluate, tasks, workers=2)


def test_workers_warnings_reach_the_caller_once_each(caplog):
    """A worker process's log records reach no one; the runner logs its warnings again in the caller, in the
    order of the points, each once."""
    tasks = [PointTask("x.onnx", p) for p in points_for({"count": ["1", "2", "3"]})]
    with caplog.at_level(logging.WARNING):
        run_tasks(warning_evaluate, tasks, workers=2)
    messages = [r.getMessage() for r in caplog.records if r.name == "planner.fake"]
    assert messages == ["the model's tables are not the file's"] + [f"point {dict(t.inputs.settings)}" for t in tasks]


def test_bad_backend_and_workers():
    # named as the API's arguments and the CLI's flags both read them (no "--" of the CLI's alone)
    with pytest.raises(ConfigError, match="^backend 'mpi' is not one of process, ray$"):
        run_tasks(fake_evaluate, [], backend="mpi")
    with pytest.raises(ConfigError, match="^workers=0 must be a positive integer$"):
        run_tasks(fake_evaluate, [], workers=0)


def test_progress_is_reported_for_every_point():
    calls = []
    tasks = [PointTask("x.onnx", p) for p in points_for({"count": ["1", "2", "3"]})]
    run_tasks(fake_evaluate, tasks, workers=2, progress=lambda d, t: calls.append((d, t)))
    assert calls == [(1, 3), (2, 3), (3, 3)]


def test_progress_bar_counts_points():
    stream = io.StringIO()
    bar = ProgressBar("whatif", delay_s=0.0, stream=stream, width=8)
    bar.count(1, 4)
    bar.count(4, 4)
    bar.close()
    lines = stream.getvalue().removesuffix("\n").split("\r")[1:]
    assert [re.sub(r" +[0-9.]+ s$", "", line) for line in lines] == \
        ["planner: whatif [##......] 1/4 points", "planner: whatif [########] 4/4 points"]
    assert stream.getvalue().endswith(" s\n")


# ---------------------------------------------------------------------------------------------- outputs


def test_csv_rows_equal_points_and_infeasible_rows_have_reasons():
    result = result_for({"fake-a100.count": ["0", "1", "2", "3"], "fake-h100.count": ["0", "1", "2"]})
    rows = list(csv.DictReader(io.StringIO(result.to_csv())))
    assert len(rows) == len(result.points) == 12
    assert list(rows[0])[:2] == ["fake-a100.count", "fake-h100.count"]
    assert rows[0]["feasible"] == "False" and "no nodes" in rows[0]["reason"]
    small = [r for r in rows if r["fake-a100.count"] == "1" and r["fake-h100.count"] == "0"][0]
    assert small["feasible"] == "False" and "16 devices" in small["reason"] and small["throughput_samples_per_s"] == ""
    big = rows[-1]
    assert big["feasible"] == "True" and float(big["throughput_samples_per_s"]) > 0
    # 3 A100 nodes at 20/h + 2 H100 nodes at 60/h
    assert float(big["cost_per_hour"]) == pytest.approx(180.0)
    assert float(big["cost_per_million_tokens"]) == pytest.approx(
        180.0 / 3600 / float(big["throughput_samples_per_s"]) / 1024 * 1e6)


def test_json_document_is_deterministic_and_complete():
    result = result_for({"count": ["1", "2", "3"]})
    doc = json.loads(result.to_json())
    assert doc["keys"] == ["count"] and len(doc["points"]) == 3
    assert doc["points"][1]["settings"] == {"count": 2}
    assert set(doc["search"]) == {"time_s", "workers", "backend"}
    assert result.to_json() == result_for({"count": ["1", "2", "3"]}).to_json()


def test_table_lists_every_point():
    result = result_for({"count": ["0", "1", "2"]})
    lines = result.to_table().splitlines()
    assert lines[0].split()[:2] == ["count", "feasible"]
    assert len(lines) == 1 + 3 + 1 and lines[-1] == "3 points, 2 feasible, 0 proven optimal; runtime megatron-core"


def test_table_counts_proofs_and_the_unproven_plans_gap():
    result = result_for({"count": ["2", "3", "4"]})
    points = [replace(result.points[0], proven_optimal=True, lower_bound_s=result.points[0].iteration_time_s),
              replace(result.points[1], proven_optimal=False, lower_bound_s=result.points[1].iteration_time_s / 1.02),
              replace(result.points[2], proven_optimal=False, lower_bound_s=result.points[2].iteration_time_s / 1.01)]
    summary = replace(result, points=tuple(points)).to_table().splitlines()[-1]
    assert summary == "3 points, 3 feasible, 1 proven optimal (unproven plans within 2.00% of their lower bounds); " \
        "runtime megatron-core"
    fixed = replace(result, points=tuple(replace(p, proven_optimal=None) for p in points))  # a fixed plan's sweep
    assert fixed.to_table().splitlines()[-1] == "3 points, 3 feasible; runtime megatron-core"


def test_pareto_front_is_the_non_dominated_points():
    result = result_for({"fake-a100.count": ["1", "2", "4"], "fake-h100.count": ["1", "2", "4"]})
    front = result.pareto_front()
    feasible = [i for i, p in enumerate(result.points) if p.feasible]

    def key(i):
        p = result.points[i]
        return 1 / p.throughput_samples_per_s, p.cost_per_sample

    for i in feasible:
        dominated = any(key(j)[0] <= key(i)[0] and key(j)[1] <= key(i)[1] and key(j) != key(i) for j in feasible)
        assert (i in front) == (not dominated), i
    times = [key(i)[0] for i in front]
    assert times == sorted(times)


def test_summary_columns_from_plan():
    result = result_for({"fake-h100.count": ["2", "3"]})
    same, mixed = result.points
    assert (same.pp, same.tp, same.dp, same.devices_used, same.num_devices) == (2, 8, 2, 32, 32)
    assert mixed.dp is None  # 2 A100 nodes and 3 H100 nodes: the stages' dp differ
    assert mixed.stages == "a100 tp8 dp2 layers 0-0; h100 tp8 dp3 layers 1-1"


def test_device_key_swaps_the_device_and_keeps_the_links():
    point = points_for({"fake-a100.device": ["h100"]})[0]
    group = point.cluster.groups[0]
    assert group.node.device.name == "h100" and group.node.name == "fake-a100"
    assert group.node.inter_node_bandwidth_Bps == NODES["fake-a100"].inter_node_bandwidth_Bps
    with pytest.raises(ConfigError, match="unknown device"):
        points_for({"device": ["b200"]})


def test_swept_global_keys_are_one_column():
    result = result_for({"global_batch": ["64", "128"], "seq_len": ["512"]})
    header = result.to_csv().splitlines()[0].split(",")
    assert header[:2] == ["global_batch", "seq_len"] and len(header) == len(set(header))
    rows = list(csv.DictReader(io.StringIO(result.to_csv())))
    assert [r["global_batch"] for r in rows] == ["64", "128"] and rows[0]["seq_len"] == "512"


def test_a_point_carries_its_plans_expert_parallelism():
    """The what-if row says each plan's ep (1 on a dense model), or nothing when its stages differ."""
    from planner.sweep.whatif import TABLE_COLUMNS, summarize

    cluster = mixed_cluster()
    plan = fake_plan(cluster, 64)
    assert summarize((), plan, cluster, 64, None).ep == 1
    moe = replace(plan, stages=tuple(replace(s, ep=4) for s in plan.stages))
    assert summarize((), moe, cluster, 64, None).ep == 4
    mixed = replace(plan, stages=(replace(plan.stages[0], ep=2),) + plan.stages[1:])
    assert len(plan.stages) > 1 and summarize((), mixed, cluster, 64, None).ep is None
    assert TABLE_COLUMNS.index("ep") == TABLE_COLUMNS.index("cp") + 1


def test_summary_lists_each_replica_group_of_a_mixed_stage():
    """A stage served by two device types lists each group's own tp and dp, not the stage's merged ones."""
    import plan_samples
    from planner.hardware import load_cluster
    from planner.sweep.whatif import summarize

    point = summarize((), plan_samples.mixed_plan(), load_cluster("dgx-a100-80gb*3"), 32, None)
    assert point.stages == "a100-80gb tp4 dp2 layers 0-3; v100-32gb tp4 dp2 + a100-80gb tp4 dp2 layers 4-7"
    assert point.tp == 4 and point.dp is None  # the stages' dp differ: 2, and 2 + 2
