"""FLOPs and parameter counts (partitioners.parallel3d.flops).

Expected values are worked by hand from the published formulas the docstrings
cite: Narayanan et al. SC21 (FLOPs, bubble), Korthikanti et al. 2022 (activation
memory), ZeRO (bytes per parameter per stage).
"""

from __future__ import annotations

import numpy as np
import pytest

from partitioners.errors import InvalidInput
from partitioners.parallel3d.flops import hardware_flops_per_step, model_flops_per_step, parameter_counts
from partitioners.parallel3d.memory import activation_bytes_per_layer
from partitioners.parallel3d.planner import (
    evaluate_layouts,
    plan_parallel_layout,
)
from partitioners.parallel3d.stages import (
    RECOMPUTE_FULL,
    RECOMPUTE_NONE,
    RECOMPUTE_SELECTIVE,
)
from tests.partitioners.parallel3d.shapes import (
    A100_NODE,
    GPT_SMALL,
    cluster_spec,
    layout_specs,
    model_spec,
    training_spec,
)

_LLAMA3_70B_8K = {
    "num_layers": 80,
    "hidden_size": 8192,
    "num_attention_heads": 64,
    "num_kv_heads": 8,
    "ffn_hidden_size": 28672,
    "gated_mlp": True,
    "seq_length": 8192,
    "vocab_size": 128256,
}


def test_model_flops_equal_narayanan_formula_for_gpt():
    # SC21 eq. (3) with 72 (no recomputation): 72 B s l h^2 (1 + s/(6h) + V/(12 l h))
    b, s, l, h, v = 3, 32, 2, 64, 100
    expected = 72 * b * s * l * h**2 * (1 + s / (6 * h) + v / (12 * l * h))
    assert model_flops_per_step(model_spec(GPT_SMALL), b) == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize(
    ("causal", "tokens_per_s_per_gpu", "published_tflops"),
    [
        # Megatron-Bridge performance summary, NeMo 25.11, DGX-H100 FP8-CS: 1602 tokens/s, 719 TFLOP/s
        (True, 1602, 719),
        # Megatron-LM examples/llama README (core_r0.12.0), H100 FP8: 1621 tokens/s, 780 TFLOP/s
        (False, 1621, 780),
    ],
)
def test_model_flops_of_either_attention_convention_reproduce_the_published_model_tflops(
    causal, tokens_per_s_per_gpu, published_tflops
):
    model = model_spec(_LLAMA3_70B_8K)
    per_token = model_flops_per_step(model, 1, causal=causal) / model.seq_length
    assert per_token * tokens_per_s_per_gpu / 1e12 == pytest.approx(published_tflops, rel=0.005)


def test_the_causal_count_halves_only_the_attention_score_flops():
    b, s, l, h = 3, 32, 2, 64
    model = model_spec(GPT_SMALL)
    full, causal = model_flops_per_step(model, b), model_flops_per_step(model, b, causal=True)
    assert full - causal == pytest.approx(0.5 * 3 * 4 * s * h * l * b * s)


def test_a_sliding_window_layer_scores_min_of_position_and_window_keys():
    # s = 8, w = 2: queries score 1, 2, 2, ... keys, 15 in all against a causal layer's 36
    model = model_spec({**GPT_SMALL, "seq_length": 8, "sliding_window": 2, "sliding_window_layers": [0]})
    assert model.attention_score_share == pytest.approx((1 + 15 / 36) / 2)
    assert model_spec({**GPT_SMALL, "sliding_window": 32}).attention_score_share == 1.0  # window >= sequence


def test_a_chunked_attention_layer_scores_its_queries_positions_inside_their_chunk():
    # s = 10, chunks of 4: 1+2+3+4 twice and 1+2, 23 keys against a causal layer's 55
    model = model_spec({**GPT_SMALL, "seq_length": 10, "attention_chunk_size": 4, "chunked_attention_layers": [1]})
    assert model.attention_score_share == pytest.approx((1 + 23 / 55) / 2)


def test_a_layer_cannot_be_both_sliding_window_and_chunked():
    with pytest.raises(InvalidInput) as info:
        model_spec({**GPT_SMALL, "sliding_window": 8, "attention_chunk_size": 8, "chunked_attention_layers": [1]})
    assert info.value.field == "model.chunked_attention_layers" and info.value.code == "attention-kinds-overlap"


def test_model_flops_count_only_the_scores_inside_a_sliding_window():
    b, s, h, w = 3, 32, 64, 8
    windowed = model_spec({**GPT_SMALL, "sliding_window": w, "sliding_window_layers": [1]})
    inside = (w * (w + 1) / 2 + (s - w) * w) / (s * (s + 1) / 2)
    saved = 3 * 4 * s * h * (1 - inside) * b * s  # one layer's QK^T and attention x V, forward and backward
    assert model_flops_per_step(model_spec(GPT_SMALL), b) - model_flops_per_step(windowed, b) == pytest.approx(saved)


def test_without_flash_attention_a_sliding_window_is_masked_and_executes_every_score():
    full, windowed = model_spec(GPT_SMALL), model_spec({**GPT_SMALL, "sliding_window": 8})
    for recompute in (RECOMPUTE_NONE, RECOMPUTE_SELECTIVE):
        assert float(hardware_flops_per_step(windowed, 3, recompute)) == pytest.approx(
            float(hardware_flops_per_step(full, 3, recompute))
        )
    assert float(hardware_flops_per_step(windowed, 3, RECOMPUTE_NONE, flash_attention=True)) < float(
        hardware_flops_per_step(full, 3, RECOMPUTE_NONE, flash_attention=True)
    )


def test_sliding_window_layers_need_a_window_and_must_exist():
    with pytest.raises(InvalidInput) as info:
        model_spec({**GPT_SMALL, "sliding_window_layers": [0]})
    assert info.value.field == "model.sliding_window"
    with pytest.raises(InvalidInput) as info:
        model_spec({**GPT_SMALL, "sliding_window": 8, "sliding_window_layers": [2]})
    assert info.value.field == "model.sliding_window_layers" and info.value.code == "layer-out-of-range"


def test_full_recomputation_flops_equal_narayanan_96_formula():
    # SC21 eq. (3) as printed: 96 B s l h^2 (1 + s/(6h) + V/(16 l h)) -- logits are not recomputed
    b, s, l, h, v = 3, 32, 2, 64, 100
    expected = 96 * b * s * l * h**2 * (1 + s / (6 * h) + v / (16 * l * h))
    got = hardware_flops_per_step(model_spec(GPT_SMALL), b, RECOMPUTE_FULL)
    assert float(got) == pytest.approx(expected, rel=1e-12)


def test_selective_recomputation_adds_only_attention_score_flops():
    # one extra forward of QK^T and attention x V: 4 s h FLOPs per token per layer
    b, s, l, h = 3, 32, 2, 64
    model = model_spec(GPT_SMALL)
    extra = float(hardware_flops_per_step(model, b, RECOMPUTE_SELECTIVE)) - model_flops_per_step(model, b)
    assert extra == pytest.approx(4 * s * h * l * b * s)


def test_hardware_flops_count_the_kv_projections_each_tensor_rank_repeats():
    # multi-query attention at tp 4: four ranks each project the one K and V head (2 x 16
    # wide from h = 64), three more times than the model FLOPs count, forward and backward
    # (6 FLOPs per weight and token) and once more in a fully recomputed forward
    b, s, l, h = 3, 32, 2, 64
    model = model_spec({**GPT_SMALL, "num_kv_heads": 1})
    replicated = 3 * 2 * h * (2 * h // 4) * l * b * s
    for recompute, passes in ((RECOMPUTE_NONE, 3), (RECOMPUTE_FULL, 4)):
        at_tp4 = float(hardware_flops_per_step(model, b, recompute, flash_attention=True, tp=4))
        at_tp1 = float(hardware_flops_per_step(model, b, recompute, flash_attention=True, tp=1))
        assert at_tp4 - at_tp1 == pytest.approx(passes * replicated)


def test_gpt_parameter_count_is_12lh2_plus_layernorms_and_embeddings():
    # per layer 4h^2 (QKV + projection) + 8h^2 (4h MLP) + 2h (two LayerNorm gains);
    # untied input and output embeddings V h each; final LayerNorm h
    l, h, v = 2, 64, 100
    counts = parameter_counts(model_spec(GPT_SMALL))
    assert counts.total == l * (12 * h * h + 2 * h) + 2 * v * h + h


def test_gqa_and_swiglu_change_attention_and_mlp_parameter_counts():
    model = model_spec({**GPT_SMALL, "num_kv_heads": 1, "ffn_hidden_size": 96, "gated_mlp": True})
    counts = parameter_counts(model)
    h, hk, f = 64, 16, 96  # one KV head of head_dim 16
    assert counts.attention_per_layer == h * (h + 2 * hk) + h * h + 2 * h
    assert counts.dense_mlp_per_layer == 3 * h * f


def test_kv_weights_past_the_kv_head_count_are_replicated_not_cut():
    counts = parameter_counts(model_spec({**GPT_SMALL, "num_kv_heads": 1}))
    h, hk = 64, 16
    # at tp 4 the query, output projection and norm gains split four ways; every rank
    # keeps the single KV head's K and V columns whole
    assert counts.attention_per_gpu(4) == pytest.approx((2 * h * h + 2 * h) / 4 + h * 2 * hk)
    assert counts.attention_per_gpu(1) == pytest.approx(counts.attention_per_layer)


def test_multi_query_attention_at_tp_equal_to_the_heads_costs_a_rank_what_multi_head_does():
    # one KV head replicated on 4 ranks, or 4 KV heads one per rank: each rank projects,
    # keeps and attends over one KV head either way (StarCoder's multi-query attention
    # trained at tp 4)
    mqa, mha = {**GPT_SMALL, "num_kv_heads": 1}, GPT_SMALL
    (pred_mqa,) = evaluate_layouts(
        model_spec(mqa),
        cluster_spec(A100_NODE),
        training_spec({"global_batch_sequences": 8}),
        layout_specs([{"tp": 4, "pp": 1}]),
    )
    (pred_mha,) = evaluate_layouts(
        model_spec(mha),
        cluster_spec(A100_NODE),
        training_spec({"global_batch_sequences": 8}),
        layout_specs([{"tp": 4, "pp": 1}]),
    )
    assert pred_mqa.fits and not pred_mqa.reasons
    assert pred_mqa.step_time_s == pytest.approx(pred_mha.step_time_s, rel=1e-9)
    assert pred_mqa.memory.total_bytes == pytest.approx(pred_mha.memory.total_bytes, rel=1e-9)


def test_kv_heads_that_neither_divide_tp_nor_are_divided_by_it_are_rejected_with_reason():
    model = {**GPT_SMALL, "hidden_size": 96, "num_attention_heads": 12, "num_kv_heads": 3}
    (pred,) = evaluate_layouts(
        model_spec(model),
        cluster_spec(A100_NODE),
        training_spec({"global_batch_sequences": 8}),
        layout_specs([{"tp": 4}]),
    )
    assert not pred.fits
    assert any("3 KV heads are neither divisible by tp=4 nor divide it" in r for r in pred.reasons)


def test_a_head_width_apart_from_hidden_over_heads_counts_qwen3_32b_as_published():
    # Qwen3-32B (model card: 32.8B parameters, 31.2B without embeddings): 64 layers,
    # hidden 5120, 64 query heads and 8 KV heads of width 128, SwiGLU FFN 25,600
    qwen3 = model_spec(
        {
            "num_layers": 64,
            "hidden_size": 5120,
            "num_attention_heads": 64,
            "num_kv_heads": 8,
            "head_dim": 128,
            "ffn_hidden_size": 25600,
            "gated_mlp": True,
            "vocab_size": 151936,
            "seq_length": 4096,
        }
    )
    counts = parameter_counts(qwen3)
    assert counts.total == pytest.approx(32.8e9, rel=0.01)
    assert counts.total - counts.embedding - counts.output == pytest.approx(31.2e9, rel=0.01)


def test_a_wider_query_raises_attention_flops_and_activations_but_not_the_mlp():
    narrow = model_spec(GPT_SMALL)  # 4 heads of width 16
    wide = model_spec({**GPT_SMALL, "head_dim": 32})
    h, hq, s, l, b = 64, 128, GPT_SMALL["seq_length"], GPT_SMALL["num_layers"], 8
    # per layer and token: QKV and projection 2h(3hq) + 2hq h against 8h^2, scores 4s hq against 4sh
    extra_per_token = l * (2 * h * 3 * hq + 2 * hq * h - 8 * h * h + 4 * s * (hq - h))
    assert model_flops_per_step(wide, b) - model_flops_per_step(narrow, b) == pytest.approx(3 * extra_per_token * b * s)

    def selective_extra(model):
        return float(hardware_flops_per_step(model, b, RECOMPUTE_SELECTIVE)) - model_flops_per_step(model, b)

    assert selective_extra(wide) == pytest.approx(2 * selective_extra(narrow))
    # flash attention keeps Q, K, V and the output: 2hq + 2·2hk + 2hq bytes a token, with
    # hk = hq here (multi-head attention), i.e. 8 bytes for every unit of width added
    training = training_spec({"global_batch_sequences": 8})
    tokens, tp, none = np.array([s * 1.0]), np.array([1.0]), np.array([RECOMPUTE_NONE])
    added = activation_bytes_per_layer(wide, training, tokens, tp, none) - activation_bytes_per_layer(
        narrow, training, tokens, tp, none
    )
    assert added[0] == pytest.approx(8 * (hq - h) * s)


def test_a_stated_head_width_equal_to_hidden_over_heads_changes_nothing():
    plain = plan_parallel_layout(
        model_spec(GPT_SMALL),
        cluster_spec({"preset": "dgx-a100", "nodes": 1}),
        training_spec({"global_batch_sequences": 16}),
        None,
        with_rank_map=False,
    )
    stated = plan_parallel_layout(
        model_spec({**GPT_SMALL, "head_dim": 16}),
        cluster_spec({"preset": "dgx-a100", "nodes": 1}),
        training_spec({"global_batch_sequences": 16}),
        None,
        with_rank_map=False,
    )
    assert [c.step_time_s for c in stated.candidates] == [c.step_time_s for c in plain.candidates]


def test_a_stated_head_width_lifts_the_hidden_over_heads_divisibility_rule():
    with pytest.raises(InvalidInput, match="not a multiple of num_attention_heads"):
        model_spec({**GPT_SMALL, "num_attention_heads": 3})
    assert model_spec({**GPT_SMALL, "num_attention_heads": 3, "head_dim": 16}).query_width == 48


def test_moe_flops_count_topk_and_shared_experts_not_all_experts():
    dense = model_spec({**GPT_SMALL, "ffn_hidden_size": 32})
    moe = model_spec(
        {
            **GPT_SMALL,
            "moe": {"num_experts": 8, "experts_per_token": 2, "expert_ffn_hidden_size": 16, "shared_experts": 0},
        }
    )
    # 2 experts of width 16 do the MLP work of one dense MLP of width 32; the router adds 2 h E per token
    h, experts, tokens, layers = 64, 8, 32, 2
    router = 3 * 2 * h * experts * tokens * layers
    assert model_flops_per_step(moe, 1) - model_flops_per_step(dense, 1) == pytest.approx(router)


def test_flash_attention_kernels_run_a_sliding_window_model_s_share_of_the_causal_work():
    # FlashAttention-1 runs at half FlashAttention-2's speed on A100, so the two steps'
    # compute differs by the attention kernels' time at FlashAttention-2's
    def attention_s(model):
        layout = [{"tp": 1, "pp": 1, "micro_batch_size": 1, "recompute": "none"}]
        fa1, fa2 = (
            evaluate_layouts(
                model_spec(model),
                cluster_spec(A100_NODE),
                training_spec({"global_batch_sequences": 64, "flash_attention_version": v}),
                layout_specs(layout),
            )[0].time_breakdown_s["compute_s"]
            for v in (1, 2)
        )
        return fa1 - fa2

    full = {**GPT_SMALL, "num_layers": 4, "hidden_size": 1024, "num_attention_heads": 8, "seq_length": 16384}
    windowed = {**full, "sliding_window": 1024, "sliding_window_layers": [0, 1, 2]}  # Gemma-like, 3 local : 1 global
    assert attention_s(windowed) / attention_s(full) == pytest.approx(model_spec(windowed).attention_score_share)
    assert model_spec(windowed).attention_score_share < 0.35


def test_mistral_7b_s_window_speeds_its_attention_about_twofold_at_16k_tokens():
    # Jiang et al., "Mistral 7B", 2023, Sec. 2: "for a sequence length of 16K and W = 4096,
    # changes made to FlashAttention and xFormers yield a 2x speed improvement over a
    # vanilla attention baseline"
    model = {
        "num_layers": 32,
        "hidden_size": 4096,
        "num_attention_heads": 32,
        "num_kv_heads": 8,
        "ffn_hidden_size": 14336,
        "gated_mlp": True,
        "vocab_size": 32000,
        "seq_length": 16384,
    }
    windowed = model_spec({**model, "sliding_window": 4096})
    assert 1.0 / windowed.attention_score_share == pytest.approx(2.0, rel=0.15)
