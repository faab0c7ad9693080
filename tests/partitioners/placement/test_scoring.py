"""Specification of scoring and ranking candidates (partitioners.placement.scoring).

Scoring repairs a proposal, simulates it and names every figure; ranking prefers a
feasible plan, then the least over budget (overshoots within 5% of the smallest
count as equal), then the objective, makespan, fewer devices, and scoring order.
"""

from __future__ import annotations

import numpy as np
import pytest

from partitioners.costmodel.simulator import simulate
from partitioners.graph.generators import synthetic_hypergraph
from partitioners.placement import Candidate, PlacementOptions, Proposal, evaluate_placement, place, placement_context
from partitioners.placement.scoring import (
    INFEASIBLE_TOLERANCE,
    ScoredCandidate,
    best_candidate,
    least_over_budget,
    ranking_key,
    score_proposal,
    score_single_analytic,
)
from tests.partitioners.hardware.test_device_types import fast_fast_slow, with_device_types
from tests.partitioners.placement.test_engine import IDEAL, MS, chain, cluster


def candidate(name="c", *, makespan_s=1.0, feasible=True, frac=0.5, acyclic=True, devices=1, objective=None):
    return Candidate(
        strategy=name,
        makespan_s=makespan_s,
        feasible=feasible,
        comm_bytes=0.0,
        devices_used=devices,
        peak_memory_fraction=frac,
        acyclic=acyclic,
        objective_value=makespan_s if objective is None else objective,
    )


def scored(c: Candidate) -> ScoredCandidate:
    return ScoredCandidate(c, np.zeros(1, dtype=np.int64), None, None)


def test_a_feasible_plan_beats_a_faster_infeasible_one():
    ranked = [
        scored(candidate("fast", makespan_s=1.0, feasible=False, frac=1.2)),
        scored(candidate("slow", makespan_s=5.0)),
    ]
    assert best_candidate(ranked, pipeline=False) == 1


def test_among_infeasible_plans_overshoots_within_the_tolerance_count_as_equal_so_the_faster_wins():
    near = 1.2 * (1 + INFEASIBLE_TOLERANCE / 2)
    ranked = [
        scored(candidate("least-over", makespan_s=5.0, feasible=False, frac=1.2)),
        scored(candidate("near", makespan_s=1.0, feasible=False, frac=near)),
        scored(candidate("far", makespan_s=0.5, feasible=False, frac=1.5)),
    ]
    assert least_over_budget([s.candidate for s in ranked], pipeline=False) == 1.2
    assert best_candidate(ranked, pipeline=False) == 1


def test_ties_go_to_fewer_devices_then_to_the_candidate_scored_first():
    ranked = [scored(candidate("a", devices=4)), scored(candidate("b", devices=2)), scored(candidate("c", devices=2))]
    assert best_candidate(ranked, pipeline=False) == 1


def test_in_pipeline_mode_a_cyclic_plan_ranks_after_every_acyclic_one():
    cyclic = candidate("cyclic", feasible=False, frac=0.1, acyclic=False)
    over = candidate("over", feasible=False, frac=3.0)
    assert least_over_budget([cyclic, over], pipeline=True) == 3.0
    assert ranking_key(over, 1, least_over=3.0, pipeline=True) < ranking_key(cyclic, 0, least_over=3.0, pipeline=True)


def test_the_objective_decides_before_the_makespan():
    throughput = [
        scored(candidate("short", makespan_s=1.0, objective=0.9)),
        scored(candidate("steady", makespan_s=2.0, objective=0.5)),
    ]
    assert best_candidate(throughput, pipeline=False) == 1


def test_a_scored_candidate_names_its_figures_from_its_simulation():
    ctx = placement_context(chain(4), cluster(2), PlacementOptions(), IDEAL)
    placement = np.array([0, 0, 1, 1], dtype=np.int64)
    s = score_proposal(ctx, Proposal("split", placement, note="by hand"))
    sim = simulate(ctx.graph, ctx.inventory, placement, cost_model=IDEAL)
    assert s.strategy == "split" and s.simulated and s.feasible
    assert s.candidate.makespan_s == pytest.approx(sim.makespan_s)
    assert s.candidate.comm_bytes == pytest.approx(1e6)
    assert s.candidate.devices_used == 2
    assert s.candidate.note == "by hand"
    assert np.array_equal(s.placement, placement)


def test_scoring_moves_restricted_operators_to_a_device_of_their_type_and_says_how_many():
    graph = with_device_types(synthetic_hypergraph(60, lanes=6, seed=2), every=4, types=("slow",))
    inv = fast_fast_slow()
    ctx = placement_context(graph, inv, PlacementOptions(), IDEAL)
    s = score_proposal(ctx, Proposal("all-fast", np.zeros(ctx.n_ops, dtype=np.int64)))
    assert ctx.constraint is not None and ctx.constraint.allows(s.placement).all()
    moved = int((s.placement != 0).sum())
    assert moved > 0 and s.candidate.note == f"{moved} operators moved to a device of a type they may run on"


def test_in_pipeline_mode_scoring_repairs_a_cyclic_proposal_into_an_acyclic_one():
    ctx = placement_context(chain(4), cluster(2), PlacementOptions(pipeline=True), IDEAL)
    s = score_proposal(ctx, Proposal("zigzag", np.array([0, 1, 0, 1], dtype=np.int64)))
    assert s.candidate.acyclic and s.feasible
    assert s.placement.tolist() == [0, 1, 1, 1]


def test_the_analytic_one_device_score_is_the_simulated_one_when_memory_is_clear_cut():
    ctx = placement_context(chain(5), cluster(2), PlacementOptions(), IDEAL)
    proposal = Proposal("single", np.zeros(ctx.n_ops, dtype=np.int64), note="device d0")
    analytic = score_single_analytic(ctx, proposal)
    assert analytic is not None and not analytic.simulated and analytic.feasible
    assert analytic.candidate.makespan_s == pytest.approx(5 * MS / 1e12)
    assert analytic.candidate.makespan_s == pytest.approx(score_proposal(ctx, proposal).candidate.makespan_s)
    assert analytic.candidate.note == "device d0; analytic (sum of operator times)"


def test_the_analytic_score_declines_when_only_a_simulation_can_tell_whether_it_fits():
    # parameters plus one operator's working set fit; every tensor at once does not
    ctx = placement_context(chain(4, tensor_bytes=3e8), cluster(2, hbm_bytes=1e9), PlacementOptions(), IDEAL)
    assert score_single_analytic(ctx, Proposal("single", np.zeros(ctx.n_ops, dtype=np.int64))) is None


def test_evaluating_the_winners_placement_gives_the_winners_plan():
    graph = synthetic_hypergraph(80, lanes=4, seed=5)
    inv = cluster(4)
    won = place(graph, inv, cost_model=IDEAL)
    again = evaluate_placement(graph, inv, won.placement, cost_model=IDEAL, name="again")
    assert again.strategy == "again" and [c.strategy for c in again.candidates] == ["again"]
    assert np.array_equal(again.placement, won.placement)
    assert again.feasible == won.feasible and again.devices_used == won.devices_used
