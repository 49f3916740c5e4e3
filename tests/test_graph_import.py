"""Import of transformer-like graphs built with onnx.helper: layers, parameters, FLOPs, activation memory,
tensor-parallel split, embedding tables, symbolic dimensions and weights stored in either form."""

from __future__ import annotations

import json
import logging

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper as h

import planner
from planner.errors import ModelError
from planner.graph import import_model_proto, load_model
from tests._graph_util import GraphBuilder, gpt_block_flops, gpt_params, tiny_gpt

L, H, A, S, V = 3, 64, 4, 16, 1000


@pytest.mark.parametrize("named", [True, False], ids=["name-scopes", "structure"])
def test_gpt_layers_params_and_flops(named):
    graph = import_model_proto(tiny_gpt(L, H, A, S, V, named=named), {"batch": 4})
    kinds = [layer.kind for layer in graph.layers]
    assert kinds == ["embedding"] + ["block"] * L + ["head"]
    if named:
        assert [layer.name for layer in graph.layers[1:-1]] == [f"transformer.h.{i}" for i in range(L)]
    assert graph.params == gpt_params(L, H, S, V)
    for block in graph.layers[1:-1]:
        assert block.flops_forward == pytest.approx(gpt_block_flops(H, A, S))
        assert block.transformer == planner.types.TransformerDims(hidden=H, heads=A, seq_len=S, ffn=4 * H,
                                                                  kv_heads=A, head_dim=H // A, v_head_dim=H // A)
        assert block.input_bytes == block.output_bytes == S * H * 2
    # head: final LN (8sh) and the LM head matmul (2shV)
    assert graph.layers[-1].flops_forward == pytest.approx(8 * S * H + 2 * S * H * V)
    assert graph.batch == 4 and dict(graph.dims) == {"batch": 4}


@pytest.mark.parametrize("heads,seq", [(4, 16), (8, 64), (2, 128)])
def test_block_activation_bytes_follow_korthikanti(heads, seq):
    """Korthikanti et al. 2022, Sec. 4.1: a block keeps s*b*h*(34 + 5*a*s/h) bytes for backward with
    2-byte activations and 1-byte dropout masks (b = 1 here)."""
    graph = import_model_proto(tiny_gpt(2, H, heads, seq, V))
    expected = seq * H * (34 + 5 * heads * seq / H)
    for block in graph.layers[1:-1]:
        assert block.activation_bytes == pytest.approx(expected)


def test_without_dropout_nodes_the_masks_are_not_counted():
    graph = import_model_proto(tiny_gpt(2, H, A, S, V, dropout=False))
    block = graph.layers[1]
    # no masks (3 of the 34sh, as^2 of the 5as^2), and the softmax output is the tensor P V reads (2as^2)
    assert block.activation_bytes == pytest.approx(S * H * 32 + 2 * A * S * S)


def test_megatron_split_of_a_block():
    graph = import_model_proto(tiny_gpt(1, H, A, S, V))
    block = graph.layers[1]
    matmuls = [(op.gemm, op.tp_split) for op in block.ops if op.op_type == "MatMul"]
    assert matmuls == [
        ((S, 3 * H, H), "column"),  # QKV
        ((A * S, S, H // A), "sharded"),  # Q K^T
        ((A * S, H // A, S), "sharded"),  # P V
        ((S, H, H), "row"),  # attention out
        ((S, 4 * H, H), "column"),  # FC1
        ((S, H, 4 * H), "row"),  # FC2
    ]
    split = {op.op_type: op.tp_split for op in block.ops}
    assert split["Softmax"] == "sharded" and split["Gelu"] == "sharded"
    assert split["LayerNormalization"] == "replicated"
    assert block.ops[-1].op_type == "Add" and block.ops[-1].tp_split == "replicated"  # residual


def test_grouped_query_attention_dims():
    graph = import_model_proto(tiny_gpt(2, H, 8, S, V, kv_heads=2, ffn=96))
    dims = graph.layers[1].transformer
    assert (dims.hidden, dims.heads, dims.kv_heads, dims.ffn, dims.seq_len) == (H, 8, 2, 96, S)


def test_word_embedding_is_a_table_and_positions_are_not():
    graph = import_model_proto(tiny_gpt(2, H, A, S, V))
    assert [(t.name, t.rows, t.dim, t.pooling_factor) for t in graph.embedding_tables] == [
        ("wte.weight", V, H, float(S))]
    assert graph.layers[0].kind == "embedding"


def test_embedding_bag_pattern_pooling_factor():
    """DLRM-style sparse feature: Gather of [batch, 20] indices from a 100000 x 16 table, summed."""
    g = GraphBuilder()
    rows = g.op("Gather", [g.weight("emb.0.weight", [100000, 16]), "idx"])
    pooled = g.op("ReduceSum", [rows, g.const("axes", np.array([1], np.int64))], keepdims=0)
    out = g.op("MatMul", [pooled, g.weight("top.weight", [16, 1])])
    model = g.model([h.make_tensor_value_info("idx", T.INT64, ["batch", 20])], [out])
    graph = import_model_proto(model)
    assert [(t.name, t.rows, t.dim, t.pooling_factor) for t in graph.embedding_tables] == [
        ("emb.0.weight", 100000, 16, 20.0)]
    assert graph.params == 100000 * 16 + 16


def test_symbolic_seq_must_be_bound():
    model = tiny_gpt(1, H, A, S, V, symbolic_seq=True)
    with pytest.raises(ModelError, match=r"'seq' of input 'input_ids'.*--dim seq=INT"):
        import_model_proto(model)
    graph = import_model_proto(model, {"seq": S, "batch": 2})
    assert graph.layers[1].transformer.seq_len == S
    assert dict(graph.dims) == {"batch": 2, "seq": S}


def test_builder_metadata_gives_default_dims_and_family():
    model = tiny_gpt(1, H, A, S, V, symbolic_seq=True)
    for key, value in (("planner.default_dims", json.dumps({"seq": S})), ("planner.family", "gpt"),
                       ("planner.config", json.dumps({"layers": 1}))):
        model.metadata_props.add(key=key, value=value)
    graph = import_model_proto(model)
    assert graph.family == "gpt" and dict(graph.dims) == {"batch": 1, "seq": S}
    # the user's --dim wins over the metadata (the tiny graph's causal mask is fixed at S, so at 2 * S the
    # attention has unknown shapes: planned only with allow_unknown_ops)
    override = import_model_proto(model, {"seq": 2 * S}, allow_unknown_ops=True)
    assert any("planned anyway (--allow-unknown-ops)" in w for w in override.warnings)
    assert dict(override.dims)["seq"] == 2 * S and override.embedding_tables[0].pooling_factor == 2 * S


@pytest.mark.parametrize("seq", [0, 2 ** 63])
def test_metadata_default_dims_out_of_range_are_refused(seq):
    """A default the user never gave, over what ONNX's int64 dims hold or under 1, is the file's fault."""
    model = tiny_gpt(1, H, A, S, V, symbolic_seq=True)
    model.metadata_props.add(key="planner.default_dims", value=json.dumps({"seq": seq}))
    with pytest.raises(ModelError, match="'planner.default_dims' is not a JSON object of integers from 1 to"):
        import_model_proto(model)


def _with_initializers(model: onnx.ModelProto, external: bool) -> onnx.ModelProto:
    """Move the weight graph inputs into initializers (weight-less, with external-data entries if asked)."""
    m = onnx.ModelProto()
    m.CopyFrom(model)
    keep = []
    for vi in m.graph.input:
        if vi.type.tensor_type.elem_type == T.FLOAT:
            t = m.graph.initializer.add()
            t.name, t.data_type = vi.name, T.FLOAT
            t.dims.extend(d.dim_value for d in vi.type.tensor_type.shape.dim)
            if external:
                t.data_location = T.EXTERNAL
                t.external_data.add(key="location", value="weights.bin")
            else:
                t.raw_data = np.zeros(int(np.prod(list(t.dims))), np.float32).tobytes()
        else:
            keep.append(vi)
    del m.graph.input[:]
    m.graph.input.extend(keep)
    return m


@pytest.mark.parametrize("external", [False, True], ids=["inline", "external-data"])
def test_weights_as_initializers_give_the_same_numbers(external, tmp_path):
    base = tiny_gpt(2, H, A, S, V)
    model = _with_initializers(base, external)
    path = tmp_path / "gpt.onnx"
    onnx.save(model, str(path))
    a, b = import_model_proto(base), load_model(path)
    assert b.params == a.params == gpt_params(2, H, S, V)
    assert [(x.name, x.flops_forward, x.activation_bytes) for x in a.layers] == [
        (x.name, x.flops_forward, x.activation_bytes) for x in b.layers]


def test_static_batch_is_divided_out():
    g = GraphBuilder()
    y = g.op("Relu", [g.op("Gemm", ["x", g.weight("w", [32, 8])])])
    model = g.model([h.make_tensor_value_info("x", T.FLOAT, [4, 32])], [y])
    graph = import_model_proto(model)
    assert graph.batch == 4
    assert graph.flops_forward == pytest.approx(2 * 32 * 8 + 8)  # per sample
    assert graph.layers[0].ops[0].gemm == (1, 8, 32)


def test_unknown_op_is_memory_bound_with_one_warning(caplog):
    g = GraphBuilder()
    y = g.op("MatMul", ["x", g.weight("w", [32, 32])])
    for _ in range(3):
        y = g.op("Relu", [y])
    node = h.make_node("FancyOp", [y], ["z"], domain="com.example")
    g.nodes.append(node)
    model = g.model([h.make_tensor_value_info("x", T.FLOAT, ["batch", 32])], [])
    model.graph.output.append(h.make_tensor_value_info("z", T.FLOAT, ["batch", 32]))
    model.opset_import.append(h.make_opsetid("com.example", 1))
    with caplog.at_level(logging.WARNING):
        graph = import_model_proto(model, allow_unknown_ops=True)  # 1.5% of the FLOPs, over the 1% limit
    assert graph.warnings[0] == ("no cost rule for op type com.example::FancyOp (1 nodes); costed as "
                                 "memory-bound (0 FLOPs)")
    assert graph.warnings[1].startswith("about 1.5% of the forward FLOPs are in ops the planner cannot cost")
    assert sum("no cost rule for op type" in r.getMessage() for r in caplog.records) == 1
    fancy = [op for layer in graph.layers for op in layer.ops if op.op_type == "FancyOp"]
    assert fancy and fancy[0].flops == 0 and fancy[0].bytes_read == 32 * 2


def test_lazy_public_api(tmp_path):
    path = tmp_path / "m.onnx"
    onnx.save(tiny_gpt(1, H, A, S, V), str(path))
    graph = planner.load_model(path, dims={"batch": 1})
    assert graph.params == gpt_params(1, H, S, V)


def test_cycle_is_a_model_error():
    a = h.make_node("Relu", ["x", ], ["a"], name="first")
    b = h.make_node("Add", ["a", "c"], ["b"], name="second")
    c = h.make_node("Relu", ["b"], ["c"], name="third")
    graph = h.make_graph([a, b, c], "g", [h.make_tensor_value_info("x", T.FLOAT, [1, 4])],
                         [h.make_tensor_value_info("c", T.FLOAT, [1, 4])])
    with pytest.raises(ModelError, match="cycle through node 'second'"):
        import_model_proto(h.make_model(graph))


def test_dangling_tensor_is_a_model_error():
    node = h.make_node("Add", ["x", "nowhere"], ["y"], name="adder")
    graph = h.make_graph([node], "g", [h.make_tensor_value_info("x", T.FLOAT, [1, 4])],
                         [h.make_tensor_value_info("y", T.FLOAT, [1, 4])])
    with pytest.raises(ModelError, match="'adder' reads tensor 'nowhere'"):
        import_model_proto(h.make_model(graph))


def test_import_is_deterministic():
    a = import_model_proto(tiny_gpt(2, H, A, S, V, named=False))
    b = import_model_proto(tiny_gpt(2, H, A, S, V, named=False))
    assert a == b


def test_einsum_and_conv_transpose_rules():
    g = GraphBuilder()
    y = g.op("Einsum", ["x", g.weight("w", [32, 16])], equation="bsk,kn->bsn")
    model = g.model([h.make_tensor_value_info("x", T.FLOAT, ["batch", 8, 32])], [y])
    assert import_model_proto(model).flops_forward == 2 * 8 * 32 * 16
    g = GraphBuilder()
    y = g.op("ConvTranspose", ["x", g.weight("w", [4, 6, 3, 3])], strides=[2, 2])
    model = g.model([h.make_tensor_value_info("x", T.FLOAT, ["batch", 4, 5, 5])], [y])
    # every input pixel scatters a 3x3 kernel into 6 output channels from 4 input channels
    assert import_model_proto(model).flops_forward == 2 * 4 * 25 * 6 * 9


@pytest.mark.parametrize("interaction", ["dot", "dcn"])
def test_builder_dlrm_layers(interaction):
    """A DLRM from the builders: one embedding unit holding every table, then the bottom MLP's layers
    as their own units (also with a DCN interaction, whose concatenation joins the two branches)."""
    import os

    from planner.builders import build

    tables = os.path.join(os.path.dirname(__file__), "..", "benchmarks", "data", "embedding_workloads.json")
    model = build("dlrm", {"tables": tables, "workload": "mlperf-dlrm-dcnv2", "interaction": interaction})
    graph = import_model_proto(model)
    kinds = [(layer.name, layer.kind) for layer in graph.layers]
    embedding = [layer for layer in graph.layers if layer.kind == "embedding"]
    assert len(embedding) == 1, kinds
    assert embedding[0].params == sum(t.rows * t.dim for t in graph.embedding_tables)
    assert [name for name, _ in kinds if name.startswith("bottom_mlp")] == [f"bottom_mlp.layers.{i}" for i in range(3)]
    assert graph.family == "dlrm" and len(graph.embedding_tables) == 26


@pytest.mark.parametrize("form", ["erf", "tanh"])
def test_decomposed_gelu_keeps_only_its_input(form):
    """TorchScript exports GeLU as a chain of element-wise ops; fused (as Megatron runs it) it keeps only its
    input, so the block's activation bytes equal the single-Gelu graph's (Korthikanti's 8sh for GeLU)."""
    fused = import_model_proto(tiny_gpt(2, H, A, S, V, gelu=form)).layers[1]
    single = import_model_proto(tiny_gpt(2, H, A, S, V)).layers[1]
    assert fused.activation_bytes == single.activation_bytes == S * H * (34 + 5 * A * S / H)
    assert fused.transformer == single.transformer


def _mlp(dims: list) -> onnx.ModelProto:
    g = GraphBuilder()
    y = g.op("Relu", [g.op("MatMul", ["x", g.weight("w", [32, 16])])])
    return g.model([h.make_tensor_value_info("x", T.FLOAT, dims)], [y])


def test_leading_symbolic_dim_is_the_batch():
    graph = import_model_proto(_mlp(["N", 32]))
    assert graph.batch == 1 and dict(graph.dims) == {"N": 1}
    graph = import_model_proto(_mlp(["N", 32]), {"N": 4})
    assert graph.batch == 4 and graph.flops_forward == pytest.approx(2 * 32 * 16 + 16)  # per sample


def test_unnamed_symbolic_dims():
    """A dim without a name: the leading one is the batch; another is bound as INPUT[POS]."""
    model = _mlp([None, None, 32])
    with pytest.raises(ModelError, match=r"--dim x\[1\]=INT"):
        import_model_proto(model)
    graph = import_model_proto(model, {"x[1]": 5})
    assert graph.flops_forward == pytest.approx(5 * (2 * 32 * 16 + 16))


def test_a_graph_of_constants_is_a_model_error():
    g = GraphBuilder()
    y = g.op("Relu", [g.const("w", np.ones((4, 4), np.float32))])
    model = g.model([h.make_tensor_value_info("x", T.FLOAT, ["batch", 4])], [y])
    with pytest.raises(ModelError, match="no node computes on the model's inputs"):
        import_model_proto(model)


def test_cycle_error_names_a_node_on_the_cycle_not_one_waiting_behind_it():
    after = h.make_node("Relu", ["b"], ["out"], name="after_cycle")  # first in file order, reads the cycle
    add = h.make_node("Add", ["x", "b"], ["a"], name="in_cycle_add")
    relu = h.make_node("Relu", ["a"], ["b"], name="in_cycle_relu")
    graph = h.make_graph([after, add, relu], "g", [h.make_tensor_value_info("x", T.FLOAT, [1, 4])],
                         [h.make_tensor_value_info("out", T.FLOAT, [1, 4])])
    with pytest.raises(ModelError, match="cycle through node 'in_cycle_add'"):
        import_model_proto(h.make_model(graph))


def test_onnxruntime_fused_gemm_is_costed_as_a_gemm():
    """com.microsoft::FusedGemm (a Gemm with its activation fused, as onnxruntime's optimiser writes it) is
    counted as its Gemm: 2 m n k plus the bias, not as an unknown op at a FLOP per element."""
    w = h.make_tensor("w", T.FLOAT, [256, 512], np.zeros(256 * 512, dtype=np.float32))
    b = h.make_tensor("b", T.FLOAT, [512], np.zeros(512, dtype=np.float32))
    node = h.make_node("FusedGemm", ["x", "w", "b"], ["y"], domain="com.microsoft", activation="Relu", name="fc")
    graph = h.make_graph([node], "g", [h.make_tensor_value_info("x", T.FLOAT, [4, 256])],
                         [h.make_tensor_value_info("y", T.FLOAT, [4, 512])], initializer=[w, b])
    proto = h.make_model(graph, opset_imports=[h.make_opsetid("", 17), h.make_opsetid("com.microsoft", 1)])
    model = import_model_proto(proto, {})
    assert model.flops_forward * model.batch == 2 * 4 * 512 * 256 + 4 * 512
    assert not [w for w in model.warnings if "no cost rule" in w]


def test_a_rotary_cache_is_not_a_parameter_but_looked_up_tables_that_add_or_scale_are():
    # a module's non-persistent cos buffer, exported as an initializer, sliced per position and multiplied into
    # the activations: not trained. A learned position table (looked up, added), a token embedding (looked up,
    # scaled by a constant) and a norm weight (multiplied without a lookup) stay parameters
    seq, width, vocab = 8, 16, 32
    nodes = [
        h.make_node("Gather", ["wte", "tokens"], ["emb"]),
        h.make_node("Mul", ["emb", "scale"], ["scaled"]),
        h.make_node("Gather", ["wpe", "positions"], ["pos"]),
        h.make_node("Add", ["scaled", "pos"], ["x"]),
        h.make_node("Slice", ["cos", "start", "stop"], ["cos_rows"]),
        h.make_node("Mul", ["x", "cos_rows"], ["rotated"]),
        h.make_node("Mul", ["rotated", "norm_w"], ["y"]),
    ]
    inits = [
        h.make_tensor("wte", T.FLOAT, [vocab, width], np.zeros(vocab * width, np.float32)),
        h.make_tensor("wpe", T.FLOAT, [seq, width], np.zeros(seq * width, np.float32)),
        h.make_tensor("cos", T.FLOAT, [64, width], np.zeros(64 * width, np.float32)),
        h.make_tensor("norm_w", T.FLOAT, [width], np.ones(width, np.float32)),
        h.make_tensor("scale", T.FLOAT, [], [4.0]),
        h.make_tensor("positions", T.INT64, [seq], np.arange(seq)),
        h.make_tensor("start", T.INT64, [1], [0]),
        h.make_tensor("stop", T.INT64, [1], [seq]),
    ]
    graph = h.make_graph(nodes, "rotary", [h.make_tensor_value_info("tokens", T.INT64, ["batch", seq])],
                         [h.make_tensor_value_info("y", T.FLOAT, ["batch", seq, width])], inits)
    model = import_model_proto(h.make_model(graph, opset_imports=[h.make_opsetid("", 18)]), {"batch": 1},
                               name="rotary")
    assert sum(layer.params for layer in model.layers) == vocab * width + seq * width + width
