"""How a repository inserts a row whose unique key a concurrent writer may take first.

``insert_or_fetch`` (service.storage.db) is what makes racing submissions of one
graph, inventory or calibration end as one row; here the "other writer" is a second
session that commits first, on the database under test (SQLite, then PostgreSQL).
"""

from __future__ import annotations

import uuid

import pytest
from sqlalchemy import select
from sqlalchemy.exc import IntegrityError

from service.storage.db import insert_or_fetch
from service.storage.feedback import get_calibration
from service.storage.models import Calibration, Tenant
from service.storage.tenants import get_or_create_tenant


@pytest.fixture
def tenant_id(session_factory) -> str:
    with session_factory() as session, session.begin():
        return get_or_create_tenant(session, f"rows-{uuid.uuid4().hex[:8]}").id


def _calibration(tenant_id: str, factors: dict) -> Calibration:
    return Calibration(tenant_id=tenant_id, inventory_hash="inventory-a", factors=factors, n_timelines=1)


def _other_writer_inserts(session_factory, tenant_id: str) -> None:
    with session_factory() as other, other.begin():
        other.add(_calibration(tenant_id, {"compute": 1.5}))


def test_a_row_another_writer_inserted_first_is_fetched_instead(session_factory, tenant_id):
    _other_writer_inserts(session_factory, tenant_id)
    with session_factory() as session, session.begin():
        row = insert_or_fetch(
            session,
            _calibration(tenant_id, {"compute": 9.0}),
            lambda: get_calibration(session, tenant_id, "inventory-a"),
        )
        assert row.factors == {"compute": 1.5}


def test_losing_the_insert_leaves_the_rest_of_the_transaction_usable(session_factory, tenant_id):
    _other_writer_inserts(session_factory, tenant_id)
    with session_factory() as session, session.begin():
        session.get(Tenant, tenant_id).name = f"renamed-{tenant_id[:8]}"
        insert_or_fetch(
            session,
            _calibration(tenant_id, {"compute": 9.0}),
            lambda: get_calibration(session, tenant_id, "inventory-a"),
        )
        session.add(Calibration(tenant_id=tenant_id, inventory_hash="inventory-b", factors={}, n_timelines=0))
    with session_factory() as session:
        assert session.get(Tenant, tenant_id).name == f"renamed-{tenant_id[:8]}"
        hashes = session.scalars(select(Calibration.inventory_hash).where(Calibration.tenant_id == tenant_id))
        assert sorted(hashes) == ["inventory-a", "inventory-b"]


def test_a_conflict_the_fetch_does_not_explain_is_raised(session_factory, tenant_id):
    _other_writer_inserts(session_factory, tenant_id)
    with session_factory() as session, session.begin(), pytest.raises(IntegrityError):
        insert_or_fetch(session, _calibration(tenant_id, {"compute": 9.0}), lambda: None)
