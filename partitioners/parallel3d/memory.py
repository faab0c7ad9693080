"""Per-GPU memory of one training step, for many candidate layouts at once.

Published models this follows:

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
* What the caching allocator cannot hand out again: activations are counted with
  ``training.activation_fragmentation`` (default ``ACTIVATION_FRAGMENTATION``) on top,
  and a layout that would not fit at ``ACTIVATION_FRAGMENTATION_HIGH`` is "tight" (the
  planner says so).

The time of a step, and which stage's memory is the peak, are in
:mod:`partitioners.parallel3d.cost`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import overload

import numpy as np

from partitioners.parallel3d.arrays import FloatArray, IntArray
from partitioners.parallel3d.effective import effective_terms
from partitioners.parallel3d.specs import ACTIVATION_FRAGMENTATION, ModelSpec, TrainingSpec
from partitioners.parallel3d.stages import (
    RECOMPUTE_FULL,
    RECOMPUTE_OP_SAC,
    RECOMPUTE_SELECTIVE,
    microbatch_group_size,
    middle_stages_short,
)

__all__ = [
    "RESERVED_BYTES",
    "ACTIVATION_FRAGMENTATION",
    "ACTIVATION_FRAGMENTATION_HIGH",
    "fragmentation_that_fills",
    "bytes_at_high_fragmentation",
    "activation_bytes_per_layer",
    "zero_stage_held",
    "model_state_bytes",
    "StageActivations",
    "stage_activation_bytes",
]

# Fixed per-GPU reserve: CUDA context (~0.5 GiB), cuBLAS/NCCL workspaces and
# communication buffers, PyTorch caching-allocator fragmentation. PyTorch reports
# 1-3 GiB of such overhead on large-model runs (torch.cuda.memory_reserved vs allocated).
RESERVED_BYTES = 3.0 * 1024**3
# The high end of what GMLake measured (ACTIVATION_FRAGMENTATION, the low end, is the
# default counted; see parallel3d_specs): a layout that fits only below it is "tight".
ACTIVATION_FRAGMENTATION_HIGH = 0.30


def fragmentation_that_fills(
    total_bytes: float, activations_bytes: float, capacity_bytes: float, counted: float
) -> float:
    """Allocator fragmentation of activations at which a predicted footprint reaches capacity.

    ``total_bytes`` and ``activations_bytes`` are predictions made with ``counted``
    fragmentation (the request's ``training.activation_fragmentation``); a layout whose
    answer lies below ``ACTIVATION_FRAGMENTATION_HIGH`` fits only if the allocator
    wastes little.
    """
    raw_activations = activations_bytes / (1.0 + counted)
    if raw_activations <= 0.0:
        return float("inf") if total_bytes <= capacity_bytes else float("-inf")
    return (capacity_bytes - (total_bytes - activations_bytes)) / raw_activations - 1.0


@overload
def bytes_at_high_fragmentation(
    total_bytes: FloatArray, activations_bytes: FloatArray | float, counted: float
) -> FloatArray: ...
@overload
def bytes_at_high_fragmentation(total_bytes: float, activations_bytes: float, counted: float) -> float: ...
def bytes_at_high_fragmentation(
    total_bytes: FloatArray | float, activations_bytes: FloatArray | float, counted: float
) -> FloatArray | float:
    """A footprint predicted with ``counted`` fragmentation, recounted at ``ACTIVATION_FRAGMENTATION_HIGH``.

    A layout whose recount exceeds capacity fits only if the allocator wastes little
    ("tight memory"). Where ``counted`` is already above the high end (a user who
    measured a wasteful stack) the recount is below the prediction and nothing is tight.
    """
    return total_bytes + activations_bytes * (ACTIVATION_FRAGMENTATION_HIGH - counted) / (1.0 + counted)


def activation_bytes_per_layer(
    model: ModelSpec,
    training: TrainingSpec,
    tokens: FloatArray,
    tp: FloatArray,
    recompute: IntArray,
    moe_layer: bool = False,
    fp8_gemm_inputs: bool = False,
) -> FloatArray:
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
    RMSNorm/LayerNorms (rebuilt from their kept inputs), MLA's up-projections and the
    MLP's activation output (rebuilt from the kept up-projection output, in dense and
    MoE layers alike). That is DeepSeek-V3's "recompute all RMSNorm operations and MLA
    up-projections" and "cache the inputs of the SwiGLU operator and recompute its
    output" (DeepSeek-V3 Technical Report, Sec. 3.2.3 and 3.3.2); Megatron-Core's
    ``--recompute-modules layernorm mla_up_proj moe_act`` and, for dense MLPs,
    MindSpeed's ``--recompute-activation-function``; and what PyTorch's compiler does
    unasked (its min-cut partitioner recomputes pointwise operators in the backward
    pass rather than saving their outputs). Llama 3 405B trained at tp 8, pp 16, 8K
    sequences "without activation checkpointing" (Llama 3 Herd of Models, Sec.
    3.3.2): with every output above kept, 31.75 bytes per token per layer / t, its first
    pipeline stage would need ~99 GiB of an H100's 80 GB; with these rebuilt, 21.25,
    it fits.

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
    # the norms' inputs: the layer input and, in a sequential block, the attention block's
    # output plus the residual (a parallel block's MLP norm reads the layer input again)
    norm_inputs = (1.0 if model.parallel_attention_mlp else 2.0) * 2.0 * h
    # MLA: each down-projected latent is kept before its RMSNorm (2 bytes) and after it,
    # as the input of its up-projection
    replicated = norm_inputs + 2.0 * gemm_in * h + masks + (2.0 + gemm_in) * model.latent_width
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
        activation_out = gemm_in * model.ffn
        mlp = 2.0 * model.ffn * up + activation_out
    if training.flash_attention:
        replicated_selective = replicated - 2.0 * gemm_in * h - gemm_in * model.latent_width
        scores_selective = scores_selective - activation_out
    # K and V are kept for the KV heads a rank holds: past the KV head count they are
    # replicated, not split (ModelSpec.kv_shards)
    kv_replicated = 2.0 * kv_width * (1.0 / model.kv_shards(tp) - 1.0 / tp)
    kept_all = (
        np.where(recompute == RECOMPUTE_SELECTIVE, replicated_selective, replicated) / rep_div
        + (attn + mlp + np.where(recompute == RECOMPUTE_SELECTIVE, scores_selective, scores_none)) / tp
        + kv_replicated
    )
    # torchtitan's per-op selective checkpointing keeps the block input, the attention
    # kernel's outputs (output and fp32 log-sum-exp) and every other matmul output
    # (_op_sac_save_list with its "save every other mm" rule): half the matmul outputs'
    # 2 bytes, so one byte per element of them; everything element-wise is recomputed
    if moe_layer and model.moe is not None:
        moe = model.moe
        mlp_mm_out = (moe.experts_per_token + moe.shared_experts) * (up * moe.expert_ffn_hidden_size + h)
    else:
        mlp_mm_out = up * model.ffn + h
    attn_mm_out = q_width + kv_width + h + model.latent_width
    op_sac = 2.0 * h / rep_div + (2.0 * ctx + 4.0 * a + attn_mm_out + mlp_mm_out) / tp
    per_token = np.where(
        recompute == RECOMPUTE_FULL,
        2.0 * h / rep_div,
        np.where(recompute == RECOMPUTE_OP_SAC, np.minimum(op_sac, kept_all), kept_all),
    )
    return per_token * tokens


def zero_stage_held(zero: FloatArray | IntArray | int, pp: FloatArray | int) -> FloatArray:
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


def model_state_bytes(
    dense_params: FloatArray,
    expert_params: FloatArray,
    zero: FloatArray,
    shard_dense: FloatArray,
    shard_expert: FloatArray,
    training: TrainingSpec,
    fp8_linears: bool,
    unquantized_params: FloatArray | float = 0.0,
) -> tuple[FloatArray, FloatArray, FloatArray]:
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
    weights = np.where(
        zero >= 3,
        linear_bytes * sharded + (2.0 - linear_bytes) * unquantized_params / shard_dense,
        linear_bytes * whole + (2.0 - linear_bytes) * unquantized_params,
    )
    grads = np.where(zero >= 2, grad_bytes * sharded, grad_bytes * whole)
    terms = effective_terms(training)
    grads = grads + terms.whole_gradient_copy_bytes * whole
    # the optimizer's fp32 gradient copy lives with the master weights it feeds
    copy = terms.fp32_gradient_copy_bytes
    grads = grads + np.where(zero >= 1, copy * sharded, copy * whole)
    optimizer_state = np.where(zero >= 1, 12.0 * sharded, 12.0 * whole)
    return weights, grads, optimizer_state


@dataclass(frozen=True)
class StageActivations:
    """Peak activation bytes per GPU on the first, the last and the fullest middle
    pipeline stage (zero without one), with allocator fragmentation; how many layers that
    middle stage holds and its pipeline rank."""

    first_bytes: FloatArray
    last_bytes: FloatArray
    middle_bytes: FloatArray
    middle_layers: FloatArray
    middle_rank: FloatArray


def stage_activation_bytes(
    model: ModelSpec,
    training: TrainingSpec,
    tokens: FloatArray,
    tp: FloatArray,
    recompute: IntArray,
    full_fraction: FloatArray,
    layers_per_stage: FloatArray,
    moe_layers: FloatArray,
    first_layers: FloatArray,
    last_layers: FloatArray,
    pp: FloatArray,
    v: FloatArray,
    m: FloatArray,
    fp8_gemm_inputs: bool = False,
    first_moe_layers: FloatArray | None = None,
    last_moe_layers: FloatArray | None = None,
) -> StageActivations:
    """Peak activation bytes on the first, the last and the fullest middle pipeline stage.

    Stage ``r`` holds min(m, p - r) micro-batches in flight under 1F1B and
    2(p - r - 1) + (v-1)N + 1 model chunks under the interleaved schedule, N the
    micro-batch group (p, or more where m is not a multiple of p:
    :func:`~partitioners.parallel3d.stages.microbatch_group_size`) (Narayanan et al., SC21,
    Sec. 2.2; Megatron-LM's warm-up counts): the first the most, the last one, or
    (v-1)N + 1 chunks when interleaved, plus the fp32 logits. A middle stage
    holds ``layers_per_stage`` layers of which ``moe_layers`` are MoE and the others
    dense; ``first_layers`` and ``last_layers`` are what the end stages keep. A
    middle stage keeps fewer micro-batches in flight than the first but, when the ends
    shed layers, more layers, and can be the fullest (Llama 3 405B: 8 layers x 15
    micro-batches on the second of 16 stages against 7 x 16 on the first). Layers the
    ends do not shed are taken from the middle stages nearest the first, which keep the
    most in flight.
    ``first_moe_layers`` and ``last_moe_layers`` say how many of the end stages' layers
    are MoE (DeepSeek-V3's first stage holds its dense layers); left out, the ends hold
    the middle stage's mix.
    Per-layer bytes are Korthikanti et al.'s (activation_bytes_per_layer); under a
    partial full recomputation the ``1 - full_fraction`` of layers it leaves out keep
    all of theirs. The layer being recomputed is whole again during its backward, so each
    stage also holds one layer's rebuilt bytes. Activations are counted with
    ``training.activation_fragmentation`` of allocator waste on top.
    """
    h, vocab = model.hidden_size, model.vocab_size
    has_moe = model.num_moe_layers > 0
    single = pp == 1
    q, q_moe = layers_per_stage, moe_layers
    dense_act = activation_bytes_per_layer(
        model, training, tokens, tp, recompute, moe_layer=False, fp8_gemm_inputs=fp8_gemm_inputs
    )
    moe_act = (
        activation_bytes_per_layer(
            model, training, tokens, tp, recompute, moe_layer=True, fp8_gemm_inputs=fp8_gemm_inputs
        )
        if has_moe
        else 0.0
    )
    # layers left out of a partial full recomputation keep everything
    no_recompute = np.zeros_like(recompute)
    kept_dense = activation_bytes_per_layer(
        model, training, tokens, tp, no_recompute, moe_layer=False, fp8_gemm_inputs=fp8_gemm_inputs
    )
    kept_moe = (
        activation_bytes_per_layer(
            model, training, tokens, tp, no_recompute, moe_layer=True, fp8_gemm_inputs=fp8_gemm_inputs
        )
        if has_moe
        else 0.0
    )

    def per_layer(moe_share: FloatArray) -> FloatArray:
        """Average bytes of a layer on a stage whose layers are ``moe_share`` MoE."""
        held = (1.0 - moe_share) * dense_act + moe_share * moe_act
        kept = (1.0 - moe_share) * kept_dense + moe_share * kept_moe
        return np.where(recompute == RECOMPUTE_FULL, full_fraction * held + (1.0 - full_fraction) * kept, held)

    layer_act_avg = per_layer(q_moe / q)
    first_act_avg = layer_act_avg if first_moe_layers is None else per_layer(first_moe_layers / first_layers)
    last_act_avg = layer_act_avg if last_moe_layers is None else per_layer(last_moe_layers / last_layers)

    # micro-batches per group of the interleaved schedule (pp, or more when m is not a multiple)
    group = np.where(
        v > 1,
        np.maximum(
            microbatch_group_size(
                np.asarray(m, dtype=np.int64), np.asarray(pp, dtype=np.int64), training.flexible_microbatch_groups
            ),
            pp,
        ),
        pp,
    )

    def chunks_in_flight(rank: FloatArray | float) -> FloatArray:
        return np.where(
            v == 1, np.minimum(m, pp - rank), np.minimum(m * v, 2.0 * (pp - rank - 1.0) + (v - 1.0) * group + 1.0)
        )

    chunks_first = chunks_in_flight(0.0)
    chunks_last = np.where(v == 1, 1.0, np.minimum(m * v, (v - 1.0) * group + 1.0))
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
    # recomputation rebuilds what it dropped one layer at a time during backward: all but the
    # checkpointed input under full recomputation (the recomputed forward reads that tensor,
    # not a copy), the attention core (and what else it recomputes) under selective, whose
    # s x s scores are then back for that layer; that layer's bytes come on top
    # (the larger of a dense and an MoE layer's, of the kinds the stage holds)
    rebuilt_dense = kept_dense - dense_act
    rebuilt_moe = kept_moe - moe_act

    def rebuilt(moe_count: FloatArray | None, layer_count: FloatArray) -> FloatArray:
        if not has_moe:
            return rebuilt_dense
        if moe_count is None:  # an end stage left to the middle stage's mix
            moe_count, layer_count = q_moe, q
        return np.where(
            moe_count >= layer_count,
            rebuilt_moe,
            np.where(moe_count <= 0, rebuilt_dense, np.maximum(rebuilt_dense, rebuilt_moe)),
        )

    # the embedding output's dropout mask
    embed_act = (
        chunks_first * tokens * h / np.where(training.sequence_parallel, tp, 1.0)
        if training.dropout
        else np.zeros_like(tokens)
    )
    act_first = layers_first * first_act_avg + rebuilt(first_moe_layers, first_layers) + embed_act
    act_mid = np.where(pp >= 3, layers_mid * layer_act_avg + rebuilt(q_moe, q), 0.0)
    if effective_terms(training).stage_outputs_kept:
        # each in-flight model chunk's output (the residual stream, 2 bytes per element)
        stage_output = tokens * h * 2.0 / np.where(training.sequence_parallel, tp, 1.0)
        act_first = act_first + np.where(single, 0.0, chunks_first * stage_output)
        act_mid = act_mid + np.where(pp >= 3, chunks_mid * stage_output, 0.0)
    logits_act = 4.0 * tokens * vocab / tp
    # multi-token prediction: per module its layer, its normed 2h input and another set
    # of logits, for the one micro-batch the last stage holds in its last model chunk
    mtp_act = model.mtp_layers * (
        (moe_act if model.mtp_layer_is_moe else dense_act)
        + logits_act
        + 2.0 * 2.0 * h * tokens / np.where(training.sequence_parallel, tp, 1.0)
    )
    act_last = layers_last * last_act_avg + rebuilt(last_moe_layers, last_layers) + logits_act + mtp_act
    act_first = np.where(single, act_first + logits_act + mtp_act, act_first)
    fragmented = 1.0 + training.activation_fragmentation
    return StageActivations(
        act_first * fragmented,
        act_last * fragmented,
        act_mid * fragmented,
        mid_layers,
        np.where(pp >= 3, mid_rank, 0.0),
    )
