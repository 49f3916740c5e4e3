"""``planner split MODEL --plan PLAN.json --out-dir DIR``: one ONNX model per pipeline stage."""

from __future__ import annotations

import argparse
import sys

from planner.commands._common import add_dim_flag, add_json_flag, emit_json, parse_dims
from planner.errors import ModelError, PlannerError
from planner.plans import in_plan_file, load_plan

HELP = "write each pipeline stage of a plan as a standalone ONNX model"
TOLERANCE = 1e-4  # largest absolute difference --verify accepts


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", metavar="MODEL", help="the ONNX model the plan was made for")
    parser.add_argument("--plan", required=True, metavar="PLAN.json", help="a plan written by 'planner plan --out'")
    parser.add_argument("--out-dir", required=True, metavar="DIR",
                        help="folder for stage_<i>.onnx and manifest.json (created if missing)")
    parser.add_argument("--force", action="store_true", help="overwrite the split's files in --out-dir")
    parser.add_argument("--verify", action="store_true",
                        help="run the whole model and the stages with onnxruntime on seeded random inputs and "
                             f"weights and check they agree to {TOLERANCE:g} (max abs; fp16/bf16 boundaries add their "
                             "rounding); symbolic dimensions other than batch need --dim")
    add_dim_flag(parser)
    add_json_flag(parser)


def run(args: argparse.Namespace) -> int:
    from planner.export.stage_files import manifest, split_plan, write_split
    from planner.graph import load_model
    from planner.graph.loader import read_model

    dims = parse_dims(args.dim)
    plan = load_plan(args.plan)
    layers = load_model(args.model, dims=dims)
    model = read_model(args.model)
    try:
        stages = split_plan(model, plan, layers)
    except ModelError:  # about the model alone, which its message names
        raise
    except PlannerError as exc:  # the plan does not fit the model: name the plan file, as estimate --plan does
        raise type(exc)(in_plan_file(args.plan, exc)) from None
    document = manifest(args.model, plan, stages)
    if args.verify:
        from planner.export.verify import max_abs_difference, random_feeds, tolerance, weights_as_inputs
        whole = weights_as_inputs(model)
        # the dims the import bound (the model's own defaults included), then the batch of one unless --dim says
        feeds = random_feeds(whole, {"batch": 1, **dict(layers.dims), **dims}, seed=0)
        document["verify"] = {"max_abs_difference": max_abs_difference(whole, stages, feeds),
                              "tolerance": tolerance(whole, stages, feeds, TOLERANCE), "seed": 0}
    paths = write_split(args.out_dir, document, stages, args.force)
    if args.json:
        emit_json(document)
    else:
        for stage in document["stages"]:
            boundary = sum(1 for i in stage["inputs"] if i["kind"] == "boundary")
            sys.stdout.write(f"stage {stage['index']}: layers {stage['first_layer']}-{stage['last_layer']}, "
                             f"{stage['num_nodes']} nodes, {boundary} boundary inputs -> {stage['file']}\n")
        sys.stdout.write(f"wrote {len(paths)} files to {args.out_dir}\n")
        if args.verify:
            check = document["verify"]
            verdict = "verified" if check["max_abs_difference"] <= check["tolerance"] else "compared"
            sys.stdout.write(f"{verdict}: whole model vs stages, max abs difference "
                             f"{check['max_abs_difference']:.3g} (tolerance {check['tolerance']:.3g})\n")
    if args.verify and not document["verify"]["max_abs_difference"] <= document["verify"]["tolerance"]:
        sys.stderr.write("planner: the split does not reproduce the model's outputs (a bug; please report it)\n")
        return 1
    return 0
