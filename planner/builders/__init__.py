"""Model-family builders: ONNX graphs (weights declared, no weight data) of ``gpt``, ``llama``, ``bert``,
``moe``, ``dlrm``.

    model = build("gpt", {"layers": 96, "hidden": 12288, "heads": 96})   # -> onnx.ModelProto
    save(model, "gpt-175b.onnx")

How weights are declared: every parameter is an initializer with its exact shape and dtype and
``data_location = EXTERNAL``, pointing at ``<stem>.weights`` beside the model (``offset``/``length`` set as a
real external-data file would have them). That file is never written: nothing here (nor the importer, which
loads with ``load_external_data=False``) reads weight data. ``onnx.checker.check_model`` passes on the
in-memory proto; checking the saved file by path would look for the absent ``.weights`` file.

Every built model carries ``metadata_props``: ``planner.family``, ``planner.config`` (JSON of every resolved
key) and ``planner.default_dims`` (JSON of the symbolic dimensions' defaults, e.g. ``{"seq": 2048}``).
The batch dimension is symbolic, named ``batch``; the sequence dimension ``seq``.
"""

from __future__ import annotations

import os
from typing import Mapping

import onnx

from planner import arguments
from planner.builders._spec import Family, Key, Value, resolve
from planner.builders.dlrm import FAMILY as _DLRM
from planner.builders.moe import FAMILY as _MOE
from planner.builders.transformer import FAMILIES as _TRANSFORMERS
from planner.errors import ConfigError, suggest

FAMILIES: dict[str, Family] = {family.name: family for family in (*_TRANSFORMERS, _MOE, _DLRM)}

__all__ = ["FAMILIES", "Family", "Key", "build", "resolve_settings", "save", "weights_file_for"]


def _family(name: str) -> Family:
    family = FAMILIES.get(name)
    if family is None:
        raise ConfigError(f"unknown model family '{name}'{suggest(name, FAMILIES)}; "
                          f"known families: {', '.join(FAMILIES)}")
    return family


def resolve_settings(family: str, settings: Mapping[str, object]) -> dict[str, Value]:
    """Every key of ``family``, checked, with defaults filled in (raises ConfigError naming a bad key)."""
    return resolve(_family(family), settings)


def weights_file_for(model_path: str) -> str:
    """The (never-written) external-data file name a model saved at ``model_path`` points its weights at."""
    return os.path.splitext(os.path.basename(model_path))[0] + ".weights"


def build(family: str, settings: Mapping[str, object] | None = None,
          weights_file: str | None = None) -> onnx.ModelProto:
    """Build ``family`` with ``settings`` (strings as from ``--set KEY=VALUE``, or Python values).

    ``weights_file`` is the external-data location written into every weight (default ``<family>.weights``);
    :func:`save` passes the one matching the file name it writes.
    """
    arguments.instance(family, str, "family", f"give a family name, one of: {', '.join(FAMILIES)}")
    arguments.optional(settings, Mapping, "settings", "give a mapping such as {'layers': 2} or None")
    spec = _family(family)
    resolved = resolve(spec, settings or {})
    return spec.build(resolved, weights_file or f"{family}.weights")


def save(model: onnx.ModelProto, path: str, flag: str = "path") -> None:
    """Write ``model`` to ``path`` and nothing else (no external-data file is created), whole or not at all
    (planner.outputs.write_bytes); a path that cannot be written is a ConfigError naming it (as ``flag``)."""
    from planner.outputs import check_output_file, write_bytes  # noqa: PLC0415

    arguments.instance(model, onnx.ModelProto, "model", "give the ModelProto of planner.builders.build(...)")
    arguments.path_like(path, flag, "the .onnx file to write")
    write_bytes(check_output_file(path, flag), model.SerializeToString(), flag)
