"""Specification of the cluster inventory: presets, JSON validation, links, re-planning edits."""

from __future__ import annotations

import math

import numpy as np
import pytest

from partitioners.errors import InputTooLarge, InvalidInput
from partitioners.hardware.inventory import (
    PRESETS,
    inventory_from_json,
    inventory_hash,
    inventory_to_json,
    link_between,
    link_class,
    link_class_ids,
    preset_inventory,
    with_device_speed,
    without_devices,
)


def _device(name: str, peak=1e12, tiers=None, type_="t"):
    return {
        "name": name,
        "type": type_,
        "peak_flops": peak,
        "memory_tiers": tiers or [{"name": "HBM", "capacity_bytes": 1e9, "bandwidth_bytes_per_s": 1e12}],
    }


def _doc(*groups: list[dict]) -> dict:
    return {
        "name": "c",
        "groups": [
            {"name": f"g{i}", "devices": devs, "link": {"bandwidth_bytes_per_s": 1e11, "latency_s": 1e-6}}
            for i, devs in enumerate(groups)
        ],
        "link": {"bandwidth_bytes_per_s": 1e10, "latency_s": 5e-6},
    }


@pytest.mark.parametrize(
    "preset, nodes, devices, per_group",
    [
        ("dgx-h100", 2, 16, 8),
        ("dgx-a100", 3, 24, 8),
        ("dgx-b200", 1, 8, 8),
        ("gb200-nvl72", 2, 144, 72),
        ("ascend-910b", 4, 32, 8),
        ("pcie-workstation", 1, 4, 4),
    ],
)
def test_presets_expand_to_the_right_device_and_group_counts(preset, nodes, devices, per_group):
    inv = preset_inventory(preset, nodes)
    assert inv.n_devices == devices
    assert inv.n_groups == nodes
    assert np.bincount(inv.device_group).tolist() == [per_group] * nodes
    assert len(set(inv.device_names.tolist())) == devices
    assert np.all(inv.device_peak_flops > 0) and np.all(inv.device_memory_bytes > 0)


def test_dgx_h100_carries_the_spec_sheet_figures():
    inv = inventory_from_json({"preset": "dgx-h100", "nodes": 2})
    assert inv.device_names[9] == "node1/gpu1"
    # "80 GB" of HBM3 is 80 GiB, of which the driver hands a process 79.11 GiB
    assert inv.device_memory_bytes[0] == 79.11 * 2**30
    assert inv.device_memory_bandwidth_bytes_per_s[0] == 3.35e12
    assert inv.device_peak_flops[0] == 989.4e12
    assert inv.device_peak_flops_by_dtype["fp8"][0] == 1978.9e12
    assert inv.tier_names == ("HBM", "L2", "SMEM")
    assert link_between(inv, 0, 1).bandwidth_bytes_per_s == 450e9
    assert link_between(inv, "node0/gpu0", "node1/gpu0").bandwidth_bytes_per_s == 50e9


def test_a100_has_no_fp8_peak():
    inv = preset_inventory("dgx-a100")
    assert np.isnan(inv.device_peak_flops_by_dtype.get("fp8", np.array([np.nan]))[0])
    assert inv.device_peak_flops_by_dtype["fp32"][0] == 19.5e12


def test_a_preset_times_at_the_default_dtype_asked_for_and_hashes_apart():
    tf32 = inventory_from_json({"preset": "dgx-h100", "nodes": 1, "default_dtype": "tf32"})
    assert tf32.default_dtype == "tf32"
    assert tf32.device_peak_flops[0] == 494.7e12
    assert inventory_hash(tf32) != inventory_hash(preset_inventory("dgx-h100"))
    assert inventory_from_json(inventory_to_json(tf32)).device_peak_flops[0] == 494.7e12


def test_a_preset_asked_for_a_dtype_its_spec_sheet_lacks_names_default_dtype_and_what_it_has():
    with pytest.raises(InvalidInput) as err:
        inventory_from_json({"preset": "ascend-910b", "nodes": 1, "default_dtype": "tf32"})
    assert err.value.field == "inventory.default_dtype"
    assert "bf16, fp16" in err.value.detail


def test_unknown_preset_lists_the_valid_ones():
    with pytest.raises(InvalidInput) as err:
        inventory_from_json({"preset": "dgx-h200", "nodes": 1})
    assert err.value.field == "inventory.preset"
    for name in PRESETS:
        assert name in err.value.detail


@pytest.mark.parametrize("nodes", [0, -1, 4097, 1.5, "2", True])
def test_nodes_out_of_range_names_the_field(nodes):
    with pytest.raises(InvalidInput) as err:
        inventory_from_json({"preset": "dgx-h100", "nodes": nodes})
    assert err.value.field == "inventory.nodes"


def test_group_without_devices_names_the_field():
    with pytest.raises(InvalidInput) as err:
        inventory_from_json(_doc([_device("a")], []))
    assert err.value.field == "inventory.groups[1].devices"


@pytest.mark.parametrize("devices", [3, 1.5, True, "gpu"])
def test_devices_that_are_not_a_list_name_the_field(devices):
    with pytest.raises(InvalidInput) as err:
        inventory_from_json({"name": "x", "groups": [{"name": "g", "devices": devices}]})
    assert err.value.field == "inventory.groups[0].devices"


def test_no_groups_is_rejected():
    with pytest.raises(InvalidInput) as err:
        inventory_from_json({"name": "x", "groups": []})
    assert err.value.field == "inventory.groups"


@pytest.mark.parametrize(
    "tiers, field",
    [
        ([{"name": "HBM", "capacity_bytes": 0, "bandwidth_bytes_per_s": 1e12}], "capacity_bytes"),
        ([{"name": "HBM", "capacity_bytes": 1e9, "bandwidth_bytes_per_s": -1}], "bandwidth_bytes_per_s"),
        ([{"name": "HBM", "capacity_bytes": float("nan"), "bandwidth_bytes_per_s": 1}], "capacity_bytes"),
    ],
)
def test_non_positive_tier_figures_name_the_field(tiers, field):
    with pytest.raises(InvalidInput) as err:
        inventory_from_json(_doc([_device("a", tiers=tiers)]))
    assert err.value.field == f"inventory.groups[0].devices[0].memory_tiers[0].{field}"


def test_non_positive_link_bandwidth_names_the_field():
    doc = _doc([_device("a"), _device("b")])
    doc["groups"][0]["link"]["bandwidth_bytes_per_s"] = 0
    with pytest.raises(InvalidInput) as err:
        inventory_from_json(doc)
    assert err.value.field == "inventory.groups[0].link.bandwidth_bytes_per_s"


@pytest.mark.parametrize(
    "edit, field",
    [
        (lambda doc: doc["groups"][0]["devices"][0].update(peak_flops=1e-300), "groups[0].devices[0].peak_flops"),
        (
            lambda doc: doc["groups"][0]["devices"][0].update(peak_flops={"bf16": 1e300}),
            "groups[0].devices[0].peak_flops.bf16",
        ),
        (
            lambda doc: doc["groups"][0]["devices"][0]["memory_tiers"][0].update(bandwidth_bytes_per_s=5e-324),
            "groups[0].devices[0].memory_tiers[0].bandwidth_bytes_per_s",
        ),
        # summed over devices, 1.7e308 bytes is infinite: "needs 100 MB, 0 B over its budget"
        (
            lambda doc: doc["groups"][0]["devices"][0]["memory_tiers"][0].update(capacity_bytes=1.7e308),
            "groups[0].devices[0].memory_tiers[0].capacity_bytes",
        ),
        (
            lambda doc: doc["groups"][0]["link"].update(bandwidth_bytes_per_s=1e-300),
            "groups[0].link.bandwidth_bytes_per_s",
        ),
        (lambda doc: doc["link"].update(bandwidth_bytes_per_s=1.7e308), "link.bandwidth_bytes_per_s"),
        (lambda doc: doc["link"].update(latency_s=1e300), "link.latency_s"),
        (
            lambda doc: doc.update(bandwidth_matrix_bytes_per_s=[[0, 1e-300], [1e-300, 0]]),
            "bandwidth_matrix_bytes_per_s",
        ),
    ],
)
def test_hardware_figures_beyond_any_real_device_are_rejected_naming_the_field_and_the_range(edit, field):
    # a rate of 1e-300 B/s or FLOP/s would make every predicted time infinite
    doc = _doc([_device("a"), _device("b")])
    edit(doc)
    with pytest.raises(InvalidInput) as err:
        inventory_from_json(doc)
    assert err.value.field == f"inventory.{field}"
    assert err.value.code == "out-of-range" and "must be between" in str(err.value)


def test_duplicate_device_names_are_rejected_naming_the_second():
    with pytest.raises(InvalidInput) as err:
        inventory_from_json(_doc([_device("a")], [_device("a")]))
    assert err.value.field == "inventory.groups[1].devices[0].name"
    assert "appears twice" in err.value.detail


def test_duplicate_group_names_are_rejected_naming_the_second_and_the_name():
    doc = _doc([_device("a")], [_device("b")])
    doc["groups"][1]["name"] = "g0"
    with pytest.raises(InvalidInput) as err:
        inventory_from_json(doc)
    assert err.value.field == "inventory.groups[1].name"
    assert err.value.code == "duplicate-name"
    assert err.value.detail == (
        "group name 'g0' appears twice (inventory.groups[0] and inventory.groups[1]); names must be unique"
    )


def test_a_group_name_with_a_nul_character_is_rejected():
    doc = _doc([_device("a")])
    doc["groups"][0]["name"] = "g\x00"
    with pytest.raises(InvalidInput) as err:
        inventory_from_json(doc)
    assert err.value.field == "inventory.groups[0].name"


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_every_preset_on_many_nodes_has_unique_group_and_device_names(preset):
    inv = inventory_from_json({"preset": preset, "nodes": 16})
    assert len(set(inv.group_names)) == inv.n_groups == 16
    assert len(set(inv.device_names)) == inv.n_devices


def test_peak_flops_object_must_include_the_default_dtype():
    with pytest.raises(InvalidInput) as err:
        inventory_from_json(_doc([_device("a", peak={"fp32": 1e12})]))
    assert err.value.field == "inventory.groups[0].devices[0].peak_flops"


def test_peak_flops_number_is_the_default_dtype():
    inv = inventory_from_json(_doc([_device("a", peak=2e12)]))
    assert inv.device_peak_flops.tolist() == [2e12]
    assert inv.device_peak_flops_by_dtype == {"bf16": inv.device_peak_flops_by_dtype["bf16"]}


def test_too_many_devices_is_input_too_large():
    big = _doc([_device("d")] * 300_001)  # the size is checked before anything else
    with pytest.raises(InputTooLarge):
        inventory_from_json(big)


def test_heterogeneous_cluster_keeps_per_device_figures_and_tier_names():
    l40s_tiers = [
        {"name": "GDDR6", "capacity_bytes": 48e9, "bandwidth_bytes_per_s": 864e9},
        {"name": "L2", "capacity_bytes": 96e6, "bandwidth_bytes_per_s": 2e12},
    ]
    inv = inventory_from_json(
        _doc(
            [
                _device("h0", peak={"bf16": 989e12, "fp8": 1979e12}, type_="H100"),
                _device("h1", peak=989e12, type_="H100"),
            ],
            [_device("l0", peak=181e12, tiers=l40s_tiers, type_="L40S")],
        )
    )
    assert inv.device_types.tolist() == ["H100", "H100", "L40S"]
    assert inv.device_group.tolist() == [0, 0, 1]
    assert inv.device_memory_bytes.tolist() == [1e9, 1e9, 48e9]
    assert inv.device_peak_flops.tolist() == [989e12, 989e12, 181e12]
    assert np.isnan(inv.device_peak_flops_by_dtype["fp8"][1])
    assert inv.tier_names == ("HBM", "GDDR6", "L2")


def test_json_round_trip_preserves_the_hash_and_a_preset_hashes_like_its_expansion():
    inv = preset_inventory("dgx-h100", 2)
    doc = inventory_to_json(inv)
    again = inventory_from_json(doc)
    assert inventory_hash(again) == inventory_hash(inv)
    assert inventory_to_json(again) == doc
    assert len(inventory_hash(inv)) == 64


def test_a_one_device_group_without_a_link_hashes_and_round_trips():
    doc = _doc([_device("a"), _device("b")])
    doc["groups"].append({"name": "host", "devices": [_device("cpu", peak=1e11, type_="cpu")]})
    inv = inventory_from_json(doc)
    again = inventory_from_json(inventory_to_json(inv))
    assert inventory_hash(again) == inventory_hash(inv)
    assert math.isinf(again.group_link_bandwidth_bytes_per_s[1])


def test_hash_changes_with_the_cluster_but_not_its_name():
    a = inventory_from_json(_doc([_device("a"), _device("b")]))
    renamed = inventory_from_json({**_doc([_device("a"), _device("b")]), "name": "other"})
    faster = inventory_from_json(_doc([_device("a", peak=2e12), _device("b")]))
    assert inventory_hash(a) == inventory_hash(renamed)
    assert inventory_hash(a) != inventory_hash(faster)


def test_link_classes_follow_the_groups():
    inv = preset_inventory("dgx-h100", 2)
    assert link_class(inv, 0, 0) == "local"
    assert link_class(inv, 0, 7) == "intra-group"
    assert link_class(inv, 7, 8) == "inter-group"
    assert link_class_ids(inv, np.array([0, 0, 7]), np.array([0, 7, 8])).tolist() == [0, 1, 2]
    same = link_between(inv, 3, 3)
    assert math.isinf(same.bandwidth_bytes_per_s) and same.latency_s == 0.0


def test_bandwidth_matrix_overrides_link_classes_for_a_pair():
    doc = _doc([_device("a"), _device("b"), _device("c")])
    doc["bandwidth_matrix_bytes_per_s"] = [[0, 5e9, 1e11], [5e9, 0, 1e11], [1e11, 1e11, 0]]
    inv = inventory_from_json(doc)
    assert link_between(inv, 0, 1).bandwidth_bytes_per_s == 5e9
    assert link_between(inv, 0, 1).latency_s == 1e-6
    doc["bandwidth_matrix_bytes_per_s"] = [[0, 5e9], [5e9, 0]]
    with pytest.raises(InvalidInput) as err:
        inventory_from_json(doc)
    assert err.value.field == "inventory.bandwidth_matrix_bytes_per_s"


def test_without_devices_drops_them_and_empty_groups():
    inv = inventory_from_json(_doc([_device("a"), _device("b")], [_device("c")]))
    smaller = without_devices(inv, ["c"])
    assert smaller.device_names.tolist() == ["a", "b"]
    assert smaller.n_groups == 1
    dropped_first = without_devices(inv, ["a", "b"])
    assert dropped_first.device_group.tolist() == [0]
    assert dropped_first.group_names.tolist() == ["g1"]
    assert link_class(dropped_first, "c", "c") == "local"
    with pytest.raises(InvalidInput):
        without_devices(inv, ["a", "b", "c"])
    with pytest.raises(InvalidInput):
        without_devices(inv, ["zzz"])


def test_with_device_speed_scales_every_dtype_of_the_named_device():
    inv = preset_inventory("dgx-h100")
    slow = with_device_speed(inv, {"node0/gpu3": 0.5})
    assert slow.device_peak_flops[3] == inv.device_peak_flops[3] / 2
    assert slow.device_peak_flops_by_dtype["fp8"][3] == inv.device_peak_flops_by_dtype["fp8"][3] / 2
    assert slow.device_peak_flops[2] == inv.device_peak_flops[2]
    with pytest.raises(InvalidInput):
        with_device_speed(inv, {"node0/gpu3": 0})


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_every_preset_round_trips_through_canonical_json(preset):
    inv = preset_inventory(preset, 2)
    again = inventory_from_json(inventory_to_json(inv))
    assert inventory_hash(again) == inventory_hash(inv)
    assert again.device_names.tolist() == inv.device_names.tolist()
    assert np.array_equal(again.tier_capacity_bytes, inv.tier_capacity_bytes)
    assert again.inter_link == inv.inter_link
