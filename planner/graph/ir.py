"""The importer's intermediate form: ONNX nodes in topological order and the tensors between them, with
shapes for ONE sample, element types, and which tensors are constants or parameters."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Iterable

import onnx
from onnx import TensorProto

from planner.errors import ModelError

FLOAT_TYPES = frozenset({TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.BFLOAT16, TensorProto.DOUBLE,
                         TensorProto.FLOAT8E4M3FN, TensorProto.FLOAT8E5M2})
# bytes per element as stored for integer/bool tensors; floats are costed at 2 bytes (bf16 training)


INT_BYTES = {TensorProto.INT64: 8, TensorProto.UINT64: 8, TensorProto.INT32: 4, TensorProto.UINT32: 4,
              TensorProto.INT16: 2, TensorProto.UINT16: 2, TensorProto.INT8: 1, TensorProto.UINT8: 1,
              TensorProto.BOOL: 1}


_STORED_FLOAT_BYTES = {TensorProto.FLOAT: 4, TensorProto.FLOAT16: 2, TensorProto.BFLOAT16: 2, TensorProto.DOUBLE: 8,
                       TensorProto.FLOAT8E4M3FN: 1, TensorProto.FLOAT8E5M2: 1}


ACT_BYTES = 2  # bf16 activations and weights (planner.types conventions)

# (op_type, input index) slots that hold parameters (used to tell weight graph inputs from data inputs)


def stored_bytes(elem_type: int) -> int:
    """Bytes per element of a tensor as stored on disk (for embedding-table sizes)."""
    return _STORED_FLOAT_BYTES.get(elem_type) or INT_BYTES.get(elem_type, 4)


def act_bytes(elem_type: int | None) -> int:
    """Bytes per element of an activation in training: 2 for floats (bf16), the stored size otherwise."""
    if elem_type is None or elem_type in FLOAT_TYPES:
        return ACT_BYTES
    return INT_BYTES.get(elem_type, ACT_BYTES)


def node_labels(protos: Iterable[onnx.NodeProto]) -> list[str]:
    """The label of each node of a graph, by which the layers name their nodes and ``planner split`` finds
    them: the node's name where it has one no other node shares, else its type and first output (ONNX names
    are optional and need not be unique; a tensor has one producer)."""
    protos = list(protos)
    counts = Counter(p.name for p in protos if p.name)
    return [p.name if p.name and counts[p.name] == 1 else f"{p.op_type}:{next((o for o in p.output if o), '')}"
            for p in protos]


@dataclass
class Node:
    index: int  # position in topological order
    name: str
    op_type: str
    domain: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    proto: onnx.NodeProto
    scope: tuple[str, ...] = ()
    label: str = ""  # node_labels' label (the name where it is given and unique)

    def attr(self, name: str, default: Any) -> Any:
        """An attribute's value, of the same kind as ``default`` (int, float, list of ints, or bytes)."""
        for a in self.proto.attribute:
            if a.name == name:
                value = onnx.helper.get_attribute_value(a)
                if isinstance(default, int) and isinstance(value, int):
                    return value
                if isinstance(default, float) and isinstance(value, (int, float)):
                    return float(value)
                if isinstance(default, list) and isinstance(value, list) and all(isinstance(v, int) for v in value):
                    return value
                if isinstance(default, bytes) and isinstance(value, (bytes, str)):
                    return value
                raise ModelError(f"node '{self.name or self.op_type}' ({self.op_type}): attribute '{name}' has "
                                 f"an unexpected type; the file is corrupted or not valid ONNX")
        return default


@dataclass
class OpGraph:
    name: str
    nodes: list[Node]
    shapes: dict[str, tuple[int, ...] | None]
    types: dict[str, int]
    const: set[str]  # tensors that do not depend on the data inputs (weights, shapes, constants)
    params: dict[str, int]  # parameter tensor -> element count
    param_roots: dict[str, tuple[str, ...]]  # constant tensor -> the parameters it is computed from
    data_inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    producer: dict[str, int] = field(default_factory=dict)
    consumers: dict[str, list[int]] = field(default_factory=dict)
    batch: int = 1  # bound batch (reporting)
    static_batch: int = 1  # a batch fixed inside the graph; costs are divided by it
    dims: dict[str, int] = field(default_factory=dict)
    family: str | None = None
    warnings: list[str] = field(default_factory=list)
    _numels: dict[str, int | None] = field(default_factory=dict, repr=False)

    def numel(self, tensor: str) -> int | None:
        cache = self._numels
        if tensor in cache:
            return cache[tensor]
        shape = self.shapes.get(tensor)
        n = None if shape is None else numel_of(shape)
        cache[tensor] = n
        return n

    def is_compute(self, node: Node) -> bool:
        return not all((t in self.const) for t in node.outputs if t)


def numel_of(dims: Iterable[int]) -> int:
    n = 1
    for d in dims:
        n *= d
    return n
