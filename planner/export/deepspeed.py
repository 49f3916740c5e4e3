"""A Plan as a DeepSpeed ``ds_config`` dictionary.

Key names are those of DeepSpeed's ``deepspeed/runtime/constants.py`` (``train_batch_size``,
``train_micro_batch_size_per_gpu``, ``gradient_accumulation_steps``, ``bf16``/``fp16`` with ``enabled``,
``zero_optimization`` with ``stage``, ``overlap_comm``, ``reduce_bucket_size``, ``allgather_bucket_size``:
``deepspeed/runtime/zero/config.py``; overlap and bucket size are the deepspeed runtime's),
``zero_allow_untested_optimizer`` (constants.py; for an SGD plan with ZeRO: the training script passes its
optimizer to ``deepspeed.initialize``, the config names none),
``deepspeed/runtime/config.py:get_pipeline_config`` (the
``pipeline`` section: ``stages``, ``partition``, ``activation_checkpoint_interval``),
``deepspeed/runtime/activation_checkpointing/config.py`` (the ``activation_checkpointing`` section, written for
full recompute without pipeline stages: the model's layers then call ``deepspeed.checkpointing.checkpoint``) and
``deepspeed/runtime/tensor_parallel/config.py`` (``tensor_parallel.autotp_size``, written for one stage only:
AutoTP lays its groups over a data x tensor mesh of the whole world and has no path in the pipeline engine).

The pipeline section is a free-form dictionary in DeepSpeed, of which its pipeline engine reads only
``activation_checkpoint_interval``, ``pipe_partitioned``, ``grad_partitioned`` and ``use_reentrant``
(deepspeed/runtime/pipe/engine.py:141-224). ``stages`` and ``partition`` are not read: ``PipelineModule`` takes
``num_stages`` and ``partition_method`` from the model code (deepspeed/runtime/pipe/module.py:125-133; the
default partition_method is ``parameters``, which balances parameter counts, not the plan's layers). They are
written for that code, and an export with pipeline stages logs one warning saying what it must pass. Ours adds
``stage_layers``, the plan's layer range of each stage, and with tp > 1 ``topology`` (``num_pp``, ``num_mp``,
``num_dp``) for the ``PipeModelDataParallelTopology`` whose model-parallel axis the model's own tensor-parallel
layers use. None of DeepSpeed's partition methods (``module.py`` ``_partition_layers``: ``uniform``,
``parameters``, ``type:REGEX``) takes explicit boundaries: ``partition`` is written ``uniform`` where the plan's
stages hold equal numbers of layers, and left out where they do not, for the model code to apply
``stage_layers``.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from planner.errors import PlannerError
from planner.export import _uniform
from planner.export._uniform import framework_runtime, pipeline_degree, refuse_gpipe, require_uniform, warn_tf32
from planner.plans import Plan, plan_recompute
from planner.rules import tp_zero_fits

log = logging.getLogger(__name__)

# the planner's optimizers that DeepSpeed's ZeRO has not tested: torch.optim.SGD is not in
# ZERO_SUPPORTED_OPTIMIZERS (deepspeed/runtime/zero/utils.py:45, which lists torch's Adam, AdamW and Adagrad and
# DeepSpeed's FusedAdam, CPU Adam and CPU Adagrad), and with a ZeRO stage above 0 the engine asserts
# "zero_allow_untested_optimizer" for any other (deepspeed/runtime/engine.py:1987, _do_optimizer_sanity_check)
_UNTESTED_ZERO_OPTIMIZERS = ("sgd",)


def check_no_tables(count: int, what: str) -> None:
    """Refuse a plan (or a model, before its search) with ``count`` sparse embedding tables, which a ds_config
    cannot place."""
    _uniform.check_no_tables(count, what, "a ds_config", "DeepSpeed would keep a whole copy of every table on every "
                             "rank")


def deepspeed_config(plan: Plan) -> dict[str, Any]:
    """The ds_config that runs ``plan``."""
    check_no_tables(len(plan.embeddings), "plan")
    tp, dp = require_uniform(plan, "DeepSpeed")
    pp = pipeline_degree(plan)
    # the pipeline engine runs its own 1F1B-like TrainSchedule (deepspeed/runtime/pipe/schedule.py:189, which
    # pipe/engine.py builds in train_batch); without a pipeline the engine runs each micro-batch's forward
    # and backward in turn
    refuse_gpipe(plan, "DeepSpeed", "interleaves forwards and backwards (its pipeline engine's TrainSchedule)")
    # one activation_checkpoint_interval (pipeline) or activation_checkpointing section for the whole model
    recompute = plan_recompute(plan, "DeepSpeed runs one recompute mode on every stage")
    cp = max(stage.cp for stage in plan.stages)
    if cp > 1:
        raise PlannerError(f"plan: cp {cp} (context parallelism: a ring exchange of K and V) has no DeepSpeed "
                           "equivalent; DeepSpeed's sequence parallelism is Ulysses (an all-to-all over attention "
                           "heads), a different algorithm; use --format megatron, or re-plan with --cp 1")
    if plan.vpp > 1:
        raise PlannerError(f"plan: vpp {plan.vpp} (interleaved pipeline) has no DeepSpeed equivalent; use "
                           "--format megatron, or re-plan with --vpp 1")
    if pp > 1 and plan.zero >= 2:
        # deepspeed/runtime/pipe/engine.py: "ZeRO-2 and ZeRO-3 are incompatible with pipeline parallelism"
        raise PlannerError(f"plan: ZeRO-{plan.zero} with {pp} pipeline stages cannot run in DeepSpeed (its "
                           "pipeline engine accepts ZeRO 0 or 1); re-plan with --zero 1, or use --format megatron")
    runtime = framework_runtime(plan, "deepspeed")
    if not tp_zero_fits(tp, plan.zero, runtime):
        raise PlannerError(f"plan: tp {tp} with ZeRO-{plan.zero} cannot run in DeepSpeed (its tensor parallelism "
                           f"trains with ZeRO {runtime.max_tensor_parallel_zero} at most); re-plan with --runtime "
                           "deepspeed, or use --format megatron")
    if plan.dtype == "fp8":
        # DeepSpeed's config has bf16, fp16 and amp sections and none for fp8: FP8 GEMMs come from Transformer
        # Engine modules in the model code (or a plug-in's own section), which a config cannot switch on
        raise PlannerError("plan: dtype fp8 has no DeepSpeed config option (its config sets bf16 or fp16 only; "
                           "FP8 needs Transformer Engine layers in the model code); re-plan with --dtype bf16, or "
                           "use --format megatron")
    for stage in plan.stages:
        # DeepSpeed's AutoEP (the expert_parallel section: enabled, autoep_size, expert_tensor_parallel_size;
        # deepspeed/runtime/config.py get_expert_parallel_config, deepspeed/module_inject/auto_ep_config.py
        # parse_autoep_config) swaps a model's MoE layers for its own at initialize; deepspeed.moe.layer.MoE
        # takes ep_size in the model code. The planner models and exports neither yet
        if stage.ep > 1 or (plan.model.get("experts") and stage.expert_tp != stage.tp):
            raise PlannerError(f"plan: expert parallelism (ep {stage.ep}, expert-tp {stage.expert_tp}) is not "
                               "exported to DeepSpeed: its AutoEP (the expert_parallel section) replaces the model's "
                               "MoE layers with its own, a mechanism the planner does not model or export yet; use "
                               "--format megatron, or re-plan with --runtime deepspeed")
    accumulation = plan.batching.num_micro_batches
    if accumulation * plan.micro_batch * dp != plan.global_batch:
        raise PlannerError(f"plan: global batch {plan.global_batch} is not micro-batch {plan.micro_batch} x dp "
                           f"{dp} x an integer number of steps, which DeepSpeed requires")
    config: dict[str, Any] = {
        "train_batch_size": plan.global_batch,
        "train_micro_batch_size_per_gpu": plan.micro_batch,
        "gradient_accumulation_steps": accumulation,
        "zero_optimization": _zero_optimization(plan),
        # fp32 and tf32 enable neither: DeepSpeed does not switch TF32 on, so a tf32 plan needs the training
        # script to allow it (warn_tf32)
        "bf16": {"enabled": plan.dtype == "bf16"},
        "fp16": {"enabled": plan.dtype == "fp16"},
    }
    warn_tf32(plan, "DeepSpeed")
    if plan.optimizer in _UNTESTED_ZERO_OPTIMIZERS and plan.zero >= 1:
        config["zero_allow_untested_optimizer"] = True
    if tp > 1 and pp == 1:
        config["tensor_parallel"] = {"autotp_size": tp}
        _warn_data_parallel_size(tp, dp)
    full = recompute == "full"
    if full and pp == 1:
        # without a PipelineModule to checkpoint every layer, the model's layers call
        # deepspeed.checkpointing.checkpoint, which this section configures (DeepSpeed's defaults: the plan's
        # cost keeps each layer's whole input, not partitioned over ranks nor moved to the host)
        config["activation_checkpointing"] = {
            "partition_activations": False, "contiguous_memory_optimization": False, "cpu_checkpointing": False,
            "number_checkpoints": _blocks(plan), "synchronize_checkpoint_boundary": False, "profile": False}
    if pp > 1:
        stage_layers = [[s.first_layer, s.last_layer] for s in plan.stages]
        config["pipeline"] = {"stages": pp, "activation_checkpoint_interval": 1 if full else 0,
                              "stage_layers": stage_layers}
        if tp > 1:
            # AutoTP lays its groups over a data x tensor mesh of the whole world (deepspeed/utils/groups.py)
            # and the pipeline engine has no AutoTP path: with stages, tensor parallelism comes from the model's
            # own Megatron-style layers on a PipeModelDataParallelTopology(num_pp, num_mp, num_dp)
            # (deepspeed/runtime/pipe/topology.py), as Megatron-DeepSpeed builds it
            config["pipeline"]["topology"] = {"num_pp": pp, "num_mp": tp, "num_dp": dp}
            log.warning("tp %d with %d pipeline stages: DeepSpeed's AutoTP does not run under its pipeline engine, "
                        "so the ds_config has no tensor_parallel section; build the model's tensor-parallel layers "
                        "(Megatron-DeepSpeed's) and pass PipelineModule a PipeModelDataParallelTopology from "
                        "pipeline.topology", tp, pp)
        if len({last - first for first, last in stage_layers}) == 1:
            config["pipeline"]["partition"] = "uniform"
        _warn_pipeline_module(pp, stage_layers)
    return config


def _warn_pipeline_module(pp: int, stage_layers: list[list[int]]) -> None:
    """One warning naming what the model code must pass to ``PipelineModule``, which DeepSpeed does not read
    from the pipeline section (module docstring)."""
    sizes = [last - first + 1 for first, last in stage_layers]
    if len(set(sizes)) == 1:
        build = f'PipelineModule(num_stages={pp}, partition_method="uniform")'
    else:
        build = (f"PipelineModule(num_stages={pp}) with its stages' layers from pipeline.stage_layers (the stages "
                 f"hold {', '.join(map(str, sizes))} layers, which no DeepSpeed partition_method reproduces)")
    log.warning("plan: DeepSpeed reads neither pipeline.stages nor pipeline.partition from the config; the model "
                "code must build %s (PipelineModule's default partition_method is \"parameters\")", build)


def _warn_data_parallel_size(tp: int, dp: int) -> None:
    """Warn that train_batch_size holds only where DeepSpeed is told the data-parallel size. DeepSpeedConfig
    takes its world size from the ``mpu`` given to ``deepspeed.initialize`` (its
    ``get_data_parallel_world_size()``) or else from ``dist.get_world_size()`` (deepspeed/runtime/config.py:711-724),
    and asserts train_batch_size == micro-batch x gradient_accumulation_steps x that size (config.py:937,
    _batch_assertion), which AutoTP's tensor_parallel section does not change: without an mpu the check counts
    the tp x dp ranks and fails. With pipeline stages deepspeed.initialize takes the size from the
    PipelineModule instead (deepspeed/__init__.py: "mpu must be None with pipeline parallelism")."""
    log.warning("plan: tp %d: DeepSpeed checks train_batch_size against micro-batch x gradient_accumulation_steps x "
                "its data-parallel size, which without an mpu is every rank (%d), not dp %d; the training script "
                "must pass deepspeed.initialize(..., mpu=...) an object whose get_data_parallel_world_size() "
                "returns %d (as DummyMPU in DeepSpeed's tests/unit/model_parallelism/test_autotp_training.py)",
                tp, tp * dp, dp, dp)


def _blocks(plan: Plan) -> int | None:
    """The transformer blocks of the plan (the layers full recompute checkpoints); None when the plan does not
    name its layers' kinds."""
    blocks = sum(kind == "block" for stage in plan.stages for kind in stage.layer_kinds)
    return blocks if blocks > 0 else None


def _zero_optimization(plan: Plan) -> dict[str, Any]:
    """The plan's ZeRO stage, with the runtime's overlap and bucket size (a sharded stage reduces its
    gradients in buckets; stages 1 and 2 also all-gather the updated weights in buckets)."""
    runtime = framework_runtime(plan, "deepspeed")
    section: dict[str, Any] = {"stage": plan.zero}
    if plan.zero >= 1:
        # DeepSpeed turns overlap_comm off for a PipelineModule (with a warning): written as it will run
        section["overlap_comm"] = runtime.overlaps_grad_reduce(plan.zero, pipeline_degree(plan) > 1)
        if runtime.grad_bucket_params:
            section["reduce_bucket_size"] = runtime.grad_bucket_params
            if plan.zero <= 2:
                section["allgather_bucket_size"] = runtime.grad_bucket_params
    return section


def render_deepspeed(plan: Plan) -> str:
    return json.dumps(deepspeed_config(plan), indent=2, sort_keys=True) + "\n"
