"""What a caller may ask of the placement engine: :class:`PlacementOptions`.

The options are checked once, here, when they are made; every module of
:mod:`partitioners.placement` takes them as given.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from partitioners.costmodel.profiles import CostModelSpec
from partitioners.errors import InvalidInput

#: How operators may be fused before placement (:mod:`partitioners.placement.fusion`).
FUSION_MODES = ("none", "elementwise", "compiler")

__all__ = [
    "ENERGY_OBJECTIVES",
    "FUSION_MODES",
    "MODES",
    "OBJECTIVES",
    "STRATEGIES",
    "TIME_LIMIT_MAX_S",
    "PlacementOptions",
]

OBJECTIVES = ("makespan", "throughput", "communication", "energy", "energy_delay")
#: Objectives that need every usable device's power figures.
ENERGY_OBJECTIVES = ("energy", "energy_delay")
MODES = ("inference", "training")
#: ``auto`` runs every applicable strategy; the others force one family; ``exact`` solves
#: small graphs with CP-SAT (:mod:`partitioners.placement.exact`).
STRATEGIES = ("auto", "single", "heft", "metis", "pipeline", "hybrid", "exact")
#: Upper end of ``time_limit_s``.
TIME_LIMIT_MAX_S = 300.0


@dataclass(frozen=True)
class PlacementOptions:
    """What the caller asks for.

    Attributes
    ----------
    objective : {"makespan", "throughput", "communication", "energy", "energy_delay"}
        ``makespan``: finish one step soonest. ``throughput``: for a steady stream of
        micro-batches, minimise the busiest device's time per micro-batch.
        ``communication``: fewest bytes between devices (ties by makespan).
        ``energy``: fewest joules per step; ``energy_delay``: joules x makespan
        (:mod:`partitioners.costmodel.energy`; both need the devices' power figures).
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
    fusion : {"none", "elementwise", "compiler"}
        Which operators are fused into one kernel before placement
        (:mod:`partitioners.placement.fusion`). ``none`` by default: a compiler that posts
        its graph usually posts it after its own fusion passes, and re-fusing such a
        graph would merge kernels it chose to keep apart.
    count_idle_devices : bool
        Whether a step's energy includes the idle power of usable devices the plan
        leaves unused (a job that holds them pays for them); ``False`` when the caller
        frees them.
    cost_model : CostModelSpec
        The cost model that times the plan: a named profile and the parameters that
        override it (:mod:`partitioners.costmodel.profiles`). A ``cost_model``
        passed to :func:`~partitioners.placement.engine.place` (a calibrated one)
        takes its place.
    time_limit_s : float
        ``strategy="exact"``: the solver's time limit, in ``(0, 300]`` seconds.
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
    count_idle_devices: bool = True
    fusion: str = "none"
    cost_model: CostModelSpec = field(default_factory=CostModelSpec)
    time_limit_s: float = 10.0

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
        if self.fusion not in FUSION_MODES:
            raise InvalidInput(f"fusion must be one of {', '.join(FUSION_MODES)}", field="options.fusion")
        if not isinstance(self.cost_model, CostModelSpec):
            raise InvalidInput("cost_model must be a CostModelSpec", field="options.cost_model")
        if not (0.0 <= self.memory_headroom_fraction < 1.0):
            raise InvalidInput("memory_headroom_fraction must be in [0, 1)", field="options.memory_headroom_fraction")
        if not (isinstance(self.time_limit_s, (int, float)) and 0.0 < self.time_limit_s <= TIME_LIMIT_MAX_S):
            raise InvalidInput(
                f"time_limit_s must be a number of seconds in (0, {TIME_LIMIT_MAX_S:g}]", field="options.time_limit_s"
            )
