"""Graph transforms applied before placement: training backward synthesis and micro-batches.

A caller posts the forward graph of one micro-batch. What runs on the cluster is
larger: in training every forward operator has a gradient operator, saved
activations stay alive until that gradient operator has read them, and weights,
gradients and optimizer state sit in memory; with ``m`` micro-batches the same
operators run ``m`` times on different data while sharing one copy of the
parameters (GPipe [1]_, PipeDream [2]_). Placing the expanded graph lets the same
partitioners and the same simulator reason about pipelining and replication
without a special case for either.

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
from partitioners.graph import TENSOR_ACTIVATION, TENSOR_PARAMETER, Hypergraph, build_hypergraph

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

#: Operator runs the forward pass of one micro-batch.
PHASE_FORWARD = 0
#: Operator computes gradients of one forward operator for one micro-batch.
PHASE_BACKWARD = 1
#: Operator applies the optimizer to one parameter (shared by all micro-batches).
PHASE_OPTIMIZER = 2

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
        ``"inference"`` or ``"training"``.
    micro_batches : int
    """

    graph: Hypergraph
    op_origin: np.ndarray
    op_micro_batch: np.ndarray
    op_phase: np.ndarray
    mode: str
    micro_batches: int


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

    kind = graph.tensor_kind
    is_param = kind == TENSOR_PARAMETER
    n_tensors = graph.n_tensors

    # ---- per-micro-batch template: local tensor ids [0, block) are repeated, shared ids
    # are encoded as -1 - shared_index so the replication pass can tell them apart.
    local_base = np.flatnonzero(~is_param)  # repeated base tensors, original order
    shared_base = np.flatnonzero(is_param)
    base_map = np.empty(n_tensors, dtype=np.int64)
    base_map[local_base] = np.arange(local_base.shape[0])
    base_map[shared_base] = -1 - np.arange(shared_base.shape[0])
    n_local = local_base.shape[0]

    in_owner, in_t = _pairs(graph.input_ptr, graph.input_tensors)
    out_owner, out_t = _pairs(graph.output_ptr, graph.output_tensors)
    tmpl_in_owner = [in_owner]
    tmpl_in_t = [base_map[in_t]]
    tmpl_out_owner = [out_owner]
    tmpl_out_t = [base_map[out_t]]
    n_block_ops = n
    new_local_names: list[np.ndarray] = []
    new_local_bytes: list[np.ndarray] = []
    step_params = np.zeros(0, dtype=np.int64)
    pgrad_owner_b = np.zeros(0, dtype=np.int64)
    pgrad_local = np.zeros(0, dtype=np.int64)

    if training:
        n_block_ops = 2 * n
        cons_t, cons_op = _pairs(graph.consumer_ptr, graph.consumer_ops)
        # activation gradients: one per (activation tensor, consumer) pair
        act_pair = kind[cons_t] == TENSOR_ACTIVATION
        ga_t, ga_c = cons_t[act_pair], cons_op[act_pair]
        ga_local = n_local + np.arange(ga_t.shape[0], dtype=np.int64)
        new_local_names.append(
            np.array([f"grad/{graph.tensor_names[t]}/{graph.op_names[c]}" for t, c in zip(ga_t, ga_c)], dtype=object)
        )
        new_local_bytes.append(graph.tensor_bytes[ga_t])
        # parameter gradients: one per (parameter, consumer) pair
        par_pair = is_param[cons_t]
        gp_t, gp_c = cons_t[par_pair], cons_op[par_pair]
        gp_local = n_local + ga_t.shape[0] + np.arange(gp_t.shape[0], dtype=np.int64)
        new_local_names.append(
            np.array([f"grad/{graph.tensor_names[t]}/{graph.op_names[c]}" for t, c in zip(gp_t, gp_c)], dtype=object)
        )
        new_local_bytes.append(graph.tensor_bytes[gp_t] / m)

        bwd = n + np.arange(n, dtype=np.int64)  # template id of grad/f is n + f
        # gradient op of the producer reads the activation gradients
        prod = graph.tensor_producer[ga_t]
        # seeds: activations nobody reads are graph outputs; their producer's gradient reads them
        n_consumers = np.diff(graph.consumer_ptr)
        seed_t = np.flatnonzero((kind == TENSOR_ACTIVATION) & (n_consumers == 0))
        # saved forward inputs (activations and graph inputs) and parameters
        tmpl_in_owner += [bwd[prod], bwd[graph.tensor_producer[seed_t]], bwd[in_owner]]
        tmpl_in_t += [ga_local, base_map[seed_t], base_map[in_t]]
        # gradient op of the consumer writes the activation and parameter gradients
        tmpl_out_owner += [bwd[ga_c], bwd[gp_c]]
        tmpl_out_t += [ga_local, gp_local]
        step_params = np.unique(gp_t)
        pgrad_owner_b = np.searchsorted(step_params, gp_t)
        pgrad_local = gp_local

    block = n_local + sum(x.shape[0] for x in new_local_bytes)
    t_in_owner = np.concatenate(tmpl_in_owner)
    t_in_t = np.concatenate(tmpl_in_t)
    t_out_owner = np.concatenate(tmpl_out_owner)
    t_out_t = np.concatenate(tmpl_out_t)

    def globalise(local: np.ndarray, mb: int) -> np.ndarray:
        shared = local < 0
        return np.where(shared, m * block + (-1 - local), mb * block + local)

    in_owner_all, in_t_all, out_owner_all, out_t_all = [], [], [], []
    for mb in range(m):
        in_owner_all.append(t_in_owner + mb * n_block_ops)
        in_t_all.append(globalise(t_in_t, mb))
        out_owner_all.append(t_out_owner + mb * n_block_ops)
        out_t_all.append(globalise(t_out_t, mb))

    n_steps = step_params.shape[0]
    n_shared = shared_base.shape[0]
    adam_ids = m * block + n_shared + np.arange(n_steps, dtype=np.int64)
    if training and n_steps:
        step_ops = m * n_block_ops + np.arange(n_steps, dtype=np.int64)
        # step reads the parameter, its optimizer state, then every micro-batch's gradients
        in_owner_all += [step_ops, step_ops]
        in_t_all += [m * block + (-1 - base_map[step_params]), adam_ids]
        for mb in range(m):
            in_owner_all.append(step_ops[pgrad_owner_b])
            in_t_all.append(mb * block + pgrad_local)

    n_ops_total = m * n_block_ops + n_steps
    n_tensors_total = m * block + n_shared + n_steps
    input_ptr, input_tensors = _csr(np.concatenate(in_owner_all), np.concatenate(in_t_all), n_ops_total)
    output_ptr, output_tensors = _csr(np.concatenate(out_owner_all), np.concatenate(out_t_all), n_ops_total)

    # ---- names, costs, metadata
    block_names = [graph.op_names]
    block_types = [graph.op_types]
    block_flops = [graph.op_flops]
    if training:
        block_names.append(_prefix("grad/", graph.op_names))
        block_types.append(_suffix(graph.op_types, "Grad"))
        block_flops.append(graph.op_flops * BACKWARD_FLOPS_FACTOR)
    block_names_arr = np.concatenate(block_names)
    local_tensor_names = np.concatenate([graph.tensor_names[local_base], *new_local_names])
    local_tensor_bytes = np.concatenate([graph.tensor_bytes[local_base], *new_local_bytes])
    op_names = []
    tensor_names = []
    for mb in range(m):
        suffix = f"@mb{mb}" if m > 1 else ""
        op_names.append(_suffix(block_names_arr, suffix) if suffix else block_names_arr)
        tensor_names.append(_suffix(local_tensor_names, suffix) if suffix else local_tensor_names)
    step_names = _prefix("step/", graph.tensor_names[step_params])
    op_names.append(step_names)
    tensor_names += [graph.tensor_names[shared_base], _prefix("adam/", graph.tensor_names[step_params])]
    param_bytes = graph.tensor_bytes[step_params]
    op_flops = np.concatenate([np.tile(np.concatenate(block_flops), m), param_bytes * OPTIMIZER_FLOPS_PER_PARAM_BYTE])
    op_types = np.concatenate([np.tile(np.concatenate(block_types), m), np.full(n_steps, "OptimizerStep", dtype=object)])
    tensor_bytes = np.concatenate(
        [np.tile(local_tensor_bytes, m), graph.tensor_bytes[shared_base], param_bytes * OPTIMIZER_STATE_FACTOR]
    )
    tensor_is_param = np.zeros(n_tensors_total, dtype=bool)
    tensor_is_param[m * block :] = True

    first_reader = graph.consumer_ops[graph.consumer_ptr[step_params]] if n_steps else np.zeros(0, dtype=np.int64)
    block_origin = np.tile(np.arange(n, dtype=np.int64), 2 if training else 1)
    block_phase = np.repeat(np.array([PHASE_FORWARD, PHASE_BACKWARD][: 2 if training else 1], dtype=np.int8), n)
    expanded = build_hypergraph(
        name=graph.name,
        op_names=np.concatenate(op_names),
        op_types=op_types,
        op_flops=op_flops,
        input_ptr=input_ptr,
        input_tensors=input_tensors,
        output_ptr=output_ptr,
        output_tensors=output_tensors,
        tensor_names=np.concatenate(tensor_names),
        tensor_bytes=tensor_bytes,
        tensor_is_parameter=tensor_is_param,
        warnings=list(graph.warnings),
    )
    return ExpandedGraph(
        graph=expanded,
        op_origin=np.concatenate([np.tile(block_origin, m), first_reader]),
        op_micro_batch=np.concatenate([np.repeat(np.arange(m, dtype=np.int64), n_block_ops), np.full(n_steps, -1)]),
        op_phase=np.concatenate([np.tile(block_phase, m), np.full(n_steps, PHASE_OPTIMIZER, dtype=np.int8)]),
        mode=mode,
        micro_batches=m,
    )
