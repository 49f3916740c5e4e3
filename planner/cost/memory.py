"""Memory per device: weights, gradients, optimizer states, activations in flight, and fixed overheads.

Activations of a transformer block
----------------------------------
Korthikanti et al. 2022 ("Reducing Activation Recomputation in Large Transformer Models", Sec. 4.1) count
what one block saves for its backward pass, for a GPT block (ffn = 4h, GELU, multi-head attention, dropout,
2-byte activations, 1-byte dropout masks): ``s b h (34 + 5 a s / h)``. :func:`transformer_activation_bytes`
counts the same tensors from the block's real dimensions; with sequence length ``s``, micro-batch ``b``,
hidden ``h``, ``a`` heads of ``d_k`` (queries and keys) and ``d_v`` (values) per head (``h / a`` unless the
block says otherwise: wider heads, or multi-head latent attention's 192 and 128), ``a_kv`` key/value heads
(grouped-query attention: narrower K and V), MLP width
``f``, activation width ``w`` (the training dtype: 4 bytes for fp32/tf32, 2 for bf16/fp16 and fp8), GEMM-input
width ``g`` (``w``; under fp8 1 byte plus the recipe's scales, where Transformer Engine saves the inputs of its
fp8 GEMMs as fp8 tensors for the weight gradient) and ``d`` = 1 byte of dropout mask per element where the block
has dropout (0 without):

Per token, replicated across tensor-parallel ranks (divided by ``t`` only under sequence parallelism)::

    two norm inputs                      2 w h     (Korthikanti 4 sbh)
    QKV GEMM input (attention norm out)    g h     (2 sbh)
    dropout mask after the attention       d h     (sbh)
    MLP GEMM input (MLP norm out)          g h     (2 sbh)
    dropout mask after the MLP             d h     (sbh)
    R = (2w + 2g + 2d) h                           (10 sbh)

Per token, split over the ``t`` tensor-parallel ranks::

    Q, K, V (inputs of Q K^T and of P V)   w (a d_k + a_kv d_k + a_kv d_v)   (6 sbh)
    output-projection input                g a d_v               (2 sbh)
    MLP activation input                   w f  (gated: 2 w f, the gate and up projections both)  (8 sbh)
    MLP output-GEMM input                  g f                   (8 sbh)
    T = w (a d_k + a_kv (d_k + d_v)) + g a d_v + (w (1 + gated) + g) f   (24 sbh with d_k = d_v = h / a)

Per head and (query, key) pair, split over ``t``: the softmax output ``w``, its dropout mask ``d`` and the
dropout output ``d w`` (the input of P V), ``S = w + d (1 + w)`` (Korthikanti 5 a s^2 b). With FlashAttention
no score tensor is kept: only the softmax statistics (one fp32 log-sum-exp per head and query, ``4 a s b``;
Dao 2023, FlashAttention-2, Algorithm 1) and the dropout mask is regenerated from the RNG state.

So per block: ``s b (R + T / t) + a s^2 b S / t`` (no sequence parallelism) or ``(s b (R + T) + a s^2 b S) / t``
(with it). Selective recompute drops the score term (it re-runs the attention core; Korthikanti Sec. 5; with
FlashAttention there is nothing to drop); a runtime whose selective recompute is torchtitan's per-op policy
keeps the tensors ``planner.cost.compute`` counts from the block's ops instead. Full recompute keeps only
the block input, ``w s b h`` (``/ t`` under sequence parallelism). For the GPT block at ``w = 2, g = 2,
d = 1`` these are exactly Korthikanti's Table 2: ``sbh (10 + 24/t + 5as/(ht))``, ``sbh/t (34 + 5as/h)``,
``34 sbh/t``, ``2 sbh``. Under fp8 an fp8 GEMM input saved for the backward is its columnwise fp8 copy
(Transformer Engine quantizes the input for both usages and drops the rowwise one after the forward GEMM)
plus the recipe's scales: ``g = 1 + s`` with ``s`` the recipe's scale bytes per element
(``planner.hardware.fp8``: 0 per-tensor, 4/128 blockwise, 1/32 MXFP8).

Activations of the embedding and the output layer
-------------------------------------------------
Megatron-Core splits both over the vocabulary, and what each saves is split as follows (per rank, ``t``
tensor-parallel ranks, vocabulary ``v``):

* the embedding's ``VocabParallelEmbedding`` (megatron/core/tensor_parallel/layers.py) looks up the rank's
  rows of the table and sums the partial lookups over the ranks: an all-reduce
  (``reduce_from_tensor_model_parallel_region``), or under sequence parallelism a reduce-scatter along the
  sequence (``reduce_scatter_to_sequence_parallel_region``); with a learned position embedding
  ``LanguageModelEmbedding`` (megatron/core/models/common/embeddings/language_model_embedding.py) adds it to
  the all-reduced sum and scatters that along the sequence (``scatter_to_sequence_parallel_region``) before
  the embedding dropout. Its dropout mask is therefore whole on every rank, or the rank's sequence shard
  under sequence parallelism; the token indices ``F.embedding`` saves are the whole sequence on every rank
  either way (each rank looks up every token in its rows);
* the final norm runs on the hidden states as the blocks' norms do (whole; a sequence shard under sequence
  parallelism). The output layer is a ``ColumnParallelLinear`` with ``gather_output=False``
  (megatron/core/models/gpt/gpt_model.py) whose ``LinearWithGradAccumulationAndAsyncCommunication`` saves
  its input (``ctx.save_for_backward(input, weight)``) before all-gathering the sequence under sequence
  parallelism (layers.py): the whole hidden input, or the rank's sequence shard. Its output, the logits, is
  the rank's ``v / t`` of the vocabulary for the whole sequence; the vocabulary-parallel cross-entropy
  (megatron/core/tensor_parallel/cross_entropy.py) casts them to fp32 (``.float()``) and saves the softmax
  of its share (``ctx.save_for_backward(exp_logits, target_mask, masked_target_1d)``), ``4 s b v / t``.

So for these layers: the tensors the head computes from its output layer (``Layer.logit_activation_bytes``:
whatever of the loss the model graph includes) and the fp32 softmax ``/ t``; integer tensors
(``Layer.integer_activation_bytes``) whole; the rest, hidden-sized (norm inputs, the output layer's input,
dropout masks), whole without sequence parallelism and ``/ t`` with it. For a GPT at ``w = 2``: embedding
``s b (h d + 8)`` without sequence parallelism (the mask and int64 indices), ``s b (h d / t + 8)`` with it;
head ``s b (2 w h + 4 v / t)`` and ``s b (2 w h + 4 v) / t``. The per-token masks and targets of the
vocabulary split (the lookup's out-of-range mask, the loss's target mask and masked targets: 10 bytes per
token) are not in the model graph and not counted.

Weights, gradients and optimizer states
---------------------------------------
As the runtime keeps them (``planner.runtime.Runtime``), per parameter: weights in the training dtype (``w``;
fp8 training keeps bf16 weights), the gradient buffer at ``runtime.main_grad_bytes`` (4: Megatron's fp32 main
grads, except for the dtypes in ``runtime.native_grad_dtypes``: Megatron's fp16 gradients stay fp16) or the
weights' width (0); a mixed-precision optimizer (16-bit weights) adds an fp32 master copy (4),
the optimizer's moments (Adam: 2 x 4; SGD with momentum, Adagrad: 4) and, where the gradient buffer is
16-bit, the fp32 copy of the gradient it steps on (4; Megatron's ``main_param.grad``). These reproduce the
table of Megatron-Core's distributed optimizer (docs, "Distributed Optimizer"): fp16 params and grads 20 and
``4 + 16/d`` bytes, bf16 params with fp32 main grads 18 and ``6 + 12/d``, fp32 params and grads 16 and
``8 + 8/d``. ZeRO stage 1 divides the optimizer states by ``dp``, stage 2 also the gradients, stage 3 also
the weights (Rajbhandari et al. 2020, Sec. 5). A runtime with ``fp32_parameters`` (FSDP2's
MixedPrecisionPolicy) keeps fp32 weights that are themselves the master, fp32 gradients and the moments:
Adam 16 bytes, all divided by ``dp`` from ZeRO-2 on (fully_shard shards the parameters there too), plus at
ZeRO-2 the gathered 16-bit copy (``w``) that reshard_after_forward=False keeps from forward to backward.
DeepSpeed keeps the gradients in the weights' dtype and steps on an fp32 copy of them (FP16_Optimizer's flat
fp32 gradient, the ZeRO optimizer's fp32 gradient partition): ``4 + 16/d`` bytes at ZeRO-1 in bf16, 20 unsharded
at ZeRO-0; a bf16 pipeline at ZeRO-0 shards its states as ZeRO-1 does (``Runtime.shards_optimizer_states``);
its ZeRO optimizer also holds contiguous gradient buckets (``Runtime.grad_bucket_buffer_params``), counted in
``other_bytes``.

FP8 weight copies: under fp8 every rank also keeps, beside its bf16 weights, their fp8 copies in both
orientations (rowwise for the forward GEMM, columnwise for the input-gradient GEMM) with the recipe's weight
scales, ``2 (1 + s_w)`` bytes per parameter (:func:`fp8_weight_copy_bytes`): Megatron-Core passes
``is_first_microbatch`` to Transformer Engine's linear layers (megatron/core/extensions/transformer_engine.py),
which "allows caching of the FP8 versions of the weights" across the micro-batches of an iteration
(Transformer Engine ``Linear.forward`` docs). They are counted for every parameter, the embedding and output
layer's too (which stay 16-bit), and sharded with the weights under ZeRO-3. The primary weights stay bf16
(no ``--fp8-param-gather``), the gradients and optimizer states are those of bf16 training.

Fixed overheads: the runtime's CUDA context, GEMM workspaces, NCCL buffers and the caching allocator's reserve
(``Runtime.cuda_context_bytes`` ... ``allocator_reserve_fraction``, each with its source).
"""

from __future__ import annotations

import numpy as np

from planner.cost.schedule import warmup_forwards
from planner.errors import ConfigError
from planner.graph.ir import ACT_BYTES
from planner.hardware.efficiency import DTYPE_BYTES as OPERAND_BYTES
from planner.hardware.fp8 import FP8, base_dtype, scale_bytes, weight_scale_bytes
from planner.runtime import Runtime, get_runtime
from planner.rules import OPTIMIZERS, RECOMPUTE_CHOICES
from planner.types import LayerGraph, MemoryBreakdown

# bytes per element of weights and activations in each training dtype: tf32 is an fp32 format computed on
# tensor cores (fp32 storage); fp8 training keeps 16-bit weights and activations and casts GEMM inputs to fp8
# (Transformer Engine, "Using FP8 with Transformer Engine")
DTYPE_BYTES = {"fp32": 4, "tf32": 4, "bf16": 2, "fp16": 2, "fp8": 2}
FP32_BYTES = 4
DROPOUT_MASK_BYTES = 1  # PyTorch's dropout saves a bool mask (Korthikanti: 1 byte per element)
# optimizer moments per parameter, fp32 (Adam: momentum and variance; SGD momentum; Adagrad's sum of squares)
_MOMENT_BYTES = {"adam": 2.0 * FP32_BYTES, "sgd": float(FP32_BYTES), "adagrad": float(FP32_BYTES)}


def dtype_bytes(dtype: str) -> int:
    """Bytes per element of weights and activations in training dtype ``dtype``."""
    try:
        return DTYPE_BYTES[base_dtype(dtype)]
    except KeyError:
        raise ConfigError(f"dtype {dtype!r} is not one of {', '.join(DTYPE_BYTES)}") from None


def gemm_input_bytes(dtype: str) -> float:
    """Bytes per element of a GEMM's operands, as Transformer Engine also saves them for the backward (under
    fp8: 1 plus the recipe's scale bytes, else the dtype's width): the operand widths of
    ``planner.hardware.efficiency``."""
    dtype_bytes(dtype)  # validates the name
    return OPERAND_BYTES[base_dtype(dtype)] + scale_bytes(dtype)


def fp8_weight_copy_bytes(dtype: str) -> float:
    """Bytes per parameter of the cached fp8 weight copies (rowwise and columnwise, with the recipe's weight
    scales) under fp8; 0 for the other dtypes (module docstring)."""
    if base_dtype(dtype) != FP8:
        return 0.0
    return 2.0 * (OPERAND_BYTES[FP8] + weight_scale_bytes(dtype))


def activation_scale(dtype: str) -> float:
    """Factor from the importer's float-tensor bytes (``ACT_BYTES`` per element) to ``dtype``'s."""
    return dtype_bytes(dtype) / ACT_BYTES


def check_optimizer(optimizer: str) -> None:
    if optimizer not in OPTIMIZERS:
        raise ConfigError(f"optimizer {optimizer!r} is not one of {', '.join(OPTIMIZERS)}")


def check_recompute(recompute: str) -> None:
    if recompute not in RECOMPUTE_CHOICES:
        raise ConfigError(f"recompute {recompute!r} is not one of {', '.join(RECOMPUTE_CHOICES)}")


def transformer_activation_bytes(seq_len: int, micro_batch: int, hidden: int, heads: int, tp: int = 1,
                                 sequence_parallel: bool = False, recompute: str = "none", *,
                                 ffn: int | None = None, kv_heads: int | None = None, gated_mlp: bool = False,
                                 dropout: bool = True, dtype: str = "bf16", attention: str = "fused-softmax",
                                 head_dim: float = 0, v_head_dim: float = 0) -> float:
    """Bytes one transformer block keeps for its backward pass, per tensor-parallel rank (see the module
    docstring for the derivation). Defaults: Korthikanti's GPT block (ffn = 4h, MHA, GELU, dropout, bf16)
    with the scores in memory."""
    check_recompute(recompute)
    s, b, h, a, t = float(seq_len), float(micro_batch), float(hidden), float(heads), float(tp)
    f = float(ffn if ffn else 4 * hidden)
    d_k = float(head_dim or h / a)
    d_v = float(v_head_dim or d_k)
    a_kv = float(kv_heads or heads)
    w, g = float(dtype_bytes(dtype)), float(gemm_input_bytes(dtype))
    d = float(DROPOUT_MASK_BYTES) if dropout else 0.0
    split_seq = t if sequence_parallel else 1.0
    if recompute == "full":
        return w * s * b * h / split_seq
    replicated = (2.0 * w + 2.0 * g + 2.0 * d) * h
    split = w * (a * d_k + a_kv * (d_k + d_v)) + g * a * d_v + (w * (2.0 if gated_mlp else 1.0) + g) * f
    if attention == "flash":
        scores = FP32_BYTES * a * s * b  # the log-sum-exp statistics; selective recompute has nothing to drop
    elif recompute == "selective":
        scores = 0.0
    else:
        scores = (w + d * (1.0 + w)) * a * s * s * b
    return s * b * replicated / split_seq + (s * b * split + scores) / t


def _fp32_or_native(fp32_bytes: int, dtype: str, rt: Runtime) -> int:
    """``fp32_bytes`` (a runtime's 4 for fp32, or 0) per parameter, or the training dtype's width where it
    is 0 or the runtime keeps ``dtype``'s gradients native."""
    width = dtype_bytes(dtype)
    if not fp32_bytes or base_dtype(dtype) in rt.native_grad_dtypes:
        return width
    return max(width, fp32_bytes)


def gradient_buffer_bytes(dtype: str, runtime: Runtime | str | None = None) -> int:
    """Bytes per parameter of the gradient buffer the optimizer reads (``Runtime.main_grad_bytes``)."""
    rt = get_runtime(runtime)
    return _fp32_or_native(rt.main_grad_bytes, dtype, rt)


def gradient_reduce_bytes(dtype: str, runtime: Runtime | str | None = None) -> int:
    """Bytes per parameter the data-parallel gradient reduction moves (``Runtime.grad_reduce_bytes``)."""
    rt = get_runtime(runtime)
    return _fp32_or_native(rt.grad_reduce_bytes, dtype, rt)


def parameter_bytes(optimizer: str, dtype: str, runtime: Runtime | str | None = None) -> tuple[float, float, float]:
    """(weights, gradients, optimizer states) bytes per parameter, before ZeRO (module docstring). A runtime
    with ``fp32_parameters`` holds fp32 weights that are the optimizer's master: its 16-bit copies are the
    gathered working weights of ``memory_terms``, not a persistent state."""
    check_optimizer(optimizer)
    rt = get_runtime(runtime)
    weights = float(FP32_BYTES if rt.fp32_parameters else dtype_bytes(dtype))
    gradients = float(gradient_buffer_bytes(dtype, rt))
    mixed = weights < FP32_BYTES
    states = _MOMENT_BYTES[optimizer]
    if mixed:
        states += FP32_BYTES  # the fp32 master weights
        if gradients < FP32_BYTES:
            states += FP32_BYTES  # the fp32 copy of the 16-bit gradient the step reads
    return weights, gradients, states


def stage_tied_params(model: LayerGraph, first: int, last: int, tp: int) -> float:
    """Parameters per rank that a stage holding layers ``first..last`` keeps as its own copy of weights an
    earlier stage owns (``Layer.tied_params``: a tied LM head's word embedding). Megatron allocates the output
    layer's weight on the last stage when pp > 1 and keeps it in step with the first stage's by an all-reduce
    of their gradients (megatron/core/models/common/language_module: ``setup_embeddings_and_output_layer``,
    ``shared_embedding_or_output_weight``; megatron/core/distributed/finalize_model_grads.py
    ``_allreduce_word_embedding_grads``): the copy has its gradient and optimizer state like any weight.
    Split over ``tp`` as the vocabulary-parallel embedding is; the all-reduce is
    ``planner.cost.comm.tied_grad_sync_s``."""
    return sum(p for layer in model.layers[first:last + 1] for owner, p in layer.tied_params if owner < first) / tp


def segment_tied_params(model: LayerGraph, tp: int) -> np.ndarray:
    """:func:`stage_tied_params` of every segment ``i..j`` (``[i, j]``, zero below the diagonal)."""
    n = len(model.layers)
    out = np.zeros((n, n))
    for k, layer in enumerate(model.layers):
        for owner, p in layer.tied_params:
            out[owner + 1:k + 1, k:] += p / tp  # segments that start after the owner and reach layer k
    return out


def prefix_tied_params(model: LayerGraph, tp: int) -> np.ndarray:
    """Per prefix ``0..j`` (a first stage), the parameters per rank it owns whose copies a later stage keeps:
    what its side of the tied weights' all-reduce carries."""
    out = np.zeros(len(model.layers))
    for k, layer in enumerate(model.layers):
        for owner, p in layer.tied_params:
            out[owner:k] += p / tp  # prefixes that hold the owner but not layer k
    return out


def optimizer_state_bytes_per_param(optimizer: str, dtype: str, runtime: Runtime | str | None = None) -> float:
    return parameter_bytes(optimizer, dtype, runtime)[2]


def fixed_overhead_bytes(runtime: Runtime | str | None = None) -> float:
    """Memory every rank holds besides the model: CUDA context, GEMM workspaces, NCCL buffers."""
    rt = get_runtime(runtime)
    return float(rt.cuda_context_bytes + rt.gemm_workspace_bytes + rt.nccl_buffer_bytes)


def shard_params(params_per_rank, sharded: bool, dp, expert_params_per_rank=0.0, expert_dp=1.0):
    """Parameters whose state a rank keeps (and updates) when that state is ``sharded`` by ZeRO: the dense
    ones over ``dp`` ranks, the routed experts' ``expert_params_per_rank`` over ``expert_dp`` (Megatron-Core's
    distributed optimizer shards the expert buffers over the expert-data-parallel group); all of them
    otherwise. Arguments may be numpy arrays."""
    if not sharded:
        return params_per_rank
    return (params_per_rank - expert_params_per_rank) / dp + expert_params_per_rank / expert_dp


def weights_dtype(dtype: str) -> str:
    """The dtype the weights are kept in: the training dtype's, bf16 under fp8 (module docstring)."""
    base = base_dtype(dtype)
    return "bf16" if base == FP8 else base


def states_sharded(zero: int, pipelined: bool, dtype: str, runtime: Runtime) -> bool:
    """Whether ``runtime`` shards the optimizer states over dp at ZeRO ``zero`` (``pipelined``: pp > 1;
    ``Runtime.shards_optimizer_states``)."""
    return runtime.shards_optimizer_states(zero, pipelined, weights_dtype(dtype))


def grad_bucket_buffer_bytes(zero: int, pipelined: bool, dtype: str, runtime: Runtime) -> float:
    """Bytes of the ZeRO optimizer's contiguous gradient buckets, in the weights' dtype
    (``Runtime.grad_bucket_buffer_params``)."""
    return runtime.grad_bucket_buffer_params(zero, pipelined) * dtype_bytes(dtype)


def memory_terms(params_per_rank, activation_bytes_per_micro_batch, micro_batches_in_flight, zero: int, dp,
                 optimizer: str, dtype: str, transient_bytes=0.0, runtime: Runtime | str | None = None, *,
                 expert_params_per_rank=0.0, expert_dp=1.0, pipelined: bool = False) -> tuple:
    """(weights, gradients, optimizer states, activations, other) bytes per device; the arguments may be
    numpy arrays (one entry per stage or replica group). See ``stage_memory``. ``expert_params_per_rank`` of
    ``params_per_rank`` are routed experts' whose ZeRO shards are over ``expert_dp`` ranks, not ``dp``
    (Megatron-Core's distributed optimizer shards the expert buffers over the expert-data-parallel group).
    ``pipelined``: the plan has pp > 1, where some runtimes keep their state otherwise (``Runtime``)."""
    rt = get_runtime(runtime)
    per_weight, per_gradient, per_state = parameter_bytes(optimizer, dtype, rt)

    def held(per_param: float, sharded: bool):
        return per_param * shard_params(params_per_rank, sharded, dp, expert_params_per_rank, expert_dp)

    deferred = rt.defers_grad_reduce(zero, pipelined)
    if rt.fp32_parameters:
        # fp32 parameters sharded with the gradients; at ZeRO-2 the gathered 16-bit copy stays from forward to
        # backward (at ZeRO-3 it is the per-layer transient the caller adds, unless a pipeline leaves the
        # parameters unsharded after each backward: ``Runtime.pipeline_defers_grad_reduce``)
        working = dtype_bytes(dtype) if (zero == 2 or deferred) and dtype_bytes(dtype) < FP32_BYTES else 0.0
        weights = held(per_weight, zero >= 2) + held(working + fp8_weight_copy_bytes(dtype), zero >= 3 and not deferred)
    else:
        weights = held(per_weight + fp8_weight_copy_bytes(dtype), zero >= 3)
    # a deferred reduction accumulates the whole stage's gradients at the reduction width first
    gradients = (held(float(gradient_reduce_bytes(dtype, rt)), False) if deferred
                 else held(per_gradient, zero >= 2))
    states = held(per_state, states_sharded(zero, pipelined, dtype, rt))
    activations = activation_bytes_per_micro_batch * micro_batches_in_flight
    held_briefly = transient_bytes + grad_bucket_buffer_bytes(zero, pipelined, dtype, rt)
    allocated = weights + gradients + states + activations + held_briefly
    other = held_briefly + rt.allocator_reserve_fraction * allocated + fixed_overhead_bytes(rt)
    return weights, gradients, states, activations, other


def stage_memory(params_per_rank, activation_bytes_per_micro_batch, micro_batches_in_flight, zero: int, dp: int,
                 optimizer: str, dtype: str, transient_bytes=0.0, runtime: Runtime | str | None = None, *,
                 expert_params_per_rank=0.0, expert_dp=1.0, pipelined: bool = False) -> MemoryBreakdown:
    """Bytes per device of a stage whose ranks each hold ``params_per_rank`` parameters.

    ``transient_bytes`` is memory needed only briefly on top of the steady state (the full activations of
    one layer while it is recomputed, a ZeRO-3 gathered layer); it joins ``other_bytes`` with the runtime's
    fixed overheads and allocator reserve. The numeric arguments may be numpy arrays (the search passes a
    matrix of candidate stages); the fields are then arrays too. ``runtime``: the training stack whose state
    layout and overheads apply (None: the default runtime). ``expert_params_per_rank`` of the parameters are
    routed experts' sharded over ``expert_dp`` (``memory_terms``). ``pipelined``: the plan has pp > 1.
    """
    if zero not in (0, 1, 2, 3):
        raise ConfigError(f"zero={zero} is not a ZeRO stage; use 0, 1, 2 or 3")
    if np.any(np.asarray(dp) < 1):
        raise ConfigError(f"dp={dp} must be at least 1")
    terms = memory_terms(params_per_rank, activation_bytes_per_micro_batch,
                         np.maximum(0.0, micro_batches_in_flight), zero, dp, optimizer, dtype, transient_bytes,
                         runtime, expert_params_per_rank=expert_params_per_rank, expert_dp=expert_dp,
                         pipelined=pipelined)
    if all(np.ndim(t) == 0 for t in terms):
        terms = tuple(float(t) for t in terms)
    weights, gradients, states, activations, other = terms
    return MemoryBreakdown(weights_bytes=weights, gradients_bytes=gradients, optimizer_bytes=states,
                           activations_bytes=activations, other_bytes=other)


def micro_batches_in_flight(stage: int, pp: int, num_micro_batches: int, schedule: str, vpp: int = 1,
                            all_forwards_at_pp: bool = False, ep_overlap: bool = False) -> float:
    """Micro-batches whose activations stage ``stage`` holds at its peak, in units of the whole stage's
    activations per micro-batch (a chunk of the interleaved schedule counts ``1/vpp``).

    GPipe holds every micro-batch; 1F1B holds ``min(pp - stage, m)`` (its warm-up plus one); the interleaved
    schedule holds its warm-up (``planner.cost.schedule.interleaved_warmup``, ``all_forwards_at_pp`` the
    runtime's) plus one chunk. Expert-parallel overlap (``ep_overlap``) runs one more warm-up forward, so
    holds one micro-batch (chunk) more (``planner.cost.schedule``).
    """
    m = num_micro_batches
    if schedule == "gpipe":
        return float(m)
    total = m * vpp
    return min(warmup_forwards(stage, pp, m, schedule, vpp, all_forwards_at_pp, ep_overlap) + 1, total) / vpp
