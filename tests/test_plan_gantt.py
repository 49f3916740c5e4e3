"""`write_plan_gantt`: a Plan re-estimated by the cost model, its schedule simulated, both charts drawn."""

from __future__ import annotations

import pytest

from planner.builders import build, save
from planner.graph import load_model
from planner.hardware import load_cluster
from planner.report._figure import DPI
from planner.report.gantt import (MEMORY_SIZE_IN, SCHEDULE_SIZE_IN, plan_pipeline_specs, plan_stage_estimates,
                                  schedule_height_in, write_plan_gantt)

from plan_samples import gpt_plan, mixed_plan

image = pytest.importorskip("matplotlib.image", reason="matplotlib (the plot extra) is not installed")


@pytest.fixture(scope="module")
def gpt_blocks(tmp_path_factory):
    """Loader of a small GPT with the given number of blocks (layers = blocks + embedding + head)."""
    folder = tmp_path_factory.mktemp("models")

    def load(blocks: int):
        path = folder / f"gpt{blocks}.onnx"
        if not path.exists():
            save(build("gpt", {"layers": blocks, "hidden": 256, "heads": 4, "vocab": 1000, "seq_len": 128}), str(path))
        return load_model(str(path))
    return load


def _check_png(path, stages):
    pixels = image.imread(str(path))
    height = round((schedule_height_in(stages) + MEMORY_SIZE_IN[1]) * DPI)
    assert pixels.shape[:2] == (height, round(SCHEDULE_SIZE_IN[0] * DPI))
    assert pixels[..., :3].var() > 0


def test_uniform_plan(gpt_blocks, tmp_path):
    model = gpt_blocks(4)
    plan = gpt_plan(counts=[3, 3], tp=2, dp=2)
    stages = plan_stage_estimates(plan, model, load_cluster("dgx-a100-80gb*1"))
    assert [(s.first_layer, s.last_layer, s.devices) for s in stages] == [(0, 2, (0, 1, 2, 3)), (3, 5, (4, 5, 6, 7))]
    assert all(s.forward_s > 0 and s.backward_s > s.forward_s and s.memory.weights_bytes > 0 for s in stages)
    _check_png(write_plan_gantt(plan, model, load_cluster("dgx-a100-80gb*1"), tmp_path / "plan.png"), 2)


def test_interleaved_chunks_fold_to_pipeline_stages(gpt_blocks, tmp_path):
    model = gpt_blocks(4)
    plan = gpt_plan(counts=[3, 3], tp=2, dp=1, vpp=2)  # Plan.stages lists pipeline stages (vpp chunks each)
    (spec,) = plan_pipeline_specs(plan).values()
    assert [(s.first_layer, s.last_layer) for s in spec.stages] == [(0, 2), (3, 5)] and spec.vpp == 2
    path = write_plan_gantt(plan, model, load_cluster("dgx-a100-80gb*1"), tmp_path / "plan.png")
    _check_png(path, 2)


def test_mixed_plan_with_replica_groups_and_two_recompute_modes(gpt_blocks, tmp_path):
    model = gpt_blocks(6)
    plan = mixed_plan()
    cluster = load_cluster("dgx-a100-80gb*1+hgx-v100-32gb*1+dgx-a100-80gb*1")
    assert sorted(plan_pipeline_specs(plan)) == ["full", "none"]
    stages = plan_stage_estimates(plan, model, cluster)
    assert len(stages[1].replicas) == 2 and {r.device_type for r in stages[1].replicas} == {"v100-32gb", "a100-80gb"}
    _check_png(write_plan_gantt(plan, model, cluster, tmp_path / "mixed.png"), 2)



def test_plan_command_gantt_flag(tmp_path, capsys):
    from planner.cli import main

    model = tmp_path / "gpt.onnx"
    save(build("gpt", {"layers": 4, "hidden": 256, "heads": 4, "vocab": 1000, "seq_len": 128}), str(model))
    out = tmp_path / "schedule.png"
    assert main(["plan", str(model), "--cluster", "dgx-a100-80gb*1", "--global-batch", "64", "--pp", "2",
                 "--gantt", str(out)]) == 0
    capsys.readouterr()
    _check_png(out, 2)


def test_gantt_without_matplotlib_fails_before_the_plan_file_is_written(tmp_path, capsys, monkeypatch):
    """matplotlib missing is found before the search, so --out is not left behind by a failed --gantt."""
    import planner.report._figure as figure
    from planner.cli import main
    from planner.errors import PlannerError

    def missing():
        raise PlannerError('plots need matplotlib: pip install "planner[plot]"')

    monkeypatch.setattr(figure, "pyplot", missing)
    model = tmp_path / "gpt.onnx"
    save(build("gpt", {"layers": 4, "hidden": 256, "heads": 4, "vocab": 1000, "seq_len": 128}), str(model))
    plan_file = tmp_path / "plan.json"
    assert main(["plan", str(model), "--cluster", "dgx-a100-80gb*1", "--global-batch", "64", "--out", str(plan_file),
                 "--gantt", str(tmp_path / "schedule.png")]) == 2
    assert "plots need matplotlib" in capsys.readouterr().err and not plan_file.exists()
