"""``NAME=VALUE`` items of a repeated command-line flag (``--dim``, ``models build --set``, ``whatif --sweep``),
split in one place so that every flag reports a malformed item alike."""

from __future__ import annotations

from typing import Sequence

from planner.errors import ConfigError


def split_assignments(items: Sequence[str], flag: str, form: str, example: str,
                      once: str | None = None) -> list[tuple[str, str]]:
    """``["a=1", "b=x"]`` of a repeated ``flag`` -> ``[("a", "1"), ("b", "x")]``; an item without ``=`` or
    without a name is a ConfigError showing ``form`` and ``example``. With ``once`` (the fix to suggest), a
    name given twice is a ConfigError too."""
    pairs: list[tuple[str, str]] = []
    seen: set[str] = set()
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name.strip():
            raise ConfigError(f"{flag} {item!r}: expected {form}, e.g. {flag} {example}")
        name = name.strip()
        if once is not None and name in seen:
            raise ConfigError(f"{flag} {name}: given twice; {once}")
        seen.add(name)
        pairs.append((name, value))
    return pairs
