"""Sparse embedding tables in the estimate of one configuration, composed as in a plan.

A model's embedding tables are *sparse* when they are placed model-parallel by planner.embeddings rather than
replicated in the dense pipeline: a DLRM's tables, tables outside every pipeline layer, or the tables of a
table file (``--tables``). ``estimate`` then times the dense part (the model without those tables'
parameters) with the given configuration, shards the tables over the devices that configuration uses with the
memory each has left, and adds the embedding time on the critical path, as ``planner.embeddings.attach`` does
for a plan (``iteration = dense iteration + embedding_s``; see its module docstring). The search
(planner.search.api) decides which tables are sparse with the same two functions.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Sequence

from planner.cost.estimator import Calibrations
from planner.cost.estimator import estimate as dense_estimate
from planner.errors import InfeasibleError
from planner.types import Cluster, EmbeddingTable, Estimate, LayerGraph, ParallelConfig


def tables_are_sparse(model: LayerGraph) -> bool:
    """Whether the model's own tables are sparse (placed model-parallel) rather than a pipeline layer's."""
    return bool(model.embedding_tables) and (
        model.family == "dlrm" or not any(layer.kind == "embedding" for layer in model.layers))


def sparse_tables(model: LayerGraph, tables: Any = None) -> tuple[EmbeddingTable, ...]:
    """The sparse embedding tables to place model-parallel: those of ``tables`` (a table file or
    EmbeddingTables) or, for a DLRM or a model whose tables sit outside its pipeline layers, the model's own.
    A dense model's token embedding is an ``embedding`` layer of the pipeline and is planned with it."""
    if tables:
        from planner.embeddings import load_tables  # noqa: PLC0415 - only models with tables need it
        return tuple(load_tables(tables)) if isinstance(tables, (str, os.PathLike)) else tuple(tables)
    return tuple(model.embedding_tables) if tables_are_sparse(model) else ()


def estimate(model: LayerGraph, cluster: Cluster, config: ParallelConfig, calibration: Calibrations | None = None,
             *, tables: Any = None) -> Estimate:
    """Predict one configuration (see planner.cost.estimator.estimate); sparse embedding tables (the model's,
    or ``tables``: a table file or EmbeddingTables) are sharded model-parallel and their time added."""
    sparse = sparse_tables(model, tables)
    if not sparse:
        return dense_estimate(model, cluster, config, calibration)
    dense_model = model
    if tables_are_sparse(model):
        from planner.embeddings.dense import dense_part  # noqa: PLC0415
        dense_model = dense_part(model, model.embedding_tables)
    dense = dense_estimate(dense_model, cluster, config, calibration)
    return _with_tables(dense, sparse, cluster, config.global_batch)


def _with_tables(dense: Estimate, sparse: Sequence[EmbeddingTable], cluster: Cluster, global_batch: int) -> Estimate:
    from planner.embeddings import shard_tables  # noqa: PLC0415
    from planner.embeddings.shard import DEFAULT_TIME_LIMIT_S  # noqa: PLC0415 - a plan's default budget, too
    from planner.embeddings.problem import table_optimizer  # noqa: PLC0415

    used: dict[int, float] = {}
    capacity: dict[int, float] = {}
    for stage in dense.stages:
        for replica in stage.replicas:
            for device in replica.devices:
                used[device] = max(used.get(device, 0.0), replica.memory.total_bytes)
                capacity[device] = replica.memory_capacity_bytes
    budget = {device: max(0.0, capacity[device] - used[device]) for device in used}
    optimizer = table_optimizer(dense.config.optimizer)
    try:
        result = shard_tables(sparse, cluster, sorted(used), global_batch, optimizer=optimizer,
                              memory_budget_bytes=budget, time_limit_s=DEFAULT_TIME_LIMIT_S)
    except InfeasibleError as exc:  # reported as the estimate's verdict, like a stage that does not fit
        return dataclasses.replace(dense, feasible=False, reason=dense.reason or f"embedding tables: {exc}")
    iteration = dense.iteration_time_s + result.embedding_time_s
    memory = max((used.get(d, 0.0) + m for d, m in result.per_device_memory_bytes.items()), default=0.0)
    note = (f"{len(sparse)} embedding tables sharded model-parallel over the {len(used)} devices "
            f"({result.method}, {result.embedding_time_s * 1e3:.3g} ms, lower bound "
            f"{result.lower_bound_s * 1e3:.3g} ms)")
    return dataclasses.replace(
        dense, iteration_time_s=iteration, throughput_samples_per_s=global_batch / iteration if iteration > 0 else 0.0,
        memory_per_device_bytes=max(dense.memory_per_device_bytes, memory),
        breakdown=dataclasses.replace(dense.breakdown, embedding_s=result.embedding_time_s),
        embeddings=result.placements, notes=(*dense.notes, note))
