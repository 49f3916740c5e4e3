"""Where a generated case's gap comes from: the plan's distance from the optimum, or the bound's.

    python benchmarks/embedding_gap_sources.py [--seed 2026] [--min-gap 0.05] [--max-gpus 64] [--max-tables 200]
        [--time-limit 300] [--out FILE]

The generated-workload benchmark (embedding_generated.py) reports the gap between the plan and the lower bound
the sharder proves at its default budget; a gap above 5% says that one of the two is off, not which. Here each
drawn case whose default gap exceeds ``--min-gap``, on at most ``--max-gpus`` GPUs and ``--max-tables`` tables,
is handed to the exact per-device MILP (``planner.embeddings.milp`` with one bin per device), started from the
default plan and stopped after ``--time-limit`` seconds of wall time (a benchmark's limit: the product never
reads the clock). Where the MILP closes, the optimum splits the gap in two: the plan's excess over the optimum
and the optimum's excess over the default bound. Where it does not, the optimum lies between the MILP's bound
and its best plan, and both shares are given as ranges.

The default plan and bound come from ``shard.search`` at the default budget, the stages ``shard_tables`` runs at
that budget (the deep stage runs only past budget.STAGE_WORK_CAP times it).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from embedding_generated import draw_cases  # noqa: E402
from planner.embeddings.devices import device_arrays  # noqa: E402
from planner.embeddings.milp import device_bins, solve  # noqa: E402
from planner.embeddings.problem import build_problem  # noqa: E402
from planner.embeddings.shard import search  # noqa: E402
from planner.solver import SolverOptions  # noqa: E402


def attribute(case, time_limit_s: float, min_gap: float) -> dict | None:
    """The default plan and bound of ``case``, the exact MILP's best plan and bound after ``time_limit_s``, and
    the gap's shares: the plan's excess over the optimum and the optimum's over the bound (ranges where the
    MILP does not close); None where the default gap is at most ``min_gap``."""
    dev = device_arrays(case.cluster(), None, None, True)
    problem = build_problem(case.tables, dev, case.global_batch, "adagrad", for_search=True)
    cpu = time.process_time()
    found = search(problem, SolverOptions())
    default_cpu_s = time.process_time() - cpu
    if found.best_s <= found.bound_s * (1.0 + min_gap):
        return None
    start = time.perf_counter()
    exact = solve(problem, device_bins(problem), integer=True, time_limit_s=time_limit_s, incumbent=found.assignment)
    exact_wall_s = time.perf_counter() - start
    best_s = min(found.best_s, problem.makespan_s(exact.assignment) if exact.assignment is not None else found.best_s)
    low_s = max(found.bound_s, min(exact.bound_s, best_s))  # the optimum lies in [low_s, best_s]
    closed = exact.status == "optimal"
    if closed:
        low_s = best_s
    return {"case": case.index, "tables": len(case.tables), "gpus": case.gpus, "devices": "+".join(case.devices),
            "plan_s": found.best_s, "bound_s": found.bound_s, "gap": found.best_s / found.bound_s - 1.0,
            "default_cpu_s": default_cpu_s, "exact_status": exact.status, "exact_wall_s": exact_wall_s,
            "optimum_low_s": low_s, "optimum_high_s": best_s,
            # the plan's excess over the optimum, and the optimum's over the default bound: each a range
            "plan_excess": [found.best_s / best_s - 1.0, found.best_s / low_s - 1.0],
            "bound_shortfall": [low_s / found.bound_s - 1.0, best_s / found.bound_s - 1.0]}


def markdown(rows: list[dict]) -> str:
    def share(pair: list[float]) -> str:
        low, high = (100.0 * x for x in pair)
        return f"{low:.2f}" if abs(high - low) < 5e-3 else f"{low:.2f} to {high:.2f}"

    lines = ["| case | tables | GPUs | devices | plan (ms) | bound (ms) | gap % | exact MILP | optimum (ms) | "
             "plan above optimum % | optimum above bound % |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        low, high = r["optimum_low_s"] * 1e3, r["optimum_high_s"] * 1e3
        optimum = f"{high:.4g}" if r["exact_status"] == "optimal" else f"{low:.4g} to {high:.4g}"
        lines.append(f"| {r['case']} | {r['tables']} | {r['gpus']} | {r['devices']} | {r['plan_s'] * 1e3:.4g} | "
                     f"{r['bound_s'] * 1e3:.4g} | {r['gap'] * 100:.2f} | {r['exact_status']} "
                     f"({r['exact_wall_s']:.0f} s) | {optimum} | {share(r['plan_excess'])} | "
                     f"{share(r['bound_shortfall'])} |")
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=2026)
    parser.add_argument("--cases", type=int, default=50)
    parser.add_argument("--only", default="", help="comma-separated case indices (default: every case that "
                                                   "passes the filters)")
    parser.add_argument("--min-gap", type=float, default=0.05, help="cases whose default gap is above this")
    parser.add_argument("--max-gpus", type=int, default=64)
    parser.add_argument("--max-tables", type=int, default=200)
    parser.add_argument("--time-limit", type=float, default=300.0, help="wall seconds per exact MILP")
    parser.add_argument("--results", default="", help="a jsonl of embedding_generated.py for the same seed: "
                        "its gaps pick the cases without running the default search on every case")
    parser.add_argument("--out", default="", help="jsonl of the attributed cases (default: print only)")
    parser.add_argument("--markdown", default="", help="also write the table of cases to this file")
    args = parser.parse_args()
    cases = [c for c in draw_cases(args.seed, args.cases)
             if c.gpus <= args.max_gpus and len(c.tables) <= args.max_tables]
    if args.only:
        keep = {int(i) for i in args.only.split(",")}
        cases = [c for c in cases if c.index in keep]
    if args.results:
        gaps = {r["case"]: r["gap"] for r in map(json.loads, Path(args.results).read_text().splitlines())}
        cases = [c for c in cases if gaps.get(c.index) is None or gaps[c.index] > args.min_gap]
    rows = []
    sink = Path(args.out).open("w") if args.out else None
    for case in cases:
        row = attribute(case, args.time_limit, args.min_gap)
        if row is None:
            continue
        rows.append(row)
        print(json.dumps(row, sort_keys=True), flush=True)
        if sink is not None:
            sink.write(json.dumps(row, sort_keys=True) + "\n")
            sink.flush()
    if sink is not None:
        sink.close()
    text = markdown(rows)
    if args.markdown:
        Path(args.markdown).write_text(text)
    print(text, end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
