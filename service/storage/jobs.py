"""Repository for planning jobs: queue, claim under a lease, heartbeat, finish.

A worker claims the oldest queued job (or a running one whose lease expired, i.e.
whose worker died) with ``SELECT ... FOR UPDATE SKIP LOCKED``, so two workers never
claim the same row; on SQLite, ``BEGIN IMMEDIATE`` serialises the claim instead.
Completion is a compare-and-set on ``(status='running', lease_owner=me)``: a worker
that lost its lease cannot also complete the job, so each job completes exactly once.

Tenancy: the claim is the one query that spans tenants (a worker serves them all);
it hands back a :class:`ClaimedJob` that carries its tenant, and every later query on
the job (heartbeat, completion, failure) is scoped to that tenant. Callers commit.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import and_, or_, select, update
from sqlalchemy.orm import Session

from service.storage.models import Job, Plan, utcnow

__all__ = [
    "MAX_ATTEMPTS",
    "ClaimedJob",
    "add_job",
    "claim_next_job",
    "complete_job",
    "extend_lease",
    "fail_job",
]

#: Claims of one job before it is failed (worker crashes or lost leases each use one).
MAX_ATTEMPTS = 3


@dataclass(frozen=True)
class ClaimedJob:
    """A job a worker holds the lease of: plain data, usable after the claim's session closed."""

    id: str
    tenant_id: str
    plan_id: str
    attempts: int

    def __post_init__(self) -> None:
        if not self.id or not self.tenant_id or not self.plan_id or self.attempts < 1:
            raise ValueError("a claimed job has an id, a tenant, a plan and at least one attempt")


def add_job(session: Session, tenant_id: str, plan_id: str, created_at: datetime) -> Job:
    """Queue a job for the tenant's plan (flushed, not committed)."""
    job = Job(tenant_id=tenant_id, plan_id=plan_id, status="queued", created_at=created_at)
    session.add(job)
    session.flush()
    return job


def claim_next_job(session: Session, worker_id: str, lease_s: float) -> ClaimedJob | None:
    """Claim the oldest claimable job of any tenant for ``worker_id``; the caller commits right after.

    A job claimed more than :data:`MAX_ATTEMPTS` times is failed, with its plan, and
    None returned (the caller polls again).
    """
    now = utcnow()
    claimable = or_(Job.status == "queued", and_(Job.status == "running", Job.lease_expires_at < now))
    stmt = select(Job).where(claimable).order_by(Job.created_at, Job.id).limit(1).with_for_update(skip_locked=True)
    job = session.scalar(stmt)
    if job is None:
        return None
    job.attempts += 1
    plan = session.scalar(select(Plan).where(Plan.tenant_id == job.tenant_id, Plan.id == job.plan_id))
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
    return ClaimedJob(id=job.id, tenant_id=job.tenant_id, plan_id=job.plan_id, attempts=job.attempts)


def _leased(job: ClaimedJob, worker_id: str):
    return and_(Job.tenant_id == job.tenant_id, Job.id == job.id, Job.lease_owner == worker_id, Job.status == "running")


def extend_lease(
    session: Session, job: ClaimedJob, worker_id: str, lease_s: float, *, progress: float | None = None
) -> bool:
    """Heartbeat: push the lease forward (and record the plan's progress) if ``worker_id`` still holds it."""
    result = session.execute(
        update(Job).where(_leased(job, worker_id)).values(lease_expires_at=utcnow() + timedelta(seconds=lease_s))
    )
    if result.rowcount != 1:
        return False
    if progress is not None:
        session.execute(
            update(Plan)
            .where(Plan.tenant_id == job.tenant_id, Plan.id == job.plan_id, Plan.status == "running")
            .values(progress=progress)
        )
    return True


def _finish_if_leased(session: Session, job: ClaimedJob, worker_id: str, status: str) -> bool:
    """Compare-and-set the job to ``status`` if ``worker_id`` still holds its lease."""
    result = session.execute(update(Job).where(_leased(job, worker_id)).values(status=status, finished_at=utcnow()))
    return result.rowcount == 1


def complete_job(session: Session, job: ClaimedJob, worker_id: str, apply_result: Callable[[Plan], None]) -> bool:
    """Mark the job done and write the plan's result in one transaction, if the lease is still ours.

    ``apply_result`` writes the result onto the plan row; False (nothing written) when
    the lease was lost, or the plan was deleted meanwhile.
    """
    if not _finish_if_leased(session, job, worker_id, "done"):
        return False
    plan = session.scalar(select(Plan).where(Plan.tenant_id == job.tenant_id, Plan.id == job.plan_id))
    if plan is None:
        return False
    now = utcnow()
    apply_result(plan)
    plan.updated_at = now
    plan.finished_at = now
    session.flush()
    return True


def fail_job(session: Session, job: ClaimedJob, worker_id: str, error: str) -> bool:
    """Mark the job and its plan failed with ``error``, if the lease is still ours."""
    if not _finish_if_leased(session, job, worker_id, "failed"):
        return False
    now = utcnow()
    session.execute(
        update(Plan)
        .where(Plan.tenant_id == job.tenant_id, Plan.id == job.plan_id)
        .values(status="failed", error=error[:2000], updated_at=now, finished_at=now)
    )
    return True
