"""Calibrate the cost model against published measured runs and report its accuracy.

    python benchmarks/calibrate.py            # predicted vs measured: in-sample and leave-one-source-out
    python benchmarks/calibrate.py --fit      # also rewrite planner/data/calibration.yaml and the check file

Runs: benchmarks/data/calibration_runs.json (Megatron-LM SC'21 Table 1 on A100; the Megatron-Core table of the
Megatron-LM README on H100), each under the runtime its source used (``reference_runs.RUNTIME_OF_SOURCE``).
What a source states is pinned; what it leaves open spans every value the runtime can run, so each run's
prediction is a range (the fastest and the slowest configuration that fits in memory), and its error is the
distance from the measured time to that range (0 inside it). The "fastest" column shows what the cost model's
own best choice would give.

Fitting: per (runtime, device type), the parameters ``FITTED`` (planner/cost/calibration.py) minimise the
squared log distance of the measured times to their ranges plus a small pull of every parameter towards 1
(the datasheet and the graph as they are), so that the fit corrects the physics as little as the runs allow.
The configurations at the ends of each range are resolved with the current parameters, the parameters fitted
with them fixed, and resolved again (``ROUNDS``).

Leave-one-source-out: for each source, the parameters are fitted on the other sources only; the left-out
source's (runtime, device) pairs then borrow them as ``planner.cost.calibration`` borrows for any unfitted
pair (the mean of the same device type's entries, else of all), and its runs are predicted.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
from scipy.optimize import least_squares

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from reference_runs import Prediction, Run, load_runs  # noqa: E402
from planner.cost.calibration import (CALIBRATION_PATH, DeviceCalibration, calibration_for,  # noqa: E402
                                      mean_calibration)

CHECK_PATH = ROOT / "benchmarks" / "results" / "calibration_check.json"
# fitted parameter: (lower bound, upper bound)
FITTED = {
    "gemm_scale": (0.3, 1.5),
    "memory_scale": (0.3, 3.0),
}
PRIOR_WEIGHT = 0.05  # residual weight of log(parameter): a tenfold smaller pull than a run's log error
ROUNDS = 2
Pair = tuple[str, str]  # (runtime, device)


def with_params(base: DeviceCalibration, values: np.ndarray) -> DeviceCalibration:
    return replace(base, **{name: float(v) for name, v in zip(FITTED, values)}, fitted=True)


def _distance(prediction: Prediction, measured_s: float) -> float:
    """log distance of the measured time to the predicted range (0 inside)."""
    if measured_s < prediction.low_s:
        return math.log(prediction.low_s / measured_s)
    if measured_s > prediction.high_s:
        return math.log(prediction.high_s / measured_s)
    return 0.0


def fit(runs: list[Run], start: DeviceCalibration) -> DeviceCalibration:
    """Parameters for one (runtime, device) pair from its runs."""
    cal = start
    lower = np.array([lo for lo, _ in FITTED.values()])
    upper = np.array([hi for _, hi in FITTED.values()])
    for _ in range(ROUNDS):
        ends = [run.predict(cal) for run in runs]
        configs = [(p.low, p.high) for p in ends]

        def residuals(values: np.ndarray) -> np.ndarray:
            trial = with_params(cal, values)
            errors = [_distance(run.predict(trial, pair), run.measured_s) for run, pair in zip(runs, configs)]
            return np.array(errors + list(PRIOR_WEIGHT * np.log(values)))

        x0 = np.clip(np.array([getattr(cal, name) for name in FITTED]), lower, upper)
        result = least_squares(residuals, x0, bounds=(lower, upper), diff_step=1e-3, xtol=1e-6, ftol=1e-8)
        cal = with_params(cal, result.x)
    return cal


def fit_all(runs: list[Run]) -> dict[Pair, DeviceCalibration]:
    pairs = sorted({(r.runtime, r.device) for r in runs})
    return {pair: fit([r for r in runs if (r.runtime, r.device) == pair], DeviceCalibration(fitted=True))
            for pair in pairs}


def borrowed(fits: dict[Pair, DeviceCalibration], pair: Pair) -> DeviceCalibration:
    """What ``planner.cost.calibration.calibration_for`` gives an unfitted pair, over ``fits``."""
    if pair in fits:
        return fits[pair]
    same = [c for (_, device), c in sorted(fits.items()) if device == pair[1]]
    return mean_calibration(same or [c for _, c in sorted(fits.items())])


def percent(x: float) -> float:
    return 100.0 * x


def describe(config) -> str:
    return (f"mb {config.micro_batch}, {config.recompute}, {'sp' if config.sequence_parallel else 'no sp'}, "
            f"z{config.zero}, vpp {config.vpp}")


def write_calibration(fits: dict[Pair, DeviceCalibration], runs: list[Run]) -> None:
    lines = [
        "# Efficiency parameters of the cost model per (runtime, device type) (planner/cost/calibration.py).",
        f"# Fitted by `python benchmarks/calibrate.py --fit` on {time.strftime('%Y-%m-%d', time.gmtime())} to "
        "the measured iteration times",
        "# of benchmarks/data/calibration_runs.json, each run under its source's runtime:",
    ]
    for pair in sorted(fits):
        ids = [r.id for r in runs if (r.runtime, r.device) == pair]
        lines.append(f"#   {pair[0]} / {pair[1]}: {', '.join(ids)}")
    lines.append("# Never per run: one set of values per (runtime, device type).")
    lines.append("runtimes:")
    for runtime in sorted({p[0] for p in fits}):
        lines.append(f"  {runtime}:")
        for (rt, device), cal in sorted(fits.items()):
            if rt != runtime:
                continue
            lines.append(f"    {device}:")
            for name in FITTED:
                lines.append(f"      {name}: {getattr(cal, name):.4f}")
    CALIBRATION_PATH.write_text("\n".join(lines) + "\n")


def write_check(runs: list[Run], predictions: dict[str, Prediction], mape: float, worst: float) -> None:
    """The configurations at each run's range ends and the stated in-sample error, for
    tests/test_calibration_reference.py (which re-estimates them with the shipped calibration)."""
    document = {
        "description": "In-sample check of the shipped calibration: each run's predicted range over the "
                       "configurations its source allows, as benchmarks/calibrate.py --fit left it.",
        "stated_mape_percent": round(mape, 2), "stated_worst_percent": round(worst, 2),
        "runs": [{"id": r.id, "measured_s": r.measured_s,
                  "low": {**_fields(predictions[r.id].low), "predicted_s": round(predictions[r.id].low_s, 6)},
                  "high": {**_fields(predictions[r.id].high), "predicted_s": round(predictions[r.id].high_s, 6)}}
                 for r in runs],
    }
    CHECK_PATH.write_text(json.dumps(document, indent=1, sort_keys=True) + "\n")


def _fields(config) -> dict:
    return {k: getattr(config, k) for k in ("micro_batch", "recompute", "sequence_parallel", "zero", "vpp")}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fit", action="store_true", help="rewrite planner/data/calibration.yaml")
    args = parser.parse_args(argv)
    started = time.time()
    runs = [Run(r) for r in load_runs()]
    for r in runs:
        _ = r.configurations
    print(f"# {len(runs)} runs; models built and configurations listed in {time.time() - started:.1f} s")
    fits = fit_all(runs)
    for pair, cal in sorted(fits.items()):
        print(f"# fitted {pair[0]} / {pair[1]}: " + ", ".join(f"{k}={getattr(cal, k):.4f}" for k in FITTED))
    out_of_source: dict[str, Prediction] = {}
    for source in sorted({r.source for r in runs}):
        others = fit_all([r for r in runs if r.source != source])
        for r in runs:
            if r.source == source:
                out_of_source[r.id] = r.predict(borrowed(others, (r.runtime, r.device)))
        print(f"# without {source}: " + "; ".join(
            f"{p[0]} / {p[1]} " + ", ".join(f"{k}={getattr(c, k):.4f}" for k in FITTED)
            for p, c in sorted(others.items())))
    use = fits if args.fit else {(r.runtime, r.device): calibration_for(r.device, r.runtime) for r in runs}
    print()
    print("| run | runtime | tp | pp | dp | measured s | range s (fitted) | err % | fastest choice | "
          "fastest err % | left-out-source range s | left-out err % |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    inside, outside, fastest = [], [], []
    predictions: dict[str, Prediction] = {}
    for r in runs:
        p = r.predict(use[(r.runtime, r.device)])
        predictions[r.id] = p
        q = out_of_source[r.id]
        e_in, e_out = p.error(r.measured_s), q.error(r.measured_s)
        e_fast = (p.low_s - r.measured_s) / r.measured_s
        inside.append(abs(e_in))
        outside.append(abs(e_out))
        fastest.append(abs(e_fast))
        cfg = r.run
        print(f"| {r.id} | {r.runtime} | {cfg['tp']} | {cfg['pp']} | {cfg['dp']} | {r.measured_s:.3f} | "
              f"{p.low_s:.3f}-{p.high_s:.3f} | {percent(e_in):+.1f} | {describe(p.low)} | {percent(e_fast):+.1f} | "
              f"{q.low_s:.3f}-{q.high_s:.3f} | {percent(e_out):+.1f} |")
    print()
    for source in sorted({r.source for r in runs}):
        errs = [outside[i] for i, r in enumerate(runs) if r.source == source]
        print(f"{source}: left out, MAPE {percent(np.mean(errs)):.1f}%, worst {percent(np.max(errs)):.1f}% "
              f"({len(errs)} runs)")
    mape_in, worst_in = percent(np.mean(inside)), percent(np.max(inside))
    print(f"all: in-sample MAPE {mape_in:.1f}% (worst {worst_in:.1f}%); leave-one-source-out MAPE "
          f"{percent(np.mean(outside)):.1f}% (worst {percent(np.max(outside)):.1f}%); the cost model's fastest "
          f"choice in-sample MAPE {percent(np.mean(fastest)):.1f}% (worst {percent(np.max(fastest)):.1f}%)")
    if args.fit:
        write_calibration(fits, runs)
        write_check(runs, predictions, mape_in, worst_in)
        print(f"wrote {CALIBRATION_PATH.relative_to(ROOT)} and {CHECK_PATH.relative_to(ROOT)}")
    print(f"# {time.time() - started:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
