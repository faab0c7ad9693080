"""The HTTP server process: uvicorn, with the limits a port open to the network needs.

uvicorn (with httptools, its default parser) bounds neither a request's head nor the
time a client takes to send it, nor the connections it holds: one 64 MiB header was
read whole (5 s, stalling ``/healthz``), and 20,000 connections that each sent half a
header and then nothing held every file descriptor until new connections, health checks
included, were refused. :class:`GuardedHttpProtocol` is uvicorn's httptools protocol
with what nginx does by default at its edge:

- a request head (request line and headers) over ``HYPERPLACE_MAX_HEADER_BYTES`` gets
  431 and the connection closes, counted as it arrives, so it is never held whole
  (nginx: ``large_client_header_buffers``);
- a head not complete ``HYPERPLACE_HEADER_TIMEOUT_S`` after the connection opened, or
  after the previous answer, gets 408 and the connection closes; an idle connection
  closes silently (nginx: ``client_header_timeout``);
- past ``HYPERPLACE_MAX_CONNECTIONS`` open connections, a new one evicts the connection
  that has spent longest sending a request head (408), so a flood of half-open
  connections cannot lock health checks and real clients out; when every connection is
  in a request, the new one gets 503 with ``Retry-After`` and is closed at once, holding
  its descriptor for microseconds (nginx: ``worker_connections``). The process's
  descriptor limit is raised to its hard limit at start-up (:func:`raise_descriptor_limit`)
  and the cap kept below it.

Idle keep-alive connections close after ``HYPERPLACE_KEEP_ALIVE_S`` (uvicorn's own
``timeout_keep_alive``). A body that arrives too slowly is the application's to refuse
(:class:`service.api.middleware.BodyRateMiddleware`: it knows the body's reservation).

On SIGTERM the server stops accepting, gives requests in flight
``HYPERPLACE_SHUTDOWN_GRACE_S`` to finish, cancels the rest and stops the ONNX import
workers; should anything still hold the process ``_HARD_STOP_AFTER_S`` later, it exits
anyway (:class:`_Server`).
"""

from __future__ import annotations

import asyncio
import json
import os
import resource
import threading
from dataclasses import dataclass
from types import FrameType
from typing import Any

import structlog
import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from service.logging import configure_logging
from service.settings import Settings

__all__ = ["GuardedHttpProtocol", "HttpLimits", "raise_descriptor_limit", "run_server"]

log = structlog.get_logger("hyperplace.server")

#: Descriptors kept free of client connections: the database pool (up to 30 on
#: PostgreSQL), the ONNX import workers' pipes, log files, the listening socket.
RESERVED_DESCRIPTORS = 256
#: Beyond the grace period, how long the lifespan's shutdown and the interpreter's exit
#: may take before the process exits regardless.
_HARD_STOP_AFTER_S = 10.0

_REASONS = {
    408: "Request Timeout",
    431: "Request Header Fields Too Large",
    503: "Service Unavailable",
}


@dataclass(frozen=True)
class HttpLimits:
    """What one connection may do before its request reaches the application."""

    max_header_bytes: int
    header_timeout_s: float
    max_connections: int

    @classmethod
    def of(cls, settings: Settings) -> HttpLimits:
        return cls(settings.max_header_bytes, settings.header_timeout_s, settings.max_connections)


def _problem(status: int, detail: str, type_slug: str, headers: tuple[tuple[str, str], ...] = ()) -> bytes:
    """A whole HTTP/1.1 answer carrying an RFC 9457 problem, closing the connection."""
    body = json.dumps(
        {"type": f"https://hyperplace.dev/problems/{type_slug}", "title": _REASONS[status], "status": status,
         "detail": detail}
    ).encode()  # fmt: skip
    lines = [
        f"HTTP/1.1 {status} {_REASONS[status]}",
        "content-type: application/problem+json",
        f"content-length: {len(body)}",
        "connection: close",
        *(f"{name}: {value}" for name, value in headers),
    ]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


class GuardedHttpProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with a head size cap, a head deadline and a connection cap.

    The limits come from the uvicorn ``Config`` (``config.hyperplace_limits``, set by
    :func:`run_server`), which travels to every worker process.
    """

    def __init__(self, config: uvicorn.Config, server_state: Any, app_state: dict[str, Any], _loop: Any = None):
        super().__init__(config, server_state, app_state, _loop)
        self.limits: HttpLimits = config.hyperplace_limits  # type: ignore[attr-defined]
        self._head_bytes = 0
        self._reading_head = True
        self._head_timer: asyncio.TimerHandle | None = None
        self._refused = False

    # -------------------------------------------------------------- the connection

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if len(self.connections) > self.limits.max_connections:
            oldest = next(iter(self._reading_heads()), None)
            if oldest is None:  # every connection is in a request: this one waits its turn elsewhere
                self._refuse(
                    503,
                    f"The server holds {self.limits.max_connections} connections, its limit "
                    "(HYPERPLACE_MAX_CONNECTIONS), all of them in requests; retry shortly.",
                    "server-busy",
                    (("retry-after", "1"),),
                )
                return
            oldest._refuse(
                408,
                f"The server holds {self.limits.max_connections} connections, its limit "
                "(HYPERPLACE_MAX_CONNECTIONS), and this one had taken longest to send its request head.",
                "request-timeout",
            )
        self._arm_head_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm_head_timer()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._refused:
            return
        if self._reading_head:
            self._head_bytes += len(data)
        super().data_received(data)
        if self._reading_head and not self._refused and self._head_bytes > self.limits.max_header_bytes:
            self._head_too_large()

    # -------------------------------------------------------------- parser callbacks

    def on_message_begin(self) -> None:
        self._reading_head = True  # its bytes are counted from the end of the previous head on
        if self._head_timer is None:
            self._arm_head_timer()
        super().on_message_begin()

    def on_headers_complete(self) -> None:
        if self._refused:
            return
        self._reading_head = False
        self._head_bytes = 0
        self._disarm_head_timer()
        head_bytes = len(self.url) + sum(len(name) + len(value) + 4 for name, value in self.headers)
        if head_bytes > self.limits.max_header_bytes:  # a head that arrived in one piece with its body
            self._head_too_large()
            return
        super().on_headers_complete()

    def on_body(self, body: bytes) -> None:
        if not self._refused:
            super().on_body(body)

    def on_message_complete(self) -> None:
        if not self._refused:
            super().on_message_complete()

    # -------------------------------------------------------------- refusals

    def _reading_heads(self) -> dict[GuardedHttpProtocol, None]:
        """The server's connections now sending a request head, the longest at it first
        (a dict keeps insertion order, and a connection is inserted when its head begins)."""
        reading = getattr(self.server_state, "hyperplace_reading_heads", None)
        if reading is None:
            reading = self.server_state.hyperplace_reading_heads = {}
        return reading

    def _arm_head_timer(self) -> None:
        self._head_timer = self.loop.call_later(self.limits.header_timeout_s, self._head_timed_out)
        self._reading_heads()[self] = None

    def _disarm_head_timer(self) -> None:
        self._reading_heads().pop(self, None)
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _busy_answering(self) -> bool:
        return self.cycle is not None and not self.cycle.response_complete

    def _head_timed_out(self) -> None:
        self._head_timer = None
        self._reading_heads().pop(self, None)
        if self._refused or not self._reading_head or self.transport.is_closing():
            return
        if self._busy_answering():  # a pipelined request behind one still being answered: wait for it
            self._arm_head_timer()
            return
        if self._head_bytes == 0:  # nothing sent: an idle connection, closed as keep-alive would
            self._refused = True
            self.transport.close()
            return
        self._refuse(
            408,
            f"The request head did not arrive within {self.limits.header_timeout_s:g} s (HYPERPLACE_HEADER_TIMEOUT_S).",
            "request-timeout",
        )

    def _head_too_large(self) -> None:
        self._refuse(
            431,
            f"The request line and headers are over {self.limits.max_header_bytes} bytes "
            "(HYPERPLACE_MAX_HEADER_BYTES).",
            "header-too-large",
        )

    def _refuse(self, status: int, detail: str, type_slug: str, headers: tuple[tuple[str, str], ...] = ()) -> None:
        """Answer ``status`` and close, unless an answer is already being written (then just close)."""
        self._refused = True
        self._disarm_head_timer()
        # at DEBUG for the connection cap: a flood of connections must not become a flood of log lines
        (log.debug if status == 503 else log.info)(
            "connection refused", status=status, client=self.client and self.client[0], reason=type_slug
        )
        if not self._busy_answering():
            self.transport.write(_problem(status, detail, type_slug, headers))
        self.transport.close()


def raise_descriptor_limit() -> int:
    """Raise this process's open-file limit to its hard limit (what an unprivileged process may); the new soft limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY:
        hard = max(soft, 1 << 20)
    if soft < hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        except (ValueError, OSError):  # a container may forbid it: keep the soft limit
            pass
    return soft


def connection_cap(max_connections: int, descriptors: int) -> int:
    """The connection cap actually applied: the setting, kept :data:`RESERVED_DESCRIPTORS` below the descriptor limit."""
    return max(1, min(max_connections, descriptors - RESERVED_DESCRIPTORS))


class _Server(uvicorn.Server):
    """uvicorn's server with a hard stop: the first SIGTERM or SIGINT arms a timer that ends
    the process ``grace + _HARD_STOP_AFTER_S`` later, whatever still holds it."""

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if not self.should_exit:
            grace_s = float(self.config.timeout_graceful_shutdown or 0)
            timer = threading.Timer(grace_s + _HARD_STOP_AFTER_S, _hard_stop, args=(grace_s,))
            timer.daemon = True
            timer.start()
        super().handle_exit(sig, frame)


def _hard_stop(grace_s: float) -> None:
    log.error("shutdown took too long; exiting now", grace_s=grace_s, extra_s=_HARD_STOP_AFTER_S)
    os._exit(1)


def run_server(settings: Settings, host: str, port: int, workers: int) -> None:
    """Serve ``service.app:create_app`` with the limits above (``hyperplace serve``)."""
    configure_logging(settings.log_level, settings.log_json)
    descriptors = raise_descriptor_limit()
    cap = connection_cap(settings.max_connections, descriptors)
    if cap < settings.max_connections:
        log.warning(
            "HYPERPLACE_MAX_CONNECTIONS lowered to stay below the open-file limit",
            setting=settings.max_connections,
            applied=cap,
            open_file_limit=descriptors,
        )
    config = uvicorn.Config(
        "service.app:create_app",
        factory=True,
        host=host,
        port=port,
        workers=workers,
        http=GuardedHttpProtocol,
        log_config=None,
        proxy_headers=False,
        access_log=False,  # the request middleware logs every request as JSON
        timeout_keep_alive=max(1, round(settings.keep_alive_s)),
        timeout_graceful_shutdown=max(1, round(settings.shutdown_grace_s)),
        backlog=min(2048, cap),
    )
    config.hyperplace_limits = HttpLimits(settings.max_header_bytes, settings.header_timeout_s, cap)  # type: ignore[attr-defined]
    if workers > 1:
        # uvicorn's supervisor runs its own server in each worker: the grace period
        # applies, the hard stop does not (run one worker per container, scale replicas).
        from uvicorn.supervisors import Multiprocess

        Multiprocess(config, sockets=[config.bind_socket()]).run()
        return
    config.load_app()
    _Server(config).run()
