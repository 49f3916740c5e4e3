"""The optimizer step: memory bound, a fixed number of bytes read and written per parameter.

The bytes follow the state layout of ``planner.cost.memory.parameter_bytes`` (weights ``w``, gradient buffer
``g``, fp32 moments, and for 16-bit weights an fp32 master copy), as a fused multi-tensor optimizer
(Apex/Transformer Engine FusedAdam, ``torch.optim`` foreach) streams them once per step:

* the gradient is read once (``g``); a 16-bit gradient is first copied to fp32 (read ``g``, write 4) and the
  copy read by the step (4) -- Megatron's ``main_param.grad``;
* every fp32 moment is read and written (Adam: 2 x (4 + 4); SGD with momentum and Adagrad: 4 + 4);
* mixed precision: the fp32 master is read and written (4 + 4) and the working weights written (``w``);
  fp32 training updates the weights in place (read and write ``w``).

Megatron-Core's bf16 weights with fp32 main grads, Adam: 4 + 16 + 8 + 2 = 30 bytes per parameter.
Where the states are sharded (ZeRO >= 1, and DeepSpeed's bf16 pipelines at ZeRO-0) each data-parallel rank
updates only its ``1/dp`` share (a routed expert's parameters: its ``1/expert_dp`` share, as the distributed
optimizer shards them over the expert-data-parallel group).

Under fp8 every rank also refreshes the cached fp8 copies of all its weights once per iteration (the first
micro-batch's cast, ``planner.cost.memory.fp8_weight_copy_bytes``): the bf16 weights read (``w``) and the
copies written, whatever the ZeRO stage (each rank casts the weights it computes with).
"""

from __future__ import annotations

from planner.cost.calibration import DeviceCalibration
from planner.cost.memory import (FP32_BYTES, dtype_bytes, fp8_weight_copy_bytes, parameter_bytes, shard_params,
                                 states_sharded)
from planner.hardware.efficiency import memory_time_s
from planner.runtime import Runtime, get_runtime
from planner.types import DeviceProfile


def optimizer_bytes_per_param(optimizer: str, dtype: str, runtime: Runtime | str | None = None) -> float:
    """Bytes one optimizer step moves through device memory per parameter (module docstring)."""
    weights, gradient, states = parameter_bytes(optimizer, dtype, runtime)
    mixed = weights < FP32_BYTES
    moments = states - (FP32_BYTES if mixed else 0.0) - (FP32_BYTES if mixed and gradient < FP32_BYTES else 0.0)
    traffic = gradient + 2.0 * moments
    if mixed and gradient < FP32_BYTES:
        traffic += 2.0 * FP32_BYTES  # the fp32 gradient copy: written, then read by the step
    traffic += 2.0 * FP32_BYTES + weights if mixed else 2.0 * weights
    return traffic


def optimizer_time_s(params_per_rank: float, profile: DeviceProfile, optimizer: str, zero: int, dp: int,
                     dtype: str = "bf16", calibration: DeviceCalibration | None = None,
                     runtime: Runtime | str | None = None, expert_params_per_rank: float = 0.0,
                     expert_dp: float | None = None, pipelined: bool = False) -> float:
    """Seconds of one optimizer step on one rank holding ``params_per_rank`` parameters, of which
    ``expert_params_per_rank`` are routed experts' sharded over ``expert_dp`` ranks (None: ``dp``) where the
    runtime shards the states (ZeRO >= 1; ``pipelined``: pp > 1, ``planner.cost.memory.states_sharded``)."""
    sharded = states_sharded(zero, pipelined, dtype, get_runtime(runtime))
    params = shard_params(params_per_rank, sharded, dp, expert_params_per_rank,
                          dp if expert_dp is None else expert_dp)
    scale = calibration.memory_scale if calibration is not None else 1.0
    copies = fp8_weight_copy_bytes(dtype)
    cast = params_per_rank * (dtype_bytes(dtype) + copies) if copies else 0.0
    return memory_time_s(profile, params * optimizer_bytes_per_param(optimizer, dtype, runtime) + cast) / scale
