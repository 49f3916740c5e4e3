"""render(plan, fmt) and `planner show`: what the table says, every format, errors as one line."""

from __future__ import annotations

import dataclasses
import json
import logging
import subprocess
import sys

import pytest

import plan_samples
from planner.cli import main
from planner.errors import ConfigError
from planner.plans import Plan
from planner.report import FORMATS, render
from planner.units import count, id_ranges, seconds, size


def test_units():
    assert id_ranges([3, 0, 1, 2, 8, 9, 12]) == "0-3,8-9,12"
    assert id_ranges([5]) == "5" and id_ranges([]) == ""
    assert seconds(1.5) == "1.500 s" and seconds(0.0125) == "12.50 ms" and seconds(2e-6) == "2.0 us"
    assert size(80 * 2**30) == "80.0 GiB" and size(512) == "512 B"
    assert count(124_439_808) == "124.4M" and count(1.3e9) == "1.30B" and count(112_384) == "112.4K"
    assert count(12) == "12" and count(405e9) == "405.00B" and count(2e12) == "2.00T"


def test_table_has_stages_breakdown_bottleneck_and_search():
    text = render(plan_samples.gpt_plan((4, 3, 3)), "table")
    lines = text.splitlines()
    assert lines[0].startswith("Plan for gpt-test on dgx-a100-80gb*3 (24 of 24 devices)")
    header = next(line for line in lines if line.startswith("stage"))
    assert header.split() == ["stage", "layers", "device", "devices", "tp", "dp", "recompute", "memory/device",
                              "time/micro-batch"]
    rows = [line.split() for line in lines[lines.index(header) + 1:lines.index(header) + 4]]
    assert [r[0] for r in rows] == ["0", "1", "2"]
    assert rows[1][1:4] == ["4-6", "(3)", "a100-80gb"] and rows[1][4] == "8-15"
    assert "pipeline bubble" in text and "74.1%" in text  # compute 0.8 of 1.08 s
    assert "Bottleneck: compute on stage 1" in text
    assert "proven optimal under the cost model" in text and "lower bound 1.080 s" in text
    assert "physical bound 700.00 ms" in text and "the plan takes 1.54x it" in text  # 1.08 / 0.7


def test_table_mixed_replicas_and_gap_and_embeddings():
    text = render(plan_samples.mixed_plan(), "table")
    # each replica group: its share and its own micro-batches per replica (0.4 x 32 / (2 x 1))
    assert "40% of batch, 6.4 mb each  v100-32gb  8-15" in text
    assert "replicas (on average: see the replica groups)" in text
    # the mixed stage's own row leaves the degrees and the memory to its groups' rows
    mixed_row = next(line for line in text.splitlines() if " mixed " in line)
    assert " GiB" not in mixed_row and " MiB" not in mixed_row
    assert "within 11% of the lower bound" in text  # 0.5 / 0.45 - 1
    close = dataclasses.replace(plan_samples.mixed_plan(), iteration_time_s=0.45002)
    assert "within 0.0044% of the lower bound" in render(close, "table")  # not "0.0%": a gap, however small
    text = render(plan_samples.dlrm_plan(), "table")
    assert "t_rw     row_wise       16      0-15     hbm" in text
    assert "embedding lower bound 3.50 ms" in text


def test_plan_alternatives_list_the_best_plan_and_k_more_with_each_replica_group():
    """`planner plan --top K` lists the best plan and K alternatives, under a header that says so; a mixed stage
    is described by its replica groups' own device types and degrees (its summary tp is the first group's)."""
    from planner.commands.plan import _alternatives

    mixed = plan_samples.mixed_plan()
    groups = (dataclasses.replace(mixed.stages[1].replicas[0], tp=2, dp=4), mixed.stages[1].replicas[1])
    stage = dataclasses.replace(mixed.stages[1], dp=6, replicas=groups)
    mixed = dataclasses.replace(mixed, stages=(mixed.stages[0], stage))
    lines = _alternatives((mixed, plan_samples.gpt_plan())).splitlines()
    assert lines[1] == "Best plan and 1 alternative:"
    assert lines[2].endswith("[a100-80gb tp4, v100-32gb tp2 dp4 + a100-80gb tp4 dp2]")
    assert lines[3].startswith("  2. ") and lines[3].endswith("[a100-80gb tp4, a100-80gb tp4]")
    # each time in the table's units (planner.units.seconds), as the plan's own table gives it
    assert lines[2].startswith(f"  1. {seconds(mixed.iteration_time_s)}  pp=")
    assert _alternatives((mixed, mixed, mixed, mixed)).splitlines()[1] == "Best plan and 3 alternatives:"


@pytest.mark.parametrize("name", sorted(plan_samples.ALL))
def test_json_format_round_trips(name):
    plan = plan_samples.ALL[name]()
    assert Plan.from_json(render(plan, "json")) == plan


def test_unknown_format():
    with pytest.raises(ConfigError, match="did you mean megatron"):
        render(plan_samples.gpt_plan(), "megatrn")


@pytest.mark.parametrize("fmt", FORMATS)
def test_show_every_format(tmp_path, capsys, fmt):
    path = tmp_path / "plan.json"
    plan = plan_samples.dlrm_plan()
    path.write_text(plan.to_json())
    if fmt in ("megatron", "deepspeed", "torchtitan"):
        # a DLRM has no transformer layers for Megatron-LM to run, and its tables no ds_config or torchtitan setting
        assert main(["show", str(path), "--format", fmt]) == 2
        assert ("no transformer layers" if fmt == "megatron" else "use --format torchrec") in \
            capsys.readouterr().err
        plan = plan_samples.gpt_plan(zero=2 if fmt == "torchtitan" else 1)  # FSDP2 has no ZeRO-1
        path.write_text(plan.to_json())
    assert main(["show", str(path), "--format", fmt]) == 0
    assert capsys.readouterr().out == render(plan, fmt)


def test_show_json_flag(tmp_path, capsys):
    path = tmp_path / "plan.json"
    path.write_text(plan_samples.gpt_plan().to_json())
    assert main(["show", str(path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == plan_samples.gpt_plan().to_dict()


@pytest.mark.parametrize("content,message", [
    (None, "no such file"),
    ("{not json", "not valid JSON"),
    ('{"schema_version": 1, "stages": []}', "'model' is a required property"),
])
def test_show_bad_files_exit_2_with_one_line(tmp_path, content, message):
    path = tmp_path / "plan.json"
    if content is not None:
        path.write_text(content)
    out = subprocess.run([sys.executable, "-m", "planner", "show", str(path)], capture_output=True, text=True)
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("planner: error:") and message in lines[0]
    assert str(path) in lines[0]


def test_show_torchrec_without_tables_exit_2(tmp_path, capsys):
    path = tmp_path / "plan.json"
    path.write_text(plan_samples.gpt_plan().to_json())
    assert main(["show", str(path), "--format", "torchrec"]) == 2
    assert "no embedding tables" in capsys.readouterr().err


@pytest.mark.parametrize("plan, formats", [
    (plan_samples.gpt_plan(zero=0), "table, json, megatron, deepspeed or torchtitan"),
    (plan_samples.gpt_plan(vpp=2), "table, json or megatron"),  # DeepSpeed: no vpp; torchtitan: no ZeRO-1
    (plan_samples.mixed_plan(), "table or json"),  # replica groups on several device types: no framework's
])
def test_show_torchrec_without_tables_suggests_only_the_formats_that_write_the_plan(tmp_path, capsys, plan,
                                                                                    formats):
    path = tmp_path / "plan.json"
    path.write_text(plan.to_json())
    assert main(["show", str(path), "--format", "torchrec"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    # one line: the exporters tried held their warnings back, and logging is as it was after
    assert len(err) == 1 and err[0].endswith(f"so there is no TorchRec sharding plan; use --format {formats}")
    assert logging.root.manager.disable == logging.NOTSET


@pytest.mark.parametrize("fmt", ["megatron", "deepspeed", "torchtitan"])
def test_show_refusal_names_the_plan_file(tmp_path, capsys, fmt):
    """An exporter's refusal of a plan read from a file names that file, as `estimate --plan` does."""
    path = tmp_path / "mixed.json"
    path.write_text(plan_samples.mixed_plan().to_json())
    assert main(["show", str(path), "--format", fmt]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"planner: error: {path}: stage 1 is served by several replica groups")


def test_show_warns_when_the_format_launches_another_runtime(tmp_path, capsys, caplog):
    """A plan timed for megatron-core, written as DeepSpeed's options: written, and the user told that its
    times were for another runtime."""
    path = tmp_path / "plan.json"
    path.write_text(plan_samples.gpt_plan().to_json())
    with caplog.at_level(logging.WARNING, logger="planner.commands.show"):
        assert main(["show", str(path), "--format", "deepspeed"]) == 0
    assert any("planned for the megatron-core runtime" in r.getMessage() for r in caplog.records)
    caplog.clear()
    path.write_text(plan_samples.dlrm_plan().to_json())
    with caplog.at_level(logging.WARNING, logger="planner.commands.show"):
        assert main(["show", str(path), "--format", "torchrec"]) == 0
    assert not caplog.records


def test_json_and_another_format_are_refused(tmp_path, capsys):
    path = tmp_path / "plan.json"
    path.write_text(plan_samples.gpt_plan().to_json())
    assert main(["show", str(path), "--format", "megatron", "--json"]) == 2
    assert "--json prints the plan as JSON and --format megatron" in capsys.readouterr().err
    assert main(["show", str(path), "--format", "json", "--json"]) == 0
