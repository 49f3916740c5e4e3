"""User-facing errors.

Every mistake a user can make (a bad file, an unknown name, an impossible request) raises a subclass of
:class:`PlannerError` whose message names the input at fault and, where one exists, the fix. The CLI prints
``planner: error: <message>`` on one line and exits 2. Anything else that escapes is a bug (exit 1).
"""

from __future__ import annotations

from difflib import get_close_matches
from typing import Iterable, Sequence


class PlannerError(Exception):
    """Base class of every error caused by the user's input or request."""


class ModelError(PlannerError):
    """The ONNX model cannot be read or understood."""


class ClusterError(PlannerError):
    """The cluster description or a hardware profile is wrong."""


class ConfigError(PlannerError):
    """A parallel configuration or a command-line option is invalid."""


class InfeasibleError(PlannerError):
    """The request is well formed but no plan fits (memory, device count)."""


def suggest(name: str, known: Iterable[str], n: int = 3) -> str:
    """Return ``" (did you mean a, b?)"`` for the closest known names, or ``""``."""
    matches = get_close_matches(name, sorted(known), n=n, cutoff=0.5)
    return f" (did you mean {', '.join(matches)}?)" if matches else ""


def either(words: Sequence[str]) -> str:
    """``"a"``, ``"a or b"``, ``"a, b or c"`` (``""`` for none): alternatives in a message."""
    return ", ".join(words[:-1]) + f" or {words[-1]}" if len(words) > 1 else "".join(words)
