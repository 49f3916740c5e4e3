"""planner.plan / planner.search.search on the real cost model, and the `planner plan` command."""

import json
import subprocess
import sys

import pytest

import planner
from planner.builders import build, save
from planner.cli import main
from planner.errors import ConfigError, InfeasibleError
from planner.graph import import_model_proto
from planner.hardware import load_cluster
from planner.plans import Plan, validate
from planner.search import search
from planner.search.costmodel import CostModelBackend
from planner.search import engine
from planner.progress import ProgressBar
from planner.search.space import Pins
from planner.solver import SolverOptions
from planner.types import ParallelConfig, PipelineSpec, ReplicaSpec, StageSpec
from tests.solvers.exhaustive import enumerate_best


def gpt(layers=4, hidden=1024, heads=16, seq=512, vocab=32000):
    proto = build("gpt", {"layers": layers, "hidden": hidden, "heads": heads, "vocab": vocab, "seq_len": seq})
    return import_model_proto(proto, {"batch": 1, "seq": seq}, name=f"gpt{layers}x{hidden}")


@pytest.fixture(scope="module")
def tiny():
    return gpt()


@pytest.mark.parametrize("shorthand", ["dgx-a100-80gb*1", "dgx-a100-80gb*1+hgx-v100-32gb*1"])
def test_real_cost_model_matches_exhaustive_enumeration(tiny, shorthand):
    cluster = load_cluster(shorthand)
    backend = CostModelBackend(tiny, cluster)
    pins = Pins(micro_batch=1, zero=1, recompute="selective", sequence_parallel=False)
    truth = enumerate_best(backend, cluster, len(tiny.layers), 16, pins)
    found = engine.run(backend, cluster, len(tiny.layers), 16, pins)
    assert found.bound_violations == 0
    assert found.lower_bound_s <= truth.best_time_s * (1 + 1e-9)
    assert found.candidates[0].time_s >= truth.best_time_s * (1 - 1e-9)
    if found.proven_optimal:
        assert found.candidates[0].time_s == pytest.approx(truth.best_time_s, rel=1e-9)


@pytest.mark.parametrize("global_batch", [64])
def test_search_over_slow_links_proves_the_exhaustive_optimum(tmp_path, global_batch, monkeypatch):
    """Over 10 GB/s links the partition minimising a layout's bound is often not its fastest; the search times
    the layout's other partitions below the best time, so it proves the optimum exhaustive enumeration finds.
    With no enumeration allowed the layouts keep their bounds: not proven, the bound still below the optimum."""
    path = tmp_path / "slow.yaml"
    path.write_text("name: slow\ngroups:\n"
                    "  - {node: dgx-h100, count: 1, inter_node_bandwidth_GBps: 10}\n"
                    "  - {node: dgx-a100-40gb, count: 1, inter_node_bandwidth_GBps: 10}\n")
    cluster = load_cluster(path)
    # untied: a tied head's all-reduce between the end stages over these links makes one stage the fastest
    proto = build("llama", {"layers": 6, "hidden": 1024, "heads": 16, "kv_heads": 16, "ffn": 2816, "vocab": 32000,
                            "seq_len": 512})
    model = import_model_proto(proto, {"batch": 1, "seq": 512}, name="llama6x1024")
    backend = CostModelBackend(model, cluster)
    pins = Pins(micro_batch=1, zero=1, recompute="selective", sequence_parallel=False)
    truth = enumerate_best(backend, cluster, len(model.layers), global_batch, pins)
    found = engine.run(backend, cluster, len(model.layers), global_batch, pins)
    assert found.bound_violations == 0
    assert found.proven_optimal
    assert found.candidates[0].time_s == pytest.approx(truth.best_time_s, rel=1e-9)
    assert found.lower_bound_s == pytest.approx(truth.best_time_s, rel=1e-6)
    monkeypatch.setattr(engine, "EXHAUST_TOTAL_NODES", 0)
    capped = engine.run(backend, cluster, len(model.layers), global_batch, pins)
    assert not capped.proven_optimal
    assert capped.lower_bound_s < truth.best_time_s <= capped.candidates[0].time_s * (1 + 1e-9)


def spec_of(plan: Plan) -> PipelineSpec:
    stages = tuple(StageSpec(s.first_layer, s.last_layer, (ReplicaSpec(devices=s.devices, tp=s.tp, dp=s.dp),))
                   for s in plan.stages)
    return PipelineSpec(stages=stages, global_batch=plan.global_batch, micro_batch=plan.micro_batch, vpp=plan.vpp,
                        zero=plan.zero, recompute=plan.stages[0].recompute,
                        sequence_parallel=plan.sequence_parallel, schedule=plan.schedule, optimizer=plan.optimizer,
                        dtype=plan.dtype)


def test_plan_time_is_the_cost_models_estimate_and_fits(tiny):
    cluster = load_cluster("dgx-a100-80gb*2")
    result = search(tiny, cluster, 64, top_k=3)
    assert [p.iteration_time_s for p in result.plans] == sorted(p.iteration_time_s for p in result.plans)
    for p in result.plans:
        validate(p.to_dict())
        estimate = planner.cost.estimate_pipeline(tiny, cluster, spec_of(p))
        assert estimate.feasible
        assert estimate.iteration_time_s == pytest.approx(p.iteration_time_s, rel=1e-12)
        assert p.search.lower_bound_s <= p.iteration_time_s * (1 + 1e-9)
        assert 0 < p.physical_bound_s <= p.iteration_time_s
        assert p.bottleneck
    assert len({json.dumps(p.to_dict()["stages"]) + str(p.micro_batch) + str(p.zero) for p in result.plans}) == 3


def test_python_api_and_json_round_trip(tiny):
    best = planner.plan(tiny, load_cluster("dgx-a100-80gb*1"), global_batch=32)
    again = Plan.from_json(best.to_json())
    assert again == best


def plan_text(plan: Plan) -> str:
    """A plan's JSON without its one wall-clock field."""
    doc = plan.to_dict()
    doc["search"].pop("time_s")
    return json.dumps(doc, sort_keys=True)


def test_deterministic_except_search_time(tiny):
    cluster = load_cluster("dgx-a100-80gb*1+hgx-v100-32gb*1")
    assert plan_text(planner.plan(tiny, cluster, global_batch=32)) == \
        plan_text(planner.plan(tiny, cluster, global_batch=32))


def test_default_work_searches_to_completion_and_less_work_stops_early(tiny):
    """SolverOptions reaches the dense search: by default it runs to completion (the plan of a search whose
    work limit no count reaches, for any seed: the dense search makes no random choice); a tiny work stops it
    at its limit with a plan that is not proven optimal and a lower bound below the whole search's plan."""
    cluster = load_cluster("dgx-a100-80gb*1+hgx-v100-32gb*1")
    default = search(tiny, cluster, 32)
    assert default.proven_optimal
    for options in (SolverOptions(work=1e9), SolverOptions(seed=7)):
        assert plan_text(search(tiny, cluster, 32, options=options).best) == plan_text(default.best)
    short = search(tiny, cluster, 32, options=SolverOptions(work=10 / engine.DEFAULT_WORK_UNITS))
    assert short.plans and not short.proven_optimal and not short.best.search.proven_optimal
    assert short.candidates_evaluated < default.candidates_evaluated
    assert short.lower_bound_s <= default.best.iteration_time_s * (1 + 1e-9)
    assert default.best.iteration_time_s <= short.best.iteration_time_s * (1 + 1e-9)


def test_cli_work_reaches_the_dense_search(tmp_path, capsys, caplog):
    path = tmp_path / "tiny.onnx"
    save(build("gpt", {"layers": 4, "hidden": 1024, "heads": 16, "vocab": 32000, "seq_len": 512}), str(path))
    argv = ["plan", str(path), "--dim", "batch=1", "--dim", "seq=512", "--cluster", "dgx-a100-80gb*1+hgx-v100-32gb*1",
            "--global-batch", "32", "--json"]
    assert main(argv) == 0
    assert json.loads(capsys.readouterr().out)["search"]["proven_optimal"]
    assert main([*argv, "--work", str(10 / engine.DEFAULT_WORK_UNITS)]) == 0
    assert not json.loads(capsys.readouterr().out)["search"]["proven_optimal"]
    # the stop is logged with the limit that made it and how to search further
    assert any("work limit of 10 work units" in r.getMessage() and "--work" in r.getMessage() for r in caplog.records)


def test_cli_budget_that_stops_the_search_early_warns_as_work_does(tmp_path, capsys):
    """--budget N, like --work W, is a limit in work units: a search it stops early says so in one warning
    naming the flag, beside the plan (whose search line says it is not proven optimal)."""
    path = tmp_path / "tiny.onnx"
    save(build("gpt", {"layers": 4, "hidden": 1024, "heads": 16, "vocab": 32000, "seq_len": 512}), str(path))
    argv = ["plan", str(path), "--dim", "batch=1", "--dim", "seq=512", "--cluster", "dgx-a100-80gb*1+hgx-v100-32gb*1",
            "--global-batch", "32", "--budget", "10"]
    assert main(argv) == 0
    captured = capsys.readouterr()
    assert "not proven optimal" in captured.out
    assert captured.err.splitlines() == [
        "planner: search: stopped at the budget of 10 work units before the search was complete, so the plan is "
        "the best found, not proven optimal; raise the budget (--budget, budget=) to search further"]


def test_pinned_choices_are_kept(tiny):
    cluster = load_cluster("dgx-a100-80gb*2")
    pinned = ParallelConfig(global_batch=64, tp=2, pp=2, dp=4, micro_batch=2, zero=1, recompute="full")
    p = planner.plan(tiny, cluster, global_batch=64, pinned=pinned)
    assert len(p.stages) == 2 and p.micro_batch == 2 and p.zero == 1
    assert all(s.tp == 2 and s.dp == 4 and s.recompute == "full" for s in p.stages)
    free = planner.plan(tiny, cluster, global_batch=64)
    assert free.iteration_time_s <= p.iteration_time_s * (1 + 1e-9)


def test_pins_no_plan_can_satisfy_are_named(tiny):
    cluster = load_cluster("dgx-a100-80gb*1")
    with pytest.raises(ConfigError, match="--pp 99"):
        planner.plan(tiny, cluster, global_batch=64, pinned=ParallelConfig(global_batch=64, tp=0, pp=99, dp=0))
    with pytest.raises(ConfigError, match="--global-batch"):
        planner.plan(tiny, cluster, global_batch=10, pinned=ParallelConfig(global_batch=10, tp=0, pp=0, dp=4))


def test_model_too_large_is_infeasible_with_memory_needed():
    big = gpt(layers=24, hidden=8192, heads=64, seq=2048, vocab=51200)  # 19B parameters, 300+ GB of states
    with pytest.raises(InfeasibleError, match=r"GiB.*add devices \(at least \d+ x v100"):
        planner.plan(big, load_cluster("hgx-v100-16gb*1"), global_batch=8)


def test_infeasible_activations_are_those_of_the_pinned_micro_batch():
    big = gpt(layers=24, hidden=8192, heads=64, seq=2048, vocab=51200)
    pins = ParallelConfig(global_batch=8, tp=0, pp=0, dp=0, micro_batch=4, recompute="none")
    with pytest.raises(InfeasibleError) as caught:
        planner.plan(big, load_cluster("hgx-v100-16gb*1"), global_batch=8, pinned=pins)
    assert "GiB of activations per micro-batch of 4 samples without recompute" in str(caught.value)
    with pytest.raises(InfeasibleError) as caught:
        planner.plan(big, load_cluster("hgx-v100-16gb*1"), global_batch=8)
    assert "GiB of activations per micro-batch of 1 sample with full recompute" in str(caught.value)


def test_infeasible_advice_does_not_ask_for_devices_the_cluster_has():
    """19B parameters' states on 24 V100s of 16 GB (fp16: Megatron's 20 bytes per parameter): they would fill
    24 of the 24, but no split into whole layers leaves room for the rest; the advice says so instead of "at
    least 24 x v100"."""
    big = gpt(layers=24, hidden=8192, heads=64, seq=2048, vocab=51200)
    with pytest.raises(InfeasibleError, match=r"would fill 24 x v100-16gb of the 24 devices") as caught:
        planner.plan(big, load_cluster("hgx-v100-16gb*3"), global_batch=8)
    assert "at least" not in str(caught.value)


def test_cli_infeasible_exits_2_with_one_line(tmp_path, capsys):
    path = tmp_path / "big.onnx"
    save(build("gpt", {"layers": 24, "hidden": 8192, "heads": 64, "vocab": 51200, "seq_len": 2048}), str(path))
    code = main(["plan", str(path), "--dim", "batch=1", "--dim", "seq=2048", "--cluster", "hgx-v100-16gb*1",
                 "--global-batch", "8"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2
    assert len(err) == 1 and err[0].startswith("planner: error:") and "GiB" in err[0]


def test_cli_json_top_and_out(tmp_path):
    path = tmp_path / "tiny.onnx"
    save(build("gpt", {"layers": 4, "hidden": 1024, "heads": 16, "vocab": 32000, "seq_len": 512}), str(path))
    out = tmp_path / "plan.json"
    proc = subprocess.run([sys.executable, "-m", "planner", "plan", str(path), "--dim", "batch=1", "--dim", "seq=512",
                           "--cluster", "dgx-a100-80gb*1", "--global-batch", "32", "--top", "2", "--json",
                           "--out", str(out), "--tp", "2"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    validate({k: v for k, v in doc.items() if k != "alternatives"})
    assert len(doc["alternatives"]) == 2  # --top K: the best plan and K alternatives
    assert all(s["tp"] == 2 for s in doc["stages"])
    saved = Plan.from_json(out.read_text())
    assert saved.iteration_time_s == doc["iteration_time_s"]
    table = subprocess.run([sys.executable, "-m", "planner", "plan", str(path), "--dim", "batch=1", "--dim",
                            "seq=512", "--cluster", "dgx-a100-80gb*1", "--global-batch", "32", "--top", "2"],
                           capture_output=True, text=True)
    assert table.returncode == 0 and "Bottleneck:" in table.stdout and "Best plan and 2 alternatives:" in table.stdout


def test_progress_bar_waits_then_draws():
    import io
    quiet, loud = io.StringIO(), io.StringIO()
    bar = ProgressBar(delay_s=3600, stream=quiet)
    bar(0.5)
    bar.close()
    assert quiet.getvalue() == ""
    bar = ProgressBar(delay_s=0.0, stream=loud)
    bar(0.5)
    bar(1.0)
    bar.close()
    assert "50%" in loud.getvalue() and "100%" in loud.getvalue() and loud.getvalue().endswith("\n")


@pytest.mark.parametrize("shorthand", ["dgx-a100-80gb*1", "dgx-a100-80gb*1+hgx-v100-32gb*1"])
def test_plan_carries_its_batching(tiny, shorthand):
    """A plan's batching splits the global batch the way its stages run it: every replica group's micro-batches
    times its replicas times the micro-batch add up to the global batch, on one device type or two."""
    plan = planner.plan(tiny, load_cluster(shorthand), global_batch=48)
    batching = plan.batching
    assert batching.num_micro_batches == plan.num_micro_batches
    assert batching.dp * batching.micro_batch * batching.num_micro_batches == plan.global_batch
    for stage in plan.stages:
        groups = stage.replicas or ()
        if groups:
            samples = sum(batching.replica_micro_batches(g.batch_share, g.dp) * g.dp * plan.micro_batch
                          for g in groups)
            assert samples == pytest.approx(plan.global_batch)
