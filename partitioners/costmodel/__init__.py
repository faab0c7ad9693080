"""What a placed graph costs: operator and transfer times, and one simulated step.

- :mod:`~partitioners.costmodel.costs`: :class:`CostModel` (efficiencies, launch overhead,
  calibration factors), :func:`op_times_s` (roofline, or a node's own time),
  :func:`transfer_time_s`, :func:`collective_time_s`.
- :mod:`~partitioners.costmodel.profiles`: the named profiles (``roofline``, ``eager``,
  ``cuda-graphs``), :class:`CostModelSpec` and :func:`resolve_cost_model`.
- :mod:`~partitioners.costmodel.simulator`: :func:`simulate`, the event-driven simulation
  of one step (makespan, timeline, memory, traffic; launches on one host or per device).
- :mod:`~partitioners.costmodel.trace`: :func:`to_chrome_trace` (opens in Perfetto).
"""

from partitioners.costmodel.costs import CostModel, op_times_s
from partitioners.costmodel.profiles import PROFILES, CostModelSpec, resolve_cost_model
from partitioners.costmodel.simulator import SimulationResult, simulate
from partitioners.costmodel.trace import to_chrome_trace

__all__ = [
    "PROFILES",
    "CostModel",
    "CostModelSpec",
    "SimulationResult",
    "op_times_s",
    "resolve_cost_model",
    "simulate",
    "to_chrome_trace",
]
