"""`planner estimate --plan` and `planner.estimate_plan`: a plan file's own placement re-timed, equal to the
plan's time on the cluster it was made for, slower on a slower network; misuse exits 2 with one line."""

import dataclasses
import json

import pytest

import planner
from planner.builders import build, save
from planner.cli import main
from planner.graph import import_model_proto
from planner.plans import load_plan

MIXED = "dgx-a100-80gb*1+hgx-v100-32gb*1"


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    """A GPT model file, its graph, and plans (one per case) written to files."""
    root = tmp_path_factory.mktemp("estimate_plan")
    proto = build("gpt", {"layers": 6, "hidden": 1024, "heads": 16, "vocab": 32000, "seq_len": 512})
    save(proto, str(root / "gpt.onnx"))
    model = import_model_proto(proto, {"batch": 1, "seq": 512}, name="gpt")
    plans = {
        "mixed": planner.plan(model, planner.load_cluster(MIXED), 64),
        "pipeline": planner.plan(model, planner.load_cluster("dgx-a100-80gb*2"), 64,
                                 pinned=planner.ParallelConfig(global_batch=64, tp=2, pp=2, dp=4, vpp=2)),
    }
    paths = {}
    for name, plan in plans.items():
        paths[name] = root / f"{name}.json"
        paths[name].write_text(plan.to_json())
    slow = root / "slow.yaml"
    slow.write_text("name: slow\ngroups:\n  - {node: dgx-a100-80gb, count: 2, inter_node_bandwidth_GBps: 5}\n")
    return root, model, plans, paths, slow


@pytest.mark.parametrize("case,cluster", [("mixed", MIXED), ("pipeline", "dgx-a100-80gb*2")])
def test_a_plan_re_times_to_its_own_time(made, case, cluster):
    _, model, plans, paths, _ = made
    plan = load_plan(str(paths[case]))
    estimate = planner.estimate_plan(model, planner.load_cluster(cluster), plan)
    assert estimate.feasible
    assert estimate.iteration_time_s == pytest.approx(plans[case].iteration_time_s, rel=1e-9)
    assert [(s.first_layer, s.last_layer, s.devices) for s in estimate.stages] == \
        [(s.first_layer, s.last_layer, s.devices) for s in plans[case].stages]


def test_the_same_plan_on_a_slower_network_takes_longer(made, capsys):
    root, _, plans, paths, slow = made
    assert main(["estimate", str(root / "gpt.onnx"), "--cluster", str(slow), "--plan", str(paths["pipeline"]),
                 "--json"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert document["iteration_time_s"] > plans["pipeline"].iteration_time_s
    assert document["config"]["pp"] == 2 and document["config"]["vpp"] == 2


@pytest.mark.parametrize("extra,needles", [
    (["--tp", "2"], ["--plan fixes the configuration", "drop --tp"]),
    (["--global-batch", "64", "--optimizer", "sgd"], ["drop --global-batch --optimizer"]),
    # the plan's table placement is re-timed, so the sharder's options would do nothing
    (["--work", "5", "--seed", "3"], ["--plan keeps the plan's table placement", "drop --work --seed"]),
    (["--seed", "0"], ["drop --seed"]),
])
def test_configuration_flags_with_a_plan_exit_2(made, capsys, extra, needles):
    root, _, _, paths, _ = made
    code = main(["estimate", str(root / "gpt.onnx"), "--cluster", "dgx-a100-80gb*2", "--plan", str(paths["pipeline"]),
                 *extra])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1
    assert all(needle in err[0] for needle in needles)


def test_estimate_without_a_configuration_or_a_plan_names_both(made, capsys):
    root, *_ = made
    code = main(["estimate", str(root / "gpt.onnx"), "--cluster", "dgx-a100-80gb*2", "--tp", "2"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1
    assert "--global-batch --pp --dp" in err[0] and "--plan PLAN.json" in err[0]


def test_a_plan_for_another_model_or_a_smaller_cluster_is_refused(made, capsys, tmp_path):
    root, _, _, paths, _ = made
    other = tmp_path / "other.onnx"
    save(build("gpt", {"layers": 4, "hidden": 1024, "heads": 16, "vocab": 32000, "seq_len": 512}), str(other))
    code = main(["estimate", str(other), "--cluster", "dgx-a100-80gb*2", "--plan", str(paths["pipeline"])])
    err = capsys.readouterr().err
    assert code == 2 and str(paths["pipeline"]) in err and "give the model the plan was made for" in err
    code = main(["estimate", str(root / "gpt.onnx"), "--cluster", "dgx-a100-80gb*1", "--plan", str(paths["pipeline"])])
    err = capsys.readouterr().err
    assert code == 2 and "uses device 15" in err and "the cluster has 8 devices" in err
    # the file is named once, in place of the plan the message names
    assert f"{paths['pipeline']}: it uses device 15" in err and "plan:" not in err


def test_a_plan_with_embedding_tables_keeps_its_placement(tmp_path):
    """The tables stay where the plan put them: its own time on its cluster, more over a slower network; a
    dense model's plan is refused for a model with tables, and the reverse."""
    model = planner.load_model("models/dlrm-criteo.onnx")
    cluster = planner.load_cluster("dgx-a100-80gb*2")
    plan = planner.Plan.from_json(planner.plan(model, cluster, 65536).to_json())
    estimate = planner.estimate_plan(model, cluster, plan)
    assert estimate.iteration_time_s == pytest.approx(plan.iteration_time_s, rel=1e-9)
    assert estimate.embeddings == plan.embeddings
    slow = tmp_path / "slow.yaml"
    slow.write_text("name: slow\ngroups:\n  - {node: dgx-a100-80gb, count: 2, inter_node_bandwidth_GBps: 5}\n")
    slower = planner.estimate_plan(model, planner.load_cluster(str(slow)), plan)
    assert slower.breakdown.embedding_s > estimate.breakdown.embedding_s
    assert slower.embeddings == plan.embeddings
    dense = dataclasses.replace(plan, embeddings=())
    with pytest.raises(planner.ConfigError, match="the plan places none"):
        planner.estimate_plan(model, cluster, dense)


def test_a_table_placement_names_what_does_not_match(tmp_path):
    model = planner.load_model("models/dlrm-criteo.onnx")
    cluster = planner.load_cluster("dgx-a100-80gb*2")
    plan = planner.plan(model, cluster, 65536)
    first = plan.embeddings[0]
    missing = dataclasses.replace(plan, embeddings=plan.embeddings[1:])
    with pytest.raises(planner.ConfigError, match=f"table {first.table!r} has no placement"):
        planner.estimate_plan(model, cluster, missing)
    wrong = dataclasses.replace(plan, embeddings=(dataclasses.replace(first, sharding="row_wise",
                                                                      shards=first.shards[:1]),
                                                  *plan.embeddings[1:]))
    with pytest.raises(planner.ConfigError, match=f"table {first.table!r}: no row_wise sharding"):
        planner.estimate_plan(model, cluster, wrong)


def test_expert_and_context_parallel_plans_re_time_to_their_own_time():
    """ep and an expert tp other than tp (a mixture of experts), and cp (a long sequence), carried over."""
    cluster = planner.load_cluster("dgx-h100*2")
    cases = [("moe", {"layers": 2, "hidden": 1024, "heads": 8, "experts": 8, "top_k": 2, "vocab": 32000,
                      "seq_len": 1024}, 1024, 64, {"ep": 8, "tp": 2}),
             ("llama", {"layers": 4, "hidden": 1024, "heads": 8, "vocab": 32000, "seq_len": 16384}, 16384, 16,
              {"cp": 2})]
    for family, params, seq, global_batch, pins in cases:
        model = import_model_proto(build(family, params), {"batch": 1, "seq": seq}, name=family)
        pinned = planner.ParallelConfig(global_batch=global_batch, **{"tp": 0, "pp": 0, "dp": 0, **pins})
        plan = planner.Plan.from_json(planner.plan(model, cluster, global_batch, pinned=pinned).to_json())
        stage = plan.stages[0]
        assert (stage.ep, stage.expert_tp, stage.tp) == (8, 1, 2) if family == "moe" else stage.cp == 2
        estimate = planner.estimate_plan(model, cluster, plan)
        assert estimate.iteration_time_s == pytest.approx(plan.iteration_time_s, rel=1e-9)


def test_whatif_re_times_a_fixed_plan_at_every_point(made):
    """``whatif --plan``: the plan's placement at each point, slower on the slower network; a point whose
    cluster lacks the plan's devices is an infeasible row saying so."""
    root, _, plans, paths, _ = made
    plan = load_plan(str(paths["pipeline"]))
    result = planner.whatif(str(root / "gpt.onnx"), "dgx-a100-80gb*2", 64,
                            {"inter_node_bandwidth_GBps": ["5", "100"], "count": ["1", "2"]},
                            dims={"seq": 512}, plan=plan, workers=1)
    small5, full5, small100, full100 = result.points
    assert not small5.feasible and "the cluster has 8 devices" in small5.reason
    assert full5.feasible and full100.feasible and full5.iteration_time_s > full100.iteration_time_s
    assert full100.pp == 2 and full100.proven_optimal is None and full100.lower_bound_s is None
    # at the cluster the plan was made for (dgx-a100-80gb's own bandwidth), its own time
    same = planner.whatif(str(root / "gpt.onnx"), "dgx-a100-80gb*2", 64, {"count": ["2"]}, dims={"seq": 512},
                          plan=plan, workers=1).points[0]
    assert same.iteration_time_s == pytest.approx(plans["pipeline"].iteration_time_s, rel=1e-9)


@pytest.mark.parametrize("kwargs,needle", [
    ({"pinned": planner.ParallelConfig(global_batch=64, tp=2, pp=0, dp=0)}, "drop the pinned configuration"),
    ({"sweeps": {"global_batch": ["32", "64"]}}, "--sweep global_batch"),
    ({"global_batch": 32}, "its global batch is 64"),
])
def test_whatif_with_a_plan_refuses_what_contradicts_it(made, kwargs, needle):
    root, _, _, paths, _ = made
    arguments = {"global_batch": 64, "sweeps": {"inter_node_bandwidth_GBps": ["5"]}, **kwargs}
    with pytest.raises(planner.ConfigError, match=needle):
        planner.whatif(str(root / "gpt.onnx"), "dgx-a100-80gb*2", arguments.pop("global_batch"),
                       arguments.pop("sweeps"), plan=load_plan(str(paths["pipeline"])), workers=1, **arguments)


@pytest.mark.parametrize("extra,needle", [
    (["--tp", "2"], "--plan fixes the configuration; drop --tp (or drop --plan to re-plan each point)"),
    (["--optimizer", "adam", "--zero", "1"], "drop --zero --optimizer"),  # the default optimizer is a pin too
    (["--budget", "5", "--seed", "1"], "--plan re-times the plan at each point and runs no search; drop --budget "
                                       "--seed (or drop --plan to re-plan each point)"),
])
def test_whatif_cli_names_the_configuration_flags_a_plan_fixes(made, capsys, extra, needle):
    """As `estimate --plan` does: each flag given with --plan is named, before the plan or the model is read."""
    root, *_ = made
    code = main(["whatif", str(root / "gpt.onnx"), "--cluster", "dgx-a100-80gb*2", "--plan", str(root / "none.json"),
                 "--sweep", "count=1,2", *extra])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and needle in err[0]


def test_whatif_needs_a_global_batch_or_a_plan(made, capsys):
    root, *_ = made
    code = main(["whatif", str(root / "gpt.onnx"), "--cluster", "dgx-a100-80gb*2", "--sweep", "count=1,2"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "--global-batch N (or --plan PLAN.json" in err[0]


def test_the_table_gives_each_stage_its_tp_and_dp(made, capsys):
    root, _, plans, paths, _ = made
    assert main(["estimate", str(root / "gpt.onnx"), "--cluster", "dgx-a100-80gb*2", "--plan",
                 str(paths["pipeline"])]) == 0
    lines = capsys.readouterr().out.splitlines()
    header = next(i for i, line in enumerate(lines) if line.split()[:4] == ["stage", "layers", "device", "tp"])
    rows = [line.split() for line in lines[header + 1:header + 3]]
    assert [(int(r[3]), int(r[4])) for r in rows] == [(s.tp, s.dp) for s in plans["pipeline"].stages]


def test_the_table_gives_each_replica_group_of_a_mixed_stage_its_row(made, capsys):
    # a mixed stage's own tp, dp and times only sum its groups up: they used to be all the table printed
    root, model, _, _, _ = made
    plan = planner.plan(model, planner.load_cluster(MIXED), 64,
                        pinned=planner.ParallelConfig(global_batch=64, pp=1, dp=16))
    groups = plan.stages[0].replicas
    assert len(groups) == 2
    path = root / "mixed_stage.json"
    path.write_text(plan.to_json())
    assert main(["estimate", str(root / "gpt.onnx"), "--cluster", MIXED, "--plan", str(path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    header = next(i for i, line in enumerate(lines) if line.split()[:4] == ["stage", "layers", "device", "tp"])
    rows = [line.split() for line in lines[header + 2:header + 4]]
    assert [(r[0], r[2], int(r[3]), int(r[4])) for r in rows] == \
        [(f"{g.batch_share:.0%}", g.device_type, g.tp, g.dp) for g in groups]



def test_a_mixed_stage_row_gives_its_groups_tp(tmp_path, capsys):
    """The row of a stage whose replica groups run different tp gives them all ('1/2'), not the first group's."""
    path = "models/gpt-1.3b.onnx"
    plan = planner.plan(planner.load_model(path), planner.load_cluster("h100-a100-mixed"), 512)
    tps = sorted({g.tp for g in plan.stages[0].replicas})
    assert len(tps) == 2  # the H100 group and the smaller A100 group shard differently
    (tmp_path / "plan.json").write_text(plan.to_json())
    assert main(["estimate", path, "--cluster", "h100-a100-mixed", "--plan", str(tmp_path / "plan.json")]) == 0
    lines = capsys.readouterr().out.splitlines()
    header = next(i for i, line in enumerate(lines) if line.split()[:4] == ["stage", "layers", "device", "tp"])
    assert lines[header + 1].split()[3] == "/".join(map(str, tps))
