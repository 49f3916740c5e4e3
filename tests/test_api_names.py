"""`planner.plan` is the search function of the contract even though `planner/plan.py` is a module."""

import subprocess
import sys


def test_planner_plan_stays_the_function_after_importing_the_module():
    code = ("import planner.plan; from planner.plan import Plan; import planner; "
            "assert callable(planner.plan) and not hasattr(planner.plan, '__file__'), planner.plan; "
            "assert planner.Plan is Plan")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
