"""Specification of the schedule simulator on tiny graphs with hand-computed answers.

Unless a test says otherwise: links move 1e9 bytes/s with zero latency, operator
times are given explicitly, so every expected number below is exact arithmetic.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from partitioners.costmodel.costs import CostModel
from partitioners.costmodel.simulator import (
    connectivity_comm_bytes,
    critical_path_priority,
    estimate_makespan_s,
    memory_timeline,
    prepare_simulation,
    remote_transfers,
    simulate,
    summarize,
)
from partitioners.errors import InvalidInput
from partitioners.graph.hypergraph import graph_from_ops
from partitioners.hardware.inventory import inventory_from_json, with_device_speed

GB = 1e9


def _inventory(groups: list[int], *, intra_bw: float = GB, inter_bw: float = GB, latency_s: float = 0.0):
    """Groups of ``groups[i]`` devices named d0, d1, ... in order."""
    doc_groups = []
    k = 0
    for gi, n in enumerate(groups):
        devices = []
        for _ in range(n):
            devices.append(
                {
                    "name": f"d{k}",
                    "type": "test",
                    "peak_flops": 1e12,
                    "memory_tiers": [{"name": "HBM", "capacity_bytes": 1e12, "bandwidth_bytes_per_s": 1e12}],
                }
            )
            k += 1
        doc_groups.append(
            {"name": f"g{gi}", "devices": devices, "link": {"bandwidth_bytes_per_s": intra_bw, "latency_s": latency_s}}
        )
    return inventory_from_json(
        {"name": "t", "groups": doc_groups, "link": {"bandwidth_bytes_per_s": inter_bw, "latency_s": latency_s}}
    )


def _times(durations: list[float], n_devices: int) -> np.ndarray:
    """Same duration on every device."""
    return np.repeat(np.array(durations, dtype=np.float64)[:, None], n_devices, axis=1)


def _memory_chain():
    """a reads input x (100) and weight w (1000), writes ta (200); b: ta -> tb (300);
    c: ta, tb -> tc (50, a graph output)."""
    return graph_from_ops(
        "memory",
        [
            ("a", "MatMul", 0, ["x", "w"], ["ta"]),
            ("b", "Op", 0, ["ta"], ["tb"]),
            ("c", "Op", 0, ["ta", "tb"], ["tc"]),
        ],
        {"x": 100, "w": 1000, "ta": 200, "tb": 300, "tc": 50},
        parameters={"w"},
    )


def test_chain_on_one_device_runs_back_to_back():
    g = graph_from_ops(
        "chain",
        [("a", "Op", 0, ["x"], ["ta"]), ("b", "Op", 0, ["ta"], ["tb"]), ("c", "Op", 0, ["tb"], ["tc"])],
        {"x": 8, "ta": 8, "tb": 8, "tc": 8},
    )
    inv = _inventory([2])
    r = simulate(g, inv, np.array([0, 0, 0]), op_times_s=_times([1, 2, 3], 2))
    assert r.makespan_s == 6.0
    assert r.op_start_s.tolist() == [0.0, 1.0, 3.0]
    assert r.op_end_s.tolist() == [1.0, 3.0, 6.0]
    assert r.transfer_tensor.size == 0
    assert r.comm_bytes == 0.0
    assert r.device_busy_s.tolist() == [6.0, 0.0]
    assert r.device_idle_s.tolist() == [0.0, 6.0]


def test_fork_join_across_two_devices_waits_for_both_transfers():
    # a (d0) -> t1 (1 GB) -> b (d1) -> tb (1 GB) -> d (d0); a -> c (d0) -> d
    g = graph_from_ops(
        "fork-join",
        [
            ("a", "Op", 0, ["x"], ["t1"]),
            ("b", "Op", 0, ["t1"], ["tb"]),
            ("c", "Op", 0, ["t1"], ["tc"]),
            ("d", "Op", 0, ["tb", "tc"], ["out"]),
        ],
        {"x": 8, "t1": GB, "tb": GB, "tc": 8, "out": 8},
    )
    inv = _inventory([2])
    r = simulate(g, inv, np.array([0, 1, 0, 0]), op_times_s=_times([1, 2, 1, 1], 2))
    # t1 crosses 1..2, b runs 2..4, tb crosses 4..5, d runs 5..6; c (1..2) is off the path
    assert r.op_start_s.tolist() == [0.0, 2.0, 1.0, 5.0]
    assert r.makespan_s == 6.0
    names = [g.tensor_names[t] for t in r.transfer_tensor]
    assert names == ["t1", "tb"]
    assert r.transfer_start_s.tolist() == [1.0, 4.0]
    assert r.transfer_end_s.tolist() == [2.0, 5.0]
    assert r.comm_bytes == 2 * GB


def test_tensor_read_three_times_on_one_remote_device_crosses_once():
    g = graph_from_ops(
        "fan-out",
        [
            ("a", "Op", 0, ["x"], ["t"]),
            ("b", "Op", 0, ["t"], ["tb"]),
            ("c", "Op", 0, ["t"], ["tc"]),
            ("d", "Op", 0, ["t"], ["td"]),
        ],
        {"x": 8, "t": GB, "tb": 8, "tc": 8, "td": 8},
    )
    inv = _inventory([2])
    r = simulate(g, inv, np.array([0, 1, 1, 1]), op_times_s=_times([1, 1, 1, 1], 2))
    assert r.transfer_tensor.tolist() == [1]  # "t" is tensor 1
    assert r.comm_bytes == GB
    assert connectivity_comm_bytes(g, np.array([0, 1, 1, 1])) == GB
    assert r.link_src.tolist() == [0] and r.link_dst.tolist() == [1] and r.link_bytes.tolist() == [GB]
    # arrives at 2, then the three consumers run one after another on d1
    assert r.makespan_s == 5.0


def test_two_transfers_on_one_link_serialise():
    g = graph_from_ops(
        "contention",
        [
            ("a", "Op", 0, ["x"], ["t1", "t2"]),
            ("b", "Op", 0, ["t1"], ["tb"]),
            ("c", "Op", 0, ["t2"], ["tc"]),
        ],
        {"x": 8, "t1": GB, "t2": GB, "tb": 8, "tc": 8},
    )
    inv = _inventory([2])
    r = simulate(g, inv, np.array([0, 1, 1]), op_times_s=_times([1, 1, 1], 2))
    assert sorted(zip(r.transfer_start_s.tolist(), r.transfer_end_s.tolist())) == [(1.0, 2.0), (2.0, 3.0)]
    # b runs 2..3 (after the first arrival), c 3..4
    assert r.makespan_s == 4.0


def test_transfers_on_different_link_classes_do_not_contend():
    # d0 sends to d1 (same group, NVLink-like port) and to d2 (other group, NIC): both 1..2
    g = graph_from_ops(
        "two-ports",
        [
            ("a", "Op", 0, ["x"], ["t1", "t2"]),
            ("b", "Op", 0, ["t1"], ["tb"]),
            ("c", "Op", 0, ["t2"], ["tc"]),
        ],
        {"x": 8, "t1": GB, "t2": GB, "tb": 8, "tc": 8},
    )
    inv = _inventory([2, 1])
    r = simulate(g, inv, np.array([0, 1, 2]), op_times_s=_times([1, 1, 1], 3))
    assert r.transfer_start_s.tolist() == [1.0, 1.0]
    assert r.transfer_end_s.tolist() == [2.0, 2.0]
    assert r.makespan_s == 3.0
    assert r.comm_bytes_by_class == {"intra-group": GB, "inter-group": GB}


def test_latency_adds_to_every_transfer():
    g = graph_from_ops(
        "latency", [("a", "Op", 0, ["x"], ["t"]), ("b", "Op", 0, ["t"], ["u"])], {"x": 8, "t": GB, "u": 8}
    )
    inv = _inventory([2], latency_s=0.5)
    r = simulate(g, inv, np.array([0, 1]), op_times_s=_times([1, 1], 2))
    assert r.transfer_end_s.tolist() == [2.5]
    assert r.makespan_s == 3.5


def test_peak_memory_of_a_chain_by_hand():
    # a reads input x (100) and weight w (1000), writes ta (200); b: ta -> tb (300);
    # c: ta, tb -> tc (50, a graph output). One device, 1 s each:
    #   [0,1): x + ta = 300; [1,2): ta + tb = 500 (x freed when a ends);
    #   [2,3): ta + tb + tc = 550. Plus the resident weight: 1550.
    g = _memory_chain()
    inv = _inventory([1])
    r = simulate(g, inv, np.array([0, 0, 0]), op_times_s=_times([1, 1, 1], 1))
    assert r.param_memory_bytes.tolist() == [1000.0]
    assert r.peak_memory_bytes.tolist() == [1550.0]


def test_peak_memory_counts_sender_buffer_until_transfer_ends_and_receiver_from_its_start():
    # a (d0, 0..1) writes t (1000 B); 1000 B/s link: transfer 1..2; b (d1, 2..3) writes u (10 B)
    g = graph_from_ops("memory-remote", [("a", "Op", 0, [], ["t"]), ("b", "Op", 0, ["t"], ["u"])], {"t": 1000, "u": 10})
    inv = _inventory([2], intra_bw=1000.0)
    r = simulate(g, inv, np.array([0, 1]), op_times_s=_times([1, 1], 2))
    assert r.transfer_start_s.tolist() == [1.0] and r.transfer_end_s.tolist() == [2.0]
    assert r.peak_memory_bytes.tolist() == [1000.0, 1010.0]


def test_parameters_are_resident_once_per_reading_device_and_never_transferred():
    g = graph_from_ops(
        "params",
        [("a", "MatMul", 0, ["w"], ["t"]), ("b", "MatMul", 0, ["w", "t"], ["u"]), ("c", "MatMul", 0, ["w"], ["v"])],
        {"w": 1000, "t": 1, "u": 1, "v": 1},
        parameters={"w"},
    )
    inv = _inventory([2])
    r = simulate(g, inv, np.array([0, 1, 1]), op_times_s=_times([1, 1, 1], 2))
    assert r.param_memory_bytes.tolist() == [1000.0, 1000.0]
    assert [g.tensor_names[t] for t in r.transfer_tensor] == ["t"]


def test_critical_path_first_runs_the_op_with_the_longer_tail_first():
    # one device holds two ready ops; "short" (id 0) has no successor, "long" (id 1)
    # feeds a 5 s op on the other device. Critical path first: long, then short -> 6 s;
    # the opposite order would give 7 s.
    g = graph_from_ops(
        "priority",
        [("short", "Op", 0, [], ["s"]), ("long", "Op", 0, [], ["l"]), ("tail", "Op", 0, ["l"], ["o"])],
        {"s": 1, "l": 0, "o": 1},
    )
    inv = _inventory([2])
    placement = np.array([0, 0, 1])
    times = _times([1, 1, 5], 2)
    assert simulate(g, inv, placement, op_times_s=times).makespan_s == 6.0
    backwards = simulate(g, inv, placement, op_times_s=times, priority=np.array([2.0, 1.0, 0.0]))
    assert backwards.makespan_s == 7.0


def test_connectivity_counts_each_extra_device_a_tensor_spans_once():
    g = graph_from_ops(
        "span",
        [
            ("a", "Op", 0, [], ["t"]),
            ("b", "Op", 0, ["t"], ["u1"]),
            ("c", "Op", 0, ["t"], ["u2"]),
            ("d", "Op", 0, ["t"], ["u3"]),
        ],
        {"t": 10, "u1": 1, "u2": 1, "u3": 1},
    )
    # t spans devices {0, 1, 2}: 2 x 10 bytes; b on the producer's device adds nothing
    assert connectivity_comm_bytes(g, np.array([0, 0, 1, 2])) == 20.0
    assert connectivity_comm_bytes(g, np.array([0, 0, 0, 0])) == 0.0


def test_fast_path_gives_the_same_makespan_without_timeline():
    g = graph_from_ops(
        "fork-join",
        [("a", "Op", 0, [], ["t1"]), ("b", "Op", 0, ["t1"], ["tb"]), ("c", "Op", 0, ["t1", "tb"], ["o"])],
        {"t1": GB, "tb": GB, "o": 1},
    )
    inv = _inventory([2])
    ctx = prepare_simulation(g, inv, op_times_s=_times([1, 2, 1], 2))
    full = simulate(g, inv, np.array([0, 1, 0]), context=ctx)
    fast = simulate(g, inv, np.array([0, 1, 0]), context=ctx, record_timeline=False)
    assert fast.makespan_s == full.makespan_s == 6.0
    assert fast.peak_memory_bytes is None
    assert estimate_makespan_s(g, inv, np.array([0, 1, 0]), context=ctx) == 6.0


def test_cost_model_times_are_used_when_no_table_is_given():
    # 1e12 FLOPs of MatMul on a 1e12 FLOP/s device at the default 0.75 efficiency
    g = graph_from_ops("one", [("a", "MatMul", 1e12, [], ["t"])], {"t": 8})
    inv = _inventory([1])
    r = simulate(g, inv, np.array([0]))
    assert r.makespan_s == pytest.approx(1 / 0.75 + 5e-6)


@pytest.mark.parametrize(
    "placement, field",
    [(np.array([0, 0]), "placement"), (np.array([0, 0, 5]), "placement"), (np.array([0, 0, -1]), "placement")],
)
def test_bad_placement_names_the_field(placement, field):
    g = graph_from_ops(
        "chain",
        [("a", "Op", 0, [], ["t"]), ("b", "Op", 0, ["t"], ["u"]), ("c", "Op", 0, ["u"], ["v"])],
        {"t": 1, "u": 1, "v": 1},
    )
    with pytest.raises(InvalidInput) as err:
        simulate(g, _inventory([2]), placement, op_times_s=_times([1, 1, 1], 2))
    assert err.value.field == field


@st.composite
def _random_dag(draw):
    n = draw(st.integers(1, 14))
    ops = []
    sizes = {}
    for i in range(n):
        preds = draw(st.lists(st.integers(0, max(i - 1, 0)), max_size=3, unique=True)) if i else []
        ops.append((f"o{i}", "Op", 0, [f"t{p}" for p in preds], [f"t{i}"]))
        sizes[f"t{i}"] = float(draw(st.integers(0, 4)) * 1e8)
    placement = np.array(draw(st.lists(st.integers(0, 2), min_size=n, max_size=n)))
    times = np.array(draw(st.lists(st.integers(0, 3), min_size=n, max_size=n)), dtype=np.float64)
    return graph_from_ops("rand", ops, sizes), placement, times


@settings(max_examples=60, deadline=None)
@given(_random_dag())
def test_schedule_respects_dependencies_devices_and_link_accounting(case):
    g, placement, durations = case
    inv = _inventory([2, 1], latency_s=0.25)
    r = simulate(g, inv, placement, op_times_s=_times(list(durations), 3))
    # durations honoured
    assert np.allclose(r.op_end_s - r.op_start_s, durations)
    # one op at a time per device
    for d in range(3):
        on = np.flatnonzero(placement == d)
        order = on[np.lexsort((r.op_end_s[on], r.op_start_s[on]))]  # zero-length ops first
        assert np.all(r.op_start_s[order][1:] >= r.op_end_s[order][:-1] - 1e-12)
    # every consumer starts after its producer ends and after its transfer arrives
    arrival = {(int(t), int(d)): e for t, d, e in zip(r.transfer_tensor, r.transfer_dst, r.transfer_end_s)}
    src, dst, tensors = g.op_edges()
    for s, d, t in zip(src, dst, tensors):
        assert r.op_start_s[d] >= r.op_end_s[s] - 1e-12
        if placement[s] != placement[d]:
            assert r.op_start_s[d] >= arrival[(int(t), int(placement[d]))] - 1e-12
    # traffic: the recorded transfers are exactly the connectivity metric
    assert r.transfer_bytes.sum() == pytest.approx(connectivity_comm_bytes(g, placement))
    assert r.comm_bytes == pytest.approx(r.link_bytes.sum())
    t_tensor, _, _ = remote_transfers(g, placement)
    assert sorted(t_tensor.tolist()) == sorted(r.transfer_tensor.tolist())
    # makespan bounds
    assert r.makespan_s >= r.device_busy_s.max() - 1e-12
    assert np.all(r.peak_memory_bytes >= 0)


def test_summary_reports_imbalance_and_memory_feasibility_per_device():
    # d0 computes 3 s, d1 1 s: mean 2, imbalance 3/2 - 1 = 0.5. The weight (2e12 B)
    # exceeds d1's 1e12 B memory.
    g = graph_from_ops(
        "summary",
        [("a", "Op", 0, [], ["t"]), ("b", "MatMul", 0, ["t", "w"], ["u"])],
        {"t": 8, "u": 8, "w": 2e12},
        parameters={"w"},
    )
    inv = _inventory([2])
    r = simulate(g, inv, np.array([0, 1]), op_times_s=np.array([[3.0, 3.0], [1.0, 1.0]]))
    doc = summarize(r, inv)
    assert doc["makespan_s"] == pytest.approx(4.0 + 8e-9)  # 8 B over 1 GB/s
    assert doc["imbalance"] == 0.5
    assert doc["feasible"] is False
    assert doc["over_memory_devices"] == ["d1"]
    assert doc["peak_memory_bytes"] == {"d0": 8.0, "d1": 2e12 + 16.0}
    assert doc["comm_bytes"] == 8.0


@settings(max_examples=40, deadline=None)
@given(_random_dag(), st.permutations([0, 1, 2, 3]))
def test_relabelling_devices_of_one_group_changes_no_cost(case, perm):
    g, placement, durations = case
    inv = _inventory([4], latency_s=0.25)
    perm = np.array(perm)
    a = simulate(g, inv, placement, op_times_s=_times(list(durations), 4))
    b = simulate(g, inv, perm[placement], op_times_s=_times(list(durations), 4))
    assert b.makespan_s == a.makespan_s
    assert b.comm_bytes == a.comm_bytes
    assert np.array_equal(b.peak_memory_bytes[perm], a.peak_memory_bytes)
    assert np.array_equal(b.op_start_s, a.op_start_s)


def test_zero_time_producers_share_a_port_in_operator_order_whatever_their_devices_are_called():
    # a0 and a1 take no time and both send 1e8 B to d2, whose ingress port serialises them;
    # which transfer goes first must not depend on the producers' device numbers
    g = graph_from_ops(
        "zero",
        [("a0", "Op", 0, [], ["t0"]), ("a1", "Op", 0, [], ["t1"]), ("b", "Op", 0, ["t0", "t1"], ["u"])],
        {"t0": 1e8, "t1": 1e8, "u": 0.0},
    )
    inv = _inventory([3], latency_s=0.25)
    times = _times([0.0, 0.0, 1.0], 3)
    first = simulate(g, inv, np.array([0, 1, 2]), op_times_s=times)
    swapped = simulate(g, inv, np.array([1, 0, 2]), op_times_s=times)
    assert first.transfer_tensor.tolist() == swapped.transfer_tensor.tolist()
    assert np.array_equal(first.transfer_end_s, swapped.transfer_end_s)


def test_same_input_same_schedule():
    g = graph_from_ops(
        "ties",
        [("a", "Op", 0, [], ["t"]), ("b", "Op", 0, ["t"], ["u"]), ("c", "Op", 0, ["t"], ["v"])],
        {"t": GB, "u": 1, "v": 1},
    )
    inv = _inventory([2])
    runs = [simulate(g, inv, np.array([0, 1, 1]), op_times_s=_times([1, 1, 1], 2)) for _ in range(2)]
    assert runs[0].op_start_s.tolist() == runs[1].op_start_s.tolist() == [0.0, 2.0, 3.0]


def test_critical_path_priority_is_the_upward_rank_with_transfer_times():
    # a (1 s, d0) -> t (1 GB) -> b (2 s, d1); a -> c (0.5 s, d0)
    g = graph_from_ops(
        "rank",
        [("a", "Op", 0, [], ["t"]), ("b", "Op", 0, ["t"], ["u"]), ("c", "Op", 0, ["t"], ["v"])],
        {"t": GB, "u": 1, "v": 1},
    )
    inv = _inventory([2])
    placement = np.array([0, 1, 0])
    rank = critical_path_priority(g, inv, placement, np.array([1.0, 2.0, 0.5]))
    assert rank.tolist() == [1.0 + 1.0 + 2.0, 2.0, 0.5]
    ctx = prepare_simulation(g, inv)
    assert critical_path_priority(g, inv, placement, np.array([1.0, 2.0, 0.5]), context=ctx).tolist() == rank.tolist()


def test_each_device_runs_at_its_own_speed():
    # one 1e12-FLOP MatMul per device; d1 is twice as fast (cost model: eff 1, no launch)
    doc = {
        "name": "hetero",
        "groups": [
            {
                "name": "g0",
                "devices": [
                    {
                        "name": f"d{i}",
                        "type": t,
                        "peak_flops": p,
                        "memory_tiers": [{"name": "HBM", "capacity_bytes": 1e12, "bandwidth_bytes_per_s": 1e15}],
                    }
                    for i, (t, p) in enumerate([("slow", 1e12), ("fast", 2e12)])
                ],
                "link": {"bandwidth_bytes_per_s": GB, "latency_s": 0.0},
            }
        ],
    }
    inv = inventory_from_json(doc)
    g = graph_from_ops("two", [("a", "MatMul", 1e12, [], ["t"]), ("b", "MatMul", 1e12, [], ["u"])], {"t": 8, "u": 8})
    cm = CostModel(efficiency=(1.0,) * 8, memory_efficiency=1.0, launch_overhead_s=0.0)
    r = simulate(g, inv, np.array([0, 1]), cost_model=cm)
    assert r.op_end_s.tolist() == [1.0, 0.5]
    slowed = simulate(g, with_device_speed(inv, {"d1": 0.25}), np.array([0, 1]), cost_model=cm)
    assert slowed.op_end_s.tolist() == [1.0, 2.0]


def test_bandwidth_matrix_gives_each_device_pair_its_own_port():
    # d0 -> d1 at 1 GB/s and d0 -> d2 at 0.5 GB/s run side by side
    doc = {
        "name": "matrix",
        "groups": [
            {
                "name": "g0",
                "devices": [
                    {
                        "name": f"d{i}",
                        "type": "t",
                        "peak_flops": 1e12,
                        "memory_tiers": [{"name": "HBM", "capacity_bytes": 1e12, "bandwidth_bytes_per_s": 1e12}],
                    }
                    for i in range(3)
                ],
                "link": {"bandwidth_bytes_per_s": GB, "latency_s": 0.0},
            }
        ],
        "bandwidth_matrix_bytes_per_s": [[0, 1e9, 5e8], [1e9, 0, 1e9], [5e8, 1e9, 0]],
    }
    inv = inventory_from_json(doc)
    g = graph_from_ops(
        "two-pairs",
        [("a", "Op", 0, [], ["t1", "t2"]), ("b", "Op", 0, ["t1"], ["u"]), ("c", "Op", 0, ["t2"], ["v"])],
        {"t1": GB, "t2": GB, "u": 1, "v": 1},
    )
    r = simulate(g, inv, np.array([0, 1, 2]), op_times_s=_times([1, 1, 1], 3))
    assert r.transfer_start_s.tolist() == [1.0, 1.0]
    assert r.transfer_end_s.tolist() == [2.0, 3.0]
    assert r.link_bytes_matrix(3).tolist() == [[0, GB, GB], [0, 0, 0], [0, 0, 0]]


def test_memory_timeline_steps_through_the_hand_computed_chain():
    g = _memory_chain()
    inv = _inventory([1])
    r = simulate(g, inv, np.array([0, 0, 0]), op_times_s=_times([1, 1, 1], 1))
    device, time_s, in_use = memory_timeline(g, r)
    # same-time events collapse to the last one's level
    last = dict(zip(time_s.tolist(), in_use.tolist()))
    assert last == {0.0: 1300.0, 1.0: 1500.0, 2.0: 1550.0, 3.0: 1000.0}
    assert set(device.tolist()) == {0}
    assert in_use.max() == r.peak_memory_bytes[0]


def _brute_force_peak(g, r, n_dev):
    """Peak bytes per device straight from the lifetime rules, checked at every event time."""
    holdings = {}  # (tensor, device) -> [alloc, free]

    def hold(t, d, a, f):
        cur = holdings.get((t, d))
        holdings[(t, d)] = [a, f] if cur is None else [min(cur[0], a), max(cur[1], f)]

    arrivals = {
        (int(t), int(d)): (s, e)
        for t, d, s, e in zip(r.transfer_tensor, r.transfer_dst, r.transfer_start_s, r.transfer_end_s)
    }
    params = [set() for _ in range(n_dev)]
    for op in range(g.n_ops):
        d = int(r.op_device[op])
        for t in g.inputs_of(op).tolist():
            if g.tensor_kind[t] == 2:
                params[d].add(t)
                continue
            prod = int(g.tensor_producer[t])
            if prod < 0:
                alloc = 0.0
            elif int(r.op_device[prod]) == d:
                alloc = r.op_start_s[prod]
            else:
                alloc = arrivals[(t, d)][0]
            hold(t, d, alloc, r.op_end_s[op])
        for t in g.outputs_of(op).tolist():
            free = r.op_end_s[op] if g.consumers_of(t).size else r.makespan_s
            hold(t, d, r.op_start_s[op], free)
    for t, s, e in zip(r.transfer_tensor.tolist(), r.transfer_src.tolist(), r.transfer_end_s.tolist()):
        hold(t, s, holdings[(t, s)][0], e)
    peak = np.zeros(n_dev)
    times = sorted({v for a, f in holdings.values() for v in (a, f)} | {0.0})
    for d in range(n_dev):
        for x in times:
            # live on [alloc, free): an instant's frees happen before its allocations
            live = sum(g.tensor_bytes[t] for (t, dd), (a, f) in holdings.items() if dd == d and a <= x < f)
            peak[d] = max(peak[d], live)
        peak[d] += sum(g.tensor_bytes[t] for t in params[d])
    return peak


@settings(max_examples=60, deadline=None)
@given(_random_dag(), st.integers(0, 3))
def test_peak_memory_matches_the_lifetime_rules_checked_by_brute_force(case, n_params):
    g, placement, durations = case
    # add parameters read by the first operators
    ops = [
        (
            str(g.op_names[i]),
            "Op",
            0,
            [str(g.tensor_names[t]) for t in g.inputs_of(i)] + ([f"w{i}"] if i < n_params else []),
            [str(g.tensor_names[t]) for t in g.outputs_of(i)],
        )
        for i in range(g.n_ops)
    ]
    sizes = {str(n): float(b) + 1.0 for n, b in zip(g.tensor_names, g.tensor_bytes)}
    sizes.update({f"w{i}": 1000.0 * (i + 1) for i in range(min(n_params, g.n_ops))})
    g = graph_from_ops("with-params", ops, sizes, parameters={f"w{i}" for i in range(n_params)})
    inv = _inventory([2, 1], latency_s=0.25)
    r = simulate(g, inv, placement, op_times_s=_times(list(durations), 3))
    assert r.peak_memory_bytes.tolist() == pytest.approx(_brute_force_peak(g, r, 3).tolist())


def test_two_senders_into_one_receiver_serialise_on_its_ingress_port():
    # d1 and d2 each produce 1 GB at t=1 for a consumer on d0: d0 takes them one at a time
    g = graph_from_ops(
        "incast",
        [
            ("a", "Op", 0, [], ["t1"]),
            ("b", "Op", 0, [], ["t2"]),
            ("c", "Op", 0, ["t1", "t2"], ["out"]),
        ],
        {"t1": GB, "t2": GB, "out": 1},
    )
    inv = _inventory([3])
    r = simulate(g, inv, np.array([1, 2, 0]), op_times_s=_times([1, 1, 1], 3))
    assert sorted(zip(r.transfer_start_s.tolist(), r.transfer_end_s.tolist())) == [(1.0, 2.0), (2.0, 3.0)]
    assert r.makespan_s == 4.0
