"""Recognise mixture-of-experts MLPs inside a layer, by structure, and cost their experts as routed.

Router: a ``TopK`` over a small "experts" axis whose input comes (through Softmax/Sigmoid, casts, views,
a bias or a scale) from a weighted GEMM whose output width is that axis: ``experts`` = the width,
``top_k`` = the TopK's output size on that axis, ``router`` = the scoring op on the way.

Experts: the weighted MatMuls of the layer downstream of that TopK (its indices pick the tokens or the
weights) on 3-D parameters ``[experts, in, out]`` or on 2-D ones in sets of ``experts`` equal shapes
(one module per expert), and any MatMul on a 3-D parameter ``[experts, in, out]``. An expert weight is an operand of the
MatMul (either side) that is a parameter, or is computed from one through views, transposes and a
``Gather`` (``gate_up_proj[expert_idx]``: one expert; ``gate_up_proj[expert_ids]``: a slice per routed
(token, expert) pair), so the three forms exporters write are covered: per-expert 2-D weights (Hugging Face's
eager loop, unrolled by tracing), batched 3-D weights (the builders, ``batched_mm``), and a ``Loop`` whose
body Gathers from a 3-D parameter. Where no expert MatMul is downstream of the TopK, every expert runs on every
token and the TopK only builds the gate that weights their outputs (the form that exports without
data-dependent shapes): the sets of ``experts`` equal 2-D matrices after the router's input are the experts.

Routed cost: ``tokens`` (the router GEMM's rows per sample) times ``top_k`` (token, expert) pairs go through
the experts, ``tokens * top_k / experts`` through each on average. A MatMul that covers all experts costs
``2 * tokens * top_k * (elements of one expert's matrix)``; one expert's MatMul costs ``1/experts`` of that.
Where the graph's own count is known and not above that (capacity dispatch already computes only the routed
rows) it is kept; where it is unknown (data-dependent token counts) or dense (every expert on every token)
the routed count replaces it, and the element-wise ops between the experts' MatMuls with unknown shapes are
costed from the routed sizes.

Shared experts: weighted MatMuls after the router's input is computed that are neither router nor routed
experts (a dense MLP on every token); ``shared_experts`` is their inner width over ``expert_ffn``.
"""

from __future__ import annotations

from dataclasses import dataclass

from planner.graph.ir import Node, OpGraph, act_bytes, numel_of
from planner.graph.rules import FLOPS_PER_ELEMENT, ZERO_FLOP_OPS
from planner.graph.transformer import weighted_matmul
from planner.types import MoEDims, OpCost

# ops between the router GEMM and its TopK (scoring, casts, views, a selection bias, a scale)
_ROUTER_PATH = frozenset({"Softmax", "Sigmoid", "LogSoftmax", "Cast", "Reshape", "Flatten", "Squeeze", "Unsqueeze",
                          "Identity", "Add", "Sub", "Mul", "Div"})
_ROUTER_HOPS = 6
# ops through which an expert weight reaches its MatMul
_GATHERS = frozenset({"Gather", "GatherND", "GatherElements"})
_WEIGHT_PATH = frozenset({"Transpose", "Reshape", "Squeeze", "Unsqueeze", "Cast", "Identity", "Flatten"}) | _GATHERS
_MATMULS = frozenset({"MatMul", "FusedMatMul"})
_OVER_ROUTED = 1.5  # a graph count above this multiple of the routed one computes experts densely
# OpCost.role of a routed expert's MatMul: the cost model times it as a grouped GEMM over the experts an
# expert-parallel rank holds (planner.cost.moe)
ROUTED_EXPERT = "routed-expert"


@dataclass(frozen=True)
class MoEMatch:
    """What one layer's mixture of experts is made of: dims, the router GEMM, the routed-expert nodes
    (MatMuls and Loops), the shared-expert MatMuls, the costs that replace the graph's own, and the elements
    per sample of the tensors whose shapes depend on the routing, from the routed sizes."""

    dims: MoEDims
    router: int
    experts: frozenset[int]
    shared: frozenset[int]
    costs: dict[int, OpCost]
    routed_sizes: dict[str, int]


def detect_moe(graph: OpGraph, members: list[Node], costs: dict[int, OpCost]) -> MoEMatch | None:
    """The mixture of experts among ``members`` (one layer's nodes, topological order), or None."""
    inside = {node.index for node in members}
    found = None
    for node in members:
        if node.op_type == "TopK":
            found = _router(graph, node)
            if found is not None:
                break
    if found is None:
        return None
    router, topk, experts, top_k, scoring = found
    router_node = graph.nodes[router]
    hidden = _in_features(graph, router_node)
    tokens = _rows(graph, router_node, costs[router], hidden)
    downstream = _downstream(graph, topk, inside)
    start = graph.producer.get(router_node.inputs[0], -1)
    expert_nodes = _experts(graph, members, experts, lambda node: node.index in downstream)
    if not expert_nodes:
        # every expert on every token, its output weighted by a gate the TopK scatters (the form exporters
        # write without data-dependent shapes): the sets of equal matrices after the router's input
        expert_nodes = _experts(graph, members, experts, lambda node: node.index > start)
    if not expert_nodes:
        return None
    expert_roots = sorted({r for roots, _, _ in expert_nodes.values() for r in roots})
    expert_params = sum(graph.params.get(r, 0) for r in expert_roots)
    expert_ffn = _expert_ffn(graph, expert_roots, hidden, experts)
    new_costs, sizes = _routed_costs(graph, members, costs, expert_nodes, downstream, tokens * top_k, experts)
    shared = frozenset(node.index for node in members if node.index > start and node.index != router
                       and node.index not in expert_nodes and weighted_matmul(graph, node))
    shared_ffn = max((_in_features(graph, graph.nodes[i]) for i in shared
                      if _out_features(graph, graph.nodes[i]) == hidden), default=0)
    shared_experts = (max(1, round(shared_ffn / expert_ffn)) if expert_ffn else 1) if shared_ffn else 0
    dims = MoEDims(experts=experts, top_k=top_k, shared_experts=shared_experts, expert_ffn=expert_ffn,
                   router=scoring, expert_params=expert_params, tokens=tokens)
    return MoEMatch(dims, router, frozenset(expert_nodes), shared, new_costs, sizes)


def _experts(graph: OpGraph, members: list[Node], experts: int, candidate
             ) -> dict[int, tuple[tuple[str, ...], int, bool]]:
    """node -> (weight roots, matrix elements, covers all experts) of the layer's routed-expert MatMuls: any on
    a 3-D ``[experts, in, out]`` parameter, and the ``candidate`` ones on 2-D parameters that come in sets of
    ``experts`` equal shapes (or a multiple; a lone projection after the combine is not one)."""
    found: dict[int, tuple[tuple[str, ...], int, bool]] = {}
    by_shape: dict[tuple[int, ...] | None, list[int]] = {}  # 2-D expert candidates by weight shape
    for node in members:
        weight = _expert_weight(graph, node, experts)
        if weight is None:
            continue
        roots, matrix, covers_all, three_d = weight
        if three_d or candidate(node):
            found[node.index] = (roots, matrix, covers_all)
            if not three_d:
                by_shape.setdefault(graph.shapes.get(roots[0]), []).append(node.index)
    for nodes in by_shape.values():
        if len(nodes) % experts:
            for index in nodes:
                del found[index]
    return found


# ------------------------------------------------------------------------------------------- router
def _router(graph: OpGraph, topk: Node) -> tuple[int, int, int, int, str] | None:
    """(router GEMM, TopK, experts, top_k, scoring) when ``topk`` picks experts from a router's scores."""
    shape = graph.shapes.get(topk.inputs[0])
    out = graph.shapes.get(topk.outputs[0]) if topk.outputs else None
    if not shape or not out or len(out) != len(shape):
        return None
    axis = topk.attr("axis", -1) % len(shape)
    experts, top_k = shape[axis], out[axis]
    if experts < 2 or not 1 <= top_k <= experts:
        return None
    scoring = "none"
    tensor = topk.inputs[0]
    for _ in range(_ROUTER_HOPS):
        index = graph.producer.get(tensor)
        if index is None:
            return None
        node = graph.nodes[index]
        if node.op_type in ("MatMul", "Gemm"):
            if weighted_matmul(graph, node) and _out_features(graph, node) == experts:
                return index, topk.index, experts, top_k, scoring
            return None
        if node.op_type not in _ROUTER_PATH:
            return None
        if node.op_type in ("Softmax", "Sigmoid", "LogSoftmax") and scoring == "none":
            scoring = "sigmoid" if node.op_type == "Sigmoid" else "softmax"
        data = [t for t in node.inputs if t and t not in graph.const]
        if not data:
            return None
        tensor = data[0]
    return None


def _weight_shape(graph: OpGraph, node: Node) -> tuple[int, ...] | None:
    shape = graph.shapes.get(node.inputs[1]) if len(node.inputs) > 1 else None
    if shape and node.op_type == "Gemm" and node.attr("transB", 0):
        shape = shape[::-1]
    return shape


def _in_features(graph: OpGraph, node: Node) -> int:
    shape = _weight_shape(graph, node)
    return shape[-2] if shape and len(shape) >= 2 else 0


def _out_features(graph: OpGraph, node: Node) -> int:
    shape = _weight_shape(graph, node)
    return shape[-1] if shape else 0


def _rows(graph: OpGraph, node: Node, cost: OpCost, hidden: int) -> int:
    """Rows (tokens) per sample the router GEMM scores."""
    if cost.gemm is not None:
        return int(cost.gemm[0])
    n = graph.numel(node.inputs[0])
    return max(int((n or 0) // max(hidden, 1) // max(graph.static_batch, 1)), 1)


# ------------------------------------------------------------------------------------------ experts
def _downstream(graph: OpGraph, start: int, inside: set[int]) -> set[int]:
    """Nodes of ``inside`` that read (transitively) an output of node ``start``."""
    seen: set[int] = set()
    stack = [start]
    while stack:
        for tensor in graph.nodes[stack.pop()].outputs:
            for user in graph.consumers.get(tensor, ()):
                if user in inside and user not in seen:
                    seen.add(user)
                    stack.append(user)
    return seen


def _expert_weight(graph: OpGraph, node: Node, experts: int
                   ) -> tuple[tuple[str, ...], int, bool, bool] | None:
    """(parameter roots, elements of one expert's matrix, covers all experts?, 3-D parameter?) of a MatMul
    or Einsum (or Loop) on expert weights, or None."""
    if node.op_type == "Loop":
        roots = tuple(r for t in node.inputs if t in graph.param_roots for r in graph.param_roots[t]
                      if len(graph.shapes.get(r) or ()) == 3 and (graph.shapes.get(r) or (0,))[0] == experts)
        if not roots:
            return None
        return roots, sum(numel_of(graph.shapes[r][1:]) for r in roots), True, True
    if node.op_type not in _MATMULS | {"Gemm", "Einsum"}:
        return None
    for slot in (1, 0):
        if slot >= len(node.inputs) or (slot == 0 and node.op_type == "Gemm"):
            continue
        found = _trace_weight(graph, node.inputs[slot])
        if found is None:
            continue
        root, gathered, constant_index = found
        shape = graph.shapes.get(root) or ()
        if len(shape) == 3 and shape[0] == experts:
            operand = graph.shapes.get(node.inputs[slot])
            one = constant_index or (operand is not None and len(operand) == 2)
            return (root,), numel_of(shape[1:]), not one, True
        if len(shape) == 2 and slot == 1 and not gathered:
            return (root,), numel_of(shape), False, False
    return None


def _trace_weight(graph: OpGraph, tensor: str) -> tuple[str, bool, bool] | None:
    """(parameter, through a Gather?, with constant indices?) that ``tensor`` is computed from through
    views and a Gather, or None."""
    gathered = constant = False
    for _ in range(6):
        roots = graph.param_roots.get(tensor)
        if roots and len(roots) == 1 and (not gathered or tensor in graph.params):
            return roots[0], gathered, gathered and constant
        index = graph.producer.get(tensor)
        if index is None:
            return None
        node = graph.nodes[index]
        if node.op_type not in _WEIGHT_PATH or not node.inputs:
            return None
        if node.op_type in _GATHERS:
            gathered = True
            constant = len(node.inputs) > 1 and node.inputs[1] in graph.const
        tensor = node.inputs[0]
    return None


def _expert_ffn(graph: OpGraph, roots: list[str], hidden: int, experts: int) -> int:
    """One expert's inner width: the smallest dimension other than ``hidden`` of its matrices (a fused
    gate-and-up matrix is twice as wide as the down projection)."""
    widths = []
    for root in roots:
        shape = graph.shapes.get(root) or ()
        matrix = shape[1:] if len(shape) == 3 and shape[0] == experts else shape
        widths += [d for d in matrix if d != hidden]
    return min(widths, default=hidden)


def _routed_costs(graph: OpGraph, members: list[Node], costs: dict[int, OpCost],
                  expert_nodes: dict[int, tuple[tuple[str, ...], int, bool]], downstream: set[int],
                  pairs: int, experts: int) -> tuple[dict[int, OpCost], dict[str, int]]:
    """Replacement costs: expert MatMuls whose graph count is unknown or dense get the routed count; the
    element-wise ops with unknown shapes downstream of the router are costed from guessed routed sizes. With
    the guessed sizes (elements per sample) of the tensors of unknown shape."""
    out: dict[int, OpCost] = {}
    guess: dict[str, int] = {}
    for node in members:
        cost = costs[node.index]
        if node.index in expert_nodes:
            _, matrix, covers_all = expert_nodes[node.index]
            rows = pairs if covers_all else max(pairs // max(experts, 1), 1)
            routed = 2.0 * rows * matrix
            known = node.op_type != "Loop" and cost.flops > 0 and not _unknown(graph, node)
            if known and cost.flops <= _OVER_ROUTED * routed:
                continue
            width = _width(graph, node, matrix)
            for t in node.outputs:
                if t:
                    guess[t] = rows * width
            gemm = (rows, width, max(matrix // max(width, 1), 1)) if node.op_type != "Loop" else cost.gemm
            read = cost.bytes_read if known else 2.0 * (rows * (matrix // max(width, 1)) + matrix)
            written = cost.bytes_written if known else 2.0 * rows * width
            out[node.index] = OpCost(cost.name, cost.op_type, routed, read, written, gemm, cost.tp_split, cost.role)
            continue
        if node.index not in downstream or not _unknown(graph, node):
            continue
        sizes = [graph.numel(t) if graph.numel(t) is not None else guess.get(t) for t in node.inputs if t]
        data = max((s for s in sizes if s), default=0)
        for t in node.outputs:
            if t and graph.numel(t) is None and data:
                guess[t] = data
        if node.op_type in ZERO_FLOP_OPS:
            flops = 0.0
        else:
            flops = float(FLOPS_PER_ELEMENT.get(node.op_type, 1) * data)
        moved = float(data * act_bytes(graph.types.get(node.outputs[0]) if node.outputs else None))
        out[node.index] = OpCost(cost.name, cost.op_type, flops, moved, moved, cost.gemm, cost.tp_split, cost.role)
    return out, guess


def _unknown(graph: OpGraph, node: Node) -> bool:
    return any(graph.shapes.get(t) is None for t in node.inputs + node.outputs if t)


def _width(graph: OpGraph, node: Node, matrix: int) -> int:
    """Output features of an expert MatMul: from its output shape where known, else from a 2-D weight, else
    the square root of one expert's matrix."""
    weight = _weight_shape(graph, node)
    if weight is not None and len(weight) == 2 and node.inputs[1] in graph.param_roots:
        return weight[-1]
    out = graph.shapes.get(node.outputs[0]) if node.outputs else None
    if out and out[-1] > 1:
        return out[-1]
    if out and len(out) >= 2 and out[-1] == 1:
        return out[-2]  # weight-first batched form: [pairs, out, 1]
    side = int(round(matrix ** 0.5))
    return side
