"""Pipeline stages as standalone ONNX models (``planner split``).

A plan's stage ``i`` covers layers ``first_layer..last_layer``; the layers name the ONNX nodes they hold
(``Layer.ops[k].name``: the node's label, planner.graph.ir.node_labels). Every node of the model goes to exactly
one stage:

1. a node named by a layer goes to that layer's stage;
2. ``Constant`` nodes are copied into every stage that reads them (they carry no weights);
3. any other node goes to the earliest stage that reads its outputs (so a mask or position computation
   runs next to its first user and is handed on from there), or, when only graph outputs read it, to the
   latest stage among its producers;
4. a node whose outputs nothing reads is dropped;
5. data flow wins: a node that reads a tensor made in a later stage moves to that stage (a shape query
   the importer counted with an earlier layer, say). A stage left with nothing to compute is refused:
   the plan's layers were not in graph order. A stage's inputs are the original model inputs it
reads, the weights it reads (initializers become graph inputs of the same name, type and shape: their data
is never read or copied, so external-data files stay where they are), and the boundary tensors made by
earlier stages: every tensor a later stage reads, skip connections and attention masks included. Its
outputs are the tensors later stages read plus the model outputs it makes. Running the stages in order,
feeding each the tensors the earlier ones returned, computes exactly the whole model.

Initializers that are not weights -- integer tensors (shapes, axes, indices) and one-element floats
(scales, epsilons) -- are copied into the stages that read them, so a stage needs no constants from outside.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Collection, Iterable, Sequence

import onnx
from onnx import TensorProto, helper

from planner.errors import ModelError, PlannerError
from planner.graph.ir import node_labels

log = logging.getLogger(__name__)

INPUT, WEIGHT, BOUNDARY = "input", "weight", "boundary"
_FLOAT_TYPES = {TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.BFLOAT16, TensorProto.DOUBLE}


@dataclass(frozen=True)
class StageInput:
    name: str
    kind: str  # INPUT (an input of the whole model), WEIGHT (an initializer) or BOUNDARY
    from_stage: int | None = None  # the stage that makes a boundary tensor


@dataclass(frozen=True)
class StageOutput:
    name: str
    to_stages: tuple[int, ...]  # later stages that read it
    model_output: bool  # an output of the whole model


@dataclass(frozen=True)
class StageModel:
    index: int
    model: onnx.ModelProto
    inputs: tuple[StageInput, ...]
    outputs: tuple[StageOutput, ...]
    num_nodes: int


def subgraph_inputs(node: onnx.NodeProto) -> list[str]:
    """The tensors a node reads: its inputs, plus outer-scope names its subgraphs (If/Loop/Scan bodies) read."""
    names = [t for t in node.input if t]
    for attr in node.attribute:
        graphs = list(attr.graphs) + ([attr.g] if attr.HasField("g") else [])
        for graph in graphs:
            local = {i.name for i in graph.input} | {i.name for i in graph.initializer}
            for inner in graph.node:
                for t in subgraph_inputs(inner):
                    if t not in local:
                        names.append(t)
                local.update(o for o in inner.output if o)
    return list(dict.fromkeys(names))


def _topological(nodes: Sequence[onnx.NodeProto], producer: dict[str, int]) -> list[int]:
    """Node indices in a topological order (file order among ready nodes)."""
    waiting = [0] * len(nodes)
    users: dict[int, list[int]] = {}
    for i, node in enumerate(nodes):
        deps = {producer[t] for t in subgraph_inputs(node) if t in producer}
        waiting[i] = len(deps)
        for d in deps:
            users.setdefault(d, []).append(i)
    ready = sorted((i for i in range(len(nodes)) if waiting[i] == 0), reverse=True)
    order: list[int] = []
    while ready:
        i = ready.pop()
        order.append(i)
        for u in users.get(i, ()):
            waiting[u] -= 1
            if waiting[u] == 0:
                ready.append(u)
        ready.sort(reverse=True)
    if len(order) != len(nodes):
        stuck = next(i for i in range(len(nodes)) if waiting[i] > 0)
        raise ModelError(f"node '{nodes[stuck].name or nodes[stuck].op_type}' is on a cycle; the graph is not "
                         "valid ONNX")
    return order


def assign_stages(graph: onnx.GraphProto, stage_nodes: Sequence[Collection[str]]) -> dict[int, int]:
    """Stage of each node index of ``graph`` (Constant nodes and dead nodes are left out). ``stage_nodes[s]``
    labels (planner.graph.ir.node_labels) the nodes that the plan puts in stage ``s``."""
    nodes = list(graph.node)
    labels = node_labels(nodes)
    producer = {t: i for i, node in enumerate(nodes) for t in node.output if t}
    order = _topological(nodes, producer)
    consumers: dict[int, list[int]] = {}
    for i, node in enumerate(nodes):
        for t in subgraph_inputs(node):
            if t in producer:
                consumers.setdefault(producer[t], []).append(i)
    by_name: dict[str, int] = {}
    for stage, names in enumerate(stage_nodes):
        for name in names:
            if name in by_name and by_name[name] != stage:
                raise PlannerError(f"node '{name}' is placed in stages {by_name[name]} and {stage}; a node belongs "
                                   "to one layer")
            by_name[name] = stage
    outputs = {o.name for o in graph.output}
    stage_of: dict[int, int] = {}
    pending: list[int] = []
    waiting: set[int] = set()
    # reverse topological order: a free node joins the earliest stage that reads it
    for i in reversed(order):
        node = nodes[i]
        if node.op_type == "Constant" and not node.input:
            continue
        if labels[i] in by_name:
            stage_of[i] = by_name[labels[i]]
            continue
        readers = [stage_of[c] for c in consumers.get(i, ()) if c in stage_of]
        needed = any(c in stage_of or c in waiting for c in consumers.get(i, ())) or any(
            t in outputs for t in node.output)
        if readers:
            stage_of[i] = min(readers)
        elif needed:
            pending.append(i)
            waiting.add(i)
    # forward: nodes only graph outputs read join the latest stage among their producers
    for i in reversed(pending):  # pending was filled in reverse topological order
        producers = [stage_of[producer[t]] for t in subgraph_inputs(nodes[i])
                     if t in producer and producer[t] in stage_of]
        stage_of[i] = max(producers, default=0)
    # data flow wins: a node that reads a tensor of a later stage moves to that stage (and its readers with it)
    moved = 0
    for i in order:
        if i not in stage_of:
            continue
        latest = max((stage_of[producer[t]] for t in subgraph_inputs(nodes[i])
                      if t in producer and producer[t] in stage_of), default=0)
        if latest > stage_of[i]:
            stage_of[i] = latest
            moved += 1
    if moved:
        log.info("%d nodes read tensors of a later stage than their layer's and moved to that stage", moved)
    named = [i for i in stage_of if labels[i] in by_name]
    planned = {by_name[labels[i]] for i in named}
    kept = {stage_of[i] for i in named if stage_of[i] == by_name[labels[i]]}
    emptied = sorted(planned - kept)
    if emptied:
        raise PlannerError(f"stage {emptied[0]}: every node of its layers reads tensors of a later stage, so the "
                           "plan's layers are not in graph order and this split cannot run")
    return stage_of


def is_constant_initializer(tensor: TensorProto) -> bool:
    """Shapes, axes, indices and scalars, not weights (see the module docstring)."""
    if tensor.data_location == TensorProto.EXTERNAL:
        return False
    numel = 1
    for d in tensor.dims:
        numel *= d
    return tensor.data_type not in _FLOAT_TYPES or numel <= 1


def _tensor_types(model: onnx.ModelProto) -> dict[str, onnx.ValueInfoProto]:
    try:
        inferred = onnx.shape_inference.infer_shapes(model, strict_mode=False)
    except Exception as exc:  # onnx raises several types (InferenceError, ValidationError, RuntimeError)
        raise ModelError(f"ONNX shape inference failed ({exc}); the stage boundaries need tensor types") from exc
    graph = inferred.graph
    types = {v.name: v for v in list(graph.value_info) + list(graph.output) + list(graph.input)}
    for init in model.graph.initializer:
        types.setdefault(init.name, helper.make_tensor_value_info(init.name, init.data_type, list(init.dims)))
    return types


def split_model(model: onnx.ModelProto, stage_nodes: Sequence[Collection[str]]) -> list[StageModel]:
    """One standalone ONNX model per stage (see the module docstring). ``model`` is not modified."""
    graph = model.graph
    nodes = list(graph.node)
    stage_of = assign_stages(graph, stage_nodes)
    count = len(stage_nodes)
    producer = {t: i for i, node in enumerate(nodes) for t in node.output if t}
    constants = {t: i for i, node in enumerate(nodes) if node.op_type == "Constant" and not node.input
                 for t in node.output}
    initializers = {t.name: t for t in graph.initializer}
    graph_inputs = [i.name for i in graph.input if i.name not in initializers]
    model_outputs = [o.name for o in graph.output]
    types = _tensor_types(model)
    order = _topological(nodes, producer)
    members = [[i for i in order if stage_of.get(i) == s] for s in range(count)]
    reads = [[t for i in members[s] for t in subgraph_inputs(nodes[i])] for s in range(count)]
    made_in = {t: stage_of[producer[t]] for t in producer if producer[t] in stage_of}
    readers: dict[str, set[int]] = {}
    for s in range(count):
        for t in reads[s]:
            if made_in.get(t, s) < s:
                readers.setdefault(t, set()).add(s)
    for name in model_outputs:
        if name not in made_in and name not in initializers and name not in graph_inputs:
            raise ModelError(f"model output '{name}' is made by no node")

    stages: list[StageModel] = []
    for s in range(count):
        own = {t for i in members[s] for t in nodes[i].output if t}
        inputs: list[StageInput] = []
        initializer_copies: list[TensorProto] = []
        constant_nodes: list[int] = []
        seen: set[str] = set()
        for t in reads[s]:
            if t in own or t in seen:
                continue
            seen.add(t)
            if t in constants:
                constant_nodes.append(constants[t])
            elif t in initializers:
                if is_constant_initializer(initializers[t]):
                    initializer_copies.append(initializers[t])
                else:
                    inputs.append(StageInput(t, WEIGHT))
            elif t in made_in:
                inputs.append(StageInput(t, BOUNDARY, made_in[t]))
            else:
                inputs.append(StageInput(t, INPUT))
        outputs = []
        for t in sorted(own, key=lambda name: (producer[name], name)):
            later = tuple(sorted(readers.get(t, ())))
            if later or t in model_outputs:
                outputs.append(StageOutput(t, later, t in model_outputs))
        if not outputs:
            raise PlannerError(f"stage {s} makes nothing that a later stage or the model's outputs need: its "
                               "layers compute nothing, or they are not in graph order (every node of them reads "
                               "a later stage's tensors); give each stage layers in graph order")
        stage_graph = helper.make_graph(
            nodes=[nodes[i] for i in sorted(set(constant_nodes), key=order.index)] + [nodes[i] for i in members[s]],
            name=f"{graph.name or 'model'}_stage_{s}",
            inputs=[_value_info(types, i.name) for i in _ordered_inputs(inputs, graph_inputs)],
            outputs=[_value_info(types, o.name) for o in outputs],
            initializer=initializer_copies,
        )
        stage_model = helper.make_model(stage_graph, opset_imports=list(model.opset_import),
                                        producer_name="planner split")
        stage_model.ir_version = model.ir_version
        stage_model.functions.extend(model.functions)
        try:
            onnx.checker.check_model(stage_model)
        except onnx.checker.ValidationError as exc:
            raise ModelError(f"stage {s} is not a valid ONNX model ({exc})") from exc
        stages.append(StageModel(s, stage_model, tuple(_ordered_inputs(inputs, graph_inputs)), tuple(outputs),
                                 len(members[s])))
    return stages


def _ordered_inputs(inputs: Iterable[StageInput], graph_inputs: list[str]) -> list[StageInput]:
    """Model inputs in the model's order, then boundary tensors by producing stage, then weights."""
    rank = {name: k for k, name in enumerate(graph_inputs)}
    kind_rank = {INPUT: 0, BOUNDARY: 1, WEIGHT: 2}
    indexed = list(inputs)
    return sorted(indexed, key=lambda i: (kind_rank[i.kind], rank.get(i.name, 0), i.from_stage or 0,
                                          indexed.index(i)))


def _value_info(types: dict[str, onnx.ValueInfoProto], name: str) -> onnx.ValueInfoProto:
    info = types.get(name)
    if info is None or not info.type.HasField("tensor_type") and not info.type.HasField("sequence_type"):
        raise ModelError(f"tensor '{name}' crosses a stage boundary but ONNX shape inference gives it no type")
    copy = onnx.ValueInfoProto()
    copy.CopyFrom(info)
    copy.name = name
    return copy
