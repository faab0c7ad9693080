"""The schedule a plan was predicted under, as a runtime has to follow it.

A plan's operator -> device map and its tier offsets are not enough to run it: the
offsets of level 3 (:mod:`partitioners.placement.memory_tiers`) reuse an address range
only because one tensor is dead before the next is made, which holds under the
simulated operator order and no other. :func:`plan_schedule` collects, from the final
simulation and the memory plan made on it, what a runtime must reproduce:

* per device, its operators in execution order with predicted start and end times;
* every transfer (one per tensor and receiving device) with its predicted start and end;
* every tier holding with the live interval the tier planner placed it for,
  ``[live_from_s, live_until_s)``: two holdings of one tier share addresses only
  where these intervals do not overlap.

Arrays only; the service renders them by name.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from partitioners.graph.hypergraph import topological_order
from partitioners.hardware.inventory import Inventory, link_class_ids
from partitioners.placement.result import PlacementResult

__all__ = ["PlanSchedule", "plan_schedule"]


@dataclass(frozen=True, eq=False)
class PlanSchedule:
    """The final plan's schedule, by id.

    Attributes
    ----------
    device_ptr : numpy.ndarray of int64, shape (n_devices + 1,)
        Device ``d`` runs ``op_order[device_ptr[d]:device_ptr[d + 1]]``, in that order.
    op_order : numpy.ndarray of int64, shape (n_ops,)
        Operator ids grouped by device, each device's in execution order: by start
        time, then end time (an operator of zero duration runs before the one that
        starts with it and takes time), then topological rank (a producer of zero
        duration before its consumer at the same instant).
    op_start_s, op_end_s : numpy.ndarray of float64, shape (n_ops,)
        Predicted start and end of every operator, by operator id.
    op_micro_batch : numpy.ndarray of int64 or None, shape (n_ops,)
        Micro-batch of every operator (``-1`` for optimizer steps, shared by all) when
        the plan is for more than one micro-batch; None otherwise.
    transfer_tensor, transfer_src, transfer_dst : numpy.ndarray of int64, shape (n_transfers,)
    transfer_link_class : numpy.ndarray of int8
        :data:`partitioners.hardware.inventory.LINK_CLASS_NAMES` index.
    transfer_bytes, transfer_start_s, transfer_end_s : numpy.ndarray of float64
        One row per simulated transfer, in the order the simulation issued them.
    holding_tensor, holding_device, holding_tier, holding_offset_bytes, holding_size_bytes : numpy.ndarray of int64
        The memory plan's holdings (tier ``-1``: fits nowhere, infeasible plans only).
    holding_live_from_s, holding_live_until_s : numpy.ndarray of float64
        The live interval each holding was placed for (the tier planner's own).
    """

    device_ptr: np.ndarray
    op_order: np.ndarray
    op_start_s: np.ndarray
    op_end_s: np.ndarray
    op_micro_batch: np.ndarray | None
    transfer_tensor: np.ndarray
    transfer_src: np.ndarray
    transfer_dst: np.ndarray
    transfer_link_class: np.ndarray
    transfer_bytes: np.ndarray
    transfer_start_s: np.ndarray
    transfer_end_s: np.ndarray
    holding_tensor: np.ndarray
    holding_device: np.ndarray
    holding_tier: np.ndarray
    holding_offset_bytes: np.ndarray
    holding_size_bytes: np.ndarray
    holding_live_from_s: np.ndarray
    holding_live_until_s: np.ndarray


def plan_schedule(result: PlacementResult, inventory: Inventory) -> PlanSchedule:
    """The schedule of ``result``: its final simulation and the memory plan made on it.

    :func:`~partitioners.placement.final_plan.finish_placement` plans the tiers on the
    very simulation it returns (re-timed or not), so the holdings' live intervals are
    the ones this schedule implies. Vectorised: a sort over the operators and copies.

    Parameters
    ----------
    result : PlacementResult
    inventory : Inventory
        The inventory ``result`` was planned on.

    Returns
    -------
    PlanSchedule
    """
    sim, plan, graph = result.simulation, result.memory_plan, result.graph
    n_ops = graph.n_ops
    device = np.asarray(sim.op_device, dtype=np.int64)
    topo_rank = np.empty(n_ops, dtype=np.int64)
    topo_rank[topological_order(graph)] = np.arange(n_ops, dtype=np.int64)
    order = np.lexsort((topo_rank, sim.op_end_s, sim.op_start_s, device))
    device_ptr = np.zeros(inventory.n_devices + 1, dtype=np.int64)
    np.cumsum(np.bincount(device, minlength=inventory.n_devices), out=device_ptr[1:])
    expanded = result.expanded
    micro = np.asarray(expanded.op_micro_batch, dtype=np.int64) if expanded.micro_batches > 1 else None
    return PlanSchedule(
        device_ptr=device_ptr,
        op_order=order.astype(np.int64),
        op_start_s=np.asarray(sim.op_start_s, dtype=np.float64),
        op_end_s=np.asarray(sim.op_end_s, dtype=np.float64),
        op_micro_batch=micro,
        transfer_tensor=sim.transfer_tensor,
        transfer_src=sim.transfer_src,
        transfer_dst=sim.transfer_dst,
        transfer_link_class=link_class_ids(inventory, sim.transfer_src, sim.transfer_dst),
        transfer_bytes=sim.transfer_bytes,
        transfer_start_s=sim.transfer_start_s,
        transfer_end_s=sim.transfer_end_s,
        holding_tensor=plan.tensor,
        holding_device=plan.device,
        holding_tier=plan.tier,
        holding_offset_bytes=plan.offset_bytes,
        holding_size_bytes=plan.size_bytes,
        holding_live_from_s=plan.alloc_s,
        holding_live_until_s=plan.free_s,
    )
