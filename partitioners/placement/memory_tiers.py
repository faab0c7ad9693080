"""Level 3: which memory tier holds each tensor on each device, and at which byte offset.

For every device the plan takes the tensor lifetimes of the device's simulated
schedule (the same rules the simulator uses for peak memory: a tensor is live on
its producer's device from the producer's start until its last local consumer and
its last outgoing transfer have finished; on a receiving device from the transfer's
start until its last consumer there has finished; parameters for the whole step)
and assigns each (tensor, device) an address range in one tier:

* tiers are tried fastest first (shared memory / SRAM, then L2, then the main
  memory), intermediate activations only: parameters, and the graph's inputs and
  outputs (which the runtime hands over in main memory), stay in main memory;
* inside a tier, addresses come from a best-fit allocator replayed over the
  lifetimes in time order (frees before allocations at equal times), so no two
  live tensors overlap and nothing is placed above the tier's capacity; a tensor
  that fits nowhere faster goes to main memory.

This is the offline "greedy by lifetime" buffer assignment that TFLite and XLA
use for static graphs (Pisarchyk & Lee [1]_), applied per tier; the tier choice is
the bandwidth-aware placement of Sekiyama et al. [2]_ in its simplest greedy form.

The simulator then re-times every operator with the bandwidth of the tiers its
tensors sit in (:func:`tier_op_times_s`): the memory term of the roofline becomes
``sum(bytes_i / bandwidth(tier_i))`` instead of ``sum(bytes_i) / bandwidth(HBM)``.

References
----------
.. [1] Y. Pisarchyk, J. Lee, "Efficient Memory Management for Deep Neural Net
   Inference", MLSys workshop 2020 (greedy-by-size / lifetime offset assignment).
.. [2] T. Sekiyama, T. Imamichi, H. Imai, R. Raymond, "Profile-guided memory
   optimization for deep neural networks", arXiv:1804.10001, 2018.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from dataclasses import dataclass, replace

import numpy as np

from partitioners.costmodel.costs import CostModel, op_times_by_profile_s, op_times_s
from partitioners.costmodel.simulator import SimulationResult
from partitioners.graph.hypergraph import TENSOR_ACTIVATION, TENSOR_PARAMETER, Hypergraph
from partitioners.hardware.inventory import Inventory

__all__ = [
    "ALIGNMENT_BYTES",
    "UNPLACED",
    "MemoryPlan",
    "tensor_lifetimes",
    "plan_memory_tiers",
    "placed_tier_op_times_s",
    "tier_op_times_s",
]

#: Every tensor's address range starts at a multiple of this (CUDA allocations align to 256 B).
ALIGNMENT_BYTES = 256
#: Tier of a holding that fits in no tier of its device (infeasible plans only).
UNPLACED = -1


@dataclass(frozen=True, eq=False)
class MemoryPlan:
    """Tier and offset of every tensor on every device that holds it.

    Attributes
    ----------
    tensor, device : numpy.ndarray of int64, shape (n_entries,)
        One entry per (tensor, device) holding; a tensor read on three devices has
        three entries.
    tier : numpy.ndarray of int64, shape (n_entries,)
        Column of ``inventory.tier_names``, or ``UNPLACED``.
    offset_bytes, size_bytes : numpy.ndarray of int64, shape (n_entries,)
        Address range ``[offset, offset + size)`` inside the tier (size aligned).
    alloc_s, free_s : numpy.ndarray of float64, shape (n_entries,)
        Lifetime in the simulated schedule.
    high_water_bytes : numpy.ndarray of int64, shape (n_devices, n_tiers)
        Highest address used per device and tier.
    capacity_bytes : numpy.ndarray, shape (n_devices, n_tiers)
    hbm_fits : bool
        Every holding has an address and every device's main-memory high-water mark
        is within its budget.
    unplaced_bytes : numpy.ndarray of float64, shape (n_devices,)
        Bytes of holdings that fit in no tier (tier ``UNPLACED``, offset -1): the
        plan is infeasible on that device by at least this much. Nothing is ever
        placed above a tier's capacity.
    """

    tensor: np.ndarray
    device: np.ndarray
    tier: np.ndarray
    offset_bytes: np.ndarray
    size_bytes: np.ndarray
    alloc_s: np.ndarray
    free_s: np.ndarray
    high_water_bytes: np.ndarray
    capacity_bytes: np.ndarray
    hbm_fits: bool
    unplaced_bytes: np.ndarray

    def records(self, graph: Hypergraph, inventory: Inventory) -> list[dict[str, object]]:
        """One dict per holding, by name: ``{tensor, device, tier, offset_bytes, size_bytes}``.

        ``tier`` is ``None`` for a holding that fits nowhere (infeasible plans).
        For small and mid-size graphs (the service's JSON plan); large plans should
        be stored as the arrays.
        """
        tiers = inventory.tier_names
        return [
            {
                "tensor": str(graph.tensor_names[t]),
                "device": str(inventory.device_names[d]),
                "tier": tiers[k] if k >= 0 else None,
                "offset_bytes": int(o),
                "size_bytes": int(z),
            }
            for t, d, k, o, z in zip(
                self.tensor.tolist(),
                self.device.tolist(),
                self.tier.tolist(),
                self.offset_bytes.tolist(),
                self.size_bytes.tolist(),
            )
        ]

    @property
    def capacity_violations(self) -> int:
        """Number of (device, tier) pairs whose high-water mark passes the tier's capacity."""
        return int((self.high_water_bytes > self.capacity_bytes).sum())


def tensor_lifetimes(graph: Hypergraph, sim: SimulationResult) -> tuple[np.ndarray, ...]:
    """``(tensor, device, alloc_s, free_s)`` of every holding, the simulator's rules.

    Parameters are live on every device that reads them for the whole step.
    Sorted by device, then tensor.
    """
    n_dev = int(max(sim.op_device.max(), sim.transfer_dst.max() if sim.transfer_dst.size else 0)) + 1
    placement = sim.op_device
    start, end = sim.op_start_s, sim.op_end_s
    makespan = float(sim.makespan_s)
    owners = np.repeat(np.arange(graph.n_ops, dtype=np.int64), np.diff(graph.input_ptr))
    tens = graph.input_tensors
    on = placement[owners]
    keys, inv_idx = np.unique(tens * n_dev + on, return_inverse=True)
    free = np.full(keys.shape[0], -np.inf)
    np.maximum.at(free, inv_idx.reshape(-1), end[owners])
    k_t, k_d = keys // n_dev, keys % n_dev
    prod = graph.tensor_producer[k_t]
    alloc = np.zeros(keys.shape[0], dtype=np.float64)
    local = (prod >= 0) & (placement[np.maximum(prod, 0)] == k_d)
    alloc[local] = start[prod[local]]
    remote = (prod >= 0) & ~local
    if remote.any() and sim.transfer_tensor.size:
        tkeys = sim.transfer_tensor * n_dev + sim.transfer_dst
        o = np.argsort(tkeys)
        pos = np.minimum(np.searchsorted(tkeys[o], keys[remote]), o.shape[0] - 1)
        alloc[remote] = sim.transfer_start_s[o[pos]]
    is_param = graph.tensor_kind[k_t] == TENSOR_PARAMETER
    free[is_param] = makespan
    # producer-side holdings without a local consumer
    act = np.flatnonzero(graph.tensor_kind == TENSOR_ACTIVATION)
    pkey = act * n_dev + placement[graph.tensor_producer[act]]
    extra = ~np.isin(pkey, keys)
    extra_t = act[extra]
    extra_d = placement[graph.tensor_producer[extra_t]]
    extra_alloc = start[graph.tensor_producer[extra_t]]
    extra_free = end[graph.tensor_producer[extra_t]].copy()
    extra_free[np.diff(graph.consumer_ptr)[extra_t] == 0] = makespan
    all_t = np.concatenate([k_t, extra_t])
    all_d = np.concatenate([k_d, extra_d])
    all_alloc = np.concatenate([alloc, extra_alloc])
    all_free = np.concatenate([free, extra_free])
    if sim.transfer_tensor.size:
        all_keys = all_t * n_dev + all_d
        src_keys = sim.transfer_tensor * n_dev + placement[graph.tensor_producer[sim.transfer_tensor]]
        o = np.argsort(all_keys)
        pos = o[np.searchsorted(all_keys[o], src_keys)]
        np.maximum.at(all_free, pos, sim.transfer_end_s)
    order = np.lexsort((all_t, all_d))
    return all_t[order], all_d[order], all_alloc[order], all_free[order]


class _BestFit:
    """Best-fit address allocator over one tier, with coalescing of free neighbours.

    Free blocks are indexed twice, by offset (to merge neighbours on free) and by
    ``(size, offset)`` (to find the smallest block that fits with one bisection), so
    a fragmented tier costs ``O(log n)`` searches plus C-level list moves, not a
    Python scan. Best fit also keeps fragmentation lower than first fit.
    """

    __slots__ = ("by_size", "capacity", "free_off", "free_size", "high", "top")

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.top = 0
        self.free_off: list[int] = []
        self.free_size: dict[int, int] = {}
        self.by_size: list[tuple[int, int]] = []
        self.high = 0

    def _drop(self, off: int) -> int:
        size = self.free_size.pop(off)
        del self.free_off[bisect_left(self.free_off, off)]
        del self.by_size[bisect_left(self.by_size, (size, off))]
        return size

    def _add(self, off: int, size: int) -> None:
        self.free_size[off] = size
        insort(self.free_off, off)
        insort(self.by_size, (size, off))

    def alloc(self, size: int) -> int:
        """Offset for ``size`` bytes, or -1 when the tier has no room for it."""
        i = bisect_left(self.by_size, (size, -1))
        if i < len(self.by_size):
            block, off = self.by_size[i]
            self._drop(off)
            if block > size:
                self._add(off + size, block - size)
            return off
        if self.top + size > self.capacity:
            return -1
        off = self.top
        self.top += size
        if self.top > self.high:
            self.high = self.top
        return off

    def free(self, off: int, size: int) -> None:
        end = off + size
        if end in self.free_size:
            size += self._drop(end)
        j = bisect_left(self.free_off, off)
        if j > 0:
            prev = self.free_off[j - 1]
            if prev + self.free_size[prev] == off:
                size += self._drop(prev)
                off = prev
        if off + size == self.top:
            self.top = off
        else:
            self._add(off, size)


def _previous_tiers(tiers: MemoryPlan | None, tensor: np.ndarray, device: np.ndarray, n_devices: int) -> np.ndarray:
    """The tier each (tensor, device) holding had in ``tiers``; -1 where it had none."""
    want_tier = np.full(tensor.shape[0], -1, dtype=np.int64)
    if tiers is None or not tiers.tensor.shape[0]:
        return want_tier
    prev_keys = tiers.tensor * n_devices + tiers.device
    order = np.argsort(prev_keys)
    query = tensor * n_devices + device
    pos = np.minimum(np.searchsorted(prev_keys[order], query), order.shape[0] - 1)
    hit = prev_keys[order][pos] == query
    want_tier[hit] = tiers.tier[order[pos[hit]]]
    return want_tier


def _place_parameters(
    entries: list[int],
    main_alloc: _BestFit,
    main_tier: int,
    size_l: list[int],
    tier_out: list[int],
    offset_out: list[int],
) -> None:
    """Parameters stay resident for the whole step: main memory, allocated before anything else."""
    for e in entries:
        tier_out[e] = main_tier
        sz = size_l[e]
        if sz:
            off = main_alloc.alloc(sz)
            offset_out[e] = off
            if off < 0:
                tier_out[e] = UNPLACED


def _replay_activations(
    entries: np.ndarray,
    alloc_s: np.ndarray,
    free_s: np.ndarray,
    allocators: dict[int, _BestFit],
    main_tier: int,
    size_l: list[int],
    want_l: list[int],
    tier_out: list[int],
    offset_out: list[int],
) -> None:
    """Replay one device's allocations and frees in time order, each holding in the fastest
    tier with room (never faster than the tier it had before, ``want_l``).

    ``allocators`` is ordered fastest first, main memory last. At equal times frees come
    before allocations, so a tensor freed as another is made can hand over its range.
    """
    ladder = list(allocators)
    from_tier = {x: ladder[i:] for i, x in enumerate(ladder)}
    n = entries.shape[0]
    ev_time = np.concatenate([free_s, alloc_s])
    ev_type = np.concatenate([np.zeros(n, np.int64), np.ones(n, np.int64)])
    ev_ent = np.concatenate([entries, entries])
    order = np.lexsort((ev_ent, ev_type, ev_time))
    codes = (ev_ent[order] * 2 + ev_type[order]).tolist()
    live: dict[int, bool] = {}
    for code in codes:
        e = code >> 1
        if not code & 1:
            if e in live:
                allocators[tier_out[e]].free(offset_out[e], size_l[e])
                del live[e]
            continue
        sz = size_l[e]
        if sz == 0:  # an empty tensor takes no address range
            tier_out[e] = main_tier
            continue
        choice = -1
        off = -1
        for x in from_tier.get(want_l[e], ladder):
            off = allocators[x].alloc(sz)
            if off >= 0:
                choice = x
                break
        tier_out[e] = choice
        offset_out[e] = off
        if choice >= 0:
            live[e] = True


def plan_memory_tiers(
    graph: Hypergraph,
    inventory: Inventory,
    sim: SimulationResult,
    *,
    memory_budget_bytes: np.ndarray | None = None,
    tiers: MemoryPlan | None = None,
) -> MemoryPlan:
    """Assign every (tensor, device) holding of a simulated schedule to a tier and an offset.

    Parameters
    ----------
    graph : Hypergraph
    inventory : Inventory
    sim : SimulationResult
        A simulation with ``record_timeline=True`` (start/end times and transfers).
    memory_budget_bytes : numpy.ndarray, shape (n_devices,), optional
        Main-memory budget (capacity minus headroom); ``hbm_fits`` compares to it.
    tiers : MemoryPlan, optional
        A previous plan of the same placement: its tier choices are kept where they
        still fit under the new lifetimes (used after re-timing with tier bandwidths).

    Returns
    -------
    MemoryPlan
    """
    t, d, alloc, free = tensor_lifetimes(graph, sim)
    n_dev = inventory.n_devices
    cap = inventory.tier_capacity_bytes.astype(np.int64)
    main = inventory.device_main_tier
    budget = inventory.device_memory_bytes if memory_budget_bytes is None else memory_budget_bytes
    size = (np.ceil(graph.tensor_bytes[t] / ALIGNMENT_BYTES)).astype(np.int64) * ALIGNMENT_BYTES
    is_param = graph.tensor_kind[t] == TENSOR_PARAMETER
    # the graph's inputs arrive from, and its outputs leave for, the runtime through main
    # memory: no on-chip tier holds them across the kernels before and after the step
    at_boundary = ((graph.tensor_producer[t] < 0) | (np.diff(graph.consumer_ptr)[t] == 0)).tolist()
    want_l = _previous_tiers(tiers, t, d, n_dev).tolist()

    tier_out = [0] * t.shape[0]
    offset_out = [0] * t.shape[0]
    size_l = size.tolist()
    high = np.zeros((n_dev, len(inventory.tier_names)), dtype=np.int64)
    dev_cut = np.searchsorted(d, np.arange(n_dev + 1))
    for dev in range(n_dev):
        a, b = int(dev_cut[dev]), int(dev_cut[dev + 1])
        if a == b:
            continue
        main_t = int(main[dev])
        # fastest first among tiers this device has, main memory last
        bw = inventory.tier_bandwidth_bytes_per_s[dev]
        fast = [int(x) for x in np.argsort(-bw, kind="stable") if cap[dev, x] > 0 and x != main_t]
        allocators = {x: _BestFit(int(cap[dev, x])) for x in [*fast, main_t]}
        idx = np.arange(a, b)
        _place_parameters(idx[is_param[a:b]].tolist(), allocators[main_t], main_t, size_l, tier_out, offset_out)
        act = idx[~is_param[a:b]]
        for e in act.tolist():
            if at_boundary[e]:
                want_l[e] = main_t
        _replay_activations(act, alloc[act], free[act], allocators, main_t, size_l, want_l, tier_out, offset_out)
        for x, al in allocators.items():
            high[dev, x] = al.high
    tier_arr = np.asarray(tier_out, dtype=np.int64)
    offset_arr = np.asarray(offset_out, dtype=np.int64)
    main_high = high[np.arange(n_dev), main]
    unplaced = tier_arr == UNPLACED
    return MemoryPlan(
        tensor=t,
        device=d,
        tier=tier_arr,
        offset_bytes=offset_arr,
        size_bytes=size,
        alloc_s=alloc,
        free_s=free,
        high_water_bytes=high,
        capacity_bytes=cap,
        hbm_fits=bool(np.all(main_high <= budget + 0.5)) and not unplaced.any(),
        unplaced_bytes=np.bincount(d[unplaced], weights=graph.tensor_bytes[t[unplaced]], minlength=n_dev),
    )


def placed_tier_op_times_s(
    graph: Hypergraph,
    inventory: Inventory,
    placement: np.ndarray,
    holding_tensor: np.ndarray,
    holding_device: np.ndarray,
    holding_tier: np.ndarray,
    *,
    cost_model: CostModel | None = None,
) -> np.ndarray:
    """Each operator's time on its placed device with each tensor at its tier's bandwidth.

    The roofline time ``max(compute, memory)`` (see :mod:`partitioners.costmodel.costs`) keeps
    its compute term; its memory term is scaled by ``sum(bytes_i / bw(tier_i)) /
    sum(bytes_i / bw(main))``. Both terms come from the cost model on copies of the
    graph with the bytes or the FLOPs zeroed, so calibration multipliers and launch
    overheads stay exactly the cost model's. The holdings are a :class:`MemoryPlan`'s
    ``tensor``, ``device`` and ``tier`` columns (a stored plan's, when runtime feedback
    is compared with what the plan predicted); a tensor with no holding on the
    operator's device, or an ``UNPLACED`` one, is read at main-memory bandwidth.

    Returns
    -------
    numpy.ndarray of float64, shape (n_ops,)
    """
    cm = cost_model or CostModel()
    placement = np.asarray(placement, dtype=np.int64)
    ops = np.arange(graph.n_ops)
    full, profile = op_times_by_profile_s(graph, inventory, cm)
    compute, _ = op_times_by_profile_s(replace(graph, tensor_bytes=np.zeros_like(graph.tensor_bytes)), inventory, cm)
    memory, _ = op_times_by_profile_s(replace(graph, op_flops=np.zeros_like(graph.op_flops)), inventory, cm)
    column = profile[placement]
    n_dev = inventory.n_devices
    keys = np.asarray(holding_tensor, dtype=np.int64) * n_dev + np.asarray(holding_device, dtype=np.int64)
    order = np.argsort(keys)
    skeys = keys[order]
    holding_tier = np.asarray(holding_tier, dtype=np.int64)
    bw = inventory.tier_bandwidth_bytes_per_s
    main_bw = inventory.device_memory_bandwidth_bytes_per_s

    def ratio_terms(ptr: np.ndarray, tensors: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        owners = np.repeat(np.arange(graph.n_ops, dtype=np.int64), np.diff(ptr))
        dev = placement[owners]
        q = tensors * n_dev + dev
        pos = np.minimum(np.searchsorted(skeys, q), max(skeys.shape[0] - 1, 0))
        found = skeys[pos] == q if skeys.shape[0] else np.zeros(q.shape[0], dtype=bool)
        tier = np.where(found, holding_tier[order[pos]] if skeys.shape[0] else 0, inventory.device_main_tier[dev])
        tier = np.where(tier >= 0, tier, inventory.device_main_tier[dev])
        b = graph.tensor_bytes[tensors]
        fast = b / np.maximum(bw[dev, tier], 1.0)
        slow = b / np.maximum(main_bw[dev], 1.0)
        return (
            np.bincount(owners, weights=fast, minlength=graph.n_ops),
            np.bincount(owners, weights=slow, minlength=graph.n_ops),
        )

    f_in, s_in = ratio_terms(graph.input_ptr, graph.input_tensors)
    f_out, s_out = ratio_terms(graph.output_ptr, graph.output_tensors)
    slow = s_in + s_out
    ratio = np.where(slow > 0, (f_in + f_out) / np.where(slow > 0, slow, 1.0), 1.0)
    launch = cm.device_parameters(inventory)[2][placement]  # each device's own launch overhead
    mem_new = launch + (memory[ops, column] - launch) * ratio
    times_s: np.ndarray = np.minimum(full[ops, column], np.maximum(compute[ops, column], mem_new))
    return times_s


def tier_op_times_s(
    graph: Hypergraph,
    inventory: Inventory,
    placement: np.ndarray,
    plan: MemoryPlan,
    *,
    cost_model: CostModel | None = None,
) -> np.ndarray:
    """Operator times with each tensor read or written at its tier's bandwidth.

    :func:`placed_tier_op_times_s` on each operator's placed device; the other
    devices keep their main-memory times.

    Returns
    -------
    numpy.ndarray of float64, shape (n_ops, n_devices)
    """
    placement = np.asarray(placement, dtype=np.int64)
    out = op_times_s(graph, inventory, cost_model or CostModel())
    out[np.arange(graph.n_ops), placement] = placed_tier_op_times_s(
        graph, inventory, placement, plan.tensor, plan.device, plan.tier, cost_model=cost_model
    )
    return out
