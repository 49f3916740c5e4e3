"""Independent checks of an embedding result, used by every embedding test: memory recomputed from the
shards (rows x cols x dtype bytes x optimizer factor) and the shards tiling each table exactly."""

from __future__ import annotations

from planner.types import Cluster, EmbeddingTable

# optimizer-state elements per weight element (row-wise Adagrad: one per row)
STATE = {"sgd": lambda cols: 0.0, "adam": lambda cols: 2.0, "adagrad": lambda cols: 1.0,
         "rowwise_adagrad": lambda cols: 1.0 / cols}


def capacities(cluster: Cluster) -> dict[int, float]:
    out = {}
    for group in cluster.groups:
        for d in range(group.first_device, group.first_device + group.num_devices):
            out[d] = float(group.node.device.memory_bytes)
    return out


def recomputed_memory(result, tables: dict[str, EmbeddingTable], optimizer: str) -> dict[int, float]:
    used: dict[int, float] = {}
    for placement in result.placements:
        table = tables[placement.table]
        for shard in placement.shards:
            if shard.memory != "hbm":
                continue
            rows, cols = shard.rows[1] - shard.rows[0], shard.cols[1] - shard.cols[0]
            factor = 1.0 + STATE[optimizer](cols) + (1.0 if placement.sharding == "data_parallel" else 0.0)
            used[shard.device] = used.get(shard.device, 0.0) + rows * cols * table.dtype_bytes * factor
    return used


def check_result(result, tables, cluster: Cluster, optimizer: str = "adagrad",
                 budget: dict[int, float] | None = None) -> None:
    """Memory within capacity on every device, shards tile every table, the bound is below the answer."""
    by_name = {t.name: t for t in tables}
    capacity = budget if budget is not None else capacities(cluster)
    used = recomputed_memory(result, by_name, optimizer)
    for device, bytes_used in used.items():
        assert bytes_used <= capacity[device] * (1 + 1e-9), (device, bytes_used, capacity[device])
        assert bytes_used == __import__("pytest").approx(result.per_device_memory_bytes[device], rel=1e-9)
    assert {p.table for p in result.placements} == set(by_name)
    for placement in result.placements:
        table = by_name[placement.table]
        cells = sum((s.rows[1] - s.rows[0]) * (s.cols[1] - s.cols[0]) for s in placement.shards)
        copies = len(placement.shards) if placement.sharding == "data_parallel" else 1
        assert cells == table.rows * table.dim * copies, placement
        for s in placement.shards:
            assert 0 <= s.rows[0] < s.rows[1] <= table.rows and 0 <= s.cols[0] < s.cols[1] <= table.dim
    assert result.lower_bound_s <= result.embedding_time_s * (1 + 1e-9)
    assert result.gap >= 0
    assert max(result.per_device_time_s.values()) == __import__("pytest").approx(result.embedding_time_s)


def check_plan_memory(problem, assignment) -> None:
    """An internal plan (Problem, assignment) within every device's memory, recomputed here from its shards (rows x
    cols x dtype bytes x optimizer factor), not from the planner's own loads."""
    from types import SimpleNamespace

    from planner.embeddings.shard import placements

    placed = SimpleNamespace(placements=placements(problem, assignment))  # what recomputed_memory reads
    used = recomputed_memory(placed, {t.name: t for t in problem.tables}, problem.optimizer)
    capacity = {int(d): float(problem.dev.hbm_capacity_bytes[i]) for i, d in enumerate(problem.dev.ids)}
    for device, bytes_used in used.items():
        assert bytes_used <= capacity[device] * (1 + 1e-9), (device, bytes_used, capacity[device])
