"""A placement being built or repaired, and its first packing (see :mod:`partitioners.moe.rebalance`).

:class:`PlacementState` keeps, for every layer, which expert sits in each slot of
each available GPU together with the replica counts and GPU loads that follow;
:func:`pack_rounds` fills it from replica counts by longest-processing-time first
(Graham, "Bounds on multiprocessing timing anomalies", 1969) done in rounds, one sort
per round for all layers, with :func:`pack_by_degree` (the constructive step of the
Gale-Ryser theorem) as the fallback that always exists.
"""

from __future__ import annotations

import numpy as np

__all__ = ["PlacementState", "holds", "count_rows", "balance_ratio", "pack_rounds", "pack_by_degree"]


class PlacementState:
    """Mutable placement of every layer on the available GPUs (indices 0..A-1 here).

    ``slots[l, g, k]`` is the expert in slot ``k`` of available GPU ``g`` (``-1``
    empty). Whether a GPU holds an expert is answered by comparing against its
    ``slots_per_gpu`` slots, which is cheaper than keeping a layers x GPUs x
    experts table up to date. ``per_replica[l, E]`` (index -1) is 0 so empty
    slots add nothing.
    """

    def __init__(self, load: np.ndarray, slots: np.ndarray) -> None:
        self.load = load
        self.slots = slots
        layers, gpus, _ = slots.shape
        experts = load.shape[1]
        self.counts = count_rows(np.where(slots >= 0, slots, experts).reshape(layers, -1), experts + 1)[:, :experts]
        self.per_replica = np.zeros((layers, experts + 1))
        self.gpu_load = np.zeros((layers, gpus))
        self.refresh(np.arange(layers))

    def refresh(self, layers: np.ndarray) -> None:
        """Recompute per-replica and GPU loads of ``layers`` from ``counts`` and ``slots``."""
        counts = self.counts[layers]
        self.per_replica[layers, :-1] = np.where(counts > 0, self.load[layers] / np.maximum(counts, 1), 0.0)
        self.gpu_load[layers] = self.per_replica[layers[:, None, None], self.slots[layers]].sum(axis=2)


def holds(gpu_slots: np.ndarray, expert: np.ndarray) -> np.ndarray:
    """``gpu_slots[..., S]`` contains ``expert[...]`` (an empty expert ``-1`` is never held)."""
    held: np.ndarray = (gpu_slots == expert[..., None]).any(axis=-1) & (expert >= 0)
    return held


def count_rows(values: np.ndarray, width: int) -> np.ndarray:
    """``out[l, v]`` = occurrences of ``v`` in row ``l`` (values in ``[0, width)``)."""
    layers = values.shape[0]
    flat = (np.arange(layers)[:, None] * width + values).ravel()
    return np.bincount(flat, minlength=layers * width).reshape(layers, width)


def balance_ratio(gpu_load: np.ndarray, total: np.ndarray) -> np.ndarray:
    """Per layer, max over mean GPU load; 1.0 for a layer with no load.

    Loads so small that splitting them over replicas underflows to zero (subnormal
    numbers) count as no load too, so the ratio never reads below 1.
    """
    mean = total / gpu_load.shape[1]
    hottest = gpu_load.max(axis=1)
    measurable = (mean > 0) & (hottest > 0)
    return np.where(measurable, hottest / np.where(measurable, mean, 1.0), 1.0)


def pack_rounds(load: np.ndarray, counts: np.ndarray, num_gpus: int, slots_per_gpu: int) -> np.ndarray:
    """LPT in rounds: each round puts the next ``num_gpus`` largest replicas one per GPU."""
    layers, experts = load.shape
    per_gpu_total = num_gpus * slots_per_gpu
    n_fill = int(counts[0].sum())
    items = np.repeat(np.tile(np.arange(experts), layers), counts.ravel()).reshape(layers, n_fill)
    size = np.take_along_axis(load / counts, items, axis=1)
    order = np.argsort(-size, axis=1)
    items = np.take_along_axis(items, order, axis=1)
    size = np.take_along_axis(size, order, axis=1)
    if n_fill < per_gpu_total:
        pad = per_gpu_total - n_fill
        items = np.concatenate([items, np.full((layers, pad), -1, dtype=np.int64)], axis=1)
        size = np.concatenate([size, np.zeros((layers, pad))], axis=1)
    slots = np.full((layers, num_gpus, slots_per_gpu), -1, dtype=np.int64)
    gpu_load = np.zeros((layers, num_gpus))
    rows = np.arange(layers)[:, None]
    failed = np.zeros(layers, dtype=bool)
    for k in range(slots_per_gpu):
        chunk = items[:, k * num_gpus : (k + 1) * num_gpus]
        chunk_size = size[:, k * num_gpus : (k + 1) * num_gpus]
        target = np.argsort(gpu_load, axis=1)  # largest item to lightest GPU
        conflict = holds(slots[rows, target, :k], chunk)
        if conflict.any():
            for layer, j in np.argwhere(conflict):
                if failed[layer] or not holds(slots[layer, target[layer, j], :k], chunk[layer, j]):
                    continue
                failed[layer] = not _trade_target(slots[layer, :, :k], chunk[layer], target[layer], j)
        slots[rows, target, k] = chunk
        gpu_load[rows, target] += chunk_size
    for layer in np.flatnonzero(failed):
        slots[layer] = pack_by_degree(counts[layer], num_gpus, slots_per_gpu)
    return slots


def _trade_target(filled: np.ndarray, chunk: np.ndarray, target: np.ndarray, j: int) -> bool:
    """Give item ``j`` the GPU of its nearest round-mate such that neither copy is duplicated."""
    expert, gpu = chunk[j], target[j]
    ok = ~holds(filled[target], np.full(target.size, expert)) & ~holds(filled[gpu][None, :], chunk) & (chunk != expert)
    ok[j] = False
    if not ok.any():
        return False
    candidates = np.flatnonzero(ok)
    other = candidates[np.argmin(np.abs(candidates - j))]
    target[j], target[other] = target[other], gpu
    return True


def pack_by_degree(counts: np.ndarray, num_gpus: int, slots_per_gpu: int) -> np.ndarray:
    """A placement without duplicates that always exists (fallback when rounds get stuck).

    Experts in decreasing count order take the GPUs with the most free slots:
    the constructive step of the Gale-Ryser theorem, which succeeds whenever
    every count is at most ``num_gpus`` and the counts fit the slots.
    """
    free = np.full(num_gpus, slots_per_gpu, dtype=np.int64)
    slots = np.full((num_gpus, slots_per_gpu), -1, dtype=np.int64)
    for expert in np.argsort(-counts, kind="stable"):
        gpus = np.argsort(-free, kind="stable")[: counts[expert]]
        slots[gpus, slots_per_gpu - free[gpus]] = expert
        free[gpus] -= 1
    return slots
