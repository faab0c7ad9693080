"""Clients that misbehave on purpose, and a probe that times ``/healthz`` meanwhile.

Shared by the tests against a real server (tests/service/api/test_hostile_connections.py)
and the table ``python -m bench.hostile`` prints. Every attack is bounded: a fixed
number of loopback connections or bytes, and each stops by itself.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import selectors
import socket
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from tests.partitioners.graph.onnx_helpers import expanding_functions

__all__ = [
    "HealthProbe",
    "Usage",
    "children_of",
    "expanding_functions_onnx",
    "half_closed_body",
    "half_open_connections",
    "oversized_header",
    "post_onnx",
    "slow_body",
    "usage",
]


# ----------------------------------------------------------------------------- models


def expanding_functions_onnx(depth: int = 40) -> bytes:
    """Issue 55's F1: local functions ``f0..f<depth>``, each calling the one before twice; about
    3 KB that expand to ``2**depth`` operators."""
    return expanding_functions(depth)


# ----------------------------------------------------------------------------- the server's side


@dataclass(frozen=True)
class Usage:
    """A process's resident memory and open descriptors (from /proc)."""

    rss_bytes: int
    descriptors: int

    def within(self, start: Usage, fraction: float = 0.10) -> bool:
        """Whether this is no more than ``fraction`` over ``start`` (memory and descriptors alike)."""
        return self.rss_bytes <= start.rss_bytes * (1 + fraction) and self.descriptors <= start.descriptors * (
            1 + fraction
        )


def usage(pid: int) -> Usage:
    rss = 0
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            rss = int(line.split()[1]) * 1024
    return Usage(rss_bytes=rss, descriptors=len(os.listdir(f"/proc/{pid}/fd")))


def children_of(pid: int) -> set[int]:
    """Live (not zombie) child processes of ``pid``."""
    found = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        state, ppid = stat.rsplit(") ", 1)[1].split()[:2]
        if int(ppid) == pid and state != "Z":
            found.add(int(entry))
    return found


@dataclass
class HealthProbe:
    """``GET /healthz`` on a fresh connection every ``interval_s`` from a thread, while the
    ``with`` block runs: the worst latency seen and the probes that failed."""

    base_url: str
    interval_s: float = 0.1
    timeout_s: float = 5.0
    latencies_s: list[float] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)

    def __enter__(self) -> HealthProbe:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    @property
    def worst_s(self) -> float:
        return max(self.latencies_s, default=float("nan"))

    def _run(self) -> None:
        while not self._stop.is_set():
            started = time.perf_counter()
            try:
                status = httpx.get(f"{self.base_url}/healthz", timeout=self.timeout_s).status_code
                if status != 200:
                    self.failures.append(f"status {status}")
            except httpx.HTTPError as exc:
                self.failures.append(repr(exc))
            self.latencies_s.append(time.perf_counter() - started)
            self._stop.wait(self.interval_s)


# ----------------------------------------------------------------------------- attacks


def _status(response: bytes) -> int | None:
    if not response.startswith(b"HTTP/1."):
        return None
    return int(response.split(b" ", 2)[1])


def _read_answer(sock: socket.socket, timeout_s: float) -> bytes:
    sock.settimeout(timeout_s)
    response = b""
    with contextlib.suppress(OSError):
        while True:
            data = sock.recv(65536)
            if not data:
                break
            response += data
    return response


def post_onnx(base_url: str, api_key: str, model: bytes, timeout_s: float = 120.0) -> tuple[int | None, float]:
    """``POST /v1/plans`` with ``model`` as the ONNX part: (status, seconds), status None if no answer came."""
    started = time.perf_counter()
    try:
        response = httpx.post(
            f"{base_url}/v1/plans",
            headers={"Authorization": f"Bearer {api_key}"},
            files={"model": ("model.onnx", model, "application/octet-stream")},
            data={"inventory": json.dumps({"preset": "dgx-h100"})},
            timeout=timeout_s,
        )
    except httpx.TransportError:  # the client gave up (a timeout), or the server went away
        return None, time.perf_counter() - started
    return response.status_code, time.perf_counter() - started


def oversized_header(port: int, header_bytes: int, chunk_bytes: int = 64 * 1024) -> tuple[int | None, float, int]:
    """``GET /healthz`` with one header of ``header_bytes``, sent until the server answers or closes.

    Returns (status, seconds, bytes sent).
    """
    started = time.perf_counter()
    sent = 0
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: ")
        chunk = b"a" * chunk_bytes
        try:
            while sent < header_bytes:
                if select.select([sock], [], [], 0)[0]:
                    break  # the server answered (or closed): stop sending
                sock.sendall(chunk[: header_bytes - sent])
                sent += min(chunk_bytes, header_bytes - sent)
            else:
                sock.sendall(b"\r\n\r\n")
        except OSError:
            pass
        response = _read_answer(sock, 30)
    return _status(response), time.perf_counter() - started, sent


def slow_body(
    port: int, api_key: str, declared_bytes: int = 64 * 2**20, bytes_per_s: float = 1.0, give_up_s: float = 120.0
) -> tuple[int | None, float, int]:
    """``POST /v1/plans`` declaring ``declared_bytes`` and sending ``bytes_per_s`` until answered or ``give_up_s``.

    Returns (status, seconds, body bytes sent).
    """
    started = time.perf_counter()
    sent = 0
    head = (
        f"POST /v1/plans HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {api_key}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {declared_bytes}\r\n\r\n"
    )
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(head.encode())
        response = b""
        while time.perf_counter() - started < give_up_s:
            if select.select([sock], [], [], 1.0 / bytes_per_s)[0]:
                response = _read_answer(sock, 10)
                break
            try:
                sock.sendall(b" ")
            except OSError:
                response = _read_answer(sock, 10)
                break
            sent += 1
    return _status(response), time.perf_counter() - started, sent


def half_open_connections(port: int, count: int, hold_s: float) -> tuple[int, dict[int | None, int], float]:
    """Open ``count`` loopback connections that each send half a request head, then nothing.

    Holds them up to ``hold_s``, or until the server has closed them all, then closes
    the rest. Returns (connections opened, answers by status, seconds until the last was
    closed by the server or given up).
    """
    started = time.perf_counter()
    sockets: list[socket.socket] = []
    try:
        for _ in range(count):
            sock = socket.create_connection(("127.0.0.1", port), timeout=10)
            sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Half: ")
            sockets.append(sock)
        answers: dict[int | None, int] = {}
        with selectors.DefaultSelector() as selector:  # epoll: select() stops at descriptor 1024
            for sock in sockets:
                selector.register(sock, selectors.EVENT_READ)
            while selector.get_map() and time.perf_counter() - started < hold_s:
                for key, _ in selector.select(0.5):
                    sock = key.fileobj
                    assert isinstance(sock, socket.socket)
                    selector.unregister(sock)
                    status = _status(_read_answer(sock, 5))
                    answers[status] = answers.get(status, 0) + 1
            if selector.get_map():
                answers[-1] = len(selector.get_map())  # still held by the server when given up
        return len(sockets), answers, time.perf_counter() - started
    finally:
        for sock in sockets:
            sock.close()


def half_closed_body(port: int, api_key: str) -> tuple[int | None, float]:
    """``Content-Length: 4096``, 9 bytes, then half-close: (the answer's status if any, seconds)."""
    started = time.perf_counter()
    head = (
        f"POST /v1/plans HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {api_key}\r\n"
        "Content-Type: application/json\r\nContent-Length: 4096\r\n\r\n"
    )
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(head.encode() + b'{"graph":')
        sock.shutdown(socket.SHUT_WR)
        response = _read_answer(sock, 30)
    return _status(response), time.perf_counter() - started
