"""Plans for a framework export (``planner plan --format megatron|deepspeed|torchtitan``) search only what the
export can write: every stage on one tp and cp, each served by one replica group (planner.rules.uniform_stages)."""

from __future__ import annotations

import pytest

import planner
from planner.errors import ConfigError
from planner.hardware import load_cluster
from planner.report import render
from planner.types import ParallelConfig

MIXED = "dgx-h100*1+dgx-a100-80gb*1"


@pytest.fixture(scope="module")
def model():
    return planner.load_model("models/gpt2-124m.onnx", {"batch": 1})


@pytest.mark.parametrize("fmt, runtime", [("megatron", "megatron-core"), ("deepspeed", "deepspeed"),
                                          ("torchtitan", "pytorch-fsdp2")])
def test_a_uniform_plan_on_mixed_devices_exports(model, fmt, runtime):
    cluster = load_cluster(MIXED)
    pinned = ParallelConfig(global_batch=64, tp=0, pp=0, dp=0, runtime=runtime)
    best = planner.plan(model, cluster, 64, pinned=pinned, uniform=True)
    assert {(s.tp, s.cp) for s in best.stages} == {(best.stages[0].tp, best.stages[0].cp)}
    assert all(len(s.replicas) <= 1 for s in best.stages)
    assert render(best, fmt)  # the export takes it


def test_uniform_plans_are_a_subset(model):
    """Uniform plans are among the plans searched without the restriction: never faster."""
    cluster = load_cluster(MIXED)
    pinned = ParallelConfig(global_batch=64, tp=0, pp=0, dp=0)
    free = planner.plan(model, cluster, 64, pinned=pinned)
    uniform = planner.plan(model, cluster, 64, pinned=pinned, uniform=True)
    assert uniform.iteration_time_s >= free.iteration_time_s * (1 - 1e-12)


def test_uniform_must_be_a_bool(model):
    with pytest.raises(ConfigError, match="uniform"):
        planner.plan(model, load_cluster(MIXED), 64, uniform="yes")


def test_plan_format_megatron_on_mixed_devices(capsys):
    """`plan --format megatron` on a mixed cluster prints Megatron-LM arguments, not the export's refusal."""
    from planner.cli import main  # noqa: PLC0415

    assert main(["plan", "models/gpt2-124m.onnx", "--cluster", MIXED, "--global-batch", "64",
                 "--format", "megatron"]) == 0
    assert "--tensor-model-parallel-size" in capsys.readouterr().out


def test_torchtitan_plans_on_devices_without_bf16_train_in_fp32(capsys):
    """torchtitan writes bfloat16 or float32 weights, so on V100s (fp16 by default) --format torchtitan plans
    fp32, and refuses an asked fp16 before the search (planner.rules.format_dtype)."""
    from planner.cli import main  # noqa: PLC0415
    from planner.export.torchtitan import _PARAM_DTYPES  # noqa: PLC0415
    from planner.rules import FORMAT_DTYPES  # noqa: PLC0415

    assert set(FORMAT_DTYPES["torchtitan"]) == set(_PARAM_DTYPES)
    argv = ["plan", "models/gpt2-124m.onnx", "--cluster", "dgx-a100-80gb*1+hgx-v100-32gb*1", "--global-batch", "64",
            "--format", "torchtitan"]
    assert main(argv) == 0
    assert "fp32, runtime pytorch-fsdp2" in capsys.readouterr().out
    assert main([*argv, "--dtype", "fp16"]) == 2
    assert "--format torchtitan has no setting for it" in capsys.readouterr().err


def test_an_export_that_refuses_the_plan_leaves_no_plan_file(tmp_path, capsys, monkeypatch):
    """The plan is rendered in its format before --out is written, so a refusal leaves no output behind."""
    import planner.commands.plan as command  # noqa: PLC0415
    from planner.cli import main  # noqa: PLC0415
    from planner.errors import PlannerError  # noqa: PLC0415

    def refuses(plan, fmt):
        raise PlannerError(f"plan: {fmt} cannot write it")

    monkeypatch.setattr(command, "render", refuses)
    out = tmp_path / "plan.json"
    assert main(["plan", "models/gpt2-124m.onnx", "--cluster", "dgx-a100-80gb*1", "--global-batch", "64",
                 "--format", "megatron", "--out", str(out)]) == 2
    assert "megatron cannot write it" in capsys.readouterr().err and not out.exists()


def test_a_choice_the_formats_runtime_refuses_points_at_the_format(capsys):
    """--format megatron chose megatron-core: the refusal of --zero 3 must not advise a runtime the format refuses."""
    from planner.cli import main  # noqa: PLC0415

    assert main(["plan", "models/gpt2-124m.onnx", "--cluster", "dgx-a100-80gb*1", "--global-batch", "64",
                 "--format", "megatron", "--zero", "3"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("planner: error: --zero 3: the megatron-core runtime runs ZeRO 0, 1; --format megatron "
                          "launches megatron-core or megatron-lm-2021") and "--runtime" not in err
