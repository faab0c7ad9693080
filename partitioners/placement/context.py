"""What every candidate strategy of one placement shares, computed once: :class:`PlacementContext`.

A :func:`~partitioners.placement.engine.place` call expands the graph (training,
micro-batches), prepares the simulator, prices every operator on every device,
orders the usable devices and reads the device-type lists once. The candidate
strategies (:mod:`partitioners.placement.candidates`), the scoring
(:mod:`partitioners.placement.scoring`) and level 3
(:mod:`partitioners.placement.final_plan`) all read that one frozen context; none
of them changes it. The few derived tables only some strategies need (the METIS
graph, the link tables, the per-origin profile of pipeline splits) are computed
on first use and kept, so a request that never runs METIS never builds its graph.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import cached_property

import numpy as np

from partitioners.costmodel.costs import CostModel, link_time_tables, timing_dtype_note
from partitioners.costmodel.energy import devices_without_power
from partitioners.costmodel.profiles import resolve_cost_model
from partitioners.costmodel.simulator import SimulationContext, prepare_simulation
from partitioners.errors import DoesNotFit, InvalidInput
from partitioners.graph.hypergraph import TENSOR_ROLE_GRADIENT, Hypergraph, op_levels
from partitioners.graph.transforms import PHASE_BACKWARD, PHASE_FORWARD, PHASE_OPTIMIZER, ExpandedGraph, expand_graph
from partitioners.hardware.device_types import (
    DeviceTypeConstraint,
    device_type_constraint,
    op_working_set_bytes,
    type_list,
)
from partitioners.hardware.inventory import Inventory
from partitioners.placement.metis_adapter import MetisGraph, metis_graph
from partitioners.placement.options import ENERGY_OBJECTIVES, PlacementOptions

__all__ = ["OriginProfile", "PlacementContext", "placement_context", "format_bytes", "with_node_times"]


@dataclass(frozen=True, eq=False)
class OriginProfile:
    """Per operator of the submitted graph (its *origin*): what pipeline splits balance.

    Attributes
    ----------
    time_s : numpy.ndarray of float64, shape (n_origin,)
        Time of every expanded operator of that origin on the reference (fastest) device.
    resident_bytes : numpy.ndarray of float64, shape (n_origin,)
        Memory estimate: parameters (and optimizer state) charged to their first
        reader, plus in training the saved activations of every micro-batch and one
        accumulated gradient per parameter (a declared gradient charged to the
        operator that writes it).
    topological_order : numpy.ndarray of int64, shape (n_origin,)
        Origins by forward level (by level among all operators in a declared training
        graph, whose backward operators are origins too), ties by id.
    """

    time_s: np.ndarray
    resident_bytes: np.ndarray
    topological_order: np.ndarray


@dataclass(frozen=True, eq=False)
class PlacementContext:
    """One placement request, prepared: the inputs every candidate strategy reads.

    Build with :func:`placement_context`. Frozen: strategies and scoring are pure
    functions of it; the ``cached_property`` tables are derived data computed on
    first use.

    Attributes
    ----------
    options : PlacementOptions
    inventory : Inventory
    cost_model : CostModel
    expanded : ExpandedGraph
        The graph that is placed (training / micro-batch expansion of the input).
    input_op_names : numpy.ndarray
        Operator names of the submitted graph (for messages about an origin).
    simulation : SimulationContext
        The simulator's placement-independent precomputation.
    op_times_s : numpy.ndarray of float64, shape (n_ops, n_devices)
        Time of every operator on every device.
    device_speed : numpy.ndarray of float64, shape (n_devices,)
        Relative speed (1 for the fastest device), from the total operator time.
    devices : numpy.ndarray of int64
        Usable devices: fastest groups first, fastest devices first inside a group,
        at most ``options.max_devices``.
    memory_budget_bytes : numpy.ndarray of float64, shape (n_devices,)
        Main memory after ``options.memory_headroom_fraction``.
    levels : numpy.ndarray of int64, shape (n_ops,)
        Topological level of every operator.
    edge_src, edge_dst, edge_tensor : numpy.ndarray of int64
        Operator edges (producer, consumer, tensor) of the expanded graph.
    forward_edge_mask, backward_edge_mask : numpy.ndarray of bool
        Edges within the forward phase, and within the backward phase.
    forward_twin : numpy.ndarray of int64, shape (n_ops,)
        For each operator, the forward operator whose pipeline stage it must share.
    constraint : DeviceTypeConstraint or None
        Allowed devices per operator, ``None`` when the graph names no device types.
    notes : tuple of str
        Notes every plan of this request carries (timing precision).
    """

    options: PlacementOptions
    inventory: Inventory
    cost_model: CostModel
    expanded: ExpandedGraph
    input_op_names: np.ndarray
    simulation: SimulationContext
    op_times_s: np.ndarray
    device_speed: np.ndarray
    devices: np.ndarray
    memory_budget_bytes: np.ndarray
    levels: np.ndarray
    edge_src: np.ndarray
    edge_dst: np.ndarray
    edge_tensor: np.ndarray
    forward_edge_mask: np.ndarray
    backward_edge_mask: np.ndarray
    forward_twin: np.ndarray
    constraint: DeviceTypeConstraint | None
    notes: tuple[str, ...]

    @property
    def graph(self) -> Hypergraph:
        """The expanded graph, the one every placement indexes."""
        return self.expanded.graph

    @property
    def n_ops(self) -> int:
        return self.expanded.graph.n_ops

    @property
    def micro_batches(self) -> int:
        return self.options.micro_batches

    @property
    def reference_times_s(self) -> np.ndarray:
        """Every operator's time on the first usable (fastest) device."""
        return self.op_times_s[:, self.devices[0]]

    @cached_property
    def usable(self) -> np.ndarray:
        """``(n_devices,)`` bool: the devices in :attr:`devices`."""
        usable = np.zeros(self.inventory.n_devices, dtype=bool)
        usable[self.devices] = True
        return usable

    @cached_property
    def edges_with_bytes(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Operator edges with the bytes of their tensor (what device-type moves weigh)."""
        return self.edge_src, self.edge_dst, self.graph.tensor_bytes[self.edge_tensor]

    @cached_property
    def link_tables(self) -> tuple[np.ndarray, np.ndarray]:
        """Latency and seconds-per-byte between every pair of devices (for HEFT)."""
        return link_time_tables(self.inventory, self.cost_model)

    @cached_property
    def hypergraph_metis(self) -> MetisGraph:
        """The expanded graph as METIS sees it (tensors as clique nets), weighted by reference time."""
        return metis_graph(self.graph, self.reference_times_s)

    @cached_property
    def origin_profile(self) -> OriginProfile:
        """Per origin operator: time on the reference device, memory estimate, topological order."""
        e = self.expanded
        g = self.graph
        n = self.n_ops
        n_origin = int(e.op_origin.max()) + 1
        weight = np.bincount(e.op_origin, weights=self.reference_times_s, minlength=n_origin)
        # resident bytes: parameters (and optimizer state) charged to their first reader,
        # saved activations of every micro-batch in training
        owners = np.repeat(np.arange(n, dtype=np.int64), np.diff(g.input_ptr))
        is_param = g.tensor_kind[g.input_tensors] == 2
        p_t = g.input_tensors[is_param]
        p_o = owners[is_param]
        first = np.full(g.n_tensors, n, dtype=np.int64)
        np.minimum.at(first, p_t, p_o)
        pt = np.flatnonzero(first < n)
        # float even when no operator reads a parameter (bincount of nothing is int64)
        mem = np.bincount(e.op_origin[first[pt]], weights=g.tensor_bytes[pt], minlength=n_origin).astype(np.float64)
        if e.mode == "training":
            fwd = np.flatnonzero(e.op_phase == PHASE_FORWARD)
            out_b = g.op_output_bytes()
            # saved activations of every micro-batch live until their gradient op
            mem += np.bincount(e.op_origin[fwd], weights=out_b[fwd], minlength=n_origin)
            if e.declared:
                # declared gradients: every micro-batch's share, at the operator writing it
                role = g.tensor_role if g.tensor_role is not None else np.zeros(0, dtype=np.int8)
                grads = np.flatnonzero(role == TENSOR_ROLE_GRADIENT)
                writers = g.tensor_producer[grads]
                mem += np.bincount(e.op_origin[writers], weights=g.tensor_bytes[grads], minlength=n_origin)
            else:
                # one accumulated gradient per parameter
                fwd0 = fwd[e.op_micro_batch[fwd] == 0]
                mem += np.bincount(e.op_origin[fwd0], weights=g.op_param_bytes[fwd0], minlength=n_origin)
        fwd_ops = np.arange(n, dtype=np.int64) if e.declared else np.flatnonzero(e.op_phase == PHASE_FORWARD)
        levels0 = self.levels[fwd_ops]
        origin_level = np.zeros(n_origin, dtype=np.int64)
        np.maximum.at(origin_level, e.op_origin[fwd_ops], levels0)
        order = np.lexsort((np.arange(n_origin), origin_level))
        return OriginProfile(time_s=weight, resident_bytes=mem, topological_order=order)

    def origin_name(self, op: int) -> str:
        """Name of the submitted operator an (expanded) operator derives from."""
        return str(self.input_op_names[int(self.expanded.op_origin[op])])


def placement_context(
    graph: Hypergraph, inventory: Inventory, options: PlacementOptions, cost_model: CostModel | None = None
) -> PlacementContext:
    """Prepare one placement request: expand, price, order devices, read device types.

    Parameters
    ----------
    graph : Hypergraph
        Forward graph of one micro-batch.
    inventory : Inventory
    options : PlacementOptions
    cost_model : CostModel, optional
        Defaults to ``options.cost_model`` resolved against the inventory.

    Returns
    -------
    PlacementContext

    Raises
    ------
    InvalidInput
        The graph has no operators, or ``max_devices`` leaves out every device of an
        operator's types.
    DoesNotFit
        An operator restricted to some device types needs more memory than any of
        those devices has (unless ``options.allow_infeasible``).
    """
    cost_model = cost_model or resolve_cost_model(options.cost_model, inventory)
    expanded = expand_graph(graph, mode=options.mode, micro_batches=options.micro_batches)
    notes = [note for note in (timing_dtype_note(graph, inventory, cost_model),) if note]
    if expanded.declared:
        notes.append(declared_training_note(options.mode))
    if graph.op_time_s is not None:
        expanded = with_node_times(expanded, graph)
    g = expanded.graph
    if g.n_ops == 0:
        raise InvalidInput("the graph has no operators to place", field="graph.nodes")
    sim_ctx = prepare_simulation(g, inventory, cost_model=cost_model)
    times = sim_ctx.op_times_s[:, sim_ctx.device_profile]
    total = times.sum(axis=0)
    speed = float(total.min()) / np.maximum(total, 1e-300)
    phase = expanded.op_phase
    src, dst, tensors = g.op_edges()
    ctx = PlacementContext(
        options=options,
        inventory=inventory,
        cost_model=cost_model,
        expanded=expanded,
        input_op_names=graph.op_names,
        simulation=sim_ctx,
        op_times_s=times,
        device_speed=speed,
        devices=_device_order(inventory, speed, options.max_devices),
        memory_budget_bytes=inventory.device_memory_bytes * (1.0 - options.memory_headroom_fraction),
        levels=op_levels(g),
        edge_src=src,
        edge_dst=dst,
        edge_tensor=tensors,
        forward_edge_mask=(phase[src] == PHASE_FORWARD) & (phase[dst] == PHASE_FORWARD),
        backward_edge_mask=(phase[src] == PHASE_BACKWARD) & (phase[dst] == PHASE_BACKWARD),
        forward_twin=_forward_twins(expanded),
        constraint=device_type_constraint(graph, inventory, expanded.op_origin),
        notes=tuple(notes),
    )
    if ctx.constraint is not None:
        _check_constraint_fits(ctx)
    if options.objective in ENERGY_OBJECTIVES:
        _check_power_known(ctx)
    return ctx


def _check_power_known(ctx: PlacementContext) -> None:
    """An energy objective compares joules, which needs every usable device's power figures."""
    missing = devices_without_power(ctx.inventory, ctx.devices)
    if missing:
        shown = ", ".join(missing[:5]) + (f" and {len(missing) - 5} more" if len(missing) > 5 else "")
        raise InvalidInput(
            f"objective '{ctx.options.objective}' needs active_power_w and idle_power_w on every device; "
            f"{shown} give none (presets carry them)",
            field="options.objective",
        )


def declared_training_note(mode: str) -> str:
    """What a plan of a graph that declares its own training step says about it."""
    declared = "the graph declares its own training step (operator roles, gradient or optimizer-state tensors)"
    if mode == "inference":
        return (
            f"options.mode is 'inference' but {declared}: planned as the training step it is, nothing "
            "synthesised; send the forward graph alone for an inference plan"
        )
    return f"{declared}: planned as it is, no backward pass or optimizer synthesised"


def with_node_times(expanded: ExpandedGraph, graph: Hypergraph) -> ExpandedGraph:
    """The expanded graph carrying the submitted nodes' own times on their forward copies.

    Every micro-batch's copy of a node runs the node's kernel, so it takes the node's
    time; the backward and optimizer operators training synthesises have none (the
    roofline times them), while those a declared training step sends keep theirs. A graph without node times gives ``expanded`` back.
    """
    if graph.op_time_s is None:
        return expanded
    # a declared training step's backward and optimizer nodes are the compiler's own kernels too
    timed = np.ones(expanded.graph.n_ops, dtype=bool) if expanded.declared else expanded.op_phase == PHASE_FORWARD
    times = np.full((expanded.graph.n_ops, graph.op_time_s.shape[1]), np.nan, dtype=np.float64)
    times[timed] = graph.op_time_s[expanded.op_origin[timed]]
    g = replace(expanded.graph, op_time_s=times, op_time_keys=graph.op_time_keys)
    return replace(expanded, graph=g)


def _device_order(inventory: Inventory, speed: np.ndarray, max_devices: int | None) -> np.ndarray:
    """Usable devices: fastest groups first, fastest devices first inside a group."""
    group = inventory.device_group
    group_speed = np.bincount(group, weights=speed, minlength=inventory.n_groups)
    order = np.lexsort((np.arange(inventory.n_devices), -speed, group, -group_speed[group]))
    if max_devices is not None:
        order = order[:max_devices]
    return order.astype(np.int64)


def _forward_twins(e: ExpandedGraph) -> np.ndarray:
    """For each operator, the forward operator whose stage it must share in a pipeline."""
    n = e.graph.n_ops
    twin = np.arange(n, dtype=np.int64)
    if e.mode != "training" or e.declared:
        # a declared backward operator is its own origin: no forward twin is known
        return twin
    # block layout of expand_graph: [forward n | backward n] per micro-batch, steps last
    n_origin = int(e.op_origin[e.op_phase == PHASE_FORWARD].max()) + 1
    bwd = np.flatnonzero(e.op_phase == PHASE_BACKWARD)
    twin[bwd] = bwd - n_origin
    steps = np.flatnonzero(e.op_phase == PHASE_OPTIMIZER)
    twin[steps] = e.op_origin[steps]  # the forward op of micro-batch 0 that reads the parameter
    return twin


def _check_constraint_fits(ctx: PlacementContext) -> None:
    """Every restricted operator has an allowed device among the usable ones, and
    (unless infeasible plans are allowed) one whose budget holds its inputs and outputs."""
    c = ctx.constraint
    assert c is not None
    usable_rows = c.allowed & ctx.usable
    missing = ~usable_rows.any(axis=1)
    if missing.any():
        op = int(np.flatnonzero(missing[c.op_allowed_set])[0])
        offered = dict.fromkeys(ctx.inventory.device_types[ctx.devices].tolist())
        raise InvalidInput(
            f"operator '{ctx.origin_name(op)}' may run only on device type(s) "
            f"{type_list(c.set_types[c.op_allowed_set[op]])}, and the {ctx.devices.shape[0]} device(s) "
            f"max_devices={ctx.options.max_devices} leaves are of type(s) {type_list(tuple(offered))}; "
            "raise max_devices or leave it out",
            field="options.max_devices",
            code="no-device-of-type",
        )
    if ctx.options.allow_infeasible:
        return
    need = op_working_set_bytes(ctx.graph)
    largest = np.where(usable_rows, ctx.memory_budget_bytes[None, :], -np.inf).max(axis=1)
    restricted = ~usable_rows[:, ctx.devices].all(axis=1)
    over = restricted[c.op_allowed_set] & (need > largest[c.op_allowed_set])
    if over.any():
        op = int(np.flatnonzero(over)[0])
        row = int(c.op_allowed_set[op])
        headroom = ctx.options.memory_headroom_fraction
        lower_headroom = f"lower memory_headroom_fraction (now {headroom:g}), " if headroom > 0 else ""
        raise DoesNotFit(
            f"operator '{ctx.origin_name(op)}' may run only on device type(s) {type_list(c.set_types[row])}, "
            f"and it needs {format_bytes(need[op])} for its inputs and outputs while the largest memory budget "
            f"among those devices is {format_bytes(largest[row])}; add a device of those types with more memory, "
            f"{lower_headroom}give it smaller tensors (a smaller batch), or allow more device types for it"
        )


def format_bytes(n: float) -> str:
    """``n`` bytes for a message: ``"1.50 GB"``, ``"12.00 MB"``, ``"3 B"``."""
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(n) >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n:.0f} B"
