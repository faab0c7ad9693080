"""A ``PlacementResult`` as the stored plan document (DESIGN.md "Plan").

Names instead of ids, floats instead of numpy scalars. The document also keeps
what the trace and the HTML view need (the Chrome trace and a compact Gantt),
for plans small enough that keeping the full timeline is cheap.
"""

from __future__ import annotations

import numpy as np

from partitioners.costmodel.costs import cost_model_to_json
from partitioners.costmodel.trace import to_chrome_trace
from partitioners.hardware.inventory import LINK_CLASS_NAMES, Inventory
from partitioners.placement.engine import PlacementResult
from partitioners.placement.schedule import plan_schedule

__all__ = ["plan_document", "schedule_document", "TIMELINE_MAX_OPS", "GANTT_MAX_OPS"]

#: Plans of up to this many (expanded) operators keep their full timeline.
TIMELINE_MAX_OPS = 200_000
#: The HTML view draws at most this many operators.
GANTT_MAX_OPS = 20_000


def _finite(x: float) -> float | None:
    return float(x) if np.isfinite(x) else None


def _optimality(result: PlacementResult) -> dict:
    """The plan's lower bound, its gap and (strategy exact) the solver's outcome."""
    b = result.bounds
    gap = result.optimality_gap
    out: dict = {
        "lower_bound_s": None if b is None else float(b.lower_bound_s),
        "optimality_gap": None if gap is None else _finite(gap),
        "lower_bound_by": None if b is None else b.binding,
        "lower_bounds_s": None if b is None else {k: float(v) for k, v in b.by_bound_s.items()},
        "exact": None,
    }
    e = result.exact
    if e is not None:
        out["exact"] = {
            "status": e.status,
            "bound_s": _finite(e.bound_s),
            "objective_s": _finite(e.objective_s),
            "solve_time_s": float(e.solve_time_s),
        }
    return out


def _summary(result: PlacementResult, inventory: Inventory) -> dict:
    sim = result.simulation
    names = [str(n) for n in inventory.device_names]
    peak = np.asarray(sim.peak_memory_bytes if sim.peak_memory_bytes is not None else np.zeros(inventory.n_devices))
    used = np.unique(result.placement)
    busy = np.asarray(sim.device_busy_s)[used]
    imbalance = float(busy.max() / busy.mean()) if busy.size and busy.mean() > 0 else 1.0
    high_water = result.memory_plan.high_water_bytes  # (n_devices, n_tiers): level-3 address high-water marks
    one_device = [c.makespan_s for c in result.candidates if c.strategy == "single"]
    summary = {
        "makespan_s": float(sim.makespan_s),
        "comm_bytes": float(sim.comm_bytes),
        "comm_bytes_by_link_class": {k: float(v) for k, v in sim.comm_bytes_by_class.items()},
        "peak_memory_bytes": {names[d]: float(peak[d]) for d in used.tolist()},
        "peak_memory_by_tier_bytes": {
            names[d]: {
                tier: float(high_water[d, t])
                for t, tier in enumerate(inventory.tier_names)
                if inventory.tier_capacity_bytes[d, t] > 0
            }
            for d in used.tolist()
        },
        "capacity_bytes": {names[d]: float(inventory.device_memory_bytes[d]) for d in used.tolist()},
        "imbalance": imbalance,
        "feasible": bool(result.feasible),
        "devices_used": int(result.devices_used),
        "one_device_makespan_s": float(one_device[0]) if one_device else None,
        # the chosen candidate as scored against the others (main memory only, before
        # level 3 re-times it with tier bandwidths): compare one_device_makespan_s with this
        "makespan_before_tiers_s": float(result.chosen.makespan_s),
        # whether makespan_s and the trace time operators with their tensors' tiers (what
        # runtime feedback is compared with)
        "timed_with_tiers": bool(result.timed_with_tiers),
        "infeasible_reason": None,
        "fusion": _fusion_summary(result),
        "energy_j": None if result.energy is None else result.energy.total_j,
        "energy": None
        if result.energy is None
        else {
            "compute_j": result.energy.compute_j,
            "idle_j": result.energy.idle_j,
            "transfer_j": result.energy.transfer_j,
            "devices_counted": result.energy.devices_counted,
        },
        # the profile and the resolved parameters that timed the plan, and how each operator was timed
        "cost_model": cost_model_to_json(result.cost_model) if result.cost_model is not None else None,
        "cost_sources": dict(result.cost_sources),
    }
    summary.update(_optimality(result))
    if not result.feasible and result.infeasible_device is not None:
        summary["infeasible_reason"] = (
            f"device {names[result.infeasible_device]} is {result.bytes_over:.0f} bytes over its memory budget"
        )
    state = result.training_state()
    if state is not None:
        summary["training_state_bytes"] = {
            names[d]: {
                "parameters": float(state.parameter_bytes[d]),
                "gradients": float(state.gradient_bytes[d]),
                "optimizer_state": float(state.optimizer_state_bytes[d]),
            }
            for d in used.tolist()
        }
    return summary


def _fusion_summary(result: PlacementResult) -> dict | None:
    fusion = result.fusion
    if fusion is None:
        return None
    size = fusion.group_size
    return {
        "mode": fusion.mode,
        "groups": int((size > 1).sum()),
        "ops_fused": int(size[size > 1].sum()),
        "launches_saved": fusion.launches_saved,
        "bytes_saved": float(fusion.bytes_saved.sum()),
    }


def _fusion_groups(result: PlacementResult) -> list[dict] | None:
    """Each fused kernel of several operators, its members in topological order."""
    fusion = result.fusion
    if fusion is None:
        return None
    size = fusion.group_size
    multi = np.flatnonzero(size > 1)
    members: dict[int, list[str]] = {int(g): [] for g in multi.tolist()}
    for op in fusion.topological_order.tolist():
        group = int(fusion.op_group[op])
        if group in members:
            members[group].append(str(fusion.op_names[op]))
    return [
        {
            "name": str(fusion.op_names[fusion.group_anchor[g]]),
            "ops": members[g],
            "bytes_saved": float(fusion.bytes_saved[g]),
        }
        for g in multi.tolist()
    ]


def _candidates(result: PlacementResult) -> list[dict]:
    return [
        {
            "strategy": c.strategy,
            "makespan_s": float(c.makespan_s) if np.isfinite(c.makespan_s) else None,
            "feasible": bool(c.feasible),
            "comm_bytes": float(c.comm_bytes) if np.isfinite(c.comm_bytes) else None,
            "devices_used": int(c.devices_used),
            "note": c.note,
        }
        for c in result.candidates
    ]


def _tensors(result: PlacementResult, inventory: Inventory) -> dict[str, list[dict]]:
    """Tensor name -> one ``{device, tier, offset}`` per device holding it (tier None: fits nowhere)."""
    graph, plan = result.graph, result.memory_plan
    device_names, tiers = inventory.device_names, inventory.tier_names
    out: dict[str, list[dict]] = {}
    for tensor, device, tier, offset in zip(
        plan.tensor.tolist(), plan.device.tolist(), plan.tier.tolist(), plan.offset_bytes.tolist()
    ):
        out.setdefault(str(graph.tensor_names[tensor]), []).append(
            {"device": str(device_names[device]), "tier": tiers[tier] if tier >= 0 else None, "offset": int(offset)}
        )
    return out


def schedule_document(result: PlacementResult, inventory: Inventory) -> dict:
    """The plan's ``schedule`` (docs/api.md): operators per device in execution order,
    transfers and tier holdings with the times the prediction assumes, by name."""
    s = plan_schedule(result, inventory)
    graph = result.graph
    op_names = graph.op_names.tolist()
    tensor_names = graph.tensor_names.tolist()
    device_names = [str(n) for n in inventory.device_names.tolist()]
    tier_names = inventory.tier_names
    start, end = s.op_start_s.tolist(), s.op_end_s.tolist()
    order, ptr = s.op_order.tolist(), s.device_ptr.tolist()
    micro = s.op_micro_batch.tolist() if s.op_micro_batch is not None else None
    devices = []
    for d, name in enumerate(device_names):
        ops = order[ptr[d] : ptr[d + 1]]
        if not ops:
            continue
        if micro is None:
            entries = [{"op": op_names[o], "start_s": start[o], "end_s": end[o]} for o in ops]
        else:  # optimizer steps (micro-batch -1) serve every micro-batch: no micro_batch key
            entries = [
                {"op": op_names[o], "start_s": start[o], "end_s": end[o], "micro_batch": micro[o]}
                if micro[o] >= 0
                else {"op": op_names[o], "start_s": start[o], "end_s": end[o]}
                for o in ops
            ]
        devices.append({"device": name, "ops": entries})
    transfers = [
        {
            "tensor": tensor_names[t],
            "src": device_names[a],
            "dst": [device_names[b]],
            "link_class": LINK_CLASS_NAMES[c],
            "bytes": n_bytes,
            "start_s": t0,
            "end_s": t1,
        }
        for t, a, b, c, n_bytes, t0, t1 in zip(
            s.transfer_tensor.tolist(),
            s.transfer_src.tolist(),
            s.transfer_dst.tolist(),
            s.transfer_link_class.tolist(),
            s.transfer_bytes.tolist(),
            s.transfer_start_s.tolist(),
            s.transfer_end_s.tolist(),
        )
    ]
    holdings = [
        {
            "tensor": tensor_names[t],
            "device": device_names[d],
            "tier": tier_names[k] if k >= 0 else None,
            "offset_bytes": offset,
            "size_bytes": size,
            "live_from_s": t0,
            "live_until_s": t1,
        }
        for t, d, k, offset, size, t0, t1 in zip(
            s.holding_tensor.tolist(),
            s.holding_device.tolist(),
            s.holding_tier.tolist(),
            s.holding_offset_bytes.tolist(),
            s.holding_size_bytes.tolist(),
            s.holding_live_from_s.tolist(),
            s.holding_live_until_s.tolist(),
        )
    ]
    return {"devices": devices, "transfers": transfers, "holdings": holdings}


def _view(result: PlacementResult, inventory: Inventory, summary: dict) -> dict:
    sim = result.simulation
    graph = result.graph
    names = [str(n) for n in inventory.device_names]
    used = sorted(set(result.placement.tolist()))
    row_of = {d: i for i, d in enumerate(used)}
    order = np.argsort(sim.op_start_s, kind="stable")[:GANTT_MAX_OPS]
    origin = result.expanded.op_micro_batch
    gantt = [
        [
            row_of[int(result.placement[op])],
            float(sim.op_start_s[op]),
            float(sim.op_end_s[op] - sim.op_start_s[op]),
            str(graph.op_names[op]),
            int(max(origin[op], 0)),
        ]
        for op in order.tolist()
    ]
    by_tier = summary["peak_memory_by_tier_bytes"]
    devices = []
    for d in used:
        tiers = []
        for t, tier in enumerate(inventory.tier_names):
            capacity = float(inventory.tier_capacity_bytes[d, t])
            if capacity > 0:
                tiers.append({"name": tier, "capacity_bytes": capacity, "peak_bytes": by_tier[names[d]][tier]})
        devices.append(
            {"name": names[d], "group": str(inventory.group_names[inventory.device_group[d]]), "tiers": tiers}
        )
    traffic: dict[tuple[int, int], float] = {}
    groups = inventory.device_group
    for src, dst, n_bytes in zip(sim.link_src.tolist(), sim.link_dst.tolist(), sim.link_bytes.tolist()):
        key = (int(groups[src]), int(groups[dst]))
        traffic[key] = traffic.get(key, 0.0) + float(n_bytes)
    group_traffic = [
        {"src_group": str(inventory.group_names[a]), "dst_group": str(inventory.group_names[b]), "bytes": v}
        for (a, b), v in sorted(traffic.items())
        if a != b
    ]
    return {
        "devices": devices,
        "gantt": gantt,
        "gantt_truncated": graph.n_ops > GANTT_MAX_OPS,
        "group_traffic": group_traffic,
    }


def plan_document(result: PlacementResult, inventory: Inventory) -> tuple[str, dict, dict]:
    """``(strategy, summary, body)``: body holds ops, tensors, transfers, schedule, candidates, trace, view."""
    graph = result.graph
    device_names = inventory.device_names
    summary = _summary(result, inventory)
    body: dict = {
        "ops": dict(zip(graph.op_names.tolist(), device_names[result.placement].tolist())),
        "tensors": _tensors(result, inventory),
        "transfers": result.transfers.grouped(graph, inventory),
        "schedule": schedule_document(result, inventory),
        "candidates": _candidates(result),
        "fusion_groups": _fusion_groups(result),
        "notes": list(result.notes),
        # operator ids in predicted start order: simulating with this order as the
        # priority replays the plan's schedule (feedback compares against it)
        "start_order": np.lexsort((np.arange(graph.n_ops), result.simulation.op_start_s)).tolist(),
    }
    if graph.n_ops <= TIMELINE_MAX_OPS:
        body["trace"] = to_chrome_trace(result.simulation, graph, inventory)
        body["view"] = _view(result, inventory, summary)
    return result.strategy, summary, body
