"""How much of a model's arithmetic the cost rules could not see, and the refusal above a small share.

An op the importer cannot cost (no rule for its type, or a rule whose tensors have unknown shapes) is
costed as zero FLOPs; a plan built on that undercounts the model. The share of such ops is estimated in
FLOPs from what is known around them, in topological order:

- a tensor of unknown shape is guessed to hold as many elements as the largest data (non-constant) input
  of the op that produces it (element-wise ops keep sizes; a known-weight matrix product scales it by n/k);
- an unknown matrix product or convolution with a known weight costs 2 x (elements of its data input) x
  (output features per input feature) -- for MatMul ``[k, n]`` that is 2 x elements x n;
- any other unknown op costs its ``FLOPS_PER_ELEMENT`` (1 when it has none) per element of the largest of
  its data inputs and outputs.

The share is those estimates over the estimates plus the known FLOPs. Ops about which nothing at all is
known (no data input or output of known or guessed size) count by number instead: their fraction of the
ops that do arithmetic. The larger of the two shares is compared with :data:`UNKNOWN_SHARE_LIMIT`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from planner.errors import ModelError
from planner.graph.ir import Node, OpGraph, numel_of
from planner.graph.rules import FLOPS_PER_ELEMENT, INPUT_RULES, RULES, ZERO_FLOP_OPS
from planner.types import OpCost


# refuse to plan when more than this share of the forward FLOPs is in ops that could not be costed
UNKNOWN_SHARE_LIMIT = 0.01

_MATMULS = frozenset({"MatMul", "FusedMatMul", "MatMulInteger", "QLinearMatMul"})
_GEMMS = frozenset({"Gemm", "FusedGemm"})
_CONVS = frozenset({"Conv", "ConvTranspose"})


@dataclass
class UnknownOps:
    """What could not be costed: the estimated share and, per reason, the op types and a node name."""

    share: float = 0.0
    kinds: dict[str, int] = field(default_factory=dict)  # "MatMul (unknown shapes)" -> nodes
    example: str = ""

    def summary(self, most: int = 3) -> str:
        """The ``most`` commonest kinds, e.g. ``7 MatMul (unknown shapes), 4 Loop (no cost rule)``."""
        ranked = sorted(self.kinds.items(), key=lambda kv: (-kv[1], kv[0]))
        text = ", ".join(f"{count} {kind}" for kind, count in ranked[:most])
        rest = sum(count for _, count in ranked[most:])
        return text + (f" and {rest} more" if rest else "")


def check_unknown_ops(graph: OpGraph, compute: list[Node], costs: dict[int, OpCost], costed: set[int],
                      allow: bool, where: str) -> None:
    """Refuse (ModelError) when the uncostable share exceeds :data:`UNKNOWN_SHARE_LIMIT`, unless ``allow``:
    then plan anyway and say so in a warning. ``costed``: nodes costed otherwise (embedding-bag Loops)."""
    unknown = estimate_unknown(graph, compute, costs, costed)
    if unknown.share <= UNKNOWN_SHARE_LIMIT:
        return
    what = (f"about {unknown.share:.1%} of the forward FLOPs are in ops the planner cannot cost "
            f"({unknown.summary()}; e.g. node '{unknown.example}'), which would be costed as zero")
    if not allow:
        shapes = any(kind.endswith("(unknown shapes)") for kind in unknown.kinds)
        fix = ("check the --dim values (shapes are unknown where the graph's own sizes disagree with them) "
               if shapes else "re-export without custom ops ")
        raise ModelError(f"{where}: {what}; {fix}or pass --allow-unknown-ops (Python: allow_unknown_ops=True) "
                         f"to plan anyway")
    msg = f"{what}; planned anyway (--allow-unknown-ops)"
    graph.warnings.append(msg)


def estimate_unknown(graph: OpGraph, compute: list[Node], costs: dict[int, OpCost], costed: set[int]) -> UnknownOps:
    guess: dict[str, int] = {}

    def size(tensor: str) -> int | None:
        n = graph.numel(tensor)
        return n if n is not None else guess.get(tensor)

    known_flops = 0.0
    estimated = 0.0
    blind = 0  # unknown ops with nothing to estimate from
    arithmetic = 0  # ops that can do arithmetic (not moves or views)
    result = UnknownOps()
    for node in compute:
        if node.op_type not in ZERO_FLOP_OPS:
            arithmetic += 1
        reason = _reason(graph, node, costed)
        if reason is None:
            known_flops += costs[node.index].flops
            continue
        data_sizes = [s for s in (size(t) for t in node.inputs if t and t not in graph.const) if s]
        flops, out_size = _estimate(graph, node, max(data_sizes, default=0))
        for t in node.outputs:
            if t and graph.numel(t) is None and out_size:
                guess[t] = out_size
        if node.op_type in ZERO_FLOP_OPS:
            continue  # costs nothing whatever its shapes; only its guessed sizes matter downstream
        kind = f"{node.op_type} ({reason})"
        result.kinds[kind] = result.kinds.get(kind, 0) + 1
        result.example = result.example or node.name or f"{node.op_type}_{node.index}"
        if flops is None:
            blind += 1
        else:
            estimated += flops
    total = known_flops + estimated
    share = estimated / total if total > 0 else (1.0 if estimated or blind else 0.0)
    if blind:
        share = max(share, blind / max(arithmetic, 1))
    result.share = share
    return result


def _reason(graph: OpGraph, node: Node, costed: set[int]) -> str | None:
    """Why ``node`` is not costed (None: it is)."""
    if node.index in costed:
        return None
    if node.op_type not in RULES:
        return "no cost rule"
    read = [t for t in node.inputs if t not in graph.const] if node.op_type in INPUT_RULES \
        else node.inputs + node.outputs
    if any(graph.shapes.get(t) is None for t in read if t):
        return "unknown shapes"
    return None


def _estimate(graph: OpGraph, node: Node, data: int) -> tuple[float | None, int]:
    """(estimated FLOPs or None, guessed elements of its outputs) of an op that could not be costed;
    ``data``: the elements of its largest data input (0: unknown)."""
    weight = graph.shapes.get(node.inputs[1]) if len(node.inputs) > 1 and node.inputs[1] else None
    if data and weight and len(weight) >= 2 and node.op_type in _MATMULS | _GEMMS | _CONVS:
        # k: input features; n: multiply-adds per input element; features: output features
        if node.op_type in _GEMMS:
            k, features = (weight[1], weight[0]) if node.attr("transB", 0) else (weight[0], weight[1])
            n = features
        elif node.op_type in _CONVS:
            group = max(node.attr("group", 1), 1)
            k, features = weight[1] * group, weight[0]
            n = weight[0] * numel_of(weight[2:]) // group
        else:
            k, features = weight[-2], weight[-1]
            n = features
        return 2.0 * data * n, data * features // max(k, 1)
    outputs = [graph.numel(t) for t in node.outputs if t]
    largest = max([data] + [n for n in outputs if n], default=0)
    if not largest:
        return None, 0
    return float(FLOPS_PER_ELEMENT.get(node.op_type, 1) * largest), data or largest
