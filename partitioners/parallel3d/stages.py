"""Candidate layouts as arrays, and how a layout's layers divide among its pipeline stages.

The planner scores hundreds of thousands of (dp, tp, pp, cp, ep, micro-batch, v, ZeRO,
recompute) tuples at once, so a candidate is one position in parallel numpy arrays
(:class:`LayoutArrays`) rather than an object. Layers that do not divide evenly come
off the end stages first, which also embed the tokens and compute the logits
(:func:`stage_layer_split`, :func:`balanced_end_layers`); any left over shorten middle
stages (:func:`middle_stages_short`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from partitioners.parallel3d.arrays import BoolArray, FloatArray, IntArray

__all__ = [
    "RECOMPUTE_NONE",
    "RECOMPUTE_SELECTIVE",
    "RECOMPUTE_FULL",
    "RECOMPUTE_OP_SAC",
    "ORDER_DP_INSIDE",
    "ORDER_PP_INSIDE",
    "LayoutArrays",
    "microbatch_group_size",
    "stage_layer_split",
    "middle_stages_short",
    "balanced_end_layers",
]

RECOMPUTE_NONE, RECOMPUTE_SELECTIVE, RECOMPUTE_FULL, RECOMPUTE_OP_SAC = 0, 1, 2, 3
# LayoutArrays.order: positions in presets.RANK_ORDERS
ORDER_DP_INSIDE, ORDER_PP_INSIDE = 0, 1


@dataclass(frozen=True)
class LayoutArrays:
    """Candidate layouts as parallel int64 arrays, one entry per candidate.

    ``recompute`` holds ``RECOMPUTE_NONE``/``SELECTIVE``/``FULL``/``OP_SAC``; ``v`` is the
    number of virtual pipeline stages (model chunks) per rank. ``etp`` is the
    expert tensor-parallel size: ``tp`` (routed experts split over the tensor ranks like
    the dense MLP, the ``ep`` expert groups drawn from the data-parallel ranks:
    Megatron-Core's default) or 1 (MoE parallel folding: whole experts, the expert
    groups drawn from the tensor x context x data-parallel ranks of a stage; Liu et
    al., "MoE Parallel Folding", arXiv:2504.14960, 2025). Under full
    recomputation ``recompute_layers`` is how many layers of each model chunk are
    recomputed (Megatron-LM's ``--recompute-method block --recompute-num-layers``):
    all of them (``q / v``) or fewer, the others keeping their activations; it is
    0 otherwise.
    """

    dp: IntArray
    tp: IntArray
    pp: IntArray
    cp: IntArray
    ep: IntArray
    etp: IntArray
    mbs: IntArray
    v: IntArray
    zero: IntArray
    recompute: IntArray
    recompute_layers: IntArray
    # Position in presets.RANK_ORDERS: ORDER_DP_INSIDE ("tp-cp-ep-dp-pp", data-parallel
    # peers inside a pipeline stage's block of consecutive ranks) or ORDER_PP_INSIDE
    # ("tp-cp-ep-pp-dp", pipeline stages side by side, replicas outermost).
    order: IntArray

    def __len__(self) -> int:
        return int(self.dp.shape[0])

    def take(self, index: BoolArray | IntArray | slice) -> LayoutArrays:
        """The candidates at ``index`` (boolean mask or integer positions)."""
        return LayoutArrays(*(getattr(self, name)[index] for name in self.__dataclass_fields__))


def stage_layer_split(num_layers: int, pp: FloatArray | IntArray | int) -> tuple[FloatArray, FloatArray, FloatArray]:
    """Layers on the fullest, the first and the last pipeline stage: ``(q, first, last)``.

    The fullest stages hold ``q = ceil(L / p)``; the ``p q - L`` layers short of that
    are taken from the two ends first, one each: the first stage keeps the most
    micro-batches' activations in flight and the embedding, the last computes the
    logits. Llama 3's 405B run put 7 of its 126 layers on each end of 16 stages and 8
    on the others ("we reduce one Transformer layer each from the first and the last
    stages", Llama Team, "The Llama 3 Herd of Models", 2024, Sec. 3.3.2; Megatron-Core
    sets it with ``--decoder-first-pipeline-num-layers`` / ``--decoder-last-pipeline-num-layers``).
    One short layer comes off the last stage; more than two also shorten middle stages,
    which the pace (set by the fullest stage) does not see.
    """
    pp = np.asarray(pp, dtype=float)
    q = np.ceil(num_layers / pp)
    short = pp * q - num_layers
    first = np.where((short >= 2) & (pp > 1), q - 1.0, q)
    last = np.where((short >= 1) & (pp > 1), q - 1.0, q)
    return q, first, last


def end_stage_moe_layers(
    num_layers: int,
    moe_layers: tuple[int, ...] | None,
    has_moe: bool,
    first_layers: FloatArray,
    last_layers: FloatArray,
    layers_per_stage: FloatArray,
    moe_per_stage: FloatArray,
    v: FloatArray,
) -> tuple[FloatArray, FloatArray]:
    """MoE layers among the first rank's ``first_layers`` and the last rank's ``last_layers``.

    The first pipeline rank's first model chunk holds the model's first layers and the
    last rank's last chunk its last ones, so where the model says which layers are MoE
    (``moe_layers``) those chunks hold exactly those: DeepSeek-V3's first stage holds its
    three dense layers ("all FFNs except for the first three layers" are MoE, DeepSeek-V3
    Technical Report, Sec. 4.2). Under the interleaved schedule the end ranks' other
    ``v - 1`` chunks come from inside the model and hold a middle stage's mix
    (``moe_per_stage`` of ``layers_per_stage``). With every layer MoE (``moe_layers``
    None) or none, the count is all or nothing.
    """
    first = np.asarray(first_layers, dtype=float)
    last = np.asarray(last_layers, dtype=float)
    if not has_moe:
        return np.zeros_like(first), np.zeros_like(last)
    if moe_layers is None:
        return first.copy(), last.copy()
    is_moe = np.zeros(num_layers, dtype=np.int64)
    is_moe[[i for i in set(moe_layers) if 0 <= i < num_layers]] = 1
    # prefix[k]: MoE layers among the model's first k layers
    prefix = np.concatenate([[0], np.cumsum(is_moe)]).astype(float)
    inner_chunks = (v - 1.0) / v
    head = np.clip(first - inner_chunks * layers_per_stage, 0, num_layers).astype(np.int64)
    tail = np.clip(last - inner_chunks * layers_per_stage, 0, num_layers).astype(np.int64)
    inner_moe = inner_chunks * moe_per_stage
    return prefix[head] + inner_moe, prefix[-1] - prefix[num_layers - tail] + inner_moe


def middle_stages_short(
    num_layers: int,
    pp: FloatArray | int,
    q: FloatArray | int,
    first_layers: FloatArray | int,
    last_layers: FloatArray | int,
) -> FloatArray:
    """How many middle stages hold ``q - 1`` layers: the leftover layers the end stages do not shed.

    They are taken from the middle stages nearest the first, which keep the most
    micro-batches in flight (see :func:`partitioners.parallel3d.memory.stage_activation_bytes`).
    """
    return np.maximum(pp * q - num_layers - (q - first_layers) - (q - last_layers), 0)


def balanced_end_layers(
    q: FloatArray,
    short: FloatArray,
    pp: FloatArray | IntArray,
    first_extra_layers: FloatArray,
    last_extra_layers: FloatArray,
    end_layer_units: Callable[[FloatArray, FloatArray], tuple[FloatArray, FloatArray]] | None = None,
) -> tuple[FloatArray, FloatArray]:
    """Layers on the first and last pipeline stage when the ``short`` layers a pipeline of
    ``q``-layer stages leaves over come off the stages that need them most.

    The first stage also embeds the tokens and the last computes the logits: in units
    of one middle-stage layer's time, ``first_extra_layers`` and ``last_extra_layers``.
    One layer at a time goes to whichever end is the slower (the first on a tie: it
    also keeps the most micro-batches' activations), for as long as an end is slower
    than a ``q``-layer middle stage; layers left over shorten middle stages, which does
    not change the pace. With two stages every short layer comes off an end. Each end
    keeps at least one layer. This is the balance Megatron-Core sets by hand with
    ``--decoder-first-pipeline-num-layers`` / ``--decoder-last-pipeline-num-layers`` (or
    ``--account-for-embedding-in-pipeline-split`` / ``--account-for-loss-in-pipeline-split``)
    and Llama 3's 405B run chose ("we reduce one Transformer layer each from the first
    and the last stages", Llama Team, 2024, Sec. 3.3.2). With a cheap output layer it
    reduces to :func:`stage_layer_split`'s one layer off each end.

    ``end_layer_units(first, last)`` gives the time of the first stage's ``first`` and the
    last stage's ``last`` layers in the same units, where the end layers are not average
    ones: a model whose first layers are dense and the rest MoE (DeepSeek-V3) has cheap
    layers at the front. Left out, every layer counts one unit.
    """
    q = np.asarray(q, dtype=float)
    pp = np.asarray(pp, dtype=float)
    first, last = q.copy(), q.copy()
    remaining = np.where(pp > 1, np.asarray(short, dtype=float), 0.0)
    for _ in range(int(remaining.max(initial=0.0))):
        first_units, last_units = (first, last) if end_layer_units is None else end_layer_units(first, last)
        first_s = first_units + first_extra_layers
        last_s = last_units + last_extra_layers
        slower_end = (np.maximum(first_s, last_s) > q) | (pp == 2)
        to_last = (remaining > 0) & slower_end & (last_s > first_s) & (last > 1)
        to_first = (remaining > 0) & slower_end & ~to_last & (first > 1)
        # a layout that keeps its ends this round keeps them for good (its ends stay as they
        # are while ``remaining`` only shrinks), so the rounds end with the last move: at
        # most 2 (q - 1) per layout, not ``short``, which reaches tens of thousands for
        # thousands of one- or two-layer stages
        if not (to_last | to_first).any():
            break
        last = last - to_last
        first = first - to_first
        remaining = np.where(remaining > 0, remaining - 1.0, 0.0)
    return first, last


def microbatch_group_size(m: FloatArray, pp: FloatArray, flexible: bool) -> FloatArray:
    """Micro-batches the interleaved schedule runs through a model chunk before the next
    chunk, or 0 where it cannot run.

    Megatron-LM's interleaved 1F1B takes micro-batches in groups of ``pp`` and so needs
    ``m`` to be a multiple of ``pp`` ("number of microbatches is not divisible by
    pipeline-parallel size when using interleaved schedule"). Megatron-Core lets the group
    size ``N`` be any value in ``[pp, m]`` (``--microbatch-group-size-per-virtual-pipeline-
    stage``) as long as the last group is empty or holds at least ``pp`` micro-batches
    ("should be 0, or larger than or equal to the pipeline-parallel size ... Otherwise, it
    introduces dependency bubbles", schedules.py); ``flexible`` allows that, taking the
    smallest such ``N``: the warm-up keeps ``(v - 1) N`` more model chunks in flight.
    """
    m = np.asarray(m, dtype=np.int64)
    pp = np.asarray(pp, dtype=np.int64)
    group = np.where((m >= pp) & (m % np.maximum(pp, 1) == 0), pp, 0)
    if not flexible:
        return group
    pairs = np.unique(np.stack([m, pp], axis=1)[group == 0], axis=0)
    for m_i, pp_i in pairs:
        if m_i < pp_i or pp_i < 1:
            continue
        n = next(n for n in range(int(pp_i), int(m_i) + 1) if m_i % n == 0 or m_i % n >= pp_i)
        group[(m == m_i) & (pp == pp_i)] = n
    return group
