"""Specification of the lower bounds on a plan's makespan (partitioners.placement.bounds).

Hand-built graphs on the ideal cost model give each bound's exact value; a property
test checks on many random graphs, inventories and options that no plan of any
strategy beats the bound.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from partitioners.costmodel.costs import CostModel
from partitioners.graph.generators import synthetic_hypergraph
from partitioners.graph.hypergraph import graph_from_ops
from partitioners.hardware.inventory import inventory_from_json, preset_inventory
from partitioners.placement.bounds import (
    LowerBounds,
    device_rates,
    load_bound_s,
    load_window_bound_s,
    lower_bounds,
    memory_cut_bound_s,
)
from partitioners.placement.context import placement_context
from partitioners.placement.engine import PlacementOptions, evaluate_placement, place
from tests.partitioners.hardware.test_device_types import fast_fast_slow, with_device_types
from tests.partitioners.placement.test_engine import IDEAL, MS, chain, cluster, two_chains

REL = 1e-9


def independent_ops(n: int, flops: float = MS):
    """``n`` operators with no edges between them (each reads its own input)."""
    ops = [(f"op{i}", "MatMul", flops, [f"in{i}"], [f"out{i}"]) for i in range(n)]
    sizes = {f"{k}{i}": 1.0 for i in range(n) for k in ("in", "out")}
    return graph_from_ops("independent", ops, sizes)


def test_a_chain_is_bound_by_its_critical_path():
    r = place(chain(4), cluster(4), cost_model=IDEAL)
    assert r.bounds.binding == "critical-path"
    assert r.bounds.lower_bound_s == pytest.approx(4e-3)
    assert r.optimality_gap == pytest.approx(0.0, abs=1e-12)


def test_critical_path_takes_the_fastest_device():
    r = place(chain(4), cluster(3, peaks=[1e12, 2e12, 1e12]), cost_model=IDEAL)
    assert r.bounds.by_bound_s["critical-path"] == pytest.approx(2e-3)


def test_independent_operators_are_bound_by_work_over_devices():
    r = place(independent_ops(8), cluster(4), cost_model=IDEAL)
    assert r.bounds.by_bound_s["load"] == pytest.approx(2e-3)
    assert r.bounds.lower_bound_s == pytest.approx(2e-3)
    assert r.makespan_s == pytest.approx(2e-3)


def test_max_devices_shrinks_the_devices_the_load_bound_counts():
    r = place(independent_ops(8), cluster(4), PlacementOptions(max_devices=2), cost_model=IDEAL)
    assert r.bounds.by_bound_s["load"] == pytest.approx(4e-3)


def test_a_device_slower_on_every_operator_counts_at_its_best_rate():
    # two devices, one twice as fast on everything: 3 ms of work clears at 1 + 0.5 per second
    floors = np.array([[1.0, 2.0], [1.0, 2.0], [1.0, 2.0]])
    p = floors.min(axis=1)
    rates = device_rates(floors, p)
    assert rates.tolist() == [1.0, 0.5]
    assert load_bound_s(p, rates) == pytest.approx(2.0)


def test_load_window_counts_the_work_that_cannot_start_early():
    # two ops of 1 s after a 3 s head, one device: 3 + 2
    head = np.array([0.0, 3.0, 3.0])
    tail = np.zeros(3)
    p = np.array([3.0, 1.0, 1.0])
    assert load_window_bound_s(head, tail, p, np.array([1.0])) == pytest.approx(5.0)


def test_memory_cut_charges_the_cheapest_transfer_when_weights_fit_on_no_device():
    g = chain(2, tensor_bytes=1000.0, param_bytes=600_000.0)
    head = np.array([0.0, 1.0])
    tail = np.array([1.0, 0.0])
    p = np.ones(2)
    bound = memory_cut_bound_s(
        g, head, tail, p, largest_budget_bytes=np.full(2, 1e6), min_latency_s=0.5, min_s_per_byte=1e-3
    )
    assert bound == pytest.approx(1.0 + 0.5 + 1.0 + 1.0)  # p0 + latency + 1000 bytes at 1 ms/kB + p1


def test_memory_cut_is_zero_when_the_weights_fit_on_one_device():
    g = chain(2, tensor_bytes=1000.0, param_bytes=100.0)
    bound = memory_cut_bound_s(
        g,
        np.zeros(2),
        np.zeros(2),
        np.ones(2),
        largest_budget_bytes=np.full(2, 1e6),
        min_latency_s=1.0,
        min_s_per_byte=1.0,
    )
    assert bound == 0.0


def test_a_split_forced_by_memory_adds_a_transfer_to_the_bound():
    g = chain(4, tensor_bytes=1e5, param_bytes=600_000.0)
    r = place(g, cluster(4, hbm_bytes=1_000_000), cost_model=IDEAL)
    assert r.feasible
    # 4 ms of compute plus 100 kB over a 1 GB/s link
    assert r.bounds.by_bound_s["memory-cut"] == pytest.approx(4.1e-3)
    assert r.bounds.binding == "memory-cut"
    assert r.makespan_s >= r.bounds.lower_bound_s * (1 - REL)


def test_an_infeasible_plan_gets_no_memory_cut_bound():
    g = chain(2, tensor_bytes=1000.0, param_bytes=2_000_000.0)
    r = place(g, cluster(2, hbm_bytes=1_000_000), PlacementOptions(allow_infeasible=True), cost_model=IDEAL)
    assert not r.feasible
    assert "memory-cut" not in r.bounds.by_bound_s


def test_device_types_restrict_the_fastest_device_of_the_critical_path():
    g = with_device_types(chain(3), every=1, types=("slow",))
    inv = fast_fast_slow()
    r = place(g, inv, cost_model=IDEAL)
    # every operator may run only on the 10 TFLOP/s slow device: 3 x 0.1 ms
    assert r.bounds.by_bound_s["critical-path"] == pytest.approx(3e-4)
    assert r.makespan_s >= r.bounds.lower_bound_s * (1 - REL)


def test_a_faster_memory_tier_lowers_the_floor_below_main_memory_times():
    g = synthetic_hypergraph(40, lanes=4, seed=3)
    inv = preset_inventory("dgx-h100")
    r = place(g, inv, PlacementOptions(max_devices=1))
    one = r.simulation.op_end_s - r.simulation.op_start_s
    assert r.bounds.by_bound_s["load"] <= float(one.sum()) * (1 + REL)
    assert r.makespan_s >= r.bounds.lower_bound_s * (1 - REL)


def test_a_re_planned_placement_on_devices_beyond_max_devices_is_still_bounded():
    g = two_chains()
    placement = np.array([0, 0, 0, 3, 3, 3])
    r = evaluate_placement(g, cluster(4), placement, PlacementOptions(max_devices=1), cost_model=IDEAL)
    assert r.makespan_s == pytest.approx(3e-3)
    assert r.makespan_s >= r.bounds.lower_bound_s * (1 - REL)


def test_the_gap_is_makespan_over_bound_less_one():
    b = LowerBounds(lower_bound_s=2.0, binding="load", by_bound_s={"load": 2.0})
    assert b.gap(3.0) == pytest.approx(0.5)


def test_a_plan_that_meets_its_bound_has_no_gap_whatever_the_rounding():
    b = LowerBounds(lower_bound_s=9.365867855712854e-05, binding="load", by_bound_s={})
    assert b.gap(9.365867855712853e-05) == 0.0


def test_the_exact_bound_binds_when_it_is_the_largest():
    b = LowerBounds(lower_bound_s=2.0, binding="load", by_bound_s={"load": 2.0}).with_bound("exact", 2.5)
    assert (b.lower_bound_s, b.binding) == (2.5, "exact")


def _inventory(
    n_devices: int, groups: int, peaks: list[float], hbm_bytes: float, fast_tier: float, typed: bool = False
):
    """``fast_tier``: capacity of an on-chip tier 100x faster than HBM (0: none)."""
    per = max(1, n_devices // groups)
    tiers = [{"name": "HBM", "capacity_bytes": hbm_bytes, "bandwidth_bytes_per_s": 2e11}]
    if fast_tier:
        tiers.append({"name": "SMEM", "capacity_bytes": fast_tier, "bandwidth_bytes_per_s": 2e13})
    return inventory_from_json(
        {
            "name": "random",
            "groups": [
                {
                    "name": f"g{gi}",
                    "devices": [
                        {
                            "name": f"d{gi}_{i}",
                            "type": "U" if typed and (gi * per + i) % 2 else "T",
                            "peak_flops": peaks[(gi * per + i) % len(peaks)],
                            "memory_tiers": tiers,
                        }
                        for i in range(per)
                    ],
                    "link": {"bandwidth_bytes_per_s": 5e10, "latency_s": 2e-6},
                }
                for gi in range(groups)
            ],
            "link": {"bandwidth_bytes_per_s": 1e10, "latency_s": 1e-5},
        }
    )


def test_a_plan_sped_up_by_on_chip_tiers_stays_above_its_bound():
    # memory-bound operators, a tier 100x faster than HBM that holds the activations
    g = synthetic_hypergraph(40, lanes=3, seed=0)
    inv = _inventory(2, 1, [2e14], 1e11, 3e7)
    r = place(g, inv)
    assert r.timed_with_tiers and r.makespan_s < r.chosen.makespan_s
    ctx = placement_context(g, inv, PlacementOptions())
    main = lower_bounds(ctx.simulation, ctx.devices, memory_budget_bytes=ctx.memory_budget_bytes, tiers=False)
    # main-memory times would bound the plan before level 3 only, not the re-timed plan
    assert main.lower_bound_s > r.makespan_s
    assert main.lower_bound_s <= r.chosen.makespan_s * (1 + REL)
    assert r.makespan_s >= r.bounds.lower_bound_s * (1 - REL)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    n_ops=st.integers(3, 60),
    lanes=st.integers(1, 6),
    seed=st.integers(0, 1000),
    n_devices=st.sampled_from([1, 2, 3, 4]),
    groups=st.sampled_from([1, 2]),
    peaks=st.lists(st.sampled_from([1e13, 5e13, 2e14]), min_size=1, max_size=4),
    hbm_bytes=st.sampled_from([1e6, 1e8, 1e11]),
    fast_tier=st.sampled_from([0.0, 2e5, 3e7]),
    strategy=st.sampled_from(["auto", "single", "heft", "metis", "pipeline", "hybrid", "exact"]),
    mode=st.sampled_from(["inference", "training"]),
    micro_batches=st.sampled_from([1, 2, 3]),
    pipeline=st.booleans(),
    launch=st.sampled_from([0.0, 5e-6]),
    typed=st.booleans(),
    max_devices=st.sampled_from([None, 1, 2, 3]),
)
def test_no_plan_of_any_strategy_beats_the_lower_bound(
    n_ops,
    lanes,
    seed,
    n_devices,
    groups,
    peaks,
    hbm_bytes,
    fast_tier,
    strategy,
    mode,
    micro_batches,
    pipeline,
    launch,
    typed,
    max_devices,
):
    if strategy == "hybrid" and micro_batches == 1:
        micro_batches = 2
    if strategy not in ("auto", "single", "exact") and n_devices == 1:
        n_devices = 2
    if strategy not in ("auto", "single", "exact"):
        max_devices = None
    if typed:
        # every third operator runs only on the U devices: there must be one among those allowed
        n_devices, max_devices = max(n_devices, 2), None
    groups = min(groups, n_devices)
    g = synthetic_hypergraph(n_ops, lanes=lanes, seed=seed)
    if typed:
        g = with_device_types(g, every=3, types=("U",))
    inv = _inventory(n_devices, groups, peaks, hbm_bytes, fast_tier, typed)
    opts = PlacementOptions(
        strategy=strategy,
        mode=mode,
        micro_batches=micro_batches,
        pipeline=pipeline,
        allow_infeasible=True,
        max_devices=max_devices,
        time_limit_s=0.3,
    )
    r = place(g, inv, opts, cost_model=CostModel(launch_overhead_s=launch))
    assert r.bounds is not None
    assert r.bounds.lower_bound_s > 0
    assert r.makespan_s >= r.bounds.lower_bound_s * (1 - REL)
    # and every scored candidate, simulated in main memory, too (memory-cut and exact: the feasible ones)
    any_plan = max(v for k, v in r.bounds.by_bound_s.items() if k not in ("memory-cut", "exact"))
    for c in r.candidates:
        if np.isfinite(c.makespan_s):
            assert c.makespan_s >= (r.bounds.lower_bound_s if c.feasible else any_plan) * (1 - REL)
