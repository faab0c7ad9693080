"""Liveness, readiness and Prometheus metrics."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from sqlalchemy import text

from service.storage.migrate import current_revision, head_revision

router = APIRouter(tags=["operations"])


@router.get("/healthz", summary="The process is up")
def healthz() -> dict[str, str]:
    return {"status": "ok"}


@router.get(
    "/readyz",
    summary="The database is reachable and migrated to head",
    responses={503: {"description": "Not ready: the body says why"}},
)
def readyz(request: Request) -> JSONResponse:
    engine = request.app.state.engine
    try:
        with engine.connect() as connection:
            connection.execute(text("SELECT 1"))
        revision = current_revision(engine)
    except Exception as exc:  # any failure to talk to the database means not ready
        return JSONResponse(
            {"status": "unavailable", "database": "unreachable", "detail": type(exc).__name__},
            status_code=503,
            headers={"Retry-After": "5"},
        )
    head = request.app.state.head_revision
    if revision != head:
        return JSONResponse(
            {"status": "unavailable", "database": "not migrated", "revision": revision, "head": head},
            status_code=503,
            headers={"Retry-After": "5"},
        )
    return JSONResponse({"status": "ready", "database": "ok", "revision": revision})


@router.get("/metrics", summary="Prometheus metrics", response_class=Response)
def metrics(request: Request) -> Response:
    return Response(generate_latest(request.app.state.metrics.registry), media_type=CONTENT_TYPE_LATEST)


__all__ = ["router", "head_revision"]
