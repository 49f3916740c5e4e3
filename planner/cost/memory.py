"""Memory per device: weights, gradients, optimizer states, activations in flight, and a margin.

Activation bytes of a transformer block follow Korthikanti et al. 2022 ("Reducing Activation Recomputation
in Large Transformer Models", Sections 4.1-4.3 and Table 2), with 2-byte activations, 1-byte dropout masks,
sequence length ``s``, micro-batch ``b``, hidden size ``h``, ``a`` heads and tensor-parallel degree ``t``:

==============================  =====================================
no parallelism                  ``s b h (34 + 5 a s / h)``
tensor parallel                 ``s b h (10 + 24 / t + 5 a s / (h t))``
tensor + sequence parallel      ``s b h / t (34 + 5 a s / h)``
selective recompute (+ seq.)    ``s b h (10 + 24 / t)``  (``34 s b h / t`` with sequence parallelism)
full recompute                  ``2 s b h`` (the block's input; ``/ t`` with sequence parallelism)
==============================  =====================================

Weights, gradients and optimizer states follow the ZeRO paper (Rajbhandari et al. 2020, Section 3.1):
mixed precision keeps 2-byte weights and gradients and ``K`` bytes of fp32 optimizer state per parameter
(Adam: master weights, momentum and variance, ``K = 12``; SGD with momentum and Adagrad: master weights and
one state, ``K = 8``). ZeRO stage 1 divides the optimizer states by ``dp``, stage 2 also the gradients,
stage 3 also the weights.
"""

from __future__ import annotations

import numpy as np

from planner.errors import ConfigError
from planner.types import MemoryBreakdown

RECOMPUTE_CHOICES = ("none", "selective", "full")
OPTIMIZERS = ("adam", "sgd", "adagrad")
DTYPE_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4}

# fp32 optimizer-state bytes per parameter beyond the working weights and gradients (ZeRO paper, K).
# In fp32 training there is no separate master copy, so only the states remain.
_OPTIMIZER_STATE_BYTES_MIXED = {"adam": 12.0, "sgd": 8.0, "adagrad": 8.0}
_OPTIMIZER_STATE_BYTES_FP32 = {"adam": 8.0, "sgd": 4.0, "adagrad": 4.0}

# Modelling assumptions, not hardware constants: the PyTorch caching allocator's fragmentation (the
# allocator's reserved-but-unallocated memory, typically 5-15% in Megatron-LM runs; we take 10%), plus a
# fixed reserve for the CUDA context, cuBLAS workspaces and NCCL buffers (~1 GiB on recent drivers).
FRAGMENTATION_FRACTION = 0.10
FIXED_RESERVE_BYTES = float(1 << 30)


def dtype_bytes(dtype: str) -> int:
    try:
        return DTYPE_BYTES[dtype]
    except KeyError:
        raise ConfigError(f"dtype {dtype!r} is not one of {', '.join(DTYPE_BYTES)}") from None


def check_optimizer(optimizer: str) -> None:
    if optimizer not in OPTIMIZERS:
        raise ConfigError(f"optimizer {optimizer!r} is not one of {', '.join(OPTIMIZERS)}")


def check_recompute(recompute: str) -> None:
    if recompute not in RECOMPUTE_CHOICES:
        raise ConfigError(f"recompute {recompute!r} is not one of {', '.join(RECOMPUTE_CHOICES)}")


def transformer_activation_bytes(seq_len: int, micro_batch: int, hidden: int, heads: int, tp: int = 1,
                                 sequence_parallel: bool = False, recompute: str = "none") -> float:
    """Bytes one transformer block keeps for its backward pass, per tensor-parallel rank (Korthikanti)."""
    check_recompute(recompute)
    s, b, h, a, t = float(seq_len), float(micro_batch), float(hidden), float(heads), float(tp)
    sbh = s * b * h
    if recompute == "full":
        return 2.0 * sbh / (t if sequence_parallel else 1.0)
    if recompute == "selective":
        return 34.0 * sbh / t if sequence_parallel else sbh * (10.0 + 24.0 / t)
    if sequence_parallel:
        return sbh / t * (34.0 + 5.0 * a * s / h)
    return sbh * (10.0 + 24.0 / t + 5.0 * a * s / (h * t))


def optimizer_state_bytes_per_param(optimizer: str, dtype: str) -> float:
    check_optimizer(optimizer)
    table = _OPTIMIZER_STATE_BYTES_FP32 if dtype == "fp32" else _OPTIMIZER_STATE_BYTES_MIXED
    return table[optimizer]


def memory_terms(params_per_rank, activation_bytes_per_micro_batch, micro_batches_in_flight, zero: int, dp,
                 optimizer: str, dtype: str, transient_bytes=0.0) -> tuple:
    """(weights, gradients, optimizer states, activations, other) bytes per device; the arguments may be
    numpy arrays (one entry per stage or replica group). See ``stage_memory``."""
    width = dtype_bytes(dtype)
    weights = params_per_rank * width
    gradients = params_per_rank * width
    states = params_per_rank * optimizer_state_bytes_per_param(optimizer, dtype)
    if zero >= 1:
        states = states / dp
    if zero >= 2:
        gradients = gradients / dp
    if zero >= 3:
        weights = weights / dp
    activations = activation_bytes_per_micro_batch * micro_batches_in_flight
    steady = weights + gradients + states + activations + transient_bytes
    other = transient_bytes + FRAGMENTATION_FRACTION * steady + FIXED_RESERVE_BYTES
    return weights, gradients, states, activations, other


def stage_memory(params_per_rank, activation_bytes_per_micro_batch, micro_batches_in_flight, zero: int, dp: int,
                 optimizer: str, dtype: str, transient_bytes=0.0) -> MemoryBreakdown:
    """Bytes per device of a stage whose ranks each hold ``params_per_rank`` parameters.

    ``transient_bytes`` is memory needed only briefly on top of the steady state (the full activations of
    one layer while it is recomputed, a ZeRO-3 gathered layer); it joins ``other_bytes`` with the margin
    (``FRAGMENTATION_FRACTION`` of everything, plus ``FIXED_RESERVE_BYTES``). The numeric arguments may be
    numpy arrays (the search passes a matrix of candidate stages); the fields are then arrays too.
    """
    if zero not in (0, 1, 2, 3):
        raise ConfigError(f"zero={zero} is not a ZeRO stage; use 0, 1, 2 or 3")
    if np.any(np.asarray(dp) < 1):
        raise ConfigError(f"dp={dp} must be at least 1")
    terms = memory_terms(params_per_rank, activation_bytes_per_micro_batch,
                         np.maximum(0.0, micro_batches_in_flight), zero, dp, optimizer, dtype, transient_bytes)
    if all(np.ndim(t) == 0 for t in terms):
        terms = tuple(float(t) for t in terms)
    weights, gradients, states, activations, other = terms
    return MemoryBreakdown(weights_bytes=weights, gradients_bytes=gradients, optimizer_bytes=states,
                           activations_bytes=activations, other_bytes=other)


def micro_batches_in_flight(stage: int, pp: int, num_micro_batches: int, schedule: str, vpp: int = 1) -> float:
    """Micro-batches whose activations stage ``stage`` holds at its peak, in units of the whole stage's
    activations per micro-batch (a chunk of the interleaved schedule counts ``1/vpp``).

    GPipe holds every micro-batch; 1F1B holds ``min(pp - stage, m)`` (its warm-up plus one); Megatron-LM's
    interleaved schedule warms up ``2 (pp - stage - 1) + (vpp - 1) pp`` chunks and then holds one more.
    """
    m = num_micro_batches
    if schedule == "gpipe":
        return float(m)
    if schedule == "1f1b" or vpp == 1:
        return float(min(pp - stage, m))
    total = m * vpp
    warmup = total if m == pp else min(2 * (pp - stage - 1) + (vpp - 1) * pp, total)
    return min(warmup + 1, total) / vpp
