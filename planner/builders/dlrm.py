"""DLRM (Naumov et al. 2019, "Deep Learning Recommendation Model for Personalization and Recommendation
Systems"): a bottom MLP over dense features, one embedding lookup per sparse feature, a feature interaction
and a top MLP ending in a sigmoid.

Each table is a 2-D fp32 weight ``[rows, dim]`` looked up with ``Gather``; a table whose pooling factor P
exceeds 1 takes indices ``[batch, P]`` and sums the P rows (``ReduceSum``), which is what an ``EmbeddingBag``
in sum mode does. P is the pooling factor rounded to an integer (at least 1); the exact factors are kept in
the ``planner.tables`` metadata. Interactions: ``dot`` (pairwise dot products of the bottom-MLP output and
every embedding, strictly-lower triangle, concatenated with the bottom-MLP output; needs every table's dim
equal to the bottom MLP's last width), ``cat`` (plain concatenation, any dims) or ``dcn`` (DCN-v2 low-rank
cross layers over the concatenation, as MLPerf's DLRM-DCNv2; Wang et al. 2021).
"""

from __future__ import annotations

import json
import logging
import re
from typing import Mapping

import onnx
from onnx import TensorProto

from planner.builders._onnx import GraphBuilder
from planner.builders._spec import (FILE, INT, INT_LIST, MAX_WEIGHT_ELEMENTS, STR, Family, Key, Value,
                                    check_elements)
from planner.builders.tables import load_tables
from planner.errors import ConfigError
from planner.hardware.documents import RANGES
from planner.types import EmbeddingTable

log = logging.getLogger(__name__)

DTYPE = TensorProto.FLOAT
BATCH = "batch"
DEFAULT_DENSE_FEATURES = 13  # Criteo's dense features (the DLRM reference configuration)
DEFAULT_BOTTOM_MLP = (512, 256, 64)  # DLRM reference Criteo Kaggle configuration
DEFAULT_TOP_MLP = (512, 256, 1)
# the sizes a tables file may give for the dense network, so --set takes what the file takes
MAX_WIDTH = int(RANGES["dense_width"][1])  # dense features, an MLP layer's width, a cross layer's rank
MAX_MLP_LAYERS = int(RANGES["mlp_layers"][1])  # layers of one MLP, and cross layers
# the dot interaction's pairs, whose indices are one inline int64 constant of the model file: 2**24 of them
# (about 5,800 tables) take 128 MiB, well inside the 2 GiB a protobuf message (and the importer) takes
MAX_DOT_PAIRS = 2**24


def _mlp(g: GraphBuilder, name: str, x: str, n_in: int, widths: tuple[int, ...], last: str) -> str:
    """Linear layers as torch.nn.Linear exports them (Gemm with transB), ReLU between, ``last`` at the end."""
    with g.scope(name):
        for index, width in enumerate(widths):
            with g.scope(f"layers.{index}"):
                x = g.op("Gemm", [x, g.weight("weight", [width, n_in]), g.weight("bias", [width])], transB=1)
                x = g.op(last if index == len(widths) - 1 else "Relu", [x])
            n_in = width
    return x


def _cross_network(g: GraphBuilder, x0: str, width: int, layers: int, rank: int) -> str:
    """DCN-v2 low-rank cross layers (Wang et al. 2021, Eq. 1 and Sec. 3.2): x <- x0 * (U (V x) + b) + x,
    with V: width -> rank and U: rank -> width."""
    x = x0
    for index in range(layers):
        with g.scope(f"cross.{index}"):
            with g.scope("V"):
                low = g.op("MatMul", [x, g.weight("weight", [width, rank])])
            with g.scope("U"):
                up = g.op("Add", [g.op("MatMul", [low, g.weight("weight", [rank, width])]),
                                  g.weight("bias", [width])])
            x = g.op("Add", [g.op("Mul", [x0, up]), x])
    return x


def _tensor_names(tables: tuple[EmbeddingTable, ...]) -> list[str]:
    names: list[str] = []
    for table in tables:
        base = re.sub(r"[^A-Za-z0-9_]", "_", table.name)
        name, n = base, 1
        while name in names:
            n += 1
            name = f"{base}_{n}"
        names.append(name)
    return names


def _pooling(table: EmbeddingTable) -> int:
    return max(1, round(table.pooling_factor))


def build_dlrm(cfg: Mapping[str, Value], weights_file: str) -> onnx.ModelProto:
    spec = load_tables(str(cfg["tables"]), cfg.get("workload"))  # type: ignore[arg-type]
    dense_features = int(cfg["dense_features"])
    bottom, top = tuple(cfg["bottom_mlp"]), tuple(cfg["top_mlp"])  # type: ignore[arg-type]
    g = GraphBuilder(weights_file, DTYPE)
    dense = g.input("dense_features", DTYPE, [BATCH, dense_features])
    names = _tensor_names(spec.tables)
    indices = [g.input(f"{name}_indices", TensorProto.INT64, [BATCH] if _pooling(table) == 1 else
                       [BATCH, _pooling(table)]) for name, table in zip(names, spec.tables)]
    z = _mlp(g, "bottom_mlp", dense, dense_features, bottom, "Relu")
    pooled: list[str] = []
    with g.scope("embed"):
        for name, table, idx in zip(names, spec.tables, indices):
            with g.scope(name):
                rows = g.op("Gather", [g.weight("weight", [table.rows, table.dim]), idx])
                if _pooling(table) > 1:
                    rows = g.op("ReduceSum", [rows, g.const([1], TensorProto.INT64)], keepdims=0)
                pooled.append(rows)
    with g.scope("interaction"):
        if cfg["interaction"] == "dot":
            features = len(pooled) + 1
            unsq = [g.op("Unsqueeze", [t, g.const([1], TensorProto.INT64)]) for t in (z, *pooled)]
            stacked = g.op("Concat", unsq, axis=1)  # [batch, F+1, d]
            dots = g.op("MatMul", [stacked, g.op("Transpose", [stacked], perm=[0, 2, 1])])
            flat = g.op("Reshape", [dots, g.const([0, -1], TensorProto.INT64)])
            lower = [i * features + j for i in range(features) for j in range(i)]
            pairs = g.op("Gather", [flat, g.const(lower, TensorProto.INT64)], axis=1)
            joined = g.op("Concat", [z, pairs], axis=1)
            width = bottom[-1] + len(lower)
        else:
            joined = g.op("Concat", [z, *pooled], axis=1)
            width = bottom[-1] + sum(table.dim for table in spec.tables)
            if cfg["interaction"] == "dcn":
                joined = _cross_network(g, joined, width, int(cfg["dcn_layers"]), int(cfg["dcn_rank"]))
    out = _mlp(g, "top_mlp", joined, width, top, "Sigmoid")
    g.output(out, DTYPE, [BATCH, top[-1]])
    tables_json = [{"name": t.name, "rows": t.rows, "dim": t.dim, "pooling_factor": t.pooling_factor,
                    "input": f"{name}_indices"} for name, t in zip(names, spec.tables)]
    config = {key: list(value) if isinstance(value, tuple) else value for key, value in cfg.items()}
    metadata = {
        "planner.family": "dlrm",
        "planner.config": json.dumps(config, sort_keys=True),
        "planner.default_dims": json.dumps({}),
        "planner.tables": json.dumps(tables_json, sort_keys=True),
    }
    return g.model(f"dlrm-{len(spec.tables)}tables", metadata)


# DCN-v2's cross network where neither the user nor the tables file sizes it: the MLPerf DLRM-DCNv2 reference's
# (three cross layers of low rank 512, MLCommons training_results_v3.0 dlrm_dcnv2)
DCN_LAYERS, DCN_RANK = 3, 512
# a tables file's interaction: dot, cat, or DCN-v2 as the workloads file writes it, "dcn(3 layers, low rank 512)"
_INTERACTION = re.compile(r"\s*(dot|cat|dcn)\s*(?:\(\s*(\d+)\s*layers?\s*,\s*low rank\s*(\d+)\s*\))?\s*\Z",
                          re.IGNORECASE)


def _named_interaction(text: str) -> dict[str, Value]:
    """The builder keys of the interaction a tables file names (``dcn(N layers, low rank R)`` also sets
    ``dcn_layers`` and ``dcn_rank``)."""
    match = _INTERACTION.match(text)
    if match is None:
        raise ConfigError(f"dlrm: the tables file's interaction {text!r} is not dot, cat or dcn(N layers, low rank R); "
                          "set interaction=dot, cat or dcn to build one of them")
    kind, layers, rank = match.groups()
    keys: dict[str, Value] = {"interaction": kind.lower()}
    if layers is not None:
        if not 1 <= int(layers) <= MAX_MLP_LAYERS or not 1 <= int(rank) <= MAX_WIDTH:
            raise ConfigError(f"dlrm: the tables file's interaction {text!r} has {layers} cross layers of rank {rank}; "
                              f"the builder takes 1 to {MAX_MLP_LAYERS} layers of rank 1 to {MAX_WIDTH}")
        keys.update(dcn_layers=int(layers), dcn_rank=int(rank))
    return keys


def _check(cfg: dict[str, Value]) -> None:
    """Fill dense sizes from the tables file where the user gave none; check the dot interaction's dims."""
    spec = load_tables(str(cfg["tables"]), cfg.get("workload"))  # type: ignore[arg-type]
    for key, from_file, default in (("dense_features", spec.dense_features, DEFAULT_DENSE_FEATURES),
                                    ("bottom_mlp", spec.bottom_mlp, DEFAULT_BOTTOM_MLP),
                                    ("top_mlp", spec.top_mlp, DEFAULT_TOP_MLP)):
        if key not in cfg:
            cfg[key] = from_file if from_file is not None else default
    bottom = tuple(cfg["bottom_mlp"])  # type: ignore[arg-type]
    if "interaction" not in cfg and spec.interaction is not None:
        for key, value in _named_interaction(spec.interaction).items():
            cfg.setdefault(key, value)
    if "interaction" not in cfg:
        # pairwise dots need every table's dim equal to the bottom MLP's output; concatenation takes any dims
        same = all(t.dim == bottom[-1] for t in spec.tables)
        cfg["interaction"] = "dot" if same else "cat"
        if not same:
            log.warning("dlrm: the tables' dims differ from the last bottom_mlp width (%d), so the interaction is "
                        "'cat' (concatenation); set interaction=dot with equal dims for pairwise dots", bottom[-1])
    if cfg["interaction"] == "dcn":
        cfg.setdefault("dcn_layers", DCN_LAYERS)
        cfg.setdefault("dcn_rank", DCN_RANK)
    if cfg["interaction"] == "dot":
        odd = [t.name for t in spec.tables if t.dim != bottom[-1]]
        if odd:
            raise ConfigError(f"dlrm: interaction 'dot' needs every table's dim equal to the last bottom_mlp width "
                              f"({bottom[-1]}); tables {', '.join(odd[:5])} differ: set interaction=cat or change "
                              f"bottom_mlp")
    _check_sizes(cfg, spec.tables, bottom)


def _check_sizes(cfg: dict[str, Value], tables: tuple[EmbeddingTable, ...], bottom: tuple[int, ...]) -> None:
    """The weights whose size the tables decide (the MLP weights alone stay within the importer's limit by
    the keys' maxima): each table, and the weights that take the interaction's output (the first top MLP
    layer, and dcn's cross layers)."""
    for table in tables:
        check_elements("dlrm", f"table '{table.name}' (rows x dim = {table.rows} x {table.dim})",
                       table.rows * table.dim, MAX_WEIGHT_ELEMENTS, "lower its rows or dim in the tables file")
    if cfg["interaction"] == "dot":
        pairs = len(tables) * (len(tables) + 1) // 2  # the pairwise dots of tables + 1 vectors
        if pairs > MAX_DOT_PAIRS:
            raise ConfigError(f"dlrm: interaction 'dot' over {len(tables)} tables makes {pairs:,} pairs, over the "
                              f"{MAX_DOT_PAIRS:,} a model file holds; set interaction=cat or dcn")
        width = bottom[-1] + pairs
    else:
        width = bottom[-1] + sum(table.dim for table in tables)
    after = int(tuple(cfg["top_mlp"])[0])  # type: ignore[arg-type]
    if cfg["interaction"] == "dcn":  # the cross layers' weights take the interaction's output too
        after = max(after, int(cfg["dcn_rank"]))
    check_elements("dlrm", f"a weight on the {cfg['interaction']} interaction's output ({width} inputs x "
                   f"{after})", width * after, MAX_WEIGHT_ELEMENTS,
                   "use fewer or narrower tables, or lower the first top_mlp width or dcn_rank")


FAMILY = Family(
    name="dlrm",
    description="DLRM recommendation model (bottom MLP, embedding tables, dot/cat/dcn interaction, top MLP)",
    keys=(
        Key("tables", FILE, 'embedding tables, JSON/YAML {"tables": [{"name","rows","dim","pooling_factor"}]}',
            required=True),
        Key("workload", STR, "entry to use when the tables file lists several 'workloads'"),
        Key("dense_features", INT, "dense input features", default_text="from the tables file, else 13", minimum=1,
            maximum=MAX_WIDTH),
        Key("bottom_mlp", INT_LIST, "bottom MLP widths",
            default_text="from the tables file, else 512,256,64", minimum=1, maximum=MAX_WIDTH,
            max_items=MAX_MLP_LAYERS),
        Key("top_mlp", INT_LIST, "top MLP widths (the last is the output width)",
            default_text="from the tables file, else 512,256,1", minimum=1, maximum=MAX_WIDTH,
            max_items=MAX_MLP_LAYERS),
        Key("interaction", STR, "feature interaction: pairwise dots, concatenation, or DCN-v2 cross layers over "
            "the concatenation", default_text="dot, or cat when the tables' dims differ from the last bottom_mlp "
            "width", choices=("dot", "cat", "dcn")),
        Key("dcn_layers", INT, "cross layers (interaction=dcn)", default_text=f"the tables file's, else {DCN_LAYERS}",
            minimum=1, maximum=MAX_MLP_LAYERS),
        Key("dcn_rank", INT, "low rank of each cross layer (interaction=dcn)",
            default_text=f"the tables file's, else {DCN_RANK}", minimum=1, maximum=MAX_WIDTH),
    ),
    build=build_dlrm,
    check=_check,
)
