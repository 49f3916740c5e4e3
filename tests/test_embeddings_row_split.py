"""Row-wise and table-row-wise tables are split into TorchRec's row blocks, in the placement and in the cost model.

TorchRec's planner gives each rank ``ceil(rows / ranks)`` rows in rank order, what is left to the next rank and
none to the rest (pytorch/torchrec: torchrec/distributed/sharding_plan.py, ``calculate_shard_sizes_and_offsets``
-> ``_calculate_rw_shard_sizes_and_offsets``, over the world for ROW_WISE and over a node's ranks for
TABLE_ROW_WISE), and its training input distribution routes id ``i`` to rank ``i // ceil(rows / ranks)``
(torchrec/distributed/sharding/rw_sharding.py, ``RwSparseFeaturesDist``). A plan with any other split would
look ids up on the wrong rank.
"""

from __future__ import annotations

import numpy as np
import pytest

from embedding_checks import recomputed_memory
from embedding_fixtures import cluster, node
from planner.embeddings.devices import device_arrays
from planner.embeddings.problem import block_sizes, block_split, build_problem
from planner.embeddings.retime import retime_placements
from planner.embeddings.shard import EmbeddingResult, placements
from planner.types import EmbeddingTable

A100 = node("dgx-a100-80gb")


def _placed(table: EmbeddingTable, sharding: str, nodes: int = 2):
    """The Problem of one table on ``nodes`` DGX A100 nodes, and the table placed with its (HBM) ``sharding``
    option at its first position."""
    c = cluster((A100, nodes))
    problem = build_problem((table,), device_arrays(c), 8192, "adagrad")
    o = next(o for o, option in enumerate(problem.options[0]) if option.sharding == sharding and not option.host)
    position = problem.positions(problem.options[0][o])[0]
    assignment = [(o, (position,))]
    return c, problem, assignment, placements(problem, assignment)[0]


def _shard_memory(table: EmbeddingTable, placement) -> dict[int, float]:
    """HBM bytes per device of ``placement``'s shards, recomputed from their ranges (embedding_checks)."""
    return recomputed_memory(EmbeddingResult((placement,), 0.0, 0.0, {}, {}, False, "given", 0.0),
                             {table.name: table}, "adagrad")


def test_block_sizes_are_torchrecs():
    # _calculate_rw_shard_sizes_and_offsets's docstring examples: 10 rows over 4 ranks are 3,3,3,1 and
    # 5 rows over 4 ranks 2,2,1,0
    assert block_sizes(10, 4).tolist() == [3, 3, 3, 1]
    assert block_sizes(5, 4).tolist() == [2, 2, 1, 0]
    # block 2 = ceil(10 / 8): ranks 0-4 take 2 rows each, the last three none
    assert block_sizes(10, 8).tolist() == [2, 2, 2, 2, 2, 0, 0, 0]
    assert block_split(10, 8) == [(0, 2), (2, 4), (4, 6), (6, 8), (8, 10), (10, 10), (10, 10), (10, 10)]
    assert block_sizes(1_000_000_007, 16).tolist() == [62_500_001] * 15 + [62_499_992]
    assert block_sizes(16, 16).tolist() == [1] * 16 and block_sizes(1, 3).tolist() == [1, 0, 0]


def test_a_row_wise_table_of_a_billion_rows_is_split_as_torchrec_splits_it():
    table = EmbeddingTable("big", 1_000_000_007, 4)
    _, problem, assignment, placement = _placed(table, "row_wise")
    assert placement.sharding == "row_wise"
    assert [s.device for s in placement.shards] == list(range(16))
    assert [s.rows[1] - s.rows[0] for s in placement.shards] == [62_500_001] * 15 + [62_499_992]
    assert [s.rows[0] for s in placement.shards] == [62_500_001 * r for r in range(16)]
    loads = problem.evaluate(assignment)
    used = _shard_memory(table, placement)
    assert loads.hbm_bytes.tolist() == pytest.approx([used[d] for d in range(16)], rel=1e-12)


def test_a_small_row_wise_table_leaves_the_last_ranks_without_rows():
    """10 rows over 16 ranks: block 1, ranks 0-9 one row each, ranks 10-15 none. The plan lists no shard where a
    rank holds no rows (a Plan's ranges are non-empty; the TorchRec export writes those empty shards), and the
    cost model gives those devices neither memory nor lookups."""
    table = EmbeddingTable("small", 10, 64, pooling_factor=4.0)
    c, problem, assignment, placement = _placed(table, "row_wise")
    assert [(s.device, s.rows) for s in placement.shards] == [(d, (d, d + 1)) for d in range(10)]
    loads = problem.evaluate(assignment)
    used = _shard_memory(table, placement)
    assert loads.hbm_bytes.tolist() == pytest.approx([used.get(d, 0.0) for d in range(16)], rel=1e-12)
    assert np.all(loads.hbm_bytes[10:] == 0)
    unit = problem.unit(0, assignment[0][0], 0)
    assert np.all(unit.ids_recv_bytes[10:] == 0) and np.all(unit.ids_recv_bytes[:10] > 0)
    # the same placement, timed again from the plan (retime matches it to the row-wise option)
    again = retime_placements((table,), c, range(16), 8192, (placement,), optimizer="adagrad")
    assert [again.per_device_memory_bytes[d] for d in range(16)] == pytest.approx(loads.hbm_bytes.tolist())


def test_a_table_row_wise_table_is_split_over_its_nodes_ranks():
    """10 rows table-row-wise on a node of 8: blocks of 2 on its first 5 devices, as TorchRec's
    ``_calculate_rw_shard_sizes_and_offsets(rows, local_world_size, ...)`` writes them."""
    table = EmbeddingTable("node_wide", 10, 64)
    _, problem, assignment, placement = _placed(table, "table_row_wise")
    node_devices = [problem.dev.ids[i] for i in problem.dev.nodes[assignment[0][1][0]]]
    assert [(s.device, s.rows) for s in placement.shards] == [(node_devices[r], (2 * r, 2 * r + 2)) for r in range(5)]
    loads = problem.evaluate(assignment)
    used = _shard_memory(table, placement)
    assert loads.hbm_bytes.tolist() == pytest.approx([used.get(d, 0.0) for d in range(16)], rel=1e-12)
