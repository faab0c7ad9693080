"""A fixed number of slots for one kind of CPU-heavy request; the rest wait a little, then get 503.

Route handlers declared with ``def`` run in FastAPI's thread pool, which takes 40 at a
time: 40 worst-case 3D-parallel searches at once would need ~60 GiB. Waiting for a
slot here happens on the event loop (an ``anyio.CapacityLimiter``), so the requests in
line hold no thread and no memory, and the other routes keep their threads.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import anyio
import anyio.to_thread

from service.errors import ServerBusy

__all__ = ["ComputeSlots"]

T = TypeVar("T")


class ComputeSlots:
    """Run at most ``slots`` calls of one kind at once, each in a worker thread.

    The limiter is made on first use: anyio makes one only inside a running event loop,
    which ``create_app`` is not.
    """

    def __init__(self, what: str, slots: int, wait_s: float) -> None:
        self.what = what
        self.slots = slots
        self.wait_s = wait_s
        self._limiter: anyio.CapacityLimiter | None = None

    @property
    def limiter(self) -> anyio.CapacityLimiter:
        if self._limiter is None:
            self._limiter = anyio.CapacityLimiter(self.slots)
        return self._limiter

    async def run(self, work: Callable[..., T], *args: object) -> T:
        """``work(*args)`` in a thread once a slot is free; :class:`ServerBusy` if none frees in time."""
        limiter = self.limiter
        acquired = False
        try:
            limiter.acquire_nowait()
            acquired = True
        except anyio.WouldBlock:
            with anyio.move_on_after(self.wait_s):
                await limiter.acquire()
                acquired = True
        if not acquired:
            raise ServerBusy.slots_taken(self.what, self.slots, self.wait_s)
        try:
            return await anyio.to_thread.run_sync(work, *args)
        finally:
            limiter.release()
