"""Predicted against published training throughput of today's large models (mixtures of experts and long
context) and of torchtitan's published FSDP2 runs of Llama 3 (benchmarks/data/large_model_runs.json).

    python benchmarks/large_model_accuracy.py

For each published run: build its model (``benchmarks/showcase.py``'s model keys, or the run's own ``build``
keys), estimate the published configuration with the cost model as it is (nothing fitted to these runs: held
out, except where a run's ``seen`` names a modelling choice made after its error was seen), and print the
predicted and published figures and the error (predicted / published - 1). A TFLOP/s-per-GPU
figure is 3 x the forward FLOPs per sample x samples/s over the GPUs; the others are tokens/s per GPU. Where the
source reports the peak memory per GPU, the predicted peak is printed beside it (not part of the error).
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from showcase import DEEPSEEK_V3, LLAMA3_405B, MIXTRAL_8X7B  # noqa: E402

from planner.builders import build  # noqa: E402
from planner.cost import estimate  # noqa: E402
from planner.graph import import_model_proto  # noqa: E402
from planner.hardware import load_cluster  # noqa: E402
from planner.types import ParallelConfig  # noqa: E402

DATA = Path(__file__).resolve().parent / "data" / "large_model_runs.json"
MODELS = {"mixtral-8x7b-mcore": MIXTRAL_8X7B, "deepseek-v3-pretraining": DEEPSEEK_V3,
          "llama3-405b-8k": {**LLAMA3_405B, "seq_len": 8192}, "llama3-405b-128k": {**LLAMA3_405B, "seq_len": 131072}}


def predict(run: dict) -> tuple[str, float, float, float]:
    """(metric, predicted, published, predicted peak memory in GiB per device) of one run."""
    keys = run.get("build") or MODELS[run["name"]]
    model = import_model_proto(build(run["family"], dict(keys)), {"batch": 1}, name=run["name"])
    cluster = load_cluster(run["cluster"])
    est = estimate(model, cluster, ParallelConfig(global_batch=run["global_batch"], **run["config"]))
    devices = run["config"]["tp"] * run["config"].get("cp", 1) * run["config"]["pp"] * run["config"]["dp"]
    published = run["published"]
    memory = est.memory_per_device_bytes / 2**30
    if "tflops_per_gpu" in published:
        flops = 3.0 * model.flops_forward * est.throughput_samples_per_s / devices
        return "TFLOP/s per GPU", flops / 1e12, float(published["tflops_per_gpu"]), memory
    seq = int(keys.get("seq_len", 4096))
    tokens = est.throughput_samples_per_s * seq / devices
    return "tokens/s per GPU", tokens, float(published["tokens_per_s_per_gpu"]), memory


def main() -> int:
    runs = json.loads(DATA.read_text())["runs"]
    errors: dict[str, list[tuple[float, bool]]] = {}
    for run in runs:
        metric, predicted, published, memory = predict(run)
        known = run["published"].get("memory_gib")
        beside = f"; memory predicted {memory:.1f} GiB, published {known:.1f} GiB" if known else ""
        status = "seen: a modelling choice followed its error" if run.get("seen") else "held out"
        error = predicted / published - 1
        print(f"{run['name']}: {metric} predicted {predicted:.4g}, published {published:.4g}, "
              f"error {error:+.1%} ({status}){beside}", flush=True)
        runtime = run["config"].get("runtime", "megatron-core")
        errors.setdefault(runtime, []).append((error, not run.get("seen")))
    for runtime, pairs in sorted(errors.items()):
        held = [e for e, out in pairs if out]
        every = [e for e, _ in pairs]
        print(f"# {runtime}: median error {statistics.median(every):+.1%} over {len(every)} runs "
              f"({min(every):+.1%} to {max(every):+.1%}); held out only: "
              + (f"median {statistics.median(held):+.1%} over {len(held)}" if held else "none"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
