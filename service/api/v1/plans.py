"""Plans: submit (JSON or multipart ONNX), read, list by model, delete, trace, view.

Handlers parse the transport (content type, form parts, headers) and hand the
rest to ``service.domain.planning``; CPU work runs in the threadpool so the event
loop keeps answering, in one hop per request: a JSON submission is parsed, planned
and rendered by one call there (:func:`_submit`).
"""

from __future__ import annotations

import dataclasses
import json
from typing import Annotated, Literal

from fastapi import APIRouter, Query, Request, Response
from fastapi.concurrency import run_in_threadpool
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse
from pydantic import ValidationError
from starlette.datastructures import UploadFile

from service.api.deps import SessionDep, SettingsDep
from service.api.disconnect import unless_disconnected
from service.api.json_response import DocumentResponse
from service.api.params import (
    Cursor,
    IdempotencyKey,
    IfNoneMatch,
    Limit,
    ModelHash,
    PlanId,
    Reader,
    Writer,
    cursor_position,
    none_match,
)
from service.api.problems import problem_responses, unreadable_body_detail
from service.domain import plan_views, planning
from service.domain.ingest import import_onnx_model
from service.domain.onnx_worker import ImportLimits
from service.domain.planning import PlanSubmission, submit_plan
from service.errors import NotFound, UnprocessableInput
from service.schemas.common import Page
from service.schemas.plans import ChromeTrace, GraphRead, PlanCreate, PlanRead
from service.storage import plans as plans_repo

router = APIRouter(tags=["plans"])

_MULTIPART_SCHEMA = {
    "type": "object",
    "required": ["model", "inventory"],
    "properties": {
        "model": {"type": "string", "format": "binary", "description": "The .onnx file (graph-only files are fine)."},
        "inventory": {"type": "string", "description": 'Inventory JSON, e.g. {"preset": "dgx-h100", "nodes": 2}.'},
        "options": {"type": "string", "description": "Options JSON (PlanOptions), dims included."},
    },
}


def _json_part(value, part: str) -> dict:
    if value is None:
        return {}
    text = value if isinstance(value, str) else value.decode("utf-8", "replace")
    try:
        document = json.loads(text)
    except (ValueError, RecursionError) as exc:  # bad JSON, integers of > 4300 digits, nesting past the recursion limit
        raise UnprocessableInput(unreadable_body_detail(exc, f"The '{part}' part")) from None
    if not isinstance(document, dict):
        raise UnprocessableInput(f"The '{part}' part must be a JSON object.")
    return document


def _validated(model, document: dict, prefix: str):
    try:
        return model.model_validate(document)
    except ValidationError as exc:
        errors = exc.errors(include_url=False)
        for error in errors:
            error["loc"] = (prefix, *error.get("loc", ()))
        raise RequestValidationError(errors) from None


def _submission_from_json(body: bytes) -> PlanSubmission:
    try:
        document = json.loads(body)
    except (ValueError, RecursionError) as exc:  # bad JSON or UTF-8, integers of > 4300 digits, deep nesting
        raise UnprocessableInput(unreadable_body_detail(exc)) from None
    if not isinstance(document, dict):
        raise UnprocessableInput(
            "The body must be a JSON object with 'graph' (or 'graph_id'), 'inventory' and 'options'."
        )
    graph = document.get("graph")
    # The graph is validated by the ingester (precise, fast on 10^6 nodes); the
    # envelope, inventory and options by their schemas.
    envelope = _validated(PlanCreate, {**document, "graph": None}, "body")
    if (graph is None) == (envelope.graph_id is None):
        raise UnprocessableInput("Send exactly one of 'graph' (a graph document) or 'graph_id' (a stored graph).")
    if graph is not None and not isinstance(graph, dict):
        raise UnprocessableInput("'graph' must be a JSON object with 'nodes' and 'tensors'.")
    return PlanSubmission(
        inventory=envelope.inventory.model_dump(exclude_none=True),
        options=envelope.options.model_dump(),
        graph=graph,
        graph_id=envelope.graph_id,
    )


async def _submission_from_multipart(request: Request) -> PlanSubmission:
    form = await request.form(max_files=1, max_fields=10)
    upload = form.get("model") or form.get("file")
    if not isinstance(upload, UploadFile):
        raise UnprocessableInput("Multipart submissions need a file part named 'model' holding the .onnx file.")
    data = await upload.read()
    inventory = _json_part(form.get("inventory"), "inventory")
    if not inventory:
        raise UnprocessableInput(
            'Multipart submissions need an \'inventory\' part (JSON), e.g. {"preset": "dgx-h100", "nodes": 1}.'
        )
    envelope = _validated(
        PlanCreate, {"inventory": inventory, "options": _json_part(form.get("options"), "options")}, "form"
    )
    return PlanSubmission(
        inventory=envelope.inventory.model_dump(exclude_none=True),
        options=envelope.options.model_dump(),
        onnx_bytes=data,
    )


def _plan_response(
    plan, status_code: int, cached: bool, detail: str = "full", body: dict | None = None
) -> DocumentResponse:
    document = plan_views.plan_read(plan, cached=cached, detail=detail, body=body)
    headers = {"ETag": plan_views.etag(plan, detail, cached=cached)}
    if status_code in (201, 202):
        headers["Location"] = f"/v1/plans/{plan.id}"
    return DocumentResponse(document, status_code=status_code, headers=headers)


@router.post(
    "/plans",
    status_code=201,
    response_model=PlanRead,
    summary="Submit a graph and an inventory; get a placement plan",
    responses={
        200: {
            "description": "The same model, inventory and options were planned before: the stored plan.",
            "model": PlanRead,
        },
        202: {"description": "Large graph: queued as a job; poll the Location.", "model": PlanRead},
        **problem_responses(404, 409, 413, 422, 503),
    },
    openapi_extra={
        "requestBody": {
            "required": True,
            "content": {
                "application/json": {
                    "schema": PlanCreate.model_json_schema(ref_template="#/components/schemas/{model}")
                },
                "multipart/form-data": {"schema": _MULTIPART_SCHEMA},
            },
        }
    },
)
async def create_plan(
    request: Request,
    session: SessionDep,
    settings: SettingsDep,
    principal: Writer,
    idempotency_key: IdempotencyKey = None,
):
    content_type = request.headers.get("content-type", "")
    if content_type.startswith("multipart/form-data"):
        submission: PlanSubmission | bytes = await _onnx_imported(
            request, session, settings, await _submission_from_multipart(request)
        )
    elif content_type.startswith("application/json") or not content_type:
        submission = await request.body()
    else:
        raise UnprocessableInput(
            f"Unsupported content type {content_type!r}; send application/json or multipart/form-data."
        )
    return await run_in_threadpool(
        _submit,
        session,
        principal.tenant_id,
        submission,
        settings,
        idempotency_key,
        request.app.state.planning_slots,
    )


async def _onnx_imported(request: Request, session, settings, submission: PlanSubmission) -> PlanSubmission:
    """The upload's ONNX model imported, waiting on the event loop (no thread, no database connection held).

    The key lookup's transaction ends first: an import can take up to
    HYPERPLACE_ONNX_IMPORT_TIMEOUT_S, and a connection (on SQLite, the database lock)
    held through it starves every other request. A client that disconnects cancels
    its import, and the worker running it is killed.
    """
    await run_in_threadpool(session.rollback)
    graph = await unless_disconnected(
        request,
        lambda: import_onnx_model(
            submission.onnx_bytes or b"",
            dims=submission.options.get("dims") or {},
            max_ops=settings.max_graph_ops,
            limits=ImportLimits.of(settings),
        ),
    )
    return dataclasses.replace(submission, onnx_graph=graph, onnx_bytes=None)


def _submit(
    session, tenant_id: str, submission: PlanSubmission | bytes, settings, idempotency_key: str | None, slots
) -> DocumentResponse:
    """Parse (a JSON body), plan and render in one threadpool call; the answer is built from the
    plan's result in memory when this request computed it."""
    if isinstance(submission, bytes):
        submission = _submission_from_json(submission)
    outcome = submit_plan(session, tenant_id, submission, settings, idempotency_key=idempotency_key, slots=slots)
    return _plan_response(outcome.plan, outcome.status_code, outcome.cached, body=outcome.body)


@router.get(
    "/plans/{plan_id}",
    response_model=PlanRead,
    summary="A plan (poll it while it is queued or running)",
    responses={304: {"description": "Not modified (If-None-Match)"}, **problem_responses(404)},
)
def read_plan(
    plan_id: PlanId,
    session: SessionDep,
    principal: Reader,
    detail: Annotated[
        Literal["full", "summary"], Query(description="summary leaves out ops, tensors, transfers and schedule.")
    ] = "full",
    if_none_match: IfNoneMatch = None,
):
    plan = plans_repo.get_plan(session, principal.tenant_id, plan_id)
    if plan is None:
        raise NotFound(f"No plan with id {plan_id}.")
    tag = plan_views.etag(plan, detail, cached=False)
    if none_match(if_none_match, tag):
        return Response(status_code=304, headers={"ETag": tag})
    return _plan_response(plan, 200, cached=False, detail=detail)


@router.delete(
    "/plans/{plan_id}",
    status_code=204,
    summary="Delete a plan, its timelines and its Idempotency-Keys; refit the calibration they fed",
    responses=problem_responses(404),
)
def delete_plan(plan_id: PlanId, session: SessionDep, principal: Writer) -> Response:
    if not planning.delete_plan(session, principal.tenant_id, plan_id):
        raise NotFound(f"No plan with id {plan_id}.")
    return Response(status_code=204)


@router.get(
    "/models/{model_hash}/plans",
    response_model=Page[PlanRead],
    summary="Plans of one model, newest first",
    responses=problem_responses(400),
)
def list_model_plans(
    model_hash: ModelHash,
    session: SessionDep,
    principal: Reader,
    limit: Limit = 50,
    cursor: Cursor = None,
    inventory_hash: Annotated[str | None, Query(max_length=64, pattern=r"^[0-9a-f]+$")] = None,
    status: Annotated[Literal["queued", "running", "done", "failed"] | None, Query()] = None,
) -> dict:
    position = cursor_position(cursor)
    rows = plans_repo.list_plans_for_model(
        session,
        principal.tenant_id,
        model_hash,
        limit=limit + 1,
        cursor=position,
        inventory_hash=inventory_hash,
        status=status,
    )
    page, more = rows[:limit], len(rows) > limit
    return {
        "items": [plan_views.plan_read(plan, cached=False, detail="summary") for plan in page],
        "next_cursor": plans_repo.encode_cursor(page[-1].created_at, page[-1].id) if more else None,
    }


@router.get(
    "/models/{model_hash}",
    response_model=GraphRead,
    summary="A stored model's graph summary",
    responses=problem_responses(404),
)
def read_model(model_hash: ModelHash, session: SessionDep, principal: Reader) -> dict:
    row = plans_repo.get_graph_by_hash(session, principal.tenant_id, model_hash)
    if row is None:
        raise NotFound(f"No model with hash {model_hash}.")
    return plan_views.graph_read(row)


@router.get(
    "/plans/{plan_id}/trace",
    response_model=ChromeTrace,
    summary="The simulated timeline as Chrome trace JSON (opens in Perfetto)",
    responses=problem_responses(404, 409),
)
def plan_trace(plan_id: PlanId, session: SessionDep, principal: Reader) -> DocumentResponse:
    plan = plan_views.finished_plan(session, principal.tenant_id, plan_id)
    trace = plan_views.chrome_trace(session, plan)
    return DocumentResponse(trace, headers={"Content-Disposition": f'inline; filename="plan-{plan.id}.trace.json"'})


@router.get(
    "/plans/{plan_id}/view",
    response_class=HTMLResponse,
    summary="An HTML page: Gantt chart, memory, link traffic, candidates",
    responses={
        200: {"description": "A self-contained HTML page.", "content": {"text/html": {"schema": {"type": "string"}}}},
        **problem_responses(404, 409),
    },
)
def plan_view(plan_id: PlanId, session: SessionDep, principal: Reader) -> HTMLResponse:
    plan = plan_views.finished_plan(session, principal.tenant_id, plan_id)
    return HTMLResponse(plan_views.html_view(session, plan))


__all__ = ["router"]
