"""Specification of planning an exported training step (a graph that declares its backward
pass and optimizer): what memory and gradient traffic its plans count.

The graph is the docs/api.md example (tests/partitioners/training_step.py): a two-layer
MLP, parameters w1 (4,000 bytes) and w2 (2,000), gradients dw1 and dw2 as large, and two
Adam moments per parameter (w1.m, w1.v: 4,000 each; w2.m, w2.v: 2,000 each). Every
expected figure is added up by hand in the test.
"""

from __future__ import annotations

import numpy as np
import pytest

from partitioners.costmodel.costs import CostModel
from partitioners.graph.json_import import graph_from_json
from partitioners.graph.transforms import PHASE_BACKWARD, PHASE_OPTIMIZER
from partitioners.hardware.inventory import inventory_from_json
from partitioners.placement.engine import PlacementOptions, evaluate_placement, place
from tests.partitioners.training_step import mlp_training_step

IDEAL = CostModel(efficiency=(1.0,) * 8, memory_efficiency=1.0, launch_overhead_s=0.0)


def two_devices():
    device = {
        "type": "T",
        "peak_flops": 1e12,
        "memory_tiers": [{"name": "HBM", "capacity_bytes": 1e9, "bandwidth_bytes_per_s": 1e15}],
    }
    return inventory_from_json(
        {
            "name": "pair",
            "groups": [
                {
                    "name": "g0",
                    "devices": [{"name": "d0", **device}, {"name": "d1", **device}],
                    "link": {"bandwidth_bytes_per_s": 1e9, "latency_s": 0.0},
                }
            ],
        }
    )


def step():
    return graph_from_json(mlp_training_step())


def state_of(result):
    s = result.training_state()
    return {
        "parameters": s.parameter_bytes.tolist(),
        "gradients": s.gradient_bytes.tolist(),
        "optimizer_state": s.optimizer_state_bytes.tolist(),
    }


def test_one_device_holds_parameters_gradients_and_optimizer_state_once():
    result = place(step(), two_devices(), PlacementOptions(mode="training", strategy="single"), cost_model=IDEAL)
    parameters = 4000 + 2000  # w1, w2
    gradients = 4000 + 2000  # dw1, dw2
    optimizer_state = 2 * 4000 + 2 * 2000  # w1.m, w1.v, w2.m, w2.v
    assert state_of(result) == {
        "parameters": [parameters, 0.0],
        "gradients": [gradients, 0.0],
        "optimizer_state": [optimizer_state, 0.0],
    }
    # the simulator holds parameters and optimizer state resident, gradients among the live tensors
    assert result.simulation.param_memory_bytes[0] == parameters + optimizer_state
    assert result.simulation.peak_memory_bytes[0] >= parameters + optimizer_state + gradients
    assert result.simulation.comm_bytes == 0.0


def test_a_declared_step_is_planned_as_it_is_nothing_synthesised():
    graph = step()
    result = place(graph, two_devices(), PlacementOptions(mode="training", strategy="single"), cost_model=IDEAL)
    assert result.graph.op_names.tolist() == graph.op_names.tolist()
    assert result.graph.n_tensors == graph.n_tensors
    assert any("planned as it is" in note for note in result.notes)


def test_inference_mode_on_a_declared_step_plans_the_training_step_and_says_so():
    inference = place(step(), two_devices(), PlacementOptions(mode="inference", strategy="single"), cost_model=IDEAL)
    training = place(step(), two_devices(), PlacementOptions(mode="training", strategy="single"), cost_model=IDEAL)
    assert inference.expanded.mode == "training"
    assert state_of(inference) == state_of(training)
    assert inference.makespan_s == training.makespan_s
    assert any("options.mode is 'inference'" in note for note in inference.notes)


def test_two_micro_batches_on_one_device_still_hold_one_gradient_per_parameter():
    options = PlacementOptions(mode="training", micro_batches=2, strategy="single")
    result = place(step(), two_devices(), options, cost_model=IDEAL)
    # dw1@mb0 + dw1@mb1 + dw2@mb0 + dw2@mb1: each micro-batch's half of one accumulated gradient
    assert state_of(result)["gradients"] == [2000 + 2000 + 1000 + 1000, 0.0]
    assert state_of(result)["parameters"] == [6000, 0.0]
    assert result.simulation.comm_bytes == 0.0


def _data_parallel(result_graph, op_micro_batch):
    """Micro-batch 0 and adam_w1 on d0, micro-batch 1 and adam_w2 on d1."""
    placement = np.where(op_micro_batch == 1, 1, 0)
    placement[result_graph.op_names == "adam_w2"] = 1
    return placement


def test_gradient_reduction_across_two_devices_is_charged_as_hand_computed():
    graph = step()
    options = PlacementOptions(mode="training", micro_batches=2)
    probe = evaluate_placement(graph, two_devices(), np.zeros(14, dtype=np.int64), options, cost_model=IDEAL)
    placement = _data_parallel(probe.graph, probe.expanded.op_micro_batch)
    result = evaluate_placement(graph, two_devices(), placement, options, cost_model=IDEAL)

    # adam_w1 on d0 needs dw1@mb1 (half of dw1's 4,000 bytes) from d1; adam_w2 on d1 needs
    # dw2@mb0 (half of dw2's 2,000 bytes) from d0. Each micro-batch's activations stay home.
    names = result.graph.tensor_names
    moved = sorted(
        (str(names[t]), int(s), int(d), float(b))
        for t, s, d, b in zip(
            result.transfers.tensor, result.transfers.src, result.transfers.dst, result.transfers.bytes
        )
    )
    assert moved == [("dw1@mb1", 1, 0, 2000.0), ("dw2@mb0", 0, 1, 1000.0)]
    assert result.simulation.comm_bytes == 2000 + 1000

    assert state_of(result) == {
        # both devices run a forward and backward pass: both hold both weights
        "parameters": [4000 + 2000, 4000 + 2000],
        # d0: dw1@mb0 and dw1@mb1 (2,000 each) and dw2@mb0 (1,000); d1: dw1@mb1, dw2@mb1, dw2@mb0
        "gradients": [2000 + 2000 + 1000, 2000 + 1000 + 1000],
        # the moments live with their optimizer operator
        "optimizer_state": [4000 + 4000, 2000 + 2000],
    }


def test_optimizer_operators_run_after_every_micro_batch_backward_pass():
    options = PlacementOptions(mode="training", micro_batches=2)
    result = place(step(), two_devices(), options, cost_model=IDEAL)
    sim, phase = result.simulation, result.expanded.op_phase
    assert sim.op_start_s[phase == PHASE_OPTIMIZER].min() >= sim.op_end_s[phase == PHASE_BACKWARD].max()


@pytest.mark.parametrize("strategy", ["auto", "hybrid"])
def test_data_parallel_plan_of_the_step_counts_the_reduction(strategy):
    options = PlacementOptions(mode="training", micro_batches=2, strategy=strategy)
    result = place(step(), two_devices(), options, cost_model=IDEAL)
    assert result.strategy == "hybrid-1x2"  # the layout the figures below are added up for
    assert result.simulation.comm_bytes == 2000 + 1000
    # hybrid-1x2: micro-batch i on device i, the heavier adam_w1 on d0 and adam_w2 on d1,
    # exactly the layout of the test above
    assert state_of(result) == {
        "parameters": [6000, 6000],
        "gradients": [5000, 4000],
        "optimizer_state": [8000, 4000],
    }
