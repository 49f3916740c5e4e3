"""Context parallelism: the sequence of every sample split over ``cp`` ranks, and the K/V exchange between them.

What a context-parallel rank computes
-------------------------------------
Megatron-Core cuts each sequence into ``2 cp`` equal chunks and gives rank ``i`` chunks ``i`` and
``2cp - 1 - i`` (Megatron-LM ``get_batch_on_this_cp_rank``, megatron/core/utils.py: "we split sequence into
2*CP ranks ... so that we can get balanced workload among GPUs in a context parallel group"). Every op that
works token by token (the projections, the MLP, norms, the loss) runs on the rank's ``s / cp`` tokens, and
its attention computes its own queries against every key: under a causal mask, rank ``i``'s early chunk
sees ``i + 1/2`` chunks of keys and its late chunk ``2cp - i - 1/2``, together ``2cp`` chunk pairs, the same
for every rank, ``1/cp`` of the whole causal attention. So the per-rank costs are the per-sample costs at
``micro_batch / cp`` samples (``planner.cost.compute.layer_costs(cp=...)``): the activations a layer keeps
(``planner.cost.memory``) divide by ``cp`` too, while parameters, gradients and optimizer states are
replicated over the cp ranks as over data-parallel ones. The gradients are reduced over the ``dp x cp``
ranks that hold a copy (Megatron-Core's DistributedDataParallel buckets reduce over
``get_data_parallel_group(with_context_parallel=True)``), which the estimator's data-parallel group of a
stage is: one rank per ``tp`` group, ``dp x cp`` of them; the distributed optimizer shards over it too.

The K/V exchange (``--cp-comm-type p2p``, Megatron-Core's default)
------------------------------------------------------------------
Transformer Engine's ``AttnFuncWithCPAndKVP2P``
(transformer_engine/pytorch/attention/dot_product_attention/context_parallel.py) runs the attention of a
rank in ``cp`` steps around a ring of the cp ranks. Forward: at step ``j`` it waits for the K/V chunk
received during step ``j - 1``, posts the send of the chunk in hand to the next rank and the receive of the
next one (``i < cp_size - 1``), and computes the attention of its queries against the chunk in hand. So
``cp - 1`` transfers of the rank's K and V (``b (s / cp) (kv_heads / tp) (head_dim + v_head_dim)`` elements
at the activation width; grouped-query attention moves the narrow K and V, multi-head latent attention its
per-head keys and values) each hide behind one step's attention,
and what is exposed is ``(cp - 1) max(0, transfer - step)``. Backward: the same ring, K/V forward with the
accumulated dK/dV: step 0 sends K/V, steps ``1 .. cp - 2`` K/V together with dK/dV (one ``2 x kv`` buffer),
step ``cp - 1`` dK/dV alone (``p2p_comm_buffers`` of ``(2, *kv.shape)``, ``kv.dtype``), each hidden behind
that step's attention backward; ``2 (cp - 1)`` chunks in all. Every step computes the same causal work
(``load balancing``: a diagonal step over both of the rank's chunks, the other steps all queries against
half the keys or half the queries against all keys), so a step takes ``1/cp`` of the rank's attention.
Full recompute re-runs the forward, exchange included, in the backward pass.

Each step's transfers run at once on every ring (one per tensor-parallel rank) and a step ends when its
slowest hop does: the hop time is ``planner.hardware.collectives.p2p_time_s`` (each device its share of its
node's NICs where a hop leaves the node). The ranks of a ring are ``tp`` apart: Megatron-Core orders ranks
tp fastest, then cp, then dp, then pp (``parallel_state`` order ``tp-cp-ep-dp-pp``), so a ring stays inside a
node while ``tp x cp`` fits in one.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from planner.cost.memory import dtype_bytes
from planner.hardware.collectives import p2p_time_s
from planner.types import Cluster, Layer, TransformerDims


def kv_chunk_bytes(dims: TransformerDims, micro_batch: float, tp: int, cp: int, dtype: str) -> float:
    """Bytes of K and V one rank holds of its ``1/cp`` of each sequence of a micro-batch, on one of ``tp``
    tensor-parallel ranks: ``b (s / cp) (kv_heads / tp) (head_dim + v_head_dim)`` elements of the activation
    width."""
    kv_heads = dims.kv_heads or dims.heads
    return micro_batch * (dims.seq_len / cp) * (kv_heads / tp) * (dims.key_dim + dims.value_dim) * dtype_bytes(dtype)


def exchange_bytes(dims: TransformerDims, micro_batch: float, tp: int, cp: int, dtype: str) -> tuple[float, float]:
    """(forward, backward) bytes one rank sends per layer and micro-batch: ``cp - 1`` K/V chunks forward,
    ``cp - 1`` K/V chunks and ``cp - 1`` dK/dV chunks backward."""
    if cp <= 1:
        return 0.0, 0.0
    chunk = kv_chunk_bytes(dims, micro_batch, tp, cp, dtype)
    return (cp - 1) * chunk, 2.0 * (cp - 1) * chunk


def ring_ranks(devices: Sequence[int], tp: int, cp: int) -> tuple[int, ...]:
    """The cp ranks of the first tensor-parallel rank's ring in a replica's devices (tp fastest, then cp)."""
    return tuple(devices[j * tp] for j in range(cp))


def ring_step_s(cluster: Cluster, ring: Sequence[int], size_bytes: float, comm_scale: float = 1.0) -> float:
    """One ring step: every rank sends ``size_bytes`` to the next; the slowest hop ends the step."""
    if len(ring) <= 1 or size_bytes <= 0:
        return 0.0
    hops = {(ring[j], ring[(j + 1) % len(ring)]) for j in range(len(ring))}
    return max(p2p_time_s(cluster, src, dst, size_bytes) for src, dst in hops) / comm_scale


def exposed_s(cp: int, kv_step_s: float, kv_and_grad_step_s: float, forward_s: float,
              backward_s: float) -> tuple[float, float]:
    """(forward, backward) seconds of the ring exchange that one layer's attention does not hide, from the
    step times of a K/V chunk and of K/V with dK/dV, and the attention kernel's whole forward and backward
    time on the rank (``cp`` equal steps of it)."""
    if cp <= 1:
        return 0.0, 0.0
    step_f, step_b = forward_s / cp, backward_s / cp
    forward = (cp - 1) * max(0.0, kv_step_s - step_f)
    # step 0 sends K/V, the last step dK/dV (both one chunk); the cp - 2 between them both
    backward = 2.0 * max(0.0, kv_step_s - step_b) + (cp - 2) * max(0.0, kv_and_grad_step_s - step_b)
    return forward, backward


def layers_exchange_s(layers: Sequence[Layer], kernel_forward_s: np.ndarray, kernel_backward_s: np.ndarray,
                      cluster: Cluster, devices: Sequence[int], tp: int, cp: int, micro_batch: int, dtype: str,
                      recompute: str, comm_scale: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
    """Per layer of ``layers`` (one replica's stage), the exposed exchange (forward, backward) of one
    micro-batch; full recompute repeats the forward's in the backward. Layers without attention: 0."""
    forward, backward = np.zeros(len(layers)), np.zeros(len(layers))
    if cp <= 1:
        return forward, backward
    ring = ring_ranks(devices, tp, cp)
    steps: dict[float, float] = {}

    def step(size: float) -> float:
        if size not in steps:
            steps[size] = ring_step_s(cluster, ring, size, comm_scale)
        return steps[size]

    for i, layer in enumerate(layers):
        if layer.transformer is None or layer.kind != "block":
            continue
        chunk = kv_chunk_bytes(layer.transformer, micro_batch, tp, cp, dtype)
        f, b = exposed_s(cp, step(chunk), step(2.0 * chunk), float(kernel_forward_s[i]), float(kernel_backward_s[i]))
        forward[i], backward[i] = f, b + (f if recompute == "full" else 0.0)
    return forward, backward
