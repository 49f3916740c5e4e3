"""The ``planner`` command line: parse, call the API, print. Each command lives in
``planner/commands/<name>.py`` and exposes ``NAME``, ``HELP``, ``add_arguments(parser)`` and ``run(args) -> int``.

Exit codes: 0 success; 2 bad input or an infeasible request (one line ``planner: error: ...`` on stderr);
1 a bug.
"""

from __future__ import annotations

import argparse
import logging
import sys
from importlib import import_module
from typing import Sequence

from planner.errors import PlannerError

# the order in which commands are listed in --help
COMMANDS = ("inspect", "models", "devices", "estimate", "plan", "whatif", "profile", "split", "show", "schema")


class _Parser(argparse.ArgumentParser):
    """argparse that reports usage errors as one line and exit code 2, like PlannerError."""

    def error(self, message: str) -> None:  # type: ignore[override]
        sys.stderr.write(f"planner: error: {message} (see 'planner --help')\n")
        raise SystemExit(2)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="planner", description="Plan parallel training of an ONNX model on a cluster.")
    parser.add_argument("-v", "--verbose", action="store_true", help="log progress to stderr")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for name in COMMANDS:
        module = import_module(f"planner.commands.{name}")
        cmd = sub.add_parser(name, help=module.HELP, description=module.HELP)
        module.add_arguments(cmd)
        cmd.set_defaults(_run=module.run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, stream=sys.stderr,
                        format="planner: %(message)s")
    if not getattr(args, "_run", None):
        parser.print_help(sys.stderr)
        return 2
    try:
        return int(args._run(args) or 0)
    except PlannerError as exc:
        message = " ".join(str(exc).split())
        sys.stderr.write(f"planner: error: {message}\n")
        return 2
    except KeyboardInterrupt:
        sys.stderr.write("planner: interrupted\n")
        return 130
    except BrokenPipeError:
        return 0
