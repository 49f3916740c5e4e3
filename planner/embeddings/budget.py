"""The sharding search's work budget for one problem, per stage, sized from the problem.

One unit of work is one *evaluation*: computing every device's time under the cost model once (heuristic.Work's
unit, a few numpy operations over the devices). The default budget is DEFAULT_EVALUATIONS of them;
``SolverOptions.work`` multiplies it. Each stage gets a fixed share and turns it into its own counter by what
one of its steps costs in evaluations:

- a HiGHS interrupt check of a MILP is about one re-solve of the model's LP relaxation, whose cost grows with
  the model: CHECK_EVALUATIONS_PER_VARIABLE evaluations per variable of a per-device model (the exact and the
  node MILP, sized before they are built), CLASS_CHECK_EVALUATIONS_PER_ROW per constraint of a model over
  classes of devices (sized from its LP relaxation, solved first);
- a simplex iteration of a large-neighbourhood sub-MILP costs neighbourhood.ITERATION_EVALUATIONS_PER_ROW
  evaluations per row of the sub-MILP (the search charges its solves so);
- a unit of the option search by kind (patterns.py) is 1 / patterns.EVALUATION_WORK evaluations;
- a simplex iteration of the class LP while branching on its choices costs
  branching.LP_ITERATION_EVALUATIONS_PER_ROW evaluations per row of the LP.

So the counts shrink as tables x devices grow. What they do not cover grows with the problem: the class LP
relaxation (solved whatever the budget), a greedy pass that must finish once started, and HiGHS's root node,
whose time per interrupt check varies more than tenfold between models of one size; so sets of thousands of
tables, or hundreds on hundreds of devices, take longer than small ones (benchmarks/embedding_generated.py
measures it; the ratios above were measured with its cases on a 2-core x86 machine, see
benchmarks/results/embeddings.md).
The packing against a target (heuristic.target_pack) draws on the placement share again. Every count is a
count, never seconds: the same problem and options give the same plan on any machine.
"""

from __future__ import annotations

from dataclasses import dataclass

from planner.embeddings.neighbourhood import LnsSettings
from planner.embeddings.patterns import EVALUATION_WORK, ChoiceSettings, PatternSettings
from planner.solver import SolverOptions

DEFAULT_EVALUATIONS = 250_000
# What one step of a stage costs in evaluations (see the module docstring).
CHECK_EVALUATIONS_PER_VARIABLE = 1.0
CLASS_CHECK_EVALUATIONS_PER_ROW = 0.2
# Shares of the budget: the bound (the class MILP and the MILPs that only make guides), the placement (greedy +
# local search from each guide, then ruin and recreate), the improvement (neighbourhood or option search, the
# node MILP) and the exact per-device MILP, or where that model is too large to start, finer shards for the
# slowest device's units (heuristic.split_bottleneck) and, with what they leave, other options for the tables
# whose units pay all-to-all excess (heuristic.reshard_excess).
BOUND_SHARE = 0.25
GUIDE_SHARE = 0.10
PLACEMENT_SHARE = 0.15
REBUILD_SHARE = 0.10
IMPROVEMENT_SHARE = 0.20
NODE_MILP_SHARE = 0.05
EXACT_SHARE = 0.15
# On top of those (which sum to 1): branching on option choices over the class LP once the plan is final
# (branching.py), which only lifts the bound.
BRANCH_SHARE = 0.40
# The large-neighbourhood search frees at most one unit per round for this many evaluations of its budget.
EVALUATIONS_PER_FREED_UNIT = 250.0
# A MILP is worth starting only with this many checks (its root and a few nodes); fewer, and it is skipped.
MIN_USEFUL_CHECKS = 20
# Past this multiple of the default, more work for the stages above stops paying (their descents end first);
# the rest of a larger budget goes to the bound from device patterns, PRICING_PER_WORK pricing solves per
# default budget's worth.
STAGE_WORK_CAP = 6.0
PRICING_PER_WORK = 100
# The large-neighbourhood search suits clusters up to this many devices: a neighbourhood holds at most 12
# devices, so past it a round re-places a small part of the plan, and the option search by kind (which judges
# whole kinds of tables on the whole cluster) takes its place.
NEIGHBOURHOOD_MAX_DEVICES = 32
# The node MILP (nodes as bins) runs on clusters of at most this many nodes: a model per node grows with the
# nodes, and past a few its bound is rarely better than the class MILP's.
NODE_MILP_MAX_NODES = 4
# The deep stage's placements by device configurations: more configurations and checks than the option search's
# trial changes, since it places a few choices, not thousands.
DEEP_PATTERNS = PatternSettings(configurations=100_000, checks=30, steps=4)


@dataclass(frozen=True)
class Budget:
    """Work of each stage for one problem (see the module docstring); ``stage_work`` is the multiple of the
    default the stages run at, ``seed`` the seed of their random choices."""

    stage_work: float
    seed: int
    evaluations: float  # the stages' total, in evaluations
    pricing_solves: int  # the deep stage's (the bound from device patterns); 0: it does not run

    def _share(self, share: float) -> float:
        return share * self.evaluations

    def checks(self, share: float, size: int, per_size: float = CHECK_EVALUATIONS_PER_VARIABLE) -> int:
        """HiGHS interrupt checks for a MILP of ``size`` variables (or rows), each check ``per_size`` evaluations
        per variable (row), given ``share`` of the budget; 0 when too few to be useful (MIN_USEFUL_CHECKS)."""
        checks = int(self._share(share) / (per_size * max(size, 1)))
        return checks if checks >= MIN_USEFUL_CHECKS else 0

    def bound_checks(self, rows: int) -> int:
        """The class MILP's (``rows`` constraints); 0: the budget does not cover it (the LP's bound stands)."""
        return self.checks(BOUND_SHARE, rows, CLASS_CHECK_EVALUATIONS_PER_ROW)

    def guide_checks(self, rows: int, guides: int) -> int:
        """Each class MILP that only makes a guide (``rows`` constraints): an equal part of the guides' share;
        0: the budget does not cover it."""
        return self.checks(GUIDE_SHARE / max(guides, 1), rows, CLASS_CHECK_EVALUATIONS_PER_ROW)

    def node_checks(self, variables: int) -> int:
        return self.checks(NODE_MILP_SHARE, variables)

    def exact_checks(self, variables: int) -> int:
        return self.checks(EXACT_SHARE, variables)

    def split_evaluations(self) -> float:
        """Finer shards for the slowest device's units, then other options for the tables whose units pay
        all-to-all excess, where the exact MILP does not start: its share."""
        return self._share(EXACT_SHARE)

    def placement_evaluations(self, guides: int) -> float:
        """Per guide: the greedy + local search from one guide's option choice."""
        return self._share(PLACEMENT_SHARE) / max(guides, 1)

    def rebuild_evaluations(self) -> float:
        return self._share(REBUILD_SHARE)

    def branch_evaluations(self) -> float:
        return self._share(BRANCH_SHARE)

    def neighbourhood(self) -> LnsSettings:
        """The large-neighbourhood search: the improvement share, and at most one unit freed per round for every
        EVALUATIONS_PER_FREED_UNIT of it (a round's sub-MILP grows with the units it re-places)."""
        evaluations = self._share(IMPROVEMENT_SHARE)
        units = int(min(max(evaluations / EVALUATIONS_PER_FREED_UNIT, 1), LnsSettings.units))
        return LnsSettings(work=evaluations, units=units, seed=self.seed)

    def choice(self) -> ChoiceSettings:
        """The option search by kind, in its own units."""
        return ChoiceSettings(work=self._share(IMPROVEMENT_SHARE) * EVALUATION_WORK, seed=self.seed)

    def deep_choice(self) -> ChoiceSettings:
        """The deep stage's option search: the whole default improvement share, more configurations per trial, and
        no kicks (it starts from a plan the default's search already descended from)."""
        return ChoiceSettings(work=STAGE_WORK_CAP * self._share(IMPROVEMENT_SHARE) * EVALUATION_WORK,
                              start=DEEP_PATTERNS, pattern=PatternSettings(configurations=100_000, checks=60),
                              kicks=0, seed=self.seed)


def budget(options: SolverOptions, stage_work: float | None = None) -> Budget:
    """The budget of ``options``; ``stage_work`` overrides the stages' multiple of the default (the deep stage's
    pricing solves still follow ``options.work``)."""
    work = min(options.work, STAGE_WORK_CAP) if stage_work is None else stage_work
    pricing = int(PRICING_PER_WORK * (options.work - STAGE_WORK_CAP))
    return Budget(stage_work=work, seed=options.seed, evaluations=DEFAULT_EVALUATIONS * work,
                  pricing_solves=max(pricing, 0))
