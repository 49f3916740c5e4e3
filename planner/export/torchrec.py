"""A Plan's embedding placement as a TorchRec-style sharding plan.

Names follow TorchRec's ``torchrec/distributed/types.py`` (``ShardingType`` values, ``ParameterSharding``
fields ``sharding_type``, ``compute_kernel``, ``ranks``, ``sharding_spec``), its
``torchrec/distributed/embedding_types.py`` (``EmbeddingComputeKernel`` values ``dense``, the one kernel of a
data-parallel table, ``fused``, ``fused_uvm``, ``fused_uvm_caching``) and PyTorch's ``ShardMetadata``
(``shard_offsets``, ``shard_sizes``, ``placement`` written ``rank:R/cuda:L``).

The document is ``{"world_size": N, "rank_devices": [...], "plan": {table: ParameterSharding fields}}``:

* ranks are process ranks 0..N-1 of the training job, one per device the plan uses, numbered in ascending
  device id; ``rank_devices[r]`` is the cluster's device id that rank ``r`` runs on (launch rank ``r`` on that
  device), and ``cuda:L`` in a placement is that device's CUDA index on its node;
* a data-parallel table lists every rank (TorchRec replicates it on all of them: sharding_plan.py,
  ``data_parallel_sharding``);
* a row-wise table has one shard per rank, a table-row-wise table one per rank of its node, in rank order,
  with TorchRec's row blocks (sharding_plan.py, ``_calculate_rw_shard_sizes_and_offsets``); ranks whose block
  is empty get an empty shard (size 0 rows at offset ``rows``), as TorchRec's own plans have, because its
  row-wise sharding reads the shard of rank ``r`` as ``shards[r]`` (sharding/rw_sharding.py,
  ``BaseRwEmbeddingSharding._shard``).

Tables are keyed by TorchRec's table name (:func:`torchrec_table_name`), the ``EmbeddingBagConfig.name`` of
the table: a table file's name as it is, the ONNX graph's weight name without its module path and
``.weight``.

So ``ParameterSharding(sharding_type=..., compute_kernel=..., ranks=..., sharding_spec=EnumerableShardingSpec(
[ShardMetadata(**s) for s in shards]))`` rebuilds each table's entry. The document's ``plan`` is flat, one
entry per table, while TorchRec's ``ShardingPlan`` is keyed by the embedding module's path and then by table
(torchrec/distributed/planner/planners.py ``to_sharding_plan``; torchrec/distributed/types.py ``ShardingPlan``):
the training script wraps it as ``ShardingPlan({module_fqn: EmbeddingModuleShardingPlan({table: ...})})``.
"""

from __future__ import annotations

import json
import logging
from importlib import import_module
from typing import Any, Sequence

from planner.errors import PlannerError, either
from planner.plans import EmbeddingPlacement, EmbeddingShard, Plan, cluster_group
from planner.embeddings.problem import block_split

_REMAKE = "re-create the plan with 'planner plan ... --out FILE'"


def _locate(plan: Plan, device: int) -> tuple[tuple[int, int], int]:
    """((group index, node index in the group), CUDA index on the node) of global device ``device``, from the
    plan's cluster groups."""
    group = cluster_group(plan, device)
    if group is not None:
        index = plan.cluster["groups"].index(group)
        start, per_node = group["first_device"], group["devices"] // group["count"]
        return (index, (device - start) // per_node), (device - start) % per_node
    raise PlannerError(f"plan: device {device} is in no group of the plan's cluster summary (cluster.groups); "
                       f"{_REMAKE}")


def local_device(plan: Plan, device: int) -> int:
    """The CUDA index on its node of global device ``device``, from the plan's cluster groups."""
    return _locate(plan, device)[1]


def rank_devices(plan: Plan) -> list[int]:
    """The job's devices in rank order: rank ``r`` runs on global device ``rank_devices(plan)[r]``.

    A TorchRec job is one process per device, and the same processes train the dense part (data-parallel
    under DistributedModelParallel) and look up the tables, so the job's devices are those of the plan's
    stages and replica groups together with those holding a table shard. A searched plan shards the tables
    over the dense part's devices (planner.compose.shard), so the two agree; devices the plan leaves idle are
    not in the job, and the ranks follow the device ids in ascending order, the order the sharder lays a
    row-wise table's blocks in (planner.embeddings.devices.DeviceArrays.ids)."""
    return sorted(plan.devices | {s.device for p in plan.embeddings for s in p.shards})


def torchrec_table_name(name: str) -> str:
    """TorchRec's name of the plan's table ``name``: the last dot-separated part, without a trailing
    ``.weight`` (``embed.cat_0.weight`` -> ``cat_0``; a table file's ``cat_0`` stays ``cat_0``).

    A table imported from an ONNX graph is named by its weight, the PyTorch parameter's path
    (``embed.cat_0.weight``). TorchRec keys a sharding plan by the table's ``EmbeddingBagConfig.name``, whose
    weight is ``<name>.weight`` (torchrec/distributed/sharding_plan.py, ``construct_module_sharding_plan``
    looks up ``f"{table_name}.weight"``); EmbeddingBagCollection registers each table as
    ``embedding_bags[config.name]`` (torchrec/modules/embedding_modules.py), an ``nn.ModuleDict`` key, which
    cannot hold a dot (torch/nn/modules/module.py, ``Module.add_module``). So the part after the last dot of
    the module path is the only name TorchRec can have given the table."""
    stem = name[:-len(".weight")] if name.endswith(".weight") else name
    return stem.rsplit(".", 1)[-1] or name


def _table_names(plan: Plan) -> list[str]:
    """:func:`torchrec_table_name` of each of the plan's tables, in order. Raises PlannerError when two tables
    get one name: TorchRec's EmbeddingBagCollection refuses a name twice."""
    names = [torchrec_table_name(p.table) for p in plan.embeddings]
    seen: dict[str, str] = {}
    for placement, name in zip(plan.embeddings, names):
        if name in seen:
            raise PlannerError(f"plan: tables {seen[name]!r} and {placement.table!r} are both TorchRec table "
                               f"{name!r}; re-create the plan with the tables named uniquely in a tables file "
                               "('planner plan ... --tables FILE')")
        seen[name] = placement.table
    return names


def _kernel(placement: EmbeddingPlacement) -> str:
    if placement.compute_kernel == "fused" and any(s.memory == "host" for s in placement.shards):
        return "fused_uvm"  # the table lives in host memory, read through unified virtual memory
    return placement.compute_kernel


def _row_blocks(placement: EmbeddingPlacement, shards: Sequence[EmbeddingShard], members: Sequence[int],
                rank: dict[int, int]) -> list[tuple[int, tuple[int, int], tuple[int, int]]]:
    """(rank, rows, cols) of every member rank of a row-wise (all ranks) or table-row-wise (a node's ranks)
    table in rank order: its shards, then an empty shard for each rank whose block is empty. Raises
    PlannerError when the shards are not TorchRec's blocks over ``members``: TorchRec would route the ids of
    one block to a rank holding other rows."""
    rows = max(s.rows[1] for s in shards)
    cols = (min(s.cols[0] for s in shards), max(s.cols[1] for s in shards))
    blocks = list(zip(members, block_split(rows, len(members))))
    given = [(rank[s.device], s.rows) for s in shards]
    if given != [(r, span) for r, span in blocks if span[1] > span[0]]:
        where = "of its node" if placement.sharding == "table_row_wise" else "of the job"
        raise PlannerError(f"plan: table {placement.table!r} is {placement.sharding}, but its shards are not "
                           f"TorchRec's row blocks ({blocks[0][1][1]} rows on each of the {len(members)} ranks "
                           f"{where} in rank order, what is left on the next); {_REMAKE}")
    return [(r, span, cols) for r, span in blocks]


def check_has_tables(count: int, what: str, formats: Sequence[str]) -> None:
    """A TorchRec sharding plan places embedding tables: refuse a plan (or a model, before its search) with
    ``count`` none, suggesting ``formats``, those that take it (the caller knows which)."""
    if not count:
        raise PlannerError(f"{what}: it has no embedding tables to shard (a token embedding is a pipeline layer, "
                           f"planned with the others), so there is no TorchRec sharding plan; use --format "
                           f"{either(formats)}")


# the framework formats beside TorchRec's; each writes a dense plan unless its exporter refuses it
FRAMEWORK_FORMATS = ("megatron", "deepspeed", "torchtitan")


def _formats_writing(plan: Plan) -> list[str]:
    """The formats that write ``plan``: table and json, which print any plan, and each framework format whose
    exporter does not refuse it. The exporters run with warnings held back (logging.disable, restored after):
    they would warn about options of an export that is not written, and only their refusal counts here."""
    formats = ["table", "json"]
    previous = logging.root.manager.disable
    logging.disable(logging.WARNING)
    try:
        for fmt in FRAMEWORK_FORMATS:
            try:
                getattr(import_module(f"planner.export.{fmt}"), f"render_{fmt}")(plan)
            except PlannerError:
                continue
            formats.append(fmt)
    finally:
        logging.disable(previous)
    return formats


def torchrec_plan(plan: Plan) -> dict[str, Any]:
    """``{"world_size": N, "rank_devices": [...], "plan": {table: ParameterSharding fields}}`` for the plan's
    embedding tables (see the module docstring)."""
    if not plan.embeddings:  # refused, naming the formats that do write the plan
        check_has_tables(0, "plan", _formats_writing(plan))
    devices = rank_devices(plan)
    rank = {device: r for r, device in enumerate(devices)}
    tables: dict[str, Any] = {}
    for placement, name in zip(plan.embeddings, _table_names(plan)):
        shards = sorted(placement.shards, key=lambda s: (s.rows[0], s.cols[0], rank[s.device]))
        spec = None
        if placement.sharding == "data_parallel":
            ranks = list(range(len(devices)))
        else:
            if placement.sharding == "row_wise":
                cells = _row_blocks(placement, shards, range(len(devices)), rank)
            elif placement.sharding == "table_row_wise":
                node = _locate(plan, shards[0].device)[0]
                members = [r for r, d in enumerate(devices) if _locate(plan, d)[0] == node]
                cells = _row_blocks(placement, shards, members, rank)
            else:
                cells = [(rank[s.device], s.rows, s.cols) for s in shards]
            ranks = [r for r, _, _ in cells]
            spec = [{"shard_offsets": [rows[0], cols[0]], "shard_sizes": [rows[1] - rows[0], cols[1] - cols[0]],
                     "placement": f"rank:{r}/cuda:{local_device(plan, devices[r])}"} for r, rows, cols in cells]
        tables[name] = {"sharding_type": placement.sharding, "compute_kernel": _kernel(placement),
                        "ranks": ranks, "sharding_spec": spec}
    return {"world_size": len(devices), "rank_devices": devices, "plan": tables}


def render_torchrec(plan: Plan) -> str:
    return json.dumps(torchrec_plan(plan), indent=2, sort_keys=True) + "\n"
