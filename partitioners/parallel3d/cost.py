"""Analytic time of one training step, and its per-GPU memory peak, for many 3D layouts at once.

Every function takes the candidate layouts as parallel numpy arrays
(:class:`partitioners.parallel3d.stages.LayoutArrays`) and returns arrays, so a search
over hundreds of thousands of (dp, tp, pp, cp, ep, micro-batch, v, ZeRO, recompute)
tuples is a handful of vectorised passes.

Published models this follows (and where it departs, why):

* FLOPs per step: Narayanan et al., SC21, eq. (3), generalised term by term
  (:mod:`partitioners.parallel3d.flops`); MFU counts model FLOPs only.
* Memory per GPU: activations (Korthikanti et al. 2022), weights, gradients and
  optimizer state by ZeRO stage (Rajbhandari et al., SC20), allocator fragmentation
  -- see :mod:`partitioners.parallel3d.memory`; the peak is the fullest of the first,
  the last and a middle pipeline stage (:func:`predict_layouts`).
* Pipeline bubble ``(p-1)/(v m)`` of 1F1B (``v = 1``) and interleaved schedules
  (Narayanan et al. SC21, Section 2.2), generalised to unequal stages
  (:func:`pipeline_time_s`): the steady state runs at the slowest stage, fill and
  drain at the mean one. The first stage also runs the vocabulary-parallel input
  embedding (:func:`~partitioners.parallel3d.kernels.embedding_time_s` and its
  tensor-parallel all-reduce), the last the output layer and loss; every send/recv of
  activations pays Megatron's host synchronisation, ``2 v`` times per micro-batch; with
  tied embeddings the first and last stages all-reduce the embedding gradient after
  the flush.
* Data-parallel gradient reduction overlapped with the backward: under 1F1B, with the
  last micro-batch's backward, bucket by bucket; under the interleaved schedule, model
  chunk by model chunk as each finishes its last backward (Megatron-Core's per-chunk
  ``grad_sync_func``), so only the last chunk's share trails the pipeline.
* Weight-gradient accumulation over micro-batches: free when fused into the
  weight-gradient GEMM (today's Megatron-LM), otherwise a memory-bound pass over the
  stage's parameters per micro-batch
  (:func:`~partitioners.parallel3d.kernels.gradient_accumulation_time_s`), which is
  what makes many small micro-batches cost more than the bubble formula says.
* Backward GEMMs at their own shapes (``dX = dY W^T``, ``dW = X^T dY``), not as twice
  the forward; tensor-parallel all-reduces across a full H100/H200 node use NVLink
  SHARP (NCCL's NVLS), ~480/370 faster than the ring (NVIDIA/nccl-tests#212).
* Collectives: the shared alpha-beta formulas of :mod:`partitioners.hardware.collectives`,
  vectorised over candidates in :mod:`partitioners.parallel3d.comm` (with the expert
  all-to-all and the cost of hiding a collective under computation).
* GEMM time: roofline of each per-GPU matrix product with wave quantisation over the
  SMs, so small per-GPU matrices (large tp, small micro-batches) run below peak
  instead of at it (:mod:`partitioners.parallel3d.kernels`, with the other kernels'
  memory-bound time).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, fields

import numpy as np

from partitioners.hardware.collectives import LinkSpec, allgather_time_s, allreduce_time_s
from partitioners.parallel3d.arrays import BoolArray, FloatArray, IntArray
from partitioners.parallel3d.comm import (
    chunked_collective_time_s,
    collective_time_s,
    deduplicated_dispatch_time_s,
    expert_alltoall_time_s,
    exposed_part_s,
    overlapped_time_s,
    point_to_point_time_s,
    two_level_allreduce_time_s,
)
from partitioners.parallel3d.effective import TP_ASYNC_BACKWARD, TP_PIPELINED, EffectiveTerms, effective_terms
from partitioners.parallel3d.flops import (
    ParameterCounts,
    hardware_flops_per_step,
    mla_up_projections,
    model_flops_per_step,
    parameter_counts,
)
from partitioners.parallel3d.kernels import (
    embedding_time_s,
    expert_host_issue_time_s,
    flash_attention_slowdown,
    fp8_quantize_time_s,
    gemm_backward_time_s,
    gemm_time_s,
    gradient_accumulation_time_s,
    layer_kernel_gaps_s,
)
from partitioners.parallel3d.memory import (
    RESERVED_BYTES,
    model_state_bytes,
    stage_activation_bytes,
    zero_stage_held,
)
from partitioners.parallel3d.schedules import idle_stage_times
from partitioners.parallel3d.specs import (
    AttentionProjection,
    ClusterSpec,
    ModelSpec,
    TrainingSpec,
    flash_attention_speed,
)
from partitioners.parallel3d.stages import (
    ORDER_DP_INSIDE,
    RECOMPUTE_FULL,
    RECOMPUTE_NONE,
    RECOMPUTE_OP_SAC,
    RECOMPUTE_SELECTIVE,
    LayoutArrays,
    balanced_end_layers,
    end_stage_moe_layers,
    stage_layer_split,
)

__all__ = [
    "predict_layouts",
    "pipeline_bubble_fraction",
    "pipeline_time_s",
]

# Achievable fractions of the datasheet figures. nccl-tests on DGX A100/H100 report
# all-reduce bus bandwidth of about 80% of the NVLink per-direction figure and about 90%
# of the InfiniBand line rate; STREAM-like kernels reach about 80-90% of HBM bandwidth.
_NVLINK_EFFICIENCY = 0.8
_IB_EFFICIENCY = 0.9
_HBM_EFFICIENCY = 0.8
# FlashAttention-2 (Dao, 2023) reaches 70-73% of A100 peak forward and ~63% end to end;
# FlashAttention-3 ~75% of H100 peak. Expressed relative to the GEMM ceiling of the GPU.
# Those are their papers' 16K-token figures; shorter calls run slower
# (parallel3d_kernels.flash_attention_slowdown).
_FLASH_OVER_GEMM = 0.8
# Its backward kernel runs at a lower fraction of peak than its forward: up to 63% against
# 73% on A100 (Dao, "FlashAttention-2", 2023, Sec. 4.1), i.e. 0.86 of the forward's rate.
_FLASH_BACKWARD_OVER_FORWARD = 0.63 / 0.73
# Adam step streams fp32 param, grad, m, v in and param, m, v plus a bf16 copy out.
_ADAM_BYTES_PER_PARAM = 30.0
# Megatron-LM follows every batched pipeline send/recv with a device-wide
# ``torch.cuda.synchronize()`` ("to protect against race condition when using
# batch_isend_irecv()", megatron/core/pipeline_parallel/p2p_communication.py,
# ``batch_p2p_sync`` on by default; the 2021 code did the same). The stream queue is
# drained, so the GPU idles until the host has dispatched the next kernel: one CUDA
# launch (~5 us) plus PyTorch's eager dispatch of the first ops (~10 us each). An
# order-of-magnitude figure per exchange, not fitted to any run.
_P2P_SYNC_S = 20e-6


def pipeline_bubble_fraction(pp: FloatArray | int, v: FloatArray | int, m: FloatArray | int) -> FloatArray:
    """Idle fraction of the 1F1B / interleaved schedule, ``(p-1)/(v m)`` (Narayanan et al., SC21)."""
    fraction: FloatArray = (np.asarray(pp) - 1) / (np.asarray(v) * np.asarray(m))
    return fraction


def pipeline_time_s(
    first_s: FloatArray | float,
    middle_s: FloatArray | float,
    last_s: FloatArray | float,
    pp: FloatArray | int,
    v: FloatArray | int,
    m: FloatArray | int,
    idle_stages: FloatArray | None = None,
) -> FloatArray:
    """Time of ``m`` micro-batches through a 1F1B / interleaved pipeline of unequal stages.

    Parameters
    ----------
    first_s, middle_s, last_s : array_like
        Forward + backward time of one micro-batch on the first stage (which also
        holds the input embedding), on each middle stage, and on the last stage
        (output layer and loss), point-to-point exchanges included.
    pp, v, m : array_like
        Pipeline stages, virtual stages (model chunks) per rank, micro-batches.
    idle_stages : array_like, optional
        The schedule's fill and drain in mean stage times
        (:func:`partitioners.parallel3d.schedules.idle_stage_times`); 1F1B's ``(p-1)/v``
        when not given.

    Returns
    -------
    numpy.ndarray
        ``m * max(stage) + (p - 1) / v * mean(stage)``: the steady state runs at the
        pace of the slowest stage, while fill and drain pass through every stage once,
        so they cost the mean stage time (of which an interleaved schedule's chunks are
        ``1/v``). With equal stages this is Narayanan et al.'s ``(m + (p-1)/v) t``
        (SC21, Sec. 2.2); the pivot-stage form follows Fan et al., "DAPPLE: A
        Pipelined Data Parallel Approach for Training Large Models", PPoPP 2021, Sec. 4.
        One stage (``pp == 1``) is ``m * first_s``.

    References
    ----------
    .. [1] D. Narayanan et al., SC21, Sec. 2.2 and 3.3.
    .. [2] S. Fan et al., "DAPPLE", PPoPP 2021.
    """
    pp_f = np.asarray(pp, dtype=float)
    first = np.asarray(first_s, dtype=float)
    mid = np.asarray(middle_s, dtype=float)
    last = np.asarray(last_s, dtype=float)
    slowest = np.maximum(first, np.maximum(np.where(pp_f > 2, mid, first), last))
    mean = (first + np.maximum(pp_f - 2.0, 0.0) * mid + last) / np.maximum(pp_f, 2.0)
    idle = (pp_f - 1.0) / np.asarray(v, dtype=float) if idle_stages is None else np.asarray(idle_stages, dtype=float)
    multi = np.asarray(m, dtype=float) * slowest + idle * mean
    step_s: FloatArray = np.where(pp_f > 1, multi, np.asarray(m, dtype=float) * first)
    return step_s


# --------------------------------------------------------------------- prediction


@dataclass(frozen=True)
class _DeviceRates:
    """What one GPU and its links deliver to a training step: achievable rates, not datasheet ones."""

    peak_bf16_flops: float
    peak_linear_flops: float  # the ceiling of the precision the linear layers run in
    linear_bytes: float  # bytes per input element of a linear layer: 1 in FP8 runs, else 2
    gemm_efficiency: float
    linear_gemm_efficiency: float  # FP8 GEMMs have their own measured ceiling (GPUSpec)
    flash_attention_speed: float  # the stack's FlashAttention against the GPU's newest (FLASH_ATTENTION_SPEED)
    hbm_bytes_per_s: float  # datasheet: the GEMM roofline applies its own efficiency
    hbm_achieved_bytes_per_s: float  # what memory-bound kernels reach
    sm_count: int
    intra: LinkSpec
    inter: LinkSpec
    gpus_per_node: int
    # the run's flags resolved into physical terms, once (partitioners.parallel3d.effective)
    terms: EffectiveTerms

    @property
    def fp8(self) -> bool:
        """True when the linear layers run in FP8."""
        return self.linear_bytes == 1.0

    def _gemm_rates(self, linear: bool) -> tuple[float, float, float, int, float]:
        """Peak, efficiency, HBM bandwidth, SM count and input bytes of a linear (FP8 where it runs)
        or a 16-bit product, in the order :func:`gemm_time_s` and :func:`gemm_backward_time_s` take them."""
        if linear:
            return (
                self.peak_linear_flops,
                self.linear_gemm_efficiency,
                self.hbm_bytes_per_s,
                self.sm_count,
                self.linear_bytes,
            )
        return self.peak_bf16_flops, self.gemm_efficiency, self.hbm_bytes_per_s, self.sm_count, 2.0

    def gemm_s(
        self,
        m: FloatArray | float,
        n: FloatArray | float,
        k: FloatArray | float,
        linear: bool = True,
        batch: FloatArray | float = 1.0,
    ) -> FloatArray:
        """Forward time of ``(m x k) @ (k x n)``; ``linear=False`` for products kept in 16 bits."""
        return gemm_time_s(m, n, k, *self._gemm_rates(linear), batch)

    def gemm_backward_s(
        self,
        m: FloatArray | float,
        n: FloatArray | float,
        k: FloatArray | float,
        linear: bool = True,
        batch: FloatArray | float = 1.0,
    ) -> FloatArray:
        """Backward time (input and weight gradients) of ``(m x k) @ (k x n)``."""
        return gemm_backward_time_s(m, n, k, *self._gemm_rates(linear), batch)


def _device_rates(cluster: ClusterSpec, training: TrainingSpec) -> _DeviceRates:
    """The cluster's datasheet figures scaled to what kernels and collectives achieve."""
    peak_bf16 = cluster.peak_flops_per_s.get("bf16") or max(cluster.peak_flops_per_s.values())
    linear_bytes = 1.0 if training.precision == "fp8" and training.precision in cluster.peak_flops_per_s else 2.0
    eff = cluster.gemm_efficiency_max
    # FP8 linears run against the FP8 ceiling where one was measured (GPUSpec)
    eff_linear = cluster.fp8_gemm_efficiency_max if linear_bytes == 1.0 and cluster.fp8_gemm_efficiency_max else eff
    return _DeviceRates(
        peak_bf16_flops=peak_bf16,
        peak_linear_flops=cluster.peak_flops_per_s.get(training.precision, peak_bf16),
        linear_bytes=linear_bytes,
        gemm_efficiency=eff,
        linear_gemm_efficiency=eff_linear,
        flash_attention_speed=flash_attention_speed(cluster, training),
        hbm_bytes_per_s=cluster.hbm_bandwidth_bytes_per_s,
        hbm_achieved_bytes_per_s=cluster.hbm_bandwidth_bytes_per_s * _HBM_EFFICIENCY,
        sm_count=cluster.sm_count,
        intra=LinkSpec(cluster.intra_node_bandwidth_bytes_per_s * _NVLINK_EFFICIENCY, cluster.intra_node_latency_s),
        inter=LinkSpec(cluster.inter_node_bandwidth_bytes_per_s * _IB_EFFICIENCY, cluster.inter_node_latency_s),
        gpus_per_node=cluster.gpus_per_node,
        terms=effective_terms(training),
    )


@dataclass(frozen=True)
class _Sizes:
    """A layout's group sizes as floats (the model's arithmetic), and what follows from them."""

    dp: FloatArray
    tp: FloatArray
    pp: FloatArray
    cp: FloatArray
    ep: FloatArray
    etp: FloatArray
    mbs: FloatArray
    v: FloatArray
    order: FloatArray

    @classmethod
    def of(cls, layouts: LayoutArrays) -> _Sizes:
        return cls(*(getattr(layouts, size.name).astype(np.float64) for size in fields(cls)))

    @functools.cached_property
    def dp_in_stage(self) -> BoolArray:
        """Rank order ``tp-cp-ep-dp-pp`` (Megatron-Core's default): all data-parallel peers
        inside a pipeline stage's block of consecutive ranks, stages a block apart."""
        inside: BoolArray = self.order == ORDER_DP_INSIDE
        return inside

    @functools.cached_property
    def single(self) -> BoolArray:
        """No pipeline: one stage holds embedding, layers and output layer."""
        one_stage: BoolArray = self.pp == 1
        return one_stage

    @functools.cached_property
    def shard_dense(self) -> FloatArray:
        """Ranks a dense parameter's gradient and ZeRO state are reduced and sharded over (dp x cp)."""
        return self.dp * self.cp

    @functools.cached_property
    def folded(self) -> BoolArray:
        """MoE parallel folding: whole experts, expert groups drawn from tp x cp x dp."""
        return self.etp < self.tp

    @functools.cached_property
    def shard_expert(self) -> FloatArray:
        """The same for a routed expert's parameters: the ranks of a stage holding the same
        expert shard (tp x cp x dp over ep x etp; dp x cp over ep unfolded)."""
        return np.maximum(self.tp * self.shard_dense / (self.ep * self.etp), 1.0)

    @functools.cached_property
    def dp_inner(self) -> FloatArray:
        """Data-parallel ranks placed inside a pipeline stage's block of consecutive GPUs,
        below pp in the rank order: all of them in ``tp-cp-ep-dp-pp``; the ep of
        ``tp-cp-ep-pp-dp``, or the share of an expert group beyond tp x cp when folded
        (``tp-cp-dp_inner-pp-dp_outer``; see rank_map)."""
        pp_inside = np.where(self.folded, np.maximum(self.ep / (self.tp * self.cp), 1.0), self.ep)
        return np.where(self.dp_in_stage, self.dp, pp_inside)

    @functools.cached_property
    def stage_ranks(self) -> FloatArray:
        """Consecutive GPUs of one pipeline stage's block (tp x cp x dp_inner)."""
        return self.tp * self.cp * self.dp_inner


@dataclass(frozen=True)
class _LayerWork:
    """Seconds one GPU spends on some layers for one micro-batch, forward and backward
    (recomputation included): computation and each kind of collective."""

    compute_s: FloatArray | float
    tp_comm_s: FloatArray | float
    ep_comm_s: FloatArray | float
    cp_comm_s: FloatArray | float

    @property
    def total_s(self) -> FloatArray | float:
        return self.compute_s + self.tp_comm_s + self.ep_comm_s + self.cp_comm_s


_NO_WORK = _LayerWork(0.0, 0.0, 0.0, 0.0)


def _stage_work(
    dense_layers: FloatArray | float, dense: _LayerWork, moe_layers: FloatArray | float, moe: _LayerWork
) -> _LayerWork:
    """The work of a stage holding ``dense_layers`` and ``moe_layers`` layers."""
    return _LayerWork(
        dense_layers * dense.compute_s + moe_layers * moe.compute_s,
        dense_layers * dense.tp_comm_s + moe_layers * moe.tp_comm_s,
        moe_layers * moe.ep_comm_s,
        dense_layers * dense.cp_comm_s + moe_layers * moe.cp_comm_s,
    )


@dataclass(frozen=True)
class _BlockGemms:
    """GEMM seconds of one block (attention or MLP) on one GPU for one micro-batch; the
    column-parallel input linears' backward GEMMs are the window their asynchronous
    backward collectives run in."""

    forward_s: FloatArray | float
    backward_s: FloatArray | float
    column_dgrad_s: FloatArray | float
    column_wgrad_s: FloatArray | float


def _projection_shape(projection: AttentionProjection, tp: FloatArray) -> tuple[FloatArray | float, FloatArray | float]:
    """(output, input) features of one attention linear on one tensor-parallel rank."""
    return projection.out_per_rank(tp), projection.in_per_rank(tp)


def _attention_linear_gemms(model: ModelSpec, rates: _DeviceRates, tokens: FloatArray, tp: FloatArray) -> _BlockGemms:
    column = [_projection_shape(p, tp) for p in model.attention_projections if p.split == "column"]
    return _BlockGemms(
        forward_s=sum(rates.gemm_s(tokens, *_projection_shape(p, tp)) for p in model.attention_projections),
        backward_s=sum(rates.gemm_backward_s(tokens, *_projection_shape(p, tp)) for p in model.attention_projections),
        column_dgrad_s=sum(rates.gemm_s(tokens, k_in, n_out) for n_out, k_in in column),
        column_wgrad_s=sum(rates.gemm_s(k_in, n_out, tokens) for n_out, k_in in column),
    )


def _mla_up_projection_s(model: ModelSpec, rates: _DeviceRates, tokens: FloatArray, tp: FloatArray) -> FloatArray:
    """Forward of MLA's up-projections, which selective recomputation repeats."""
    return sum(
        (rates.gemm_s(tokens, *_projection_shape(p, tp)) for p in mla_up_projections(model)), np.zeros_like(tokens)
    )


def _dense_mlp_gemms(model: ModelSpec, rates: _DeviceRates, tokens: FloatArray, tp: FloatArray) -> _BlockGemms:
    h, up, ffn = model.hidden_size, 2 if model.gated_mlp else 1, model.ffn
    return _BlockGemms(
        forward_s=rates.gemm_s(tokens, up * ffn / tp, h) + rates.gemm_s(tokens, h, ffn / tp),
        backward_s=rates.gemm_backward_s(tokens, up * ffn / tp, h) + rates.gemm_backward_s(tokens, h, ffn / tp),
        column_dgrad_s=rates.gemm_s(tokens, h, up * ffn / tp),
        column_wgrad_s=rates.gemm_s(h, up * ffn / tp, tokens),
    )


def _moe_mlp_gemms(
    model: ModelSpec,
    rates: _DeviceRates,
    tokens: FloatArray,
    tp: FloatArray,
    ep: FloatArray,
    etp: FloatArray,
    imbalance: float,
) -> _BlockGemms:
    """Routed experts (a grouped GEMM over the local experts), shared experts and the router.

    Split over the tensor ranks (``etp = tp``) every rank runs all of the micro-batch's
    tokens through ``1/tp`` of each expert; folded (``etp = 1``) its own ``1/tp`` of the
    tokens (the sequence-parallel shard it dispatches) through whole experts: the same
    FLOPs in taller, narrower GEMMs.
    """
    moe = model.moe
    assert moe is not None, "only MoE models have routed experts"
    h, up, fe = model.hidden_size, 2 if model.gated_mlp else 1, moe.expert_ffn_hidden_size
    local_experts = moe.num_experts / ep
    # the busiest expert sets the pace (training.expert_load_imbalance)
    tokens_per_expert = np.maximum(imbalance * tokens * etp / tp * moe.experts_per_token * ep / moe.num_experts, 1.0)
    forward = rates.gemm_s(tokens_per_expert, up * fe / etp, h, batch=local_experts) + rates.gemm_s(
        tokens_per_expert, h, fe / etp, batch=local_experts
    )
    backward = rates.gemm_backward_s(tokens_per_expert, up * fe / etp, h, batch=local_experts) + rates.gemm_backward_s(
        tokens_per_expert, h, fe / etp, batch=local_experts
    )
    # the host prepares and issues each local expert's work while the GPU waits on it
    forward = forward + expert_host_issue_time_s(local_experts, rates.terms.expert_host_ops_forward)
    backward = backward + expert_host_issue_time_s(local_experts, rates.terms.expert_host_ops_backward)
    if moe.shared_experts:
        forward = (
            forward
            + rates.gemm_s(tokens, up * fe * moe.shared_experts / tp, h)
            + rates.gemm_s(tokens, h, fe * moe.shared_experts / tp)
        )
        backward = (
            backward
            + rates.gemm_backward_s(tokens, up * fe * moe.shared_experts / tp, h)
            + rates.gemm_backward_s(tokens, h, fe * moe.shared_experts / tp)
        )
    forward = forward + rates.gemm_s(tokens, float(moe.num_experts), h, linear=False)
    backward = backward + rates.gemm_backward_s(tokens, float(moe.num_experts), h, linear=False)
    return _BlockGemms(
        forward,
        backward,
        rates.gemm_s(tokens_per_expert, h, up * fe / etp, batch=local_experts),
        rates.gemm_s(h, up * fe / etp, tokens_per_expert, batch=local_experts),
    )


def _attention_core_s(
    model: ModelSpec,
    training: TrainingSpec,
    rates: _DeviceRates,
    tokens: FloatArray,
    mbs: FloatArray,
    tp: FloatArray,
    cp: FloatArray,
) -> tuple[FloatArray, FloatArray]:
    """Forward and backward seconds of the score/softmax/context part of attention."""
    s, a = model.seq_length, model.num_attention_heads
    if training.flash_attention:
        # causal flash attention skips the masked half; backward is 2.5x forward's FLOPs
        # (five matmuls against two, Dao 2023), run at a lower fraction of peak, and
        # both slower on short calls (the sequence, or its context-parallel chunks);
        # sliding-window and chunked layers skip the blocks outside their window or
        # chunk, counted as the layers' mean share (local layers interleave with global
        # ones in every family that has them, so each stage holds about that mix), at the
        # whole sequence's kernel efficiency: a window of a few hundred tokens runs its
        # few tiles slower, on a share of the work too small to move the step
        forward = (
            tokens
            * s
            * (model.query_width + model.context_width)
            / tp
            * model.attention_score_share
            * flash_attention_slowdown(s, cp)
            / (rates.peak_bf16_flops * rates.gemm_efficiency * _FLASH_OVER_GEMM * rates.flash_attention_speed)
        )
        return forward, 2.5 * forward / _FLASH_BACKWARD_OVER_FORWARD
    # batched QK^T and attention x V over the full s x s matrix (masked after),
    # plus fused scale-mask-softmax and dropout streaming 9 bytes per score
    heads_local = a / tp
    batch_heads = mbs * heads_local
    batched = rates.gemm_s(
        tokens / mbs, float(s), float(model.query_width / a), linear=False, batch=batch_heads
    ) + rates.gemm_s(tokens / mbs, float(model.context_width / a), float(s), linear=False, batch=batch_heads)
    score_bytes_fwd = 9.0 * tokens * heads_local * s
    forward = batched + score_bytes_fwd / rates.hbm_achieved_bytes_per_s
    # backward: four batched GEMMs (dQ, dK, dV, dP) and softmax/dropout backward,
    # which stream about 1.5x the forward's bytes per score (read output, grad and
    # mask, write one grad)
    return forward, 2.0 * batched + 1.5 * score_bytes_fwd / rates.hbm_achieved_bytes_per_s


def _tensor_parallel_allreduce_s(
    model: ModelSpec,
    cluster: ClusterSpec,
    training: TrainingSpec,
    rates: _DeviceRates,
    tokens: FloatArray,
    tp_sizes: IntArray,
) -> FloatArray:
    """One all-reduce of a micro-batch's activation across the tensor group (with sequence
    parallelism the all-gather + reduce-scatter that replace it move the same bytes)."""
    act_bytes = tokens * model.hidden_size * 2.0
    ar_intra = collective_time_s(lambda n, p: allreduce_time_s(n, p, rates.intra), act_bytes, tp_sizes)
    ar_inter = collective_time_s(lambda n, p: allreduce_time_s(n, p, rates.inter), act_bytes, tp_sizes)
    tp_ar = np.where(tp_sizes <= rates.gpus_per_node, ar_intra, ar_inter)
    if not training.sequence_parallel:
        # a true all-reduce: NVLink SHARP speeds it up across a full NVSwitch node (NCCL
        # picks NVLS for all-reduce only; sequence parallelism's all-gather and
        # reduce-scatter run as rings) -- see GPUSpec.nvls_allreduce_speedup
        tp_ar = np.where(
            (tp_sizes == rates.gpus_per_node) & (rates.gpus_per_node >= 8),
            tp_ar / cluster.nvls_allreduce_speedup,
            tp_ar,
        )
    return tp_ar


def _tensor_parallel_collectives(model: ModelSpec, training: TrainingSpec) -> tuple[float, float, float]:
    """Tensor-parallel collectives of one layer, in all-reduces of its activation.

    Returns the forward's and the backward's, and how many of the backward's are the
    all-gathers of the output gradient in front of the row-parallel linears (the rest,
    the column-parallel linears' input-gradient reductions, can run under their GEMMs).

    Sequential blocks (Shoeybi et al. 2019): each of attention and MLP all-reduces its
    row-parallel output forward and its column-parallel input gradient backward, 2 + 2;
    with sequence parallelism (Korthikanti et al. 2022) an all-gather before each
    column-parallel linear and a reduce-scatter after each row-parallel one, each half
    an all-reduce, the same bytes. Parallel blocks sum the two row-parallel outputs and
    reduce once (GPT-NeoX's ``gpt_j_residual``: "we can do a single allreduce after we add
    mlp / attn outputs"), so the forward's row side and the backward's output-gradient
    gather halve; each column-parallel linear still gathers its input and reduces its
    input gradient itself: 1 forward and 2 backward without sequence parallelism, 1.5
    and 1.5 with it.
    """
    sp = training.sequence_parallel
    if not model.parallel_attention_mlp:
        return 2.0, 2.0, (1.0 if sp else 0.0)
    return (1.5, 1.5, 0.5) if sp else (1.0, 2.0, 0.0)


def _mlp_tensor_parallel_collectives(model: ModelSpec, training: TrainingSpec) -> tuple[float, float, float]:
    """The MLP's own share of :func:`_tensor_parallel_collectives`, which a folded MoE
    layer (whole experts, ``etp = 1``) does not run: its tokens reach the experts by the
    expert all-to-all from their sequence-parallel shards and come back the same way.

    Sequential blocks: half of each count. Parallel blocks: the MLP's input all-gather
    (with sequence parallelism) and its input-gradient reduction; the output reduction
    and the output-gradient gather are shared with attention, which still needs them.
    """
    forward, backward, gathers = _tensor_parallel_collectives(model, training)
    if not model.parallel_attention_mlp:
        return forward / 2.0, backward / 2.0, gathers / 2.0
    return (0.5, 0.5, 0.0) if training.sequence_parallel else (0.0, 1.0, 0.0)


def _context_parallel_ring_s(
    model: ModelSpec, rates: _DeviceRates, tokens: FloatArray, tp: FloatArray, cp: FloatArray, cp_sizes: IntArray
) -> FloatArray:
    """The ring exchange of K and V chunks around the context-parallel group, one pass."""
    kv_bytes = tokens * (model.key_width + model.value_width) * 2.0 / model.kv_shards(tp)
    return np.where(
        tp * cp <= rates.gpus_per_node,
        collective_time_s(lambda n, p: allgather_time_s(n, p, rates.intra), kv_bytes * cp, cp_sizes),
        collective_time_s(lambda n, p: allgather_time_s(n, p, rates.inter), kv_bytes * cp, cp_sizes),
    )


def _context_parallel_merge_s(
    model: ModelSpec, rates: _DeviceRates, tokens: FloatArray, tp: FloatArray, cp: FloatArray
) -> tuple[FloatArray, FloatArray]:
    """Forward and backward seconds of merging the ring's per-step attention results.

    Each of the ``cp`` ring steps yields a partial result that a separate memory-bound
    kernel folds in, after the attention kernels, on the compute stream (Transformer
    Engine ``AttnFuncWithCPAndKVP2P``): forward, ``out += out_per_step * exp(lse_step -
    lse)`` reads the step's output and the running one and writes it back (6 bytes per
    bf16 element of the local heads' output); backward, ``dq += dq_`` and the travelling
    ``dkv += dkv_`` do the same over the query and key/value gradients. Cheap per step,
    but the work per rank stays ``s x mbs`` whatever ``cp`` is, while everything else
    a rank does shrinks as ``1 / cp``.
    """
    steps = np.where(cp > 1, cp, 0.0)
    per_token_fwd = 6.0 * model.context_width / tp
    per_token_bwd = 6.0 * (model.query_width / tp + (model.key_width + model.value_width) / model.kv_shards(tp))
    scale = tokens * steps / rates.hbm_achieved_bytes_per_s
    return per_token_fwd * scale, per_token_bwd * scale


def _expert_exchange_s(
    model: ModelSpec, training: TrainingSpec, rates: _DeviceRates, tokens: FloatArray, sizes: _Sizes
) -> tuple[FloatArray, FloatArray]:
    """One expert-parallel all-to-all (the mean of a dispatch and a combine) per MoE layer,
    and the permute/unpermute passes around it.

    Each rank sends its ``1/tp`` share of the tokens either way. An expert group's members
    sit ``tp x cp`` ranks apart (``tp-cp-ep-pp-dp``), or next to each other when folded.
    """
    h, moe, tp = model.hidden_size, model.moe, sizes.tp
    assert moe is not None, "only MoE models exchange tokens between experts"
    stride = np.where(sizes.folded, 1.0, sizes.tp * sizes.cp)
    if training.expert_dispatch == "node-deduplicated":
        # FP8 runs dispatch the FP8 copy the expert GEMM quantizes anyway (1 byte and a
        # 4-byte scale per 128 elements, DeepSeek-V3 Sec. 3.3.2); combines stay 16-bit
        token_bytes = training.expert_load_imbalance * tokens * h / tp
        dispatch_bytes = 1.0 + 4.0 / 128.0 if rates.fp8 else 2.0
        one_way = functools.partial(
            deduplicated_dispatch_time_s,
            experts_per_token=moe.experts_per_token,
            num_groups=moe.num_groups,
            group_topk=moe.group_topk,
            stride=stride,
            ep=sizes.ep,
            gpus_per_node=rates.gpus_per_node,
            intra=rates.intra,
            inter=rates.inter,
        )
        # the mean of a dispatch and a combine: _layer_work counts them in pairs
        a2a = 0.5 * (one_way(token_bytes * dispatch_bytes) + one_way(token_bytes * 2.0))
    else:
        a2a_bytes = training.expert_load_imbalance * tokens * moe.experts_per_token * h * 2.0 / tp
        a2a = expert_alltoall_time_s(a2a_bytes, stride, sizes.ep, rates.gpus_per_node, rates.intra, rates.inter)
    permute = tokens * 8.0 * moe.experts_per_token * h / tp / rates.hbm_achieved_bytes_per_s
    return a2a, permute


def _layer_work(
    model: ModelSpec,
    cluster: ClusterSpec,
    training: TrainingSpec,
    rates: _DeviceRates,
    layouts: LayoutArrays,
    sizes: _Sizes,
    tokens: FloatArray,
    full_frac: FloatArray,
    with_plain: bool = False,
) -> tuple[_LayerWork, _LayerWork, FloatArray, tuple[_LayerWork, _LayerWork] | None]:
    """Work of one dense and of one MoE layer (``_NO_WORK`` without MoE) for one
    micro-batch, and one tensor-parallel all-reduce of the activation; ``with_plain``,
    also the two layers' work without recomputation."""
    tp, cp, ep, etp, mbs = sizes.tp, sizes.cp, sizes.ep, sizes.etp, sizes.mbs
    rc = layouts.recompute
    h, up = model.hidden_size, 2 if model.gated_mlp else 1
    hbm_eff = rates.hbm_achieved_bytes_per_s

    attention = _attention_linear_gemms(model, rates, tokens, tp)
    mla_up_fwd = _mla_up_projection_s(model, rates, tokens, tp)
    mlp = {False: _dense_mlp_gemms(model, rates, tokens, tp)}
    if model.moe is not None:
        mlp[True] = _moe_mlp_gemms(model, rates, tokens, tp, ep, etp, training.expert_load_imbalance)
    attn_core_fwd, attn_core_bwd = _attention_core_s(model, training, rates, tokens, mbs, tp, cp)

    rep_div = np.where(training.sequence_parallel, tp, 1.0)
    # LayerNorms (read + write), two bias-dropout-residual adds (read 2, write 1, mask 0.5)
    elementwise_fwd = tokens * (22.0 * h / rep_div + 2.0 * (up + 1) * model.ffn / tp) / hbm_eff
    # selective recomputation under flash attention (activation_bytes_per_layer) rebuilds
    # the norm outputs (read 2 + write 2 bytes per element) and the MLP's activation
    # output from the kept up-projection output (read 2 per up-projection + write one)
    norm_rebuild = tokens * 8.0 * (h + model.latent_width) / rep_div / hbm_eff
    act_rebuild = {False: tokens * (2.0 * up + rates.linear_bytes) * model.ffn / tp / hbm_eff}
    if model.moe is not None:
        act_rebuild[True] = (
            tokens
            * (model.moe.experts_per_token + model.moe.shared_experts)
            * (2.0 * up + rates.linear_bytes)
            * model.moe.expert_ffn_hidden_size
            / tp
            / hbm_eff
        )
    quantize_fwd, quantize_bwd = fp8_quantize_time_s(model, training, tokens, tp, hbm_eff, fp8=rates.fp8)

    # tensor parallel: 2 all-reduces (or all-gather + reduce-scatter with sequence
    # parallelism, the same bytes) of the full activation per layer forward, 2 backward
    tp_ar = _tensor_parallel_allreduce_s(model, cluster, training, rates, tokens, layouts.tp)
    # context parallel: ring exchange of K and V chunks, overlapped with attention
    cp_ring = _context_parallel_ring_s(model, rates, tokens, tp, cp, layouts.cp)
    cp_fwd = overlapped_time_s(cp_ring, attn_core_fwd)
    cp_bwd = overlapped_time_s(2.0 * cp_ring, attn_core_bwd)
    cp_merge_fwd, cp_merge_bwd = _context_parallel_merge_s(model, rates, tokens, tp, cp)
    # expert parallel: dispatch + combine all-to-all per MoE layer forward, twice backward
    if model.moe is not None:
        a2a, moe_elem = _expert_exchange_s(model, training, rates, tokens, sizes)
    else:
        a2a = moe_elem = np.zeros_like(tokens)

    def async_backward_tp(dgrad: FloatArray | float, wgrad: FloatArray | float) -> FloatArray:
        """Exposed part of one column-parallel linear's asynchronous backward collectives.

        Without sequence parallelism the input-gradient all-reduce runs under the
        weight-gradient GEMM; with it, the input's all-gather under the input-gradient
        GEMM and the input-gradient reduce-scatter under the weight-gradient GEMM (each
        half the all-reduce's bytes).
        """
        if training.sequence_parallel:
            return overlapped_time_s(tp_ar / 2.0, dgrad) + overlapped_time_s(tp_ar / 2.0, wgrad)
        return overlapped_time_s(tp_ar, wgrad)

    gaps_fwd, gaps_bwd = layer_kernel_gaps_s()
    tp_collectives = np.array(_tensor_parallel_collectives(model, training))
    mlp_collectives = np.array(_mlp_tensor_parallel_collectives(model, training))

    def layer(is_moe: bool, full_frac: FloatArray = full_frac, rc: IntArray = rc) -> _LayerWork:
        # a folded MoE layer's experts run no tensor-parallel collectives
        mlp_tp = np.where(sizes.folded, 0.0, 1.0) if is_moe else np.ones_like(tokens)
        tp_forward, tp_backward, tp_output_grad_gathers = (
            tp_collectives[j] - (1.0 - mlp_tp) * mlp_collectives[j] for j in range(3)
        )
        gemm_f = attention.forward_s + mlp[is_moe].forward_s
        gemm_b = attention.backward_s + mlp[is_moe].backward_s
        elem = elementwise_fwd + (moe_elem if is_moe else 0.0)
        # every kernel leaves the GPU idle a moment before the next starts (layer_kernel_gaps_s)
        fwd_compute = gemm_f + attn_core_fwd + cp_merge_fwd + elem + quantize_fwd[is_moe] + gaps_fwd
        bwd_compute = gemm_b + attn_core_bwd + cp_merge_bwd + 2.0 * elem + quantize_bwd[is_moe] + gaps_bwd
        selective = mla_up_fwd + (norm_rebuild + act_rebuild[is_moe] if training.flash_attention else attn_core_fwd)
        # op-level SAC recomputes every other matmul and every element-wise op of the forward
        op_sac = 0.5 * gemm_f + elem + quantize_fwd[is_moe]
        recompute_compute = (
            full_frac * fwd_compute
            + np.where(rc == RECOMPUTE_SELECTIVE, selective, 0.0)
            + np.where(rc == RECOMPUTE_OP_SAC, op_sac, 0.0)
        )
        compute = fwd_compute + bwd_compute + recompute_compute
        tp_comm = (tp_forward * (1.0 + full_frac) + tp_backward) * tp_ar
        if rates.terms.tp_overlap == TP_ASYNC_BACKWARD:
            # Megatron's column-parallel linears (QKV, MLP up-projection) run their backward
            # collectives asynchronously under their own GEMMs (Megatron-LM
            # linear_with_grad_accumulation_and_async_allreduce: "the tensor parallel all
            # reduce of the input gradients can be done asynchronously with the calculation
            # of the weight gradients"); what stays in line is the forward's, the
            # recomputed forward's and, with sequence parallelism, the all-gather of the
            # output gradient in front of the row-parallel linears
            in_line = tp_forward * (1.0 + full_frac) + tp_output_grad_gathers
            tp_comm = (
                in_line * tp_ar
                + async_backward_tp(attention.column_dgrad_s, attention.column_wgrad_s)
                + mlp_tp * async_backward_tp(mlp[is_moe].column_dgrad_s, mlp[is_moe].column_wgrad_s)
            )
        if rates.terms.tp_overlap == TP_PIPELINED:
            # pipelined all-gather/reduce-scatter under the neighbouring GEMMs (Transformer
            # Engine userbuffers; Wang et al., "Overlap communication with dependent
            # computation via decomposition", ASPLOS 2023): what the GEMMs cannot cover
            # stays exposed, plus the first and last chunk of each collective (~1/8)
            linear = gemm_f + gemm_b + full_frac * gemm_f
            tp_comm = overlapped_time_s(tp_comm, linear, tp_comm / 8.0)
        # expert all-to-alls per MoE layer: a dispatch and a combine forward, both again
        # backward, and again when the forward is recomputed
        ep_comm = (4.0 + 2.0 * full_frac) * a2a if is_moe else np.zeros_like(compute)
        if rates.terms.ep_comm_paired and is_moe:
            # one micro-batch's forward of the layer paired with another's backward, each
            # all-to-all under one block of the other's computation (_paired_expert_exchange_s)
            attention_fwd = attention.forward_s + attn_core_fwd + cp_merge_fwd + elementwise_fwd
            attention_bwd = attention.backward_s + attn_core_bwd + cp_merge_bwd + 2.0 * elementwise_fwd
            mlp_fwd = mlp[True].forward_s + moe_elem + quantize_fwd[True]
            mlp_bwd = mlp[True].backward_s + 2.0 * moe_elem + quantize_bwd[True]
            ep_comm = (
                _paired_expert_exchange_s(a2a, attention_fwd, mlp_fwd, attention_bwd, mlp_bwd) + 2.0 * full_frac * a2a
            )
        cp_comm = cp_fwd + cp_bwd + full_frac * cp_fwd
        return _LayerWork(compute, tp_comm, ep_comm, cp_comm)

    plain = None
    if with_plain:
        none, nothing = np.zeros_like(full_frac), np.full_like(rc, RECOMPUTE_NONE)
        plain = layer(False, none, nothing), (layer(True, none, nothing) if model.num_moe_layers else _NO_WORK)
    return layer(False), (layer(True) if model.num_moe_layers else _NO_WORK), tp_ar, plain


def _paired_expert_exchange_s(
    a2a_s: FloatArray,
    attention_fwd_s: FloatArray,
    mlp_fwd_s: FloatArray,
    attention_bwd_s: FloatArray,
    mlp_bwd_s: FloatArray,
) -> FloatArray | float:
    """Critical-path time of a MoE layer's four all-to-alls when a forward and a backward overlap.

    Megatron-Core's ``--overlap-moe-expert-parallel-comm`` runs one micro-batch's forward
    of a layer beside another's backward and pairs each exchange with one block of the
    other pass (``schedule_layer_1f1b`` in its fine-grained 1F1B schedule, after
    DeepSeek-V3's DualPipe, Technical Report Sec. 3.2.1): the backward's combine under
    the forward's attention, the forward's dispatch under the backward's MLP, the
    backward's dispatch under the forward's MLP, the forward's combine under the
    backward's attention. An exchange longer than its block stays partly exposed
    however much computation the rest of the layer has; the hidden part slows the
    block it runs under (``overlapped_time_s``).
    """
    return sum(
        overlapped_time_s(a2a_s, window_s) for window_s in (attention_fwd_s, mlp_bwd_s, mlp_fwd_s, attention_bwd_s)
    )


@dataclass(frozen=True)
class _EndStageWork:
    """Per micro-batch work only the end stages do, beside their layers."""

    embedding_s: FloatArray  # input embedding lookup and gradient, first stage
    embedding_tp_s: FloatArray  # the all-reduce of the looked-up rows across the tensor group
    logits_s: FloatArray  # output layer and loss, last stage
    mtp: _LayerWork  # multi-token prediction modules (their logits in compute_s), last stage


def _end_stage_work(
    model: ModelSpec,
    rates: _DeviceRates,
    tokens: FloatArray,
    tp: FloatArray,
    tp_ar: FloatArray,
    dense: _LayerWork,
    moe: _LayerWork,
) -> _EndStageWork:
    """What the first and last stages do per micro-batch besides their layers."""
    h, vocab = model.hidden_size, model.vocab_size
    # output layer + vocab-parallel cross-entropy on the last stage (fp32 logits,
    # a few passes of 4 bytes per logit). The output head stays in 16-bit in FP8 runs:
    # DeepSeek-V3 keeps "the embedding module, the output head, MoE gating modules,
    # normalization operators, and attention operators" in BF16/FP32 (DeepSeek-V3
    # Technical Report, Sec. 3.3.1), and Megatron-Core's output layer is its own
    # ColumnParallelLinear, outside Transformer Engine's FP8 autocast.
    logits_s = (
        rates.gemm_s(tokens, vocab / tp, h, linear=False)
        + rates.gemm_backward_s(tokens, vocab / tp, h, linear=False)
        + tokens * vocab / tp * 16.0 / rates.hbm_achieved_bytes_per_s
    )
    # multi-token prediction on the last stage: per module one more layer of the last
    # layer's kind, its 2h -> h projection and one more pass through the output head
    if model.mtp_layers:
        layer = _stage_work(0.0, dense, 1.0, moe) if model.mtp_layer_is_moe else _stage_work(1.0, dense, 0.0, moe)
        n = model.mtp_layers
        mtp = _LayerWork(
            n
            * (
                layer.compute_s
                + rates.gemm_s(tokens, h / tp, 2.0 * h)
                + rates.gemm_backward_s(tokens, h / tp, 2.0 * h)
                + logits_s
            ),
            n * layer.tp_comm_s,
            n * layer.ep_comm_s,
            n * layer.cp_comm_s,
        )
    else:
        none = np.zeros_like(tokens)
        mtp = _LayerWork(none, none, none, none)
    # the partial rows of the vocabulary-parallel lookup are all-reduced across the
    # tensor group (reduce-scatter with sequence parallelism: the same bytes)
    return _EndStageWork(embedding_time_s(tokens, h, vocab, tp, rates.hbm_achieved_bytes_per_s), tp_ar, logits_s, mtp)


@dataclass(frozen=True)
class _StageSplit:
    """Layers per pipeline stage: ``full`` on the full middle stages (``full_dense`` +
    ``full_moe`` of each kind), ``first`` and ``last`` on the end stages (of which
    ``first_moe`` and ``last_moe`` are MoE layers)."""

    full: FloatArray
    full_dense: FloatArray
    full_moe: FloatArray
    first: FloatArray
    first_moe: FloatArray
    last: FloatArray
    last_moe: FloatArray


@dataclass(frozen=True)
class _StageParameters:
    """Parameters one GPU holds on the first, a full middle and the last pipeline stage:
    dense ones (sharded over data x context parallel) and routed experts (over their own group)."""

    first_dense: FloatArray
    first_expert: FloatArray
    mid_dense: FloatArray
    mid_expert: FloatArray
    last_dense: FloatArray
    last_expert: FloatArray
    output: float  # the whole model's output layer (the word embedding when tied)
    embedding_copy: FloatArray | float  # the untied word embedding MTP keeps on the last stage

    def largest(self, pp: FloatArray) -> tuple[FloatArray, FloatArray, FloatArray]:
        """Parameters of the stage holding the most (its reduction finishes last), and the
        most dense and expert parameters of any stage."""
        has_mid = pp >= 3
        mid_dense = np.where(has_mid, self.mid_dense, 0.0)
        mid_expert = np.where(has_mid, self.mid_expert, 0.0)
        total = np.maximum(
            np.maximum(self.first_dense + self.first_expert, self.last_dense + self.last_expert), mid_dense + mid_expert
        )
        dense = np.maximum(np.maximum(self.first_dense, self.last_dense), mid_dense)
        expert = np.maximum(np.maximum(self.first_expert, self.last_expert), mid_expert)
        return total, dense, expert


def _stage_parameters(
    model: ModelSpec,
    counts: ParameterCounts,
    tp: FloatArray,
    ep: FloatArray,
    etp: FloatArray,
    split: _StageSplit,
    single: BoolArray,
) -> _StageParameters:
    """Parameters per GPU on each kind of stage: its layers' share plus, on the first,
    the embedding (and position table) and, on the last, the output layer and any
    multi-token-prediction modules (all on one stage when ``single``). Routed experts
    are split over ``ep x etp`` ranks."""
    attn_gpu = counts.attention_per_gpu(tp)
    mid_dense = (
        split.full * attn_gpu
        + (split.full_dense * counts.dense_mlp_per_layer + split.full_moe * counts.moe_shared_per_layer) / tp
    )
    mid_expert = split.full_moe * counts.experts_per_layer / (ep * etp)
    first_dense = (
        split.first * attn_gpu
        + ((split.first - split.first_moe) * counts.dense_mlp_per_layer + split.first_moe * counts.moe_shared_per_layer)
        / tp
        + counts.embedding / tp
        + counts.position_embedding
    )
    first_expert = split.first_moe * counts.experts_per_layer / (ep * etp)
    output = counts.output if counts.output else counts.embedding
    last_dense = (
        split.last * attn_gpu
        + ((split.last - split.last_moe) * counts.dense_mlp_per_layer + split.last_moe * counts.moe_shared_per_layer)
        / tp
        + output / tp
    )
    last_expert = split.last_moe * counts.experts_per_layer / (ep * etp)
    # multi-token prediction: its layers and projections, and (untied) a copy of the embedding
    mtp_mlp = counts.moe_shared_per_layer if model.mtp_layer_is_moe else counts.dense_mlp_per_layer
    mtp_dense = model.mtp_layers * (attn_gpu + (mtp_mlp + counts.mtp_projection) / tp)
    mtp_expert = model.mtp_layers * (counts.experts_per_layer / (ep * etp) if model.mtp_layer_is_moe else 0.0)
    embedding_copy = counts.embedding / tp if model.mtp_layers and counts.output else 0.0
    last_dense = last_dense + mtp_dense + embedding_copy
    last_expert = last_expert + mtp_expert
    # pp == 1: one stage holds embedding and output
    first_dense = np.where(single, first_dense + counts.output / tp + mtp_dense, first_dense)
    first_expert = np.where(single, first_expert + mtp_expert, first_expert)
    return _StageParameters(
        first_dense, first_expert, mid_dense, mid_expert, last_dense, last_expert, output, embedding_copy
    )


@dataclass(frozen=True)
class _StageTimes:
    """Forward + backward seconds of one micro-batch on the first, a full middle and the
    last stage (point-to-point exchanges not included), the slowest of them, and how
    the slowest one's time splits."""

    first_s: FloatArray
    middle_s: FloatArray
    last_s: FloatArray
    slowest_s: FloatArray
    slowest: _LayerWork


def _stage_times(
    training: TrainingSpec,
    rates: _DeviceRates,
    single: BoolArray,
    has_middle: BoolArray,
    first: _LayerWork,
    mid: _LayerWork,
    last: _LayerWork,
    ends: _EndStageWork,
    params: _StageParameters,
) -> _StageTimes:
    """Per-micro-batch time of the first, a middle and the last stage, and which one paces the pipeline.

    A pipeline of two stages has no middle one (``has_middle`` False): there the full
    ``ceil(L/p)``-layer stage that ``mid`` describes does not exist, and only the first
    and last stages can pace it, as in :func:`pipeline_time_s`.
    """

    # unfused weight-gradient accumulation: one pass over the stage's parameters per micro-batch
    def accumulation_s(params_per_gpu: FloatArray) -> FloatArray:
        if not rates.terms.separate_gradient_accumulation:
            return np.zeros_like(params_per_gpu)
        return gradient_accumulation_time_s(
            params_per_gpu, training.grad_bytes_per_param, rates.hbm_achieved_bytes_per_s
        )

    mid_acc = accumulation_s(params.mid_dense + params.mid_expert)
    first_acc = accumulation_s(params.first_dense + params.first_expert)
    last_acc = accumulation_s(params.last_dense + params.last_expert)
    logits, mtp = ends.logits_s, ends.mtp
    mtp_time = mtp.total_s
    mid_total = mid.total_s + mid_acc
    first_total = first.total_s + ends.embedding_s + ends.embedding_tp_s + first_acc
    last_total = last.total_s + logits + mtp_time + last_acc
    # the slowest stage paces the steady state (Narayanan et al. SC21, Sec. 2.2: every
    # stage runs one forward and one backward per micro-batch in lock-step)
    pacing_mid_total = np.where(has_middle, mid_total, 0.0)
    slowest_s = np.where(
        single, first_total + logits + mtp_time, np.maximum(first_total, np.maximum(pacing_mid_total, last_total))
    )
    use_last = (~single) & (last_total >= first_total) & (last_total > pacing_mid_total)
    use_first = (~single) & (~use_last) & (first_total > pacing_mid_total)
    which = [single, use_last, use_first]
    slowest = _LayerWork(
        np.select(
            which,
            [
                first.compute_s + logits + mtp.compute_s + ends.embedding_s + first_acc,
                last.compute_s + logits + mtp.compute_s + last_acc,
                first.compute_s + ends.embedding_s + first_acc,
            ],
            default=mid.compute_s + mid_acc,
        ),
        np.select(
            which,
            [
                first.tp_comm_s + ends.embedding_tp_s + mtp.tp_comm_s,
                last.tp_comm_s + mtp.tp_comm_s,
                first.tp_comm_s + ends.embedding_tp_s,
            ],
            default=mid.tp_comm_s,
        ),
        np.select(
            which,
            [first.ep_comm_s + mtp.ep_comm_s, last.ep_comm_s + mtp.ep_comm_s, first.ep_comm_s],
            default=mid.ep_comm_s,
        ),
        np.select(
            which,
            [first.cp_comm_s + mtp.cp_comm_s, last.cp_comm_s + mtp.cp_comm_s, first.cp_comm_s],
            default=mid.cp_comm_s,
        ),
    )
    return _StageTimes(first_total, mid_total, last_total, slowest_s, slowest)


def _pipeline_exchange_s(
    model: ModelSpec,
    training: TrainingSpec,
    rates: _DeviceRates,
    layouts: LayoutArrays,
    sizes: _Sizes,
    tokens: FloatArray,
    stage_time_s: FloatArray,
) -> tuple[FloatArray, FloatArray]:
    """Bytes one tensor rank sends across a stage boundary per exchange, and the seconds
    of point-to-point exchange per micro-batch (activation forward, gradient backward,
    per model chunk)."""
    tp, v = sizes.tp, sizes.v
    gpn = rates.gpus_per_node
    # Each tensor rank sends 1/t of the activation: with sequence parallelism it holds only
    # that; without it Megatron's scatter-gather sends 1/t and the receiver all-gathers the
    # shards over NVLink (SC21 Sec. 4.1), or, with that turned off, every rank sends it whole.
    # The pipeline is paced by its slowest boundary: once the stages of one pipeline
    # do not all fit in one node, some boundary crosses the inter-node network.
    whole_activation = rates.terms.pipeline_send == "whole"
    p2p_bytes = tokens * model.hidden_size * 2.0 / np.where(whole_activation, 1.0, tp)
    stage_ranks = sizes.stage_ranks
    pp_inter = (stage_ranks >= gpn) | (stage_ranks * sizes.pp > gpn)
    p2p_one = np.where(
        pp_inter, point_to_point_time_s(p2p_bytes, rates.inter), point_to_point_time_s(p2p_bytes, rates.intra)
    )
    if rates.terms.pipeline_send == "shard-then-gather":
        p2p_one = p2p_one + collective_time_s(
            lambda n, p: allgather_time_s(n, p, rates.intra), p2p_bytes * tp, layouts.tp
        )
    # with overlap_p2p_comm (interleaved schedule only) each exchange is posted
    # asynchronously and waited for when the next model chunk needs it: it runs under the
    # current chunk's forward or backward, without the batched exchange's device sync
    # a schedule pairing one micro-batch's forward with another's backward (DualPipe) sends under them
    async_p2p = (rates.terms.p2p_async_when_interleaved & (v > 1.0)) | rates.terms.schedule.pairs_chunks
    chunk_window = stage_time_s / (2.0 * v)
    p2p_one = np.where(async_p2p, overlapped_time_s(p2p_one, chunk_window), p2p_one + _P2P_SYNC_S)
    return p2p_bytes, np.where(sizes.single, 0.0, 2.0 * v * p2p_one)


def _memory_per_gpu(
    model: ModelSpec,
    training: TrainingSpec,
    rates: _DeviceRates,
    counts: ParameterCounts,
    layouts: LayoutArrays,
    sizes: _Sizes,
    split: _StageSplit,
    params: _StageParameters,
    tokens: FloatArray,
    full_frac: FloatArray,
    m: FloatArray,
    p2p_bytes: FloatArray,
) -> dict[str, FloatArray]:
    """Memory of the fullest of the first, the last and a middle pipeline stage, by part
    (the ``*_bytes`` entries of predict_layouts and ``fullest_stage``)."""
    tp, pp, v, single = sizes.tp, sizes.pp, sizes.v, sizes.single
    shard_dense, shard_expert = sizes.shard_dense, sizes.shard_expert
    zero_held = zero_stage_held(layouts.zero, pp)
    fp8 = rates.fp8

    # embedding, output layer and position table stay 16-bit in FP8 runs
    first_unquantized = counts.embedding / tp + counts.position_embedding + np.where(single, counts.output / tp, 0.0)
    last_unquantized = params.output / tp + params.embedding_copy
    w_first, g_first, o_first = model_state_bytes(
        params.first_dense, params.first_expert, zero_held, shard_dense, shard_expert, training, fp8, first_unquantized
    )
    w_last, g_last, o_last = model_state_bytes(
        params.last_dense, params.last_expert, zero_held, shard_dense, shard_expert, training, fp8, last_unquantized
    )
    stages = stage_activation_bytes(
        model,
        training,
        tokens,
        tp,
        layouts.recompute,
        full_frac,
        split.full,
        split.full_moe,
        split.first,
        split.last,
        pp,
        v,
        m,
        fp8_gemm_inputs=fp8,
        first_moe_layers=split.first_moe,
        last_moe_layers=split.last_moe,
    )
    act_first, act_last, act_mid = stages.first_bytes, stages.last_bytes, stages.middle_bytes
    has_mid = pp >= 3
    # a shortened middle stage holds one layer less
    held_mid = np.where(has_mid, stages.middle_layers / split.full, 0.0)
    w_mid, g_mid, o_mid = model_state_bytes(
        params.mid_dense * held_mid,
        params.mid_expert * held_mid,
        zero_held,
        shard_dense,
        shard_expert,
        training,
        fp8,
        0.0,
    )

    schedule = rates.terms.schedule
    if schedule.weight_copies == 2:
        # DualPipe: rank i holds stage i and stage p-1-i, so the end ranks hold the first
        # and the last stage, the others two middle stages. Each stage now lives on 2 x dp
        # ranks, over which ZeRO shards its optimizer state: a rank's share stays that of one stage.
        # One stage (pp 1) has nothing to pair.
        sharded = zero_held >= 1
        o_ends = np.where(sharded, np.maximum(o_first, o_last), o_first + o_last)
        w_first, g_first, o_first = (
            np.where(single, w_first, w_first + w_last),
            np.where(single, g_first, g_first + g_last),
            np.where(single, o_first, o_ends),
        )
        w_last, g_last, o_last = w_first, g_first, o_first
        w_mid, g_mid, o_mid = 2.0 * w_mid, 2.0 * g_mid, np.where(sharded, o_mid, 2.0 * o_mid)
    if schedule.extra_micro_batches_held:
        # DualPipe(V): every rank holds p + 1 (p + 1/2) micro-batches of a stage's
        # activations where 1F1B's first stage holds p and the others fewer (schedules.py)
        held = np.minimum(m, pp + schedule.extra_micro_batches_held)
        per_micro_batch_first = act_first / np.minimum(m, pp)
        act_first = np.where(single, act_first, held * per_micro_batch_first)
        act_mid = np.where(has_mid, np.maximum(act_mid, held * per_micro_batch_first), 0.0)
        act_last = np.where(single, act_last, np.maximum(act_last, held * per_micro_batch_first))

    # ---- buffers: fixed reserve, ZeRO-3 prefetch of two layers, p2p and TP staging
    layer_params_gpu = counts.attention_per_gpu(tp) + counts.dense_mlp_per_layer / tp
    buffers = (
        RESERVED_BYTES
        + np.where(zero_held >= 3, 2.0 * 2.0 * layer_params_gpu, 0.0)
        + 2.0 * tokens * model.hidden_size * 2.0
        + 2.0 * p2p_bytes
    )

    total_first = w_first + g_first + o_first + act_first + buffers
    total_last = w_last + g_last + o_last + act_last + buffers
    total_mid = w_mid + g_mid + o_mid + act_mid + buffers
    worst_last = (~single) & (total_last > total_first)
    worst_mid = has_mid & (total_mid > np.maximum(total_first, total_last))
    worst_last = worst_last & ~worst_mid

    def at_worst(first_value: FloatArray, last_value: FloatArray, mid_value: FloatArray) -> FloatArray:
        return np.select([worst_mid, worst_last], [mid_value, last_value], default=first_value)

    return {
        "parameters_bytes": at_worst(w_first, w_last, w_mid),
        "gradients_bytes": at_worst(g_first, g_last, g_mid),
        "optimizer_state_bytes": at_worst(o_first, o_last, o_mid),
        "activations_bytes": at_worst(act_first, act_last, act_mid),
        "buffers_bytes": buffers,
        "fullest_stage": np.select([worst_mid, worst_last], [stages.middle_rank, pp - 1.0], default=0.0),
        "memory_bytes": at_worst(total_first, total_last, total_mid),
    }


def gradient_bucket_count(params_gpu: FloatArray, dp: FloatArray, overlap_grad_reduce: bool) -> FloatArray:
    """Collectives a stage's data-parallel gradient reduction is issued as.

    Megatron-Core's DDP fills buckets of ``max(40M, 1M x dp)`` parameters, "larger DP sizes
    need larger buckets to ensure collectives do not become latency-bound"
    (``DistributedDataParallelConfig.bucket_size``), and without ``overlap_grad_reduce``
    reduces each gradient buffer in one collective (``DistributedDataParallel.__init__``
    sets the bucket size to infinity; Megatron-LM's 2021 local DDP all-reduced its
    contiguous buffer whole). Each collective pays its latency once
    (:func:`~partitioners.parallel3d.comm.two_level_allreduce_time_s`).
    """
    if not overlap_grad_reduce:
        return np.ones_like(np.asarray(params_gpu, dtype=float))
    return np.maximum(np.ceil(params_gpu / np.maximum(40e6, 1e6 * dp)), 1.0)


def _data_parallel_s(
    training: TrainingSpec,
    rates: _DeviceRates,
    layouts: LayoutArrays,
    sizes: _Sizes,
    layers_per_stage: FloatArray,
    m: FloatArray,
    dense_params_gpu: FloatArray,
    expert_params_gpu: FloatArray,
    slowest: _LayerWork,
) -> tuple[FloatArray, FloatArray]:
    """Seconds of data-parallel gradient reduction (and ZeRO weight gathers) a step
    leaves on the critical path after overlapping it with the backward, and their total.

    The stage with the most parameters finishes its reduction last; its slowest
    micro-batch's backward is the window the reduction can hide in.
    """
    tp, pp, ep, v, single = sizes.tp, sizes.pp, sizes.ep, sizes.v, sizes.single
    zero = layouts.zero
    q = layers_per_stage
    gpn = rates.gpus_per_node
    intra, inter = rates.intra, rates.inter
    shard_dense, shard_expert = sizes.shard_dense, sizes.shard_expert
    gb = float(training.grad_bytes_per_param)
    deferred = zero_stage_held(zero, pp) != zero

    block = sizes.stage_ranks
    pp_in_node = np.minimum(pp, np.maximum(1.0, np.floor(gpn / block)))
    local_dense = np.clip(np.floor(gpn / (tp * pp_in_node)), 1.0, shard_dense)
    local_dense = np.where(shard_dense % local_dense == 0, local_dense, 1.0)
    groups_dense = shard_dense / local_dense
    # an expert shard's data-parallel peers: a stage block apart (tp-cp-ep-pp-dp), or
    # folded, every ep-th rank of the block as well
    peers_in_block = np.where(sizes.folded, np.maximum(np.minimum(block, gpn) / ep, 1.0), 1.0)
    local_exp = np.clip(peers_in_block * np.maximum(np.floor(gpn / (block * pp)), 1.0), 1.0, shard_expert)
    # tp-cp-ep-dp-pp: an unfolded expert shard's peers are tp x cp x ep ranks apart
    local_exp_dp_inside = np.where(sizes.folded, peers_in_block, np.maximum(np.floor(gpn / (tp * sizes.cp * ep)), 1.0))
    local_exp = np.where(sizes.dp_in_stage, np.clip(local_exp_dp_inside, 1.0, shard_expert), local_exp)
    local_exp = np.where(shard_expert % local_exp == 0, local_exp, 1.0)
    groups_exp = shard_expert / local_exp

    def dp_allreduce(
        n_bytes_dense: FloatArray,
        n_bytes_expert: FloatArray,
        calls_dense: FloatArray,
        calls_expert: FloatArray,
        algorithms: tuple[str, ...] = ("ring", "tree"),
    ) -> FloatArray:
        return two_level_allreduce_time_s(
            n_bytes_dense, local_dense, groups_dense, intra, inter, calls_dense, algorithms
        ) + two_level_allreduce_time_s(n_bytes_expert, local_exp, groups_exp, intra, inter, calls_expert, algorithms)

    # ZeRO-3 gathers one layer at a time; other gradients travel in Megatron-Core's buckets
    overlap = rates.terms.dp_reduce_under_backward
    buckets_dense = gradient_bucket_count(dense_params_gpu, sizes.dp, overlap)
    buckets_expert = gradient_bucket_count(expert_params_gpu, sizes.dp, overlap)
    per_layer = np.maximum(q, 1.0)
    ar_grads = dp_allreduce(gb * dense_params_gpu, gb * expert_params_gpu, buckets_dense, buckets_expert)
    ring = ("ring",)
    # reduce-scatter and all-gather are each half a ring all-reduce (Rabenseifner)
    rs_grads = 0.5 * dp_allreduce(gb * dense_params_gpu, gb * expert_params_gpu, buckets_dense, buckets_expert, ring)
    # weights are gathered in 16 bits, or in FP8 where they are kept in FP8 (fp8_params)
    gathered = 1.0 if rates.fp8 and training.fp8_params else 2.0
    ag_params = 0.5 * np.where(
        zero >= 3,
        dp_allreduce(gathered * dense_params_gpu, gathered * expert_params_gpu, per_layer, per_layer, ring),
        dp_allreduce(gathered * dense_params_gpu, gathered * expert_params_gpu, buckets_dense, buckets_expert, ring),
    )

    # the last micro-batch's backward on a stage is the window the gradient reduction can hide in
    bwd_window = slowest.total_s * (2.0 / 3.0)
    fwd_window = bwd_window / 2.0
    tail = 1.0 / np.maximum(q, 1.0)  # the first layer's gradients are ready only at the very end

    # ZeRO-3 overlaps by construction, whatever the DDP flag says: DeepSpeed stage 3
    # prefetches the next parameters and reduces gradients during the backward
    # (``overlap_comm`` defaults to true for stage 3 only, DeepSpeed config docs), and
    # PyTorch FSDP issues each unit's all-gather and reduce-scatter on their own stream
    # ahead of or behind its computation (Zhao et al., "PyTorch FSDP", VLDB 2023, Sec. 4.3)
    hidden = overlap | (zero >= 3)

    def exposed(t_comm: FloatArray, window: FloatArray | float) -> FloatArray:
        return np.where(hidden, overlapped_time_s(t_comm, window, t_comm * tail), t_comm)

    # Under the interleaved schedule Megatron-Core synchronises each model chunk on its own
    # (``grad_sync_func`` / ``param_sync_func`` per chunk in
    # ``forward_backward_pipelining_with_interleaving``): a chunk's gradients are reduced
    # once its last micro-batch's backward is done, and chunks finish a group of ``pp``
    # micro-batches apart, so only the last chunk's share trails the pipeline; weights are
    # gathered chunk by chunk ahead of each chunk's first forward, so only the first
    # chunk's share waits (on its own forward, bucket by bucket).
    interleaved = overlap & (v > 1.0) & ~single
    chunk_gap_bwd = pp * bwd_window / v
    chunk_gap_fwd = pp * fwd_window / v

    def reduce_exposed(t_comm: FloatArray, window: FloatArray | float) -> FloatArray:
        # the last chunk's reduction is launched after its backward, with nothing left to hide it
        return np.where(
            interleaved, chunked_collective_time_s(t_comm, t_comm / v, v, chunk_gap_bwd), exposed(t_comm, window)
        )

    def gather_exposed(t_comm: FloatArray, window: FloatArray | float) -> FloatArray:
        share = t_comm / v
        first = exposed_part_s(share, window / v, share * np.minimum(tail * v, 1.0))
        return np.where(
            interleaved, chunked_collective_time_s(t_comm, first, v, chunk_gap_fwd), exposed(t_comm, window)
        )

    # deferred ZeRO-2/3 under a pipeline: one weight gather ahead of the first forward, one
    # reduce-scatter issued after the stage's last backward, with no compute left to hide it
    exposed_s = np.select(
        [deferred, zero == 0, zero == 1, zero == 2],
        [
            exposed(ag_params, fwd_window) + rs_grads,
            reduce_exposed(ar_grads, bwd_window),
            reduce_exposed(rs_grads, bwd_window) + gather_exposed(ag_params, fwd_window),
            m * exposed(rs_grads, bwd_window) + exposed(ag_params, fwd_window),
        ],
        default=m * (exposed(ag_params, fwd_window) + exposed(ag_params + rs_grads, bwd_window)),
    )
    exposed_s = np.where(shard_dense * np.maximum(shard_expert, 1) > 1, exposed_s, 0.0)
    total_s = np.select(
        [deferred, zero == 0, zero == 1, zero == 2],
        [rs_grads + ag_params, ar_grads, rs_grads + ag_params, m * rs_grads + ag_params],
        default=m * (2.0 * ag_params + rs_grads),
    )
    return exposed_s, total_s


def _tied_embedding_allreduce_s(
    model: ModelSpec, training: TrainingSpec, rates: _DeviceRates, sizes: _Sizes
) -> FloatArray:
    """The first and last stages' all-reduce of the word-embedding gradient, after the flush.

    Tied input/output embeddings (GPT; SC21 eq. 2 counts V h once): with pp > 1 the last
    stage keeps a copy of the word embedding for the output layer and, after the pipeline
    flush, the first and last stages all-reduce its gradient (Megatron-LM
    ``_allreduce_word_embedding_grads`` in ``finalize_model_grads``), on the critical path;
    multi-token prediction keeps such a copy for the next tokens' embeddings.
    """
    tp = sizes.tp
    tied_bytes = (
        float(training.grad_bytes_per_param) * model.vocab_size * model.hidden_size / tp
        if model.tie_embeddings or model.mtp_layers
        else 0.0
    )
    first_last_inter = sizes.stage_ranks * sizes.pp > rates.gpus_per_node
    two = np.full_like(tp, 2.0)
    tied_ar = np.where(
        first_last_inter,
        collective_time_s(lambda n, p: allreduce_time_s(n, p, rates.inter), tied_bytes * np.ones_like(tp), two),
        collective_time_s(lambda n, p: allreduce_time_s(n, p, rates.intra), tied_bytes * np.ones_like(tp), two),
    )
    return np.where(sizes.single, 0.0, tied_ar)


def predict_layouts(
    model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, layouts: LayoutArrays
) -> dict[str, FloatArray]:
    """Predict time, throughput and per-GPU memory of every candidate layout.

    Returns a dict of arrays (one entry per candidate): ``step_time_s``,
    ``tokens_per_s``, ``mfu``, ``hfu``, ``bubble_fraction``, time components
    ``compute_s``, ``tp_comm_s``, ``cp_comm_s``, ``ep_comm_s``, ``pp_comm_s``,
    ``bubble_s``, ``dp_comm_exposed_s``, ``optimizer_s``, and memory components
    ``parameters_bytes``, ``gradients_bytes``, ``optimizer_state_bytes``,
    ``activations_bytes``, ``buffers_bytes``, ``memory_bytes`` (the fullest
    of the first, the last and a middle pipeline stage, ``fullest_stage`` its pipeline
    rank; see parallel3d.MemoryBreakdown), plus
    ``num_micro_batches`` and ``layers_per_stage``.

    The step is built up in the order of the helpers below: the work of one layer per
    micro-batch (``_layer_work``), the end stages' extra work, how many layers each
    stage holds, the pipeline of unequal stages with its point-to-point exchanges, the
    data-parallel reduction left after the backward, and the optimizer step.
    """
    sizes = _Sizes.of(layouts)
    dp, tp, pp, cp, ep, v, single = sizes.dp, sizes.tp, sizes.pp, sizes.cp, sizes.ep, sizes.v, sizes.single
    rc = layouts.recompute
    s = model.seq_length
    n_layers = model.num_layers
    n_moe = model.num_moe_layers
    batch = training.global_batch_sequences
    counts = parameter_counts(model)
    rates = _device_rates(cluster, training)

    m = np.ceil(batch / (dp * sizes.mbs))  # micro-batches per step per pipeline
    tokens = sizes.mbs * s / cp  # local tokens of one micro-batch

    # ---- stage split: ceil(L/p) layers on the middle stages, the remainder off the ends
    # (which end: balanced_end_layers, below, once a layer's time is known)
    q, _, _ = stage_layer_split(n_layers, layouts.pp)
    # share of the layers whose forward full recomputation repeats: the first
    # recompute_layers of each q/v-layer model chunk (shorter end stages are taken to
    # recompute the same share)
    full_frac = np.where(rc == RECOMPUTE_FULL, np.clip(layouts.recompute_layers / (q / v), 0.0, 1.0), 0.0)
    q_moe = np.ceil(q * (n_moe / n_layers)) if n_moe else np.zeros_like(q)
    q_dense = q - q_moe

    needs_plain = bool(np.any(rc != RECOMPUTE_NONE) and np.any(layouts.pp * q > n_layers))
    dense, moe, tp_ar, plain = _layer_work(
        model, cluster, training, rates, layouts, sizes, tokens, full_frac, with_plain=needs_plain
    )
    ends = _end_stage_work(model, rates, tokens, tp, tp_ar, dense, moe)
    mid = _stage_work(q_dense, dense, q_moe, moe)
    moe_layer_indices = model.moe.moe_layers if model.moe else None

    # The split is balanced on the work without recomputation: it is the model's and the
    # mesh's (Megatron-Core fixes it with --decoder-first/last-pipeline-num-layers), and
    # recomputation then trades time for memory on it. Balanced on recomputed work, a
    # recomputing layout could move MoE layers onto the first stage, which keeps the most
    # micro-batches in flight, and need more memory than keeping everything.
    if plain is not None:
        split_dense, split_moe = plain
        split_ends = _end_stage_work(model, rates, tokens, tp, tp_ar, split_dense, split_moe)
    else:
        split_dense, split_moe, split_ends = dense, moe, ends
    split_layer_s = _stage_work(q_dense, split_dense, q_moe, split_moe).total_s / q

    def end_layer_units(first_layers: FloatArray, last_layers: FloatArray) -> tuple[FloatArray, FloatArray]:
        # the end stages' own layers, dense or MoE by position, in middle-stage layer times
        first_moe, last_moe = end_stage_moe_layers(
            n_layers, moe_layer_indices, n_moe > 0, first_layers, last_layers, q, q_moe, v
        )
        return (
            _stage_work(first_layers - first_moe, split_dense, first_moe, split_moe).total_s / split_layer_s,
            _stage_work(last_layers - last_moe, split_dense, last_moe, split_moe).total_s / split_layer_s,
        )

    first_layers, last_layers = balanced_end_layers(
        q,
        layouts.pp * q - n_layers,
        layouts.pp,
        (split_ends.embedding_s + split_ends.embedding_tp_s) / split_layer_s,
        (split_ends.logits_s + split_ends.mtp.total_s) / split_layer_s,
        end_layer_units,
    )
    first_moe, last_moe = end_stage_moe_layers(
        n_layers, moe_layer_indices, n_moe > 0, first_layers, last_layers, q, q_moe, v
    )
    split = _StageSplit(q, q_dense, q_moe, first_layers, first_moe, last_layers, last_moe)
    params = _stage_parameters(model, counts, tp, ep, sizes.etp, split, single)
    first = _stage_work(split.first - split.first_moe, dense, split.first_moe, moe)
    last = _stage_work(split.last - split.last_moe, dense, split.last_moe, moe)
    stages = _stage_times(training, rates, single, pp > 2, first, mid, last, ends, params)

    p2p_bytes, p2p_per_mb = _pipeline_exchange_s(model, training, rates, layouts, sizes, tokens, stages.slowest_s)
    # unequal stages (embedding first, logits last): see pipeline_time_s. Uneven model
    # chunks (a depth that does not divide the stage's layers) fill and drain the pipeline
    # at the pace of the longest chunk, ceil(q / v) layers: the bubble of q / ceil(q / v)
    # even chunks
    v_pace = q / np.ceil(q / v)
    pipeline_time = pipeline_time_s(
        np.where(single, stages.slowest_s, stages.first_s + p2p_per_mb),
        stages.middle_s + p2p_per_mb,
        stages.last_s + p2p_per_mb,
        pp,
        v_pace,
        m,
        idle_stage_times(rates.terms.schedule, pp, v_pace, full_frac),
    )
    bubble = np.where(single, 0.0, pipeline_time - m * (stages.slowest_s + p2p_per_mb))

    stage_params_gpu, dense_params_gpu, expert_params_gpu = params.largest(pp)
    # DualPipe's two stage copies per rank: twice the gradients to reduce and weights to update
    copies = np.where(single, 1.0, float(rates.terms.schedule.weight_copies))
    stage_params_gpu, dense_params_gpu, expert_params_gpu = (
        copies * stage_params_gpu,
        copies * dense_params_gpu,
        copies * expert_params_gpu,
    )
    dp_exposed, dp_total = _data_parallel_s(
        training, rates, layouts, sizes, q, m, dense_params_gpu, expert_params_gpu, stages.slowest
    )
    tied_ar = _tied_embedding_allreduce_s(model, training, rates, sizes)
    dp_exposed = dp_exposed + tied_ar

    shard_for_opt = np.where(
        layouts.zero >= 1,
        dense_params_gpu / sizes.shard_dense + expert_params_gpu / sizes.shard_expert,
        stage_params_gpu,
    )
    optimizer_time = shard_for_opt * _ADAM_BYTES_PER_PARAM / rates.hbm_achieved_bytes_per_s

    step = pipeline_time + dp_exposed + optimizer_time
    n_gpus = dp * tp * pp * cp
    peak_bf16 = rates.peak_bf16_flops
    mflops = model_flops_per_step(model, batch)
    mflops_causal = model_flops_per_step(model, batch, causal=True)
    hflops = hardware_flops_per_step(model, batch, rc, full_frac, flash_attention=training.flash_attention, tp=tp)

    return {
        "step_time_s": step,
        "tokens_per_s": batch * s / step,
        "mfu": mflops / (n_gpus * peak_bf16 * step),
        "mfu_causal": mflops_causal / (n_gpus * peak_bf16 * step),
        "hfu": hflops / (n_gpus * peak_bf16 * step),
        "model_flops_per_step": np.full_like(step, mflops),
        "hardware_flops_per_step": hflops * np.ones_like(step),
        # the share of the step the pipeline stands idle (at most 1); SC21's (p-1)/(v m) is the
        # bubble over the ideal time instead, and exceeds 1 with fewer micro-batches than stages
        "bubble_fraction": bubble / step,
        "compute_s": stages.slowest.compute_s * m,
        "tp_comm_s": stages.slowest.tp_comm_s * m,
        "cp_comm_s": stages.slowest.cp_comm_s * m,
        "ep_comm_s": stages.slowest.ep_comm_s * m,
        "pp_comm_s": p2p_per_mb * m,
        "bubble_s": bubble,
        "pipeline_s": pipeline_time,
        "dp_comm_exposed_s": dp_exposed,
        "dp_comm_total_s": dp_total + tied_ar,
        "optimizer_s": optimizer_time,
        # what a GPU spends running kernels other than communication: the pacing stage's
        # computation and the optimizer step (partitioners.parallel3d.energy)
        "busy_s": stages.slowest.compute_s * m + optimizer_time,
        **_memory_per_gpu(
            model, training, rates, counts, layouts, sizes, split, params, tokens, full_frac, m, p2p_bytes
        ),
        "num_micro_batches": m,
        "layers_per_stage": q,
        "first_stage_layers": first_layers,
        "last_stage_layers": last_layers,
        "stage_time_s": stages.slowest_s,
    }
