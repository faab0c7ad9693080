"""Which devices an operator may run on: the graph's per-node ``device_types``.

A node may name the device types its kernel exists for (DESIGN.md "Data shapes":
``"device_types"``). The placement strategies of :mod:`partitioners.placement.engine`
place as if every device were allowed, then :func:`move_to_allowed` moves each
operator that landed on a device (or device group) it may not use to the allowed
one that costs least, and HEFT and refinement only ever consider allowed devices.
Operators with the same list share one boolean row over the devices, so a graph
that restricts a few kinds of operators costs one integer per operator, never an
``(n_ops, n_devices)`` matrix; graphs without lists skip all of it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from partitioners.errors import InvalidInput
from partitioners.graph.hypergraph import Hypergraph
from partitioners.hardware.inventory import Inventory

__all__ = [
    "DeviceTypeConstraint",
    "device_type_constraint",
    "move_to_allowed",
    "op_working_set_bytes",
    "type_list",
]


@dataclass(frozen=True, eq=False)
class DeviceTypeConstraint:
    """The devices each operator may run on, from the graph's per-node ``device_types``.

    Operators with the same list of types share one row of ``allowed``: a graph
    restricts a few kinds of operators, so this costs one integer per operator and
    one boolean row per distinct list, never an ``(n_ops, n_devices)`` matrix.
    Operator ``v`` may run on device ``d`` exactly when
    ``allowed[op_allowed_set[v], d]``.

    Attributes
    ----------
    op_allowed_set : numpy.ndarray of int64, shape (n_ops,)
        Row of ``allowed`` of every operator.
    allowed : numpy.ndarray of bool, shape (n_sets, n_devices)
        Devices of the inventory each distinct list admits (a row of ``True`` for
        operators without a list).
    set_types : tuple
        The list of device types of each row (``None`` for "any device").
    """

    op_allowed_set: npt.NDArray[np.int64]
    allowed: npt.NDArray[np.bool_]
    set_types: tuple[tuple[str, ...] | None, ...]

    def allows(self, placement: npt.NDArray[np.int64]) -> npt.NDArray[np.bool_]:
        """Per operator, whether ``placement`` puts it on a device it may run on."""
        return self.allowed[self.op_allowed_set, placement]


def type_list(types: tuple[str, ...] | None) -> str:
    return ", ".join(types) if types else "any"


def device_type_constraint(
    graph: Hypergraph, inventory: Inventory, op_origin: npt.NDArray[np.int64] | None = None
) -> DeviceTypeConstraint | None:
    """The allowed devices of every operator, or ``None`` when nothing is restricted.

    ``None`` covers graphs without ``device_types`` and graphs whose lists admit
    every device of ``inventory``, so such plans are built exactly as before.

    Parameters
    ----------
    graph : Hypergraph
        The graph as submitted (``graph.op_device_types``).
    inventory : Inventory
    op_origin : numpy.ndarray of int64, optional
        Operator of ``graph`` each operator of an expanded graph derives from
        (:attr:`~partitioners.graph.transforms.ExpandedGraph.op_origin`): a gradient
        operator and an optimizer step run where their forward operator may.

    Returns
    -------
    DeviceTypeConstraint or None
        Over the operators of the expanded graph when ``op_origin`` is given.

    Raises
    ------
    InvalidInput
        An operator lists no device type the inventory has (``code="no-device-of-type"``);
        the message names the operator, its types and the types the inventory offers.
    """
    types = graph.op_device_types
    if types is None:
        return None
    row_of_list: dict[tuple[str, ...] | None, int] = {}
    op_set = np.fromiter(
        (row_of_list.setdefault(t, len(row_of_list)) for t in types.tolist()), dtype=np.int64, count=graph.n_ops
    )
    set_types = tuple(row_of_list)
    device_types = inventory.device_types.tolist()
    allowed = np.ones((len(set_types), inventory.n_devices), dtype=bool)
    for row, listed in enumerate(set_types):
        if listed is not None:
            wanted = set(listed)
            allowed[row] = np.fromiter((t in wanted for t in device_types), dtype=bool, count=len(device_types))
    unplaceable = ~allowed.any(axis=1)
    if unplaceable.any():
        # np.asarray: numpy types ``any(axis=1)`` as a scalar or an array; here it is an array
        ops = np.flatnonzero(np.asarray(unplaceable)[op_set])
        op = int(ops[0])
        more = f" (and {ops.shape[0] - 1} more operator{'s' if ops.shape[0] > 2 else ''})" if ops.shape[0] > 1 else ""
        raise InvalidInput(
            f"operator '{graph.op_names[op]}'{more} may run only on device type(s) {type_list(types[op])}, and "
            f"inventory '{inventory.name}' has no device of those types (its types: "
            f"{type_list(tuple(dict.fromkeys(device_types)))}); list a type the inventory has in the node's "
            '"device_types", leave the field out, or add such a device',
            field="graph.nodes.device_types",
            code="no-device-of-type",
        )
    if allowed.all():
        return None
    if op_origin is not None:
        op_set = op_set[op_origin]
    return DeviceTypeConstraint(op_allowed_set=op_set, allowed=allowed, set_types=set_types)


def op_working_set_bytes(graph: Hypergraph) -> npt.NDArray[np.float64]:
    """Bytes every operator needs on its device while it runs: each distinct tensor it
    reads or writes once (a lower bound on that device's peak memory)."""
    owners = np.repeat(np.arange(graph.n_ops, dtype=np.int64), np.diff(graph.input_ptr))
    pairs = np.unique(owners * graph.n_tensors + graph.input_tensors)
    reads = np.bincount(
        pairs // graph.n_tensors, weights=graph.tensor_bytes[pairs % graph.n_tensors], minlength=graph.n_ops
    )
    working_set_bytes: npt.NDArray[np.float64] = reads + graph.op_output_bytes()
    return working_set_bytes


def move_to_allowed(
    target: npt.NDArray[np.int64],
    op_row: npt.NDArray[np.int64],
    row_allowed: npt.NDArray[np.bool_],
    work_s: npt.NDArray[np.float64],
    speed: npt.NDArray[np.float64],
    edges: tuple[npt.NDArray[np.int64], npt.NDArray[np.int64], npt.NDArray[np.float64]],
) -> tuple[npt.NDArray[np.int64], int]:
    """Move every operator off a target it may not use, to the allowed target that costs least.

    Targets are devices or device groups (ids ``0..n_targets-1``). An operator
    with neighbours that stay on allowed targets goes where most of those
    neighbours' bytes are (ties: least loaded, then lowest id); the others move in
    blocks of the operators that share their list and their old target (what METIS
    put together stays together), heaviest block first, each to the allowed target
    that would finish it first. Operators with no allowed target at all stay (the
    caller's later pass over more targets moves them).

    Parameters
    ----------
    target : numpy.ndarray of int64, shape (n_ops,)
    op_row : numpy.ndarray of int64, shape (n_ops,)
        Row of ``row_allowed`` of every operator.
    row_allowed : numpy.ndarray of bool, shape (n_rows, n_targets)
    work_s : numpy.ndarray of float, shape (n_ops,)
        Time of every operator on a target of speed 1.
    speed : numpy.ndarray of float, shape (n_targets,)
        Relative speed of every target (load = work / speed).
    edges : tuple of numpy.ndarray
        ``(src_ops, dst_ops, bytes)`` of the operator graph.

    Returns
    -------
    (numpy.ndarray of int64, int)
        The new targets and how many operators moved.
    """
    ok = row_allowed[op_row, target]
    movable = ~ok & row_allowed[op_row].any(axis=1)
    moving = np.flatnonzero(movable)
    if moving.shape[0] == 0:
        return target, 0
    n_targets = row_allowed.shape[1]
    out = target.copy()
    speed = np.maximum(np.asarray(speed, dtype=np.float64), 1e-300)
    stay = ~movable
    load = np.bincount(target[stay], weights=work_s[stay] / speed[target[stay]], minlength=n_targets)

    # neighbours that stay where they are pull a moving operator to their target
    src, dst, nbytes = edges
    pull_op, pull_target, pull_bytes = [], [], []
    for a, b in ((src, dst), (dst, src)):
        sel = movable[a] & stay[b]
        pull_op.append(a[sel])
        pull_target.append(target[b[sel]])
        pull_bytes.append(nbytes[sel])
    v, t, w = np.concatenate(pull_op), np.concatenate(pull_target), np.concatenate(pull_bytes)
    keep = row_allowed[op_row[v], t]
    v, t, w = v[keep], t[keep], w[keep]
    if v.shape[0]:
        pairs, inverse = np.unique(v * n_targets + t, return_inverse=True)
        pair_bytes = np.bincount(inverse, weights=w, minlength=pairs.shape[0])
        pv, pt = pairs // n_targets, pairs % n_targets
        order = np.lexsort((pt, load[pt], -pair_bytes, pv))
        first = order[np.concatenate([[True], pv[order][1:] != pv[order][:-1]])]
        out[pv[first]] = pt[first]
        np.add.at(load, pt[first], work_s[pv[first]] / speed[pt[first]])

    # the rest, in blocks of (list, old target), heaviest first, each where it finishes first
    rest = moving[out[moving] == target[moving]]
    if rest.shape[0]:
        blocks, block_of = np.unique(op_row[rest] * n_targets + target[rest], return_inverse=True)
        block_work = np.bincount(block_of, weights=work_s[rest], minlength=blocks.shape[0])
        by_block = np.argsort(block_of, kind="stable")
        starts = np.searchsorted(block_of[by_block], np.arange(blocks.shape[0] + 1))
        for b in np.lexsort((blocks, -block_work)).tolist():
            candidates = np.flatnonzero(row_allowed[blocks[b] // n_targets])
            finish = load[candidates] + block_work[b] / speed[candidates]
            chosen = int(candidates[np.argmin(finish)])
            load[chosen] += block_work[b] / speed[chosen]
            out[rest[by_block[starts[b] : starts[b + 1]]]] = chosen
    return out, int(moving.shape[0])
