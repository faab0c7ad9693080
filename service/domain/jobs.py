"""Planning jobs: rows claimed under a lease, by any number of workers.

A worker claims the oldest queued job (or a running one whose lease expired,
i.e. whose worker died) with ``SELECT ... FOR UPDATE SKIP LOCKED``, so two
workers never claim the same row; on SQLite, ``BEGIN IMMEDIATE`` serialises the
claim instead. While planning, a heartbeat extends the lease. Completion is a
compare-and-set on ``(status='running', lease_owner=me)``: a worker that lost its
lease (it stalled past it and another worker took over) cannot also complete the
job, so each job completes exactly once.
"""

from __future__ import annotations

import os
import socket
import threading
import uuid
from collections.abc import Callable
from datetime import timedelta

import structlog
from sqlalchemy import and_, or_, select, update
from sqlalchemy.orm import Session, sessionmaker

from service.settings import Settings
from service.storage.models import Job, Plan, utcnow

__all__ = ["claim_next_job", "complete_job", "fail_job", "extend_lease", "process_one", "run_worker", "EmbeddedWorker", "MAX_ATTEMPTS", "new_worker_id"]

log = structlog.get_logger("hyperplace.jobs")
MAX_ATTEMPTS = 3


def new_worker_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


def claim_next_job(session: Session, worker_id: str, lease_s: float) -> Job | None:
    """Claim one job for ``worker_id``; the caller commits right after."""
    now = utcnow()
    claimable = or_(Job.status == "queued", and_(Job.status == "running", Job.lease_expires_at < now))
    stmt = select(Job).where(claimable).order_by(Job.created_at, Job.id).limit(1).with_for_update(skip_locked=True)
    job = session.scalar(stmt)
    if job is None:
        return None
    job.attempts += 1
    plan = session.get(Plan, job.plan_id)
    if job.attempts > MAX_ATTEMPTS:
        job.status = "failed"
        job.finished_at = now
        if plan is not None:
            plan.status = "failed"
            plan.error = f"planning was interrupted {MAX_ATTEMPTS} times (worker crashes or timeouts); giving up"
            plan.updated_at = now
        session.flush()
        return None
    job.status = "running"
    job.lease_owner = worker_id
    job.lease_expires_at = now + timedelta(seconds=lease_s)
    if plan is not None:
        plan.status = "running"
        plan.updated_at = now
    session.flush()
    return job


def extend_lease(
    session: Session, job_id: str, worker_id: str, lease_s: float, *, plan_id: str | None = None, progress: float | None = None
) -> bool:
    """Heartbeat: push the lease forward (and record the plan's progress) if this worker still holds it."""
    result = session.execute(
        update(Job)
        .where(Job.id == job_id, Job.lease_owner == worker_id, Job.status == "running")
        .values(lease_expires_at=utcnow() + timedelta(seconds=lease_s))
    )
    if result.rowcount != 1:
        return False
    if plan_id is not None and progress is not None:
        session.execute(update(Plan).where(Plan.id == plan_id, Plan.status == "running").values(progress=progress))
    return True


def _finish_if_leased(session: Session, job: Job, worker_id: str, status: str) -> bool:
    """Compare-and-set the job to ``status`` if ``worker_id`` still holds its lease."""
    result = session.execute(
        update(Job)
        .where(Job.id == job.id, Job.lease_owner == worker_id, Job.status == "running")
        .values(status=status, finished_at=utcnow())
    )
    return result.rowcount == 1


def complete_job(session: Session, job: Job, worker_id: str, apply_result: Callable[[Plan], None]) -> bool:
    """Mark the job done and write the plan result in one transaction, if the lease is still ours."""
    if not _finish_if_leased(session, job, worker_id, "done"):
        log.warning("lost the lease before completing; discarding result", job_id=job.id)
        return False
    now = utcnow()
    plan = session.get(Plan, job.plan_id)
    apply_result(plan)
    plan.updated_at = now
    plan.finished_at = now
    session.flush()
    return True


def fail_job(session: Session, job: Job, worker_id: str, error: str) -> bool:
    """Mark the job and its plan failed with ``error``, if the lease is still ours."""
    if not _finish_if_leased(session, job, worker_id, "failed"):
        return False
    now = utcnow()
    session.execute(update(Plan).where(Plan.id == job.plan_id).values(status="failed", error=error[:2000], updated_at=now, finished_at=now))
    return True


def process_one(session_factory: sessionmaker[Session], settings: Settings, worker_id: str) -> bool:
    """Claim and run one job. Returns whether a job was found."""
    from service.domain.planning import run_planning_job  # planning imports the heavy partitioners

    with session_factory() as session, session.begin():
        job = claim_next_job(session, worker_id, settings.job_lease_s)
        if job is None:
            return False
        session.expunge(job)
    structlog.contextvars.bind_contextvars(plan_id=job.plan_id, job_id=job.id)
    log.info("job claimed", attempt=job.attempts)

    stop_heartbeat = threading.Event()
    progress = {"fraction": 0.0}  # written by the planner's callback, read by the heartbeat

    def heartbeat() -> None:
        while not stop_heartbeat.wait(min(settings.job_lease_s / 3, 2.0)):
            try:
                with session_factory() as hb_session, hb_session.begin():
                    if not extend_lease(
                        hb_session, job.id, worker_id, settings.job_lease_s, plan_id=job.plan_id, progress=progress["fraction"]
                    ):
                        return
            except Exception:  # database blip: the next beat tries again
                log.warning("lease heartbeat failed", exc_info=True)

    beat = threading.Thread(target=heartbeat, name=f"lease-{job.id[:8]}", daemon=True)
    beat.start()
    try:
        run_planning_job(session_factory, job, worker_id, on_progress=lambda fraction: progress.update(fraction=fraction))
    finally:
        stop_heartbeat.set()
        beat.join(timeout=5)
        structlog.contextvars.unbind_contextvars("plan_id", "job_id")
    return True


def run_worker(session_factory: sessionmaker[Session], settings: Settings, stop: threading.Event, worker_id: str | None = None) -> None:
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
