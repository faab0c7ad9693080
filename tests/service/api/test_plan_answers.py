"""Every answer of the plan and feedback routes is what the route declares.

The routes that build their documents themselves send them without FastAPI's
validation (``service.api.json_response``); here each kind of real answer (created,
cached, queued, summary, re-plan, trace, feedback, accuracy, calibration, pages) is
validated against the model its route declares in ``app.routes``, read from there
rather than named here. The models forbid undeclared fields, so a key the service
sends that OpenAPI does not document fails.
"""

from __future__ import annotations

import json
import pathlib

import pytest
from fastapi.routing import APIRoute, iter_route_contexts
from fastapi.testclient import TestClient
from pydantic import TypeAdapter, ValidationError

from service.app import create_app
from tests.conftest import TenantClient, make_settings, new_api_key
from tests.service.graphs import diamond_graph, measured_timeline, plan_request

ONNX_DIR = pathlib.Path(__file__).resolve().parents[2] / "fixtures" / "onnx"


def _route(app, method: str, path: str) -> APIRoute:
    """The route answering ``method path`` (full path, routers included at any depth)."""
    for context in iter_route_contexts(app.routes):
        route = context.original_route
        if isinstance(route, APIRoute) and context.path == path and method in route.methods:
            return route
    raise AssertionError(f"no route {method} {path}")


def _declared(app, method: str, path: str, status: int):
    """The model ``path`` declares for ``status``: ``responses[status]["model"]``, else its response_model."""
    route = _route(app, method, path)
    declared = route.responses.get(status, {}).get("model")
    return declared if declared is not None else route.response_model


def check(app, method: str, path: str, response) -> dict:
    """Validate one real answer against its route's declared model; the answer."""
    model = _declared(app, method, path, response.status_code)
    assert model is not None, f"{method} {path} declares no model for {response.status_code}"
    body = response.json()
    try:
        TypeAdapter(model).validate_python(body)
    except ValidationError as exc:  # pragma: no cover - the message is the point
        raise AssertionError(f"{method} {path} {response.status_code}: {exc}") from None
    return body


@pytest.fixture(scope="module")
def answers(app, base_client, session_factory, settings) -> dict:
    """One tenant's answers from every plan and feedback route, made once for the module."""
    tenant_id, key = new_api_key(session_factory, settings)
    client = TenantClient(base_client, tenant_id, key)
    out: dict = {}
    out["created"] = client.post("/v1/plans", json=plan_request(diamond_graph("answers")))
    plan = out["created"].json()
    out["cached"] = client.post("/v1/plans", json=plan_request(diamond_graph("answers")))
    out["training"] = client.post(
        "/v1/plans", json=plan_request(diamond_graph("answers"), mode="training", micro_batches=2)
    )
    out["pipeline"] = client.post(
        "/v1/plans", json=plan_request(diamond_graph("answers"), pipeline=True, objective="throughput", micro_batches=4)
    )
    path = ONNX_DIR / "gpt2.onnx"
    out["onnx"] = client.post(
        "/v1/plans",
        files={"model": (path.name, path.read_bytes(), "application/octet-stream")},
        data={
            "inventory": json.dumps({"preset": "dgx-h100"}),
            "options": json.dumps({"dims": {"batch": 1, "sequence": 16}}),
        },
    )
    out["read"] = client.get(f"/v1/plans/{plan['id']}")
    out["read-summary"] = client.get(f"/v1/plans/{plan['id']}", params={"detail": "summary"})
    out["model-plans"] = client.get(f"/v1/models/{plan['model_hash']}/plans", params={"limit": 1})
    out["model"] = client.get(f"/v1/models/{plan['model_hash']}")
    out["trace"] = client.get(f"/v1/plans/{plan['id']}/trace")
    out["feedback"] = client.post(
        f"/v1/plans/{plan['id']}/feedback",
        json={"timeline": measured_timeline(plan), "format": "simple"},
        headers={"Idempotency-Key": f"answers-{tenant_id}"},
    )
    out["feedback-again"] = client.post(
        f"/v1/plans/{plan['id']}/feedback",
        json={"timeline": measured_timeline(plan), "format": "simple"},
        headers={"Idempotency-Key": f"answers-{tenant_id}"},
    )
    feedback_id = out["feedback"].json()["id"]
    out["plan-feedback"] = client.get(f"/v1/plans/{plan['id']}/feedback")
    out["model-feedback"] = client.get(f"/v1/models/{plan['model_hash']}/feedback")
    out["one-feedback"] = client.get(f"/v1/feedback/{feedback_id}", params={"include_timeline": True})
    out["accuracy"] = client.get(f"/v1/plans/{plan['id']}/accuracy")
    out["calibration"] = client.get(f"/v1/calibrations/{plan['inventory_hash']}")
    out["replan"] = client.post(f"/v1/plans/{plan['id']}/replan", json={"minimal_movement": True})
    out["replan-cached"] = client.post(f"/v1/plans/{plan['id']}/replan", json={"minimal_movement": True})
    out["replan-read"] = client.get(f"/v1/plans/{out['replan'].json()['id']}")
    out["delete"] = client.delete(f"/v1/plans/{out['training'].json()['id']}")
    return out


@pytest.mark.parametrize(
    ("name", "method", "path", "status"),
    [
        ("created", "POST", "/v1/plans", 201),
        ("cached", "POST", "/v1/plans", 200),
        ("training", "POST", "/v1/plans", 201),
        ("pipeline", "POST", "/v1/plans", 201),
        ("onnx", "POST", "/v1/plans", 201),
        ("read", "GET", "/v1/plans/{plan_id}", 200),
        ("read-summary", "GET", "/v1/plans/{plan_id}", 200),
        ("model-plans", "GET", "/v1/models/{model_hash}/plans", 200),
        ("model", "GET", "/v1/models/{model_hash}", 200),
        ("trace", "GET", "/v1/plans/{plan_id}/trace", 200),
        ("feedback", "POST", "/v1/plans/{plan_id}/feedback", 201),
        ("feedback-again", "POST", "/v1/plans/{plan_id}/feedback", 200),
        ("plan-feedback", "GET", "/v1/plans/{plan_id}/feedback", 200),
        ("model-feedback", "GET", "/v1/models/{model_hash}/feedback", 200),
        ("one-feedback", "GET", "/v1/feedback/{feedback_id}", 200),
        ("accuracy", "GET", "/v1/plans/{plan_id}/accuracy", 200),
        ("calibration", "GET", "/v1/calibrations/{inventory_hash}", 200),
        ("replan", "POST", "/v1/plans/{plan_id}/replan", 201),
        ("replan-cached", "POST", "/v1/plans/{plan_id}/replan", 200),
        ("replan-read", "GET", "/v1/plans/{plan_id}", 200),
    ],
)
def test_each_answer_validates_against_its_routes_declared_model(app, answers, name, method, path, status):
    response = answers[name]
    assert response.status_code == status, response.text
    check(app, method, path, response)


def test_the_answers_carry_what_the_models_now_declare(answers):
    """planning_s and a re-plan's summary are declared, not sent undocumented."""
    assert answers["created"].json()["summary"]["planning_s"] >= 0
    assert answers["replan"].json()["summary"]["replan"]["parent_id"] == answers["created"].json()["id"]
    assert answers["one-feedback"].json()["timeline"] is not None
    assert answers["delete"].status_code == 204 and answers["delete"].content == b""


def test_the_view_is_html_as_declared(app, answers, base_client):
    plan = answers["created"].json()
    route = _route(app, "GET", "/v1/plans/{plan_id}/view")
    assert "text/html" in route.responses[200]["content"]
    request = answers["created"].request
    response = base_client.get(
        f"/v1/plans/{plan['id']}/view", headers={"Authorization": request.headers["authorization"]}
    )
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/html")


def test_a_queued_answer_validates_too(database_url, session_factory):
    settings = make_settings(database_url, sync_max_ops=0)
    app = create_app(settings)
    with TestClient(app, raise_server_exceptions=False) as base:
        tenant_id, key = new_api_key(session_factory, settings)
        client = TenantClient(base, tenant_id, key)
        response = client.post("/v1/plans", json=plan_request(diamond_graph("queued-answer")))
        assert response.status_code == 202, response.text
        body = check(app, "POST", "/v1/plans", response)
        assert body["status"] == "queued" and body["summary"] is None
        check(app, "GET", "/v1/plans/{plan_id}", client.get(f"/v1/plans/{body['id']}"))


def test_an_undeclared_field_fails_the_check(app, answers):
    class Tampered:
        status_code = 200

        @staticmethod
        def json():
            return {**answers["read"].json(), "undeclared": 1}

    with pytest.raises(AssertionError, match="undeclared"):
        check(app, "GET", "/v1/plans/{plan_id}", Tampered)
