"""Specification of the analytic cost model: op classes, roofline, transfers, collectives."""

from __future__ import annotations

import numpy as np
import pytest

from partitioners.costmodel.costs import (
    OP_CLASS_NAMES,
    CostModel,
    collective_time_s,
    cost_model_from_json,
    cost_model_to_json,
    is_view_op,
    op_class_of,
    op_times_by_profile_s,
    op_times_s,
    timing_dtype_note,
    transfer_time_s,
    transfer_times_s,
)
from partitioners.errors import InvalidInput
from partitioners.graph.hypergraph import graph_from_ops
from partitioners.graph.json_import import graph_from_json
from partitioners.hardware.collectives import (
    LinkSpec,
    allreduce_time_s,
    alltoall_time_s,
    hierarchical_allgather_time_s,
    hierarchical_allreduce_time_s,
    hierarchical_alltoall_time_s,
)
from partitioners.hardware.inventory import inventory_from_json, preset_inventory

#: efficiency 1, no launch cost: the bare roofline
BARE = CostModel(efficiency=(1.0,) * 8, memory_efficiency=1.0, launch_overhead_s=0.0)


def _inventory(peaks=(1e12, 1e12), mem_bw=(1e9, 1e9), types=("a", "a")):
    devices = [
        {
            "name": f"d{i}",
            "type": t,
            "peak_flops": {"bf16": p, "fp32": p / 10},
            "memory_tiers": [{"name": "HBM", "capacity_bytes": 1e12, "bandwidth_bytes_per_s": b}],
        }
        for i, (p, b, t) in enumerate(zip(peaks, mem_bw, types))
    ]
    return inventory_from_json(
        {
            "name": "t",
            "groups": [
                {"name": "g0", "devices": devices[:1], "link": {"bandwidth_bytes_per_s": 1e9, "latency_s": 0}},
                {"name": "g1", "devices": devices[1:], "link": {"bandwidth_bytes_per_s": 1e9, "latency_s": 0}},
            ],
            "link": {"bandwidth_bytes_per_s": 1e8, "latency_s": 1e-3},
        }
    )


def test_op_types_map_to_classes_case_insensitively():
    classes = op_class_of(
        np.array(
            [
                "MatMul",
                "gemm",
                "Conv",
                "Attention",
                "LayerNormalization",
                "Relu",
                "ReduceMean",
                "Reshape",
                "MyCustomOp",
            ],
            dtype=object,
        )
    )
    assert [OP_CLASS_NAMES[c] for c in classes] == [
        "matmul",
        "matmul",
        "conv",
        "attention",
        "norm",
        "elementwise",
        "reduction",
        "data-movement",
        "other",
    ]


def test_compute_bound_op_takes_flops_over_peak():
    g = graph_from_ops("c", [("mm", "MatMul", 2e12, ["x"], ["y"])], {"x": 1, "y": 1})
    t = op_times_s(g, _inventory(), BARE)
    assert t.tolist() == [[2.0, 2.0]]


def test_memory_bound_op_takes_bytes_touched_over_bandwidth():
    # reads 1e9 and writes 2e9 bytes on a 1e9 B/s memory: 3 s, FLOPs negligible
    g = graph_from_ops("m", [("add", "Add", 1e3, ["x"], ["y"])], {"x": 1e9, "y": 2e9})
    assert op_times_s(g, _inventory(), BARE).tolist() == [[3.0, 3.0]]


def test_efficiency_and_launch_overhead_apply():
    g = graph_from_ops("c", [("mm", "MatMul", 1e12, [], ["y"])], {"y": 1})
    cm = CostModel(efficiency=(0.5,) + (1.0,) * 7, memory_efficiency=1.0, launch_overhead_s=1e-3)
    assert op_times_s(g, _inventory(), cm)[0, 0] == pytest.approx(2.0 + 1e-3)


def test_view_operators_touch_no_bytes_but_pay_the_operator_overhead():
    # x -> Reshape -> Squeeze -> Identity -> Transpose: the views alias x's buffer, the
    # Transpose writes a new one (read 1e9 + write 1e9 bytes at 1e9 B/s), every one is dispatched
    ops = [
        ("r", "Reshape", 0, ["x"], ["a"]),
        ("s", "Squeeze", 0, ["a"], ["b"]),
        ("i", "identity", 0, ["b"], ["c"]),
        ("t", "Transpose", 0, ["c"], ["y"]),
    ]
    g = graph_from_ops("v", ops, {"x": 1e9, "a": 1e9, "b": 1e9, "c": 1e9, "y": 1e9})
    cm = CostModel(efficiency=(1.0,) * 8, memory_efficiency=1.0, launch_overhead_s=1e-3)
    assert op_times_s(g, _inventory(), cm).tolist() == [[1e-3, 1e-3]] * 3 + [[2.001, 2.001]]


def test_view_operators_are_recognised_by_type_case_insensitively():
    types = np.array(["Reshape", "UNSQUEEZE", "Flatten", "Identity", "Transpose", "Expand", "Gather"], dtype=object)
    assert is_view_op(types).tolist() == [True, True, True, True, False, False, False]


def _dtype_graph(dtypes: dict[str, str | None]) -> object:
    """mm: x, w -> y, each tensor 1e6 bytes of the dtype given (None: undeclared)."""
    tensors = [{"name": n, "bytes": 1e6, **({"dtype": d} if d else {})} for n, d in dtypes.items()]
    tensors[1]["kind"] = "parameter"
    return graph_from_json(
        {
            "name": "g",
            "tensors": tensors,
            "nodes": [{"name": "mm", "op": "MatMul", "inputs": ["x", "w"], "outputs": ["y"]}],
        }
    )


def test_a_graph_mostly_of_another_dtype_than_the_timing_peak_gets_a_note_saying_how_to_time_it():
    graph = _dtype_graph({"x": "float32", "w": "float32", "y": "int64"})
    note = timing_dtype_note(graph, preset_inventory("dgx-h100"))
    assert "timed at the bf16 peak" in note
    assert "100% of the bytes of the graph's tensors that declare a floating-point dtype are fp32" in note
    assert "'fp32' or 'tf32'" in note


@pytest.mark.parametrize(
    ("dtypes", "inventory"),
    [
        ({"x": "bfloat16", "w": "bfloat16", "y": "float32"}, {"preset": "dgx-h100"}),  # most bytes in bf16
        ({"x": "float32", "w": "float32", "y": "float32"}, {"preset": "dgx-h100", "default_dtype": "tf32"}),
        ({"x": None, "w": None, "y": None}, {"preset": "dgx-h100"}),  # nothing declared
    ],
)
def test_no_dtype_note_where_the_timing_peak_is_the_graphs_dtype_or_none_is_declared(dtypes, inventory):
    assert timing_dtype_note(_dtype_graph(dtypes), inventory_from_json(inventory)) is None


def test_parameters_count_as_bytes_touched():
    g = graph_from_ops("p", [("mm", "MatMul", 0, ["w"], ["y"])], {"w": 4e9, "y": 0}, parameters={"w"})
    assert op_times_s(g, _inventory(), BARE)[0, 0] == 4.0


def test_faster_device_gets_a_shorter_time_and_devices_share_profiles():
    g = graph_from_ops("c", [("mm", "MatMul", 1e12, [], ["y"])], {"y": 1})
    inv = _inventory(peaks=(1e12, 4e12, 1e12), mem_bw=(1e9,) * 3, types=("a", "b", "a"))
    assert op_times_s(g, inv, BARE).tolist() == [[1.0, 0.25, 1.0]]
    times, profile = op_times_by_profile_s(g, inv, BARE)
    assert times.shape == (1, 2)
    assert profile[0] == profile[2] != profile[1]


def test_calibration_multiplier_scales_only_its_device_and_class():
    g = graph_from_ops("c", [("mm", "MatMul", 1e12, [], ["y"]), ("add", "Add", 0, ["y"], ["z"])], {"y": 5e8, "z": 5e8})
    cm = CostModel(
        efficiency=(1.0,) * 8,
        memory_efficiency=1.0,
        launch_overhead_s=0.0,
        device_class_multiplier={("d1", "matmul"): 1.5},
    )
    assert op_times_s(g, _inventory(), cm).tolist() == [[1.0, 1.5], [1.0, 1.0]]
    by_type = CostModel(
        efficiency=(1.0,) * 8,
        memory_efficiency=1.0,
        launch_overhead_s=0.0,
        device_class_multiplier={("a", "elementwise"): 2.0},
    )
    assert op_times_s(g, _inventory(), by_type)[1].tolist() == [2.0, 2.0]


def test_dtype_choice_uses_that_peak_and_missing_peaks_are_an_error():
    g = graph_from_ops("c", [("mm", "MatMul", 1e12, [], ["y"])], {"y": 1})
    fp32 = CostModel(dtype="fp32", efficiency=(1.0,) * 8, memory_efficiency=1.0, launch_overhead_s=0.0)
    assert op_times_s(g, _inventory(), fp32)[0, 0] == 10.0
    with pytest.raises(InvalidInput) as err:
        op_times_s(g, _inventory(), CostModel(dtype="fp8"))
    assert err.value.field == "cost_model.dtype"


def test_invalid_cost_model_names_the_field():
    with pytest.raises(InvalidInput) as err:
        CostModel(efficiency=(1.0, 2.0) + (1.0,) * 6)
    assert err.value.field == "cost_model.efficiency"
    with pytest.raises(InvalidInput) as err:
        CostModel(device_class_multiplier={("d0", "gemm"): 1.0})
    assert err.value.field == "cost_model.device_class_multiplier"
    with pytest.raises(InvalidInput) as err:
        CostModel(link_class_multiplier={"pcie": 1.0})
    assert err.value.field == "cost_model.link_class_multiplier"


def test_transfer_time_is_alpha_plus_bytes_over_bandwidth_by_link_class():
    inv = _inventory(peaks=(1e12,) * 3, mem_bw=(1e9,) * 3, types=("a",) * 3)
    assert transfer_time_s(1e9, inv, "d1", "d2") == 1.0  # same group, 1 GB/s, no latency
    assert transfer_time_s(1e8, inv, "d0", "d1") == pytest.approx(1e-3 + 1.0)  # between groups
    assert transfer_time_s(1e9, inv, "d1", "d1") == 0.0
    slower = CostModel(link_class_multiplier={"inter-group": 2.0})
    assert transfer_time_s(1e8, inv, 0, 1, slower) == pytest.approx(2 * (1e-3 + 1.0))
    vec = transfer_times_s(np.array([1e9, 1e8, 5.0]), np.array([1, 0, 2]), np.array([2, 1, 2]), inv)
    assert vec.tolist() == pytest.approx([1.0, 1.001, 0.0])


def test_collective_inside_one_group_is_the_flat_ring():
    inv = preset_inventory("dgx-h100", 2)
    link = LinkSpec(450e9, 2e-6)
    assert collective_time_s("allreduce", 1e9, inv, range(8)) == pytest.approx(allreduce_time_s(1e9, 8, link))
    assert collective_time_s("alltoall", 1e9, inv, range(4)) == pytest.approx(alltoall_time_s(1e9, 4, link))


def test_collective_across_groups_is_hierarchical_and_slower():
    inv = preset_inventory("dgx-h100", 2)
    expected = hierarchical_allreduce_time_s(1e9, 8, 2, LinkSpec(450e9, 2e-6), LinkSpec(50e9, 5e-6))
    assert collective_time_s("allreduce", 1e9, inv, range(16)) == pytest.approx(expected)
    assert collective_time_s("allreduce", 1e9, inv, range(16)) > collective_time_s("allreduce", 1e9, inv, range(8))
    # all-to-all over 16: 8/16 of each buffer leaves the node on a 50 GB/s rail
    a2a = collective_time_s("alltoall", 1.6e9, inv, range(16))
    assert a2a == pytest.approx(8 * 5e-6 + 0.8e9 / 50e9)


def test_collective_of_one_device_or_zero_bytes_is_free():
    inv = preset_inventory("dgx-h100")
    assert collective_time_s("allgather", 1e9, inv, [3]) == 0.0
    assert collective_time_s("reduce_scatter", 0, inv, range(8)) == 0.0
    with pytest.raises(InvalidInput):
        collective_time_s("broadcast", 1.0, inv, range(2))


def test_cost_model_json_round_trip_and_hashable():
    cm = CostModel(
        efficiency=(0.7, 0.5, 0.6, 0.3, 0.3, 0.3, 0.3, 0.5),
        device_class_multiplier={("node0/gpu1", "matmul"): 1.2, ("H100-SXM5-80GB", "norm"): 0.9},
        link_class_multiplier={"inter-group": 1.5},
    )
    doc = cost_model_to_json(cm)
    assert doc["device_class_multiplier"] == {"H100-SXM5-80GB": {"norm": 0.9}, "node0/gpu1": {"matmul": 1.2}}
    assert doc["efficiency"]["matmul"] == 0.7
    assert cost_model_from_json(doc) == cm
    assert hash(cost_model_from_json(doc)) == hash(cm)
    assert cost_model_from_json({}) == CostModel()


def test_cost_model_json_errors_name_the_field():
    with pytest.raises(InvalidInput) as err:
        cost_model_from_json({"efficiency": {"gemm": 0.5}})
    assert err.value.field == "cost_model.efficiency"
    with pytest.raises(InvalidInput) as err:
        cost_model_from_json({"link_class_multiplier": {"inter-group": -1}})
    assert err.value.field == "cost_model.link_class_multiplier"
    with pytest.raises(InvalidInput) as err:
        cost_model_from_json({"launch_overhead": 1e-6})
    assert err.value.field == "cost_model"


def test_hierarchical_allgather_gathers_rail_shards_then_inside_groups():
    intra, inter = LinkSpec(400.0, 0.0), LinkSpec(100.0, 0.0)
    # 2 groups x 4 ranks, 800 B total: rails gather 200 B over 2 groups (1/2 x 200 / 100 = 1 s),
    # then groups gather 800 B over 4 ranks (3/4 x 800 / 400 = 1.5 s)
    assert hierarchical_allgather_time_s(800.0, 4, 2, intra, inter) == 2.5
    assert hierarchical_allgather_time_s(800.0, 4, 1, intra, inter) == 1.5


def test_hierarchical_alltoall_is_bound_by_the_slower_level():
    intra, inter = LinkSpec(400.0, 0.0), LinkSpec(100.0, 0.0)
    # p = 8: 3/8 of 800 B inside at 400 B/s = 0.75 s; 4/8 of 800 B out at 100 B/s = 4 s
    assert hierarchical_alltoall_time_s(800.0, 4, 2, intra, inter) == 4.0
