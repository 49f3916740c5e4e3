"""Megatron-LM, DeepSpeed and TorchRec exports use the option and key names those projects define.

The name lists below were read from the projects' sources (paths and commits given), not guessed."""

from __future__ import annotations

import dataclasses
import json
import logging
import shlex
from pathlib import Path

import pytest

import plan_samples
from planner.errors import PlannerError
from planner.export.deepspeed import deepspeed_config
from planner.export.megatron import _overlap_args, megatron_args
from planner.export.torchrec import torchrec_plan, torchrec_table_name
from planner.plans import EmbeddingPlacement, EmbeddingShard
from planner.report import render
from planner.runtime import RUNTIMES, get_runtime

# NVIDIA/Megatron-LM @ d98e8a64ddf34856e74b24714e3bedb2f5a39553 (2026-08-22). megatron/training/arguments.py
# declares some options directly; the rest come from config dataclass fields via
# megatron/training/argument_utils.py (ArgumentGroupFactory: "--" + field name with "_" -> "-", or the name a
# field's argparse_meta gives).
MEGATRON_OPTIONS = {
    # megatron/training/arguments.py (_add_distributed_args)
    "--decoder-first-pipeline-num-layers": "value", "--decoder-last-pipeline-num-layers": "value",
    "--pipeline-model-parallel-layout": "value", "--num-layers-per-virtual-pipeline-stage": "value",
    "--num-virtual-stages-per-pipeline-rank": "value", "--use-distributed-optimizer": "flag",
    "--data-parallel-sharding-strategy": ("no_shard", "optim", "optim_grads", "optim_grads_params"),
    # megatron/core/model_parallel_config.py: tensor_model_parallel_size, pipeline_model_parallel_size,
    # sequence_parallel, fp16, bf16
    "--tensor-model-parallel-size": "value", "--pipeline-model-parallel-size": "value",
    "--sequence-parallel": "flag", "--fp16": "flag", "--bf16": "flag",
    # megatron/core/transformer/transformer_config.py: fp8 Literal['e4m3', 'hybrid'] (argparse_meta arg_names
    # --fp8-format), fp8_recipe Literal['tensorwise', 'delayed', 'mxfp8', 'blockwise', 'custom'], default delayed
    "--fp8-format": ("e4m3", "hybrid"),
    "--fp8-recipe": ("tensorwise", "delayed", "mxfp8", "blockwise", "custom"),
    # megatron/core/transformer/transformer_config.py: num_layers,
    # recompute_granularity Literal['full', 'selective'], recompute_method Literal['uniform', 'block'],
    # recompute_num_layers
    "--num-layers": "value", "--recompute-granularity": ("full", "selective"),
    "--recompute-method": ("uniform", "block"), "--recompute-num-layers": "value",
    # megatron/training/config/training_config.py: micro_batch_size, global_batch_size
    "--micro-batch-size": "value", "--global-batch-size": "value",
    # megatron/training/arguments.py (_add_training_args)
    "--optimizer": ("adam", "sgd", "muon", "dist_muon", "lion", "soap", "adaptive_muon"),
    # megatron/training/config/common_config.py: DistributedInitConfig.use_megatron_fsdp; megatron/training/
    # arguments.py (_add_distributed_args, declared by hand): --overlap-grad-reduce, --overlap-param-gather;
    # megatron/core/model_parallel_config.py: tp_comm_overlap
    "--use-megatron-fsdp": "flag", "--overlap-grad-reduce": "flag", "--overlap-param-gather": "flag",
    "--tp-comm-overlap": "flag",
    # megatron/core/model_parallel_config.py: context_parallel_size; megatron/training/arguments.py
    # (_add_distributed_args): --cp-comm-type, choices of TransformerConfig.cp_comm_type
    "--context-parallel-size": "value", "--cp-comm-type": ("p2p", "all_gather", "a2a", "a2a+p2p"),
    # megatron/training/config/training_config.py: CheckpointConfig.ckpt_format
    "--ckpt-format": ("torch", "torch_dist", "torch_dcp", "fsdp_dtensor"),
}

# NVIDIA/Megatron-LM tag v2.5 (megatron-lm-2021): megatron/arguments.py. _add_distributed_args:
# --tensor-model-parallel-size, --pipeline-model-parallel-size, --num-layers-per-virtual-pipeline-stage;
# _add_network_size_args: --num-layers; _add_training_args: --micro-batch-size, --global-batch-size,
# --checkpoint-activations, --checkpoint-num-layers, --optimizer (adam, sgd); _add_mixed_precision_args: --fp16,
# --bf16. parse_args calls parser.parse_args(), so an option outside these fails.
MEGATRON_V25_OPTIONS = {
    "--tensor-model-parallel-size": "value", "--pipeline-model-parallel-size": "value", "--num-layers": "value",
    "--num-layers-per-virtual-pipeline-stage": "value", "--micro-batch-size": "value",
    "--global-batch-size": "value", "--checkpoint-activations": "flag", "--checkpoint-num-layers": "value",
    "--optimizer": ("adam", "sgd"), "--fp16": "flag", "--bf16": "flag",
}

# deepspeedai/DeepSpeed @ edaa7221267243c7be7fb49c5d5f5c4fb97b4641 (2026-08-22): deepspeed/runtime/constants.py
# (TRAIN_BATCH_SIZE, TRAIN_MICRO_BATCH_SIZE_PER_GPU, GRADIENT_ACCUMULATION_STEPS, BFLOAT16 / FP16 with
# "enabled", ZERO_OPTIMIZATION), deepspeed/runtime/zero/config.py ("stage", "overlap_comm", "reduce_bucket_size",
# "allgather_bucket_size"),
# deepspeed/runtime/config.py get_pipeline_config ("stages", "partition", "activation_checkpoint_interval",
# free-form: ours adds "stage_layers" and "topology"; the pipeline engine reads only activation_checkpoint_interval
# of them, the model code passes the others to PipelineModule), deepspeed/runtime/tensor_parallel/config.py
# ("autotp_size"),
# deepspeed/runtime/activation_checkpointing/config.py (ACT_CHKPT and its six keys).
DEEPSPEED_KEYS = {
    "zero_allow_untested_optimizer": None,  # deepspeed/runtime/constants.py (ZERO_ALLOW_UNTESTED_OPTIMIZER)
    "train_batch_size": None, "train_micro_batch_size_per_gpu": None, "gradient_accumulation_steps": None,
    "bf16": {"enabled"}, "fp16": {"enabled"},
    "zero_optimization": {"stage", "overlap_comm", "reduce_bucket_size", "allgather_bucket_size"},
    "pipeline": {"stages", "partition", "activation_checkpoint_interval", "stage_layers", "topology"},
    "tensor_parallel": {"autotp_size"},
    "activation_checkpointing": {"partition_activations", "contiguous_memory_optimization", "cpu_checkpointing",
                                 "number_checkpoints", "synchronize_checkpoint_boundary", "profile"},
}
DEEPSPEED_PARTITION_METHODS = {"uniform", "parameters"}  # deepspeed/runtime/pipe/module.py _partition_layers

# pytorch/torchrec @ a48cef79ebc333da92af1311c04b041ee21a8e75: torchrec/distributed/types.py (ShardingType
# values; ParameterSharding fields), torchrec/distributed/embedding_types.py (EmbeddingComputeKernel values);
# torch/distributed/_shard/metadata.py (ShardMetadata fields).
TORCHREC_SHARDING_TYPES = {"data_parallel", "table_wise", "column_wise", "row_wise", "table_row_wise",
                           "table_column_wise", "grid_shard"}
TORCHREC_KERNELS = {"dense", "fused", "fused_uvm", "fused_uvm_caching", "quant", "quant_uvm", "quant_uvm_caching",
                    "key_value", "customized_kernel", "ssd_virtual_table"}
TORCHREC_PARAMETER_SHARDING = {"sharding_type", "compute_kernel", "ranks", "sharding_spec", "cache_params",
                               "enforce_hbm", "stochastic_rounding", "bounds_check_mode", "output_dtype",
                               "key_value_params"}
SHARD_METADATA = {"shard_offsets", "shard_sizes", "placement"}


def test_api_docs_name_what_the_exports_write():
    """docs/api.md names every Megatron-LM option and ds_config key the exports may write, every TorchRec
    sharding type a plan may hold, and how the flat TorchRec plan becomes a ShardingPlan."""
    from planner.embeddings.problem import SHARDING_TYPES

    text = (Path(__file__).resolve().parents[1] / "docs" / "api.md").read_text()
    section = text[text.index("## Render and export"):]
    missing = [name for name in [*MEGATRON_OPTIONS, *MEGATRON_V25_OPTIONS, *DEEPSPEED_KEYS]
               if f"`{name}" not in section and f" {name}" not in section]
    missing += [f"sharding {kind}" for kind in SHARDING_TYPES if f"`{kind}`" not in text]
    assert missing == []
    assert "--cp-comm-type p2p" in section and "EmbeddingModuleShardingPlan" in section


def parse_megatron(text: str, known: dict[str, object] = MEGATRON_OPTIONS) -> dict[str, list[str]]:
    """The options of rendered Megatron arguments, checking every option and value against the lists
    (``known``: Megatron-LM's options; MEGATRON_V25_OPTIONS for a megatron-lm-2021 plan)."""
    body = " ".join(line.rstrip("\\") for line in text.splitlines() if not line.startswith("#"))
    tokens = shlex.split(body)
    options: dict[str, list[str]] = {}
    for token in tokens:
        if token.startswith("--"):
            assert token in known, f"{token} is not a Megatron-LM option"
            assert token not in options, f"{token} given twice"
            options[token] = []
            current = token
        else:
            options[current].append(token)
    for option, values in options.items():
        kind = known[option]
        if kind == "flag":
            assert values == [], option
        elif kind == "value":
            assert len(values) == 1, option
        else:
            assert len(values) == 1 and values[0] in kind, (option, values)
    check_megatron_split(options)
    return options


# megatron/training/arguments.py (validate_args): "No more than one of the following arguments can be set at the
# same time"; a layout gives vpp by its number of chunks
VIRTUAL_STAGE_OPTIONS = {"--num-layers-per-virtual-pipeline-stage", "--num-virtual-stages-per-pipeline-rank",
                         "--pipeline-model-parallel-layout"}


def check_megatron_split(options: dict[str, list[str]]) -> None:
    """The pipeline-split options together as Megatron-LM accepts them: at most one of the virtual-stage
    options; first/last stage counts above 0 and never beside a layout
    (megatron/core/transformer/transformer_config.py, TransformerConfig.__post_init__); a layout of pp x vpp
    chunks with one "E" first, one "L" last and as many "t" as --num-layers
    (megatron/core/transformer/pipeline_parallel_layer_layout.py, validate_layer_layout)."""
    assert len(VIRTUAL_STAGE_OPTIONS & set(options)) <= 1, sorted(VIRTUAL_STAGE_OPTIONS & set(options))
    ends = {"--decoder-first-pipeline-num-layers", "--decoder-last-pipeline-num-layers"} & set(options)
    for option in ends:
        assert int(options[option][0]) > 0, (option, options[option])
    layout = options.get("--pipeline-model-parallel-layout")
    if layout is None:
        return
    assert not ends, ends
    chunks = layout[0].split("|")
    assert len(chunks) % int(options["--pipeline-model-parallel-size"][0]) == 0, layout
    flat = "".join(chunks)
    assert set(flat) <= {"E", "t", "L"} and flat.count("E") == flat.count("L") == 1, layout
    assert flat[0] == "E" and flat[-1] == "L" and flat.count("t") == int(options["--num-layers"][0]), layout


def test_megatron_uniform_plan():
    plan = plan_samples.gpt_plan((5, 5), tp=4, dp=2, zero=1, recompute="none", sequence_parallel=True)
    options = parse_megatron(render(plan, "megatron"))
    assert options["--tensor-model-parallel-size"] == ["4"]
    assert options["--pipeline-model-parallel-size"] == ["2"]
    assert options["--num-layers"] == ["8"]  # 10 layers: embedding, 8 blocks, head
    assert options["--micro-batch-size"] == ["2"] and options["--global-batch-size"] == ["64"]
    assert "--recompute-granularity" not in options
    assert "--sequence-parallel" in options and "--use-distributed-optimizer" in options and "--bf16" in options
    # even split (4 + 4 blocks): no uneven-split options
    assert not {"--decoder-first-pipeline-num-layers", "--pipeline-model-parallel-layout"} & set(options)
    assert megatron_args(plan)[:2] == ["--tensor-model-parallel-size", "4"]


def test_megatron_selective_under_flash_attention_is_written_as_no_recompute(caplog):
    """Megatron-Core's selective recompute re-runs core attention in the backward pass; under the runtime's
    FlashAttention the plan costed it as no recompute, so no recompute option is written, with a warning."""
    plan = plan_samples.gpt_plan(recompute="selective")
    assert plan.runtime == "megatron-core"
    with caplog.at_level(logging.WARNING, logger="planner.export.megatron"):
        options = parse_megatron(render(plan, "megatron"))
    assert not {"--recompute-granularity", "--recompute-method", "--recompute-num-layers"} & set(options)
    assert "costed as no recompute" in caplog.text and "--recompute-granularity selective" in caplog.text


def test_megatron_selective_where_attention_scores_are_kept(caplog, monkeypatch):
    """A runtime registered with fused-softmax attention costs selective recompute as dropping the scores:
    the option is written, without a warning."""
    fused = dataclasses.replace(get_runtime("megatron-core"), name="megatron-core-fused", attention="fused-softmax")
    monkeypatch.setitem(RUNTIMES, fused.name, fused)
    plan = dataclasses.replace(plan_samples.gpt_plan(recompute="selective"), runtime=fused.name)
    with caplog.at_level(logging.WARNING, logger="planner.export.megatron"):
        options = parse_megatron(render(plan, "megatron"))
    assert options["--recompute-granularity"] == ["selective"] and "costed as no recompute" not in caplog.text


@pytest.mark.parametrize("runtime, known", [("megatron-core", MEGATRON_OPTIONS),
                                             ("megatron-lm-2021", MEGATRON_V25_OPTIONS)])
def test_megatron_writes_the_plans_optimizer(runtime, known):
    """Megatron-LM's --optimizer defaults to adam: an SGD plan names its optimizer, an Adam plan needs nothing."""
    base = dataclasses.replace(plan_samples.gpt_plan(zero=0, recompute="full", sequence_parallel=False),
                               runtime=runtime)
    options = parse_megatron(render(dataclasses.replace(base, optimizer="sgd"), "megatron"), known)
    assert options["--optimizer"] == ["sgd"]
    assert "--optimizer" not in parse_megatron(render(base, "megatron"), known)


def test_megatron_refuses_adagrad(capsys, monkeypatch):
    """Megatron-LM's --optimizer has no adagrad: a plan file is refused, and plan --format megatron refuses
    --optimizer adagrad before searching."""
    plan = dataclasses.replace(plan_samples.gpt_plan(), optimizer="adagrad")
    with pytest.raises(PlannerError, match=r"^plan: optimizer adagrad has no Megatron-LM option.*--optimizer adam "
                                           r"or sgd$"):
        render(plan, "megatron")
    import planner.search
    from planner.cli import main

    def no_search(*args, **kwargs):
        raise AssertionError("searched")

    monkeypatch.setattr(planner.search, "search", no_search)
    model = str(Path(__file__).resolve().parents[1] / "models" / "gpt2-124m.onnx")
    argv = ["plan", model, "--cluster", "dgx-a100-80gb*1", "--global-batch", "64", "--format", "megatron",
            "--optimizer", "adagrad"]
    assert main(argv) == 2
    assert "--format megatron: optimizer adagrad has no Megatron-LM option" in capsys.readouterr().err


def test_megatron_writes_the_param_gather_overlap_only_beside_the_grad_overlap():
    """Megatron-LM asserts that --overlap-param-gather comes with --overlap-grad-reduce (validate_args): a
    runtime that overlaps the parameter all-gather but not the gradient reduction gets neither."""
    plan = plan_samples.gpt_plan(zero=1)
    core = get_runtime("megatron-core")
    assert {"--overlap-grad-reduce", "--overlap-param-gather"} <= set(_overlap_args(core, plan, 4, 2))
    no_grad_overlap = dataclasses.replace(core, name="megatron-core-no-grad-overlap", overlap_grad_reduce=False)
    assert not {"--overlap-grad-reduce", "--overlap-param-gather"} & set(_overlap_args(no_grad_overlap, plan, 4, 2))


def test_megatron_uneven_split_first_and_last():
    # layers 4+3+3 -> blocks 3, 3, 2 (the first stage holds the embedding, the last the head)
    options = parse_megatron(render(plan_samples.gpt_plan((4, 3, 3)), "megatron"))
    assert options["--decoder-last-pipeline-num-layers"] == ["2"]
    assert "--decoder-first-pipeline-num-layers" not in options
    options = parse_megatron(render(plan_samples.gpt_plan((2, 5, 3)), "megatron"))  # blocks 1, 5, 2
    assert options["--decoder-first-pipeline-num-layers"] == ["1"]
    assert options["--decoder-last-pipeline-num-layers"] == ["2"]


def test_megatron_interleaved():
    options = parse_megatron(render(plan_samples.gpt_plan((5, 5), vpp=2), "megatron"))  # blocks 4 + 4
    assert options["--num-virtual-stages-per-pipeline-rank"] == ["2"]
    assert options["--pipeline-model-parallel-size"] == ["2"]
    assert "--pipeline-model-parallel-layout" not in options  # 8 blocks divide evenly into 2 x 2 chunks
    # blocks 3, 3, 2 over 3 stages x 2 chunks: round 0 gets 1, 2, 1 and round 1 gets 2, 1, 1 (the first
    # stage's smaller chunk first, beside the embedding); the layout's 6 chunks give vpp 2, so no vpp option
    # beside it (Megatron-LM refuses both)
    options = parse_megatron(render(plan_samples.gpt_plan((4, 3, 3), vpp=2), "megatron"))
    assert options["--pipeline-model-parallel-layout"] == ["Et|tt|t|tt|t|tL"]
    assert "--num-virtual-stages-per-pipeline-rank" not in options


def test_megatron_interleaved_uneven_first_and_last():
    """Whole chunks on every stage with only the ends differing: Megatron-Core's first/last options, not a
    layout (layers 3+4+4+3 -> blocks 2, 4, 4, 2 at vpp 2: chunks of 1, 2, 2, 1)."""
    options = parse_megatron(render(plan_samples.gpt_plan((3, 4, 4, 3), vpp=2), "megatron"))
    assert options["--decoder-first-pipeline-num-layers"] == ["2"]
    assert options["--decoder-last-pipeline-num-layers"] == ["2"]
    assert options["--num-virtual-stages-per-pipeline-rank"] == ["2"]
    assert "--pipeline-model-parallel-layout" not in options
    # an end stage of 3 blocks splits into no whole chunks at vpp 2: a layout instead
    options = parse_megatron(render(plan_samples.gpt_plan((4, 4, 4, 2), vpp=2), "megatron"))
    assert "--decoder-first-pipeline-num-layers" not in options and "--pipeline-model-parallel-layout" in options


def test_megatron_writes_llama3_layout():
    """Llama 3 405B's split in small (blocks 7, 8, 8, 7 at vpp 8): the first chunk only the embedding, the
    last only the loss, one block in every other chunk; 30 blocks do not divide by vpp 8, which a layout
    expresses (no vpp option beside it)."""
    options = parse_megatron(render(plan_samples.gpt_plan((8, 8, 8, 8), vpp=8), "megatron"))
    assert options["--pipeline-model-parallel-layout"] == ["E|" + "t|" * 30 + "L"]
    assert "--num-virtual-stages-per-pipeline-rank" not in options


@pytest.mark.parametrize("counts, vpp, layout", [((5, 4, 1), 1, "Etttt|tttt|L"), ((1, 5, 4), 1, "E|ttttt|tttL"),
                                                 ((5, 4, 1), 2, "Ett|tt||tt|tt|L")])
def test_megatron_stage_without_transformer_layers_gets_a_layout(counts, vpp, layout):
    """A stage holding only the embedding or only the head: Megatron-Core refuses a first or last stage of 0
    layers (TransformerConfig: "must be larger than 0"), and its layout takes a stage of only "E" or "L"."""
    options = parse_megatron(render(plan_samples.gpt_plan(counts, vpp=vpp), "megatron"))
    assert options["--pipeline-model-parallel-layout"] == [layout]


@pytest.mark.parametrize("zero,expected", [(0, []), (1, ["--use-distributed-optimizer"]),
                                           (2, ["--use-megatron-fsdp", "--data-parallel-sharding-strategy"]),
                                           (3, ["--use-megatron-fsdp", "--data-parallel-sharding-strategy"])])
def test_megatron_zero_and_full_recompute(zero, expected):
    options = parse_megatron(render(plan_samples.gpt_plan(zero=zero, recompute="full"), "megatron"))
    for option in expected:
        assert option in options
    text = render(plan_samples.gpt_plan(zero=zero, recompute="full"), "megatron")
    if zero >= 2:
        assert options["--data-parallel-sharding-strategy"] == [["optim_grads", "optim_grads_params"][zero - 2]]
        # Megatron-FSDP asserts the fsdp_dtensor checkpoint format and CUDA_DEVICE_MAX_CONNECTIONS != 1
        assert options["--ckpt-format"] == ["fsdp_dtensor"] and "CUDA_DEVICE_MAX_CONNECTIONS unset" in text
    else:
        # tensor parallelism (tp 4) without Megatron-FSDP: validate_args wants one hardware queue before Blackwell
        assert "--ckpt-format" not in options and "CUDA_DEVICE_MAX_CONNECTIONS unset" not in text
        assert "CUDA_DEVICE_MAX_CONNECTIONS=1" in text
    assert options["--recompute-granularity"] == ["full"] and options["--recompute-method"] == ["uniform"]


def test_megatron_fp8_trains_bf16_weights_with_fp8_gemms():
    plan = dataclasses.replace(plan_samples.gpt_plan(), dtype="fp8")
    options = parse_megatron(render(plan, "megatron"))
    assert options["--fp8-format"] == ["hybrid"] and "--bf16" in options
    assert options["--fp8-recipe"] == ["delayed"]  # a plan without a recipe runs the default


@pytest.mark.parametrize("recipe, fmt", [("delayed", "hybrid"), ("blockwise", "e4m3"), ("mxfp8", "e4m3")])
def test_megatron_fp8_passes_the_plans_recipe_and_its_format(recipe, fmt):
    plan = dataclasses.replace(plan_samples.gpt_plan(), dtype="fp8", fp8_recipe=recipe)
    options = parse_megatron(render(plan, "megatron"))
    assert options["--fp8-recipe"] == [recipe] and options["--fp8-format"] == [fmt]


@pytest.mark.parametrize("fmt", ["megatron", "deepspeed"])
def test_tf32_plans_warn_that_the_script_must_allow_tf32(fmt, caplog):
    """Neither framework switches TF32 on and PyTorch leaves it off by default: a tf32 plan exports as an fp32
    one, with a warning naming the PyTorch switch; an fp32 or bf16 plan gets no such warning."""
    plan = dataclasses.replace(plan_samples.gpt_plan((10,), tp=1, dp=8, zero=0, recompute="none",
                                                     sequence_parallel=False), runtime="megatron-lm-2021")
    with caplog.at_level(logging.WARNING, logger="planner.export"):
        tf32 = render(dataclasses.replace(plan, dtype="tf32"), fmt)
    assert "torch.backends.cuda.matmul.allow_tf32 = True" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="planner.export"):
        assert render(dataclasses.replace(plan, dtype="fp32"), fmt) == tf32
        render(plan, fmt)
    assert "allow_tf32" not in caplog.text


def test_megatron_core_fp32_plans_warn_that_transformer_engine_runs_tf32(caplog):
    """Transformer Engine computes fp32 GEMMs as TF32 (cublaslt_gemm.cu): an fp32 plan exported for
    megatron-core runs faster than costed; megatron-lm-2021 has no Transformer Engine."""
    plan = dataclasses.replace(plan_samples.gpt_plan(recompute="none"), dtype="fp32")
    with caplog.at_level(logging.WARNING, logger="planner.export.megatron"):
        render(plan, "megatron")
    assert "Transformer Engine" in caplog.text and "faster than the plan predicts" in caplog.text
    caplog.clear()
    old = dataclasses.replace(plan_samples.gpt_plan(zero=0, recompute="full", sequence_parallel=False),
                              dtype="fp32", runtime="megatron-lm-2021")
    with caplog.at_level(logging.WARNING, logger="planner.export.megatron"):
        render(old, "megatron")
    assert "Transformer Engine" not in caplog.text


def test_bf16_plans_have_no_fp8_options():
    options = parse_megatron(render(plan_samples.gpt_plan(), "megatron"))
    assert "--fp8-recipe" not in options and "--fp8-format" not in options


def test_deepspeed_refuses_fp8_in_one_line():
    plan = dataclasses.replace(plan_samples.gpt_plan(), dtype="fp8", runtime="deepspeed")
    with pytest.raises(PlannerError, match=r"dtype fp8 has no DeepSpeed config option.*--dtype bf16") as info:
        render(plan, "deepspeed")
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("fmt", ["megatron", "deepspeed"])
def test_megatron_and_deepspeed_refuse_mixed_recompute_and_gpipe(fmt):
    """A hand-edited plan file: stages of different recompute modes (both frameworks take one for the model;
    Megatron-LM used to write the strongest) and the GPipe schedule (Megatron-LM runs 1F1B and interleaved,
    DeepSpeed its own 1F1B-like TrainSchedule) are refused, naming the input and the fix."""
    plan = plan_samples.gpt_plan(tp=1, dp=8, zero=1, recompute="none", sequence_parallel=False)
    mixed = dataclasses.replace(plan, stages=(dataclasses.replace(plan.stages[0], recompute="full"),
                                              *plan.stages[1:]))
    with pytest.raises(PlannerError, match=r"^plan: its stages use the recompute modes full, none; .* set every "
                                           r"stage's 'recompute' to one of them$"):
        render(mixed, fmt)
    with pytest.raises(PlannerError, match=r"^plan: schedule gpipe .* re-plan with --schedule 1f1b$"):
        render(dataclasses.replace(plan, schedule="gpipe"), fmt)
    with pytest.raises(PlannerError, match="schedule gpipe"):  # without a pipeline too: it holds every micro-batch
        render(dataclasses.replace(plan_samples.gpt_plan((10,), tp=1, dp=8), schedule="gpipe"), fmt)


def test_megatron_and_deepspeed_refuse_heterogeneous_plans():
    for fmt in ("megatron", "deepspeed"):
        with pytest.raises(PlannerError, match="several replica groups"):
            render(plan_samples.mixed_plan(), fmt)


def check_deepspeed(config: dict) -> None:
    for key, value in config.items():
        assert key in DEEPSPEED_KEYS, f"{key} is not a ds_config key"
        if DEEPSPEED_KEYS[key] is not None:
            assert set(value) <= DEEPSPEED_KEYS[key], (key, value)


def test_deepspeed_config(caplog):
    plan = plan_samples.gpt_plan((4, 3, 3), tp=4, dp=2, zero=1, recompute="full")
    config = json.loads(render(plan, "deepspeed"))
    check_deepspeed(config)
    assert config == deepspeed_config(plan)
    assert config["train_batch_size"] == 64 and config["train_micro_batch_size_per_gpu"] == 2
    # DeepSpeed requires train_batch_size = micro x accumulation x data-parallel size
    assert config["train_batch_size"] == 2 * config["gradient_accumulation_steps"] * 2
    # the plan's ZeRO stage with the deepspeed runtime's buckets (the plan was made for another); no overlap:
    # DeepSpeed turns overlap_comm off for a PipelineModule
    bucket = get_runtime("deepspeed").grad_bucket_params
    assert config["zero_optimization"] == {"stage": 1, "overlap_comm": False, "reduce_bucket_size": bucket,
                                           "allgather_bucket_size": bucket}
    assert config["bf16"] == {"enabled": True} and config["fp16"] == {"enabled": False}
    # AutoTP does not run under the pipeline engine: tensor parallelism comes from the model's layers on the
    # PipeModelDataParallelTopology the pipeline section gives, said in a warning
    assert "tensor_parallel" not in config
    assert config["pipeline"]["topology"] == {"num_pp": 3, "num_mp": 4, "num_dp": 2}
    assert "PipeModelDataParallelTopology" in caplog.text
    # no partition_method takes the uneven stages' boundaries: left out, with a warning naming stage_layers
    assert config["pipeline"]["stages"] == 3 and "partition" not in config["pipeline"]
    assert "pipeline.stage_layers" in caplog.text
    assert config["pipeline"]["activation_checkpoint_interval"] == 1
    assert config["pipeline"]["stage_layers"] == [[0, 3], [4, 6], [7, 9]]
    even = deepspeed_config(plan_samples.gpt_plan((5, 5), tp=1, dp=8, zero=1))
    assert even["pipeline"]["partition"] in DEEPSPEED_PARTITION_METHODS
    assert even["pipeline"]["partition"] == "uniform"


@pytest.mark.parametrize("optimizer, zero, allowed", [("sgd", 1, True), ("sgd", 0, None), ("adagrad", 1, None),
                                                       ("adam", 1, None)])
def test_deepspeed_allows_sgd_under_zero(optimizer, zero, allowed):
    """DeepSpeed's ZeRO asserts zero_allow_untested_optimizer for an optimizer outside
    ZERO_SUPPORTED_OPTIMIZERS: torch.optim.SGD; torch.optim.Adagrad is in the list."""
    plan = dataclasses.replace(plan_samples.gpt_plan((10,), tp=1, dp=8, zero=zero), optimizer=optimizer)
    config = json.loads(render(plan, "deepspeed"))
    check_deepspeed(config)
    assert config.get("zero_allow_untested_optimizer") is allowed


def test_deepspeed_with_tensor_parallelism_warns_to_pass_the_data_parallel_size(caplog):
    """Without an mpu DeepSpeedConfig checks train_batch_size against every rank, tp x dp: a tp > 1 export
    warns that the script must pass an mpu giving dp; tp 1 needs none."""
    with caplog.at_level(logging.WARNING, logger="planner.export.deepspeed"):
        config = deepspeed_config(plan_samples.gpt_plan((10,), tp=2, dp=4, zero=1, sequence_parallel=False))
    assert config["train_batch_size"] == 64 and config["tensor_parallel"] == {"autotp_size": 2}
    assert "get_data_parallel_world_size() returns 4" in caplog.text and "every rank (8)" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="planner.export.deepspeed"):
        deepspeed_config(plan_samples.gpt_plan((10,), tp=1, dp=8, zero=1, sequence_parallel=False))
    assert "mpu" not in caplog.text


def test_deepspeed_pipeline_warns_once_what_the_pipeline_module_must_take(caplog):
    """DeepSpeed's pipeline engine reads neither pipeline.stages nor pipeline.partition: one warning names the
    PipelineModule arguments the model code must pass; without pipeline stages there is none."""
    with caplog.at_level(logging.WARNING, logger="planner.export.deepspeed"):
        deepspeed_config(plan_samples.gpt_plan((5, 5), tp=1, dp=8, zero=1))
    assert [r.getMessage().count("PipelineModule(") for r in caplog.records] == [1]
    assert 'PipelineModule(num_stages=2, partition_method="uniform")' in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="planner.export.deepspeed"):
        deepspeed_config(plan_samples.gpt_plan((4, 3, 3), tp=1, dp=8, zero=1))
    assert len(caplog.records) == 1 and "PipelineModule(num_stages=3) with" in caplog.text
    assert "hold 4, 3, 3 layers" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="planner.export.deepspeed"):
        deepspeed_config(plan_samples.gpt_plan((10,), tp=1, dp=8, zero=1))
    assert "PipelineModule" not in caplog.text


def test_deepspeed_refuses_expert_parallelism_naming_autoep():
    """DeepSpeed has an expert_parallel section now (AutoEP), a mechanism the planner does not model: the
    refusal says so rather than that no key exists."""
    plan = plan_samples.gpt_plan((10,), tp=2, dp=4, zero=1, sequence_parallel=False)
    moe = dataclasses.replace(plan, model={**plan.model, "experts": 8, "top_k": 2},
                              stages=tuple(dataclasses.replace(s, ep=4, expert_tp=2) for s in plan.stages))
    with pytest.raises(PlannerError, match=r"^plan: expert parallelism \(ep 4, expert-tp 2\) is not exported to "
                                           r"DeepSpeed: its AutoEP \(the expert_parallel section\).*use --format "
                                           r"megatron") as info:
        render(moe, "deepspeed")
    assert "no ds_config key" not in str(info.value)


def test_deepspeed_refuses_a_plan_with_embedding_tables():
    with pytest.raises(PlannerError, match="embedding tables .* use --format torchrec"):
        render(plan_samples.dlrm_plan(), "deepspeed")


def test_deepspeed_config_keeps_full_recompute_without_pipeline_stages():
    """With one stage there is no pipeline section to carry the recompute: the activation_checkpointing
    section does, one checkpoint per transformer block; without recompute neither appears."""
    plan = plan_samples.gpt_plan((10,), tp=1, dp=8, zero=1, recompute="full")
    config = json.loads(render(plan, "deepspeed"))
    check_deepspeed(config)
    assert "pipeline" not in config and config["activation_checkpointing"]["partition_activations"] is False
    assert config["activation_checkpointing"]["number_checkpoints"] == sum(
        kind == "block" for stage in plan.stages for kind in stage.layer_kinds)
    assert "activation_checkpointing" not in deepspeed_config(plan_samples.gpt_plan((10,), tp=1, dp=8))


def test_deepspeed_refuses_zero2_with_pipeline_and_interleaving():
    with pytest.raises(PlannerError, match="ZeRO-2 with 2 pipeline stages"):
        render(plan_samples.gpt_plan(zero=2), "deepspeed")
    with pytest.raises(PlannerError, match="interleaved"):
        render(plan_samples.gpt_plan((5, 5), vpp=2), "deepspeed")


def test_torchrec_plan():
    plan = plan_samples.dlrm_plan()
    document = json.loads(render(plan, "torchrec"))
    assert document == torchrec_plan(plan)
    # the sample uses every device of its 16, so rank r runs on device r
    assert document["world_size"] == 16 and document["rank_devices"] == list(range(16))
    tables = document["plan"]
    assert set(tables) == {"t_small", "t_tw", "t_rw", "t_cw", "t_host"}
    for name, sharding in tables.items():
        assert set(sharding) <= TORCHREC_PARAMETER_SHARDING
        assert sharding["sharding_type"] in TORCHREC_SHARDING_TYPES
        assert sharding["compute_kernel"] in TORCHREC_KERNELS
        for shard in sharding["sharding_spec"] or ():
            assert set(shard) == SHARD_METADATA
            assert shard["placement"].startswith(f"rank:{shard['placement'].split('/')[0][5:]}/cuda:")
    assert tables["t_small"]["sharding_spec"] is None and tables["t_small"]["ranks"] == list(range(16))
    assert tables["t_small"]["compute_kernel"] == "dense"  # the one kernel TorchRec's data-parallel sharder takes
    # row-wise spans every rank, in TorchRec's blocks of ceil(rows / world_size) rows
    assert tables["t_rw"]["ranks"] == list(range(16))
    assert [s["shard_sizes"] for s in tables["t_rw"]["sharding_spec"]] == [[62_501, 128]] * 15 + [[62_488, 128]]
    assert [s["shard_offsets"][0] for s in tables["t_rw"]["sharding_spec"]] == [62_501 * r for r in range(16)]
    assert tables["t_cw"]["sharding_spec"][1] == {"shard_offsets": [0, 64], "shard_sizes": [5000, 64],
                                                  "placement": "rank:11/cuda:3"}  # node 1, local device 3
    assert tables["t_tw"]["sharding_spec"][0]["placement"] == "rank:9/cuda:1"
    assert tables["t_host"]["compute_kernel"] == "fused_uvm"


def _on_devices(plan, devices: list[int], cluster: dict):
    """``plan`` moved to ``devices`` (device i of the plan -> devices[i]) of a larger ``cluster``."""
    move = dict(enumerate(devices))
    stages = tuple(dataclasses.replace(s, devices=tuple(move[d] for d in s.devices)) for s in plan.stages)
    embeddings = tuple(dataclasses.replace(p, shards=tuple(dataclasses.replace(s, device=move[s.device])
                                                           for s in p.shards)) for p in plan.embeddings)
    return dataclasses.replace(plan, cluster=cluster, stages=stages, embeddings=embeddings)


def test_torchrec_ranks_number_the_devices_the_plan_uses():
    """TorchRec's ranks are the job's process ranks 0..world_size-1, not cluster device ids: a plan on nodes 0
    and 2 of a 4-node cluster (devices 0-7 and 16-23) is a job of 16 ranks; rank_devices says which device
    each rank runs on, and cuda:L stays the device's index on its node."""
    cluster = {**plan_samples.CLUSTER_2x8, "num_devices": 32,
               "groups": [{**plan_samples.CLUSTER_2x8["groups"][0], "count": 4, "devices": 32}]}
    devices = list(range(8)) + list(range(16, 24))
    document = torchrec_plan(_on_devices(plan_samples.dlrm_plan(), devices, cluster))
    assert document["world_size"] == 16 and document["rank_devices"] == devices
    tables = document["plan"]
    # TorchRec replicates a data-parallel table on every rank (sharding_plan.py, data_parallel_sharding)
    assert tables["t_small"]["ranks"] == list(range(16))
    assert tables["t_rw"]["ranks"] == list(range(16))
    assert tables["t_tw"]["ranks"] == [9] and tables["t_tw"]["sharding_spec"][0]["placement"] == "rank:9/cuda:1"
    assert [s["placement"] for s in tables["t_cw"]["sharding_spec"]] == ["rank:10/cuda:2", "rank:11/cuda:3"]


def test_torchrec_writes_the_empty_row_blocks():
    """10 rows row-wise over 16 ranks: blocks of 1 row on ranks 0-9. The plan lists no shard where a rank holds
    no rows; TorchRec's plans list one for every rank (sharding_plan.py, _calculate_rw_shard_sizes_and_offsets
    and row_wise_sharding; rw_sharding.py, BaseRwEmbeddingSharding._shard, reads rank r's shard as
    shards[r]), so the export writes empty ones for ranks 10-15 at offset 10. Table-row-wise does the same over
    its node's ranks."""
    plan = plan_samples.dlrm_plan()
    few = EmbeddingPlacement("t_few", "row_wise", tuple(EmbeddingShard(d, (d, d + 1), (0, 64)) for d in range(10)))
    node = EmbeddingPlacement("t_node", "table_row_wise",
                              tuple(EmbeddingShard(8 + r, (2 * r, 2 * r + 2), (0, 64)) for r in range(5)))
    tables = torchrec_plan(dataclasses.replace(plan, embeddings=plan.embeddings + (few, node)))["plan"]
    assert tables["t_few"]["ranks"] == list(range(16))
    assert [s["shard_sizes"] for s in tables["t_few"]["sharding_spec"]] == [[1, 64]] * 10 + [[0, 64]] * 6
    assert [s["shard_offsets"] for s in tables["t_few"]["sharding_spec"]] == [[r, 0] for r in range(10)] + [[10, 0]] * 6
    assert tables["t_node"]["ranks"] == list(range(8, 16))
    assert [s["shard_sizes"][0] for s in tables["t_node"]["sharding_spec"]] == [2] * 5 + [0] * 3
    assert tables["t_node"]["sharding_spec"][7]["placement"] == "rank:15/cuda:7"


def test_torchrec_refuses_rows_not_in_torchrecs_blocks():
    """A row-wise table split otherwise (an even split, or over some of the ranks only) would have TorchRec
    look its ids up on the wrong ranks: refused, naming the table."""
    plan = plan_samples.dlrm_plan()
    even = EmbeddingPlacement("t_even", "row_wise", tuple(EmbeddingShard(d, (d * 250_000, (d + 1) * 250_000), (0, 128))
                                                          for d in range(4)))
    with pytest.raises(PlannerError, match="table 't_even' is row_wise, but its shards are not TorchRec's row blocks"):
        torchrec_plan(dataclasses.replace(plan, embeddings=plan.embeddings + (even,)))


def test_torchrec_keys_tables_by_torchrecs_table_name():
    """A table imported from ONNX is named by its weight (``embed.cat_0.weight``); TorchRec keys its plan by the
    EmbeddingBagConfig name, ``cat_0`` (sharding_plan.py, construct_module_sharding_plan looks up
    ``f"{table_name}.weight"``). A tables file's names are kept; two tables that would share a name are
    refused."""
    assert torchrec_table_name("embed.cat_0.weight") == "cat_0"
    assert torchrec_table_name("model.sparse.embedding_bags.t_ads.weight") == "t_ads"
    assert torchrec_table_name("cat_0") == "cat_0" and torchrec_table_name("emb_weights") == "emb_weights"
    plan = plan_samples.dlrm_plan()
    dotted = tuple(dataclasses.replace(p, table=f"embed.{p.table}.weight") for p in plan.embeddings)
    document = torchrec_plan(dataclasses.replace(plan, embeddings=dotted))
    assert document == torchrec_plan(plan)
    twice = (dotted[0], dataclasses.replace(dotted[1], table=f"other.{plan.embeddings[0].table}.weight"))
    with pytest.raises(PlannerError, match="tables 'embed.t_small.weight' and 'other.t_small.weight' are both "
                                           "TorchRec table 't_small'"):
        torchrec_plan(dataclasses.replace(plan, embeddings=twice))


def test_torchrec_export_of_a_planned_dlrm(capsys):
    """`planner plan models/dlrm-criteo.onnx --cluster "dgx-h100*8" --global-batch 2048 --format torchrec`: the
    plan uses 2 of the 64 devices, so the job is 2 ranks, and the tables carry TorchRec's names."""
    from pathlib import Path

    from planner.cli import main

    model = str(Path(__file__).resolve().parents[1] / "models" / "dlrm-criteo.onnx")
    assert main(["plan", model, "--cluster", "dgx-h100*8", "--global-batch", "2048", "--format", "torchrec"]) == 0
    document = json.loads(capsys.readouterr().out)
    world = document["world_size"]
    assert world == len(document["rank_devices"]) < 64
    assert set(document["plan"]) == {f"cat_{i}" for i in range(26)}
    for entry in document["plan"].values():
        assert set(entry["ranks"]) <= set(range(world))
        if entry["sharding_type"] == "data_parallel":
            assert entry["ranks"] == list(range(world))


def test_torchrec_without_embeddings_is_an_error():
    with pytest.raises(PlannerError, match="no embedding tables"):
        render(plan_samples.gpt_plan(), "torchrec")


def test_searched_plan_exports_count_transformer_blocks(tmp_path):
    """A plan from the search carries layer kinds, so Megatron's --num-layers counts transformer blocks only."""
    import planner
    from planner.builders import build, save

    path = str(tmp_path / "gpt.onnx")
    save(build("gpt", {"layers": 4, "hidden": 256, "heads": 4, "vocab": 1000, "seq_len": 128}), path)
    model = planner.load_model(path, dims={"batch": 1, "seq": 128})
    best = planner.plan(model, planner.load_cluster("dgx-a100-80gb*1"), global_batch=64)
    blocks = sum(1 for layer in model.layers if layer.kind == "block")
    assert blocks == 4
    options = parse_megatron(render(best, "megatron"))
    assert options["--num-layers"] == [str(blocks)]
    assert options["--global-batch-size"] == ["64"]
    if best.zero < 2 or len(best.stages) == 1:  # DeepSpeed's pipeline engine refuses ZeRO-2/3
        check_deepspeed(json.loads(render(best, "deepspeed")))
    assert "Search:" in render(best, "table")


def test_megatron_refuses_a_model_without_transformer_layers(capsys, monkeypatch):
    with pytest.raises(PlannerError, match="no transformer layers"):
        render(plan_samples.dlrm_plan(), "megatron")
    # plan --format megatron refuses before searching, not after
    import os

    import planner.search
    from planner.cli import main

    def no_search(*args, **kwargs):
        raise AssertionError("searched")

    monkeypatch.setattr(planner.search, "search", no_search)
    model = os.path.join(os.path.dirname(__file__), "..", "models", "dlrm-criteo.onnx")
    argv = ["plan", model, "--cluster", "dgx-a100-80gb*1", "--global-batch", "4096", "--format", "megatron"]
    assert main(argv) == 2
    assert "no transformer layers" in capsys.readouterr().err


def test_megatron_2021_refuses_uneven_stages_and_sizes_even_chunks():
    uneven = dataclasses.replace(plan_samples.gpt_plan((4, 3, 3), zero=0, recompute="full", sequence_parallel=False),
                                 runtime="megatron-lm-2021")
    with pytest.raises(PlannerError, match="splits the layers evenly"):
        megatron_args(uneven)
    even = dataclasses.replace(plan_samples.gpt_plan((5, 4, 5), vpp=2, zero=0, recompute="full",
                                                     sequence_parallel=False), runtime="megatron-lm-2021")
    options = parse_megatron(render(even, "megatron"), MEGATRON_V25_OPTIONS)  # blocks 4 + 4 + 4, chunks of 2
    assert options["--num-layers-per-virtual-pipeline-stage"] == ["2"]
    # v2.5 names full recompute --checkpoint-activations, one layer per checkpoint
    assert "--checkpoint-activations" in options and options["--checkpoint-num-layers"] == ["1"]


def test_megatron_2021_has_no_device_connections_note():
    """Megatron-Core's validate_args requires CUDA_DEVICE_MAX_CONNECTIONS=1 with tp > 1 before Blackwell;
    Megatron-LM v2.5 has no such check, so its export carries no such note."""
    plan = plan_samples.gpt_plan(tp=4, zero=0, recompute="full", sequence_parallel=False)
    assert "CUDA_DEVICE_MAX_CONNECTIONS=1" in render(plan, "megatron")
    text = render(dataclasses.replace(plan, runtime="megatron-lm-2021"), "megatron")
    parse_megatron(text, MEGATRON_V25_OPTIONS)
    assert "CUDA_DEVICE_MAX_CONNECTIONS" not in text


@pytest.mark.parametrize("change, words", [
    (dict(counts=(5, 5), vpp=2), "runs the interleaved schedule on 3 pipeline stages or more; use pp 3"),
    (dict(recompute="selective"), "recompute selective"),
    (dict(tp=2, sequence_parallel=True), "sequence parallelism"),
    (dict(dtype="fp8"), "has no fp8 training"),
])
def test_megatron_2021_refuses_what_megatron_lm_v25_does_not_run(change, words):
    """Megatron-LM v2.5 (megatron/arguments.py) interleaves only more than 2 stages and has no selective
    recompute, sequence parallelism or fp8: the export refuses such a plan file in one line."""
    dtype = change.pop("dtype", "bf16")
    base = dict(zero=0, recompute="full", sequence_parallel=False, tp=4)
    plan = plan_samples.gpt_plan(**{**base, **change})
    plan = dataclasses.replace(plan, runtime="megatron-lm-2021", dtype=dtype)
    with pytest.raises(PlannerError, match=words) as info:
        render(plan, "megatron")
    assert "\n" not in str(info.value) and str(info.value).startswith("plan: ")


def test_deepspeed_writes_autotp_with_zero_3():
    # AutoTP trains with ZeRO-3 (deepspeed/runtime/engine.py _configure_tensor_parallel_states)
    plan = dataclasses.replace(plan_samples.gpt_plan((10,), tp=2, dp=8, zero=3, sequence_parallel=False),
                               runtime="deepspeed")
    config = deepspeed_config(plan)
    assert config["tensor_parallel"] == {"autotp_size": 2} and config["zero_optimization"]["stage"] == 3


def test_stage_comments_give_the_launch_ranks_and_the_planned_devices():
    """Megatron-LM and torchtitan run stage s on ranks s x W .. (s + 1) x W - 1; a stage the plan puts on other
    device ids (a device type later in the cluster file) names them, so the hosts can be ordered to match."""
    plan = plan_samples.gpt_plan()
    text = render(plan, "megatron")
    assert "# stage 0: layers 0-4 (4 transformer) on a100-80gb, ranks 0-7\n" in text
    swapped = dataclasses.replace(plan, stages=(
        dataclasses.replace(plan.stages[0], devices=plan.stages[1].devices),
        dataclasses.replace(plan.stages[1], devices=plan.stages[0].devices)))
    text = render(swapped, "megatron")
    assert "ranks 0-7 on the cluster's devices 8-15 (order the hosts so)" in text
    assert "ranks 8-15 on the cluster's devices 0-7 (order the hosts so)" in text
