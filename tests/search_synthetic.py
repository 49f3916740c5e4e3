"""A small closed-form cost model implementing :class:`~planner.search.backend.Backend`.

It exists to cross-check the solvers (DP, ILP, exhaustive enumeration) on random instances independently of
the full cost model in ``planner.cost``. Its iteration time IS the bound of :mod:`planner.search.backend`
(so the search must find its optimum exactly), and ``evaluate`` recomputes every plan layer by layer in
plain Python, a separate code path from the vectorised segment matrices. Its constants are illustrative
shapes (roofline compute, ring all-reduce, Adam state bytes), not calibrated predictions.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from planner.hardware.cluster import locate
from planner.cost.memory import micro_batches_in_flight
from planner.search.backend import (FIRST, LayerTable, bound_matrices, least_boundary, segment_max, segment_sums,
                                    send_target)
from planner.search.interleave import bound_coefficients, warmup
from planner.search.space import Layout, Settings, StageOption
from planner.types import Breakdown, Cluster, Estimate, LayerGraph, MemoryBreakdown, ParallelConfig, \
    PipelineSpec, StageEstimate

_EFFICIENCY = 0.5  # illustrative fraction of peak
_BYTES_WEIGHT, _BYTES_GRAD, _BYTES_OPT = 2.0, 2.0, 12.0  # bf16 weights/grads, fp32 master + Adam moments


@dataclass(frozen=True)
class SyntheticBackend:
    model: LayerGraph
    cluster: Cluster
    _cache: dict = field(default_factory=dict, compare=False, repr=False)

    # ------------------------------------------------------------------ per-layer, per-option quantities
    def _layer(self, layer, option: StageOption, s: Settings) -> tuple[float, ...]:
        node = self.cluster.groups[option.pool].node
        tp, b = option.tp, s.micro_batch
        speed = node.device.peak_flops_per_s["bf16"] * _EFFICIENCY
        forward = layer.flops_forward * b / (speed * tp)
        tp_comm = 0.0 if tp == 1 else 2.0 * layer.output_bytes * b * (tp - 1) / tp / node.intra_node_bandwidth_Bps
        backward = forward * {"none": 2.0, "selective": 2.3, "full": 3.0}[s.recompute] + tp_comm
        shard = 1.0 / tp if s.sequence_parallel else 0.3 + 0.7 / tp
        act = {"none": layer.activation_bytes * b * shard,
               "selective": 0.6 * layer.activation_bytes * b * shard,
               "full": layer.output_bytes * b * (1.0 / tp if s.sequence_parallel else 1.0)}[s.recompute]
        peak = layer.activation_bytes * b * shard if s.recompute == "full" else 0.0
        return forward + tp_comm, backward, layer.params / tp, act, peak, layer.output_bytes * b

    def layer_table(self, option: StageOption, settings: Settings) -> LayerTable:
        key = (option, settings.micro_batch, settings.recompute, settings.sequence_parallel)
        if key not in self._cache:
            rows = np.array([self._layer(layer, option, settings) for layer in self.model.layers], dtype=float)
            self._cache[key] = LayerTable(*(rows[:, c] for c in range(6)))
        return self._cache[key]

    def _segments(self, option: StageOption, settings: Settings) -> tuple[np.ndarray, ...]:
        key = ("segments", option, settings.micro_batch, settings.recompute, settings.sequence_parallel)
        if key not in self._cache:
            t = self.layer_table(option, settings)
            self._cache[key] = (segment_sums(t.forward_s), segment_sums(t.backward_s),
                                segment_sums(t.params_per_rank), segment_sums(t.act_bytes), segment_max(t.peak_bytes))
        return self._cache[key]

    def _state_bytes(self, s: Settings) -> tuple[float, float, float]:
        d = s.dp
        return (_BYTES_WEIGHT / (d if s.zero >= 3 else 1), _BYTES_GRAD / (d if s.zero >= 2 else 1),
                _BYTES_OPT / (d if s.zero >= 1 else 1))

    def static_bytes(self, params_per_rank: np.ndarray, option: StageOption, settings: Settings) -> np.ndarray:
        return np.asarray(params_per_rank, dtype=float) * sum(self._state_bytes(settings))

    def stage_bytes(self, params_per_rank, act_bytes, in_flight, peak_bytes, option: StageOption,
                    settings: Settings) -> np.ndarray:
        return self.static_bytes(params_per_rank, option, settings) + np.asarray(act_bytes) * in_flight + peak_bytes

    def _tail_s(self, params_per_rank, option: StageOption, settings: Settings):
        p = np.asarray(params_per_rank, dtype=float)
        d = settings.dp
        node = self.cluster.groups[option.pool].node
        inside = option.tp * d <= node.devices_per_node
        bw = node.intra_node_bandwidth_Bps if inside else node.inter_node_bandwidth_Bps / node.devices_per_node
        volume = 0.0 if d == 1 else 2.0 * (d - 1) / d * 2.0 * (1.5 if settings.zero >= 3 else 1.0)
        opt_states = p * 16.0 / (d if settings.zero >= 1 else 1)
        return p * volume / bw + opt_states / node.device.memory_bandwidth_Bps

    def _p2p_s(self, output_bytes, src: StageOption, dst: StageOption):
        a, b = self.cluster.groups[src.pool].node, self.cluster.groups[dst.pool].node
        bw = min(a.inter_node_bandwidth_Bps, b.inter_node_bandwidth_Bps) / max(a.devices_per_node, 1)
        return np.asarray(output_bytes, dtype=float) / bw + self.cluster.fabric_latency_s

    def capacity_bytes(self, option: StageOption) -> float:
        return float(self.cluster.groups[option.pool].node.device.memory_bytes)

    def send_floors(self, layout: Layout, settings: Settings) -> list[float]:
        P = layout.num_stages
        out = []
        for k, option in enumerate(layout.options):
            to = send_target(P, settings.vpp, k)
            least = least_boundary(self.layer_table(option, settings).output_bytes, k + 1 == P)
            out.append(0.0 if to is None else float(self._p2p_s(least, option, layout.options[to])))
        return out

    def exposures(self, settings: Settings) -> tuple[str, ...]:
        return (FIRST,)  # its time counts stage 0's synchronisation alone

    def stage_matrices(self, layout: Layout, settings: Settings, global_batch: int, exposure: str = FIRST
                       ) -> tuple[np.ndarray, np.ndarray]:
        m = settings.num_micro_batches(global_batch)
        P = layout.num_stages
        fwd, bwd, sends, fits = [], [], [], []
        for k, option in enumerate(layout.options):
            t = self.layer_table(option, settings)
            f, b, params, act, peak = self._segments(option, settings)
            fwd.append(f)
            bwd.append(b)
            to = send_target(P, settings.vpp, k)
            sends.append(None if to is None else self._p2p_s(t.output_bytes, option, layout.options[to]))
            in_flight = micro_batches_in_flight(k, P, m, settings.schedule, settings.vpp)
            memory = self.stage_bytes(params, act, in_flight, peak, option, settings)
            fits.append(memory <= self.capacity_bytes(option))
        t0 = self.layer_table(layout.options[0], settings)
        tail0 = self._tail_s(segment_sums(t0.params_per_rank), layout.options[0], settings)
        return bound_matrices(fwd, bwd, sends, fits, [tail0] + [None] * (P - 1), m, settings.vpp)

    # ------------------------------------------------------------------ plain re-evaluation
    def evaluate(self, spec: PipelineSpec) -> Estimate:
        """Layer by layer. A stage with several replica groups (heterogeneous data parallelism) follows the
        full cost model's rules: group r runs m_r = share_r G / (dp_r b) micro-batches per replica, the
        pipeline has M = ceil(max m_r) slots, a stage's slot is its slowest group's (f, b) x m_r / M, each
        group holds its own memory (at most ceil(m_r) micro-batches in flight), ZeRO shards over every
        replica of the stage and stage 0's tail is its slowest group's."""
        dp = sum(r.dp for r in spec.stages[0].replicas)
        s = Settings(micro_batch=spec.micro_batch, dp=dp, zero=spec.zero, recompute=spec.recompute,
                     sequence_parallel=spec.sequence_parallel, schedule=spec.schedule, vpp=spec.vpp,
                     optimizer=spec.optimizer, dtype=spec.dtype)
        shares = {id(r): r.batch_share * spec.global_batch / (r.dp * spec.micro_batch)
                  for stage in spec.stages for r in stage.replicas}
        m = max(1, int(np.ceil(max(shares.values()) - 1e-9)))
        P = len(spec.stages)
        V = spec.vpp
        co = bound_coefficients(P, m, V)
        firsts = [StageOption(locate(self.cluster, st.replicas[0].devices[0])[0], st.replicas[0].tp)
                  for st in spec.stages]
        per, sends, g_terms, stages, work, feasible, worst = [], [], [], [], [], True, 0.0
        tail = 0.0
        for k, stage in enumerate(spec.stages):
            slots, tails, memories = [], [], []
            for r in stage.replicas:
                opt = StageOption(locate(self.cluster, r.devices[0])[0], r.tp)
                rows = [self._layer(self.model.layers[i], opt, s)
                        for i in range(stage.first_layer, stage.last_layer + 1)]
                load = shares[id(r)] / m
                f = sum(row[0] for row in rows) * load
                b = sum(row[1] for row in rows) * load
                slots.append((f + b, f, b, rows[-1][5]))
                params = sum(row[2] for row in rows)
                tails.append(float(self._tail_s(params, opt, s)))
                w, g, o = self._state_bytes(s)
                flight = min(micro_batches_in_flight(k, P, m, spec.schedule, V), np.ceil(shares[id(r)] - 1e-9))
                act = sum(row[3] for row in rows) * flight + max(row[4] for row in rows)
                mem = MemoryBreakdown(weights_bytes=params * w, gradients_bytes=params * g,
                                      optimizer_bytes=params * o, activations_bytes=act)
                cap = self.capacity_bytes(opt)
                feasible &= mem.total_bytes <= cap
                worst = max(worst, mem.total_bytes)
                memories.append((mem, cap, opt))
            _, f, b, out_bytes = max(slots, key=lambda x: x[0])
            to = k + 1 if k + 1 < P else (0 if V > 1 else None)
            send = 0.0 if to is None else float(self._p2p_s(slots[0][3], firsts[k], firsts[to]))
            per.append(f + b / V)
            sends.append(co.hops[k] * send)
            g_terms.append(co.gamma * b + co.delta[k] * f)
            work.append((f, b, send))
            if k == 0:
                tail = max(tails)
            mem, cap, opt = max(memories, key=lambda x: x[0].total_bytes / x[1])
            stages.append(StageEstimate(index=k, first_layer=stage.first_layer, last_layer=stage.last_layer,
                                        device_type=self.cluster.groups[opt.pool].node.device.name,
                                        devices=tuple(d for r in stage.replicas for d in r.devices),
                                        tp=stage.replicas[0].tp, dp=dp, forward_s=f, backward_s=b, memory=mem,
                                        memory_capacity_bytes=cap))
        # the hand-off cycles with each neighbour, one stage's side of each
        for k in range(P - 1):
            w = [warmup(s_, P, m, V) for s_ in (k, k + 1)]
            if w[0] >= m * V or w[0] == w[1]:
                continue
            span = w[0] - w[1] + 1
            n = (m * V - w[0] + span - 2) // span
            for s_, w_ in zip((k, k + 1), w):
                f, b, _ = work[s_]
                g_terms.append(((m * V - 1 - span * n) * b + max(0, m * V - 1 - w_ - span * n) * f) / V
                               + n * (2 * work[k][2] + (f + b) / V))
        pipeline = sum(per) + sum(sends) + max(g_terms)
        total = pipeline + tail
        c = int(np.argmax(per))
        busy = m * per[c]
        breakdown = Breakdown(compute_s=busy, pp_comm_s=sum(sends), bubble_s=pipeline - busy - sum(sends),
                              dp_comm_s=tail)
        config = ParallelConfig(global_batch=spec.global_batch, tp=firsts[0].tp, pp=P, dp=dp,
                                micro_batch=spec.micro_batch, vpp=V, zero=spec.zero, recompute=spec.recompute,
                                sequence_parallel=spec.sequence_parallel, schedule=spec.schedule)
        return Estimate(config=config, iteration_time_s=total, throughput_samples_per_s=spec.global_batch / total,
                        feasible=feasible, memory_per_device_bytes=worst, breakdown=breakdown,
                        stages=tuple(stages), reason="" if feasible else "out of memory")
