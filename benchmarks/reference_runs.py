"""The published reference runs (benchmarks/data/calibration_runs.json) as the cost model sees them.

Each run is a GPT model built with ``planner.builders``, a cluster of the run's nodes, the training runtime its
source used, and the configurations the source allows: what it states is pinned, what it leaves open
(micro-batch, virtual stages, "unknown" recompute, sequence parallelism, ZeRO) spans every value the runtime
can run. ``calibrate.py`` fits against the range of predicted times over those configurations, never against
the cost model's favourite; ``plan_quality.py`` and the calibration test read the runs from here too.
"""

from __future__ import annotations

import itertools
import json
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

from planner.builders import build
from planner.cost import estimate
from planner.cost.calibration import DeviceCalibration
from planner.errors import PlannerError
from planner.graph import import_model_proto
from planner.hardware import catalog, load_cluster
from planner.cost.validate import divisors, pipeline_units
from planner.runtime import Runtime, get_runtime
from planner.types import Estimate, ParallelConfig

ROOT = Path(__file__).resolve().parents[1]
RUNS_PATH = ROOT / "benchmarks" / "data" / "calibration_runs.json"

# the training stack of each source (matched on the start of a run's "source")
RUNTIME_OF_SOURCE = {
    "Narayanan et al. SC'21": "megatron-lm-2021",
    "Megatron-LM README (Megatron-Core": "megatron-core",
}
# what a source states in its text rather than per run: the Megatron-LM README runs with
# --overlap-param-gather, which exists only with the distributed optimizer (ZeRO-1), and with --tp-comm-overlap,
# which Transformer Engine's userbuffers run only with sequence parallelism (so wherever tp > 1)
STATED_BY_SOURCE = {
    "Megatron-LM README (Megatron-Core": {"zero": 1, "sequence_parallel_when_tp": True},
}
RECOMPUTE = ("none", "selective", "full")
MAX_OPEN_MICRO_BATCH = 16  # open micro-batches span the divisors of the per-replica batch up to this


def vpp_choices(model, pp: int, num_micro_batches: int, runtime: Runtime) -> list[int]:
    """Virtual stages per device the runtime can interleave: equal chunks of the pipeline units, and a
    number of micro-batches that is a multiple of pp (Megatron-LM's interleaved schedule)."""
    units = pipeline_units(model)
    if pp == 1 or not runtime.interleaved or units % pp or num_micro_batches % pp:
        return [1]
    return [v for v in divisors(units // pp) if units % (pp * v) == 0]


def load_runs(path: Path = RUNS_PATH) -> list[dict]:
    return json.loads(Path(path).read_text())["runs"]


def source_of(run: dict) -> str:
    """The run's source without its table number (the unit left out together by leave-one-source-out)."""
    for prefix in RUNTIME_OF_SOURCE:
        if run["source"].startswith(prefix):
            return prefix
    raise KeyError(f"{run['id']}: no runtime known for source {run['source']!r}")


def runtime_of(run: dict) -> str:
    return RUNTIME_OF_SOURCE[source_of(run)]


@dataclass(frozen=True)
class Prediction:
    """The fastest and slowest feasible predictions over the configurations a run's source allows."""

    low_s: float
    high_s: float
    low: ParallelConfig
    high: ParallelConfig

    def error(self, measured_s: float) -> float:
        """Signed relative distance from ``measured_s`` to the range (0 inside it)."""
        if measured_s < self.low_s:
            return (self.low_s - measured_s) / measured_s
        if measured_s > self.high_s:
            return (self.high_s - measured_s) / measured_s
        return 0.0


class Run:
    """One published run: its model, cluster, runtime, device type and the configurations left open."""

    def __init__(self, run: dict, runtime: str | None = None, node_name: str | None = None) -> None:
        self.run = run
        self.id: str = run["id"]
        self.source = source_of(run) if runtime is None else run["source"]
        self.runtime = runtime_of(run) if runtime is None else runtime
        node = catalog.get_node(node_name or run["node"])
        self.device: str = node.device.name
        self.cluster = load_cluster(f"{node.name}*{-(-run['gpus'] // node.devices_per_node)}")
        self.measured_s = float(run["derived_iteration_time_s"])

    @cached_property
    def model(self):
        m = self.run["model"]
        settings = {"layers": m["layers"], "hidden": m["hidden"], "heads": m["heads"], "vocab": m["vocab"],
                    "seq_len": m["seq_len"], "ffn": m["ffn"]}
        return import_model_proto(build(m["family"], settings), {"batch": 1}, name=self.id)

    def published(self) -> ParallelConfig:
        """What the source states; every other field left to resolve. Free-text values ("full (uniform, 1
        layer)", "3 (FSDP FULL_SHARD)") are read by their first word."""
        r = self.run
        stated = STATED_BY_SOURCE.get(self.source, {})
        recompute = str(r.get("recompute") or "").split(" ")[0] or None
        zero = str(r["zero"]).split(" ")[0] if r.get("zero") is not None else None
        sp = r.get("sequence_parallel")
        if sp is None and "sequence_parallel_when_tp" in stated:
            sp = stated["sequence_parallel_when_tp"] and r["tp"] > 1
        return ParallelConfig(global_batch=r["global_batch"], tp=r["tp"], pp=r["pp"], dp=r["dp"],
                              micro_batch=r["micro_batch"],
                              recompute=recompute if recompute in RECOMPUTE else None,
                              sequence_parallel=sp,
                              zero=int(zero) if zero is not None and zero.isdigit() else stated.get("zero"),
                              dtype=r.get("dtype"), runtime=self.runtime)

    @cached_property
    def configurations(self) -> tuple[ParallelConfig, ...]:
        """Every fully pinned configuration the source allows and the runtime can run."""
        base = self.published()
        runtime = get_runtime(self.runtime)
        per_replica = base.global_batch // base.dp
        mbs = [base.micro_batch] if base.micro_batch else \
            [b for b in range(1, min(per_replica, MAX_OPEN_MICRO_BATCH) + 1) if per_replica % b == 0]
        recomputes = [base.recompute] if base.recompute else list(RECOMPUTE)
        sps = [base.sequence_parallel] if base.sequence_parallel is not None else \
            ([False, True] if base.tp > 1 else [False])
        zeros = [base.zero] if base.zero is not None else \
            [z for z in runtime.zero_stages if base.pp == 1 or z <= runtime.max_pipeline_zero]
        out = []
        for mb, rc, sp, zero in itertools.product(mbs, recomputes, sps, zeros):
            for vpp in vpp_choices(self.model, base.pp, base.global_batch // (base.dp * mb), runtime):
                out.append(ParallelConfig(global_batch=base.global_batch, tp=base.tp, pp=base.pp, dp=base.dp,
                                          micro_batch=mb, recompute=rc, sequence_parallel=sp, zero=zero, vpp=vpp,
                                          dtype=base.dtype, runtime=self.runtime))
        return tuple(out)

    def estimate(self, cal: DeviceCalibration, config: ParallelConfig) -> Estimate:
        return estimate(self.model, self.cluster, config, {self.device: cal})

    def predict(self, cal: DeviceCalibration,
                configs: tuple[ParallelConfig, ...] | None = None) -> Prediction:
        """The feasible range over ``configs`` (default: every configuration the source allows). Where none
        fits in memory, the least memory-hungry one stands for the run."""
        timed: list[tuple[float, ParallelConfig]] = []
        tightest: tuple[float, float, ParallelConfig] | None = None
        for config in configs or self.configurations:
            try:
                est = self.estimate(cal, config)
            except PlannerError:
                continue
            if est.feasible:
                timed.append((est.iteration_time_s, config))
            elif tightest is None or est.memory_per_device_bytes < tightest[0]:
                tightest = (est.memory_per_device_bytes, est.iteration_time_s, est.config)
        if not timed:
            if tightest is None:
                raise PlannerError(f"{self.id}: no configuration the source allows can be estimated")
            timed = [(tightest[1], tightest[2])]
        low = min(timed, key=lambda item: item[0])
        high = max(timed, key=lambda item: item[0])
        return Prediction(low[0], high[0], low[1], high[1])
