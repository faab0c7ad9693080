"""Large request bodies share one budget (HYPERPLACE_MAX_BODY_BYTES_IN_FLIGHT); small ones never wait."""

from __future__ import annotations

import json
import threading

import pytest
from fastapi.testclient import TestClient

from service.api.body_budget import EXEMPT_BYTES, reserved_bytes
from service.app import create_app
from tests.conftest import make_settings
from tests.service.graphs import parallel_plan_request

MIB = 1024 * 1024


def _padded(request: dict, size_bytes: int) -> bytes:
    """A valid JSON body of ``size_bytes``: the request, then whitespace."""
    body = json.dumps(request).encode()
    return body + b" " * (size_bytes - len(body))


@pytest.fixture
def small_budget(database_url):
    """A server whose large bodies may total 3 MiB, waiting 50 ms for room (long enough to be seen waiting: 30 s
    where a test says so); the test may take the budget."""

    def start(wait_s: float = 0.05):
        settings = make_settings(database_url, auth="disabled", max_body_bytes_in_flight=3 * MIB, body_wait_s=wait_s)
        app = create_app(settings)
        return TestClient(app, raise_server_exceptions=False), app.state.body_budget

    return start


def _post(client: TestClient, body: bytes):
    return client.post("/v1/parallel/plan", content=body, headers={"content-type": "application/json"})


def test_a_large_body_that_finds_the_budget_taken_is_answered_503_with_retry_after(small_budget):
    client, budget = small_budget()
    with client:
        assert client.portal.call(budget.try_reserve, 2 * MIB)
        busy = _post(client, _padded(parallel_plan_request(), 2 * MIB))
        client.portal.call(budget.release, 2 * MIB)
        assert busy.status_code == 503 and busy.headers["Retry-After"] == "1"
        assert busy.headers["content-type"].startswith("application/problem+json")
        problem = busy.json()
        assert problem["type"].endswith("server-busy") and "HYPERPLACE_MAX_BODY_BYTES_IN_FLIGHT" in problem["detail"]
        assert problem["instance"].startswith("urn:request:")
        assert _post(client, _padded(parallel_plan_request(), 2 * MIB)).status_code == 200


def test_a_small_body_is_answered_while_the_budget_is_taken(small_budget):
    client, budget = small_budget()
    with client:
        assert client.portal.call(budget.try_reserve, 3 * MIB)
        answered = client.post("/v1/parallel/plan", json=parallel_plan_request())
        client.portal.call(budget.release, 3 * MIB)
    assert answered.status_code == 200


def test_a_body_larger_than_the_whole_budget_runs_when_nothing_else_is_in_flight(small_budget):
    client, budget = small_budget()
    with client:
        answered = _post(client, _padded(parallel_plan_request(), 5 * MIB))
        assert answered.status_code == 200
        assert budget.in_flight_bytes == 0


def test_a_waiting_body_is_admitted_once_the_bytes_ahead_of_it_are_given_back(small_budget):
    client, budget = small_budget(wait_s=30.0)
    answers = []
    with client:
        assert client.portal.call(budget.try_reserve, 2 * MIB)
        waiting = threading.Thread(
            target=lambda: answers.append(_post(client, _padded(parallel_plan_request(), 2 * MIB)))
        )
        waiting.start()
        for _ in range(10_000):  # until the request is seen waiting for room (bounded, not timed)
            if client.portal.call(lambda: budget.has_waiters):
                break
            waiting.join(0.001)
        assert not answers, "the request was answered while the budget was taken"
        client.portal.call(budget.release, 2 * MIB)
        waiting.join(60)
    assert [a.status_code for a in answers] == [200]
    assert budget.in_flight_bytes == 0


def test_a_refused_or_failed_large_request_gives_its_bytes_back(small_budget):
    client, budget = small_budget()
    with client:
        bad = client.post(
            "/v1/parallel/plan", content=b"{" + b" " * (2 * MIB), headers={"content-type": "application/json"}
        )
        assert bad.status_code == 422
        assert budget.in_flight_bytes == 0


def test_what_a_request_reserves_is_its_declared_length_the_body_limit_if_chunked_and_nothing_if_small():
    def scope(*headers: tuple[bytes, bytes]) -> dict:
        return {"type": "http", "headers": list(headers)}

    assert reserved_bytes(scope((b"content-length", str(2 * MIB).encode())), 64 * MIB) == 2 * MIB
    assert reserved_bytes(scope((b"content-length", str(EXEMPT_BYTES).encode())), 64 * MIB) == 0
    assert reserved_bytes(scope((b"transfer-encoding", b"chunked")), 64 * MIB) == 64 * MIB
    assert reserved_bytes(scope(), 64 * MIB) == 0
