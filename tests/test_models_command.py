"""``planner models list|build`` on the command line."""

from __future__ import annotations

import json
import os

import onnx

from planner.cli import main


def one_error_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("planner: error:"), err
    return err[0]


def test_list_json_names_families_keys_and_defaults(capsys):
    assert main(["models", "list", "--json"]) == 0
    first = capsys.readouterr().out
    document = json.loads(first)
    families = {f["name"]: {k["name"]: k for k in f["keys"]} for f in document["families"]}
    assert set(families) >= {"gpt", "llama", "bert", "dlrm"}
    assert families["gpt"]["ffn"]["default"] == "4*hidden"
    assert families["gpt"]["layers"]["default"] == "12"
    assert families["dlrm"]["tables"]["required"] is True
    assert main(["models", "list", "--json"]) == 0
    assert capsys.readouterr().out == first  # deterministic


def test_list_table(capsys):
    assert main(["models", "list"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("gpt:") and "kv_heads" in out and "dlrm:" in out


def test_build_writes_only_the_file(tmp_path, capsys):
    out = tmp_path / "g.onnx"
    code = main(["models", "build", "gpt", "--set", "layers=2", "--set", "hidden=128", "--set", "heads=4",
                 "--set", "seq_len=64", "--out", str(out)])
    assert code == 0, capsys.readouterr().err
    assert os.listdir(tmp_path) == ["g.onnx"]
    model = onnx.load(str(out), load_external_data=False)
    meta = {p.key: p.value for p in model.metadata_props}
    assert json.loads(meta["planner.config"])["layers"] == 2
    locations = {e.value for t in model.graph.initializer for e in t.external_data if e.key == "location"}
    assert locations == {"g.weights"}


def test_build_refuses_a_missing_folder(tmp_path, capsys):
    assert main(["models", "build", "gpt", "--out", str(tmp_path / "no" / "g.onnx")]) == 2
    assert "does not exist" in one_error_line(capsys)
    assert os.listdir(tmp_path) == []


def test_build_bad_key_is_one_line_exit_2(tmp_path, capsys):
    assert main(["models", "build", "llama", "--set", "layer=2", "--out", str(tmp_path / "l.onnx")]) == 2
    line = one_error_line(capsys)
    assert "'layer'" in line and "valid keys" in line
    assert os.listdir(tmp_path) == []


def test_build_bad_set_syntax_and_suffix(tmp_path, capsys):
    assert main(["models", "build", "gpt", "--set", "layers", "--out", str(tmp_path / "g.onnx")]) == 2
    assert "KEY=VALUE" in one_error_line(capsys)
    assert main(["models", "build", "gpt", "--out", str(tmp_path / "g.txt")]) == 2
    assert ".onnx" in one_error_line(capsys)


def test_build_dlrm_from_a_tables_file(tmp_path, capsys):
    tables = tmp_path / "t.json"
    tables.write_text(json.dumps({"tables": [{"name": "a", "rows": 1000, "dim": 16, "pooling_factor": 2}]}))
    out = tmp_path / "d.onnx"
    assert main(["models", "build", "dlrm", "--set", f"tables={tables}", "--set", "bottom_mlp=32,16",
                 "--out", str(out)]) == 0, capsys.readouterr().err
    model = onnx.load(str(out), load_external_data=False)
    assert any(t.name == "embed.a.weight" and list(t.dims) == [1000, 16] for t in model.graph.initializer)


def test_build_unwritable_path_is_one_line_exit_2(tmp_path, capsys, monkeypatch):
    target = tmp_path / "taken.onnx"
    target.mkdir()  # a folder where the file should go
    assert main(["models", "build", "gpt", "--out", str(target)]) == 2
    assert "is a folder" in one_error_line(capsys)

    def refuse(path, binary=False):
        raise PermissionError(13, "Permission denied", str(path))

    monkeypatch.setattr("planner.outputs.atomic_open", refuse)  # as a read-only folder would (tests run as root)
    assert main(["models", "build", "gpt", "--out", str(tmp_path / "g.onnx")]) == 2
    assert "cannot write it (Permission denied)" in one_error_line(capsys)
