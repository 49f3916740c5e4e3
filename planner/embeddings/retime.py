"""A given table placement (a Plan's ``embeddings``) timed by the sharder's cost model, as the search would
have timed it: what the same placement takes on another profile of the devices or the network.

Each placement is matched to the option of the sharding problem that writes it (``shard.placements`` is the
inverse): its sharding kind (TorchRec's table_column_wise is a column-wise option whose shards share a node),
its memory (HBM or host) and, for per-device shards, the devices of its units; node-scoped shards name their
node, global ones none.
"""

from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np

from planner.embeddings.devices import device_arrays
from planner.embeddings.problem import Option, Problem, block_sizes, build_problem
from planner.embeddings.shard import EmbeddingResult
from planner.errors import ConfigError
from planner.plans import EmbeddingPlacement, EmbeddingShard
from planner.types import Cluster, EmbeddingTable


def retime_placements(tables: Sequence[EmbeddingTable], cluster: Cluster, devices: Sequence[int],
                      global_batch: int, placements: Sequence[EmbeddingPlacement], *, optimizer: str,
                      memory_budget_bytes: Mapping[int, float] | None = None) -> EmbeddingResult:
    """The time and memory of ``placements`` of ``tables`` over ``devices`` (the participating devices, as
    :func:`planner.embeddings.shard_tables` takes them). Raises ConfigError when a table has no placement, a
    placement names a device outside ``devices`` or no option writes it; a placement that does not fit in
    memory is timed as infinite (the caller reports it infeasible)."""
    dev = device_arrays(cluster, devices, memory_budget_bytes)
    problem = build_problem(tables, dev, global_batch, optimizer)
    by_name = {p.table: p for p in placements}
    index = {d: i for i, d in enumerate(dev.ids)}
    assignment = []
    for t, table in enumerate(tables):
        placement = by_name.get(table.name)
        if placement is None:
            raise ConfigError(f"embeddings: table {table.name!r} has no placement in the plan; give the tables the "
                              "plan was made for")
        assignment.append(_match(problem, t, placement, index))
    loads = problem.evaluate(assignment)
    times = problem.device_time_s(loads)
    fits = problem.fits(loads)
    slowest = float(times.max()) if fits else float("inf")
    return EmbeddingResult(
        placements=tuple(by_name[t.name] for t in tables), embedding_time_s=slowest, lower_bound_s=0.0,
        per_device_time_s={d: float(times[i]) for i, d in enumerate(dev.ids)},
        per_device_memory_bytes={d: float(loads.hbm_bytes[i]) for i, d in enumerate(dev.ids)},
        proven_optimal=False, method="given", gap=0.0,
        per_device_host_memory_bytes={d: float(loads.host_bytes[i]) for i, d in enumerate(dev.ids)},
        optimizer=optimizer)


def _match(problem: Problem, t: int, placement: EmbeddingPlacement, index: Mapping[int, int]
           ) -> tuple[int, tuple[int, ...]]:
    """(option index, unit positions) of table ``t`` that ``placement`` writes (``index``: global device id ->
    position among the participating devices)."""
    outside = sorted({s.device for s in placement.shards} - index.keys())
    if outside:
        raise ConfigError(f"embeddings: table {placement.table!r} has shards on devices {outside[:4]} that are not "
                          "among the plan's devices on this cluster; give the cluster the plan was made for")
    host = any(s.memory == "host" for s in placement.shards)
    sharding = "column_wise" if placement.sharding == "table_column_wise" else placement.sharding
    for o, option in enumerate(problem.options[t]):
        if option.sharding != sharding or option.host != host:
            continue
        positions = _positions(problem, option, placement, index)
        if positions is not None:
            return o, positions
    raise ConfigError(f"embeddings: table {placement.table!r}: no {placement.sharding} sharding "
                      f"({'host' if host else 'HBM'}) of {len(placement.shards)} shards exists on this cluster; give "
                      "the cluster the plan was made for")


def _positions(problem: Problem, option: Option, placement: EmbeddingPlacement, index: Mapping[int, int]
               ) -> tuple[int, ...] | None:
    """The positions of ``option``'s units that give ``placement``'s shards, or None when it cannot."""
    dev = problem.dev
    shards = placement.shards
    if option.scope == "device":
        return tuple(index[s.device] for s in shards) if len(shards) == option.units else None
    rows = problem.tables[option.table].rows
    if option.scope == "node":
        nodes = {int(dev.node_of[index[s.device]]) for s in shards}
        if len(nodes) != 1:
            return None
        node = nodes.pop()
        return (node,) if node in problem.node_positions and _holds_rows(shards, rows, len(dev.nodes[node])) \
            else None
    if option.sharding == "data_parallel":  # a replica on every participating device
        return (0,) if len(shards) == dev.count and {s.device for s in shards} == index.keys() else None
    return (0,) if _holds_rows(shards, rows, dev.count) else None


def _holds_rows(shards: Sequence[EmbeddingShard], rows: int, members: int) -> bool:
    """Whether ``shards`` (on distinct devices) are as many as the ranks that hold rows when ``rows`` rows are
    split row-wise over ``members`` ranks: shard.placements leaves out the ranks whose block is empty."""
    held = int(np.count_nonzero(block_sizes(rows, members)))
    return len(shards) == held and len({s.device for s in shards}) == held
