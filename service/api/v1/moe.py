"""MoE expert rebalancing: the latency-critical path (numpy only, small bodies)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Path, Query, Response

from service.api.deps import Principal, SessionDep, SettingsDep, require_scope
from service.api.json_response import DocumentResponse
from service.api.problems import problem_responses
from service.domain.moe import INCLUDE_OPTIONS, confirm_applied, deployment_read, rebalance_request
from service.errors import UnprocessableInput
from service.schemas.moe import (
    DEPLOYMENT_NAME_MAX_LENGTH,
    DEPLOYMENT_NAME_PATTERN,
    MoeAppliedRequest,
    MoeAppliedResponse,
    MoeDeploymentRead,
    MoeRebalanceRequest,
    MoeRebalanceResponse,
)

router = APIRouter(prefix="/moe", tags=["moe"])
MoeCaller = Annotated[Principal, Depends(require_scope("moe"))]
DeploymentPath = Annotated[
    str,
    Path(
        min_length=1,
        max_length=DEPLOYMENT_NAME_MAX_LENGTH,
        pattern=DEPLOYMENT_NAME_PATTERN,
        description="The deployment name given to POST /v1/moe/rebalance.",
    ),
]


def _include(include: str) -> frozenset[str]:
    parts = frozenset(part.strip() for part in include.split(",") if part.strip())
    unknown = sorted(parts - set(INCLUDE_OPTIONS))
    if unknown:
        raise UnprocessableInput(f"include: unknown part(s) {', '.join(unknown)}; known: {', '.join(INCLUDE_OPTIONS)}.")
    return parts


@router.post(
    "/rebalance",
    response_model=MoeRebalanceResponse,
    summary="Expert loads per layer -> the copies to write for a balanced placement, and its version",
    responses=problem_responses(409, 413, 422),
)
def rebalance(
    request: MoeRebalanceRequest,
    session: SessionDep,
    settings: SettingsDep,
    principal: MoeCaller,
    include: Annotated[
        str,
        Query(
            max_length=64,
            description="Comma-separated: 'placement' adds the three maps, 'layers' the per-layer figures, 'eplb'"
            " the maps under EPLB's names as padded arrays (physical_to_logical_map, logical_to_physical_map).",
        ),
    ] = "",
) -> DocumentResponse:
    # Written straight by pydantic-core, not validated again: the answer lies on the
    # latency-critical path. The tests check every form of it against MoeRebalanceResponse
    # (tests/service/api/test_openapi_contract.py).
    body = rebalance_request(session, principal.tenant_id, request, settings, _include(include))
    return DocumentResponse(body, headers={"ETag": f'"{body["placement_etag"]}"'})


@router.post(
    "/deployments/{name}/applied",
    response_model=MoeAppliedResponse,
    summary="The runtime confirms what it applied of an answer: all of it, or the migrations it completed",
    responses=problem_responses(404, 409, 422),
)
def applied(
    name: DeploymentPath, request: MoeAppliedRequest, session: SessionDep, principal: MoeCaller, response: Response
) -> dict:
    body = confirm_applied(session, principal.tenant_id, name, request)
    response.headers["ETag"] = f'"{body["placement_etag"]}"'
    return body


@router.get(
    "/deployments/{name}",
    response_model=MoeDeploymentRead,
    summary="A deployment's current placement (EPLB's maps), its version and its history of reports",
    responses=problem_responses(404, 422),
)
def read_deployment(
    name: DeploymentPath,
    session: SessionDep,
    principal: MoeCaller,
    response: Response,
    history: Annotated[int, Query(ge=0, le=1000)] = 50,
) -> dict:
    body = deployment_read(session, principal.tenant_id, name, history)
    response.headers["ETag"] = f'"v{body["placement_version"]}"'
    return body
