"""Repairs that make a candidate placement valid: device types, and acyclic pipeline stages.

Every candidate strategy is built as it would be without these rules; scoring
(:mod:`partitioners.placement.scoring`) then applies them, so each strategy stays
simple and every strategy obeys them the same way.

Device types
    A restricted operator on a device it may not use moves to an allowed one
    (where most of its neighbours' bytes are, else the least loaded, keeping
    operators that METIS put together together), see
    :func:`~partitioners.hardware.device_types.move_to_allowed`. Across node
    groups METIS first moves restricted operators to a group that has their types
    (:func:`groups_allowed`), then to an allowed device of that group
    (:func:`devices_in_groups_allowed`).
Pipeline stages
    In pipeline mode the stage graph must be acyclic in each phase; acyclic repair
    (:func:`~partitioners.placement.acyclic.acyclic_repair`, after Herrmann et al.
    [1]_) runs on the forward edges, and gradient and optimizer operators follow
    their forward twin (as in GPipe [2]_ and 1F1B [3]_).

References
----------
.. [1] J. Herrmann, M. Y. Özkaya, B. Uçar, K. Kaya, Ü. V. Çatalyürek, "Multilevel
   Algorithms for Acyclic Partitioning of Directed Acyclic Graphs", SIAM J. Sci.
   Comput. 41(4), 2019.
.. [2] Y. Huang et al., "GPipe: Efficient Training of Giant Neural Networks using
   Pipeline Parallelism", NeurIPS 2019.
.. [3] D. Narayanan et al., "PipeDream: Generalized Pipeline Parallelism for DNN
   Training", SOSP 2019.
"""

from __future__ import annotations

import numpy as np

from partitioners.hardware.device_types import move_to_allowed
from partitioners.placement.acyclic import acyclic_repair
from partitioners.placement.context import PlacementContext
from partitioners.placement.pipeline import quotient_is_acyclic

__all__ = [
    "keep_on_allowed_devices",
    "groups_allowed",
    "devices_in_groups_allowed",
    "stage_graph_acyclic",
    "pipeline_repair",
]


def keep_on_allowed_devices(ctx: PlacementContext, placement: np.ndarray) -> tuple[np.ndarray, int]:
    """Move restricted operators off devices they may not use, to usable devices they may.

    Returns
    -------
    placement : numpy.ndarray of int64
        ``placement`` itself when the graph names no device types.
    moved : int
        How many operators moved.
    """
    c = ctx.constraint
    if c is None:
        return placement, 0
    return move_to_allowed(
        placement,
        c.op_allowed_set,
        c.allowed & ctx.usable,
        ctx.reference_times_s,
        ctx.device_speed,
        ctx.edges_with_bytes,
    )


def groups_allowed(
    ctx: PlacementContext, group_part: np.ndarray, group_devices: np.ndarray, group_speed: np.ndarray
) -> np.ndarray:
    """Level 1: restricted operators to a group that has a device of their types.

    ``group_devices[i, d]`` says whether device ``d`` is one of group ``i``'s
    devices in this split.
    """
    c = ctx.constraint
    assert c is not None
    row_groups = (c.allowed.astype(np.int64) @ group_devices.T.astype(np.int64)) > 0
    moved, _ = move_to_allowed(
        group_part, c.op_allowed_set, row_groups, ctx.reference_times_s, group_speed, ctx.edges_with_bytes
    )
    return moved


def devices_in_groups_allowed(
    ctx: PlacementContext, placement: np.ndarray, group_part: np.ndarray, group_devices: np.ndarray
) -> np.ndarray:
    """Level 2: restricted operators to an allowed device of the group level 1 chose.

    One row per (list of types, group): the list's devices inside that group.
    """
    c = ctx.constraint
    assert c is not None
    n_groups = group_devices.shape[0]
    rows = (c.allowed[:, None, :] & group_devices[None, :, :]).reshape(-1, ctx.inventory.n_devices)
    moved, _ = move_to_allowed(
        placement,
        c.op_allowed_set * n_groups + group_part,
        rows,
        ctx.reference_times_s,
        ctx.device_speed,
        ctx.edges_with_bytes,
    )
    return moved


def stage_graph_acyclic(ctx: PlacementContext, placement: np.ndarray) -> bool:
    """Acyclic per phase: forward edges never return to an earlier stage, nor
    gradient edges (which flow the other way by design, as in GPipe and 1F1B)."""
    if not quotient_is_acyclic(ctx.graph, placement, ctx.forward_edge_mask):
        return False
    return not ctx.backward_edge_mask.any() or quotient_is_acyclic(ctx.graph, placement, ctx.backward_edge_mask)


def pipeline_repair(ctx: PlacementContext, placement: np.ndarray) -> np.ndarray:
    """Acyclic repair on forward edges; gradient and optimizer ops follow their forward twin.

    A placement whose stage graph is already acyclic in each phase is returned as
    it is (the same object, which callers use to tell that nothing changed).
    """
    if stage_graph_acyclic(ctx, placement):
        return placement
    used = np.unique(placement)
    parts = np.searchsorted(used, placement)
    fwd = ctx.forward_edge_mask
    stage, part_of_stage = acyclic_repair(ctx.n_ops, ctx.edge_src[fwd], ctx.edge_dst[fwd], ctx.levels, parts)
    out: np.ndarray = used[part_of_stage[stage]][ctx.forward_twin]
    return out
