"""``planner estimate``: predict one parallel configuration (time, throughput, memory, feasibility)."""

from __future__ import annotations

import argparse
import dataclasses
import sys
from typing import Any, Iterable

from planner.commands._common import (add_cluster_flags, add_config_flags, add_json_flag, add_solver_flags,
                                      check_plan_fixes, config_from_args, emit_json, flag_names, parse_dims,
                                      positive_int, solver_options_from_args, tables_from_args, warn_batch_dim)
from planner.commands._common import add_allow_unknown_ops_flag
from planner.errors import ConfigError
from planner.types import Batching, Estimate, LayerGraph, MemoryBreakdown, ReplicaEstimate, StageEstimate
from planner.units import GIB, count, seconds, whole_bytes

HELP = "predict the iteration time, throughput and memory of one parallel configuration"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", metavar="MODEL", help="an ONNX file")
    add_cluster_flags(parser, global_batch_required=False)
    add_allow_unknown_ops_flag(parser)
    parser.add_argument("--plan", metavar="PLAN.json",
                        help="re-time this plan file's own placement (stages, devices, replica groups, degrees) on "
                             "--cluster instead of a configuration: what the same plan takes on another profile of "
                             "the devices or the network; replaces --global-batch and the configuration flags")
    add_config_flags(parser)
    for end in ("first", "last"):  # an uneven pipeline (planner.rules.stage_blocks)
        parser.add_argument(f"--{end}-stage-layers", type=positive_int,
                            help=f"transformer layers of the {end} pipeline stage (Megatron-Core's "
                                 f"--decoder-{end}-pipeline-num-layers; the middle stages share the rest evenly; "
                                 "with a vpp that does not divide the counts, a pipeline layout)")
    add_solver_flags(parser, dense=False)
    add_json_flag(parser)


def _memory_dict(memory: MemoryBreakdown) -> dict[str, float]:
    """A memory breakdown's byte counts, each a whole number of bytes (rounded up on its own, so the parts may
    add up to a few bytes over the total)."""
    names = ("weights_bytes", "gradients_bytes", "optimizer_bytes", "activations_bytes", "other_bytes", "total_bytes")
    return {name: whole_bytes(getattr(memory, name)) for name in names}


def estimate_document(model: LayerGraph, estimate: Estimate) -> dict[str, Any]:
    """The ``estimate --json`` document (also used by callers that want the same shape); byte counts in whole
    bytes, rounded up, as a plan's are (``estimate`` keeps its own unrounded numbers)."""
    breakdown = estimate.breakdown.to_dict()
    stages = []
    for stage in estimate.stages:
        entry: dict[str, Any] = {
            "index": stage.index, "first_layer": stage.first_layer, "last_layer": stage.last_layer,
            "layer_names": [layer.name for layer in model.layers[stage.first_layer:stage.last_layer + 1]],
            "device_type": stage.device_type, "devices": list(stage.devices), "tp": stage.tp, "dp": stage.dp,
            "cp": stage.cp, "cp_comm_s": stage.cp_comm_s, "forward_s": stage.forward_s,
            "backward_s": stage.backward_s, "tp_comm_s": stage.tp_comm_s,
            "p2p_s": stage.p2p_s, "dp_sync_s": stage.dp_sync_s, "optimizer_s": stage.optimizer_s,
            "memory": _memory_dict(stage.memory), "memory_capacity_bytes": whole_bytes(stage.memory_capacity_bytes),
            "ep": stage.ep, "expert_tp": stage.expert_tp, "ep_comm_s": stage.ep_comm_s,
        }
        if len(stage.replicas) > 1:
            entry["replicas"] = [{
                "device_type": r.device_type, "devices": list(r.devices), "tp": r.tp, "dp": r.dp, "cp": r.cp,
                "ep": r.ep, "expert_tp": r.expert_tp, "batch_share": r.batch_share,
                "num_micro_batches": r.num_micro_batches,
                "forward_s": r.forward_s, "backward_s": r.backward_s, "memory": _memory_dict(r.memory),
                "memory_capacity_bytes": whole_bytes(r.memory_capacity_bytes)} for r in stage.replicas]
        stages.append(entry)
    return {
        "model": {"name": model.name, "params": model.params, "flops_forward_per_sample": model.flops_forward},
        "iteration_time_s": estimate.iteration_time_s,
        "throughput_samples_per_s": estimate.throughput_samples_per_s,
        "feasible": estimate.feasible,
        "reason": estimate.reason,
        "memory_per_device_bytes": whole_bytes(estimate.memory_per_device_bytes),
        "config": dataclasses.asdict(estimate.config),
        "num_micro_batches": Batching.of(estimate.config).num_micro_batches,
        "breakdown": breakdown,
        "stages": stages,
        "notes": list(estimate.notes),
        "embeddings": [dataclasses.asdict(p) for p in estimate.embeddings],  # as in a plan
    }


def _print_table(model: LayerGraph, estimate: Estimate, num_devices: int) -> None:
    cfg = estimate.config
    out = sys.stdout
    used = len({d for s in estimate.stages for d in s.devices})
    out.write(f"model {model.name}: {count(model.params)} parameters, on {used} of the cluster's {num_devices} "
              "devices\n")
    # a mixed plan's stages, and a mixed stage's replica groups, may each have their own
    tps = _tps(group for s in estimate.stages for group in (s, *s.replicas))
    tp = cfg.tp if "/" not in tps else tps + " (per stage or replica group)"
    out.write(f"config: tp={tp} cp={cfg.cp} pp={cfg.pp} dp={cfg.dp} micro-batch={cfg.micro_batch} vpp={cfg.vpp} "
              f"schedule={cfg.schedule} zero={cfg.zero} recompute={cfg.recompute} "
              f"sequence-parallel={'yes' if cfg.sequence_parallel else 'no'} optimizer={cfg.optimizer} "
              f"dtype={cfg.dtype} "
              f"{f'fp8-recipe={cfg.fp8_recipe} ' if cfg.fp8_recipe else ''}runtime={cfg.runtime}"
              + (f" ep={cfg.ep} expert-tp={cfg.expert_tp} ep-overlap={'yes' if cfg.ep_overlap else 'no'}"
                 if any(layer.moe for layer in model.layers) else "") + "\n")
    out.write(f"iteration {seconds(estimate.iteration_time_s)}, {estimate.throughput_samples_per_s:.4g} samples/s, "
              f"memory {estimate.memory_per_device_bytes / GIB:.1f} GiB per device (largest), "
              f"{'fits' if estimate.feasible else 'DOES NOT FIT: ' + estimate.reason}\n")
    parts = estimate.breakdown.to_dict()
    out.write("breakdown: " + ", ".join(f"{k[:-2]} {seconds(v)}" for k, v in parts.items() if v) + "\n")
    out.write(f"{'stage':>5} {'layers':>9} {'device':>12} {'tp':>3} {'dp':>4} {'fwd ms':>9} {'bwd ms':>9} "
              f"{'mem GiB':>8}\n")
    for s in estimate.stages:  # a stage's own tp and dp: a plan's stages may differ from the config's
        out.write(f"{s.index:>5} {f'{s.first_layer}-{s.last_layer}':>9} {s.device_type:>12} "
                  f"{_tps((s, *s.replicas)):>3} {s.dp:>4} "
                  f"{s.forward_s * 1e3:>9.2f} {s.backward_s * 1e3:>9.2f} {s.memory.total_bytes / GIB:>8.1f}\n")
        if len(s.replicas) > 1:  # a mixed stage's own fields only sum its groups up: each group on its own row
            for r in s.replicas:
                out.write(f"{'':>5} {f'{r.batch_share:.0%} batch':>9} {r.device_type:>12} {r.tp:>3} {r.dp:>4} "
                          f"{r.forward_s * 1e3:>9.2f} {r.backward_s * 1e3:>9.2f} {r.memory.total_bytes / GIB:>8.1f}\n")
    for note in estimate.notes:
        out.write(f"note: {note}\n")


def _tps(groups: Iterable[StageEstimate | ReplicaEstimate]) -> str:
    """The groups' tensor-parallel degrees: '2', or '1/2' where they differ."""
    return "/".join(map(str, sorted({group.tp for group in groups})))


# the table sharder's options: a plan file's placement is re-timed, never sharded again
_PLAN_KEEPS_TABLES = ("work", "seed")


def run(args: argparse.Namespace) -> int:
    from planner.compose import estimate, estimate_plan
    from planner.graph import load_model
    from planner.hardware import load_cluster
    from planner.plans import in_plan_file, load_plan

    if args.plan is not None:
        check_plan_fixes(args, "estimate a configuration")
        check_plan_fixes(args, "shard the tables anew", _PLAN_KEEPS_TABLES,
                         why="keeps the plan's table placement, so no table sharder runs")
        plan = load_plan(args.plan)
    else:
        missing = [flag for flag in ("global_batch", "tp", "pp", "dp") if getattr(args, flag) is None]
        if missing:
            raise ConfigError(f"estimate needs {flag_names(missing)} (a configuration), or --plan PLAN.json (a plan "
                              "file's placement)")
        config = config_from_args(args)
        options = solver_options_from_args(args)  # a bad option fails before any work
    cluster = load_cluster(args.cluster)
    dims = parse_dims(args.dim)
    model = load_model(args.model, dims, allow_unknown_ops=args.allow_unknown_ops)
    if args.plan is None:
        warn_batch_dim(model, dims, args.micro_batch)
        result = estimate(model, cluster, config, tables=tables_from_args(args), options=options)
    else:
        try:
            result = estimate_plan(model, cluster, plan, tables=tables_from_args(args))
        except ConfigError as exc:
            raise ConfigError(in_plan_file(args.plan, exc)) from None
    if args.json:
        emit_json(estimate_document(model, result))
    else:
        _print_table(model, result, cluster.num_devices)
    return 0
