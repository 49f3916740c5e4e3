"""Run a split with onnxruntime and compare it with the whole model (``planner split --verify`` and the tests).

Every input of the model -- data and weights alike -- gets seeded random values: floats uniform in
[-1, 1) (the variances a BatchNormalization reads: [0.5, 1.5), so its square root exists), integers uniform
in [0, ``int_high``) (0 alone by default, an index valid in any table), booleans true. Dropout runs as
the identity (in training mode it draws a new mask on every run). The stages
run in order, each fed the model inputs and weights it names and the boundary tensors earlier stages
returned; the result is the largest absolute difference from the whole model over every model output.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np
import onnx
from onnx import helper

from planner.errors import ConfigError, PlannerError
from planner.export.stages import StageModel
from planner.graph.loader import refuse_external_data
from planner.onnxruntime_import import import_onnxruntime


def _without_dropout(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` with every Dropout an Identity: a Dropout in training mode draws a new mask on each run, so
    the whole model and its stages could never agree. (Dropouts whose mask output is used are kept.)"""
    read = {t for node in model.graph.node for t in node.input}
    if not any(n.op_type == "Dropout" and (len(n.output) < 2 or n.output[1] not in read) for n in model.graph.node):
        return model
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    for node in copy.graph.node:
        if node.op_type == "Dropout" and (len(node.output) < 2 or node.output[1] not in read):
            replacement = helper.make_node("Identity", [node.input[0]], [node.output[0]], name=node.name)
            node.CopyFrom(replacement)
    return copy


def _session(model: onnx.ModelProto) -> Any:
    # weights_as_inputs makes external initializers inputs; what external data is left (a Constant's value,
    # a subgraph's initializer) would be resolved by onnxruntime against the current directory
    refuse_external_data(model, "checking a split (split --verify)")
    model = _without_dropout(model)
    try:
        onnxruntime = import_onnxruntime()
    except ImportError:
        raise PlannerError("checking a split needs onnxruntime: pip install 'planner[profile]'") from None
    options = onnxruntime.SessionOptions()
    options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.intra_op_num_threads = 1
    # fatal only: identity dropouts leave their ratio constants unused (a warning), and a failed run's error is
    # raised as an exception, which the caller reports once
    options.log_severity_level = 4
    return onnxruntime.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


def weights_as_inputs(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of ``model`` whose weight initializers are graph inputs (the same rule as the split: integer
    and one-element initializers stay, external ones become inputs), so that models without weight data can
    run on random weights. External data elsewhere (a Constant's value, a subgraph's initializer) stays, and
    running the model refuses it."""
    from planner.export.stages import is_constant_initializer

    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    weights = [t for t in copy.graph.initializer if not is_constant_initializer(t)]
    keep = [t for t in copy.graph.initializer if is_constant_initializer(t)]
    del copy.graph.initializer[:]
    copy.graph.initializer.extend(keep)
    declared = {i.name for i in copy.graph.input}
    copy.graph.input.extend(helper.make_tensor_value_info(t.name, t.data_type, list(t.dims))
                            for t in weights if t.name not in declared)
    return copy


def random_feeds(model: onnx.ModelProto, dims: Mapping[str, int], seed: int = 0,
                 int_high: Mapping[str, int] | None = None) -> dict[str, np.ndarray]:
    """Seeded random values for every graph input of ``model`` (symbolic dimensions bound by ``dims``)."""
    rng = np.random.default_rng(seed)
    feeds: dict[str, np.ndarray] = {}
    initializers = {t.name for t in model.graph.initializer}
    variances = _batchnorm_variances(model.graph)
    for value in model.graph.input:
        if value.name in initializers:
            continue
        tensor_type = value.type.tensor_type
        shape = []
        for d in tensor_type.shape.dim:
            if d.HasField("dim_value"):
                shape.append(d.dim_value)
            elif d.dim_param in dims:
                shape.append(dims[d.dim_param])
            else:
                raise ConfigError(f"input '{value.name}' has the symbolic dimension '{d.dim_param}'; bind it with "
                                  f"--dim {d.dim_param}=INT")
        dtype = helper.tensor_dtype_to_np_dtype(tensor_type.elem_type)
        if np.issubdtype(dtype, np.floating) and value.name in variances:
            feeds[value.name] = rng.uniform(0.5, 1.5, size=shape).astype(dtype)
        elif np.issubdtype(dtype, np.floating):
            feeds[value.name] = rng.uniform(-1.0, 1.0, size=shape).astype(dtype)
        elif dtype == np.bool_:
            feeds[value.name] = np.ones(shape, dtype=dtype)
        else:
            high = (int_high or {}).get(value.name, 1)
            feeds[value.name] = rng.integers(0, high, size=shape).astype(dtype)
    return feeds


def _batchnorm_variances(graph: onnx.GraphProto) -> set[str]:
    """Graph inputs read as a BatchNormalization's variance, directly or through Identity nodes."""
    identity_of = {n.output[0]: n.input[0] for n in graph.node if n.op_type == "Identity"}
    found = set()
    for node in graph.node:
        if node.op_type == "BatchNormalization" and len(node.input) > 4:
            name = node.input[4]
            while name in identity_of:
                name = identity_of[name]
            found.add(name)
    return found


def run_model(model: onnx.ModelProto, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The model's outputs on ``feeds``. Inputs the model cannot take at their bound dims (a sequence longer
    than its position table, say) are the user's binding: onnxruntime's InvalidArgument becomes a PlannerError."""
    session = _session(model)  # first: it imports onnxruntime, or says what to install
    from onnxruntime.capi.onnxruntime_pybind11_state import InvalidArgument  # noqa: PLC0415 - with _session's

    names = [o.name for o in session.get_outputs()]
    wanted = {i.name for i in session.get_inputs()}
    try:
        return dict(zip(names, session.run(names, {k: v for k, v in feeds.items() if k in wanted})))
    except InvalidArgument as exc:
        reason = " ".join(str(exc).split())[:240]
        raise PlannerError(f"the model does not run at the dims bound for the check ({reason}); bind dims it takes "
                           "with --dim (a sequence no longer than its position table)") from None


def run_stages(stages: Sequence[StageModel], feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Run the stages in order; returns every tensor they output (boundaries and model outputs)."""
    values: dict[str, np.ndarray] = dict(feeds)
    for stage in stages:
        missing = [i.name for i in stage.inputs if i.name not in values]
        if missing:
            raise PlannerError(f"stage {stage.index} needs '{missing[0]}', which no input or earlier stage gives")
        values.update(run_model(stage.model, {i.name: values[i.name] for i in stage.inputs}))
    return values


_HALF_EPSILON = {onnx.TensorProto.FLOAT16: 2.0**-11, onnx.TensorProto.BFLOAT16: 2.0**-8}


def tolerance(model: onnx.ModelProto, stages: Sequence[StageModel], feeds: Mapping[str, np.ndarray],
              absolute: float = 1e-4) -> float:
    """The largest difference a correct split may show: ``absolute``, plus what rounding at its fp16 or bf16
    stage boundaries can cause. onnxruntime's CPU provider computes many fp16 ops in fp32 and keeps consecutive
    ones in fp32, while a stage boundary stores the tensor in its declared type, so the split rounds where the
    whole model did not, by at most half a unit in the last place per element; the later layers carry that on,
    amplified or damped. So the allowance is the larger of two roundings per boundary at the scale of the
    outputs and twice the outputs' measured change when every boundary element moves by a whole unit
    (:func:`rounding_effect`). A split that wires a tensor wrongly is off by the outputs' own scale."""
    types = {v.name: v.type.tensor_type.elem_type for s in stages for v in s.model.graph.output}
    per_boundary = [max((_HALF_EPSILON.get(types.get(o.name, 0), 0.0) for o in s.outputs if o.to_stages),
                        default=0.0) for s in stages]
    if not any(per_boundary):
        return absolute
    scale = max(float(np.abs(np.asarray(v, dtype=np.float64)).max()) for v in run_model(model, feeds).values())
    return absolute + max(2 * sum(per_boundary) * scale, 2 * rounding_effect(stages, feeds))


def rounding_effect(stages: Sequence[StageModel], feeds: Mapping[str, np.ndarray], seed: int = 1) -> float:
    """The largest change of the split's outputs when every element of its fp16 and bf16 boundary tensors is
    moved by one unit in the last place, up or down at random (seeded): how far the stages after a boundary
    carry a rounding there."""
    rng = np.random.default_rng(seed)
    types = {v.name: v.type.tensor_type.elem_type for s in stages for v in s.model.graph.output}
    boundaries = {o.name for s in stages for o in s.outputs if o.to_stages and types.get(o.name) in _HALF_EPSILON}
    plain = run_stages(stages, feeds)
    moved: dict[str, np.ndarray] = dict(feeds)
    for stage in stages:
        inputs = {}
        for i in stage.inputs:
            value = moved[i.name]
            if i.name in boundaries:
                step = 2 * _HALF_EPSILON[types[i.name]] * rng.choice((-1.0, 1.0), size=value.shape)
                value = (value.astype(np.float32) * (1 + step)).astype(value.dtype)
            inputs[i.name] = value
        moved.update(run_model(stage.model, inputs))
    worst = 0.0
    for name in (o.name for s in stages for o in s.outputs if o.model_output):
        change = np.abs(np.asarray(moved[name], dtype=np.float64) - np.asarray(plain[name], dtype=np.float64))
        change = change[np.isfinite(change)]  # an overflow the move caused says nothing about the scale
        worst = max(worst, float(change.max()) if change.size else 0.0)
    return worst


def max_abs_difference(model: onnx.ModelProto, stages: Sequence[StageModel],
                       feeds: Mapping[str, np.ndarray]) -> float:
    """The largest absolute difference between the whole model's outputs and the split's (NaN where only one
    of them is NaN counts as infinitely different; NaN in both as equal)."""
    expected = run_model(model, feeds)
    got = run_stages(stages, feeds)
    worst = 0.0
    for name, value in expected.items():
        a = np.asarray(value, dtype=np.float64)
        b = np.asarray(got[name], dtype=np.float64)
        if a.shape != b.shape:
            return float("inf")
        diff = np.where(np.isnan(a) & np.isnan(b), 0.0, np.abs(a - b))
        diff = np.where(np.isnan(diff), np.inf, diff)
        worst = max(worst, float(diff.max()) if diff.size else 0.0)
    return worst
