"""Hypergraph -> METIS graph, and the one place where costs become integers.

METIS [1]_ partitions graphs, not hypergraphs, so every tensor net (producer plus
consumers) is expanded: a small net becomes a clique whose edges carry
``bytes / (pins - 1)`` (so cutting one pin off costs about the tensor's bytes, the
usual clique-net model, Alpert & Kahng [2]_); a large net becomes a star around its
producer with the same per-edge weight, so expansion stays linear in the pins.
Parameter tensors are not nets here: a weight read on several devices is
replicated, which costs memory (checked by the caller), not per-step traffic.

pymetis silently accepts zero and negative weights, rejects floats and needs
symmetric edge weights, so :func:`quantise` maps non-negative float costs to
integers >= 1 with a bounded total, and the expansion symmetrises and merges
parallel edges before the call. Reported figures never come from these integers:
callers measure the partition with the connectivity metric on the hypergraph.

References
----------
.. [1] G. Karypis, V. Kumar, "A Fast and High Quality Multilevel Scheme for
   Partitioning Irregular Graphs", SIAM J. Sci. Comput. 20(1), 1998.
.. [2] C. J. Alpert, A. B. Kahng, "Recent directions in netlist partitioning: a
   survey", Integration 19(1-2), 1995 (clique and star net models).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pymetis

from partitioners.graph.hypergraph import TENSOR_PARAMETER, Hypergraph

__all__ = [
    "CLIQUE_MAX_PINS",
    "MetisGraph",
    "quantise",
    "metis_graph",
    "metis_partition",
    "target_fractions",
    "induced_subgraph",
]

#: Nets with more pins than this become stars instead of cliques.
CLIQUE_MAX_PINS = 8
#: Upper bound of a quantised total so sums never overflow METIS's 32-bit idx_t.
_TOTAL_MAX = 2**30


@dataclass(frozen=True, eq=False)
class MetisGraph:
    """A symmetric CSR graph with integer weights >= 1, ready for pymetis.

    Attributes
    ----------
    adj_starts, adjacent : numpy.ndarray of int64
        CSR adjacency; every edge is stored in both directions.
    edge_weights : numpy.ndarray of int64, same shape as ``adjacent``
    vertex_weights : numpy.ndarray of int64, shape (n_vertices,)
    """

    adj_starts: np.ndarray
    adjacent: np.ndarray
    edge_weights: np.ndarray
    vertex_weights: np.ndarray

    @property
    def n_vertices(self) -> int:
        return int(self.adj_starts.shape[0] - 1)


def quantise(values: np.ndarray, *, total_max: int = _TOTAL_MAX, resolution: int = 1 << 16) -> np.ndarray:
    """Non-negative floats -> integers >= 1 that keep the ratios where they matter.

    The largest value maps to ``resolution`` (or less when the total would pass
    ``total_max``); everything maps to at least 1 because METIS treats 0 as "free"
    and would pile such vertices or edges anywhere.

    Parameters
    ----------
    values : numpy.ndarray of float
    total_max : int
        Cap on the sum of the result.
    resolution : int
        Integer given to the largest value.

    Returns
    -------
    numpy.ndarray of int64, same shape, every entry >= 1.
    """
    values = np.nan_to_num(np.asarray(values, dtype=np.float64), nan=0.0, posinf=0.0, neginf=0.0)
    values = np.maximum(values, 0.0)
    if values.size == 0:
        return np.zeros(0, dtype=np.int64)
    top = float(values.max())
    if top <= 0.0:
        return np.ones(values.shape, dtype=np.int64)
    scale = resolution / top
    total = float(values.sum()) * scale + values.size
    if total > total_max:
        scale *= (total_max - values.size) / max(total - values.size, 1.0)
    return np.maximum(np.rint(values * scale), 1).astype(np.int64)


def metis_graph(
    graph: Hypergraph,
    vertex_cost: np.ndarray,
    *,
    clique_max_pins: int = CLIQUE_MAX_PINS,
    hypergraph: bool = True,
) -> MetisGraph:
    """Expand the hypergraph's tensor nets into a weighted METIS graph.

    Parameters
    ----------
    graph : Hypergraph
    vertex_cost : numpy.ndarray of float, shape (n_ops,)
        What to balance (seconds on a reference device, say); quantised here.
    clique_max_pins : int
        Nets with up to this many distinct pins become cliques, larger ones stars.
    hypergraph : bool
        ``False`` gives the plain operator graph instead (one edge per producer ->
        consumer pair, weighted by the tensor's bytes, so fan-out is over-counted):
        the edge-cut baseline the benchmarks compare against.

    Returns
    -------
    MetisGraph
    """
    n = graph.n_ops
    if not hypergraph:
        src, dst, tensors = graph.op_edges()
        return _symmetric(n, src, dst, graph.tensor_bytes[tensors], vertex_cost)
    counts = np.diff(graph.consumer_ptr)
    tensors = np.repeat(np.arange(graph.n_tensors, dtype=np.int64), counts)
    consumers = graph.consumer_ops
    producer = graph.tensor_producer[tensors]
    keep = graph.tensor_kind[tensors] != TENSOR_PARAMETER
    tensors, consumers, producer = tensors[keep], consumers[keep], producer[keep]

    # pins of each net: its consumers plus the producer when there is one (deduplicated)
    has_prod_net = graph.tensor_producer >= 0
    prod_tensors = np.flatnonzero(has_prod_net & (graph.tensor_kind != TENSOR_PARAMETER))
    pin_net = np.concatenate([tensors, prod_tensors])
    pin_op = np.concatenate([consumers, graph.tensor_producer[prod_tensors]])
    key = np.unique(pin_net * n + pin_op)
    pin_net, pin_op = key // n, key % n
    net_start = np.searchsorted(pin_net, np.arange(graph.n_tensors + 1))
    n_pins = np.diff(net_start)
    weight_per_edge = graph.tensor_bytes / np.maximum(n_pins - 1, 1)

    src_parts: list[np.ndarray] = []
    dst_parts: list[np.ndarray] = []
    w_parts: list[np.ndarray] = []
    # star nets: centre is the producer if any, else the first pin
    pin_n = n_pins[pin_net]
    is_star = pin_n > clique_max_pins
    centre = np.where(graph.tensor_producer >= 0, graph.tensor_producer, -1)
    first_pin = np.full(graph.n_tensors, -1, dtype=np.int64)
    nonempty = n_pins > 0
    first_pin[nonempty] = pin_op[net_start[:-1][nonempty]]
    centre = np.where(centre >= 0, centre, first_pin)
    star_pins = np.flatnonzero(is_star)
    src_parts.append(centre[pin_net[star_pins]])
    dst_parts.append(pin_op[star_pins])
    w_parts.append(weight_per_edge[pin_net[star_pins]])
    # clique nets: all pin pairs, enumerated by offset within the net
    clique = ~is_star & (pin_n >= 2)
    idx = np.flatnonzero(clique)
    pos = idx - net_start[pin_net[idx]]
    for offset in range(1, clique_max_pins):
        partner_pos = pos + offset
        ok = partner_pos < pin_n[idx]
        a = idx[ok]
        src_parts.append(pin_op[a])
        dst_parts.append(pin_op[a + offset])
        w_parts.append(weight_per_edge[pin_net[a]])

    return _symmetric(n, np.concatenate(src_parts), np.concatenate(dst_parts), np.concatenate(w_parts), vertex_cost)


def _symmetric(n: int, src: np.ndarray, dst: np.ndarray, w: np.ndarray, vertex_cost: np.ndarray) -> MetisGraph:
    """Symmetrise, drop self-loops, merge parallel edges and quantise."""
    not_loop = src != dst
    src, dst, w = src[not_loop], dst[not_loop], w[not_loop]
    # symmetrise and merge parallel edges
    all_src = np.concatenate([src, dst])
    all_dst = np.concatenate([dst, src])
    all_w = np.concatenate([w, w])
    edge_key = all_src * n + all_dst
    uniq, inverse = np.unique(edge_key, return_inverse=True)
    merged_w = np.bincount(inverse, weights=all_w, minlength=uniq.shape[0])
    u_src = uniq // n
    adj_starts = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(u_src, minlength=n), out=adj_starts[1:])
    return MetisGraph(
        adj_starts=adj_starts,
        adjacent=(uniq % n).astype(np.int64),
        edge_weights=quantise(merged_w),
        vertex_weights=quantise(vertex_cost, resolution=1 << 12),
    )


def target_fractions(speeds: np.ndarray) -> list[float]:
    """METIS target part weights proportional to ``speeds``, summing to exactly 1.

    pymetis warns (and will refuse) when ``tpwgts`` is off 1 by more than 1e-12, so
    the last entry absorbs the rounding.
    """
    speeds = np.asarray(speeds, dtype=np.float64)
    fractions: list[float] = (speeds / speeds.sum()).tolist()
    fractions[-1] = 1.0 - sum(fractions[:-1])
    return fractions


def metis_partition(
    mgraph: MetisGraph,
    n_parts: int,
    *,
    speeds: np.ndarray | None = None,
    imbalance_permille: int = 30,
    seed: int = 0,
) -> np.ndarray:
    """k-way METIS partition with part weights proportional to ``speeds``.

    Parameters
    ----------
    mgraph : MetisGraph
    n_parts : int
    speeds : numpy.ndarray, optional
        Relative speed of each part's device; equal parts when omitted.
    imbalance_permille : int
        METIS ``ufactor``: allowed overload of a part over its target, in 1/1000.
    seed : int
        METIS random seed (the result is deterministic for a given seed).

    Returns
    -------
    numpy.ndarray of int64, shape (n_vertices,)
        Part of each vertex, in ``[0, n_parts)``.
    """
    n = mgraph.n_vertices
    if n_parts <= 1 or n == 0:
        return np.zeros(n, dtype=np.int64)
    if n_parts >= n:
        return np.arange(n, dtype=np.int64) % n_parts
    tpwgts = target_fractions(speeds) if speeds is not None else None
    options = pymetis.Options(seed=int(seed) % (2**31 - 1), ufactor=int(imbalance_permille))
    result = pymetis.part_graph(
        int(n_parts),
        adjacency=pymetis.CSRAdjacency(adj_starts=mgraph.adj_starts, adjacent=mgraph.adjacent),
        vweights=mgraph.vertex_weights,
        eweights=mgraph.edge_weights,
        tpwgts=tpwgts,
        options=options,
        recursive=False,
    )
    return np.asarray(result.vertex_part, dtype=np.int64)


def induced_subgraph(mgraph: MetisGraph, vertices: np.ndarray) -> MetisGraph:
    """The METIS graph restricted to ``vertices`` (renumbered ``0..len-1`` in that order).

    Used by the hierarchical driver: level 1 splits between groups, then each
    group's vertices are split again between its devices.
    """
    vertices = np.asarray(vertices, dtype=np.int64)
    n = mgraph.n_vertices
    new_id = np.full(n, -1, dtype=np.int64)
    new_id[vertices] = np.arange(vertices.shape[0])
    counts = np.diff(mgraph.adj_starts)
    src = np.repeat(np.arange(n, dtype=np.int64), counts)
    keep = (new_id[src] >= 0) & (new_id[mgraph.adjacent] >= 0)
    s = new_id[src[keep]]
    order = np.argsort(s, kind="stable")
    adj_starts = np.zeros(vertices.shape[0] + 1, dtype=np.int64)
    np.cumsum(np.bincount(s, minlength=vertices.shape[0]), out=adj_starts[1:])
    return MetisGraph(
        adj_starts=adj_starts,
        adjacent=new_id[mgraph.adjacent[keep]][order],
        edge_weights=mgraph.edge_weights[keep][order],
        vertex_weights=mgraph.vertex_weights[vertices],
    )
