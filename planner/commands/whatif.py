"""planner whatif MODEL --cluster C --global-batch N --sweep KEY=V1,V2,... [--sweep ...] [--csv FILE]
[--plot FILE.png|svg] [--json] [--workers N] [--backend process|ray] [pinning flags]"""

from __future__ import annotations

import argparse
import sys

from planner.commands._common import (PLAN_FIXES, add_cluster_flags, add_config_flags, add_json_flag,
                                      add_solver_flags, check_plan_fixes, config_from_args, emit_json, parse_dims,
                                      positive_int, positive_seconds, solver_options_from_args, tables_from_args)
from planner.errors import ConfigError
from planner.outputs import check_distinct, check_output_file, write_text
from planner.sweep.keys import GLOBAL_FIELDS, GROUP_FIELDS, parse_sweep_args, parse_sweeps
from planner.progress import terminal_bar
from planner.sweep.runner import BACKENDS
from planner.types import ParallelConfig

HELP = "re-plan across a sweep (GPU count, device mix, bandwidth, batch, sequence length, price)"
# the searches' limits and options, which a fixed plan (--plan), re-timed at each point, does not use
_SEARCH_FLAGS = ("time_limit", "budget", "work", "seed")


def _keys_help() -> str:
    lines = [f"{name}: {text}" for name, text in GLOBAL_FIELDS.items()]
    lines += [f"[GROUP.]{name}: {text}" for name, text in GROUP_FIELDS.items()]
    return "; ".join(lines)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", metavar="MODEL", help="ONNX model file")
    add_cluster_flags(parser, global_batch_required=False)
    parser.add_argument("--plan", metavar="PLAN.json",
                        help="re-time this plan file's own placement at every point instead of re-planning: what "
                             "the same plan takes on the changed cluster (its global batch and table placement; "
                             "no pins)")
    add_config_flags(parser, required=False)
    parser.add_argument("--sweep", action="append", required=True, metavar="KEY=V1,V2,...",
                        help="values to try (repeat for a grid; the first key varies slowest). Keys: "
                             f"{_keys_help()}. A group key without GROUP. changes every group")
    parser.add_argument("--csv", metavar="FILE", help="write one CSV row per point")
    parser.add_argument("--plot", metavar="FILE.png|svg",
                        help="throughput against the first swept key, and time against cost with the Pareto "
                             "front where prices are known")
    parser.add_argument("--workers", type=positive_int, metavar="N",
                        help="points planned in parallel (default: min(2, CPUs))")
    parser.add_argument("--backend", choices=BACKENDS, default="process",
                        help='where points run: local processes, or a Ray cluster (pip install "planner[ray]"; '
                             "RAY_ADDRESS selects the cluster)")
    parser.add_argument("--time-limit", type=positive_seconds, metavar="S",
                        help="search time limit per point, seconds (results then depend on the machine's load)")
    parser.add_argument("--budget", type=positive_int, metavar="N",
                        help="search budget per point in work units (see 'planner plan --budget'): reproducible")
    add_solver_flags(parser)
    add_json_flag(parser)


def _check_outputs(args: argparse.Namespace) -> None:
    """Fail before planning, not after minutes of it, when an output cannot be written."""
    from planner.report._figure import check_path, pyplot  # noqa: PLC0415

    if args.plot is not None:  # an empty path is an error, not "not given"
        check_path(args.plot, "--plot")
        pyplot()  # matplotlib missing fails here, before the sweep
    if args.csv is not None:
        check_output_file(args.csv, "--csv")
    check_distinct([("--csv", args.csv), ("--plot", args.plot)],
                   [("the model", args.model), ("--cluster", args.cluster), ("--tables", args.tables),
                    ("--plan", args.plan)])


def _pinned(args: argparse.Namespace) -> ParallelConfig | None:
    """The pinned choices as a ParallelConfig (None = searched), or None when nothing is pinned (every flag
    config_from_args reads at its default)."""
    config = config_from_args(args)
    return None if config == ParallelConfig(global_batch=config.global_batch) else config


def run(args: argparse.Namespace) -> int:
    from planner.sweep.whatif import whatif  # noqa: PLC0415

    sweeps = parse_sweep_args(args.sweep)
    parse_sweeps(sweeps)  # unknown keys and bad values fail before the model or the cluster is read
    options = solver_options_from_args(args)
    _check_outputs(args)
    plan = None
    if args.plan is not None:
        from planner.plans import load_plan  # noqa: PLC0415

        # --global-batch may come with --plan, to be checked against the plan's own (planner.sweep.whatif)
        check_plan_fixes(args, "re-plan each point", [name for name in PLAN_FIXES if name != "global_batch"])
        check_plan_fixes(args, "re-plan each point", _SEARCH_FLAGS, why="re-times the plan at each point and runs no "
                         "search")
        plan = load_plan(args.plan)
        if args.global_batch is None:
            args.global_batch = plan.global_batch
    elif args.global_batch is None:
        raise ConfigError("whatif needs --global-batch N (or --plan PLAN.json, whose global batch it takes)")
    bar = terminal_bar("whatif")
    try:
        result = whatif(args.model, args.cluster, args.global_batch, sweeps, dims=parse_dims(args.dim),
                        pinned=_pinned(args), tables=tables_from_args(args), workers=args.workers,
                        backend=args.backend, time_limit_s=args.time_limit,
                        progress=bar.count if bar is not None else None, budget=args.budget,
                        options=options, plan=plan)
    finally:
        if bar is not None:
            bar.close()
    if args.plot is not None:
        from planner.report.plots import check_whatif_plot, write_whatif_plot  # noqa: PLC0415

        check_whatif_plot(result, args.plot)  # a plot that cannot be drawn fails the command before --csv is written
    if args.csv is not None:
        write_text(args.csv, result.to_csv(), "--csv")
    if args.plot is not None:
        write_whatif_plot(result, args.plot)
    if args.json:
        emit_json(result.to_dict())
    else:
        sys.stdout.write(result.to_table() + "\n")
    return 0
