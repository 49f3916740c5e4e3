"""Pipeline schedules: an event-driven simulator and the closed forms it agrees with on uniform stages.

Model of one iteration (all times per micro-batch and per pipeline stage, as the estimator computes them):

* Stage ``s`` runs on its own devices; it executes its operations in the order its schedule prescribes
  (GPipe: all forwards, then all backwards; 1F1B: Megatron-LM's warm-up / steady one-forward-one-backward /
  cool-down order; interleaved: Megatron-LM's order over ``vpp`` model chunks per device).
* An operation starts when the stage is free and its input has arrived. A forward needs the previous
  (virtual) stage's forward of the same micro-batch plus one point-to-point transfer; a backward needs the
  next (virtual) stage's backward plus one transfer (the last virtual stage's backward needs only its own
  forward).
* ``p2p_s[s]`` is the time to send one micro-batch's boundary tensor from stage ``s`` to stage
  ``(s + 1) % pp`` (the same time for the gradient coming back); the last element is used only by the
  interleaved schedule, whose last device feeds the first device's next chunk. Transfers run on the links,
  not on the stage's compute, and do not queue behind each other (each boundary sends at most one tensor
  per forward-backward period in the steady state).
* With ``vpp`` chunks per device, each chunk takes ``1/vpp`` of the stage's forward and backward time, or,
  given ``chunk_shares``, its own share of them (a pipeline layout, whose chunks hold layers of their own:
  ``planner.rules.layer_chunks``).

``simulate_pipeline`` computes the exact iteration time of that model for any stage times (unequal stages,
as on mixed hardware, too). ``closed_form_time`` gives the textbook formulas, exact for uniform stages:

* GPipe: ``(m + p - 1)(f + b) + 2 (p - 1) c`` (Huang et al. 2019).
* 1F1B and interleaved, transfers free: ``m (f + b) + (p - 1)(f + b) / v`` (Narayanan et al. 2021; ``v = 1``
  for 1F1B). With transfers, 1F1B's steady state waits on them (each stage holds at most ``p - s``
  micro-batches), by an amount that depends on ``m mod p``; the simulator covers that case.

``pipeline_time`` uses the closed form where it is exact and the simulator otherwise.

Expert-parallel overlap (Megatron-Core's ``--overlap-moe-expert-parallel-comm``; ``overlap_ratio`` given): every
stage runs one forward more in its warm-up ("to ensure the forward and backward computations are independent
in all 1f1b steps": ``megatron/core/pipeline_parallel/schedules.py``, ``get_pp_rank_microbatches``; with pp 1,
``combined_1f1b_schedule_for_no_pipelining`` runs one forward first), and each steady-state forward and the
backward after it are one merged step (``planner.cost.moe``), which starts once both inputs are there, takes
``overlap_ratio[s]`` times the two operations' time and hands on both outputs at its end. The warm-up's
forwards and the cool-down's backwards run alone.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Sequence

import numpy as np

from planner.errors import ConfigError
from planner.rules import SCHEDULES


@dataclass(frozen=True)
class PipelineEvent:
    """One operation on one stage: ``kind`` is "forward", "backward" or "send" (a boundary transfer that
    starts on ``stage`` at the end of the operation that produced it). ``chunk`` is the model chunk
    (interleaved schedule; 0 otherwise)."""

    stage: int
    micro_batch: int
    kind: str
    start_s: float
    end_s: float
    chunk: int = 0


@dataclass(frozen=True)
class SimulationResult:
    iteration_time_s: float
    events: tuple[PipelineEvent, ...] = ()
    stage_busy_s: tuple[float, ...] = ()  # compute time of each stage in the iteration


def _as_array(values: float | Sequence[float], length: int, what: str) -> list[float]:
    array = np.broadcast_to(np.asarray(values, dtype=float), (length,)) if np.ndim(values) == 0 \
        else np.asarray(values, dtype=float)
    if array.shape != (length,):
        raise ConfigError(f"{what}: expected {length} values, got {array.shape[0]}")
    if np.any(array < 0) or not np.all(np.isfinite(array)):
        raise ConfigError(f"{what}: times must be finite and non-negative")
    return [float(x) for x in array]


def _check_shares(shares: Sequence[Sequence[float]] | None, pp: int, vpp: int) -> list[list[float]] | None:
    if shares is None:
        return None
    rows = [[float(x) for x in row] for row in shares]
    if len(rows) != pp or any(len(row) != vpp for row in rows):
        raise ConfigError(f"chunk_shares: expected {pp} stages of {vpp} shares each")
    if any(x < 0 or not np.isfinite(x) for row in rows for x in row) or any(abs(sum(row) - 1.0) > 1e-9
                                                                         for row in rows):
        raise ConfigError("chunk_shares: each stage's shares must be non-negative and sum to 1")
    return rows


def _check(forward: Sequence[float], backward: Sequence[float], num_micro_batches: int, schedule: str,
           vpp: int, p2p_s: float | Sequence[float]) -> tuple[list[float], list[float], list[float]]:
    if schedule not in SCHEDULES:
        raise ConfigError(f"schedule {schedule!r} is not one of {', '.join(SCHEDULES)}")
    if num_micro_batches < 1:
        raise ConfigError(f"num_micro_batches={num_micro_batches} must be at least 1")
    if vpp < 1:
        raise ConfigError(f"vpp={vpp} must be at least 1")
    if schedule != "interleaved" and vpp != 1:
        raise ConfigError(f"vpp={vpp} needs the interleaved schedule, not {schedule}")
    pp = len(forward)
    if pp < 1:
        raise ConfigError("a pipeline needs at least one stage")
    f = _as_array(forward, pp, "stage_forward_s")
    b = _as_array(backward, pp, "stage_backward_s")
    c = _as_array(p2p_s, pp, "p2p_s")
    return f, b, c


def interleaved_warmup(stage: int, pp: int, num_micro_batches: int, vpp: int,
                       all_forwards_at_pp: bool = False, ep_overlap: bool = False) -> int:
    """Model-chunk forwards ``stage`` runs before its first backward under the interleaved schedule:
    ``2 (pp - stage - 1) + (vpp - 1) pp`` (one more with ``ep_overlap``), at most all ``m vpp`` of them; every
    one where ``all_forwards_at_pp`` and ``m = pp`` (``planner.runtime.Runtime.interleaved_all_forwards_at_pp``)."""
    total = num_micro_batches * vpp
    if all_forwards_at_pp and num_micro_batches == pp:
        return total
    return min(2 * (pp - stage - 1) + (vpp - 1) * pp + int(ep_overlap), total)


def warmup_forwards(stage: int, pp: int, num_micro_batches: int, schedule: str, vpp: int = 1,
                    all_forwards_at_pp: bool = False, ep_overlap: bool = False) -> int:
    """Forwards ``stage`` runs before its first backward under the 1F1B family of schedules: 1F1B's
    ``pp - stage - 1`` (one more with ``ep_overlap``), at most ``m``; the interleaved schedule's
    :func:`interleaved_warmup`."""
    if schedule == "1f1b" or vpp == 1:
        return min(pp - stage - 1 + int(ep_overlap), num_micro_batches)
    return interleaved_warmup(stage, pp, num_micro_batches, vpp, all_forwards_at_pp, ep_overlap)


def operation_order(stage: int, pp: int, num_micro_batches: int, schedule: str,
                    vpp: int = 1, all_forwards_at_pp: bool = False,
                    ep_overlap: bool = False) -> list[tuple[bool, int, int]]:
    """The order in which ``stage`` runs its operations: ``(is_backward, chunk, micro_batch)``
    (``all_forwards_at_pp``, ``ep_overlap``: :func:`warmup_forwards`; after the warm-up, forwards and
    backwards alternate until the cool-down's backwards)."""
    m = num_micro_batches
    if schedule == "gpipe":
        return [(False, 0, j) for j in range(m)] + [(True, 0, j) for j in range(m)]
    warmup = warmup_forwards(stage, pp, m, schedule, vpp, all_forwards_at_pp, ep_overlap)
    if schedule == "1f1b" or vpp == 1:
        order = [(False, 0, j) for j in range(warmup)]
        for i in range(m - warmup):
            order.append((False, 0, warmup + i))
            order.append((True, 0, i))
        order.extend((True, 0, j) for j in range(m - warmup, m))
        return order
    # interleaved (Megatron-LM's forward_backward_pipelining_with_interleaving)
    total = m * vpp
    group = pp * vpp
    forwards = [(False, (k // pp) % vpp, (k // group) * pp + k % pp) for k in range(total)]
    backwards = [(True, vpp - 1 - (k // pp) % vpp, (k // group) * pp + k % pp) for k in range(total)]
    order = forwards[:warmup]
    for i in range(total - warmup):
        order.append(forwards[warmup + i])
        order.append(backwards[i])
    order.extend(backwards[total - warmup:])
    return order


# kinds of operations in a compiled program
_FORWARD, _BACKWARD, _LAST_BACKWARD = 0, 1, 2


@lru_cache(maxsize=64)
def _program(pp: int, m: int, schedule: str, vpp: int, all_forwards_at_pp: bool, ep_overlap: bool = False
             ) -> tuple[tuple[tuple[int, int, int, int, int, int], ...], ...]:
    """Per stage, its operations as ``(slot, dependency slot or -1, kind, timing, chunk, micro_batch)``; a
    slot indexes the end-time table ``[backward][virtual stage][micro-batch]``, flattened, and ``timing``
    the stage's durations ``[chunk][kind]``, flattened. With ``ep_overlap`` the order is
    :func:`operation_order`'s under expert-parallel overlap (:func:`_merged_steps` pairs its steady state)."""
    programs = []
    for s in range(pp):
        order = operation_order(s, pp, m, schedule, vpp, all_forwards_at_pp, ep_overlap)
        ops = _stage_ops(s, pp, m, vpp, order)
        programs.append(tuple((slot, dep, delay - 3 * s, duration - 3 * vpp * s, chunk, j)
                              for (_, slot, dep, delay, duration), (_, chunk, j) in zip(ops, order)))
    return tuple(programs)


@lru_cache(maxsize=64)
def _merged_steps(pp: int, m: int, schedule: str, vpp: int, all_forwards_at_pp: bool
                  ) -> tuple[tuple[bool, ...], ...]:
    """Per stage and operation of its expert-parallel-overlap program, whether the operation opens a merged
    step with the next one: the steady state's forward and the backward after it."""
    steps = []
    for s in range(pp):
        warmup = warmup_forwards(s, pp, m, schedule, vpp, all_forwards_at_pp, ep_overlap=True)
        steady = m * vpp - warmup
        steps.append(tuple(warmup <= i < warmup + 2 * steady and (i - warmup) % 2 == 0
                           for i in range(2 * m * vpp)))
    return tuple(steps)


def _stage_ops(stage: int, pp: int, m: int, vpp: int, order: Sequence[tuple[bool, int, int]]
               ) -> list[tuple[int, int, int, int, int]]:
    """``stage``'s operations in ``order`` (its :func:`operation_order`) as ``(stage, slot, dependency slot or -1,
    delay, duration)``: a slot indexes the end-time table ``[backward][virtual stage][micro-batch]``,
    flattened; ``delay`` the stages' arrival delays ``[stage][kind]`` and ``duration`` their durations
    ``[stage][chunk][kind]``, both flattened."""
    last_virtual = (vpp - 1) * pp + pp - 1
    half = vpp * pp * m
    delay, duration = 3 * stage, 3 * vpp * stage
    ops = []
    for backward, chunk, j in order:
        virtual = chunk * pp + stage
        if not backward:
            ops.append((stage, virtual * m + j, (virtual - 1) * m + j if virtual else -1, delay + _FORWARD,
                        duration + 3 * chunk + _FORWARD))
        elif virtual == last_virtual:
            ops.append((stage, half + virtual * m + j, virtual * m + j, delay + _LAST_BACKWARD,
                        duration + 3 * chunk + _LAST_BACKWARD))
        else:
            ops.append((stage, half + virtual * m + j, half + (virtual + 1) * m + j, delay + _BACKWARD,
                        duration + 3 * chunk + _BACKWARD))
    return ops


@lru_cache(maxsize=16)
def _topological(pp: int, m: int, schedule: str, vpp: int, all_forwards_at_pp: bool
                 ) -> tuple[tuple[int, int, int, int, int], ...]:
    """Every operation of every stage (:func:`_stage_ops`, no merged steps) in an order that puts each after
    its input and after the stage's earlier operations. Which operation waits for which does not depend on the
    durations, so one order serves every simulation of the shape."""
    programs = [_stage_ops(s, pp, m, vpp, operation_order(s, pp, m, schedule, vpp, all_forwards_at_pp))
                for s in range(pp)]
    done = [False] * (2 * vpp * pp * m) + [True]  # done[-1]: the input of an operation that has none
    ptr = [0] * pp
    order: list[tuple[int, int, int, int, int]] = []
    remaining = sum(len(p) for p in programs)
    while remaining:
        progressed = 0
        for s in range(pp):
            program, i = programs[s], ptr[s]
            n = len(program)
            first = i
            while i < n:
                op = program[i]
                if not done[op[2]]:
                    break
                done[op[1]] = True
                i += 1
            if i != first:
                order.extend(program[first:i])
                progressed += i - first
                ptr[s] = i
        if not progressed:  # pragma: no cover - the schedules above never deadlock
            raise RuntimeError(f"pipeline simulation deadlocked ({schedule}, pp={pp}, m={m}, vpp={vpp})")
        remaining -= progressed
    return tuple(order)


def _run_ordered(order: tuple[tuple[int, int, int, int, int], ...], duration: list[list[float]],
                 delay: list[tuple[float, float, float]], end: list[float], free: list[float],
                 starts: list[list[float]] | None) -> None:
    """The simulation's loop without merged steps: each operation of :func:`_topological`'s order once, at the
    later of its stage's last end and its input's arrival (fills ``end``, ``free`` and ``starts``). An
    operation without an input reads the sentinel past ``end``'s slots, minus infinity, which never wins."""
    dly = [x for row in delay for x in row]
    dur = [x for row in duration for x in row]
    end.append(-math.inf)  # end[-1]: the input of an operation that has none
    if starts is None:
        for s, slot, dep, dk, dt in order:
            t = free[s]
            ready = end[dep] + dly[dk]
            if ready > t:
                t = ready
            end[slot] = free[s] = t + dur[dt]
    else:
        for s, slot, dep, dk, dt in order:
            t = free[s]
            ready = end[dep] + dly[dk]
            if ready > t:
                t = ready
            starts[s].append(t)
            end[slot] = free[s] = t + dur[dt]
    end.pop()


def _arrival(end: list[float], dep: int, delay: float) -> float:
    """When an operation's input arrives: its producer's end plus the transfer (no producer: 0; -1: the producer
    has not run yet)."""
    if dep < 0:
        return 0.0
    return end[dep] + delay if end[dep] >= 0.0 else -1.0


def _run_merged(programs: tuple[tuple[tuple[int, int, int, int, int, int], ...], ...],
                merges: tuple[tuple[bool, ...], ...], ratio: Sequence[float], duration: list[list[float]],
                delay: list[tuple[float, float, float]], end: list[float], free: list[float],
                starts: list[list[float]] | None, label: str) -> None:
    """The simulation's loop under expert-parallel overlap: each stage as far as its inputs allow, in turn, a
    merged step waiting for both of its operations' inputs and ending them together (fills ``end``, ``free``
    and ``starts``)."""
    pp = len(programs)
    ptr = [0] * pp
    remaining = sum(len(p) for p in programs)
    while remaining:
        progressed = 0
        for s in range(pp):
            program, merged = programs[s], merges[s]
            i = ptr[s]
            n = len(program)
            t = free[s]
            dur = duration[s]
            dly = delay[s]
            first = i
            while i < n:
                slot, dep, kind, timing, _, _ = program[i]
                if dep >= 0:
                    ready = end[dep]
                    if ready < 0.0:
                        break
                    ready += dly[kind]
                    if ready > t:
                        t = ready
                if merged[i]:  # a merged step: both inputs, one shared end
                    slot2, dep2, kind2, timing2, _, _ = program[i + 1]
                    ready = _arrival(end, dep2, dly[kind2])
                    if ready < 0.0:
                        break
                    t = max(t, ready)
                    if starts is not None:
                        starts[s] += [t, t]
                    t += ratio[s] * (dur[timing] + dur[timing2])
                    end[slot] = end[slot2] = t
                    i += 2
                    continue
                if starts is not None:
                    starts[s].append(t)
                t += dur[timing]
                end[slot] = t
                i += 1
            if i != first:
                progressed += i - first
                ptr[s] = i
                free[s] = t
        if not progressed:  # pragma: no cover - the schedules above never deadlock
            raise RuntimeError(f"pipeline simulation deadlocked ({label})")
        remaining -= progressed


def simulate_pipeline(stage_forward_s: Sequence[float], stage_backward_s: Sequence[float],
                      num_micro_batches: int, schedule: str = "1f1b", vpp: int = 1,
                      p2p_s: float | Sequence[float] = 0.0, record_events: bool = True,
                      chunk_shares: Sequence[Sequence[float]] | None = None,
                      all_forwards_at_pp: bool = False,
                      overlap_ratio: Sequence[float] | None = None) -> SimulationResult:
    """Event-driven simulation of one iteration (see the module docstring for the model). ``chunk_shares``:
    per stage, each chunk's share of the stage's forward and backward time (None: ``1/vpp`` each);
    ``all_forwards_at_pp``: the runtime's interleaved warm-up (:func:`interleaved_warmup`); ``overlap_ratio``:
    per stage, a merged step's time over its forward's and backward's (expert-parallel overlap; None: none)."""
    f, b, c = _check(stage_forward_s, stage_backward_s, num_micro_batches, schedule, vpp, p2p_s)
    shares = _check_shares(chunk_shares, len(f), vpp)
    if schedule == "interleaved" and vpp > 1 and num_micro_batches % len(f) != 0:
        raise ConfigError(f"the interleaved schedule needs the number of micro-batches "
                          f"({num_micro_batches}) to be a multiple of pp={len(f)}")
    pp, m, v = len(f), num_micro_batches, vpp
    overlap = overlap_ratio is not None
    if overlap and schedule == "gpipe":
        raise ConfigError("expert-parallel overlap merges the 1F1B steady state's steps; GPipe has none")
    ratio = _as_array(overlap_ratio, pp, "overlap_ratio") if overlap else [1.0] * pp
    # the compiled programs: for the merged steps and the events (a plain run reads _topological's order)
    programs = _program(pp, m, schedule, v, bool(all_forwards_at_pp), overlap) if overlap or record_events else ()
    merges = _merged_steps(pp, m, schedule, v, bool(all_forwards_at_pp)) if overlap else None
    end = [-1.0] * (2 * v * pp * m)
    free = [0.0] * pp
    # per stage: the duration of each kind of operation of each chunk, and the arrival delay of each kind
    if shares is None:
        duration = [[f[s] / v, b[s] / v, b[s] / v] * v for s in range(pp)]
    else:
        duration = [[x for w in shares[s] for x in (f[s] * w, b[s] * w, b[s] * w)] for s in range(pp)]
    delay = [(c[(s - 1) % pp], c[s], 0.0) for s in range(pp)]
    starts: list[list[float]] | None = [[] for _ in range(pp)] if record_events else None
    if merges is None:  # each operation once, in an order that has its input ready
        _run_ordered(_topological(pp, m, schedule, v, bool(all_forwards_at_pp)), duration, delay, end, free,
                     starts)
    else:
        _run_merged(programs, merges, ratio, duration, delay, end, free, starts,
                    f"{schedule}, pp={pp}, m={m}, vpp={v}")
    total = max(free)
    busy = tuple(m * (f[s] + b[s]) for s in range(pp))
    if merges is not None:  # a merged step is busy for its own time, not its two operations'
        busy = tuple(busy[s] - (1.0 - ratio[s]) * sum(duration[s][programs[s][i][3]]
                                                      + duration[s][programs[s][i + 1][3]]
                                                      for i, opens in enumerate(merges[s]) if opens)
                     for s in range(pp))
    events: list[PipelineEvent] = []
    if starts is not None:
        for s in range(pp):
            for (slot, _, kind, _, chunk, j), start in zip(programs[s], starts[s]):
                finish = end[slot]
                backward = kind != _FORWARD
                events.append(PipelineEvent(s, j, "backward" if backward else "forward", start, finish, chunk))
                sends = (not backward and chunk * pp + s != (v - 1) * pp + pp - 1) or (backward and chunk * pp + s != 0)
                if sends:
                    link = s if not backward else (s - 1) % pp
                    events.append(PipelineEvent(s, j, "send", finish, finish + c[link], chunk))
        events.sort(key=lambda e: (e.start_s, e.stage, e.kind, e.micro_batch, e.chunk))
    return SimulationResult(total, tuple(events), busy)


def closed_form_time(forward_s: float, backward_s: float, pp: int, num_micro_batches: int, schedule: str,
                     vpp: int = 1, p2p_s: float = 0.0) -> float | None:
    """Iteration time of a pipeline of ``pp`` identical stages, or None where no closed form is exact.

    GPipe: ``(m + p - 1)(f + b) + 2 (p - 1) c`` for any transfer time ``c``. 1F1B and interleaved with free
    transfers (``c = 0``): ``m (f + b) + (p - 1)(f + b) / v`` (``v = 1`` for 1F1B; interleaving needs
    ``m`` to be a multiple of ``p``). With ``c > 0`` the 1F1B steady state waits on transfers in a way that
    depends on ``m mod p`` and on ``f`` against ``b``; the simulator handles it.
    """
    f, b, c, m, p, v = forward_s, backward_s, p2p_s, num_micro_batches, pp, vpp
    if schedule == "gpipe":
        return (m + p - 1) * (f + b) + 2 * (p - 1) * c
    if c > 0 and p > 1:
        return None
    if schedule == "1f1b" or v == 1:
        return (m + p - 1) * (f + b)
    if m % p != 0:
        return None
    return m * (f + b) + (p - 1) * (f + b) / v


def pipeline_time(stage_forward_s: Sequence[float], stage_backward_s: Sequence[float], num_micro_batches: int,
                  schedule: str = "1f1b", vpp: int = 1, p2p_s: float | Sequence[float] = 0.0,
                  chunk_shares: Sequence[Sequence[float]] | None = None,
                  all_forwards_at_pp: bool = False,
                  overlap_ratio: Sequence[float] | None = None) -> tuple[float, float]:
    """``(iteration_time_s, bubble_s)`` of the pipeline part of an iteration.

    ``bubble_s`` is the time the busiest stage is not computing (fill, drain and waits on transfers):
    ``iteration_time_s - m * max_s(f_s + b_s)`` (at least 0). Closed form where it is exact (uniform stages
    and chunks, no expert-parallel overlap), the event simulation otherwise.
    """
    f, b, c = _check(stage_forward_s, stage_backward_s, num_micro_batches, schedule, vpp, p2p_s)
    busiest = num_micro_batches * max(x + y for x, y in zip(f, b))
    pp = len(f)
    links = c[:-1] if schedule != "interleaved" else c
    total: float | None = None
    if chunk_shares is None and overlap_ratio is None and max(f) == min(f) and max(b) == min(b) \
            and (not links or max(links) == min(links)):
        total = closed_form_time(f[0], b[0], pp, num_micro_batches, schedule, vpp, links[0] if links else 0.0)
    if total is None:
        total = simulate_pipeline(f, b, num_micro_batches, schedule, vpp, c, record_events=False,
                                  chunk_shares=chunk_shares, all_forwards_at_pp=all_forwards_at_pp,
                                  overlap_ratio=overlap_ratio).iteration_time_s
    return total, max(0.0, total - busiest)
