"""``planner schema``: print the Plan JSON Schema."""

from __future__ import annotations

import argparse
import sys

from planner.plans import schema_text

HELP = "print the JSON Schema of plan files (schema_version 1)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="accepted for symmetry; the schema is always JSON")


def run(args: argparse.Namespace) -> int:
    sys.stdout.write(schema_text())
    return 0
