"""The embedding sharding problem: sharding options per table and the per-device cost model.

Cost model (one training iteration, forward + backward, global batch ``B``, ``n`` devices, local batch
``b = B / n``; a table has ``R`` rows, ``D`` dims, pooling factor ``P`` lookups per sample):

* Lookups are bounded by the device's memory bandwidth (``memory_bandwidth_Bps x memory_efficiency``; the host
  link for shards in host memory, UVM). Forward reads ``lookups x width`` elements and writes the pooled
  outputs; backward reads the output gradients and, fused with the optimizer (TorchRec's FBGEMM kernels),
  reads and writes each looked-up row and its optimizer state: ``2 x (1 + state)`` row transfers.
* Input distribution: an all-to-all of the ids (int64): a device receives the ids its shards look up.
  Output distribution: an all-to-all of pooled outputs forward and of their gradients backward; a shard sends
  its pooled outputs for the whole batch, every device receives ``b x D`` per table. An all-to-all phase takes
  ``max(sent, received) x seconds-per-byte`` on each device (full-duplex links), where seconds-per-byte is
  hierarchical: the own node's share over the intra-node link, the other nodes' shares over the device's share
  of its node's NIC (or the remote node's, if slower).
* Row-wise (over all devices) reduce-scatters the partial pooled outputs forward and all-gathers their gradients
  backward; table-row-wise does the same inside one node, then an all-to-all of ``B / k`` pooled rows per device.
  Both split a table's rows in TorchRec's blocks (:func:`block_sizes`): a device looks up, and holds, its
  block's share of the rows.
* Data-parallel tables are looked up locally on ``b`` samples, then all-reduce the dense table gradient and
  update every replica.

A device's embedding time is ``a2a latency + compute + ids all-to-all + 2 x pooled all-to-all`` (the phases
are sequential; the all-to-alls are collectives). Memory per shard is ``rows x cols x dtype_bytes x (1 +
state)`` with state elements per weight element 2 (Adam), 1 (Adagrad), 1/cols (row-wise Adagrad), 0 (SGD);
data-parallel replicas also hold a dense gradient (one more copy).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property, lru_cache
from typing import Sequence

import numpy as np

from planner.embeddings.devices import DeviceArrays, bandwidth_time_s, collective_latency_s
from planner.hardware.collectives import CommGroup
from planner.errors import ConfigError
from planner.types import EmbeddingTable

IDS_BYTES = 8  # int64 ids, TorchRec's KeyedJaggedTensor default
OUTPUT_BYTES = 4  # fp32 pooled outputs and their gradients, TorchRec's default output dtype
COLUMN_MULTIPLE = 4  # column shards are multiples of 4 dims (FBGEMM's alignment, TorchRec's default minimum)
MAX_COLUMN_SHARDS = 32
OPTIMIZERS = ("sgd", "adam", "adagrad", "rowwise_adagrad")

SHARDING_TYPES = ("data_parallel", "table_wise", "row_wise", "column_wise", "table_row_wise", "table_column_wise")


def table_optimizer(dense_optimizer: str) -> str:
    """The tables' optimizer for a model trained with ``dense_optimizer``: the same where it is one of
    OPTIMIZERS, else Adagrad (DLRM's and MLPerf DLRM-DCNv2's)."""
    return dense_optimizer if dense_optimizer in OPTIMIZERS else "adagrad"


def state_elements(optimizer: str, width: int) -> float:
    """Optimizer-state elements per weight element of a shard ``width`` columns wide."""
    if optimizer == "adam":
        return 2.0
    if optimizer == "adagrad":
        return 1.0
    if optimizer == "rowwise_adagrad":
        return 1.0 / width
    if optimizer == "sgd":
        return 0.0
    raise ConfigError(f"optimizer {optimizer!r} is not known for embedding tables; use one of {', '.join(OPTIMIZERS)}")


def shard_memory_bytes(rows, cols: int, dtype_bytes: int, optimizer: str, replicated: bool = False):
    """Bytes of one shard (``rows`` a number or an array): weights and optimizer state (plus a dense gradient
    for a data-parallel replica)."""
    factor = 1.0 + state_elements(optimizer, cols) + (1.0 if replicated else 0.0)
    return rows * float(cols) * dtype_bytes * factor


def lookup_traffic_bytes(lookups: float, pooled: float, width: int, dtype_bytes: int, state: float) -> float:
    """Memory traffic of ``lookups`` row reads pooled into ``pooled`` outputs, forward and fused backward."""
    forward = lookups * width * dtype_bytes + pooled * width * OUTPUT_BYTES
    backward = pooled * width * OUTPUT_BYTES + lookups * width * dtype_bytes * 2.0 * (1.0 + state)
    return forward + backward


def output_traffic_bytes(pooled: float, width: int) -> float:
    """The part of :func:`lookup_traffic_bytes` that is pooled outputs: written forward, their gradients read
    backward. FBGEMM's kernels allocate these on the GPU whichever memory holds the table
    (embedding_forward_split_template.cu allocates the output with the options of ``dev_weights``), so they
    move through HBM even for a table in host memory."""
    return 2.0 * pooled * width * OUTPUT_BYTES


def traffic_s(traffic_bytes: float | np.ndarray, output_bytes: float, host: bool, table_Bps: float | np.ndarray,
              hbm_Bps: float | np.ndarray) -> float | np.ndarray:
    """Time of a shard's lookup traffic (``output_bytes`` of it pooled outputs): all of it through HBM for a
    shard in HBM; for one in host memory, its rows over the host link and its outputs through HBM."""
    if not host:
        return traffic_bytes / hbm_Bps
    return (traffic_bytes - output_bytes) / table_Bps + output_bytes / hbm_Bps


def even_sizes(total: int, parts: int) -> np.ndarray:
    """Sizes of ``total`` split into ``parts`` nearly equal pieces (larger ones first)."""
    base, extra = divmod(total, parts)
    return base + (np.arange(parts) < extra).astype(np.int64)


def even_split(total: int, parts: int) -> list[tuple[int, int]]:
    """[start, end) ranges of ``total`` split into ``parts`` nearly equal pieces (larger ones first): a
    table's columns over its column shards."""
    return _ranges(even_sizes(total, parts))


def block_sizes(rows: int, parts: int) -> np.ndarray:
    """Rows per rank of a table of ``rows`` rows split row-wise over ``parts`` ranks, as TorchRec splits it:
    ``ceil(rows / parts)`` on each rank in order, what is left on the next, none on the rest (a small table
    leaves the last ranks empty). TorchRec's planner writes these shards
    (torchrec/distributed/sharding_plan.py, ``calculate_shard_sizes_and_offsets`` and
    ``_calculate_rw_shard_sizes_and_offsets``; table-row-wise splits over a node's ranks), and its training
    input distribution sends id ``i`` to rank ``i // ceil(rows / parts)`` (torchrec/distributed/sharding/
    rw_sharding.py, ``RwSparseFeaturesDist``), so any other split looks ids up on the wrong rank."""
    block = -(-rows // parts)
    return np.clip(rows - block * np.arange(parts, dtype=np.int64), 0, block)


def block_split(rows: int, parts: int) -> list[tuple[int, int]]:
    """[start, end) row ranges of the ranks of :func:`block_sizes` (empty ones last)."""
    return _ranges(block_sizes(rows, parts))


def _ranges(sizes: np.ndarray) -> list[tuple[int, int]]:
    ends = np.cumsum(sizes).tolist()
    return list(zip([0] + ends[:-1], ends))


@dataclass(frozen=True)
class Option:
    """One way to shard one table. ``scope`` says where a unit goes: one device (table-wise, and each column
    shard of column-wise), one node (table-row-wise) or all devices (row-wise, data-parallel)."""

    table: int
    sharding: str  # table_wise | column_wise | table_row_wise | row_wise | data_parallel
    scope: str  # device | node | global
    host: bool  # shards in host memory (UVM) instead of HBM
    units: int  # units to place: column shards for column_wise, else 1
    width: int  # columns per unit
    ids_send_bytes: float  # ids every device sends for this table
    pool_recv_bytes: float  # pooled outputs every device receives (one direction)
    lookup_bytes: float = 0.0  # device scope: memory traffic of one unit
    output_bytes: float = 0.0  # device scope: the part of it that is pooled outputs, always in HBM
    ids_recv_bytes: float = 0.0  # device scope: ids one unit receives
    pool_send_bytes: float = 0.0  # device scope: pooled outputs one unit sends (one direction)
    memory_bytes: float = 0.0  # device scope: bytes of one unit


@dataclass(frozen=True)
class UnitLoad:
    """What one unit of an option adds to the devices it touches (arrays aligned with ``devices``)."""

    devices: np.ndarray
    compute_s: np.ndarray
    ids_recv_bytes: np.ndarray
    pool_send_bytes: np.ndarray
    hbm_bytes: np.ndarray
    host_bytes: np.ndarray


@dataclass(frozen=True)
class UnitStack:
    """One unit of an option at each of its positions (``Problem.positions`` order), end to end: position i's
    devices and loads are ``devices[starts[i]:starts[i + 1]]`` and alike; ``fused`` is each position's fused
    collective (None for all-to-all options) and ``latency_s`` its latency (0 without one)."""

    positions: tuple[int, ...]
    index: dict[int, int]  # position -> its place in ``positions``
    starts: np.ndarray
    sizes: np.ndarray
    unit: UnitLoad  # every position's unit, end to end
    fused: tuple[tuple[str, int] | None, ...]
    latency_s: np.ndarray


@dataclass(frozen=True)
class Loads:
    """Per-device totals of a (partial) assignment, and the embedding time they give."""

    compute_s: np.ndarray
    ids_recv_bytes: np.ndarray
    pool_send_bytes: np.ndarray
    hbm_bytes: np.ndarray
    host_bytes: np.ndarray
    ids_send_bytes: float
    pool_recv_bytes: float
    latency_s: np.ndarray  # fused collectives' latency per device


@dataclass
class Problem:
    """Tables x options x devices, with the cost model above. Build with :func:`build_problem`."""

    tables: tuple[EmbeddingTable, ...]
    dev: DeviceArrays
    global_batch: int
    optimizer: str
    options: tuple[tuple[Option, ...], ...]  # per table
    _units: dict[tuple[int, int, int], UnitLoad] = field(default_factory=dict, repr=False)
    _stacks: dict[tuple[int, int], UnitStack] = field(default_factory=dict, repr=False)
    _spread: dict[tuple, tuple[np.ndarray, ...]] = field(default_factory=dict, repr=False)
    _latency: dict[tuple[str, int], tuple[np.ndarray, float]] = field(default_factory=dict, repr=False)
    _alone: dict[tuple[int, int], float] = field(default_factory=dict, repr=False)
    _size: dict[tuple[int, int], float] = field(default_factory=dict, repr=False)
    _fits: dict[tuple[int, int, int], bool] = field(default_factory=dict, repr=False)

    @cached_property
    def node_positions(self) -> tuple[int, ...]:
        """Nodes with at least two participating devices (where table-row-wise makes sense)."""
        return tuple(k for k, members in enumerate(self.dev.nodes) if len(members) >= 2)

    @cached_property
    def table_kinds(self) -> tuple[tuple[int, ...], ...]:
        """Tables alike in everything the cost model reads (rows, dim, pooling, element size) and so in their
        options, grouped; groups in order of their first table."""
        groups: dict[tuple, list[int]] = {}
        for t, table in enumerate(self.tables):
            shape = tuple((o.sharding, o.host, o.units) for o in self.options[t])
            groups.setdefault((table.rows, table.dim, table.pooling_factor, table.dtype_bytes, shape), []).append(t)
        return tuple(tuple(ts) for ts in groups.values())

    def positions(self, option: Option) -> Sequence[int]:
        if option.scope == "device":
            return range(self.dev.count)
        if option.scope == "node":
            return self.node_positions
        return (0,)

    def distinct_positions(self, option: Option) -> Sequence[int]:
        """Positions up to symmetry: one node of each kind (same device classes and capacities)."""
        if option.scope != "node":
            return self.positions(option)
        return self._distinct_nodes

    @cached_property
    def _distinct_nodes(self) -> tuple[int, ...]:
        dev = self.dev
        seen: dict[tuple, int] = {}
        for k in self.node_positions:
            key = tuple((int(dev.class_of[i]), float(dev.hbm_capacity_bytes[i]), float(dev.host_capacity_bytes[i]))
                        for i in dev.nodes[k])
            seen.setdefault(key, k)
        return tuple(seen.values())

    def base_time_s(self) -> np.ndarray:
        return self._base_time_s

    @cached_property
    def _base_time_s(self) -> np.ndarray:
        base = self.dev.a2a_latency_s * 3.0  # ids forward, pooled outputs forward, their gradients backward
        base.setflags(write=False)
        return base

    def fused_key(self, option: Option, position: int) -> tuple[str, int] | None:
        """Collectives of one kind run fused across tables (as TorchRec does), so their latency is paid once
        per kind and group: the data-parallel all-reduce, the row-wise reduce-scatter + all-gather over all
        devices, and each node's table-row-wise reduce-scatter + all-gather. None for all-to-all options."""
        if option.sharding in ("data_parallel", "row_wise"):
            return (option.sharding, 0)
        if option.sharding == "table_row_wise":
            return (option.sharding, position)
        return None

    def fused_latency(self, key: tuple[str, int]) -> tuple[np.ndarray, float]:
        """(devices, latency in seconds) of the fused collective ``key``."""
        cached = self._latency.get(key)
        if cached is None:
            kind, position = key
            members = np.array(self.dev.nodes[position] if kind == "table_row_wise" else range(self.dev.count))
            group = self.dev.group(members)
            if kind == "data_parallel":
                latency = collective_latency_s("all_reduce", group)
            else:
                latency = 2.0 * collective_latency_s("reduce_scatter", group)
            cached = self._latency[key] = (members, latency)
        return cached

    @staticmethod
    def a2a_excess_bytes(loads: Loads) -> tuple[np.ndarray, np.ndarray]:
        """Per device, the ids it receives beyond those it sends and the pooled bytes it sends beyond those it
        receives: what its all-to-alls carry on top of what every device carries (:meth:`device_time_s` pays
        the larger of each pair)."""
        return (np.maximum(loads.ids_recv_bytes - loads.ids_send_bytes, 0.0),
                np.maximum(loads.pool_send_bytes - loads.pool_recv_bytes, 0.0))

    def device_time_s(self, loads: Loads, devices: np.ndarray | slice = slice(None)) -> np.ndarray:
        """Embedding time per device: latency + compute + ids all-to-all + 2 x pooled all-to-all. The per-device
        arrays of ``loads`` hold the devices ``devices`` selects (all of them by default)."""
        a2a_bytes = (np.maximum(loads.ids_recv_bytes, loads.ids_send_bytes)
                     + 2.0 * np.maximum(loads.pool_send_bytes, loads.pool_recv_bytes))
        return (self.base_time_s()[devices] + loads.latency_s + loads.compute_s
                + self.dev.a2a_s_per_byte[devices] * a2a_bytes)

    # ----------------------------------------------------------------------------------- units
    def unit(self, t: int, o: int, position: int) -> UnitLoad:
        key = (t, o, position)
        cached = self._units.get(key)
        if cached is None:
            cached = self._units[key] = self._make_unit(self.options[t][o], position)
        return cached

    def unit_stack(self, t: int, o: int) -> UnitStack:
        """Option o of table t's unit at every position, end to end (for trying all positions at once)."""
        cached = self._stacks.get((t, o))
        if cached is None:
            option = self.options[t][o]
            positions = tuple(self.positions(option))
            units = [self.unit(t, o, p) for p in positions]
            sizes = np.array([len(u.devices) for u in units])
            fused = tuple(self.fused_key(option, p) for p in positions)
            joined = UnitLoad(*(np.concatenate([getattr(u, name) for u in units])
                                for name in ("devices", "compute_s", "ids_recv_bytes", "pool_send_bytes", "hbm_bytes",
                                             "host_bytes")))
            cached = self._stacks[t, o] = UnitStack(
                positions, {p: i for i, p in enumerate(positions)}, np.concatenate(([0], np.cumsum(sizes)[:-1])),
                sizes, joined, fused, np.array([self.fused_latency(k)[1] if k is not None else 0.0 for k in fused]))
        return cached

    def device_unit_s(self, option: Option, position: int) -> float:
        """The lookup time of one unit of a device-scope ``option`` on device ``position``."""
        return float(self.lookup_s(option, position))

    def lookup_s(self, option: Option, devices: np.ndarray | slice | int = slice(None)) -> float | np.ndarray:
        """The lookup time of one unit of a device-scope ``option`` on each of ``devices`` (all by default):
        its rows' traffic over the memory holding them (the host link for host memory), its pooled outputs'
        over HBM."""
        dev = self.dev
        return traffic_s(option.lookup_bytes, option.output_bytes, option.host, dev.host_Bps[devices],
                         dev.lookup_Bps[devices])

    def _make_unit(self, option: Option, position: int) -> UnitLoad:
        dev = self.dev
        if option.scope == "device":
            mem = np.array([option.memory_bytes])
            zero = np.zeros(1)
            return UnitLoad(np.array([position]), np.array([self.device_unit_s(option, position)]),
                            np.array([option.ids_recv_bytes]), np.array([option.pool_send_bytes]),
                            zero if option.host else mem, mem if option.host else zero)
        members = np.array(dev.nodes[position] if option.scope == "node" else range(dev.count), dtype=int)
        bw = dev.host_Bps[members] if option.host else dev.lookup_Bps[members]
        hbm_Bps = dev.lookup_Bps[members]
        group = dev.group(members)
        # the loads depend on the members only through their memory bandwidths and their links: nodes alike in
        # both share them
        key = (option, group, bw.tobytes(), hbm_Bps.tobytes())
        loads = self._spread.get(key)
        if loads is None:
            loads = self._spread[key] = self._spread_loads(option, bw, hbm_Bps, group)
        return UnitLoad(members, *loads)

    def _spread_loads(self, option: Option, bw: np.ndarray, hbm_Bps: np.ndarray, group: CommGroup
                      ) -> tuple[np.ndarray, ...]:
        """A node-wide or global unit's loads on its members (bandwidths ``bw`` of the memory holding the rows,
        ``hbm_Bps`` of their HBM, links ``group``): compute, ids received, pooled bytes sent, HBM and host
        memory."""
        table = self.tables[option.table]
        batch = float(self.global_batch)
        q = len(bw)
        state = state_elements(self.optimizer, table.dim)
        if option.sharding == "data_parallel":
            local = batch / q
            traffic = lookup_traffic_bytes(local * table.pooling_factor, local, table.dim, table.dtype_bytes, state)
            # dense gradient: zero it, scatter the lookups' gradients into it, then the optimizer sweeps the table
            table_bytes = float(table.rows) * table.dim * table.dtype_bytes
            traffic += 2.0 * table_bytes + local * table.pooling_factor * table.dim * table.dtype_bytes
            traffic += table_bytes * 2.0 * (1.0 + state) + table_bytes
            compute = traffic / bw + bandwidth_time_s("all_reduce", table_bytes, group)
            mem = np.full(q, shard_memory_bytes(table.rows, table.dim, table.dtype_bytes, self.optimizer, True))
            zero = np.zeros(q)
            return compute, zero, zero, mem, zero
        rows = block_sizes(table.rows, q).astype(float)  # the members in order hold TorchRec's row blocks
        share = rows / table.rows
        lookups = batch * table.pooling_factor * share
        pooled_bytes = batch * table.dim * OUTPUT_BYTES
        comm = bandwidth_time_s("reduce_scatter", pooled_bytes, group) + bandwidth_time_s(
            "all_gather", pooled_bytes, group)
        traffic = lookup_traffic_bytes(lookups, batch, table.dim, table.dtype_bytes, state)
        compute = traffic_s(traffic, output_traffic_bytes(batch, table.dim), option.host, bw, hbm_Bps) + comm
        mem = shard_memory_bytes(rows, table.dim, table.dtype_bytes, self.optimizer)
        zero = np.zeros(q)
        pool_send = np.full(q, batch / q * table.dim * OUTPUT_BYTES) if option.scope == "node" else zero
        return compute, lookups * IDS_BYTES, pool_send, zero if option.host else mem, mem if option.host else zero

    # ------------------------------------------------------------------------------ evaluation
    def evaluate(self, assignment: Sequence[tuple[int, Sequence[int]]]) -> Loads:
        """Per-device loads of a full assignment: per table (option index, positions of its units)."""
        n = self.dev.count
        compute, ids_recv, pool_send, hbm, host = (np.zeros(n) for _ in range(5))
        ids_send = pool_recv = 0.0
        keys: set[tuple[str, int]] = set()
        for t, (o, positions) in enumerate(assignment):
            option = self.options[t][o]
            if len(positions) != option.units:
                raise ValueError(f"table {t}: option {o} needs {option.units} positions, got {len(positions)}")
            ids_send += option.ids_send_bytes
            pool_recv += option.pool_recv_bytes
            for p in positions:
                key = self.fused_key(option, p)
                if key is not None:
                    keys.add(key)
                u = self.unit(t, o, p)
                np.add.at(compute, u.devices, u.compute_s)
                np.add.at(ids_recv, u.devices, u.ids_recv_bytes)
                np.add.at(pool_send, u.devices, u.pool_send_bytes)
                np.add.at(hbm, u.devices, u.hbm_bytes)
                np.add.at(host, u.devices, u.host_bytes)
        latency = np.zeros(n)
        for key in sorted(keys):
            members, seconds = self.fused_latency(key)
            latency[members] += seconds
        return Loads(compute, ids_recv, pool_send, hbm, host, ids_send, pool_recv, latency)

    def makespan_s(self, assignment: Sequence[tuple[int, Sequence[int]]]) -> float:
        """The slowest device's time of a full assignment; inf when it does not fit in memory."""
        loads = self.evaluate(assignment)
        if not self.fits(loads):
            return float("inf")
        return float(self.device_time_s(loads).max())

    def fits(self, loads: Loads, slack: float = 1e-9) -> bool:
        return bool(np.all(loads.hbm_bytes <= self.dev.hbm_capacity_bytes * (1 + slack))
                    and np.all(loads.host_bytes <= self.dev.host_capacity_bytes * (1 + slack)))

    def unit_alone_s(self, t: int, o: int) -> float:
        """A lower bound on the slowest device's time whenever table ``t`` uses option ``o``: one unit on its
        best position with only the all-to-all traffic every plan has (every other load only adds); inf when
        it fits nowhere."""
        key = (t, o)
        cached = self._alone.get(key)
        if cached is None:
            cached = self._alone[key] = self._unit_alone_s(t, o)
        return cached

    def unit_size_s(self, t: int, o: int) -> float:
        """How big one unit of option o is, for largest-first orders: its own lookups, collectives and
        all-to-all bytes on the fastest device (no shared traffic, no latency)."""
        key = (t, o)
        cached = self._size.get(key)
        if cached is None:
            option, dev = self.options[t][o], self.dev
            i = int(np.argmax(dev.lookup_Bps))
            if option.scope == "device":
                cached = float(self.lookup_s(option, i)) + dev.a2a_s_per_byte[i] * (
                    option.ids_recv_bytes + 2.0 * option.pool_send_bytes)
            else:
                u = self.unit(t, o, self.distinct_positions(option)[0])
                cached = float(np.max(u.compute_s + dev.a2a_s_per_byte[u.devices] * (
                    u.ids_recv_bytes + 2.0 * u.pool_send_bytes)))
            self._size[key] = cached
        return cached

    @cached_property
    def _least_a2a(self) -> tuple[np.ndarray, np.ndarray]:
        """Per table, the fewest ids it makes every device send and pooled bytes every device receive."""
        ids = np.array([min(o.ids_send_bytes for o in options) for options in self.options])
        pooled = np.array([min(o.pool_recv_bytes for o in options) for options in self.options])
        return ids, pooled

    def fits_somewhere(self, t: int, o: int) -> bool:
        """Whether one unit of table ``t``'s option ``o`` fits in memory on some position (then its time alone
        is finite)."""
        option = self.options[t][o]
        if option.scope == "device":
            return bool(np.any(self._device_fits(option)))
        return bool(self._fitting_positions(t, o))

    def _device_fits(self, option: Option) -> np.ndarray:
        """Per device, whether one unit of a device-scope ``option`` fits in its memory (host or HBM)."""
        capacity = self.dev.host_capacity_bytes if option.host else self.dev.hbm_capacity_bytes
        return option.memory_bytes <= capacity

    def _fitting_positions(self, t: int, o: int) -> list[int]:
        """The distinct positions (node-wide and global options) where one unit of (t, o) fits in memory."""
        return [p for p in self.distinct_positions(self.options[t][o]) if self.fits_at(t, o, p)]

    def fits_at(self, t: int, o: int, position: int) -> bool:
        """Whether one unit of table ``t``'s option ``o`` alone fits in memory at ``position``."""
        key = (t, o, position)
        cached = self._fits.get(key)
        if cached is None:
            unit, dev = self.unit(t, o, position), self.dev
            cached = self._fits[key] = not (np.any(unit.hbm_bytes > dev.hbm_capacity_bytes[unit.devices])
                                            or np.any(unit.host_bytes > dev.host_capacity_bytes[unit.devices]))
        return cached

    def _unit_alone_s(self, t: int, o: int) -> float:
        option, dev = self.options[t][o], self.dev
        # every device sends at least the ids of every table and receives their pooled outputs (the least
        # any option of the other tables asks for, plus what this option asks for)
        least_ids, least_pooled = self._least_a2a
        ids_send = float(least_ids.sum() - least_ids[t]) + option.ids_send_bytes
        pool_recv = float(least_pooled.sum() - least_pooled[t]) + option.pool_recv_bytes
        latency = 0.0
        if option.scope == "device":  # every device at once
            a2a = max(option.ids_recv_bytes, ids_send) + 2.0 * max(option.pool_send_bytes, pool_recv)
            times = self.base_time_s() + self.lookup_s(option) + dev.a2a_s_per_byte * a2a
            times = np.where(self._device_fits(option), times, np.inf)
            return float(times.min())
        best = np.inf
        for p in self._fitting_positions(t, o):
            u = self.unit(t, o, p)
            a2a = np.maximum(u.ids_recv_bytes, ids_send) + 2.0 * np.maximum(u.pool_send_bytes, pool_recv)
            key = self.fused_key(option, p)
            latency = self.fused_latency(key)[1] if key is not None else 0.0
            times = self.base_time_s()[u.devices] + u.compute_s + dev.a2a_s_per_byte[u.devices] * a2a + latency
            best = min(best, float(times.max()))
        return best


def build_options(t: int, table: EmbeddingTable, dev: DeviceArrays, global_batch: int, optimizer: str,
                  with_host: bool) -> tuple[Option, ...]:
    """Every sharding option of one table on these devices; with ``with_host``, each but data-parallel also in
    host memory, as TorchRec's sharders offer the UVM kernels to every other sharding type
    (torchrec/distributed/embedding_types.py, ``BaseEmbeddingSharder.compute_kernels``)."""
    return _table_options(t, table, dev.count, _node_wide(dev), global_batch, optimizer, with_host)


def _node_wide(dev: DeviceArrays) -> bool:
    """Whether table-row-wise is offered: several nodes, one of them with two devices or more."""
    return any(len(members) >= 2 for members in dev.nodes) and len(dev.nodes) > 1


def _table_options(t: int, table: EmbeddingTable, n: int, node_wide: bool, global_batch: int, optimizer: str,
                   with_host: bool) -> tuple[Option, ...]:
    batch = float(global_batch)
    local = batch / n
    ids_send = local * table.pooling_factor * IDS_BYTES
    pool_recv = local * table.dim * OUTPUT_BYTES
    memories = (False, True) if with_host else (False,)

    def one_device(sharding: str, shards: int, host: bool) -> Option:
        """A table-wise option (one shard) or a column-wise one (``shards`` column shards), each shard on one
        device."""
        width = table.dim // shards
        return Option(
            t, sharding, "device", host, shards, width, ids_send * shards, pool_recv,
            lookup_bytes=lookup_traffic_bytes(batch * table.pooling_factor, batch, width, table.dtype_bytes,
                                              state_elements(optimizer, width)),
            output_bytes=output_traffic_bytes(batch, width),
            ids_recv_bytes=batch * table.pooling_factor * IDS_BYTES,
            pool_send_bytes=batch * width * OUTPUT_BYTES,
            memory_bytes=shard_memory_bytes(table.rows, width, table.dtype_bytes, optimizer))

    options = [one_device("table_wise", 1, host) for host in memories]
    shards = 2
    while shards <= min(n, MAX_COLUMN_SHARDS) and table.dim % (shards * COLUMN_MULTIPLE) == 0:
        options.extend(one_device("column_wise", shards, host) for host in memories)
        shards *= 2
    if node_wide:
        options.extend(Option(t, "table_row_wise", "node", host, 1, table.dim, ids_send, pool_recv)
                       for host in memories)
    if n >= 2:
        options.extend(Option(t, "row_wise", "global", host, 1, table.dim, ids_send, 0.0) for host in memories)
        options.append(Option(t, "data_parallel", "global", False, 1, table.dim, 0.0, 0.0))
    return tuple(options)


def build_problem(tables: Sequence[EmbeddingTable], dev: DeviceArrays, global_batch: int, optimizer: str, *,
                  for_search: bool = False) -> Problem:
    """The options of every table, without those that fit on no position; ``for_search`` (the sharding search's
    problem) also drops those that fit on none beside the row-wise blocks and replicas of the tables left only
    global options (:func:`_drop_units_beside_forced_blocks`: no plan can use them, and they weaken the bounds,
    which sum memory over classes of devices), while a given placement keeps them, to be timed as not fitting.
    Host (UVM) options are offered only
    when host memory is allowed and the tables' HBM demand exceeds half the devices' HBM (a host shard is always
    slower than the same shard in HBM, so it only matters when HBM runs short). Raises InfeasibleError naming a
    table that has no option left."""
    from planner.embeddings.errors import table_does_not_fit

    problem = _every_option(tables, dev, global_batch, optimizer)
    all_options = problem.options
    usable: list[list[int]] = []
    for t, options in enumerate(all_options):
        fitting = [o for o in range(len(options)) if problem.fits_somewhere(t, o)]
        if not fitting:
            raise table_does_not_fit(tables[t], dev, optimizer)
        usable.append(fitting)
    if for_search:
        _drop_units_beside_forced_blocks(problem, usable)
    kept: list[tuple[Option, ...]] = []
    renumbered: dict[tuple[int, int], int] = {}  # (table, option index before) -> option index kept
    for t, options in enumerate(all_options):
        renumbered.update(((t, o), k) for k, o in enumerate(usable[t]))
        kept.append(tuple(options[o] for o in usable[t]))
    final = Problem(tuple(tables), dev, global_batch, optimizer, tuple(kept))
    # the units built above, and whether they fit, depend only on the option and position, so they carry over
    # under the new index
    for built, into in ((problem._units, final._units), (problem._fits, final._fits)):
        into.update(((t, renumbered[t, o], p), value) for (t, o, p), value in built.items() if (t, o) in renumbered)
    return final


def _drop_units_beside_forced_blocks(problem: Problem, usable: list[list[int]]) -> None:
    """Drop from ``usable`` (per table, its option indices) the options whose units fit on no device beside the
    memory every device must give the tables left only global options (row-wise blocks, data-parallel replicas):
    such a table's blocks sit on every device whichever of its options it takes, so a unit needs its own memory
    plus theirs on its device. A table keeps its options where it would lose them all (the placement then
    reports that the set does not fit), and the reserve grows as tables are left only global options, until it
    settles."""
    dev = problem.dev
    capacity = {False: dev.hbm_capacity_bytes, True: dev.host_capacity_bytes}

    def only_global(t: int) -> bool:
        return all(problem.options[t][o].scope == "global" for o in usable[t])

    forced = {t for t in range(len(usable)) if only_global(t)}
    counted: set[int] = set()
    reserved = {False: np.zeros(dev.count), True: np.zeros(dev.count)}
    while forced - counted:
        for t in sorted(forced - counted):
            units = [problem.unit(t, o, 0) for o in usable[t]]
            for host in (False, True):
                reserved[host] += np.min([unit_memory_bytes(unit, host) for unit in units], axis=0)
        counted |= forced
        for t, options in enumerate(usable):
            if t in forced:
                continue
            fitting = [o for o in options if _fits_beside(problem, t, o, reserved, capacity)]
            if fitting:
                usable[t] = fitting
            if only_global(t):
                forced.add(t)


def unit_memory_bytes(unit: UnitLoad, host: bool) -> np.ndarray:
    """A unit's bytes per device in host memory (``host``) or in HBM."""
    return unit.host_bytes if host else unit.hbm_bytes


def _fits_beside(problem: Problem, t: int, o: int, reserved: dict, capacity: dict) -> bool:
    """Whether one unit of table ``t``'s option ``o`` fits on some position beside ``reserved`` bytes per device
    (HBM and host)."""
    option = problem.options[t][o]
    if option.scope == "device":
        room = capacity[option.host] - reserved[option.host]
        return bool(np.any(option.memory_bytes <= room * (1 + 1e-9)))
    for p in problem.positions(option):
        unit = problem.unit(t, o, p)
        if all(np.all(unit_memory_bytes(unit, host) + reserved[host][unit.devices]
                      <= capacity[host][unit.devices] * (1 + 1e-9)) for host in (False, True)):
            return True
    return False


def check_tables_fit(tables: Sequence[EmbeddingTable], dev: DeviceArrays, global_batch: int, optimizer: str) -> None:
    """Raise :func:`build_problem`'s InfeasibleError for the first table that has no option fitting on any
    position, without building every option's units: a table passes at its first option that fits, trying the
    one-device options (a vectorised test) before the node-wide and global ones (a unit per position)."""
    from planner.embeddings.errors import table_does_not_fit

    problem = _every_option(tables, dev, global_batch, optimizer)
    order = {"device": 0, "node": 1, "global": 2}
    for t, options in enumerate(problem.options):
        tries = sorted(range(len(options)), key=lambda o: order[options[o].scope])
        if not any(problem.fits_somewhere(t, o) for o in tries):
            raise table_does_not_fit(tables[t], dev, optimizer)


def _every_option(tables: Sequence[EmbeddingTable], dev: DeviceArrays, global_batch: int, optimizer: str) -> Problem:
    """The problem with every option of every table, those that fit nowhere included. Host (UVM) options are
    offered only when host memory is allowed and the tables' HBM demand exceeds half the devices' HBM."""
    state_elements(optimizer, 1)  # validates the optimizer name before any work
    demand = sum(shard_memory_bytes(t.rows, t.dim, t.dtype_bytes, optimizer) for t in tables)
    with_host = bool(dev.host_capacity_bytes.sum() > 0) and demand > 0.5 * float(dev.hbm_capacity_bytes.sum())
    tables = tuple(tables)
    return Problem(tables, dev, global_batch, optimizer,
                   _all_options(tables, dev.count, _node_wide(dev), global_batch, optimizer, with_host))


@lru_cache(maxsize=4)
def _all_options(tables: tuple[EmbeddingTable, ...], n: int, node_wide: bool, global_batch: int, optimizer: str,
                 with_host: bool) -> tuple[tuple[Option, ...], ...]:
    """Every table's options (:func:`build_options`), kept for the last few inputs: the dense search tests the
    same tables' capacity once per memory budget it leaves, and the options do not depend on the budget."""
    return tuple(_table_options(t, table, n, node_wide, global_batch, optimizer, with_host)
                 for t, table in enumerate(tables))
