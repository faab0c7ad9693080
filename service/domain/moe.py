"""MoE rebalancing use case: one pure call, plus the deployment's memory when named.

The partitioner does the work in numpy; this module resolves the deployment's
stored configuration and current placement, checks the runtime's placement version,
and records the report and the change it made as a new version (history) through
:mod:`service.storage.moe`, in the request's transaction (it never commits).

The protocol a runtime follows (docs/moe.md): each answer carries the placement
version it leads to (its ETag); ``apply: false`` previews without recording; the
runtime confirms what it applied (:func:`confirm_applied`), all of it or the
migrations it completed, and a partial confirmation records the placement really
deployed, which the next report starts from. A report or confirmation naming another
version than the deployment's current one is a 409 that names the current one.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Collection

import numpy as np
from sqlalchemy.orm import Session

from partitioners.moe.rebalance import RebalanceResult, eplb_maps, rebalance
from service.errors import Conflict, NotFound, PayloadTooLarge, UnprocessableInput
from service.schemas.moe import MoeAppliedRequest, MoeRebalanceRequest
from service.settings import Settings
from service.storage import moe as moe_repo
from service.storage.models import MoeDeployment

__all__ = ["INCLUDE_OPTIONS", "rebalance_request", "confirm_applied", "deployment_read", "etag_of"]

# What ?include= may add to an answer: the three maps (ragged lists), the per-layer figures,
# and the maps as vLLM's / SGLang's EPLB state holds them (padded tensors, ``*_map`` names).
INCLUDE_OPTIONS = ("placement", "layers", "eplb")

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


def etag_of(placement_version: int | None, placement: np.ndarray | None = None) -> str:
    """A deployment's placement version as an ETag; without one, a hash of the placement itself."""
    if placement_version is not None:
        return f"v{placement_version}"
    digest = hashlib.blake2b(np.ascontiguousarray(placement, dtype=np.int32).tobytes(), digest_size=8)
    return f"h{digest.hexdigest()}"


def _stale(name: str, given: int, current: int) -> Conflict:
    return Conflict(
        f"placement_version {given} is not deployment {name!r}'s current placement; the current one is "
        f"version {current} (GET /v1/moe/deployments/{name} returns it)."
    )


def rebalance_request(
    session: Session,
    tenant_id: str,
    request: MoeRebalanceRequest,
    settings: Settings,
    include: Collection[str] = (),
) -> dict:
    # Reports for one deployment take turns (row lock on PostgreSQL; SQLite's BEGIN IMMEDIATE
    # already serialises): each builds on the placement the previous one stored, none is a 409
    # unless it names a placement version that is no longer current.
    deployment = moe_repo.lock_deployment(session, tenant_id, request.deployment) if request.deployment else None
    if request.placement_version is not None and request.deployment:
        current_version = deployment.placement_version if deployment is not None else 0
        if request.placement_version != current_version:
            raise _stale(request.deployment, request.placement_version, current_version)
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
    based_on = None
    if request.current_placement is not None:
        current = request.current_placement.physical_to_logical
    elif deployment is not None and _same_shape(deployment.config, model, cluster):
        # a changed model or cluster shape (more GPUs, other slot count) starts from a fresh plan
        current = moe_repo.get_placement(session, tenant_id, deployment)
        based_on = deployment.placement_version if current is not None else None
    min_improvement = settings.moe_min_improvement if request.min_improvement is None else request.min_improvement
    balance_target = settings.moe_balance_target if request.balance_target is None else request.balance_target
    move_budget = request.move_budget
    if move_budget is None:
        move_budget = int(settings.moe_move_budget_fraction * slots)
    repair_budget = request.repair_budget
    if repair_budget is None:
        repair_budget = int(settings.moe_repair_budget_fraction * slots)

    try:
        load = np.asarray(request.load, dtype=np.float64)
    except ValueError:
        load = request.load  # ragged rows: the rebalancer names what is wrong (422)
    started = time.perf_counter()
    result = rebalance(
        load,
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
        balance_target=balance_target,
        move_budget=move_budget,
        repair_budget=repair_budget,
    )
    compute_ms = (time.perf_counter() - started) * 1000
    response = result.as_dict(placement="placement" in include, layers="layers" in include, eplb="eplb" in include)
    response["slots_moved_fraction"] = result.slots_moved_fraction
    response["compute_ms"] = round(compute_ms, 3)
    response["budget"] = {
        "bound": result.bound_by,
        "balance_target": balance_target,
        "move_budget": move_budget,
        "repair_budget": repair_budget if result.repaired_layers else None,
        "max_replicas_moved": request.max_replicas_moved,
        "copies_written": result.migrations.count,
        "bytes_written": result.migrations.total_bytes,
        "lost_experts": result.lost_experts,
    }
    response["based_on_version"] = based_on
    response["applied"] = False
    placement_version = None
    if request.deployment:
        placement_version = deployment.placement_version if deployment is not None else 0
        if request.apply:
            deployment = _record(
                session, tenant_id, request.deployment, deployment, model, cluster, np.asarray(load), result
            )
            placement_version = deployment.placement_version
            response["version"] = deployment.current_version
            response["applied"] = True
        response["deployment"] = request.deployment
    response["placement_version"] = placement_version
    response["placement_etag"] = (
        etag_of(placement_version)
        if request.deployment and request.apply
        else etag_of(None, result.physical_to_logical)
    )
    return response


def _record(
    session: Session,
    tenant_id: str,
    name: str,
    deployment: MoeDeployment | None,
    model: dict,
    cluster: dict,
    load: np.ndarray,
    result: RebalanceResult,
) -> MoeDeployment:
    """The report and its change as the deployment's next version (the placement only when it changed)."""
    before = result.balance_before
    m = result.migrations
    changed = deployment is None or deployment.placement is None or m.count > 0
    if not changed:
        # an unavailable GPU's slots empty without a write: the stored placement must follow
        stored = moe_repo.get_placement(session, tenant_id, deployment)
        changed = stored is None or not np.array_equal(stored, result.physical_to_logical)
    return moe_repo.record_version(
        session,
        tenant_id,
        name,
        deployment,
        config={"model": model, "cluster": cluster},
        kept_current=bool(result.kept_current),
        balance={
            "before": None if before is None else {"mean": _finite(before.mean), "worst": _finite(before.worst)},
            "after": {"mean": result.balance_after.mean, "worst": result.balance_after.worst},
        },
        load=load,
        change=moe_repo.Change(m.layer, m.slot, m.replaced_expert, m.logical_expert),
        placement=result.physical_to_logical if changed else None,
    )


def _finite(value: float) -> float | None:
    return value if np.isfinite(value) else None


def confirm_applied(session: Session, tenant_id: str, name: str, request: MoeAppliedRequest) -> dict:
    """Record what the runtime applied of the answer that set ``request.placement_version``.

    All of it: the version is marked applied. Part of it: the slots of the migrations not
    completed go back to the expert they held, and that placement is recorded as a new
    version (status ``confirmed``), which the next report starts from.
    """
    deployment = moe_repo.lock_deployment(session, tenant_id, name)
    if deployment is None:
        raise NotFound(f"No MoE deployment named {name!r}.")
    if request.placement_version != deployment.placement_version:
        raise _stale(name, request.placement_version, deployment.placement_version)
    found = moe_repo.get_change(session, tenant_id, deployment.id, request.placement_version)
    change = None if found is None else found[0]
    if change is None:  # a version written before migration 0002 keeps no change to undo
        raise UnprocessableInput(
            f"version {request.placement_version} of deployment {name!r} records no migrations to confirm."
        )
    total = int(change.layer.size)
    if request.migrations_completed is None or len(set(request.migrations_completed)) == total:
        if request.migrations_completed is not None and max(request.migrations_completed, default=-1) >= total:
            raise _bad_index(name, request.placement_version, total)
        moe_repo.set_status(session, tenant_id, deployment.id, request.placement_version, "applied")
        return _applied(name, deployment.placement_version, "applied", total, 0)
    done = np.asarray(request.migrations_completed, dtype=np.int64)
    if done.size and done.max() >= total:
        raise _bad_index(name, request.placement_version, total)
    undo = np.ones(total, dtype=bool)
    undo[done] = False
    placement = moe_repo.get_placement(session, tenant_id, deployment)
    assert placement is not None  # a deployment with a recorded change has a placement
    placement = placement.copy()
    placement[change.layer[undo], change.slot[undo]] = change.old[undo]
    moe_repo.set_status(session, tenant_id, deployment.id, request.placement_version, "partially applied")
    deployment = moe_repo.record_version(
        session,
        tenant_id,
        name,
        deployment,
        config=deployment.config,
        kept_current=False,
        balance={"before": None, "after": None},
        load=None,
        change=moe_repo.Change(change.layer[undo], change.slot[undo], change.new[undo], change.old[undo]),
        placement=placement,
        status="confirmed",
    )
    return _applied(name, deployment.placement_version, "partially applied", int(total - undo.sum()), int(undo.sum()))


def _bad_index(name: str, version: int, total: int) -> UnprocessableInput:
    return UnprocessableInput(
        f"migrations_completed names a migration that version {version} of deployment {name!r} does not have"
        f" (it has {total}: indices 0..{total - 1})."
    )


def _applied(name: str, version: int, status: str, applied: int, reverted: int) -> dict:
    return {
        "deployment": name,
        "placement_version": version,
        "placement_etag": etag_of(version),
        "status": status,
        "migrations_applied": applied,
        "migrations_reverted": reverted,
    }


def deployment_read(session: Session, tenant_id: str, name: str, history_limit: int) -> dict:
    deployment = moe_repo.get_deployment(session, tenant_id, name)
    if deployment is None:
        raise NotFound(f"No MoE deployment named {name!r}.")
    versions = moe_repo.list_versions(session, tenant_id, deployment.id, history_limit)
    current = moe_repo.get_placement(session, tenant_id, deployment)
    maps: dict = {"physical_to_logical": None, "logical_to_physical": None, "logical_count": None}
    if current is not None:
        logical_to_physical, counts = eplb_maps(current, int(deployment.config["model"]["num_logical_experts"]))
        maps = {
            "physical_to_logical": current.tolist(),
            "logical_to_physical": logical_to_physical,
            "logical_count": counts.tolist(),
        }
    return {
        "name": deployment.name,
        "config": deployment.config,
        "current_version": deployment.current_version,
        "placement_version": deployment.placement_version,
        **maps,
        "history": [
            {
                "version": v.version,
                "kept_current": v.kept_current,
                "slots_moved": v.slots_moved,
                "balance": v.balance if v.balance.get("after") is not None else None,
                "status": v.status,
                "placement_version": v.placement_version,
                "created_at": v.created_at,
            }
            for v in versions
        ],
    }
