"""Read-side renderings of a stored plan: the JSON document, ETag, trace, HTML view."""

from __future__ import annotations

import hashlib
import json
from importlib import resources

from sqlalchemy.orm import Session

from service.domain.calibration import split_stored_options
from service.errors import Conflict, NotFound
from service.storage import plans as plans_repo
from service.storage.blobs import unpack_json
from service.storage.models import Graph, Plan

__all__ = ["plan_read", "etag", "graph_read", "finished_plan", "chrome_trace", "html_view", "inline_json", "plan_body"]


def etag(plan: Plan, representation: str | None = None, *, cached: bool = False) -> str:
    """A strong entity tag for one representation of the plan.

    It names the plan's state (id, status, last update) *and* the representation:
    ``representation`` is whatever shapes the body besides the plan (the ``detail``
    level of ``GET /v1/plans/{id}``, or another rendering such as a re-plan's answer)
    and ``cached`` is the body's ``cached`` flag. Two bodies that differ must never
    share a tag, or a cache revalidating one with the other's tag is told 304 and
    serves the wrong body (RFC 9110 8.8.3). A caller that names no representation
    gets a tag no named one shares: a missed match costs a 200, a false one a wrong
    body. Computed from columns only, so a 304 never loads the stored result.
    """
    updated = plan.updated_at.isoformat() if plan.updated_at else ""
    shape = "(unnamed)" if representation is None else f"representation={representation}"
    stamp = f"{plan.id}:{plan.status}:{updated}:{shape}:{'cached' if cached else 'fresh'}"
    return '"' + hashlib.sha256(stamp.encode()).hexdigest()[:32] + '"'


def plan_body(plan: Plan) -> dict:
    return unpack_json(plan.result) if plan.result else {}


def plan_read(plan: Plan, *, cached: bool, detail: str = "full", body: dict | None = None) -> dict:
    """The plan as the API returns it (DESIGN.md "Plan"), JSON-ready.

    ``body`` is the plan's result document when the caller has it in memory (it just
    computed the plan); otherwise a finished plan's is decompressed from storage.
    """
    document = {
        "id": plan.id,
        "model_hash": plan.model_hash,
        "inventory_hash": plan.inventory_hash,
        "status": plan.status,
        "progress": plan.progress,
        "error": plan.error,
        "cached": cached,
        "parent_id": plan.parent_id,
        "created_at": plan.created_at.isoformat(),
        "finished_at": plan.finished_at.isoformat() if plan.finished_at else None,
        "options": split_stored_options(plan.options)[0],
        "strategy": plan.strategy,
        "summary": plan.summary,
        "links": {
            "self": f"/v1/plans/{plan.id}",
            "trace": f"/v1/plans/{plan.id}/trace",
            "view": f"/v1/plans/{plan.id}/view",
            "model": f"/v1/models/{plan.model_hash}",
        },
    }
    if body is None:
        body = plan_body(plan) if plan.status == "done" else {}
    document["candidates"] = body.get("candidates")
    document["warnings"] = body.get("warnings", [])
    document["notes"] = body.get("notes", [])
    if detail == "full":
        document["ops"] = body.get("ops")
        document["tensors"] = body.get("tensors")
        document["transfers"] = body.get("transfers")
        if body.get("fusion_groups") is not None:
            document["fusion_groups"] = body["fusion_groups"]
        # plans stored before the schedule was part of the document have none: null
        document["schedule"] = body.get("schedule")
    return document


def graph_read(row: Graph) -> dict:
    return {
        "id": row.id,
        "model_hash": row.model_hash,
        "name": row.name,
        "source_format": row.source_format,
        "n_ops": row.n_ops,
        "n_tensors": row.n_tensors,
        "total_flops": row.total_flops,
        "parameter_bytes": row.parameter_bytes,
        "activation_bytes": row.activation_bytes,
        "warnings": row.warnings,
        "created_at": row.created_at.isoformat(),
    }


def finished_plan(session: Session, tenant_id: str, plan_id: str) -> Plan:
    plan = plans_repo.get_plan(session, tenant_id, plan_id)
    if plan is None:
        raise NotFound(f"No plan with id {plan_id}.")
    if plan.status != "done":
        raise Conflict(f"Plan {plan_id} is {plan.status}; its timeline exists once it is done.")
    return plan


def chrome_trace(session: Session, plan: Plan) -> dict:
    trace = plan_body(plan).get("trace")
    if trace is None:
        raise Conflict("This plan is too large to keep a full timeline; its summary and assignment are available.")
    return trace


def html_view(session: Session, plan: Plan) -> str:
    body = plan_body(plan)
    view = body.get("view")
    if view is None:
        raise Conflict("This plan is too large to keep a full timeline; its summary and assignment are available.")
    data = {
        **view,
        "summary": plan.summary,
        "strategy": plan.strategy,
        "model_hash": plan.model_hash,
        "inventory_hash": plan.inventory_hash,
        "candidates": body.get("candidates", []),
        "notes": body.get("notes", []),
        "warnings": body.get("warnings", []),
    }
    template = resources.files("service.api").joinpath("static/plan_view.html").read_text()
    return template.replace("__PLAN_ID__", plan.id).replace("__PLAN_DATA__", inline_json(data))


def inline_json(data: object) -> str:
    """JSON safe to place inside a ``<script>`` element: no ``<``, ``>`` or ``&`` in it.

    A name holding ``</script>`` would end the element, and one holding ``<!--<script>``
    would keep the real end tag from closing it; escaped as ``\\u003c`` and so on they
    are the same JSON strings (Django's ``json_script`` does the same).
    """
    text = json.dumps(data, separators=(",", ":"))
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
