"""The cost model: compute, communication, memory and pipeline schedule of one training iteration.

Public API (see each module for the model it implements):

* ``estimate(model, cluster, config)`` and ``estimate_pipeline(model, cluster, spec)`` -> Estimate (of a dense
  model; ``planner.estimate`` joins a model's sparse embedding tables in planner.compose)
* ``layer_costs(model, node, tp, micro_batch, recompute, sequence_parallel, dtype)`` -> LayerCosts
* ``stage_memory(...)``, ``transformer_activation_bytes(...)``, ``micro_batches_in_flight(...)``
* ``dp_sync_time_s(...)``, ``optimizer_time_s(...)``
* ``pipeline_time(...)`` (closed form where exact), ``simulate_pipeline(...)`` -> SimulationResult
"""

from planner.cost.calibration import DeviceCalibration, calibration_for
from planner.cost.comm import dp_sync_time_s
from planner.cost.compute import LayerCosts, layer_costs
from planner.cost.estimator import balanced_split, estimate, estimate_pipeline
from planner.cost.memory import micro_batches_in_flight, stage_memory, transformer_activation_bytes
from planner.cost.optimizer import optimizer_time_s
from planner.cost.schedule import (PipelineEvent, SimulationResult, closed_form_time, pipeline_time,
                                   simulate_pipeline)
from planner.cost.validate import check_config

__all__ = [
    "DeviceCalibration", "LayerCosts", "PipelineEvent", "SimulationResult", "balanced_split", "calibration_for",
    "check_config", "closed_form_time", "dp_sync_time_s", "estimate", "estimate_pipeline", "layer_costs",
    "micro_batches_in_flight", "optimizer_time_s", "pipeline_time", "simulate_pipeline", "stage_memory",
    "transformer_activation_bytes",
]
