"""`planner inspect MODEL`: parameters, FLOPs, activations, layers and embedding tables of an ONNX model."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from planner.commands._common import add_allow_unknown_ops_flag, add_dim_flag, add_json_flag, emit_json, parse_dims
from planner.types import Layer, LayerGraph
from planner.units import size, whole_bytes

HELP = "import an ONNX model and report its parameters, FLOPs, activations, layers and embedding tables"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", metavar="MODEL", help="path to an .onnx file (weight data is never read)")
    add_dim_flag(parser)
    add_allow_unknown_ops_flag(parser)
    add_json_flag(parser)


def run(args: argparse.Namespace) -> int:
    from planner.graph import load_model

    graph = load_model(args.model, parse_dims(args.dim), allow_unknown_ops=args.allow_unknown_ops)
    if args.json:
        emit_json(to_document(graph))
    else:
        sys.stdout.write(render_table(graph))
    return 0


def to_document(graph: LayerGraph) -> dict[str, Any]:
    """The inspect JSON: model totals for the bound batch, per-layer numbers per sample times the batch."""
    b = graph.batch
    return {
        "name": graph.name,
        "family": graph.family,
        "batch": b,
        "dims": dict(graph.dims),
        "params": graph.params,
        "active_params": graph.active_params,
        "flops_forward": graph.flops_forward * b,
        "flops_forward_per_sample": graph.flops_forward,
        "activation_bytes": whole_bytes(sum(layer.activation_bytes for layer in graph.layers) * b),
        "layers": [
            {
                "index": layer.index,
                "name": layer.name,
                "kind": layer.kind,
                "params": layer.params,
                "active_params": layer.active_params,
                **_moe_fields(layer),
                "flops_forward": layer.flops_forward * b,
                "activation_bytes": whole_bytes(layer.activation_bytes * b),
                "output_bytes": whole_bytes(layer.output_bytes * b),
                "input_bytes": whole_bytes(layer.input_bytes * b),
                "ops": len(layer.ops),
                "transformer": None if layer.transformer is None else {
                    "hidden": layer.transformer.hidden, "heads": layer.transformer.heads,
                    "seq_len": layer.transformer.seq_len, "ffn": layer.transformer.ffn,
                    "kv_heads": layer.transformer.kv_heads,
                },
            }
            for layer in graph.layers
        ],
        "embedding_tables": [
            {"name": t.name, "rows": t.rows, "dim": t.dim, "pooling_factor": t.pooling_factor,
             "dtype_bytes": t.dtype_bytes}
            for t in graph.embedding_tables
        ],
        "warnings": list(graph.warnings),
    }


def _moe_fields(layer: Layer) -> dict[str, Any]:
    """A mixture-of-experts layer's experts (none for a dense layer); its FLOPs are the routed ones."""
    if layer.moe is None:
        return {}
    m = layer.moe
    return {"experts": m.experts, "top_k": m.top_k, "shared_experts": m.shared_experts, "expert_ffn": m.expert_ffn,
            "router": m.router}


def _si(value: float, unit: str = "") -> str:
    for factor, prefix in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= factor:
            return f"{value / factor:.3g} {prefix}{unit}"
    return f"{value:.3g} {unit}".rstrip()


def render_table(graph: LayerGraph) -> str:
    b = graph.batch
    dims = ", ".join(f"{k}={v}" for k, v in graph.dims) or "none"
    lines = [
        f"model {graph.name}" + (f" (family {graph.family})" if graph.family else ""),
        f"dims: {dims}; numbers below are for batch {b}",
        f"parameters {graph.params:,}"
        + (f" ({graph.active_params:,} active per token)" if graph.active_params != graph.params else "")
        + f"   forward {_si(graph.flops_forward * b, 'FLOP')}   "
        f"activations saved for backward {size(sum(l.activation_bytes for l in graph.layers) * b)}",
        "",
    ]
    rows = [("#", "layer", "kind", "params", "fwd FLOPs", "activations", "output", "transformer")]
    for layer in graph.layers:
        t = layer.transformer
        shape = f"h={t.hidden} a={t.heads} s={t.seq_len} ffn={t.ffn}" if t else ""
        if layer.moe is not None:
            m = layer.moe
            shape += (f" experts={m.experts} top{m.top_k}" + (f"+{m.shared_experts} shared" if m.shared_experts else "")
                      + f" expert_ffn={m.expert_ffn}")
        rows.append((str(layer.index), layer.name, layer.kind, f"{layer.params:,}",
                     _si(layer.flops_forward * b), size(layer.activation_bytes * b),
                     size(layer.output_bytes * b), shape))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    right = {0, 3, 4, 5, 6}
    for r in rows:
        lines.append("  ".join(c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths)))
                     .rstrip())
    if graph.embedding_tables:
        lines += ["", "embedding tables:"]
        for t in graph.embedding_tables:
            lines.append(f"  {t.name}: {t.rows:,} rows x {t.dim}, pooling factor {t.pooling_factor:g}")
    if graph.warnings:
        lines += ["", "warnings:"] + [f"  {w}" for w in graph.warnings]
    return "\n".join(lines) + "\n"
