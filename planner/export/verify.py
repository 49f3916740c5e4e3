"""Run a split with onnxruntime and compare it with the whole model (``planner split --verify`` and the tests).

Every input of the model -- data and weights alike -- gets seeded random values: floats uniform in
[-1, 1) (the variances a BatchNormalization reads: [0.5, 1.5), so its square root exists), integers uniform
in [0, ``int_high``) (0 alone by default, an index valid in any table), booleans true. The stages
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


def _session(model: onnx.ModelProto) -> Any:
    try:
        import onnxruntime
    except ImportError:
        raise PlannerError("checking a split needs onnxruntime: pip install 'planner[profile]'") from None
    options = onnxruntime.SessionOptions()
    options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.intra_op_num_threads = 1
    return onnxruntime.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


def random_feeds(model: onnx.ModelProto, dims: Mapping[str, int], seed: int = 0,
                 int_high: Mapping[str, int] | None = None) -> dict[str, np.ndarray]:
    """Seeded random values for every graph input of ``model`` (symbolic dimensions bound by ``dims``)."""
    rng = np.random.default_rng(seed)
    feeds: dict[str, np.ndarray] = {}
    initializers = {t.name for t in model.graph.initializer}
    variances = {n.input[4] for n in model.graph.node if n.op_type == "BatchNormalization" and len(n.input) > 4}
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


def run_model(model: onnx.ModelProto, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    session = _session(model)
    names = [o.name for o in session.get_outputs()]
    wanted = {i.name for i in session.get_inputs()}
    return dict(zip(names, session.run(names, {k: v for k, v in feeds.items() if k in wanted})))


def run_stages(stages: Sequence[StageModel], feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Run the stages in order; returns every tensor they output (boundaries and model outputs)."""
    values: dict[str, np.ndarray] = dict(feeds)
    for stage in stages:
        missing = [i.name for i in stage.inputs if i.name not in values]
        if missing:
            raise PlannerError(f"stage {stage.index} needs '{missing[0]}', which no input or earlier stage gives")
        values.update(run_model(stage.model, {i.name: values[i.name] for i in stage.inputs}))
    return values


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
