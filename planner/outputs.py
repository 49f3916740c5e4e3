"""Files the user asked us to write: checked before any work is done, written whole or not at all.

Every command that writes a file (``plan --out``, ``whatif --csv``, ``--plot``, ``--gantt``, ``models build
--out``, ``profile --out``, ``split --out-dir``) checks its path here first, so a typo fails in a second, not
after minutes of search or measurement, and writes through :func:`atomic_open` (or :func:`write_text`,
:func:`write_bytes`): the bytes go to a temporary file in the target's folder, which replaces the target
(``os.replace``) only once it is complete. An interrupted or failing run therefore never leaves a truncated
file where a good one was, and on an error the temporary file is removed. A target that exists and is not a
regular file (``/dev/null``, ``/dev/stdout``, a named pipe) is written straight into instead, since replacing
it would turn the device or pipe into a plain file. An unwritable or empty path is a :class:`ConfigError`
naming the flag, never a traceback.
"""

from __future__ import annotations

import os
import stat
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any, Iterator, Sequence

from planner.errors import ConfigError

TEMP_SUFFIX = ".part"  # a temporary file is named .<target name>.<random><TEMP_SUFFIX>


def check_output_file(path: str | os.PathLike, flag: str, suffixes: Sequence[str] = ()) -> Path:
    """``path`` as a Path if a file can be written there: not empty, its suffix one of ``suffixes`` (lower
    case, with the dot; any suffix when empty), not a folder, and in a folder that exists."""
    if isinstance(path, str) and not path:
        raise ConfigError(f"{flag}: the path is empty; give a file name")
    target = Path(path)
    if suffixes and target.suffix.lower() not in suffixes:
        raise ConfigError(f"{flag} {path}: write a {' or '.join(suffixes)} file")
    try:
        if target.is_dir():
            raise ConfigError(f"{flag} {path}: is a folder; give a file name")
        parent = target.parent
        if not parent.is_dir():
            what = f"{str(parent)!r} is not a folder" if parent.exists() else \
                f"folder {str(parent)!r} does not exist; create it first"
            raise ConfigError(f"{flag} {path}: {what}")
        os.stat(target)
    except FileNotFoundError:  # a new file
        pass
    except OSError as exc:  # a name too long, a loop of links
        raise ConfigError(f"{flag} {path}: cannot write there ({exc.strerror or exc}); choose another path") from None
    return target


def check_distinct(outputs: Sequence[tuple[str, str | os.PathLike | None]],
                   inputs: Sequence[tuple[str, str | os.PathLike | None]]) -> None:
    """Refuse a run whose output path (``(flag, path)``, None: not given) names one of its input files or
    another output: writing it would destroy what the run reads, or the first output."""
    seen: dict[str, str] = {}
    for name, path in inputs:
        if path is not None and os.path.isfile(path):
            seen.setdefault(os.path.realpath(path), name)
    for flag, path in outputs:
        if path is None:
            continue
        real = os.path.realpath(path)
        if real in seen:
            raise ConfigError(f"{flag} {path}: is also {seen[real]}, which the run would overwrite; give "
                              "another path")
        seen[real] = flag


def write_error(path: str | os.PathLike, flag: str, exc: OSError) -> ConfigError:
    """The error for an OS error while writing ``path`` (raise it ``from None``)."""
    return ConfigError(f"{flag} {path}: cannot write it ({exc.strerror or exc}); choose a writable path")


def _new_file_mode(target: Path) -> int:
    """The permissions the file would get from a plain open(): the old file's, else 0o666 less the umask."""
    try:
        return os.stat(target).st_mode & 0o7777
    except FileNotFoundError:
        umask = os.umask(0)
        os.umask(umask)
        return 0o666 & ~umask


# where the system keeps the names of open streams (/dev/stdout, /dev/fd/N, /proc/self/fd/N)
_STREAM_DIRS = ("/dev/", "/proc/")


def _is_special(path: str | os.PathLike) -> bool:
    """Whether ``path`` exists and is, after following symbolic links, something other than a regular file or
    a folder. The path itself is followed, not its realpath: ``/dev/stdout`` resolves through /proc to a name
    such as ``pipe:[123]`` that cannot be opened, while the link itself can."""
    if str(path).startswith(_STREAM_DIRS):  # /dev/stdout redirected to a file: replacing it would cut the
        return os.path.exists(path)          # shell's file from the rest of the output
    try:
        mode = os.stat(path).st_mode
    except OSError:  # absent (a new file) or unreadable: the temporary-file path reports the problem
        return False
    return not stat.S_ISREG(mode) and not stat.S_ISDIR(mode)


@contextmanager
def atomic_open(path: str | os.PathLike, binary: bool = False) -> Iterator[IO[Any]]:
    """A file to write ``path``'s new content to: a temporary file beside it that replaces ``path`` when the
    block ends without an exception, and is removed when it ends with one. OS errors propagate. A symbolic
    link is written through (its target is replaced), as a plain open() would. An existing target that is
    not a regular file (a character device, a named pipe, a socket) is opened and written directly, as a
    plain open() would: it cannot be replaced without destroying it, and it holds no content to protect."""
    if _is_special(path):
        with open(path, "wb" if binary else "w", **({} if binary else {"encoding": "utf-8"})) as handle:
            yield handle
        return
    target = Path(os.path.realpath(path))
    fd, temp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=TEMP_SUFFIX, dir=target.parent)
    try:
        os.chmod(temp, _new_file_mode(target))
        with os.fdopen(fd, "wb" if binary else "w", **({} if binary else {"encoding": "utf-8"})) as handle:
            yield handle
            handle.flush()
            os.fsync(handle.fileno())  # the bytes are on disk before the name points at them
        os.replace(temp, target)
    except BaseException:
        try:
            os.unlink(temp)
        except FileNotFoundError:
            pass
        raise


def write_bytes(path: str | os.PathLike, data: bytes, flag: str) -> Path:
    """Write ``data`` to ``path`` whole (:func:`atomic_open`); an OS error is a ConfigError naming ``flag``."""
    try:
        with atomic_open(path, binary=True) as handle:
            handle.write(data)
    except OSError as exc:
        raise write_error(path, flag, exc) from None
    return Path(path)


def write_text(path: str | os.PathLike, text: str, flag: str) -> Path:
    """Write ``text`` (UTF-8) to ``path`` whole (:func:`atomic_open`); an OS error is a ConfigError naming
    ``flag`` and the reason."""
    try:
        with atomic_open(path) as handle:
            handle.write(text)
    except OSError as exc:
        raise write_error(path, flag, exc) from None
    return Path(path)
