"""Runtime feedback on the database under test: timelines, calibration, accuracy, re-plans.

The end-to-end tests hide a truth from the service: one GPU 1.6x slower than its
spec and attention 1.3x slower everywhere. "Measured" timelines are the simulator
run under that truth with log-normal noise and a 3x slower warm-up step, posted
like a real profiler's output; the service only ever sees the timelines.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import pytest
from fastapi.testclient import TestClient

from partitioners.costmodel.costs import OP_CLASS_NAMES, CostModel, op_times_s
from partitioners.costmodel.simulator import simulate
from partitioners.costmodel.trace import to_chrome_trace
from partitioners.graph.generators import synthetic_graph_json
from partitioners.graph.json_import import graph_from_json
from partitioners.hardware.inventory import preset_inventory
from service.app import create_app
from service.domain.jobs import new_worker_id, process_one
from tests.conftest import TenantClient, make_settings, new_api_key

MB = 1_000_000
SLOWDOWN = 1.6
ATTENTION = 1.3
NOISE_SIGMA = 0.05
WARMUP_FACTOR = 3.0
STEPS = 4


def branches_graph(name: str, n_branches: int = 4) -> dict:
    """``n_branches`` independent matmul -> attention -> matmul -> layernorm chains joined at the end."""
    nodes, tensors, ends = [], [{"name": "x", "bytes": 16 * MB}], []
    for b in range(n_branches):
        previous = "x"
        for k, (op, flops) in enumerate(
            (("MatMul", 2e12), ("Attention", 2e12), ("MatMul", 2e12), ("LayerNormalization", 1e9))
        ):
            out, weight = f"b{b}_y{k}", f"b{b}_w{k}"
            tensors += [{"name": out, "bytes": 16 * MB}, {"name": weight, "bytes": 32 * MB, "kind": "parameter"}]
            nodes.append(
                {
                    "name": f"b{b}_{op.lower()}{k}",
                    "op": op,
                    "inputs": [previous, weight],
                    "outputs": [out],
                    "flops": flops,
                }
            )
            previous = out
        ends.append(previous)
    nodes.append({"name": "join", "op": "Concat", "inputs": ends, "outputs": ["y"], "flops": 0})
    tensors.append({"name": "y", "bytes": 16 * MB * n_branches})
    return {"name": name, "nodes": nodes, "tensors": tensors}


def plan_body(graph: dict) -> dict:
    return {"graph": graph, "inventory": {"preset": "dgx-h100", "nodes": 1}, "options": {}}


class Truth:
    """The hidden cluster: the simulator with a slow device and slow attention, plus noise."""

    def __init__(self, graph_doc: dict, slow_device: str, nvlink_factor: float = 1.0) -> None:
        self.graph = graph_from_json(graph_doc)
        self.inventory = preset_inventory("dgx-h100", 1)
        self.slow_device = slow_device
        table = {("*", "attention"): ATTENTION}
        for cls in OP_CLASS_NAMES:
            table[(slow_device, cls)] = SLOWDOWN * (ATTENTION if cls == "attention" else 1.0)
        self.cost_model = CostModel(device_class_multiplier=table, link_class_multiplier={"intra-group": nvlink_factor})

    def placement(self, plan: dict) -> np.ndarray:
        index = {str(n): i for i, n in enumerate(self.inventory.device_names)}
        return np.array([index[plan["ops"][str(name)]] for name in self.graph.op_names], dtype=np.int64)

    def makespan_s(self, plan: dict) -> float:
        return simulate(self.graph, self.inventory, self.placement(plan), cost_model=self.cost_model).makespan_s

    def runs(self, plan: dict, seed: int = 0):
        """One simulated run per step: step 0 is the warm-up."""
        rng = np.random.default_rng(seed)
        times = op_times_s(self.graph, self.inventory, self.cost_model)
        placement = self.placement(plan)
        for step in range(STEPS):
            noisy = (
                times * np.exp(rng.normal(0.0, NOISE_SIGMA, size=times.shape)) * (WARMUP_FACTOR if step == 0 else 1.0)
            )
            yield step, simulate(self.graph, self.inventory, placement, op_times_s=noisy, cost_model=self.cost_model)

    def simple_timeline(self, plan: dict, seed: int = 0) -> dict:
        names = [str(n) for n in self.graph.op_names]
        devices = self.inventory.device_names
        ops = []
        for step, run in self.runs(plan, seed):
            for i, name in enumerate(names):
                ops.append(
                    {
                        "name": name,
                        "device": str(devices[run.op_device[i]]),
                        "start_s": float(run.op_start_s[i]),
                        "duration_s": float(run.op_end_s[i] - run.op_start_s[i]),
                        "step": step,
                    }
                )
        return {"ops": ops}

    def chrome_trace(self, plan: dict, seed: int = 0) -> dict:
        """The steps one after another in one trace, each inside a ``ProfilerStep#N`` annotation."""
        events, offset_us = [], 0.0
        for step, run in self.runs(plan, seed):
            trace = to_chrome_trace(run, self.graph, self.inventory)
            span_us = run.makespan_s * 1e6
            events.append(
                {
                    "name": f"ProfilerStep#{step}",
                    "ph": "X",
                    "cat": "user_annotation",
                    "ts": offset_us,
                    "dur": span_us,
                    "pid": 99,
                    "tid": 0,
                }
            )
            for event in trace["traceEvents"]:
                if event["ph"] == "X":
                    event = dict(event, ts=event["ts"] + offset_us)
                elif step > 0:
                    continue
                events.append(event)
            offset_us += span_us + 10.0
        return {"traceEvents": events, "displayTimeUnit": "ms"}


def busiest_device(plan: dict) -> str:
    counts: dict[str, int] = {}
    for device in plan["ops"].values():
        counts[device] = counts.get(device, 0) + 1
    return max(sorted(counts), key=lambda d: counts[d])


@pytest.fixture
def planned(client):
    """A fresh plan of the branches graph and the hidden truth about its busiest device."""

    def make(name: str) -> tuple[dict, Truth]:
        response = client.post("/v1/plans", json=plan_body(branches_graph(name)))
        assert response.status_code == 201, response.text
        plan = response.json()
        return plan, Truth(branches_graph(name), busiest_device(plan))

    return make


def post_feedback(client, plan: dict, timeline, **extra):
    return client.post(f"/v1/plans/{plan['id']}/feedback", json={"timeline": timeline, **extra})


# ----------------------------------------------------------------------------- storing timelines


def test_a_simple_timeline_is_stored_with_every_operator_of_every_step_matched(client, planned):
    plan, truth = planned("simple")
    response = post_feedback(client, plan, truth.simple_timeline(plan))
    assert response.status_code == 201, response.text
    body = response.json()
    assert body["source_format"] == "simple"
    assert body["matched_events"] == len(plan["ops"]) * STEPS
    assert body["unmatched_events"] == 0
    assert body["match"]["steps"] == STEPS and body["match"]["ops_matched"] == len(plan["ops"])
    assert response.headers["location"] == f"/v1/feedback/{body['id']}"


def test_unmatched_events_are_counted_and_named_not_dropped(client, planned):
    plan, truth = planned("unmatched")
    timeline = truth.simple_timeline(plan)
    timeline["ops"] += [{"name": "nccl_barrier", "device": "node0/gpu0", "start_s": 0.0, "duration_s": 1e-4}] * 2
    body = post_feedback(client, plan, timeline).json()
    assert body["unmatched_events"] == 2
    assert body["match"]["unmatched_names"] == [["nccl_barrier", 2]]


def test_a_timeline_that_matches_nothing_is_422_naming_what_it_saw(client, planned):
    plan, _ = planned("nothing")
    timeline = {"ops": [{"name": "mystery_kernel", "start_s": 0.0, "duration_s": 1e-3}]}
    response = post_feedback(client, plan, timeline, match="name")
    assert response.status_code == 422
    assert response.headers["content-type"].startswith("application/problem+json")
    assert "mystery_kernel" in response.json()["detail"]


def test_a_chrome_trace_matches_operators_by_name_devices_by_thread_and_steps_by_profiler_step(client, planned):
    plan, truth = planned("chrome")
    response = post_feedback(client, plan, truth.chrome_trace(plan))
    assert response.status_code == 201, response.text
    match = response.json()["match"]
    assert response.json()["source_format"] == "chrome"
    assert match["ops_matched"] == len(plan["ops"]) and match["steps"] == STEPS
    assert match["ops_on_other_device"] == 0
    assert match["transfers_matched"] > 0
    assert match["unmatched_events"] == 0


def test_measured_transfers_calibrate_their_link_class(client, planned):
    plan, truth = planned("links")
    truth = Truth(branches_graph("links"), truth.slow_device, nvlink_factor=2.0)
    body = post_feedback(client, plan, truth.chrome_trace(plan)).json()
    assert body["match"]["transfers_matched"] > 0
    assert body["calibration"]["factors"]["link_class"]["intra-group"] == pytest.approx(2.0, rel=0.05)


def test_the_mapping_matches_operators_whose_measured_names_differ(client, planned):
    plan, truth = planned("mapping")
    timeline = truth.simple_timeline(plan)
    for op in timeline["ops"]:
        op["name"] = "runtime::" + op["name"]
    mapping = {f"runtime::{name}": name for name in plan["ops"]}
    body = post_feedback(client, plan, timeline, mapping={"ops": mapping}, match="name").json()
    assert body["matched_events"] == len(plan["ops"]) * STEPS


def test_a_mapping_onto_an_operator_the_plan_lacks_is_422(client, planned):
    plan, truth = planned("bad-mapping")
    response = post_feedback(client, plan, truth.simple_timeline(plan), mapping={"ops": {"x": "no-such-op"}})
    assert response.status_code == 422
    assert "no-such-op" in response.json()["detail"]


def test_timelines_are_listed_per_plan_and_per_model_with_the_runs_metadata(client, planned):
    plan, truth = planned("listing")
    first = post_feedback(
        client,
        plan,
        truth.simple_timeline(plan, seed=1),
        hardware_notes="driver 550, clocks locked",
        step_index=100,
        measured_at="2026-11-28T10:00:00Z",
    ).json()
    second = post_feedback(client, plan, truth.simple_timeline(plan, seed=2), step_index=200).json()
    by_plan = client.get(f"/v1/plans/{plan['id']}/feedback").json()["items"]
    by_model = client.get(f"/v1/models/{plan['model_hash']}/feedback", params={"limit": 1}).json()
    assert [item["id"] for item in by_plan] == [second["id"], first["id"]]
    assert by_plan[1]["hardware_notes"] == "driver 550, clocks locked" and by_plan[1]["step_index"] == 100
    assert by_plan[1]["measured_at"].startswith("2026-11-28T10:00:00")
    assert [item["id"] for item in by_model["items"]] == [second["id"]] and by_model["next_cursor"]


def test_a_stored_timeline_reads_back_in_full(client, planned):
    plan, truth = planned("full")
    timeline = truth.simple_timeline(plan)
    created = post_feedback(client, plan, timeline).json()
    stored = client.get(f"/v1/feedback/{created['id']}", params={"include_timeline": "true"}).json()
    assert stored["timeline"] == timeline
    assert stored["match"]["matched_events"] == created["matched_events"]


def test_a_retry_with_the_same_idempotency_key_stores_the_timeline_once(client, planned):
    plan, truth = planned("idempotent")
    timeline = truth.simple_timeline(plan)
    headers = {"Idempotency-Key": "run-42"}
    first = client.post(f"/v1/plans/{plan['id']}/feedback", json={"timeline": timeline}, headers=headers)
    retry = client.post(f"/v1/plans/{plan['id']}/feedback", json={"timeline": timeline}, headers=headers)
    assert (first.status_code, retry.status_code) == (201, 200)
    assert retry.json()["id"] == first.json()["id"]
    assert len(client.get(f"/v1/plans/{plan['id']}/feedback").json()["items"]) == 1


def test_a_timeline_holding_nan_is_422(client, planned):
    plan, truth = planned("nan")
    timeline = truth.simple_timeline(plan)
    timeline["ops"][0]["note"] = float("nan")
    body = json.dumps({"timeline": timeline})  # Python writes the non-standard NaN literal
    response = client.post(
        f"/v1/plans/{plan['id']}/feedback", content=body, headers={"Content-Type": "application/json"}
    )
    assert response.status_code == 422
    assert "NaN" in response.json()["detail"]


def test_another_tenant_cannot_post_or_read_feedback(client, other_client, planned):
    plan, truth = planned("tenancy")
    created = post_feedback(client, plan, truth.simple_timeline(plan)).json()
    assert post_feedback(other_client, plan, truth.simple_timeline(plan)).status_code == 404
    assert other_client.get(f"/v1/feedback/{created['id']}").status_code == 404
    assert other_client.get(f"/v1/plans/{plan['id']}/accuracy").status_code == 404
    assert other_client.get(f"/v1/calibrations/{plan['inventory_hash']}").status_code == 404


# ----------------------------------------------------------------------------- calibration and accuracy


def test_accuracy_before_any_feedback_is_409(client, planned):
    plan, _ = planned("no-feedback")
    response = client.get(f"/v1/plans/{plan['id']}/accuracy")
    assert response.status_code == 409
    assert "feedback" in response.json()["detail"]


def test_one_feedback_round_brings_the_makespan_prediction_within_five_percent(client, planned):
    plan, truth = planned("accuracy")
    post_feedback(client, plan, truth.simple_timeline(plan))
    accuracy = client.get(f"/v1/plans/{plan['id']}/accuracy").json()
    assert accuracy["before"]["makespan_rel_error"] > 0.2
    assert accuracy["after"]["makespan_rel_error"] < 0.05
    assert accuracy["after"]["op_median_rel_error"] < accuracy["before"]["op_median_rel_error"]
    assert accuracy["after"]["op_p90_rel_error"] < accuracy["before"]["op_p90_rel_error"]


def test_calibration_finds_the_slow_device_and_the_slow_attention(client, planned):
    plan, truth = planned("factors")
    body = post_feedback(client, plan, truth.simple_timeline(plan)).json()
    factors = body["calibration"]["factors"]
    assert factors["device_slowdown"][truth.slow_device] == pytest.approx(SLOWDOWN, rel=0.05)
    others = [v for d, v in factors["device_slowdown"].items() if d != truth.slow_device]
    assert others and all(v == pytest.approx(1.0, rel=0.05) for v in others)
    attention = [e["multiplier"] for e in factors["type_class"] if e["op_class"] == "attention"]
    assert attention == [pytest.approx(ATTENTION, rel=0.05)]


def test_calibration_is_versioned_per_tenant_and_inventory(client, planned):
    plan, truth = planned("versions")
    first = post_feedback(client, plan, truth.simple_timeline(plan, seed=1)).json()["calibration"]
    second = post_feedback(client, plan, truth.simple_timeline(plan, seed=2)).json()["calibration"]
    stored = client.get(f"/v1/calibrations/{plan['inventory_hash']}").json()
    assert (first["version"], second["version"]) == (1, 2)
    assert stored["version"] == 2 and stored["n_timelines"] == 2


# ----------------------------------------------------------------------------- replanning


def test_a_replan_moves_work_off_the_slow_device_and_is_faster_under_the_true_costs(client, planned):
    plan, truth = planned("replan")
    post_feedback(client, plan, truth.simple_timeline(plan))
    response = client.post(f"/v1/plans/{plan['id']}/replan", json={})
    assert response.status_code == 201, response.text
    child = response.json()
    on_slow = lambda p: sum(1 for d in p["ops"].values() if d == truth.slow_device)  # noqa: E731
    assert on_slow(child) < on_slow(plan)
    assert truth.makespan_s(child) < truth.makespan_s(plan)
    assert child["replan"]["gain_s"] > 0 and child["replan"]["ops_moved"] > 0


def test_a_replan_is_a_new_plan_linked_to_its_parent_and_repeats_return_it(client, planned):
    plan, truth = planned("linked")
    post_feedback(client, plan, truth.simple_timeline(plan))
    first = client.post(f"/v1/plans/{plan['id']}/replan", json={})
    again = client.post(f"/v1/plans/{plan['id']}/replan", json={})
    assert first.json()["id"] != plan["id"] and first.json()["parent_id"] == plan["id"]
    assert again.status_code == 200 and again.json()["id"] == first.json()["id"]
    assert client.get(f"/v1/plans/{first.json()['id']}").json()["parent_id"] == plan["id"]


def test_a_new_calibration_makes_a_new_replan(client, planned):
    plan, truth = planned("recalibrated")
    post_feedback(client, plan, truth.simple_timeline(plan, seed=1))
    first = client.post(f"/v1/plans/{plan['id']}/replan", json={}).json()
    post_feedback(client, plan, truth.simple_timeline(plan, seed=2))
    second = client.post(f"/v1/plans/{plan['id']}/replan", json={})
    assert second.status_code == 201 and second.json()["id"] != first["id"]
    assert second.json()["replan"]["calibration_version"] == 2


def test_a_gone_device_does_not_appear_in_the_replan(client, planned):
    plan, _ = planned("gone")
    gone = busiest_device(plan)
    response = client.post(f"/v1/plans/{plan['id']}/replan", json={"load_report": {"gone_devices": [gone]}})
    assert response.status_code == 201, response.text
    child = response.json()
    assert gone not in child["ops"].values()
    assert gone not in child["summary"]["peak_memory_bytes"]
    assert child["replan"]["ops_displaced"] == sum(1 for d in plan["ops"].values() if d == gone)
    assert child["inventory_hash"] != plan["inventory_hash"]


def test_a_load_report_of_a_slow_device_moves_work_off_it_without_any_feedback(client, planned):
    plan, truth = planned("slow-report")
    response = client.post(
        f"/v1/plans/{plan['id']}/replan", json={"load_report": {"slow_devices": {truth.slow_device: 3.0}}}
    )
    child = response.json()
    assert child["replan"]["calibration_version"] is None
    assert sum(1 for d in child["ops"].values() if d == truth.slow_device) < sum(
        1 for d in plan["ops"].values() if d == truth.slow_device
    )


def test_minimal_movement_moves_fewer_operators_and_keeps_most_of_the_gain(client, planned):
    plan, truth = planned("minimal")
    post_feedback(client, plan, truth.simple_timeline(plan))
    full = client.post(f"/v1/plans/{plan['id']}/replan", json={}).json()["replan"]
    minimal = client.post(
        f"/v1/plans/{plan['id']}/replan", json={"minimal_movement": True, "gain_tolerance_fraction": 0.2}
    ).json()
    assert minimal["replan"]["ops_moved"] < full["ops_moved"]
    assert minimal["replan"]["gain_s"] >= 0.8 * full["gain_s"]
    assert truth.makespan_s(minimal) < truth.makespan_s(plan)


@pytest.fixture(scope="module")
def job_settings(database_url):
    return make_settings(database_url, sync_max_ops=0)


@pytest.fixture
def job_client(job_settings, session_factory):
    tenant_id, key = new_api_key(session_factory, job_settings)
    with TestClient(create_app(job_settings), raise_server_exceptions=False) as client:
        yield TenantClient(client, tenant_id, key)


def run_jobs_until_done(client, plan_id: str, session_factory, settings) -> dict:
    """Work the job queue (other tests' jobs too) until the plan is done; bounded by attempts, not time."""
    for _ in range(200):
        plan = client.get(f"/v1/plans/{plan_id}").json()
        if plan["status"] in ("done", "failed"):
            return plan
        if not process_one(session_factory, settings, new_worker_id()):
            time.sleep(0.05)
    raise AssertionError(f"plan {plan_id} never finished")


def test_a_replan_of_a_graph_too_large_for_the_request_is_a_job_planned_with_the_calibration(
    job_client, job_settings, session_factory
):
    queued = job_client.post("/v1/plans", json=plan_body(branches_graph("queued-replan")))
    assert queued.status_code == 202
    plan = run_jobs_until_done(job_client, queued.json()["id"], session_factory, job_settings)
    truth = Truth(branches_graph("queued-replan"), busiest_device(plan))
    assert post_feedback(job_client, plan, truth.simple_timeline(plan)).status_code == 201
    response = job_client.post(f"/v1/plans/{plan['id']}/replan", json={})
    assert response.status_code == 202 and response.json()["parent_id"] == plan["id"]
    child = run_jobs_until_done(job_client, response.json()["id"], session_factory, job_settings)
    assert child["status"] == "done"
    assert truth.makespan_s(child) < truth.makespan_s(plan)


def test_a_replan_predicted_to_gain_less_than_the_threshold_keeps_the_parents_placement(client, planned):
    plan, truth = planned("threshold")
    post_feedback(client, plan, truth.simple_timeline(plan))
    child = client.post(f"/v1/plans/{plan['id']}/replan", json={"min_gain_fraction": 0.99}).json()
    assert child["replan"]["kept_parent"] is True
    assert child["replan"]["ops_moved"] == 0 and child["ops"] == plan["ops"]


def test_the_plans_own_predicted_trace_as_feedback_calibrates_nothing_and_moves_nothing(client):
    plan = client.post("/v1/plans", json=plan_body(synthetic_graph_json(300, seed=2))).json()
    assert plan["summary"]["timed_with_tiers"]  # its times use the memory tiers it states
    trace = client.get(f"/v1/plans/{plan['id']}/trace").json()
    assert post_feedback(client, plan, trace).status_code == 201
    accuracy = client.get(f"/v1/plans/{plan['id']}/accuracy").json()
    factors = accuracy["calibration"]["factors"]
    multipliers = [f["multiplier"] for f in factors["type_class"]] + [f["multiplier"] for f in factors["device_class"]]
    assert multipliers == pytest.approx([1.0] * len(multipliers))
    assert accuracy["before"]["op_p90_rel_error"] == pytest.approx(0.0, abs=1e-9)
    assert accuracy["before"]["makespan_rel_error"] == pytest.approx(0.0, abs=1e-9)
    child = client.post(f"/v1/plans/{plan['id']}/replan", json={"min_gain_fraction": 0.0}).json()
    assert child["replan"]["gain_s"] == pytest.approx(0.0, abs=1e-12) and child["replan"]["ops_moved"] == 0


def test_a_run_without_the_plans_tier_speed_ups_calibrates_against_main_memory(client):
    graph_doc = synthetic_graph_json(300, seed=2)
    plan = client.post("/v1/plans", json=plan_body(graph_doc)).json()
    assert plan["summary"]["timed_with_tiers"]
    # what an eager runtime does with this placement: every tensor read from HBM, model times
    graph, inventory = graph_from_json(graph_doc), preset_inventory("dgx-h100", 1)
    index = {str(name): i for i, name in enumerate(inventory.device_names)}
    placement = np.array([index[plan["ops"][str(name)]] for name in graph.op_names])
    run = simulate(graph, inventory, placement)
    assert post_feedback(client, plan, to_chrome_trace(run, graph, inventory)).status_code == 201
    accuracy = client.get(f"/v1/plans/{plan['id']}/accuracy").json()
    factors = accuracy["calibration"]["factors"]
    multipliers = [f["multiplier"] for f in factors["type_class"]] + [f["multiplier"] for f in factors["device_class"]]
    assert multipliers == pytest.approx([1.0] * len(multipliers))  # the operators ran as modelled
    assert accuracy["before"]["op_p90_rel_error"] > 0.05  # the plan claimed tier speed-ups that did not happen
    assert accuracy["after"]["op_p90_rel_error"] == pytest.approx(0.0, abs=1e-9)


def test_a_load_report_naming_an_unknown_device_is_422(client, planned):
    plan, _ = planned("unknown-device")
    response = client.post(f"/v1/plans/{plan['id']}/replan", json={"load_report": {"gone_devices": ["node9/gpu9"]}})
    assert response.status_code == 422
    assert "node9/gpu9" in response.json()["detail"]


# ----------------------------------------------------------------------------- the real torch.profiler fixture

FEEDBACK_FIXTURES = Path(__file__).parents[2] / "fixtures" / "feedback"
#: The recording machine as an inventory: one CPU core (the trace ran with one thread).
CPU_INVENTORY = json.loads((FEEDBACK_FIXTURES / "recording_host.inventory.json").read_text())


@pytest.fixture
def cnn_plan(client) -> dict:
    onnx_bytes = (FEEDBACK_FIXTURES / "small_cnn.onnx").read_bytes()
    response = client.post(
        "/v1/plans",
        files={"model": ("small_cnn.onnx", onnx_bytes, "application/octet-stream")},
        data={"inventory": json.dumps(CPU_INVENTORY), "options": json.dumps({"dims": {"batch": 8}})},
    )
    assert response.status_code == 201, response.text
    return response.json()


def test_a_real_torch_profiler_trace_matches_every_onnx_operator_by_class_and_order(client, cnn_plan):
    trace = json.loads((FEEDBACK_FIXTURES / "small_cnn.trace.json").read_text())
    response = post_feedback(client, cnn_plan, trace, hardware_notes="CPU, 1 thread, torch 2.13.0")
    assert response.status_code == 201, response.text
    match = response.json()["match"]
    assert match["rule"] == "order"
    assert match["ops_matched"] == len(cnn_plan["ops"]) == 15
    assert match["steps"] == 12 and match["matched_events"] == 12 * 15
    assert match["unmatched_events"] == 0
    assert match["nested_events"] > 0  # aten::addmm inside aten::linear and the like


def test_a_real_trace_calibrates_the_operator_times_of_its_plan(client, cnn_plan):
    trace = json.loads((FEEDBACK_FIXTURES / "small_cnn.trace.json").read_text())
    post_feedback(client, cnn_plan, trace)
    accuracy = client.get(f"/v1/plans/{cnn_plan['id']}/accuracy").json()
    assert accuracy["after"]["op_median_rel_error"] < accuracy["before"]["op_median_rel_error"]
    assert accuracy["after"]["op_p90_rel_error"] < accuracy["before"]["op_p90_rel_error"]
    assert (
        accuracy["calibration"]["factors"]["launch_overhead_s"] < CostModel().launch_overhead_s
    )  # CPU dispatch < CUDA launch


def test_a_replan_keeps_the_cost_model_profile_of_its_parent(client):
    graph = branches_graph("replan-roofline")
    body = {**plan_body(graph), "options": {"cost_model": "roofline"}}
    plan = client.post("/v1/plans", json=body).json()
    post_feedback(client, plan, Truth(graph, busiest_device(plan)).simple_timeline(plan))
    child = client.post(f"/v1/plans/{plan['id']}/replan", json={}).json()
    assert child["summary"]["cost_model"]["profile"] == "roofline"
