"""Specification of the hardware catalogue: one figure per GPU and node, the same to both its readers.

The placement inventory's presets and the 3D planner's GPUs and nodes both read
:mod:`partitioners.hardware.catalogue`; these tests hold them to it.
"""

from __future__ import annotations

from dataclasses import fields

import pytest

from partitioners.hardware import catalogue
from partitioners.hardware.catalogue import ACCELERATORS, NODES, REFERENCES, Accelerator, MemoryTier, Node
from partitioners.hardware.collectives import LinkSpec
from partitioners.hardware.inventory import PLACEMENT_PRESET_NAMES, PRESETS, preset_inventory
from partitioners.parallel3d.presets import GPU_SPECS, NODE_PRESETS, gpu_spec_by_name
from partitioners.parallel3d.spec_fields import spec_from_mapping
from partitioners.parallel3d.specs import ClusterSpec

TRAINING_DTYPES = ("bf16", "fp16", "fp8")
# placement presets whose GPU the planner also knows by name: both readers must agree on them
SHARED_NODES = sorted(name for name in PLACEMENT_PRESET_NAMES if NODES[name].accelerator.key in GPU_SPECS)


def test_the_h100_has_one_peak_the_whitepapers_in_both_readers():
    # the reviewer's finding: 989.4 in the inventory against 989 in the planner
    inventory = preset_inventory("dgx-h100")
    cluster = spec_from_mapping(ClusterSpec, {"preset": "dgx-h100", "nodes": 1})
    assert inventory.device_peak_flops_by_dtype["bf16"][0] == cluster.peak_flops_per_s["bf16"] == 989.4e12
    assert inventory.device_peak_flops_by_dtype["fp8"][0] == cluster.peak_flops_per_s["fp8"] == 1978.9e12


@pytest.mark.parametrize("node_name", SHARED_NODES)
def test_a_node_gives_the_same_figures_to_the_inventory_and_to_the_planner(node_name):
    node = NODES[node_name]
    inventory = preset_inventory(node_name, 2)
    cluster = spec_from_mapping(ClusterSpec, {"preset": node_name, "nodes": 2})
    for dtype in TRAINING_DTYPES:
        if dtype in node.accelerator.dense_peak_flops_per_s:
            assert inventory.device_peak_flops_by_dtype[dtype][0] == cluster.peak_flops_per_s[dtype]
        else:
            assert dtype not in cluster.peak_flops_per_s
    assert inventory.device_memory_bytes[0] == cluster.memory_bytes == node.accelerator.memory_bytes
    assert inventory.device_memory_bandwidth_bytes_per_s[0] == cluster.hbm_bandwidth_bytes_per_s
    assert inventory.n_devices // inventory.n_groups == cluster.gpus_per_node == node.devices_per_node
    assert inventory.group_link_bandwidth_bytes_per_s[0] == cluster.intra_node_bandwidth_bytes_per_s
    assert inventory.group_link_latency_s[0] == cluster.intra_node_latency_s
    assert inventory.inter_link == LinkSpec(cluster.inter_node_bandwidth_bytes_per_s, cluster.inter_node_latency_s)
    assert cluster.sm_count == node.accelerator.sm_count
    assert cluster.architecture == node.accelerator.architecture


@pytest.mark.parametrize("gpu_name", sorted(GPU_SPECS))
def test_a_planner_gpu_carries_the_catalogue_figures_of_the_gpu_and_its_usual_node(gpu_name):
    spec = GPU_SPECS[gpu_name]
    accelerator = ACCELERATORS[gpu_name]
    assert dict(spec.peak_flops_per_s) == {
        dtype: peak for dtype, peak in accelerator.dense_peak_flops_per_s.items() if dtype in TRAINING_DTYPES
    }
    assert (spec.memory_bytes, spec.hbm_bandwidth_bytes_per_s) == (
        accelerator.memory_bytes,
        accelerator.memory_bandwidth_bytes_per_s,
    )
    assert (spec.sm_count, spec.architecture) == (accelerator.sm_count, accelerator.architecture)
    usual = [node for node in NODES.values() if node.accelerator is accelerator and node.name in NODE_PRESETS]
    assert usual, f"{gpu_name} ships in no node the planner names"
    for node in usual:
        assert (spec.gpus_per_node, spec.intra_node_bandwidth_bytes_per_s, spec.inter_node_bandwidth_bytes_per_s) == (
            node.devices_per_node,
            node.intra_node_link.bandwidth_bytes_per_s,
            node.inter_node_link.bandwidth_bytes_per_s,
        )


@pytest.mark.parametrize("node_name", sorted(NODE_PRESETS))
def test_naming_a_planner_node_or_its_gpu_gives_the_same_cluster(node_name):
    by_node = spec_from_mapping(ClusterSpec, {"preset": node_name, "nodes": 3})
    by_gpu = spec_from_mapping(ClusterSpec, {"gpu": NODE_PRESETS[node_name], "num_nodes": 3})
    assert gpu_spec_by_name(NODE_PRESETS[node_name]).name == NODES[node_name].accelerator.key
    assert {f.name: getattr(by_node, f.name) for f in fields(by_node) if f.name != "name"} == {
        f.name: getattr(by_gpu, f.name) for f in fields(by_gpu) if f.name != "name"
    }


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_every_inventory_preset_is_a_catalogue_node_as_it_is_written_there(preset):
    node = NODES[preset]
    inventory = preset_inventory(preset)
    accelerator = node.accelerator
    assert set(inventory.device_types.tolist()) == {accelerator.device_type}
    assert {dtype: float(peaks[0]) for dtype, peaks in inventory.device_peak_flops_by_dtype.items()} == dict(
        accelerator.dense_peak_flops_per_s
    )
    assert inventory.tier_names == tuple(tier.name for tier in accelerator.memory_tiers)
    assert inventory.tier_capacity_bytes[0].tolist() == [tier.capacity_bytes for tier in accelerator.memory_tiers]
    assert inventory.tier_bandwidth_bytes_per_s[0].tolist() == [
        tier.bandwidth_bytes_per_s for tier in accelerator.memory_tiers
    ]
    assert inventory.group_link(0) == node.intra_node_link
    assert inventory.n_devices == node.devices_per_node
    assert inventory.device_names[0] == f"{node.group_prefix}0/{node.device_prefix}0"


def test_every_accelerator_and_node_names_its_sources_and_every_source_is_cited():
    cited = set()
    for entry in (*ACCELERATORS.values(), *NODES.values()):
        assert entry.sources, entry
        assert set(entry.sources) <= set(REFERENCES), entry
        cited |= set(entry.sources)
    assert cited == set(REFERENCES)
    assert all(text.strip() for text in REFERENCES.values())
    # and each is spelled out in the module's references
    assert all(f".. [{key}]" in catalogue.__doc__ for key in REFERENCES)


def test_the_catalogue_holds_hardware_facts_not_the_planners_kernel_ceilings():
    # gemm_efficiency_max, fp8_gemm_efficiency_max and nvls_allreduce_speedup are the planner's model
    names = {f.name for cls in (Accelerator, Node, MemoryTier) for f in fields(cls)}
    assert not {name for name in names if "efficiency" in name or "speedup" in name}
    assert all(name in GPU_SPECS for name in NODE_PRESETS.values())


def test_catalogue_entries_check_their_figures():
    hbm = (MemoryTier("HBM", 1e9, 1e12),)
    with pytest.raises(ValueError, match="bf16"):
        Accelerator("x", "X", "ampere", {"fp16": 1e12}, hbm, None, ("A100",))
    with pytest.raises(ValueError, match="positive"):
        Accelerator("x", "X", "ampere", {"bf16": -1.0}, hbm, None, ("A100",))
    with pytest.raises(ValueError, match="main memory"):
        Accelerator("x", "X", "ampere", {"bf16": 1e12}, (), None, ("A100",))
    with pytest.raises(ValueError, match="no source"):
        Accelerator("x", "X", "ampere", {"bf16": 1e12}, hbm, None, ())
    with pytest.raises(ValueError, match="REFERENCES"):
        Accelerator("x", "X", "ampere", {"bf16": 1e12}, hbm, None, ("a blog I read",))
    with pytest.raises(ValueError, match="capacity_bytes"):
        MemoryTier("HBM", 0.0, 1e12)
    link = LinkSpec(1e9, 1e-6)
    with pytest.raises(ValueError, match="at least one device"):
        Node("n", ACCELERATORS["h100-sxm"], 0, link, link, ("DGXH100",))
    with pytest.raises(ValueError, match="bandwidth"):
        Node("n", ACCELERATORS["h100-sxm"], 8, LinkSpec(0.0, 1e-6), link, ("DGXH100",))


def test_the_catalogue_cannot_be_edited_in_place():
    with pytest.raises(TypeError):
        ACCELERATORS["h100-sxm"].dense_peak_flops_per_s["bf16"] = 989e12  # type: ignore[index]
    with pytest.raises(TypeError):
        NODES["dgx-h100"] = NODES["dgx-a100"]  # type: ignore[index]
