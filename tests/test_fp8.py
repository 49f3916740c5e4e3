"""FP8 training: the recipes, the laws of its cost (GEMMs at the fp8 peak, casts, the rest in bf16), its
memory against hand counts, the recipe through estimate, plan and export, and the refusals."""

from __future__ import annotations

import pytest

from planner.cost import estimate, layer_costs, stage_memory, transformer_activation_bytes
from planner.cost.calibration import calibration_for
from planner.cost.compute import attention_core_mask
from planner.errors import ConfigError
from planner.hardware import catalog, load_cluster
from planner.hardware.efficiency import matmul_time_s, memory_time_s, peak_flops_per_s
from planner.hardware.fp8 import FP8_RECIPES, cost_dtype, recipes_for, resolve_fp8_recipe
from planner.report import render
from planner.runtime import DEFAULT_RUNTIME
from planner.search import plan as search_plan
from planner.types import Layer, LayerGraph, OpCost, ParallelConfig
from tests.cost_models import gpt
from tests.test_rules_cli import one_error_line, run

GPT = "models/gpt-1.3b.onnx"


def linear_layer(m: int, n: int, k: int) -> LayerGraph:
    """One linear layer: a single (m x k) @ (k x n) GEMM, nothing else."""
    op = OpCost("fc", "MatMul", 2.0 * m * n * k, 2.0 * (m * k + k * n), 2.0 * m * n, gemm=(m, n, k))
    layer = Layer(index=0, name="fc", kind="mlp", params=k * n, flops_forward=op.flops,
                  activation_bytes=2.0 * m * k, output_bytes=2.0 * m * n, ops=(op,))
    return LayerGraph(name="linear", layers=(layer,))


# ------------------------------------------------------------------------------------------------ catalog

@pytest.mark.parametrize("name, bf16, fp8, fp4", [
    ("h800", 989.5e12, 1979e12, None), ("gh200", 989.5e12, 1979e12, None),
    ("b200", 2.25e15, 4.5e15, 9e15), ("gb200", 2.5e15, 5e15, 10e15)])
def test_new_devices_carry_the_dense_datasheet_peaks(name, bf16, fp8, fp4):
    device = catalog.get_device(name)
    assert device.peak_flops_per_s["bf16"] == pytest.approx(bf16)
    assert device.peak_flops_per_s["fp8"] == pytest.approx(fp8)
    assert device.peak_flops_per_s.get("fp4") == (pytest.approx(fp4) if fp4 else None)


@pytest.mark.parametrize("name, devices, intra_GBps, inter_GBps", [
    ("dgx-h800", 8, 200, 400), ("gh200", 1, 450, 50), ("dgx-b200", 8, 900, 400), ("gb200-nvl72", 72, 900, 3600)])
def test_new_nodes(name, devices, intra_GBps, inter_GBps):
    node = catalog.get_node(name)
    assert node.devices_per_node == devices
    assert node.intra_node_bandwidth_Bps == pytest.approx(intra_GBps * 1e9)
    assert node.inter_node_bandwidth_Bps == pytest.approx(inter_GBps * 1e9)


def test_devices_lists_the_new_entries(capsys):
    code, out, _ = run(capsys, "devices")
    assert code == 0
    for name in ("h800", "gh200", "b200", "gb200", "dgx-h800", "dgx-b200", "gb200-nvl72"):
        assert f"\n{name} " in out


def test_fp4_is_a_peak_not_a_training_dtype(capsys):
    code, _, err = run(capsys, "estimate", GPT, "--cluster", "dgx-b200*1", "--global-batch", "8", "--dtype", "fp4")
    assert code == 2 and "--dtype" in err and "fp8" in err


# ------------------------------------------------------------------------------------------------ recipes

def test_which_devices_run_which_recipe():
    get = catalog.get_device
    assert recipes_for([get("b200")]) == ("delayed", "blockwise", "mxfp8")
    assert recipes_for([get("h100-sxm")]) == recipes_for([get("h800")]) == ("delayed", "blockwise")
    assert recipes_for([get("l4")]) == ("delayed",)  # Ada: per-tensor only
    assert recipes_for([get("mi300x")]) == ("delayed",)  # no compute capability, an fp8 peak
    assert recipes_for([get("a100-80gb")]) == ()
    assert recipes_for([get("b200"), get("h100-sxm")]) == ("delayed", "blockwise")


def test_the_recipe_defaults_to_delayed_and_only_applies_to_fp8():
    b200 = [catalog.get_device("b200")]
    assert resolve_fp8_recipe(b200, "fp8", None) == "delayed"
    assert resolve_fp8_recipe(b200, "bf16", None) is None
    with pytest.raises(ConfigError, match="applies to FP8 training only; add --dtype fp8"):
        resolve_fp8_recipe(b200, "bf16", "mxfp8")
    assert cost_dtype("fp8", "delayed") == "fp8" and cost_dtype("fp8", "mxfp8") == "fp8:mxfp8"


@pytest.mark.parametrize("argv, needles", [
    (["--cluster", "dgx-a100-80gb*1", "--dtype", "fp8"],
     ["dtype fp8", "a100-80gb cannot run it", "no fp8 peak", "use --dtype fp32 or tf32 or bf16 or fp16"]),
    (["--cluster", "hgx-v100-32gb*1", "--dtype", "fp8"], ["dtype fp8", "v100-32gb cannot run it", "fp32 or fp16"]),
    (["--cluster", "dgx-h100*1", "--fp8-recipe", "delayed"],
     ["--fp8-recipe delayed applies to FP8 training only", "add --dtype fp8"]),
    (["--cluster", "dgx-h100*1", "--dtype", "bf16", "--fp8-recipe", "mxfp8"], ["FP8 training only"]),
    (["--cluster", "dgx-h100*1", "--dtype", "fp8", "--fp8-recipe", "mxfp8"],
     ["--fp8-recipe mxfp8", "h100-sxm cannot run it", "MXFP8BlockScaling", "10.x",
      "use --fp8-recipe delayed or blockwise"]),
    (["--cluster", "l4*8", "--dtype", "fp8", "--fp8-recipe", "blockwise"],
     ["--fp8-recipe blockwise", "l4 cannot run it", "9.0 and up", "use --fp8-recipe delayed"]),
])
@pytest.mark.parametrize("command", ["estimate", "plan"])
def test_bad_fp8_input_is_one_line_and_exit_2(capsys, command, argv, needles):
    node, count = argv[1].split("*")
    devices = catalog.get_node(node).devices_per_node * int(count)
    pins = ["--tp", "1", "--pp", "1", "--dp", str(devices)] if command == "estimate" else []
    code, _, err = run(capsys, command, GPT, "--global-batch", "64", *argv, *pins)
    assert code == 2
    line = one_error_line(err)
    for needle in needles:
        assert needle in line


def test_an_unknown_recipe_lists_the_recipes(capsys):
    code, _, err = run(capsys, "estimate", GPT, "--cluster", "dgx-b200*1", "--global-batch", "8", "--dtype", "fp8",
                       "--fp8-recipe", "nvfp4")
    assert code == 2 and all(name in err for name in FP8_RECIPES)


# ------------------------------------------------------------------------------------------------ the laws

@pytest.mark.parametrize("device", ["h100-sxm", "b200"])
def test_a_large_fp8_gemm_is_faster_by_the_peak_ratio(device):
    profile = catalog.get_device(device)
    ratio = peak_flops_per_s(profile, "bf16") / peak_flops_per_s(profile, "fp8")
    side = 16384
    assert matmul_time_s(profile, side, side, side, "fp8") / matmul_time_s(profile, side, side, side, "bf16") \
        == pytest.approx(ratio, rel=1e-9)


@pytest.mark.parametrize("device, node, recipe", [
    ("h100-sxm", "dgx-h100", "delayed"), ("h100-sxm", "dgx-h100", "blockwise"),  # Hopper has no MXFP8
    ("b200", "dgx-b200", "delayed"), ("b200", "dgx-b200", "blockwise"), ("b200", "dgx-b200", "mxfp8")])
def test_a_linear_layer_under_fp8_is_its_gemms_at_the_fp8_peak_plus_the_casts(device, node, recipe):
    m = n = k = 16384
    profile = catalog.get_device(device)
    assert recipe in recipes_for([profile])
    model, host = linear_layer(m, n, k), catalog.get_node(node)
    dtype = cost_dtype("fp8", recipe)
    bf16 = layer_costs(model, host, 1, 1, "none", False, "bf16")
    fp8 = layer_costs(model, host, 1, 1, "none", False, dtype)
    # hand count of the casts: 2-byte input read, fp8 written rowwise and columnwise with the recipe's scales
    cal = calibration_for(device, DEFAULT_RUNTIME)
    q = 1.0 + FP8_RECIPES[recipe].scale_bytes_per_element
    forward_cast = memory_time_s(profile, m * k * (2.0 + 2.0 * q)) / cal.memory_scale
    backward_cast = memory_time_s(profile, m * n * (2.0 + 2.0 * q)) / cal.memory_scale
    ratio = peak_flops_per_s(profile, "bf16") / peak_flops_per_s(profile, "fp8")
    assert (fp8.forward_s[0] - forward_cast) / bf16.forward_s[0] == pytest.approx(ratio, rel=1e-9)
    assert (fp8.backward_s[0] - backward_cast) / bf16.backward_s[0] == pytest.approx(ratio, rel=1e-9)


def test_attention_and_the_output_layer_stay_in_bf16():
    model = gpt(2, 1024, 16, 1024, 32000)
    node = catalog.get_node("dgx-h100")
    head = [i for i, layer in enumerate(model.layers) if layer.kind == "head"]
    bf16 = layer_costs(model, node, 1, 2, "selective", False, "bf16", runtime="megatron-lm-2021")
    fp8 = layer_costs(model, node, 1, 2, "selective", False, "fp8", runtime="megatron-lm-2021")
    # the attention core (what selective recompute re-runs) and the output layer cost what they do in bf16
    assert list(fp8.recompute_s) == pytest.approx(list(bf16.recompute_s), rel=1e-12)
    assert fp8.forward_s[head[0]] == pytest.approx(bf16.forward_s[head[0]], rel=1e-12)


def test_under_fp8_a_block_changes_by_its_linear_gemms_only():
    """FlashAttention, normalisation and the other element-wise ops cost what they do in bf16: the block's
    fp8-minus-bf16 time is the sum of the same difference over its linear GEMMs, each timed alone."""
    model = gpt(2, 1024, 16, 1024, 32000)
    node = catalog.get_node("dgx-h100")
    block_index = [i for i, layer in enumerate(model.layers) if layer.kind == "block"][0]
    block = model.layers[block_index]
    core = attention_core_mask(block)
    linear = [op for op, in_core in zip(block.ops, core) if op.gemm is not None and not in_core]
    assert len(linear) >= 4  # QKV, output projection, the two MLP GEMMs
    args = (node, 1, 2, "none", False)
    change = (layer_costs(model, *args, "fp8").forward_s[block_index]
              - layer_costs(model, *args, "bf16").forward_s[block_index])
    alone = 0.0
    for op in linear:
        one = LayerGraph(name=op.name, layers=(Layer(index=0, name=op.name, kind="mlp", params=0,
                                                     flops_forward=op.flops, activation_bytes=0.0,
                                                     output_bytes=op.bytes_written, ops=(op,)),))
        alone += layer_costs(one, *args, "fp8").forward_s[0] - layer_costs(one, *args, "bf16").forward_s[0]
    assert change == pytest.approx(alone, rel=1e-9)
    assert change < 0


# ------------------------------------------------------------------------------------------------ memory

@pytest.mark.parametrize("recipe, copies", [("delayed", 2.0), ("blockwise", 2.0 * (1 + 4 / 16384)),
                                            ("mxfp8", 2.0 * (1 + 1 / 32))])
def test_fp8_parameter_memory_against_a_hand_count(recipe, copies):
    params = 1e9
    mem = stage_memory(params, 0.0, 0, 0, 1, "adam", cost_dtype("fp8", recipe))
    # bf16 weights (2) and their cached fp8 copies, rowwise and columnwise (2 (1 + s_w)); fp32 main grads (4);
    # fp32 master weights (4) and Adam's two fp32 moments (8)
    assert mem.weights_bytes == pytest.approx(params * (2.0 + copies))
    assert mem.gradients_bytes == pytest.approx(params * 4.0)
    assert mem.optimizer_bytes == pytest.approx(params * 12.0)
    bf16 = stage_memory(params, 0.0, 0, 0, 1, "adam", "bf16")
    assert mem.weights_bytes - bf16.weights_bytes == pytest.approx(params * copies)
    # ZeRO-3 shards the copies with the weights; ZeRO-1 leaves both whole
    assert stage_memory(params, 0.0, 0, 3, 8, "adam", cost_dtype("fp8", recipe)).weights_bytes == \
        pytest.approx(params * (2.0 + copies) / 8)


@pytest.mark.parametrize("recipe, scale", [("delayed", 0.0), ("blockwise", 4 / 128), ("mxfp8", 1 / 32)])
def test_fp8_activation_memory_against_a_hand_count(recipe, scale):
    s, b, h, a, t, f = 2048, 1, 4096, 32, 2, 16384
    bf16 = transformer_activation_bytes(s, b, h, a, t, attention="flash")
    fp8 = transformer_activation_bytes(s, b, h, a, t, dtype=cost_dtype("fp8", recipe), attention="flash")
    # the four GEMM inputs saved for the backward (two replicated h-wide, the h- and f-wide split ones) drop
    # from 2 bytes to 1 + s
    g = 1.0 + scale
    assert bf16 - fp8 == pytest.approx(s * b * (2 * h + (h + f) / t) * (2.0 - g))


# ------------------------------------------------------------------------------------------------ end to end

def test_the_recipe_flows_through_estimate_plan_and_export():
    model = gpt(4, 1024, 16, 512, 8000)
    cluster = load_cluster("dgx-b200*1")
    est = estimate(model, cluster, ParallelConfig(global_batch=16, tp=1, pp=1, dp=8, dtype="fp8",
                                                  fp8_recipe="mxfp8"))
    assert est.config.dtype == "fp8" and est.config.fp8_recipe == "mxfp8"
    delayed = estimate(model, cluster, ParallelConfig(global_batch=16, tp=1, pp=1, dp=8, dtype="fp8"))
    assert delayed.config.fp8_recipe == "delayed"
    # MXFP8's scales: more memory than per-tensor scaling, never less
    assert est.memory_per_device_bytes > delayed.memory_per_device_bytes
    best = search_plan(model, cluster, 16, pinned=ParallelConfig(global_batch=16, dtype="fp8", fp8_recipe="mxfp8"))
    assert best.dtype == "fp8" and best.fp8_recipe == "mxfp8"
    text = render(best, "megatron")
    assert "--fp8-recipe mxfp8" in text and "--fp8-format e4m3" in text
    again = type(best).from_json(best.to_json())
    assert again.fp8_recipe == "mxfp8" and again.to_json() == best.to_json()
    bf16 = search_plan(model, cluster, 16, pinned=ParallelConfig(global_batch=16))
    assert bf16.fp8_recipe is None and "--fp8" not in render(bf16, "megatron")
