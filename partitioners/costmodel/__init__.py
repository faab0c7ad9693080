"""What a placed graph costs: operator and transfer times, and one simulated step.

- :mod:`~partitioners.costmodel.costs`: :class:`CostModel` (efficiencies, calibration
  factors), :func:`op_times_s` (roofline), :func:`transfer_time_s`, :func:`collective_time_s`.
- :mod:`~partitioners.costmodel.simulator`: :func:`simulate`, the event-driven simulation
  of one step (makespan, timeline, memory, traffic).
- :mod:`~partitioners.costmodel.trace`: :func:`to_chrome_trace` (opens in Perfetto).
"""

from partitioners.costmodel.costs import CostModel, op_times_s
from partitioners.costmodel.simulator import SimulationResult, simulate
from partitioners.costmodel.trace import to_chrome_trace

__all__ = ["CostModel", "SimulationResult", "op_times_s", "simulate", "to_chrome_trace"]
