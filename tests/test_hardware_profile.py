"""`planner profile`: a quick real measurement, its file works in a cluster, its op table is right."""

from __future__ import annotations

import json
import os
import sys

import numpy as np
import onnx
import pytest
import yaml
from onnx import TensorProto, helper, numpy_helper

from planner.cli import main
from planner.errors import ModelError
from planner.hardware import catalog, load_cluster
from planner.hardware.onnx_ops import bind_inputs, node_costs
from planner.hardware.profiler import KernelCosts, fit_profile, predict_op_s, runnable


def tiny_model(with_weights: bool = True) -> onnx.ModelProto:
    w = numpy_helper.from_array(np.ones((16, 32), np.float32), "w")
    if not with_weights:  # as `planner models build` writes them: shape, no data (here: external, never read)
        w = TensorProto(name="w", dims=[16, 32], data_type=TensorProto.FLOAT,
                        data_location=TensorProto.EXTERNAL)
        w.external_data.add(key="location", value="weights.bin")
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]),
             helper.make_node("Relu", ["h"], ["r"]),
             helper.make_node("Softmax", ["r"], ["y"], axis=-1)]
    graph = helper.make_graph(nodes, "tiny", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 32])], initializer=[w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def test_op_costs_of_a_tiny_graph():
    bound, defaulted = bind_inputs(tiny_model(), {"batch": 4})
    assert defaulted == []
    costs = node_costs(bound)
    assert [c.op_class for c in costs] == ["gemm", "elementwise", "softmax"]
    assert costs[0].gemm == (4, 32, 16)
    assert costs[0].flops == 2 * 4 * 32 * 16
    assert costs[0].bytes == (4 * 16 + 16 * 32 + 4 * 32) * 4
    assert costs[1].flops == 4 * 32 and costs[1].bytes == 2 * 4 * 32 * 4
    assert bind_inputs(tiny_model(), {})[1] == ["batch"]


def test_runnable_fills_missing_weights_only():
    model = runnable(bind_inputs(tiny_model(with_weights=False), {"batch": 2})[0])
    weights = numpy_helper.to_array(model.graph.initializer[0])
    assert weights.shape == (16, 32) and np.any(weights != 0)
    kept = runnable(tiny_model())
    assert np.all(numpy_helper.to_array(kept.graph.initializer[0]) == 1.0)
    assert all(node.name for node in kept.graph.node)


def test_quick_profile_writes_a_usable_device_file(tmp_path, capsys):
    onnx.save(tiny_model(with_weights=False), tmp_path / "tiny.onnx")
    out = tmp_path / "me.yaml"
    assert main(["profile", "--quick", "--threads", "1", "--clock", "cpu", "--out", str(out),
                 "--model", str(tmp_path / "tiny.onnx"), "--dim", "batch=8", "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["device"] == "local-cpu"
    doc = yaml.safe_load(out.read_text())
    assert set(doc["sources"]) >= {"peak_flops_per_s", "gemm_efficiency", "memory_bandwidth_Bps", "op_overhead_s"}
    assert [op["op_type"] for op in doc["measured"]["model_ops"]] == ["MatMul", "Relu", "Softmax"]
    assert all(op["seconds"] > 0 for op in doc["measured"]["model_ops"])
    kernel = KernelCosts.from_file(out)
    assert kernel.graph_output_s >= 0 and kernel.row_s > 0 and kernel.pool_elements_per_s > 1e6
    profile = catalog.load_device_file(out)
    assert profile.peak_flops_per_s["fp32"] > 1e9
    assert all(0 < f <= 1 for _, f in profile.gemm_efficiency)
    (tmp_path / "c.yaml").write_text(f"groups:\n  - node: {{device_file: {out.name}, devices_per_node: 1, "
                                     "inter_node_bandwidth_GBps: 1.25}\n    count: 2\n")
    cluster = load_cluster(tmp_path / "c.yaml")
    assert cluster.groups[0].node.device.name == "local-cpu" and cluster.num_devices == 2


def test_fit_profile_from_synthetic_measurements():
    # a device doing 100 GFLOP/s on big GEMMs and 50 on small ones, 10 GB/s memory
    gemms = [{"m": n, "n": n, "k": n, "flops": 2.0 * n ** 3, "seconds": 2.0 * n ** 3 / (100e9 if n >= 512 else 50e9)}
             for n in (64, 128, 512, 1024)]
    adds = [{"bytes": b, "seconds": b / 10e9} for b in (1e4, 1e6, 1e8)]
    doc = fit_profile("synthetic-cpu", gemms, adds, 1e-6, 2 ** 30, "test")
    assert doc["peak_flops_per_s"]["fp32"] == pytest.approx(100e9)
    assert doc["gemm_efficiency"][0][1] == pytest.approx(0.5) and doc["gemm_efficiency"][-1][1] == pytest.approx(1.0)
    assert doc["memory_bandwidth_Bps"] == pytest.approx(10e9)


def test_predict_op_uses_the_right_curve(tmp_path):
    profile = catalog.get_device("a100-80gb")
    costs = node_costs(bind_inputs(tiny_model(), {"batch": 4096})[0])
    gemm, relu, _ = (predict_op_s(profile, c) for c in costs)
    assert gemm > 0 and relu > 0


def view_and_softmax_costs():
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [256, 10])
    shape = numpy_helper.from_array(np.array([2560], np.int64), "shape")
    nodes = [helper.make_node("Reshape", ["x", "shape"], ["flat"], name="reshape"),
             helper.make_node("Softmax", ["x"], ["y"], name="softmax", axis=-1)]
    graph = helper.make_graph(nodes, "g", [x], [helper.make_tensor_value_info("y", TensorProto.FLOAT, [256, 10]),
                                                helper.make_tensor_value_info("flat", TensorProto.FLOAT, [2560])],
                              initializer=[shape])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    return node_costs(model)


def test_view_ops_cost_dispatch_in_a_model_and_a_copy_alone():
    reshape, softmax = view_and_softmax_costs()
    assert reshape.bytes == 0 and reshape.view_bytes == 2 * 2560 * 4 and reshape.outputs == 1
    assert softmax.rows == 256
    profile = catalog.get_device("a100-80gb")
    costs = KernelCosts(graph_output_s=4e-7, row_s=1e-8)
    in_model = predict_op_s(profile, reshape, costs=costs)
    assert in_model == pytest.approx(profile.op_overhead_s)
    alone = predict_op_s(profile, reshape, costs=costs, alone=True)
    copy_s = alone - in_model - costs.graph_output_s
    assert 2 * 2560 * 4 / profile.memory_bandwidth_Bps <= copy_s + 1e-15
    # each reduced row pays row_s, inside a model and alone
    without_rows = predict_op_s(profile, softmax)
    assert predict_op_s(profile, softmax, costs=costs) == pytest.approx(without_rows + 256 * 1e-8)


def test_pooling_reads_windows_at_the_measured_rate():
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 8, 8])
    node = helper.make_node("MaxPool", ["x"], ["y"], name="pool", kernel_shape=[2, 2], strides=[2, 2])
    graph = helper.make_graph([node], "g", [x], [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 4, 4])])
    (pool,) = node_costs(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    profile = catalog.get_device("a100-80gb")
    slow = KernelCosts(pool_elements_per_s=1e6)
    assert predict_op_s(profile, pool, costs=slow) == pytest.approx(pool.flops / 1e6 + profile.op_overhead_s)
    assert predict_op_s(profile, pool, costs=KernelCosts(pool_elements_per_s=1e30)) == predict_op_s(profile, pool)


def test_kernel_costs_read_from_a_profile_file(tmp_path):
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump({"name": "x", "measured": {"kernel_costs": {"graph_output_s": 4e-7,
                                                                               "row_s": 1e-8}}}))
    assert KernelCosts.from_file(path) == KernelCosts(graph_output_s=4e-7, row_s=1e-8)
    path.write_text(yaml.safe_dump({"name": "x"}))
    assert KernelCosts.from_file(path) == KernelCosts()


def test_profile_without_onnxruntime_says_what_to_install(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "onnxruntime", None)
    assert main(["profile", "--out", str(tmp_path / "p.yaml")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "pip install 'planner[profile]'" in err
    assert not (tmp_path / "p.yaml").exists()


@pytest.mark.parametrize("argv, message", [
    (["--out", "p.txt"], "write a .yaml or .yml file"),
    (["--out", "missing-dir/p.yaml"], "does not exist"),
    (["--out", "p.yaml", "--clock", "cpu"], "--threads 1"),
    (["--out", "p.yaml", "--model", "absent.onnx"], "no such file"),
    (["--out", "p.yaml", "--dim", "seq=128"], "--dim binds the dimensions of --model, and no --model was given"),
    (["--out", "p.yaml", "--name", "a100-80gb"], "the catalog has a device of that name"),
    (["--out", "p.yaml", "--name", "My CPU"], "use lower-case letters"),
    (["--out", "p.yaml", "--name", ""], "use lower-case letters"),
    (["--out", "p.yaml", "--threads", "100000"], "logical cores"),
])
def test_profile_bad_arguments(argv, message, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["profile", *argv]) == 2
    assert message in capsys.readouterr().err


def test_profile_model_onnxruntime_cannot_run_is_exit_2(tmp_path, capsys):
    node = helper.make_node("Frobnicate", ["x"], ["y"], domain="com.example")
    graph = helper.make_graph([node], "bad", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.example", 1)])
    onnx.save(model, tmp_path / "bad.onnx")
    from planner.hardware import profiler
    from planner.errors import ModelError
    with pytest.raises(ModelError, match="onnxruntime cannot run this model"):
        profiler.measure_model(profiler.Runner("cpu", 1, "cpu"), model, {})


def test_wall_clock_model_times_come_from_the_onnxruntime_profiler(tmp_path):
    from planner.hardware import profiler
    model = tiny_model()
    measured = profiler.measure_model(profiler.Runner("cpu"), model, {"batch": 64})
    assert set(measured.kernel_s) == {c.name for c in measured.costs}
    assert measured.end_to_end_s > 0 and all(t >= 0 for t in measured.kernel_s.values())


def test_prepare_a_builder_gpt_without_weights(tmp_path):
    """`planner models build` graphs carry no weights and shapes that only a run reveals (Range)."""
    from planner.hardware import profiler
    out = tmp_path / "gpt.onnx"
    assert main(["models", "build", "gpt", "--set", "layers=1", "--set", "hidden=64", "--set", "heads=2",
                 "--set", "vocab=100", "--set", "seq_len=16", "--out", str(out)]) == 0
    runner = profiler.Runner("cpu", 1, "cpu")
    prepared = profiler.prepare_model(runner, profiler.load_model_file(out), {"batch": 2})
    assert len(prepared.costs) == len(prepared.model.graph.node)
    gemms = [c for c in prepared.costs if c.op_class == "gemm"]
    assert gemms and all(c.flops > 0 and c.gemm for c in gemms)
    assert any(not np.issubdtype(numpy_helper.to_array(t).dtype, np.floating) for t in prepared.constants.values())


def test_ops_timed_alone_keep_the_models_opset():
    """A node timed alone runs at its model's opset: Gelu exists only from opset 20, which `planner models
    build` writes."""
    pytest.importorskip("onnxruntime")
    from planner.hardware import profiler
    nodes = [helper.make_node("Gelu", ["x"], ["g"]), helper.make_node("Relu", ["g"], ["y"])]
    graph = helper.make_graph(nodes, "gelu", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 64])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 64])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)])
    model.ir_version = 9
    runner = profiler.Runner("cpu", 1, "cpu")
    prepared = profiler.prepare_model(runner, model, {"batch": 4})
    times = profiler.isolated_node_times_s(runner, prepared.model, prepared.constants)
    assert set(times) == {n.name for n in prepared.model.graph.node}
    assert all(t > 0 for t in times.values())


def _external(tensor: TensorProto, location: str) -> TensorProto:
    """``tensor`` with its value moved to external data at ``location`` (a file never written)."""
    tensor.ClearField("raw_data")
    del tensor.float_data[:]
    tensor.data_location = TensorProto.EXTERNAL
    tensor.external_data.add(key="location", value=location)
    return tensor


def external_constant_model(location: str, loop: bool = True) -> onnx.ModelProto:
    """tiny_model plus y + c, where c is a Constant whose value is external data at ``location``, and (with
    ``loop``) a Loop whose body adds an external-data initializer at the same location."""
    model = tiny_model()
    value = _external(numpy_helper.from_array(np.zeros(32, np.float32), "c"), location)
    body_weight = _external(numpy_helper.from_array(np.zeros(32, np.float32), "bw"), location)
    body = helper.make_graph([helper.make_node("Identity", ["cond"], ["cond_out"]),
                              helper.make_node("Add", ["z", "bw"], ["s"])], "body",
                             [helper.make_tensor_value_info("i", TensorProto.INT64, []),
                              helper.make_tensor_value_info("cond", TensorProto.BOOL, [])],
                             [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
                              helper.make_tensor_value_info("s", TensorProto.FLOAT, ["batch", 32])], [body_weight])
    model.graph.node.extend([helper.make_node("Constant", [], ["c"], value=value),
                             helper.make_node("Add", ["y", "c"], ["z"])])
    del model.graph.output[:]
    if not loop:
        model.graph.output.append(helper.make_tensor_value_info("z", TensorProto.FLOAT, ["batch", 32]))
        return model
    model.graph.node.append(helper.make_node("Loop", ["n", "go"], ["looped"], body=body))
    model.graph.initializer.extend([numpy_helper.from_array(np.array(1, np.int64), "n"),
                                    numpy_helper.from_array(np.array(True), "go")])
    model.graph.output.append(helper.make_tensor_value_info("looped", TensorProto.FLOAT, [1, "batch", 32]))
    return model


def test_runnable_leaves_no_external_data_for_onnxruntime_to_resolve():
    """onnxruntime, handed a model as bytes, reads a relative external-data location from the current
    directory: runnable fills every external tensor, Constant values and subgraphs included."""
    from planner.graph.loader import model_tensors
    model = runnable(external_constant_model("secret.bin"))
    assert not any(t.tensor.data_location == TensorProto.EXTERNAL for t in model_tensors(model))
    constant = numpy_helper.to_array(next(n for n in model.graph.node if n.op_type == "Constant").attribute[0].t)
    assert constant.shape == (32,) and np.any(constant != 0)
    integer = external_constant_model("secret.bin")
    integer.graph.node[3].attribute[0].t.data_type = TensorProto.INT64
    with pytest.raises(ModelError, match=r"the 'value' attribute of node 'Constant_3' \(Constant\).*not floating"):
        runnable(integer)


def test_profile_model_never_reads_external_data_from_the_current_directory(tmp_path, monkeypatch):
    pytest.importorskip("onnxruntime")
    from planner.hardware import profiler
    (tmp_path / "model").mkdir()
    (tmp_path / "cwd").mkdir()
    onnx.save(external_constant_model("secret.bin", loop=False), tmp_path / "model" / "m.onnx")
    (tmp_path / "cwd" / "secret.bin").write_bytes(b"abc")  # too short: onnxruntime would fail on reading it
    monkeypatch.chdir(tmp_path / "cwd")
    prepared = profiler.prepare_model(profiler.Runner("cpu", 1, "cpu"),
                                      profiler.load_model_file(tmp_path / "model" / "m.onnx"), {"batch": 2})
    assert [c.op_type for c in prepared.costs] == ["MatMul", "Relu", "Softmax", "Constant", "Add"]


@pytest.mark.parametrize("make, message", [
    (lambda d: onnx.save(external_constant_model("/etc/secret.bin"), d / "m.onnx"), "at absolute path"),
    (lambda d: onnx.save(external_constant_model("../secret.bin"), d / "m.onnx"), "outside the model's folder"),
    (lambda d: os.mkfifo(d / "m.onnx"), "not a regular file"),
    (lambda d: (d / "m.onnx").write_bytes(b""), "not an ONNX model"),
], ids=["absolute-location", "escaping-location", "named-pipe", "empty-file"])
def test_profile_model_is_read_as_every_command_reads_one(make, message, tmp_path, monkeypatch, capsys):
    """Refused before onnxruntime is needed (it is absent here), in one line, without hanging on a pipe."""
    monkeypatch.setitem(sys.modules, "onnxruntime", None)
    make(tmp_path)
    assert main(["profile", "--out", str(tmp_path / "p.yaml"), "--model", str(tmp_path / "m.onnx")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and err.startswith("planner: error: ") and message in err, err
    assert not (tmp_path / "p.yaml").exists()
