"""The parallel degrees left out of a ParallelConfig (tp, pp, dp, cp None, their default): 1 for estimate,
searched by plan."""

from __future__ import annotations

import pytest

import planner
from planner.builders import build
from planner.graph import import_model_proto
from planner.hardware import load_cluster
from planner.types import Batching, ParallelConfig


@pytest.fixture(scope="module")
def gpt8():
    proto = build("gpt", {"layers": 8, "hidden": 1024, "heads": 16, "vocab": 32000, "seq_len": 512})
    return import_model_proto(proto, {"batch": 1, "seq": 512}, name="gpt8")


def test_estimate_with_degrees_left_out_is_estimate_at_one(gpt8):
    cluster = load_cluster("dgx-a100-80gb*1")
    left_out = planner.estimate(gpt8, cluster, ParallelConfig(global_batch=64))
    ones = planner.estimate(gpt8, cluster, ParallelConfig(global_batch=64, tp=1, pp=1, dp=1, cp=1))
    assert left_out == ones
    assert (left_out.config.tp, left_out.config.pp, left_out.config.dp, left_out.config.cp) == (1, 1, 1, 1)


def test_degrees_left_out_default_to_none():
    config = ParallelConfig(global_batch=64)
    assert (config.tp, config.pp, config.dp, config.cp) == (None, None, None, None)
    assert config.with_unit_degrees() == ParallelConfig(global_batch=64, tp=1, pp=1, dp=1, cp=1)
    assert ParallelConfig(global_batch=64, tp=2).with_unit_degrees().tp == 2
    assert Batching.of(ParallelConfig(global_batch=64, micro_batch=4)).num_micro_batches == 16


def test_plan_pinning_only_the_runtime_searches_the_degrees(gpt8):
    cluster = load_cluster("dgx-a100-80gb*2")
    best = planner.plan(gpt8, cluster, 256, pinned=ParallelConfig(global_batch=256, runtime="pytorch-fsdp2"))
    assert best.runtime == "pytorch-fsdp2"
    assert best.num_devices > 1
