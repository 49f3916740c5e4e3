"""The search space: global choices (:class:`Settings`), per-stage device choices (:class:`StageOption`) and
pipeline shapes (:class:`Layout`), with their enumeration under the user's pins.

A plan in this space is
  * ``settings``: micro-batch ``b``, data-parallel degree ``D`` of every stage, ZeRO stage, recompute,
    sequence parallelism, schedule with its virtual stages ``vpp`` (1F1B, or Megatron-LM's interleaved
    schedule with every vpp the rule book allows: :mod:`planner.search.interleave`), shared by all stages as
    Megatron-LM and DeepSpeed require;
  * a ``layout``: the ordered stages, each on one device pool (a cluster group: GPU type and its nodes)
    with its own tensor-parallel degree ``tp`` and context-parallel degree ``cp`` (the sequence of each
    sample split over cp ranks of tp each); stage ``k`` uses ``tp_k * cp_k * D`` devices of its pool;
  * a layer partition: stage ``k`` holds the contiguous layers ``first_k..last_k`` (uneven splits allowed;
    a whole number of equal chunks per stage when interleaved);
  * or, on a mixed cluster, a single stage whose ``D`` replicas span two pools with batch shares balanced
    by speed (heterogeneous data parallelism, :mod:`planner.search.hetero`).

Pools that would slow the plan are simply left out of the layout (idle devices). What exists is the rule
book's (:mod:`planner.rules`) for the model's shape and the runtime in the pins: tp against heads and node
size, cp against the sequence and the runtime, ZeRO against the runtime and the stage count, interleaving
where the runtime has it.

Context parallelism left free is searched over the powers of two the rules allow (:func:`cp_choices`) up to
``CP_MAX_NODES`` nodes of tp x cp and ``CP_MIN_TOKENS_PER_RANK`` tokens per rank, on models whose sequences are
at least ``CP_MIN_SEQ_LEN`` tokens: shorter
ones are searched with cp 1 alone (the plan's ``search.cp_searched`` lists the values searched), so a model of
short sequences is searched as fast as without cp. A pinned ``--cp`` is any value the rules allow.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from itertools import permutations
from typing import Iterator, Sequence

from planner import rules
from planner.errors import ConfigError
from planner.rules import INTERLEAVED, ModelShape
from planner.runtime import DEFAULT_RUNTIME, get_runtime
from planner.search.interleave import pipeline_allowed, schedule_for, vpp_choices
from planner.types import Batching, Cluster, ParallelConfig, PipelineSpec, StageSpec

# a free cp is searched on models whose attention sequences are at least this long: a limit of the search
# space, not a rule (a pinned --cp is any value the rules allow). NeMo's long-context recipes bring context
# parallelism in for 16k and 64k sequences (NeMo Framework user guide, "Long Context Recipes"); from 8k on
# leaves a margin
CP_MIN_SEQ_LEN = 8192
# and up to this many nodes of tp x cp devices (a ring longer than that moves every K/V chunk across as many
# node boundaries; pin --cp to go further)
CP_MAX_NODES = 16
# and with at least this many tokens of each sequence per cp rank: a shorter share leaves every GEMM fewer rows
# than a tile row of 128 per SM pass needs to fill an H100 (132 SMs) and each ring step's attention shorter than
# its K/V chunk's trip across a node boundary; pin --cp to go further
CP_MIN_TOKENS_PER_RANK = 1024


@dataclass(frozen=True, order=True)
class StageOption:
    """One pipeline stage's devices: ``tp``-way tensor parallel groups on pool ``pool`` (cluster group index)."""

    pool: int
    tp: int
    cp: int = 1

    @property
    def ranks(self) -> int:
        """Devices of one data-parallel replica of a stage on this option: tp x cp."""
        return self.tp * self.cp

    def most_stages(self, cluster: Cluster, dp: int) -> int:
        """The most pipeline stages this option can take: its pool's devices over tp x cp x dp."""
        return cluster.groups[self.pool].num_devices // (self.ranks * dp)


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
    ep: int = 1  # expert parallelism of every stage (mixture-of-experts models)
    expert_tp: int = 0  # expert tensor parallelism; 0: each stage's tp (Megatron-Core's default)
    ep_overlap: bool = False  # the expert-parallel all-to-alls under another micro-batch's computation

    def batching(self, global_batch: int) -> Batching:
        """How ``global_batch`` splits under these settings: over dp replicas, in micro-batches."""
        return Batching(global_batch, self.micro_batch, self.dp)

    def num_micro_batches(self, global_batch: int) -> int:
        return self.batching(global_batch).num_micro_batches

    def pipeline(self, stages: tuple[StageSpec, ...], global_batch: int) -> PipelineSpec:
        """The PipelineSpec of ``stages`` under these settings."""
        return PipelineSpec(stages=stages, global_batch=global_batch, micro_batch=self.micro_batch, vpp=self.vpp,
                            zero=self.zero, recompute=self.recompute, sequence_parallel=self.sequence_parallel,
                            schedule=self.schedule, optimizer=self.optimizer, dtype=self.dtype,
                            runtime=self.runtime, ep=self.ep, expert_tp=self.expert_tp, ep_overlap=self.ep_overlap)


@dataclass(frozen=True, order=True)
class Layout:
    """The ordered stages' device options."""

    options: tuple[StageOption, ...]

    @property
    def num_stages(self) -> int:
        return len(self.options)


@dataclass(frozen=True)
class Pins:
    """The choices the user fixed (``None`` or 0 = searched), and the model's shape the rules read (its head
    counts bound tp, its pipeline units pp and vpp; :class:`planner.rules.ModelShape`)."""

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
    shape: ModelShape = ModelShape()
    cp: int = 0
    ep: int | None = None
    expert_tp: int | None = None
    ep_overlap: bool | None = None
    # every stage on the same tp and cp, each served by one replica group: what the framework exports
    # (Megatron-LM, DeepSpeed, torchtitan) can write (planner.rules.uniform_stages)
    uniform: bool = False

    @classmethod
    def from_config(cls, config: ParallelConfig | None) -> "Pins":
        if config is None:
            return cls()
        return cls(tp=config.tp or 0, pp=config.pp or 0, dp=config.dp or 0, micro_batch=config.micro_batch,
                   vpp=config.vpp, zero=config.zero, recompute=config.recompute,
                   sequence_parallel=config.sequence_parallel, schedule=config.schedule,
                   optimizer=config.optimizer, dtype=config.dtype or "bf16",
                   runtime=config.runtime or DEFAULT_RUNTIME, cp=config.cp or 0, ep=config.ep,
                   expert_tp=config.expert_tp, ep_overlap=config.ep_overlap)


def validate_pins(pins: Pins, cluster: Cluster, global_batch: int, num_layers: int,
                  num_units: int | None = None) -> None:
    """Reject pins that no plan can satisfy, with a message naming the flag (:mod:`planner.rules`;
    ``num_units``: the model's pipeline units, default every layer, or the units of ``pins.shape``)."""
    runtime = get_runtime(pins.runtime)
    units = num_units if num_units is not None else (pins.shape.num_units or num_layers)
    shape = ModelShape(pins.shape.heads, units, pins.shape.seq_lens)
    check_schedule_pins(pins, units, global_batch)
    if pins.pp:
        rules.check_pp(pins.pp, shape, runtime, flag="--pp ")
        room = cluster.num_devices // (pins.pp * max(pins.tp, 1) * max(pins.cp, 1))  # the dp the devices hold
        dps = [pins.dp] if pins.dp else [d for d in rules.divisors(global_batch) if d <= room]
        least = min((global_batch // (dp * b) for dp in dps if global_batch % dp == 0
                     for b in ([pins.micro_batch] if pins.micro_batch else
                               rules.micro_batch_choices(global_batch // dp)) if (global_batch // dp) % b == 0),
                    default=0)
        rules.check_pipeline_micro_batches(pins.pp, least, flag="--pp ")
    if pins.tp:
        valid = cluster_tps(cluster, pins)
        if pins.tp not in valid:  # the largest node names the rule (pools of smaller ones are left out anyway)
            pool = max(range(len(cluster.groups)), key=lambda p: cluster.groups[p].node.devices_per_node)
            rules.check_tp(pins.tp, shape, cluster, runtime, [pool], flag="--tp ")
    if pins.cp:
        rules.check_cp(pins.cp, shape, runtime, flag="--cp ")
    if pins.zero is not None:
        rules.check_zero(pins.zero, pins.pp or None, runtime, flag="--zero ", pp_flag="--pp ", tp=pins.tp or None,
                         tp_flag="--tp ")
    rules.check_numerics(pins.recompute, pins.optimizer, pins.dtype, pins.sequence_parallel, pins.tp or None,
                         runtime)
    check_expert_pins(pins)
    rules.check_moe_runtime(pins.shape, runtime)
    rules.check_ep_overlap(pins.ep_overlap, pins.ep, pins.pp or None, pins.vpp, pins.recompute, pins.dtype, runtime,
                           pins.schedule, pins.shape)
    if pins.expert_tp is not None and not pins.tp and pins.shape.experts:
        tps = cluster_tps(cluster, pins)
        hosts = [t for t in tps if pins.expert_tp in rules.expert_tp_values(pins.shape, t, runtime)]
        if not hosts:  # no tp the search may pick takes it: say so, not "does not fit" after the search
            valid = sorted({e for t in tps for e in rules.expert_tp_values(pins.shape, t, runtime)})
            raise ConfigError(f"--expert-tp {pins.expert_tp} divides none of the tp degrees this cluster and model "
                              f"allow ({', '.join(map(str, tps))}); valid: {', '.join(map(str, valid))}")
    used = max(pins.tp, 1) * max(pins.cp, 1) * max(pins.pp, 1) * max(pins.dp, 1)
    if used > cluster.num_devices:
        flags = "--tp/--cp/--pp/--dp" if pins.cp > 1 else "--tp/--pp/--dp"
        raise ConfigError(f"{flags}: the pinned degrees need {used} devices but the cluster has "
                          f"{cluster.num_devices}")
    per_step = (pins.micro_batch or 1) * max(pins.dp, 1)
    if global_batch % per_step:
        raise ConfigError(f"--global-batch {global_batch} is not divisible by micro-batch x dp = {per_step}; "
                          "change --global-batch, --micro-batch or --dp")


def check_expert_pins(pins: Pins) -> None:
    """--ep and --expert-tp against the model's experts and the runtime, and against tp x cp x dp where those
    are pinned, or cp cannot be searched above 1 (:func:`planner.rules.check_experts`)."""
    if pins.ep is None and pins.expert_tp is None:
        return
    runtime = get_runtime(pins.runtime)
    searched_cp = min(pins.shape.seq_lens, default=0) >= CP_MIN_SEQ_LEN and rules.cp_values(pins.shape, runtime) != [1]
    cp = pins.cp or (None if searched_cp else 1)
    rules.check_experts(pins.ep or 1, pins.expert_tp, pins.tp or None,
                        (pins.dp or None) if pins.tp and cp else None, pins.shape, runtime, cp=cp or 1,
                        flag="--ep ", etp_flag="--expert-tp ", sequence_parallel=pins.sequence_parallel)


def expert_choices(pins: Pins) -> list[tuple[int, int]]:
    """(ep, expert_tp) pairs the search enumerates: on a mixture-of-experts model every divisor of the routed
    experts (where the runtime has expert parallelism) with expert_tp = each stage's tp (0) or 1 (the two
    settings Megatron-Core's MoE guide uses; any other expert_tp is searched when pinned); (1, 0) on a dense
    model. Which of them a stage's tp x dp admits is :func:`pool_options`' filter."""
    runtime = get_runtime(pins.runtime)
    if not pins.shape.experts:
        return [(1, 0)]
    eps = [pins.ep] if pins.ep is not None else (rules.divisors(pins.shape.experts) if runtime.expert_parallel else [1])
    etps = [pins.expert_tp] if pins.expert_tp is not None else ([0, 1] if runtime.expert_tensor_parallel else [0])
    return [(ep, etp) for ep in eps for etp in etps]


def check_schedule_pins(pins: Pins, num_units: int, global_batch: int = 0) -> None:
    """--vpp and --schedule: the search plans 1F1B and Megatron-LM's interleaved schedule, where the runtime
    runs it (:func:`planner.rules.check_schedule`)."""
    if pins.schedule == "gpipe":
        raise ConfigError("--schedule gpipe: the search plans the 1f1b and interleaved schedules (GPipe holds "
                          "every micro-batch's activations); use 'planner estimate --schedule gpipe' to time it")
    runtime = get_runtime(pins.runtime)
    rules.check_schedule(pins.schedule, pins.vpp, pins.pp or None, runtime, flag="--schedule ", vpp_flag="--vpp ",
                         pp_flag="--pp ")
    vpp = pins.vpp
    if vpp is None:
        if pins.schedule == INTERLEAVED and num_units < 4:
            raise ConfigError(f"--schedule interleaved: the model has {num_units} pipeline units, too few for "
                              "two stages of two chunks each; use --schedule 1f1b")
        return
    if vpp > 1 and pins.zero is not None and pins.zero > runtime.max_pipeline_zero:
        raise ConfigError(f"--vpp {vpp} needs pipeline stages, which the {runtime.name} runtime combines with ZeRO "
                          f"{runtime.max_pipeline_zero} at most, not --zero {pins.zero}; use --zero "
                          f"{rules.nearest(pins.zero, rules.zero_stages(runtime, 2))} or --vpp 1")
    if vpp > 1:
        m = None
        if pins.pp and pins.micro_batch and pins.dp and global_batch:
            m = Batching(global_batch, pins.micro_batch, pins.dp).num_micro_batches
        rules.check_vpp_shape(vpp, max(pins.pp, 2), num_units, m if pins.pp else None, vpp_flag="--vpp ",
                              pp_flag="--pp ", runtime=runtime if pins.pp else None)


def cluster_tps(cluster: Cluster, pins: Pins) -> list[int]:
    """Every tp degree some pool of the cluster allows (:func:`tp_choices`), ascending."""
    return sorted({t for p in range(len(cluster.groups)) for t in tp_choices(cluster, p, pins)})


def tp_choices(cluster: Cluster, pool: int, pins: Pins) -> list[int]:
    """Tensor-parallel degrees allowed on a pool (:func:`planner.rules.pool_tps`: dividing the node, so a tp
    group stays within one, and the model's heads)."""
    per_node = cluster.groups[pool].node.devices_per_node
    choices = rules.pool_tps(pins.shape, per_node, get_runtime(pins.runtime))
    if pins.tp:
        choices = [t for t in choices if t == pins.tp]
    return choices


def cp_choices(cluster: Cluster, pool: int, pins: Pins, tp: int = 1) -> list[int]:
    """Context-parallel degrees searched on a pool with ``tp``-way groups: the pinned one, or on a model of
    sequences of ``CP_MIN_SEQ_LEN`` tokens or more the powers of two the rules allow
    (:func:`planner.rules.cp_values`) with ``tp x cp`` within ``CP_MAX_NODES`` nodes and the pool."""
    group = cluster.groups[pool]
    if pins.cp:
        return [pins.cp] if rules.cp_pool_fits(tp, pins.cp, group.num_devices) else []
    seq = min(pins.shape.seq_lens, default=0)
    limit = CP_MAX_NODES * group.node.devices_per_node // tp
    return [c for c in rules.cp_values(pins.shape, get_runtime(pins.runtime))
            if c == 1 or (c & (c - 1) == 0 and c <= limit and seq >= CP_MIN_SEQ_LEN
                          and seq // c >= CP_MIN_TOKENS_PER_RANK and rules.cp_pool_fits(tp, c, group.num_devices))]


def cp_searched(cluster: Cluster, pins: Pins) -> tuple[int, ...]:
    """Every cp value the search considers on some pool (for the plan's record of the space searched)."""
    return tuple(sorted({c for pool in range(len(cluster.groups)) for tp in tp_choices(cluster, pool, pins)
                         for c in cp_choices(cluster, pool, pins, tp)}))


def enumerate_settings(cluster: Cluster, global_batch: int, pins: Pins, num_units: int = 1,
                       interleave: bool = True) -> Iterator[Settings]:
    """Every combination of the global choices that divides the batch, deterministic order; interleaved
    settings (vpp > 1, :mod:`planner.search.interleave`) for models of ``num_units`` pipeline units when
    ``interleave`` or a pin asks for them."""
    n = cluster.num_devices
    runtime = get_runtime(pins.runtime)
    dps = [pins.dp] if pins.dp else [d for d in rules.divisors(global_batch) if d <= n]
    zeros = [pins.zero] if pins.zero is not None else list(rules.zero_stages(runtime, pins.pp or None))
    recomputes = [pins.recompute] if pins.recompute else list(rules.recompute_choices(runtime))
    sps = ([pins.sequence_parallel] if pins.sequence_parallel is not None
           else list(rules.sequence_parallel_choices(runtime, pins.tp or None)))
    asked = interleave or pins.vpp is not None or pins.schedule == INTERLEAVED
    least = runtime.interleaved_min_stages
    vpps = vpp_choices(pins.vpp, pins.schedule, num_units, least) if asked and runtime.interleaved else [1]
    experts = expert_choices(pins)
    for dp in dps:
        per_dp = global_batch // dp if global_batch % dp == 0 else 0
        if not per_dp:
            continue
        mbs = [pins.micro_batch] if pins.micro_batch else rules.micro_batch_choices(per_dp)
        for b in mbs:
            if per_dp % b:
                continue
            for zero in zeros:
                for rc in recomputes:
                    for sp in sps:
                        for vpp in vpps:
                            if vpp > 1 and (zero > runtime.max_pipeline_zero or not may_interleave(
                                    per_dp // b, vpp, num_units, n // (dp * max(pins.tp, 1)), pins.pp,
                                    not runtime.uneven_pipeline, least)):
                                continue
                            for ep, etp in experts:
                                overlaps = ([pins.ep_overlap] if pins.ep_overlap is not None
                                            else rules.ep_overlap_choices(runtime, ep, rc, pins.dtype))
                                for overlap in overlaps:
                                    if overlap and not rules.ep_overlap_pipeline_fits(pins.pp or None, vpp):
                                        continue
                                    yield Settings(micro_batch=b, dp=dp, zero=zero, recompute=rc,
                                                   sequence_parallel=sp, schedule=schedule_for(vpp), vpp=vpp,
                                                   optimizer=pins.optimizer, dtype=pins.dtype, runtime=pins.runtime,
                                                   ep=ep, expert_tp=etp, ep_overlap=overlap)


@functools.lru_cache(maxsize=4096)
def may_interleave(num_micro_batches: int, vpp: int, num_units: int, most_stages: int, pinned_pp: int,
                   even: bool, min_stages: int = 2) -> bool:
    """Whether some stage count may interleave ``vpp`` chunks (:func:`planner.search.interleave.pipeline_allowed`;
    ``even``: the runtime splits the units evenly; ``min_stages``: its fewest interleaved stages) with at most
    ``most_stages`` stages (``pinned_pp`` alone where it is pinned, 0 otherwise): ZeRO <= 1 is checked by the
    caller. A pure function of its arguments."""
    # vpp chunks of whole units per stage: at most num_units // vpp stages (planner.rules.vpp_fits)
    counts = [pinned_pp] if pinned_pp else range(2, min(most_stages, num_units // vpp) + 1)
    return any(pipeline_allowed(P, num_micro_batches, vpp, num_units, even, min_stages)
               for P in counts if P <= most_stages)


def settings_allowed(settings: Settings, pins: Pins) -> bool:
    """ZeRO shards over data-parallel ranks: with dp = 1 every stage is the same plan as ZeRO-0."""
    return not (settings.dp == 1 and settings.zero > 0 and pins.zero is None)


def even_split(settings: Settings) -> bool:
    """Whether the settings' runtime splits the pipeline units evenly over the stages (no uneven pipeline)."""
    return not get_runtime(settings.runtime).uneven_pipeline


def interleaved_min_stages(settings: Settings) -> int:
    """The fewest stages the settings' runtime interleaves (``Runtime.interleaved_min_stages``)."""
    return get_runtime(settings.runtime).interleaved_min_stages


def max_stages(settings: Settings, num_units: int, global_batch: int) -> int:
    """Pipeline stages allowed (:func:`planner.rules.max_pipeline`): one per pipeline unit at most (0 units:
    unknown, the caller caps by its layers), one per ``vpp`` units when interleaved (every stage holds whole
    chunks); one only with a ZeRO stage the runtime does not combine with a pipeline, with expert-parallel
    overlap without interleaving, or with more micro-batches of ``global_batch`` per replica than a pipeline is
    timed for."""
    most = rules.max_pipeline(ModelShape(num_units=num_units), get_runtime(settings.runtime), settings.zero,
                              settings.num_micro_batches(global_batch), settings.ep_overlap, settings.vpp)
    return most // settings.vpp if settings.vpp > 1 and most > 1 else most


def options_allowed(settings: Settings, options: Sequence[StageOption], uniform: bool = False) -> bool:
    """Sequence parallelism changes nothing when every stage has tp = 1 (the plan without it is kept);
    ``uniform`` (:attr:`Pins.uniform`): every option on one tp and cp."""
    if uniform and len({(o.tp, o.cp) for o in options}) > 1:
        return False
    return bool(options) and not (settings.sequence_parallel and all(o.tp == 1 for o in options))


def pool_options(cluster: Cluster, settings: Settings, pins: Pins) -> list[list[StageOption]]:
    """Per pool, the stage options whose tp x cp x dp devices fit in it, whose tp x cp x dp the settings' ep
    and expert_tp fold into (:func:`planner.rules.experts_fit`), and whose tp the runtime runs with the
    settings' ZeRO (:func:`planner.rules.tp_zero_fits`)."""
    runtime = get_runtime(pins.runtime)
    return [[StageOption(pool, tp, cp) for tp in tp_choices(cluster, pool, pins)
             for cp in cp_choices(cluster, pool, pins, tp)
             if tp * cp * settings.dp <= group.num_devices and experts_allowed(settings, pins, tp, cp)
             and rules.tp_zero_fits(tp, settings.zero, runtime)]
            for pool, group in enumerate(cluster.groups)]


def experts_allowed(settings: Settings, pins: Pins, tp: int, cp: int = 1) -> bool:
    """Whether a stage of ``tp`` and ``cp`` takes the settings' (ep, expert_tp); expert_tp 1 searched (not
    pinned) on a tp-1 stage is the plan of expert_tp 0, left out."""
    if settings.expert_tp == 1 and tp == 1 and pins.expert_tp is None:
        return False
    return rules.experts_fit(pins.shape, settings.ep, settings.expert_tp or None, tp, settings.dp,
                             get_runtime(settings.runtime), cp, sequence_parallel=settings.sequence_parallel)


def ordered_layouts(blocks: Sequence[tuple[int, ...]], all_orders: bool = True) -> Iterator[Layout]:
    """Layouts from unordered blocks ``(pool, tp, num_stages[, cp])``: each pool's stages are contiguous;
    every order of the pools is produced (memory and point-to-point costs depend on the order)."""
    orders = permutations(blocks) if all_orders else [tuple(blocks)]
    for order in orders:
        opts: list[StageOption] = []
        for pool, tp, count, *cp in order:
            opts.extend([StageOption(pool, tp, cp[0] if cp else 1)] * count)
        yield Layout(tuple(opts))
