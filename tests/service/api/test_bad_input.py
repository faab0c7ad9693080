"""Bad input gets a 4xx problem-details answer naming what is wrong, and writes nothing."""

from __future__ import annotations

import json

import pytest
from sqlalchemy import func, select

from service.storage.models import Graph, Plan
from tests.service.graphs import diamond_graph, plan_request


def _problem(response, status: int) -> dict:
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/problem+json")
    body = response.json()
    assert {"type", "title", "status", "detail"} <= set(body)
    assert "Traceback" not in response.text and "SELECT" not in response.text
    return body


def _rows(session_factory, tenant_id: str) -> tuple[int, int]:
    with session_factory() as session:
        plans = session.scalar(select(func.count()).select_from(Plan).where(Plan.tenant_id == tenant_id))
        graphs = session.scalar(select(func.count()).select_from(Graph).where(Graph.tenant_id == tenant_id))
    return plans, graphs


def test_a_cycle_is_named(client, session_factory):
    graph = diamond_graph()
    graph["nodes"][0]["inputs"] = ["x", "wa", "out"]  # a reads d's output
    body = _problem(client.post("/v1/plans", json=plan_request(graph)), 422)
    assert "cycle" in body["detail"].lower()
    assert _rows(session_factory, client.tenant_id) == (0, 0)


def test_an_unknown_tensor_is_named(client):
    graph = diamond_graph()
    graph["nodes"][3]["inputs"] = ["yb", "ghost"]
    assert "ghost" in _problem(client.post("/v1/plans", json=plan_request(graph)), 422)["detail"]


def test_a_negative_size_is_rejected(client):
    graph = diamond_graph()
    graph["tensors"][4]["bytes"] = -5
    _problem(client.post("/v1/plans", json=plan_request(graph)), 422)


def test_an_unknown_preset_lists_the_valid_ones(client):
    body = _problem(client.post("/v1/plans", json=plan_request(preset="dgx-h900")), 422)
    assert "dgx-h100" in body["detail"]


def test_a_device_slower_than_any_hardware_is_named_and_nothing_is_stored(client, session_factory):
    # 1e-300 FLOP/s made every predicted time infinite and the answer a 500
    request = plan_request()
    device = {
        "name": "d0",
        "peak_flops": 1e-300,
        "memory_tiers": [{"name": "HBM", "capacity_bytes": 8e10, "bandwidth_bytes_per_s": 3e12}],
    }
    request["inventory"] = {
        "name": "slow",
        "groups": [{"name": "n0", "devices": [device], "link": {"bandwidth_bytes_per_s": 4.5e11}}],
    }
    body = _problem(client.post("/v1/plans", json=request), 422)
    assert "peak_flops" in body["detail"] and "between" in body["detail"]
    assert _rows(session_factory, client.tenant_id) == (0, 0)


def test_an_operator_with_more_flops_than_any_run_is_named_in_training_too(client, session_factory):
    # 1.7e308 FLOPs doubled for the backward pass was infinite and the answer a 500
    graph = diamond_graph()
    graph["nodes"][0]["flops"] = 1.7e308
    body = _problem(client.post("/v1/plans", json=plan_request(graph, mode="training", micro_batches=2)), 422)
    assert "flops" in body["detail"]
    assert _rows(session_factory, client.tenant_id) == (0, 0)


def test_an_inventory_with_no_devices_is_rejected(client):
    request = plan_request()
    request["inventory"] = {"name": "empty", "groups": []}
    _problem(client.post("/v1/plans", json=request), 422)


@pytest.mark.parametrize(
    "options",
    [{"micro_batches": 0}, {"micro_batches": 10**6}, {"objective": "speed"}, {"seed": -1}, {"unknown_option": 1}],
)
def test_options_out_of_range_are_rejected_with_the_field(client, options):
    body = _problem(client.post("/v1/plans", json=plan_request(**options)), 422)
    assert body["errors"][0]["field"].startswith("body.options")


def test_a_graph_id_that_does_not_exist_is_404(client):
    _problem(client.post("/v1/plans", json={"graph_id": "no-such-graph", "inventory": {"preset": "dgx-h100"}}), 404)


def test_graph_and_graph_id_together_are_rejected(client):
    request = plan_request()
    request["graph_id"] = "x"
    _problem(client.post("/v1/plans", json=request), 422)


def test_a_body_that_is_not_json_is_422(client):
    _problem(client.post("/v1/plans", content=b"{not json", headers={"Content-Type": "application/json"}), 422)


@pytest.mark.parametrize("payload", [b"", b"garbage bytes that are not protobuf \xff\xfe", b"\x08\x07\x12"])
def test_an_onnx_part_that_is_not_onnx_is_422(client, payload, session_factory):
    response = client.post(
        "/v1/plans",
        files={"model": ("model.onnx", payload, "application/octet-stream")},
        data={"inventory": json.dumps({"preset": "dgx-h100"})},
    )
    _problem(response, 422)
    assert _rows(session_factory, client.tenant_id) == (0, 0)


def test_a_body_over_the_limit_is_413_before_parsing(client, settings):
    oversized = b"{" + b" " * (settings.max_body_bytes + 10) + b"}"
    _problem(client.post("/v1/plans", content=oversized, headers={"Content-Type": "application/json"}), 413)


def test_a_chunked_body_over_the_limit_is_413(client, settings):
    def chunks():
        chunk = b" " * 1_000_000
        for _ in range(settings.max_body_bytes // len(chunk) + 2):
            yield chunk

    _problem(client.post("/v1/plans", content=chunks(), headers={"Content-Type": "application/json"}), 413)


def test_a_validation_error_is_problem_json_with_field_errors(client):
    body = _problem(client.post("/v1/plans", json={"graph": diamond_graph()}), 422)
    assert any(error["field"].endswith("inventory") for error in body["errors"])


@pytest.mark.parametrize(
    "path", ["/v1/parallel/plan", "/v1/moe/rebalance", "/v1/plans/00000000-0000-0000-0000-000000000000/feedback"]
)
def test_a_chunked_body_over_the_limit_is_413_on_every_route_that_takes_a_body(client, settings, path):
    """FastAPI turns an error raised while it reads a body into its generic 400; the limit's stays a 413."""

    def chunks():
        chunk = b" " * 1_000_000
        for _ in range(settings.max_body_bytes // len(chunk) + 2):
            yield chunk

    body = _problem(client.post(path, content=chunks(), headers={"Content-Type": "application/json"}), 413)
    assert "HYPERPLACE_MAX_BODY_BYTES" in body["detail"]
