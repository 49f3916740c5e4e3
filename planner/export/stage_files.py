"""``planner split``: a plan's pipeline stages written as ONNX files plus a manifest.

The plan's stages index the model's layers (``LayerGraph.layers``); each layer names its ONNX nodes
(``Layer.ops[k].name``). :func:`split_plan` checks that the plan was made for this model, cuts the graph
(:mod:`planner.export.stages`) and :func:`write_split` writes ``stage_<i>.onnx`` and ``manifest.json`` into
the output folder, refusing to overwrite unless asked.
"""

from __future__ import annotations

import json
import logging
import os
from contextlib import ExitStack
from typing import Any, Sequence

import onnx

from planner.errors import ConfigError
from planner.export.stages import StageModel, split_model
from planner.graph.ir import node_labels
from planner.outputs import atomic_open, write_error
from planner.plans import Plan, StagePlan, check_fits_model
from planner.types import LayerGraph

log = logging.getLogger(__name__)
MANIFEST = "manifest.json"


def stage_node_names(plan: Plan, layers: LayerGraph) -> list[set[str]]:
    """The ONNX nodes of each plan stage, by label (planner.graph.ir.node_labels); PlannerError when the plan
    does not fit the model's layers."""
    check_fits_model(plan, layers.params, layers)
    result: list[set[str]] = []
    for stage in plan.stages:
        names: set[str] = set()
        for layer in layers.layers[stage.first_layer:stage.last_layer + 1]:
            names.update(op.name for op in layer.ops)
        result.append(names)
    return result


def split_plan(model: onnx.ModelProto, plan: Plan, layers: LayerGraph) -> list[StageModel]:
    names = stage_node_names(plan, layers)
    known = set(node_labels(model.graph.node))
    unmatched = sum(1 for group in names for name in group if name not in known)
    if unmatched:
        log.info("%d layer ops name no ONNX node; they are placed by data flow", unmatched)
    return split_model(model, names)


def manifest(model_path: str, plan: Plan, stages: Sequence[StageModel]) -> dict[str, Any]:
    """The split's ``manifest.json``: per stage its file, layers, devices, inputs (kind ``input``, ``weight``
    or ``boundary`` with the stage that makes it) and outputs (the later stages that read them)."""
    return {"model": os.path.basename(model_path),
            "stages": [_stage_entry(stage, plan.stages[stage.index]) for stage in stages]}


def _stage_entry(stage: StageModel, planned: StagePlan) -> dict[str, Any]:
    return {
        "index": stage.index,
        "file": f"stage_{stage.index}.onnx",
        "first_layer": planned.first_layer,
        "last_layer": planned.last_layer,
        "layer_names": list(planned.layer_names),
        "device_type": planned.device_type,
        "devices": list(planned.devices),
        "tp": planned.tp,
        "dp": planned.dp,
        "cp": planned.cp,
        "num_nodes": stage.num_nodes,
        "inputs": [{"name": i.name, "kind": i.kind, **({"from_stage": i.from_stage} if i.from_stage is not None
                                                        else {})} for i in stage.inputs],
        "outputs": [{"name": o.name, "to_stages": list(o.to_stages), "model_output": o.model_output}
                    for o in stage.outputs],
    }


def write_split(out_dir: str, document: dict[str, Any], stages: Sequence[StageModel], force: bool) -> list[str]:
    """Write ``stage_<i>.onnx`` and ``manifest.json`` into ``out_dir`` (created if missing); returns the paths."""
    if os.path.exists(out_dir) and not os.path.isdir(out_dir):
        raise ConfigError(f"--out-dir {out_dir}: exists and is not a folder; choose another --out-dir")
    targets = [os.path.join(out_dir, f"stage_{s.index}.onnx") for s in stages] + [os.path.join(out_dir, MANIFEST)]
    existing = [t for t in targets if os.path.exists(t)]
    if existing and not force:
        raise ConfigError(f"--out-dir {out_dir}: {os.path.basename(existing[0])} already exists; choose an empty "
                          "folder or pass --force to overwrite the split's files")
    try:
        os.makedirs(out_dir, exist_ok=True)
        # every file goes to a temporary file first; they replace the targets together when all are written
        # (the manifest last), and an error removes them all, so the folder never holds half a split
        with ExitStack() as files:
            manifest_file = files.enter_context(atomic_open(targets[-1]))
            for stage, target in zip(stages, targets):
                files.enter_context(atomic_open(target, binary=True)).write(stage.model.SerializeToString())
            manifest_file.write(json.dumps(document, indent=2, sort_keys=True) + "\n")
    except OSError as exc:
        raise write_error(out_dir, "--out-dir", exc) from None
    return targets
