"""The Ray backend on a local one-CPU Ray instance. Ray is in the test extra, so CI runs these; an environment
without it skips them with the reason."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from planner.errors import PlannerError
from planner.sweep import runner
from planner.sweep.whatif import PointTask

from whatif_fakes import points_for, failing_evaluate, fake_evaluate

TESTS = Path(__file__).resolve().parent


def test_missing_ray_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray -> ImportError
    with pytest.raises(PlannerError, match=r'pip install "planner\[ray\]"'):
        runner.run_tasks(fake_evaluate, [], backend="ray")


@pytest.fixture(scope="module")
def local_ray():
    ray = pytest.importorskip("ray", reason='Ray is not installed (optional extra: pip install "planner[ray]")')
    # workers import planner and the fakes, and whatever the driver's PYTHONPATH reaches
    path = os.pathsep.join(p for p in (str(TESTS.parent), str(TESTS), os.environ.get("PYTHONPATH", "")) if p)
    ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"PYTHONPATH": path}})
    yield ray
    ray.shutdown()


def test_ray_backend_matches_processes(local_ray):
    tasks = [PointTask("fake.onnx", p) for p in points_for({"fake-a100.count": ["0", "1", "2"],
                                                          "fake-h100.count": ["1", "3"]})]
    calls = []
    on_ray = runner.run_tasks(fake_evaluate, tasks, backend="ray", workers=2,
                              progress=lambda d, t: calls.append(d))
    local = runner.run_tasks(fake_evaluate, tasks, workers=1)
    assert on_ray == local and calls == list(range(1, 7))


def test_ray_backend_reraises_planner_errors(local_ray):
    tasks = [PointTask("fake.onnx", p) for p in points_for({"count": ["1"]})]
    with pytest.raises(PlannerError, match="raised in a worker"):
        runner.run_tasks(failing_evaluate, tasks, backend="ray")
