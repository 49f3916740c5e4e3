"""Runs the Ray backend checks on the local Ray instance the runner starts and prints one JSON line of results.

tests/test_whatif_ray.py starts this in its own process: Ray's driver installs process-wide handlers and, when its
raylet goes away during ``ray.shutdown()``, can end the whole process. The verdict is the printed line, read
before Ray tears down, so Ray's own teardown cannot take the test session with it."""

from __future__ import annotations

import gc
import json
import logging
import sys
import time

import ray

from planner.errors import PlannerError
from planner.sweep import runner
from planner.sweep.whatif import PointTask

from whatif_fakes import failing_evaluate, fake_evaluate, points_for, warning_evaluate


def main() -> None:
    # the runner starts the local Ray instance, as `planner whatif --backend ray` does, so the output is what a
    # user sees; one CPU per core: on two cores or more points run side by side, so others are in flight when
    # one fails
    tasks = [PointTask("fake.onnx", p) for p in points_for({"fake-a100.count": ["0", "1", "2"],
                                                          "fake-h100.count": ["1", "3"]})]
    calls: list[int] = []
    on_ray = runner.run_tasks(fake_evaluate, tasks, backend="ray", workers=2, progress=lambda d, t: calls.append(d))
    caught = runner._Warnings()
    logging.getLogger().addHandler(caught)
    runner.run_tasks(warning_evaluate, tasks, backend="ray", workers=2)
    logging.getLogger().removeHandler(caught)
    warned = [message for name, _, message in caught.records if name == "planner.fake"]
    local = runner.run_tasks(fake_evaluate, tasks, workers=1)
    error = ""
    try:
        runner.run_tasks(failing_evaluate, [PointTask("fake.onnx", p) for p in points_for({"count": ["1"]})],
                         backend="ray")
    except PlannerError as exc:
        error = str(exc)
    # every point fails: the points in flight when the first fails must be collected, or Ray prints their
    # errors as "Unhandled error" (with tracebacks) once their references are dropped
    try:
        runner.run_tasks(failing_evaluate, [PointTask("fake.onnx", p) for p in
                                            points_for({"count": ["1", "2", "3", "4"]})], backend="ray")
    except PlannerError:
        pass
    gc.collect()
    time.sleep(2.0)  # Ray reports unhandled errors from a background thread
    print(json.dumps({"matches": on_ray == local, "progress": calls, "error": error, "warned": warned,
                      "points": [f"point {dict(t.inputs.settings)}" for t in tasks]}), flush=True)
    sys.stdout.flush()
    ray.shutdown()


if __name__ == "__main__":
    main()
