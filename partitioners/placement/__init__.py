"""The placement engine: every operator on a device, every tensor in a memory tier.

- :mod:`~partitioners.placement.engine`: :func:`place` runs the candidate strategies,
  scores each with the simulator and keeps the best feasible one (:class:`PlacementResult`).
- :mod:`~partitioners.placement.heft`: HEFT list scheduling.
- :mod:`~partitioners.placement.metis_adapter`: hypergraph -> METIS, the one place costs
  become integers.
- :mod:`~partitioners.placement.pipeline`: contiguous pipeline splits and replicas.
- :mod:`~partitioners.placement.acyclic`: acyclic repair of a stage order.
- :mod:`~partitioners.placement.refine`: simulator-guided refinement.
- :mod:`~partitioners.placement.memory_tiers`: level 3, tensors into HBM, L2, shared memory.
"""

from partitioners.placement.engine import PlacementOptions, PlacementResult, evaluate_placement, place

__all__ = ["PlacementOptions", "PlacementResult", "evaluate_placement", "place"]
