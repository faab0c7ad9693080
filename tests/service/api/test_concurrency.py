"""Concurrent identical requests against a real server (threads, loopback), on both databases.

The unique constraints (tenant, cache_key) and (tenant, Idempotency-Key) plus the
savepoint-and-refetch in the repositories make N racing submissions one plan.
"""

from __future__ import annotations

import threading
import uuid
from collections import Counter

import httpx
import pytest
from sqlalchemy import func, select

from service.storage.models import IdempotencyKey, MoeDeployment, MoePlacement, Plan
from tests.conftest import new_api_key
from tests.service.graphs import diamond_graph, plan_request
from tests.service.live_server import start_server

N = 8


@pytest.fixture(scope="module")
def server(database_url, tmp_path_factory):
    # a slot per racer: every one plans, and the races are the database's (with fewer, the
    # ones that find no slot become jobs: test_compute_slots)
    live = start_server(
        database_url, tmp_path_factory.mktemp("concurrency") / "server.log", log_level="WARNING", sync_plan_slots=N
    )
    yield live
    live.stop()


@pytest.fixture
def tenant(session_factory, settings) -> tuple[str, str]:
    return new_api_key(session_factory, settings)


def _race(server, api_key: str, requests: list[dict]) -> list[httpx.Response]:
    """Send every request at once (a barrier releases them together); answers in order."""
    barrier = threading.Barrier(len(requests))
    answers: list[httpx.Response | BaseException] = [None] * len(requests)  # type: ignore[list-item]

    def send(index: int) -> None:
        with server.client(api_key, timeout_s=120) as client:
            barrier.wait(60)
            try:
                answers[index] = client.request(**requests[index])
            except BaseException as exc:
                answers[index] = exc

    threads = [threading.Thread(target=send, args=(i,)) for i in range(len(requests))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(180)
    for answer in answers:
        assert isinstance(answer, httpx.Response), answer
    return answers  # type: ignore[return-value]


def _count(session_factory, model, *where) -> int:
    with session_factory() as session:
        return session.scalar(select(func.count()).select_from(model).where(*where))


def test_n_identical_submissions_make_one_plan(server, tenant, session_factory):
    tenant_id, key = tenant
    body = plan_request(diamond_graph("raced"))
    answers = _race(server, key, [{"method": "POST", "url": "/v1/plans", "json": body}] * N)
    statuses = Counter(answer.status_code for answer in answers)
    assert statuses == {201: 1, 200: N - 1}, [answer.text[:200] for answer in answers]
    assert len({answer.json()["id"] for answer in answers}) == 1
    assert _count(session_factory, Plan, Plan.tenant_id == tenant_id) == 1


def test_n_identical_submissions_with_one_idempotency_key_make_one_plan_and_one_key(server, tenant, session_factory):
    tenant_id, key = tenant
    request = {
        "method": "POST",
        "url": "/v1/plans",
        "json": plan_request(diamond_graph("raced-key")),
        "headers": {"Idempotency-Key": str(uuid.uuid4())},
    }
    answers = _race(server, key, [request] * N)
    assert all(answer.status_code in (200, 201) for answer in answers), [answer.text[:200] for answer in answers]
    assert len({answer.json()["id"] for answer in answers}) == 1
    assert _count(session_factory, Plan, Plan.tenant_id == tenant_id) == 1
    assert _count(session_factory, IdempotencyKey, IdempotencyKey.tenant_id == tenant_id) == 1


def test_one_idempotency_key_on_different_bodies_keeps_only_the_winner(server, tenant, session_factory):
    tenant_id, key = tenant
    idempotency_key = str(uuid.uuid4())
    requests = [
        {
            "method": "POST",
            "url": "/v1/plans",
            "json": plan_request(diamond_graph("raced-bodies"), seed=seed),
            "headers": {"Idempotency-Key": idempotency_key},
        }
        for seed in range(N)
    ]
    answers = _race(server, key, requests)
    statuses = Counter(answer.status_code for answer in answers)
    assert statuses[201] == 1 and statuses[422] == N - 1, [answer.text[:200] for answer in answers]
    assert _count(session_factory, Plan, Plan.tenant_id == tenant_id) == 1  # the losers' plans were rolled back


def test_the_same_model_planned_by_two_tenants_at_once_stays_two_tenants_plans(server, session_factory, settings):
    tenants = [new_api_key(session_factory, settings) for _ in range(2)]
    body = plan_request(diamond_graph("raced-across-tenants"))
    barrier = threading.Barrier(2 * 4)
    answers: dict[str, list[httpx.Response]] = {tenant_id: [] for tenant_id, _ in tenants}
    lock = threading.Lock()

    def send(tenant_id: str, api_key: str) -> None:
        with server.client(api_key, timeout_s=120) as client:
            barrier.wait(60)
            response = client.post("/v1/plans", json=body)
            with lock:
                answers[tenant_id].append(response)

    threads = [threading.Thread(target=send, args=tenant) for tenant in tenants for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(180)
    ids = {tenant_id: {r.json()["id"] for r in responses} for tenant_id, responses in answers.items()}
    assert all(len(plan_ids) == 1 for plan_ids in ids.values()), ids
    assert ids[tenants[0][0]] != ids[tenants[1][0]]
    for tenant_id, _ in tenants:
        assert _count(session_factory, Plan, Plan.tenant_id == tenant_id) == 1


def test_concurrent_moe_reports_on_one_deployment_never_lose_a_version(server, tenant, session_factory):
    tenant_id, key = tenant
    first = {
        "deployment": "raced-deployment",
        "model": {"num_moe_layers": 1, "num_logical_experts": 4},
        "cluster": {"num_nodes": 1, "gpus_per_node": 2, "slots_per_gpu": 3},
        "load": [[1.0, 2.0, 3.0, 4.0]],
    }
    with server.client(key) as client:
        assert client.post("/v1/moe/rebalance", json=first).status_code == 200
    reports = [
        {
            "method": "POST",
            "url": "/v1/moe/rebalance",
            "json": {"deployment": "raced-deployment", "load": [[float(i + 1), 2.0, 3.0, 40.0]]},
        }
        for i in range(N)
    ]
    answers = _race(server, key, reports)
    assert [answer.status_code for answer in answers] == [200] * N, [
        answer.text[:200] for answer in answers
    ]  # they take turns
    assert sorted(answer.json()["version"] for answer in answers) == list(range(2, 2 + N))  # each its own version
    with session_factory() as session:
        deployment = session.scalar(select(MoeDeployment).where(MoeDeployment.tenant_id == tenant_id))
        stored = sorted(
            session.scalars(select(MoePlacement.version).where(MoePlacement.deployment_id == deployment.id))
        )
    assert deployment.current_version == 1 + N
    assert stored == list(range(1, 2 + N))
