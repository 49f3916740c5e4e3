"""Validation of a parallel configuration against a model and a cluster: the rule book's
(:mod:`planner.rules`), under the names the cost model has always exported."""

from __future__ import annotations

from planner.rules import attention_heads, check_config, divisors, nearest, pipeline_units

__all__ = ["attention_heads", "check_config", "divisors", "nearest", "pipeline_units"]
