"""Validation of a parallel configuration against a model and a cluster. Each check names the constraint
and the nearest valid values (``ConfigError``; the CLI prints it as one line and exits 2)."""

from __future__ import annotations

from planner.cost.memory import DTYPE_BYTES
from planner.cost.schedule import SCHEDULES
from planner.errors import ConfigError
from planner.types import Cluster, LayerGraph, ParallelConfig


def divisors(n: int) -> list[int]:
    small = [d for d in range(1, int(n ** 0.5) + 1) if n % d == 0]
    return sorted(set(small + [n // d for d in small]))


def nearest(value: int, valid: list[int]) -> str:
    """The valid values just below and just above ``value`` ("2 or 4", or one of them)."""
    below = [v for v in valid if v < value]
    above = [v for v in valid if v > value]
    picks = ([max(below)] if below else []) + ([min(above)] if above else [])
    return " or ".join(str(v) for v in picks) if picks else "none"


def pipeline_units(model: LayerGraph) -> int:
    """How many layers a pipeline can split: the transformer blocks where there are any, else all layers."""
    blocks = sum(1 for layer in model.layers if layer.kind == "block")
    return blocks or len(model.layers)


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


def valid_tps(model: LayerGraph, cluster: Cluster) -> list[int]:
    per_node = min(g.node.devices_per_node for g in cluster.groups)
    heads = attention_heads(model)
    return [t for t in divisors(per_node) if all(h % t == 0 for h, _ in heads)]


def check_config(model: LayerGraph, cluster: Cluster, config: ParallelConfig) -> None:
    """Raise ConfigError for the first constraint ``config`` breaks."""
    tp, pp, dp, gb = config.tp, config.pp, config.dp, config.global_batch
    for name, value in (("tp", tp), ("pp", pp), ("dp", dp), ("global batch", gb)):
        if not isinstance(value, int) or value < 1:
            raise ConfigError(f"{name}={value} must be a positive integer")
    if not model.layers:
        raise ConfigError(f"model {model.name!r} has no layers to place")
    tps = valid_tps(model, cluster)
    per_node = min(g.node.devices_per_node for g in cluster.groups)
    smallest = min(cluster.groups, key=lambda g: g.node.devices_per_node).node.name
    if tp > per_node:
        raise ConfigError(f"tp={tp} is larger than a node: {smallest} has {per_node} devices and tensor "
                          f"parallelism stays inside a node; nearest valid tp: {nearest(tp, tps)}")
    for heads, what in attention_heads(model):
        if heads % tp:
            raise ConfigError(f"tp={tp} does not divide the model's {heads} {what}; "
                              f"nearest valid tp: {nearest(tp, tps)}")
    if per_node % tp:
        raise ConfigError(f"tp={tp} does not divide the {per_node} devices of a {smallest} node, so a "
                          f"tensor-parallel group would span two nodes; nearest valid tp: {nearest(tp, tps)}")
    units = pipeline_units(model)
    if pp > units:
        raise ConfigError(f"pp={pp} is larger than the model's {units} layers (one layer per stage at most); "
                          f"nearest valid pp: {units}")
    needed = tp * pp * dp
    if needed > cluster.num_devices:
        fit = cluster.num_devices // (tp * pp)
        hint = f"nearest valid dp: {fit}" if fit >= 1 else "use a smaller tp or pp"
        raise ConfigError(f"tp x pp x dp = {tp} x {pp} x {dp} = {needed} devices, but the cluster has "
                          f"{cluster.num_devices}; {hint}")
    if gb % dp:
        lo, hi = (gb // dp) * dp, (gb // dp + 1) * dp
        raise ConfigError(f"global batch {gb} is not divisible by dp={dp}; nearest valid global batch: "
                          f"{nearest(gb, [v for v in (lo, hi) if v > 0])}")
    mb = config.micro_batch
    if mb is not None:
        if mb < 1:
            raise ConfigError(f"micro-batch={mb} must be a positive integer")
        if gb % (dp * mb):
            step = dp * mb
            lo, hi = (gb // step) * step, (gb // step + 1) * step
            mbs = divisors(gb // dp)
            raise ConfigError(f"global batch {gb} is not divisible by dp x micro-batch = {dp} x {mb} = {step}; "
                              f"nearest valid global batch: {nearest(gb, [v for v in (lo, hi) if v > 0])}, "
                              f"or nearest valid micro-batch: {nearest(mb, mbs)}")
    if config.schedule is not None and config.schedule not in SCHEDULES:
        raise ConfigError(f"schedule {config.schedule!r} is not one of {', '.join(SCHEDULES)}")
    vpp = config.vpp
    if vpp is not None:
        if vpp < 1:
            raise ConfigError(f"vpp={vpp} must be a positive integer")
        if vpp > 1:
            if pp == 1:
                raise ConfigError(f"vpp={vpp} needs pipeline parallelism (pp > 1); use vpp 1")
            if config.schedule not in (None, "interleaved"):
                raise ConfigError(f"vpp={vpp} needs the interleaved schedule, not {config.schedule}; "
                                  f"use --schedule interleaved or vpp 1")
            if units % (pp * vpp):
                valid = [v for v in divisors(units // pp) if units % (pp * v) == 0] if units % pp == 0 else [1]
                raise ConfigError(f"vpp={vpp}: the {units} layers do not split into pp x vpp = {pp * vpp} equal "
                                  f"chunks; nearest valid vpp: {nearest(vpp, valid)}")
            if mb is not None and (gb // (dp * mb)) % pp:
                raise ConfigError(f"vpp={vpp}: the interleaved schedule needs the number of micro-batches "
                                  f"({gb // (dp * mb)}) to be a multiple of pp={pp}; use vpp 1 or change the "
                                  f"micro-batch")
    if config.schedule == "interleaved" and vpp == 1:
        raise ConfigError("the interleaved schedule needs vpp > 1; use --vpp 2 or more, or --schedule 1f1b")
    if config.schedule == "interleaved" and pp == 1:
        raise ConfigError("the interleaved schedule needs pipeline parallelism (pp > 1); use --schedule 1f1b")
    if config.zero is not None and config.zero not in (0, 1, 2, 3):
        raise ConfigError(f"zero={config.zero} is not a ZeRO stage; use 0, 1, 2 or 3")
    if config.recompute is not None and config.recompute not in ("none", "selective", "full"):
        raise ConfigError(f"recompute {config.recompute!r} is not one of none, selective, full")
    if config.sequence_parallel and tp == 1:
        raise ConfigError("sequence parallelism needs tensor parallelism (tp > 1); drop --sequence-parallel "
                          "or use tp 2 or more")
    if config.optimizer not in ("adam", "sgd", "adagrad"):
        raise ConfigError(f"optimizer {config.optimizer!r} is not one of adam, sgd, adagrad")
    if config.dtype is not None and config.dtype not in DTYPE_BYTES:
        raise ConfigError(f"dtype {config.dtype!r} is not one of {', '.join(DTYPE_BYTES)}")
