"""Limits that keep a search or an estimate within seconds and memory on any input. A pipeline is timed for at
most planner.rules.MAX_PIPELINE_MICRO_BATCHES micro-batches per replica (the event simulation's time and memory
grow with m x pp; one stage takes any number): a prime global batch, whose only micro-batch is 1, used to make
plan and estimate simulate millions of micro-batches until memory ran out. A search returns at most
planner.search.api.MAX_TOP_K plans."""

from __future__ import annotations

import pytest

import planner
from planner.cli import main
from planner.errors import ConfigError
from planner.hardware import load_cluster
from planner.rules import MAX_PIPELINE_MICRO_BATCHES
from planner.types import ParallelConfig

PRIME = 10000019  # no micro-batch up to rules.MAX_MICRO_BATCH divides it but 1


@pytest.fixture(scope="module")
def model():
    return planner.load_model("models/gpt2-124m.onnx", {"batch": 1})


def test_plan_of_a_prime_batch_runs_one_stage(model):
    best = planner.plan(model, load_cluster("dgx-a100-80gb*1"), PRIME)
    assert len(best.stages) == 1 and best.num_micro_batches == PRIME


def test_estimate_refuses_a_pipeline_of_too_many_micro_batches(model):
    cluster = load_cluster("dgx-a100-80gb*1")
    with pytest.raises(ConfigError, match=rf"pp=8: {PRIME} micro-batches per replica is more than the "
                                          rf"{MAX_PIPELINE_MICRO_BATCHES}"):
        planner.estimate(model, cluster, ParallelConfig(global_batch=PRIME, tp=1, pp=8, dp=1, micro_batch=1))
    # a free micro-batch takes the first that leaves few enough
    batch = 2 * MAX_PIPELINE_MICRO_BATCHES
    est = planner.estimate(model, cluster, ParallelConfig(global_batch=batch, tp=1, pp=2, dp=1))
    assert est.config.micro_batch >= 2
    one_stage = planner.estimate(model, cluster, ParallelConfig(global_batch=PRIME, tp=1, pp=1, dp=1, micro_batch=1))
    assert one_stage.iteration_time_s > 0


def test_cli_names_the_pinned_pp(capsys):
    code = main(["plan", "models/gpt2-124m.onnx", "--cluster", "dgx-a100-80gb*1", "--global-batch", str(PRIME),
                 "--pp", "2"])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("planner: error: --pp 2: ") and err.count("\n") == 1


def test_top_is_bounded(model, capsys):
    """A search returns at most planner.search.api.MAX_TOP_K plans (each timed; the cutoff is the K-th best)."""
    from planner.search import search  # noqa: PLC0415
    from planner.search.api import MAX_TOP_K  # noqa: PLC0415

    with pytest.raises(ConfigError, match=rf"top_k={MAX_TOP_K + 1} is over {MAX_TOP_K}"):
        search(model, load_cluster("dgx-a100-80gb*1"), 64, top_k=MAX_TOP_K + 1)
    code = main(["plan", "models/gpt2-124m.onnx", "--cluster", "dgx-a100-80gb*1", "--global-batch", "64",
                 "--top", str(MAX_TOP_K)])
    assert code == 2 and f"--top {MAX_TOP_K}: a search returns at most" in capsys.readouterr().err


def test_a_pinned_pp_counts_only_the_dp_its_devices_hold(capsys):
    """With pp 2 on 8 devices dp is at most 4, so 2^25 samples leave at least 8,192 micro-batches per replica:
    the pin is refused for that, not with a memory message (dp 8 would have left 4,096)."""
    code = main(["plan", "models/gpt2-124m.onnx", "--cluster", "dgx-a100-80gb*1", "--global-batch", str(2 ** 25),
                 "--pp", "2"])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("planner: error: --pp 2: 8192 micro-batches per replica")
