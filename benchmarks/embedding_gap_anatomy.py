"""What a generated case's plan spends its time on, term by term, against the bound.

    python benchmarks/embedding_gap_anatomy.py [--seed 2026] [--only 15,48] [--min-gap 0.05] [--out FILE]

Each drawn case (those of ``--only``, else every case) whose default gap exceeds ``--min-gap`` is sharded at the
default budget (``shard.search``, the stages ``shard_tables`` runs at that budget), and every device's time is
split into the cost model's terms (problem.py): base latency and fused collectives' latency, compute, the
all-to-all floor every device pays (ids it sends, pooled outputs it receives) and the all-to-all excess of a
device that receives more ids than it sends or sends more pooled outputs than it receives. Each term is given as
a share of the bound, for the mean device and the slowest one. On a cluster of one device type, a mean device
far above the bound says that the plan carries more work in total than the bound charges, not that it balances
its devices poorly; the excess terms say how much of that the all-to-alls' per-device maxima make up, which the
class LP and MILP charge only on a class's sums.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from embedding_generated import OPTIMIZER, draw_cases  # noqa: E402
from planner.embeddings.devices import device_arrays  # noqa: E402
from planner.embeddings.problem import build_problem  # noqa: E402
from planner.embeddings.shard import search  # noqa: E402
from planner.solver import SolverOptions  # noqa: E402


def anatomy(case, min_gap: float) -> dict | None:
    """The default plan's terms per device as shares of its bound (mean device and slowest device); None where
    the default gap is at most ``min_gap``."""
    dev = device_arrays(case.cluster(), None, None, True)
    problem = build_problem(case.tables, dev, case.global_batch, OPTIMIZER, for_search=True)
    found = search(problem, SolverOptions())
    if found.assignment is None or found.best_s <= found.bound_s * (1.0 + min_gap):
        return None
    loads = problem.evaluate(found.assignment)
    times = problem.device_time_s(loads)
    seconds_per_byte = dev.a2a_s_per_byte
    ids_over, pool_over = problem.a2a_excess_bytes(loads)
    terms = {
        "latency": problem.base_time_s() + loads.latency_s,
        "compute": loads.compute_s,
        "a2a_floor": seconds_per_byte * (loads.ids_send_bytes + 2.0 * loads.pool_recv_bytes),
        "ids_excess": seconds_per_byte * ids_over,
        "pooled_excess": 2.0 * seconds_per_byte * pool_over,
    }
    slowest = int(np.argmax(times))
    shardings = Counter(problem.options[t][o].sharding for t, (o, _) in enumerate(found.assignment))
    return {"case": case.index, "tables": len(case.tables), "gpus": case.gpus, "devices": "+".join(case.devices),
            "plan_s": found.best_s, "bound_s": found.bound_s, "gap": found.best_s / found.bound_s - 1.0,
            "mean_above_bound": float(times.mean()) / found.bound_s - 1.0,
            "mean_shares": {k: float(v.mean()) / found.bound_s for k, v in terms.items()},
            "slowest_shares": {k: float(v[slowest]) / found.bound_s for k, v in terms.items()},
            "shardings": dict(sorted(shardings.items()))}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=2026)
    parser.add_argument("--cases", type=int, default=50)
    parser.add_argument("--only", type=str, default=None, help="comma-separated case indices")
    parser.add_argument("--min-gap", type=float, default=0.05)
    parser.add_argument("--out", type=Path, default=None, help="JSON lines, one per case above --min-gap")
    args = parser.parse_args()
    cases = draw_cases(args.seed, args.cases)
    if args.only:
        cases = [cases[int(i)] for i in args.only.split(",")]
    sink = args.out.open("w") if args.out else None
    try:
        for case in cases:
            row = anatomy(case, args.min_gap)
            if row is None:
                continue
            line = json.dumps(row, sort_keys=True)
            print(line, flush=True)
            if sink:
                sink.write(line + "\n")
                sink.flush()
    finally:
        if sink:
            sink.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
