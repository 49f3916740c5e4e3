"""The optimizers: find the fastest plan under the cost model (see :mod:`planner.search.engine`)."""

from planner.search.api import SearchResult, plan, search

__all__ = ["SearchResult", "plan", "search"]
