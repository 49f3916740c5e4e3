"""A DLRM through the whole pipeline: builder -> ONNX import -> search -> embeddings joined into the Plan."""

from __future__ import annotations

from pathlib import Path

from embedding_checks import capacities
from planner.builders import build, save
from planner.embeddings import load_tables
from planner.graph import load_model
from planner.hardware import load_cluster
from planner.search import plan
from planner.solver import SolverOptions

REFERENCE = str(Path(__file__).resolve().parents[1] / "benchmarks" / "data" / "embedding_workloads.json")


def test_dlrm_plan_has_sharded_tables(tmp_path):
    path = tmp_path / "dlrm.onnx"
    save(build("dlrm", {"tables": REFERENCE, "workload": "criteo-kaggle-dlrm"}), str(path))
    model = load_model(str(path), dims={"batch": 1})
    cluster = load_cluster("dgx-a100-80gb*2")
    # the table statistics as ``--tables FILE`` gives them (the importer also sees the tables in the graph)
    tables = load_tables(REFERENCE, "criteo-kaggle-dlrm")
    best = plan(model, cluster, 65536, time_limit_s=20, tables=tables)
    assert {p.table for p in best.embeddings} == {t.name for t in tables}
    assert best.breakdown["embedding_s"] > 0
    assert 0 < best.search.embedding_lower_bound_s <= best.breakdown["embedding_s"]
    # the bottleneck sentence weighs the joined iteration: here the embeddings are its largest overhead
    overheads = {k: v for k, v in best.breakdown.items() if k != "compute_s"}
    assert max(overheads, key=overheads.get) == "embedding_s"
    share = best.breakdown["embedding_s"] / best.iteration_time_s
    assert f"the largest overhead is embeddings ({share:.0%} of the iteration)" in best.bottleneck
    # its memory clause gives the peak with the tables placed, the one the plan's header gives
    assert f"memory peaks at {best.memory_per_device_bytes / 2**30:.1f} GiB per device with the embedding tables " \
        "placed (the dense part's tightest: stage 0 (" in best.bottleneck
    # each device: dense memory + embedding memory recomputed from the shards (Adam: weights + 2 states)
    state = {"adam": 2.0, "adagrad": 1.0, "sgd": 0.0}.get(best.optimizer, 1.0)
    dims = {t.name: t for t in tables}
    used: dict[int, float] = {}
    for placement in best.embeddings:
        for s in placement.shards:
            if s.memory == "hbm":
                extra = 1.0 if placement.sharding == "data_parallel" else 0.0
                used[s.device] = used.get(s.device, 0.0) + (s.rows[1] - s.rows[0]) * (s.cols[1] - s.cols[0]) \
                    * dims[placement.table].dtype_bytes * (1.0 + state + extra)
    dense = {d: st.memory_bytes_per_device for st in best.stages for d in st.devices}
    for device, bytes_used in used.items():
        assert bytes_used + dense.get(device, 0.0) <= capacities(cluster)[device]


def test_solver_options_reach_the_table_sharder_and_the_time_limit_does_not(tmp_path, monkeypatch):
    """compose's ``options`` (work and seed) are the sharder's; ``time_limit_s`` is the dense search's wall
    clock only, so the sharder gets the default options without them."""
    import planner.embeddings
    from planner import compose

    path = tmp_path / "dlrm.onnx"
    save(build("dlrm", {"tables": REFERENCE, "workload": "criteo-kaggle-dlrm"}), str(path))
    model = load_model(str(path), dims={"batch": 1})
    cluster = load_cluster("dgx-a100-80gb*2")
    tables = load_tables(REFERENCE, "criteo-kaggle-dlrm")
    seen: list[SolverOptions] = []
    real = planner.embeddings.shard_tables

    def spy(*args, **kwargs):
        seen.append(kwargs["options"])
        return real(*args, **kwargs)

    monkeypatch.setattr(planner.embeddings, "shard_tables", spy)  # planner.compose calls it from there
    compose.search(model, cluster, 65536, tables=tables, options=SolverOptions(work=0.3, seed=2))
    plan(model, cluster, 65536, time_limit_s=3, tables=tables)
    assert seen == [SolverOptions(work=0.3, seed=2), SolverOptions()]


def test_estimate_cli_passes_work_and_seed_to_the_table_sharder(tmp_path, monkeypatch):
    """``planner estimate --work W --seed N`` shards the tables with the options ``plan --work W --seed N`` gives
    the sharder, so an estimate can reproduce a plan's table placement."""
    import planner.embeddings
    from planner.cli import main

    path = tmp_path / "dlrm.onnx"
    save(build("dlrm", {"tables": REFERENCE, "workload": "criteo-kaggle-dlrm"}), str(path))
    seen: list[SolverOptions] = []
    real = planner.embeddings.shard_tables

    def spy(*args, **kwargs):
        seen.append(kwargs["options"])
        return real(*args, **kwargs)

    monkeypatch.setattr(planner.embeddings, "shard_tables", spy)
    assert main(["estimate", str(path), "--cluster", "dgx-a100-80gb*2", "--global-batch", "65536", "--tp", "1",
                 "--pp", "1", "--dp", "16", "--work", "0.3", "--seed", "2", "--json"]) == 0
    assert seen == [SolverOptions(work=0.3, seed=2)]


def test_cli_table_that_fits_nowhere_exits_2(tmp_path, capsys):
    import json

    from planner.cli import main

    small = tmp_path / "small.json"
    small.write_text(json.dumps({"tables": [{"name": "small", "rows": 1000, "dim": 16, "pooling_factor": 1}],
                                 "dense_features": 4, "bottom_mlp": [16, 16], "top_mlp": [16, 1]}))
    big = tmp_path / "big.json"
    big.write_text(json.dumps({"tables": [{"name": "small", "rows": 1000, "dim": 16, "pooling_factor": 1},
                                          {"name": "huge_ids", "rows": 2_000_000_000, "dim": 128,
                                           "pooling_factor": 1}]}))
    model = tmp_path / "dlrm.onnx"
    assert main(["models", "build", "dlrm", "--set", f"tables={small}", "--out", str(model)]) == 0
    capsys.readouterr()
    code = main(["plan", str(model), "--cluster", "dgx-a100-80gb*1", "--global-batch", "4096",
                 "--tables", str(big), "--time-limit", "5"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and err[0].startswith("planner: error:")
    # the table and the bytes it needs (2e9 x 128 x 4 bytes x (1 + 2 Adam states))
    assert "huge_ids" in err[0] and "3072000000000 bytes" in err[0]


def test_dense_pipeline_does_not_count_the_sharded_tables(tmp_path):
    """The importer's ``embedding`` layer holds the tables' parameters; once the tables are sharded
    model-parallel, the dense stages must not hold (or sync) them again."""
    path = tmp_path / "dlrm.onnx"
    save(build("dlrm", {"tables": REFERENCE, "workload": "criteo-kaggle-dlrm"}), str(path))
    model = load_model(str(path), dims={"batch": 1})
    table_params = sum(t.rows * t.dim for t in model.embedding_tables)
    assert table_params > 2e9  # Criteo's 26 tables: 2.16 B parameters
    best = plan(model, load_cluster("dgx-a100-80gb*2"), 65536, time_limit_s=20)
    assert best.model["params"] == model.params  # the summary still counts the whole model
    # bf16 weights + fp32 gradients, master weights and Adam states of 2.16e9 parameters are >= 2.16e9 x 16 B
    # / 16 devices even fully sharded = 2.16 GB per device; the MLPs (0.5 M parameters) plus the cost model's
    # fixed reserve (1 GiB) and margin stay far below that
    for stage in best.stages:
        assert stage.memory_bytes_per_device < min(2.0 * 2**30, table_params * 16 / 16)
