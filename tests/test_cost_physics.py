"""Laws the cost model must obey, each checked against a count written out here rather than against the
model's own numbers: what selective recompute re-runs, FlashAttention, activation bytes by dtype and block
shape (Korthikanti et al. 2022 for GPT; a hand count for a SwiGLU / grouped-query block), Megatron's
distributed-optimizer bytes per parameter, and GEMM efficiency against shape."""

import dataclasses

import numpy as np
import pytest

from planner.builders import build
from planner.cost import estimate, layer_costs, stage_memory, transformer_activation_bytes
from planner.cost.calibration import DeviceCalibration
from planner.cost.comm import dp_group, dp_sync, tp_collective_time_s
from planner.cost.estimator import _megatron_spec_stages, _placement
from planner.cost.compute import _gemm_time_s, alternate_gemm_reruns, attention_core_mask
from planner.graph import import_model_proto
from planner.graph.transformer import ATTENTION_CORE
from planner.hardware import catalog, load_cluster
from planner.hardware.collectives import collective_time_s
from planner.rules import recompute_choices
from planner.runtime import get_runtime
from planner.types import Layer, LayerGraph, ParallelConfig
from tests.cost_models import gpt, gpt3_175b

NODE = "dgx-a100-80gb"
FUSED = "megatron-lm-2021"  # fused scale-mask-softmax: the scores stay in memory
FLASH = "megatron-core"
UNFUSED = dataclasses.replace(get_runtime(FUSED), name="unfused-test", attention="unfused")


def _blocks(model: LayerGraph) -> list[int]:
    return [i for i, layer in enumerate(model.layers) if layer.kind == "block"]


def _llama(hidden=512, heads=8, kv_heads=2, ffn=1408, seq_len=256):
    settings = dict(layers=2, hidden=hidden, heads=heads, kv_heads=kv_heads, ffn=ffn, seq_len=seq_len, vocab=1000)
    return import_model_proto(build("llama", settings), {"batch": 1}, name="llama-test")


# ------------------------------------------------------------------------------------------ recompute

def test_attention_core_is_found_by_structure_not_size():
    # in GPT-3 175B every weight GEMM's tensors exceed heads x s^2 elements; none of them is the core
    block = gpt3_175b().layers[1]
    core = [op for op in block.ops if op.role == ATTENTION_CORE]
    assert [op.op_type for op in core] == ["MatMul", "Mul", "Where", "Softmax", "Dropout", "MatMul"]
    assert all(op.tp_split == "sharded" for op in core)
    weight_gemms = [op for op in block.ops if op.tp_split in ("column", "row") and op.gemm is not None]
    assert len(weight_gemms) == 4 and not any(op.role for op in weight_gemms)


@pytest.mark.parametrize("runtime", [UNFUSED, FUSED])
@pytest.mark.parametrize("tp", [1, 4])
def test_selective_recompute_adds_the_attention_core_forward_only(runtime, tp):
    model = gpt(2, 1024, 16, 2048, 32000)
    node = catalog.get_node(NODE)
    none = layer_costs(model, node, tp, 2, "none", False, runtime=runtime)
    selective = layer_costs(model, node, tp, 2, "selective", False, runtime=runtime)
    for i in _blocks(model):
        layer = model.layers[i]
        # the same ops on their own, as a layer of their own: its forward is the core's forward time
        core_only = dataclasses.replace(layer, kind="other", transformer=None,
                                        ops=tuple(op for op in layer.ops if op.role == ATTENTION_CORE))
        alone = LayerGraph("core", (core_only,))
        expected = layer_costs(alone, node, tp, 2, "none", False, runtime=runtime).forward_s[0]
        assert selective.backward_s[i] - none.backward_s[i] == pytest.approx(expected, rel=1e-9)
        assert selective.forward_s[i] == none.forward_s[i]


def test_selective_recompute_under_flash_attention_is_none():
    model = gpt(2, 1024, 16, 2048, 32000)
    node = catalog.get_node(NODE)
    none = layer_costs(model, node, 2, 2, "none", True, runtime=FLASH)
    selective = layer_costs(model, node, 2, 2, "selective", True, runtime=FLASH)
    assert list(selective.backward_s) == list(none.backward_s)
    assert list(selective.activation_bytes) == list(none.activation_bytes)
    est = estimate(model, load_cluster("dgx-a100-80gb*1"),
                   ParallelConfig(global_batch=16, tp=2, dp=4, recompute="selective", runtime=FLASH))
    assert any("nothing to recompute" in note for note in est.notes)


FSDP2 = "pytorch-fsdp2"  # selective recompute = torchtitan's per-op selective checkpointing


def _projection(op) -> str:
    return op.name.split("/")[-2]


def test_per_op_selective_checkpointing_reruns_every_second_linear_product():
    block = _llama().layers[_blocks(_llama())[0]]
    core = attention_core_mask(block)
    reruns = alternate_gemm_reruns(block, core, "flash")
    linear = [(op, rerun) for op, in_core, rerun in zip(block.ops, core, reruns) if op.gemm and not in_core]
    # torchtitan's order: wq, wk, wv, wo, w1 (gate), w3 (up), w2 (down); the second, fourth and sixth re-run
    assert [_projection(op) for op, rerun in linear if rerun] == ["k_proj", "out_proj", "up_proj"]
    assert [_projection(op) for op, rerun in linear if not rerun] == ["q_proj", "v_proj", "gate_proj", "down_proj"]
    assert all(rerun for op, in_core, rerun in zip(block.ops, core, reruns) if op.gemm is None and not in_core)
    assert not any(rerun for in_core, rerun in zip(core, reruns) if in_core)  # the FlashAttention kernel, saved
    unfused = alternate_gemm_reruns(block, core, "unfused")
    assert [op.op_type for op, in_core, rerun in zip(block.ops, core, unfused) if in_core and rerun] == \
        ["Mul", "Where", "Softmax"]  # batched products saved, the score path's element-wise ops re-run


def test_per_op_selective_checkpointing_adds_the_forward_of_what_it_does_not_save():
    model = _llama()
    node = catalog.get_node(NODE)
    none = layer_costs(model, node, 1, 2, "none", False, runtime=FSDP2)
    selective = layer_costs(model, node, 1, 2, "selective", False, runtime=FSDP2)
    for i, layer in enumerate(model.layers):
        if layer.kind != "block":  # torchtitan checkpoints the transformer blocks only
            assert selective.backward_s[i] == none.backward_s[i]
            continue
        reruns = alternate_gemm_reruns(layer, attention_core_mask(layer), "flash")
        rerun_only = dataclasses.replace(layer, kind="other", transformer=None,
                                         ops=tuple(op for op, rerun in zip(layer.ops, reruns) if rerun))
        expected = layer_costs(LayerGraph("rerun", (rerun_only,)), node, 1, 2, "none", False,
                               runtime=FSDP2).forward_s[0]
        assert selective.backward_s[i] - none.backward_s[i] == pytest.approx(expected, rel=1e-9)
        assert selective.forward_s[i] == none.forward_s[i]
        assert 0 < expected < none.forward_s[i]


def test_per_op_selective_checkpointing_reruns_the_all_gathers_not_the_reduce_scatters():
    model = _llama()
    node = catalog.get_node(NODE)
    none = layer_costs(model, node, 2, 2, "none", True, runtime=FSDP2)
    selective = layer_costs(model, node, 2, 2, "selective", True, runtime=FSDP2)
    for i in _blocks(model):
        forward_tp = none.tp_comm_s[i] / 2  # a block's backward moves what its forward does
        assert selective.tp_comm_s[i] - none.tp_comm_s[i] == pytest.approx(forward_tp / 2)


@pytest.mark.parametrize("tp,sp", [(1, False), (2, False), (2, True)])
def test_per_op_selective_checkpointing_keeps_what_it_saves(tp, sp):
    hidden, heads, kv_heads, ffn, s = 512, 8, 2, 1408, 256
    model = _llama(hidden, heads, kv_heads, ffn, s)
    b = 2
    kv = hidden // heads * kv_heads
    # per token, 2-byte tensors: the block's input (its checkpoint's input), the outputs of q_proj, v_proj,
    # the attention kernel, gate_proj, and down_proj's partial sums plus their reduce-scatter under sequence
    # parallelism; the kernel's fp32 log-sum-exp per head
    replicated = 2 * hidden + 2 * hidden  # the input, down_proj's output (partial sums: whole)
    split = 2 * hidden + 2 * kv + 2 * hidden + 2 * ffn + (2 * hidden if sp else 0)
    expected = s * b * (replicated - (2 * hidden - 2 * hidden / tp if sp else 0)) + s * b * split / tp \
        + 4 * heads * s * b / tp
    got = layer_costs(model, catalog.get_node(NODE), tp, b, "selective", sp, runtime=FSDP2)
    none = layer_costs(model, catalog.get_node(NODE), tp, b, "none", sp, runtime=FSDP2)
    for i in _blocks(model):
        assert got.activation_bytes[i] == pytest.approx(expected)
        assert got.peak_extra_bytes[i] == pytest.approx(none.activation_bytes[i] - expected)


def test_per_op_selective_checkpointing_lies_between_none_and_full():
    model = _llama(hidden=1024, heads=16, kv_heads=4, ffn=2816, seq_len=1024)
    cluster = load_cluster("dgx-a100-80gb*1")
    runs = {r: estimate(model, cluster, ParallelConfig(global_batch=16, tp=1, dp=8, zero=3, recompute=r,
                                                       runtime=FSDP2))
            for r in ("none", "selective", "full")}
    times = [runs[r].iteration_time_s for r in ("none", "selective", "full")]
    memory = [runs[r].memory_per_device_bytes for r in ("none", "selective", "full")]
    assert times[0] < times[1] < times[2]
    assert memory[0] > memory[1] > memory[2]
    assert not runs["selective"].notes or not any("nothing to recompute" in n for n in runs["selective"].notes)
    assert "selective" in recompute_choices(get_runtime(FSDP2))
    assert "selective" not in recompute_choices(get_runtime(FLASH))


def test_flash_attention_keeps_no_score_tensor():
    s, b, h, a, t = 4096, 1, 4096, 32, 2
    flash = transformer_activation_bytes(s, b, h, a, t, True, attention="flash")
    # Korthikanti's 34 sbh / t without the 5 a s^2 b / t of scores, plus the fp32 log-sum-exp per head and query
    assert flash == pytest.approx(34 * s * b * h / t + 4 * a * s * b / t)
    model = gpt(2, 1024, 16, 2048, 32000)
    node = catalog.get_node(NODE)
    fused = layer_costs(model, node, 1, 1, "none", False, runtime=FUSED)
    flashed = layer_costs(model, node, 1, 1, "none", False, runtime=FLASH)
    i = _blocks(model)[0]
    assert fused.activation_bytes[i] - flashed.activation_bytes[i] == pytest.approx(
        5 * 16 * 2048 * 2048 - 4 * 16 * 2048)


# ------------------------------------------------------------------------------------------ activations

@pytest.mark.parametrize("t", [1, 2, 8])
def test_korthikanti_numbers_for_an_imported_gpt_block(t):
    model = gpt(2, 1024, 16, 2048, 32000)
    node = catalog.get_node(NODE)
    s, b, h, a = 2048, 3, 1024, 16
    sbh = s * b * h
    i = _blocks(model)[0]
    cases = {
        ("none", False): sbh * (10 + 24 / t + 5 * a * s / (h * t)),
        ("none", True): sbh / t * (34 + 5 * a * s / h),
        ("selective", False): sbh * (10 + 24 / t),
        ("selective", True): 34 * sbh / t,
        ("full", False): 2 * sbh,
    }
    for (recompute, sp), expected in cases.items():
        if sp and t == 1:
            continue
        got = layer_costs(model, node, t, b, recompute, sp, runtime=FUSED).activation_bytes[i]
        assert got == pytest.approx(expected), (recompute, sp)


@pytest.mark.parametrize("tp,sp", [(1, False), (2, False), (2, True)])
def test_swiglu_gqa_block_against_a_hand_count(tp, sp):
    hidden, heads, kv_heads, ffn, s = 512, 8, 2, 1408, 256
    model = _llama(hidden, heads, kv_heads, ffn, s)
    i = _blocks(model)[0]
    assert model.layers[i].transformer.gated_mlp and not model.layers[i].transformer.dropout
    b = 2
    kv = hidden // heads * kv_heads
    # per token, 2-byte (bf16) tensors, no dropout in Llama:
    replicated = (2 * hidden + 2 * hidden  # the two RMSNorm inputs
                  + 2 * hidden    # the Q/K/V projections' input (attention norm output)
                  + 2 * hidden)   # the gate/up projections' input (MLP norm output)
    split = (2 * hidden           # Q
             + 2 * kv + 2 * kv    # K and V, kv_heads wide
             + 2 * hidden         # output projection input
             + 2 * ffn + 2 * ffn  # gate and up outputs (SiLU and the product need both)
             + 2 * ffn)           # down projection input
    scores = 2 * heads * s * s * b  # the softmax output, read by P.V (no dropout)
    if sp:
        expected = (s * b * (replicated + split) + scores) / tp
    else:
        expected = s * b * replicated + (s * b * split + scores) / tp
    got = layer_costs(model, catalog.get_node(NODE), tp, b, "none", sp, runtime=FUSED).activation_bytes[i]
    assert got == pytest.approx(expected)


def test_fp32_activations_and_messages_are_twice_bf16():
    model = _llama()  # no dropout masks, whose 1 byte does not scale with the dtype
    node = catalog.get_node(NODE)
    for recompute in ("none", "selective", "full"):
        bf16 = layer_costs(model, node, 2, 2, recompute, True, "bf16", runtime=FUSED)
        fp32 = layer_costs(model, node, 2, 2, recompute, True, "fp32", runtime=FUSED)
        for i in _blocks(model):
            assert fp32.activation_bytes[i] == pytest.approx(2 * bf16.activation_bytes[i])
        assert list(fp32.output_bytes) == pytest.approx([2 * x for x in bf16.output_bytes])
        assert all(f > b for f, b in zip(fp32.tp_comm_s[1:-1], bf16.tp_comm_s[1:-1]))


def test_fp8_keeps_16_bit_activations_but_1_byte_gemm_inputs():
    s, b, h, a = 2048, 1, 4096, 32
    bf16 = transformer_activation_bytes(s, b, h, a, dtype="bf16")
    fp8 = transformer_activation_bytes(s, b, h, a, dtype="fp8")
    # four GEMM inputs go to one byte: QKV in (h), out-proj in (h), FC1 in (h), FC2 in (4h)
    assert bf16 - fp8 == pytest.approx(s * b * (h + h + h + 4 * h))


def test_tf32_and_fp8_are_accepted():
    model = gpt(2, 1024, 16, 2048, 32000)
    for cluster, dtype in (("dgx-a100-80gb*1", "tf32"), ("dgx-h100*1", "fp8")):
        est = estimate(model, load_cluster(cluster), ParallelConfig(global_batch=16, tp=2, dp=4, dtype=dtype))
        assert est.config.dtype == dtype and est.iteration_time_s > 0


# ------------------------------------------------------------------------------------------ optimizer

@pytest.mark.parametrize("d", [1, 2, 8, 64])
def test_distributed_optimizer_bytes_per_parameter(d):
    # Megatron-Core docs, distributed optimizer: (params, grads) -> bytes per parameter with ZeRO-1 over d
    table = {("fp16", 0): 4 + 16 / d, ("bf16", 4): 6 + 12 / d, ("fp32", 4): 8 + 8 / d}
    for (dtype, main_grad), per_param in table.items():
        runtime = dataclasses.replace(get_runtime(FLASH), name=f"grads-{main_grad}", main_grad_bytes=main_grad)
        mem = stage_memory(1e9, 0.0, 0, 1, d, "adam", dtype, runtime=runtime)
        assert mem.weights_bytes + mem.gradients_bytes + mem.optimizer_bytes == pytest.approx(1e9 * per_param)


@pytest.mark.parametrize("d", [1, 8])
def test_built_in_runtimes_keep_the_state_their_frameworks_keep(d):
    # bytes per parameter (weights + gradients + states) with the state sharded over d as each runtime does:
    # Megatron-Core's distributed optimizer table (bf16 with fp32 main grads 6 + 12/d, fp16 grads 4 + 16/d);
    # FSDP2's fp32 sharded parameters as the master, fp32 gradients and Adam's moments, 16/d, plus the
    # gathered bf16 copy that ZeRO-2 (reshard_after_forward=False) keeps from forward to backward
    expected = {("megatron-core", "bf16", 1): 6 + 12 / d, ("megatron-core", "fp16", 1): 4 + 16 / d,
                ("megatron-lm-2021", "fp16", 0): 20, ("pytorch-fsdp2", "bf16", 3): 16 / d,
                ("pytorch-fsdp2", "bf16", 2): 2 + 16 / d, ("pytorch-fsdp2", "bf16", 0): 16}
    for (runtime, dtype, zero), per_param in expected.items():
        mem = stage_memory(1e9, 0.0, 0, zero, d, "adam", dtype, runtime=runtime)
        held = mem.weights_bytes + mem.gradients_bytes + mem.optimizer_bytes
        assert held == pytest.approx(1e9 * per_param), (runtime, dtype, zero)


@pytest.mark.parametrize("runtime,dtype,width", [("megatron-core", "bf16", 4), ("megatron-core", "fp8", 4),
                                                 ("megatron-core", "fp16", 2), ("megatron-lm-2021", "bf16", 4),
                                                 ("pytorch-fsdp2", "bf16", 4), ("deepspeed", "bf16", 2)])
def test_gradients_are_reduced_at_the_runtimes_width(runtime, dtype, width):
    # Megatron reduces its fp32 main grads (bf16 forces it; fp16 keeps fp16 gradients), torchtitan's FSDP2
    # reduces in fp32, DeepSpeed in the weights' dtype; the weights are gathered in the training dtype
    cluster = load_cluster("dgx-a100-80gb*2")
    group = dp_group(cluster, tuple(range(16)), DeviceCalibration())
    sync = dp_sync(1, np.asarray(1e9), group, dtype, get_runtime(runtime))
    ring = 15 / 16
    assert float(sync.grad.sent_bytes) == pytest.approx(ring * 1e9 * width)
    assert float(sync.gather.sent_bytes) == pytest.approx(ring * 1e9 * 2)


@pytest.mark.parametrize("sp", [False, True])
def test_each_tensor_parallel_collective_pays_its_own_latency(sp):
    # a GPT block has two row-parallel GEMMs (attention output, MLP down): Megatron reduces each output in its
    # own call, forward, and the input gradient of each column-parallel GEMM that opens them, backward
    model = gpt(2, 1024, 16, 2048, 32000)
    node, cal = catalog.get_node(NODE), DeviceCalibration()
    costs = layer_costs(model, node, 4, 1, "none", sp, calibration=cal)
    one = tp_collective_time_s("reduce_scatter+all_gather" if sp else "all_reduce", 2048 * 1024 * 2, node, 4, cal)
    assert costs.tp_comm_s[_blocks(model)[0]] == pytest.approx(4 * one, rel=1e-9)
    twice = tp_collective_time_s("reduce_scatter+all_gather" if sp else "all_reduce", 2 * 2048 * 1024 * 2, node, 4,
                                 cal)
    assert 4 * one > 2 * twice  # the same bytes in fewer calls pay fewer latencies


@pytest.mark.parametrize("runtime,sp,split", [("megatron-core", False, 1), ("megatron-core", True, 4),
                                              ("megatron-lm-2021", False, 4), ("deepspeed", False, 1)])
def test_stage_hand_off_is_what_each_tensor_parallel_rank_sends(runtime, sp, split):
    # Megatron-Core sends the whole [s, b, h] activation from every tensor-parallel rank unless sequence
    # parallelism splits it; Megatron-LM v2.5 scatters it over the tp ranks and gathers it after the send
    model = gpt(2, 1024, 16, 2048, 32000)
    costs = layer_costs(model, catalog.get_node(NODE), 4, 2, "none", sp, runtime=runtime)
    block = _blocks(model)[0]
    seq, micro_batch, hidden, width = 2048, 2, 1024, 2
    assert costs.output_bytes[block] == pytest.approx(seq * micro_batch * hidden * width / split)


def test_a_tied_head_on_a_later_stage_holds_a_copy_of_the_word_embedding():
    # the builder's GPT ties its LM head to the word embedding: Megatron allocates the head's weight on the
    # last stage when pp > 1, with its own gradient and optimizer state
    model = gpt(4, 1024, 16, 1024, 32000)
    head = model.layers[-1]
    assert head.kind == "head" and head.tied_params == ((0, 32000 * 1024),)
    assert not _llama().layers[-1].tied_params  # Llama's head is untied
    cluster = load_cluster("dgx-a100-80gb*1")
    config = dict(global_batch=8, tp=2, dp=2, zero=0, micro_batch=1, recompute="none", sequence_parallel=False)
    one = estimate(model, cluster, ParallelConfig(pp=1, **config))
    two = estimate(model, cluster, ParallelConfig(pp=2, **config))
    width = 2  # bf16 weights
    held = sum(stage.memory.weights_bytes for stage in two.stages) - one.stages[0].memory.weights_bytes
    assert held == pytest.approx(32000 * 1024 / 2 * width)
    last = two.stages[-1]
    costs = layer_costs(model, catalog.get_node(NODE), 2, 1, "none", False)
    own = float(costs.params_per_rank[last.first_layer:last.last_layer + 1].sum())
    assert last.memory.weights_bytes == pytest.approx((own + 32000 * 1024 / 2) * width)


def test_a_tied_heads_copies_are_all_reduced_between_their_stages_in_fp32():
    # Megatron all-reduces the word embedding's fp32 main gradient between the first stage and the stage
    # holding the head's copy after the data-parallel reduction; both stages wait for it, no other does
    model = gpt(4, 1024, 16, 1024, 32000)
    cluster = load_cluster("dgx-a100-80gb*2")
    runtime = get_runtime("megatron-core")

    def tied_s(model: LayerGraph, pp: int) -> np.ndarray:
        stages = _megatron_spec_stages(model, cluster, 2, pp, 2)
        return _placement(model, cluster, stages, "adam", "bf16", None, runtime).tied_sync_s

    stages = _megatron_spec_stages(model, cluster, 2, 4, 2)
    leaders = [stages[0].replicas[0].devices[0], stages[-1].replicas[0].devices[0]]
    group = dp_group(cluster, leaders, DeviceCalibration())
    expected = collective_time_s("all_reduce", 32000 * 1024 / 2 * 4, group)
    assert expected > 0
    assert tied_s(model, 4) == pytest.approx([expected, 0.0, 0.0, expected], rel=1e-6)
    assert not tied_s(model, 1).any()  # one stage holds the head and its owner
    assert not tied_s(_llama(), 2).any()  # Llama's head is untied


# ------------------------------------------------------------------------------------------ small models

def test_gemm_at_small_m_is_slower_per_flop():
    profile = catalog.get_device("a100-80gb")
    cal = DeviceCalibration()
    per_flop = {m: _gemm_time_s(profile, m, 4096, 4096, "bf16", cal) / (2 * m * 4096 * 4096) for m in (16, 256, 8192)}
    assert per_flop[16] > per_flop[256] > per_flop[8192]
    # tile quantization: one row past a multiple of the 64-wide tile costs a whole extra tile row
    assert _gemm_time_s(profile, 8193, 4096, 4096, "bf16", cal) > _gemm_time_s(profile, 8192, 4096, 4096, "bf16", cal)


def test_every_kernel_pays_the_launch_floor():
    model = gpt(2, 768, 12, 1024, 50257)
    node = catalog.get_node(NODE)
    floor = node.device.op_overhead_s
    assert floor > 0
    costs = layer_costs(model, node, 1, 1, "none", False, runtime=UNFUSED)
    i = _blocks(model)[0]
    kernels = sum(1 for op in model.layers[i].ops if op.gemm is not None or op.bytes_read + op.bytes_written > 0)
    assert costs.forward_s[i] >= kernels * floor
    # a tiny layer takes at least its kernels' launch floors, however little work it does
    tiny = Layer(0, "tiny", "other", 0, 1.0, 0.0, 2.0, ops=model.layers[i].ops[:1])
    small = dataclasses.replace(tiny, ops=(dataclasses.replace(tiny.ops[0], flops=1.0, bytes_read=2.0,
                                                               bytes_written=2.0),))
    assert layer_costs(LayerGraph("t", (small,)), node, 1, 1, "none", False).forward_s[0] >= floor


def test_causal_flash_attention_computes_the_blocks_on_and_below_the_diagonal():
    gpt_block = gpt(2, 1024, 16, 2048, 32000).layers[1]
    bert = import_model_proto(build("bert", dict(layers=2, hidden=256, heads=4, seq_len=128, vocab=1000)),
                              {"batch": 1}, name="bert-test")
    assert gpt_block.transformer.causal and not bert.layers[1].transformer.causal  # a padding mask is per sample
    node = catalog.get_node(NODE)
    full = dataclasses.replace(gpt_block, transformer=dataclasses.replace(gpt_block.transformer, causal=False))
    t = {name: layer_costs(LayerGraph(name, (layer,)), node, 1, 4, "none", False, runtime=FLASH).forward_s[0]
         for name, layer in (("causal", gpt_block), ("full", full))}
    # Q.K^T and P.V: 2 x (2 s^2 d) per head over 16 heads of d = 64, at FlashAttention-2's forward fraction;
    # with 128-key blocks, 16 x 17 / 2 of the 16 x 16 blocks are computed under the causal mask
    s, heads, d, b = 2048, 16, 64, 4
    flops = 2 * (2 * s * s * d) * heads * b
    peak = node.device.peak_flops_per_s["bf16"]
    skipped = flops * (1 - 17 / 32) / (peak * 0.73)
    assert t["full"] - t["causal"] == pytest.approx(skipped, rel=1e-6)


def test_flash_attention_falls_back_to_the_fused_softmax_where_it_does_not_run():
    """FlashAttention-2 needs Ampere or newer: on V100 a flash runtime keeps the scores in memory, as the
    fused softmax does, and on A100 it does not."""
    model = gpt(2, 256, 4, 512, 32000)
    block = _blocks(model)[0]
    v100, a100 = catalog.get_node("hgx-v100-32gb"), catalog.get_node("dgx-a100-80gb")
    assert not v100.device.flash_attention and a100.device.flash_attention
    flash = get_runtime("megatron-core")
    fused = dataclasses.replace(flash, name="fused-test", attention="fused-softmax")
    on_v100 = layer_costs(model, v100, 1, 1, "none", False, "fp16", runtime=flash).activation_bytes[block]
    fused_v100 = layer_costs(model, v100, 1, 1, "none", False, "fp16", runtime=fused).activation_bytes[block]
    on_a100 = layer_costs(model, a100, 1, 1, "none", False, "fp16", runtime=flash).activation_bytes[block]
    assert on_v100 == pytest.approx(fused_v100)
    assert on_a100 < on_v100
