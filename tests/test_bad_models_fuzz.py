"""Property: whatever damage is done to a valid model, ``planner inspect`` answers exit 0, or exit 2 with
exactly one stderr line ``planner: error: ...``; never a traceback, never over 5 s.

Hypothesis mutates valid models (small onnx.helper graphs, a bundled builder model, a real TorchScript
export): bit flips in the serialized bytes, truncation, field deletion, op-type changes, element-type
swaps, extreme and negative dims, deleted nodes, dangling outputs. Seeded (``derandomize=True``) and
bounded, so the suite is the same on every run and takes seconds. The damaged models it found answered
wrongly are kept as explicit tests at the end of test_bad_models.py.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import onnx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests._graph_util import tiny_gpt
from tests.test_bad_models import ROOT, answer_is_clean, fancy_model, mlp

# examples per mutation kind: the whole file runs in well under a minute; set BAD_MODELS_EXAMPLES for a
# longer search
EXAMPLES = int(os.environ.get("BAD_MODELS_EXAMPLES", "50"))

SETTINGS = settings(max_examples=EXAMPLES, derandomize=True, deadline=None, database=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])

BASES: dict[str, tuple[onnx.ModelProto, tuple[str, ...]]] = {
    "mlp": (mlp(), ()),
    "mlp-external": (mlp(weights_inline=False), ()),
    "fancy": (fancy_model(hidden=512), ()),
    "gpt": (tiny_gpt(1, 32, 2, 8, 50, symbolic_seq=True), ("--dim", "seq=8")),
    "gpt2-124m": (onnx.load(str(ROOT / "models" / "gpt2-124m.onnx"), load_external_data=False), ()),
    "dlrm.torchscript": (onnx.load(str(ROOT / "tests" / "fixtures" / "exports" / "dlrm.torchscript.onnx"),
                                   load_external_data=False), ()),
}
BYTES = {name: model.SerializeToString() for name, (model, _) in BASES.items()}
_DIR = Path(tempfile.mkdtemp(prefix="bad_models_"))

base_names = st.sampled_from(sorted(BASES))
OP_TYPES = ["relu", "Relu", "MatMul", "Gemm", "Conv", "LayerNormalization", "Loop", "If", "Reshape",
            "Constant", "NoSuchOp", "", "Gelu", "Einsum", "com.x", "Softmax", "Split", "Cast"]
EXTREME = [-1, -2, -7, -(2 ** 31), -(2 ** 63), 0, 1, 3, 2 ** 31, 2 ** 40, 2 ** 62, 2 ** 63 - 1]


def answer(data: bytes, name: str) -> None:
    """The property: a clean answer (exit 0, or exit 2 with one line) within the time limit."""
    path = _DIR / f"{name}.onnx"
    path.write_bytes(data)
    answer_is_clean(["inspect", str(path), *BASES[name][1]])


def copy(name: str) -> onnx.ModelProto:
    model = onnx.ModelProto()
    model.CopyFrom(BASES[name][0])
    return model


def value_infos(model: onnx.ModelProto) -> list[onnx.ValueInfoProto]:
    g = model.graph
    return [vi for vi in list(g.input) + list(g.output) + list(g.value_info) if vi.type.HasField("tensor_type")]


@pytest.mark.parametrize("name", sorted(BASES))
def test_unmutated_bases_import(name):
    answer(BYTES[name], name)


@SETTINGS
@given(name=base_names, flips=st.lists(st.tuples(st.floats(0, 1, exclude_max=True), st.integers(0, 7)),
                                       min_size=1, max_size=4))
def test_bit_flips(name, flips):
    data = bytearray(BYTES[name])
    for where, bit in flips:
        data[int(where * len(data))] ^= 1 << bit
    answer(bytes(data), name)


@SETTINGS
@given(name=base_names, keep=st.floats(0, 1, exclude_max=True))
def test_truncation(name, keep):
    data = BYTES[name]
    answer(data[: int(keep * len(data))], name)


FIELDS = ["node.input", "node.output", "node.attribute", "node.op_type", "node.name", "initializer", "input",
          "output", "opset_import", "value_info.type", "dim", "initializer.dims", "initializer.data"]


@SETTINGS
@given(name=base_names, field=st.sampled_from(FIELDS), pick=st.integers(0, 10 ** 6))
def test_field_deletion(name, field, pick):
    model = copy(name)
    g = model.graph
    nodes = g.node
    node = nodes[pick % len(nodes)]
    if field == "node.input" and node.input:
        del node.input[pick % len(node.input)]
    elif field == "node.output" and node.output:
        del node.output[pick % len(node.output)]
    elif field == "node.attribute" and node.attribute:
        del node.attribute[pick % len(node.attribute)]
    elif field in ("node.op_type", "node.name"):
        node.ClearField(field.split(".")[1])
    elif field == "initializer" and g.initializer:
        del g.initializer[pick % len(g.initializer)]
    elif field in ("input", "output") and getattr(g, field):
        del getattr(g, field)[pick % len(getattr(g, field))]
    elif field == "opset_import":
        del model.opset_import[pick % len(model.opset_import)]
    elif field in ("value_info.type", "dim") and value_infos(model):
        vi = value_infos(model)[pick % len(value_infos(model))]
        dims = vi.type.tensor_type.shape.dim
        if field == "value_info.type":
            vi.ClearField("type")
        elif dims:
            del dims[pick % len(dims)]
    elif field.startswith("initializer.") and g.initializer:
        t = g.initializer[pick % len(g.initializer)]
        if field == "initializer.dims" and t.dims:
            del t.dims[pick % len(t.dims)]
        else:
            for data in ("raw_data", "float_data", "int64_data", "int32_data"):
                t.ClearField(data)
    answer(model.SerializeToString(), name)


@SETTINGS
@given(name=base_names, pick=st.integers(0, 10 ** 6),
       op_type=st.sampled_from(OP_TYPES) | st.text("abcdefgrlMRxyz_.", min_size=1, max_size=10),
       domain=st.sampled_from(["", "", "ai.onnx", "com.example", "com.microsoft"]))
def test_op_type_changes(name, pick, op_type, domain):
    model = copy(name)
    node = model.graph.node[pick % len(model.graph.node)]
    node.op_type, node.domain = op_type, domain
    answer(model.SerializeToString(), name)


@SETTINGS
@given(name=base_names, pick=st.integers(0, 10 ** 6), elem_type=st.integers(-2, 40))
def test_dtype_swaps(name, pick, elem_type):
    model = copy(name)
    infos = value_infos(model)
    tensors = list(model.graph.initializer)
    k = pick % (len(infos) + len(tensors))
    if k < len(infos):
        infos[k].type.tensor_type.elem_type = elem_type
    else:
        tensors[k - len(infos)].data_type = elem_type
    answer(model.SerializeToString(), name)


@SETTINGS
@given(name=base_names, pick=st.integers(0, 10 ** 6),
       value=st.sampled_from(EXTREME) | st.integers(-(2 ** 63), 2 ** 63 - 1))
def test_extreme_dims(name, pick, value):
    model = copy(name)
    dims = [(vi.type.tensor_type.shape.dim, i) for vi in value_infos(model)
            for i in range(len(vi.type.tensor_type.shape.dim))]
    weights = [(t, i) for t in model.graph.initializer for i in range(len(t.dims))]
    k = pick % max(len(dims) + len(weights), 1)
    if k < len(dims):
        field, i = dims[k]
        field[i].Clear()
        field[i].dim_value = value
    elif weights:
        tensor, i = weights[k - len(dims)]
        tensor.dims[i] = value
    answer(model.SerializeToString(), name)


@SETTINGS
@given(name=base_names, picks=st.lists(st.integers(0, 10 ** 6), min_size=1, max_size=3))
def test_deleted_nodes(name, picks):
    model = copy(name)
    for pick in picks:
        if len(model.graph.node) > 1:
            del model.graph.node[pick % len(model.graph.node)]
    answer(model.SerializeToString(), name)


@SETTINGS
@given(name=base_names, pick=st.integers(0, 10 ** 6), new=st.text("abcxyz_0123", min_size=0, max_size=6),
       add=st.booleans())
def test_dangling_outputs(name, pick, new, add):
    model = copy(name)
    outputs = model.graph.output
    if add or not outputs:
        outputs.add().CopyFrom(onnx.helper.make_tensor_value_info(new or "ghost", onnx.TensorProto.FLOAT, None))
    else:
        outputs[pick % len(outputs)].name = new
    answer(model.SerializeToString(), name)
