"""Benchmark: a 64-point what-if sweep for GPT-3 175B over A100/H100 node mixes.

    python benchmarks/bench_whatif.py [--workers 2] [--time-limit S] [--a100 0,4,...] [--h100 0,4,...]
                                      [--out FILE [--append]] [--plot FILE.png] [--csv FILE]

The run's section is printed; `--out FILE` also writes it to FILE under the section's header (`--append`: after
what FILE holds). The recorded runs are in benchmarks/results/whatif.md, among other sections: copy a run there.

Target (issue #8): the 64 points finish within 60 s on a 2-core CPU with 2 worker processes.
The model (96 layers, hidden 12288, 96 heads, seq 2048, vocab 51200) is built with planner.builders into a
temporary folder; the cluster file has a DGX A100 80GB group and a DGX H100 group whose node counts are swept
8 x 8. Prices are AWS on-demand list prices, us-east-1 (p4de.24xlarge, 8x A100 80GB: $40.96/h;
p5.48xlarge, 8x H100: $98.32/h), used only to draw the time-cost front.
"""

from __future__ import annotations

import argparse
import datetime
import logging
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from planner.builders import build, save  # noqa: E402
from planner.graph import load_model  # noqa: E402
from planner.progress import ProgressBar  # noqa: E402
from planner.sweep.whatif import whatif  # noqa: E402

GPT3 = {"layers": 96, "hidden": 12288, "heads": 96, "seq_len": 2048, "vocab": 51200}
GLOBAL_BATCH = 1536  # GPT-3 175B: 3.2M tokens per batch / 2048 tokens per sample (Brown et al. 2020)
COUNTS = ("0", "4", "8", "12", "16", "24", "32", "48")  # nodes of 8 GPUs
CLUSTER_YAML = """\
groups:
  - node: dgx-a100-80gb
    count: 16
    price_per_node_hour: 40.96   # AWS p4de.24xlarge on-demand, us-east-1
  - node: dgx-h100
    count: 16
    price_per_node_hour: 98.32   # AWS p5.48xlarge on-demand, us-east-1
"""
HEADER = """## What-if sweep: GPT-3 175B over A100/H100 mixes (issue #8)

Model: GPT-3 175B (96 layers, hidden 12288, 96 heads, seq 2048, vocab 51200), global batch 1536. Cluster file:
a DGX A100 80GB group and a DGX H100 group, node counts swept; prices are AWS on-demand list prices (p4de.24xlarge
$40.96/h, p5.48xlarge $98.32/h). Each run below is one invocation of `benchmarks/bench_whatif.py`.

"""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--time-limit", type=float, help="search time limit per point, seconds (default: none)")
    parser.add_argument("--budget", type=int, help="search budget per point, work units (default: none)")
    parser.add_argument("--a100", default=",".join(COUNTS), help="dgx-a100-80gb node counts (comma list)")
    parser.add_argument("--h100", default=",".join(COUNTS), help="dgx-h100 node counts (comma list)")
    parser.add_argument("--out", type=Path, help="also write the section, under its header, to this file")
    parser.add_argument("--append", action="store_true", help="append to --out instead of replacing it")
    parser.add_argument("--plot", help="also write the what-if plot (PNG/SVG)")
    parser.add_argument("--csv", help="also write the sweep's CSV")
    args = parser.parse_args(argv)
    if args.append and not args.out:
        parser.error("--append adds to the file --out names; give --out FILE")
    logging.getLogger("planner").setLevel(logging.ERROR)  # the search's per-candidate warnings
    sweeps = {"dgx-a100-80gb.count": args.a100.split(","), "dgx-h100.count": args.h100.split(",")}

    with tempfile.TemporaryDirectory() as tmp:
        model_path = os.path.join(tmp, "gpt3-175b.onnx")
        cluster_path = os.path.join(tmp, "a100-h100.yaml")
        t0 = time.perf_counter()
        save(build("gpt", GPT3), model_path)
        build_s = time.perf_counter() - t0
        Path(cluster_path).write_text(CLUSTER_YAML)
        t0 = time.perf_counter()
        load_model(model_path)
        import_s = time.perf_counter() - t0

        t0 = time.perf_counter()
        bar = ProgressBar("whatif", delay_s=0.0)
        result = whatif(model_path, cluster_path, GLOBAL_BATCH, sweeps, workers=args.workers,
                        time_limit_s=args.time_limit, progress=bar.count, budget=args.budget)
        bar.close()
        sweep_s = time.perf_counter() - t0

    if args.plot and any(p.feasible for p in result.points):
        from planner.report.plots import write_whatif_plot  # noqa: PLC0415

        write_whatif_plot(result, args.plot)
    if args.csv:
        Path(args.csv).write_text(result.to_csv())

    points = result.points
    feasible = [p for p in points if p.feasible]
    planned = [p for p in points if p.num_devices]  # points with at least one node
    proven = [p for p in feasible if p.proven_optimal]
    gaps = sorted(p.iteration_time_s / p.lower_bound_s - 1.0 for p in feasible if p.lower_bound_s)
    best = max(feasible, key=lambda p: p.throughput_samples_per_s) if feasible else None
    cheapest = min((p for p in feasible if p.cost_per_million_tokens is not None),
                   key=lambda p: p.cost_per_million_tokens, default=None)
    mixed = [p for p in planned if all(v for _, v in p.settings)]
    single = [p for p in planned if not all(v for _, v in p.settings)]
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    command = "python benchmarks/bench_whatif.py " + " ".join(sys.argv[1:] if argv is None else argv)
    limit = "; ".join(x for x in (f"{args.time_limit:g} s per point" if args.time_limit else "",
                                  f"budget {args.budget} work units per point" if args.budget else "") if x) or "none"
    lines = [
        f"### {len(points)} points, {args.workers} workers, search limit: {limit}",
        "",
        f"- date: {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC",
        f"- command: `{command.strip()}`",
        f"- machine: {cpus} CPUs available, Python {platform.python_version()}",
        f"- sweep: `dgx-a100-80gb.count` in {{{args.a100}}} x `dgx-h100.count` in {{{args.h100}}} nodes of 8 GPUs, "
        f"global batch {GLOBAL_BATCH}, seq 2048",
        f"- **wall time of the sweep: {sweep_s:.1f} s** (target: 64 points within 60 s on 2 cores)",
        f"- points: {len(points)}; feasible {len(feasible)} (infeasible: the model does not fit); proven optimal "
        f"under the cost model {len(proven)} of {len(feasible)}; gap of the plan to its proven lower bound: "
        + (f"median {statistics.median(gaps):.2%}, max {gaps[-1]:.2%}" if gaps else "none"),
        f"- where the time goes: building the ONNX graph {build_s:.1f} s (before the sweep); importing it "
        f"{import_s:.2f} s (once per worker process); planning, per point: {_stats(single)} on one device type, "
        f"{_stats(mixed)} on A100+H100 mixes; summed over points {sum(p.search_time_s for p in points):.1f} s "
        f"of worker time",
    ]
    if best:
        lines.append(f"- fastest: {_settings(best.setting)}: {best.throughput_samples_per_s:.2f} samples/s, "
                     f"iteration {best.iteration_time_s:.2f} s, pp={best.pp} tp={best.tp or 'per stage'} dp={best.dp} "
                     f"micro-batch {best.micro_batch}")
    if cheapest:
        lines.append(f"- cheapest per token: {_settings(cheapest.setting)}: "
                     f"${cheapest.cost_per_million_tokens:.3f} per 1M tokens, {cheapest.tokens_per_s:.0f} tokens/s")
    front = result.pareto_front()
    if front:
        lines.append(f"- Pareto front (time vs cost): {len(front)} points: "
                     + "; ".join(_settings(result.points[i].setting) for i in front))
    lines.append("")
    sys.stdout.write("\n".join(lines) + "\n")
    if args.out:  # only where asked: the results file holds every recorded run, which a rewrite would lose
        args.out.parent.mkdir(parents=True, exist_ok=True)
        previous = args.out.read_text() if args.append and args.out.exists() else HEADER
        args.out.write_text(previous + "\n".join(lines) + "\n")
    return 0


def _stats(points: list) -> str:
    if not points:
        return "no points"
    times = sorted(p.search_time_s for p in points)
    return (f"median {statistics.median(times):.1f} s, max {times[-1]:.1f} s ({len(points)} points)")


def _settings(settings: dict) -> str:
    return " ".join(f"{k.split('.')[0].replace('dgx-', '')}={v}" for k, v in settings.items())


if __name__ == "__main__":
    raise SystemExit(main())
