"""Repository for MoE deployments and their history of placements. Every function takes the tenant.

A deployment row holds its shape (``config``) and the number of its current version;
each load report adds one ``moe_placements`` row: the report, the placement answered
to it (both zlib-compressed JSON, :mod:`service.storage.blobs`) and its balance.
Functions only flush: the request dependency owns the transaction.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import Select, select
from sqlalchemy.orm import Session

from service.storage.blobs import pack_json, unpack_json
from service.storage.models import MoeDeployment, MoePlacement, new_id, utcnow

__all__ = [
    "DeploymentVersion",
    "get_deployment",
    "lock_deployment",
    "get_placement",
    "list_versions",
    "record_version",
]


@dataclass(frozen=True)
class DeploymentVersion:
    """One report in a deployment's history, without its (large) load and placement."""

    version: int
    kept_current: bool
    slots_moved: int
    balance: dict[str, Any]
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


def get_placement(session: Session, tenant_id: str, deployment_id: str, version: int) -> list[list[int]] | None:
    """The placement (physical slot -> logical expert, per layer) stored as ``version``; None if there is none."""
    blob = session.scalar(
        select(MoePlacement.placement).where(
            MoePlacement.tenant_id == tenant_id,
            MoePlacement.deployment_id == deployment_id,
            MoePlacement.version == version,
        )
    )
    return None if blob is None else unpack_json(blob)


def list_versions(session: Session, tenant_id: str, deployment_id: str, limit: int) -> list[DeploymentVersion]:
    """The ``limit`` newest versions, newest first; their loads and placements stay in the database."""
    rows = session.execute(
        select(
            MoePlacement.version,
            MoePlacement.kept_current,
            MoePlacement.slots_moved,
            MoePlacement.balance,
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
            created_at if created_at.tzinfo else created_at.replace(tzinfo=UTC),
        )
        for version, kept_current, slots_moved, balance, created_at in rows
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
    slots_moved: int,
    load: list[list[float]],
    placement: list[list[int]],
) -> MoeDeployment:
    """Store a report and its answer as the deployment's next version (creating the deployment at version 1).

    ``deployment`` is what :func:`lock_deployment` found for ``name`` (None: a new one).
    Load and placement are compressed at level 1: this is the online path, speed over ratio.
    A new deployment racing another of the same name fails the flush on the unique key
    (tenant, name).
    """
    now = utcnow()
    if deployment is None:
        deployment = MoeDeployment(id=new_id(), tenant_id=tenant_id, name=name, current_version=0, created_at=now)
        session.add(deployment)
    deployment.config = config
    deployment.current_version += 1
    deployment.updated_at = now
    session.add(
        MoePlacement(
            tenant_id=tenant_id,
            deployment_id=deployment.id,
            version=deployment.current_version,
            kept_current=kept_current,
            balance=balance,
            slots_moved=slots_moved,
            load=pack_json(load, level=1),
            placement=pack_json(placement, level=1),
            created_at=now,
        )
    )
    session.flush()  # one round trip: the deployment's insert or update, then the version's insert
    return deployment
