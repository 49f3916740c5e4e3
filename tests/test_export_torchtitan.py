"""The torchtitan export writes a Python module whose function sets only fields torchtitan's config has.

Neither torch nor torchtitan is needed: the names below were read from torchtitan's source at b5bcd76c
(pytorch/torchtitan, 2026-08-21; each set names its file), and the written module is run against stand-ins
built from them, slotted like torchtitan's own config dataclasses, so a field torchtitan lacks fails as it
would there."""

from __future__ import annotations

import ast
import dataclasses
import json
import logging
import subprocess
import sys
import types
from pathlib import Path
from typing import Any

import pytest

import plan_samples
from planner.errors import PlannerError
from planner.export.megatron import megatron_args
from planner.export.torchtitan import render_torchtitan, torchtitan_config
from planner.plans import StagePlan
from planner.report import render

ROOT = Path(__file__).resolve().parents[1]

# torchtitan/trainer.py:70-116, Trainer.Config
TRAINER_CONFIG = {"model_spec", "hf_assets_path", "dump_folder", "profiler", "metrics", "tokenizer", "dataloader",
                  "optimizer", "lr_scheduler", "training", "parallelism", "checkpoint", "activation_checkpoint",
                  "compile", "comm", "validator", "debug", "override", "loss"}
# torchtitan/config/configs.py:36-117, TrainingConfig
TRAINING_CONFIG = {"num_tokens_per_microbatch_per_dp_rank", "num_tokens_per_train_step", "max_context_length",
                   "max_norm", "steps", "enable_cpu_offload", "disable_cuda_graphs", "dtype", "mixed_precision_param",
                   "mixed_precision_reduce", "gc_freq", "gc_debug"}
# torchtitan/config/configs.py:121-290, ParallelismConfig
PARALLELISM_CONFIG = {"data_parallel_replicate_degree", "data_parallel_shard_degree", "fsdp_reshard_after_forward",
                      "enable_fsdp_symm_mem", "tensor_parallel_degree", "enable_sequence_parallel", "spmd_backend",
                      "pipeline_parallel_degree", "module_fqns_per_model_part",
                      "pipeline_parallel_first_stage_less_layers", "pipeline_parallel_last_stage_less_layers",
                      "pipeline_parallel_layers_per_stage", "pipeline_parallel_schedule",
                      "pipeline_parallel_schedule_csv", "num_pp_microbatches", "context_parallel_degree",
                      "context_parallel_load_balancer", "context_parallel_ptrr_mask_key", "expert_parallel_degree"}
# torchtitan/config/configs.py:293-305, CompileConfig
COMPILE_CONFIG = {"enable", "enable_async_tensor_parallel", "components", "backend"}
# torchtitan/protocols/model_spec.py:33-47, ModelSpec (a plain dataclass)
MODEL_SPEC = {"name", "flavor", "model", "parallelize_fn", "pipelining_fn", "post_optimizer_build_fn",
              "state_dict_adapter"}
# the Literal values of the fields written (configs.py:87, :94, :145)
LITERALS = {"training.dtype": {"bfloat16", "float32"}, "training.mixed_precision_param": {"bfloat16", "float32"},
            "parallelism.fsdp_reshard_after_forward": {"default", "always", "never"}}
# schedule names torchtitan uses: configs.py:216 (1F1B), torchtitan/models/llama3/config_registry.py:66
# (Interleaved1F1B), torchtitan_recipes/tests/features.py:163 (GPipe)
SCHEDULES = {"1F1B", "Interleaved1F1B", "GPipe"}
# a decoder's top-level modules: torchtitan/models/common/decoder.py:248-255 (layers a ModuleDict keyed str(i))
DECODER_MODULES = {"tok_embeddings", "norm", "lm_head"}
# the names a written module may import, by module: torchtitan/trainer.py (Trainer),
# torchtitan/distributed/activation_checkpoint.py:166, :185 (FullAC, SelectiveAC),
# torchtitan/components/quantization/__init__.py:47-57 (its __all__), torchtitan/models/llama3/config_registry.py
# (its recipes)
IMPORTS = {
    "torchtitan.trainer": {"Trainer"},
    "torchtitan.distributed.activation_checkpoint": {"FullAC", "SelectiveAC", "MemoryBudgetAC"},
    "torchtitan.components.quantization": {"Float8GroupedExpertsConverter", "Float8Linear", "Float8LinearConverter",
                                           "MXFP8GroupedExpertsConverter", "MXFP8Linear", "MXFP8LinearConverter",
                                           "NVFP4Linear", "NVFP4LinearConverter", "QuantizationConverter"},
    "torchtitan.models.llama3.config_registry": {"llama3_debugmodel", "llama3_8b", "llama3_70b", "llama3_405b"},
}
# converter Config fields: components/quantization/__init__.py:30 (model_compile_enabled, on every one),
# float8.py:57-72 (Float8LinearConverter: recipe_name Literal rowwise/rowwise_with_gw_hp, filter_fqns, emulate),
# float8.py:222-224 (Float8GroupedExpertsConverter: none of its own), mx.py:54-60 (MXFP8LinearConverter: fqns),
# mx.py:152-165 (MXFP8GroupedExpertsConverter: recipe_name, pad_multiple)
CONVERTER_FIELDS = {"Float8LinearConverter": {"recipe_name", "filter_fqns", "emulate"},
                    "Float8GroupedExpertsConverter": set(),
                    "MXFP8LinearConverter": {"fqns"},
                    "MXFP8GroupedExpertsConverter": {"recipe_name", "pad_multiple"}}
FLOAT8_RECIPES = {"rowwise", "rowwise_with_gw_hp"}


def titan_plan(*args: Any, seq: int = 2048, family: str | None = "llama", **kwargs: Any):
    """A sample GPT plan (planner.plans samples) with a sequence length and family, as the search records them."""
    plan = plan_samples.gpt_plan(*args, **kwargs)
    model = {**plan.model, "seq_len": seq, **({"family": family} if family else {})}
    return dataclasses.replace(plan, model=model, runtime="pytorch-fsdp2")


def interleaved_plan():
    """Three stages of 3, 3 and 2 blocks (the first with the embedding, the last with the head), two chunks each."""
    plan = titan_plan((4, 3, 3), tp=1, dp=2, zero=0, sequence_parallel=False)
    return dataclasses.replace(plan, vpp=2, schedule="interleaved")


def fields(plan) -> dict[str, Any]:
    return torchtitan_config(plan)["fields"]


# ------------------------------------------------------------------------------------- the field mapping
@pytest.mark.parametrize("zero, replicate, shard, reshard", [(0, 8, 1, None), (2, 1, 8, "never"), (3, 1, 8, "always")])
def test_zero_stages_map_to_ddp_and_fsdp2(zero, replicate, shard, reshard):
    written = fields(titan_plan((10,), tp=1, dp=8, zero=zero))
    assert written["parallelism.data_parallel_replicate_degree"] == replicate
    assert written["parallelism.data_parallel_shard_degree"] == shard
    assert written.get("parallelism.fsdp_reshard_after_forward") == reshard
    assert written["parallelism.pipeline_parallel_degree"] == 1
    assert "parallelism.module_fqns_per_model_part" not in written


def test_zero_1_is_refused():
    with pytest.raises(PlannerError, match=r"^plan: ZeRO-1 has no torchtitan setting .*--runtime pytorch-fsdp2"):
        torchtitan_config(titan_plan(zero=1))


@pytest.mark.parametrize("sequence_parallel", [True, False])
def test_tensor_and_sequence_parallelism(sequence_parallel):
    written = fields(titan_plan((10,), tp=4, dp=2, zero=2, sequence_parallel=sequence_parallel))
    assert written["parallelism.tensor_parallel_degree"] == 4
    # torchtitan's enable_sequence_parallel defaults to True, so False is written too
    assert written["parallelism.enable_sequence_parallel"] is sequence_parallel


def test_batch_token_counts():
    written = fields(titan_plan((10,), tp=1, dp=8, zero=2, seq=4096))  # micro-batch 2, global batch 64
    assert written["training.max_context_length"] == 4096
    assert written["training.num_tokens_per_microbatch_per_dp_rank"] == 2 * 4096
    assert written["training.num_tokens_per_train_step"] == 64 * 4096
    assert "parallelism.num_pp_microbatches" not in written  # one stage: the micro-batches are accumulation steps


def test_pipeline_1f1b_names_each_stages_modules():
    plan = titan_plan((5, 5), tp=2, dp=2, zero=0)  # embed + 4 blocks | 4 blocks + head
    written = fields(plan)
    assert written["parallelism.pipeline_parallel_degree"] == 2
    assert written["parallelism.pipeline_parallel_schedule"] == "1F1B"
    assert written["parallelism.module_fqns_per_model_part"] == [
        ["tok_embeddings", "layers.0", "layers.1", "layers.2", "layers.3"],
        ["layers.4", "layers.5", "layers.6", "layers.7", "norm", "lm_head"]]
    assert written["parallelism.num_pp_microbatches"] == plan.batching.num_micro_batches == 16
    assert written["training.disable_cuda_graphs"] is True  # torchtitan refuses CUDA graphs with stages


def test_interleaved_chunks_run_in_virtual_stage_order():
    """Chunk k of stage s is virtual stage k x pp + s: with vpp 2 over blocks 3, 3, 2 the chunks hold 1, 2, 1 then
    2, 1, 1 blocks (the first stage's smaller chunk first, beside the embedding), and torchtitan puts chunk c on
    rank c mod pp, so each stage keeps its own blocks, as Megatron-LM's layout of the same plan does."""
    plan = interleaved_plan()
    written = fields(plan)
    assert written["parallelism.pipeline_parallel_schedule"] == "Interleaved1F1B"
    chunks = written["parallelism.module_fqns_per_model_part"]
    assert chunks == [["tok_embeddings", "layers.0"], ["layers.1", "layers.2"], ["layers.3"],
                      ["layers.4", "layers.5"], ["layers.6"], ["layers.7", "norm", "lm_head"]]
    for stage in range(3):
        held = sum(sum(name.startswith("layers.") for name in chunk) for chunk in chunks[stage::3])
        assert held == sum(kind == "block" for kind in plan.stages[stage].layer_kinds)
    args = megatron_args(dataclasses.replace(plan, runtime="megatron-core"))
    layout = args[args.index("--pipeline-model-parallel-layout") + 1].split("|")
    assert [part.count("t") for part in layout] == [sum(n.startswith("layers.") for n in c) for c in chunks]


def test_gpipe_keeps_its_name():
    plan = dataclasses.replace(titan_plan((5, 5), zero=0), schedule="gpipe")
    assert fields(plan)["parallelism.pipeline_parallel_schedule"] == "GPipe"


@pytest.mark.parametrize("recompute, policy", [("none", None), ("selective", "SelectiveAC"), ("full", "FullAC")])
def test_recompute_modes(recompute, policy):
    assert torchtitan_config(titan_plan(zero=2, recompute=recompute))["activation_checkpoint"] == policy


def test_selective_costed_as_nothing_under_flash_attention_writes_no_checkpointing(caplog):
    """megatron-core costs selective recompute as the attention core, nothing under FlashAttention: torchtitan's
    per-op SelectiveAC would re-run what that plan did not cost."""
    plan = dataclasses.replace(titan_plan(zero=0, recompute="selective"), runtime="megatron-core")
    with caplog.at_level(logging.WARNING):
        assert torchtitan_config(plan)["activation_checkpoint"] is None
    assert "SelectiveAC" in caplog.text


def test_mixed_recompute_modes_are_refused():
    plan = titan_plan(zero=2)
    stages = (plan.stages[0], dataclasses.replace(plan.stages[1], recompute="full"))
    with pytest.raises(PlannerError, match="one activation checkpointing policy"):
        torchtitan_config(dataclasses.replace(plan, stages=stages))


@pytest.mark.parametrize("dtype, param", [("bf16", "bfloat16"), ("fp8", "bfloat16"), ("fp32", "float32"),
                                          ("tf32", "float32")])
def test_dtypes(dtype, param, caplog):
    with caplog.at_level(logging.WARNING):
        written = fields(dataclasses.replace(titan_plan(zero=2), dtype=dtype))
    assert written["training.mixed_precision_param"] == param
    assert written["training.dtype"] == "float32"  # the fp32 parameters the runtime costs
    assert ("allow_tf32" in caplog.text) == (dtype == "tf32")


def test_fp16_is_refused():
    with pytest.raises(PlannerError,
                       match=r"dtype fp16 has no torchtitan setting .*--dtype bf16 \(fp32 where the devices lack "
                             r"bf16\)$"):
        torchtitan_config(dataclasses.replace(titan_plan(zero=2), dtype="fp16"))


def test_fp8_switches_on_torchtitans_float8_but_for_the_output_layer():
    plan = dataclasses.replace(titan_plan(zero=2), dtype="fp8")
    assert torchtitan_config(plan)["converters"] == [
        {"class": "Float8LinearConverter", "recipe_name": "rowwise", "filter_fqns": ["lm_head"]}]
    mx = dataclasses.replace(moe_plan(ep=4, expert_tp=1), dtype="fp8", fp8_recipe="mxfp8")
    assert torchtitan_config(mx)["converters"] == [{"class": "MXFP8LinearConverter", "fqns": ["layers"]},
                                                   {"class": "MXFP8GroupedExpertsConverter"}]
    assert torchtitan_config(titan_plan(zero=2))["converters"] == []


def test_fp8_blockwise_warns_that_torchao_scales_otherwise(caplog):
    plan = dataclasses.replace(titan_plan(zero=2), dtype="fp8", fp8_recipe="blockwise")
    with caplog.at_level(logging.WARNING):
        assert torchtitan_config(plan)["converters"][0]["recipe_name"] == "rowwise"
    assert "rowwise" in caplog.text


def test_base_recipe_by_family_and_size():
    assert torchtitan_config(titan_plan(zero=2))["base"] == ("torchtitan.models.llama3.config_registry", "llama3_8b")
    big = titan_plan(zero=2)
    big = dataclasses.replace(big, model={**big.model, "params": 65_000_000_000})
    assert torchtitan_config(big)["base"][1] == "llama3_70b"
    assert torchtitan_config(titan_plan(zero=2, family="gpt"))["base"] is None
    assert torchtitan_config(titan_plan(zero=2, family=None))["base"] is None


# ------------------------------------------------------------------------------------------ refusals
def test_refuses_embedding_tables():
    with pytest.raises(PlannerError, match=r"embedding tables .*use --format torchrec"):
        render(plan_samples.dlrm_plan(), "torchtitan")


def test_refuses_replica_groups_and_per_stage_degrees():
    with pytest.raises(PlannerError, match="several replica groups"):
        torchtitan_config(plan_samples.mixed_plan())
    plan = titan_plan(zero=2)
    uneven = (plan.stages[0], dataclasses.replace(plan.stages[1], tp=2, dp=4))
    with pytest.raises(PlannerError, match="torchtitan needs the same degrees on every stage"):
        torchtitan_config(dataclasses.replace(plan, stages=uneven))


def test_refuses_a_plan_without_its_sequence_length():
    plan = plan_samples.gpt_plan(zero=2)
    plan = dataclasses.replace(plan, model={k: v for k, v in plan.model.items() if k != "seq_len"})
    with pytest.raises(PlannerError, match=r"no sequence length \(seq_len\).*planner plan MODEL"):
        torchtitan_config(plan)


@pytest.mark.parametrize("optimizer", ["sgd", "adagrad"])
def test_refuses_optimizers_torchtitan_does_not_build(optimizer):
    with pytest.raises(PlannerError, match=f"optimizer {optimizer} has no torchtitan optimizer.*--optimizer adam"):
        torchtitan_config(dataclasses.replace(titan_plan(zero=2), optimizer=optimizer))


def test_refuses_layers_the_decoder_has_no_module_for():
    plan = titan_plan((5, 5), zero=2)
    kinds = list(plan.stages[1].layer_kinds)
    kinds[1] = "other"
    stages = (plan.stages[0], dataclasses.replace(plan.stages[1], layer_kinds=tuple(kinds)))
    with pytest.raises(PlannerError, match=r"layer 6 \(h.5\) is a other layer where torchtitan's decoder"):
        torchtitan_config(dataclasses.replace(plan, stages=stages))
    bare = tuple(dataclasses.replace(stage, layer_kinds=()) for stage in plan.stages)
    with pytest.raises(PlannerError, match="name no layer kinds"):
        torchtitan_config(dataclasses.replace(plan, stages=bare))


def test_refuses_a_model_without_transformer_layers():
    plan = titan_plan((10,), tp=1, dp=8, zero=2)
    stage = dataclasses.replace(plan.stages[0], layer_kinds=("mlp",) * 10)
    with pytest.raises(PlannerError, match="no transformer layers, so torchtitan's decoder training"):
        torchtitan_config(dataclasses.replace(plan, stages=(stage,)))


def test_refuses_tokens_that_do_not_split_over_tp_and_cp():
    plan = dataclasses.replace(titan_plan((10,), tp=4, dp=2, zero=2, seq=2046), micro_batch=1, num_micro_batches=32)
    with pytest.raises(PlannerError, match="does not split into 4 equal parts"):
        torchtitan_config(plan)


def moe_plan(ep: int, expert_tp: int, zero: int = 2, tp: int = 2, dp: int = 4):
    plan = titan_plan((10,), tp=tp, dp=dp, zero=zero)
    stage = dataclasses.replace(plan.stages[0], ep=ep, expert_tp=expert_tp)
    return dataclasses.replace(plan, stages=(stage,), model={**plan.model, "experts": 8, "top_k": 2})


def test_expert_parallelism_borrows_shard_cp_and_tp_ranks():
    written = fields(moe_plan(ep=4, expert_tp=1))
    assert written["parallelism.expert_parallel_degree"] == 4
    assert written["training.disable_cuda_graphs"] is True
    assert fields(moe_plan(ep=1, expert_tp=2))["parallelism.expert_parallel_degree"] == 1
    with pytest.raises(PlannerError, match=r"ep 4 with expert-tp 2: .*--expert-tp 1$"):
        torchtitan_config(moe_plan(ep=4, expert_tp=2))
    with pytest.raises(PlannerError, match=r"ep 1 with expert-tp 1: .*--expert-tp 2$"):
        torchtitan_config(moe_plan(ep=1, expert_tp=1))
    with pytest.raises(PlannerError, match=r"ep 4 does not divide the 2 ranks .*FSDP shard degree 1"):
        torchtitan_config(moe_plan(ep=4, expert_tp=1, zero=0))


def test_context_parallelism_is_written_with_a_warning(caplog):
    plan = titan_plan((10,), tp=1, dp=4, zero=0)
    stage = dataclasses.replace(plan.stages[0], cp=2, devices=tuple(range(8)))
    plan = dataclasses.replace(plan, stages=(stage,), runtime="megatron-core")
    with caplog.at_level(logging.WARNING):
        assert fields(plan)["parallelism.context_parallel_degree"] == 2
    assert "context_parallel_degree" in caplog.text


# ------------------------------------------------------------------------------------- the written module
PLANS = {
    "zero2": lambda: titan_plan((10,), tp=1, dp=8, zero=2),
    "1f1b_full": lambda: titan_plan((5, 5), tp=2, dp=2, zero=3, recompute="full"),
    "interleaved": interleaved_plan,
    "fp8": lambda: dataclasses.replace(titan_plan(zero=2, recompute="selective"), dtype="fp8"),
    "mxfp8_moe": lambda: dataclasses.replace(moe_plan(ep=4, expert_tp=1), dtype="fp8", fp8_recipe="mxfp8"),
    "no_family": lambda: titan_plan((5, 5), zero=2, family=None),
}


def config_paths(tree: ast.AST) -> list[str]:
    """The attribute paths below ``config`` a module assigns (``config.training.dtype`` -> training.dtype)."""
    paths = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign):
            for target in node.targets:
                parts = []
                while isinstance(target, ast.Attribute):
                    parts.insert(0, target.attr)
                    target = target.value
                if isinstance(target, ast.Name) and target.id == "config" and parts:
                    paths.append(".".join(parts))
    return paths


@pytest.mark.parametrize("name", sorted(PLANS))
def test_written_module_is_python_and_sets_only_torchtitans_fields(name):
    plan = PLANS[name]()
    text = render_torchtitan(plan)
    tree = ast.parse(text)
    compile(text, "planner_module.py", "exec")
    known = {f"training.{f}" for f in TRAINING_CONFIG} | {f"parallelism.{f}" for f in PARALLELISM_CONFIG} | {
        f"model_spec.{f}" for f in MODEL_SPEC} | TRAINER_CONFIG
    paths = config_paths(tree)
    assert paths and set(paths) <= known
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            assert {alias.name for alias in node.names} <= IMPORTS[node.module]
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "Config" \
                and isinstance(node.func.value, ast.Name) and node.func.value.id in CONVERTER_FIELDS:
            assert {k.arg for k in node.keywords} <= CONVERTER_FIELDS[node.func.value.id] | {"model_compile_enabled"}
    for path, value in torchtitan_config(plan)["fields"].items():
        if path in LITERALS:
            assert value in LITERALS[path]
        if path == "parallelism.pipeline_parallel_schedule":
            assert value in SCHEDULES
        if path == "parallelism.module_fqns_per_model_part":
            assert all(n in DECODER_MODULES or n.split(".")[0] == "layers" for chunk in value for n in chunk)


# stand-ins for torchtitan's configs: slotted dataclasses of the verified fields, so that setting a field torchtitan
# lacks raises AttributeError as it does there
def _slotted(name: str, names: set[str]) -> type:
    return dataclasses.make_dataclass(name, [(n, Any, dataclasses.field(default=None)) for n in sorted(names)],
                                      slots=True)


class _Converter:
    def __init__(self, kind: str, config: Any):
        self.kind, self.config = kind, config

    def convert(self, model):
        return dataclasses.replace(model, converted=[*model.converted, (self.kind, self.config)])


def _converter_class(kind: str) -> type:
    config = _slotted(f"{kind}Config", CONVERTER_FIELDS[kind] | {"model_compile_enabled"})
    config.build = lambda self: _Converter(kind, self)
    return type(kind, (), {"Config": config})


@dataclasses.dataclass
class _DecoderConfig:
    layers: list
    converted: list = dataclasses.field(default_factory=list)


@pytest.fixture
def torchtitan(monkeypatch):
    """Fake torchtitan modules holding the verified names; llama3_8b a 10-layer model (the sample plans')."""
    trainer = types.SimpleNamespace(Config=_slotted("TrainerConfig", TRAINER_CONFIG))
    checkpointing = {name: type(name, (), {"Config": _slotted(f"{name}Config", {"preserve_rng_state"})})
                     for name in ("FullAC", "SelectiveAC", "MemoryBudgetAC")}
    spec_class = _slotted("ModelSpec", MODEL_SPEC)

    def recipe(layers: int):
        def build():
            return trainer.Config(
                training=_slotted("TrainingConfig", TRAINING_CONFIG)(dtype="float32", disable_cuda_graphs=False),
                parallelism=_slotted("ParallelismConfig", PARALLELISM_CONFIG)(data_parallel_shard_degree=-1),
                compile=_slotted("CompileConfig", COMPILE_CONFIG)(enable=False, components=["model", "loss"]),
                model_spec=spec_class(flavor="8B", model=_DecoderConfig(layers=[None] * layers)),
                activation_checkpoint=checkpointing["SelectiveAC"].Config())
        return build

    modules = {
        "torchtitan": {}, "torchtitan.trainer": {"Trainer": trainer},
        "torchtitan.distributed": {}, "torchtitan.distributed.activation_checkpoint": checkpointing,
        "torchtitan.components": {},
        "torchtitan.components.quantization": {name: _converter_class(name) for name in CONVERTER_FIELDS},
        "torchtitan.models": {}, "torchtitan.models.llama3": {},
        "torchtitan.models.llama3.config_registry": {"llama3_8b": recipe(8), "llama3_70b": recipe(80),
                                                     "llama3_405b": recipe(126)},
    }
    for name, content in modules.items():
        monkeypatch.setitem(sys.modules, name, types.SimpleNamespace(**content))


def run_module(text: str, function: str):
    namespace: dict[str, Any] = {}
    exec(compile(text, "planner_module.py", "exec"), namespace)  # noqa: S102 - the module under test
    return namespace[function]()


def test_written_module_runs_against_torchtitans_fields(torchtitan):
    plan = dataclasses.replace(titan_plan((5, 5), tp=2, dp=2, zero=3, recompute="full"), dtype="fp8")
    config = run_module(render_torchtitan(plan), "gpt_test_planned")
    assert config.parallelism.data_parallel_shard_degree == 2
    assert config.parallelism.fsdp_reshard_after_forward == "always"
    assert config.parallelism.module_fqns_per_model_part[0][:2] == ["tok_embeddings", "layers.0"]
    assert config.training.num_tokens_per_train_step == 64 * 2048
    assert type(config.activation_checkpoint).__name__ == "FullACConfig"
    [(kind, converter)] = config.model_spec.model.converted
    assert kind == "Float8LinearConverter" and converter.recipe_name in FLOAT8_RECIPES
    assert converter.filter_fqns == ["lm_head"] and converter.model_compile_enabled is False


def test_written_module_refuses_a_base_of_another_depth(torchtitan):
    big = titan_plan((5, 5), zero=2)
    big = dataclasses.replace(big, model={**big.model, "params": 70_000_000_000})  # llama3_70b: 80 layers here
    with pytest.raises(ValueError, match="the plan splits 8 transformer layers, the base recipe's model has 80"):
        run_module(render_torchtitan(big), "gpt_test_planned")


def test_written_module_without_a_known_family_fails_until_a_recipe_is_named(torchtitan):
    text = render_torchtitan(titan_plan((5, 5), zero=2, family=None))
    with pytest.raises(ImportError, match="name the torchtitan recipe of gpt-test"):
        run_module(text, "gpt_test_planned")
    named = text.replace('raise ImportError("planner: name the torchtitan recipe of gpt-test as base on this line")',
                         "from torchtitan.models.llama3.config_registry import llama3_8b as base")
    assert run_module(named, "gpt_test_planned").parallelism.pipeline_parallel_degree == 2


# ------------------------------------------------------------------------------------------ the CLI
def test_plan_format_torchtitan_prints_the_module(tmp_path):
    """`planner plan MODEL --format torchtitan` without --runtime plans for pytorch-fsdp2 and prints the module."""
    out = subprocess.run([sys.executable, "-m", "planner", "plan", str(ROOT / "models" / "llama2-7b.onnx"),
                          "--cluster", "dgx-h100*4", "--global-batch", "256", "--format", "torchtitan",
                          "--out", str(tmp_path / "plan.json")], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    compile(out.stdout, "planner_llama2_7b.py", "exec")
    assert "from torchtitan.models.llama3.config_registry import llama3_8b as base" in out.stdout
    assert "def llama2_7b_planned() -> Trainer.Config:" in out.stdout
    assert "config.training.max_context_length = 4096" in out.stdout
    plan = json.loads((tmp_path / "plan.json").read_text())
    assert plan["runtime"] == "pytorch-fsdp2"
    show = subprocess.run([sys.executable, "-m", "planner", "show", str(tmp_path / "plan.json"), "--format",
                           "torchtitan"], capture_output=True, text=True, cwd=ROOT)
    assert show.returncode == 0 and show.stdout == out.stdout


@pytest.mark.parametrize("argv, message", [
    (["--runtime", "megatron-core"], "--runtime megatron-core cannot produce --format torchtitan"),
    (["--optimizer", "sgd"], "--format torchtitan: optimizer sgd has no torchtitan optimizer"),
])
def test_plan_format_torchtitan_refusals_before_searching(argv, message, capsys, monkeypatch):
    import planner.search
    from planner.cli import main

    def no_search(*args, **kwargs):
        raise AssertionError("searched")

    monkeypatch.setattr(planner.search, "search", no_search)
    model = str(ROOT / "models" / "gpt2-124m.onnx")
    assert main(["plan", model, "--cluster", "dgx-a100-80gb*1", "--global-batch", "64", "--format", "torchtitan",
                 *argv]) == 2
    assert message in capsys.readouterr().err


def test_plan_format_torchtitan_refuses_a_model_with_tables_before_searching(capsys, monkeypatch):
    import planner.search
    from planner.cli import main

    monkeypatch.setattr(planner.search, "search", lambda *a, **k: pytest.fail("searched"))
    model = str(ROOT / "models" / "dlrm-criteo.onnx")
    assert main(["plan", model, "--cluster", "dgx-a100-80gb*1", "--global-batch", "4096", "--format",
                 "torchtitan"]) == 2
    assert "use --format torchrec" in capsys.readouterr().err


def test_api_docs_name_what_the_torchtitan_export_writes():
    text = (ROOT / "docs" / "api.md").read_text()
    section = text[text.index("## Render and export"):]
    written = {path.split(".")[-1] for name in PLANS for path in fields(PLANS[name]())}
    missing = [name for name in sorted(written | {"activation_checkpoint", "SelectiveAC", "FullAC",
                                                  "Float8LinearConverter", "MXFP8LinearConverter"})
               if f"`{name}" not in section]
    assert missing == [] and "b5bcd76c" in section
