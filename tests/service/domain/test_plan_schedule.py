"""The plan's ``schedule`` replays: an independent check of the returned document.

Each plan is made by the engine and rendered by the service's plan document (then
sent through JSON, as a client receives it); ``tests.service.schedule_check`` replays
it with nothing but the graph's reads and writes and the inventory's tier capacities:
each device runs one operator at a time, every operator starts after its inputs are on
its device, every placed operator appears exactly once, and no two holdings of one tier
share an address while both are live.
"""

from __future__ import annotations

import json
import pathlib

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from partitioners.graph.generators import synthetic_hypergraph
from partitioners.graph.onnx_import import graph_from_onnx_bytes
from partitioners.hardware.inventory import inventory_from_json, preset_inventory
from partitioners.placement.engine import PlacementOptions, place
from service.domain.plan_document import plan_document
from tests.service.schedule_check import GraphShape, violations

ONNX_DIR = pathlib.Path(__file__).resolve().parents[2] / "fixtures" / "onnx"
KB, MB = 1024, 1024 * 1024


def tiered_cluster(n_devices: int, groups: int, l2_bytes: float, smem_bytes: float, peak_flops: float = 1e14):
    """Devices with small fast tiers (so that level 3 packs and reuses addresses), in ``groups`` groups;
    a high ``peak_flops`` makes operators memory-bound, so level 3 re-times the schedule with its tiers."""
    per = max(n_devices // groups, 1)

    def device(name: str) -> dict:
        return {
            "name": name,
            "type": "gpu",
            "peak_flops": peak_flops,
            "memory_tiers": [
                {"name": "HBM", "capacity_bytes": 80e9, "bandwidth_bytes_per_s": 2e12},
                {"name": "L2", "capacity_bytes": l2_bytes, "bandwidth_bytes_per_s": 1e13},
                {"name": "SMEM", "capacity_bytes": smem_bytes, "bandwidth_bytes_per_s": 3e13},
            ],
        }

    return inventory_from_json(
        {
            "name": "tiered",
            "groups": [
                {
                    "name": f"g{g}",
                    "devices": [device(f"g{g}d{i}") for i in range(per)],
                    "link": {"bandwidth_bytes_per_s": 3e11, "latency_s": 2e-6},
                }
                for g in range(groups)
            ],
            "link": {"bandwidth_bytes_per_s": 2.5e10, "latency_s": 5e-6},
        }
    )


def capacities(inventory) -> dict[tuple[str, str], float]:
    return {
        (str(name), tier): float(inventory.tier_capacity_bytes[d, k])
        for d, name in enumerate(inventory.device_names.tolist())
        for k, tier in enumerate(inventory.tier_names)
    }


def returned_plan(graph, inventory, options: PlacementOptions) -> tuple[dict, GraphShape]:
    """The plan as a client reads it (``ops`` and ``schedule`` through JSON) and the placed graph's shape."""
    result = place(graph, inventory, options)
    _, _, body = plan_document(result, inventory)
    return json.loads(json.dumps(body)), GraphShape.of_hypergraph(result.graph)


def assert_replays(graph, inventory, options: PlacementOptions) -> dict:
    plan, shape = returned_plan(graph, inventory, options)
    broken = violations(plan, shape, capacities(inventory))
    assert not broken, broken[:10]
    return plan


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    n_ops=st.integers(2, 120),
    lanes=st.integers(1, 6),
    seed=st.integers(0, 10_000),
    n_devices=st.sampled_from([1, 2, 4]),
    groups=st.sampled_from([1, 2]),
    l2_bytes=st.sampled_from([256 * KB, 8 * MB, 64 * MB]),
    mode=st.sampled_from(["inference", "training"]),
    micro_batches=st.integers(1, 3),
    pipeline=st.booleans(),
    peak_flops=st.sampled_from([1e14, 1e17]),
    fusion=st.sampled_from(["none", "elementwise", "compiler"]),
)
def test_a_random_graphs_schedule_replays_on_a_tiered_cluster(
    n_ops, lanes, seed, n_devices, groups, l2_bytes, mode, micro_batches, pipeline, peak_flops, fusion
):
    graph = synthetic_hypergraph(n_ops, lanes=lanes, seed=seed)
    inventory = tiered_cluster(n_devices, groups, l2_bytes, l2_bytes / 8, peak_flops)
    options = PlacementOptions(
        mode=mode,
        micro_batches=micro_batches,
        pipeline=pipeline,
        objective="throughput" if pipeline else "makespan",
        seed=seed,
        allow_infeasible=True,
        fusion=fusion,
    )
    assert_replays(graph, inventory, options)


@pytest.mark.parametrize("fusion", ["elementwise", "compiler"])
def test_a_fused_plans_schedule_replays_with_its_kernels(fusion):
    graph = graph_from_onnx_bytes((ONNX_DIR / "bert_base.onnx").read_bytes(), dims={"batch": 2, "sequence": 128})
    inventory = tiered_cluster(4, 2, 2 * MB, 256 * KB)
    plan = assert_replays(graph, inventory, PlacementOptions(micro_batches=2, fusion=fusion))
    kernels = {e["op"] for d in plan["schedule"]["devices"] for e in d["ops"]}
    fused = [g["name"] + "@mb0" for g in plan["fusion_groups"]]
    assert fused and set(fused) <= kernels


@pytest.mark.parametrize(
    ("fixture", "dims", "mode", "micro_batches"),
    [
        ("resnet50.onnx", {"batch": 8}, "inference", 1),
        ("resnet50.onnx", {"batch": 2}, "training", 2),
        ("bert_base.onnx", {"batch": 2, "sequence": 128}, "inference", 4),
        ("gpt2.onnx", {"batch": 1, "sequence": 128}, "training", 1),
        ("lstm_seq2seq.onnx", {"batch": 4, "source": 16, "target": 16}, "inference", 2),
    ],
)
@pytest.mark.parametrize("cluster", ["dgx-h100 x2", "tiered x4"])
def test_an_onnx_fixtures_schedule_replays(fixture, dims, mode, micro_batches, cluster):
    graph = graph_from_onnx_bytes((ONNX_DIR / fixture).read_bytes(), dims=dims)
    if cluster == "dgx-h100 x2":
        inventory = preset_inventory("dgx-h100", 2)
    else:
        inventory = tiered_cluster(4, 2, 2 * MB, 256 * KB)
    plan = assert_replays(graph, inventory, PlacementOptions(mode=mode, micro_batches=micro_batches))
    if micro_batches > 1:
        tagged = [e for d in plan["schedule"]["devices"] for e in d["ops"] if "micro_batch" in e]
        assert {e["micro_batch"] for e in tagged} == set(range(micro_batches))


def test_the_checker_catches_a_schedule_whose_tier_holdings_overlap():
    """The replay is not vacuous: moving one live L2 holding onto another is reported."""
    graph = synthetic_hypergraph(40, lanes=4, seed=1)
    inventory = tiered_cluster(1, 1, 64 * MB, 8 * MB)
    plan, shape = returned_plan(graph, inventory, PlacementOptions())
    fast = [h for h in plan["schedule"]["holdings"] if h["tier"] == "L2" and h["size_bytes"] > 0]
    pairs = [
        (a, b)
        for a in fast
        for b in fast
        if a is not b and a["live_from_s"] < b["live_until_s"] and b["live_from_s"] < a["live_until_s"]
    ]
    assert pairs, "the fixture needs two L2 holdings live at once"
    a, b = pairs[0]
    b["offset_bytes"] = a["offset_bytes"]
    assert any("overlap" in v for v in violations(plan, shape, capacities(inventory)))


def test_the_checker_catches_an_operator_started_before_its_input_arrives():
    graph = synthetic_hypergraph(60, lanes=2, seed=3)
    inventory = tiered_cluster(2, 2, 8 * MB, 1 * MB)
    plan, shape = returned_plan(graph, inventory, PlacementOptions(strategy="metis"))
    transfer = plan["schedule"]["transfers"][0]
    transfer["end_s"] += 1.0
    assert any("before" in v and transfer["tensor"] in v for v in violations(plan, shape, capacities(inventory)))
