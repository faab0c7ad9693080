"""Level 3: which memory tier holds each tensor on each device, and at which byte offset.

For every device the plan takes the tensor lifetimes of the device's simulated
schedule (the same rules the simulator uses for peak memory: a tensor is live on
its producer's device from the producer's start until its last local consumer and
its last outgoing transfer have finished; on a receiving device from the transfer's
start until its last consumer there has finished; parameters for the whole step)
and assigns each (tensor, device) an address range in one tier:

* tiers are tried fastest first (shared memory / SRAM, then L2, then the main
  memory), activations only: parameters stay in main memory;
* inside a tier, addresses come from a first-fit allocator replayed over the
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

from partitioners.cost import CostModel, op_times_s
from partitioners.graph import TENSOR_ACTIVATION, TENSOR_PARAMETER, Hypergraph
from partitioners.inventory import Inventory
from partitioners.simulate import SimulationResult

__all__ = ["ALIGNMENT_BYTES", "MemoryPlan", "tensor_lifetimes", "plan_memory_tiers", "tier_op_times_s"]

#: Every tensor's address range starts at a multiple of this (CUDA allocations align to 256 B).
ALIGNMENT_BYTES = 256


@dataclass(frozen=True, eq=False)
class MemoryPlan:
    """Tier and offset of every tensor on every device that holds it.

    Attributes
    ----------
    tensor, device : numpy.ndarray of int64, shape (n_entries,)
        One entry per (tensor, device) holding; a tensor read on three devices has
        three entries.
    tier : numpy.ndarray of int64, shape (n_entries,)
        Column of ``inventory.tier_names``.
    offset_bytes, size_bytes : numpy.ndarray of int64, shape (n_entries,)
        Address range ``[offset, offset + size)`` inside the tier (size aligned).
    alloc_s, free_s : numpy.ndarray of float64, shape (n_entries,)
        Lifetime in the simulated schedule.
    high_water_bytes : numpy.ndarray of int64, shape (n_devices, n_tiers)
        Highest address used per device and tier.
    capacity_bytes : numpy.ndarray, shape (n_devices, n_tiers)
    hbm_fits : bool
        Every device's main-memory high-water mark is within its budget.
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


class _FirstFit:
    """First-fit address allocator over one tier (free list kept sorted by offset)."""

    __slots__ = ("capacity", "top", "free_off", "free_size", "high")

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.top = 0
        self.free_off: list[int] = []
        self.free_size: dict[int, int] = {}
        self.high = 0

    def alloc(self, size: int, limit: int | None = None) -> int:
        """Offset for ``size`` bytes, or -1 when it would pass ``limit`` (default capacity)."""
        cap = self.capacity if limit is None else limit
        for off in self.free_off:
            if self.free_size[off] >= size:
                rest = self.free_size.pop(off) - size
                self.free_off.remove(off)
                if rest:
                    self.free_size[off + size] = rest
                    insort(self.free_off, off + size)
                return off
        if self.top + size > cap:
            return -1
        off = self.top
        self.top += size
        self.high = max(self.high, self.top)
        return off

    def force(self, size: int) -> int:
        """Allocate past the limit (only for reporting an infeasible main memory)."""
        off = self.top
        self.top += size
        self.high = max(self.high, self.top)
        return off

    def free(self, off: int, size: int) -> None:
        if off + size == self.top:
            self.top = off
            # swallow a free block now at the top
            while self.free_off and self.free_off[-1] + self.free_size[self.free_off[-1]] == self.top:
                last = self.free_off.pop()
                self.top = last
                del self.free_size[last]
            return
        i = bisect_left(self.free_off, off)
        # merge with the next block
        if i < len(self.free_off) and self.free_off[i] == off + size:
            nxt = self.free_off.pop(i)
            size += self.free_size.pop(nxt)
        # merge with the previous block
        if i > 0 and self.free_off[i - 1] + self.free_size[self.free_off[i - 1]] == off:
            prev = self.free_off[i - 1]
            self.free_size[prev] += size
            return
        self.free_off.insert(i, off)
        self.free_size[off] = size


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
    n_entries = t.shape[0]
    n_dev = inventory.n_devices
    n_tiers = len(inventory.tier_names)
    cap = inventory.tier_capacity_bytes.astype(np.int64)
    bw = inventory.tier_bandwidth_bytes_per_s
    main = inventory.device_main_tier
    budget = inventory.device_memory_bytes if memory_budget_bytes is None else memory_budget_bytes
    size = ((np.ceil(graph.tensor_bytes[t] / ALIGNMENT_BYTES)).astype(np.int64) * ALIGNMENT_BYTES)
    is_param = graph.tensor_kind[t] == TENSOR_PARAMETER
    previous: dict[int, int] = {}
    if tiers is not None:
        prev_keys = tiers.tensor * n_dev + tiers.device
        previous = dict(zip(prev_keys.tolist(), tiers.tier.tolist()))

    tier_out = np.empty(n_entries, dtype=np.int64)
    offset_out = np.empty(n_entries, dtype=np.int64)
    high = np.zeros((n_dev, n_tiers), dtype=np.int64)
    dev_cut = np.searchsorted(d, np.arange(n_dev + 1))
    for dev in range(n_dev):
        a, b = int(dev_cut[dev]), int(dev_cut[dev + 1])
        if a == b:
            continue
        main_t = int(main[dev])
        # fastest first among tiers this device has, main memory last
        fast = [int(x) for x in np.argsort(-bw[dev], kind="stable") if cap[dev, x] > 0 and x != main_t]
        allocators = {x: _FirstFit(int(cap[dev, x])) for x in [*fast, main_t]}
        idx = np.arange(a, b)
        # parameters first (whole step), then the event replay
        par = idx[is_param[a:b]]
        for e in par.tolist():
            tier_out[e] = main_t
            off = allocators[main_t].alloc(int(size[e]))
            offset_out[e] = off if off >= 0 else allocators[main_t].force(int(size[e]))
        act = idx[~is_param[a:b]]
        ev_time = np.concatenate([free[act], alloc[act]])
        ev_type = np.concatenate([np.zeros(act.shape[0], np.int8), np.ones(act.shape[0], np.int8)])
        ev_ent = np.concatenate([act, act])
        order = np.lexsort((ev_ent, ev_type, ev_time))
        done: set[int] = set()
        for k in order.tolist():
            e = int(ev_ent[k])
            if ev_type[k] == 0:
                if e in done:
                    allocators[int(tier_out[e])].free(int(offset_out[e]), int(size[e]))
                continue
            sz = int(size[e])
            choice = -1
            off = -1
            want = previous.get(int(t[e]) * n_dev + dev) if previous else None
            order_tiers = [*fast, main_t]
            if want is not None and want in allocators:
                order_tiers = [x for x in order_tiers if order_tiers.index(x) >= order_tiers.index(want)]
            for x in order_tiers:
                off = allocators[x].alloc(sz)
                if off >= 0:
                    choice = x
                    break
            if choice < 0:
                choice = main_t
                off = allocators[main_t].force(sz)
            tier_out[e] = choice
            offset_out[e] = off
            done.add(e)
        for x, al in allocators.items():
            high[dev, x] = al.high
    main_high = high[np.arange(n_dev), main]
    return MemoryPlan(
        tensor=t,
        device=d,
        tier=tier_out,
        offset_bytes=offset_out,
        size_bytes=size,
        alloc_s=alloc,
        free_s=free,
        high_water_bytes=high,
        capacity_bytes=cap,
        hbm_fits=bool(np.all(main_high <= budget + 0.5)),
    )


def tier_op_times_s(
    graph: Hypergraph,
    inventory: Inventory,
    placement: np.ndarray,
    plan: MemoryPlan,
    *,
    cost_model: CostModel | None = None,
) -> np.ndarray:
    """Operator times with each tensor read or written at its tier's bandwidth.

    The roofline time ``max(compute, memory)`` (see :mod:`partitioners.cost`) keeps
    its compute term; its memory term is scaled, per operator on its placed
    device, by ``sum(bytes_i / bw(tier_i)) / sum(bytes_i / bw(main))``. Both terms
    come from :func:`partitioners.cost.op_times_s` on copies of the graph with the
    bytes or the FLOPs zeroed, so calibration multipliers and launch overheads
    stay exactly the cost model's.

    Returns
    -------
    numpy.ndarray of float64, shape (n_ops, n_devices)
        The full table (unplaced devices keep their main-memory times).
    """
    cm = cost_model or CostModel()
    full = op_times_s(graph, inventory, cm)
    compute = op_times_s(replace(graph, tensor_bytes=np.zeros_like(graph.tensor_bytes)), inventory, cm)
    memory = op_times_s(replace(graph, op_flops=np.zeros_like(graph.op_flops)), inventory, cm)
    n_dev = inventory.n_devices
    placement = np.asarray(placement, dtype=np.int64)
    keys = plan.tensor * n_dev + plan.device
    order = np.argsort(keys)
    skeys = keys[order]
    bw = inventory.tier_bandwidth_bytes_per_s
    main_bw = inventory.device_memory_bandwidth_bytes_per_s

    def ratio_terms(ptr: np.ndarray, tensors: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        owners = np.repeat(np.arange(graph.n_ops, dtype=np.int64), np.diff(ptr))
        dev = placement[owners]
        q = tensors * n_dev + dev
        pos = np.minimum(np.searchsorted(skeys, q), max(skeys.shape[0] - 1, 0))
        found = skeys[pos] == q if skeys.shape[0] else np.zeros(q.shape[0], dtype=bool)
        tier = np.where(found, plan.tier[order[pos]], inventory.device_main_tier[dev])
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
    ops = np.arange(graph.n_ops)
    launch = cm.launch_overhead_s
    mem_new = launch + (memory[ops, placement] - launch) * ratio
    out = full.copy()
    out[ops, placement] = np.minimum(full[ops, placement], np.maximum(compute[ops, placement], mem_new))
    return out
