"""Laws of context parallelism (planner.cost.context), each checked against a count made here by hand, not
against the cost model's own numbers: activations divide by cp and model states do not; the K/V bytes a
rank sends per layer; every rank's causal attention work is the same under Megatron's chunk assignment; the
gradient reduction spans dp x cp ranks; a million-token sequence estimates and fits once cp is large enough.
"""

from __future__ import annotations

import dataclasses
from functools import lru_cache

import pytest

from planner.builders import build
from planner.cost import estimate, layer_costs
from planner.cost.context import exchange_bytes, kv_chunk_bytes, layers_exchange_s, ring_ranks
from planner.errors import ConfigError
from planner.graph.importer import import_model_proto
from planner.hardware import load_cluster
from planner.types import LayerGraph, ParallelConfig


@lru_cache(maxsize=None)
def llama(seq_len: int, layers: int = 2, hidden: int = 1024, heads: int = 16, kv_heads: int = 4,
          ffn: int = 2816) -> LayerGraph:
    keys = {"layers": layers, "hidden": hidden, "heads": heads, "kv_heads": kv_heads, "ffn": ffn, "vocab": 2048,
            "seq_len": seq_len}
    return import_model_proto(build("llama", keys), {"batch": 1}, name=f"llama-{seq_len}")


def blocks(model: LayerGraph) -> list[int]:
    return [i for i, layer in enumerate(model.layers) if layer.kind == "block"]


@pytest.mark.parametrize("cp", [2, 4, 8])
@pytest.mark.parametrize("recompute", ["none", "full"])
def test_activations_divide_by_cp_and_parameters_do_not(cp: int, recompute: str) -> None:
    model = llama(16384)
    node = load_cluster("dgx-h100*1").groups[0].node
    one = layer_costs(model, node, 2, 2, recompute, True, "bf16", runtime="megatron-core")
    split = layer_costs(model, node, 2, 2, recompute, True, "bf16", runtime="megatron-core", cp=cp)
    for i in range(len(model.layers)):  # every layer holds 1/cp of each sequence, embedding and loss too
        assert split.activation_bytes[i] == pytest.approx(one.activation_bytes[i] / cp, rel=1e-12)
        assert split.params_per_rank[i] == one.params_per_rank[i]


def test_estimate_memory_splits_activations_only() -> None:
    model = llama(16384)
    cluster = load_cluster("dgx-h100*1")
    pinned = dict(global_batch=4, tp=2, pp=1, micro_batch=1, zero=0, recompute="none", runtime="megatron-core")
    one = estimate(model, cluster, ParallelConfig(dp=4, cp=1, **pinned)).stages[0].memory
    four = estimate(model, cluster, ParallelConfig(dp=1, cp=4, **pinned)).stages[0].memory
    assert four.weights_bytes == one.weights_bytes
    assert four.gradients_bytes == one.gradients_bytes
    assert four.optimizer_bytes == one.optimizer_bytes
    assert four.activations_bytes == pytest.approx(one.activations_bytes / 4, rel=1e-12)


def test_kv_exchange_volume_hand_count() -> None:
    """Llama-like block, s = 8192, 32 heads of 128, 8 K/V heads, tp 2, cp 4, b 1, bf16: a rank holds 2048
    tokens of K and V over 4 K/V heads: 2 x 2048 x 4 x 128 x 2 B = 4 MiB; it sends 3 of those forward and
    3 of them plus 3 dK/dV chunks backward."""
    dims = llama(8192, hidden=4096, heads=32, kv_heads=8, ffn=14336).layers[blocks(llama(8192, hidden=4096,
                                                                                        heads=32, kv_heads=8,
                                                                                        ffn=14336))[0]].transformer
    assert kv_chunk_bytes(dims, 1, 2, 4, "bf16") == 2 * 2048 * 4 * 128 * 2 == 4 * 2 ** 20
    assert exchange_bytes(dims, 1, 2, 4, "bf16") == (3 * 4 * 2 ** 20, 6 * 4 * 2 ** 20)
    # grouped-query attention moves the narrow K and V: with every head a K/V head, four times the bytes
    mha = dataclasses.replace(dims, kv_heads=None)
    assert kv_chunk_bytes(mha, 1, 2, 4, "bf16") == 4 * kv_chunk_bytes(dims, 1, 2, 4, "bf16")
    assert exchange_bytes(dims, 1, 2, 1, "bf16") == (0.0, 0.0)


@pytest.mark.parametrize("attention, keys, width", [
    # heads twice hidden / heads wide (Gemma-like): 2 K/V heads of 128 for keys and values
    ("gqa", {"hidden": 512, "heads": 8, "kv_heads": 2, "head_dim": 128}, 2 * 2 * 128),
    # heads narrower than hidden / heads
    ("gqa", {"hidden": 512, "heads": 8, "kv_heads": 2, "head_dim": 32}, 2 * 2 * 32),
    # DeepSeek's multi-head latent attention: every head's key 128 + 64 wide, its value 128
    ("mla", {"hidden": 1024, "heads": 16}, 16 * (192 + 128)),
])
def test_the_ring_moves_the_keys_and_values_the_attention_reads(attention, keys, width) -> None:
    """Transformer Engine sends the K and V tensors the attention reads, whatever their widths per head: the
    importer reads them from the attention products (Q·Kᵀ's Q, P·V's V), so a K/V chunk of s / cp tokens holds
    ``width`` elements per token (tp 1), not 2 x kv_heads x hidden / heads."""
    settings = {"layers": 1, "vocab": 256, "seq_len": 1024, "experts": 4, "top_k": 2, "expert_ffn": 256,
                "attention": attention, **keys}
    model = import_model_proto(build("moe", settings), {"batch": 1}, name=f"moe-{attention}")
    dims = next(layer.transformer for layer in model.layers if layer.transformer is not None)
    assert kv_chunk_bytes(dims, 1, 1, 4, "bf16") == 256 * width * 2
    if attention == "gqa":
        assert (dims.kv_heads, dims.head_dim) == (keys["kv_heads"], keys["head_dim"])  # tp must divide 2


def test_ring_ranks_are_tp_apart() -> None:
    """Megatron-Core's rank order is tp fastest, then cp: the ring of tp rank 0 takes every tp-th device."""
    assert ring_ranks(tuple(range(100, 132)), 4, 8) == (100, 104, 108, 112, 116, 120, 124, 128)


def test_exposed_exchange_is_the_transfer_time_when_attention_is_instant() -> None:
    """With no attention compute to hide behind, each ring step is exposed whole: forward cp - 1 K/V chunk
    transfers, backward 2 chunk-sized steps and cp - 2 steps of K/V with dK/dV, each bytes / link + latency
    of the slowest hop (here across nodes: tp 8 fills a node, so every hop leaves it)."""
    model = llama(65536, hidden=4096, heads=32, kv_heads=8, ffn=14336)
    cluster = load_cluster("dgx-h100*4")
    node = cluster.groups[0].node
    cp, tp = 4, 8
    layer = model.layers[blocks(model)[0]]
    zeros = [0.0]
    f, b = layers_exchange_s([layer], zeros, zeros, cluster, tuple(range(32)), tp, cp, 1, "bf16", "none")
    chunk = 2 * (65536 // cp) * (8 // tp) * 128 * 2  # bytes of K and V a rank sends per step
    per_device = node.inter_node_bandwidth_Bps * node.inter_node_efficiency / node.devices_per_node
    latency = node.inter_node_latency_s + cluster.fabric_latency_s
    step = chunk / per_device + latency
    step2 = 2 * chunk / per_device + latency
    assert f[0] == pytest.approx((cp - 1) * step, rel=0.02)
    assert b[0] == pytest.approx(2 * step + (cp - 2) * step2, rel=0.02)
    # full recompute re-runs the forward, exchange included
    _, b_full = layers_exchange_s([layer], zeros, zeros, cluster, tuple(range(32)), tp, cp, 1, "bf16", "full")
    assert b_full[0] == pytest.approx(b[0] + f[0], rel=1e-12)
    # and attention at least as long as a step hides it all
    long = [1.0]
    assert layers_exchange_s([layer], long, long, cluster, tuple(range(32)), tp, cp, 1, "bf16", "none") \
        == (pytest.approx([0.0]), pytest.approx([0.0]))


def causal_pairs(rank: int, cp: int, chunk: int) -> int:
    """(query, key) pairs under a causal mask that rank ``rank`` computes when it holds chunks ``rank`` and
    ``2cp - 1 - rank`` of ``2cp`` chunks of ``chunk`` tokens (query at position p sees keys 0..p)."""
    return sum(p + 1 for c in (rank, 2 * cp - 1 - rank) for p in range(c * chunk, (c + 1) * chunk))


@pytest.mark.parametrize("cp", [2, 4, 8])
def test_causal_load_balance(cp: int) -> None:
    """Megatron's 2cp-chunk assignment gives every rank the same causal work, 1/cp of the whole, and the
    cost model charges each rank that share of the attention: its kernel time at cp is 1/cp of cp 1's."""
    chunk, s = 16, 2 * cp * 16
    work = [causal_pairs(r, cp, chunk) for r in range(cp)]
    assert len(set(work)) == 1 and sum(work) == s * (s + 1) // 2
    model = llama(131072, hidden=4096, heads=32, kv_heads=8, ffn=14336)
    node = load_cluster("dgx-h100*1").groups[0].node
    one = layer_costs(model, node, 8, 1, "none", True, "bf16", runtime="megatron-core")
    split = layer_costs(model, node, 8, 1, "none", True, "bf16", runtime="megatron-core", cp=cp)
    i = blocks(model)[0]
    assert split.attention_kernel_forward_s[i] == pytest.approx(one.attention_kernel_forward_s[i] / cp, rel=1e-6)
    assert split.attention_kernel_backward_s[i] == pytest.approx(one.attention_kernel_backward_s[i] / cp, rel=1e-6)


def test_gradients_reduce_over_dp_times_cp() -> None:
    """The weights are replicated over cp ranks as over dp ones: dp 1 x cp 2 sends the bytes of dp 2 x cp 1."""
    model = llama(16384)
    cluster = load_cluster("dgx-h100*1")
    pinned = dict(global_batch=4, tp=2, pp=1, micro_batch=1, zero=0, recompute="none", runtime="megatron-core")
    cp2 = estimate(model, cluster, ParallelConfig(dp=1, cp=2, **pinned))
    dp2 = estimate(model, cluster, ParallelConfig(dp=2, cp=1, **pinned))
    assert cp2.stages[0].dp == 1 and cp2.config.cp == 2 and cp2.stages[0].cp == 2
    assert cp2.stages[0].dp_bytes == pytest.approx(dp2.stages[0].dp_bytes, rel=1e-12) and cp2.stages[0].dp_bytes > 0


def test_million_token_sequence_fits_with_enough_cp() -> None:
    """A 70B-wide block (hidden 8192, 64 heads, 8 K/V heads, ffn 28672) at 1M tokens: FlashAttention keeps no
    s^2 tensor, so the estimate runs; without cp the activations cannot fit an H100, with cp 64 they do."""
    model = llama(1 << 20, layers=2, hidden=8192, heads=64, kv_heads=8, ffn=28672)
    cluster = load_cluster("dgx-h100*64")
    base = dict(global_batch=1, tp=8, pp=1, dp=1, micro_batch=1, zero=0, recompute="none", runtime="megatron-core")
    alone = estimate(model, cluster, ParallelConfig(cp=1, **base))
    assert not alone.feasible
    split = estimate(model, cluster, ParallelConfig(cp=64, **base))
    assert split.feasible and split.iteration_time_s > 0
    # causal attention FLOPs grow as s^2: most of the time is attention, and the ring is hidden behind it
    assert split.breakdown.cp_comm_s < 0.05 * split.iteration_time_s


def test_cp_rules_name_the_constraint() -> None:
    model = llama(8192)
    cluster = load_cluster("dgx-h100*2")
    with pytest.raises(ConfigError, match=r"cp=3 does not divide the sequence length 8192 .*valid: .*1, 2, 4"):
        estimate(model, cluster, ParallelConfig(global_batch=4, tp=1, dp=1, cp=3))
    with pytest.raises(ConfigError, match="deepspeed runtime has no context parallelism"):
        estimate(model, cluster, ParallelConfig(global_batch=4, tp=1, dp=1, cp=2, runtime="deepspeed"))
    with pytest.raises(ConfigError, match=r"tp x cp x pp x dp = 4 x 8 x 1 x 1 = 32 devices, but the cluster has 16"):
        estimate(model, cluster, ParallelConfig(global_batch=4, tp=4, dp=1, cp=8))


def test_search_finds_the_fastest_cp_configuration() -> None:
    """A long sequence and a global batch too small for data parallelism alone to use the devices: the
    search's plan is at least as fast (within the tie tolerance) as every uniform tp x cp x pp x dp
    configuration estimate accepts, and uses cp > 1 when that is the fastest."""
    import itertools

    import planner
    from planner.rules import TIE_TOLERANCE

    model = llama(16384, layers=4)
    cluster = load_cluster("dgx-h100*2")
    plan = planner.plan(model, cluster, global_batch=2)
    assert plan.search.cp_searched == (1, 2, 4, 8, 16)
    best = None
    for tp, cp, pp, dp in itertools.product((1, 2, 4), plan.search.cp_searched, (1, 2, 4), (1, 2)):
        if tp * cp * pp * dp > cluster.num_devices:
            continue
        try:
            found = estimate(model, cluster, ParallelConfig(global_batch=2, tp=tp, cp=cp, pp=pp, dp=dp))
        except ConfigError:
            continue
        if found.feasible and (best is None or found.iteration_time_s < best.iteration_time_s):
            best = found
    assert best is not None and best.config.cp > 1
    assert plan.iteration_time_s <= best.iteration_time_s * (1 + TIE_TOLERANCE)
    assert max(stage.cp for stage in plan.stages) > 1
