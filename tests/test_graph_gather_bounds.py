"""Lookups past the end of a table at the dims the user bound (planner.graph.gather_bounds): a learned
position table shorter than the sequence is reported as a warning, from shapes and index arithmetic alone."""

from __future__ import annotations

import os

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from planner.builders import build
from planner.graph import fold, import_model_proto, load_model
from planner.graph.ir import Node

EXPORTS = os.path.join(os.path.dirname(__file__), "fixtures", "exports")


def _overruns(model) -> list[str]:
    return [w for w in model.warnings if "reads row" in w]


@pytest.mark.parametrize("seq, warned", [(1024, False), (1000, False), (1025, True), (8192, True)])
def test_a_sequence_longer_than_the_position_table_is_reported(seq, warned):
    """GPT-2's 1,024 learned positions: seq 1,025 reads row 1,024, which does not exist; 8,192 is past the
    4,096 elements the folding evaluates, so the range's last value is worked out, not listed."""
    proto = build("gpt", {"layers": 1, "hidden": 64, "heads": 2, "vocab": 128, "seq_len": 1024})
    model = import_model_proto(proto, {"batch": 1, "seq": seq}, name="gpt-1024")
    found = _overruns(model)
    assert bool(found) == warned
    if warned:
        assert f"reads row {seq - 1} of 'embed.position.weight', which has 1024 rows" in found[0]


@pytest.mark.parametrize("exporter", ["dynamo", "torchscript"])
def test_real_gpt2_exports_are_reported_past_their_positions(exporter):
    """The Hugging Face GPT-2 exports (256 positions) compute their position ids with Shape, Range and
    Unsqueeze, which shape inference had already folded into Constants; past 256 tokens each is reported."""
    path = os.path.join(EXPORTS, f"gpt2.{exporter}.onnx")
    assert not _overruns(load_model(path, {"batch": 1, "seq": 256}))
    assert "reads row 299 of" in _overruns(load_model(path, {"batch": 1, "seq": 300}))[0]


def test_folding_reads_a_node_as_the_constant_it_became():
    """After ``fold.inject`` turns Shape(start=1, end=2) into a Constant, a second evaluation reads the
    Constant (its value and no inputs), not the Shape's attributes of the node it was."""
    x = helper.make_tensor_value_info("x", TensorProto.INT64, [3, 7])
    graph = helper.make_graph([helper.make_node("Shape", ["x"], ["s"], start=1, end=2),
                               helper.make_node("Squeeze", ["s"], ["n"])], "g", [x], [])
    proto = helper.make_model(graph)
    nodes = [Node(index=i, name=n.name, op_type=n.op_type, domain=n.domain, inputs=tuple(n.input),
                  outputs=tuple(n.output), proto=n) for i, n in enumerate(proto.graph.node)]
    const, shapes = {"s", "n"}, {"x": (3, 7)}
    first = fold.evaluate(nodes, const, shapes, {})
    assert first["n"].tolist() == 7
    assert fold.inject(nodes, first) == 2
    again = fold.evaluate(nodes, const, {}, {})  # no shapes needed: the Constants hold the values
    assert again["s"].tolist() == [7] and again["n"].tolist() == 7
    onnx.checker.check_model(proto)
    assert np.asarray(again["n"]).dtype == np.int64
