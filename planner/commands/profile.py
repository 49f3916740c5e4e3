"""`planner profile --out FILE.yaml [--device cpu|cuda] [--model MODEL]`: measure this machine."""

from __future__ import annotations

import argparse
import logging
import os
import re
import sys

import yaml

from planner.commands._common import add_dim_flag, add_json_flag, emit_json, parse_dims
from planner.errors import ConfigError
from planner.graph.inputs import check_dims
from planner.hardware import catalog, profiler
from planner.outputs import check_distinct, check_output_file, write_text

HELP = "measure the local device (GEMMs, memory bandwidth, per-op overhead) and write a device profile"
log = logging.getLogger(__name__)


# a profile's device name: shown in plans, written in cluster files (lower case, as the catalog's)
_NAME = re.compile(r"[a-z0-9][a-z0-9._+-]*\Z")


def check_name(name: str | None) -> None:
    """``--name``: lower-case letters, digits and ``. _ + -``, and not a catalog device's (a plan could not
    tell the two apart)."""
    if name is None:
        return
    if not _NAME.match(name):
        raise ConfigError(f"--name {name!r}: use lower-case letters, digits, '.', '_', '+' or '-', starting with a "
                          "letter or digit (it names the device in plans and cluster files)")
    if name in catalog.device_names():
        raise ConfigError(f"--name {name}: the catalog has a device of that name, which plans could not tell apart "
                          f"from this one; choose another, e.g. local-{name}")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", required=True, metavar="FILE.yaml", help="where to write the device profile")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="what to measure (default cpu)")
    parser.add_argument("--model", metavar="MODEL.onnx",
                        help="also time every op of this model (recorded under measured.model_ops)")
    parser.add_argument("--name", help="the profile's device name (default local-DEVICE)")
    parser.add_argument("--threads", type=int, default=0, help="onnxruntime intra-op threads (default: its own)")
    parser.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                        help="wall: elapsed time (default); cpu: thread CPU time, robust on a busy machine "
                             "(needs --threads 1)")
    parser.add_argument("--quick", action="store_true", help="a few sizes only (seconds, for smoke tests)")
    add_dim_flag(parser)
    add_json_flag(parser)


def run(args: argparse.Namespace) -> int:
    out = check_output_file(args.out, "--out", (".yaml", ".yml"))
    check_distinct([("--out", args.out)], [("--model", args.model)])
    dims = parse_dims(args.dim)
    if dims and not args.model:  # --dim binds the model's dimensions; without one it would do nothing
        raise ConfigError("--dim binds the dimensions of --model, and no --model was given; add --model "
                          "MODEL.onnx or drop --dim")
    model = profiler.load_model_file(args.model) if args.model else None  # fail early on a bad model
    check_dims(dims, str(args.model))  # the import's limits, before onnxruntime binds them
    check_name(args.name)
    cores = os.cpu_count() or 1
    if not 0 <= args.threads <= cores:
        raise ConfigError(f"--threads {args.threads}: give 0 (onnxruntime's default) or a count up to this machine's "
                          f"{cores} logical cores")
    runner = profiler.Runner(args.device, args.threads, args.clock)
    runner.check()
    prepared = profiler.prepare_model(runner, model, dims) if model is not None else None  # fail early
    document = profiler.profile_device(args.device, quick=args.quick, threads=args.threads, name=args.name,
                                       clock=args.clock)
    if model is not None:
        measurement = profiler.measure_model(runner, model, dims, prepared)
        document["measured"]["model"] = {"path": str(args.model), "dims": dict(sorted(dims.items())),
                                         "end_to_end_s": float(f"{measurement.end_to_end_s:.6g}")}
        document["measured"]["model_ops"] = [
            {"name": c.name, "op_type": c.op_type, "op_class": c.op_class,
             "seconds": float(f"{measurement.kernel_s.get(c.name, 0.0):.6g}")} for c in measurement.costs]
    write_text(out, "# Device profile written by `planner profile`; usable in a cluster file as\n"
               f"#   node: {{device_file: {out.name}, devices_per_node: 1, inter_node_bandwidth_GBps: 1.25}}\n"
               + yaml.safe_dump(document, sort_keys=False, width=120), "--out")
    summary = {"out": str(out), "device": document["name"],
               "peak_flops_per_s": document["peak_flops_per_s"],
               "memory_bandwidth_Bps": document["memory_bandwidth_Bps"], "op_overhead_s": document["op_overhead_s"]}
    if args.json:
        emit_json(summary)
    else:
        peak = next(iter(document["peak_flops_per_s"].values()))
        bandwidth = document["memory_bandwidth_Bps"]
        sys.stdout.write(f"wrote {out}: peak {peak / 1e9:.1f} GFLOP/s, memory {bandwidth / 1e9:.1f} GB/s, "
                         f"{document['op_overhead_s'] * 1e6:.1f} us per op\n")
    return 0
