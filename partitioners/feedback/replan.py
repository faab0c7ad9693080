"""Re-placement with few moves: keep operators where they are unless moving them pays.

A re-plan (after calibration, or after a load report says a device is slow or gone)
proposes a new placement; moving an operator has a price the cost model does not
see (weights to copy, caches to warm, a deployment to roll). A planner that has no
notion of "current" often proposes the same layout under other device names (branch
A on GPU 2 instead of GPU 0), so :func:`minimal_movement` first renames the
proposal's devices among *interchangeable* ones (same group, memory and calibrated
speed within 10%) to overlap the current placement most (a greedy maximum-weight
matching), keeping the renaming when it costs no more than the tolerance. It then
starts from the current placement, moves only the operators that must move
(their device is gone), and adds moves from the proposal in order of benefit (time
saved by that operator alone, largest first) until the simulated makespan is within
``tolerance_fraction`` of the whole gain. The prefix length is found by doubling
then bisection on the simulator, about ``2 log2(moves)`` simulations; makespan is
not monotone in the prefix, so the answer is the shortest prefix *found* that meets
the target and fits in memory, and the full proposal is always a fallback.

:func:`placement_result` turns any placement into a :class:`PlacementResult`
(level-3 memory tiers, transfers, final simulation) the same way :func:`place` does
for its winning candidate.

References
----------
.. [1] M. Mitzenmacher, E. Upfal, "Probability and Computing", 2005, ch. 1 (doubling
   search); the benefit order is the greedy of list scheduling (R. L. Graham, "Bounds
   on multiprocessing timing anomalies", SIAM J. Appl. Math. 17(2), 1969), whose
   anomalies are why every prefix is simulated rather than assumed monotone.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from partitioners.costmodel.costs import CostModel
from partitioners.costmodel.simulator import prepare_simulation, simulate
from partitioners.errors import InvalidInput
from partitioners.graph.hypergraph import Hypergraph
from partitioners.hardware.inventory import Inventory
from partitioners.placement import PlacementOptions, PlacementResult, evaluate_placement

__all__ = ["MovementResult", "minimal_movement", "placement_result", "RELABEL_SLACK", "SAME_SPEED_RATIO"]

#: Devices whose calibrated speeds (every op class) and memory bandwidths are within
#: this ratio, in the same group, count as interchangeable when relabelling a proposal.
SAME_SPEED_RATIO = 1.1
#: A relabelled proposal may be this much slower (relative) than the proposal itself,
#: or as slow as the tolerance allows, whichever is more.
RELABEL_SLACK = 0.01


def _interchangeable(inventory: Inventory, cost_model: CostModel) -> np.ndarray:
    """``(n, n)`` bool: same group, same memory size, speeds within :data:`SAME_SPEED_RATIO`."""
    mult = cost_model.multiplier_matrix(inventory)
    speed = np.log(inventory.device_peak_flops)[:, None] - np.log(mult)
    bw = np.log(inventory.device_memory_bandwidth_bytes_per_s)
    close = np.abs(speed[:, None, :] - speed[None, :, :]).max(axis=2) <= np.log(SAME_SPEED_RATIO)
    close &= np.abs(bw[:, None] - bw[None, :]) <= np.log(SAME_SPEED_RATIO)
    close &= inventory.device_group[:, None] == inventory.device_group[None, :]
    close &= inventory.device_memory_bytes[:, None] == inventory.device_memory_bytes[None, :]
    interchangeable: np.ndarray = close
    return interchangeable


def _relabel(proposed: np.ndarray, current: np.ndarray, swappable: np.ndarray) -> np.ndarray:
    """Rename the proposal's devices among interchangeable ones to keep most operators in place.

    Greedy maximum-weight matching on the overlap ``(proposed device, current device)``
    (heaviest pairs first; a 1/2-approximation of the optimal matching), then
    unmatched devices keep their own label when free, else take a free
    interchangeable one.
    """
    n = swappable.shape[0]
    here = current >= 0
    overlap = np.zeros((n, n), dtype=np.int64)
    np.add.at(overlap, (proposed[here], current[here]), 1)
    overlap[~swappable] = 0
    perm = np.full(n, -1, dtype=np.int64)
    taken = np.zeros(n, dtype=bool)
    pairs = np.argwhere(overlap > 0)
    weights = overlap[pairs[:, 0], pairs[:, 1]]
    for a, b in pairs[np.lexsort((pairs[:, 1], pairs[:, 0], -weights))].tolist():
        if perm[a] < 0 and not taken[b]:
            perm[a], taken[b] = b, True
    for a in range(n):
        if perm[a] >= 0:
            continue
        if not taken[a]:
            perm[a], taken[a] = a, True
            continue
        free = np.flatnonzero(swappable[a] & ~taken)
        b = int(free[0]) if free.size else a
        perm[a] = b
        taken[b] = True
    if np.unique(perm).size != n:  # not a permutation (no free twin): leave the proposal alone
        return proposed
    relabelled: np.ndarray = perm[proposed]
    return relabelled


@dataclass(frozen=True)
class MovementResult:
    """The placement :func:`minimal_movement` chose.

    Attributes
    ----------
    placement : numpy.ndarray of int64
    makespan_s : float
        Simulated makespan of ``placement``.
    kept_makespan_s : float
        Makespan with only the displaced operators moved.
    proposed_makespan_s : float
        Makespan of the full proposal.
    moved : int
        Operators whose device differs from the current placement (displaced included).
    displaced : int
        Operators whose device is gone.
    evaluations : int
        Simulations spent.
    """

    placement: np.ndarray
    makespan_s: float
    kept_makespan_s: float
    proposed_makespan_s: float
    moved: int
    displaced: int
    evaluations: int


def _fewest_passing(ok: Callable[[int], bool], m: int) -> int:
    """The smallest ``k`` in ``0..m`` with ``ok(k)``, or ``m`` (the whole proposal) when none below passes.

    Galloping (1, 2, 4, ...) then bisection: O(log k) calls to ``ok``, each a simulation,
    cheap for the small answers re-plans usually have. It treats ``ok`` as monotone
    (taking more of the best-first moves does not undo a pass), which holds closely
    rather than exactly: a ``k`` below ``m`` it returns did pass, just not always the
    smallest that would.
    """
    if ok(0):
        return 0
    lo, hi = 0, m  # ok(m) is the fallback: the full proposal
    k = 1
    while k < m:
        if ok(k):
            hi = k
            break
        lo = k
        k *= 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if ok(mid):
            hi = mid
        else:
            lo = mid
    return hi


def minimal_movement(
    graph: Hypergraph,
    inventory: Inventory,
    current: np.ndarray,
    proposed: np.ndarray,
    *,
    cost_model: CostModel | None = None,
    tolerance_fraction: float = 0.1,
    memory_budget_bytes: np.ndarray | None = None,
) -> MovementResult:
    """The proposal's moves, fewest first, until the makespan is within tolerance of the gain.

    Parameters
    ----------
    graph : Hypergraph
        The placed (expanded) graph.
    inventory : Inventory
        The inventory both placements index.
    current : numpy.ndarray of int64, shape (n_ops,)
        Where operators are now; ``-1`` for an operator whose device is gone.
    proposed : numpy.ndarray of int64, shape (n_ops,)
        The new plan.
    cost_model : CostModel, optional
        The (calibrated) model to judge by.
    tolerance_fraction : float
        Share of the gain ``kept - proposed`` that may be given up to move fewer
        operators (``0`` = the full gain, ``1`` = move only what must move).
    memory_budget_bytes : numpy.ndarray, optional
        Per-device budget; placements over it are not accepted (default: capacity).

    Returns
    -------
    MovementResult

    Raises
    ------
    InvalidInput
        Shapes differ, a device id is out of range, or the tolerance is outside [0, 1].
    """
    current = np.asarray(current, dtype=np.int64)
    proposed = np.asarray(proposed, dtype=np.int64)
    n = graph.n_ops
    if current.shape != (n,) or proposed.shape != (n,):
        raise InvalidInput("current and proposed placements need one device per operator", field="placement")
    if not 0.0 <= tolerance_fraction <= 1.0:
        raise InvalidInput("tolerance_fraction must be in [0, 1]", field="gain_tolerance_fraction")
    if (current >= inventory.n_devices).any() or (proposed < 0).any() or (proposed >= inventory.n_devices).any():
        raise InvalidInput("a placement names a device the inventory does not have", field="placement")
    cm = cost_model or CostModel()
    budget = inventory.device_memory_bytes if memory_budget_bytes is None else np.asarray(memory_budget_bytes)
    displaced = current < 0
    ctx = prepare_simulation(graph, inventory, cost_model=cm)
    kept_first_s = float(simulate(graph, inventory, np.where(displaced, proposed, current), context=ctx).makespan_s)
    original_s = float(simulate(graph, inventory, proposed, context=ctx).makespan_s)
    allowed_s = max(
        original_s + tolerance_fraction * max(kept_first_s - original_s, 0.0), original_s * (1 + RELABEL_SLACK)
    )
    relabeled = _relabel(proposed, current, _interchangeable(inventory, cm))
    if (relabeled != current).sum() < (proposed != current).sum():
        if float(simulate(graph, inventory, relabeled, context=ctx).makespan_s) <= allowed_s:
            proposed = relabeled
    base = np.where(displaced, proposed, current)
    movable = np.flatnonzero(~displaced & (current != proposed))
    times, profile = ctx.op_times_s, ctx.device_profile
    benefit = times[movable, profile[current[movable]]] - times[movable, profile[proposed[movable]]]
    order = movable[np.lexsort((movable, -benefit))]
    evaluations = 0
    cache: dict[int, tuple[float, bool]] = {}

    def placement_of(k: int) -> np.ndarray:
        pl = base.copy()
        pl[order[:k]] = proposed[order[:k]]
        return pl

    def evaluate(k: int) -> tuple[float, bool]:
        nonlocal evaluations
        if k not in cache:
            pl = placement_of(k)
            sim = simulate(graph, inventory, pl, context=ctx)
            used = np.unique(pl)
            assert sim.peak_memory_bytes is not None  # the memory sweep runs by default
            fits = bool((sim.peak_memory_bytes[used] <= budget[used]).all())
            cache[k] = (float(sim.makespan_s), fits)
            evaluations += 1
        return cache[k]

    m = int(order.size)
    kept_s, _kept_fits = evaluate(0)
    full_s, _ = evaluate(m)
    target = full_s + tolerance_fraction * max(kept_s - full_s, 0.0)

    def ok(k: int) -> bool:
        s, fits = evaluate(k)
        return fits and s <= target * (1 + 1e-12)

    best = _fewest_passing(ok, m)
    chosen = placement_of(best)
    return MovementResult(
        placement=chosen,
        makespan_s=evaluate(best)[0],
        kept_makespan_s=kept_s,
        proposed_makespan_s=full_s,
        moved=int((chosen != current).sum()),
        displaced=int(displaced.sum()),
        evaluations=evaluations,
    )


def placement_result(
    graph: Hypergraph,
    inventory: Inventory,
    options: PlacementOptions,
    placement: np.ndarray,
    *,
    cost_model: CostModel | None = None,
    name: str = "minimal-movement",
) -> PlacementResult:
    """A :class:`~partitioners.placement.PlacementResult` for a given placement.

    Scores ``placement`` (of the expanded graph) as the only candidate and finishes
    it the way :func:`~partitioners.placement.place` finishes its winner: level-3
    tiers, final simulation, transfers, feasibility
    (:func:`~partitioners.placement.evaluate_placement`).

    Parameters
    ----------
    graph : Hypergraph
        The submitted (forward, one micro-batch) graph; ``options`` expands it.
    inventory : Inventory
    options : PlacementOptions
        The options of the plan being re-placed.
    placement : numpy.ndarray of int64, shape (n_ops,)
        Device of every operator of the *expanded* graph.
    cost_model : CostModel, optional
        The (calibrated) model to price it with.
    name : str
        The strategy name the result reports.

    Returns
    -------
    PlacementResult

    Raises
    ------
    InvalidInput
        ``placement`` does not have one device per expanded operator.
    Infeasible
        The placement does not fit in memory (unless ``options.allow_infeasible``).
    """
    return evaluate_placement(graph, inventory, placement, options, cost_model=cost_model, name=name)
