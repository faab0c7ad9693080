"""A real ``hyperplace serve`` on a free loopback port, for the HTTP benchmarks."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

__all__ = ["free_port", "running_server", "ServerFailed"]

REPO = Path(__file__).resolve().parents[1]


class ServerFailed(RuntimeError):
    """The server exited or did not become ready."""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextmanager
def running_server(
    database_url: str, *, workers: int = 1, ready_timeout_s: float = 60.0, **settings: str
) -> Iterator[tuple[str, subprocess.Popen]]:
    """Start the service (``HYPERPLACE_<NAME>`` from ``settings``), wait for /readyz, stop it after.

    Yields ``(base_url, process)``; the process's stderr is kept for the error message.
    """
    port = free_port()
    env = dict(
        os.environ,
        HYPERPLACE_DATABASE_URL=database_url,
        HYPERPLACE_HOST="127.0.0.1",
        HYPERPLACE_PORT=str(port),
        HYPERPLACE_LOG_LEVEL="WARNING",
    )
    env.update({f"HYPERPLACE_{name.upper()}": str(value) for name, value in settings.items()})
    process = subprocess.Popen(
        [sys.executable, "-m", "service.cli", "serve", "--workers", str(workers)],
        cwd=REPO,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    base_url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + ready_timeout_s
        while True:
            if process.poll() is not None:
                raise ServerFailed(process.stderr.read().decode(errors="replace")[-2000:])
            try:
                if httpx.get(f"{base_url}/readyz", timeout=5).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise ServerFailed(f"the service did not become ready in {ready_timeout_s:.0f} s")
            time.sleep(0.2)
        yield base_url, process
    finally:
        process.terminate()
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
