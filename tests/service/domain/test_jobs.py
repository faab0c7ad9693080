"""Large graphs become jobs: 202, queued -> running -> done, claimed once, survive a killed worker."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select

from partitioners.graph.generators import synthetic_graph_json
from service.app import create_app
from service.domain.jobs import new_worker_id, process_one, run_planning_job
from service.storage.jobs import claim_next_job, complete_job, extend_lease
from service.storage.models import Job, Plan
from tests.conftest import TenantClient, make_settings, new_api_key
from tests.service.graphs import diamond_graph, plan_request

REPO = Path(__file__).parents[3]


@pytest.fixture(scope="module")
def job_settings(database_url):
    return make_settings(database_url, sync_max_ops=0, job_lease_s=2.0, worker_poll_s=0.1)


@pytest.fixture(scope="module")
def job_app_client(job_settings):
    with TestClient(create_app(job_settings), raise_server_exceptions=False) as client:
        yield client


@pytest.fixture
def job_client(job_app_client, session_factory, job_settings):
    tenant_id, key = new_api_key(session_factory, job_settings)
    return TenantClient(job_app_client, tenant_id, key)


def _wait_for(predicate, timeout_s: float = 60.0, interval_s: float = 0.1):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval_s)
    raise AssertionError("timed out waiting")


def test_a_large_graph_answers_202_with_a_queued_plan(job_client):
    response = job_client.post("/v1/plans", json=plan_request(diamond_graph("queued")))
    assert response.status_code == 202, response.text
    assert response.json()["status"] == "queued"
    assert response.headers["location"] == f"/v1/plans/{response.json()['id']}"


def test_a_worker_runs_the_job_and_the_plan_becomes_done(job_client, session_factory, job_settings):
    plan_id = job_client.post("/v1/plans", json=plan_request(diamond_graph("worked"))).json()["id"]
    _wait_for(
        lambda: (
            process_one(session_factory, job_settings, new_worker_id())
            and job_client.get(f"/v1/plans/{plan_id}").json()["status"] == "done"
        )
    )
    plan = job_client.get(f"/v1/plans/{plan_id}").json()
    assert plan["ops"] and plan["summary"]["makespan_s"] > 0


def test_a_worker_plans_with_the_cost_model_the_request_named(job_client, session_factory, job_settings):
    request = plan_request(diamond_graph("worked-roofline"), cost_model={"profile": "roofline", "launch": "per-device"})
    plan_id = job_client.post("/v1/plans", json=request).json()["id"]
    _wait_for(
        lambda: (
            process_one(session_factory, job_settings, new_worker_id())
            and job_client.get(f"/v1/plans/{plan_id}").json()["status"] == "done"
        )
    )
    echoed = job_client.get(f"/v1/plans/{plan_id}").json()["summary"]["cost_model"]
    assert (echoed["profile"], echoed["launch"]) == ("roofline", "per-device")


def test_two_workers_never_complete_the_same_job(job_client, session_factory, job_settings):
    plan_ids = [
        job_client.post("/v1/plans", json=plan_request(diamond_graph("race"), seed=i)).json()["id"] for i in range(6)
    ]
    completions: list[tuple[str, str]] = []
    lock = threading.Lock()

    def worker(worker_id: str) -> None:
        while True:
            with session_factory() as session, session.begin():
                job = claim_next_job(session, worker_id, job_settings.job_lease_s)
                if job is None:
                    return
            if job.plan_id not in plan_ids:  # another test's job: leave it to run normally
                run_planning_job(session_factory, job, worker_id)
                continue
            with session_factory() as session, session.begin():
                if complete_job(session, job, worker_id, lambda plan: setattr(plan, "status", "done")):
                    with lock:
                        completions.append((job.plan_id, worker_id))

    threads = [threading.Thread(target=worker, args=(f"w{i}",)) for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    completed = [plan_id for plan_id, _ in completions]
    assert sorted(completed) == sorted(plan_ids)  # each exactly once


def test_a_job_whose_worker_lost_its_lease_cannot_be_completed_by_it(job_client, session_factory, job_settings):
    plan_id = job_client.post("/v1/plans", json=plan_request(diamond_graph("stale"))).json()["id"]
    with session_factory() as session, session.begin():
        job = session.scalar(select(Job).where(Job.plan_id == plan_id))
        job.status, job.lease_owner = "running", "dead-worker"
        job.lease_expires_at = job.created_at  # long expired
    with session_factory() as session, session.begin():
        reclaimed = claim_next_job(session, "new-worker", 30)
        while reclaimed is not None and reclaimed.plan_id != plan_id:
            reclaimed = claim_next_job(session, "new-worker", 30)
        assert reclaimed is not None and reclaimed.attempts == 1
    with session_factory() as session, session.begin():
        assert not complete_job(session, reclaimed, "dead-worker", lambda plan: None)
        assert complete_job(session, reclaimed, "new-worker", lambda plan: setattr(plan, "status", "done"))


def _start_worker(database_url: str, lease_s: float) -> subprocess.Popen:
    env = dict(
        os.environ,
        HYPERPLACE_DATABASE_URL=database_url,
        HYPERPLACE_JOB_LEASE_S=str(lease_s),
        HYPERPLACE_WORKER_POLL_S="0.1",
        HYPERPLACE_LOG_LEVEL="WARNING",
    )
    return subprocess.Popen(
        [sys.executable, "-m", "service.cli", "worker"],
        cwd=REPO,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


@pytest.mark.slow
def test_a_killed_workers_job_is_claimed_again_and_completes_once(job_client, session_factory, database_url):
    request = plan_request(synthetic_graph_json(6000, seed=3))
    plan_id = job_client.post("/v1/plans", json=request).json()["id"]
    first = _start_worker(database_url, lease_s=2.0)
    try:
        _wait_for(lambda: job_client.get(f"/v1/plans/{plan_id}").json()["status"] == "running", interval_s=0.02)
        first.send_signal(signal.SIGKILL)
        first.wait(10)
    finally:
        if first.poll() is None:
            first.kill()
    second = _start_worker(database_url, lease_s=2.0)
    try:
        _wait_for(lambda: job_client.get(f"/v1/plans/{plan_id}").json()["status"] in ("done", "failed"), timeout_s=180)
    finally:
        second.terminate()
        second.wait(10)
    plan = job_client.get(f"/v1/plans/{plan_id}").json()
    assert plan["status"] == "done", plan["error"]
    with session_factory() as session:
        job = session.scalar(select(Job).where(Job.plan_id == plan_id))
        assert job.status == "done" and job.attempts == 2
        assert session.get(Plan, plan_id).finished_at is not None


def test_the_heartbeat_records_progress_while_the_lease_is_held(job_client, session_factory):
    plan_id = job_client.post("/v1/plans", json=plan_request(diamond_graph("progress"), seed=77)).json()["id"]
    with session_factory() as session, session.begin():
        job = claim_next_job(session, "progress-worker", 30)
        while job is not None and job.plan_id != plan_id:
            job = claim_next_job(session, "progress-worker", 30)
    with session_factory() as session, session.begin():
        assert extend_lease(session, job, "progress-worker", 30, progress=0.4)
        assert not extend_lease(session, job, "someone-else", 30, progress=0.9)
    plan = job_client.get(f"/v1/plans/{plan_id}").json()
    assert plan["status"] == "running" and plan["progress"] == pytest.approx(0.4)
