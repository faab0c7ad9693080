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
  the schedule stays memory-feasible where parameters dominate;
* an operator restricted to some device types (the graph's ``device_types``)
  only considers devices of those types, and its rank uses its mean time over
  them.

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

from partitioners.graph.hypergraph import TENSOR_ACTIVATION, TENSOR_PARAMETER, Hypergraph

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
    op_allowed_set: np.ndarray | None = None,
    allowed_devices: np.ndarray | None = None,
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
    op_allowed_set : numpy.ndarray of int64, shape (n_ops,), optional
        Row of ``allowed_devices`` of every operator (see
        :class:`~partitioners.hardware.device_types.DeviceTypeConstraint`).
    allowed_devices : numpy.ndarray of bool, shape (n_sets, n_devices), optional
        Inventory devices each row admits. An operator only goes to an admitted
        device among ``devices``; a row that admits none of ``devices`` does not
        restrict (the caller repairs such operators afterwards).

    Returns
    -------
    HeftSchedule
    """
    devices = np.arange(op_time_s.shape[1], dtype=np.int64) if devices is None else np.asarray(devices, dtype=np.int64)
    time_s = op_time_s[:, devices]
    lat = latency_s[np.ix_(devices, devices)]
    spb = s_per_byte[np.ix_(devices, devices)]
    groups = device_group[devices].tolist() if device_group is not None else [0] * len(devices)
    restriction = None
    if op_allowed_set is not None and allowed_devices is not None:
        restriction = _Restriction.build(
            np.asarray(op_allowed_set, dtype=np.int64), np.asarray(allowed_devices, dtype=bool)[:, devices], groups
        )
    order = _priority_order(graph, levels, time_s, lat, spb, restriction)
    links = _Links(lat.tolist(), spb.tolist(), groups, graph.tensor_bytes.tolist(), contention)
    budget = None
    if param_budget_bytes is not None:
        budget = _ParameterBudget(
            graph, param_budget_bytes[devices].astype(float).tolist(), param_scale, op_static_bytes
        )
    scheduler = _Scheduler(graph, time_s.tolist(), groups, links, budget, restriction)
    for v in order.tolist():
        scheduler.place(v)
    local = np.asarray(scheduler.device_of, dtype=np.int64)
    finish = np.asarray(scheduler.finish_s, dtype=np.float64)
    return HeftSchedule(
        placement=devices[local],
        order=order.astype(np.int64),
        finish_s=finish,
        makespan_s=float(finish.max()) if graph.n_ops else 0.0,
    )


def _priority_order(
    graph: Hypergraph,
    levels: np.ndarray,
    time_s: np.ndarray,
    lat: np.ndarray,
    spb: np.ndarray,
    restriction: _Restriction | None = None,
) -> np.ndarray:
    """Operators by descending upward rank, ties in topological order (level, then id).

    A restricted operator's compute cost is its mean time over the devices it may use.
    """
    k = time_s.shape[1]
    off = ~np.eye(k, dtype=bool)
    mean_spb = float(spb[off].mean()) if k > 1 else 0.0
    mean_lat = float(lat[off].mean()) if k > 1 else 0.0
    mean_time_s = time_s.mean(axis=1)
    if restriction is not None:
        ops = np.flatnonzero(restriction.op_set_array >= 0)
        admitted = restriction.local_allowed[restriction.op_set_array[ops]]
        mean_time_s[ops] = (time_s[ops] * admitted).sum(axis=1) / admitted.sum(axis=1)
    rank = upward_rank(graph, levels, mean_time_s, mean_spb, mean_lat)
    topo_pos = np.argsort(np.lexsort((np.arange(graph.n_ops), levels)), kind="stable")
    return np.lexsort((topo_pos, -rank))


class _Restriction:
    """Devices (positions in ``devices``) each restricted operator may use.

    Only rows that admit some but not all of the devices restrict; other operators
    have row ``-1`` and take the unrestricted path.
    """

    def __init__(self, op_set_array: np.ndarray, local_allowed: np.ndarray, groups: list[int]) -> None:
        self.op_set_array = op_set_array
        self.local_allowed = local_allowed
        self.op_set = op_set_array.tolist()
        self.set_devices = [np.flatnonzero(row).tolist() for row in local_allowed]
        self.set_members = [set(devs) for devs in self.set_devices]
        self.set_group_members = [
            [[j for j in devs if groups[j] == g] for g in sorted({groups[j] for j in devs})]
            for devs in self.set_devices
        ]

    @classmethod
    def build(cls, op_allowed_set: np.ndarray, local_allowed: np.ndarray, groups: list[int]) -> _Restriction | None:
        binding = np.asarray(local_allowed.any(axis=1) & ~local_allowed.all(axis=1))
        if not binding.any():
            return None
        return cls(np.where(binding[op_allowed_set], op_allowed_set, -1), local_allowed, groups)


class _Links:
    """When a tensor reaches a device, and (under contention) the ports its transfer books.

    Every device has one egress and one ingress port per link class (inside its group,
    across groups); with ``contention`` a transfer waits until both are free (Sinnen &
    Sousa [2]_), as the simulator models it.
    """

    def __init__(
        self,
        latency_s: list[list[float]],
        s_per_byte: list[list[float]],
        groups: list[int],
        tensor_bytes: list[float],
        contention: bool,
    ) -> None:
        self.latency_s, self.s_per_byte, self.tensor_bytes = latency_s, s_per_byte, tensor_bytes
        self.contention = contention
        k = len(groups)
        self.port_class = [[0 if groups[a] == groups[b] else 1 for b in range(k)] for a in range(k)]
        self.egress_free: dict[int, float] = {}
        self.ingress_free: dict[int, float] = {}
        self.arrival: dict[tuple[int, int], float] = {}

    def arrival_s(self, tensor: int, src: int, dst: int, ready_s: float) -> float:
        """When ``tensor``, ready on ``src`` at ``ready_s`` and not yet sent to ``dst``
        (``arrival`` has the ones that were), would reach it; nothing is booked."""
        if self.contention:
            cls = self.port_class[src][dst]
            ready_s = max(ready_s, self.egress_free.get(src * 2 + cls, 0.0), self.ingress_free.get(dst * 2 + cls, 0.0))
        return ready_s + (self.latency_s[src][dst] + self.tensor_bytes[tensor] * self.s_per_byte[src][dst])

    def send(self, tensor: int, src: int, dst: int, ready_s: float) -> None:
        """Book the transfer of ``tensor`` to ``dst`` unless it is already there or on its way."""
        if (tensor, dst) in self.arrival:
            return
        begin = ready_s
        if self.contention:
            cls = self.port_class[src][dst]
            out_port, in_port = src * 2 + cls, dst * 2 + cls
            begin = max(begin, self.egress_free.get(out_port, 0.0), self.ingress_free.get(in_port, 0.0))
        end = begin + self.latency_s[src][dst] + self.tensor_bytes[tensor] * self.s_per_byte[src][dst]
        if self.contention:
            self.egress_free[out_port] = self.ingress_free[in_port] = end
        self.arrival[(tensor, dst)] = end


class _ParameterBudget:
    """Bytes of parameters (and pinned saved activations) each device may still take.

    A parameter read by several operators on one device is charged once.
    """

    def __init__(
        self, graph: Hypergraph, capacity_bytes: list[float], param_scale: float, op_static_bytes: np.ndarray | None
    ) -> None:
        self.capacity_bytes = capacity_bytes
        self.used_bytes = [0.0] * len(capacity_bytes)
        self.resident: list[set[int]] = [set() for _ in capacity_bytes]
        self.param_scale = param_scale
        self.tensor_bytes = graph.tensor_bytes.tolist()
        self.pinned_bytes = op_static_bytes.astype(float).tolist() if op_static_bytes is not None else None

    def demand(self, op: int, params: list[int]) -> tuple[float, float]:
        """Bytes ``op`` pins on its device, and what it costs (pinned bytes and
        ``params``) on a device that holds none of its parameters yet."""
        pinned = self.pinned_bytes[op] if self.pinned_bytes is not None else 0.0
        return pinned, (sum(self.tensor_bytes[t] for t in params) * self.param_scale + pinned if params else pinned)

    def admits(self, device: int, params: list[int], pinned: float) -> bool:
        """Whether ``device`` can take the parameters it does not hold yet and ``pinned``."""
        held = self.resident[device]
        extra = sum(self.tensor_bytes[t] for t in params if t not in held) * self.param_scale + pinned
        fits: bool = self.used_bytes[device] + extra <= self.capacity_bytes[device]
        return fits

    def charge(self, device: int, params: list[int], pinned: float) -> None:
        self.used_bytes[device] += pinned
        held = self.resident[device]
        for t in params:
            if t not in held:
                held.add(t)
                self.used_bytes[device] += self.tensor_bytes[t] * self.param_scale


class _Scheduler:
    """HEFT's non-insertion list scheduling, one operator at a time (Python lists: this is
    the inner loop of planning 10^6 operators)."""

    def __init__(
        self,
        graph: Hypergraph,
        time_s: list[list[float]],
        groups: list[int],
        links: _Links,
        budget: _ParameterBudget | None,
        restriction: _Restriction | None = None,
    ) -> None:
        self.time_s, self.links, self.budget, self.restriction = time_s, links, budget, restriction
        self.input_ptr = graph.input_ptr.tolist()
        self.input_tensors = graph.input_tensors.tolist()
        self.producer = graph.tensor_producer.tolist()
        self.is_activation = (graph.tensor_kind == TENSOR_ACTIVATION).tolist()
        self.is_parameter = (graph.tensor_kind == TENSOR_PARAMETER).tolist()
        k = len(groups)
        self.all_devices = list(range(k))
        self.group_members = [[j for j in range(k) if groups[j] == g] for g in sorted(set(groups))]
        self.full_scan = k <= FULL_SCAN_DEVICES
        self.device_of = [-1] * graph.n_ops
        self.finish_s = [0.0] * graph.n_ops
        self.free_s = [0.0] * k

    def candidates(self, op: int, inputs: list[tuple[int, int]]) -> list[int]:
        """Every device on small clusters; else the producers' devices and each group's
        earliest-free device; only devices ``op`` may use when it is restricted."""
        restriction = self.restriction
        row = restriction.op_set[op] if restriction is not None else -1
        if row >= 0 and restriction is not None:
            if self.full_scan:
                return restriction.set_devices[row]
            members = restriction.set_members[row]
            chosen = {self.device_of[p] for _, p in inputs} & members
            for group in restriction.set_group_members[row]:
                chosen.add(min(group, key=self.free_s.__getitem__))
            return sorted(chosen)
        if self.full_scan:
            return self.all_devices
        chosen = {self.device_of[p] for _, p in inputs}
        for group_devices in self.group_members:
            chosen.add(min(group_devices, key=self.free_s.__getitem__))
        return sorted(chosen)

    def place(self, op: int) -> None:
        """Put ``op`` on the candidate where it finishes first among those its memory
        budget admits (on the earliest-finishing one if none does) and book its inputs."""
        reads = self.input_tensors[self.input_ptr[op] : self.input_ptr[op + 1]]
        inputs = [(t, self.producer[t]) for t in reads if self.is_activation[t]]
        budget = self.budget
        params = [t for t in reads if self.is_parameter[t]] if budget is not None else []
        pinned, most = budget.demand(op, params) if budget is not None else (0.0, 0.0)
        row, device_of, finish_s, free_s = self.time_s[op], self.device_of, self.finish_s, self.free_s
        arrival, arrival_s = self.links.arrival, self.links.arrival_s
        best, best_finish, fallback, fallback_finish = -1, float("inf"), -1, float("inf")
        for d in self.candidates(op, inputs):
            ready = 0.0
            for t, p in inputs:
                pd = device_of[p]
                if pd == d:
                    r = finish_s[p]
                else:
                    r = arrival.get((t, d))
                    if r is None:
                        r = arrival_s(t, pd, d, finish_s[p])
                if r > ready:
                    ready = r
            finish = (free_s[d] if free_s[d] > ready else ready) + row[d]
            if (
                budget is not None
                and budget.used_bytes[d] + most > budget.capacity_bytes[d]
                and not budget.admits(d, params, pinned)
            ):
                if finish < fallback_finish:
                    fallback, fallback_finish = d, finish
                continue
            if finish < best_finish:
                best, best_finish = d, finish
        if best < 0:
            best, best_finish = fallback, fallback_finish
        device_of[op] = best
        finish_s[op] = free_s[best] = best_finish
        for t, p in inputs:
            if device_of[p] != best:
                self.links.send(t, device_of[p], best, finish_s[p])
        if budget is not None:
            budget.charge(best, params, pinned)
