"""onnxruntime, imported with its telemetry switched off.

Since 1.32 onnxruntime's Linux and macOS builds start a telemetry client when the library initializes (on
import), which writes a device id and an event store under ``~/.cache/Microsoft/DeveloperTools/`` and uploads
events. The planner writes only where the user asked, so it sets onnxruntime's opt-out before the import,
unless the user has set it either way.
"""

from __future__ import annotations

import os
from types import ModuleType

# the opt-out onnxruntime 1.32 reads at initialization, and the name later onnxruntime sources read
TELEMETRY_OPT_OUTS = ("ORT_DISABLE_TELEMETRY", "ORT_TELEMETRY_DISABLED")


def import_onnxruntime() -> ModuleType:
    """``import onnxruntime`` with telemetry off (ImportError if it is not installed)."""
    for name in TELEMETRY_OPT_OUTS:
        os.environ.setdefault(name, "1")
    import onnxruntime  # noqa: PLC0415 - an optional extra, imported after the opt-out is set

    return onnxruntime
