"""The local profiler behind ``planner profile``: measure this machine through onnxruntime and fit a device
profile (the same YAML format as ``hardware_profiles/devices/``).

What it measures, each time the fastest of several runs through onnxruntime (on a shared machine other
processes only ever add time): a probe op is timed as a graph of copies of it by the runner's clock, less
the cost of running a graph; a model's ops likewise, except on the CPU by the wall clock, where they are
onnxruntime's own profiler's kernel times:

* GEMMs (``MatMul``) over a sweep of square and rectangular sizes -> the peak (the fastest rate seen) and
  the efficiency curve (achieved fraction of that peak against GEMM FLOPs, from compute-bound shapes only);
* element-wise ``Add`` over 4 KiB .. 192 MiB -> the memory bandwidth (the fastest seen) and its efficiency
  curve against bytes moved (caches show up as the small sizes);
* a chain of tiny ops timed end to end -> the fixed cost per op (executor dispatch plus kernel launch);
* a 1-element Identity, 1-element-wide Softmax / LayerNormalization and a MaxPool, each timed alone -> the
  costs a roofline does not hold (``measured.kernel_costs``: a graph output's cost, a cost per reduced row,
  the pooling rate), used by ``predict_op_s``;
* optionally the per-op times of a given ONNX model (recorded under ``measured.model_ops``).

onnxruntime is an optional dependency (the ``profile`` extra); CUDA goes through onnxruntime-gpu's
CUDAExecutionProvider.
"""

from __future__ import annotations

import json
import logging
import math
import os
import platform
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from planner.errors import ConfigError, ModelError, PlannerError
from planner.graph.loader import model_tensors, read_model
from planner.hardware.efficiency import memory_time_s, op_time_s
from planner.hardware.onnx_ops import PER_ELEMENT_FLOPS, NodeCost, bind_inputs, node_costs
from planner.onnxruntime_import import import_onnxruntime
from planner.types import DeviceProfile

log = logging.getLogger(__name__)

OPSET = 17
SQUARE_SIZES = (32, 64, 128, 192, 256, 384, 512, 768, 1024, 1536)
# (m, n, k): tall, wide and deep shapes, so the curve is not fitted to cubes alone
RECT_SIZES = ((4096, 64, 64), (2048, 256, 128), (256, 2048, 256), (8192, 128, 512), (1024, 1024, 128),
              (128, 1024, 2048), (2048, 768, 768), (512, 3072, 768), (64, 64, 4096), (4096, 512, 64))
# (batch, in channels, size, out channels, kernel, stride): 3x3 and 1x1 convolutions of CNN-like sizes
CONV_SHAPES = ((8, 16, 64, 16, 3, 1), (8, 32, 32, 64, 3, 1), (8, 64, 32, 64, 3, 1), (8, 128, 16, 128, 3, 1),
               (8, 256, 8, 256, 3, 1), (8, 64, 32, 128, 1, 1), (8, 128, 16, 256, 3, 2), (2, 3, 128, 32, 3, 1),
               (8, 512, 4, 512, 3, 1), (32, 32, 16, 32, 3, 1))
# non-GEMM arithmetic probes (op, attributes), on a cache-resident [64, 1024] tensor
VECTOR_PROBES = (("LayerNormalization", {"axis": -1}), ("Softmax", {"axis": -1}), ("Erf", {}), ("Tanh", {}),
                 ("Sigmoid", {}))
VECTOR_SHAPE = (64, 1024)
ADD_NUMELS = tuple(2 ** p for p in range(10, 25)) + (3 * 2 ** 23,)
CHAIN_LENGTH = 200
QUICK = {"square": (64, 256, 512), "rect": ((2048, 256, 128),), "add": (2 ** 12, 2 ** 18, 2 ** 22),
         "conv": ((8, 32, 32, 64, 3, 1),)}
COMPUTE_BOUND_FRACTION = 0.5  # a GEMM counts for the curve when its bytes take < half its measured time


class ProfilerUnavailable(PlannerError):
    """The optional dependencies of ``planner profile`` are missing."""


def _ort():
    try:
        onnxruntime = import_onnxruntime()
    except ImportError:
        raise ProfilerUnavailable("planner profile needs onnxruntime: pip install 'planner[profile]' "
                                  "(for --device cuda: pip install onnxruntime-gpu)") from None
    return onnxruntime


@dataclass(frozen=True)
class Runner:
    """Builds onnxruntime sessions on one execution provider."""

    device: str  # "cpu" | "cuda"
    threads: int = 0  # 0 = onnxruntime's default (one per physical core)
    # "wall": elapsed time; "cpu": the calling thread's CPU time, which other processes on a shared machine
    # do not inflate (single-threaded CPU runs only: onnxruntime then computes on the calling thread)
    clock: str = "wall"

    @property
    def timer(self):
        return time.thread_time if self.clock == "cpu" else time.perf_counter

    @property
    def providers(self) -> list[str]:
        return ["CUDAExecutionProvider", "CPUExecutionProvider"] if self.device == "cuda" else ["CPUExecutionProvider"]

    def check(self) -> None:
        ort = _ort()
        if self.clock == "cpu" and (self.device != "cpu" or self.threads != 1):
            raise ConfigError("--clock cpu measures single-threaded CPU runs only: add --threads 1 (and --device cpu)")
        if self.device == "cuda" and "CUDAExecutionProvider" not in ort.get_available_providers():
            raise ProfilerUnavailable("--device cuda needs onnxruntime-gpu with a working CUDA GPU "
                                      "(pip install onnxruntime-gpu); this onnxruntime offers "
                                      f"{', '.join(ort.get_available_providers())}")

    def session(self, model: onnx.ModelProto, profile_dir: str | None = None):
        ort = _ort()
        options = ort.SessionOptions()
        # no graph rewrites: every ONNX node is one timed kernel, so per-op times map one to one
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        options.log_severity_level = 4  # its errors become ModelErrors; nothing else on stderr
        if self.threads:
            options.intra_op_num_threads = self.threads
        if profile_dir is not None:
            options.enable_profiling = True
            options.profile_file_prefix = os.path.join(profile_dir, "ort")
        return ort.InferenceSession(model.SerializeToString(), sess_options=options, providers=self.providers)


# ------------------------------------------------------------------------------------------ tiny graphs

def _model(nodes, inputs, outputs, initializers=(), like: onnx.ModelProto | None = None) -> onnx.ModelProto:
    """A graph of ``nodes``, at the profiler's own opset, or at the opsets and IR version of ``like`` (a node
    taken from a model keeps the meaning of the opset it was written for)."""
    graph = helper.make_graph(nodes, "probe", inputs, outputs, initializer=list(initializers))
    if like is None:
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
        model.ir_version = 8
    else:
        model = helper.make_model(graph, opset_imports=list(like.opset_import))
        model.ir_version = like.ir_version
    return model


def _f32(name: str, shape: Sequence[int] | None):
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, None if shape is None else list(shape))


def matmul_model(m: int, n: int, k: int, copies: int = 1, dtype: str = "fp32") -> onnx.ModelProto:
    """``copies`` independent MatMuls of the same operands (timed together, so each is long enough to
    time by wall clock), in fp32 or fp16."""
    elem = TensorProto.FLOAT16 if dtype == "fp16" else TensorProto.FLOAT
    value = lambda name, shape: helper.make_tensor_value_info(name, elem, list(shape))  # noqa: E731
    return _model([helper.make_node("MatMul", ["a", "b"], [f"c{i}"], name=f"gemm{i}") for i in range(copies)],
                  [value("a", (m, k)), value("b", (k, n))], [value(f"c{i}", (m, n)) for i in range(copies)])


def add_model(numel: int, copies: int = 1) -> onnx.ModelProto:
    return _model([helper.make_node("Add", ["x", "y"], [f"z{i}"], name=f"add{i}") for i in range(copies)],
                  [_f32("x", (numel,)), _f32("y", (numel,))], [_f32(f"z{i}", (numel,)) for i in range(copies)])


def conv_model(shape: tuple[int, int, int, int, int, int], copies: int = 1) -> onnx.ModelProto:
    batch, cin, size, cout, kernel, stride = shape
    pad = kernel // 2
    weight = numpy_helper.from_array(
        (np.random.default_rng(0).standard_normal((cout, cin, kernel, kernel)) * 0.05).astype(np.float32), "w")
    nodes = [helper.make_node("Conv", ["x", "w"], [f"y{i}"], name=f"conv{i}", pads=[pad] * 4,
                              strides=[stride, stride]) for i in range(copies)]
    return _model(nodes, [_f32("x", (batch, cin, size, size))], [_f32(f"y{i}", None) for i in range(copies)], [weight])


def vector_model(op: str, attrs: dict, copies: int = 1) -> onnx.ModelProto:
    width = VECTOR_SHAPE[-1]
    inputs, consts = ["x"], []
    if op == "LayerNormalization":
        consts = [numpy_helper.from_array(np.ones(width, np.float32), "scale"),
                  numpy_helper.from_array(np.zeros(width, np.float32), "bias")]
        inputs = ["x", "scale", "bias"]
    nodes = [helper.make_node(op, inputs, [f"y{i}"], name=f"{op.lower()}{i}", **attrs) for i in range(copies)]
    return _model(nodes, [_f32("x", VECTOR_SHAPE)], [_f32(f"y{i}", VECTOR_SHAPE) for i in range(copies)], consts)


def chain_model(length: int) -> onnx.ModelProto:
    nodes = [helper.make_node("Relu", [f"t{i}"], [f"t{i + 1}"], name=f"relu{i}") for i in range(length)]
    return _model(nodes, [_f32("t0", (1,))], [_f32(f"t{length}", (1,))])


# -------------------------------------------------------------------------------------------- feeding

def _numpy_dtype(elem_type: int):
    return helper.tensor_dtype_to_np_dtype(elem_type)


def make_feeds(session, rng: np.random.Generator) -> dict[str, np.ndarray]:
    feeds = {}
    for value in session.get_inputs():
        shape = [d if isinstance(d, int) else 1 for d in value.shape]
        if "float" in value.type:
            dtype = np.float16 if "float16" in value.type else np.float32
            feeds[value.name] = rng.standard_normal(shape).astype(dtype)
        elif "bool" in value.type:
            feeds[value.name] = np.zeros(shape, dtype=bool)
        else:  # integer inputs (token ids, indices): zero is a valid index everywhere
            feeds[value.name] = np.zeros(shape, dtype=np.int64 if "int64" in value.type else np.int32)
    return feeds


def runnable(model: onnx.ModelProto, seed: int = 0) -> onnx.ModelProto:
    """A copy of ``model`` that onnxruntime can run: every node named, and floating-point tensors that carry
    no data (initializers of graphs written without weights) or keep it as external data (initializers and
    tensor attributes such as a Constant's value, in subgraphs too) filled with seeded random values of the
    right shape. External data is never read, and onnxruntime, handed the model as bytes, would resolve its
    location against the current directory; a non-floating-point tensor without data is refused, since
    made-up indices or shapes would not run."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    rng = np.random.default_rng(seed)
    for index, node in enumerate(out.graph.node):
        if not node.name:
            node.name = f"{node.op_type}_{index}"
    for tensor, owner, initializer in model_tensors(out):
        external = tensor.data_location == TensorProto.EXTERNAL
        has_data = bool(tensor.raw_data) or any(len(getattr(tensor, f)) for f in (
            "float_data", "int32_data", "int64_data", "double_data", "uint64_data", "string_data"))
        if not external and (has_data or not initializer):
            continue
        if tensor.data_type == TensorProto.BFLOAT16:
            raise ModelError(f"{owner} is bf16 without data in the file (external data is never read); "
                             "onnxruntime's CPU kernels need fp32/fp16 to profile this model")
        if tensor.data_type not in (TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.DOUBLE):
            raise ModelError(f"{owner} has no data in the file (external data is never read) and is not floating "
                             "point, so its values cannot be made up; store it inside the .onnx file")
        numel = int(np.prod(tensor.dims)) if len(tensor.dims) else 1
        values = (rng.standard_normal(numel) * 0.02).astype(_numpy_dtype(tensor.data_type))
        tensor.CopyFrom(numpy_helper.from_array(values.reshape(tuple(tensor.dims)), tensor.name))
    return out


# ------------------------------------------------------------------------------------------- measuring

def _one_run(runner: Runner, session, feeds):
    """A callable that runs the session once. On CUDA, inputs and outputs stay on the GPU (IO binding), so
    only the kernels are timed, not host-device copies."""
    if runner.device != "cuda":
        return lambda: session.run(None, feeds)
    ort = _ort()
    binding = session.io_binding()
    for name, array in feeds.items():
        binding.bind_ortvalue_input(name, ort.OrtValue.ortvalue_from_numpy(array, "cuda", 0))
    for output in session.get_outputs():
        binding.bind_output(output.name, "cuda")

    def run() -> None:
        session.run_with_iobinding(binding)
        binding.synchronize_outputs()
    return run


def run_time_s(runner: Runner, session, feeds, min_runs: int = 5, min_time_s: float = 0.3, warmup: int = 2) -> float:
    """Fastest time of one run (by the runner's clock) over at least ``min_runs`` runs and ``min_time_s``.
    The minimum, not the median: on a shared machine other processes only ever add time."""
    run, timer = _one_run(runner, session, feeds), runner.timer
    for _ in range(warmup):
        run()
    times: list[float] = []
    start = time.perf_counter()
    while len(times) < min_runs or (time.perf_counter() - start < min_time_s and len(times) < 2000):
        t0 = timer()
        run()
        times.append(timer() - t0)
    return min(times)


def kernel_times_s(runner: Runner, model: onnx.ModelProto, runs: int = 7, seed: int = 0,
                   feeds: dict[str, np.ndarray] | None = None) -> dict[str, float]:
    """Fastest kernel time of every node over ``runs`` runs (after two warm-up runs), from onnxruntime's
    profiler (1 us resolution). Keys are node names."""
    with tempfile.TemporaryDirectory() as tmp:
        session = runner.session(model, profile_dir=tmp)
        feeds = feeds if feeds is not None else make_feeds(session, np.random.default_rng(seed))
        for _ in range(2 + runs):
            session.run(None, feeds)
        trace_file = session.end_profiling()
        with open(trace_file, encoding="utf-8") as fh:
            events = json.load(fh)
    per_node: dict[str, list[float]] = {}
    for event in events:
        if event.get("cat") == "Node" and event.get("name", "").endswith("_kernel_time"):
            per_node.setdefault(event["name"][: -len("_kernel_time")], []).append(event["dur"] * 1e-6)
    return {name: min(ts[2:] if len(ts) > 2 else ts) for name, ts in per_node.items()}


SMALL_TENSOR = 1024  # elements: tensors this small are parameters of ops (scalars, shapes), not data
TARGET_GRAPH_S = 0.004  # each timed probe graph runs about this long, so timer and dispatch noise vanish
MAX_COPIES = 256


def _per_op_s(runner: Runner, build, single_guess_s: float, base_s: float, rng: np.random.Generator) -> float:
    copies = int(min(MAX_COPIES, max(1, TARGET_GRAPH_S / max(single_guess_s, 1e-7))))
    session = runner.session(build(copies))
    feeds = make_feeds(session, rng)
    total = run_time_s(runner, session, feeds, min_runs=5, min_time_s=0.1)
    return max(total - base_s, 1e-9) / copies


def _run_overhead_s(runner: Runner) -> float:
    """Wall time of running a one-op graph: what every timed probe graph costs besides its ops."""
    session = runner.session(chain_model(1))
    return run_time_s(runner, session, make_feeds(session, np.random.default_rng(0)), min_runs=50, min_time_s=0.2)


def measure_gemms(runner: Runner, shapes: Sequence[tuple[int, int, int]],
                  dtype: str = "fp32") -> list[dict[str, float]]:
    rng = np.random.default_rng(0)
    base = _run_overhead_s(runner)
    rows = []
    for m, n, k in shapes:
        build = (lambda m, n, k: lambda c: matmul_model(m, n, k, c, dtype))(m, n, k)
        guess = _per_op_s(runner, build, 1.0, base, rng)
        seconds = _per_op_s(runner, build, guess, base, rng)
        rows.append({"m": m, "n": n, "k": k, "seconds": seconds, "flops": 2.0 * m * n * k})
        log.info("%s GEMM %dx%dx%d: %.3g s (%.3g GFLOP/s)", dtype, m, n, k, seconds, 2.0 * m * n * k / seconds / 1e9)
    return rows


def measure_adds(runner: Runner, numels: Sequence[int]) -> list[dict[str, float]]:
    rng = np.random.default_rng(0)
    base = _run_overhead_s(runner)
    rows = []
    for numel in numels:
        guess = _per_op_s(runner, lambda c: add_model(numel, c), 1.0, base, rng)
        seconds = _per_op_s(runner, lambda c: add_model(numel, c), guess, base, rng)
        rows.append({"bytes": 12.0 * numel, "seconds": seconds})
        log.info("Add of %d floats: %.3g s (%.3g GB/s)", numel, seconds, 12.0 * numel / seconds / 1e9)
    return rows


def measure_convs(runner: Runner, shapes) -> list[dict[str, float]]:
    rng = np.random.default_rng(0)
    base = _run_overhead_s(runner)
    rows = []
    for shape in shapes:
        batch, cin, size, cout, kernel, stride = shape
        out = -(-size // stride)
        flops = 2.0 * batch * cout * out * out * cin * kernel * kernel
        build = (lambda shape: lambda c: conv_model(shape, c))(shape)
        guess = _per_op_s(runner, build, 1.0, base, rng)
        seconds = _per_op_s(runner, build, guess, base, rng)
        rows.append({"batch": batch, "in_channels": cin, "size": size, "out_channels": cout, "kernel": kernel,
                     "stride": stride, "seconds": seconds, "flops": flops})
        log.info("Conv %s: %.3g s (%.3g GFLOP/s)", shape, seconds, flops / seconds / 1e9)
    return rows


def measure_vector_ops(runner: Runner) -> list[dict[str, Any]]:
    rng = np.random.default_rng(0)
    base = _run_overhead_s(runner)
    numel = math.prod(VECTOR_SHAPE)
    rows = []
    for op, attrs in VECTOR_PROBES:
        build = (lambda op, attrs: lambda c: vector_model(op, attrs, c))(op, attrs)
        guess = _per_op_s(runner, build, 1.0, base, rng)
        seconds = _per_op_s(runner, build, guess, base, rng)
        flops = PER_ELEMENT_FLOPS.get(op, 1.0) * numel
        rows.append({"op": op, "seconds": seconds, "flops": flops})
        log.info("%s on %s: %.3g s (%.3g GFLOP/s)", op, VECTOR_SHAPE, seconds, flops / seconds / 1e9)
    return rows


def measure_op_overhead_s(runner: Runner) -> float:
    """Wall time per op of a chain of tiny ops, minus that of a one-op graph: what running one more op
    costs (executor dispatch plus kernel launch)."""
    rng = np.random.default_rng(0)
    long_session = runner.session(chain_model(CHAIN_LENGTH))
    short_session = runner.session(chain_model(1))
    feeds = make_feeds(long_session, rng)
    long_s = run_time_s(runner, long_session, feeds, min_runs=20, min_time_s=0.5)
    short_s = run_time_s(runner, short_session, feeds, min_runs=20, min_time_s=0.5)
    return max(long_s - short_s, 0.0) / (CHAIN_LENGTH - 1)


POOL_PROBE_SHAPE = (16, 64, 32, 32)  # not a shape of the benchmark's CNN
ROW_PROBE_ROWS = 4096  # rows of the 1-element-wide Softmax / LayerNormalization that time the per-row cost


def _alone_s(runner: Runner, model: onnx.ModelProto) -> float:
    """Time of the model's single node timed alone, exactly as ``isolated_node_times_s`` times model ops."""
    model = onnx.shape_inference.infer_shapes(model)
    return isolated_node_times_s(runner, model)[model.graph.node[0].name]


def measure_kernel_costs(runner: Runner, op_overhead_s: float) -> dict[str, float]:
    """Kernel costs that the roofline does not hold, recorded under the profile's ``measured.kernel_costs``:

    * ``graph_output_s``: what a node timed alone costs beyond ``op_overhead_s`` for each output, which is
      then a graph output (onnxruntime allocates it and hands it back to the caller): a 1-element Identity
      timed alone, minus ``op_overhead_s`` (dispatch of a node inside a model, from the Relu chain);
    * ``row_s``: the fixed cost per row of a last-axis reduction (per row: a max or mean pass, a sum, a
      reciprocal, loop setup): Softmax and LayerNormalization on a [4096, 1] tensor timed alone, minus one
      node's fixed cost, per row (median of the two);
    * ``pool_elements_per_s``: the rate at which pooling kernels read window elements (onnxruntime's pooling
      loops over each output's window, well below the vector rate): a 2x2 stride-2 MaxPool on a
      [16, 64, 32, 32] tensor timed alone, minus one node's fixed cost."""
    identity = _model([helper.make_node("Identity", ["x"], ["y"], name="identity")], [_f32("x", (1,))],
                      [_f32("y", (1,))])
    node_s = _alone_s(runner, identity)
    rows = []
    for op in ("Softmax", "LayerNormalization"):
        inputs, consts = ["x"], []
        if op == "LayerNormalization":
            consts = [numpy_helper.from_array(np.ones(1, np.float32), "scale"),
                      numpy_helper.from_array(np.zeros(1, np.float32), "bias")]
            inputs = ["x", "scale", "bias"]
        probe = _model([helper.make_node(op, inputs, ["y"], name=op.lower(), axis=-1)],
                       [_f32("x", (ROW_PROBE_ROWS, 1))], [_f32("y", (ROW_PROBE_ROWS, 1))], consts)
        rows.append(max(_alone_s(runner, probe) - node_s, 0.0) / ROW_PROBE_ROWS)
    pool = _model([helper.make_node("MaxPool", ["x"], ["y"], name="maxpool", kernel_shape=[2, 2], strides=[2, 2])],
                  [_f32("x", POOL_PROBE_SHAPE)], [_f32("y", None)])
    batch, channels, height, width = POOL_PROBE_SHAPE
    window_elements = batch * channels * (height // 2) * (width // 2) * 4
    pool_s = max(_alone_s(runner, pool) - node_s, 1e-9)
    fixed = {"graph_output_s": max(node_s - op_overhead_s, 0.0), "row_s": statistics.median(rows),
             "pool_elements_per_s": window_elements / pool_s}
    log.info("a node alone: %.3g s, of which graph output %.3g s; %.3g s per reduced row; pooling %.3g "
             "elements/s", node_s, fixed["graph_output_s"], fixed["row_s"], fixed["pool_elements_per_s"])
    return fixed


def _single_node_model(node: onnx.NodeProto, values: dict[str, onnx.ValueInfoProto],
                       initializers: dict[str, onnx.TensorProto], copies: int,
                       source: onnx.ModelProto) -> onnx.ModelProto:
    """``copies`` copies of one node of ``source``; its computed inputs become graph inputs, its constants
    stay. The graph imports ``source``'s opsets: an op's definition depends on the opset version."""
    nodes, outputs = [], []
    for c in range(copies):
        clone = onnx.NodeProto()
        clone.CopyFrom(node)
        clone.name = f"{node.name}__{c}"
        del clone.output[:]
        for out in node.output:
            clone.output.append(f"{out}__{c}" if out else "")
            if out:
                elem = values[out].type.tensor_type.elem_type if out in values else TensorProto.FLOAT
                outputs.append(helper.make_tensor_value_info(f"{out}__{c}", elem, None))
        nodes.append(clone)
    inputs = [values[i] for i in dict.fromkeys(node.input) if i and i not in initializers]
    consts = [initializers[i] for i in dict.fromkeys(node.input) if i in initializers]
    return _model(nodes, inputs, outputs, consts, like=source)


def isolated_node_times_s(runner: Runner, model: onnx.ModelProto,
                          constants: dict[str, onnx.TensorProto] | None = None) -> dict[str, float]:
    """Each node of a shape-complete, runnable model timed alone through onnxruntime by the runner's clock
    (copies of the node per graph so that short ops are timed well; the cost of running a graph is
    subtracted). Used with ``--clock cpu``, where the profiler's wall-clock kernel times would count the
    time other processes hold the CPU."""
    inferred = onnx.shape_inference.infer_shapes(model, data_prop=True)
    values = {v.name: v for v in list(inferred.graph.input) + list(inferred.graph.value_info)
              + list(inferred.graph.output)}
    initializers = {i.name: i for i in model.graph.initializer} | dict(constants or {})
    base = _run_overhead_s(runner)
    rng = np.random.default_rng(0)
    times = {}
    for node in model.graph.node:
        build = (lambda node: lambda copies: _single_node_model(node, values, initializers, copies, model))(node)
        guess = _per_op_s(runner, build, 1.0, base, rng)
        times[node.name] = _per_op_s(runner, build, guess, base, rng)
    return times


@dataclass(frozen=True)
class ModelMeasurement:
    end_to_end_s: float
    kernel_s: dict[str, float]  # node name -> its fastest time over the runs, seconds
    costs: tuple[NodeCost, ...]


def _ort_errors() -> tuple[type[BaseException], ...]:
    """The exceptions onnxruntime raises for a graph it cannot load or run."""
    state = _ort().capi.onnxruntime_pybind11_state
    return tuple(getattr(state, name) for name in ("Fail", "InvalidGraph", "InvalidArgument", "NotImplemented",
                                                   "RuntimeException", "InvalidProtobuf") if hasattr(state, name))


@dataclass(frozen=True)
class PreparedModel:
    """A model ready to time: dims bound, weights filled, every tensor's real shape in ``value_info``."""

    model: onnx.ModelProto
    costs: tuple[NodeCost, ...]
    # the non-floating-point and the small tensors of a real run (shapes, indices, masks, scalars): an op
    # timed alone gets these values, since made-up ones could be invalid (a zero Range step, a dropout ratio)
    constants: dict[str, onnx.TensorProto]


def _run_all_tensors(runner: Runner, model: onnx.ModelProto) -> dict[str, np.ndarray]:
    """Every intermediate tensor of one run of the model (random float inputs, zero integer inputs)."""
    inferred = onnx.shape_inference.infer_shapes(model, strict_mode=False, data_prop=True)
    types = {v.name: v.type.tensor_type.elem_type
             for v in list(inferred.graph.value_info) + list(inferred.graph.output)}
    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    declared = {o.name for o in probe.graph.output}
    for node in probe.graph.node:
        for name in node.output:
            if name and name not in declared and types.get(name):
                probe.graph.output.append(helper.make_tensor_value_info(name, types[name], None))
                declared.add(name)
    session = runner.session(probe)
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(None, make_feeds(session, np.random.default_rng(0)))))


def prepare_model(runner: Runner, model: onnx.ModelProto, dims: dict[str, int]) -> PreparedModel:
    """Bind the model's dims (others 1), make it runnable, give every tensor its real shape, and cost its
    ops. Raises ModelError for a model onnxruntime cannot run."""
    bound, defaulted = bind_inputs(model, dims)
    if defaulted:
        log.info("symbolic dimensions %s not bound; using 1", ", ".join(defaulted))
    shaped = runnable(bound)
    try:
        tensors = _run_all_tensors(runner, shaped)
    except _ort_errors() as exc:
        raise ModelError(f"onnxruntime cannot run this model: {_first_line(exc)}") from None
    del shaped.graph.value_info[:]
    outputs = {o.name for o in shaped.graph.output}
    constants = {}
    for name, array in tensors.items():
        array = np.asarray(array)
        if name not in outputs:
            shape = list(array.shape)
            elem = helper.np_dtype_to_tensor_dtype(array.dtype)
            shaped.graph.value_info.append(helper.make_tensor_value_info(name, elem, shape))
        if not np.issubdtype(array.dtype, np.floating) or array.size <= SMALL_TENSOR:
            constants[name] = numpy_helper.from_array(array, name)
    return PreparedModel(model=shaped, costs=tuple(node_costs(shaped)), constants=constants)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else exc.__class__.__name__


def measure_model(runner: Runner, model: onnx.ModelProto, dims: dict[str, int],
                  prepared: PreparedModel | None = None) -> ModelMeasurement:
    """End-to-end time and per-op times of a model (its symbolic dims bound by ``dims``, others 1), plus
    the op cost table used to predict it."""
    prepared = prepared or prepare_model(runner, model, dims)
    try:
        session = runner.session(prepared.model)
        feeds = make_feeds(session, np.random.default_rng(0))
        end_to_end = run_time_s(runner, session, feeds, min_runs=10, min_time_s=2.0)
        if runner.clock == "cpu" or runner.device == "cuda":  # the profiler's CUDA times are launch times
            kernels = isolated_node_times_s(runner, prepared.model, prepared.constants)
        else:
            runs = max(10, min(40, int(2.0 / max(end_to_end, 1e-4))))
            kernels = kernel_times_s(runner, prepared.model, runs=runs, feeds=feeds)
    except _ort_errors() as exc:
        raise ModelError(f"onnxruntime cannot run this model: {_first_line(exc)}") from None
    return ModelMeasurement(end_to_end_s=end_to_end, kernel_s=kernels, costs=prepared.costs)


def load_model_file(path: str | os.PathLike) -> onnx.ModelProto:
    """``--model``: read as every command reads a model (a regular file, an ONNX graph, external data only
    inside its folder), weight data never loaded."""
    return read_model(path)


# ---------------------------------------------------------------------------------------------- fitting

def _binned_curve(points: Sequence[tuple[float, float]], bin_factor: float = 4.0) -> list[list[float]]:
    """Median y per bin of x (bins a factor ``bin_factor`` wide in x), at the bins' median x; sorted."""
    if not points:
        return []
    points = sorted(points)
    origin = np.log(points[0][0])
    bins: dict[int, list[tuple[float, float]]] = {}
    for x, y in points:
        bins.setdefault(int((np.log(x) - origin) // np.log(bin_factor)), []).append((x, y))
    curve = []
    for _, members in sorted(bins.items()):
        xs = [x for x, _ in members]
        ys = [y for _, y in members]
        curve.append([float(statistics.median(xs)), round(float(min(1.0, statistics.median(ys))), 4)])
    return curve


def fit_profile(name: str, gemms: list[dict[str, float]], adds: list[dict[str, float]], op_overhead_s: float,
                memory_bytes: int, description: str, convs: list[dict[str, float]] = (),
                vectors: list[dict[str, Any]] = (), dtype: str = "fp32",
                kernel_costs: dict[str, float] | None = None) -> dict[str, Any]:
    """The device-profile document from measurements."""
    bandwidths = [(row["bytes"], row["bytes"] / row["seconds"]) for row in adds]
    peak_bw = max(bw for _, bw in bandwidths)
    mem_curve = _binned_curve([(b, bw / peak_bw) for b, bw in bandwidths], bin_factor=2.0)
    peak = max(row["flops"] / row["seconds"] for row in gemms)
    probe = DeviceProfile(name=name, peak_flops_per_s={dtype: peak}, memory_bytes=memory_bytes,
                          memory_bandwidth_Bps=peak_bw, memory_efficiency_curve=tuple(map(tuple, mem_curve)))
    compute_bound = []
    for row in gemms:
        elements = row["m"] * row["k"] + row["k"] * row["n"] + row["m"] * row["n"]
        nbytes = (2.0 if dtype in ("fp16", "bf16") else 4.0) * elements
        if memory_time_s(probe, nbytes) < COMPUTE_BOUND_FRACTION * row["seconds"]:
            compute_bound.append((row["flops"], row["flops"] / row["seconds"] / peak))
    gemm_curve = _binned_curve(compute_bound or [(row["flops"], row["flops"] / row["seconds"] / peak)
                                                 for row in gemms])
    conv_curve = _binned_curve([(row["flops"], row["flops"] / row["seconds"] / peak) for row in convs])
    vector_rate = statistics.median(row["flops"] / row["seconds"] for row in vectors) if vectors else 0.0
    measured_what = (f"measured on this machine by `planner profile` through onnxruntime "
                     f"{_ort().__version__} on {platform.node() or 'this host'}")
    return {
        "name": name,
        "vendor": "local",
        "description": description,
        "peak_flops_per_s": {dtype: float(f"{peak:.6g}")},
        "memory_bytes": int(memory_bytes),
        "memory_bandwidth_Bps": float(f"{peak_bw:.6g}"),
        "gemm_efficiency": gemm_curve,
        **({"conv_efficiency": conv_curve} if conv_curve else {}),
        **({"vector_flops_per_s": float(f"{vector_rate:.6g}")} if vector_rate else {}),
        "memory_efficiency": 1.0,
        "memory_efficiency_curve": mem_curve,
        "op_overhead_s": float(f"{op_overhead_s:.4g}"),
        "sources": {
            "peak_flops_per_s": f"fitted: the fastest {dtype} MatMul rate over {len(gemms)} GEMM shapes; "
                                f"{measured_what}",
            "gemm_efficiency": "fitted: median achieved/peak per 4x FLOP bin over the compute-bound GEMM shapes "
                               f"(operand traffic < {COMPUTE_BOUND_FRACTION:g} of the time); {measured_what}",
            "memory_bandwidth_Bps": f"fitted: the fastest element-wise Add over {len(adds)} sizes "
                                    f"({int(adds[0]['bytes'])}..{int(adds[-1]['bytes'])} bytes moved); {measured_what}",
            "memory_efficiency_curve": "fitted: Add bandwidth per 2x size bin over the fastest; caches show as "
                                       f"the small sizes; {measured_what}",
            "memory_efficiency": "1.0: the curve carries the fractions",
            "conv_efficiency": f"fitted: median achieved/peak per 4x FLOP bin over {len(convs)} Conv shapes "
                               f"(3x3 and 1x1, strides 1-2); {measured_what}",
            "vector_flops_per_s": "fitted: median FLOP rate of " + ", ".join(op for op, _ in VECTOR_PROBES)
                                  + f" on a {VECTOR_SHAPE} tensor (FLOPs per element as in "
                                  f"planner/hardware/onnx_ops.py); {measured_what}",
            "op_overhead_s": f"fitted: wall time per op of a {CHAIN_LENGTH}-op chain of 1-element Relu, minus a "
                             f"1-op graph; {measured_what}",
            "memory_bytes": "this machine's physical memory (os.sysconf)" if "cpu" in name else
                            "the GPU's memory as reported by its driver",
        },
        "measured": {
            "gemm": [{k: (int(v) if k in "mnk" else float(f"{v:.6g}")) for k, v in row.items()} for row in gemms],
            "add": [{k: float(f"{v:.6g}") for k, v in row.items()} for row in adds],
            "conv": [{k: (float(f"{v:.6g}") if isinstance(v, float) else v) for k, v in row.items()} for row in convs],
            "vector": [{k: (float(f"{v:.6g}") if isinstance(v, float) else v) for k, v in row.items()}
                       for row in vectors],
            **({"kernel_costs": {k: float(f"{v:.4g}") for k, v in sorted(kernel_costs.items())}}
               if kernel_costs else {}),
        },
    }


def _cpu_memory_bytes() -> int:
    try:
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return 0


def _cuda_memory_bytes() -> int:
    try:
        import torch  # optional: only to read the GPU's memory size
        return int(torch.cuda.get_device_properties(0).total_memory)
    except (ImportError, RuntimeError, AssertionError):  # torch missing or no CUDA device: ask the driver
        import shutil
        import subprocess
        if shutil.which("nvidia-smi"):
            out = subprocess.run(["nvidia-smi", "--query-gpu=memory.total", "--format=csv,noheader,nounits"],
                                 capture_output=True, text=True, check=False).stdout.split()
            if out:
                return int(float(out[0]) * 2 ** 20)
    return 0


def _cpu_description() -> str:
    model = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{model}, {os.cpu_count()} logical CPUs, onnxruntime CPU execution provider"


def profile_device(device: str = "cpu", quick: bool = False, threads: int = 0, name: str | None = None,
                   clock: str = "wall") -> dict[str, Any]:
    """Measure the local device and return the profile document (see ``fit_profile``)."""
    runner = Runner(device=device, threads=threads, clock=clock)
    runner.check()
    squares = QUICK["square"] if quick else SQUARE_SIZES
    rects = QUICK["rect"] if quick else RECT_SIZES
    numels = QUICK["add"] if quick else ADD_NUMELS
    shapes = [(s, s, s) for s in squares] + list(rects)
    # on a GPU, training GEMMs run on tensor cores in 16-bit: the curve comes from fp16, fp32 adds its peak
    dtype = "fp16" if device == "cuda" else "fp32"
    gemms = measure_gemms(runner, shapes, dtype)
    fp32_peak = None
    if device == "cuda":
        fp32 = measure_gemms(runner, [(s, s, s) for s in squares[-3:]], "fp32")
        fp32_peak = max(row["flops"] / row["seconds"] for row in fp32)
    adds = measure_adds(runner, numels)
    convs = measure_convs(runner, QUICK["conv"] if quick else CONV_SHAPES)
    vectors = measure_vector_ops(runner)
    overhead = measure_op_overhead_s(runner)
    kernel_costs = measure_kernel_costs(runner, overhead)
    if device == "cuda":
        memory, description = _cuda_memory_bytes(), "local CUDA GPU through onnxruntime-gpu"
    else:
        memory, description = _cpu_memory_bytes(), _cpu_description()
    threads_note = f"{threads} onnxruntime thread(s)" if threads else "onnxruntime's default threads"
    document = fit_profile(name or f"local-{device}", gemms, adds, overhead, memory,
                           f"{description}; {threads_note}; {clock} clock", convs=convs, vectors=vectors, dtype=dtype,
                           kernel_costs=kernel_costs)
    if fp32_peak:
        document["peak_flops_per_s"]["fp32"] = float(f"{fp32_peak:.6g}")
        document["sources"]["peak_flops_per_s"] += "; fp32: the fastest of three large fp32 MatMuls"
    document["measured"]["settings"] = {"threads": threads, "clock": clock, "quick": quick}
    return document


# ----------------------------------------------------------------------------------------- prediction

@dataclass(frozen=True)
class KernelCosts:
    """The profile's ``measured.kernel_costs`` (see ``measure_kernel_costs``); zero where a profile lacks them."""

    graph_output_s: float = 0.0
    row_s: float = 0.0
    pool_elements_per_s: float = 0.0  # 0: pooling at the profile's vector rate

    @classmethod
    def from_file(cls, path: str | os.PathLike) -> "KernelCosts":
        from planner.hardware.documents import load_data  # noqa: PLC0415 - the one safe YAML/JSON reader

        data = load_data(path)
        data = data if isinstance(data, dict) else {}
        fixed = (data.get("measured") or {}).get("kernel_costs") or {}
        return cls(graph_output_s=float(fixed.get("graph_output_s", 0.0)), row_s=float(fixed.get("row_s", 0.0)),
                   pool_elements_per_s=float(fixed.get("pool_elements_per_s", 0.0)))


def predict_op_s(profile: DeviceProfile, cost: NodeCost, dtype: str = "fp32", costs: KernelCosts = KernelCosts(),
                 alone: bool = False) -> float:
    """Predicted time of one op: roofline on the profile's curves, plus the profile's per-op overhead
    (dispatch), plus ``costs.row_s`` per reduced row (softmax, layer norm); pooling reads its windows at
    ``costs.pool_elements_per_s`` where that is slower than the roofline.

    ``alone=False``: the op inside a whole-model run. A view op (Reshape, Squeeze, Flatten, ...) moves no
    data there (onnxruntime's allocation planner lets its output share its input's buffer), so it costs its
    dispatch only.
    ``alone=True``: the op timed by itself (``isolated_node_times_s``), its outputs graph outputs. Each
    output then costs ``costs.graph_output_s`` (allocated and handed back to the caller), and a view op
    copies its input into that output (an output the caller owns cannot alias the graph's input), which
    is a memory-bound copy of ``cost.view_bytes`` (``_copy_s``)."""
    seconds = op_time_s(profile, cost.flops, cost.bytes, cost.gemm, dtype, kind=cost.kind) + cost.rows * costs.row_s
    if cost.op_class == "pooling" and costs.pool_elements_per_s:  # FLOPs of a pooling op = window elements read
        window_s = cost.flops / costs.pool_elements_per_s + profile.op_overhead_s
        seconds = max(seconds, window_s)
    if alone:
        seconds += cost.outputs * costs.graph_output_s + _copy_s(profile, cost.view_bytes, costs)
    return seconds


def _copy_s(profile: DeviceProfile, nbytes: float, costs: KernelCosts) -> float:
    """Time of the copy inside a view op timed alone. The memory curve's points are Add probes timed alone,
    so their times hold one node's fixed cost (dispatch plus a graph output), which ``predict_op_s`` already
    counts for the view: it is taken out here, down to the copy at full bandwidth."""
    if nbytes <= 0:
        return 0.0
    probe_fixed_s = profile.op_overhead_s + costs.graph_output_s
    return max(memory_time_s(profile, nbytes) - probe_fixed_s, nbytes / profile.memory_bandwidth_Bps)
