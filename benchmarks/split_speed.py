"""How long `planner split` takes on large graphs (no weight data is read, so size is node count).

    python benchmarks/split_speed.py [--layers 96] [--stages 8]

Builds a GPT of the given depth (GPT-3 175B shape by default: hidden 12288, 96 heads), imports it, splits it
evenly into pipeline stages and writes the stage files to a temporary folder. Prints seconds per step.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

import planner
from planner.builders import build, save
from planner.export.stage_files import manifest, split_plan, write_split
from planner.graph.loader import read_model
from planner.plans import Plan, SearchInfo, StagePlan


def even_plan(model, stages: int) -> Plan:
    count = len(model.layers)
    sizes = [count // stages + (1 if k < count % stages else 0) for k in range(stages)]
    rows, first = [], 0
    for index, size in enumerate(sizes):
        layers = model.layers[first:first + size]
        rows.append(StagePlan(index=index, first_layer=first, last_layer=first + size - 1,
                              layer_names=tuple(layer.name for layer in layers), device_type="a100-80gb",
                              devices=(index,), tp=1, dp=1, recompute="none", memory_bytes_per_device=0.0,
                              time_s=0.0, layer_kinds=tuple(layer.kind for layer in layers)))
        first += size
    return Plan(model={"name": model.name, "params": model.params, "flops_per_sample": model.flops_forward},
                cluster={"name": "bench", "num_devices": stages}, global_batch=stages, micro_batch=1,
                num_micro_batches=stages, schedule="1f1b", zero=0, iteration_time_s=0.0,
                throughput_samples_per_s=0.0, stages=tuple(rows),
                breakdown={k: 0.0 for k in ("compute_s", "tp_comm_s", "pp_comm_s", "dp_comm_s", "bubble_s",
                                            "optimizer_s", "embedding_s")}, search=SearchInfo())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=96)
    parser.add_argument("--hidden", type=int, default=12288)
    parser.add_argument("--heads", type=int, default=96)
    parser.add_argument("--stages", type=int, default=8)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "gpt.onnx")
        t0 = time.perf_counter()
        save(build("gpt", {"layers": args.layers, "hidden": args.hidden, "heads": args.heads}), path)
        t1 = time.perf_counter()
        model = planner.load_model(path, dims={"batch": 1, "seq": 2048})
        t2 = time.perf_counter()
        plan = even_plan(model, args.stages)
        onnx_model = read_model(path)
        stages = split_plan(onnx_model, plan, model)
        t3 = time.perf_counter()
        write_split(os.path.join(folder, "out"), manifest(path, plan, stages), stages, force=False)
        t4 = time.perf_counter()
        nodes = len(onnx_model.graph.node)
    print(f"gpt {args.layers} layers, hidden {args.hidden}: {nodes} nodes, {len(model.layers)} pipeline units, "
          f"{args.stages} stages")
    print(f"build {t1 - t0:.2f} s, import {t2 - t1:.2f} s, split {t3 - t2:.2f} s, write {t4 - t3:.2f} s")


if __name__ == "__main__":
    main()
