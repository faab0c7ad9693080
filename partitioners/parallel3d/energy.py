"""What one training step costs in energy, for many candidate layouts at once.

The placement engine's model (:mod:`partitioners.costmodel.energy`, docs/placement.md
"Energy") applied to a synchronous training step, where every GPU of the layout runs the
same step:

    energy_per_step_j = num_gpus x (busy_s x board_power_w + (step_time_s - busy_s) x idle_power_w)
    tokens_per_joule  = tokens per step / energy_per_step_j

* *Busy* is the pacing pipeline stage's computation over the step (its layers' forward,
  backward and recomputation for every micro-batch, the ``compute_s`` of the time
  breakdown) plus the optimizer step: the GPU runs GEMM, attention and element-wise
  kernels, at close to its board power (TDP) on the dense ones [1]_.
* *Idle* is the rest of the step: the pipeline bubble, exposed tensor-, context-,
  expert-, pipeline- and data-parallel communication. A GPU waiting on a collective
  runs a communication kernel on a few SMs and otherwise idles; it is charged the idle
  power of a GPU held by a job (CUDA context up, no compute) [2]_, a lower estimate.
* The other stages of a pipeline compute as long as the pacing one or a few layers'
  worth less (the planner balances the split), so taking every GPU as busy as the pacing
  stage is an upper estimate by at most that difference.

Board and idle power come from :mod:`partitioners.hardware.catalogue` (``[POWER]``: the
datasheet's TDP; idle with a CUDA context, an estimate). Link energy (a few percent of a
step at NVLink rates, docs/placement.md), host CPUs, switches and cooling are left out:
they scale with ``step_time_s`` and the GPU count, which a caller who wants them has.

References
----------
.. [1] J.-W. Chung, R. Wu, J. J. Ma, M. Chowdhury, "Where Do the Joules Go? Diagnosing
   Inference Energy Consumption", arXiv:2601.22076, 2026 (H100 LLM prefill and training-like
   GEMM-bound phases within 10-20% of TDP).
.. [2] S. S. Vadari, "The Model Parking Tax: Quantifying the Hidden Energy Cost of
   Always-On GPU Model Deployment", arXiv:2605.23918, 2026.
"""

from __future__ import annotations

import numpy as np

from partitioners.parallel3d.arrays import FloatArray

__all__ = ["step_energy_j"]


def step_energy_j(
    num_gpus: FloatArray | float,
    step_time_s: FloatArray | float,
    busy_s: FloatArray | float,
    board_power_w: float,
    idle_power_w: float,
) -> FloatArray:
    """Joules one training step draws on ``num_gpus`` GPUs, busy ``busy_s`` of ``step_time_s`` each.

    ``busy_s`` is clipped to the step: a GPU cannot compute longer than the step lasts.
    """
    step = np.asarray(step_time_s, dtype=float)
    busy = np.clip(np.asarray(busy_s, dtype=float), 0.0, step)
    energy: FloatArray = np.asarray(num_gpus, dtype=float) * (busy * board_power_w + (step - busy) * idle_power_w)
    return energy
