"""Search time of `planner plan` (wall clock on this machine, one process).

    python benchmarks/bench_search.py targets      # GPT-3 175B on 1024 A100s; a 3-type 512-GPU cluster
    python benchmarks/bench_search.py curves       # time over layers, GPUs and GPU types
    python benchmarks/bench_search.py all --markdown benchmarks/results/search_times.md

Each point builds a GPT-style ONNX graph with `planner.builders`, imports it, loads the cluster shorthand and
runs `planner.search.search` (optionally with a time limit); it prints one line per point: seconds, whether
the plan is proven optimal, the gap to the lower bound, the candidates examined. Wall seconds are what the
targets name; CPU seconds of the process are printed too, since a shared machine stretches wall time.
"""

from __future__ import annotations

import argparse
import platform
import sys
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from planner.builders import build  # noqa: E402
from planner.graph import import_model_proto  # noqa: E402
from planner.hardware import load_cluster  # noqa: E402
from planner.search import search  # noqa: E402


@dataclass(frozen=True)
class Point:
    label: str
    layers: int
    hidden: int
    heads: int
    cluster: str
    global_batch: int
    time_limit_s: float | None = None
    seq: int = 2048


def model_for(point: Point):
    proto = build("gpt", {"layers": point.layers, "hidden": point.hidden, "heads": point.heads, "vocab": 51200,
                          "seq_len": point.seq})
    return import_model_proto(proto, {"batch": 1, "seq": point.seq}, name=f"gpt-{point.layers}x{point.hidden}")


def measure(point: Point) -> dict:
    model = model_for(point)
    cluster = load_cluster(point.cluster)
    start, cpu = time.perf_counter(), time.process_time()
    result = search(model, cluster, point.global_batch, time_limit_s=point.time_limit_s)
    elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu
    best = result.best
    return {"label": point.label, "seconds": elapsed, "cpu_s": cpu, "devices": cluster.num_devices,
            "types": len(cluster.device_types), "layers": len(model.layers), "iteration_s": best.iteration_time_s,
            "proven": result.proven_optimal, "gap": best.iteration_time_s / result.lower_bound_s - 1.0,
            "candidates": result.candidates_evaluated,
            "plan": f"pp={len(best.stages)} " + ",".join(sorted({f'{s.device_type}/tp{s.tp}' for s in best.stages}))
                    + f" dp={best.stages[0].dp} mb={best.micro_batch} zero={best.zero}"
                    + f" rc={best.stages[0].recompute}" + (f" vpp={best.vpp}" if best.vpp > 1 else "")}


TARGETS = [
    Point("GPT-3 175B, 1024 x A100-80GB (target <= 10 s)", 96, 12288, 96, "dgx-a100-80gb*128", 1536),
    Point("GPT-3 175B, 512 GPUs: 168 H100 + 176 A100 + 168 V100 (target <= 30 s)", 96, 12288, 96,
          "dgx-h100*21+dgx-a100-80gb*22+hgx-v100-32gb*21", 1536, time_limit_s=28),
    Point("GPT 13B, 512 GPUs: 168 H100 + 176 A100 + 168 V100 (target <= 30 s)", 40, 5120, 40,
          "dgx-h100*21+dgx-a100-80gb*22+hgx-v100-32gb*21", 1024, time_limit_s=28),
]

LAYER_CURVE = [Point(f"layers={n}", n, 4096, 32, "dgx-a100-80gb*16", 512, time_limit_s=60)
               for n in (12, 24, 48, 96, 128, 256)]
GPU_CURVE = [Point(f"gpus={8 * n}", 40, 5120, 40, f"dgx-a100-80gb*{n}", 2048, time_limit_s=60)
             for n in (1, 4, 16, 64, 256, 1024)]
TYPE_CURVE = [Point(f"types={k}", 40, 5120, 40, c, 1024, time_limit_s=60) for k, c in (
    (1, "dgx-a100-80gb*16"), (2, "dgx-a100-80gb*8+hgx-v100-32gb*8"),
    (3, "dgx-h100*6+dgx-a100-80gb*5+hgx-v100-32gb*5"),
    (4, "dgx-h100*4+dgx-a100-80gb*4+hgx-v100-32gb*4+dgx-a100-40gb*4"))]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("which", choices=("targets", "curves", "all"))
    parser.add_argument("--markdown", help="also append a markdown table of the results to this file")
    args = parser.parse_args()
    points = (TARGETS if args.which in ("targets", "all") else []) + \
        (LAYER_CURVE + GPU_CURVE + TYPE_CURVE if args.which in ("curves", "all") else [])
    rows = []
    for point in points:
        row = measure(point)
        rows.append(row)
        print(f"{row['seconds']:8.2f} s ({row['cpu_s']:.2f} s CPU)  {row['label']}: {row['devices']} devices, {row['layers']} layers, "
              f"iteration {row['iteration_s']:.4g} s, proven={row['proven']}, gap {row['gap']:.2%}, "
              f"{row['candidates']} candidates; {row['plan']}", flush=True)
    if args.markdown:
        with open(args.markdown, "a", encoding="utf-8") as out:
            out.write(f"\n`python benchmarks/bench_search.py {args.which}` on {platform.node()} "
                      f"({platform.processor() or platform.machine()}, Python {platform.python_version()}), "
                      f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}\n\n")
            out.write("| point | devices | layers | search s | proven | gap to bound | candidates | plan |\n")
            out.write("|---|---|---|---|---|---|---|---|\n")
            for r in rows:
                out.write(f"| {r['label']} | {r['devices']} | {r['layers']} | {r['seconds']:.2f} | {r['proven']} | "
                          f"{r['gap']:.2%} | {r['candidates']} | {r['plan']} |\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
