"""Megatron-Core's uneven pipeline (first and last stage with their own transformer-layer counts, the middle
stages even), by hand: the rule book's counts and refusals, and estimate's stages."""

from __future__ import annotations

import numpy as np
import pytest

from planner.builders import build
from planner.cost import estimate, pipeline_time
from planner.errors import ConfigError
from planner.graph import import_model_proto
from planner.hardware import load_cluster
from planner.rules import chunk_sizes, layer_chunks, layout_vpp_limit, stage_blocks, stage_chunks
from planner.types import ParallelConfig


def test_stage_blocks_by_hand():
    # Llama 3 405B's split: 126 layers on 16 stages, the first and last one layer short
    assert stage_blocks(126, 16, 1, 7, 7) == [7] + [8] * 14 + [7]
    assert stage_blocks(126, 16, 1, 6, None) == [6] + [8] * 15  # 120 left for 15 stages
    assert stage_blocks(10, 2, 1, 3, None) == [3, 7]
    assert stage_blocks(10, 2, 1, 4, 6) == [4, 6]
    # interleaved: whole chunks (24 = 4 + 2 x 8 + 4 at vpp 2 and 4), or a layout's chunks of their own sizes
    assert stage_blocks(24, 4, 2, 4, 4) == [4, 8, 8, 4]
    assert stage_blocks(24, 4, 4, 4, 4) == [4, 8, 8, 4]
    assert stage_blocks(126, 16, 8, 7, 7) == [7] + [8] * 14 + [7]  # Llama 3 405B: one chunk of each end empty
    assert stage_blocks(24, 4, 4, 4, 8) == [4, 6, 6, 8]


def test_a_layout_shares_each_stage_over_its_chunks():
    assert stage_chunks(7, 8) == [1] * 7 + [0]
    assert stage_chunks(8, 3) == [3, 3, 2]  # the larger chunks first
    assert stage_chunks(7, 8, first_stage=True) == [0] + [1] * 7  # the first chunk: only the embedding
    # virtual-stage order: the first chunk of every stage, then the second
    assert chunk_sizes([3, 3, 2], 2) == [1, 2, 1, 2, 1, 1]
    llama = chunk_sizes([7] + [8] * 14 + [7], 8)
    assert sum(llama) == 126 and llama[0] == 0 and llama[-1] == 0 and all(llama[1:-1])
    assert layout_vpp_limit([7] + [8] * 14 + [7]) == 8
    assert layout_vpp_limit([10, 4, 4, 10]) == 4  # a middle chunk may not be empty
    # the embedding with the first chunk, the final norm and head with the last, even when they hold no block
    assert layer_chunks([False] + [True] * 7, 8, first_stage=True) == list(range(8))
    assert layer_chunks([True] * 7 + [False, False], 8) == [0, 1, 2, 3, 4, 5, 6, 7, 7]
    assert layer_chunks([False, True, True, True, False], 2, first_stage=True) == [0, 0, 1, 1, 1]
    assert layer_chunks([True] * 8, 3) == [0, 0, 0, 1, 1, 1, 2, 2]
    # the chunks' blocks are the exporters' chunk sizes, in virtual-stage order
    units = [7, 8, 8, 7]
    flags = [[False] + [True] * 7, [True] * 8, [True] * 8, [True] * 7 + [False, False]]
    for v in (2, 3, 8):
        held = [[sum(1 for c, f in zip(layer_chunks(fl, v, s == 0), fl) if f and c == k) for k in range(v)]
                for s, fl in enumerate(flags)]
        assert [held[s][k] for k in range(v) for s in range(4)] == chunk_sizes(units, v)


@pytest.mark.parametrize("args, words", [
    ((126, 16, 1, 7, 8), "nearest valid first/last count"),  # 111 left for 14 stages
    ((126, 16, 9, 7, 7), "leave a model chunk without one .* use vpp 8 or less"),
    ((24, 4, 4, 0, 8), "at least one transformer layer"),
    ((24, 4, 4, 4, 9), "must share them evenly"),
    ((10, 1, 1, 3, None), "pp >= 2"),
    ((10, 2, 1, 4, 5), r"4 \+ 5 must add up to the model's 10 transformer layers \(pp=2 has no other stage\); "
                       "nearest valid first/last count with the other fixed: 5"),
    ((24, 2, 1, 24, None), "24 leave 0 of the 24 transformer layers for the last stage"),
    ((24, 2, 1, None, 30), "30 take 30 of the model's 24 transformer layers for the first stage"),
    ((24, 4, 1, 20, 20), "20 \\+ 20 take 40 of the model's 24 transformer layers for the 2 middle stages"),
])
def test_stage_blocks_refusals_name_the_fix(args, words):
    with pytest.raises(ConfigError, match=words):
        stage_blocks(*args)


def test_estimate_places_the_uneven_split():
    """126 blocks (a narrow Llama), pp 16, first and last 7: stage 0 holds the embedding and 7 blocks, the
    middle stages 8 blocks each, the last 7 blocks, the final norm and the head."""
    proto = build("llama", {"layers": 126, "hidden": 256, "heads": 4, "vocab": 1024, "seq_len": 256})
    model = import_model_proto(proto, {"batch": 1, "seq": 256}, name="narrow-126")
    cluster = load_cluster("dgx-h100*2")
    config = ParallelConfig(global_batch=32, tp=1, pp=16, dp=1, micro_batch=1, vpp=1, first_stage_layers=7,
                            last_stage_layers=7)
    est = estimate(model, cluster, config)
    kinds = [layer.kind for layer in model.layers]
    blocks = [sum(1 for k in kinds[s.first_layer:s.last_layer + 1] if k == "block") for s in est.stages]
    assert blocks == [7] + [8] * 14 + [7]
    assert est.stages[0].first_layer == 0 and est.stages[-1].last_layer == len(kinds) - 1
    assert kinds[0] != "block" and kinds[-1] != "block"  # the embedding and the head sit on the end stages


def _layout_pipeline(est) -> tuple[float, list[tuple[float, ...]]]:
    """The pipeline time of a 7, 8 x 14, 7 split at vpp 8 from the estimate's stage times, each chunk
    taking its layers' share (a block's time from a middle stage; the end stages' rest is the embedding or
    the head), and those shares."""
    f = np.array([s.forward_s for s in est.stages])
    b = np.array([s.backward_s for s in est.stages])
    block = (f[1] + b[1]) / 8
    first, last = f[0] + b[0], f[-1] + b[-1]
    shares = [((first - 7 * block) / first,) + (block / first,) * 7] + [(1 / 8,) * 8] * 14 + \
        [(block / last,) * 7 + ((last - 7 * block) / last,)]
    return pipeline_time(f, b, 32, "interleaved", 8, [s.p2p_s for s in est.stages], shares)[0], shares


def test_estimate_interleaves_the_uneven_split_in_chunks_of_their_own_sizes():
    """Llama 3 405B's split (stages of 7, 8, ..., 8, 7 blocks) runs interleaved under a layout: vpp 8 is
    accepted (the end stages each have one chunk without a block), the chunks' times follow their blocks, a
    free vpp resolves to the fastest, and a vpp above the largest stage's blocks is refused."""
    proto = build("llama", {"layers": 126, "hidden": 256, "heads": 4, "vocab": 1024, "seq_len": 256})
    model = import_model_proto(proto, {"batch": 1, "seq": 256}, name="narrow-126")
    cluster = load_cluster("dgx-h100*2")
    base = dict(global_batch=32, tp=1, pp=16, dp=1, micro_batch=1, recompute="none", zero=0,
                first_stage_layers=7, last_stage_layers=7)
    times = {v: estimate(model, cluster, ParallelConfig(vpp=v, **base)).iteration_time_s for v in (1, 2, 4, 8)}
    assert times[8] < times[4] < times[2] < times[1]  # the bubble shrinks with vpp, as on whole chunks
    # the pipeline runs each chunk's own layers: the first stage's first chunk only the embedding, the last
    # stage's last chunk only the final norm and head, every other chunk one block (blocks time alike)
    est = estimate(model, cluster, ParallelConfig(vpp=8, **base))
    pipe, shares = _layout_pipeline(est)
    assert shares[0][0] < shares[0][1] and shares[-1][-1] != shares[-1][0]
    assert est.iteration_time_s == pytest.approx(pipe + est.breakdown.optimizer_s, rel=1e-12)
    assert any("pipeline layout" in note for note in est.notes)
    assert not any("pipeline layout" in note for note in estimate(model, cluster, ParallelConfig(
        vpp=1, **base)).notes)
    free = estimate(model, cluster, ParallelConfig(**base))
    assert free.config.vpp > 1 and free.iteration_time_s <= min(times.values())
    with pytest.raises(ConfigError, match="use vpp 8 or less"):
        estimate(model, cluster, ParallelConfig(vpp=9, **base))


def test_a_layout_stage_synchronises_after_its_first_chunk_drains():
    """With dp 2 each stage all-reduces its gradients after its own last backward, its first chunk's; the
    iteration ends at the latest stage's pipeline end (less the backward still draining through the stages
    before it: each one's first chunk and the transfer) plus its sync and step."""
    proto = build("llama", {"layers": 126, "hidden": 256, "heads": 4, "vocab": 1024, "seq_len": 256})
    model = import_model_proto(proto, {"batch": 1, "seq": 256}, name="narrow-126")
    config = ParallelConfig(global_batch=64, tp=1, pp=16, dp=2, micro_batch=1, recompute="none", zero=0, vpp=8,
                            first_stage_layers=7, last_stage_layers=7)
    est = estimate(model, load_cluster("dgx-h100*4"), config)
    pipe, shares = _layout_pipeline(est)
    b = np.array([s.backward_s for s in est.stages])
    p2p = np.array([s.p2p_s for s in est.stages])
    drained = np.concatenate(([0.0], np.cumsum(b * np.array([row[0] for row in shares]) + p2p)[:-1]))
    ends = pipe - drained + np.array([s.dp_sync_s + s.optimizer_s for s in est.stages])
    assert int(np.argmax(ends)) > 0  # a later stage, not the first, ends the iteration
    assert est.iteration_time_s == pytest.approx(max(pipe, float(ends.max())), rel=1e-12)


def test_estimate_cli_takes_the_first_and_last_counts(tmp_path, capsys):
    """`planner estimate --first-stage-layers/--last-stage-layers`: the split, and a refusal naming the fix."""
    from planner.cli import main

    proto = build("llama", {"layers": 10, "hidden": 128, "heads": 2, "vocab": 256, "seq_len": 64})
    path = tmp_path / "m.onnx"
    path.write_bytes(proto.SerializeToString())
    base = [str(path), "--cluster", "dgx-h100*1", "--global-batch", "8", "--tp", "1", "--pp", "4", "--dp", "1",
            "--micro-batch", "1", "--json"]
    assert main(["estimate", *base, "--first-stage-layers", "1", "--last-stage-layers", "3"]) == 0
    import json
    stages = json.loads(capsys.readouterr().out)["stages"]
    blocks = [sum(1 for name in s["layer_names"] if name.startswith("layers.")) for s in stages]
    assert blocks == [1, 3, 3, 3]
    assert main(["estimate", *base, "--first-stage-layers", "2", "--last-stage-layers", "3"]) == 2
    assert "nearest valid" in capsys.readouterr().err


# ----------------------------------------------------------------- a runtime without an uneven pipeline


def _blocks_per_stage(model, plan) -> list[int]:
    kinds = {layer.name: layer.kind for layer in model.layers}
    return [sum(1 for name in stage.layer_names if kinds[name] == "block") for stage in plan.stages]


def test_megatron_lm_2021_search_splits_the_blocks_evenly():
    """GPT-2 small's head (a 50k-word vocabulary) makes the last stage slow, so on two A10 stages the search
    gives the first stage more blocks where the runtime lets it (7 + 5 on megatron-core); megatron-lm-2021
    asserts an even split (num_layers % pp == 0), so its plans hold equal block counts on every stage and the
    Megatron export takes them."""
    import dataclasses

    import planner
    from planner.export.megatron import megatron_args
    from planner.graph import load_model

    model = load_model("models/gpt2-124m.onnx")
    cluster = load_cluster("a10*4")
    pinned = ParallelConfig(global_batch=96, tp=1, pp=2, dp=2, vpp=1)
    core = planner.plan(model, cluster, 96, pinned=pinned)
    assert len(set(_blocks_per_stage(model, core))) > 1  # the uneven split wins where it is allowed
    old = planner.plan(model, cluster, 96, pinned=dataclasses.replace(pinned, runtime="megatron-lm-2021"))
    assert _blocks_per_stage(model, old) == [6, 6]
    assert megatron_args(old)[2:4] == ["--pipeline-model-parallel-size", "2"]


@pytest.mark.parametrize("config, words", [
    (dict(tp=1, pp=5, dp=1), "pp must divide 12; nearest valid pp: 4 or 6"),
    (dict(tp=1, pp=2, dp=1, first_stage_layers=5), "splits the layers evenly"),
    (dict(tp=1, pp=4, dp=1, vpp=2, micro_batch=1), "8 must divide the model's 12 layers; nearest valid vpp: 1 or 3"),
])
def test_megatron_lm_2021_refuses_uneven_stages_naming_the_fix(config, words):
    proto = build("gpt", {"layers": 12, "hidden": 128, "heads": 2, "vocab": 256, "seq_len": 64})
    model = import_model_proto(proto, {"batch": 1}, name="gpt-12")
    cluster = load_cluster("dgx-a100-80gb*1")
    with pytest.raises(ConfigError, match=words):
        estimate(model, cluster, ParallelConfig(global_batch=8, runtime="megatron-lm-2021", **config))
    estimate(model, cluster, ParallelConfig(global_batch=8, runtime="megatron-core", **config))  # allowed there
