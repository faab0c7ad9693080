"""Simulator-guided refinement: move operators off the device that finishes last.

Partitioners optimise proxies (cut, balance); the makespan depends on when work
becomes ready. This pass optimises the makespan itself, the way a
Kernighan-Lin / Fiduccia-Mattheyses pass optimises the cut [1]_ [2]_, but with the
event-driven simulator as the gain function: each step proposes one batch move
from the *critical device* (the one whose last operator ends last) to the
least-busy device, scores it with one simulation, and keeps it only if the plan
improves. Proposals, most promising first:

* *boundary batch*: operators on the critical device that read from or feed the
  target device (moving them removes transfers), earliest first, up to half the
  busy-time gap;
* *micro-batch move*: every operator of one micro-batch on the critical device
  (the replica-per-device idea applied locally);
* *interleave*: every other operator of the critical device in topological-level
  order, which splits a depth slice that would otherwise run alone.

Operators restricted to device types the target does not have are left out of
every proposal. A rejected proposal halves the step for that device pair; a pair
rejected three times is not proposed again. The number of simulations is the caller's budget, so
the pass is deterministic and bounded.

References
----------
.. [1] B. W. Kernighan, S. Lin, "An efficient heuristic procedure for partitioning
   graphs", Bell System Technical Journal 49(2), 1970.
.. [2] C. M. Fiduccia, R. M. Mattheyses, "A linear-time heuristic for improving
   network partitions", DAC 1982.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from partitioners.costmodel.simulator import SimulationResult
from partitioners.graph.hypergraph import Hypergraph

__all__ = ["RefineOutcome", "refine_placement"]


class RefineOutcome:
    """What :func:`refine_placement` did.

    Attributes
    ----------
    placement : numpy.ndarray of int64
        The best placement found (the input when nothing improved).
    key : tuple
        Its score key (smaller is better).
    sim : SimulationResult
    accepted, tried : int
        Moves kept and simulations spent.
    """

    __slots__ = ("accepted", "key", "placement", "sim", "tried")

    def __init__(
        self, placement: np.ndarray, key: tuple[object, ...], sim: SimulationResult, accepted: int, tried: int
    ) -> None:
        self.placement = placement
        self.key = key
        self.sim = sim
        self.accepted = accepted
        self.tried = tried


def _proposals(
    graph: Hypergraph,
    placement: np.ndarray,
    sim: SimulationResult,
    times_s: np.ndarray,
    levels: np.ndarray,
    op_micro_batch: np.ndarray | None,
    src: np.ndarray,
    dst: np.ndarray,
    hi: int,
    lo: int,
    fraction: float,
    movable: np.ndarray | None = None,
) -> list[tuple[str, np.ndarray]]:
    """Batch moves from ``hi`` to ``lo``, most promising first; ``movable`` (per operator,
    optional) says which operators may run on ``lo``."""
    on_hi = placement == hi
    gap = float(sim.device_busy_s[hi] - sim.device_busy_s[lo])
    allowance = max(gap, 0.0) * fraction
    t_lo = times_s[:, lo]
    out: list[tuple[str, np.ndarray]] = []

    def take(ops: np.ndarray) -> np.ndarray:
        if movable is not None:
            ops = ops[movable[ops]]
        if ops.shape[0] == 0 or allowance <= 0:
            return ops[:0]
        cum = np.cumsum(t_lo[ops])
        k = int(np.searchsorted(cum, allowance, side="right"))
        return ops[: max(k, 1)]

    # boundary batch
    touch = np.zeros(graph.n_ops, dtype=bool)
    e1 = on_hi[src] & (placement[dst] == lo)
    touch[src[e1]] = True
    e2 = on_hi[dst] & (placement[src] == lo)
    touch[dst[e2]] = True
    boundary = np.flatnonzero(touch)
    if boundary.shape[0]:
        boundary = boundary[np.lexsort((boundary, sim.op_start_s[boundary]))]
        out.append(("boundary", take(boundary)))
    # micro-batch move
    if op_micro_batch is not None and op_micro_batch.max() > 0:
        mbs = op_micro_batch[on_hi]
        mbs = mbs[mbs >= 0]
        if mbs.shape[0]:
            counts = np.bincount(mbs)
            mb = int(np.argmax(counts))
            ops = np.flatnonzero(on_hi & (op_micro_batch == mb))
            if movable is not None:
                ops = ops[movable[ops]]
            if t_lo[ops].sum() <= max(gap, 0.0):
                out.append(("micro-batch", ops))
    # interleave: alternate levels of the critical device
    ops_hi = np.flatnonzero(on_hi)
    if ops_hi.shape[0] > 1:
        by_level = ops_hi[np.lexsort((ops_hi, levels[ops_hi]))]
        window = by_level[1::2]
        out.append(("interleave", take(window)))
    return [(name, ops) for name, ops in out if ops.shape[0]]


def refine_placement(
    graph: Hypergraph,
    placement: np.ndarray,
    sim: SimulationResult,
    times_s: np.ndarray,
    *,
    devices: np.ndarray,
    score: Callable[[np.ndarray], tuple[tuple[object, ...], SimulationResult]],
    base_key: tuple[object, ...],
    max_steps: int,
    levels: np.ndarray,
    op_micro_batch: np.ndarray | None = None,
    op_allowed_set: np.ndarray | None = None,
    allowed_devices: np.ndarray | None = None,
) -> RefineOutcome:
    """Improve ``placement`` by batch moves scored with the simulator.

    Parameters
    ----------
    graph : Hypergraph
    placement : numpy.ndarray of int64, shape (n_ops,)
    sim : SimulationResult
        Simulation of ``placement`` (timeline recorded).
    times_s : numpy.ndarray, shape (n_ops, n_devices)
        Operator times per device.
    devices : numpy.ndarray of int64
        Devices moves may target.
    score : callable
        ``score(placement) -> (key, sim)``; smaller keys are better. One call = one
        simulation of the caller's budget.
    base_key : tuple
        Key of ``placement``.
    max_steps : int
        Simulations this pass may spend.
    levels : numpy.ndarray of int64
        Topological level of every operator.
    op_micro_batch : numpy.ndarray of int64, optional
        Micro-batch of every operator (enables micro-batch moves).
    op_allowed_set : numpy.ndarray of int64, shape (n_ops,), optional
        Row of ``allowed_devices`` of every operator.
    allowed_devices : numpy.ndarray of bool, shape (n_sets, n_devices), optional
        Devices each row may run on (the graph's ``device_types``, see
        :class:`~partitioners.hardware.device_types.DeviceTypeConstraint`); a move only takes
        operators the target device admits, so every simulation spent is on an
        allowed placement.

    Returns
    -------
    RefineOutcome
    """
    best = np.asarray(placement, dtype=np.int64).copy()
    best_key, best_sim = base_key, sim
    src, dst, _ = graph.op_edges()
    devices = np.asarray(devices, dtype=np.int64)
    fraction: dict[tuple[int, int], float] = {}
    strikes: dict[tuple[int, int], int] = {}
    accepted = tried = 0
    while tried < max_steps:
        # the critical device: the one whose last operator ends last
        last_end = np.full(best_sim.device_busy_s.shape[0], -1.0)
        np.maximum.at(last_end, best, best_sim.op_end_s)
        hi = int(np.argmax(last_end))
        lows = [int(d) for d in devices[np.lexsort((devices, best_sim.device_busy_s[devices]))] if d != hi]
        lows = [d for d in lows if strikes.get((hi, d), 0) < 3]
        if not lows:
            break
        lo = lows[0]
        pair = (hi, lo)
        frac = fraction.get(pair, 0.5)
        movable = None
        if op_allowed_set is not None and allowed_devices is not None:
            movable = allowed_devices[op_allowed_set, lo]
        props = _proposals(graph, best, best_sim, times_s, levels, op_micro_batch, src, dst, hi, lo, frac, movable)
        if not props:
            strikes[pair] = 3
            continue
        improved = False
        for _, ops in props:
            if tried >= max_steps:
                break
            trial = best.copy()
            trial[ops] = lo
            key, trial_sim = score(trial)
            tried += 1
            if key < best_key:
                best, best_key, best_sim = trial, key, trial_sim
                accepted += 1
                improved = True
                break
        if not improved:
            fraction[pair] = frac * 0.5
            strikes[pair] = strikes.get(pair, 0) + 1
    return RefineOutcome(best, best_key, best_sim, accepted, tried)
