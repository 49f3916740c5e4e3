"""``planner show PLAN.json [--format ...]``: render a saved plan."""

from __future__ import annotations

import argparse
import sys

from planner.plans import load_plan
from planner.report import FORMATS, render

HELP = "render a saved plan (table, json, megatron, deepspeed, torchrec)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("plan", metavar="PLAN.json", help="a plan written by 'planner plan ... --out FILE'")
    parser.add_argument("--format", default="table", choices=FORMATS, help="output format (default: table)")
    parser.add_argument("--json", action="store_true", help="same as --format json")


def run(args: argparse.Namespace) -> int:
    plan = load_plan(args.plan)
    sys.stdout.write(render(plan, "json" if args.json else args.format))
    return 0
