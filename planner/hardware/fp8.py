"""FP8 training recipes: how Transformer Engine scales its FP8 tensors, which devices run each, and what each
adds per element.

An FP8 plan trains with 16-bit (bf16) weights and activations and runs the linear layers' GEMMs on FP8
operands (Transformer Engine, "Using FP8 with Transformer Engine"). A recipe says how those operands are
scaled into FP8's narrow range:

* ``delayed`` (``DelayedScaling``): one fp32 scale per tensor, taken from a history of the tensor's absolute
  maxima in earlier iterations (``amax_history_len``, 1024 by default in Transformer Engine's
  ``DelayedScaling``, 1 by default in Megatron-LM's ``--fp8-amax-history-len``). Its state is per tensor
  (history, scale and inverse scale: some kilobytes per GEMM), not per element, and is not counted.
  Megatron-LM's default recipe (``--fp8-recipe`` default ``delayed``, megatron/training/arguments.py,
  ``_add_transformer_engine_args``), and the default here;
* ``blockwise`` (``Float8BlockScaling``, DeepSeek-V3's scheme): one fp32 scale per 1 x 128 block of
  activations and gradients and per 128 x 128 block of weights (Transformer Engine docs, "FP8 Blockwise
  Scaling", Data Format): 4/128 bytes per element, 4/16384 per weight element;
* ``mxfp8`` (``MXFP8BlockScaling``, OCP Microscaling): one E8M0 (1-byte) scale per 32 consecutive values,
  which Blackwell's tensor cores apply natively (Transformer Engine docs, "MXFP8", Data Format and Block
  size): 1/32 bytes per element, weights included.

Which devices run which recipe follows Transformer Engine's support matrix by compute capability
(nvidia.github.io/TransformerEngine/support_matrix.html): per-tensor FP8 from 8.9 (Ada, Hopper, Blackwell),
block scaling from 9.0 (Hopper, Blackwell), MXFP8 on data-centre Blackwell (10.x) only. A device profile
without a compute capability (another vendor's, a measured one) that has an FP8 peak runs ``delayed`` only
(Transformer Engine's ROCm build implements delayed scaling).

The cost model reads a plan's recipe through its dtype key: ``fp8`` for the default recipe and ``fp8:NAME``
for the others (:func:`cost_dtype`), so every table the cost model caches by dtype tells the recipes apart;
:func:`base_dtype` gives back the training dtype and :func:`recipe_of` the recipe.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable

from planner.errors import ConfigError
from planner.types import DeviceProfile

FP8 = "fp8"
SEPARATOR = ":"
# the dtype of an fp8 plan's weights, activations and non-fp8 kernels (attention, output layer)
HIGH_PRECISION = "bf16"


@dataclass(frozen=True)
class Fp8Recipe:
    """One Transformer Engine FP8 recipe: its name (Megatron-LM's ``--fp8-recipe`` value), the compute
    capabilities that run it ``[min_capability, max_capability)``, and the scale bytes it stores per element of
    an FP8 activation or gradient and per element of an FP8 weight copy."""

    name: str
    te_class: str
    runs_on: str  # the compute capabilities, in words, for messages
    min_capability: float
    max_capability: float
    scale_bytes_per_element: float
    weight_scale_bytes_per_element: float
    needs_capability: bool  # False: a device without a compute capability but with an FP8 peak runs it
    # the FP8 formats, as Megatron-LM's --fp8-format names them: Transformer Engine's default for the recipe
    # class ("hybrid": e4m3 forward, e5m2 gradients, DelayedScaling(fp8_format=Format.HYBRID); the block
    # recipes default to e4m3 in both passes, docs "FP8 Blockwise Scaling" and "MXFP8", FP8 format)
    fp8_format: str


FP8_RECIPES: dict[str, Fp8Recipe] = {r.name: r for r in (
    Fp8Recipe("delayed", "DelayedScaling", "compute capability 8.9 and up (Ada, Hopper, Blackwell)",
              8.9, math.inf, 0.0, 0.0, needs_capability=False, fp8_format="hybrid"),
    Fp8Recipe("blockwise", "Float8BlockScaling", "compute capability 9.0 and up (Hopper, Blackwell)",
              9.0, math.inf, 4.0 / 128, 4.0 / (128 * 128), needs_capability=True, fp8_format="e4m3"),
    Fp8Recipe("mxfp8", "MXFP8BlockScaling", "compute capability 10.x (data-centre Blackwell)",
              10.0, 11.0, 1.0 / 32, 1.0 / 32, needs_capability=True, fp8_format="e4m3"),
)}
DEFAULT_FP8_RECIPE = "delayed"


def base_dtype(dtype: str) -> str:
    """The training dtype of a cost-model dtype key (``fp8:mxfp8`` -> ``fp8``)."""
    return dtype.split(SEPARATOR, 1)[0]


def recipe_of(dtype: str) -> Fp8Recipe | None:
    """The FP8 recipe a cost-model dtype key carries (None for the non-FP8 dtypes)."""
    if base_dtype(dtype) != FP8:
        return None
    _, _, name = dtype.partition(SEPARATOR)
    return FP8_RECIPES[name or DEFAULT_FP8_RECIPE]


def recipe_name(dtype: str) -> str | None:
    recipe = recipe_of(dtype)
    return recipe.name if recipe is not None else None


def cost_dtype(dtype: str, fp8_recipe: str | None) -> str:
    """The cost model's dtype key of training dtype ``dtype`` under ``fp8_recipe`` (module docstring)."""
    if dtype != FP8 or fp8_recipe in (None, DEFAULT_FP8_RECIPE):
        return dtype
    return f"{FP8}{SEPARATOR}{fp8_recipe}"


def scale_bytes(dtype: str) -> float:
    """Scale bytes per element of an FP8 activation or gradient under ``dtype``'s recipe (0 off FP8)."""
    recipe = recipe_of(dtype)
    return recipe.scale_bytes_per_element if recipe is not None else 0.0


def weight_scale_bytes(dtype: str) -> float:
    """Scale bytes per element of an FP8 weight copy under ``dtype``'s recipe (0 off FP8)."""
    recipe = recipe_of(dtype)
    return recipe.weight_scale_bytes_per_element if recipe is not None else 0.0


def runs_recipe(profile: DeviceProfile, recipe: Fp8Recipe) -> bool:
    """Whether ``profile`` runs ``recipe``: an FP8 peak, and a compute capability in the recipe's range."""
    if not profile.peak_flops_per_s.get(FP8):
        return False
    if not profile.compute_capability:
        return not recipe.needs_capability
    return recipe.min_capability <= profile.compute_capability < recipe.max_capability


def recipes_for(profiles: Iterable[DeviceProfile]) -> tuple[str, ...]:
    """The recipes every one of ``profiles`` runs."""
    devices = list(profiles)
    return tuple(name for name, recipe in FP8_RECIPES.items() if all(runs_recipe(p, recipe) for p in devices))


def check_recipe_choice(dtype: str | None, fp8_recipe: str | None) -> None:
    """The device-independent rules: a known recipe name, and a recipe only with ``--dtype fp8``."""
    if fp8_recipe is None:
        return
    if fp8_recipe not in FP8_RECIPES:
        raise ConfigError(f"--fp8-recipe {fp8_recipe!r} is not one of {', '.join(FP8_RECIPES)}")
    if dtype != FP8:
        raise ConfigError(f"--fp8-recipe {fp8_recipe} applies to FP8 training only; add --dtype fp8 or drop "
                          "--fp8-recipe")


def resolve_fp8_recipe(devices: Iterable[DeviceProfile], dtype: str, fp8_recipe: str | None) -> str | None:
    """The recipe of a plan of training dtype ``dtype`` (already resolved against the devices): None off FP8,
    else the one asked for (default ``delayed``), which every device must run, else ConfigError naming the
    devices that cannot and the recipes all of them run."""
    check_recipe_choice(dtype, fp8_recipe)
    if dtype != FP8:
        return None
    name = fp8_recipe or DEFAULT_FP8_RECIPE
    profiles = list(devices)
    lacking = sorted({p.name for p in profiles if not runs_recipe(p, FP8_RECIPES[name])})
    if lacking:
        recipe = FP8_RECIPES[name]
        raise ConfigError(f"--fp8-recipe {name}: {', '.join(lacking)} cannot run it (Transformer Engine's "
                          f"{recipe.te_class} needs {recipe.runs_on}); use --fp8-recipe "
                          f"{' or '.join(recipes_for(profiles))}")
    return name
