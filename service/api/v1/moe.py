"""MoE expert rebalancing: the latency-critical path (numpy only, small bodies)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Path, Query

from service.api.deps import Principal, SessionDep, SettingsDep, require_scope
from service.api.json_response import DocumentResponse
from service.api.problems import problem_responses
from service.domain.moe import deployment_read, rebalance_request
from service.schemas.moe import (
    DEPLOYMENT_NAME_MAX_LENGTH,
    DEPLOYMENT_NAME_PATTERN,
    MoeDeploymentRead,
    MoeRebalanceRequest,
    MoeRebalanceResponse,
)

router = APIRouter(prefix="/moe", tags=["moe"])
MoeCaller = Annotated[Principal, Depends(require_scope("moe"))]


@router.post(
    "/rebalance",
    response_model=MoeRebalanceResponse,
    summary="Expert loads per layer -> a balanced expert-to-GPU placement with few moves",
    responses=problem_responses(409, 413, 422),
)
def rebalance(
    request: MoeRebalanceRequest, session: SessionDep, settings: SettingsDep, principal: MoeCaller
) -> DocumentResponse:
    # Written straight by pydantic-core, not validated again: the answer reaches 192 MB at
    # HYPERPLACE_MOE_MAX_SLOTS and lies on the latency-critical path. The tests check every
    # form of it against MoeRebalanceResponse (tests/service/api/test_openapi_contract.py).
    return DocumentResponse(rebalance_request(session, principal.tenant_id, request, settings))


@router.get(
    "/deployments/{name}",
    response_model=MoeDeploymentRead,
    summary="A deployment's current placement and its history of reports",
    responses=problem_responses(404, 422),
)
def read_deployment(
    name: Annotated[
        str,
        Path(
            min_length=1,
            max_length=DEPLOYMENT_NAME_MAX_LENGTH,
            pattern=DEPLOYMENT_NAME_PATTERN,
            description="The deployment name given to POST /v1/moe/rebalance.",
        ),
    ],
    session: SessionDep,
    principal: MoeCaller,
    history: Annotated[int, Query(ge=0, le=1000)] = 50,
) -> dict:
    return deployment_read(session, principal.tenant_id, name, history)
