"""The message for a table that fits nowhere (exit 2 on the command line)."""

from __future__ import annotations

import numpy as np

from planner.embeddings.devices import DeviceArrays
from planner.errors import InfeasibleError, either
from planner.types import EmbeddingTable
from planner.units import GIB


def table_does_not_fit(table: EmbeddingTable, dev: DeviceArrays, optimizer: str) -> InfeasibleError:
    """InfeasibleError naming ``table``, the bytes it needs and what the devices offer."""
    from planner.embeddings.problem import block_sizes, shard_memory_bytes

    total = shard_memory_bytes(table.rows, table.dim, table.dtype_bytes, optimizer)
    largest_rows = int(block_sizes(table.rows, dev.count)[0])  # the first rank's block is the largest
    per_device = shard_memory_bytes(largest_rows, table.dim, table.dtype_bytes, optimizer)
    hbm = float(np.min(dev.hbm_capacity_bytes))
    host = float(np.min(dev.host_capacity_bytes))
    # GiB, as every other memory figure the command line prints
    where = f"{hbm / GIB:.3g} GiB of device memory" + (f" and {host / GIB:.3g} GiB of host memory" if host else "")
    fixes = ["add devices (or larger ones)"]
    if optimizer != "sgd":  # the only smaller state a plan's optimizer choice reaches
        bare = shard_memory_bytes(largest_rows, table.dim, table.dtype_bytes, "sgd")
        fixes.append(f"train with SGD (--optimizer sgd, no optimizer state: {bare / GIB:.3g} GiB per device)")
    if not host:
        fixes.append("let shards use host memory")
    return InfeasibleError(
        f"embedding table {table.name!r} ({table.rows} rows x {table.dim} dims, {table.dtype_bytes}-byte values, "
        f"{optimizer} optimizer) needs {total / GIB:.3g} GiB ({total:.0f} bytes) with its optimizer state, and "
        f"{per_device / GIB:.3g} GiB per device even row-sharded over all {dev.count} devices, but the smallest "
        f"device offers {where} to embeddings; {either(fixes)}")
