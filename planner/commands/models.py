"""``planner models list|build``: the model families the builder knows, and writing one as ONNX."""

from __future__ import annotations

import argparse
import sys

from planner.assignments import split_assignments
from planner.commands._common import add_json_flag, emit_json
from planner.errors import ConfigError
from planner.outputs import check_output_file

NAME = "models"
HELP = "list the model families the builder knows, or build one as an ONNX graph (no weight data)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="models_command", metavar="{list,build}", parser_class=type(parser))
    listing = sub.add_parser("list", help="the families with their keys and defaults")
    add_json_flag(listing)
    building = sub.add_parser("build", help="write an ONNX graph of a family (weights declared, no data)")
    building.add_argument("family", metavar="FAMILY", help="a family from 'planner models list'")
    building.add_argument("--set", dest="settings", action="append", default=[], metavar="KEY=VALUE",
                          help="a builder key (repeatable), e.g. --set layers=24 --set hidden=2048")
    building.add_argument("--out", required=True, metavar="FILE.onnx", help="the file to write")


def _families_document() -> dict:
    from planner.builders import FAMILIES

    return {"families": [
        {"name": family.name, "description": family.description,
         "keys": [{"name": key.name, "type": key.kind, "default": key.describe_default(), "help": key.help,
                   "valid": key.valid_text(), "required": key.required} for key in family.keys]}
        for family in FAMILIES.values()]}


def _print_table(document: dict) -> None:
    lines: list[str] = []
    for family in document["families"]:
        lines.append(f"{family['name']}: {family['description']}")
        width = max(len(key["name"]) for key in family["keys"])
        default_width = max(len(key["default"]) for key in family["keys"])
        for key in family["keys"]:
            lines.append(f"  {key['name']:<{width}}  default {key['default']:<{default_width}}  {key['help']}")
        lines.append("")
    sys.stdout.write("\n".join(lines))


def _parse_settings(items: list[str]) -> dict[str, str]:
    pairs = split_assignments(items, "--set", "KEY=VALUE", "layers=24", once="give each key once")
    return {key: value.strip() for key, value in pairs}


def run(args: argparse.Namespace) -> int:
    if args.models_command == "list":
        document = _families_document()
        if args.json:
            emit_json(document)
        else:
            _print_table(document)
        return 0
    if args.models_command != "build":
        raise ConfigError("'planner models' needs a subcommand: list or build")
    from planner.builders import build, save, weights_file_for

    settings = _parse_settings(args.settings)
    check_output_file(args.out, "--out", (".onnx",))
    model = build(args.family, settings, weights_file=weights_file_for(args.out))
    save(model, args.out, "--out")
    params = sum(_numel(t.dims) for t in model.graph.initializer)
    # say what was written, as the other commands that write files (profile, split) do
    sys.stdout.write(f"wrote {args.out}: {args.family}, {params:,} parameters declared (weights point at "
                     f"{weights_file_for(args.out)}, not written)\n")
    return 0


def _numel(dims) -> int:
    count = 1
    for d in dims:
        count *= int(d)
    return count
