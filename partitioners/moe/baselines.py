"""Baselines the MoE rebalancer is measured against (``bench/moe.py``, ``tests/partitioners/moe``)."""

from __future__ import annotations

import heapq

import numpy as np

__all__ = ["greedy_lpt"]


def greedy_lpt(load: np.ndarray, num_gpus: int, slots_per_gpu: int) -> np.ndarray:
    """Baseline: greedy replica counts, then LPT one replica at a time (physical_to_logical)."""
    layers, experts = load.shape
    out = np.full((layers, num_gpus * slots_per_gpu), -1, dtype=np.int64)
    n_fill = min(num_gpus * slots_per_gpu, experts * num_gpus)
    for layer in range(layers):
        w = load[layer]
        counts = np.ones(experts, dtype=np.int64)
        heap = [(-w[e], e) for e in range(experts)]
        heapq.heapify(heap)
        for _ in range(n_fill - experts):
            while True:
                _, e = heapq.heappop(heap)
                if counts[e] < num_gpus:
                    break
            counts[e] += 1
            if counts[e] < num_gpus:
                heapq.heappush(heap, (-w[e] / counts[e], e))
        items = np.repeat(np.arange(experts), counts)
        size = w[items] / counts[items]
        gpu_load = np.zeros(num_gpus)
        free = np.full(num_gpus, slots_per_gpu)
        holds = np.zeros((num_gpus, experts), dtype=bool)
        for idx in np.argsort(-size, kind="stable"):
            e = items[idx]
            score = np.where((free > 0) & ~holds[:, e], gpu_load, np.inf)
            g = int(score.argmin())
            out[layer, g * slots_per_gpu + slots_per_gpu - free[g]] = e
            free[g] -= 1
            holds[g, e] = True
            gpu_load[g] += size[idx]
    return out
