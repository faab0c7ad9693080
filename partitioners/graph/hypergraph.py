"""The computation graph as a hypergraph held in numpy arrays.

Every tensor is a *net* spanning its producer and all of its consumers: a tensor
read by three operators on a remote device crosses the link once, not three times
(see DESIGN.md, "Why a hypergraph"). Everything downstream (cost model,
simulator, partitioners) reads this one structure.

Operators and tensors are numbered ``0..n-1``. Relations are CSR arrays:

* ``input_ptr``/``input_tensors``: operator -> tensors it reads,
* ``output_ptr``/``output_tensors``: operator -> tensors it writes,
* ``consumer_ptr``/``consumer_ops``: tensor -> operators that read it,
* ``tensor_producer``: tensor -> producing operator, ``-1`` for graph inputs and
  parameters.

Names are kept in numpy object arrays so nothing that scales with graph size is a
per-node Python object with attributes.
"""

from __future__ import annotations

import difflib
import hashlib
from dataclasses import dataclass, field
from itertools import chain

import numpy as np

from partitioners.errors import InputTooLarge, InvalidInput
from partitioners.graph.flops import estimate_flops

__all__ = [
    "MAX_OP_FLOPS",
    "MAX_TENSOR_BYTES",
    "TENSOR_ACTIVATION",
    "TENSOR_INPUT",
    "TENSOR_PARAMETER",
    "Hypergraph",
    "build_hypergraph",
    "csr_from_lists",
    "graph_from_json",
    "graph_from_ops",
    "graph_summary",
    "graph_to_json",
    "model_hash",
    "op_levels",
    "topological_order",
]

#: A tensor produced by an operator.
TENSOR_ACTIVATION = 0
#: A tensor with no producer that is fed at run time (a graph input).
TENSOR_INPUT = 1
#: A tensor with no producer that stays resident (weights): counted in memory once
#: per device that reads it.
TENSOR_PARAMETER = 2


@dataclass(frozen=True, eq=False)
class Hypergraph:
    """An operator graph whose tensors are hyperedges.

    Attributes
    ----------
    name : str
        Model name, for display only (not part of the model hash).
    op_names, op_types : numpy.ndarray of object (str), shape (n_ops,)
    op_flops : numpy.ndarray of float64, shape (n_ops,)
        Floating-point operations of one execution of the operator.
    op_param_bytes : numpy.ndarray of float64, shape (n_ops,)
        Bytes of parameter tensors the operator reads.
    tensor_names : numpy.ndarray of object (str), shape (n_tensors,)
    tensor_bytes : numpy.ndarray of float64, shape (n_tensors,)
    tensor_kind : numpy.ndarray of int8, shape (n_tensors,)
        One of ``TENSOR_ACTIVATION``, ``TENSOR_INPUT``, ``TENSOR_PARAMETER``.
    tensor_producer : numpy.ndarray of int64, shape (n_tensors,)
        Producing operator, or -1.
    input_ptr, input_tensors, output_ptr, output_tensors, consumer_ptr, consumer_ops
        CSR relations described in the module docstring.
    tensor_shapes, tensor_dtypes : list or None
        Optional per-tensor shape tuples and dtype names (ingestion keeps them for
        hashing and display; algorithms never need them).
    warnings : list of str
        What ingestion estimated or simplified (unknown operator types, opaque
        subgraphs), for the caller to show.
    op_device_types : numpy.ndarray of object or None, shape (n_ops,)
        Per operator, a tuple of device type names it may run on, or None for any;
        None for the whole graph when no operator is restricted.
    """

    name: str
    op_names: np.ndarray
    op_types: np.ndarray
    op_flops: np.ndarray
    op_param_bytes: np.ndarray
    tensor_names: np.ndarray
    tensor_bytes: np.ndarray
    tensor_kind: np.ndarray
    tensor_producer: np.ndarray
    input_ptr: np.ndarray
    input_tensors: np.ndarray
    output_ptr: np.ndarray
    output_tensors: np.ndarray
    consumer_ptr: np.ndarray
    consumer_ops: np.ndarray
    tensor_shapes: list | None = None
    tensor_dtypes: list | None = None
    warnings: list[str] = field(default_factory=list)
    op_device_types: np.ndarray | None = None

    @property
    def n_ops(self) -> int:
        return int(self.op_names.shape[0])

    @property
    def n_tensors(self) -> int:
        return int(self.tensor_names.shape[0])

    def inputs_of(self, op: int) -> np.ndarray:
        """Tensor ids read by operator ``op``."""
        return self.input_tensors[self.input_ptr[op] : self.input_ptr[op + 1]]

    def outputs_of(self, op: int) -> np.ndarray:
        """Tensor ids written by operator ``op``."""
        return self.output_tensors[self.output_ptr[op] : self.output_ptr[op + 1]]

    def consumers_of(self, tensor: int) -> np.ndarray:
        """Operator ids that read ``tensor``."""
        return self.consumer_ops[self.consumer_ptr[tensor] : self.consumer_ptr[tensor + 1]]

    def op_output_bytes(self) -> np.ndarray:
        """Bytes each operator writes (sum over its output tensors)."""
        sums = np.zeros(self.n_ops, dtype=np.float64)
        owners = np.repeat(np.arange(self.n_ops), np.diff(self.output_ptr))
        np.add.at(sums, owners, self.tensor_bytes[self.output_tensors])
        return sums

    def op_input_bytes(self) -> np.ndarray:
        """Bytes each operator reads (sum over its input tensors, parameters included)."""
        sums = np.zeros(self.n_ops, dtype=np.float64)
        owners = np.repeat(np.arange(self.n_ops), np.diff(self.input_ptr))
        np.add.at(sums, owners, self.tensor_bytes[self.input_tensors])
        return sums

    def op_edges(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Producer -> consumer operator pairs with the tensor that links them.

        Returns ``(src_ops, dst_ops, tensors)``; a tensor read by k operators gives k
        pairs, so use the tensor ids when counting communication (hypergraph
        semantics), not the pairs.
        """
        counts = np.diff(self.consumer_ptr)
        tensors = np.repeat(np.arange(self.n_tensors), counts)
        src = self.tensor_producer[tensors]
        keep = src >= 0
        return src[keep], self.consumer_ops[keep], tensors[keep]


def csr_from_lists(lists: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
    """CSR ``(ptr, indices)`` from a list of integer lists (for small, hand-built graphs)."""
    lengths = np.fromiter((len(x) for x in lists), dtype=np.int64, count=len(lists))
    ptr = np.zeros(len(lists) + 1, dtype=np.int64)
    np.cumsum(lengths, out=ptr[1:])
    flat = np.fromiter((i for x in lists for i in x), dtype=np.int64, count=int(ptr[-1]))
    return ptr, flat


def _invert_csr(ptr: np.ndarray, indices: np.ndarray, n_targets: int) -> tuple[np.ndarray, np.ndarray]:
    """Transpose a CSR relation rows -> targets into targets -> rows (stable by row)."""
    rows = np.repeat(np.arange(ptr.shape[0] - 1, dtype=np.int64), np.diff(ptr))
    order = np.argsort(indices, kind="stable")
    counts = np.bincount(indices, minlength=n_targets)
    out_ptr = np.zeros(n_targets + 1, dtype=np.int64)
    np.cumsum(counts, out=out_ptr[1:])
    return out_ptr, rows[order]


def build_hypergraph(
    *,
    name: str,
    op_names: np.ndarray,
    op_types: np.ndarray,
    op_flops: np.ndarray,
    input_ptr: np.ndarray,
    input_tensors: np.ndarray,
    output_ptr: np.ndarray,
    output_tensors: np.ndarray,
    tensor_names: np.ndarray,
    tensor_bytes: np.ndarray,
    tensor_is_parameter: np.ndarray | None = None,
    op_param_bytes: np.ndarray | None = None,
    tensor_shapes: list | None = None,
    tensor_dtypes: list | None = None,
    warnings: list[str] | None = None,
    op_device_types: np.ndarray | None = None,
) -> Hypergraph:
    """Assemble a :class:`Hypergraph` from operator->tensor CSR relations.

    Derives producers, consumers, tensor kinds and (when not given) parameter bytes
    per operator with vectorised passes. Assumes each tensor has at most one
    producer; validation (``partitioners.graph.hypergraph`` callers) checks that first.
    """
    n_ops = len(op_names)
    n_tensors = len(tensor_names)
    input_ptr = np.asarray(input_ptr, dtype=np.int64)
    input_tensors = np.asarray(input_tensors, dtype=np.int64)
    output_ptr = np.asarray(output_ptr, dtype=np.int64)
    output_tensors = np.asarray(output_tensors, dtype=np.int64)
    tensor_bytes = np.asarray(tensor_bytes, dtype=np.float64)

    producer = np.full(n_tensors, -1, dtype=np.int64)
    producer[output_tensors] = np.repeat(np.arange(n_ops, dtype=np.int64), np.diff(output_ptr))

    kind = np.full(n_tensors, TENSOR_INPUT, dtype=np.int8)
    kind[producer >= 0] = TENSOR_ACTIVATION
    if tensor_is_parameter is not None:
        kind[np.asarray(tensor_is_parameter, dtype=bool) & (producer < 0)] = TENSOR_PARAMETER

    consumer_ptr, consumer_ops = _invert_csr(input_ptr, input_tensors, n_tensors)

    if op_param_bytes is None:
        op_param_bytes = np.zeros(n_ops, dtype=np.float64)
        owners = np.repeat(np.arange(n_ops), np.diff(input_ptr))
        is_param = kind[input_tensors] == TENSOR_PARAMETER
        np.add.at(op_param_bytes, owners[is_param], tensor_bytes[input_tensors[is_param]])

    return Hypergraph(
        name=name,
        op_names=np.asarray(op_names, dtype=object),
        op_types=np.asarray(op_types, dtype=object),
        op_flops=np.asarray(op_flops, dtype=np.float64),
        op_param_bytes=np.asarray(op_param_bytes, dtype=np.float64),
        tensor_names=np.asarray(tensor_names, dtype=object),
        tensor_bytes=tensor_bytes,
        tensor_kind=kind,
        tensor_producer=producer,
        input_ptr=input_ptr,
        input_tensors=input_tensors,
        output_ptr=output_ptr,
        output_tensors=output_tensors,
        consumer_ptr=consumer_ptr,
        consumer_ops=consumer_ops,
        tensor_shapes=tensor_shapes,
        tensor_dtypes=tensor_dtypes,
        warnings=list(warnings or []),
        op_device_types=op_device_types,
    )


def graph_from_ops(
    name: str,
    ops: list[tuple[str, str, float, list[str], list[str]]],
    tensor_bytes: dict[str, float],
    parameters: set[str] | frozenset[str] = frozenset(),
) -> Hypergraph:
    """Small-graph convenience: ``ops`` as ``(name, op_type, flops, inputs, outputs)``.

    Meant for tests and examples with a handful of operators; ingestion of real
    graphs goes through the JSON/ONNX importers.
    """
    tensor_names = list(tensor_bytes)
    tensor_index = {t: i for i, t in enumerate(tensor_names)}
    in_ptr, in_idx = csr_from_lists([[tensor_index[t] for t in op[3]] for op in ops])
    out_ptr, out_idx = csr_from_lists([[tensor_index[t] for t in op[4]] for op in ops])
    return build_hypergraph(
        name=name,
        op_names=np.array([op[0] for op in ops], dtype=object),
        op_types=np.array([op[1] for op in ops], dtype=object),
        op_flops=np.array([op[2] for op in ops], dtype=np.float64),
        input_ptr=in_ptr,
        input_tensors=in_idx,
        output_ptr=out_ptr,
        output_tensors=out_idx,
        tensor_names=np.array(tensor_names, dtype=object),
        tensor_bytes=np.array([tensor_bytes[t] for t in tensor_names], dtype=np.float64),
        tensor_is_parameter=np.array([t in parameters for t in tensor_names], dtype=bool),
    )


#: Levels at most this wide are processed with Python lists (see _levels_and_order).
_NARROW_LEVEL = 32


def _successor_csr(graph: Hypergraph) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Operator -> successor operators as CSR, plus in-degrees (edge multiplicity kept).

    An operator reading two outputs of the same producer counts that producer twice in
    its in-degree and appears twice in the producer's successor list; Kahn's algorithm
    is indifferent to that as long as both sides count the same way.
    """
    src, dst, _ = graph.op_edges()
    n = graph.n_ops
    order = np.argsort(src, kind="stable")
    succ = dst[order]
    ptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(src, minlength=n), out=ptr[1:])
    indegree = np.bincount(dst, minlength=n).astype(np.int64)
    return ptr, succ, indegree


def _cycle_through(graph: Hypergraph, unfinished: np.ndarray) -> list[int]:
    """A cycle among the operators Kahn's algorithm could not finish.

    Every unfinished operator has an unfinished predecessor, so walking predecessors
    from any of them must revisit one: the revisited stretch is a cycle. Runs only on
    the error path.
    """
    alive = np.zeros(graph.n_ops, dtype=bool)
    alive[unfinished] = True
    src, dst, _ = graph.op_edges()
    keep = alive[src] & alive[dst]
    src, dst = src[keep], dst[keep]
    order = np.argsort(dst, kind="stable")
    pred_of = np.full(graph.n_ops, -1, dtype=np.int64)
    # any one live predecessor per live operator is enough to walk backwards
    pred_of[dst[order][::-1]] = src[order][::-1]
    seen: dict[int, int] = {}
    path: list[int] = []
    v = int(unfinished[0])
    while v not in seen:
        seen[v] = len(path)
        path.append(v)
        v = int(pred_of[v])
    cycle = path[seen[v] :]
    cycle.reverse()  # walked against the edges; report in data-flow direction
    return cycle


def _levels_and_order(graph: Hypergraph) -> tuple[np.ndarray, np.ndarray]:
    """Kahn's algorithm one level (antichain) at a time.

    The frontier is every operator whose producers have all been emitted; its
    successors lose one in-degree per edge, and those reaching zero form the next
    frontier. The level at which an operator is emitted is its longest-path depth
    from a source (Kahn, 1962, processed breadth-first). Wide levels are processed
    with a constant number of numpy calls; narrow ones (chains, the common case in
    deep sequential models) with a short Python loop over plain lists, whose cost per
    edge is below the fixed cost of a numpy call. So both a 10^6-operator graph 18
    wide and a 10^6-operator chain take about a second.
    """
    n = graph.n_ops
    ptr, succ, indegree = _successor_csr(graph)
    levels = np.full(n, -1, dtype=np.int64)
    order = np.empty(n, dtype=np.int64)
    frontier = np.flatnonzero(indegree == 0)
    depth = 0
    emitted = 0
    ptr_list: list[int] | None = None
    while frontier.size:
        size = frontier.size
        order[emitted : emitted + size] = frontier
        levels[frontier] = depth
        emitted += size
        depth += 1
        if size > _NARROW_LEVEL:
            starts = ptr[frontier]
            counts = ptr[frontier + 1] - starts
            offsets = np.repeat(starts - np.cumsum(counts) + counts, counts)
            nxt = succ[offsets + np.arange(int(counts.sum()))]
            np.subtract.at(indegree, nxt, 1)
            nxt = np.unique(nxt)
            frontier = nxt[indegree[nxt] == 0]
            continue
        # narrow stretch: plain Python lists until the graph widens again
        if ptr_list is None:
            ptr_list, succ_list, indegree_list = ptr.tolist(), succ.tolist(), indegree.tolist()
        else:
            indegree_list = indegree.tolist()
        current = frontier.tolist()
        stretch: list[list[int]] = []
        while current and len(current) <= _NARROW_LEVEL:
            ready = []
            for v in current:
                for w in succ_list[ptr_list[v] : ptr_list[v + 1]]:
                    indegree_list[w] -= 1
                    if indegree_list[w] == 0:
                        ready.append(w)
            ready.sort()
            stretch.append(ready)
            current = ready
        stretch.pop()  # == current: becomes the next frontier
        if stretch:
            flat = np.fromiter(chain.from_iterable(stretch), dtype=np.int64)
            lengths = np.fromiter(map(len, stretch), dtype=np.int64, count=len(stretch))
            order[emitted : emitted + flat.size] = flat
            levels[flat] = depth + np.repeat(np.arange(len(stretch), dtype=np.int64), lengths)
            emitted += flat.size
            depth += len(stretch)
        indegree = np.array(indegree_list, dtype=np.int64)
        frontier = np.array(current, dtype=np.int64)
    if emitted < n:
        cycle = _cycle_through(graph, np.flatnonzero(levels < 0))
        names = [str(graph.op_names[v]) for v in cycle[:8]]
        shown = " -> ".join(names + [names[0]] if len(cycle) <= 8 else names + ["..."])
        raise InvalidInput(
            f"the graph has a cycle: operator '{names[0]}' depends on its own output "
            f"({shown}); break the cycle or split the loop into an opaque operator",
            field="nodes",
            code="cycle",
        )
    return order, levels


def topological_order(graph: Hypergraph) -> np.ndarray:
    """Operator ids such that every producer comes before all of its consumers.

    Parameters
    ----------
    graph : Hypergraph

    Returns
    -------
    numpy.ndarray of int64, shape (n_ops,)
        Operators level by level (see :func:`op_levels`), ascending id within a level,
        so the order is deterministic and independent of how edges were listed.

    Raises
    ------
    InvalidInput
        ``code="cycle"``, naming an operator on the cycle and the cycle itself.

    References
    ----------
    A. B. Kahn, "Topological sorting of large networks", CACM 5(11), 1962.
    """
    return _levels_and_order(graph)[0]


def op_levels(graph: Hypergraph) -> np.ndarray:
    """Longest-path depth of each operator: 0 for operators fed only by graph inputs.

    Operators on the same level never depend on each other, so the level count is
    the critical path length in operators and ``n_ops / n_levels`` a rough measure of
    the parallelism a placement can exploit.

    Returns
    -------
    numpy.ndarray of int64, shape (n_ops,)

    Raises
    ------
    InvalidInput
        ``code="cycle"`` as :func:`topological_order`.
    """
    return _levels_and_order(graph)[1]


# --------------------------------------------------------------------------------------
# JSON ingestion
# --------------------------------------------------------------------------------------

_TENSOR_KINDS = {None: -1, "activation": TENSOR_ACTIVATION, "input": TENSOR_INPUT, "parameter": TENSOR_PARAMETER}
_NUMBER_TYPES = frozenset({int, float})
#: The fields of the JSON graph form (DESIGN.md, "Data shapes"); any other is a typo
#: that would otherwise be ignored. ``warnings`` is what :func:`graph_to_json` carries.
_GRAPH_FIELDS = ("name", "nodes", "tensors", "warnings")
_NODE_FIELDS = ("name", "op", "inputs", "outputs", "flops", "param_bytes", "device_types")
_TENSOR_FIELDS = ("name", "bytes", "shape", "dtype", "kind")
_OPTIONAL_NUMBER_TYPES = frozenset({int, float, type(None)})
#: Bytes per element assumed when an operator has neither flops nor shapes and its
#: work is estimated from its output bytes (float32, the ONNX export default).
_FALLBACK_ELEMENT_BYTES = 4.0
_FLOAT_MAX = float(np.finfo(np.float64).max)
#: Shape dimensions are hashed and multiplied as int64.
_MAX_DIM = 2**63 - 1
#: Largest tensor (and operator parameter size) accepted: 1 PiB, far above any
#: accelerator's memory, so only a mistake reaches it; sums over a graph stay finite.
MAX_TENSOR_BYTES = 2**50
#: Largest FLOP count of one operator: 1e24, three times GPT-3's whole training run
#: (3.14e23 FLOPs, Brown et al. 2020, Table D.1); the backward pass and micro-batches
#: multiply it, and 1.7e308 FLOPs doubled is infinite.
MAX_OP_FLOPS = 1e24


def _types(values: list) -> set[type]:
    return set(map(type, values))


def _describe(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _raise_entry_problem(nodes: list, tensors: list) -> None:
    """Find and raise the first malformed entry, with its exact field path.

    The fast path only notices *that* some entry has the wrong shape (a missing key,
    a wrong type); this slow pass, run only then, says which one and why.
    """
    for i, t in enumerate(tensors):
        where = f"tensors[{i}]"
        if not isinstance(t, dict):
            raise InvalidInput(f"{where} must be an object, got {_describe(t)}", field=where, code="invalid-tensor")
        _unknown_field_first(t, where, "tensor", _TENSOR_FIELDS)
        if not isinstance(t.get("name"), str):
            raise InvalidInput(f'{where} needs a string "name"', field=f"{where}.name", code="invalid-tensor")
        if type(t.get("bytes")) not in _NUMBER_TYPES:
            raise InvalidInput(
                f"tensor '{t['name']}' needs \"bytes\" as a number, got {_describe(t.get('bytes'))}",
                field=f"{where}.bytes",
                code="invalid-tensor",
            )
        shape = t.get("shape")
        if shape is not None and (
            not isinstance(shape, list)
            or any(d is not None and (type(d) is not int or not 0 <= d <= _MAX_DIM) for d in shape)
        ):
            raise InvalidInput(
                f"tensor '{t['name']}' has shape {_describe(shape)}; a shape is a list of "
                "integers from 0 to 2^63 - 1, or null for an unknown dimension (bind symbolic "
                "dimensions before sending the graph)",
                field=f"{where}.shape",
                code="invalid-tensor",
            )
        if t.get("dtype") is not None and not isinstance(t.get("dtype"), str):
            raise InvalidInput(
                f"tensor '{t['name']}' has dtype {_describe(t.get('dtype'))}; use a name such as \"float16\"",
                field=f"{where}.dtype",
                code="invalid-tensor",
            )
        kind = t.get("kind")
        if not isinstance(kind, (str, type(None))) or kind not in _TENSOR_KINDS:
            raise InvalidInput(
                f'tensor \'{t["name"]}\' has kind {_describe(kind)}; expected "parameter", "input" or "activation"',
                field=f"{where}.kind",
                code="invalid-tensor",
            )
    for i, n in enumerate(nodes):
        where = f"nodes[{i}]"
        if not isinstance(n, dict):
            raise InvalidInput(f"{where} must be an object, got {_describe(n)}", field=where, code="invalid-node")
        _unknown_field_first(n, where, "operator", _NODE_FIELDS)
        if not isinstance(n.get("name"), str):
            raise InvalidInput(f'{where} needs a string "name"', field=f"{where}.name", code="invalid-node")
        label = f"operator '{n['name']}'"
        if not isinstance(n.get("op"), str):
            raise InvalidInput(f'{label} needs a string "op" (its type)', field=f"{where}.op", code="invalid-node")
        for key in ("inputs", "outputs"):
            refs = n.get(key)
            if not isinstance(refs, list):
                raise InvalidInput(
                    f'{label} needs "{key}" as a list of tensor names', field=f"{where}.{key}", code="invalid-node"
                )
            for j, ref in enumerate(refs):
                if not isinstance(ref, str):
                    raise InvalidInput(
                        f'{label} lists {_describe(ref)} in "{key}"; expected a tensor name',
                        field=f"{where}.{key}[{j}]",
                        code="invalid-node",
                    )
        for key in ("flops", "param_bytes"):
            if type(n.get(key)) not in _OPTIONAL_NUMBER_TYPES:
                raise InvalidInput(
                    f'{label} has "{key}" {_describe(n.get(key))}; expected a number',
                    field=f"{where}.{key}",
                    code="invalid-node",
                )
        devices = n.get("device_types")
        if devices is not None and (
            not isinstance(devices, list) or not devices or not all(isinstance(d, str) for d in devices)
        ):
            raise InvalidInput(
                f'{label} has "device_types" {_describe(devices)}; expected a non-empty list of device '
                "type names (leave it out to allow any device)",
                field=f"{where}.device_types",
                code="invalid-node",
            )
    raise InvalidInput("the graph is malformed", field="nodes", code="invalid-graph")  # pragma: no cover


def _unknown_field_first(entry: dict, where: str, kind: str, fields: tuple[str, ...]) -> None:
    """An unknown field is reported before a missing one: ``"nmae"`` is a typo of ``"name"``."""
    unknown = [key for key in entry if key not in fields]
    if unknown:
        name = entry.get("name")
        owner = f"{kind} '{_field_label(name)}'" if isinstance(name, str) else where
        _raise_unknown_field(owner, unknown[0], where, fields)


def _check_numbers(values: np.ndarray, present: np.ndarray | None, owner_names: list, what: str, section: str,
                   maximum: float) -> None:
    """Reject negative, non-finite or absurdly large sizes and FLOP counts, naming the first offender."""
    bad = ~np.isfinite(values) | (values < 0) | (values > maximum)
    if present is not None:
        bad &= present
    if bad.any():
        i = int(np.argmax(bad))
        raise InvalidInput(
            f"{section[:-1] if section == 'tensors' else 'operator'} '{owner_names[i]}' has {what} = "
            f"{float(values[i])!r}; {what} must be a finite number from 0 to {maximum:.3g}",
            field=f"{section}[{i}].{what}",
            code="invalid-number",
        )


def _float_array(values: list, owner_names: list, what: str, section: str) -> np.ndarray:
    """``values`` as float64 (None -> nan); integers beyond float range are rejected."""
    try:
        return np.array(values, dtype=np.float64)
    except OverflowError:
        i = next(i for i, v in enumerate(values) if isinstance(v, int) and abs(v) > _FLOAT_MAX)
        raise InvalidInput(
            f"{section[:-1] if section == 'tensors' else 'operator'} '{owner_names[i]}' has {what} = "
            f"{_describe(values[i])}, beyond the range of a double; {what} must be a finite number >= 0",
            field=f"{section}[{i}].{what}",
            code="invalid-number",
        ) from None


def _first_duplicate(names: list) -> tuple[int, int]:
    seen: dict[str, int] = {}
    for i, name in enumerate(names):
        if name in seen:
            return seen[name], i
        seen[name] = i
    raise AssertionError("no duplicate")  # pragma: no cover


def _unknown_reference(nodes: list, key: str, index: dict) -> None:
    for i, n in enumerate(nodes):
        for j, ref in enumerate(n[key]):
            if ref not in index:
                if key == "inputs":
                    detail = (
                        f"operator '{n['name']}' reads tensor '{ref}', which is neither declared in "
                        '"tensors" nor produced by any operator'
                    )
                else:
                    detail = (
                        f"operator '{n['name']}' writes tensor '{ref}', which is not declared in "
                        '"tensors"; declare it with its size in bytes'
                    )
                raise InvalidInput(detail, field=f"nodes[{i}].{key}[{j}]", code="unknown-tensor")
    raise AssertionError("no unknown reference")  # pragma: no cover


def _csr_ids(lists: list[list[str]], index: dict, nodes: list, key: str) -> tuple[np.ndarray, np.ndarray]:
    """Name lists -> CSR of tensor ids, one C-level pass (map over dict lookups)."""
    lengths = np.fromiter(map(len, lists), dtype=np.int64, count=len(lists))
    ptr = np.zeros(len(lists) + 1, dtype=np.int64)
    np.cumsum(lengths, out=ptr[1:])
    try:
        ids = np.fromiter(map(index.__getitem__, chain.from_iterable(lists)), dtype=np.int64, count=int(ptr[-1]))
    except (KeyError, TypeError):
        _unknown_reference(nodes, key, index)
    return ptr, ids


def graph_from_json(
    doc: dict,
    *,
    max_ops: int | None = None,
    max_tensors: int | None = None,
) -> Hypergraph:
    """Validate the service's JSON graph form and build its :class:`Hypergraph`.

    The document is ``{"name", "nodes": [{"name", "op", "inputs", "outputs", "flops"?,
    "param_bytes"?, "device_types"?}], "tensors": [{"name", "bytes", "shape"?, "dtype"?,
    "kind"?}]}`` (DESIGN.md, "Data shapes"); a ``null`` in a shape is a dimension the
    exporter could not resolve. A tensor that no operator writes is a
    graph input, or a parameter (resident weights) when its ``kind`` is
    ``"parameter"``. A node's ``param_bytes``, when given, replaces the sum of the
    parameter tensors it reads (weights the graph does not spell out as tensors).
    Missing ``flops`` are estimated from the operator type and tensor shapes
    (:func:`partitioners.graph.flops.estimate_flops`), or from output bytes when there are
    no shapes; each estimate adds a line to ``graph.warnings``.

    Every list is read once, column by column, with C-level comprehensions and
    ``map``; entry-by-entry checking runs only after that pass has found a problem, to
    say precisely where it is. So a 10^6-operator graph ingests in a small multiple of
    the time ``json.loads`` took to parse it (``bench/ingest.py``).

    Parameters
    ----------
    doc : dict
        The parsed JSON document.
    max_ops, max_tensors : int, optional
        Size limits, checked on the list lengths before anything is built.

    Returns
    -------
    Hypergraph

    Raises
    ------
    InputTooLarge
        More operators or tensors than the limits (``code="too-many-ops"`` /
        ``"too-many-tensors"``).
    InvalidInput
        With ``field`` set to the offending entry's path and ``code`` one of
        ``invalid-graph``, ``empty-graph``, ``invalid-node``, ``invalid-tensor``,
        ``invalid-number`` (negative, non-finite or over ``MAX_TENSOR_BYTES`` / ``MAX_OP_FLOPS``), ``duplicate-op``,
        ``duplicate-tensor``, ``unknown-tensor``, ``duplicate-producer``,
        ``kind-mismatch``, ``cycle``, ``unknown-field`` (a field the form does not have:
        a typo such as ``"flop"`` is an error, never silently ignored); an empty node or
        tensor name is ``invalid-node`` / ``invalid-tensor``.
    """
    nodes, tensors, name = _document_lists(doc)
    _check_graph_size(len(nodes), len(tensors), max_ops, max_tensors)
    columns = _JsonColumns.read(nodes, tensors)
    _check_fields(nodes, tensors)
    n_ops = len(nodes)
    index = _unique_names(columns)

    # numbers are finite and non-negative
    bytes_arr = _float_array(columns.t_bytes, columns.t_names, "bytes", "tensors")
    _check_numbers(bytes_arr, None, columns.t_names, "bytes", "tensors", MAX_TENSOR_BYTES)
    flops_arr = _float_array(columns.op_flops, columns.op_names, "flops", "nodes")  # None -> nan
    flops_missing = _absent(columns.op_flops, columns.flops_types, n_ops)
    _check_numbers(flops_arr, ~flops_missing, columns.op_names, "flops", "nodes", MAX_OP_FLOPS)
    params_arr = _float_array(columns.op_params, columns.op_names, "param_bytes", "nodes")
    params_given = ~_absent(columns.op_params, columns.params_types, n_ops)
    _check_numbers(params_arr, params_given, columns.op_names, "param_bytes", "nodes", MAX_TENSOR_BYTES)

    # references resolve; each tensor has at most one producer
    in_ptr, in_ids = _csr_ids(columns.op_inputs, index, nodes, "inputs")
    out_ptr, out_ids = _csr_ids(columns.op_outputs, index, nodes, "outputs")
    writes = _writers_per_tensor(out_ptr, out_ids, columns)
    is_param = _declared_parameters(columns, writes > 0)

    shapes = [tuple(s) if s is not None else None for s in columns.t_shapes] if columns.has_shapes else None
    dtypes = columns.t_dtypes if _types(columns.t_dtypes) != {type(None)} else None
    devices = (
        _object_vector([tuple(d) if d is not None else None for d in columns.op_devices])
        if list in columns.device_types_types
        else None
    )
    warnings: list[str] = []
    if flops_missing.any():
        _estimate_missing_flops(
            flops_arr, flops_missing, columns.op_types, in_ptr, in_ids, out_ptr, out_ids, shapes, bytes_arr, warnings
        )

    graph = build_hypergraph(
        name=name,
        op_names=_object_vector(columns.op_names),
        op_types=_object_vector(columns.op_types),
        op_flops=flops_arr,
        input_ptr=in_ptr,
        input_tensors=in_ids,
        output_ptr=out_ptr,
        output_tensors=out_ids,
        tensor_names=_object_vector(columns.t_names),
        tensor_bytes=bytes_arr,
        tensor_is_parameter=is_param,
        tensor_shapes=shapes,
        tensor_dtypes=dtypes,
        op_device_types=devices,
        warnings=warnings + _carried_warnings(doc.get("warnings")),
    )
    if params_given.any():
        graph.op_param_bytes[params_given] = params_arr[params_given]
    topological_order(graph)  # raises InvalidInput(code="cycle")
    return graph


def _document_lists(doc: object) -> tuple[list, list, str]:
    """The document's ``nodes``, ``tensors`` and ``name``, or what is wrong with its outline."""
    if not isinstance(doc, dict):
        raise InvalidInput(
            'the graph must be a JSON object with "nodes" and "tensors"', field="graph", code="invalid-graph"
        )
    nodes = doc.get("nodes")
    tensors = doc.get("tensors", [])
    if not isinstance(nodes, list):
        raise InvalidInput('the graph needs "nodes": a list of operators', field="nodes", code="invalid-graph")
    if not isinstance(tensors, list):
        raise InvalidInput('"tensors" must be a list of tensors', field="tensors", code="invalid-graph")
    name = doc.get("name", "")
    if not isinstance(name, str):
        raise InvalidInput('"name" must be a string', field="name", code="invalid-graph")
    unknown = [key for key in doc if key not in _GRAPH_FIELDS]
    if unknown:
        _raise_unknown_field("the graph", unknown[0], "", _GRAPH_FIELDS[:3])
    return nodes, tensors, name


def _field_label(key: object) -> str:
    """A field name fit to quote in a message and a field path: short, printable text."""
    if isinstance(key, str) and len(key) <= 100 and key.isprintable():
        return key
    return _describe(key)


def _raise_unknown_field(owner: str, key: object, where: str, fields: tuple[str, ...]) -> None:
    label = _field_label(key)
    close = difflib.get_close_matches(label, fields, n=1)
    hint = f' (did you mean "{close[0]}"?)' if close else ""
    listed = ", ".join(f'"{f}"' for f in fields)
    raise InvalidInput(
        f'{owner} has an unknown field "{label}"{hint}; the fields are {listed}',
        field=f"{where}.{label}" if where else label,
        code="unknown-field",
    )


def _check_fields(nodes: list, tensors: list) -> None:
    """Reject a node or tensor field the graph form does not have, naming the first one.

    One C-level pass collects every key in use; only when one is unknown does a second
    pass find which entry holds it.
    """
    for entries, fields, section in ((tensors, _TENSOR_FIELDS, "tensors"), (nodes, _NODE_FIELDS, "nodes")):
        if set(chain.from_iterable(entries)) <= set(fields):
            continue
        for i, entry in enumerate(entries):
            unknown = [key for key in entry if key not in fields]
            if unknown:
                owner = f"{'tensor' if section == 'tensors' else 'operator'} '{_field_label(entry['name'])}'"
                _raise_unknown_field(owner, unknown[0], f"{section}[{i}]", fields)


def _check_graph_size(n_ops: int, n_tensors: int, max_ops: int | None, max_tensors: int | None) -> None:
    """The size limits, checked on list lengths before anything is built; an empty graph is an error too."""
    if max_ops is not None and n_ops > max_ops:
        raise InputTooLarge(
            f"the graph has {n_ops} operators; this service accepts at most {max_ops} per graph",
            field="nodes",
            code="too-many-ops",
        )
    if max_tensors is not None and n_tensors > max_tensors:
        raise InputTooLarge(
            f"the graph has {n_tensors} tensors; this service accepts at most {max_tensors} per graph",
            field="tensors",
            code="too-many-tensors",
        )
    if n_ops == 0:
        raise InvalidInput("the graph has no operators", field="nodes", code="empty-graph")


@dataclass
class _JsonColumns:
    """The JSON graph's lists read column by column, each column's value types checked.

    One C-level pass per column; any structural surprise (a missing key, a wrong
    type, a negative dimension) goes to :func:`_raise_entry_problem`, the slow
    locator that names the entry.
    """

    t_names: list
    t_bytes: list
    t_shapes: list
    t_dtypes: list
    t_kinds: list
    op_names: list
    op_types: list
    op_inputs: list
    op_outputs: list
    op_flops: list
    op_params: list
    op_devices: list
    flops_types: set[type]
    params_types: set[type]
    device_types_types: set[type]
    kind_values: set
    has_shapes: bool

    @classmethod
    def read(cls, nodes: list, tensors: list) -> "_JsonColumns":
        try:
            t_names = [t["name"] for t in tensors]
            t_bytes = [t["bytes"] for t in tensors]
            t_shapes = [t.get("shape") for t in tensors]
            t_dtypes = [t.get("dtype") for t in tensors]
            t_kinds = [t.get("kind") for t in tensors]
            op_names = [n["name"] for n in nodes]
            op_types = [n["op"] for n in nodes]
            op_inputs = [n["inputs"] for n in nodes]
            op_outputs = [n["outputs"] for n in nodes]
            op_flops = [n.get("flops") for n in nodes]
            op_params = [n.get("param_bytes") for n in nodes]
            op_devices = [n.get("device_types") for n in nodes]
        except (KeyError, TypeError, AttributeError):
            _raise_entry_problem(nodes, tensors)
        shape_types = _types(t_shapes)
        kind_values = set(t_kinds) if _types(t_kinds) <= {str, type(None)} else {object()}
        flops_types = _types(op_flops)
        params_types = _types(op_params)
        device_types_types = _types(op_devices)
        if (
            not _types(t_names) <= {str}
            or not _types(t_bytes) <= _NUMBER_TYPES
            or not shape_types <= {list, type(None)}
            or not _types(t_dtypes) <= {str, type(None)}
            or not kind_values <= _TENSOR_KINDS.keys()
            or not _types(op_names) <= {str}
            or not _types(op_types) <= {str}
            or not _types(op_inputs) <= {list}
            or not _types(op_outputs) <= {list}
            or not flops_types <= _OPTIONAL_NUMBER_TYPES
            or not params_types <= _OPTIONAL_NUMBER_TYPES
            or not device_types_types <= {list, type(None)}
        ):
            _raise_entry_problem(nodes, tensors)

        # shapes: lists of non-negative ints
        has_shapes = list in shape_types
        if has_shapes:
            dims = list(chain.from_iterable(s for s in t_shapes if s is not None))
            dim_types = _types(dims)
            if type(None) in dim_types:  # null: a dimension the exporter could not resolve
                dims = [d for d in dims if d is not None]
            if not dim_types <= {int, type(None)} or (dims and (min(dims) < 0 or max(dims) > _MAX_DIM)):
                _raise_entry_problem(nodes, tensors)
        if list in device_types_types and (
            [] in op_devices or not _types(list(chain.from_iterable(d for d in op_devices if d is not None))) <= {str}
        ):
            _raise_entry_problem(nodes, tensors)
        return cls(t_names, t_bytes, t_shapes, t_dtypes, t_kinds, op_names, op_types, op_inputs, op_outputs,
                   op_flops, op_params, op_devices, flops_types, params_types, device_types_types, kind_values,
                   has_shapes)


def _unique_names(columns: _JsonColumns) -> dict:
    """Tensor name -> index, once tensor and operator names are each known to be unique and
    non-empty (an empty name cannot be referred to, shown or told apart in a plan)."""
    t_names, op_names = columns.t_names, columns.op_names
    index = dict(zip(t_names, range(len(t_names))))
    if "" in index:
        i = t_names.index("")
        raise InvalidInput(f'tensors[{i}] has an empty "name"; every tensor needs a name', field=f"tensors[{i}].name",
                           code="invalid-tensor")
    op_name_set = set(op_names)
    if "" in op_name_set:
        i = op_names.index("")
        raise InvalidInput(f'nodes[{i}] has an empty "name"; every operator needs a name', field=f"nodes[{i}].name",
                           code="invalid-node")
    if len(index) != len(t_names):
        first, again = _first_duplicate(t_names)
        raise InvalidInput(
            f"tensor name '{t_names[again]}' is declared twice (tensors[{first}] and tensors[{again}])",
            field=f"tensors[{again}].name",
            code="duplicate-tensor",
        )
    if len(op_name_set) != len(op_names):
        first, again = _first_duplicate(op_names)
        raise InvalidInput(
            f"operator name '{op_names[again]}' is used twice (nodes[{first}] and nodes[{again}])",
            field=f"nodes[{again}].name",
            code="duplicate-op",
        )
    return index


def _absent(values: list, value_types: set[type], count: int) -> np.ndarray:
    """Per entry, whether an optional number was left out (``None``)."""
    if type(None) not in value_types:
        return np.zeros(count, dtype=bool)
    return np.fromiter((v is None for v in values), dtype=bool, count=count)


def _object_vector(items: list) -> np.ndarray:
    """A 1-D object array of ``items``, even when they are tuples numpy would stack into 2-D."""
    return np.fromiter(items, dtype=object, count=len(items))


def _writers_per_tensor(out_ptr: np.ndarray, out_ids: np.ndarray, columns: _JsonColumns) -> np.ndarray:
    """How many operators write each tensor; more than one is an error naming two of them."""
    op_names, t_names = columns.op_names, columns.t_names
    writes = np.bincount(out_ids, minlength=len(t_names))
    if (writes > 1).any():
        t = int(np.argmax(writes > 1))
        writers = np.repeat(np.arange(len(op_names)), np.diff(out_ptr))[out_ids == t]
        a, b = (op_names[int(w)] for w in writers[:2])
        detail = (
            f"tensor '{t_names[t]}' is written twice by operator '{a}'"
            if a == b
            else f"tensor '{t_names[t]}' is written by two operators, '{a}' and '{b}'; each tensor has one producer"
        )
        raise InvalidInput(detail, field=f"nodes[{int(writers[1])}].outputs", code="duplicate-producer")
    return writes


def _declared_parameters(columns: _JsonColumns, produced: np.ndarray) -> np.ndarray | None:
    """Which tensors are declared parameters (None when no tensor declares a kind),
    once every declared kind agrees with the structure."""
    if columns.kind_values == {None}:
        return None
    t_kinds, t_names = columns.t_kinds, columns.t_names
    kind_arr = np.fromiter(map(_TENSOR_KINDS.__getitem__, t_kinds), dtype=np.int8, count=len(t_kinds))
    wrong = ((kind_arr == TENSOR_PARAMETER) | (kind_arr == TENSOR_INPUT)) & produced
    wrong |= (kind_arr == TENSOR_ACTIVATION) & ~produced
    if wrong.any():
        t = int(np.argmax(wrong))
        if produced[t]:
            detail = f"tensor '{t_names[t]}' is declared kind \"{t_kinds[t]}\" but an operator writes it"
        else:
            detail = f"tensor '{t_names[t]}' is declared an activation but no operator writes it"
        raise InvalidInput(detail, field=f"tensors[{t}].kind", code="kind-mismatch")
    return kind_arr == TENSOR_PARAMETER


def _carried_warnings(value: object) -> list[str]:
    """Warnings a stored canonical document carries (``graph_to_json`` writes them)."""
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(w, str) for w in value):
        raise InvalidInput('"warnings" must be a list of strings', field="warnings", code="invalid-graph")
    return list(value)


def _estimate_missing_flops(
    flops: np.ndarray,
    missing: np.ndarray,
    op_types: list[str],
    in_ptr: np.ndarray,
    in_ids: np.ndarray,
    out_ptr: np.ndarray,
    out_ids: np.ndarray,
    shapes: list | None,
    tensor_bytes: np.ndarray,
    warnings: list[str],
) -> None:
    """Fill ``flops[missing]`` in place from shapes (per operator) or output bytes."""
    todo = np.flatnonzero(missing)
    if shapes is not None:
        unknown_types: dict[str, int] = {}
        for op in todo.tolist():
            ins = [shapes[t] for t in in_ids[in_ptr[op] : in_ptr[op + 1]].tolist()]
            outs = [shapes[t] for t in out_ids[out_ptr[op] : out_ptr[op + 1]].tolist()]
            if all(s is None for s in outs) and all(s is None for s in ins):
                continue
            estimate = estimate_flops(op_types[op], ins, outs)
            flops[op] = estimate.flops
            if estimate.note is not None:
                unknown_types[op_types[op]] = unknown_types.get(op_types[op], 0) + 1
        for op_type, count in sorted(unknown_types.items()):
            warnings.append(
                f"no FLOP formula for operator type '{op_type}' or its shapes are incomplete "
                f"({count} operators): counted one FLOP per output element"
            )
    rest = todo[np.isnan(flops[todo])]
    if rest.size:
        out_bytes = np.zeros(flops.shape[0], dtype=np.float64)
        owners = np.repeat(np.arange(flops.shape[0]), np.diff(out_ptr))
        np.add.at(out_bytes, owners, tensor_bytes[out_ids])
        flops[rest] = out_bytes[rest] / _FALLBACK_ELEMENT_BYTES
        subject = "1 operator has" if rest.size == 1 else f"{rest.size} operators have"
        warnings.append(
            f'{subject} neither "flops" nor tensor shapes: estimated one FLOP per '
            f"{_FALLBACK_ELEMENT_BYTES:g} output bytes (one float32 element)"
        )


# --------------------------------------------------------------------------------------
# Canonical form: hash, JSON, summary
# --------------------------------------------------------------------------------------

_HASH_VERSION = b"hyperplace-graph-v1\n"


def _name_order(names: np.ndarray) -> np.ndarray:
    """Ids sorted by name: the canonical numbering (names are unique after validation).

    Python's sort on a list of str is C-level and, unlike a fixed-width numpy string
    array, needs no memory proportional to the longest name times the count.
    """
    as_list = names.tolist()
    return np.fromiter(sorted(range(len(as_list)), key=as_list.__getitem__), dtype=np.int64, count=len(as_list))


def _permute_csr(ptr: np.ndarray, indices: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """CSR rows reordered to ``rows`` (vectorised gather of each row's slice)."""
    lengths = np.diff(ptr)[rows]
    new_ptr = np.zeros(rows.shape[0] + 1, dtype=np.int64)
    np.cumsum(lengths, out=new_ptr[1:])
    gather = np.repeat(ptr[rows] - new_ptr[:-1], lengths) + np.arange(int(new_ptr[-1]), dtype=np.int64)
    return new_ptr, indices[gather]


def _strings_digest(h, strings: list) -> None:
    """Feed strings unambiguously: their UTF-8 lengths, then their bytes."""
    encoded = [s.encode("utf-8", "surrogatepass") for s in strings]
    h.update(np.fromiter(map(len, encoded), dtype=np.int64, count=len(encoded)).tobytes())
    h.update(b"".join(encoded))


def _optional_strings(values: list) -> list[str]:
    # "\x00" cannot start a valid dtype or device name here: it marks "absent"
    return ["\x00" if v is None else v for v in values]


def model_hash(graph: Hypergraph) -> str:
    """Content hash (SHA-256, hex) of the canonical graph.

    Operators and tensors are renumbered in name order, so the hash does not depend
    on the order of ``nodes`` and ``tensors`` in the file; weight *values* are never
    part of a :class:`Hypergraph`, so they cannot change it. It covers operator names,
    types, FLOPs, parameter bytes and device restrictions; tensor names, bytes, kinds,
    shapes and dtypes; and which tensors each operator reads and writes, in argument
    order (``MatMul(a, b)`` differs from ``MatMul(b, a)``). The display name and the
    warnings are left out. Stored plans are keyed by this hash (DESIGN.md, "Plan").

    Returns
    -------
    str
        64 hexadecimal characters.
    """
    op_order = _name_order(graph.op_names)
    tensor_order = _name_order(graph.tensor_names)
    tensor_rank = np.empty(graph.n_tensors, dtype=np.int64)
    tensor_rank[tensor_order] = np.arange(graph.n_tensors, dtype=np.int64)

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
    return h.hexdigest()


def graph_to_json(graph: Hypergraph) -> dict:
    """The canonical JSON form (DESIGN.md "Data shapes"), for storage and display.

    Nodes and tensors are listed in name order; every node carries its ``flops`` (so
    reading it back re-estimates nothing) and ``param_bytes`` only where it differs
    from the parameter tensors it reads; tensors carry ``kind`` only for parameters
    (inputs and activations follow from the structure). ``graph_from_json`` of the
    result gives a graph with the same :func:`model_hash`.
    """
    op_order = _name_order(graph.op_names)
    tensor_order = _name_order(graph.tensor_names)
    derived = np.zeros(graph.n_ops, dtype=np.float64)
    owners = np.repeat(np.arange(graph.n_ops), np.diff(graph.input_ptr))
    is_param = graph.tensor_kind[graph.input_tensors] == TENSOR_PARAMETER
    np.add.at(derived, owners[is_param], graph.tensor_bytes[graph.input_tensors[is_param]])

    # columns in canonical order, then one comprehension that only assembles dicts
    in_ptr, in_idx = _permute_csr(graph.input_ptr, graph.input_tensors, op_order)
    out_ptr, out_idx = _permute_csr(graph.output_ptr, graph.output_tensors, op_order)
    in_names, out_names = graph.tensor_names[in_idx].tolist(), graph.tensor_names[out_idx].tolist()
    in_bounds, out_bounds = in_ptr.tolist(), out_ptr.tolist()
    nodes = [
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

    sizes = graph.tensor_bytes[tensor_order]
    if sizes.size == 0 or (np.all(sizes == np.floor(sizes)) and sizes.max() < 2**63):
        size_values = sizes.astype(np.int64).tolist()  # integral byte counts print as integers
    else:
        size_values = [int(v) if v.is_integer() else v for v in sizes.tolist()]
    tensors = [
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
    doc = {"name": graph.name, "nodes": nodes, "tensors": tensors}
    if graph.warnings:
        doc["warnings"] = list(graph.warnings)
    return doc


def graph_summary(graph: Hypergraph) -> dict:
    """Headline figures of a graph, for API answers and listings.

    Returns
    -------
    dict
        ``name``, ``n_ops``, ``n_tensors``, ``total_flops``, ``parameter_bytes`` (sum
        over parameter tensors plus weights given only as ``param_bytes`` on nodes),
        ``activation_bytes`` (sum over tensors operators write), ``input_bytes`` (graph
        inputs) and ``n_warnings``.
    """
    kind = graph.tensor_kind
    sizes = graph.tensor_bytes
    param_tensor_bytes = float(sizes[kind == TENSOR_PARAMETER].sum())
    derived = np.zeros(graph.n_ops, dtype=np.float64)
    owners = np.repeat(np.arange(graph.n_ops), np.diff(graph.input_ptr))
    is_param = kind[graph.input_tensors] == TENSOR_PARAMETER
    np.add.at(derived, owners[is_param], sizes[graph.input_tensors[is_param]])
    # weights declared only on nodes (param_bytes above what their tensors account for)
    extra = float(np.clip(graph.op_param_bytes - derived, 0.0, None).sum())
    return {
        "name": graph.name,
        "n_ops": graph.n_ops,
        "n_tensors": graph.n_tensors,
        "total_flops": float(graph.op_flops.sum()),
        "parameter_bytes": param_tensor_bytes + extra,
        "activation_bytes": float(sizes[kind == TENSOR_ACTIVATION].sum()),
        "input_bytes": float(sizes[kind == TENSOR_INPUT].sum()),
        "n_warnings": len(graph.warnings),
    }
