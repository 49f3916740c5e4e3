"""Human-readable numbers for reports: seconds, bytes, device-id ranges."""

from __future__ import annotations

from typing import Iterable

from planner.units import GIB, KIB, MIB, TIB


def seconds(value_s: float) -> str:
    if value_s >= 1.0:
        return f"{value_s:.3f} s"
    if value_s >= 1e-3:
        return f"{value_s * 1e3:.2f} ms"
    return f"{value_s * 1e6:.1f} us"


def size(value_bytes: float) -> str:
    for unit, scale in (("TiB", TIB), ("GiB", GIB), ("MiB", MIB), ("KiB", KIB)):
        if value_bytes >= scale:
            return f"{value_bytes / scale:.1f} {unit}"
    return f"{value_bytes:.0f} B"


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
