"""Hardware: device and node profiles (``hardware_profiles/``), cluster loading, the collective model and
the local profiler.

``load_cluster`` is the entry point; ``catalog`` looks names up; ``efficiency`` and ``collectives`` are the
cheap formulas the cost model calls in its hot loop.
"""

from __future__ import annotations

from planner.hardware import catalog
from planner.hardware.cluster import load_cluster

__all__ = ["catalog", "load_cluster"]
