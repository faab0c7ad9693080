"""Lower bounds on the simulated makespan of any plan the engine can return: how good is a plan.

Every plan carries ``lower_bound_s``: no placement of the same (expanded) graph on the
devices the options allow, under the same cost model and constraints, has a simulated
makespan (:mod:`partitioners.costmodel.simulator`) below it. ``makespan / bound - 1`` is
then an upper bound on how much a better plan could save. Each bound below is a small
pure function; :func:`plan_lower_bounds` takes the largest.

What the simulator allows, and each bound therefore assumes:

* An operator's time on device ``d`` is never below :func:`op_time_floors_s`: the
  cost model's roofline time with each of its tensors read and written at the
  fastest memory tier of ``d`` that could hold it (level 3 re-times the chosen
  schedule with tier bandwidths, :mod:`partitioners.placement.memory_tiers`; a tensor
  larger than a tier's capacity never lands there, and parameters, graph inputs and
  graph outputs stay in main memory). Launch overheads stay in.
* An operator starts after every producer of its inputs has finished, and a
  transfer between two devices takes at least the uncontended ``alpha + bytes /
  bandwidth`` of the pair's link (contention only delays it further).
* A device runs one operator at a time. An operator runs only on a usable device
  (``max_devices``) its device types allow, or (when a placement is given, as in
  re-planning) on a device the placement uses.

The bounds:

``critical-path``
    The longest path when every operator takes its floor time on its fastest
    allowed device and no transfer costs anything [1]_.
``load``
    ``sum_j p_j / sum_d s_d`` with ``p_j`` operator ``j``'s fastest floor time and
    ``s_d = max_j p_j / floor(j, d)`` (over the operators ``d`` may run) the most
    work of that kind ``d`` gets through per second: device ``d`` busy for ``L``
    seconds clears at most ``s_d L`` of it. With identical devices ``s_d = 1``:
    total work over the number of devices [2]_.
``load-window``
    The load bound on the operators that cannot start before ``r`` (their head,
    the longest path above them) and, after finishing, still have at least ``q``
    ahead of them (their tail): they fit between ``r`` and ``makespan - q``, so
    ``makespan >= r + W / sum s_d + q``, taken over every head threshold and every
    tail threshold [3]_. It sees pipeline fill and drain: the last stages cannot
    start before the first operators have run.
``memory-cut``
    Only for feasible plans. When the parameters a weakly connected part of the
    graph reads do not fit in the largest memory budget of a device it may use,
    that part spans two devices, so at least one of its activation edges ``u -> v``
    crosses devices and the path through it pays a transfer:
    ``makespan >= min over its edges of (head(u) + p_u + c(u, v) + p_v + tail(v))``
    with ``c`` the cheapest transfer of the edge's tensor between two usable
    devices.
``exact``
    Added by the engine (:meth:`LowerBounds.with_bound`) for ``strategy="exact"``:
    the bound CP-SAT proved (:mod:`partitioners.placement.exact`), where it bounds
    the simulated makespan.

A pipeline bound "the slowest stage's work under the best contiguous split" would
hold for plans whose every micro-batch runs the same stages; the engine's hybrid
candidates replicate stages and take whole micro-batches on separate devices, and
HEFT places micro-batches freely, so that bound is not valid for what the engine may
return; ``load-window`` is the valid bound that captures fill and drain.

References
----------
.. [1] R. L. Graham, "Bounds on multiprocessing timing anomalies", SIAM J. Appl.
   Math. 17(2), 1969 (critical path and total work over machines).
.. [2] E. Horowitz, S. Sahni, "Exact and approximate algorithms for scheduling
   nonidentical processors", JACM 23(2), 1976 (uniform machines: work over total speed).
.. [3] P. Baptiste, C. Le Pape, W. Nuijten, "Constraint-Based Scheduling", Kluwer 2001,
   ch. 3 (energetic reasoning); J. Carlier, "The one-machine sequencing problem", EJOR
   11(1), 1982 (heads and tails).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import numpy.typing as npt

from partitioners.costmodel.costs import CostModel, op_times_by_profile_s
from partitioners.costmodel.simulator import SimulationContext, critical_path_priority
from partitioners.graph.hypergraph import TENSOR_PARAMETER, Hypergraph
from partitioners.hardware.inventory import Inventory
from partitioners.placement.memory_tiers import ALIGNMENT_BYTES

__all__ = [
    "BOUND_NAMES",
    "MEMORY_CUT_MAX_DEVICES",
    "LowerBounds",
    "op_time_floors_s",
    "allowed_floor_matrix",
    "heads_and_tails",
    "critical_path_bound_s",
    "device_rates",
    "load_bound_s",
    "load_window_bound_s",
    "memory_cut_bound_s",
    "lower_bounds",
]

#: Every bound :func:`lower_bounds` may name, in the order ties are broken.
BOUND_NAMES = ("critical-path", "load", "load-window", "memory-cut", "exact")
#: Above this many candidate devices the memory-cut bound is skipped (it reads the
#: device-pair link table).
MEMORY_CUT_MAX_DEVICES = 2048

FloatArray = npt.NDArray[np.float64]


@dataclass(frozen=True)
class LowerBounds:
    """The lower bounds of one plan.

    Attributes
    ----------
    lower_bound_s : float
        The largest bound: no plan the engine could return is faster.
    binding : str
        The name of that bound (one of :data:`BOUND_NAMES`).
    by_bound_s : dict of str to float
        Every bound computed, by name.
    """

    lower_bound_s: float
    binding: str
    by_bound_s: dict[str, float]

    def gap(self, makespan_s: float) -> float:
        """``makespan / bound - 1``, never below 0: a plan that meets its bound is optimal, and summing the
        same times in another order can put the bound an ulp above it (0 when both are 0)."""
        if self.lower_bound_s <= 0.0:
            return 0.0 if makespan_s <= 0.0 else float("inf")
        return max(0.0, float(makespan_s / self.lower_bound_s - 1.0))

    def with_bound(self, name: str, value_s: float) -> LowerBounds:
        """These bounds with one more (e.g. the exact solver's proven bound)."""
        by = {**self.by_bound_s, name: float(value_s)}
        best = max(BOUND_NAMES, key=lambda n: (by.get(n, -1.0), -BOUND_NAMES.index(n)))
        return replace(self, lower_bound_s=by[best], binding=best, by_bound_s=by)


def op_time_floors_s(
    graph: Hypergraph,
    inventory: Inventory,
    cost_model: CostModel,
    devices: npt.NDArray[np.int64],
    *,
    tiers: bool = True,
) -> FloatArray:
    """The least time each operator can take on each of ``devices``, memory tiers included.

    The cost model's roofline ``max(compute, memory) + launch``
    (:mod:`partitioners.costmodel.costs`) with the memory term scaled as level 3
    scales it (:func:`~partitioners.placement.memory_tiers.placed_tier_op_times_s`):
    by ``sum_i b_i / bw(tier_i) / sum_i b_i / bw(main)``, here with each tensor ``i``
    at the fastest tier of the device whose capacity holds ``b_i`` rounded up to the
    allocation alignment (a lower bound on that ratio whatever tiers level 3
    chooses), except parameters, graph inputs and graph outputs, which level 3 keeps
    in main memory; and never above the main-memory time.

    Parameters
    ----------
    graph : Hypergraph
        The expanded graph that is placed.
    inventory : Inventory
    cost_model : CostModel
        The plan's cost model (any profile or calibration: every term comes from it).
    devices : numpy.ndarray of int64
        The devices to price.
    tiers : bool
        False: main-memory times (the cost model's, as candidates are scored before level 3).

    Returns
    -------
    numpy.ndarray of float64, shape (n_ops, len(devices))
    """
    full, profile = op_times_by_profile_s(graph, inventory, cost_model)
    if not tiers:
        main: FloatArray = full[:, profile[devices]]
        return main
    compute, _ = op_times_by_profile_s(
        replace(graph, tensor_bytes=np.zeros_like(graph.tensor_bytes)), inventory, cost_model
    )
    memory, _ = op_times_by_profile_s(replace(graph, op_flops=np.zeros_like(graph.op_flops)), inventory, cost_model)
    launch = cost_model.launch_overhead_s
    n = graph.n_ops
    owners = np.concatenate(
        [
            np.repeat(np.arange(n, dtype=np.int64), np.diff(graph.input_ptr)),
            np.repeat(np.arange(n, dtype=np.int64), np.diff(graph.output_ptr)),
        ]
    )
    tensors = np.concatenate([graph.input_tensors, graph.output_tensors])
    b = graph.tensor_bytes[tensors]
    # what level 3 may hold on chip: activations made and read inside the step, at their
    # aligned size; parameters, graph inputs and graph outputs stay in main memory
    aligned = np.ceil(b / ALIGNMENT_BYTES) * ALIGNMENT_BYTES
    on_chip = (
        (graph.tensor_kind[tensors] != TENSOR_PARAMETER)
        & (graph.tensor_producer[tensors] >= 0)
        & (np.diff(graph.consumer_ptr)[tensors] > 0)
    )
    cap = inventory.tier_capacity_bytes
    bw = inventory.tier_bandwidth_bytes_per_s
    main_bw = inventory.device_memory_bandwidth_bytes_per_s
    # devices alike in (tier capacities, tier bandwidths, main bandwidth) share a ratio column
    signature = np.column_stack([cap[devices], bw[devices], main_bw[devices]])
    kinds, kind_of = np.unique(signature, axis=0, return_inverse=True)
    kind_of = kind_of.reshape(-1)
    ratio = np.ones((n, kinds.shape[0]), dtype=np.float64)
    for k in range(kinds.shape[0]):
        d = int(devices[int(np.flatnonzero(kind_of == k)[0])])
        best_bw = np.full(b.shape[0], max(float(main_bw[d]), 1.0))
        for t in range(cap.shape[1]):
            if cap[d, t] > 0:
                fits = on_chip & (aligned <= cap[d, t])
                best_bw[fits] = np.maximum(best_bw[fits], max(float(bw[d, t]), 1.0))
        fast = np.bincount(owners, weights=b / best_bw, minlength=n).astype(np.float64)
        slow = np.bincount(owners, weights=b / max(float(main_bw[d]), 1.0), minlength=n).astype(np.float64)
        ratio[:, k] = np.where(slow > 0, fast / np.where(slow > 0, slow, 1.0), 1.0)
    cols = profile[devices]
    mem_floor = launch + (memory[:, cols] - launch) * ratio[:, kind_of]
    floors: FloatArray = np.minimum(full[:, cols], np.maximum(compute[:, cols], mem_floor))
    return floors


def allowed_floor_matrix(
    floors_s: FloatArray, op_allowed_set: npt.NDArray[np.int64] | None, allowed_rows: npt.NDArray[np.bool_] | None
) -> FloatArray:
    """``floors_s`` with ``inf`` where an operator may not run on the device (its device types).

    Parameters
    ----------
    floors_s : numpy.ndarray, shape (n_ops, n_candidate_devices)
        From :func:`op_time_floors_s`.
    op_allowed_set : numpy.ndarray of int64 or None
        Row of ``allowed_rows`` for every operator; ``None``: every operator anywhere.
    allowed_rows : numpy.ndarray of bool, shape (n_sets, n_candidate_devices) or None
        Which of the candidate devices each row admits.
    """
    if op_allowed_set is None or allowed_rows is None:
        return floors_s
    out: FloatArray = np.where(allowed_rows[op_allowed_set], floors_s, np.inf)
    return out


def heads_and_tails(sim: SimulationContext, p_s: FloatArray) -> tuple[FloatArray, FloatArray]:
    """Earliest start (head) and least time after the end (tail) of every operator.

    ``head(v) = max over producers u of head(u) + p_u``; ``tail(u) = max over
    consumers v of p_v + tail(v)``, transfers free [3]_.

    Parameters
    ----------
    sim : SimulationContext
        The simulator's precomputation for the graph (its edge lists and order).
    p_s : numpy.ndarray, shape (n_ops,)
        Each operator's least time (:func:`op_time_floors_s`, fastest allowed device).

    Returns
    -------
    head, tail : numpy.ndarray of float64, shape (n_ops,)
    """
    g = sim.graph
    rank = critical_path_priority(
        g, sim.inventory, np.zeros(g.n_ops, dtype=np.int64), p_s, cost_model=sim.cost_model, context=sim
    )
    tail = rank - p_s
    succ, ptr = sim.edge_dst_list, sim.edge_ptr
    p = p_s.tolist()
    head = [0.0] * g.n_ops
    for u in reversed(sim.reverse_topo):
        a = ptr[u]
        b = ptr[u + 1]
        if a == b:
            continue
        h = head[u] + p[u]
        for e in range(a, b):
            v = succ[e]
            if h > head[v]:
                head[v] = h
    return np.array(head, dtype=np.float64), np.maximum(tail, 0.0)


def critical_path_bound_s(head_s: FloatArray, tail_s: FloatArray, p_s: FloatArray) -> float:
    """``max over operators of head + p + tail``: the critical path with free transfers [1]_.

    Parameters
    ----------
    head_s, tail_s : numpy.ndarray, shape (n_ops,)
        From :func:`heads_and_tails`.
    p_s : numpy.ndarray, shape (n_ops,)
        Each operator's least time.
    """
    return float((head_s + p_s + tail_s).max()) if p_s.size else 0.0


def device_rates(floors_s: FloatArray, p_s: FloatArray) -> FloatArray:
    """``s_d = max_j p_j / floor(j, d)`` over the operators device ``d`` may run (``inf`` floors excluded).

    A device busy for ``L`` seconds runs operators whose floor times there sum to at
    most ``L``, and each of them counts at most ``s_d`` times its floor in ``p``, so
    it clears at most ``s_d L`` of the work ``sum p``. ``s_d <= 1``; equal to 1 when
    ``d`` is some operator's fastest device [2]_.

    Parameters
    ----------
    floors_s : numpy.ndarray, shape (n_ops, n_candidate_devices)
        Floor times, ``inf`` where not allowed (:func:`allowed_floor_matrix`).
    p_s : numpy.ndarray, shape (n_ops,)
        Row minima of ``floors_s``.
    """
    ok = np.isfinite(floors_s) & (floors_s > 0)
    r = np.where(ok, p_s[:, None] / np.where(ok, floors_s, 1.0), 0.0)
    rates: FloatArray = r.max(axis=0) if r.shape[0] else np.zeros(floors_s.shape[1])
    return rates


def load_bound_s(p_s: FloatArray, rates: FloatArray) -> float:
    """Total least work over the devices' total rate: ``sum p / sum s_d`` [2]_.

    Parameters
    ----------
    p_s : numpy.ndarray, shape (n_ops,)
        Each operator's least time.
    rates : numpy.ndarray, shape (n_candidate_devices,)
        From :func:`device_rates` (times the number of devices alike, when one
        column stands for several).
    """
    total = float(rates.sum())
    return float(p_s.sum()) / total if total > 0 else 0.0


def load_window_bound_s(head_s: FloatArray, tail_s: FloatArray, p_s: FloatArray, rates: FloatArray) -> float:
    """The load bound on the operators with head ``>= r`` (or tail ``>= q``), shifted by both [3]_.

    For ``A = {j : head_j >= r}``: every ``j`` in ``A`` runs inside
    ``[r, makespan - min_A tail]``, so ``makespan >= r + sum_A p / sum s_d + min_A tail``;
    likewise for ``A = {j : tail_j >= q}`` with ``min_A head``. Taken over every
    threshold (one sort each).

    Parameters
    ----------
    head_s, tail_s, p_s : numpy.ndarray, shape (n_ops,)
    rates : numpy.ndarray
        From :func:`device_rates`.
    """
    total = float(rates.sum())
    if total <= 0 or not p_s.size:
        return 0.0
    best = 0.0
    for first, second in ((head_s, tail_s), (tail_s, head_s)):
        order = np.argsort(-first, kind="stable")  # largest threshold first: suffixes become prefixes
        work = np.cumsum(p_s[order]) / total
        other = np.minimum.accumulate(second[order])
        best = max(best, float((first[order] + work + other).max()))
    return best


def memory_cut_bound_s(
    graph: Hypergraph,
    head_s: FloatArray,
    tail_s: FloatArray,
    p_s: FloatArray,
    *,
    largest_budget_bytes: FloatArray,
    min_latency_s: float,
    min_s_per_byte: float,
) -> float:
    """A transfer forced on the paths of a part of the graph whose parameters fit on no single device.

    A weakly connected part ``K`` (operators linked by activation tensors) that runs
    on one device ``d`` holds every parameter it reads there, so when those bytes
    exceed the budget of every device ``K``'s operators may use, ``K`` spans two
    devices and (being connected) one of its edges ``u -> v`` crosses them:
    ``v`` starts no sooner than ``head(u) + p_u + c(u, v)`` and the step ends no
    sooner than that plus ``p_v + tail(v)``. Which edge is cut is not known, so the
    bound is the least of these over ``K``'s edges (and the largest over such parts).
    Valid only for plans within every memory budget.

    Parameters
    ----------
    graph : Hypergraph
    head_s, tail_s, p_s : numpy.ndarray, shape (n_ops,)
        From :func:`heads_and_tails` and the least operator times.
    largest_budget_bytes : numpy.ndarray, shape (n_ops,)
        The largest memory budget among the devices each operator may use.
    min_latency_s, min_s_per_byte : float
        The least latency and seconds per byte over ordered pairs of distinct
        candidate devices: ``c >= min_latency_s + bytes * min_s_per_byte``.

    Returns
    -------
    float
        0 when no part is forced onto two devices.
    """
    n = graph.n_ops
    owners = np.repeat(np.arange(n, dtype=np.int64), np.diff(graph.input_ptr))
    is_p = graph.tensor_kind[graph.input_tensors] == TENSOR_PARAMETER
    p_t, p_o = graph.input_tensors[is_p], owners[is_p]
    # cheap test first: if all the parameters fit on a device every operator may use, nothing is forced
    uniq = np.unique(p_t)
    if not uniq.size or float(graph.tensor_bytes[uniq].sum()) <= float(largest_budget_bytes.min()):
        return 0.0
    e_src, e_dst, e_tensor = graph.op_edges()
    label = _components(n, e_src, e_dst)
    n_comp = int(label.max()) + 1
    keys = np.unique(label[p_o] * graph.n_tensors + p_t)
    comp_param = np.bincount(
        keys // graph.n_tensors, weights=graph.tensor_bytes[keys % graph.n_tensors], minlength=n_comp
    )
    comp_budget = np.full(n_comp, np.inf)
    np.minimum.at(comp_budget, label, largest_budget_bytes)
    forced = comp_param > comp_budget
    if not forced.any() or not e_src.size:
        return 0.0
    cost = min_latency_s + graph.tensor_bytes[e_tensor] * min_s_per_byte
    path = head_s[e_src] + p_s[e_src] + cost + p_s[e_dst] + tail_s[e_dst]
    per_comp = np.full(n_comp, np.inf)
    np.minimum.at(per_comp, label[e_src], path)
    vals = per_comp[forced]
    vals = vals[np.isfinite(vals)]
    return float(vals.max()) if vals.size else 0.0


def _components(n: int, src: npt.NDArray[np.int64], dst: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
    """Weakly connected components of the operator graph: hook each edge's larger root under the smaller, then
    jump pointers to the roots, until no edge joins two roots (a few vectorised rounds, no per-edge Python)."""
    parent = np.arange(n, dtype=np.int64)
    while True:
        pu, pv = parent[src], parent[dst]
        join = pu != pv
        if not join.any():
            break
        np.minimum.at(parent, np.maximum(pu[join], pv[join]), np.minimum(pu[join], pv[join]))
        while True:
            nxt = parent[parent]
            if np.array_equal(nxt, parent):
                break
            parent = nxt
    _, label = np.unique(parent, return_inverse=True)
    return label.reshape(-1).astype(np.int64)


def lower_bounds(
    sim: SimulationContext,
    devices: npt.NDArray[np.int64],
    *,
    memory_budget_bytes: FloatArray,
    op_allowed_set: npt.NDArray[np.int64] | None = None,
    allowed_devices: npt.NDArray[np.bool_] | None = None,
    feasible: bool = True,
    link_tables: tuple[FloatArray, FloatArray] | None = None,
    tiers: bool = True,
) -> LowerBounds:
    """Every bound of the module docstring for one request, and the one that binds.

    Parameters
    ----------
    sim : SimulationContext
        The simulator's precomputation (graph, inventory, cost model) the plan was scored with.
    devices : numpy.ndarray of int64
        The devices a plan may use (the usable ones, plus any a given placement uses).
    memory_budget_bytes : numpy.ndarray, shape (n_devices,)
        Main-memory budget per device after headroom.
    op_allowed_set, allowed_devices : numpy.ndarray or None
        The device-type constraint (:class:`~partitioners.hardware.device_types.DeviceTypeConstraint`),
        ``None`` when the graph names no device types.
    feasible : bool
        Whether the plan is within every memory budget (the memory-cut bound holds only then).
    link_tables : tuple of numpy.ndarray, optional
        ``(latency_s, s_per_byte)`` per device pair of the inventory
        (:func:`~partitioners.costmodel.costs.link_time_tables`); needed for ``memory-cut``.
    tiers : bool
        True: bounds on the plan's makespan, level-3 tiers at their best. False:
        operators in main memory, bounds on the makespan of a plan scored before
        level 3 (``makespan_before_tiers_s``).

    Returns
    -------
    LowerBounds
    """
    devices = np.asarray(devices, dtype=np.int64)
    inv = sim.inventory
    # devices alike in profile, tiers and allowed operators give identical columns: price one of each
    parts = [
        sim.device_profile[devices][:, None].astype(np.float64),
        inv.tier_capacity_bytes[devices],
        inv.tier_bandwidth_bytes_per_s[devices],
        inv.device_memory_bandwidth_bytes_per_s[devices][:, None],
    ]
    if allowed_devices is not None:
        parts.append(allowed_devices[:, devices].T.astype(np.float64))
    _, first, kind = np.unique(np.column_stack(parts), axis=0, return_index=True, return_inverse=True)
    kind = kind.reshape(-1)
    reps = devices[first]
    count = np.bincount(kind, minlength=reps.shape[0]).astype(np.float64)
    floors = op_time_floors_s(sim.graph, inv, sim.cost_model, reps, tiers=tiers)
    # never above the times the simulator scores plans with
    floors = np.minimum(floors, sim.op_times_s[:, sim.device_profile[reps]])
    rows = None if allowed_devices is None else allowed_devices[:, reps]
    floors = allowed_floor_matrix(floors, op_allowed_set, rows)
    p = floors.min(axis=1)
    p = np.where(np.isfinite(p), p, 0.0)  # an operator no candidate device allows: counted as free
    head, tail = heads_and_tails(sim, p)
    rates = device_rates(floors, p) * count
    by = {
        "critical-path": critical_path_bound_s(head, tail, p),
        "load": load_bound_s(p, rates),
        "load-window": load_window_bound_s(head, tail, p, rates),
    }
    if feasible and link_tables is not None and 2 <= devices.shape[0] <= MEMORY_CUT_MAX_DEVICES:
        lat, per_byte = link_tables
        off = ~np.eye(devices.shape[0], dtype=bool)
        budget = np.full(reps.shape[0], -np.inf)
        np.maximum.at(budget, kind, np.asarray(memory_budget_bytes, dtype=np.float64)[devices])
        largest = np.where(np.isfinite(floors), budget[None, :], -np.inf).max(axis=1)
        by["memory-cut"] = memory_cut_bound_s(
            sim.graph,
            head,
            tail,
            p,
            largest_budget_bytes=largest,
            min_latency_s=float(lat[np.ix_(devices, devices)][off].min()),
            min_s_per_byte=float(per_byte[np.ix_(devices, devices)][off].min()),
        )
    best = max(by, key=lambda n: (by[n], -BOUND_NAMES.index(n)))
    return LowerBounds(lower_bound_s=by[best], binding=best, by_bound_s=by)
