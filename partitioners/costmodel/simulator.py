"""Event-driven simulation of one step of a placed graph: makespan, timeline, memory, traffic.

The model (what a reader needs to trust the numbers):

* **Compute.** Each device runs one operator at a time, without preemption. When a
  device is free it starts the ready operator of highest priority (default:
  critical-path first, the longest remaining path to a sink counting operator times
  on their placed devices and uncontended transfer times on cut edges [1]_ [2]_);
  ties go to the lower operator id. An operator is ready on its device when every
  activation it reads is there. Graph inputs and parameters are resident on every
  device that reads them from time 0 (no transfer; parameters count once per such
  device in memory).
* **Communication.** When an operator finishes, each output tensor is sent once to
  every *other device* that holds at least one of its consumers (hypergraph
  semantics: three consumers on one remote device mean one transfer). A transfer
  from ``s`` to ``d`` takes ``alpha + bytes / bandwidth`` on the link
  :func:`partitioners.hardware.inventory.link_between` picks, scaled by the cost model's
  link-class multiplier. Each device has an egress and an ingress *port per link
  class* (its NVLink/NVSwitch port and its NIC rail; with a bandwidth matrix, one
  port pair per device pair). A transfer holds its sender's egress port and its
  receiver's ingress port for its whole duration, first come first served (in the
  order the simulation issues them), so transfers leaving or entering a device on
  the same fabric share its bandwidth by serialising: a burst issued together
  finishes when it would under fair sharing (up to the per-message latencies),
  only the order of completions differs; a transfer never slips into a port's idle
  gap ahead of an earlier-issued one.
  Compute and communication overlap (copy engines are separate from the SMs).
* **Launches.** Every operator's time includes its launch overhead
  (:mod:`partitioners.costmodel.costs`). With the cost model's ``launch`` set to
  ``"per-device"`` each device launches its own operators, so that is all. With
  ``"single-controller"`` (one host thread issues every device's kernels, as PyTorch
  and ONNX Runtime do with several GPUs in one process) the launches share one host:
  an operator picked at ``t`` starts at ``max(t, host free)`` and holds the host for
  its device's launch overhead, so launches of all devices serialise in the order
  the devices pick their operators. One device never waits for the host (its
  previous operator's launch ended before that operator did). A transfer between
  devices is a copy the host issues as well: it holds the host for the sending
  device's launch overhead when its tensor is ready and starts once issued.
* **Memory.** Per device: parameters it reads (resident) plus live tensors. A
  tensor is live on its producer's device from the producer's start until its last
  local consumer has finished and every outgoing transfer of it has finished (graph
  outputs, with no consumer, stay live to the end); on a receiving device from the
  transfer's start until its last consumer there has finished; a graph input from
  0 until its last consumer on that device has finished. At equal times frees
  happen before allocations.

Throughput: the event loop is a tight pure-Python heap loop over precomputed lists
(no per-operator objects); everything else is vectorised numpy. Use
:func:`prepare_simulation` once and pass it to :func:`simulate` /
:func:`estimate_makespan_s` to score many placements of the same graph.

References
----------
.. [1] T. L. Adam, K. M. Chandy, J. R. Dickson, "A comparison of list schedules for
   parallel processing systems", CACM 17(12), 1974 (highest-level-first).
.. [2] H. Topcuoglu, S. Hariri, M.-Y. Wu, "Performance-effective and low-complexity
   task scheduling for heterogeneous computing", IEEE TPDS 13(3), 2002 (upward rank
   with communication costs, HEFT).
"""

from __future__ import annotations

from dataclasses import dataclass
from heapq import heappop, heappush
from typing import Any

import numpy as np
import numpy.typing as npt

from partitioners.costmodel.costs import CostModel, link_time_tables, op_times_by_profile_s, transfer_times_s
from partitioners.errors import InvalidInput
from partitioners.graph.hypergraph import TENSOR_ACTIVATION, TENSOR_PARAMETER, Hypergraph, topological_order
from partitioners.hardware.inventory import (
    LINK_CLASS_NAMES,
    LINK_INTER_GROUP,
    LINK_INTRA_GROUP,
    Inventory,
    link_class_ids,
)

__all__ = [
    "SimulationContext",
    "SimulationResult",
    "prepare_simulation",
    "simulate",
    "estimate_makespan_s",
    "critical_path_priority",
    "connectivity_comm_bytes",
    "remote_transfers",
    "summarize",
    "memory_timeline",
]


@dataclass(frozen=True, eq=False)
class SimulationResult:
    """What one simulated step costs and, optionally, how it unfolds.

    Attributes
    ----------
    makespan_s : float
        Finish time of the last operator (all transfers feed some operator, so none
        ends later).
    device_busy_s, device_idle_s : numpy.ndarray, shape (n_devices,)
        Compute time per device and ``makespan_s - busy``.
    comm_bytes : float
        Bytes moved between devices = connectivity metric (sum over activation
        tensors of bytes x (devices spanned - 1)).
    comm_bytes_by_class : dict[str, float]
        ``comm_bytes`` split by link class (``"intra-group"``, ``"inter-group"``).
    link_src, link_dst, link_bytes : numpy.ndarray, shape (n_pairs,)
        Bytes per directed device pair that carries traffic (sparse).
    param_memory_bytes : numpy.ndarray, shape (n_devices,)
        Resident parameter bytes per device.
    peak_memory_bytes : numpy.ndarray or None, shape (n_devices,)
        Parameters plus peak live activations; ``None`` when ``record_timeline=False``.
    op_device : numpy.ndarray of int64, shape (n_ops,)
    op_start_s, op_end_s : numpy.ndarray, shape (n_ops,)
    transfer_tensor, transfer_src, transfer_dst : numpy.ndarray of int64, shape (n_transfers,)
    transfer_start_s, transfer_end_s, transfer_bytes : numpy.ndarray of float64
        The transfers in issue order.
    """

    makespan_s: float
    device_busy_s: npt.NDArray[np.float64]
    device_idle_s: npt.NDArray[np.float64]
    comm_bytes: float
    comm_bytes_by_class: dict[str, float]
    link_src: npt.NDArray[np.int64]
    link_dst: npt.NDArray[np.int64]
    link_bytes: npt.NDArray[np.float64]
    param_memory_bytes: npt.NDArray[np.float64]
    peak_memory_bytes: npt.NDArray[np.float64] | None
    op_device: npt.NDArray[np.int64]
    op_start_s: npt.NDArray[np.float64]
    op_end_s: npt.NDArray[np.float64]
    transfer_tensor: npt.NDArray[np.int64]
    transfer_src: npt.NDArray[np.int64]
    transfer_dst: npt.NDArray[np.int64]
    transfer_start_s: npt.NDArray[np.float64]
    transfer_end_s: npt.NDArray[np.float64]
    transfer_bytes: npt.NDArray[np.float64]

    def link_bytes_matrix(self, n_devices: int) -> np.ndarray:
        """Dense ``(n_devices, n_devices)`` bytes per directed pair (small clusters)."""
        out = np.zeros((n_devices, n_devices), dtype=np.float64)
        np.add.at(out, (self.link_src, self.link_dst), self.link_bytes)
        return out


@dataclass(frozen=True, eq=False)
class SimulationContext:
    """Placement-independent precomputation for repeated simulations of one graph.

    Build with :func:`prepare_simulation`; holds Python lists the event loop indexes
    (faster than numpy scalars) and the operator time table.
    """

    graph: Hypergraph
    inventory: Inventory
    cost_model: CostModel
    op_times_s: npt.NDArray[np.float64]  # (n_ops, n_profiles) or (n_ops, n_devices)
    device_profile: npt.NDArray[np.int64]  # device -> column of op_times_s
    topo_order: np.ndarray
    pending: list[int]
    out_ptr: list[int]
    out_tensors: list[int]
    cons_ptr: list[int]
    cons_ops: list[int]
    tensor_bytes: list[float]
    zero_pending: np.ndarray
    group_latency_s: list[float]
    group_s_per_byte: list[float]
    inter_latency_s: float
    inter_s_per_byte: float
    pair_latency_s: np.ndarray | None
    pair_s_per_byte: np.ndarray | None
    edge_src: np.ndarray  # producer -> consumer edges sorted by producer
    edge_dst: np.ndarray
    edge_tensor: np.ndarray
    edge_ptr: list[int]
    edge_dst_list: list[int]
    reverse_topo: list[int]
    host_launch_s: list[float] | None = None  # per device, when one host issues every launch


# (group latency_s, group s/byte, inter-group latency_s, inter-group s/byte, per-pair tables or None)
_LinkParams = tuple[
    list[float], list[float], float, float, npt.NDArray[np.float64] | None, npt.NDArray[np.float64] | None
]


def _link_params(inventory: Inventory, cost_model: CostModel) -> _LinkParams:
    """Per-group and inter-group link latency and seconds per byte (plus the per-pair tables, if any)."""
    mult = cost_model.link_multipliers()
    g_lat = (inventory.group_link_latency_s * mult[LINK_INTRA_GROUP]).tolist()
    g_pb = (mult[LINK_INTRA_GROUP] / inventory.group_link_bandwidth_bytes_per_s).tolist()
    i_lat = float(inventory.inter_link.latency_s * mult[LINK_INTER_GROUP])
    i_pb = float(mult[LINK_INTER_GROUP] / inventory.inter_link.bandwidth_bytes_per_s)
    p_lat: npt.NDArray[np.float64] | None = None
    p_pb: npt.NDArray[np.float64] | None = None
    if inventory.bandwidth_matrix_bytes_per_s is not None:
        p_lat, p_pb = link_time_tables(inventory, cost_model)
    return g_lat, g_pb, i_lat, i_pb, p_lat, p_pb


def _edges_by_producer(graph: Hypergraph) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Producer -> consumer edges sorted by producer, with the CSR pointer over producers."""
    e_src, e_dst, e_tensor = graph.op_edges()
    order = np.argsort(e_src, kind="stable")
    e_src, e_dst, e_tensor = e_src[order], e_dst[order], e_tensor[order]
    e_ptr = np.zeros(graph.n_ops + 1, dtype=np.int64)
    np.cumsum(np.bincount(e_src, minlength=graph.n_ops), out=e_ptr[1:])
    return e_src, e_dst, e_tensor, e_ptr


def prepare_simulation(
    graph: Hypergraph,
    inventory: Inventory,
    *,
    cost_model: CostModel | None = None,
    op_times_s: np.ndarray | None = None,
) -> SimulationContext:
    """Precompute everything that does not depend on the placement.

    Parameters
    ----------
    graph : Hypergraph
    inventory : Inventory
    cost_model : CostModel, optional
        Defaults to ``CostModel()``.
    op_times_s : numpy.ndarray, optional
        ``(n_ops, n_devices)`` operator times; computed from the cost model when absent.
        Given without a ``cost_model``, they are the whole story: no shared host
        serialises their launches.

    Raises
    ------
    InvalidInput
        The graph has a cycle, or ``op_times_s`` has the wrong shape.
    """
    cm = cost_model or CostModel()
    if op_times_s is None:
        times, profile = op_times_by_profile_s(graph, inventory, cm)
    else:
        times = np.asarray(op_times_s, dtype=np.float64)
        if times.shape != (graph.n_ops, inventory.n_devices):
            raise InvalidInput(
                f"op_times_s must have shape (n_ops, n_devices) = ({graph.n_ops}, {inventory.n_devices}), "
                f"got {times.shape}",
                field="op_times_s",
            )
        if not np.all(np.isfinite(times) & (times >= 0)):
            raise InvalidInput("op_times_s must be finite and non-negative", field="op_times_s")
        profile = np.arange(inventory.n_devices, dtype=np.int64)
    order = topological_order(graph)
    owners = np.repeat(np.arange(graph.n_ops, dtype=np.int64), np.diff(graph.input_ptr))
    is_act = graph.tensor_producer[graph.input_tensors] >= 0
    pending = np.bincount(owners[is_act], minlength=graph.n_ops)
    g_lat, g_pb, i_lat, i_pb, p_lat, p_pb = _link_params(inventory, cm)
    e_src, e_dst, e_tensor, e_ptr = _edges_by_producer(graph)
    launch = cm.device_parameters(inventory)[2]
    # a table given without a cost model is every operator's whole time: no launch model over it
    shared_host = (
        cm.launch == "single-controller"
        and (op_times_s is None or cost_model is not None)
        and inventory.n_devices > 1
        and bool((launch > 0).any())
    )
    return SimulationContext(
        graph=graph,
        inventory=inventory,
        cost_model=cm,
        op_times_s=times,
        device_profile=profile,
        topo_order=order,
        pending=pending.tolist(),
        out_ptr=graph.output_ptr.tolist(),
        out_tensors=graph.output_tensors.tolist(),
        cons_ptr=graph.consumer_ptr.tolist(),
        cons_ops=graph.consumer_ops.tolist(),
        tensor_bytes=graph.tensor_bytes.tolist(),
        zero_pending=np.flatnonzero(pending == 0),
        group_latency_s=g_lat,
        group_s_per_byte=g_pb,
        inter_latency_s=i_lat,
        inter_s_per_byte=i_pb,
        pair_latency_s=p_lat,
        pair_s_per_byte=p_pb,
        edge_src=e_src,
        edge_dst=e_dst,
        edge_tensor=e_tensor,
        edge_ptr=e_ptr.tolist(),
        edge_dst_list=e_dst.tolist(),
        reverse_topo=order[::-1].tolist(),
        host_launch_s=launch.tolist() if shared_host else None,
    )


def _check_placement(graph: Hypergraph, inventory: Inventory, placement: np.ndarray) -> np.ndarray:
    p = np.asarray(placement)
    if p.shape != (graph.n_ops,):
        raise InvalidInput(
            f"placement must give one device per operator ({graph.n_ops}), got shape {p.shape}",
            field="placement",
        )
    if p.size and (not np.issubdtype(p.dtype, np.integer) or p.min() < 0 or p.max() >= inventory.n_devices):
        raise InvalidInput(f"placement entries must be device ids 0..{inventory.n_devices - 1}", field="placement")
    return p.astype(np.int64, copy=False)


def _check_priority(graph: Hypergraph, priority: np.ndarray) -> np.ndarray:
    prio = np.asarray(priority, dtype=np.float64)
    if prio.shape != (graph.n_ops,) or not np.all(np.isfinite(prio)):
        raise InvalidInput(
            f"priority must be {graph.n_ops} finite numbers, one per operator, got shape {prio.shape}",
            field="priority",
        )
    return prio


def _durations(ctx: SimulationContext, placement: npt.NDArray[np.int64]) -> npt.NDArray[np.float64]:
    cols = ctx.device_profile[placement]
    return ctx.op_times_s[np.arange(placement.shape[0]), cols]


def remote_transfers(
    graph: Hypergraph, placement: np.ndarray
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """The transfers a placement implies: unique ``(tensor, src_device, dst_device)``.

    One per activation tensor and per *other* device holding at least one of its
    consumers (hypergraph semantics). Sorted by tensor, then destination.
    """
    placement = np.asarray(placement, dtype=np.int64)
    counts = np.diff(graph.consumer_ptr)
    tensors = np.repeat(np.arange(graph.n_tensors, dtype=np.int64), counts)
    producer = graph.tensor_producer[tensors]
    keep = producer >= 0
    tensors = tensors[keep]
    src = placement[producer[keep]]
    dst = placement[graph.consumer_ops[keep]]
    remote = src != dst
    tensors, src, dst = tensors[remote], src[remote], dst[remote]
    n_dev = int(placement.max()) + 1 if placement.size else 1
    key = np.unique(tensors * n_dev + dst)
    t = key // n_dev
    d = key % n_dev
    return t, placement[graph.tensor_producer[t]], d


def connectivity_comm_bytes(graph: Hypergraph, placement: np.ndarray) -> float:
    """Connectivity metric: sum over activation tensors of bytes x (devices spanned - 1).

    Devices spanned = the producer's device plus every device with a consumer. Graph
    inputs and parameters are excluded (resident where read, see the module
    docstring). This is exactly the bytes the simulator moves.

    Parameters
    ----------
    graph : Hypergraph
    placement : numpy.ndarray of int, shape (n_ops,)

    Returns
    -------
    float
    """
    t, _, _ = remote_transfers(graph, placement)
    return float(graph.tensor_bytes[t].sum())


def critical_path_priority(
    graph: Hypergraph,
    inventory: Inventory,
    placement: np.ndarray,
    durations_s: np.ndarray,
    *,
    cost_model: CostModel | None = None,
    context: SimulationContext | None = None,
) -> npt.NDArray[np.float64]:
    """Upward rank of every operator: its time plus the longest path below it.

    ``rank(u) = dur(u) + max over consumers v of (comm(u, v) + rank(v))`` where
    ``comm`` is the uncontended transfer time of the linking tensor when ``u`` and
    ``v`` sit on different devices, else 0 (HEFT's upward rank [2]_ on a fixed
    placement). One pure-Python pass over the edges in reverse topological order.

    Parameters
    ----------
    graph : Hypergraph
    inventory : Inventory
    placement : numpy.ndarray of int, shape (n_ops,)
    durations_s : numpy.ndarray, shape (n_ops,)
        Time of each operator on its placed device.
    cost_model : CostModel, optional
        For link-class multipliers.
    context : SimulationContext, optional
        Reuses its edge lists and topological order.

    Returns
    -------
    numpy.ndarray of float64, shape (n_ops,)
    """
    if context is not None:
        e_src, e_dst, e_tensor = context.edge_src, context.edge_dst, context.edge_tensor
        succ, ptr, reverse_topo = context.edge_dst_list, context.edge_ptr, context.reverse_topo
        cost_model = cost_model or context.cost_model
    else:
        e_src, e_dst, e_tensor, e_ptr = _edges_by_producer(graph)
        succ, ptr = e_dst.tolist(), e_ptr.tolist()
        reverse_topo = topological_order(graph)[::-1].tolist()
    placement = np.asarray(placement, dtype=np.int64)
    s_dev = placement[e_src]
    d_dev = placement[e_dst]
    comm = np.zeros(s_dev.shape[0], dtype=np.float64)
    cut = s_dev != d_dev
    if cut.any():
        comm[cut] = transfer_times_s(graph.tensor_bytes[e_tensor[cut]], s_dev[cut], d_dev[cut], inventory, cost_model)
    ecost = comm.tolist()
    rank = np.asarray(durations_s, dtype=np.float64).tolist()
    for u in reverse_topo:
        a = ptr[u]
        b = ptr[u + 1]
        if a == b:
            continue
        best = 0.0
        for e in range(a, b):
            v = rank[succ[e]] + ecost[e]
            if v > best:
                best = v
        rank[u] += best
    return np.array(rank, dtype=np.float64)


def _schedule_inputs(
    ctx: SimulationContext, graph: Hypergraph, inventory: Inventory, placement: np.ndarray, priority: np.ndarray | None
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Checked placement, per-operator durations on it and list-scheduling priorities."""
    p = _check_placement(graph, inventory, placement)
    dur = _durations(ctx, p)
    if priority is None:
        prio = critical_path_priority(graph, inventory, p, dur, cost_model=ctx.cost_model, context=ctx)
    else:
        prio = _check_priority(graph, priority)
    return p, dur, prio


_TransferLists = tuple[list[int], list[int], list[int], list[float], list[float]]


def _event_loop(
    ctx: SimulationContext, placement: np.ndarray, dur: np.ndarray, prio: np.ndarray
) -> tuple[list[float], list[float], _TransferLists]:
    """The list-scheduling event loop (see the module docstring). Returns lists."""
    inv = ctx.inventory
    n_dev = inv.n_devices
    n = placement.shape[0]
    dev = placement.tolist()
    dur_l = dur.tolist()
    neg_prio = (-prio).tolist()
    pending = list(ctx.pending)
    ready_at = [0.0] * n
    start = [0.0] * n
    end = [0.0] * n
    out_ptr = ctx.out_ptr
    out_t = ctx.out_tensors
    cons_ptr = ctx.cons_ptr
    cons_ops = ctx.cons_ops
    tbytes = ctx.tensor_bytes
    grp = inv.device_group.tolist()
    g_lat = ctx.group_latency_s
    g_pb = ctx.group_s_per_byte
    i_lat = ctx.inter_latency_s
    i_pb = ctx.inter_s_per_byte
    p_lat = ctx.pair_latency_s
    p_pb = ctx.pair_s_per_byte
    # (latency_s, s_per_byte, egress port, ingress port) per ordered device pair
    pair_info: dict[int, tuple[float, float, int, int]] = {}
    port_free: dict[int, float] = {}
    tr_t: list[int] = []
    tr_s: list[int] = []
    tr_d: list[int] = []
    tr_a: list[float] = []
    tr_b: list[float] = []

    readyq: list[list[tuple[float, int]]] = [[] for _ in range(n_dev)]
    busy = [False] * n_dev
    dispatch_pending = [False] * n_dev
    heap: list[tuple[float, int, int]] = []
    for op in ctx.zero_pending.tolist():
        heappush(readyq[dev[op]], (neg_prio[op], op))
    for d in range(n_dev):
        if readyq[d]:
            dispatch_pending[d] = True
            heap.append((0.0, 2, d))
    # events: (time, kind, x); kind 0 = op x finished, 1 = op x ready, 2 = dispatch device x,
    # 3 = zero-duration op x finished. At equal times finishes and arrivals are handled
    # before a device picks its next op; when no other event shares the instant, idle
    # devices pick right away (no event). An op that takes no time finishes after every
    # device has picked at that instant, so which device picks first (its number) cannot
    # decide whose transfers take a shared port first.
    todo: list[int] = []
    host = ctx.host_launch_s  # per device launch seconds on the one host, or None
    host_free = 0.0
    a: float | None  # arrival of the tensor at a consumer's device
    while heap:
        t, kind, x = heappop(heap)
        if kind == 0 or kind == 3:
            d = dev[x]
            busy[d] = False
            if readyq[d] and not dispatch_pending[d]:
                dispatch_pending[d] = True
                todo.append(d)
            for oi in range(out_ptr[x], out_ptr[x + 1]):
                ot = out_t[oi]
                arrivals: dict[int, float] | None = None
                for ci in range(cons_ptr[ot], cons_ptr[ot + 1]):
                    c = cons_ops[ci]
                    dc = dev[c]
                    if dc == d:
                        a = t
                    else:
                        if arrivals is None:
                            arrivals = {}
                            a = None
                        else:
                            a = arrivals.get(dc)
                        if a is None:
                            key = d * n_dev + dc
                            info = pair_info.get(key)
                            if info is None:
                                # ports: egress then ingress, per (device, link class);
                                # with a bandwidth matrix, per device pair
                                if p_lat is not None and p_pb is not None:  # set together
                                    info = (float(p_lat[d, dc]), float(p_pb[d, dc]), key, n_dev * n_dev + key)
                                elif grp[d] == grp[dc]:
                                    info = (g_lat[grp[d]], g_pb[grp[d]], -2 * d - 1, -2 * dc - 2)
                                else:
                                    info = (i_lat, i_pb, -2 * d - 1 - 2 * n_dev, -2 * dc - 2 - 2 * n_dev)
                                pair_info[key] = info
                            s0 = port_free.get(info[2], 0.0)
                            s1 = port_free.get(info[3], 0.0)
                            if s1 > s0:
                                s0 = s1
                            if s0 < t:
                                s0 = t
                            if host is not None:
                                # the one host issues the copy too, like a kernel launch
                                h = host_free if host_free > t else t
                                host_free = h + host[d]
                                if host_free > s0:
                                    s0 = host_free
                            nb = tbytes[ot]
                            a = s0 + info[0] + nb * info[1]
                            port_free[info[2]] = a
                            port_free[info[3]] = a
                            arrivals[dc] = a
                            tr_t.append(ot)
                            tr_s.append(d)
                            tr_d.append(dc)
                            tr_a.append(s0)
                            tr_b.append(a)
                    if a > ready_at[c]:
                        ready_at[c] = a
                    k = pending[c] - 1
                    pending[c] = k
                    if k == 0:
                        r = ready_at[c]
                        if r <= t:
                            heappush(readyq[dc], (neg_prio[c], c))
                            if not busy[dc] and not dispatch_pending[dc]:
                                dispatch_pending[dc] = True
                                todo.append(dc)
                        else:
                            heappush(heap, (r, 1, c))
        elif kind == 1:
            dc = dev[x]
            heappush(readyq[dc], (neg_prio[x], x))
            if not busy[dc] and not dispatch_pending[dc]:
                dispatch_pending[dc] = True
                todo.append(dc)
        else:
            dispatch_pending[x] = False
            q = readyq[x]
            if busy[x] or not q:
                continue
            op = heappop(q)[1]
            busy[x] = True
            s = t
            if host is not None:
                if host_free > s:
                    s = host_free
                host_free = s + host[x]
            start[op] = s
            e = s + dur_l[op]
            end[op] = e
            heappush(heap, (e, 0 if e > t else 3, op))
            continue
        if todo:
            if heap and heap[0][0] <= t:
                # more events at this instant may ready higher-priority ops: pick later
                for dc in todo:
                    heappush(heap, (t, 2, dc))
            else:
                for dc in todo:
                    dispatch_pending[dc] = False
                    op = heappop(readyq[dc])[1]
                    busy[dc] = True
                    s = t
                    if host is not None:
                        if host_free > s:
                            s = host_free
                        host_free = s + host[dc]
                    start[op] = s
                    e = s + dur_l[op]
                    end[op] = e
                    heappush(heap, (e, 0 if e > t else 3, op))
            todo.clear()
    return start, end, (tr_t, tr_s, tr_d, tr_a, tr_b)


def _memory_sweep(
    graph: Hypergraph,
    n_dev: int,
    placement: np.ndarray,
    start: np.ndarray,
    end: np.ndarray,
    makespan: float,
    tr_tensor: np.ndarray,
    tr_dst: np.ndarray,
    tr_start: np.ndarray,
    tr_end: np.ndarray,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Allocation/free sweep (module docstring): ``(param_bytes, ev_device, ev_time_s, live_bytes)``.

    Events are sorted by device, then time (frees first at equal times);
    ``live_bytes`` is the live non-parameter bytes on ``ev_device`` just after each
    event.

    Holdings are ``(tensor, device)`` keys ``tensor * n_dev + device``; every step is
    a sort, a ``searchsorted`` or a ``reduceat`` so 10^6 operators take about a second.
    """
    n_ops = graph.n_ops
    owners = np.repeat(np.arange(n_ops, dtype=np.int64), np.diff(graph.input_ptr))
    tens = graph.input_tensors
    kind = graph.tensor_kind[tens]
    on = placement[owners]
    tb = graph.tensor_bytes

    # parameters: once per (tensor, device)
    pm = kind == TENSOR_PARAMETER
    pkeys = np.unique(tens[pm] * n_dev + on[pm])
    param = np.bincount(pkeys % n_dev, weights=tb[pkeys // n_dev], minlength=n_dev).astype(np.float64)

    # holdings of non-parameter tensors where they are read; freed when the last reader there ends
    cm = ~pm
    ckeys = tens[cm] * n_dev + on[cm]
    cend = end[owners[cm]]
    o = np.argsort(ckeys)
    ckeys = ckeys[o]
    first = np.flatnonzero(np.r_[True, ckeys[1:] != ckeys[:-1]]) if ckeys.size else np.zeros(0, np.int64)
    keys = ckeys[first]  # sorted, unique
    free = np.maximum.reduceat(cend[o], first) if ckeys.size else np.zeros(0, np.float64)
    k_t = keys // n_dev
    k_d = keys % n_dev
    prod = graph.tensor_producer[k_t]
    alloc = np.zeros(keys.shape[0], dtype=np.float64)  # graph inputs: resident from 0
    local = (prod >= 0) & (placement[np.maximum(prod, 0)] == k_d)
    alloc[local] = start[prod[local]]
    remote = (prod >= 0) & ~local
    if remote.any():
        # each remote holding is one transfer's destination buffer, allocated at its start
        tkeys = tr_tensor * n_dev + tr_dst
        o = np.argsort(tkeys)
        alloc[remote] = tr_start[o[np.searchsorted(tkeys[o], keys[remote])]]
    # producer-side holdings with no local reader: from the producer's start to its end
    # (graph outputs: to the makespan)
    act = np.flatnonzero(graph.tensor_kind == TENSOR_ACTIVATION)
    act_dev = placement[graph.tensor_producer[act]]
    pkey = act * n_dev + act_dev
    pos = np.minimum(np.searchsorted(keys, pkey), max(keys.size - 1, 0))
    has_local = keys[pos] == pkey if keys.size else np.zeros(act.size, dtype=bool)
    extra_t = act[~has_local]
    extra_keys = pkey[~has_local]  # sorted: act ascending
    extra_alloc = start[graph.tensor_producer[extra_t]]
    extra_free = end[graph.tensor_producer[extra_t]].copy()
    extra_free[np.diff(graph.consumer_ptr)[extra_t] == 0] = makespan
    # outgoing transfers keep the source buffer alive until they end
    if tr_tensor.size:
        src_keys = tr_tensor * n_dev + placement[graph.tensor_producer[tr_tensor]]
        pos_k = np.minimum(np.searchsorted(keys, src_keys), max(keys.size - 1, 0))
        in_keys = keys[pos_k] == src_keys if keys.size else np.zeros(src_keys.size, dtype=bool)
        np.maximum.at(free, pos_k[in_keys], tr_end[in_keys])
        pos_in = np.searchsorted(extra_keys, src_keys[~in_keys])
        np.maximum.at(extra_free, pos_in, tr_end[~in_keys])
    all_dev = np.concatenate([k_d, extra_keys % n_dev])
    all_bytes = tb[np.concatenate([k_t, extra_t])]
    # sweep: merge frees and allocations by time with frees first at equal times, then a
    # stable sort by device keeps that order within each device
    free_t = np.concatenate([free, extra_free])
    alloc_t = np.concatenate([alloc, extra_alloc])
    n_h = free_t.shape[0]
    fo = np.argsort(free_t)
    ao = np.argsort(alloc_t)
    f_sorted = free_t[fo]
    a_sorted = alloc_t[ao]
    order = np.empty(2 * n_h, dtype=np.int64)
    order[np.arange(n_h) + np.searchsorted(a_sorted, f_sorted, side="left")] = fo
    order[np.arange(n_h) + np.searchsorted(f_sorted, a_sorted, side="right")] = n_h + ao
    time_ev = np.concatenate([free_t, alloc_t])
    delta = np.concatenate([-all_bytes, all_bytes])
    dev_ev = np.concatenate([all_dev, all_dev])
    dev_sorted = dev_ev[order]
    by_dev = np.argsort(dev_sorted.astype(np.int32 if n_dev > 32767 else np.int16), kind="stable")
    order = order[by_dev]
    live = np.cumsum(delta[order])  # every device's events sum to zero, so blocks restart at 0
    return param, dev_ev[order], time_ev[order], live


def simulate(
    graph: Hypergraph,
    inventory: Inventory,
    placement: np.ndarray,
    *,
    cost_model: CostModel | None = None,
    op_times_s: np.ndarray | None = None,
    priority: np.ndarray | None = None,
    record_timeline: bool = True,
    context: SimulationContext | None = None,
) -> SimulationResult:
    """Simulate one step of ``graph`` placed by ``placement`` on ``inventory``.

    The schedule model (compute, communication, memory) is in the module docstring.

    Parameters
    ----------
    graph : Hypergraph
    inventory : Inventory
    placement : numpy.ndarray of int, shape (n_ops,)
        Device id of every operator.
    cost_model : CostModel, optional
        Used for operator times (unless ``op_times_s`` is given) and link multipliers.
    op_times_s : numpy.ndarray, optional
        ``(n_ops, n_devices)`` operator times overriding the cost model.
    priority : numpy.ndarray, optional
        ``(n_ops,)``, larger runs first; default :func:`critical_path_priority`.
    record_timeline : bool
        When False, skip the memory sweep (``peak_memory_bytes`` is None); the
        timeline arrays are still filled (they cost little).
        :func:`estimate_makespan_s` is the fastest path for scoring placements.
    context : SimulationContext, optional
        From :func:`prepare_simulation` for the same graph and inventory; when given,
        ``cost_model`` and ``op_times_s`` are taken from it.

    Returns
    -------
    SimulationResult

    Raises
    ------
    InvalidInput
        Bad placement shape or device ids, bad ``op_times_s`` or ``priority``, a cycle.
    """
    ctx = context or prepare_simulation(graph, inventory, cost_model=cost_model, op_times_s=op_times_s)
    n_dev = inventory.n_devices
    p, dur, prio = _schedule_inputs(ctx, graph, inventory, placement, priority)
    start_l, end_l, tr = _event_loop(ctx, p, dur, prio)
    start = np.array(start_l, dtype=np.float64)
    end = np.array(end_l, dtype=np.float64)
    makespan = float(end.max()) if end.size else 0.0
    busy = np.bincount(p, weights=dur, minlength=n_dev).astype(np.float64)

    tr_tensor = np.array(tr[0], dtype=np.int64)
    tr_src = np.array(tr[1], dtype=np.int64)
    tr_dst = np.array(tr[2], dtype=np.int64)
    tr_start = np.array(tr[3], dtype=np.float64)
    tr_end = np.array(tr[4], dtype=np.float64)
    tr_bytes = graph.tensor_bytes[tr_tensor]
    # the simulated transfers are exactly remote_transfers(graph, p): stats come from them
    pair = tr_src * n_dev + tr_dst
    if n_dev * n_dev <= 1 << 20:
        # with weights bincount sums them as float64 (numpy's stub types every bincount as intp)
        per_pair: npt.NDArray[np.float64] = np.bincount(  # type: ignore[assignment]
            pair, weights=tr_bytes, minlength=n_dev * n_dev
        )
        upair = np.flatnonzero(np.bincount(pair, minlength=n_dev * n_dev))
        link_b = per_pair[upair]
    else:
        upair, pinv = np.unique(pair, return_inverse=True)
        link_b = np.bincount(pinv.reshape(-1), weights=tr_bytes, minlength=upair.size).astype(np.float64)
    cls = link_class_ids(inventory, tr_src, tr_dst)
    by_class = {LINK_CLASS_NAMES[c]: float(tr_bytes[cls == c].sum()) for c in (LINK_INTRA_GROUP, LINK_INTER_GROUP)}
    if record_timeline:
        param, ev_dev, _, live = _memory_sweep(
            graph, n_dev, p, start, end, makespan, tr_tensor, tr_dst, tr_start, tr_end
        )
        peak = np.zeros(n_dev, dtype=np.float64)
        np.maximum.at(peak, ev_dev, live)
        peak += param
    else:
        pm_owners = np.repeat(np.arange(graph.n_ops, dtype=np.int64), np.diff(graph.input_ptr))
        pm = graph.tensor_kind[graph.input_tensors] == TENSOR_PARAMETER
        pkeys = np.unique(graph.input_tensors[pm] * n_dev + p[pm_owners[pm]])
        param = np.bincount(pkeys % n_dev, weights=graph.tensor_bytes[pkeys // n_dev], minlength=n_dev)
        peak = None
    return SimulationResult(
        makespan_s=makespan,
        device_busy_s=busy,
        device_idle_s=makespan - busy,
        comm_bytes=float(tr_bytes.sum()),
        comm_bytes_by_class=by_class,
        link_src=upair // n_dev,
        link_dst=upair % n_dev,
        link_bytes=link_b,
        param_memory_bytes=np.asarray(param, dtype=np.float64),
        peak_memory_bytes=peak,
        op_device=p,
        op_start_s=start,
        op_end_s=end,
        transfer_tensor=tr_tensor,
        transfer_src=tr_src,
        transfer_dst=tr_dst,
        transfer_start_s=tr_start,
        transfer_end_s=tr_end,
        transfer_bytes=tr_bytes,
    )


def estimate_makespan_s(
    graph: Hypergraph,
    inventory: Inventory,
    placement: np.ndarray,
    *,
    context: SimulationContext | None = None,
    priority: np.ndarray | None = None,
) -> float:
    """Makespan only: the event loop of :func:`simulate` and nothing else.

    Pass a :class:`SimulationContext` (and, when scoring small moves, a fixed
    ``priority``) to skip the per-call precomputation.

    Raises
    ------
    InvalidInput
        As :func:`simulate`.
    """
    ctx = context or prepare_simulation(graph, inventory)
    _, end, _ = _event_loop(ctx, *_schedule_inputs(ctx, graph, inventory, placement, priority))
    return float(max(end)) if end else 0.0


def summarize(result: SimulationResult, inventory: Inventory) -> dict[str, Any]:
    """The plan ``summary`` of DESIGN.md from a simulation, in plain Python types.

    ``imbalance`` is ``max(busy) / mean(busy) - 1`` over all devices of the inventory
    (0 when every device computes equally long; idle devices count). ``feasible``
    says every device's peak fits its main memory (``None`` when the simulation ran
    without the memory sweep).

    Returns
    -------
    dict
        ``{"makespan_s", "comm_bytes", "comm_bytes_by_class", "peak_memory_bytes":
        {device: bytes}, "device_busy_s": {device: s}, "imbalance", "feasible",
        "over_memory_devices": [device, ...]}``.
    """
    names = [str(n) for n in inventory.device_names.tolist()]
    busy = result.device_busy_s
    mean = float(busy.mean()) if busy.size else 0.0
    imbalance = float(busy.max() / mean - 1.0) if mean > 0 else 0.0
    peak = result.peak_memory_bytes
    if peak is None:
        feasible = None
        over: list[str] = []
        peak_doc = {n: float(b) for n, b in zip(names, result.param_memory_bytes.tolist())}
    else:
        over_mask = peak > inventory.device_memory_bytes
        feasible = not bool(over_mask.any())
        over = [names[i] for i in np.flatnonzero(over_mask).tolist()]
        peak_doc = {n: float(b) for n, b in zip(names, peak.tolist())}
    return {
        "makespan_s": float(result.makespan_s),
        "comm_bytes": float(result.comm_bytes),
        "comm_bytes_by_class": dict(result.comm_bytes_by_class),
        "peak_memory_bytes": peak_doc,
        "device_busy_s": {n: float(b) for n, b in zip(names, busy.tolist())},
        "imbalance": imbalance,
        "feasible": feasible,
        "over_memory_devices": over,
    }


def memory_timeline(
    graph: Hypergraph, result: SimulationResult
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.float64], npt.NDArray[np.float64]]:
    """Memory in use on each device over the simulated step (the sweep behind ``peak_memory_bytes``).

    Returns
    -------
    device : numpy.ndarray of int64
    time_s : numpy.ndarray of float64
    bytes_in_use : numpy.ndarray of float64
        One entry per allocation or free, sorted by device then time: the bytes in
        use on ``device`` (resident parameters included) from ``time_s`` until that
        device's next entry. The maximum per device is ``result.peak_memory_bytes``.
    """
    n_dev = int(result.device_busy_s.shape[0])
    param, ev_dev, ev_time, live = _memory_sweep(
        graph,
        n_dev,
        result.op_device,
        result.op_start_s,
        result.op_end_s,
        result.makespan_s,
        result.transfer_tensor,
        result.transfer_dst,
        result.transfer_start_s,
        result.transfer_end_s,
    )
    return ev_dev.astype(np.int64), ev_time, live + param[ev_dev]
