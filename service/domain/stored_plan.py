"""A finished plan rebuilt from storage, and what it predicts under a given cost model.

Feedback, accuracy and re-plans compare measurements with the plan's own
predictions, so they rebuild the plan as it was made: the graph as stored (plans
are made on it, see :meth:`~service.domain.ingest.IngestedGraph.as_stored`), the
placement, the memory tiers its times used (``summary.timed_with_tiers``) and the
order its schedule ran operators in (``start_order``), replayed as list-scheduling
priorities.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from sqlalchemy.orm import Session

from partitioners.costmodel.costs import CostModel, op_times_by_profile_s
from partitioners.costmodel.simulator import simulate
from partitioners.graph.hypergraph import Hypergraph
from partitioners.graph.transforms import expand_graph
from partitioners.hardware.inventory import Inventory
from partitioners.placement.context import with_node_times
from partitioners.placement.fusion import fuse_for_placement
from partitioners.placement.memory_tiers import UNPLACED, placed_tier_op_times_s
from service.domain import plan_views
from service.domain.calibration import split_stored_options
from service.domain.ingest import IngestedGraph
from service.domain.planning import load_plan_inputs
from service.errors import Conflict

__all__ = ["PlanContext", "plan_context", "plan_op_times_s", "plan_predictions"]


@dataclass(frozen=True)
class PlanContext:
    """A finished plan as plain data: the placed graph, its inventory and placement."""

    plan_id: str
    graph_id: str
    model_hash: str
    inventory_hash: str
    options: dict  # the user's
    calibration: dict | None  # the factors document the plan was made with (re-plans), else None
    summary: dict
    graph: Hypergraph
    inventory: Inventory
    placement: np.ndarray
    ops: dict[str, str]
    n_source_ops: int
    # the plan's graph as stored (before the training/micro-batch expansion), for re-plans
    stored_graph: IngestedGraph | None = None
    # (tensor, device, tier) ids of the plan's level-3 holdings when its times used them
    tier_holdings: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None
    # list-scheduling priority that replays the plan's schedule (None: plans stored without it)
    priority: np.ndarray | None = None


def _replay_priority(body: dict, graph: Hypergraph) -> np.ndarray | None:
    """Priorities that make the simulator run the plan's operators in its predicted start order.

    ``start_order`` holds positions in the plan's ``ops`` mapping (the placed graph's
    operator order); they are mapped by name, as the graph is rebuilt from storage.
    """
    order, ops = body.get("start_order"), body.get("ops") or {}
    if not isinstance(order, list) or len(order) != graph.n_ops or len(ops) != graph.n_ops:
        return None
    index = {str(name): i for i, name in enumerate(graph.op_names)}
    planned = [index.get(name, -1) for name in ops]
    if min(planned, default=0) < 0:
        return None
    rank = np.empty(graph.n_ops, dtype=np.float64)
    rank[[planned[position] for position in order]] = np.arange(graph.n_ops, 0, -1, dtype=np.float64)
    return rank


def _tier_holdings(
    body: dict, summary: dict, graph: Hypergraph, inventory: Inventory
) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """The stored plan's tensor tiers as id arrays, if its predicted times used them.

    Plans stored before ``timed_with_tiers`` was recorded were re-timed exactly when
    level 3 brought their makespan below the main-memory one.
    """
    timed = summary.get("timed_with_tiers")
    if timed is None:
        before = summary.get("makespan_before_tiers_s")
        timed = before is not None and summary.get("makespan_s", before) < before
    if not timed:
        return None
    tensor_index = {str(n): i for i, n in enumerate(graph.tensor_names)}
    device_index = {str(n): i for i, n in enumerate(inventory.device_names)}
    tier_index = {str(n): i for i, n in enumerate(inventory.tier_names)}
    rows = [
        (tensor_index[name], device_index[holding["device"]], tier_index.get(holding.get("tier"), UNPLACED))
        for name, holdings in (body.get("tensors") or {}).items()
        if name in tensor_index
        for holding in holdings
        if holding.get("device") in device_index
    ]
    columns = np.array(rows, dtype=np.int64).reshape(-1, 3)
    return columns[:, 0], columns[:, 1], columns[:, 2]


def plan_context(session: Session, tenant_id: str, plan_id: str) -> PlanContext:
    """The tenant's finished plan ``plan_id`` rebuilt from storage (404 if absent, 409 if not done)."""
    plan = plan_views.finished_plan(session, tenant_id, plan_id)
    stored, inventory = load_plan_inputs(session, plan)
    original = stored.graph
    options, factors = split_stored_options(plan.options)
    # a fused plan placed the groups: rebuild the graph it placed
    placed, _ = fuse_for_placement(original, options.get("fusion", "none"))
    expanded = with_node_times(
        expand_graph(placed, mode=options.get("mode", "inference"), micro_batches=options.get("micro_batches", 1)),
        placed,
    )
    body = plan_views.plan_body(plan)
    ops = body.get("ops") or {}
    index = {str(n): i for i, n in enumerate(inventory.device_names)}
    placement = np.array([index.get(ops.get(str(n)), -1) for n in expanded.graph.op_names], dtype=np.int64)
    if (placement < 0).any():
        raise Conflict(f"Plan {plan_id} does not place every operator of its graph; it cannot take feedback.")
    return PlanContext(
        plan_id=plan.id,
        graph_id=plan.graph_id,
        model_hash=plan.model_hash,
        inventory_hash=plan.inventory_hash,
        options=options,
        calibration=factors,
        summary=dict(plan.summary or {}),
        graph=expanded.graph,
        inventory=inventory,
        placement=placement,
        ops={str(k): str(v) for k, v in ops.items()},
        n_source_ops=int(original.n_ops),
        stored_graph=stored,
        tier_holdings=_tier_holdings(body, dict(plan.summary or {}), expanded.graph, inventory),
        priority=_replay_priority(body, expanded.graph),
    )


def _placed_times_s(ctx: PlanContext, model: CostModel) -> np.ndarray | None:
    """Each operator's predicted time on its planned device with the plan's tiers, or None without them."""
    if ctx.tier_holdings is None:
        return None
    return placed_tier_op_times_s(ctx.graph, ctx.inventory, ctx.placement, *ctx.tier_holdings, cost_model=model)


def _with_plan_tiers(
    ctx: PlanContext, times_s: np.ndarray, placed_s: np.ndarray | None, op: np.ndarray, device: np.ndarray
) -> np.ndarray:
    """``times_s`` with the plan's tiered times where the operator ran where the plan put it."""
    if placed_s is None:
        return times_s
    return np.where(ctx.placement[op] == device, placed_s[op], times_s)


def plan_op_times_s(
    ctx: PlanContext, model: CostModel, op: np.ndarray, device: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """What the plan predicts, under ``model``, for operator ``op[i]`` run on ``device[i]``:
    the main-memory roofline, and the roofline with the plan's memory tiers (its tensors at
    their tiers' bandwidths where the plan was timed with them and the operator ran where
    the plan put it; the same as the first elsewhere)."""
    times, profile = op_times_by_profile_s(ctx.graph, ctx.inventory, model)
    main = times[op, profile[device]]
    return main, _with_plan_tiers(ctx, main, _placed_times_s(ctx, model), op, device)


def plan_predictions(
    ctx: PlanContext, model: CostModel, op: np.ndarray, device: np.ndarray, *, with_tiers: bool
) -> tuple[np.ndarray, float]:
    """The plan's predictions under ``model``: per (operator, device) run, and the makespan
    of the plan's schedule (its placement, in its order) with those times."""
    placed = _placed_times_s(ctx, model) if with_tiers else None
    # a fixed placement reads only each operator's own column: one column, broadcast
    table = None if placed is None else np.broadcast_to(placed[:, None], (ctx.graph.n_ops, ctx.inventory.n_devices))
    makespan = simulate(
        ctx.graph,
        ctx.inventory,
        ctx.placement,
        op_times_s=table,
        cost_model=model,
        priority=ctx.priority,
        record_timeline=False,
    ).makespan_s
    times, profile = op_times_by_profile_s(ctx.graph, ctx.inventory, model)
    return _with_plan_tiers(ctx, times[op, profile[device]], placed, op, device), float(makespan)
