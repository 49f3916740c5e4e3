"""The Ray backend on the local Ray instance it starts. Ray is in the test extra, so CI runs these; an environment
without it skips them with the reason. The Ray driver runs in a child process (tests/ray_child.py): see there."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from planner.errors import PlannerError
from planner.sweep import runner

from whatif_fakes import fake_evaluate

TESTS = Path(__file__).resolve().parent


def test_missing_ray_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray -> ImportError
    with pytest.raises(PlannerError, match=r'^backend \'ray\' needs Ray: pip install "planner\[ray\]"'):
        runner.run_tasks(fake_evaluate, [], backend="ray")


@pytest.fixture(scope="module")
def ray_results(tmp_path_factory) -> dict:
    pytest.importorskip("ray", reason='Ray is not installed (optional extra: pip install "planner[ray]")')
    # the child and Ray's workers import planner and the fakes
    path = os.pathsep.join(p for p in (str(TESTS.parent), str(TESTS), os.environ.get("PYTHONPATH", "")) if p)
    # a temporary folder of the child's own, to see what Ray leaves in it (Ray's default is $TMPDIR/ray); short,
    # as Ray's socket paths under it must fit the 107 characters of a Unix socket's
    temp = tempfile.mkdtemp(prefix="pt-")
    env = {**os.environ, "PYTHONPATH": path, "TMPDIR": temp}
    env.pop("RAY_ADDRESS", None)
    # output to a file, not a pipe: Ray's daemons inherit the child's streams and may outlive it; the child in
    # a session of its own, so that a hang is ended with everything it started
    out = tmp_path_factory.mktemp("ray") / "child.txt"
    with open(out, "w") as sink:
        child = subprocess.Popen([sys.executable, str(TESTS / "ray_child.py")], stdout=sink,
                                 stderr=subprocess.STDOUT, env=env, start_new_session=True)
        try:
            child.wait(timeout=300)
        except subprocess.TimeoutExpired:
            os.killpg(child.pid, signal.SIGKILL)
            child.wait()
    left = sorted(os.listdir(temp))
    shutil.rmtree(temp)
    text = out.read_text()
    lines = [line for line in text.splitlines() if line.startswith("{")]
    if not lines:
        pytest.fail(f"the Ray child printed no result (exit {child.returncode}):\n{text[-3000:]}")
    return {**json.loads(lines[-1]), "output": text, "left": left}


def test_ray_backend_matches_processes(ray_results):
    assert ray_results["matches"] and ray_results["progress"] == list(range(1, 7))


def test_ray_workers_warnings_reach_the_caller_once_each(ray_results):
    assert ray_results["warned"] == ["the model's tables are not the file's"] + ray_results["points"]


def test_ray_backend_reraises_planner_errors(ray_results):
    assert "raised in a worker" in ray_results["error"]


def test_a_failed_ray_sweep_collects_its_points_in_flight(ray_results):
    assert "Unhandled error" not in ray_results["output"]


def test_a_local_ray_instance_leaves_no_files_behind(ray_results):
    """Ray keeps a local instance's session files (under $TMPDIR/ray by default) after it shuts down; the
    runner's instance keeps them in a folder of its own, removed at exit."""
    assert ray_results["left"] == []


def test_ray_start_up_lines_stay_off_stderr(ray_results):
    """A sweep's output (and a bad input's one error line) is not preceded by Ray's own start-up lines."""
    assert "Started a local Ray instance" not in ray_results["output"]
    assert "Token authentication" not in ray_results["output"]
