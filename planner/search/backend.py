"""What the search needs from a cost model, as one small interface (:class:`Backend`), and the algebra of
the lower bound its dynamic program minimises.

The cost model times a pipeline with an event simulation (1F1B order, point-to-point transfers) plus what
each stage's data-parallel synchronisation and optimizer step add after its last backward. That total does
not decompose over stages, so the partition DP minimises a lower bound on it that does, and every plan it
picks is re-timed by the cost model itself (``Backend.evaluate``).

The bound (a critical-path argument). Let stage k take f_k forward and b_k backward per micro-batch, c_k
to send to stage k+1, hold w_k = min(P - k - 1, m) warm-up micro-batches. Stage s cannot start the backward
of micro-batch 0 before that micro-batch went forward through stages >= s and back through stages > s; from
then it still runs m backwards and m - w_s - 1 forwards, and its last gradient must travel back to stage 0:

    pipeline >= sum_k (f_k + b_k) + 2 sum_{k<P-1} c_k + (m - 1) b_s + max(0, m - w_s - 1) f_s   for every s.

Stage 0 finishes its backward last, so its exposed synchronisation and optimizer step r_0 follow the
pipeline: T >= pipeline + r_0. Since r_0 depends on stage 0's segment alone it is added to S_0, so
T >= sum_k S_k + max_k G_k with

    S_k = f_k + b_k + 2 c_k (+ r_0 for k = 0; c_{P-1} = 0),  G_k = (m - 1) b_k + max(0, m - w_k - 1) f_k,

which is exact for identical stages (the textbook (m + P - 1)(f + b)) and is what
:func:`planner.search.partition.solve_partition` minimises. The interleaved schedule has a bound of the same
shape with other weights (:mod:`planner.search.interleave`); ``bound_matrices`` builds either.

The steady state hands micro-batches back and forth over each link. In 1F1B, stage k runs F_{w+i}, B_i
in turn and stage k+1 (warm-up w - 1 when w = w_k = P - k - 1 <= m) runs F_{w+i}, B_{i+1}; a forward needs
the previous stage's forward of the same micro-batch, a backward the next stage's backward, each one
transfer later. So B_i on k is followed by F_{w+i+1} on k, F_{w+i+1} and B_{i+2} on k+1, and B_{i+2} on k:
every two micro-batches, the chain passes 2 c_k + f_k + b_k + f_{k+1} + b_{k+1}. A chain through micro-batch
0's forward to the last stage and backward to k, n_k = floor((m - w) / 2) such cycles, stage k's remaining
work and the last micro-batch's way back to stage 0 gives T >= sum_k S_k + G'_k with

    G'_k = (m - 1 - 2n) b_k + max(0, m - 1 - w_k - 2n) f_k + n (2 c_k + f_k + b_k + f_{k+1} + b_{k+1}),

and the same chain entered at stage k+1 gives the terms for k+1 (with its own w). Left without the
neighbour's f + b, each is a G of one stage's segment (its link c_k read at its last layer, or the incoming
one at its first), so G_k takes the largest: over slow links (2 c > f + b) the steady state is bound by
the transfers, which the G above leaves to the fill alone. For two identical stages the full chain is
exactly what the event simulation of :mod:`planner.cost.schedule` gives.

Every stage's synchronisation counts, not only stage 0's. Stage k's last backward ends
d_k = sum_{i<k} (b_i / V + c_i) before stage 0's (V chunks per stage, V = 1 without interleaving), so
T >= pipeline + r_k - d_k for every k, and for weights w_k >= 0 summing to one

    T >= pipeline + sum_k w_k (r_k - d_k) = pipeline + sum_k (w_k r_k - W_k (b_k / V + c_k)),  W_k = sum_{i>k} w_i,

again a sum over stages. w = (1, 0, ..., 0) (``FIRST``) is the bound above; equal weights (``MEAN``) count
the mean of the stages' synchronisations, which binds when slow links make it longer than a micro-batch. The
subtraction needs b_k at least the cost model's, so ZeRO-3 (whose b_k here is a lower bound) leaves ``MEAN`` out.

The whole hand-off chain of a link, both neighbours' f + b in it, is not a G of one segment, but the mean of
the links' chains is a sum over stages: max over the chains >= their mean, so with H_k the chain of link k
entered at stage k (G'_k above, n_k = 0 where the link has no steady state, the chain then stage k's own)

    T >= sum_k S_k + theta max_k G_k + ((1 - theta) / (P - 1)) sum_{k<P-1} H_k + r_0   (0 <= theta <= 1),

each H_k split into its stage-k part and n_k (f_{k+1} + b_{k+1}) / V, both added to the S of their stage
(``HANDOFFS``, theta = 1/2: with theta = 0 a partition could lower the mean by giving one stage all the work).
Over slow links, where every link's chain binds and the stages are balanced, the mean is the largest. The
search takes the largest optimum of the weightings the settings allow (:data:`EXPOSURES`).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np

from planner.search.interleave import bound_coefficients, warmup
from planner.search.space import Layout, Settings, StageOption
from planner.types import Estimate, PipelineSpec

FIRST = "first"  # stage 0's synchronisation alone
MEAN = "mean"  # the stages' mean
HANDOFFS = "handoffs"  # stage 0's synchronisation, and the mean of the links' hand-off chains in place of G
EXPOSURES = (FIRST, MEAN, HANDOFFS)
# HANDOFFS: the weight of the largest G against the mean of the links' chains (any value in [0, 1] is a bound;
# half keeps a partition from lowering the mean by making one stage carry the work)
_LARGEST_G_SHARE = 0.5


@dataclass(frozen=True, eq=False)
class LayerTable:
    """Per-layer costs of one stage option under one settings, for ONE micro-batch on one replica."""

    forward_s: np.ndarray  # including tensor-parallel communication
    backward_s: np.ndarray  # including recompute and tensor-parallel communication
    params_per_rank: np.ndarray
    act_bytes: np.ndarray  # kept per micro-batch in flight
    peak_bytes: np.ndarray  # transient while the layer runs (a stage holds the largest once)
    output_bytes: np.ndarray  # boundary tensor handed to the next layer, per micro-batch


@runtime_checkable  # the Python API checks a backend it is given has these methods
class Backend(Protocol):
    """The cost model as the search sees it."""

    def layer_table(self, option: StageOption, settings: Settings) -> LayerTable: ...

    def static_bytes(self, params_per_rank: np.ndarray, option: StageOption, settings: Settings) -> np.ndarray:
        """A lower bound on a device's memory other than activations (weights, gradients, optimizer states
        under ZeRO over ``settings.dp``), element-wise, affine in the parameters."""
        ...

    def capacity_bytes(self, option: StageOption) -> float: ...

    def stage_bytes(self, params_per_rank: np.ndarray, act_bytes: np.ndarray, in_flight: float,
                    peak_bytes: np.ndarray, option: StageOption, settings: Settings) -> np.ndarray:
        """Memory per device of a stage whose layers sum to ``params_per_rank`` parameters and ``act_bytes``
        activations per micro-batch, with ``in_flight`` micro-batches held and a largest transient of
        ``peak_bytes`` (element-wise). Affine in each of the parameters, ``act_bytes * in_flight`` and the
        transient; a segment fits when this is at most ``capacity_bytes``."""
        ...

    def stage_matrices(self, layout: Layout, settings: Settings, global_batch: int, exposure: str = FIRST
                       ) -> tuple[np.ndarray, np.ndarray]:
        """(S, G) of the bound above with the ``exposure`` weighting, shape (P, L, L), S = inf where a segment
        does not fit in memory."""
        ...

    def send_floors(self, layout: Layout, settings: Settings) -> list[float]:
        """Per stage, the least time its send (to :func:`send_target`) takes over the layers it may end at
        (:func:`least_boundary`; 0 where it sends nothing): at most every ``p2p`` entry ``stage_matrices``
        reads, and cheap, for bounding a layout before its matrices are built."""
        ...

    def exposures(self, settings: Settings) -> tuple[str, ...]:
        """The weightings whose bounds hold for ``settings`` (each a lower bound; the search takes the larger)."""
        ...

    def evaluate(self, spec: PipelineSpec) -> Estimate:
        """The full cost-model estimate of an explicit plan."""
        ...


def prefix(values: np.ndarray) -> np.ndarray:
    """Cumulative sums with a leading zero: segment i..j sums to ``c[j + 1] - c[i]``."""
    return np.concatenate(([0.0], np.cumsum(values, dtype=np.float64)))


_BELOW: dict[int, np.ndarray] = {}


def _below_diagonal(n: int) -> np.ndarray:
    """Boolean mask of the entries i > j of an n x n matrix (memoised; read-only)."""
    mask = _BELOW.get(n)
    if mask is None:
        mask = np.tri(n, n, -1, dtype=bool)
        mask.setflags(write=False)
        _BELOW[n] = mask
    return mask


def segment_sums(values: np.ndarray) -> np.ndarray:
    """``S[i, j]`` = sum of values[i..j] for i <= j (upper triangle), NaN below the diagonal."""
    c = prefix(np.asarray(values, dtype=float))
    out = c[None, 1:] - c[:-1, None]
    out[_below_diagonal(len(values))] = np.nan
    return out


def segment_max(values: np.ndarray) -> np.ndarray:
    """``M[i, j]`` = max of values[i..j] for i <= j, NaN below the diagonal."""
    n = len(values)
    out = np.full((n, n), np.nan)
    for i in range(n):
        out[i, i:] = np.maximum.accumulate(np.asarray(values[i:], dtype=float))
    return out


@functools.lru_cache(maxsize=4096)
def warmups(num_stages: int, num_micro_batches: int, vpp: int = 1, all_forwards_at_pp: bool = True,
            ep_overlap: bool = False) -> tuple[int, ...]:
    """Every stage's warm-up (:func:`planner.search.interleave.warmup`); every layout's bound reads them."""
    return tuple(warmup(k, num_stages, num_micro_batches, vpp, all_forwards_at_pp, ep_overlap)
                 for k in range(num_stages))


def handoff_cycles(num_stages: int, num_micro_batches: int, vpp: int = 1, all_forwards_at_pp: bool = True,
                   ep_overlap: bool = False) -> list[tuple[int, int]]:
    """For the stages k and k + 1: (n_k, the backward operations each cycle spans) of the steady-state chain
    through both (module docstring). A cycle spans w_k - w_{k+1} + 1 operations (2 in 1F1B, 3 between
    interleaved stages), and n_k = floor((m V - w_k + d - 1) / (d + 1)) with d = w_k - w_{k+1}; none when stage
    k has no steady state (``all_forwards_at_pp``, ``ep_overlap``: :func:`planner.search.interleave.warmup`)."""
    return list(_handoff_cycles(num_stages, num_micro_batches, vpp, all_forwards_at_pp, ep_overlap))


@functools.lru_cache(maxsize=4096)
def _handoff_cycles(num_stages: int, num_micro_batches: int, vpp: int, all_forwards_at_pp: bool,
                    ep_overlap: bool = False) -> tuple[tuple[int, int], ...]:
    warm = warmups(num_stages, num_micro_batches, vpp, all_forwards_at_pp, ep_overlap)
    total = num_micro_batches * vpp
    out = []
    for k in range(num_stages - 1):
        w, d = warm[k], warm[k] - warm[k + 1]
        out.append(((total - w + d - 1) // (d + 1) if w < total and d >= 1 else 0, d + 1))
    return tuple(out)


def handoff_g(f: np.ndarray | float, b: np.ndarray | float, c: np.ndarray | float, m: int, vpp: int, warm: int,
              cycle: tuple[int, int]) -> np.ndarray | float:
    """A stage's G through n hand-off cycles of ``span`` operations with a neighbour over a link of c seconds
    (the neighbour's own forward and backward left out): with chunks of f / V and b / V,
    (m V - 1 - span n) b / V + max(0, m V - 1 - w - span n) f / V + n (2c + (f + b) / V)."""
    n, span = cycle
    total = m * vpp
    per_b = (total - 1 - span * n + n) / vpp
    per_f = (max(0, total - 1 - warm - span * n) + n) / vpp
    return per_b * b + per_f * f + 2.0 * n * c


def send_target(num_stages: int, vpp: int, k: int) -> int | None:
    """The stage that stage k sends its boundary to: the next, and the last stage back to stage 0 only between
    interleaved chunks (None: it sends nothing)."""
    return k + 1 if k + 1 < num_stages else (0 if vpp > 1 else None)


def least_boundary(output_bytes: np.ndarray, last: bool) -> float:
    """The least boundary a stage may send: over the layers it may end at (j <= L - 2), or the last layer's
    for the last stage (which always ends there)."""
    values = np.asarray(output_bytes, dtype=float)
    return float(values[-1] if last or len(values) == 1 else values[:-1].min())


def exposure_weights(exposure: str, num_stages: int) -> np.ndarray:
    """The weights w_k of the synchronisation term (module docstring) for ``exposure`` in :data:`EXPOSURES`."""
    if exposure in (FIRST, HANDOFFS):
        return np.eye(1, num_stages).ravel()
    return np.full(num_stages, 1.0 / num_stages)


@dataclass(frozen=True)
class StagePieces:
    """What every weighting of one layout's bound shares (:func:`stage_pieces`), per stage: S without the
    synchronisation and head-start terms, G with the hand-offs, the outgoing hand-off chain (None on the last
    stage), the cycles of the incoming chain (0 on stage 0), each stage's forward, backward and send, and the
    memory mask."""

    base_s: tuple[np.ndarray, ...]
    g: tuple[np.ndarray, ...]
    outgoing: tuple[np.ndarray | None, ...]
    incoming_cycles: tuple[int, ...]
    forward: tuple[np.ndarray, ...]
    backward: tuple[np.ndarray, ...]
    p2p: tuple[np.ndarray | None, ...]
    fits: tuple[np.ndarray, ...]
    vpp: int


def stage_pieces(forward: list[np.ndarray], backward: list[np.ndarray], p2p: list[np.ndarray | None],
                 fits: list[np.ndarray], num_micro_batches: int, vpp: int = 1, all_forwards_at_pp: bool = True,
                 ep_overlap: bool = False) -> StagePieces:
    """The parts of :func:`bound_matrices` that do not depend on the weighting, built once per layout."""
    P = len(forward)
    m = num_micro_batches
    co = bound_coefficients(P, m, vpp, all_forwards_at_pp, ep_overlap)
    cycles = _handoff_cycles(P, m, vpp, all_forwards_at_pp, ep_overlap)
    warm = warmups(P, m, vpp, all_forwards_at_pp, ep_overlap)
    base, gs, outs = [], [], []
    for k in range(P):
        f, b = forward[k], backward[k]
        s = f + co.backward_weight * b if vpp > 1 else f + b
        if p2p[k] is not None and co.hops[k] > 0:
            s = s + co.hops[k] * np.asarray(p2p[k])[None, :]
        g = co.gamma * b + co.delta[k] * f
        # the steady state's hand-offs with each neighbour (module docstring)
        outgoing = handoff_g(f, b, np.asarray(p2p[k])[None, :], m, vpp, warm[k], cycles[k]) if k + 1 < P else None
        if outgoing is not None and cycles[k][0] > 0:
            g = np.maximum(g, outgoing)
        if k > 0 and cycles[k - 1][0] > 0:
            incoming = np.concatenate(([0.0], np.asarray(p2p[k - 1])[:-1]))[:, None]  # sent after layer i - 1
            g = np.maximum(g, handoff_g(f, b, incoming, m, vpp, warm[k], cycles[k - 1]))
        base.append(s)
        gs.append(g)
        outs.append(outgoing)
    return StagePieces(tuple(base), tuple(gs), tuple(outs), (0, *(n for n, _ in cycles)), tuple(forward),
                       tuple(backward), tuple(p2p), tuple(fits), vpp)


def weighted_matrices(pieces: StagePieces, tails: list[np.ndarray | None], exposure: str = FIRST
                      ) -> tuple[np.ndarray, np.ndarray]:
    """(S, G) of one weighting (:data:`EXPOSURES`) from a layout's :class:`StagePieces` and the stages' tails
    (as :func:`bound_matrices`)."""
    P = len(pieces.base_s)
    L = pieces.base_s[0].shape[0]
    vpp = pieces.vpp
    w = exposure_weights(exposure, P)
    later = np.cumsum(w[::-1])[::-1] - w  # W_k = sum of the weights after k
    S = np.empty((P, L, L))
    G = np.empty((P, L, L))
    for k in range(P):
        s, g, b, p2p = pieces.base_s[k], pieces.g[k], pieces.backward[k], pieces.p2p[k]
        if w[k] > 0:
            s = s + w[k] * np.asarray(tails[k], dtype=float)
        if later[k] > 0:  # the head start of stage k + 1 and after: this stage's last backward and send
            s = s - later[k] * (b / vpp + (0.0 if p2p is None else np.asarray(p2p)[None, :]))
        if exposure == HANDOFFS and P > 1:  # this stage's parts of the mean of the links' chains
            share = (1.0 - _LARGEST_G_SHARE) / (P - 1)
            if pieces.outgoing[k] is not None:
                s = s + share * pieces.outgoing[k]
            if k > 0:
                s = s + share * pieces.incoming_cycles[k] * (pieces.forward[k] + b) / vpp
            g = _LARGEST_G_SHARE * g
        ok = pieces.fits[k] & np.isfinite(s)
        S[k] = np.where(ok, s, np.inf)
        G[k] = np.where(ok, g, np.inf)
    return S, G


def bound_matrices(forward: list[np.ndarray], backward: list[np.ndarray], p2p: list[np.ndarray | None],
                   fits: list[np.ndarray], tails: list[np.ndarray | None], num_micro_batches: int, vpp: int = 1,
                   exposure: str = FIRST, all_forwards_at_pp: bool = True, ep_overlap: bool = False
                   ) -> tuple[np.ndarray, np.ndarray]:
    """(S, G) from per-stage segment matrices: ``forward[k][i, j]``, ``backward[k][i, j]``, the send time
    ``p2p[k][j]`` after layer j (for the last stage: back to stage 0, used only between interleaved chunks;
    None = no transfer), ``fits[k][i, j]`` and ``tails[k][i, j]``, stage k's exposed synchronisation and
    optimizer step when it holds layers i..j (None where its weight is 0: with ``FIRST`` only stage 0's row
    0 is read). With ``vpp > 1`` the interleaved schedule's bound (:mod:`planner.search.interleave`), its
    warm-up the runtime's (``all_forwards_at_pp``; the default holds for either) and the settings'
    (``ep_overlap``: one more forward)."""
    pieces = stage_pieces(forward, backward, p2p, fits, num_micro_batches, vpp, all_forwards_at_pp, ep_overlap)
    return weighted_matrices(pieces, tails, exposure)
