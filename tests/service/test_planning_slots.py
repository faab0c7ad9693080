"""A bounded number of graphs planned inside requests at once (HYPERPLACE_SYNC_PLAN_SLOTS)."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from service.app import create_app
from tests.conftest import make_settings
from tests.service.graphs import diamond_graph, plan_request


@pytest.fixture
def one_slot(database_url):
    """A server that plans one graph at a time inside requests; the test may take that slot."""
    app = create_app(make_settings(database_url, auth="disabled", sync_plan_slots=1, sync_plan_wait_s=0.05))
    with TestClient(app, raise_server_exceptions=False) as client:
        yield client, app.state.planning_slots


def test_a_submission_that_finds_every_planning_slot_busy_is_queued_as_a_job(one_slot):
    client, slots = one_slot
    with slots.hold() as held:
        assert held
        queued = client.post("/v1/plans", json=plan_request(diamond_graph("busy-slot", scale=1.5)))
    assert queued.status_code == 202, queued.text
    assert queued.json()["status"] == "queued" and queued.headers["Location"] == f"/v1/plans/{queued.json()['id']}"
    planned = client.post("/v1/plans", json=plan_request(diamond_graph("free-slot", scale=2.5)))
    assert planned.status_code == 201 and planned.json()["status"] == "done"


def test_a_replan_that_finds_every_planning_slot_busy_is_answered_503_with_retry_after(one_slot):
    client, slots = one_slot
    parent = client.post("/v1/plans", json=plan_request(diamond_graph("replan-busy", scale=3.5))).json()
    with slots.hold():
        busy = client.post(f"/v1/plans/{parent['id']}/replan", json={})
    assert busy.status_code == 503 and busy.headers["Retry-After"] == "1"
    assert busy.json()["type"].endswith("server-busy")
    assert client.post(f"/v1/plans/{parent['id']}/replan", json={}).status_code == 201
