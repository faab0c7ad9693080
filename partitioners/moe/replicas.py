"""How many copies of each expert: water-filling the slots (see :mod:`partitioners.moe.rebalance`).

Every expert needs ``ceil(load / x)`` copies to keep its per-replica load under a
cap ``x``; bisection on ``x`` finds the smallest cap the GPUs and slots allow, for
all layers at once, and the slots left over go to the experts with the largest
per-replica load, the apportionment EPLB's ``replicate_experts`` makes one slot at a
time (DeepSeek-AI, EPLB, 2025). The largest infeasible cap tried is also a lower
bound on the balance of any placement (:func:`partitioners.moe.rebalance.lower_bound`).
"""

from __future__ import annotations

import numpy as np

__all__ = ["water_fill", "bound_ratio"]

# Bisection steps for the per-replica cap: 2**-32 of the hottest expert's load.
_BISECTION_STEPS = 32


def water_fill(load: np.ndarray, num_gpus: int, num_replicas: int) -> tuple[np.ndarray, np.ndarray]:
    """Replica counts minimising the largest per-replica load, and a bound on that minimum.

    Returns ``(counts, cap_lower)``: counts ``(L, E)`` summing to ``num_replicas``
    per layer (each in ``[1, num_gpus]``), and per layer a value no larger than
    ``min over feasible counts of max_e load_e / count_e``.
    """
    layers, experts = load.shape
    total = load.sum(axis=1)
    hottest = load.max(axis=1)
    # Any feasible counts have max per-replica load >= hottest / num_gpus (count <= num_gpus)
    # and >= total / num_replicas (the per-replica loads sum to total over <= num_replicas copies).
    lo = np.maximum(hottest / num_gpus, total / num_replicas)
    hi = hottest.copy()  # one copy each is feasible because experts <= num_replicas
    for _ in range(_BISECTION_STEPS):
        mid = 0.5 * (lo + hi)
        safe = np.where(mid > 0, mid, 1.0)
        need = np.ceil(load / safe[:, None])
        feasible = (need.max(axis=1) <= num_gpus) & (np.maximum(need, 1.0).sum(axis=1) <= num_replicas)
        # infeasible mid: every feasible count vector has a per-replica load above mid
        hi = np.where(feasible, mid, hi)
        lo = np.where(feasible, lo, mid)
    safe = np.where(hi > 0, hi, 1.0)
    counts = np.clip(np.ceil(load / safe[:, None]), 1, num_gpus).astype(np.int64)
    counts[hi <= 0] = 1
    remaining = num_replicas - counts.sum(axis=1)
    rows = np.arange(layers)[:, None]
    while (remaining > 0).any():
        eligible = counts < num_gpus
        key = np.where(eligible, load / counts, -1.0)
        order = np.argsort(-key, axis=1)
        rank = np.empty_like(order)
        rank[rows, order] = np.arange(experts)[None, :]
        give = (rank < remaining[:, None]) & eligible
        counts += give
        remaining -= give.sum(axis=1)
    return counts, lo * (1.0 - 1e-9)


def bound_ratio(load: np.ndarray, cap_lower: np.ndarray, num_gpus: int) -> np.ndarray:
    total = load.sum(axis=1)
    mean = total / num_gpus
    safe = np.where(mean > 0, mean, 1.0)
    return np.where(mean > 0, np.maximum(1.0, cap_lower / safe), 1.0)
