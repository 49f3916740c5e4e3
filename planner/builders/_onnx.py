"""A small ONNX graph writer for the model-family builders.

Node names follow the TorchScript exporter's scopes (``/layers.0/attn/qkv/MatMul``) and weight names torch's
parameter paths (``layers.0.attn.qkv.weight``), so the importer's layer detection sees a built model as it
sees a real export; computed tensors get short names (``matmul_12``) as the dynamo exporter gives them,
which keeps a 1-trillion-parameter GPT's file under 1 MB.

Weights carry no data: each is an initializer with ``data_location=EXTERNAL`` whose ``location`` is a file
beside the model (``<stem>.weights``) that is never written, with ``offset``/``length`` as a real external-data
file would have them. The model file therefore stays small
while shapes, dtypes and parameter counts are exact. Scalars and index lists that are not parameters
(dropout ratios, reshape shapes, rotary frequencies) are ``Constant`` nodes with inline data.
"""

from __future__ import annotations

import contextlib
from typing import Iterator, Sequence

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 20  # Gelu is an op from 20 on (LayerNormalization from 17); torch's dynamo exporter writes 20 as well
IR_VERSION = 9  # the IR version that opset 20 shipped with, for older runtimes

Dim = int | str  # a fixed size or a symbolic dimension name

_NUMPY_DTYPE = {TensorProto.FLOAT: np.float32, TensorProto.FLOAT16: np.float16, TensorProto.INT64: np.int64,
                TensorProto.BOOL: np.bool_}
_ALIGN_BYTES = 64  # external-data offsets are aligned like onnx's own writer can be asked to do


class GraphBuilder:
    """Collects nodes, declared-only weights and graph inputs/outputs, then makes a ModelProto."""

    def __init__(self, weights_file: str, weight_dtype: int) -> None:
        self.weights_file = weights_file
        self.weight_dtype = weight_dtype
        self._nodes: list[onnx.NodeProto] = []
        self._initializers: list[TensorProto] = []
        self._inputs: list[onnx.ValueInfoProto] = []
        self._outputs: list[onnx.ValueInfoProto] = []
        self._scope: list[str] = []
        self._used_node_names: set[str] = set()
        self._tensors = 0
        self._offset_bytes = 0
        self._constants: dict[tuple[str, int, tuple[int, ...], bytes], str] = {}

    # ------------------------------------------------------------------------------------------ scopes
    @contextlib.contextmanager
    def scope(self, name: str) -> Iterator[None]:
        """Nest node and weight names under ``name`` (like a torch submodule)."""
        self._scope.append(name)
        try:
            yield
        finally:
            self._scope.pop()

    def _node_name(self, op_type: str) -> str:
        base = "/" + "/".join([*self._scope, op_type])
        name, n = base, 0
        while name in self._used_node_names:
            n += 1
            name = f"{base}_{n}"
        self._used_node_names.add(name)
        return name

    # ---------------------------------------------------------------------------------------- tensors
    def weight(self, name: str, shape: Sequence[int], dtype: int | None = None) -> str:
        """Declare a parameter ``<scope>.<name>`` of ``shape`` without data; return its tensor name."""
        dtype = self.weight_dtype if dtype is None else dtype
        full_name = ".".join([*self._scope, name])
        tensor = TensorProto(name=full_name, data_type=dtype, dims=list(shape))
        length = int(np.prod(shape, dtype=np.int64)) * np.dtype(_NUMPY_DTYPE[dtype]).itemsize
        tensor.data_location = TensorProto.EXTERNAL
        for key, value in (("location", self.weights_file), ("offset", str(self._offset_bytes)),
                           ("length", str(length))):
            entry = tensor.external_data.add()
            entry.key, entry.value = key, value
        self._offset_bytes += -(-length // _ALIGN_BYTES) * _ALIGN_BYTES
        self._initializers.append(tensor)
        return full_name

    def const(self, values: Sequence[float] | Sequence[int] | float | int | np.ndarray, dtype: int) -> str:
        """A ``Constant`` node holding ``values`` (a scalar when given a scalar). Equal constants are shared
        within one top-level scope (one layer), never across layers, so no edge crosses a layer boundary."""
        array = np.asarray(values, dtype=_NUMPY_DTYPE[dtype])
        key = (self._scope[0] if self._scope else "", dtype, array.shape, array.tobytes())
        if key not in self._constants:
            self._constants[key] = self.op("Constant", [], value=numpy_helper.from_array(array))
        return self._constants[key]

    def input(self, name: str, dtype: int, shape: Sequence[Dim]) -> str:
        self._inputs.append(helper.make_tensor_value_info(name, dtype, list(shape)))
        return name

    def output(self, tensor: str, dtype: int, shape: Sequence[Dim]) -> None:
        self._outputs.append(helper.make_tensor_value_info(tensor, dtype, list(shape)))

    # ------------------------------------------------------------------------------------------- nodes
    def op(self, op_type: str, inputs: Sequence[str], **attrs: object) -> str:
        """Add one node with a single output; return the output's name."""
        return self.op_n(op_type, inputs, 1, **attrs)[0]

    def op_n(self, op_type: str, inputs: Sequence[str], n_outputs: int, **attrs: object) -> list[str]:
        """Add one node with ``n_outputs`` outputs; return their names."""
        name = self._node_name(op_type)
        self._tensors += 1  # short tensor names, as the dynamo exporter writes them (node names carry scopes)
        outputs = [f"{op_type.lower()}_{self._tensors}" + (f"_{i}" if i else "") for i in range(n_outputs)]
        self._nodes.append(helper.make_node(op_type, list(inputs), outputs, name=name, **attrs))
        return outputs

    # ------------------------------------------------------------------------------------------- model
    def model(self, graph_name: str, metadata: dict[str, str]) -> onnx.ModelProto:
        graph = helper.make_graph(self._nodes, graph_name, self._inputs, self._outputs, self._initializers)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)],
                                  producer_name="planner.builders", ir_version=IR_VERSION)
        for key in sorted(metadata):
            entry = model.metadata_props.add()
            entry.key, entry.value = key, metadata[key]
        return model
