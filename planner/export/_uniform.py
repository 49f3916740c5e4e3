"""What the framework exports (Megatron-LM, DeepSpeed, torchtitan) share: every pipeline stage on the same
tensor-, context- and data-parallel (and expert) degrees, on one device type, without heterogeneous replica
groups; a model with transformer layers and, but for TorchRec, without embedding tables; how a stage's layers
are shared out over its interleaved model chunks; the runtime whose options an export writes; and the warning
each gives a tf32 plan."""

from __future__ import annotations

import logging

from planner.errors import PlannerError
from planner.plans import Plan, StagePlan
from planner.rules import FORMAT_RUNTIMES
from planner.runtime import Runtime, get_runtime
from planner.units import id_ranges

log = logging.getLogger(__name__)


def framework_runtime(plan: Plan, fmt: str) -> Runtime:
    """The runtime whose options the ``fmt`` export of ``plan`` writes: the plan's own where the format's
    framework is it, else the framework's default (a plan made for another runtime keeps its degrees)."""
    names = FORMAT_RUNTIMES[fmt]
    return get_runtime(plan.runtime if plan.runtime in names else names[0])


def require_uniform(plan: Plan, framework: str) -> tuple[int, int]:
    """The (tp, dp) shared by every stage, or PlannerError saying why ``framework`` cannot express the plan."""
    for stage in plan.stages:
        if len(stage.replicas) > 1:
            kinds = ", ".join(f"{r.device_type} tp {r.tp} dp {r.dp}" for r in stage.replicas)
            raise PlannerError(
                f"plan: stage {stage.index} is served by several replica groups ({kinds}); {framework} runs one "
                "configuration on every stage; use --format json, or re-plan on one device type")
    first = plan.stages[0]
    for stage in plan.stages[1:]:
        if (stage.tp, stage.dp) != (first.tp, first.dp):
            raise PlannerError(
                f"plan: stage {stage.index} uses tp {stage.tp} dp {stage.dp} but stage 0 uses tp {first.tp} "
                f"dp {first.dp}; {framework} needs the same degrees on every stage; use --format json, or "
                "re-plan with --tp and --dp pinned")
    return first.tp, first.dp


def refuse_gpipe(plan: Plan, framework: str, schedules: str) -> None:
    """Refuse a plan of the GPipe schedule, which ``framework`` does not run (``schedules``: what it runs);
    ``planner estimate --schedule gpipe`` times it, and a plan file may be edited to it."""
    if plan.schedule == "gpipe":
        raise PlannerError(f"plan: schedule gpipe (every micro-batch's forward before any backward) does not run on "
                           f"{framework}, which {schedules}; re-plan with --schedule 1f1b")


def uniform_cp(plan: Plan, framework: str) -> int:
    """The context-parallel degree shared by every stage, or PlannerError naming the stage that differs."""
    first = plan.stages[0]
    for stage in plan.stages[1:]:
        if stage.cp != first.cp:
            raise PlannerError(
                f"plan: stage {stage.index} uses cp {stage.cp} but stage 0 uses cp {first.cp}; {framework} needs "
                "the same context-parallel degree on every stage; use --format json, or re-plan with --cp pinned")
    return first.cp


def uniform_experts(plan: Plan, framework: str) -> tuple[int, int]:
    """The (ep, expert_tp) shared by every stage, or PlannerError naming the stage that differs."""
    first = plan.stages[0]
    for stage in plan.stages[1:]:
        if (stage.ep, stage.expert_tp) != (first.ep, first.expert_tp):
            raise PlannerError(f"plan: stage {stage.index} uses ep {stage.ep} expert-tp {stage.expert_tp} but stage "
                               f"0 uses ep {first.ep} expert-tp {first.expert_tp}; {framework} needs the same on "
                               "every stage; re-plan with --ep and --expert-tp pinned")
    return first.ep, first.expert_tp


def transformer_layers(stage: StagePlan) -> int:
    """Transformer layers of a stage: its "block" layers, or all of them when the plan has no layer kinds."""
    if not stage.layer_kinds:
        return len(stage.layer_names)
    return sum(1 for kind in stage.layer_kinds if kind == "block")


def stage_comments(plan: Plan) -> list[str]:
    """A comment line per stage: its layers, device type, and the launch ranks that run it. Megatron-LM and
    torchtitan give pipeline stage s the ranks s x W .. (s + 1) x W - 1 (W = tp x cp x dp; the pipeline is the
    outermost dimension of both); where those are not the plan's own device ids (a stage placed on a device
    type later in the cluster file), the line names the devices the hosts must give them."""
    lines = []
    first = 0
    for stage in plan.stages:
        ranks = list(range(first, first + len(stage.devices)))
        first += len(stage.devices)
        where = f"ranks {id_ranges(ranks)}"
        if list(stage.devices) != ranks:
            where += f" on the cluster's devices {id_ranges(stage.devices)} (order the hosts so)"
        lines.append(f"# stage {stage.index}: layers {stage.first_layer}-{stage.last_layer} "
                     f"({transformer_layers(stage)} transformer) on {stage.device_type}, {where}")
    return lines


def check_transformer_layers(count: int, what: str, training: str) -> None:
    """Refuse a model (or its plan) with no transformer layers, which ``training`` (the framework's transformer
    training) cannot run."""
    if not count:
        raise PlannerError(f"{what}: the model has no transformer layers, so {training} has nothing to run; use "
                           "--format table or json (and torchrec for its embedding tables)")


def check_no_tables(count: int, what: str, config: str, why: str) -> None:
    """Refuse a plan (or a model, before its search) with ``count`` sparse embedding tables, which ``config`` (a
    framework's configuration) cannot place (``why``): TorchRec sharding types place them."""
    if count:
        raise PlannerError(f"{what}: its {count} embedding tables are placed by TorchRec sharding types, which "
                           f"{config} cannot express ({why}); use --format torchrec for the tables' sharding plan")


def pipeline_degree(plan: Plan) -> int:
    """Pipeline stages (``vpp`` model chunks each under an interleaved schedule)."""
    return len(plan.stages)


def warn_tf32(plan: Plan, framework: str) -> None:
    """Warn that a tf32 plan runs as costed only where the training script allows TF32: neither Megatron-LM
    (megatron/ at d98e8a64dd) nor DeepSpeed (deepspeed/ at edaa72212672) sets
    torch.backends.cuda.matmul.allow_tf32 or the float32 matmul precision, torchtitan (at b5bcd76c) sets it only
    to False, in its batch-invariant mode (torchtitan/distributed/utils.py:379), and PyTorch leaves it False by
    default since 1.12 (its float32 matmul precision "highest": PyTorch docs, torch.set_float32_matmul_precision
    and CUDA semantics, "TensorFloat-32 (TF32) on Ampere (and later) devices"; the change: pytorch/pytorch#76509),
    while torch.backends.cudnn.allow_tf32 defaults to True (the same docs)."""
    if plan.dtype == "tf32":
        log.warning("plan: dtype tf32 is costed with TF32 tensor-core GEMMs, which %s does not switch on and "
                    "PyTorch leaves off by default; the training script must set "
                    "torch.backends.cuda.matmul.allow_tf32 = True (and keep torch.backends.cudnn.allow_tf32 = "
                    "True, its default) to run as costed", framework)
