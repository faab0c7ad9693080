"""Where a fresh plan's GPUs go: onto the physical GPUs that already hold their experts.

A fresh plan numbers its GPUs arbitrarily; :func:`relabel` matches each of them to
the GPU of the placement in service holding most of its experts, and keeps copies
already in place in their slots, so adopting a fresh plan writes only the copies it
must (see :mod:`partitioners.moe.rebalance`). :func:`gpu_in_node` answers "which GPU of this
node holds that expert" for choosing the source of a copy.
"""

from __future__ import annotations

import numpy as np

from partitioners.moe.packing import count_rows, holds

__all__ = ["relabel", "gpu_in_node"]


def _hosts(slots: np.ndarray, experts: int) -> np.ndarray:
    """``hosts[l, e]``: the GPUs holding expert ``e`` in layer ``l``, ascending, ``-1`` padded.

    Row ``experts`` (reached by index -1) is all ``-1``, so empty slots look up nothing.
    """
    layers, _gpus, slots_per_gpu = slots.shape
    flat = slots.reshape(layers, -1)
    width_slots = flat.shape[1]
    key = np.where(flat >= 0, flat, experts)
    order = np.argsort(key * width_slots + np.arange(width_slots), axis=1)  # unique keys: stable order
    sorted_expert = np.take_along_axis(key, order, axis=1)
    counts = count_rows(key, experts + 1)
    counts[:, experts] = 0
    width = max(1, int(counts.max()))
    start = np.zeros((layers, experts + 2), dtype=np.int64)
    start[:, 1:] = np.cumsum(counts, axis=1)
    rank = np.arange(width_slots)[None, :] - np.take_along_axis(start, sorted_expert, axis=1)
    hosts = np.full((layers, experts + 1, width), -1, dtype=np.int64)
    lay, pos = np.nonzero(sorted_expert < experts)
    hosts[lay, sorted_expert[lay, pos], rank[lay, pos]] = order[lay, pos] // slots_per_gpu
    return hosts


def gpu_in_node(slots: np.ndarray, node_of_gpu: np.ndarray, num_nodes: int, experts: int) -> np.ndarray:
    """``out[l, n, e]``: the highest-numbered GPU of node ``n`` holding expert ``e`` (``-1``: none).

    Column ``experts`` (index -1) stays ``-1``. One scatter-maximum over the slots,
    so looking up "is there a copy on this node, and where" costs one gather.
    """
    layers, _gpus, _slots_per_gpu = slots.shape
    out = np.full((layers, num_nodes, experts + 1), -1, dtype=np.int64)
    lay, gpu, _ = np.nonzero(slots >= 0)
    np.maximum.at(out, (lay, node_of_gpu[gpu], slots[lay, gpu, _]), gpu)
    return out


def relabel(fresh: np.ndarray, current: np.ndarray, experts: int) -> np.ndarray:
    """Map each GPU of a fresh plan to the physical GPU already holding most of its experts.

    Greedy maximum-overlap matching (bins in decreasing best overlap take their
    best free GPU), then, inside a GPU, experts already there keep their slot and
    the others fill the freed slots, so a fresh plan writes only what it must.
    The overlap matrix is counted from (fresh bin, expert) x (expert, current GPU)
    pairs with one ``bincount``: sparse, unlike a dense layers x GPUs x experts product.
    """
    layers, gpus, _slots_per_gpu = fresh.shape
    hosts = _hosts(current, experts)[np.arange(layers)[:, None, None], fresh]  # (L, A, S, width)
    bins = np.broadcast_to(np.arange(gpus)[None, :, None, None], hosts.shape)
    lays = np.broadcast_to(np.arange(layers)[:, None, None, None], hosts.shape)
    ok = hosts >= 0
    index = (lays[ok] * gpus + bins[ok]) * gpus + hosts[ok]
    overlap = np.bincount(index, minlength=layers * gpus * gpus).reshape(layers, gpus, gpus).astype(np.float64)
    order = np.argsort(-overlap.max(axis=2), axis=1)
    used = np.zeros((layers, gpus), dtype=bool)
    gpu_of_bin = np.empty((layers, gpus), dtype=np.int64)
    lay = np.arange(layers)
    for t in range(gpus):
        bin_t = order[:, t]
        row = np.where(used, -1.0, overlap[lay, bin_t])
        choice = row.argmax(axis=1)
        gpu_of_bin[lay, bin_t] = choice
        used[lay, choice] = True
    placed = np.empty_like(fresh)
    placed[lay[:, None], gpu_of_bin] = fresh
    return _align_slots(placed, current)


def _align_slots(target: np.ndarray, current: np.ndarray) -> np.ndarray:
    """Same expert sets per GPU as ``target``, with experts already in ``current`` left in their slot."""
    slots_per_gpu = target.shape[2]
    keep = holds(target[:, :, None, :], current)  # current copy stays
    new = ~holds(current[:, :, None, :], target) & (target >= 0)  # target copy not there yet
    free_pos = np.argsort(keep, axis=2, kind="stable")  # non-kept slots first
    new_first = np.argsort(~new, axis=2, kind="stable")
    incoming = np.where(np.take_along_axis(new, new_first, axis=2), np.take_along_axis(target, new_first, axis=2), -1)
    out = np.where(keep, current, -1)
    n_free = (~keep).sum(axis=2, keepdims=True)
    rank = np.arange(slots_per_gpu)[None, None, :]
    values = np.where(rank < n_free, incoming, np.take_along_axis(out, free_pos, axis=2))
    np.put_along_axis(out, free_pos, values, axis=2)
    return out
