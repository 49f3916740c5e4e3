"""Units, defined once: binary sizes for memory, decimal giga for bandwidths and datasheet sizes, and the
human-readable numbers every layer prints (seconds, bytes, device-id ranges).

A leaf module: it imports nothing from planner, so any package may use it.
"""

from __future__ import annotations

import math
from typing import Iterable

KIB = 2**10
MIB = 2**20
GIB = 2**30
TIB = 2**40
GB = 10**9  # decimal: bandwidths in GB/s (the profiles' unit) and datasheet "GB"


def seconds(value_s: float) -> str:
    """``1.5`` -> ``"1.500 s"``, ``0.0025`` -> ``"2.50 ms"``, smaller in microseconds."""
    if value_s >= 1.0:
        return f"{value_s:.3f} s"
    if value_s >= 1e-3:
        return f"{value_s * 1e3:.2f} ms"
    return f"{value_s * 1e6:.1f} us"


def count(value: float) -> str:
    """A count in the largest decimal unit that fits: ``124_439_808`` -> ``"124.4M"``, ``1.3e9`` -> ``"1.30B"``."""
    for unit, scale, digits in (("T", 1e12, 2), ("B", 1e9, 2), ("M", 1e6, 1), ("K", 1e3, 1)):
        if value >= scale:
            return f"{value / scale:.{digits}f}{unit}"
    return f"{value:.0f}"


def size(value_bytes: float) -> str:
    """Bytes in the largest binary unit that fits: ``3 * 2**30`` -> ``"3.0 GiB"``."""
    for unit, scale in (("TiB", TIB), ("GiB", GIB), ("MiB", MIB), ("KiB", KIB)):
        if value_bytes >= scale:
            return f"{value_bytes / scale:.1f} {unit}"
    return f"{value_bytes:.0f} B"


def whole_bytes(value_bytes: float) -> float:
    """A byte count as the JSON outputs write it: a whole number of bytes, rounded up (the cost model's sums
    carry fractions and float noise: 35624430182.399994). A value that is not finite is returned as it is, for
    the writer to report."""
    return math.ceil(value_bytes) if math.isfinite(value_bytes) else value_bytes


def id_ranges(ids: Iterable[int]) -> str:
    """``[0, 1, 2, 3, 8, 9, 12]`` -> ``"0-3,8-9,12"``."""
    ordered = sorted(set(ids))
    parts: list[str] = []
    start = previous = None
    for value in ordered + [None]:
        if start is not None and (value is None or value != previous + 1):
            parts.append(str(start) if start == previous else f"{start}-{previous}")
            start = None
        if value is not None and start is None:
            start = value
        previous = value
    return ",".join(parts)
