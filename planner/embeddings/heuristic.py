"""Greedy placement and local search: the fast path for instances past the MILP's size, and its warm start.

1. Each table takes the option the LP relaxation weights most (ties: the one whose unit alone is fastest);
   where those do not fit in memory, tables give up their favourites in the order of :func:`_relief_moves`.
2. Units go largest first onto the position that finishes earliest (LPT on heterogeneous devices: the device's
   time after adding the unit, with its own bandwidth and links), within memory; a second pass puts them where
   the additive load (sent + received bytes, no overlap) is least, which spreads both links more evenly.
3. Refinement: for the tables on the slowest device, try each other option (a finer column split, a row-wise
   split, data-parallel...) and place again; keep the first change that lowers the slowest device's time;
   when none does, change a whole group of tables that share a sharding at once.
4. Local search on the slowest device: move one of its units elsewhere, or re-shard one of its tables in
   place, whenever that lowers the time of every device it touches below the current maximum (or swap a unit,
   or a node-wide unit, with a smaller one elsewhere).
5. Ruin and recreate (:func:`rebuild`, on the best plan of all starts): re-insert a few tables at once with
   their best options, which crosses plateaus where many devices share the maximum.
6. Option changes followed by a local search, one table at a time: finer shards for the slowest device's
   units (:func:`split_bottleneck`), other options for the tables whose units pay all-to-all excess
   (:func:`reshard_excess`).

Beside steps 2-4, :func:`target_pack` packs against a target time instead of balancing: bisection on the target
between a lower bound and the best plan, units best fit under it, a table split finer where its units fit
nowhere under it.
Every loop is bounded by a count of evaluations (:class:`Work`, not the clock), so the same input gives the
same plan on a fast or a slow machine.
"""

from __future__ import annotations

import bisect
import heapq
from dataclasses import dataclass, field, replace
from typing import Sequence

import numpy as np

from planner.embeddings.problem import Loads, Problem, UnitLoad, unit_memory_bytes

Assignment = tuple[tuple[int, tuple[int, ...]], ...]
# work budget of the refinement, in unit placements x devices (about 0.5 s of numpy work on one core), and
# at most this many greedy re-runs
_REFINE_WORK = 3e6
_REFINE_MAX = 200
_GROUP_POLISH_ROUNDS = 300  # local-search rounds spent judging one group change


@dataclass
class Work:
    """What the search may still spend, in evaluations of the devices' times (each a few numpy operations over
    the devices): a deterministic stand-in for a time limit."""

    left: float

    def spend(self, amount: float = 1.0) -> None:
        self.left -= amount

    @property
    def done(self) -> bool:
        return self.left <= 0


@dataclass
class _State:
    """A partial assignment and its per-device loads (mutable, private to the search)."""

    problem: Problem
    compute: np.ndarray
    ids_recv: np.ndarray
    pool_send: np.ndarray
    hbm: np.ndarray
    host: np.ndarray
    latency: np.ndarray
    ids_send: float = 0.0
    pool_recv: float = 0.0
    option: list[int | None] = field(default_factory=list)
    positions: list[list[int]] = field(default_factory=list)
    fused: dict[tuple[str, int], int] = field(default_factory=dict)
    work: Work = field(default_factory=lambda: Work(np.inf))

    @classmethod
    def empty(cls, problem: Problem, work: Work) -> "_State":
        n = problem.dev.count
        t = len(problem.tables)
        return cls(problem, *(np.zeros(n) for _ in range(6)), option=[None] * t, positions=[[] for _ in range(t)],
                   work=work)

    def loads(self) -> Loads:
        return Loads(self.compute, self.ids_recv, self.pool_send, self.hbm, self.host, self.ids_send,
                     self.pool_recv, self.latency)

    def times(self) -> np.ndarray:
        self.work.spend()
        return self.problem.device_time_s(self.loads())

    def makespan(self) -> float:
        return float(self.times().max())

    def apply_unit(self, t: int, o: int, p: int, sign: float) -> None:
        problem = self.problem
        option = problem.options[t][o]
        if option.scope == "device":  # one device: scalar updates, with no UnitLoad built per device
            self.compute[p] += sign * problem.device_unit_s(option, p)
            self.ids_recv[p] += sign * option.ids_recv_bytes
            self.pool_send[p] += sign * option.pool_send_bytes
            self.hbm[p] += sign * (0.0 if option.host else option.memory_bytes)
            self.host[p] += sign * (option.memory_bytes if option.host else 0.0)
            return  # per-device options run no fused collective
        u = problem.unit(t, o, p)
        self.compute[u.devices] += sign * u.compute_s
        self.ids_recv[u.devices] += sign * u.ids_recv_bytes
        self.pool_send[u.devices] += sign * u.pool_send_bytes
        self.hbm[u.devices] += sign * u.hbm_bytes
        self.host[u.devices] += sign * u.host_bytes
        key = problem.fused_key(option, p)
        if key is not None:
            before = self.fused.get(key, 0)
            after = before + int(sign)
            self.fused[key] = after
            if (before == 0) != (after == 0):
                members, seconds = problem.fused_latency(key)
                self.latency[members] += seconds if after else -seconds

    def choose(self, t: int, o: int) -> None:
        option = self.problem.options[t][o]
        self.option[t] = o
        self.ids_send += option.ids_send_bytes
        self.pool_recv += option.pool_recv_bytes

    def remove_table(self, t: int) -> tuple[int, list[int]]:
        o = self.option[t]
        if o is None:
            raise ValueError(f"table {t} is not placed")
        option = self.problem.options[t][o]
        for p in self.positions[t]:
            self.apply_unit(t, o, p, -1.0)
        self.ids_send -= option.ids_send_bytes
        self.pool_recv -= option.pool_recv_bytes
        old = (o, self.positions[t])
        self.option[t], self.positions[t] = None, []
        return old

    def restore_table(self, t: int, old: tuple[int, list[int]]) -> None:
        o, positions = old
        self.choose(t, o)
        for p in positions:
            self.apply_unit(t, o, p, 1.0)
        self.positions[t] = list(positions)

    def copy(self, work: Work) -> "_State":
        """An independent copy of this state that spends ``work`` (cheaper than rebuilding it from its
        assignment: no unit is applied again)."""
        return replace(self, compute=self.compute.copy(), ids_recv=self.ids_recv.copy(),
                       pool_send=self.pool_send.copy(), hbm=self.hbm.copy(), host=self.host.copy(),
                       latency=self.latency.copy(), option=list(self.option),
                       positions=[list(p) for p in self.positions], fused=dict(self.fused), work=work)

    def assignment(self) -> Assignment:
        return tuple((int(o), tuple(self.positions[t])) for t, o in enumerate(self.option))

    # ---------------------------------------------------------------------------- placement
    def candidate_times(self, t: int, o: int) -> tuple[np.ndarray, np.ndarray]:
        """Device scope: each device's time if one more unit of (t, o) went there, and where it fits."""
        problem, dev = self.problem, self.problem.dev
        self.work.spend()
        option = problem.options[t][o]
        a2a = (np.maximum(self.ids_recv + option.ids_recv_bytes, self.ids_send)
               + 2.0 * np.maximum(self.pool_send + option.pool_send_bytes, self.pool_recv))
        times = (problem.base_time_s() + self.latency + self.compute + problem.lookup_s(option)
                 + dev.a2a_s_per_byte * a2a)
        if option.host:
            fits = self.host + option.memory_bytes <= dev.host_capacity_bytes
        else:
            fits = self.hbm + option.memory_bytes <= dev.hbm_capacity_bytes
        return times, fits

    def additive_load(self, t: int, o: int) -> np.ndarray:
        """Device scope: each device's load if one more unit of (t, o) went there, counting sent and received
        bytes as if they queued on one link (no max): the measure a load-balancing planner uses."""
        problem, dev = self.problem, self.problem.dev
        option = problem.options[t][o]
        a2a = self.ids_recv + option.ids_recv_bytes + 2.0 * (self.pool_send + option.pool_send_bytes)
        return self.latency + self.compute + problem.lookup_s(option) + dev.a2a_s_per_byte * a2a

    def place_unit(self, t: int, o: int, rule: str = "finish") -> bool:
        """Put one unit of (t, o) where it finishes earliest (``rule="finish"``) or where the additive load is
        least (``"additive"``); False when it fits nowhere."""
        option = self.problem.options[t][o]
        if option.scope == "device":
            times, fits = self.candidate_times(t, o)
            if not fits.any():
                return False
            if rule == "additive":
                times = self.additive_load(t, o)
            p = int(np.argmin(np.where(fits, times, np.inf)))
        else:
            worst = self.unit_worst_times(t, o)
            i = int(np.argmin(worst))  # the first of the least
            if not np.isfinite(worst[i]):
                return False
            p = self.problem.unit_stack(t, o).positions[i]
        self.apply_unit(t, o, p, 1.0)
        self.positions[t].append(p)
        return True

    def unit_worst_time(self, t: int, o: int, p: int) -> float:
        """The slowest touched device's time if unit (t, o) were added at p (one evaluation); inf when it does
        not fit. The state is left as it was."""
        stack = self.problem.unit_stack(t, o)
        tried = np.zeros(len(stack.positions), dtype=bool)
        tried[stack.index[p]] = True
        return float(self.unit_worst_times(t, o, tried)[stack.index[p]])

    def unit_worst_times(self, t: int, o: int, tried: np.ndarray | None = None) -> np.ndarray:
        """unit_worst_time at each position of (t, o) (``problem.positions`` order) where ``tried`` (default:
        all), inf elsewhere; one evaluation per tried position where the unit fits."""
        problem = self.problem
        stack, dev = problem.unit_stack(t, o), problem.dev
        u, d = stack.unit, stack.unit.devices
        hbm, host = self.hbm[d] + u.hbm_bytes, self.host[d] + u.host_bytes
        over = (hbm > dev.hbm_capacity_bytes[d] * (1 + 1e-12)) | (host > dev.host_capacity_bytes[d] * (1 + 1e-12))
        fits = ~np.logical_or.reduceat(over, stack.starts)
        if tried is not None:
            fits &= tried
        self.work.spend(int(fits.sum()))
        # a unit that starts its fused collective pays its latency on the unit's devices (its node's, or all)
        starts = np.array([key is not None and self.fused.get(key, 0) == 0 for key in stack.fused])
        latency = self.latency[d] + np.repeat(np.where(starts, stack.latency_s, 0.0), stack.sizes)
        loads = Loads(self.compute[d] + u.compute_s, self.ids_recv[d] + u.ids_recv_bytes,
                      self.pool_send[d] + u.pool_send_bytes, hbm, host, self.ids_send, self.pool_recv, latency)
        worst = np.maximum.reduceat(problem.device_time_s(loads, d), stack.starts)
        return np.where(fits, worst, np.inf)

    def place_table(self, t: int, o: int) -> bool:
        self.choose(t, o)
        for _ in range(self.problem.options[t][o].units):
            if not self.place_unit(t, o):
                self.remove_table(t)
                return False
        return True


def _with_global_units(problem: Problem, choice: Sequence[int], work: Work) -> tuple[_State, list[int]]:
    """A state with every table's option chosen (so every all-to-all total is known before any unit is placed)
    and the global units placed; and the tables left to place."""
    state = _State.empty(problem, work)
    for t, o in enumerate(choice):
        state.choose(t, o)
    for t, o in enumerate(choice):
        if problem.options[t][o].scope == "global":
            state.apply_unit(t, o, 0, 1.0)
            state.positions[t].append(0)
    return state, [t for t, o in enumerate(choice) if problem.options[t][o].scope != "global"]


def greedy(problem: Problem, choice: Sequence[int], work: Work, rule: str = "finish",
           big_first: bool = False) -> _State | None:
    """LPT placement of the chosen options (global ones first, then node-wide, then per-device units, largest
    first; with ``big_first``, units filling more than half a device's memory before all others but the global
    ones, as each needs a device of its own); None when some unit finds no room."""
    state, pending = _with_global_units(problem, choice, work)

    def order(t: int) -> tuple:
        big = big_first and _fill(problem, t, choice[t]) > BIG_FILL
        return (not big, problem.options[t][choice[t]].scope != "node", -problem.unit_size_s(t, choice[t]), t)

    pending.sort(key=order)
    for t in pending:
        o = choice[t]
        for _ in range(problem.options[t][o].units):
            if not state.place_unit(t, o, rule):
                return None
    return state if problem.fits(state.loads()) else None


def least_work_guide(problem: Problem) -> tuple[tuple[float, ...], ...]:
    """Per table, weight 1 on the option with the least total work over the devices it touches (lookups,
    collectives and all-to-all seconds summed, on its first position): the choice a planner that only balances
    load would make. A third start for the greedy, beside the LP's and the integral relaxation's choices."""
    guide = []
    for t, options in enumerate(problem.options):
        best = min((option_work_s(problem, t, o), o) for o in range(len(options)))[1]
        guide.append(tuple(1.0 if o == best else 0.0 for o in range(len(options))))
    return tuple(guide)


def option_work_s(problem: Problem, t: int, o: int) -> float:
    """The seconds table ``t``'s option ``o`` adds over all the devices it touches: its units' lookups,
    collectives and all-to-all bytes, each unit on its first position (a one-device unit on the fastest
    device)."""
    dev, u = problem.dev, _first_unit(problem, t, o)
    a2a = dev.a2a_s_per_byte[u.devices] * (u.ids_recv_bytes + 2.0 * u.pool_send_bytes)
    return float(np.sum(u.compute_s + a2a)) * problem.options[t][o].units


def _first_unit(problem: Problem, t: int, o: int) -> UnitLoad:
    """One unit of table ``t``'s option ``o`` standing for all of them: at its first position, a one-device unit
    on the fastest device."""
    option = problem.options[t][o]
    position = (int(np.argmax(problem.dev.lookup_Bps)) if option.scope == "device"
                else problem.distinct_positions(option)[0])
    return problem.unit(t, o, position)


def preferences(problem: Problem, weights: Sequence[Sequence[float]] | None) -> list[list[int]]:
    """Per table, its options best first: LP weight, then the unit-alone time."""
    order = []
    for t, options in enumerate(problem.options):
        w = weights[t] if weights else [0.0] * len(options)
        order.append(sorted(range(len(options)), key=lambda o: (-round(w[o], 6), problem.unit_alone_s(t, o), o)))
    return order


def _first_feasible(problem: Problem, prefs: list[list[int]], work: Work) -> tuple[list[int], _State] | None:
    """The LP's favourite options; where the greedy runs out of memory, tables give up their favourites in the
    order of :func:`_relief_moves`. The moves are fixed in advance (they do not depend on the greedy's
    placement), so the greedy runs after 0, 1, 2, 4, ... of them up to the first count that fits, then bisects
    down to the fewest moves that fit from the last count that did not: a few dozen greedy runs at most where
    memory is tight on thousands of tables. None when no count tried fits. Each choice is placed in the
    greedy's order and, where that does not fit, with the units over half a device first."""
    start = [p[0] for p in prefs]

    def attempt(count: int) -> tuple[list[int], _State] | None:
        choice = list(start)
        for t, o in moves[:count]:
            choice[t] = o
        state = greedy(problem, choice, work)
        if state is None:  # the big units' devices may have been filled before them
            state = greedy(problem, choice, work, big_first=True)
        return None if state is None else (choice, state)

    moves: list[tuple[int, int]] = []
    found = attempt(0)
    if found is not None:
        return found
    moves = _relief_moves(problem, start)  # only where the favourites do not fit: it sizes every option
    failed, count = 0, 0
    while found is None:
        if count == len(moves):
            return None
        failed, count = count, min(max(1, 2 * count), len(moves))
        found = attempt(count)
    while count - failed > 1:
        middle = (failed + count) // 2
        tried = attempt(middle)
        if tried is None:
            failed = middle
        else:
            count, found = middle, tried
    return found


# a unit filling more than half a device's memory cannot share it with another such unit: at most one per device
BIG_FILL = 0.5
# the exponent of the memory pressure (:class:`_Pressure`): a smooth stand-in for the fullest of its resources,
# so that bytes move to whichever memory has room and big units split where they would not fit
PRESSURE_POWER = 9


class _Pressure:
    """How short of memory a choice of options is. Per memory (HBM, host): (demand / capacity) and (pieces filling
    more than half a device / devices: a device holds one at most), each to the power :data:`PRESSURE_POWER`,
    plus :data:`PRESSURE_POWER` times the pieces' overflow: over every piece of the units not spread over all
    devices, by how much its share of its device and the share the spread units take on every device exceed the
    whole device (the greedy places the spread ones first, so each other piece must fit beside them; the factor
    is the first terms' slope where a memory is just full)."""

    def __init__(self, problem: Problem, choice: list[int], fills: list[list[float]]):
        dev = problem.dev
        self.choice = list(choice)
        self.held = [[_memory_bytes(problem, t, o) + _big_pieces(problem, t, o) for o in range(len(options))]
                     for t, options in enumerate(problem.options)]
        self.capacity = (float(dev.hbm_capacity_bytes.sum()), float(dev.host_capacity_bytes.sum()),
                         float(np.count_nonzero(dev.hbm_capacity_bytes)),
                         float(np.count_nonzero(dev.host_capacity_bytes)))
        self.used = [sum(self.held[t][o][k] for t, o in enumerate(choice)) for k in range(len(self.capacity))]
        # per option: its memory, and the share of every device it takes (spread over all devices) or its pieces
        # and the share of a device each takes
        self.share: list[list[tuple[int, bool, float, int]]] = [
            [(int(option.host), option.scope == "global", fills[t][o],
              option.units if option.scope == "device" else len(_first_unit(problem, t, o).devices))
             for o, option in enumerate(options)] for t, options in enumerate(problem.options)]
        self.spread = [0.0, 0.0]
        self.pieces: list[list[tuple[float, int, int]]] = [[], []]  # per memory, sorted (share, table, count)
        for t, o in enumerate(choice):
            self._add(t, o, 1.0)
        self._now: float | None = None  # value() of the current choice, until it moves

    def _add(self, t: int, o: int, sign: float) -> None:
        k, spread, share, count = self.share[t][o]
        if spread:
            self.spread[k] += sign * share
        elif sign > 0:
            bisect.insort(self.pieces[k], (share, t, count))
        else:
            self.pieces[k].remove((share, t, count))

    def _overflow(self, k: int, spread: float, skip: int | None) -> float:
        """The pieces' overflow in memory ``k`` beside ``spread``, without table ``skip``'s."""
        pieces = self.pieces[k]
        first = bisect.bisect_right(pieces, (1.0 - spread, len(self.choice), 0))
        return sum(count * (share + spread - 1.0) for share, t, count in pieces[first:] if t != skip)

    def value(self, t: int | None = None, o: int = 0) -> float:
        """The pressure now, or if table ``t`` took option ``o``."""
        if t is None and self._now is not None:
            return self._now
        used, spread, extra = self.used, list(self.spread), [0.0, 0.0]
        if t is not None:
            a = self.choice[t]
            used = self._changed(t, a, o)
            for option, sign in ((a, -1.0), (o, 1.0)):
                k, is_spread, share, _ = self.share[t][option]
                if is_spread:
                    spread[k] += sign * share
            k, is_spread, share, count = self.share[t][o]
            if not is_spread:  # its pieces beside the spread share as it would be
                extra[k] = count * max(0.0, share + spread[k] - 1.0)
        value = sum((d / c) ** PRESSURE_POWER for d, c in zip(used, self.capacity) if c > 0)
        value += PRESSURE_POWER * sum(self._overflow(k, spread[k], t) + extra[k] for k in (0, 1))
        if t is None:
            self._now = value
        return value

    def move(self, t: int, o: int) -> None:
        a = self.choice[t]
        self.used = self._changed(t, a, o)
        self._add(t, a, -1.0)
        self._add(t, o, 1.0)
        self.choice[t] = o
        self._now = None

    def _changed(self, t: int, a: int, o: int) -> list[float]:
        """The resources used if table ``t`` went from option ``a`` to ``o``."""
        return [used + new - old for used, new, old in zip(self.used, self.held[t][o], self.held[t][a])]


def _relief_moves(problem: Problem, start: list[int]) -> list[tuple[int, int]]:
    """The order in which tables give up the options ``start`` chose for memory: while some move lowers the
    memory pressure (:class:`_Pressure`), the move with the least added work (:func:`option_work_s`) per unit of
    pressure relieved, among options filling at most half a device or no more than the table's current one;
    first only the moves whose unit alone (:meth:`Problem.unit_alone_s`) is no slower than the slowest of
    ``start`` or the table's current one, then any: added work is summed over devices, so a move to one slow
    unit (a replicated table made whole on one device) could look cheap. Bytes leave the memory that is short
    (to host memory, to finer shards of cheap tables) and big units split where they would not fit, at the
    least cost in time. Every move lowers the pressure, so the list ends."""
    sizes = [len(options) for options in problem.options]
    work = [[option_work_s(problem, t, o) for o in range(k)] for t, k in enumerate(sizes)]
    fills = [[_fill(problem, t, o) for o in range(k)] for t, k in enumerate(sizes)]
    alone = [[problem.unit_alone_s(t, o) for o in range(k)] for t, k in enumerate(sizes)]
    pressure = _Pressure(problem, start, fills)
    moves: list[tuple[int, int]] = []

    def move(t: int, o: int) -> None:
        pressure.move(t, o)
        moves.append((t, o))

    def cheapest(t: int, ceiling: float) -> tuple[float, int] | None:
        """(added work per pressure relieved, option) of table t's best move that relieves any, to an option
        whose unit alone takes at most ``ceiling`` or the current one's time; None if none."""
        a, now = pressure.choice[t], pressure.value()
        best = None
        for o in range(sizes[t]):
            if o == a or fills[t][o] > max(fills[t][a], BIG_FILL) or alone[t][o] > max(alone[t][a], ceiling):
                continue
            relief = now - pressure.value(t, o)
            if relief > 0:
                price = (work[t][o] - work[t][a]) / relief
                best = min(best, (price, o)) if best is not None else (price, o)
        return best

    # the moves that keep every unit within the slowest of the start first, then any; each in a lazy heap:
    # prices go stale as the demand moves, so a table's move is re-priced when it comes up and made only if it
    # is still no dearer than the next one on the heap
    for ceiling in (max(alone[t][o] for t, o in enumerate(start)), np.inf):
        heap = [(m[0], t) for t in range(len(start)) for m in (cheapest(t, ceiling),) if m is not None]
        heapq.heapify(heap)
        while heap:
            t = heapq.heappop(heap)[1]
            fresh = cheapest(t, ceiling)
            if fresh is None:
                continue
            if heap and (fresh[0], t) > heap[0]:
                heapq.heappush(heap, (fresh[0], t))
                continue
            move(t, fresh[1])
            again = cheapest(t, ceiling)
            if again is not None:
                heapq.heappush(heap, (again[0], t))
    return moves


def _memory_bytes(problem: Problem, t: int, o: int) -> tuple[float, float]:
    """(HBM, host) bytes all the units of table ``t``'s option ``o`` take together."""
    units, u = problem.options[t][o].units, _first_unit(problem, t, o)
    return units * float(u.hbm_bytes.sum()), units * float(u.host_bytes.sum())


def _big_pieces(problem: Problem, t: int, o: int) -> tuple[float, float]:
    """(HBM, host) pieces of table ``t``'s option ``o`` that fill more than half of their device's memory: its
    one-device units that do (by :func:`_fill`), or the devices a wider unit fills so."""
    option, dev = problem.options[t][o], problem.dev
    if option.scope == "device":
        count = float(option.units) if _fill(problem, t, o) > BIG_FILL else 0.0
    else:
        u = _first_unit(problem, t, o)
        held = unit_memory_bytes(u, option.host)
        capacity = (dev.host_capacity_bytes if option.host else dev.hbm_capacity_bytes)[u.devices]
        count = float(np.count_nonzero(held > BIG_FILL * capacity))
    return (0.0, count) if option.host else (count, 0.0)


def _fill(problem: Problem, t: int, o: int) -> float:
    """The largest share of a device's memory (HBM, or host memory for host options) that one unit of table
    ``t``'s option ``o`` takes: on the largest device for a one-device unit, on each device it spans else."""
    option, dev = problem.options[t][o], problem.dev
    capacity = dev.host_capacity_bytes if option.host else dev.hbm_capacity_bytes
    if option.scope == "device":
        return option.memory_bytes / float(capacity.max())
    u = _first_unit(problem, t, o)
    held = unit_memory_bytes(u, option.host)
    with np.errstate(divide="ignore", invalid="ignore"):  # bytes on a device with none of that memory: inf
        return float(np.max(np.where(held > 0, held / capacity[u.devices], 0.0), initial=0.0))


def _tables_on(state: _State, device: int, spread: bool = True) -> list[int]:
    """The tables with a unit on ``device``, largest unit first; without those spread over every device (row-wise,
    data-parallel) unless ``spread``."""
    problem = state.problem
    node = int(problem.dev.node_of[device])  # node-wide units sit at their node's index
    found = []
    for t, (o, positions) in enumerate(zip(state.option, state.positions)):
        if o is None or not (spread or device in positions or node in positions):
            continue
        scope = problem.options[t][o].scope
        if scope == "global":
            if spread:
                found.append(t)
        elif (device if scope == "device" else node) in positions:
            found.append(t)
    found.sort(key=lambda t: (-problem.unit_size_s(t, state.option[t]), t))
    return found


def refine(problem: Problem, choice: list[int], state: _State, tables_per_round: int = 3
           ) -> tuple[list[int], _State]:
    """Refinement: re-choose options of tables on the slowest device, re-running the greedy each time."""
    units = sum(problem.options[t][o].units for t, o in enumerate(choice))
    budget = max(8, min(_REFINE_MAX, int(_REFINE_WORK / max(units * problem.dev.count, 1))))
    best = state.makespan()
    work = state.work
    while budget > 0 and not work.done:
        worst = int(np.argmax(state.times()))
        improved = False
        for t in _tables_on(state, worst)[:tables_per_round]:
            for o in sorted(range(len(problem.options[t])), key=lambda j: (problem.unit_alone_s(t, j), j)):
                if o == choice[t] or budget <= 0:
                    continue
                budget -= 1
                trial = choice.copy()
                trial[t] = o
                candidate = greedy(problem, trial, work)
                if candidate is not None and candidate.makespan() < best * (1 - 1e-9):
                    choice, state, best, improved = trial, candidate, candidate.makespan(), True
                    break
            if improved:
                break
        if not improved:
            trial = _group_change(problem, choice, state, best, budget)
            if trial is None:
                break
            choice, state, best, spent = trial
            budget -= spent
    return choice, state


def _label(problem: Problem, t: int, o: int) -> tuple[str, int, bool]:
    option = problem.options[t][o]
    return option.sharding, option.units, option.host


def _group_change(problem: Problem, choice: list[int], state: _State, best: float, budget: int):
    """Re-shard every table that shares one sharding (type, shard count) with a table on the slowest device, all
    at once: balancing pooled-output bytes sometimes needs a whole group split finer, which no single change
    shows (each alone only adds ids traffic everywhere). Returns (choice, state, makespan, greedy runs) or None."""
    worst = int(np.argmax(state.times()))
    spent = 0
    labels = sorted({_label(problem, t, choice[t]) for t in _tables_on(state, worst)})
    for label in labels:
        members = [t for t in range(len(choice)) if _label(problem, t, choice[t]) == label]
        if len(members) < 2:
            continue
        targets = sorted({_label(problem, t, o) for t in members for o in range(len(problem.options[t]))} - {label})
        for target in targets:
            if spent >= budget:
                return None
            trial = choice.copy()
            for t in members:
                match = [o for o in range(len(problem.options[t])) if _label(problem, t, o) == target]
                if match:
                    trial[t] = match[0]
            spent += 1
            candidate = greedy(problem, trial, state.work)
            if candidate is None:
                continue
            # a group change moves many units at once: judge it after a short local search
            candidate = local_search(candidate, max_rounds=_GROUP_POLISH_ROUNDS)
            if candidate.makespan() < best * (1 - 1e-9):
                return trial, candidate, candidate.makespan(), spent
    return None


def local_search(state: _State, max_rounds: int = 5000, spread: bool = True) -> _State:
    """Local search: improve the slowest device until no move helps (or the work runs out). ``spread=False``
    leaves the tables spread over every device (row-wise, data-parallel) out of the re-sharding: each of them
    is on the slowest device, so trying their options costs the most evaluations per round."""
    for _ in range(max_rounds):
        if state.work.done:
            break
        times = state.times()
        worst = int(np.argmax(times))
        limit = float(times[worst]) * (1 - 1e-9)
        if not (_move_unit(state, worst, limit) or _swap_units(state, worst, limit, times)
                or _swap_node_units(state, worst, limit, times) or _reshard(state, worst, limit, spread)):
            break
    return state


def _device_units(state: _State) -> list[list[tuple[int, int]]]:
    """Per device, its device-scope units as (table, option)."""
    out: list[list[tuple[int, int]]] = [[] for _ in range(state.problem.dev.count)]
    for t, o in enumerate(state.option):
        if o is not None and state.problem.options[t][o].scope == "device":
            for p in state.positions[t]:
                out[p].append((t, o))
    return out


def _swap_units(state: _State, device: int, limit: float, times: np.ndarray, partners: int = 32) -> bool:
    """Swap a unit of ``device`` with one of a less loaded device when both end below ``limit`` (units differ in
    what they load: lookups, ids, pooled bytes, so a swap can help where no single move does)."""
    problem = state.problem
    units = _device_units(state)
    mine = sorted(set(units[device]), key=lambda u: (-problem.unit_size_s(*u), u))
    for j in [int(k) for k in np.argsort(times, kind="stable")[:partners] if k != device]:
        theirs = sorted(set(units[j]), key=lambda u: (problem.unit_size_s(*u), u))
        for a in mine:
            for b in theirs:
                if a[0] == b[0] or a == b:
                    continue
                if _try_swap(state, a, device, b, j, [device, j], limit):
                    return True
    return False


def _try_swap(state: _State, a: tuple[int, int], pa: int, b: tuple[int, int], pb: int, touched: Sequence[int],
              limit: float) -> bool:
    """Exchange unit ``a`` (table, option) at position ``pa`` with unit ``b`` at ``pb``; keep it when every
    ``touched`` device ends below ``limit`` within memory, else undo it."""
    state.apply_unit(*a, pa, -1.0)
    state.apply_unit(*b, pb, -1.0)
    state.apply_unit(*a, pb, 1.0)
    state.apply_unit(*b, pa, 1.0)
    if state.times()[list(touched)].max() < limit and state.problem.fits(state.loads()):
        state.positions[a[0]].remove(pa)
        state.positions[a[0]].append(pb)
        state.positions[b[0]].remove(pb)
        state.positions[b[0]].append(pa)
        return True
    state.apply_unit(*b, pa, -1.0)
    state.apply_unit(*a, pb, -1.0)
    state.apply_unit(*b, pb, 1.0)
    state.apply_unit(*a, pa, 1.0)
    return False


def _swap_node_units(state: _State, device: int, limit: float, times: np.ndarray) -> bool:
    """Swap a node-wide (table-row-wise) unit of ``device``'s node with a smaller one of another node when every
    device of both nodes ends below ``limit``: a node-wide unit loads all devices of its node, so balancing the
    nodes often needs an exchange where no single move fits."""
    problem = state.problem
    nodes = problem.dev.nodes
    home = int(problem.dev.node_of[device])
    by_node: dict[int, list[int]] = {}
    for t, o in enumerate(state.option):
        if o is not None and problem.options[t][o].scope == "node":
            for k in state.positions[t]:
                by_node.setdefault(k, []).append(t)
    mine = sorted(by_node.get(home, []), key=lambda t: (-problem.unit_size_s(t, state.option[t]), t))
    others = sorted((k for k in by_node if k != home), key=lambda k: (float(times[list(nodes[k])].max()), k))
    for k in others:
        theirs = sorted(by_node[k], key=lambda t: (problem.unit_size_s(t, state.option[t]), t))
        for a in mine:
            for b in theirs:
                if a == b:
                    continue
                oa, ob = state.option[a], state.option[b]
                if problem.unit_size_s(b, ob) >= problem.unit_size_s(a, oa):
                    break  # theirs are sorted smallest first: no smaller unit left on this node
                if _try_swap(state, (a, oa), home, (b, ob), k, list(nodes[home]) + list(nodes[k]), limit):
                    return True
    return False


def _move_unit(state: _State, device: int, limit: float) -> bool:
    """Move one unit off ``device`` to where every touched device ends below ``limit``."""
    problem = state.problem
    for t in _tables_on(state, device, spread=False):  # a table on every device cannot move off one
        o = state.option[t]
        option = problem.options[t][o]
        p_old = device if option.scope == "device" else next(
            k for k in state.positions[t] if device in problem.dev.nodes[k])
        state.apply_unit(t, o, p_old, -1.0)
        if option.scope == "device":
            times, fits = state.candidate_times(t, o)
            fits[p_old] = False
            target = int(np.argmin(np.where(fits, times, np.inf)))
            ok = bool(fits[target]) and times[target] < limit
        else:
            stack = problem.unit_stack(t, o)
            tried = np.array([k != p_old for k in stack.positions])
            worst = state.unit_worst_times(t, o, tried)
            i = int(np.argmin(worst))  # the first of the least
            target, ok = stack.positions[i], worst[i] < limit
        if ok:
            state.apply_unit(t, o, target, 1.0)
            after = state.times()
            touched = problem.unit(t, o, target).devices
            if after[device] < limit and after[touched].max() < limit:
                state.positions[t].remove(p_old)
                state.positions[t].append(target)
                return True
            state.apply_unit(t, o, target, -1.0)
        state.apply_unit(t, o, p_old, 1.0)
    return False


def _reshard(state: _State, device: int, limit: float, spread: bool = True) -> bool:
    """Re-shard one table on ``device`` (not one spread over every device, unless ``spread``) with another option
    if the slowest device gets faster."""
    problem = state.problem
    before = state.makespan()
    for t in _tables_on(state, device, spread):
        old = state.remove_table(t)
        for o in range(len(problem.options[t])):
            if o == old[0]:
                continue
            if state.place_table(t, o):
                after = state.times()
                if after[device] < limit and float(after.max()) <= before and problem.fits(state.loads()):
                    return True
                state.remove_table(t)
        state.restore_table(t, old)
    return False


def state_of(problem: Problem, assignment: Assignment, work: Work) -> _State:
    state = _State.empty(problem, work)
    for t, (o, positions) in enumerate(assignment):
        state.restore_table(t, (o, list(positions)))
    return state


def _key(state: _State) -> tuple[float, float]:
    """What the rebuild minimizes: the slowest device, then the devices' total time (which lets it cross the
    plateaus where many devices share the maximum)."""
    times = state.times()
    return float(times.max()), float(times.sum())


def _insert_best(state: _State, t: int) -> bool:
    """Place table ``t`` with whichever option (greedily placed) gives the least key; False when none fits."""
    best = None
    for o in range(len(state.problem.options[t])):
        if state.place_table(t, o):
            key = _key(state)
            if best is None or key < best[0]:
                best = (key, o, list(state.positions[t]))
            state.remove_table(t)
    if best is None:
        return False
    state.restore_table(t, (best[1], best[2]))
    return True


def rebuild(problem: Problem, assignment: Assignment, work: Work, tables_per_round: int = 4,
            seed: int = 0) -> Assignment:
    """Ruin and recreate: take out a few tables (half from the slowest device, half drawn with a seeded
    generator), put each back with the option and places that give the least (slowest device, total time),
    keep the result when that pair is smaller, polish it with the local search, and repeat until ``work`` is
    spent. Single moves cannot leave a plan whose devices all sit at the maximum; re-choosing several tables
    at once can."""
    rng = np.random.default_rng(seed)
    state = state_of(problem, assignment, work)
    best = _key(state)
    count = len(problem.tables)
    while not work.done:
        worst = int(np.argmax(state.times()))
        on_worst = _tables_on(state, worst)
        picked = list(dict.fromkeys(
            [on_worst[int(i)] for i in rng.permutation(len(on_worst))[:tables_per_round // 2]]
            + [int(i) for i in rng.permutation(count)[:tables_per_round]]))[:tables_per_round]
        saved = {t: state.remove_table(t) for t in picked}
        order = sorted(picked, key=lambda t: (-problem.unit_size_s(t, saved[t][0]), t))
        placed = []
        for t in order:
            if not _insert_best(state, t):
                break
            placed.append(t)
        if len(placed) == len(order) and problem.fits(state.loads()) and _key(state) < best:
            state = local_search(state, max_rounds=_GROUP_POLISH_ROUNDS)
            best = _key(state)
            continue
        for t in placed:
            state.remove_table(t)
        for t in picked:
            state.restore_table(t, saved[t])
    return state.assignment()


def split_bottleneck(problem: Problem, assignment: Assignment, work: Work, tables_per_device: int = 3) -> Assignment:
    """Shard the slowest device's largest units more finely, one table at a time: take the table out, place it
    with an option whose unit alone is faster (more column shards, a node's or every device's rows), let the
    local search make room around the new units, and keep the plan when its slowest device got faster; repeat
    until no such change helps or ``work`` is spent.

    Where the slowest devices all carry a unit of one table (its column shards), no single move or swap lowers
    the maximum, and a finer option placed alone lands on devices that are already loaded; only the option
    change and the moves that follow it together do."""
    state = state_of(problem, assignment, work)
    best = state.makespan()
    tried: set[tuple[int, int]] = set()
    while not work.done:
        worst = int(np.argmax(state.times()))
        current = state.assignment()
        improved = False
        for t in _tables_on(state, worst, spread=False)[:tables_per_device]:
            o = state.option[t]
            alone = problem.unit_alone_s(t, o)
            finer = sorted((problem.unit_alone_s(t, k), k) for k in range(len(problem.options[t]))
                           if problem.unit_alone_s(t, k) < alone and (t, k) not in tried)
            for _, k in finer:
                tried.add((t, k))
                trial = state_of(problem, current, work)
                trial.remove_table(t)
                if not trial.place_table(t, k):
                    continue
                trial = local_search(trial, spread=False)
                value = trial.makespan()
                if value < best * (1 - 1e-9) and problem.fits(trial.loads()):
                    state, best, improved = trial, value, True
                    break
                if work.done:
                    break
            if improved or work.done:
                break
        if not improved:
            break
    return state.assignment()


def excess_s(problem: Problem, assignment: Assignment) -> dict[int, float]:
    """Per table with device-scope units, the all-to-all excess its units cause, in seconds summed over devices:
    a device that receives more ids than it sends (or sends more pooled outputs than it receives) pays the
    difference, which is split among its units in proportion to their ids (pooled bytes). Tables that cause
    none are left out."""
    loads = problem.evaluate(assignment)
    per_byte = problem.dev.a2a_s_per_byte
    ids_over, pool_over = problem.a2a_excess_bytes(loads)
    ids_share = per_byte * np.divide(ids_over, loads.ids_recv_bytes, out=np.zeros_like(ids_over),
                                     where=ids_over > 0)
    pool_share = 2.0 * per_byte * np.divide(pool_over, loads.pool_send_bytes, out=np.zeros_like(pool_over),
                                            where=pool_over > 0)
    out: dict[int, float] = {}
    for t, (o, positions) in enumerate(assignment):
        option = problem.options[t][o]
        if option.scope != "device":
            continue
        where = np.asarray(positions, dtype=np.int64)
        value = float(option.ids_recv_bytes * ids_share[where].sum()
                      + option.pool_send_bytes * pool_share[where].sum())
        if value > 0.0:
            out[t] = value
    return out


# reshard_excess gives each trial at most this share of its work for the local search that follows the change
# (so the work buys at least this many trials)
RESHARD_TRIALS = 16


def reshard_excess(problem: Problem, assignment: Assignment, work: Work) -> Assignment:
    """Re-shard the tables whose units pay all-to-all excess, one table at a time, most excess first: take the
    table out, place it with each other option (fewer column shards, a whole table, a node's rows, every
    device's rows...), polish the plan with a local search of at most 1 / RESHARD_TRIALS of the work left at the
    start (the tables spread over every device left out of its re-sharding, as in :func:`split_bottleneck`), and
    keep it when its slowest device got faster; after a change, the excess is measured again.

    Each column shard receives every id of its table, and a table-wise shard every id of the batch: where units
    receive more ids (send more pooled outputs) than their devices send (receive), those devices pay the
    difference on top of the all-to-all every device pays. Fewer or coarser units, or units spread over a node
    or all devices, cut that traffic; which one helps depends on where the rest goes, hence the polish."""
    state = state_of(problem, assignment, work)
    best = state.makespan()
    polish = work.left / RESHARD_TRIALS
    tried: set[tuple[int, int]] = set()
    while not work.done:
        excess = excess_s(problem, state.assignment())
        trials = [(t, k) for t in sorted(excess, key=lambda t: (-excess[t], t))
                  for k in range(len(problem.options[t])) if k != state.option[t] and (t, k) not in tried]
        improved = False
        for t, k in trials:
            tried.add((t, k))
            allotted = min(polish, work.left)
            trial = state.copy(Work(allotted))
            trial.remove_table(t)
            if trial.place_table(t, k):
                trial = local_search(trial, spread=False)
                value = trial.makespan()
                if value < best * (1 - 1e-9) and problem.fits(trial.loads()):
                    state, best, improved = trial, value, True
                    tried.clear()
            work.spend(allotted - max(trial.work.left, 0.0))
            if improved or work.done:
                break
        if not improved:
            break
    return state.assignment()


def heuristic(problem: Problem, weights: Sequence[Sequence[float]] | None, work: Work) -> Assignment | None:
    """Option choice, greedy placement, refinement and local search (local search straight after the greedy, and
    after the refinement; the better of the two)
    within ``work`` evaluations; None when no placement within memory was found."""
    prefs = preferences(problem, weights)
    start = _first_feasible(problem, prefs, work)
    if start is None:
        return None
    choice, state = start
    direct = local_search(greedy(problem, choice, work) or state)
    additive = greedy(problem, choice, work, "additive")
    additive = local_search(additive) if additive is not None else direct
    _, refined = refine(problem, choice, state)
    refined = local_search(refined)
    best = min((direct, additive, refined), key=lambda s: s.makespan())
    return best.assignment()


def guide_choice(problem: Problem, weights: Sequence[Sequence[float]]) -> list[int]:
    """A guide's option per table: its heaviest global option when the guide puts at least half of the table's
    weight on global options (data-parallel, row-wise), else its heaviest other option."""
    choice = []
    for options, row in zip(problem.options, weights):
        spread = [o for o, option in enumerate(options) if option.scope != "global"]
        wide = [o for o, option in enumerate(options) if option.scope == "global"]
        pool = wide if (sum(row[o] for o in wide) >= 0.5 and wide) or not spread else spread
        choice.append(max(pool, key=lambda o: (row[o], -o)))
    return choice


def _place_under(state: _State, t: int, o: int, target_s: float) -> bool:
    """Every unit of (t, o) placed best fit under ``target_s`` (on the position whose time ends highest at or
    below it, within memory); False, with nothing placed, when some unit fits nowhere under it."""
    problem = state.problem
    option = problem.options[t][o]
    placed: list[int] = []
    for _ in range(option.units):
        if option.scope == "device":
            times, fits = state.candidate_times(t, o)
            under = fits & (times <= target_s)
            p = int(np.argmax(np.where(under, times, -np.inf))) if under.any() else -1
        else:
            worst = state.unit_worst_times(t, o)
            under = np.flatnonzero(worst <= target_s)
            # the highest time at or below the target; of equal ones, the last position
            p = problem.unit_stack(t, o).positions[under[worst[under] == worst[under].max()][-1]] if len(under) else -1
        if p < 0:
            for k in placed:
                state.apply_unit(t, o, k, -1.0)
            state.positions[t] = []
            return False
        state.apply_unit(t, o, p, 1.0)
        state.positions[t].append(p)
        placed.append(p)
    return True


def _pack_at(problem: Problem, choice: Sequence[int], target_s: float, work: Work) -> tuple[_State | None, bool]:
    """One packing against ``target_s``: global units first, then the other tables, largest first, each best fit
    under the target with its option in ``choice`` or, failing that, the finer splits of the table (smaller units,
    least total size first); a table that fits under the target with none goes where it finishes earliest.
    Returns the state (None when some unit fits nowhere in memory) and whether every table fitted under."""
    state, pending = _with_global_units(problem, choice, work)
    pending.sort(key=lambda t: (-problem.unit_size_s(t, choice[t]) * problem.options[t][choice[t]].units, t))
    under = True
    for t in pending:
        first = choice[t]
        size = problem.unit_size_s(t, first)
        finer = [o for o, option in enumerate(problem.options[t])
                 if option.scope != "global" and problem.unit_size_s(t, o) < size]
        finer.sort(key=lambda o: (problem.unit_size_s(t, o) * problem.options[t][o].units, o))
        for o in [first] + finer:
            if o != state.option[t]:
                state.remove_table(t)
                state.choose(t, o)
            if _place_under(state, t, o, target_s):
                break
        else:
            under = False
            state.remove_table(t)
            if not state.place_table(t, first):
                return None, False
    return state, under and state.makespan() <= target_s


def target_pack(problem: Problem, choice: Sequence[int], lower_s: float, upper_s: float, work: Work,
                steps: int = 8) -> Assignment | None:
    """Option ``choice[t]`` per table packed against a target time, by bisection between ``lower_s`` (a lower bound)
    and ``upper_s`` (a plan to beat) in ``steps`` steps; the best plan of any step, after local search; None when
    no step placed every unit within memory.

    LPT (the greedy) puts each unit where the device finishes earliest, which spreads the first, largest units
    over empty devices and leaves no device room for a large unit later. Packing each device up to a target
    leaves whole devices free for what comes after, and where a table's units fit nowhere under the target it
    is split finer on the spot instead of overloading one device."""
    best: _State | None = None
    lo, hi = lower_s, upper_s
    for _ in range(steps):
        if work.done:
            break
        target = 0.5 * (lo + hi)
        state, under = _pack_at(problem, choice, target, work)
        if state is not None and (best is None or state.makespan() < best.makespan()):
            best = state
        if under:
            hi = target
        else:
            lo = target
    return local_search(best).assignment() if best is not None else None
