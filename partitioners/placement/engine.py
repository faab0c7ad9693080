"""The placement engine: candidate strategies scored by the simulator, level 1 -> 2 -> 3.

One batch of a modern CNN or transformer has little parallelism, so spreading its
operators over every device that exists is usually slower than one device; the
wins are memory feasibility (a model that does not fit must be split) and
micro-batched execution (pipeline stages, or replicas that each take whole
micro-batches). No single partitioner is best across those regimes, so
``strategy="auto"`` builds the candidates that apply, scores every one with the
event-driven simulator (:mod:`partitioners.costmodel.simulator`), refines the best against
the simulated makespan, and returns the best feasible plan together with every
candidate's score, so a user sees why. A placement on fewer devices, down to
one, is a legitimate answer.

The engine is a pipeline of pure steps over one frozen
:class:`~partitioners.placement.context.PlacementContext`:

1. :func:`~partitioners.placement.context.placement_context` prepares the request
   (expansion, operator times, device order, device types);
2. the candidate strategies of :mod:`partitioners.placement.candidates` (single
   device, HEFT [1]_, METIS [2]_ with speed-proportional parts, pipeline splits
   [3]_ [4]_, hybrids of stages and replicas) each propose a placement;
3. :mod:`partitioners.placement.scoring` repairs each proposal (device types and,
   in pipeline mode, an acyclic stage order [5]_, :mod:`partitioners.placement.repairs`),
   simulates and ranks it;
4. the best is refined against the simulator (:mod:`partitioners.placement.refine`);
5. :mod:`partitioners.placement.final_plan` plans level-3 memory tiers
   (:mod:`partitioners.placement.memory_tiers`), re-times the schedule with them and
   gives the verdict;
6. :mod:`partitioners.placement.bounds` gives the plan its lower bound and optimality gap.

``strategy="exact"`` scores the candidates of ``auto``, then solves small graphs with
CP-SAT from the best of them (:mod:`partitioners.placement.exact`).

``<name>+refine`` names a refined candidate. In pipeline mode every candidate is
passed through acyclic repair on the forward edges, so the stage graph a pipeline
schedule sees is always acyclic (gradients flow back through the same stages, as
in GPipe and 1F1B).

Device types
------------
A node of the graph may name the device types it can run on (``device_types`` in
the graph JSON: a custom kernel that exists for one accelerator only, an op pinned
to the host). :func:`~partitioners.hardware.device_types.device_type_constraint` turns those lists into one allowed-
device row per distinct list; a list that matches no device of the inventory is
:class:`~partitioners.errors.InvalidInput`. Every candidate is built as it would be
without the lists, then every restricted operator on a device it may not use moves
to an allowed one (where most of its neighbours' bytes are, else the least loaded,
keeping operators that METIS put together together); HEFT only considers allowed
devices and refinement only proposes allowed moves. Across node groups METIS moves
restricted operators to a group that has their types before splitting each group
between its devices. Graphs without lists take none of these steps.

Determinism: no clocks and no global RNG; METIS gets ``seed``; ties break by
candidate order and device id. The same request gives the same plan.

References
----------
.. [1] H. Topcuoglu, S. Hariri, M.-Y. Wu, "Performance-Effective and
   Low-Complexity Task Scheduling for Heterogeneous Computing", IEEE TPDS 13(3),
   2002.
.. [2] G. Karypis, V. Kumar, "A Fast and High Quality Multilevel Scheme for
   Partitioning Irregular Graphs", SIAM J. Sci. Comput. 20(1), 1998.
.. [3] Y. Huang et al., "GPipe: Efficient Training of Giant Neural Networks using
   Pipeline Parallelism", NeurIPS 2019.
.. [4] D. Narayanan et al., "PipeDream: Generalized Pipeline Parallelism for DNN
   Training", SOSP 2019.
.. [5] J. Herrmann, M. Y. Özkaya, B. Uçar, K. Kaya, Ü. V. Çatalyürek, "Multilevel
   Algorithms for Acyclic Partitioning of Directed Acyclic Graphs", SIAM J. Sci.
   Comput. 41(4), 2019.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace

import numpy as np

from partitioners.costmodel.costs import CostModel
from partitioners.costmodel.simulator import SimulationResult
from partitioners.errors import InvalidInput
from partitioners.graph.hypergraph import Hypergraph
from partitioners.hardware.inventory import Inventory
from partitioners.placement.bounds import MEMORY_CUT_MAX_DEVICES, LowerBounds, lower_bounds, op_time_floors_s
from partitioners.placement.candidates import (
    HEFT_BUDGET_SCALE,
    Proposal,
    candidate_schedule,
    heft_tight,
    most_efficient_device,
    single_device,
)
from partitioners.placement.context import PlacementContext, placement_context
from partitioners.placement.exact import EXACT_MAX_OPS, ExactOutcome, exact_schedule
from partitioners.placement.final_plan import finish_placement
from partitioners.placement.fusion import FusionGroups, fuse_for_placement
from partitioners.placement.options import ENERGY_OBJECTIVES, MODES, OBJECTIVES, STRATEGIES, PlacementOptions
from partitioners.placement.refine import refine_placement
from partitioners.placement.result import Candidate, PlacementResult, TransferPlan
from partitioners.placement.scoring import (
    ScoredCandidate,
    best_candidate,
    least_over_budget,
    ranking_key,
    score_proposal,
    score_single_analytic,
)

__all__ = [
    "OBJECTIVES",
    "MODES",
    "STRATEGIES",
    "PlacementOptions",
    "Candidate",
    "TransferPlan",
    "PlacementResult",
    "place",
    "evaluate_placement",
    "simulation_budget",
]

#: Above this many operators ``auto`` scores the one-device plan analytically.
ANALYTIC_SINGLE_OPS = 6_000
#: Simulations kept for refinement when ``auto`` chooses which extra candidates to score.
REFINE_RESERVE = 2
#: When no candidate fits, HEFT runs again with its memory budget scaled by this much
#: below the share its overshoot implies.
TIGHT_HEFT_MARGIN = 0.95


def simulation_budget(n_ops: int) -> int:
    """How many full simulations a plan may spend, from the graph size alone.

    No clocks in ``partitioners`` (determinism), so the planning-time targets
    (about 1 s at 10^4 operators, 5 s at 10^5, 60 s at 10^6 on two cores) become a
    simulation count: one simulation costs a few microseconds per operator, and
    HEFT plus the level-3 plan take about as long as two more.
    """
    for limit, sims in ((1_000, 40), (3_000, 20), (6_000, 10), (15_000, 6), (60_000, 5), (300_000, 4)):
        if n_ops <= limit:
            return sims
    return 3


def _simulations_left(ctx: PlacementContext, scored: Sequence[ScoredCandidate]) -> int:
    """The simulation budget less the simulations ``scored`` spent (analytic scores spend none)."""
    return simulation_budget(ctx.n_ops) - sum(1 for s in scored if s.simulated)


def _check_strategy_applies(strategy: str, n_devices: int, micro_batches: int) -> None:
    """A strategy asked for by name must have something to build: every one but ``single``
    spreads operators over devices, and ``hybrid`` replicates stages over micro-batches."""
    if strategy not in ("auto", "single", "exact") and n_devices == 1:
        raise InvalidInput(
            f"strategy '{strategy}' spreads operators over several devices and this request offers one "
            "(max_devices or the inventory); ask for 'single' or 'auto'",
            field="options.strategy",
            code="strategy-not-applicable",
        )
    if strategy == "hybrid" and micro_batches == 1:
        raise InvalidInput(
            "strategy 'hybrid' replicates pipeline stages across micro-batches and needs micro_batches > 1; "
            "ask for 'pipeline', or for 'auto'",
            field="options.strategy",
            code="strategy-not-applicable",
        )


def _score_single(ctx: PlacementContext) -> ScoredCandidate:
    """The one-device plan, scored analytically on large graphs where its memory verdict is clear-cut."""
    proposal = single_device(ctx)
    on_one_device = ctx.constraint is None or bool((proposal.placement == proposal.placement[0]).all())
    if (
        ctx.n_ops > ANALYTIC_SINGLE_OPS
        and ctx.options.strategy == "auto"
        and ctx.devices.shape[0] > 1
        and on_one_device
    ):
        analytic = score_single_analytic(ctx, proposal)
        if analytic is not None:
            return analytic
    return score_proposal(ctx, proposal)


def _score_candidates(ctx: PlacementContext, on_progress: Callable[[float], None]) -> list[ScoredCandidate]:
    """Score the applicable candidates: one of each family always, more while the budget lasts."""
    want = ctx.options.strategy
    k_max = int(ctx.devices.shape[0])
    _check_strategy_applies(want, k_max, ctx.micro_batches)
    scored: list[ScoredCandidate] = []
    if want in ("auto", "single"):
        scored.append(_score_single(ctx))
        if ctx.options.objective in ENERGY_OBJECTIVES:
            efficient = most_efficient_device(ctx)
            if efficient is not None:
                scored.append(score_proposal(ctx, efficient))
    if k_max == 1:
        return scored
    schedule = candidate_schedule(ctx, low_memory=bool(scored) and not scored[0].feasible)
    reserve = REFINE_RESERVE if want == "auto" else 0
    n_planned = max(1, len(schedule.essential) + len(schedule.extra))
    for done, build in enumerate(schedule.essential, start=1):
        scored.append(score_proposal(ctx, build(ctx)))
        on_progress(0.8 * done / n_planned)
    if want in ("auto", "heft") and not any(s.feasible for s in scored):
        # memory-bound: HEFT again with the budget it overran scaled down
        over = [s.candidate for s in scored if s.strategy == "heft-contention"]
        if over and over[0].peak_memory_fraction > 1.0:
            scale = HEFT_BUDGET_SCALE / over[0].peak_memory_fraction * TIGHT_HEFT_MARGIN
            scored.append(score_proposal(ctx, heft_tight(ctx, scale)))
    for done, build in enumerate(schedule.extra, start=len(schedule.essential) + 1):
        if _simulations_left(ctx, scored) <= reserve:
            break
        scored.append(score_proposal(ctx, build(ctx)))
        on_progress(0.8 * done / n_planned)
    return scored


def _score_exact(ctx: PlacementContext) -> tuple[list[ScoredCandidate], ExactOutcome]:
    """``strategy="exact"``: every candidate ``auto`` scores, then CP-SAT from the best of them.

    The solver's plan is scored like every candidate and the best wins: the solver
    starts from the heuristic winner and keeps it unless it finds better, and the
    simulator can still rank a heuristic first where link contention, which the
    model leaves out, bites. The main-memory lower bound (the model's operator times)
    goes to the model.
    """
    if ctx.n_ops > EXACT_MAX_OPS:
        raise InvalidInput(
            f"strategy 'exact' solves graphs of up to {EXACT_MAX_OPS} operators (after training and micro-batch "
            f"expansion) and this one has {ctx.n_ops}; ask for 'auto'",
            field="options.strategy",
            code="strategy-not-applicable",
        )
    auto = replace(ctx, options=replace(ctx.options, strategy="auto"))
    scored = _score_candidates(auto, lambda fraction: None)
    best = best_candidate(scored, ctx.options.pipeline)
    refined = _refined(auto, scored, best)
    if refined is not None:
        scored.append(refined)
    hint = scored[best_candidate(scored, ctx.options.pipeline)]
    if hint.simulation is None:
        hint = score_proposal(ctx, Proposal(hint.strategy, hint.placement, hint.priority))
    assert hint.simulation is not None
    outcome = exact_schedule(
        ctx,
        hint.placement,
        hint.simulation.op_start_s,
        hint.simulation.makespan_s,
        time_limit_s=ctx.options.time_limit_s,
        seed=ctx.options.seed,
        lower_bound_s=_bounds_of(ctx, hint.placement, feasible=hint.feasible, tiers=False).lower_bound_s,
    )
    note = f"CP-SAT {outcome.status}, model makespan {outcome.objective_s:.6g} s, proven bound {outcome.bound_s:.6g} s"
    # the simulator list-schedules: the solver's start order, or critical-path order, whichever runs faster
    orders = [
        score_proposal(ctx, Proposal("exact", outcome.placement, outcome.priority, f"{note}; solver's order")),
        score_proposal(ctx, Proposal("exact", outcome.placement, None, f"{note}; critical-path order")),
    ]
    scored.append(orders[best_candidate(orders, ctx.options.pipeline)])
    return scored, outcome


def _bounds_of(ctx: PlacementContext, placement: np.ndarray, *, feasible: bool, tiers: bool = True) -> LowerBounds:
    """The bounds of :mod:`partitioners.placement.bounds` for a plan of ``ctx`` that uses ``placement``'s devices
    (``tiers=False``: operators in main memory, as candidates are scored and the exact model times them)."""
    devices = np.union1d(ctx.devices, np.unique(placement)).astype(np.int64)
    c = ctx.constraint
    return lower_bounds(
        ctx.simulation,
        devices,
        memory_budget_bytes=ctx.memory_budget_bytes,
        op_allowed_set=None if c is None else c.op_allowed_set,
        allowed_devices=None if c is None else c.allowed,
        feasible=feasible,
        link_tables=ctx.link_tables if ctx.inventory.n_devices <= MEMORY_CUT_MAX_DEVICES else None,
        tiers=tiers,
    )


def _with_bounds(ctx: PlacementContext, result: PlacementResult, exact: ExactOutcome | None) -> PlacementResult:
    """``result`` with its lower bounds (:mod:`partitioners.placement.bounds`) and the exact solver's outcome.

    The devices a plan may use are the usable ones and any the placement uses (a
    re-plan's given placement may use others). The solver's proven bound counts only
    where it bounds the simulated makespan: a feasible plan (the model keeps
    parameters within budget) on an inventory whose faster memory tiers speed no
    operator up (the model times operators in main memory).
    """
    bounds = _bounds_of(ctx, result.placement, feasible=result.feasible)
    if exact is not None and exact.status in ("optimal", "feasible") and result.feasible:
        floors = op_time_floors_s(ctx.graph, ctx.inventory, ctx.cost_model, ctx.devices)
        if bool(np.all(floors >= ctx.op_times_s[:, ctx.devices])):
            bounds = bounds.with_bound("exact", exact.bound_s)
    return replace(result, bounds=bounds, exact=exact)


def _refined(ctx: PlacementContext, scored: Sequence[ScoredCandidate], best: int) -> ScoredCandidate | None:
    """Spend the simulations left on refining ``scored[best]`` against the simulator.

    Returns the refined candidate when it ranks better than ``scored[best]``, else ``None``.
    """
    sims_left = _simulations_left(ctx, scored)
    if ctx.options.strategy != "auto" or sims_left < 2 or ctx.devices.shape[0] <= 1:
        return None
    chosen = scored[best]
    cand = chosen.candidate
    if chosen.simulation is None or (cand.devices_used <= 1 and cand.feasible):
        return None
    name = f"{cand.strategy}+refine"
    pipeline = ctx.options.pipeline
    least_over = least_over_budget([s.candidate for s in scored], pipeline)

    def key(c: Candidate) -> tuple[object, ...]:
        return ranking_key(c, -1, least_over=least_over, pipeline=pipeline)[:-1]

    def score(placement: np.ndarray) -> tuple[tuple[object, ...], SimulationResult]:
        trial = score_proposal(ctx, Proposal(name, placement, chosen.priority))
        assert trial.simulation is not None
        return key(trial.candidate), trial.simulation

    c = ctx.constraint
    outcome = refine_placement(
        ctx.graph,
        chosen.placement,
        chosen.simulation,
        ctx.op_times_s,
        devices=ctx.devices,
        score=score,
        base_key=key(cand),
        max_steps=sims_left,
        levels=ctx.levels,
        op_micro_batch=ctx.expanded.op_micro_batch if ctx.micro_batches > 1 else None,
        op_allowed_set=None if c is None else c.op_allowed_set,
        allowed_devices=None if c is None else c.allowed,
    )
    if outcome.accepted == 0:
        return None
    note = f"{outcome.accepted} of {outcome.tried} moves kept"
    refined = score_proposal(ctx, Proposal(name, outcome.placement, chosen.priority, note))
    return refined if key(refined.candidate) < key(cand) else None


def place(
    graph: Hypergraph,
    inventory: Inventory,
    options: PlacementOptions | None = None,
    *,
    cost_model: CostModel | None = None,
    on_progress: Callable[[float], None] | None = None,
) -> PlacementResult:
    """Place every operator of ``graph`` on a device of ``inventory`` and plan its memory.

    Parameters
    ----------
    graph : Hypergraph
        Forward graph of one micro-batch.
    inventory : Inventory
    options : PlacementOptions, optional
    cost_model : CostModel, optional
        Operator and link costs (defaults to ``CostModel()``).
    on_progress : callable, optional
        Called with the fraction of the work done (0..1) after each scored
        candidate, so a job runner can report progress; it must not raise.

    Returns
    -------
    PlacementResult

    Raises
    ------
    InvalidInput
        Bad options or an empty graph.
    DoesNotFit
        No candidate fits in memory (unless ``options.allow_infeasible``); the
        message names the device, the bytes over its budget and the changes that
        could make a plan fit.
    Infeasible
        In pipeline mode, no acyclic stage order was found.

    References
    ----------
    G. Karypis, V. Kumar, SIAM J. Sci. Comput. 20(1), 1998 (METIS); H. Topcuoglu et
    al., IEEE TPDS 13(3), 2002 (HEFT); Y. Huang et al., NeurIPS 2019 (GPipe);
    D. Narayanan et al., SOSP 2019 (PipeDream); J. Herrmann et al., SIAM J. Sci.
    Comput. 41(4), 2019 (acyclic partitioning).
    """
    options = options or PlacementOptions()
    return _place(*fuse_for_placement(graph, options.fusion), inventory, options, cost_model, on_progress)


def _place(
    graph: Hypergraph,
    fusion: FusionGroups | None,
    inventory: Inventory,
    options: PlacementOptions,
    cost_model: CostModel | None,
    on_progress: Callable[[float], None] | None,
) -> PlacementResult:
    """:func:`place` on a graph already fused (``fusion``: its groups, ``None`` unfused)."""
    ctx = placement_context(graph, inventory, options, cost_model)
    exact: ExactOutcome | None = None
    if options.strategy == "exact":
        scored, exact = _score_exact(ctx)
    else:
        scored = _score_candidates(ctx, on_progress or (lambda fraction: None))
    best = best_candidate(scored, options.pipeline)
    refined = _refined(ctx, scored, best)
    if refined is not None:
        scored.append(refined)
        best = len(scored) - 1
    if on_progress is not None:
        on_progress(0.9)
    analytic = not scored[best].simulated
    result = finish_placement(ctx, scored, best, raise_infeasible=not (options.allow_infeasible or analytic))
    if not result.feasible and analytic:
        # the analytic one-device estimate was too optimistic about memory: take the next best
        over = replace(scored[best].candidate, feasible=False, note="over memory when simulated")
        scored[best] = replace(scored[best], candidate=over)
        result = finish_placement(
            ctx, scored, best_candidate(scored, options.pipeline), raise_infeasible=not options.allow_infeasible
        )
    return replace(_with_bounds(ctx, result, exact), fusion=fusion)


def evaluate_placement(
    graph: Hypergraph,
    inventory: Inventory,
    placement: np.ndarray,
    options: PlacementOptions | None = None,
    *,
    cost_model: CostModel | None = None,
    name: str = "given",
) -> PlacementResult:
    """Finish a given placement the way :func:`place` finishes its winner.

    ``placement`` assigns every operator of the *expanded* graph (training and
    micro-batch expansion of ``graph`` per ``options``) to a device. It is scored as
    the only candidate, then gets level-3 tiers, the final simulation, its
    transfers and its feasibility verdict. Re-planning uses this to price "keep the
    old placement" and minimal-movement variants with the same rules as new plans.

    Raises
    ------
    InvalidInput
        ``placement`` does not have one device per expanded operator.
    Infeasible
        The placement does not fit in memory (unless ``options.allow_infeasible``).
    """
    options = options or PlacementOptions()
    fused, fusion = fuse_for_placement(graph, options.fusion)
    ctx = placement_context(fused, inventory, options, cost_model)
    placement = np.asarray(placement, dtype=np.int64)
    if placement.shape != (ctx.n_ops,):
        raise InvalidInput("the placement needs one device per operator of the expanded graph", field="placement")
    scored = [score_proposal(ctx, Proposal(name, placement))]
    return replace(
        _with_bounds(ctx, finish_placement(ctx, scored, 0, raise_infeasible=not options.allow_infeasible), None),
        fusion=fusion,
    )
