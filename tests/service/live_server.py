"""A real ``hyperplace serve`` process on a loopback port, for tests that need real sockets.

TestClient hands the ASGI app a fully read body and never drops a connection;
streaming uploads, chunked bodies, server memory and database outages need the
real thing. The server logs (JSON) go to a file the test can read.
"""

from __future__ import annotations

import contextlib
import os
import select
import socket
import subprocess
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import httpx

REPO = Path(__file__).parents[2]

__all__ = ["LiveServer", "start_server", "free_port", "peak_rss_bytes", "send_chunked", "wait_until"]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_until(predicate, timeout_s: float = 60.0, interval_s: float = 0.1):
    """Poll ``predicate`` until it returns something truthy (not a timed assertion: a wait)."""
    deadline = time.monotonic() + timeout_s
    last_error = None
    while time.monotonic() < deadline:
        try:
            value = predicate()
            if value:
                return value
        except Exception as exc:  # the thing waited for is not there yet
            last_error = exc
        time.sleep(interval_s)
    raise AssertionError(
        f"timed out after {timeout_s} s waiting for {getattr(predicate, '__name__', predicate)} ({last_error!r})"
    )


@dataclass
class LiveServer:
    process: subprocess.Popen
    base_url: str
    port: int
    log_path: Path

    @property
    def pid(self) -> int:
        return self.process.pid

    def client(self, api_key: str | None = None, timeout_s: float = 60.0) -> httpx.Client:
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        return httpx.Client(base_url=self.base_url, headers=headers, timeout=timeout_s)

    def is_up(self) -> bool:
        try:
            return httpx.get(f"{self.base_url}/healthz", timeout=10).status_code == 200
        except httpx.HTTPError:
            return False

    def logs(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(5)


def start_server(database_url: str, log_path: Path, *, wait_ready: bool = True, **settings: str) -> LiveServer:
    """Start ``python -m service.cli serve`` with ``HYPERPLACE_<NAME>`` settings; wait for /healthz."""
    port = free_port()
    env = dict(
        os.environ,
        HYPERPLACE_DATABASE_URL=database_url,
        HYPERPLACE_HOST="127.0.0.1",
        HYPERPLACE_PORT=str(port),
        HYPERPLACE_AUTH="required",
        HYPERPLACE_API_KEY_SECRET="test-secret",
        HYPERPLACE_EMBEDDED_WORKER="false",
        HYPERPLACE_LOG_LEVEL="INFO",
        HYPERPLACE_LOG_JSON="true",
    )
    env.update({f"HYPERPLACE_{name.upper()}": str(value) for name, value in settings.items()})
    with open(log_path, "wb") as log:  # the server process keeps its own descriptor
        process = subprocess.Popen(
            [sys.executable, "-m", "service.cli", "serve"], cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT
        )
    server = LiveServer(process=process, base_url=f"http://127.0.0.1:{port}", port=port, log_path=log_path)

    def up() -> bool:
        if process.poll() is not None:
            raise RuntimeError(f"server exited with {process.returncode}: {server.logs()[-2000:]}")
        return server.is_up()

    def ready() -> bool:
        response = httpx.get(f"{server.base_url}/readyz", timeout=10)
        if response.status_code != 200:
            raise RuntimeError(f"/readyz {response.status_code}: {response.text[:300]}")
        return True

    try:
        wait_until(up, timeout_s=90)
        if wait_ready:
            wait_until(ready, timeout_s=60)
    except AssertionError as exc:
        server.stop()
        raise AssertionError(f"{exc}\nserver log:\n{server.logs()[-3000:]}") from None
    except BaseException:
        server.stop()
        raise
    return server


def peak_rss_bytes(pid: int) -> int:
    """The process's peak resident set (VmHWM) from /proc."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM in /proc status")


def send_chunked(
    port: int, path: str, headers: dict[str, str], chunks: Iterable[bytes], timeout_s: float = 60.0
) -> tuple[int, bytes, int]:
    """POST ``chunks`` with ``Transfer-Encoding: chunked`` (no Content-Length) on a raw socket.

    Stops sending as soon as the server answers (a server that refuses a body early
    closes the connection, and a blocking client would die on a broken pipe before it
    could read the answer). Returns ``(status, raw_response, body_bytes_sent)``.
    """
    sock = socket.create_connection(("127.0.0.1", port), timeout=timeout_s)
    head = [f"POST {path} HTTP/1.1", "Host: 127.0.0.1", "Transfer-Encoding: chunked", "Connection: close"]
    head += [f"{name}: {value}" for name, value in headers.items()]
    sent = 0
    response = b""
    try:
        sock.sendall(("\r\n".join(head) + "\r\n\r\n").encode())
        for chunk in chunks:
            readable, _, _ = select.select([sock], [], [], 0)
            if readable:
                break
            try:
                sock.sendall(b"%x\r\n%s\r\n" % (len(chunk), chunk))
            except (BrokenPipeError, ConnectionResetError):
                break
            sent += len(chunk)
        else:
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                sock.sendall(b"0\r\n\r\n")
        sock.settimeout(timeout_s)
        while True:
            try:
                data = sock.recv(65536)
            except ConnectionResetError:
                break
            if not data:
                break
            response += data
            if b"\r\n\r\n" in response and _complete(response):
                break
    finally:
        sock.close()
    if not response:
        raise AssertionError(f"no response after sending {sent} body bytes")
    status = int(response.split(b" ", 2)[1])
    return status, response, sent


def _complete(response: bytes) -> bool:
    head, _, body = response.partition(b"\r\n\r\n")
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            return len(body) >= int(line.split(b":")[1])
    return False
