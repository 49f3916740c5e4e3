"""A runtime left out resolves as the other fields do (planner.rules.resolve_runtime): the default where it runs
the pinned choices, else the first of RUNTIME_PREFERENCE that does, said in the estimate's notes and the plan's
bottleneck line; a named runtime is never replaced."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

import planner
from planner.builders import build
from planner.cli import main
from planner.errors import ConfigError
from planner.graph import import_model_proto, load_model
from planner.hardware import load_cluster
from planner.rules import RUNTIME_PREFERENCE, resolve_runtime
from planner.runtime import DEFAULT_RUNTIME, RUNTIMES
from planner.types import ParallelConfig

GPT = "models/gpt-1.3b.onnx"
README = [GPT, "--cluster", "dgx-a100-80gb*2", "--global-batch", "256"]
FALLBACK = "pytorch-fsdp2"  # the first runtime after the default that runs ZeRO-2 and ZeRO-3


@pytest.fixture(scope="module")
def gpt():
    return load_model(GPT)


@pytest.fixture(scope="module")
def gpt8():
    proto = build("gpt", {"layers": 8, "hidden": 1024, "heads": 16, "vocab": 32000, "seq_len": 512})
    return import_model_proto(proto, {"batch": 1, "seq": 512}, name="gpt8")


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


# ------------------------------------------------------------------------------------ the rule itself


def test_the_preference_starts_at_the_default_and_names_built_in_runtimes():
    assert RUNTIME_PREFERENCE[0] == DEFAULT_RUNTIME
    assert set(RUNTIME_PREFERENCE) <= set(RUNTIMES) and len(set(RUNTIME_PREFERENCE)) == len(RUNTIME_PREFERENCE)
    assert RUNTIME_PREFERENCE.index("pytorch-fsdp2") < RUNTIME_PREFERENCE.index("deepspeed")


def test_megatron_lm_2021_left_out_of_the_preference_runs_nothing_the_default_refuses():
    old, default = RUNTIMES["megatron-lm-2021"], RUNTIMES[DEFAULT_RUNTIME]
    assert set(old.zero_stages) <= set(default.zero_stages)
    assert old.max_pipeline_zero <= default.max_pipeline_zero
    assert set(old.recompute_choices) <= set(default.recompute_choices)
    for flag in ("interleaved", "sequence_parallel", "fp8", "context_parallel", "expert_parallel", "moe_layers",
                 "uneven_pipeline", "tensor_parallel", "pipeline_parallel"):
        assert getattr(default, flag) or not getattr(old, flag), flag


def test_a_named_runtime_is_taken_without_asking_the_rules():
    def refuses(name: str) -> None:
        raise ConfigError(f"{name} refused")

    assert resolve_runtime("deepspeed", refuses) == ("deepspeed", "")


def test_the_default_is_taken_where_it_runs_the_choices():
    asked: list[str] = []
    assert resolve_runtime(None, asked.append) == (DEFAULT_RUNTIME, "")
    assert asked == [DEFAULT_RUNTIME]


def test_the_first_runtime_that_runs_the_choices_is_taken_with_the_reason():
    def runs_only_deepspeed(name: str) -> None:
        if name != "deepspeed":
            raise ConfigError(f"zero=3: the {name} runtime cannot; use another")

    name, note = resolve_runtime(None, runs_only_deepspeed)
    assert name == "deepspeed"
    assert f"zero=3: the {DEFAULT_RUNTIME} runtime cannot" in note and "use another" not in note


def test_a_choice_no_runtime_runs_keeps_the_defaults_refusal():
    def refuses(name: str) -> None:
        raise ConfigError("tp=3 does not divide the heads; use tp 2")

    with pytest.raises(ConfigError, match="^tp=3 does not divide the heads; use tp 2$"):
        resolve_runtime(None, refuses)


def test_choices_each_runtime_refuses_otherwise_are_named_together():
    """--zero 3 --cp 2: the default refuses ZeRO-3, the others cp; each refusal's fix would send the user to a
    runtime refusing the other, so one error names them all."""
    def refuses(name: str) -> None:
        rule = "--zero 3: no ZeRO-3" if name == DEFAULT_RUNTIME else "--cp 2: no context parallelism"
        raise ConfigError(f"{rule}; use --runtime something-else")

    with pytest.raises(ConfigError, match=rf"^no runtime runs all the pinned choices \({DEFAULT_RUNTIME}: --zero 3: "
                                          r"no ZeRO-3; pytorch-fsdp2: --cp 2: no context parallelism; deepspeed: "
                                          r"--cp 2: no context parallelism\); unpin or change one of them$"):
        resolve_runtime(None, refuses)


# ------------------------------------------------------------------------------------------- estimate


@pytest.mark.parametrize("zero", [2, 3])
def test_estimate_with_a_zero_the_default_refuses_takes_the_next_runtime(gpt, zero):
    cluster = load_cluster("dgx-a100-80gb*2")
    est = planner.estimate(gpt, cluster, ParallelConfig(global_batch=256, dp=16, zero=zero))
    assert est.config.runtime == FALLBACK and est.config.zero == zero
    assert est.notes[0].startswith(f"runtime {FALLBACK}:") and f"zero={zero}" in est.notes[0]
    # the same estimate as naming the runtime, but for the note
    named = planner.estimate(gpt, cluster, ParallelConfig(global_batch=256, dp=16, zero=zero, runtime=FALLBACK))
    assert named.notes == est.notes[1:] and named.iteration_time_s == est.iteration_time_s


def test_estimate_with_choices_the_default_runs_keeps_it_without_a_note(gpt):
    est = planner.estimate(gpt, load_cluster("dgx-a100-80gb*2"), ParallelConfig(global_batch=256, dp=16, zero=1))
    assert est.config.runtime == DEFAULT_RUNTIME
    assert not any(note.startswith("runtime ") for note in est.notes)


def test_a_named_runtime_keeps_refusing(gpt):
    with pytest.raises(ConfigError, match=f"zero=3: the {DEFAULT_RUNTIME} runtime runs ZeRO 0, 1"):
        planner.estimate(gpt, load_cluster("dgx-a100-80gb*2"),
                         ParallelConfig(global_batch=256, dp=16, zero=3, runtime=DEFAULT_RUNTIME))


def test_estimate_cli_zero_3_without_runtime(capsys):
    code, out, err = run(capsys, "estimate", *README, "--tp", "1", "--pp", "1", "--dp", "16", "--zero", "3",
                         "--json")
    assert code == 0, err
    document = json.loads(out)
    assert document["config"]["runtime"] == FALLBACK and document["config"]["zero"] == 3
    assert any(note.startswith(f"runtime {FALLBACK}:") for note in document["notes"])


def test_runtime_help_says_how_the_default_resolves(capsys):
    with pytest.raises(SystemExit):
        main(["estimate", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert f"default: {DEFAULT_RUNTIME}, or where it cannot run the pinned choices the first of" in text
    assert f"--zero 3 -> {FALLBACK}" in text


# ------------------------------------------------------------------------------------- plan and whatif


def test_plan_cli_zero_2_without_runtime(capsys):
    code, out, err = run(capsys, "plan", *README, "--zero", "2", "--json")
    assert code == 0, err
    document = json.loads(out)
    assert document["runtime"] == FALLBACK and document["zero"] == 2
    assert f"Runtime {FALLBACK}: none was named" in document["bottleneck"]
    assert "--zero 2" in document["bottleneck"]


def test_plan_with_pins_the_default_runs_says_nothing_of_the_runtime(gpt8):
    best = planner.plan(gpt8, load_cluster("dgx-a100-80gb*1"), 64, pinned=ParallelConfig(global_batch=64, zero=1))
    assert best.runtime == DEFAULT_RUNTIME and "none was named" not in best.bottleneck


def test_plan_pins_the_default_refuses_resolve_as_estimate_does(gpt8):
    # ZeRO-2 with the interleaved schedule: neither megatron-core (ZeRO 0-1) nor deepspeed (no interleaving)
    best = planner.plan(gpt8, load_cluster("dgx-a100-80gb*1"), 64,
                        pinned=ParallelConfig(global_batch=64, zero=2, vpp=2))
    assert best.runtime == FALLBACK and best.zero == 2 and best.vpp == 2
    with pytest.raises(ConfigError, match="ZeRO"):
        planner.plan(gpt8, load_cluster("dgx-a100-80gb*1"), 64,
                     pinned=ParallelConfig(global_batch=64, zero=2, vpp=2, runtime=DEFAULT_RUNTIME))


def test_whatif_resolves_the_runtime_at_every_point(gpt8, tmp_path):
    from planner.builders import save

    path = tmp_path / "gpt8.onnx"
    save(build("gpt", {"layers": 8, "hidden": 1024, "heads": 16, "vocab": 32000, "seq_len": 512}), path)
    result = planner.whatif(str(path), "dgx-a100-80gb*1", 64, {"count": ["1", "2"]}, dims={"batch": 1, "seq": 512},
                            pinned=ParallelConfig(global_batch=64, zero=3), workers=1)
    assert [p.feasible for p in result.points] == [True, True]
    assert [p.runtime for p in result.points] == [FALLBACK, FALLBACK]  # each row says what it resolved to
    assert "runtime" in result.to_csv().splitlines()[0].split(",")
    summary = result.to_table().splitlines()[-1]
    assert summary.startswith("2 points, 2 feasible, ") and summary.endswith(f"; runtime {FALLBACK}")



def test_the_api_doc_lists_the_preference_as_the_rules_hold_it():
    """docs/api.md names RUNTIME_PREFERENCE's runtimes in brackets after it: all of them, in its order."""
    text = " ".join((Path(__file__).resolve().parents[1] / "docs" / "api.md").read_text(encoding="utf-8").split())
    listed = re.search(r"`planner\.rules\.RUNTIME_PREFERENCE` \(([^)]*)\)", text)
    assert listed, "docs/api.md no longer names planner.rules.RUNTIME_PREFERENCE"
    named = re.findall("|".join(map(re.escape, sorted(RUNTIMES, key=len, reverse=True))), listed.group(1))
    assert tuple(named) == RUNTIME_PREFERENCE, listed.group(1)
