"""A digest of the plans and estimates of fixed benchmark cases, to show that a change which should not move any
plan (a refactor) leaves them byte-identical, and to list the cases a change does move.

    python benchmarks/plan_digest.py            # one line per case: name, sha256 of its JSON, iteration time
    python benchmarks/plan_digest.py --json     # the same as one JSON document

Run it in two trees (e.g. ``git worktree add /tmp/before REV``) and compare the lines. Each plan's JSON is
``Plan.to_json()`` without ``search.time_s`` (wall-clock, the one field that differs between runs); every case
runs to completion (no time limit), so nothing else depends on the machine's speed.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from dataclasses import asdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import planner  # noqa: E402
from planner.builders import build  # noqa: E402
from planner.graph import import_model_proto  # noqa: E402
from planner.hardware import load_cluster  # noqa: E402
from planner.types import ParallelConfig  # noqa: E402

MIXED = "dgx-h100*21+dgx-a100-80gb*22+hgx-v100-32gb*21"


def _gpt(layers: int, hidden: int, heads: int):
    proto = build("gpt", {"layers": layers, "hidden": hidden, "heads": heads, "vocab": 51200, "seq_len": 2048})
    return import_model_proto(proto, {"batch": 1, "seq": 2048}, name=f"gpt-{layers}x{hidden}")


def _plan_doc(model, cluster: str, global_batch: int) -> dict:
    doc = planner.plan(model, load_cluster(cluster), global_batch=global_batch).to_dict()
    doc["search"].pop("time_s", None)
    return doc


def _estimate_doc(model, cluster: str, config: ParallelConfig) -> dict:
    return asdict(planner.estimate(model, load_cluster(cluster), config))


def cases() -> dict[str, callable]:
    models = ROOT / "models"
    return {
        "plan gpt-1.3b, dgx-a100-80gb*2, gb 256 (README)":
            lambda: _plan_doc(planner.load_model(str(models / "gpt-1.3b.onnx")), "dgx-a100-80gb*2", 256),
        "plan GPT-3 175B, dgx-a100-80gb*128, gb 1536":
            lambda: _plan_doc(_gpt(96, 12288, 96), "dgx-a100-80gb*128", 1536),
        "plan GPT 13B, 168 H100 + 176 A100 + 168 V100, gb 1024":
            lambda: _plan_doc(_gpt(40, 5120, 40), MIXED, 1024),
        "plan dlrm-criteo, dgx-a100-80gb*2, gb 65536 (embedding tables)":
            lambda: _plan_doc(planner.load_model(str(models / "dlrm-criteo.onnx")), "dgx-a100-80gb*2", 65536),
        "estimate GPT-3 175B, dgx-a100-80gb*128, tp 8 pp 16 dp 8":
            lambda: _estimate_doc(_gpt(96, 12288, 96), "dgx-a100-80gb*128",
                                  ParallelConfig(global_batch=1536, tp=8, pp=16, dp=8)),
        "estimate dlrm-criteo, dgx-a100-80gb*2, dp 16":
            lambda: _estimate_doc(planner.load_model(str(models / "dlrm-criteo.onnx")), "dgx-a100-80gb*2",
                                  ParallelConfig(global_batch=65536, dp=16)),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    out = {}
    for name, make in cases().items():
        doc = make()
        text = json.dumps(doc, sort_keys=True, default=str)
        out[name] = {"sha256": hashlib.sha256(text.encode()).hexdigest()[:16],
                     "iteration_time_s": doc.get("iteration_time_s")}
        if not args.json:
            print(f"{out[name]['sha256']}  {out[name]['iteration_time_s']:.6g} s  {name}", flush=True)
    if args.json:
        print(json.dumps(out, indent=1, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
