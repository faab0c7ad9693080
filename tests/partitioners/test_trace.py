"""Specification of the Chrome trace export of a simulated schedule."""

from __future__ import annotations

import json

import numpy as np

from partitioners.graph import graph_from_ops
from partitioners.inventory import inventory_from_json
from partitioners.simulate import simulate
from partitioners.trace import to_chrome_trace


def _case():
    inv = inventory_from_json(
        {
            "name": "pair",
            "groups": [
                {
                    "name": "node0",
                    "devices": [
                        {
                            "name": f"gpu{i}",
                            "type": "t",
                            "peak_flops": 1e12,
                            "memory_tiers": [{"name": "HBM", "capacity_bytes": 1e12, "bandwidth_bytes_per_s": 1e12}],
                        }
                        for i in range(2)
                    ],
                    "link": {"bandwidth_bytes_per_s": 1e9, "latency_s": 0.0},
                }
            ],
        }
    )
    g = graph_from_ops(
        "two",
        [("producer", "MatMul", 0, [], ["act"]), ("consumer", "Relu", 0, ["act"], ["out"])],
        {"act": 1e6, "out": 8},
    )
    times = np.array([[1e-3, 1e-3], [2e-3, 2e-3]])
    return g, inv, simulate(g, inv, np.array([0, 1]), op_times_s=times)


def test_trace_is_json_with_complete_events_in_microseconds():
    g, inv, result = _case()
    trace = json.loads(json.dumps(to_chrome_trace(result, g, inv)))
    assert trace["displayTimeUnit"] == "ms"
    complete = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    for e in complete:
        assert {"name", "ph", "ts", "dur", "pid", "tid", "args"} <= set(e)
    ops = {e["name"]: e for e in complete if e["cat"] == "op"}
    assert ops["producer"]["ts"] == 0.0 and ops["producer"]["dur"] == 1000.0
    # 1 MB over 1 GB/s: the consumer starts at 1 ms + 1 ms
    assert ops["consumer"]["ts"] == 2000.0 and ops["consumer"]["dur"] == 2000.0
    assert ops["consumer"]["args"]["op_type"] == "Relu"


def test_each_device_and_each_used_link_is_a_named_track():
    g, inv, result = _case()
    events = to_chrome_trace(result, g, inv)["traceEvents"]
    thread_names = {(e["pid"], e["tid"]): e["args"]["name"] for e in events if e["name"] == "thread_name"}
    process_names = {e["pid"]: e["args"]["name"] for e in events if e["name"] == "process_name"}
    assert process_names == {0: "node0", 1: "links"}
    assert thread_names[(0, 0)] == "gpu0" and thread_names[(0, 1)] == "gpu1"
    assert thread_names[(1, 0)] == "gpu0 -> gpu1 (intra-group)"
    ops = [e for e in events if e["ph"] == "X" and e["cat"] == "op"]
    assert [(e["pid"], e["tid"]) for e in ops] == [(0, 0), (0, 1)]


def test_transfer_events_carry_tensor_name_and_size():
    g, inv, result = _case()
    events = to_chrome_trace(result, g, inv)["traceEvents"]
    (tr,) = [e for e in events if e["ph"] == "X" and e["cat"] == "transfer"]
    assert tr["args"] == {"tensor": "act", "bytes": 1e6, "src": "gpu0", "dst": "gpu1"}
    assert (tr["pid"], tr["tid"], tr["ts"], tr["dur"]) == (1, 0, 1000.0, 1000.0)


def test_window_keeps_only_overlapping_events():
    g, inv, result = _case()
    # producer 0..1 ms, transfer 1..2 ms, consumer 2..4 ms: a 2.5..3 ms window sees the consumer
    events = to_chrome_trace(result, g, inv, window_s=(2.5e-3, 3e-3))["traceEvents"]
    assert [e["name"] for e in events if e["ph"] == "X"] == ["consumer"]


def test_memory_counters_follow_bytes_in_use_per_device():
    g, inv, result = _case()
    events = to_chrome_trace(result, g, inv, memory_counters=True)["traceEvents"]
    samples = [(e["name"], e["ts"], e["args"]["bytes"]) for e in events if e["ph"] == "C"]
    # gpu0 holds "act" (1 MB) from 0 until its transfer ends at 2 ms; gpu1 receives it
    # at 1 ms, writes "out" (8 B) at 2 ms and frees "act" when the consumer ends at 4 ms
    assert samples == [
        ("gpu0 memory", 0.0, 1e6),
        ("gpu0 memory", 2000.0, 0.0),
        ("gpu1 memory", 1000.0, 1e6),
        ("gpu1 memory", 2000.0, 1e6 + 8),
        ("gpu1 memory", 4000.0, 0.0),
    ]
