"""planner: a parallelism-strategy planner and cost-model optimizer for deep-learning training.

Python API (documented in docs/api.md)::

    import planner
    model = planner.load_model("gpt.onnx", dims={"batch": 1, "seq": 2048})
    cluster = planner.load_cluster("dgx-a100-80gb*128")
    est = planner.estimate(model, cluster, planner.ParallelConfig(global_batch=1536, tp=8, pp=16, dp=8))
    best = planner.plan(model, cluster, global_batch=1536)

Heavy modules are imported on first use, so ``import planner`` stays cheap.
"""

from __future__ import annotations

from importlib import import_module
from importlib.util import find_spec
from typing import Any

from planner.errors import ClusterError, ConfigError, InfeasibleError, ModelError, PlannerError
from planner.types import ParallelConfig

__version__ = "0.1.0"

# public name -> "module:attribute", resolved lazily
_LAZY = {
    "load_model": "planner.graph:load_model",
    "load_cluster": "planner.hardware:load_cluster",
    "estimate": "planner.compose:estimate",
    "estimate_plan": "planner.compose:estimate_plan",
    "load_plan": "planner.plans:load_plan",
    "plan": "planner.search:plan",
    "whatif": "planner.sweep.whatif:whatif",
    "Plan": "planner.plans:Plan",
}

__all__ = ["PlannerError", "ModelError", "ClusterError", "ConfigError", "InfeasibleError", "ParallelConfig",
           "__version__", *_LAZY]


def __getattr__(name: str) -> Any:
    """The lazy API names, then planner's own submodules (``planner.builders`` after a bare ``import planner``)."""
    target = _LAZY.get(name)
    if target is not None:
        module_name, attr = target.split(":")
        value = getattr(import_module(module_name), attr)
        globals()[name] = value
        return value
    # only plain names can be modules; dunders probed by tools (__wrapped__, __path__ ...) must not be looked up
    spec = find_spec(f"{__name__}.{name}") if name.isidentifier() and not name.startswith("__") else None
    if spec is not None and spec.origin is not None:  # no origin: a data folder (schemas/), not a module
        return import_module(f"{__name__}.{name}")  # importing binds it in this module's namespace too
    raise AttributeError(f"module 'planner' has no attribute {name!r}")
