"""RFC 9457 problem details for every error the service answers with.

One shape for all 4xx/5xx: ``application/problem+json`` with ``type``,
``title``, ``status``, ``detail``, ``instance`` (the request id) and, for field
problems, ``errors``. Stack traces and SQL never reach a client; they go to the
log with the request id.
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from typing import Any

import structlog
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from sqlalchemy.exc import DBAPIError, IntegrityError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeout
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

from partitioners.errors import DoesNotFit, Infeasible, InputTooLarge, InvalidInput
from service.errors import DatabaseUnavailable, ServiceError, UnprocessableInput
from service.schemas.common import error_path

__all__ = [
    "problem_response",
    "service_error_response",
    "install_problem_handlers",
    "PROBLEM_BASE",
    "problem_responses",
    "unreadable_body_detail",
    "most_relevant_first",
    "client_disconnected",
    "CLIENT_CLOSED_REQUEST",
]

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


def service_error_response(request: Request | None, exc: ServiceError) -> JSONResponse:
    """The problem a :class:`~service.errors.ServiceError` stands for (also for middleware, outside the handlers)."""
    return problem_response(
        request, exc.status, exc.title, exc.detail, exc.type_slug, headers=exc.headers, errors=exc.errors
    )


def _jsonable(value: Any) -> Any:
    """Validation inputs may hold NaN, bytes or huge structures: keep the echo small and valid JSON."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value if not isinstance(value, str) else value[:200].encode("utf-8", "replace").decode("utf-8")
    return None


def unreadable_body_detail(exc: BaseException, what: str = "The body") -> str:
    """Why a body (or a multipart part) is not JSON this service can read, in the same words on every route.

    A syntax error says where (``line 1 column 10 (char 9)``); the other failures of
    ``json.loads`` are a body that is not UTF-8, an integer of more than 4300 digits
    and nesting past the interpreter's recursion limit.
    """
    if isinstance(exc, (json.JSONDecodeError, UnicodeDecodeError)):
        return f"{what} is not valid JSON: {exc}."
    reason = "it is nested too deeply" if isinstance(exc, RecursionError) else str(exc).split(";")[0]
    return f"{what} is not JSON this service can read: {reason}."


def _body_decode_error(exc: RequestValidationError) -> json.JSONDecodeError | None:
    """FastAPI's own "JSON decode error" for a body, rebuilt with its line and column."""
    for err in exc.errors():
        loc = tuple(err.get("loc", ()))
        if err.get("type") == "json_invalid" and len(loc) == 2 and loc[0] == "body" and isinstance(loc[1], int):
            document = exc.body if isinstance(exc.body, str) else ""
            message = (err.get("ctx") or {}).get("error") or "invalid JSON"
            return json.JSONDecodeError(str(message), document, min(loc[1], len(document)))
    return None


#: Location parts pydantic gives the members of a plain union (``int | str``): the
#: model's class name, ``list[int]``, ``constrained-int``, ``literal['a']``, ``int``.
_SCALAR_MEMBER_NAMES = frozenset({"int", "float", "str", "bool", "bytes", "none", "any", "date", "datetime"})
#: Error types that say the input has another shape than the member: it is the wrong member.
_SHAPE_MISMATCH = frozenset({"missing", "extra_forbidden"})


def _looks_like_union_member(part: object) -> bool:
    if not isinstance(part, str) or not part:
        return False
    return part[0].isupper() or "[" in part or "-" in part or part in _SCALAR_MEMBER_NAMES


def most_relevant_first(errors: list[dict]) -> list[dict]:
    """Pydantic's errors, reordered so the first says what the client most likely has to fix.

    When a value matches no member of a union (``inventory: InventoryDocument |
    PresetInventory``) pydantic reports every member's errors, the wrong members'
    first, so ``{"preset": "dgx-h100", "nodes": 0}`` would open with "groups: Field
    required". The member the client meant is the one the input fits best: fewest
    fields missing or unknown at its top level (a ``preset`` key is unknown to the
    explicit form), and never one that rejects the value's type outright. Its errors
    come first, then the other members' in the same order of fit. Within that order an
    error on a value sent comes before a required field not sent. Every error is kept.
    """
    locations = [tuple(err.get("loc", ())) for err in errors]
    members: dict[tuple, set] = defaultdict(set)
    for loc in locations:
        for depth, part in enumerate(loc):
            if _looks_like_union_member(part):
                members[loc[:depth]].add(part)
    unions = {prefix for prefix, names in members.items() if len(names) > 1}

    def member_of(loc: tuple) -> tuple[tuple, object] | None:
        for depth in range(len(loc)):
            if loc[:depth] in unions and loc[depth] in members[loc[:depth]]:
                return loc[:depth], loc[depth]
        return None

    branches = [member_of(loc) for loc in locations]
    misfit: dict[tuple, list[int]] = defaultdict(lambda: [0, 0, 0])
    for err, loc, branch in zip(errors, locations, branches):
        if branch is None:
            continue
        depth = len(branch[0]) + 1
        score = misfit[branch]
        score[0] += len(loc) == depth  # the value is not this member's type at all
        score[1] += len(loc) == depth + 1 and err.get("type") in _SHAPE_MISMATCH
        score[2] += 1
    rank: dict[tuple, int] = {}
    for prefix in unions:
        fits = sorted((branch for branch in misfit if branch[0] == prefix), key=lambda branch: misfit[branch])
        rank.update({branch: position for position, branch in enumerate(fits)})

    def relevance(index: int) -> tuple[int, bool, int]:
        branch = branches[index]
        return rank.get(branch, 0) if branch else 0, errors[index].get("type") == "missing", index

    return [errors[index] for index in sorted(range(len(errors)), key=relevance)]


def _validation_errors(exc: RequestValidationError) -> list[dict]:
    out = []
    for err in most_relevant_first(list(exc.errors()))[:50]:
        out.append(
            {"field": error_path(err.get("loc", ())), "message": err.get("msg", ""), "type": err.get("type", "")}
        )
        if "input" in err:
            out[-1]["input"] = _jsonable(err["input"])
    return out


def install_problem_handlers(app: FastAPI) -> None:
    """Register one handler per error family; everything else is a logged 500."""

    @app.exception_handler(ServiceError)
    async def _service_error(request: Request, exc: ServiceError):
        return service_error_response(request, exc)

    @app.exception_handler(InvalidInput)
    async def _invalid_input(request: Request, exc: InvalidInput):
        status = 413 if isinstance(exc, InputTooLarge) else 422
        errors = [{"field": exc.field, "message": exc.detail, "type": exc.code}] if exc.field else None
        title = _invalid_input_title(exc)
        return problem_response(request, status, title, exc.detail, exc.code, errors=errors)

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError):
        decode_error = _body_decode_error(exc)
        if decode_error is not None:
            return _unreadable_body(request, decode_error)
        errors = _validation_errors(exc)
        first = errors[0] if errors else {"field": "body", "message": "invalid"}
        detail = f"{first['field']}: {first['message']}" + (f" (and {len(errors) - 1} more)" if len(errors) > 1 else "")
        return problem_response(request, 422, "Request validation failed", detail, "validation", errors=errors)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException):
        if exc.status_code == 400 and isinstance(exc.__cause__, ClientDisconnect):
            # FastAPI wraps whatever fails while it reads the body in its generic 400
            return client_disconnected(request)
        if exc.status_code == 400 and isinstance(exc.__cause__, ServiceError):
            # Raised while FastAPI read the body (the body-size limit counts it as it
            # streams); FastAPI wrapped it in its generic 400.
            return service_error_response(request, exc.__cause__)
        if exc.status_code == 400 and isinstance(exc.__cause__, (ValueError, RecursionError)):
            # FastAPI's "There was an error parsing the body": json.loads failed on bytes
            # that are not UTF-8, a huge integer or deep nesting. The body is as
            # unprocessable as a syntax error, and answered the same way.
            return _unreadable_body(request, exc.__cause__)
        slug = {404: "not-found", 405: "method-not-allowed", 413: "too-large"}.get(exc.status_code, "http")
        title = {404: "Not found", 405: "Method not allowed"}.get(exc.status_code, "HTTP error")
        return problem_response(
            request, exc.status_code, title, str(exc.detail), slug, headers=getattr(exc, "headers", None)
        )

    @app.exception_handler(ClientDisconnect)
    async def _client_gone(request: Request, exc: ClientDisconnect):
        return client_disconnected(request)

    @app.exception_handler(PoolTimeout)
    async def _pool_exhausted(request: Request, exc: PoolTimeout):
        log.warning("database connection pool exhausted", error=str(exc)[:300])
        return service_error_response(
            request,
            DatabaseUnavailable("Every database connection is in use; retry shortly.", retry_after_s=2),
        )

    @app.exception_handler(OperationalError)
    async def _db_down(request: Request, exc: OperationalError):
        log.warning("database unavailable", error=str(exc.orig)[:300] if exc.orig else str(exc)[:300])
        return service_error_response(request, DatabaseUnavailable())

    @app.exception_handler(IntegrityError)
    async def _conflict(request: Request, exc: IntegrityError):
        log.info("unique-key conflict", error=str(exc.orig)[:300] if exc.orig else "")
        return problem_response(
            request, 409, "Conflict", "A concurrent request wrote the same object; retry the request.", "conflict"
        )

    @app.exception_handler(DBAPIError)
    async def _db_error(request: Request, exc: DBAPIError):
        if exc.connection_invalidated:
            return service_error_response(request, DatabaseUnavailable())
        log.exception("database error")
        return problem_response(
            request, 500, "Internal error", "An internal error occurred; it has been logged.", "internal"
        )

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception):
        log.exception("unhandled error")
        return problem_response(
            request, 500, "Internal error", "An internal error occurred; it has been logged.", "internal"
        )


def _invalid_input_title(exc: InvalidInput) -> str:
    """The problem's title names what kind of refusal it is, not only that the input was refused."""
    if isinstance(exc, InputTooLarge):
        return "Input too large"
    if isinstance(exc, DoesNotFit):
        return "Does not fit"
    if isinstance(exc, Infeasible):
        return "Infeasible"
    return "Invalid input"


#: What nginx logs for a request whose client closed the connection before the answer:
#: no server error, and never sent (nobody is there to read it).
CLIENT_CLOSED_REQUEST = 499


def client_disconnected(request: Request) -> Response:
    """The client went away mid-request (``ClientDisconnect``): a 499 in the log and the
    metrics, not a 500 "unhandled error"; uvicorn drops the answer."""
    log.info("client disconnected", method=request.method, path=request.url.path)
    return Response(status_code=CLIENT_CLOSED_REQUEST)


def _unreadable_body(request: Request, exc: BaseException) -> JSONResponse:
    """A body ``json.loads`` refused: 422 with the words ``POST /v1/plans`` uses, on every route."""
    return service_error_response(request, UnprocessableInput(unreadable_body_detail(exc)))


def problem_responses(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI ``responses`` entries so clients see which problems a route may answer."""
    descriptions = {
        400: "Bad request (e.g. a multipart body that cannot be parsed)",
        401: "Missing or invalid API key",
        403: "The key lacks the scope this route needs",
        404: "Not found (or owned by another tenant)",
        409: "Conflict",
        413: "Body or graph over the configured limit",
        422: "Invalid input (a body that is not JSON included), or a plan that does not fit (title 'Does not fit'); "
        "`detail` and `errors` say what to fix",
        503: "Database unavailable, or every slot for this kind of computation busy; retry after `Retry-After` seconds",
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
        status: {
            "description": descriptions.get(status, "Problem"),
            "content": {"application/problem+json": {"schema": schema}},
        }
        for status in statuses
    }
