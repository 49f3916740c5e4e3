"""Stage contracts: the small frozen data classes that flow between the pipeline's boxes.

    MODEL.onnx --graph/--> LayerGraph (+ EmbeddingTable)      hardware_profiles/ --hardware/--> Cluster
                                  \\                                   /
                                   cost/ --> Estimate  <-- ParallelConfig
                                                 |
                                             search/ --> Plan (planner.plans)

A reader learns the whole pipeline from this file. Nothing here computes much; every stage takes these
objects and never mutates them.

Conventions
-----------
* Units are in the names: ``_s`` seconds, ``_bytes`` bytes, ``_Bps`` bytes per second, ``flops`` counts
  floating-point operations (a multiply-add is 2), ``_flops_per_s`` FLOP/s.
* Per-layer numbers in :class:`Layer` and :class:`OpCost` are for ONE sample (batch dimension = 1) of the
  bound dimensions; they scale linearly with the micro-batch. ``LayerGraph.batch`` records the batch the user
  bound (``--dim batch=N``), which ``inspect`` multiplies back in for its report.
* Training numerics: the importer sizes float tensors at 2 bytes (bf16); the cost model rescales them to the
  training dtype (``ParallelConfig.dtype``) and lays out weights, gradients and optimizer states as the
  runtime keeps them (``planner.cost.memory``).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import Any, Mapping

import numpy as np

from planner.arguments import degree, whole
from planner.errors import ConfigError
from planner.runtime import DEFAULT_RUNTIME

# ----------------------------------------------------------------------------------------------- graph


@dataclass(frozen=True)
class OpCost:
    """Forward cost of one ONNX node, for one sample (a fused ``Attention`` node: one per kernel of the graph
    it fuses, Q·Kᵀ, softmax and P·V, each named after the node).

    ``gemm`` is the (m, n, k) of the node's matrix product where it has one (MatMul, Gemm, Conv as
    implicit GEMM), with every batch-like dimension folded into ``m`` for ONE sample; the cost model uses
    it for size-dependent efficiency. ``tp_split`` says how Megatron-style tensor parallelism splits it:
    ``"column"`` (output features split, no communication), ``"row"`` (input features split; an all-reduce of
    its output follows), ``"sharded"`` (element-wise work on an already-split tensor, divided by tp) or
    ``"replicated"`` (every tensor-parallel rank does all of it). ``role`` is what the op does in its
    transformer block where the importer knows it: ``"attention-core"`` for the two activation-by-activation
    products of attention (Q·Kᵀ, probabilities·V) and the operations on the score path between them
    (scale, mask, softmax, dropout): what Megatron-LM's selective recompute re-runs and FlashAttention fuses.
    Byte counts are at the importer's 2-byte activation width (``planner.graph.ir.ACT_BYTES``); the cost
    model rescales them to the training dtype.
    """

    name: str
    op_type: str
    flops: float
    bytes_read: float
    bytes_written: float
    gemm: tuple[int, int, int] | None = None
    tp_split: str = "replicated"
    role: str = ""


@dataclass(frozen=True)
class TransformerDims:
    """Shape of a transformer block, where the importer recognised one (the cost and memory models use it
    for tensor-parallel divisibility and the activation formulas of ``planner.cost.memory``).

    ``gated_mlp``: the MLP multiplies two ``ffn``-wide projections of its input (SwiGLU, GeGLU), so both are
    saved for backward; ``dropout``: the block has dropout (masks saved for backward); ``causal``: the scores
    are masked by a fixed causal mask (FlashAttention skips the masked half). The defaults are the GPT block
    Korthikanti et al. 2022 count: GELU MLP, dropout, causal."""

    hidden: int
    heads: int
    seq_len: int
    ffn: int
    kv_heads: int | None = None
    gated_mlp: bool = False
    dropout: bool = True
    causal: bool = True
    # width per head of queries and keys, and of values (0: hidden / heads); wider heads than hidden / heads
    # (Gemma), or keys wider than values (multi-head latent attention: 192 against 128)
    head_dim: int = 0
    v_head_dim: int = 0

    @property
    def key_dim(self) -> float:
        """Width per head of queries and keys (``head_dim``, else hidden / heads)."""
        return self.head_dim or self.hidden / self.heads

    @property
    def value_dim(self) -> float:
        """Width per head of values (``v_head_dim``, else the key width)."""
        return self.v_head_dim or self.key_dim


@dataclass(frozen=True)
class MoEDims:
    """A mixture-of-experts MLP, where the importer found one (a router GEMM to ``experts`` scores, a TopK,
    and expert weights downstream of it).

    ``experts``: routed experts in the layer; ``top_k``: experts each token is sent to; ``shared_experts``:
    experts every token goes through, as multiples of ``expert_ffn`` (0: none); ``expert_ffn``: inner width
    of one expert's MLP (elements); ``router``: the scoring before the TopK (``"softmax"``, ``"sigmoid"`` or
    ``"none"``); ``expert_params``: parameters of all routed experts of the layer (elements; the layer's
    ``params`` include them); ``tokens``: tokens per sample the router scores (the sequence length of a
    decoder). The layer's FLOPs and the expert ops' costs are the routed ones: ``tokens * top_k`` rows through
    one expert's weights, not every token through every expert."""

    experts: int
    top_k: int
    shared_experts: int
    expert_ffn: int
    router: str
    expert_params: int
    tokens: int

    @property
    def active_expert_params(self) -> int:
        """Routed-expert parameters one token uses: ``top_k`` of the ``experts``."""
        return self.expert_params * self.top_k // max(self.experts, 1)


@dataclass(frozen=True)
class Layer:
    """One pipeline unit (an embedding, a transformer block, a head, an MLP layer...). Numbers per sample."""

    index: int
    name: str
    kind: str  # "embedding" | "block" | "head" | "mlp" | "other"
    params: int
    flops_forward: float
    activation_bytes: float  # saved for backward, tp=1, no recompute
    output_bytes: float  # the boundary tensor(s) handed to the next layer
    ops: tuple[OpCost, ...] = ()
    transformer: TransformerDims | None = None
    input_bytes: float = 0.0  # boundary tensor(s) received from the previous layer
    moe: MoEDims | None = None  # its mixture-of-experts MLP, where it has one
    # weights this layer reads that an earlier layer owns (and counts in its params), as (owner index,
    # parameters): a tied LM head reads the word embedding. A stage holding this layer but not its owner keeps
    # a copy (planner.cost.memory.stage_tied_params)
    tied_params: tuple[tuple[int, int], ...] = ()
    # of activation_bytes: what a head saves of its output layer's product and of what it computes from it
    # (the logits, split over the vocabulary by tensor parallelism), and the integer and boolean tensors it
    # saves (token indices, which every tensor-parallel rank keeps whole); planner.cost.memory, "Activations
    # of the embedding and the output layer"
    logit_activation_bytes: float = 0.0
    integer_activation_bytes: float = 0.0

    @property
    def active_params(self) -> int:
        """Parameters one token uses: all but the routed experts it is not sent to."""
        if self.moe is None:
            return self.params
        return self.params - self.moe.expert_params + self.moe.active_expert_params


@dataclass(frozen=True)
class EmbeddingTable:
    """A sparse embedding table (rows x dim), looked up ``pooling_factor`` times per sample."""

    name: str
    rows: int
    dim: int
    pooling_factor: float = 1.0
    dtype_bytes: int = 4  # stored precision of the table (fp32 unless stated)


@dataclass(frozen=True)
class LayerGraph:
    """An imported model: ordered pipeline units plus its embedding tables."""

    name: str
    layers: tuple[Layer, ...]
    embedding_tables: tuple[EmbeddingTable, ...] = ()
    batch: int = 1  # the bound batch (micro-batch) dimension used for reporting
    dims: tuple[tuple[str, int], ...] = ()  # every bound symbolic dimension, sorted by name
    family: str | None = None  # "gpt", "llama", "bert", "dlrm" when known (from builder metadata)
    warnings: tuple[str, ...] = ()

    @property
    def params(self) -> int:
        return sum(layer.params for layer in self.layers)

    @property
    def active_params(self) -> int:
        """Parameters one token uses (``params`` less the routed experts it is not sent to)."""
        return sum(layer.active_params for layer in self.layers)

    @property
    def flops_forward(self) -> float:
        """Forward FLOPs per sample."""
        return sum(layer.flops_forward for layer in self.layers)


# -------------------------------------------------------------------------------------------- hardware


@dataclass(frozen=True)
class DeviceProfile:
    """One accelerator model. ``peak_flops_per_s`` is dense peak per dtype (``fp32``, ``tf32``, ``fp16``,
    ``bf16``, ``fp8``; ``fp4`` is listed as a peak, not a training dtype). ``gemm_efficiency`` is a curve of
    (GEMM FLOPs, achieved fraction of peak) pairs, interpolated in log-space; ``memory_efficiency`` is the
    achieved fraction of ``memory_bandwidth_Bps``."""

    name: str
    peak_flops_per_s: Mapping[str, float]
    memory_bytes: int
    memory_bandwidth_Bps: float
    gemm_efficiency: tuple[tuple[float, float], ...] = ((1.0, 0.7),)
    memory_efficiency: float = 0.8
    vendor: str = "nvidia"
    source: str = ""
    # optional: achieved fraction of memory_bandwidth_Bps against bytes moved by one op (interpolated in
    # log(bytes), clamped); empty = the constant ``memory_efficiency``
    memory_efficiency_curve: tuple[tuple[float, float], ...] = ()
    op_overhead_s: float = 0.0  # fixed time per op/kernel (dispatch, launch); measured by `planner profile`
    description: str = ""
    # optional: achieved fraction of peak for convolutions against their FLOPs (empty = gemm_efficiency)
    conv_efficiency: tuple[tuple[float, float], ...] = ()
    # optional: achieved FLOP/s of non-GEMM arithmetic (normalisation, softmax, activations); 0 = the fp32 peak
    vector_flops_per_s: float = 0.0
    # optional: (forward, backward) achieved fraction of peak of a FlashAttention kernel on this device;
    # empty = FlashAttention-2's measured fractions on A100 (planner.hardware.efficiency.FLASH_*)
    flash_attention_efficiency: tuple[float, ...] = ()
    # whether FlashAttention runs on this device at all (FlashAttention-2 and Transformer Engine's fused
    # attention need Ampere or newer); where not, a runtime's flash attention falls back to a fused softmax
    flash_attention: bool = True
    # optional: the NVIDIA compute capability (9.0 Hopper, 10.0 Blackwell); 0 = not given (another vendor, a
    # measured profile). The FP8 recipes a device runs follow from it (planner.hardware.fp8)
    compute_capability: float = 0.0
    # optional: the link to host memory, each way (PCIe 3.0/4.0/5.0 x16, NVLink-C2C on Grace superchips);
    # what embedding rows kept in host memory are read over. 0 = not given (planner.embeddings.devices
    # assumes PCIe 4.0 x16)
    host_bandwidth_Bps: float = 0.0


@dataclass(frozen=True)
class NodeProfile:
    """A server: ``devices_per_node`` identical devices joined by an intra-node fabric, and NICs.
    Bandwidths are per device (intra) and per node (inter), each way."""

    name: str
    device: DeviceProfile
    devices_per_node: int
    intra_node_bandwidth_Bps: float
    intra_node_latency_s: float
    inter_node_bandwidth_Bps: float
    inter_node_latency_s: float
    source: str = ""
    # achieved fraction of the line rates above for large collectives (the collective model applies them)
    intra_node_efficiency: float = 1.0
    inter_node_efficiency: float = 1.0
    nics_per_node: int = 1
    intra_node_fabric: str = ""  # "nvswitch", "nvlink-cube-mesh", "pcie", "infinity-fabric", "shared-memory"
    host_memory_bytes: float = 0.0  # system memory (0: not given; planner.embeddings.devices assumes a ratio)
    # direct-link fabrics (a cube mesh, a full mesh): (ranks of one group on the node, the fraction of
    # intra_node_bandwidth_Bps each of them reaches its group's peers at: its links to them over all its
    # links), ascending; empty = a switched fabric, where every group reaches the whole
    # (planner.hardware.collectives.intra_group_Bps)
    intra_node_group_fraction: tuple[tuple[int, float], ...] = ()
    # NVLink SHARP (NVSwitch 3 and later: the switch reduces and multicasts): the achieved fraction of
    # intra_node_bandwidth_Bps its all-reduce moves each device's (1 + 1/n) shares at; 0 = no NVLS
    # (planner.hardware.collectives)
    nvls_efficiency: float = 0.0


@dataclass(frozen=True)
class DeviceGroup:
    """``count`` identical nodes of a cluster. Devices are numbered globally from ``first_device``."""

    name: str
    node: NodeProfile
    count: int
    first_device: int = 0
    price_per_node_hour: float | None = None
    # node fields the cluster file set for this group (``inter_node_bandwidth_GBps`` ...), as (NodeProfile
    # field, value); ``node`` has them already, and a node swapped in (a what-if sweep) gets them again
    link_overrides: tuple[tuple[str, float], ...] = ()

    @property
    def num_devices(self) -> int:
        return self.count * self.node.devices_per_node


@dataclass(frozen=True)
class Cluster:
    groups: tuple[DeviceGroup, ...]
    fabric_latency_s: float = 5e-6
    oversubscription: float = 1.0
    name: str = ""

    @property
    def num_devices(self) -> int:
        return sum(g.num_devices for g in self.groups)

    @property
    def device_types(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(g.node.device.name for g in self.groups))


# ------------------------------------------------------------------------------------------ cost model


# The largest global batch any command takes: far past any training run's (DLRM runs take millions of samples
# per iteration), and small enough that listing its divisors (dp and micro-batch choices) stays instant.
MAX_GLOBAL_BATCH = 1 << 30

# the largest dimension of a data input, after binding (a --dim value, a swept seq_len or a static size): ONNX
# data propagation materialises index vectors of that length (a Range over the batch feeding a Loop), in time
# and memory linear in it -- about a second and 400 MB at this size, gigabytes beyond; no training sequence or
# batch axis per sample comes near it
MAX_INPUT_DIM = 2 ** 22


@dataclass(frozen=True)
class ParallelConfig:
    """One parallel configuration. Fields left ``None`` resolve to the best feasible choice; the parallel
    degrees (tp, pp, dp, cp) left ``None`` are 1 for estimate and searched by plan (:meth:`with_unit_degrees`)."""

    global_batch: int
    # tensor-parallel, pipeline-parallel (stages) and data-parallel degrees; None: 1 for estimate, searched by
    # plan (0, in a plan's pins, is searched too). Devices used: tp x cp x pp x dp
    tp: int | None = None
    pp: int | None = None
    dp: int | None = None
    micro_batch: int | None = None
    vpp: int | None = None
    zero: int | None = None
    recompute: str | None = None  # "none" | "selective" | "full"
    sequence_parallel: bool | None = None
    schedule: str | None = None  # "1f1b" | "interleaved" | "gpipe"
    optimizer: str = "adam"  # "adam" | "sgd" | "adagrad"
    dtype: str | None = None  # "fp32" | "tf32" | "bf16" | "fp16" | "fp8"; None: bf16 (fp16, then fp32, where missing)
    # the training stack (planner.runtime.RUNTIMES); None: DEFAULT_RUNTIME, or where it cannot run the pinned
    # choices the first runtime that can (planner.rules.resolve_runtime)
    runtime: str | None = None
    # Transformer Engine's FP8 scaling recipe, with dtype "fp8" only (planner.hardware.fp8.FP8_RECIPES):
    # "delayed" | "blockwise" | "mxfp8"; None: delayed under fp8
    fp8_recipe: str | None = None
    # context parallelism: ranks each sample's sequence is split over (planner.cost.context); None: 1 for
    # estimate, searched by plan. Devices used: tp x cp x pp x dp
    cp: int | None = None
    # Megatron-Core's uneven pipeline: the transformer blocks of the first and last stage (None: the even
    # split; the middle stages share the rest evenly; planner.rules.stage_blocks)
    first_stage_layers: int | None = None
    last_stage_layers: int | None = None
    # mixture of experts (planner.cost.moe): routed experts split over ``ep`` ranks, each expert's matrices over
    # ``expert_tp`` ranks (Megatron-Core's expert tensor parallelism); None: resolved (ep 1 on a dense model)
    ep: int | None = None
    expert_tp: int | None = None
    # the expert-parallel all-to-alls run under another micro-batch's computation (Megatron-Core's
    # --overlap-moe-expert-parallel-comm; planner.cost.moe); None: resolved (off where the rules refuse it)
    ep_overlap: bool | None = None

    def __post_init__(self) -> None:
        # Wrong types from the Python API fail here, naming the field, rather than deep in a rule or formula.
        # Numpy scalars are stored as the Python int or bool the rules compare with.
        for f in fields(self):
            value = getattr(self, f.name)
            if value is None and f.name != "global_batch":
                continue
            if f.name in _DEGREE_FIELDS:
                object.__setattr__(self, f.name, degree(value, f.name, pin=True))
            elif f.name in _COUNT_FIELDS:
                least = 0 if f.name in _ZERO_ALLOWED else 1
                most = MAX_GLOBAL_BATCH if f.name == "global_batch" else None
                object.__setattr__(self, f.name, whole(value, f.name, least, most))
            elif f.name in ("sequence_parallel", "ep_overlap"):
                if not isinstance(value, (bool, np.bool_)):
                    raise ConfigError(f"{f.name}={value!r} must be True, False or None")
                object.__setattr__(self, f.name, bool(value))
            elif not isinstance(value, str):
                raise ConfigError(f"{f.name}={value!r} must be a name (a string) or None")

    def with_unit_degrees(self) -> ParallelConfig:
        """This configuration with its degrees left out (tp, pp, dp, cp None) at 1: the configuration estimate
        takes (a plan searches them instead)."""
        return replace(self, **{name: 1 for name in _DEGREE_FIELDS if getattr(self, name) is None})


# ParallelConfig's parallel degrees: a tp, pp, dp or cp of 0, as None, leaves the degree to the search when the
# config pins a plan (estimate's rules ask for 1 or more, with the same message); its other integer fields, of
# which ZeRO's stage counts from 0.
_DEGREE_FIELDS = frozenset({"tp", "pp", "dp", "cp"})
_COUNT_FIELDS = frozenset({"global_batch", "micro_batch", "vpp", "zero", "first_stage_layers", "last_stage_layers",
                           "ep", "expert_tp"})
_ZERO_ALLOWED = frozenset({"zero"})


@dataclass(frozen=True)
class Batching:
    """How one iteration's ``global_batch`` samples split: over ``dp`` data-parallel replicas, each running
    micro-batches of ``micro_batch`` samples. The dense part and the sparse tables of a model see the same
    one (the tables look up every sample of the global batch once per iteration)."""

    global_batch: int
    micro_batch: int
    dp: int

    @classmethod
    def of(cls, config: ParallelConfig) -> Batching:
        """The batching of a resolved configuration (``Estimate.config``)."""
        return cls(global_batch=config.global_batch, micro_batch=config.micro_batch or 1, dp=config.dp or 1)

    @property
    def per_replica(self) -> int:
        """Samples each data-parallel replica processes per iteration."""
        return self.global_batch // self.dp

    @property
    def num_micro_batches(self) -> int:
        """Micro-batches each data-parallel replica runs per iteration."""
        return self.per_replica // self.micro_batch

    def replica_micro_batches(self, batch_share: float, dp: int) -> float:
        """Micro-batches each of ``dp`` replicas runs when together they take ``batch_share`` of the global
        batch (a replica group of a heterogeneous stage; ``num_micro_batches`` for the one group of a
        homogeneous stage)."""
        return batch_share * self.global_batch / (dp * self.micro_batch)


@dataclass(frozen=True)
class ReplicaSpec:
    """A set of identical devices serving one pipeline stage: ``dp`` replicas of a ``tp x cp`` group
    (``cp`` context-parallel ranks, each a ``tp``-way group, splitting every sample's sequence).
    ``batch_share`` is the fraction of the stage's samples these devices process (heterogeneous data
    parallelism gives faster device types a larger share); the shares of a stage sum to 1."""

    # global device ids, len == tp * cp * dp, in Megatron-Core's order: tp fastest, then cp, then dp
    devices: tuple[int, ...]
    tp: int
    dp: int
    batch_share: float = 1.0
    cp: int = 1


@dataclass(frozen=True)
class StageSpec:
    """Layers ``first_layer..last_layer`` (inclusive) on one or more replica groups."""

    first_layer: int
    last_layer: int
    replicas: tuple[ReplicaSpec, ...]


@dataclass(frozen=True)
class PipelineSpec:
    """A fully explicit plan shape, as the search hands it to the cost model (uneven layer splits,
    a device type per stage, heterogeneous replicas). Every field resolved."""

    stages: tuple[StageSpec, ...]
    global_batch: int
    micro_batch: int
    vpp: int = 1
    zero: int = 0
    recompute: str = "none"
    sequence_parallel: bool = False
    schedule: str = "1f1b"
    optimizer: str = "adam"
    dtype: str = "bf16"
    runtime: str = DEFAULT_RUNTIME
    ep: int = 1  # expert parallelism of every stage (planner.cost.moe)
    expert_tp: int = 0  # expert tensor parallelism; 0: each replica group's tp (Megatron-Core's default)
    ep_overlap: bool = False  # the all-to-alls under another micro-batch's computation (planner.cost.moe)

    @property
    def batching(self) -> Batching:
        """The global batch over the data-parallel replicas of a stage (all stages have the same count)."""
        return Batching(self.global_batch, self.micro_batch, sum(r.dp for r in self.stages[0].replicas))


@dataclass(frozen=True)
class Breakdown:
    """Seconds per part of one iteration, on the critical path; ``total_s`` is their sum."""

    compute_s: float = 0.0
    tp_comm_s: float = 0.0
    pp_comm_s: float = 0.0
    dp_comm_s: float = 0.0
    bubble_s: float = 0.0
    optimizer_s: float = 0.0
    embedding_s: float = 0.0
    cp_comm_s: float = 0.0  # the context-parallel K/V exchange the attention does not hide
    ep_comm_s: float = 0.0  # expert-parallel token dispatch and combine (all-to-all), and expert-tp gathers

    @property
    def total_s(self) -> float:
        return (self.compute_s + self.tp_comm_s + self.pp_comm_s + self.dp_comm_s + self.bubble_s
                + self.optimizer_s + self.embedding_s + self.cp_comm_s + self.ep_comm_s)

    def to_dict(self) -> dict[str, float]:
        return {name: getattr(self, name) for name, _ in BREAKDOWN_PARTS}


# Every part of a Breakdown, in order, with the words reports and explanations use for it (one source, so
# the plan table and the bottleneck sentence name a part alike)
BREAKDOWN_PARTS: tuple[tuple[str, str], ...] = (
    ("compute_s", "compute"), ("tp_comm_s", "tensor-parallel communication"),
    ("pp_comm_s", "pipeline send/receive"), ("dp_comm_s", "data-parallel gradient sync"),
    ("bubble_s", "pipeline bubble"), ("optimizer_s", "optimizer step"), ("embedding_s", "embeddings"),
    ("cp_comm_s", "context-parallel K/V exchange"),
    ("ep_comm_s", "expert dispatch and combine"),
)


@dataclass(frozen=True)
class MemoryBreakdown:
    """Bytes per device, by kind."""

    weights_bytes: float = 0.0
    gradients_bytes: float = 0.0
    optimizer_bytes: float = 0.0
    activations_bytes: float = 0.0
    other_bytes: float = 0.0  # workspace, communication buffers, fragmentation margin

    @property
    def total_bytes(self) -> float:
        return (self.weights_bytes + self.gradients_bytes + self.optimizer_bytes + self.activations_bytes
                + self.other_bytes)


@dataclass(frozen=True)
class ReplicaEstimate:
    """One replica group of a stage (mixed hardware: several per stage), as the cost model sees it.
    ``forward_s``/``backward_s`` are for one of its own micro-batches."""

    device_type: str
    devices: tuple[int, ...]
    tp: int
    dp: int
    batch_share: float
    num_micro_batches: float  # micro-batches each of its replicas processes per iteration
    forward_s: float
    backward_s: float
    memory: MemoryBreakdown
    memory_capacity_bytes: float
    cp: int = 1
    ep: int = 1
    expert_tp: int = 1


@dataclass(frozen=True)
class StageEstimate:
    """One pipeline stage as the cost model sees it."""

    index: int
    first_layer: int
    last_layer: int  # inclusive
    device_type: str
    devices: tuple[int, ...]
    tp: int
    dp: int
    forward_s: float  # one micro-batch, compute + tp communication
    backward_s: float  # one micro-batch, including recompute
    memory: MemoryBreakdown
    memory_capacity_bytes: float
    replicas: tuple[ReplicaEstimate, ...] = ()  # every replica group (one on homogeneous hardware)
    tp_comm_s: float = 0.0  # of forward_s + backward_s, one micro-batch
    p2p_s: float = 0.0  # sending one micro-batch's boundary tensor to the next stage
    dp_sync_s: float = 0.0  # the once-per-iteration data-parallel sync exposed after the stage's backward
    optimizer_s: float = 0.0
    # bytes each data-parallel rank of the stage sends per iteration (gradient reductions and weight gathers,
    # every micro-batch's under ZeRO-2/3)
    dp_bytes: float = 0.0
    cp: int = 1
    cp_comm_s: float = 0.0  # of forward_s + backward_s, one micro-batch: the exposed K/V ring exchange
    ep: int = 1  # expert parallelism (1: every rank holds every expert, or a dense model)
    expert_tp: int = 1  # ranks each expert's matrices are split over
    ep_comm_s: float = 0.0  # of forward_s + backward_s, one micro-batch: all-to-alls and expert-tp gathers
    # forward_s + backward_s as one merged step under expert-parallel overlap (0: no overlap; planner.cost.moe)
    merged_s: float = 0.0


@dataclass(frozen=True)
class Estimate:
    """The cost model's prediction for one resolved configuration."""

    config: ParallelConfig  # every field resolved
    iteration_time_s: float
    throughput_samples_per_s: float
    feasible: bool
    memory_per_device_bytes: float  # the largest over devices
    breakdown: Breakdown
    stages: tuple[StageEstimate, ...] = ()
    reason: str = ""  # why infeasible, or empty
    notes: tuple[str, ...] = field(default_factory=tuple)
    # the sparse embedding tables' placement (planner.plans.EmbeddingPlacement), for models that have them
    embeddings: tuple[Any, ...] = ()
