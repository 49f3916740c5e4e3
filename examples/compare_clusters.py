"""Compare clusters for one model: plan it on each and print iteration time, throughput, devices used and,
where the node profile has a price, the cost of a million samples.

    python examples/compare_clusters.py [--clusters "dgx-a100-80gb*1" "dgx-h100*1" "hgx-v100-32gb*2"]
"""

from __future__ import annotations

import argparse
import os
import tempfile

import planner
from planner.builders import build, save


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clusters", nargs="+", default=["dgx-a100-80gb*1", "dgx-h100*1", "hgx-v100-32gb*2"])
    parser.add_argument("--global-batch", type=int, default=128)
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "gpt.onnx")
        save(build("gpt", {"layers": 12, "hidden": 1024, "heads": 16, "vocab": 32000, "seq_len": 1024}), path)
        model = planner.load_model(path, dims={"batch": 1, "seq": 1024})

        rows = []
        for shorthand in args.clusters:
            cluster = planner.load_cluster(shorthand)
            best = planner.plan(model, cluster, global_batch=args.global_batch)
            price_per_hour = sum((g.price_per_node_hour or 0.0) * g.count for g in cluster.groups)
            cost = (price_per_hour / 3600.0 * 1e6 / best.throughput_samples_per_s) if price_per_hour else None
            rows.append((shorthand, best, cost))

        print(f"{'cluster':<22} {'devices':>7} {'iteration':>11} {'samples/s':>10} {'tp/pp/dp':>9}  $/1M samples")
        for shorthand, best, cost in rows:
            stage = best.stages[0]
            shape = f"{stage.tp}/{len(best.stages)}/{stage.dp}"
            print(f"{shorthand:<22} {best.num_devices:>7} {best.iteration_time_s * 1e3:>8.2f} ms "
                  f"{best.throughput_samples_per_s:>10.1f} {shape:>9}  "
                  + (f"{cost:.2f}" if cost is not None else "-"))
        fastest = max(rows, key=lambda r: r[1].throughput_samples_per_s)
        print(f"fastest: {fastest[0]} ({fastest[1].bottleneck or 'no bottleneck note'})")


if __name__ == "__main__":
    main()
