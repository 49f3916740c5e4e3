"""Efficiency curves: log-space interpolation, clamping, dtype fallback, roofline."""

from __future__ import annotations

import math

import pytest

from planner.errors import ClusterError
from planner.hardware import efficiency as eff
from planner.types import DeviceProfile

PROFILE = DeviceProfile(name="toy", peak_flops_per_s={"fp32": 10e12, "fp16": 100e12}, memory_bytes=2 ** 34,
                        memory_bandwidth_Bps=1e12, gemm_efficiency=((1e6, 0.1), (1e9, 0.7), (1e12, 0.9)),
                        memory_efficiency=0.8)


def test_interpolates_in_log_space_and_clamps():
    assert eff.gemm_efficiency(PROFILE, 1e6) == pytest.approx(0.1)
    # halfway between 1e6 and 1e9 in log space is ~3.16e7
    assert eff.gemm_efficiency(PROFILE, math.sqrt(1e6 * 1e9)) == pytest.approx(0.4)
    assert eff.gemm_efficiency(PROFILE, 1.0) == pytest.approx(0.1)
    assert eff.gemm_efficiency(PROFILE, 1e15) == pytest.approx(0.9)
    assert eff.gemm_efficiency(PROFILE, 0.0) == pytest.approx(0.1)


def test_dtype_fallback():
    assert eff.peak_flops_per_s(PROFILE, "bf16") == 100e12  # bf16 training runs in fp16 here
    assert eff.peak_flops_per_s(PROFILE, "tf32") == 10e12
    assert eff.peak_flops_per_s(PROFILE, "fp8") == 100e12
    bare = DeviceProfile(name="bare", peak_flops_per_s={"fp16": 1e12}, memory_bytes=1, memory_bandwidth_Bps=1.0)
    with pytest.raises(ClusterError, match="no peak FLOP/s for 'fp32'"):
        eff.peak_flops_per_s(bare, "fp32")


def test_matmul_is_a_roofline():
    # large GEMM: compute-bound. 2*4096^3 flops at 100e12 * 0.9 (curve clamps above 1e12? 1.37e11 -> between)
    m = n = k = 4096
    flops = 2.0 * m * n * k
    expected = flops / (100e12 * eff.gemm_efficiency(PROFILE, flops))
    assert eff.matmul_time_s(PROFILE, m, n, k, "fp16") == pytest.approx(expected)
    # GEMV: memory-bound. (1*k + k*n + n) * 2 bytes at 0.8 TB/s
    t = eff.matmul_time_s(PROFILE, 1, 8192, 8192, "fp16")
    assert t == pytest.approx((8192 + 8192 * 8192 + 8192) * 2 / 0.8e12)


def test_memory_time_and_curve():
    assert eff.memory_time_s(PROFILE, 8e9) == pytest.approx(10e-3)
    assert eff.memory_time_s(PROFILE, 0) == 0.0
    curved = DeviceProfile(name="c", peak_flops_per_s={"fp32": 1e12}, memory_bytes=1, memory_bandwidth_Bps=1e11,
                           memory_efficiency_curve=((1e3, 0.1), (1e6, 1.0)))
    assert eff.memory_time_s(curved, 1e6) == pytest.approx(1e-5)
    assert eff.memory_time_s(curved, 1e3) == pytest.approx(1e3 / 1e10)


def test_op_time_kinds_and_overhead():
    p = DeviceProfile(name="o", peak_flops_per_s={"fp32": 1e12}, memory_bytes=1, memory_bandwidth_Bps=1e12,
                      gemm_efficiency=((1.0, 0.5),), conv_efficiency=((1.0, 0.25),), vector_flops_per_s=1e10,
                      memory_efficiency=1.0, op_overhead_s=1e-6)
    assert eff.op_time_s(p, 1e9, 0, kind="gemm", dtype="fp32") == pytest.approx(2e-3 + 1e-6)
    assert eff.op_time_s(p, 1e9, 0, kind="conv", dtype="fp32") == pytest.approx(4e-3 + 1e-6)
    assert eff.op_time_s(p, 1e9, 0, kind="vector", dtype="fp32") == pytest.approx(0.1 + 1e-6)
    assert eff.op_time_s(p, 0, 1e9, kind="vector") == pytest.approx(1e-3 + 1e-6)


def test_catalog_shapes_are_plausible():
    from planner.hardware import catalog
    a100 = catalog.get_device("a100-80gb")
    big = eff.gemm_efficiency(a100, 2.0 * 8192 ** 3)
    assert 0.75 <= big <= 0.85  # published large-GEMM bf16 fractions on A100
    assert eff.gemm_efficiency(a100, 2.0 * 128 ** 3) < 0.2
