"""Named cost-model profiles, explicit parameters, launch modes and node times, on hand-built cases."""

from __future__ import annotations

import numpy as np
import pytest

from partitioners.costmodel.costs import CostModel, cost_model_to_json, cost_sources, op_times_s
from partitioners.costmodel.profiles import (
    DEFAULT_PROFILE,
    PROFILES,
    CostModelSpec,
    cost_model_spec_from_json,
    resolve_cost_model,
)
from partitioners.costmodel.simulator import simulate
from partitioners.errors import InvalidInput
from partitioners.graph.hypergraph import graph_from_ops
from partitioners.graph.json_import import graph_from_json
from partitioners.hardware.inventory import inventory_from_json

GB = 1e9


def _inventory(n_devices: int = 2, types: list[str] | None = None, cost_model: dict | None = None) -> dict:
    types = types or ["gpu"] * n_devices
    devices = [
        {
            "name": f"d{i}",
            "type": types[i],
            "peak_flops": 1e12,
            "memory_tiers": [{"name": "hbm", "capacity_bytes": 1e12, "bandwidth_bytes_per_s": GB}],
        }
        for i in range(n_devices)
    ]
    if cost_model is not None:
        devices[0]["cost_model"] = cost_model
    return {"name": "t", "groups": [{"name": "g", "devices": devices, "link": {"bandwidth_bytes_per_s": GB}}]}


def _two_independent_ops():
    """Two operators of 1 MFLOP each, no data between them (1 us at 1 TFLOP/s, efficiency 1)."""
    return graph_from_ops(
        "pair", [("a", "MatMul", 1e6, ["x"], ["ya"]), ("b", "MatMul", 1e6, ["x"], ["yb"])], {"x": 0, "ya": 0, "yb": 0}
    )


def test_roofline_profile_has_no_launch_cost_and_peak_efficiency():
    model = PROFILES["roofline"]
    assert model.launch_overhead_s == 0.0
    assert model.efficiency == (1.0,) * 8
    assert model.memory_efficiency == 1.0 and model.link_efficiency == 1.0


def test_roofline_times_an_operator_at_its_flops_over_peak():
    times = op_times_s(
        _two_independent_ops(), inventory_from_json(_inventory(1)), resolve_cost_model(CostModelSpec("roofline"))
    )
    np.testing.assert_allclose(times[:, 0], [1e-6, 1e-6])


def test_the_default_is_the_eager_profile_launched_from_one_host():
    model = resolve_cost_model()
    assert DEFAULT_PROFILE == "eager" and model == PROFILES["eager"] == CostModel()
    assert model.launch == "single-controller" and model.launch_overhead_s == 5e-6


def test_cuda_graphs_profile_launches_cheaply_per_device():
    model = PROFILES["cuda-graphs"]
    assert model.launch == "per-device"
    assert 0 < model.launch_overhead_s < PROFILES["eager"].launch_overhead_s


def test_explicit_parameters_override_the_profile():
    spec = CostModelSpec("roofline", launch_overhead_s=2e-6, compute_efficiency=(("matmul", 0.5),), launch="per-device")
    model = resolve_cost_model(spec)
    assert model.profile == "roofline" and model.launch_overhead_s == 2e-6 and model.efficiency[0] == 0.5
    assert model.efficiency[1:] == (1.0,) * 7


def test_single_controller_serialises_launches_across_devices():
    # each op: 1 us of compute + 10 us launch; on two devices the one host launches
    # a over [0, 10] us and b over [10, 20] us, so b runs [10, 21] and ends at 21 us
    model = resolve_cost_model(CostModelSpec("roofline", launch_overhead_s=10e-6, launch="single-controller"))
    r = simulate(_two_independent_ops(), inventory_from_json(_inventory(2)), np.array([0, 1]), cost_model=model)
    assert sorted(r.op_start_s.tolist()) == pytest.approx([0.0, 10e-6])
    assert r.makespan_s == pytest.approx(21e-6)


def test_per_device_launches_run_in_parallel():
    model = resolve_cost_model(CostModelSpec("roofline", launch_overhead_s=10e-6, launch="per-device"))
    r = simulate(_two_independent_ops(), inventory_from_json(_inventory(2)), np.array([0, 1]), cost_model=model)
    assert r.makespan_s == pytest.approx(11e-6)


def test_one_device_never_waits_for_the_single_controller():
    spec = CostModelSpec("roofline", launch_overhead_s=10e-6)
    one = simulate(
        _two_independent_ops(),
        inventory_from_json(_inventory(2)),
        np.array([0, 0]),
        cost_model=resolve_cost_model(spec),
    )
    per_device = simulate(
        _two_independent_ops(),
        inventory_from_json(_inventory(2)),
        np.array([0, 0]),
        cost_model=resolve_cost_model(CostModelSpec("roofline", launch_overhead_s=10e-6, launch="per-device")),
    )
    assert one.makespan_s == pytest.approx(per_device.makespan_s) == pytest.approx(22e-6)


def test_link_efficiency_stretches_transfers():
    g = graph_from_ops(
        "send", [("a", "Relu", 0, ["x"], ["y"]), ("b", "Relu", 0, ["y"], ["z"])], {"x": 0, "y": GB, "z": 0}
    )
    inv = inventory_from_json(_inventory(2))
    half = resolve_cost_model(CostModelSpec("roofline", link_efficiency=0.5))
    r = simulate(g, inv, np.array([0, 1]), cost_model=half)
    assert r.transfer_end_s[0] - r.transfer_start_s[0] == pytest.approx(2.0)  # 1 GB at half of 1 GB/s


def test_inventory_device_cost_model_overrides_that_device_only():
    inv = inventory_from_json(_inventory(2, cost_model={"launch_overhead_s": 7e-6}))
    model = resolve_cost_model(CostModelSpec("roofline"), inv)
    times = op_times_s(_two_independent_ops(), inv, model)
    np.testing.assert_allclose(times[0], [1e-6 + 7e-6, 1e-6])


def test_unknown_profile_names_the_field():
    with pytest.raises(InvalidInput) as err:
        cost_model_spec_from_json({"profile": "tpu-magic"})
    assert err.value.field == "options.cost_model.profile"


def test_negative_launch_overhead_names_the_field():
    with pytest.raises(InvalidInput) as err:
        cost_model_spec_from_json({"launch_overhead_s": -1e-6})
    assert err.value.field == "options.cost_model.launch_overhead_s"


def test_a_profile_name_alone_is_a_spec():
    assert cost_model_spec_from_json("cuda-graphs") == CostModelSpec("cuda-graphs")


def test_the_json_form_echoes_the_profile_and_its_parameters():
    doc = cost_model_to_json(resolve_cost_model(CostModelSpec("cuda-graphs", memory_efficiency=0.7)))
    assert doc["profile"] == "cuda-graphs" and doc["launch"] == "per-device"
    assert doc["memory_efficiency"] == 0.7 and doc["launch_overhead_s"] == PROFILES["cuda-graphs"].launch_overhead_s


def _timed_graph(time_s: object) -> dict:
    return {
        "nodes": [
            {"name": "a", "op": "MatMul", "inputs": ["x"], "outputs": ["y"], "flops": 1e6, "time_s": time_s},
            {"name": "b", "op": "MatMul", "inputs": ["y"], "outputs": ["z"], "flops": 1e6},
        ],
        "tensors": [{"name": "x", "bytes": 0}, {"name": "y", "bytes": 0}, {"name": "z", "bytes": 0}],
    }


def test_a_node_time_replaces_the_roofline_of_that_operator():
    g = graph_from_json(_timed_graph(3e-3))
    times = op_times_s(g, inventory_from_json(_inventory(1)), resolve_cost_model(CostModelSpec("roofline")))
    np.testing.assert_allclose(times[:, 0], [3e-3, 1e-6])


def test_a_node_time_per_device_type_applies_to_devices_of_that_type():
    g = graph_from_json(_timed_graph({"h100": 2e-3}))
    inv = inventory_from_json(_inventory(2, types=["h100", "a100"]))
    times = op_times_s(g, inv, resolve_cost_model(CostModelSpec("roofline")))
    np.testing.assert_allclose(times[0], [2e-3, 1e-6])  # the a100 has no time of its own: roofline


def test_node_time_wins_over_calibration():
    g = graph_from_json(_timed_graph(3e-3))
    inv = inventory_from_json(_inventory(1))
    calibrated = CostModel(
        efficiency=(1.0,) * 8,
        memory_efficiency=1.0,
        launch_overhead_s=0.0,
        device_class_multiplier={("*", "matmul"): 4.0},
    )
    np.testing.assert_allclose(op_times_s(g, inv, calibrated)[:, 0], [3e-3, 4e-6])
    assert cost_sources(g, inv, calibrated, np.array([0, 0])) == {"node_time_s": 1, "calibration": 1, "roofline": 0}


def test_cost_sources_count_every_operator_once():
    g = graph_from_json(_timed_graph(3e-3))
    inv = inventory_from_json(_inventory(1))
    assert cost_sources(g, inv, CostModel(), np.array([0, 0])) == {"node_time_s": 1, "calibration": 0, "roofline": 1}


def test_single_controller_issues_a_copy_between_devices_on_the_host_too():
    # a (1 us) on d0 -> 0-byte tensor -> b (1 us) on d1, launch 10 us each:
    # a launches [0, 10], runs to 11; its copy is issued [11, 21]; b launches [21, 31], ends at 32
    g = graph_from_ops(
        "send", [("a", "MatMul", 1e6, ["x"], ["y"]), ("b", "MatMul", 1e6, ["y"], ["z"])], {"x": 0, "y": 0, "z": 0}
    )
    model = resolve_cost_model(CostModelSpec("roofline", launch_overhead_s=10e-6, launch="single-controller"))
    r = simulate(g, inventory_from_json(_inventory(2)), np.array([0, 1]), cost_model=model)
    assert r.transfer_start_s.tolist() == pytest.approx([21e-6])
    assert r.makespan_s == pytest.approx(32e-6)


def test_a_plain_node_time_applies_on_a_type_other_nodes_give_times_for():
    g_doc = _timed_graph(3e-3)
    g_doc["nodes"][1]["time_s"] = {"h100": 4e-3}
    g = graph_from_json(g_doc)
    times = op_times_s(
        g, inventory_from_json(_inventory(1, types=["h100"])), resolve_cost_model(CostModelSpec("roofline"))
    )
    np.testing.assert_allclose(times[:, 0], [3e-3, 4e-3])


def test_an_efficiency_near_zero_is_refused_before_it_makes_times_infinite():
    with pytest.raises(InvalidInput) as err:
        cost_model_spec_from_json({"compute_efficiency": {"matmul": 1e-300}})
    assert err.value.field == "options.cost_model.compute_efficiency.matmul"
