"""One rule book (planner.rules): `estimate` accepts a configuration exactly when the search's space holds it.

For random small models (GPT and Llama with 12 or 16 heads, Llama with 4 key/value heads, mixtures of 8 and 6
experts), clusters (catalog nodes of 1 and 8 GPUs, mi250x-4's with direct links, a 2-GPU node, mixed ones for
the dense models) and fully pinned configurations (tp, cp, pp, dp, micro-batch, ZeRO, vpp, recompute, runtime,
ep, expert_tp, ep_overlap; cp, micro-batch, ZeRO, vpp, recompute, ep, expert_tp and ep_overlap sometimes left
free), estimate raises
ConfigError exactly when the search's enumeration (validate_pins, enumerate_settings x tp_choices x the stage
counts max_stages and pipeline_allowed admit) holds no plan of that shape, and the configuration estimate
resolves is one the search holds.
"""

from __future__ import annotations

import dataclasses
from functools import lru_cache

from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st

from planner.builders import build
from planner.cost import estimate
from planner.errors import ConfigError
from planner.graph.importer import import_model_proto
from planner.hardware import load_cluster
from planner.hardware.efficiency import resolve_dtype
from planner.rules import (RECOMPUTE_CHOICES, ZERO_STAGES, ModelShape, micro_batch_choices, pools_touched,
                           unit_flags)
from planner.runtime import RUNTIMES
from planner.search.interleave import pipeline_allowed
from planner.search.space import (Pins, cp_choices, enumerate_settings, experts_allowed, max_stages, settings_allowed,
                                  tp_choices, validate_pins)
from planner.types import Cluster, Estimate, LayerGraph, ParallelConfig

MODELS = (("gpt", 4, 12, 12), ("gpt", 6, 16, 16), ("llama", 8, 16, 4), ("llama", 5, 12, 4), ("moe", 3, 8, 4),
          ("moe", 2, 12, 4))
EXPERTS = {3: 8, 2: 6}  # routed experts of the moe models, by layer count
# an expert-parallel group lies in one replica group, so the mixtures are drawn on one device type
HOMOGENEOUS = ("dgx-a100-80gb*1", "dgx-a100-80gb*2", "a10*4", "mi250x-4*2", "two-gpu*3")
CLUSTERS = ("dgx-a100-80gb*1", "dgx-a100-80gb*2", "a10*4", "mi250x-4*2", "dgx-h100*1+a10*2", "a10*2+dgx-h100*1",
            "two-gpu*3", "two-gpu*1+dgx-a100-80gb*1")


@lru_cache(maxsize=None)
def model_of(index: int) -> LayerGraph:
    family, layers, heads, kv_heads = MODELS[index]
    keys = {"layers": layers, "hidden": 64 * heads, "heads": heads, "vocab": 1024, "seq_len": 128}
    if family in ("llama", "moe"):
        keys["kv_heads"] = kv_heads
    if family == "moe":
        keys.update(experts=EXPERTS[layers], top_k=2, expert_ffn=64 * heads, vocab=512, seq_len=64)
    return import_model_proto(build(family, keys), {"batch": 1}, name=f"{family}-{layers}")


@lru_cache(maxsize=None)
def cluster_of(text: str) -> Cluster:
    """A catalog shorthand; ``two-gpu`` is an A100 node cut to two GPUs (the catalog has none)."""
    if "two-gpu" not in text:
        return load_cluster(text)
    base = load_cluster(text.replace("two-gpu", "dgx-a100-80gb"))
    groups, first = [], 0
    for group in base.groups:
        node = group.node
        if "two-gpu" in text.split("+")[len(groups)]:
            node = dataclasses.replace(node, name="two-gpu", devices_per_node=2)
        groups.append(dataclasses.replace(group, node=node, first_device=first))
        first += groups[-1].num_devices
    return dataclasses.replace(base, groups=tuple(groups))


def estimate_or_none(model: LayerGraph, cluster: Cluster, config: ParallelConfig) -> Estimate | None:
    try:
        return estimate(model, cluster, config)
    except ConfigError:
        return None


def search_contains(model: LayerGraph, cluster: Cluster, config: ParallelConfig) -> bool:
    """Whether the search, with the fields ``config`` sets pinned, enumerates a plan of that shape."""
    units = unit_flags([layer.kind for layer in model.layers])
    num_units = sum(units)
    pins = dataclasses.replace(Pins.from_config(config), shape=ModelShape.of(model),
                               dtype=resolve_dtype((g.node.device for g in cluster.groups), None))
    try:
        validate_pins(pins, cluster, config.global_batch, len(model.layers), num_units)
    except ConfigError:
        return False
    tp, pp, dp, cp = config.tp, config.pp, config.dp, config.cp or 1
    if tp * cp * pp * dp > cluster.num_devices:
        return False
    pools = pools_touched(cluster, tp * cp * pp * dp)
    if not all(tp in tp_choices(cluster, p, pins) for p in pools):
        return False
    # a free cp is searched from 1 (estimate resolves it to 1); a pinned one on every pool its stages touch
    if not all(cp in cp_choices(cluster, p, pins, tp) for p in pools):
        return False
    for s in enumerate_settings(cluster, config.global_batch, pins, num_units=num_units):
        if not settings_allowed(s, pins) or not experts_allowed(s, pins, tp, cp):
            continue
        for name in ("micro_batch", "zero", "recompute", "ep", "ep_overlap"):
            assert getattr(config, name) in (None, getattr(s, name))
        if pp <= min(len(model.layers), max_stages(s, num_units, config.global_batch)) and config.vpp in (None, s.vpp) \
                and pipeline_allowed(pp, s.num_micro_batches(config.global_batch), s.vpp, num_units,
                                     not RUNTIMES[s.runtime].uneven_pipeline):
            return True
    return False


@st.composite
def cases(draw: st.DrawFn) -> tuple[LayerGraph, Cluster, ParallelConfig]:
    """A model, a cluster and a pinned configuration, drawn so that every rule is broken now and then and some
    configurations keep them all: tp is often cut to the first pool's node, pp to the model's blocks."""
    index = draw(st.integers(0, len(MODELS) - 1))
    model = model_of(index)
    cluster = cluster_of(draw(st.sampled_from(HOMOGENEOUS if MODELS[index][0] == "moe" else CLUSTERS)))
    tp = draw(st.sampled_from((1, 2, 4, 8, 3)))
    if draw(st.booleans()):
        tp = min(tp, cluster.groups[0].node.devices_per_node)
    blocks = sum(1 for layer in model.layers if layer.kind == "block")
    config = ParallelConfig(
        global_batch=draw(st.sampled_from((16, 24, 32))), tp=tp, pp=draw(st.integers(1, blocks + 1)),
        dp=draw(st.sampled_from((1, 2, 4, 3))), micro_batch=draw(st.sampled_from((1, 2, 4, None))),
        zero=draw(st.sampled_from((*ZERO_STAGES, None))), vpp=draw(st.sampled_from((1, 1, 2, 3, 4, None))),
        recompute=draw(st.sampled_from((*RECOMPUTE_CHOICES, None))), runtime=draw(st.sampled_from(tuple(RUNTIMES))),
        cp=draw(st.sampled_from((None, None, 1, 2, 4, 3, 64))),
        ep=draw(st.sampled_from((None, None, 1, 2, 4, 8, 3))), expert_tp=draw(st.sampled_from((None, None, 1, 2, 4))),
        ep_overlap=draw(st.sampled_from((None, None, False, True))))
    return model, cluster, config


@seed(20)
@settings(max_examples=300, deadline=None, derandomize=False, suppress_health_check=[HealthCheck.too_slow])
@given(cases())
def test_estimate_accepts_exactly_what_the_search_enumerates(case):
    model, cluster, config = case
    found = estimate_or_none(model, cluster, config)
    assert (found is not None) == search_contains(model, cluster, config), (config, cluster.name, model.name)
    if found is not None:  # the choices estimate resolves are in the search's space too
        assert search_contains(model, cluster, found.config), (found.config, cluster.name, model.name)


def test_a_free_micro_batch_is_chosen_from_the_same_values_by_estimate_and_the_search():
    """Estimate resolves a free micro-batch among rules.micro_batch_choices and the search enumerates the same
    ones, so a plan proven optimal is never slower than estimate's own choice (on a small model the largest
    micro-batch wins, past the 64 the search once stopped at)."""
    import planner

    model = import_model_proto(build("gpt", {"layers": 2, "hidden": 64, "heads": 2, "vocab": 128, "seq_len": 16}),
                               {"batch": 1})
    cluster = load_cluster("dgx-a100-80gb*1")
    config = ParallelConfig(global_batch=8192, tp=1, pp=1, dp=8)
    best = planner.plan(model, cluster, 8192, pinned=config)
    resolved = estimate(model, cluster, config)
    assert best.micro_batch == resolved.config.micro_batch > 64
    assert best.iteration_time_s == resolved.iteration_time_s
    settings = enumerate_settings(cluster, 8192, Pins(tp=1, pp=1, dp=8), num_units=2)
    assert sorted({s.micro_batch for s in settings}) == micro_batch_choices(1024)
