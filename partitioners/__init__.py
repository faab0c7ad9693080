"""Pure placement algorithms: typed inputs (numpy arrays, frozen dataclasses) in and out.

One subpackage per feature; each ``__init__`` names its public functions:

- :mod:`partitioners.graph`: the computation graph as a hypergraph (CSR arrays), JSON and
  ONNX import, FLOP counts, training and micro-batch transforms, the model hash.
- :mod:`partitioners.hardware`: the cluster inventory (groups -> devices -> memory tiers,
  links), alpha-beta collectives, which device types an operator may run on.
- :mod:`partitioners.costmodel`: operator and transfer costs, the event-driven
  simulator, Chrome-trace export.
- :mod:`partitioners.placement`: the placement engine (level 1 -> 2 -> 3) and its parts:
  HEFT, the METIS adapter, pipeline splits, acyclic repair, refinement, memory tiers.
- :mod:`partitioners.feedback`: measured timelines, calibration, re-placement with few moves.
- :mod:`partitioners.moe`: Mixture-of-Experts expert rebalancing with minimal movement.
- :mod:`partitioners.parallel3d`: the dp x tp x pp (x cp x ep) training-layout planner.

Nothing here imports the service, a web framework, a database driver or pydantic, and
nothing reads files or clocks beyond what a caller passes (import-linter holds this line
in CI). :mod:`partitioners.errors` holds the errors every subpackage raises.
"""
