"""Graph transforms applied before placement: training backward synthesis and micro-batches.

A caller posts the forward graph of one micro-batch, or (exported by AOTAutograd
or ONNX Runtime's training artifacts) the whole training step of one micro-batch with
its operators' roles declared (:func:`~partitioners.graph.hypergraph.declares_training`).
What runs on the cluster is larger: in training every forward operator has a gradient operator, saved
activations stay alive until that gradient operator has read them, and weights,
gradients and optimizer state sit in memory; with ``m`` micro-batches the same
operators run ``m`` times on different data while sharing one copy of the
parameters (GPipe [1]_, PipeDream [2]_). Placing the expanded graph lets the same
partitioners and the same simulator reason about pipelining and replication
without a special case for either.

A declared training graph already has its backward pass and optimizer: it is only
repeated per micro-batch (:func:`expand_graph`), its optimizer operators once.

The expansion is built with vectorised CSR passes, so it costs a few array
operations per operator and no per-node Python objects.

References
----------
.. [1] Y. Huang et al., "GPipe: Efficient Training of Giant Neural Networks using
   Pipeline Parallelism", NeurIPS 2019.
.. [2] D. Narayanan et al., "PipeDream: Generalized Pipeline Parallelism for DNN
   Training", SOSP 2019.
.. [3] A. Griewank, A. Walther, "Evaluating Derivatives", 2nd ed., SIAM 2008
   (reverse mode costs a small constant times the forward evaluation; about 2x
   the forward FLOPs for matrix products: one product for each operand's gradient).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from partitioners.errors import InvalidInput
from partitioners.graph.hypergraph import (
    OP_ROLE_BACKWARD,
    OP_ROLE_FORWARD,
    OP_ROLE_OPTIMIZER,
    ROLE_ABSENT,
    TENSOR_ACTIVATION,
    TENSOR_INPUT,
    TENSOR_PARAMETER,
    TENSOR_ROLE_GRADIENT,
    TENSOR_ROLE_OPTIMIZER_STATE,
    Hypergraph,
    build_hypergraph,
    declares_training,
)

__all__ = [
    "PHASE_BACKWARD",
    "PHASE_FORWARD",
    "PHASE_OPTIMIZER",
    "BACKWARD_FLOPS_FACTOR",
    "OPTIMIZER_STATE_FACTOR",
    "OPTIMIZER_FLOPS_PER_PARAM_BYTE",
    "ExpandedGraph",
    "expand_graph",
]

#: Operator runs the forward pass of one micro-batch (a declared role's code, too).
PHASE_FORWARD = OP_ROLE_FORWARD
#: Operator computes gradients of one forward operator for one micro-batch.
PHASE_BACKWARD = OP_ROLE_BACKWARD
#: Operator applies the optimizer to one parameter (shared by all micro-batches).
PHASE_OPTIMIZER = OP_ROLE_OPTIMIZER

#: Gradient operator FLOPs over forward FLOPs (one product per operand gradient) [3]_.
BACKWARD_FLOPS_FACTOR = 2.0
#: Optimizer state bytes over parameter bytes (Adam: first and second moments).
OPTIMIZER_STATE_FACTOR = 2.0
#: Optimizer FLOPs per parameter byte (Adam: about 8 FLOPs per 4-byte element).
OPTIMIZER_FLOPS_PER_PARAM_BYTE = 2.0


@dataclass(frozen=True, eq=False)
class ExpandedGraph:
    """The graph that is actually placed, with where each operator came from.

    Attributes
    ----------
    graph : Hypergraph
        The expanded graph (the input graph itself when ``mode="inference"`` and
        ``micro_batches == 1``).
    op_origin : numpy.ndarray of int64, shape (n_ops,)
        The forward operator of the input graph each operator derives from; for an
        optimizer step, the first operator that reads its parameter.
    op_micro_batch : numpy.ndarray of int64, shape (n_ops,)
        Micro-batch index, ``-1`` for optimizer steps (shared by all micro-batches).
    op_phase : numpy.ndarray of int8, shape (n_ops,)
        ``PHASE_FORWARD``, ``PHASE_BACKWARD`` or ``PHASE_OPTIMIZER``.
    mode : str
        ``"inference"`` or ``"training"`` (always training for a declared training graph).
    micro_batches : int
    declared : bool
        The input graph declared its own backward pass and optimizer: its operators
        are their own origins, and nothing was synthesised.
    """

    graph: Hypergraph
    op_origin: np.ndarray
    op_micro_batch: np.ndarray
    op_phase: np.ndarray
    mode: str
    micro_batches: int
    declared: bool = False


def _pairs(ptr: np.ndarray, items: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    owners = np.repeat(np.arange(ptr.shape[0] - 1, dtype=np.int64), np.diff(ptr))
    return owners, np.asarray(items, dtype=np.int64)


def _csr(owners: np.ndarray, items: np.ndarray, n_owners: int) -> tuple[np.ndarray, np.ndarray]:
    """CSR from (owner, item) pairs, keeping the given order within each owner."""
    order = np.argsort(owners, kind="stable")
    ptr = np.zeros(n_owners + 1, dtype=np.int64)
    np.cumsum(np.bincount(owners, minlength=n_owners), out=ptr[1:])
    return ptr, items[order]


def _suffix(names: np.ndarray, suffix: str) -> np.ndarray:
    return np.array([f"{name}{suffix}" for name in names], dtype=object)


def _prefix(prefix: str, names: np.ndarray) -> np.ndarray:
    return np.array([f"{prefix}{name}" for name in names], dtype=object)


@dataclass(frozen=True, eq=False)
class _TensorSlots:
    """Where each tensor of the input graph goes in one micro-batch's block.

    Activations and graph inputs are repeated per micro-batch and get local ids
    ``[0, len(local))`` in their original order; parameters are shared by all
    micro-batches and are encoded as ``-1 - shared index``, so the replication can
    tell the two apart with one sign test.
    """

    local: np.ndarray  # base tensor ids repeated per micro-batch
    shared: np.ndarray  # base tensor ids of parameters
    slot: np.ndarray  # base tensor id -> local id, or -1 - shared index


def _tensor_slots(graph: Hypergraph) -> _TensorSlots:
    is_param = graph.tensor_kind == TENSOR_PARAMETER
    local, shared = np.flatnonzero(~is_param), np.flatnonzero(is_param)
    slot = np.empty(graph.n_tensors, dtype=np.int64)
    slot[local] = np.arange(local.shape[0])
    slot[shared] = -1 - np.arange(shared.shape[0])
    return _TensorSlots(local, shared, slot)


@dataclass(frozen=True, eq=False)
class _Block:
    """One micro-batch's operators and their (operator, tensor) edges in slot ids.

    Tensors the block adds (gradients) take local ids after the repeated base
    tensors, in the order of ``new_tensor_names``. The optimizer steps that follow
    all micro-batches read the parameter gradients listed here.
    """

    n_ops: int
    n_local: int  # repeated base tensors (see _TensorSlots)
    input_owner: np.ndarray
    input_tensor: np.ndarray
    output_owner: np.ndarray
    output_tensor: np.ndarray
    new_tensor_names: np.ndarray
    new_tensor_bytes: np.ndarray
    stepped_params: np.ndarray  # base ids of parameters that get an optimizer step, ascending
    param_grad_step: np.ndarray  # per parameter-gradient tensor: index into stepped_params
    param_grad_local: np.ndarray  # per parameter-gradient tensor: its local id

    @property
    def n_tensors(self) -> int:
        """Local tensors per micro-batch: the repeated base tensors plus the new ones."""
        n_new: int = self.new_tensor_bytes.shape[0]
        return self.n_local + n_new


def _forward_block(graph: Hypergraph, slots: _TensorSlots) -> _Block:
    """The input graph itself as one micro-batch's block (inference)."""
    in_owner, in_tensor = _pairs(graph.input_ptr, graph.input_tensors)
    out_owner, out_tensor = _pairs(graph.output_ptr, graph.output_tensors)
    none = np.zeros(0, dtype=np.int64)
    return _Block(
        graph.n_ops,
        slots.local.shape[0],
        in_owner,
        slots.slot[in_tensor],
        out_owner,
        slots.slot[out_tensor],
        np.zeros(0, dtype=object),
        np.zeros(0),
        none,
        none,
        none,
    )


def _gradient_names(graph: Hypergraph, tensors: np.ndarray, consumers: np.ndarray) -> np.ndarray:
    """``grad/<tensor>/<consumer>``; an operator that reads a tensor twice (``Mul(x, x)``) writes
    one gradient per read, the second named ``.../<consumer>#1`` so that every name stays unique."""
    seen: dict[tuple[int, int], int] = {}
    names = []
    for t, c in zip(tensors.tolist(), consumers.tolist()):
        repeat = seen.get((t, c), 0)
        seen[(t, c)] = repeat + 1
        name = f"grad/{graph.tensor_names[t]}/{graph.op_names[c]}"
        names.append(f"{name}#{repeat}" if repeat else name)
    return np.array(names, dtype=object)


def _training_block(graph: Hypergraph, slots: _TensorSlots, micro_batches: int) -> _Block:
    """The forward operators followed by one gradient operator each (see :func:`expand_graph`).

    Gradient operator ``grad/f`` has block id ``n + f``. Gradients are per
    (tensor, consumer) pair, because each consumer's gradient operator writes its own
    contribution; a parameter gradient is a ``1/m`` share of the accumulated buffer.
    """
    n, n_local, kind = graph.n_ops, slots.local.shape[0], graph.tensor_kind
    forward = _forward_block(graph, slots)
    consumed, consumer = _pairs(graph.consumer_ptr, graph.consumer_ops)
    act_pair = kind[consumed] == TENSOR_ACTIVATION
    act_t, act_consumer = consumed[act_pair], consumer[act_pair]
    act_grad = n_local + np.arange(act_t.shape[0], dtype=np.int64)
    par_pair = kind[consumed] == TENSOR_PARAMETER
    par_t, par_consumer = consumed[par_pair], consumer[par_pair]
    par_grad = n_local + act_t.shape[0] + np.arange(par_t.shape[0], dtype=np.int64)

    grad_op = n + np.arange(n, dtype=np.int64)
    # seeds: activations nobody reads are graph outputs; their producer's gradient reads them
    seeds = np.flatnonzero((kind == TENSOR_ACTIVATION) & (np.diff(graph.consumer_ptr) == 0))
    # the producer's gradient reads the activation gradients, the seeds, and the saved
    # forward inputs (activations and graph inputs) and parameters
    input_owner = [
        forward.input_owner,
        grad_op[graph.tensor_producer[act_t]],
        grad_op[graph.tensor_producer[seeds]],
        grad_op[forward.input_owner],
    ]
    input_tensor = [forward.input_tensor, act_grad, slots.slot[seeds], forward.input_tensor]
    # the consumer's gradient writes the activation and parameter gradients
    output_owner = [forward.output_owner, grad_op[act_consumer], grad_op[par_consumer]]
    output_tensor = [forward.output_tensor, act_grad, par_grad]
    stepped = np.unique(par_t)
    return _Block(
        2 * n,
        n_local,
        np.concatenate(input_owner),
        np.concatenate(input_tensor),
        np.concatenate(output_owner),
        np.concatenate(output_tensor),
        np.concatenate([_gradient_names(graph, act_t, act_consumer), _gradient_names(graph, par_t, par_consumer)]),
        np.concatenate([graph.tensor_bytes[act_t], graph.tensor_bytes[par_t] / micro_batches]),
        stepped,
        np.searchsorted(stepped, par_t),
        par_grad,
    )


@dataclass(frozen=True, eq=False)
class _Wiring:
    """CSR inputs and outputs of the expanded graph."""

    input_ptr: np.ndarray
    input_tensors: np.ndarray
    output_ptr: np.ndarray
    output_tensors: np.ndarray


def _replicate(block: _Block, slots: _TensorSlots, micro_batches: int) -> _Wiring:
    """Repeat the block per micro-batch and add one optimizer step per stepped parameter.

    Expanded ids: micro-batch ``i``'s operators are ``[i * block.n_ops, (i + 1) *
    block.n_ops)`` and its tensors ``[i * block.n_tensors, ...)``; after all blocks come
    the shared parameters, then the optimizer state ``adam/w``, and the optimizer steps
    after the last block's operators. A step reads its parameter, its optimizer state,
    then every micro-batch's gradients of it.
    """
    m, width = micro_batches, block.n_tensors
    shared_base = m * width

    def expanded_ids(slot_ids: np.ndarray, mb: int) -> np.ndarray:
        return np.where(slot_ids < 0, shared_base + (-1 - slot_ids), mb * width + slot_ids)

    in_owner = [block.input_owner + mb * block.n_ops for mb in range(m)]
    in_tensor = [expanded_ids(block.input_tensor, mb) for mb in range(m)]
    out_owner = [block.output_owner + mb * block.n_ops for mb in range(m)]
    out_tensor = [expanded_ids(block.output_tensor, mb) for mb in range(m)]
    n_steps = block.stepped_params.shape[0]
    if n_steps:
        step_ops = m * block.n_ops + np.arange(n_steps, dtype=np.int64)
        optimizer_state = shared_base + slots.shared.shape[0] + np.arange(n_steps, dtype=np.int64)
        in_owner += [step_ops, step_ops]
        in_tensor += [shared_base + (-1 - slots.slot[block.stepped_params]), optimizer_state]
        for mb in range(m):
            in_owner.append(step_ops[block.param_grad_step])
            in_tensor.append(mb * width + block.param_grad_local)
    n_ops = m * block.n_ops + n_steps
    input_ptr, input_tensors = _csr(np.concatenate(in_owner), np.concatenate(in_tensor), n_ops)
    output_ptr, output_tensors = _csr(np.concatenate(out_owner), np.concatenate(out_tensor), n_ops)
    return _Wiring(input_ptr, input_tensors, output_ptr, output_tensors)


def _per_micro_batch(names: np.ndarray, micro_batches: int) -> list[np.ndarray]:
    """Each micro-batch's copy of ``names``, suffixed ``@mb<i>`` when there are several."""
    if micro_batches == 1:
        return [names]
    return [_suffix(names, f"@mb{mb}") for mb in range(micro_batches)]


def _expanded_hypergraph(
    graph: Hypergraph, slots: _TensorSlots, block: _Block, wiring: _Wiring, training: bool, micro_batches: int
) -> Hypergraph:
    """Names, types, FLOPs and bytes of the expanded operators and tensors, with their wiring."""
    m, stepped = micro_batches, block.stepped_params
    phases = 2 if training else 1
    block_names = np.concatenate([graph.op_names, _prefix("grad/", graph.op_names)][:phases])
    block_types = np.concatenate([graph.op_types, _suffix(graph.op_types, "Grad")][:phases])
    block_flops = np.concatenate([graph.op_flops, graph.op_flops * BACKWARD_FLOPS_FACTOR][:phases])
    local_names = np.concatenate([graph.tensor_names[slots.local], block.new_tensor_names])
    local_bytes = np.concatenate([graph.tensor_bytes[slots.local], block.new_tensor_bytes])
    param_bytes = graph.tensor_bytes[stepped]
    n_tensors = m * block.n_tensors + slots.shared.shape[0] + stepped.shape[0]
    tensor_is_parameter = np.zeros(n_tensors, dtype=bool)
    tensor_is_parameter[m * block.n_tensors :] = True
    tensor_role = tensor_of = None
    if training:
        # the synthesised parameter gradients and optimizer state, labelled as a declared graph's
        tensor_role = np.full(n_tensors, ROLE_ABSENT, dtype=np.int8)
        tensor_of = np.full(n_tensors, -1, dtype=np.int64)
        shared_base = m * block.n_tensors
        param_id = shared_base + (-1 - slots.slot[stepped])
        grad_ids = (np.arange(m, dtype=np.int64)[:, None] * block.n_tensors + block.param_grad_local).ravel()
        tensor_role[grad_ids] = TENSOR_ROLE_GRADIENT
        tensor_of[grad_ids] = np.tile(param_id[block.param_grad_step], m)
        state_ids = shared_base + slots.shared.shape[0] + np.arange(stepped.shape[0], dtype=np.int64)
        tensor_role[state_ids] = TENSOR_ROLE_OPTIMIZER_STATE
        tensor_of[state_ids] = param_id
    return build_hypergraph(
        name=graph.name,
        op_names=np.concatenate([*_per_micro_batch(block_names, m), _prefix("step/", graph.tensor_names[stepped])]),
        op_types=np.concatenate([np.tile(block_types, m), np.full(stepped.shape[0], "OptimizerStep", dtype=object)]),
        op_flops=np.concatenate([np.tile(block_flops, m), param_bytes * OPTIMIZER_FLOPS_PER_PARAM_BYTE]),
        input_ptr=wiring.input_ptr,
        input_tensors=wiring.input_tensors,
        output_ptr=wiring.output_ptr,
        output_tensors=wiring.output_tensors,
        tensor_names=np.concatenate(
            [
                *_per_micro_batch(local_names, m),
                graph.tensor_names[slots.shared],
                _prefix("adam/", graph.tensor_names[stepped]),
            ]
        ),
        tensor_bytes=np.concatenate(
            [np.tile(local_bytes, m), graph.tensor_bytes[slots.shared], param_bytes * OPTIMIZER_STATE_FACTOR]
        ),
        tensor_is_parameter=tensor_is_parameter,
        warnings=list(graph.warnings),
        tensor_role=tensor_role,
        tensor_of=tensor_of,
    )


def _declared_phases(graph: Hypergraph) -> np.ndarray:
    """Each operator's declared role as a phase; an operator without one is forward."""
    if graph.op_role is None:
        return np.full(graph.n_ops, PHASE_FORWARD, dtype=np.int8)
    return np.where(graph.op_role < 0, PHASE_FORWARD, graph.op_role).astype(np.int8)


def _shared_tensors(graph: Hypergraph, optimizer: np.ndarray) -> np.ndarray:
    """Tensors of one step rather than one micro-batch: parameters and optimizer state,
    what optimizer operators write, and graph inputs only they read (a learning rate)."""
    shared: np.ndarray = graph.tensor_kind == TENSOR_PARAMETER
    producer = graph.tensor_producer
    shared |= (producer >= 0) & optimizer[np.maximum(producer, 0)]
    readers = np.diff(graph.consumer_ptr)
    reader_tensor = np.repeat(np.arange(graph.n_tensors, dtype=np.int64), readers)
    other_readers = np.bincount(reader_tensor[~optimizer[graph.consumer_ops]], minlength=graph.n_tensors)
    shared |= (graph.tensor_kind == TENSOR_INPUT) & (readers > 0) & (other_readers == 0)
    return shared


def _expand_declared(graph: Hypergraph, micro_batches: int) -> ExpandedGraph:
    """A declared training graph repeated per micro-batch (see :func:`expand_graph`).

    Expanded ids: micro-batch ``i``'s forward and backward operators are ``[i * c,
    (i + 1) * c)`` (``c`` of them, in input order), the optimizer operators follow all
    micro-batches; tensors likewise, micro-batch blocks first, then the shared ones.
    An optimizer operator reads every micro-batch's copy of a per-micro-batch tensor,
    in argument order.
    """
    m, n = micro_batches, graph.n_ops
    phase = _declared_phases(graph)
    optimizer = phase == PHASE_OPTIMIZER
    if m == 1:
        return ExpandedGraph(
            graph=graph,
            op_origin=np.arange(n, dtype=np.int64),
            op_micro_batch=np.where(optimizer, -1, 0).astype(np.int64),
            op_phase=phase,
            mode="training",
            micro_batches=1,
            declared=True,
        )
    copied, steps = np.flatnonzero(~optimizer), np.flatnonzero(optimizer)
    nc = copied.shape[0]
    op_new = np.empty(n, dtype=np.int64)
    op_new[copied] = np.arange(nc, dtype=np.int64)
    op_new[steps] = m * nc + np.arange(steps.shape[0], dtype=np.int64)
    shared = _shared_tensors(graph, optimizer)
    local, common = np.flatnonzero(~shared), np.flatnonzero(shared)
    nl = local.shape[0]
    slot = np.empty(graph.n_tensors, dtype=np.int64)
    slot[local] = np.arange(nl, dtype=np.int64)
    slot[common] = -1 - np.arange(common.shape[0], dtype=np.int64)

    def expanded_ids(slots: np.ndarray, mb: np.ndarray | int) -> np.ndarray:
        return np.where(slots < 0, m * nl + (-1 - slots), mb * nl + slots)

    wiring = []
    for ptr, items in ((graph.input_ptr, graph.input_tensors), (graph.output_ptr, graph.output_tensors)):
        owner, tensor = _pairs(ptr, items)
        on_copy = ~optimizer[owner]
        owners = [op_new[owner[on_copy]] + mb * nc for mb in range(m)]
        tensors = [expanded_ids(slot[tensor[on_copy]], mb) for mb in range(m)]
        # an optimizer operator reads each per-micro-batch tensor once per micro-batch
        s_owner, s_tensor = owner[~on_copy], tensor[~on_copy]
        repeats = np.where(slot[s_tensor] >= 0, m, 1)
        first = np.repeat(np.cumsum(repeats) - repeats, repeats)
        mb_of = np.arange(int(repeats.sum()), dtype=np.int64) - first
        owners.append(np.repeat(op_new[s_owner], repeats))
        tensors.append(expanded_ids(np.repeat(slot[s_tensor], repeats), mb_of))
        wiring.append(_csr(np.concatenate(owners), np.concatenate(tensors), m * nc + steps.shape[0]))

    local_bytes = graph.tensor_bytes[local].copy()
    if graph.tensor_role is not None:
        # every micro-batch adds its share to one accumulated gradient, as synthesised ones do
        local_bytes[graph.tensor_role[local] == TENSOR_ROLE_GRADIENT] /= m
    tensor_role = tensor_of = None
    if graph.tensor_role is not None and graph.tensor_of is not None:
        tensor_role = np.concatenate([np.tile(graph.tensor_role[local], m), graph.tensor_role[common]])
        of = np.concatenate([np.tile(graph.tensor_of[local], m), graph.tensor_of[common]])
        tensor_of = np.where(of >= 0, expanded_ids(slot[np.maximum(of, 0)], 0), -1)
    op_role = np.concatenate([np.tile(phase[copied], m), phase[steps]])
    expanded = build_hypergraph(
        name=graph.name,
        op_names=np.concatenate([*_per_micro_batch(graph.op_names[copied], m), graph.op_names[steps]]),
        op_types=np.concatenate([np.tile(graph.op_types[copied], m), graph.op_types[steps]]),
        op_flops=np.concatenate([np.tile(graph.op_flops[copied], m), graph.op_flops[steps]]),
        input_ptr=wiring[0][0],
        input_tensors=wiring[0][1],
        output_ptr=wiring[1][0],
        output_tensors=wiring[1][1],
        tensor_names=np.concatenate([*_per_micro_batch(graph.tensor_names[local], m), graph.tensor_names[common]]),
        tensor_bytes=np.concatenate([np.tile(local_bytes, m), graph.tensor_bytes[common]]),
        tensor_is_parameter=np.concatenate(
            [np.zeros(m * nl, dtype=bool), graph.tensor_kind[common] == TENSOR_PARAMETER]
        ),
        op_param_bytes=np.concatenate([np.tile(graph.op_param_bytes[copied], m), graph.op_param_bytes[steps]]),
        warnings=list(graph.warnings),
        op_role=op_role,
        tensor_role=tensor_role,
        tensor_of=tensor_of,
    )
    return ExpandedGraph(
        graph=expanded,
        op_origin=np.concatenate([np.tile(copied, m), steps]),
        op_micro_batch=np.concatenate([np.repeat(np.arange(m, dtype=np.int64), nc), np.full(steps.shape[0], -1)]),
        op_phase=op_role,
        mode="training",
        micro_batches=m,
        declared=True,
    )


def expand_graph(graph: Hypergraph, *, mode: str = "inference", micro_batches: int = 1) -> ExpandedGraph:
    """Expand a one-micro-batch forward graph into what runs: backward pass and micro-batches.

    Training adds, per forward operator ``f``, a gradient operator ``grad/f`` with
    ``BACKWARD_FLOPS_FACTOR`` times its FLOPs that reads

    * one gradient tensor per (output of ``f``, consumer) pair, produced by the
      consumer's gradient operator (a graph output with no consumer is read itself,
      as the seed of the loss gradient),
    * the activations ``f`` read (saved activations stay alive until here) and its
      parameters,

    and writes one gradient tensor per activation it read and one per parameter it
    read. Each parameter ``w`` gets an optimizer operator ``step/w`` that reads
    ``w``, its optimizer state ``adam/w`` (``OPTIMIZER_STATE_FACTOR`` x the
    parameter bytes, a resident parameter-kind tensor) and the parameter gradients
    of every micro-batch. A parameter gradient from one of ``m`` micro-batches
    is ``bytes(w) / m``: gradients accumulate into one buffer, so memory counts one
    gradient per parameter (not ``m``) while every micro-batch's contribution still
    travels to the optimizer's device.

    With ``micro_batches = m`` every forward and gradient operator and every
    non-parameter tensor is repeated ``m`` times (suffix ``@mb<i>``); parameters
    and optimizer state are shared.

    A graph that declares its own training step
    (:func:`~partitioners.graph.hypergraph.declares_training`) is planned as the
    training step it is, whatever ``mode`` says: nothing is synthesised. Its forward
    and backward operators and per-micro-batch tensors are repeated ``m`` times; its
    optimizer operators, parameters, optimizer state, what optimizer operators write
    and graph inputs only they read are shared, and each optimizer operator reads every
    micro-batch's copy of the gradients it reads, so it runs after all of them. As for
    a synthesised step, a declared gradient's copy in each of ``m`` micro-batches is
    ``1/m`` of its bytes: memory counts one accumulated gradient, and every
    micro-batch's share computed away from the optimizer operator's device travels
    to it (the gradient reduction). With ``m = 1`` the graph is placed as it is.

    Parameters
    ----------
    graph : Hypergraph
        Forward graph of one micro-batch.
    mode : {"inference", "training"}
    micro_batches : int
        ``m >= 1``.

    Returns
    -------
    ExpandedGraph

    Raises
    ------
    InvalidInput
        On an unknown mode or ``micro_batches < 1``.
    """
    if mode not in ("inference", "training"):
        raise InvalidInput(f"mode must be 'inference' or 'training', not {mode!r}", field="options.mode")
    m = int(micro_batches)
    if m < 1:
        raise InvalidInput(f"micro_batches must be >= 1, got {micro_batches}", field="options.micro_batches")
    if declares_training(graph):
        return _expand_declared(graph, m)
    n = graph.n_ops
    training = mode == "training"
    if not training and m == 1:
        return ExpandedGraph(
            graph=graph,
            op_origin=np.arange(n, dtype=np.int64),
            op_micro_batch=np.zeros(n, dtype=np.int64),
            op_phase=np.zeros(n, dtype=np.int8),
            mode=mode,
            micro_batches=1,
        )
    slots = _tensor_slots(graph)
    block = _training_block(graph, slots, m) if training else _forward_block(graph, slots)
    wiring = _replicate(block, slots, m)
    stepped = block.stepped_params
    n_steps = stepped.shape[0]
    # an optimizer step derives from the first operator that reads its parameter
    first_reader = graph.consumer_ops[graph.consumer_ptr[stepped]]
    phases = np.array([PHASE_FORWARD, PHASE_BACKWARD][: 2 if training else 1], dtype=np.int8)
    return ExpandedGraph(
        graph=_expanded_hypergraph(graph, slots, block, wiring, training, m),
        op_origin=np.concatenate([np.tile(np.arange(n, dtype=np.int64), phases.shape[0] * m), first_reader]),
        op_micro_batch=np.concatenate([np.repeat(np.arange(m, dtype=np.int64), block.n_ops), np.full(n_steps, -1)]),
        op_phase=np.concatenate([np.tile(np.repeat(phases, n), m), np.full(n_steps, PHASE_OPTIMIZER, dtype=np.int8)]),
        mode=mode,
        micro_batches=m,
    )
