"""Scoring candidates with the simulator, and ranking them: :class:`ScoredCandidate`.

A proposal (:class:`~partitioners.placement.candidates.Proposal`) is repaired
(device types; in pipeline mode an acyclic stage order,
:mod:`partitioners.placement.repairs`), simulated with the event-driven simulator
(:mod:`partitioners.costmodel.simulator`) and measured: makespan, bytes moved,
peak memory against each used device's budget, and the value the request's
objective compares. Ranking then prefers feasible plans, then the least over
budget, then the objective, makespan and fewer devices, then scoring order, so
ties break the same way every time.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from partitioners.costmodel.energy import StepEnergy, step_energy
from partitioners.costmodel.simulator import SimulationResult, simulate
from partitioners.graph.hypergraph import TENSOR_PARAMETER
from partitioners.placement.candidates import Proposal
from partitioners.placement.context import PlacementContext
from partitioners.placement.options import ENERGY_OBJECTIVES
from partitioners.placement.repairs import keep_on_allowed_devices, pipeline_repair, stage_graph_acyclic
from partitioners.placement.result import Candidate

__all__ = [
    "INFEASIBLE_TOLERANCE",
    "RankingKey",
    "ScoredCandidate",
    "objective_value",
    "plan_energy",
    "score_proposal",
    "score_single_analytic",
    "least_over_budget",
    "ranking_key",
    "best_candidate",
]

#: When no plan fits, memory overshoots within this fraction of the smallest count as equal.
INFEASIBLE_TOLERANCE = 0.05

#: ``(infeasible, over budget, objective, makespan_s, devices used, tiebreak)``: smaller ranks first.
RankingKey = tuple[bool, float, float, float, int, int]


@dataclass(frozen=True, eq=False)
class ScoredCandidate:
    """A candidate placement with its score and the simulation that produced it.

    Attributes
    ----------
    candidate : Candidate
        The public score (what the result lists for every candidate).
    placement : numpy.ndarray of int64, shape (n_ops,)
        The placement scored: the proposal after its repairs.
    priority : numpy.ndarray of float64 or None
        The operator priorities it was simulated with (``None``: critical path).
    simulation : SimulationResult or None
        Its simulation with timeline; ``None`` when scored analytically (one device).
    """

    candidate: Candidate
    placement: np.ndarray
    priority: np.ndarray | None
    simulation: SimulationResult | None

    @property
    def strategy(self) -> str:
        return self.candidate.strategy

    @property
    def feasible(self) -> bool:
        return self.candidate.feasible

    @property
    def simulated(self) -> bool:
        """Whether scoring spent a simulation on it."""
        return self.simulation is not None


def plan_energy(ctx: PlacementContext, sim: SimulationResult, placement: np.ndarray) -> StepEnergy | None:
    """Energy of one simulated step: the devices ``placement`` uses, and (``count_idle_devices``)
    the usable ones it leaves idle; ``None`` when one of them has no power figures."""
    counted = np.unique(placement)
    if ctx.options.count_idle_devices:
        counted = np.union1d(counted, ctx.devices)
    active = ctx.inventory.device_active_power_w
    if active is None or not np.isfinite(active[counted]).all():
        return None
    return step_energy(
        ctx.inventory,
        makespan_s=float(sim.makespan_s),
        device_busy_s=sim.device_busy_s,
        counted_devices=counted,
        link_src=sim.link_src,
        link_dst=sim.link_dst,
        link_bytes=sim.link_bytes,
    )


def _energy_objective(ctx: PlacementContext, makespan_s: float, energy: StepEnergy | None) -> float:
    if energy is None:  # placement_context refuses energy objectives without power figures
        raise ValueError("an energy objective needs every usable device's power figures")
    if ctx.options.objective == "energy_delay":
        return energy.total_j * makespan_s
    return energy.total_j


def objective_value(ctx: PlacementContext, sim: SimulationResult, placement: np.ndarray) -> float:
    """The figure ``ctx.options.objective`` compares: makespan, busiest device per micro-batch,
    bytes, joules or joules x seconds."""
    if ctx.options.objective == "throughput":
        return float(sim.device_busy_s.max()) / ctx.micro_batches
    if ctx.options.objective == "communication":
        return float(sim.comm_bytes)
    if ctx.options.objective in ENERGY_OBJECTIVES:
        return _energy_objective(ctx, float(sim.makespan_s), plan_energy(ctx, sim, placement))
    return float(sim.makespan_s)


def score_proposal(ctx: PlacementContext, proposal: Proposal) -> ScoredCandidate:
    """Repair ``proposal`` (device types and, in pipeline mode, stage order), simulate it and score it.

    The device-type repair comes last: a restricted operator never runs where it may
    not, and a stage graph it makes cyclic marks the candidate as not acyclic.
    """
    note = proposal.note
    placement, moved = keep_on_allowed_devices(ctx, np.asarray(proposal.placement, dtype=np.int64))
    if ctx.options.pipeline:
        repaired = pipeline_repair(ctx, placement)
        if repaired is not placement:
            placement, moved_again = keep_on_allowed_devices(ctx, repaired)
            moved += moved_again
    if moved:
        note = "; ".join(x for x in (note, f"{moved} operators moved to a device of a type they may run on") if x)
    sim = simulate(
        ctx.graph, ctx.inventory, placement, context=ctx.simulation, priority=proposal.priority, record_timeline=True
    )
    assert sim.peak_memory_bytes is not None  # recorded with the timeline
    budget = ctx.memory_budget_bytes
    used = np.unique(placement)
    frac = float(np.max(sim.peak_memory_bytes[used] / np.maximum(budget[used], 1.0)))
    acyclic = stage_graph_acyclic(ctx, placement)
    feasible = frac <= 1.0 and (acyclic or not ctx.options.pipeline)
    candidate = Candidate(
        strategy=proposal.strategy,
        makespan_s=float(sim.makespan_s),
        feasible=bool(feasible),
        comm_bytes=float(sim.comm_bytes),
        devices_used=int(used.shape[0]),
        peak_memory_fraction=frac,
        acyclic=bool(acyclic),
        objective_value=objective_value(ctx, sim, placement),
        note=note,
    )
    return ScoredCandidate(candidate, placement, proposal.priority, sim)


def score_single_analytic(ctx: PlacementContext, proposal: Proposal) -> ScoredCandidate | None:
    """Score a one-device plan without simulating it, when its memory verdict is clear-cut.

    One device with every input local never idles, so the makespan is the sum of
    its operator times. Memory lies between the parameters plus the largest
    operator's working set and the parameters plus every tensor; when the budget
    is outside that range feasibility is known, otherwise return ``None`` (the
    caller simulates).
    """
    d = int(proposal.placement[0])
    g = ctx.graph
    params = float(g.tensor_bytes[g.tensor_kind == TENSOR_PARAMETER].sum())
    working = float((g.op_input_bytes() - g.op_param_bytes + g.op_output_bytes()).max())
    everything = float(g.tensor_bytes.sum())
    budget = max(float(ctx.memory_budget_bytes[d]), 1.0)
    if params + working > budget:
        feasible, frac = False, (params + working) / budget
    elif everything <= budget:
        feasible, frac = True, everything / budget
    else:
        return None
    makespan = float(ctx.op_times_s[:, d].sum())
    if ctx.options.objective == "throughput":
        obj = makespan / ctx.micro_batches
    elif ctx.options.objective == "communication":
        obj = 0.0
    elif ctx.options.objective in ENERGY_OBJECTIVES:
        busy = np.zeros(ctx.inventory.n_devices)
        busy[d] = makespan
        counted = np.union1d([d], ctx.devices) if ctx.options.count_idle_devices else np.array([d])
        energy = step_energy(ctx.inventory, makespan_s=makespan, device_busy_s=busy, counted_devices=counted)
        obj = _energy_objective(ctx, makespan, energy)
    else:
        obj = makespan
    candidate = Candidate(
        strategy=proposal.strategy,
        makespan_s=makespan,
        feasible=feasible,
        comm_bytes=0.0,
        devices_used=1,
        peak_memory_fraction=frac,
        acyclic=True,
        objective_value=obj,
        note=f"{proposal.note}; analytic (sum of operator times)",
    )
    return ScoredCandidate(candidate, proposal.placement, None, None)


def least_over_budget(candidates: Sequence[Candidate], pipeline: bool) -> float:
    """The smallest peak-memory fraction among infeasible candidates (``inf`` when none).

    In pipeline mode a cyclic candidate does not count: it is infeasible whatever its memory.
    """
    overs = [c.peak_memory_fraction for c in candidates if not c.feasible and (c.acyclic or not pipeline)]
    return min(overs) if overs else float("inf")


def ranking_key(candidate: Candidate, tiebreak: int, *, least_over: float, pipeline: bool) -> RankingKey:
    """Sort key: feasible first, then least over budget, objective, makespan, fewer devices, ``tiebreak``.

    Among infeasible plans, overshoots within :data:`INFEASIBLE_TOLERANCE` of the
    smallest seen (``least_over``) count as equal, so the least-infeasible answer is
    also a fast one.
    """
    pipeline_bad = pipeline and not candidate.acyclic
    over = 0.0 if candidate.feasible else candidate.peak_memory_fraction + (1e9 if pipeline_bad else 0.0)
    if not candidate.feasible and over <= least_over * (1.0 + INFEASIBLE_TOLERANCE):
        over = least_over
    return (
        not candidate.feasible,
        over,
        candidate.objective_value,
        candidate.makespan_s,
        candidate.devices_used,
        tiebreak,
    )


def best_candidate(scored: Sequence[ScoredCandidate], pipeline: bool) -> int:
    """Index of the best of ``scored`` by :func:`ranking_key`, ties to the one scored first."""
    least_over = least_over_budget([s.candidate for s in scored], pipeline)
    return min(
        range(len(scored)), key=lambda i: ranking_key(scored[i].candidate, i, least_over=least_over, pipeline=pipeline)
    )
