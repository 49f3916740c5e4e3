"""The README's promises checked end to end through the CLI: on exit 2 stderr holds exactly one line (no
progress bar before it, no traceback), and a path the user asked us to write is checked before any work."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

import planner.progress as progress_module
from planner.builders import build, save
from planner.cli import main


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("contract") / "gpt.onnx"
    save(build("gpt", {"layers": 2, "hidden": 64, "heads": 2, "vocab": 128, "seq_len": 64}), str(path))
    return str(path)


def one_error_line(capsys) -> str:
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("planner: error:"), err
    return lines[0]


def must_not_run(*args, **kwargs):
    raise AssertionError("the command did its work before checking its inputs and output paths")


@pytest.fixture
def eager_progress(monkeypatch):
    """Progress bars that draw from their first call (the real one waits a second)."""

    class Eager(progress_module.ProgressBar):
        def __init__(self, *args, **kwargs) -> None:
            super().__init__(*args, **{**kwargs, "delay_s": 0.0})

    monkeypatch.setattr(progress_module, "ProgressBar", Eager)


def test_plan_draws_no_progress_bar_for_a_script(tiny_model, capsys, eager_progress):
    # a script reading stderr (not a terminal) must see only logs, so that exit 2 leaves exactly one line
    assert main(["plan", tiny_model, "--cluster", "dgx-a100-80gb*1", "--global-batch", "8"]) == 0
    assert capsys.readouterr().err == ""


def test_whatif_draws_no_progress_bar_for_a_script(tiny_model, capsys):
    assert main(["whatif", tiny_model, "--cluster", "dgx-a100-80gb*1", "--global-batch", "8",
                 "--sweep", "count=1,2", "--workers", "1"]) == 0
    assert capsys.readouterr().err == ""


def test_plan_out_is_checked_before_the_search(tiny_model, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr("planner.search.search", must_not_run)
    assert main(["plan", tiny_model, "--cluster", "dgx-a100-80gb*1", "--global-batch", "8",
                 "--out", str(tmp_path / "missing" / "plan.json")]) == 2
    assert "does not exist" in one_error_line(capsys)


@pytest.mark.parametrize("command", ["plan", "whatif", "estimate"])
@pytest.mark.parametrize("flag,value", [("--work", "0"), ("--work", "nan"), ("--work", "inf"), ("--seed", "-1")])
def test_a_bad_solver_option_is_one_line_before_the_search(tiny_model, capsys, monkeypatch, command, flag, value):
    monkeypatch.setattr("planner.search.search", must_not_run)
    monkeypatch.setattr("planner.sweep.whatif.whatif", must_not_run)
    monkeypatch.setattr("planner.compose.estimate", must_not_run)
    argv = [command, tiny_model, "--cluster", "dgx-a100-80gb*1", "--global-batch", "8", flag, value]
    extra = {"whatif": ["--sweep", "count=1"], "estimate": ["--tp", "1", "--pp", "1", "--dp", "8"]}
    try:
        code = main([*argv, *extra.get(command, [])])
    except SystemExit as exc:  # argparse's checks (a number, positive) exit from the parser
        code = exc.code
    assert code == 2 and flag in one_error_line(capsys)


def test_profile_out_that_is_a_folder_is_one_line_before_measuring(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr("planner.hardware.profiler.profile_device", must_not_run)
    folder = tmp_path / "cpu.yaml"
    folder.mkdir()
    assert main(["profile", "--quick", "--out", str(folder)]) == 2
    assert "is a folder" in one_error_line(capsys)


def test_whatif_csv_that_is_a_folder_fails_before_planning(tiny_model, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr("planner.sweep.whatif.whatif", must_not_run)
    assert main(["whatif", tiny_model, "--cluster", "dgx-a100-80gb*1", "--global-batch", "8",
                 "--sweep", "count=1", "--csv", str(tmp_path)]) == 2
    assert "is a folder" in one_error_line(capsys)


def test_devices_with_an_empty_cluster_is_an_error_not_the_catalog(capsys):
    assert main(["devices", "--cluster", ""]) == 2
    assert "empty cluster" in one_error_line(capsys)


def test_a_wrong_device_file_is_named_not_quoted(tmp_path, capsys):
    # a device_file that is some other text file parses as one long string: name the file, quote none of it
    notes = tmp_path / "notes.txt"
    notes.write_text("secret " * 400)
    cluster = tmp_path / "c.yaml"
    cluster.write_text(f"groups:\n  - node: {{device_file: {notes}, devices_per_node: 1, "
                       "inter_node_bandwidth_GBps: 1}\n    count: 1\n")
    assert main(["devices", "--cluster", str(cluster)]) == 2
    line = one_error_line(capsys)
    assert "notes.txt: not a device profile (it holds plain text" in line and "secret" not in line


@pytest.mark.parametrize("cluster,dtype", [("hgx-v100-32gb*1", "fp16"), ("t4*2", "fp16"),
                                           ("dgx-a100-80gb*1+hgx-v100-32gb*1", "fp16"), ("dgx-a100-80gb*1", "bf16")])
def test_plans_and_estimates_name_a_format_every_device_runs(tiny_model, capsys, cluster, dtype):
    # V100s and T4s have no bf16: a plan that says bf16 exports --bf16, which Megatron-LM cannot run there
    assert main(["plan", tiny_model, "--cluster", cluster, "--global-batch", "8", "--format", "megatron"]) == 0
    assert f"--{dtype}" in capsys.readouterr().out
    assert main(["estimate", tiny_model, "--cluster", cluster, "--global-batch", "8", "--tp", "1", "--pp", "1",
                 "--dp", "2", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["config"]["dtype"] == dtype


def test_warnings_are_printed_on_success_and_dropped_before_an_error_line(tiny_model, capsys):
    """--dim batch=4 warns that the batch axis is not the micro-batch; with a refused --tp the error line is
    all stderr holds, and with a valid one the warning is printed."""
    handlers = list(logging.getLogger().handlers)
    argv = ["plan", tiny_model, "--cluster", "dgx-a100-80gb*1", "--global-batch", "8", "--dim", "batch=4"]
    assert main(argv + ["--tp", "3"]) == 2
    assert "--tp 3" in one_error_line(capsys)
    assert main(argv + ["--tp", "1"]) == 0
    assert "planner: --dim batch=4 binds the model's batch axis" in capsys.readouterr().err
    assert logging.getLogger().handlers == handlers  # the command's handler is gone with it


def test_warnings_before_a_bug_are_printed_and_the_bug_propagates(monkeypatch, capsys):
    def bug(args):
        logging.getLogger("planner.test").warning("a warning before the bug")
        raise RuntimeError("a bug")

    monkeypatch.setattr("planner.commands.schema.run", bug)
    with pytest.raises(RuntimeError, match="a bug"):
        main(["schema"])
    assert capsys.readouterr().err == "planner: a warning before the bug\n"


@pytest.mark.parametrize("fmt, model, message", [
    ("torchrec", None, "no embedding tables to shard"),
    ("deepspeed", "models/dlrm-criteo.onnx", "26 embedding tables are placed by TorchRec sharding types"),
])
def test_plan_format_the_model_cannot_have_is_refused_before_the_search(fmt, model, message, tiny_model, tmp_path,
                                                                       capsys, monkeypatch):
    """The exporters' refusals that the model alone decides come before the search and before any file."""
    monkeypatch.setattr("planner.search.search", must_not_run)
    path = str(Path(__file__).resolve().parent.parent / model) if model else tiny_model
    out, gantt = tmp_path / "plan.json", tmp_path / "plan.png"
    assert main(["plan", path, "--cluster", "dgx-a100-80gb*1", "--global-batch", "4096", "--out", str(out),
                 "--gantt", str(gantt), "--format", fmt]) == 2
    assert message in one_error_line(capsys)
    assert not out.exists() and not gantt.exists()


@pytest.mark.parametrize("extra, formats", [
    ([], "table, json, megatron, deepspeed or torchtitan"),
    (["--optimizer", "adagrad"], "table, json or deepspeed"),  # neither Megatron-LM nor torchtitan builds Adagrad
])
def test_plan_torchrec_refusal_suggests_only_the_formats_that_take_the_model(extra, formats, tiny_model, capsys,
                                                                            monkeypatch):
    monkeypatch.setattr("planner.search.search", must_not_run)
    assert main(["plan", tiny_model, "--cluster", "dgx-a100-80gb*1", "--global-batch", "8", "--format", "torchrec",
                 *extra]) == 2
    assert one_error_line(capsys).endswith(f"so there is no TorchRec sharding plan; use --format {formats}")


@pytest.mark.parametrize("command", ["plan", "whatif"])
@pytest.mark.parametrize("flag", ["--time-limit", "--work"])
@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "1e400"])
def test_a_limit_that_is_not_finite_is_refused_naming_its_flag(tiny_model, capsys, command, flag, value):
    argv = [command, tiny_model, "--cluster", "dgx-a100-80gb*1", "--global-batch", "8", f"{flag}={value}"]
    with pytest.raises(SystemExit) as exit_info:  # argparse's type check, before anything is loaded
        main([*argv, *(["--sweep", "count=1"] if command == "whatif" else [])])
    assert exit_info.value.code == 2
    assert f"argument {flag}: '{value}' is not a finite number" in one_error_line(capsys)


def test_plan_top_with_an_export_format_is_refused_before_the_search(tiny_model, capsys, monkeypatch):
    # an export writes the best plan alone: --top used to be dropped without a word
    monkeypatch.setattr("planner.search.search", must_not_run)
    assert main(["plan", tiny_model, "--cluster", "dgx-a100-80gb*1", "--global-batch", "8", "--top", "2",
                 "--format", "megatron"]) == 2
    line = one_error_line(capsys)
    assert "--top 2" in line and "--format megatron" in line and "leave --top out" in line


def test_plan_format_json_lists_the_alternatives_as_json_does(tiny_model, capsys):
    # the README's '--json' is '--format json': both print the --top K alternatives
    documents = []
    for flags in (["--format", "json"], ["--json"]):
        assert main(["plan", tiny_model, "--cluster", "dgx-a100-80gb*1", "--global-batch", "8", "--top", "1",
                     *flags]) == 0
        document = json.loads(capsys.readouterr().out)
        for plan in (document, *document.get("alternatives", [])):
            plan["search"].pop("time_s")  # the measured timing, the one field that differs between runs
        documents.append(document)
    assert len(documents[0]["alternatives"]) == 1 and documents[0] == documents[1]


def test_plan_alternatives_name_their_vpp(tiny_model, capsys):
    # alternatives that differ only in interleaving used to print as identical lines
    assert main(["plan", tiny_model, "--cluster", "dgx-a100-80gb*1", "--global-batch", "8", "--top", "1"]) == 0
    lines = capsys.readouterr().out.split("Best plan and 1 alternative:\n")[1].splitlines()
    assert len(lines) == 2 and all(" vpp=" in line for line in lines)
