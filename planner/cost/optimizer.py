"""The optimizer step: memory bound, a fixed number of bytes read and written per parameter.

Mixed precision (bf16/fp16 weights, fp32 master weights and states), per parameter:
Adam reads the fp32 master weight, momentum and variance and the 2-byte gradient and writes the three fp32
tensors and the 2-byte working copy: 4*3 + 2 + 4*3 + 2 = 28 bytes. SGD with momentum and Adagrad keep one
state: 4*2 + 2 + 4*2 + 2 = 20 bytes. In fp32 there is no separate working copy (4-byte gradients and weights).
With ZeRO >= 1 each data-parallel rank updates only its ``1/dp`` share.
"""

from __future__ import annotations

from planner.cost.calibration import DeviceCalibration
from planner.cost.memory import check_optimizer
from planner.hardware.efficiency import memory_time_s
from planner.types import DeviceProfile

_BYTES_PER_PARAM_MIXED = {"adam": 28.0, "sgd": 20.0, "adagrad": 20.0}
_BYTES_PER_PARAM_FP32 = {"adam": 24.0, "sgd": 16.0, "adagrad": 16.0}


def optimizer_time_s(params_per_rank: float, profile: DeviceProfile, optimizer: str, zero: int, dp: int,
                     dtype: str = "bf16", calibration: DeviceCalibration | None = None) -> float:
    """Seconds of one optimizer step on one rank holding ``params_per_rank`` parameters."""
    check_optimizer(optimizer)
    table = _BYTES_PER_PARAM_FP32 if dtype == "fp32" else _BYTES_PER_PARAM_MIXED
    params = params_per_rank / dp if zero >= 1 and dp > 1 else params_per_rank
    scale = calibration.memory_scale if calibration is not None else 1.0
    return memory_time_s(profile, params * table[optimizer]) / scale
