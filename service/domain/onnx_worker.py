"""ONNX import in worker processes whose address space is capped.

Why: ONNX's C++ shape inference allocates in proportion to the ranks it infers, and
a crafted model of a few hundred bytes (``Gather(x, x)`` chained, each doubling the
rank) makes it ask for more memory than any machine has. Nothing in Python can bound
an allocation made in C++, and in the server process the kernel's OOM killer would
take the whole service. So :func:`import_onnx_graph` runs
:func:`~partitioners.graph.onnx_import.graph_from_onnx_bytes` in a worker process capped
with ``RLIMIT_AS`` (``HYPERPLACE_ONNX_IMPORT_MEMORY_BYTES`` on top of the worker's
start-up footprint): a model that needs more fails there, with ``MemoryError``
(``std::bad_alloc``), or kills only its worker, and the request gets a 4xx problem
while the server keeps serving.

How: :data:`IMPORT_WORKERS` slots, each a one-process ``ProcessPoolExecutor`` started
with ``spawn`` (the server has threads, which ``fork`` does not copy safely) on first
use and kept, so an import pays no interpreter start-up. One process per slot rather
than one pool of several makes a dead worker the fault of the one import it was
running: a ``ProcessPoolExecutor`` breaks every import in flight when one of its
processes dies. A slot whose worker died or ran out of memory starts afresh. The
library's errors (``InvalidInput``, ``InputTooLarge``) pickle with their ``field``,
``code`` and ``detail`` and come back unchanged; so does the ``Hypergraph``.

Time: a model can also be slow rather than large (issue 55: local functions calling
each other twice per level, 40 levels deep, expand to 2^40 operators; the importer now
counts that before inference, but not everything slow can be foreseen). An import may
take ``HYPERPLACE_ONNX_IMPORT_TIMEOUT_S``; then its worker is killed (SIGKILL), a fresh
one started in its place, and the request gets 413 ``import-timeout``, not a second try.
A request waits for a free worker at most ``HYPERPLACE_ONNX_IMPORT_WAIT_S``, then gets
503 with ``Retry-After``. The server waits on its event loop
(:meth:`OnnxImportPool.import_graph_async`): an import in line or running holds no
thread, and cancelling it (the client went away, the server stops) kills its worker.
On shutdown :meth:`OnnxImportPool.close` kills every worker rather than waiting for them.
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
import os
import signal
import threading
import time
from collections.abc import Iterator, Mapping
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from concurrent.futures.process import BrokenProcessPool
from contextlib import contextmanager
from dataclasses import dataclass, replace

import anyio
import anyio.to_thread
import onnx
import structlog

from partitioners.errors import InputTooLarge, InvalidInput
from partitioners.graph.hypergraph import Hypergraph
from partitioners.graph.onnx_import import graph_from_onnx_bytes
from service.domain.compute_slots import ComputeSlots
from service.errors import ServerBusy
from service.settings import Settings, get_settings

__all__ = [
    "IMPORT_WORKERS",
    "ImportLimits",
    "import_onnx_graph_async",
    "OnnxImportPool",
    "import_onnx_graph",
    "onnx_import_pool",
    "serving_onnx_imports",
]

log = structlog.get_logger("hyperplace.onnx")

#: ONNX imports that run at once per server process; more wait for a free worker.
#: Each may take HYPERPLACE_ONNX_IMPORT_MEMORY_BYTES, so this bounds their memory too.
IMPORT_WORKERS = 2
#: How long a fresh worker may take to start (an interpreter, numpy, onnx: about 2 s on an
#: idle 2-core host, many more on a loaded one) before the import waiting for it gets 503.
WORKER_START_S = 60.0


# ---------------------------------------------------------------- in the worker


def _address_space_bytes() -> int:
    """This process's virtual size (what RLIMIT_AS counts), or 0 where /proc is absent."""
    try:
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def _start_worker(memory_bytes: int) -> None:
    """Process-pool initializer: warm the importer up, then cap the address space.

    The cap is the footprint after a first, tiny import (the interpreter, numpy and
    onnx loaded, the threads OpenBLAS starts, one per core, and their stacks: 160 MiB
    of address space on 2 cores) plus ``memory_bytes``, so the setting means the same
    whatever the core count. The hard limit is lowered too: nothing in the worker may
    raise it again. SIGINT is ignored: a Ctrl-C in the terminal stops the server,
    which stops its workers.
    """
    import resource  # here: the server imports this module on platforms without it (cap 0)

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    value = onnx.helper.make_tensor_value_info
    warm_up = onnx.helper.make_model(
        onnx.helper.make_graph([onnx.helper.make_node("Relu", ["x"], ["y"])], "warm-up",
                               [value("x", onnx.TensorProto.FLOAT, [1])], [value("y", onnx.TensorProto.FLOAT, [1])]),
        opset_imports=[onnx.helper.make_opsetid("", 17)],
    )  # fmt: skip
    graph_from_onnx_bytes(warm_up.SerializeToString())
    limit = _address_space_bytes() + memory_bytes
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    if hard != resource.RLIM_INFINITY:
        limit = min(limit, hard)
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


def _import_in_worker(data: bytes, dims: Mapping[str, int], max_ops: int | None) -> Hypergraph:
    """The task a worker runs (a module-level name, so that tests can stand in for it)."""
    return graph_from_onnx_bytes(data, dims=dims, max_ops=max_ops)


# ---------------------------------------------------------------- in the server


def _amount(n_bytes: int) -> str:
    return f"{n_bytes / 2**30:.3g} GiB" if n_bytes >= 2**30 else f"{n_bytes / 2**20:.3g} MiB"


class _Slot:
    """One worker process, started on first use; used by one import at a time."""

    def __init__(self) -> None:
        self.executor: ProcessPoolExecutor | None = None
        self.ready: Future[int] | None = None

    def started(self, memory_bytes: int) -> Future[int]:
        """Start the worker if there is none; the future is done once it has started (its pid).

        Start-up (an interpreter, numpy, onnx, a first import) takes a second or two,
        several on a loaded host: it is waited for apart, so an import's time limit
        counts the import alone.
        """
        if self.executor is None:
            self.executor = ProcessPoolExecutor(
                max_workers=1,
                mp_context=multiprocessing.get_context("spawn"),
                initializer=_start_worker,
                initargs=(memory_bytes,),
            )
            self.ready = self.executor.submit(os.getpid)
        assert self.ready is not None
        return self.ready

    def submit(self, data: bytes, dims: Mapping[str, int], max_ops: int | None) -> Future[Hypergraph]:
        assert self.executor is not None, "started() first"
        return self.executor.submit(_import_in_worker, data, dims, max_ops)

    def stop(self) -> None:
        """Forget a worker that died or ran out of memory; the next import starts a fresh one."""
        if self.executor is not None:
            self.executor.shutdown(wait=False, cancel_futures=True)
            self.executor = None

    def kill(self) -> list[multiprocessing.process.BaseProcess]:
        """SIGKILL the worker whatever it is doing (an import past its time, a client gone, shutdown).

        ``ProcessPoolExecutor`` offers no way to stop a running task before Python 3.14
        (``terminate_workers``): its processes are killed directly. Its management
        thread then sees the pool broken, reaps them and ends, so nothing is left
        behind.
        """
        executor, self.executor = self.executor, None
        if executor is None:
            return []
        processes = list(getattr(executor, "_processes", {}).values())
        for process in processes:
            with contextlib.suppress(OSError):  # already gone
                process.kill()
        executor.shutdown(wait=False, cancel_futures=True)
        return processes


class OnnxImportPool:
    """Up to ``workers`` ONNX imports at once, each in its own address-space-capped process.

    Parameters
    ----------
    memory_bytes : int
        Address space one import may use on top of its worker's start-up footprint.
    workers : int
        Imports that run at once; more wait for a free worker.
    timeout_s : float
        Wall-clock seconds one import may take (HYPERPLACE_ONNX_IMPORT_TIMEOUT_S); its
        worker is then killed, and replaced for the next import.
    wait_s : float
        How long an import waits for a free worker (HYPERPLACE_ONNX_IMPORT_WAIT_S)
        before the answer is 503 with ``Retry-After``.
    """

    def __init__(
        self, memory_bytes: int, workers: int = IMPORT_WORKERS, *, timeout_s: float = 120.0, wait_s: float = 10.0
    ) -> None:
        if memory_bytes <= 0 or workers < 1:
            raise ValueError("an import pool needs a positive memory cap and at least one worker")
        if not timeout_s > 0:
            raise ValueError(f"timeout_s is {timeout_s}; an import needs some time")
        self.memory_bytes = memory_bytes
        self.timeout_s = timeout_s
        self._slots = [_Slot() for _ in range(workers)]
        # who may run now (waiting threads and coroutines in one line), and which worker each takes
        self._turns = ComputeSlots("ONNX imports", workers, wait_s)
        self._idle_lock = threading.Lock()
        self._idle = list(self._slots)
        self._closings = 0  # how often close() ran: an import it killed is not tried again

    @contextmanager
    def _worker(self) -> Iterator[_Slot]:
        """An idle worker slot; only called holding a turn, so there always is one."""
        with self._idle_lock:
            slot = self._idle.pop()
        try:
            yield slot
        finally:
            with self._idle_lock:
                self._idle.append(slot)

    # ------------------------------------------------------------ what the errors say

    def _too_slow(self) -> InputTooLarge:
        return InputTooLarge(
            f"Importing this model took longer than {self.timeout_s:g} s, the most one ONNX import may take here "
            "(HYPERPLACE_ONNX_IMPORT_TIMEOUT_S); it was stopped. Split the model, or make it smaller: ONNX shape "
            "inference walks every operator, every call of a local function and every control-flow body.",
            field="model",
            code="import-timeout",
        )

    def _replace(self, slot: _Slot, closings: int) -> None:
        """Kill the slot's worker and start its successor now (unless the pool was closed
        meanwhile), so the next import does not wait for a start-up and the pool keeps its size."""
        slot.kill()
        if self._closings == closings:
            slot.started(self.memory_bytes)

    def _unless_closed(self, closings: int) -> None:
        """A worker killed by :meth:`close` (the server stopping) ends its import: 503, no second try."""
        if self._closings != closings:
            raise ServerBusy("ONNX imports were stopped: the server is shutting down", 5) from None

    def _not_started(self) -> ServerBusy:
        return ServerBusy(
            f"an ONNX import worker did not start within {WORKER_START_S:g} s (the host is overloaded)", 5
        )

    def _too_big(self) -> InputTooLarge:
        return InputTooLarge(
            f"Importing this model needs more than {_amount(self.memory_bytes)} of memory, the most one "
            "ONNX import may use here (HYPERPLACE_ONNX_IMPORT_MEMORY_BYTES). Split the model, or make "
            "its shapes stop growing from operator to operator (Gather(x, x) repeated doubles the rank "
            "each time, and ONNX shape inference follows it).",
            field="model",
            code="import-memory",
        )

    def _crashed(self) -> InvalidInput:
        return InvalidInput(
            "Importing this model killed the worker process running it, twice. Running out of the memory one ONNX "
            f"import may use here ({_amount(self.memory_bytes)}, HYPERPLACE_ONNX_IMPORT_MEMORY_BYTES) does this, "
            "as ONNX's shape inference does not always survive it; so does a model that crashes ONNX.",
            field="model",
            code="import-crashed",
        )

    # ------------------------------------------------------------ a caller in a thread

    def import_graph(self, data: bytes, *, dims: Mapping[str, int], max_ops: int | None) -> Hypergraph:
        """:func:`~partitioners.graph.onnx_import.graph_from_onnx_bytes` in a worker, from a thread.

        Raises
        ------
        InvalidInput, InputTooLarge
            What the importer raises, unchanged; and ``InputTooLarge`` (413)
            ``import-memory`` when the import needs more memory than the cap,
            ``import-timeout`` when it takes longer than ``timeout_s`` (its worker is
            killed, and the import not tried again); ``InvalidInput``
            (``import-crashed``, 422) when the model killed its worker.
        ServerBusy
            503 when no worker freed within ``wait_s``.

        A worker that dies is replaced and the import tried once more in a fresh one:
        a worker can die of something else (killed while idle, by an operator, by the
        host's OOM killer), but a model that kills two in a row is the cause.
        """
        with self._turns.hold(wait=True) as turn:
            if not turn:
                raise self._turns.busy()
            closings = self._closings
            with self._worker() as slot:
                for _ in range(2):
                    try:
                        slot.started(self.memory_bytes).result(timeout=WORKER_START_S)
                    except FutureTimeout:
                        slot.kill()
                        raise self._not_started() from None
                    except BrokenProcessPool:
                        self._unless_closed(closings)
                        slot.stop()
                        continue
                    future = slot.submit(data, dims, max_ops)
                    try:
                        return future.result(timeout=self.timeout_s)
                    except FutureTimeout:
                        self._replace(slot, closings)
                        log.warning("onnx import stopped", reason="time limit", timeout_s=self.timeout_s)
                        raise self._too_slow() from None
                    except BrokenProcessPool:
                        self._unless_closed(closings)
                        slot.stop()
                    except MemoryError:  # the importer lets it through (partitioners.graph.onnx_import._infer)
                        slot.stop()  # the next import starts in a fresh address space
                        raise self._too_big() from None
        raise self._crashed()

    # ------------------------------------------------------------ a coroutine on the event loop

    async def import_graph_async(self, data: bytes, *, dims: Mapping[str, int], max_ops: int | None) -> Hypergraph:
        """:meth:`import_graph` for a coroutine: it waits for a worker, and for the import, on the event loop.

        A request in line holds no thread, so health checks and other routes keep
        theirs however many imports wait. Cancelled (the client went away, the server
        stops), it kills the worker running its import: nothing keeps a core busy for
        a request nobody waits for.
        """
        async with self._turns.slot():
            closings = self._closings
            with self._worker() as slot:
                for _ in range(2):
                    try:
                        with anyio.fail_after(WORKER_START_S):
                            await asyncio.wrap_future(slot.started(self.memory_bytes))
                    except TimeoutError:
                        slot.kill()
                        raise self._not_started() from None
                    except BrokenProcessPool:
                        self._unless_closed(closings)
                        slot.stop()
                        continue
                    future = slot.submit(data, dims, max_ops)
                    try:
                        with anyio.fail_after(self.timeout_s):
                            return await asyncio.wrap_future(future)
                    except TimeoutError:
                        self._replace(slot, closings)
                        log.warning("onnx import stopped", reason="time limit", timeout_s=self.timeout_s)
                        raise self._too_slow() from None
                    except BrokenProcessPool:
                        self._unless_closed(closings)
                        slot.stop()
                    except MemoryError:
                        slot.stop()
                        raise self._too_big() from None
                    except BaseException:  # cancelled: the import still runs in the worker
                        if not future.done():
                            self._replace(slot, closings)
                            log.info("onnx import stopped", reason="cancelled (client gone or server stopping)")
                        raise
        raise self._crashed()

    def close(self) -> None:
        """Kill the workers, whatever they run (the server is stopping); a later import starts new ones.

        The server gives requests their grace period before its lifespan ends; an
        import still running then is one nobody will wait for. Waiting for it instead
        held a stopping server for minutes.
        """
        self._closings += 1
        killed = [process for slot in self._slots for process in slot.kill()]
        deadline = time.monotonic() + 5.0
        for process in killed:  # reaped (by this thread or the pool's own), not left as zombies
            process.join(max(0.0, deadline - time.monotonic()))


# ------------------------------------------------ one pool per cap, per process


@dataclass(frozen=True)
class ImportLimits:
    """What one import may use: address space, wall-clock time, and how long it waits for a worker."""

    memory_bytes: int
    timeout_s: float = 120.0
    wait_s: float = 10.0

    @classmethod
    def of(cls, settings: Settings) -> ImportLimits:
        return cls(settings.onnx_import_memory_bytes, settings.onnx_import_timeout_s, settings.onnx_import_wait_s)


_registry_lock = threading.Lock()
_pools: dict[ImportLimits, OnnxImportPool] = {}
#: Limits of the apps whose lifespan is running, the latest last: the default.
_serving: list[ImportLimits] = []


def onnx_import_pool(limits: ImportLimits) -> OnnxImportPool:
    """The process's pool for these limits, created on first use."""
    with _registry_lock:
        pool = _pools.get(limits)
        if pool is None:
            pool = _pools[limits] = OnnxImportPool(
                limits.memory_bytes, timeout_s=limits.timeout_s, wait_s=limits.wait_s
            )
        return pool


@contextmanager
def serving_onnx_imports(limits: ImportLimits) -> Iterator[None]:
    """An app's lifespan: its limits are the default while it runs; its pool stops with the last app using it.

    Tests run several apps in one process, each with its own settings; a server runs one.
    """
    with _registry_lock:
        _serving.append(limits)
    try:
        yield
    finally:
        with _registry_lock:
            _serving.remove(limits)
            pool = _pools.pop(limits, None) if limits not in _serving else None
        if pool is not None:
            pool.close()


def _limits(memory_bytes: int | None, limits: ImportLimits | None) -> ImportLimits:
    """The limits asked for; else the running app's, else the environment's (the CLI); ``memory_bytes`` overrides."""
    if limits is None:
        with _registry_lock:
            limits = _serving[-1] if _serving else None
        if limits is None:
            limits = ImportLimits.of(get_settings())
    return limits if memory_bytes is None else replace(limits, memory_bytes=memory_bytes)


def import_onnx_graph(
    data: bytes,
    *,
    dims: Mapping[str, int],
    max_ops: int | None,
    memory_bytes: int | None = None,
    limits: ImportLimits | None = None,
) -> Hypergraph:
    """Import ONNX bytes in a memory-capped worker, from a thread (see the module docstring).

    Parameters
    ----------
    memory_bytes : int, optional
        The cap; default: the running app's ``onnx_import_memory_bytes``, else the
        environment's (the CLI). 0 imports in this process, without a cap or a time limit.
    """
    limits = _limits(memory_bytes, limits)
    if limits.memory_bytes == 0:
        return graph_from_onnx_bytes(data, dims=dims, max_ops=max_ops)
    return onnx_import_pool(limits).import_graph(data, dims=dims, max_ops=max_ops)


async def import_onnx_graph_async(
    data: bytes, *, dims: Mapping[str, int], max_ops: int | None, limits: ImportLimits | None = None
) -> Hypergraph:
    """:func:`import_onnx_graph` for a coroutine: waits on the event loop; cancelling it kills the import."""
    limits = _limits(None, limits)
    if limits.memory_bytes == 0:
        return await anyio.to_thread.run_sync(lambda: graph_from_onnx_bytes(data, dims=dims, max_ops=max_ops))
    return await onnx_import_pool(limits).import_graph_async(data, dims=dims, max_ops=max_ops)
