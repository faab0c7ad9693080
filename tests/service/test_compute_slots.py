"""Heavy computations a few at a time: graph placements inside requests
(HYPERPLACE_SYNC_PLAN_SLOTS) and 3D-parallel searches (HYPERPLACE_PARALLEL_PLAN_SLOTS)."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from service.app import create_app
from tests.conftest import make_settings
from tests.service.graphs import diamond_graph, parallel_plan_request, plan_request


@pytest.fixture
def one_slot(database_url):
    """A server with one slot of each kind, waiting 50 ms for one; the test may take them."""
    settings = make_settings(database_url, auth="disabled", sync_plan_slots=1, sync_plan_wait_s=0.05,
                             parallel_plan_slots=1, parallel_plan_wait_s=0.05)
    app = create_app(settings)
    with TestClient(app, raise_server_exceptions=False) as client:
        yield client, app.state


def test_a_submission_that_finds_every_planning_slot_busy_is_queued_as_a_job(one_slot):
    client, state = one_slot
    with state.planning_slots.hold() as held:
        assert held
        queued = client.post("/v1/plans", json=plan_request(diamond_graph("busy-slot", scale=1.5)))
    assert queued.status_code == 202, queued.text
    assert queued.json()["status"] == "queued" and queued.headers["Location"] == f"/v1/plans/{queued.json()['id']}"
    planned = client.post("/v1/plans", json=plan_request(diamond_graph("free-slot", scale=2.5)))
    assert planned.status_code == 201 and planned.json()["status"] == "done"


def test_a_replan_that_finds_every_planning_slot_busy_is_answered_503_with_retry_after(one_slot):
    client, state = one_slot
    parent = client.post("/v1/plans", json=plan_request(diamond_graph("replan-busy", scale=3.5))).json()
    with state.planning_slots.hold():
        busy = client.post(f"/v1/plans/{parent['id']}/replan", json={})
    assert busy.status_code == 503 and busy.headers["Retry-After"] == "1"
    assert busy.json()["type"].endswith("server-busy")
    assert client.post(f"/v1/plans/{parent['id']}/replan", json={}).status_code == 201


def test_a_search_that_finds_every_parallel_slot_taken_is_answered_503_with_retry_after(one_slot):
    client, state = one_slot
    slots = state.parallel_plan_slots
    holder = object()  # a search in progress, as the limiter sees it
    client.portal.call(lambda: slots.limiter.acquire_on_behalf_of_nowait(holder))
    busy = client.post("/v1/parallel/plan", json=parallel_plan_request())
    client.portal.call(lambda: slots.limiter.release_on_behalf_of(holder))
    assert busy.status_code == 503 and busy.headers["Retry-After"] == "1"
    assert busy.headers["content-type"].startswith("application/problem+json")
    assert busy.json()["type"].endswith("server-busy") and "busy" in busy.json()["detail"]
    assert client.post("/v1/parallel/plan", json=parallel_plan_request()).status_code == 200


def test_a_search_that_fails_gives_its_slot_back(one_slot):
    client, _ = one_slot
    bad = client.post("/v1/parallel/plan",
                      json=parallel_plan_request(training={"global_batch_sequences": 1024, "precision": "fp4"}))
    assert bad.status_code == 422
    assert client.post("/v1/parallel/plan", json=parallel_plan_request()).status_code == 200
