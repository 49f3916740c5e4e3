"""Checks of the Python API's arguments: a wrong type or value is a ConfigError naming the parameter.

The CLI's parser checks its flags before any of these run; a script calling ``planner.estimate``, ``plan``,
``whatif`` or a loader gets the same kind of one-line error instead of a TypeError from deep inside.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from numbers import Integral, Real
from typing import Any

from planner.errors import ConfigError

# what to pass as ``options=`` (planner.solver.SolverOptions), said by every entry point that takes it
SOLVER_OPTIONS_FIX = "give planner.solver.SolverOptions(work=1, seed=0) or None"


def instance(value: Any, kind: type | tuple[type, ...], name: str, fix: str) -> None:
    """Raise unless ``value`` is a ``kind``; ``fix`` says what to pass instead."""
    if not isinstance(value, kind):
        raise ConfigError(f"{name}: got a {type(value).__name__}; {fix}")


def optional(value: Any, kind: type | tuple[type, ...], name: str, fix: str) -> None:
    """:func:`instance`, where None is also accepted."""
    if value is not None:
        instance(value, kind, name, fix)


def function(value: Any, name: str, call: str) -> None:
    """Raise unless ``value`` is None or callable; ``call`` shows how it is called, e.g. ``progress(fraction)``."""
    optional(value, Callable, name, f"give a function {call} or None")


def whole(value: Any, name: str, least: int = 1, most: int | None = None) -> int:
    """``value`` as an int: an integer (not a bool) of at least ``least`` and at most ``most`` (None: any)."""
    if isinstance(value, bool) or not isinstance(value, Integral) or value < least:
        kind = {0: "a non-negative integer", 1: "a positive integer"}.get(least, f"an integer of at least {least}")
        raise ConfigError(f"{name}={value!r} must be {kind}")
    if most is not None and value > most:
        raise ConfigError(f"{name}={value} is over {most}, the largest the planner takes")
    return int(value)


def degree(value: Any, name: str, pin: bool = False) -> int:
    """A parallel degree (tp, pp, dp, cp) as an int: 1 or more, or with ``pin`` 0 too (a plan's pin that leaves
    the degree to the search). A negative degree and a 0 where 0 is not taken get the same message."""
    if isinstance(value, bool) or not isinstance(value, Integral) or value < (0 if pin else 1):
        raise ConfigError(f"{name}={value!r} must be a positive integer (0, only in the pins of a plan, leaves "
                          f"{name} to the search)")
    return int(value)


def seconds(value: Any, name: str) -> float:
    """``value`` as a float: a finite number of seconds above 0."""
    if isinstance(value, bool) or not isinstance(value, Real) or not math.isfinite(value) or value <= 0:
        raise ConfigError(f"{name}={value!r} must be a positive number of seconds")
    return float(value)


def path_like(value: Any, name: str, what: str) -> None:
    """Raise unless ``value`` is a path (a str or os.PathLike); ``what`` says what the path should name."""
    instance(value, (str, os.PathLike), name, f"give the path of {what}")
