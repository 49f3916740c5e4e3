"""Achieved compute and memory rates of a device: the efficiency curves of its profile.

The cost model calls these for every op of every candidate, so they are plain arithmetic over curve arrays
cached per curve (a curve is a tuple, hence hashable; the profile itself holds a dict and is not).

* ``gemm_efficiency(profile, flops)``: achieved fraction of peak for a GEMM of ``flops`` FLOPs,
  interpolated linearly in log(flops) between the curve's points, clamped at both ends;
  ``gemm_shape_efficiency(profile, m, n, k)`` the same for a GEMM of that shape: the curve (measured on square
  GEMMs, whose sides are multiples of every tile) times the tile quantization of ``m x n``;
* ``matmul_time_s(profile, m, n, k, dtype)``: roofline of one GEMM, max(compute, memory).
* ``memory_time_s(profile, bytes)``: time to stream ``bytes`` through device memory.

Dtypes a device lacks fall back to the nearest format it runs (documented in ``DTYPE_FALLBACK``):
mixed-precision bf16 training runs in fp16 on Volta/Turing, fp8 falls back to 16-bit, tf32 to fp32.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from functools import lru_cache
from typing import Iterable

from planner.errors import ClusterError, ConfigError
from planner.hardware.fp8 import base_dtype
from planner.types import DeviceProfile

DTYPE_FALLBACK: dict[str, tuple[str, ...]] = {
    "fp32": ("fp32",),
    "tf32": ("tf32", "fp32"),
    "bf16": ("bf16", "fp16", "fp32"),
    "fp16": ("fp16", "bf16", "fp32"),
    "fp8": ("fp8", "bf16", "fp16", "fp32"),
}
DTYPE_BYTES: dict[str, int] = {"fp32": 4, "tf32": 4, "bf16": 2, "fp16": 2, "fp8": 1}


DEFAULT_DTYPE = "bf16"


def default_dtype(devices: Iterable[DeviceProfile]) -> str:
    """The training dtype when none is asked for: bf16, or the next format of ``DTYPE_FALLBACK["bf16"]`` that
    every device runs where some device lacks it: fp16 on V100s, T4s and Turing cards (a plan for them must
    say fp16; its Megatron-LM and DeepSpeed exports pass the flag on), fp32 on a device profiled with an fp32
    peak alone (``planner profile --device cpu``). bf16 when no format is common to all of them."""
    profiles = list(devices)
    for dtype in DTYPE_FALLBACK[DEFAULT_DTYPE]:
        if all(p.peak_flops_per_s.get(dtype) for p in profiles):
            return dtype
    return DEFAULT_DTYPE


def resolve_dtype(devices: Iterable[DeviceProfile], dtype: str | None) -> str:
    """The training dtype of a plan. Left out (``None``): :func:`default_dtype`. Asked for: every device must
    have a peak for it, else ConfigError naming the devices and the dtypes all of them run."""
    profiles = list(devices)
    if dtype is None:
        return default_dtype(profiles)
    if dtype not in DTYPE_FALLBACK:
        raise ConfigError(f"dtype {dtype!r} is not one of {', '.join(DTYPE_FALLBACK)}")
    lacking = sorted({p.name for p in profiles if not p.peak_flops_per_s.get(dtype)})
    if lacking:
        common = [d for d in DTYPE_FALLBACK if all(p.peak_flops_per_s.get(d) for p in profiles)]
        raise ConfigError(f"dtype {dtype}: {', '.join(lacking)} cannot run it (no {dtype} peak in its device "
                          f"profile); use --dtype {' or '.join(common) or 'fp32'}, or a cluster without "
                          f"{'those devices' if len(lacking) > 1 else 'that device'} for {dtype}")
    return dtype


@lru_cache(maxsize=4096)
def _log_curve(points: tuple[tuple[float, float], ...]) -> tuple[tuple[float, ...], tuple[float, ...]]:
    xs = tuple(math.log(max(x, 1e-30)) for x, _ in points)
    ys = tuple(y for _, y in points)
    return xs, ys


def interpolate_log(points: tuple[tuple[float, float], ...], x: float) -> float:
    """Piecewise-linear interpolation of ``points`` (sorted by x) in log(x), clamped at the ends."""
    if len(points) == 1:
        return points[0][1]
    xs, ys = _log_curve(points)
    lx = math.log(x) if x > 0 else xs[0]
    if lx <= xs[0]:
        return ys[0]
    if lx >= xs[-1]:
        return ys[-1]
    i = bisect_right(xs, lx)
    x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
    return y0 + (y1 - y0) * (lx - x0) / (x1 - x0)


def peak_flops_per_s(profile: DeviceProfile, dtype: str = "bf16") -> float:
    """Dense peak for ``dtype`` (a cost-model key such as ``fp8:mxfp8`` counts as its training dtype,
    ``planner.hardware.fp8``), or for the nearest format the device runs (see DTYPE_FALLBACK)."""
    dtype = base_dtype(dtype)
    for candidate in DTYPE_FALLBACK.get(dtype, (dtype,)):
        value = profile.peak_flops_per_s.get(candidate)
        if value:
            return value
    raise ClusterError(f"device {profile.name!r} has no peak FLOP/s for {dtype!r} (it lists "
                       f"{', '.join(sorted(profile.peak_flops_per_s))}); add it to the device profile")


def gemm_efficiency(profile: DeviceProfile, flops: float) -> float:
    return interpolate_log(profile.gemm_efficiency, flops)


# The output tile granularity of tensor-core GEMM kernels: cuBLAS and CUTLASS tile the m x n output in
# thread-block tiles of 256x128, 128x128, 128x64 or 64x64 and pick the one that wastes least (NVIDIA Deep
# Learning Performance Guide, "Matrix Multiplication Background", Sec. 2.3 and 3.1 "Tile Quantization"); a
# dimension that is not a multiple of the smallest, 64, leaves part of its last tile idle.
GEMM_TILE = 64


def tile_quantization(m: float, n: float, tile: int = GEMM_TILE) -> float:
    """Fraction of the issued output tiles' work that is useful: ``m n / (ceil(m/T) T ceil(n/T) T)``."""
    if m <= 0 or n <= 0:
        return 1.0
    return (m * n) / (math.ceil(m / tile) * tile * math.ceil(n / tile) * tile)


def gemm_shape_efficiency(profile: DeviceProfile, m: float, n: float, k: float) -> float:
    """Achieved fraction of peak of an (m x k) @ (k x n) GEMM: the profile's curve at its FLOPs (how well a
    GEMM of that size fills the device) times its tile quantization."""
    return gemm_efficiency(profile, 2.0 * m * n * k) * tile_quantization(m, n)


# FlashAttention-2's measured fraction of the A100's tensor-core peak (Dao 2023, "FlashAttention-2: Faster
# Attention with Better Parallelism and Work Partitioning", Sec. 4.1: up to 73% forward and 63% backward, at
# head dimension 128); taken as device independent. Its backward pass does 2.5x the forward's FLOPs (it
# recomputes Q K^T and runs four more products: Sec. 4.1's FLOP count, 2.5 x 4 s^2 d per head).
FLASH_FORWARD_EFFICIENCY = 0.73
FLASH_BACKWARD_EFFICIENCY = 0.63
FLASH_BACKWARD_FLOPS_RATIO = 2.5
# Under a causal mask FlashAttention skips the key blocks wholly above the diagonal (Sec. 3.1.1, "Causal
# masking"): of n x n blocks it computes n (n + 1) / 2, with n = ceil(s / FLASH_BLOCK) and the kernel's key
# block of 128 (flash-attn's kBlockN for head dimensions up to 128)
FLASH_BLOCK = 128


def flash_efficiency(profile: DeviceProfile) -> tuple[float, float]:
    """(forward, backward) achieved fraction of peak of FlashAttention on ``profile``: its own measured
    figures where the profile has them, else FlashAttention-2's on A100."""
    if profile.flash_attention_efficiency:
        forward, backward = profile.flash_attention_efficiency
        return forward, backward
    return FLASH_FORWARD_EFFICIENCY, FLASH_BACKWARD_EFFICIENCY


def flash_causal_fraction(seq_len: int) -> float:
    """Fraction of the s x s score blocks FlashAttention computes under a causal mask: (n + 1) / (2 n)."""
    n = max(1, math.ceil(seq_len / FLASH_BLOCK))
    return (n + 1) / (2 * n)


def memory_efficiency(profile: DeviceProfile, nbytes: float) -> float:
    if profile.memory_efficiency_curve:
        return interpolate_log(profile.memory_efficiency_curve, nbytes)
    return profile.memory_efficiency


def conv_efficiency(profile: DeviceProfile, flops: float) -> float:
    return interpolate_log(profile.conv_efficiency or profile.gemm_efficiency, flops)


def vector_flops_per_s(profile: DeviceProfile) -> float:
    """Achieved rate of non-GEMM arithmetic: measured where the profile has it, else the fp32 peak."""
    return profile.vector_flops_per_s or peak_flops_per_s(profile, "fp32")


def compute_time_s(profile: DeviceProfile, flops: float, dtype: str = "bf16") -> float:
    """Time of ``flops`` of GEMM-like work at the size-dependent efficiency (no memory term, no overhead)."""
    if flops <= 0:
        return 0.0
    return flops / (peak_flops_per_s(profile, dtype) * gemm_efficiency(profile, flops))


def memory_time_s(profile: DeviceProfile, nbytes: float) -> float:
    """Time to move ``nbytes`` through device memory (no per-op overhead)."""
    if nbytes <= 0:
        return 0.0
    return nbytes / (profile.memory_bandwidth_Bps * memory_efficiency(profile, nbytes))


def matmul_time_s(profile: DeviceProfile, m: int, n: int, k: int, dtype: str = "bf16") -> float:
    """Roofline time of one (m x k) @ (k x n) GEMM: max(compute at the curve's efficiency, operand traffic)."""
    flops = 2.0 * m * n * k
    nbytes = float(m * k + k * n + m * n) * DTYPE_BYTES.get(base_dtype(dtype), 2)
    return max(compute_time_s(profile, flops, dtype), memory_time_s(profile, nbytes))


OP_KINDS = ("gemm", "conv", "vector")


def op_time_s(profile: DeviceProfile, flops: float, nbytes: float, gemm: tuple[int, int, int] | None = None,
              dtype: str = "bf16", kind: str = "gemm") -> float:
    """One op on one device: roofline of its FLOPs and bytes plus the profile's per-op overhead.

    ``kind`` picks the compute rate: ``gemm`` (peak x GEMM curve at the op's own GEMM size ``gemm`` =
    (m, n, k), or at its FLOPs), ``conv`` (peak x the convolution curve), ``vector`` (non-GEMM arithmetic:
    normalisation, softmax, activations)."""
    if flops <= 0:
        compute = 0.0
    elif kind == "vector":
        compute = flops / vector_flops_per_s(profile)
    else:
        size = 2.0 * gemm[0] * gemm[1] * gemm[2] if gemm is not None else flops
        curve = conv_efficiency if kind == "conv" else gemm_efficiency
        compute = flops / (peak_flops_per_s(profile, dtype) * curve(profile, size))
    return max(compute, memory_time_s(profile, nbytes)) + profile.op_overhead_s
