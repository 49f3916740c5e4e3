"""The seam between a model's dense part and its sparse embedding tables: the one module that knows both.

A model's embedding tables are *sparse* when planner.embeddings places them model-parallel rather than the
dense pipeline replicating them: a DLRM's tables, tables outside every pipeline layer, or the tables of a
table file (``tables=``, ``--tables``). A dense model's token embedding is an ``embedding`` layer of the
pipeline and is planned with it. The estimate and the plan of a model with sparse tables are made alike:

1. the dense part (:func:`dense_part`: the model without the tables' parameters) is estimated by
   planner.cost or planned by planner.search;
2. the tables are sharded by planner.embeddings (:func:`shard`, the one sharder call) over the devices of
   the dense configuration (the job's devices: a device the dense part leaves idle is not in the job), each
   with the memory the dense part leaves it (:func:`tables_memory_budget_bytes`), for the dense
   configuration's optimizer and global batch;
3. the two are joined (:func:`join`). The embedding forward (ids all-to-all, lookups, pooled-output
   all-to-all) runs before the interaction layer and the embedding backward (gradient all-to-all, fused
   lookup backward + optimizer update) after the dense backward, so the embedding time sits on the critical
   path in sequence with the dense time: ``iteration = dense iteration + embedding_s``. Overlap of the
   embedding all-to-all with the bottom MLP (as TorchRec's train pipeline does) would only shorten this, so
   the time is conservative, and a plan's lower bound (dense bound + the embedding bound) is a bound on this
   sequential model. Memory per device is the dense part's plus the tables' shards on it.

``planner.estimate`` is :func:`estimate`; ``planner.plan`` and ``planner.search.search`` come here through
:func:`search`. planner.cost and planner.search see only dense models.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

from planner import arguments
from planner.cost.calibration import DeviceCalibration
from planner.cost.estimator import Calibrations, estimate_pipeline
from planner.cost.estimator import estimate as estimate_dense
from planner.errors import ConfigError, InfeasibleError
from planner.plans import Plan, check_fits_model, pipeline_spec
from planner.solver import SolverOptions
from planner.types import Batching, Cluster, EmbeddingTable, Estimate, LayerGraph, ParallelConfig

log = logging.getLogger(__name__)

_MODEL_FIX = "give the LayerGraph of planner.load_model('MODEL.onnx')"
_CLUSTER_FIX = "give the Cluster of planner.load_cluster('dgx-a100-80gb*2') or of a cluster file"
_CALIBRATION_FIX = ("give a mapping of device name to planner.cost.calibration.DeviceCalibration, e.g. "
                    "{'h100-sxm': DeviceCalibration(gemm_scale=0.9)}, or None")


def check_inputs(model: Any, cluster: Any, options: Any, calibration: Any = None) -> None:
    """Raise ConfigError unless the Python API got a model, a cluster and (or None) solver options and
    calibrations."""
    arguments.instance(model, LayerGraph, "model", _MODEL_FIX)
    arguments.instance(cluster, Cluster, "cluster", _CLUSTER_FIX)
    arguments.optional(options, SolverOptions, "options", arguments.SOLVER_OPTIONS_FIX)
    arguments.optional(calibration, Mapping, "calibration", _CALIBRATION_FIX)
    for device, factors in (calibration or {}).items():
        arguments.instance(device, str, f"calibration key {device!r}", _CALIBRATION_FIX)
        arguments.instance(factors, DeviceCalibration, f"calibration[{device!r}]", _CALIBRATION_FIX)

if TYPE_CHECKING:  # the search and the sharder are imported on first use (see search and shard)
    from planner.embeddings import EmbeddingResult
    from planner.search.api import SearchResult
    from planner.search.backend import Backend


def tables_are_sparse(model: LayerGraph) -> bool:
    """Whether the model's own tables are sparse (placed model-parallel) rather than a pipeline layer's."""
    return bool(model.embedding_tables) and (
        model.family == "dlrm" or not any(layer.kind == "embedding" for layer in model.layers))


def sparse_tables(model: LayerGraph, tables: Any = None) -> tuple[EmbeddingTable, ...]:
    """The sparse tables to place model-parallel: those of ``tables`` (a table file or EmbeddingTables) or,
    for a DLRM or a model whose tables sit outside its pipeline layers, the model's own."""
    if tables is not None:
        from planner.embeddings.tables import given_tables  # noqa: PLC0415 - only models with tables need it
        given = given_tables(tables)
        if given:
            own = tuple(t.name for t in model.embedding_tables) if tables_are_sparse(model) else ()
            # a file names a table as its feature ("cat_0"), the graph as its weight ("embed.cat_0.weight")
            parts = {part for name in own for part in (name, *name.split("."))}
            if not parts & {t.name for t in given}:
                _warn_foreign_tables(model.name, own, tuple(t.name for t in given))
            return given
    return tuple(model.embedding_tables) if tables_are_sparse(model) else ()


@functools.lru_cache(maxsize=64)
def _warn_foreign_tables(model: str, own: tuple[str, ...], given: tuple[str, ...]) -> None:
    """Say once per process (a what-if sweep places the tables at every point) that the given tables share no
    name with the model's sparse tables: they stand in for its tables, or are added to a model that has none."""
    def names(values: tuple[str, ...]) -> str:
        return ", ".join(values[:3]) + (f" and {len(values) - 3} more" if len(values) > 3 else "")

    if own:
        log.warning("the %d given tables (%s) share no name with model %r's %d embedding tables (%s): they are "
                    "placed in their stead; check the tables file and its workload", len(given), names(given), model,
                    len(own), names(own))
    else:
        log.warning("model %r has no sparse embedding tables; the %d given tables (%s) are placed beside its layers "
                    "as sparse tables", model, len(given), names(given))


def dense_part(model: LayerGraph) -> LayerGraph:
    """``model`` as the dense pipeline sees it. When its own tables are sparse, their parameters leave the
    ``embedding`` layers that hold them (first layer first; the importer's ``embedding`` layer carries them),
    so the dense stages neither hold nor sync them again, and the tables leave ``embedding_tables``; every
    other number of the graph is kept."""
    if not tables_are_sparse(model):
        return model
    remaining = sum(t.rows * t.dim for t in model.embedding_tables)
    layers = []
    for layer in model.layers:
        if layer.kind == "embedding" and remaining > 0:
            take = min(layer.params, remaining)
            remaining -= take
            layer = dataclasses.replace(layer, params=layer.params - take)
        layers.append(layer)
    return dataclasses.replace(model, layers=tuple(layers), embedding_tables=())


def dense_memory_bytes(dense: Estimate) -> dict[int, float]:
    """The bytes the dense part takes on each device it uses (the largest, should a device serve twice)."""
    used: dict[int, float] = {}
    for stage in dense.stages:
        for replica in stage.replicas:
            for device in replica.devices:
                used[device] = max(used.get(device, 0.0), float(replica.memory.total_bytes))
    return used


def tables_memory_budget_bytes(dense: Estimate) -> dict[int, float]:
    """The memory each device of the dense configuration has left for the tables (never below 0)."""
    used = dense_memory_bytes(dense)
    return {device: max(0.0, float(replica.memory_capacity_bytes) - used[device])
            for stage in dense.stages for replica in stage.replicas for device in replica.devices}


def shard(tables: Sequence[EmbeddingTable], cluster: Cluster, dense: Estimate,
          options: SolverOptions | None = None) -> EmbeddingResult:
    """The tables sharded for the dense configuration ``dense``: over its devices, in the memory
    :func:`tables_memory_budget_bytes` leaves them, for its optimizer and its batching. ``options`` is the
    sharder's work and seed (planner.solver.SolverOptions; None: the default). Raises InfeasibleError when no
    placement fits."""
    from planner.embeddings import shard_tables  # noqa: PLC0415 - only models with tables

    devices, batch, optimizer, memory = _sharding_inputs(dense)
    return shard_tables(tables, cluster, devices, batch, optimizer=optimizer, memory_budget_bytes=memory,
                        options=options or SolverOptions())


def _sharding_inputs(dense: Estimate) -> tuple[list[int], int, str, dict[int, float]]:
    """What the tables are sharded for beside ``dense``: its devices, its global batch, the tables' optimizer
    for its optimizer, and each device's memory left to them (device order)."""
    from planner.embeddings import table_optimizer  # noqa: PLC0415 - only models with tables

    budget = tables_memory_budget_bytes(dense)
    devices = sorted(budget)
    return (devices, Batching.of(dense.config).global_batch, table_optimizer(dense.config.optimizer),
            {d: budget[d] for d in devices})


@dataclass(frozen=True)
class Joined:
    """The dense part and the tables as one iteration (see the module docstring)."""

    iteration_time_s: float
    throughput_samples_per_s: float
    memory_per_device_bytes: float  # the largest over devices
    embedding_s: float


def join(dense: Estimate, tables: EmbeddingResult) -> Joined:
    """The iteration of ``dense`` with the sharded ``tables`` on its critical path."""
    iteration = dense.iteration_time_s + tables.embedding_time_s
    used = dense_memory_bytes(dense)
    memory = max((used.get(d, 0.0) + m for d, m in tables.per_device_memory_bytes.items()), default=0.0)
    global_batch = Batching.of(dense.config).global_batch
    return Joined(iteration_time_s=iteration,
                  throughput_samples_per_s=global_batch / iteration if iteration > 0 else 0.0,
                  memory_per_device_bytes=max(dense.memory_per_device_bytes, memory),
                  embedding_s=tables.embedding_time_s)


def estimate(model: LayerGraph, cluster: Cluster, config: ParallelConfig, calibration: Calibrations | None = None,
             *, tables: Any = None, options: SolverOptions | None = None) -> Estimate:
    """Predict one configuration (planner.cost.estimator.estimate); sparse tables (the model's, or ``tables``:
    a table file or EmbeddingTables) are sharded as a plan shards them (``options``: the sharder's work and seed)
    and their time joined. Tables that fit nowhere make the estimate infeasible, with the sharder's reason, as a
    stage that does not fit does."""
    check_inputs(model, cluster, options, calibration)
    arguments.instance(config, ParallelConfig, "config", "give planner.ParallelConfig(global_batch=..., tp=, pp=, dp=)")
    sparse = sparse_tables(model, tables)
    if not sparse:
        return estimate_dense(model, cluster, config, calibration)
    dense = estimate_dense(dense_part(model), cluster, config, calibration)
    try:
        result = shard(sparse, cluster, dense, options)
    except InfeasibleError as exc:
        return dataclasses.replace(dense, feasible=False, reason=dense.reason or f"embedding tables: {exc}")
    return _with_tables(dense, result, f"{len(sparse)} embedding tables sharded model-parallel over the "
                                       f"{len(result.per_device_memory_bytes)} devices ({result.method}, "
                                       f"{result.embedding_time_s * 1e3:.3g} ms, lower bound "
                                       f"{result.lower_bound_s * 1e3:.3g} ms)")


def _with_tables(dense: Estimate, tables: EmbeddingResult, note: str) -> Estimate:
    """The estimate of ``dense`` with the ``tables`` joined in (:func:`join`), their placement and ``note``."""
    joined = join(dense, tables)
    return dataclasses.replace(
        dense, iteration_time_s=joined.iteration_time_s, throughput_samples_per_s=joined.throughput_samples_per_s,
        memory_per_device_bytes=joined.memory_per_device_bytes,
        breakdown=dataclasses.replace(dense.breakdown, embedding_s=joined.embedding_s),
        embeddings=tables.placements, notes=(*dense.notes, note))


def estimate_plan(model: LayerGraph, cluster: Cluster, plan: Plan, calibration: Calibrations | None = None,
                  *, tables: Any = None) -> Estimate:
    """Re-time ``plan``'s own placement (its stages' layers, devices, replica groups and batch shares, its
    degrees, schedule, ZeRO stage, recompute, dtype and runtime; :func:`planner.plans.pipeline_spec`) on
    ``cluster``, which numbers its devices as the plan's did: what the same plan takes on another profile of
    the devices or the network. Sparse tables (the model's, or ``tables`` as :func:`estimate` takes them) keep
    the plan's placement (:func:`planner.embeddings.retime.retime_placements`), in the memory the dense part
    leaves; a placement that no longer fits makes the estimate infeasible."""
    check_inputs(model, cluster, None, calibration)
    arguments.instance(plan, Plan, "plan", "give a planner.plans.Plan, e.g. planner.plans.load_plan('PLAN.json')")
    sparse = sparse_tables(model, tables)
    if bool(sparse) != bool(plan.embeddings):
        raise ConfigError("plan: it places embedding tables and the model has none (give the tables it was made "
                          "for: --tables FILE)" if plan.embeddings else "plan: the model has embedding tables and "
                          "the plan places none; give the plan made for these tables")
    check_fits_model(plan, model.params, dense_part(model) if sparse else model)
    highest = max(plan.devices, default=-1)
    if highest >= cluster.num_devices:
        raise ConfigError(f"plan: it uses device {highest}, the cluster has {cluster.num_devices} devices "
                          f"(0..{cluster.num_devices - 1}); give a cluster with the plan's device numbering")
    if not sparse:
        return estimate_pipeline(model, cluster, pipeline_spec(plan), calibration)
    from planner.embeddings import table_optimizer  # noqa: PLC0415 - only models with tables
    from planner.embeddings.retime import retime_placements  # noqa: PLC0415

    dense = estimate_pipeline(dense_part(model), cluster, pipeline_spec(plan), calibration)
    budget = tables_memory_budget_bytes(dense)
    result = retime_placements(sparse, cluster, sorted(budget), plan.global_batch, plan.embeddings,
                               optimizer=table_optimizer(plan.optimizer), memory_budget_bytes=budget)
    if not math.isfinite(result.embedding_time_s):
        return dataclasses.replace(dense, feasible=False, reason=dense.reason or "embedding tables: the plan's "
                                   "placement does not fit in the memory the dense part leaves on this cluster")
    return _with_tables(dense, result, f"{len(sparse)} embedding tables at the plan's placement "
                                       f"({result.embedding_time_s * 1e3:.3g} ms)")


def with_tables(plan: Plan, dense: Estimate, tables: EmbeddingResult) -> Plan:
    """``plan`` (the dense part's, timed by ``dense``) with the sharded ``tables`` joined in: their placement,
    ``breakdown["embedding_s"]``, the joined iteration, throughput and memory, and the search's bounds."""
    joined = join(dense, tables)
    search = dataclasses.replace(
        plan.search, lower_bound_s=plan.search.lower_bound_s + tables.lower_bound_s,
        embedding_lower_bound_s=tables.lower_bound_s,
        proven_optimal=plan.search.proven_optimal and tables.proven_optimal,
        time_s=plan.search.time_s + tables.solve_time_s)
    return dataclasses.replace(
        plan, embeddings=tables.placements,
        breakdown={**plan.breakdown, "embedding_s": joined.embedding_s},
        iteration_time_s=joined.iteration_time_s, throughput_samples_per_s=joined.throughput_samples_per_s,
        search=search, memory_per_device_bytes=joined.memory_per_device_bytes)


def search(model: LayerGraph, cluster: Cluster, global_batch: int, *, pinned: ParallelConfig | None = None,
           top_k: int = 1, time_limit_s: float | None = None, tables: Any = None,
           backend: Backend | None = None, progress: Callable[[float], None] | None = None,
           budget: int | None = None, options: SolverOptions | None = None, uniform: bool = False) -> SearchResult:
    """planner.search.search (see there): the dense part is searched by planner.search (``time_limit_s``, its
    wall-clock limit, and ``budget``, its work units, are the dense search's); each of its plans gets the sparse
    tables sharded and joined before its bottleneck sentence is written. ``options`` (None: the default) goes to
    both: its work to the dense search and the sharder, its seed to the sharder."""
    from planner.search.api import search_dense  # noqa: PLC0415 - planner.search.search calls this module

    check_inputs(model, cluster, options)
    sparse = sparse_tables(model, tables)
    if not sparse:
        return search_dense(model, cluster, global_batch, pinned=pinned, top_k=top_k, time_limit_s=time_limit_s,
                            backend=backend, progress=progress, budget=budget, options=options, uniform=uniform)
    from planner.embeddings import check_capacity, table_optimizer  # noqa: PLC0415 - only models with tables

    # tables too large for the whole cluster fail here, with the sharder's reason, before any search
    check_capacity(sparse, cluster, None, global_batch,
                   optimizer=table_optimizer(pinned.optimizer if pinned is not None else ParallelConfig.optimizer))
    admitted: dict[tuple, bool] = {}

    def admit(dense: Estimate) -> bool:
        """Whether the tables may fit the memory ``dense`` leaves on its devices (a quick capacity test, once
        per device budget and optimizer): the search passes over dense plans on too few devices for them."""
        devices, batch, optimizer, memory = _sharding_inputs(dense)
        key = (tuple(memory.items()), optimizer)
        if key not in admitted:
            try:
                check_capacity(sparse, cluster, devices, batch, optimizer=optimizer, memory_budget_bytes=memory)
                admitted[key] = True
            except InfeasibleError:
                admitted[key] = False
        return admitted[key]

    def finish(plan: Plan, dense: Estimate) -> Plan:
        whole = dataclasses.replace(plan, model={**plan.model, "params": model.params})  # tables counted
        return with_tables(whole, dense, shard(sparse, cluster, dense, options))

    try:
        return search_dense(dense_part(model), cluster, global_batch, pinned=pinned, top_k=top_k,
                            time_limit_s=time_limit_s, backend=backend, progress=progress, budget=budget,
                            finish=finish, admit=admit, options=options, uniform=uniform)
    except InfeasibleError as exc:
        if all(admitted.values()):
            raise  # no dense plan fits, or the sharder found no placement: their reason
        raise InfeasibleError(
            f"no plan of the dense part of {model.name!r} leaves the {len(sparse)} embedding "
            f"table{'' if len(sparse) == 1 else 's'} enough memory "
            f"on the {cluster.num_devices} devices of {cluster.name or 'the cluster'} at global batch "
            f"{global_batch}; add devices, train with SGD (--optimizer sgd: no optimizer state for the tables) "
            "or unpin --tp, --pp, --dp so the search may spread the dense part further") from exc
