"""From the chosen candidate to a :class:`PlacementResult`: level-3 memory tiers, final timing, verdict.

Level 3 (:mod:`partitioners.placement.memory_tiers`) plans every tensor of the
chosen schedule into a memory tier with byte offsets; operators whose tensors
landed in a faster tier are re-timed with that tier's bandwidth and the plan is
simulated once more with the same operator order. Faster operators change tensor
lifetimes, so the tiers are re-planned on the re-timed schedule until they are
the ones that timed it. Where that does not pay or does not settle, the scored
main-memory schedule stands. The verdict then says whether every used device
stays within its budget (and, in pipeline mode, whether the stage order is
acyclic); an infeasible plan raises unless the caller allows it.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from partitioners.costmodel.costs import CostModel, cost_sources
from partitioners.costmodel.simulator import SimulationResult, critical_path_priority, simulate
from partitioners.errors import DoesNotFit, Infeasible
from partitioners.graph.hypergraph import Hypergraph
from partitioners.hardware.device_types import op_working_set_bytes
from partitioners.hardware.inventory import Inventory
from partitioners.placement.context import PlacementContext, format_bytes
from partitioners.placement.fit_hints import fit_remedies
from partitioners.placement.memory_tiers import MemoryPlan, plan_memory_tiers, tier_op_times_s
from partitioners.placement.result import PlacementResult, transfer_plan
from partitioners.placement.scoring import ScoredCandidate, objective_value, plan_energy

__all__ = ["RETIME_MAX_OPS", "RETIME_MIN_GAIN", "RETIME_MAX_ROUNDS", "RETIME_ROUND_OPS", "finish_placement"]

#: Above this many operators level 3 plans tiers but does not re-simulate with tier bandwidths.
RETIME_MAX_OPS = 300_000
#: Level 3 re-simulates only when faster tiers save at least this fraction of compute time.
RETIME_MIN_GAIN = 0.01
#: Re-timing rounds before level 3 gives up on a schedule whose tiers keep changing: up to
#: 8 (a 10^4-operator DAG settles in 5, the fixtures in 1-2), fewer on large graphs so that
#: the rounds simulate at most RETIME_ROUND_OPS operators in all (at least 2 rounds).
RETIME_MAX_ROUNDS = 8
RETIME_ROUND_OPS = 300_000


def _timed_with_its_tiers(
    g: Hypergraph,
    inv: Inventory,
    placement: np.ndarray,
    tiers: MemoryPlan,
    times: np.ndarray,
    priority: np.ndarray,
    cost_model: CostModel,
    budget: np.ndarray,
    scored_makespan_s: float,
) -> tuple[SimulationResult, MemoryPlan | None]:
    """Re-time the schedule with ``tiers`` until the tiers planned on it are the ones that timed it.

    Faster operators change tensor lifetimes, and a tensor that no longer fits in its
    tier under the new lifetimes moves to a slower one (``plan_memory_tiers`` keeps a
    tier where it still fits, else tries the next slower), which changes the times
    again. Tiers only ever move down, so this settles; the plan returned states the
    tiers its own times assume. ``None`` for the plan when it has not settled within
    the round budget (``RETIME_MAX_ROUNDS``, ``RETIME_ROUND_OPS``), or as soon as a
    round is slower than the schedule scored in main memory (``scored_makespan_s``),
    which the caller would keep anyway: demotions only slow operators down.
    """
    rounds = min(RETIME_MAX_ROUNDS, max(2, RETIME_ROUND_OPS // max(g.n_ops, 1)))
    for _ in range(rounds):
        final = simulate(g, inv, placement, op_times_s=times, priority=priority, cost_model=cost_model)
        if final.makespan_s > scored_makespan_s:
            return final, None
        plan = plan_memory_tiers(g, inv, final, memory_budget_bytes=budget, tiers=tiers)
        if (
            np.array_equal(plan.tensor, tiers.tensor)
            and np.array_equal(plan.device, tiers.device)
            and np.array_equal(plan.tier, tiers.tier)
        ):
            return final, plan
        tiers = plan
        times = tier_op_times_s(g, inv, placement, tiers, cost_model=cost_model)
    return final, None


def finish_placement(
    ctx: PlacementContext, scored: Sequence[ScoredCandidate], best: int, *, raise_infeasible: bool
) -> PlacementResult:
    """Level 3 and the verdict for ``scored[best]``; the result lists every one of ``scored``.

    Parameters
    ----------
    ctx : PlacementContext
    scored : sequence of ScoredCandidate
        Every candidate scored, in scoring order.
    best : int
        Index of the chosen one.
    raise_infeasible : bool
        Raise :class:`Infeasible` instead of returning an infeasible plan.

    Returns
    -------
    PlacementResult

    Raises
    ------
    DoesNotFit
        With ``raise_infeasible``: the plan is over a device's memory budget (the
        message names the device, the bytes over and the changes that could help).
    Infeasible
        With ``raise_infeasible``: in pipeline mode no acyclic stage order was found.
    """
    chosen = scored[best]
    cand, placement, priority, sim = chosen.candidate, chosen.placement, chosen.priority, chosen.simulation
    g = ctx.graph
    inv = ctx.inventory
    n = ctx.n_ops
    budget = ctx.memory_budget_bytes
    notes = list(ctx.notes)
    if sim is None:
        sim = simulate(g, inv, placement, context=ctx.simulation, priority=priority, record_timeline=True)
    # level 3: tiers from the chosen schedule, re-timed with tier bandwidths
    plan0 = plan_memory_tiers(g, inv, sim, memory_budget_bytes=budget)
    # keep the chosen schedule's order: priority = earlier start runs first
    start_order = np.lexsort((np.arange(n), sim.op_start_s))
    final_priority = np.empty(n, dtype=np.float64)
    final_priority[start_order] = np.arange(n, 0, -1, dtype=np.float64)
    in_fast_tier = plan0.tier.size > 0 and bool((plan0.tier != inv.device_main_tier[plan0.device]).any())
    retime = n <= RETIME_MAX_OPS and in_fast_tier
    if retime:
        times = tier_op_times_s(g, inv, placement, plan0, cost_model=ctx.cost_model)
        ops = np.arange(n)
        saved_s = float((ctx.op_times_s[ops, placement] - times[ops, placement]).sum())
        # re-simulating (and re-planning offsets) only pays when the tiers save real time
        retime = saved_s > RETIME_MIN_GAIN * float(sim.device_busy_s.sum())
        if not retime:
            notes.append("level 3: faster tiers save under 1% of compute time; schedule not re-timed")
    final: SimulationResult = sim
    plan: MemoryPlan | None = plan0
    if retime:
        final, plan = _timed_with_its_tiers(
            g, inv, placement, plan0, times, final_priority, ctx.cost_model, budget, sim.makespan_s
        )
        if plan is None and final.makespan_s <= sim.makespan_s:
            notes.append("level 3: tiers kept moving as the schedule was re-timed; schedule not re-timed")
    elif n > RETIME_MAX_OPS:
        notes.append(
            f"level 3: tiers planned on the scored schedule; not re-timed with tier bandwidths above "
            f"{RETIME_MAX_OPS} operators"
        )
    timed_with_tiers = bool(retime and plan is not None and final.makespan_s <= sim.makespan_s)
    if not timed_with_tiers:
        # a list-scheduling anomaly made the re-timed schedule slower: keep the scored one
        final, plan = sim, plan0
        if priority is not None:
            final_priority = priority
        else:
            final_priority = critical_path_priority(
                g, inv, placement, ctx.op_times_s[np.arange(n), placement], cost_model=ctx.cost_model
            )
    assert plan is not None and final.peak_memory_bytes is not None
    peak = final.peak_memory_bytes
    used = np.unique(placement)
    over = peak - budget
    over_used = np.where(np.isin(np.arange(inv.n_devices), used), over, -np.inf)
    worst = int(np.argmax(over_used))
    stage_order_ok = cand.acyclic or not ctx.options.pipeline
    feasible = bool(over_used[worst] <= 0) and plan.hbm_fits and stage_order_ok
    bytes_over = float(max(over_used[worst], 0.0))
    if not feasible and raise_infeasible:
        if not stage_order_ok:
            if ctx.constraint is not None:
                raise Infeasible(
                    "no acyclic stage assignment found for pipeline mode that keeps every operator on a device of "
                    "its device_types (operators restricted to one type alternate with others along the graph); "
                    "allow more device types for them, or plan without pipeline mode"
                )
            raise Infeasible("no acyclic stage assignment found for pipeline mode")
        one_operator_too_big = bool(op_working_set_bytes(g).max() > budget[ctx.devices].max())
        raise DoesNotFit(
            f"no placement fits in memory: the best plan ({cand.strategy}) needs "
            f"{format_bytes(peak[worst])} on device {inv.device_names[worst]}, {format_bytes(bytes_over)} over its "
            f"budget of {format_bytes(budget[worst])}; "
            + fit_remedies(ctx.options, inv, one_operator_too_big=one_operator_too_big)
        )
    return PlacementResult(
        expanded=ctx.expanded,
        placement=placement,
        priority=final_priority,
        strategy=cand.strategy,
        candidates=tuple(s.candidate for s in scored),
        simulation=final,
        memory_plan=plan,
        transfers=transfer_plan(g, inv, final),
        feasible=feasible,
        infeasible_device=None if feasible else worst,
        bytes_over=bytes_over,
        memory_budget_bytes=budget,
        acyclic=cand.acyclic,
        devices_used=int(used.shape[0]),
        objective_value=objective_value(ctx, final, placement),
        energy=plan_energy(ctx, final, placement),
        chosen=cand,
        notes=notes,
        timed_with_tiers=timed_with_tiers,
        cost_model=ctx.cost_model,
        cost_sources=cost_sources(g, inv, ctx.cost_model, placement),
    )
