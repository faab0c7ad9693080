"""Specification of per-operator device types (the graph JSON's ``device_types``).

An operator that lists device types runs only on devices of those types, whatever
the strategy; a list no device of the inventory matches is bad input that names the
operator and its types; graphs without lists are placed exactly as before.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from partitioners.costmodel.costs import CostModel, link_time_tables
from partitioners.costmodel.simulator import simulate
from partitioners.errors import Infeasible, InvalidInput
from partitioners.graph.generators import synthetic_hypergraph
from partitioners.graph.hypergraph import op_levels
from partitioners.graph.json_import import graph_from_json
from partitioners.hardware.device_types import device_type_constraint
from partitioners.hardware.inventory import inventory_from_json
from partitioners.placement.engine import PlacementOptions, place
from partitioners.placement.heft import heft_schedule
from partitioners.placement.refine import refine_placement
from tests.partitioners.placement.test_engine import IDEAL, cluster


def device(name: str, device_type: str, peak_flops: float, capacity_bytes: float = 8e10) -> dict:
    return {
        "name": name,
        "type": device_type,
        "peak_flops": peak_flops,
        "memory_tiers": [{"name": "HBM", "capacity_bytes": capacity_bytes, "bandwidth_bytes_per_s": 2e12}],
    }


def fast_fast_slow(slow_capacity_bytes: float = 8e10):
    """The user's inventory: two fast devices and one slow one, in one group."""
    return inventory_from_json(
        {
            "name": "mixed",
            "groups": [
                {
                    "name": "node",
                    "devices": [
                        device("fast0", "fast", 1e15),
                        device("fast1", "fast", 1e15),
                        device("s", "slow", 1e13, slow_capacity_bytes),
                    ],
                    "link": {"bandwidth_bytes_per_s": 1e11, "latency_s": 1e-6},
                }
            ],
        }
    )


def two_nodes_slow_only_in_the_second():
    """Four fast devices in node a; two fast and two slow in node b."""
    types = [["fast"] * 4, ["fast", "slow", "slow", "fast"]]
    return inventory_from_json(
        {
            "name": "two-nodes",
            "groups": [
                {
                    "name": group,
                    "devices": [device(f"{group}{i}", t, 1e14 if t == "fast" else 3e13) for i, t in enumerate(kinds)],
                    "link": {"bandwidth_bytes_per_s": 1e11, "latency_s": 1e-6},
                }
                for group, kinds in zip("ab", types)
            ],
            "link": {"bandwidth_bytes_per_s": 1e10, "latency_s": 5e-6},
        }
    )


def eight_parallel_ops(device_types: list[str] | None, tensor_bytes: float = 1e6) -> dict:
    """The user's reproduction: eight independent 1-TFLOP operators reading one input."""
    nodes, tensors = [], [{"name": "x", "bytes": tensor_bytes}]
    for i in range(8):
        node = {"name": f"op{i}", "op": "MatMul", "inputs": ["x"], "outputs": [f"y{i}"], "flops": 1e12}
        if device_types is not None:
            node["device_types"] = device_types
        nodes.append(node)
        tensors.append({"name": f"y{i}", "bytes": tensor_bytes})
    return {"name": "eight", "nodes": nodes, "tensors": tensors}


def with_device_types(graph, every: int, types: tuple[str, ...], offset: int = 0):
    """``graph`` with every ``every``-th operator (from ``offset``) restricted to ``types``."""
    lists = np.full(graph.n_ops, None, dtype=object)
    for op in range(offset, graph.n_ops, every):
        lists[op] = types
    return replace(graph, op_device_types=lists)


def placed_types(result, inventory) -> list[str]:
    return [str(t) for t in inventory.device_types[result.placement]]


def test_operators_restricted_to_the_slow_type_run_only_on_the_slow_device():
    inventory = fast_fast_slow()
    result = place(graph_from_json(eight_parallel_ops(["slow"])), inventory)
    assert [inventory.device_names[d] for d in result.placement] == ["s"] * 8


def test_without_device_types_the_same_operators_spread_over_the_fast_devices():
    inventory = fast_fast_slow()
    result = place(graph_from_json(eight_parallel_ops(None)), inventory)
    assert "fast" in placed_types(result, inventory)


@pytest.mark.parametrize(
    "options",
    [
        {},
        {"strategy": "single"},
        {"strategy": "heft"},
        {"strategy": "metis"},
        {"strategy": "pipeline"},
        {"strategy": "hybrid", "micro_batches": 4},
        {"mode": "training", "micro_batches": 2},
        {"objective": "throughput", "micro_batches": 3},
    ],
    ids=lambda options: "-".join(f"{k}={v}" for k, v in options.items()) or "auto",
)
def test_every_strategy_keeps_restricted_operators_on_devices_of_their_types(options):
    inventory = two_nodes_slow_only_in_the_second()
    graph = with_device_types(synthetic_hypergraph(200, lanes=6, seed=3), every=5, types=("slow",))
    result = place(graph, inventory, PlacementOptions(allow_infeasible=True, **options))
    constraint = device_type_constraint(graph, inventory, result.expanded.op_origin)
    assert constraint.allows(result.placement).all()


def test_metis_across_nodes_puts_restricted_operators_in_the_node_that_has_their_type():
    inventory = two_nodes_slow_only_in_the_second()
    graph = with_device_types(synthetic_hypergraph(200, lanes=6, seed=3), every=3, types=("slow",))
    result = place(graph, inventory, PlacementOptions(strategy="metis"))
    restricted = np.flatnonzero(graph.op_device_types != None)  # noqa: E711 (element-wise)
    assert set(inventory.device_group[result.placement[restricted]].tolist()) == {1}
    assert set(inventory.device_types[result.placement[restricted]].tolist()) == {"slow"}


def test_gradient_and_optimizer_operators_run_where_their_forward_operator_may():
    inventory = fast_fast_slow()
    graph = with_device_types(synthetic_hypergraph(60, lanes=6, seed=2), every=4, types=("slow",))
    result = place(graph, inventory, PlacementOptions(mode="training", micro_batches=2))
    origin = result.expanded.op_origin
    from_restricted = np.isin(origin, np.arange(0, graph.n_ops, 4))
    assert from_restricted.sum() > graph.n_ops // 4  # gradients and micro-batch copies too
    assert set(inventory.device_types[result.placement[from_restricted]].tolist()) == {"slow"}


def test_single_uses_the_device_every_operator_may_run_on_even_if_it_is_not_the_fastest():
    inventory = fast_fast_slow()
    doc = eight_parallel_ops(["fast", "slow"])
    doc["nodes"][3]["device_types"] = ["slow"]
    result = place(graph_from_json(doc), inventory, PlacementOptions(strategy="single"))
    assert [inventory.device_names[d] for d in result.placement] == ["s"] * 8


def test_predicted_makespan_and_memory_are_those_of_the_placement_returned():
    inventory = fast_fast_slow()
    graph = graph_from_json(eight_parallel_ops(["slow"]))
    result = place(graph, inventory, cost_model=IDEAL)
    again = simulate(result.graph, inventory, result.placement, priority=result.priority, cost_model=IDEAL)
    assert result.makespan_s == pytest.approx(again.makespan_s)
    assert result.makespan_s == pytest.approx(8 * 1e12 / 1e13)  # eight ops, one after another on s
    assert result.simulation.peak_memory_bytes.tolist() == again.peak_memory_bytes.tolist()
    assert result.simulation.peak_memory_bytes[:2].tolist() == [0.0, 0.0]  # nothing on the fast devices


def test_an_operator_whose_types_no_device_has_is_invalid_input_naming_it_and_its_types():
    doc = eight_parallel_ops(None)
    doc["nodes"][5]["device_types"] = ["tpu-v5"]
    with pytest.raises(InvalidInput) as raised:
        place(graph_from_json(doc), fast_fast_slow())
    assert raised.value.code == "no-device-of-type"
    assert raised.value.field == "graph.nodes.device_types"
    assert "'op5'" in raised.value.detail and "tpu-v5" in raised.value.detail
    assert "fast, slow" in raised.value.detail  # the types the inventory does offer


def test_max_devices_that_leaves_out_every_device_of_an_operators_type_is_invalid_input():
    with pytest.raises(InvalidInput) as raised:
        place(graph_from_json(eight_parallel_ops(["slow"])), fast_fast_slow(), PlacementOptions(max_devices=2))
    assert raised.value.field == "options.max_devices"
    assert "'op0'" in raised.value.detail and "slow" in raised.value.detail


def test_an_operator_too_big_for_every_device_of_its_types_is_infeasible_naming_it():
    inventory = fast_fast_slow(slow_capacity_bytes=1e6)
    with pytest.raises(Infeasible) as raised:
        place(graph_from_json(eight_parallel_ops(["slow"], tensor_bytes=1e7)), inventory)
    assert "'op0'" in raised.value.detail and "slow" in raised.value.detail and "1.00 MB" in raised.value.detail


def test_a_tensor_an_operator_reads_twice_counts_once_against_the_memory_of_its_types():
    doc = {
        "name": "reads-twice",
        "nodes": [
            {"name": "op0", "op": "Add", "inputs": ["x", "x"], "outputs": ["y"], "flops": 1e9, "device_types": ["slow"]}
        ],
        "tensors": [{"name": "x", "bytes": 6e5}, {"name": "y", "bytes": 1e5}],
    }
    inventory = fast_fast_slow(slow_capacity_bytes=1e6)  # holds x and y (0.7 MB), not x twice
    result = place(graph_from_json(doc), inventory)
    assert inventory.device_names[result.placement[0]] == "s" and result.feasible


def test_pipeline_mode_names_device_types_when_they_leave_no_acyclic_stage_order():
    # op0 and op2 only on the slow device, op1 between them only on a fast one: stages s -> fast -> s
    doc = {
        "name": "sandwich",
        "nodes": [
            {"name": "op0", "op": "MatMul", "inputs": ["x"], "outputs": ["a"], "flops": 1e12, "device_types": ["slow"]},
            {"name": "op1", "op": "MatMul", "inputs": ["a"], "outputs": ["b"], "flops": 1e12, "device_types": ["fast"]},
            {"name": "op2", "op": "MatMul", "inputs": ["b"], "outputs": ["c"], "flops": 1e12, "device_types": ["slow"]},
        ],
        "tensors": [{"name": n, "bytes": 1e6} for n in "xabc"],
    }
    with pytest.raises(Infeasible, match="device_types"):
        place(graph_from_json(doc), fast_fast_slow(), PlacementOptions(pipeline=True))


#: Placement of ``synthetic_hypergraph(36, lanes=6, seed=1)`` on ``cluster(8, groups=2)`` with
#: the ideal cost model, recorded with the code before device types were enforced.
RECORDED_AUTO = [
    2,
    3,
    0,
    3,
    1,
    3,
    2,
    3,
    0,
    1,
    0,
    3,
    2,
    3,
    0,
    1,
    0,
    1,
    2,
    3,
    0,
    1,
    3,
    1,
    2,
    3,
    0,
    1,
    2,
    1,
    2,
    2,
    0,
    1,
    2,
    1,
]
RECORDED_HEFT = [
    2,
    5,
    1,
    3,
    4,
    0,
    2,
    5,
    1,
    3,
    4,
    0,
    2,
    5,
    1,
    3,
    1,
    0,
    2,
    5,
    1,
    4,
    0,
    0,
    2,
    0,
    1,
    4,
    2,
    0,
    2,
    2,
    1,
    4,
    3,
    0,
]


@pytest.mark.parametrize("strategy, recorded", [("auto", RECORDED_AUTO), ("heft", RECORDED_HEFT)])
def test_a_graph_without_device_types_is_placed_as_before_they_were_enforced(strategy, recorded):
    graph = synthetic_hypergraph(36, lanes=6, seed=1)
    result = place(graph, cluster(8, groups=2, hbm_bytes=1e11), PlacementOptions(strategy=strategy), cost_model=IDEAL)
    assert result.placement.tolist() == recorded


def test_device_types_that_admit_every_device_change_nothing():
    graph = synthetic_hypergraph(120, lanes=6, seed=4)
    inventory = cluster(8, groups=2, hbm_bytes=1e11)  # every device has type "T"
    admitting_all = with_device_types(graph, every=2, types=("T", "other"))
    assert device_type_constraint(admitting_all, inventory) is None
    plain = place(graph, inventory, cost_model=IDEAL)
    listed = place(admitting_all, inventory, cost_model=IDEAL)
    assert listed.placement.tolist() == plain.placement.tolist()
    assert listed.makespan_s == plain.makespan_s


def test_heft_only_considers_the_devices_an_operator_may_use():
    inventory = fast_fast_slow()
    graph = graph_from_json(eight_parallel_ops(None))
    times = np.array([[1e-3, 1e-3, 1e-1]] * 8)  # the slow device is 100x slower
    allowed = np.array([[True, True, True], [False, False, True]])
    op_allowed_set = np.array([0, 1, 0, 1, 0, 1, 0, 1])
    schedule = heft_schedule(
        graph,
        times,
        *link_time_tables(inventory, CostModel()),
        op_levels(graph),
        op_allowed_set=op_allowed_set,
        allowed_devices=allowed,
    )
    assert schedule.placement[op_allowed_set == 1].tolist() == [2, 2, 2, 2]
    assert set(schedule.placement[op_allowed_set == 0].tolist()) <= {0, 1}


def test_refinement_only_simulates_placements_that_keep_operators_on_their_types():
    inventory = fast_fast_slow()
    graph = graph_from_json(eight_parallel_ops(None))
    times = np.full((8, 3), 1e-3)
    allowed = np.array([[True, True, True], [False, False, True]])
    op_allowed_set = np.array([1, 0, 1, 0, 1, 0, 1, 0])
    start = np.full(8, 2, dtype=np.int64)  # everything on s, the one device every operator may use
    tried: list[np.ndarray] = []

    def score(placement):
        tried.append(placement.copy())
        sim = simulate(graph, inventory, placement, op_times_s=times)
        return (sim.makespan_s,), sim

    sim = simulate(graph, inventory, start, op_times_s=times)
    outcome = refine_placement(
        graph,
        start,
        sim,
        times,
        devices=np.arange(3),
        score=score,
        base_key=(sim.makespan_s,),
        max_steps=6,
        levels=op_levels(graph),
        op_allowed_set=op_allowed_set,
        allowed_devices=allowed,
    )
    assert tried and outcome.accepted > 0
    for placement in tried:
        assert allowed[op_allowed_set, placement].all()


@settings(max_examples=15, deadline=None)
@given(n=st.integers(8, 120), every=st.integers(1, 6), seed=st.integers(0, 1000), m=st.sampled_from([1, 2]))
def test_every_restricted_operator_lands_on_a_device_of_its_types(n, every, seed, m):
    inventory = two_nodes_slow_only_in_the_second()
    graph = with_device_types(
        synthetic_hypergraph(n, lanes=4, seed=seed), every=every, types=("slow",), offset=seed % every
    )
    result = place(graph, inventory, PlacementOptions(micro_batches=m, seed=seed, allow_infeasible=True))
    constraint = device_type_constraint(graph, inventory, result.expanded.op_origin)
    assert constraint.allows(result.placement).all()
