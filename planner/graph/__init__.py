"""ONNX import: safe loading, per-op costs, layer and embedding-table detection (see importer.py)."""

from planner.graph.importer import import_model_proto, load_model

__all__ = ["load_model", "import_model_proto"]
