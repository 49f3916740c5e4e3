"""Real torch.onnx exports (tests/fixtures/exports, made by make_exports.py) go through the importer.

Each fixture's JSON holds an independent count made from the model's config (not from the graph):
``analytic_matmul_flops_per_sample`` (every matrix product and convolution, 2 FLOPs per multiply-add) and
``params`` (torch's parameter count, tied weights once). The importer's matrix-product FLOPs (ops with a
``gemm``) must be within 1% of the analytic count (plus the bias additions a Gemm may fuse), its total forward FLOPs at least that and at most 25%
above (element-wise work), its parameters within 0.5%, and its layers must show the model's blocks.

``KNOWN_GRAPH_GAPS`` lists what the importer does not yet get right on these exports, each as a strict
xfail with the reason (see docs/graph-import.md): when the importer is fixed the test passes, the strict
xfail turns that into a failure, and the entry must be removed.
"""

from __future__ import annotations

import glob
import json
import os

import pytest

from planner.graph import load_model

HERE = os.path.join(os.path.dirname(__file__), "fixtures", "exports")
FIXTURES = sorted(os.path.basename(p)[: -len(".onnx")] for p in glob.glob(os.path.join(HERE, "*.onnx")))

# model -> (allowed numbers of "block" layers, kind of the first layer or None, kind of the last layer)
STRUCTURE = {
    "gpt2": ({2}, "embedding", "head"),
    "bert": ({2}, "embedding", "head"),
    "llama": ({2}, "embedding", "head"),
    "t5": ({4}, "embedding", "head"),  # 2 encoder + 2 decoder blocks
    "vit": ({2}, None, "head"),
    "resnet18": ({4, 5, 8, 9}, None, "head"),  # its 4 stages or 8 basic blocks, the stem a unit or not
    "dlrm": (None, None, None),  # checked through its embedding tables instead
}

KNOWN_GRAPH_GAPS: dict[tuple[str, str], str] = {}  # none left; add (fixture, aspect): reason for a new gap


def _cases(aspect: str, fixtures: list[str]) -> list:
    """The fixtures as parameters, each known gap marked as a strict xfail (it runs, and must fail)."""
    return [pytest.param(f, marks=pytest.mark.xfail(strict=True, reason=KNOWN_GRAPH_GAPS[(f, aspect)]))
            if (f, aspect) in KNOWN_GRAPH_GAPS else f for f in fixtures]


def _record(fixture: str) -> dict:
    with open(os.path.join(HERE, f"{fixture}.json"), encoding="utf-8") as handle:
        return json.load(handle)


_LOADED: dict[str, object] = {}


def _load(fixture: str):
    if fixture not in _LOADED:
        _LOADED[fixture] = load_model(os.path.join(HERE, f"{fixture}.onnx"), dims=_record(fixture)["dims"])
    return _LOADED[fixture]


def test_fixtures_are_there_and_small():
    models = {name.split(".")[0] for name in FIXTURES}
    assert models == set(STRUCTURE), "run tests/fixtures/exports/make_exports.py"
    with open(os.path.join(HERE, "failures.json"), encoding="utf-8") as handle:
        failed = json.load(handle)
    for model in STRUCTURE:  # both exporters, unless the failure is on record
        for exporter in ("torchscript", "dynamo"):
            assert f"{model}.{exporter}" in FIXTURES or f"{model}.{exporter}" in failed
    sizes = [os.path.getsize(os.path.join(HERE, f"{name}.onnx")) for name in FIXTURES]
    assert max(sizes) < 1_000_000 and sum(sizes) < 10_000_000


@pytest.mark.parametrize("fixture", FIXTURES)
def test_weights_carry_no_data(fixture):
    import onnx

    record = _record(fixture)
    model = onnx.load(os.path.join(HERE, f"{fixture}.onnx"), load_external_data=False)
    if record["exporter"] == "torchscript":
        inputs = {i.name for i in model.graph.input}
        assert set(record["weight_inputs"]) <= inputs and record["weight_inputs"]
    else:
        declared = {t.name for t in model.graph.initializer if t.data_location == onnx.TensorProto.EXTERNAL}
        assert declared == set(record["external_weights"]) and declared


@pytest.mark.parametrize("fixture", _cases("flops", FIXTURES))
def test_matmul_flops_match_the_analytic_count(fixture):
    graph = _load(fixture)
    analytic = _record(fixture)["analytic_matmul_flops_per_sample"]
    fused_bias = _record(fixture)["analytic_bias_adds_per_sample"]  # a Gemm/Conv may count its bias add
    matmul = sum(op.flops for layer in graph.layers for op in layer.ops if op.gemm is not None)
    assert analytic * 0.99 <= matmul <= (analytic + fused_bias) * 1.01
    assert analytic * 0.99 <= graph.flops_forward <= analytic * 1.25


@pytest.mark.parametrize("fixture", _cases("params", FIXTURES))
def test_params_match_torch(fixture):
    assert _load(fixture).params == pytest.approx(_record(fixture)["params"], rel=0.005)


@pytest.mark.parametrize("fixture", _cases("layers", [f for f in FIXTURES if STRUCTURE[f.split(".")[0]][0]]))
def test_layers_show_the_blocks(fixture):
    blocks, first, last = STRUCTURE[fixture.split(".")[0]]
    kinds = [layer.kind for layer in _load(fixture).layers]
    assert kinds.count("block") in blocks, kinds
    if first:
        assert kinds[0] == first, kinds
    assert kinds[-1] == last, kinds


@pytest.mark.parametrize("fixture", _cases("tables", [f for f in FIXTURES if f.startswith("dlrm.")]))
def test_dlrm_tables_are_found(fixture):
    expected = {(t["rows"], t["dim"], float(t["pooling_factor"])) for t in _record(fixture)["config"]["tables"]}
    found = {(t.rows, t.dim, float(t.pooling_factor)) for t in _load(fixture).embedding_tables}
    assert found == expected
    assert "embedding" in [layer.kind for layer in _load(fixture).layers]
