"""The scripts in examples/ run (as a user would run them, in a fresh interpreter) and print their results."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXPECTED = {  # script -> text its output must contain
    "plan_from_python.py": ["--tensor-model-parallel-size", "saved and reloaded", "Search:"],
    "estimate_config.py": ["resolved: micro-batch", "compute"],
    "compare_clusters.py": ["fastest:", "dgx-h100*1"],
}


def test_every_example_is_tested():
    scripts = sorted(f for f in os.listdir(os.path.join(ROOT, "examples")) if f.endswith(".py"))
    assert scripts == sorted(EXPECTED)


@pytest.mark.parametrize("script", sorted(EXPECTED))
def test_example_runs(script):
    env = {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
    out = subprocess.run([sys.executable, os.path.join(ROOT, "examples", script)], capture_output=True, text=True,
                         env=env, timeout=240, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-3000:]
    for text in EXPECTED[script]:
        assert text in out.stdout, (text, out.stdout[-2000:])
