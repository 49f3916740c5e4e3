"""planner.compose, the seam between dense and sparse: ``estimate`` and ``plan`` of a model with sparse
embedding tables (the DLRM's own, or a table file given with ``--tables``) shard them with the same call and
join them alike, never silently ignoring them; the cost model knows nothing of the tables."""

from __future__ import annotations

import ast
import dataclasses
import json
import math
from pathlib import Path

import pytest

import planner
import planner.embeddings
from planner.builders import build, save
from planner.cli import main
from planner.compose import dense_part, tables_memory_budget_bytes
from planner.cost import estimate as dense_estimate
from planner.embeddings import load_tables
from planner.graph import load_model
from planner.hardware import load_cluster
from planner.plans import Plan
from planner.types import Batching, ParallelConfig

ROOT = Path(__file__).resolve().parents[1]
estimate = planner.estimate

TABLES = {"tables": [{"name": "user", "rows": 200_000, "dim": 64, "pooling_factor": 1},
                     {"name": "item", "rows": 50_000, "dim": 64, "pooling_factor": 4}],
          "dense_features": 4, "bottom_mlp": [64, 64], "top_mlp": [64, 1]}
CONFIG = ParallelConfig(global_batch=4096, tp=1, pp=1, dp=8, micro_batch=512, zero=0, recompute="none")


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("sparse")
    tables = folder / "tables.json"
    tables.write_text(json.dumps(TABLES))
    dlrm = folder / "dlrm.onnx"
    save(build("dlrm", {"tables": str(tables)}), str(dlrm))
    gpt = folder / "gpt.onnx"
    save(build("gpt", {"layers": 2, "hidden": 64, "heads": 2, "vocab": 128, "seq_len": 64}), str(gpt))
    return str(dlrm), str(gpt), str(tables)


def test_a_dlrm_estimate_shards_its_tables_and_times_the_dense_part_without_them(files):
    model = load_model(files[0], dims={"batch": 1})
    cluster = load_cluster("dgx-a100-80gb*1")
    est = estimate(model, cluster, CONFIG)
    assert {p.table for p in est.embeddings} == {"embed.user.weight", "embed.item.weight"}  # as imported
    assert est.breakdown.embedding_s > 0
    dense = dense_estimate(dense_part(model), cluster, CONFIG)
    # iteration = dense iteration + embedding time (planner.compose's join)
    assert est.iteration_time_s == pytest.approx(dense.iteration_time_s + est.breakdown.embedding_s, rel=1e-12)
    assert est.breakdown.total_s == pytest.approx(est.iteration_time_s, rel=1e-9)
    # replicated in the dense pipeline, the tables' 16 M parameters (Adam) would weigh on every device
    replicated = dense_estimate(model, cluster, CONFIG)
    assert est.stages[0].memory.weights_bytes < replicated.stages[0].memory.weights_bytes


def test_estimate_tables_flag_is_used(files, capsys):
    _, gpt, tables = files
    argv = ["estimate", gpt, "--cluster", "dgx-a100-80gb*1", "--global-batch", "64", "--tp", "1", "--pp", "1",
            "--dp", "8", "--json"]
    assert main(argv) == 0
    without = json.loads(capsys.readouterr().out)
    assert main([*argv, "--tables", tables]) == 0
    document = json.loads(capsys.readouterr().out)
    assert without["embeddings"] == [] and without["breakdown"]["embedding_s"] == 0
    assert {p["table"] for p in document["embeddings"]} == {"user", "item"}
    assert document["breakdown"]["embedding_s"] > 0
    assert document["iteration_time_s"] > without["iteration_time_s"]


def test_tables_that_fit_nowhere_make_the_estimate_infeasible(files, tmp_path):
    huge = tmp_path / "huge.json"
    huge.write_text(json.dumps({"tables": [{"name": "huge_ids", "rows": 2_000_000_000, "dim": 128,
                                            "pooling_factor": 1}]}))
    model = load_model(files[1], dims={"batch": 1})
    est = estimate(model, load_cluster("dgx-a100-80gb*1"), ParallelConfig(global_batch=64, tp=1, pp=1, dp=8),
                   tables=str(huge))
    assert not est.feasible and "huge_ids" in est.reason


def test_workload_picks_an_entry_of_a_tables_file_with_several(files, tmp_path, capsys):
    _, gpt, _ = files
    several = tmp_path / "workloads.json"
    several.write_text(json.dumps({"workloads": [{"name": "small", "tables": TABLES["tables"][:1]},
                                                 {"name": "both", "tables": TABLES["tables"]}]}))
    argv = ["estimate", gpt, "--cluster", "dgx-a100-80gb*1", "--global-batch", "64", "--tp", "1", "--pp", "1",
            "--dp", "8", "--tables", str(several), "--json"]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--workload NAME" in err[0] and "small, both" in err[0]
    assert main([*argv, "--workload", "small"]) == 0
    assert [p["table"] for p in json.loads(capsys.readouterr().out)["embeddings"]] == ["user"]


def plan_config(plan: Plan) -> ParallelConfig:
    """The configuration a plan resolved to, as ``estimate`` takes it."""
    first = plan.stages[0]
    return ParallelConfig(global_batch=plan.global_batch, tp=first.tp, pp=len(plan.stages), dp=first.dp,
                          micro_batch=plan.micro_batch, vpp=plan.vpp, zero=plan.zero, recompute=first.recompute,
                          sequence_parallel=plan.sequence_parallel, schedule=plan.schedule,
                          optimizer=plan.optimizer, dtype=plan.dtype, runtime=plan.runtime)


def test_estimate_at_a_plans_configuration_gives_the_plan(monkeypatch):
    """The Criteo DLRM: ``planner.estimate`` at the plan's own configuration shards the tables with the same
    call (same devices, memory budget, optimizer, batch and work budget) and joins them alike."""
    model = load_model(str(ROOT / "models" / "dlrm-criteo.onnx"))
    cluster = load_cluster("dgx-a100-80gb*2")
    tables = load_tables(ROOT / "benchmarks" / "data" / "embedding_workloads.json", "criteo-kaggle-dlrm")
    calls: list[dict] = []
    real = planner.embeddings.shard_tables

    def spy(*args, **kwargs):
        calls.append({"args": args, **kwargs})
        return real(*args, **kwargs)

    monkeypatch.setattr(planner.embeddings, "shard_tables", spy)
    best = planner.plan(model, cluster, 65536, tables=tables)
    est = planner.estimate(model, cluster, plan_config(best), tables=tables)
    assert len(calls) == 2 and calls[0] == calls[1]
    assert calls[1]["memory_budget_bytes"] == tables_memory_budget_bytes(
        dense_estimate(dense_part(model), cluster, plan_config(best)))
    assert est.feasible
    assert est.iteration_time_s == best.iteration_time_s
    assert est.breakdown.embedding_s == best.breakdown["embedding_s"] > 0
    assert est.throughput_samples_per_s == best.throughput_samples_per_s
    assert best.memory_per_device_bytes == math.ceil(est.memory_per_device_bytes)  # a plan holds whole bytes
    assert tuple(est.embeddings) == best.embeddings
    assert est.breakdown.to_dict() == best.breakdown
    # the batching both sides see: 65536 samples over the plan's replicas, in its micro-batches
    batching = Batching.of(est.config)
    assert batching.global_batch == best.global_batch and batching.num_micro_batches == best.num_micro_batches


def test_batching_counts_each_replicas_samples_and_micro_batches():
    batching = Batching.of(ParallelConfig(global_batch=65536, tp=2, pp=2, dp=16, micro_batch=64))
    assert (batching.per_replica, batching.num_micro_batches) == (4096, 64)  # 65536 / 16, then / 64


def test_tables_get_the_memory_the_dense_part_leaves_on_its_devices():
    """A configuration on half the cluster shards the tables over its own devices only, each with what the
    dense part leaves of it."""
    model = load_model(str(ROOT / "models" / "dlrm-criteo.onnx"))
    cluster = load_cluster("dgx-a100-80gb*2")
    config = ParallelConfig(global_batch=65536, tp=1, pp=1, dp=8, micro_batch=1024, zero=0, recompute="none")
    dense = dense_estimate(dense_part(model), cluster, config)
    budget = tables_memory_budget_bytes(dense)
    replica = dense.stages[0].replicas[0]
    assert budget == {d: replica.memory_capacity_bytes - replica.memory.total_bytes for d in range(8)}
    est = planner.estimate(model, cluster, config)
    assert {s.device for p in est.embeddings for s in p.shards} <= set(range(8))


def _imported(path: Path) -> set[str]:
    """Every module ``path`` imports, at the top or inside a function, relative imports resolved, with
    ``from planner import x`` counted as ``planner.x``."""
    package = ".".join(path.relative_to(ROOT).with_suffix("").parts[:-1])
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(parent + ([base] if base else []))
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names)
    return names


@pytest.mark.parametrize("package, forbidden", [("cost", ("planner.embeddings", "planner.compose")),
                                                ("search", ("planner.embeddings",)),
                                                ("embeddings", ("planner.cost", "planner.search",
                                                                "planner.compose"))])
def test_only_compose_knows_both_dense_and_sparse(package, forbidden):
    for path in sorted((ROOT / "planner" / package).glob("*.py")):
        bad = sorted(name for name in _imported(path)
                     if any(name == f or name.startswith(f + ".") for f in forbidden))
        assert not bad, f"{path.relative_to(ROOT)} imports {bad}"


def test_given_tables_that_share_no_name_with_the_models_are_named(caplog):
    """--tables gives statistics of the model's own tables (a file names them by feature, "cat_0"; the graph by
    weight, "embed.cat_0.weight"): a file whose tables match none of them, or given to a model without sparse
    tables, is used as given and said once."""
    import logging

    from planner.compose import _warn_foreign_tables, sparse_tables

    dlrm = load_model(str(ROOT / "models" / "dlrm-criteo.onnx"))
    gpt = load_model(str(ROOT / "models" / "gpt2-124m.onnx"))
    criteo = load_tables(ROOT / "benchmarks" / "data" / "embedding_workloads.json", "criteo-kaggle-dlrm")
    other = load_tables(ROOT / "benchmarks" / "data" / "embedding_workloads.json", "mlperf-dlrm-dcnv2")
    _warn_foreign_tables.cache_clear()
    with caplog.at_level(logging.WARNING, logger="planner.compose"):
        assert sparse_tables(dlrm, criteo) == tuple(criteo)
    assert not caplog.records
    with caplog.at_level(logging.WARNING, logger="planner.compose"):
        sparse_tables(gpt, criteo)
        sparse_tables(gpt, criteo)
    assert [r.getMessage().split(";")[0] for r in caplog.records] == [
        "model 'gpt2-124m' has no sparse embedding tables"]
    caplog.clear()
    renamed = [dataclasses.replace(t, name=f"feature_{i}") for i, t in enumerate(other)]
    with caplog.at_level(logging.WARNING, logger="planner.compose"):
        sparse_tables(dlrm, renamed)
    assert "share no name with model 'dlrm-criteo''s 26 embedding tables" in caplog.records[0].getMessage()


def _one_table_file(folder: Path, rows: int) -> str:
    """A table file of one 1024-wide table of ``rows`` rows (pooling factor 1)."""
    path = folder / f"table_{rows}.json"
    path.write_text(json.dumps({"tables": [{"name": "big", "rows": rows, "dim": 1024, "pooling_factor": 1}]}))
    return str(path)


def test_plan_skips_dense_winners_whose_devices_cannot_hold_the_tables(tmp_path):
    """The fastest dense plans use a few devices; a table that only fits row-sharded over more of them makes
    the search go on to a plan on enough devices instead of failing at the dense winner."""
    model = planner.load_model(str(ROOT / "models" / "dlrm-criteo.onnx"))
    best = planner.plan(model, load_cluster("dgx-a100-80gb*2"), global_batch=4096,
                        tables=_one_table_file(tmp_path, 122_000_000))
    assert len(best.devices) == 16 and [p.table for p in best.embeddings] == ["big"]


def test_tables_that_fit_no_plan_are_reported_against_the_whole_cluster(tmp_path):
    model = planner.load_model(str(ROOT / "models" / "dlrm-criteo.onnx"))
    cluster = load_cluster("dgx-a100-80gb*2")
    with pytest.raises(planner.InfeasibleError, match="'big'.*over all 16 devices"):
        planner.plan(model, cluster, global_batch=4096, tables=_one_table_file(tmp_path, 1_220_000_000))
    # they fit the cluster, but not the four devices the pins leave the dense part
    pinned = ParallelConfig(global_batch=4096, tp=1, pp=1, dp=4)
    with pytest.raises(planner.InfeasibleError, match="leaves the 1 embedding table enough memory on the 16 dev"):
        planner.plan(model, cluster, global_batch=4096, pinned=pinned, tables=_one_table_file(tmp_path, 122_000_000))
