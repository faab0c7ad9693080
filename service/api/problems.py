"""RFC 9457 problem details for every error the service answers with.

One shape for all 4xx/5xx: ``application/problem+json`` with ``type``,
``title``, ``status``, ``detail``, ``instance`` (the request id) and, for field
problems, ``errors``. Stack traces and SQL never reach a client; they go to the
log with the request id.
"""

from __future__ import annotations

import math
from typing import Any

import structlog
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from sqlalchemy.exc import DBAPIError, IntegrityError, OperationalError
from starlette.exceptions import HTTPException as StarletteHTTPException

from partitioners.errors import InputTooLarge, InvalidInput
from service.errors import DatabaseUnavailable, ServiceError
from service.schemas.common import error_path

__all__ = ["problem_response", "install_problem_handlers", "PROBLEM_BASE", "problem_responses"]

PROBLEM_BASE = "https://hyperplace.dev/problems/"
log = structlog.get_logger("hyperplace.errors")


def problem_response(
    request: Request | None,
    status: int,
    title: str,
    detail: str,
    type_slug: str,
    *,
    headers: dict[str, str] | None = None,
    errors: list[dict] | None = None,
) -> JSONResponse:
    body: dict[str, Any] = {"type": PROBLEM_BASE + type_slug, "title": title, "status": status, "detail": detail}
    if request is not None:
        request_id = getattr(request.state, "request_id", None)
        if request_id:
            body["instance"] = f"urn:request:{request_id}"
    if errors:
        body["errors"] = errors
    return JSONResponse(body, status_code=status, headers=headers, media_type="application/problem+json")


def _jsonable(value: Any) -> Any:
    """Validation inputs may hold NaN, bytes or huge structures: keep the echo small and valid JSON."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value if not isinstance(value, str) else value[:200].encode("utf-8", "replace").decode("utf-8")
    return None


def _validation_errors(exc: RequestValidationError) -> list[dict]:
    out = []
    for err in exc.errors()[:50]:
        out.append({"field": error_path(err.get("loc", ())), "message": err.get("msg", ""),
                    "type": err.get("type", "")})
        if "input" in err:
            out[-1]["input"] = _jsonable(err["input"])
    return out


def install_problem_handlers(app: FastAPI) -> None:
    """Register one handler per error family; everything else is a logged 500."""

    @app.exception_handler(ServiceError)
    async def _service_error(request: Request, exc: ServiceError):
        return problem_response(
            request, exc.status, exc.title, exc.detail, exc.type_slug, headers=exc.headers, errors=exc.errors
        )

    @app.exception_handler(InvalidInput)
    async def _invalid_input(request: Request, exc: InvalidInput):
        status = 413 if isinstance(exc, InputTooLarge) else 422
        errors = [{"field": exc.field, "message": exc.detail, "type": exc.code}] if exc.field else None
        title = "Input too large" if status == 413 else "Invalid input"
        return problem_response(request, status, title, exc.detail, exc.code, errors=errors)

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError):
        errors = _validation_errors(exc)
        first = errors[0] if errors else {"field": "body", "message": "invalid"}
        detail = f"{first['field']}: {first['message']}" + (f" (and {len(errors) - 1} more)" if len(errors) > 1 else "")
        return problem_response(request, 422, "Request validation failed", detail, "validation", errors=errors)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException):
        slug = {404: "not-found", 405: "method-not-allowed", 413: "too-large"}.get(exc.status_code, "http")
        title = {404: "Not found", 405: "Method not allowed"}.get(exc.status_code, "HTTP error")
        return problem_response(request, exc.status_code, title, str(exc.detail), slug, headers=getattr(exc, "headers", None))

    @app.exception_handler(OperationalError)
    async def _db_down(request: Request, exc: OperationalError):
        log.warning("database unavailable", error=str(exc.orig)[:300] if exc.orig else str(exc)[:300])
        err = DatabaseUnavailable()
        return problem_response(request, err.status, err.title, err.detail, err.type_slug, headers=err.headers)

    @app.exception_handler(IntegrityError)
    async def _conflict(request: Request, exc: IntegrityError):
        log.info("unique-key conflict", error=str(exc.orig)[:300] if exc.orig else "")
        return problem_response(
            request, 409, "Conflict", "A concurrent request wrote the same object; retry the request.", "conflict"
        )

    @app.exception_handler(DBAPIError)
    async def _db_error(request: Request, exc: DBAPIError):
        if exc.connection_invalidated:
            err = DatabaseUnavailable()
            return problem_response(request, err.status, err.title, err.detail, err.type_slug, headers=err.headers)
        log.exception("database error")
        return problem_response(request, 500, "Internal error", "An internal error occurred; it has been logged.", "internal")

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception):
        log.exception("unhandled error")
        return problem_response(request, 500, "Internal error", "An internal error occurred; it has been logged.", "internal")


def problem_responses(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI ``responses`` entries so clients see which problems a route may answer."""
    descriptions = {
        400: "Bad request (e.g. a body that is not UTF-8 JSON)",
        401: "Missing or invalid API key",
        403: "The key lacks the scope this route needs",
        404: "Not found (or owned by another tenant)",
        409: "Conflict",
        413: "Body or graph over the configured limit",
        422: "Invalid input; `detail` and `errors` say what to fix",
        503: "Database unavailable; retry after `Retry-After` seconds",
    }
    schema = {
        "type": "object",
        "properties": {
            "type": {"type": "string"},
            "title": {"type": "string"},
            "status": {"type": "integer"},
            "detail": {"type": "string"},
            "instance": {"type": "string"},
            "errors": {"type": "array", "items": {"type": "object"}},
        },
        "required": ["type", "title", "status", "detail"],
    }
    return {
        status: {"description": descriptions.get(status, "Problem"), "content": {"application/problem+json": {"schema": schema}}}
        for status in statuses
    }
