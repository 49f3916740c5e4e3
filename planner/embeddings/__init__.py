"""Embedding-table sharding across heterogeneous devices (table file loading and the placement search;
planner.compose joins the result to the dense part's estimate or plan)."""

from planner.embeddings.problem import table_optimizer
from planner.embeddings.shard import EmbeddingResult, check_capacity, shard_tables
from planner.embeddings.tables import load_tables

__all__ = ["EmbeddingResult", "check_capacity", "load_tables", "shard_tables", "table_optimizer"]
