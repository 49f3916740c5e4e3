"""`planner.plan` and `planner.whatif` are the API's functions; no submodule of `planner` has those names.
The submodules themselves load when named as attributes of `planner`."""

import subprocess
import sys


def test_planner_plan_stays_the_function_after_importing_the_modules():
    code = ("import planner.plans, planner.sweep.whatif; from planner.plans import Plan; import planner; "
            "assert callable(planner.plan) and not hasattr(planner.plan, '__file__'), planner.plan; "
            "assert callable(planner.whatif) and not hasattr(planner.whatif, '__file__'), planner.whatif; "
            "assert planner.Plan is Plan")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr


def test_submodules_load_on_attribute_access_after_a_bare_import():
    """docs/api.md writes ``planner.builders.build(...)`` after ``import planner``: a submodule named as an
    attribute is imported then, not before, and an unknown name is still an AttributeError."""
    code = ("import sys, planner; "
            "assert 'planner.builders' not in sys.modules and 'planner.search' not in sys.modules; "
            "assert callable(planner.builders.build); "
            "names = ('solver', 'search', 'rules', 'cost', 'export', 'sweep'); "
            "assert all(getattr(planner, n) is sys.modules['planner.' + n] for n in names); "
            "assert callable(planner.plan) and not hasattr(planner.plan, '__file__'); "
            "assert not hasattr(planner, 'no_such_module') and not hasattr(planner, '__wrapped__'); "
            "assert not hasattr(planner, 'schemas')")  # a data folder, not a module
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
