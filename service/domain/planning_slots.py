"""How many graph placements a server computes inside requests at once.

A graph at ``HYPERPLACE_SYNC_MAX_OPS`` (20,000 operators of ``partitioners.graph.generators``) on
``HYPERPLACE_MAX_PLAN_DEVICES`` (2,048 devices, 256 DGX H100 nodes) plans in about
35 s holding about 2.9 GiB (``hyperplace plan``); the request thread pool would
start 40 of them at once. Beyond the slots a new submission becomes a job, as a
large graph does, and a re-plan (which must run now) waits a little, then gets 503.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["PlanningSlots"]


class PlanningSlots:
    """A counted set of slots; ``hold`` says whether the caller got one."""

    def __init__(self, slots: int) -> None:
        self.slots = slots
        self._free = threading.BoundedSemaphore(slots)

    @contextmanager
    def hold(self, wait_s: float = 0.0) -> Iterator[bool]:
        """Take a slot for the ``with`` block if one frees within ``wait_s`` (0: only if free now)."""
        acquired = self._free.acquire(timeout=wait_s) if wait_s > 0 else self._free.acquire(blocking=False)
        try:
            yield acquired
        finally:
            if acquired:
                self._free.release()
