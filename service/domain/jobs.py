"""The planning worker: claims jobs, plans them with no transaction open, completes them under the lease.

The job table's queries (claim with ``FOR UPDATE SKIP LOCKED``, heartbeat, the
compare-and-set completion that makes each job complete exactly once) are in
:mod:`service.storage.jobs`; this module runs them in a loop and does the planning
in between through :mod:`service.domain.planning`, which knows nothing of jobs.
While planning, a heartbeat thread extends the lease and records the plan's progress.
"""

from __future__ import annotations

import os
import socket
import threading
import uuid
from collections.abc import Callable

import structlog
from sqlalchemy.orm import Session, sessionmaker

from service.domain.calibration import plan_cost_model, split_stored_options
from service.domain.planning import compute_plan, load_plan_inputs
from service.settings import Settings
from service.storage import jobs as jobs_repo
from service.storage import plans as plans_repo
from service.storage.blobs import pack_json
from service.storage.jobs import MAX_ATTEMPTS, ClaimedJob
from service.storage.models import Plan

__all__ = [
    "MAX_ATTEMPTS",
    "EmbeddedWorker",
    "new_worker_id",
    "process_one",
    "run_planning_job",
    "run_worker",
]

log = structlog.get_logger("hyperplace.jobs")


def new_worker_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


def run_planning_job(
    session_factory: sessionmaker[Session],
    job: ClaimedJob,
    worker_id: str,
    on_progress: Callable[[float], None] | None = None,
) -> None:
    """Worker side of a job: load inputs, plan with no transaction open, complete under the lease.

    A re-plan's calibration comes back from the plan's stored options as the factors
    document it was keyed with, and reaches planning as a cost model.
    """
    with session_factory() as session:
        plan = plans_repo.get_plan(session, job.tenant_id, job.plan_id)
        if plan is None:  # deleted while queued
            with session.begin():
                jobs_repo.fail_job(session, job, worker_id, "the plan was deleted")
            return
        stored, inventory = load_plan_inputs(session, plan)
        graph = stored.graph
        options, factors = split_stored_options(plan.options)
        graph_warnings = list(graph.warnings)
        session.rollback()
    cost_model = plan_cost_model(options, factors, inventory) if factors is not None else None
    try:
        strategy, summary, body = compute_plan(graph, inventory, options, cost_model, on_progress)
    except Exception as exc:  # a planning failure is the job's outcome, not the worker's
        log.warning("planning failed", error=str(exc)[:500])
        with session_factory() as session, session.begin():
            jobs_repo.fail_job(session, job, worker_id, f"{type(exc).__name__}: {exc}")
        return
    body["warnings"] = graph_warnings[:500]

    def apply(plan_row: Plan) -> None:
        plan_row.status, plan_row.progress, plan_row.strategy = "done", 1.0, strategy
        plan_row.summary = summary
        plan_row.result = pack_json(body)

    with session_factory() as session, session.begin():
        if not jobs_repo.complete_job(session, job, worker_id, apply):
            log.warning("lost the lease before completing; discarding result", job_id=job.id)


def process_one(session_factory: sessionmaker[Session], settings: Settings, worker_id: str) -> bool:
    """Claim and run one job. Returns whether a job was found."""
    with session_factory() as session, session.begin():
        job = jobs_repo.claim_next_job(session, worker_id, settings.job_lease_s)
        if job is None:
            return False
    structlog.contextvars.bind_contextvars(plan_id=job.plan_id, job_id=job.id)
    log.info("job claimed", attempt=job.attempts)

    stop_heartbeat = threading.Event()
    progress = {"fraction": 0.0}  # written by the planner's callback, read by the heartbeat

    def heartbeat() -> None:
        while not stop_heartbeat.wait(min(settings.job_lease_s / 3, 2.0)):
            try:
                with session_factory() as hb_session, hb_session.begin():
                    if not jobs_repo.extend_lease(
                        hb_session, job, worker_id, settings.job_lease_s, progress=progress["fraction"]
                    ):
                        return
            except Exception:  # database blip: the next beat tries again
                log.warning("lease heartbeat failed", exc_info=True)

    beat = threading.Thread(target=heartbeat, name=f"lease-{job.id[:8]}", daemon=True)
    beat.start()
    try:
        run_planning_job(
            session_factory, job, worker_id, on_progress=lambda fraction: progress.update(fraction=fraction)
        )
    finally:
        stop_heartbeat.set()
        beat.join(timeout=5)
        structlog.contextvars.unbind_contextvars("plan_id", "job_id")
    return True


def run_worker(
    session_factory: sessionmaker[Session], settings: Settings, stop: threading.Event, worker_id: str | None = None
) -> None:
    """Loop: claim and run jobs until ``stop`` is set; sleep ``worker_poll_s`` when idle."""
    worker_id = worker_id or new_worker_id()
    log.info("worker started", worker_id=worker_id)
    while not stop.is_set():
        try:
            found = process_one(session_factory, settings, worker_id)
        except Exception:
            log.exception("worker loop error")
            found = False
        if not found:
            stop.wait(settings.worker_poll_s)
    log.info("worker stopped", worker_id=worker_id)


class EmbeddedWorker:
    """The in-process worker of the embedded (SQLite) mode: one background thread."""

    def __init__(self, session_factory: sessionmaker[Session], settings: Settings) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=run_worker, args=(session_factory, settings, self._stop), name="hyperplace-worker", daemon=True
        )

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
