"""What a transformer computes and holds: parameter counts and FLOPs per training step.

Model FLOPs follow Narayanan et al., "Efficient Large-Scale Language Model Training on
GPU Clusters Using Megatron-LM", SC21, eq. (3):
``F = 72 B s l h^2 (1 + s/(6h) + V/(12 l h))`` (``96`` and ``V/(16lh)`` with full
recomputation), generalised term by term to GQA, multi-head latent attention, any FFN
width, gated (SwiGLU) MLPs, MoE layers and multi-token prediction. Attention is counted
over the full ``s x s`` score matrix as the paper does, so MFU is comparable with
published figures; :func:`hardware_flops_per_step` adds what recomputation repeats.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from partitioners.parallel3d.arrays import FloatArray, IntArray
from partitioners.parallel3d.specs import AttentionProjection, ModelSpec, kv_shard_count
from partitioners.parallel3d.stages import RECOMPUTE_FULL, RECOMPUTE_OP_SAC, RECOMPUTE_SELECTIVE

__all__ = [
    "ParameterCounts",
    "parameter_counts",
    "model_flops_per_step",
    "hardware_flops_per_step",
    "mla_up_projections",
]


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
    # the K and V weights of attention_per_layer, and the KV heads they hold: split at most
    # kv_heads ways (kv_shard_count)
    attention_kv_per_layer: float = 0.0
    kv_heads: int = 1

    def attention_per_gpu(self, tp: FloatArray | float) -> FloatArray:
        """Attention parameters of one layer on one tensor-parallel rank."""
        tp = np.asarray(tp, dtype=float)
        kv_replicated = self.attention_kv_per_layer * (1.0 / kv_shard_count(tp, self.kv_heads) - 1.0 / tp)
        return (
            (self.attention_per_layer - self.attention_replicated_per_layer) / tp
            + self.attention_replicated_per_layer
            + kv_replicated
        )


def parameter_counts(model: ModelSpec) -> ParameterCounts:
    """Count parameters of a GPT/Llama-style decoder (biases ignored, LayerNorm included)."""
    h = model.hidden_size
    mats = 3 if model.gated_mlp else 2
    latent_norms = (model.mla.q_lora_rank or 0) + model.mla.kv_lora_rank if model.mla is not None else 0
    attention = sum(p.in_width * p.out_width for p in model.attention_projections) + 2 * h + latent_norms
    attention_replicated = (
        sum(p.in_width * p.out_width for p in model.attention_projections if p.split == "replicated") + latent_norms
    )
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
    mtp_mlp, mtp_active_mlp = (
        (experts + shared, active_moe + router) if model.mtp_layer_is_moe else (dense_mlp, dense_mlp)
    )
    total = (
        model.num_layers * attention
        + n_dense * dense_mlp
        + n_moe * (experts + shared)
        + embedding
        + output
        + h
        + position
        + model.mtp_layers * (attention + mtp_mlp + projection)
    )
    active = (
        model.num_layers * attention
        + n_dense * dense_mlp
        + n_moe * (active_moe + router)
        + embedding
        + output
        + position
        + model.mtp_layers * (attention + mtp_active_mlp + projection)
    )
    attention_kv = sum(p.in_width * p.kv_out_width for p in model.attention_projections)
    return ParameterCounts(
        attention,
        dense_mlp,
        experts,
        shared,
        embedding,
        output,
        total,
        active,
        position,
        attention_replicated,
        projection,
        attention_kv,
        model.kv_heads,
    )


def _forward_flops_per_token(model: ModelSpec) -> tuple[float, float, float]:
    """Forward FLOPs per token: (transformer layers, attention-score part of them, logits).

    Narayanan et al. SC21 count, per layer and token, ``24h^2`` for the four
    projections and the 4h MLP plus ``4sh`` for ``QK^T`` and attention over ``V``;
    here the projections use the actual query and KV widths (a head width apart from
    h / a, GQA) and FFN width, gated MLPs have three matrices, MoE layers count the
    top-k and shared experts plus the router, and sliding-window and chunked layers
    the scores inside their window or chunk. Multi-token-prediction modules add a
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
        moe_mlp = (
            2 * mats * h * moe.expert_ffn_hidden_size * (moe.experts_per_token + moe.shared_experts)
            + 2 * h * moe.num_experts
        )
    # local-attention layers score only their window or chunk (ModelSpec.attention_score_share)
    scores = model.num_layers * attn_scores * model.attention_score_share
    layers = model.num_layers * attn_linear + scores + (model.num_layers - n_moe) * dense_mlp + n_moe * moe_mlp
    # multi-token prediction: per module one more layer, its 2h -> h projection and logits
    mtp = model.mtp_layers
    layers += mtp * (attn_linear + attn_scores + (moe_mlp if model.mtp_layer_is_moe else dense_mlp) + 2 * 2 * h * h)
    return layers, scores + mtp * attn_scores, (1 + mtp) * 2 * h * model.vocab_size


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


def hardware_flops_per_step(
    model: ModelSpec,
    global_batch_sequences: int,
    recompute: IntArray | int,
    full_fraction: FloatArray | float = 1.0,
    flash_attention: bool = False,
    tp: FloatArray | float = 1.0,
) -> FloatArray:
    """FLOPs actually executed: model FLOPs plus recomputation and replicated KV heads.

    Full recomputation repeats every layer's forward (SC21's 96 = 4 x 24), or the
    ``full_fraction`` of the layers it covers; selective recomputation repeats only
    the attention-score part (Korthikanti et al. 2022, Sec. 5) -- unless
    ``flash_attention`` stores no scores to drop, when the norm and activation outputs
    it rebuilds instead are memory-bound passes, not FLOPs -- and, under MLA, the
    up-projections (:func:`mla_up_projections`). Where ``tp`` exceeds the KV heads
    every rank projects a whole KV head (:func:`~partitioners.parallel3d.specs.kv_shard_count`),
    so the tensor group runs those projections ``tp / kv_heads`` times, forward and
    backward, and again in a recomputed forward. Without ``flash_attention`` a
    sliding-window or chunked layer computes the whole score matrix and masks it, so
    the scores outside its window or chunk are executed too.
    """
    layers, scores, _ = _forward_flops_per_token(model)
    masked = (
        0.0
        if flash_attention
        else model.num_layers
        * 2
        * model.seq_length
        * (model.query_width + model.context_width)
        * (1.0 - model.attention_score_share)
    )
    layers, scores = layers + masked, scores + masked
    selective = (0.0 if flash_attention else scores) + (model.num_layers + model.mtp_layers) * 2 * sum(
        p.in_width * p.out_width for p in mla_up_projections(model)
    )
    tokens = global_batch_sequences * model.seq_length
    rc = np.asarray(recompute)
    full_fraction = np.asarray(full_fraction, dtype=float)
    # op-level SAC (torchtitan) repeats every other matmul of the forward: half the
    # layers' FLOPs outside the attention kernel, whose outputs it keeps
    op_sac = 0.5 * (layers - scores)
    extra = (
        np.where(
            rc == RECOMPUTE_FULL,
            layers * full_fraction,
            np.where(rc == RECOMPUTE_SELECTIVE, selective, np.where(rc == RECOMPUTE_OP_SAC, op_sac, 0.0)),
        )
        * tokens
    )
    tp = np.asarray(tp, dtype=float)
    copies = tp / kv_shard_count(tp, model.kv_heads) - 1.0  # beyond the one the model FLOPs count
    kv_forward = (
        (model.num_layers + model.mtp_layers)
        * 2
        * sum(p.in_width * p.kv_out_width for p in model.attention_projections)
    )
    replicated = copies * kv_forward * (3.0 + np.where(rc == RECOMPUTE_FULL, full_fraction, 0.0)) * tokens
    return model_flops_per_step(model, global_batch_sequences) + 3.0 * masked * tokens + extra + replicated
