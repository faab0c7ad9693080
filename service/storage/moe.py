"""Repository for MoE deployments and their history of placements. Every function takes the tenant.

A deployment row holds its shape (``config``), the placement a report starts from and the
version that set it (``placement_version``, the runtime's ETag), and the number of its
newest history row (``current_version``). Each load report, and each confirmation that a
runtime applied only part of an answer, adds one ``moe_placements`` row: the report and
the slots that changed (both compressed numpy arrays, :func:`pack_array`), its balance and
its status. Rows written before migration 0002 hold the whole placement as compressed
JSON instead (:mod:`service.storage.blobs`) and are read as before.
Functions only flush: the request dependency owns the transaction.
"""

from __future__ import annotations

import io
import zlib
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import numpy as np
from sqlalchemy import Select, select, update
from sqlalchemy.orm import Session

from service.storage.blobs import unpack_json
from service.storage.models import MoeDeployment, MoePlacement, new_id, utcnow

__all__ = [
    "Change",
    "DeploymentVersion",
    "pack_array",
    "unpack_array",
    "get_deployment",
    "lock_deployment",
    "get_placement",
    "get_change",
    "list_versions",
    "record_version",
    "set_status",
]


def pack_array(array: np.ndarray) -> bytes:
    """zlib (level 1: the online path) of the array in numpy's ``.npy`` format (shape and dtype kept)."""
    buffer = io.BytesIO()
    np.save(buffer, np.ascontiguousarray(array), allow_pickle=False)
    return zlib.compress(buffer.getvalue(), 1)


def unpack_array(blob: bytes) -> np.ndarray:
    array: np.ndarray = np.load(io.BytesIO(zlib.decompress(blob)), allow_pickle=False)
    return array


@dataclass(frozen=True)
class Change:
    """The slots a version wrote, in the order of its answer's migrations: ``new`` replaced ``old``."""

    layer: np.ndarray
    slot: np.ndarray
    old: np.ndarray
    new: np.ndarray

    def pack(self) -> bytes:
        return pack_array(np.stack([self.layer, self.slot, self.old, self.new]).astype(np.int32))

    @classmethod
    def unpack(cls, blob: bytes) -> Change:
        rows = unpack_array(blob).astype(np.int64)
        return cls(rows[0], rows[1], rows[2], rows[3])


@dataclass(frozen=True)
class DeploymentVersion:
    """One row of a deployment's history, without its (large) load and change."""

    version: int
    kept_current: bool
    slots_moved: int
    balance: dict[str, Any]
    status: str
    placement_version: int | None
    created_at: datetime


def _by_name(tenant_id: str, name: str) -> Select[MoeDeployment]:
    return select(MoeDeployment).where(MoeDeployment.tenant_id == tenant_id, MoeDeployment.name == name)


def get_deployment(session: Session, tenant_id: str, name: str) -> MoeDeployment | None:
    return session.scalar(_by_name(tenant_id, name))


def lock_deployment(session: Session, tenant_id: str, name: str) -> MoeDeployment | None:
    """The deployment, row-locked on PostgreSQL until the transaction ends (SQLite's writer lock already is one).

    Reports for one deployment take turns this way: each builds on the placement the
    previous one stored, and none is lost or refused.
    """
    return session.scalar(_by_name(tenant_id, name).with_for_update())


def get_placement(session: Session, tenant_id: str, deployment: MoeDeployment) -> np.ndarray | None:
    """The deployment's current placement (physical slot -> logical expert, per layer); None before any report."""
    if deployment.placement is not None:
        return unpack_array(deployment.placement).astype(np.int64)
    if deployment.current_version == 0:
        return None
    blob = session.scalar(  # a deployment last written before migration 0002
        select(MoePlacement.placement).where(
            MoePlacement.tenant_id == tenant_id,
            MoePlacement.deployment_id == deployment.id,
            MoePlacement.version == deployment.current_version,
        )
    )
    return None if blob is None else np.asarray(unpack_json(blob), dtype=np.int64)


def get_change(session: Session, tenant_id: str, deployment_id: str, version: int) -> tuple[Change | None, str] | None:
    """The change version ``version`` wrote and its status; None when there is no such version."""
    row = session.execute(
        select(MoePlacement.change, MoePlacement.status).where(
            MoePlacement.tenant_id == tenant_id,
            MoePlacement.deployment_id == deployment_id,
            MoePlacement.version == version,
        )
    ).first()
    if row is None:
        return None
    blob, status = row
    return (None if blob is None else Change.unpack(blob)), status


def set_status(session: Session, tenant_id: str, deployment_id: str, version: int, status: str) -> None:
    session.execute(
        update(MoePlacement)
        .where(
            MoePlacement.tenant_id == tenant_id,
            MoePlacement.deployment_id == deployment_id,
            MoePlacement.version == version,
        )
        .values(status=status)
    )


def list_versions(session: Session, tenant_id: str, deployment_id: str, limit: int) -> list[DeploymentVersion]:
    """The ``limit`` newest versions, newest first; their loads and changes stay in the database."""
    rows = session.execute(
        select(
            MoePlacement.version,
            MoePlacement.kept_current,
            MoePlacement.slots_moved,
            MoePlacement.balance,
            MoePlacement.status,
            MoePlacement.placement_version,
            MoePlacement.created_at,
        )
        .where(MoePlacement.tenant_id == tenant_id, MoePlacement.deployment_id == deployment_id)
        .order_by(MoePlacement.version.desc())
        .limit(limit)
    )
    # columns, not rows: the models' load listener that marks SQLite's times as UTC does not run
    return [
        DeploymentVersion(
            version,
            kept_current,
            slots_moved,
            balance,
            status,
            version if placement_version is None else placement_version,  # rows before 0002 set it themselves
            created_at if created_at.tzinfo else created_at.replace(tzinfo=UTC),
        )
        for version, kept_current, slots_moved, balance, status, placement_version, created_at in rows
    ]


def record_version(
    session: Session,
    tenant_id: str,
    name: str,
    deployment: MoeDeployment | None,
    *,
    config: dict[str, Any],
    kept_current: bool,
    balance: dict[str, Any],
    load: np.ndarray | None,
    change: Change,
    placement: np.ndarray | None,
    status: str = "answered",
) -> MoeDeployment:
    """Store a report (or a confirmation) and the change it made as the deployment's next version.

    ``deployment`` is what :func:`lock_deployment` found for ``name`` (None: a new one, at
    version 1). ``placement`` is the new placement when the change is not empty: it
    becomes the deployment's, and this version its ``placement_version``; an empty
    change leaves both. A new deployment racing another of the same name fails the
    flush on the unique key (tenant, name).
    """
    now = utcnow()
    if deployment is None:
        deployment = MoeDeployment(
            id=new_id(), tenant_id=tenant_id, name=name, current_version=0, placement_version=0, created_at=now
        )
        session.add(deployment)
    deployment.config = config
    deployment.current_version += 1
    deployment.updated_at = now
    if placement is not None:
        deployment.placement = pack_array(placement.astype(np.int32))
        deployment.placement_version = deployment.current_version
    session.add(
        MoePlacement(
            tenant_id=tenant_id,
            deployment_id=deployment.id,
            version=deployment.current_version,
            kept_current=kept_current,
            balance=balance,
            slots_moved=int(change.layer.size),
            load=pack_array(np.zeros(0) if load is None else load),
            change=change.pack(),
            status=status,
            placement_version=deployment.placement_version,
            created_at=now,
        )
    )
    session.flush()  # one round trip: the deployment's insert or update, then the version's insert
    return deployment
