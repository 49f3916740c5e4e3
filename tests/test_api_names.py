"""`planner.plan` and `planner.whatif` are the API's functions; no submodule of `planner` has those names."""

import subprocess
import sys


def test_planner_plan_stays_the_function_after_importing_the_modules():
    code = ("import planner.plans, planner.sweep.whatif; from planner.plans import Plan; import planner; "
            "assert callable(planner.plan) and not hasattr(planner.plan, '__file__'), planner.plan; "
            "assert callable(planner.whatif) and not hasattr(planner.whatif, '__file__'), planner.whatif; "
            "assert planner.Plan is Plan")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
