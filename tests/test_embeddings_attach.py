"""Joining the embedding plan to a dense DLRM plan (planner.compose), its Plan JSON, and its TorchRec export."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from embedding_checks import capacities, check_result
from embedding_fixtures import cluster, node
from plan_samples import dlrm_plan
from planner.compose import shard, with_tables
from planner.embeddings import load_tables, shard_tables
from planner.export.torchrec import torchrec_plan
from planner.plans import Plan, validate
from planner.solver import SolverOptions
from planner.types import (Breakdown, Estimate, MemoryBreakdown, ParallelConfig, ReplicaEstimate,
                           StageEstimate)

REFERENCE = Path(__file__).resolve().parents[1] / "benchmarks" / "data" / "embedding_workloads.json"


def dense_only() -> Plan:
    plan = dlrm_plan()
    return dataclasses.replace(plan, embeddings=(), breakdown={**plan.breakdown, "embedding_s": 0.0},
                               iteration_time_s=0.016,
                               search=dataclasses.replace(plan.search, embedding_lower_bound_s=None,
                                                          lower_bound_s=0.015))


def dense_estimate(used_bytes: float = 20e9, capacity_bytes: float = 80e9) -> Estimate:
    """The dense part of dense_only(): 16 data-parallel a100s, ``used_bytes`` taken on each, 16 ms."""
    memory = MemoryBreakdown(other_bytes=used_bytes)
    replica = ReplicaEstimate(device_type="a100-80gb", devices=tuple(range(16)), tp=1, dp=16, batch_share=1.0,
                              num_micro_batches=1, forward_s=0.001, backward_s=0.002, memory=memory,
                              memory_capacity_bytes=capacity_bytes)
    stage = StageEstimate(index=0, first_layer=0, last_layer=2, device_type="a100-80gb", devices=replica.devices,
                          tp=1, dp=16, forward_s=0.001, backward_s=0.002, memory=memory,
                          memory_capacity_bytes=capacity_bytes, replicas=(replica,))
    config = ParallelConfig(global_batch=65536, tp=1, pp=1, dp=16, micro_batch=4096, optimizer="adagrad")
    return Estimate(config=config, iteration_time_s=0.016, throughput_samples_per_s=65536 / 0.016, feasible=True,
                    memory_per_device_bytes=used_bytes, breakdown=Breakdown(compute_s=0.016), stages=(stage,))


def test_attach_adds_embedding_time_on_the_critical_path():
    tables = load_tables(REFERENCE, "criteo-kaggle-dlrm")
    c = cluster((node("dgx-a100-80gb"), 2))
    dense = dense_only()
    estimate = dense_estimate(capacity_bytes=c.groups[0].node.device.memory_bytes)
    plan = with_tables(dense, estimate, shard(tables, c, estimate, options=SolverOptions(work=0.5)))
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
    result = shard_tables(tables, c, None, dense.global_batch, memory_budget_bytes=budget, options=SolverOptions(work=0.5))
    check_result(result, tables, c, budget=budget)


def test_torchrec_export_lists_every_table():
    tables = load_tables(REFERENCE, "mlperf-dlrm-dcnv2")
    c = cluster((node("dgx-a100-80gb"), 2))
    estimate = dense_estimate(capacity_bytes=c.groups[0].node.device.memory_bytes)
    plan = with_tables(dense_only(), estimate, shard(tables, c, estimate, options=SolverOptions(work=0.3)))
    exported = torchrec_plan(plan)
    assert exported["world_size"] == 16
    by_name = {t.name: t for t in tables}
    for name, entry in exported["plan"].items():
        assert entry["sharding_type"] in ("data_parallel", "table_wise", "row_wise", "column_wise",
                                          "table_row_wise", "table_column_wise")
        # TorchRec's data-parallel sharder takes the dense kernel only; the sharded tables' are fused
        data_parallel = entry["sharding_type"] == "data_parallel"
        assert entry["compute_kernel"] in (("dense",) if data_parallel else ("fused", "fused_uvm"))
        assert entry["ranks"] and all(0 <= r < 16 for r in entry["ranks"])
        if entry["sharding_spec"] is not None:
            cells = sum(s["shard_sizes"][0] * s["shard_sizes"][1] for s in entry["sharding_spec"])
            assert cells == by_name[name].rows * by_name[name].dim


def test_plan_cli_hands_work_and_seed_to_the_sharder(monkeypatch):
    """`planner plan --work W --seed N` reaches the table sharder of every plan as SolverOptions(W, N)."""
    from planner import compose
    from planner.cli import main

    seen = []
    real = compose.shard

    def spy(tables, cluster, dense, options=None):
        seen.append(options)
        return real(tables, cluster, dense, SolverOptions(work=0.2, seed=options.seed))

    monkeypatch.setattr(compose, "shard", spy)
    model = str(Path(__file__).resolve().parents[1] / "models" / "dlrm-criteo.onnx")
    assert main(["plan", model, "--cluster", "dgx-a100-80gb*1", "--global-batch", "4096", "--work", "0.5",
                 "--seed", "7", "--json"]) == 0
    assert seen and all(o == SolverOptions(work=0.5, seed=7) for o in seen)
