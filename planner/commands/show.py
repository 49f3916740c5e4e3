"""``planner show PLAN.json [--format ...]``: render a saved plan."""

from __future__ import annotations

import argparse
import logging
import sys

from planner.commands._common import output_format
from planner.errors import PlannerError
from planner.plans import in_plan_file, load_plan
from planner.report import FORMATS, render
from planner.rules import format_launches

log = logging.getLogger(__name__)

HELP = "render a saved plan (table, json, megatron, deepspeed, torchtitan, torchrec)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("plan", metavar="PLAN.json", help="a plan written by 'planner plan ... --out FILE'")
    parser.add_argument("--format", default="table", choices=FORMATS, help="output format (default: table)")
    parser.add_argument("--json", action="store_true", help="same as --format json")


def run(args: argparse.Namespace) -> int:
    fmt = output_format(args)
    plan = load_plan(args.plan)
    try:
        text = render(plan, fmt)
    except PlannerError as exc:  # an exporter's refusal names the plan as "plan": name the file it came from
        raise type(exc)(in_plan_file(args.plan, exc)) from None
    if not format_launches(fmt, plan.runtime):  # the options are written, but the plan was timed for another
        log.warning("%s was planned for the %s runtime, not the one --format %s launches: its times, and which "
                    "plan is fastest, may differ there; plan with --format %s for a plan timed for it", args.plan,
                    plan.runtime, fmt, fmt)
    sys.stdout.write(text)
    return 0
