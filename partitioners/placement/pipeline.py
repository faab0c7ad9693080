"""Contiguous pipeline split and replica-per-device layouts of a micro-batched graph.

Pipeline parallelism (GPipe [1]_, PipeDream [2]_) cuts the forward operators, in
topological order, into contiguous *stages*; each stage runs on its own device
and micro-batches stream through. Because a stage only takes a contiguous range
of a topological order, every forward tensor flows from a lower stage to a higher
one: the stage graph is acyclic by construction, which is what a pipeline
schedule needs and what min-cut partitioners do not give (Moreira et al. [3]_,
Herrmann et al. [4]_). A gradient operator sits on its forward operator's stage
(so backward flows from higher stages to lower ones, as in GPipe / 1F1B), and
an optimizer step on the stage of the parameter it updates.

Stages are balanced as a *linear partition*: the smallest bottleneck ``B`` such
that a greedy left-to-right fill, stage ``s`` taking at most ``B * speed_s``
seconds and at most its memory budget, covers all operators in ``k`` stages,
found by bisection on ``B`` with prefix sums (``O(k log n)`` per probe).

Within one node a layout that gives each device whole micro-batches (data
parallelism over micro-batches, parameters replicated) often beats a pipeline; a
*hybrid* uses ``stages x replicas`` devices, micro-batch ``i`` running on replica
``i mod replicas`` of every stage. Optimizer steps are spread over the replicas
of their stage, which is the sharded-optimizer layout of ZeRO stage 1 [5]_.

References
----------
.. [1] Y. Huang et al., "GPipe", NeurIPS 2019.
.. [2] D. Narayanan et al., "PipeDream: Generalized Pipeline Parallelism for DNN
   Training", SOSP 2019.
.. [3] O. Moreira, M. Popp, C. Schulz, "Graph Partitioning with Acyclicity
   Constraints", SEA 2017.
.. [4] J. Herrmann, M. Y. Özkaya, B. Uçar, K. Kaya, Ü. V. Çatalyürek, "Multilevel
   Algorithms for Acyclic Partitioning of Directed Acyclic Graphs", SIAM J. Sci.
   Comput. 41(4), 2019.
.. [5] S. Rajbhandari et al., "ZeRO: Memory Optimizations Toward Training
   Trillion Parameter Models", SC 2020.
"""

from __future__ import annotations

import numpy as np

from partitioners.graph.hypergraph import Hypergraph
from partitioners.graph.transforms import PHASE_OPTIMIZER, ExpandedGraph

__all__ = [
    "linear_partition",
    "stage_of_origin",
    "hybrid_layout",
    "quotient_is_acyclic",
]


def linear_partition(
    weight: np.ndarray,
    speeds: np.ndarray,
    memory_bytes: np.ndarray | None = None,
    memory_budget_bytes: np.ndarray | None = None,
) -> tuple[np.ndarray, bool]:
    """Cut a sequence into ``len(speeds)`` contiguous stages, balancing ``weight / speed``.

    Parameters
    ----------
    weight : numpy.ndarray of float, shape (n,)
        Work of each item, in sequence order (seconds on a unit-speed device).
    speeds : numpy.ndarray of float, shape (k,)
        Relative speed of each stage's device, in stage order.
    memory_bytes : numpy.ndarray, shape (n,), optional
        Memory each item needs on its stage's device.
    memory_budget_bytes : numpy.ndarray, shape (k,), optional
        Memory each stage may use.

    Returns
    -------
    stage : numpy.ndarray of int64, shape (n,)
        Stage of each item, non-decreasing; stages may be empty.
    memory_ok : bool
        Whether every stage is within its memory budget (when one was given).
    """
    weight = np.maximum(np.asarray(weight, dtype=np.float64), 0.0)
    speeds = np.asarray(speeds, dtype=np.float64)
    n, k = weight.shape[0], speeds.shape[0]
    if n == 0:
        return np.zeros(0, dtype=np.int64), True
    if k <= 1:
        ok = memory_bytes is None or memory_budget_bytes is None or float(memory_bytes.sum()) <= memory_budget_bytes[0]
        return np.zeros(n, dtype=np.int64), bool(ok)
    cw = np.concatenate([[0.0], np.cumsum(weight)])
    use_mem = memory_bytes is not None and memory_budget_bytes is not None
    cm = np.concatenate([[0.0], np.cumsum(memory_bytes)]) if memory_bytes is not None and use_mem else None

    def fill(bound: float) -> np.ndarray | None:
        starts = np.zeros(k + 1, dtype=np.int64)
        pos = 0
        for s in range(k):
            limit_w = cw[pos] + bound * speeds[s] * (1 + 1e-12)
            end = int(np.searchsorted(cw, limit_w, side="right")) - 1
            if use_mem and cm is not None and memory_budget_bytes is not None:
                end_m = int(np.searchsorted(cm, cm[pos] + memory_budget_bytes[s], side="right")) - 1
                end = min(end, end_m)
            end = max(min(end, n), pos)
            starts[s + 1] = end
            pos = end
        return starts if pos >= n else None

    lo = float(weight.max() / speeds.max())
    hi = float(cw[-1] / speeds.min()) + 1e-30
    best = fill(hi)
    memory_ok = True
    if best is None:
        # memory is binding whatever the balance: fall back to a time-only split
        memory_ok = False
        use_mem = False
        best = fill(hi)
    assert best is not None  # without the memory bound the largest bound always fits
    for _ in range(60):
        if hi - lo <= 1e-9 * hi:
            break
        mid = 0.5 * (lo + hi)
        cand = fill(mid)
        if cand is None:
            lo = mid
        else:
            hi, best = mid, cand
    stage = np.searchsorted(best[1:], np.arange(n), side="right").astype(np.int64)
    return np.minimum(stage, k - 1), memory_ok


def stage_of_origin(
    expanded: ExpandedGraph,
    origin_order: np.ndarray,
    origin_weight: np.ndarray,
    origin_memory_bytes: np.ndarray | None,
    speeds: np.ndarray,
    memory_budget_bytes: np.ndarray | None = None,
) -> tuple[np.ndarray, bool]:
    """Stage of every origin (forward) operator: a linear partition of a topological order.

    Returns ``(stage_by_origin, memory_ok)``; see :func:`linear_partition`.
    """
    n_origin = origin_order.shape[0]
    mem = origin_memory_bytes[origin_order] if origin_memory_bytes is not None else None
    seq_stage, ok = linear_partition(origin_weight[origin_order], speeds, mem, memory_budget_bytes)
    stage = np.empty(n_origin, dtype=np.int64)
    stage[origin_order] = seq_stage
    return stage, ok


def hybrid_layout(
    expanded: ExpandedGraph,
    stage_by_origin: np.ndarray,
    stage_devices: list[np.ndarray],
    op_weight: np.ndarray,
) -> np.ndarray:
    """Device of every operator for ``stages x replicas`` (replicas = devices per stage).

    Operator of micro-batch ``i`` whose origin is on stage ``s`` goes to
    ``stage_devices[s][i % len(stage_devices[s])]``. Optimizer steps of stage ``s``
    are spread over that stage's devices, heaviest first onto the least-loaded one
    (longest-processing-time rule), so no single replica holds all optimizer state.

    Parameters
    ----------
    expanded : ExpandedGraph
    stage_by_origin : numpy.ndarray of int64, shape (n_origin_ops,)
    stage_devices : list of numpy.ndarray of int64
        Inventory devices of each stage.
    op_weight : numpy.ndarray, shape (n_ops,)
        Cost of each expanded operator (for spreading optimizer steps).

    Returns
    -------
    numpy.ndarray of int64, shape (n_ops,)
    """
    stage = stage_by_origin[expanded.op_origin]
    replicas = np.array([len(d) for d in stage_devices], dtype=np.int64)
    table_ptr = np.concatenate([[0], np.cumsum(replicas)])
    table = np.concatenate(stage_devices).astype(np.int64)
    mb = np.maximum(expanded.op_micro_batch, 0)
    placement: np.ndarray = table[table_ptr[stage] + mb % replicas[stage]]
    steps = np.flatnonzero(expanded.op_phase == PHASE_OPTIMIZER)
    if steps.shape[0]:
        load = {int(d): 0.0 for d in table}
        order = steps[np.lexsort((steps, -op_weight[steps]))]
        for op in order.tolist():
            devs = stage_devices[int(stage[op])]
            d = min(devs.tolist(), key=lambda x: (load[x], x))
            placement[op] = d
            load[d] += float(op_weight[op])
    return placement


def quotient_is_acyclic(graph: Hypergraph, placement: np.ndarray, edge_mask: np.ndarray | None = None) -> bool:
    """Whether the device (stage) graph induced by ``placement`` has no directed cycle.

    Parameters
    ----------
    graph : Hypergraph
    placement : numpy.ndarray of int64, shape (n_ops,)
    edge_mask : numpy.ndarray of bool, optional
        Which producer -> consumer pairs of :meth:`Hypergraph.op_edges` count (e.g. forward
        edges only in training, where gradients flow back by design).
    """
    src, dst, _ = graph.op_edges()
    if edge_mask is not None:
        src, dst = src[edge_mask], dst[edge_mask]
    a, b = placement[src], placement[dst]
    cross = a != b
    if not cross.any():
        return True
    parts = np.unique(np.concatenate([a[cross], b[cross]]))
    idx_a = np.searchsorted(parts, a[cross])
    idx_b = np.searchsorted(parts, b[cross])
    k = parts.shape[0]
    edges = np.unique(idx_a * k + idx_b)
    ea, eb = edges // k, edges % k
    indeg = np.bincount(eb, minlength=k)
    out: list[list[int]] = [[] for _ in range(k)]
    for x, y in zip(ea.tolist(), eb.tolist()):
        out[x].append(y)
    stack = [i for i in range(k) if indeg[i] == 0]
    seen = 0
    indeg = indeg.tolist()
    while stack:
        x = stack.pop()
        seen += 1
        for y in out[x]:
            indeg[y] -= 1
            if indeg[y] == 0:
                stack.append(y)
    acyclic: bool = seen == k
    return acyclic
