"""Repository for graphs, inventories and plans. Every function takes the tenant.

A plan queued for a worker gets its job row through :mod:`service.storage.jobs`.

Rows that concurrent requests may insert at the same time (a graph, an
inventory, a plan with the same cache key) are written inside a SAVEPOINT: on a
unique-key conflict the savepoint rolls back and the existing row is returned,
so N identical submissions produce one row each, on both dialects.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable
from datetime import datetime

from sqlalchemy import and_, delete, literal, or_, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from service.storage import jobs as jobs_repo
from service.storage.db import insert_or_fetch
from service.storage.models import Feedback, Graph, IdempotencyKey, InventoryRow, Plan

__all__ = [
    "get_graph",
    "get_graph_by_hash",
    "get_or_create_graph",
    "get_or_create_inventory",
    "get_inventory",
    "get_plan",
    "lock_plan",
    "get_plan_by_cache_key",
    "insert_plan",
    "delete_plan",
    "list_plans_for_model",
    "get_idempotency_key",
    "delete_idempotency_key",
    "delete_idempotency_keys_of_plan",
    "plan_location",
    "encode_cursor",
    "decode_cursor",
]


def get_graph(session: Session, tenant_id: str, graph_id: str) -> Graph | None:
    return session.scalar(select(Graph).where(Graph.tenant_id == tenant_id, Graph.id == graph_id))


def get_graph_by_hash(session: Session, tenant_id: str, model_hash: str) -> Graph | None:
    return session.scalar(select(Graph).where(Graph.tenant_id == tenant_id, Graph.model_hash == model_hash))


def _get_or_create(session: Session, row, find):
    """The row ``find()`` returns, or ``row`` inserted (or the winner of a concurrent insert)."""
    existing = find()
    if existing is not None:
        return existing
    return insert_or_fetch(session, row, find)


def get_or_create_graph(session: Session, tenant_id: str, model_hash: str, make_row: Callable[[], Graph]) -> Graph:
    """The tenant's graph with ``model_hash``, or ``make_row()`` inserted: the row (and its compressed
    canonical document) is only built when the tenant does not have the graph yet."""
    existing = get_graph_by_hash(session, tenant_id, model_hash)
    if existing is not None:
        return existing
    row = make_row()
    row.tenant_id = tenant_id
    return insert_or_fetch(session, row, lambda: get_graph_by_hash(session, tenant_id, model_hash))


def _inventory_by_hash(session: Session, tenant_id: str, inventory_hash: str) -> InventoryRow | None:
    return session.scalar(
        select(InventoryRow).where(InventoryRow.tenant_id == tenant_id, InventoryRow.inventory_hash == inventory_hash)
    )


def get_or_create_inventory(session: Session, tenant_id: str, row: InventoryRow) -> InventoryRow:
    row.tenant_id = tenant_id
    return _get_or_create(session, row, lambda: _inventory_by_hash(session, tenant_id, row.inventory_hash))


def get_inventory(session: Session, tenant_id: str, inventory_id: str) -> InventoryRow | None:
    return session.scalar(
        select(InventoryRow).where(InventoryRow.tenant_id == tenant_id, InventoryRow.id == inventory_id)
    )


def get_plan(session: Session, tenant_id: str, plan_id: str) -> Plan | None:
    return session.scalar(select(Plan).where(Plan.tenant_id == tenant_id, Plan.id == plan_id))


def lock_plan(session: Session, tenant_id: str, plan_id: str) -> Plan | None:
    """The plan, row-locked on PostgreSQL until the transaction ends (SQLite's writer lock already is one).

    A delete takes it first so that a timeline or a child plan being written for the
    plan at the same moment either lands before (and is deleted with it) or fails
    after (its foreign key finds no plan), never in between.
    """
    return session.scalar(select(Plan).where(Plan.tenant_id == tenant_id, Plan.id == plan_id).with_for_update())


def get_plan_by_cache_key(session: Session, tenant_id: str, cache_key: str) -> Plan | None:
    return session.scalar(select(Plan).where(Plan.tenant_id == tenant_id, Plan.cache_key == cache_key))


def insert_plan(session: Session, tenant_id: str, plan: Plan, *, queue_job: bool = False) -> tuple[Plan, bool]:
    """Insert a plan (and, with ``queue_job``, its job); ``(plan, created)``, the existing one on a cache-key race."""
    plan.tenant_id = tenant_id
    try:
        with session.begin_nested():
            session.add(plan)
            session.flush()
            if queue_job:
                jobs_repo.add_job(session, tenant_id, plan.id, plan.created_at)
        return plan, True
    except IntegrityError:
        existing = get_plan_by_cache_key(session, tenant_id, plan.cache_key)
        if existing is None:
            raise
        return existing, False


def delete_plan(session: Session, tenant_id: str, plan_id: str) -> bool:
    result = session.execute(delete(Plan).where(Plan.tenant_id == tenant_id, Plan.id == plan_id))
    return result.rowcount == 1


def encode_cursor(created_at: datetime, plan_id: str) -> str:
    return base64.urlsafe_b64encode(json.dumps([created_at.isoformat(), plan_id]).encode()).decode().rstrip("=")


def decode_cursor(cursor: str) -> tuple[datetime, str]:
    """Raises ValueError on anything that is not a cursor this service issued."""
    padded = cursor + "=" * (-len(cursor) % 4)
    created_at, plan_id = json.loads(base64.urlsafe_b64decode(padded.encode()))
    return datetime.fromisoformat(created_at), str(plan_id)


def list_plans_for_model(
    session: Session,
    tenant_id: str,
    model_hash: str,
    *,
    limit: int,
    cursor: tuple[datetime, str] | None = None,
    inventory_hash: str | None = None,
    status: str | None = None,
) -> list[Plan]:
    """Newest first, keyset-paginated on ``(created_at, id)`` (index ix_plans_tenant_model_created)."""
    stmt = select(Plan).where(Plan.tenant_id == tenant_id, Plan.model_hash == model_hash)
    if inventory_hash:
        stmt = stmt.where(Plan.inventory_hash == inventory_hash)
    if status:
        stmt = stmt.where(Plan.status == status)
    if cursor is not None:
        created_at, plan_id = cursor
        stmt = stmt.where(or_(Plan.created_at < created_at, and_(Plan.created_at == created_at, Plan.id < plan_id)))
    stmt = stmt.order_by(Plan.created_at.desc(), Plan.id.desc()).limit(limit)
    return list(session.scalars(stmt))


def get_idempotency_key(session: Session, tenant_id: str, key: str) -> IdempotencyKey | None:
    return session.scalar(
        select(IdempotencyKey).where(IdempotencyKey.tenant_id == tenant_id, IdempotencyKey.key == key)
    )


def plan_location(plan_id: str) -> str:
    """The ``location`` an Idempotency-Key that answered with this plan stores (how a delete finds it)."""
    return f"/v1/plans/{plan_id}"


def delete_idempotency_key(session: Session, tenant_id: str, key: str, location: str | None) -> None:
    """Forget ``key`` if it still stores ``location`` (a concurrent request may have bound it anew)."""
    stored = IdempotencyKey.location.is_(None) if location is None else IdempotencyKey.location == location
    session.execute(
        delete(IdempotencyKey).where(IdempotencyKey.tenant_id == tenant_id, IdempotencyKey.key == key, stored)
    )


def delete_idempotency_keys_of_plan(session: Session, tenant_id: str, plan_id: str) -> None:
    """Forget the keys whose stored answer is this plan or one of its timelines.

    Run before the plan is deleted (its timelines go with it, by cascade), in the same
    transaction, so on both dialects a key outlives neither what it made nor the delete.
    """
    feedback_locations = select(literal("/v1/feedback/") + Feedback.id).where(
        Feedback.tenant_id == tenant_id, Feedback.plan_id == plan_id
    )
    session.execute(
        delete(IdempotencyKey).where(
            IdempotencyKey.tenant_id == tenant_id,
            or_(IdempotencyKey.location == plan_location(plan_id), IdempotencyKey.location.in_(feedback_locations)),
        )
    )
