"""Pipeline schedules: the closed forms agree with the event simulator on uniform stages; the simulator on
unequal stages against hand-worked examples."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from planner.cost import closed_form_time, pipeline_time, simulate_pipeline
from planner.errors import ConfigError


@settings(max_examples=150, deadline=None)
@given(pp=st.integers(1, 8), m_factor=st.integers(1, 6), f=st.floats(0.05, 3), b=st.floats(0.05, 6),
       schedule=st.sampled_from(["gpipe", "1f1b", "interleaved"]), vpp=st.integers(2, 4),
       c=st.floats(0, 2))
def test_closed_form_matches_simulation_on_uniform_stages(pp, m_factor, f, b, schedule, vpp, c):
    v = vpp if schedule == "interleaved" else 1
    m = pp * m_factor if schedule == "interleaved" else m_factor * 3 - 1
    if schedule != "gpipe":
        c = 0.0  # the 1F1B/interleaved closed forms are exact with free transfers
    simulated = simulate_pipeline([f] * pp, [b] * pp, m, schedule, v, c, record_events=False).iteration_time_s
    closed = closed_form_time(f, b, pp, m, schedule, v, c)
    assert closed == pytest.approx(simulated, rel=1e-9)
    total, bubble = pipeline_time([f] * pp, [b] * pp, m, schedule, v, c)
    assert total == pytest.approx(simulated, rel=1e-9)
    assert bubble == pytest.approx(total - m * (f + b), abs=1e-9)


def test_textbook_bubbles():
    # 1F1B: (p - 1)(f + b) bubble; interleaved divides it by v (Narayanan et al. 2021)
    assert pipeline_time([1.0] * 4, [2.0] * 4, 8, "1f1b")[1] == pytest.approx(3 * 3.0)
    assert pipeline_time([1.0] * 4, [2.0] * 4, 8, "interleaved", 2)[1] == pytest.approx(3 * 3.0 / 2)


def test_unequal_stages_hand_worked():
    # 1F1B, 2 stages, 2 micro-batches; stage 0 slow (f = b = 10), stage 1 fast (f = b = 1).
    # stage 0: F0 [0,10] F1 [10,20]; stage 1: F0 [10,11] B0 [11,12]; stage 0: B0 [20,30] (after F1);
    # stage 1: F1 [20,21] B1 [21,22]; stage 0: B1 [30,40]  -> 40
    result = simulate_pipeline([10, 1], [10, 1], 2, "1f1b")
    assert result.iteration_time_s == pytest.approx(40.0)
    # the bottleneck formula sum + (m - 1) max would say 22 + 20 = 42: the simulation is exact, not it
    # reversed: stage 1 slow. s0 F0 [0,1] F1 [1,2]; s1 F0 [1,11] B0 [11,21]; s0 B0 [21,22];
    # s1 F1 [21,31] B1 [31,41]; s0 B1 [41,42]  -> 42
    assert simulate_pipeline([1, 10], [1, 10], 2, "1f1b").iteration_time_s == pytest.approx(42.0)
    # with transfers of 0.5 on the link: s0 F0 [0,1]; s1 F0 [1.5,11.5] B0 [11.5,21.5]; s0 F1 [1,2],
    # B0 [22,23] (grad arrives 22); s1 F1 (arrived 2.5) [21.5,31.5] B1 [31.5,41.5]; s0 B1 [42,43] -> 43
    assert simulate_pipeline([1, 10], [1, 10], 2, "1f1b", p2p_s=0.5).iteration_time_s == pytest.approx(43.0)


def test_events_are_consistent():
    result = simulate_pipeline([1.0, 2.0, 1.5], [2.0, 3.0, 2.5], 6, "1f1b", p2p_s=0.1)
    compute = [e for e in result.events if e.kind != "send"]
    assert len(compute) == 2 * 3 * 6
    for stage in range(3):
        spans = sorted((e.start_s, e.end_s) for e in compute if e.stage == stage)
        assert all(a_end <= b_start + 1e-12 for (_, a_end), (b_start, _) in zip(spans, spans[1:]))
    assert max(e.end_s for e in compute) == pytest.approx(result.iteration_time_s)
    sends = [e for e in result.events if e.kind == "send"]
    assert len(sends) == 2 * 2 * 6 and all(e.end_s - e.start_s == pytest.approx(0.1) for e in sends)


def test_interleaved_needs_multiple_of_pp():
    with pytest.raises(ConfigError, match="multiple of pp"):
        simulate_pipeline([1.0] * 4, [2.0] * 4, 6, "interleaved", 2)


def test_pipeline_time_simulates_unequal_stages():
    total, bubble = pipeline_time([10, 1], [10, 1], 2, "1f1b")
    assert total == pytest.approx(40.0) and bubble == pytest.approx(40.0 - 2 * 20)


# ------------------------------------------------------------- chunks of their own sizes (a pipeline layout)


def test_each_chunk_runs_its_share_of_the_stage():
    """Every operation of chunk c on stage s lasts the stage's time times that chunk's share; with shares of
    1/vpp the simulation is the one without shares."""
    f, b, m, vpp = [3.0, 2.0, 4.0], [6.0, 4.0, 8.0], 6, 2
    shares = [(0.75, 0.25), (0.5, 0.5), (0.0, 1.0)]
    sim = simulate_pipeline(f, b, m, "interleaved", vpp, p2p_s=0.1, chunk_shares=shares)
    for e in sim.events:
        if e.kind != "send":
            time = (f if e.kind == "forward" else b)[e.stage] * shares[e.stage][e.chunk]
            assert e.end_s - e.start_s == pytest.approx(time)
    # a forward of virtual stage v (chunk c of stage s: v = c x pp + s) starts after v - 1's ends
    forward_end = {(e.chunk * 3 + e.stage, e.micro_batch): e.end_s for e in sim.events if e.kind == "forward"}
    for (v, j), end in forward_end.items():
        start = end - f[v % 3] * shares[v % 3][v // 3]
        assert v == 0 or start >= forward_end[(v - 1, j)] - 1e-12
    assert sim.stage_busy_s == tuple(m * (x + y) for x, y in zip(f, b))
    assert sim.iteration_time_s >= m * max(x + y for x, y in zip(f, b))
    even = simulate_pipeline(f, b, m, "interleaved", vpp, p2p_s=0.1, chunk_shares=[(0.5, 0.5)] * 3)
    assert even.iteration_time_s == simulate_pipeline(f, b, m, "interleaved", vpp, p2p_s=0.1).iteration_time_s
    assert pipeline_time(f, b, m, "interleaved", vpp, 0.1, shares)[0] == sim.iteration_time_s


@pytest.mark.parametrize("shares, words", [([(0.5, 0.5)], "expected 2 stages"), ([(0.5, 0.6), (0.5, 0.5)], "sum to 1"),
                                           ([(1.5, -0.5), (0.5, 0.5)], "non-negative")])
def test_chunk_shares_are_checked(shares, words):
    with pytest.raises(ConfigError, match=words):
        simulate_pipeline([1.0, 1.0], [2.0, 2.0], 2, "interleaved", 2, chunk_shares=shares)


# --------------------------------------------------- the interleaved warm-up of each runtime at m = pp


def test_interleaved_warmup_by_hand():
    """2 (pp - stage - 1) + (vpp - 1) pp chunks, capped at all m vpp; every chunk at m = pp where the runtime
    runs all forwards first (Megatron-LM v2.5)."""
    from planner.cost.schedule import interleaved_warmup

    assert [interleaved_warmup(s, 4, 4, 2) for s in range(4)] == [8, 8, 6, 4]
    assert [interleaved_warmup(s, 4, 4, 2, all_forwards_at_pp=True) for s in range(4)] == [8] * 4
    assert [interleaved_warmup(s, 4, 8, 2, all_forwards_at_pp=True) for s in range(4)] == [10, 8, 6, 4]


def test_all_forwards_first_only_where_the_runtime_says():
    """At m = pp the last stage starts backwards after its warm-up under Megatron-Core's rule, and after
    every forward under Megatron-LM v2.5's; memory counts the chunks each holds."""
    from planner.cost import micro_batches_in_flight

    f, b, m, vpp = [1.0] * 4, [2.0] * 4, 4, 2
    for everything in (False, True):
        sim = simulate_pipeline(f, b, m, "interleaved", vpp, all_forwards_at_pp=everything)
        last = sorted((e for e in sim.events if e.stage == 3 and e.kind != "send"), key=lambda e: e.start_s)
        first_backward = next(i for i, e in enumerate(last) if e.kind == "backward")
        assert first_backward == (m * vpp if everything else 4 + 1)  # its warm-up, then a forward-backward pair
        assert micro_batches_in_flight(3, 4, m, "interleaved", vpp, everything) == (4.0 if everything else 2.5)


def test_the_estimate_holds_the_runtimes_warmup():
    """The last stage's activations at m = pp under megatron-core: its 4 + 1 chunks of 2 in flight, 2.5 times
    what 1F1B's one micro-batch holds."""
    from planner.builders import build
    from planner.cost import estimate
    from planner.graph import import_model_proto
    from planner.hardware import load_cluster
    from planner.types import ParallelConfig

    proto = build("gpt", {"layers": 8, "hidden": 256, "heads": 4, "vocab": 1024, "seq_len": 256})
    model = import_model_proto(proto, {"batch": 1, "seq": 256}, name="gpt-8")
    cluster = load_cluster("dgx-h100*1")
    base = dict(global_batch=4, tp=1, pp=4, dp=1, micro_batch=1, recompute="none", zero=0, runtime="megatron-core")
    inter = estimate(model, cluster, ParallelConfig(vpp=2, **base)).stages[-1].memory.activations_bytes
    plain = estimate(model, cluster, ParallelConfig(vpp=1, **base)).stages[-1].memory.activations_bytes
    assert inter == pytest.approx(2.5 * plain, rel=1e-9)


def test_megatron_lm_2021_holds_every_chunk_at_m_equal_pp():
    """Megatron-LM v2.5 runs every forward first at m = pp: its last stage holds all 4 micro-batches (4 x
    1F1B's one), and its pipeline is no shorter than Megatron-Core's warm-up gives on the same stages."""
    from planner.builders import build
    from planner.cost import estimate
    from planner.graph import import_model_proto
    from planner.hardware import load_cluster
    from planner.types import ParallelConfig

    proto = build("gpt", {"layers": 12, "hidden": 256, "heads": 4, "vocab": 1024, "seq_len": 256})
    model = import_model_proto(proto, {"batch": 1, "seq": 256}, name="gpt-12")
    cluster = load_cluster("dgx-a100-80gb*1")
    base = dict(global_batch=4, tp=1, pp=4, dp=1, micro_batch=1, recompute="none", zero=0, dtype="fp16",
                runtime="megatron-lm-2021")
    old = estimate(model, cluster, ParallelConfig(vpp=3, **base))
    plain = estimate(model, cluster, ParallelConfig(vpp=1, **base)).stages[-1].memory.activations_bytes
    assert old.stages[-1].memory.activations_bytes == pytest.approx(4.0 * plain, rel=1e-9)
    f, b = [s.forward_s for s in old.stages], [s.backward_s for s in old.stages]
    p2p = [s.p2p_s for s in old.stages]
    assert pipeline_time(f, b, 4, "interleaved", 3, p2p, all_forwards_at_pp=True)[0] >= \
        pipeline_time(f, b, 4, "interleaved", 3, p2p)[0] - 1e-12


def test_the_search_masks_memory_with_the_runtimes_warmup(tmp_path, capsys):
    """The search's feasibility mask counts the chunks the runtime holds: under megatron-lm-2021 at m = pp
    (every forward first) it admits no plan the cost model then finds out of memory, so the plan is proven."""
    import json

    from planner.builders import build
    from planner.cli import main

    path = tmp_path / "gpt.onnx"
    proto = build("gpt", {"layers": 24, "hidden": 4608, "heads": 36, "vocab": 256000, "seq_len": 4096})
    path.write_bytes(proto.SerializeToString())
    assert main(["plan", str(path), "--cluster", "dgx-a100-80gb*1", "--global-batch", "4", "--runtime",
                 "megatron-lm-2021", "--dtype", "fp16", "--recompute", "none", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["search"]["proven_optimal"]
