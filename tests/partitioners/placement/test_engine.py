"""Specification of the placement driver (partitioners.placement.engine).

Tiny hand-built graphs on an ideal cost model (100% of peak, no launch overhead,
1 TFLOP/s devices, 1 GB/s links) so makespans are exact sums of milliseconds.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from partitioners.costmodel.costs import CostModel
from partitioners.costmodel.profiles import CostModelSpec
from partitioners.costmodel.simulator import remote_transfers, simulate
from partitioners.errors import Infeasible, InvalidInput
from partitioners.graph.generators import synthetic_graph_json, synthetic_hypergraph
from partitioners.graph.hypergraph import graph_from_ops
from partitioners.graph.json_import import graph_from_json
from partitioners.graph.transforms import PHASE_BACKWARD, PHASE_FORWARD
from partitioners.hardware.inventory import inventory_from_json
from partitioners.placement.engine import PlacementOptions, place
from partitioners.placement.memory_tiers import placed_tier_op_times_s
from partitioners.placement.pipeline import quotient_is_acyclic

IDEAL = CostModel(efficiency=(1.0,) * 8, memory_efficiency=1.0, launch_overhead_s=0.0)
MS = 1e9  # FLOPs that take one millisecond on a 1 TFLOP/s device


def cluster(n_devices=4, groups=1, hbm_bytes=1e9, names=None, peaks=None):
    per = n_devices // groups
    names = names or [f"d{i}" for i in range(n_devices)]
    peaks = peaks or [1e12] * n_devices
    return inventory_from_json(
        {
            "name": "test",
            "groups": [
                {
                    "name": f"g{gi}",
                    "devices": [
                        {
                            "name": names[gi * per + i],
                            "type": "T",
                            "peak_flops": peaks[gi * per + i],
                            "memory_tiers": [
                                {"name": "HBM", "capacity_bytes": hbm_bytes, "bandwidth_bytes_per_s": 1e15}
                            ],
                        }
                        for i in range(per)
                    ],
                    "link": {"bandwidth_bytes_per_s": 1e9, "latency_s": 0.0},
                }
                for gi in range(groups)
            ],
            "link": {"bandwidth_bytes_per_s": 1e8, "latency_s": 0.0},
        }
    )


def chain(n_ops=4, tensor_bytes=1e6, param_bytes=0.0):
    ops, sizes, params = [], {"t0": tensor_bytes}, set()
    for i in range(n_ops):
        ins = [f"t{i}"]
        if param_bytes:
            ins.append(f"w{i}")
            sizes[f"w{i}"] = param_bytes
            params.add(f"w{i}")
        ops.append((f"op{i}", "MatMul", MS, ins, [f"t{i + 1}"]))
        sizes[f"t{i + 1}"] = tensor_bytes
    return graph_from_ops("chain", ops, sizes, params)


def two_chains(length=3):
    ops, sizes = [], {}
    for c in "ab":
        sizes[f"{c}0"] = 1.0
        for i in range(length):
            ops.append((f"{c}{i}", "MatMul", MS, [f"{c}{i}"], [f"{c}{i + 1}"]))
            sizes[f"{c}{i + 1}"] = 1.0
    return graph_from_ops("two-chains", ops, sizes)


def test_a_chain_stays_on_one_device():
    r = place(chain(), cluster(4), cost_model=IDEAL)
    assert r.devices_used == 1
    assert r.makespan_s == pytest.approx(4e-3)


def test_a_chain_goes_to_the_fastest_device():
    r = place(chain(), cluster(3, peaks=[1e12, 2e12, 1e12]), cost_model=IDEAL)
    assert set(r.placement.tolist()) == {1}
    assert r.makespan_s == pytest.approx(2e-3)


def test_an_empty_graph_is_rejected():
    with pytest.raises(InvalidInput):
        place(graph_from_ops("empty", [], {}), cluster(2), cost_model=IDEAL)


def test_independent_chains_use_two_devices():
    r = place(two_chains(), cluster(4), cost_model=IDEAL)
    assert r.devices_used == 2
    assert r.makespan_s == pytest.approx(3e-3)


def test_micro_batches_run_one_per_device():
    r = place(chain(3, tensor_bytes=1.0), cluster(4), PlacementOptions(micro_batches=4), cost_model=IDEAL)
    assert r.makespan_s == pytest.approx(3e-3)
    assert r.devices_used == 4
    mb_device = {int(mb): set(r.placement[r.expanded.op_micro_batch == mb].tolist()) for mb in range(4)}
    assert all(len(devs) == 1 for devs in mb_device.values())


def test_weights_too_big_for_one_device_are_split_within_capacity():
    g = chain(4, tensor_bytes=1000.0, param_bytes=600_000.0)
    r = place(g, cluster(4, hbm_bytes=1_000_000), cost_model=IDEAL)
    assert r.feasible
    assert r.devices_used == 4
    assert r.simulation.peak_memory_bytes.max() <= 1_000_000
    single = next(c for c in r.candidates if c.strategy == "single")
    assert not single.feasible


def test_infeasible_request_names_the_device_and_the_excess():
    g = chain(2, tensor_bytes=1000.0, param_bytes=2_000_000.0)
    with pytest.raises(Infeasible, match=r"on device d\d, .* over its budget"):
        place(g, cluster(2, hbm_bytes=1_000_000), cost_model=IDEAL)


def test_allow_infeasible_returns_the_least_infeasible_plan():
    g = chain(2, tensor_bytes=1000.0, param_bytes=2_000_000.0)
    r = place(g, cluster(2, hbm_bytes=1_000_000), PlacementOptions(allow_infeasible=True), cost_model=IDEAL)
    assert not r.feasible
    assert r.infeasible_device is not None and r.bytes_over > 0


def test_headroom_shrinks_the_budget():
    g = chain(2, tensor_bytes=1000.0, param_bytes=600_000.0)
    opts = PlacementOptions(memory_headroom_fraction=0.5, allow_infeasible=True)
    r = place(g, cluster(2, hbm_bytes=1_000_000), opts, cost_model=IDEAL)
    assert r.memory_budget_bytes.tolist() == [500_000.0, 500_000.0]
    assert not r.feasible


def test_pipeline_mode_gives_an_acyclic_stage_graph_even_from_metis():
    g = synthetic_hypergraph(400, lanes=6, seed=3)
    r = place(g, cluster(4), PlacementOptions(pipeline=True, strategy="metis"), cost_model=IDEAL)
    assert r.acyclic
    assert quotient_is_acyclic(r.graph, r.placement)
    assert all(c.acyclic for c in r.candidates)


def test_training_pipeline_is_acyclic_on_forward_edges_and_beats_one_device():
    g = chain(8, tensor_bytes=1.0, param_bytes=100.0)
    opts = PlacementOptions(mode="training", micro_batches=4, pipeline=True)
    r = place(g, cluster(4), opts, cost_model=IDEAL)
    single = next(c for c in r.candidates if c.strategy == "single")
    src, dst, _ = r.graph.op_edges()
    for phase in (PHASE_FORWARD, PHASE_BACKWARD):
        same_phase = (r.expanded.op_phase[src] == phase) & (r.expanded.op_phase[dst] == phase)
        assert quotient_is_acyclic(r.graph, r.placement, same_phase)
    assert r.makespan_s < single.makespan_s / 2


def test_training_counts_weights_and_optimizer_state():
    g = chain(2, tensor_bytes=1000.0, param_bytes=10_000.0)
    r = place(g, cluster(1), PlacementOptions(mode="training"), cost_model=IDEAL)
    # weights + Adam moments resident; gradients are live activations on top
    assert r.simulation.param_memory_bytes[0] == 2 * 10_000 * 3
    assert r.simulation.peak_memory_bytes[0] >= 2 * 10_000 * 4


def test_max_devices_limits_the_plan():
    r = place(two_chains(), cluster(4), PlacementOptions(max_devices=1), cost_model=IDEAL)
    assert r.devices_used == 1
    assert r.makespan_s == pytest.approx(6e-3)


@pytest.mark.parametrize("strategy", ["heft", "metis", "pipeline", "hybrid"])
def test_a_strategy_that_needs_several_devices_on_one_is_invalid_input(strategy):
    with pytest.raises(InvalidInput) as err:
        place(
            chain(), cluster(4), PlacementOptions(strategy=strategy, max_devices=1, micro_batches=2), cost_model=IDEAL
        )
    assert (err.value.field, err.value.code) == ("options.strategy", "strategy-not-applicable")


def test_hybrid_with_one_micro_batch_is_invalid_input_naming_the_fix():
    with pytest.raises(InvalidInput) as err:
        place(chain(), cluster(4), PlacementOptions(strategy="hybrid"), cost_model=IDEAL)
    assert err.value.field == "options.strategy" and "micro_batches > 1" in str(err.value)


def test_a_training_graph_without_parameters_is_placed_by_every_strategy_family():
    # the stage memory profile summed no parameter bytes as int64 and could not add floats to it
    graph = graph_from_ops("no-params", [("op0", "LayerNormalization", MS, [], [])], {})
    result = place(graph, cluster(4), PlacementOptions(mode="training", micro_batches=2), cost_model=IDEAL)
    assert {c.strategy.split("-")[0] for c in result.candidates} >= {"single", "hybrid", "pipeline", "heft"}


def test_communication_objective_moves_nothing_when_one_device_fits():
    r = place(two_chains(), cluster(4), PlacementOptions(objective="communication"), cost_model=IDEAL)
    assert r.simulation.comm_bytes == 0.0


def test_chosen_plan_is_the_best_feasible_candidate_and_all_are_listed():
    r = place(two_chains(), cluster(4), cost_model=IDEAL)
    names = [c.strategy for c in r.candidates]
    assert "single" in names and "heft" in names and any(n.startswith("metis") for n in names)
    best = min(c.objective_value for c in r.candidates if c.feasible)
    assert r.objective_value == pytest.approx(best)


def test_transfers_are_exactly_the_remote_tensors_with_their_link_class():
    g = synthetic_hypergraph(200, lanes=6, seed=1)
    r = place(g, cluster(4, groups=2), PlacementOptions(strategy="metis"), cost_model=IDEAL)
    t, s, d = remote_transfers(r.graph, r.placement)
    assert r.transfers.tensor.tolist() == t.tolist()
    assert r.transfers.dst.tolist() == d.tolist()
    expected_class = np.where(s // 2 == d // 2, 1, 2)  # groups are d0,d1 | d2,d3
    assert r.transfers.link_class.tolist() == expected_class.tolist()
    for rec in r.transfers.grouped():
        assert rec["src"] not in rec["dst"]


def test_level3_plan_never_passes_a_tier_capacity():
    g = synthetic_hypergraph(300, lanes=6, seed=2)
    r = place(g, inventory_from_json({"preset": "dgx-h100", "nodes": 1}))
    assert r.memory_plan.capacity_violations == 0
    assert r.memory_plan.hbm_fits


# graphs whose plans keep the tiered timing (the planner keeps it only where the tiers it
# plans on the re-timed schedule are the ones that timed it), with launches paid per device
@pytest.mark.parametrize(("n_ops", "seed"), [(300, 2), (600, 4), (80, 9)])
def test_a_plan_timed_with_tiers_times_every_operator_with_the_tiers_it_states(n_ops, seed):
    graph = graph_from_json(synthetic_graph_json(n_ops, seed=seed))
    inventory = inventory_from_json({"preset": "dgx-h100", "nodes": 1})
    options = PlacementOptions(mode="training", micro_batches=2, cost_model=CostModelSpec(launch="per-device"))
    r = place(graph, inventory, options)
    assert r.timed_with_tiers
    stated = placed_tier_op_times_s(
        r.graph, inventory, r.placement, r.memory_plan.tensor, r.memory_plan.device, r.memory_plan.tier
    )
    np.testing.assert_allclose(r.simulation.op_end_s - r.simulation.op_start_s, stated, rtol=1e-9, atol=1e-15)


def test_bad_options_are_rejected():
    with pytest.raises(InvalidInput):
        PlacementOptions(objective="joules")
    with pytest.raises(InvalidInput):
        PlacementOptions(micro_batches=0)


@settings(max_examples=12, deadline=None)
@given(n=st.integers(10, 150), seed=st.integers(0, 10_000), m=st.integers(1, 3))
def test_every_op_placed_once_deterministic_and_label_free(n, seed, m):
    g = synthetic_hypergraph(n, lanes=5, seed=seed)
    opts = PlacementOptions(micro_batches=m, seed=seed)
    a = place(g, cluster(4), opts, cost_model=IDEAL)
    b = place(g, cluster(4), opts, cost_model=IDEAL)
    renamed = place(g, cluster(4, names=["z", "y", "x", "w"]), opts, cost_model=IDEAL)
    assert a.placement.shape == (a.graph.n_ops,)
    assert set(a.placement.tolist()) <= {0, 1, 2, 3}
    assert np.array_equal(a.placement, b.placement) and a.candidates == b.candidates
    assert renamed.makespan_s == pytest.approx(a.makespan_s)
    replay = simulate(a.graph, cluster(4), a.placement, cost_model=IDEAL, priority=a.priority)
    assert replay.makespan_s <= a.candidates[0].makespan_s + 1e-12  # never worse than one device


# ------------------------------------------------------------------ strategy building blocks

from partitioners.placement.acyclic import acyclic_repair  # noqa: E402
from partitioners.placement.heft import heft_schedule  # noqa: E402
from partitioners.placement.metis_adapter import metis_graph, metis_partition, quantise, target_fractions  # noqa: E402
from partitioners.placement.pipeline import linear_partition  # noqa: E402


def test_quantise_maps_to_positive_integers_keeping_the_largest():
    q = quantise(np.array([0.0, 0.5, 1.0, -3.0]), resolution=100)
    assert q.tolist() == [1, 50, 100, 1]


def test_target_fractions_sum_to_exactly_one():
    f = target_fractions(np.array([1.0, 1.0, 1.0]))
    assert sum(f) == 1.0 and f[0] == pytest.approx(1 / 3)


def test_a_tensor_read_twice_is_one_clique_net_not_two_edges():
    # a -> t -> {b, c}: pins {a, b, c}, each clique edge carries bytes / (pins - 1)
    g = graph_from_ops(
        "fan", [("a", "X", 1.0, [], ["t"]), ("b", "X", 1.0, ["t"], []), ("c", "X", 1.0, ["t"], [])], {"t": 100.0}
    )
    mg = metis_graph(g, np.ones(3))
    assert mg.adj_starts.tolist() == [0, 2, 4, 6]
    assert mg.adjacent.tolist() == [1, 2, 0, 2, 0, 1]
    assert len(set(mg.edge_weights.tolist())) == 1  # symmetric, all 50 bytes before scaling
    edge = metis_graph(g, np.ones(3), hypergraph=False)
    assert edge.adjacent.tolist() == [1, 2, 0, 0]


def test_metis_cuts_two_heavy_clusters_at_the_light_edge():
    ops = [("a", "X", 1.0, [], ["ta"]), ("b", "X", 1.0, ["ta"], ["tb"]), ("c", "X", 1.0, ["tb"], ["tc"])]
    ops += [("d", "X", 1.0, ["tc"], ["td"]), ("e", "X", 1.0, ["td"], ["te"]), ("f", "X", 1.0, ["te"], [])]
    sizes = {"ta": 1e6, "tb": 1e6, "tc": 1.0, "td": 1e6, "te": 1e6}
    parts = metis_partition(metis_graph(graph_from_ops("two", ops, sizes), np.ones(6)), 2, seed=0)
    assert len(set(parts[:3].tolist())) == 1 and len(set(parts[3:].tolist())) == 1
    assert parts[0] != parts[3]


def test_linear_partition_balances_time_by_speed():
    stage, ok = linear_partition(np.ones(8), np.array([3.0, 1.0]))
    assert stage.tolist() == [0, 0, 0, 0, 0, 0, 1, 1] and ok


def test_linear_partition_respects_memory_before_balance():
    stage, ok = linear_partition(np.ones(4), np.ones(2), np.array([5.0, 1.0, 1.0, 1.0]), np.array([5.0, 5.0]))
    assert stage.tolist() == [0, 1, 1, 1] and ok


def test_acyclic_repair_moves_operators_forward_until_no_edge_goes_back():
    # chain 0 -> 1 -> 2 -> 3 with parts [0, 1, 0, 1]: stage graph 0 <-> 1 is a cycle
    src, dst = np.array([0, 1, 2]), np.array([1, 2, 3])
    stage, part_of_stage = acyclic_repair(4, src, dst, np.arange(4), np.array([0, 1, 0, 1]))
    assert stage.tolist() == [0, 1, 1, 1]
    assert part_of_stage.tolist() == [0, 1]


def test_heft_keeps_a_chain_local_and_spreads_a_fork():
    # fork: s -> {x, y}; x and y take 1 ms each, the transfer 1 us
    g = graph_from_ops(
        "fork",
        [("s", "X", MS, [], ["t"]), ("x", "X", MS, ["t"], []), ("y", "X", MS, ["t"], [])],
        {"t": 1e3},
    )
    times = np.full((3, 2), 1e-3)
    lat = np.zeros((2, 2))
    spb = np.array([[0.0, 1e-9], [1e-9, 0.0]])
    h = heft_schedule(g, times, lat, spb, np.array([0, 1, 1]))
    assert h.placement[0] == h.placement[1] or h.placement[0] == h.placement[2]
    assert len(set(h.placement.tolist())) == 2
    assert h.makespan_s == pytest.approx(2e-3 + 1e-6)


def test_contention_aware_heft_sees_a_busy_port():
    # s feeds four consumers; with one egress port the 2nd..4th remote copies wait
    ops = [("s", "X", MS, [], ["t"])] + [(f"c{i}", "X", MS, ["t"], []) for i in range(4)]
    g = graph_from_ops("fan4", ops, {"t": 1e6})
    times = np.full((5, 4), 1e-3)
    lat = np.zeros((4, 4))
    spb = np.full((4, 4), 1e-9) - np.eye(4) * 1e-9  # 1 ms per copy
    plain = heft_schedule(g, times, lat, spb, np.array([0, 1, 1, 1, 1]), device_group=np.zeros(4, dtype=np.int64))
    aware = heft_schedule(
        g, times, lat, spb, np.array([0, 1, 1, 1, 1]), device_group=np.zeros(4, dtype=np.int64), contention=True
    )
    # plain HEFT believes both remote copies arrive at 2 ms; with one port the second lands at 3 ms,
    # so spreading to a third device no longer pays and the honest estimate is 4 ms
    assert plain.makespan_s == pytest.approx(3e-3)
    assert aware.makespan_s == pytest.approx(4e-3)
    assert len(set(plain.placement.tolist())) == 3 and len(set(aware.placement.tolist())) == 2


def test_throughput_objective_is_the_busiest_device_per_micro_batch():
    r = place(
        chain(4, tensor_bytes=1.0),
        cluster(4),
        PlacementOptions(objective="throughput", micro_batches=4),
        cost_model=IDEAL,
    )
    assert r.objective_value == pytest.approx(r.simulation.device_busy_s.max() / 4)
    assert r.objective_value == pytest.approx(1e-3)  # 16 ms of work over 4 devices, 4 micro-batches


def test_plan_records_name_tensors_devices_and_tiers():
    r = place(two_chains(), cluster(4), cost_model=IDEAL)
    recs = r.memory_plan.records(r.graph, cluster(4))
    assert {x["tier"] for x in recs} == {"HBM"}
    assert {x["tensor"] for x in recs} == set(r.graph.tensor_names.tolist())
    assert r.transfers.grouped(r.graph, cluster(4)) == []  # two independent chains need no traffic


def test_progress_is_reported_in_order_up_to_the_end():
    seen: list[float] = []
    place(synthetic_hypergraph(300, lanes=6, seed=4), cluster(4), cost_model=IDEAL, on_progress=seen.append)
    assert seen and seen == sorted(seen)
    assert seen[0] > 0.0 and seen[-1] >= 0.9 and max(seen) <= 1.0
