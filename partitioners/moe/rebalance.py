"""Online Mixture-of-Experts expert re-placement: replicate hot experts, pack, move little.

Runtimes report how many tokens each logical expert of each MoE layer received;
this module answers with a new expert-to-GPU placement in the vocabulary of
DeepSeek's EPLB [1]_: ``physical_to_logical[layer, slot]`` names the logical
expert held in each physical slot (``-1``: empty), slot ``s`` lives on GPU
``s // slots_per_gpu`` and GPU ``g`` on node ``g // gpus_per_node``;
``logical_to_physical`` lists the slots of each expert and ``logical_count`` its
number of replicas. Tokens of an expert are assumed split evenly over its
replicas, so a GPU's load is the sum over its slots of ``load / logical_count``
and the balance of a layer is its maximum GPU load over its mean GPU load.

Why not just EPLB. EPLB balances well but recomputes everything on every call,
so it rewrites most slots even when the load has not changed, may put two copies
of one expert on one GPU, and costs 0.25-1.4 s per call for DeepSeek-V3 shapes.
Here EPLB's steps are vectorised across layers and made incremental:

1. **Replica counts** (:func:`replica_counts`) minimise the largest per-replica
   load under "at most one copy per GPU" and "no more copies than slots" by
   water-filling: bisection on the per-replica cap ``x`` (every expert needs
   ``ceil(load / x)`` copies), then the few slots left go to the experts with the
   largest per-replica load. This is the apportionment that greedy
   largest-load-per-replica (EPLB's ``replicate_experts``) computes one slot at a
   time, done in a few dozen array passes for all layers at once.
2. **Packing** replicas onto GPUs is longest-processing-time first (Graham [2]_)
   with a cardinality limit (``slots_per_gpu``), done in rounds: in each round
   the next ``num_gpus`` largest replicas go one per GPU, largest to the
   lightest GPU, so a round is one sort for every layer; a copy that would
   land on a GPU already holding its expert trades GPUs with its nearest
   neighbour in the round. Pairwise swaps between the most loaded GPU and the
   lightest ones then close the remaining gap (the refinement step of
   Karmarkar-Karp style number partitioning [3]_). A first plan is then repaired
   as in step 3 until that repair keeps it (:func:`_settled`), so the next report
   with the same load does not move it.
3. **Incremental re-placement** when a current placement is given. A layer is
   left alone unless it is above the balance target and more than
   ``min_improvement`` plus the gap that sampling noise alone explains above the
   lower bound (loads are token counts; a plan fitted to one report is no better
   on the next, as ``bench/moe.py`` shows), so resampled load moves nothing.
   Other layers are repaired in place towards a goal: the balance target
   (``balance_target``, 1.015), not a fresh plan's optimum, whose last
   thousandths cost several times the copies; a layer that changes only because
   copies were lost on unavailable GPUs or slots are empty aims at what would
   keep it. Experts that lost every copy come first, one copy each over a copy
   of an expert that has others (chosen so that expert's busiest host stays
   light); empty slots (a GPU back from failure) each take one copy; experts
   whose per-replica load is well above the water-filled counts' take slots from
   experts with copies to spare; then the hottest GPUs shed load by swaps with
   light GPUs or by re-assigning one of their copies (one write instead of two),
   ranked by copies written per gain, cross-node copies counting more, until the
   goal or the copy budget (``move_budget`` for balance, on top of the lost
   experts; ``max_replicas_moved`` on everything). Layers that lost copies on
   unavailable GPUs or have empty slots are repaired first, under their own
   ``repair_budget`` (a failure writes at most its lost experts plus that budget),
   and a returning GPU's layers stop once its slots are filled. Only a layer the repair leaves
   well short of its goal gets a fresh plan, relabelled so each of its GPUs goes
   to the physical GPU already holding most of its experts and kept experts stay
   in their slots. :attr:`RebalanceResult.bound_by` says what stopped the moves.
4. **Grouped experts** (``num_expert_groups``): EPLB's hierarchical policy
   (groups packed onto nodes, replicas inside nodes) is computed too and kept
   only for layers where it balances within ``min_improvement`` of the global
   plan, so one group per node no longer costs balance.

The steps live in their own modules: replica counts in :mod:`partitioners.moe.replicas`,
the placement state and packing in :mod:`partitioners.moe.packing`, the repair and
refinement moves in :mod:`partitioners.moe.moves`, relabelling a fresh plan onto the
GPUs in service in :mod:`partitioners.moe.relabel`; this module validates, decides
per layer and assembles the answer.

Work is vectorised across layers: the Python loops run over packing rounds,
refinement iterations and copies to add; the few per-layer loops only visit
layers with a placement conflict or copies to add.

No clocks here: the caller times the call (the service reports it).

References
----------
.. [1] DeepSeek-AI, "Expert Parallelism Load Balancer (EPLB)",
   https://github.com/deepseek-ai/EPLB (``rebalance_experts``, 2025).
.. [2] R. L. Graham, "Bounds on multiprocessing timing anomalies", SIAM J. Appl.
   Math. 17(2), 1969 (LPT is within 4/3 - 1/(3m) of optimal).
.. [3] N. Karmarkar, R. M. Karp, "The differencing method of set partitioning",
   UC Berkeley tech. report UCB/CSD 82/113, 1982.
.. [4] DeepSeek-AI, "DeepSeek-V3 Technical Report", arXiv:2412.19437, 2024
   (redundant experts, node-limited routing with expert groups).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from dataclasses import field as dataclass_field
from functools import cached_property
from typing import Any

import numpy as np
import numpy.typing as npt

from partitioners.errors import Infeasible, InvalidInput
from partitioners.moe.moves import MoveContext, OriginalPlacement, adjust_counts, fill_empty_slots, swap_refine
from partitioners.moe.packing import PlacementState, balance_ratio, count_rows, pack_rounds
from partitioners.moe.relabel import gpu_in_node, relabel
from partitioners.moe.replicas import bound_ratio, water_fill

__all__ = [
    "DEFAULT_BALANCE_TARGET",
    "eplb_maps",
    "BalanceStats",
    "Migrations",
    "RebalanceResult",
    "balance_stats",
    "lower_bound",
    "rebalance",
    "replica_counts",
]

# The largest cluster and options accepted (the HTTP schema states the same bounds); counts
# elsewhere (GPUs in a request, expert groups) are capped at MAX_COUNT.
MAX_NODES = 4096
MAX_PER_NODE = 1024  # GPUs per node, and expert slots per GPU
MAX_COUNT = 10**6
MAX_OPTION = 2**40  # max_replicas_moved, expert_bytes
# Iteration caps of the swap refinement (up to moe_moves._HOT_PER_ITER moves per layer per iteration).
_FRESH_SWAP_ITERS = 48
_INCREMENTAL_SWAP_ITERS = 64
# Stop refining a fresh plan once max/mean is this close to the lower bound.
_FRESH_TOLERANCE = 2e-3
# A fresh layer the swaps leave more than this above the bound (max/mean) gets a
# polish: every GPU as a swap partner (see moves.swap_refine). Half the default
# min_improvement: the next report's repair cannot then gain enough to move, and the
# layers within it skip a pass that costs more than the rest of the plan.
_FRESH_POLISH_SLACK = 5e-3
# Rounds of repair on a fresh plan before it is returned (see _settled); one is almost always enough.
_SETTLE_ROUNDS = 3
# In incremental mode, an expert gains copies when its per-replica load is more
# than this fraction above the fresh plan's largest per-replica load. Layers that
# lost copies (a failed GPU) get theirs back by count and keep a slack, so noise
# on hot experts does not add count changes; drifted layers use none.
_COUNT_SLACK = 0.05
# The sampling-noise margin never exceeds this, so loads that are not raw counts
# (fractions, smoothed rates) still get rebalanced when clearly off.
_NOISE_MARGIN_CAP = 0.05
# A repaired layer aims at the fresh plan's max/mean plus this fraction of the threshold
# (balance against copies written: 0.25 writes ~2% fewer copies on drift, ends ~0.4% less balanced).
_GOAL_FRACTION = 0.15
# A layer the repair leaves short of its goal takes a fresh plan only when that is better by more than this.
_REPLAN_MARGIN = 0.005
# The max/mean a repaired layer aims at unless the caller says otherwise: moves stop there
# rather than at a fresh plan's optimum (each move past it buys little balance per copy).
DEFAULT_BALANCE_TARGET = 1.015


@dataclass(frozen=True)
class BalanceStats:
    """Max over mean GPU load, per layer and summarised.

    Attributes
    ----------
    per_layer : numpy.ndarray
        ``(num_layers,)`` float64, never below 1; 1.0 is perfect balance (a layer with no
        load counts as 1.0). ``inf`` for a layer whose placement holds no copy of an
        expert that receives load: it cannot serve those tokens (MoE here is dropless),
        so no finite max/mean describes it.
    mean, worst : float
        Mean and maximum of ``per_layer`` (``inf`` when any layer is).
    unhosted_layer, unhosted_expert : numpy.ndarray
        ``(n,)`` int64, by layer then expert: the experts that receive load but have no
        copy (empty for any placement :func:`rebalance` returns).
    """

    per_layer: npt.NDArray[np.float64]
    mean: float
    worst: float
    unhosted_layer: npt.NDArray[np.int64] = dataclass_field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    unhosted_expert: npt.NDArray[np.int64] = dataclass_field(default_factory=lambda: np.zeros(0, dtype=np.int64))

    @classmethod
    def of(cls, per_layer: np.ndarray, unhosted: np.ndarray | None = None) -> BalanceStats:
        """Summarise ``per_layer``; ``unhosted`` is the ``(num_layers, num_experts)`` mask of
        loaded experts without a copy (their layers read ``inf``)."""
        per_layer = np.array(per_layer, dtype=np.float64)
        if unhosted is None:
            unhosted = np.zeros((per_layer.size, 0), dtype=bool)
        per_layer[unhosted.any(axis=1)] = np.inf
        layer, expert = np.nonzero(unhosted)
        return cls(
            per_layer, float(per_layer.mean()), float(per_layer.max()), layer.astype(np.int64), expert.astype(np.int64)
        )

    def unhosted_lists(self) -> list[list[int]]:
        """Per layer, the experts that receive load but have no copy."""
        ends = np.searchsorted(self.unhosted_layer, np.arange(1, self.per_layer.size))
        return [part.tolist() for part in np.split(self.unhosted_expert, ends)]

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready: ``null`` for the unbounded figures of a placement that cannot serve its
        load (JSON has no infinity), and ``unhosted_experts`` (per layer) when there are any."""
        out: dict[str, Any] = {
            "per_layer": [value if math.isfinite(value) else None for value in self.per_layer.tolist()],
            "mean": self.mean if math.isfinite(self.mean) else None,
            "worst": self.worst if math.isfinite(self.worst) else None,
        }
        if self.unhosted_layer.size:
            out["unhosted_experts"] = self.unhosted_lists()
        return out


@dataclass(frozen=True)
class Migrations:
    """Expert copies to write: one row per physical slot whose expert changes.

    Attributes
    ----------
    layer, gpu, slot, logical_expert : numpy.ndarray
        ``(n,)`` int64: write a copy of ``logical_expert`` of ``layer`` into
        physical ``slot`` (on ``gpu``).
    source_gpu : numpy.ndarray
        ``(n,)`` int64: a GPU holding that expert in the current placement, one in
        the destination's node when there is one; ``-1`` when no copy survives (a
        first placement, or the expert's only GPU failed): load it from storage.
    cross_node : numpy.ndarray
        ``(n,)`` bool: the copy crosses nodes (its source is on another node).
    bytes_per_copy : int
        ``expert_bytes`` as given.
    replaced_expert : numpy.ndarray
        ``(n,)`` int64: the expert the slot held before (``-1``: empty); a runtime that
        could not complete copy ``i`` still holds it there.
    """

    layer: npt.NDArray[np.int64]
    gpu: npt.NDArray[np.int64]
    slot: npt.NDArray[np.int64]
    logical_expert: npt.NDArray[np.int64]
    source_gpu: npt.NDArray[np.int64]
    cross_node: npt.NDArray[np.bool_]
    bytes_per_copy: int
    replaced_expert: npt.NDArray[np.int64] = dataclass_field(default_factory=lambda: np.zeros(0, dtype=np.int64))

    @property
    def count(self) -> int:
        """Number of copies written."""
        return int(self.layer.size)

    @property
    def cross_node_count(self) -> int:
        """Copies read from another node."""
        return int(self.cross_node.sum())

    @property
    def from_storage_count(self) -> int:
        """Copies with no surviving source GPU."""
        return int((self.source_gpu < 0).sum())

    @property
    def total_bytes(self) -> int:
        """Bytes written over all copies."""
        return self.count * int(self.bytes_per_copy)


@dataclass(frozen=True)
class RebalanceResult:
    """What :func:`rebalance` decided.

    Attributes
    ----------
    physical_to_logical : numpy.ndarray
        ``(num_layers, num_gpus * slots_per_gpu)`` int64, ``-1`` for an empty slot
        (every slot of an unavailable GPU is empty).
    logical_to_physical : numpy.ndarray
        ``(num_layers, num_experts, max_count)`` int64: the slots of each expert,
        ascending, padded with ``-1``.
    logical_count : numpy.ndarray
        ``(num_layers, num_experts)`` int64 replica counts (each >= 1).
    balance_before : BalanceStats or None
        The current placement under the new load (``None`` without one). Copies on
        unavailable GPUs are not counted; a layer where it holds no copy of an expert
        that receives load reads ``inf`` (it cannot serve that load; those experts are
        re-created).
    balance_after : BalanceStats
        The returned placement.
    lower_bound : BalanceStats
        A provable lower bound on the balance any placement can reach (:func:`lower_bound`).
    migrations : Migrations
        Copies to write to go from the current placement to the new one.
    layer_action : numpy.ndarray
        ``(num_layers,)`` str: ``"kept"`` (current placement kept: it was within
        ``min_improvement`` of a fresh plan), ``"moved"`` (repaired by a few moves)
        or ``"replanned"`` (fresh plan, relabelled to keep copies in place).
    layer_policy : numpy.ndarray
        ``(num_layers,)`` str: for replanned layers ``"global"`` or
        ``"hierarchical"`` (see ``num_expert_groups``), else ``""``.
    kept_current : bool
        True when nothing changes (every layer ``"kept"``).
    reason : str
        One sentence for the caller saying why.
    bound_by : str
        What stopped the moves: ``"balance_target"`` (the layers that changed reached
        their goal, or had no move left that helps), ``"move_budget"`` /
        ``"max_replicas_moved"`` (the copy budget ran out first), or ``"none"`` (no
        placement in service, or nothing to move).
    lost_experts : int
        Experts with no copy on an available GPU in the placement in service (re-created first).
    repaired_layers : int
        Layers repaired because copies were lost on unavailable GPUs or slots were empty (a
        GPU failed or came back), under the repair budget.
    """

    physical_to_logical: npt.NDArray[np.int64]
    logical_count: npt.NDArray[np.int64]
    balance_before: BalanceStats | None
    balance_after: BalanceStats
    lower_bound: BalanceStats
    migrations: Migrations
    layer_action: npt.NDArray[np.str_]
    layer_policy: npt.NDArray[np.str_]
    kept_current: bool
    reason: str
    bound_by: str = "none"
    lost_experts: int = 0
    repaired_layers: int = 0

    @cached_property
    def logical_to_physical(self) -> npt.NDArray[np.int64]:
        """``(num_layers, num_experts, max_count)``: the slots of each expert, ascending, padded with ``-1``.

        Built on first use (EPLB-style runtimes want it padded; the answer sends the ragged
        :meth:`logical_to_physical_lists` unless asked), so a call that does not need it
        does not pay for it.
        """
        physical, counts = self.physical_to_logical, self.logical_count
        layers, experts = counts.shape
        width = max(1, int(counts.max()))
        key = np.where(physical >= 0, physical, experts)
        # unique keys: slots ascending within an expert
        order = np.argsort(key * physical.shape[1] + np.arange(physical.shape[1]), axis=1)
        sorted_expert = np.take_along_axis(key, order, axis=1)
        start = np.zeros((layers, experts + 1), dtype=np.int64)
        start[:, 1:] = np.cumsum(counts, axis=1)
        held = sorted_expert < experts
        rank = np.arange(physical.shape[1])[None, :] - np.take_along_axis(start, sorted_expert, axis=1)
        out = np.full((layers, experts, width), -1, dtype=np.int64)
        lay, pos = np.nonzero(held)
        out[lay, sorted_expert[lay, pos], rank[lay, pos]] = order[lay, pos]
        return out

    @property
    def slots_moved_fraction(self) -> float:
        """Copies written over all physical slots of all layers."""
        return self.migrations.count / max(1, self.physical_to_logical.size)

    def logical_to_physical_lists(self) -> list[list[list[int]]]:
        """Per layer, per logical expert, its physical slots (ascending), without padding.

        The padded array is mostly ``-1`` when a few hot experts have many copies (22 of
        them at DeepSeek-V3 shapes: ten times the entries); the ragged lists hold the
        same information and serialise in a few milliseconds.
        """
        out = []
        for layer, counts in zip(self.physical_to_logical, self.logical_count):
            slots = np.flatnonzero(layer >= 0)
            by_expert = slots[np.argsort(layer[slots], kind="stable")].tolist()
            ends = np.cumsum(counts).tolist()
            out.append([by_expert[a:b] for a, b in zip([0, *ends[:-1]], ends)])
        return out

    def as_dict(self, *, placement: bool = True, layers: bool = True, eplb: bool = False) -> dict[str, Any]:
        """Plain lists and numbers (JSON-ready): ragged ``logical_to_physical`` and migrations
        column-wise, so large answers stay cheap. ``placement=False`` leaves out the three
        maps and ``layers=False`` the per-layer figures: an answer then grows with what
        changed (the migrations), not with the model. ``eplb=True`` adds the maps as
        EPLB-style runtimes hold them: ``physical_to_logical_map`` and
        ``logical_to_physical_map`` (padded with ``-1`` to the largest replica count),
        with ``logical_count``."""

        def stats(value: BalanceStats | None) -> dict[str, Any] | None:
            if value is None:
                return None
            out = value.as_dict()
            if not layers:
                del out["per_layer"]
            return out

        m = self.migrations
        maps: dict[str, Any] = {}
        if placement:
            maps = {
                "physical_to_logical": self.physical_to_logical.tolist(),
                "logical_to_physical": self.logical_to_physical_lists(),
                "logical_count": self.logical_count.tolist(),
            }
        if eplb:
            maps["physical_to_logical_map"] = self.physical_to_logical.tolist()
            maps["logical_to_physical_map"] = self.logical_to_physical.tolist()
            maps["logical_count"] = self.logical_count.tolist()
        per_layer: dict[str, Any] = {}
        if layers:
            per_layer = {"layer_action": self.layer_action.tolist(), "layer_policy": self.layer_policy.tolist()}
        return {
            **maps,
            "balance_before": stats(self.balance_before),
            "balance_after": stats(self.balance_after),
            "lower_bound": stats(self.lower_bound),
            "migrations": {
                "count": m.count,
                "cross_node_count": m.cross_node_count,
                "from_storage_count": m.from_storage_count,
                "total_bytes": m.total_bytes,
                "slots_moved_fraction": self.slots_moved_fraction,
                "layer": m.layer.tolist(),
                "gpu": m.gpu.tolist(),
                "slot": m.slot.tolist(),
                "logical_expert": m.logical_expert.tolist(),
                "replaced_expert": m.replaced_expert.tolist(),
                "source_gpu": m.source_gpu.tolist(),
                "cross_node": m.cross_node.tolist(),
            },
            **per_layer,
            "kept_current": self.kept_current,
            "reason": self.reason,
        }


def eplb_maps(physical_to_logical: np.ndarray, num_experts: int) -> tuple[list[list[list[int]]], np.ndarray]:
    """EPLB's ``logical_to_physical`` (ragged lists, slots ascending) and ``logical_count`` of a placement.

    For a placement read back from storage (``GET /v1/moe/deployments/{name}``), in the
    form :meth:`RebalanceResult.logical_to_physical_lists` gives for an answer.
    """
    placement = np.asarray(physical_to_logical, dtype=np.int64)
    counts = count_rows(np.where(placement >= 0, placement, num_experts), num_experts + 1)[:, :num_experts]
    out = []
    for layer, layer_counts in zip(placement, counts):
        slots = np.flatnonzero(layer >= 0)
        by_expert = slots[np.argsort(layer[slots], kind="stable")].tolist()
        ends = np.cumsum(layer_counts).tolist()
        out.append([by_expert[a:b] for a, b in zip([0, *ends[:-1]], ends)])
    return out, counts.astype(np.int64)


# ----------------------------------------------------------------------------- validation


def _check_load(load: object, num_moe_layers: int | None, num_logical_experts: int | None) -> np.ndarray:
    try:
        array = np.asarray(load, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise InvalidInput(
            f"load must be a layers x experts matrix of numbers ({exc})", field="load", code="bad-load"
        ) from None
    if array.ndim != 2 or array.shape[0] < 1 or array.shape[1] < 1:
        raise InvalidInput(
            f"load must be a non-empty layers x experts matrix, got shape {array.shape}", field="load", code="bad-shape"
        )
    layers, experts = array.shape
    if num_moe_layers is not None:
        num_moe_layers = _check_positive_int(num_moe_layers, "model.num_moe_layers")
    if num_logical_experts is not None:
        num_logical_experts = _check_positive_int(num_logical_experts, "model.num_logical_experts")
    if num_moe_layers is not None and layers != num_moe_layers:
        raise InvalidInput(
            f"load has {layers} rows but the model has num_moe_layers={num_moe_layers}", field="load", code="bad-shape"
        )
    if num_logical_experts is not None and experts != num_logical_experts:
        raise InvalidInput(
            f"load has {experts} columns but the model has num_logical_experts={num_logical_experts}",
            field="load",
            code="bad-shape",
        )
    bad = ~np.isfinite(array)
    if bad.any():
        layer, expert = np.argwhere(bad)[0]
        raise InvalidInput(f"load[{layer}][{expert}] is not a finite number", field="load", code="non-finite-load")
    if (array < 0).any():
        layer, expert = np.argwhere(array < 0)[0]
        raise InvalidInput(
            f"load[{layer}][{expert}] = {array[layer, expert]} is negative; loads are token counts",
            field="load",
            code="negative-load",
        )
    return array


def _check_positive_int(value: object, field: str, maximum: int = MAX_COUNT) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or not 1 <= int(value) <= maximum:
        raise InvalidInput(
            f"{field} must be an integer from 1 to {maximum}, got {value!r}", field=field, code="bad-cluster"
        )
    return int(value)


def _check_count(value: object, field: str, code: str) -> int:
    """A non-negative integer option (a cap, a size in bytes)."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or not 0 <= int(value) <= MAX_OPTION:
        raise InvalidInput(f"{field} must be an integer from 0 to {MAX_OPTION}, got {value!r}", field=field, code=code)
    return int(value)


def _available_gpus(num_gpus: int, unavailable_gpus: Sequence[int]) -> np.ndarray:
    try:
        down = np.asarray(list(unavailable_gpus))
    except (TypeError, ValueError):
        down = None
    if down is None or down.ndim != 1 or (down.size and down.dtype.kind not in "iu"):
        raise InvalidInput(
            f"cluster.unavailable_gpus must be a list of GPU numbers, got {unavailable_gpus!r}",
            field="cluster.unavailable_gpus",
            code="unknown-gpu",
        )
    down = down.astype(np.int64)
    if down.size and (down.min() < 0 or down.max() >= num_gpus):
        raise InvalidInput(
            f"unavailable GPU {int(down[(down < 0) | (down >= num_gpus)][0])} does not exist"
            f" (GPUs are 0..{num_gpus - 1})",
            field="cluster.unavailable_gpus",
            code="unknown-gpu",
        )
    available = np.ones(num_gpus, dtype=bool)
    available[down] = False
    if not available.any():
        raise InvalidInput("every GPU is unavailable", field="cluster.unavailable_gpus", code="no-gpu")
    return np.flatnonzero(available)


def _check_current(current: object, shape: tuple[int, int], num_experts: int) -> np.ndarray:
    field = "current_placement.physical_to_logical"
    try:
        array = np.asarray(current)
    except (TypeError, ValueError) as exc:
        raise InvalidInput(
            f"{field} must be a layers x slots matrix of integers ({exc})", field=field, code="bad-placement"
        ) from None
    if array.shape != shape:
        raise InvalidInput(
            f"{field} must have shape (num_moe_layers, num_nodes * gpus_per_node * slots_per_gpu) = {shape},"
            f" got {array.shape}",
            field=field,
            code="bad-shape",
        )
    if array.dtype.kind not in "iu":
        if array.dtype.kind != "f" or not np.all(np.isfinite(array)) or not np.all(array == np.round(array)):
            raise InvalidInput(
                f"{field} must hold integer expert ids (-1 for an empty slot)", field=field, code="bad-placement"
            )
    array = array.astype(np.int64)
    bad = (array < -1) | (array >= num_experts)
    if bad.any():
        layer, slot = np.argwhere(bad)[0]
        raise InvalidInput(
            f"{field}[{layer}][{slot}] = {array[layer, slot]} names no logical expert"
            f" (experts are 0..{num_experts - 1}, -1 is empty)",
            field=field,
            code="unknown-expert",
        )
    return array


def _check_flag(value: object, field: str) -> bool:
    if not isinstance(value, (bool, np.bool_, int, np.integer)) or value not in (0, 1):
        raise InvalidInput(f"{field} must be true or false, got {value!r}", field=field, code="bad-flag")
    return bool(value)


def _check_options(max_replicas_moved: object, expert_bytes: object, min_improvement: object) -> None:
    if max_replicas_moved is not None:
        _check_count(max_replicas_moved, "max_replicas_moved", "bad-cap")
    _check_count(expert_bytes, "model.expert_bytes", "bad-bytes")
    if (
        isinstance(min_improvement, bool)
        or not isinstance(min_improvement, (int, float, np.integer, np.floating))
        or not math.isfinite(float(min_improvement))
        or min_improvement < 0
    ):
        raise InvalidInput(
            f"min_improvement must be a finite number >= 0, got {min_improvement!r}",
            field="min_improvement",
            code="bad-threshold",
        )


# ----------------------------------------------------------------------------- replica counts and bound


def replica_counts(load: np.ndarray, *, num_gpus: int, slots_per_gpu: int) -> npt.NDArray[np.int64]:
    """Replica count of every expert of every layer, filling the slots of ``num_gpus`` GPUs.

    Minimises the largest per-replica load ``load / count`` subject to one copy
    per GPU at most (``count <= num_gpus``), at least one copy, and no more copies
    than slots; spare copies go to the experts with the largest per-replica load,
    as EPLB's ``replicate_experts`` would give them one at a time.

    Parameters
    ----------
    load : array_like, shape (num_layers, num_experts)
        Tokens per logical expert per layer, finite and non-negative.
    num_gpus : int
        GPUs available.
    slots_per_gpu : int
        Expert slots per GPU.

    Returns
    -------
    numpy.ndarray
        ``(num_layers, num_experts)`` int64, each row summing to
        ``min(num_gpus * slots_per_gpu, num_experts * num_gpus)``.

    Raises
    ------
    InvalidInput
        Bad load, or fewer slots than experts.
    """
    array = _check_load(load, None, None)
    num_gpus = _check_positive_int(num_gpus, "cluster.num_gpus", MAX_NODES * MAX_PER_NODE)
    slots_per_gpu = _check_positive_int(slots_per_gpu, "cluster.slots_per_gpu", MAX_PER_NODE)
    _check_fits(array.shape[1], num_gpus, slots_per_gpu)
    counts, _ = water_fill(array, num_gpus, min(num_gpus * slots_per_gpu, array.shape[1] * num_gpus))
    return counts


def _check_fits(num_experts: int, num_available_gpus: int, slots_per_gpu: int) -> None:
    if num_experts > num_available_gpus * slots_per_gpu:
        raise InvalidInput(
            f"{num_experts} logical experts need at least {num_experts} slots"
            f" but the {num_available_gpus} available GPUs"
            f" x {slots_per_gpu} slots_per_gpu offer {num_available_gpus * slots_per_gpu}; add GPUs or slots",
            field="cluster.slots_per_gpu",
            code="not-enough-slots",
        )


def lower_bound(load: np.ndarray, *, num_gpus: int, slots_per_gpu: int) -> npt.NDArray[np.float64]:
    """A provable lower bound, per layer, on max/mean GPU load of any valid placement.

    Proof. Let ``T`` be the layer's total load, ``A = num_gpus`` and
    ``N = min(A * slots_per_gpu, E * A)`` the most copies a placement can hold
    (one per slot, at most one per GPU for each expert). Any placement has counts
    ``1 <= c_e <= A`` with ``sum c_e <= N``, and its most loaded GPU carries at
    least the mean ``T / A`` and at least the largest per-replica load
    ``max_e load_e / c_e`` (that replica sits on some GPU). So
    ``max >= max(T / A, X*)`` with ``X* = min over such counts of max_e load_e / c_e``.
    ``X* >= x`` for every ``x`` at which the counts ``ceil(load_e / x)`` forced by
    "per-replica load <= x" break a constraint (some exceed ``A``, or with at least
    one copy each they sum above ``N``); the bisection in :func:`replica_counts`
    keeps the largest such ``x`` it tried, starting from ``max(max_e load_e / A,
    T / N)`` which is such a bound by the same two constraints. The bound is that
    ``x`` over ``T / A``, and at least 1. (Layers with no load: 1.)

    It is tight when the slots leave room to split every hot expert below the
    mean, which is when a placement reaching 1.0 can exist; it ignores how
    replicas pack into whole slots, so it can be optimistic with one or two slots
    per GPU.

    Parameters
    ----------
    load : array_like, shape (num_layers, num_experts)
    num_gpus : int
        GPUs available.
    slots_per_gpu : int

    Returns
    -------
    numpy.ndarray
        ``(num_layers,)`` float64, each >= 1.
    """
    array = _check_load(load, None, None)
    num_gpus = _check_positive_int(num_gpus, "cluster.num_gpus", MAX_NODES * MAX_PER_NODE)
    slots_per_gpu = _check_positive_int(slots_per_gpu, "cluster.slots_per_gpu", MAX_PER_NODE)
    _check_fits(array.shape[1], num_gpus, slots_per_gpu)
    _, cap_lower = water_fill(array, num_gpus, min(num_gpus * slots_per_gpu, array.shape[1] * num_gpus))
    return bound_ratio(array, cap_lower, num_gpus)


# ----------------------------------------------------------------------------- public entry points


def _measure(load: np.ndarray, placement: np.ndarray) -> tuple[BalanceStats, np.ndarray]:
    """Balance of a placement ``(L, A, S)`` on the available GPUs, and its replica counts ``(L, E)``.

    The one place a reported max/mean is computed (``balance_before``, ``balance_after``,
    :func:`balance_stats`), so they agree. A layer serving all its load has max >= mean, so
    its ratio is at least 1 (rounding of split loads aside, which is clipped away); a layer
    where an expert with load has no copy cannot serve it at all and reads ``inf`` rather
    than the flattering max/mean of the load it happens to hold.
    """
    state = PlacementState(load, placement)
    ratio = np.maximum(balance_ratio(state.gpu_load, load.sum(axis=1)), 1.0)
    return BalanceStats.of(ratio, unhosted=(state.counts == 0) & (load > 0)), state.counts


def balance_stats(
    load: np.ndarray,
    physical_to_logical: np.ndarray,
    *,
    gpus_per_node: int,
    num_nodes: int,
    slots_per_gpu: int,
    unavailable_gpus: Sequence[int] = (),
) -> BalanceStats:
    """Max over mean GPU load of a placement, per layer, under the given load.

    A GPU's load is the sum over its slots of the expert's load divided by the
    expert's number of copies on available GPUs (tokens split evenly over
    replicas); the mean is the layer's total load over the available GPUs. Copies
    on unavailable GPUs count for nothing. A layer where an expert that receives
    load has no copy (on an available GPU) cannot serve those tokens: it reads
    ``inf`` and the experts are listed in ``unhosted_layer`` / ``unhosted_expert``.

    Parameters
    ----------
    load : array_like, shape (num_layers, num_experts)
    physical_to_logical : array_like, shape (num_layers, num_nodes * gpus_per_node * slots_per_gpu)
    gpus_per_node, num_nodes, slots_per_gpu : int
    unavailable_gpus : sequence of int

    Returns
    -------
    BalanceStats

    Raises
    ------
    InvalidInput
        Bad load, placement shape or expert id.
    """
    array = _check_load(load, None, None)
    num_gpus = _check_positive_int(num_nodes, "cluster.num_nodes", MAX_NODES) * _check_positive_int(
        gpus_per_node, "cluster.gpus_per_node", MAX_PER_NODE
    )
    slots_per_gpu = _check_positive_int(slots_per_gpu, "cluster.slots_per_gpu", MAX_PER_NODE)
    available = _available_gpus(num_gpus, unavailable_gpus)
    current = _check_current(physical_to_logical, (array.shape[0], num_gpus * slots_per_gpu), array.shape[1])
    slots = _dedupe(current.reshape(array.shape[0], num_gpus, slots_per_gpu)[:, available])
    return _measure(array, slots)[0]


def _dedupe(slots: np.ndarray) -> np.ndarray:
    """Empty every second copy of an expert on one GPU (it adds nothing; EPLB can produce them)."""
    ordered = np.sort(slots, axis=2)
    dup_sorted = np.zeros_like(ordered, dtype=bool)
    dup_sorted[:, :, 1:] = (ordered[:, :, 1:] == ordered[:, :, :-1]) & (ordered[:, :, 1:] >= 0)
    if not dup_sorted.any():
        return slots.copy()
    out = slots.copy()
    for layer, gpu in {(int(lay), int(g)) for lay, g, _ in np.argwhere(dup_sorted)}:
        seen: set[int] = set()
        for k, expert in enumerate(out[layer, gpu].tolist()):
            if expert >= 0 and expert in seen:
                out[layer, gpu, k] = -1
            seen.add(expert)
    return out


def rebalance(
    load: np.ndarray,
    *,
    num_nodes: int,
    gpus_per_node: int,
    slots_per_gpu: int,
    current_physical_to_logical: np.ndarray | None = None,
    unavailable_gpus: Sequence[int] = (),
    max_replicas_moved: int | None = None,
    expert_bytes: int = 0,
    min_improvement: float = 0.01,
    node_local: bool = False,
    num_expert_groups: int | None = None,
    ignore_sampling_noise: bool = True,
    num_moe_layers: int | None = None,
    num_logical_experts: int | None = None,
    seed: int = 0,
    balance_target: float = DEFAULT_BALANCE_TARGET,
    move_budget: int | None = None,
    repair_budget: int | None = None,
) -> RebalanceResult:
    """New expert-to-GPU placement for the reported load, moving as few copies as it can.

    Parameters
    ----------
    load : array_like, shape (num_moe_layers, num_logical_experts)
        Tokens each logical expert received, per MoE layer; finite, >= 0.
    num_nodes, gpus_per_node, slots_per_gpu : int
        Cluster shape: GPU ``g`` is on node ``g // gpus_per_node``, physical slot
        ``s`` on GPU ``s // slots_per_gpu``.
    current_physical_to_logical : array_like of int, optional
        Shape ``(num_moe_layers, num_nodes * gpus_per_node * slots_per_gpu)``.
        The placement in service (``-1``: empty slot). Without it the answer is a
        fresh plan and every copy is a migration from storage. It may lack experts
        (emptied slots, a failed GPU): they are re-created, and ``balance_before``
        reads ``inf`` for the layers where one of them receives load.
    unavailable_gpus : sequence of int
        GPUs that must hold nothing (failed, drained); their slots come back ``-1``
        and experts whose only copies were there are re-created elsewhere.
    max_replicas_moved : int, optional
        Hard cap on copies written by this call when a current placement is given
        (a first placement loads every copy; it moves none). Re-creating experts
        that lost every copy is mandatory, so a cap below their number raises
        :class:`Infeasible`.
    expert_bytes : int
        Bytes of one expert's weights, to size the migrations.
    min_improvement : float
        A layer keeps its placement unless a fresh plan would lower its max/mean by
        more than this; a repair is kept only if it gains more than this.
    node_local : bool
        Write only copies whose source is on the destination's node (no
        cross-node traffic); experts that lost every copy are exempt.
    num_expert_groups : int, optional
        Expert groups of group-limited routing (DeepSeek-V3: 8). When given, fresh
        plans also try EPLB's hierarchical policy (whole groups per node, replicas
        inside nodes) and keep it for a layer only where its max/mean is within
        ``min_improvement`` of the global plan's (with one group per node it
        usually is not: node load is then group load). It needs the group count to
        be a multiple of ``num_nodes`` and every GPU available; otherwise plans are
        global. ``layer_policy`` says which one each replanned layer got.
    ignore_sampling_noise : bool
        Treat ``load`` as sampled token counts and add to ``min_improvement`` the
        max/mean gap that sampling alone explains: a GPU's count of ``mu`` tokens
        varies by about ``sqrt(mu)`` (Poisson), and the largest of ``A`` such
        deviations is about ``sqrt(2 ln A)`` standard deviations, so the margin is
        ``sqrt(2 ln A / mu)`` (at most 0.05). A fresh plan fitted to one report
        looks better than the current placement by about that much on the same
        report, yet no better on the next one; chasing it is churn. Pass False
        when ``load`` is already smoothed (an average over many reports).
    num_moe_layers, num_logical_experts : int, optional
        The model's shape, to check ``load`` against.
    seed : int
        Accepted for a stable signature; the algorithm is deterministic
        (ties break by index), so the same input gives the same output.
    balance_target : float
        The max/mean at which a repaired layer stops moving copies (default 1.015):
        moves are bought while they lower a layer towards it, best balance gain per
        copy written first, and no further (a fresh plan's optimum costs several
        times the copies for a few thousandths). A layer whose bound lies above it
        aims just above its bound; a layer that changes only because copies were lost
        on unavailable GPUs or slots are empty aims at what would keep it (bound plus
        the keep threshold), so a failure or a returning GPU writes the copies it must
        and little more.
    move_budget : int, optional
        Copies this call may write for balance, on top of re-creating the experts that
        lost every copy (which always happens); ``max_replicas_moved`` stays the hard
        cap on everything. ``bound_by`` says whether the budget or the target stopped
        the moves.
    repair_budget : int, optional
        Copies a failure may write for balance on the survivors, on top of one copy for
        each expert that lost every copy (default: ``move_budget``). The layers that lost
        copies on unavailable GPUs (or have empty slots) are repaired under it, before and
        apart from drifted layers: lost experts first (over the least useful copy, on a
        GPU that stays light), then the lost replicas, then moves off the hottest GPUs,
        stopping at each layer's goal or when the budget is spent
        (``bound_by == "repair_budget"``). A returning GPU writes one copy per empty slot
        (the hottest experts that fit) and stops there. So a failure writes at most
        ``lost_experts + repair_budget`` copies.

    Returns
    -------
    RebalanceResult

    Raises
    ------
    InvalidInput
        Load of the wrong shape, negative or not finite; a placement of the wrong
        shape or naming an unknown expert; an unknown GPU; fewer available slots
        than experts; a negative cap, bytes or threshold.
    Infeasible
        ``max_replicas_moved`` is below the number of experts that lost every copy.

    Examples
    --------
    >>> import numpy as np
    >>> result = rebalance(np.array([[8.0, 1.0, 1.0, 1.0, 1.0]]), num_nodes=1, gpus_per_node=2, slots_per_gpu=3)
    >>> result.logical_count.tolist()
    [[2, 1, 1, 1, 1]]
    >>> result.balance_after.worst
    1.0
    """
    del seed  # deterministic by construction
    array = _check_load(load, num_moe_layers, num_logical_experts)
    num_nodes = _check_positive_int(num_nodes, "cluster.num_nodes", MAX_NODES)
    gpus_per_node = _check_positive_int(gpus_per_node, "cluster.gpus_per_node", MAX_PER_NODE)
    slots_per_gpu = _check_positive_int(slots_per_gpu, "cluster.slots_per_gpu", MAX_PER_NODE)
    _check_options(max_replicas_moved, expert_bytes, min_improvement)
    if move_budget is not None:
        _check_count(move_budget, "move_budget", "bad-cap")
    if repair_budget is not None:
        _check_count(repair_budget, "repair_budget", "bad-cap")
    if (
        isinstance(balance_target, bool)
        or not isinstance(balance_target, (int, float, np.integer, np.floating))
        or not 1.0 <= float(balance_target) <= 1e6
    ):
        raise InvalidInput(
            f"balance_target must be a number >= 1 (a max/mean), got {balance_target!r}",
            field="balance_target",
            code="bad-threshold",
        )
    node_local = _check_flag(node_local, "node_local")
    ignore_sampling_noise = _check_flag(ignore_sampling_noise, "ignore_sampling_noise")
    cluster = _Cluster.of(num_nodes, gpus_per_node, slots_per_gpu, unavailable_gpus)
    layers, experts = array.shape
    _check_fits(experts, cluster.num_available, slots_per_gpu)
    current = None
    if current_physical_to_logical is not None:
        current = _check_current(current_physical_to_logical, (layers, cluster.num_gpus * slots_per_gpu), experts)
    hierarchy = _hierarchy(num_expert_groups, experts, cluster)

    n_fill = min(cluster.num_available * slots_per_gpu, experts * cluster.num_available)
    counts, cap_lower = water_fill(array, cluster.num_available, n_fill)
    bound = bound_ratio(array, cap_lower, cluster.num_available)
    if current is None:
        policy = np.full(layers, "", dtype="<U12")
        final, _, policy[:] = _fresh_plan(
            array, counts, bound, np.arange(layers), slots_per_gpu, cluster.node_of_gpu, hierarchy, min_improvement
        )
        final = _settled(array, final, counts, bound, cluster, hierarchy, min_improvement, balance_target)
        decision = _Decision(
            final=final,
            original=np.full((layers, cluster.num_available, slots_per_gpu), -1, dtype=np.int64),
            before=None,
            action=np.full(layers, "replanned", dtype="<U9"),
            policy=policy,
            original_node_gpu=None,
        )
        reason = "no current placement: fresh plan"
        unused = [
            name
            for name, given in (("max_replicas_moved", max_replicas_moved is not None), ("node_local", node_local))
            if given
        ]
        if unused:
            # a first placement loads every copy from storage: there is nothing to cap or keep local
            reason += f" ({' and '.join(unused)} not applied: there is no placement in service to move copies from)"
    else:
        decision = _replace_incrementally(
            array,
            current,
            counts,
            bound,
            cluster,
            hierarchy,
            min_improvement=min_improvement,
            ignore_sampling_noise=ignore_sampling_noise,
            max_replicas_moved=max_replicas_moved,
            node_local=node_local,
            balance_target=balance_target,
            move_budget=move_budget,
            repair_balance_budget=repair_budget,
        )
    after, after_counts = _measure(array, decision.final)
    if current is not None:
        reason = _reason(
            decision,
            after,
            min_improvement=min_improvement,
            ignore_sampling_noise=ignore_sampling_noise,
            max_replicas_moved=max_replicas_moved,
            num_experts=array.shape[1],
        )
    bound_by = _bound_by(decision, current is not None, max_replicas_moved, move_budget)
    if bound_by == "move_budget":
        reason += (
            f"; the move budget ({move_budget} copies for balance, plus {decision.lost_experts} lost"
            f" expert(s)) ran out before every changed layer reached its balance target ({balance_target:g})"
        )
    elif bound_by == "repair_budget":
        reason += (
            f"; the repair budget ({decision.repair_budget} copies: {decision.lost_experts} lost expert(s), one per"
            " empty slot of a returning GPU, and repair_budget for balance after a failure) ran out before every"
            " repaired layer reached its balance goal"
        )
    elif bound_by == "balance_target":
        reason += f"; moves stopped at the balance target ({balance_target:g})"
    return _result(
        array,
        decision,
        cluster,
        int(expert_bytes),
        bound,
        reason,
        had_current=current is not None,
        measured=(after, after_counts),
        bound_by=bound_by,
    )


def _bound_by(decision: _Decision, had_current: bool, max_replicas_moved: int | None, move_budget: int | None) -> str:
    """Which limit stopped the moves (see :attr:`RebalanceResult.bound_by`)."""
    if not had_current or ((decision.action == "kept").all() and not decision.budget_bound):
        return "none"
    if max_replicas_moved is not None and decision.repair_budget == max_replicas_moved and decision.repair_bound:
        return "max_replicas_moved"
    if decision.repair_bound and not decision.budget_bound:
        return "repair_budget"
    if not decision.budget_bound:
        return "balance_target"
    soft = None if move_budget is None else decision.lost_experts + move_budget
    if max_replicas_moved is not None and (soft is None or max_replicas_moved <= soft):
        return "max_replicas_moved"
    return "move_budget"


@dataclass(frozen=True)
class _Cluster:
    """The GPUs a call places copies on; the others (unavailable) hold nothing."""

    num_nodes: int
    gpus_per_node: int
    slots_per_gpu: int
    available: np.ndarray  # (A,) physical ids of the available GPUs, ascending
    node_of_gpu: np.ndarray  # (A,) the node of each

    @classmethod
    def of(cls, num_nodes: int, gpus_per_node: int, slots_per_gpu: int, unavailable_gpus: Sequence[int]) -> _Cluster:
        available = _available_gpus(num_nodes * gpus_per_node, unavailable_gpus)
        return cls(num_nodes, gpus_per_node, slots_per_gpu, available, available // gpus_per_node)

    @property
    def num_gpus(self) -> int:
        return self.num_nodes * self.gpus_per_node

    @property
    def num_available(self) -> int:
        return int(self.available.size)


def _hierarchy(num_expert_groups: int | None, experts: int, cluster: _Cluster) -> tuple[int, int, int] | None:
    """``(num_nodes, gpus_per_node, num_expert_groups)`` when EPLB's hierarchical policy applies, else None."""
    if num_expert_groups is None:
        return None
    groups = _check_positive_int(num_expert_groups, "model.num_expert_groups")
    if experts % groups:
        raise InvalidInput(
            f"num_expert_groups={groups} does not divide the {experts} logical experts",
            field="model.num_expert_groups",
            code="bad-groups",
        )
    if (
        cluster.num_nodes > 1
        and groups % cluster.num_nodes == 0
        and cluster.num_available == cluster.num_gpus
        and experts // cluster.num_nodes <= cluster.gpus_per_node * cluster.slots_per_gpu
    ):
        return (cluster.num_nodes, cluster.gpus_per_node, groups)
    return None


@dataclass(frozen=True)
class _Decision:
    """Per layer, what a call does with the placement in service, and what that was."""

    final: np.ndarray  # (L, A, S) the new placement on the available GPUs
    original: np.ndarray  # (L, A, S) the placement in service there (all -1 without one)
    before: BalanceStats | None  # the placement in service under the new load
    action: np.ndarray  # (L,) "kept", "moved" or "replanned"
    policy: np.ndarray  # (L,) "global" / "hierarchical" for replanned layers, else ""
    original_node_gpu: np.ndarray | None  # gpu_in_node of ``original``, when it was needed
    # (L,) max/mean of the fresh plan for layers a fresh plan would improve by more than the
    # keep threshold ("active" layers), NaN elsewhere: what the reason compares against
    fresh_ratio: np.ndarray | None = None
    # (L,) the fresh plan was wanted (the repair fell short of it) but max_replicas_moved /
    # node_local ruled it out: the constraint, not a lack of gain, kept the layer where it is
    held_by_budget: np.ndarray | None = None
    held_by_node_local: np.ndarray | None = None
    goal_ratio: np.ndarray | None = None  # (L,) the max/mean each layer aimed at
    budget_bound: bool = False  # the copy budget, not the balance target, stopped the moves
    repair_bound: bool = False  # the repair budget stopped a failure's or a return's moves
    repair_budget: int | None = None  # copies a failure or a return could write (None: none happened)
    repaired_layers: int = 0  # layers repaired for a failure or a return
    lost_experts: int = 0  # experts without a copy on an available GPU before the call


def _keep_threshold(
    mean: np.ndarray, num_available: int, min_improvement: float, ignore_sampling_noise: bool
) -> np.ndarray:
    """Per layer, the max/mean gain below which the placement in service stays.

    ``min_improvement`` plus, for sampled token counts, the gap sampling alone explains:
    ``sqrt(2 ln A / mu)`` for ``A`` GPUs of mean load ``mu`` (see :func:`rebalance`).
    """
    threshold = np.full(mean.size, float(min_improvement))
    if ignore_sampling_noise and num_available > 1:
        safe_mean = np.where(mean > 0, mean, 1.0)
        with np.errstate(over="ignore"):  # a vanishing mean: infinite noise, capped below
            noise = np.sqrt(2.0 * np.log(num_available) / safe_mean)
        threshold += np.where(mean > 0, np.minimum(noise, _NOISE_MARGIN_CAP), 0.0)
    return threshold


def _replace_incrementally(
    load: np.ndarray,
    current: np.ndarray,
    counts: np.ndarray,
    bound: np.ndarray,
    cluster: _Cluster,
    hierarchy: tuple[int, int, int] | None,
    *,
    min_improvement: float,
    ignore_sampling_noise: bool,
    max_replicas_moved: int | None,
    node_local: bool,
    balance_target: float,
    move_budget: int | None,
    repair_balance_budget: int | None = None,
) -> _Decision:
    """Keep, repair or replan each layer of the placement in service (step 3 of the module docstring)."""
    layers, experts = load.shape
    slots_per_gpu = cluster.slots_per_gpu
    total = load.sum(axis=1)
    mean = total / cluster.num_available
    original = _dedupe(current.reshape(layers, cluster.num_gpus, slots_per_gpu)[:, cluster.available])
    state = PlacementState(load, original.copy())
    before_ratio = balance_ratio(state.gpu_load, total)
    lost = (state.counts == 0).any(axis=1)
    n_lost = int((state.counts == 0).sum())
    if max_replicas_moved is not None and n_lost > max_replicas_moved:
        raise Infeasible(
            f"{n_lost} experts lost every copy (unavailable GPUs or empty slots) and must be re-created,"
            f" but max_replicas_moved={max_replicas_moved}",
            field="max_replicas_moved",
            code="cap-below-lost-experts",
        )
    # empty slots on available GPUs (a GPU back from failure) are filled when the slots
    # can all hold a copy without duplicates
    fillable = experts >= slots_per_gpu
    empty = np.zeros(layers, dtype=bool)
    if fillable:
        empty[:] = np.min(original.reshape(layers, -1), axis=1) < 0
    threshold = _keep_threshold(mean, cluster.num_available, min_improvement, ignore_sampling_noise)
    # aim: the balance target, or just above the bound where even a fresh plan cannot reach it
    goal_ratio = np.maximum(balance_target, bound + _GOAL_FRACTION * threshold)
    # a fresh plan cannot beat the bound, so layers within threshold of it are kept without one
    # (a layer that lost copies on unavailable GPUs reads hot until they are back: it counts as one)
    with_down = _dedupe(current.reshape(layers, cluster.num_gpus, slots_per_gpu)).reshape(layers, -1)
    prior = count_rows(np.where(with_down >= 0, with_down, experts), experts + 1)[:, :experts]
    lost_copies = np.max(prior - state.counts, axis=1) > 0
    drifted = (before_ratio - bound > threshold) & (before_ratio > goal_ratio) & ~lost_copies & ~empty
    # a layer that changes only to re-create lost copies or fill empty slots (a GPU failed or
    # came back) aims at what would keep it (the bound plus the threshold), so the repair
    # writes the copies it must and moves no more than balance then needs
    goal_ratio = np.where(drifted, goal_ratio, np.maximum(goal_ratio, bound + threshold))
    candidates = np.flatnonzero(lost | lost_copies | empty | drifted)
    final = original.copy()
    action = np.full(layers, "kept", dtype="<U9")
    policy = np.full(layers, "", dtype="<U12")
    # final, action and policy are filled in place below for the layers that change
    decision = _Decision(
        final,
        original,
        # the placement in service, as _measure would report it (state has not moved yet)
        BalanceStats.of(np.maximum(before_ratio, 1.0), unhosted=(state.counts == 0) & (load > 0)),
        action,
        policy,
        original_node_gpu=None,
        goal_ratio=goal_ratio,
        lost_experts=n_lost,
    )
    if candidates.size == 0:
        return decision
    active = candidates

    original_node_gpu = gpu_in_node(original, cluster.node_of_gpu, cluster.num_nodes, experts)
    node_gpus = np.full((cluster.num_nodes, cluster.gpus_per_node), -1, dtype=np.int64)
    node_gpus[cluster.node_of_gpu, cluster.available % cluster.gpus_per_node] = np.arange(cluster.num_available)
    original_node_has = original_node_gpu >= 0
    budget = max_replicas_moved
    if move_budget is not None:
        soft = n_lost + move_budget  # experts that lost every copy come back whatever the move budget
        budget = soft if budget is None else min(budget, soft)
    # layers that change because a GPU failed or came back are repaired first, under the
    # repair budget: the lost experts (one copy each), then at most ``repair_balance_budget``
    # copies for balance; a returning GPU's empty slots each take one copy, and that is all
    repairing = lost | lost_copies | empty
    repair_budget = _repair_budget(
        original, repairing, empty, n_lost, move_budget if repair_balance_budget is None else repair_balance_budget
    )
    if budget is not None:
        repair_budget = budget if repair_budget is None else min(repair_budget, budget)
    original_placement = OriginalPlacement(original, original_node_has)
    repair_ctx = MoveContext(
        cluster.node_of_gpu,
        node_gpus=node_gpus,
        original=original_placement,
        node_local=node_local,
        budget=repair_budget,
    )
    repair_layers = candidates[repairing[candidates]]
    _repair(
        state,
        repair_layers,
        counts,
        before_ratio,
        goal_ratio,
        mean,
        repair_ctx,
        empty,
        refine=~empty | lost_copies,
        prior=prior,
    )
    spent_on_repair = 0
    if repair_budget is not None and repair_ctx.budget is not None:
        spent_on_repair = int(repair_budget - repair_ctx.budget)
    ctx = MoveContext(
        cluster.node_of_gpu,
        node_gpus=node_gpus,
        original=original_placement,
        node_local=node_local,
        budget=None if budget is None else max(budget - spent_on_repair, 0),
    )
    # drifted layers: moves towards the balance target within the move budget
    drift_layers = candidates[~repairing[candidates]]
    _repair(state, drift_layers, counts, before_ratio, goal_ratio, mean, ctx, empty)
    repaired = state.slots[active]
    repaired_ratio = balance_ratio(state.gpu_load[active], total[active])
    repaired_writes = ((repaired != original[active]) & (repaired >= 0)).sum(axis=(1, 2))
    # a fresh plan only for the layers the repair left well short of their goal
    # (a layer repaired after a failure or a return keeps its repair: a fresh plan rewrites it all)
    short = (repaired_ratio > goal_ratio[active] + _GOAL_FRACTION * threshold[active]) & ~repairing[active]
    chosen, chosen_ratio = repaired, repaired_ratio
    use_fresh = np.zeros(active.size, dtype=bool)
    blocked_by_budget = np.zeros(active.size, dtype=bool)
    blocked_by_node_local = np.zeros(active.size, dtype=bool)
    fresh_ratio_active = np.full(active.size, np.nan)
    if short.any():
        idx = np.flatnonzero(short)
        fresh_slots, fresh_ratio, fresh_policy = _fresh_plan(
            load, counts, bound, active[idx], slots_per_gpu, cluster.node_of_gpu, hierarchy, min_improvement
        )
        fresh_ratio_active[idx] = fresh_ratio
        spent = int(repaired_writes.sum())
        room = None if ctx.budget is None else spent + max(ctx.budget, 0)
        sub_chosen, sub_ratio, sub_fresh, sub_budget, sub_node = _repaired_or_fresh(
            repaired[idx],
            repaired_ratio[idx],
            repaired_writes[idx],
            fresh_slots,
            fresh_ratio,
            original[active[idx]],
            original_node_has[active[idx]],
            goal_ratio[active[idx]],
            cluster,
            experts,
            node_local,
            room,
            spent,
        )
        chosen = chosen.copy()
        chosen_ratio = chosen_ratio.copy()
        chosen[idx], chosen_ratio[idx] = sub_chosen, sub_ratio
        use_fresh[idx], blocked_by_budget[idx], blocked_by_node_local[idx] = sub_fresh, sub_budget, sub_node
        policy_fresh = np.full(active.size, "", dtype="<U12")
        policy_fresh[idx] = fresh_policy
    else:
        policy_fresh = np.full(active.size, "", dtype="<U12")
    worth = lost[active] | empty[active] | lost_copies[active] | (before_ratio[active] - chosen_ratio > min_improvement)
    final[active[worth]] = chosen[worth]
    action[active[worth]] = np.where(use_fresh[worth], "replanned", "moved")
    policy[active[worth & use_fresh]] = policy_fresh[worth & use_fresh]
    layer_fresh_ratio = np.full(layers, np.nan)
    layer_fresh_ratio[active] = np.where(np.isnan(fresh_ratio_active), goal_ratio[active], fresh_ratio_active)
    held_by_budget = np.zeros(layers, dtype=bool)
    held_by_budget[active] = blocked_by_budget
    held_by_node_local = np.zeros(layers, dtype=bool)
    held_by_node_local[active] = blocked_by_node_local
    still_above = bool((balance_ratio(state.gpu_load[active], total[active]) > goal_ratio[active]).any())
    return replace(
        decision,
        original_node_gpu=original_node_gpu,
        fresh_ratio=layer_fresh_ratio,
        held_by_budget=held_by_budget,
        held_by_node_local=held_by_node_local,
        budget_bound=ctx.budget_bound and (still_above or bool(blocked_by_budget.any())),
        # the budget ran out, or a returning GPU's layers stopped once filled (their budget
        # is one copy per empty slot), above their goal
        repair_bound=(repair_ctx.budget_bound or bool((empty & ~lost_copies)[repair_layers].any()))
        and bool(
            (balance_ratio(state.gpu_load[repair_layers], total[repair_layers]) > goal_ratio[repair_layers]).any()
        ),
        repair_budget=repair_budget if repair_layers.size else None,
        repaired_layers=int(repair_layers.size),
    )


def _repair_budget(
    original: np.ndarray, repairing: np.ndarray, empty: np.ndarray, n_lost: int, balance: int | None
) -> int | None:
    """Copies a call may write to repair a failure or a return (see ``repair_budget`` of :func:`rebalance`).

    The experts that lost every copy (one copy each, always), one copy per empty slot of a
    returning GPU, and ``balance`` copies for balance on the survivors (``None``: no limit).
    """
    if balance is None:
        return None
    empty_slots = int((original[repairing & empty] < 0).sum())
    return n_lost + empty_slots + balance


def _repair(
    state: PlacementState,
    active: np.ndarray,
    counts: np.ndarray,
    before_ratio: np.ndarray,
    goal_ratio: np.ndarray,
    mean: np.ndarray,
    ctx: MoveContext,
    empty: np.ndarray,
    refine: np.ndarray | None = None,
    prior: np.ndarray | None = None,
) -> None:
    """Repair the ``active`` layers of ``state`` in place towards each layer's goal max/mean.

    ``refine`` given: layers that lost copies on unavailable GPUs or have empty slots. Each
    expert that lost every copy gets one (over the least useful copy, on a GPU that
    stays light), each empty slot takes one copy of the hottest expert that fits, and
    the rest of ``ctx.budget`` goes to copies for experts left too hot and to moves off
    the hottest GPUs, in the layers ``refine`` names; the others (only empty slots: a GPU
    back) stop once their slots are filled. Without ``refine`` (drift): copies for experts too hot to fit under the goal, then
    moves off the hottest GPUs.
    """
    if active.size == 0:
        return
    load = state.load
    layers = load.shape[0]
    # per-replica cap: the water-filled counts' largest per-replica load, plus slack for
    # noise (an expert under that cap fits; a copy above it is split once more)
    fresh_cap = np.where(counts > 0, load / counts, 0.0).max(axis=1) * (1.0 + _COUNT_SLACK)
    ctx.count_cap = fresh_cap
    priority = np.zeros(layers)
    priority[active] = before_ratio[active] - goal_ratio[active]
    # experts that lost every copy come back with one copy, before anything else; copies
    # lost on unavailable GPUs come back next (as far as the water-filled counts allow and
    # the budget lasts): the failed GPU's replicas, not more
    floor = (state.counts == 0).astype(np.int64)
    if prior is not None:
        floor = np.where(prior > state.counts, np.maximum(np.minimum(prior, counts), floor), floor)
    goal = np.zeros(layers)
    goal[active] = goal_ratio[active] * mean[active]
    if refine is not None:
        # empty slots first (a GPU back from failure): one write each and no donor, under the goal
        fill_empty_slots(state, active[empty[active]], goal, ctx)
        # a GPU back, and nothing else: filled, and done
        active = active[refine[active] | (state.counts[active] == 0).any(axis=1)]
    adjust_counts(state, active, fresh_cap, floor, ctx, priority=priority)
    swap_refine(state, active, goal, _INCREMENTAL_SWAP_ITERS, ctx)


def _repaired_or_fresh(
    repaired: np.ndarray,
    repaired_ratio: np.ndarray,
    repaired_writes: np.ndarray,
    fresh_slots: np.ndarray,
    fresh_ratio: np.ndarray,
    original: np.ndarray,
    original_node_has: np.ndarray,
    goal_ratio: np.ndarray,
    cluster: _Cluster,
    experts: int,
    node_local: bool,
    max_copies: int | None,
    spent: int,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per layer, the repaired placement or the (relabelled) fresh plan, its max/mean,
    whether it is the fresh plan, and whether the copy budget / ``node_local`` ruled out
    a fresh plan that the layer needed (its repair fell short of its goal).

    The fresh plan replaces a repair that fell short of both the goal and the fresh
    plan, or one that writes more copies for no better balance, as far as
    ``max_copies`` (all copies of the call, ``spent`` of them written already) allows,
    the layers the repair helps least first, and, with ``node_local``, only where it
    reads no copy from another node.
    """
    ok = repaired_ratio <= np.maximum(goal_ratio, fresh_ratio + _REPLAN_MARGIN)
    consider = np.flatnonzero(~ok | (repaired_writes > 0.5 * cluster.num_available * cluster.slots_per_gpu))
    chosen, chosen_ratio = repaired.copy(), repaired_ratio.copy()
    use_fresh = np.zeros(repaired.shape[0], dtype=bool)
    blocked_by_budget = np.zeros(repaired.shape[0], dtype=bool)
    blocked_by_node_local = np.zeros(repaired.shape[0], dtype=bool)
    if consider.size == 0:
        return chosen, chosen_ratio, use_fresh, blocked_by_budget, blocked_by_node_local
    relabelled = relabel(fresh_slots[consider], original[consider], experts)
    fresh_writes = ((relabelled != original[consider]) & (relabelled >= 0)).sum(axis=(1, 2))
    fresh_considered = fresh_ratio[consider]
    allowed = np.ones(consider.size, dtype=bool)
    if node_local:
        cross = _cross_writes(relabelled, original[consider], original_node_has[consider], cluster.node_of_gpu)
        allowed = cross == 0
    want = allowed & (
        ~ok[consider] | ((fresh_writes < repaired_writes[consider]) & (fresh_considered <= repaired_ratio[consider]))
    )
    for idx in np.argsort(-(repaired_ratio[consider] - fresh_considered), kind="stable"):
        extra = int(fresh_writes[idx] - repaired_writes[consider[idx]])
        affordable = max_copies is None or spent + extra <= max_copies
        if want[idx] and affordable:
            use_fresh[consider[idx]] = True
            chosen[consider[idx]] = relabelled[idx]
            chosen_ratio[consider[idx]] = fresh_considered[idx]
            spent += extra
        elif not ok[consider[idx]]:
            # the repair fell short and the fresh plan that would close the gap was ruled out
            blocked_by_budget[consider[idx]] = not affordable
            blocked_by_node_local[consider[idx]] = not allowed[idx]
    return chosen, chosen_ratio, use_fresh, blocked_by_budget, blocked_by_node_local


def _reason(
    decision: _Decision,
    after: BalanceStats,
    *,
    min_improvement: float,
    ignore_sampling_noise: bool,
    max_replicas_moved: int | None,
    num_experts: int,
) -> str:
    """One sentence saying what changed and why the other layers did not, and which loaded
    experts the current placement could not serve (why ``balance_before`` is unbounded).

    A layer stays where it is for one of three reasons, and the sentence names the one
    that applies, since they call for different actions from the caller: a fresh plan
    would gain no more than the keep threshold (nothing to do); ``max_replicas_moved`` or
    ``node_local`` ruled out the moves that would gain more (raise the cap, allow
    cross-node copies); or the moves found gain no more than ``min_improvement``.
    """
    margin = f"{min_improvement:g}{' plus sampling noise' if ignore_sampling_noise else ''}"
    action = decision.action
    layers = action.size
    changed = action != "kept"
    fresh_ratio = decision.fresh_ratio if decision.fresh_ratio is not None else np.full(layers, np.nan)
    no_hold = np.zeros(layers, dtype=bool)
    by_budget = decision.held_by_budget if decision.held_by_budget is not None else no_hold
    by_node_local = decision.held_by_node_local if decision.held_by_node_local is not None else no_hold
    held = by_budget | by_node_local
    active = ~np.isnan(fresh_ratio)
    within_margin = ~changed & ~active
    small_gain = ~changed & active & ~held

    clauses = []
    if held.any():
        written = int(((decision.final != decision.original) & (decision.final >= 0)).sum())
        clauses.append(
            _held_clause(
                np.flatnonzero(held),
                bool(by_budget.any()),
                bool(by_node_local.any()),
                max_replicas_moved,
                written,
                after.per_layer,
                fresh_ratio,
            )
        )
    if within_margin.all():
        clauses.append(f"no layer's max/mean would improve by more than {margin}")
    elif within_margin.any():
        others = (
            "the others are" if (within_margin == ~changed).all() else f"{int(within_margin.sum())} kept layer(s) are"
        )
        clauses.append(f"{others} within {margin} of a fresh plan's max/mean")
    if small_gain.any():
        clauses.append(
            f"{int(small_gain.sum())} kept layer(s) would gain no more than {min_improvement:g} in max/mean"
            " from the moves found"
        )
    if decision.before is not None and decision.before.unhosted_layer.size:
        clauses.append(_unhosted_summary(decision.before, num_experts))
    unloaded = _unhosted_unloaded_summary(decision, num_experts)
    if unloaded:
        clauses.append(unloaded)
    if changed.any():
        head = f"{int(changed.sum())} of {layers} layers changed ({int((action == 'replanned').sum())} replanned)"
        return "; ".join([head, *clauses])
    return "kept the current placement: " + "; ".join(clauses)


def _held_clause(
    held: np.ndarray,
    by_budget: bool,
    by_node_local: bool,
    max_replicas_moved: int | None,
    written: int,
    after_ratio: np.ndarray,
    fresh_ratio: np.ndarray,
    max_layers: int = 3,
) -> str:
    """The constraint that kept the ``held`` layers short of a fresh plan, and by how much
    (the worst few layers named, their max/mean against the fresh plan's)."""
    constraints = []
    if by_budget:
        if max_replicas_moved == 0:
            constraints.append("max_replicas_moved=0 lets no copy be written")
        else:
            constraints.append(
                f"max_replicas_moved={max_replicas_moved} is too small to reach a fresh plan's balance"
                f" ({written} {'copy' if written == 1 else 'copies'} written)"
            )
    if by_node_local:
        constraints.append("node_local=true rules out the cross-node copies a fresh plan needs")
    worst = held[np.argsort(-(after_ratio[held] - fresh_ratio[held]), kind="stable")]
    named = "; ".join(
        f"layer {layer}: max/mean {after_ratio[layer]:.4g} where a fresh plan reaches {fresh_ratio[layer]:.4g}"
        for layer in worst[:max_layers].tolist()
    )
    more = "; ..." if worst.size > max_layers else ""
    return f"{' and '.join(constraints)}, so {worst.size} layer(s) stay above a fresh plan's max/mean ({named}{more})"


def _named_experts(missing: np.ndarray, max_layers: int = 3, max_experts: int = 8) -> str:
    """``layer 0: 1, 4; layer 2: 7, ...`` for a ``(num_layers, num_experts)`` mask, a few of each named."""
    layers = np.flatnonzero(missing.any(axis=1))
    named = []
    for layer in layers[:max_layers].tolist():
        experts = np.flatnonzero(missing[layer])
        listed = ", ".join(str(e) for e in experts[:max_experts].tolist())
        named.append(f"layer {layer}: {listed}{', ...' if experts.size > max_experts else ''}")
    return "; ".join(named) + ("; ..." if layers.size > max_layers else "")


def _unhosted_summary(before: BalanceStats, num_experts: int) -> str:
    """The loaded experts without a copy, a few layers and experts named (all are in ``unhosted_experts``)."""
    missing = np.zeros((before.per_layer.size, num_experts), dtype=bool)
    missing[before.unhosted_layer, before.unhosted_expert] = True
    return (
        f"the current placement held no copy of {before.unhosted_expert.size} expert(s) that receive load"
        f" ({_named_experts(missing)}), so it could not serve their tokens: balance_before is unbounded"
        " for those layers, and the experts were re-created"
    )


def _unhosted_unloaded_summary(decision: _Decision, num_experts: int) -> str | None:
    """The experts the current placement held no copy of although they received no load, or None.

    Their layers' ``balance_before`` is finite (no token went unserved in this window) and
    can even lie below ``lower_bound``, which holds for placements that host every expert.
    A dropless runtime needs a copy of each one for the tokens routed to it later, so the
    new placement has one, and that layer's max/mean can read worse than before.
    """
    original = decision.original
    slots = np.where(original >= 0, original, num_experts).reshape(original.shape[0], -1)
    missing = count_rows(slots, num_experts + 1)[:, :num_experts] == 0
    if decision.before is not None:
        missing[decision.before.unhosted_layer, decision.before.unhosted_expert] = False  # said already
    if not missing.any():
        return None
    return (
        f"the current placement held no copy of {int(missing.sum())} expert(s) that received no load"
        f" ({_named_experts(missing)}); every expert needs one for the tokens routed to it later, so"
        " they were re-created, which can raise those layers' max/mean above balance_before"
    )


def _settled(
    load: np.ndarray,
    fresh: np.ndarray,
    counts: np.ndarray,
    bound: np.ndarray,
    cluster: _Cluster,
    hierarchy: tuple[int, int, int] | None,
    min_improvement: float,
    balance_target: float,
) -> np.ndarray:
    """A fresh plan the repair of the next unchanged report keeps: ``fresh`` repaired until nothing moves.

    A fresh plan packs water-filled replica counts and swaps; the repair also hands
    a copy from one expert to another, and on small or skewed layers finds balance
    the fresh plan missed. Without this step, the first report's plan would move
    again on the second report with the same load. When every layer is already at
    its goal this is one pass of the repair's checks, which moves nothing.
    """
    layers, gpus, slots_per_gpu = load.shape[0], cluster.num_gpus, cluster.slots_per_gpu
    for _ in range(_SETTLE_ROUNDS):
        current = np.full((layers, gpus, slots_per_gpu), -1, dtype=np.int64)
        current[:, cluster.available] = fresh
        decision = _replace_incrementally(
            load,
            current.reshape(layers, -1),
            counts,
            bound,
            cluster,
            hierarchy,
            min_improvement=min_improvement,
            ignore_sampling_noise=False,
            max_replicas_moved=None,
            node_local=False,
            balance_target=balance_target,
            move_budget=None,
        )
        if (decision.action == "kept").all():
            break
        fresh = decision.final
    return fresh


def _fresh_plan(
    load: np.ndarray,
    counts: np.ndarray,
    bound: np.ndarray,
    layers: np.ndarray,
    slots_per_gpu: int,
    node_of_gpu: np.ndarray,
    hierarchy: tuple[int, int, int] | None = None,
    min_improvement: float = 0.0,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Fresh placement of ``layers``: slots ``(n, A, S)``, max/mean ``(n,)`` and policy ``(n,)`` per layer.

    Global policy: rounds of LPT, then swaps towards the bound. With
    ``hierarchy = (num_nodes, gpus_per_node, num_expert_groups)`` the hierarchical
    policy is tried too (:func:`_hierarchical_plan`) and kept for the layers where
    its max/mean is within ``min_improvement`` of the global one and it leaves no
    more slots empty.
    """
    sub = load[layers]
    gpus = node_of_gpu.size
    state = PlacementState(sub, pack_rounds(sub, counts[layers], gpus, slots_per_gpu))
    total = sub.sum(axis=1)
    goal = bound[layers] * (1.0 + _FRESH_TOLERANCE) * total / gpus
    polish_goal = (bound[layers] + _FRESH_POLISH_SLACK) * total / gpus
    swap_refine(state, np.arange(layers.size), goal, _FRESH_SWAP_ITERS, MoveContext(node_of_gpu), polish_goal)
    ratio = balance_ratio(state.gpu_load, total)
    policy = np.full(layers.size, "global", dtype="<U12")
    if hierarchy is None:
        return state.slots, ratio, policy
    h_slots, h_ratio = _hierarchical_plan(sub, *hierarchy, slots_per_gpu)
    # a node whose group has fewer experts than a GPU has slots leaves slots empty, where the
    # global plan serves with them (and a repair would fill them on the next report)
    take = (h_ratio <= ratio + min_improvement) & ((h_slots < 0).sum(axis=(1, 2)) <= (state.slots < 0).sum(axis=(1, 2)))
    slots = np.where(take[:, None, None], h_slots, state.slots)
    policy[take] = "hierarchical"
    return slots, np.where(take, h_ratio, ratio), policy


def _hierarchical_plan(
    load: np.ndarray, num_nodes: int, gpus_per_node: int, num_groups: int, slots_per_gpu: int
) -> tuple[np.ndarray, np.ndarray]:
    """EPLB's hierarchical policy, vectorised: whole expert groups per node, then replicas inside nodes.

    With group-limited routing (DeepSeek-V3 sends a token to experts of at most
    a few groups) keeping each group inside one node keeps a token's all-to-all
    inside those nodes. Groups go to nodes by LPT rounds on group load; each
    node then water-fills replica counts over its own GPUs and packs them like
    the global policy. Its balance is capped by how evenly whole groups split
    over nodes (one group per node leaves node load = group load), which is why
    the caller keeps it only where it is about as balanced as the global plan.
    Needs every GPU available, ``num_groups`` divisible by ``num_nodes``.
    """
    layers, experts = load.shape
    per_group = experts // num_groups
    group_load = load.reshape(layers, num_groups, per_group).sum(axis=2)
    groups_per_node = num_groups // num_nodes
    node_groups = pack_rounds(group_load, np.ones((layers, num_groups), dtype=np.int64), num_nodes, groups_per_node)
    node_experts = (node_groups[..., None] * per_group + np.arange(per_group)).reshape(layers * num_nodes, -1)
    local_load = np.take_along_axis(load, node_experts.reshape(layers, -1), axis=1).reshape(layers * num_nodes, -1)
    local_experts = local_load.shape[1]
    n_fill = min(gpus_per_node * slots_per_gpu, local_experts * gpus_per_node)
    counts, cap_lower = water_fill(local_load, gpus_per_node, n_fill)
    state = PlacementState(local_load, pack_rounds(local_load, counts, gpus_per_node, slots_per_gpu))
    local_total = local_load.sum(axis=1)
    local_goal = np.maximum(cap_lower, local_total / gpus_per_node)
    swap_refine(
        state,
        np.arange(state.slots.shape[0]),
        local_goal * (1.0 + _FRESH_TOLERANCE),
        _FRESH_SWAP_ITERS,
        MoveContext(np.zeros(gpus_per_node, dtype=np.int64)),
        local_goal * (1.0 + _FRESH_POLISH_SLACK),
    )
    local = state.slots  # (layers * nodes, gpus_per_node, S) local expert ids
    padded = np.concatenate([node_experts, np.full((node_experts.shape[0], 1), -1, dtype=np.int64)], axis=1)
    global_ids = np.take_along_axis(
        padded, np.where(local >= 0, local, local_experts).reshape(local.shape[0], -1), axis=1
    )
    slots = global_ids.reshape(layers, num_nodes * gpus_per_node, slots_per_gpu)
    gpu_load = state.gpu_load.reshape(layers, num_nodes * gpus_per_node)
    return slots, balance_ratio(gpu_load, load.sum(axis=1))


def _cross_writes(
    target: np.ndarray, original: np.ndarray, node_has: np.ndarray, node_of_gpu: np.ndarray
) -> np.ndarray:
    """Per layer, copies written whose expert has an original copy somewhere but not on the destination node."""
    layers, _gpus, _slots_per_gpu = target.shape
    rows = np.arange(layers)[:, None, None]
    write = (target != original) & (target >= 0)
    local = node_has[rows, node_of_gpu[None, :, None], target]
    # reduced over an axis of a 3-D array: always an array (numpy types ndarray.any as bool | array)
    node_anywhere: np.ndarray = node_has.any(axis=1)  # type: ignore[assignment]
    anywhere = node_anywhere[rows, target]
    cross: np.ndarray = (write & ~local & anywhere).sum(axis=(1, 2))
    return cross


def _result(
    load: np.ndarray,
    decision: _Decision,
    cluster: _Cluster,
    expert_bytes: int,
    bound: np.ndarray,
    reason: str,
    had_current: bool,
    measured: tuple[BalanceStats, np.ndarray],
    bound_by: str,
) -> RebalanceResult:
    """The answer: the placement on every physical slot, the slots of each expert, the
    copies to write (each with the nearest GPU that already holds it) and the balance
    (``measured``: :func:`_measure` of the final placement, also used for the reason)."""
    layers, experts = load.shape
    final, original = decision.final, decision.original
    available, gpus_per_node, slots_per_gpu = cluster.available, cluster.gpus_per_node, cluster.slots_per_gpu
    num_gpus, original_node_gpu = cluster.num_gpus, decision.original_node_gpu
    after, counts = measured
    physical: np.ndarray = np.full((layers, num_gpus, slots_per_gpu), -1, dtype=np.int64)
    physical[:, available] = final
    physical = physical.reshape(layers, -1)

    # migrations: every slot whose expert changes, with the nearest surviving copy as source
    write = (final != original) & (final >= 0)
    lay, gpu_a, slot = np.nonzero(write)
    expert = final[lay, gpu_a, slot]
    if had_current and lay.size:
        node_of = available // gpus_per_node
        if original_node_gpu is None:
            original_node_gpu = gpu_in_node(original, node_of, int(node_of.max()) + 1, experts)
        by_node = original_node_gpu[lay, :, expert]  # (n, nodes): a GPU per node holding it before
        local = by_node[np.arange(lay.size), node_of[gpu_a]]
        src_a = np.where(local >= 0, local, by_node.max(axis=1))
        has_src = src_a >= 0
        source = np.where(has_src, available[src_a], -1)
        cross = has_src & (node_of[src_a] != node_of[gpu_a])
    else:
        source = np.full(lay.size, -1, dtype=np.int64)
        cross = np.zeros(lay.size, dtype=bool)
    gpu = available[gpu_a]
    replaced = original[lay, gpu_a, slot]
    migrations = Migrations(
        layer=lay.astype(np.int64),
        gpu=gpu.astype(np.int64),
        slot=(gpu * slots_per_gpu + slot).astype(np.int64),
        logical_expert=expert.astype(np.int64),
        source_gpu=source.astype(np.int64),
        cross_node=cross,
        bytes_per_copy=expert_bytes,
        replaced_expert=replaced.astype(np.int64),
    )
    return RebalanceResult(
        physical_to_logical=physical,
        logical_count=counts.astype(np.int64),
        balance_before=decision.before,
        balance_after=after,
        lower_bound=BalanceStats.of(bound),
        migrations=migrations,
        layer_action=decision.action,
        layer_policy=decision.policy,
        kept_current=bool((decision.action == "kept").all()) and had_current,
        reason=reason,
        bound_by=bound_by,
        lost_experts=decision.lost_experts,
        repaired_layers=decision.repaired_layers,
    )
