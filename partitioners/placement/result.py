"""What the placement engine answers: scored candidates, transfers and the final plan.

:class:`Candidate` is the public score of one candidate strategy (the result lists
every one, so a user sees why the winner won); :class:`TransferPlan` the
communication a plan implies; :class:`PlacementResult` the chosen placement with
its level-3 memory plan and final simulation.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from partitioners.costmodel.costs import CostModel
from partitioners.costmodel.energy import StepEnergy
from partitioners.costmodel.simulator import SimulationResult, remote_transfers
from partitioners.graph.hypergraph import (
    TENSOR_PARAMETER,
    TENSOR_ROLE_GRADIENT,
    TENSOR_ROLE_OPTIMIZER_STATE,
    Hypergraph,
)
from partitioners.graph.transforms import ExpandedGraph
from partitioners.hardware.inventory import LINK_CLASS_NAMES, Inventory, link_class_ids
from partitioners.placement.fusion import FusionGroups
from partitioners.placement.memory_tiers import MemoryPlan

if TYPE_CHECKING:
    from partitioners.placement.bounds import LowerBounds
    from partitioners.placement.exact import ExactOutcome

__all__ = ["Candidate", "TransferPlan", "PlacementResult", "TrainingState", "training_state", "transfer_plan"]


@dataclass(frozen=True)
class Candidate:
    """One scored candidate plan (the result lists all of them).

    Attributes
    ----------
    strategy : str
    makespan_s : float
        Simulated makespan of one step.
    feasible : bool
        Within every device's memory budget (and acyclic in pipeline mode).
    comm_bytes : float
        Connectivity metric: bytes moved between devices.
    devices_used : int
    peak_memory_fraction : float
        Highest peak memory over budget across devices (``<= 1`` when feasible).
    acyclic : bool
        Whether the stage graph is acyclic in each phase (forward edges, and
        gradient edges in training).
    objective_value : float
        The value the objective compares (makespan, period per micro-batch, or bytes).
    note : str
    """

    strategy: str
    makespan_s: float
    feasible: bool
    comm_bytes: float
    devices_used: int
    peak_memory_fraction: float
    acyclic: bool
    objective_value: float
    note: str = ""


@dataclass(frozen=True, eq=False)
class TransferPlan:
    """The communication a plan implies, one row per (tensor, destination device).

    Attributes
    ----------
    tensor, src, dst : numpy.ndarray of int64
        Tensor id, producing device, receiving device.
    bytes : numpy.ndarray of float64
    link_class : numpy.ndarray of int8
        :data:`partitioners.hardware.inventory.LINK_CLASS_NAMES` index.
    """

    tensor: np.ndarray
    src: np.ndarray
    dst: np.ndarray
    bytes: np.ndarray
    link_class: np.ndarray

    def grouped(self, graph: Hypergraph | None = None, inventory: Inventory | None = None) -> list[dict[str, object]]:
        """One record per tensor: ``{tensor, src, dst: [...], bytes, link_class}``.

        ``link_class`` is the slowest class among the destinations; ``bytes`` is the
        tensor's size (each destination receives it once). With ``graph`` and
        ``inventory`` the tensor and devices are given by name instead of id.
        """
        out: list[dict[str, object]] = []
        if self.tensor.shape[0] == 0:
            return out
        cut = np.flatnonzero(np.diff(self.tensor)) + 1
        for a, b in zip(
            np.concatenate([[0], cut]).tolist(), np.concatenate([cut, [self.tensor.shape[0]]]).tolist(), strict=True
        ):
            tensor: int | str = int(self.tensor[a])
            src: int | str = int(self.src[a])
            dst: list[int] | list[str] = self.dst[a:b].tolist()
            if graph is not None and inventory is not None:
                tensor = str(graph.tensor_names[int(self.tensor[a])])
                src = str(inventory.device_names[int(self.src[a])])
                dst = [str(inventory.device_names[x]) for x in self.dst[a:b].tolist()]
            out.append(
                {
                    "tensor": tensor,
                    "src": src,
                    "dst": dst,
                    "bytes": float(self.bytes[a]),
                    "link_class": LINK_CLASS_NAMES[int(self.link_class[a:b].max())],
                }
            )
        return out


@dataclass(frozen=True, eq=False)
class PlacementResult:
    """A placement plan and what it is predicted to cost.

    Attributes
    ----------
    expanded : ExpandedGraph
        The graph that was placed (training / micro-batch expansion of the input)
        with each operator's origin, micro-batch and phase.
    placement : numpy.ndarray of int64, shape (n_ops,)
        Device of every operator of ``expanded.graph``.
    priority : numpy.ndarray of float64, shape (n_ops,)
        Operator priorities the final simulation used (larger runs first).
    strategy : str
        Name of the chosen candidate.
    candidates : tuple of Candidate
        Every candidate that was scored, in scoring order.
    simulation : SimulationResult
        The chosen plan simulated with level-3 tier bandwidths.
    memory_plan : MemoryPlan
        Level 3: tier and byte offset of every tensor on every device that holds it.
    transfers : TransferPlan
    feasible : bool
    infeasible_device : int or None
        When infeasible, the device furthest over its memory budget.
    bytes_over : float
        By how much (0 when feasible).
    memory_budget_bytes : numpy.ndarray, shape (n_devices,)
        Main-memory budget per device after headroom.
    acyclic : bool
        Stage graph acyclic in each phase (see :class:`Candidate`).
    devices_used : int
    objective_value : float
        Objective of the final (level-3 re-timed) simulation.
    chosen : Candidate
        The winning candidate as scored before level 3 (main-memory bandwidth only),
        the figure comparable with the other candidates.
    notes : list of str
    fusion : FusionGroups or None
        The fused kernels placed as units (``options.fusion``); the placed graph's
        operators are the groups, named after their first operator.
    energy : StepEnergy or None
        Energy of the final simulated step (:mod:`partitioners.costmodel.energy`);
        ``None`` when a counted device has no power figures.
    timed_with_tiers : bool
        ``simulation`` times each operator with its tensors at their tiers'
        bandwidths (:func:`~partitioners.placement.memory_tiers.placed_tier_op_times_s`), so
        measured times compare with those; False where level 3 left the main-memory
        schedule (too many operators, too little gain, or a slower re-timed schedule).
    cost_model : CostModel or None
        The resolved cost model that timed the plan (profile, parameters, calibration).
    cost_sources : dict[str, int]
        How many operators were timed each way on their devices
        (:func:`~partitioners.costmodel.costs.cost_sources`).
    bounds : LowerBounds or None
        Lower bounds on the makespan of any plan of this request
        (:mod:`partitioners.placement.bounds`); :attr:`optimality_gap` compares.
    exact : ExactOutcome or None
        ``strategy="exact"``: what the CP-SAT model found (:mod:`partitioners.placement.exact`).
    """

    expanded: ExpandedGraph
    placement: np.ndarray
    priority: np.ndarray
    strategy: str
    candidates: tuple[Candidate, ...]
    simulation: SimulationResult
    memory_plan: MemoryPlan
    transfers: TransferPlan
    feasible: bool
    infeasible_device: int | None
    bytes_over: float
    memory_budget_bytes: np.ndarray
    acyclic: bool
    devices_used: int
    objective_value: float
    chosen: Candidate
    notes: list[str] = field(default_factory=list)
    timed_with_tiers: bool = False
    energy: StepEnergy | None = None
    fusion: FusionGroups | None = None
    cost_model: CostModel | None = None
    cost_sources: dict[str, int] = field(default_factory=dict)
    bounds: LowerBounds | None = None
    exact: ExactOutcome | None = None

    @property
    def graph(self) -> Hypergraph:
        return self.expanded.graph

    @property
    def optimality_gap(self) -> float | None:
        """``makespan / lower bound - 1``: no plan of this request is more than this factor faster, less one."""
        return None if self.bounds is None else self.bounds.gap(self.makespan_s)

    @property
    def makespan_s(self) -> float:
        return float(self.simulation.makespan_s)

    def training_state(self) -> TrainingState | None:
        """Parameter, gradient and optimizer-state bytes per device; None for an inference plan."""
        if self.expanded.mode != "training":
            return None
        return training_state(self.graph, self.placement, self.memory_budget_bytes.shape[0])


@dataclass(frozen=True, eq=False)
class TrainingState:
    """What training keeps on each device besides activations, in bytes.

    The simulator's memory model (:mod:`partitioners.costmodel.simulator`) holds a
    parameter or an optimizer state once on every device that reads it, and a
    gradient on the device that writes it and on every device it is sent to; these
    are those holdings, split by what they are. Gradients are the micro-batch shares
    of :func:`~partitioners.graph.transforms.expand_graph`, so one device running
    every micro-batch holds one whole gradient per parameter.

    Attributes
    ----------
    parameter_bytes, gradient_bytes, optimizer_state_bytes : numpy.ndarray of float64, shape (n_devices,)
    """

    parameter_bytes: np.ndarray
    gradient_bytes: np.ndarray
    optimizer_state_bytes: np.ndarray


def training_state(graph: Hypergraph, placement: np.ndarray, n_devices: int) -> TrainingState:
    """Parameter, gradient and optimizer-state bytes each device holds (see :class:`TrainingState`).

    Parameters
    ----------
    graph : Hypergraph
        The placed (expanded) graph; its ``tensor_role`` says which tensors are
        gradients and optimizer state (parameters without a role are parameters).
    placement : numpy.ndarray of int64, shape (n_ops,)
    n_devices : int
    """
    placement = np.asarray(placement, dtype=np.int64)
    role = graph.tensor_role if graph.tensor_role is not None else np.full(graph.n_tensors, -1, dtype=np.int8)
    readers = np.repeat(np.arange(graph.n_ops, dtype=np.int64), np.diff(graph.input_ptr))
    # holdings (tensor, device): where a tensor is read, and where a gradient is written
    writers = np.repeat(np.arange(graph.n_ops, dtype=np.int64), np.diff(graph.output_ptr))
    tensors = np.concatenate([graph.input_tensors, graph.output_tensors])
    devices = placement[np.concatenate([readers, writers])]
    keys = np.unique(tensors * n_devices + devices)
    held, on = keys // n_devices, keys % n_devices
    resident = graph.tensor_kind[held] == TENSOR_PARAMETER

    def per_device(mask: np.ndarray) -> np.ndarray:
        out: np.ndarray = np.bincount(on[mask], weights=graph.tensor_bytes[held[mask]], minlength=n_devices)
        return out.astype(np.float64)

    state = role[held] == TENSOR_ROLE_OPTIMIZER_STATE
    return TrainingState(
        parameter_bytes=per_device(resident & ~state),
        gradient_bytes=per_device(role[held] == TENSOR_ROLE_GRADIENT),
        optimizer_state_bytes=per_device(resident & state),
    )


def transfer_plan(graph: Hypergraph, inventory: Inventory, sim: SimulationResult) -> TransferPlan:
    """One row per (remote tensor, receiving device) of the simulated schedule ``sim``."""
    t, s, d = remote_transfers(graph, sim.op_device)
    return TransferPlan(
        tensor=t,
        src=s,
        dst=d,
        bytes=graph.tensor_bytes[t].astype(np.float64),
        link_class=link_class_ids(inventory, s, d).astype(np.int8),
    )
