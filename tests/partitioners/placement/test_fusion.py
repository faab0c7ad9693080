"""Specification of fusion before placement (partitioners.placement.fusion).

A small MLP block with round sizes, so the groups, the bytes they save and the launches
they remove can be written out by hand.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from partitioners.costmodel.costs import CostModel
from partitioners.graph.generators import synthetic_hypergraph
from partitioners.graph.hypergraph import graph_from_ops, topological_order
from partitioners.hardware.inventory import inventory_from_json
from partitioners.placement.engine import PlacementOptions, place
from partitioners.placement.fusion import fused_graph, fusion_groups

MB = 1e6


def mlp_block():
    """x -> MatMul -> Add(bias) -> Relu -> MatMul -> Softmax -> y; every activation 1 MB."""
    ops = [
        ("mm1", "MatMul", 1e9, ["x", "w1"], ["h1"]),
        ("bias", "Add", 2.5e5, ["h1", "b1"], ["h2"]),
        ("relu", "Relu", 2.5e5, ["h2"], ["h3"]),
        ("mm2", "MatMul", 1e9, ["h3", "w2"], ["h4"]),
        ("softmax", "Softmax", 1e6, ["h4"], ["y"]),
    ]
    sizes = {"x": MB, "w1": 4 * MB, "b1": 4e3, "h1": MB, "h2": MB, "h3": MB, "w2": 4 * MB, "h4": MB, "y": MB}
    return graph_from_ops("mlp", ops, sizes, parameters={"w1", "b1", "w2"})


def members(graph, groups):
    """Group -> sorted member names, for groups of several operators."""
    out = {}
    for op, g in enumerate(groups.op_group.tolist()):
        out.setdefault(g, []).append(str(graph.op_names[op]))
    return sorted(sorted(v) for v in out.values() if len(v) > 1)


def test_compiler_fusion_puts_bias_and_activation_into_the_matmul_epilogue():
    graph = mlp_block()
    groups = fusion_groups(graph, "compiler")
    assert members(graph, groups) == [["bias", "mm1", "relu"]]
    # h1 and h2 never leave the chip: each saves its write and its read
    assert groups.bytes_saved.sum() == pytest.approx(2 * (2 * MB))
    assert groups.launches_saved == 2


def test_elementwise_fusion_leaves_matmuls_as_library_calls():
    graph = mlp_block()
    groups = fusion_groups(graph, "elementwise")
    assert members(graph, groups) == [["bias", "relu"]]
    assert groups.bytes_saved.sum() == pytest.approx(2 * MB)  # only h2


def test_a_fused_node_reads_external_inputs_once_and_keeps_intermediates_off_main_memory():
    graph = mlp_block()
    fused = fused_graph(graph, fusion_groups(graph, "compiler"))
    assert fused.n_ops == 3
    assert not {"h1", "h2"} & set(fused.tensor_names.tolist())
    mm1 = int(np.flatnonzero(fused.op_names == "mm1")[0])
    assert sorted(fused.tensor_names[fused.inputs_of(mm1)].tolist()) == ["b1", "w1", "x"]
    assert fused.tensor_names[fused.outputs_of(mm1)].tolist() == ["h3"]
    assert fused.op_flops[mm1] == pytest.approx(1e9 + 5e5)
    assert fused.op_param_bytes[mm1] == pytest.approx(4 * MB + 4e3)


def test_a_tensor_read_outside_its_group_is_written_once_and_read_on_chip_inside():
    graph = graph_from_ops(
        "branch",
        [
            ("mm", "MatMul", 1e9, ["x"], ["h"]),
            ("relu", "Relu", 1e5, ["h"], ["r"]),
            ("mm2", "MatMul", 1e9, ["h"], ["z"]),  # a second GEMM also reads h: not in mm's kernel
        ],
        {"x": MB, "h": MB, "r": MB, "z": MB},
    )
    groups = fusion_groups(graph, "compiler")
    assert groups.op_group[1] == groups.op_group[0] != groups.op_group[2]
    assert not groups.internal_tensor[list(graph.tensor_names).index("h")]
    assert groups.bytes_saved.sum() == pytest.approx(MB)  # relu's read of h only


def test_a_tensor_read_only_inside_its_group_never_reaches_main_memory():
    graph = graph_from_ops(
        "residual",
        [
            ("mm", "MatMul", 1e9, ["x"], ["h"]),
            ("relu", "Relu", 1e5, ["h"], ["r"]),
            ("add", "Add", 1e5, ["r", "h"], ["y"]),  # h also feeds the residual add
        ],
        {"x": MB, "h": MB, "r": MB, "y": MB},
    )
    groups = fusion_groups(graph, "compiler")
    assert len(set(groups.op_group.tolist())) == 1
    assert groups.internal_tensor[list(graph.tensor_names).index("h")]
    # h: one write, two reads; r: one write, one read
    assert groups.bytes_saved.sum() == pytest.approx(3 * MB + 2 * MB)


def test_fusion_never_creates_a_cycle_between_groups():
    # mm writes a (read by relu only) and b; add reads relu's output and q(b). Putting add in
    # mm's group would make {mm, relu, add} -> q -> {mm, relu, add}.
    graph = graph_from_ops(
        "diamond",
        [
            ("mm", "MatMul", 1e9, ["x"], ["a", "b"]),
            ("relu", "Relu", 1e5, ["a"], ["ra"]),
            ("q", "MatMul", 1e9, ["b"], ["qb"]),
            ("add", "Add", 1e5, ["ra", "qb"], ["y"]),
        ],
        {"x": MB, "a": MB, "b": MB, "ra": MB, "qb": MB, "y": MB},
    )
    groups = fusion_groups(graph, "compiler")
    assert groups.op_group[3] != groups.op_group[0]
    topological_order(fused_graph(graph, groups))  # raises on a cycle


def test_operators_restricted_to_different_device_types_are_not_fused():
    graph = mlp_block()
    types = np.array([("A",), ("B",), None, None, None], dtype=object)
    graph = type(graph)(**{**graph.__dict__, "op_device_types": types})
    groups = fusion_groups(graph, "compiler")
    assert groups.op_group[0] != groups.op_group[1]


def test_a_fused_group_pays_one_launch_and_no_intermediate_traffic():
    inv = inventory_from_json(
        {
            "groups": [
                {
                    "name": "g",
                    "devices": [
                        {
                            "name": "d0",
                            "peak_flops": 1e15,
                            "memory_tiers": [{"name": "HBM", "capacity_bytes": 1e12, "bandwidth_bytes_per_s": 1e9}],
                        }
                    ],
                }
            ]
        }
    )
    chain = graph_from_ops(
        "pointwise",
        [("a", "Mul", 1.0, ["x"], ["t1"]), ("b", "Add", 1.0, ["t1"], ["t2"]), ("c", "Relu", 1.0, ["t2"], ["y"])],
        {"x": MB, "t1": MB, "t2": MB, "y": MB},
    )
    model = CostModel(efficiency=(1.0,) * 8, memory_efficiency=1.0, launch_overhead_s=1e-3)
    unfused = place(chain, inv, PlacementOptions(strategy="single"), cost_model=model)
    fused = place(chain, inv, PlacementOptions(strategy="single", fusion="elementwise"), cost_model=model)
    # unfused: three kernels each reading and writing 1 MB at 1 GB/s, plus a launch each
    assert unfused.makespan_s == pytest.approx(3 * (2e-3 + 1e-3))
    # fused: x read once, y written once, one launch
    assert fused.makespan_s == pytest.approx(2e-3 + 1e-3)
    assert fused.fusion is not None and fused.fusion.launches_saved == 2


def test_no_fusion_places_the_graph_as_given():
    graph = mlp_block()
    result = place(graph, _two_devices(), PlacementOptions())
    assert result.fusion is None and result.graph.n_ops == graph.n_ops


def _two_devices():
    device = {
        "peak_flops": 1e14,
        "memory_tiers": [{"name": "HBM", "capacity_bytes": 1e10, "bandwidth_bytes_per_s": 1e12}],
    }
    return inventory_from_json(
        {
            "groups": [
                {
                    "name": "g",
                    "devices": [{"name": "d0", **device}, {"name": "d1", **device}],
                    "link": {"bandwidth_bytes_per_s": 1e10},
                }
            ]
        }
    )


@settings(max_examples=15, deadline=None)
@given(n=st.integers(5, 300), seed=st.integers(0, 10_000), mode=st.sampled_from(["elementwise", "compiler"]))
def test_fused_graphs_are_acyclic_and_keep_every_operator_and_flop(n, seed, mode):
    graph = synthetic_hypergraph(n, seed=seed)
    groups = fusion_groups(graph, mode)
    fused = fused_graph(graph, groups)
    topological_order(fused)
    assert fused.n_ops == groups.n_groups
    assert fused.op_flops.sum() == pytest.approx(graph.op_flops.sum())
    internal = np.flatnonzero(groups.internal_tensor)
    consumers = graph.consumer_ops[graph.consumer_ptr[internal]]
    assert np.array_equal(groups.op_group[graph.tensor_producer[internal]], groups.op_group[consumers])


def test_fusion_keeps_declared_training_roles_apart_and_gradients_in_memory():
    from partitioners.graph.hypergraph import TENSOR_ROLE_GRADIENT, declares_training
    from partitioners.graph.json_import import graph_from_json
    from tests.partitioners.training_step import mlp_training_step

    doc = mlp_training_step()
    # a forward pointwise op after fc2, and a backward one that writes a gradient inside a chain
    doc["nodes"].append({"name": "act", "op": "Relu", "inputs": ["y"], "outputs": ["ya"], "flops": 1e3})
    doc["tensors"].append({"name": "ya", "bytes": 1000})
    graph = graph_from_json(doc)
    groups = fusion_groups(graph, "compiler")
    names = graph.op_names.tolist()
    assert groups.op_group[names.index("act")] == groups.op_group[names.index("fc2")]
    roles = graph.op_role
    for g in np.unique(groups.op_group):
        assert len(set(roles[groups.op_group == g].tolist())) == 1
    fused = fused_graph(graph, groups)
    assert declares_training(fused)
    gradients = fused.tensor_names[fused.tensor_role == TENSOR_ROLE_GRADIENT].tolist()
    assert sorted(gradients) == ["dw1", "dw2"]
