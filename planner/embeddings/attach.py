"""Joining the embedding plan to a dense plan (DLRM-style models).

How the two combine: the dense MLPs are data-parallel on every device; the embedding tables are model-parallel.
Each iteration runs the embedding forward (ids all-to-all, lookups, pooled-output all-to-all) before the
interaction layer and the embedding backward (gradient all-to-all, fused lookup backward + optimizer update)
after the dense backward, so the embedding time sits on the critical path in sequence with the dense time:
``iteration = dense iteration + embedding_s``. Overlap of the embedding all-to-all with the bottom MLP (as
TorchRec's train pipeline does) would only shorten this, so the estimate is conservative, and the lower bound
(dense bound + the embedding LP bound) is a bound on this sequential model.
Memory: embeddings get what each device has left after the dense part.
"""

from __future__ import annotations

import dataclasses
from os import PathLike
from typing import Mapping, Sequence

from planner.embeddings.problem import table_optimizer
from planner.embeddings.shard import DEFAULT_TIME_LIMIT_S, EmbeddingResult, shard_tables
from planner.embeddings.tables import load_tables
from planner.plan import Plan
from planner.types import Cluster, EmbeddingTable, LayerGraph


def attach_embeddings(plan: Plan, model_tables: Sequence[EmbeddingTable], cluster: Cluster, global_batch: int,
                      memory_used_per_device: Mapping[int, float], *, devices: Sequence[int] | None = None,
                      optimizer: str = "adagrad", time_limit_s: float = DEFAULT_TIME_LIMIT_S, seed: int = 0,
                      allow_host: bool = True) -> Plan:
    """A copy of ``plan`` with the tables sharded, ``breakdown["embedding_s"]`` set, the iteration time and
    throughput including the embedding time, and ``search.embedding_lower_bound_s`` filled."""
    # every device of the cluster serves embeddings (model-parallel), whatever the dense part uses
    use = list(devices) if devices is not None else None
    budget = _budget(cluster, memory_used_per_device, use)
    result = shard_tables(model_tables, cluster, use, global_batch, optimizer=optimizer, memory_budget_bytes=budget,
                          time_limit_s=time_limit_s, seed=seed, allow_host=allow_host)
    return with_embeddings(plan, result, memory_used_per_device)


def with_embeddings(plan: Plan, result: EmbeddingResult, memory_used_per_device: Mapping[int, float]) -> Plan:
    """``plan`` with ``result`` joined in (sequential on the critical path, see the module docstring)."""
    breakdown = dict(plan.breakdown)
    previous = float(breakdown.get("embedding_s", 0.0) or 0.0)
    breakdown["embedding_s"] = result.embedding_time_s
    iteration = plan.iteration_time_s - previous + result.embedding_time_s
    search = dataclasses.replace(
        plan.search,
        lower_bound_s=plan.search.lower_bound_s + result.lower_bound_s,
        embedding_lower_bound_s=result.lower_bound_s,
        proven_optimal=plan.search.proven_optimal and result.proven_optimal,
        time_s=plan.search.time_s + result.solve_time_s,
    )
    memory = max((float(memory_used_per_device.get(d, 0.0)) + m for d, m in result.per_device_memory_bytes.items()),
                 default=0.0)
    return dataclasses.replace(
        plan, embeddings=result.placements, breakdown=breakdown, iteration_time_s=iteration,
        throughput_samples_per_s=plan.global_batch / iteration if iteration > 0 else 0.0,
        search=search, memory_per_device_bytes=max(plan.memory_per_device_bytes, memory))


def _budget(cluster: Cluster, used: Mapping[int, float], devices: Sequence[int] | None) -> dict[int, float]:
    from planner.embeddings.devices import device_arrays

    dev = device_arrays(cluster, devices, None, True)
    return {d: float(dev.hbm_capacity_bytes[i]) - float(used.get(d, 0.0)) for i, d in enumerate(dev.ids)}


def attach(plan: Plan, model: LayerGraph, cluster: Cluster, tables=None, *,
           time_limit_s: float | None = None) -> Plan:
    """The search's hook (planner.search.api): shard ``tables`` (EmbeddingTables, a table-file path, or None
    for the model's own tables) on the plan's devices, with the memory each device's stage leaves free and
    the plan's optimizer (sgd, adam, adagrad or rowwise_adagrad). ``time_limit_s`` is the sharder's work
    budget (shard_tables); None gives the default, DEFAULT_TIME_LIMIT_S."""
    if tables is None:
        chosen = tuple(model.embedding_tables)
    elif isinstance(tables, (str, PathLike)):
        chosen = load_tables(tables)
    else:
        chosen = tuple(getattr(tables, "tables", tables))
    used: dict[int, float] = {}
    for stage in plan.stages:
        groups = stage.replicas or (stage,)
        for group in groups:
            for device in group.devices:
                used[device] = max(used.get(device, 0.0), float(group.memory_bytes_per_device))
    optimizer = table_optimizer(plan.optimizer)
    return attach_embeddings(plan, chosen, cluster, plan.global_batch, used, optimizer=optimizer,
                             time_limit_s=DEFAULT_TIME_LIMIT_S if time_limit_s is None else time_limit_s)
