"""The Plan: what the search returns and what every exporter reads (Plan JSON, schema_version 1).

Field names follow ../shared/CONTRACT.md; extra fields are allowed. ``Plan.to_json`` is deterministic
(sorted keys, fixed float formatting through ``json``) and ``Plan.from_json`` round-trips it.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from planner.errors import PlannerError

SCHEMA_VERSION = 1


@dataclass(frozen=True)
class ReplicaPlan:
    """One group of identical devices serving a stage (mixed hardware: several per stage)."""

    device_type: str
    devices: tuple[int, ...]
    tp: int
    dp: int
    batch_share: float  # fraction of the stage's samples this replica group processes
    memory_bytes_per_device: float
    time_s: float


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
    memory_bytes_per_device: float
    time_s: float  # forward + backward of one micro-batch on this stage
    replicas: tuple[ReplicaPlan, ...] = ()


@dataclass(frozen=True)
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


@dataclass(frozen=True)
class Plan:
    model: dict[str, Any]  # name, params, flops_per_sample
    cluster: dict[str, Any]  # summary: name, num_devices, groups
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
    memory_per_device_bytes: float = 0.0
    bottleneck: str = ""  # one sentence: what limits this plan and why
    physical_bound_s: float = 0.0  # total FLOPs / summed peak FLOP/s of the devices used
    schema_version: int = SCHEMA_VERSION

    # ------------------------------------------------------------------ serialisation
    def to_dict(self) -> dict[str, Any]:
        return _jsonable(asdict(self))

    def to_json(self, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent, sort_keys=True)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Plan":
        if not isinstance(data, dict):
            raise PlannerError("plan: expected a JSON object at the top level of the plan file")
        version = data.get("schema_version")
        if version != SCHEMA_VERSION:
            raise PlannerError(
                f"plan: schema_version {version!r} is not supported; this planner reads schema_version "
                f"{SCHEMA_VERSION} (re-create the plan with 'planner plan ... --out FILE')")
        try:
            stages = tuple(
                StagePlan(**{**_known(StagePlan, s), "layer_names": tuple(s["layer_names"]),
                             "devices": tuple(s["devices"]),
                             "replicas": tuple(ReplicaPlan(**{**_known(ReplicaPlan, r),
                                                              "devices": tuple(r["devices"])})
                                               for r in s.get("replicas", ()))})
                for s in data["stages"])
            embeddings = tuple(
                EmbeddingPlacement(**{**_known(EmbeddingPlacement, e),
                                      "shards": tuple(EmbeddingShard(device=sh["device"], rows=tuple(sh["rows"]),
                                                                     cols=tuple(sh["cols"]),
                                                                     memory=sh.get("memory", "hbm"))
                                                      for sh in e["shards"])})
                for e in data.get("embeddings", ()))
            search = SearchInfo(**_known(SearchInfo, data.get("search", {})))
            top = {**_known(cls, data), "stages": stages, "embeddings": embeddings, "search": search}
            return cls(**top)
        except (KeyError, TypeError, ValueError) as exc:
            raise PlannerError(f"plan: the plan file is missing or has a malformed field ({exc}); "
                               "validate it against 'planner schema'") from exc

    @classmethod
    def from_json(cls, text: str) -> "Plan":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise PlannerError(f"plan: not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg})") from exc
        return cls.from_dict(data)


def _known(cls: type, data: dict[str, Any]) -> dict[str, Any]:
    """The entries of ``data`` that are fields of the dataclass ``cls`` (extra JSON fields are allowed)."""
    names = {f.name for f in fields(cls)}
    return {k: v for k, v in data.items() if k in names}


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, float) and value != value:  # NaN has no JSON form
        return None
    return value
