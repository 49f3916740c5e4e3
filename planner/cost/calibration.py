"""Per-device-type efficiency parameters fitted to published measured runs (``planner/data/calibration.yaml``).

The cost model is physical (roofline times from the device profile, alpha-beta collectives from the node
profile); these few factors correct what a datasheet cannot know, per device type and never per run:

* ``gemm_scale`` multiplies the profile's GEMM efficiency curve (framework and kernel-fusion losses on
  top of cuBLAS-level efficiency),
* ``memory_scale`` multiplies the achieved memory bandwidth of memory-bound (element-wise) operations,
* ``comm_scale`` multiplies the achieved bandwidth of collectives and point-to-point transfers,
* ``attention_traffic_scale`` multiplies the memory traffic of the attention core (the ``seq^2`` score
  tensors: scale, mask, softmax, dropout and the two batched products): 1 = every operation a separate pass
  over device memory, as the ONNX graph is written; lower = fused kernels (a fused scale-mask-softmax keeps
  about a third; FlashAttention keeps the scores on chip, near 0),
* ``dp_overlap`` is the fraction of the last micro-batch's backward pass during which bucketed
  data-parallel gradient reduction can run hidden.

``benchmarks/calibrate.py --fit`` rewrites the file. A device type without an entry borrows the mean of the
fitted device types' parameters (most of what they correct is the software stack, which a new device type
shares: kernel fusion, framework overheads, overlap), marked ``fitted=False``; with no file at all, the
neutral values below (all 1: the profile and the graph as written, full overlap).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from functools import lru_cache
from pathlib import Path
from typing import Any

import yaml

from planner.errors import ClusterError

CALIBRATION_PATH = Path(__file__).resolve().parent.parent / "data" / "calibration.yaml"


@dataclass(frozen=True)
class DeviceCalibration:
    gemm_scale: float = 1.0
    memory_scale: float = 1.0
    comm_scale: float = 1.0
    attention_traffic_scale: float = 1.0
    dp_overlap: float = 1.0
    fitted: bool = False  # True when read from the calibration file

    def as_dict(self) -> dict[str, float]:
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name != "fitted"}


PARAMETER_NAMES = tuple(f.name for f in fields(DeviceCalibration) if f.name != "fitted")


def _from_mapping(name: str, values: Any, where: str) -> DeviceCalibration:
    if not isinstance(values, dict):
        raise ClusterError(f"{where}: devices.{name} must be a mapping of {', '.join(PARAMETER_NAMES)}")
    unknown = sorted(set(values) - set(PARAMETER_NAMES))
    if unknown:
        raise ClusterError(f"{where}: devices.{name}.{unknown[0]} is not a calibration parameter "
                           f"({', '.join(PARAMETER_NAMES)})")
    kwargs = {}
    for key, value in values.items():
        if not isinstance(value, (int, float)) or value <= 0:
            raise ClusterError(f"{where}: devices.{name}.{key} must be a positive number, got {value!r}")
        kwargs[key] = float(value)
    return DeviceCalibration(**kwargs, fitted=True)


@lru_cache(maxsize=4)
def load_calibrations(path: str = str(CALIBRATION_PATH)) -> dict[str, DeviceCalibration]:
    file = Path(path)
    if not file.exists():
        return {}
    document = yaml.safe_load(file.read_text()) or {}
    devices = document.get("devices", {}) if isinstance(document, dict) else None
    if not isinstance(devices, dict):
        raise ClusterError(f"{path}: expected a mapping 'devices: {{NAME: {{parameter: value}}}}'")
    return {str(name): _from_mapping(str(name), values, path) for name, values in devices.items()}


@lru_cache(maxsize=4)
def _borrowed(path: str = str(CALIBRATION_PATH)) -> DeviceCalibration:
    fitted = list(load_calibrations(path).values())
    if not fitted:
        return DeviceCalibration()
    means = {name: sum(getattr(c, name) for c in fitted) / len(fitted) for name in PARAMETER_NAMES}
    return DeviceCalibration(**means, fitted=False)


def calibration_for(device_name: str) -> DeviceCalibration:
    """The fitted parameters of ``device_name``, or the borrowed mean (``fitted=False``)."""
    return load_calibrations().get(device_name) or _borrowed()
