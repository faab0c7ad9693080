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

from dataclasses import dataclass, field

import numpy as np

__all__ = [
    "TENSOR_ACTIVATION",
    "TENSOR_INPUT",
    "TENSOR_PARAMETER",
    "Hypergraph",
    "build_hypergraph",
    "csr_from_lists",
    "graph_from_ops",
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
) -> Hypergraph:
    """Assemble a :class:`Hypergraph` from operator->tensor CSR relations.

    Derives producers, consumers, tensor kinds and (when not given) parameter bytes
    per operator with vectorised passes. Assumes each tensor has at most one
    producer; validation (``partitioners.graph`` callers) checks that first.
    """
    n_ops = int(len(op_names))
    n_tensors = int(len(tensor_names))
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
