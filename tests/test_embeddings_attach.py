"""Joining the embedding plan to a dense DLRM plan, its Plan JSON, and its TorchRec export."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from embedding_checks import capacities, check_result
from embedding_fixtures import cluster, node
from plan_samples import dlrm_plan
from planner.embeddings import attach_embeddings, load_tables, shard_tables
from planner.export.torchrec import torchrec_plan
from planner.plan import Plan, validate

REFERENCE = Path(__file__).resolve().parents[1] / "benchmarks" / "data" / "embedding_workloads.json"


def dense_only() -> Plan:
    plan = dlrm_plan()
    return dataclasses.replace(plan, embeddings=(), breakdown={**plan.breakdown, "embedding_s": 0.0},
                               iteration_time_s=0.016,
                               search=dataclasses.replace(plan.search, embedding_lower_bound_s=None,
                                                          lower_bound_s=0.015))


def test_attach_adds_embedding_time_on_the_critical_path():
    tables = load_tables(REFERENCE, "criteo-kaggle-dlrm")
    c = cluster((node("dgx-a100-80gb"), 2))
    dense = dense_only()
    used = {d: 20e9 for d in range(16)}
    plan = attach_embeddings(dense, tables, c, dense.global_batch, used, time_limit_s=5)
    e = plan.breakdown["embedding_s"]
    assert e > 0
    assert plan.iteration_time_s == pytest.approx(0.016 + e)  # sequential: dense iteration + embeddings
    assert plan.throughput_samples_per_s == pytest.approx(plan.global_batch / plan.iteration_time_s)
    assert 0 < plan.search.embedding_lower_bound_s <= e
    assert plan.search.lower_bound_s == pytest.approx(0.015 + plan.search.embedding_lower_bound_s)
    assert {p.table for p in plan.embeddings} == {t.name for t in tables}
    validate(plan.to_dict())
    assert Plan.from_json(plan.to_json()) == plan
    # the embeddings got what the dense part left: 20 GB used of each device
    budget = {d: cap - 20e9 for d, cap in capacities(c).items()}
    result = shard_tables(tables, c, None, dense.global_batch, memory_budget_bytes=budget, time_limit_s=5)
    check_result(result, tables, c, budget=budget)


def test_torchrec_export_lists_every_table():
    tables = load_tables(REFERENCE, "mlperf-dlrm-dcnv2")
    c = cluster((node("dgx-a100-80gb"), 2))
    plan = attach_embeddings(dense_only(), tables, c, 65536, {d: 20e9 for d in range(16)}, time_limit_s=3)
    exported = torchrec_plan(plan)
    assert exported["world_size"] == 16
    by_name = {t.name: t for t in tables}
    for name, entry in exported["plan"].items():
        assert entry["sharding_type"] in ("data_parallel", "table_wise", "row_wise", "column_wise",
                                          "table_row_wise", "table_column_wise")
        assert entry["compute_kernel"] in ("fused", "fused_uvm")
        assert entry["ranks"] and all(0 <= r < 16 for r in entry["ranks"])
        if entry["sharding_spec"] is not None:
            cells = sum(s["shard_sizes"][0] * s["shard_sizes"][1] for s in entry["sharding_spec"])
            assert cells == by_name[name].rows * by_name[name].dim
