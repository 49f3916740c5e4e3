"""Shards in host memory (UVM): only their rows cross the host link; their pooled outputs stay in HBM."""

from __future__ import annotations

import numpy as np
import pytest

from embedding_fixtures import GiB, cluster, node, small_node
from planner.embeddings.devices import device_arrays
from planner.embeddings.problem import block_sizes, build_problem, state_elements
from planner.types import EmbeddingTable

A100 = node("dgx-a100-80gb")
BATCH = 4096


def _problem():
    # 2 nodes of 2 devices with 1 GiB of HBM each: the tables need more than half of it, so host options exist
    dev = device_arrays(cluster((small_node(A100, 2, memory_bytes=GiB), 2)), None, None, True)
    tables = (EmbeddingTable("hot", 5_000_000, 64, 40.0), EmbeddingTable("cold", 2_000_000, 32, 1.5))
    return build_problem(tables, dev, BATCH, "adagrad")


def _twins(problem):
    """(table, host option, the same sharding in HBM) for every host option whose HBM twin fits."""
    for t, options in enumerate(problem.options):
        for o, option in enumerate(options):
            twin = next((j for j, other in enumerate(options)
                         if not other.host and (other.sharding, other.units) == (option.sharding, option.units)), None)
            if option.host and twin is not None:
                yield t, o, twin


def _unit(problem, t, o):
    option = problem.options[t][o]
    return problem.unit(t, o, 0 if option.scope == "device" else problem.distinct_positions(option)[0])


def test_every_sharding_with_host_memory_is_offered():
    # TorchRec's sharders offer the UVM kernels to every sharding type but data-parallel
    problem = _problem()
    assert {problem.options[t][o].sharding for t, o, _ in _twins(problem)} == {"table_wise", "column_wise",
                                                                               "table_row_wise", "row_wise"}


def test_host_shard_pays_the_host_link_for_its_rows_only():
    problem = _problem()
    dev = problem.dev
    seen = 0
    for t, o, twin in _twins(problem):
        table, option = problem.tables[t], problem.options[t][o]
        host, hbm = _unit(problem, t, o), _unit(problem, t, twin)
        assert np.array_equal(host.devices, hbm.devices)
        q = len(host.devices)
        if option.scope == "device":
            lookups = np.array([BATCH * table.pooling_factor])
        else:  # every member looks up its row block's share for the whole batch
            lookups = BATCH * table.pooling_factor * block_sizes(table.rows, q) / table.rows
        # each row read forward, then read and written back with its optimizer state by the fused backward
        state = state_elements("adagrad", option.width)  # optimizer state per weight at the unit's width
        rows_bytes = lookups * option.width * table.dtype_bytes * (1.0 + 2.0 * (1.0 + state))
        # the same shard, the same collectives: the difference is the rows' traffic over the slower link
        expected = rows_bytes * (1.0 / dev.host_Bps[host.devices] - 1.0 / dev.lookup_Bps[host.devices])
        assert host.compute_s - hbm.compute_s == pytest.approx(expected, rel=1e-9)
        seen += 1
    assert seen >= 4
