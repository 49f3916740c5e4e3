"""Flags and output helpers shared by several commands (one place, so every command spells them alike)."""

from __future__ import annotations

import argparse
import json
import logging
import math
import sys
from typing import Any, Sequence

from planner.assignments import split_assignments
from planner.errors import ConfigError
from planner.rules import (DTYPES, FORMAT_RUNTIMES, FP8_RECIPE_NAMES, OPTIMIZERS, RECOMPUTE_CHOICES,
                           RUNTIME_NAMES, RUNTIME_PREFERENCE, SCHEDULES, ZERO_STAGES)
from planner.runtime import DEFAULT_RUNTIME, get_runtime
from planner.solver import SolverOptions
from planner.types import MAX_GLOBAL_BATCH, LayerGraph, ParallelConfig

log = logging.getLogger(__name__)


# the runtime each export format implies when --runtime is left out
_IMPLIED = ", ".join(f"{fmt} -> {names[0]}" for fmt, names in FORMAT_RUNTIMES.items())
# the runtimes a left-out --runtime falls back to, in order (planner.rules.resolve_runtime), and the one ZeRO-3 gets
_FALLBACKS = ", ".join(RUNTIME_PREFERENCE[1:])
_ZERO3 = next(name for name in RUNTIME_PREFERENCE if 3 in get_runtime(name).zero_stages)


def add_json_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print exactly one JSON document on stdout")


def output_format(args: argparse.Namespace) -> str:
    """The format of ``--format`` and ``--json`` (the same as ``--format json``); both, asking for two different
    outputs, are refused."""
    if args.json and args.format not in ("table", "json"):
        raise ConfigError(f"--json prints the plan as JSON and --format {args.format} as {args.format}'s options; "
                          "give one of them")
    return "json" if args.json else args.format


def emit_json(document: Any) -> None:
    """Print one deterministic JSON document on stdout."""
    sys.stdout.write(json.dumps(document, indent=2, sort_keys=True) + "\n")


def add_dim_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dim", action="append", default=[], metavar="NAME=INT",
                        help="bind a symbolic dimension (repeatable), e.g. --dim batch=1 --dim seq=2048")


def parse_dims(items: list[str]) -> dict[str, int]:
    dims: dict[str, int] = {}
    for name, value in split_assignments(items, "--dim", "NAME=INT", "seq=2048", once="give each dimension once"):
        item = f"{name}={value}"
        try:
            number = int(value)
        except ValueError:
            raise ConfigError(f"--dim {item!r}: {value!r} is not an integer; use e.g. --dim {name}=1") from None
        if number <= 0:
            raise ConfigError(f"--dim {item!r}: a dimension must be a positive integer")
        dims[name] = number
    return dims


def warn_batch_dim(model: LayerGraph, dims: dict[str, int], micro_batch: int | None) -> None:
    """Warn when ``--dim`` bound the model's batch axis and no micro-batch is pinned: the import costs one
    sample whatever the batch axis, so the value does not become the micro-batch, which users often expect."""
    if micro_batch is not None or model.batch <= 1:
        return
    bound = dict(model.dims)
    for name, value in dims.items():
        if value == model.batch and bound.get(name) == value:
            log.warning("--dim %s=%d binds the model's batch axis for the import only (costs are per sample); "
                        "the micro-batch is chosen by the planner; pin it with --micro-batch %d", name, value, value)
            return


def _positive(text: str, kind: type, what: str) -> int | float:
    """A flag's positive value; argparse's message names the flag. float() takes 'nan' and 'inf', which no
    count, limit or multiple can be."""
    try:
        value = kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not {what}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"{text!r} is not a finite number; give a positive one")
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be positive")
    return value


def positive_int(text: str) -> int:
    return int(_positive(text, int, "an integer"))


def global_batch_arg(text: str) -> int:
    """``--global-batch``: a positive integer up to planner.types.MAX_GLOBAL_BATCH."""
    value = positive_int(text)
    if value > MAX_GLOBAL_BATCH:
        raise argparse.ArgumentTypeError(f"{text!r} is over {MAX_GLOBAL_BATCH}, the largest the planner takes")
    return value


def positive_seconds(text: str) -> float:
    return float(_positive(text, float, "a number of seconds"))


def positive_float(text: str) -> float:
    return float(_positive(text, float, "a number"))


def non_negative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be 0 or more")
    return value


def add_cluster_flags(parser: argparse.ArgumentParser, global_batch_required: bool = True) -> None:
    parser.add_argument("--cluster", required=True,
                        help="a cluster file (YAML/JSON), an example cluster's name (`planner devices` lists them) or "
                             "a shorthand NODE*COUNT[+NODE*COUNT...]")
    parser.add_argument("--global-batch", type=global_batch_arg, required=global_batch_required, metavar="N",
                        help="samples per iteration")
    parser.add_argument("--tables", metavar="FILE",
                        help='embedding-table statistics, JSON/YAML '
                             '{"tables": [{"name","rows","dim","pooling_factor"}]}')
    parser.add_argument("--workload", metavar="NAME",
                        help="the entry of a --tables file that lists several 'workloads' (as "
                             "benchmarks/data/embedding_workloads.json does)")
    add_dim_flag(parser)


def tables_from_args(args: argparse.Namespace) -> tuple | None:
    """The EmbeddingTables of ``--tables FILE`` (its ``--workload`` entry), or None without ``--tables``."""
    if args.workload and not args.tables:
        raise ConfigError(f"--workload {args.workload}: it picks an entry of a --tables file; give --tables FILE too")
    if not args.tables:
        return None
    from planner.embeddings import load_tables  # noqa: PLC0415 - only models with tables need it
    return load_tables(args.tables, args.workload)


def add_config_flags(parser: argparse.ArgumentParser, required: bool = False) -> None:
    """The parallel-configuration flags; for `plan` and `whatif` each one pins that choice."""
    parser.add_argument("--tp", type=positive_int, required=required, help="tensor-parallel degree")
    parser.add_argument("--pp", type=positive_int, required=required, help="pipeline-parallel degree (stages)")
    parser.add_argument("--dp", type=positive_int, required=required, help="data-parallel degree")
    parser.add_argument("--cp", type=positive_int,
                        help="context-parallel degree: ranks each sequence is split over, K/V passed around a "
                             "ring (devices: tp x cp x pp x dp; default: estimate 1, plan searches it)")
    parser.add_argument("--micro-batch", type=positive_int, help="micro-batch size (omitted: the best feasible)")
    parser.add_argument("--vpp", type=positive_int, help="virtual pipeline stages per device (interleaved schedule)")
    parser.add_argument("--zero", type=int, choices=ZERO_STAGES, help="ZeRO stage (the runtime bounds it)")
    parser.add_argument("--recompute", choices=RECOMPUTE_CHOICES, help="activation recomputation")
    parser.add_argument("--sequence-parallel", action=argparse.BooleanOptionalAction, default=None,
                        help="shard layer-norm/dropout activations across the tensor-parallel group "
                             "(default: estimate turns it on when tp > 1, plan searches both; "
                             "--no-sequence-parallel keeps it off)")
    parser.add_argument("--schedule", choices=SCHEDULES, help="pipeline schedule")
    parser.add_argument("--optimizer", choices=OPTIMIZERS, help=f"optimizer (default: {ParallelConfig.optimizer})")
    parser.add_argument("--runtime", choices=RUNTIME_NAMES,
                        help=f"training stack, which bounds ZeRO, interleaving and overlap (default: "
                             f"{DEFAULT_RUNTIME}, or where it cannot run the pinned choices the first of "
                             f"{_FALLBACKS} that can, e.g. --zero 3 -> {_ZERO3}; with 'plan --format' the "
                             f"format's framework: {_IMPLIED})")
    parser.add_argument("--dtype", choices=DTYPES,
                        help="training dtype; every device must run it (default: bf16, or the first of fp16 "
                             "and fp32 that every device runs where one lacks bf16)")
    parser.add_argument("--fp8-recipe", choices=FP8_RECIPE_NAMES,
                        help="Transformer Engine FP8 scaling recipe, with --dtype fp8 only: delayed (per-tensor "
                             "scales from an amax history; the default), blockwise (fp32 scales per 1x128 and "
                             "128x128 block; Hopper and Blackwell), mxfp8 (E8M0 scales per 32 values; "
                             "Blackwell)")
    parser.add_argument("--ep", type=positive_int, metavar="N",
                        help="expert-parallel degree of a mixture-of-experts model: its routed experts split over "
                             "N ranks (omitted: the best the rules allow; 1 on a dense model)")
    parser.add_argument("--expert-tp", type=positive_int, metavar="N",
                        help="expert tensor-parallel degree: each expert's matrices split over N ranks, a divisor "
                             "of tp (omitted: the best the rules allow)")
    parser.add_argument("--ep-overlap", action=argparse.BooleanOptionalAction, default=None,
                        help="run the expert-parallel all-to-alls under another micro-batch's computation "
                             "(Megatron-Core --overlap-moe-expert-parallel-comm: ep > 1, vpp > 1 where pp > 1, no "
                             "full recompute; omitted: taken where it is faster; --no-ep-overlap keeps it off)")


def config_from_args(args: argparse.Namespace) -> ParallelConfig:
    """A ParallelConfig from the flags, None where a flag is left out. For `estimate`, tp/pp/dp are given; for
    `plan` and `whatif` they may be left out (searched)."""
    return ParallelConfig(
        global_batch=args.global_batch,
        tp=args.tp,
        pp=args.pp,
        dp=args.dp,
        micro_batch=args.micro_batch,
        vpp=args.vpp,
        zero=args.zero,
        recompute=args.recompute,
        sequence_parallel=args.sequence_parallel,
        schedule=args.schedule,
        optimizer=args.optimizer if args.optimizer is not None else ParallelConfig.optimizer,
        dtype=args.dtype,
        runtime=args.runtime,
        fp8_recipe=args.fp8_recipe,
        cp=args.cp,
        first_stage_layers=getattr(args, "first_stage_layers", None),  # estimate's flags only
        last_stage_layers=getattr(args, "last_stage_layers", None),
        ep=getattr(args, "ep", None),
        expert_tp=getattr(args, "expert_tp", None),
        ep_overlap=getattr(args, "ep_overlap", None),
    )


# the configuration flags a plan file fixes: `estimate --plan` and `whatif --plan` re-time the plan's own
# placement, so none of these may come with --plan (the stage-layer flags are estimate's alone)
PLAN_FIXES = ("global_batch", "tp", "pp", "dp", "cp", "micro_batch", "vpp", "zero", "recompute", "sequence_parallel",
              "schedule", "optimizer", "runtime", "dtype", "fp8_recipe", "ep", "expert_tp", "ep_overlap",
              "first_stage_layers", "last_stage_layers")


def flag_names(names: Sequence[str]) -> str:
    """The command-line spelling of argparse destinations: ``["micro_batch", "tp"]`` -> ``--micro-batch --tp``."""
    return " ".join("--" + name.replace("_", "-") for name in names)


def check_plan_fixes(args: argparse.Namespace, instead: str, fixes: Sequence[str] = PLAN_FIXES,
                     why: str = "fixes the configuration") -> None:
    """Refuse the flags of ``fixes`` given with ``--plan`` (by default the configuration's), naming each given
    one; ``why`` says what --plan does that makes them moot, ``instead`` what the command does without --plan
    ("estimate a configuration")."""
    given = [name for name in fixes if getattr(args, name, None) is not None]
    if given:
        raise ConfigError(f"--plan {why}; drop {flag_names(given)} (or drop --plan to {instead})")


def add_solver_flags(parser: argparse.ArgumentParser, dense: bool = True) -> None:
    """``--work`` and ``--seed``: the SolverOptions (planner.solver) of both searches, or with ``dense`` False
    of the table sharder alone (a command that searches no dense plan, such as estimate)."""
    if dense:
        work_help = ("how hard both searches work, a multiple of each one's default work limit (default 1; "
                     "the same result on any machine). The dense search's default lets every measured "
                     "search finish (less may stop it early, the plan then says it is not proven optimal; "
                     "--budget caps it further); the table sharder of a model with embedding tables gets "
                     "closer to its bound with more")
        seed_help = "seed of the table sharder's random choices (default 0; the dense search makes none)"
    else:
        work_help = ("for a model with embedding tables: the table sharder's work, a multiple of its default "
                     "(default 1; more gets closer to its bound; the same result on any machine, and plan "
                     "--work W gives the same placement)")
        seed_help = "seed of the table sharder's random choices (default 0; plan --seed N gives the same placement)"
    # None when not given (SolverOptions' defaults apply), so a command can refuse them where they do nothing
    parser.add_argument("--work", type=positive_float, default=None, metavar="W", help=work_help)
    parser.add_argument("--seed", type=non_negative_int, default=None, metavar="N", help=seed_help)


def solver_options_from_args(args: argparse.Namespace) -> SolverOptions:
    """The SolverOptions of --work and --seed, the defaults of SolverOptions for those not given."""
    given = {name: getattr(args, name) for name in ("work", "seed") if getattr(args, name) is not None}
    return SolverOptions(**given)


def add_allow_unknown_ops_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--allow-unknown-ops", action="store_true",
                        help="import a model even when ops that cannot be costed (no cost rule, unknown shapes) "
                             "carry over 1%% of its FLOPs; they are costed as zero and a warning gives their share")
