"""Plan a model from Python: build a small GPT, load it, search the best plan on a cluster, print it in
every format a training framework reads, save it and load it back.

    python examples/plan_from_python.py [--cluster dgx-a100-80gb*2] [--global-batch 256]
"""

from __future__ import annotations

import argparse
import os
import tempfile

import planner
from planner.builders import build, save
from planner.report import render


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cluster", default="dgx-a100-80gb*2")
    parser.add_argument("--global-batch", type=int, default=256)
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as folder:
        # a GPT with 8 blocks of hidden size 1024 (no weight data is written: planner never needs it)
        path = os.path.join(folder, "gpt.onnx")
        save(build("gpt", {"layers": 8, "hidden": 1024, "heads": 16, "vocab": 32000, "seq_len": 1024}), path)
        model = planner.load_model(path, dims={"batch": 1, "seq": 1024})
        cluster = planner.load_cluster(args.cluster)

        best = planner.plan(model, cluster, global_batch=args.global_batch)
        print(render(best, "table"))
        print(f"iteration {best.iteration_time_s * 1e3:.2f} ms, {best.throughput_samples_per_s:.1f} samples/s, "
              f"{len(best.stages)} pipeline stages")
        print(render(best, "megatron"))

        # plans are JSON documents (schema: `planner schema`); they round-trip exactly
        saved = os.path.join(folder, "plan.json")
        with open(saved, "w", encoding="utf-8") as handle:
            handle.write(best.to_json())
        with open(saved, encoding="utf-8") as handle:
            again = planner.Plan.from_json(handle.read())
        assert again == best
        print(f"saved and reloaded {saved}: identical")


if __name__ == "__main__":
    main()
