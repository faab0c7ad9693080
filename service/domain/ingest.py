"""Graph and inventory ingestion: request documents -> partitioner structures + hashes.

Pure functions over what the request carried; the partitioners do the
validation and raise ``InvalidInput`` with the field and reason, which the API
answers as 422 (or 413 for size limits).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cached_property

from partitioners.errors import InputTooLarge, InvalidInput
from partitioners.graph.canonical import NameOrder, canonical_graph, graph_to_json, model_hash, name_order
from partitioners.graph.hypergraph import Hypergraph, graph_summary
from partitioners.graph.json_import import graph_from_json
from partitioners.hardware.inventory import PRESETS, Inventory, inventory_from_json, inventory_hash, inventory_to_json
from service.domain.onnx_worker import ImportLimits, import_onnx_graph, import_onnx_graph_async

__all__ = [
    "IngestedGraph",
    "IngestedInventory",
    "canonical_hash",
    "ingest_inventory",
    "ingest_json_graph",
    "ingest_onnx_graph",
    "ingested_onnx_graph",
    "import_onnx_model",
    "read_stored_graph",
]


@dataclass(frozen=True, eq=False)
class IngestedGraph:
    """A graph as a request brought it, with its hash and its canonical (name) order.

    The name order is sorted once, here, and serves the hash, the graph planned
    (:meth:`as_stored`, a permutation of the arrays) and the document stored
    (:meth:`canonical_document`): no graph is written out and read back to be planned.
    """

    graph: Hypergraph
    model_hash: str
    source_format: str
    order: NameOrder | None = None  # None: ``graph`` is already in name order (read from storage)

    @classmethod
    def of(cls, graph: Hypergraph, source_format: str) -> IngestedGraph:
        """Hash a freshly ingested graph, sorting its names once."""
        order = name_order(graph)
        return cls(graph=graph, model_hash=model_hash(graph, order), source_format=source_format, order=order)

    @property
    def summary(self) -> dict:
        return graph_summary(self.graph)

    def canonical_document(self) -> dict:
        """The JSON form that is stored: nodes and tensors in name order."""
        return graph_to_json(self.graph, self.order)

    @cached_property
    def _stored(self) -> Hypergraph:
        return self.graph if self.order is None else canonical_graph(self.graph, self.order)

    def as_stored(self) -> Hypergraph:
        """The graph as it reads back from storage (name order), keeping the ingest warnings.

        Planning this rather than the posted order makes a plan made now the plan a
        worker would make from storage, and lets feedback and re-plans, which rebuild
        the graph from storage, replay its schedule: list scheduling breaks ties by
        operator order. Made by permutation (:func:`~partitioners.graph.canonical.canonical_graph`).
        """
        return self._stored


def read_stored_graph(canonical: dict, model_hash_hex: str, source_format: str) -> IngestedGraph:
    """A stored graph's canonical document read back (already in name order, hash known)."""
    return IngestedGraph(graph=graph_from_json(canonical), model_hash=model_hash_hex, source_format=source_format)


@dataclass(frozen=True)
class IngestedInventory:
    inventory: Inventory
    inventory_hash: str

    def canonical_document(self) -> dict:
        return inventory_to_json(self.inventory)


def canonical_hash(document: object) -> str:
    """sha256 of a JSON document with sorted keys: same content, same hash."""
    return hashlib.sha256(json.dumps(document, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def _storable_text(graph: Hypergraph) -> Hypergraph:
    """Reject names a database cannot store: NUL (PostgreSQL text and JSONB refuse it) or
    unpaired surrogates (not encodable as UTF-8). One pass over the joined names."""
    pieces = [
        graph.name,
        *graph.op_names.tolist(),
        *graph.op_types.tolist(),
        *graph.tensor_names.tolist(),
        *graph.warnings,
    ]
    pieces += [d for d in (graph.tensor_dtypes or ()) if isinstance(d, str)]
    pieces += [d for shape in (graph.tensor_shapes or ()) if shape for d in shape if isinstance(d, str)]
    if graph.op_device_types is not None:
        pieces += [t for types in graph.op_device_types.tolist() if types for t in types if isinstance(t, str)]
    if _unstorable("\n".join(pieces)):
        culprit = next(piece for piece in pieces if _unstorable(piece))
        raise InvalidInput(
            f"The name {culprit!r} holds a NUL character or an unpaired surrogate; names must be plain UTF-8 text.",
            field="graph",
            code="bad-name",
        )
    return graph


def _unstorable(text: str) -> bool:
    if "\x00" in text:
        return True
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def ingest_json_graph(document: dict, *, max_ops: int) -> IngestedGraph:
    graph = _storable_text(graph_from_json(document, max_ops=max_ops, max_tensors=4 * max_ops))
    return IngestedGraph.of(graph, "json")


def ingest_onnx_graph(
    data: bytes, *, dims: dict[str, int], max_ops: int, memory_bytes: int | None = None
) -> IngestedGraph:
    """Import ONNX bytes in a memory-capped worker process (:mod:`service.domain.onnx_worker`), from a thread.

    ONNX shape inference can be made to allocate without bound, in C++, by a model of
    a few hundred bytes; in a worker that only fails the request (413). ``memory_bytes``
    is the cap, by default the running app's HYPERPLACE_ONNX_IMPORT_MEMORY_BYTES.
    """
    _not_empty(data)
    with _naming_the_limit():
        graph = import_onnx_graph(data, dims=dims, max_ops=max_ops, memory_bytes=memory_bytes)
    return ingested_onnx_graph(graph)


async def import_onnx_model(
    data: bytes, *, dims: dict[str, int], max_ops: int, limits: ImportLimits | None = None
) -> Hypergraph:
    """:func:`ingest_onnx_graph`'s import for a coroutine: it waits for a worker and for the
    import on the event loop, holding no thread, and cancelling it kills the import.
    :func:`ingested_onnx_graph` (CPU work: run it in a thread) makes the result an :class:`IngestedGraph`."""
    _not_empty(data)
    with _naming_the_limit():
        return await import_onnx_graph_async(data, dims=dims, max_ops=max_ops, limits=limits)


def ingested_onnx_graph(graph: Hypergraph) -> IngestedGraph:
    """An imported ONNX graph, its names checked and hashed."""
    return IngestedGraph.of(_storable_text(graph), "onnx")


def _not_empty(data: bytes) -> None:
    if not data:
        raise InvalidInput("The ONNX part is empty; send the model file's bytes.", field="model", code="malformed-onnx")


@contextmanager
def _naming_the_limit() -> Iterator[None]:
    """The importer's operator limit is this service's HYPERPLACE_MAX_GRAPH_OPS: say so."""
    try:
        yield
    except InputTooLarge as exc:
        if exc.code == "too-many-ops" and "HYPERPLACE_MAX_GRAPH_OPS" not in exc.detail:
            exc.detail = f"{exc.detail} (HYPERPLACE_MAX_GRAPH_OPS)"
        raise


def _declared_devices(document: dict) -> int:
    """Devices an inventory document asks for, counted before anything is expanded."""
    if not isinstance(document, dict):
        return 0
    preset = document.get("preset")
    if isinstance(preset, str) and preset in PRESETS:
        nodes = document.get("nodes", 1)
        return PRESETS[preset]["devices_per_group"] * nodes if isinstance(nodes, int) else 0
    groups = document.get("groups")
    if not isinstance(groups, list):
        return 0
    return sum(len(g.get("devices") or []) if isinstance(g, dict) else 0 for g in groups)


def ingest_inventory(document: dict, *, max_devices: int | None = None) -> IngestedInventory:
    """Validate and hash an inventory; over ``max_devices`` devices is a 413 before it is built.

    Planning cost grows with the square of the device count (link tables), so the
    service bounds it (``HYPERPLACE_MAX_PLAN_DEVICES``) rather than run out of memory.
    """
    if max_devices is not None:
        declared = _declared_devices(document)
        if declared > max_devices:
            raise InputTooLarge(
                f"The inventory has {declared} devices; this service plans on at most {max_devices} "
                "(HYPERPLACE_MAX_PLAN_DEVICES). Plan on a smaller slice of the cluster.",
                field="inventory",
            )
    inventory = inventory_from_json(document)
    return IngestedInventory(inventory=inventory, inventory_hash=inventory_hash(inventory))
