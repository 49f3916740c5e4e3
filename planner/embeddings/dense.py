"""The dense part of a model whose sparse tables are placed by the embedding planner.

A DLRM's importer-level ``embedding`` layer holds its tables' parameters; once the tables are sharded
model-parallel (planner.embeddings), the dense pipeline must not count them again (weights, gradients,
optimizer states, data-parallel gradient sync). This removes the tables' parameters from the ``embedding``
layers that hold them, first layer first, and keeps every other number of the graph.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

from planner.types import EmbeddingTable, LayerGraph


def dense_part(model: LayerGraph, tables: Sequence[EmbeddingTable]) -> LayerGraph:
    """``model`` without the parameters of ``tables`` (those found in its ``embedding`` layers)."""
    remaining = sum(t.rows * t.dim for t in tables)
    if remaining <= 0:
        return model
    layers = []
    for layer in model.layers:
        if layer.kind == "embedding" and remaining > 0:
            take = min(layer.params, remaining)
            remaining -= take
            layer = dataclasses.replace(layer, params=layer.params - take)
        layers.append(layer)
    return dataclasses.replace(model, layers=tuple(layers))
