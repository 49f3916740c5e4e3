"""`planner.whatif` and `planner whatif` through the real pipeline: ONNX import, cluster files, search."""

from __future__ import annotations

import csv
import io
import json
import logging
import subprocess
import sys

import pytest

import planner
import planner.graph
from planner.errors import ConfigError
from planner.builders import build, save
from planner.cli import main
from planner.solver import SolverOptions
from planner.types import ParallelConfig
from planner.sweep.whatif import _load_model, whatif

CLUSTER = """\
groups:
  - node: l4
    count: 2
    price_per_node_hour: 0.8
  - node: a10
    count: 1
    price_per_node_hour: 1.1
"""


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("whatif")
    model = folder / "tiny-gpt.onnx"
    save(build("gpt", {"layers": 2, "hidden": 64, "heads": 2, "vocab": 128, "seq_len": 64}), str(model))
    cluster = folder / "mix.yaml"
    cluster.write_text(CLUSTER)
    return str(model), str(cluster)


SWEEPS = {"l4.count": ["0", "1", "2"], "a10.count": ["0", "1"], "seq_len": ["32", "64"]}


def test_grid_rows_and_tokens(files):
    model, cluster = files
    result = whatif(model, cluster, 8, SWEEPS, workers=1)
    assert len(result.points) == 12 and result.keys == tuple(SWEEPS)
    rows = list(csv.DictReader(io.StringIO(result.to_csv())))
    assert len(rows) == 12
    empty = [p for p in result.points if p.setting["l4.count"] == 0 and p.setting["a10.count"] == 0]
    assert len(empty) == 2 and all(not p.feasible and "no nodes" in p.reason for p in empty)
    feasible = [p for p in result.points if p.feasible]
    assert len(feasible) == 10
    for point in feasible:
        assert point.seq_len == point.setting["seq_len"]
        assert point.tokens_per_s == pytest.approx(point.throughput_samples_per_s * point.seq_len)
        assert 0 < point.devices_used <= point.num_devices
        assert point.cost_per_million_tokens == pytest.approx(
            point.cost_per_hour / 3600 / point.tokens_per_s * 1e6)
    # a longer sequence is more work per sample, never faster (this toy model is launch bound, its kernels at
    # the devices' launch floor, so both lengths may take the same time per sample)
    by_setting = {tuple(p.settings): p for p in feasible}
    assert by_setting[(("l4.count", 2), ("a10.count", 1), ("seq_len", 64))].throughput_samples_per_s <= \
        by_setting[(("l4.count", 2), ("a10.count", 1), ("seq_len", 32))].throughput_samples_per_s


def test_one_and_two_workers_identical(files):
    model, cluster = files
    one = whatif(model, cluster, 8, SWEEPS, workers=1)
    two = whatif(model, cluster, 8, SWEEPS, workers=2)
    assert one.points == two.points
    def without_timings(result):
        document = {k: v for k, v in result.to_dict().items() if k != "search"}
        document["points"] = [{k: v for k, v in p.items() if k != "search"} for p in document["points"]]
        return json.dumps(document, sort_keys=True)

    assert without_timings(one) == without_timings(two)
    assert all(p.search_time_s > 0 for p in one.points)


def test_model_imported_once_per_distinct_dims(files, monkeypatch):
    model, cluster = files
    calls = []
    real = planner.graph.load_model

    def counting(path, dims=None):
        calls.append(tuple(sorted((dims or {}).items())))
        return real(path, dims)

    monkeypatch.setattr(planner.graph, "load_model", counting)
    _load_model.cache_clear()
    whatif(model, cluster, 8, SWEEPS, workers=1)  # 12 points, 10 planned, 2 sequence lengths
    _load_model.cache_clear()
    assert sorted(calls) == [(("seq", 32),), (("seq", 64),)]


def test_a_node_swept_in_keeps_the_groups_link_overrides(files, tmp_path):
    """The point that swaps a group's node for the same node is the file as it is: its group's link
    overrides hold for the swapped-in node, so the point equals `planner plan` on the file."""
    model, _ = files
    cluster = tmp_path / "slow.yaml"
    cluster.write_text("groups:\n  - {node: l4, count: 2, inter_node_bandwidth_GBps: 0.5, "
                       "intra_node_bandwidth_GBps: 5}\n")
    best = planner.plan(planner.load_model(model), planner.load_cluster(str(cluster)), global_batch=64)
    point = whatif(model, str(cluster), 64, {"node": ["l4"]}, workers=1).points[0]
    assert point.iteration_time_s == best.iteration_time_s
    default = whatif(model, "l4*2", 64, {"node": ["l4"]}, workers=1).points[0]
    assert default.iteration_time_s != best.iteration_time_s  # the overrides matter here


def test_a_group_swapped_to_other_hardware_has_no_cost(files):
    """The L4 group's price is an L4 node's: on A10 nodes it is unknown, so the point has no cost."""
    model, cluster = files
    result = whatif(model, cluster, 8, {"a10.count": ["0"], "l4.node": ["l4", "a10"]}, workers=1)
    own, swapped = result.points
    assert own.feasible and own.cost_per_hour == pytest.approx(0.8 * own.devices_used)
    assert swapped.feasible and (swapped.cost_per_hour, swapped.cost_per_sample,
                                 swapped.cost_per_million_tokens) == (None, None, None)
    assert result.pareto_front() == (0,)


def test_a_model_file_rewritten_between_sweeps_is_imported_again(files, tmp_path):
    """One process, one path: the second sweep sees the file as it is now, not the model cached before."""
    _, cluster = files
    path = tmp_path / "rewritten.onnx"
    shape = {"hidden": 64, "heads": 2, "vocab": 128, "seq_len": 64}
    save(build("gpt", {"layers": 1, **shape}), str(path))
    before = whatif(str(path), cluster, 8, {"l4.count": ["2"]}, workers=1).points[0]
    save(build("gpt", {"layers": 6, **shape}), str(path))
    after = whatif(str(path), cluster, 8, {"l4.count": ["2"]}, workers=1).points[0]
    _load_model.cache_clear()
    fresh = whatif(str(path), cluster, 8, {"l4.count": ["2"]}, workers=1).points[0]
    assert after.iteration_time_s == fresh.iteration_time_s > before.iteration_time_s


def test_pinned_choice_that_cannot_fit_is_an_infeasible_row(files):
    """tp 2 is refused on a cluster of single-GPU nodes and runs once the L4s are 8-GPU nodes: the refused
    point is a row; when every point refuses the pins, they are the mistake, as in plan."""
    model, cluster = files
    pinned = ParallelConfig(global_batch=8, tp=2, pp=0, dp=0)  # single-GPU nodes cannot hold tp=2
    result = whatif(model, cluster, 8, {"l4.node": ["l4", "dgx-a100-80gb"]}, pinned=pinned, workers=1)
    assert [p.feasible for p in result.points] == [False, True]
    assert "tp" in result.points[0].reason and "refused" not in result.points[0].to_dict()
    with pytest.raises(ConfigError, match="every point of the sweep refuses the pinned configuration; the first: "
                                          "--tp 2"):
        whatif(model, cluster, 8, {"l4.count": ["1", "2"]}, pinned=pinned, workers=1)


def test_cli_table_csv_json_plot(files, tmp_path, capsys):
    pytest.importorskip("matplotlib", reason="matplotlib (the plot extra) is not installed")
    from matplotlib.image import imread

    model, cluster = files
    out_csv, out_png = tmp_path / "sweep.csv", tmp_path / "sweep.png"
    argv = ["whatif", model, "--cluster", cluster, "--global-batch", "8", "--sweep", "l4.count=1,2",
            "--sweep", "inter_node_bandwidth_GBps=1,50", "--csv", str(out_csv), "--plot", str(out_png)]
    assert main(argv) == 0
    captured = capsys.readouterr()
    assert "4 points, 4 feasible" in captured.out and captured.err == ""  # no progress bar off a terminal
    assert len(list(csv.DictReader(out_csv.open()))) == 4
    pixels = imread(str(out_png))
    assert pixels.shape[:2] == (480, 1280) and pixels[..., :3].var() > 0
    assert main([*argv[:8], "--json"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert len(document["points"]) == 2 and document["keys"] == ["l4.count"]


def test_a_plot_that_cannot_be_drawn_leaves_no_csv_behind(files, tmp_path, capsys):
    pytest.importorskip("matplotlib", reason="matplotlib (the plot extra) is not installed")
    model, cluster = files
    out_csv, out_png = tmp_path / "sweep.csv", tmp_path / "sweep.png"
    argv = ["whatif", model, "--cluster", cluster, "--global-batch", "8", "--sweep", "count=0", "--workers", "1",
            "--csv", str(out_csv), "--plot", str(out_png)]  # every group emptied: no point is feasible
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "no point of the sweep is feasible" in err and "(the first: no nodes left" in err, err
    assert not out_csv.exists() and not out_png.exists()


def test_cli_work_and_seed_reach_every_point(files, monkeypatch):
    """`planner whatif --work W --seed N` plans every point with SolverOptions(W, N), as `planner plan` does."""
    import planner.search

    seen = []
    real = planner.search.plan

    def spy(*args, options=None, **kwargs):
        seen.append(options)
        return real(*args, options=options, **kwargs)

    monkeypatch.setattr(planner.search, "plan", spy)
    model, cluster = files
    assert main(["whatif", model, "--cluster", cluster, "--global-batch", "8", "--sweep", "l4.count=1,2",
                 "--workers", "1", "--work", "0.5", "--seed", "3", "--json"]) == 0
    assert len(seen) == 2 and all(o == SolverOptions(work=0.5, seed=3) for o in seen)


def test_cli_bad_model_and_group(files, capsys):
    model, cluster = files
    assert main(["whatif", "missing.onnx", "--cluster", cluster, "--global-batch", "8", "--sweep", "count=1"]) == 2
    assert "missing.onnx" in capsys.readouterr().err
    assert main(["whatif", model, "--cluster", cluster, "--global-batch", "8", "--sweep", "l40.count=1"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no group 'l40'" in err and "did you mean l4" in err


def test_api_names_stay_functions_after_their_modules_are_imported():
    code = ("import planner.plans, planner.sweep.whatif, planner; "
            "print(planner.plan.__module__, planner.whatif.__module__, planner.Plan.__name__)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["planner.search.api", "planner.sweep.whatif", "Plan"]


def test_a_swept_seq_len_the_importer_cannot_take_is_refused_before_any_point(files):
    model, cluster = files
    with pytest.raises(ConfigError, match=r"^--sweep seq_len: 8388608 must be from 1 to 4194304"):
        whatif(model, cluster, 8, {"seq_len": ["64", str(2 ** 23)]}, workers=1)


def test_a_fixed_plan_that_every_point_refuses_is_the_mistake(tmp_path):
    """A plan re-timed on clusters that are all too small for its devices (or given tables it does not place)
    is refused as a whole, as pins every point refuses are; a sweep where some point takes it is rows."""
    model_path = "models/gpt2-124m.onnx"
    model = planner.load_model(model_path, {"batch": 1})
    plan = planner.plan(model, planner.load_cluster("dgx-a100-80gb*2"), 16,
                        pinned=ParallelConfig(global_batch=16, tp=0, pp=2, dp=0))
    with pytest.raises(ConfigError, match="every point of the sweep refuses the plan; the first: plan: it uses device"):
        whatif(model_path, "dgx-a100-80gb*2", 16, {"count": ["1"]}, plan=plan, workers=1)
    result = whatif(model_path, "dgx-a100-80gb*2", 16, {"count": ["1", "2"]}, plan=plan, workers=1)
    assert [p.feasible for p in result.points] == [False, True]


def test_plot_without_matplotlib_fails_before_the_sweep(files, tmp_path, capsys, monkeypatch):
    import planner.report._figure as figure
    import planner.sweep.whatif as sweep
    from planner.errors import PlannerError

    def missing():
        raise PlannerError('plots need matplotlib: pip install "planner[plot]"')

    def never(*args, **kwargs):
        raise AssertionError("the sweep ran")

    monkeypatch.setattr(figure, "pyplot", missing)
    monkeypatch.setattr(sweep, "whatif", never)
    model, cluster = files
    assert main(["whatif", model, "--cluster", cluster, "--global-batch", "8", "--sweep", "l4.count=1,2",
                 "--plot", str(tmp_path / "x.png")]) == 2
    assert "plots need matplotlib" in capsys.readouterr().err


@pytest.mark.parametrize("workers", [1, 2])
def test_a_limit_that_stops_searches_is_said_once_for_the_sweep(files, caplog, workers):
    model, cluster = files
    sweeps = {"l4.count": ["1", "2"], "a10.count": ["1"]}
    with caplog.at_level("INFO", logger="planner"):
        result = whatif(model, cluster, 8, sweeps, workers=workers, budget=1)
    stops = [r for r in caplog.records if "stopped" in r.getMessage()]
    assert [r.name for r in stops] == ["planner.sweep.whatif"]  # the points' own searches said nothing
    stopped = sum(p.stopped_at_limit for p in result.points)
    assert stopped >= 1 and f"at {stopped} of 2 points" in stops[0].getMessage()
    assert "raise the budget (--budget, budget=)" in stops[0].getMessage()
    assert "stopped_at_limit" not in result.to_csv() and "stopped_at_limit" not in result.to_json()
    proven = sum(bool(p.proven_optimal) for p in result.points)
    assert result.to_table().splitlines()[-1].startswith(f"2 points, 2 feasible, {proven} proven optimal")


@pytest.mark.parametrize("workers", [1, 2])
def test_a_time_limit_that_stops_searches_is_said_without_verbose_logging(files, caplog, workers):
    # a time limit's stop is an info record: at the default WARNING level the points never made it, so the
    # sweep's warning came only under -v
    model, cluster = files
    with caplog.at_level("WARNING", logger="planner"):
        result = whatif(model, cluster, 8, {"l4.count": ["1", "2"]}, workers=workers, time_limit_s=1e-9)
        assert logging.getLogger("planner.search.engine").getEffectiveLevel() == logging.WARNING
    stops = [r for r in caplog.records if "stopped" in r.getMessage()]
    stopped = sum(p.stopped_at_limit for p in result.points)
    assert stopped >= 1 and [r.name for r in stops] == ["planner.sweep.whatif"]
    assert f"at {stopped} of 2 points" in stops[0].getMessage() and "--time-limit" in stops[0].getMessage()
    assert not [r for r in caplog.records if r.levelno < logging.WARNING]  # nothing else leaks below the level
