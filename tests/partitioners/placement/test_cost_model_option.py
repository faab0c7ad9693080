"""``PlacementOptions.cost_model``: the profile and launch mode decide the plan, and the plan says which."""

from __future__ import annotations

import numpy as np
import pytest

from partitioners.costmodel.profiles import CostModelSpec
from partitioners.graph.hypergraph import graph_from_ops
from partitioners.graph.json_import import graph_from_json
from partitioners.hardware.inventory import preset_inventory
from partitioners.placement import PlacementOptions, place, placement_context


def recurrent_grid(layers: int = 4, steps: int = 200):
    """An LSTM's shape: cell (l, t) reads cell (l, t-1) and cell (l-1, t); every cell a tiny op."""
    ops, sizes = [], {f"h{layer}_-1": 4096.0 for layer in range(layers)}
    for t in range(steps):
        sizes[f"x{t}"] = 4096.0
        for layer in range(layers):
            below = f"x{t}" if layer == 0 else f"h{layer - 1}_{t}"
            ops.append((f"cell{layer}_{t}", "Add", 1e5, [below, f"h{layer}_{t - 1}"], [f"h{layer}_{t}"]))
            sizes[f"h{layer}_{t}"] = 4096.0
    return graph_from_ops("recurrent-grid", ops, sizes)


def test_tiny_recurrent_ops_stay_on_one_gpu_when_one_host_launches_them():
    r = place(recurrent_grid(), preset_inventory("dgx-h100", 2), PlacementOptions())
    assert r.cost_model is not None and r.cost_model.launch == "single-controller"
    assert r.devices_used == 1


def test_the_same_ops_spread_when_every_device_launches_its_own():
    options = PlacementOptions(cost_model=CostModelSpec(launch="per-device"))
    r = place(recurrent_grid(), preset_inventory("dgx-h100", 2), options)
    assert r.devices_used > 1


def test_the_result_carries_the_cost_model_that_timed_it():
    options = PlacementOptions(cost_model=CostModelSpec("roofline", memory_efficiency=0.9))
    r = place(recurrent_grid(2, 5), preset_inventory("dgx-h100", 1), options)
    assert r.cost_model is not None
    assert (r.cost_model.profile, r.cost_model.memory_efficiency, r.cost_model.launch_overhead_s) == (
        "roofline",
        0.9,
        0.0,
    )
    assert r.cost_sources == {"node_time_s": 0, "calibration": 0, "roofline": r.graph.n_ops}


def _timed_pair() -> dict:
    return {
        "nodes": [
            {"name": "a", "op": "MatMul", "inputs": ["x", "w"], "outputs": ["y"], "flops": 1e6, "time_s": 2e-3},
            {"name": "b", "op": "Relu", "inputs": ["y"], "outputs": ["z"], "flops": 1e3},
        ],
        "tensors": [
            {"name": "x", "bytes": 8},
            {"name": "w", "bytes": 8, "kind": "parameter"},
            {"name": "y", "bytes": 8},
            {"name": "z", "bytes": 8},
        ],
    }


def test_every_micro_batch_copy_of_a_timed_node_takes_its_time():
    options = PlacementOptions(micro_batches=3, cost_model=CostModelSpec("roofline"))
    ctx = placement_context(graph_from_json(_timed_pair()), preset_inventory("dgx-h100", 1), options)
    copies_of_a = np.flatnonzero(ctx.expanded.op_origin == 0)
    assert copies_of_a.size == 3
    np.testing.assert_allclose(ctx.op_times_s[copies_of_a, 0], 2e-3)


def test_a_plan_counts_the_operators_its_graph_timed():
    r = place(graph_from_json(_timed_pair()), preset_inventory("dgx-h100", 1), PlacementOptions())
    assert r.cost_sources == {"node_time_s": 1, "calibration": 0, "roofline": 1}
    assert r.makespan_s == pytest.approx(2e-3, rel=0.05)
