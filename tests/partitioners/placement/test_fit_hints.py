"""Specification of the "does not fit" hint (partitioners.placement.fit_hints) and where it is raised."""

from __future__ import annotations

import pytest

from partitioners.costmodel.costs import CostModel
from partitioners.errors import DoesNotFit
from partitioners.graph.hypergraph import graph_from_ops
from partitioners.hardware.inventory import inventory_from_json
from partitioners.placement.engine import PlacementOptions, place

IDEAL = CostModel(efficiency=(1.0,) * 8, memory_efficiency=1.0, launch_overhead_s=0.0)
AT_MINIMUM_NAMES = ("micro_batches", "memory_headroom_fraction", "max_devices", "mode=inference")


def cluster(n_devices: int, hbm_bytes: float):
    return inventory_from_json(
        {
            "name": "small",
            "groups": [
                {
                    "name": "g",
                    "devices": [
                        {
                            "name": f"d{i}",
                            "type": "T",
                            "peak_flops": 1e12,
                            "memory_tiers": [
                                {"name": "HBM", "capacity_bytes": hbm_bytes, "bandwidth_bytes_per_s": 1e12}
                            ],
                        }
                        for i in range(n_devices)
                    ],
                    "link": {"bandwidth_bytes_per_s": 1e9, "latency_s": 0.0},
                }
            ],
        }
    )


def chain(n_ops: int, tensor_bytes: float, param_bytes: float):
    ops, sizes, params = [], {"t0": tensor_bytes}, set()
    for i in range(n_ops):
        sizes[f"w{i}"] = param_bytes
        params.add(f"w{i}")
        ops.append((f"op{i}", "MatMul", 1e9, [f"t{i}", f"w{i}"], [f"t{i + 1}"]))
        sizes[f"t{i + 1}"] = tensor_bytes
    return graph_from_ops("chain", ops, sizes, params)


def refusal(graph, inventory, options: PlacementOptions) -> str:
    with pytest.raises(DoesNotFit) as caught:
        place(graph, inventory, options, cost_model=IDEAL)
    assert caught.value.code == "does-not-fit"
    return caught.value.detail


def test_a_plan_over_memory_with_every_option_at_its_minimum_names_no_option_to_lower():
    # four 0.6 MB weights on two 1 MB devices: no split fits
    detail = refusal(chain(4, 1000.0, 600_000.0), cluster(2, 1_000_000), PlacementOptions())
    assert "more devices" in detail and "smaller batch" in detail
    assert not [name for name in AT_MINIMUM_NAMES if name in detail], detail


def test_a_plan_over_memory_names_each_option_above_its_minimum_with_its_value():
    # eight 0.1 MB weights with gradients and optimizer state on one 0.9 MB budget
    options = PlacementOptions(mode="training", micro_batches=4, memory_headroom_fraction=0.1, max_devices=1)
    detail = refusal(chain(8, 1000.0, 100_000.0), cluster(2, 1_000_000), options)
    assert "a higher max_devices (now 1 of the inventory's 2)" in detail
    assert "memory_headroom_fraction (now 0.1)" in detail
    assert "fewer micro_batches (now 4)" in detail
    assert "mode=inference" in detail


def test_when_one_operator_alone_exceeds_every_device_more_devices_are_not_suggested():
    detail = refusal(chain(2, 1000.0, 2_000_000.0), cluster(4, 1_000_000), PlacementOptions())
    assert "devices with more memory" in detail and "more devices (" not in detail


def test_max_devices_covering_the_whole_inventory_is_not_suggested_higher():
    detail = refusal(chain(4, 1000.0, 600_000.0), cluster(2, 1_000_000), PlacementOptions(max_devices=2))
    assert "max_devices" not in detail and "more devices" in detail
