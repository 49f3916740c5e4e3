"""`planner inspect`: the table, the JSON document, and every kind of bad input (exit 2, one line that
names the problem, no traceback, nothing read outside the model's folder)."""

from __future__ import annotations

import json
import random
import subprocess
import sys
import textwrap
from pathlib import Path

import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper as h

from planner.cli import main
from tests._graph_util import gpt_params, tiny_gpt

LIGHT = Path(onnx.__file__).parent / "backend" / "test" / "data" / "light"


def _run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def _one_line_error(err: str, *needles: str) -> None:
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("planner: error: ") and "Traceback" not in err
    for needle in needles:
        assert needle in lines[0], lines[0]


@pytest.fixture
def gpt_file(tmp_path) -> Path:
    path = tmp_path / "gpt.onnx"
    onnx.save(tiny_gpt(2, 64, 4, 16, 1000, symbolic_seq=True), str(path))
    return path


def test_json_document(capsys, gpt_file):
    code, out, _ = _run(capsys, "inspect", str(gpt_file), "--dim", "seq=16", "--dim", "batch=8", "--json")
    assert code == 0
    doc = json.loads(out)
    assert doc["params"] == gpt_params(2, 64, 16, 1000)
    assert [layer["name"] for layer in doc["layers"]] == ["embedding", "transformer.h.0", "transformer.h.1", "head"]
    for layer in doc["layers"]:
        assert {"name", "params", "flops_forward", "activation_bytes"} <= set(layer)
        # byte counts are whole bytes, written as integers as the plan and estimate JSON write them
        assert all(type(layer[key]) is int for key in ("activation_bytes", "output_bytes", "input_bytes"))
    assert type(doc["activation_bytes"]) is int
    assert doc["embedding_tables"][0] | {} == {**doc["embedding_tables"][0], "name": "wte.weight", "rows": 1000,
                                               "dim": 64}
    assert doc["batch"] == 8 and doc["dims"] == {"batch": 8, "seq": 16}
    assert doc["flops_forward"] == pytest.approx(8 * doc["flops_forward_per_sample"])
    assert doc["flops_forward"] == pytest.approx(sum(layer["flops_forward"] for layer in doc["layers"]))
    # deterministic: byte-identical on a second run
    assert _run(capsys, "inspect", str(gpt_file), "--dim", "seq=16", "--dim", "batch=8", "--json")[1] == out


def test_table(capsys):
    code, out, _ = _run(capsys, "inspect", str(LIGHT / "light_vgg19.onnx"))
    assert code == 0
    assert "parameters 143,667,240" in out and "39.3 GFLOP" in out and "head" in out


def test_missing_file(capsys, tmp_path):
    code, _, err = _run(capsys, "inspect", str(tmp_path / "nope.onnx"))
    assert code == 2
    _one_line_error(err, "nope.onnx", "no such file")


def test_a_tables_file_given_as_the_model_is_named(capsys):
    code, _, err = _run(capsys, "inspect", str(Path(__file__).parents[1] / "models" / "criteo-tables.json"))
    assert code == 2
    _one_line_error(err, "criteo-tables.json", "not a readable ONNX model (JSON that onnx cannot parse)")
    assert "--tables FILE" in err and "ModelProto" not in err


def test_not_onnx(capsys, tmp_path):
    path = tmp_path / "notes.onnx"
    path.write_text("these are not the bytes you are looking for\n" * 10)
    code, _, err = _run(capsys, "inspect", str(path))
    assert code == 2
    _one_line_error(err, "notes.onnx", "not")


def test_empty_file(capsys, tmp_path):
    path = tmp_path / "empty.onnx"
    path.write_bytes(b"")
    code, _, err = _run(capsys, "inspect", str(path))
    assert code == 2
    _one_line_error(err, "empty.onnx", "not an ONNX model")


def test_truncated(capsys, tmp_path):
    data = (LIGHT / "light_resnet50.onnx").read_bytes()
    path = tmp_path / "cut.onnx"
    path.write_bytes(data[: len(data) // 2])
    code, _, err = _run(capsys, "inspect", str(path))
    assert code == 2
    _one_line_error(err, "cut.onnx", "truncated or corrupted")


def test_bit_flips_never_crash(capsys, tmp_path):
    """Flip one bit at 60 seeded places: either the model still imports (exit 0) or exit 2 with one line;
    never a traceback. Flipping the wire type of the first field always breaks the file."""
    data = bytearray((LIGHT / "light_squeezenet.onnx").read_bytes())
    rng = random.Random(0)
    path = tmp_path / "flip.onnx"
    codes = []
    for k in range(60):
        flipped = bytearray(data)
        pos = 0 if k == 0 else rng.randrange(len(data))
        flipped[pos] ^= 0x07 if k == 0 else 1 << rng.randrange(8)
        path.write_bytes(bytes(flipped))
        code, _, err = _run(capsys, "inspect", str(path), "--json")
        assert code in (0, 2), (pos, err)
        if code == 2:
            _one_line_error(err, "flip.onnx")
        codes.append(code)
    assert codes[0] == 2 and codes.count(2) >= 5


def test_cycle(capsys, tmp_path):
    a = h.make_node("Relu", ["x"], ["a"], name="first")
    b = h.make_node("Add", ["a", "c"], ["b"], name="loop_add")
    c = h.make_node("Relu", ["b"], ["c"], name="third")
    graph = h.make_graph([a, b, c], "g", [h.make_tensor_value_info("x", T.FLOAT, [1, 4])],
                         [h.make_tensor_value_info("c", T.FLOAT, [1, 4])])
    path = tmp_path / "cycle.onnx"
    onnx.save(h.make_model(graph), str(path))
    code, _, err = _run(capsys, "inspect", str(path))
    assert code == 2
    _one_line_error(err, "cycle.onnx", "cycle", "loop_add")


def test_unbound_symbolic_dim(capsys, gpt_file):
    code, _, err = _run(capsys, "inspect", str(gpt_file))
    assert code == 2
    _one_line_error(err, "'seq'", "input_ids", "--dim seq=INT")


def test_bad_dim_flag(capsys, gpt_file):
    code, _, err = _run(capsys, "inspect", str(gpt_file), "--dim", "seq=lots")
    assert code == 2
    _one_line_error(err, "--dim")


def _external(tmp_path: Path, location: str) -> Path:
    folder = tmp_path / "model"
    folder.mkdir(exist_ok=True)
    w = onnx.TensorProto(name="w", data_type=T.FLOAT, dims=[4, 4], data_location=T.EXTERNAL)
    w.external_data.add(key="location", value=location)
    graph = h.make_graph([h.make_node("MatMul", ["x", "w"], ["y"])], "g",
                         [h.make_tensor_value_info("x", T.FLOAT, ["batch", 4])],
                         [h.make_tensor_value_info("y", T.FLOAT, ["batch", 4])], [w])
    path = folder / "m.onnx"
    onnx.save(h.make_model(graph), str(path))
    return path


@pytest.mark.parametrize("location", ["../secret.bin", "/etc/passwd", "sub/../../secret.bin"])
def test_external_data_outside_the_folder(capsys, tmp_path, location):
    (tmp_path / "secret.bin").write_bytes(b"\0" * 64)
    path = _external(tmp_path, location)
    code, _, err = _run(capsys, "inspect", str(path))
    assert code == 2
    _one_line_error(err, "m.onnx", "'w'", "external data", location)


_AUDIT = textwrap.dedent("""
    import sys
    opened = []
    sys.addaudithook(lambda event, args: opened.append(str(args[0])) if event == "open" else None)
    from planner.cli import main
    code = main(sys.argv[1:])
    sys.stderr.write("\\nOPENED " + repr(opened) + "\\n")
    sys.exit(code)
""")


@pytest.mark.parametrize("location", ["weights.bin", "../secret.bin"])
def test_nothing_is_read_outside_the_model(tmp_path, location):
    """An audit hook records every file the CLI opens: the model file, never its external data (inside the
    folder or not), never anything else in or around the model's folder."""
    (tmp_path / "secret.bin").write_bytes(b"\0" * 64)
    path = _external(tmp_path, location)
    (path.parent / "weights.bin").write_bytes(b"\0" * 64)
    run = subprocess.run([sys.executable, "-c", _AUDIT, "inspect", str(path), "--json"], capture_output=True,
                         text=True, cwd=Path(__file__).resolve().parent.parent)
    opened = eval(run.stderr.rsplit("OPENED ", 1)[1])  # noqa: S307 - our own repr of a list of str
    near = [p for p in opened if str(tmp_path) in p]
    assert near == [str(path)]
    if location == "weights.bin":
        assert run.returncode == 0 and json.loads(run.stdout)["params"] == 16
    else:
        assert run.returncode == 2 and "Traceback" not in run.stderr


def test_a_dim_the_model_does_not_have_is_an_error(capsys):
    # a misspelt --dim would otherwise leave the real dimension at its default, silently
    model = Path(__file__).resolve().parents[1] / "models" / "gpt2-124m.onnx"
    assert main(["inspect", str(model), "--dim", "sequence=512"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no symbolic dimension 'sequence'" in err[0] and "did you mean seq" in err[0]
