"""Small helpers for the cost-model tests: GPT LayerGraphs built with planner.builders and imported with
planner.graph. Large models are made by building two transformer blocks and repeating the second (every
block of a GPT is identical), which keeps the tests fast."""

from __future__ import annotations

import dataclasses
from functools import lru_cache

from planner.builders import build
from planner.graph import import_model_proto
from planner.types import LayerGraph


@lru_cache(maxsize=16)
def gpt(layers: int, hidden: int, heads: int, seq_len: int, vocab: int, ffn: int | None = None) -> LayerGraph:
    settings = {"layers": min(layers, 2), "hidden": hidden, "heads": heads, "seq_len": seq_len, "vocab": vocab}
    if ffn:
        settings["ffn"] = ffn
    small = import_model_proto(build("gpt", settings), {"batch": 1}, name=f"gpt-{layers}x{hidden}")
    if layers <= 2:
        return small
    embedding, first, second, *rest = small.layers
    blocks = [first] + [dataclasses.replace(second, name=f"layers.{i}") for i in range(1, layers)]
    ordered = [embedding, *blocks, *rest]
    return dataclasses.replace(small, layers=tuple(dataclasses.replace(layer, index=i)
                                                   for i, layer in enumerate(ordered)))


def gpt3_175b(seq_len: int = 2048) -> LayerGraph:
    return gpt(96, 12288, 96, seq_len, 51200)
