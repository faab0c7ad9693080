"""A fixed number of slots for one kind of CPU-heavy computation; the rest wait a little, then get 503.

Two computations need bounding, and FastAPI alone bounds neither: its thread pool takes
40 handlers at once.

- Graph placements inside a request (``HYPERPLACE_SYNC_PLAN_SLOTS``): a graph at
  ``HYPERPLACE_SYNC_MAX_OPS`` (20,000 operators) on ``HYPERPLACE_MAX_PLAN_DEVICES``
  (2,048 devices) plans in about 35 s holding about 2.9 GiB (``hyperplace plan``). The
  caller already runs in a worker thread (a sync handler) and decides what a busy
  server means: a new submission becomes a job (202), a re-plan, which must run now,
  waits up to ``wait_s`` and then is a 503. It takes a slot with :meth:`ComputeSlots.hold`.
- 3D-parallel searches (``HYPERPLACE_PARALLEL_PLAN_SLOTS``): a worst-case search holds
  ~1.5 GiB and one core for 10-20 s. The route is a coroutine and waits for a slot on
  the event loop, so the requests in line hold no thread and no memory and the other
  routes keep their threads; it takes a slot with :meth:`ComputeSlots.run`, which then
  computes in a worker thread.

One class serves both: a count of slots taken under a lock, and one first-come,
first-served line of waiters, each woken the way it waits (a thread on a
:class:`threading.Event`, a coroutine on a future of its event loop). A slot given back
while someone waits passes straight to the head of the line, so a caller trying "only
if free now" never overtakes one that has been waiting.
"""

from __future__ import annotations

import asyncio
import threading
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import TypeVar

import anyio
import anyio.to_thread

from service.errors import ServerBusy

__all__ = ["ComputeSlots"]

T = TypeVar("T")


class _Waiter:
    """One caller in line; ``granted`` is set, under the slots' lock, when a slot passes to it."""

    __slots__ = ("granted", "wake")

    def __init__(self, wake: Callable[[], None]) -> None:
        self.granted = False
        self.wake = wake


def _resolve(woken: asyncio.Future[None]) -> None:
    if not woken.done():  # a waiter that timed out or was cancelled has cancelled its future
        woken.set_result(None)


def _wake_on(loop: asyncio.AbstractEventLoop, woken: asyncio.Future[None]) -> Callable[[], None]:
    """Wake a coroutine waiting on ``loop`` from any thread (a slot may be given back in a worker thread)."""

    def wake() -> None:
        try:
            loop.call_soon_threadsafe(_resolve, woken)
        except RuntimeError:  # the loop has closed: the server is stopping and nobody waits any more
            pass

    return wake


class ComputeSlots:
    """At most ``slots`` computations of one kind at once; a caller waits at most ``wait_s`` for one.

    Parameters
    ----------
    what
        What the slots are for, as the 503's detail names it ("3D-parallel searches").
    slots
        How many run at once (>= 1).
    wait_s
        How long a caller that waits (:meth:`run`, ``hold(wait=True)``) waits before
        :meth:`busy` applies (>= 0).
    """

    def __init__(self, what: str, slots: int, wait_s: float) -> None:
        if slots < 1:
            raise ValueError(f"slots is {slots}; at least one computation must be able to run")
        if not wait_s >= 0:
            raise ValueError(f"wait_s is {wait_s}; a wait cannot be negative")
        self.what = what
        self.slots = slots
        self.wait_s = wait_s
        self._lock = threading.Lock()
        self._taken = 0
        self._line: deque[_Waiter] = deque()

    @property
    def taken(self) -> int:
        """Slots held now (a slot passing to a woken waiter stays counted)."""
        return self._taken

    @property
    def waiting(self) -> int:
        """Callers in line for a slot now."""
        return len(self._line)

    def busy(self) -> ServerBusy:
        """The 503 (with ``Retry-After``) for a caller that found no slot within ``wait_s``."""
        return ServerBusy.slots_taken(self.what, self.slots, self.wait_s)

    # -------------------------------------------------------------- the count and the line

    def _take_now(self) -> bool:
        """Under the lock: take a free slot unless someone is already waiting for one."""
        if self._taken < self.slots and not self._line:
            self._taken += 1
            return True
        return False

    def _give_back(self) -> None:
        with self._lock:
            if not self._line:
                self._taken -= 1
                return
            waiter = self._line.popleft()
            waiter.granted = True  # the slot passes on; the count stays
        waiter.wake()

    def _leave_line(self, waiter: _Waiter) -> bool:
        """After a wait that may have ended without a wake: whether the slot came after all."""
        with self._lock:
            if waiter.granted:
                return True
            self._line.remove(waiter)
            return False

    # -------------------------------------------------------------- a caller in a worker thread

    def _take_in_thread(self, wait_s: float) -> bool:
        with self._lock:
            if self._take_now():
                return True
            if wait_s <= 0:
                return False
            woken = threading.Event()
            waiter = _Waiter(woken.set)
            self._line.append(waiter)
        woken.wait(wait_s)
        return self._leave_line(waiter)

    @contextmanager
    def hold(self, *, wait: bool = False) -> Iterator[bool]:
        """Hold a slot for the ``with`` block if one is free now (``wait``: or frees within ``wait_s``).

        Yields whether the slot is held: the caller decides what a busy server means (a
        job instead, or ``raise slots.busy()``). It blocks the calling thread while it
        waits, so call it from a worker thread, never from the event loop.
        """
        held = self._take_in_thread(self.wait_s if wait else 0.0)
        try:
            yield held
        finally:
            if held:
                self._give_back()

    # -------------------------------------------------------------- a coroutine on the event loop

    async def _take_on_loop(self, wait_s: float | None = None) -> bool:
        wait_s = self.wait_s if wait_s is None else wait_s
        with self._lock:
            if self._take_now():
                return True
            if wait_s <= 0:
                return False
            loop = asyncio.get_running_loop()
            woken: asyncio.Future[None] = loop.create_future()
            waiter = _Waiter(_wake_on(loop, woken))
            self._line.append(waiter)
        try:
            with anyio.move_on_after(wait_s):
                await woken
        except BaseException:  # cancelled from outside (the client went away): no slot leaks
            if self._leave_line(waiter):
                self._give_back()
            raise
        return self._leave_line(waiter)

    @asynccontextmanager
    async def slot(self, wait_s: float | None = None) -> AsyncIterator[None]:
        """Hold a slot for the ``async with`` block once one is free; :meth:`busy` if none frees
        within ``wait_s`` (default: the slots' own).

        The wait happens on the event loop: a coroutine in line holds no thread.
        """
        if not await self._take_on_loop(wait_s):
            raise self.busy() if wait_s is None else ServerBusy.slots_taken(self.what, self.slots, wait_s)
        try:
            yield
        finally:
            self._give_back()

    async def run(self, work: Callable[..., T], *args: object) -> T:
        """``work(*args)`` in a worker thread once a slot is free; :meth:`busy` if none frees within ``wait_s``.

        The wait happens on the event loop: a request in line holds no thread.
        """
        async with self.slot():
            return await anyio.to_thread.run_sync(work, *args)
