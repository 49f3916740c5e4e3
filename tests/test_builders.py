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

REFERENCE = os.path.join(os.path.dirname(__file__), "..", "..", "shared", "reference", "embedding_workloads.json")
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
    assert len(model.SerializeToString()) < 2_000_000  # about 1.0 MB: names and shapes only


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


def test_bert_base_parameters():
    """BERT-base with its MLM head (transform + tied decoder) and no pooler: 109,514,298 parameters, the
    count of Hugging Face's BertForMaskedLM (BertModel's 109,482,240 - pooler 590,592 + MLM head 622,650)."""
    h, l, v, s = 768, 12, 30522, 512
    embeddings = (v + s + 2) * h + 2 * h
    blocks = l * (12 * h * h + 13 * h)
    head = h * h + h + 2 * h + v
    assert n_params(build("bert")) == embeddings + blocks + head == 109_514_298


# ----------------------------------------------------------------------------------------- semantics
@pytest.mark.parametrize("family,extra", [("gpt", {}), ("llama", {"kv_heads": 2})])
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


def test_dlrm_takes_dense_sizes_from_a_workload_entry():
    config = resolve_settings("dlrm", {"tables": REFERENCE, "workload": "mlperf-dlrm-dcnv2"})
    assert config["bottom_mlp"] == (512, 256, 128) and config["top_mlp"] == (1024, 1024, 512, 256, 1)
    config = resolve_settings("dlrm", {"tables": REFERENCE, "workload": "mlperf-dlrm-dcnv2", "top_mlp": "64,1"})
    assert config["top_mlp"] == (64, 1)


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
    ("dlrm", {"tables": REFERENCE}, ["workload=NAME", "criteo-kaggle-dlrm"]),
    ("dlrm", {"tables": REFERENCE, "workload": "criteo"}, ["no workload 'criteo'"]),
    ("dlrm", {"tables": REFERENCE, "workload": "hugectr-180table"}, ["interaction=cat"]),
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
    ('{"tables": []}', ["non-empty list under 'tables'"]),
    ('{"tables": [{"name": "a", "rows": 10}]}', ["tables[0]", "dim"]),
    ('{"tables": [{"name": "a", "rows": -1, "dim": 4}]}', ["tables[0]", "'rows'", "positive integer"]),
    ('{"tables": [{"name": "a", "rows": 1, "dim": 4}, {"name": "a", "rows": 1, "dim": 4}]}', ["appears twice"]),
    ("tables: [", ["not valid YAML"]),
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
