"""The search backend over the full cost model (``planner.cost``): per-segment quantities for the partition
DP from the cost model's own per-layer costs, memory formula, transfer and synchronisation times, and
``estimate_pipeline`` to time every plan the search keeps.

It builds, for a stage served by one replica group, what ``planner.cost.estimator`` computes, from the
same functions: forward/backward/activation sums over the stage's layers, the largest transient, the
boundary transfer to the next stage's first device, what ZeRO-2/3's per-micro-batch collectives add to
each micro-batch (``planner.cost.comm``: exactly for ZeRO-2, the lower bound
``zero3_exposed_lower_s`` of ZeRO-3's layer recurrence), and each stage's once-per-iteration
synchronisation (``planner.cost.comm.sync_tail_s``) plus the optimizer step, weighted as
``planner.search.backend`` says. ``tests/test_search_costmodel.py`` checks that the bound it builds never
exceeds what ``estimate_pipeline`` returns, under each weighting, and equals it for one stage.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

import numpy as np

from planner.cost import estimate_pipeline, layer_costs, optimizer_time_s, stage_memory
from planner.cost.calibration import DeviceCalibration, calibration_for
from planner.cost.comm import (dp_group, dp_sync, layer_collective_s, micro_batch_reduce_s, one_after_other,
                               sync_tail_s, tied_grad_sync_s, zero3_exposed_lower_s)
from planner.cost.memory import micro_batches_in_flight, prefix_tied_params, segment_tied_params
from planner.cost.moe import ep_group_devices, expert_dp, expert_dp_devices, merged_ratio, resolved_expert_tp
from planner.hardware.cluster import locate
from planner.hardware.collectives import CommGroup, p2p_time_s
from planner.runtime import get_runtime
from planner.search.backend import (EXPOSURES, FIRST, MEAN, LayerTable, StagePieces, exposure_weights,
                                    least_boundary, segment_max, segment_sums, send_target, stage_pieces,
                                    weighted_matrices)
from planner.search.space import Layout, Settings, StageOption
from planner.search.tables import allocate, first_devices
from planner.types import Cluster, Estimate, LayerGraph, PipelineSpec


@dataclass(frozen=True)
class CostModelBackend:
    model: LayerGraph
    cluster: Cluster
    _tables: dict = field(default_factory=dict, compare=False, repr=False)
    _p2p: dict = field(default_factory=dict, compare=False, repr=False)  # per pair of node positions
    _p2p_pairs: dict = field(default_factory=dict, compare=False, repr=False)  # per pair of devices
    _segments: dict = field(default_factory=dict, compare=False, repr=False)
    _tail_cache: dict = field(default_factory=dict, compare=False, repr=False)
    _collectives: dict = field(default_factory=dict, compare=False, repr=False)
    _layout_pieces_cache: dict = field(default_factory=dict, compare=False, repr=False)  # the last layout's

    def _cal(self, option: StageOption, settings: Settings) -> DeviceCalibration:
        return calibration_for(self.cluster.groups[option.pool].node.device.name, settings.runtime)

    @staticmethod
    def _table_key(option: StageOption, settings: Settings) -> tuple:
        """What a stage option's per-layer costs depend on (the settings' dp, ZeRO and optimizer do not)."""
        return (option, settings.micro_batch, settings.recompute, settings.sequence_parallel, settings.dtype,
                settings.runtime, settings.ep, settings.expert_tp, settings.ep_overlap)

    def layer_table(self, option: StageOption, settings: Settings) -> LayerTable:
        key = self._table_key(option, settings)
        hit = self._tables.get(key)
        if hit is None:
            node = self.cluster.groups[option.pool].node
            cal = self._cal(option, settings)
            etp = resolved_expert_tp(option.tp, settings.expert_tp)
            group = None
            if settings.ep > 1:  # the expert-parallel group of the pool's first stage (planner.cost.moe)
                first = self.cluster.groups[option.pool].first_device
                span = range(first, first + settings.ep * etp)
                group = dp_group(self.cluster, ep_group_devices(span, settings.ep, etp), cal)
            lc = layer_costs(self.model, node, option.tp, settings.micro_batch, settings.recompute,
                             settings.sequence_parallel, settings.dtype, cal, settings.runtime, cp=option.cp,
                             ep=settings.ep, expert_tp=etp, ep_group=group)
            forward, backward = lc.forward_s, lc.backward_s
            if settings.ep_overlap:  # each layer's forward and backward scaled to its merged step (a bound)
                scale = merged_ratio(lc.merged_s, forward, backward)
                forward, backward = forward * scale, backward * scale
            hit = LayerTable(forward_s=forward, backward_s=backward, params_per_rank=lc.params_per_rank,
                             act_bytes=lc.activation_bytes, peak_bytes=lc.peak_extra_bytes,
                             output_bytes=lc.output_bytes)
            self._tables[key] = hit
            self._tables[("experts",) + key] = lc.expert_params_per_rank
        return hit

    def _expert_params(self, option: StageOption, settings: Settings) -> np.ndarray:
        """Per layer, the routed experts' parameters per rank (zeros on a dense model)."""
        self.layer_table(option, settings)
        return self._tables[("experts",) + self._table_key(option, settings)]

    def _expert_dp(self, option: StageOption, settings: Settings) -> float:
        """The expert-data-parallel degree of a stage (planner.cost.moe.expert_dp; dp on a dense model)."""
        if not self.model_has_experts:
            return float(settings.dp * option.cp)
        return float(expert_dp(option.tp, settings.dp, settings.ep, resolved_expert_tp(option.tp, settings.expert_tp),
                               option.cp))

    def _state_dp(self, option: StageOption, settings: Settings) -> float:
        """The data-parallel degree the memory bounds shard every parameter over: the larger of dp x cp (the
        ranks that hold a copy of the weights) and the expert dp, so that the probed (affine) memory never exceeds
        the cost model's, where the routed experts shard over the expert dp and the rest over dp (``_memory_of`` is
        exact)."""
        return max(float(settings.dp * option.cp), self._expert_dp(option, settings))

    @functools.cached_property
    def model_has_experts(self) -> bool:
        return any(layer.moe is not None for layer in self.model.layers)

    @functools.cached_property
    def model_has_tied_weights(self) -> bool:
        return any(layer.tied_params for layer in self.model.layers)

    @staticmethod
    def _pipelined(settings: Settings, num_stages: int) -> bool:
        """pp > 1 where the settings' runtime costs a pipeline otherwise (``Runtime.depends_on_pipeline``), so that
        the caches below hold one entry for every depth of the other runtimes."""
        return num_stages > 1 and get_runtime(settings.runtime).depends_on_pipeline

    def _depths(self, settings: Settings) -> tuple[bool, ...]:
        """The ``pipelined`` values whose stage memory may differ under the settings' runtime."""
        return (False, True) if self._pipelined(settings, 2) else (False,)

    # static_bytes and stage_bytes bound the memory of a stage in any pipeline: the least of a stage's memory
    # with and without pp > 1 (a runtime may hold less in a pipeline, DeepSpeed's sharded ZeRO-0 states, or
    # more, FSDP2's deferred unsharded gradients); for each built-in runtime one of the two is the least
    # everywhere, so the bound stays affine

    def static_bytes(self, params_per_rank: np.ndarray, option: StageOption, settings: Settings) -> np.ndarray:
        def held(pipelined: bool) -> np.ndarray:
            mem = stage_memory(np.asarray(params_per_rank, dtype=float), 0.0, 0, settings.zero,
                               self._state_dp(option, settings), settings.optimizer, settings.dtype,
                               runtime=settings.runtime, pipelined=pipelined)
            return mem.weights_bytes + mem.gradients_bytes + mem.optimizer_bytes
        return functools.reduce(np.minimum, map(held, self._depths(settings)))

    def stage_bytes(self, params_per_rank: np.ndarray, act_bytes: np.ndarray, in_flight: float,
                    peak_bytes: np.ndarray, option: StageOption, settings: Settings) -> np.ndarray:
        return functools.reduce(np.minimum, (
            stage_memory(params_per_rank, act_bytes, in_flight, settings.zero, self._state_dp(option, settings),
                         settings.optimizer, settings.dtype, peak_bytes, settings.runtime,
                         pipelined=pipelined).total_bytes for pipelined in self._depths(settings)))

    def capacity_bytes(self, option: StageOption) -> float:
        return float(self.cluster.groups[option.pool].node.device.memory_bytes)

    def _p2p_coefficients(self, src: int, dst: int, option: StageOption, settings: Settings
                          ) -> tuple[float, float]:
        """(fixed seconds, seconds per byte) of a boundary transfer from device ``src`` to ``dst`` (the time is
        affine in the bytes, so two probes per pair of node positions)."""
        pair = (src, dst, option, settings.runtime)
        coef = self._p2p_pairs.get(pair)
        if coef is None:
            key = (locate(self.cluster, src), locate(self.cluster, dst), option, settings.runtime)
            coef = self._p2p.get(key)
            if coef is None:
                scale = self._cal(option, settings).comm_scale
                t1, t2 = (p2p_time_s(self.cluster, src, dst, x) / scale for x in (1e6, 2e6))
                slope = (t2 - t1) / 1e6
                coef = (t1 - slope * 1e6, slope)
                self._p2p[key] = coef
            self._p2p_pairs[pair] = coef
        return coef

    def _send_s(self, src: int, dst: int, output_bytes: np.ndarray, option: StageOption,
                settings: Settings) -> np.ndarray:
        """Boundary transfer times after each layer from device ``src`` to ``dst``."""
        fixed, per_byte = self._p2p_coefficients(src, dst, option, settings)
        out = np.asarray(output_bytes, dtype=float)
        return np.where(out > 0, fixed + per_byte * out, 0.0)

    def _segments_of(self, option: StageOption, settings: Settings) -> tuple[np.ndarray, ...]:
        """(forward, backward, params per rank, activation bytes, transient peak) per segment i..j."""
        key = self._table_key(option, settings)
        hit = self._segments.get(key)
        if hit is None:
            t = self.layer_table(option, settings)
            params = segment_sums(t.params_per_rank) + segment_tied_params(self.model, option.tp)
            hit = (segment_sums(t.forward_s), segment_sums(t.backward_s), params, segment_sums(t.act_bytes),
                   segment_max(t.peak_bytes))
            self._segments[key] = hit
        return hit

    def _memory_of(self, option: StageOption, settings: Settings, pipelined: bool
                   ) -> tuple[np.ndarray, np.ndarray]:
        """Per segment: memory with no micro-batch in flight, and what each one in flight adds (the cost
        model's stage memory is affine in the micro-batches in flight); ``pipelined``: pp > 1."""
        key = ("memory", option, settings, pipelined)
        hit = self._segments.get(key)
        if hit is None:
            _, _, params, act, peak = self._segments_of(option, settings)
            experts = segment_sums(self._expert_params(option, settings)) if self.model_has_experts else 0.0
            zero, one = (stage_memory(params, act, n, settings.zero, settings.dp * option.cp, settings.optimizer,
                                      settings.dtype,
                                      peak, settings.runtime, expert_params_per_rank=experts,
                                      expert_dp=self._expert_dp(option, settings), pipelined=pipelined).total_bytes
                          for n in (0, 1))
            hit = (zero, one - zero)
            self._segments[key] = hit
        return hit

    def exposures(self, settings: Settings) -> tuple[str, ...]:
        # ZeRO-3's backward here is a lower bound of the cost model's, so no stage's head start is subtracted
        return tuple(e for e in EXPOSURES if e != MEAN) if settings.zero == 3 else EXPOSURES

    def stage_matrices(self, layout: Layout, settings: Settings, global_batch: int, exposure: str = FIRST
                       ) -> tuple[np.ndarray, np.ndarray]:
        key = (layout, settings, global_batch)
        hit = self._layout_pieces_cache.get(key)
        if hit is None:  # the search asks for each weighting of a layout in turn: only the last layout is kept
            self._layout_pieces_cache.clear()
            hit = self._layout_pieces_cache[key] = self._layout_pieces(layout, settings, global_batch)
        pieces, devices = hit
        P = layout.num_stages
        pipelined = self._pipelined(settings, P)
        weights = exposure_weights(exposure, P)
        tails = []
        for k, option in enumerate(layout.options):
            # a tied weight's copies are reduced between stage 0 and the stage holding the copy, the last
            # stage's as far as stage 0 can tell; without tied weights no partner, so that the tails of
            # layouts whose stage 0 sits elsewhere are shared
            partner = devices[P - 1 if k == 0 else 0][0] if self.model_has_tied_weights else None
            # stage 0 starts at layer 0: its prefixes are all it needs
            tails.append(None if weights[k] == 0 else self._tails(option, devices[k], settings, first=k == 0,
                                                                  partner=partner, pipelined=pipelined))
        return weighted_matrices(pieces, tails, exposure)

    def _layout_pieces(self, layout: Layout, settings: Settings, global_batch: int
                       ) -> tuple[StagePieces, list[tuple[int, ...]]]:
        """What every weighting of the layout's bound shares, and its stages' devices."""
        m = settings.num_micro_batches(global_batch)
        P = layout.num_stages
        pipelined = self._pipelined(settings, P)
        devices = allocate(self.cluster, layout, settings)
        all_forwards = get_runtime(settings.runtime).interleaved_all_forwards_at_pp
        fwd, bwd, sends, fits = [], [], [], []
        for k, option in enumerate(layout.options):
            f, b, params, act, peak = self._segments_of(option, settings)
            extra_f, extra_b = self._zero_per_micro_batch(option, devices[k], settings, pipelined)
            fwd.append(f + extra_f)
            bwd.append(b + extra_b)
            sends.append(self._sends(layout, settings, devices, k))
            # the DP's feasibility mask: the runtime's own warm-up, as the estimator times the plan it returns
            in_flight = micro_batches_in_flight(k, P, m, settings.schedule, settings.vpp, all_forwards,
                                                settings.ep_overlap)
            empty, per_micro_batch = self._memory_of(option, settings, pipelined)
            fits.append(empty + in_flight * per_micro_batch <= self.capacity_bytes(option))
        return stage_pieces(fwd, bwd, sends, fits, m, settings.vpp, all_forwards, settings.ep_overlap), devices

    def _sends(self, layout: Layout, settings: Settings, devices: list[tuple[int, ...]], k: int
               ) -> np.ndarray | None:
        """Stage k's send time after each layer (None where it sends nothing)."""
        to = send_target(layout.num_stages, settings.vpp, k)
        if to is None:
            return None
        return self._send_s(devices[k][0], devices[to][0], self._boundary_bytes(layout, settings, k)[0],
                            layout.options[k], settings)

    def _boundary_bytes(self, layout: Layout, settings: Settings, k: int) -> tuple[np.ndarray, float]:
        """Stage k's boundary bytes after each layer, and the least over the layers it may end at."""
        option = layout.options[k]
        key = ("boundary", option, settings, k + 1 == layout.num_stages)
        hit = self._segments.get(key)
        if hit is None:
            output_bytes = self.layer_table(option, settings).output_bytes
            if k + 1 == layout.num_stages:  # the wrap-around carries a chunk boundary: the cost model's figure
                output_bytes = np.full_like(output_bytes, output_bytes[:-1].max(initial=0.0))
            hit = self._segments[key] = (output_bytes, least_boundary(output_bytes, k + 1 == layout.num_stages))
        return hit

    def send_floors(self, layout: Layout, settings: Settings) -> list[float]:
        firsts = first_devices(self.cluster, layout, settings)
        P = layout.num_stages
        inner: dict[StageOption, float] = {}  # an option's least boundary but for the last stage's
        out = []
        for k, option in enumerate(layout.options):
            to = send_target(P, settings.vpp, k)
            if to is None:
                out.append(0.0)
                continue
            least = inner.get(option) if k + 1 < P else None
            if least is None:
                least = self._boundary_bytes(layout, settings, k)[1]
                if k + 1 < P:
                    inner[option] = least
            if least > 0:
                fixed, per_byte = self._p2p_coefficients(firsts[k], firsts[to], option, settings)
                out.append(fixed + per_byte * least)
            else:
                out.append(0.0)
        return out

    def _dp(self, option: StageOption, devices: tuple[int, ...], settings: Settings
            ) -> tuple[CommGroup, dict[str, np.ndarray]]:
        """The stage's data-parallel group and each layer's collective over it, per kind."""
        key = (option, devices, settings.dtype, settings.runtime)
        hit = self._collectives.get(key)
        if hit is None:
            group = dp_group(self.cluster, devices[::option.tp], self._cal(option, settings))
            params = self.layer_table(option, settings).params_per_rank
            runtime = get_runtime(settings.runtime)
            hit = (group, {kind: layer_collective_s(kind, params, group, settings.dtype, runtime)
                           for kind in ("all_reduce", "reduce_scatter", "all_gather")})
            self._collectives[key] = hit
        return hit

    def _expert_dp_group(self, option: StageOption, devices: tuple[int, ...], settings: Settings
                         ) -> CommGroup | None:
        """The expert-data-parallel group of a stage's first rank, as the cost model folds it
        (``planner.cost.moe.expert_dp_devices``); None where it is the stage's data-parallel group."""
        etp = resolved_expert_tp(option.tp, settings.expert_tp)
        if not self.model_has_experts or settings.ep * etp == option.tp:
            return None
        key = ("edp", option, devices, settings.ep, etp, settings.runtime)
        hit = self._collectives.get(key)
        if hit is None:
            hit = self._collectives[key] = dp_group(self.cluster, expert_dp_devices(devices, settings.ep, etp),
                                                    self._cal(option, settings))
        return hit

    def _zero_per_micro_batch(self, option: StageOption, devices: tuple[int, ...], settings: Settings,
                              pipelined: bool) -> tuple[np.ndarray | float, np.ndarray | float]:
        """What ZeRO-2/3's collectives add to each micro-batch's forward and backward, per segment i..j:
        ZeRO-2's reduce-scatter as the estimator times it, ZeRO-3's lower bound (first and last layers);
        ``pipelined``: pp > 1."""
        if settings.zero < 2 or settings.dp * option.cp <= 1:
            return 0.0, 0.0
        key = ("zero", option, devices, settings, pipelined)
        hit = self._segments.get(key)
        if hit is not None:
            return hit
        f, b, params, _, _ = self._segments_of(option, settings)
        group, layer = self._dp(option, devices, settings)
        runtime = get_runtime(settings.runtime)
        rs, ag = layer["reduce_scatter"], layer["all_gather"]
        # the segments' passes depend on the parameters alone: shared by every micro-batch and recompute
        passes_key = ("passes", option, devices, settings.dtype, settings.runtime, pipelined)
        passes = self._collectives.get(passes_key)
        if passes is None:
            passes = self._collectives[passes_key] = (
                dp_sync(2, params, group, settings.dtype, runtime, segment_sums(rs), rs[:, None], segment_sums(ag),
                        ag[:, None], pipelined), segment_sums(ag), segment_sums(rs))
        sync, gathers, reduces = passes
        if settings.zero == 2:
            hit = (0.0, micro_batch_reduce_s(sync, b))
        else:
            forward = self.layer_table(option, settings).forward_s
            hit = zero3_exposed_lower_s(f, b, gathers, reduces, forward[None, :], ag[:, None], ag[None, :],
                                        rs[:, None], runtime.defers_grad_reduce(3, pipelined))
        self._segments[key] = hit
        return hit

    def _tails(self, option: StageOption, devices: tuple[int, ...], settings: Settings, first: bool,
               partner: int | None, pipelined: bool) -> np.ndarray:
        """A stage's exposed once-per-iteration synchronisation plus optimizer step when it holds layers i..j
        (``planner.cost.comm.sync_tail_s`` of the segments, NaN below the diagonal); ``first``: only the
        prefixes 0..j, as a vector. ``partner``: the first device of the stage a tied weight's all-reduce
        pairs this one with (``planner.cost.comm.tied_grad_sync_s``; None: the model ties no weights).
        ``pipelined``: pp > 1."""
        key = (option, settings, devices, first, partner, pipelined)
        hit = self._tail_cache.get(key)
        if hit is not None:
            return hit
        t = self.layer_table(option, settings)
        cal = self._cal(option, settings)
        group, layer = self._dp(option, devices, settings)
        runtime = get_runtime(settings.runtime)
        sums = np.cumsum if first else segment_sums
        grad = layer["all_reduce" if settings.zero == 0 else "reduce_scatter"]
        gather = layer["all_gather"]
        # a segment's parameters with its copies of weights an earlier stage owns (``_segments_of``); a prefix
        # 0..j holds their owners
        params = np.cumsum(t.params_per_rank) if first else self._segments_of(option, settings)[2]
        # the collectives' edge buckets: each segment's first layer
        edge_grad, edge_gather = (grad[0], gather[0]) if first else (grad[:, None], gather[:, None])
        experts = sums(self._expert_params(option, settings))
        edp_group = self._expert_dp_group(option, devices, settings)
        # as the cost model: the routed experts' gradients in their own buffers, over their own group
        dense = params - experts if edp_group is not None and settings.zero < 3 else params
        sync = dp_sync(settings.zero, dense, group, settings.dtype, runtime, sums(grad), edge_grad, sums(gather),
                       edge_gather, pipelined)
        if edp_group is not None and settings.zero < 3:
            sync = one_after_other(sync, dp_sync(settings.zero, experts, edp_group, settings.dtype, runtime,
                                                 pipelined=pipelined))
        out = sync_tail_s(sync, runtime, sums(t.backward_s), sums(t.forward_s))
        if partner is not None and partner != devices[0]:
            tied = prefix_tied_params(self.model, option.tp) if first else segment_tied_params(self.model, option.tp)
            out = out + tied_grad_sync_s(tied, dp_group(self.cluster, [devices[0], partner], cal), settings.dtype,
                                         runtime)
        cells, steps = self._optimizer_steps(option, settings, first, pipelined, params, experts)
        out[cells] = out[cells] + steps
        self._tail_cache[key] = out
        return out

    def _optimizer_steps(self, option: StageOption, settings: Settings, first: bool, pipelined: bool,
                         params: np.ndarray, experts: np.ndarray) -> tuple[tuple | np.ndarray, np.ndarray]:
        """The optimizer step of each segment (``first``: each prefix) of a stage, with the cells they fill; the
        same wherever the stage sits, so shared by every placement of the option."""
        key = ("steps", option, settings, first, pipelined)
        hit = self._collectives.get(key)
        if hit is None:
            device = self.cluster.groups[option.pool].node.device
            cal = self._cal(option, settings)
            edp = self._expert_dp(option, settings)
            # the step's time is not affine in the parameters (memory efficiency grows with size): one call per
            # distinct segment; blocks of identical layers share most of them
            cells = np.arange(len(params)) if first else np.triu_indices(len(params))
            pairs, where = np.unique(np.stack((params[cells], experts[cells])), axis=1, return_inverse=True)
            steps = np.array([optimizer_time_s(float(p), device, settings.optimizer, settings.zero,
                                               settings.dp * option.cp, settings.dtype, cal, settings.runtime,
                                               float(e), edp, pipelined) for p, e in pairs.T])
            hit = self._collectives[key] = (cells, steps[where.ravel()])
        return hit

    def evaluate(self, spec: PipelineSpec) -> Estimate:
        return estimate_pipeline(self.model, self.cluster, spec)
