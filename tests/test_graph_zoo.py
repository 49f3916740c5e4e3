"""Every light model-zoo graph shipped inside the onnx package imports, and its FLOPs and parameters match
an independent count.

The independent count walks the raw ONNX proto with its own shape arithmetic for Conv, Gemm and pooling
(the floor/ceil output-size formula) and counts multiply-adds (2 FLOPs each); the importer's Conv and Gemm
FLOPs must match it up to their bias adds (< 1%), and its total up to element-wise work (< 6%). For ResNet-50, VGG-19 and
AlexNet the totals are also checked against analytic counts written out from the architectures.
"""

from __future__ import annotations

import math
from pathlib import Path

import onnx
import pytest
from onnx import numpy_helper

from planner.graph import load_model

LIGHT = Path(onnx.__file__).parent / "backend" / "test" / "data" / "light"
ZOO = sorted(LIGHT.glob("*.onnx"))


def test_the_zoo_is_there():
    assert len(ZOO) >= 9, f"expected the light model zoo under {LIGHT}"


def _independent_macs(path: Path) -> tuple[float, int]:
    """(multiply-adds of Conv and Gemm, parameter count) by walking the proto with independent shape code."""
    model = onnx.load(str(path), load_external_data=False)
    g = model.graph
    init = {t.name: numpy_helper.to_array(t) for t in g.initializer}
    shapes: dict[str, tuple[int, ...]] = {}
    for vi in g.input:
        dims = tuple(d.dim_value for d in vi.type.tensor_type.shape.dim)
        if dims and all(dims):
            shapes[vi.name] = dims
    for name, arr in init.items():
        shapes[name] = arr.shape
    weights: dict[str, tuple[int, ...]] = {}
    macs = 0.0
    for node in g.node:
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
        op = node.op_type
        ins = [shapes.get(t) for t in node.input]
        if op == "ConstantOfShape":
            shape = tuple(int(x) for x in init[node.input[0]])
            shapes[node.output[0]] = shape
            weights[node.output[0]] = shape
            continue
        x = ins[0]
        if op in ("Conv", "MaxPool", "AveragePool"):
            kernel = attrs.get("kernel_shape") or list(ins[1][2:])
            strides = attrs.get("strides", [1] * len(kernel))
            pads = attrs.get("pads", [0] * 2 * len(kernel))
            rnd = math.ceil if attrs.get("ceil_mode", 0) else math.floor
            spatial = [rnd((x[2 + i] + pads[i] + pads[i + len(kernel)] - kernel[i]) / strides[i]) + 1
                       for i in range(len(kernel))]
            channels = ins[1][0] if op == "Conv" else x[1]
            out = (x[0], channels, *spatial)
            if op == "Conv":
                w = ins[1]
                macs += math.prod(out) * w[1] * math.prod(w[2:])
        elif op == "Gemm":
            b = ins[1]
            n = b[0] if attrs.get("transB", 0) else b[1]
            k = x[0] if attrs.get("transA", 0) else x[1]
            m = x[1] if attrs.get("transA", 0) else x[0]
            out = (m, n)
            macs += m * n * k
        elif op in ("GlobalAveragePool",):
            out = (x[0], x[1], 1, 1)
        elif op == "Concat":
            axis = attrs["axis"]
            out = tuple(sum(s[axis] for s in ins) if i == axis else d for i, d in enumerate(x))
        elif op == "Reshape":
            target = [int(v) for v in init[node.input[1]]] if node.input[1] in init else None
            if target is None:
                out = None
            else:
                target = [x[i] if v == 0 else v for i, v in enumerate(target)]
                if -1 in target:
                    known = math.prod(v for v in target if v != -1)
                    target[target.index(-1)] = math.prod(x) // known
                out = tuple(target)
        elif op == "Transpose":
            out = tuple(x[p] for p in attrs["perm"])
        elif op == "Unsqueeze":
            out = x  # only used on parameters in these graphs
        else:  # element-wise: Relu, BatchNormalization, Sum, Add, Mul, LRN, Dropout, Softmax
            out = max((s for s in ins if s is not None), key=len)
        for o in node.output[:1]:
            shapes[o] = out
    # parameters: weights, minus BatchNorm running statistics
    stats = {t for node in g.node if node.op_type == "BatchNormalization" for t in node.input[3:5]}
    params = sum(math.prod(s) for name, s in weights.items() if name not in stats and math.prod(s) > 1)
    params += sum(a.size for name, a in init.items() if name not in stats and a.dtype.kind == "f" and a.size > 1)
    return macs, params


@pytest.mark.parametrize("path", ZOO, ids=[p.stem for p in ZOO])
def test_zoo_graph_imports_with_independent_flops_and_params(path):
    graph = load_model(path)
    macs, params = _independent_macs(path)
    products = _products(graph)
    assert products == pytest.approx(2 * macs, rel=0.01)  # the rest: bias adds, one per output element
    assert products >= 2 * macs
    assert graph.flops_forward == pytest.approx(2 * macs, rel=0.06)  # element-wise work on top
    assert graph.params == params
    assert len(graph.layers) >= 2
    assert sum(layer.flops_forward for layer in graph.layers) == pytest.approx(graph.flops_forward)
    assert all(layer.activation_bytes > 0 and layer.output_bytes > 0 for layer in graph.layers)
    assert graph.warnings == ()


def _products(graph) -> float:
    return sum(op.flops for layer in graph.layers for op in layer.ops if op.op_type in ("Conv", "Gemm"))


def _conv_macs(cin: int, cout: int, k: int, out_hw: int) -> int:
    return cin * cout * k * k * out_hw * out_hw


def test_resnet50_against_the_architecture():
    """ResNet-50 on 224x224 (He et al. 2016, Table 1): stem 7x7/2 to 112x112, then bottlenecks
    [3, 4, 6, 3] with widths 64..512 (x4 out) at 56, 28, 14, 7; this Caffe2 model strides in the 3x3 conv
    (so a stage's first 1x1 conv runs at the previous resolution); FC 2048 -> 1000. Known totals:
    25,557,032 parameters, 4.1 G multiply-adds."""
    macs = _conv_macs(3, 64, 7, 112)
    cin = 64
    for width, blocks, hw in ((64, 3, 56), (128, 4, 28), (256, 6, 14), (512, 3, 7)):
        for b in range(blocks):
            first_hw = 2 * hw if b == 0 and width > 64 else hw
            macs += (_conv_macs(cin, width, 1, first_hw) + _conv_macs(width, width, 3, hw)
                     + _conv_macs(width, 4 * width, 1, hw))
            if b == 0:
                macs += _conv_macs(cin, 4 * width, 1, hw)
            cin = 4 * width
    macs += 2048 * 1000
    graph = load_model(LIGHT / "light_resnet50.onnx")
    assert graph.params == 25_557_032
    assert macs == pytest.approx(4.1e9, rel=0.01)
    assert _products(graph) == pytest.approx(2 * macs, rel=0.01)
    assert graph.flops_forward == pytest.approx(2 * macs, rel=0.08)


def test_vgg19_against_the_architecture():
    """VGG-19 (Simonyan & Zisserman 2015, config E): 3x3 convs [64x2, 128x2, 256x4, 512x4, 512x4] at
    224, 112, 56, 28, 14; FC 25088-4096-4096-1000. Known: 143,667,240 parameters, 19.6 G multiply-adds."""
    macs = 0
    cin = 3
    for cout, n, hw in ((64, 2, 224), (128, 2, 112), (256, 4, 56), (512, 4, 28), (512, 4, 14)):
        for _ in range(n):
            macs += _conv_macs(cin, cout, 3, hw)
            cin = cout
    macs += 25088 * 4096 + 4096 * 4096 + 4096 * 1000
    graph = load_model(LIGHT / "light_vgg19.onnx")
    assert graph.params == 143_667_240
    assert macs == pytest.approx(19.6e9, rel=0.01)
    assert _products(graph) == pytest.approx(2 * macs, rel=0.005)
    assert graph.flops_forward == pytest.approx(2 * macs, rel=0.01)


def test_alexnet_parameters():
    """BVLC AlexNet (grouped conv2/4/5): 60,965,224 parameters (Caffe model zoo)."""
    assert load_model(LIGHT / "light_bvlc_alexnet.onnx").params == 60_965_224


def test_zoo_layers_follow_data_flow():
    graph = load_model(LIGHT / "light_resnet50.onnx")
    # stem, 16 bottleneck blocks, head: cut points after every residual block
    assert len(graph.layers) == 18
    assert graph.layers[-1].kind == "head"
    assert [layer.index for layer in graph.layers] == list(range(len(graph.layers)))
    for a, b in zip(graph.layers, graph.layers[1:]):
        assert a.output_bytes == b.input_bytes
