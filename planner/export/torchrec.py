"""A Plan's embedding placement as a TorchRec-style sharding plan.

Names follow TorchRec's ``torchrec/distributed/types.py`` (``ShardingType`` values, ``ParameterSharding``
fields ``sharding_type``, ``compute_kernel``, ``ranks``, ``sharding_spec``), its
``torchrec/distributed/embedding_types.py`` (``EmbeddingComputeKernel`` values ``dense``, the one kernel of a
data-parallel table, ``fused``, ``fused_uvm``, ``fused_uvm_caching``) and PyTorch's ``ShardMetadata``
(``shard_offsets``, ``shard_sizes``, ``placement`` written ``rank:R/cuda:L``). The document maps each table name to its ``ParameterSharding`` fields, so
``ParameterSharding(sharding_type=..., compute_kernel=..., ranks=..., sharding_spec=EnumerableShardingSpec(
[ShardMetadata(**s) for s in shards]))`` rebuilds it.
"""

from __future__ import annotations

import json
from typing import Any

from planner.errors import PlannerError
from planner.plans import EmbeddingPlacement, Plan


def local_device(plan: Plan, device: int) -> int:
    """The CUDA index on its node of global device ``device``, from the plan's cluster groups."""
    for group in plan.cluster.get("groups", ()):
        start, total = group["first_device"], group["devices"]
        if start <= device < start + total:
            return (device - start) % (total // group["count"])
    raise PlannerError(f"plan: device {device} is in no group of the plan's cluster summary (cluster.groups); "
                       "re-create the plan with 'planner plan ... --out FILE'")


def _kernel(placement: EmbeddingPlacement) -> str:
    if placement.compute_kernel == "fused" and any(s.memory == "host" for s in placement.shards):
        return "fused_uvm"  # the table lives in host memory, read through unified virtual memory
    return placement.compute_kernel


def torchrec_plan(plan: Plan) -> dict[str, Any]:
    """``{"world_size": N, "plan": {table: ParameterSharding fields}}`` for the plan's embedding tables."""
    if not plan.embeddings:
        raise PlannerError("plan: the plan has no embedding tables, so there is no TorchRec sharding plan; "
                           "use --format table, json, megatron or deepspeed")
    tables: dict[str, Any] = {}
    for placement in plan.embeddings:
        shards = sorted(placement.shards, key=lambda s: (s.rows[0], s.cols[0], s.device))
        ranks = [s.device for s in shards]
        spec = None
        if placement.sharding != "data_parallel":
            spec = [{"shard_offsets": [s.rows[0], s.cols[0]],
                     "shard_sizes": [s.rows[1] - s.rows[0], s.cols[1] - s.cols[0]],
                     "placement": f"rank:{s.device}/cuda:{local_device(plan, s.device)}"} for s in shards]
        tables[placement.table] = {"sharding_type": placement.sharding, "compute_kernel": _kernel(placement),
                                   "ranks": ranks, "sharding_spec": spec}
    return {"world_size": int(plan.cluster.get("num_devices", 0)), "plan": tables}


def render_torchrec(plan: Plan) -> str:
    return json.dumps(torchrec_plan(plan), indent=2, sort_keys=True) + "\n"
