"""Alpha-beta (latency-bandwidth) costs of point-to-point transfers and collectives.

One place for these formulas so the operator-graph simulator and the 3D-parallel
planner agree. Every function takes the link as ``latency_s`` (alpha) and
``bandwidth_bytes_per_s`` (1/beta) and returns seconds.

References
----------
.. [1] R. Thakur, R. Rabenseifner, W. Gropp, "Optimization of Collective
   Communication Operations in MPICH", IJHPCA 19(1), 2005 (ring, recursive
   doubling/halving costs).
.. [2] P. Patarasuk, X. Yuan, "Bandwidth optimal all-reduce algorithms for
   clusters of workstations", JPDC 69(2), 2009 (ring all-reduce is
   bandwidth-optimal: 2(p-1)/p * n bytes per rank).
.. [3] NCCL documentation / S. Jeaugey, "Massively scale your deep learning
   training with NCCL 2.4" (2019): double binary trees give log-depth latency
   with full bandwidth for all-reduce.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = [
    "LinkSpec",
    "p2p_time_s",
    "allreduce_time_s",
    "allgather_time_s",
    "reduce_scatter_time_s",
    "alltoall_time_s",
    "hierarchical_allreduce_time_s",
    "hierarchical_allgather_time_s",
    "hierarchical_alltoall_time_s",
]


@dataclass(frozen=True)
class LinkSpec:
    """A link class: per-direction bandwidth a rank can drive and one-message latency."""

    bandwidth_bytes_per_s: float
    latency_s: float


def p2p_time_s(n_bytes: float, link: LinkSpec) -> float:
    """Send ``n_bytes`` over one link: ``alpha + n * beta``."""
    if n_bytes <= 0:
        return 0.0
    return link.latency_s + n_bytes / link.bandwidth_bytes_per_s


def allreduce_time_s(n_bytes: float, n_ranks: int, link: LinkSpec, algorithm: str = "ring") -> float:
    """All-reduce of ``n_bytes`` per rank across ``n_ranks``.

    ring [2]_: ``2(p-1) alpha + 2 (p-1)/p n beta``;
    tree (double binary tree, pipelined [3]_): ``2 ceil(log2 p) alpha + 2 (p-1)/p n beta``
    (the trees split the message in halves, so bandwidth matches the ring while the
    latency term grows with log p instead of p).
    """
    if n_ranks <= 1 or n_bytes <= 0:
        return 0.0
    bandwidth_term = 2.0 * (n_ranks - 1) / n_ranks * n_bytes / link.bandwidth_bytes_per_s
    if algorithm == "ring":
        return 2.0 * (n_ranks - 1) * link.latency_s + bandwidth_term
    if algorithm == "tree":
        return 2.0 * math.ceil(math.log2(n_ranks)) * link.latency_s + bandwidth_term
    raise ValueError(f"unknown all-reduce algorithm {algorithm!r}; use 'ring' or 'tree'")


def allgather_time_s(n_bytes_total: float, n_ranks: int, link: LinkSpec) -> float:
    """Ring all-gather producing ``n_bytes_total`` on every rank [1]_: ``(p-1) alpha + (p-1)/p n beta``."""
    if n_ranks <= 1 or n_bytes_total <= 0:
        return 0.0
    return (n_ranks - 1) * link.latency_s + (n_ranks - 1) / n_ranks * n_bytes_total / link.bandwidth_bytes_per_s


def reduce_scatter_time_s(n_bytes_total: float, n_ranks: int, link: LinkSpec) -> float:
    """Ring reduce-scatter of ``n_bytes_total`` per rank [1]_ (same cost as all-gather)."""
    return allgather_time_s(n_bytes_total, n_ranks, link)


def alltoall_time_s(n_bytes_per_rank: float, n_ranks: int, link: LinkSpec) -> float:
    """Pairwise-exchange all-to-all where each rank holds ``n_bytes_per_rank`` to scatter [1]_.

    Each rank keeps ``1/p`` of its data and sends the rest: ``(p-1) alpha + (p-1)/p n beta``.
    """
    if n_ranks <= 1 or n_bytes_per_rank <= 0:
        return 0.0
    return (n_ranks - 1) * link.latency_s + (n_ranks - 1) / n_ranks * n_bytes_per_rank / link.bandwidth_bytes_per_s


def hierarchical_allreduce_time_s(
    n_bytes: float,
    ranks_per_group: int,
    n_groups: int,
    intra_link: LinkSpec,
    inter_link: LinkSpec,
    algorithm: str = "ring",
) -> float:
    """All-reduce spanning two topology levels (e.g. GPUs in a node, nodes in a cluster).

    Reduce-scatter inside each group, all-reduce the ``1/g`` shard across groups
    (the ``g`` rails run in parallel), all-gather inside each group; the way NCCL
    and Horovod's hierarchical all-reduce use fast intra-node links to cut the
    bytes on the slow level by ``ranks_per_group``.
    """
    if n_groups <= 1:
        return allreduce_time_s(n_bytes, ranks_per_group, intra_link, algorithm)
    shard_bytes = n_bytes / max(ranks_per_group, 1)
    return (
        reduce_scatter_time_s(n_bytes, ranks_per_group, intra_link)
        + allreduce_time_s(shard_bytes, n_groups, inter_link, algorithm)
        + allgather_time_s(n_bytes, ranks_per_group, intra_link)
    )


def hierarchical_allgather_time_s(
    n_bytes_total: float,
    ranks_per_group: int,
    n_groups: int,
    intra_link: LinkSpec,
    inter_link: LinkSpec,
) -> float:
    """All-gather of ``n_bytes_total`` over ``n_groups`` groups of ``ranks_per_group`` ranks.

    Rank ``i`` of every group first all-gathers across groups on its own rail (the
    ``r`` rails run in parallel, each gathering ``n / r`` bytes), then every group
    all-gathers the full ``n`` over its fast fabric [1]_. Reduce-scatter is the
    mirror image (same cost).
    """
    if n_groups <= 1:
        return allgather_time_s(n_bytes_total, ranks_per_group, intra_link)
    r = max(ranks_per_group, 1)
    return allgather_time_s(n_bytes_total / r, n_groups, inter_link) + allgather_time_s(n_bytes_total, r, intra_link)


def hierarchical_alltoall_time_s(
    n_bytes_per_rank: float,
    ranks_per_group: int,
    n_groups: int,
    intra_link: LinkSpec,
    inter_link: LinkSpec,
) -> float:
    """All-to-all across two topology levels, each rank holding ``n_bytes_per_rank``.

    With ``p = r g`` ranks, a rank sends ``(r - 1) / p`` of its buffer to peers in its
    group over the fast fabric and ``(p - r) / p`` to other groups over its NIC rail;
    the two proceed concurrently (separate ports), so the time is the slower one,
    each a pairwise exchange [1]_ with one latency per peer.
    """
    if n_groups <= 1:
        return alltoall_time_s(n_bytes_per_rank, ranks_per_group, intra_link)
    if n_bytes_per_rank <= 0:
        return 0.0
    r = max(ranks_per_group, 1)
    p = r * n_groups
    inside = (
        (r - 1) * intra_link.latency_s + (r - 1) / p * n_bytes_per_rank / intra_link.bandwidth_bytes_per_s
        if r > 1
        else 0.0
    )
    outside = (p - r) * inter_link.latency_s + (p - r) / p * n_bytes_per_rank / inter_link.bandwidth_bytes_per_s
    return max(inside, outside)
