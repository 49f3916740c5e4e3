"""Memory model: Korthikanti et al. 2022 activation formulas, ZeRO, and memory feasibility."""

import dataclasses

import onnx
import pytest

from planner.builders import build
from planner.cost import estimate, layer_costs, stage_memory, transformer_activation_bytes
from planner.cost.memory import micro_batches_in_flight
from planner.graph import import_model_proto
from planner.hardware import catalog, load_cluster
from planner.runtime import RUNTIMES, get_runtime
from planner.types import LayerGraph, ParallelConfig
from tests.cost_models import gpt, gpt3_175b

S, B, H, A = 2048, 2, 4096, 32  # seq, micro-batch, hidden, heads


@pytest.mark.parametrize("t", [1, 2, 4, 8])
def test_korthikanti_formulas(t):
    sbh = S * B * H
    # no parallelism (t = 1) and tensor parallelism: s b h (10 + 24/t + 5 a s / (h t))
    assert transformer_activation_bytes(S, B, H, A, t) == pytest.approx(sbh * (10 + 24 / t + 5 * A * S / (H * t)))
    if t == 1:
        assert transformer_activation_bytes(S, B, H, A) == pytest.approx(sbh * (34 + 5 * A * S / H))
    # tensor + sequence parallelism: s b h / t (34 + 5 a s / h)
    assert transformer_activation_bytes(S, B, H, A, t, True) == pytest.approx(sbh / t * (34 + 5 * A * S / H))
    # selective recompute with sequence parallelism: 34 s b h / t
    assert transformer_activation_bytes(S, B, H, A, t, True, "selective") == pytest.approx(34 * sbh / t)
    # full recompute: the block input, 2 s b h
    assert transformer_activation_bytes(S, B, H, A, t, False, "full") == pytest.approx(2 * sbh)


@pytest.mark.parametrize("tp,sp,recompute,expected", [
    (1, False, "none", lambda sbh, t: sbh * (34 + 5 * 12 * 1024 / 768)),
    (2, False, "none", lambda sbh, t: sbh * (10 + 24 / t + 5 * 12 * 1024 / (768 * t))),
    (4, True, "none", lambda sbh, t: sbh / t * (34 + 5 * 12 * 1024 / 768)),
    (4, True, "selective", lambda sbh, t: 34 * sbh / t),
    (2, False, "full", lambda sbh, t: 2 * sbh),
])
def test_layer_costs_use_korthikanti_for_blocks(tp, sp, recompute, expected):
    model = gpt(2, 768, 12, 1024, 50257)
    node = catalog.get_node("dgx-a100-80gb")
    # Korthikanti's counts keep the attention scores in memory: a runtime with the fused softmax, not FlashAttention
    costs = layer_costs(model, node, tp, 3, recompute, sp, runtime="megatron-lm-2021")
    blocks = [i for i, layer in enumerate(model.layers) if layer.kind == "block"]
    sbh = 1024 * 3 * 768
    for i in blocks:
        assert costs.activation_bytes[i] == pytest.approx(expected(sbh, tp))


@pytest.mark.parametrize("t", [2, 8])
def test_embedding_and_head_split_their_hidden_tensors_only_under_sequence_parallelism(t):
    """Megatron-Core's vocabulary-parallel embedding all-reduces its lookup and its output layer saves its
    whole hidden input: without sequence parallelism the hidden-sized tensors they save (the embedding's
    dropout mask, the final norm's and the output layer's inputs) are whole on every rank, and only the
    loss's fp32 softmax over the rank's share of the vocabulary is divided by t. With sequence parallelism
    the hidden-sized tensors are the rank's sequence shard too. The token indices are whole either way."""
    s, b, h, v = 128, 3, 256, 1000
    model = gpt(2, h, 4, s, v)
    embedding, head = model.layers[0], model.layers[-1]
    w = 2  # bf16
    mask, ids = s * h * 1, s * 8  # per sample: a 1-byte dropout mask per element, int64 token indices
    hidden = 2 * w * s * h  # the final norm's input and the output layer's input
    softmax = 4 * s * v  # fp32
    assert (embedding.activation_bytes, embedding.integer_activation_bytes) == (mask + ids, ids)
    assert (head.activation_bytes, head.logit_activation_bytes) == (hidden, 0)  # no loss in the graph
    node = catalog.get_node("dgx-a100-80gb")
    for sp in (False, True):
        costs = layer_costs(model, node, t, b, "none", sp)
        split = t if sp else 1
        assert costs.activation_bytes[0] == pytest.approx(b * (ids + mask / split))
        assert costs.activation_bytes[-1] == pytest.approx(b * (hidden / split + softmax / t))
    one = layer_costs(model, node, 1, b, "none", False)
    assert one.activation_bytes[0] == pytest.approx(b * (ids + mask))
    assert one.activation_bytes[-1] == pytest.approx(b * (hidden + softmax))


def test_a_head_splits_what_it_computes_from_its_output_layer():
    """What a head computes from its output layer (the vocabulary-parallel logits) is split over t; what it
    computes before it is not, a transform before the output layer (BERT's LM head: dense, GELU, norm)
    included."""
    s, h, v, t = 128, 256, 1000, 4
    proto = build("gpt", dict(layers=2, hidden=h, heads=4, seq_len=s, vocab=v))
    logits = proto.graph.output[0]
    proto.graph.node.append(onnx.helper.make_node("LogSoftmax", [logits.name], ["log_probs"], axis=-1))
    proto.graph.output.remove(logits)
    proto.graph.output.append(onnx.helper.make_tensor_value_info("log_probs", logits.type.tensor_type.elem_type,
                                                                 ["batch", "seq", v]))
    model = import_model_proto(proto, {"batch": 1}, name="gpt-log-softmax")
    head = model.layers[-1]
    assert head.kind == "head" and head.logit_activation_bytes == 2 * s * v  # the saved log-softmax output
    assert head.activation_bytes - head.logit_activation_bytes == 2 * 2 * s * h
    node = catalog.get_node("dgx-a100-80gb")
    costs = layer_costs(model, node, t, 1, "none", False)
    assert costs.activation_bytes[-1] == pytest.approx(2 * 2 * s * h + (2 * s * v + 4 * s * v) / t)
    bert = import_model_proto(build("bert", dict(layers=2, hidden=h, heads=4, seq_len=s, vocab=v)), {"batch": 1},
                              name="bert-test")
    head = bert.layers[-1]
    # the inputs of the dense projection, the GELU, the norm and the output layer, all hidden-sized and whole
    assert head.kind == "head" and head.logit_activation_bytes == 0 and head.activation_bytes == 4 * 2 * s * h


def test_zero_stages_divide_states_gradients_weights():
    p, dp = 1e9, 8
    # Megatron-Core keeps bf16 weights, fp32 main grads and fp32 master + Adam moments: 2 + 4 + 12 bytes/param
    m0 = stage_memory(p, 0.0, 0, 0, dp, "adam", "bf16", runtime="megatron-core")
    assert (m0.weights_bytes, m0.gradients_bytes, m0.optimizer_bytes) == (2e9, 4e9, 12e9)
    m1 = stage_memory(p, 0.0, 0, 1, dp, "adam", "bf16", runtime="megatron-core")
    assert m1.optimizer_bytes == pytest.approx(12e9 / dp) and m1.gradients_bytes == 4e9
    m2 = stage_memory(p, 0.0, 0, 2, dp, "adam", "bf16", runtime="megatron-core")
    assert m2.gradients_bytes == pytest.approx(4e9 / dp) and m2.weights_bytes == 2e9
    m3 = stage_memory(p, 0.0, 0, 3, dp, "adam", "bf16", runtime="megatron-core")
    assert m3.weights_bytes == pytest.approx(2e9 / dp)
    # SGD with momentum: fp32 master + one moment
    assert stage_memory(p, 0.0, 0, 0, 1, "sgd", "bf16", runtime="megatron-core").optimizer_bytes == 8e9
    assert m0.total_bytes > m1.total_bytes > m2.total_bytes > m3.total_bytes


def test_activations_scale_with_micro_batches_in_flight():
    one = stage_memory(1e6, 5e8, 1, 0, 1, "adam", "bf16")
    four = stage_memory(1e6, 5e8, 4, 0, 1, "adam", "bf16")
    assert four.activations_bytes == pytest.approx(4 * one.activations_bytes)
    # 1F1B: stage s holds pp - s micro-batches; GPipe all of them
    assert [micro_batches_in_flight(s, 4, 16, "1f1b") for s in range(4)] == [4, 3, 2, 1]
    assert micro_batches_in_flight(0, 4, 16, "gpipe") == 16
    # interleaved (Megatron-LM warm-up 2 (p - s - 1) + (v - 1) p chunks, plus one), in whole-stage units
    assert micro_batches_in_flight(0, 4, 16, "interleaved", 2) == pytest.approx((2 * 3 + 4 + 1) / 2)


def test_gpt3_175b_on_one_device_does_not_fit():
    model = gpt3_175b()
    cluster = load_cluster("dgx-a100-80gb*1")
    est = estimate(model, cluster, ParallelConfig(global_batch=8, tp=1, pp=1, dp=1))
    assert not est.feasible
    assert "stage 0" in est.reason and "80" in est.reason  # names the stage and the capacity (GB)
    assert est.memory_per_device_bytes > 16 * 174e9  # weights, gradients and Adam states alone


def test_gpt3_175b_fits_on_1024_a100s():
    model = gpt3_175b()
    cluster = load_cluster("dgx-a100-80gb*128")
    est = estimate(model, cluster, ParallelConfig(global_batch=1536, tp=8, pp=16, dp=8))
    assert est.feasible and est.memory_per_device_bytes < 80e9


def test_attention_tensors_are_counted_at_their_head_widths():
    """Q, K and V are saved at their own widths per head (a d_k, a_kv d_k, a_kv d_v) and the output projection's
    input at a d_v: multi-head latent attention's 192-wide keys and 128-wide values on 16 heads of a
    1,024-wide model save more than three hidden-wide tensors; with d = hidden / heads nothing changes."""

    s, b, h, a = 256, 1, 1024, 16
    common = dict(kv_heads=a, dropout=False, attention="flash")
    base = transformer_activation_bytes(s, b, h, a, **common)
    assert transformer_activation_bytes(s, b, h, a, head_dim=64, v_head_dim=64, **common) == base
    mla = transformer_activation_bytes(s, b, h, a, head_dim=192, v_head_dim=128, **common)
    w = g = 2  # bf16
    assert mla - base == s * b * (w * (a * 192 + a * (192 + 128)) + g * a * 128 - (w * 3 * h + g * h))


def test_deepspeed_keeps_gradients_in_the_weights_dtype_and_steps_on_an_fp32_copy():
    """DeepSpeed accumulates gradients in the weights' dtype (engine.get_data_types: no grad_accum_dtype set)
    and its optimizers step on an fp32 copy: ZeRO-1 in bf16 holds 2 + 2 + 16/d bytes per parameter, ZeRO-0
    (FP16_Optimizer's flat fp32 master and gradient) 20, unsharded."""
    p, dp = 1e9, 8
    m1 = stage_memory(p, 0.0, 0, 1, dp, "adam", "bf16", runtime="deepspeed")
    assert (m1.weights_bytes, m1.gradients_bytes) == (2e9, 2e9)
    assert m1.optimizer_bytes == pytest.approx(16e9 / dp)
    m0 = stage_memory(p, 0.0, 0, 0, dp, "adam", "bf16", runtime="deepspeed")
    assert m0.weights_bytes + m0.gradients_bytes + m0.optimizer_bytes == pytest.approx(20e9)


def test_deepspeed_bf16_pipeline_without_zero_shards_its_optimizer_states():
    """With pp > 1 DeepSpeed runs bf16 ZeRO-0 through its BF16_Optimizer, whose fp32 master and moments are
    sharded over dp as ZeRO-1's; fp16 keeps FP16_Optimizer's whole copy, and one stage keeps it too."""
    p, dp = 1e9, 8

    def states(dtype: str, pipelined: bool) -> float:
        return stage_memory(p, 0.0, 0, 0, dp, "adam", dtype, runtime="deepspeed", pipelined=pipelined).optimizer_bytes

    assert states("bf16", True) == pytest.approx(states("bf16", False) / dp)
    assert states("fp16", True) == states("fp16", False)
    one = stage_memory(p, 0.0, 0, 1, dp, "adam", "bf16", runtime="deepspeed", pipelined=True)
    assert states("bf16", True) == pytest.approx(one.optimizer_bytes)
    # the other runtimes' ZeRO-0 is the same with or without a pipeline
    for runtime in ("megatron-core", "pytorch-fsdp2"):
        a, b = (stage_memory(p, 0.0, 0, 0, dp, "adam", "bf16", runtime=runtime, pipelined=x) for x in (False, True))
        assert a == b


@pytest.mark.parametrize("zero,pipelined,buffers", [(0, False, 0), (1, False, 2), (2, False, 2), (3, False, 1),
                                                    (1, True, 1)])
def test_deepspeed_gradient_buckets_are_held_beside_the_model(zero, pipelined, buffers):
    """DeepSpeed's ZeRO optimizer copies gradients into contiguous buckets of reduce_bucket_size elements in the
    weights' dtype: two while overlap_comm double-buffers them, one at ZeRO-3 or when a pipeline turns the
    overlap off, none without a ZeRO optimizer. They join other_bytes with the allocator's reserve on them."""
    runtime = get_runtime("deepspeed")
    plain = dataclasses.replace(runtime, name="deepspeed-no-buckets", contiguous_grad_buckets=False)
    with_, without = (stage_memory(1e9, 0.0, 0, zero, 8, "adam", "bf16", runtime=rt, pipelined=pipelined)
                      for rt in (runtime, plain))
    held = buffers * runtime.grad_bucket_params * 2
    assert with_.other_bytes - without.other_bytes == pytest.approx(held * (1 + runtime.allocator_reserve_fraction))
    assert with_.total_bytes - with_.other_bytes == without.total_bytes - without.other_bytes


@pytest.mark.parametrize("tp", [1, 4])
def test_full_recompute_reruns_the_transformer_layers_only(tp):
    """Megatron-Core checkpoints the layers of its TransformerBlock (as Megatron-LM v2.5 and torchtitan do their
    transformer layers): under full recompute the embedding and the output head keep what they save and run
    their forward once, while every block keeps its input and re-runs its forward in the backward pass."""
    model = gpt(4, 1024, 16, 512, 50000)
    node = catalog.get_node("dgx-a100-80gb")
    none, full = (layer_costs(model, node, tp, 2, r, False) for r in ("none", "full"))
    kinds = [layer.kind for layer in model.layers]
    for i, kind in enumerate(kinds):
        if kind in ("embedding", "head"):
            assert full.activation_bytes[i] == none.activation_bytes[i] and full.recompute_s[i] == 0.0
            assert full.backward_s[i] == none.backward_s[i] and full.tp_comm_s[i] == none.tp_comm_s[i]
        elif kind == "block":
            assert full.activation_bytes[i] < none.activation_bytes[i]
            assert full.recompute_s[i] > 0.0 and full.backward_s[i] > none.backward_s[i]
    assert {"embedding", "head", "block"} <= set(kinds)


def test_layers_that_differ_only_in_their_input_keep_their_own_recompute_checkpoint():
    """Full recompute keeps a generic layer's input (its checkpoint); two layers alike but for their input size
    hold different bytes, so the per-layer cost cache tells them apart."""
    block = next(layer for layer in gpt(2, 256, 4, 64, 1000).layers if layer.kind == "block")
    small, large = (dataclasses.replace(block, kind="layer", transformer=None, input_bytes=size,
                                        activation_bytes=50_000) for size in (1000, 2000))
    model = LayerGraph(name="two", layers=(small, large))
    held = layer_costs(model, catalog.get_node("dgx-a100-80gb"), 1, 1, "full", False).activation_bytes
    assert held[1] == pytest.approx(2 * held[0]) and held[0] > 0


def test_a_heads_projection_before_its_output_layer_runs_whole_on_every_rank():
    """BERT's LM head transforms the hidden state with a plain linear layer (Megatron-Core's BertLMHead) before
    the vocabulary-parallel output layer: the importer splits only the output layer's GEMM, so at tp 4 the
    transform's GEMM time stays whole while the output layer's falls by four."""
    h, s, v = 2048, 1024, 32000
    bert = import_model_proto(build("bert", dict(layers=1, hidden=h, heads=16, seq_len=s, vocab=v)), {"batch": 1},
                              name="bert-test")
    head = bert.layers[-1]
    gemms = [op for op in head.ops if op.gemm is not None]
    assert [op.tp_split for op in gemms] == ["replicated", "column"]
    node = catalog.get_node("dgx-a100-80gb")
    one, four = (layer_costs(bert, node, t, 1, "none", False).forward_s[-1] for t in (1, 4))
    everything_split = dataclasses.replace(bert, layers=bert.layers[:-1] + (dataclasses.replace(
        head, ops=tuple(dataclasses.replace(op, tp_split="column") if op.gemm is not None else op
                        for op in head.ops)),))
    assert four > layer_costs(everything_split, node, 4, 1, "none", False).forward_s[-1]
    assert four < one


def test_fsdp2_in_a_pipeline_accumulates_unsharded_gradients():
    """torch.distributed.pipelining turns FSDP2's gradient sync and resharding after backward off for every
    micro-batch and reduce-scatters once after the last: with pp > 1 a ZeRO-2/3 stage holds its whole fp32
    gradient, and at ZeRO-3 its 16-bit parameters stay gathered as at ZeRO-2."""
    p, dp = 1e9, 8

    def mem(zero: int, pipelined: bool):
        return stage_memory(p, 0.0, 0, zero, dp, "adam", "bf16", runtime="pytorch-fsdp2", pipelined=pipelined)

    for zero in (2, 3):
        assert mem(zero, False).gradients_bytes == pytest.approx(4 * p / dp)
        assert mem(zero, True).gradients_bytes == pytest.approx(4 * p)
    assert mem(3, True).weights_bytes == pytest.approx(mem(2, False).weights_bytes)
    assert mem(3, False).weights_bytes == pytest.approx(4 * p / dp)
    # Megatron-Core's ZeRO-1 and DeepSpeed do not defer
    for runtime, zero in (("megatron-core", 1), ("deepspeed", 2)):
        held = [stage_memory(p, 0.0, 0, zero, dp, "adam", "bf16", runtime=runtime, pipelined=x).gradients_bytes
                for x in (False, True)]
        assert held[0] == held[1]


def test_fsdp2_stages_one_layers_gradient_for_its_reduce_scatter(monkeypatch):
    """FSDP2 reduce-scatters layer by layer: as it reduces a layer it holds autograd's unsharded bf16 gradient
    and the fp32 reduce-scatter input (foreach_reduce), the largest layer's worth beside the steady state, at
    ZeRO-2 and ZeRO-3; a runtime reducing in buckets of its own stages no such layer."""
    model = gpt(4, 1024, 16, 512, 50000)
    cluster = load_cluster("dgx-a100-80gb")
    fsdp2 = get_runtime("pytorch-fsdp2")
    bucketed = dataclasses.replace(fsdp2, name="fsdp2-bucketed", grad_bucket_params=40_000_000)
    monkeypatch.setitem(RUNTIMES, bucketed.name, bucketed)

    def other(runtime: str, zero: int) -> float:
        est = estimate(model, cluster, ParallelConfig(16, tp=1, pp=1, dp=8, micro_batch=1, zero=zero,
                                                       recompute="none", runtime=runtime))
        return est.stages[0].memory.other_bytes

    largest = max(layer.params for layer in model.layers)
    for zero in (2, 3):
        staged = other(fsdp2.name, zero) - other(bucketed.name, zero)
        assert staged == pytest.approx(largest * (2 + 4) * (1 + fsdp2.allocator_reserve_fraction), rel=1e-6)
