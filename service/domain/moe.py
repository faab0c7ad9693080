"""MoE rebalancing use case: one pure call, plus the deployment's memory when named.

The partitioner does the work in numpy; this module resolves the deployment's
stored configuration and current placement, and records the report and the
answer as a new version (history) through :mod:`service.storage.moe`, in the
request's transaction (it never commits).
"""

from __future__ import annotations

import time

import numpy as np
from sqlalchemy.orm import Session

from partitioners.moe.rebalance import rebalance
from service.errors import NotFound, PayloadTooLarge, UnprocessableInput
from service.schemas.moe import MoeRebalanceRequest
from service.settings import Settings
from service.storage import moe as moe_repo
from service.storage.models import MoeDeployment

__all__ = ["rebalance_request", "deployment_read"]


def _current_placement(session: Session, tenant_id: str, deployment: MoeDeployment) -> np.ndarray | None:
    if deployment.current_version == 0:
        return None
    placement = moe_repo.get_placement(session, tenant_id, deployment.id, deployment.current_version)
    return None if placement is None else np.asarray(placement, dtype=np.int64)


_SHAPE_FIELDS = {
    "model": ("num_moe_layers", "num_logical_experts"),
    "cluster": ("num_nodes", "gpus_per_node", "slots_per_gpu"),
}


def _same_shape(config: dict, model: dict, cluster: dict) -> bool:
    """Whether the stored placement fits the reported shape (failed GPUs may differ)."""
    new = {"model": model, "cluster": cluster}
    return all(
        config.get(part, {}).get(name) == new[part].get(name) for part, names in _SHAPE_FIELDS.items() for name in names
    )


def rebalance_request(session: Session, tenant_id: str, request: MoeRebalanceRequest, settings: Settings) -> dict:
    # Reports for one deployment take turns (row lock on PostgreSQL; SQLite's BEGIN IMMEDIATE
    # already serialises): each builds on the placement the previous one stored, none is a 409.
    deployment = moe_repo.lock_deployment(session, tenant_id, request.deployment) if request.deployment else None
    model = request.model.model_dump() if request.model else (deployment.config.get("model") if deployment else None)
    cluster = (
        request.cluster.model_dump() if request.cluster else (deployment.config.get("cluster") if deployment else None)
    )
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
        current = _current_placement(session, tenant_id, deployment)
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
        before = response["balance_before"]
        deployment = moe_repo.record_version(
            session,
            tenant_id,
            request.deployment,
            deployment,
            config={"model": model, "cluster": cluster},
            kept_current=bool(result.kept_current),
            balance={
                "before": before and {k: before[k] for k in ("mean", "worst")},
                "after": {k: response["balance_after"][k] for k in ("mean", "worst")},
            },
            slots_moved=result.migrations.count,
            load=request.load,
            placement=response["physical_to_logical"],
        )
        response["deployment"] = deployment.name
        response["version"] = deployment.current_version
    return response


def deployment_read(session: Session, tenant_id: str, name: str, history_limit: int) -> dict:
    deployment = moe_repo.get_deployment(session, tenant_id, name)
    if deployment is None:
        raise NotFound(f"No MoE deployment named {name!r}.")
    versions = moe_repo.list_versions(session, tenant_id, deployment.id, history_limit)
    current = (
        moe_repo.get_placement(session, tenant_id, deployment.id, deployment.current_version)
        if deployment.current_version
        else None
    )
    return {
        "name": deployment.name,
        "config": deployment.config,
        "current_version": deployment.current_version,
        "physical_to_logical": current,
        "history": [
            {
                "version": v.version,
                "kept_current": v.kept_current,
                "slots_moved": v.slots_moved,
                "balance": v.balance,
                "created_at": v.created_at,
            }
            for v in versions
        ],
    }
