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
"""

from __future__ import annotations

import multiprocessing
import os
import queue
import signal
import threading
from collections.abc import Iterator, Mapping
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from contextlib import contextmanager

import onnx

from partitioners.errors import InputTooLarge, InvalidInput
from partitioners.graph.hypergraph import Hypergraph
from partitioners.graph.onnx_import import graph_from_onnx_bytes
from service.settings import get_settings

__all__ = [
    "IMPORT_WORKERS",
    "OnnxImportPool",
    "import_onnx_graph",
    "onnx_import_pool",
    "serving_onnx_imports",
]

#: ONNX imports that run at once per server process; more wait for a free worker.
#: Each may take HYPERPLACE_ONNX_IMPORT_MEMORY_BYTES, so this bounds their memory too.
IMPORT_WORKERS = 2


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

    def started(self, memory_bytes: int) -> ProcessPoolExecutor:
        if self.executor is None:
            self.executor = ProcessPoolExecutor(
                max_workers=1,
                mp_context=multiprocessing.get_context("spawn"),
                initializer=_start_worker,
                initargs=(memory_bytes,),
            )
        return self.executor

    def stop(self, *, wait: bool = False) -> None:
        if self.executor is not None:
            self.executor.shutdown(wait=wait, cancel_futures=True)
            self.executor = None


class OnnxImportPool:
    """Up to ``workers`` ONNX imports at once, each in its own address-space-capped process.

    Parameters
    ----------
    memory_bytes : int
        Address space one import may use on top of its worker's start-up footprint.
    workers : int
        Imports that run at once; more wait for a free worker.
    """

    def __init__(self, memory_bytes: int, workers: int = IMPORT_WORKERS) -> None:
        if memory_bytes <= 0 or workers < 1:
            raise ValueError("an import pool needs a positive memory cap and at least one worker")
        self.memory_bytes = memory_bytes
        self._slots = [_Slot() for _ in range(workers)]
        self._free: queue.SimpleQueue[_Slot] = queue.SimpleQueue()
        for slot in self._slots:
            self._free.put(slot)

    @contextmanager
    def _slot(self) -> Iterator[_Slot]:
        slot = self._free.get()
        try:
            yield slot
        finally:
            self._free.put(slot)

    def import_graph(self, data: bytes, *, dims: Mapping[str, int], max_ops: int | None) -> Hypergraph:
        """:func:`~partitioners.graph.onnx_import.graph_from_onnx_bytes` in a worker.

        Raises
        ------
        InvalidInput, InputTooLarge
            What the importer raises, unchanged; and ``InputTooLarge``
            (``import-memory``, 413) when the import needs more memory than the cap,
            ``InvalidInput`` (``import-crashed``, 422) when the model killed its worker.

        A worker that dies is replaced and the import tried once more in a fresh one:
        a worker can die of something else (killed while idle, by an operator, by the
        host's OOM killer), but a model that kills two in a row is the cause.
        """
        with self._slot() as slot:
            for _ in range(2):
                try:
                    return slot.started(self.memory_bytes).submit(_import_in_worker, data, dims, max_ops).result()
                except BrokenProcessPool:
                    slot.stop()
                except MemoryError:  # the importer lets it through (partitioners.graph.onnx_import._infer)
                    slot.stop()  # the next import starts in a fresh address space
                    raise InputTooLarge(
                        f"Importing this model needs more than {_amount(self.memory_bytes)} of memory, the most one "
                        "ONNX import may use here (HYPERPLACE_ONNX_IMPORT_MEMORY_BYTES). Split the model, or make "
                        "its shapes stop growing from operator to operator (Gather(x, x) repeated doubles the rank "
                        "each time, and ONNX shape inference follows it).",
                        field="model",
                        code="import-memory",
                    ) from None
        raise InvalidInput(
            "Importing this model killed the worker process running it, twice. Running out of the memory one ONNX "
            f"import may use here ({_amount(self.memory_bytes)}, HYPERPLACE_ONNX_IMPORT_MEMORY_BYTES) does this, "
            "as ONNX's shape inference does not always survive it; so does a model that crashes ONNX.",
            field="model",
            code="import-crashed",
        )

    def close(self) -> None:
        """Stop the workers once the imports running in them finish; a later import starts new ones."""
        taken = [self._free.get() for _ in self._slots]
        for slot in taken:
            slot.stop(wait=True)
        for slot in taken:
            self._free.put(slot)


# ------------------------------------------------ one pool per cap, per process

_registry_lock = threading.Lock()
_pools: dict[int, OnnxImportPool] = {}
#: Caps of the apps whose lifespan is running, the latest last: the default cap.
_serving: list[int] = []


def onnx_import_pool(memory_bytes: int) -> OnnxImportPool:
    """The process's pool for this cap, created on first use."""
    with _registry_lock:
        pool = _pools.get(memory_bytes)
        if pool is None:
            pool = _pools[memory_bytes] = OnnxImportPool(memory_bytes)
        return pool


@contextmanager
def serving_onnx_imports(memory_bytes: int) -> Iterator[None]:
    """An app's lifespan: its cap is the default while it runs; its pool stops with the last app using it.

    Tests run several apps in one process, each with its own settings; a server runs one.
    """
    with _registry_lock:
        _serving.append(memory_bytes)
    try:
        yield
    finally:
        with _registry_lock:
            _serving.remove(memory_bytes)
            pool = _pools.pop(memory_bytes, None) if memory_bytes not in _serving else None
        if pool is not None:
            pool.close()


def import_onnx_graph(
    data: bytes, *, dims: Mapping[str, int], max_ops: int | None, memory_bytes: int | None = None
) -> Hypergraph:
    """Import ONNX bytes in a memory-capped worker (see the module docstring).

    Parameters
    ----------
    memory_bytes : int, optional
        The cap; default: the running app's ``onnx_import_memory_bytes``, else the
        environment's (the CLI). 0 imports in this process, without a cap.
    """
    if memory_bytes is None:
        with _registry_lock:
            memory_bytes = _serving[-1] if _serving else None
        if memory_bytes is None:
            memory_bytes = get_settings().onnx_import_memory_bytes
    if memory_bytes == 0:
        return graph_from_onnx_bytes(data, dims=dims, max_ops=max_ops)
    return onnx_import_pool(memory_bytes).import_graph(data, dims=dims, max_ops=max_ops)
