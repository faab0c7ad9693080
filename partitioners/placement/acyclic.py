"""Acyclic repair: turn any device assignment into a pipeline-runnable stage order.

Min-cut partitions of a DAG usually induce a *cyclic* quotient graph (part A feeds
B and B feeds A), which a pipeline schedule cannot run. The repair here orders
the parts by the mean topological position of their operators and then pushes
every operator at least as late as its latest producer's stage, in one pass over
topological levels:

    stage(v) = max(rank(part(v)), max over producers p of stage(p))

After the pass every edge goes from a stage to the same or a later one, so the
stage graph is acyclic; operators only ever move to later stages, so the cost is
imbalance, bounded by how much the partition disagreed with the order. This is
the "fix the cycles by moving vertices forward" step that acyclic multilevel
partitioners use after refinement (Herrmann et al. [1]_, Moreira et al. [2]_).

References
----------
.. [1] J. Herrmann, M. Y. Özkaya, B. Uçar, K. Kaya, Ü. V. Çatalyürek, "Multilevel
   Algorithms for Acyclic Partitioning of Directed Acyclic Graphs", SIAM J. Sci.
   Comput. 41(4), 2019.
.. [2] O. Moreira, M. Popp, C. Schulz, "Graph Partitioning with Acyclicity
   Constraints", SEA 2017.
"""

from __future__ import annotations

import numpy as np

__all__ = ["acyclic_repair"]


def acyclic_repair(
    n_ops: int,
    src: np.ndarray,
    dst: np.ndarray,
    levels: np.ndarray,
    parts: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:
    """Stages that respect every edge, as close to ``parts`` as that allows.

    Parameters
    ----------
    n_ops : int
    src, dst : numpy.ndarray of int64
        Producer -> consumer operator pairs that must not go backwards.
    levels : numpy.ndarray of int64, shape (n_ops,)
        Longest-path level of each operator over these edges.
    parts : numpy.ndarray of int64, shape (n_ops,)
        Any assignment of operators to parts ``0..k-1``.

    Returns
    -------
    stage : numpy.ndarray of int64, shape (n_ops,)
        Stage ``0..k-1`` of every operator; ``stage[src] <= stage[dst]`` on every edge.
    part_of_stage : numpy.ndarray of int64, shape (k,)
        The part each stage index stands for (parts ordered by mean level).
    """
    parts = np.asarray(parts, dtype=np.int64)
    k = int(parts.max()) + 1 if parts.size else 1
    count = np.bincount(parts, minlength=k).astype(np.float64)
    mean_level = np.bincount(parts, weights=levels.astype(np.float64), minlength=k) / np.maximum(count, 1)
    part_of_stage = np.lexsort((np.arange(k), mean_level))
    rank_of_part = np.empty(k, dtype=np.int64)
    rank_of_part[part_of_stage] = np.arange(k)
    stage = rank_of_part[parts].copy()
    if src.shape[0] == 0:
        return stage, part_of_stage
    # process edges grouped by the consumer's level, shallowest first
    order = np.argsort(levels[dst], kind="stable")
    src_o, dst_o = src[order], dst[order]
    lv = levels[dst_o]
    cut = np.flatnonzero(np.diff(lv)) + 1
    starts = np.concatenate([[0], cut]).tolist()
    ends = np.concatenate([cut, [src_o.shape[0]]]).tolist()
    for a, b in zip(starts, ends):
        np.maximum.at(stage, dst_o[a:b], stage[src_o[a:b]])
    return stage, part_of_stage
