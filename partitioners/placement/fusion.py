"""Operator fusion decided before placement: :func:`fusion_groups` and :func:`fused_graph`.

A compiler fuses chains of elementwise and normalisation operators into the kernel that
produces or consumes them: XLA's loop and input fusion [1]_, TorchInductor's pointwise
and reduction fusion [2]_, TensorRT's layer fusion [3]_. A fused kernel reads its inputs
once, keeps the intermediates in registers and shared memory, writes its outputs once
and is one launch; it also runs on one device, so a partitioner must not cut it.
Placing the unfused graph overstates memory traffic and launches and lets the
partitioner cut where no compiler would. So the engine groups first, then places the
groups as units (one coarsened node each).

Rules, by mode (each the behaviour of the named compiler):

``"none"``
    Every operator is its own kernel (eager PyTorch, ONNX Runtime without graph
    optimisations, or a graph the compiler already fused before sending it).
``"elementwise"``
    TorchInductor's default [2]_: an elementwise operator (or a view) joins the group of
    the pointwise operator that produces its input, and a normalisation or reduction
    (softmax included) absorbs the pointwise chain producing its input and the pointwise
    operators consuming its output (one reduction per kernel). Matmuls and convolutions
    stay library calls (cuBLAS / cuDNN / oneDNN extern kernels, which Inductor does not
    fuse into without max-autotune templates).
``"compiler"``
    What XLA and TensorRT do [1]_ [3]_: everything above, and elementwise epilogues
    (bias, activation, residual add, cast) join the matmul or convolution producing
    their input (cuBLASLt and cuDNN epilogues, TensorRT's conv+bias+ReLU). A group holds
    at most one matmul / convolution / attention, and it comes first: the GEMM's output
    is tiled by the epilogue, so a second GEMM or a reduction after it would need the
    whole output, which XLA and TensorRT also leave unfused.

Views (reshape, squeeze, unsqueeze, flatten, identity) are free and join any group
they follow. In every mode:

* a tensor that an operator outside its group (perhaps on another device) also reads is
  written out once for it, as Inductor's and XLA's multi-output fusions do; the group
  then saves only its own read of it; graph outputs are written out;
* no group may create a cycle between groups: an operator joins a group only when its
  other inputs come from operators that precede the whole group in topological order
  (then no path leaves the group and comes back);
* operators restricted to different device types never share a group, nor do
  operators of different declared training roles (forward, backward, optimizer), and a
  declared gradient or optimizer state is never kept on chip (its role must survive).

Costs: the coarsened node has the summed FLOPs, reads only the group's external inputs
and writes only its external outputs; it is timed as the class of its first operator
(a fused GEMM is a GEMM) and pays one launch. Intermediates are modelled as never
touching main memory, as in a tiled fused kernel that streams them through registers
and shared memory; they get no memory-tier holdings.

References
----------
.. [1] OpenXLA, "XLA operation semantics" and "XLA architecture": loop fusion, input
   fusion, output fusion (openxla.org/xla).
.. [2] J. Ansel et al., "PyTorch 2: Faster Machine Learning Through Dynamic Python
   Bytecode Transformation and Graph Compilation", ASPLOS 2024 (TorchInductor's
   pointwise and reduction fusion; extern kernels for mm/conv).
.. [3] NVIDIA TensorRT Developer Guide, "Layer Fusion" (convolution + bias + ReLU,
   elementwise and activation fusion, shuffle elimination).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import numpy.typing as npt

from partitioners.costmodel.costs import (
    OP_ATTENTION,
    OP_CONV,
    OP_ELEMENTWISE,
    OP_MATMUL,
    OP_NORM,
    OP_REDUCTION,
    is_view_op,
    op_class_of,
)
from partitioners.graph.hypergraph import ROLE_ABSENT, TENSOR_PARAMETER, Hypergraph, build_hypergraph, topological_order
from partitioners.placement.options import FUSION_MODES

__all__ = ["FusionGroups", "fusion_groups", "fused_graph", "fuse_for_placement"]

# What a group is, as far as the rules care: pointwise only, led by a GEMM-like kernel,
# or holding a reduction (norm, softmax, reduce).
_POINTWISE, _HEAVY, _REDUCING = 0, 1, 2
_HEAVY_CLASSES = (OP_MATMUL, OP_CONV, OP_ATTENTION)
_REDUCING_CLASSES = (OP_NORM, OP_REDUCTION)
_SOFTMAX_TYPES = frozenset({"softmax", "logsoftmax"})


@dataclass(frozen=True, eq=False)
class FusionGroups:
    """Which fused kernel each operator belongs to.

    Attributes
    ----------
    mode : str
        One of :data:`~partitioners.placement.options.FUSION_MODES`.
    op_names : numpy.ndarray of object, shape (n_ops,)
        The unfused graph's operator names (a plan lists each group's members by them).
    topological_order : numpy.ndarray of int64, shape (n_ops,)
        The unfused graph's operators in the order the groups were formed.
    op_group : numpy.ndarray of int64, shape (n_ops,)
        Group of each operator of the unfused graph; groups are numbered by their
        first operator in topological order.
    group_anchor : numpy.ndarray of int64, shape (n_groups,)
        The group's first operator: it names the fused node and gives its class.
    internal_tensor : numpy.ndarray of bool, shape (n_tensors,)
        Tensors every reader of which is in the group that produces them (kept on chip).
    bytes_saved : numpy.ndarray of float64, shape (n_groups,)
        Main-memory traffic the group avoids: each internal tensor's write, and every
        read of a tensor by an operator of the group that produced it.
    """

    mode: str
    op_names: npt.NDArray[np.object_]
    topological_order: npt.NDArray[np.int64]
    op_group: npt.NDArray[np.int64]
    group_anchor: npt.NDArray[np.int64]
    internal_tensor: npt.NDArray[np.bool_]
    bytes_saved: npt.NDArray[np.float64]

    @property
    def n_groups(self) -> int:
        return int(self.group_anchor.shape[0])

    @property
    def group_size(self) -> npt.NDArray[np.int64]:
        return np.bincount(self.op_group, minlength=self.n_groups).astype(np.int64)

    @property
    def launches_saved(self) -> int:
        return int(self.op_group.shape[0] - self.n_groups)


def _op_roles(graph: Hypergraph, mode: str) -> tuple[npt.NDArray[np.int8], npt.NDArray[np.bool_]]:
    """Per operator: its fusion role (pointwise / heavy / reducing / -1 never fuses), and whether it is a view."""
    cls = op_class_of(graph.op_types)
    view = is_view_op(graph.op_types)
    role = np.full(graph.n_ops, -1, dtype=np.int8)
    role[(cls == OP_ELEMENTWISE) | view] = _POINTWISE
    role[np.isin(cls, _REDUCING_CLASSES)] = _REDUCING
    softmax = np.array([str(t).lower() in _SOFTMAX_TYPES for t in graph.op_types], dtype=bool)
    role[softmax] = _REDUCING
    if mode == "compiler":
        role[np.isin(cls, _HEAVY_CLASSES)] = _HEAVY
    return role, view


def _may_join(group_kind: int, op_role: int, mode: str) -> tuple[bool, int]:
    """Whether an operator of ``op_role`` may join a group of ``group_kind``, and the group's kind after."""
    if op_role == _POINTWISE:
        return True, group_kind
    if op_role == _REDUCING and group_kind == _POINTWISE:
        return True, _REDUCING  # input fusion: pointwise producers into the reduction
    return False, group_kind


def fusion_groups(graph: Hypergraph, mode: str) -> FusionGroups:
    """Group the operators of ``graph`` into fused kernels by the rules of ``mode`` (module docstring).

    One pass in topological order: each operator either joins the group of the producer
    of one of its inputs or starts a group of its own.
    """
    if mode not in FUSION_MODES:
        raise ValueError(f"fusion mode must be one of {FUSION_MODES}, got {mode!r}")
    n = graph.n_ops
    order = topological_order(graph)
    position = np.empty(n, dtype=np.int64)
    position[order] = np.arange(n, dtype=np.int64)
    group = np.full(n, -1, dtype=np.int64)
    anchors: list[int] = []
    if mode == "none":
        group[order] = np.arange(n, dtype=np.int64)
        anchors = order.tolist()
    else:
        role, _ = _op_roles(graph, mode)
        producer = graph.tensor_producer
        types = graph.op_device_types
        roles = graph.op_role
        group_kind: list[int] = []
        group_start: list[int] = []  # topological position of the group's first operator
        in_ptr, in_tensors = graph.input_ptr.tolist(), graph.input_tensors.tolist()
        for op in order.tolist():
            target = -1
            if role[op] >= 0:
                inputs = in_tensors[in_ptr[op] : in_ptr[op + 1]]
                producers = [int(producer[t]) for t in inputs]
                for p in producers:
                    if p < 0 or role[p] < 0:
                        continue
                    g = int(group[p])
                    ok, _ = _may_join(group_kind[g], int(role[op]), mode)
                    if not ok or (types is not None and types[p] != types[op]):
                        continue
                    if roles is not None and roles[p] != roles[op]:
                        continue
                    others_precede = all(q < 0 or group[q] == g or position[q] < group_start[g] for q in producers)
                    if others_precede:
                        target = g
                        break
            if target < 0:
                target = len(anchors)
                anchors.append(op)
                group_kind.append(_HEAVY if role[op] == _HEAVY else (_REDUCING if role[op] == _REDUCING else 0))
                group_start.append(int(position[op]))
            else:
                group_kind[target] = _may_join(group_kind[target], int(role[op]), mode)[1]
            group[op] = target
    internal, read_inside = _tensors_kept_inside(graph, group)
    saved = np.zeros(len(anchors), dtype=np.float64)
    np.add.at(saved, group[graph.tensor_producer[internal]], graph.tensor_bytes[internal])  # writes
    reader, tensor = read_inside
    np.add.at(saved, group[reader], graph.tensor_bytes[tensor])  # reads
    return FusionGroups(mode, graph.op_names, order, group, np.asarray(anchors, dtype=np.int64), internal, saved)


def fuse_for_placement(graph: Hypergraph, mode: str) -> tuple[Hypergraph, FusionGroups | None]:
    """The graph the engine places under ``mode`` and its groups (``None`` for ``"none"``)."""
    if mode == "none":
        return graph, None
    groups = fusion_groups(graph, mode)
    return fused_graph(graph, groups), groups


def _tensors_kept_inside(
    graph: Hypergraph, group: npt.NDArray[np.int64]
) -> tuple[npt.NDArray[np.bool_], tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]]:
    """Which tensors never reach main memory, and the (reader, tensor) reads served on chip.

    A read is on chip when reader and producer share a group; a tensor is internal when
    it has readers and every one of them is on chip.
    """
    n_readers = np.diff(graph.consumer_ptr)
    tensor_of_read = np.repeat(np.arange(graph.n_tensors), n_readers)
    producer = graph.tensor_producer[tensor_of_read]
    on_chip = (producer >= 0) & (group[np.maximum(producer, 0)] == group[graph.consumer_ops])
    reads_on_chip = np.bincount(tensor_of_read[on_chip], minlength=graph.n_tensors)
    internal: npt.NDArray[np.bool_] = np.asarray((n_readers > 0) & (reads_on_chip == n_readers), dtype=bool)
    if graph.tensor_role is not None:
        internal &= graph.tensor_role == ROLE_ABSENT
    return internal, (graph.consumer_ops[on_chip].astype(np.int64), tensor_of_read[on_chip].astype(np.int64))


def _group_csr(
    member_ptr: npt.NDArray[np.int64],
    member_tensors: npt.NDArray[np.int64],
    group: npt.NDArray[np.int64],
    keep_tensor: npt.NDArray[np.bool_],
    n_groups: int,
    tensor_group: npt.NDArray[np.int64] | None = None,
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """The tensors each group touches (union over its members, kept tensors only) as CSR.

    With ``tensor_group`` (the group producing each tensor, -1 for none), a tensor the
    group itself produces is left out: it is an output of the group, not an input.
    """
    owner = group[np.repeat(np.arange(member_ptr.shape[0] - 1), np.diff(member_ptr))]
    mask = keep_tensor[member_tensors]
    if tensor_group is not None:
        mask &= tensor_group[member_tensors] != owner
    pairs = np.unique(np.stack([owner[mask], member_tensors[mask]]), axis=1)
    ptr = np.zeros(n_groups + 1, dtype=np.int64)
    np.cumsum(np.bincount(pairs[0], minlength=n_groups), out=ptr[1:])
    return ptr, pairs[1].astype(np.int64)


def _group_times(op_time_s: npt.NDArray[np.float64], groups: FusionGroups) -> npt.NDArray[np.float64]:
    """A group's node time: its members' times summed, an upper estimate of the fused kernel's
    (it no longer pays the intermediates' traffic); NaN (roofline) when one member gives none."""
    out = np.zeros((groups.n_groups, op_time_s.shape[1]), dtype=np.float64)
    for column in range(op_time_s.shape[1]):
        out[:, column] = np.bincount(groups.op_group, weights=op_time_s[:, column], minlength=groups.n_groups)
    return out


def fused_graph(graph: Hypergraph, groups: FusionGroups) -> Hypergraph:
    """``graph`` with every group contracted into one node named after its first operator.

    The node's FLOPs and parameter bytes are its members' sums; it reads the group's
    external inputs and writes its external outputs; internal tensors are gone. A graph
    with no multi-operator group comes back as it is.
    """
    if groups.n_groups == graph.n_ops:
        return graph
    keep = ~groups.internal_tensor
    new_id = np.full(graph.n_tensors, -1, dtype=np.int64)
    new_id[keep] = np.arange(int(keep.sum()), dtype=np.int64)
    n_groups = groups.n_groups
    producer = graph.tensor_producer
    tensor_group = np.where(producer >= 0, groups.op_group[np.maximum(producer, 0)], -1)
    in_ptr, in_tensors = _group_csr(
        graph.input_ptr, graph.input_tensors, groups.op_group, keep, n_groups, tensor_group=tensor_group
    )
    out_ptr, out_tensors = _group_csr(graph.output_ptr, graph.output_tensors, groups.op_group, keep, n_groups)
    anchor = groups.group_anchor
    kept = np.flatnonzero(keep)
    fused = build_hypergraph(
        name=graph.name,
        op_names=graph.op_names[anchor],
        op_types=graph.op_types[anchor],
        op_flops=np.bincount(groups.op_group, weights=graph.op_flops, minlength=n_groups),
        input_ptr=in_ptr,
        input_tensors=new_id[in_tensors],
        output_ptr=out_ptr,
        output_tensors=new_id[out_tensors],
        tensor_names=graph.tensor_names[kept],
        tensor_bytes=graph.tensor_bytes[kept],
        tensor_is_parameter=(graph.tensor_kind == TENSOR_PARAMETER)[kept],
        op_param_bytes=np.bincount(groups.op_group, weights=graph.op_param_bytes, minlength=n_groups),
        tensor_shapes=None if graph.tensor_shapes is None else [graph.tensor_shapes[t] for t in kept.tolist()],
        tensor_dtypes=None if graph.tensor_dtypes is None else [graph.tensor_dtypes[t] for t in kept.tolist()],
        warnings=graph.warnings,
        op_device_types=None if graph.op_device_types is None else graph.op_device_types[anchor],
        op_role=None if graph.op_role is None else graph.op_role[anchor],
        tensor_role=None if graph.tensor_role is None else graph.tensor_role[kept],
        tensor_of=None
        if graph.tensor_of is None
        else np.where(graph.tensor_of >= 0, new_id[graph.tensor_of], -1)[kept],
    )
    if graph.op_time_s is None:
        return fused
    return replace(fused, op_time_s=_group_times(graph.op_time_s, groups), op_time_keys=graph.op_time_keys)
