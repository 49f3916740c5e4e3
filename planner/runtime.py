"""Training runtimes: the software stack a plan runs on, as an input beside the cluster.

A device profile says what the hardware can do; a :class:`Runtime` says what the training framework does
with it: which communication it overlaps with which computation, which attention kernel it runs, how its
optimizer lays out state, and which parallel configurations it can run at all. The cost model reads the
runtime for every one of these facts; nothing about the software stack lives in a device file or in the
calibration.

``RUNTIMES`` holds the built-in ones; ``get_runtime(name)`` looks one up (unknown names raise
``ConfigError`` naming the choices). ``DEFAULT_RUNTIME`` is what a user of today would run.
"""

from __future__ import annotations

from dataclasses import dataclass

from planner.errors import ConfigError, suggest


@dataclass(frozen=True)
class Runtime:
    """What a training framework overlaps, which kernels it runs, how it keeps optimizer state, and what it
    can run. Every field states a behaviour of the framework (its documentation or code is in ``source``)."""

    name: str
    description: str
    source: str
    # --- what overlaps with what
    # bucketed gradient reduction runs during the backward pass of the last micro-batch (Megatron-Core
    # --overlap-grad-reduce, DeepSpeed overlap_comm, FSDP's per-layer reduce-scatter); False: after it
    overlap_grad_reduce: bool
    # the parameter all-gather of a sharded optimizer (ZeRO-1/2) overlaps the next iteration's forward
    # (Megatron-Core --overlap-param-gather); False: it runs exposed after the optimizer step
    overlap_param_gather: bool
    # tensor-parallel collectives overlapped with the GEMMs they feed (Transformer Engine userbuffers,
    # Megatron-Core --tp-comm-overlap); False: they run between the GEMMs. Only the export reads it: the cost
    # model times the collectives exposed either way (planner.cost.comm), an upper bound on what the overlap
    # leaves, since how much of them the GEMMs hide is not modelled
    tp_comm_overlap: bool
    # gradient-reduction bucket size in parameters (the last bucket cannot overlap the backward); 0 = one
    # bucket per layer (FSDP reduces each wrapped module's gradients on their own)
    grad_bucket_params: int
    # ZeRO-3 / FSDP: how many layers ahead a rank gathers parameters (1 = the next layer)
    zero3_prefetch_layers: int
    # --- kernels
    # "flash": FlashAttention (no seq^2 tensor in memory, nothing for selective recompute to save);
    # "fused-softmax": the attention scores in memory, scale-mask-softmax fused in one kernel;
    # "unfused": every attention operation a separate kernel, as the ONNX graph is written
    attention: str
    # --- optimizer state layout
    # bytes per parameter of the gradient buffer the optimizer reads: fp32 "main grads" (4) or the
    # training dtype's width (0 = same as the weights)
    main_grad_bytes: int
    # --- what it can run
    zero_stages: tuple[int, ...]
    max_pipeline_zero: int  # the highest ZeRO stage combined with pp > 1
    interleaved: bool  # Megatron's interleaved (virtual-pipeline) 1F1B schedule
    tensor_parallel: bool
    pipeline_parallel: bool
    # stages holding different numbers of layers (Megatron-Core --decoder-first/last-pipeline-num-layers and
    # --pipeline-model-parallel-layout; DeepSpeed PipelineModule's partition_method; torch.distributed.pipelining
    # splits where the user cuts); False: the layers split evenly, so pp (times vpp) divides them (Megatron-LM
    # v2.5 megatron/model/transformer.py, ParallelTransformer asserts num_layers % pipeline size == 0)
    uneven_pipeline: bool = True
    # the fewest pipeline stages the interleaved schedule runs on: Megatron-LM v2.5 megatron/arguments.py
    # (parse_args) asserts "pipeline-model-parallel size should be greater than 2 with interleaved schedule";
    # Megatron-Core's validate_args (megatron/training/arguments.py) asks for more than 2 only with
    # --no-overlap-p2p-communication, its default being the overlap, which runs on 2
    interleaved_min_stages: int = 2
    # the interleaved schedule with as many micro-batches as stages runs every forward before any backward:
    # Megatron-LM v2.5 megatron/schedules.py (forward_backward_pipelining_with_interleaving, "Run all forward
    # passes and then all backward passes if number of microbatches is just the number of pipeline stages");
    # False: the warm-up of 2 (pp - rank - 1) + (vpp - 1) pp chunks in every case, capped at all of them
    # (Megatron-Core get_pp_rank_microbatches, megatron/core/pipeline_parallel/schedules.py at d98e8a64dd;
    # torch.distributed.pipelining ScheduleInterleaved1F1B, _get_warmup_ops, torch 2.13)
    interleaved_all_forwards_at_pp: bool = False
    # the lowest ZeRO stage whose gradient reduction overlaps the backward (``overlap_grad_reduce``); below
    # it the runtime reduces after the backward pass
    overlap_grad_reduce_min_zero: int = 0
    # whether the gradient reduction still overlaps the backward with pp > 1; False: DeepSpeed's engine turns
    # overlap_comm off for a PipelineModule ("Pipeline parallelism does not support overlapped communication,
    # will be disabled": deepspeed/runtime/engine.py, _configure_zero_optimizer), whose pipeline engine reduces
    # the gradients after the last micro-batch's backward
    pipeline_overlap_grad_reduce: bool = True
    # training dtypes whose ZeRO-0 optimizer, with pp > 1, keeps the fp32 master weights, moments and gradient
    # copy sharded over dp as ZeRO-1 does, all-reduces the gradients and all-gathers the updated 16-bit weights
    # after the step: DeepSpeed runs a bf16 pipeline without ZeRO through its BF16_Optimizer
    # (deepspeed/runtime/engine.py _do_optimizer_sanity_check; deepspeed/runtime/bf16_optimizer.py: the fp32
    # partition per dp rank, update_lp_params all-gathers the bf16 partitions)
    pipeline_sharded_optimizer_dtypes: tuple[str, ...] = ()
    # the ZeRO optimizer copies each gradient into contiguous reduce buckets of grad_bucket_params elements in
    # the weights' dtype, two of them while the reduction overlaps the backward (double buffering), one
    # otherwise and at ZeRO-3 (DeepSpeed zero_optimization.contiguous_gradients, default true:
    # deepspeed/runtime/zero/stage_1_and_2.py setup_buckets, stage3.py ipg_buckets)
    contiguous_grad_buckets: bool = False
    # with pp > 1 a sharded data-parallel stage (ZeRO-2/3) accumulates every micro-batch's gradients unsharded,
    # at the reduction width, and reduce-scatters them once after the last backward, its parameters left
    # unsharded after each backward: torch.distributed.pipelining's stage turns off gradient sync and
    # resharding after backward for every micro-batch (stage.py, backward_maybe_with_nosync:
    # set_requires_gradient_sync(False), set_reshard_after_backward(False)) and reduces in its REDUCE_GRAD
    # action "after all microbatches" (perform_reduce_grad); FSDP2 upcasts the accumulated unsharded gradient
    # to reduce_dtype (_fsdp_param.py, to_accumulated_grad_if_needed)
    pipeline_defers_grad_reduce: bool = False
    # --- fixed memory every rank holds besides the model (planner.cost.memory adds them to other_bytes)
    # the CUDA context of a PyTorch process: "~300MB" with CUDA 11.7+ lazy module loading, over 1 GB before
    # it, when every kernel was loaded into the context (pytorch/pytorch issue #107667, maintainer answer)
    cuda_context_bytes: int = 300 << 20
    # GEMM workspaces: Transformer Engine's cuBLASLt workspace (32 MiB on Hopper, 4 MiB before:
    # transformer_engine/pytorch/module/base.py get_cublas_workspace_size_bytes) plus PyTorch's cuBLAS
    # workspace (CUBLAS_WORKSPACE_CONFIG default ":4096:8" on Hopper: 8 x 4 MiB; PyTorch "CUDA semantics",
    # cuBLAS workspaces); the Hopper figures, the larger
    gemm_workspace_bytes: int = 64 << 20
    # NCCL's staging buffers: NCCL_BUFFSIZE = 4 MiB per channel and protocol (NCCL docs, environment
    # variables), two bulk protocols (Simple, LL128) over up to 16 channels on NVLink/InfiniBand = 128 MiB per
    # communicator, for the four a 3-D parallel Megatron rank holds (tensor, pipeline, data, embedding)
    nccl_buffer_bytes: int = 4 * 16 * 2 * (4 << 20)
    # the caching allocator's reserved-but-unallocated memory, as a fraction of what the model allocates: the
    # PyTorch allocator rounds blocks to 512 B / 2 MiB and keeps freed blocks cached for reuse by requests of
    # their size or smaller (c10/cuda/CUDACachingAllocator.cpp; PyTorch "CUDA semantics", memory management),
    # so interleaved lifetimes fragment it; torch.cuda.memory_reserved() exceeds memory_allocated() by about a
    # tenth in Megatron-LM runs. A modelling assumption, not derived
    allocator_reserve_fraction: float = 0.10
    # the bucket grows with the data-parallel group: max(grad_bucket_params, this x dp) parameters
    # (Megatron-Core's DistributedDataParallel default bucket_size = max(40M, 1M x dp)); 0 = fixed
    grad_bucket_params_per_rank: int = 0
    # bytes per parameter the data-parallel gradient reduction moves: 4 = in fp32 (Megatron reduces its fp32
    # main-grad buffer; FSDP2 as torchtitan runs it, MixedPrecisionPolicy reduce_dtype=float32), 0 = in the
    # training dtype (DeepSpeed's communication_data_type defaults to the weights' dtype)
    grad_reduce_bytes: int = 0
    # training dtypes whose gradients stay at the weights' width, buffer and reduction, where the two fields
    # above say fp32 (Megatron forces fp32 gradient accumulation and all-reduce for bf16 only; fp16 keeps
    # fp16 gradients unless --accumulate-allreduce-grads-in-fp32: megatron/training/arguments.py)
    native_grad_dtypes: tuple[str, ...] = ()
    # the fp32 parameters are the optimizer's master copy and the model computes from 16-bit copies gathered
    # or cast from them (FSDP2's MixedPrecisionPolicy keeps no other high-precision copy: PyTorch docs,
    # torch.distributed.fsdp.MixedPrecisionPolicy); fully_shard shards those fp32 parameters at ZeRO-2 too,
    # where reshard_after_forward=False keeps the gathered 16-bit copy from forward to backward
    fp32_parameters: bool = False
    # each tensor-parallel rank sends only its 1/tp slice of a stage's output to the next stage, which
    # all-gathers it over NVLink (Megatron-LM v2.5 --scatter-gather-tensors-in-pipeline, on by default;
    # Narayanan et al. SC'21 Sec. 4.1); without it a rank sends the whole tensor unless sequence parallelism
    # already splits it
    p2p_scatter_gather: bool = False

    # the recompute choices and sequence parallelism the framework offers: Megatron-LM before v3.0 (2022) had
    # only --checkpoint-activations (full recompute); selective recompute and sequence parallelism came with
    # Korthikanti et al. 2022
    recompute_choices: tuple[str, ...] = ("none", "selective", "full")
    # what "selective" recompute re-runs (planner.cost.compute, "Recompute"): "attention-core", the attention
    # core between the two products (Megatron-LM --recompute-granularity selective; Korthikanti et al. 2022,
    # Sec. 5), nothing under FlashAttention; "alternate-gemm", torchtitan's per-op selective activation
    # checkpointing of each transformer block, which saves the outputs of the compute-intensive ops (matrix
    # products, the attention kernel) and of the reduce-scatters, except every second linear-layer product,
    # and re-runs everything else (torchtitan/distributed/activation_checkpoint.py, SelectiveAC: the save
    # list from torch._functorch.partitioners.get_default_op_list's compute_intensive_ops plus
    # reduce_scatter_tensor; "Save all compute/comm ops, except every second mm/linear")
    selective_recompute: str = "attention-core"
    sequence_parallel: bool = True
    # fp8 GEMMs through Transformer Engine (Megatron-Core --fp8-format/--fp8-recipe); Megatron-LM v2.5 predates
    # it: its megatron/arguments.py (_add_mixed_precision_args) offers --fp16 and --bf16 only
    fp8: bool = True
    # context parallelism as Megatron-Core runs it through Transformer Engine: the sequence split over cp
    # ranks (2 x cp chunks, rank i holding chunks i and 2cp-1-i), K and V passed around a ring of
    # point-to-point sends overlapped with the attention of the chunk in hand (planner.cost.context)
    context_parallel: bool = False
    # --- mixture of experts (planner.cost.moe)
    # expert parallelism: the routed experts split over ``ep`` ranks with all-to-all token dispatch and
    # combine (Megatron-Core --expert-model-parallel-size); False: every rank holds every expert (ep 1)
    expert_parallel: bool = False
    # expert tensor parallelism independent of the attention's (Megatron-Core --expert-tensor-parallel-size);
    # False: the experts are split over the tensor-parallel group, as the dense layers are
    expert_tensor_parallel: bool = False
    # mixture-of-experts layers (a router and routed experts) at all; megatron-lm-2021 had none
    moe_layers: bool = True
    # a mixture-of-experts layer trains with tp > 1 only under sequence parallelism (Megatron-Core's MoELayer
    # raises "During training, performance may degrade if MoE and tensor parallelism are enabled without also
    # enabling sequence parallelism": megatron/core/transformer/moe/moe_layer.py)
    moe_tensor_parallel_needs_sequence_parallel: bool = False
    # the highest ZeRO stage combined with tp > 1 (3: any the runtime runs)
    max_tensor_parallel_zero: int = 3
    # tokens the busiest expert-parallel rank receives over the mean, the routed load's imbalance with
    # dropless routing (Megatron-Core's default: no --moe-expert-capacity-factor, no token dropped). A
    # modelling assumption, not measured here: the capacity factor 1.25 that Switch Transformers provision
    # each expert with for training with a load-balancing loss (Fedus et al. 2021, JMLR, Sec. 2.2 and
    # Table 1), i.e. the load the busiest expert reaches under that loss
    moe_load_imbalance: float = 1.25
    # the expert-parallel all-to-alls overlapped with another micro-batch's computation: the steady state's
    # forward and backward merged layer by layer on two streams (Megatron-Core --overlap-moe-expert-parallel-comm
    # with --delay-wgrad-compute; planner.cost.moe), with one more warm-up forward (planner.cost.schedule)
    ep_overlap: bool = False

    def overlaps_grad_reduce(self, zero: int, pipelined: bool = False) -> bool:
        """Whether the gradient reduction of ZeRO stage ``zero`` overlaps the backward pass (``pipelined``:
        with pp > 1)."""
        if pipelined and not self.pipeline_overlap_grad_reduce:
            return False
        return self.overlap_grad_reduce and zero >= self.overlap_grad_reduce_min_zero

    def shards_optimizer_states(self, zero: int, pipelined: bool, dtype: str) -> bool:
        """Whether the optimizer states are sharded over dp: from ZeRO-1 on, and at ZeRO-0 in a pipeline of a
        dtype in ``pipeline_sharded_optimizer_dtypes``."""
        return zero >= 1 or (pipelined and dtype in self.pipeline_sharded_optimizer_dtypes)

    def gathers_weights_after_step(self, zero: int, pipelined: bool, dtype: str) -> bool:
        """Whether the updated weights are all-gathered once after the optimizer step: ZeRO-1/2, and a ZeRO-0
        optimizer that shards its states (ZeRO-3 gathers per layer instead)."""
        return zero in (1, 2) or (zero == 0 and self.shards_optimizer_states(zero, pipelined, dtype))

    @property
    def depends_on_pipeline(self) -> bool:
        """Whether any behaviour above changes with pp > 1 (the ``pipeline_*`` fields): where none does, a caller
        costing stages may treat every pipeline depth alike."""
        return (not self.pipeline_overlap_grad_reduce or bool(self.pipeline_sharded_optimizer_dtypes)
                or self.pipeline_defers_grad_reduce)

    @property
    def selective_recomputes_nothing(self) -> bool:
        """Whether "selective" recompute is the plan without recompute: the attention core under
        FlashAttention, which keeps no scores to drop (``selective_recompute``)."""
        return self.selective_recompute == "attention-core" and self.attention == "flash"

    def defers_grad_reduce(self, zero: int, pipelined: bool) -> bool:
        """Whether ZeRO ``zero``'s gradients stay unsharded until one reduce-scatter after the last backward
        (``pipeline_defers_grad_reduce``; ``pipelined``: pp > 1)."""
        return pipelined and zero >= 2 and self.pipeline_defers_grad_reduce

    def grad_bucket_buffer_params(self, zero: int, pipelined: bool) -> float:
        """Elements of the contiguous gradient buckets the ZeRO optimizer holds (``contiguous_grad_buckets``)."""
        if not self.contiguous_grad_buckets or zero == 0:
            return 0.0
        count = 2 if zero < 3 and self.overlaps_grad_reduce(zero, pipelined) else 1
        return float(count * self.grad_bucket_params)


RUNTIMES: dict[str, Runtime] = {r.name: r for r in (
    Runtime(
        name="megatron-lm-2021",
        description="Megatron-LM as in Narayanan et al. SC'21: local DDP, gradients all-reduced after the "
                    "backward pass, fused scale-mask-softmax, no distributed optimizer",
        source="Narayanan et al., SC'21, Sections 3-4 (gradient all-reduce after the pipeline flush); "
               "Megatron-LM v2.5 megatron/model/fused_softmax.py, megatron/model/distributed.py, "
               "megatron/arguments.py (bf16 forces fp32 gradient accumulation and all-reduce; fp16 keeps fp16 "
               "gradients by default; interleaved schedule only with pipeline-model-parallel size > 2)",
        overlap_grad_reduce=False, overlap_param_gather=False, tp_comm_overlap=False,
        grad_bucket_params=40_000_000, zero3_prefetch_layers=1, attention="fused-softmax", main_grad_bytes=4,
        zero_stages=(0,), max_pipeline_zero=0, interleaved=True, tensor_parallel=True, pipeline_parallel=True,
        recompute_choices=("none", "full"), sequence_parallel=False, moe_layers=False, uneven_pipeline=False,
        grad_reduce_bytes=4, native_grad_dtypes=("fp16",), p2p_scatter_gather=True, interleaved_min_stages=3,
        interleaved_all_forwards_at_pp=True, fp8=False),
    Runtime(
        name="megatron-core",
        description="Megatron-Core with Transformer Engine: distributed optimizer (ZeRO-1), overlapped "
                    "gradient reduce-scatter and parameter all-gather, tp-comm overlap, FlashAttention",
        source="Megatron-Core docs, distributed optimizer (bf16 params, fp32 main grads: 6 + 12/d bytes per "
               "parameter; fp16 params and grads: 4 + 16/d) and DistributedDataParallelConfig (bucket_size "
               "max(40M, 1M x dp)); megatron/training/arguments.py (bf16 forces "
               "accumulate_allreduce_grads_in_fp32: gradients reduced in fp32); Megatron-LM "
               "README performance table (overlap-grad-reduce, overlap-param-gather, tp-comm-overlap); "
               "megatron/core/transformer/moe/README.md (expert parallelism, expert tensor parallelism, "
               "dropless routing by default; EP A2A overlap) and transformer_config.py (its requirements: "
               "ep > 1, vpp with pp > 1, no full recompute, bf16 or fp16 weights)",
        overlap_grad_reduce=True, overlap_param_gather=True, tp_comm_overlap=True,
        grad_bucket_params=40_000_000, zero3_prefetch_layers=1, attention="flash", main_grad_bytes=4,
        zero_stages=(0, 1), max_pipeline_zero=1, interleaved=True, tensor_parallel=True, pipeline_parallel=True,
        grad_bucket_params_per_rank=1_000_000, context_parallel=True, expert_parallel=True,
        expert_tensor_parallel=True, moe_tensor_parallel_needs_sequence_parallel=True, grad_reduce_bytes=4,
        native_grad_dtypes=("fp16",), ep_overlap=True),
    Runtime(
        name="deepspeed",
        description="DeepSpeed ZeRO 0-3 with overlap_comm; tensor parallelism without sequence parallelism, "
                    "through AutoTP or, with pipeline stages, the model's Megatron-style layers; pipeline only with "
                    "ZeRO 0-1, no interleaved schedule",
        source="DeepSpeed config docs (zero_optimization: reduce_bucket_size 5e8, overlap_comm, "
               "stage3_prefetch_bucket_size, contiguous_gradients; the planner's export sets overlap_comm for "
               "ZeRO 1-3, whose optimizer reduces gradients in buckets during the backward); "
               "deepspeed/runtime/engine.py (without a ZeRO optimizer, DeepSpeedEngine.backward all-reduces the "
               "gradients after the backward pass, allreduce_gradients; get_data_types: gradients accumulate in "
               "the weights' dtype unless data_types.grad_accum_dtype says otherwise, which the export leaves "
               "unset; overlap_comm off with a PipelineModule; a bf16 pipeline without ZeRO runs the "
               "BF16_Optimizer); deepspeed/runtime/pipe/engine.py (ZeRO-2/3 not supported with "
               "pipeline parallelism); DeepSpeed has no virtual-pipeline schedule; DeepSpeed tutorial "
               "'Automatic Tensor Parallelism (Training)' (tensor_parallel.autotp_size in the config; weights "
               "split, activations not: no sequence parallelism); deepspeed/runtime/engine.py "
               "_configure_tensor_parallel_states ('AutoTP + ZeRO stage 3 is supported for both inference and "
               "training'); deepspeed/utils/groups.py (AutoTP's data x tensor mesh spans the world, so with "
               "pipeline stages tensor parallelism comes from the model code on a "
               "deepspeed.runtime.pipe.topology.PipeModelDataParallelTopology, as Megatron-DeepSpeed runs it)",
        overlap_grad_reduce=True, overlap_param_gather=False, tp_comm_overlap=False,
        grad_bucket_params=500_000_000, zero3_prefetch_layers=1, attention="flash", main_grad_bytes=0,
        zero_stages=(0, 1, 2, 3), max_pipeline_zero=1, interleaved=False, tensor_parallel=True,
        pipeline_parallel=True, overlap_grad_reduce_min_zero=1, sequence_parallel=False,
        pipeline_overlap_grad_reduce=False, pipeline_sharded_optimizer_dtypes=("bf16",), contiguous_grad_buckets=True),
    Runtime(
        name="pytorch-fsdp2",
        description="PyTorch FSDP2 (fully_shard, as torchtitan runs it): per-layer all-gather with one layer "
                    "prefetched and per-layer reduce-scatter, DTensor tensor parallelism, "
                    "torch.distributed.pipelining schedules including interleaved 1F1B",
        source="PyTorch docs torch.distributed.fsdp.fully_shard (reshard_after_forward, implicit prefetch) and "
               "MixedPrecisionPolicy (fp32 sharded parameters, 16-bit compute copies); torchtitan docs (FSDP2 + "
               "TP + PP, Interleaved1F1B) and its config (mixed_precision_param bfloat16, mixed_precision_reduce "
               "float32); ZeRO-2 = reshard_after_forward=False",
        overlap_grad_reduce=True, overlap_param_gather=True, tp_comm_overlap=False,
        grad_bucket_params=0, zero3_prefetch_layers=1, attention="flash", main_grad_bytes=4,
        zero_stages=(0, 2, 3), max_pipeline_zero=3, interleaved=True, tensor_parallel=True,
        pipeline_parallel=True, grad_reduce_bytes=4, fp32_parameters=True, pipeline_defers_grad_reduce=True,
        selective_recompute="alternate-gemm"),
)}

DEFAULT_RUNTIME = "megatron-core"
ATTENTION_KERNELS = ("flash", "fused-softmax", "unfused")
SELECTIVE_RECOMPUTE = ("attention-core", "alternate-gemm")


def register_runtime(runtime: Runtime) -> Runtime:
    """Make ``runtime`` (a stack the built-ins do not describe, e.g. ``dataclasses.replace(
    get_runtime("megatron-core"), name="megatron-core-deterministic", attention="fused-softmax")``) known by
    its name to ``get_runtime`` and so to ``ParallelConfig(runtime=...)``. A built-in name cannot be
    replaced."""
    if runtime.name in RUNTIMES and RUNTIMES[runtime.name] != runtime:
        raise ConfigError(f"runtime {runtime.name!r} is built in; give yours another name")
    if runtime.attention not in ATTENTION_KERNELS:
        raise ConfigError(f"runtime {runtime.name!r}: attention {runtime.attention!r} is not one of "
                          f"{', '.join(ATTENTION_KERNELS)}")
    if runtime.selective_recompute not in SELECTIVE_RECOMPUTE:
        raise ConfigError(f"runtime {runtime.name!r}: selective_recompute {runtime.selective_recompute!r} is not "
                          f"one of {', '.join(SELECTIVE_RECOMPUTE)}")
    RUNTIMES[runtime.name] = runtime
    return runtime


def get_runtime(name: str | Runtime | None = None) -> Runtime:
    """The runtime called ``name`` (``None``: the default); a Runtime passes through."""
    if isinstance(name, Runtime):
        return name
    key = DEFAULT_RUNTIME if name is None else str(name).strip().lower()
    runtime = RUNTIMES.get(key)
    if runtime is None:
        raise ConfigError(f"runtime {name!r} is not one of {', '.join(RUNTIMES)}{suggest(key, RUNTIMES)}")
    return runtime
