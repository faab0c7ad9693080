"""Specification of the Chrome trace export of a simulated schedule, and of the trace read back as feedback."""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import numpy as np
import pytest

from partitioners.costmodel.costs import CostModel, op_class_of, op_times_by_profile_s, transfer_times_s
from partitioners.costmodel.simulator import simulate
from partitioners.costmodel.trace import to_chrome_trace
from partitioners.feedback.calibration import (
    CalibrationFit,
    calibrated_cost_model,
    fit_calibration,
    prediction_error,
    tiers_realized,
)
from partitioners.feedback.timeline import TimelineMatch, match_timeline, parse_timeline
from partitioners.graph.hypergraph import Hypergraph, graph_from_ops
from partitioners.graph.onnx_import import graph_from_onnx_bytes
from partitioners.hardware.inventory import Inventory, inventory_from_json, link_class_ids, preset_inventory
from partitioners.placement.engine import PlacementOptions, PlacementResult, place
from partitioners.placement.memory_tiers import placed_tier_op_times_s


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


# ----------------------------------------------------------------------------- the trace read back as feedback

ONNX_FIXTURES = Path(__file__).parents[2] / "fixtures" / "onnx"
#: Every ONNX fixture, at dimensions small enough that one plan takes well under a second.
ONNX_DIMS = {
    "resnet50.onnx": {"batch": 2},
    "bert_base.onnx": {"batch": 2, "sequence": 64},
    "gpt2.onnx": {"batch": 1, "sequence": 64},
    "lstm_seq2seq.onnx": {"batch": 2, "source": 16, "target": 16},
}
#: (preset, nodes, options): inference and training, with and without micro-batches,
#: pipeline and hybrid strategies, presets with memory tiers (timed with them) and without.
PLANS = {
    "inference": ("dgx-h100", 2, {}),
    "micro-batches": ("dgx-h100", 2, {"micro_batches": 3}),
    "training": ("dgx-h100", 1, {"mode": "training", "micro_batches": 2}),
    "pipeline": ("dgx-h100", 2, {"strategy": "pipeline", "pipeline": True, "micro_batches": 2}),
    "hybrid": ("dgx-a100", 2, {"strategy": "hybrid", "micro_batches": 2}),
    "no-tiers": ("pcie-workstation", 1, {"mode": "training"}),
}


@cache
def onnx_fixture(name: str) -> Hypergraph:
    return graph_from_onnx_bytes((ONNX_FIXTURES / name).read_bytes(), dims=ONNX_DIMS[name])


@dataclass(frozen=True)
class RoundTrip:
    result: PlacementResult
    match: TimelineMatch
    tiers_realized: bool
    fit: CalibrationFit
    after: dict


def own_trace_as_feedback(graph: Hypergraph, inventory: Inventory, options: dict) -> RoundTrip:
    """Plan, export the plan's trace, and read it back as the feedback service does: match it,
    compare it with the plan's times with and without its tiers, fit the factors, and
    predict the run again with them (its operators in the plan's start order)."""
    result = place(graph, inventory, PlacementOptions(**options))
    g, placement, tiers = result.graph, result.placement, result.memory_plan
    trace = json.loads(json.dumps(to_chrome_trace(result.simulation, g, inventory)))
    match = match_timeline(
        parse_timeline(trace),
        g.op_names.tolist(),
        g.op_types.tolist(),
        placement,
        inventory.device_names.tolist(),
        g.tensor_names.tolist(),
    )
    ops = np.arange(g.n_ops)

    def predicted_s(model: CostModel, with_tiers: bool) -> np.ndarray:
        if with_tiers and result.timed_with_tiers:
            return placed_tier_op_times_s(
                g, inventory, placement, tiers.tensor, tiers.device, tiers.tier, cost_model=model
            )
        times, profile = op_times_by_profile_s(g, inventory, model)
        return times[ops, profile[placement]]

    base = CostModel()
    main, tiered = predicted_s(base, False)[match.op], predicted_s(base, True)[match.op]
    classes = op_class_of(g.op_types)[match.op]
    realized = tiers_realized(match.duration_s, main, tiered, match.device, classes)
    fit = fit_calibration(
        inventory,
        match.op * inventory.n_devices + match.device,
        match.device,
        classes,
        (tiered if realized else main) - base.launch_overhead_s,
        match.duration_s,
        transfer_key=np.arange(match.transfer_tensor.size),
        transfer_link_class=link_class_ids(inventory, match.transfer_src, match.transfer_dst),
        transfer_predicted_s=transfer_times_s(
            g.tensor_bytes[match.transfer_tensor], match.transfer_src, match.transfer_dst, inventory, base
        ),
        transfer_measured_s=match.transfer_duration_s,
    )
    calibrated = calibrated_cost_model(base, fit.multipliers(), fit.link_class, launch_overhead_s=fit.launch_overhead_s)
    after_s = predicted_s(calibrated, realized)
    start_order = np.lexsort((ops, result.simulation.op_start_s))
    priority = np.empty(g.n_ops)
    priority[start_order] = np.arange(g.n_ops, 0, -1)
    table = np.broadcast_to(after_s[:, None], (g.n_ops, inventory.n_devices))  # a fixed placement reads its own column
    replay = simulate(
        g, inventory, placement, op_times_s=table, cost_model=calibrated, priority=priority, record_timeline=False
    )
    after = prediction_error(after_s[match.op], match.duration_s, replay.makespan_s, result.simulation.makespan_s)
    return RoundTrip(result, match, realized, fit, after)


@pytest.mark.parametrize("plan", sorted(PLANS))
@pytest.mark.parametrize("fixture", sorted(ONNX_DIMS))
def test_a_plans_own_trace_read_back_as_feedback_calibrates_nothing_and_predicts_itself(fixture, plan):
    preset, nodes, options = PLANS[plan]
    run = own_trace_as_feedback(onnx_fixture(fixture), preset_inventory(preset, nodes), options)
    n_ops = run.result.graph.n_ops
    assert np.unique(run.match.op).size == n_ops and run.match.unmatched_events == 0
    assert run.tiers_realized == run.result.timed_with_tiers
    fit = run.fit
    factors = [*fit.multipliers().values(), *fit.device_slowdown.values(), *fit.link_class.values()]
    assert factors == [1.0] * len(factors)
    assert fit.launch_overhead_s in (None, CostModel().launch_overhead_s)
    assert run.after["op_p90_rel_error"] < 1e-9
    assert run.after["makespan_rel_error"] == pytest.approx(0.0, abs=1e-12)
