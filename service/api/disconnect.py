"""Work that stops when its client goes away.

An ONNX import can run for a long time in a worker process; a client that gives up
must not leave it running. Once a request's body has been read, the next ``receive``
returns only when the client disconnects (``http.disconnect``), so a watcher awaiting
it beside the work can cancel the work: the ONNX import pool kills the worker running
a cancelled import (:meth:`service.domain.onnx_worker.OnnxImportPool.import_graph_async`).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TypeVar

import anyio
from starlette.requests import ClientDisconnect, Request

__all__ = ["unless_disconnected"]

T = TypeVar("T")


async def unless_disconnected(request: Request, work: Callable[[], Awaitable[T]]) -> T:
    """``await work()``, cancelled if the client disconnects first (then ``ClientDisconnect``).

    Call it only once the body has been read: the watcher reads what the client sends next.
    """
    outcome: list[T] = []
    failed: list[Exception] = []
    gone = False

    async with anyio.create_task_group() as group:

        async def watch() -> None:
            nonlocal gone
            while (await request.receive())["type"] != "http.disconnect":
                pass
            gone = True
            group.cancel_scope.cancel()

        async def run() -> None:
            try:
                outcome.append(await work())
            except Exception as exc:  # raised as itself below, not in the task group's ExceptionGroup
                failed.append(exc)
            group.cancel_scope.cancel()

        group.start_soon(watch)
        group.start_soon(run)
    if failed:
        raise failed[0]
    if gone and not outcome:
        raise ClientDisconnect()
    return outcome[0]
