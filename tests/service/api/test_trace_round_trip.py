"""A plan's own trace posted back as its feedback, over HTTP: the README's examples.

docs/feedback.md: the plan's own trace (``GET /v1/plans/{id}/trace``)
posted back as feedback leaves every factor at 1 and every error at 0. The
library-level property over every ONNX fixture and several plan options is in
``tests/partitioners/costmodel/test_trace.py``; this runs the README's quick-start requests end to end.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from partitioners.costmodel.costs import CostModel

ONNX_FIXTURES = Path(__file__).parents[2] / "fixtures" / "onnx"

#: The README's JSON example: a small MLP on one DGX H100 node, 4 micro-batches.
README_MLP = {
    "graph": {
        "name": "mlp",
        "nodes": [
            {"name": "fc1", "op": "MatMul", "inputs": ["x", "w1"], "outputs": ["h"]},
            {"name": "act", "op": "Relu", "inputs": ["h"], "outputs": ["a"]},
            {"name": "fc2", "op": "MatMul", "inputs": ["a", "w2"], "outputs": ["y"]},
        ],
        "tensors": [
            {"name": "x", "bytes": 8388608, "shape": [2048, 1024], "dtype": "float32"},
            {"name": "w1", "bytes": 16777216, "shape": [1024, 4096], "dtype": "float32", "kind": "parameter"},
            {"name": "h", "bytes": 33554432, "shape": [2048, 4096], "dtype": "float32"},
            {"name": "a", "bytes": 33554432, "shape": [2048, 4096], "dtype": "float32"},
            {"name": "w2", "bytes": 16777216, "shape": [4096, 1024], "dtype": "float32", "kind": "parameter"},
            {"name": "y", "bytes": 8388608, "shape": [2048, 1024], "dtype": "float32"},
        ],
    },
    "inventory": {"preset": "dgx-h100", "nodes": 1},
    "options": {"micro_batches": 4},
}


def post_readme_plan(client, example: str):
    if example == "mlp-json":
        return client.post("/v1/plans", json=README_MLP)
    # the README's ONNX example: resnet50 on 2 DGX H100 nodes, batch 8, 8 micro-batches
    return client.post(
        "/v1/plans",
        files={"model": ("resnet50.onnx", (ONNX_FIXTURES / "resnet50.onnx").read_bytes())},
        data={
            "inventory": json.dumps({"preset": "dgx-h100", "nodes": 2}),
            "options": json.dumps({"dims": {"batch": 8}, "micro_batches": 8}),
        },
    )


@pytest.mark.parametrize("example", ["mlp-json", "resnet50-onnx"])
def test_a_readme_plans_own_trace_as_its_feedback_leaves_every_factor_at_1_and_every_error_at_0(client, example):
    response = post_readme_plan(client, example)
    assert response.status_code == 201, response.text
    plan = response.json()
    assert plan["summary"]["timed_with_tiers"]  # the trace carries the plan's tier speed-ups
    trace = client.get(f"/v1/plans/{plan['id']}/trace").json()
    feedback = client.post(f"/v1/plans/{plan['id']}/feedback", json={"timeline": trace})
    assert feedback.status_code == 201, feedback.text
    assert feedback.json()["match"]["unmatched_events"] == 0
    accuracy = client.get(f"/v1/plans/{plan['id']}/accuracy").json()
    factors = accuracy["calibration"]["factors"]
    multipliers = [f["multiplier"] for f in factors["type_class"] + factors["device_class"]]
    multipliers += [*factors["device_slowdown"].values(), *factors["link_class"].values()]
    assert multipliers == [1.0] * len(multipliers)
    assert factors["launch_overhead_s"] in (None, CostModel().launch_overhead_s)
    for label in ("before", "after"):
        errors = accuracy[label]
        assert errors["op_median_rel_error"] == pytest.approx(0.0, abs=1e-9), label
        assert errors["op_p90_rel_error"] == pytest.approx(0.0, abs=1e-9), label
        assert errors["makespan_rel_error"] == pytest.approx(0.0, abs=1e-9), label
