"""The Plan: what the search returns and what every exporter reads (Plan JSON, schema_version 1).

Field names follow the user-facing contract (docs/api.md); extra fields are allowed. ``Plan.to_json`` is deterministic
(sorted keys, fixed float formatting through ``json``) and ``Plan.from_json`` round-trips it.

The JSON Schema ships in the package as ``planner/schemas/plan.schema.json`` (``planner schema`` prints it).
:func:`validate` checks a plan document against it with a small built-in interpreter of the keywords the
schema uses (``type``, ``required``, ``properties``, ``items``, ``enum``, ``const``, ``minimum``, ``minItems``,
``maxItems``, ``$ref``): no optional dependency, and fast enough for plans that list millions of embedding
shards (``jsonschema``, a generic validator, takes about five times as long). The tests hold it to
``jsonschema``'s verdicts.
"""

from __future__ import annotations

import io
import json
import os
from collections import Counter
from dataclasses import asdict, dataclass, field, fields, replace
from functools import lru_cache
from importlib import resources
from typing import Any

from planner.errors import ConfigError, PlannerError
from planner.hardware.documents import MAX_PLAN_JSON_BYTES, expand_ranges, load_json, non_finite, read_input
from planner.rules import INTERLEAVED
from planner.runtime import DEFAULT_RUNTIME, get_runtime
from planner.hardware.fp8 import cost_dtype
from planner.types import Batching, Cluster, LayerGraph, PipelineSpec, ReplicaSpec, StageSpec
from planner.units import whole_bytes

SCHEMA_VERSION = 1


@dataclass(frozen=True)
class ReplicaPlan:
    """One group of identical devices serving a stage (mixed hardware: several per stage)."""

    device_type: str
    devices: tuple[int, ...]
    tp: int
    dp: int
    batch_share: float  # fraction of the stage's samples this replica group processes
    memory_bytes_per_device: float  # held as a whole number of bytes (see _whole_memory)
    time_s: float
    cp: int = 1  # context-parallel ranks each sample's sequence is split over (devices: tp x cp x dp)
    ep: int = 1  # expert parallelism (mixture-of-experts models; 1 otherwise)
    expert_tp: int = 1  # ranks each expert's matrices are split over

    def __post_init__(self) -> None:
        _whole_memory(self, "memory_bytes_per_device")


def _whole_memory(record: Any, name: str) -> None:
    """Round ``record``'s byte count ``name`` up to a whole number of bytes (units.whole_bytes): the Plan JSON
    writes byte counts as integers, and a plan equals the plan read back from its JSON. The cost model's
    estimate keeps its own unrounded numbers; nothing decides on a plan's."""
    object.__setattr__(record, name, whole_bytes(getattr(record, name)))


# the fields a replica group's JSON takes from its stage, beside its own
_STAGE_FIELDS_OF_A_GROUP = ("index", "first_layer", "last_layer", "layer_names", "recompute")


@dataclass(frozen=True)
class StagePlan:
    index: int
    first_layer: int
    last_layer: int  # inclusive
    layer_names: tuple[str, ...]
    device_type: str
    devices: tuple[int, ...]
    tp: int
    dp: int
    recompute: str
    memory_bytes_per_device: float  # held as a whole number of bytes (see _whole_memory)
    time_s: float  # forward + backward of one micro-batch on this stage
    replicas: tuple[ReplicaPlan, ...] = ()
    # Layer.kind of each layer ("embedding", "block", "head", ...), parallel to layer_names; empty when
    # unknown. The Megatron exporter counts "block" layers as transformer layers.
    layer_kinds: tuple[str, ...] = ()
    cp: int = 1  # context-parallel ranks each sample's sequence is split over (devices: tp x cp x dp)
    ep: int = 1  # expert parallelism: the routed experts split over ep ranks (1: dense, or every rank all)
    expert_tp: int = 1  # ranks each expert's matrices are split over (Megatron-Core's default: tp)

    def __post_init__(self) -> None:
        _whole_memory(self, "memory_bytes_per_device")


@dataclass(frozen=True, slots=True)  # slots: a plan may hold a million shards
class EmbeddingShard:
    device: int
    rows: tuple[int, int]  # [start, end)
    cols: tuple[int, int]  # [start, end)
    memory: str = "hbm"  # "hbm" | "host"


@dataclass(frozen=True)
class EmbeddingPlacement:
    table: str
    sharding: str  # data_parallel | table_wise | row_wise | column_wise | table_row_wise | table_column_wise
    shards: tuple[EmbeddingShard, ...]
    compute_kernel: str = "fused"


@dataclass(frozen=True)
class SearchInfo:
    time_s: float = 0.0
    candidates_evaluated: int = 0
    proven_optimal: bool = False
    lower_bound_s: float = 0.0
    embedding_lower_bound_s: float | None = None
    algorithm: str = ""
    # the context-parallel degrees the search considered (planner.search.space.cp_choices); a plan is
    # proven optimal within them
    cp_searched: tuple[int, ...] = ()
    # the space the search covered (and its lower bound with it): the vpp values tried, and whether the
    # stages could hold their own layer counts (uneven first, last and middle stages)
    vpp_searched: tuple[int, ...] = ()
    uneven_stages_searched: bool = False


@dataclass(frozen=True)
class Plan:
    """A resolved parallel training plan.

    ``stages`` lists the pipeline stages in layer order (``pp == len(stages)``). With an interleaved schedule
    (``vpp > 1``) each stage's layers are run as ``vpp`` model chunks (Megatron-LM's virtual stages): the
    layer range gives how much of the model a stage holds, the framework picks which chunks.
    """

    model: dict[str, Any]  # name, params, flops_per_sample
    cluster: dict[str, Any]  # summary: see cluster_summary()
    global_batch: int
    micro_batch: int
    num_micro_batches: int
    schedule: str
    zero: int
    iteration_time_s: float
    throughput_samples_per_s: float
    stages: tuple[StagePlan, ...]
    breakdown: dict[str, float]
    search: SearchInfo = field(default_factory=SearchInfo)
    embeddings: tuple[EmbeddingPlacement, ...] = ()
    vpp: int = 1
    sequence_parallel: bool = False
    optimizer: str = "adam"
    dtype: str = "bf16"
    runtime: str = DEFAULT_RUNTIME
    fp8_recipe: str | None = None  # Transformer Engine's FP8 recipe under dtype fp8 (planner.hardware.fp8)
    memory_per_device_bytes: float = 0.0  # held as a whole number of bytes (see _whole_memory)
    bottleneck: str = ""  # one sentence: what limits this plan and why
    physical_bound_s: float = 0.0  # total FLOPs / summed peak FLOP/s of the devices used
    # the expert-parallel all-to-alls under another micro-batch's computation (planner.cost.moe); written to JSON
    # only where true, so that a plan without it reads as before
    ep_overlap: bool = False
    schema_version: int = SCHEMA_VERSION

    def __post_init__(self) -> None:
        _whole_memory(self, "memory_per_device_bytes")

    # ------------------------------------------------------------------ derived views
    @property
    def batching(self) -> Batching:
        """The global batch over the data-parallel replicas of a stage (a stage's ``dp`` counts the replicas
        of all its groups)."""
        return Batching(self.global_batch, self.micro_batch, self.stages[0].dp)

    @property
    def devices(self) -> frozenset[int]:
        """Every device the plan uses (a stage's own list and its replica groups')."""
        return frozenset(d for s in self.stages for group in (s, *s.replicas) for d in group.devices)

    @property
    def num_devices(self) -> int:
        return len(self.devices)

    # ------------------------------------------------------------------ serialisation
    def to_dict(self) -> dict[str, Any]:
        # the embedding shards (millions on large clusters) are written field by field: asdict deep-copies each
        document = _jsonable(asdict(replace(self, embeddings=())))
        document["embeddings"] = [_placement_document(placement) for placement in self.embeddings]
        if not document["ep_overlap"]:
            del document["ep_overlap"]
        # a replica group lists the fields of its stage too (the Plan JSON's contract): the stage's own
        for stage in document["stages"]:
            for group in stage["replicas"]:
                group.update({key: stage[key] for key in _STAGE_FIELDS_OF_A_GROUP})
        return document

    def to_json(self, indent: int | None = 2) -> str:
        # json.dump into a buffer, not json.dumps: with an indent, dumps joins a list of every token, several
        # times the text's memory on a plan of millions of embedding shards; the text is the same
        buffer = io.StringIO()
        json.dump(self.to_dict(), buffer, indent=indent, sort_keys=True)
        return buffer.getvalue()

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Plan":
        """A Plan from its JSON document. The document is validated against the schema first, so a
        malformed file is reported by the path of the field at fault."""
        if not isinstance(data, dict):
            raise PlannerError("plan: expected a JSON object at the top level of the plan file")
        version = data.get("schema_version")
        if version != SCHEMA_VERSION:
            raise PlannerError(
                f"plan: schema_version {version!r} is not supported; this planner reads schema_version "
                f"{SCHEMA_VERSION} (re-create the plan with 'planner plan ... --out FILE')")
        bad = non_finite(data)
        if bad is not None:
            path, value = bad
            raise PlannerError(f"{_path(path)}: {value} is not a finite number; see 'planner schema' for the "
                               "Plan format (re-create the plan with 'planner plan ... --out FILE')")
        validate(data)
        stages = tuple(_stage_from_dict(s) for s in data["stages"])
        embeddings = tuple(
            EmbeddingPlacement(**{**_known(EmbeddingPlacement, e),
                                  "shards": tuple(EmbeddingShard(device=sh["device"], rows=tuple(sh["rows"]),
                                                                 cols=tuple(sh["cols"]),
                                                                 memory=sh.get("memory", "hbm"))
                                                  for sh in e["shards"])})
            for e in data.get("embeddings", ()))
        known = _known(SearchInfo, data.get("search", {}))
        search = SearchInfo(**{**known, "cp_searched": tuple(known.get("cp_searched", ())),
                               "vpp_searched": tuple(known.get("vpp_searched", ()))})
        top = {**_known(cls, data), "stages": stages, "embeddings": embeddings, "search": search}
        return cls(**top)

    @classmethod
    def from_json(cls, text: str) -> "Plan":
        """A Plan from its JSON text (a plan file's content; :func:`load_plan` reads the file), held to a plan
        file's size limit."""
        if not isinstance(text, str):
            raise PlannerError(f"plan: got a {type(text).__name__}; give the plan's JSON text (Plan.to_json()), or "
                               "read a plan file with planner.plans.load_plan(PATH)")
        size = len(text.encode("utf-8"))
        if size > MAX_PLAN_JSON_BYTES:
            raise PlannerError(f"plan: the text has {size} bytes, over the limit of {MAX_PLAN_JSON_BYTES} for a plan "
                               "file; check that it is the plan meant")
        return cls.from_dict(load_json(text, "plan", PlannerError))


def load_plan(path: str) -> Plan:
    """Read a plan file written by ``planner plan --out FILE`` (or ``Plan.to_json``)."""
    if not isinstance(path, (str, os.PathLike)):
        raise PlannerError(f"plan file: got a {type(path).__name__}; give the path of a plan file written by "
                           "'planner plan MODEL ... --out PLAN.json'")
    try:
        text = read_input(path, PlannerError, MAX_PLAN_JSON_BYTES)
    except PlannerError as exc:
        raise PlannerError(f"{exc}; write a plan file with 'planner plan MODEL ... --out PLAN.json'") from None
    try:
        return Plan.from_json(text)
    except PlannerError as exc:
        raise PlannerError(in_plan_file(path, exc)) from None


def in_plan_file(path: str | os.PathLike, exc: PlannerError) -> str:
    """The message of ``exc``, an error about a plan read from the file ``path``, naming the file once: a message
    that names the plan as ``plan`` at its start (``plan: ...``, or ``plan:LINE: ...`` from the JSON reader) has
    the file's name in its place (``PATH: ...``, ``PATH:LINE: ...``, as a cluster file's errors read); any other
    (one naming a field, ``plan.stages[0].tp: ...``) is prefixed with it."""
    message = str(exc)
    if message.startswith("plan:"):
        return f"{path}{message[len('plan'):]}"
    return f"{path}: {message}"


def plan_recompute(plan: Plan, why: str = "the cost model times one mode per plan") -> str:
    """The recompute mode every stage of ``plan`` shares, or PlannerError naming the modes, ``why`` one mode is
    needed, and the fix (a plan file edited by hand may mix them)."""
    modes = sorted({s.recompute for s in plan.stages})
    if len(modes) > 1:
        raise PlannerError(f"plan: its stages use the recompute modes {', '.join(modes)}; {why}; set every stage's "
                           "'recompute' to one of them")
    return modes[0]


def pipeline_spec(plan: Plan, recompute: str | None = None) -> PipelineSpec:
    """The PipelineSpec of ``plan``'s placement, as the cost model times it: one StageSpec per pipeline stage,
    its replica groups as listed (a stage without ``replicas`` is one group), the plan's degrees, schedule,
    ZeRO stage, dtype and runtime. ``recompute``: the mode of the spec (None: the plan's, which every stage
    must share; :func:`planner.report.gantt.plan_pipeline_specs` gives one spec per mode of a hand-mixed plan).
    Plans that list interleaved model chunks (``pp x vpp`` stages, chunk k on the devices of chunk k mod pp)
    are folded to ``pp`` stages of the same number of layers each, the cost model's view of an interleaved
    pipeline (it times a stage's chunks as equal parts)."""
    stages = list(plan.stages)
    recompute = recompute or plan_recompute(plan)
    vpp = max(plan.vpp, 1)
    if vpp > 1 and len(stages) % vpp == 0 and len(stages) > 1 and \
            stages[0].devices == stages[len(stages) // vpp].devices:
        pp = len(stages) // vpp
        sizes = [sum(c.last_layer - c.first_layer + 1 for c in stages[s::pp]) for s in range(pp)]
        firsts = [sum(sizes[:s]) for s in range(pp)]
        stages = [replace(stages[s], first_layer=firsts[s], last_layer=firsts[s] + sizes[s] - 1) for s in range(pp)]
    groups = [s.replicas or (ReplicaPlan(s.device_type, s.devices, s.tp, s.dp, 1.0, s.memory_bytes_per_device,
                                         s.time_s, s.cp, s.ep, s.expert_tp),) for s in stages]
    eps = {r.ep for g in groups for r in g}
    expert_tps = {r.expert_tp for g in groups for r in g if r.expert_tp != r.tp}
    if len(eps) > 1 or len(expert_tps) > 1:
        raise PlannerError(f"plan: its replica groups use ep {sorted(eps)} and expert_tp "
                           f"{sorted({r.expert_tp for g in groups for r in g})}; the cost model times one "
                           "expert-parallel degree per plan and one expert tp (or each group's tp)")
    spec_stages = tuple(StageSpec(first_layer=s.first_layer, last_layer=s.last_layer,
                                  replicas=tuple(ReplicaSpec(devices=tuple(r.devices), tp=r.tp, dp=r.dp,
                                                             batch_share=r.batch_share, cp=r.cp) for r in g))
                        for s, g in zip(stages, groups))
    return PipelineSpec(stages=spec_stages, global_batch=plan.global_batch, micro_batch=plan.micro_batch, vpp=vpp,
                        zero=plan.zero, recompute=recompute, sequence_parallel=plan.sequence_parallel,
                        schedule=plan.schedule, optimizer=plan.optimizer,
                        dtype=cost_dtype(plan.dtype, plan.fp8_recipe), runtime=plan.runtime,
                        ep=eps.pop() if eps else 1, expert_tp=expert_tps.pop() if expert_tps else 0,
                        ep_overlap=plan.ep_overlap)


def moe_summary(model: LayerGraph) -> dict[str, Any]:
    """The mixture-of-experts entries of a Plan's ``model`` (none for a dense model): the routed experts of
    its MoE layers (the most of any), the experts each token is sent to, the MoE layers and the parameters one
    token uses; and what the Megatron exporter needs to build the same layers: one routed expert's MLP width,
    the shared experts (in multiples of that width), the router's scoring and, per transformer block in order,
    whether it is a mixture-of-experts layer (1) or dense (0)."""
    layers = [layer.moe for layer in model.layers if layer.moe is not None]
    if not layers:
        return {}
    router = Counter(m.router for m in layers).most_common(1)[0][0]  # ties: the first layer's, deterministic
    return {"experts": max(m.experts for m in layers), "top_k": max(m.top_k for m in layers),
            "moe_layers": len(layers), "active_params": model.active_params,
            "expert_ffn": max(m.expert_ffn for m in layers), "shared_experts": max(m.shared_experts for m in layers),
            "router": router,
            "moe_layer_pattern": [int(layer.moe is not None) for layer in model.layers if layer.kind == "block"]}


def shape_summary(model: LayerGraph) -> dict[str, Any]:
    """What a framework's launch configuration needs of the model beside its layers (none where unknown): the
    sequence length its transformer blocks were imported at (``seq_len``, where they agree on one; a token
    budget is micro-batch x this) and the model family its builder recorded (``family``)."""
    lengths = {layer.transformer.seq_len for layer in model.layers if layer.transformer is not None}
    summary: dict[str, Any] = {"seq_len": lengths.pop()} if len(lengths) == 1 else {}
    if model.family:
        summary["family"] = model.family
    return summary


def cluster_summary(cluster: Cluster) -> dict[str, Any]:
    """The ``cluster`` entry of a Plan for a :class:`planner.types.Cluster`: its name, device count and
    groups (name, node profile, device type, node count, device count, first global device id). The TorchRec
    exporter uses the groups to turn global device ids into ``rank:N/cuda:L`` placements."""
    groups = [{"name": g.name, "node": g.node.name, "device": g.node.device.name, "count": g.count,
               "devices": g.num_devices, "first_device": g.first_device} for g in cluster.groups]
    return {"name": cluster.name, "num_devices": cluster.num_devices, "groups": groups}


def cluster_group(plan: Plan, device: int) -> dict[str, Any] | None:
    """The group of ``plan``'s cluster summary (:func:`cluster_summary`) that holds global device ``device``,
    None where none does (a plan file edited by hand)."""
    return next((group for group in plan.cluster.get("groups", ())
                 if group["first_device"] <= device < group["first_device"] + group["devices"]), None)


# ----------------------------------------------------------------------------------------- schema


@lru_cache(maxsize=1)
def schema_text() -> str:
    """The Plan JSON Schema: ``planner/schemas/plan.schema.json`` with its ``x-range`` keywords written out as
    ``minimum``/``maximum`` (the physical limits of planner.hardware.documents.RANGES)."""
    shipped = json.loads(resources.files("planner").joinpath("schemas/plan.schema.json").read_text(encoding="utf-8"))
    return json.dumps(expand_ranges(shipped), indent=2) + "\n"


def schema() -> dict[str, Any]:
    """The Plan JSON Schema (a fresh copy)."""
    return json.loads(schema_text())


def schema_errors(document: Any) -> list[str]:
    """Every violation of the Plan schema in ``document``, as ``"path: message"`` lines (empty: valid)."""
    return _SubsetValidator(schema()).errors(document) or _consistency_errors(document)


def _consistency_errors(plan: dict[str, Any]) -> list[str]:
    """What a schema cannot say: stages numbered in order over contiguous layers, names matching ranges,
    shard ranges non-empty, a runtime this process knows, the schedule its vpp names, replica groups adding up
    to their stage, and the global batch equal to micro-batch x micro-batches x stage 0's dp (what the
    exporters write). Only called on a schema-valid document."""
    out: list[str] = []
    try:
        get_runtime(plan.get("runtime", DEFAULT_RUNTIME))
    except PlannerError as exc:
        out.append(f"plan.runtime: {exc} (a runtime made with planner.register_runtime must be registered before "
                   "its plans are read)")
    vpp = plan.get("vpp", 1)
    if (vpp > 1) != (plan["schedule"] == INTERLEAVED):
        out.append(f"plan.schedule: {plan['schedule']!r} with vpp {vpp}: vpp > 1 is the {INTERLEAVED} schedule, "
                   "vpp 1 any other")
    dp = plan["stages"][0]["dp"]
    if plan["micro_batch"] * plan["num_micro_batches"] * dp != plan["global_batch"]:
        out.append(f"plan.global_batch: {plan['global_batch']} is not micro_batch {plan['micro_batch']} x "
                   f"num_micro_batches {plan['num_micro_batches']} x dp {dp}")
    previous_last = -1
    num_devices = plan["cluster"].get("num_devices")
    owner: dict[Any, int] = {}  # device id -> the first stage listing it
    for i, stage in enumerate(plan["stages"]):
        where = f"plan.stages[{i}]"
        for device in dict.fromkeys(stage["devices"]):
            if device in owner:
                out.append(f"{where}.devices: device {device} is also in stage {owner[device]} (a device runs one "
                           "stage)")
            else:
                owner[device] = i
        first, last = stage["first_layer"], stage["last_layer"]
        if stage["index"] != i:
            out.append(f"{where}.index: {stage['index']} should be {i} (stages are listed in pipeline order)")
        if first != previous_last + 1:
            out.append(f"{where}.first_layer: {first} should be {previous_last + 1} (stages cover consecutive layers)")
        if last < first:
            out.append(f"{where}.last_layer: {last} is before first_layer {first}")
        elif len(stage["layer_names"]) != last - first + 1:
            out.append(f"{where}.layer_names: {len(stage['layer_names'])} names for layers {first}..{last}")
        if stage.get("layer_kinds") and len(stage["layer_kinds"]) != len(stage["layer_names"]):
            out.append(f"{where}.layer_kinds: {len(stage['layer_kinds'])} kinds for {len(stage['layer_names'])} layers")
        out += _device_errors(stage, where, num_devices)
        previous_last = last
    for i, table in enumerate(plan["embeddings"]):
        for j, shard in enumerate(table["shards"]):
            for key in ("rows", "cols"):
                start, end = shard[key]
                if end <= start:
                    out.append(f"plan.embeddings[{i}].shards[{j}].{key}: [{start}, {end}) is empty")
            if isinstance(num_devices, int) and shard["device"] >= num_devices:
                out.append(f"plan.embeddings[{i}].shards[{j}].device: device {shard['device']} is not in the "
                           f"cluster of {num_devices} devices")
    return out


def check_fits_model(plan: Plan, params: int, layers: LayerGraph) -> None:
    """ConfigError unless ``plan`` was made for this model: its ``params`` (the whole model's, embedding tables
    included) and ``layers`` (the layers the plan's stages place: a model with tables, its dense part), by count
    and name. ``planner split`` and ``planner estimate --plan`` (and what-if's re-timing) check alike."""
    planned = plan.model.get("params")
    if isinstance(planned, (int, float)) and planned != params:
        raise ConfigError(f"plan: made for model {plan.model.get('name')!r} of {planned:,} parameters, but "
                          f"{layers.name!r} has {params:,}; give the model the plan was made for, or plan this "
                          "model ('planner plan MODEL ... --out PLAN.json')")
    count = len(layers.layers)
    if plan.stages[-1].last_layer != count - 1:
        raise ConfigError(f"plan: the stages cover layers 0..{plan.stages[-1].last_layer} but the model has "
                          f"{count} layers (0..{count - 1}); was the plan made for this model and these --dim values?")
    for stage in plan.stages:
        for index, planned_name in enumerate(stage.layer_names, stage.first_layer):
            name = layers.layers[index].name
            if planned_name != name:
                raise ConfigError(f"plan: stage {stage.index} lists layer {index} as '{planned_name}' but the "
                                  f"model's layer {index} is '{name}'; the plan was made for another model")


def _device_errors(stage: dict[str, Any], where: str, num_devices: Any) -> list[str]:
    """A stage's devices: distinct ids of the cluster, tp x cp x dp of them in every replica group (cp 1 where
    left out), and a stage with replica groups lists exactly its groups' devices."""
    out: list[str] = []
    replicas = stage.get("replicas") or []
    groups = [(where, stage)] if not replicas else [(f"{where}.replicas[{k}]", r) for k, r in enumerate(replicas)]
    for place, group in groups:
        devices = group["devices"]
        cp = group.get("cp", 1)
        if len(devices) != group["tp"] * cp * group["dp"]:
            if cp == 1:
                out.append(f"{place}.devices: {len(devices)} devices for tp x dp = {group['tp']} x {group['dp']}")
            else:
                out.append(f"{place}.devices: {len(devices)} devices for tp x cp x dp = {group['tp']} x {cp} x "
                           f"{group['dp']}")
    devices = stage["devices"]
    if len(set(devices)) != len(devices):
        out.append(f"{where}.devices: a device is listed twice")
    if replicas and sorted(devices) != sorted(d for r in replicas for d in r["devices"]):
        out.append(f"{where}.devices: not the devices of its replica groups")
    if replicas and sum(r["dp"] for r in replicas) != stage["dp"]:
        out.append(f"{where}.replicas: their dp add up to {sum(r['dp'] for r in replicas)}, not the stage's "
                   f"{stage['dp']}")
    if replicas and abs(sum(r["batch_share"] for r in replicas) - 1) > 1e-6:
        out.append(f"{where}.replicas: their batch shares add up to {sum(r['batch_share'] for r in replicas):g}, "
                   "not 1")
    if isinstance(num_devices, int) and any(d >= num_devices for d in devices):
        out.append(f"{where}.devices: device {max(devices)} is not in the cluster of {num_devices} devices")
    return out


def validate(document: Any) -> None:
    """Raise PlannerError naming the first field at fault if ``document`` does not follow the Plan schema
    or is inconsistent (stages out of order, layer ranges not contiguous, empty shard ranges)."""
    errors = schema_errors(document)
    if errors:
        more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
        raise PlannerError(f"{errors[0]}{more}; see 'planner schema' for the Plan format")


def _path(parts: Any) -> str:
    text = "plan"
    for part in parts:
        text += f"[{part}]" if isinstance(part, int) else f".{part}"
    return text


class _SubsetValidator:
    """A JSON Schema interpreter for exactly the keywords plan.schema.json uses (see the module docstring).
    ``tests/test_plan_schema.py`` checks that the schema uses no other keyword."""

    KEYWORDS = frozenset({"$schema", "$id", "$defs", "$ref", "title", "description", "type", "required",
                          "properties", "additionalProperties", "items", "enum", "const", "minimum",
                          "exclusiveMinimum", "maximum", "minItems", "maxItems",
                          "x-range"})  # written out as minimum/maximum by schema_text
    _TYPES = {"object": dict, "array": list, "string": str, "boolean": bool, "null": type(None)}

    def __init__(self, root: dict[str, Any]) -> None:
        self.root = root
        self._refs: dict[str, dict[str, Any]] = {}

    def errors(self, document: Any) -> list[str]:
        found: list[str] = []
        self._check(document, self.root, [], found)
        return found

    def _type_ok(self, value: Any, name: str) -> bool:
        if name == "integer":
            return isinstance(value, int) and not isinstance(value, bool) or (
                isinstance(value, float) and value.is_integer())
        if name == "number":
            return isinstance(value, (int, float)) and not isinstance(value, bool)
        return isinstance(value, self._TYPES[name])

    def _check(self, value: Any, node: dict[str, Any], path: list[Any], out: list[str]) -> None:
        if "$ref" in node:
            self._check(value, self._target(node["$ref"]), path, out)

        def fail(message: str) -> None:  # the path is spelt out only for an error
            out.append(f"{_path(path)}: {message}")

        if "type" in node:
            names = node["type"] if isinstance(node["type"], list) else [node["type"]]
            if not any(self._type_ok(value, n) for n in names):
                fail(f"{value!r} is not of type {', '.join(repr(n) for n in names)}")
                return
        if "const" in node and value != node["const"]:
            fail(f"{node['const']!r} was expected")
        if "enum" in node and value not in node["enum"]:
            fail(f"{value!r} is not one of {node['enum']!r}")
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            if "minimum" in node and value < node["minimum"]:
                fail(f"{value!r} is less than the minimum of {node['minimum']!r}")
            if "exclusiveMinimum" in node and value <= node["exclusiveMinimum"]:
                fail(f"{value!r} is less than or equal to the minimum of {node['exclusiveMinimum']!r}")
            if "maximum" in node and value > node["maximum"]:
                fail(f"{value!r} is greater than the maximum of {node['maximum']!r}")
        if isinstance(value, dict):
            for key in node.get("required", ()):
                if key not in value:
                    fail(f"{key!r} is a required property")
            for key, sub in node.get("properties", {}).items():
                if key in value:
                    self._check(value[key], sub, path + [key], out)
        if isinstance(value, list):
            if "minItems" in node and len(value) < node["minItems"]:
                fail(f"{value!r} should have at least {node['minItems']} items")
            if "maxItems" in node and len(value) > node["maxItems"]:
                fail(f"{value!r} should have at most {node['maxItems']} items")
            if "items" in node:
                for i, item in enumerate(value):
                    self._check(item, node["items"], path + [i], out)

    def _target(self, ref: str) -> dict[str, Any]:
        target = self._refs.get(ref)
        if target is None:
            target = self.root
            for part in ref.lstrip("#/").split("/"):
                target = target[part]
            self._refs[ref] = target
        return target


# ----------------------------------------------------------------------------------------- helpers


def _stage_from_dict(s: dict[str, Any]) -> StagePlan:
    replicas = tuple(ReplicaPlan(**{**_known(ReplicaPlan, r), "devices": tuple(r["devices"])})
                     for r in s.get("replicas", ()))
    return StagePlan(**{**_known(StagePlan, s), "layer_names": tuple(s["layer_names"]),
                        "layer_kinds": tuple(s.get("layer_kinds", ())),
                        "devices": tuple(s["devices"]), "replicas": replicas})


def _known(cls: type, data: dict[str, Any]) -> dict[str, Any]:
    """The entries of ``data`` that are fields of the dataclass ``cls`` (extra JSON fields are allowed)."""
    names = {f.name for f in fields(cls)}
    return {k: v for k, v in data.items() if k in names}


def _placement_document(placement: EmbeddingPlacement) -> dict[str, Any]:
    """``_jsonable(asdict(placement))``, built directly (its fields are strings, integers and pairs of them)."""
    document: dict[str, Any] = {name: getattr(placement, name) for name in _PLACEMENT_FIELDS}
    document["shards"] = [{name: list(value) if isinstance(value, tuple) else value
                           for name in _SHARD_FIELDS for value in (getattr(shard, name),)}
                          for shard in placement.shards]
    return document


_PLACEMENT_FIELDS = tuple(f.name for f in fields(EmbeddingPlacement) if f.name != "shards")
_SHARD_FIELDS = tuple(f.name for f in fields(EmbeddingShard))


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, float) and (value != value or value in (float("inf"), float("-inf"))):
        return None  # NaN and infinities have no JSON form (the schema then reports the field)
    return value
