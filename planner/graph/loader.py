"""Read an ONNX file safely: never its weight data, never anything outside the model's folder.

Everything a user can get wrong here (a missing file, a file that is not ONNX, a truncated or corrupted
one, an external-data location that points outside the model's folder) raises :class:`ModelError` with one
readable sentence naming the file and the problem.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Iterator, NamedTuple

import onnx
import onnx.parser
from google.protobuf import json_format, text_format
from google.protobuf.message import DecodeError

from planner.errors import ModelError

# what onnx.load raises on a file it cannot parse: binary protobuf, or the JSON and text formats it picks by
# the file's extension (.json, .textproto, .onnxtxt, ...)
PARSE_ERRORS = (DecodeError, UnicodeDecodeError, ValueError, RuntimeError, json_format.Error, text_format.Error,
                onnx.parser.ParseError)
# protobuf refuses messages over 2 GiB; a larger file is not one ONNX model (weights beyond that live in
# external data), and refusing it up front answers at once instead of after reading gigabytes
MAX_FILE_BYTES = 2 ** 31


def read_model(path: str | os.PathLike) -> onnx.ModelProto:
    """Parse ``path`` as an ONNX model without loading external weight data."""
    file = Path(path)
    try:
        info = file.stat()
    except FileNotFoundError:
        raise ModelError(f"{file}: no such file; give the path of an .onnx model") from None
    except OSError as exc:
        raise ModelError(f"{file}: cannot read it ({exc.strerror or exc}); give the path of an .onnx model") from None
    if stat.S_ISDIR(info.st_mode):
        raise ModelError(f"{file}: is a directory; give the path of an .onnx model file")
    if not stat.S_ISREG(info.st_mode):  # a device or a pipe: it may never end
        raise ModelError(f"{file}: is not a regular file; give the path of an .onnx model file")
    if info.st_size > MAX_FILE_BYTES:
        raise ModelError(f"{file}: {info.st_size / 2**30:.1f} GiB, over the 2 GiB an ONNX file can hold "
                         f"(protobuf's limit); save the weights as external data (onnx.save_model(..., "
                         f"save_as_external_data=True)) -- they are never read")
    try:
        model = onnx.load(str(file), load_external_data=False)
    except OSError as exc:
        raise ModelError(f"{file}: cannot read it ({exc.strerror or exc}); give a readable .onnx model") from None
    except PARSE_ERRORS as exc:
        if file.suffix.lower() in (".json", ".yaml", ".yml"):  # the tables or the cluster given as the model
            raise ModelError(f"{file}: not a readable ONNX model ({file.suffix[1:].upper()} that onnx cannot "
                             f"parse); give the model's .onnx file (embedding-table statistics go in --tables FILE, "
                             f"a cluster in --cluster FILE)") from None
        raise ModelError(f"{file}: not a readable ONNX model (truncated or corrupted?): "
                         f"{type(exc).__name__}: {' '.join(str(exc).split())[:200]}") from None
    check_structure(model, str(file))
    check_external_data(model, file.resolve().parent, str(file))
    return model


def check_structure(model: onnx.ModelProto, where: str) -> None:
    """Reject protobuf bytes that parsed but are not an ONNX model (protobuf decoding is lenient)."""
    if model.ir_version <= 0 or not model.HasField("graph") or len(model.graph.node) == 0:
        raise ModelError(f"{where}: not an ONNX model (no ir_version or no graph nodes)")
    # the importer's own checks (dangling tensors, cycles) and then the ONNX checker on a weight-less
    # skeleton of the model (planner/graph/validate.py) follow


def check_external_data(model: onnx.ModelProto, base_dir: Path | None, where: str) -> None:
    """Every external-data location must be a relative path inside the model's folder.

    The location is untrusted input: we never open it, but we refuse a model that points outside its
    folder (absolute paths, ``..``), so no later tool is led to read there either."""
    checked: set[str] = set()  # builder models point thousands of weights at one file
    for owned in model_tensors(model):
        tensor, owner = owned.tensor, owned.owner
        if tensor.data_location != onnx.TensorProto.EXTERNAL:
            continue
        location = external_location(tensor)
        if not isinstance(location, str) or not isinstance(tensor.name, str):
            raise ModelError(f"{where}: an external-data location is not valid UTF-8; the file is corrupted")
        if not location:
            raise ModelError(f"{where}: {owner} has external data without a location")
        if location in checked:
            continue
        checked.add(location)
        if os.path.isabs(location) or location.startswith(("/", "\\")) or ":" in location.split("/")[0]:
            raise ModelError(f"{where}: {owner} has external data at absolute path "
                             f"'{location}'; external data must lie inside the model's folder")
        if base_dir is not None:
            target = (base_dir / location).resolve()
            if target != base_dir and base_dir not in target.parents:
                raise ModelError(f"{where}: {owner} has external data at '{location}', "
                                 f"outside the model's folder {base_dir}; move the data next to the model")
        elif ".." in Path(location).parts:
            raise ModelError(f"{where}: {owner} has external data at '{location}', "
                             f"outside the model's folder")


def refuse_external_data(model: onnx.ModelProto, purpose: str) -> None:
    """Refuse a model that still keeps a tensor in external data before it is handed to onnxruntime: given
    the model as bytes, onnxruntime would read a relative location from the current directory, and the
    planner never reads weight data at all. ``purpose`` says what needed the run (it starts the message)."""
    for owned in model_tensors(model):
        if owned.tensor.data_location == onnx.TensorProto.EXTERNAL:
            raise ModelError(f"{purpose} runs the model with onnxruntime, and {owned.owner} keeps its value in "
                             f"external data ('{external_location(owned.tensor)}'), which the planner never reads; "
                             "store that tensor inside the .onnx file")


def external_location(tensor: onnx.TensorProto) -> str:
    """The ``location`` entry of a tensor's external data ("" if it has none)."""
    return next((e.value for e in tensor.external_data if e.key == "location"), "")


class OwnedTensor(NamedTuple):
    tensor: onnx.TensorProto
    owner: str  # what holds it, for messages: "initializer 'w'", "the 'value' attribute of node 'c' (Constant)"
    initializer: bool


def model_tensors(model: onnx.ModelProto) -> Iterator[OwnedTensor]:
    """Initializers and tensor attributes of the graph and of every graph nested in it (Loop, If bodies); the
    tensors are the model's own messages, so changing one changes the model."""
    graphs = [model.graph]
    while graphs:
        graph = graphs.pop()
        for tensor in graph.initializer:
            yield OwnedTensor(tensor, f"initializer '{tensor.name}'", True)
        for index, node in enumerate(graph.node):
            for attr in node.attribute:
                if attr.type == onnx.AttributeProto.TENSOR:
                    name = f"'{node.name}'" if node.name else f"{index}"
                    yield OwnedTensor(attr.t, f"the '{attr.name}' attribute of node {name} ({node.op_type})", False)
                elif attr.type == onnx.AttributeProto.GRAPH:
                    graphs.append(attr.g)
                elif attr.type == onnx.AttributeProto.GRAPHS:
                    graphs.extend(attr.graphs)
