"""Embedding-table sharding across heterogeneous devices (table file loading, the placement MILP, and
joining the result to a dense plan)."""

from planner.embeddings.attach import attach, attach_embeddings
from planner.embeddings.shard import EmbeddingResult, shard_tables
from planner.embeddings.tables import load_tables

__all__ = ["EmbeddingResult", "attach", "attach_embeddings", "load_tables", "shard_tables"]
