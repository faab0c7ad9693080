"""Pipeline schedules: how long a pipeline stands idle, and what each rank holds.

The planner's default is Megatron-LM's one-forward-one-backward schedule, interleaved when
a rank holds several model chunks [1]; its idle time is ``(p - 1) / v`` stage times. The
other schedules here split each backward into the input gradient ``B`` and the weight
gradient ``W`` and move ``W`` into the idle slots [2], or run micro-batches from both
ends of the pipeline at once and pair one micro-batch's forward with another's backward,
which also hides their communication under computation [3]. Their idle times are the
expressions DeepSeek-AI tabulates [3, Table 2], in units of one stage's forward ``F``,
backward ``B`` (input and weight gradient) and weight gradient ``W``:

============  ==========================  ===================  ====================
schedule      idle time                   weights per rank     micro-batches held
============  ==========================  ===================  ====================
1f1b          ``(p-1)(F+B) / v``          1x                   ``p``
zero-bubble   ``(p-1)(F+B-2W)``           1x                   ``p``
dualpipe      ``(p/2-1)(F&B+B-3W)``       2x                   ``p+1``
dualpipev     ``(p-1)(F&B+B-3W) / 2``     1x                   ``p+1/2``
============  ==========================  ===================  ====================

``F&B``, a forward and a backward chunk run overlapped, is taken as ``F + B``: the pairing
hides communication, not computation. DualPipeV is DualPipe cut in half [4]: ``p`` ranks
each hold two half-stages in a V, so its table row with ``2p`` half-stages reads as above.
A stage time is split as the GEMMs split it: the backward's input and weight gradients
each cost one forward, and full recomputation adds a forward to the backward.

References
----------
.. [1] D. Narayanan et al., "Efficient Large-Scale Language Model Training on GPU Clusters
   Using Megatron-LM", SC21, Sec. 2.2.
.. [2] P. Qi, X. Wan, G. Huang, M. Lin, "Zero Bubble Pipeline Parallelism", ICLR 2024
   (ZB-H1: the memory of 1F1B, a third of its bubble).
.. [3] DeepSeek-AI, "DeepSeek-V3 Technical Report", arXiv:2412.19437, 2024, Sec. 3.2.1
   and Table 2 (DualPipe; DeepSeek-V2 ran the zero-bubble schedule).
.. [4] deepseek-ai/DualPipe (README: DualPipeV, the "cut-in-half" V-shape schedule);
   ``torch.distributed.pipelining.ScheduleDualPipeV``, torchtitan's ``DualPipeV``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from partitioners.parallel3d.arrays import FloatArray

__all__ = ["PipelineSchedule", "PIPELINE_SCHEDULES", "idle_stage_times"]


@dataclass(frozen=True)
class PipelineSchedule:
    """What one schedule costs and holds, beside its idle time (:func:`idle_stage_times`)."""

    name: str
    # copies of its stages' weights (and gradients) a rank holds: DualPipe keeps stage i and
    # stage p-1-i on rank i
    weight_copies: int
    # micro-batches of one stage's activations a rank holds at most, over the pipeline size
    # (the 1F1B first stage holds p)
    extra_micro_batches_held: float
    # a forward chunk paired with another micro-batch's backward, whose all-to-all and
    # stage sends run under it
    pairs_chunks: bool
    # model chunks per rank are fixed by the schedule (no interleaving depth to search)
    fixed_chunks: bool
    needs_even_pipeline: bool
    source: str


PIPELINE_SCHEDULES: dict[str, PipelineSchedule] = {
    "1f1b": PipelineSchedule(
        "1f1b",
        1,
        0.0,
        False,
        False,
        False,
        "Megatron-LM 1F1B, interleaved with virtual stages (Narayanan et al. SC21, Sec. 2.2)",
    ),
    "zero-bubble": PipelineSchedule(
        "zero-bubble",
        1,
        0.0,
        False,
        True,
        False,
        "ZB-H1 (Qi et al., ICLR 2024): weight gradients deferred into the idle slots; DeepSeek-V2's schedule",
    ),
    "dualpipe": PipelineSchedule(
        "dualpipe",
        2,
        1.0,
        True,
        True,
        True,
        "DualPipe (DeepSeek-V3 Technical Report, Sec. 3.2.1, Table 2): micro-batches from both ends, "
        "forward and backward chunks paired with their all-to-all and sends underneath; two copies of the weights",
    ),
    "dualpipev": PipelineSchedule(
        "dualpipev",
        1,
        0.5,
        True,
        True,
        False,
        "DualPipeV (deepseek-ai/DualPipe; torch.distributed.pipelining.ScheduleDualPipeV): DualPipe cut in half, "
        "two half-stages per rank in a V",
    ),
}


def idle_stage_times(
    schedule: PipelineSchedule, pp: FloatArray, v: FloatArray, recompute_share: FloatArray | float = 0.0
) -> FloatArray:
    """Idle time of a pipeline in stage times (one micro-batch's forward and backward on a stage).

    ``recompute_share`` is the share of a stage's layers whose forward full recomputation
    repeats in the backward; it lengthens ``B`` and so shrinks the weight gradient's share
    of a stage time.
    """
    pp = np.asarray(pp, dtype=np.float64)
    name = schedule.name
    if name == "1f1b":
        idle: FloatArray = (pp - 1.0) / np.asarray(v, dtype=np.float64)
        return idle
    forward = 1.0 / (3.0 + np.asarray(recompute_share, dtype=np.float64))  # F = W, in stage times
    weight = forward
    if name == "zero-bubble":
        idle = (pp - 1.0) * (1.0 - 2.0 * weight)
    elif name == "dualpipe":
        # (p/2 - 1)(F&B + B - 3W) with F&B = F + B = 1 and B = 1 - F
        idle = np.maximum(pp / 2.0 - 1.0, 0.0) * (2.0 - forward - 3.0 * weight)
    elif name == "dualpipev":
        idle = (pp - 1.0) * (2.0 - forward - 3.0 * weight) / 2.0
    else:
        raise ValueError(f"unknown pipeline schedule {name!r}")
    return np.maximum(idle, 0.0)
