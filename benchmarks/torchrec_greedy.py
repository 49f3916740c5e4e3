"""A TorchRec-style greedy embedding planner, as the baseline for bench_embeddings.py (benchmarks only).

What it imitates (TorchRec's planner: EmbeddingEnumerator + EmbeddingPerfEstimator + GreedyProposer +
GreedyPerfPartitioner): every table is offered table-wise, row-wise, table-row-wise, column-wise and
data-parallel; each option's cost comes from a perf model that assumes every device is the *same* device
(the first device's bandwidths: TorchRec's Topology has one compute device type and one HBM bandwidth);
the proposer picks, per table, the option with the lowest estimated total cost; the partitioner sorts the
tables by that cost, largest first, and puts each shard on the device with the least estimated load that has
the memory. Its placement is then scored by *our* cost model (which knows the real devices), so the
comparison isolates the planning algorithm.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import numpy as np

from planner.embeddings.problem import Problem


def _uniform(problem: Problem) -> Problem:
    """The same problem as seen by a perf model that knows one device type (the first device's numbers)."""
    dev = problem.dev
    n = dev.count
    same = dataclasses.replace(
        dev,
        lookup_Bps=np.full(n, dev.lookup_Bps[0]), host_Bps=np.full(n, dev.host_Bps[0]),
        a2a_s_per_byte=np.full(n, dev.a2a_s_per_byte[0]), a2a_latency_s=np.full(n, dev.a2a_latency_s[0]))
    return Problem(problem.tables, same, problem.global_batch, problem.optimizer, problem.options)


def torchrec_greedy(problem: Problem) -> tuple[tuple[int, tuple[int, ...]], ...] | None:
    """A placement (per table: option index, unit positions) or None when the greedy runs out of memory."""
    seen = _uniform(problem)
    dev = problem.dev
    choice = []
    for t, options in enumerate(problem.options):
        # the proposer: the cheapest option by total estimated cost (sum over the devices it touches)
        costs = []
        for o, option in enumerate(options):
            if option.host:
                costs.append(np.inf)  # TorchRec only falls back to UVM when HBM is exhausted
                continue
            unit = seen.unit(t, o, 0 if option.scope != "node" else seen.node_positions[0])
            a2a = seen.dev.a2a_s_per_byte[unit.devices] * (unit.ids_recv_bytes + 2 * unit.pool_send_bytes)
            costs.append(float(np.sum(unit.compute_s + a2a)) * option.units)
        choice.append(int(np.argmin(costs)))
    order = sorted(range(len(choice)), key=lambda t: (-_cost(seen, t, choice[t]), t))
    load = np.zeros(dev.count)  # the perf model's estimate of each device's load
    hbm = np.zeros(dev.count)
    host = np.zeros(dev.count)
    positions: list[list[int]] = [[] for _ in choice]
    for t in order:
        placed = _place(problem, seen, t, choice[t], load, hbm, host)
        if placed is None:  # out of HBM: TorchRec retries the table in host memory (UVM)
            fallback = [o for o, option in enumerate(problem.options[t])
                        if option.host and option.sharding == problem.options[t][choice[t]].sharding]
            fallback += [o for o, option in enumerate(problem.options[t]) if option.host]
            for o in fallback:
                placed = _place(problem, seen, t, o, load, hbm, host)
                if placed is not None:
                    choice[t] = o
                    break
        if placed is None:
            return None
        positions[t] = placed
    return tuple((choice[t], tuple(positions[t])) for t in range(len(choice)))


def _cost(seen: Problem, t: int, o: int) -> float:
    option = seen.options[t][o]
    unit = seen.unit(t, o, 0 if option.scope != "node" else seen.node_positions[0])
    return float(np.sum(unit.compute_s)) * option.units


def _place(problem: Problem, seen: Problem, t: int, o: int, load: np.ndarray, hbm: np.ndarray,
           host: np.ndarray) -> list[int] | None:
    """Each unit onto the least-loaded position (by the uniform perf model) with memory left."""
    option = problem.options[t][o]
    dev = problem.dev
    chosen: list[int] = []
    for _ in range(option.units):
        candidates: Sequence[int] = problem.positions(option)
        ranked = sorted(candidates, key=lambda p: (float(load[seen.unit(t, o, p).devices].max()), p))
        for p in ranked:
            unit = problem.unit(t, o, p)
            if np.all(hbm[unit.devices] + unit.hbm_bytes <= dev.hbm_capacity_bytes[unit.devices]) and np.all(
                    host[unit.devices] + unit.host_bytes <= dev.host_capacity_bytes[unit.devices]):
                est = seen.unit(t, o, p)
                load[est.devices] += est.compute_s + seen.dev.a2a_s_per_byte[est.devices] * (
                    est.ids_recv_bytes + 2 * est.pool_send_bytes)
                hbm[unit.devices] += unit.hbm_bytes
                host[unit.devices] += unit.host_bytes
                chosen.append(p)
                break
        else:
            for p in chosen:  # undo this table's units
                unit, est = problem.unit(t, o, p), seen.unit(t, o, p)
                load[est.devices] -= est.compute_s + seen.dev.a2a_s_per_byte[est.devices] * (
                    est.ids_recv_bytes + 2 * est.pool_send_bytes)
                hbm[unit.devices] -= unit.hbm_bytes
                host[unit.devices] -= unit.host_bytes
            return None
    return chosen
