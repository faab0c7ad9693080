"""Analytic time and memory of one training step for many 3D layouts at once.

Every function takes the candidate layouts as parallel numpy arrays
(:class:`LayoutArrays`) and returns arrays, so a search over hundreds of
thousands of (dp, tp, pp, cp, ep, micro-batch, v, ZeRO, recompute) tuples is a
handful of vectorised passes.

Published models this follows (and where it departs, why):

* FLOPs per step: Narayanan et al., "Efficient Large-Scale Language Model
  Training on GPU Clusters Using Megatron-LM", SC21, eq. (3):
  ``F = 72 B s l h^2 (1 + s/(6h) + V/(12 l h))`` model FLOPs (``96`` and ``V/(16lh)``
  with full recomputation), generalised term by term to GQA, any FFN width,
  gated (SwiGLU) MLPs and MoE layers. Attention is counted over the full ``s x s``
  score matrix as the paper does, so MFU is comparable with published figures.
* Activation memory per layer: Korthikanti et al., "Reducing Activation
  Recomputation in Large Transformer Models", MLSys 2023 (arXiv:2205.05198),
  Table 2: ``sbh(34 + 5as/h)`` without parallelism, ``sbh(10 + 24/t + 5as/(ht))``
  with tensor parallelism, ``sbh(34/t + 5as/(ht))`` with sequence parallelism,
  ``34 sbh/t`` with selective recomputation and ``2sbh/t`` with full
  recomputation; in-flight micro-batches of the 1F1B and interleaved schedules
  (their Section 4.2.3: ``L(1 + (p-1)/(pv))`` layers' worth on the first stage).
  With flash attention (Dao, 2022) the ``5as/h`` score term is never stored.
* Weights, gradients and optimizer state: mixed-precision Adam keeps 2 B bf16
  weights + 4 B fp32 gradients (Megatron's ``main_grad``; 2 B in DeepSpeed) +
  12 B fp32 master weights and moments = 16-18 B/parameter (Rajbhandari et al.,
  "ZeRO", SC20, Section 3.1: ``(2 + 2 + K)`` with ``K = 12``), sharded over the
  data-parallel group by ZeRO stage 1 (optimizer), 2 (+ gradients), 3 (+ weights).
  Under a pipeline, stages 2 and 3 are deferred (:func:`zero_stage_held`): PyTorch's
  ``torch.distributed.pipelining`` keeps an FSDP stage's weights and gradients whole
  across the micro-batches and reduce-scatters once, after the last backward.
* Pipeline bubble ``(p-1)/(v m)`` of 1F1B (``v = 1``) and interleaved schedules
  (Narayanan et al. SC21, Section 2.2), generalised to unequal stages
  (:func:`pipeline_time_s`): the steady state runs at the slowest stage, fill and
  drain at the mean one. The first stage also runs the vocabulary-parallel input
  embedding (:func:`embedding_time_s` and its tensor-parallel all-reduce), the last
  the output layer and loss; every send/recv of activations pays Megatron's host
  synchronisation, ``2 v`` times per micro-batch; with tied embeddings the first and
  last stages all-reduce the embedding gradient after the flush.
* Data-parallel gradient reduction overlapped with the backward: under 1F1B, with the
  last micro-batch's backward, bucket by bucket; under the interleaved schedule, model
  chunk by model chunk as each finishes its last backward (Megatron-Core's per-chunk
  ``grad_sync_func``), so only the last chunk's share trails the pipeline.
* Weight-gradient accumulation over micro-batches: free when fused into the
  weight-gradient GEMM (today's Megatron-LM), otherwise a memory-bound pass over the
  stage's parameters per micro-batch (:func:`gradient_accumulation_time_s`), which is
  what makes many small micro-batches cost more than the bubble formula says.
* Backward GEMMs at their own shapes (``dX = dY W^T``, ``dW = X^T dY``), not as twice
  the forward; tensor-parallel all-reduces across a full H100/H200 node use NVLink
  SHARP (NCCL's NVLS), ~480/370 faster than the ring (NVIDIA/nccl-tests#212).
* Collectives: the shared alpha-beta formulas of :mod:`partitioners.collectives`
  (ring all-reduce, reduce-scatter, all-gather, all-to-all, hierarchical
  all-reduce), evaluated as affine functions of the message size so one call per
  distinct group size serves every candidate.
* GEMM time: roofline (Williams, Waterman, Patterson, CACM 2009) of each
  per-GPU matrix product with wave quantisation over the SMs (NVIDIA "Matrix
  Multiplication Background User's Guide"), so small per-GPU matrices (large
  tp, small micro-batches) run below peak instead of at it.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from partitioners.collectives import (
    LinkSpec,
    allgather_time_s,
    allreduce_time_s,
    hierarchical_allreduce_time_s,
    hierarchical_alltoall_time_s,
    p2p_time_s,
)
from partitioners.parallel3d_specs import AttentionProjection, ClusterSpec, ModelSpec, TrainingSpec

__all__ = [
    "LayoutArrays",
    "RECOMPUTE_NONE",
    "RECOMPUTE_SELECTIVE",
    "RECOMPUTE_FULL",
    "ACTIVATION_FRAGMENTATION",
    "ACTIVATION_FRAGMENTATION_HIGH",
    "fragmentation_that_fills",
    "bytes_at_high_fragmentation",
    "OVERLAP_COMPUTE_SLOWDOWN",
    "overlapped_time_s",
    "exposed_part_s",
    "chunked_collective_time_s",
    "ParameterCounts",
    "parameter_counts",
    "model_flops_per_step",
    "hardware_flops_per_step",
    "activation_bytes_per_layer",
    "stage_layer_split",
    "balanced_end_layers",
    "middle_stages_short",
    "fp8_quantize_time_s",
    "predict_layouts",
    "model_state_bytes",
    "zero_stage_held",
    "StageActivations",
    "stage_activation_bytes",
    "pipeline_bubble_fraction",
    "pipeline_time_s",
    "embedding_time_s",
    "gradient_accumulation_time_s",
    "expert_group_placement",
    "expert_alltoall_time_s",
    "expected_distinct",
    "nodes_within_reach",
    "deduplicated_dispatch_time_s",
    "mla_up_projections",
]

RECOMPUTE_NONE, RECOMPUTE_SELECTIVE, RECOMPUTE_FULL = 0, 1, 2

# Achievable fractions of the datasheet figures. nccl-tests on DGX A100/H100 report
# all-reduce bus bandwidth of about 80% of the NVLink per-direction figure and about 90%
# of the InfiniBand line rate; STREAM-like kernels reach about 80-90% of HBM bandwidth.
_NVLINK_EFFICIENCY = 0.8
_IB_EFFICIENCY = 0.9
_HBM_EFFICIENCY = 0.8
# FlashAttention-2 (Dao, 2023) reaches 70-73% of A100 peak forward and ~63% end to end;
# FlashAttention-3 ~75% of H100 peak. Expressed relative to the GEMM ceiling of the GPU.
_FLASH_OVER_GEMM = 0.8
# Its backward kernel runs at a lower fraction of peak than its forward: up to 63% against
# 73% on A100 (Dao, "FlashAttention-2", 2023, Sec. 4.1), i.e. 0.86 of the forward's rate.
_FLASH_BACKWARD_OVER_FORWARD = 0.63 / 0.73
# GEMM output tile of cuBLAS/CUTLASS kernels used for the wave-quantisation estimate.
_TILE = 128
# Per-dimension half-saturation size of a GEMM: with d / (d + 200) per dimension a square
# GEMM reaches ~57% of the ceiling at 1024, ~86% at 4096 and ~93% at 8192, the shape of
# the throughput-versus-size curves in NVIDIA's "Matrix Multiplication Background User's
# Guide" (A100, FP16) -- fitted to those curves, not measured here.
_GEMM_HALF_DIM = 200.0
# Fixed per-GPU reserve: CUDA context (~0.5 GiB), cuBLAS/NCCL workspaces and
# communication buffers, PyTorch caching-allocator fragmentation. PyTorch reports
# 1-3 GiB of such overhead on large-model runs (torch.cuda.memory_reserved vs allocated).
_RESERVED_BYTES = 3.0 * 1024**3
# Activations are allocated and freed every micro-batch in blocks of many sizes; the
# caching allocator's reserved-but-unusable share is 10-30% in LLM training
# (Guo et al., "GMLake", ASPLOS 2024). Counted at the low end on activations; the
# planner notes layouts that would not fit at the high end (parallel3d).
ACTIVATION_FRAGMENTATION = 0.10
ACTIVATION_FRAGMENTATION_HIGH = 0.30


def fragmentation_that_fills(total_bytes: float, activations_bytes: float, capacity_bytes: float) -> float:
    """Allocator fragmentation of activations at which a predicted footprint reaches capacity.

    ``total_bytes`` and ``activations_bytes`` are predictions made at
    ``ACTIVATION_FRAGMENTATION``; a layout whose answer lies below
    ``ACTIVATION_FRAGMENTATION_HIGH`` fits only if the allocator wastes little.
    """
    raw_activations = activations_bytes / (1.0 + ACTIVATION_FRAGMENTATION)
    if raw_activations <= 0.0:
        return float("inf") if total_bytes <= capacity_bytes else float("-inf")
    return (capacity_bytes - (total_bytes - activations_bytes)) / raw_activations - 1.0
def bytes_at_high_fragmentation(total_bytes: np.ndarray | float, activations_bytes: np.ndarray | float
                                ) -> np.ndarray | float:
    """A footprint predicted at ``ACTIVATION_FRAGMENTATION``, recounted at ``ACTIVATION_FRAGMENTATION_HIGH``.

    A layout whose recount exceeds capacity fits only if the allocator wastes little
    ("tight memory").
    """
    return total_bytes + activations_bytes * (ACTIVATION_FRAGMENTATION_HIGH - ACTIVATION_FRAGMENTATION) \
        / (1.0 + ACTIVATION_FRAGMENTATION)


# Load of the busiest expert over the mean (see predict_layouts, MoE).
_EXPERT_IMBALANCE = 1.2
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
# Embedding backward: a dense (V/t x h) gradient is zero-filled and scatter-added in
# bf16 (write 2 + read 2 bytes per element) and accumulated into the fp32 main
# gradient (read 4 + write 4): ~12 bytes per element per micro-batch on the first stage
# (PyTorch ``embedding_dense_backward``; Megatron's ``main_grad`` accumulation).
_EMBEDDING_GRAD_BYTES_PER_ELEMENT = 12.0
# Communication hidden under computation is not free: its kernels hold SMs and HBM
# bandwidth the concurrent GEMMs would use. Lee et al., "Characterizing Compute-
# Communication Overlap in GPU-Accelerated Distributed Deep Learning" (2025) measured the
# overlapped computation 18.9% slower on average (40% at most) than alone, on A100, H100,
# MI250 and MI210 with GPT and Llama models.
OVERLAP_COMPUTE_SLOWDOWN = 0.189


def overlapped_time_s(comm_s: np.ndarray, window_s: np.ndarray, floor_s: np.ndarray | float = 0.0) -> np.ndarray:
    """Critical-path time a collective adds when it runs under ``window_s`` of computation.

    What the window cannot cover stays exposed (at least ``floor_s``, e.g. a pipelined
    collective's first and last chunk); the covered part slows the computation it
    shares the GPU with by ``OVERLAP_COMPUTE_SLOWDOWN`` (Lee et al. 2025).
    """
    exposed = exposed_part_s(comm_s, window_s, floor_s)
    return exposed + OVERLAP_COMPUTE_SLOWDOWN * (comm_s - exposed)


def exposed_part_s(comm_s: np.ndarray, window_s: np.ndarray, floor_s: np.ndarray | float = 0.0) -> np.ndarray:
    """The part of a collective that ``window_s`` of computation cannot cover (at least ``floor_s``)."""
    return np.maximum(np.maximum(comm_s - window_s, 0.0), floor_s)


def chunked_collective_time_s(comm_s: np.ndarray, trailing_share_s: np.ndarray, chunks: np.ndarray | float,
                              gap_s: np.ndarray) -> np.ndarray:
    """Critical-path time of a collective issued in ``chunks`` equal shares, one per model chunk.

    The shares go out ``gap_s`` apart on one communicator (Megatron-Core's per-chunk
    ``grad_sync_func`` / ``param_sync_func`` under the interleaved schedule), so all but
    one run under the computation between launches; ``trailing_share_s`` is what the
    share with no computation after it leaves exposed. Shares longer than the gap queue
    up behind each other and the queue trails too. The hidden part slows the computation
    it runs under by ``OVERLAP_COMPUTE_SLOWDOWN``.
    """
    share = comm_s / chunks
    trailing = np.minimum(trailing_share_s + np.maximum(0.0, (chunks - 1.0) * (share - gap_s)), comm_s)
    return trailing + OVERLAP_COMPUTE_SLOWDOWN * (comm_s - trailing)


@dataclass(frozen=True)
class LayoutArrays:
    """Candidate layouts as parallel int64 arrays, one entry per candidate.

    ``recompute`` holds ``RECOMPUTE_NONE``/``SELECTIVE``/``FULL``; ``v`` is the
    number of virtual pipeline stages (model chunks) per rank. Under full
    recomputation ``recompute_layers`` is how many layers of each model chunk are
    recomputed (Megatron-LM's ``--recompute-method block --recompute-num-layers``):
    all of them (``q / v``) or fewer, the others keeping their activations; it is
    0 otherwise.
    """

    dp: np.ndarray
    tp: np.ndarray
    pp: np.ndarray
    cp: np.ndarray
    ep: np.ndarray
    mbs: np.ndarray
    v: np.ndarray
    zero: np.ndarray
    recompute: np.ndarray
    recompute_layers: np.ndarray

    def __len__(self) -> int:
        return int(self.dp.shape[0])

    def take(self, index: np.ndarray) -> LayoutArrays:
        """The candidates at ``index`` (boolean mask or integer positions)."""
        return LayoutArrays(*(getattr(self, name)[index] for name in self.__dataclass_fields__))


@dataclass(frozen=True)
class ParameterCounts:
    """Parameter counts by role (one layer of each kind, and the whole model)."""

    attention_per_layer: float
    dense_mlp_per_layer: float
    experts_per_layer: float  # routed experts of one MoE layer (sharded by ep)
    moe_shared_per_layer: float  # shared experts + router of one MoE layer
    embedding: float
    output: float
    total: float
    active_per_token: float
    position_embedding: float = 0.0  # learned s x h table, replicated across the tensor group
    # the part of attention_per_layer every tensor-parallel rank holds whole (MLA's
    # down-projections and latent norms)
    attention_replicated_per_layer: float = 0.0
    # a multi-token-prediction module's 2h -> h projection and its two norms (its layer
    # is counted as one more layer of the last layer's kind)
    mtp_projection: float = 0.0

    def attention_per_gpu(self, tp: np.ndarray | float) -> np.ndarray:
        """Attention parameters of one layer on one tensor-parallel rank."""
        tp = np.asarray(tp, dtype=float)
        return (self.attention_per_layer - self.attention_replicated_per_layer) / tp \
            + self.attention_replicated_per_layer


def parameter_counts(model: ModelSpec) -> ParameterCounts:
    """Count parameters of a GPT/Llama-style decoder (biases ignored, LayerNorm included)."""
    h = model.hidden_size
    mats = 3 if model.gated_mlp else 2
    latent_norms = (model.mla.q_lora_rank or 0) + model.mla.kv_lora_rank if model.mla is not None else 0
    attention = sum(p.in_width * p.out_width for p in model.attention_projections) + 2 * h + latent_norms
    attention_replicated = sum(p.in_width * p.out_width for p in model.attention_projections
                               if p.split == "replicated") + latent_norms
    dense_mlp = mats * h * model.ffn
    experts = shared = 0.0
    active_moe = 0.0
    if model.moe is not None:
        moe = model.moe
        experts = moe.num_experts * mats * h * moe.expert_ffn_hidden_size
        shared = moe.shared_experts * mats * h * moe.expert_ffn_hidden_size + h * moe.num_experts
        active_moe = (moe.experts_per_token + moe.shared_experts) * mats * h * moe.expert_ffn_hidden_size
    n_moe = model.num_moe_layers
    n_dense = model.num_layers - n_moe
    embedding = model.vocab_size * h
    output = 0.0 if model.tie_embeddings else model.vocab_size * h
    position = float(model.seq_length * h) if model.learned_position_embeddings else 0.0
    router = h * model.moe.num_experts if model.moe else 0
    projection = 2 * h * h + 2 * h
    mtp_mlp, mtp_active_mlp = (experts + shared, active_moe + router) if model.mtp_layer_is_moe \
        else (dense_mlp, dense_mlp)
    total = model.num_layers * attention + n_dense * dense_mlp + n_moe * (experts + shared) + embedding + output + h \
        + position + model.mtp_layers * (attention + mtp_mlp + projection)
    active = model.num_layers * attention + n_dense * dense_mlp + n_moe * (active_moe + router) + embedding \
        + output + position + model.mtp_layers * (attention + mtp_active_mlp + projection)
    return ParameterCounts(attention, dense_mlp, experts, shared, embedding, output, total, active, position,
                           attention_replicated, projection)


def _forward_flops_per_token(model: ModelSpec) -> tuple[float, float, float]:
    """Forward FLOPs per token: (transformer layers, attention-score part of them, logits).

    Narayanan et al. SC21 count, per layer and token, ``24h^2`` for the four
    projections and the 4h MLP plus ``4sh`` for ``QK^T`` and attention over ``V``;
    here the projections use the actual query and KV widths (a head width apart from
    h / a, GQA) and FFN width, gated MLPs have three matrices, and MoE layers count the
    top-k and shared experts plus the router. Multi-token-prediction modules add a
    layer, a ``2h -> h`` projection and a pass through the output head each.
    """
    h, s = model.hidden_size, model.seq_length
    mats = 3 if model.gated_mlp else 2
    attn_linear = 2 * sum(p.in_width * p.out_width for p in model.attention_projections)
    # QK^T over the query-key width, attention x V over the value width
    attn_scores = 2 * s * (model.query_width + model.context_width)
    dense_mlp = 2 * mats * h * model.ffn
    n_moe = model.num_moe_layers
    moe_mlp = 0.0
    if model.moe is not None:
        moe = model.moe
        moe_mlp = 2 * mats * h * moe.expert_ffn_hidden_size * (moe.experts_per_token + moe.shared_experts) \
            + 2 * h * moe.num_experts
    layers = model.num_layers * (attn_linear + attn_scores) + (model.num_layers - n_moe) * dense_mlp + n_moe * moe_mlp
    # multi-token prediction: per module one more layer, its 2h -> h projection and logits
    mtp = model.mtp_layers
    layers += mtp * (attn_linear + attn_scores + (moe_mlp if model.mtp_layer_is_moe else dense_mlp) + 2 * 2 * h * h)
    return layers, (model.num_layers + mtp) * attn_scores, (1 + mtp) * 2 * h * model.vocab_size


def model_flops_per_step(model: ModelSpec, global_batch_sequences: int, causal: bool = False) -> float:
    """Model FLOPs of one step: 3x forward (forward + 2x backward), no recomputation.

    For a GPT with 4h MLP and MHA this is exactly Narayanan et al. (SC21) eq. (3)
    with 72 instead of 96: ``72 B s l h^2 (1 + s/(6h) + V/(12 l h))`` (the form
    Korthikanti et al. 2022 use for MFU, and Megatron-LM's
    ``num_floating_point_operations``). It counts ``QK^T`` and attention over ``V``
    for the whole ``s x s`` matrix. ``causal`` counts only the half a causal mask
    leaves, as NVIDIA's Megatron-Bridge flop formulas do for the "Model TFLOP/s"
    of its performance tables (``causal_self_attn = True``): the two conventions
    differ by the attention share, a few per cent at 8K tokens and tens of per cent
    at 128K.
    """
    layers, scores, logits = _forward_flops_per_token(model)
    if causal:
        layers = layers - 0.5 * scores
    return 3.0 * (layers + logits) * global_batch_sequences * model.seq_length


def mla_up_projections(model: ModelSpec) -> tuple[AttentionProjection, ...]:
    """MLA's up-projections from a latent (none without MLA): what selective recomputation redoes.

    DeepSeek-V3 recomputes them in the backward pass instead of keeping the per-head
    queries, keys and values they produce ("Recomputation of RMSNorm and MLA
    Up-Projection", DeepSeek-V3 Technical Report, Sec. 3.2.3; Megatron-Core's
    ``--recompute-modules mla_up_proj``).
    """
    return tuple(p for p in model.attention_projections if p.reads == "latent")


def hardware_flops_per_step(model: ModelSpec, global_batch_sequences: int, recompute: np.ndarray | int,
                            full_fraction: np.ndarray | float = 1.0, flash_attention: bool = False) -> np.ndarray:
    """FLOPs actually executed: model FLOPs plus recomputation.

    Full recomputation repeats every layer's forward (SC21's 96 = 4 x 24), or the
    ``full_fraction`` of the layers it covers; selective recomputation repeats only
    the attention-score part (Korthikanti et al. 2022, Sec. 5) -- unless
    ``flash_attention`` stores no scores to drop, when the norm and activation outputs
    it rebuilds instead are memory-bound passes, not FLOPs -- and, under MLA, the
    up-projections (:func:`mla_up_projections`).
    """
    layers, scores, _ = _forward_flops_per_token(model)
    selective = (0.0 if flash_attention else scores) \
        + (model.num_layers + model.mtp_layers) * 2 * sum(p.in_width * p.out_width for p in mla_up_projections(model))
    tokens = global_batch_sequences * model.seq_length
    rc = np.asarray(recompute)
    extra = np.where(rc == RECOMPUTE_FULL, layers * np.asarray(full_fraction, dtype=float),
                     np.where(rc == RECOMPUTE_SELECTIVE, selective, 0.0)) * tokens
    return model_flops_per_step(model, global_batch_sequences) + extra


def pipeline_bubble_fraction(pp: np.ndarray | int, v: np.ndarray | int, m: np.ndarray | int) -> np.ndarray:
    """Idle fraction of the 1F1B / interleaved schedule, ``(p-1)/(v m)`` (Narayanan et al., SC21)."""
    return (np.asarray(pp) - 1) / (np.asarray(v) * np.asarray(m))


def pipeline_time_s(first_s: np.ndarray | float, middle_s: np.ndarray | float, last_s: np.ndarray | float,
                    pp: np.ndarray | int, v: np.ndarray | int, m: np.ndarray | int) -> np.ndarray:
    """Time of ``m`` micro-batches through a 1F1B / interleaved pipeline of unequal stages.

    Parameters
    ----------
    first_s, middle_s, last_s : array_like
        Forward + backward time of one micro-batch on the first stage (which also
        holds the input embedding), on each middle stage, and on the last stage
        (output layer and loss), point-to-point exchanges included.
    pp, v, m : array_like
        Pipeline stages, virtual stages (model chunks) per rank, micro-batches.

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
    multi = np.asarray(m, dtype=float) * slowest + (pp_f - 1.0) / np.asarray(v, dtype=float) * mean
    return np.where(pp_f > 1, multi, np.asarray(m, dtype=float) * first)


# --------------------------------------------------------------------- collectives


def _affine(fn: Callable[[float, int], float], n_ranks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Intercept and slope of an alpha-beta collective, per distinct group size.

    The shared formulas are affine in the message size for a fixed group, so two
    evaluations per distinct group size give the exact cost for every candidate.
    """
    sizes, inverse = np.unique(np.asarray(n_ranks, dtype=np.int64), return_inverse=True)
    at_1 = np.array([fn(1.0, int(p)) for p in sizes])
    at_2 = np.array([fn(2.0, int(p)) for p in sizes])
    slope = at_2 - at_1
    return (at_1 - slope)[inverse], slope[inverse]


def _collective_time(fn: Callable[[float, int], float], n_bytes: np.ndarray, n_ranks: np.ndarray) -> np.ndarray:
    intercept, slope = _affine(fn, n_ranks)
    return np.where((n_bytes > 0) & (n_ranks > 1), intercept + slope * n_bytes, 0.0)


def expert_group_placement(stride: np.ndarray, ep: np.ndarray, gpus_per_node: int) -> tuple[np.ndarray, np.ndarray]:
    """Members of one expert-parallel group per node, and the nodes the group spans.

    With the ``tp-cp-ep-pp-dp`` rank order, members of one expert group sit
    ``stride = tp cp`` ranks apart, so ``gpus_per_node / stride`` of them share a node.
    """
    ep = np.asarray(ep, dtype=np.int64)
    stride = np.asarray(stride, dtype=np.int64)
    local = np.clip(gpus_per_node // np.maximum(stride, 1), 1, ep)
    local = np.where(ep % local == 0, local, 1)
    return local, ep // local


def expert_alltoall_time_s(n_bytes: np.ndarray, stride: np.ndarray, ep: np.ndarray, gpus_per_node: int,
                           intra: LinkSpec, inter: LinkSpec) -> np.ndarray:
    """One expert-parallel all-to-all of ``n_bytes`` per rank, placed as the rank map places it.

    The members sharing a node exchange their share over NVLink while the rest leaves
    through the NICs at the same time
    (:func:`~partitioners.collectives.hierarchical_alltoall_time_s`): an expert group
    spanning two nodes sends half of its bytes, not all of them, over the slower network.
    """
    local, groups = expert_group_placement(stride, ep, gpus_per_node)
    keys = np.stack([np.asarray(n_bytes, dtype=float) * np.ones(local.shape), local.astype(float),
                     groups.astype(float)], axis=1)
    uniq, inverse = np.unique(keys, axis=0, return_inverse=True)
    times = np.array([hierarchical_alltoall_time_s(n, int(r), int(g), intra, inter) for n, r, g in uniq])
    return np.where(local * groups > 1, times[inverse.reshape(-1)], 0.0)


def expected_distinct(n_bins: np.ndarray | float, n_draws: np.ndarray | float) -> np.ndarray:
    """Expected number of distinct bins hit by ``n_draws`` uniform draws: ``b (1 - (1 - 1/b)^k)``."""
    n_bins = np.maximum(np.asarray(n_bins, dtype=float), 1.0)
    return n_bins * (1.0 - (1.0 - 1.0 / n_bins) ** np.asarray(n_draws, dtype=float))


def nodes_within_reach(nodes: np.ndarray, num_groups: int | None, group_topk: int | None) -> np.ndarray:
    """Nodes of an expert group that group-limited routing lets one token reach.

    The ``num_groups`` groups of consecutive experts lie over the ``n`` nodes the expert
    group spans: with at least as many nodes as groups each group covers ``n / num_groups``
    nodes and a token's ``group_topk`` groups ``group_topk n / num_groups`` of them; with
    fewer, several groups share a node and its groups land on ``n (1 - (1 - 1/n)^topk)``.
    """
    nodes = np.asarray(nodes, dtype=float)
    if num_groups is None or group_topk is None:
        return nodes
    spread = np.where(nodes >= num_groups, group_topk * nodes / num_groups, expected_distinct(nodes, group_topk))
    return np.minimum(spread, nodes)


def deduplicated_dispatch_time_s(token_bytes: np.ndarray, experts_per_token: int, num_groups: int | None,
                                 group_topk: int | None, stride: np.ndarray, ep: np.ndarray, gpus_per_node: int,
                                 intra: LinkSpec, inter: LinkSpec) -> np.ndarray:
    """One node-deduplicated expert dispatch (or its mirror, the combine) of ``token_bytes`` per rank.

    DeepSeek-V3's dispatch (DeepSeek-AI, "DeepSeek-V3 Technical Report", 2024, Sec. 3.2.2;
    its DeepEP kernels) sends a token over InfiniBand once per destination node, to the
    GPU of the same in-node index, which forwards it over NVLink to the GPUs holding its
    experts; the combine returns the partial sums the same way. Group-limited routing
    (Sec. 2.1.2) caps the nodes a token can reach (:func:`nodes_within_reach`). With the
    ``k`` experts spread uniformly over the ``M`` nodes within reach a token reaches
    ``M (1 - (1 - 1/M)^k)`` nodes, ``(n - 1) / n`` of them remote when the group spans
    ``n`` nodes; in each it reaches ``r (1 - (1 - 1/r)^(k / nodes))`` of the ``r`` GPUs
    there, all but one of them over NVLink. The network and NVLink legs are pipelined,
    so the slower one sets the time.
    """
    local, groups = expert_group_placement(stride, ep, gpus_per_node)
    local_f, groups_f = local.astype(float), groups.astype(float)
    nodes = expected_distinct(nodes_within_reach(groups_f, num_groups, group_topk), experts_per_token)
    remote_nodes = nodes * (groups_f - 1.0) / groups_f
    gpus_per_reached_node = expected_distinct(local_f, experts_per_token / nodes)
    forwarded = nodes * gpus_per_reached_node * (local_f - 1.0) / local_f
    token_bytes = np.asarray(token_bytes, dtype=float)
    network = np.where(groups > 1, (groups_f - 1.0) * inter.latency_s
                       + token_bytes * remote_nodes / inter.bandwidth_bytes_per_s, 0.0)
    nvlink = np.where(local > 1, (local_f - 1.0) * intra.latency_s
                      + token_bytes * forwarded / intra.bandwidth_bytes_per_s, 0.0)
    return np.where(local * groups > 1, np.maximum(network, nvlink), 0.0)


def _p2p_time(n_bytes: np.ndarray, link: LinkSpec) -> np.ndarray:
    at_1, at_2 = p2p_time_s(1.0, link), p2p_time_s(2.0, link)
    return np.where(n_bytes > 0, at_1 + (at_2 - at_1) * (n_bytes - 1.0), 0.0)


def _hier_allreduce_time(n_bytes: np.ndarray, local: np.ndarray, groups: np.ndarray, intra: LinkSpec,
                         inter: LinkSpec, n_calls: np.ndarray | float = 1.0,
                         algorithms: tuple[str, ...] = ("ring", "tree")) -> np.ndarray:
    """Two-level all-reduce of ``n_bytes`` split into ``n_calls`` collectives (buckets, layers).

    The latency (alpha) terms are paid once per call; the bandwidth terms once for
    all the bytes. Ring and double-binary-tree variants are both evaluated and the
    faster taken, as NCCL's tuner does (trees win at thousands of ranks). Reduce-scatter
    and all-gather have no tree variant in NCCL, so they pass ``algorithms=("ring",)``.
    """
    pairs = np.stack([local, groups], axis=1).astype(np.int64)
    uniq, inverse = np.unique(pairs, axis=0, return_inverse=True)
    inverse = inverse.reshape(-1)
    best = None
    for algorithm in algorithms:
        at_1 = np.array([hierarchical_allreduce_time_s(1.0, int(a), int(b), intra, inter, algorithm) for a, b in uniq])
        at_2 = np.array([hierarchical_allreduce_time_s(2.0, int(a), int(b), intra, inter, algorithm) for a, b in uniq])
        slope = at_2 - at_1
        t = (at_1 - slope)[inverse] * n_calls + slope[inverse] * n_bytes
        best = t if best is None else np.minimum(best, t)
    total = local * groups
    return np.where((n_bytes > 0) & (total > 1), best, 0.0)


# --------------------------------------------------------------------- GEMM model


def _gemm_time_s(m: np.ndarray, n: np.ndarray, k: np.ndarray, peak: float, eff: float, hbm: float, sms: int,
                 bytes_per_element: float = 2.0, batch: np.ndarray | float = 1.0) -> np.ndarray:
    """Time of ``batch`` independent ``(m x k) @ (k x n)`` products in one kernel on one GPU.

    Roofline of compute at ``eff * peak`` (the asymptotic cuBLAS ceiling, reduced for
    small dimensions by a saturation factor per dimension) against HBM traffic
    of the three operands, with the compute side stretched by wave quantisation:
    the outputs are cut into 128x128 tiles, one per SM at a time, and the last wave
    runs partly empty (NVIDIA, "Matrix Multiplication Background User's Guide").
    A batched or grouped GEMM (attention heads, local experts) spreads the tiles
    of all its products over the SMs together.
    """
    m = np.maximum(m, 1.0)
    n = np.maximum(n, 1.0)
    k = np.maximum(k, 1.0)
    batch = np.maximum(batch, 1.0)
    tiles = np.ceil(m / _TILE) * np.ceil(n / _TILE) * batch
    waves = np.ceil(tiles / sms)
    quantisation = (m * n * batch) / (waves * sms * _TILE * _TILE)
    # below a few thousand in any dimension, prologue/epilogue and K-loop start-up are not
    # amortised: d / (d + d0) per dimension
    saturation = (m / (m + _GEMM_HALF_DIM)) * (n / (n + _GEMM_HALF_DIM)) * (k / (k + _GEMM_HALF_DIM))
    compute = 2.0 * m * n * k * batch / (peak * eff * saturation * np.minimum(quantisation, 1.0))
    memory = bytes_per_element * (m * k + k * n + m * n) * batch / hbm
    return np.maximum(compute, memory)


def embedding_time_s(tokens: np.ndarray | float, hidden_size: int, vocab_size: int, tp: np.ndarray | float,
                     hbm_bytes_per_s: float) -> np.ndarray:
    """Memory-bound time of the input embedding, forward and backward, for one micro-batch.

    Megatron puts the word embedding on the first pipeline stage (Narayanan et al.,
    SC21, Sec. 3; the output layer on the last) and splits it along the vocabulary
    across the tensor group (Shoeybi et al., "Megatron-LM", 2019, Sec. 3). Forward: each
    token's bf16 row is read and written (``4 h`` bytes per token). Backward: a dense
    ``V/t x h`` gradient is zero-filled and scatter-added in bf16 and accumulated into
    the fp32 main gradient, ``_EMBEDDING_GRAD_BYTES_PER_ELEMENT`` (12) bytes per element
    (PyTorch ``embedding_dense_backward``) -- per micro-batch, however few tokens it has.
    The tensor-parallel all-reduce of the looked-up rows is costed with the other
    collectives.

    Parameters
    ----------
    tokens : array_like
        Local tokens of one micro-batch.
    hidden_size, vocab_size : int
        ``h`` and ``V``.
    tp : array_like
        Tensor-parallel size (the vocabulary shard is ``V/t``).
    hbm_bytes_per_s : float
        Achievable HBM bandwidth.

    Returns
    -------
    numpy.ndarray
        Seconds.
    """
    tokens = np.asarray(tokens, dtype=float)
    tp = np.asarray(tp, dtype=float)
    return (tokens * hidden_size * 4.0 + _EMBEDDING_GRAD_BYTES_PER_ELEMENT * vocab_size * hidden_size / tp) \
        / hbm_bytes_per_s


def gradient_accumulation_time_s(params_per_gpu: np.ndarray | float, grad_bytes_per_param: float,
                                 hbm_bytes_per_s: float) -> np.ndarray:
    """Memory-bound time of adding one micro-batch's weight gradients into the accumulator.

    Without gradient-accumulation fusion each micro-batch's backward writes a fresh
    16-bit gradient per parameter, and a second kernel adds it into the accumulation
    buffer (PyTorch autograd's ``AccumulateGrad`` for bf16/fp16 ``.grad``; Megatron-LM's
    ``main_grad.add_(grad)`` hook for fp32 main gradients, Narayanan et al. SC21, Sec. 4):
    read the new gradient (2 bytes), read and write the accumulator (``grad_bytes``
    each) -- 10 bytes per parameter and micro-batch with fp32 main gradients. Fused
    accumulation (the weight-gradient GEMM's epilogue adds into the fp32 buffer,
    Megatron-LM ``--gradient-accumulation-fusion``) hides this under the GEMM, so the
    caller charges it only for unfused stacks. It is paid per micro-batch, so it
    penalises many small micro-batches, which the pipeline bubble otherwise rewards.

    Parameters
    ----------
    params_per_gpu : array_like
        Parameters of the pipeline stage held by one GPU.
    grad_bytes_per_param : float
        Bytes of the accumulation buffer per parameter (4 for fp32 main gradients).
    hbm_bytes_per_s : float
        Achievable HBM bandwidth.
    """
    return np.asarray(params_per_gpu, dtype=float) * (2.0 + 2.0 * grad_bytes_per_param) / hbm_bytes_per_s


def _gemm_backward_time_s(m: np.ndarray, n: np.ndarray, k: np.ndarray, peak: float, eff: float, hbm: float,
                          sms: int, bytes_per_element: float = 2.0, batch: np.ndarray | float = 1.0) -> np.ndarray:
    """Backward of ``Y (m x n) = X (m x k) W (k x n)``: the two GEMMs at their own shapes.

    ``dX = dY W^T`` is an ``(m x n)(n x k)`` product and ``dW = X^T dY`` a
    ``(k x m)(m x n)`` one: twice the forward FLOPs (Narayanan et al., SC21, Appendix),
    but the weight gradient's output is the weight shard and its reduction runs over
    the tokens, so its tiles, waves and saturation differ from the forward's (a skinny
    tensor-parallel shard with few tokens fills the SMs better backward than forward).
    """
    return _gemm_time_s(m, k, n, peak, eff, hbm, sms, bytes_per_element, batch) \
        + _gemm_time_s(k, n, m, peak, eff, hbm, sms, bytes_per_element, batch)


# --------------------------------------------------------------------- memory


def stage_layer_split(num_layers: int, pp: np.ndarray | int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
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


def middle_stages_short(num_layers: int, pp: np.ndarray | int, q: np.ndarray | int, first_layers: np.ndarray | int,
                        last_layers: np.ndarray | int) -> np.ndarray:
    """How many middle stages hold ``q - 1`` layers: the leftover layers the end stages do not shed.

    They are taken from the middle stages nearest the first, which keep the most
    micro-batches in flight (see :func:`stage_activation_bytes`).
    """
    return np.maximum(pp * q - num_layers - (q - first_layers) - (q - last_layers), 0)


def balanced_end_layers(q: np.ndarray, short: np.ndarray, pp: np.ndarray, first_extra_layers: np.ndarray,
                        last_extra_layers: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
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
    """
    q = np.asarray(q, dtype=float)
    pp = np.asarray(pp, dtype=float)
    first, last = q.copy(), q.copy()
    remaining = np.where(pp > 1, np.asarray(short, dtype=float), 0.0)
    for _ in range(int(remaining.max(initial=0.0))):
        first_s = first + first_extra_layers
        last_s = last + last_extra_layers
        slower_end = (np.maximum(first_s, last_s) > q) | (pp == 2)
        to_last = (remaining > 0) & slower_end & (last_s > first_s) & (last > 1)
        to_first = (remaining > 0) & slower_end & ~to_last & (first > 1)
        last = last - to_last
        first = first - to_first
        remaining = np.where(remaining > 0, remaining - 1.0, 0.0)
    return first, last


def activation_bytes_per_layer(model: ModelSpec, training: TrainingSpec, tokens: np.ndarray, tp: np.ndarray,
                               recompute: np.ndarray, moe_layer: bool = False,
                               fp8_gemm_inputs: bool = False) -> np.ndarray:
    """Activation bytes one layer keeps for backward, per GPU, for ``tokens`` local tokens.

    Korthikanti et al. (2022) Table 2, term by term (per token, bytes):
    LayerNorm inputs ``4h``, attention and MLP inputs ``2h + 2h``, dropout masks
    ``h + h`` -- the ``10h`` that tensor parallelism alone leaves replicated and
    sequence parallelism divides by ``t``; Q, K, V and the projection input
    ``2h + 4h_kv + 2h`` (``h`` here the query width, ``h_kv`` the key width; MLA's
    per-head keys and values, and its latents, see ``ModelSpec``); the MLP's
    up-projection output and activation output
    (``8h + 8h`` for a 4h GeLU MLP); and the ``5as`` bytes of attention scores,
    softmax output and dropout mask that flash attention never stores.
    Selective recomputation drops the score term; full recomputation keeps only
    the layer input ``2h`` (sequence-sharded under sequence parallelism).

    Flash attention leaves selective recomputation no score term to drop; it then
    recomputes what is cheap to rebuild and costly to keep: the outputs of the
    RMSNorm/LayerNorms (rebuilt from their kept inputs), MLA's up-projections and, in
    MoE layers, the experts' activation output (rebuilt from the kept up-projection
    output). That is DeepSeek-V3's "recompute all RMSNorm operations and MLA
    up-projections" and "cache the inputs of the SwiGLU operator and recompute its
    output" (DeepSeek-V3 Technical Report, Sec. 3.2.3 and 3.3.2), and Megatron-Core's
    ``--recompute-granularity selective --recompute-modules layernorm mla_up_proj moe_act``.

    Without dropout (``training.dropout`` off) there are no masks, and the
    attention-times-V product reads the softmax output itself: ``8h`` replicated
    and ``2as`` of scores. With FP8 linears (``fp8_gemm_inputs``) Transformer
    Engine keeps the FP8 cast of each GEMM input for the weight-gradient GEMM
    (``saved_inputmat`` in its Linear / LayerNormLinear / LayerNormMLP): one byte
    per element for the two LayerNorm outputs and the MLP activation output; the
    projection keeps an FP8 copy of the attention output beside the bf16 one that
    flash attention's backward reads.
    """
    h, a, s = model.hidden_size, model.num_attention_heads, model.seq_length
    q_width, kv_width, ctx = model.query_width, model.key_width + model.value_width, model.context_width
    up = 2 if model.gated_mlp else 1
    tp = np.asarray(tp, dtype=float)
    rep_div = np.where(training.sequence_parallel, tp, 1.0)
    gemm_in = 1.0 if fp8_gemm_inputs else 2.0  # bytes per saved GEMM-input element
    masks = 2.0 * h if training.dropout else 0.0
    # MLA: each down-projected latent is kept before its RMSNorm (2 bytes) and after it,
    # as the input of its up-projection
    replicated = 4.0 * h + 2.0 * gemm_in * h + masks + (2.0 + gemm_in) * model.latent_width
    # the per-head queries, keys and values selective recomputation rebuilds from MLA's
    # latents instead of keeping them (mla_up_projections)
    rebuilt = 0.0
    if model.mla is not None:
        rebuilt = 2.0 * kv_width + (2.0 * q_width if model.mla.q_lora_rank else 0.0)
    if training.flash_attention:
        # Q, K, V and the bf16 output flash attention's backward reads (the projection's input)
        attn = 2.0 * q_width + 2.0 * kv_width + 2.0 * ctx + (ctx if fp8_gemm_inputs else 0.0)
        scores_none = 4.0 * a  # fp32 log-sum-exp per head
        scores_selective = scores_none - rebuilt
    else:
        attn = 2.0 * q_width + 2.0 * kv_width + gemm_in * ctx
        scores_none = (5.0 if training.dropout else 2.0) * a * s
        scores_selective = -rebuilt
    # rebuilt by selective recomputation under flash attention (see above): the two norm
    # outputs and MLA's normed latents (replicated), the experts' activation output (split)
    replicated_selective = replicated
    if moe_layer and model.moe is not None:
        moe = model.moe
        activation_out = gemm_in * moe.expert_ffn_hidden_size * (moe.experts_per_token + moe.shared_experts)
        routed = moe.experts_per_token * (gemm_in * h + 2.0 * moe.expert_ffn_hidden_size * up)
        shared = moe.shared_experts * 2.0 * moe.expert_ffn_hidden_size * up
        mlp = routed + shared + activation_out
    else:
        activation_out = 0.0
        mlp = 2.0 * model.ffn * up + gemm_in * model.ffn
    if training.flash_attention:
        replicated_selective = replicated - 2.0 * gemm_in * h - gemm_in * model.latent_width
        scores_selective = scores_selective - activation_out
    per_token = np.where(
        recompute == RECOMPUTE_FULL,
        2.0 * h / rep_div,
        np.where(recompute == RECOMPUTE_SELECTIVE, replicated_selective, replicated) / rep_div
        + (attn + mlp + np.where(recompute == RECOMPUTE_SELECTIVE, scores_selective, scores_none)) / tp,
    )
    return per_token * tokens


def fp8_quantize_time_s(model: ModelSpec, training: TrainingSpec, tokens: np.ndarray, tp: np.ndarray,
                        hbm_bytes_per_s: float, fp8: bool) -> tuple[dict[bool, np.ndarray], dict[bool, np.ndarray]]:
    """Forward and backward time one layer spends quantizing GEMM operands to FP8, per micro-batch.

    An FP8 GEMM needs FP8 operands: Transformer Engine casts every linear's input in
    the forward pass and every output gradient in the backward pass, writing the FP8
    tensor and its transpose (the weight-gradient GEMM reads the other layout; Hopper's
    FP8 tensor cores take only the "TN" layout). That is a memory-bound pass reading
    2 bytes and writing 1 + 1 per element. With delayed scaling (TE's default recipe)
    the scale comes from past amaxes and the LayerNorm kernel writes its output in FP8
    directly, so the two LayerNorm-fed inputs cost nothing extra; with current scaling
    the amax of the tensor itself must be known first: one more 2-byte read pass, and
    the LayerNorm output is quantized like any other tensor. Weights are cast once per
    step (TE caches them across micro-batches), which is left out.

    Returns ``({False: dense, True: MoE}, {False: dense, True: MoE})`` layer times; zeros
    when the linears do not run in FP8.
    """
    zeros = np.zeros_like(np.asarray(tokens, dtype=float))
    if not fp8:
        return {False: zeros, True: zeros}, {False: zeros, True: zeros}
    h = model.hidden_size
    up = 2 if model.gated_mlp else 1
    tp = np.asarray(tp, dtype=float)
    rep_div = np.where(training.sequence_parallel, tp, 1.0)  # the sequence-sharded tensors
    current = training.fp8_scaling == "current"
    bytes_per_element = 6.0 if current else 4.0
    ln_fed = h / rep_div if current else 0.0  # LayerNorm output feeding QKV / the MLP up-projection
    # attention linears: inputs other than the LayerNorm output (MLA's latents, the heads'
    # output entering the row-parallel projection) and every output gradient
    attn_inputs = sum(p.in_width / (tp if p.split == "row" else 1.0)
                      for p in model.attention_projections if p.reads != "norm")
    attn_output_grads = sum(h / rep_div if p.split == "row" else p.out_width / (tp if p.split == "column" else 1.0)
                            for p in model.attention_projections)

    def per_token(mlp_fwd, mlp_bwd):
        # forward: QKV input, projection input (the local heads' output), MLP inputs;
        # backward: the output gradients of QKV, projection and the MLP's two linears
        fwd = ln_fed + attn_inputs + mlp_fwd
        bwd = attn_output_grads + mlp_bwd
        return fwd * bytes_per_element, bwd * bytes_per_element

    dense_fwd, dense_bwd = per_token(ln_fed + model.ffn / tp, up * model.ffn / tp + h / rep_div)
    if model.moe is not None:
        moe = model.moe
        k, fe, shared = moe.experts_per_token, moe.expert_ffn_hidden_size, moe.shared_experts
        # each routed copy of a token enters its expert whole (h) and leaves it whole
        moe_fwd, moe_bwd = per_token(k * h + (k + shared) * fe / tp + (ln_fed if shared else 0.0),
                                     (k + shared) * up * fe / tp + k * h + (h / rep_div if shared else 0.0))
    else:
        moe_fwd, moe_bwd = dense_fwd, dense_bwd
    scale = tokens / hbm_bytes_per_s
    return {False: dense_fwd * scale, True: moe_fwd * scale}, {False: dense_bwd * scale, True: moe_bwd * scale}


# --------------------------------------------------------------------- prediction


def zero_stage_held(zero: np.ndarray | int, pp: np.ndarray | int) -> np.ndarray:
    """The ZeRO stage whose sharding a GPU's memory actually sees between micro-batches.

    Sharding gradients (stage 2) or weights (stage 3) per micro-batch would cost a
    reduce-scatter, and a weight all-gather, for every micro-batch; a pipeline runs many.
    DeepSpeed refuses ZeRO-2/3 with pipeline parallelism; PyTorch FSDP under
    ``torch.distributed.pipelining`` runs it by deferring: ``set_requires_gradient_sync``
    is off until the stage's last backward, so gradients accumulate whole, and torchtitan
    keeps weights gathered after the forward "to avoid per-microbatch all-gathers"
    (``fsdp_reshard_after_forward`` default with pp). Llama 3 405B trained so: FSDP with
    pp = 16, fp32 gradient accumulation over micro-batches (Llama Team, "The Llama 3 Herd
    of Models", 2024, Sec. 3.3.2). Between micro-batches such a stage holds ZeRO-1's
    bytes: whole 16-bit weights, whole gradients, sharded fp32 master weights and moments.
    """
    return np.where((zero >= 2) & (pp > 1), np.minimum(zero, 1), zero)


def model_state_bytes(dense_params: np.ndarray, expert_params: np.ndarray, zero: np.ndarray,
                      shard_dense: np.ndarray, shard_expert: np.ndarray, training: TrainingSpec,
                      fp8_linears: bool, unquantized_params: np.ndarray | float = 0.0
                      ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Bytes of weights, gradients and optimizer state one GPU keeps for the parameters it holds.

    Mixed-precision Adam keeps 16-bit weights, ``training.grad_bytes_per_param`` of
    gradient and 12 bytes of fp32 master weight and two moments per parameter: the
    16-18 bytes of Rajbhandari et al., "ZeRO" (SC20), Sec. 3.1. ZeRO stage 1 shards the
    optimizer state over the data-parallel group, stage 2 the gradients as well and
    stage 3 the weights; dense parameters are sharded over ``shard_dense`` ranks (data x
    context parallel), expert parameters over their own, smaller ``shard_expert``. FP8
    runs (``fp8_linears``) hold each linear weight as FP8 data and its FP8 transpose,
    beside its 16-bit copy unless ``training.fp8_params``; the ``unquantized_params``
    among the dense ones (embedding, output layer, position table) stay 16-bit.
    The software flags add what older stacks held on top (see TrainingSpec).
    """
    grad_bytes = float(training.grad_bytes_per_param)
    linear_bytes = (2.0 if training.fp8_params else 4.0) if fp8_linears else 2.0
    whole = dense_params + expert_params
    sharded = dense_params / shard_dense + expert_params / shard_expert
    weights = np.where(zero >= 3, linear_bytes * sharded + (2.0 - linear_bytes) * unquantized_params / shard_dense,
                       linear_bytes * whole + (2.0 - linear_bytes) * unquantized_params)
    grads = np.where(zero >= 2, grad_bytes * sharded, grad_bytes * whole)
    if training.ddp_bucket_copy:
        grads = grads + grad_bytes * whole
    if training.fp32_grad_copy_kept and grad_bytes < 4.0:
        # the optimizer's fp32 gradient copy lives with the master weights it feeds
        grads = grads + np.where(zero >= 1, 4.0 * sharded, 4.0 * whole)
    optimizer_state = np.where(zero >= 1, 12.0 * sharded, 12.0 * whole)
    return weights, grads, optimizer_state


@dataclass(frozen=True)
class StageActivations:
    """Peak activation bytes per GPU on the first, the last and the fullest middle
    pipeline stage (zero without one), with allocator fragmentation; how many layers that
    middle stage holds and its pipeline rank."""

    first_bytes: np.ndarray
    last_bytes: np.ndarray
    middle_bytes: np.ndarray
    middle_layers: np.ndarray
    middle_rank: np.ndarray


def stage_activation_bytes(model: ModelSpec, training: TrainingSpec, tokens: np.ndarray, tp: np.ndarray,
                           recompute: np.ndarray, full_fraction: np.ndarray, layers_per_stage: np.ndarray,
                           dense_layers: np.ndarray, moe_layers: np.ndarray, first_layers: np.ndarray,
                           last_layers: np.ndarray, pp: np.ndarray, v: np.ndarray, m: np.ndarray,
                           fp8_gemm_inputs: bool = False) -> StageActivations:
    """Peak activation bytes on the first, the last and the fullest middle pipeline stage.

    Stage ``r`` holds min(m, p - r) micro-batches in flight under 1F1B and
    2(p - r - 1) + (v-1)p + 1 model chunks under the interleaved schedule (Narayanan et
    al., SC21, Sec. 2.2; Megatron-LM's warm-up counts): the first the most, the last
    one, or (v-1)p + 1 chunks when interleaved, plus the fp32 logits. A middle stage
    holds ``layers_per_stage`` layers of which ``dense_layers`` and ``moe_layers`` are
    of each kind; ``first_layers`` and ``last_layers`` are what the end stages keep. A
    middle stage keeps fewer micro-batches in flight than the first but, when the ends
    shed layers, more layers, and can be the fullest (Llama 3 405B: 8 layers x 15
    micro-batches on the second of 16 stages against 7 x 16 on the first). Layers the
    ends do not shed are taken from the middle stages nearest the first, which keep the
    most in flight.
    Per-layer bytes are Korthikanti et al.'s (activation_bytes_per_layer); under a
    partial full recomputation the ``1 - full_fraction`` of layers it leaves out keep
    all of theirs. Activations are counted with ``ACTIVATION_FRAGMENTATION``.
    """
    h, vocab = model.hidden_size, model.vocab_size
    has_moe = model.num_moe_layers > 0
    single = pp == 1
    q, q_dense, q_moe = layers_per_stage, dense_layers, moe_layers
    dense_act = activation_bytes_per_layer(model, training, tokens, tp, recompute, moe_layer=False,
                                           fp8_gemm_inputs=fp8_gemm_inputs)
    moe_act = activation_bytes_per_layer(model, training, tokens, tp, recompute, moe_layer=True,
                                         fp8_gemm_inputs=fp8_gemm_inputs) if has_moe else 0.0
    layer_act_avg = (q_dense * dense_act + q_moe * moe_act) / q
    # layers left out of a partial full recomputation keep everything
    no_recompute = np.zeros_like(recompute)
    kept_dense = activation_bytes_per_layer(model, training, tokens, tp, no_recompute, moe_layer=False,
                                            fp8_gemm_inputs=fp8_gemm_inputs)
    kept_moe = activation_bytes_per_layer(model, training, tokens, tp, no_recompute, moe_layer=True,
                                          fp8_gemm_inputs=fp8_gemm_inputs) if has_moe else 0.0
    layer_act_avg = np.where(recompute == RECOMPUTE_FULL,
                             full_fraction * layer_act_avg + (1.0 - full_fraction) * (q_dense * kept_dense
                                                                                      + q_moe * kept_moe) / q,
                             layer_act_avg)

    def chunks_in_flight(rank):
        return np.where(v == 1, np.minimum(m, pp - rank),
                        np.minimum(m * v, 2.0 * (pp - rank - 1.0) + (v - 1.0) * pp + 1.0))

    chunks_first = chunks_in_flight(0.0)
    chunks_last = np.where(v == 1, 1.0, np.minimum(m * v, (v - 1.0) * pp + 1.0))
    layers_first = chunks_first * first_layers / v
    layers_last = np.where(single, layers_first, chunks_last * last_layers / v)
    # the fullest middle stage: the second (one layer short if the middle stages shed
    # any), or the first middle stage past the shortened ones
    middle_short = middle_stages_short(model.num_layers, pp, q, first_layers, last_layers)
    second_layers = q - (middle_short >= 1)
    second = chunks_in_flight(1.0) * second_layers / v
    past_short = np.where(middle_short + 1.0 <= pp - 2.0, chunks_in_flight(middle_short + 1.0) * q / v, 0.0)
    layers_mid = np.where(pp >= 3, np.maximum(second, past_short), 0.0)
    mid_rank = np.where(second >= past_short, 1.0, middle_short + 1.0)
    mid_layers = np.where(second >= past_short, second_layers, q)
    chunks_mid = chunks_in_flight(mid_rank)
    # full recomputation rebuilds one layer's activations at a time during backward
    transient = np.where(recompute == RECOMPUTE_FULL, kept_moe if has_moe else kept_dense, 0.0)
    # the embedding output's dropout mask
    embed_act = chunks_first * tokens * h / np.where(training.sequence_parallel, tp, 1.0) \
        if training.dropout else np.zeros_like(tokens)
    act_first = layers_first * layer_act_avg + transient + embed_act
    act_mid = np.where(pp >= 3, layers_mid * layer_act_avg + transient, 0.0)
    if training.stage_outputs_kept:
        # each in-flight model chunk's output (the residual stream, 2 bytes per element)
        stage_output = tokens * h * 2.0 / np.where(training.sequence_parallel, tp, 1.0)
        act_first = act_first + np.where(single, 0.0, chunks_first * stage_output)
        act_mid = act_mid + np.where(pp >= 3, chunks_mid * stage_output, 0.0)
    logits_act = 4.0 * tokens * vocab / tp
    # multi-token prediction: per module its layer, its normed 2h input and another set
    # of logits, for the one micro-batch the last stage holds in its last model chunk
    mtp_act = model.mtp_layers * ((moe_act if model.mtp_layer_is_moe else dense_act) + logits_act
                                  + 2.0 * 2.0 * h * tokens / np.where(training.sequence_parallel, tp, 1.0))
    act_last = layers_last * layer_act_avg + transient + logits_act + mtp_act
    act_first = np.where(single, act_first + logits_act + mtp_act, act_first)
    fragmented = 1.0 + ACTIVATION_FRAGMENTATION
    return StageActivations(act_first * fragmented, act_last * fragmented, act_mid * fragmented, mid_layers,
                            np.where(pp >= 3, mid_rank, 0.0))


def predict_layouts(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec,
                    layouts: LayoutArrays) -> dict[str, np.ndarray]:
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
    """
    f64 = np.float64
    dp = layouts.dp.astype(f64)
    tp = layouts.tp.astype(f64)
    pp = layouts.pp.astype(f64)
    cp = layouts.cp.astype(f64)
    ep = layouts.ep.astype(f64)
    mbs = layouts.mbs.astype(f64)
    v = layouts.v.astype(f64)
    zero = layouts.zero
    rc = layouts.recompute

    h, a, s, vocab = model.hidden_size, model.num_attention_heads, model.seq_length, model.vocab_size
    up = 2 if model.gated_mlp else 1
    n_layers = model.num_layers
    n_moe = model.num_moe_layers
    gpn = cluster.gpus_per_node
    batch = training.global_batch_sequences
    counts = parameter_counts(model)

    peak_bf16 = cluster.peak_flops_per_s.get("bf16") or max(cluster.peak_flops_per_s.values())
    peak_linear = cluster.peak_flops_per_s.get(training.precision, peak_bf16)
    linear_bytes = 1.0 if training.precision == "fp8" and training.precision in cluster.peak_flops_per_s else 2.0
    eff = cluster.gemm_efficiency_max
    hbm = cluster.hbm_bandwidth_bytes_per_s
    hbm_eff = hbm * _HBM_EFFICIENCY
    sms = cluster.sm_count
    intra = LinkSpec(cluster.intra_node_bandwidth_bytes_per_s * _NVLINK_EFFICIENCY, cluster.intra_node_latency_s)
    inter = LinkSpec(cluster.inter_node_bandwidth_bytes_per_s * _IB_EFFICIENCY, cluster.inter_node_latency_s)

    m = np.ceil(batch / (dp * mbs))  # micro-batches per step per pipeline
    tokens = mbs * s / cp  # local tokens of one micro-batch

    # ---- stage split: ceil(L/p) layers on the middle stages, the remainder off the ends
    # (which end: balanced_end_layers, below, once a layer's time is known)
    q, _, _ = stage_layer_split(n_layers, layouts.pp)
    # share of the layers whose forward full recomputation repeats: the first
    # recompute_layers of each q/v-layer model chunk (shorter end stages are taken to
    # recompute the same share)
    full_frac = np.where(rc == RECOMPUTE_FULL, np.clip(layouts.recompute_layers / (q / v), 0.0, 1.0), 0.0)
    moe_frac = n_moe / n_layers
    q_moe = np.ceil(q * moe_frac) if n_moe else np.zeros_like(q)
    q_dense = q - q_moe

    # ---- per-layer forward time on one GPU, for one micro-batch
    # FP8 linears run against the FP8 ceiling where one was measured (GPUSpec)
    eff_linear = cluster.fp8_gemm_efficiency_max if linear_bytes == 1.0 and cluster.fp8_gemm_efficiency_max \
        else eff

    def gemm(mm, nn, kk, linear=True, batch=1.0):
        return _gemm_time_s(mm, nn, kk, peak_linear if linear else peak_bf16, eff_linear if linear else eff, hbm,
                            sms, linear_bytes if linear else 2.0, batch)

    def gemm_bwd(mm, nn, kk, linear=True, batch=1.0):
        return _gemm_backward_time_s(mm, nn, kk, peak_linear if linear else peak_bf16,
                                     eff_linear if linear else eff, hbm, sms, linear_bytes if linear else 2.0, batch)

    # the column-parallel linears' backward GEMMs (QKV, MLP up-projection): the window the
    # asynchronous backward collectives run in (see layer_time)
    def projection_shape(p):
        """(output, input) features of one attention linear on one tensor-parallel rank."""
        return (p.out_width / tp if p.split == "column" else p.out_width,
                p.in_width / tp if p.split == "row" else p.in_width)

    column = [projection_shape(p) for p in model.attention_projections if p.split == "column"]
    qkv_dgrad = sum(gemm(tokens, k_in, n_out) for n_out, k_in in column)
    qkv_wgrad = sum(gemm(k_in, n_out, tokens) for n_out, k_in in column)
    fc1_dgrad, fc1_wgrad = gemm(tokens, h, up * model.ffn / tp), gemm(h, up * model.ffn / tp, tokens)
    attn_proj = sum(gemm(tokens, *projection_shape(p)) for p in model.attention_projections)
    mla_up_fwd = sum((gemm(tokens, *projection_shape(p)) for p in mla_up_projections(model)), np.zeros_like(tokens))
    attn_proj_b = sum(gemm_bwd(tokens, *projection_shape(p)) for p in model.attention_projections)
    dense_mlp = gemm(tokens, up * model.ffn / tp, h) + gemm(tokens, h, model.ffn / tp)
    dense_mlp_b = gemm_bwd(tokens, up * model.ffn / tp, h) + gemm_bwd(tokens, h, model.ffn / tp)
    if model.moe is not None:
        moe = model.moe
        fe = moe.expert_ffn_hidden_size
        local_experts = moe.num_experts / ep
        # the busiest expert sets the pace: dropless routing with an auxiliary balancing
        # loss still leaves it ~20% above the mean (the 1.2-1.25 capacity factors budgeted
        # by GShard, Lepikhin et al. 2021, and Switch, Fedus et al. 2022)
        tokens_per_expert = np.maximum(_EXPERT_IMBALANCE * tokens * moe.experts_per_token * ep / moe.num_experts,
                                       1.0)
        moe_mlp = gemm(tokens_per_expert, up * fe / tp, h, batch=local_experts) \
            + gemm(tokens_per_expert, h, fe / tp, batch=local_experts)
        moe_mlp_b = gemm_bwd(tokens_per_expert, up * fe / tp, h, batch=local_experts) \
            + gemm_bwd(tokens_per_expert, h, fe / tp, batch=local_experts)
        if moe.shared_experts:
            moe_mlp = moe_mlp + gemm(tokens, up * fe * moe.shared_experts / tp, h) \
                + gemm(tokens, h, fe * moe.shared_experts / tp)
            moe_mlp_b = moe_mlp_b + gemm_bwd(tokens, up * fe * moe.shared_experts / tp, h) \
                + gemm_bwd(tokens, h, fe * moe.shared_experts / tp)
        moe_mlp = moe_mlp + gemm(tokens, float(moe.num_experts), h, linear=False)
        moe_mlp_b = moe_mlp_b + gemm_bwd(tokens, float(moe.num_experts), h, linear=False)
        exp_dgrad = gemm(tokens_per_expert, h, up * fe / tp, batch=local_experts)
        exp_wgrad = gemm(h, up * fe / tp, tokens_per_expert, batch=local_experts)
    else:
        moe_mlp = np.zeros_like(tokens)
        moe_mlp_b = np.zeros_like(tokens)
        exp_dgrad = exp_wgrad = np.zeros_like(tokens)

    heads_local = a / tp
    if training.flash_attention:
        # causal flash attention skips the masked half; backward is 2.5x forward's FLOPs
        # (five matmuls against two, Dao 2023), run at a lower fraction of peak
        attn_core_fwd = tokens * s * (model.query_width + model.context_width) / tp \
            / (peak_bf16 * eff * _FLASH_OVER_GEMM)
        attn_core_bwd = 2.5 * attn_core_fwd / _FLASH_BACKWARD_OVER_FORWARD
        score_bytes_fwd = np.zeros_like(tokens)
    else:
        # batched QK^T and attention x V over the full s x s matrix (masked after),
        # plus fused scale-mask-softmax and dropout streaming 9 bytes per score
        batch_heads = mbs * heads_local
        batched = gemm(tokens / mbs, float(s), float(model.query_width / a), linear=False, batch=batch_heads) \
            + gemm(tokens / mbs, float(model.context_width / a), float(s), linear=False, batch=batch_heads)
        score_bytes_fwd = 9.0 * tokens * heads_local * s
        attn_core_fwd = batched + score_bytes_fwd / hbm_eff
        # backward: four batched GEMMs (dQ, dK, dV, dP) and softmax/dropout backward,
        # which stream about 1.5x the forward's bytes per score (read output, grad and
        # mask, write one grad)
        attn_core_bwd = 2.0 * batched + 1.5 * score_bytes_fwd / hbm_eff

    rep_div = np.where(training.sequence_parallel, tp, 1.0)
    # LayerNorms (read + write), two bias-dropout-residual adds (read 2, write 1, mask 0.5)
    elementwise_fwd_bytes = tokens * (22.0 * h / rep_div + 2.0 * (up + 1) * model.ffn / tp)
    elementwise_fwd = elementwise_fwd_bytes / hbm_eff
    # selective recomputation under flash attention (activation_bytes_per_layer) rebuilds
    # the norm outputs (read 2 + write 2 bytes per element) and, in MoE layers, the
    # experts' activation output from the kept up-projection output
    norm_rebuild = tokens * 8.0 * (h + model.latent_width) / rep_div / hbm_eff
    if model.moe is not None:
        act_rebuild = tokens * (model.moe.experts_per_token + model.moe.shared_experts) \
            * (2.0 * up + linear_bytes) * model.moe.expert_ffn_hidden_size / tp / hbm_eff
    else:
        act_rebuild = np.zeros_like(tokens)
    quantize_fwd, quantize_bwd = fp8_quantize_time_s(model, training, tokens, tp, hbm_eff, fp8=linear_bytes == 1.0)

    # tensor parallel: 2 all-reduces (or all-gather + reduce-scatter with sequence
    # parallelism, the same bytes) of the full activation per layer forward, 2 backward
    tp_link_intra = tp <= gpn
    act_bytes = tokens * h * 2.0
    ar_intra = _collective_time(lambda n, p: allreduce_time_s(n, p, intra), act_bytes, layouts.tp)
    ar_inter = _collective_time(lambda n, p: allreduce_time_s(n, p, inter), act_bytes, layouts.tp)
    tp_ar = np.where(tp_link_intra, ar_intra, ar_inter)
    if not training.sequence_parallel:
        # a true all-reduce: NVLink SHARP speeds it up across a full NVSwitch node (NCCL
        # picks NVLS for all-reduce only; sequence parallelism's all-gather and
        # reduce-scatter run as rings) -- see GPUSpec.nvls_allreduce_speedup
        tp_ar = np.where((layouts.tp == gpn) & (gpn >= 8), tp_ar / cluster.nvls_allreduce_speedup, tp_ar)

    # context parallel: ring exchange of K and V chunks, overlapped with attention
    kv_bytes = tokens * (model.key_width + model.value_width) * 2.0 / tp
    cp_intra = tp * cp <= gpn
    cp_ring = np.where(
        cp_intra,
        _collective_time(lambda n, p: allgather_time_s(n, p, intra), kv_bytes * cp, layouts.cp),
        _collective_time(lambda n, p: allgather_time_s(n, p, inter), kv_bytes * cp, layouts.cp),
    )
    cp_fwd = overlapped_time_s(cp_ring, attn_core_fwd)
    cp_bwd = overlapped_time_s(2.0 * cp_ring, attn_core_bwd)

    # expert parallel: dispatch + combine all-to-all per MoE layer forward, twice backward
    if model.moe is not None:
        stride = layouts.tp * layouts.cp
        if training.expert_dispatch == "node-deduplicated":
            # FP8 runs dispatch the FP8 copy the expert GEMM quantizes anyway (1 byte and a
            # 4-byte scale per 128 elements, DeepSeek-V3 Sec. 3.3.2); combines stay 16-bit
            token_bytes = _EXPERT_IMBALANCE * tokens * h / tp
            dispatch_bytes = 1.0 + 4.0 / 128.0 if linear_bytes == 1.0 else 2.0
            one_way = functools.partial(deduplicated_dispatch_time_s, experts_per_token=model.moe.experts_per_token,
                                        num_groups=model.moe.num_groups, group_topk=model.moe.group_topk,
                                        stride=stride, ep=layouts.ep, gpus_per_node=gpn, intra=intra, inter=inter)
            # the mean of a dispatch and a combine: n_coll below counts them in pairs
            a2a = 0.5 * (one_way(token_bytes * dispatch_bytes) + one_way(token_bytes * 2.0))
        else:
            a2a_bytes = _EXPERT_IMBALANCE * tokens * model.moe.experts_per_token * h * 2.0 / tp
            a2a = expert_alltoall_time_s(a2a_bytes, stride, layouts.ep, gpn, intra, inter)
        moe_elem = tokens * 8.0 * model.moe.experts_per_token * h / tp / hbm_eff  # permute / unpermute
    else:
        a2a = np.zeros_like(tokens)
        moe_elem = np.zeros_like(tokens)

    def async_backward_tp(dgrad, wgrad):
        """Exposed part of one column-parallel linear's asynchronous backward collectives.

        Without sequence parallelism the input-gradient all-reduce runs under the
        weight-gradient GEMM; with it, the input's all-gather under the input-gradient
        GEMM and the input-gradient reduce-scatter under the weight-gradient GEMM (each
        half the all-reduce's bytes).
        """
        if training.sequence_parallel:
            return overlapped_time_s(tp_ar / 2.0, dgrad) + overlapped_time_s(tp_ar / 2.0, wgrad)
        return overlapped_time_s(tp_ar, wgrad)

    def layer_time(mlp_gemm, mlp_gemm_b, is_moe: bool):
        gemm_f = attn_proj + mlp_gemm
        gemm_b = attn_proj_b + mlp_gemm_b
        elem = elementwise_fwd + (moe_elem if is_moe else 0.0)
        fwd_compute = gemm_f + attn_core_fwd + elem + quantize_fwd[is_moe]
        bwd_compute = gemm_b + attn_core_bwd + 2.0 * elem + quantize_bwd[is_moe]
        selective = mla_up_fwd + (norm_rebuild + (act_rebuild if is_moe else 0.0) if training.flash_attention
                                  else attn_core_fwd)
        recompute_compute = full_frac * fwd_compute + np.where(rc == RECOMPUTE_SELECTIVE, selective, 0.0)
        # collectives per layer: 2 forward, 2 backward, 2 more when the forward is recomputed
        # (all-reduce equivalents; all-gather + reduce-scatter with sequence parallelism)
        n_coll = 4.0 + 2.0 * full_frac
        compute = fwd_compute + bwd_compute + recompute_compute
        tp_comm = n_coll * tp_ar
        if training.overlap_tp_backward and not training.overlap_tp_comm:
            # Megatron's column-parallel linears (QKV, MLP up-projection) run their backward
            # collectives asynchronously under their own GEMMs (Megatron-LM
            # linear_with_grad_accumulation_and_async_allreduce: "the tensor parallel all
            # reduce of the input gradients can be done asynchronously with the calculation
            # of the weight gradients"); what stays in line is the forward's, the
            # recomputed forward's and, with sequence parallelism, the all-gather of the
            # output gradient in front of each row-parallel linear (one all-reduce's worth)
            in_line = 2.0 + 2.0 * full_frac + (1.0 if training.sequence_parallel else 0.0)
            up_dgrad, up_wgrad = (exp_dgrad, exp_wgrad) if is_moe else (fc1_dgrad, fc1_wgrad)
            tp_comm = in_line * tp_ar + async_backward_tp(qkv_dgrad, qkv_wgrad) \
                + async_backward_tp(up_dgrad, up_wgrad)
        if training.overlap_tp_comm:
            # pipelined all-gather/reduce-scatter under the neighbouring GEMMs (Transformer
            # Engine userbuffers; Wang et al., "Overlap communication with dependent
            # computation via decomposition", ASPLOS 2023): what the GEMMs cannot cover
            # stays exposed, plus the first and last chunk of each collective (~1/8)
            linear = gemm_f + gemm_b + full_frac * gemm_f
            tp_comm = overlapped_time_s(tp_comm, linear, tp_comm / 8.0)
        ep_comm = n_coll * a2a if is_moe else np.zeros_like(compute)
        if training.overlap_ep_comm and is_moe:
            # dispatch/combine of one micro-batch run under another's computation of the
            # same layer (a forward paired with a backward): what that cannot cover shows
            ep_comm = overlapped_time_s(ep_comm, compute)
        cp_comm = cp_fwd + cp_bwd + full_frac * cp_fwd
        return compute, tp_comm, ep_comm, cp_comm

    d_compute, d_tp, d_ep, d_cp = layer_time(dense_mlp, dense_mlp_b, False)
    m_compute, m_tp, m_ep, m_cp = layer_time(moe_mlp, moe_mlp_b, True) if n_moe else (0.0, 0.0, 0.0, 0.0)

    def stage(n_dense, n_moe_layers):
        return (n_dense * d_compute + n_moe_layers * m_compute, n_dense * d_tp + n_moe_layers * m_tp,
                n_moe_layers * m_ep, n_dense * d_cp + n_moe_layers * m_cp)

    # output layer + vocab-parallel cross-entropy on the last stage (fp32 logits,
    # a few passes of 4 bytes per logit). The output head stays in 16-bit in FP8 runs:
    # DeepSeek-V3 keeps "the embedding module, the output head, MoE gating modules,
    # normalization operators, and attention operators" in BF16/FP32 (DeepSeek-V3
    # Technical Report, Sec. 3.3.1), and Megatron-Core's output layer is its own
    # ColumnParallelLinear, outside Transformer Engine's FP8 autocast.
    logit_time = gemm(tokens, vocab / tp, h, linear=False) + gemm_bwd(tokens, vocab / tp, h, linear=False) \
        + tokens * vocab / tp * 16.0 / hbm_eff

    # multi-token prediction on the last stage: per module one more layer of the last
    # layer's kind, its 2h -> h projection and one more pass through the output head
    if model.mtp_layers:
        mtp_layer = stage(0.0, 1.0) if model.mtp_layer_is_moe else stage(1.0, 0.0)
        mtp_compute = model.mtp_layers * (mtp_layer[0] + gemm(tokens, h / tp, 2.0 * h)
                                          + gemm_bwd(tokens, h / tp, 2.0 * h) + logit_time)
        mtp_tp, mtp_ep, mtp_cp = (model.mtp_layers * part for part in mtp_layer[1:])
    else:
        mtp_compute = mtp_tp = mtp_ep = mtp_cp = np.zeros_like(tokens)
    mtp_time = mtp_compute + mtp_tp + mtp_ep + mtp_cp

    embed_compute = embedding_time_s(tokens, h, vocab, tp, hbm_eff)
    # the partial rows of the vocabulary-parallel lookup are all-reduced across the
    # tensor group (reduce-scatter with sequence parallelism: the same bytes)
    embed_tp = tp_ar

    single = pp == 1
    # which end stages shed the layers a pipeline of q-layer stages leaves over
    mid = stage(q_dense, q_moe)
    layer_s = (mid[0] + mid[1] + mid[2] + mid[3]) / q
    first_layers, last_layers = balanced_end_layers(q, layouts.pp * q - n_layers, layouts.pp,
                                                    (embed_compute + embed_tp) / layer_s,
                                                    (logit_time + mtp_time) / layer_s)
    last_moe = np.minimum(q_moe, last_layers)
    first_moe = np.minimum(q_moe, first_layers)

    # ---- parameters held per GPU on a middle, the first (embedding) and the last (output) stage
    attn_gpu = counts.attention_per_gpu(tp)
    mid_dense = q * attn_gpu + (q_dense * counts.dense_mlp_per_layer + q_moe * counts.moe_shared_per_layer) / tp
    mid_expert = q_moe * counts.experts_per_layer / (ep * tp)
    first_dense = first_layers * attn_gpu + ((first_layers - first_moe) * counts.dense_mlp_per_layer
                                             + first_moe * counts.moe_shared_per_layer) / tp \
        + counts.embedding / tp + counts.position_embedding
    first_expert = first_moe * counts.experts_per_layer / (ep * tp)
    out_params = (counts.output if counts.output else counts.embedding)
    last_dense = last_layers * attn_gpu + ((last_layers - last_moe) * counts.dense_mlp_per_layer
                                           + last_moe * counts.moe_shared_per_layer) / tp + out_params / tp
    last_expert = last_moe * counts.experts_per_layer / (ep * tp)
    # multi-token prediction: its layers and projections, and (untied) a copy of the embedding
    mtp_mlp = counts.moe_shared_per_layer if model.mtp_layer_is_moe else counts.dense_mlp_per_layer
    mtp_dense = model.mtp_layers * (attn_gpu + (mtp_mlp + counts.mtp_projection) / tp)
    mtp_expert = model.mtp_layers * (counts.experts_per_layer / (ep * tp) if model.mtp_layer_is_moe else 0.0)
    embedding_copy = counts.embedding / tp if model.mtp_layers and counts.output else 0.0
    last_dense = last_dense + mtp_dense + embedding_copy
    last_expert = last_expert + mtp_expert
    # pp == 1: one stage holds embedding and output
    first_dense = np.where(single, first_dense + counts.output / tp + mtp_dense, first_dense)
    first_expert = np.where(single, first_expert + mtp_expert, first_expert)

    # unfused weight-gradient accumulation: one pass over the stage's parameters per micro-batch
    def accumulation_s(params_per_gpu: np.ndarray) -> np.ndarray:
        if training.gradient_accumulation_fusion:
            return np.zeros_like(params_per_gpu)
        return gradient_accumulation_time_s(params_per_gpu, training.grad_bytes_per_param, hbm_eff)

    mid_acc = accumulation_s(mid_dense + mid_expert)
    first_acc = accumulation_s(first_dense + first_expert)
    last_acc = accumulation_s(last_dense + last_expert)

    first = stage(first_layers - first_moe, first_moe)
    last = stage(last_layers - last_moe, last_moe)
    mid_total = mid[0] + mid[1] + mid[2] + mid[3] + mid_acc
    first_total = first[0] + first[1] + first[2] + first[3] + embed_compute + embed_tp + first_acc
    last_total = last[0] + last[1] + last[2] + last[3] + logit_time + mtp_time + last_acc
    # the slowest stage paces the steady state (Narayanan et al. SC21, Sec. 2.2: every
    # stage runs one forward and one backward per micro-batch in lock-step)
    stage_time = np.where(single, first_total + logit_time + mtp_time,
                          np.maximum(first_total, np.maximum(mid_total, last_total)))
    use_last = (~single) & (last_total >= first_total) & (last_total > mid_total)
    use_first = (~single) & (~use_last) & (first_total > mid_total)
    comp_stage = np.select([single, use_last, use_first],
                           [first[0] + logit_time + mtp_compute + embed_compute + first_acc,
                            last[0] + logit_time + mtp_compute + last_acc,
                            first[0] + embed_compute + first_acc],
                           default=mid[0] + mid_acc)
    tp_stage = np.select([single, use_last, use_first],
                         [first[1] + embed_tp + mtp_tp, last[1] + mtp_tp, first[1] + embed_tp], default=mid[1])
    ep_stage = np.select([single, use_last, use_first], [first[2] + mtp_ep, last[2] + mtp_ep, first[2]],
                         default=mid[2])
    cp_stage = np.select([single, use_last, use_first], [first[3] + mtp_cp, last[3] + mtp_cp, first[3]],
                         default=mid[3])

    # pipeline point-to-point: activation forward, its gradient backward, per model chunk.
    # Each tensor rank sends 1/t of the activation: with sequence parallelism it holds only
    # that; without it Megatron's scatter-gather sends 1/t and the receiver all-gathers the
    # shards over NVLink (SC21 Sec. 4.1), or, with that turned off, every rank sends it whole.
    # The pipeline is paced by its slowest boundary: once the stages of one pipeline
    # do not all fit in one node, some boundary crosses the inter-node network.
    whole_activation = not training.sequence_parallel and not training.pipeline_scatter_gather
    p2p_bytes = tokens * h * 2.0 / np.where(whole_activation, 1.0, tp)
    stage_ranks = tp * cp * ep
    pp_inter = (stage_ranks >= gpn) | (stage_ranks * pp > gpn)
    p2p_one = np.where(pp_inter, _p2p_time(p2p_bytes, inter), _p2p_time(p2p_bytes, intra))
    if not training.sequence_parallel and training.pipeline_scatter_gather:
        p2p_one = p2p_one + _collective_time(lambda n, p: allgather_time_s(n, p, intra), p2p_bytes * tp, layouts.tp)
    # with overlap_p2p_comm (interleaved schedule only) each exchange is posted
    # asynchronously and waited for when the next model chunk needs it: it runs under the
    # current chunk's forward or backward, without the batched exchange's device sync
    async_p2p = training.overlap_p2p_comm & (v > 1.0)
    chunk_window = stage_time / (2.0 * v)
    p2p_one = np.where(async_p2p, overlapped_time_s(p2p_one, chunk_window), p2p_one + _P2P_SYNC_S)
    p2p_per_mb = np.where(single, 0.0, 2.0 * v * p2p_one)

    # unequal stages (embedding first, logits last): see pipeline_time_s
    pipeline_time = pipeline_time_s(np.where(single, stage_time, first_total + p2p_per_mb), mid_total + p2p_per_mb,
                                    last_total + p2p_per_mb, pp, v, m)
    bubble = np.where(single, 0.0, pipeline_time - m * (stage_time + p2p_per_mb))

    shard_dense = dp * cp
    shard_expert = np.maximum(dp * cp / ep, 1.0)
    gb = float(training.grad_bytes_per_param)
    fp8 = linear_bytes == 1.0

    zero_held = zero_stage_held(zero, pp)
    deferred = zero_held != zero
    # embedding, output layer and position table stay 16-bit in FP8 runs
    first_unquantized = counts.embedding / tp + counts.position_embedding \
        + np.where(single, counts.output / tp, 0.0)
    last_unquantized = out_params / tp + embedding_copy
    w_first, g_first, o_first = model_state_bytes(first_dense, first_expert, zero_held, shard_dense, shard_expert,
                                                  training, fp8, first_unquantized)
    w_last, g_last, o_last = model_state_bytes(last_dense, last_expert, zero_held, shard_dense, shard_expert,
                                               training, fp8, last_unquantized)
    stages = stage_activation_bytes(model, training, tokens, tp, rc, full_frac, q, q_dense, q_moe, first_layers,
                                    last_layers, pp, v, m, fp8_gemm_inputs=fp8)
    act_first, act_last, act_mid = stages.first_bytes, stages.last_bytes, stages.middle_bytes
    has_mid = pp >= 3
    held_mid = np.where(has_mid, stages.middle_layers / q, 0.0)  # a shortened middle stage holds one layer less
    w_mid, g_mid, o_mid = model_state_bytes(mid_dense * held_mid, mid_expert * held_mid, zero_held, shard_dense,
                                            shard_expert, training, fp8, 0.0)

    # ---- buffers: fixed reserve, ZeRO-3 prefetch of two layers, p2p and TP staging
    layer_params_gpu = attn_gpu + counts.dense_mlp_per_layer / tp
    buffers = _RESERVED_BYTES + np.where(zero_held >= 3, 2.0 * 2.0 * layer_params_gpu, 0.0) \
        + 2.0 * tokens * h * 2.0 + 2.0 * p2p_bytes

    total_first = w_first + g_first + o_first + act_first + buffers
    total_last = w_last + g_last + o_last + act_last + buffers
    total_mid = w_mid + g_mid + o_mid + act_mid + buffers
    worst_last = (~single) & (total_last > total_first)
    worst_mid = has_mid & (total_mid > np.maximum(total_first, total_last))
    worst_last = worst_last & ~worst_mid

    def at_worst(first_value, last_value, mid_value):
        return np.select([worst_mid, worst_last], [mid_value, last_value], default=first_value)

    # ---- data-parallel gradient reduction (and ZeRO gathers), overlapped with backward
    # (the stage with the most parameters finishes its reduction last)
    mid_held_dense = np.where(has_mid, mid_dense, 0.0)
    mid_held_expert = np.where(has_mid, mid_expert, 0.0)
    stage_params_gpu = np.maximum(np.maximum(first_dense + first_expert, last_dense + last_expert),
                                  mid_held_dense + mid_held_expert)
    dense_params_gpu = np.maximum(np.maximum(first_dense, last_dense), mid_held_dense)
    expert_params_gpu = np.maximum(np.maximum(first_expert, last_expert), mid_held_expert)
    pp_in_node = np.minimum(pp, np.maximum(1.0, np.floor(gpn / (tp * cp * ep))))
    local_dense = np.clip(np.floor(gpn / (tp * pp_in_node)), 1.0, shard_dense)
    local_dense = np.where(shard_dense % local_dense == 0, local_dense, 1.0)
    groups_dense = shard_dense / local_dense
    local_exp = np.clip(np.floor(gpn / (tp * cp * ep * pp)), 1.0, shard_expert)
    local_exp = np.where(shard_expert % local_exp == 0, local_exp, 1.0)
    groups_exp = shard_expert / local_exp

    def dp_allreduce(n_bytes_dense, n_bytes_expert, calls_dense, calls_expert, algorithms=("ring", "tree")):
        return _hier_allreduce_time(n_bytes_dense, local_dense, groups_dense, intra, inter, calls_dense,
                                    algorithms) + \
            _hier_allreduce_time(n_bytes_expert, local_exp, groups_exp, intra, inter, calls_expert, algorithms)

    # gradients travel in buckets of 40M parameters (Megatron-Core DDP default bucket size);
    # ZeRO-3 gathers one layer at a time
    buckets_dense = np.maximum(np.ceil(dense_params_gpu / 40e6), 1.0)
    buckets_expert = np.maximum(np.ceil(expert_params_gpu / 40e6), 1.0)
    per_layer = np.maximum(q, 1.0)
    ar_grads = dp_allreduce(gb * dense_params_gpu, gb * expert_params_gpu, buckets_dense, buckets_expert)
    ring = ("ring",)
    # reduce-scatter and all-gather are each half a ring all-reduce (Rabenseifner)
    rs_grads = 0.5 * dp_allreduce(gb * dense_params_gpu, gb * expert_params_gpu, buckets_dense, buckets_expert,
                                  ring)
    # weights are gathered in 16 bits, or in FP8 where they are kept in FP8 (fp8_params)
    gathered = 1.0 if fp8 and training.fp8_params else 2.0
    ag_params = 0.5 * np.where(
        zero >= 3,
        dp_allreduce(gathered * dense_params_gpu, gathered * expert_params_gpu, per_layer, per_layer, ring),
        dp_allreduce(gathered * dense_params_gpu, gathered * expert_params_gpu, buckets_dense, buckets_expert, ring))

    # the last micro-batch's backward on a stage is the window the gradient reduction can hide in
    bwd_window = (comp_stage + tp_stage + ep_stage + cp_stage) * (2.0 / 3.0)
    fwd_window = bwd_window / 2.0
    tail = 1.0 / np.maximum(q, 1.0)  # the first layer's gradients are ready only at the very end
    overlap = training.overlap_grad_reduce

    def exposed(t_comm, window):
        return overlapped_time_s(t_comm, window, t_comm * tail) if overlap else t_comm

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

    def reduce_exposed(t_comm, window):
        # the last chunk's reduction is launched after its backward, with nothing left to hide it
        return np.where(interleaved, chunked_collective_time_s(t_comm, t_comm / v, v, chunk_gap_bwd),
                        exposed(t_comm, window))

    def gather_exposed(t_comm, window):
        share = t_comm / v
        first = exposed_part_s(share, window / v, share * np.minimum(tail * v, 1.0))
        return np.where(interleaved, chunked_collective_time_s(t_comm, first, v, chunk_gap_fwd),
                        exposed(t_comm, window))

    # deferred ZeRO-2/3 under a pipeline: one weight gather ahead of the first forward, one
    # reduce-scatter issued after the stage's last backward, with no compute left to hide it
    dp_exposed = np.select(
        [deferred, zero == 0, zero == 1, zero == 2],
        [
            exposed(ag_params, fwd_window) + rs_grads,
            reduce_exposed(ar_grads, bwd_window),
            reduce_exposed(rs_grads, bwd_window) + gather_exposed(ag_params, fwd_window),
            m * exposed(rs_grads, bwd_window) + exposed(ag_params, fwd_window),
        ],
        default=m * (exposed(ag_params, fwd_window) + exposed(ag_params + rs_grads, bwd_window)),
    )
    dp_exposed = np.where(shard_dense * np.maximum(shard_expert, 1) > 1, dp_exposed, 0.0)

    # tied input/output embeddings (GPT; SC21 eq. 2 counts V h once): with pp > 1 the
    # last stage keeps a copy of the word embedding for the output layer and, after the
    # pipeline flush, the first and last stages all-reduce its gradient (Megatron-LM
    # ``_allreduce_word_embedding_grads`` in ``finalize_model_grads``), on the critical path;
    # multi-token prediction keeps such a copy for the next tokens' embeddings
    tied_bytes = gb * vocab * h / tp if model.tie_embeddings or model.mtp_layers else 0.0
    first_last_inter = stage_ranks * pp > gpn
    two = np.full_like(tp, 2.0)
    tied_ar = np.where(first_last_inter,
                       _collective_time(lambda n, p: allreduce_time_s(n, p, inter), tied_bytes * np.ones_like(tp), two),
                       _collective_time(lambda n, p: allreduce_time_s(n, p, intra), tied_bytes * np.ones_like(tp), two))
    tied_ar = np.where(single, 0.0, tied_ar)
    dp_exposed = dp_exposed + tied_ar

    shard_for_opt = np.where(zero >= 1, dense_params_gpu / shard_dense + expert_params_gpu / shard_expert,
                             stage_params_gpu)
    optimizer_time = shard_for_opt * _ADAM_BYTES_PER_PARAM / hbm_eff

    step = pipeline_time + dp_exposed + optimizer_time
    n_gpus = dp * tp * pp * cp
    mflops = model_flops_per_step(model, batch)
    mflops_causal = model_flops_per_step(model, batch, causal=True)
    hflops = hardware_flops_per_step(model, batch, rc, full_frac, flash_attention=training.flash_attention)

    return {
        "step_time_s": step,
        "tokens_per_s": batch * s / step,
        "mfu": mflops / (n_gpus * peak_bf16 * step),
        "mfu_causal": mflops_causal / (n_gpus * peak_bf16 * step),
        "hfu": hflops / (n_gpus * peak_bf16 * step),
        "model_flops_per_step": np.full_like(step, mflops),
        "hardware_flops_per_step": hflops * np.ones_like(step),
        "bubble_fraction": np.where(single, 0.0, (pp - 1.0) / (v * m)),
        "compute_s": comp_stage * m,
        "tp_comm_s": tp_stage * m,
        "cp_comm_s": cp_stage * m,
        "ep_comm_s": ep_stage * m,
        "pp_comm_s": p2p_per_mb * m,
        "bubble_s": bubble,
        "pipeline_s": pipeline_time,
        "dp_comm_exposed_s": dp_exposed,
        "dp_comm_total_s": np.select([deferred, zero == 0, zero == 1, zero == 2],
                                     [rs_grads + ag_params, ar_grads, rs_grads + ag_params,
                                      m * rs_grads + ag_params],
                                     default=m * (2.0 * ag_params + rs_grads)) + tied_ar,
        "optimizer_s": optimizer_time,
        "parameters_bytes": at_worst(w_first, w_last, w_mid),
        "gradients_bytes": at_worst(g_first, g_last, g_mid),
        "optimizer_state_bytes": at_worst(o_first, o_last, o_mid),
        "activations_bytes": at_worst(act_first, act_last, act_mid),
        "buffers_bytes": buffers,
        "fullest_stage": np.select([worst_mid, worst_last], [stages.middle_rank, pp - 1.0], default=0.0),
        "memory_bytes": at_worst(total_first, total_last, total_mid),
        "num_micro_batches": m,
        "layers_per_stage": q,
        "first_stage_layers": first_layers,
        "last_stage_layers": last_layers,
        "stage_time_s": stage_time,
    }
