"""Stage ONNX files reproduce the whole model: real PyTorch exports (GPT-2 and BERT from transformers, a
ResNet-style CNN, a DLRM; tests/fixtures/split/make_exports.py), split into 2-3 stages, run with onnxruntime
on seeded random inputs and random weights fed as inputs. Tolerance 1e-4 (max abs)."""

from __future__ import annotations

import json
import os
import re

import numpy as np
import onnx
import pytest

from planner.cli import main
from planner.errors import PlannerError
from planner.export.stage_files import manifest, stage_node_names, write_split
from planner.export.stages import BOUNDARY, INPUT, WEIGHT, split_model
from planner.export.verify import max_abs_difference, random_feeds, run_model, run_stages
from planner.types import Layer, LayerGraph, OpCost

import plan_samples

FIXTURES = os.path.join(os.path.dirname(__file__), "fixtures", "split")
DIMS = {"batch": 2, "seq": 8}
# stage -> regular expression over the exporter's node names (its module scopes)
CASES = {
    "gpt2": ([r"^/body/(wte|wpe|Add$|drop)|/body/h\.0/", r"/body/h\.1/", r"/body/h\.2/|/body/ln_f"],
             {"input_ids": 64, "attention_mask": 2}),
    "bert": ([r"/embeddings/|/layer\.0/", r"/layer\.1/", r"/layer\.2/|/pooler/"], {"input_ids": 64, "attention_mask": 2}),
    "cnn": ([r"/stem/|/layer1/", r"/layer2/", r"/layer3/|/head/"], {}),
    "dlrm": ([r"/bottom/", r"/top/"], {"sparse": 20}),
}


def load(name: str) -> onnx.ModelProto:
    return onnx.load(os.path.join(FIXTURES, f"{name}.onnx"), load_external_data=False)


def node_groups(model: onnx.ModelProto, patterns: list[str]) -> list[set[str]]:
    groups: list[set[str]] = [set() for _ in patterns]
    for node in model.graph.node:
        for stage, pattern in enumerate(patterns):
            if re.search(pattern, node.name):
                groups[stage].add(node.name)
                break
    return groups


@pytest.mark.parametrize("name", sorted(CASES))
def test_stages_reproduce_the_model(name):
    model = load(name)
    patterns, int_high = CASES[name]
    stages = split_model(model, node_groups(model, patterns))
    assert len(stages) == len(patterns)
    feeds = random_feeds(model, DIMS, seed=1, int_high=int_high)
    outputs = run_model(model, feeds)
    assert all(np.isfinite(v).all() and np.abs(v).max() > 0 for v in outputs.values())
    assert max_abs_difference(model, stages, feeds) <= 1e-4
    # every stage after the first gets boundary tensors; weights stay inputs (no data copied)
    weights = {i.name for i in model.graph.input} - set(feeds) | {
        i.name for i in model.graph.input if "weight" in i.name or "bias" in i.name}
    for stage in stages[1:]:
        assert any(i.kind == BOUNDARY for i in stage.inputs)
    for stage in stages:
        for tensor in stage.model.graph.initializer:
            assert tensor.name not in weights
        assert all(i.name in weights or i.kind != WEIGHT for i in stage.inputs)
    used = [i.name for s in stages for i in s.inputs if i.kind == WEIGHT]
    assert len(used) == len(set(used))  # each weight in exactly one stage here (no tied weights)


def test_gpt2_mask_is_handed_on_to_every_later_stage():
    model = load("gpt2")
    stages = split_model(model, node_groups(model, CASES["gpt2"][0]))
    # the attention mask (or what the first stage made of it) reaches the blocks of stages 1 and 2
    for stage in stages[1:]:
        kinds = {i.kind for i in stage.inputs}
        assert BOUNDARY in kinds
        assert len([i for i in stage.inputs if i.kind == BOUNDARY]) >= 2  # hidden state + mask
    names = {i.name for s in stages for i in s.inputs if i.kind == INPUT}
    assert "input_ids" in names


def test_a_wrong_boundary_value_is_detected():
    """The comparison can fail: corrupting one boundary tensor changes the outputs."""
    model = load("cnn")
    stages = split_model(model, node_groups(model, CASES["cnn"][0]))
    feeds = random_feeds(model, DIMS, seed=1)
    values = run_stages(stages[:1], feeds)
    boundary = next(i.name for i in stages[1].inputs if i.kind == BOUNDARY)
    values[boundary] = values[boundary] + 0.5
    corrupted = run_stages(stages[1:], values)
    expected = run_model(model, feeds)
    assert np.abs(corrupted["logits"] - expected["logits"]).max() > 1e-3


def test_layers_out_of_graph_order_are_refused():
    model = load("cnn")
    groups = node_groups(model, CASES["cnn"][0])
    with pytest.raises(PlannerError, match="not in graph order"):
        split_model(model, [groups[1], groups[0], groups[2]])


def test_a_node_reading_a_later_stage_moves_there():
    """A node the layers put too early (here: layer2's first conv put in stage 0) follows its input."""
    model = load("cnn")
    groups = node_groups(model, CASES["cnn"][0])
    early = "/layer3/conv1/Conv"  # reads layer2's output, made in stage 1
    groups[2].discard(early)
    groups[0].add(early)
    stages = split_model(model, groups)
    assert any(n.name == early for n in stages[1].model.graph.node)
    assert max_abs_difference(model, stages, random_feeds(model, DIMS, seed=1)) <= 1e-4


def test_a_node_in_two_stages_is_refused():
    model = load("cnn")
    groups = node_groups(model, CASES["cnn"][0])
    groups[1].add(next(iter(groups[0])))
    with pytest.raises(PlannerError, match="placed in stages 0 and 1"):
        split_model(model, groups)


def _layer_graph(model: onnx.ModelProto, patterns: list[str]) -> LayerGraph:
    layers = []
    for index, group in enumerate(node_groups(model, patterns)):
        ops = tuple(OpCost(name=n, op_type="X", flops=0.0, bytes_read=0.0, bytes_written=0.0) for n in sorted(group))
        layers.append(Layer(index=index, name=f"unit{index}", kind="block", params=0, flops_forward=0.0,
                            activation_bytes=0.0, output_bytes=0.0, ops=ops))
    return LayerGraph(name="cnn", layers=tuple(layers))


def test_plan_stages_map_to_layers_and_files(tmp_path):
    model = load("cnn")
    patterns = [r"/stem/", r"/layer1/", r"/layer2/", r"/layer3/", r"/head/"]
    layers = _layer_graph(model, patterns)
    names = [layer.name for layer in layers.layers]
    kinds = ["block"] * 5
    plan = plan_samples.gpt_plan()
    with pytest.raises(PlannerError, match="made for model 'gpt-test' of 350,000,000 parameters, but 'cnn' has 0"):
        stage_node_names(plan, layers)  # a plan of another model, whatever its layer names
    plan = plan.__class__(**{**plan.__dict__, "model": {**plan.model, "params": layers.params},
                             "stages": plan_samples.stages_from_split([2, 3], names, kinds, 1, 1, 1)})
    groups = stage_node_names(plan, layers)
    stages = split_model(model, groups)
    assert max_abs_difference(model, stages, random_feeds(model, DIMS, seed=2)) <= 1e-4
    out = tmp_path / "split"
    document = manifest("cnn.onnx", plan, stages)
    write_split(str(out), document, stages, force=False)
    assert sorted(os.listdir(out)) == ["manifest.json", "stage_0.onnx", "stage_1.onnx"]
    saved = json.loads((out / "manifest.json").read_text())
    assert saved["stages"][1]["layer_names"] == ["unit2", "unit3", "unit4"]
    assert saved["stages"][1]["devices"] == list(plan.stages[1].devices)
    assert {i["kind"] for i in saved["stages"][1]["inputs"]} == {BOUNDARY, INPUT}  # weights are graph inputs here
    reloaded = onnx.load(str(out / "stage_1.onnx"))
    onnx.checker.check_model(reloaded)
    with pytest.raises(PlannerError, match="already exists"):
        write_split(str(out), document, stages, force=False)
    write_split(str(out), document, stages, force=True)
    # a plan for another model
    wrong = plan.__class__(**{**plan.__dict__, "stages": plan_samples.stages_from_split(
        [2, 3], ["a", "b", "c", "d", "e"], kinds, 1, 1, 1)})
    with pytest.raises(PlannerError, match="made for another model"):
        stage_node_names(wrong, layers)
    short = plan.__class__(**{**plan.__dict__, "stages": plan_samples.stages_from_split([2, 2], names, kinds, 1, 1, 1)})
    with pytest.raises(PlannerError, match="the model has 5 layers"):
        stage_node_names(short, layers)


def test_stage_files_are_deterministic():
    model = load("bert")
    a = [s.model.SerializeToString() for s in split_model(model, node_groups(model, CASES["bert"][0]))]
    b = [s.model.SerializeToString() for s in split_model(model, node_groups(model, CASES["bert"][0]))]
    assert a == b


def test_split_cli_missing_model_is_exit_2(tmp_path, capsys):
    plan = tmp_path / "plan.json"
    plan.write_text(plan_samples.gpt_plan().to_json())
    assert main(["split", str(tmp_path / "none.onnx"), "--plan", str(plan), "--out-dir", str(tmp_path / "o")]) == 2
    assert capsys.readouterr().err.startswith("planner: error:")
    assert not (tmp_path / "o").exists()


def test_split_cli_names_the_plan_file_a_plan_of_another_model_came_from(tmp_path, capsys):
    plan = tmp_path / "plan.json"
    plan.write_text(plan_samples.gpt_plan().to_json())
    model = os.path.join(FIXTURES, "cnn.onnx")
    assert main(["split", model, "--plan", str(plan), "--out-dir", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"planner: error: {plan}: made for model 'gpt-test'")
    assert not (tmp_path / "o").exists()


# ----------------------------------------------------------------- end to end: load_model -> Plan -> split

def plan_over(graph: LayerGraph, counts: list[int]):
    """A hand-made Plan splitting the model's layers into consecutive stages of ``counts`` layers."""
    names = [layer.name for layer in graph.layers]
    kinds = [layer.kind for layer in graph.layers]
    base = plan_samples.gpt_plan()
    stages = plan_samples.stages_from_split(counts, names, kinds, 1, 1, 1)
    return base.__class__(**{**base.__dict__, "stages": stages, "model": {**base.model, "params": graph.params},
                             "num_micro_batches": base.global_batch // base.micro_batch})  # dp 1


EXPORTS = os.path.join(os.path.dirname(__file__), "fixtures", "exports")
EXPORT_NAMES = sorted(f[:-5] for f in os.listdir(EXPORTS) if f.endswith(".onnx"))
REQUIRED_FAMILIES = ("gpt2", "bert", "resnet18", "dlrm")  # issue #7: GPT-2, BERT, a CNN, DLRM


def _int_ranges(meta: dict) -> dict[str, int]:
    """Valid index ranges of an export's integer inputs, from its metadata (make_exports.py)."""
    config = meta["config"]
    ranges = {"token_type_ids": 2}
    if "vocab" in config:
        ranges.update(input_ids=config["vocab"], decoder_input_ids=config["vocab"])
    for table in config.get("tables", ()):
        ranges[f"{table['name']}_indices"] = table["rows"]
    return ranges


def _split_export(name: str):
    from planner.export.stage_files import split_plan
    from planner.export.verify import tolerance, weights_as_inputs
    from planner.graph import load_model
    from planner.graph.loader import read_model

    path = os.path.join(EXPORTS, f"{name}.onnx")
    with open(os.path.join(EXPORTS, f"{name}.json"), encoding="utf-8") as handle:
        meta = json.load(handle)
    graph = load_model(path, dims=meta["dims"])
    count = len(graph.layers)
    wanted = min(3, count)
    plan = plan_over(graph, [count // wanted + (1 if k < count % wanted else 0) for k in range(wanted)])
    model = read_model(path)
    stages = split_plan(model, plan, graph)
    whole = weights_as_inputs(model)
    feeds = random_feeds(whole, {**meta["dims"], "batch": 2}, seed=3, int_high=_int_ranges(meta))
    if "attention_mask" in feeds:  # attend everywhere: a fully masked row is NaN in some exports
        feeds["attention_mask"] = np.ones_like(feeds["attention_mask"])
    return stages, max_abs_difference(whole, stages, feeds), tolerance(whole, stages, feeds), whole, feeds


@pytest.mark.parametrize("name", EXPORT_NAMES)
def test_builders_exports_split_and_match(name):
    """Every real export (tests/fixtures/exports, made by the builders' make_exports.py) split into up to
    three stages over its detected layers reproduces the model to 1e-4 (all are fp32)."""
    stages, difference, allowed, whole, feeds = _split_export(name)
    assert allowed == 1e-4
    assert difference <= 1e-4, difference
    outputs = run_model(whole, feeds)
    assert all(np.isfinite(v).all() for v in outputs.values())
    floats = {onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16, onnx.TensorProto.DOUBLE}
    for stage in stages:  # no weight data in any stage file: only integer constants and float scalars copied
        for tensor in stage.model.graph.initializer:
            assert tensor.data_location != onnx.TensorProto.EXTERNAL
            assert tensor.data_type not in floats or int(np.prod(tensor.dims)) <= 1, tensor.name


@pytest.mark.parametrize("family", REQUIRED_FAMILIES)
def test_each_required_family_is_split_into_several_stages(family):
    """At least one exporter's file of each family is cut into two or more stages (so boundaries are real)."""
    best = max((len(_split_export(name)[0]), name) for name in EXPORT_NAMES if name.split(".")[0] == family)
    assert best[0] >= 2, best


def test_builder_fp16_bert_splits_within_fp16_rounding(tmp_path):
    from planner.builders import build, save
    from planner.export.stage_files import split_plan
    from planner.export.verify import rounding_effect, run_model, run_stages, tolerance, weights_as_inputs
    from planner.graph import load_model
    from planner.graph.loader import read_model

    path = str(tmp_path / "bert.onnx")
    save(build("bert", {"layers": 3, "hidden": 32, "heads": 4, "vocab": 64, "seq_len": 8, "dropout": 0}), path)
    graph = load_model(path, dims=DIMS)
    count = len(graph.layers)
    assert count >= 3
    plan = plan_over(graph, [1, count - 2, 1])
    model = read_model(path)
    stages = split_plan(model, plan, graph)
    whole = weights_as_inputs(model)
    feeds = random_feeds(whole, DIMS, seed=3, int_high={"input_ids": 64, "token_type_ids": 2, "attention_mask": 2})
    allowed = tolerance(whole, stages, feeds)
    # onnxruntime keeps consecutive fp16 ops in fp32 inside the whole model; the stage boundaries round
    assert 1e-4 < allowed < 0.05
    assert max_abs_difference(whole, stages, feeds) <= allowed
    # each boundary rounds once more: two boundaries allow more than one
    one = split_plan(model, plan_over(graph, [1, count - 1]), graph)
    assert tolerance(whole, one, feeds) < allowed
    # the allowance covers twice what moving every boundary element by a whole unit does (a rounding moves it
    # by half a unit at most), and a boundary wired to the wrong tensor is far outside it
    assert allowed >= 1e-4 + 2 * rounding_effect(stages, feeds) > 1e-4
    values = run_stages(stages[:1], feeds)
    boundary = next(o.name for o in stages[0].outputs if o.to_stages)
    values[boundary] = values[boundary][..., ::-1].copy()
    miswired = run_stages(stages[1:], values)
    expected = run_model(whole, feeds)
    assert max(float(np.abs(np.asarray(miswired[n], dtype=np.float64) - np.asarray(v, dtype=np.float64)).max())
               for n, v in expected.items()) > 10 * allowed


def test_split_command_writes_and_verifies(tmp_path, capsys):
    from planner.graph import load_model

    path = os.path.join(FIXTURES, "cnn.onnx")
    plan_path = tmp_path / "plan.json"
    graph = load_model(path, dims={"batch": 2})
    assert len(graph.layers) >= 3
    plan_path.write_text(plan_over(graph, [1, 1, len(graph.layers) - 2]).to_json())
    out = tmp_path / "stages"
    argv = ["split", path, "--plan", str(plan_path), "--out-dir", str(out), "--dim", "batch=2", "--verify", "--json"]
    assert main(argv) == 0
    document = json.loads(capsys.readouterr().out)
    assert document["verify"]["max_abs_difference"] <= 1e-4
    assert [s["file"] for s in document["stages"]] == ["stage_0.onnx", "stage_1.onnx", "stage_2.onnx"]
    assert sorted(os.listdir(out)) == ["manifest.json", "stage_0.onnx", "stage_1.onnx", "stage_2.onnx"]
    assert main(argv) == 2  # refuses to overwrite
    assert "--force" in capsys.readouterr().err
    assert main(argv + ["--force"]) == 0


@pytest.mark.parametrize("names", ["none", "all alike"])
def test_nodes_without_unique_names_split_and_verify(tmp_path, capsys, names):
    """ONNX node names are optional and need not be unique: the layers and the split then know a node by its
    type and first output."""
    from planner.graph import load_model

    model = load("cnn")
    for node in model.graph.node:
        node.name = "" if names == "none" else "same"
    path = str(tmp_path / "cnn.onnx")
    onnx.save(model, path)
    graph = load_model(path, dims={"batch": 2})
    plan_path = tmp_path / "plan.json"
    plan_path.write_text(plan_over(graph, [1, 1, len(graph.layers) - 2]).to_json())
    # onnxruntime refuses a graph with repeated node names, so only the unnamed model can be run
    verify = ["--verify"] if names == "none" else []
    argv = ["split", path, "--plan", str(plan_path), "--out-dir", str(tmp_path / "out"), "--dim", "batch=2",
            "--json", *verify]
    assert main(argv) == 0
    document = json.loads(capsys.readouterr().out)
    assert len(document["stages"]) == 3
    if verify:
        assert document["verify"]["max_abs_difference"] <= 1e-4


def test_searched_plan_of_a_builder_gpt_splits_and_verifies(tmp_path, capsys):
    """The whole chain: builder GPT (fp16, training-mode dropout) -> search pinned to 2 stages -> plan file ->
    `planner split --verify`. Dropout runs as the identity when verifying (see planner.export.verify)."""
    import planner
    from planner.builders import build, save

    path = str(tmp_path / "gpt.onnx")
    save(build("gpt", {"layers": 4, "hidden": 64, "heads": 4, "vocab": 500, "seq_len": 32}), path)
    model = planner.load_model(path, dims={"batch": 1, "seq": 32})
    best = planner.plan(model, planner.load_cluster("dgx-a100-80gb*1"), global_batch=64,
                        pinned=planner.ParallelConfig(global_batch=64, tp=1, pp=2, dp=0))
    assert len(best.stages) == 2
    plan_path = tmp_path / "plan.json"
    plan_path.write_text(best.to_json())
    # no --dim: the verification binds seq to the model's own default (32), as the import does
    argv = ["split", path, "--plan", str(plan_path), "--out-dir", str(tmp_path / "out"), "--verify", "--json"]
    assert main(argv) == 0
    verify = json.loads(capsys.readouterr().out)["verify"]
    assert verify["max_abs_difference"] <= verify["tolerance"] < 0.05


def test_split_verify_at_dims_the_model_cannot_take_is_one_error_line(tmp_path, capsys):
    import planner
    from planner.builders import build, save

    path = str(tmp_path / "gpt.onnx")
    save(build("gpt", {"layers": 2, "hidden": 64, "heads": 4, "vocab": 100, "seq_len": 32}), path)
    best = planner.plan(planner.load_model(path), planner.load_cluster("dgx-a100-80gb*1"), global_batch=8,
                        pinned=planner.ParallelConfig(global_batch=8, tp=1, pp=2, dp=0))
    plan_path = tmp_path / "plan.json"
    plan_path.write_text(best.to_json())
    out = tmp_path / "out"
    argv = ["split", path, "--plan", str(plan_path), "--out-dir", str(out), "--verify", "--dim", "seq=64"]
    assert main(argv) == 2  # 64 positions, a table of 32
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "does not run at the dims bound" in err[0] and "--dim" in err[0]
    assert not out.exists()


def test_the_bundled_fp16_gpt2_verifies_at_ordinary_sequence_lengths(tmp_path, capsys):
    """GPT-2 124M (fp16) split in two stages: the boundary's rounding, carried through the later
    blocks, moves its logits (about 60) by two units in the last place at seq 128, more than two roundings at
    the outputs' scale; the allowance measures how far the later stages carry a rounding."""
    import planner

    path = os.path.join(os.path.dirname(__file__), "..", "models", "gpt2-124m.onnx")
    model = planner.load_model(path)
    best = planner.plan(model, planner.load_cluster("t4*4"), global_batch=64,
                        pinned=planner.ParallelConfig(global_batch=64, tp=0, pp=2, dp=0))
    plan_path = tmp_path / "plan.json"
    plan_path.write_text(best.to_json())
    argv = ["split", path, "--plan", str(plan_path), "--out-dir", str(tmp_path / "out"), "--verify", "--json",
            "--dim", "seq=128"]
    assert main(argv) == 0
    verify = json.loads(capsys.readouterr().out)["verify"]
    assert 0.03 < verify["max_abs_difference"] <= verify["tolerance"] < 1.0


def test_split_verify_refuses_external_data_onnxruntime_would_read_from_the_current_directory(
        tmp_path, monkeypatch, capsys):
    """A Constant whose value is external data inside the model's folder passes the loader; onnxruntime, handed
    the model as bytes, would read its location from the current directory, so the check refuses it."""
    import planner
    from planner.builders import build, save

    model = build("gpt", {"layers": 2, "hidden": 64, "heads": 4, "vocab": 100, "seq_len": 32})
    constant = next(n for n in model.graph.node if n.name == "/layers.0/attn/Constant_2").attribute[0].t
    constant.ClearField("raw_data")
    constant.data_location = onnx.TensorProto.EXTERNAL
    constant.external_data.add(key="location", value="secret.bin")
    (tmp_path / "model").mkdir()
    (tmp_path / "cwd").mkdir()
    path = str(tmp_path / "model" / "gpt.onnx")
    save(model, path)
    best = planner.plan(planner.load_model(path), planner.load_cluster("dgx-a100-80gb*1"), global_batch=8,
                        pinned=planner.ParallelConfig(global_batch=8, tp=1, pp=2, dp=0))
    plan_path = tmp_path / "plan.json"
    plan_path.write_text(best.to_json())
    (tmp_path / "cwd" / "secret.bin").write_bytes(b"\x00\x3c")  # fp16 1.0, what onnxruntime would have read
    monkeypatch.chdir(tmp_path / "cwd")
    out = tmp_path / "out"
    assert main(["split", path, "--plan", str(plan_path), "--out-dir", str(out), "--verify"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "'/layers.0/attn/Constant_2' (Constant)" in err[0] and "'secret.bin'" in err[0], err
    assert not out.exists()
