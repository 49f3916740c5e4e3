"""A small closed-form cost model implementing :class:`~planner.search.backend.Backend`.

It exists to cross-check the solvers (DP, ILP, exhaustive enumeration) on random instances independently of
the full cost model in ``planner.cost``: ``evaluate`` recomputes every plan layer by layer in plain Python,
a separate code path from the vectorised segment tables the search builds. Its constants are illustrative
shapes (roofline compute, ring all-reduce, Adam state bytes), not calibrated predictions.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from planner.search.backend import LayerTable
from planner.search.space import Settings, StageOption
from planner.types import Breakdown, Cluster, Estimate, LayerGraph, MemoryBreakdown, ParallelConfig, \
    PipelineSpec, StageEstimate

_EFFICIENCY = 0.5  # illustrative fraction of peak
_BYTES_WEIGHT, _BYTES_GRAD, _BYTES_OPT = 2.0, 2.0, 12.0  # bf16 weights/grads, fp32 master + Adam moments


def pool_of_device(cluster: Cluster) -> np.ndarray:
    """Pool (cluster group) index of every global device id (devices numbered group after group)."""
    return np.concatenate([np.full(g.num_devices, i) for i, g in enumerate(cluster.groups)])


@dataclass(frozen=True)
class SyntheticBackend:
    model: LayerGraph
    cluster: Cluster
    _cache: dict = field(default_factory=dict, compare=False, repr=False)

    # ------------------------------------------------------------------ per-layer, per-option quantities
    def _layer(self, layer, option: StageOption, s: Settings) -> tuple[float, float, float, float, float]:
        node = self.cluster.groups[option.pool].node
        tp, b = option.tp, s.micro_batch
        speed = node.device.peak_flops_per_s["bf16"] * _EFFICIENCY
        passes = {"none": 3.0, "selective": 3.3, "full": 4.0}[s.recompute]
        compute = layer.flops_forward * b * passes / (speed * tp)
        tp_comm = 0.0 if tp == 1 else 4.0 * layer.output_bytes * b * (tp - 1) / tp / node.intra_node_bandwidth_Bps
        shard = 1.0 / tp if s.sequence_parallel else 0.3 + 0.7 / tp
        act = {"none": layer.activation_bytes * b * shard,
               "selective": 0.6 * layer.activation_bytes * b * shard,
               "full": layer.output_bytes * b * (1.0 / tp if s.sequence_parallel else 1.0)}[s.recompute]
        peak = layer.activation_bytes * b * shard if s.recompute == "full" else 0.0
        return compute + tp_comm, layer.params / tp, act, peak, layer.output_bytes * b

    def layer_table(self, option: StageOption, settings: Settings) -> LayerTable:
        key = (option, settings.micro_batch, settings.recompute, settings.sequence_parallel)
        if key not in self._cache:
            rows = np.array([self._layer(layer, option, settings) for layer in self.model.layers], dtype=float)
            self._cache[key] = LayerTable(step_s=rows[:, 0], params_per_rank=rows[:, 1], act_bytes=rows[:, 2],
                                          peak_bytes=rows[:, 3], output_bytes=rows[:, 4])
        return self._cache[key]

    def _state_bytes(self, s: Settings) -> tuple[float, float, float]:
        d = s.dp
        return (_BYTES_WEIGHT / (d if s.zero >= 3 else 1), _BYTES_GRAD / (d if s.zero >= 2 else 1),
                _BYTES_OPT / (d if s.zero >= 1 else 1))

    def static_bytes(self, params_per_rank, option: StageOption, settings: Settings):
        return np.asarray(params_per_rank, dtype=float) * sum(self._state_bytes(settings))

    def _sync_bandwidth_Bps(self, option: StageOption, settings: Settings) -> float:
        node = self.cluster.groups[option.pool].node
        inside = option.tp * settings.dp <= node.devices_per_node
        return node.intra_node_bandwidth_Bps if inside else node.inter_node_bandwidth_Bps / node.devices_per_node

    def tail_s(self, params_per_rank, option: StageOption, settings: Settings):
        p = np.asarray(params_per_rank, dtype=float)
        d = settings.dp
        node = self.cluster.groups[option.pool].node
        volume = 0.0 if d == 1 else 2.0 * (d - 1) / d * 2.0 * (1.5 if settings.zero >= 3 else 1.0)
        sync = p * volume / self._sync_bandwidth_Bps(option, settings)
        opt_states = p * 16.0 / (d if settings.zero >= 1 else 1)
        return sync + opt_states / node.device.memory_bandwidth_Bps

    def p2p_s(self, output_bytes, src: StageOption, dst: StageOption, settings: Settings):
        a, b = self.cluster.groups[src.pool].node, self.cluster.groups[dst.pool].node
        bw = min(a.inter_node_bandwidth_Bps, b.inter_node_bandwidth_Bps) / max(a.devices_per_node, 1)
        return 2.0 * np.asarray(output_bytes, dtype=float) / bw + 2.0 * self.cluster.fabric_latency_s

    def capacity_bytes(self, option: StageOption) -> float:
        return float(self.cluster.groups[option.pool].node.device.memory_bytes)

    def in_flight(self, stage: int, num_stages: int, num_micro_batches: int, settings: Settings) -> int:
        return min(num_stages - stage, num_micro_batches)

    def coefficients(self, num_stages: int, num_micro_batches: int, settings: Settings) -> tuple[float, float]:
        return float(num_micro_batches - 1), 1.0

    # ------------------------------------------------------------------ plain re-evaluation
    def evaluate(self, spec: PipelineSpec) -> Estimate:
        pools = pool_of_device(self.cluster)
        replicas = [stage.replicas[0] for stage in spec.stages]
        dp = replicas[0].dp
        s = Settings(micro_batch=spec.micro_batch, dp=dp, zero=spec.zero, recompute=spec.recompute,
                     sequence_parallel=spec.sequence_parallel, optimizer=spec.optimizer, dtype=spec.dtype)
        options = [StageOption(int(pools[r.devices[0]]), r.tp) for r in replicas]
        m = spec.global_batch // (spec.micro_batch * dp)
        P = len(spec.stages)
        a, r, comm, stages, feasible, worst = [], [], [], [], True, 0.0
        for k, (stage, opt) in enumerate(zip(spec.stages, options)):
            rows = [self._layer(self.model.layers[i], opt, s) for i in range(stage.first_layer, stage.last_layer + 1)]
            step = sum(row[0] for row in rows)
            p2p = 0.0
            if k + 1 < P:
                p2p = float(self.p2p_s(rows[-1][4], opt, options[k + 1], s))
            params = sum(row[1] for row in rows)
            w, g, o = self._state_bytes(s)
            act = sum(row[2] for row in rows) * self.in_flight(k, P, m, s) + max(row[3] for row in rows)
            mem = MemoryBreakdown(weights_bytes=params * w, gradients_bytes=params * g, optimizer_bytes=params * o,
                                  activations_bytes=act)
            cap = self.capacity_bytes(opt)
            feasible &= mem.total_bytes <= cap
            worst = max(worst, mem.total_bytes)
            a.append(step + p2p)
            comm.append(p2p)
            r.append(float(self.tail_s(params, opt, s)))
            stages.append(StageEstimate(index=k, first_layer=stage.first_layer, last_layer=stage.last_layer,
                                        device_type=self.cluster.groups[opt.pool].node.device.name,
                                        devices=replicas[k].devices, tp=opt.tp, dp=dp, forward_s=step / 3.0,
                                        backward_s=step * 2.0 / 3.0, memory=mem, memory_capacity_bytes=cap))
        bottleneck = int(np.argmax(a))
        total = sum(a) + (m - 1) * max(a) + max(r)
        steady = m * a[bottleneck]
        breakdown = Breakdown(compute_s=steady - m * comm[bottleneck], pp_comm_s=m * comm[bottleneck],
                              bubble_s=sum(a) - a[bottleneck], dp_comm_s=max(r))
        config = ParallelConfig(global_batch=spec.global_batch, tp=max(o.tp for o in options), pp=P, dp=dp,
                                micro_batch=spec.micro_batch, vpp=1, zero=spec.zero, recompute=spec.recompute,
                                sequence_parallel=spec.sequence_parallel, schedule="1f1b")
        return Estimate(config=config, iteration_time_s=total, throughput_samples_per_s=spec.global_batch / total,
                        feasible=feasible, memory_per_device_bytes=worst, breakdown=breakdown,
                        stages=tuple(stages), reason="" if feasible else "out of memory")
