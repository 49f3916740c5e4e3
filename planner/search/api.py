"""``planner.plan`` / ``planner.search.search``: find the fastest plan that fits, prove it, explain it."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Callable

import numpy as np

from planner import arguments, compose
from planner.errors import ConfigError, InfeasibleError
from planner.hardware.cluster import arranged, pooled
from planner.hardware.efficiency import resolve_dtype
from planner.hardware.fp8 import cost_dtype, resolve_fp8_recipe
from planner.plans import Plan, SearchInfo
from planner.rules import TIE_TOLERANCE, ModelShape, resolve_runtime, unit_flags
from planner.runtime import get_runtime
from planner.solver import SolverOptions
from planner.search import engine
from planner.search.backend import Backend
from planner.search.build import relabelled, to_plan
from planner.search.explain import bottleneck, tie_note
from planner.search.interleave import searched_units
from planner.search.space import Pins, Settings, StageOption, cp_searched, validate_pins
from planner.types import MAX_GLOBAL_BATCH, Cluster, Estimate, LayerGraph, ParallelConfig, PipelineSpec
from planner.units import GIB


ALGORITHM = "branch-and-bound over settings x stage blocks; bottleneck DP on a critical-path bound per layout"


@dataclass(frozen=True)
class SearchResult:
    """The K best plans (best first) and how the search went; ``proven_optimal`` is the first plan's."""

    plans: tuple[Plan, ...]
    proven_optimal: bool
    lower_bound_s: float
    time_s: float
    candidates_evaluated: int

    @property
    def best(self) -> Plan:
        return self.plans[0]


# the most plans one search returns: each is timed by the cost model and the search's cutoff is the K-th best
# time, so a large K times most of the space
MAX_TOP_K = 100


def default_backend(model: LayerGraph, cluster: Cluster) -> Backend:
    from planner.search.costmodel import CostModelBackend  # the full cost model, imported on first use
    return CostModelBackend(model, cluster)


def search(model: LayerGraph, cluster: Cluster, global_batch: int, *, pinned: ParallelConfig | None = None,
           top_k: int = 1, time_limit_s: float | None = None, tables=None,
           backend: Backend | None = None, progress: Callable[[float], None] | None = None,
           budget: int | None = None, options: SolverOptions | None = None, uniform: bool = False) -> SearchResult:
    """The ``top_k`` fastest plans that fit, best first. ``pinned`` fields that are set are fixed; ``uniform``
    keeps to plans the framework exports launch (every stage on one tp and cp, one replica group each:
    :func:`planner.rules.uniform_stages`), as ``planner plan --format megatron|deepspeed|torchtitan`` does.

    ``options`` (planner.solver.SolverOptions; None: the default) is both searches' work and the seed of the
    table sharder's random choices. The dense search spends at most ``planner.search.engine.DEFAULT_WORK_UNITS
    x options.work`` work units (layouts whose partition is solved plus plans timed by the cost model; the
    same on any machine), a limit the default leaves far above every measured search; ``budget`` (work units)
    caps that further, the smaller applying, and ``time_limit_s`` (wall clock) stops it too. A limit stops the
    search only once it holds a plan; the result then says whether it is still proven optimal and its lower
    bound. For a model with sparse embedding tables (the model's, or ``tables``: a table file or
    EmbeddingTables), the dense part is searched here and the tables are sharded and joined by planner.compose,
    with ``options`` (the sharder's work, a multiple of its default budget, and its seed). With no time limit
    the search is deterministic: the dense search makes no random choice and the sharder's are seeded."""
    return compose.search(model, cluster, global_batch, pinned=pinned, top_k=top_k, time_limit_s=time_limit_s,
                          tables=tables, backend=backend, progress=progress, budget=budget, options=options,
                          uniform=uniform)


def check_search_arguments(global_batch: object, time_limit_s: object, budget: object, pinned: object,
                           options: object) -> tuple[int, float | None, int | None]:
    """The arguments every search takes (plan's, and each what-if point's), checked: ConfigError naming the
    one at fault; the numbers are returned as the Python int and float the search uses."""
    arguments.optional(pinned, ParallelConfig, "pinned", "give planner.ParallelConfig(global_batch=..., zero=1, ...) "
                       "(the fields left out are searched) or None")
    arguments.optional(options, SolverOptions, "options", arguments.SOLVER_OPTIONS_FIX)
    return (arguments.whole(global_batch, "global_batch", most=MAX_GLOBAL_BATCH),
            None if time_limit_s is None else arguments.seconds(time_limit_s, "time_limit_s"),
            None if budget is None else arguments.whole(budget, "budget"))


def search_dense(model: LayerGraph, cluster: Cluster, global_batch: int, *, pinned: ParallelConfig | None = None,
                 top_k: int = 1, time_limit_s: float | None = None, backend: Backend | None = None,
                 progress: Callable[[float], None] | None = None, budget: int | None = None,
                 finish: Callable[[Plan, Estimate], Plan] | None = None,
                 admit: Callable[[Estimate], bool] | None = None,
                 options: SolverOptions | None = None, uniform: bool = False) -> SearchResult:
    """:func:`search` of a dense model. ``finish`` (planner.compose's join of the sparse tables) is applied
    to each plan with its dense estimate before the plan's bottleneck sentence is written, so the sentence
    weighs what ``finish`` adds to ``breakdown["embedding_s"]``. ``admit`` (planner.compose's check that the
    sparse tables fit beside a dense estimate; None: every plan) turns plans away during the search, which
    then goes on to the next ones, so ``finish`` only sees admitted plans. Both get the estimate with the
    device ids of ``cluster`` as given."""
    global_batch, time_limit_s, budget = check_search_arguments(global_batch, time_limit_s, budget, pinned, options)
    top_k = arguments.whole(top_k, "top_k", most=MAX_TOP_K)
    if pinned is not None and pinned.global_batch != global_batch:
        raise ConfigError(f"pinned global_batch {pinned.global_batch} differs from global_batch {global_batch}; "
                          "give the same value (or pass pinned=None)")
    if not model.layers:
        raise ConfigError(f"model {model.name!r} has no layers (pipeline units) to place")
    arguments.instance(uniform, bool, "uniform", "give True (every stage on one tp and cp, as the framework exports "
                       "need) or False")
    arguments.optional(backend, Backend, "backend", "give None (the cost model) or an object with the methods of "
                       "planner.search.backend.Backend; 'process' and 'ray' are planner.whatif's backends")
    arguments.function(progress, "progress", "progress(fraction)")
    named = pinned.runtime if pinned is not None else None
    if named is not None:
        get_runtime(named)  # an unknown name fails here, before the search
    listed = cluster  # the plan reports the groups as given; the search places stages on pools of them
    arranged_cluster, listed_ids = arranged(cluster)
    cluster = pooled(arranged_cluster)
    devices = [g.node.device for g in cluster.groups]
    dtype = resolve_dtype(devices, pinned.dtype if pinned is not None else None)
    recipe = resolve_fp8_recipe(devices, dtype, pinned.fp8_recipe if pinned is not None else None)
    # the search carries the fp8 recipe on the cost model's dtype key (planner.hardware.fp8.cost_dtype)
    pins = dataclasses.replace(Pins.from_config(pinned), dtype=cost_dtype(dtype, recipe), shape=ModelShape.of(model),
                               uniform=uniform)
    kinds = [layer.kind for layer in model.layers]
    units = unit_flags(kinds)

    def validated(runtime: str) -> Pins:
        """The pins under ``runtime``, checked (:func:`validate_pins`)."""
        ruled = dataclasses.replace(pins, runtime=runtime)
        validate_pins(ruled, cluster, global_batch, len(model.layers), sum(units))
        return ruled

    runtime, runtime_note = resolve_runtime(named, validated)
    pins = validated(runtime)
    backend = backend if backend is not None else default_backend(model, cluster)

    def listed_spec(cand: engine.Candidate) -> tuple[PipelineSpec, Estimate]:
        """The candidate's spec and estimate with the device ids of the cluster as given."""
        return (cand.spec, cand.estimate) if listed_ids is None else relabelled(cand.spec, cand.estimate, listed_ids)

    outcome = engine.run(backend, cluster, len(model.layers), global_batch, pins, top_k=top_k,
                         time_limit_s=time_limit_s, progress=progress, budget=budget, units=units,
                         interleave=searched_units(kinds) > 0, tie_tolerance=TIE_TOLERANCE, options=options,
                         admit=None if admit is None else lambda cand: admit(listed_spec(cand)[1]))
    if not outcome.candidates:  # a limit never ends a search before its first plan
        raise InfeasibleError(_why_infeasible(model, cluster, global_batch, pins, backend))
    info = SearchInfo(time_s=outcome.time_s, candidates_evaluated=outcome.bounded + outcome.solved,
                      proven_optimal=outcome.proven_optimal, lower_bound_s=outcome.lower_bound_s,
                      algorithm=ALGORITHM, cp_searched=cp_searched(cluster, pins),
                      vpp_searched=outcome.vpp_values, uneven_stages_searched=outcome.uneven)
    built = []
    refused: InfeasibleError | None = None  # the first plan whose tables found no placement
    for cand in outcome.candidates:
        # a simpler plan taken over a faster one is not itself the proven optimum, nor one after a plan refused
        slower = outcome.fastest is not None and cand.time_s > outcome.fastest.time_s
        spec, estimate = listed_spec(cand)
        timed = to_plan(model, listed, spec, estimate, dataclasses.replace(
            info, proven_optimal=info.proven_optimal and not slower and refused is None), "")
        embedding_s, joined_memory = 0.0, None
        if finish is not None:
            try:
                timed = finish(timed, estimate)
            except InfeasibleError as exc:  # admitted, yet the sharder placed no tables beside it: the next plan
                refused = refused or exc
                continue
            embedding_s = float(timed.breakdown.get("embedding_s", 0.0))
            joined_memory = timed.memory_per_device_bytes
        # the sentence weighs each part's share of the whole iteration, embeddings included
        built.append(dataclasses.replace(timed, bottleneck=bottleneck(
            estimate, cand.settings.num_micro_batches(global_batch), embedding_s, joined_memory)))
    if not built and refused is not None:
        raise refused
    if outcome.fastest is not None and len(built) == len(outcome.candidates):  # the tie rule's choice, said
        note = tie_note(outcome.candidates[0], outcome.fastest, TIE_TOLERANCE)
        built[0] = dataclasses.replace(built[0], bottleneck=f"{built[0].bottleneck} {note}".strip())
    if runtime_note:  # the runtime taken for the one left out, said on every plan made under it
        said = f"{runtime_note[0].upper()}{runtime_note[1:]}."
        built = [dataclasses.replace(p, bottleneck=f"{p.bottleneck} {said}".strip()) for p in built]
    # proven as the first plan is: a simpler plan taken over a faster one is not
    return SearchResult(plans=tuple(built), proven_optimal=built[0].search.proven_optimal,
                        lower_bound_s=info.lower_bound_s, time_s=outcome.time_s,
                        candidates_evaluated=info.candidates_evaluated)


def plan(model: LayerGraph, cluster: Cluster, global_batch: int, *, pinned: ParallelConfig | None = None,
         top_k: int = 1, time_limit_s: float | None = None, tables=None,
         backend: Backend | None = None, progress: Callable[[float], None] | None = None,
         budget: int | None = None, options: SolverOptions | None = None, uniform: bool = False) -> Plan:
    """The fastest plan that fits (see :func:`search`)."""
    return search(model, cluster, global_batch, pinned=pinned, top_k=top_k, time_limit_s=time_limit_s,
                  tables=tables, backend=backend, progress=progress, budget=budget, options=options,
                  uniform=uniform).best


def _why_infeasible(model: LayerGraph, cluster: Cluster, global_batch: int, pins: Pins, backend: Backend) -> str:
    """The memory the model needs at the most memory-frugal settings, against what the cluster has."""
    frugal = Settings(micro_batch=pins.micro_batch or 1, dp=pins.dp or 1,
                      zero=pins.zero if pins.zero is not None else 0,
                      recompute=pins.recompute or "full", sequence_parallel=bool(pins.sequence_parallel),
                      optimizer=pins.optimizer, dtype=pins.dtype, runtime=pins.runtime)
    option = StageOption(0, 1)
    table = backend.layer_table(option, frugal)
    state = float(np.asarray(backend.static_bytes(np.array([table.params_per_rank.sum()]), option, frugal))[0])
    act = float(table.act_bytes.sum())
    have = sum(g.num_devices * g.node.device.memory_bytes for g in cluster.groups)
    largest = max(cluster.groups, key=lambda g: g.node.device.memory_bytes).node.device
    need_devices = math.ceil(state / largest.memory_bytes)
    pinned = [f"--{name.replace('_', '-')}" for name in ("tp", "pp", "dp", "micro_batch", "zero", "recompute")
              if getattr(pins, name) not in (None, 0)]
    fix = (f"unpin {', '.join(pinned)} so the search may shard further, or " if pinned else "")
    if need_devices > cluster.num_devices:
        more = f"add devices (at least {need_devices} x {largest.name} just for the model states)"
    else:  # the states alone would fit evenly spread; activations, buffers and whole layers per stage do not
        more = (f"add devices (the model states alone would fill {need_devices} x {largest.name} of the "
                f"{cluster.num_devices} devices, leaving too little for activations, buffers and whole layers per "
                "stage)")
    samples = f"{frugal.micro_batch} sample{'' if frugal.micro_batch == 1 else 's'}"
    kept = "without recompute" if frugal.recompute == "none" else f"with {frugal.recompute} recompute"
    return (f"no plan of {model.name!r} fits {cluster.name or 'the cluster'} at global batch {global_batch}: "
            f"its weights, gradients and optimizer states take {state / GIB:.1f} GiB "
            f"(plus {act / GIB:.2f} GiB of activations per micro-batch of {samples} {kept}), while the cluster's "
            f"{cluster.num_devices} devices hold {have / GIB:.1f} GiB in all and sharding is limited by tp "
            f"within a node and one layer per stage; {fix}{more}, or use a smaller model")
