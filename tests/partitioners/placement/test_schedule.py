"""Specification of the plan's schedule (partitioners.placement.schedule)."""

from __future__ import annotations

import numpy as np
import pytest

from partitioners.costmodel.costs import CostModel
from partitioners.graph.generators import synthetic_hypergraph
from partitioners.graph.hypergraph import graph_from_ops
from partitioners.hardware.inventory import inventory_from_json
from partitioners.placement.engine import PlacementOptions, place
from partitioners.placement.memory_tiers import tensor_lifetimes
from partitioners.placement.schedule import plan_schedule

IDEAL = CostModel(efficiency=(1.0,) * 8, memory_efficiency=1.0, launch_overhead_s=0.0)


def cluster(n_devices: int = 2, l2_bytes: float = 8e6, peak_flops: float = 1e14):
    return inventory_from_json(
        {
            "name": "tiered",
            "groups": [
                {
                    "name": "g",
                    "devices": [
                        {
                            "name": f"d{i}",
                            "type": "T",
                            "peak_flops": peak_flops,
                            "memory_tiers": [
                                {"name": "HBM", "capacity_bytes": 80e9, "bandwidth_bytes_per_s": 2e12},
                                {"name": "L2", "capacity_bytes": l2_bytes, "bandwidth_bytes_per_s": 2e13},
                            ],
                        }
                        for i in range(n_devices)
                    ],
                    "link": {"bandwidth_bytes_per_s": 3e11, "latency_s": 1e-6},
                }
            ],
        }
    )


@pytest.mark.parametrize("l2_bytes", [1e3, 64e6])
def test_the_holdings_live_intervals_are_the_lifetimes_of_the_simulation_the_plan_reports(l2_bytes):
    """Re-timed with tier bandwidths (memory-bound operators, a large L2) or not (a tiny one), the tiers
    were planned on the reported simulation, so their live intervals are that simulation's tensor lifetimes."""
    inventory = cluster(2, l2_bytes, peak_flops=1e17)
    result = place(synthetic_hypergraph(200, lanes=4, seed=2), inventory, PlacementOptions())
    schedule = plan_schedule(result, inventory)
    tensor, device, live_from, live_until = tensor_lifetimes(result.graph, result.simulation)
    assert np.array_equal(schedule.holding_tensor, tensor) and np.array_equal(schedule.holding_device, device)
    assert np.array_equal(schedule.holding_live_from_s, live_from)
    assert np.array_equal(schedule.holding_live_until_s, live_until)
    assert result.timed_with_tiers == (l2_bytes > 1e6)


def test_each_device_lists_each_of_its_operators_once_in_start_order():
    inventory = cluster(4)
    result = place(synthetic_hypergraph(300, lanes=8, seed=5), inventory, PlacementOptions(strategy="metis"))
    schedule = plan_schedule(result, inventory)
    assert sorted(schedule.op_order.tolist()) == list(range(result.graph.n_ops))
    for d in range(inventory.n_devices):
        ops = schedule.op_order[schedule.device_ptr[d] : schedule.device_ptr[d + 1]]
        assert (result.placement[ops] == d).all()
        assert (np.diff(schedule.op_start_s[ops]) >= 0).all()
        assert (schedule.op_start_s[ops][1:] >= schedule.op_end_s[ops][:-1]).all()


def test_operators_of_zero_duration_at_one_instant_are_listed_producer_first():
    # listed consumer first, so operator ids run against the dependencies; no FLOPs, no bytes: all at t=0
    ops = [("c", "Add", 0.0, ["y"], ["z"]), ("b", "Add", 0.0, ["x"], ["y"]), ("a", "Add", 0.0, ["w"], ["x"])]
    graph = graph_from_ops("zero", ops, {"w": 0.0, "x": 0.0, "y": 0.0, "z": 0.0})
    inventory = cluster(1)
    result = place(graph, inventory, PlacementOptions(), cost_model=IDEAL)
    schedule = plan_schedule(result, inventory)
    assert schedule.op_end_s.max() == 0.0
    assert [result.graph.op_names[o] for o in schedule.op_order] == ["a", "b", "c"]


def test_only_a_micro_batched_plan_carries_micro_batches():
    inventory = cluster(2)
    graph = synthetic_hypergraph(20, lanes=2, seed=1)
    assert plan_schedule(place(graph, inventory, PlacementOptions()), inventory).op_micro_batch is None
    batched = plan_schedule(place(graph, inventory, PlacementOptions(micro_batches=3)), inventory)
    assert batched.op_micro_batch is not None and sorted(set(batched.op_micro_batch.tolist())) == [0, 1, 2]
