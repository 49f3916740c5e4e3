"""CONTRACT.md's Python API: a wrong argument is a PlannerError that names it, never a misleading answer."""

from __future__ import annotations

import pytest

import planner
from planner.builders import build
from planner.graph import import_model_proto


@pytest.fixture(scope="module")
def tiny():
    return import_model_proto(build("gpt", {"layers": 2, "hidden": 64, "heads": 2, "vocab": 128, "seq_len": 64}),
                              {"batch": 1})


def test_a_time_limit_that_is_not_positive_is_named(tiny):
    # it used to search nothing and report "no feasible plan was found in time"
    with pytest.raises(planner.ConfigError, match="--time-limit -1: must be a positive number"):
        planner.plan(tiny, planner.load_cluster("dgx-a100-80gb*1"), global_batch=8, time_limit_s=-1)


def test_a_pinned_global_batch_that_contradicts_the_argument_is_named(tiny):
    # it used to be ignored: the plan silently used the argument
    with pytest.raises(planner.ConfigError, match="pinned global_batch 16 differs from global_batch 8"):
        planner.plan(tiny, planner.load_cluster("dgx-a100-80gb*1"), global_batch=8,
                     pinned=planner.ParallelConfig(global_batch=16, tp=1))
