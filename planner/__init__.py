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
from typing import Any

from planner.errors import ClusterError, ConfigError, InfeasibleError, ModelError, PlannerError
from planner.types import ParallelConfig

__version__ = "0.1.0"

# public name -> "module:attribute", resolved lazily
_LAZY = {
    "load_model": "planner.graph:load_model",
    "load_cluster": "planner.hardware:load_cluster",
    "estimate": "planner.compose:estimate",
    "plan": "planner.search:plan",
    "whatif": "planner.whatif:whatif",
    "Plan": "planner.plan:Plan",
}

# ``planner.plan`` and ``planner.whatif`` name both API functions and submodules (planner/plan.py,
# planner/whatif.py). Importing a submodule binds its name on the package, which would shadow the function
# for good if the submodule were first imported later (``from planner.plan import Plan`` anywhere). Load
# both now (they are light), then drop the bindings so the names resolve to the functions through
# __getattr__; ``from planner.plan import Plan`` keeps working.
import planner.plan  # noqa: E402,F401
import planner.whatif  # noqa: E402,F401

for _shadowing in ("plan", "whatif"):
    globals().pop(_shadowing, None)
del _shadowing

__all__ = ["PlannerError", "ModelError", "ClusterError", "ConfigError", "InfeasibleError", "ParallelConfig",
           "__version__", *_LAZY]


def __getattr__(name: str) -> Any:
    target = _LAZY.get(name)
    if target is None:
        raise AttributeError(f"module 'planner' has no attribute {name!r}")
    module_name, attr = target.split(":")
    value = getattr(import_module(module_name), attr)
    globals()[name] = value
    return value
