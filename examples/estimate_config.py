"""Estimate a hand-written parallel configuration: Megatron-style tp x pp x dp, then a few variations,
showing the time breakdown and memory of each.

    python examples/estimate_config.py [--cluster dgx-a100-80gb*2]
"""

from __future__ import annotations

import argparse
import os
import tempfile

import planner
from planner.builders import build, save
from planner.units import GIB

PARTS = ("compute_s", "tp_comm_s", "pp_comm_s", "dp_comm_s", "bubble_s", "optimizer_s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cluster", default="dgx-a100-80gb*2")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "llama.onnx")
        save(build("llama", {"layers": 8, "hidden": 2048, "heads": 16, "kv_heads": 4, "vocab": 32000,
                             "seq_len": 2048}), path)
        model = planner.load_model(path, dims={"batch": 1, "seq": 2048})
        cluster = planner.load_cluster(args.cluster)
        print(f"{model.name}: {model.params / 1e9:.2f} B parameters, {len(model.layers)} layers, "
              f"{cluster.num_devices} devices")

        configs = [
            planner.ParallelConfig(global_batch=128, tp=4, pp=2, dp=cluster.num_devices // 8),
            planner.ParallelConfig(global_batch=128, tp=2, pp=2, dp=cluster.num_devices // 4, zero=1,
                                   recompute="selective"),
            # ZeRO-3 runs on DeepSpeed or FSDP2, not on the default runtime (megatron-core: ZeRO 0-1)
            planner.ParallelConfig(global_batch=128, tp=1, pp=1, dp=cluster.num_devices, zero=3,
                                   recompute="full", micro_batch=1, runtime="deepspeed"),
        ]
        header = f"{'tp':>3} {'pp':>3} {'dp':>3}  {'time':>10}  {'memory':>9}  fits  " + "  ".join(
            f"{p[:-2]:>9}" for p in PARTS)
        print(header)
        for config in configs:
            est = planner.estimate(model, cluster, config)
            parts = est.breakdown.to_dict()
            print(f"{config.tp:>3} {config.pp:>3} {config.dp:>3}  {est.iteration_time_s * 1e3:8.2f} ms  "
                  f"{est.memory_per_device_bytes / GIB:6.1f} GiB  {'yes' if est.feasible else 'no ':<4}  "
                  + "  ".join(f"{parts[p] * 1e3:6.2f} ms" for p in PARTS))
            print(f"      resolved: micro-batch {est.config.micro_batch}, zero {est.config.zero}, "
                  f"recompute {est.config.recompute}, sequence parallel {est.config.sequence_parallel}, "
                  f"schedule {est.config.schedule}, runtime {est.config.runtime}")


if __name__ == "__main__":
    main()
