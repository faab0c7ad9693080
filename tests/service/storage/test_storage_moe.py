"""The MoE deployment repository (service.storage.moe): versions in order, scoped to the tenant.

Run against the database under test (SQLite, then PostgreSQL); each test uses fresh tenants.
"""

from __future__ import annotations

import uuid
from datetime import timedelta

import numpy as np
import pytest
from sqlalchemy.exc import IntegrityError

from service.storage import moe as moe_repo
from service.storage.tenants import get_or_create_tenant

CONFIG = {
    "model": {"num_moe_layers": 1, "num_logical_experts": 2},
    "cluster": {"num_nodes": 1, "gpus_per_node": 2, "slots_per_gpu": 1},
}
BALANCE = {"before": None, "after": {"mean": 1.0, "worst": 1.0}}


def _tenant(session_factory) -> str:
    with session_factory() as session, session.begin():
        return get_or_create_tenant(session, f"moe-repo-{uuid.uuid4().hex[:8]}").id


@pytest.fixture
def tenant_id(session_factory) -> str:
    return _tenant(session_factory)


def _change(moved: int) -> moe_repo.Change:
    slots = np.arange(moved)
    return moe_repo.Change(np.zeros(moved, dtype=np.int64), slots, slots, slots[::-1])


def _report(session, tenant_id: str, name: str, placement, *, slots_moved: int = 0):
    found = moe_repo.lock_deployment(session, tenant_id, name)
    return moe_repo.record_version(
        session,
        tenant_id,
        name,
        found,
        config=CONFIG,
        kept_current=False,
        balance=BALANCE,
        load=np.array([[1.0, 2.0]]),
        change=_change(slots_moved),
        placement=None if placement is None else np.asarray(placement),
    )


def test_each_report_is_the_next_version_and_the_newest_placement_is_current(session_factory, tenant_id):
    with session_factory() as session, session.begin():
        first = _report(session, tenant_id, "serve", [[0, 1]])
        assert first.current_version == 1 and first.placement_version == 1 and first.config == CONFIG
    with session_factory() as session, session.begin():
        second = _report(session, tenant_id, "serve", [[1, 0]], slots_moved=2)
        assert second.id == first.id and second.current_version == 2 and second.placement_version == 2
    with session_factory() as session:
        deployment = moe_repo.get_deployment(session, tenant_id, "serve")
        assert deployment.current_version == 2
        assert moe_repo.get_placement(session, tenant_id, deployment).tolist() == [[1, 0]]
        change, status = moe_repo.get_change(session, tenant_id, deployment.id, 2)
        assert (change.slot.tolist(), change.old.tolist(), change.new.tolist(), status) == (
            [0, 1],
            [0, 1],
            [1, 0],
            "answered",
        )
        assert moe_repo.get_change(session, tenant_id, deployment.id, 3) is None
        versions = moe_repo.list_versions(session, tenant_id, deployment.id, limit=10)
        assert [(v.version, v.slots_moved, v.balance) for v in versions] == [(2, 2, BALANCE), (1, 0, BALANCE)]
        assert [v.version for v in moe_repo.list_versions(session, tenant_id, deployment.id, limit=1)] == [2]
        assert all(v.created_at.utcoffset() == timedelta(0) for v in versions)  # UTC on both dialects


def test_a_report_that_keeps_the_placement_leaves_its_version(session_factory, tenant_id):
    with session_factory() as session, session.begin():
        _report(session, tenant_id, "steady", [[0, 1]])
    with session_factory() as session, session.begin():
        kept = _report(session, tenant_id, "steady", None)
        assert (kept.current_version, kept.placement_version) == (2, 1)
        assert moe_repo.get_placement(session, tenant_id, kept).tolist() == [[0, 1]]
        assert [v.placement_version for v in moe_repo.list_versions(session, tenant_id, kept.id, limit=5)] == [1, 1]


def test_a_placement_round_trips_through_its_compressed_array():
    placement = np.arange(-1, 2047).reshape(8, 256)
    assert (moe_repo.unpack_array(moe_repo.pack_array(placement)) == placement).all()


def test_another_tenant_finds_neither_the_deployment_nor_its_versions(session_factory, tenant_id):
    other = _tenant(session_factory)
    with session_factory() as session, session.begin():
        deployment_id = _report(session, tenant_id, "private", [[0, 1]]).id
    with session_factory() as session:
        assert moe_repo.get_deployment(session, other, "private") is None
        assert moe_repo.lock_deployment(session, other, "private") is None
        assert moe_repo.get_change(session, other, deployment_id, 1) is None
        assert moe_repo.list_versions(session, other, deployment_id, limit=10) == []
    with session_factory() as session, session.begin():  # the same name is the other tenant's own deployment
        assert _report(session, other, "private", [[1, 0]]).current_version == 1


def test_two_new_deployments_of_one_name_conflict_on_the_unique_key(session_factory, tenant_id):
    with session_factory() as session, session.begin():
        _report(session, tenant_id, "raced", [[0, 1]])
    with session_factory() as session, session.begin():
        with pytest.raises(IntegrityError):  # a writer that did not see the first one's row
            moe_repo.record_version(
                session,
                tenant_id,
                "raced",
                None,
                config=CONFIG,
                kept_current=False,
                balance=BALANCE,
                load=np.array([[1.0, 2.0]]),
                change=_change(0),
                placement=np.array([[0, 1]]),
            )
        session.rollback()
