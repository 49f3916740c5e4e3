"""Builder keys have upper bounds and finite values: an absurd ``--set`` (layers=100000, a seq_len or vocab
the importer would call corrupted, dropout=nan) is a one-line ConfigError naming the key, the accepted range
and the value, before anything is built; sizes at the maxima build a model that imports; and the sizes the
benchmarks and published models use are all accepted."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from planner.builders import FAMILIES, build, resolve_settings
from planner.builders._spec import FLOAT, INT, INT_LIST
from planner.cli import main
from planner.errors import ConfigError
from planner.graph import import_model_proto

REFERENCE = str(Path(__file__).resolve().parent.parent / "benchmarks" / "data" / "embedding_workloads.json")
TINY = {"layers": 1, "hidden": 64, "heads": 4, "vocab": 100, "seq_len": 16}
MOE_TINY = {"layers": 1, "hidden": 32, "heads": 4, "vocab": 50, "seq_len": 16, "experts": 4, "top_k": 2,
            "expert_ffn": 16}


def tables_file(tmp_path: Path, tables: list[dict]) -> str:
    path = tmp_path / "tables.json"
    path.write_text(json.dumps({"tables": tables}))
    return str(path)


# -------------------------------------------------------------------------------------- one key at a time
@pytest.mark.parametrize("family,key,value,valid", [
    ("gpt", "layers", 100000, "an integer >= 1 and <= 1024"),
    ("gpt", "seq_len", "99999999999", "an integer >= 1 and <= 4194304"),
    ("gpt", "vocab", 2**22 + 1, "<= 4194304"),
    ("gpt", "hidden", 2**17 + 1, "<= 131072"),
    ("llama", "heads", 1025, "<= 1024"),
    ("llama", "kv_heads", 1025, "<= 1024"),
    ("llama", "ffn", 2**20 + 1, "<= 1048576"),
    ("bert", "type_vocab", 2**22 + 1, "<= 4194304"),
    ("moe", "experts", 4097, "<= 4096"),
    ("moe", "layers", 1025, "<= 1024"),
    ("moe", "head_dim", 4098, "<= 4096"),
    ("moe", "kv_lora_rank", 2**17 + 1, "<= 131072"),
])
def test_a_value_over_the_maximum_names_key_range_and_value(family: str, key: str, value: object,
                                                           valid: str) -> None:
    with pytest.raises(ConfigError) as info:
        build(family, {key: value})
    message = str(info.value)
    assert f"key '{key}' = {value!r} is invalid" in message and valid in message, message


@pytest.mark.parametrize("value", ["nan", "NaN", "inf", "-inf", float("nan"), float("inf")])
def test_dropout_must_be_finite(value: object) -> None:
    with pytest.raises(ConfigError) as info:
        build("gpt", {**TINY, "dropout": value})
    message = str(info.value)
    assert f"key 'dropout' = {value!r} is invalid; expected a number >= 0 and <= 0.9" in message, message


def test_every_number_key_has_a_maximum() -> None:
    for family in FAMILIES.values():
        for key in family.keys:
            if key.kind in (INT, FLOAT, INT_LIST):
                assert key.maximum is not None, f"{family.name}.{key.name} has no maximum"
            if key.kind == INT_LIST:
                assert key.max_items is not None, f"{family.name}.{key.name} has no longest list"


def test_dlrm_keys_take_what_a_tables_file_takes() -> None:
    with pytest.raises(ConfigError, match=r"'bottom_mlp' = '1000001' .*each >= 1 and <= 1000000"):
        build("dlrm", {"tables": REFERENCE, "workload": "criteo-kaggle-dlrm", "bottom_mlp": "8,1000001"})
    with pytest.raises(ConfigError, match=r"'top_mlp' has 1001 items; expected a comma list of up to 1000 "):
        build("dlrm", {"tables": REFERENCE, "workload": "criteo-kaggle-dlrm", "top_mlp": ",".join(["1"] * 1001)})
    with pytest.raises(ConfigError, match=r"'dcn_layers' = 1001 .*<= 1000"):
        build("dlrm", {"tables": REFERENCE, "workload": "criteo-kaggle-dlrm", "dcn_layers": 1001})


# --------------------------------------------------------------------------------- keys taken together
@pytest.mark.parametrize("family,settings,words", [
    ("gpt", {"heads": 32, "hidden": 4096, "seq_len": 2**22}, ["attention scores", "32 x 4194304 x 4194304",
                                                              "lower 'seq_len' or 'heads'"]),
    ("moe", {"heads": 1024, "hidden": 131072, "seq_len": 2**20}, ["attention scores"]),
    ("moe", {"experts": 4096, "expert_ffn": 2**20}, ["batched expert weight", "4096 x 4096 x 1048576"]),
    ("moe", {"heads": 8, "hidden": 64, "seq_len": 2**22, "experts": 1024, "top_k": 1024, "expert_ffn": 2**17},
     ["expert activations", "1024 x 4194304 x 131072"]),
    ("moe", {"shared_experts": 300, "expert_ffn": 2**20}, ["MLP weight", "shared_experts x expert_ffn"]),
    ("moe", {"layers": 4, "dense_layers": 1, "experts": 8, "top_k": 8, "shared_experts": 8, "expert_ffn": 2**20,
             "hidden": 2**17, "heads": 8}, ["MLP weight", "hidden x dense_ffn = 131072 x 16777216"]),
])
def test_a_tensor_the_importer_would_refuse_is_refused_before_building(family: str, settings: dict,
                                                                        words: list[str]) -> None:
    with pytest.raises(ConfigError) as info:
        resolve_settings(family, settings)
    message = str(info.value)
    assert message.startswith(f"{family}: ") and "the model importer accepts" in message, message
    for word in words:
        assert word in message, message


def test_dlrm_tables_the_importer_would_refuse(tmp_path: Path) -> None:
    huge = tables_file(tmp_path, [{"name": "ids", "rows": 10**12, "dim": 64}])
    with pytest.raises(ConfigError, match=r"table 'ids' \(rows x dim = 1000000000000 x 64\)"):
        resolve_settings("dlrm", {"tables": huge, "bottom_mlp": "64"})
    wide = tables_file(tmp_path, [{"name": f"t{i}", "rows": 10, "dim": 65536} for i in range(20)])
    with pytest.raises(ConfigError, match=r"a weight on the cat interaction's output"):
        resolve_settings("dlrm", {"tables": wide, "interaction": "cat", "top_mlp": "1000000,1"})
    many = tables_file(tmp_path, [{"name": f"t{i}", "rows": 10, "dim": 4} for i in range(5800)])
    with pytest.raises(ConfigError, match=r"interaction 'dot' over 5800 tables .* set interaction=cat"):
        resolve_settings("dlrm", {"tables": many, "bottom_mlp": "4", "interaction": "dot"})


# ------------------------------------------------------------------------------ what must still work
@pytest.mark.parametrize("family,settings", [
    ("gpt", {"layers": 96, "hidden": 12288, "heads": 96, "vocab": 51200, "seq_len": 2048}),  # GPT-3 175B
    ("gpt", {"layers": 128, "hidden": 25600, "heads": 160, "vocab": 51200, "seq_len": 2048}),  # GPT 1T
    ("llama", {"layers": 126, "hidden": 16384, "heads": 128, "kv_heads": 8, "ffn": 53248, "vocab": 128256,
               "seq_len": 131072}),  # Llama 3 405B, long context
    ("llama", {"layers": 80, "hidden": 8192, "heads": 64, "kv_heads": 8, "ffn": 28672, "vocab": 128256,
               "seq_len": 1 << 20}),  # Llama 3 70B dimensions at a 1M-token sequence
    ("moe", {"layers": 61, "hidden": 7168, "heads": 128, "vocab": 129280, "attention": "mla", "experts": 256,
             "top_k": 8, "shared_experts": 1, "expert_ffn": 2048, "dense_layers": 3, "dense_ffn": 18432,
             "router": "sigmoid", "seq_len": 4096}),  # DeepSeek-V3
    ("moe", {}),  # Mixtral 8x7B
    ("gpt", {"layers": 1024, "hidden": 131072, "heads": 1024, "vocab": 2**22, "ffn": 2**20, "seq_len": 2**19}),
])
def test_published_and_benchmark_sizes_are_accepted(family: str, settings: dict) -> None:
    resolve_settings(family, settings)


@pytest.mark.parametrize("family", ["gpt", "llama", "bert"])
def test_a_transformer_at_the_maxima_imports(family: str) -> None:
    # 16 heads x (2**22)**2 scores is the largest the importer takes at the longest sequence
    settings = {"layers": 1, "hidden": 2**17, "heads": 16, "vocab": 2**22, "seq_len": 2**22, "ffn": 2**20,
                "dropout": 0.9}
    graph = import_model_proto(build(family, settings), {"batch": 1}, name=family)
    assert graph.params > 2**17 * 2**22


def test_mla_at_the_maxima_imports() -> None:
    settings = {"layers": 1, "attention": "mla", "heads": 1024, "hidden": 2**17, "q_lora_rank": 2**17,
                "kv_lora_rank": 2**17, "qk_rope_head_dim": 4096, "qk_nope_head_dim": 4096, "v_head_dim": 4096,
                "seq_len": 2**19, "experts": 4096, "top_k": 1, "expert_ffn": 2048, "vocab": 2**22}
    graph = import_model_proto(build("moe", settings), {"batch": 1}, name="mla")
    assert graph.params > 0


# ------------------------------------------------------------------------------------------ the CLI
@pytest.mark.parametrize("setting,words", [
    ("layers=100000", "gpt: key 'layers' = '100000' is invalid; expected an integer >= 1 and <= 1024"),
    ("seq_len=99999999999", "gpt: key 'seq_len' = '99999999999' is invalid; expected an integer >= 1 and "
                            "<= 4194304"),
    ("dropout=nan", "gpt: key 'dropout' = 'nan' is invalid; expected a number >= 0 and <= 0.9"),
])
def test_models_build_refuses_at_once(tmp_path: Path, setting: str, words: str, capsys) -> None:
    out = tmp_path / "gpt.onnx"
    assert main(["models", "build", "gpt", "--set", setting, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.strip().splitlines()[-1] == f"planner: error: {words}", err
    assert not out.exists()


def test_models_build_says_what_it_wrote(tmp_path: Path, capsys) -> None:
    out = tmp_path / "gpt.onnx"
    assert main(["models", "build", "gpt", "--set", "layers=2", "--out", str(out)]) == 0
    line = capsys.readouterr().out.strip()
    assert out.exists() and line.startswith(f"wrote {out}: gpt, ") and "parameters declared" in line
