"""The ``planner`` command line: parse, call the API, print. Each command lives in
``planner/commands/<name>.py`` and exposes ``NAME``, ``HELP``, ``add_arguments(parser)`` and ``run(args) -> int``.

Exit codes: 0 success; 2 bad input, an infeasible request or an output that cannot be written (one line
``planner: error: ...`` on stderr); 1 a bug.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from importlib import import_module
from typing import Any, Sequence, TextIO

from planner import __version__
from planner.errors import ConfigError, PlannerError

# the order in which commands are listed in --help
COMMANDS = ("inspect", "models", "devices", "estimate", "plan", "whatif", "profile", "split", "show", "schema")


class _Once(argparse._StoreAction):
    """An option that takes one value: given twice (``--tp 2 ... --tp 4``), it is refused rather than the last
    one silently taken."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        given = namespace.__dict__.setdefault("_given_once", {})
        if self.dest in given:
            parser.error(f"{option_string} is given twice ({given[self.dest]}, then {option_string} {values}); "
                         "give it once")
        given[self.dest] = f"{option_string} {values}"
        super().__call__(parser, namespace, values, option_string)


class _Parser(argparse.ArgumentParser):
    """argparse that reports usage errors as one line and exit code 2, like PlannerError, and refuses an
    option of one value given twice."""

    def add_argument(self, *args: Any, **kwargs: Any) -> argparse.Action:
        if args and str(args[0]).startswith("-") and kwargs.get("action", "store") == "store":
            kwargs["action"] = _Once
        return super().add_argument(*args, **kwargs)

    def error(self, message: str) -> None:  # type: ignore[override]
        sys.stderr.write(f"planner: error: {message} (see 'planner --help')\n")
        raise SystemExit(2)


class OutputError(ConfigError):
    """Standard output could not be written (a full disk, a closed terminal): the result is lost, and the
    user's fix is to send the output somewhere writable."""


class _Stdout:
    """``sys.stdout`` while a command runs: the stream it wraps, except that an OS error from writing or
    flushing becomes an :class:`OutputError`, so it is reported in one line like bad input, while an OS
    error from anywhere else stays a bug. A broken pipe (the reader stopped early, as ``| head`` does) is
    passed on unchanged; main ends quietly on it."""

    def __init__(self, stream: TextIO | None) -> None:
        self.stream = stream

    def _call(self, method: str, *args: Any) -> Any:
        if self.stream is None:  # the process started with stdout closed (``>&-``)
            raise OutputError("cannot write the output: stdout is closed; send it to a file or a terminal")
        try:
            return getattr(self.stream, method)(*args)
        except BrokenPipeError:
            raise
        except OSError as exc:
            raise OutputError(f"cannot write the output to stdout ({exc.strerror or exc}); send it to a "
                              f"writable file or terminal") from None

    def write(self, text: str) -> int:
        return self._call("write", text)

    def writelines(self, lines: Any) -> None:
        self._call("writelines", lines)

    def flush(self) -> None:
        self._call("flush")

    def __getattr__(self, name: str) -> Any:  # isatty, fileno, encoding, ...: the wrapped stream's
        return getattr(self.stream, name)


def _discard_stdout(stream: TextIO) -> None:
    """Point the process's standard output at the null device once writing it has failed, so that the
    interpreter's flush at exit of what is still buffered does not fail again (a second message and exit
    code 120). Only the real stdout: a stream put in its place (a test's capture) is left alone."""
    if stream is None or stream is not sys.__stdout__:  # closed from the start, or a test's capture
        return
    try:
        null = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(null, stream.fileno())
        finally:
            os.close(null)
    except (OSError, ValueError):  # no file descriptor behind it: nothing left to flush at exit either
        pass


class _HeldWarnings(logging.StreamHandler):
    """The command's log on stderr, its warnings held back until it ends: printed when it succeeds (or
    ends on a bug or an interrupt), dropped when it fails on the user's input, so that stderr then holds the
    one error line alone. Lower levels (``--verbose`` progress) are written at once."""

    def __init__(self, verbose: bool) -> None:
        super().__init__(sys.stderr)
        self.setLevel(logging.INFO if verbose else logging.WARNING)
        self.setFormatter(logging.Formatter("planner: %(message)s"))
        self.held: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        if record.levelno >= logging.WARNING:
            self.held.append(record)
        else:
            super().emit(record)

    def show_held(self) -> None:
        """Print the held warnings (once)."""
        held, self.held = self.held, []
        for record in held:
            super().emit(record)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="planner", description="Plan parallel training of an ONNX model on a cluster.")
    parser.add_argument("--version", action="version", version=f"planner {__version__}")
    _add_verbose(parser, default=False)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for name in COMMANDS:
        module = import_module(f"planner.commands.{name}")
        cmd = sub.add_parser(name, help=module.HELP, description=module.HELP)
        # -v after the command too; SUPPRESS leaves the value given before it when it is not repeated after
        _add_verbose(cmd, default=argparse.SUPPRESS)
        module.add_arguments(cmd)
        cmd.set_defaults(_run=module.run)
    return parser


def _add_verbose(parser: argparse.ArgumentParser, default: Any) -> None:
    parser.add_argument("-v", "--verbose", action="store_true", default=default, help="log progress to stderr")


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "_run", None):  # one line, as every other mistake
        sys.stderr.write("planner: error: give a command, e.g. 'planner plan MODEL.onnx --cluster NODE*COUNT "
                         "--global-batch N' (see 'planner --help')\n")
        return 2
    root = logging.getLogger()
    level = root.level
    log = _HeldWarnings(args.verbose)
    root.addHandler(log)
    if args.verbose and root.getEffectiveLevel() > logging.INFO:
        root.setLevel(logging.INFO)
    stdout = sys.stdout
    sys.stdout = _Stdout(stdout)  # type: ignore[assignment]
    try:
        code = int(args._run(args) or 0)
        sys.stdout.flush()  # a failure to write what is still buffered is reported here, not at exit
        return code
    except PlannerError as exc:
        if isinstance(exc, OutputError):
            _discard_stdout(stdout)
        log.held.clear()  # the error line is all stderr holds
        message = " ".join(str(exc).split())
        sys.stderr.write(f"planner: error: {message}\n")
        return 2
    except KeyboardInterrupt:
        log.show_held()
        sys.stderr.write("planner: interrupted\n")
        return 130
    except BrokenPipeError:
        _discard_stdout(stdout)
        return 0
    finally:
        sys.stdout = stdout
        log.show_held()  # success, or a bug whose traceback follows
        root.removeHandler(log)
        root.setLevel(level)
