"""The placement driver: candidate strategies scored by the simulator, level 1 -> 2 -> 3.

One batch of a modern CNN or transformer has little parallelism, so spreading its
operators over every device that exists is usually slower than one device; the
wins are memory feasibility (a model that does not fit must be split) and
micro-batched execution (pipeline stages, or replicas that each take whole
micro-batches). No single partitioner is best across those regimes, so
``strategy="auto"`` builds the candidates that apply, scores every one with the
event-driven simulator (:mod:`partitioners.costmodel.simulator`), refines the best against
the simulated makespan, and returns the best feasible plan together with every
candidate's score, so a user sees why. A placement on fewer devices, down to
one, is a legitimate answer.

Candidates
----------
``single``
    Everything on the fastest device.
``heft``, ``heft-contention``
    HEFT list scheduling (Topcuoglu et al. 2002, :mod:`partitioners.placement.heft`); the
    second also models link-port contention the way the simulator does (Sinnen &
    Sousa 2005), which matters most across nodes.
``metis-k``
    Hypergraph-aware METIS (Karypis & Kumar 1998, :mod:`partitioners.placement.metis_adapter`)
    on ``k`` devices with part weights proportional to device speed; across node
    groups it is hierarchical: level 1 splits the graph between groups (slow
    links), level 2 splits each group's share between its devices.
``pipeline-k``
    Contiguous split of a topological order into ``k`` stages (GPipe / PipeDream),
    balanced by time within each device's memory (:mod:`partitioners.placement.pipeline`).
``hybrid-SxR``
    ``S`` pipeline stages, each replicated on ``R`` devices taking micro-batches
    round-robin (replica-per-device when ``S == 1``).
``<name>+refine``
    Simulator-guided refinement of the best candidates (:mod:`partitioners.placement.refine`).

In pipeline mode every candidate is passed through acyclic repair
(:mod:`partitioners.placement.acyclic`) on the forward edges, so the stage graph a pipeline
schedule sees is always acyclic (gradients flow back through the same stages, as
in GPipe and 1F1B).

Level 3 (:mod:`partitioners.placement.memory_tiers`) then plans every tensor of the chosen
schedule into a memory tier with byte offsets; operators whose tensors landed in
a faster tier are re-timed with that tier's bandwidth and the plan is simulated
once more with the same operator priorities.

Device types
------------
A node of the graph may name the device types it can run on (``device_types`` in
the graph JSON: a custom kernel that exists for one accelerator only, an op pinned
to the host). :func:`~partitioners.hardware.device_types.device_type_constraint` turns those lists into one allowed-
device row per distinct list; a list that matches no device of the inventory is
:class:`~partitioners.errors.InvalidInput`. Every candidate is built as it would be
without the lists, then every restricted operator on a device it may not use moves
to an allowed one (where most of its neighbours' bytes are, else the least loaded,
keeping operators that METIS put together together); HEFT only considers allowed
devices and refinement only proposes allowed moves. Across node groups METIS moves
restricted operators to a group that has their types before splitting each group
between its devices. Graphs without lists take none of these steps.

Determinism: no clocks and no global RNG; METIS gets ``seed``; ties break by
candidate order and device id. The same request gives the same plan.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace

import numpy as np

from partitioners.placement.acyclic import acyclic_repair
from partitioners.costmodel.costs import CostModel, link_time_tables, timing_dtype_note
from partitioners.hardware.device_types import device_type_constraint, move_to_allowed, op_working_set_bytes, type_list
from partitioners.errors import Infeasible, InvalidInput
from partitioners.graph.hypergraph import Hypergraph, op_levels
from partitioners.placement.heft import heft_schedule
from partitioners.hardware.inventory import LINK_CLASS_NAMES, Inventory, link_class_ids
from partitioners.placement.memory_tiers import MemoryPlan, plan_memory_tiers, tier_op_times_s
from partitioners.placement.metis_adapter import MetisGraph, induced_subgraph, metis_graph, metis_partition
from partitioners.placement.pipeline import hybrid_layout, quotient_is_acyclic, stage_of_origin
from partitioners.placement.refine import refine_placement
from partitioners.costmodel.simulator import (
    SimulationResult,
    critical_path_priority,
    prepare_simulation,
    remote_transfers,
    simulate,
)
from partitioners.graph.transforms import PHASE_BACKWARD, PHASE_FORWARD, PHASE_OPTIMIZER, ExpandedGraph, expand_graph

__all__ = [
    "OBJECTIVES",
    "MODES",
    "STRATEGIES",
    "PlacementOptions",
    "Candidate",
    "TransferPlan",
    "PlacementResult",
    "place",
    "evaluate_placement",
    "simulation_budget",
]

OBJECTIVES = ("makespan", "throughput", "communication")
MODES = ("inference", "training")
#: Above this many operators ``auto`` scores the one-device plan analytically.
ANALYTIC_SINGLE_OPS = 6_000
#: Above this many operators only the contention-aware HEFT runs (each HEFT pass costs seconds;
#: the classic one has not won a case in bench/placement.py).
CLASSIC_HEFT_MAX_OPS = 60_000
#: Above this many operators level 3 plans tiers but does not re-simulate with tier bandwidths.
RETIME_MAX_OPS = 300_000
#: When no plan fits, memory overshoots within this fraction of the smallest count as equal.
INFEASIBLE_TOLERANCE = 0.05
#: Level 3 re-simulates only when faster tiers save at least this fraction of compute time.
RETIME_MIN_GAIN = 0.01
#: Simulations kept for refinement when ``auto`` chooses which extra candidates to score.
REFINE_RESERVE = 2
#: ``auto`` runs every applicable strategy; the others force one family.
STRATEGIES = ("auto", "single", "heft", "metis", "pipeline", "hybrid")
#: Graphs up to this many (expanded) operators also try flat edge-cut METIS.
EDGE_CUT_MAX_OPS = 50_000


@dataclass(frozen=True)
class PlacementOptions:
    """What the caller asks for.

    Attributes
    ----------
    objective : {"makespan", "throughput", "communication"}
        ``makespan``: finish one step soonest. ``throughput``: for a steady stream of
        micro-batches, minimise the busiest device's time per micro-batch.
        ``communication``: fewest bytes between devices (ties by makespan).
    mode : {"inference", "training"}
        Training synthesises the backward pass and optimizer (:mod:`partitioners.graph.transforms`).
    micro_batches : int
        ``m >= 1``; the graph is one micro-batch, the plan is for ``m`` sharing parameters.
    pipeline : bool
        Parts must form an acyclic stage order.
    max_devices : int or None
        Use at most this many devices (fastest groups first).
    memory_headroom_fraction : float
        Fraction of each device's main memory kept free (``0.1`` = use at most 90%).
    strategy : str
        One of :data:`STRATEGIES`.
    seed : int
        Seed for METIS; the same seed gives the same plan.
    allow_infeasible : bool
        Return the least-infeasible plan instead of raising :class:`Infeasible`.
    """

    objective: str = "makespan"
    mode: str = "inference"
    micro_batches: int = 1
    pipeline: bool = False
    max_devices: int | None = None
    memory_headroom_fraction: float = 0.0
    strategy: str = "auto"
    seed: int = 0
    allow_infeasible: bool = False

    def __post_init__(self) -> None:
        if self.objective not in OBJECTIVES:
            raise InvalidInput(f"objective must be one of {', '.join(OBJECTIVES)}", field="options.objective")
        if self.mode not in MODES:
            raise InvalidInput(f"mode must be one of {', '.join(MODES)}", field="options.mode")
        if self.strategy not in STRATEGIES:
            raise InvalidInput(f"strategy must be one of {', '.join(STRATEGIES)}", field="options.strategy")
        if not isinstance(self.micro_batches, int) or not 1 <= self.micro_batches <= 4096:
            raise InvalidInput("micro_batches must be an integer in 1..4096", field="options.micro_batches")
        if self.max_devices is not None and (not isinstance(self.max_devices, int) or self.max_devices < 1):
            raise InvalidInput("max_devices must be a positive integer", field="options.max_devices")
        if not (0.0 <= self.memory_headroom_fraction < 1.0):
            raise InvalidInput("memory_headroom_fraction must be in [0, 1)", field="options.memory_headroom_fraction")


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

    def grouped(self, graph: Hypergraph | None = None, inventory: Inventory | None = None) -> list[dict]:
        """One record per tensor: ``{tensor, src, dst: [...], bytes, link_class}``.

        ``link_class`` is the slowest class among the destinations; ``bytes`` is the
        tensor's size (each destination receives it once). With ``graph`` and
        ``inventory`` the tensor and devices are given by name instead of id.
        """
        out: list[dict] = []
        if self.tensor.shape[0] == 0:
            return out
        cut = np.flatnonzero(np.diff(self.tensor)) + 1
        for a, b in zip(np.concatenate([[0], cut]).tolist(), np.concatenate([cut, [self.tensor.shape[0]]]).tolist()):
            tensor, src, dst = int(self.tensor[a]), int(self.src[a]), self.dst[a:b].tolist()
            if graph is not None and inventory is not None:
                tensor = str(graph.tensor_names[tensor])
                src = str(inventory.device_names[src])
                dst = [str(inventory.device_names[x]) for x in dst]
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
    timed_with_tiers : bool
        ``simulation`` times each operator with its tensors at their tiers'
        bandwidths (:func:`~partitioners.placement.memory_tiers.placed_tier_op_times_s`), so
        measured times compare with those; False where level 3 left the main-memory
        schedule (too many operators, too little gain, or a slower re-timed schedule).
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

    @property
    def graph(self) -> Hypergraph:
        return self.expanded.graph

    @property
    def makespan_s(self) -> float:
        return float(self.simulation.makespan_s)


def simulation_budget(n_ops: int) -> int:
    """How many full simulations a plan may spend, from the graph size alone.

    No clocks in ``partitioners`` (determinism), so the planning-time targets
    (about 1 s at 10^4 operators, 5 s at 10^5, 60 s at 10^6 on two cores) become a
    simulation count: one simulation costs a few microseconds per operator, and
    HEFT plus the level-3 plan take about as long as two more.
    """
    for limit, sims in ((1_000, 40), (3_000, 20), (6_000, 10), (15_000, 6), (60_000, 5), (300_000, 4)):
        if n_ops <= limit:
            return sims
    return 3


# ----------------------------------------------------------------------------- helpers


def _device_order(inventory: Inventory, speed: np.ndarray, max_devices: int | None) -> np.ndarray:
    """Usable devices: fastest groups first, fastest devices first inside a group."""
    group = inventory.device_group
    group_speed = np.bincount(group, weights=speed, minlength=inventory.n_groups)
    order = np.lexsort((np.arange(inventory.n_devices), -speed, group, -group_speed[group]))
    if max_devices is not None:
        order = order[:max_devices]
    return order.astype(np.int64)


def _sizes(k_max: int, group_sizes: list[int]) -> list[int]:
    """Device counts worth trying: powers of two below ``k_max``, group boundaries, ``k_max``."""
    sizes = {k_max}
    k = 2
    while k < k_max:
        sizes.add(k)
        k *= 2
    acc = 0
    for s in group_sizes:
        acc += s
        if acc < k_max:
            sizes.add(acc)
    return sorted(sizes)


class _Planner:
    """State of one :func:`place` call (kept private; the public entry is :func:`place`)."""

    def __init__(self, graph: Hypergraph, inventory: Inventory, options: PlacementOptions, cost_model: CostModel | None):
        self.options = options
        self.inventory = inventory
        self.cost_model = cost_model or CostModel()
        self.expanded = expand_graph(graph, mode=options.mode, micro_batches=options.micro_batches)
        g = self.expanded.graph
        self.graph = g
        self.n = g.n_ops
        if self.n == 0:
            raise InvalidInput("the graph has no operators to place", field="graph.nodes")
        self.ctx = prepare_simulation(g, inventory, cost_model=self.cost_model)
        self.times = self.ctx.op_times_s[:, self.ctx.device_profile]
        total = self.times.sum(axis=0)
        self.speed = float(total.min()) / np.maximum(total, 1e-300)
        self.devices = _device_order(inventory, self.speed, options.max_devices)
        self.budget = inventory.device_memory_bytes * (1.0 - options.memory_headroom_fraction)
        self.levels = op_levels(g)
        self.m = options.micro_batches
        phase = self.expanded.op_phase
        src, dst, _ = g.op_edges()
        self.edge_src, self.edge_dst = src, dst
        fwd = (phase[src] == PHASE_FORWARD) & (phase[dst] == PHASE_FORWARD)
        self.forward_edge_mask = fwd
        self.backward_edge_mask = (phase[src] == PHASE_BACKWARD) & (phase[dst] == PHASE_BACKWARD)
        self.twin = self._forward_twins()
        self.input_op_names = graph.op_names
        self.constraint = device_type_constraint(graph, inventory, self.expanded.op_origin)
        self._constraint_edges: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None
        if self.constraint is not None:
            self._check_constraint_fits()
        self.candidates: list[Candidate] = []
        self.evaluated: list[tuple[Candidate, np.ndarray, np.ndarray | None, SimulationResult]] = []
        self.budget_sims = simulation_budget(self.n)
        self.sims_spent = 0
        self._metis_graph: MetisGraph | None = None
        self._origin_cache: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None
        self._links: tuple[np.ndarray, np.ndarray] | None = None
        self.notes: list[str] = []
        dtype_note = timing_dtype_note(graph, inventory, self.cost_model)
        if dtype_note:
            self.notes.append(dtype_note)

    # -- device types ----------------------------------------------------------------

    def _check_constraint_fits(self) -> None:
        """Every restricted operator has an allowed device among the usable ones, and
        (unless infeasible plans are allowed) one whose budget holds its inputs and outputs."""
        c = self.constraint
        usable = np.zeros(self.inventory.n_devices, dtype=bool)
        usable[self.devices] = True
        usable_rows = c.allowed & usable
        missing = ~usable_rows.any(axis=1)
        if missing.any():
            op = int(np.flatnonzero(missing[c.op_allowed_set])[0])
            offered = dict.fromkeys(self.inventory.device_types[self.devices].tolist())
            raise InvalidInput(
                f"operator '{self._origin_name(op)}' may run only on device type(s) "
                f"{type_list(c.set_types[c.op_allowed_set[op]])}, and the {self.devices.shape[0]} device(s) "
                f"max_devices={self.options.max_devices} leaves are of type(s) {type_list(tuple(offered))}; "
                "raise max_devices or leave it out",
                field="options.max_devices",
                code="no-device-of-type",
            )
        if self.options.allow_infeasible:
            return
        need = op_working_set_bytes(self.graph)
        largest = np.where(usable_rows, self.budget[None, :], -np.inf).max(axis=1)
        restricted = ~usable_rows[:, self.devices].all(axis=1)
        over = restricted[c.op_allowed_set] & (need > largest[c.op_allowed_set])
        if over.any():
            op = int(np.flatnonzero(over)[0])
            row = int(c.op_allowed_set[op])
            raise Infeasible(
                f"operator '{self._origin_name(op)}' may run only on device type(s) {type_list(c.set_types[row])}, "
                f"and it needs {_fmt_bytes(need[op])} for its inputs and outputs while the largest memory budget "
                f"among those devices is {_fmt_bytes(largest[row])}; add a device of those types with more memory, "
                "lower memory_headroom_fraction, or allow more device types for it"
            )

    def _origin_name(self, op: int) -> str:
        """Name of the submitted operator an (expanded) operator derives from."""
        return str(self.input_op_names[int(self.expanded.op_origin[op])])

    def _edges_with_bytes(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        if self._constraint_edges is None:
            src, dst, tensors = self.graph.op_edges()
            self._constraint_edges = (src, dst, self.graph.tensor_bytes[tensors])
        return self._constraint_edges

    def constrain(self, placement: np.ndarray) -> tuple[np.ndarray, int]:
        """Move restricted operators off devices they may not use, to usable devices they may;
        returns the placement and how many operators moved."""
        c = self.constraint
        if c is None:
            return placement, 0
        usable = np.zeros(self.inventory.n_devices, dtype=bool)
        usable[self.devices] = True
        return move_to_allowed(placement, c.op_allowed_set, c.allowed & usable, self.times[:, self.devices[0]],
                                self.speed, self._edges_with_bytes())

    def _groups_allowed(self, group_part: np.ndarray, group_devices: np.ndarray, group_speed: np.ndarray) -> np.ndarray:
        """Level 1: restricted operators to a group that has a device of their types.

        ``group_devices[i, d]`` says whether device ``d`` is one of group ``i``'s
        devices in this split.
        """
        c = self.constraint
        row_groups = (c.allowed.astype(np.int64) @ group_devices.T.astype(np.int64)) > 0
        moved, _ = move_to_allowed(group_part, c.op_allowed_set, row_groups, self.times[:, self.devices[0]],
                                    group_speed, self._edges_with_bytes())
        return moved

    def _devices_in_groups_allowed(self, placement: np.ndarray, group_part: np.ndarray,
                                   group_devices: np.ndarray) -> np.ndarray:
        """Level 2: restricted operators to an allowed device of the group level 1 chose.

        One row per (list of types, group): the list's devices inside that group.
        """
        c = self.constraint
        n_groups = group_devices.shape[0]
        rows = (c.allowed[:, None, :] & group_devices[None, :, :]).reshape(-1, self.inventory.n_devices)
        moved, _ = move_to_allowed(placement, c.op_allowed_set * n_groups + group_part, rows,
                                    self.times[:, self.devices[0]], self.speed, self._edges_with_bytes())
        return moved

    # -- bookkeeping -----------------------------------------------------------------

    def _forward_twins(self) -> np.ndarray:
        """For each operator, the forward operator whose stage it must share in a pipeline."""
        e = self.expanded
        twin = np.arange(self.n, dtype=np.int64)
        if e.mode != "training":
            return twin
        # block layout of expand_graph: [forward n | backward n] per micro-batch, steps last
        n_origin = int(e.op_origin[e.op_phase == PHASE_FORWARD].max()) + 1
        bwd = np.flatnonzero(e.op_phase == PHASE_BACKWARD)
        twin[bwd] = bwd - n_origin
        steps = np.flatnonzero(e.op_phase == PHASE_OPTIMIZER)
        twin[steps] = e.op_origin[steps]  # the forward op of micro-batch 0 that reads the parameter
        return twin

    def _objective(self, sim: SimulationResult) -> float:
        if self.options.objective == "throughput":
            return float(sim.device_busy_s.max()) / self.m
        if self.options.objective == "communication":
            return float(sim.comm_bytes)
        return float(sim.makespan_s)

    def single_analytic(self, placement: np.ndarray, note: str) -> int | None:
        """Score the one-device plan without simulating it, when memory is clear-cut.

        One device with every input local never idles, so the makespan is the sum of
        its operator times. Memory lies between the parameters plus the largest
        operator's working set and the parameters plus every tensor; when the budget
        is outside that range feasibility is known, otherwise return ``None`` (the
        caller simulates).
        """
        d = int(placement[0])
        g = self.graph
        params = float(g.tensor_bytes[g.tensor_kind == 2].sum())
        working = float((g.op_input_bytes() - g.op_param_bytes + g.op_output_bytes()).max())
        everything = float(g.tensor_bytes.sum())
        budget = max(float(self.budget[d]), 1.0)
        if params + working > budget:
            feasible, frac = False, (params + working) / budget
        elif everything <= budget:
            feasible, frac = True, everything / budget
        else:
            return None
        makespan = float(self.times[:, d].sum())
        if self.options.objective == "throughput":
            obj = makespan / self.m
        elif self.options.objective == "communication":
            obj = 0.0
        else:
            obj = makespan
        cand = Candidate(
            strategy="single",
            makespan_s=makespan,
            feasible=feasible,
            comm_bytes=0.0,
            devices_used=1,
            peak_memory_fraction=frac,
            acyclic=True,
            objective_value=obj,
            note=f"{note}; analytic (sum of operator times)",
        )
        self.candidates.append(cand)
        self.evaluated.append((cand, placement, None, None))
        return len(self.evaluated) - 1

    def best_index(self) -> int:
        return min(range(len(self.evaluated)), key=lambda i: self.key_of(self.evaluated[i][0], i))

    def stage_graph_acyclic(self, placement: np.ndarray) -> bool:
        """Acyclic per phase: forward edges never return to an earlier stage, nor
        gradient edges (which flow the other way by design, as in GPipe and 1F1B)."""
        if not quotient_is_acyclic(self.graph, placement, self.forward_edge_mask):
            return False
        return not self.backward_edge_mask.any() or quotient_is_acyclic(self.graph, placement, self.backward_edge_mask)

    def pipeline_repair(self, placement: np.ndarray) -> np.ndarray:
        """Acyclic repair on forward edges; gradient and optimizer ops follow their forward twin.

        A placement whose stage graph is already acyclic in each phase is kept as it is.
        """
        if self.stage_graph_acyclic(placement):
            return placement
        used = np.unique(placement)
        parts = np.searchsorted(used, placement)
        fwd = self.forward_edge_mask
        stage, part_of_stage = acyclic_repair(self.n, self.edge_src[fwd], self.edge_dst[fwd], self.levels, parts)
        out = used[part_of_stage[stage]]
        return out[self.twin]

    def score(
        self, name: str, placement: np.ndarray, priority: np.ndarray | None = None, note: str = ""
    ) -> tuple[Candidate, np.ndarray, SimulationResult]:
        """Simulate a placement (after the device-type and, in pipeline mode, acyclic repairs) and score it.

        The device-type repair comes last: a restricted operator never runs where it may
        not, and a stage graph it makes cyclic marks the candidate as not acyclic.
        """
        placement, moved = self.constrain(np.asarray(placement, dtype=np.int64))
        if self.options.pipeline:
            repaired = self.pipeline_repair(placement)
            if repaired is not placement:
                placement, moved_again = self.constrain(repaired)
                moved += moved_again
        if moved:
            note = "; ".join(x for x in (note, f"{moved} operators moved to a device of a type they may run on") if x)
        sim = simulate(
            self.graph, self.inventory, placement, context=self.ctx, priority=priority, record_timeline=True
        )
        self.sims_spent += 1
        peak = sim.peak_memory_bytes
        used = np.unique(placement)
        frac = float(np.max(peak[used] / np.maximum(self.budget[used], 1.0)))
        acyclic = self.stage_graph_acyclic(placement)
        feasible = frac <= 1.0 and (acyclic or not self.options.pipeline)
        cand = Candidate(
            strategy=name,
            makespan_s=float(sim.makespan_s),
            feasible=bool(feasible),
            comm_bytes=float(sim.comm_bytes),
            devices_used=int(used.shape[0]),
            peak_memory_fraction=frac,
            acyclic=bool(acyclic),
            objective_value=self._objective(sim),
            note=note,
        )
        return cand, placement, sim

    def key_of(self, cand: Candidate, tiebreak: int) -> tuple:
        """Sort key: feasible first, then least over budget, objective, makespan, fewer devices.

        Among infeasible plans, overshoots within ``INFEASIBLE_TOLERANCE`` of the
        smallest seen count as equal, so the least-infeasible answer is also a fast one.
        """
        pipeline_bad = self.options.pipeline and not cand.acyclic
        over = 0.0 if cand.feasible else cand.peak_memory_fraction + (1e9 if pipeline_bad else 0.0)
        if not cand.feasible and over <= self.least_over * (1.0 + INFEASIBLE_TOLERANCE):
            over = self.least_over
        return (not cand.feasible, over, cand.objective_value, cand.makespan_s, cand.devices_used, tiebreak)

    @property
    def least_over(self) -> float:
        overs = [
            c.peak_memory_fraction
            for c, *_ in self.evaluated
            if not c.feasible and (c.acyclic or not self.options.pipeline)
        ]
        return min(overs) if overs else float("inf")

    def record(self, cand: Candidate, placement: np.ndarray, priority: np.ndarray | None, sim: SimulationResult) -> int:
        self.candidates.append(cand)
        self.evaluated.append((cand, placement, priority, sim))
        return len(self.evaluated) - 1

    def evaluate(self, name: str, placement: np.ndarray, priority: np.ndarray | None = None, note: str = "") -> int:
        """Score a candidate and list it in the result; returns its index."""
        cand, placement, sim = self.score(name, placement, priority, note)
        return self.record(cand, placement, priority, sim)

    @property
    def sims_left(self) -> int:
        return self.budget_sims - self.sims_spent

    # -- candidate builders ----------------------------------------------------------

    def single(self) -> tuple[np.ndarray, str]:
        """Everything on the fastest device every operator may run on; when device types
        leave no such device, on the fastest one with the restricted operators moved off it."""
        d = int(self.devices[0])
        c = self.constraint
        if c is None:
            return np.full(self.n, d, dtype=np.int64), f"device {self.inventory.device_names[d]}"
        rows = np.unique(c.op_allowed_set)
        common = self.devices[c.allowed[np.ix_(rows, self.devices)].all(axis=0)]
        if common.shape[0]:
            d = int(common[0])
            return np.full(self.n, d, dtype=np.int64), f"device {self.inventory.device_names[d]}"
        placement, moved = self.constrain(np.full(self.n, d, dtype=np.int64))
        return placement, (f"device {self.inventory.device_names[d]}; no device takes every operator's type, "
                           f"{moved} operators on devices of their types")

    def heft(
        self, devices: np.ndarray, *, contention: bool = True, budget_scale: float = 0.85
    ) -> tuple[np.ndarray, np.ndarray]:
        """HEFT over ``devices``; parameters and (in training) saved activations are
        charged against ``budget_scale`` times each device's memory budget."""
        e = self.expanded
        static = None
        if e.mode == "training":
            static = np.where(e.op_phase == PHASE_FORWARD, self.graph.op_output_bytes(), 0.0)
        sched = heft_schedule(
            self.graph,
            self.times,
            *self._link_tables(),
            self.levels,
            devices=devices,
            device_group=self.inventory.device_group,
            param_budget_bytes=self.budget * budget_scale,
            op_static_bytes=static,
            contention=contention,
            op_allowed_set=None if self.constraint is None else self.constraint.op_allowed_set,
            allowed_devices=None if self.constraint is None else self.constraint.allowed,
        )
        priority = np.empty(self.n, dtype=np.float64)
        priority[sched.order] = np.arange(self.n, 0, -1, dtype=np.float64)
        return sched.placement, priority

    def _link_tables(self) -> tuple[np.ndarray, np.ndarray]:
        if self._links is None:
            self._links = link_time_tables(self.inventory, self.cost_model)
        return self._links

    def metis_edge_cut(self, devices: np.ndarray) -> np.ndarray:
        """Flat METIS k-way on the plain operator graph's edge cut, speed-proportional parts.

        The textbook baseline (it over-counts fan-out, see DESIGN.md); kept as a
        candidate on small graphs so ``auto`` is never beaten by it.
        """
        mg = metis_graph(self.graph, self.times[:, self.devices[0]], hypergraph=False)
        return devices[metis_partition(mg, len(devices), speeds=self.speed[devices], seed=self.options.seed)]

    def metis(self, devices: np.ndarray) -> np.ndarray:
        if self._metis_graph is None:
            self._metis_graph = metis_graph(self.graph, self.times[:, self.devices[0]])
        mg = self._metis_graph
        groups = self.inventory.device_group[devices]
        uniq_groups = list(dict.fromkeys(groups.tolist()))
        placement = np.empty(self.n, dtype=np.int64)
        seed = self.options.seed
        if len(uniq_groups) == 1:
            parts = metis_partition(mg, len(devices), speeds=self.speed[devices], seed=seed)
            return devices[parts]
        group_speed = np.array([self.speed[devices[groups == g]].sum() for g in uniq_groups])
        gparts = metis_partition(mg, len(uniq_groups), speeds=group_speed, seed=seed)
        if self.constraint is not None:
            group_devices = np.zeros((len(uniq_groups), self.inventory.n_devices), dtype=bool)
            for gi, g in enumerate(uniq_groups):
                group_devices[gi, devices[groups == g]] = True
            gparts = self._groups_allowed(gparts, group_devices, group_speed)
        for gi, g in enumerate(uniq_groups):
            verts = np.flatnonzero(gparts == gi)
            devs = devices[groups == g]
            if verts.shape[0] == 0:
                continue
            sub = induced_subgraph(mg, verts)
            p = metis_partition(sub, len(devs), speeds=self.speed[devs], seed=seed)
            placement[verts] = devs[p]
        if self.constraint is not None:
            placement = self._devices_in_groups_allowed(placement, gparts, group_devices)
        return placement

    def _origin_profile(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per origin operator: time on the reference device, memory estimate, topological order."""
        if self._origin_cache is not None:
            return self._origin_cache
        e = self.expanded
        n_origin = int(e.op_origin.max()) + 1
        ref = self.times[:, self.devices[0]]
        weight = np.bincount(e.op_origin, weights=ref, minlength=n_origin)
        g = self.graph
        # resident bytes: parameters (and optimizer state) charged to their first reader,
        # saved activations of every micro-batch in training
        owners = np.repeat(np.arange(self.n, dtype=np.int64), np.diff(g.input_ptr))
        is_param = g.tensor_kind[g.input_tensors] == 2
        p_t = g.input_tensors[is_param]
        p_o = owners[is_param]
        first = np.full(g.n_tensors, self.n, dtype=np.int64)
        np.minimum.at(first, p_t, p_o)
        pt = np.flatnonzero(first < self.n)
        # float even when no operator reads a parameter (bincount of nothing is int64)
        mem = np.bincount(e.op_origin[first[pt]], weights=g.tensor_bytes[pt], minlength=n_origin).astype(np.float64)
        if e.mode == "training":
            fwd = np.flatnonzero(e.op_phase == PHASE_FORWARD)
            out_b = g.op_output_bytes()
            # saved activations of every micro-batch live until their gradient op
            mem += np.bincount(e.op_origin[fwd], weights=out_b[fwd], minlength=n_origin)
            # one accumulated gradient per parameter
            fwd0 = fwd[e.op_micro_batch[fwd] == 0]
            mem += np.bincount(e.op_origin[fwd0], weights=g.op_param_bytes[fwd0], minlength=n_origin)
        levels0 = self.levels[np.flatnonzero(e.op_phase == PHASE_FORWARD)]
        fwd_ops = np.flatnonzero(e.op_phase == PHASE_FORWARD)
        origin_level = np.zeros(n_origin, dtype=np.int64)
        np.maximum.at(origin_level, e.op_origin[fwd_ops], levels0)
        order = np.lexsort((np.arange(n_origin), origin_level))
        self._origin_cache = (weight, mem, order)
        return self._origin_cache

    def hybrid(self, stages: int, replicas: int) -> tuple[np.ndarray, bool]:
        devs = self.devices[: stages * replicas]
        stage_devices = [devs[s * replicas : (s + 1) * replicas] for s in range(stages)]
        weight, mem, order = self._origin_profile()
        stage_speed = np.array([self.speed[d].sum() for d in stage_devices])
        stage_budget = np.array([self.budget[d].min() for d in stage_devices]) * 0.9
        stage, ok = stage_of_origin(self.expanded, order, weight, mem, stage_speed, stage_budget)
        placement = hybrid_layout(self.expanded, stage, stage_devices, self.times[:, self.devices[0]])
        return placement, ok


def _fmt_bytes(n: float) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(n) >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n:.0f} B"


def _transfer_plan(graph: Hypergraph, inventory: Inventory, sim: SimulationResult) -> TransferPlan:
    t, s, d = remote_transfers(graph, sim.op_device)
    return TransferPlan(
        tensor=t,
        src=s,
        dst=d,
        bytes=graph.tensor_bytes[t].astype(np.float64),
        link_class=link_class_ids(inventory, s, d).astype(np.int8),
    )


def place(
    graph: Hypergraph,
    inventory: Inventory,
    options: PlacementOptions | None = None,
    *,
    cost_model: CostModel | None = None,
    on_progress: Callable[[float], None] | None = None,
) -> PlacementResult:
    """Place every operator of ``graph`` on a device of ``inventory`` and plan its memory.

    Parameters
    ----------
    graph : Hypergraph
        Forward graph of one micro-batch.
    inventory : Inventory
    options : PlacementOptions, optional
    cost_model : CostModel, optional
        Operator and link costs (defaults to ``CostModel()``).
    on_progress : callable, optional
        Called with the fraction of the work done (0..1) after each scored
        candidate, so a job runner can report progress; it must not raise.

    Returns
    -------
    PlacementResult

    Raises
    ------
    InvalidInput
        Bad options or an empty graph.
    Infeasible
        No candidate fits in memory (unless ``options.allow_infeasible``); the
        message names the device and the bytes over its budget.

    References
    ----------
    G. Karypis, V. Kumar, SIAM J. Sci. Comput. 20(1), 1998 (METIS); H. Topcuoglu et
    al., IEEE TPDS 13(3), 2002 (HEFT); Y. Huang et al., NeurIPS 2019 (GPipe);
    D. Narayanan et al., SOSP 2019 (PipeDream); J. Herrmann et al., SIAM J. Sci.
    Comput. 41(4), 2019 (acyclic partitioning).
    """
    options = options or PlacementOptions()
    planner = _Planner(graph, inventory, options, cost_model)
    _run_candidates(planner, on_progress or (lambda fraction: None))
    best = planner.best_index()
    best = refine_best(planner, best)
    if on_progress is not None:
        on_progress(0.9)
    analytic = planner.evaluated[best][3] is None
    result = _finish(planner, best, raise_infeasible=not (options.allow_infeasible or analytic))
    if result.feasible or not analytic:
        return result
    # the analytic one-device estimate was too optimistic about memory: take the next best
    planner.candidates[best] = replace(planner.candidates[best], feasible=False, note="over memory when simulated")
    planner.evaluated[best] = (planner.candidates[best], *planner.evaluated[best][1:])
    return _finish(planner, planner.best_index(), raise_infeasible=not options.allow_infeasible)


def _hybrid_shapes(m: int, k_max: int, low_memory: bool) -> list[tuple[int, int]]:
    """``(stages, replicas)`` layouts worth trying, most promising first.

    Replicas only help up to ``m`` (one micro-batch each). Without memory pressure,
    layouts using the most devices come first (they use the parallelism); under
    pressure, fewer replicas first (each replica holds its stage's weights again).
    """
    combos: set[tuple[int, int]] = set()
    r = 1
    while r <= min(m, k_max):
        s_max = k_max // r
        for s in {s_max, *[x for x in (1, 2, 4, 8) if x < s_max]}:
            if r > 1:
                combos.add((s, r))
        r *= 2
    if min(m, k_max) > 1:
        combos.add((1, min(m, k_max)))
    if low_memory:
        return sorted(combos, key=lambda c: (c[1], -c[0]))
    return sorted(combos, key=lambda c: (-(c[0] * c[1]), -c[1]))


def evaluate_placement(
    graph: Hypergraph,
    inventory: Inventory,
    placement: np.ndarray,
    options: PlacementOptions | None = None,
    *,
    cost_model: CostModel | None = None,
    name: str = "given",
) -> PlacementResult:
    """Finish a given placement the way :func:`place` finishes its winner.

    ``placement`` assigns every operator of the *expanded* graph (training and
    micro-batch expansion of ``graph`` per ``options``) to a device. It is scored as
    the only candidate, then gets level-3 tiers, the final simulation, its
    transfers and its feasibility verdict. Re-planning uses this to price "keep the
    old placement" and minimal-movement variants with the same rules as new plans.

    Raises
    ------
    InvalidInput
        ``placement`` does not have one device per expanded operator.
    Infeasible
        The placement does not fit in memory (unless ``options.allow_infeasible``).
    """
    options = options or PlacementOptions()
    planner = _Planner(graph, inventory, options, cost_model)
    placement = np.asarray(placement, dtype=np.int64)
    if placement.shape != (planner.n,):
        raise InvalidInput("the placement needs one device per operator of the expanded graph", field="placement")
    index = planner.evaluate(name, placement)
    return _finish(planner, index, raise_infeasible=not options.allow_infeasible)


def _check_strategy_applies(strategy: str, n_devices: int, micro_batches: int) -> None:
    """A strategy asked for by name must have something to build: every one but ``single``
    spreads operators over devices, and ``hybrid`` replicates stages over micro-batches."""
    if strategy not in ("auto", "single") and n_devices == 1:
        raise InvalidInput(
            f"strategy '{strategy}' spreads operators over several devices and this request offers one "
            "(max_devices or the inventory); ask for 'single' or 'auto'",
            field="options.strategy",
            code="strategy-not-applicable",
        )
    if strategy == "hybrid" and micro_batches == 1:
        raise InvalidInput(
            "strategy 'hybrid' replicates pipeline stages across micro-batches and needs micro_batches > 1; "
            "ask for 'pipeline', or for 'auto'",
            field="options.strategy",
            code="strategy-not-applicable",
        )


def _run_candidates(p: _Planner, on_progress: Callable[[float], None]) -> None:
    """Score the applicable candidates: one of each family always, more while the budget lasts."""
    want = p.options.strategy
    k_max = int(p.devices.shape[0])
    _check_strategy_applies(want, k_max, p.m)
    group_sizes = [int(x) for x in np.unique(p.inventory.device_group[p.devices], return_counts=True)[1]]
    sizes = sorted(_sizes(k_max, group_sizes), reverse=True)

    def allowed(family: str) -> bool:
        return want in ("auto", family)

    if allowed("single"):
        placement, note = p.single()
        on_one_device = p.constraint is None or bool((placement == placement[0]).all())
        if p.n > ANALYTIC_SINGLE_OPS and want == "auto" and k_max > 1 and on_one_device:
            if p.single_analytic(placement, note) is None:
                p.evaluate("single", placement, note=note)
        else:
            p.evaluate("single", placement, note=note)
    if k_max == 1:
        return
    low_memory = bool(p.candidates) and not p.candidates[0].feasible

    def hybrid(s: int, r: int):
        placement, ok = p.hybrid(s, r)
        return placement, None, "" if ok else "stage memory estimate over budget"

    def heft(contention: bool):
        placement, priority = p.heft(p.devices, contention=contention)
        note = f"{k_max} devices offered" + (", link ports modelled" if contention else "")
        return placement, priority, note

    def metis(k: int):
        return p.metis(p.devices[:k]), None, ""

    fams: dict[str, list] = {"hybrid": [], "heft": [], "pipeline": [], "metis": []}
    if p.m > 1:
        fams["hybrid"] = [(f"hybrid-{s}x{r}", lambda s=s, r=r: hybrid(s, r)) for s, r in _hybrid_shapes(p.m, k_max, low_memory)]
    fams["heft"] = [("heft-contention", lambda: heft(True))]
    if p.n <= CLASSIC_HEFT_MAX_OPS or want == "heft":
        fams["heft"].append(("heft", lambda: heft(False)))
    fams["pipeline"] = [(f"pipeline-{k}", lambda k=k: hybrid(k, 1)) for k in sizes]
    fams["metis"] = [(f"metis-{k}", lambda k=k: metis(k)) for k in sizes]
    if p.n <= EDGE_CUT_MAX_OPS:
        # the edge-cut baseline as one more essential candidate (cheap at this size)
        fams["metis"].insert(1, (f"metis-edge-cut-{k_max}", lambda: (p.metis_edge_cut(p.devices), None, "plain edge cut")))
    order = ["pipeline", "heft", "hybrid", "metis"] if low_memory else ["hybrid", "heft", "pipeline", "metis"]
    families = [f for f in order if allowed(f) and fams[f]]
    # essentials, whatever the budget: the first of each family, both HEFT variants, and
    # on small graphs the edge-cut METIS baseline
    n_essential = {"heft": 2, "metis": 2 if p.n <= EDGE_CUT_MAX_OPS else 1}
    essential = [c for f in families for c in fams[f][: n_essential.get(f, 1)]]
    extra = [c for f in families for c in fams[f][n_essential.get(f, 1) :]]
    reserve = REFINE_RESERVE if want == "auto" else 0
    n_planned = max(1, len(essential) + len(extra))
    for done, (name, build) in enumerate(essential, start=1):
        placement, priority, note = build()
        p.evaluate(name, placement, priority, note=note)
        on_progress(0.8 * done / n_planned)
    if allowed("heft") and not any(c.feasible for c in p.candidates):
        # memory-bound: HEFT again with the budget it overran scaled down
        over = [c for c in p.candidates if c.strategy == "heft-contention"]
        if over and over[0].peak_memory_fraction > 1.0:
            scale = 0.85 / over[0].peak_memory_fraction * 0.95
            placement, priority = p.heft(p.devices, contention=True, budget_scale=scale)
            p.evaluate("heft-contention/tight", placement, priority, note=f"memory budget x{scale:.2f}")
    for done, (name, build) in enumerate(extra, start=len(essential) + 1):
        if p.sims_left <= reserve:
            break
        placement, priority, note = build()
        p.evaluate(name, placement, priority, note=note)
        on_progress(0.8 * done / n_planned)


def refine_best(p: _Planner, best: int) -> int:
    """Spend the simulations left on refining the best candidate against the simulator."""
    if p.options.strategy != "auto" or p.sims_left < 2 or p.devices.shape[0] <= 1:
        return best
    cand, placement, priority, sim = p.evaluated[best]
    if sim is None or (cand.devices_used <= 1 and cand.feasible):
        return best
    name = f"{cand.strategy}+refine"

    def score(pl: np.ndarray) -> tuple[tuple, SimulationResult]:
        c, _, s = p.score(name, pl, priority)
        return p.key_of(c, -1)[:-1], s

    outcome = refine_placement(
        p.graph,
        placement,
        sim,
        p.times,
        devices=p.devices,
        score=score,
        base_key=p.key_of(cand, -1)[:-1],
        max_steps=p.sims_left,
        levels=p.levels,
        op_micro_batch=p.expanded.op_micro_batch if p.m > 1 else None,
        op_allowed_set=None if p.constraint is None else p.constraint.op_allowed_set,
        allowed_devices=None if p.constraint is None else p.constraint.allowed,
    )
    if outcome.accepted == 0:
        return best
    c, pl, s = p.score(name, outcome.placement, priority, note=f"{outcome.accepted} of {outcome.tried} moves kept")
    return p.record(c, pl, priority, s) if p.key_of(c, -1) < p.key_of(cand, -1) else best


#: Re-timing rounds before level 3 gives up on a schedule whose tiers keep changing: up to
#: 8 (a 10^4-operator DAG settles in 5, the fixtures in 1-2), fewer on large graphs so that
#: the rounds simulate at most RETIME_ROUND_OPS operators in all (at least 2 rounds).
RETIME_MAX_ROUNDS = 8
RETIME_ROUND_OPS = 300_000


def _timed_with_its_tiers(g: Hypergraph, inv: Inventory, placement: np.ndarray, tiers: MemoryPlan,
                          times: np.ndarray, priority: np.ndarray, cost_model: CostModel,
                          budget: np.ndarray, scored_makespan_s: float) -> tuple[SimulationResult, MemoryPlan | None]:
    """Re-time the schedule with ``tiers`` until the tiers planned on it are the ones that timed it.

    Faster operators change tensor lifetimes, and a tensor that no longer fits in its
    tier under the new lifetimes moves to a slower one (``plan_memory_tiers`` keeps a
    tier where it still fits, else tries the next slower), which changes the times
    again. Tiers only ever move down, so this settles; the plan returned states the
    tiers its own times assume. ``None`` for the plan when it has not settled within
    the round budget (``RETIME_MAX_ROUNDS``, ``RETIME_ROUND_OPS``), or as soon as a
    round is slower than the schedule scored in main memory (``scored_makespan_s``),
    which the caller would keep anyway: demotions only slow operators down.
    """
    rounds = min(RETIME_MAX_ROUNDS, max(2, RETIME_ROUND_OPS // max(g.n_ops, 1)))
    for _ in range(rounds):
        final = simulate(g, inv, placement, op_times_s=times, priority=priority, cost_model=cost_model)
        if final.makespan_s > scored_makespan_s:
            return final, None
        plan = plan_memory_tiers(g, inv, final, memory_budget_bytes=budget, tiers=tiers)
        if np.array_equal(plan.tensor, tiers.tensor) and np.array_equal(plan.device, tiers.device) \
                and np.array_equal(plan.tier, tiers.tier):
            return final, plan
        tiers = plan
        times = tier_op_times_s(g, inv, placement, tiers, cost_model=cost_model)
    return final, None


def _finish(p: _Planner, best: int, *, raise_infeasible: bool) -> PlacementResult:
    cand, placement, priority, sim = p.evaluated[best]
    g = p.graph
    inv = p.inventory
    if sim is None:
        sim = simulate(g, inv, placement, context=p.ctx, priority=priority, record_timeline=True)
    # level 3: tiers from the chosen schedule, re-timed with tier bandwidths
    plan0 = plan_memory_tiers(g, inv, sim, memory_budget_bytes=p.budget)
    # keep the chosen schedule's order: priority = earlier start runs first
    start_order = np.lexsort((np.arange(p.n), sim.op_start_s))
    final_priority = np.empty(p.n, dtype=np.float64)
    final_priority[start_order] = np.arange(p.n, 0, -1, dtype=np.float64)
    in_fast_tier = plan0.tier.size > 0 and bool((plan0.tier != inv.device_main_tier[plan0.device]).any())
    retime = p.n <= RETIME_MAX_OPS and in_fast_tier
    if retime:
        times = tier_op_times_s(g, inv, placement, plan0, cost_model=p.cost_model)
        ops = np.arange(p.n)
        saved_s = float((p.times[ops, placement] - times[ops, placement]).sum())
        # re-simulating (and re-planning offsets) only pays when the tiers save real time
        retime = saved_s > RETIME_MIN_GAIN * float(sim.device_busy_s.sum())
        if not retime:
            p.notes.append("level 3: faster tiers save under 1% of compute time; schedule not re-timed")
    final, plan = sim, plan0
    if retime:
        final, plan = _timed_with_its_tiers(g, inv, placement, plan0, times, final_priority, p.cost_model, p.budget,
                                            sim.makespan_s)
        if plan is None and final.makespan_s <= sim.makespan_s:
            p.notes.append("level 3: tiers kept moving as the schedule was re-timed; schedule not re-timed")
    elif p.n > RETIME_MAX_OPS:
        p.notes.append(
            f"level 3: tiers planned on the scored schedule; not re-timed with tier bandwidths above "
            f"{RETIME_MAX_OPS} operators"
        )
    timed_with_tiers = bool(retime and plan is not None and final.makespan_s <= sim.makespan_s)
    if not timed_with_tiers:
        # a list-scheduling anomaly made the re-timed schedule slower: keep the scored one
        final, plan = sim, plan0
        if priority is not None:
            final_priority = priority
        else:
            final_priority = critical_path_priority(
                g, inv, placement, p.times[np.arange(p.n), placement], cost_model=p.cost_model
            )
    peak = final.peak_memory_bytes
    used = np.unique(placement)
    over = peak - p.budget
    over_used = np.where(np.isin(np.arange(inv.n_devices), used), over, -np.inf)
    worst = int(np.argmax(over_used))
    feasible = bool(over_used[worst] <= 0) and plan.hbm_fits and (cand.acyclic or not p.options.pipeline)
    bytes_over = float(max(over_used[worst], 0.0))
    if not feasible and raise_infeasible:
        name = inv.device_names[worst]
        if not (cand.acyclic or not p.options.pipeline):
            if p.constraint is not None:
                raise Infeasible(
                    "no acyclic stage assignment found for pipeline mode that keeps every operator on a device of "
                    "its device_types (operators restricted to one type alternate with others along the graph); "
                    "allow more device types for them, or plan without pipeline mode"
                )
            raise Infeasible("no acyclic stage assignment found for pipeline mode")
        raise Infeasible(
            f"no placement fits in memory: the best plan ({cand.strategy}) needs "
            f"{_fmt_bytes(peak[worst])} on device {name}, {_fmt_bytes(bytes_over)} over its budget of "
            f"{_fmt_bytes(p.budget[worst])}; add devices, or lower micro_batches or memory_headroom_fraction"
        )
    return PlacementResult(
        expanded=p.expanded,
        placement=placement,
        priority=final_priority,
        strategy=cand.strategy,
        candidates=tuple(p.candidates),
        simulation=final,
        memory_plan=plan,
        transfers=_transfer_plan(g, inv, final),
        feasible=feasible,
        infeasible_device=None if feasible else worst,
        bytes_over=bytes_over,
        memory_budget_bytes=p.budget,
        acyclic=cand.acyclic,
        devices_used=int(used.shape[0]),
        objective_value=p._objective(final),
        chosen=cand,
        notes=p.notes,
        timed_with_tiers=timed_with_tiers,
    )
