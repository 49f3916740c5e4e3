"""Time one cost-model estimate of GPT-3 175B on 1024 A100s (dgx-a100-80gb*128), as the search calls it.

    python benchmarks/bench_estimate.py [--repeat N]

The model is built with ``planner models build``'s builder (96 layers, hidden 12288, 96 heads, seq 2048,
vocab 51200) and imported once. Three cases: every choice pinned with the 1F1B schedule; every choice
pinned with the interleaved schedule (vpp 6, the longest simulation); and micro-batch, recompute, vpp, ZeRO
left to resolve (the estimator ranks every candidate and simulates the best). "first" is a cold call
(layer costs and schedule programs not yet cached); the medians are over repeated calls, in wall-clock and
in process CPU time (the CPU time is what a loaded, shared machine does not inflate; the load average is
printed).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from planner.builders import build  # noqa: E402
from planner.cost import estimate  # noqa: E402
from planner.graph import import_model_proto  # noqa: E402
from planner.hardware import load_cluster  # noqa: E402
from planner.types import ParallelConfig  # noqa: E402

CASES = {
    "pinned, 1f1b": ParallelConfig(global_batch=1536, tp=8, pp=16, dp=8, micro_batch=1, vpp=1, zero=1,
                                   recompute="selective", sequence_parallel=True, schedule="1f1b"),
    "pinned, interleaved vpp 6": ParallelConfig(global_batch=1536, tp=8, pp=16, dp=8, micro_batch=1, vpp=6, zero=1,
                                                recompute="selective", sequence_parallel=True),
    "resolved (mb, recompute, vpp, zero)": ParallelConfig(global_batch=1536, tp=8, pp=16, dp=8),
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=20)
    args = parser.parse_args(argv)
    started = time.perf_counter()
    proto = build("gpt", {"layers": 96, "hidden": 12288, "heads": 96, "vocab": 51200, "seq_len": 2048})
    model = import_model_proto(proto, {"batch": 1}, name="gpt3-175b")
    cluster = load_cluster("dgx-a100-80gb*128")
    print(f"# GPT-3 175B ({model.params / 1e9:.1f}B params, {len(model.layers)} layers) on {cluster.num_devices} "
          f"A100s; model built and imported in {time.perf_counter() - started:.1f} s")
    print(f"# load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    print("| case | first call ms | median wall ms | median CPU ms | max wall ms | iteration s | resolved |")
    print("|---|---|---|---|---|---|---|")
    for name, config in CASES.items():
        t0 = time.perf_counter()
        est = estimate(model, cluster, config)
        first = time.perf_counter() - t0
        times, cpu = [], []
        for _ in range(args.repeat):
            t0, c0 = time.perf_counter(), time.process_time()
            estimate(model, cluster, config)
            times.append(time.perf_counter() - t0)
            cpu.append(time.process_time() - c0)
        c = est.config
        print(f"| {name} | {first * 1e3:.1f} | {statistics.median(times) * 1e3:.1f} | "
              f"{statistics.median(cpu) * 1e3:.1f} | {max(times) * 1e3:.1f} | "
              f"{est.iteration_time_s:.3f} | mb {c.micro_batch}, {c.recompute}, vpp {c.vpp}, zero {c.zero} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
