"""The search space: global choices (:class:`Settings`), per-stage device choices (:class:`StageOption`) and
pipeline shapes (:class:`Layout`), with their enumeration under the user's pins.

A plan in this space is
  * ``settings``: micro-batch ``b``, data-parallel degree ``D`` of every stage, ZeRO stage, recompute,
    sequence parallelism, schedule with its virtual stages ``vpp`` (1F1B, or Megatron-LM's interleaved
    schedule with vpp 2-4: :mod:`planner.search.interleave`), shared by all stages as Megatron-LM and
    DeepSpeed require;
  * a ``layout``: the ordered stages, each on one device pool (a cluster group: GPU type and its nodes)
    with its own tensor-parallel degree ``tp``; stage ``k`` uses ``tp_k * D`` devices of its pool;
  * a layer partition: stage ``k`` holds the contiguous layers ``first_k..last_k`` (uneven splits allowed;
    a whole number of equal chunks per stage when interleaved);
  * or, on a mixed cluster, a single stage whose ``D`` replicas span two pools with batch shares balanced
    by speed (heterogeneous data parallelism, :mod:`planner.search.hetero`).

Pools that would slow the plan are simply left out of the layout (idle devices).
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import permutations
from typing import Iterator, Sequence

from planner.cost.memory import RECOMPUTE_CHOICES
from planner.cost.schedule import SCHEDULES
from planner.errors import ConfigError
from planner.runtime import DEFAULT_RUNTIME
from planner.search.interleave import INTERLEAVED, pipeline_allowed, schedule_for, vpp_choices
from planner.types import Cluster, ParallelConfig, PipelineSpec, StageSpec

ZERO_STAGES = (0, 1, 2, 3)


@dataclass(frozen=True, order=True)
class StageOption:
    """One pipeline stage's devices: ``tp``-way tensor parallel groups on pool ``pool`` (cluster group index)."""

    pool: int
    tp: int

    def most_stages(self, cluster: Cluster, dp: int) -> int:
        """The most pipeline stages this option can take: its pool's devices over tp x dp."""
        return cluster.groups[self.pool].num_devices // (self.tp * dp)


@dataclass(frozen=True, order=True)
class Settings:
    """Choices shared by every stage of a plan."""

    micro_batch: int
    dp: int
    zero: int
    recompute: str
    sequence_parallel: bool
    schedule: str = "1f1b"
    vpp: int = 1
    optimizer: str = "adam"
    dtype: str = "bf16"
    runtime: str = DEFAULT_RUNTIME

    def num_micro_batches(self, global_batch: int) -> int:
        return global_batch // (self.micro_batch * self.dp)

    def pipeline(self, stages: tuple[StageSpec, ...], global_batch: int) -> PipelineSpec:
        """The PipelineSpec of ``stages`` under these settings."""
        return PipelineSpec(stages=stages, global_batch=global_batch, micro_batch=self.micro_batch, vpp=self.vpp,
                            zero=self.zero, recompute=self.recompute, sequence_parallel=self.sequence_parallel,
                            schedule=self.schedule, optimizer=self.optimizer, dtype=self.dtype,
                            runtime=self.runtime)


@dataclass(frozen=True, order=True)
class Layout:
    """The ordered stages' device options."""

    options: tuple[StageOption, ...]

    @property
    def num_stages(self) -> int:
        return len(self.options)


@dataclass(frozen=True)
class Pins:
    """The choices the user fixed (``None`` or 0 = searched)."""

    tp: int = 0
    pp: int = 0
    dp: int = 0
    micro_batch: int | None = None
    vpp: int | None = None
    zero: int | None = None
    recompute: str | None = None
    sequence_parallel: bool | None = None
    schedule: str | None = None
    optimizer: str = "adam"
    dtype: str = "bf16"
    runtime: str = DEFAULT_RUNTIME

    @classmethod
    def from_config(cls, config: ParallelConfig | None) -> "Pins":
        if config is None:
            return cls()
        return cls(tp=config.tp or 0, pp=config.pp or 0, dp=config.dp or 0, micro_batch=config.micro_batch,
                   vpp=config.vpp, zero=config.zero, recompute=config.recompute,
                   sequence_parallel=config.sequence_parallel, schedule=config.schedule,
                   optimizer=config.optimizer, dtype=config.dtype or "bf16",
                   runtime=config.runtime or DEFAULT_RUNTIME)


def powers_of_two_upto(limit: int) -> list[int]:
    out, value = [], 1
    while value <= limit:
        out.append(value)
        value *= 2
    return out


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def validate_pins(pins: Pins, cluster: Cluster, global_batch: int, num_layers: int,
                  num_units: int | None = None) -> None:
    """Reject pins that no plan can satisfy, with a message naming the flag (``num_units``: the model's
    pipeline units, which interleaved chunks split; default every layer)."""
    check_schedule_pins(pins, num_units if num_units is not None else num_layers, global_batch)
    if pins.pp and pins.pp > num_layers:
        raise ConfigError(f"--pp {pins.pp}: the model has only {num_layers} layers (pipeline units); "
                          f"use --pp {num_layers} or fewer")
    if pins.tp and pins.tp > max(g.node.devices_per_node for g in cluster.groups):
        raise ConfigError(f"--tp {pins.tp}: tensor parallelism stays inside a node and the largest node has "
                          f"{max(g.node.devices_per_node for g in cluster.groups)} devices")
    used = max(pins.tp, 1) * max(pins.pp, 1) * max(pins.dp, 1)
    if used > cluster.num_devices:
        raise ConfigError(f"--tp/--pp/--dp: the pinned degrees need {used} devices but the cluster has "
                          f"{cluster.num_devices}")
    per_step = (pins.micro_batch or 1) * max(pins.dp, 1)
    if global_batch % per_step:
        raise ConfigError(f"--global-batch {global_batch} is not divisible by micro-batch x dp = {per_step}; "
                          "change --global-batch, --micro-batch or --dp")


def check_schedule_pins(pins: Pins, num_units: int, global_batch: int = 0) -> None:
    """--vpp and --schedule: the search plans 1F1B and Megatron-LM's interleaved schedule."""
    if pins.schedule is not None and pins.schedule not in SCHEDULES:
        raise ConfigError(f"--schedule {pins.schedule}: not one of {', '.join(SCHEDULES)}")
    if pins.schedule == "gpipe":
        raise ConfigError("--schedule gpipe: the search plans the 1f1b and interleaved schedules (GPipe holds "
                          "every micro-batch's activations); use 'planner estimate --schedule gpipe' to time it")
    vpp = pins.vpp
    if vpp is None:
        if pins.schedule == INTERLEAVED and num_units < 4:
            raise ConfigError(f"--schedule interleaved: the model has {num_units} pipeline units, too few for "
                              "two stages of two chunks each; use --schedule 1f1b")
        return
    if vpp < 1:
        raise ConfigError(f"--vpp {vpp}: must be a positive integer")
    if vpp > 1 and pins.schedule not in (None, INTERLEAVED):
        raise ConfigError(f"--vpp {vpp} needs the interleaved schedule, not {pins.schedule}; "
                          "use --schedule interleaved or --vpp 1")
    if vpp == 1 and pins.schedule == INTERLEAVED:
        raise ConfigError("--schedule interleaved needs --vpp 2 or more (or leave --vpp out)")
    if vpp > 1 and pins.pp == 1:
        raise ConfigError(f"--vpp {vpp} needs pipeline parallelism; use --pp 2 or more, or --vpp 1")
    if vpp > 1 and pins.zero is not None and pins.zero > MAX_PIPELINE_ZERO:
        raise ConfigError(f"--vpp {vpp} needs pipeline stages, which take ZeRO 0 or 1 only, not --zero "
                          f"{pins.zero}; use --zero 1 or --vpp 1")
    if vpp > 1 and pins.pp and pins.micro_batch and pins.dp:
        m = global_batch // (pins.micro_batch * pins.dp) if global_batch else 0
        if m % pins.pp:
            raise ConfigError(f"--vpp {vpp}: the interleaved schedule needs the number of micro-batches ({m}) to "
                              f"be a multiple of --pp {pins.pp}; change --micro-batch or --dp, or use --vpp 1")
    stages = max(pins.pp, 2)
    if vpp > 1 and stages * vpp > num_units:
        raise ConfigError(f"--vpp {vpp}: {stages} stages of {vpp} chunks need {stages * vpp} pipeline units "
                          f"but the model has {num_units}; use --vpp {max(1, num_units // stages)} or fewer")


def tp_choices(cluster: Cluster, pool: int, pins: Pins) -> list[int]:
    """Tensor-parallel degrees allowed on a pool: powers of two dividing the node (tp stays within a node)."""
    per_node = cluster.groups[pool].node.devices_per_node
    choices = [t for t in powers_of_two_upto(per_node) if per_node % t == 0]
    if pins.tp:
        choices = [t for t in choices if t == pins.tp]
    return choices


def enumerate_settings(cluster: Cluster, global_batch: int, pins: Pins, max_micro_batch: int = 64,
                       num_units: int = 1, interleave: bool = True) -> Iterator[Settings]:
    """Every combination of the global choices that divides the batch, deterministic order; interleaved
    settings (vpp > 1, :mod:`planner.search.interleave`) for models of ``num_units`` pipeline units when
    ``interleave`` or a pin asks for them."""
    n = cluster.num_devices
    dps = [pins.dp] if pins.dp else [d for d in divisors(global_batch) if d <= n]
    zeros = [pins.zero] if pins.zero is not None else list(ZERO_STAGES)
    recomputes = [pins.recompute] if pins.recompute else list(RECOMPUTE_CHOICES)
    sps = [pins.sequence_parallel] if pins.sequence_parallel is not None else [False, True]
    asked = interleave or pins.vpp is not None or pins.schedule == INTERLEAVED
    vpps = vpp_choices(pins.vpp, pins.schedule, num_units) if asked else [1]
    for dp in dps:
        per_dp = global_batch // dp if global_batch % dp == 0 else 0
        if not per_dp:
            continue
        mbs = ([pins.micro_batch] if pins.micro_batch
               else [b for b in powers_of_two_upto(min(max_micro_batch, per_dp)) if per_dp % b == 0])
        for b in mbs:
            if per_dp % b:
                continue
            for zero in zeros:
                for rc in recomputes:
                    for sp in sps:
                        for vpp in vpps:
                            if vpp > 1 and (zero > MAX_PIPELINE_ZERO or not _may_interleave(
                                    per_dp // b, vpp, num_units, n // (dp * max(pins.tp, 1)), pins.pp)):
                                continue
                            yield Settings(micro_batch=b, dp=dp, zero=zero, recompute=rc, sequence_parallel=sp,
                                           schedule=schedule_for(vpp), vpp=vpp, optimizer=pins.optimizer,
                                           dtype=pins.dtype, runtime=pins.runtime)


def _may_interleave(num_micro_batches: int, vpp: int, num_units: int, most_stages: int, pinned_pp: int) -> bool:
    """Whether some stage count may interleave ``vpp`` chunks (:func:`planner.search.interleave.pipeline_allowed`)
    with at most ``most_stages`` stages of dp replicas: ZeRO <= 1 is checked by the caller."""
    counts = [pinned_pp] if pinned_pp else range(2, most_stages + 1)
    return any(pipeline_allowed(P, num_micro_batches, vpp, num_units) for P in counts if P <= most_stages)


MAX_PIPELINE_ZERO = 1  # ZeRO-2/3 shard gradients/weights per micro-batch: DeepSpeed refuses them with pp > 1


def settings_allowed(settings: Settings, pins: Pins) -> bool:
    """ZeRO shards over data-parallel ranks: with dp = 1 every stage is the same plan as ZeRO-0."""
    return not (settings.dp == 1 and settings.zero > 0 and pins.zero is None)


def max_stages(settings: Settings, num_layers: int) -> int:
    """Pipeline stages allowed: one per layer at most; one only with ZeRO-2/3."""
    return 1 if settings.zero > MAX_PIPELINE_ZERO else num_layers


def options_allowed(settings: Settings, options: Sequence[StageOption]) -> bool:
    """Sequence parallelism changes nothing when every stage has tp = 1 (the plan without it is kept)."""
    return bool(options) and not (settings.sequence_parallel and all(o.tp == 1 for o in options))


def pool_options(cluster: Cluster, settings: Settings, pins: Pins) -> list[list[StageOption]]:
    """Per pool, the stage options whose tp x dp devices fit in it."""
    return [[StageOption(pool, tp) for tp in tp_choices(cluster, pool, pins) if tp * settings.dp <= group.num_devices]
            for pool, group in enumerate(cluster.groups)]


def ordered_layouts(blocks: Sequence[tuple[int, int, int]], all_orders: bool = True) -> Iterator[Layout]:
    """Layouts from unordered blocks ``(pool, tp, num_stages)``: each pool's stages are contiguous; every
    order of the pools is produced (memory and point-to-point costs depend on the order)."""
    orders = permutations(blocks) if all_orders else [tuple(blocks)]
    for order in orders:
        opts: list[StageOption] = []
        for pool, tp, count in order:
            opts.extend([StageOption(pool, tp)] * count)
        yield Layout(tuple(opts))
