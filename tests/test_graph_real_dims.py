"""Transformer dimensions and the Megatron split on the real torch.onnx exports (tests/fixtures/exports):
the importer must read hidden, heads, kv_heads, ffn and the sequence length of every block from shapes,
as the model configs recorded beside each fixture give them."""

from __future__ import annotations

import json
import os

import pytest

from planner.graph import load_model

HERE = os.path.join(os.path.dirname(__file__), "fixtures", "exports")
TRANSFORMERS = sorted(f[:-len(".onnx")] for f in os.listdir(HERE)
                      if f.endswith(".onnx") and f.split(".")[0] in ("gpt2", "bert", "llama", "t5", "vit"))


def _record(fixture: str) -> dict:
    with open(os.path.join(HERE, f"{fixture}.json"), encoding="utf-8") as handle:
        return json.load(handle)


@pytest.mark.parametrize("fixture", TRANSFORMERS)
def test_block_dims_from_shapes(fixture):
    record = _record(fixture)
    config, dims = record["config"], record["dims"]
    graph = load_model(os.path.join(HERE, f"{fixture}.onnx"), dims=dims)
    blocks = [layer for layer in graph.layers if layer.kind == "block"]
    assert blocks and all(b.transformer is not None for b in blocks), [(l.name, l.kind) for l in graph.layers]
    if config.get("image"):  # ViT: patches plus the class token
        seqs = {(config["image"] // config["patch"]) ** 2 + 1}
    else:
        seqs = {dims["seq"], dims.get("dec_seq", dims["seq"])}
    for block in blocks:
        t = block.transformer
        assert (t.hidden, t.heads, t.ffn) == (config["hidden"], config["heads"], config["ffn"])
        assert t.kv_heads == config.get("kv_heads", config["heads"])
        assert t.seq_len in seqs
        splits = [op.tp_split for op in block.ops if op.gemm is not None and op.flops > 0]
        assert "column" in splits and "row" in splits and "sharded" in splits
    assert graph.warnings == ()


@pytest.mark.parametrize("fixture", [f for f in TRANSFORMERS if f.split(".")[0] in ("gpt2", "bert", "vit")])
def test_block_activations_follow_korthikanti(fixture):
    """Eval-mode exports carry no dropout, so Korthikanti's s*h*(34 + 5as/h) loses its masks (3sh + as^2)
    and the softmax output is the tensor the context MatMul reads: s*h*32 + 2*a*s^2 bytes per block, as the
    importer must find once decomposed GeLUs are fused and the exporters' NaN guard after softmax is seen
    through (within 2%: the attention-mask condition a masked_fill keeps adds s^2 bytes)."""
    record = _record(fixture)
    graph = load_model(os.path.join(HERE, f"{fixture}.onnx"), dims=record["dims"])
    for block in [layer for layer in graph.layers if layer.kind == "block"]:
        t = block.transformer
        expected = t.seq_len * t.hidden * 32 + 2 * t.heads * t.seq_len ** 2
        assert block.activation_bytes == pytest.approx(expected, rel=0.02)


def test_torchscript_embedding_bag_loops_cost_their_lookups():
    """TorchScript exports nn.EmbeddingBag as a Loop over bags whose body Gathers from the table: the Loop is
    costed as the bag sum (pooling_factor x dim additions per sample), with no unknown-op warning."""
    record = _record("dlrm.torchscript")
    graph = load_model(os.path.join(HERE, "dlrm.torchscript.onnx"), dims=record["dims"])
    loops = [op for layer in graph.layers for op in layer.ops if op.op_type == "Loop"]
    assert sorted(op.flops for op in loops) == sorted(
        float(t["pooling_factor"] * t["dim"]) for t in record["config"]["tables"])
    assert not any("no cost rule" in w for w in graph.warnings)
