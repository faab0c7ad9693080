"""Domain errors of the service, each with an HTTP status and a problem type.

Handlers raise these (or let ``partitioners.errors`` through); one exception
handler turns both into RFC 9457 problem details (``service.api.problems``).
"""

from __future__ import annotations

import math

__all__ = [
    "ServiceError",
    "NotFound",
    "Conflict",
    "Unauthorized",
    "Forbidden",
    "PayloadTooLarge",
    "UnprocessableInput",
    "DatabaseUnavailable",
    "ServerBusy",
    "RequestTimeout",
]


class ServiceError(Exception):
    """Base class: ``status``, a short ``title`` and a problem ``type`` slug."""

    status: int = 500
    title: str = "Internal error"
    type_slug: str = "internal"

    def __init__(self, detail: str, *, headers: dict[str, str] | None = None, errors: list[dict] | None = None) -> None:
        super().__init__(detail)
        self.detail = detail
        self.headers = headers or {}
        self.errors = errors


class NotFound(ServiceError):
    status, title, type_slug = 404, "Not found", "not-found"


class Conflict(ServiceError):
    status, title, type_slug = 409, "Conflict", "conflict"


class Unauthorized(ServiceError):
    status, title, type_slug = 401, "Unauthorized", "unauthorized"

    def __init__(self, detail: str) -> None:
        super().__init__(detail, headers={"WWW-Authenticate": "Bearer"})


class Forbidden(ServiceError):
    status, title, type_slug = 403, "Forbidden", "forbidden"


class RequestTimeout(ServiceError):
    """The client took too long sending its request (a body under the minimum rate)."""

    status, title, type_slug = 408, "Request timeout", "request-timeout"


class PayloadTooLarge(ServiceError):
    status, title, type_slug = 413, "Payload too large", "too-large"


class UnprocessableInput(ServiceError):
    status, title, type_slug = 422, "Unprocessable input", "invalid-input"


class DatabaseUnavailable(ServiceError):
    status, title, type_slug = 503, "Database unavailable", "database-unavailable"

    def __init__(self, detail: str = "The database is unreachable; retry shortly.", retry_after_s: int = 5) -> None:
        super().__init__(detail, headers={"Retry-After": str(retry_after_s)})


class ServerBusy(ServiceError):
    """A capacity the request needs (slots, a budget of bytes) stayed taken for as long as it may wait."""

    status, title, type_slug = 503, "Server busy", "server-busy"

    def __init__(self, busy: str, waited_s: float) -> None:
        super().__init__(
            f"{busy} and none freed within {waited_s:g} s; retry later",
            headers={"Retry-After": str(max(1, math.ceil(waited_s)))},
        )

    @classmethod
    def slots_taken(cls, what: str, slots: int, waited_s: float) -> ServerBusy:
        """Every one of ``slots`` slots for ``what`` stayed taken."""
        return cls(f"all {slots} slots for {what} are busy", waited_s)
