"""split_model on seeded random DAGs (element-wise ops, MatMuls, skip connections, constants, several
outputs): any node-to-stage labelling gives stages that reproduce the graph exactly, or a PlannerError."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from planner.errors import PlannerError
from planner.export.stages import split_model
from planner.export.verify import max_abs_difference, random_feeds

WIDTH = 4


def random_graph(seed: int) -> onnx.ModelProto:
    rng = np.random.default_rng(seed)
    tensors = ["x"]
    nodes, inputs, initializers = [], [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", WIDTH])], []
    for k in range(int(rng.integers(6, 16))):
        kind = str(rng.choice(["Add", "Mul", "Relu", "MatMul", "Scale", "Tanh"]))
        a = tensors[int(rng.integers(max(0, len(tensors) - 4), len(tensors)))]  # recent tensor
        b = tensors[int(rng.integers(0, len(tensors)))]  # any earlier tensor: skip connections
        out = f"t{k}"
        if kind in ("Add", "Mul"):
            nodes.append(helper.make_node(kind, [a, b], [out], name=f"n{k}"))
        elif kind in ("Relu", "Tanh"):
            nodes.append(helper.make_node(kind, [a], [out], name=f"n{k}"))
        elif kind == "MatMul":  # a weight as a graph input
            inputs.append(helper.make_tensor_value_info(f"w{k}", TensorProto.FLOAT, [WIDTH, WIDTH]))
            nodes.append(helper.make_node("MatMul", [a, f"w{k}"], [out], name=f"n{k}"))
        else:  # a scalar constant: an initializer and a Constant node
            initializers.append(numpy_helper.from_array(np.array(0.5, dtype=np.float32), f"s{k}"))
            nodes.append(helper.make_node("Constant", [], [f"c{k}"], name=f"const{k}",
                                          value=numpy_helper.from_array(np.array(2.0, dtype=np.float32))))
            nodes.append(helper.make_node("Mul", [a, f"s{k}"], [f"m{k}"], name=f"n{k}a"))
            nodes.append(helper.make_node("Add", [f"m{k}", f"c{k}"], [out], name=f"n{k}"))
        tensors.append(out)
    read = {t for node in nodes for t in node.input}
    outputs = sorted({t for t in tensors[1:] if t not in read} | {tensors[len(tensors) // 2]})  # nothing dead
    graph = helper.make_graph(nodes, f"random{seed}", inputs,
                              [helper.make_tensor_value_info(t, TensorProto.FLOAT, ["batch", WIDTH]) for t in outputs],
                              initializer=initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


@pytest.mark.parametrize("seed", range(40))
def test_ordered_cuts_reproduce_the_graph(seed):
    model = random_graph(seed)
    rng = np.random.default_rng(1000 + seed)
    names = [n.name for n in model.graph.node if n.op_type != "Constant"]
    stages = int(rng.integers(2, 5))
    cuts = sorted(rng.choice(np.arange(1, len(names)), size=min(stages - 1, len(names) - 1), replace=False))
    groups = [set(part) for part in np.split(np.array(names), cuts)]
    result = split_model(model, groups)
    feeds = random_feeds(model, {"batch": 3}, seed=seed)
    assert max_abs_difference(model, result, feeds) == 0.0


@pytest.mark.parametrize("seed", range(40))
def test_any_labelling_is_exact_or_refused(seed):
    model = random_graph(seed)
    rng = np.random.default_rng(2000 + seed)
    stages = 3
    groups: list[set[str]] = [set() for _ in range(stages)]
    for node in model.graph.node:
        groups[int(rng.integers(0, stages))].add(node.name)
    try:
        result = split_model(model, groups)
    except PlannerError as exc:
        assert "graph order" in str(exc) or "makes nothing" in str(exc)
        return
    feeds = random_feeds(model, {"batch": 3}, seed=seed)
    assert max_abs_difference(model, result, feeds) == 0.0
