"""``planner plan MODEL --cluster C --global-batch N``: search the fastest plan that fits, and explain it."""

from __future__ import annotations

import argparse
import dataclasses
import sys
from importlib import import_module

from planner.commands._common import add_cluster_flags, add_config_flags, add_json_flag, config_from_args, \
    emit_json, non_negative_int, output_format, parse_dims, positive_int, positive_seconds, tables_from_args, \
    warn_batch_dim
from planner.commands._common import add_allow_unknown_ops_flag, add_solver_flags, solver_options_from_args
from planner.errors import ConfigError, PlannerError
from planner.outputs import check_distinct, check_output_file, write_text
from planner.plans import Plan
from planner.report import FORMATS, render
from planner.report.table import replica_groups
from planner.rules import FORMAT_RUNTIMES, format_dtype, refused_rule, runtime_for_format, uniform_stages
from planner.types import LayerGraph
from planner.units import seconds

HELP = "search the fastest parallel plan that fits (provably optimal under the cost model where it can say so)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", metavar="MODEL", help="an ONNX model (.onnx)")
    add_cluster_flags(parser)
    add_allow_unknown_ops_flag(parser)
    add_config_flags(parser, required=False)
    parser.add_argument("--top", type=non_negative_int, default=0, metavar="K",
                        help="also list the K next best plans (alternatives: under the table, or in the JSON; "
                             "at most 99)")
    parser.add_argument("--time-limit", type=positive_seconds, metavar="S",
                        help="stop searching after S seconds, once a plan is found (the plan then says whether it "
                             "is proven optimal, and its lower bound)")
    parser.add_argument("--budget", type=positive_int, metavar="N",
                        help="stop the dense search after N work units (mostly layouts partitioned plus plans timed), "
                             "once a plan is found: like --time-limit, but the same result on any machine; "
                             "with --work, the smaller limit applies")
    add_solver_flags(parser)
    parser.add_argument("--out", metavar="FILE", help="write the best plan as JSON to FILE")
    parser.add_argument("--format", default="table", choices=FORMATS, help="how to print the plan (default: table)")
    parser.add_argument("--gantt", metavar="FILE", help="draw the best plan's pipeline schedule to FILE")
    add_json_flag(parser)


def _alternatives(plans: tuple[Plan, ...]) -> str:
    """The list under the table: the best plan (rank 1) and the alternatives ``--top K`` asked for (fewer where the
    search found fewer plans), one line each."""
    count = len(plans) - 1
    lines = ["", f"Best plan and {count} alternative{'s' if count != 1 else ''}:"]
    for rank, p in enumerate(plans, 1):
        # each stage's replica groups on their own device type and degrees (a mixed stage's summary fields would
        # give one tp for groups that differ)
        stages = ", ".join(replica_groups(s) for s in p.stages[:3]) + (" ..." if len(p.stages) > 3 else "")
        lines.append(f"  {rank}. {seconds(p.iteration_time_s)}  pp={len(p.stages)} vpp={p.vpp} dp={p.stages[0].dp} "
                     f"micro-batch={p.micro_batch} ZeRO-{p.zero} recompute={p.stages[0].recompute} "
                     f"sp={'on' if p.sequence_parallel else 'off'}  [{stages}]")
    return "\n".join(lines) + "\n"


def _check_format(fmt: str, model: LayerGraph, tables: tuple | None, path: str, optimizer: str | None) -> None:
    """The refusals of the ``--format`` exporters that the model and the ``--optimizer`` asked for (None: the
    default) alone decide, made before the search (and before --out and --gantt are written), with the
    exporters' own checks."""
    if fmt in ("torchrec", "deepspeed", "torchtitan"):
        from planner.compose import sparse_tables  # noqa: PLC0415 - the tables the plan will place
        from planner.export import deepspeed, torchtitan  # noqa: PLC0415
        from planner.export.torchrec import FRAMEWORK_FORMATS, check_has_tables  # noqa: PLC0415

        count = len(sparse_tables(model, tables))
        if fmt == "torchrec":
            if not count:  # refused, naming the formats whose own checks take the model
                takes = [other for other in FRAMEWORK_FORMATS if _format_takes(other, model, tables, path, optimizer)]
                check_has_tables(count, path, ["table", "json", *takes])
        else:
            {"deepspeed": deepspeed.check_no_tables, "torchtitan": torchtitan.check_no_tables}[fmt](count, path)
    if fmt in ("megatron", "torchtitan"):  # they train transformer layers, with the optimizers they name
        from planner.export._uniform import check_transformer_layers  # noqa: PLC0415

        exporter = import_module(f"planner.export.{fmt}")
        check_transformer_layers(sum(1 for layer in model.layers if layer.kind == "block"), path, exporter.TRAINING)
        if optimizer is not None:
            exporter.check_optimizer(optimizer, f"--format {fmt}")


def _format_takes(fmt: str, model: LayerGraph, tables: tuple | None, path: str, optimizer: str | None) -> bool:
    """Whether ``--format fmt``'s checks before the search (:func:`_check_format`) pass for the model."""
    try:
        _check_format(fmt, model, tables, path, optimizer)
    except PlannerError:
        return False
    return True


def run(args: argparse.Namespace) -> int:
    from planner.graph import load_model
    from planner.hardware import load_cluster
    from planner.search import search
    from planner.search.api import MAX_TOP_K
    from planner.report._figure import check_path, pyplot
    from planner.progress import terminal_bar

    # a bad output path or solver option fails before the search, not after it
    options = solver_options_from_args(args)
    if args.top >= MAX_TOP_K:
        raise ConfigError(f"--top {args.top}: a search returns at most {MAX_TOP_K} plans; use --top "
                          f"{MAX_TOP_K - 1} or less")
    fmt = output_format(args)
    if args.top and fmt not in ("table", "json"):  # an export writes the best plan alone
        raise ConfigError(f"--top {args.top}: --format {fmt} writes the best plan alone, so it has no alternatives "
                          "to list; use --format table or --json with --top, or leave --top out")
    if args.gantt is not None:  # an empty path is an error, not "not given"
        check_path(args.gantt, "--gantt")
        pyplot()  # matplotlib missing fails here, before --out is written
    if args.out is not None:
        check_output_file(args.out, "--out")
    check_distinct([("--out", args.out), ("--gantt", args.gantt)],
                   [("the model", args.model), ("--cluster", args.cluster), ("--tables", args.tables)])
    dims = parse_dims(args.dim)
    model = load_model(args.model, dims, allow_unknown_ops=args.allow_unknown_ops)
    warn_batch_dim(model, dims, args.micro_batch)
    tables = tables_from_args(args)
    _check_format(args.format, model, tables, args.model, args.optimizer)
    cluster = load_cluster(args.cluster)
    # --format megatron/deepspeed plans for that framework's runtime (an explicit --runtime must produce it)
    config = config_from_args(args)
    pinned = dataclasses.replace(config, runtime=runtime_for_format(args.format, args.runtime),
                                 dtype=format_dtype(args.format, [g.node.device for g in cluster.groups], config.dtype))
    bar = terminal_bar("searching")
    try:
        result = search(model, cluster, args.global_batch, pinned=pinned, top_k=args.top + 1,
                        time_limit_s=args.time_limit, tables=tables, progress=bar,
                        budget=args.budget, options=options, uniform=uniform_stages(args.format))
    except ConfigError as exc:
        if args.runtime is None and args.format in FORMAT_RUNTIMES and "--runtime" in str(exc):
            # the format chose the runtime: a fix naming another runtime would be refused by the format
            raise ConfigError(f"{refused_rule(exc)}; --format {args.format} launches "
                              f"{' or '.join(FORMAT_RUNTIMES[args.format])}, so change that choice or ask for "
                              "another --format") from None
        raise
    finally:
        if bar is not None:
            bar.close()
    best = result.best
    # rendered first: an export that refuses the plan fails before --out and --gantt are written
    text = None if fmt == "json" else render(best, fmt)
    if args.out is not None:
        write_text(args.out, best.to_json() + "\n", "--out")
    if args.gantt is not None:
        from planner.report.gantt import write_plan_gantt  # matplotlib, imported only when drawing
        write_plan_gantt(best, model, cluster, args.gantt)
    if text is None:
        document = best.to_dict()
        if len(result.plans) > 1:
            document["alternatives"] = [p.to_dict() for p in result.plans[1:]]
        emit_json(document)
        return 0
    sys.stdout.write(text)
    if len(result.plans) > 1:  # the table's format: json and the exports were handled above
        sys.stdout.write(_alternatives(result.plans))
    return 0


