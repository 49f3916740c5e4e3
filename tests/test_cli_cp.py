"""Context parallelism at the command line: --cp on estimate and plan, cp in the Plan JSON (schema-valid),
the Megatron export's --context-parallel-size, the DeepSpeed export's refusal, one-line errors."""

from __future__ import annotations

import json

import pytest

from planner.cli import main
from planner.plans import Plan, validate


def run(capsys, *argv: str) -> tuple[int, str, str]:
    try:
        code = main(list(argv))
    except SystemExit as exc:
        code = int(exc.code)
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("cp") / "llama-16k.onnx"
    code = main(["models", "build", "llama", "--set", "layers=4", "--set", "hidden=1024", "--set", "heads=16",
                 "--set", "kv_heads=4", "--set", "ffn=2816", "--set", "vocab=2048", "--set", "seq_len=16384",
                 "--out", str(path)])
    assert code == 0
    return str(path)


def test_estimate_with_cp(capsys, model: str) -> None:
    code, out, _ = run(capsys, "estimate", model, "--cluster", "dgx-h100*1", "--global-batch", "4", "--tp", "2",
                       "--pp", "1", "--dp", "1", "--cp", "4", "--json")
    assert code == 0
    doc = json.loads(out)
    assert doc["config"]["cp"] == 4 and doc["stages"][0]["cp"] == 4 and len(doc["stages"][0]["devices"]) == 8
    assert "cp_comm_s" in doc["breakdown"]


def test_bad_cp_is_one_line_naming_the_fix(capsys, model: str) -> None:
    code, out, err = run(capsys, "estimate", model, "--cluster", "dgx-h100*1", "--global-batch", "4", "--tp", "1",
                         "--pp", "1", "--dp", "1", "--cp", "3")
    lines = err.strip().splitlines()
    assert code == 2 and out == "" and len(lines) == 1
    assert "cp=3 does not divide the sequence length 16384" in lines[0] and "valid: 1, 2, 4, 8" in lines[0]
    code, _, err = run(capsys, "plan", model, "--cluster", "dgx-h100*1", "--global-batch", "4", "--cp", "3")
    assert code == 2 and "--cp 3 does not divide the sequence length 16384" in err


def test_plan_json_and_exports(capsys, model: str, tmp_path) -> None:
    out_file = tmp_path / "plan.json"
    code, _, _ = run(capsys, "plan", model, "--cluster", "dgx-h100*2", "--global-batch", "2", "--cp", "4",
                     "--out", str(out_file), "--format", "json")
    assert code == 0
    doc = json.loads(out_file.read_text())
    validate(doc)
    assert all(stage["cp"] == 4 for stage in doc["stages"])
    plan = Plan.from_json(out_file.read_text())
    assert plan.stages[0].cp == 4 and 4 in plan.search.cp_searched
    code, text, _ = run(capsys, "show", str(out_file), "--format", "megatron")
    assert code == 0 and "--context-parallel-size 4" in text and "--cp-comm-type p2p" in text
    code, _, err = run(capsys, "show", str(out_file), "--format", "deepspeed")
    assert code == 2 and "no DeepSpeed equivalent" in err and "Ulysses" in err and len(err.strip().splitlines()) == 1


def test_short_sequences_search_cp_one_only(capsys, tmp_path) -> None:
    """Below CP_MIN_SEQ_LEN tokens a free cp is searched at 1 alone, and the plan says so."""
    path = tmp_path / "gpt-2k.onnx"
    assert main(["models", "build", "gpt", "--set", "layers=2", "--set", "hidden=256", "--set", "heads=4",
                 "--set", "vocab=512", "--set", "seq_len=2048", "--out", str(path)]) == 0
    capsys.readouterr()
    code, out, _ = run(capsys, "plan", str(path), "--cluster", "dgx-h100*1", "--global-batch", "8", "--json")
    assert code == 0 and json.loads(out)["search"]["cp_searched"] == [1]


def test_an_exposed_ring_is_named_as_the_overhead(tmp_path, model: str) -> None:
    """Over a 1 GB/s network the K/V ring between two nodes cannot hide behind 16k-token attention steps: the
    plan's breakdown has cp_comm_s, and the bottleneck sentence says why."""
    import planner

    path = tmp_path / "slow.yaml"
    path.write_text("groups:\n  - node: dgx-h100\n    count: 2\n    inter_node_bandwidth_GBps: 1\n")
    cluster = planner.load_cluster(str(path))
    best = planner.plan(planner.load_model(model), cluster, global_batch=1,
                        pinned=planner.ParallelConfig(global_batch=1, tp=4, cp=4, pp=1, dp=1))
    assert best.stages[0].cp == 4 and best.breakdown["cp_comm_s"] > 0
    assert "cp=4" in best.bottleneck and "K and V around the ring" in best.bottleneck
