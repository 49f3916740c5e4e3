"""Per-layer forward/backward times on one device type, with tensor-parallel-sharded shapes.

For each operation of a layer (numbers per sample, scaled by the micro-batch; byte counts rescaled from the
importer's 2-byte floats to the training dtype's width, ``memory.activation_scale``):

* a GEMM (``OpCost.gemm = (m, n, k)``) is sharded by its ``tp_split`` (column: ``n / t``; row: ``k / t``;
  sharded: ``m / t``, the heads of a batched attention product) and timed as
  ``max(FLOPs / (peak(dtype) x efficiency(m, n, k) x gemm_scale), operand bytes / achieved bandwidth)``:
  the peak of the training dtype's tensor-core format (tf32, bf16/fp16, fp8), the profile's efficiency curve
  at the GEMM's FLOPs times its tile quantization (``hardware.efficiency.gemm_shape_efficiency``), operands
  at the GEMM-input width (1 byte under fp8) and the output at the activation width; its backward is the two
  GEMMs ``(m, k, n)`` (input gradient) and ``(k, n, m)`` (weight gradient);
* any other operation is memory bound: ``bytes / (bandwidth x memory efficiency x memory_scale)`` (or FLOP
  bound if that is slower); its backward reads and writes about twice as much (``2x``). Element-wise work
  that tensor parallelism leaves replicated (layer norms, dropout, residual adds) is divided by ``t`` under
  sequence parallelism;
* each kernel takes at least the profile's ``op_overhead_s``: a GPU runs kernels asynchronously while the
  host issues the next, so a kernel shorter than the host's launch time leaves the GPU waiting for the next
  launch (``max(kernel, launch)``); on a device that runs ops synchronously (a CPU profile measured by
  ``planner profile``) the dispatch adds to every op (``kernel + dispatch``).

Attention core (the ops with ``OpCost.role == "attention-core"``: Q·Kᵀ, scale, mask, softmax, its dropout,
probabilities·V), by the runtime's kernel (``Runtime.attention``):

* ``unfused``: every operation a kernel of its own, as the ONNX graph is written;
* ``fused-softmax``: scale, mask and softmax one kernel (Megatron-LM's ``FusedScaleMaskSoftmax``) that reads
  the scores once and writes the probabilities once, with the FLOPs of the three; dropout and the two
  products stay separate;
* ``flash``: one kernel (FlashAttention-2) doing the two products' FLOPs at FlashAttention-2's measured
  fraction of peak, the scores never leaving the chip (its memory term is Q, K, V and the output); its
  backward does 2.5x the FLOPs at the backward fraction; under a causal mask only the score blocks on and
  below the diagonal are computed (``hardware.efficiency.FLASH_*``, ``flash_causal_fraction``).

FP8 (``dtype`` ``fp8``, any recipe of ``planner.hardware.fp8``): the GEMMs of the linear layers run at the
fp8 peak with the device's GEMM curve, their operands at 1 byte plus the recipe's scales. Everything else
stays in bf16 as Transformer Engine and Megatron-Core run it: the attention core (Transformer Engine's
recipes default to ``fp8_dpa=False``: DotProductAttention computes in the 16-bit dtype), the output layer
(Megatron-Core's ``output_layer`` is a ``tensor_parallel.ColumnParallelLinear``, not a Transformer Engine
module) and every non-GEMM op. Each fp8 GEMM adds its casts, each a memory-bound kernel of its own: in the
forward pass the input ``m x k`` is read at 2 bytes and written as fp8 in both orientations (rowwise for this
GEMM, columnwise for the weight gradient: Transformer Engine's cast-transpose), ``m k (2 + 2 (1 + s))`` bytes;
in the backward pass the output gradient ``m x n`` likewise, ``m n (2 + 2 (1 + s))``. Transformer Engine
fuses some of these casts into the layer norm or activation before the GEMM; they are counted as if not fused.
The weights' casts happen once per iteration (``planner.cost.optimizer``).

Tensor-parallel communication (Megatron-LM): every row-parallel GEMM's output is all-reduced in the forward
pass and the matching input gradient in the backward pass (with sequence parallelism: a reduce-scatter plus
an all-gather each, the same bytes); a layer with column-parallel GEMMs but no row-parallel one (the output
head) all-reduces its input gradient once. Messages are at the activation width of the training dtype.

Recompute: ``selective`` is what the runtime's selective recompute re-runs (``Runtime.selective_recompute``).
Megatron-LM's (``--recompute-granularity selective``; Korthikanti et al. 2022, Sec. 5) re-runs the attention
core before the backward pass, found by role, never by tensor size; under FlashAttention there is nothing
left to recompute (no score tensor is kept), so it costs what ``none`` does. Torchtitan's per-op selective
checkpointing of each transformer block (``alternate_gemm_reruns``) re-runs every second linear-layer product,
the routed experts' products, every element-wise op and the forward's all-gathers (or all-reduces), and keeps
the outputs of the other products, of the attention kernel and of the reduce-scatters (memory:
``_alternate_gemm_saved_bytes``).
``full`` re-runs the whole forward pass, communication included, of every layer but the embedding and the
output head: the runtimes checkpoint the transformer layers only (Megatron-Core's TransformerBlock
``_checkpointed_forward`` over its layers, the embedding and output layer outside it; Megatron-LM v2.5
ParallelTransformer likewise; torchtitan wraps each TransformerBlock), so those two keep their activations.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from planner.cost.calibration import DeviceCalibration, calibration_for
from planner.cost.comm import tp_collective_time_s
from planner.cost.moe import (ExpertParallel, dispatch_buffer_bytes, expert_gemm_s, expert_params_per_rank,
                              merged_layer_s, moe_comm_s)
from planner.cost.memory import (FP32_BYTES, activation_scale, check_recompute, dtype_bytes, gemm_input_bytes,
                                 transformer_activation_bytes)
from planner.errors import ConfigError
from planner.graph.ir import ACT_BYTES
from planner.graph.moe import ROUTED_EXPERT
from planner.graph.transformer import ATTENTION_CORE
from planner.hardware.efficiency import (FLASH_BACKWARD_FLOPS_RATIO, flash_causal_fraction, flash_efficiency,
                                         gemm_shape_efficiency, memory_time_s, peak_flops_per_s)
from planner.hardware.fp8 import FP8, HIGH_PRECISION, base_dtype
from planner.runtime import Runtime, get_runtime
from planner.hardware.collectives import CommGroup
from planner.types import DeviceProfile, Layer, LayerGraph, NodeProfile, OpCost


@dataclass(frozen=True, eq=False)
class LayerCosts:
    """Per-layer costs of one micro-batch on one tensor-parallel rank (arrays of ``len(model.layers)``).

    ``forward_s`` and ``backward_s`` include tensor-parallel communication; ``backward_s`` includes the
    recomputation. ``activation_bytes`` is what a layer holds per micro-batch in flight; ``peak_extra_bytes``
    the extra it needs briefly while it is recomputed (full recompute). ``output_bytes`` is the boundary
    tensor each tensor-parallel rank sends to the next stage per micro-batch (its 1/tp share under sequence
    parallelism or the runtime's scatter-gather, else the whole tensor).
    """

    forward_s: np.ndarray
    backward_s: np.ndarray
    tp_comm_s: np.ndarray  # forward + backward (+ recomputed forward) tensor-parallel communication
    recompute_s: np.ndarray
    activation_bytes: np.ndarray
    peak_extra_bytes: np.ndarray
    params_per_rank: np.ndarray
    output_bytes: np.ndarray
    # the attention core's own kernel time (forward, backward), what a context-parallel ring step hides its
    # K/V transfer behind (planner.cost.context); 0 for layers without attention
    attention_kernel_forward_s: np.ndarray
    attention_kernel_backward_s: np.ndarray
    # forward + backward (+ recomputed forward) expert-parallel all-to-alls and expert-tp gathers (planner.cost.moe)
    ep_comm_s: np.ndarray | None = None
    expert_params_per_rank: np.ndarray | None = None  # the routed experts' part of params_per_rank
    # the forward of one micro-batch and the backward of another run as one merged step (Megatron-Core's
    # expert-parallel overlap, planner.cost.moe.merged_layer_s); forward_s + backward_s where the layer has no
    # expert communication to overlap
    merged_s: np.ndarray | None = None


ASYNC_VENDORS = ("nvidia", "amd")  # devices whose kernels queue on a stream while the host launches more


def _kernel_time_s(profile: DeviceProfile, busy_s: float) -> float:
    """One kernel's time given its roofline time: the launch floor (module docstring)."""
    if profile.vendor in ASYNC_VENDORS:
        return max(busy_s, profile.op_overhead_s)
    return busy_s + profile.op_overhead_s


def _gemm_time_s(profile: DeviceProfile, m: float, n: float, k: float, dtype: str, cal: DeviceCalibration) -> float:
    flops = 2.0 * m * n * k
    if flops <= 0:
        return 0.0
    peak = peak_flops_per_s(profile, dtype)
    efficiency = min(1.0, gemm_shape_efficiency(profile, m, n, k) * cal.gemm_scale)
    traffic = (m * k + k * n) * gemm_input_bytes(dtype) + m * n * dtype_bytes(dtype)
    return _kernel_time_s(profile, max(flops / (peak * efficiency), memory_time_s(profile, traffic) / cal.memory_scale))


def _cast_time_s(profile: DeviceProfile, elements: float, dtype: str, cal: DeviceCalibration) -> float:
    """One fp8 cast-transpose kernel of ``elements`` 16-bit values (module docstring)."""
    traffic = elements * (dtype_bytes(dtype) + 2.0 * gemm_input_bytes(dtype))
    return _kernel_time_s(profile, memory_time_s(profile, traffic) / cal.memory_scale)


def _elementwise_time_s(profile: DeviceProfile, flops: float, traffic_bytes: float, cal: DeviceCalibration) -> float:
    if traffic_bytes <= 0 and flops <= 0:
        return 0.0
    peak = peak_flops_per_s(profile, "fp32")
    return _kernel_time_s(profile, max(memory_time_s(profile, traffic_bytes) / cal.memory_scale, flops / peak))


def attention_core_mask(layer: Layer) -> tuple[bool, ...]:
    """Which of ``layer.ops`` form the attention core: the ops the importer gave that role; for a block
    without roles (built by hand), the two batched activation products (tensor-parallel "sharded" GEMMs) and
    the sharded operations between them."""
    ops = layer.ops
    if any(op.role == ATTENTION_CORE for op in ops):
        return tuple(op.role == ATTENTION_CORE for op in ops)
    if layer.transformer is None:
        return (False,) * len(ops)
    products = [i for i, op in enumerate(ops) if op.gemm is not None and op.tp_split == "sharded"]
    if len(products) < 2:
        return (False,) * len(ops)
    first, last = products[0], products[1]
    return tuple(first <= i <= last and op.tp_split == "sharded" for i, op in enumerate(ops))


def alternate_gemm_reruns(layer: Layer, core: tuple[bool, ...], attention: str) -> tuple[bool, ...]:
    """Which of ``layer.ops`` torchtitan's per-op selective checkpointing re-runs in the backward pass
    (``Runtime.selective_recompute`` "alternate-gemm"): of the linear-layer products (GEMMs outside the
    attention core, in graph order, which is the order the block calls them) the second, fourth, ...; the
    routed experts' grouped products (not among PyTorch's compute-intensive ops); every element-wise op.
    Saved: the other linear products and the attention core's products, which are the FlashAttention kernel
    or batched products (``aten.bmm``); under FlashAttention the core's element-wise ops are inside its
    kernel. Not told apart: a mixture of experts' router product, which torchtitan re-runs and leaves out of
    the count (``force_recompute_mm_shapes_by_fqns``), is counted as a linear product here."""
    reruns = []
    linear = 0
    for op, in_core in zip(layer.ops, core):
        if in_core:
            reruns.append(op.gemm is None and attention != "flash")
        elif op.gemm is None or op.role == ROUTED_EXPERT:
            reruns.append(True)
        else:
            linear += 1
            reruns.append(linear % 2 == 0)
    return tuple(reruns)


@dataclass(frozen=True)
class _OneLayer:
    forward_compute_s: float
    backward_compute_s: float
    selective_forward_s: float  # what selective recompute re-runs (Runtime.selective_recompute)
    tp_forward_s: float
    tp_backward_s: float
    activation_bytes: float
    full_activation_bytes: float
    params_per_rank: float
    output_bytes: float
    attention_kernel_forward_s: float = 0.0
    attention_kernel_backward_s: float = 0.0
    ep_forward_s: float = 0.0
    ep_backward_s: float = 0.0
    expert_params_per_rank: float = 0.0
    selective_tp_s: float = 0.0  # the tensor-parallel collectives it re-runs
    routed_forward_s: float = 0.0  # the routed experts' part of forward_compute_s
    routed_backward_s: float = 0.0  # and of backward_compute_s


def _op_signature(op: OpCost) -> tuple:
    return (op.op_type, op.flops, op.bytes_read, op.bytes_written, op.gemm, op.tp_split, op.role)


def _layer_signature(layer: Layer) -> tuple:
    """What a layer's costs read: two layers with the same signature share one cached ``_one_layer``."""
    return (layer.kind, layer.params, layer.activation_bytes, layer.logit_activation_bytes,
            layer.integer_activation_bytes, layer.input_bytes, layer.output_bytes, layer.flops_forward,
            layer.transformer, layer.moe, tuple(_op_signature(op) for op in layer.ops))


def _shard(m: float, n: float, k: float, split: str, tp: int) -> tuple[float, float, float]:
    if split == "column":
        return m, n / tp, k
    if split == "row":
        return m, n, k / tp
    if split == "sharded":
        return m / tp, n, k
    return m, n, k


def _flash_times_s(profile: DeviceProfile, products: list[tuple[float, float, float]], dtype: str,
                   cal: DeviceCalibration, causal_seq_len: int = 0) -> tuple[float, float]:
    """(forward, backward) seconds of one FlashAttention-2 kernel doing ``products`` (the sharded (m, n, k)
    of Q·Kᵀ and P·V): FLOPs at FlashAttention-2's fractions of peak (only the blocks on and below the
    diagonal under a causal mask over ``causal_seq_len`` keys), traffic Q, K, V and O (forward) plus dO, dQ,
    dK, dV (backward), each ``m x k`` of the Q·Kᵀ product at the activation width."""
    flops = sum(2.0 * m * n * k for m, n, k in products)
    if causal_seq_len:
        flops *= flash_causal_fraction(causal_seq_len)
    m, _, k = products[0]
    tensor = m * k * dtype_bytes(dtype)
    peak = peak_flops_per_s(profile, dtype)
    efficiency_forward, efficiency_backward = flash_efficiency(profile)
    forward = max(flops / (peak * efficiency_forward), memory_time_s(profile, 4.0 * tensor) / cal.memory_scale)
    backward = max(FLASH_BACKWARD_FLOPS_RATIO * flops / (peak * efficiency_backward),
                   memory_time_s(profile, 8.0 * tensor) / cal.memory_scale)
    return _kernel_time_s(profile, forward), _kernel_time_s(profile, backward)


def _costs_of_ops(layer: Layer, node: NodeProfile, tp: int, mb: float, sp: bool, dtype: str,
                  cal: DeviceCalibration, attention: str,
                  par: ExpertParallel | None = None
                  ) -> tuple[float, float, float, float, float, float, float, float, float]:
    """(forward compute, backward compute, attention-core forward, tp forward comm, tp backward comm,
    attention-core backward, forward compute per-op selective checkpointing re-runs, the routed experts'
    forward and backward compute, parts of the first two). A routed expert's
    MatMul (``par`` given) is a grouped GEMM on the rank's experts, and its output is combined by the expert
    communication of ``planner.cost.moe``, not a tensor-parallel all-reduce. A layer without operator detail
    re-runs nothing under per-op checkpointing (which ops it has is unknown)."""
    profile = node.device
    fwd = bwd = core_fwd = core_bwd = rerun_fwd = routed_fwd = routed_bwd = 0.0
    tp_sizes: list[float] = []  # one collective per row-parallel op: its output, the full tensor
    kind = "reduce_scatter+all_gather" if sp else "all_reduce"
    has_row = has_column = False
    first_column_input = 0.0
    scale = activation_scale(dtype)
    width = dtype_bytes(dtype)
    fp8 = base_dtype(dtype) == FP8
    high = HIGH_PRECISION if fp8 else dtype  # the attention core's and output layer's dtype
    ops = layer.ops
    if not ops:  # no operator detail: one GEMM-like block of the layer's FLOPs
        ops = (OpCost(layer.name, "Layer", layer.flops_forward, 0.0, layer.output_bytes,
                      None, "sharded" if tp > 1 else "replicated"),)
    core = attention_core_mask(layer) if layer.ops else (False,)
    reruns = alternate_gemm_reruns(layer, core, attention) if layer.ops else (False,)
    flash_products: list[tuple[float, float, float]] = []
    fused_flops = 0.0  # scale-mask-softmax of the fused kernel, gathered until its softmax
    # a head whose output layer the importer did not mark (built by hand): every GEMM vocabulary-parallel
    unmarked_head = layer.kind == "head" and not any(op.tp_split == "column" for op in ops)
    for op, in_core, rerun in zip(ops, core, reruns):
        split = op.tp_split
        if unmarked_head and op.gemm is not None and split == "replicated":
            split = "column"  # Megatron-LM's vocabulary-parallel output layer
        if op.gemm is not None and par is not None and layer.moe is not None and op.role == ROUTED_EXPERT:
            f, b = expert_gemm_s(op, layer.moe, mb, tp, par,
                                 lambda m, n, k: _gemm_time_s(profile, m, n, k, dtype, cal))
            fwd += f
            bwd += b
            routed_fwd += f
            routed_bwd += b
            rerun_fwd += f if rerun else 0.0
            continue
        if op.gemm is not None:
            m, n, k = _shard(float(op.gemm[0]) * mb, float(op.gemm[1]), float(op.gemm[2]), split, tp)
            if split == "column":
                has_column = True
                if not first_column_input:
                    first_column_input = m * k * width
            elif split == "row":
                has_row = True
                tp_sizes.append(op.bytes_written * mb * scale)
            if in_core and attention == "flash":
                flash_products.append((m, n, k))
                continue
            linear = not in_core and layer.kind != "head"
            g = dtype if linear else high
            f = _gemm_time_s(profile, m, n, k, g, cal)
            b = _gemm_time_s(profile, m, k, n, g, cal) + _gemm_time_s(profile, k, n, m, g, cal)
            if fp8 and linear:
                cast = _cast_time_s(profile, m * k, dtype, cal)
                f += cast
                b += _cast_time_s(profile, m * n, dtype, cal)
                if not rerun:
                    rerun_fwd += cast  # a saved product's fp8 input is an element-wise cast, re-run
        else:
            if in_core and attention == "flash":
                continue  # fused into the FlashAttention kernel, scores kept on chip
            shard = tp if split in ("column", "row", "sharded") or (sp and layer.kind == "block") else 1
            if split == "row":
                has_row = True
                tp_sizes.append(op.bytes_written * mb * scale)
            flops = op.flops * mb / shard
            traffic = (op.bytes_read + op.bytes_written) * mb / shard * scale
            if in_core and attention == "fused-softmax":
                if op.op_type != "Softmax":
                    fused_flops += flops  # scale and mask: inside the fused softmax kernel
                    continue
                flops += fused_flops
                fused_flops = 0.0
            f = _elementwise_time_s(profile, flops, traffic, cal)
            b = 2.0 * f
        fwd += f
        bwd += b
        rerun_fwd += f if rerun else 0.0
        if in_core:
            core_fwd += f
            core_bwd += b
    if flash_products:
        dims = layer.transformer
        f, b = _flash_times_s(profile, flash_products, high, cal,
                              dims.seq_len if dims is not None and dims.causal else 0)
        fwd += f
        bwd += b
        core_fwd += f
        core_bwd += b
    tp_fwd = tp_bwd = 0.0
    if tp > 1:
        # each collective is its own call and pays its own latency: forward, one per row-parallel op (the
        # vocabulary-parallel lookup's all-reduce on an embedding); backward, the input gradient of each
        # column-parallel op that opens a row-parallel pair (of the first one, without a row-parallel op)
        if layer.kind == "embedding":
            forward = tp_sizes or [layer.output_bytes * mb * scale]
            backward: list[float] = []
        else:
            forward = tp_sizes
            backward = tp_sizes if has_row else ([first_column_input] if has_column else [])
        tp_fwd = sum(tp_collective_time_s(kind, size, node, tp, cal) for size in forward if size)
        tp_bwd = tp_fwd if backward is forward else \
            sum(tp_collective_time_s(kind, size, node, tp, cal) for size in backward if size)
    return fwd, bwd, core_fwd, tp_fwd, tp_bwd, core_bwd, rerun_fwd, routed_fwd, routed_bwd


def _tp_sharded_params(layer: Layer, tp: int) -> float:
    if tp == 1:
        return float(layer.params)
    splits = any(op.tp_split in ("column", "row") for op in layer.ops) or layer.kind in ("block", "embedding", "head")
    return layer.params / tp if splits else float(layer.params)


def recomputed(layer: Layer) -> bool:
    """Whether full recompute re-runs ``layer``: every layer but the embedding and the output head (module
    docstring)."""
    return layer.kind not in ("embedding", "head")


def _alternate_gemm_saved_bytes(layer: Layer, tp: int, mb: float, sp: bool, dtype: str, attention: str) -> float:
    """Bytes a transformer block keeps per micro-batch on one rank under torchtitan's per-op selective
    checkpointing (``alternate_gemm_reruns``): the checkpoint's input, and the outputs of the ops it saves,
    each at its size on one rank: a column-parallel product's 1/tp, a row-parallel product's partial sums
    whole plus, under sequence parallelism, the 1/tp its reduce-scatter returns (also saved); the attention
    core's products (1/tp of the heads), under FlashAttention only the kernel's output and its fp32
    log-sum-exp statistics (``memory.transformer_activation_bytes``)."""
    scale = activation_scale(dtype) * mb
    held = layer.input_bytes * scale / (tp if sp else 1)
    core = attention_core_mask(layer)
    reruns = alternate_gemm_reruns(layer, core, attention)
    products = [i for i, in_core in enumerate(core) if in_core and layer.ops[i].gemm is not None]
    for i, (op, in_core, rerun) in enumerate(zip(layer.ops, core, reruns)):
        if rerun or op.gemm is None or (in_core and attention == "flash" and i != products[-1]):
            continue
        if in_core or op.tp_split in ("column", "sharded"):
            held += op.bytes_written * scale / tp
        else:
            held += op.bytes_written * scale * (1.0 + (1.0 / tp if sp and op.tp_split == "row" else 0.0))
    dims = layer.transformer
    if attention == "flash" and products and dims is not None:
        held += FP32_BYTES * dims.heads * dims.seq_len * mb / tp
    return held


def _activation_bytes(layer: Layer, tp: int, mb: float, sp: bool, recompute: str, dtype: str,
                      attention: str, routed_load: float = 1.0,
                      selective: str = "attention-core") -> tuple[float, float]:
    """(held per micro-batch, held with no recompute) for one layer on one rank; ``routed_load``: the rows a
    mixture-of-experts rank routes through its experts over the mean (``ExpertParallel.load``), which widen
    the routed share of the MLP's saved intermediates as they lengthen its GEMMs and dispatch buffer.

    A transformer block counts the tensors of ``memory.transformer_activation_bytes``. Any other layer counts
    the tensors the importer found it saving, each at its size on one rank: for an embedding or a head
    (vocabulary-parallel in Megatron-Core) the output layer's logits and what the head computes from them
    (``Layer.logit_activation_bytes``, plus the loss's fp32 softmax) divided by ``tp``, the integer tensors
    (``Layer.integer_activation_bytes``, token indices) whole, and the rest (hidden-sized: norm and GEMM
    inputs, dropout masks) whole, or divided by ``tp`` under sequence parallelism (``memory`` module
    docstring); for any other layer all of it whole, as the importer splits none of its ops (a layer whose
    ops were split by hand, with no record of which saved tensor is which: all of it divided by ``tp``).
    Selective recompute of the "alternate-gemm" kind (``Runtime.selective_recompute``) keeps what
    ``_alternate_gemm_saved_bytes`` counts in a block with operator detail."""
    dims = layer.transformer
    if dims is not None and layer.kind == "block":
        ffn = dims.ffn
        if layer.moe is not None:  # the routed experts' active width, on the busiest rank
            ffn += (routed_load - 1.0) * layer.moe.top_k * layer.moe.expert_ffn
        shape = dict(ffn=ffn, kv_heads=dims.kv_heads, gated_mlp=dims.gated_mlp, dropout=dims.dropout,
                     dtype=dtype, attention=attention, head_dim=dims.key_dim, v_head_dim=dims.value_dim)
        full = transformer_activation_bytes(dims.seq_len, mb, dims.hidden, dims.heads, tp, sp, "none", **shape)
        if recompute == "selective" and selective == "alternate-gemm" and layer.ops:
            return _alternate_gemm_saved_bytes(layer, tp, mb, sp, dtype, attention), full
        held = transformer_activation_bytes(dims.seq_len, mb, dims.hidden, dims.heads, tp, sp, recompute, **shape)
        return held, full
    # the saved tensors by how tensor parallelism splits them (planner.cost.memory, "Activations of the
    # embedding and the output layer"); integer tensors keep their width whatever the training dtype
    scale = activation_scale(dtype)
    logits = layer.logit_activation_bytes * scale
    integers = layer.integer_activation_bytes
    hidden = (layer.activation_bytes - layer.logit_activation_bytes - layer.integer_activation_bytes) * scale
    if layer.kind == "head":
        # the loss keeps its softmax over the logits in fp32 for the backward pass (Megatron-LM's
        # vocab_parallel_cross_entropy saves exp(logits) of the .float() logits; torch's cross_entropy on
        # fp32 logits saves the log-softmax): 4 bytes per logit, split over the vocabulary-parallel ranks
        logits += FP32_BYTES * layer.output_bytes / ACT_BYTES
    if layer.kind in ("embedding", "head"):
        per_rank = logits / tp + hidden / (tp if sp else 1) + integers
    elif any(op.tp_split != "replicated" for op in layer.ops):
        per_rank = (logits + hidden + integers) / tp  # ops split by hand (docstring)
    else:
        per_rank = logits + hidden + integers  # computed whole on every rank (the importer splits no op here)
    full = per_rank * mb
    if recompute == "full" and recomputed(layer):
        boundary = (layer.input_bytes or layer.output_bytes) * activation_scale(dtype) * mb
        return min(full, boundary), full
    return full, full


class _IdentityCache:
    """A bounded cache keyed by the identity of unhashable inputs (profiles hold dicts) plus hashable
    arguments. Each entry keeps its objects alive, so an id cannot be reused while the entry exists."""

    def __init__(self, size: int) -> None:
        self._size = size
        self._entries: dict[tuple, tuple[tuple, object]] = {}

    def get(self, objects: tuple, args: tuple) -> object | None:
        entry = self._entries.get((tuple(map(id, objects)), args))
        if entry is not None and all(a is b for a, b in zip(entry[0], objects)):
            return entry[1]
        return None

    def put(self, objects: tuple, args: tuple, value: object) -> None:
        if len(self._entries) >= self._size:
            self._entries.clear()
        self._entries[(tuple(map(id, objects)), args)] = (objects, value)


_ONE_LAYER_CACHE = _IdentityCache(65536)
_LAYER_COSTS_CACHE = _IdentityCache(1024)


_SIGNATURES_CACHE = _IdentityCache(64)


_SIGNATURE_IDS: dict[tuple, int] = {}  # a small number per distinct layer signature (cheap to hash)


def _signatures(model: LayerGraph) -> tuple[int, ...]:
    """Every layer's signature, as its number in ``_SIGNATURE_IDS``, computed once per model object."""
    hit = _SIGNATURES_CACHE.get((model,), ())
    if hit is None:
        hit = tuple(_SIGNATURE_IDS.setdefault(_layer_signature(layer), len(_SIGNATURE_IDS))
                    for layer in model.layers)
        _SIGNATURES_CACHE.put((model,), (), hit)
    return hit  # type: ignore[return-value]


def attention_kernel(runtime: Runtime, device: DeviceProfile) -> str:
    """The attention kernel ``runtime`` runs on ``device``: its own, except that FlashAttention falls back to
    the fused softmax (scores in memory) on devices it does not run on."""
    if runtime.attention == "flash" and not device.flash_attention:
        return "fused-softmax"
    return runtime.attention


def _one_layer(layer: Layer, node: NodeProfile, tp: int, mb: float, recompute: str, sp: bool, dtype: str,
               cal: DeviceCalibration, runtime: Runtime, signature: int | None = None,
               experts: ExpertParallel | None = None) -> _OneLayer:
    """One layer's costs, cached by the layer's signature (its numbers, not its name): a model's repeated
    blocks are computed once. ``experts``: how a mixture-of-experts layer's experts are split
    (``planner.cost.moe``; None: over the tensor-parallel group, ep 1)."""
    if signature is None:
        signature = _SIGNATURE_IDS.setdefault(_layer_signature(layer), len(_SIGNATURE_IDS))
    par = None
    if layer.moe is not None:
        par = experts if experts is not None else ExpertParallel(1, tp, None, runtime.moe_load_imbalance)
    args = (signature, tp, mb, recompute, sp, dtype, cal, runtime, par)
    hit = _ONE_LAYER_CACHE.get((node,), args)
    if hit is not None:
        return hit  # type: ignore[return-value]
    attention = attention_kernel(runtime, node.device)
    fwd, bwd, core, tp_fwd, tp_bwd, core_bwd, rerun_fwd, routed_fwd, routed_bwd = _costs_of_ops(
        layer, node, tp, mb, sp, dtype, cal, attention, par)
    kernel_fwd = core
    if attention == "flash":
        core = 0.0  # FlashAttention keeps no score tensor: selective recompute has nothing to re-run
    held, full = _activation_bytes(layer, tp, mb, sp, recompute, dtype, attention, par.load if par else 1.0,
                                   runtime.selective_recompute)
    selective_s, selective_tp_s = core, 0.0
    if runtime.selective_recompute == "alternate-gemm":
        # the forward's reduce-scatters are saved, its all-gathers (half of each pair, the same bytes) and
        # all-reduces re-run; torchtitan checkpoints the transformer blocks only
        selective_s, selective_tp_s = ((rerun_fwd, tp_fwd / 2.0 if sp else tp_fwd) if recomputed(layer)
                                       else (0.0, 0.0))
    # the boundary tensor at the dtype's width, as each tensor-parallel rank sends it to the next stage: its
    # sequence shard under sequence parallelism or Megatron-LM's scatter-gather, else the whole tensor
    # (Megatron-Core's get_tensor_shapes divides the sequence by tp only with sequence_parallel)
    split = tp if sp or runtime.p2p_scatter_gather else 1
    output = layer.output_bytes * activation_scale(dtype) * mb / split
    params = _tp_sharded_params(layer, tp)
    ep_fwd = ep_bwd = expert_params = 0.0
    if par is not None:
        ep_fwd, ep_bwd = moe_comm_s(layer, node, mb, tp, dtype, par, cal)
        buffers = dispatch_buffer_bytes(layer, mb, tp, dtype, par)
        full += buffers
        if recompute != "full":
            held += buffers
        expert_params = expert_params_per_rank(layer, par)
        dense_share = 1.0 - layer.moe.expert_params / layer.params if layer.params else 1.0
        params = params * dense_share + expert_params
    result = _OneLayer(fwd, bwd, selective_s, tp_fwd, tp_bwd, held, full, params, output, kernel_fwd, core_bwd,
                       ep_fwd, ep_bwd, expert_params, selective_tp_s, routed_fwd, routed_bwd)
    _ONE_LAYER_CACHE.put((node,), args, result)
    return result


def _layer_costs(model: LayerGraph, node: NodeProfile, tp: int, micro_batch: int, recompute: str,
                 sequence_parallel: bool, dtype: str, cal: DeviceCalibration, runtime: Runtime,
                 cp: int = 1, experts: ExpertParallel | None = None) -> LayerCosts:
    # a context-parallel rank runs every token-wise op on its 1/cp of each sequence, and its queries against
    # every key (planner.cost.context): the per-sample costs, which are linear in the tokens of the Q side,
    # at micro_batch / cp samples
    tokens = micro_batch / cp if cp > 1 else micro_batch
    rows = [_one_layer(layer, node, tp, tokens, recompute, sequence_parallel, dtype, cal, runtime, signature,
                       experts)
            for layer, signature in zip(model.layers, _signatures(model))]
    n = len(rows)
    forward = np.empty(n)
    backward = np.empty(n)
    tp_comm = np.empty(n)
    recompute_s = np.empty(n)
    held = np.empty(n)
    extra = np.empty(n)
    params = np.empty(n)
    output = np.empty(n)
    kernel_forward = np.array([r.attention_kernel_forward_s for r in rows])
    kernel_backward = np.array([r.attention_kernel_backward_s for r in rows])
    ep_comm = np.empty(n)
    expert_params = np.empty(n)
    merged = np.empty(n)
    for i, (layer, r) in enumerate(zip(model.layers, rows)):
        rerun = recompute == "full" and recomputed(layer)
        if rerun:
            redo = r.forward_compute_s + r.tp_forward_s + r.ep_forward_s
        elif recompute == "selective":
            redo = r.selective_forward_s + r.selective_tp_s
        else:
            redo = 0.0
        forward[i] = r.forward_compute_s + r.tp_forward_s + r.ep_forward_s
        backward[i] = r.backward_compute_s + r.tp_backward_s + r.ep_backward_s + redo
        tp_comm[i] = r.tp_forward_s + r.tp_backward_s + (r.tp_forward_s if rerun else 0.0) \
            + (r.selective_tp_s if recompute == "selective" else 0.0)
        ep_comm[i] = r.ep_forward_s + r.ep_backward_s + (r.ep_forward_s if rerun else 0.0)
        merged[i] = forward[i] + backward[i]
        if r.ep_forward_s or r.ep_backward_s:  # the merged step's streams (planner.cost.moe.merged_layer_s)
            merged[i] = merged_layer_s(forward[i] - r.ep_forward_s - r.routed_forward_s, r.routed_forward_s,
                                       r.ep_forward_s, backward[i] - r.ep_backward_s - r.routed_backward_s,
                                       r.routed_backward_s, r.ep_backward_s)
        recompute_s[i] = redo
        held[i] = r.activation_bytes
        extra[i] = max(0.0, r.full_activation_bytes - r.activation_bytes)
        params[i] = r.params_per_rank
        expert_params[i] = r.expert_params_per_rank
        output[i] = r.output_bytes
    arrays = (forward, backward, tp_comm, recompute_s, held, extra, params, output, kernel_forward, kernel_backward,
              ep_comm, expert_params, merged)
    for a in arrays:
        a.flags.writeable = False
    return LayerCosts(*arrays)


def layer_costs(model: LayerGraph, node: NodeProfile, tp: int, micro_batch: int, recompute: str,
                sequence_parallel: bool, dtype: str = "bf16",
                calibration: DeviceCalibration | None = None, runtime: Runtime | str | None = None,
                cp: int = 1, *, ep: int = 1, expert_tp: int = 0, ep_group: CommGroup | None = None) -> LayerCosts:
    """Costs of every layer of ``model`` for one micro-batch on one rank of a ``tp``-way group of ``node``,
    which with ``cp`` > 1 holds 1/cp of every sequence (context parallelism; the K/V exchange between the
    cp ranks is the estimator's, ``planner.cost.context``, as it depends on where the ranks are).

    Cached: the search takes prefix sums of these arrays. ``calibration`` overrides the fitted parameters
    of the node's device type (``benchmarks/calibrate.py`` uses it while fitting); ``runtime`` is the
    training stack (``planner.runtime``; None: the default). Mixture-of-experts layers run their experts
    ``ep``-way expert parallel over ``ep_group`` (its achieved bandwidths), each expert split ``expert_tp``
    ways (0: tp), as ``planner.cost.moe`` describes."""
    if tp < 1:
        raise ConfigError(f"tp={tp} must be at least 1")
    if cp < 1:
        raise ConfigError(f"cp={cp} must be at least 1")
    check_recompute(recompute)
    if micro_batch < 1:
        raise ConfigError(f"micro_batch={micro_batch} must be at least 1")
    dtype_bytes(dtype)  # validates the name
    rt = get_runtime(runtime)
    cal = calibration if calibration is not None else calibration_for(node.device.name, rt.name)
    experts = ExpertParallel(ep, expert_tp or tp, ep_group if ep > 1 else None, rt.moe_load_imbalance)
    args = (tp, micro_batch, recompute, bool(sequence_parallel and tp > 1), dtype, cal, rt, cp, experts)
    hit = _LAYER_COSTS_CACHE.get((model, node), args)
    if hit is None:
        hit = _layer_costs(model, node, *args)
        _LAYER_COSTS_CACHE.put((model, node), args, hit)
    return hit  # type: ignore[return-value]

