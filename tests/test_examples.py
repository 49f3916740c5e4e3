"""The scripts in examples/ run (as a user would run them, in a fresh interpreter) and print their results."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPTS = sorted(f for f in os.listdir(os.path.join(ROOT, "examples")) if f.endswith(".py"))
EXPECTED = {  # script -> text its output must contain (every script in examples/ runs, listed here or not)
    "plan_from_python.py": ["--tensor-model-parallel-size", "saved and reloaded", "Search:"],
    "estimate_config.py": ["resolved: micro-batch", "compute"],
    "compare_clusters.py": ["fastest:", "dgx-h100*1"],
}


def test_the_api_examples_exist():
    assert set(EXPECTED) <= set(SCRIPTS)


@pytest.mark.parametrize("script", SCRIPTS)
def test_example_runs(script, tmp_path):
    env = {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
    out = subprocess.run([sys.executable, os.path.join(ROOT, "examples", script)], capture_output=True, text=True,
                         env=env, timeout=240, cwd=tmp_path)  # files an example writes land in tmp_path
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip()
    for text in EXPECTED.get(script, ()):
        assert text in out.stdout, (text, out.stdout[-2000:])
