"""Recognise transformer blocks: their dimensions and the Megatron tensor-parallel split of each op.

A block is a transformer block when it holds a Softmax over attention scores ``[..., heads, s_q, s_k]``
fed by a MatMul (or Einsum), or an ONNX ``Attention`` node (opset 23), whose Q, K, V shapes and attributes
give ``heads``, ``seq_len``, ``head_dim``, ``v_head_dim``, its key/value heads and ``causal``
(``is_causal`` or a fixed ``[s, s]`` mask). Then (per sample, from shapes):

* ``hidden`` = last dim of the block's output; ``seq_len`` = the score's last dim;
* ``heads`` = the score's head dim (or its leading dim / batch when heads are folded into the batch);
* ``ffn`` = the input width of the last weighted MatMul that maps back to ``hidden`` from a wider tensor
  (FC2 / down projection);
* ``head_dim`` = the width per head of Q and K (the last dim of Q in Q·Kᵀ), ``v_head_dim`` that of V (of V
  in P·V); ``hidden / heads`` where the products do not show them;
* ``kv_heads`` = width of the K projection (the weighted MatMul the key operand of Q·Kᵀ comes from) /
  head_dim, where it is not fused with Q; else the narrowest projection narrower than Q / head_dim;
  ``heads`` where keys and values are up-projected per head from a low-rank latent (DeepSeek's multi-head
  latent attention: a weighted MatMul from a width below ``hidden`` to a wider one that is not ``hidden``);
* ``gated_mlp`` when two weighted MatMuls map ``hidden`` to ``ffn`` (SwiGLU's gate and up projections), or
  one maps it to ``2 ffn`` (the two fused); ``dropout`` when the block has a Dropout node;
* ``causal`` when the scores are masked by a tensor that does not depend on the inputs, a ``[s, s]`` mask the
  graph fixes (the causal triangle, from ``Trilu`` or a stored buffer), not a padding mask computed per sample.

Attention core (:func:`attention_core`): the Q·Kᵀ product feeding the Softmax (a MatMul of two activations),
the nodes on the score path from it to the Softmax (scale, mask), the Softmax, the nodes between the Softmax
and the product with V (its dropout), and that product; or the ``Attention`` node, which is all of them.
These are what Korthikanti et al. 2022 (Sec. 5) and Megatron-LM's ``--recompute-granularity selective``
re-run (``CoreAttention``), found by structure, never by tensor size.

Megatron split: weighted MatMuls that read the full hidden tensor are "column" (QKV, FC1, gate/up); the
weighted MatMuls that produce hidden from the split tensor are "row" (attention out, FC2); everything computed
from a column output before a row MatMul is "sharded"; the rest (norms, residual adds, dropout on hidden)
is "replicated", as are multi-head latent attention's down-projections to its latents (every rank computes
them whole, and the up-projections that read the latents are "column").
"""

from __future__ import annotations

from dataclasses import dataclass

from planner.graph.ir import Node, OpGraph
from planner.graph.rules import attention_shape, einsum_terms, einsum_weight_slot
from planner.types import TransformerDims


def weighted_matmul(graph: OpGraph, node: Node) -> bool:
    """A matrix product of an activation and a weight: MatMul/Gemm with a weight second, an Einsum of two
    operands one of which is a weight."""
    if node.op_type == "Einsum":
        return einsum_weight_slot(node, graph) is not None
    return node.op_type in ("MatMul", "Gemm") and len(node.inputs) > 1 and node.inputs[1] in graph.param_roots


@dataclass(frozen=True)
class _Core:
    """What a block's attention shows: query heads, key length, widths per head of Q/K and of V (0: not
    shown), the node whose inputs 0 and 1 are Q and K (Q·Kᵀ or the fused Attention node), key/value heads
    where the attention op says them (0: to be read from the projections), and a causal mask."""

    heads: int
    seq: int
    head_dim: int
    v_head_dim: int
    product: Node | None
    kv_heads: int
    causal: bool


def _attention(graph: OpGraph, members: list[Node]) -> _Core | None:
    """The first attention among ``members``: a Softmax over scores ``[..., heads, s_q, s_k]`` computed from
    a product of two activations, or an ONNX ``Attention`` node with known shapes."""
    inside = {node.index for node in members}
    for node in members:
        if node.op_type == "Attention":
            shape = attention_shape(node, graph)
            if shape is None:
                continue
            mask = node.inputs[3] if len(node.inputs) > 3 else ""
            return _Core(shape.q_heads, shape.kv_seq, shape.head_dim, shape.v_head_dim, node, shape.kv_heads,
                         shape.causal or _fixed_mask(graph, mask, shape.kv_seq))
        if node.op_type != "Softmax":
            continue
        scores = graph.shapes.get(node.inputs[0])
        if scores is None or len(scores) < 3 or scores[-1] <= 1 or \
                not _from_matmul(graph, graph.producer.get(node.inputs[0])):
            continue
        seq = scores[-1]
        heads = scores[-3] if len(scores) >= 4 else scores[0] // max(graph.static_batch, 1)
        path = _score_path(graph, graph.producer.get(node.inputs[0])) or []
        after = _probability_path(graph, node.outputs[0], inside) if node.outputs else None
        return _Core(heads, seq, _operand_width(graph, path[0], 0) if path else 0,
                     _operand_width(graph, after[-1], 1) if after else 0,
                     graph.nodes[path[0]] if path else None, 0,
                     any(_static_mask(graph, graph.nodes[i], seq) for i in path))
    return None


def detect_dims(graph: OpGraph, members: list[Node], output: str | None,
                mlp_ffn: int | None = None) -> TransformerDims | None:
    """The block's dims; ``mlp_ffn``: a known (gated) MLP width (a mixture of experts' active width), in
    place of the one read from the MLP's projections."""
    core = _attention(graph, members)
    if core is None:
        return None
    out_shape = graph.shapes.get(output) if output else None
    if not out_shape:
        return None
    hidden = out_shape[-1]
    heads, seq = core.heads, core.seq
    ffn = 0
    latent = False
    widths: list[int] = []
    for node in members:
        kn = _weight_kn(graph, node)
        if kn is None:
            continue
        k, n = kn
        if n == hidden and k > hidden:
            ffn = k
        if k == hidden:
            widths.append(n)
        elif k < hidden and n > k and n != hidden:
            latent = True  # an up-projection from a low-rank latent (multi-head latent attention)
    if mlp_ffn:
        ffn = mlp_ffn
    elif not ffn:
        ffn = max((n for n in widths if n != hidden and n != 3 * hidden), default=4 * hidden)
    inside = {node.index for node in members}
    default = hidden // heads if heads else 0
    head_dim = core.head_dim or default
    v_head_dim = core.v_head_dim or head_dim
    kv_heads = heads
    key_width = _projection_width(graph, core.product, inside) if core.product is not None else 0
    narrow = [n for n in widths if n < heads * head_dim and n != ffn]  # narrower than the query projection
    if key_width and head_dim and key_width % head_dim == 0:
        kv_heads = key_width // head_dim
    elif core.kv_heads:
        kv_heads = core.kv_heads
    elif narrow and head_dim:
        kv_heads = min(narrow) // head_dim or heads
    if kv_heads and (latent or heads % kv_heads):
        kv_heads = heads  # keys and values come per head from a shared latent, not from narrow K/V heads
    gated = bool(mlp_ffn) or (ffn != hidden and (widths.count(ffn) >= 2 or 2 * ffn in widths))
    dropout = any(node.op_type == "Dropout" for node in members)
    return TransformerDims(hidden=hidden, heads=heads, seq_len=seq, ffn=ffn, kv_heads=kv_heads, gated_mlp=gated,
                           dropout=dropout, causal=core.causal, head_dim=head_dim, v_head_dim=v_head_dim)


def _feeding_projections(graph: OpGraph, tensor: str, inside: set[int]) -> set[int]:
    """The weighted MatMuls of the block (node indices in ``inside``) that ``tensor`` is computed from through
    ops without weights (reshapes, transposes, norms, slices, rotary embedding), not past them."""
    found: set[int] = set()
    stack, seen = [tensor], set()
    while stack and len(seen) < 64:  # a bound on the walk: these chains are a few ops long
        index = graph.producer.get(stack.pop())
        if index is None or index in seen or index not in inside:
            continue
        seen.add(index)
        node = graph.nodes[index]
        if weighted_matmul(graph, node):
            found.add(index)
            continue
        stack.extend(t for t in node.inputs if t and t not in graph.const)
    return found


def _projection_width(graph: OpGraph, product: Node, inside: set[int]) -> int:
    """The output width of the weighted MatMul the key operand of Q·Kᵀ (``product``) comes from, through the
    ops between (transposes, reshapes, rotary embedding, the repeat of grouped K heads): ``kv_heads x
    head_dim``; 0 where that projection is not found, or also feeds the queries (a fused QKV projection)."""
    if product.op_type not in ("MatMul", "Einsum", "Attention") or len(product.inputs) < 2:
        return 0
    keys = _feeding_projections(graph, product.inputs[1], inside)
    queries = _feeding_projections(graph, product.inputs[0], inside)
    if len(keys) != 1 or keys & queries:
        return 0
    w = graph.shapes.get(graph.nodes[next(iter(keys))].outputs[0])
    return int(w[-1]) if w else 0


def _operand_width(graph: OpGraph, index: int, slot: int) -> int:
    """The last dim of input ``slot`` of the attention product ``index`` (Q of Q·Kᵀ: the key width per head;
    V of P·V: the value width per head), 0 where it is not a MatMul with that shape known."""
    node = graph.nodes[index]
    shape = graph.shapes.get(node.inputs[slot]) if node.op_type == "MatMul" and len(node.inputs) > slot else None
    return int(shape[-1]) if shape and len(shape) >= 2 else 0


def _static_mask(graph: OpGraph, node: Node, seq: int) -> bool:
    """Does ``node`` (on the score path) mask the scores with a ``[.., s, s]`` tensor fixed by the graph?"""
    return node.op_type in ("Where", "Add") and any(_fixed_mask(graph, t, seq) for t in node.inputs)


def _fixed_mask(graph: OpGraph, tensor: str, seq: int) -> bool:
    """Is ``tensor`` a ``[.., s, s]`` mask that does not depend on the inputs (the causal triangle)?"""
    shape = graph.shapes.get(tensor) if tensor else None
    return tensor in graph.const and shape is not None and len(shape) >= 2 and shape[-1] == seq \
        and shape[-2] == seq and seq > 1


ATTENTION_CORE = "attention-core"
_PASS_THROUGH = 6  # nodes followed between the softmax and an attention product (scale, mask, casts, dropout)


def _score_path(graph: OpGraph, index: int | None, depth: int = _PASS_THROUGH) -> list[int] | None:
    """The nodes from an activation-by-activation MatMul up to (and including) node ``index``, following
    data inputs backwards (scaling, masking, casts), or None if no such product feeds it."""
    if index is None or depth < 0:
        return None
    node = graph.nodes[index]
    if node.op_type in ("MatMul", "Einsum"):
        return None if weighted_matmul(graph, node) else [index]
    for tensor in (t for t in node.inputs if t and t not in graph.const):
        path = _score_path(graph, graph.producer.get(tensor), depth - 1)
        if path is not None:
            return path + [index]
    return None


def _probability_path(graph: OpGraph, tensor: str, members: set[int]) -> list[int] | None:
    """The nodes from the consumer of the softmax output ``tensor`` down to (and including) the product
    with V, through single-consumer pass-through nodes (dropout, casts)."""
    path: list[int] = []
    for _ in range(_PASS_THROUGH):
        users = [u for u in graph.consumers.get(tensor, ()) if u in members]
        if len(users) != 1:
            return None
        node = graph.nodes[users[0]]
        path.append(node.index)
        if node.op_type in ("MatMul", "Einsum"):
            return None if weighted_matmul(graph, node) else path
        outputs = [t for t in node.outputs if t]
        if not outputs:
            return None
        tensor = outputs[0]  # Dropout's first output is the data, the second its mask
    return None


def attention_core(graph: OpGraph, members: list[Node]) -> dict[int, str]:
    """``{node index: ATTENTION_CORE}`` for the attention core of every softmax over Q·Kᵀ in ``members``."""
    inside = {node.index for node in members}
    roles: dict[int, str] = {}
    for node in members:
        if node.op_type == "Attention" and attention_shape(node, graph) is not None:
            roles[node.index] = ATTENTION_CORE  # the fused core itself
            continue
        if node.op_type != "Softmax" or not node.outputs:
            continue
        before = _score_path(graph, graph.producer.get(node.inputs[0]))
        after = _probability_path(graph, node.outputs[0], inside)
        if before is None or after is None:
            continue
        for index in before + [node.index] + after:
            if index in inside:
                roles[index] = ATTENTION_CORE
    return roles


def _from_matmul(graph: OpGraph, index: int | None, depth: int = 6) -> bool:
    """Is the tensor computed (through scaling, masking, casts) from a MatMul of two activations?"""
    while index is not None and depth > 0:
        node = graph.nodes[index]
        if node.op_type in ("MatMul", "Einsum"):
            return not weighted_matmul(graph, node)
        data = [t for t in node.inputs if t and t not in graph.const]
        if not data:
            return False
        index = graph.producer.get(data[0])
        depth -= 1
        # masking (Add/Where) may put the scores in a later slot
        if node.op_type in ("Add", "Where") and len(data) > 1:
            return any(_from_matmul(graph, graph.producer.get(t), depth) for t in data)
    return False


def _weight_kn(graph: OpGraph, node: Node) -> tuple[int, int] | None:
    """(input width, output width) of a weighted MatMul, Gemm or Einsum whose weight is a known matrix,
    else None (an Einsum's: the weight's index summed against the activation, and the one the output keeps)."""
    if not weighted_matmul(graph, node):
        return None
    if node.op_type == "Einsum":
        return _einsum_weight_kn(graph, node)
    w = graph.shapes.get(node.inputs[1])
    if not w or len(w) != 2:
        return None
    return (w[1], w[0]) if node.op_type == "Gemm" and node.attr("transB", 0) else (w[0], w[1])


def _einsum_weight_kn(graph: OpGraph, node: Node) -> tuple[int, int] | None:
    slot = einsum_weight_slot(node, graph)
    parsed = einsum_terms(node, graph)
    if slot is None or parsed is None:
        return None
    terms, out, sizes = parsed
    weight, data = terms[slot], terms[1 - slot]
    summed = [c for c in weight if c in data and c not in out]
    kept = [c for c in weight if c not in data and c in out]
    if len(weight) != 2 or len(summed) != 1 or len(kept) != 1:
        return None  # not a plain [in, out] matrix (a batch of experts' matrices, say)
    return sizes[summed[0]], sizes[kept[0]]


def _latent_down_projections(graph: OpGraph, members: list[Node], hidden: int) -> set[int]:
    """The weighted MatMuls from ``hidden`` to a latent that an up-projection (from a width other than
    ``hidden`` to a wider one that is not ``hidden``) reads, through norms and slices: multi-head
    latent attention's query and key/value down-projections. Megatron-Core runs them whole on every
    tensor-parallel rank (``linear_q_down_proj`` / ``linear_kv_down_proj`` as duplicated linears; the latent
    is normalised whole) and splits the up-projections by columns, so no all-reduce follows them."""
    inside = {node.index for node in members}
    found: set[int] = set()
    for node in members:
        kn = _weight_kn(graph, node)
        if kn is None or not (kn[0] != hidden and kn[1] != hidden and kn[1] > kn[0]):
            continue
        found |= {i for i in _feeding_projections(graph, node.inputs[0], inside)
                  if (_weight_kn(graph, graph.nodes[i]) or (0, 0))[0] == hidden}
    return found


def tp_splits(graph: OpGraph, members: list[Node], dims: TransformerDims,
              replicated: set[int] | None = None, weighted: set[int] | None = None) -> dict[int, str]:
    """Megatron split of every member node, by node index; ``replicated``: weighted MatMuls every rank
    computes whole (a mixture of experts' router, whose scores pick the tokens of the split experts);
    ``weighted``: MatMuls on weights computed from parameters by data-dependent gathers (routed experts),
    split like weighted MatMuls."""
    keep = (replicated or set()) | _latent_down_projections(graph, members, dims.hidden)
    also = weighted or set()
    split: set[str] = set()  # tensors split across tensor-parallel ranks
    out: dict[int, str] = {}
    for node in members:
        data = [t for t in node.inputs if t and t not in graph.const]
        on_split = any(t in split for t in data)
        if node.index in keep:
            out[node.index] = "replicated"
            continue
        if node.index in also or weighted_matmul(graph, node):
            kind = "row" if on_split else "column"
            out[node.index] = kind
            if kind == "column":
                split.update(t for t in node.outputs if t)
            continue
        if on_split:
            out[node.index] = "sharded"
            split.update(t for t in node.outputs if t)
        else:
            out[node.index] = "replicated"
    return out


def output_layer_tensors(graph: OpGraph, members: list[Node]) -> set[str]:
    """The tensors a head computes from its output layer: the outputs of its last weighted products (those
    no other weighted product of the head reads from, directly or through other ops) and every tensor
    computed from them. Megatron-Core's output layer is a ``ColumnParallelLinear`` with
    ``gather_output=False`` (``megatron/core/models/gpt/gpt_model.py``), so these are split over the
    vocabulary across the tensor-parallel ranks; a projection before it (BERT's LM-head transform, a plain
    linear layer in Megatron-Core's ``BertLMHead``) and the norms are computed whole on every rank."""
    inside = {node.index for node in members}
    products = {node.index for node in members if weighted_matmul(graph, node)}
    feeds_product: set[int] = set()  # nodes whose outputs reach a weighted product of the head
    for node in sorted(members, key=lambda n: n.index, reverse=True):
        users = {u for t in node.outputs if t for u in graph.consumers.get(t, ()) if u in inside}
        if users & (products | feeds_product):
            feeds_product.add(node.index)
    split: set[str] = set()
    for node in sorted(members, key=lambda n: n.index):  # topological order
        last_product = node.index in products and node.index not in feeds_product
        if last_product or any(t in split for t in node.inputs if t):
            split.update(t for t in node.outputs if t)
    return split
