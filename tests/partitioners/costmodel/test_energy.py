"""Specification of a step's energy (partitioners.costmodel.energy) and the energy objectives.

Hand-built clusters with round power figures so every expected joule is arithmetic
written out in the test.
"""

from __future__ import annotations

import numpy as np
import pytest

from partitioners.costmodel.costs import CostModel
from partitioners.costmodel.energy import step_energy
from partitioners.errors import InvalidInput
from partitioners.graph.hypergraph import graph_from_ops
from partitioners.hardware.inventory import inventory_from_json, inventory_hash, inventory_to_json, preset_inventory
from partitioners.placement.engine import PlacementOptions, evaluate_placement, place

IDEAL = CostModel(efficiency=(1.0,) * 8, memory_efficiency=1.0, launch_overhead_s=0.0)
TFLOP = 1e12


def device(name, peak_flops, active_w=None, idle_w=None):
    doc = {
        "name": name,
        "type": name,
        "peak_flops": peak_flops,
        "memory_tiers": [{"name": "HBM", "capacity_bytes": 1e12, "bandwidth_bytes_per_s": 1e15}],
    }
    if active_w is not None:
        doc["active_power_w"] = active_w
        doc["idle_power_w"] = idle_w
    return doc


def two_device_cluster(fast=(100 * TFLOP, 700.0, 70.0), frugal=(50 * TFLOP, 150.0, 20.0), pj_per_bit=10.0):
    return inventory_from_json(
        {
            "name": "pair",
            "groups": [
                {
                    "name": "g0",
                    "devices": [device("fast", *fast), device("frugal", *frugal)],
                    "link": {"bandwidth_bytes_per_s": 1e9, "latency_s": 0.0, "energy_pj_per_bit": pj_per_bit},
                }
            ],
        }
    )


def compute_chain(n_ops=4, flops=TFLOP):
    """A chain of compute-bound operators: each 1 TFLOP over 8-byte tensors."""
    ops = [(f"op{i}", "MatMul", flops, [f"t{i}"], [f"t{i + 1}"]) for i in range(n_ops)]
    return graph_from_ops("chain", ops, {f"t{i}": 8.0 for i in range(n_ops + 1)})


def test_step_energy_adds_busy_idle_and_transfer_joules():
    inv = two_device_cluster(fast=(100 * TFLOP, 300.0, 50.0), frugal=(50 * TFLOP, 200.0, 40.0), pj_per_bit=10.0)
    energy = step_energy(
        inv,
        makespan_s=2.0,
        device_busy_s=np.array([1.5, 0.5]),
        counted_devices=[0, 1],
        link_src=[0],
        link_dst=[1],
        link_bytes=[1e9],
    )
    # busy: 1.5 s x 300 W + 0.5 s x 200 W; idle: 0.5 s x 50 W + 1.5 s x 40 W
    assert energy.compute_j == pytest.approx(450.0 + 100.0)
    assert energy.idle_j == pytest.approx(25.0 + 60.0)
    # 1e9 bytes x 8 bits x 10 pJ
    assert energy.transfer_j == pytest.approx(0.08)
    assert energy.total_j == pytest.approx(635.08)


def test_a_two_device_plan_pays_each_device_and_the_transfer_between_them():
    inv = two_device_cluster(fast=(100 * TFLOP, 300.0, 50.0), frugal=(100 * TFLOP, 200.0, 40.0), pj_per_bit=10.0)
    graph = graph_from_ops(
        "pair", [("a", "MatMul", TFLOP, ["x"], ["y"]), ("b", "MatMul", TFLOP, ["y"], ["z"])], {"x": 8, "y": 1e9, "z": 8}
    )
    result = evaluate_placement(graph, inv, np.array([0, 1]), cost_model=IDEAL)
    # a: 10 ms on "fast"; y: 1e9 bytes at 1 GB/s = 1 s; b: 10 ms on "frugal". Makespan 1.02 s.
    assert result.makespan_s == pytest.approx(1.02)
    expected = (0.01 * 300 + 1.01 * 50) + (0.01 * 200 + 1.01 * 40) + 1e9 * 8 * 10e-12
    assert result.energy is not None
    assert result.energy.total_j == pytest.approx(expected)


def test_energy_objective_moves_work_to_the_device_that_spends_fewer_joules():
    inv = two_device_cluster()
    options = {"count_idle_devices": False}
    by_makespan = place(compute_chain(), inv, PlacementOptions(**options), cost_model=IDEAL)
    by_energy = place(compute_chain(), inv, PlacementOptions(objective="energy", **options), cost_model=IDEAL)
    # 4 TFLOP: 40 ms at 700 W = 28 J on "fast", 80 ms at 150 W = 12 J on "frugal"
    assert set(by_makespan.placement.tolist()) == {0}
    assert set(by_energy.placement.tolist()) == {1}
    assert by_energy.energy is not None and by_energy.energy.total_j == pytest.approx(12.0)
    assert by_energy.makespan_s > by_makespan.makespan_s


def test_energy_delay_keeps_the_fast_device_when_the_frugal_one_is_too_slow():
    inv = two_device_cluster(frugal=(40 * TFLOP, 150.0, 20.0))
    options = {"count_idle_devices": False}
    by_energy = place(compute_chain(), inv, PlacementOptions(objective="energy", **options), cost_model=IDEAL)
    by_edp = place(compute_chain(), inv, PlacementOptions(objective="energy_delay", **options), cost_model=IDEAL)
    # frugal: 0.1 s x 150 W = 15 J, x 0.1 s = 1.5 J s; fast: 0.04 s x 700 W = 28 J, x 0.04 s = 1.12 J s
    assert set(by_energy.placement.tolist()) == {1}
    assert set(by_edp.placement.tolist()) == {0}


def test_devices_held_idle_are_counted_unless_the_caller_frees_them():
    inv = two_device_cluster()
    held = place(compute_chain(), inv, PlacementOptions(strategy="single"), cost_model=IDEAL)
    freed = place(compute_chain(), inv, PlacementOptions(strategy="single", count_idle_devices=False), cost_model=IDEAL)
    assert held.energy is not None and freed.energy is not None
    assert (held.energy.devices_counted, freed.energy.devices_counted) == (2, 1)
    # the idle "frugal" device draws 20 W for the 40 ms step
    assert held.energy.total_j - freed.energy.total_j == pytest.approx(0.04 * 20.0)


def test_energy_objective_without_power_figures_names_the_devices():
    inv = inventory_from_json(
        {
            "name": "bare",
            "groups": [{"name": "g", "devices": [device("d0", TFLOP)], "link": {"bandwidth_bytes_per_s": 1e9}}],
        }
    )
    with pytest.raises(InvalidInput, match="d0") as err:
        place(compute_chain(), inv, PlacementOptions(objective="energy"), cost_model=IDEAL)
    assert err.value.field == "options.objective"


def test_a_plan_without_power_figures_has_no_energy():
    inv = inventory_from_json(
        {
            "name": "bare",
            "groups": [{"name": "g", "devices": [device("d0", TFLOP)], "link": {"bandwidth_bytes_per_s": 1e9}}],
        }
    )
    assert place(compute_chain(), inv, cost_model=IDEAL).energy is None


def test_a_device_with_one_power_figure_is_refused_naming_the_other():
    doc = device("d0", TFLOP)
    doc["active_power_w"] = 300.0
    with pytest.raises(InvalidInput) as err:
        inventory_from_json({"groups": [{"name": "g", "devices": [doc]}]})
    assert err.value.field == "inventory.groups[0].devices[0].idle_power_w"


def test_idle_power_above_active_power_is_refused():
    with pytest.raises(InvalidInput, match="exceeds"):
        inventory_from_json({"groups": [{"name": "g", "devices": [device("d0", TFLOP, 100.0, 200.0)]}]})


def test_presets_carry_board_and_idle_power_from_the_catalogue():
    inv = preset_inventory("dgx-h100")
    assert inv.device_active_power_w is not None and inv.device_idle_power_w is not None
    assert np.all(inv.device_active_power_w == 700.0)  # H100 SXM5 datasheet TDP
    assert np.all(inv.device_idle_power_w < inv.device_active_power_w)


def test_power_figures_survive_the_canonical_json_and_change_the_hash():
    inv = two_device_cluster()
    again = inventory_from_json(inventory_to_json(inv))
    assert np.array_equal(again.device_active_power_w, inv.device_active_power_w)
    assert again.group_link_energy_j_per_byte == pytest.approx(inv.group_link_energy_j_per_byte)
    hotter = two_device_cluster(fast=(100 * TFLOP, 800.0, 70.0))
    assert inventory_hash(hotter) != inventory_hash(inv)
