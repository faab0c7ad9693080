"""3D-parallel layout planner: which dp x tp x pp layout, and which GPU takes which rank."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Request

from service.api.deps import Principal, require_scope
from service.api.json_response import DocumentResponse
from service.api.problems import problem_responses
from service.domain.parallel import parallel_plan
from service.schemas.parallel import ParallelPlanAnswer, ParallelPlanRequest

router = APIRouter(prefix="/parallel", tags=["parallel"])


@router.post(
    "/plan",
    response_model=ParallelPlanAnswer,
    summary="Model shape + cluster + batch -> ranked 3D-parallel layouts with memory, MFU and the rank map",
    responses=problem_responses(413, 422, 503),
)
async def plan(
    request: ParallelPlanRequest, principal: Annotated[Principal, Depends(require_scope("read"))], http_request: Request
) -> DocumentResponse:
    # a search can hold a core and ~1.5 GiB for seconds: a few at a time (HYPERPLACE_PARALLEL_PLAN_SLOTS)
    document = await http_request.app.state.parallel_plan_slots.run(parallel_plan, request)
    return DocumentResponse(document)
