"""Model-family builders: structure, declared-only weights, runnable semantics, key validation, and the GPT
FLOP/parameter counts of Narayanan et al. 2021 checked through the importer."""

from __future__ import annotations

import json
import math
import os

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import helper, numpy_helper

from planner.builders import FAMILIES, build, resolve_settings, save
from planner.errors import ConfigError

REFERENCE = os.path.join(os.path.dirname(__file__), "..", "benchmarks", "data", "embedding_workloads.json")
TINY = {"layers": 2, "hidden": 64, "heads": 4, "vocab": 100, "seq_len": 16, "dropout": 0}


def checkable(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy whose weights are graph inputs, so onnx.checker need not find the (never-written) weights file."""
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    for tensor in copy.graph.initializer:
        copy.graph.input.append(helper.make_tensor_value_info(tensor.name, tensor.data_type, list(tensor.dims)))
    del copy.graph.initializer[:]
    return copy


def materialize(model: onnx.ModelProto, seed: int = 0) -> onnx.ModelProto:
    """A copy with small random weights in place of the declared ones (norm scales 1), for onnxruntime."""
    rng = np.random.default_rng(seed)
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    for tensor in copy.graph.initializer:
        dtype = helper.tensor_dtype_to_np_dtype(tensor.data_type)
        values = rng.standard_normal(tuple(tensor.dims)) * 0.05
        if tensor.name.endswith("norm.weight"):
            values = np.ones(tuple(tensor.dims))
        tensor.CopyFrom(numpy_helper.from_array(values.astype(dtype), tensor.name))
    return copy


def run(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> np.ndarray:
    session = ort.InferenceSession(materialize(model).SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, feeds)[0].astype(np.float64)


def n_params(model: onnx.ModelProto) -> int:
    return sum(math.prod(t.dims) for t in model.graph.initializer)


# ------------------------------------------------------------------------------------------ well-formed
@pytest.mark.parametrize("family", ["gpt", "llama", "bert"])
def test_default_family_passes_the_onnx_checker(family):
    onnx.checker.check_model(checkable(build(family)), full_check=True)


def test_dlrm_interaction_defaults_to_cat_when_dims_differ(caplog):
    with caplog.at_level("WARNING"):
        model = build("dlrm", {"tables": REFERENCE, "workload": "hugectr-180table"})
    names = [n.name for n in model.graph.node if n.name.startswith("/interaction/")]
    assert names and not any("Transpose" in n for n in names)  # no pairwise dots: a concatenation
    assert "'cat'" in caplog.text
    dot = build("dlrm", {"tables": REFERENCE, "workload": "criteo-kaggle-dlrm"})
    cat = build("dlrm", {"tables": REFERENCE, "workload": "criteo-kaggle-dlrm", "interaction": "cat"})
    assert [n.op_type for n in dot.graph.node] != [n.op_type for n in cat.graph.node]


def test_dlrm_passes_the_onnx_checker():
    for settings in ({"workload": "criteo-kaggle-dlrm"}, {"workload": "hugectr-180table", "interaction": "cat"}):
        model = build("dlrm", {"tables": REFERENCE, **settings})
        onnx.checker.check_model(checkable(model), full_check=True)


def test_weights_are_declared_external_without_data(tmp_path):
    path = tmp_path / "my-gpt.onnx"
    model = build("gpt", TINY, weights_file="my-gpt.weights")
    save(model, str(path))
    assert os.listdir(tmp_path) == ["my-gpt.onnx"]
    loaded = onnx.load(str(path), load_external_data=False)
    spans = []
    for tensor in loaded.graph.initializer:
        assert tensor.data_location == onnx.TensorProto.EXTERNAL
        assert not tensor.raw_data and not tensor.float_data and not tensor.int32_data
        info = {entry.key: entry.value for entry in tensor.external_data}
        assert info["location"] == "my-gpt.weights"
        itemsize = np.dtype(helper.tensor_dtype_to_np_dtype(tensor.data_type)).itemsize
        assert int(info["length"]) == math.prod(tensor.dims) * itemsize
        spans.append((int(info["offset"]), int(info["offset"]) + int(info["length"])))
    spans.sort()
    assert all(end <= next_start for (_, end), (next_start, _) in zip(spans, spans[1:]))  # no overlap


def test_one_trillion_parameter_gpt_is_a_small_file():
    model = build("gpt", {"layers": 128, "hidden": 25600, "heads": 160})
    assert n_params(model) > 1.0e12
    assert len(model.SerializeToString()) < 1_000_000  # about 640 KB: names and shapes only


def test_metadata_and_symbolic_dims():
    model = build("llama", {**TINY, "kv_heads": 2})
    meta = {p.key: p.value for p in model.metadata_props}
    assert meta["planner.family"] == "llama"
    assert json.loads(meta["planner.default_dims"]) == {"seq": 16}
    config = json.loads(meta["planner.config"])
    assert config["kv_heads"] == 2 and config["ffn"] == 256  # 256 * ceil(8*64/3/256)
    dims = [d.dim_param or d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]
    assert dims == ["batch", "seq"]


def test_node_names_use_exporter_scopes():
    names = [node.name for node in build("gpt", TINY).graph.node]
    assert "/embed/word/Gather" in names
    assert "/layers.0/attn/qkv/MatMul" in names and "/layers.1/mlp/fc2/MatMul" in names
    assert "/head/lm_head/MatMul" in names
    assert len(names) == len(set(names))


def test_dropout_positions_follow_megatron():
    """Per block: attention probabilities, attention output, MLP output (Korthikanti et al. 2022)."""
    nodes = [n for n in build("gpt", {**TINY, "dropout": 0.1}).graph.node if n.op_type == "Dropout"]
    in_block0 = sorted(n.name for n in nodes if n.name.startswith("/layers.0/"))
    assert in_block0 == ["/layers.0/attn/Dropout", "/layers.0/attn/Dropout_1", "/layers.0/mlp/Dropout"]
    assert all(len(n.output) == 2 for n in nodes)  # the mask is an output, as in training
    assert not [n for n in build("llama", TINY).graph.node if n.op_type == "Dropout"]


def test_build_is_deterministic():
    assert build("bert", TINY).SerializeToString() == build("bert", TINY).SerializeToString()


# --------------------------------------------------------------------------------------- parameters
def test_llama_parameters_follow_its_formula():
    """Llama-2 7B: 32 * (4h^2 + 3*h*ffn + 2h) + 2*V*h + h = 6,738,415,616 (the published count)."""
    assert n_params(build("llama")) == 6_738_415_616
    # grouped-query: q and o are h x h, k and v are h x (kv * h/a)
    h, a, kv, l, f, v = 64, 4, 2, 2, 256, 100
    expected = l * (2 * h * h + 2 * h * (kv * h // a) + 3 * h * f + 2 * h) + 2 * v * h + h
    assert n_params(build("llama", {**TINY, "kv_heads": kv})) == expected


def test_gpt_with_multi_query_attention():
    """kv_heads = 1: the fused projection is h x (h + 2·h/a) wide, and its bias h + 2·h/a."""
    h, a, l, v, s = 64, 4, 2, 100, 16
    per_block_mha = 12 * h * h + 13 * h
    fewer = 2 * (h - h // a) * (h + 1)  # k and v shrink from h to h/a columns (weights and biases)
    assert n_params(build("gpt", {**TINY, "kv_heads": 1})) == l * (per_block_mha - fewer) + (v + s) * h + 2 * h


def test_bert_base_parameters():
    """BERT-base with its MLM head (transform + tied decoder) and no pooler: 109,514,298 parameters, the
    count of Hugging Face's BertForMaskedLM (BertModel's 109,482,240 - pooler 590,592 + MLM head 622,650)."""
    h, l, v, s = 768, 12, 30522, 512
    embeddings = (v + s + 2) * h + 2 * h
    blocks = l * (12 * h * h + 13 * h)
    head = h * h + h + 2 * h + v
    assert n_params(build("bert")) == embeddings + blocks + head == 109_514_298


# ----------------------------------------------------------------------------------------- semantics
@pytest.mark.parametrize("family,extra", [("gpt", {}), ("gpt", {"kv_heads": 1}), ("llama", {"kv_heads": 2})])
def test_decoder_is_causal(family, extra):
    model = build(family, {**TINY, **extra})
    ids = np.random.default_rng(1).integers(0, 100, (2, 7))
    changed = ids.copy()
    changed[:, 5] = (changed[:, 5] + 1) % 100
    before, after = run(model, {"input_ids": ids}), run(model, {"input_ids": changed})
    assert before.shape == (2, 7, 100)
    np.testing.assert_allclose(before[:, :5], after[:, :5], atol=1e-3)
    assert np.abs(before[:, 5:] - after[:, 5:]).max() > 1e-3


def test_bert_masks_padding_and_sees_both_ways():
    model = build("bert", TINY)
    ids = np.random.default_rng(2).integers(0, 100, (1, 6))
    mask = np.array([[1, 1, 1, 1, 0, 0]])
    feeds = {"input_ids": ids, "token_type_ids": np.zeros_like(ids), "attention_mask": mask}
    changed = dict(feeds, input_ids=ids.copy())
    changed["input_ids"][0, 5] = (ids[0, 5] + 1) % 100  # a padded position: invisible to the others
    np.testing.assert_allclose(run(model, feeds)[0, :4], run(model, changed)[0, :4], atol=1e-3)
    changed["input_ids"][0, 3] = (ids[0, 3] + 1) % 100  # a real position: seen by earlier ones too
    assert np.abs(run(model, feeds)[0, 0] - run(model, changed)[0, 0]).max() > 1e-3


def test_dlrm_runs_and_pools(tmp_path):
    tables = tmp_path / "tables.yaml"
    tables.write_text("tables:\n  - {name: user, rows: 50, dim: 8, pooling_factor: 1}\n"
                      "  - {name: item.id, rows: 40, dim: 8, pooling_factor: 3}\n")
    model = build("dlrm", {"tables": str(tables), "dense_features": 4, "bottom_mlp": "16,8", "top_mlp": "8,1"})
    ops = [n.op_type for n in model.graph.node]
    assert ops.count("ReduceSum") == 1  # only the pooled table sums its rows
    rng = np.random.default_rng(3)
    feeds = {"dense_features": rng.standard_normal((5, 4)).astype(np.float32),
             "user_indices": rng.integers(0, 50, (5,)), "item_id_indices": rng.integers(0, 40, (5, 3))}
    out = run(model, feeds)
    assert out.shape == (5, 1) and ((out > 0) & (out < 1)).all()
    # params: tables + bottom (4*16+16 + 16*8+8) + top ((8 + 3 pairs)*8+8 + 8*1+1)
    assert n_params(model) == 50 * 8 + 40 * 8 + (4 * 16 + 16 + 16 * 8 + 8) + ((8 + 3) * 8 + 8 + 8 + 1)
    meta = {p.key: json.loads(p.value) for p in model.metadata_props if p.key == "planner.tables"}
    assert meta["planner.tables"][1]["pooling_factor"] == 3.0


def test_dlrm_dcn_interaction(tmp_path):
    """DCN-v2 cross layers over the concatenation [z, e_1, e_2] of width D = 8 + 8 + 4 = 20."""
    tables = tmp_path / "tables.json"
    tables.write_text(json.dumps({"tables": [{"name": "a", "rows": 30, "dim": 8}, {"name": "b", "rows": 20, "dim": 4}]}))
    model = build("dlrm", {"tables": str(tables), "dense_features": 3, "bottom_mlp": "8", "top_mlp": "1",
                           "interaction": "dcn", "dcn_layers": 2, "dcn_rank": 5})
    d, r = 20, 5
    assert n_params(model) == 30 * 8 + 20 * 4 + (3 * 8 + 8) + 2 * (d * r + r * d + d) + (d + 1)
    assert "/interaction/cross.1/U/MatMul" in [n.name for n in model.graph.node]
    rng = np.random.default_rng(4)
    out = run(model, {"dense_features": rng.standard_normal((2, 3)).astype(np.float32),
                      "a_indices": rng.integers(0, 30, (2,)), "b_indices": rng.integers(0, 20, (2,))})
    assert out.shape == (2, 1)


def test_dlrm_takes_dense_sizes_from_a_workload_entry():
    config = resolve_settings("dlrm", {"tables": REFERENCE, "workload": "mlperf-dlrm-dcnv2"})
    assert config["bottom_mlp"] == (512, 256, 128) and config["top_mlp"] == (1024, 1024, 512, 256, 1)
    config = resolve_settings("dlrm", {"tables": REFERENCE, "workload": "mlperf-dlrm-dcnv2", "top_mlp": "64,1"})
    assert config["top_mlp"] == (64, 1)


def test_dlrm_takes_the_interaction_a_workload_entry_names(tmp_path):
    """MLPerf's DLRM-DCNv2 entry names "dcn(3 layers, low rank 512)": built as DCN-v2, unless the user says."""
    config = resolve_settings("dlrm", {"tables": REFERENCE, "workload": "mlperf-dlrm-dcnv2"})
    assert (config["interaction"], config["dcn_layers"], config["dcn_rank"]) == ("dcn", 3, 512)
    config = resolve_settings("dlrm", {"tables": REFERENCE, "workload": "mlperf-dlrm-dcnv2", "interaction": "cat"})
    assert config["interaction"] == "cat" and "dcn_layers" not in config
    path = tmp_path / "t.json"
    tables = [{"name": "a", "rows": 100, "dim": 16, "pooling_factor": 1}]
    for text, expected in (("dcn(2 layers, low rank 8)", ("dcn", 2, 8)), ("DCN", ("dcn", 3, 512))):
        path.write_text(json.dumps({"tables": tables, "interaction": text}))
        config = resolve_settings("dlrm", {"tables": str(path)})
        assert (config["interaction"], config["dcn_layers"], config["dcn_rank"]) == expected
    path.write_text(json.dumps({"tables": tables, "interaction": "attention"}))
    with pytest.raises(ConfigError, match="interaction 'attention' is not dot, cat or dcn"):
        resolve_settings("dlrm", {"tables": str(path)})


# ------------------------------------------------------------------------------------------- errors
@pytest.mark.parametrize("family,settings,words", [
    ("gpt", {"hiden": 8}, ["'hiden'", "did you mean hidden", "valid keys", "seq_len"]),
    ("gpt", {"layers": "zero"}, ["'layers'", "integer >= 1"]),
    ("gpt", {"layers": 0}, ["'layers'", ">= 1"]),
    ("gpt", {"hidden": 100, "heads": 3}, ["'hidden'", "'heads'"]),
    ("llama", {"kv_heads": 5}, ["'kv_heads'", "divide"]),
    ("llama", {"hidden": 96, "heads": 32}, ["even", "rotary"]),
    ("bert", {"dropout": 2}, ["'dropout'", "<= 0.9"]),
    ("dlrm", {}, ["'tables'", "required"]),
    ("dlrm", {"tables": "/no/such/file.json"}, ["/no/such/file.json", "does not exist"]),
    ("dlrm", {"tables": REFERENCE}, ["--set workload=NAME", "criteo-kaggle-dlrm"]),
    ("dlrm", {"tables": REFERENCE, "workload": "criteo"}, ["no workload 'criteo'"]),
    ("dlrm", {"tables": REFERENCE, "workload": "hugectr-180table", "interaction": "dot"}, ["interaction=cat"]),
    ("dlrm", {"tables": REFERENCE, "workload": "criteo-kaggle-dlrm", "interaction": "dott"}, ["did you mean dot"]),
    ("dlrm", {"tables": REFERENCE, "workload": "criteo-kaggle-dlrm", "bottom_mlp": "64,x"}, ["'bottom_mlp'"]),
    ("gtp", {}, ["unknown model family 'gtp'", "did you mean gpt"]),
])
def test_bad_settings_name_the_key(family, settings, words):
    with pytest.raises(ConfigError) as info:
        build(family, settings)
    for word in words:
        assert word in str(info.value)


@pytest.mark.parametrize("text,words", [
    ('{"tables": []}', ["'tables' needs at least 1 item"]),
    ('{"tables": [{"name": "a", "rows": 10}]}', ["tables[0]", "dim"]),
    ('{"tables": [{"name": "a", "rows": -1, "dim": 4}]}', ["'tables[0].rows' must be an integer from 1 to 1000000000000, got -1"]),
    ('{"tables": [{"name": "a", "rows": 1, "dim": 4}, {"name": "a", "rows": 1, "dim": 4}]}', ["appears twice"]),
    ("tables: [", ["malformed YAML"]),
])
def test_bad_tables_file_is_named(tmp_path, text, words):
    path = tmp_path / "t.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        build("dlrm", {"tables": str(path)})
    assert str(path) in str(info.value)
    for word in words:
        assert word in str(info.value)


def test_every_family_lists_its_keys():
    assert set(FAMILIES) >= {"gpt", "llama", "bert", "dlrm"}
    for family in ("gpt", "llama"):
        names = [key.name for key in FAMILIES[family].keys]
        assert {"layers", "hidden", "heads", "vocab", "seq_len", "ffn", "kv_heads"} <= set(names)
    assert {"tables", "dense_features", "bottom_mlp", "top_mlp"} <= {k.name for k in FAMILIES["dlrm"].keys}


# ------------------------------------------------------------------------------ through the importer
GPT_SIZES = {  # name: (layers, hidden, heads), Brown et al. 2020 Table 2.1 and Narayanan et al. 2021 Table 1
    "125M": (12, 768, 12), "350M": (24, 1024, 16), "1.3B": (24, 2048, 16), "2.7B": (32, 2560, 32),
    "6.7B": (32, 4096, 32), "13B": (40, 5120, 40), "175B": (96, 12288, 96), "1T": (128, 25600, 160),
}


def _import(tmp_path, family, settings, dims):
    from planner.graph import load_model

    path = tmp_path / f"{family}.onnx"
    save(build(family, settings, weights_file=f"{family}.weights"), str(path))
    return load_model(str(path), dims=dims)


def _matmul_flops(layers) -> float:
    return sum(op.flops for layer in layers for op in layer.ops if op.gemm is not None)


@pytest.mark.parametrize("size", GPT_SIZES)
def test_gpt_flops_and_params_match_narayanan(size, tmp_path):
    """Narayanan et al. 2021 (Megatron-LM), Sec. 5.1: per iteration 96·B·s·l·h²·(1 + s/(6h) + V/(16·l·h)) FLOPs
    with activation recomputation (blocks: forward, backward 2x, recompute 1x = 4x forward; the LM head 3x,
    not recomputed), and 12·l·h²·(1 + 13/(12h) + (V+s)/(12·l·h)) parameters. The forward pass alone is
    24·s·l·h²·(1 + s/(6h)) + 2·s·h·V; the issue's 24·s·l·h²·(1 + s/(6h) + V/(16·l·h)) is the iteration count
    divided by 4, which puts the head at 1.5·s·h·V: the graph's forward exceeds it by exactly 0.5·s·h·V
    (6.5% at 125M, 0.03% at 1T)."""
    l, h, a = GPT_SIZES[size]
    v, s = 51200, 2048
    graph = _import(tmp_path, "gpt", {"layers": l, "hidden": h, "heads": a, "vocab": v, "seq_len": s},
                    {"batch": 1, "seq": s})
    kinds = [layer.kind for layer in graph.layers]
    assert kinds == ["embedding"] + ["block"] * l + ["head"]
    blocks = [layer for layer in graph.layers if layer.kind == "block"]
    dims = blocks[0].transformer
    assert (dims.hidden, dims.heads, dims.seq_len, dims.ffn) == (h, a, s, 4 * h)

    forward = _matmul_flops(graph.layers)
    assert forward == pytest.approx(24 * s * l * h * h * (1 + s / (6 * h) + v / (12 * l * h)), rel=0.01)
    in_blocks = _matmul_flops(blocks)
    iteration = 4 * in_blocks + 3 * (forward - in_blocks)
    assert iteration == pytest.approx(96 * s * l * h * h * (1 + s / (6 * h) + v / (16 * l * h)), rel=0.01)
    issue_formula = 24 * s * l * h * h * (1 + s / (6 * h) + v / (16 * l * h))
    assert forward - issue_formula == pytest.approx(0.5 * s * h * v, rel=0.01)
    assert graph.flops_forward == pytest.approx(forward, rel=0.02)  # element-wise work adds under 1%
    assert graph.params == pytest.approx(12 * l * h * h * (1 + 13 / (12 * h) + (v + s) / (12 * l * h)), rel=0.005)


def test_llama_through_the_importer(tmp_path):
    """Llama-2 7B shape with grouped-query attention (8 kv heads), s = 4096."""
    l, h, a, kv, v, s = 32, 4096, 32, 8, 32000, 4096
    f, d = 11008, h // a
    graph = _import(tmp_path, "llama", {"kv_heads": kv}, {"batch": 1, "seq": s})
    assert [layer.kind for layer in graph.layers] == ["embedding"] + ["block"] * l + ["head"]
    dims = graph.layers[1].transformer
    assert (dims.hidden, dims.heads, dims.ffn, dims.kv_heads, dims.seq_len) == (h, a, f, kv, s)
    # per block: q and o 2·2sh², k and v 2·2sh(kv·d), scores and context 4s²h, SwiGLU 3·2shf; head 2shV
    expected = l * (4 * s * h * h + 4 * s * h * kv * d + 4 * s * s * h + 6 * s * h * f) + 2 * s * h * v
    assert _matmul_flops(graph.layers) == pytest.approx(expected, rel=0.01)
    assert graph.params == l * (2 * h * h + 2 * h * kv * d + 3 * h * f + 2 * h) + 2 * v * h + h


def test_bert_through_the_importer(tmp_path):
    l, h, v, s = 12, 768, 30522, 512
    graph = _import(tmp_path, "bert", {}, {"batch": 1, "seq": s})
    assert [layer.kind for layer in graph.layers] == ["embedding"] + ["block"] * l + ["head"]
    # per block 24sh² + 4s²h; MLM head: transform 2sh², tied decoder 2shV
    expected = l * (24 * s * h * h + 4 * s * s * h) + 2 * s * h * h + 2 * s * h * v
    assert _matmul_flops(graph.layers) == pytest.approx(expected, rel=0.01)
    assert graph.params == 109_514_298


def test_dlrm_through_the_importer(tmp_path):
    graph = _import(tmp_path, "dlrm", {"tables": REFERENCE, "workload": "criteo-kaggle-dlrm"}, {"batch": 1})
    with open(REFERENCE, encoding="utf-8") as handle:
        workload = next(w for w in json.load(handle)["workloads"] if w["name"] == "criteo-kaggle-dlrm")
    found = sorted((t.rows, t.dim) for t in graph.embedding_tables)
    assert found == sorted((t["rows"], t["dim"]) for t in workload["tables"])
    widths_bottom = [13, 512, 256, 64]
    features = len(workload["tables"]) + 1
    widths_top = [64 + features * (features - 1) // 2, 512, 256, 1]
    # matrix products: the MLPs (2 per multiply-add) and the pairwise dots 2·(F+1)²·d; a Gemm may add its bias
    products = sum(2 * a * b for w in (widths_bottom, widths_top) for a, b in zip(w, w[1:]))
    products += 2 * features * features * 64
    bias_adds = sum(widths_bottom[1:]) + sum(widths_top[1:])
    assert products * 0.99 <= _matmul_flops(graph.layers) <= (products + bias_adds) * 1.01


def test_dlrm_params_through_the_importer(tmp_path):
    graph = _import(tmp_path, "dlrm", {"tables": REFERENCE, "workload": "criteo-kaggle-dlrm"}, {"batch": 1})
    with open(REFERENCE, encoding="utf-8") as handle:
        workload = next(w for w in json.load(handle)["workloads"] if w["name"] == "criteo-kaggle-dlrm")
    features = len(workload["tables"]) + 1
    widths = ([13, 512, 256, 64], [64 + features * (features - 1) // 2, 512, 256, 1])
    mlp = sum(a * b + b for w in widths for a, b in zip(w, w[1:]))
    assert graph.params == sum(t["rows"] * t["dim"] for t in workload["tables"]) + mlp


@pytest.mark.parametrize("family,h,a,s,dropout,expected", [
    # Korthikanti et al. 2022, Eq. 1: s·b·h·(34 + 5·a·s/h) bytes per block with dropout (b = 1)
    ("gpt", 1024, 16, 2048, 0.1, 2048 * 1024 * (34 + 5 * 16 * 2048 / 1024)),
    ("gpt", 4096, 32, 2048, 0.1, 2048 * 4096 * (34 + 5 * 32 * 2048 / 4096)),
    ("bert", 768, 12, 512, 0.1, 512 * 768 * (34 + 5 * 12 * 512 / 768)),
    # without dropout its masks (2sbh + a·s²·b) and the dropped-out probabilities (2a·s²·b) go
    ("gpt", 1024, 16, 2048, 0.0, 2048 * 1024 * (32 + 2 * 16 * 2048 / 1024)),
])
def test_block_activations_match_korthikanti(tmp_path, family, h, a, s, dropout, expected):
    graph = _import(tmp_path, family, {"layers": 2, "hidden": h, "heads": a, "seq_len": s, "dropout": dropout},
                    {"batch": 1, "seq": s})
    blocks = [layer for layer in graph.layers if layer.kind == "block"]
    assert [layer.activation_bytes for layer in blocks] == [pytest.approx(expected, rel=1e-9)] * 2


@pytest.mark.parametrize("interaction", ["dot", "dcn"])
def test_dlrm_bottom_mlp_is_its_own_units(tmp_path, interaction):
    graph = _import(tmp_path, "dlrm", {"tables": REFERENCE, "workload": "mlperf-dlrm-dcnv2",
                                       "interaction": interaction}, {"batch": 1})
    embedding = next(layer for layer in graph.layers if layer.kind == "embedding")
    with open(REFERENCE, encoding="utf-8") as handle:
        workload = next(w for w in json.load(handle)["workloads"] if w["name"] == "mlperf-dlrm-dcnv2")
    assert embedding.params == sum(t["rows"] * t["dim"] for t in workload["tables"])
    assert [layer.name for layer in graph.layers if layer.name.startswith("bottom_mlp")]


# ------------------------------------------------------------------------------------ mixture of experts
MOE_TINY = {"layers": 2, "hidden": 32, "heads": 4, "vocab": 50, "seq_len": 16, "experts": 4, "top_k": 2,
            "expert_ffn": 24}
MLA_TINY = {**MOE_TINY, "attention": "mla", "q_lora_rank": 16, "kv_lora_rank": 8, "qk_rope_head_dim": 4,
            "qk_nope_head_dim": 8, "v_head_dim": 8, "shared_experts": 1, "dense_layers": 1, "router": "sigmoid"}


def _active(graph) -> tuple[int, int]:
    return graph.params, graph.active_params


@pytest.mark.parametrize("settings", [MOE_TINY, MLA_TINY], ids=["gqa", "mla"])
def test_moe_passes_the_checker_and_runs(settings):
    model = build("moe", settings)
    onnx.checker.check_model(checkable(model), full_check=True)
    ids = np.random.default_rng(0).integers(0, 50, (2, 16)).astype(np.int64)
    out = run(model, {"input_ids": ids})
    assert out.shape == (2, 16, 50) and np.isfinite(out).all()


def test_moe_defaults_are_mixtral_8x7b():
    """Mixtral 8x7B: 46.7B parameters, 12.9B active per token (Mistral AI, "Mixtral of experts", 2023-12-11;
    Jiang et al. 2024, arXiv:2401.04088). The build has 46,702,792,704 and 12,879,925,248."""
    from planner.graph import import_model_proto

    model = build("moe")
    assert n_params(model) == 46_702_792_704
    params, active = _active(import_model_proto(model, {"batch": 1}))
    assert params == pytest.approx(46.7e9, rel=0.01)
    assert active == pytest.approx(12.9e9, rel=0.01)


def test_moe_qwen3_30b_a3b():
    """Qwen3-30B-A3B model card: 30.5B parameters, 3.3B activated; 48 layers, 32 query / 4 kv heads of 128,
    128 experts, 8 activated, expert width 768, hidden 2048, vocab 151936. The build lacks Qwen3's per-head
    q/k RMSNorm scales (2 x 128 per layer)."""
    from planner.graph import import_model_proto

    cfg = {"layers": 48, "hidden": 2048, "heads": 32, "kv_heads": 4, "head_dim": 128, "experts": 128,
           "top_k": 8, "expert_ffn": 768, "vocab": 151936}
    params, active = _active(import_model_proto(build("moe", cfg), {"batch": 1, "seq": 512}))
    assert params == pytest.approx(30.5e9, rel=0.01)
    assert active == pytest.approx(3.3e9, rel=0.02)


def test_moe_deepseek_v3_like():
    """DeepSeek-V3 technical report (arXiv:2412.19437): 671B total parameters, 37B activated per token;
    61 layers, hidden 7168, 128 heads with MLA, 1 shared + 256 routed experts of width 2048, 8 activated,
    the first 3 layers dense (width 18432), vocab 129280. The build has 671.03B total (the report's 671B
    leaves out the 14B multi-token-prediction module, as the build does) and 37.55B active, 1.5% above 37B.
    The report does not break its 37B down; the build counts the word embedding (0.93B, of which a token
    reads one row) as active, without it 36.6B. DeepSeek's router correction bias (256 per layer) is left
    out."""
    from planner.graph import import_model_proto

    cfg = {"layers": 61, "hidden": 7168, "heads": 128, "attention": "mla", "experts": 256, "shared_experts": 1,
           "top_k": 8, "expert_ffn": 2048, "dense_layers": 3, "dense_ffn": 18432, "vocab": 129280,
           "router": "sigmoid"}
    graph = import_model_proto(build("moe", cfg), {"batch": 1, "seq": 512})
    params, active = _active(graph)
    assert params == pytest.approx(671e9, rel=0.01)
    assert active == pytest.approx(37e9, rel=0.025)
    moe_layers = [layer for layer in graph.layers if layer.moe is not None]
    assert len(moe_layers) == 58 and moe_layers[0].moe.shared_experts == 1


@pytest.mark.parametrize("settings,words", [
    ({"experts": 4, "top_k": 5}, ["'top_k' = 5", "from 1 to 'experts' = 4"]),
    ({"experts": 0}, ["'experts' = 0", ">= 1"]),
    ({"heads": 32, "kv_heads": 5}, ["'kv_heads' = 5", "divisor of 'heads' = 32", "1, 2, 4, 8, 16, 32"]),
    ({"attention": "mha", "kv_heads": 8}, ["'kv_heads' = 8", "attention=mha"]),
    ({"attention": "mla_"}, ["'attention'", "one of mha, gqa, mla"]),
    ({"dense_layers": 40}, ["'dense_layers' = 40", "0 to 'layers' = 32"]),
    ({"kv_lora_rank": 64}, ["'kv_lora_rank' applies only to attention=mla"]),
    ({"attention": "mla", "head_dim": 64}, ["'head_dim' applies to attention=mha/gqa"]),
])
def test_moe_bad_settings_name_the_key(settings, words):
    with pytest.raises(ConfigError) as info:
        build("moe", settings)
    message = str(info.value)
    assert "\n" not in message and message.startswith("moe: ")
    for word in words:
        assert word in message
