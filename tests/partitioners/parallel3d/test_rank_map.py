"""Rank maps: which GPU takes which rank (partitioners.parallel3d.planner.rank_map).

Expected values are worked by hand from the published formulas the docstrings
cite: Narayanan et al. SC21 (FLOPs, bubble), Korthikanti et al. 2022 (activation
memory), ZeRO (bytes per parameter per stage).
"""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from partitioners.parallel3d.planner import rank_map
from tests.partitioners.parallel3d.shapes import cluster_spec, layout_spec


def test_rank_map_is_a_bijection_onto_mesh_coordinates():
    rm = rank_map(
        cluster_spec({"preset": "dgx-a100", "nodes": 4}),
        layout_spec({"tp": 4, "pp": 2, "cp": 2, "rank_order": "tp-cp-ep-pp-dp"}),
    )
    assert rm.coords.shape == (32, 5)
    assert len({tuple(c) for c in rm.coords}) == 32
    assert rm.mesh_shape == (2, 2, 2, 4) and rm.mesh_dim_names == ("dp", "pp", "cp", "tp")


def test_in_tp_pp_dp_order_pipeline_neighbours_are_adjacent_nodes_and_dp_peers_differ():
    rm = rank_map(
        cluster_spec({"preset": "dgx-a100", "nodes": 4}),
        layout_spec({"tp": 8, "pp": 2, "rank_order": "tp-cp-ep-pp-dp"}),
    )
    dp, pp, tp = rm.coords[:, 0], rm.coords[:, 1], rm.coords[:, 2]
    for d in range(2):
        for p in range(2):
            group = (dp == d) & (pp == p)
            assert len(set(rm.node[group])) == 1  # one NVSwitch domain
    stage0 = rm.node[(dp == 0) & (pp == 0) & (tp == 0)][0]
    stage1 = rm.node[(dp == 0) & (pp == 1) & (tp == 0)][0]
    assert abs(int(stage1) - int(stage0)) == 1
    replicas = rm.node[(pp == 0) & (tp == 0)]
    assert len(set(replicas)) == 2  # data-parallel peers on different nodes


def test_expert_parallel_rank_map_splits_dp_into_edp_times_ep():
    rm = rank_map(
        cluster_spec({"preset": "dgx-h100", "nodes": 2}),
        layout_spec({"tp": 2, "ep": 4, "rank_order": "tp-cp-ep-pp-dp"}),
    )
    assert rm.mesh_dim_names == ("edp", "pp", "ep", "cp", "tp") and rm.mesh_shape == (2, 1, 4, 1, 2)
    dp, ep = rm.coords[:, 0], rm.coords[:, 4]
    assert np.array_equal(ep, dp % 4)


@pytest.mark.parametrize(
    "layout", [{"tp": 4, "pp": 4, "cp": 2}, {"tp": 2, "ep": 8}, {"tp": 4, "pp": 2, "ep": 16, "etp": 1}]
)
def test_a_range_of_the_rank_map_is_that_range_of_the_whole_map(layout):
    rm = rank_map(cluster_spec({"preset": "dgx-h100", "nodes": 8}), layout_spec(layout))
    coords, device, node, local_gpu = rm.ranks(13, 29)
    assert np.array_equal(coords, rm.coords[13:29]) and np.array_equal(device, rm.device[13:29])
    assert np.array_equal(node, rm.node[13:29]) and np.array_equal(local_gpu, rm.local_gpu[13:29])
    assert [r["dp"] for r in rm.to_dict(limit=20)["ranks"]] == rm.coords[:20, 0].tolist()


def test_the_rank_map_of_a_huge_cluster_is_computed_only_for_the_ranks_an_answer_returns():
    # 1.6M GPUs: the whole map is ~200 MB of coordinates; an answer returns a few ranks
    cluster = {"preset": "dgx-h100", "nodes": 100_000, "gpus_per_node": 16}
    tracemalloc.start()
    try:
        answer = rank_map(cluster_spec(cluster), layout_spec({"tp": 8, "pp": 4, "cp": 2})).to_dict(limit=8)
        _, peak_bytes = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert answer["num_ranks"] == 1_600_000 and len(answer["ranks"]) == 8 and answer["truncated"]
    assert peak_bytes < 4 * 2**20


def test_folded_expert_groups_are_consecutive_ranks_of_neighbouring_tensor_groups():
    rm = rank_map(
        cluster_spec({"preset": "dgx-h100", "nodes": 1}),
        layout_spec({"tp": 2, "pp": 2, "ep": 4, "etp": 1, "rank_order": "tp-cp-ep-pp-dp"}),
    )
    dp, pp, tp, ep = rm.coords[:, 0], rm.coords[:, 1], rm.coords[:, 2], rm.coords[:, 4]
    assert list(ep) == [0, 1, 2, 3, 0, 1, 2, 3]
    assert list(tp) == [0, 1, 0, 1, 0, 1, 0, 1]
    assert list(dp) == [0, 0, 1, 1, 0, 0, 1, 1]
    assert list(pp) == [0, 0, 0, 0, 1, 1, 1, 1]
    assert rm.mesh_dim_names == ("dp_outer", "pp", "dp_inner", "cp", "tp") and rm.mesh_shape == (1, 2, 2, 1, 2)


@settings(max_examples=30, deadline=None)
@given(
    nodes=st.integers(1, 6),
    gpn=st.sampled_from([4, 8]),
    tp_exp=st.integers(0, 3),
    pp=st.integers(1, 4),
    cp=st.sampled_from([1, 2]),
)
def test_rank_map_keeps_tensor_groups_in_a_node_for_any_mesh(nodes, gpn, tp_exp, pp, cp):
    tp = 2**tp_exp
    n = nodes * gpn
    if tp > gpn or n % (tp * pp * cp):
        return
    cluster = {
        "gpus_per_node": gpn,
        "num_nodes": nodes,
        "peak_flops_per_s": {"bf16": 1e15},
        "memory_bytes": 8e10,
        "intra_node_bandwidth_bytes_per_s": 4e11,
        "inter_node_bandwidth_bytes_per_s": 5e10,
    }
    rm = rank_map(cluster_spec(cluster), layout_spec({"tp": tp, "pp": pp, "cp": cp}))
    assert len({tuple(c) for c in rm.coords}) == n
    outer = rm.coords[:, [0, 1, 3]]  # (dp, pp, cp) identifies one tensor-parallel group
    _, group = np.unique(outer, axis=0, return_inverse=True)
    for g in range(group.max() + 1):
        assert len(set(rm.node[group.reshape(-1) == g])) == 1


def test_megatron_core_default_order_puts_small_tensor_groups_data_parallel_peers_on_one_node():
    # tp 2, pp 4, dp 4 on 4 nodes of 8: tp-cp-ep-dp-pp makes each stage one node (2 x 4 ranks)
    rm = rank_map(cluster_spec({"preset": "dgx-a100", "nodes": 4}), layout_spec({"tp": 2, "pp": 4}))
    assert rm.order == "tp-cp-ep-dp-pp" and rm.mesh_dim_names == ("pp", "dp", "cp", "tp")
    dp, pp = rm.coords[:, 0], rm.coords[:, 1]
    for p in range(4):
        assert len(set(rm.node[pp == p])) == 1  # the stage's data-parallel peers share a node
    assert len(set(rm.node[dp == 0])) == 4  # a replica's stages span the nodes


def test_the_other_order_puts_pipeline_stages_on_one_node_and_replicas_across_nodes():
    rm = rank_map(
        cluster_spec({"preset": "dgx-a100", "nodes": 4}),
        layout_spec({"tp": 2, "pp": 4, "rank_order": "tp-cp-ep-pp-dp"}),
    )
    dp = rm.coords[:, 0]
    for d in range(4):
        assert len(set(rm.node[dp == d])) == 1
