"""HEFT list scheduling: upward-rank priorities, earliest-finish-time device choice.

HEFT [1]_ orders operators by *upward rank* (mean compute time plus the longest
mean-cost path to an exit) and puts each one, in that order, on the device where
it would finish first given when its inputs arrive. It is the classic answer for
heterogeneous devices and decides on its own how many devices to use: an
operator only leaves its producer's device when the transfer pays for itself.

Choices made here for scale (10^6 operators in seconds, pure Python inner loop):

* no insertion into idle gaps (the non-insertion variant; the simulator that
  scores the plan fills gaps anyway);
* a tensor that already reached a device is not sent again (hypergraph
  semantics: fan-out crosses a link once);
* on clusters above ``FULL_SCAN_DEVICES`` devices an operator only considers the
  devices of its producers and the earliest-free device of each group (the
  device HEFT picks is almost always one of those);
* a device whose resident parameters would pass its memory budget is skipped, so
  the schedule stays memory-feasible where parameters dominate.

References
----------
.. [1] H. Topcuoglu, S. Hariri, M.-Y. Wu, "Performance-Effective and
   Low-Complexity Task Scheduling for Heterogeneous Computing", IEEE TPDS 13(3),
   2002.
.. [2] O. Sinnen, L. A. Sousa, "Communication Contention in Task Scheduling",
   IEEE TPDS 16(6), 2005.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from partitioners.graph import TENSOR_ACTIVATION, TENSOR_PARAMETER, Hypergraph

__all__ = ["FULL_SCAN_DEVICES", "HeftSchedule", "upward_rank", "heft_schedule"]

#: Up to this many devices every operator considers every device (above, the producers' devices
#: and the earliest-free device of each group: as good in simulation and faster).
FULL_SCAN_DEVICES = 4


@dataclass(frozen=True, eq=False)
class HeftSchedule:
    """Result of :func:`heft_schedule`.

    Attributes
    ----------
    placement : numpy.ndarray of int64, shape (n_ops,)
        Device of each operator (ids of the inventory, not positions in ``devices``).
    order : numpy.ndarray of int64, shape (n_ops,)
        Operators in scheduling order (descending upward rank).
    finish_s : numpy.ndarray of float64, shape (n_ops,)
        HEFT's own estimate of each operator's finish time (no link contention).
    makespan_s : float
        HEFT's estimate of the makespan.
    """

    placement: np.ndarray
    order: np.ndarray
    finish_s: np.ndarray
    makespan_s: float


def upward_rank(
    graph: Hypergraph, levels: np.ndarray, mean_time_s: np.ndarray, mean_s_per_byte: float, mean_latency_s: float
) -> np.ndarray:
    """Upward rank of every operator, one vectorised pass per level, deepest first.

    ``rank(v) = w(v) + max over consumers s of (c(v, s) + rank(s))`` with mean
    compute ``w`` and mean transfer ``c`` (Topcuoglu et al. 2002, eq. 7).
    """
    src, dst, tensors = graph.op_edges()
    comm = mean_latency_s + graph.tensor_bytes[tensors] * mean_s_per_byte
    rank = np.asarray(mean_time_s, dtype=np.float64).copy()
    if src.shape[0] == 0:
        return rank
    src_level = levels[src]
    order = np.argsort(-src_level, kind="stable")
    src, dst, comm, src_level = src[order], dst[order], comm[order], src_level[order]
    # segment boundaries per level (descending)
    cut = np.flatnonzero(np.diff(src_level)) + 1
    starts = np.concatenate([[0], cut])
    ends = np.concatenate([cut, [src.shape[0]]])
    best = np.zeros(graph.n_ops, dtype=np.float64)
    for a, b in zip(starts.tolist(), ends.tolist()):
        s = src[a:b]
        np.maximum.at(best, s, comm[a:b] + rank[dst[a:b]])
        rank[s] = mean_time_s[s] + best[s]
    return rank


def heft_schedule(
    graph: Hypergraph,
    op_time_s: np.ndarray,
    latency_s: np.ndarray,
    s_per_byte: np.ndarray,
    levels: np.ndarray,
    *,
    devices: np.ndarray | None = None,
    device_group: np.ndarray | None = None,
    param_budget_bytes: np.ndarray | None = None,
    param_scale: float = 1.0,
    op_static_bytes: np.ndarray | None = None,
    contention: bool = False,
) -> HeftSchedule:
    """Place and order every operator with HEFT (non-insertion).

    Parameters
    ----------
    graph : Hypergraph
    op_time_s : numpy.ndarray, shape (n_ops, n_devices)
        Time of each operator on each device of the inventory.
    latency_s, s_per_byte : numpy.ndarray, shape (n_devices, n_devices)
        Link latency and seconds per byte between devices (zero on the diagonal).
    levels : numpy.ndarray of int64, shape (n_ops,)
        Longest-path level of each operator (for the rank pass).
    devices : numpy.ndarray of int64, optional
        Devices HEFT may use (all when omitted).
    device_group : numpy.ndarray of int64, optional
        Group of every inventory device (for candidate pruning on large clusters).
    param_budget_bytes : numpy.ndarray, shape (n_devices,), optional
        Bytes of parameters each device may hold; a device is skipped for an
        operator whose new parameters would pass it (unless no device can take it).
    param_scale : float
        Multiplier on parameter bytes when charging the budget.
    op_static_bytes : numpy.ndarray, shape (n_ops,), optional
        Further bytes an operator pins on its device for the rest of the step
        (activations saved for the backward pass), charged to the same budget.
    contention : bool
        Model link contention as the simulator does: every device has one egress
        and one ingress port per link class, each carrying one transfer at a time,
        so a transfer waits for both ports (the contention-aware list scheduling of Sinnen &
        Sousa [2]_, in its non-insertion form). Classic HEFT assumes every transfer
        starts when its producer finishes.

    Returns
    -------
    HeftSchedule
    """
    n = graph.n_ops
    n_dev_all = op_time_s.shape[1]
    devices = np.arange(n_dev_all, dtype=np.int64) if devices is None else np.asarray(devices, dtype=np.int64)
    k = int(devices.shape[0])
    t_sub = op_time_s[:, devices]
    lat = latency_s[np.ix_(devices, devices)]
    spb = s_per_byte[np.ix_(devices, devices)]
    off = ~np.eye(k, dtype=bool)
    mean_spb = float(spb[off].mean()) if k > 1 else 0.0
    mean_lat = float(lat[off].mean()) if k > 1 else 0.0
    rank = upward_rank(graph, levels, t_sub.mean(axis=1), mean_spb, mean_lat)
    topo_pos = np.argsort(np.lexsort((np.arange(n), levels)), kind="stable")
    order = np.lexsort((topo_pos, -rank))

    # Python-level views for the inner loop
    kind = graph.tensor_kind
    in_ptr = graph.input_ptr.tolist()
    in_t = graph.input_tensors.tolist()
    producer = graph.tensor_producer.tolist()
    is_act = (kind == TENSOR_ACTIVATION).tolist()
    is_param = (kind == TENSOR_PARAMETER).tolist()
    t_bytes = graph.tensor_bytes.tolist()
    times = t_sub.tolist()
    lat_l = lat.tolist()
    spb_l = spb.tolist()
    groups = (
        device_group[devices].tolist() if device_group is not None else [0] * k
    )
    group_ids = sorted(set(groups))
    group_members = {g: [j for j in range(k) if groups[j] == g] for g in group_ids}
    full_scan = k <= FULL_SCAN_DEVICES
    budget = (
        param_budget_bytes[devices].astype(float).tolist() if param_budget_bytes is not None else None
    )
    params_on: list[set[int]] = [set() for _ in range(k)]
    static = op_static_bytes.astype(float).tolist() if op_static_bytes is not None and budget is not None else None
    param_used = [0.0] * k

    dev_of = [-1] * n
    finish = [0.0] * n
    avail = [0.0] * k
    arrival: dict[tuple[int, int], float] = {}
    all_devs = list(range(k))
    # egress port of each (src, dst) pair: one per link class, as the simulator models
    port_of = [[0 if groups[a] == groups[b] else 1 for b in range(k)] for a in range(k)]
    egress_free: dict[int, float] = {}
    ingress_free: dict[int, float] = {}
    for v in order.tolist():
        inputs = [(t, producer[t]) for t in in_t[in_ptr[v] : in_ptr[v + 1]] if is_act[t]]
        if full_scan:
            cands = all_devs
        else:
            cset = {dev_of[p] for _, p in inputs}
            for g in group_ids:
                mem = group_members[g]
                cset.add(min(mem, key=avail.__getitem__))
            cands = sorted(cset)
        new_params = [t for t in in_t[in_ptr[v] : in_ptr[v + 1]] if is_param[t]] if budget is not None else []
        all_param = sum(t_bytes[t] for t in new_params) * param_scale if new_params else 0.0
        pinned = static[v] if static is not None else 0.0
        all_param += pinned
        row = times[v]
        best_d = -1
        best_f = float("inf")
        fallback_d = -1
        fallback_f = float("inf")
        for d in cands:
            ready = 0.0
            for t, p in inputs:
                pd = dev_of[p]
                if pd == d:
                    r = finish[p]
                else:
                    r = arrival.get((t, d))
                    if r is None:
                        r = finish[p]
                        if contention:
                            cls = port_of[pd][d]
                            pf = egress_free.get(pd * 2 + cls, 0.0)
                            if pf > r:
                                r = pf
                            pf = ingress_free.get(d * 2 + cls, 0.0)
                            if pf > r:
                                r = pf
                        r += lat_l[pd][d] + t_bytes[t] * spb_l[pd][d]
                if r > ready:
                    ready = r
            start = avail[d] if avail[d] > ready else ready
            f = start + row[d]
            if budget is not None and param_used[d] + all_param > budget[d]:
                extra = sum(t_bytes[t] for t in new_params if t not in params_on[d]) * param_scale + pinned
                if param_used[d] + extra > budget[d]:
                    if f < fallback_f:
                        fallback_f, fallback_d = f, d
                    continue
            if f < best_f:
                best_f, best_d = f, d
        if best_d < 0:
            best_d, best_f = fallback_d, fallback_f
        d = best_d
        dev_of[v] = d
        finish[v] = best_f
        avail[d] = best_f
        for t, p in inputs:
            pd = dev_of[p]
            if pd != d and (t, d) not in arrival:
                begin = finish[p]
                if contention:
                    cls = port_of[pd][d]
                    out_port, in_port = pd * 2 + cls, d * 2 + cls
                    begin = max(begin, egress_free.get(out_port, 0.0), ingress_free.get(in_port, 0.0))
                    egress_free[out_port] = ingress_free[in_port] = begin + lat_l[pd][d] + t_bytes[t] * spb_l[pd][d]
                arrival[(t, d)] = begin + lat_l[pd][d] + t_bytes[t] * spb_l[pd][d]
        if budget is not None:
            param_used[d] += pinned
            for t in new_params:
                if t not in params_on[d]:
                    params_on[d].add(t)
                    param_used[d] += t_bytes[t] * param_scale
    local = np.asarray(dev_of, dtype=np.int64)
    finish_arr = np.asarray(finish, dtype=np.float64)
    return HeftSchedule(
        placement=devices[local],
        order=order.astype(np.int64),
        finish_s=finish_arr,
        makespan_s=float(finish_arr.max()) if n else 0.0,
    )
