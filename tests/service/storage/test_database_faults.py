"""PostgreSQL stopped with ``pg_ctl stop -m immediate`` (a crash, not a shutdown) under the API.

- a plan submission whose database dies mid-request answers 503 problem+json with
  Retry-After, not 500; the same request with the same Idempotency-Key after the
  restart creates exactly one plan;
- readiness is false while the database is down and true again after;
- whatever the crash interrupts, no half-written row exists afterwards: every plan
  the API answered 2xx for is there, every done plan has its result, every queued
  plan its job.

The server is stopped for the whole test session's database, so each test restarts
it in a ``finally`` and waits until it accepts connections again.
"""

from __future__ import annotations

import os
import subprocess
import threading
import uuid
from contextlib import contextmanager

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import func, select, text

from service.app import create_app
from service.domain import feedback as feedback_domain
from service.domain import planning
from service.storage.db import make_engine
from service.storage.models import Calibration, Feedback, IdempotencyKey, Job, Plan
from tests.conftest import TenantClient, make_settings, new_api_key
from tests.service.graphs import diamond_graph, measured_timeline, plan_request
from tests.service.live_server import wait_until

PG_CTL = os.environ.get("HYPERPLACE_TEST_PG_CTL", "")

pytestmark = [
    pytest.mark.postgres_only,
    pytest.mark.skipif(
        not PG_CTL, reason="needs HYPERPLACE_TEST_PG_CTL to stop and start the server (scripts/with-postgres.sh)"
    ),
]


def _pg_ctl(*args: str) -> None:
    subprocess.run([PG_CTL, *args], check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=120)


def _database_accepts_connections(database_url: str) -> bool:
    engine = make_engine(database_url, pool_pre_ping=False)
    try:
        with engine.connect() as connection:
            connection.execute(text("SELECT 1"))
        return True
    finally:
        engine.dispose()


def _stop_database() -> None:
    _pg_ctl("stop", "-m", "immediate")


@contextmanager
def database_restarted_after(database_url: str):
    """Whatever happens inside, PostgreSQL is running again (and reachable) afterwards."""
    try:
        yield
    finally:
        try:
            _pg_ctl("status")
        except subprocess.CalledProcessError:
            _pg_ctl("start")
        wait_until(lambda: _database_accepts_connections(database_url), timeout_s=120, interval_s=0.2)


@pytest.fixture(scope="module")
def fault_app(database_url):
    with TestClient(create_app(make_settings(database_url)), raise_server_exceptions=False) as client:
        yield client


@pytest.fixture
def fault_client(fault_app, session_factory, settings) -> TenantClient:
    tenant_id, key = new_api_key(session_factory, settings)
    return TenantClient(fault_app, tenant_id, key)


def _count(session_factory, model, *where) -> int:
    with session_factory() as session:
        return session.scalar(select(func.count()).select_from(model).where(*where))


def test_the_database_dying_mid_submission_is_503_with_retry_after(fault_client, database_url, monkeypatch):
    real_compute = planning.compute_plan

    def compute_then_crash_the_database(*args, **kwargs):
        result = real_compute(*args, **kwargs)
        _stop_database()  # after the reads and the planning, before the writes
        return result

    monkeypatch.setattr(planning, "compute_plan", compute_then_crash_the_database)
    with database_restarted_after(database_url):
        response = fault_client.post("/v1/plans", json=plan_request(diamond_graph("mid-submission")))
    assert response.status_code == 503, response.text
    assert response.headers["content-type"].startswith("application/problem+json")
    assert int(response.headers["retry-after"]) > 0
    body = response.json()
    assert body["status"] == 503 and "retry" in body["detail"].lower()
    assert "Traceback" not in response.text and "psycopg" not in response.text and "SELECT" not in response.text


def test_a_request_while_the_database_is_down_is_503_not_500(fault_client, database_url):
    with database_restarted_after(database_url):
        _stop_database()
        response = fault_client.get("/v1/plans/00000000-0000-0000-0000-000000000000")
    assert response.status_code == 503, response.text
    assert "retry-after" in response.headers


def test_the_retry_after_the_restart_creates_exactly_one_plan(fault_client, session_factory, database_url, monkeypatch):
    request = plan_request(diamond_graph("retried-after-crash"))
    headers = {"Idempotency-Key": f"crash-{uuid.uuid4()}"}
    real_compute = planning.compute_plan
    crashed = []

    def compute_then_crash_once(*args, **kwargs):
        result = real_compute(*args, **kwargs)
        if not crashed:
            crashed.append(True)
            _stop_database()
        return result

    monkeypatch.setattr(planning, "compute_plan", compute_then_crash_once)
    with database_restarted_after(database_url):
        assert fault_client.post("/v1/plans", json=request, headers=headers).status_code == 503
    assert _count(session_factory, Plan, Plan.tenant_id == fault_client.tenant_id) == 0  # nothing half-written

    retried = fault_client.post("/v1/plans", json=request, headers=headers)
    assert retried.status_code == 201, retried.text
    replayed = fault_client.post("/v1/plans", json=request, headers=headers)
    assert replayed.json()["id"] == retried.json()["id"]
    assert _count(session_factory, Plan, Plan.tenant_id == fault_client.tenant_id) == 1
    assert _count(session_factory, IdempotencyKey, IdempotencyKey.tenant_id == fault_client.tenant_id) == 1


def test_readiness_is_false_while_the_database_is_down_and_true_after(fault_app, database_url):
    assert fault_app.get("/readyz").status_code == 200
    with database_restarted_after(database_url):
        _stop_database()
        down = fault_app.get("/readyz")
        alive = fault_app.get("/healthz")
    assert down.status_code == 503 and down.json()["database"] == "unreachable"
    assert "retry-after" in down.headers
    assert alive.status_code == 200  # the process is alive; only readiness fails
    wait_until(lambda: fault_app.get("/readyz").status_code == 200, timeout_s=60)


@pytest.fixture(scope="module")
def job_fault_app(database_url):
    """Every graph becomes a job: a plan row and its job row are written together."""
    settings = make_settings(database_url, sync_max_ops=0)
    with TestClient(create_app(settings), raise_server_exceptions=False) as client:
        yield client


def test_a_crash_among_concurrent_submissions_leaves_no_half_written_plan_or_job(
    job_fault_app, session_factory, settings, database_url
):
    tenant_id, key = new_api_key(session_factory, settings)
    client = TenantClient(job_fault_app, tenant_id, key)
    answers: dict[int, tuple[int, str | None]] = {}
    crash_after = threading.Event()

    def submit(seed: int) -> None:
        if seed >= 6:
            crash_after.wait(30)
        response = client.post("/v1/plans", json=plan_request(diamond_graph("crash-among-many"), seed=seed))
        plan_id = response.json().get("id") if response.status_code in (200, 201, 202) else None
        answers[seed] = (response.status_code, plan_id)
        if seed == 5:
            crash_after.set()

    with database_restarted_after(database_url):
        threads = [threading.Thread(target=submit, args=(seed,)) for seed in range(12)]
        for thread in threads:
            thread.start()
        crash_after.wait(60)
        _stop_database()
        for thread in threads:
            thread.join(120)

    statuses = {status for status, _ in answers.values()}
    assert len(answers) == 12 and statuses <= {202, 503}, answers
    assert 503 in statuses  # the crash did hit some submissions
    acknowledged = {plan_id for status, plan_id in answers.values() if status == 202}
    with session_factory() as session:
        plans = list(session.scalars(select(Plan).where(Plan.tenant_id == tenant_id)))
        jobs = {job.plan_id: job for job in session.scalars(select(Job).where(Job.tenant_id == tenant_id))}
    assert acknowledged <= {plan.id for plan in plans}  # a 2xx answer is never lost
    for plan in plans:
        assert plan.status == "queued" and plan.id in jobs, plan.id  # plan and job: both or neither


def test_a_crash_between_storing_feedback_and_refitting_the_calibration_leaves_neither(
    fault_client, session_factory, database_url, monkeypatch
):
    plan = fault_client.post("/v1/plans", json=plan_request(diamond_graph("feedback-crash"))).json()
    real_refit = feedback_domain.refit_calibration

    def crash_then_refit(session, *args, **kwargs):
        session.flush()  # the feedback row is written to the database...
        _stop_database()  # ...which dies before the calibration and the commit
        return real_refit(session, *args, **kwargs)

    monkeypatch.setattr(feedback_domain, "refit_calibration", crash_then_refit)
    with database_restarted_after(database_url):
        response = fault_client.post(f"/v1/plans/{plan['id']}/feedback", json={"timeline": measured_timeline(plan)})
    assert response.status_code == 503, response.text
    tenant = fault_client.tenant_id
    assert _count(session_factory, Feedback, Feedback.tenant_id == tenant) == 0
    assert _count(session_factory, Calibration, Calibration.tenant_id == tenant) == 0

    monkeypatch.setattr(feedback_domain, "refit_calibration", real_refit)
    assert (
        fault_client.post(f"/v1/plans/{plan['id']}/feedback", json={"timeline": measured_timeline(plan)}).status_code
        == 201
    )
    assert _count(session_factory, Feedback, Feedback.tenant_id == tenant) == 1
    assert _count(session_factory, Calibration, Calibration.tenant_id == tenant) == 1
