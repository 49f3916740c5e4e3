"""The Plan JSON Schema: shipped, printed by `planner schema`, met by every sample plan, enforced on load,
and applied alike by jsonschema and the built-in fallback validator."""

from __future__ import annotations

import copy
import dataclasses
import json
from pathlib import Path

import jsonschema
import pytest

import plan_samples
from planner.cli import main
from planner.errors import PlannerError
from planner.plans import (EmbeddingPlacement, EmbeddingShard, Plan, _SubsetValidator, load_plan, schema,
                           schema_errors, schema_text, validate)

REQUIRED_TOP = ["schema_version", "model", "cluster", "global_batch", "micro_batch", "num_micro_batches", "schedule",
                "zero", "iteration_time_s", "throughput_samples_per_s", "stages", "embeddings", "breakdown", "search"]


def test_schema_is_a_valid_draft_2020_12_schema():
    jsonschema.Draft202012Validator.check_schema(schema())


def test_schema_requires_the_contract_fields():
    s = schema()
    assert sorted(s["required"]) == sorted(REQUIRED_TOP)
    stage = s["$defs"]["stage"]["required"]
    for name in ("index", "first_layer", "last_layer", "layer_names", "device_type", "devices", "tp", "dp",
                 "recompute", "memory_bytes_per_device", "time_s"):
        assert name in stage
    assert set(s["properties"]["breakdown"]["required"]) == {
        "compute_s", "tp_comm_s", "pp_comm_s", "dp_comm_s", "bubble_s", "optimizer_s", "embedding_s"}
    assert s["$defs"]["embedding"]["properties"]["sharding"]["enum"] == [
        "data_parallel", "table_wise", "row_wise", "column_wise", "table_row_wise", "table_column_wise"]
    assert {"proven_optimal", "lower_bound_s"} <= set(s["properties"]["search"]["required"])


def test_schema_enums_are_the_rule_books():
    """The schema's closed lists are planner.rules' own, so a plan file with a name no rule knows is refused."""
    from planner import rules

    s = schema()
    assert s["properties"]["optimizer"]["enum"] == list(rules.OPTIMIZERS)
    assert s["properties"]["dtype"]["enum"] == list(rules.DTYPES)
    assert s["properties"]["schedule"]["enum"] == list(rules.SCHEDULES)
    assert s["properties"]["fp8_recipe"]["enum"] == [*rules.FP8_RECIPE_NAMES, None]
    assert s["$defs"]["stage"]["properties"]["recompute"]["enum"] == list(rules.RECOMPUTE_CHOICES)


def test_schema_command_prints_the_shipped_file(capsys):
    assert main(["schema"]) == 0
    out = capsys.readouterr().out
    assert json.loads(out) == schema()
    assert out == schema_text()


@pytest.mark.parametrize("name", sorted(plan_samples.ALL))
def test_sample_plans_validate_and_round_trip(name):
    plan = plan_samples.ALL[name]()
    document = plan.to_dict()
    assert schema_errors(document) == []
    assert Plan.from_json(plan.to_json()) == plan
    assert Plan.from_json(plan.to_json()).to_json() == plan.to_json()


def test_a_plan_of_many_embedding_shards_is_written_and_read_back(tmp_path):
    """A plan lists a shard per device of each row-wise table: thousands of tables on a thousand devices make
    a plan file far larger than other input files, and it must still load."""
    plan = plan_samples.dlrm_plan()
    row_wise = tuple(EmbeddingPlacement(f"t{t}", "row_wise", tuple(
        EmbeddingShard(d, (100 * d, 100 * d + 100), (0, 64)) for d in range(16))) for t in range(1500))
    plan = dataclasses.replace(plan, embeddings=plan.embeddings + row_wise)
    path = tmp_path / "plan.json"
    path.write_text(plan.to_json())
    assert path.stat().st_size > 4 << 20
    assert load_plan(str(path)) == plan


def test_an_embedding_shard_off_the_cluster_is_refused():
    document = plan_samples.dlrm_plan().to_dict()
    devices = document["cluster"]["num_devices"]
    document["embeddings"][1]["shards"][0]["device"] = devices
    with pytest.raises(PlannerError, match=rf"plan.embeddings\[1\].shards\[0\].device: device {devices} is not in "
                       rf"the cluster of {devices} devices"):
        Plan.from_dict(document)


def _byte_counts(document: dict) -> list:
    """The memory byte counts of a Plan JSON document: the plan's, each stage's and each replica group's."""
    stages = document["stages"]
    return [document["memory_per_device_bytes"], *(s["memory_bytes_per_device"] for s in stages),
            *(r["memory_bytes_per_device"] for s in stages for r in s["replicas"])]


def test_byte_counts_are_written_as_whole_bytes_rounded_up():
    """The cost model's memory sums carry fractions; the plan holds (and its JSON writes) whole bytes, rounded
    up, so a plan still equals the plan read back from its JSON."""
    stage = dataclasses.replace(plan_samples.mixed_plan().stages[1], memory_bytes_per_device=31e9 + 0.4)
    stage = dataclasses.replace(stage, replicas=(dataclasses.replace(stage.replicas[0],
                                                                     memory_bytes_per_device=28e9 + 0.999999),
                                                 *stage.replicas[1:]))
    plan = dataclasses.replace(plan_samples.mixed_plan(), stages=(plan_samples.mixed_plan().stages[0], stage),
                               memory_per_device_bytes=35624430182.399994)
    document = json.loads(plan.to_json())
    counts = _byte_counts(document)
    assert all(type(count) is int for count in counts), counts
    assert counts[0] == 35624430183 and 31_000_000_001 in counts and 28_000_000_001 in counts
    assert Plan.from_json(plan.to_json()) == plan


def test_a_plan_file_with_fractional_byte_counts_still_loads():
    """Plan files written before byte counts were whole numbers hold fractions: the schema takes any number, and
    the plan read holds them rounded up."""
    document = plan_samples.gpt_plan().to_dict()
    document["memory_per_device_bytes"] = 2703273254.4
    document["stages"][0]["memory_bytes_per_device"] = 2703273253.2
    plan = Plan.from_json(json.dumps(document))
    assert plan.memory_per_device_bytes == 2703273255 and plan.stages[0].memory_bytes_per_device == 2703273254


def test_to_json_is_deterministic():
    a, b = plan_samples.dlrm_plan().to_json(), plan_samples.dlrm_plan().to_json()
    assert a == b
    assert list(json.loads(a)) == sorted(json.loads(a))


def test_extra_fields_are_allowed_and_ignored():
    document = plan_samples.gpt_plan().to_dict()
    document["made_by"] = "someone"
    document["stages"][0]["note"] = "x"
    validate(document)
    assert Plan.from_dict(document) == plan_samples.gpt_plan()


def _broken_documents() -> list[tuple[str, dict]]:
    base = plan_samples.dlrm_plan().to_dict()
    cases = []
    for key in REQUIRED_TOP:
        doc = copy.deepcopy(base)
        del doc[key]
        cases.append((f"missing {key}", doc))
    for path, value in [(("stages", 0, "tp"), 0), (("stages", 0, "tp"), "4"), (("stages", 0, "recompute"), "some"),
                        (("zero",), 4), (("embeddings", 1, "sharding"), "random_wise"),
                        (("embeddings", 1, "shards", 0, "rows"), [0]), (("search", "proven_optimal"), "yes"),
                        (("stages", 0, "devices"), []), (("iteration_time_s",), None),
                        (("breakdown", "bubble_s"), -1.0), (("embeddings", 1, "shards", 0, "memory"), "ssd")]:
        doc = copy.deepcopy(base)
        target = doc
        for part in path[:-1]:
            target = target[part]
        target[path[-1]] = value
        cases.append((f"{'.'.join(map(str, path))}={value!r}", doc))
    return cases


@pytest.mark.parametrize("label,document", _broken_documents(), ids=[c[0] for c in _broken_documents()])
def test_broken_plans_are_rejected_by_both_validators(label, document):
    strict = list(jsonschema.Draft202012Validator(schema()).iter_errors(document))
    fallback = _SubsetValidator(schema()).errors(document)
    assert strict and fallback, label
    with pytest.raises(PlannerError, match="plan"):
        Plan.from_dict(document)


@pytest.mark.parametrize("name", sorted(plan_samples.ALL))
def test_fallback_validator_accepts_what_jsonschema_accepts(name):
    document = plan_samples.ALL[name]().to_dict()
    assert _SubsetValidator(schema()).errors(document) == []


def _keywords(node, found):
    if isinstance(node, dict):
        for key, value in node.items():
            found.add(key)
            if key in ("properties", "$defs"):
                for sub in value.values():
                    _keywords(sub, found)
            elif key not in ("enum", "const", "required"):
                _keywords(value, found)
    elif isinstance(node, list):
        for item in node:
            _keywords(item, found)
    return found


def test_fallback_validator_covers_every_keyword_the_schema_uses():
    used = _keywords(schema(), set())
    assert used <= _SubsetValidator.KEYWORDS, used - _SubsetValidator.KEYWORDS


def test_consistency_errors_name_the_field():
    document = plan_samples.gpt_plan((4, 3, 3)).to_dict()
    document["stages"][1]["first_layer"] = 5
    with pytest.raises(PlannerError, match=r"stages\[1\]\.first_layer"):
        Plan.from_dict(document)
    document = plan_samples.dlrm_plan().to_dict()
    document["embeddings"][1]["shards"][0]["rows"] = [5, 5]
    with pytest.raises(PlannerError, match=r"rows: \[5, 5\) is empty"):
        Plan.from_dict(document)


@pytest.mark.parametrize("change,message", [
    (lambda d: d["stages"][0].update(devices=[0, 1]), r"stages\[0\]\.devices: 2 devices for tp x dp = 4 x 2"),
    (lambda d: d["stages"][0].update(devices=[0] * 8), r"stages\[0\]\.devices: a device is listed twice"),
    (lambda d: d["stages"][0].update(devices=list(range(100, 108))), r"device 107 is not in the cluster of 24"),
    (lambda d: d["stages"][1]["replicas"][0].update(devices=[8, 9]), r"stages\[1\]\.replicas\[0\]\.devices: 2 devices"),
    (lambda d: d["stages"][1].update(devices=list(range(8, 20))), r"not the devices of its replica groups"),
])
def test_stage_devices_must_match_tp_dp_and_the_cluster(change, message):
    document = plan_samples.mixed_plan().to_dict()
    change(document)
    with pytest.raises(PlannerError, match=message):
        Plan.from_dict(document)


@pytest.mark.parametrize("change,message", [
    (lambda d: d.update(runtime="megatron-2030"), r"plan\.runtime: runtime 'megatron-2030' is not one of"),
    (lambda d: d.update(global_batch=30), r"plan\.global_batch: 30 is not micro_batch 1 x num_micro_batches 16 x dp 2"),
    (lambda d: d.update(micro_batch=3), r"plan\.global_batch: 32 is not micro_batch 3 x"),
    (lambda d: d.update(vpp=2), r"plan\.schedule: '1f1b' with vpp 2"),
    (lambda d: d.update(schedule="interleaved"), r"plan\.schedule: 'interleaved' with vpp 1"),
    (lambda d: d["stages"][1]["replicas"][0].update(batch_share=0.3), r"batch shares add up to 0\.9, not 1"),
    (lambda d: d["stages"][1].update(dp=5), r"stages\[1\]\.replicas: their dp add up to 4, not the stage's 5"),
    (lambda d: d["stages"][1]["replicas"][0].pop("batch_share"), r"replicas\[0\]: 'batch_share' is a required"),
])
def test_a_hand_edited_plan_the_exporters_would_misread_is_refused(change, message):
    """A plan whose runtime, schedule, batch arithmetic or replica groups disagree would print as a false
    identity ("63 = 8 x 1 x 8") and export launch options the framework refuses; each is named instead."""
    document = plan_samples.mixed_plan().to_dict()
    change(document)
    with pytest.raises(PlannerError, match=message):
        Plan.from_dict(document)


def test_wrong_schema_version_and_bad_json():
    document = plan_samples.gpt_plan().to_dict()
    document["schema_version"] = 2
    with pytest.raises(PlannerError, match="schema_version 2 is not supported"):
        Plan.from_dict(document)
    with pytest.raises(PlannerError, match="not valid JSON"):
        Plan.from_json("{")


def test_a_replica_group_lists_the_fields_of_its_stage():
    """The contract: a stage served by several device types lists each replica group "with the same fields";
    a group's index, layers and recompute are its stage's, and a plan read back is the same plan."""
    plan = plan_samples.mixed_plan()
    document = plan.to_dict()
    stage_fields = set(schema()["$defs"]["stage"]["required"])
    for stage in document["stages"]:
        for group in stage["replicas"]:
            assert stage_fields <= set(group)
            assert all(group[k] == stage[k] for k in ("index", "first_layer", "last_layer", "layer_names",
                                                      "recompute"))
    assert any(stage["replicas"] for stage in document["stages"])
    validate(document)
    assert Plan.from_dict(document) == plan


def test_a_searched_plan_records_its_sequence_length_and_family():
    """A plan's model entry carries the sequence length its blocks were imported at and the builder's family,
    which an export that writes token budgets needs; both validate against the schema."""
    import planner
    from planner.plans import shape_summary
    from planner.types import LayerGraph

    model = planner.load_model(str(Path(__file__).resolve().parents[1] / "models" / "gpt2-124m.onnx"))
    best = planner.plan(model, planner.load_cluster("dgx-a100-80gb*1"), global_batch=16)
    assert best.model["seq_len"] == next(layer.transformer.seq_len for layer in model.layers if layer.transformer)
    assert best.model["family"] == model.family == "gpt"
    validate(best.to_dict())
    assert shape_summary(LayerGraph(name="bare", layers=())) == {}


def _contract_fields_missing(document: dict) -> list[str]:
    """The contract's fields (v1 and its version 2 additions) that a plan document lacks."""
    missing = [name for name in ("runtime", "dtype") if name not in document]
    for stage in document["stages"]:
        missing += [f"stages[{stage['index']}].{name}" for name in ("cp", "ep") if name not in stage]
        for r, group in enumerate(stage.get("replicas", [])):
            missing += [f"stages[{stage['index']}].replicas[{r}].{name}" for name in
                        ("device_type", "devices", "tp", "dp", "recompute", "memory_bytes_per_device", "time_s",
                         "cp", "ep") if name not in group]
    for table in document["embeddings"]:
        missing += [f"embeddings[{table['table']}].shards[{s}].{name}" for s, shard in enumerate(table["shards"])
                    for name in ("device", "rows", "cols", "memory") if name not in shard]
    return missing


@pytest.mark.parametrize("name", sorted(plan_samples.ALL))
def test_emitted_plans_carry_every_contract_field(name):
    """The schema leaves the version 2 fields (runtime, dtype, cp, ep) and a replica group's recompute optional,
    so that plan files written before them still load; every plan this planner writes has them."""
    assert _contract_fields_missing(plan_samples.ALL[name]().to_dict()) == []


def test_a_searched_plan_on_mixed_devices_carries_every_contract_field():
    import planner  # noqa: PLC0415
    from planner.hardware import load_cluster  # noqa: PLC0415

    model = planner.load_model("models/gpt2-124m.onnx", {"batch": 1})
    best = planner.plan(model, load_cluster("dgx-h100*1+dgx-a100-80gb*1"), 64)
    assert any(stage.replicas for stage in best.stages)  # a heterogeneous stage: its groups are checked too
    assert _contract_fields_missing(best.to_dict()) == []


def test_a_device_in_two_stages_is_refused_on_load():
    """Every command reads a plan file through Plan.from_json, so show, split and estimate --plan refuse alike."""
    document = plan_samples.gpt_plan().to_dict()
    document["stages"][1]["devices"] = document["stages"][0]["devices"]
    with pytest.raises(PlannerError, match=r"plan\.stages\[1\]\.devices: device 0 is also in stage 0"):
        Plan.from_json(json.dumps(document))


def test_estimate_plan_checks_the_layer_names_as_split_does():
    import planner  # noqa: PLC0415
    from planner.compose import estimate_plan  # noqa: PLC0415
    from planner.hardware import load_cluster  # noqa: PLC0415
    from planner.plans import check_fits_model  # noqa: PLC0415

    model = planner.load_model("models/gpt2-124m.onnx", {"batch": 1})
    cluster = load_cluster("dgx-a100-80gb*2")
    best = planner.plan(model, cluster, 16, pinned=planner.ParallelConfig(global_batch=16, tp=0, pp=2, dp=0))
    check_fits_model(best, model.params, model)  # the plan's own model passes
    stages = list(best.stages)
    stages[0] = dataclasses.replace(stages[0], layer_names=("zzz", *stages[0].layer_names[1:]))
    wrong = dataclasses.replace(best, stages=tuple(stages))
    with pytest.raises(PlannerError, match="stage 0 lists layer 0 as 'zzz'"):
        estimate_plan(model, cluster, wrong)
