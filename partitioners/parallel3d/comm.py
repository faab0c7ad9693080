"""Collectives of a 3D-parallel layout, vectorised over candidate layouts.

The alpha-beta formulas of :mod:`partitioners.hardware.collectives` (ring and tree all-reduce,
reduce-scatter, all-gather, all-to-all, two-level all-reduce) are affine in the message
size for a fixed group, so two evaluations per distinct group size give the exact
cost for every candidate (:func:`collective_time_s`). On top: where expert-parallel
groups fall on nodes and what their all-to-all costs, DeepSeek-V3's node-deduplicated
dispatch, and what hiding a collective under computation costs
(:func:`overlapped_time_s`: Lee et al. 2025).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from partitioners.hardware.collectives import (
    LinkSpec,
    hierarchical_allreduce_time_s,
    hierarchical_alltoall_time_s,
    p2p_time_s,
)
from partitioners.parallel3d.arrays import FloatArray, IntArray

__all__ = [
    "OVERLAP_COMPUTE_SLOWDOWN",
    "overlapped_time_s",
    "exposed_part_s",
    "chunked_collective_time_s",
    "collective_time_s",
    "point_to_point_time_s",
    "two_level_allreduce_time_s",
    "expert_group_placement",
    "expert_alltoall_time_s",
    "expected_distinct",
    "nodes_within_reach",
    "deduplicated_dispatch_time_s",
]

# Communication hidden under computation is not free: its kernels hold SMs and HBM
# bandwidth the concurrent GEMMs would use. Lee et al., "Characterizing Compute-
# Communication Overlap in GPU-Accelerated Distributed Deep Learning" (2025) measured the
# overlapped computation 18.9% slower on average (40% at most) than alone, on A100, H100,
# MI250 and MI210 with GPT and Llama models.
OVERLAP_COMPUTE_SLOWDOWN = 0.189


def overlapped_time_s(
    comm_s: FloatArray, window_s: FloatArray | float, floor_s: FloatArray | float = 0.0
) -> FloatArray:
    """Critical-path time a collective adds when it runs under ``window_s`` of computation.

    What the window cannot cover stays exposed (at least ``floor_s``, e.g. a pipelined
    collective's first and last chunk); the covered part slows the computation it
    shares the GPU with by ``OVERLAP_COMPUTE_SLOWDOWN`` (Lee et al. 2025).
    """
    exposed = exposed_part_s(comm_s, window_s, floor_s)
    return exposed + OVERLAP_COMPUTE_SLOWDOWN * (comm_s - exposed)


def exposed_part_s(comm_s: FloatArray, window_s: FloatArray | float, floor_s: FloatArray | float = 0.0) -> FloatArray:
    """The part of a collective that ``window_s`` of computation cannot cover (at least ``floor_s``)."""
    return np.maximum(np.maximum(comm_s - window_s, 0.0), floor_s)


def chunked_collective_time_s(
    comm_s: FloatArray, trailing_share_s: FloatArray, chunks: FloatArray | float, gap_s: FloatArray
) -> FloatArray:
    """Critical-path time of a collective issued in ``chunks`` equal shares, one per model chunk.

    The shares go out ``gap_s`` apart on one communicator (Megatron-Core's per-chunk
    ``grad_sync_func`` / ``param_sync_func`` under the interleaved schedule), so all but
    one run under the computation between launches; ``trailing_share_s`` is what the
    share with no computation after it leaves exposed. Shares longer than the gap queue
    up behind each other and the queue trails too. The hidden part slows the computation
    it runs under by ``OVERLAP_COMPUTE_SLOWDOWN``.
    """
    share = comm_s / chunks
    trailing = np.minimum(trailing_share_s + np.maximum(0.0, (chunks - 1.0) * (share - gap_s)), comm_s)
    return trailing + OVERLAP_COMPUTE_SLOWDOWN * (comm_s - trailing)


def _affine(fn: Callable[[float, int], float], n_ranks: FloatArray | IntArray) -> tuple[FloatArray, FloatArray]:
    """Intercept and slope of an alpha-beta collective, per distinct group size.

    The shared formulas are affine in the message size for a fixed group, so two
    evaluations per distinct group size give the exact cost for every candidate.
    """
    sizes, inverse = np.unique(np.asarray(n_ranks, dtype=np.int64), return_inverse=True)
    at_1 = np.array([fn(1.0, int(p)) for p in sizes])
    at_2 = np.array([fn(2.0, int(p)) for p in sizes])
    slope = at_2 - at_1
    return (at_1 - slope)[inverse], slope[inverse]


def collective_time_s(
    fn: Callable[[float, int], float], n_bytes: FloatArray, n_ranks: FloatArray | IntArray
) -> FloatArray:
    """Time of the collective ``fn(bytes, ranks)`` for every candidate; zero without bytes or with one rank."""
    intercept, slope = _affine(fn, n_ranks)
    return np.where((n_bytes > 0) & (n_ranks > 1), intercept + slope * n_bytes, 0.0)


def expert_group_placement(stride: FloatArray, ep: FloatArray, gpus_per_node: int) -> tuple[FloatArray, FloatArray]:
    """Members of one expert-parallel group per node, and the nodes the group spans.

    With the ``tp-cp-ep-pp-dp`` rank order, members of one expert group sit
    ``stride = tp cp`` ranks apart, so ``gpus_per_node / stride`` of them share a node.
    """
    ep = np.asarray(ep, dtype=np.int64)
    stride = np.asarray(stride, dtype=np.int64)
    local = np.clip(gpus_per_node // np.maximum(stride, 1), 1, ep)
    local = np.where(ep % local == 0, local, 1)
    return local, ep // local


def expert_alltoall_time_s(
    n_bytes: FloatArray, stride: FloatArray, ep: FloatArray, gpus_per_node: int, intra: LinkSpec, inter: LinkSpec
) -> FloatArray:
    """One expert-parallel all-to-all of ``n_bytes`` per rank, placed as the rank map places it.

    The members sharing a node exchange their share over NVLink while the rest leaves
    through the NICs at the same time
    (:func:`~partitioners.hardware.collectives.hierarchical_alltoall_time_s`): an expert group
    spanning two nodes sends half of its bytes, not all of them, over the slower network.
    """
    local, groups = expert_group_placement(stride, ep, gpus_per_node)
    byte_values, byte_code = np.unique(np.asarray(n_bytes, dtype=float) * np.ones(local.shape), return_inverse=True)
    placements, placement_code = _distinct_pairs(local, groups)
    uniq, inverse = _distinct_pairs(byte_code, placement_code)
    times = np.array(
        [
            hierarchical_alltoall_time_s(
                float(byte_values[b]), int(placements[p][0]), int(placements[p][1]), intra, inter
            )
            for b, p in uniq
        ]
    )
    return np.where(local * groups > 1, times[inverse].reshape(local.shape), 0.0)


def expected_distinct(n_bins: FloatArray | float, n_draws: FloatArray | float) -> FloatArray:
    """Expected number of distinct bins hit by ``n_draws`` uniform draws: ``b (1 - (1 - 1/b)^k)``."""
    n_bins = np.maximum(np.asarray(n_bins, dtype=float), 1.0)
    return n_bins * (1.0 - (1.0 - 1.0 / n_bins) ** np.asarray(n_draws, dtype=float))


def nodes_within_reach(nodes: FloatArray, num_groups: int | None, group_topk: int | None) -> FloatArray:
    """Nodes of an expert group that group-limited routing lets one token reach.

    The ``num_groups`` groups of consecutive experts lie over the ``n`` nodes the expert
    group spans: with at least as many nodes as groups each group covers ``n / num_groups``
    nodes and a token's ``group_topk`` groups ``group_topk n / num_groups`` of them; with
    fewer, several groups share a node and its groups land on ``n (1 - (1 - 1/n)^topk)``.
    """
    nodes = np.asarray(nodes, dtype=float)
    if num_groups is None or group_topk is None:
        return nodes
    spread = np.where(nodes >= num_groups, group_topk * nodes / num_groups, expected_distinct(nodes, group_topk))
    return np.minimum(spread, nodes)


def deduplicated_dispatch_time_s(
    token_bytes: FloatArray,
    experts_per_token: int,
    num_groups: int | None,
    group_topk: int | None,
    stride: FloatArray,
    ep: FloatArray,
    gpus_per_node: int,
    intra: LinkSpec,
    inter: LinkSpec,
) -> FloatArray:
    """One node-deduplicated expert dispatch (or its mirror, the combine) of ``token_bytes`` per rank.

    DeepSeek-V3's dispatch (DeepSeek-AI, "DeepSeek-V3 Technical Report", 2024, Sec. 3.2.2;
    its DeepEP kernels) sends a token over InfiniBand once per destination node, to the
    GPU of the same in-node index, which forwards it over NVLink to the GPUs holding its
    experts; the combine returns the partial sums the same way. Group-limited routing
    (Sec. 2.1.2) caps the nodes a token can reach (:func:`nodes_within_reach`). With the
    ``k`` experts spread uniformly over the ``M`` nodes within reach a token reaches
    ``M (1 - (1 - 1/M)^k)`` nodes, ``(n - 1) / n`` of them remote when the group spans
    ``n`` nodes; in each it reaches ``r (1 - (1 - 1/r)^(k / nodes))`` of the ``r`` GPUs
    there, all but one of them over NVLink. The network and NVLink legs are pipelined,
    so the slower one sets the time.
    """
    local, groups = expert_group_placement(stride, ep, gpus_per_node)
    local_f, groups_f = local.astype(float), groups.astype(float)
    nodes = expected_distinct(nodes_within_reach(groups_f, num_groups, group_topk), experts_per_token)
    remote_nodes = nodes * (groups_f - 1.0) / groups_f
    gpus_per_reached_node = expected_distinct(local_f, experts_per_token / nodes)
    forwarded = nodes * gpus_per_reached_node * (local_f - 1.0) / local_f
    token_bytes = np.asarray(token_bytes, dtype=float)
    network = np.where(
        groups > 1, (groups_f - 1.0) * inter.latency_s + token_bytes * remote_nodes / inter.bandwidth_bytes_per_s, 0.0
    )
    nvlink = np.where(
        local > 1, (local_f - 1.0) * intra.latency_s + token_bytes * forwarded / intra.bandwidth_bytes_per_s, 0.0
    )
    return np.where(local * groups > 1, np.maximum(network, nvlink), 0.0)


def point_to_point_time_s(n_bytes: FloatArray, link: LinkSpec) -> FloatArray:
    """One send of ``n_bytes`` over ``link`` for every candidate (the shared formula is affine in the bytes)."""
    at_1, at_2 = p2p_time_s(1.0, link), p2p_time_s(2.0, link)
    return np.where(n_bytes > 0, at_1 + (at_2 - at_1) * (n_bytes - 1.0), 0.0)


def _distinct_pairs(first: FloatArray | IntArray, second: FloatArray | IntArray) -> tuple[IntArray, IntArray]:
    """The distinct (first, second) integer pairs, and each candidate's index among them.

    One int64 key per pair sorts as fast as the numbers themselves; ``np.unique(...,
    axis=0)`` sorts rows as opaque records, tens of times slower on the millions of
    candidates of a large MoE search.
    """
    first_i = np.asarray(first, dtype=np.int64).reshape(-1)
    second_i = np.asarray(second, dtype=np.int64).reshape(-1)
    span = int(second_i.max(initial=0)) + 1
    keys, inverse = np.unique(first_i * span + second_i, return_inverse=True)
    return np.stack([keys // span, keys % span], axis=1), inverse.reshape(-1)


def two_level_allreduce_time_s(
    n_bytes: FloatArray,
    local: FloatArray,
    groups: FloatArray,
    intra: LinkSpec,
    inter: LinkSpec,
    n_calls: FloatArray | float = 1.0,
    algorithms: tuple[str, ...] = ("ring", "tree"),
) -> FloatArray:
    """Two-level all-reduce of ``n_bytes`` split into ``n_calls`` collectives (buckets, layers).

    The latency (alpha) terms are paid once per call; the bandwidth terms once for
    all the bytes. Ring and double-binary-tree variants are both evaluated and the
    faster taken, as NCCL's tuner does (trees win at thousands of ranks). Reduce-scatter
    and all-gather have no tree variant in NCCL, so they pass ``algorithms=("ring",)``.
    """
    uniq, inverse = _distinct_pairs(local, groups)
    best: FloatArray | None = None
    for algorithm in algorithms:
        at_1 = np.array([hierarchical_allreduce_time_s(1.0, int(a), int(b), intra, inter, algorithm) for a, b in uniq])
        at_2 = np.array([hierarchical_allreduce_time_s(2.0, int(a), int(b), intra, inter, algorithm) for a, b in uniq])
        slope = at_2 - at_1
        t = (at_1 - slope)[inverse] * n_calls + slope[inverse] * n_bytes
        best = t if best is None else np.minimum(best, t)
    assert best is not None, "algorithms names at least one algorithm"
    total = local * groups
    return np.where((n_bytes > 0) & (total > 1), best, 0.0)
