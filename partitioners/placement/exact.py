"""Exact placement and order for small graphs: a constraint-programming model solved by OR-Tools CP-SAT.

``strategy="exact"`` places and orders every operator by solving the scheduling
problem the simulator poses, relaxed only where noted, with CP-SAT [1]_ (interval
variables, one no-overlap constraint per device [2]_):

* **Assignment.** Operator ``j`` runs on exactly one usable device its device types
  allow: one optional interval per such device, sharing ``j``'s start and end.
* **One operator at a time per device.** ``AddNoOverlap`` over each device's intervals.
* **Transfers on cut edges.** For every producer -> consumer edge ``u -> v`` of tensor
  ``t``: ``start(v) >= end(u) + c1(t) * [u, v on different devices] + (c2(t) - c1(t)) *
  [u, v in different node groups]``, with ``c1`` the cheapest transfer of ``t``
  between two distinct usable devices and ``c2`` the cheapest between two groups
  (the cost model's link times, :func:`~partitioners.costmodel.costs.link_time_tables`).
  Link-port contention is not modelled (a relaxation: it only delays transfers).
* **Memory.** Every parameter a device's operators read is resident there; their
  bytes stay within the device's budget. Live activations are not modelled (the
  returned plan is simulated and given its feasibility verdict like any other).
* **Objective.** The makespan, the latest operator end.

CP-SAT works on integers (the one place besides the METIS adapter where costs become
integers): times are in ticks of ``tick_s = hint makespan / 2^20``,
every duration and transfer rounded *down*. Rounded down, any schedule the simulator
can produce is a solution of the model, so the model's optimum, and the bound
CP-SAT proves when the time limit stops it, is a lower bound on the simulated
makespan of every placement (main-memory operator times; level 3's faster tiers
can beat it, which is why :mod:`partitioners.placement.bounds` counts the exact
bound only where no tier is faster). The rounding costs at most one tick per
operator along a path: under 0.04% at 400 operators.

The solver starts from a heuristic plan (``hint``: the best of HEFT and the
one-device plan, its simulated start times as the hint), so it always has a
solution to improve. The engine simulates the placement it returns with the real
simulator, with the solver's start order (:attr:`ExactOutcome.priority`) and with
critical-path order as priorities: the plan's makespan is the simulator's, which
can exceed the model's objective by contention.

Determinism: a fixed ``random_seed`` and one search worker, so every run follows
the same search; a proven optimum (``status="optimal"``) is the same answer every
time. The time limit is CP-SAT's own wall-clock limit (``max_time_in_seconds``):
when it stops the search first, a faster or less loaded machine gets further along
that search, so ``status="feasible"`` answers can differ between runs (``bound_s``
says how far from optimal they may be). CP-SAT's deterministic time, which would
make them reproducible, tracks wall time too loosely to keep a limit within a
second (in one measurement, 0.24 units per second on a 30-operator synthetic graph
and 0.03 on a 300-operator one). One worker, not two: the service's machines have two cores
shared by concurrent plans; two workers improved the 300-operator case by 2.5% in
5 s and gave different plans run to run. CP-SAT reads its clock itself; this
module reads none.

References
----------
.. [1] L. Perron, F. Didier, "CP-SAT", Google OR-Tools v9, https://developers.google.com/optimization (2024).
.. [2] P. Laborie, J. Rogerie, P. Shaw, P. Vilím, "IBM ILOG CP optimizer for scheduling",
   Constraints 23(2), 2018 (optional interval variables and no-overlap).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
from ortools.sat.python import cp_model

from partitioners.graph.hypergraph import TENSOR_PARAMETER
from partitioners.placement.context import PlacementContext

__all__ = ["EXACT_MAX_OPS", "EXACT_TICKS", "NUM_WORKERS", "ExactOutcome", "exact_schedule"]

#: Largest (expanded) graph ``strategy="exact"`` accepts. Measured on synthetic DAGs on 8 H100
#: (5 s limit, one worker, the ``auto`` plan as hint): at 300 and 400 operators CP-SAT
#: confirms the hint and improves it (400: 0.9624 -> 0.9595 ms in the model); at 600 it
#: ends without a solution, not even the hint's.
EXACT_MAX_OPS = 400
#: Ticks in the hint's makespan (the integer time resolution of the model).
EXACT_TICKS = 1 << 20
#: CP-SAT search workers (see the module docstring).
NUM_WORKERS = 1


@dataclass(frozen=True, eq=False)
class ExactOutcome:
    """What the CP-SAT model found.

    Attributes
    ----------
    placement : numpy.ndarray of int64, shape (n_ops,)
        Device of every operator (the hint's when the solver found nothing better).
    priority : numpy.ndarray of float64, shape (n_ops,)
        Simulator priorities: earlier start in the solver's schedule runs first.
    status : str
        ``"optimal"`` (the model's optimum, proven), ``"feasible"`` (best found
        when the time limit ended), ``"infeasible"`` (no placement keeps the
        parameters within the budgets) or ``"unknown"`` (nothing found in time:
        the hint is returned).
    objective_s : float
        The model's makespan of the returned schedule (rounded-down ticks).
    bound_s : float
        The lower bound CP-SAT proved on the model's makespan.
    solve_time_s : float
        Wall time CP-SAT reports for the search.
    tick_s : float
        The model's time unit.
    """

    placement: npt.NDArray[np.int64]
    priority: npt.NDArray[np.float64]
    status: str
    objective_s: float
    bound_s: float
    solve_time_s: float
    tick_s: float


def _cheapest_transfers(ctx: PlacementContext, tensor_bytes: npt.NDArray[np.float64]) -> tuple[np.ndarray, np.ndarray]:
    """Per edge, the cheapest transfer between two distinct usable devices, and between two groups."""
    dev = ctx.devices
    lat, per_byte = ctx.link_tables
    lat = lat[np.ix_(dev, dev)]
    per_byte = per_byte[np.ix_(dev, dev)]
    grp = ctx.inventory.device_group[dev]
    distinct = ~np.eye(dev.shape[0], dtype=bool)
    cross = grp[:, None] != grp[None, :]
    c1 = np.zeros_like(tensor_bytes)
    c2 = np.zeros_like(tensor_bytes)
    if distinct.any():
        c1 = lat[distinct].min() + tensor_bytes * per_byte[distinct].min()
    if cross.any():
        c2 = lat[cross].min() + tensor_bytes * per_byte[cross].min()
    return c1, np.maximum(c2, c1)


def exact_schedule(
    ctx: PlacementContext,
    hint_placement: npt.NDArray[np.int64],
    hint_start_s: npt.NDArray[np.float64],
    hint_makespan_s: float,
    *,
    time_limit_s: float,
    seed: int = 0,
    lower_bound_s: float = 0.0,
) -> ExactOutcome:
    """Solve assignment and order of ``ctx``'s graph with CP-SAT (module docstring).

    Parameters
    ----------
    ctx : PlacementContext
        The prepared request (graph, usable devices, operator times, device types, budgets).
    hint_placement : numpy.ndarray of int64, shape (n_ops,)
        A heuristic plan to start from.
    hint_start_s : numpy.ndarray of float64, shape (n_ops,)
        Its simulated start times.
    hint_makespan_s : float
        Its simulated makespan (sets the tick).
    time_limit_s : float
        CP-SAT's wall-clock limit.
    seed : int
        CP-SAT's ``random_seed``.
    lower_bound_s : float
        A lower bound on the makespan of every plan (:mod:`partitioners.placement.bounds`),
        given to the model as ``makespan >= floor(bound / tick) - n_ops`` (less the
        most the rounding can take off a path or a device's load), so the solver
        can stop as soon as it meets it.

    Returns
    -------
    ExactOutcome
    """
    g = ctx.graph
    n = g.n_ops
    dev = ctx.devices
    n_dev = dev.shape[0]
    times = ctx.op_times_s[:, dev]
    allowed = np.ones((n, n_dev), dtype=bool)
    if ctx.constraint is not None:
        allowed = ctx.constraint.allowed[ctx.constraint.op_allowed_set][:, dev]
    serial_s = float(np.where(allowed, times, 0.0).max(axis=1).sum())
    tick = max(hint_makespan_s, 1e-12) / EXACT_TICKS
    dur = np.floor(times / tick).astype(np.int64)
    e_src, e_dst, e_tensor = ctx.edge_src, ctx.edge_dst, ctx.edge_tensor
    c1_s, c2_s = _cheapest_transfers(ctx, g.tensor_bytes[e_tensor].astype(np.float64))
    c1 = np.floor(c1_s / tick).astype(np.int64)
    c2 = np.floor(c2_s / tick).astype(np.int64)
    horizon = int(np.ceil((serial_s + float(c2_s.sum())) / tick)) + 1
    horizon = max(horizon, int(np.floor(hint_makespan_s / tick)) + 1)

    m = cp_model.CpModel()
    start = [m.new_int_var(0, horizon, f"s{j}") for j in range(n)]
    end = [m.new_int_var(0, horizon, f"e{j}") for j in range(n)]
    x: list[dict[int, cp_model.IntVar]] = [{} for _ in range(n)]
    per_device: list[list[cp_model.IntervalVar]] = [[] for _ in range(n_dev)]
    for j in range(n):
        cols = np.flatnonzero(allowed[j]).tolist()
        for k in cols:
            lit = m.new_bool_var(f"x{j}_{k}")
            x[j][k] = lit
            d = int(dur[j, k])
            per_device[k].append(m.new_optional_fixed_size_interval_var(start[j], d, lit, f"i{j}_{k}"))
            m.add(end[j] == start[j] + d).only_enforce_if(lit)
        m.add_exactly_one(x[j].values())
    for k in range(n_dev):
        if len(per_device[k]) > 1:
            m.add_no_overlap(per_device[k])
    grp = ctx.inventory.device_group[dev]
    groups = np.unique(grp).tolist()
    col_of = np.full(ctx.inventory.n_devices, -1, dtype=np.int64)
    col_of[dev] = np.arange(n_dev)
    hint_col = col_of[np.asarray(hint_placement, dtype=np.int64)]
    hints: list[tuple[cp_model.IntVar, int]] = []
    for e in range(e_src.shape[0]):
        u, v = int(e_src[e]), int(e_dst[e])
        if c1[e] <= 0 or n_dev == 1:
            m.add(start[v] >= end[u])
            continue
        diff = m.new_bool_var(f"cut{e}")
        hints.append((diff, int(hint_col[u] != hint_col[v])))
        for k in set(x[u]) | set(x[v]):
            xu = x[u].get(k, 0)
            xv = x[v].get(k, 0)
            m.add(diff >= xu - xv)
        delay = int(c1[e]) * diff
        extra = int(c2[e] - c1[e])
        if len(groups) > 1 and extra > 0:
            gdiff = m.new_bool_var(f"gcut{e}")
            hints.append((gdiff, int(grp[hint_col[u]] != grp[hint_col[v]])))
            for gi in groups:
                ku = [x[u][k] for k in x[u] if grp[k] == gi]
                kv = [x[v][k] for k in x[v] if grp[k] == gi]
                m.add(gdiff >= sum(ku) - sum(kv))
            delay = delay + extra * gdiff
        m.add(start[v] >= end[u] + delay)
    _memory_constraints(ctx, m, x, allowed)
    makespan = m.new_int_var(0, horizon, "makespan")
    m.add_max_equality(makespan, end)
    m.add(makespan >= max(0, min(int(np.floor(lower_bound_s / tick)) - n, horizon)))
    m.minimize(makespan)

    # the hint, every variable of it: its simulated schedule rounded down is a solution
    hint_ticks = np.floor(np.asarray(hint_start_s, dtype=np.float64) / tick).astype(np.int64)
    hint_end = hint_ticks + dur[np.arange(n), np.maximum(hint_col, 0)]
    for j in range(n):
        for k, lit in x[j].items():
            m.add_hint(lit, bool(k == hint_col[j]))
        m.add_hint(start[j], int(hint_ticks[j]))
        m.add_hint(end[j], int(hint_end[j]))
    for var, value in hints:
        m.add_hint(var, value)
    m.add_hint(makespan, int(hint_end.max()))

    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = float(time_limit_s)
    solver.parameters.num_workers = NUM_WORKERS
    solver.parameters.random_seed = int(seed)
    code = solver.solve(m)
    status = {cp_model.OPTIMAL: "optimal", cp_model.FEASIBLE: "feasible", cp_model.INFEASIBLE: "infeasible"}.get(
        code, "unknown"
    )
    if status in ("optimal", "feasible"):
        placement = np.array(
            [dev[next(k for k, lit in x[j].items() if solver.value(lit))] for j in range(n)], dtype=np.int64
        )
        starts = np.array([solver.value(start[j]) for j in range(n)], dtype=np.float64)
        objective_s = float(solver.objective_value) * tick
        bound_s = float(solver.best_objective_bound) * tick
    else:
        placement = np.asarray(hint_placement, dtype=np.int64).copy()
        starts = np.asarray(hint_start_s, dtype=np.float64)
        objective_s = float("nan")
        bound_s = float(solver.best_objective_bound) * tick if status == "unknown" else float("inf")
    order = np.lexsort((np.arange(n), starts))
    priority = np.empty(n, dtype=np.float64)
    priority[order] = np.arange(n, 0, -1, dtype=np.float64)
    return ExactOutcome(
        placement=placement,
        priority=priority,
        status=status,
        objective_s=objective_s,
        bound_s=max(bound_s, 0.0),
        solve_time_s=float(solver.wall_time),
        tick_s=tick,
    )


def _memory_constraints(
    ctx: PlacementContext, m: cp_model.CpModel, x: list[dict[int, cp_model.IntVar]], allowed: np.ndarray
) -> None:
    """Parameters resident where read stay within each device's budget (skipped when they fit anywhere)."""
    g = ctx.graph
    owners = np.repeat(np.arange(g.n_ops, dtype=np.int64), np.diff(g.input_ptr))
    is_p = g.tensor_kind[g.input_tensors] == TENSOR_PARAMETER
    p_t, p_o = g.input_tensors[is_p], owners[is_p]
    params = np.unique(p_t)
    budget = ctx.memory_budget_bytes[ctx.devices]
    if not params.size or float(g.tensor_bytes[params].sum()) <= float(budget.min()):
        return
    for k in range(ctx.devices.shape[0]):
        terms = []
        for t in params.tolist():
            readers = [int(o) for o in p_o[p_t == t].tolist() if allowed[o, k]]
            if not readers:
                continue
            z = m.new_bool_var(f"z{t}_{k}")
            for o in readers:
                m.add_implication(x[o][k], z)
            terms.append(int(g.tensor_bytes[t]) * z)
        if terms:
            m.add(sum(terms) <= int(budget[k]))
