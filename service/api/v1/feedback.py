"""Runtime feedback: measured timelines, calibration, accuracy, re-plans.

``POST /v1/plans/{id}/feedback`` stores a measured timeline and recalibrates;
``GET /v1/plans/{id}/accuracy`` reports prediction error before and after
calibration; ``POST /v1/plans/{id}/replan`` plans again with the calibrated model
and an optional load report. Thin handlers: the work is in
``service.domain.feedback``, run in the threadpool.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Query, Request
from fastapi.concurrency import run_in_threadpool

from service.api.deps import SessionDep, SettingsDep
from service.api.json_response import DocumentResponse
from service.api.params import Cursor, IdempotencyKey, Limit, ModelHash, PlanId, Reader, Writer, cursor_position
from service.api.problems import problem_responses
from service.domain import plan_views
from service.domain.calibration import calibration_read
from service.domain.feedback import feedback_read, plan_accuracy, replan, submit_feedback
from service.errors import NotFound
from service.schemas.common import Page
from service.schemas.feedback import (
    AccuracyRead,
    CalibrationRead,
    FeedbackCreate,
    FeedbackRead,
    ReplanCreate,
    ReplanRead,
)
from service.storage import feedback as feedback_repo
from service.storage import plans as plans_repo

router = APIRouter(tags=["feedback"])

FeedbackId = Annotated[str, Path(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9-]+$", description="Feedback id.")]
InventoryHash = Annotated[str, Path(min_length=1, max_length=64, pattern=r"^[0-9a-f]+$", description="Inventory hash.")]


def _page(rows: list, limit: int) -> dict:
    page, more = rows[:limit], len(rows) > limit
    return {
        "items": [feedback_read(row) for row in page],
        "next_cursor": plans_repo.encode_cursor(page[-1].created_at, page[-1].id) if more else None,
    }


@router.post(
    "/plans/{plan_id}/feedback",
    status_code=201,
    response_model=FeedbackRead,
    summary="Store a measured timeline of a plan (Chrome trace or simple JSON) and recalibrate",
    responses={
        200: {"description": "A retry with the same Idempotency-Key: the stored record.", "model": FeedbackRead},
        **problem_responses(404, 409, 413, 422),
    },
)
def create_feedback(
    plan_id: PlanId,
    body: FeedbackCreate,
    session: SessionDep,
    principal: Writer,
    idempotency_key: IdempotencyKey = None,
) -> DocumentResponse:
    document, status_code = submit_feedback(
        session, principal.tenant_id, plan_id, body, idempotency_key=idempotency_key
    )
    return DocumentResponse(document, status_code=status_code, headers={"Location": document["links"]["self"]})


@router.get(
    "/plans/{plan_id}/feedback",
    response_model=Page[FeedbackRead],
    summary="Timelines of one plan, newest first",
    responses=problem_responses(404),
)
def list_plan_feedback(
    plan_id: PlanId, session: SessionDep, principal: Reader, limit: Limit = 50, cursor: Cursor = None
) -> dict:
    if plans_repo.get_plan(session, principal.tenant_id, plan_id) is None:
        raise NotFound(f"No plan with id {plan_id}.")
    rows = feedback_repo.list_feedback_for_plan(
        session, principal.tenant_id, plan_id, limit=limit + 1, cursor=cursor_position(cursor)
    )
    return _page(rows, limit)


@router.get(
    "/models/{model_hash}/feedback",
    response_model=Page[FeedbackRead],
    summary="Timelines of every plan of one model, newest first",
)
def list_model_feedback(
    model_hash: ModelHash, session: SessionDep, principal: Reader, limit: Limit = 50, cursor: Cursor = None
) -> dict:
    rows = feedback_repo.list_feedback_for_model(
        session, principal.tenant_id, model_hash, limit=limit + 1, cursor=cursor_position(cursor)
    )
    return _page(rows, limit)


@router.get(
    "/feedback/{feedback_id}",
    response_model=FeedbackRead,
    summary="One stored timeline (with the document itself on request)",
    responses=problem_responses(404),
)
def read_feedback(
    feedback_id: FeedbackId,
    session: SessionDep,
    principal: Reader,
    include_timeline: Annotated[bool, Query(description="Add the timeline document as it was posted.")] = False,
) -> dict:
    row = feedback_repo.get_feedback(session, principal.tenant_id, feedback_id)
    if row is None:
        raise NotFound(f"No feedback with id {feedback_id}.")
    return feedback_read(row, detail=True, include_timeline=include_timeline)


@router.get(
    "/plans/{plan_id}/accuracy",
    response_model=AccuracyRead,
    summary="Prediction error before and after calibration",
    responses=problem_responses(404, 409),
)
async def read_accuracy(plan_id: PlanId, session: SessionDep, principal: Reader) -> dict:
    return await run_in_threadpool(plan_accuracy, session, principal.tenant_id, plan_id)


@router.get(
    "/calibrations/{inventory_hash}",
    response_model=CalibrationRead,
    summary="The tenant's calibration for one inventory",
    responses=problem_responses(404),
)
def read_calibration(inventory_hash: InventoryHash, session: SessionDep, principal: Reader) -> dict:
    row = feedback_repo.get_calibration(session, principal.tenant_id, inventory_hash)
    if row is None:
        raise NotFound(f"No calibration for inventory {inventory_hash}; POST feedback for a plan on it first.")
    return calibration_read(row)


@router.post(
    "/plans/{plan_id}/replan",
    status_code=201,
    response_model=ReplanRead,
    summary="Plan again with the calibrated model and an optional load report; a new plan linked to its parent",
    responses={
        200: {"description": "The same re-plan was made before: the stored plan.", "model": ReplanRead},
        **problem_responses(404, 409, 422, 503),
    },
)
async def create_replan(
    plan_id: PlanId,
    session: SessionDep,
    settings: SettingsDep,
    principal: Writer,
    request: Request,
    body: ReplanCreate | None = None,
    idempotency_key: IdempotencyKey = None,
) -> DocumentResponse:
    return await run_in_threadpool(
        _replan_response,
        session,
        principal.tenant_id,
        plan_id,
        body or ReplanCreate(),
        settings,
        idempotency_key,
        request.app.state.planning_slots,
    )


def _replan_response(
    session, tenant_id: str, plan_id: str, body: ReplanCreate, settings, idempotency_key: str | None, slots
) -> DocumentResponse:
    """Re-plan and render in one threadpool call, from the result in memory when this request computed it."""
    outcome = replan(session, tenant_id, plan_id, body, settings, idempotency_key=idempotency_key, slots=slots)
    plan = outcome.plan
    document = plan_views.plan_read(plan, cached=outcome.cached, body=outcome.body)
    document["replan"] = (plan.summary or {}).get("replan")
    headers = {"ETag": plan_views.etag(plan, "replan", cached=outcome.cached), "Location": f"/v1/plans/{plan.id}"}
    return DocumentResponse(document, status_code=outcome.status_code, headers=headers)


__all__ = ["router"]
