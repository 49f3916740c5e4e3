"""A Plan as Megatron-LM launch arguments (``pretrain_gpt.py`` and friends).

Option names are those of Megatron-LM's ``megatron/training/arguments.py`` (at d98e8a64dd). Some are declared
there by hand: ``--overlap-grad-reduce``, ``--overlap-param-gather``, ``--use-distributed-optimizer``,
``--data-parallel-sharding-strategy``, ``--cp-comm-type`` and the pipeline-split options (_add_distributed_args),
``--optimizer`` (_add_training_args), ``--num-experts`` and ``--moe-layer-freq`` (_add_moe_args). The rest are
fields of config dataclasses that ``ArgumentGroupFactory`` turns into options
(``megatron/training/argument_utils.py``: ``--`` + field name with ``_`` -> ``-``, or the name in the field's
``argparse_meta``): ``TransformerConfig`` and the ``ModelParallelConfig`` it extends (tensor/pipeline/context
sizes, sequence parallelism, bf16/fp16, tp_comm_overlap, num_layers, recompute_*, the MoE fields, and
``fp8``/``fp8_recipe`` as ``--fp8-format``/``--fp8-recipe``), ``TrainingConfig`` (micro/global batch),
``DistributedInitConfig`` (use_megatron_fsdp: ``megatron/training/config/common_config.py``) and
``CheckpointConfig.ckpt_format`` (fsdp_dtensor with Megatron-FSDP). The test ``tests/test_export_formats.py``
holds the list with its sources.

The options follow the plan's runtime (``framework_runtime``): megatron-core's overlaps are switched on
where its cost was predicted with them; megatron-lm-2021 is written with Megatron-LM v2.5's options only
(megatron/arguments.py there: its parse_args refuses any other): no overlaps, no distributed optimizer, full
recompute as ``--checkpoint-activations --checkpoint-num-layers 1``, interleaving as
``--num-layers-per-virtual-pipeline-stage``, an even split only. A plan that breaks the rule book for its
runtime (planner.rules: schedule, recompute, sequence parallelism, dtype) is refused, not written.
"""

from __future__ import annotations

import itertools
import logging
import shlex

from planner.errors import ConfigError, PlannerError
from planner.export._uniform import (check_transformer_layers, framework_runtime, pipeline_degree,
                                     refuse_gpipe, require_uniform, stage_comments, transformer_layers, uniform_cp,
                                     uniform_experts, warn_tf32)
from planner.hardware.fp8 import DEFAULT_FP8_RECIPE, FP8, FP8_RECIPES
from planner.plans import Plan, plan_recompute
from planner.rules import check_numerics, check_schedule, check_vpp_shape, chunk_sizes
from planner.runtime import Runtime, get_runtime

log = logging.getLogger(__name__)

# ZeRO stage -> Megatron options. ZeRO-1 (optimizer states sharded) is Megatron's distributed optimizer;
# ZeRO-2/3 are Megatron-FSDP's sharding strategies "optim_grads" and "optim_grads_params", whose checkpoints
# Megatron writes only as fsdp_dtensor (megatron/training/arguments.py, validate_args: "Megatron-FSDP requires
# the `fsdp_dtensor` checkpointing format"; CheckpointConfig.ckpt_format defaults to torch_dist)
_FSDP_ARGS = ("--use-megatron-fsdp", "--ckpt-format", "fsdp_dtensor", "--data-parallel-sharding-strategy")
_ZERO_ARGS = {
    0: (),
    1: ("--use-distributed-optimizer",),
    2: (*_FSDP_ARGS, "optim_grads"),
    3: (*_FSDP_ARGS, "optim_grads_params"),
}
# what the environment of a Megatron-FSDP run must hold: validate_args asserts "FSDP requires
# CUDA_DEVICE_MAX_CONNECTIONS > 1 or unset"
_FSDP_NOTE = "# Megatron-FSDP: leave CUDA_DEVICE_MAX_CONNECTIONS unset or above 1 (Megatron-LM refuses 1 with it)"
# and what tensor or context parallelism without it needs on megatron-core: validate_args requires one hardware
# queue before Blackwell, so that the collectives run in the order the GEMMs that feed them were issued
# (megatron/training/arguments.py:1477); Megatron-LM v2.5 (megatron-lm-2021) has no such check
_STREAM_NOTE = ("# tp or cp > 1: set CUDA_DEVICE_MAX_CONNECTIONS=1 on GPUs before Blackwell (Megatron-LM's "
                "validate_args requires it)")
# the expert-parallel overlap runs its all-to-alls on a second stream, which needs more than one hardware queue
# (validate_args warns that tp or cp > 1 prefer one before Blackwell, and asserts nothing then)
_EP_OVERLAP_NOTE = ("# --overlap-moe-expert-parallel-comm: set CUDA_DEVICE_MAX_CONNECTIONS above 1 (e.g. 32) so the "
                    "all-to-alls run beside the computation")
# fp8 trains bf16 weights with fp8 GEMMs (the format and recipe follow: _fp8_args); fp32 and tf32 both train
# fp32 weights and have no option: Megatron-LM does not switch TF32 on and PyTorch leaves it off by default, so
# a tf32 plan needs the training script to allow it (_uniform.warn_tf32)
_DTYPE_ARGS = {"bf16": ("--bf16",), "fp16": ("--fp16",), "fp32": (), "tf32": (), "fp8": ("--bf16",)}


# the optimizers of Megatron-LM's --optimizer (default adam; megatron/training/arguments.py:2913, choices adam,
# sgd, muon, dist_muon, lion, soap, adaptive_muon; Megatron-LM v2.5 megatron/arguments.py, _add_training_args:
# adam, sgd) among the planner's: no adagrad
_OPTIMIZER_ARGS = {"adam": (), "sgd": ("--optimizer", "sgd")}


def check_optimizer(optimizer: str, what: str) -> None:
    """Refuse an optimizer that Megatron-LM's ``--optimizer`` does not offer (``what``: the input holding it)."""
    if optimizer not in _OPTIMIZER_ARGS:
        raise PlannerError(f"{what}: optimizer {optimizer} has no Megatron-LM option (its --optimizer offers adam "
                           f"and sgd among the planner's optimizers, no {optimizer}); plan with --optimizer adam or "
                           "sgd")


def _fp8_args(plan: Plan) -> list[str]:
    """Megatron-LM's Transformer Engine options of an fp8 plan (TransformerConfig fields ``fp8``, named
    ``--fp8-format`` by its argparse_meta, e4m3|hybrid, and ``fp8_recipe``, tensorwise|delayed|mxfp8|blockwise|
    custom: megatron/core/transformer/transformer_config.py:587-594): the plan's recipe and that recipe's
    Transformer Engine default format."""
    if plan.dtype != FP8:
        return []
    recipe = FP8_RECIPES[plan.fp8_recipe or DEFAULT_FP8_RECIPE]
    return ["--fp8-format", recipe.fp8_format, "--fp8-recipe", recipe.name]


# what runs the transformer layers (check_transformer_layers)
TRAINING = "Megatron-LM's GPT training"


def megatron_args(plan: Plan) -> list[str]:
    """Megatron-LM command-line arguments (an argv list) that run ``plan``."""
    tp, _dp = require_uniform(plan, "Megatron-LM")
    pp = pipeline_degree(plan)
    # Megatron-LM picks 1F1B, its interleaved form, or no pipeline (one micro-batch's forward and backward at
    # a time): megatron/core/pipeline_parallel/schedules.py:53, get_forward_backward_func
    refuse_gpipe(plan, "Megatron-LM", "runs the 1F1B and interleaved schedules only")
    # one recompute configuration for the whole model (TransformerConfig.recompute_granularity)
    recompute = plan_recompute(plan, "Megatron-LM runs one recompute mode on every stage")
    if plan.dtype not in _DTYPE_ARGS:
        raise PlannerError(f"plan: dtype {plan.dtype!r} has no Megatron-LM option; use one of {sorted(_DTYPE_ARGS)}")
    stage_layers = [transformer_layers(s) for s in plan.stages]
    check_transformer_layers(sum(stage_layers), "plan", TRAINING)
    runtime = framework_runtime(plan, "megatron")
    if runtime.name == "megatron-lm-2021" and plan.zero not in runtime.zero_stages:  # no sharded optimizer yet
        raise PlannerError(f"plan: ZeRO-{plan.zero} does not run on {runtime.name} (it runs ZeRO "
                           f"{', '.join(map(str, runtime.zero_stages))}); re-plan with --runtime megatron-core")
    if runtime.name == "megatron-lm-2021" and len(set(stage_layers)) > 1:  # no uneven pipeline in that release
        raise PlannerError(f"plan: its stages hold {', '.join(map(str, stage_layers))} transformer layers, but "
                           f"{runtime.name} splits the layers evenly over the pipeline stages; re-plan with "
                           "--runtime megatron-core, whose layout options express the split")
    _check_rules(plan, runtime, recompute, tp, pp, stage_layers)
    check_optimizer(plan.optimizer, "plan")
    cp = uniform_cp(plan, "Megatron-LM")
    if cp > 1 and not runtime.context_parallel:
        raise PlannerError(f"plan: cp {cp} (context parallelism) does not run on {runtime.name}; re-plan with "
                           "--runtime megatron-core")
    args = ["--tensor-model-parallel-size", str(tp), "--pipeline-model-parallel-size", str(pp),
            "--num-layers", str(sum(stage_layers))]
    if runtime.context_parallel:  # written at 1 too, as every parallel degree is (the contract's list)
        args += ["--context-parallel-size", str(cp)]
    if cp > 1:  # the ring exchange of K and V the cost model times (planner.cost.context)
        args += ["--cp-comm-type", "p2p"]
    args += _pipeline_split_args(stage_layers, plan.vpp, runtime)
    args += _moe_args(plan, runtime)
    args += ["--micro-batch-size", str(plan.micro_batch), "--global-batch-size", str(plan.global_batch)]
    if plan.sequence_parallel and tp > 1:
        args.append("--sequence-parallel")
    args += _recompute_args(recompute, runtime, get_runtime(plan.runtime))
    args += list(_OPTIMIZER_ARGS[plan.optimizer])
    args += list(_ZERO_ARGS[plan.zero])
    args += _overlap_args(runtime, plan, tp, _dp * cp)  # gradients reduce over the dp x cp ranks
    args += list(_DTYPE_ARGS[plan.dtype]) + _fp8_args(plan)
    warn_tf32(plan, "Megatron-LM")
    _warn_fp32_on_transformer_engine(plan, runtime)
    return args


def _warn_fp32_on_transformer_engine(plan: Plan, runtime: Runtime) -> None:
    """Warn that an fp32 plan runs faster than costed on megatron-core: its layers are Transformer Engine's
    (TransformerConfig.transformer_impl defaults to "transformer_engine":
    megatron/core/transformer/transformer_config.py:1314), and Transformer Engine computes a GEMM whose
    inputs and output are all fp32 as TF32 (CUBLAS_COMPUTE_32F_FAST_TF32: TransformerEngine d0067d0da6cb,
    transformer_engine/common/gemm/cublaslt_gemm.cu:445-449). megatron-lm-2021 predates Transformer Engine."""
    if plan.dtype == "fp32" and runtime.name != "megatron-lm-2021":
        log.warning("plan: dtype fp32 is costed with fp32 GEMMs, but Transformer Engine, whose layers %s runs, "
                    "computes fp32 GEMMs as TF32, so the job will run faster than the plan predicts; a plan made "
                    "with --dtype tf32 costs those GEMMs as they run", runtime.name)


def _check_rules(plan: Plan, runtime: Runtime, recompute: str, tp: int, pp: int, stage_layers: list[int]) -> None:
    """The rule book's verdict on what the options express (planner.rules: the schedule and vpp, the split
    into chunks, whole ones where the runtime has no uneven pipeline and a layout's otherwise, recompute,
    sequence parallelism and dtype against the runtime), for a plan file written by hand or before a rule."""
    try:
        check_schedule(plan.schedule, plan.vpp, pp, runtime)
        if plan.vpp > 1:  # a layout (uneven runtimes) takes chunks of any size, empty ones too
            check_vpp_shape(plan.vpp, pp, sum(stage_layers), None, runtime=runtime, layout=runtime.uneven_pipeline)
        check_numerics(recompute, plan.optimizer, plan.dtype, plan.sequence_parallel, tp, runtime)
    except ConfigError as exc:
        raise PlannerError(f"plan: {exc}") from None


def _recompute_args(recompute: str, runtime: Runtime, costed: Runtime) -> list[str]:
    """Activation recompute: megatron-lm-2021 has only full recompute, ``--checkpoint-activations`` with
    ``--checkpoint-num-layers`` layers per checkpoint (Megatron-LM v2.5 megatron/arguments.py,
    _add_training_args); Megatron-Core names the granularity, and full recompute of each layer on its own is
    ``--recompute-method uniform --recompute-num-layers 1`` (megatron/core/transformer/transformer_config.py:
    recompute_granularity, recompute_method, recompute_num_layers).

    Selective recompute checkpoints core attention (Megatron-LM d98e8a64dd: ``recompute_modules`` defaults
    to ["core_attn"], megatron/core/transformer/transformer_config.py:1940, ``__post_init__``;
    megatron/core/transformer/attention.py:392 and :1555 run it under ``tensor_parallel.checkpoint`` when
    ``checkpoint_core_attention``), so the job re-runs attention's forward in the backward pass. Under the
    FlashAttention of ``costed`` (the runtime the plan was costed with) the cost model times selective as no
    recompute (planner.rules.recompute_choices), so it is written as no recompute, with a warning; under a
    runtime that keeps the attention scores it is written as is."""
    if recompute == "full" and runtime.name == "megatron-lm-2021":
        return ["--checkpoint-activations", "--checkpoint-num-layers", "1"]
    if recompute == "full":
        return ["--recompute-granularity", "full", "--recompute-method", "uniform", "--recompute-num-layers", "1"]
    if recompute == "selective" and costed.attention == "flash":
        log.warning("plan: recompute selective is costed as no recompute under %s's FlashAttention (it keeps no "
                    "attention scores for selective recompute to drop), so no recompute option is written; add "
                    "--recompute-granularity selective to checkpoint core attention anyway, at the cost of "
                    "re-running attention's forward in every backward pass, which the plan did not cost",
                    costed.name)
        return []
    if recompute == "selective":
        return ["--recompute-granularity", "selective"]
    return []


def _moe_args(plan: Plan, runtime: Runtime) -> list[str]:
    """A mixture-of-experts model's options (Megatron-Core's ``TransformerConfig.num_moe_experts`` is the
    ``--num-experts`` option; ``moe_router_topk``, ``ModelParallelConfig.expert_model_parallel_size`` and
    ``expert_tensor_parallel_size`` are named after their fields): the routed experts, the experts per token,
    the expert-parallel and expert tensor-parallel degrees the plan was costed with, and the all-to-all token
    dispatcher whose dispatch and combine the cost model times (planner.cost.moe; Megatron's default is
    ``allgather``)."""
    experts = plan.model.get("experts")
    if not experts:
        return []
    if not runtime.expert_parallel:
        raise PlannerError(f"plan: a mixture-of-experts model cannot run on {runtime.name}, which has no MoE "
                           "layers; re-plan with --runtime megatron-core")
    ep, expert_tp = uniform_experts(plan, "Megatron-LM")
    args = ["--num-experts", str(experts), "--moe-router-topk", str(plan.model.get("top_k", 1)),
            "--expert-model-parallel-size", str(ep), "--expert-tensor-parallel-size", str(expert_tp),
            "--moe-token-dispatcher-type", "alltoall"]
    if plan.ep_overlap:  # the merged steps planner.cost.moe times, with the experts' weight gradient deferred
        args += ["--overlap-moe-expert-parallel-comm", "--delay-wgrad-compute"]
    return args + _moe_layer_args(plan.model)


def _moe_layer_args(model: dict) -> list[str]:
    """What builds the plan's MoE layers rather than Megatron's defaults (every layer MoE, no shared expert,
    experts as wide as ``--ffn-hidden-size``, softmax scores): ``--moe-ffn-hidden-size``,
    ``--moe-shared-expert-intermediate-size`` (the shared experts' total width), ``--moe-layer-freq`` (a list
    over the transformer layers, 1 for MoE, in the Python-list form megatron/training/arguments.py evaluates:
    ``([0]*1+[1]*7)``) and ``--moe-router-score-function`` (megatron/core/transformer/transformer_config.py:
    moe_ffn_hidden_size, moe_shared_expert_intermediate_size, moe_layer_freq, moe_router_score_function). A
    plan written before these entries were recorded gets none of them."""
    args: list[str] = []
    width = model.get("expert_ffn")
    if width:
        args += ["--moe-ffn-hidden-size", str(width)]
        if model.get("shared_experts"):
            args += ["--moe-shared-expert-intermediate-size", str(model["shared_experts"] * width)]
    pattern = model.get("moe_layer_pattern")
    if pattern and not all(pattern):
        runs = [(value, len(list(group))) for value, group in itertools.groupby(pattern)]
        args += ["--moe-layer-freq", "(" + "+".join(f"[{value}]*{count}" for value, count in runs) + ")"]
    if model.get("router") in ("softmax", "sigmoid"):
        args += ["--moe-router-score-function", model["router"]]
    return args


def _overlap_args(runtime: Runtime, plan: Plan, tp: int, dp: int) -> list[str]:
    """The overlaps the runtime's cost was predicted with: gradient reduce-scatter in the backward pass
    (with data parallelism), the distributed optimizer's parameter all-gather in the next forward (ZeRO-1 and
    up, and only beside the gradient overlap: validate_args asserts "Must use --overlap-param-gather with
    --overlap-grad-reduce", megatron/training/arguments.py:1028, which a registered runtime may break), and
    tensor-parallel collectives under the GEMMs (Megatron requires sequence parallelism for it)."""
    args = []
    if runtime.overlap_grad_reduce and dp > 1:
        args.append("--overlap-grad-reduce")
    if runtime.overlap_param_gather and plan.zero >= 1 and "--overlap-grad-reduce" in args:
        args.append("--overlap-param-gather")
    if runtime.tp_comm_overlap and tp > 1 and plan.sequence_parallel:
        args.append("--tp-comm-overlap")
    return args


def _pipeline_split_args(stage_layers: list[int], vpp: int, runtime: Runtime) -> list[str]:
    """How the transformer layers are shared out over the stages and their virtual chunks. Megatron-LM
    takes one of ``--num-layers-per-virtual-pipeline-stage``, ``--num-virtual-stages-per-pipeline-rank`` and
    ``--pipeline-model-parallel-layout``, and reads vpp from the layout's chunks where a layout is given
    (megatron/training/arguments.py, validate_args: "No more than one of the following arguments can be set
    at the same time"), so a layout is written without a vpp option. megatron-lm-2021 names the chunk size
    (Megatron-LM v2.5 megatron/arguments.py has only --num-layers-per-virtual-pipeline-stage)."""
    split = _split_args(stage_layers, vpp)
    if vpp == 1 or "--pipeline-model-parallel-layout" in split:
        return split
    if runtime.name == "megatron-lm-2021":
        return ["--num-layers-per-virtual-pipeline-stage", str(sum(stage_layers) // (len(stage_layers) * vpp))] + split
    return ["--num-virtual-stages-per-pipeline-rank", str(vpp)] + split


def _split_args(stage_layers: list[int], vpp: int) -> list[str]:
    """Nothing for an even split; ``--decoder-first/last-pipeline-num-layers`` when only the first and/or
    last stage differ, every stage holds whole chunks and none is empty (Megatron-Core gives each chunk of the
    first, last and middle stages ``n // vpp`` layers: ``get_transformer_layer_offset``,
    megatron/core/transformer/transformer_layer.py; ``TransformerConfig.__post_init__``,
    megatron/core/transformer/transformer_config.py, requires both counts > 0);
    ``--pipeline-model-parallel-layout`` otherwise, which also takes a stage of only the embedding or only
    the loss (megatron/core/transformer/pipeline_parallel_layer_layout.py, ``parse_str_to_list``: "|"
    separates the stages, a stage may hold no "t")."""
    if len(set(stage_layers)) == 1 and stage_layers[0] % vpp == 0:
        return []
    if all(n > 0 and n % vpp == 0 for n in stage_layers):
        middle = stage_layers[1:-1]
        if len(set(middle)) <= 1:
            even = middle[0] if middle else None
            args: list[str] = []
            if even is None or stage_layers[0] != even:
                args += ["--decoder-first-pipeline-num-layers", str(stage_layers[0])]
            if even is None or stage_layers[-1] != even:
                args += ["--decoder-last-pipeline-num-layers", str(stage_layers[-1])]
            return args
    # Layout string: pp x vpp chunks separated by "|", virtual round after virtual round (chunk v*pp + p runs
    # on stage p); "E" the embedding (first chunk), "t" a transformer layer, "L" the loss (last chunk).
    # A stage's layers are shared out over its vpp chunks as evenly as they go (planner.rules.chunk_sizes).
    parts = ["t" * size for size in chunk_sizes(stage_layers, vpp)]
    parts[0] = "E" + parts[0]
    parts[-1] = parts[-1] + "L"
    return ["--pipeline-model-parallel-layout", "|".join(parts)]


def render_megatron(plan: Plan) -> str:
    """Shell-ready arguments, one option per line, preceded by comments naming the device layout."""
    args = megatron_args(plan)
    pp = pipeline_degree(plan)
    runtime = framework_runtime(plan, "megatron")
    tp, dp, cp = plan.stages[0].tp, plan.stages[0].dp, plan.stages[0].cp
    layout = f"tp {tp} x cp {cp} x pp {pp} x dp {dp}" if cp > 1 else f"tp {tp} x pp {pp} x dp {dp}"
    lines = [f"# Megatron-LM arguments for {plan.model.get('name', 'model')}: "
             f"{tp * cp * pp * dp} GPUs = {layout}, runtime {runtime.name}",
             "# pass them to pretrain_gpt.py (or your training script) after the model-size arguments"]
    if not plan.stages[0].layer_kinds:
        lines.append("# the plan has no layer kinds: every layer is counted as a transformer layer")
    if "--use-megatron-fsdp" in args:
        lines.append(_FSDP_NOTE)
    elif plan.ep_overlap:
        lines.append(_EP_OVERLAP_NOTE)
    elif (tp > 1 or cp > 1) and runtime.name != "megatron-lm-2021":
        lines.append(_STREAM_NOTE)
    lines += stage_comments(plan)
    options: list[list[str]] = []
    for arg in args:
        if arg.startswith("--"):
            options.append([arg])
        else:
            options[-1].append(arg)
    body = [" ".join(shlex.quote(part) for part in option) for option in options]
    lines += [line + " \\" for line in body[:-1]] + body[-1:]
    return "\n".join(lines) + "\n"
