"""Bounds on the numbers of a measured timeline and of a load report, over HTTP.

Every out-of-range number is a 422 problem naming the field (never a 500, which
would also drop the client's keep-alive connection), and a refused request leaves
the plan, its earlier timelines and the tenant's calibration exactly as they were.
"""

from __future__ import annotations

import pytest

from tests.service.graphs import measured_timeline, plan_request


@pytest.fixture
def plan_with_feedback(client) -> dict:
    """A plan of the diamond graph with one accepted timeline (and so a calibration)."""
    response = client.post("/v1/plans", json=plan_request())
    assert response.status_code == 201, response.text
    plan = response.json()
    accepted = client.post(f"/v1/plans/{plan['id']}/feedback", json={"timeline": measured_timeline(plan)})
    assert accepted.status_code == 201, accepted.text
    return plan


def stored_state(client, plan: dict) -> dict:
    """What a refused request must not change: the plan, its timelines, the calibration, the model's plans."""
    return {
        "plan": client.get(f"/v1/plans/{plan['id']}").json(),
        "feedback": client.get(f"/v1/plans/{plan['id']}/feedback").json(),
        "calibration": client.get(f"/v1/calibrations/{plan['inventory_hash']}").json(),
        "plans_of_model": client.get(f"/v1/models/{plan['model_hash']}/plans").json(),
    }


def first_op(plan: dict, **fields) -> dict:
    name, device = sorted(plan["ops"].items())[0]
    return {"name": name, "device": device, "start_s": 0.0, "duration_s": 1e-3, "step": 0, **fields}


def assert_refused(client, plan: dict, response, field: str) -> None:
    assert response.status_code == 422, response.text
    assert response.headers["content-type"].startswith("application/problem+json")
    assert field in [error["field"] for error in response.json().get("errors", [])], response.json()


def post_timeline(client, plan: dict, timeline):
    return client.post(f"/v1/plans/{plan['id']}/feedback", json={"timeline": timeline})


# ----------------------------------------------------------------------------- steps


def test_a_step_beyond_int64_is_422_naming_it_and_changes_nothing(client, plan_with_feedback):
    plan = plan_with_feedback
    before = stored_state(client, plan)
    response = post_timeline(client, plan, {"ops": [first_op(plan, step=2**63)]})
    assert_refused(client, plan, response, "timeline.ops[0].step")
    assert stored_state(client, plan) == before


def test_a_step_over_the_step_index_bound_is_422(client, plan_with_feedback):
    plan = plan_with_feedback
    response = post_timeline(client, plan, {"ops": [first_op(plan, step=2**31)]})
    assert_refused(client, plan, response, "timeline.ops[0].step")


def test_a_transfer_step_beyond_int64_is_422_naming_it(client, plan_with_feedback):
    plan = plan_with_feedback
    transfer = {"tensor": "x", "src": "node0/gpu0", "dst": "node0/gpu1", "duration_s": 1e-3, "step": 2**63}
    response = post_timeline(client, plan, {"ops": [first_op(plan)], "transfers": [transfer]})
    assert_refused(client, plan, response, "timeline.transfers[0].step")


def test_a_profiler_step_number_beyond_int64_is_422_naming_the_event_and_changes_nothing(client, plan_with_feedback):
    plan = plan_with_feedback
    before = stored_state(client, plan)
    op = first_op(plan)
    trace = {
        "traceEvents": [
            {"ph": "X", "name": "ProfilerStep#99999999999999999999999", "ts": 0, "dur": 50},
            {"ph": "X", "name": op["name"], "ts": 1, "dur": 5, "args": {"device": op["device"]}},
        ]
    }
    response = post_timeline(client, plan, trace)
    assert_refused(client, plan, response, "timeline.traceEvents[0].name")
    assert "ProfilerStep#" in response.json()["detail"]
    assert stored_state(client, plan) == before


def test_a_profiler_step_number_of_a_megabyte_of_digits_is_422(client, plan_with_feedback):
    plan = plan_with_feedback
    trace = {"traceEvents": [{"ph": "X", "name": "ProfilerStep#" + "9" * 100_000, "ts": 0, "dur": 50}]}
    response = post_timeline(client, plan, trace)
    assert_refused(client, plan, response, "timeline.traceEvents[0].name")


# ----------------------------------------------------------------------------- times


@pytest.mark.parametrize("field", ["duration_s", "start_s"])
def test_a_time_of_1e308_seconds_is_422_naming_it_and_changes_nothing(client, plan_with_feedback, field):
    plan = plan_with_feedback
    before = stored_state(client, plan)
    response = post_timeline(client, plan, {"ops": [first_op(plan, **{field: 1e308})]})
    assert_refused(client, plan, response, f"timeline.ops[0].{field}")
    assert stored_state(client, plan) == before


def test_a_duration_longer_than_a_week_is_422(client, plan_with_feedback):
    plan = plan_with_feedback
    response = post_timeline(client, plan, {"ops": [first_op(plan, duration_s=8 * 24 * 3600.0)]})
    assert_refused(client, plan, response, "timeline.ops[0].duration_s")


def test_a_negative_start_is_422(client, plan_with_feedback):
    plan = plan_with_feedback
    response = post_timeline(client, plan, {"ops": [first_op(plan, start_s=-1.0)]})
    assert_refused(client, plan, response, "timeline.ops[0].start_s")


def test_a_timeline_spanning_more_than_a_week_is_422_though_each_time_is_in_range(client, plan_with_feedback):
    plan = plan_with_feedback
    ops = [first_op(plan, start_s=0.0), first_op(plan, start_s=8 * 24 * 3600.0, step=1)]
    response = post_timeline(client, plan, {"ops": ops})
    assert_refused(client, plan, response, "timeline")
    assert "week" in response.json()["detail"]


def test_a_transfer_of_1e308_seconds_is_422_naming_it(client, plan_with_feedback):
    plan = plan_with_feedback
    transfer = {"tensor": "x", "src": "node0/gpu0", "dst": "node0/gpu1", "duration_s": 1e308}
    response = post_timeline(client, plan, {"ops": [first_op(plan)], "transfers": [transfer]})
    assert_refused(client, plan, response, "timeline.transfers[0].duration_s")


def test_a_peak_memory_larger_than_any_device_is_422(client, plan_with_feedback):
    plan = plan_with_feedback
    device = first_op(plan)["device"]
    response = post_timeline(client, plan, {"ops": [first_op(plan)], "peak_memory_bytes": {device: 1e308}})
    assert_refused(client, plan, response, f"timeline.peak_memory_bytes[{device!r}]")


@pytest.mark.parametrize("field", ["ts", "dur"])
def test_a_chrome_time_of_1e308_microseconds_is_422_naming_it(client, plan_with_feedback, field):
    plan = plan_with_feedback
    event = {"ph": "X", "name": first_op(plan)["name"], "ts": 0, "dur": 5, field: 1e308}
    response = post_timeline(client, plan, {"traceEvents": [event]})
    assert_refused(client, plan, response, f"timeline.traceEvents[0].{field}")


def test_a_chrome_timestamp_integer_too_large_for_a_float_is_422_and_changes_nothing(client, plan_with_feedback):
    plan = plan_with_feedback
    before = stored_state(client, plan)
    event = {"ph": "X", "name": first_op(plan)["name"], "ts": 10**400, "dur": 5}
    response = post_timeline(client, plan, {"traceEvents": [event]})
    assert_refused(client, plan, response, "timeline.traceEvents[0].ts")
    assert stored_state(client, plan) == before


def test_a_chrome_trace_spanning_more_than_a_week_is_422(client, plan_with_feedback):
    plan = plan_with_feedback
    name = first_op(plan)["name"]
    week_us = 7 * 24 * 3600 * 1e6
    events = [{"ph": "X", "name": name, "ts": 0, "dur": 5}, {"ph": "X", "name": name, "ts": week_us, "dur": 5}]
    response = post_timeline(client, plan, {"traceEvents": events})
    assert_refused(client, plan, response, "timeline.traceEvents")


# ----------------------------------------------------------------------------- load report


@pytest.mark.parametrize("factor", [1e-308, 0.0009])
def test_a_slowdown_factor_under_a_thousandth_is_422_naming_it_and_makes_no_plan(client, plan_with_feedback, factor):
    plan = plan_with_feedback
    device = first_op(plan)["device"]
    before = stored_state(client, plan)
    response = client.post(f"/v1/plans/{plan['id']}/replan", json={"load_report": {"slow_devices": {device: factor}}})
    assert response.status_code == 422, response.text
    fields = [error["field"] for error in response.json()["errors"]]
    assert any("slow_devices" in f for f in fields), fields
    assert stored_state(client, plan) == before


def test_a_device_a_thousand_times_faster_than_the_model_is_the_smallest_slowdown_accepted(client, plan_with_feedback):
    plan = plan_with_feedback
    device = first_op(plan)["device"]
    response = client.post(f"/v1/plans/{plan['id']}/replan", json={"load_report": {"slow_devices": {device: 0.001}}})
    assert response.status_code == 201, response.text
    assert response.json()["replan"]["slow_devices"] == {device: 0.001}
