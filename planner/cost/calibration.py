"""Efficiency parameters fitted to published measured runs, per (runtime, device type)
(``planner/data/calibration.yaml``).

The cost model is physical (roofline times from the device profile, alpha-beta collectives from the node
profile, what overlaps from the runtime); these few factors correct what a datasheet cannot know, per
training runtime and device type and never per run:

* ``gemm_scale`` multiplies the profile's GEMM efficiency curve (framework and kernel-fusion losses on
  top of cuBLAS-level efficiency),
* ``memory_scale`` multiplies the achieved memory bandwidth of memory-bound (element-wise) operations,
* ``comm_scale`` multiplies the achieved bandwidth of collectives and point-to-point transfers.

What overlaps with what, and which attention kernel runs, are facts of the runtime (``planner.runtime``),
not fitted here.

``benchmarks/calibrate.py --fit`` rewrites the file, laid out as ``runtimes: {RUNTIME: {DEVICE: {parameter:
value}}}``. A (runtime, device) pair without an entry borrows the mean of the fitted entries of the same
device type, or where it has none, of every fitted entry (most of what the factors correct is kernel-level
efficiency that a new pair shares), marked ``fitted=False``; with no file at all, the neutral values below
(all 1: the profile and the graph as written).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from functools import lru_cache
from pathlib import Path
from typing import Any

from planner.errors import ClusterError
from planner.hardware.documents import load_data
from planner.runtime import DEFAULT_RUNTIME

CALIBRATION_PATH = Path(__file__).resolve().parent.parent / "data" / "calibration.yaml"


@dataclass(frozen=True)
class DeviceCalibration:
    gemm_scale: float = 1.0
    memory_scale: float = 1.0
    comm_scale: float = 1.0
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
        if not isinstance(value, (int, float)) or isinstance(value, bool) or not 0 < value < math.inf:
            raise ClusterError(f"{where}: devices.{name}.{key} must be a positive number, got {value!r}")
        kwargs[key] = float(value)
    return DeviceCalibration(**kwargs, fitted=True)


@lru_cache(maxsize=4)
def load_calibrations(path: str = str(CALIBRATION_PATH)) -> dict[tuple[str, str], DeviceCalibration]:
    """``{(runtime, device): DeviceCalibration}`` from the calibration file (empty when it is missing)."""
    file = Path(path)
    if not file.exists():
        return {}
    document = load_data(file) or {}
    runtimes = document.get("runtimes", {}) if isinstance(document, dict) else None
    if not isinstance(runtimes, dict) or not all(isinstance(v, dict) for v in runtimes.values()):
        raise ClusterError(f"{path}: expected a mapping 'runtimes: {{RUNTIME: {{DEVICE: {{parameter: value}}}}}}'")
    return {(str(runtime), str(device)): _from_mapping(f"{runtime}.{device}", values, path)
            for runtime, devices in runtimes.items() for device, values in devices.items()}


def mean_calibration(fitted: list[DeviceCalibration]) -> DeviceCalibration:
    """The parameter-wise mean of ``fitted`` (``fitted=False``), or the neutral values when it is empty."""
    if not fitted:
        return DeviceCalibration()
    means = {name: sum(getattr(c, name) for c in fitted) / len(fitted) for name in PARAMETER_NAMES}
    return DeviceCalibration(**means, fitted=False)


@lru_cache(maxsize=256)
def calibration_for(device_name: str, runtime: str = DEFAULT_RUNTIME) -> DeviceCalibration:
    """The fitted parameters of ``device_name`` under ``runtime``, or the borrowed mean (``fitted=False``)."""
    table = load_calibrations()
    hit = table.get((runtime, device_name))
    if hit is not None:
        return hit
    same_device = [c for (_, device), c in sorted(table.items()) if device == device_name]
    return mean_calibration(same_device or [c for _, c in sorted(table.items())])
