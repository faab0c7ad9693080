"""Repository for measured timelines (``plan_feedback``) and calibrations. Every function takes the tenant.

A timeline row's blob holds two zlib-compressed JSON documents one after the
other: what the service derived (match report, matched observations) and the
timeline as posted. Calibration reads only the first, so refitting from 50 stored
100 MB torch traces never decompresses the traces themselves.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import and_, exists, or_, select
from sqlalchemy.orm import Session

from service.storage.blobs import pack_json, unpack_json
from service.storage.db import insert_or_fetch
from service.storage.models import Calibration, Feedback, InventoryRow

__all__ = [
    "pack_timeline",
    "unpack_derived",
    "unpack_posted",
    "insert_feedback",
    "get_feedback",
    "list_feedback_for_plan",
    "list_feedback_for_model",
    "plan_has_feedback",
    "recent_feedback_for_inventory",
    "lock_calibration",
    "get_calibration",
    "save_calibration",
]


_MAGIC = b"HPFB1"
_HEADER = len(_MAGIC) + 8


def pack_timeline(derived: dict, posted) -> bytes:
    """``derived`` and ``posted`` as one blob; ValueError when either holds NaN or infinity."""
    head = pack_json(derived)
    return _MAGIC + len(head).to_bytes(8, "big") + head + pack_json(posted)


def _split(blob: bytes) -> tuple[bytes, bytes]:
    if not blob.startswith(_MAGIC):
        raise ValueError("not a timeline blob")
    n = int.from_bytes(blob[len(_MAGIC) : _HEADER], "big")
    return blob[_HEADER : _HEADER + n], blob[_HEADER + n :]


def unpack_derived(blob: bytes) -> dict:
    """The match report and observations (the first document only)."""
    return unpack_json(_split(blob)[0])


def unpack_posted(blob: bytes):
    """The timeline document as it was posted."""
    return unpack_json(_split(blob)[1])


def insert_feedback(session: Session, tenant_id: str, row: Feedback) -> Feedback:
    """Insert inside a SAVEPOINT: if the plan was deleted meanwhile the foreign key fails
    (``IntegrityError``) and the caller's transaction stays usable to say so."""
    row.tenant_id = tenant_id
    with session.begin_nested():
        session.add(row)
        session.flush()
    return row


def get_feedback(session: Session, tenant_id: str, feedback_id: str) -> Feedback | None:
    return session.scalar(select(Feedback).where(Feedback.tenant_id == tenant_id, Feedback.id == feedback_id))


def _page(stmt, limit: int, cursor: tuple[datetime, str] | None):
    if cursor is not None:
        created_at, row_id = cursor
        stmt = stmt.where(
            or_(Feedback.created_at < created_at, and_(Feedback.created_at == created_at, Feedback.id < row_id))
        )
    return stmt.order_by(Feedback.created_at.desc(), Feedback.id.desc()).limit(limit)


def list_feedback_for_plan(
    session: Session, tenant_id: str, plan_id: str, *, limit: int, cursor: tuple[datetime, str] | None = None
) -> list[Feedback]:
    """Newest first, keyset-paginated on ``(created_at, id)``."""
    stmt = select(Feedback).where(Feedback.tenant_id == tenant_id, Feedback.plan_id == plan_id)
    return list(session.scalars(_page(stmt, limit, cursor)))


def list_feedback_for_model(
    session: Session, tenant_id: str, model_hash: str, *, limit: int, cursor: tuple[datetime, str] | None = None
) -> list[Feedback]:
    """Newest first (index ix_plan_feedback_tenant_model_created)."""
    stmt = select(Feedback).where(Feedback.tenant_id == tenant_id, Feedback.model_hash == model_hash)
    return list(session.scalars(_page(stmt, limit, cursor)))


def plan_has_feedback(session: Session, tenant_id: str, plan_id: str) -> bool:
    return bool(session.scalar(select(exists().where(Feedback.tenant_id == tenant_id, Feedback.plan_id == plan_id))))


def lock_calibration(session: Session, tenant_id: str, inventory_hash: str) -> None:
    """Serialise refits of one (tenant, inventory) calibration until the transaction ends.

    A refit reads the timelines, then writes the factors; two at once (a new timeline,
    a deleted plan) would each read without the other's change and the later write
    would win with stale factors. Locking the inventory row first (``FOR NO KEY
    UPDATE``, which plans referencing it do not wait for) makes the second refit read
    after the first commits. On SQLite the writer lock already serialises them.
    """
    session.execute(
        select(InventoryRow.id)
        .where(InventoryRow.tenant_id == tenant_id, InventoryRow.inventory_hash == inventory_hash)
        .with_for_update(key_share=True)
    )


def recent_feedback_for_inventory(
    session: Session, tenant_id: str, inventory_hash: str, *, limit: int
) -> list[Feedback]:
    """The newest ``limit`` timelines measured on one inventory (what calibration fits)."""
    stmt = (
        select(Feedback)
        .where(Feedback.tenant_id == tenant_id, Feedback.inventory_hash == inventory_hash)
        .order_by(Feedback.created_at.desc(), Feedback.id.desc())
        .limit(limit)
    )
    return list(session.scalars(stmt))


def get_calibration(session: Session, tenant_id: str, inventory_hash: str) -> Calibration | None:
    return session.scalar(
        select(Calibration).where(Calibration.tenant_id == tenant_id, Calibration.inventory_hash == inventory_hash)
    )


def save_calibration(
    session: Session, tenant_id: str, inventory_hash: str, factors: dict, n_timelines: int, now: datetime
) -> Calibration:
    """Insert version 1 or bump the version of the tenant's calibration for this inventory.

    Two concurrent first writers: the loser's insert fails inside its SAVEPOINT
    and it updates the winner's row instead (the unique key is
    ``(tenant_id, inventory_hash)``). Updates take a row lock on PostgreSQL so the
    version increments once per write.
    """
    row = session.scalar(
        select(Calibration)
        .where(Calibration.tenant_id == tenant_id, Calibration.inventory_hash == inventory_hash)
        .with_for_update()
    )
    if row is None:
        row = Calibration(
            tenant_id=tenant_id,
            inventory_hash=inventory_hash,
            factors=factors,
            n_timelines=n_timelines,
            version=1,
            updated_at=now,
        )
        inserted = insert_or_fetch(session, row, lambda: get_calibration(session, tenant_id, inventory_hash))
        if inserted is row:
            return row
        row = inserted
    row.factors = factors
    row.n_timelines = n_timelines
    row.version = row.version + 1
    row.updated_at = now
    session.flush()
    return row
