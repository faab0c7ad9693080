"""Pure ASGI middleware: request context (id, logs, metrics), the body-size limit, HEAD and ``Allow``.

Pure ASGI rather than ``BaseHTTPMiddleware`` so streaming bodies are counted as
they arrive and nothing is buffered twice.
"""

from __future__ import annotations

import re
import time
import uuid

import anyio
import structlog
from prometheus_client import CollectorRegistry, Counter, Histogram
from starlette.datastructures import Headers
from starlette.requests import Request
from starlette.routing import Match
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.api.problems import service_error_response
from service.errors import PayloadTooLarge, RequestTimeout

__all__ = [
    "HttpMetrics",
    "RequestContextMiddleware",
    "BodySizeLimitMiddleware",
    "BodyRateMiddleware",
    "HeadMiddleware",
    "allowed_methods",
    "route_template",
]

_REQUEST_ID_RE = re.compile(r"^[A-Za-z0-9._-]{1,64}$")
log = structlog.get_logger("hyperplace.http")


class HttpMetrics:
    """Request counters and latency histograms, labelled by route template (never the raw path)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self.requests = Counter(
            "hyperplace_http_requests", "HTTP requests answered", ["method", "route", "status"], registry=registry
        )
        self.latency = Histogram(
            "hyperplace_http_request_duration_seconds",
            "HTTP request latency",
            ["method", "route"],
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
            registry=registry,
        )


def route_template(scope: Scope) -> str:
    """The matched route's path template (``/v1/plans/{plan_id}``), or ``unmatched``.

    FastAPI (>= 0.16x) includes routers lazily: the matched route carries its path
    relative to the including router, whose prefix sits in the include context.
    """
    route = scope.get("route")
    path = getattr(route, "path", None)
    if not path:
        # plain Starlette routes (/docs, /openapi.json) record only their endpoint
        endpoint = scope.get("endpoint")
        app = scope.get("app")
        for candidate in getattr(app, "routes", ()) if endpoint is not None else ():
            if getattr(candidate, "endpoint", None) is endpoint and getattr(candidate, "path", None):
                return candidate.path
        return "unmatched"
    included = (scope.get("fastapi") or {}).get("included_router")
    prefix = getattr(getattr(included, "include_context", None), "prefix", "") or ""
    return prefix + path


class RequestContextMiddleware:
    """Request id in and out (``X-Request-ID``), a log line per request, metrics per route."""

    def __init__(self, app: ASGIApp, metrics: HttpMetrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        incoming = Headers(scope=scope).get("x-request-id", "")
        request_id = incoming if _REQUEST_ID_RE.match(incoming) else uuid.uuid4().hex
        scope.setdefault("state", {})["request_id"] = request_id
        structlog.contextvars.clear_contextvars()
        structlog.contextvars.bind_contextvars(request_id=request_id)
        started = time.perf_counter()
        status_holder = {"status": 500}

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                status_holder["status"] = message["status"]
                message.setdefault("headers", [])
                message["headers"] = list(message["headers"]) + [(b"x-request-id", request_id.encode())]
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
        finally:
            elapsed_s = time.perf_counter() - started
            template = route_template(scope)
            method = scope.get("method", "")
            self.metrics.requests.labels(method, template, str(status_holder["status"])).inc()
            self.metrics.latency.labels(method, template).observe(elapsed_s)
            if template not in ("/healthz", "/metrics"):
                tenant = scope["state"].get("tenant_id")
                log.info(
                    "request",
                    method=method,
                    route=template,
                    status=status_holder["status"],
                    duration_ms=round(elapsed_s * 1000, 2),
                    **({"tenant": tenant} if tenant else {}),
                )


#: Methods a route may declare, in the order ``Allow`` lists them (HEAD follows GET, see HeadMiddleware).
_ROUTE_METHODS = ("GET", "POST", "PUT", "PATCH", "DELETE")


def allowed_methods(app: ASGIApp, path: str, root_path: str) -> list[str]:
    """Every method some route of ``app`` answers on ``path``, HEAD wherever GET is.

    Starlette's 405 names only the methods of the first route whose path matched,
    and FastAPI makes one route per method, so ``PUT /v1/plans/{id}`` was told
    ``Allow: GET`` though DELETE (and HEAD) are served too. Each method is tried
    against the whole routing table instead, with the router's own matching.
    """
    routes = getattr(getattr(app, "router", None), "routes", ())
    allowed: list[str] = []
    for method in _ROUTE_METHODS:
        probe = {"type": "http", "method": method, "path": path, "root_path": root_path, "headers": [], "fastapi": {}}
        if any(route.matches(probe)[0] == Match.FULL for route in routes):
            allowed += ["GET", "HEAD"] if method == "GET" else [method]
    return allowed


class HeadMiddleware:
    """Method semantics the routes leave out: HEAD wherever GET is answered, and a full ``Allow`` on 405.

    HEAD gets the GET answer's status and headers, no body (RFC 9110 9.3.2). FastAPI
    routes match only the methods they declare, so without this a HEAD is 405 on
    every API route. The request runs as a GET on a copy of the scope: the server
    keeps reading the original, which still says HEAD (uvicorn then expects no
    body), and what routing adds to the copy (the matched route, for the metrics
    label) is carried back to it.

    A 405 must list every method the path supports (RFC 9110 15.5.6); its ``Allow``
    is rewritten with :func:`allowed_methods`, HEAD included where GET is.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path, root_path = scope["path"], scope.get("root_path", "")

        async def send_with_full_allow(message: Message) -> None:
            if message["type"] == "http.response.start" and message["status"] == 405:
                allow = ", ".join(allowed_methods(scope.get("app"), path, root_path)).encode("latin-1")
                headers = [(name, value) for name, value in message.get("headers", []) if name.lower() != b"allow"]
                message = {**message, "headers": headers + [(b"allow", allow)]}
            await send(message)

        if scope["method"] != "HEAD":
            await self.app(scope, receive, send_with_full_allow)
            return
        as_get = {**scope, "method": "GET"}

        async def send_headers_only(message: Message) -> None:
            if message["type"] == "http.response.body":
                if message.get("more_body", False):
                    return
                message = {"type": "http.response.body", "body": b"", "more_body": False}
            await send_with_full_allow(message)

        try:
            await self.app(as_get, receive, send_headers_only)
        finally:
            scope.update({key: value for key, value in as_get.items() if key != "method"})


class BodySizeLimitMiddleware:
    """Reject bodies over ``max_body_bytes`` with 413 before they are parsed.

    A declared ``Content-Length`` over the limit is refused at once; a chunked body
    without one is counted as it streams and refused the moment it crosses the
    limit, so neither is ever held in memory in full.
    """

    def __init__(self, app: ASGIApp, max_body_bytes: int) -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = self.max_body_bytes
        declared = Headers(scope=scope).get("content-length")
        if declared is not None:
            try:
                too_large = int(declared) > limit
            except ValueError:
                too_large = False
            if too_large:
                await service_error_response(Request(scope), _over_the_limit(limit))(scope, receive, send)
                return
        received = 0

        async def counting_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    raise _over_the_limit(limit)
            return message

        await self.app(scope, counting_receive, send)


def _over_the_limit(limit: int) -> PayloadTooLarge:
    """The 413 for a body past ``limit``; the connection closes, since the rest of the body is never read."""
    return PayloadTooLarge(
        f"Request body is over the {limit}-byte limit (HYPERPLACE_MAX_BODY_BYTES).", headers={"Connection": "close"}
    )


class BodyRateMiddleware:
    """Refuse a body that arrives too slowly: 408, the connection closed, its reservation given back.

    One client that declared ``Content-Length: 67108864`` and sent a byte a second held
    the whole budget of bodies in flight (:mod:`service.api.body_budget`) for as long as
    it liked. After ``grace_s`` a body must have arrived at ``min_bytes_per_s`` on
    average: each ``receive`` may wait until the moment the bytes received so far stop
    meeting that rate (``start + grace_s + received / min_bytes_per_s``), so a stalled
    body is cut at a deadline and a slow trickle soon after, while a body that keeps the
    rate, however large, is never cut. The 408 is raised inside the application's read,
    so every middleware around it (the body budget among them) unwinds as for any error.
    Once the body is complete, ``receive`` waits for a disconnect and is left alone.
    """

    def __init__(self, app: ASGIApp, min_bytes_per_s: float, grace_s: float) -> None:
        self.app = app
        self.min_bytes_per_s = min_bytes_per_s
        self.grace_s = grace_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not _has_body(scope):
            await self.app(scope, receive, send)
            return
        started = anyio.current_time()
        received = 0
        complete = False

        async def paced_receive() -> Message:
            nonlocal received, complete
            if complete:
                return await receive()
            deadline = started + self.grace_s + received / self.min_bytes_per_s
            with anyio.move_on_after(max(0.0, deadline - anyio.current_time())) as waited:
                message = await receive()
            if waited.cancelled_caught:
                raise self._too_slow(received, anyio.current_time() - started)
            if message["type"] != "http.request" or not message.get("more_body", False):
                complete = True
            received += len(message.get("body", b""))
            return message

        await self.app(scope, paced_receive, send)

    def _too_slow(self, received: int, elapsed_s: float) -> RequestTimeout:
        return RequestTimeout(
            f"The request body arrived too slowly: {received} bytes in {elapsed_s:.3g} s. After "
            f"{self.grace_s:g} s (HYPERPLACE_BODY_READ_GRACE_S) a body must arrive at "
            f"{self.min_bytes_per_s:g} bytes/s on average (HYPERPLACE_BODY_MIN_BYTES_PER_S).",
            headers={"Connection": "close"},
        )


def _has_body(scope: Scope) -> bool:
    headers = Headers(scope=scope)
    length = headers.get("content-length")
    if length is not None:
        return length.strip() not in ("", "0")
    return "chunked" in headers.get("transfer-encoding", "").lower()
