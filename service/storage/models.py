"""ORM tables. Alembic migrations (migrations/) are the only source of schema.

Every tenant-owned table carries ``tenant_id NOT NULL`` with an index, and the
repositories take the tenant as a required argument, so one tenant's rows are
never reachable with another's key. Large documents (canonical graphs, plan
results, timelines, MoE placements) are compressed blobs (``storage.blobs``).
Relationships are ``lazy="raise"``: every load is explicit, no N+1 queries.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

from sqlalchemy import (
    JSON,
    Boolean,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Text,
    UniqueConstraint,
    event,
)
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

__all__ = [
    "Base",
    "Tenant",
    "ApiKey",
    "Graph",
    "InventoryRow",
    "Plan",
    "Job",
    "Feedback",
    "Calibration",
    "MoeDeployment",
    "MoePlacement",
    "IdempotencyKey",
    "new_id",
    "utcnow",
]

NAMING_CONVENTION = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

JSONType = JSON().with_variant(JSONB(), "postgresql")


def new_id() -> str:
    return str(uuid.uuid4())


def utcnow() -> datetime:
    return datetime.now(UTC)


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)


def _tenant_fk() -> Mapped[str]:
    return mapped_column(String(36), ForeignKey("tenants.id", ondelete="CASCADE"), nullable=False, index=True)


@event.listens_for(Base, "load", propagate=True)
@event.listens_for(Base, "refresh", propagate=True)
def _times_are_utc(target, _context, _attrs=None) -> None:
    """SQLite keeps no time zone: stored times are UTC, so say so on load (PostgreSQL already does).

    Without this a plan read back on SQLite answers ``created_at`` without an offset,
    which is not the RFC 3339 ``date-time`` its schema promises.
    """
    state = target.__dict__
    for key, value in list(state.items()):
        if isinstance(value, datetime) and value.tzinfo is None:
            state[key] = value.replace(tzinfo=UTC)


class Tenant(Base):
    __tablename__ = "tenants"

    id: Mapped[str] = mapped_column(String(36), primary_key=True, default=new_id)
    name: Mapped[str] = mapped_column(String(200), nullable=False, unique=True)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), nullable=False, default=utcnow)


class ApiKey(Base):
    """An API key, stored only as an HMAC of the secret (a leaked table reveals no key)."""

    __tablename__ = "api_keys"

    id: Mapped[str] = mapped_column(String(36), primary_key=True, default=new_id)
    tenant_id: Mapped[str] = _tenant_fk()
    name: Mapped[str] = mapped_column(String(200), nullable=False, default="")
    prefix: Mapped[str] = mapped_column(String(16), nullable=False, index=True)
    key_hash: Mapped[str] = mapped_column(String(64), nullable=False, unique=True)
    scopes: Mapped[str] = mapped_column(String(200), nullable=False, default="read write moe")
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), nullable=False, default=utcnow)
    revoked_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)


class Graph(Base):
    """A model's canonical graph, stored once per tenant and model hash."""

    __tablename__ = "graphs"
    __table_args__ = (UniqueConstraint("tenant_id", "model_hash"),)

    id: Mapped[str] = mapped_column(String(36), primary_key=True, default=new_id)
    tenant_id: Mapped[str] = _tenant_fk()
    model_hash: Mapped[str] = mapped_column(String(64), nullable=False)
    name: Mapped[str] = mapped_column(String(200), nullable=False, default="")
    source_format: Mapped[str] = mapped_column(String(16), nullable=False, default="json")
    n_ops: Mapped[int] = mapped_column(Integer, nullable=False)
    n_tensors: Mapped[int] = mapped_column(Integer, nullable=False)
    total_flops: Mapped[float] = mapped_column(Float, nullable=False, default=0.0)
    parameter_bytes: Mapped[float] = mapped_column(Float, nullable=False, default=0.0)
    activation_bytes: Mapped[float] = mapped_column(Float, nullable=False, default=0.0)
    warnings: Mapped[list] = mapped_column(JSONType, nullable=False, default=list)
    canonical: Mapped[bytes] = mapped_column(LargeBinary, nullable=False)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), nullable=False, default=utcnow)


class InventoryRow(Base):
    """A cluster inventory as submitted (presets expanded), stored once per hash."""

    __tablename__ = "inventories"
    __table_args__ = (UniqueConstraint("tenant_id", "inventory_hash"),)

    id: Mapped[str] = mapped_column(String(36), primary_key=True, default=new_id)
    tenant_id: Mapped[str] = _tenant_fk()
    inventory_hash: Mapped[str] = mapped_column(String(64), nullable=False)
    name: Mapped[str] = mapped_column(String(200), nullable=False, default="")
    n_devices: Mapped[int] = mapped_column(Integer, nullable=False)
    body: Mapped[bytes] = mapped_column(LargeBinary, nullable=False)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), nullable=False, default=utcnow)


class Plan(Base):
    """A placement plan: the row is the job's state machine and, once done, the result.

    ``cache_key`` hashes model, inventory, options (and parent/calibration for
    re-plans), so the same request returns the stored plan without recomputing.
    """

    __tablename__ = "plans"
    __table_args__ = (
        UniqueConstraint("tenant_id", "cache_key"),
        Index("ix_plans_tenant_model_created", "tenant_id", "model_hash", "created_at", "id"),
        Index("ix_plans_tenant_created", "tenant_id", "created_at", "id"),
    )

    id: Mapped[str] = mapped_column(String(36), primary_key=True, default=new_id)
    tenant_id: Mapped[str] = _tenant_fk()
    graph_id: Mapped[str] = mapped_column(
        String(36), ForeignKey("graphs.id", ondelete="CASCADE"), nullable=False, index=True
    )
    inventory_id: Mapped[str] = mapped_column(
        String(36), ForeignKey("inventories.id", ondelete="CASCADE"), nullable=False, index=True
    )
    parent_id: Mapped[str | None] = mapped_column(
        String(36), ForeignKey("plans.id", ondelete="SET NULL"), nullable=True, index=True
    )
    model_hash: Mapped[str] = mapped_column(String(64), nullable=False)
    inventory_hash: Mapped[str] = mapped_column(String(64), nullable=False)
    cache_key: Mapped[str] = mapped_column(String(64), nullable=False)
    options: Mapped[dict] = mapped_column(JSONType, nullable=False, default=dict)
    status: Mapped[str] = mapped_column(String(16), nullable=False, default="queued")
    progress: Mapped[float] = mapped_column(Float, nullable=False, default=0.0)
    error: Mapped[str | None] = mapped_column(Text, nullable=True)
    strategy: Mapped[str | None] = mapped_column(String(64), nullable=True)
    summary: Mapped[dict | None] = mapped_column(JSONType, nullable=True)
    result: Mapped[bytes | None] = mapped_column(LargeBinary, nullable=True)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), nullable=False, default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), nullable=False, default=utcnow)
    finished_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)


class Job(Base):
    """A planning job, claimed by workers with ``FOR UPDATE SKIP LOCKED`` under a lease."""

    __tablename__ = "jobs"
    __table_args__ = (Index("ix_jobs_status_lease", "status", "lease_expires_at"),)

    id: Mapped[str] = mapped_column(String(36), primary_key=True, default=new_id)
    tenant_id: Mapped[str] = _tenant_fk()
    plan_id: Mapped[str] = mapped_column(
        String(36), ForeignKey("plans.id", ondelete="CASCADE"), nullable=False, unique=True
    )
    status: Mapped[str] = mapped_column(String(16), nullable=False, default="queued")
    attempts: Mapped[int] = mapped_column(Integer, nullable=False, default=0)
    lease_owner: Mapped[str | None] = mapped_column(String(100), nullable=True)
    lease_expires_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), nullable=False, default=utcnow)
    finished_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)


class Feedback(Base):
    """A measured timeline of one run of a plan, stored in full (compressed)."""

    __tablename__ = "plan_feedback"
    __table_args__ = (Index("ix_plan_feedback_tenant_model_created", "tenant_id", "model_hash", "created_at"),)

    id: Mapped[str] = mapped_column(String(36), primary_key=True, default=new_id)
    tenant_id: Mapped[str] = _tenant_fk()
    plan_id: Mapped[str] = mapped_column(
        String(36), ForeignKey("plans.id", ondelete="CASCADE"), nullable=False, index=True
    )
    model_hash: Mapped[str] = mapped_column(String(64), nullable=False)
    inventory_hash: Mapped[str] = mapped_column(String(64), nullable=False)
    source_format: Mapped[str] = mapped_column(String(32), nullable=False)
    step_index: Mapped[int | None] = mapped_column(Integer, nullable=True)
    hardware_notes: Mapped[str] = mapped_column(Text, nullable=False, default="")
    measured_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)
    matched_events: Mapped[int] = mapped_column(Integer, nullable=False)
    unmatched_events: Mapped[int] = mapped_column(Integer, nullable=False)
    measured_makespan_s: Mapped[float | None] = mapped_column(Float, nullable=True)
    timeline: Mapped[bytes] = mapped_column(LargeBinary, nullable=False)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), nullable=False, default=utcnow)


class Calibration(Base):
    """Cost-model correction factors fitted from a tenant's timelines on one inventory."""

    __tablename__ = "calibrations"
    __table_args__ = (UniqueConstraint("tenant_id", "inventory_hash"),)

    id: Mapped[str] = mapped_column(String(36), primary_key=True, default=new_id)
    tenant_id: Mapped[str] = _tenant_fk()
    inventory_hash: Mapped[str] = mapped_column(String(64), nullable=False)
    factors: Mapped[dict] = mapped_column(JSONType, nullable=False, default=dict)
    n_timelines: Mapped[int] = mapped_column(Integer, nullable=False, default=0)
    version: Mapped[int] = mapped_column(Integer, nullable=False, default=1)
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), nullable=False, default=utcnow)


class MoeDeployment(Base):
    """A named MoE deployment whose current expert placement the service keeps."""

    __tablename__ = "moe_deployments"
    __table_args__ = (UniqueConstraint("tenant_id", "name"),)

    id: Mapped[str] = mapped_column(String(36), primary_key=True, default=new_id)
    tenant_id: Mapped[str] = _tenant_fk()
    name: Mapped[str] = mapped_column(String(200), nullable=False)
    config: Mapped[dict] = mapped_column(JSONType, nullable=False, default=dict)
    current_version: Mapped[int] = mapped_column(Integer, nullable=False, default=0)
    # the placement a report starts from (compressed int array, service.storage.moe), and the
    # version that set it: the runtime's ETag, which a report or confirmation must match
    placement: Mapped[bytes | None] = mapped_column(LargeBinary, nullable=True)
    placement_version: Mapped[int] = mapped_column(Integer, nullable=False, default=0, server_default="0")
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), nullable=False, default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), nullable=False, default=utcnow)


class MoePlacement(Base):
    """One load report (or applied confirmation) of a deployment and the change it made (history).

    Rows before migration 0002 hold the whole placement in ``placement``; later ones hold
    only the slots that changed in ``change`` (the deployment keeps the current placement).
    """

    __tablename__ = "moe_placements"
    __table_args__ = (UniqueConstraint("deployment_id", "version"),)

    id: Mapped[str] = mapped_column(String(36), primary_key=True, default=new_id)
    tenant_id: Mapped[str] = _tenant_fk()
    deployment_id: Mapped[str] = mapped_column(
        String(36), ForeignKey("moe_deployments.id", ondelete="CASCADE"), nullable=False, index=True
    )
    version: Mapped[int] = mapped_column(Integer, nullable=False)
    kept_current: Mapped[bool] = mapped_column(Boolean, nullable=False, default=False)
    balance: Mapped[dict] = mapped_column(JSONType, nullable=False, default=dict)
    slots_moved: Mapped[int] = mapped_column(Integer, nullable=False, default=0)
    load: Mapped[bytes] = mapped_column(LargeBinary, nullable=False)
    placement: Mapped[bytes | None] = mapped_column(LargeBinary, nullable=True)
    change: Mapped[bytes | None] = mapped_column(LargeBinary, nullable=True)
    # "answered" (a report), "applied" (confirmed in full), "partially applied" (some migrations
    # confirmed: a "confirmed" row follows), "confirmed" (the placement the runtime reported back)
    status: Mapped[str] = mapped_column(String(20), nullable=False, default="answered", server_default="answered")
    placement_version: Mapped[int | None] = mapped_column(Integer, nullable=True)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), nullable=False, default=utcnow)


class IdempotencyKey(Base):
    """A creating request's ``Idempotency-Key``: fingerprint and stored response.

    Written in the same transaction as what the request created, so a retry after
    a crash either finds both or neither.
    """

    __tablename__ = "idempotency_keys"

    tenant_id: Mapped[str] = mapped_column(
        String(36), ForeignKey("tenants.id", ondelete="CASCADE"), primary_key=True, index=True
    )
    key: Mapped[str] = mapped_column(String(200), primary_key=True)
    route: Mapped[str] = mapped_column(String(100), nullable=False)
    fingerprint: Mapped[str] = mapped_column(String(64), nullable=False)
    status_code: Mapped[int] = mapped_column(Integer, nullable=False)
    response: Mapped[bytes] = mapped_column(LargeBinary, nullable=False)
    location: Mapped[str | None] = mapped_column(String(300), nullable=True)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), nullable=False, default=utcnow)
