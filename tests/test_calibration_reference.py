"""The shipped calibration still reproduces the published reference runs within the stated error.

``benchmarks/calibrate.py --fit`` writes, per run, the two configurations at the ends of its predicted range
(the fastest and the slowest the source allows) and the in-sample error it found. Here each run's range is
estimated again with the shipped calibration: a change to the cost model that moves the predictions away
from the measured runs fails this test until the calibration is refitted and BENCHMARKS.md says so.
"""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from reference_runs import Prediction, Run, load_runs  # noqa: E402
from planner.cost.calibration import calibration_for  # noqa: E402

CHECK = json.loads((ROOT / "benchmarks" / "results" / "calibration_check.json").read_text())
RUNS = {r["id"]: r for r in load_runs()}
SLACK_PERCENT = 1.0  # room for rounding in the stated figures


def _range(entry: dict) -> tuple[Run, Prediction]:
    run = Run(RUNS[entry["id"]])
    base = run.published()
    ends = tuple(replace(base, **{k: entry[end][k] for k in ("micro_batch", "recompute", "sequence_parallel",
                                                              "zero", "vpp")}) for end in ("low", "high"))
    return run, run.predict(calibration_for(run.device, run.runtime), ends)


def test_every_reference_run_is_checked():
    assert sorted(e["id"] for e in CHECK["runs"]) == sorted(RUNS)


@pytest.mark.parametrize("entry", CHECK["runs"], ids=[e["id"] for e in CHECK["runs"]])
def test_run_within_the_stated_worst_error(entry):
    run, prediction = _range(entry)
    error = abs(prediction.error(run.measured_s)) * 100.0
    assert error <= CHECK["stated_worst_percent"] + SLACK_PERCENT, (
        f"{run.id}: {error:.1f}% from its predicted range {prediction.low_s:.3f}-{prediction.high_s:.3f} s "
        f"(measured {run.measured_s:.3f} s); refit with benchmarks/calibrate.py --fit")


def test_mean_error_as_stated():
    errors = [abs(p.error(r.measured_s)) * 100.0 for r, p in map(_range, CHECK["runs"])]
    assert sum(errors) / len(errors) <= CHECK["stated_mape_percent"] + SLACK_PERCENT
