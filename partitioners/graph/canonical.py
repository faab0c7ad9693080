"""The canonical form of a graph: operators and tensors in name order.

Two files that list the same operators and tensors in different orders describe one
model. :func:`name_order` is that order; :func:`model_hash` digests the graph in it,
:func:`canonical_graph` renumbers the arrays into it (the graph as it reads back from
storage), and :func:`graph_to_json` writes it as the JSON form that is stored.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, replace
from itertools import chain
from typing import Protocol

import numpy as np
import numpy.typing as npt

from partitioners.graph.hypergraph import (
    OP_ROLE_BACKWARD,
    OP_ROLE_FORWARD,
    OP_ROLE_OPTIMIZER,
    TENSOR_PARAMETER,
    TENSOR_ROLE_GRADIENT,
    TENSOR_ROLE_OPTIMIZER_STATE,
    Hypergraph,
    build_hypergraph,
)
from partitioners.graph.json_import import GraphJson, NodeJson, TensorJson

__all__ = ["NameOrder", "canonical_graph", "graph_to_json", "model_hash", "name_order"]

_HASH_VERSION = b"hyperplace-graph-v1\n"
_OP_ROLE_NAMES = {OP_ROLE_FORWARD: "forward", OP_ROLE_BACKWARD: "backward", OP_ROLE_OPTIMIZER: "optimizer"}
_TENSOR_ROLE_KINDS = {TENSOR_ROLE_GRADIENT: "gradient", TENSOR_ROLE_OPTIMIZER_STATE: "optimizer_state"}


def _name_order(names: np.ndarray) -> np.ndarray:
    """Ids sorted by name: the canonical numbering (names are unique after validation).

    Python's sort on a list of str is C-level and, unlike a fixed-width numpy string
    array, needs no memory proportional to the longest name times the count.
    """
    as_list = names.tolist()
    return np.fromiter(sorted(range(len(as_list)), key=as_list.__getitem__), dtype=np.int64, count=len(as_list))


@dataclass(frozen=True, eq=False)
class NameOrder:
    """The canonical numbering of one graph: its operator and tensor ids in name order.

    Sorting the names is most of what the canonical form costs on a large graph, so it
    is computed once (:func:`name_order`) and handed to :func:`model_hash`,
    :func:`canonical_graph` and :func:`graph_to_json`.

    Attributes
    ----------
    op_order : numpy.ndarray of int64, shape (n_ops,)
        Operator ids sorted by operator name: ``op_order[i]`` becomes operator ``i``.
    tensor_order : numpy.ndarray of int64, shape (n_tensors,)
        Tensor ids sorted by tensor name.
    """

    op_order: np.ndarray
    tensor_order: np.ndarray

    def __post_init__(self) -> None:
        if self.op_order.ndim != 1 or self.tensor_order.ndim != 1:
            raise ValueError("a name order is two 1-D permutations")

    def tensor_rank(self) -> np.ndarray:
        """The inverse of ``tensor_order``: each tensor's canonical id."""
        rank = np.empty(self.tensor_order.shape[0], dtype=np.int64)
        rank[self.tensor_order] = np.arange(self.tensor_order.shape[0], dtype=np.int64)
        return rank


def name_order(graph: Hypergraph) -> NameOrder:
    """The graph's :class:`NameOrder` (operators and tensors sorted by name)."""
    return NameOrder(op_order=_name_order(graph.op_names), tensor_order=_name_order(graph.tensor_names))


def _permute_csr(ptr: np.ndarray, indices: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """CSR rows reordered to ``rows`` (vectorised gather of each row's slice)."""
    lengths = np.diff(ptr)[rows]
    new_ptr = np.zeros(rows.shape[0] + 1, dtype=np.int64)
    np.cumsum(lengths, out=new_ptr[1:])
    gather = np.repeat(ptr[rows] - new_ptr[:-1], lengths) + np.arange(int(new_ptr[-1]), dtype=np.int64)
    return new_ptr, indices[gather]


class _Digest(Protocol):
    """What :func:`_strings_digest` needs of a ``hashlib`` hash object."""

    def update(self, data: bytes, /) -> None: ...


def _strings_digest(h: _Digest, strings: Sequence[str]) -> None:
    """Feed strings unambiguously: their UTF-8 lengths, then their bytes."""
    encoded = [s.encode("utf-8", "surrogatepass") for s in strings]
    h.update(np.fromiter(map(len, encoded), dtype=np.int64, count=len(encoded)).tobytes())
    h.update(b"".join(encoded))


def _optional_strings(values: Sequence[str | None]) -> list[str]:
    # "\x00" cannot start a valid dtype or device name here: it marks "absent"
    return ["\x00" if v is None else v for v in values]


def _declared(roles: np.ndarray | None) -> np.ndarray | None:
    """A role array, or None when it declares nothing (as the JSON form reads it back)."""
    return roles if roles is not None and bool((roles >= 0).any()) else None


def model_hash(graph: Hypergraph, order: NameOrder | None = None) -> str:
    """Content hash (SHA-256, hex) of the canonical graph.

    Operators and tensors are renumbered in name order, so the hash does not depend
    on the order of ``nodes`` and ``tensors`` in the file; weight *values* are never
    part of a :class:`Hypergraph`, so they cannot change it. It covers operator names,
    types, FLOPs, parameter bytes, device restrictions and roles; tensor names, bytes,
    kinds, shapes, dtypes, training roles and the parameter each gradient or optimizer
    state belongs to; and which tensors each operator reads and writes, in argument
    order (``MatMul(a, b)`` differs from ``MatMul(b, a)``). The display name and the
    warnings are left out. Stored plans are keyed by this hash (DESIGN.md, "Plan").

    Parameters
    ----------
    graph : Hypergraph
    order : NameOrder, optional
        ``name_order(graph)``, when the caller has it already.

    Returns
    -------
    str
        64 hexadecimal characters.
    """
    order = order if order is not None else name_order(graph)
    op_order, tensor_order = order.op_order, order.tensor_order
    tensor_rank = order.tensor_rank()

    h = hashlib.sha256(_HASH_VERSION)
    h.update(np.array([graph.n_ops, graph.n_tensors], dtype=np.int64).tobytes())
    # tensors in canonical order
    _strings_digest(h, graph.tensor_names[tensor_order].tolist())
    h.update((graph.tensor_bytes[tensor_order] + 0.0).tobytes())  # + 0.0 folds -0.0 into 0.0
    h.update(graph.tensor_kind[tensor_order].tobytes())
    if graph.tensor_shapes is not None:
        shapes = [graph.tensor_shapes[t] for t in tensor_order.tolist()]
        ranks = np.fromiter((-1 if s is None else len(s) for s in shapes), dtype=np.int64, count=len(shapes))
        try:
            dims = np.fromiter(chain.from_iterable(s for s in shapes if s is not None), dtype=np.int64)
        except TypeError:  # unknown (None) dimensions, from ONNX shape inference
            flat = chain.from_iterable(s for s in shapes if s is not None)
            dims = np.fromiter((-1 if d is None else d for d in flat), dtype=np.int64)
        h.update(b"shapes")
        h.update(ranks.tobytes())
        h.update(dims.tobytes())
    if graph.tensor_dtypes is not None:
        h.update(b"dtypes")
        _strings_digest(h, _optional_strings([graph.tensor_dtypes[t] for t in tensor_order.tolist()]))
    # operators in canonical order, tensor references renumbered
    _strings_digest(h, graph.op_names[op_order].tolist())
    _strings_digest(h, graph.op_types[op_order].tolist())
    h.update((graph.op_flops[op_order] + 0.0).tobytes())
    h.update((graph.op_param_bytes[op_order] + 0.0).tobytes())
    for ptr, indices in ((graph.input_ptr, graph.input_tensors), (graph.output_ptr, graph.output_tensors)):
        new_ptr, new_indices = _permute_csr(ptr, indices, op_order)
        h.update(new_ptr.tobytes())
        h.update(tensor_rank[new_indices].tobytes())
    if graph.op_device_types is not None:
        h.update(b"device_types")
        devices = graph.op_device_types[op_order].tolist()
        _strings_digest(h, ["\x00" if d is None else "\x01".join(d) for d in devices])
    # training roles (absent from graphs that declare none, whose hash they leave as it was)
    op_role = _declared(graph.op_role)
    if op_role is not None:
        h.update(b"op_role")
        h.update(op_role[op_order].tobytes())
    if _declared(graph.tensor_role) is not None and graph.tensor_role is not None and graph.tensor_of is not None:
        h.update(b"tensor_role")
        h.update(graph.tensor_role[tensor_order].tobytes())
        of = graph.tensor_of[tensor_order]
        h.update(np.where(of >= 0, tensor_rank[np.maximum(of, 0)], -1).tobytes())
    if graph.op_time_s is not None:
        h.update(b"time_s")
        _strings_digest(h, list(graph.op_time_keys))
        h.update((graph.op_time_s[op_order] + 0.0).tobytes())
    return h.hexdigest()


def graph_to_json(graph: Hypergraph, order: NameOrder | None = None) -> GraphJson:
    """The canonical JSON form (DESIGN.md "Data shapes"), for storage and display.

    Nodes and tensors are listed in name order; every node carries its ``flops`` (so
    reading it back re-estimates nothing) and ``param_bytes`` only where it differs
    from the parameter tensors it reads; tensors carry ``kind`` only for parameters
    (inputs and activations follow from the structure). ``graph_from_json`` of the
    result gives :func:`canonical_graph` of ``graph``, and so the same :func:`model_hash`.
    ``order`` is ``name_order(graph)`` when the caller has it already.
    """
    order = order if order is not None else name_order(graph)
    op_order, tensor_order = order.op_order, order.tensor_order
    derived = np.zeros(graph.n_ops, dtype=np.float64)
    owners = np.repeat(np.arange(graph.n_ops), np.diff(graph.input_ptr))
    is_param = graph.tensor_kind[graph.input_tensors] == TENSOR_PARAMETER
    np.add.at(derived, owners[is_param], graph.tensor_bytes[graph.input_tensors[is_param]])

    # columns in canonical order, then one comprehension that only assembles dicts
    in_ptr, in_idx = _permute_csr(graph.input_ptr, graph.input_tensors, op_order)
    out_ptr, out_idx = _permute_csr(graph.output_ptr, graph.output_tensors, op_order)
    in_names, out_names = graph.tensor_names[in_idx].tolist(), graph.tensor_names[out_idx].tolist()
    in_bounds, out_bounds = in_ptr.tolist(), out_ptr.tolist()
    nodes: list[NodeJson] = [
        {"name": name, "op": op_type, "inputs": in_names[a:b], "outputs": out_names[c:d], "flops": flops}
        for name, op_type, a, b, c, d, flops in zip(
            graph.op_names[op_order].tolist(),
            graph.op_types[op_order].tolist(),
            in_bounds[:-1],
            in_bounds[1:],
            out_bounds[:-1],
            out_bounds[1:],
            graph.op_flops[op_order].tolist(),
        )
    ]
    params = graph.op_param_bytes[op_order]
    for i in np.flatnonzero(params != derived[op_order]).tolist():
        nodes[i]["param_bytes"] = float(params[i])
    if graph.op_device_types is not None:
        devices = graph.op_device_types[op_order].tolist()
        for i, allowed in enumerate(devices):
            if allowed is not None:
                nodes[i]["device_types"] = list(allowed)
    if graph.op_role is not None:
        roles = graph.op_role[op_order]
        for i in np.flatnonzero(roles >= 0).tolist():
            nodes[i]["role"] = _OP_ROLE_NAMES[int(roles[i])]  # type: ignore[typeddict-item]
    if graph.op_time_s is not None:
        keys = graph.op_time_keys
        for i, row in enumerate(graph.op_time_s[op_order].tolist()):
            given = {k: t for k, t in zip(keys, row) if t == t}  # NaN: not given
            if given:
                nodes[i]["time_s"] = given["*"] if list(given) == ["*"] else given

    sizes = graph.tensor_bytes[tensor_order]
    if sizes.size == 0 or (np.all(sizes == np.floor(sizes)) and sizes.max() < 2**63):
        size_values = sizes.astype(np.int64).tolist()  # integral byte counts print as integers
    else:
        size_values = [int(v) if v.is_integer() else v for v in sizes.tolist()]
    tensors: list[TensorJson] = [
        {"name": name, "bytes": size} for name, size in zip(graph.tensor_names[tensor_order].tolist(), size_values)
    ]
    order_list = tensor_order.tolist()
    if graph.tensor_shapes is not None:
        for i, t in enumerate(order_list):
            if graph.tensor_shapes[t] is not None:
                tensors[i]["shape"] = list(graph.tensor_shapes[t])
    if graph.tensor_dtypes is not None:
        for i, t in enumerate(order_list):
            if graph.tensor_dtypes[t] is not None:
                tensors[i]["dtype"] = graph.tensor_dtypes[t]
    for i in np.flatnonzero(graph.tensor_kind[tensor_order] == TENSOR_PARAMETER).tolist():
        tensors[i]["kind"] = "parameter"
    if graph.tensor_role is not None and graph.tensor_of is not None:
        roles, of = graph.tensor_role[tensor_order], graph.tensor_of[tensor_order]
        for i in np.flatnonzero(roles >= 0).tolist():
            tensors[i]["kind"] = _TENSOR_ROLE_KINDS[int(roles[i])]  # type: ignore[typeddict-item]
            if of[i] >= 0:
                tensors[i]["of"] = str(graph.tensor_names[of[i]])
    doc: GraphJson = {"name": graph.name, "nodes": nodes, "tensors": tensors}
    if graph.warnings:
        doc["warnings"] = list(graph.warnings)
    return doc


def _object_vector(items: Sequence[object]) -> npt.NDArray[np.object_]:
    """A 1-D object array of ``items``, even when they are tuples numpy would stack into 2-D."""
    return np.fromiter(items, dtype=object, count=len(items))


def canonical_graph(graph: Hypergraph, order: NameOrder | None = None) -> Hypergraph:
    """The graph renumbered into name order: what storing it and reading it back gives.

    Planning this rather than the posted order makes a plan made now the plan a worker
    makes from storage (list scheduling breaks ties by operator order), and lets
    feedback and re-plans, which rebuild the graph from storage, replay its schedule.
    It equals ``graph_from_json(graph_to_json(graph))`` (with the warnings kept) field
    for field, built by permuting the arrays instead of writing and re-reading every
    name. The JSON form's normalisations are the same: ``-0.0`` bytes become ``0.0``;
    per-tensor shapes, dtypes and per-operator device types that are all absent become
    None; ``param_bytes`` equal to the parameter tensors an operator reads is derived.

    Parameters
    ----------
    graph : Hypergraph
    order : NameOrder, optional
        ``name_order(graph)``, when the caller has it already.

    Returns
    -------
    Hypergraph
        Operator ``i`` is ``graph``'s ``order.op_order[i]``, tensor ``j`` its
        ``order.tensor_order[j]``.
    """
    order = order if order is not None else name_order(graph)
    ops, tensors = order.op_order, order.tensor_order
    rank = order.tensor_rank()
    in_ptr, in_ids = _permute_csr(graph.input_ptr, graph.input_tensors, ops)
    out_ptr, out_ids = _permute_csr(graph.output_ptr, graph.output_tensors, ops)
    tensor_list = tensors.tolist()

    shapes = None
    if graph.tensor_shapes is not None:
        listed_shapes = [graph.tensor_shapes[t] for t in tensor_list]
        if any(s is not None for s in listed_shapes):
            shapes = [None if s is None else tuple(s) for s in listed_shapes]
    listed_dtypes = (
        [graph.tensor_dtypes[t] for t in tensor_list] if graph.tensor_dtypes is not None else [None] * len(tensor_list)
    )
    # the JSON reader keeps a dtype column unless every entry of a non-empty one is absent
    dtypes = None if listed_dtypes and all(d is None for d in listed_dtypes) else listed_dtypes
    op_role, tensor_role, tensor_of = _declared(graph.op_role), _declared(graph.tensor_role), None
    if tensor_role is not None and graph.tensor_of is not None:
        of = graph.tensor_of[tensors]
        tensor_of = np.where(of >= 0, rank[np.maximum(of, 0)], -1)
        tensor_role = tensor_role[tensors]
    devices = None
    if graph.op_device_types is not None:
        listed_devices = graph.op_device_types[ops].tolist()
        if any(d is not None for d in listed_devices):
            devices = _object_vector([None if d is None else tuple(d) for d in listed_devices])

    canonical = build_hypergraph(
        name=graph.name,
        op_names=graph.op_names[ops],
        op_types=graph.op_types[ops],
        op_flops=graph.op_flops[ops],
        input_ptr=in_ptr,
        input_tensors=rank[in_ids],
        output_ptr=out_ptr,
        output_tensors=rank[out_ids],
        tensor_names=graph.tensor_names[tensors],
        tensor_bytes=graph.tensor_bytes[tensors] + 0.0,  # + 0.0 folds -0.0, as the JSON form's integers do
        tensor_is_parameter=graph.tensor_kind[tensors] == TENSOR_PARAMETER,
        tensor_shapes=shapes,
        tensor_dtypes=dtypes,
        warnings=list(graph.warnings),
        op_device_types=devices,
        op_role=None if op_role is None else op_role[ops],
        tensor_role=tensor_role,
        tensor_of=tensor_of,
    )
    # param_bytes the JSON form writes (where they differ from the parameter tensors read)
    given = graph.op_param_bytes[ops]
    differs = given != canonical.op_param_bytes
    canonical.op_param_bytes[differs] = given[differs]
    if graph.op_time_s is not None:
        canonical = replace(canonical, op_time_s=graph.op_time_s[ops], op_time_keys=graph.op_time_keys)
    return canonical
