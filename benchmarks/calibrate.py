"""Calibrate the cost model against published measured runs and report its accuracy.

    python benchmarks/calibrate.py            # table of predicted vs measured, in-sample and leave-one-out
    python benchmarks/calibrate.py --fit      # also rewrite planner/data/calibration.yaml with the full fit

Runs: benchmarks/data/calibration_runs.json (Megatron-LM on A100, SC'21 Table 1; Megatron-Core on H100).
Each run's model is built with ``planner.builders`` (GPT family) and imported with ``planner.graph``; the
estimate uses the run's tp, pp, dp, global batch and recompute; what the source leaves open (micro-batch,
recompute "unknown", sequence parallelism, ZeRO) resolves to the best feasible choice, as ``planner
estimate`` does. The comparison is against ``derived_iteration_time_s`` (from each source's TFLOP/s and its
FLOP convention, given in the file).

Fitting: per device type, a few physical efficiency parameters (``FITTED``; see planner/cost/calibration.py)
minimise the squared log error of the predicted iteration times (scipy.optimize.least_squares, bounded).
Configurations are resolved with the current parameters, the parameters fitted with those configurations
fixed, and the configurations resolved again (two rounds). Leave-one-out: for each run, fit on the others of
its device type and predict it.
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

from planner.builders import build  # noqa: E402
from planner.cost import estimate  # noqa: E402
from planner.cost.calibration import CALIBRATION_PATH, DeviceCalibration, calibration_for  # noqa: E402
from planner.graph import import_model_proto  # noqa: E402
from planner.hardware import catalog, load_cluster  # noqa: E402
from planner.types import ParallelConfig  # noqa: E402

RUNS_PATH = ROOT / "benchmarks" / "data" / "calibration_runs.json"
# fitted parameter: (lower bound, upper bound)
FITTED = {
    "gemm_scale": (0.3, 1.5),
    "attention_traffic_scale": (0.0, 1.0),
    "dp_overlap": (0.0, 1.0),
}


def load_runs(path: Path) -> list[dict]:
    return json.loads(path.read_text())["runs"]


def model_of(run: dict):
    m = run["model"]
    settings = {"layers": m["layers"], "hidden": m["hidden"], "heads": m["heads"], "vocab": m["vocab"],
                "seq_len": m["seq_len"], "ffn": m["ffn"]}
    return import_model_proto(build(m["family"], settings), {"batch": 1})


def config_of(run: dict) -> ParallelConfig:
    recompute = run["recompute"] if run["recompute"] in ("none", "selective", "full") else None
    return ParallelConfig(global_batch=run["global_batch"], tp=run["tp"], pp=run["pp"], dp=run["dp"],
                          micro_batch=run["micro_batch"], recompute=recompute,
                          sequence_parallel=run["sequence_parallel"], zero=run["zero"])


def device_of(run: dict) -> str:
    return catalog.get_node(run["node"]).device.name


def with_params(base: DeviceCalibration, values: np.ndarray) -> DeviceCalibration:
    return replace(base, **{name: float(v) for name, v in zip(FITTED, values)}, fitted=True)


class Case:
    def __init__(self, run: dict) -> None:
        self.run = run
        self.model = model_of(run)
        self.cluster = load_cluster(f"{run['node']}*{run['gpus'] // catalog.get_node(run['node']).devices_per_node}")
        self.device = device_of(run)
        self.measured_s = float(run["derived_iteration_time_s"])

    def predict(self, cal: DeviceCalibration, config: ParallelConfig | None = None):
        return estimate(self.model, self.cluster, config or config_of(self.run), {self.device: cal})


def fit(cases: list[Case], start: DeviceCalibration) -> DeviceCalibration:
    cal = start
    for _ in range(2):
        resolved = [c.predict(cal).config for c in cases]

        def residuals(values: np.ndarray) -> np.ndarray:
            trial = with_params(cal, values)
            return np.array([math.log(c.predict(trial, cfg).iteration_time_s / c.measured_s)
                             for c, cfg in zip(cases, resolved)])

        x0 = np.array([min(max(getattr(cal, n), lo), hi) for n, (lo, hi) in FITTED.items()])
        lower = np.array([lo for lo, _ in FITTED.values()])
        upper = np.array([hi for _, hi in FITTED.values()])
        result = least_squares(residuals, x0, bounds=(lower, upper), diff_step=1e-3, xtol=1e-6, ftol=1e-6)
        cal = with_params(cal, result.x)
    return cal


def percent(pred: float, measured: float) -> float:
    return 100.0 * (pred - measured) / measured


def write_calibration(fits: dict[str, DeviceCalibration], runs_by_device: dict[str, list[str]]) -> None:
    lines = [
        "# Per-device-type efficiency parameters of the cost model (planner/cost/calibration.py).",
        f"# Fitted by `python benchmarks/calibrate.py --fit` on {time.strftime('%Y-%m-%d', time.gmtime())} to the",
        "# measured iteration times of benchmarks/data/calibration_runs.json:",
    ]
    for device, ids in sorted(runs_by_device.items()):
        lines.append(f"#   {device}: {', '.join(ids)}")
    lines.append("# Never per run: one set of values per device type.")
    lines.append("devices:")
    for device, cal in sorted(fits.items()):
        lines.append(f"  {device}:")
        for name, value in cal.as_dict().items():
            lines.append(f"    {name}: {value:.4f}")
    CALIBRATION_PATH.write_text("\n".join(lines) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fit", action="store_true", help="rewrite planner/data/calibration.yaml")
    parser.add_argument("--runs", default=str(RUNS_PATH))
    args = parser.parse_args(argv)
    started = time.time()
    runs = load_runs(Path(args.runs))
    cases = [Case(run) for run in runs]
    devices = sorted({c.device for c in cases})
    print(f"# {len(cases)} runs on {', '.join(devices)}; models built in {time.time() - started:.1f} s")
    fits: dict[str, DeviceCalibration] = {}
    loo: dict[str, float] = {}
    for device in devices:
        group = [c for c in cases if c.device == device]
        start = calibration_for(device)
        full = fit(group, start if start.fitted else DeviceCalibration(gemm_scale=0.8, attention_traffic_scale=0.5,
                                                                          dp_overlap=0.5))
        fits[device] = full
        for i, held in enumerate(group):
            others = group[:i] + group[i + 1:]
            loo[held.run["id"]] = held.predict(fit(others, full)).iteration_time_s
        print(f"# {device}: fitted " + ", ".join(f"{k}={v:.4f}" for k, v in full.as_dict().items()))
    stored = {d: calibration_for(d) for d in devices}
    use = fits if args.fit else stored
    print()
    print("| run | device | tp | pp | dp | resolved (mb, recompute, sp, zero, vpp) | measured s | "
          "fitted s | err % | left-out s | left-out err % |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    errors_in: list[float] = []
    errors_out: list[float] = []
    per_device_out: dict[str, list[float]] = {d: [] for d in devices}
    for c in cases:
        est = c.predict(use[c.device])
        cfg = est.config
        e_in = percent(est.iteration_time_s, c.measured_s)
        e_out = percent(loo[c.run["id"]], c.measured_s)
        errors_in.append(abs(e_in))
        errors_out.append(abs(e_out))
        per_device_out[c.device].append(abs(e_out))
        print(f"| {c.run['id']} | {c.device} | {cfg.tp} | {cfg.pp} | {cfg.dp} | "
              f"{cfg.micro_batch}, {cfg.recompute}, {'sp' if cfg.sequence_parallel else 'no sp'}, {cfg.zero}, "
              f"{cfg.vpp} | {c.measured_s:.3f} | {est.iteration_time_s:.3f} | {e_in:+.1f} | "
              f"{loo[c.run['id']]:.3f} | {e_out:+.1f} |")
    print()
    for device in devices:
        errs = per_device_out[device]
        print(f"{device}: leave-one-out MAPE {np.mean(errs):.1f}%, max {np.max(errs):.1f}% ({len(errs)} runs)")
    print(f"all: in-sample MAPE {np.mean(errors_in):.1f}% (max {np.max(errors_in):.1f}%); "
          f"leave-one-out MAPE {np.mean(errors_out):.1f}% (max {np.max(errors_out):.1f}%)")
    if args.fit:
        write_calibration(fits, {d: [c.run["id"] for c in cases if c.device == d] for d in devices})
        print(f"wrote {CALIBRATION_PATH.relative_to(ROOT)}")
    print(f"# {time.time() - started:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
