"""A plan made by the service, run for real with ONNX Runtime, its timeline sent back.

The loop of issue 53 on the database under test: upload an ONNX model, plan it on two
CPU "devices", run the plan (``service.client.onnx_runner``), post the measured
timeline as feedback, and see the calibration change.
"""

from __future__ import annotations

import json
from pathlib import Path

import onnxruntime as ort
import pytest

from service.client.onnx_runner import example_inputs, prepare_model, run_plan

FIXTURE = Path(__file__).resolve().parents[2] / "fixtures" / "feedback" / "small_cnn.onnx"


def cpu_inventory(n_devices: int) -> dict:
    """Two logical CPU devices with round figures (the bench measures real ones)."""
    device = {"type": "x86-core", "peak_flops": 5e10}
    tiers = [{"name": "dram", "capacity_bytes": 8e9, "bandwidth_bytes_per_s": 1e10}]
    return {
        "name": "test-host",
        "groups": [
            {
                "name": "host",
                "devices": [{"name": f"cpu{d}", **device, "memory_tiers": tiers} for d in range(n_devices)],
                "link": {"bandwidth_bytes_per_s": 1e10, "latency_s": 1e-6},
            }
        ],
    }


@pytest.fixture
def cnn_plan(client) -> dict:
    response = client.post(
        "/v1/plans",
        files={"model": ("small_cnn.onnx", FIXTURE.read_bytes(), "application/octet-stream")},
        data={
            "inventory": json.dumps(cpu_inventory(2)),
            "options": json.dumps({"dims": {"batch": 1}, "strategy": "metis"}),
        },
    )
    assert response.status_code == 201, response.text
    plan = response.json()
    assert plan["status"] == "done" and len(set(plan["ops"].values())) == 2
    return plan


def test_a_service_plan_runs_on_two_cpu_devices_with_the_unsplit_outputs(cnn_plan):
    _, result = run_plan(FIXTURE.read_bytes(), cnn_plan, steps=2, warmup=1)
    assert result.devices == {"cpu0": "cpu:0", "cpu1": "cpu:1"}
    assert result.diffs["output"][0] <= 1e-4


def test_the_timeline_of_a_real_run_is_accepted_and_changes_the_calibration(client, cnn_plan):
    _, result = run_plan(FIXTURE.read_bytes(), cnn_plan, steps=3, warmup=1)
    response = client.post(
        f"/v1/plans/{cnn_plan['id']}/feedback",
        json={"format": "simple", "match": "name", "timeline": result.timeline()},
    )
    assert response.status_code == 201, response.text
    match = response.json()["match"]
    assert match["ops_matched"] == len(cnn_plan["ops"]) == 15
    assert match["steps"] == 3 and match["unmatched_events"] == 0
    calibration = client.get(f"/v1/calibrations/{cnn_plan['inventory_hash']}").json()
    assert calibration["version"] >= 1 and calibration["n_timelines"] == 1
    accuracy = client.get(f"/v1/plans/{cnn_plan['id']}/accuracy").json()
    assert accuracy["before"]["n_ops"] == 15
    assert accuracy["after"]["op_median_rel_error"] != accuracy["before"]["op_median_rel_error"]


def test_an_onnx_runtime_profile_posted_as_it_is_matches_every_operator_by_name(client, tmp_path):
    response = client.post(
        "/v1/plans",
        files={"model": ("small_cnn.onnx", FIXTURE.read_bytes(), "application/octet-stream")},
        data={"inventory": json.dumps(cpu_inventory(1)), "options": json.dumps({"dims": {"batch": 1}})},
    )
    plan = response.json()
    model = prepare_model(FIXTURE.read_bytes(), {"batch": 1})  # graph-only: weights generated
    options = ort.SessionOptions()
    options.enable_profiling = True
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC  # no fusions: nodes as exported
    options.profile_file_prefix = str(tmp_path / "profile")
    session = ort.InferenceSession(model.model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    for _ in range(3):
        session.run(None, example_inputs(model))
    profile = json.loads(Path(session.end_profiling()).read_text())
    response = client.post(f"/v1/plans/{plan['id']}/feedback", json={"timeline": profile, "match": "name"})
    assert response.status_code == 201, response.text
    match = response.json()["match"]
    assert match["ops_matched"] == match["ops_total"] == 15
    assert match["steps"] == 3
