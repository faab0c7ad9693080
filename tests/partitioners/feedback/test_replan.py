"""Specification of re-placement with few moves (partitioners.feedback.replan).

A proposal that only renames interchangeable devices moves nothing; operators on a
gone device always move; with no tolerance the whole gain is kept; and a given
placement is finished into a plan the way the engine finishes its winner.
"""

from __future__ import annotations

import numpy as np
import pytest

from partitioners.costmodel.simulator import simulate
from partitioners.feedback.calibration import calibrated_cost_model
from partitioners.feedback.replan import _fewest_passing, minimal_movement, placement_result
from partitioners.graph import graph_from_json
from partitioners.hardware.inventory import preset_inventory
from partitioners.placement import PlacementOptions, PlacementResult
from tests.partitioners.feedback.test_calibration import MB, chain_graph


def _two_branch_setup():
    doc = chain_graph([("a0", "MatMul", 2e12), ("a1", "MatMul", 2e12)])
    doc["nodes"] += [
        {"name": "b0", "op": "MatMul", "inputs": ["x"], "outputs": ["b0.out"], "flops": 2e12},
        {"name": "b1", "op": "MatMul", "inputs": ["b0.out"], "outputs": ["b1.out"], "flops": 2e12},
    ]
    doc["tensors"] += [{"name": "b0.out", "bytes": 16 * MB}, {"name": "b1.out", "bytes": 16 * MB}]
    return graph_from_json(doc), preset_inventory("dgx-h100", 1)


def test_a_proposal_that_only_renames_identical_devices_moves_nothing():
    graph, inventory = _two_branch_setup()
    current = np.array([0, 0, 1, 1])
    result = minimal_movement(graph, inventory, current, np.array([2, 2, 3, 3]))
    assert result.moved == 0
    assert result.placement.tolist() == current.tolist()


def test_operators_on_a_gone_device_always_move():
    graph, inventory = _two_branch_setup()
    current = np.array([-1, -1, 1, 1])
    result = minimal_movement(graph, inventory, current, np.array([2, 2, 3, 3]), tolerance_fraction=1.0)
    assert result.displaced == 2
    assert (result.placement[:2] >= 0).all() and result.placement[2:].tolist() == [1, 1]


def test_with_no_tolerance_minimal_movement_keeps_the_whole_gain():
    graph, inventory = _two_branch_setup()
    slow = calibrated_cost_model(device_slowdown={"node0/gpu0": 3.0}, inventory=inventory)
    current = np.array([0, 0, 0, 0])
    proposed = np.array([1, 1, 2, 2])
    result = minimal_movement(graph, inventory, current, proposed, cost_model=slow, tolerance_fraction=0.0)
    assert result.makespan_s <= result.proposed_makespan_s * (1 + 1e-12)
    assert result.makespan_s < result.kept_makespan_s
    assert not (result.placement == 0).any()


def test_a_placement_result_is_built_for_exactly_the_given_placement():
    graph, inventory = _two_branch_setup()
    placement = np.array([3, 3, 5, 5])
    result = placement_result(graph, inventory, PlacementOptions(), placement)
    assert result.placement.tolist() == placement.tolist()
    assert result.makespan_s == pytest.approx(simulate(graph, inventory, placement).makespan_s, rel=0.05)


def test_a_placement_result_is_the_engines_plan_for_the_given_placement_with_the_name_asked():
    graph, inventory = _two_branch_setup()
    placement = np.array([3, 3, 5, 5])
    result = placement_result(graph, inventory, PlacementOptions(), placement, name="kept")
    assert isinstance(result, PlacementResult)
    assert result.strategy == "kept" and [c.strategy for c in result.candidates] == ["kept"]
    assert result.feasible and result.devices_used == 2


@pytest.mark.parametrize("first_passing", [0, 1, 2, 3, 5, 8, 13])
def test_the_fewest_passing_prefix_is_found_for_a_monotone_test(first_passing):
    calls = []

    def ok(k):
        calls.append(k)
        return k >= first_passing

    assert _fewest_passing(ok, 13) == first_passing
    assert len(calls) <= 2 * 4 + 1  # galloping then bisection: about 2 log2(13) tests


def test_when_no_prefix_passes_the_whole_proposal_is_the_answer():
    assert _fewest_passing(lambda k: False, 9) == 9
