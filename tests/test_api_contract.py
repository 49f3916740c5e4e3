"""The Python API's promises (docs/api.md): a wrong argument is a PlannerError that names it, never a
misleading answer nor an exception from deep inside."""

from __future__ import annotations

import math

import numpy as np
import pytest

import planner
from planner.builders import build, save
from planner.graph import import_model_proto
from planner.plans import load_plan
from planner.types import EmbeddingTable


@pytest.fixture(scope="module")
def tiny():
    return import_model_proto(build("gpt", {"layers": 2, "hidden": 64, "heads": 2, "vocab": 128, "seq_len": 64}),
                              {"batch": 1})


def test_a_time_limit_that_is_not_positive_is_named(tiny):
    # it used to search nothing and report "no feasible plan was found in time"
    with pytest.raises(planner.ConfigError, match="time_limit_s=-1 must be a positive number"):
        planner.plan(tiny, planner.load_cluster("dgx-a100-80gb*1"), global_batch=8, time_limit_s=-1)


def test_a_pinned_global_batch_that_contradicts_the_argument_is_named(tiny):
    # it used to be ignored: the plan silently used the argument
    with pytest.raises(planner.ConfigError, match="pinned global_batch 16 differs from global_batch 8"):
        planner.plan(tiny, planner.load_cluster("dgx-a100-80gb*1"), global_batch=8,
                     pinned=planner.ParallelConfig(global_batch=16, tp=1))


# ------------------------------------------------------------------ wrong types and values from a script

def _table(**change):
    return EmbeddingTable(**{"name": "t", "rows": 5000, "dim": 64, "pooling_factor": 2.0, **change})


@pytest.mark.parametrize("field, value, message", [
    ("micro_batch", "4", r"micro_batch='4' must be a positive integer"),
    ("ep", 0, r"ep=0 must be a positive integer"),
    ("zero", 1.0, r"zero=1.0 must be a non-negative integer"),
    ("tp", True, r"tp=True must be a positive integer \(0, only in the pins of a plan, leaves tp to the search\)"),
    ("vpp", "2", r"vpp='2' must be a positive integer"),
    ("recompute", 3, r"recompute=3 must be a name"),
    ("sequence_parallel", 1, r"sequence_parallel=1 must be True, False or None"),
])
def test_a_parallel_config_field_of_the_wrong_type_is_named(field, value, message):
    with pytest.raises(planner.ConfigError, match=message):
        planner.ParallelConfig(global_batch=8, **{field: value})


def test_a_negative_degree_and_a_zero_one_estimate_refuses_get_one_message(tiny):
    with pytest.raises(planner.ConfigError) as negative:
        planner.ParallelConfig(global_batch=8, tp=-1)
    with pytest.raises(planner.ConfigError) as zero:
        planner.estimate(tiny, planner.load_cluster("dgx-a100-80gb*1"), planner.ParallelConfig(global_batch=8, tp=0))
    assert str(negative.value) == "tp=-1 must be a positive integer (0, only in the pins of a plan, leaves tp to the " \
                                  "search)"
    assert str(zero.value) == str(negative.value).replace("-1", "0", 1)


def test_zero_leaves_a_degree_to_the_search_and_numpy_integers_are_integers():
    assert planner.ParallelConfig(global_batch=np.int64(8), tp=0, pp=0, dp=0, cp=0).tp == 0


@pytest.mark.parametrize("call, message", [
    (lambda m, c: planner.plan(m, c, global_batch="8"), r"global_batch='8' must be a positive integer"),
    (lambda m, c: planner.plan(m, c, global_batch=1.5), r"global_batch=1.5 must be a positive integer"),
    (lambda m, c: planner.plan(m, c, 8, top_k="3"), r"top_k='3' must be a positive integer"),
    (lambda m, c: planner.plan(m, c, 8, budget="a"), r"budget='a' must be a positive integer"),
    (lambda m, c: planner.plan(m, c, 8, pinned={"tp": 2}), r"pinned: got a dict"),
    (lambda m, c: planner.plan(m, c, 8, options={"work": 2}), r"options: got a dict"),
    (lambda m, c: planner.plan(c, m, 8), r"model: got a Cluster"),
    (lambda m, c: planner.estimate(m, "dgx-a100-80gb*1", planner.ParallelConfig(8)), r"cluster: got a str"),
    (lambda m, c: planner.estimate(m, c, None), r"config: got a NoneType"),
    (lambda m, c: planner.estimate(m, c, planner.ParallelConfig(8, dp=8), tables=42), r"tables: got a int"),
    (lambda m, c: planner.estimate(m, c, planner.ParallelConfig(8, dp=8), tables=[{"name": "t"}]),
     r"tables\[0\]: got a dict"),
    (lambda m, c: planner.estimate(m, c, planner.ParallelConfig(8, dp=8), tables=[_table(rows=-5)]),
     r"'tables\[0\].rows' must be an integer from 1"),
    (lambda m, c: planner.estimate(m, c, planner.ParallelConfig(8, dp=8), tables=[_table(dim=0)]),
     r"'tables\[0\].dim' must be an integer from 1"),
    (lambda m, c: planner.estimate(m, c, planner.ParallelConfig(8, dp=8), tables=[_table(pooling_factor=math.nan)]),
     r"'tables\[0\].pooling_factor' must be a finite number"),
    (lambda m, c: planner.estimate(m, c, planner.ParallelConfig(8, dp=8), tables=[_table(dtype_bytes=0)]),
     r"dtype_bytes=0 must be an integer from 1 to 8"),
    (lambda m, c: planner.estimate(m, c, planner.ParallelConfig(8, dp=8), tables=[_table(), _table()]),
     r"table name 't' appears twice"),
    (lambda m, c: planner.plan(m, c, 16, backend="ray"), r"backend: got a str; give None \(the cost model\)"),
    (lambda m, c: planner.plan(m, c, 16, progress=5), r"progress: got a int; give a function progress\(fraction\)"),
    (lambda m, c: planner.estimate(m, c, planner.ParallelConfig(8, dp=8), 42), r"calibration: got a int; give a "
     r"mapping of device name to planner.cost.calibration.DeviceCalibration"),
    (lambda m, c: planner.estimate(m, c, planner.ParallelConfig(8, dp=8), "fast"), r"calibration: got a str"),
    (lambda m, c: planner.estimate(m, c, planner.ParallelConfig(8, dp=8), {"a100-80gb": 0.9}),
     r"calibration\['a100-80gb'\]: got a float"),
    (lambda m, c: planner.estimate_plan(m, c, planner.plan(m, c, 8), "fast"), r"calibration: got a str"),
])
def test_a_wrong_argument_to_plan_or_estimate_is_named(tiny, call, message):
    with pytest.raises(planner.ConfigError, match=message):
        call(tiny, planner.load_cluster("dgx-a100-80gb*1"))


def test_tables_from_python_are_sharded_as_a_files_are(tiny):
    est = planner.estimate(tiny, planner.load_cluster("dgx-a100-80gb*1"), planner.ParallelConfig(8, dp=8),
                           tables=[_table(rows=np.int64(5000))])
    assert est.feasible and est.breakdown.embedding_s > 0


@pytest.mark.parametrize("change, message", [
    ({"global_batch": 0}, r"global_batch=0 must be a positive integer"),
    ({"budget": -1}, r"budget=-1 must be a positive integer"),
    ({"time_limit_s": 0}, r"time_limit_s=0 must be a positive number of seconds"),
    ({"workers": "a"}, r"workers='a' must be a positive integer"),
    ({"dims": [1]}, r"dims: got a list"),
    ({"sweeps": ["count"]}, r"sweeps: got a list"),
    ({"sweeps": {"count": [object()]}}, r"--sweep count: value .* must be a number or its text"),
    ({"tables": "/nonexistent/tables.json"}, r"tables file '/nonexistent/tables.json' does not exist"),
    ({"progress": 5, "workers": 1}, r"progress: got a int; give a function progress\(done, total\) or None"),
    ({"backend": None}, r"^backend None is not one of process, ray$"),
    ({"backend": "rey"}, r"^backend 'rey' is not one of process, ray \(did you mean ray\?\)$"),
])
def test_a_wrong_whatif_argument_is_raised_not_reported_as_an_infeasible_point(tmp_path, change, message):
    path = tmp_path / "gpt.onnx"
    save(build("gpt", {"layers": 2, "hidden": 64, "heads": 2, "vocab": 128, "seq_len": 64}), str(path))
    args = {"model_path": str(path), "cluster_spec": "dgx-a100-80gb*1", "global_batch": 8,
            "sweeps": {"count": ["1"]}, **change}
    with pytest.raises(planner.ConfigError, match=message):
        planner.whatif(**args)


@pytest.mark.parametrize("call, error, message", [
    (lambda: planner.load_model(None), planner.ModelError, r"model path: got a NoneType"),
    (lambda: planner.load_cluster({"nodes": 1}), planner.ClusterError, r"cluster: got a dict"),
    (lambda: load_plan(None), planner.PlannerError, r"plan file: got a NoneType"),
    (lambda: planner.Plan.from_json({}), planner.PlannerError, r"plan: got a dict"),
    (lambda: build(None, {}), planner.ConfigError, r"family: got a NoneType"),
    (lambda: save("x", "/tmp/x.onnx"), planner.ConfigError, r"model: got a str"),
    (lambda: save(build("gpt", {"layers": 2}), "/nonexistent-folder/x.onnx"), planner.ConfigError,
     r"path /nonexistent-folder/x.onnx: folder '/nonexistent-folder' does not exist"),
])
def test_a_wrong_argument_to_a_loader_or_builder_is_named(call, error, message):
    with pytest.raises(error, match=message):
        call()


def test_a_plan_text_over_the_limit_is_refused(monkeypatch):
    import planner.plans

    monkeypatch.setattr(planner.plans, "MAX_PLAN_JSON_BYTES", 1 << 20)
    with pytest.raises(planner.PlannerError, match="over the limit"):
        planner.Plan.from_json(" " * (2 << 20))


def test_a_global_batch_past_the_largest_is_refused_at_once(tiny):
    from planner.types import MAX_GLOBAL_BATCH

    with pytest.raises(planner.ConfigError, match="the largest the planner takes"):
        planner.plan(tiny, planner.load_cluster("dgx-a100-80gb*1"), global_batch=MAX_GLOBAL_BATCH + 1)
    with pytest.raises(planner.ConfigError, match="the largest the planner takes"):
        planner.ParallelConfig(global_batch=10**23, dp=8)
