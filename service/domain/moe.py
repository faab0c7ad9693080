"""MoE rebalancing use case: one pure call, plus the deployment's memory when named.

The partitioner does the work in numpy; this module resolves the deployment's
stored configuration and current placement, and records the report and the
answer as a new version (history) in the same transaction.
"""

from __future__ import annotations

import time

import numpy as np
from sqlalchemy import select
from sqlalchemy.orm import Session

from partitioners.moe.rebalance import rebalance
from service.errors import NotFound, PayloadTooLarge, UnprocessableInput
from service.schemas.moe import MoeRebalanceRequest
from service.settings import Settings
from service.storage.blobs import pack_json, unpack_json
from service.storage.models import MoeDeployment, MoePlacement, utcnow

__all__ = ["rebalance_request", "deployment_read"]


def _deployment(session: Session, tenant_id: str, name: str, *, for_update: bool = False) -> MoeDeployment | None:
    stmt = select(MoeDeployment).where(MoeDeployment.tenant_id == tenant_id, MoeDeployment.name == name)
    return session.scalar(stmt.with_for_update() if for_update else stmt)


def _current_placement(session: Session, deployment: MoeDeployment) -> np.ndarray | None:
    if deployment.current_version == 0:
        return None
    row = session.scalar(
        select(MoePlacement).where(MoePlacement.deployment_id == deployment.id, MoePlacement.version == deployment.current_version)
    )
    return None if row is None else np.asarray(unpack_json(row.placement), dtype=np.int64)


_SHAPE_FIELDS = {"model": ("num_moe_layers", "num_logical_experts"), "cluster": ("num_nodes", "gpus_per_node", "slots_per_gpu")}


def _same_shape(config: dict, model: dict, cluster: dict) -> bool:
    """Whether the stored placement fits the reported shape (failed GPUs may differ)."""
    new = {"model": model, "cluster": cluster}
    return all(config.get(part, {}).get(name) == new[part].get(name) for part, names in _SHAPE_FIELDS.items() for name in names)


def rebalance_request(session: Session, tenant_id: str, request: MoeRebalanceRequest, settings: Settings) -> dict:
    # Reports for one deployment take turns (row lock on PostgreSQL; SQLite's BEGIN IMMEDIATE
    # already serialises): each builds on the placement the previous one stored, none is a 409.
    deployment = _deployment(session, tenant_id, request.deployment, for_update=True) if request.deployment else None
    model = request.model.model_dump() if request.model else (deployment.config.get("model") if deployment else None)
    cluster = request.cluster.model_dump() if request.cluster else (deployment.config.get("cluster") if deployment else None)
    if model is None or cluster is None:
        missing = "model" if model is None else "cluster"
        raise UnprocessableInput(f"'{missing}' is required unless a known 'deployment' remembers it.")
    slots = int(model["num_moe_layers"]) * cluster["num_nodes"] * cluster["gpus_per_node"] * cluster["slots_per_gpu"]
    if slots > settings.moe_max_slots:
        raise PayloadTooLarge(
            f"num_moe_layers x num_nodes x gpus_per_node x slots_per_gpu = {slots} physical slots; this service "
            f"answers at most {settings.moe_max_slots} (HYPERPLACE_MOE_MAX_SLOTS)."
        )
    current = None
    if request.current_placement is not None:
        current = request.current_placement.physical_to_logical
    elif deployment is not None and _same_shape(deployment.config, model, cluster):
        # a changed model or cluster shape (more GPUs, other slot count) starts from a fresh plan
        current = _current_placement(session, deployment)
    min_improvement = settings.moe_min_improvement if request.min_improvement is None else request.min_improvement

    started = time.perf_counter()
    result = rebalance(
        request.load,
        num_nodes=cluster["num_nodes"],
        gpus_per_node=cluster["gpus_per_node"],
        slots_per_gpu=cluster["slots_per_gpu"],
        current_physical_to_logical=current,
        unavailable_gpus=tuple(cluster.get("unavailable_gpus", ())),
        max_replicas_moved=request.max_replicas_moved,
        expert_bytes=model.get("expert_bytes", 0),
        min_improvement=min_improvement,
        node_local=request.node_local,
        num_expert_groups=model.get("num_expert_groups"),
        num_moe_layers=model["num_moe_layers"],
        num_logical_experts=model["num_logical_experts"],
    )
    compute_ms = (time.perf_counter() - started) * 1000
    response = result.as_dict()
    response["slots_moved_fraction"] = result.slots_moved_fraction
    response["compute_ms"] = round(compute_ms, 3)

    if request.deployment:
        now = utcnow()
        if deployment is None:
            deployment = MoeDeployment(tenant_id=tenant_id, name=request.deployment, config={}, current_version=0, created_at=now)
            session.add(deployment)
        deployment.config = {"model": model, "cluster": cluster}
        deployment.current_version += 1
        deployment.updated_at = now
        session.flush()
        session.add(
            MoePlacement(
                tenant_id=tenant_id,
                deployment_id=deployment.id,
                version=deployment.current_version,
                kept_current=bool(result.kept_current),
                balance={"before": response["balance_before"] and {k: response["balance_before"][k] for k in ("mean", "worst")},
                         "after": {k: response["balance_after"][k] for k in ("mean", "worst")}},
                slots_moved=result.migrations.count,
                load=pack_json(request.load, level=1),  # the online path: speed over ratio
                placement=pack_json(response["physical_to_logical"], level=1),
                created_at=now,
            )
        )
        session.flush()
        response["deployment"] = deployment.name
        response["version"] = deployment.current_version
    return response


def deployment_read(session: Session, tenant_id: str, name: str, history_limit: int) -> dict:
    deployment = _deployment(session, tenant_id, name)
    if deployment is None:
        raise NotFound(f"No MoE deployment named {name!r}.")
    rows = list(
        session.scalars(
            select(MoePlacement)
            .where(MoePlacement.deployment_id == deployment.id)
            .order_by(MoePlacement.version.desc())
            .limit(history_limit)
        )
    )
    current = next((row for row in rows if row.version == deployment.current_version), None)
    if current is None and deployment.current_version:
        placement = _current_placement(session, deployment)
        current_placement = placement.tolist() if placement is not None else None
    else:
        current_placement = unpack_json(current.placement) if current else None
    return {
        "name": deployment.name,
        "config": deployment.config,
        "current_version": deployment.current_version,
        "physical_to_logical": current_placement,
        "history": [
            {"version": r.version, "kept_current": r.kept_current, "slots_moved": r.slots_moved, "balance": r.balance, "created_at": r.created_at}
            for r in rows
        ],
    }
