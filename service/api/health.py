"""Liveness, readiness and Prometheus metrics."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from sqlalchemy import text

from service.schemas.health import Liveness, NotReady, Readiness
from service.storage.migrate import current_revision, head_revision

router = APIRouter(tags=["operations"])


@router.get("/healthz", response_model=Liveness, summary="The process is up")
async def healthz() -> Liveness:
    """Answered on the event loop: no worker thread, no database, so it answers while those are all busy."""
    return Liveness(status="ok")


def _not_ready(answer: NotReady) -> JSONResponse:
    # only the fields that apply to this cause (as the model documents them), not a row of nulls
    return JSONResponse(
        answer.model_dump(mode="json", exclude_unset=True), status_code=503, headers={"Retry-After": "5"}
    )


@router.get(
    "/readyz",
    response_model=Readiness,
    summary="The database is reachable and migrated to head",
    responses={503: {"model": NotReady, "description": "Not ready: the body says why"}},
)
def readyz(request: Request) -> Readiness | JSONResponse:
    engine = request.app.state.engine
    try:
        with engine.connect() as connection:
            connection.execute(text("SELECT 1"))
        revision = current_revision(engine)
    except Exception as exc:  # any failure to talk to the database means not ready
        return _not_ready(NotReady(status="unavailable", database="unreachable", detail=type(exc).__name__))
    head = request.app.state.head_revision
    if revision != head:
        return _not_ready(NotReady(status="unavailable", database="not migrated", revision=revision, head=head))
    return Readiness(status="ready", database="ok", revision=revision)


@router.get(
    "/metrics",
    summary="Prometheus metrics",
    response_class=Response,
    responses={
        200: {
            "description": "The Prometheus text exposition format.",
            "content": {CONTENT_TYPE_LATEST: {"schema": {"type": "string"}}},
        }
    },
)
def metrics(request: Request) -> Response:
    return Response(generate_latest(request.app.state.metrics.registry), media_type=CONTENT_TYPE_LATEST)


__all__ = ["router", "head_revision"]
