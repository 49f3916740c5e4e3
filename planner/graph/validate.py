"""Refuse a model the ONNX standard rejects, with one line naming the node or tensor at fault.

The onnx library's own checker (``onnx.checker.check_model(full_check=True)``: structure, the opset's
schema rules, strict type and shape inference) runs on a *skeleton* of the model: weights reduced to their
declarations, so that no weight data is read, no external-data file is opened (the checker otherwise stats
every location it finds) and checking a model costs the same whatever its weights weigh. Before it, our own
checks give the common mistakes a precise message: an opset older than :data:`MIN_OPSET` or newer than the
installed onnx library defines, an op type the default domain does not define at the model's opset, and
negative or absurd dimensions.
"""

from __future__ import annotations

import re
from typing import Iterable, Iterator

import onnx
from onnx import TensorProto

from planner.errors import ModelError, suggest
from planner.graph import fold
from planner.graph.inputs import MAX_INPUT_DIM
from planner.graph.ir import Node, OpGraph, numel_of
from planner.graph.shapes import has_data


# The lowest default-domain opset the cost rules and shape propagation are written for: from opset 7 on,
# element-wise ops and Gemm broadcast numpy-style (the FLOP rules count output elements and fill_shape_gaps
# broadcasts that way); before it they took a `broadcast` attribute the rules do not read.
MIN_OPSET = 7

# one tensor with more elements than this is a corrupted dimension, not a model (2**40 bf16 values are 2 TiB)
MAX_TENSOR_ELEMENTS = 2 ** 40
# once the symbolic dims are bound, an activation-by-activation product may be far larger: the attention scores
# of a million-token sequence are heads x 2**40 elements, which FlashAttention never materialises (128 heads:
# 2**47); beyond this a --dim is absurd
MAX_BOUND_TENSOR_ELEMENTS = 2 ** 48

DEFAULT_DOMAINS = ("", "ai.onnx")

_ELEM_TYPES = frozenset(v for v in TensorProto.DataType.values() if v != TensorProto.UNDEFINED)


def check_model(model: onnx.ModelProto, nodes: list[Node], where: str) -> None:
    """Raise ModelError for the first thing wrong with ``model`` (``nodes``: its nodes in topological
    order, as the importer sorted them; the checker requires that order and exporters do not always
    write it)."""
    opset = default_opset(model, where)
    _check_op_types(model.graph, opset, where)
    _check_dims(model.graph, where)
    skeleton = _skeleton(model, nodes, where)
    shapeless = [vi for vi in list(skeleton.graph.input) + list(skeleton.graph.output)
                 if vi.type.HasField("tensor_type") and not vi.type.tensor_type.HasField("shape")]
    for vi in shapeless:
        # the checker wants a shape on every graph input and output; an unknown one is allowed by the
        # IR spec and common in hand-built graphs: an empty shape satisfies the structural check and is
        # taken away again before shape inference, which would read it as a scalar
        vi.type.tensor_type.shape.SetInParent()
    try:
        # full_check=True is this check followed by strict type and shape inference; done in two steps
        # so that the stand-in shapes are gone before inference
        onnx.checker.check_model(skeleton, full_check=False)
        for vi in shapeless:
            vi.type.tensor_type.ClearField("shape")
        onnx.shape_inference.infer_shapes(skeleton, check_type=True, strict_mode=True)
    except (onnx.checker.ValidationError, onnx.shape_inference.InferenceError) as exc:
        if not str(exc).strip():  # some Python builds hand back an empty message where it would not decode
            raise ModelError(f"{where}: not a valid ONNX model, and the checker's complaint could not be read (a name "
                             "or string in it is probably not valid UTF-8); the file is corrupted") from None
        raise ModelError(f"{where}: not a valid ONNX model: {checker_message(exc)}; fix or re-export "
                         f"the model") from None
    except UnicodeDecodeError:
        # the checker's complaint quotes a name or string of the model that is not valid UTF-8
        raise ModelError(f"{where}: not a valid ONNX model, and a name or string in it is not valid UTF-8; "
                         f"the file is corrupted") from None


def default_opset(model: onnx.ModelProto, where: str) -> int:
    """The model's default-domain opset; one below :data:`MIN_OPSET`, or newer than the installed onnx library
    defines, is a ModelError."""
    versions = [o.version for o in model.opset_import if o.domain in DEFAULT_DOMAINS]
    if not versions:
        raise ModelError(f"{where}: the model imports no opset of the default ONNX domain; re-export it "
                         f"(e.g. torch.onnx.export(..., opset_version=17))")
    opset = versions[0]
    if opset < MIN_OPSET:
        raise ModelError(f"{where}: opset {opset} of the default ONNX domain is older than opset {MIN_OPSET}, "
                         f"the oldest the planner's cost rules are written for; re-export the model with a "
                         f"newer opset (e.g. torch.onnx.export(..., opset_version=17))")
    newest = onnx.defs.onnx_opset_version()
    if opset > newest:
        # the checker does not catch this: it looks each op up as the newest schema at or below the model's
        # opset, so any opset past the newest one resolves to that one's schemas and passes
        raise ModelError(f"{where}: opset {opset} of the default ONNX domain is newer than opset {newest}, the "
                         f"newest the installed onnx library ({onnx.__version__}) defines; re-export the model "
                         f"with opset {newest} or older (e.g. torch.onnx.export(..., opset_version=17)), or "
                         f"upgrade the onnx package")
    return opset


def _check_op_types(graph: onnx.GraphProto, opset: int, where: str) -> None:
    """Every default-domain op must exist at the model's opset (a bit flip turns Relu into relu)."""
    for proto in _all_nodes(graph):
        if not all(isinstance(text, str) for text in (proto.op_type, proto.domain, proto.name)):
            raise ModelError(f"{where}: a node's op type, domain or name is not valid UTF-8; the file is corrupted")
        if proto.domain not in DEFAULT_DOMAINS or onnx.defs.has(proto.op_type, opset, ""):
            continue
        name = f"node '{proto.name}' ({proto.op_type})" if proto.name else f"a {proto.op_type!r} node"
        if onnx.defs.has(proto.op_type, ""):
            since = min(s.since_version for s in onnx.defs.get_all_schemas_with_history()
                        if s.name == proto.op_type and s.domain == "")
            raise ModelError(f"{where}: {name}: {proto.op_type} is defined from opset {since} on, but the model "
                             f"imports opset {opset}; re-export it with opset {since} or newer")
        known = {s.name for s in onnx.defs.get_all_schemas() if s.domain == ""}
        raise ModelError(f"{where}: {name}: op type {proto.op_type!r} does not exist in the default ONNX domain "
                         f"at opset {opset}{suggest(proto.op_type, known)}; the file is corrupted, or the op "
                         f"belongs to a custom domain that the node must name")


def _check_dims(graph: onnx.GraphProto, where: str) -> None:
    """Declared element types and dimensions: no unknown type, no negative dim, no tensor of over
    :data:`MAX_TENSOR_ELEMENTS` elements."""
    for name, elem_type, dims in _declared(graph):
        if elem_type not in _ELEM_TYPES:
            raise ModelError(f"{where}: tensor '{name}' has element type {elem_type}, which is no ONNX type; "
                             f"the file is corrupted")
        known = [d for d in dims if isinstance(d, int)]
        shown = "[" + ", ".join(map(str, dims)) + "]"
        if any(d < 0 for d in known):
            raise ModelError(f"{where}: tensor '{name}' has a negative dimension (shape {shown}); "
                             f"the file is corrupted or the exporter wrote a wrong shape")
        if numel_of(known) > MAX_TENSOR_ELEMENTS:
            raise ModelError(f"{where}: tensor '{name}' has {numel_of(known):.3g} elements (shape {shown}), "
                             f"over the 2**40 a real model's tensor can hold; the file is corrupted")


def _declared(graph: onnx.GraphProto) -> Iterator[tuple[str, int, list[int | str]]]:
    """(name, element type, dims: a number or a symbolic name) of every declared tensor: value infos,
    initializers, constants."""
    for vi in list(graph.input) + list(graph.output) + list(graph.value_info):
        if vi.type.HasField("tensor_type"):
            tt = vi.type.tensor_type
            yield vi.name, tt.elem_type, [d.dim_value if d.HasField("dim_value") else d.dim_param or "?"
                                          for d in tt.shape.dim]
    for t in _tensors(graph):
        yield t.name, t.data_type, list(t.dims)


def _tensors(graph: onnx.GraphProto) -> Iterator[TensorProto]:
    yield from graph.initializer
    for proto in graph.node:
        for attr in proto.attribute:
            if attr.type == onnx.AttributeProto.TENSOR:
                yield attr.t


def _all_nodes(graph: onnx.GraphProto) -> Iterator[onnx.NodeProto]:
    for sub in _graphs(graph):
        yield from sub.node


def _bodies(attr: onnx.AttributeProto) -> Iterable[onnx.GraphProto]:
    if attr.type == onnx.AttributeProto.GRAPH:
        return (attr.g,)
    if attr.type == onnx.AttributeProto.GRAPHS:
        return attr.graphs
    return ()


def _weightless(t: TensorProto) -> bool:
    """A tensor whose data is elsewhere or absent (the importer's usual input: declared weights)."""
    return t.data_location == TensorProto.EXTERNAL or not has_data(t)


def _skeleton(model: onnx.ModelProto, nodes: list[Node], where: str) -> onnx.ModelProto:
    """A copy of ``model`` for the checker: nodes in topological order; every initializer without inline
    data (external or none), or with more than ``fold.MAX_ELEMENTS`` elements of it (data the importer
    never reads: the checker would copy and size it), declared as a graph input instead; every Constant
    holding external data replaced by a graph input of its type and shape. Small inline data is kept (the
    checker compares its size with the dims). Only the fields the checker reads are copied, by protobuf
    itself (a corrupted name or producer is not valid UTF-8: read into Python, it raises)."""
    src = model.graph
    skeleton = onnx.ModelProto(ir_version=model.ir_version)
    skeleton.opset_import.extend(model.opset_import)
    skeleton.functions.extend(model.functions)
    g = skeleton.graph
    g.name = "skeleton"  # the model's own name may not be valid UTF-8, and the checker only needs one
    declared = {vi.name for vi in src.input}
    g.input.extend(src.input)
    g.output.extend(src.output)
    g.value_info.extend(src.value_info)
    g.sparse_initializer.extend(src.sparse_initializer)
    for t in src.initializer:
        if not _weightless(t) and numel_of(t.dims) <= fold.MAX_ELEMENTS:
            g.initializer.append(t)
        elif t.name not in declared:
            g.input.append(onnx.helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)))
            declared.add(t.name)
    for node in nodes:
        proto = _outer_weights(node.proto, g, declared, where)
        value = next((a.t for a in proto.attribute if a.name == "value" and a.type == onnx.AttributeProto.TENSOR),
                     None)
        if proto.op_type == "Constant" and value is not None and value.data_location == TensorProto.EXTERNAL \
                and len(proto.output) == 1:
            g.input.append(onnx.helper.make_tensor_value_info(proto.output[0], value.data_type, list(value.dims)))
            continue
        g.node.append(proto)
    return skeleton


def _outer_weights(proto: onnx.NodeProto, g: onnx.GraphProto, declared: set[str], where: str) -> onnx.NodeProto:
    """``proto``, or a copy whose subgraphs' weight-less initializers are declared as inputs of the outer
    graph ``g`` instead (a body sees the outer scope), so that the checker opens no external data there."""
    if not any(_weightless(t) for attr in proto.attribute for body in _bodies(attr) for t in _graph_tensors(body)):
        return proto
    copy = onnx.NodeProto()
    copy.CopyFrom(proto)
    for attr in copy.attribute:
        for body in _bodies(attr):
            for graph in _graphs(body):
                keep = [t for t in graph.initializer if not _weightless(t)]
                for t in graph.initializer:
                    if not isinstance(t.name, str):
                        raise ModelError(f"{where}: an initializer name inside node '{proto.name}' is not valid "
                                         f"UTF-8; the file is corrupted")
                    if _weightless(t) and t.name not in declared:
                        g.input.append(onnx.helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)))
                        declared.add(t.name)
                del graph.initializer[:]
                graph.initializer.extend(keep)
    return copy


def _graphs(graph: onnx.GraphProto) -> Iterator[onnx.GraphProto]:
    """``graph`` and every graph nested in its nodes."""
    yield graph
    for proto in graph.node:
        for attr in proto.attribute:
            for body in _bodies(attr):
                yield from _graphs(body)


def _graph_tensors(graph: onnx.GraphProto) -> Iterator[TensorProto]:
    for sub in _graphs(graph):
        yield from sub.initializer


_CONTEXT = re.compile(r"==> Context:.*?Name:\s*(\S*)\s+OpType:\s*(\S+)", re.S)


def checker_message(exc: Exception) -> str:
    """The checker's complaint on one line, with the node it names (its message may span lines)."""
    text = str(exc).strip()
    context = _CONTEXT.search(text)
    first = " ".join(text.split("==> Context:")[0].split()) or type(exc).__name__
    if context and context.group(1) and context.group(1) not in first:
        first = f"node '{context.group(1)}' ({context.group(2)}): {first}"
    return first.rstrip(".")


def check_sizes(graph: OpGraph, where: str) -> None:
    """After shape inference with the dims bound: no tensor over :data:`MAX_BOUND_TENSOR_ELEMENTS` elements (a
    corrupted shape constant, or a --dim far too large) and no negative dimension."""
    for tensor, shape in graph.shapes.items():
        if shape is None:
            continue
        if any(d < 0 for d in shape) or numel_of(shape) > MAX_BOUND_TENSOR_ELEMENTS:
            raise ModelError(f"{where}: tensor '{tensor}' would have shape {list(shape)} (for one sample, "
                             f"with the dims bound to {graph.dims or 'their defaults'}), "
                             f"{'a negative dimension' if any(d < 0 for d in shape) else 'over 2**48 elements'}; "
                             f"check the --dim values, or the file is corrupted")


def check_input_dims(graph: onnx.GraphProto, data_inputs: Iterable[str], where: str) -> None:
    """Once the dims are bound: no data input axis of size 0 (nothing to compute) or over
    :data:`MAX_INPUT_DIM`."""
    wanted = set(data_inputs)
    for vi in graph.input:
        if vi.name not in wanted:
            continue
        for axis, d in enumerate(vi.type.tensor_type.shape.dim):
            if d.HasField("dim_value") and d.dim_value == 0:
                raise ModelError(f"{where}: input '{vi.name}' has size 0 on axis {axis}, so an iteration computes "
                                 "nothing; export the model with sizes of 1 or more (or symbolic ones)")
            if d.dim_value > MAX_INPUT_DIM:
                raise ModelError(f"{where}: input '{vi.name}' has size {d.dim_value:,} on axis {axis}, over the "
                                 f"{MAX_INPUT_DIM:,} the planner handles on one axis of a data input; pass a "
                                 f"smaller --dim, or the file is corrupted")
