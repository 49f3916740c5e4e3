"""The layer-partition problem of :mod:`planner.search.partition` as an integer program (pulp; HiGHS when
installed, CBC otherwise), to cross-check the DP in tests/test_search_partition.py.

Variables
  y[k, i, j] in {0, 1}: stage k holds layers i..j (only segments that fit: S finite)
  z >= 0: the bottleneck term max_k G_k
Objective
  minimise  sum_{k,i,j} S[k, i, j] y[k, i, j] + z
Constraints
  (a) every stage holds one segment:            sum_{i,j} y[k, i, j] = 1
  (b) stage 0 starts at layer 0, the last stage ends at layer L-1
  (c) contiguity: stage k+1 starts right after stage k ends:
      sum_i y[k, i, j] = sum_j' y[k+1, j+1, j']   for every k < P-1 and layer j
  (d) bottleneck: z >= sum_{i,j} G[k, i, j] y[k, i, j]   for every k
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from planner.errors import PlannerError


@dataclass(frozen=True)
class IlpPartition:
    last_layers: tuple[int, ...]
    objective: float
    proven: bool  # the solver reported optimality
    solver: str


def _solver(time_limit_s: float | None):
    try:
        import pulp
    except ImportError as exc:  # pulp is a runtime dependency; say what to install if it is missing
        raise PlannerError("the integer-programming cross-check needs pulp: pip install pulp") from exc
    available = set(pulp.listSolvers(onlyAvailable=True))
    if "HiGHS" in available:
        return pulp, pulp.HiGHS(msg=False, timeLimit=time_limit_s), "HiGHS"
    return pulp, pulp.PULP_CBC_CMD(msg=False, timeLimit=time_limit_s), "CBC"


def solve_partition_ilp(S: np.ndarray, G: np.ndarray, time_limit_s: float | None = None) -> IlpPartition | None:
    """The optimal partition minimising sum S + max G (None when no partition fits)."""
    pulp, solver, name = _solver(time_limit_s)
    P, L, _ = S.shape
    if P > L:
        return None
    prob = pulp.LpProblem("layer_partition", pulp.LpMinimize)

    def variable(name: str, **kw):  # pulp >= 3.3 owns variables by problem; older versions construct them
        add = getattr(prob, "add_variable", None)
        return add(name, **kw) if add is not None else pulp.LpVariable(name, **kw)

    y = {(k, i, j): variable(f"y_{k}_{i}_{j}", cat="Binary")
         for k in range(P) for i in range(L) for j in range(i, L) if np.isfinite(S[k, i, j])}
    scale = float(max(1.0, max(abs(S[key]) for key in y) if y else 1.0))
    z = variable("z", lowBound=0)
    prob += pulp.lpSum(float(S[key]) / scale * var for key, var in y.items()) + z
    for k in range(P):  # (a)
        prob += pulp.lpSum(var for (kk, _, _), var in y.items() if kk == k) == 1
    prob += pulp.lpSum(var for (k, i, _), var in y.items() if k == 0 and i != 0) == 0  # (b)
    prob += pulp.lpSum(var for (k, _, j), var in y.items() if k == P - 1 and j != L - 1) == 0
    for k in range(P - 1):  # (c)
        for j in range(L - 1):
            prob += (pulp.lpSum(var for (kk, _, jj), var in y.items() if kk == k and jj == j)
                     == pulp.lpSum(var for (kk, ii, _), var in y.items() if kk == k + 1 and ii == j + 1))
        prob += pulp.lpSum(var for (kk, _, jj), var in y.items() if kk == k and jj == L - 1) == 0
    for k in range(P):  # (d)
        prob += z >= pulp.lpSum(float(G[key]) / scale * var for key, var in y.items() if key[0] == k)
    status = prob.solve(solver)
    if pulp.LpStatus[status] in ("Infeasible", "Undefined") or pulp.LpStatus[prob.status] == "Infeasible":
        return None
    chosen = sorted((k, j) for (k, i, j), var in y.items() if (var.value() or 0) > 0.5)
    if len(chosen) != P:
        return None
    last = tuple(j for _, j in chosen)
    objective = sum(float(S[k, i, j]) for (k, i, j), var in y.items() if (var.value() or 0) > 0.5)
    objective += max(float(G[k, i, j]) for (k, i, j), var in y.items() if (var.value() or 0) > 0.5)
    return IlpPartition(last_layers=last, objective=objective, proven=pulp.LpStatus[prob.status] == "Optimal",
                        solver=name)
