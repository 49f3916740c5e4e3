"""A Plan as a torchtitan configuration: a Python module with one function that returns ``Trainer.Config``.

torchtitan (at b5bcd76c, 2026-08-21) is configured in Python: a configuration is a zero-argument function
returning ``Trainer.Config``, chosen with ``--module``/``--config``; its ``--section.option`` flags are frozen
and will be removed (torchtitan/config/README.md). The module written here does what that README and the
shipped configurations do (torchtitan_recipes/tests/features.py: ``config = llama3_debugmodel()`` followed by
``config.parallelism.... = ...``): it calls a base recipe, the one import line the user may edit, and
overrides what the plan decides. The base brings the model, tokenizer, data, optimizer and checkpointing; a
llama-family plan builds on the llama3 recipe nearest its size (torchtitan/models/llama3/config_registry.py:
``llama3_8b``, ``llama3_70b``, ``llama3_405b``: the per-model registries are still where those recipes live at
that commit, torchtitan_recipes holding only tests/), any other on a placeholder that raises until the user
names a recipe. The function refuses a base whose model has another number of transformer layers than the
plan split.

Every name comes from torchtitan at b5bcd76c:

* ``Trainer.Config`` fields ``model_spec``, ``training``, ``parallelism``, ``activation_checkpoint``,
  ``compile`` (torchtitan/trainer.py:70-116); ``ModelSpec.model`` (torchtitan/protocols/model_spec.py:38),
  whose decoder config lists its blocks in ``layers`` (torchtitan/models/common/decoder.py:79).
* ``TrainingConfig`` (torchtitan/config/configs.py:36-117): ``num_tokens_per_microbatch_per_dp_rank`` (:37,
  micro-batch x sequence length: tokens per data-parallel rank in one forward, before tensor or context
  parallel sharding), ``num_tokens_per_train_step`` (:43, global batch x sequence length; torchtitan derives
  the gradient accumulation steps from it, trainer.py:409-428), ``max_context_length`` (:51, the sequence
  length), ``disable_cuda_graphs`` (:75; trainer.py:168-176 refuses CUDA graphs with pipeline parallelism),
  ``dtype`` (:87, Literal bfloat16/float32: float32 keeps the fp32 parameters the runtime costs) and
  ``mixed_precision_param`` (:94, Literal bfloat16/float32; ``mixed_precision_reduce`` :102 is float32 only,
  the fp32 gradient reduction the runtime costs).
* ``ParallelismConfig`` (configs.py:121-290): ``data_parallel_replicate_degree`` (:122),
  ``data_parallel_shard_degree`` (:133), ``fsdp_reshard_after_forward`` (:145, "default"/"always"/"never",
  resolved in torchtitan/distributed/fsdp.py:112-136), ``tensor_parallel_degree`` (:166),
  ``enable_sequence_parallel`` (:169, True by default, so it is always written), ``pipeline_parallel_degree``
  (:180), ``module_fqns_per_model_part`` (:187), ``pipeline_parallel_schedule`` (:216), ``num_pp_microbatches``
  (:232, micro-batches per data-parallel rank and gradient accumulation step), ``context_parallel_degree``
  (:239) and ``expert_parallel_degree`` (:282; torchtitan/distributed/parallel_dims.py:187-192 asks that ep
  divide data_parallel_shard_degree x cp x tp, the ranks expert parallelism borrows).
* ZeRO-3 is FSDP2 over dp ranks with ``fsdp_reshard_after_forward = "always"``, ZeRO-2 the same with
  ``"never"`` (parameters kept gathered from forward to backward), ZeRO-0 ``data_parallel_replicate_degree =
  dp`` with a shard degree of 1, DDP as torchtitan_recipes/tests/features.py ``llama3_debugmodel_ddp4`` writes it
  (torchtitan/models/llama3/parallelize.py:57-78 applies ``fully_shard`` either way, with the
  ``mixed_precision_param``).
* Schedules by the names torch.distributed.pipelining's ``get_schedule_class`` takes, as torchtitan uses them:
  ``1F1B`` (configs.py:216), ``Interleaved1F1B`` (torchtitan/models/llama3/config_registry.py:66), ``GPipe``
  (torchtitan_recipes/tests/features.py:163). A stage's modules are the decoder's ``tok_embeddings``,
  ``layers.N``, ``norm`` and ``lm_head`` (decoder.py:248-255; pipeline_parallel.py:387 and :456 list them
  so); ``module_fqns_per_model_part`` holds one list per model chunk in model order, chunk c on pipeline rank
  c mod pp (pipeline_parallel.py:88 takes the list as given, :559 assigns the chunks), so with vpp > 1 a
  stage's blocks are shared out over its chunks as Megatron-LM's layout does (``planner.rules.chunk_sizes``).
* Activation checkpointing: ``None`` (no recompute: parallelize.py:46), ``FullAC.Config()`` (the whole block,
  torchtitan/distributed/activation_checkpoint.py:166) and ``SelectiveAC.Config()`` (:185, the per-op policy
  that saves matrix products, attention and reduce-scatters but every second matrix product, :269: the
  selective recompute the pytorch-fsdp2 runtime costs, ``Runtime.selective_recompute == "alternate-gemm"``).
* fp8: torchtitan converts the model config at config time, as ``model_registry(converters=...)`` does
  (torchtitan/models/llama3/__init__.py:381: ``config = c.build().convert(config)``), with
  ``Float8LinearConverter.Config`` (``recipe_name`` rowwise, ``filter_fqns``, torchao's dynamic scaling:
  torchtitan/components/quantization/float8.py:53-72) or, for an mxfp8 plan, ``MXFP8LinearConverter.Config``
  (``fqns``: components/quantization/mx.py:50-60), and their grouped-experts converters for a mixture of
  experts (float8.py ``Float8GroupedExpertsConverter``, mx.py ``MXFP8GroupedExpertsConverter``); both take
  ``model_compile_enabled`` (components/quantization/__init__.py:30). The output layer stays bf16, as the plan
  costs it (``filter_fqns=["lm_head"]`` as llama3_405b, ``fqns=["layers"]`` as the nvfp4 recipes write).

What torchtitan cannot run is refused with the fix: embedding tables (TorchRec places them), ZeRO-1 (FSDP2
shards parameters and gradients with the optimizer states, or nothing), fp16 (``mixed_precision_param`` is
bfloat16 or float32), an optimizer other than Adam (torchtitan builds Adam, AdamW and DistMuon only:
torchtitan/components/optimizer/optimizer.py:142-150; the base recipe's AdamW keeps Adam's two moments),
heterogeneous stages, expert layouts it has no mesh for, and layers its decoder has no module for.
"""

from __future__ import annotations

import json
import logging
import math
import re
import textwrap
from typing import Any

from planner.errors import PlannerError
from planner.export import _uniform
from planner.export._uniform import (check_transformer_layers, pipeline_degree, require_uniform,
                                     stage_comments, transformer_layers, uniform_cp, uniform_experts, warn_tf32)
from planner.hardware.fp8 import DEFAULT_FP8_RECIPE, FP8
from planner.plans import Plan, cluster_group, plan_recompute
from planner.rules import FORMAT_DTYPES, chunk_sizes
from planner.runtime import get_runtime

log = logging.getLogger(__name__)

COMMIT = "b5bcd76c"  # the torchtitan commit whose names the export writes
TRAINING = "torchtitan's decoder training"  # what runs the transformer layers (check_transformer_layers)

# the base recipes by the family a model's builder records, each family's module and its recipes with the
# parameters of their model (torchtitan/models/llama3/config_registry.py: llama3_8b, llama3_70b, llama3_405b
# build the 8B, 70B and 405B flavors); a plan takes the recipe nearest its size
_RECIPES: dict[str, tuple[str, tuple[tuple[str, float], ...]]] = {
    "llama": ("torchtitan.models.llama3.config_registry",
              (("llama3_8b", 8e9), ("llama3_70b", 70e9), ("llama3_405b", 405e9))),
}
_SCHEDULES = {"1f1b": "1F1B", "interleaved": "Interleaved1F1B", "gpipe": "GPipe"}
# the weights' compute dtype under FSDP2's MixedPrecisionPolicy; fp8 trains bf16 weights with fp8 GEMMs, tf32
# computes fp32 weights (warn_tf32: torchtitan switches TF32 off, in its batch-invariant mode only, and never on:
# torchtitan/distributed/utils.py:379)
_PARAM_DTYPES = {"bf16": "bfloat16", "fp8": "bfloat16", "fp32": "float32", "tf32": "float32"}
_RESHARD = {2: "never", 3: "always"}
_ZERO_WORDS = {0: "DDP, every rank holds the parameters, gradients and optimizer states",
               2: "FSDP2 keeping the parameters gathered from forward to backward",
               3: "FSDP2 gathering the parameters per layer in forward and in backward"}
_OPTIMIZERS = ("adam",)  # the planner's optimizers torchtitan builds (module docstring)
_DECODER = "torchtitan's decoder (tok_embeddings, layers.N, norm, lm_head)"


def check_no_tables(count: int, what: str) -> None:
    """Refuse a plan (or a model, before its search) with ``count`` sparse embedding tables."""
    _uniform.check_no_tables(count, what, "a torchtitan configuration", "torchtitan's models hold none")


def check_optimizer(optimizer: str, what: str) -> None:
    """Refuse an optimizer torchtitan does not build (``what``: the input holding it)."""
    if optimizer not in _OPTIMIZERS:
        raise PlannerError(f"{what}: optimizer {optimizer} has no torchtitan optimizer (it builds Adam, AdamW and "
                           "DistMuon); plan with --optimizer adam")


def torchtitan_config(plan: Plan) -> dict[str, Any]:
    """What the torchtitan module of ``plan`` writes: ``fields``, the ``Trainer.Config`` attribute paths and
    their values; ``activation_checkpoint``, the policy class (``SelectiveAC``, ``FullAC``, or None for none);
    ``converters``, the quantization converters' classes and arguments (fp8); ``base``, the module and recipe
    the function builds on (None: the user names one); ``transformer_layers``, the blocks the plan splits;
    ``module`` and ``function``, the names to launch it by."""
    check_no_tables(len(plan.embeddings), "plan")
    tp, dp = require_uniform(plan, "torchtitan")
    cp = uniform_cp(plan, "torchtitan")
    pp = pipeline_degree(plan)
    recompute = plan_recompute(plan, "torchtitan applies one activation checkpointing policy to every block")
    blocks = sum(transformer_layers(stage) for stage in plan.stages)
    check_transformer_layers(blocks, "plan", TRAINING)
    check_optimizer(plan.optimizer, "plan")
    _check_zero_and_dtype(plan)
    seq = _sequence_length(plan)
    micro_batches = plan.batching.num_micro_batches
    if plan.micro_batch * micro_batches * dp != plan.global_batch:
        raise PlannerError(f"plan: global batch {plan.global_batch} is not micro-batch {plan.micro_batch} x dp {dp} "
                           "x an integer number of micro-batches, which torchtitan's token budgets require")
    divisor = (tp if plan.sequence_parallel else 1) * (2 * cp if cp > 1 else 1)
    if plan.micro_batch * seq % divisor:  # torchtitan/trainer.py:299-308
        raise PlannerError(f"plan: micro-batch {plan.micro_batch} x {seq} tokens does not split into {divisor} equal "
                           "parts, which torchtitan asks of the tokens of a micro-batch under its sequence and "
                           "context parallelism; re-plan with another --micro-batch")
    shard = dp if plan.zero >= 2 else 1
    ep = _expert_degree(plan, tp, cp, shard)
    fields: dict[str, Any] = {
        "parallelism.data_parallel_replicate_degree": 1 if plan.zero >= 2 else dp,
        "parallelism.data_parallel_shard_degree": shard,
    }
    if plan.zero >= 2:
        fields["parallelism.fsdp_reshard_after_forward"] = _RESHARD[plan.zero]
    fields.update({
        "parallelism.tensor_parallel_degree": tp,
        "parallelism.enable_sequence_parallel": bool(plan.sequence_parallel and tp > 1),
        "parallelism.context_parallel_degree": cp,
        "parallelism.expert_parallel_degree": ep,
        "parallelism.pipeline_parallel_degree": pp,
    })
    if pp > 1:
        fields.update({
            "parallelism.pipeline_parallel_schedule": _schedule(plan),
            "parallelism.module_fqns_per_model_part": _module_fqns(plan),
            "parallelism.num_pp_microbatches": micro_batches,
        })
    fields.update({
        "training.max_context_length": seq,
        "training.num_tokens_per_microbatch_per_dp_rank": plan.micro_batch * seq,
        "training.num_tokens_per_train_step": plan.global_batch * seq,
        "training.dtype": "float32",
        "training.mixed_precision_param": _PARAM_DTYPES[plan.dtype],
    })
    if pp > 1 or ep > 1:
        # torchtitan refuses CUDA graphs with pipeline stages, and with expert parallelism but for two dispatchers
        fields["training.disable_cuda_graphs"] = True
    if cp > 1:
        log.warning("plan: cp %d is written as torchtitan's context_parallel_degree, whose FlexAttention context "
                    "parallelism and FSDP over dp x cp ranks the pytorch-fsdp2 runtime does not model (it has no "
                    "context parallelism); the plan's times are its runtime's, %s", cp, plan.runtime)
    warn_tf32(plan, "torchtitan")
    base = _base_recipe(plan)
    ident = _identifier(str(plan.model.get("name", "model")))
    return {"fields": fields, "activation_checkpoint": _checkpointing(plan, recompute),
            "converters": _converters(plan), "base": base, "transformer_layers": blocks,
            "module": f"planner_{ident}", "function": f"{ident}_planned"}


def _check_zero_and_dtype(plan: Plan) -> None:
    """Refuse a ZeRO stage and a dtype torchtitan has no setting for."""
    if plan.zero not in (0, *_RESHARD):
        raise PlannerError(f"plan: ZeRO-{plan.zero} has no torchtitan setting (FSDP2 shards parameters, gradients and "
                           "optimizer states together, ZeRO-3, or keeps parameters gathered from forward to backward, "
                           "ZeRO-2); re-plan with --runtime pytorch-fsdp2 (ZeRO 0, 2 or 3)")
    if plan.dtype not in FORMAT_DTYPES["torchtitan"]:
        raise PlannerError(f"plan: dtype {plan.dtype} has no torchtitan setting (mixed_precision_param is bfloat16 or "
                           "float32); re-plan with --dtype bf16 (fp32 where the devices lack bf16)")


def _sequence_length(plan: Plan) -> int:
    """The tokens per sample the plan was costed at, which torchtitan's token budgets are counted in."""
    seq = plan.model.get("seq_len")
    if not isinstance(seq, int) or seq < 1:
        raise PlannerError("plan: its model entry records no sequence length (seq_len), which torchtitan's token "
                           "budgets need; re-create the plan with 'planner plan MODEL ... --out FILE'")
    return seq


def _expert_degree(plan: Plan, tp: int, cp: int, shard: int) -> int:
    """The expert-parallel degree, where torchtitan lays the plan's experts out as it does: split over ep ranks
    borrowed from its shard x cp x tp ranks and not split further (torchtitan/models/common/MOE_SHARDING.md:
    with EP on the routed experts are Shard(0) on EP, with EP off TP-sharded like the dense layers)."""
    ep, expert_tp = uniform_experts(plan, "torchtitan")
    if not plan.model.get("experts"):
        return 1
    wanted = 1 if ep > 1 else tp
    if expert_tp != wanted:
        raise PlannerError(f"plan: ep {ep} with expert-tp {expert_tp}: torchtitan splits each expert over tp ranks "
                           f"without expert parallelism and over none with it (expert-tp {wanted} here); re-plan "
                           f"with --expert-tp {wanted}")
    if (shard * cp * tp) % ep:
        raise PlannerError(f"plan: ep {ep} does not divide the {shard * cp * tp} ranks torchtitan borrows expert "
                           f"parallelism from (FSDP shard degree {shard} x cp {cp} x tp {tp}; a ZeRO-0 plan shards "
                           "over no data-parallel rank); re-plan with --ep dividing it, or with --zero 2 or 3")
    return ep


def _schedule(plan: Plan) -> str:
    """torchtitan's name of the plan's pipeline schedule."""
    schedule = _SCHEDULES.get(plan.schedule)
    if schedule is None:
        raise PlannerError(f"plan: schedule {plan.schedule} has no torchtitan name; re-plan with --schedule 1f1b")
    return schedule


def _module_fqns(plan: Plan) -> list[list[str]]:
    """One list of torchtitan module names per model chunk, in model order (module docstring): the embedding
    on the first chunk, the head (``norm`` and ``lm_head``) on the last, every block on the chunk its stage
    gives it."""
    kinds = [kind for stage in plan.stages for kind in stage.layer_kinds]
    names = [name for stage in plan.stages for name in stage.layer_names]
    if len(kinds) != len(names):
        raise PlannerError("plan: its stages name no layer kinds, so its layers have no torchtitan module names; "
                           "re-create the plan with 'planner plan MODEL ... --out FILE'")
    for index, kind in enumerate(kinds):
        wanted = "embedding" if index == 0 else "head" if index == len(kinds) - 1 else "block"
        if kind != wanted:
            raise PlannerError(f"plan: layer {index} ({names[index]}) is a {kind} layer where {_DECODER} has a "
                               f"{wanted}; a pipeline of this model cannot be split in torchtitan; use --format json")
    sizes = chunk_sizes([transformer_layers(stage) for stage in plan.stages], max(plan.vpp, 1))
    parts: list[list[str]] = []
    first = 0
    for chunk, size in enumerate(sizes):
        part = ["tok_embeddings"] if chunk == 0 else []
        part += [f"layers.{block}" for block in range(first, first + size)]
        part += ["norm", "lm_head"] if chunk == len(sizes) - 1 else []
        if not part:
            raise PlannerError(f"plan: model chunk {chunk} holds no layer, which torchtitan cannot run as a pipeline "
                               "stage; re-plan with a smaller --vpp")
        parts.append(part)
        first += size
    return parts


def _checkpointing(plan: Plan, recompute: str) -> str | None:
    """The activation checkpointing policy of ``recompute``: SelectiveAC for selective where the plan was costed
    with torchtitan's per-op policy; where its runtime costed Megatron's attention-core recompute instead, no
    checkpointing under FlashAttention (where that recompute saves nothing) and SelectiveAC otherwise, each with
    a warning."""
    if recompute == "none":
        return None
    if recompute == "full":
        return "FullAC"
    costed = get_runtime(plan.runtime)
    if costed.selective_recompute == "alternate-gemm":
        return "SelectiveAC"
    if costed.selective_recomputes_nothing:
        log.warning("plan: recompute selective is costed as no recompute under %s's FlashAttention, so no activation "
                    "checkpointing is written; torchtitan's SelectiveAC would re-run every op but the saved matrix "
                    "products, which the plan did not cost", costed.name)
        return None
    log.warning("plan: recompute selective was costed as %s's recompute of the attention core; torchtitan's "
                "SelectiveAC, written for it, is a per-op policy whose memory and time differ", costed.name)
    return "SelectiveAC"


def _converters(plan: Plan) -> list[dict[str, Any]]:
    """The quantization converters of an fp8 plan (module docstring): float8 with torchao's rowwise scaling, or
    MXFP8 for an mxfp8 plan, on every linear layer but the output layer, and on the grouped experts of a mixture
    of experts."""
    if plan.dtype != FP8:
        return []
    recipe = plan.fp8_recipe or DEFAULT_FP8_RECIPE
    if recipe == "mxfp8":
        converters = [{"class": "MXFP8LinearConverter", "fqns": ["layers"]}]
        experts = "MXFP8GroupedExpertsConverter"
    else:
        converters = [{"class": "Float8LinearConverter", "recipe_name": "rowwise", "filter_fqns": ["lm_head"]}]
        experts = "Float8GroupedExpertsConverter"
        if recipe != DEFAULT_FP8_RECIPE:
            log.warning("plan: fp8 recipe %s (Transformer Engine's) is written as torchtitan's float8 with torchao's "
                        "rowwise scaling, whose scales take other memory than the plan counts", recipe)
    if plan.model.get("experts"):
        converters.append({"class": experts})
    return converters


def _base_recipe(plan: Plan) -> tuple[str, str] | None:
    """The module and recipe a plan's function builds on: for a family torchtitan has recipes of, the one whose
    model is nearest the plan's in parameters; None otherwise."""
    family = _RECIPES.get(str(plan.model.get("family")))
    params = plan.model.get("params")
    if family is None or not isinstance(params, (int, float)) or params <= 0:
        return None
    module, recipes = family
    name = min(recipes, key=lambda recipe: abs(math.log(params / recipe[1])))[0]
    return module, name


def _identifier(name: str) -> str:
    """A Python identifier from a model name (``llama2-7b`` -> ``llama2_7b``)."""
    ident = re.sub(r"\W+", "_", name.strip()).strip("_").lower() or "model"
    return ident if not ident[0].isdigit() else f"model_{ident}"


def _launch_lines(plan: Plan, module: str, function: str, world: int) -> list[str]:
    """How to start ``world`` processes: run_train.sh on one node, torchrun across the nodes the plan's first
    device sits on (as many devices a node as its cluster group has)."""
    group = cluster_group(plan, plan.stages[0].devices[0]) if plan.stages[0].devices else None
    per_node = group["devices"] // group["count"] if group and group.get("count") else 0
    lines = [f"# Save as {module}.py where torchtitan can import it (a torchtitan checkout's root), then start",
             f"# {world} processes, one per GPU:"]
    if per_node and world > per_node and world % per_node == 0:
        return lines + [f"#   torchrun --nnodes {world // per_node} --nproc_per_node {per_node} --rdzv_backend c10d "
                        "--rdzv_endpoint HOST:PORT \\",
                        f"#     -m torchtitan.train --module {module} --config {function}"]
    return lines + [f"#   NGPU={world} MODULE={module} CONFIG={function} ./run_train.sh"]


def _literal(value: Any, indent: str = "    ") -> str:
    """``value`` (a bool, number, string or list of them) as Python source, strings in double quotes; a list of
    lists one inner list a line under ``indent``, each wrapped to stay within 116 columns."""
    if isinstance(value, str):
        return json.dumps(value)
    if not isinstance(value, list):
        return repr(value)
    if not any(isinstance(item, list) for item in value):
        return "[" + ", ".join(_literal(item) for item in value) + "]"
    inner = indent + "    "
    rows = ["\n".join(textwrap.wrap(_literal(item), 116, initial_indent=inner,
                                     subsequent_indent=inner + " ", break_on_hyphens=False, break_long_words=False))
            for item in value]
    return "[\n" + ",\n".join(rows) + ",\n" + indent + "]"


def render_torchtitan(plan: Plan) -> str:
    """The Python module: a comment header (the layout and how to launch it), the imports, the base recipe, and
    one function that returns the base recipe's ``Trainer.Config`` with what the plan decides."""
    config = torchtitan_config(plan)
    tp, cp, dp, pp = plan.stages[0].tp, plan.stages[0].cp, plan.stages[0].dp, pipeline_degree(plan)
    world = tp * cp * pp * dp
    name = " ".join(str(plan.model.get("name", "model")).split())
    layers = config["transformer_layers"]
    devices = ", ".join(dict.fromkeys(stage.device_type for stage in plan.stages))  # in stage order
    lines = [f"# torchtitan configuration for {name}, written by planner --format torchtitan for torchtitan {COMMIT}",
             f"# {world} GPUs ({devices}) = tp {tp} x cp {cp} x pp {pp} x dp {dp}; "
             f"ZeRO-{plan.zero}, {plan.dtype}, runtime {plan.runtime}"]
    lines += _launch_lines(plan, config["module"], config["function"], world)
    lines += stage_comments(plan)
    lines.append("")
    policy = config["activation_checkpoint"]
    if policy:
        lines.append(f"from torchtitan.distributed.activation_checkpoint import {policy}")
    if config["converters"]:
        classes = ", ".join(converter["class"] for converter in config["converters"])
        lines.append(f"from torchtitan.components.quantization import {classes}")
    lines += ["from torchtitan.trainer import Trainer", ""]
    lines += _base_lines(config["base"], name, layers)
    lines += ["", "", f"def {config['function']}() -> Trainer.Config:", "    config = base()",
              "    layers = len(config.model_spec.model.layers)", f"    if layers != {layers}:",
              f"        raise ValueError(f\"planner: the plan splits {layers} transformer layers, the base recipe's "
              "model has {layers}: \"",
              f"                         {json.dumps(f'import the recipe of {name} as base')})"]
    notes = _notes(plan, pp)
    for path, value in config["fields"].items():
        before, after = notes.get(path, ("", ""))
        lines += [f"    # {before}"] if before else []
        lines.append(f"    config.{path} = {_literal(value)}" + (f"  # {after}" if after else ""))
    lines.append(f"    config.activation_checkpoint = {f'{policy}.Config()' if policy else 'None'}"
                 f"  # recompute {plan_recompute(plan)}")
    if config["converters"]:
        lines += [f"    # dtype {plan.dtype}: fp8 GEMMs in the linear layers (torchao's), the output layer in bf16",
                  "    compiled = config.compile.enable and \"model\" in config.compile.components"]
        for converter in config["converters"]:
            arguments = "".join(f"{key}={_literal(value)}, " for key, value in converter.items() if key != "class")
            opening = f"    converter = {converter['class']}.Config("
            lines += [f"{opening}{arguments}model_compile_enabled=compiled)" if len(opening + arguments) < 90 else
                      f"{opening}{arguments.rstrip()}\n{' ' * len(opening)}model_compile_enabled=compiled)",
                      "    config.model_spec.model = converter.build().convert(config.model_spec.model)"]
    lines.append("    return config")
    return "\n".join(lines) + "\n"


def _base_lines(base: tuple[str, str] | None, name: str, layers: int) -> list[str]:
    """The import of the base recipe, or a placeholder that raises until the user writes one."""
    if base is not None:
        module, recipe = base
        return [f"# the recipe this one builds on (model, tokenizer, data, optimizer, checkpointing): edit the line "
                f"if {name}", f"# ({layers} transformer layers) is not its model",
                f"from {module} import {recipe} as base"]
    return [f"# name the torchtitan recipe whose model is {name} ({layers} transformer layers) here, e.g.",
            "# from torchtitan.models.llama3.config_registry import llama3_8b as base",
            f"raise ImportError({json.dumps(f'planner: name the torchtitan recipe of {name} as base on this line')})"]


def _notes(plan: Plan, pp: int) -> dict[str, tuple[str, str]]:
    """Comments for the fields whose value does not say where it comes from: a line before, and one after."""
    seq = plan.model.get("seq_len")
    return {
        "parallelism.data_parallel_replicate_degree": (f"ZeRO-{plan.zero}: {_ZERO_WORDS[plan.zero]}", ""),
        "parallelism.module_fqns_per_model_part": (
            f"one list per model chunk, in model order; chunk c runs on pipeline rank c mod {pp}", ""),
        "training.num_tokens_per_microbatch_per_dp_rank": ("", f"micro-batch {plan.micro_batch} x {seq} tokens"),
        "training.num_tokens_per_train_step": ("", f"global batch {plan.global_batch} x {seq} tokens"),
        "training.dtype": ("", "fp32 parameters, computed in mixed_precision_param"),
    }
