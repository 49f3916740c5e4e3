"""What-if analysis: re-plan a model across a grid of cluster, batch and sequence-length changes.

    result = planner.whatif("gpt.onnx", "dgx-a100-80gb*4+dgx-h100*4", 1536,
                            {"dgx-a100-80gb.count": ["0", "4", "8"], "inter_node_bandwidth_GBps": ["25", "50"]})
    result.points[0].throughput_samples_per_s; print(result.to_table()); csv_text = result.to_csv()

Each grid point is the whole pipeline run again with its inputs changed (planner.sweep.keys derives them);
points run on local worker processes or Ray (planner.sweep.runner) and come back in grid order, so the result
does not depend on the number of workers. A point that cannot be planned (the model does not fit, a pinned
choice does not divide the devices) is a row with ``feasible=False`` and the planner's reason; when every
point refuses the pinned configuration (or the fixed plan), the pins (or the plan) are the mistake and ``whatif``
raises ConfigError, as ``plan`` does.

Cost: ``cost_per_hour`` is the price of the nodes the plan uses (a node counts whole when the plan uses any
of its devices; one would not rent the rest), known only when those nodes' groups have ``price_per_node_hour``;
``cost_per_sample`` and ``cost_per_million_tokens`` divide it by the predicted throughput. An infeasible
point reports the price of its whole cluster. A group's price is for its own hardware: a point that gives the
group another node or device, and no swept price, has no price for it (planner.sweep.keys.point_inputs).
Tokens are samples x the model's ``seq`` dimension, where it has one.
"""

from __future__ import annotations

import csv
import functools
import io
import json
import logging
import os
import time
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Iterable, Mapping, Sequence

from planner import arguments
from planner.errors import ConfigError, ModelError, PlannerError
from planner.plans import Plan, SearchInfo
from planner.solver import SolverOptions
from planner.sweep.keys import SEQ_DIM, PointInputs, Value, check_groups, parse_sweeps, point_inputs
from planner.sweep.runner import Progress, default_workers, run_tasks
from planner.types import Cluster, LayerGraph, ParallelConfig

log = logging.getLogger(__name__)
SECONDS_PER_HOUR = 3600.0


@dataclass(frozen=True)
class WhatIfPoint:
    """One grid point: its settings, the best plan's numbers, and what it costs."""

    settings: tuple[tuple[str, Value], ...]
    feasible: bool
    iteration_time_s: float | None = None
    throughput_samples_per_s: float | None = None
    tokens_per_s: float | None = None
    cost_per_hour: float | None = None
    cost_per_sample: float | None = None
    cost_per_million_tokens: float | None = None
    num_devices: int = 0  # devices in the point's cluster
    devices_used: int = 0  # devices the plan uses
    global_batch: int = 0
    seq_len: int | None = None
    pp: int | None = None  # pipeline stages (distinct device sets: a plan may list interleaved chunks)
    tp: int | None = None  # None when stages differ (see ``stages``)
    dp: int | None = None
    micro_batch: int | None = None
    num_micro_batches: int | None = None
    stages: str = ""  # one entry per stage: "device_type tpT dpD layers A-B" ("... + device_type tpT dpD" per group)
    proven_optimal: bool | None = None  # under the cost model (False when a limit cut the search)
    lower_bound_s: float | None = None  # no plan of the point's space is faster (the search's proven bound)
    reason: str = ""  # why infeasible, or empty
    cp: int | None = None  # context-parallel degree; None when stages differ
    ep: int | None = None  # expert-parallel degree (mixtures of experts; 1 on dense models); None when stages differ
    runtime: str = ""  # the plan's runtime: the pinned one, or what a left-out one resolved to (planner.rules)
    search_time_s: float = field(default=0.0, compare=False)  # wall time of planning this point (varies)
    # the planner refused the pinned configuration on this point (a ConfigError), as opposed to finding no
    # plan that fits; not an output column (whatif raises when every point refuses)
    refused: bool = False
    # a limit (budget, work, time) stopped the point's search before it was complete; not an output column
    # (whatif says it once for the sweep)
    stopped_at_limit: bool = False

    @property
    def setting(self) -> dict[str, Value]:
        return dict(self.settings)

    def row(self) -> dict[str, Any]:
        """Flat columns: the swept keys first, then the numbers (the CSV row; no timings)."""
        values = _outputs(self)
        del values["settings"], values["search_time_s"]
        return {**dict(self.settings), **values}

    def to_dict(self) -> dict[str, Any]:
        """JSON form: the timing sits under ``search``, the only part that varies between runs."""
        values = _outputs(self)
        timing = {"time_s": values.pop("search_time_s")}
        return {**values, "settings": dict(self.settings), "search": timing}


#: the fields of a point that are not output (what the sweep itself reads)
_INTERNAL = ("refused", "stopped_at_limit")
#: the columns after the swept keys, in CSV and table order
COLUMNS = tuple(f.name for f in WhatIfPoint.__dataclass_fields__.values()
                if f.name not in ("settings", "search_time_s", *_INTERNAL))


def _outputs(point: WhatIfPoint) -> dict[str, Any]:
    """The point's fields without the internal ones."""
    values = asdict(point)
    for name in _INTERNAL:
        del values[name]
    return values
TABLE_COLUMNS = ("feasible", "iteration_time_s", "throughput_samples_per_s", "cost_per_million_tokens",
                 "devices_used", "pp", "tp", "cp", "ep", "dp", "micro_batch", "reason")


@dataclass(frozen=True)
class WhatIfResult:
    points: tuple[WhatIfPoint, ...]
    keys: tuple[str, ...]  # the swept keys, in grid order (first key varies slowest)
    model: str = ""
    cluster: str = ""
    workers: int | None = 1  # worker processes; None: Ray, as many as the cluster runs
    backend: str = "process"
    elapsed_s: float = field(default=0.0, compare=False)

    @property
    def priced(self) -> bool:
        """Whether any feasible point has a cost (the nodes its plan uses all have prices)."""
        return any(p.feasible and p.cost_per_sample is not None for p in self.points)

    def pareto_front(self) -> tuple[int, ...]:
        """Indices of the feasible priced points that no other point beats on both time per sample and
        cost per sample, ordered by time (fastest first)."""
        candidates = sorted(
            (1.0 / p.throughput_samples_per_s, p.cost_per_sample, i) for i, p in enumerate(self.points)
            if p.feasible and p.cost_per_sample is not None and p.throughput_samples_per_s)
        front: list[int] = []
        best_cost = float("inf")
        for _, cost, index in candidates:
            if cost < best_cost:
                front.append(index)
                best_cost = cost
        return tuple(front)

    def to_dict(self) -> dict[str, Any]:
        """JSON document; timings sit under ``search`` (the only part that varies between runs)."""
        return {
            "model": self.model, "cluster": self.cluster, "keys": list(self.keys),
            "points": [p.to_dict() for p in self.points],
            "pareto_front": list(self.pareto_front()),
            "search": {"time_s": self.elapsed_s, "workers": self.workers, "backend": self.backend},
        }

    def to_json(self, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent, sort_keys=True)

    def columns(self) -> tuple[str, ...]:
        """The swept keys, then every other column (``global_batch``/``seq_len`` once when swept)."""
        return (*self.keys, *(c for c in COLUMNS if c not in self.keys))

    def to_csv(self) -> str:
        """One header line, then one row per point (floats in full precision, empty for unknown)."""
        buffer = io.StringIO()
        writer = csv.DictWriter(buffer, fieldnames=self.columns(), lineterminator="\n")
        writer.writeheader()
        for point in self.points:
            writer.writerow({k: ("" if v is None else v) for k, v in point.row().items()})
        return buffer.getvalue()

    def to_table(self) -> str:
        """A fixed-width text table of the main columns."""
        headers = (*self.keys, *(c for c in TABLE_COLUMNS if c not in self.keys))
        rows = [[_cell(point.row()[h]) for h in headers] for point in self.points]
        widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)]
        lines = ["  ".join(h.ljust(w) for h, w in zip(headers, widths)).rstrip()]
        lines += ["  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in rows]
        feasible = sum(p.feasible for p in self.points)
        runtimes = sorted({p.runtime for p in self.points if p.runtime})  # the CSV has it per row
        lines.append(f"{len(self.points)} points, {feasible} feasible{self._proofs()}"
                     + (f"; runtime {', '.join(runtimes)}" if runtimes else ""))
        return "\n".join(lines)


    def _proofs(self) -> str:
        """How many searched plans are proven optimal, and how far the others can be from their lower bounds
        (empty for a fixed plan's sweep, which searches nothing)."""
        searched = [p for p in self.points if p.feasible and p.proven_optimal is not None]
        if not searched:
            return ""
        proven = sum(bool(p.proven_optimal) for p in searched)
        gaps = [p.iteration_time_s / p.lower_bound_s - 1.0 for p in searched
                if not p.proven_optimal and p.iteration_time_s and p.lower_bound_s]
        within = f" (unproven plans within {max(gaps):.2%} of their lower bounds)" if gaps else ""
        return f", {proven} proven optimal{within}"


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


# ------------------------------------------------------------------------------------------ one point


@dataclass(frozen=True)
class PointTask:
    """Everything a worker needs to evaluate one point (picklable)."""

    model_path: str
    inputs: PointInputs
    pinned: Any = None
    tables: Any = None
    time_limit_s: float | None = None
    budget: int | None = None
    options: SolverOptions | None = None
    plan: Plan | None = None  # re-time this plan's placement at the point instead of planning


@functools.lru_cache(maxsize=8)
def _load_model(path: str, dims: tuple[tuple[str, int], ...], version: tuple[int, int] | None = None) -> LayerGraph:
    """Each worker imports a model once per distinct dims (a sweep of seq_len needs one import per value) and
    file ``version`` (:func:`_file_version`: a file rewritten between two sweeps in one process is imported
    again)."""
    from planner.graph import load_model  # noqa: PLC0415 - keeps `import planner.sweep.whatif` light

    return load_model(path, dict(dims))


def _file_version(path: str) -> tuple[int, int] | None:
    """The file's (modification time in ns, size), which change when it is rewritten; None when it cannot
    be read (the import then says why)."""
    try:
        stat = os.stat(path)
    except (OSError, ValueError):
        return None
    return stat.st_mtime_ns, stat.st_size


_NODES: list = []  # this worker's distinct node profiles, one object per value (the latest few)
_MAX_NODES = 64


def _shared_nodes(cluster: Cluster) -> Cluster:
    """The same cluster with each node profile replaced by an equal one this worker has seen before. Points
    arrive pickled, each with its own copies; the cost model caches per-layer costs by node identity, so
    sharing the objects lets every point after the first reuse them (the numbers are the same)."""
    groups = []
    for group in cluster.groups:
        node = next((n for n in _NODES if n == group.node), None)
        if node is None:
            _NODES.append(group.node)
            del _NODES[:-_MAX_NODES]
            node = group.node
        groups.append(group if node is group.node else replace(group, node=node))
    return replace(cluster, groups=tuple(groups))


def cluster_cost_per_hour(cluster: Cluster, devices: Iterable[int] | None = None) -> float | None:
    """The hourly price of the nodes holding ``devices`` (default: every node), or None when one of those
    nodes' groups has no price."""
    used = None if devices is None else set(devices)
    total = 0.0
    for group in cluster.groups:
        per_node = group.node.devices_per_node
        nodes = group.count if used is None else len(
            {(d - group.first_device) // per_node for d in used
             if group.first_device <= d < group.first_device + group.num_devices})
        if nodes == 0:
            continue
        if group.price_per_node_hour is None:
            return None
        total += float(group.price_per_node_hour) * nodes
    return total if cluster.groups else None


def _uniform(values: Sequence[int]) -> int | None:
    return values[0] if values and all(v == values[0] for v in values) else None


def summarize(settings: tuple[tuple[str, Value], ...], plan: Plan, cluster: Cluster, global_batch: int,
              seq_len: int | None) -> WhatIfPoint:
    """A feasible point from its plan."""
    throughput = plan.throughput_samples_per_s
    used = plan.devices
    per_hour = cluster_cost_per_hour(cluster, used)
    per_sample = per_hour / SECONDS_PER_HOUR / throughput if per_hour is not None and throughput > 0 else None
    tps = [r.tp for s in plan.stages for r in (s.replicas or (s,))]
    dps = [s.dp for s in plan.stages]
    cps = [r.cp for s in plan.stages for r in (s.replicas or (s,))]
    eps = [r.ep for s in plan.stages for r in (s.replicas or (s,))]
    stages = "; ".join(" + ".join(f"{g.device_type} tp{g.tp} dp{g.dp}" for g in (s.replicas or (s,)))
                       + f" layers {s.first_layer}-{s.last_layer}" for s in plan.stages)
    return WhatIfPoint(
        settings=settings, feasible=True, iteration_time_s=plan.iteration_time_s,
        throughput_samples_per_s=throughput,
        tokens_per_s=throughput * seq_len if seq_len else None,
        cost_per_hour=per_hour, cost_per_sample=per_sample,
        cost_per_million_tokens=per_sample / seq_len * 1e6 if per_sample is not None and seq_len else None,
        num_devices=cluster.num_devices, devices_used=len(used), global_batch=global_batch,
        seq_len=seq_len, pp=len({s.devices for s in plan.stages}), tp=_uniform(tps), dp=_uniform(dps),
        micro_batch=plan.micro_batch, num_micro_batches=plan.num_micro_batches, stages=stages,
        proven_optimal=plan.search.proven_optimal, lower_bound_s=plan.search.lower_bound_s, cp=_uniform(cps),
        ep=_uniform(eps), runtime=plan.runtime)


def infeasible(inputs: PointInputs, reason: str, seq_len: int | None = None) -> WhatIfPoint:
    cluster = inputs.cluster
    return WhatIfPoint(settings=inputs.settings, feasible=False, reason=reason,
                       cost_per_hour=cluster_cost_per_hour(cluster) if cluster else None,
                       num_devices=cluster.num_devices if cluster else 0, global_batch=inputs.global_batch,
                       seq_len=seq_len)


class _LimitStops(logging.Filter):
    """Holds back the search's messages that a limit stopped it (the sweep says it once, on any backend) and
    remembers whether one came. A time limit's is an info record, which a logger at the default WARNING level
    never makes: :func:`evaluate_point` lets ``engine.log`` make it, and this filter drops the other records
    below ``threshold``, the level the logger had, so that nothing else changes."""

    def __init__(self, marker: str, threshold: int) -> None:
        super().__init__()
        self.marker, self.threshold, self.seen = marker, threshold, False

    def filter(self, record: logging.LogRecord) -> bool:
        if getattr(record, self.marker, False):
            self.seen = True
            return False
        return record.levelno >= self.threshold


def evaluate_point(task: PointTask) -> WhatIfPoint:
    """Plan one point. A model that cannot be imported raises (the whole sweep is wrong); a point the
    planner cannot serve is an infeasible row. ``search_time_s`` includes a first import of the model."""
    from planner.search import engine  # noqa: PLC0415

    start = time.perf_counter()
    level = engine.log.level
    stops = _LimitStops(engine.LIMIT_STOP, engine.log.getEffectiveLevel())
    engine.log.addFilter(stops)
    engine.log.setLevel(min(stops.threshold, logging.INFO))  # a time limit's stop is an info record
    try:
        point = _evaluate(task)
    finally:
        engine.log.setLevel(level)
        engine.log.removeFilter(stops)
    return replace(point, search_time_s=time.perf_counter() - start, stopped_at_limit=stops.seen)


def _evaluate(task: PointTask) -> WhatIfPoint:
    from planner.search import plan as search_plan  # noqa: PLC0415

    inputs = task.inputs
    dims = dict(inputs.dims)
    if inputs.cluster is None:
        return infeasible(inputs, inputs.reason, dims.get(SEQ_DIM))
    try:
        model = _load_model(task.model_path, inputs.dims, _file_version(task.model_path))
    except ModelError as exc:  # a swept seq_len is bound as the model's `seq` dim: say which flag set it
        swept = [f"{key}={value}" for key, value in inputs.settings if key == "seq_len"]
        if swept:
            raise ModelError(f"--sweep {swept[0]}: {exc}") from None
        raise
    inputs = replace(inputs, cluster=_shared_nodes(inputs.cluster))
    seq_len = dict(model.dims).get(SEQ_DIM, dims.get(SEQ_DIM))
    if task.plan is not None:
        return _retimed(task.plan, model, inputs, seq_len, task.tables)
    pinned = task.pinned
    if isinstance(pinned, ParallelConfig):
        pinned = replace(pinned, global_batch=inputs.global_batch)
    try:
        best = search_plan(model, inputs.cluster, inputs.global_batch, pinned=pinned, top_k=1,
                           time_limit_s=task.time_limit_s, tables=task.tables, budget=task.budget,
                           options=task.options)
    except PlannerError as exc:
        point = infeasible(inputs, " ".join(str(exc).split()), seq_len)
        return replace(point, refused=isinstance(exc, ConfigError))
    return summarize(inputs.settings, best, inputs.cluster, inputs.global_batch, seq_len)


def _retimed(plan: Plan, model: LayerGraph, inputs: PointInputs, seq_len: int | None, tables: Any) -> WhatIfPoint:
    """A point of a fixed plan: its own placement re-timed on the point's cluster (not searched, so neither
    proven optimal nor bounded); infeasible where the placement does not fit or does not exist there."""
    from planner.compose import estimate_plan  # noqa: PLC0415

    try:
        estimate = estimate_plan(model, inputs.cluster, plan, tables=tables)
    except PlannerError as exc:  # refused where the plan does not fit the inputs (its model, tables, devices)
        return replace(infeasible(inputs, " ".join(str(exc).split()), seq_len), refused=isinstance(exc, ConfigError))
    if not estimate.feasible:
        return infeasible(inputs, estimate.reason, seq_len)
    retimed = replace(plan, iteration_time_s=estimate.iteration_time_s,
                      throughput_samples_per_s=estimate.throughput_samples_per_s,
                      search=SearchInfo(algorithm="the plan's placement re-timed"))
    point = summarize(inputs.settings, retimed, inputs.cluster, plan.global_batch, seq_len)
    return replace(point, proven_optimal=None, lower_bound_s=None)


# ------------------------------------------------------------------------------------------ the sweep


def whatif(model_path: str, cluster_spec: str | Cluster, global_batch: int, sweeps: Mapping[str, Sequence[str]],
           *, dims: Mapping[str, int] | None = None, pinned: Any = None, tables: Any = None,
           workers: int | None = None, backend: str = "process", time_limit_s: float | None = None,
           progress: Progress | None = None, budget: int | None = None,
           options: SolverOptions | None = None, plan: Plan | None = None) -> WhatIfResult:
    """Re-plan ``model_path`` at every point of the grid ``sweeps`` (key -> values, first key slowest), or with
    ``plan``, re-time that plan's own placement at every point (:func:`planner.compose.estimate_plan`: what the
    same plan takes on the changed cluster, its tables at its placement; ``global_batch`` must be the plan's,
    and no pins or global-batch sweep go with it).

    ``cluster_spec`` is a cluster file, a shorthand or a Cluster. ``pinned`` and ``tables`` go to
    ``planner.search.plan`` unchanged. ``workers`` defaults to min(2, CPUs); ``backend`` is ``"process"``
    or ``"ray"``. ``progress(done, total)`` is called as points finish. ``budget`` (work units per point),
    ``options`` (planner.solver.SolverOptions: both searches' work and the sharder's seed) and
    ``time_limit_s`` go to the search; work units keep the results independent of the machine and its load, a
    time limit does not."""
    from planner.hardware import load_cluster  # noqa: PLC0415
    from planner.hardware import catalog  # noqa: PLC0415

    start = time.perf_counter()
    from planner.search.api import check_search_arguments  # noqa: PLC0415

    arguments.path_like(model_path, "model_path", "an .onnx model file (whatif imports it again at each point)")
    global_batch, time_limit_s, budget = check_search_arguments(global_batch, time_limit_s, budget, pinned, options)
    arguments.optional(dims, Mapping, "dims", "give a mapping such as {'seq': 2048} or None")
    if workers is not None:
        workers = arguments.whole(workers, "workers")
    parsed = parse_sweeps(sweeps)
    if plan is not None:
        _check_fixed_plan(plan, global_batch, pinned, [s.key.text for s in parsed])
    if not str(model_path).lower().endswith(".onnx"):
        raise ModelError(f"{model_path}: expected an .onnx model file")
    cluster = cluster_spec if isinstance(cluster_spec, Cluster) else load_cluster(cluster_spec)
    check_groups(cluster, parsed, catalog)
    if tables is not None:  # a bad table file or table is the caller's mistake, not an infeasible point
        from planner.embeddings.tables import given_tables  # noqa: PLC0415 - only with tables
        tables = given_tables(tables) or None
    points = point_inputs(cluster, global_batch, dict(dims or {}), parsed, catalog)
    tasks = [PointTask(str(model_path), p, pinned, tables, time_limit_s, budget, options, plan) for p in points]
    log.info("whatif: %d points", len(tasks))
    results = run_tasks(evaluate_point, tasks, workers=workers, backend=backend, progress=progress)
    if results and all(p.refused for p in results):  # the pins are the mistake, not the points
        what = "the plan" if plan is not None else "the pinned configuration"
        raise ConfigError(f"every point of the sweep refuses {what}; the first: {results[0].reason}")
    stopped = sum(p.stopped_at_limit for p in results)
    if stopped:
        log.warning("whatif: a limit stopped the search at %d of %d points before it was complete, so their plans "
                    "are the best found, not proven optimal; %s to search further", stopped, len(results),
                    _limit_fix(time_limit_s, budget))
    name = cluster.name or (cluster_spec if isinstance(cluster_spec, str) else "")
    used_workers = workers or (default_workers() if backend == "process" else None)
    return WhatIfResult(points=tuple(results), keys=tuple(s.key.text for s in parsed), model=str(model_path),
                        cluster=name, workers=used_workers, backend=backend, elapsed_s=time.perf_counter() - start)


def _limit_fix(time_limit_s: float | None, budget: int | None) -> str:
    """What raises the limits a sweep was given (the work limit of SolverOptions when neither)."""
    from planner.search.engine import BUDGET_FIX, TIME_FIX, WORK_FIX  # noqa: PLC0415

    fixes = [fix for given, fix in ((budget, BUDGET_FIX), (time_limit_s, TIME_FIX)) if given is not None]
    return " or ".join(fixes) or WORK_FIX


def _check_fixed_plan(plan: Any, global_batch: int, pinned: Any, keys: Sequence[str]) -> None:
    """Raise ConfigError where the inputs of a fixed-plan sweep contradict the plan."""
    arguments.instance(plan, Plan, "plan", "give a planner.plans.Plan, e.g. planner.plans.load_plan('PLAN.json')")
    if pinned is not None:
        raise ConfigError("plan: a fixed plan is re-timed, not searched; drop the pinned configuration (or the "
                          "plan, to re-plan each point)")
    if global_batch != plan.global_batch:
        raise ConfigError(f"plan: its global batch is {plan.global_batch}, not {global_batch}; give "
                          f"--global-batch {plan.global_batch} or leave it out")
    if "global_batch" in keys:
        raise ConfigError("--sweep global_batch: a fixed plan has its own global batch; sweep it without --plan "
                          "(each point re-planned)")
