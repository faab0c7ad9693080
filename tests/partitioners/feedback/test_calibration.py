"""Specifications of timeline parsing/matching, robust calibration and minimal-movement re-planning."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from partitioners.costmodel.costs import OP_CLASS_NAMES, CostModel, op_class_of, op_times_s
from partitioners.errors import InvalidInput
from partitioners.feedback.calibration import (
    MAX_DEVICE_SLOWDOWN,
    MIN_DEVICE_SLOWDOWN,
    calibrated_cost_model,
    fit_calibration,
    group_medians,
    huber_location,
    prediction_error,
    tiers_realized,
    weighted_median,
)
from partitioners.feedback.timeline import (
    MAX_STEP,
    MAX_TIMELINE_SPAN_S,
    match_timeline,
    normalize_op_name,
    parse_chrome_trace,
    parse_simple_timeline,
    parse_timeline,
)
from partitioners.graph.json_import import graph_from_json
from partitioners.graph.onnx_import import graph_from_onnx_bytes
from partitioners.hardware.inventory import preset_inventory

FIXTURES = Path(__file__).parents[2] / "fixtures" / "feedback"
H100 = "H100-SXM5-80GB"
MB = 1_000_000


def chain_graph(ops: list[tuple[str, str, float]], tensor_bytes: float = 16 * MB) -> dict:
    """x -> op0 -> op1 -> ...: ``(name, type, flops)`` per operator."""
    nodes, tensors, previous = [], [{"name": "x", "bytes": tensor_bytes}], "x"
    for name, op_type, flops in ops:
        nodes.append({"name": name, "op": op_type, "inputs": [previous], "outputs": [f"{name}.out"], "flops": flops})
        tensors.append({"name": f"{name}.out", "bytes": tensor_bytes})
        previous = f"{name}.out"
    return {"name": "chain", "nodes": nodes, "tensors": tensors}


BIG_OPS = [
    ("mm0", "MatMul", 2e12),
    ("attn0", "Attention", 2e12),
    ("mm1", "MatMul", 3e12),
    ("attn1", "Attention", 1e12),
    ("mm2", "MatMul", 1e12),
    ("ln0", "LayerNormalization", 5e11),
]


def observe(
    truth: CostModel,
    devices: list[int],
    repeats: int = 1,
    warmup_factor: float = 1.0,
    ops=BIG_OPS,
    tensor_bytes=16 * MB,
):
    """Every operator measured on every listed device, ``repeats`` times (the first slower)."""
    graph = graph_from_json(chain_graph(ops, tensor_bytes))
    inventory = preset_inventory("dgx-h100", 1)
    base = CostModel()
    roofline = op_times_s(graph, inventory, base) - base.launch_overhead_s
    measured = op_times_s(graph, inventory, truth)
    classes = op_class_of(graph.op_types)
    key, dev, cls, roof, meas = [], [], [], [], []
    for d in devices:
        for op in range(graph.n_ops):
            for r in range(repeats):
                key.append(op * 100 + d)
                dev.append(d)
                cls.append(classes[op])
                roof.append(roofline[op, d])
                meas.append(measured[op, d] * (warmup_factor if r == 0 else 1.0))
    return inventory, tuple(np.asarray(a) for a in (key, dev, cls, roof, meas))


def truth_model(slow: dict[str, float] | None = None, attention: float = 1.0, launch_s: float = 5e-6) -> CostModel:
    table = {}
    if attention != 1.0:
        table[("*", "attention")] = attention
    for device, factor in (slow or {}).items():
        for cls in OP_CLASS_NAMES:
            table[(device, cls)] = factor * (attention if cls == "attention" else 1.0)
    return CostModel(device_class_multiplier=table, launch_overhead_s=launch_s)


# ----------------------------------------------------------------------------- robust statistics


def test_huber_location_of_clean_symmetric_data_is_its_centre():
    assert huber_location(np.array([1.0, 2.0, 3.0, 4.0, 5.0])) == pytest.approx(3.0)


def test_huber_location_is_not_dragged_by_one_outlier():
    values = np.array([1.0, 1.1, 0.9, 1.05, 0.95, 100.0])
    assert huber_location(values) == pytest.approx(1.0, abs=0.1)
    assert values.mean() > 10


def test_weighted_median_follows_the_weight():
    assert weighted_median(np.array([0.0, 10.0, 20.0]), np.array([1.0, 1.0, 5.0])) == 20.0
    assert weighted_median(np.array([0.0, 10.0, 20.0])) == 10.0


def test_group_medians_collapse_repeats_per_key():
    keys, medians, counts = group_medians(np.array([7, 3, 7, 7, 3]), np.array([1.0, 5.0, 2.0, 30.0, 7.0]))
    assert keys.tolist() == [3, 7]
    assert medians.tolist() == [6.0, 2.0]
    assert counts.tolist() == [2, 3]


# ----------------------------------------------------------------------------- fitting


def test_the_fit_recovers_a_slow_device_and_a_slow_op_class_exactly_without_noise():
    inventory, obs = observe(truth_model({"node0/gpu0": 1.6}, attention=1.3), devices=[0, 1, 2])
    fit = fit_calibration(inventory, *obs)
    assert fit.device_slowdown == {
        "node0/gpu0": pytest.approx(1.6),
        "node0/gpu1": pytest.approx(1.0),
        "node0/gpu2": pytest.approx(1.0),
    }
    assert fit.type_class[(H100, "attention")] == pytest.approx(1.3)
    assert fit.type_class[(H100, "matmul")] == pytest.approx(1.0)
    assert fit.device_class[("node0/gpu0", "attention")] == pytest.approx(1.6 * 1.3)


def test_the_fitted_model_predicts_the_measured_times():
    truth = truth_model({"node0/gpu1": 1.4}, attention=1.2)
    inventory, (key, dev, cls, roof, meas) = observe(truth, devices=[0, 1])
    fit = fit_calibration(inventory, key, dev, cls, roof, meas)
    model = calibrated_cost_model(CostModel(), fit.multipliers(), fit.link_class)
    graph = graph_from_json(chain_graph(BIG_OPS))
    predicted = op_times_s(graph, inventory, model)[key // 100, dev]
    np.testing.assert_allclose(predicted, meas, rtol=1e-9)


def test_a_device_is_healthy_unless_the_others_of_its_type_are_faster():
    inventory, obs = observe(truth_model({"node0/gpu3": 2.0}), devices=[1, 2, 3])
    fit = fit_calibration(inventory, *obs)
    assert fit.device_slowdown["node0/gpu1"] == pytest.approx(1.0)
    assert fit.device_slowdown["node0/gpu3"] == pytest.approx(2.0)


def test_a_slow_warmup_step_does_not_move_the_factors():
    truth = truth_model({"node0/gpu0": 1.6}, attention=1.3)
    inventory, clean = observe(truth, devices=[0, 1], repeats=4)
    _, with_warmup = observe(truth, devices=[0, 1], repeats=4, warmup_factor=3.0)
    a, b = fit_calibration(inventory, *clean), fit_calibration(inventory, *with_warmup)
    assert b.device_slowdown == pytest.approx(a.device_slowdown)
    assert b.type_class == pytest.approx(a.type_class)


def test_a_minority_of_outlier_operators_does_not_dominate_a_class():
    inventory, (key, dev, cls, roof, meas) = observe(truth_model(), devices=[0])
    matmul = np.flatnonzero(cls == 0)
    meas = meas.copy()
    meas[matmul[0]] *= 20.0  # one of three matmuls preempted in every step
    fit = fit_calibration(inventory, key, dev, cls, roof, meas)
    assert fit.type_class[(H100, "matmul")] < 1.5


def test_the_per_operator_overhead_is_fitted_from_overhead_bound_operators():
    tiny = [(f"add{i}", "Add", 1e3) for i in range(4)]
    inventory, obs = observe(truth_model(launch_s=2.5e-6), devices=[0], ops=BIG_OPS + tiny, tensor_bytes=1e3)
    fit = fit_calibration(inventory, *obs)
    assert fit.launch_overhead_s == pytest.approx(2.5e-6, rel=0.01)
    assert fit.type_class[(H100, "matmul")] == pytest.approx(1.0, rel=1e-3)


def test_the_overhead_of_an_overhead_bound_operator_is_its_measured_time_less_its_roofline():
    # 1 MB in and out: a roofline of ~0.75 us, under a fifth of the 5 us overhead but not nothing
    tiny = [(f"add{i}", "Add", 1e3) for i in range(4)]
    inventory, (key, dev, cls, roof, meas) = observe(truth_model(), devices=[0], ops=BIG_OPS + tiny, tensor_bytes=MB)
    assert ((roof[-4:] > 0.1 * 5e-6) & (roof[-4:] < 0.2 * 5e-6)).all()
    fit = fit_calibration(inventory, key, dev, cls, roof, meas)
    assert fit.launch_overhead_s == pytest.approx(5e-6, rel=1e-9)
    assert all(m == pytest.approx(1.0, rel=1e-9) for m in fit.multipliers().values())


def test_factors_that_differ_from_the_model_only_by_rounding_are_the_models_own():
    tiny = [(f"add{i}", "Add", 1e3) for i in range(4)]
    inventory, (key, dev, cls, roof, meas) = observe(truth_model(), devices=[0, 1], ops=BIG_OPS + tiny, tensor_bytes=MB)
    rounding = 1.0 + 1e-12 * np.cos(np.arange(meas.size))  # what microsecond timestamps leave
    fit = fit_calibration(
        inventory,
        key,
        dev,
        cls,
        roof,
        meas * rounding,
        transfer_key=np.arange(3),
        transfer_link_class=np.array([1, 1, 1]),
        transfer_predicted_s=np.full(3, 1e-4),
        transfer_measured_s=1e-4 * (1.0 + np.array([1e-12, -1e-12, 3e-13])),
    )
    assert fit.launch_overhead_s == 5e-6
    factors = [*fit.multipliers().values(), *fit.device_slowdown.values(), *fit.link_class.values()]
    assert factors == [1.0] * len(factors)


def test_without_enough_overhead_bound_operators_the_overhead_is_kept():
    inventory, obs = observe(truth_model(), devices=[0])
    assert fit_calibration(inventory, *obs).launch_overhead_s is None


def test_link_classes_get_the_ratio_of_measured_to_predicted_transfer_time():
    inventory, obs = observe(truth_model(), devices=[0])
    predicted = np.array([1e-4, 2e-4, 3e-4, 1e-3])
    fit = fit_calibration(
        inventory,
        *obs,
        transfer_key=np.arange(4),
        transfer_link_class=np.array([1, 1, 1, 2]),
        transfer_predicted_s=predicted,
        transfer_measured_s=predicted * np.array([1.25, 1.25, 1.25, 3.0]),
    )
    assert fit.link_class == {"intra-group": pytest.approx(1.25), "inter-group": pytest.approx(3.0)}


def test_arrays_of_different_lengths_are_rejected():
    inventory, (key, dev, cls, roof, meas) = observe(truth_model(), devices=[0])
    with pytest.raises(InvalidInput):
        fit_calibration(inventory, key, dev[:-1], cls, roof, meas)


def test_a_load_report_slowdown_multiplies_what_calibration_already_says():
    inventory = preset_inventory("dgx-h100", 1)
    model = calibrated_cost_model(
        CostModel(), {(H100, "attention"): 1.3}, device_slowdown={"node0/gpu0": 2.0}, inventory=inventory
    )
    matrix = model.multiplier_matrix(inventory)
    attention = OP_CLASS_NAMES.index("attention")
    assert matrix[0, attention] == pytest.approx(2.6)
    assert matrix[1, attention] == pytest.approx(1.3)
    assert matrix[0, OP_CLASS_NAMES.index("matmul")] == pytest.approx(2.0)


# ----------------------------------------------------------------------------- did the run get its tiers


ELEMENTWISE, MATMUL = OP_CLASS_NAMES.index("elementwise"), OP_CLASS_NAMES.index("matmul")
#: Six operators on device 0: three matmuls the tiers do not speed up, three elementwise ones they do.
TIER_CLASSES = np.array([MATMUL] * 3 + [ELEMENTWISE] * 3)
MAIN_S = np.array([4e-4, 5e-4, 6e-4, 1e-4, 2e-4, 3e-4])


def tiered_times(speed_ups: list[float]) -> np.ndarray:
    return MAIN_S * np.array([1.0, 1.0, 1.0, *speed_ups])


def test_a_run_with_each_operators_own_tier_speed_up_got_the_tiers():
    tiered = tiered_times([0.5, 0.7, 0.9])
    assert tiers_realized(tiered * 1.2, MAIN_S, tiered, np.zeros(6), TIER_CLASSES)


def test_a_run_at_the_main_memory_times_did_not_get_the_tiers():
    tiered = tiered_times([0.5, 0.7, 0.9])
    assert not tiers_realized(MAIN_S * 1.2, MAIN_S, tiered, np.zeros(6), TIER_CLASSES)


def test_when_a_class_got_one_speed_up_throughout_the_times_that_need_no_factor_explain_the_run():
    # either prediction explains these runs with one factor per class: 1, or the speed-up
    tiered = tiered_times([0.8, 0.8, 0.8])
    assert tiers_realized(tiered, MAIN_S, tiered, np.zeros(6), TIER_CLASSES)
    assert not tiers_realized(MAIN_S, MAIN_S, tiered, np.zeros(6), TIER_CLASSES)


def test_a_plan_without_tier_speed_ups_has_none_to_realise():
    assert not tiers_realized(MAIN_S, MAIN_S, MAIN_S, np.zeros(6), TIER_CLASSES)


def test_prediction_error_reports_median_p90_and_makespan_error():
    error = prediction_error(np.array([1.0, 2.0, 3.0]), np.array([2.0, 2.0, 2.0]), 9.0, 10.0)
    assert error["op_median_rel_error"] == pytest.approx(0.5)
    assert error["op_p90_rel_error"] == pytest.approx(0.5)
    assert error["makespan_rel_error"] == pytest.approx(0.1)
    assert error["n_ops"] == 3


# ----------------------------------------------------------------------------- parsing


def test_profiler_steps_split_a_chrome_trace_and_other_categories_are_counted_as_ignored():
    trace = {
        "traceEvents": [
            {"ph": "M", "name": "thread_name", "pid": 1, "tid": 2, "args": {"name": "node0/gpu1"}},
            {"ph": "X", "name": "ProfilerStep#7", "cat": "user_annotation", "ts": 0, "dur": 100, "pid": 1, "tid": 2},
            {"ph": "X", "name": "ProfilerStep#8", "cat": "user_annotation", "ts": 100, "dur": 100, "pid": 1, "tid": 2},
            {"ph": "X", "name": "a", "cat": "cpu_op", "ts": 10, "dur": 20, "pid": 1, "tid": 2},
            {"ph": "X", "name": "a", "cat": "cpu_op", "ts": 110, "dur": 30, "pid": 1, "tid": 2},
            {"ph": "X", "name": "cudaLaunchKernel", "cat": "cuda_runtime", "ts": 12, "dur": 1, "pid": 1, "tid": 2},
            {"ph": "i", "name": "[memory]", "ts": 5, "pid": 1, "tid": 2},
        ]
    }
    events = parse_chrome_trace(trace)
    assert events.name == ["a", "a"]
    assert events.step.tolist() == [7, 8]
    np.testing.assert_allclose(events.duration_s, [20e-6, 30e-6])
    assert events.ignored == {"metadata": 1, "cuda_runtime": 1, "phase i": 1}


def test_a_bare_event_array_is_a_chrome_trace():
    events = parse_timeline([{"ph": "X", "name": "a", "ts": 1, "dur": 2, "pid": 0, "tid": 0}])
    assert events.source_format == "chrome" and events.name == ["a"]


def test_a_complete_event_without_a_name_is_rejected_with_its_index():
    with pytest.raises(InvalidInput) as error:
        parse_chrome_trace({"traceEvents": [{"ph": "X", "ts": 1, "dur": 2}]})
    assert error.value.field == "timeline.traceEvents[0].name"


def test_a_negative_duration_in_the_simple_form_is_rejected():
    with pytest.raises(InvalidInput) as error:
        parse_simple_timeline({"ops": [{"name": "a", "start_s": 0, "duration_s": -1}]})
    assert error.value.field == "timeline.ops[0].duration_s"


def test_aten_names_normalise_to_operator_types():
    assert normalize_op_name("aten::max_pool2d") == "maxpool"
    assert normalize_op_name("aten::relu_") == "relu"
    assert normalize_op_name("aten::layer_norm") == "layernorm"
    assert normalize_op_name("aten::adaptive_avg_pool2d") == "globalaveragepool"
    assert normalize_op_name("MatMul") == "matmul"


# ----------------------------------------------------------------------------- matching


def _events(rows, nested=None):
    """Chrome trace rows ``(name, ts_us, dur_us, thread)`` on pid 0."""
    return parse_chrome_trace(
        [
            {"ph": "X", "name": n, "ts": ts, "dur": dur, "pid": 0, "tid": tid, "cat": "cpu_op"}
            for n, ts, dur, tid in rows
        ]
    )


def test_without_step_annotations_the_kth_occurrence_of_an_operator_is_step_k():
    events = _events([("a", 0, 5, 0), ("b", 5, 5, 0), ("a", 10, 7, 0), ("b", 17, 5, 0)])
    match = match_timeline(events, ["a", "b"], ["MatMul", "Add"], np.array([0, 0]), ["d0"])
    assert sorted(zip(match.op.tolist(), match.step.tolist())) == [(0, 0), (0, 1), (1, 0), (1, 1)]


def test_events_nested_in_a_matched_event_are_not_unmatched():
    events = _events([("a", 0, 10, 0), ("a_kernel", 2, 5, 0), ("stray", 20, 1, 0)])
    match = match_timeline(events, ["a"], ["MatMul"], np.array([0]), ["d0"])
    assert (match.matched_events, match.nested_events, match.unmatched_events) == (1, 1, 1)
    assert match.unmatched_names == [("stray", 1)]


def test_the_device_comes_from_the_mapping_by_pid_and_tid():
    events = _events([("a", 0, 10, 3)])
    match = match_timeline(events, ["a"], ["MatMul"], np.array([0]), ["d0", "d1"], device_mapping={"0:3": "d1"})
    assert match.device.tolist() == [1] and match.ops_on_other_device == 1


def test_the_order_rule_aligns_aten_events_with_onnx_operators_by_class_despite_gaps():
    # the profiler shows aten::empty (no graph counterpart); the graph has a Shape node the profiler does not show
    events = _events(
        [("aten::conv2d", 0, 10, 0), ("aten::empty", 10, 1, 0), ("aten::relu", 11, 2, 0), ("aten::linear", 13, 4, 0)]
    )
    names = ["/conv/Conv", "/Relu", "/Shape", "/fc/Gemm"]
    match = match_timeline(events, names, ["Conv", "Relu", "Shape", "Gemm"], np.zeros(4, dtype=np.int64), ["cpu0"])
    assert match.rule == "order"
    assert [names[i] for i in match.op] == ["/conv/Conv", "/Relu", "/fc/Gemm"]
    assert match.unmatched_names == [("aten::empty", 1)]


def test_gpu_kernels_give_their_launching_operator_its_device_time_and_device():
    # torch.profiler with CUDA: aten::linear -> aten::addmm launches a GEMM kernel on GPU 0 (pid 0, stream 7)
    cpu, gpu = {"pid": 4242, "tid": 4242}, {"pid": 0, "tid": 7}
    trace = [
        {"ph": "X", "cat": "cpu_op", "name": "aten::linear", "ts": 0, "dur": 50, **cpu, "args": {"External id": 10}},
        {"ph": "X", "cat": "cpu_op", "name": "aten::addmm", "ts": 10, "dur": 30, **cpu, "args": {"External id": 12}},
        {
            "ph": "X",
            "cat": "cuda_runtime",
            "name": "cudaLaunchKernel",
            "ts": 20,
            "dur": 5,
            **cpu,
            "args": {"External id": 12},
        },
        {"ph": "X", "cat": "cpu_op", "name": "aten::relu", "ts": 60, "dur": 10, **cpu, "args": {"External id": 13}},
        {
            "ph": "X",
            "cat": "kernel",
            "name": "sm90_gemm_bf16",
            "ts": 100,
            "dur": 30,
            **gpu,
            "args": {"External id": 12, "device": 0},
        },
        {
            "ph": "X",
            "cat": "kernel",
            "name": "elementwise_kernel",
            "ts": 140,
            "dur": 5,
            **gpu,
            "args": {"External id": 13, "device": 0},
        },
    ]
    events = parse_chrome_trace(trace)
    assert events.ignored["kernel attributed to its operator"] == 2
    match = match_timeline(
        events, ["fc", "act"], ["Gemm", "Relu"], np.array([1, 1]), ["d0", "d1"], device_mapping={"0": "d1"}
    )
    assert match.op.tolist() == [0, 1]
    np.testing.assert_allclose(match.duration_s, [30e-6, 5e-6])
    np.testing.assert_allclose(match.start_s, [100e-6, 140e-6])
    assert match.device.tolist() == [1, 1] and match.ops_on_other_device == 0
    assert (match.unmatched_events, match.nested_events) == (0, 1)


def test_a_kernel_no_operator_launched_is_reported_unmatched():
    trace = [
        {"ph": "X", "cat": "cpu_op", "name": "a", "ts": 0, "dur": 10, "pid": 1, "tid": 1, "args": {"External id": 1}},
        {
            "ph": "X",
            "cat": "kernel",
            "name": "orphan",
            "ts": 20,
            "dur": 5,
            "pid": 0,
            "tid": 7,
            "args": {"External id": 99},
        },
    ]
    match = match_timeline(parse_chrome_trace(trace), ["a"], ["MatMul"], np.array([0]), ["d0"])
    assert match.unmatched_names == [("orphan", 1)]


def test_the_real_torch_profiler_trace_matches_every_onnx_node_in_every_step_in_order():
    graph = graph_from_onnx_bytes((FIXTURES / "small_cnn.onnx").read_bytes(), dims={"batch": 8})
    events = parse_timeline(json.loads((FIXTURES / "small_cnn.trace.json").read_text()))
    match = match_timeline(
        events, graph.op_names.tolist(), graph.op_types.tolist(), np.zeros(graph.n_ops, dtype=np.int64), ["cpu0"]
    )
    assert match.unmatched_events == 0
    steps = np.unique(match.step)
    assert steps.tolist() == list(range(12))
    for step in steps.tolist():
        in_step = np.flatnonzero(match.step == step)
        ordered = match.op[in_step[np.argsort(match.start_s[in_step])]]
        assert ordered.tolist() == list(range(graph.n_ops))  # ONNX node order is the execution order here
    conv = [i for i, t in enumerate(graph.op_types) if t == "Conv"]
    assert set(match.op[np.isin(match.op, conv)].tolist()) == set(conv)


# ----------------------------------------------------------------------------- bounds on measured numbers


def test_a_profiler_step_number_over_the_step_bound_is_rejected_naming_the_event():
    trace = {"traceEvents": [{"ph": "X", "name": f"ProfilerStep#{MAX_STEP + 1}", "ts": 0, "dur": 5}]}
    with pytest.raises(InvalidInput) as error:
        parse_chrome_trace(trace)
    assert error.value.field == "timeline.traceEvents[0].name"


def test_a_profiler_step_number_with_leading_zeros_is_its_number():
    trace = {
        "traceEvents": [
            {"ph": "X", "name": "ProfilerStep#000000000007", "ts": 0, "dur": 50},
            {"ph": "X", "name": "a", "ts": 1, "dur": 5},
        ]
    }
    assert parse_chrome_trace(trace).step.tolist() == [7]


def test_an_integer_timestamp_too_large_for_a_float_is_rejected_not_overflowed():
    with pytest.raises(InvalidInput) as error:
        parse_chrome_trace({"traceEvents": [{"ph": "X", "name": "a", "ts": 10**400, "dur": 5}]})
    assert error.value.field == "timeline.traceEvents[0].ts"


def test_a_simple_step_that_does_not_fit_int64_is_rejected():
    with pytest.raises(InvalidInput) as error:
        parse_simple_timeline({"ops": [{"name": "a", "start_s": 0, "duration_s": 1e-3, "step": 2**63}]})
    assert error.value.field == "timeline.ops[0].step"


def test_a_duration_over_the_timeline_span_bound_is_rejected():
    too_long = MAX_TIMELINE_SPAN_S * 1.01
    with pytest.raises(InvalidInput) as error:
        parse_simple_timeline({"ops": [{"name": "a", "start_s": 0, "duration_s": too_long}]})
    assert error.value.field == "timeline.ops[0].duration_s"


def test_a_timeline_whose_events_lie_further_apart_than_the_span_bound_is_rejected():
    ops = [
        {"name": "a", "start_s": 0, "duration_s": 1e-3},
        {"name": "a", "start_s": MAX_TIMELINE_SPAN_S, "duration_s": 1e-3},
    ]
    with pytest.raises(InvalidInput) as error:
        parse_simple_timeline({"ops": ops})
    assert error.value.field == "timeline"


def test_a_trace_at_unix_epoch_timestamps_is_accepted():
    epoch_us = 1.79e15  # torch.profiler's microseconds since 1970, in 2026
    events = parse_chrome_trace({"traceEvents": [{"ph": "X", "name": "a", "ts": epoch_us, "dur": 5}]})
    np.testing.assert_allclose(events.duration_s, [5e-6])


@pytest.mark.parametrize("factor", [1e-308, 0.0009, 1000.1])
def test_a_load_report_slowdown_beyond_a_thousandfold_either_way_is_rejected(factor):
    with pytest.raises(InvalidInput) as error:
        calibrated_cost_model(device_slowdown={"node0/gpu0": factor}, inventory=preset_inventory("dgx-h100", 1))
    assert error.value.field == "load_report.slow_devices.node0/gpu0"


def test_a_load_report_may_say_a_device_is_a_thousand_times_faster_or_slower():
    inventory = preset_inventory("dgx-h100", 1)
    model = calibrated_cost_model(
        device_slowdown={"node0/gpu0": MIN_DEVICE_SLOWDOWN, "node0/gpu1": MAX_DEVICE_SLOWDOWN}, inventory=inventory
    )
    matmul = OP_CLASS_NAMES.index("matmul")
    assert model.multiplier_matrix(inventory)[:2, matmul] == pytest.approx([1e-3, 1e3])
