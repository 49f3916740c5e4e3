"""`planner estimate`: bad configurations exit 2 with one line naming the constraint and the nearest valid
values; --json is complete and deterministic."""

import json

import pytest

from planner.builders import build, save
from planner.cli import main


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("models") / "gpt.onnx"
    save(build("gpt", {"layers": 4, "hidden": 768, "heads": 12, "vocab": 50257, "seq_len": 1024}), str(path))
    return str(path)


def run(capsys, *argv):
    code = main(["estimate", *argv])
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.mark.parametrize("flags,needles", [
    (["--tp", "8", "--pp", "1", "--dp", "1"], ["tp=8 does not divide", "12 attention heads", "nearest valid tp: 4"]),
    (["--tp", "16", "--pp", "1", "--dp", "1"], ["tp=16 is larger than a node", "8 devices", "nearest valid tp: 4"]),
    (["--tp", "1", "--pp", "5", "--dp", "1"], ["pp=5 is larger than the model's 4 layers", "nearest valid pp: 4"]),
    (["--tp", "2", "--pp", "2", "--dp", "2", "--micro-batch", "3"],
     ["global batch 64 is not divisible by dp x micro-batch = 2 x 3 = 6", "nearest valid global batch: 60 or 66",
      "nearest valid micro-batch: 2 or 4"]),
    (["--tp", "2", "--pp", "2", "--dp", "4"], ["= 16 devices, but the cluster has 8", "nearest valid dp: 2"]),
])
def test_bad_configurations_exit_2_with_one_line(capsys, model_path, flags, needles):
    cluster = "dgx-a100-80gb*2" if "--dp" in flags and flags[flags.index("--dp") + 1] != "4" else "dgx-a100-80gb*1"
    code, out, err = run(capsys, model_path, "--cluster", cluster, "--global-batch", "64", *flags)
    assert code == 2 and out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("planner: error: ")
    for needle in needles:
        assert needle in lines[0]


def test_json_document_is_complete_and_deterministic(capsys, model_path):
    argv = [model_path, "--cluster", "dgx-a100-80gb*2", "--global-batch", "64", "--tp", "2", "--pp", "2",
            "--dp", "4", "--json"]
    code, first, _ = run(capsys, *argv)
    assert code == 0
    _, second, _ = run(capsys, *argv)
    assert first == second
    doc = json.loads(first)
    for key in ("iteration_time_s", "throughput_samples_per_s", "feasible", "memory_per_device_bytes", "config",
                "breakdown", "stages"):
        assert key in doc
    assert all(doc["config"][k] is not None for k in ("micro_batch", "vpp", "zero", "recompute",
                                                     "sequence_parallel", "schedule"))
    assert sum(doc["breakdown"].values()) == pytest.approx(doc["iteration_time_s"])
    assert len(doc["stages"]) == 2 and doc["stages"][0]["devices"] == list(range(8))


def test_json_byte_counts_are_whole_bytes(capsys, model_path):
    """Memory byte counts are integers in the JSON (rounded up), not the cost model's fractional sums."""
    code, out, _ = run(capsys, model_path, "--cluster", "dgx-a100-80gb*2", "--global-batch", "64", "--tp", "2",
                       "--pp", "2", "--dp", "4", "--json")
    doc = json.loads(out)
    counts = [doc["memory_per_device_bytes"]]
    for stage in doc["stages"]:
        counts += [stage["memory_capacity_bytes"], *stage["memory"].values()]
    assert code == 0 and len(counts) == 15
    assert all(type(count) is int for count in counts), counts


def test_table_output(capsys, model_path):
    code, out, _ = run(capsys, model_path, "--cluster", "dgx-h100*1", "--global-batch", "16", "--tp", "2",
                       "--pp", "1", "--dp", "4", "--recompute", "full")
    assert code == 0 and "iteration" in out and "recompute=full" in out
    assert " parameters, on 8 of the cluster's 8 devices" in out.splitlines()[0]  # tp 2 x dp 4


def test_table_says_how_many_devices_and_parameters(capsys, tmp_path):
    path = tmp_path / "small.onnx"
    save(build("gpt", {"layers": 2, "hidden": 64, "heads": 2, "vocab": 128, "seq_len": 64}), str(path))
    code, out, _ = run(capsys, str(path), "--cluster", "dgx-h100*2", "--global-batch", "16", "--tp", "1", "--pp", "1",
                       "--dp", "4")
    assert code == 0 and out.splitlines()[0] == "model small: 112.4K parameters, on 4 of the cluster's 16 devices"


def test_a_bound_batch_axis_warns_that_it_is_not_the_micro_batch(capsys, caplog, model_path):
    """--dim batch=4 shapes the import only; the warning names the flag that pins the micro-batch, and goes
    when it is pinned."""
    flags = [model_path, "--cluster", "dgx-a100-80gb*1", "--global-batch", "64", "--tp", "1", "--pp", "1", "--dp", "8",
             "--dim", "batch=4"]
    with caplog.at_level("WARNING"):
        assert run(capsys, *flags)[0] == 0
    assert "--dim batch=4 binds the model's batch axis" in caplog.text and "--micro-batch 4" in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING"):
        assert run(capsys, *flags, "--micro-batch", "4")[0] == 0
    assert "batch axis" not in caplog.text



def test_table_times_are_in_units_that_show_them(capsys, tmp_path):
    # a small model's parts are microseconds: printed in seconds to 4 places they read "optimizer 0.0000 s"
    path = tmp_path / "small.onnx"
    save(build("gpt", {"layers": 2, "hidden": 64, "heads": 2, "vocab": 128, "seq_len": 64}), str(path))
    flags = [str(path), "--cluster", "dgx-h100*1", "--global-batch", "16", "--tp", "1", "--pp", "1", "--dp", "4"]
    code, out, _ = run(capsys, *flags, "--json")
    parts = {key[:-2]: value for key, value in json.loads(out)["breakdown"].items() if value}
    code, out, _ = run(capsys, *flags)
    line = next(line for line in out.splitlines() if line.startswith("breakdown: "))
    printed = dict(item.split(" ", 1) for item in line[len("breakdown: "):].split(", "))
    assert code == 0 and printed.keys() == parts.keys() and min(parts.values()) < 5e-5
    assert all(float(text.split()[0]) > 0 for text in printed.values()), line
