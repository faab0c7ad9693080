"""Specification of level 3, the per-tier memory plan (partitioners.placement.memory_tiers)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from partitioners.costmodel.costs import CostModel
from partitioners.costmodel.simulator import simulate
from partitioners.graph.generators import synthetic_hypergraph
from partitioners.graph.hypergraph import TENSOR_PARAMETER, graph_from_ops
from partitioners.hardware.inventory import inventory_from_json
from partitioners.placement.memory_tiers import (
    ALIGNMENT_BYTES,
    UNPLACED,
    plan_memory_tiers,
    tensor_lifetimes,
    tier_op_times_s,
)

IDEAL = CostModel(efficiency=(1.0,) * 8, memory_efficiency=1.0, launch_overhead_s=0.0)
KB = 1024


def device(name, l2_bytes=4 * KB, hbm_bytes=1e9):
    return {
        "name": name,
        "type": "T",
        "peak_flops": 1e12,
        "memory_tiers": [
            {"name": "HBM", "capacity_bytes": hbm_bytes, "bandwidth_bytes_per_s": 1e9},
            {"name": "L2", "capacity_bytes": l2_bytes, "bandwidth_bytes_per_s": 1e10},
        ],
    }


def cluster(n=1, l2_bytes=4 * KB, hbm_bytes=1e9):
    return inventory_from_json(
        {
            "name": "tiers",
            "groups": [
                {
                    "name": "g",
                    "devices": [device(f"d{i}", l2_bytes, hbm_bytes) for i in range(n)],
                    "link": {"bandwidth_bytes_per_s": 1e9, "latency_s": 0.0},
                }
            ],
        }
    )


def chain(sizes, weight_bytes=0.0):
    """op_i reads t_i (and w_i) and writes t_{i+1}; t_0 is a graph input."""
    ops, tb, params = [], {"t0": sizes[0]}, set()
    for i in range(len(sizes) - 1):
        ins = [f"t{i}"]
        if weight_bytes:
            ins.append(f"w{i}")
            tb[f"w{i}"] = weight_bytes
            params.add(f"w{i}")
        ops.append((f"op{i}", "Add", 1e6, ins, [f"t{i + 1}"]))
        tb[f"t{i + 1}"] = sizes[i + 1]
    return graph_from_ops("chain", ops, tb, params)


def plan_for(g, inv, placement):
    sim = simulate(g, inv, np.asarray(placement), cost_model=IDEAL)
    return sim, plan_memory_tiers(g, inv, sim)


def tier_of(g, plan, name, dev=0):
    t = int(np.flatnonzero(g.tensor_names == name)[0])
    e = np.flatnonzero((plan.tensor == t) & (plan.device == dev))[0]
    return int(plan.tier[e]), int(plan.offset_bytes[e])


def test_small_intermediate_activations_go_to_the_faster_tier():
    g = chain([1 * KB, 1 * KB, 1 * KB, 1 * KB])
    _, plan = plan_for(g, cluster(), [0, 0, 0])
    assert {tier_of(g, plan, n)[0] for n in ("t1", "t2")} == {1}  # L2


def test_the_graphs_inputs_and_outputs_stay_in_main_memory():
    # the runtime hands them over in main memory, before the first kernel and after the last
    g = chain([1 * KB, 1 * KB, 1 * KB, 1 * KB])
    _, plan = plan_for(g, cluster(), [0, 0, 0])
    assert tier_of(g, plan, "t0")[0] == 0 and tier_of(g, plan, "t3")[0] == 0


def test_a_tensor_larger_than_the_fast_tier_goes_to_main_memory():
    g = chain([1 * KB, 8 * KB, 1 * KB])  # t1 is an intermediate, but too big for the 4 KB L2
    _, plan = plan_for(g, cluster(l2_bytes=4 * KB), [0, 0])
    assert tier_of(g, plan, "t1")[0] == 0  # HBM


def test_parameters_stay_in_main_memory():
    g = chain([1 * KB, 1 * KB], weight_bytes=1 * KB)
    _, plan = plan_for(g, cluster(), [0])
    assert tier_of(g, plan, "w0") == (0, 0)


def test_freed_space_is_reused_and_live_tensors_do_not_overlap():
    # t1 (2K) is dead once op1 ends, so t3 can take its address; t2 is live with both
    g = chain([2 * KB, 2 * KB, 2 * KB, 2 * KB, 2 * KB])
    _, plan = plan_for(g, cluster(l2_bytes=4 * KB), [0, 0, 0, 0])
    assert tier_of(g, plan, "t1") == (1, 0)
    assert tier_of(g, plan, "t2") == (1, 2 * KB)
    assert tier_of(g, plan, "t3") == (1, 0)
    assert plan.high_water_bytes[0, 1] == 4 * KB


def test_a_tensor_read_on_two_devices_has_one_entry_per_device():
    g = chain([1 * KB, 1 * KB, 1 * KB])
    _, plan = plan_for(g, cluster(2), [0, 1])
    t1 = int(np.flatnonzero(g.tensor_names == "t1")[0])
    assert sorted(plan.device[plan.tensor == t1].tolist()) == [0, 1]


def test_sizes_are_aligned():
    g = chain([100, 300, 1])
    _, plan = plan_for(g, cluster(), [0, 0])
    assert plan.size_bytes.tolist() == [ALIGNMENT_BYTES, 2 * ALIGNMENT_BYTES, ALIGNMENT_BYTES]


def test_tier_bandwidth_speeds_up_memory_bound_operators():
    # op1 moves 2 KB: 2.048 us from HBM at 1 GB/s; its input t1 comes from L2 (10 GB/s) and
    # its output t2, the graph's, goes to HBM; compute is 1e6 FLOPs / 1e12 = 1 us
    g = chain([1 * KB, 1 * KB, 1 * KB])
    inv = cluster()
    sim, plan = plan_for(g, inv, [0, 0])
    base = sim.op_end_s[1] - sim.op_start_s[1]
    assert base == pytest.approx(2 * KB / 1e9)
    times = tier_op_times_s(g, inv, np.array([0, 0]), plan, cost_model=IDEAL)
    assert times[1, 0] == pytest.approx(max(1e-6, KB / 1e10 + KB / 1e9))


def test_what_fits_nowhere_is_reported_unplaced_never_above_capacity():
    # the 1e6-byte weight fills main memory, so the 8 KB activation (too big for L2) has no room
    g = chain([1 * KB, 8 * KB], weight_bytes=1e6 - 512)
    inv = cluster(hbm_bytes=1e6)
    sim = simulate(g, inv, np.array([0]), cost_model=IDEAL)
    plan = plan_memory_tiers(g, inv, sim, memory_budget_bytes=np.array([1e6]))
    assert not plan.hbm_fits
    assert tier_of(g, plan, "t1") == (UNPLACED, -1)
    # the 1 KB graph input t0, held in main memory, finds no room either
    assert plan.unplaced_bytes.tolist() == [9 * KB]
    assert plan.capacity_violations == 0


def test_an_empty_tensor_takes_no_space():
    g = chain([1 * KB, 0, 1 * KB])
    _, plan = plan_for(g, cluster(), [0, 0])
    t1 = int(np.flatnonzero(g.tensor_names == "t1")[0])
    assert plan.size_bytes[plan.tensor == t1].tolist() == [0]


@settings(max_examples=15, deadline=None)
@given(n=st.integers(5, 200), seed=st.integers(0, 10_000), l2=st.sampled_from([4 * KB, 64 * KB, 8 * 2**20]))
def test_no_live_overlap_and_no_tier_over_capacity(n, seed, l2):
    g = synthetic_hypergraph(n, lanes=4, seed=seed)
    inv = cluster(3, l2_bytes=l2)
    placement = np.random.default_rng(seed).integers(0, 3, n)
    sim = simulate(g, inv, placement, cost_model=IDEAL)
    plan = plan_memory_tiers(g, inv, sim)
    assert plan.capacity_violations == 0
    assert plan.high_water_bytes[:, 1].max() <= l2
    # every holding of the simulator's lifetimes is planned exactly once
    t, _d, _, _ = tensor_lifetimes(g, sim)
    assert np.unique(plan.tensor * 3 + plan.device).shape[0] == plan.tensor.shape[0] == t.shape[0]
    # parameters in main memory; no two holdings overlap in time and address in a tier
    assert np.all(plan.tier[g.tensor_kind[plan.tensor] == TENSOR_PARAMETER] == 0)
    for dev in range(3):
        for tier in range(2):
            sel = np.flatnonzero((plan.device == dev) & (plan.tier == tier))
            a, f = plan.alloc_s[sel], plan.free_s[sel]
            lo, hi = plan.offset_bytes[sel], plan.offset_bytes[sel] + plan.size_bytes[sel]
            both_live = (a[:, None] < f[None, :]) & (a[None, :] < f[:, None])
            overlap = (lo[:, None] < hi[None, :]) & (lo[None, :] < hi[:, None])
            np.fill_diagonal(both_live, False)
            assert not (both_live & overlap).any()
