"""Showcase plans: a registry of named cases, each a model built by ``planner models build``, a cluster, a global
batch and optional pins, planned through the CLI as a user would.

    python benchmarks/showcase.py                 # every case
    python benchmarks/showcase.py NAME [NAME ...]  # some (``--list`` names them)

For each case it prints the command, the wall and CPU time of ``planner plan`` (a fresh process: import, model
load, search), the chosen degrees, the predicted iteration time and the plan's bottleneck sentence (why it is what it
is). The results with their date go to BENCHMARKS.md. Other cases (mixture-of-experts, 8k Llama) join
``CASES`` the same way.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Case:
    family: str  # a `planner models build` family
    keys: dict[str, int | str]  # its --set KEY=VALUE
    cluster: str
    global_batch: int
    pins: tuple[str, ...] = ()  # extra `planner plan` flags
    note: str = ""  # where the case comes from
    reference: dict[str, int] = field(default_factory=dict)  # the degrees a published run used, if any


LLAMA3_405B = {"layers": 126, "hidden": 16384, "heads": 128, "kv_heads": 8, "ffn": 53248, "vocab": 128256}
LLAMA3_70B = {"layers": 80, "hidden": 8192, "heads": 64, "kv_heads": 8, "ffn": 28672, "vocab": 128256}
# Mixtral 8x7B: the moe family's defaults (Jiang et al. 2024, Table 1), sequence 4096
MIXTRAL_8X7B: dict[str, int | str] = {}
# DeepSeek-V3 (arXiv:2412.19437, Sec. 4.2; config.json of deepseek-ai/DeepSeek-V3): 61 layers, hidden 7168,
# 128 heads of MLA, 256 routed + 1 shared expert of width 2048, top-8 sigmoid routing, first 3 layers dense
# (width 18432), vocabulary 129280; sequence 4096 and the final batch of 15360 sequences (Sec. 4.2)
DEEPSEEK_V3: dict[str, int | str] = {
    "layers": 61, "hidden": 7168, "heads": 128, "vocab": 129280, "attention": "mla", "experts": 256, "top_k": 8,
    "shared_experts": 1, "expert_ffn": 2048, "dense_layers": 3, "dense_ffn": 18432, "router": "sigmoid",
    "seq_len": 4096,
}

CASES: dict[str, Case] = {
    "llama3-405b-8k": Case(
        "llama", {**LLAMA3_405B, "seq_len": 8192}, "dgx-h100*2048", 2048,
        note="Llama 3 405B pre-training at 8k on 16,384 H100: 16M tokens per batch = 2048 sequences; the report "
             "ran tp 8, pp 16, dp 128, the first and last stage one layer short, interleaved (Llama 3 Herd of "
             "Models, section 3.3.2 and Table 4)",
        reference={"tp": 8, "pp": 16, "dp": 128}),
    "llama3-405b-128k-cp": Case(
        "llama", {**LLAMA3_405B, "seq_len": 131072}, "dgx-h100*2048", 128,
        note="Llama 3 405B long-context pre-training on 16,384 H100: 16M tokens per batch = 128 sequences of 128k "
             "(Llama 3 Herd of Models, Table 4)",
        reference={"tp": 8, "cp": 16, "pp": 16, "dp": 8}),
    "llama3-70b-1m-cp": Case(
        "llama", {**LLAMA3_70B, "seq_len": 1 << 20}, "dgx-h100*128", 16,
        note="Llama 3 70B dimensions at a 1M-token sequence on 1,024 H100 (128 DGX H100), 16 sequences per batch"),
    "mixtral-8x7b-64h100": Case(
        "moe", MIXTRAL_8X7B, "dgx-h100*8", 256,
        note="Mixtral 8x7B on 8 DGX H100 nodes, 256 sequences of 4096 (the Megatron-Core MoE guide's Mixtral "
             "recipe is tp 1, pp 4, ep 8)",
        reference={"tp": 1, "pp": 4, "ep": 8}),
    "deepseek-v3-2048h800": Case(
        "moe", DEEPSEEK_V3, "dgx-h800*256", 15360,
        note="DeepSeek-V3-like on 256 H800 nodes, 15360 sequences of 4096 (DeepSeek-V3 report, Sec. 3.2 and 4.2)",
        reference={"tp": 1, "pp": 16, "ep": 64, "dp": 128}),
}


def build(case: Case, folder: Path, name: str) -> Path:
    path = folder / f"{name}.onnx"
    sets = [arg for key, value in case.keys.items() for arg in ("--set", f"{key}={value}")]
    subprocess.run([sys.executable, "-m", "planner", "models", "build", case.family, *sets, "--out", str(path)],
                   check=True, cwd=ROOT, capture_output=True)
    return path


def command(case: Case, model: str) -> list[str]:
    return ["planner", "plan", model, "--cluster", case.cluster, "--global-batch", str(case.global_batch),
            *case.pins, "--json"]


def run(name: str, folder: Path) -> dict:
    case = CASES[name]
    model = build(case, folder, name)
    argv = command(case, str(model))
    start, before = time.perf_counter(), resource.getrusage(resource.RUSAGE_CHILDREN)
    done = subprocess.run([sys.executable, "-m", "planner", *argv[1:]], check=True, cwd=ROOT, capture_output=True,
                          text=True)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    plan = json.loads(done.stdout)
    stages = plan["stages"]
    degrees = {"tp": sorted({s["tp"] for s in stages}), "cp": sorted({s.get("cp", 1) for s in stages}),
               "pp": len(stages), "dp": sorted({s["dp"] for s in stages}),
               "ep": sorted({s.get("ep", 1) for s in stages}), "expert_tp": sorted({s.get("expert_tp", 1) for s in stages})}
    return {"case": name, "command": " ".join(argv), "wall_s": wall, "cpu_s": cpu, "degrees": degrees,
            "micro_batch": plan["micro_batch"], "schedule": plan["schedule"], "vpp": plan["vpp"],
            "zero": plan["zero"], "recompute": sorted({s["recompute"] for s in stages}),
            "iteration_time_s": plan["iteration_time_s"], "search_s": plan["search"]["time_s"],
            "proven_optimal": plan["search"]["proven_optimal"], "lower_bound_s": plan["search"]["lower_bound_s"],
            "cp_searched": plan["search"].get("cp_searched"), "vpp_searched": plan["search"].get("vpp_searched"),
            "uneven_stages_searched": plan["search"].get("uneven_stages_searched"),
            "blocks_per_stage": [sum(1 for kind in s.get("layer_kinds", ()) if kind == "block") for s in stages],
            "breakdown": plan["breakdown"],
            "bottleneck": plan["bottleneck"], "reference": case.reference, "note": case.note}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", help="cases to run (default: all)")
    parser.add_argument("--list", action="store_true", help="list the cases")
    args = parser.parse_args(argv)
    if args.list:
        for name, case in CASES.items():
            print(f"{name}: {case.note}")
        return 0
    unknown = [n for n in args.names if n not in CASES]
    if unknown:
        parser.error(f"unknown case(s) {', '.join(unknown)}; known: {', '.join(CASES)}")
    with tempfile.TemporaryDirectory() as folder:
        for name in args.names or list(CASES):
            print(json.dumps(run(name, Path(folder)), indent=2, sort_keys=True), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
