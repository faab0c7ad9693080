"""Specification of the candidate strategies (partitioners.placement.candidates) and their context.

Each strategy is a pure function of a frozen :class:`PlacementContext`: it proposes
one device per operator of the expanded graph, among the usable devices, and the
same context gives the same proposal. ``place`` lists exactly what scoring each
strategy's proposal gives.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from partitioners.costmodel.profiles import CostModelSpec
from partitioners.graph.generators import synthetic_hypergraph
from partitioners.hardware.inventory import preset_inventory
from partitioners.placement import (
    PlacementContext,
    PlacementOptions,
    Proposal,
    place,
    placement_context,
    score_proposal,
)
from partitioners.placement.candidates import (
    candidate_schedule,
    device_counts,
    heft,
    heft_tight,
    hybrid_replicas,
    hybrid_shapes,
    metis_edge_cut,
    metis_k_way,
    pipeline_stages,
    single_device,
)
from partitioners.placement.pipeline import quotient_is_acyclic
from tests.partitioners.placement.test_engine import IDEAL, chain, cluster, two_chains


def context(graph=None, inventory=None, **options) -> PlacementContext:
    return placement_context(
        graph or synthetic_hypergraph(120, lanes=6, seed=4),
        inventory or cluster(4, groups=2),
        PlacementOptions(**options),
        IDEAL,
    )


BUILDERS = {
    "single": single_device,
    "heft-contention": lambda ctx: heft(ctx, contention=True),
    "heft": lambda ctx: heft(ctx, contention=False),
    "heft-contention/tight": lambda ctx: heft_tight(ctx, 0.5),
    "metis-4": lambda ctx: metis_k_way(ctx, 4),
    "metis-2": lambda ctx: metis_k_way(ctx, 2),
    "metis-edge-cut-4": metis_edge_cut,
    "pipeline-3": lambda ctx: pipeline_stages(ctx, 3),
    "hybrid-2x2": lambda ctx: hybrid_replicas(ctx, 2, 2),
}


@pytest.mark.parametrize("name", list(BUILDERS))
def test_every_strategy_proposes_one_usable_device_per_operator_under_its_name_and_the_same_twice(name):
    ctx = context(mode="training", micro_batches=2)
    first, second = BUILDERS[name](ctx), BUILDERS[name](ctx)
    assert isinstance(first, Proposal) and first.strategy == name
    assert first.placement.shape == (ctx.n_ops,)
    assert set(first.placement.tolist()) <= set(ctx.devices.tolist())
    assert np.array_equal(first.placement, second.placement)


def test_metis_on_k_devices_uses_the_first_k_of_the_device_order():
    ctx = context()
    assert set(metis_k_way(ctx, 2).placement.tolist()) <= set(ctx.devices[:2].tolist())


def test_pipeline_stages_form_an_acyclic_stage_graph_in_topological_order():
    ctx = context()
    proposal = pipeline_stages(ctx, 4)
    assert quotient_is_acyclic(ctx.graph, proposal.placement)
    assert proposal.note == ""


def test_heft_priorities_rank_every_operator_once():
    ctx = context()
    proposal = heft(ctx, contention=True)
    assert sorted(proposal.priority.tolist()) == list(range(1, ctx.n_ops + 1))
    assert proposal.note == "4 devices offered, link ports modelled"


def test_the_context_is_frozen():
    ctx = context()
    with pytest.raises(dataclasses.FrozenInstanceError):
        ctx.devices = ctx.devices[:1]  # type: ignore[misc]


def test_the_usable_devices_are_the_fastest_first_and_at_most_max_devices():
    inv = cluster(4, peaks=[1e12, 3e12, 2e12, 1e12])
    ctx = placement_context(chain(), inv, PlacementOptions(max_devices=2), IDEAL)
    assert ctx.devices.tolist() == [1, 2]


def test_device_counts_are_powers_of_two_group_boundaries_and_all():
    assert device_counts(16, [8, 8]) == [2, 4, 8, 16]
    assert device_counts(12, [4, 4, 4]) == [2, 4, 8, 12]
    assert device_counts(6, [6]) == [2, 4, 6]


def test_hybrid_shapes_use_the_most_devices_then_replicas_first_and_fewer_replicas_under_memory_pressure():
    assert hybrid_shapes(4, 8, low_memory=False) == [(2, 4), (4, 2), (1, 4), (2, 2), (1, 2)]
    assert hybrid_shapes(4, 8, low_memory=True) == [(4, 2), (2, 2), (1, 2), (2, 4), (1, 4)]


def test_the_schedule_scores_one_of_each_family_and_both_heft_variants_first():
    ctx = context(micro_batches=2)
    schedule = candidate_schedule(ctx, low_memory=False)
    names = [build(ctx).strategy for build in schedule.essential]
    assert names == ["hybrid-2x2", "hybrid-1x2", "heft-contention", "heft", "pipeline-4", "metis-4", "metis-edge-cut-4"]
    low = [build(ctx).strategy for build in candidate_schedule(ctx, low_memory=True).essential]
    assert low[0] == "pipeline-4"


def test_a_forced_family_schedules_only_that_family():
    ctx = context(strategy="metis")
    schedule = candidate_schedule(ctx, low_memory=False)
    names = [build(ctx).strategy for build in schedule.essential + schedule.extra]
    assert names == ["metis-4", "metis-edge-cut-4", "metis-2"]


@pytest.mark.parametrize(
    "strategy,build",
    [
        ("heft", lambda c: heft(c, contention=True)),
        ("pipeline", lambda c: pipeline_stages(c, 4)),
        ("metis", lambda c: metis_k_way(c, 4)),
    ],
)
def test_place_lists_what_scoring_the_strategys_proposal_gives(strategy, build):
    graph = synthetic_hypergraph(120, lanes=6, seed=4)
    inv = cluster(4, groups=2)
    options = PlacementOptions(strategy=strategy)
    result = place(graph, inv, options, cost_model=IDEAL)
    scored = score_proposal(
        placement_context(graph, inv, options, IDEAL), build(placement_context(graph, inv, options, IDEAL))
    )
    assert result.candidates[0] == scored.candidate


def test_two_chains_go_one_per_device_under_heft():
    ctx = placement_context(two_chains(), cluster(4), PlacementOptions(), IDEAL)
    placement = heft(ctx, contention=True).placement
    assert len(set(placement[:3].tolist())) == 1 and len(set(placement[3:].tolist())) == 1
    assert placement[0] != placement[3]


#: ``place`` on ``synthetic_hypergraph(300, seed=1)``, one DGX H100, training, two micro-batches,
#: seed 3, recorded before the engine became functions over a frozen context (issue 51): every
#: candidate in scoring order with its makespan, and the refined winner. The cost model was the
#: ``eager`` profile with launches paid per device (the default then; single-controller since).
#: Pure data parallelism (``hybrid-1x2``) has been scored right after the first hybrid since.
RECORDED_TRAINING_M2 = [
    ("single", 0.021904494161768564),
    ("hybrid-4x2", 0.005469402076429873),
    ("hybrid-1x2", 0.010956297476406671),
    ("heft-contention", 0.00524901166299898),
    ("heft", 0.008447690192777848),
    ("pipeline-8", 0.00563425959085035),
    ("metis-8", 0.003834406342460263),
    ("metis-edge-cut-8", 0.004146990773522715),
    ("hybrid-2x2", 0.007905565627086535),
    ("pipeline-4", 0.009892229060729965),
    ("pipeline-2", 0.01556356726717883),
    ("metis-4", 0.0075112856910623995),
    ("metis-2", 0.012723973979590271),
    ("metis-8+refine", 0.00380875063218934),
]


def test_the_same_request_gives_the_plan_it_gave_before_the_engine_was_split():
    options = PlacementOptions(
        mode="training", micro_batches=2, seed=3, allow_infeasible=True, cost_model=CostModelSpec(launch="per-device")
    )
    result = place(synthetic_hypergraph(300, seed=1), preset_inventory("dgx-h100", 1), options)
    assert [c.strategy for c in result.candidates] == [name for name, _ in RECORDED_TRAINING_M2]
    assert [c.makespan_s for c in result.candidates] == pytest.approx([s for _, s in RECORDED_TRAINING_M2], rel=1e-9)
    assert result.strategy == "metis-8+refine"
    assert result.chosen.note == "2 of 7 moves kept"
    assert result.makespan_s == pytest.approx(0.003726646173187068, rel=1e-9)
