"""Plan quality of `planner plan`, under our cost model.

    python benchmarks/plan_quality.py published [--time-limit S]   # vs hand-tuned configs
    python benchmarks/plan_quality.py mixed [--time-limit S]       # mixed clusters vs baselines
    ... --markdown FILE appends the tables to FILE

published: for each run of benchmarks/data/calibration_runs.json, under the runtime of its source, the
published configuration (tp, pp, dp, global batch, recompute, ZeRO as stated; what the source leaves open
spans the runtime's choices, benchmarks/reference_runs.py) is timed by the cost model at its fastest, and so
is the plan the search returns for the same model, cluster, batch and runtime. Two times for the published
configuration: with the 1F1B schedule, and with any schedule the runtime runs (the search plans both).

The plan column names the planner's configuration: ``vpp V`` when it interleaves, and for a stage served by
several device types (heterogeneous data parallelism) its replica groups.

mixed: on clusters mixing GPU types, the plan is compared with (a) the best plan on the fastest type alone,
(b) the plan's own layout with a uniform layer split (Megatron-LM's balanced split), (c) the Metis-style
baseline of ``benchmarks/metis_baseline.py``, and with the best plan on every subset of the cluster's types.
Every returned plan is re-checked for memory feasibility.
"""

from __future__ import annotations

import argparse
import itertools
import json
import platform
import sys
import time
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from metis_baseline import metis_plan  # noqa: E402
from reference_runs import Run, load_runs  # noqa: E402
from planner.builders import build  # noqa: E402
from planner.cost import balanced_split, estimate_pipeline  # noqa: E402
from planner.cost.calibration import calibration_for  # noqa: E402
from planner.errors import PlannerError  # noqa: E402
from planner.graph import import_model_proto  # noqa: E402
from planner.hardware import load_cluster  # noqa: E402
from planner.search import search  # noqa: E402
from planner.types import ParallelConfig, PipelineSpec, ReplicaSpec, StageSpec  # noqa: E402



def gpt(layers: int, hidden: int, heads: int, seq: int = 2048, vocab: int = 51200, ffn: int | None = None):
    settings = {"layers": layers, "hidden": hidden, "heads": heads, "vocab": vocab, "seq_len": seq}
    if ffn:
        settings["ffn"] = ffn
    return import_model_proto(build("gpt", settings), {"batch": 1, "seq": seq}, name=f"gpt-{layers}x{hidden}")


def spec_of(plan) -> PipelineSpec:
    """The PipelineSpec a plan describes (a heterogeneous stage's replica groups included)."""
    stages = tuple(StageSpec(s.first_layer, s.last_layer,
                             tuple(ReplicaSpec(devices=tuple(r.devices), tp=r.tp, dp=r.dp, batch_share=r.batch_share)
                                   for r in s.replicas)
                             or (ReplicaSpec(devices=s.devices, tp=s.tp, dp=s.dp),))
                   for s in plan.stages)
    return PipelineSpec(stages=stages, global_batch=plan.global_batch, micro_batch=plan.micro_batch, vpp=plan.vpp,
                        zero=plan.zero, recompute=plan.stages[0].recompute, sequence_parallel=plan.sequence_parallel,
                        schedule=plan.schedule, optimizer=plan.optimizer, dtype=plan.dtype, runtime=plan.runtime)


def published(time_limit_s: float) -> list[str]:
    """Each reference run's published configuration against the plan the search finds for the same model,
    cluster, batch and runtime. The published time is the fastest configuration the source allows (what it
    leaves open spans the runtime's choices; benchmarks/reference_runs.py), with the 1F1B schedule and with
    any schedule the runtime runs."""
    rows = ["| run | runtime | GPUs | published (1F1B) s | published (best schedule) s | planner s | "
            "speed-up vs best | proven | gap to bound | planner's plan | search s |",
            "|---|---|---|---|---|---|---|---|---|---|---|"]
    for run in (Run(r) for r in load_runs()):
        cal = calibration_for(run.device, run.runtime)
        allowed = run.predict(cal)
        one_f_one_b = [c for c in run.configurations if c.vpp == 1]
        pub_1f1b = run.predict(cal, tuple(one_f_one_b))
        start = time.perf_counter()
        result = search(run.model, run.cluster, run.run["global_batch"], time_limit_s=time_limit_s,
                        pinned=ParallelConfig(global_batch=run.run["global_batch"], tp=0, pp=0, dp=0,
                                              runtime=run.runtime))
        took = time.perf_counter() - start
        best = result.best
        check = estimate_pipeline(run.model, run.cluster, spec_of(best))
        assert check.feasible and abs(check.iteration_time_s - best.iteration_time_s) <= 1e-9 * best.iteration_time_s
        plan = (f"tp{best.stages[0].tp} pp{len(best.stages)} dp{best.stages[0].dp} mb{best.micro_batch} "
                f"ZeRO-{best.zero} {best.stages[0].recompute}{' sp' if best.sequence_parallel else ''}"
                f"{f' vpp{best.vpp}' if best.vpp > 1 else ''}")
        line = (f"| {run.id} | {run.runtime} | {run.run['gpus']} | {pub_1f1b.low_s:.3f} | {allowed.low_s:.3f} | "
                f"{best.iteration_time_s:.3f} | {allowed.low_s / best.iteration_time_s:.3f}x | "
                f"{result.proven_optimal} | {best.iteration_time_s / result.lower_bound_s - 1:.2%} | {plan} | "
                f"{took:.1f} |")
        print(line, flush=True)
        rows.append(line)
    return rows


MIXED = [
    ("GPT 13B", (40, 5120, 40), ["dgx-a100-80gb*4", "hgx-v100-32gb*4"], 512),
    ("GPT 6.7B", (32, 4096, 32), ["dgx-h100*2", "dgx-a100-80gb*2", "hgx-v100-32gb*2"], 256),
    ("GPT 2.7B", (32, 2560, 32), ["dgx-a100-40gb*2", "hgx-v100-16gb*4"], 256),
    ("GPT 13B", (40, 5120, 40), ["dgx-h100*4", "hgx-v100-32gb*8"], 512),
    # small models, where data parallelism over both types (one stage, replica groups) competes with pipelines
    ("GPT 1.3B", (24, 2048, 16), ["dgx-h100*2", "dgx-a100-80gb*2"], 128),
    ("GPT 1.3B", (24, 2048, 16), ["dgx-a100-80gb*2", "hgx-v100-32gb*2"], 512),
]


def describe(plan) -> str:
    """Stages as device/tp x dp (a heterogeneous stage as its groups joined by '+'), and vpp if > 1."""
    parts = []
    for s in plan.stages:
        groups = s.replicas or (s,)
        parts.append("+".join(f"{g.dp}x{g.device_type}/tp{g.tp}" for g in groups))
    return f"{len(plan.stages)} stage(s): " + ", ".join(parts) + (f", vpp {plan.vpp}" if plan.vpp > 1 else "")


def _time(fn):
    start = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - start


def mixed(time_limit_s: float) -> list[str]:
    rows = ["| model | cluster | global batch | planner s | proven | fastest type alone s | uniform split s | "
            "Metis-style s | best subset s | vs fastest alone | vs uniform | vs Metis | search s | plan |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for name, (layers, hidden, heads), parts, gb in MIXED:
        model = gpt(layers, hidden, heads)
        cluster = load_cluster("+".join(parts))
        result, took = _time(lambda: search(model, cluster, gb, time_limit_s=time_limit_s, top_k=3))
        best = result.best
        for p in result.plans:  # no returned plan is infeasible under the memory model
            check = estimate_pipeline(model, cluster, spec_of(p))
            assert check.feasible, check.reason
        subsets = {}
        for size in range(1, len(parts)):
            for subset in itertools.combinations(parts, size):
                try:
                    subsets[subset] = search(model, load_cluster("+".join(subset)), gb,
                                             time_limit_s=time_limit_s).best.iteration_time_s
                except PlannerError:
                    subsets[subset] = float("inf")
        fastest_part = max(parts, key=lambda p: max(load_cluster(p).groups[0].node.device.peak_flops_per_s.values()))
        alone = subsets[(fastest_part,)]
        best_subset = min(subsets.values())
        bounds = balanced_split(model, len(best.stages))
        uniform_spec = spec_of(best)
        uniform_spec = replace(uniform_spec, stages=tuple(replace(s, first_layer=f, last_layer=l)
                                                          for s, (f, l) in zip(uniform_spec.stages, bounds)))
        uniform = estimate_pipeline(model, cluster, uniform_spec)
        uniform_s = uniform.iteration_time_s if uniform.feasible else float("inf")
        metis = metis_plan(model, cluster, gb)
        metis_s = metis.estimate.iteration_time_s if metis.estimate is not None else float("inf")
        assert best.iteration_time_s <= best_subset * (1 + 1e-9), "slower than a plan on a subset"
        t = best.iteration_time_s
        line = (f"| {name} | {'+'.join(parts)} | {gb} | {t:.3f} | {result.proven_optimal} | {alone:.3f} | "
                f"{uniform_s:.3f} | {metis_s:.3f} | {best_subset:.3f} | {alone / t:.2f}x | {uniform_s / t:.2f}x | "
                f"{metis_s / t:.2f}x | {took:.1f} | {describe(best)} |")
        print(line, flush=True)
        rows.append(line)
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("which", choices=("published", "mixed"))
    parser.add_argument("--time-limit", type=float, default=60.0, help="per search, seconds")
    parser.add_argument("--markdown", help="append the table to this file")
    args = parser.parse_args()
    rows = published(args.time_limit) if args.which == "published" else mixed(args.time_limit)
    if args.markdown:
        with open(args.markdown, "a", encoding="utf-8") as out:
            out.write(f"\n`python benchmarks/plan_quality.py {args.which} --time-limit {args.time_limit:g}` on "
                      f"{platform.node()}, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}\n\n")
            out.write("\n".join(rows) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
