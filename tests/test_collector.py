"""Pausing the cyclic garbage collector (planner/collector.py): pauses nest, overlap across threads and give
the collector back in the state they found it; the stages run under a pause make no reference cycles, so the
pause costs no memory."""

from __future__ import annotations

import gc
import threading

import numpy as np
import pytest

from embedding_fixtures import cluster, node, small_problem
from planner.collector import collector_paused
from planner.embeddings import patterns, shard_tables
from planner.embeddings.patterns import pattern_place
from planner.types import EmbeddingTable


@pytest.fixture
def collector_on():
    was = gc.isenabled()
    gc.enable()
    yield
    if not was:
        gc.disable()


def test_pauses_nest_and_the_collector_comes_back_on(collector_on):
    with collector_paused():
        assert not gc.isenabled()
        with collector_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()
    assert gc.isenabled()


def test_a_collector_that_was_off_stays_off(collector_on):
    gc.disable()
    with collector_paused():
        assert not gc.isenabled()
    assert not gc.isenabled()


def test_a_pause_ends_on_an_exception(collector_on):
    with pytest.raises(ValueError):
        with collector_paused():
            raise ValueError("stop")
    assert gc.isenabled()


def test_overlapping_pauses_on_two_threads_end_with_the_last(collector_on):
    entered, first_done, seen = threading.Event(), threading.Event(), []

    def second() -> None:
        with collector_paused():
            entered.set()
            first_done.wait(10)
            seen.append(gc.isenabled())  # the first thread's pause has ended, this one has not

    with collector_paused():
        worker = threading.Thread(target=second)
        worker.start()
        assert entered.wait(10)
    first_done.set()
    worker.join(10)
    assert seen == [False]
    assert gc.isenabled()


@pytest.fixture
def saved_garbage():
    """Collect first, then keep whatever the collector would free in gc.garbage instead of freeing it."""
    was = gc.isenabled()
    gc.collect()
    gc.disable()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        yield
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        if was:
            gc.enable()


def _cyclic_garbage() -> list[str]:
    gc.collect()
    return sorted({type(o).__name__ for o in gc.garbage})


def test_the_configuration_walk_leaves_no_cycles(saved_garbage):
    # the walk is a nested function that calls itself: a cycle unless the enumeration breaks it
    problem = small_problem(3, 5)
    rng = np.random.default_rng(3)
    choice = [int(rng.integers(len(options))) for options in problem.options]
    model = patterns._Model.build(problem, choice)
    assert model is not None
    enumerated = model.enumerate(float("inf"), 10 ** 5)
    assert enumerated is not None and sum(len(times) for cls in enumerated for _, _, times in cls) > 10
    del model, enumerated
    assert _cyclic_garbage() == []
    pattern_place(problem, choice, 0.0, float("inf"))
    assert _cyclic_garbage() == []


def test_the_sharder_leaves_no_cycles(saved_garbage):
    rng = np.random.default_rng(11)
    tables = [EmbeddingTable(f"t{i}", int(rng.integers(10, 10 ** 7)), int(rng.choice([16, 64, 128])),
                             float(rng.integers(1, 60))) for i in range(40)]
    result = shard_tables(tables, cluster((node("dgx-a100-80gb"), 2)), None, 65536)
    assert result.placements
    assert _cyclic_garbage() == []
