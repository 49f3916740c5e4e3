"""Files the user asked us to write: checked before any work is done, written with one readable error.

Every command that writes a file (``plan --out``, ``whatif --csv``, ``--plot``, ``--gantt``, ``models build
--out``, ``profile --out``) checks its path here first, so a typo fails in a second, not after minutes of
search or measurement, and writes through :func:`write_text` (or checks again just before its own writer),
so an unwritable path is a :class:`ConfigError` naming the flag, never a traceback.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Sequence

from planner.errors import ConfigError


def check_output_file(path: str | os.PathLike, flag: str, suffixes: Sequence[str] = ()) -> Path:
    """``path`` as a Path if a file can be written there: its suffix one of ``suffixes`` (lower case, with
    the dot; any suffix when empty), not a folder, and in a folder that exists."""
    target = Path(path)
    if suffixes and target.suffix.lower() not in suffixes:
        raise ConfigError(f"{flag} {path}: write a {' or '.join(suffixes)} file")
    if target.is_dir():
        raise ConfigError(f"{flag} {path}: is a folder; give a file name")
    parent = target.parent
    if not parent.is_dir():
        raise ConfigError(f"{flag} {path}: folder {str(parent)!r} does not exist; create it first")
    return target


def write_error(path: str | os.PathLike, flag: str, exc: OSError) -> ConfigError:
    """The error for an OS error while writing ``path`` (raise it ``from None``)."""
    return ConfigError(f"{flag} {path}: cannot write it ({exc.strerror or exc}); choose a writable path")


def write_text(path: str | os.PathLike, text: str, flag: str) -> Path:
    """Write ``text`` (UTF-8) to ``path``; an OS error is a ConfigError naming ``flag`` and the reason."""
    target = Path(path)
    try:
        target.write_text(text, encoding="utf-8")
    except OSError as exc:
        raise write_error(path, flag, exc) from None
    return target
