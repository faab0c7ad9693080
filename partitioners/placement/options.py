"""What a caller may ask of the placement engine: :class:`PlacementOptions`.

The options are checked once, here, when they are made; every module of
:mod:`partitioners.placement` takes them as given.
"""

from __future__ import annotations

from dataclasses import dataclass

from partitioners.errors import InvalidInput

__all__ = ["OBJECTIVES", "MODES", "STRATEGIES", "TIME_LIMIT_MAX_S", "PlacementOptions"]

OBJECTIVES = ("makespan", "throughput", "communication")
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
        if not (0.0 <= self.memory_headroom_fraction < 1.0):
            raise InvalidInput("memory_headroom_fraction must be in [0, 1)", field="options.memory_headroom_fraction")
        if not (isinstance(self.time_limit_s, (int, float)) and 0.0 < self.time_limit_s <= TIME_LIMIT_MAX_S):
            raise InvalidInput(
                f"time_limit_s must be a number of seconds in (0, {TIME_LIMIT_MAX_S:g}]", field="options.time_limit_s"
            )
