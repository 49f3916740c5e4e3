"""The rule book: which parallel configurations exist for a (model, cluster, runtime).

One place for every rule a configuration must satisfy, read by ``planner estimate`` (:func:`check_config`,
and the free choices it resolves), by the search's enumeration (``planner.search.space``) and by the CLI's
choices. Each ``check_*`` raises :class:`ConfigError` naming the flag, the constraint and the nearest valid
values; the matching ``*_values`` / ``*_allowed`` functions say the same thing as sets, for enumeration.

Rules
-----
* tp: a tensor-parallel group stays inside one node of its device pool, so tp divides the node's device
  count, and it divides the model's attention heads and key/value heads (Megatron-LM splits heads);
  1 only where the runtime has no tensor parallelism.
* pp: at most one pipeline unit (transformer block, or layer of a model without blocks) per stage; 1 only
  where the runtime has no pipeline parallelism; where the runtime has no uneven pipeline
  (``runtime.uneven_pipeline``), every stage holds the same number of units, so pp (times vpp) divides them.
* cp (context parallelism): 1, or a runtime with context parallelism (Megatron-Core through Transformer
  Engine) and a model with attention blocks whose sequence length splits into 2 x cp equal chunks: Megatron
  cuts each sequence into 2 x cp chunks and gives rank i chunks i and 2cp-1-i, so every rank does the same
  causal work (megatron/training/utils.py get_batch_on_this_cp_rank; Transformer Engine asserts "Sequence
  length per GPU needs to be divisible by 2").
* devices: tp x cp x pp x dp devices at most; dp divides the global batch, dp x micro-batch too.
* ZeRO: a stage of ``runtime.zero_stages``; with pp > 1 at most ``runtime.max_pipeline_zero``; with tp > 1 at
  most ``runtime.max_tensor_parallel_zero``.
* vpp > 1 (the interleaved schedule): the runtime interleaves, pp >= 2 (>= 3 where
  ``runtime.interleaved_min_stages`` says so: Megatron-LM v2.5), each stage holds a positive multiple
  of vpp units (so vpp divides the units and units / vpp >= pp), the micro-batch count is a multiple of pp,
  and ZeRO is one the runtime combines with a pipeline.
* ep, expert_tp (mixture-of-experts models only; ``runtime.expert_parallel``): ep divides the routed experts
  of every MoE layer; expert_tp divides tp (the expert-tensor-parallel group lies inside the tensor-parallel
  one, so inside a node; a planner restriction, Megatron-Core allows more); ep x expert_tp divides
  tp x cp x dp (Megatron-Core folds the experts' ranks into the stage's: megatron/core/parallel_state.py,
  ``initialize_model_parallel`` raises unless the world size is a multiple of expert_tp x ep x pp);
  expert_tp other than tp only where the runtime has expert tensor parallelism; tp > 1 only with sequence
  parallelism where the runtime requires it (``Runtime.moe_tensor_parallel_needs_sequence_parallel``:
  Megatron-Core's MoELayer refuses to train otherwise, whatever ep).
* ep_overlap (the expert-parallel all-to-alls under another micro-batch's computation; ``runtime.ep_overlap``,
  Megatron-Core's ``--overlap-moe-expert-parallel-comm``, whose TransformerConfig asserts each of these): ep > 1,
  the interleaved schedule (vpp > 1) where pp > 1, no full recompute, 16-bit weights (bf16, fp16; fp8 trains
  bf16 weights).
* dtype fp8: only on a runtime that trains it (``runtime.fp8``).
* enums: recompute, optimizer, dtype, schedule, runtime, each spelled once here (the search plans the 1F1B
  and interleaved schedules; GPipe, which holds every micro-batch's activations, is estimated only).
* runtime left out (``--runtime``, ``ParallelConfig.runtime`` None): the default runtime where it runs every
  pinned choice, else the first of ``RUNTIME_PREFERENCE`` that does (:func:`resolve_runtime`; e.g. ZeRO-3, which
  megatron-core does not run, resolves to pytorch-fsdp2). A named runtime is never replaced.

This module imports nothing of the cost model or the search (both import it).
"""

from __future__ import annotations

import bisect
import itertools
import math
from dataclasses import dataclass
from typing import Callable, Iterable, Sequence

from planner.arguments import degree
from planner.errors import ConfigError, suggest
from planner.hardware.efficiency import DEFAULT_DTYPE, DTYPE_FALLBACK, default_dtype
from planner.hardware.fp8 import FP8, FP8_RECIPES, base_dtype, check_recipe_choice
from planner.runtime import DEFAULT_RUNTIME, RUNTIMES, Runtime, get_runtime
from planner.types import Batching, Cluster, DeviceProfile, LayerGraph, ParallelConfig

# ------------------------------------------------------------------------------------------------ enums

RECOMPUTE_CHOICES = ("none", "selective", "full")  # simplest first (the tie rule prefers the earlier)
OPTIMIZERS = ("adam", "sgd", "adagrad")
# the training dtypes: those the compute model has peaks and fallbacks for (the memory model sizes each)
DTYPES = tuple(DTYPE_FALLBACK)
# Transformer Engine's FP8 scaling recipes (with dtype fp8 only; which devices run each: planner.hardware.fp8)
FP8_RECIPE_NAMES = tuple(FP8_RECIPES)
SCHEDULES = ("1f1b", "interleaved", "gpipe")
# the largest micro-batch a free choice goes to (a pinned one may be larger)
MAX_MICRO_BATCH = 1024
# the most micro-batches per replica a pipeline (pp > 1) may run: the cost model simulates every operation of
# every micro-batch on every stage, so time and memory grow with m x pp; published pipelines run at most a few
# hundred per replica; one stage, timed in closed form, takes any number
MAX_PIPELINE_MICRO_BATCHES = 4096
INTERLEAVED = "interleaved"
ZERO_STAGES = (0, 1, 2, 3)
RUNTIME_NAMES = tuple(RUNTIMES)

# the runtimes whose launch files each export format writes, the first the one a plan is made for when the
# format is asked for without --runtime
FORMAT_RUNTIMES: dict[str, tuple[str, ...]] = {
    "megatron": ("megatron-core", "megatron-lm-2021"),
    "deepspeed": ("deepspeed",),
    "torchtitan": ("pytorch-fsdp2",),
}

# the training dtypes an export format can write where it has a setting of its own: torchtitan's
# training.mixed_precision_param is bfloat16 or float32 (torchtitan/config/job_config.py at b5bcd76c; fp8
# trains bf16 weights, tf32 computes fp32 ones); the other formats write every dtype
FORMAT_DTYPES: dict[str, tuple[str, ...]] = {"torchtitan": ("bf16", "fp8", "fp32", "tf32")}


def format_dtype(fmt: str, devices: Sequence[DeviceProfile], dtype: str | None, flag: str = "--dtype ") -> str | None:
    """The dtype a plan printed as ``fmt`` trains in: ``dtype`` where asked (ConfigError where the format has no
    setting for it), else the default where the format writes it (None: left to the search's default), else
    the first fallback of ``DTYPE_FALLBACK["bf16"]`` that every device runs and the format writes (fp32 for
    torchtitan on V100s, whose default is fp16)."""
    allowed = FORMAT_DTYPES.get(fmt)
    if allowed is None:
        return dtype
    if dtype is not None:
        if dtype not in allowed:
            raise ConfigError(f"{flag}{dtype}: --format {fmt} has no setting for it; use --dtype "
                              f"{' or '.join(d for d in allowed if d in ('bf16', 'fp32'))} (fp32 where a device "
                              "lacks bf16), or leave --dtype out")
        return dtype
    if default_dtype(devices) in allowed:
        return None
    runnable = [d for d in DTYPE_FALLBACK[DEFAULT_DTYPE] if d in allowed
                and all(device.peak_flops_per_s.get(d) for device in devices)]
    return runnable[0] if runnable else None


def uniform_stages(fmt: str) -> bool:
    """Whether a plan printed as ``fmt`` must run every stage on the same tp and cp, each stage served by one
    replica group: the framework exports (:data:`FORMAT_RUNTIMES`) launch one configuration everywhere."""
    return fmt in FORMAT_RUNTIMES


# the runtimes a configuration that names none resolves to (resolve_runtime), in the order a user of today would
# reach for them: the default; then PyTorch FSDP2 as torchtitan runs it, PyTorch's own sharded data parallelism,
# which runs ZeRO-2 and -3 with pipeline stages, the interleaved schedule and sequence parallelism; then
# DeepSpeed (ZeRO-2 and -3 without pipeline stages). megatron-lm-2021 runs no choice megatron-core does not, so
# it is only ever taken by name
RUNTIME_PREFERENCE: tuple[str, ...] = (DEFAULT_RUNTIME, "pytorch-fsdp2", "deepspeed")

# among plans within this fraction of the fastest predicted time, the simpler one is taken (simplicity_key)
TIE_TOLERANCE = 0.005


def check_choice(flag: str, value: object, choices: Sequence[object]) -> None:
    """``value`` is one of ``choices``, else ConfigError naming ``flag`` and the choices."""
    if value not in choices:
        hint = suggest(str(value), [str(c) for c in choices])
        raise ConfigError(f"{flag} {value!r} is not one of {', '.join(str(c) for c in choices)}{hint}")


# ------------------------------------------------------------------------------------------- arithmetic


def divisors(n: int) -> list[int]:
    small = [d for d in range(1, int(n ** 0.5) + 1) if n % d == 0]
    return sorted(set(small + [n // d for d in small]))


def nearest(value: int, valid: Iterable[int]) -> str:
    """The valid values just below and just above ``value`` ("2 or 4", or one of them)."""
    values = list(valid)
    below = [v for v in values if v < value]
    above = [v for v in values if v > value]
    picks = ([max(below)] if below else []) + ([min(above)] if above else [])
    return " or ".join(str(v) for v in picks) if picks else "none"


# ------------------------------------------------------------------------------------------------ model


def unit_flags(kinds: Sequence[str]) -> tuple[int, ...]:
    """Per layer (``kinds``: the layers' kinds), 1 for a pipeline unit: the transformer blocks where there are
    any, else every layer."""
    if any(kind == "block" for kind in kinds):
        return tuple(int(kind == "block") for kind in kinds)
    return (1,) * len(kinds)


def pipeline_units(model: LayerGraph) -> int:
    """How many layers a pipeline can split: the transformer blocks where there are any, else all layers
    (:func:`unit_flags`)."""
    return sum(unit_flags([layer.kind for layer in model.layers]))


def attention_heads(model: LayerGraph) -> tuple[tuple[int, str], ...]:
    """Head counts that tp must divide: ``(count, "attention heads" | "key/value heads")``."""
    counts: set[tuple[int, str]] = set()
    for layer in model.layers:
        if layer.transformer is not None:
            counts.add((layer.transformer.heads, "attention heads"))
            kv = layer.transformer.kv_heads
            if kv and kv != layer.transformer.heads:
                counts.add((kv, "key/value heads"))
    return tuple(sorted(counts))


def attention_seq_lens(model: LayerGraph) -> tuple[int, ...]:
    """The sequence lengths of the model's attention blocks (empty: no attention, nothing for cp to split)."""
    return tuple(sorted({layer.transformer.seq_len for layer in model.layers
                         if layer.transformer is not None and layer.kind == "block"}))


def routed_experts(model: LayerGraph) -> int:
    """The expert counts ep must divide, as one number: the gcd of the MoE layers' routed experts (0: dense)."""
    return math.gcd(*(layer.moe.experts for layer in model.layers if layer.moe is not None)) if any(
        layer.moe is not None for layer in model.layers) else 0


@dataclass(frozen=True)
class ModelShape:
    """What the rules read of a model: the head counts tp divides, the pipeline units pp splits
    (``num_units`` 0: unknown, no limit), the attention sequence lengths cp splits and the routed experts ep
    divides (``experts`` 0: a dense model)."""

    heads: tuple[tuple[int, str], ...] = ()
    num_units: int = 0
    seq_lens: tuple[int, ...] = ()
    experts: int = 0

    @classmethod
    def of(cls, model: LayerGraph) -> "ModelShape":
        return cls(heads=attention_heads(model), num_units=pipeline_units(model), seq_lens=attention_seq_lens(model),
                   experts=routed_experts(model))


# ------------------------------------------------------------------------------------------- tensor (tp)


def pool_tps(shape: ModelShape, devices_per_node: int, runtime: Runtime) -> list[int]:
    """The tp degrees a pool of ``devices_per_node``-device nodes runs: divisors of the node that divide every
    head count (1 alone where the runtime has no tensor parallelism)."""
    if not runtime.tensor_parallel:
        return [1]
    return [t for t in divisors(devices_per_node) if all(h % t == 0 for h, _ in shape.heads)]


def pools_touched(cluster: Cluster, num_devices: int) -> list[int]:
    """The pools (cluster groups) holding devices ``0 .. num_devices - 1``, the devices estimate places."""
    return [i for i, g in enumerate(cluster.groups) if g.first_device < num_devices] or [0]


def check_tp(tp: int, shape: ModelShape, cluster: Cluster, runtime: Runtime, pools: Sequence[int],
             flag: str = "tp=") -> None:
    """tp on every pool of ``pools``: inside one node, dividing the node and the heads."""
    valid = sorted(set.intersection(*(set(pool_tps(shape, cluster.groups[p].node.devices_per_node, runtime))
                                      for p in pools)))
    if tp in valid:
        return
    if not runtime.tensor_parallel:
        raise ConfigError(f"{flag}{tp}: the {runtime.name} runtime has no tensor parallelism; use tp 1 or "
                          f"another --runtime")
    group = min((cluster.groups[p] for p in pools), key=lambda g: g.node.devices_per_node)
    per_node = group.node.devices_per_node
    if tp > per_node:
        raise ConfigError(f"{flag}{tp} is larger than a node: {group.node.name} has {per_node} devices and tensor "
                          f"parallelism stays inside a node; nearest valid tp: {nearest(tp, valid)}")
    for heads, what in shape.heads:
        if heads % tp:
            raise ConfigError(f"{flag}{tp} does not divide the model's {heads} {what}; "
                              f"nearest valid tp: {nearest(tp, valid)}")
    raise ConfigError(f"{flag}{tp} does not divide the {per_node} devices of a {group.node.name} node, so a "
                      f"tensor-parallel group would span two nodes; nearest valid tp: {nearest(tp, valid)}")


# -------------------------------------------------------------------------------------- context (cp)


def cp_fits(cp: int, shape: ModelShape) -> bool:
    """Whether every attention sequence of ``shape`` splits into 2 x cp equal chunks (cp 1: always)."""
    return cp == 1 or (bool(shape.seq_lens) and all(s % (2 * cp) == 0 for s in shape.seq_lens))


def cp_values(shape: ModelShape, runtime: Runtime) -> list[int]:
    """Every cp the model and runtime allow: 1, and the cp whose 2 x cp chunks divide every sequence."""
    if not runtime.context_parallel or not shape.seq_lens:
        return [1]
    common = math.gcd(*shape.seq_lens)
    return [c for c in divisors(common) if cp_fits(c, shape)]


def _listed(values: Sequence[int], near: int, count: int = 8) -> str:
    """``values`` around ``near``, at most ``count`` of them, with "..." where some are left out."""
    values = sorted(values)
    if len(values) <= count:
        return ", ".join(map(str, values))
    start = max(0, min(len(values) - count, sum(1 for v in values if v < near) - count // 2))
    picked = values[start:start + count]
    return (("..., " if start else "") + ", ".join(map(str, picked))
            + (", ..." if start + count < len(values) else ""))


def check_cp(cp: int, shape: ModelShape, runtime: Runtime, flag: str = "cp=") -> None:
    """cp: a positive integer; above 1 only under a runtime with context parallelism, on a model with
    attention blocks, and splitting each sequence into 2 x cp equal chunks."""
    if not isinstance(cp, int) or isinstance(cp, bool) or cp < 1:
        raise ConfigError(f"{flag}{cp} must be a positive integer")
    if cp == 1:
        return
    if not runtime.context_parallel:
        others = " or ".join(r.name for r in RUNTIMES.values() if r.context_parallel)
        raise ConfigError(f"{flag}{cp}: the {runtime.name} runtime has no context parallelism (Megatron-Core's "
                          f"ring exchange of K and V); use cp 1, or --runtime {others}")
    if not shape.seq_lens:
        raise ConfigError(f"{flag}{cp}: the model has no attention blocks (transformer layers), so there is no "
                          "sequence for context parallelism to split; use cp 1")
    if not cp_fits(cp, shape):
        seq = next(s for s in shape.seq_lens if s % (2 * cp))
        raise ConfigError(f"{flag}{cp} does not divide the sequence length {seq} into 2 x cp = {2 * cp} equal "
                          f"chunks (Megatron's causal load balancing); valid: "
                          f"{_listed(cp_values(shape, runtime), cp)}")


def cp_pool_fits(tp: int, cp: int, pool_devices: int) -> bool:
    """Whether a pool of ``pool_devices`` devices holds whole ``tp x cp`` context-parallel groups, so that no
    group spans two pools (its ranks run each attention step in lockstep, on one device type)."""
    return cp == 1 or pool_devices % (tp * cp) == 0


def check_cp_pools(tp: int, cp: int, cluster: Cluster, pools: Sequence[int], flag: str = "cp=") -> None:
    """Every pool of ``pools`` holds whole tp x cp groups (:func:`cp_pool_fits`)."""
    for p in pools:
        group = cluster.groups[p]
        if not cp_pool_fits(tp, cp, group.num_devices):
            fits = [c for c in divisors(group.num_devices // tp) if group.num_devices % tp == 0]
            raise ConfigError(f"{flag}{cp}: a context-parallel group of tp x cp = {tp * cp} devices does not fit "
                              f"the {group.num_devices} devices of {group.name} whole (a group stays on one device "
                              f"type); nearest valid cp: {nearest(cp, fits)}")


# ----------------------------------------------------------------------------------------- pipeline (pp)


def max_pipeline(shape: ModelShape, runtime: Runtime, zero: int | None = None,
                 num_micro_batches: int | None = None, ep_overlap: bool = False, vpp: int = 1) -> int:
    """The most pipeline stages: one unit per stage at most (0 units: unknown, no limit); 1 where the runtime
    has no pipeline, where ``zero`` is above what it combines with a pipeline, where ``ep_overlap`` runs
    without interleaving (``vpp`` 1), or where there are more than :data:`MAX_PIPELINE_MICRO_BATCHES`
    micro-batches per replica."""
    if not runtime.pipeline_parallel or (zero is not None and zero > runtime.max_pipeline_zero):
        return 1
    if ep_overlap and not ep_overlap_pipeline_fits(2, vpp):
        return 1
    if num_micro_batches is not None and num_micro_batches > MAX_PIPELINE_MICRO_BATCHES:
        return 1
    return shape.num_units if shape.num_units else 1 << 30


def even_split_fits(num_units: int, num_stages: int, vpp: int = 1) -> bool:
    """Whether ``num_stages`` stages can each hold the same positive number of whole ``vpp``-unit chunks of
    ``num_units`` units (0 units: unknown, no limit)."""
    return num_stages == 1 or not num_units or num_units % (num_stages * vpp) == 0


def stages_allowed(num_stages: int, num_micro_batches: int, vpp: int, num_units: int, even: bool,
                   min_stages: int = 2) -> bool:
    """Whether ``num_stages`` stages may run ``vpp`` chunks each (:func:`interleave_allowed`, on at least
    ``min_stages`` stages: ``Runtime.interleaved_min_stages``) and, where the runtime has no uneven pipeline
    (``even``), split the units evenly (:func:`even_split_fits`)."""
    return interleave_allowed(num_stages, num_micro_batches, vpp, num_units, min_stages) and (
        not even or even_split_fits(num_units, num_stages, vpp))


def _uneven_runtimes() -> str:
    return " or ".join(r.name for r in RUNTIMES.values() if r.uneven_pipeline and r.pipeline_parallel)


def check_pipeline_micro_batches(pp: int, num_micro_batches: int, flag: str = "pp=") -> None:
    """ConfigError where ``pp`` > 1 stages would run more than :data:`MAX_PIPELINE_MICRO_BATCHES` micro-batches
    per replica."""
    if pp > 1 and num_micro_batches > MAX_PIPELINE_MICRO_BATCHES:
        raise ConfigError(f"{flag}{pp}: {num_micro_batches} micro-batches per replica is more than the "
                          f"{MAX_PIPELINE_MICRO_BATCHES} a pipeline is timed for; use a larger micro-batch or dp, "
                          "or pp 1")


def check_pp(pp: int, shape: ModelShape, runtime: Runtime, flag: str = "pp=") -> None:
    if pp > 1 and not runtime.pipeline_parallel:
        raise ConfigError(f"{flag}{pp}: the {runtime.name} runtime has no pipeline parallelism; use pp 1 or "
                          "another --runtime")
    units = shape.num_units
    if units and pp > units:
        raise ConfigError(f"{flag}{pp} is larger than the model's {units} layers (one layer per stage at most); "
                          f"nearest valid pp: {units}")
    if not runtime.uneven_pipeline and not even_split_fits(units, pp):
        raise ConfigError(f"{flag}{pp}: the {runtime.name} runtime splits the model's {units} layers evenly over the "
                          f"pipeline stages, so pp must divide {units}; nearest valid pp: "
                          f"{nearest(pp, divisors(units))}, or --runtime {_uneven_runtimes()}")


# ------------------------------------------------------------------------------------------------- ZeRO


def zero_stages(runtime: Runtime, pp: int | None = None) -> tuple[int, ...]:
    """The ZeRO stages the runtime runs, with ``pp`` stages (None: any)."""
    if pp is not None and pp > 1:
        return tuple(z for z in runtime.zero_stages if z <= runtime.max_pipeline_zero)
    return runtime.zero_stages


def tp_zero_fits(tp: int, zero: int, runtime: Runtime) -> bool:
    """Whether the runtime combines ``tp``-way tensor parallelism with ZeRO stage ``zero``."""
    return tp == 1 or zero <= runtime.max_tensor_parallel_zero


def _runtimes_with(zero: int, pp: int) -> str:
    names = [r.name for r in RUNTIMES.values() if zero in zero_stages(r, pp)]
    return " or ".join(names) if names else "none"


def check_zero(zero: int, pp: int | None, runtime: Runtime, flag: str = "zero=", pp_flag: str = "pp=",
               tp: int | None = None, tp_flag: str = "tp=") -> None:
    """ZeRO ``zero`` is a stage ``runtime`` runs, also with ``pp`` pipeline stages and ``tp``-way tensor
    parallelism (None: not fixed)."""
    check_choice(flag.rstrip("= "), zero, ZERO_STAGES)
    if zero not in runtime.zero_stages:
        raise ConfigError(f"{flag}{zero}: the {runtime.name} runtime runs ZeRO "
                          f"{', '.join(map(str, runtime.zero_stages))}; nearest valid ZeRO: "
                          f"{nearest(zero, runtime.zero_stages)}, or --runtime {_runtimes_with(zero, pp or 1)}")
    if pp is not None and pp > 1 and zero > runtime.max_pipeline_zero:
        raise ConfigError(f"{flag}{zero} with {pp_flag}{pp}: the {runtime.name} runtime combines pipeline stages "
                          f"with ZeRO {runtime.max_pipeline_zero} at most; use ZeRO "
                          f"{nearest(zero, zero_stages(runtime, pp))} or pp 1, or --runtime "
                          f"{_runtimes_with(zero, pp)}")
    if tp is not None and not tp_zero_fits(tp, zero, runtime):
        raise ConfigError(f"{flag}{zero} with {tp_flag}{tp}: the {runtime.name} runtime combines tensor parallelism "
                          f"with ZeRO {runtime.max_tensor_parallel_zero} at most; use ZeRO "
                          f"{runtime.max_tensor_parallel_zero} or lower, or tp 1")


# ------------------------------------------------------------------------------------- interleaved (vpp)


def vpp_fits(num_units: int, num_stages: int, vpp: int, min_stages: int = 2) -> bool:
    """Whether ``num_stages`` stages (at least ``min_stages``, the runtime's
    ``Runtime.interleaved_min_stages``) can each hold a positive multiple of ``vpp`` of ``num_units`` units."""
    if vpp == 1:
        return True
    return num_stages >= max(2, min_stages) and num_units % vpp == 0 and num_units // vpp >= num_stages


def interleave_allowed(num_stages: int, num_micro_batches: int, vpp: int, num_units: int,
                       min_stages: int = 2) -> bool:
    """Whether ``num_stages`` stages may interleave ``vpp`` chunks each (always true for vpp = 1): the
    chunks fit (:func:`vpp_fits`) and the micro-batches are a multiple of the stages."""
    return vpp == 1 or (vpp_fits(num_units, num_stages, vpp, min_stages) and num_micro_batches % num_stages == 0)


def valid_vpps(num_units: int, num_stages: int) -> list[int]:
    return [v for v in range(1, max(num_units, 1) + 1) if vpp_fits(num_units, num_stages, v)]


def stage_chunks(units: int, vpp: int, first_stage: bool = False) -> list[int]:
    """The units of each of a stage's ``vpp`` model chunks, first chunk first: its ``units`` shared out as
    evenly as they go, the larger chunks first, except on the first stage, the smaller first (its first chunk
    also holds the embedding, as the last stage's last chunk holds the head and loss: Llama 3 405B's layout,
    whose first chunk is only the embedding and last only the loss, Dubey et al. 2024, Sec. 3.3.2)."""
    sizes = [units // vpp + (1 if v < units % vpp else 0) for v in range(vpp)]
    return sizes[::-1] if first_stage else sizes


def chunk_sizes(stage_units: list[int], vpp: int) -> list[int]:
    """The units of every model chunk of an interleaved pipeline, in virtual-stage order (chunk v x pp + p is
    the v-th of stage p, and the chunks follow one another through the model in that order), each stage's
    shared out by :func:`stage_chunks`."""
    per_stage = [stage_chunks(n, vpp, s == 0) for s, n in enumerate(stage_units)]
    return [chunks[v] for v in range(vpp) for chunks in per_stage]


def layer_chunks(flags: Sequence[int], vpp: int, first_stage: bool = False) -> list[int]:
    """The model chunk of each layer of one stage (``flags``: which of its layers are pipeline units,
    :func:`unit_flags`), its units dealt out by :func:`stage_chunks`: a layer before the stage's first unit
    (the embedding) goes with the first chunk, one after its last unit (the final norm and head) with the
    last chunk, any other with the chunk of the unit before it (Megatron-Core's layout: "E" opens the first
    chunk, "L" closes the last; torchtitan's split alike, planner.export.torchtitan)."""
    sizes = stage_chunks(sum(map(bool, flags)), vpp, first_stage)
    ends = list(itertools.accumulate(sizes))
    total = ends[-1] if ends else 0
    chunks, seen = [], 0
    for flag in flags:
        if flag:
            seen += 1
            chunks.append(bisect.bisect_left(ends, seen))
        else:
            chunks.append(0 if seen == 0 else vpp - 1 if seen == total else bisect.bisect_left(ends, seen))
    return chunks


def layout_vpp_limit(stage_units: Sequence[int]) -> int:
    """The largest vpp at which every model chunk (:func:`stage_chunks`) holds a unit, but the first stage's
    first chunk and the last stage's last chunk, which hold the embedding and the head (Megatron-Core's layout
    takes an empty virtual stage, megatron/core/transformer/pipeline_parallel_layer_layout.py ``pretty_repr``'s
    "(empty stage)"; torchtitan's pipeline split does not)."""
    last = len(stage_units) - 1
    return min(n + (s == 0) + (s == last) for s, n in enumerate(stage_units))


def stage_blocks(num_units: int, pp: int, vpp: int, first: int | None, last: int | None,
                 flag: str = "") -> list[int]:
    """Transformer blocks per stage of an uneven pipeline: ``first`` on stage 0 and ``last`` on the last
    stage where set, the rest evenly over the middle stages (Megatron-Core
    ``--decoder-first-pipeline-num-layers`` / ``--decoder-last-pipeline-num-layers``, i.e.
    ``TransformerConfig.num_layers_in_first/last_pipeline_stage``; ``get_transformer_layer_offset`` in
    megatron/core/transformer/transformer_layer.py gives each middle stage ``middle // middle_stages``
    layers). Interleaved, each stage's blocks are shared over its ``vpp`` chunks by :func:`stage_chunks`:
    whole chunks where every count divides by vpp (Megatron-Core's first/last options), otherwise a
    pipeline layout (``--pipeline-model-parallel-layout``, as Llama 3 405B ran), with vpp at most
    :func:`layout_vpp_limit`. Every stage holds at least one block. ConfigError names the flag and the
    nearest valid counts."""
    if first is None and last is None:
        raise ValueError("stage_blocks: neither first nor last is set")
    if pp < 2:
        raise ConfigError(f"{flag}first/last stage layers need pipeline parallelism (pp >= 2); use pp 2 or more, "
                          "or leave them out")
    ends = [x for x in (first, last) if x is not None]
    middle_stages = pp - len(ends)
    middle = num_units - sum(ends)
    bad = [x for x in ends if x < 1]
    if bad:
        raise ConfigError(f"{flag}first/last stage layers {bad[0]}: each stage holds at least one transformer "
                          "layer; use 1 or more")
    unit = max(middle_stages, 1)
    if (middle_stages == 0 and middle != 0) or (middle_stages > 0 and (middle < unit or middle % unit)):
        rest = num_units - sum(ends) + ends[0]
        valid = [x for x in range(1, num_units + 1)
                 if (middle_stages == 0 and rest - x == 0) or
                 (middle_stages > 0 and rest - x >= unit and (rest - x) % unit == 0)]
        hint = f"nearest valid first/last count with the other fixed: {nearest(ends[0], valid)}" if valid else \
            "use other counts or another pp"
        given = " + ".join(map(str, ends))
        if middle_stages == 0:  # pp 2 with both ends set: they are the whole model
            raise ConfigError(f"{flag}first/last stage layers {given} must add up to the model's {num_units} "
                              f"transformer layers (pp={pp} has no other stage); {hint}")
        others = f"the {middle_stages} middle stages" if len(ends) == 2 else f"the other {middle_stages} stages" \
            if middle_stages > 1 else "the last stage" if last is None else "the first stage"
        left = f"leave {middle} of the {num_units} transformer layers" if middle >= 0 else \
            f"take {sum(ends)} of the model's {num_units} transformer layers"
        must = f"which must share them evenly (a multiple of {unit}, at least {unit})" if middle_stages > 1 else \
            "which must hold at least one"
        raise ConfigError(f"{flag}first/last stage layers {given} {left} for {others}, {must}; {hint}")
    per = middle // middle_stages if middle_stages else 0
    counts = [first if first is not None else per, *[per] * (pp - 2), last if last is not None else per]
    limit = layout_vpp_limit(counts)
    if vpp > limit:
        raise ConfigError(f"{flag}vpp={vpp}: stages of {', '.join(map(str, sorted(set(counts))))} transformer "
                          f"layers leave a model chunk without one (only the first chunk may hold just the embedding "
                          f"and the last just the head); use vpp {limit} or less")
    return counts


def check_schedule(schedule: str | None, vpp: int | None, pp: int | None, runtime: Runtime,
                   flag: str = "schedule ", vpp_flag: str = "vpp=", pp_flag: str = "pp=") -> None:
    """The schedule and vpp against each other and the runtime (``pp`` None: not fixed)."""
    if schedule is not None:
        check_choice(flag.rstrip("= "), schedule, SCHEDULES)
    if vpp is not None and vpp < 1:
        raise ConfigError(f"{vpp_flag}{vpp} must be a positive integer")
    interleaved = (vpp is not None and vpp > 1) or schedule == INTERLEAVED
    if interleaved and not runtime.interleaved:
        what = f"{vpp_flag}{vpp}" if vpp is not None and vpp > 1 else f"{flag}{schedule}"
        others = " or ".join(r.name for r in RUNTIMES.values() if r.interleaved)
        raise ConfigError(f"{what}: the {runtime.name} runtime has no interleaved (virtual-pipeline) schedule; "
                          f"use vpp 1 (--schedule 1f1b), or --runtime {others}")
    if vpp is not None and vpp > 1:
        if pp == 1:
            raise ConfigError(f"{vpp_flag}{vpp} needs pipeline parallelism (pp > 1); use vpp 1")
        if schedule not in (None, INTERLEAVED):
            raise ConfigError(f"{vpp_flag}{vpp} needs the interleaved schedule, not {schedule}; "
                              f"use --schedule interleaved or vpp 1")
    if schedule == INTERLEAVED and vpp == 1:
        raise ConfigError("the interleaved schedule needs vpp > 1; use --vpp 2 or more, or --schedule 1f1b")
    if schedule == INTERLEAVED and pp == 1:
        raise ConfigError("the interleaved schedule needs pipeline parallelism (pp > 1); use --schedule 1f1b")
    if interleaved and pp is not None and 1 < pp < runtime.interleaved_min_stages:
        what = f"{vpp_flag}{vpp}" if vpp is not None and vpp > 1 else f"{flag}{schedule}"
        raise ConfigError(f"{what} with {pp_flag}{pp}: the {runtime.name} runtime runs the interleaved schedule on "
                          f"{runtime.interleaved_min_stages} pipeline stages or more; use pp "
                          f"{runtime.interleaved_min_stages} or more, or vpp 1 (--schedule 1f1b)")


def check_vpp_shape(vpp: int, pp: int, num_units: int, num_micro_batches: int | None,
                    vpp_flag: str = "vpp=", pp_flag: str = "pp=", runtime: Runtime | None = None,
                    layout: bool = False) -> None:
    """vpp > 1 on ``pp`` stages of a model of ``num_units`` units (``num_micro_batches`` None: not fixed); on a
    ``runtime`` without an uneven pipeline, the same whole chunks on every stage. ``layout``: the stages hold
    counts of their own, shared over their chunks as a pipeline layout (checked by :func:`stage_blocks` where
    the counts come from first/last pins), so no whole chunks are asked; only the micro-batches are left."""
    if vpp == 1:
        return
    if not layout and not vpp_fits(num_units, pp, vpp):
        raise ConfigError(f"{vpp_flag}{vpp}: {pp} stages of whole {vpp}-layer chunks need the model's {num_units} "
                          f"pipeline units (layers) to be a multiple of {vpp} and at least {pp * vpp}; nearest "
                          f"valid vpp: {nearest(vpp, valid_vpps(num_units, pp))}")
    if not layout and runtime is not None and not runtime.uneven_pipeline \
            and not even_split_fits(num_units, pp, vpp):
        valid = [v for v in valid_vpps(num_units, pp) if even_split_fits(num_units, pp, v)]
        raise ConfigError(f"{vpp_flag}{vpp}: the {runtime.name} runtime gives each of the {pp} stages the same "
                          f"number of whole {vpp}-layer chunks, so {pp * vpp} must divide the model's {num_units} "
                          f"layers; nearest valid vpp: {nearest(vpp, valid)}")
    if num_micro_batches is not None and num_micro_batches % pp:
        raise ConfigError(f"{vpp_flag}{vpp}: the interleaved schedule needs the number of micro-batches "
                          f"({num_micro_batches}) to be a multiple of {pp_flag}{pp}; use vpp 1 or change the "
                          "micro-batch or dp")


# ------------------------------------------------------------------------------- experts (ep, expert_tp)


def expert_tp_values(shape: ModelShape, tp: int, runtime: Runtime) -> list[int]:
    """The expert tensor-parallel degrees with attention tp ``tp``: divisors of tp where the runtime splits
    experts on their own, else tp alone; none on a dense model."""
    if not shape.experts:
        return []
    return divisors(tp) if runtime.expert_tensor_parallel else [tp]


def ep_values(shape: ModelShape, tp: int, dp: int, expert_tp: int, runtime: Runtime, cp: int = 1) -> list[int]:
    """The expert-parallel degrees: divisors of the routed experts with ep x expert_tp dividing
    tp x cp x dp (1 alone on a dense model or where the runtime has no expert parallelism)."""
    if not shape.experts or not runtime.expert_parallel:
        return [1]
    return [e for e in divisors(shape.experts) if (tp * cp * dp) % (e * expert_tp) == 0]


def experts_fit(shape: ModelShape, ep: int, expert_tp: int | None, tp: int, dp: int, runtime: Runtime,
                cp: int = 1, sequence_parallel: bool | None = None) -> bool:
    """Whether (ep, expert_tp; None: tp) is allowed with these degrees (:func:`check_experts` as a test)."""
    if not shape.experts:
        return ep == 1 and expert_tp in (None, tp)
    if _moe_needs_sequence_parallel(runtime, tp, sequence_parallel):
        return False
    etp = tp if expert_tp is None else expert_tp
    return etp in expert_tp_values(shape, tp, runtime) and ep in ep_values(shape, tp, dp, etp, runtime, cp)


def _moe_needs_sequence_parallel(runtime: Runtime, tp: int | None, sequence_parallel: bool | None) -> bool:
    """Whether a mixture-of-experts layer with ``tp`` and ``sequence_parallel`` (None: not fixed) breaks the
    runtime's rule that tensor-parallel MoE layers train with sequence parallelism."""
    return runtime.moe_tensor_parallel_needs_sequence_parallel and tp is not None and tp > 1 \
        and sequence_parallel is False


def check_moe_runtime(shape: ModelShape, runtime: Runtime) -> None:
    """A mixture-of-experts model runs only on a runtime with mixture-of-experts layers."""
    if shape.experts and not runtime.moe_layers:
        others = " or ".join(r.name for r in RUNTIMES.values() if r.moe_layers)
        raise ConfigError(f"the model's mixture-of-experts layers ({shape.experts} routed experts) do not run on "
                          f"{runtime.name}, which has none; use --runtime {others}")


def check_experts(ep: int, expert_tp: int | None, tp: int | None, dp: int | None, shape: ModelShape,
                  runtime: Runtime, cp: int = 1, flag: str = "ep=", etp_flag: str = "expert_tp=",
                  sequence_parallel: bool | None = None) -> None:
    """ep and expert_tp (None: tp) against the model's experts, tp x cp x dp, sequence parallelism (None:
    not fixed) and the runtime; ``tp`` or ``dp`` None (not fixed, the search's pins): the checks that need them
    are left out."""
    for name, value in ((flag, ep), (etp_flag, expert_tp)):
        if value is not None and (not isinstance(value, int) or value < 1):
            raise ConfigError(f"{name}{value} must be a positive integer")
    if not shape.experts:
        if ep > 1:
            raise ConfigError(f"{flag}{ep}: the model has no mixture-of-experts layers, so there are no experts to "
                              "split; use ep 1")
        if expert_tp is not None and expert_tp != tp:
            raise ConfigError(f"{etp_flag}{expert_tp}: the model has no mixture-of-experts layers; leave expert "
                              "tensor parallelism out")
        return
    check_moe_runtime(shape, runtime)
    if ep > 1 and not runtime.expert_parallel:
        others = " or ".join(r.name for r in RUNTIMES.values() if r.expert_parallel) or "none"
        raise ConfigError(f"{flag}{ep}: the {runtime.name} runtime has no expert parallelism; use ep 1 or "
                          f"--runtime {others}")
    if shape.experts % ep:
        raise ConfigError(f"{flag}{ep} does not divide the {shape.experts} routed experts; valid: "
                          f"{_listed(divisors(shape.experts), ep)}")
    if expert_tp is not None and expert_tp > 1 and not runtime.expert_tensor_parallel and expert_tp != tp:
        raise ConfigError(f"{etp_flag}{expert_tp}: the {runtime.name} runtime splits experts over the "
                          f"tensor-parallel group; leave expert_tp out, or --runtime megatron-core")
    if tp is None:
        return
    if _moe_needs_sequence_parallel(runtime, tp, sequence_parallel):
        raise ConfigError(f"tp={tp} without sequence parallelism: the {runtime.name} runtime trains "
                          "mixture-of-experts layers with tensor parallelism only under sequence parallelism; drop "
                          "--no-sequence-parallel (Python: sequence_parallel=None or True), or use tp 1")
    etp = tp if expert_tp is None else expert_tp
    valid_etp = expert_tp_values(shape, tp, runtime)
    if etp not in valid_etp:
        if not runtime.expert_tensor_parallel:
            raise ConfigError(f"{etp_flag}{etp}: the {runtime.name} runtime splits experts over the tensor-parallel "
                              f"group (tp {tp}); use expert_tp {tp}, or --runtime megatron-core")
        raise ConfigError(f"{etp_flag}{etp} does not divide tp={tp} (the expert-tensor-parallel group lies inside "
                          f"the tensor-parallel one); valid: {_listed(valid_etp, etp)}")
    if dp is None:
        return
    ranks = tp * cp * dp
    if ranks % (ep * etp):
        raise ConfigError(f"{flag}{ep} x {etp_flag}{etp} = {ep * etp} does not divide the stage's tp x cp x dp = "
                          f"{ranks} ranks (Megatron-Core folds the experts' ranks into them); valid ep: "
                          f"{_listed(ep_values(shape, tp, dp, etp, runtime, cp), ep)}")


# ------------------------------------------------------------------------------------ devices and batch


def check_devices(tp: int, pp: int, dp: int, cluster: Cluster, cp: int = 1, global_batch: int | None = None,
                  micro_batch: int | None = None) -> None:
    """tp x cp x pp x dp devices fit the cluster; the hint is the largest dp that fits it and, where
    ``global_batch`` is given, divides it, times ``micro_batch`` where that is pinned (a dp check_batch then
    accepts)."""
    needed = tp * cp * pp * dp
    if needed > cluster.num_devices:
        most = cluster.num_devices // (tp * cp * pp)
        step = micro_batch or 1
        fit = next((d for d in range(most, 0, -1) if global_batch is None or global_batch % (d * step) == 0), 0)
        hint = f"nearest valid dp: {fit}" if fit >= 1 else f"use a smaller tp, {'cp, ' if cp > 1 else ''}or pp"
        if cp > 1:
            raise ConfigError(f"tp x cp x pp x dp = {tp} x {cp} x {pp} x {dp} = {needed} devices, but the cluster "
                              f"has {cluster.num_devices}; {hint}")
        raise ConfigError(f"tp x pp x dp = {tp} x {pp} x {dp} = {needed} devices, but the cluster has "
                          f"{cluster.num_devices}; {hint}")


def micro_batch_choices(per_replica: int) -> list[int]:
    """The micro-batches a replica of ``per_replica`` samples may run when the choice is free, smallest first:
    those that divide it, up to :data:`MAX_MICRO_BATCH` (estimate's resolution and the search's space alike)."""
    return [d for d in divisors(per_replica) if d <= MAX_MICRO_BATCH]


def check_batch(global_batch: int, dp: int, micro_batch: int | None) -> None:
    """dp divides the global batch, and dp x micro-batch too."""
    gb = global_batch
    if gb % dp:
        lo, hi = (gb // dp) * dp, (gb // dp + 1) * dp
        raise ConfigError(f"global batch {gb} is not divisible by dp={dp}; nearest valid global batch: "
                          f"{nearest(gb, [v for v in (lo, hi) if v > 0])}")
    if micro_batch is None:
        return
    mb = micro_batch
    if mb < 1:
        raise ConfigError(f"micro-batch={mb} must be a positive integer")
    if gb % (dp * mb):
        step = dp * mb
        lo, hi = (gb // step) * step, (gb // step + 1) * step
        raise ConfigError(f"global batch {gb} is not divisible by dp x micro-batch = {dp} x {mb} = {step}; "
                          f"nearest valid global batch: {nearest(gb, [v for v in (lo, hi) if v > 0])}, "
                          f"or nearest valid micro-batch: {nearest(mb, divisors(gb // dp))}")


EP_OVERLAP_DTYPES = ("bf16", "fp16", "fp8")  # 16-bit weights (fp8 GEMMs train bf16 weights)


def ep_overlap_choices(runtime: Runtime, ep: int | None, recompute: str | None, dtype: str | None
                       ) -> tuple[bool, ...]:
    """Expert-parallel overlap off, and on where the runtime has it, ep > 1, recompute is not full and the
    weights are 16-bit (``None``: not fixed; a pipeline also needs vpp > 1: :func:`max_pipeline`)."""
    allowed = runtime.ep_overlap and (ep is None or ep > 1) and recompute != "full" \
        and (dtype is None or base_dtype(dtype) in EP_OVERLAP_DTYPES)
    return (False, True) if allowed else (False,)


def ep_overlap_pipeline_fits(pp: int | None, vpp: int | None, schedule: str | None = None) -> bool:
    """Whether expert-parallel overlap runs on this pipeline (None: not fixed): one stage, or the interleaved
    schedule (vpp > 1), whose steps Megatron-Core merges."""
    return pp is None or pp <= 1 or not ((vpp is not None and vpp < 2) or schedule in ("1f1b", "gpipe"))


def check_ep_overlap(ep_overlap: bool | None, ep: int | None, pp: int | None, vpp: int | None,
                     recompute: str | None, dtype: str | None, runtime: Runtime, schedule: str | None = None,
                     shape: ModelShape | None = None) -> None:
    """A pinned ``ep_overlap`` against the model's experts (``shape``; None: not known), the other pinned
    choices (None: not fixed) and the runtime."""
    if not ep_overlap:
        return
    fix = "; leave --ep-overlap out"
    if shape is not None and not shape.experts:
        raise ConfigError(f"ep_overlap: the model has no mixture-of-experts layers, so no expert-parallel "
                          f"all-to-all to overlap{fix}")
    if not runtime.ep_overlap:
        others = " or ".join(r.name for r in RUNTIMES.values() if r.ep_overlap) or "none"
        raise ConfigError(f"ep_overlap: the {runtime.name} runtime does not overlap the expert-parallel "
                          f"all-to-alls with computation{fix}, or use --runtime {others}")
    if ep is not None and ep < 2:
        raise ConfigError(f"ep_overlap with ep={ep}: there is no expert-parallel all-to-all to overlap{fix}, or "
                          "set --ep above 1")
    if recompute == "full":
        raise ConfigError(f"ep_overlap with recompute=full: Megatron-Core overlaps the all-to-alls only without "
                          f"full recomputation{fix}, or use --recompute none or selective")
    if dtype is not None and base_dtype(dtype) not in EP_OVERLAP_DTYPES:
        raise ConfigError(f"ep_overlap with dtype={dtype}: Megatron-Core overlaps the all-to-alls only with bf16 "
                          f"or fp16 weights{fix}, or use --dtype bf16")
    if not ep_overlap_pipeline_fits(pp, vpp, schedule):
        raise ConfigError(f"ep_overlap with pp={pp} and no interleaving: Megatron-Core merges the steps of the "
                          f"interleaved schedule only{fix}, or use --vpp 2 or more (or pp 1)")


def recompute_choices(runtime: Runtime) -> tuple[str, ...]:
    """The recompute choices left free ones resolve to under ``runtime``, simplest first. Where selective
    recompute re-runs the attention core, under FlashAttention it has nothing to recompute (the scores never
    reach memory) and is the plan without recompute, so it is not searched; pinned, it is still accepted and
    estimated as that plan."""
    skip = ("selective",) if runtime.selective_recomputes_nothing else ()
    return tuple(r for r in RECOMPUTE_CHOICES if r in runtime.recompute_choices and r not in skip)


def sequence_parallel_choices(runtime: Runtime, tp: int | None) -> tuple[bool, ...]:
    """Sequence parallelism off, and on where ``runtime`` has it and tp may exceed 1 (``tp`` None: free)."""
    return (False, True) if runtime.sequence_parallel and tp != 1 else (False,)


def check_numerics(recompute: str | None, optimizer: str, dtype: str | None, sequence_parallel: bool | None,
                   tp: int | None, runtime: Runtime) -> None:
    """The enum fields, and sequence parallelism against tp (``tp`` None: not fixed) and the runtime."""
    if recompute is not None:
        check_choice("recompute", recompute, RECOMPUTE_CHOICES)
        if recompute not in runtime.recompute_choices:
            raise ConfigError(f"recompute {recompute}: the {runtime.name} runtime offers "
                              f"{', '.join(recompute_choices(runtime))}; use one of them or another --runtime")
    check_choice("optimizer", optimizer, OPTIMIZERS)
    if dtype is not None:
        check_choice("dtype", base_dtype(dtype), DTYPES)
        if base_dtype(dtype) == FP8 and not runtime.fp8:
            others = " or ".join(r.name for r in RUNTIMES.values() if r.fp8)
            raise ConfigError(f"dtype fp8: the {runtime.name} runtime has no fp8 training; use --dtype bf16, or "
                              f"--runtime {others}")
    if sequence_parallel and tp == 1:
        raise ConfigError("sequence parallelism needs tensor parallelism (tp > 1); drop --sequence-parallel "
                          "or use tp 2 or more")
    if sequence_parallel and not runtime.sequence_parallel:
        raise ConfigError(f"sequence parallelism: the {runtime.name} runtime has none; drop --sequence-parallel "
                          "or use another --runtime")


# ------------------------------------------------------------------------------------ whole configuration


def check_config(model: LayerGraph, cluster: Cluster, config: ParallelConfig) -> None:
    """Raise ConfigError for the first rule ``config`` breaks (estimate's check: tp, pp, dp left out are 1)."""
    config = config.with_unit_degrees()
    tp, pp, dp, gb = config.tp, config.pp, config.dp, config.global_batch
    for name, value in (("tp", tp), ("pp", pp), ("dp", dp)):
        degree(value, name)  # the message ParallelConfig gives a negative degree
    if not isinstance(gb, int) or gb < 1:
        raise ConfigError(f"global batch={gb} must be a positive integer")
    if not model.layers:
        raise ConfigError(f"model {model.name!r} has no layers to place")
    runtime = get_runtime(config.runtime)
    shape = ModelShape.of(model)
    cp = 1 if config.cp is None else config.cp
    check_cp(cp, shape, runtime)
    pools = pools_touched(cluster, tp * cp * pp * dp)
    check_tp(tp, shape, cluster, runtime, pools)
    check_pp(pp, shape, runtime)
    check_devices(tp, pp, dp, cluster, cp, gb, config.micro_batch)
    check_cp_pools(tp, cp, cluster, pools)
    check_batch(gb, dp, config.micro_batch)
    check_schedule(config.schedule, config.vpp, pp, runtime)
    uneven = config.first_stage_layers is not None or config.last_stage_layers is not None
    if uneven:
        if not runtime.uneven_pipeline:
            raise ConfigError(f"first/last stage layers: the {runtime.name} runtime splits the layers evenly over "
                              f"the pipeline stages; leave them out, or use --runtime {_uneven_runtimes()}")
        stage_blocks(shape.num_units, pp, config.vpp or 1, config.first_stage_layers, config.last_stage_layers)
    if config.vpp is not None:
        m = Batching.of(config).num_micro_batches if config.micro_batch else None
        # with first/last counts, stage_blocks has shared the layers out over the chunks
        check_vpp_shape(config.vpp, pp, shape.num_units, m, runtime=runtime, layout=uneven)
    if config.zero is not None:
        check_zero(config.zero, pp, runtime, tp=tp)
    check_numerics(config.recompute, config.optimizer, config.dtype, config.sequence_parallel, tp, runtime)
    check_recipe_choice(config.dtype, config.fp8_recipe)
    check_experts(config.ep or 1, config.expert_tp, tp, dp, shape, runtime, cp,
                  sequence_parallel=config.sequence_parallel)
    check_ep_overlap(config.ep_overlap, config.ep, pp, config.vpp, config.recompute, config.dtype, runtime,
                     config.schedule, shape)


def simplicity_key(zero: int, recompute: str, tp: int, pp: int) -> tuple[int, int, int, int]:
    """The tie rule's order: lower ZeRO, no recompute over selective over full, smaller tp, smaller pp."""
    return zero, RECOMPUTE_CHOICES.index(recompute), tp, pp


def format_launches(fmt: str, runtime: str) -> bool:
    """Whether ``fmt``'s launch options (``FORMAT_RUNTIMES``) run ``runtime``: always for a format of no
    framework (table, json)."""
    allowed = FORMAT_RUNTIMES.get(fmt)
    return allowed is None or get_runtime(runtime).name in allowed


def runtime_for_format(fmt: str, runtime: str | None) -> str | None:
    """The runtime a plan printed as ``fmt`` is made for: the asked one, which must be able to produce the
    format; or, left out, the format's framework (None: resolved by :func:`resolve_runtime`)."""
    allowed = FORMAT_RUNTIMES.get(fmt)
    if allowed is None:
        return runtime
    if runtime is None:
        return allowed[0]
    name = get_runtime(runtime).name
    if not format_launches(fmt, name):
        raise ConfigError(f"--runtime {name} cannot produce --format {fmt}, which writes the launch options of "
                          f"{' or '.join(allowed)}; use --runtime {allowed[0]}, or leave --runtime out")
    return name


def refused_rule(refusal: ConfigError) -> str:
    """The rule a refusal names, without the fix its message goes on to suggest (the text before its first
    "; ")."""
    return str(refusal).split("; ")[0]


def resolve_runtime(runtime: str | Runtime | None, runs: Callable[[str], object]) -> tuple[str, str]:
    """The runtime a configuration is made for, and a note saying why where it is not the one named or the
    default (else ""). Named (``runtime`` not None), that runtime, whatever it refuses. Left out, the default
    where it runs the configuration, else the first of ``RUNTIME_PREFERENCE`` that runs it; where none does,
    the default's refusal is raised, or, where its fix names another runtime and the others refuse other
    choices (so each refusal's fix would send the user to a runtime that refuses another), one error naming
    each runtime's refusal. ``runs(name)`` applies the caller's rules (estimate's :func:`check_config`,
    the search's pins) to its configuration under the runtime ``name``, raising ConfigError where one fails."""
    if runtime is not None:
        return get_runtime(runtime).name, ""
    try:
        runs(DEFAULT_RUNTIME)
        return DEFAULT_RUNTIME, ""
    except ConfigError as exc:
        refusal = exc
    others = RUNTIME_PREFERENCE[1:]
    reason = refused_rule(refusal)  # the rule each runtime breaks, without its fix
    reasons = {DEFAULT_RUNTIME: reason}
    for name in others:
        try:
            runs(name)
        except ConfigError as exc:
            reasons[name] = refused_rule(exc)
            continue
        return name, (f"runtime {name}: none was named and the default cannot run the pinned choices ({reason}); "
                      f"{name} is the first of {', '.join(others)} that runs them all (name one with --runtime to "
                      "choose another)")
    # the default's refusal stands where its fix does not send the user to another runtime (a cp that does not
    # divide the sequence: the others refuse cp itself, but no runtime runs that value), or where every runtime
    # breaks the same rule; the rules' messages name "--runtime" exactly where another runtime runs the choice
    if "--runtime" not in str(refusal) or len(set(reasons.values())) == 1:
        raise refusal
    said = "; ".join(f"{name}: {why}" for name, why in reasons.items())
    raise ConfigError(f"no runtime runs all the pinned choices ({said}); unpin or change one of them")
