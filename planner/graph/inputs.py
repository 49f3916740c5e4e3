"""Graph inputs: which are weights (exports with ``export_params=False``) and which are data, and the values
bound to the data inputs' symbolic dimensions (``--dim``, builder metadata, the batch dimension)."""

from __future__ import annotations

import json
from typing import Mapping

import onnx

from planner.errors import ModelError, suggest
from planner.graph.ir import FLOAT_TYPES, Node
from planner.types import MAX_INPUT_DIM



PARAM_SLOTS = {
    "Conv": (1, 2), "ConvTranspose": (1, 2), "Gemm": (1, 2), "BatchNormalization": (1, 2, 3, 4),
    "LayerNormalization": (1, 2), "InstanceNormalization": (1, 2), "GroupNormalization": (1, 2),
    "SimplifiedLayerNormalization": (1,), "RMSNormalization": (1,), "SkipLayerNormalization": (2, 3, 4),
    "Gather": (0,), "EmbeddingBag": (0,), "PRelu": (1,),
}
# running statistics are buffers, not trainable parameters


_ELEMENTWISE_BINARY = frozenset({"Add", "Sub", "Mul", "Div"})
# ops whose output is constant once every dimension is bound


_VIEW_CHAIN = frozenset({"Transpose", "Reshape", "Identity", "Cast", "Unsqueeze", "Squeeze", "Flatten", "CastLike"})


def classify_inputs(graph: onnx.GraphProto, init_names: set[str],
                     consumers: dict[str, list[tuple[Node, int]]]) -> tuple[set[str], list[str]]:
    """Split graph inputs into weights (exports with export_params=False) and data inputs.

    A data input has a symbolic dim or a non-float type. A float input with static dims is a weight when it
    reaches a parameter slot (a Conv/Gemm weight, a MatMul's 2-D right operand, a norm's scale...) directly
    or through view ops (``MatMul(x, Transpose(W))`` of every TorchScript ``nn.Linear``), or when the graph
    already has a data input (a ViT's class token and position embeddings used by Expand/Concat/Add); the
    first float input of a graph without any other data input is data (a fixed-shape image)."""
    weights: set[str] = set()
    data: list[str] = []
    for vi in graph.input:
        if vi.name in init_names:
            continue
        ttype = vi.type.tensor_type
        dims = ttype.shape.dim if ttype.HasField("shape") else ()
        symbolic = any(not d.HasField("dim_value") for d in dims) or not ttype.HasField("shape")
        if ttype.elem_type not in FLOAT_TYPES or symbolic or not consumers.get(vi.name):
            data.append(vi.name)
        elif data or reaches_param_slot(vi.name, len(dims), consumers):
            weights.add(vi.name)
        else:
            data.append(vi.name)
    return weights, data


def reaches_param_slot(tensor: str, rank: int, consumers: dict[str, list[tuple[Node, int]]],
                        elementwise: bool = True) -> bool:
    frontier = [tensor]
    for _ in range(4):
        following: list[str] = []
        for t in frontier:
            for node, slot in consumers.get(t, ()):
                if _param_slot(node, slot, rank, elementwise):
                    return True
                if node.op_type in _VIEW_CHAIN and slot == 0:
                    following.extend(o for o in node.outputs if o)
        frontier = following
    return False


def _param_slot(node: Node, slot: int, rank: int, elementwise: bool = True) -> bool:
    """Does ``node`` use its input ``slot`` as a parameter? ``elementwise``: count a vector added to or
    multiplied with an activation (a bias, a norm's scale)."""
    if slot in PARAM_SLOTS.get(node.op_type, ()):
        return True
    if node.op_type == "MatMul" and slot == 1 and rank == 2:
        return True
    return elementwise and node.op_type in _ELEMENTWISE_BINARY and rank <= 1


def batch_dim_name(graph: onnx.GraphProto, data_inputs: list[str]) -> str | None:
    names = _input_dim_names(graph, data_inputs)
    if any(d == "batch" for _, _, d in names):
        return "batch"
    for _, pos, d in names:
        if pos == 0:
            return d
    return None


def _input_dim_names(graph: onnx.GraphProto, data_inputs: list[str]) -> list[tuple[str, int, str]]:
    wanted = set(data_inputs)
    out = []
    for vi in graph.input:
        if vi.name in wanted and vi.type.tensor_type.HasField("shape"):
            for pos, d in enumerate(vi.type.tensor_type.shape.dim):
                if not d.HasField("dim_value"):
                    out.append((vi.name, pos, dim_name(vi.name, pos, d)))
    return out


def dim_name(tensor: str, pos: int, dim: onnx.TensorShapeProto.Dimension) -> str:
    """A symbolic dim's name; an unnamed one is called ``input[pos]`` (what ``--dim`` must bind)."""
    return dim.dim_param or f"{tensor}[{pos}]"


def check_dims(dims: Mapping[str, int] | None, where: str) -> None:
    """Every value the user binds (``--dim``, ``dims=``, a swept seq_len), whatever the dimension, before the
    model is bound: a positive integer of at most :data:`MAX_INPUT_DIM` (beyond it ONNX's int64 dims overflow,
    or inference runs for ages)."""
    if dims is not None and not isinstance(dims, Mapping):
        raise ModelError(f"{where}: dims got a {type(dims).__name__}; give a mapping such as "
                         "{'batch': 1, 'seq': 2048}")
    for key, value in (dims or {}).items():
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            raise ModelError(f"{where}: dimension {key}={value!r} must be a positive integer")
        if value > MAX_INPUT_DIM:  # the batch too: costs are per sample, but inspect and estimate scale by it
            raise ModelError(f"{where}: --dim {key}={value:,} is over the {MAX_INPUT_DIM:,} the planner handles on "
                             "one axis of a data input; pass a smaller --dim")


def bind_dims(graph: onnx.GraphProto, data_inputs: list[str], dims: Mapping[str, int], meta: dict[str, str],
               name: str) -> tuple[dict[str, int], int, int]:
    """Values for every symbolic dim of the data inputs; the batch dim is bound to 1 (costs are per sample).

    Returns (bindings used for shape inference, the user's batch, a batch fixed inside the graph)."""
    defaults: dict[str, int] = {}
    if "planner.default_dims" in meta:
        try:
            raw = json.loads(meta["planner.default_dims"])
            defaults = {str(k): int(v) for k, v in raw.items()}
            if not all(0 < v <= MAX_INPUT_DIM for v in defaults.values()):
                raise ValueError("out of range")
        except (ValueError, TypeError, AttributeError):
            raise ModelError(f"{name}: metadata 'planner.default_dims' is not a JSON object of integers from 1 to "
                             f"{MAX_INPUT_DIM:,}; rebuild the model with 'planner models build'") from None
    batch_dim = batch_dim_name(graph, data_inputs)
    user_batch = int(dims.get(batch_dim or "batch", dims.get("batch", 1)))
    bound: dict[str, int] = {}
    for inp, pos, dim in _input_dim_names(graph, data_inputs):
        if dim == batch_dim:
            bound[dim] = 1
        elif dim in dims:
            bound[dim] = int(dims[dim])
        elif dim in defaults:
            bound[dim] = defaults[dim]
        elif dim not in bound:
            raise ModelError(f"{name}: symbolic dimension '{dim}' of input '{inp}' is not bound; "
                             f"pass --dim {dim}=INT (Python: dims={{'{dim}': INT}})")
    known = {d for _, _, d in _input_dim_names(graph, data_inputs)} | {"batch"}
    for dim in dims:
        if dim not in known:  # a misspelt name would silently leave the real one at its default
            raise ModelError(f"{name}: --dim {dim}: the model has no symbolic dimension '{dim}'"
                             f"{suggest(dim, known)}; its dimensions are {', '.join(sorted(known))}")
    static_batch = 1
    if batch_dim is None:
        leading = set()
        wanted = set(data_inputs)
        for vi in graph.input:
            if vi.name in wanted and vi.type.tensor_type.HasField("shape"):
                d = vi.type.tensor_type.shape.dim
                if len(d) >= 2 and d[0].HasField("dim_value"):
                    leading.add(d[0].dim_value)
                else:
                    leading.add(None)
        if len(leading) == 1 and None not in leading and next(iter(leading)) > 1:
            static_batch = next(iter(leading))
    return bound, user_batch, static_batch
