"""How many bytes of large request bodies the server holds at once; the rest wait a little, then get 503.

``HYPERPLACE_MAX_BODY_BYTES`` bounds one body, not all of them: Starlette buffers a
JSON body whole, parses it on the event loop into Python objects, and the handler
validates and converts those again. Measured (``bench.request_bodies``): one valid
13.5 MiB MoE load matrix (256 layers x 8,000 experts) raised the server's peak
resident memory by 979 MiB, 73 times its size, and ten sent at once by 7.4 GiB.
So every body over ``EXEMPT_BYTES`` reserves its declared ``Content-Length``
(a chunked one, which declares nothing, the per-body limit) from one budget before the
application reads a byte, and gives it back once the response is sent. A request
that finds the budget taken waits on the event loop, holding no thread and no body,
for up to ``wait_s``, then gets a 503 ``server-busy`` problem with ``Retry-After``.
A body larger than the whole budget still runs when nothing else is in flight. With
the default budget the same ten peaked at 3.3 GiB. Small bodies (plan queries, load
reports of real MoE models) never wait.
"""

from __future__ import annotations

import anyio
from starlette.datastructures import Headers
from starlette.requests import Request
from starlette.types import ASGIApp, Receive, Scope, Send

from service.api.problems import service_error_response
from service.errors import ServerBusy

__all__ = ["EXEMPT_BYTES", "BodyBudget", "BodyBudgetMiddleware", "reserved_bytes"]

# Bodies up to this size skip the budget: a DeepSeek-V3 load report (58 layers x 256
# experts) is about 150 KB of JSON, a 1,000-operator graph a few hundred KB.
EXEMPT_BYTES = 1024 * 1024


class BodyBudget:
    """Bytes of request bodies in flight, against ``budget_bytes``.

    Only the event loop touches it, so the count needs no lock; the event that wakes
    waiters is made there too (anyio makes one only inside a running loop).
    """

    def __init__(self, budget_bytes: int, wait_s: float) -> None:
        self.budget_bytes = budget_bytes
        self.wait_s = wait_s
        self.in_flight_bytes = 0
        self._freed: anyio.Event | None = None

    @property
    def has_waiters(self) -> bool:
        """Some request is waiting for bytes to be given back."""
        return self._freed is not None

    def try_reserve(self, n_bytes: int) -> bool:
        """Take ``n_bytes`` now if they fit (or nothing else is in flight); say whether they were taken."""
        if self.in_flight_bytes and self.in_flight_bytes + n_bytes > self.budget_bytes:
            return False
        self.in_flight_bytes += n_bytes
        return True

    async def reserve(self, n_bytes: int) -> bool:
        """Take ``n_bytes`` now if they fit, else wait up to ``wait_s`` for other bodies to be given back."""
        with anyio.move_on_after(self.wait_s):
            while not self.try_reserve(n_bytes):
                if self._freed is None:
                    self._freed = anyio.Event()
                await self._freed.wait()
            return True
        return False

    def release(self, n_bytes: int) -> None:
        """Give ``n_bytes`` back and wake every waiter to try again."""
        self.in_flight_bytes -= n_bytes
        if self._freed is not None:
            self._freed.set()
            self._freed = None


def reserved_bytes(scope: Scope, max_body_bytes: int) -> int:
    """What a request reserves: its declared length if over ``EXEMPT_BYTES``, the per-body
    limit for a chunked body, nothing for a small or absent one."""
    headers = Headers(scope=scope)
    declared = headers.get("content-length")
    if declared is not None:
        try:
            length = int(declared)
        except ValueError:
            return 0  # the HTTP server refuses it before the application sees it
        return length if length > EXEMPT_BYTES else 0
    if "chunked" in headers.get("transfer-encoding", "").lower():
        return max_body_bytes
    return 0


class BodyBudgetMiddleware:
    """Admit a request with a large body only once its bytes fit in the :class:`BodyBudget`."""

    def __init__(self, app: ASGIApp, budget: BodyBudget, max_body_bytes: int) -> None:
        self.app = app
        self.budget = budget
        self.max_body_bytes = max_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        n_bytes = reserved_bytes(scope, self.max_body_bytes) if scope["type"] == "http" else 0
        if n_bytes == 0:
            await self.app(scope, receive, send)
            return
        budget = self.budget
        if not await budget.reserve(n_bytes):
            busy = ServerBusy(
                f"{budget.in_flight_bytes} bytes of request bodies are being processed, this one's "
                f"{n_bytes} would pass the {budget.budget_bytes}-byte budget "
                "(HYPERPLACE_MAX_BODY_BYTES_IN_FLIGHT),",
                budget.wait_s,
            )
            await service_error_response(Request(scope), busy)(scope, receive, send)
            return
        try:
            await self.app(scope, receive, send)
        finally:
            budget.release(n_bytes)
