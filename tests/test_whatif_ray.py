"""The Ray backend on a local one-CPU Ray instance. Ray is in the test extra, so CI runs these; an environment
without it skips them with the reason. The Ray driver runs in a child process (tests/ray_child.py): see there."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from planner.errors import PlannerError
from planner.sweep import runner

from whatif_fakes import fake_evaluate

TESTS = Path(__file__).resolve().parent


def test_missing_ray_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray -> ImportError
    with pytest.raises(PlannerError, match=r'pip install "planner\[ray\]"'):
        runner.run_tasks(fake_evaluate, [], backend="ray")


@pytest.fixture(scope="module")
def ray_results() -> dict:
    pytest.importorskip("ray", reason='Ray is not installed (optional extra: pip install "planner[ray]")')
    # the child and Ray's workers import planner and the fakes
    path = os.pathsep.join(p for p in (str(TESTS.parent), str(TESTS), os.environ.get("PYTHONPATH", "")) if p)
    env = {**os.environ, "PYTHONPATH": path}
    done = subprocess.run([sys.executable, str(TESTS / "ray_child.py")], capture_output=True, text=True, env=env,
                          timeout=300, check=False)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if not lines:
        pytest.fail(f"the Ray child printed no result (exit {done.returncode}):\n{done.stderr[-3000:]}")
    return json.loads(lines[-1])


def test_ray_backend_matches_processes(ray_results):
    assert ray_results["matches"] and ray_results["progress"] == list(range(1, 7))


def test_ray_backend_reraises_planner_errors(ray_results):
    assert "raised in a worker" in ray_results["error"]
