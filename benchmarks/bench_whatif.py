"""Benchmark: a 64-point what-if sweep for GPT-3 175B over A100/H100 node mixes.

    python benchmarks/bench_whatif.py [--workers 2] [--out benchmarks/results/whatif.md] [--plot FILE.png]

Target (issue #8): the 64 points finish within 60 s on a 2-core CPU with 2 worker processes.
The model (96 layers, hidden 12288, 96 heads, seq 2048, vocab 51200) is built with planner.builders into a
temporary folder; the cluster file has a DGX A100 80GB group and a DGX H100 group whose node counts are swept
8 x 8. Prices are AWS on-demand list prices, us-east-1 (p4de.24xlarge, 8x A100 80GB: $40.96/h;
p5.48xlarge, 8x H100: $98.32/h), used only to draw the time-cost front.
"""

from __future__ import annotations

import argparse
import datetime
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
from planner.sweep.runner import print_progress  # noqa: E402
from planner.whatif import PointTask, evaluate_point, whatif  # noqa: E402

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
SWEEPS = {"dgx-a100-80gb.count": list(COUNTS), "dgx-h100.count": list(COUNTS)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "whatif.md"))
    parser.add_argument("--plot", help="also write the what-if plot (PNG/SVG)")
    parser.add_argument("--csv", help="also write the sweep's CSV")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        model_path = os.path.join(tmp, "gpt3-175b.onnx")
        cluster_path = os.path.join(tmp, "a100-h100.yaml")
        t0 = time.perf_counter()
        save(build("gpt", GPT3), model_path)
        build_s = time.perf_counter() - t0
        Path(cluster_path).write_text(CLUSTER_YAML)

        t0 = time.perf_counter()
        result = whatif(model_path, cluster_path, GLOBAL_BATCH, SWEEPS, workers=args.workers,
                        progress=print_progress)
        sweep_s = time.perf_counter() - t0

        # where the time goes: one model import, and single points timed in this process
        from planner.whatif import _load_model  # noqa: PLC0415

        t0 = time.perf_counter()
        _load_model(model_path, (("seq", 2048),))
        import_s = time.perf_counter() - t0
        from planner.hardware import catalog, load_cluster  # noqa: PLC0415
        from planner.sweep.keys import parse_sweeps, point_inputs  # noqa: PLC0415

        inputs = point_inputs(load_cluster(cluster_path), GLOBAL_BATCH, {"seq": 2048}, parse_sweeps(SWEEPS), catalog)
        sample = [inputs[i] for i in (9, 27, 45, 63)]  # a spread of cluster sizes, all with both groups
        point_s = []
        for point in sample:
            t0 = time.perf_counter()
            evaluate_point(PointTask(model_path, point))
            point_s.append((dict(point.settings), time.perf_counter() - t0))

    if args.plot:
        from planner.report.plots import write_whatif_plot  # noqa: PLC0415

        write_whatif_plot(result, args.plot)
    if args.csv:
        Path(args.csv).write_text(result.to_csv())

    feasible = [p for p in result.points if p.feasible]
    best = max(feasible, key=lambda p: p.throughput_samples_per_s) if feasible else None
    cheapest = min((p for p in feasible if p.cost_per_million_tokens is not None),
                   key=lambda p: p.cost_per_million_tokens, default=None)
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    command = f"python benchmarks/bench_whatif.py --workers {args.workers}"
    lines = [
        "## What-if sweep: GPT-3 175B over A100/H100 mixes (issue #8)",
        "",
        f"- date: {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC",
        f"- command: `{command}`",
        f"- machine: {cpus} CPUs available, {platform.processor() or platform.machine()}, Python "
        f"{platform.python_version()}",
        f"- sweep: `dgx-a100-80gb.count` x `dgx-h100.count` in {{{', '.join(COUNTS)}}} nodes of 8 GPUs "
        f"({len(result.points)} points), global batch {GLOBAL_BATCH}, seq 2048",
        f"- **wall time of the sweep: {sweep_s:.1f} s** with {args.workers} worker processes "
        f"(target: 60 s on 2 cores) — {'met' if sweep_s <= 60 else 'MISSED'}",
        f"- points: {len(result.points)} ({len(feasible)} feasible); mean {sweep_s * args.workers / len(result.points):.2f} "
        "worker-seconds per point",
        f"- where the time goes: building the ONNX graph {build_s:.1f} s (once, not in the sweep time); importing it "
        f"{import_s:.2f} s (once per worker process); single points planned in one process: "
        + ", ".join(f"{_settings(s)}: {t:.2f} s" for s, t in point_s)
        + f" (median {statistics.median(t for _, t in point_s):.2f} s)",
    ]
    if best:
        lines.append(f"- fastest: {_settings(best.setting)}: {best.throughput_samples_per_s:.2f} samples/s, "
                     f"iteration {best.iteration_time_s:.2f} s, {best.stages}")
    if cheapest:
        lines.append(f"- cheapest per token: {_settings(cheapest.setting)}: "
                     f"${cheapest.cost_per_million_tokens:.3f} per 1M tokens, {cheapest.tokens_per_s:.0f} tokens/s")
    front = result.pareto_front()
    lines.append(f"- Pareto front (time vs cost): {len(front)} points: "
                 + "; ".join(_settings(result.points[i].setting) for i in front))
    lines.append("")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text("\n".join(lines))
    sys.stdout.write("\n".join(lines) + "\n")
    return 0


def _settings(settings: dict) -> str:
    return " ".join(f"{k.split('.')[0].replace('dgx-', '')}={v}" for k, v in settings.items())


if __name__ == "__main__":
    raise SystemExit(main())
