"""The placement engine: every operator on a device, every tensor in a memory tier.

- :mod:`~partitioners.placement.engine`: :func:`place` runs the candidate strategies,
  scores each with the simulator, refines the best and keeps the best feasible one
  (:class:`PlacementResult`); :func:`evaluate_placement` finishes a given placement
  the same way.
- :mod:`~partitioners.placement.options`: :class:`PlacementOptions`, what a caller asks for.
- :mod:`~partitioners.placement.context`: :func:`placement_context`, the frozen
  :class:`PlacementContext` every strategy reads (expanded graph, operator times,
  device order, device types).
- :mod:`~partitioners.placement.candidates`: the strategies (single device, HEFT,
  METIS k-way, pipeline splits, hybrids), each a function returning a :class:`Proposal`.
- :mod:`~partitioners.placement.scoring`: :func:`score_proposal` repairs, simulates and
  scores a proposal into a :class:`ScoredCandidate`; ranking.
- :mod:`~partitioners.placement.repairs`: device-type moves and acyclic pipeline stages.
- :mod:`~partitioners.placement.final_plan`: level 3 and the feasibility verdict.
- :mod:`~partitioners.placement.result`: :class:`Candidate`, :class:`TransferPlan`,
  :class:`PlacementResult`.
- :mod:`~partitioners.placement.heft`: HEFT list scheduling.
- :mod:`~partitioners.placement.metis_adapter`: hypergraph -> METIS, where costs become
  integers (the other place is the exact model's time ticks).
- :mod:`~partitioners.placement.pipeline`: contiguous pipeline splits and replicas.
- :mod:`~partitioners.placement.acyclic`: acyclic repair of a stage order.
- :mod:`~partitioners.placement.refine`: simulator-guided refinement.
- :mod:`~partitioners.placement.memory_tiers`: level 3, tensors into HBM, L2, shared memory.
- :mod:`~partitioners.placement.schedule`: :func:`plan_schedule`, the operator order per
  device, transfers and tier holdings with the times a plan's prediction assumes.
- :mod:`~partitioners.placement.bounds`: :func:`lower_bounds` on the makespan of any plan
  of a request (:class:`LowerBounds`): the optimality gap every plan carries.
- :mod:`~partitioners.placement.exact`: ``strategy="exact"``, a CP-SAT model
  (:func:`exact_schedule`) for graphs of up to ``EXACT_MAX_OPS`` operators.
"""

from partitioners.placement.bounds import LowerBounds, lower_bounds
from partitioners.placement.candidates import Proposal
from partitioners.placement.context import PlacementContext, placement_context
from partitioners.placement.engine import evaluate_placement, place
from partitioners.placement.exact import ExactOutcome, exact_schedule
from partitioners.placement.options import PlacementOptions
from partitioners.placement.result import Candidate, PlacementResult, TransferPlan
from partitioners.placement.schedule import PlanSchedule, plan_schedule
from partitioners.placement.scoring import ScoredCandidate, score_proposal

__all__ = [
    "Candidate",
    "ExactOutcome",
    "LowerBounds",
    "PlacementContext",
    "PlacementOptions",
    "PlacementResult",
    "PlanSchedule",
    "Proposal",
    "ScoredCandidate",
    "TransferPlan",
    "evaluate_placement",
    "exact_schedule",
    "lower_bounds",
    "place",
    "plan_schedule",
    "placement_context",
    "score_proposal",
]
