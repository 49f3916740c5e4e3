"""What Megatron-LM and DeepSpeed both require of a plan: every pipeline stage on the same tensor- and
data-parallel degrees, on one device type, without heterogeneous replica groups; the runtime whose
options an export writes; and the warning both give a tf32 plan."""

from __future__ import annotations

import logging

from planner.errors import PlannerError
from planner.plans import Plan
from planner.rules import FORMAT_RUNTIMES
from planner.runtime import Runtime, get_runtime

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


def pipeline_degree(plan: Plan) -> int:
    """Pipeline stages (``vpp`` model chunks each under an interleaved schedule)."""
    return len(plan.stages)


def warn_tf32(plan: Plan, framework: str) -> None:
    """Warn that a tf32 plan runs as costed only where the training script allows TF32: neither Megatron-LM
    (megatron/ at d98e8a64dd) nor DeepSpeed (deepspeed/ at edaa72212672) sets
    torch.backends.cuda.matmul.allow_tf32 or the float32 matmul precision, and PyTorch leaves it False by default since
    1.12 (its float32 matmul precision "highest": PyTorch docs, torch.set_float32_matmul_precision and CUDA
    semantics, "TensorFloat-32 (TF32) on Ampere (and later) devices"; the change: pytorch/pytorch#76509), while
    torch.backends.cudnn.allow_tf32 defaults to True (the same docs)."""
    if plan.dtype == "tf32":
        log.warning("plan: dtype tf32 is costed with TF32 tensor-core GEMMs, which %s does not switch on and "
                    "PyTorch leaves off by default; the training script must set "
                    "torch.backends.cuda.matmul.allow_tf32 = True (and keep torch.backends.cudnn.allow_tf32 = "
                    "True, its default) to run as costed", framework)
