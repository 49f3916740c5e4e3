"""``shard_tables``: place embedding tables on (possibly mixed) devices, with a proven bound.

The order of work: the aggregated LP relaxation (the lower bound, and which sharding each table prefers), the
LP-guided greedy + local search (always), then the exact MILP on instances small enough to finish within the
time limit. The result reports the slowest device's time, the bound, and the gap between them.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np

from planner.embeddings.devices import device_arrays
from planner.embeddings.bound import threshold_bound
from planner.embeddings.heuristic import heuristic
from planner.embeddings.milp import SolveResult, class_bins, device_bins, solve
from planner.embeddings.problem import Problem, build_problem, even_split
from planner.errors import ConfigError, InfeasibleError
from planner.plan import EmbeddingPlacement, EmbeddingShard
from planner.types import Cluster, EmbeddingTable

log = logging.getLogger(__name__)

# The exact MILP runs when it has at most this many placement variables (tables x options x devices): up to
# here HiGHS closes the gap within a few seconds on the reference workloads; past it the heuristic's answer,
# with its gap to the LP bound, is the result.
MILP_MAX_VARIABLES = 4000


@dataclass(frozen=True)
class EmbeddingResult:
    placements: tuple[EmbeddingPlacement, ...]
    embedding_time_s: float  # the slowest device: forward + backward lookups and communication
    lower_bound_s: float  # LP relaxation (or the MILP's dual bound, whichever is higher)
    per_device_time_s: Mapping[int, float]  # global device id -> seconds
    per_device_memory_bytes: Mapping[int, float]  # global device id -> HBM bytes (weights + optimizer state)
    proven_optimal: bool
    method: str  # "milp" | "heuristic"
    gap: float  # (embedding_time_s - lower_bound_s) / lower_bound_s
    per_device_host_memory_bytes: Mapping[int, float] = None  # type: ignore[assignment]
    solve_time_s: float = 0.0
    optimizer: str = "adagrad"


def shard_tables(tables: Sequence[EmbeddingTable], cluster: Cluster, devices: Sequence[int] | None,
                 global_batch: int, *, optimizer: str = "adagrad",
                 memory_budget_bytes: Mapping[int, float] | None = None, time_limit_s: float = 10.0,
                 seed: int = 0, allow_host: bool = True) -> EmbeddingResult:
    """Shard ``tables`` over ``devices`` of ``cluster`` (all when None) for ``global_batch`` samples.

    ``memory_budget_bytes`` gives the bytes per device left for embeddings (default: the device's memory).
    ``seed`` is accepted for API symmetry; the search is deterministic (ties broken by index).
    """
    del seed
    start = time.perf_counter()
    if not tables:
        raise ConfigError("shard_tables: no embedding tables were given")
    if global_batch <= 0:
        raise ConfigError(f"global batch must be a positive integer, got {global_batch}")
    if time_limit_s <= 0:
        raise ConfigError(f"--time-limit must be positive, got {time_limit_s}")
    names = [t.name for t in tables]
    if len(set(names)) != len(names):
        dup = next(n for n in names if names.count(n) > 1)
        raise ConfigError(f"embedding table {dup!r} appears twice; table names must be unique")
    dev = device_arrays(cluster, devices, memory_budget_bytes, allow_host)
    problem = build_problem(tables, dev, global_batch, optimizer)
    deadline = start + 0.9 * time_limit_s  # leaves room to build the result within the limit

    relaxed = solve(problem, class_bins(problem), integer=False,
                    time_limit_s=max(deadline - time.perf_counter(), 1.0), keep=True)
    if relaxed.status == "infeasible":
        raise _too_big_in_total(problem)
    bound = relaxed.objective_s if relaxed.status in ("optimal", "feasible") else 0.0
    weights = relaxed.weights or None
    assignment = heuristic(problem, weights, start + 0.3 * (deadline - start))
    method, proven = "heuristic", False
    best = _makespan(problem, assignment) if assignment is not None else np.inf
    if np.isfinite(best) and best > bound * (1 + 1e-6):
        # a tighter bound, and the LP's advice once options slower than the bound alone are ruled out
        bound, guided = threshold_bound(problem, relaxed, best, start + 0.5 * (deadline - start))
        second = heuristic(problem, guided, start + 0.65 * (deadline - start)) if guided else None
        value = _makespan(problem, second) if second is not None else np.inf
        if value < best:
            assignment, best = second, value
    if _milp_size(problem) <= MILP_MAX_VARIABLES and best > bound * (1 + 1e-6):
        remaining = deadline - time.perf_counter()
        if remaining > 0.05:
            exact: SolveResult = solve(problem, device_bins(problem), integer=True, time_limit_s=remaining)
            bound = max(bound, min(exact.bound_s, exact.objective_s))
            if exact.assignment is not None:
                value = _makespan(problem, exact.assignment)
                if value < best * (1 - 1e-9) or assignment is None:
                    assignment, best, method = exact.assignment, value, "milp"
                proven = exact.status == "optimal"
                if proven:
                    bound = max(bound, min(best, exact.objective_s))
    if assignment is None:
        raise InfeasibleError(
            f"no placement of the {len(tables)} embedding tables fits the devices' memory within the "
            f"{time_limit_s:g} s time limit; add devices, raise --time-limit, or use a smaller optimizer")
    proven = proven or best <= bound * (1 + 1e-9)
    gap = (best - bound) / bound if bound > 0 else 0.0
    loads = problem.evaluate(assignment)
    times = problem.device_time_s(loads)
    log.info("embeddings: %d tables on %d devices, %.6f s (bound %.6f s, gap %.2f%%, %s) in %.2f s",
             len(tables), dev.count, best, bound, 100 * gap, method, time.perf_counter() - start)
    return EmbeddingResult(
        placements=placements(problem, assignment),
        embedding_time_s=float(best),
        lower_bound_s=float(bound),
        per_device_time_s={d: float(times[i]) for i, d in enumerate(dev.ids)},
        per_device_memory_bytes={d: float(loads.hbm_bytes[i]) for i, d in enumerate(dev.ids)},
        proven_optimal=bool(proven),
        method=method,
        gap=float(max(gap, 0.0)),
        per_device_host_memory_bytes={d: float(loads.host_bytes[i]) for i, d in enumerate(dev.ids)},
        solve_time_s=time.perf_counter() - start,
        optimizer=optimizer,
    )


def _makespan(problem: Problem, assignment) -> float:
    loads = problem.evaluate(assignment)
    if not problem.fits(loads):
        return np.inf
    return float(problem.device_time_s(loads).max())


def _milp_size(problem: Problem) -> int:
    n_nodes = len(problem.node_positions)
    size = 0
    for options in problem.options:
        for option in options:
            size += 1 + (problem.dev.count if option.scope == "device" else n_nodes if option.scope == "node" else 0)
    return size


def _too_big_in_total(problem: Problem) -> InfeasibleError:
    from planner.embeddings.problem import shard_memory_bytes

    need = sum(shard_memory_bytes(t.rows, t.dim, t.dtype_bytes, problem.optimizer) for t in problem.tables)
    have = float(problem.dev.hbm_capacity_bytes.sum() + problem.dev.host_capacity_bytes.sum())
    biggest = max(problem.tables, key=lambda t: t.rows * t.dim * t.dtype_bytes)
    return InfeasibleError(
        f"the {len(problem.tables)} embedding tables need {need / 1e9:.3g} GB with their {problem.optimizer} "
        f"state (the largest, {biggest.name!r}, {shard_memory_bytes(biggest.rows, biggest.dim, biggest.dtype_bytes, problem.optimizer) / 1e9:.3g} GB), "
        f"but the {problem.dev.count} devices offer {have / 1e9:.3g} GB; add devices or use a smaller optimizer")


def placements(problem: Problem, assignment) -> tuple[EmbeddingPlacement, ...]:
    """The Plan's view of an assignment: per table its sharding, shards (device, rows, cols, memory) and kernel."""
    dev = problem.dev
    out = []
    for t, (o, positions) in enumerate(assignment):
        table, option = problem.tables[t], problem.options[t][o]
        memory = "host" if option.host else "hbm"
        shards: list[EmbeddingShard] = []
        sharding = option.sharding
        if option.sharding == "data_parallel":
            shards = [EmbeddingShard(d, (0, table.rows), (0, table.dim), memory) for d in dev.ids]
        elif option.scope == "device":
            cols = even_split(table.dim, option.units)
            for (c0, c1), p in zip(cols, positions):
                shards.append(EmbeddingShard(dev.ids[p], (0, table.rows), (c0, c1), memory))
            if option.sharding == "column_wise" and len({dev.node_of[p] for p in positions}) == 1 \
                    and len(dev.nodes) > 1:
                sharding = "table_column_wise"  # TorchRec's TWCW: every column shard inside one node
        else:
            members = dev.nodes[positions[0]] if option.scope == "node" else range(dev.count)
            for (r0, r1), i in zip(even_split(table.rows, len(members)), members):
                shards.append(EmbeddingShard(dev.ids[i], (r0, r1), (0, table.dim), memory))
        kernel = "fused_uvm" if option.host else "fused"
        out.append(EmbeddingPlacement(table=table.name, sharding=sharding, shards=tuple(shards),
                                      compute_kernel=kernel))
    return tuple(out)
