"""Kernel times: GEMMs, flash attention, FP8 casts, embeddings (partitioners.parallel3d.kernels).

Expected values are worked by hand from the published formulas the docstrings
cite: Narayanan et al. SC21 (FLOPs, bubble), Korthikanti et al. 2022 (activation
memory), ZeRO (bytes per parameter per stage).
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from partitioners.parallel3d.cost import predict_layouts
from partitioners.parallel3d.kernels import (
    _flash_rate,
    embedding_time_s,
    flash_attention_slowdown,
    fp8_quantize_time_s,
    gemm_backward_time_s,
    gemm_time_s,
    layer_kernel_gaps_s,
)
from partitioners.parallel3d.planner import evaluate_layouts
from partitioners.parallel3d.specs import (
    flash_attention_speed,
)
from tests.partitioners.parallel3d.layouts import layouts
from tests.partitioners.parallel3d.shapes import (
    A100_NODE,
    GPT_SMALL,
    cluster_spec,
    layout_specs,
    model_spec,
    training_spec,
)


def test_backward_gemms_use_their_own_shapes():
    # (128 x 8192) @ (8192 x 128) on 108 SMs: the forward has one 128x128 output tile (one SM
    # busy), dX (128 x 8192) and dW (8192 x 128) have 64 each; same FLOPs and saturation, so
    # the backward takes 2 x 1/64 of the forward time (all three compute-bound)
    args = (312e12, 0.92, 2.0e12, 108)
    fwd = float(gemm_time_s(np.float64(128), np.float64(128), np.float64(8192), *args))
    bwd = float(gemm_backward_time_s(np.float64(128), np.float64(128), np.float64(8192), *args))
    assert bwd == pytest.approx(fwd * 2 / 64)


def test_embedding_time_is_token_rows_plus_the_dense_vocabulary_gradient():
    # 32 tokens x 64 x 4 bytes forward, 12 bytes x (100/2) x 64 for the gradient, at 1e12 B/s
    expected = (32 * 64 * 4 + 12 * 50 * 64) / 1e12
    assert float(embedding_time_s(32, 64, 100, 2, 1e12)) == pytest.approx(expected, rel=1e-12)


def test_quantizing_to_fp8_costs_nothing_when_the_linears_run_in_16_bit():
    model = model_spec(GPT_SMALL)
    training = training_spec({"global_batch_sequences": 1})
    fwd, bwd = fp8_quantize_time_s(model, training, np.array([32.0]), np.array([1.0]), 1e12, fp8=False)
    assert float(fwd[False][0]) == 0.0 and float(bwd[False][0]) == 0.0


@pytest.mark.parametrize(
    ("scaling", "fwd_elements", "bwd_elements", "bytes_per_element"),
    [
        # h = 64, 4h MLP, tp = 2 with sequence parallelism. Forward: projection input h/t and
        # MLP activation 4h/t (LayerNorm writes FP8 itself under delayed scaling); backward:
        # QKV 3h/t, projection h/t, up-projection 4h/t and down-projection h/t gradients.
        ("delayed", 64 / 2 + 256 / 2, 3 * 64 / 2 + 64 / 2 + 256 / 2 + 64 / 2, 4),
        # current scaling: the two LayerNorm outputs (h/t each) are quantized too, and every
        # operand is read once more for its amax
        ("current", 2 * 64 / 2 + 64 / 2 + 256 / 2, 3 * 64 / 2 + 64 / 2 + 256 / 2 + 64 / 2, 6),
    ],
)
def test_fp8_operands_are_cast_with_their_transpose_once_per_micro_batch(
    scaling, fwd_elements, bwd_elements, bytes_per_element
):
    model = model_spec(GPT_SMALL)
    training = training_spec({"global_batch_sequences": 1, "precision": "fp8", "fp8_scaling": scaling})
    tokens, hbm = 32.0, 1e12
    fwd, bwd = fp8_quantize_time_s(model, training, np.array([tokens]), np.array([2.0]), hbm, fp8=True)
    assert float(fwd[False][0]) == pytest.approx(tokens * fwd_elements * bytes_per_element / hbm)
    assert float(bwd[False][0]) == pytest.approx(tokens * bwd_elements * bytes_per_element / hbm)


def test_small_per_gpu_matrices_run_further_below_peak_than_large_ones():
    cluster = cluster_spec(A100_NODE)
    training = training_spec({"global_batch_sequences": 8})
    mfu = {}
    for h in (256, 8192):
        # short sequences so the projections and MLP (not attention) dominate the FLOPs
        model = model_spec(
            {"num_layers": 4, "hidden_size": h, "num_attention_heads": h // 128, "seq_length": 256, "vocab_size": 1024}
        )
        mfu[h] = float(predict_layouts(model, cluster, training, layouts(dp=8))["mfu"][0])
    assert mfu[256] < 0.5 * mfu[8192]
    assert mfu[8192] < cluster.gemm_efficiency_max


def test_older_flash_attention_generations_run_at_their_published_speeds():
    a100, h100 = cluster_spec(A100_NODE), cluster_spec({"preset": "dgx-h100", "nodes": 1})

    def speed(cluster, version):
        return flash_attention_speed(
            cluster, training_spec({"global_batch_sequences": 8, "flash_attention_version": version})
        )

    # FlashAttention-2 is "around 2x" FlashAttention-1 on A100 (Dao 2023); on H100 it
    # reaches 35% of peak where FlashAttention-3 reaches 75% (Shah et al. 2024)
    assert (speed(a100, None), speed(a100, 2), speed(a100, 1)) == (1.0, 1.0, 0.5)
    assert speed(h100, 3) == 1.0
    assert speed(h100, 2) == pytest.approx(0.35 / 0.75)
    assert speed(h100, 1) == pytest.approx(0.5 * 0.35 / 0.75)


def test_an_older_flash_attention_costs_more_the_longer_the_sequence():
    slowdown = []
    for seq in (1024, 4096, 16384):
        model = {**GPT_SMALL, "num_layers": 4, "hidden_size": 1024, "num_attention_heads": 8, "seq_length": seq}
        layout = [{"tp": 1, "pp": 1, "cp": 1, "micro_batch_size": 1, "recompute": "none"}]
        times = [
            evaluate_layouts(
                model_spec(model),
                cluster_spec(A100_NODE),
                training_spec({"global_batch_sequences": 64, "flash_attention_version": v}),
                layout_specs(layout),
            )[0].step_time_s
            for v in (None, 1)
        ]
        slowdown.append(times[1] / times[0])
    assert 1.0 < slowdown[0] < slowdown[1] < slowdown[2]


def test_flash_attention_length_curve_is_the_one_measured_on_h100():
    # pytorch/benchmark#2391: unmasked forward, head dim 128, batch x sequence = 16K tokens;
    # FlashAttention-3 and the Triton FlashAttention-2 share the shape, TFLOP/s per length
    measured = {
        "fa3": [430.32, 517.099, 565.544, 590.233, 614.234, 620.73],
        "triton": [328.882, 389.723, 433.721, 458.359, 470.732, 476.753],
    }
    lengths = np.array([512.0, 1024, 2048, 4096, 8192, 16384])
    for tflops in measured.values():
        assert _flash_rate(lengths) == pytest.approx(np.array(tflops) / tflops[-1], rel=0.02)


def test_causal_flash_attention_runs_slower_per_flop_the_shorter_the_sequence():
    slowdown = [float(flash_attention_slowdown(seq, 1)) for seq in (512, 2048, 8192, 32768)]
    assert slowdown == sorted(slowdown, reverse=True)
    assert slowdown[0] > 2.0  # half-empty diagonal tiles and a 256-key average loop
    assert slowdown[-1] == pytest.approx(1.0, abs=0.02)


def test_context_parallel_chunks_slow_flash_attention_most_on_short_sequences():
    def cost_of_cp(seq, cp):
        return float(flash_attention_slowdown(seq, cp) / flash_attention_slowdown(seq, 1))

    assert 1.0 < cost_of_cp(2048, 2) < cost_of_cp(2048, 4)
    assert cost_of_cp(131072, 2) < 1.01 < cost_of_cp(2048, 2)


def test_a_step_charges_context_parallel_attention_the_short_call_slowdown():
    # FlashAttention-1 runs at half FlashAttention-2's speed on A100, so the difference of
    # the two steps' compute is the attention kernels' time at FlashAttention-2's; each
    # rank does the same attention FLOPs at cp = 1 and 2, so only the chunks' length differs
    def attention_s(seq, cp):
        model = {**GPT_SMALL, "num_layers": 4, "hidden_size": 1024, "num_attention_heads": 8, "seq_length": seq}
        layout = [{"tp": 1, "pp": 1, "cp": cp, "micro_batch_size": 1, "recompute": "none"}]
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

    for seq in (2048, 32768):
        assert attention_s(seq, 2) / attention_s(seq, 1) == pytest.approx(
            float(flash_attention_slowdown(seq, 2) / flash_attention_slowdown(seq, 1))
        )


def test_a_gemm_with_one_row_and_column_costs_no_more_than_a_whole_output_tile():
    args = (989e12, 0.8, 3.35e12, 132)
    one = float(gemm_time_s(np.float64(1), np.float64(1), np.float64(4096), *args))
    tile = float(gemm_time_s(np.float64(128), np.float64(128), np.float64(4096), *args))
    assert one == pytest.approx(tile)


def test_the_shipped_hopper_in_training_factor_is_what_its_benchmark_fits():
    # the constant is fitted on LLM Foundry's same-software A100/H100 pairs (bench.hopper_in_training);
    # a change to the cost model that moves the fit must re-fit the constant
    from partitioners.parallel3d.presets import HOPPER_IN_TRAINING
    from partitioners.parallel3d.published.hopper import fitted_factor

    assert fitted_factor() == pytest.approx(HOPPER_IN_TRAINING, abs=0.01)


def test_mpt_throughput_error_stops_growing_with_sequence_length_under_flash_attention_1():
    # MosaicML's A100 table (bench.llm_foundry): with the newest kernel the prediction runs
    # further ahead of the measurement the longer the sequence; with FlashAttention-1's
    # speed it does not
    from partitioners.parallel3d.published.llm_foundry import A100_80GB_ROWS, table_errors

    def medians_by_length(version):
        by_seq: dict[int, list[float]] = {}
        for _, seq, _, _, err in table_errors("dgx-a100", A100_80GB_ROWS, version, 4):
            by_seq.setdefault(seq, []).append(err)
        return [float(np.median(v)) for _, v in sorted(by_seq.items())]

    newest, older = medians_by_length(None), medians_by_length(1)
    assert newest[-1] - newest[0] > 0.3
    assert max(older) - min(older) < 0.10 and max(abs(m) for m in older) < 0.10


@settings(max_examples=15, deadline=None)
@given(
    seq_exp=st.integers(9, 15),
    tp_exp=st.integers(0, 3),
    cp=st.sampled_from([1, 2]),
    recompute=st.sampled_from(["none", "selective", "full"]),
)
def test_an_older_flash_attention_never_makes_a_step_faster(seq_exp, tp_exp, cp, recompute):
    model = {
        "num_layers": 8,
        "hidden_size": 2048,
        "num_attention_heads": 16,
        "num_kv_heads": 4,
        "seq_length": 2**seq_exp,
        "vocab_size": 32000,
    }
    layout = [{"tp": 2**tp_exp, "pp": 1, "cp": cp, "micro_batch_size": 1, "recompute": recompute}]
    steps = [
        evaluate_layouts(
            model_spec(model),
            cluster_spec({"preset": "dgx-h100", "nodes": 2}),
            training_spec({"global_batch_sequences": 64, "flash_attention_version": version}),
            layout_specs(layout),
        )[0].step_time_s
        for version in (3, 2, 1)
    ]
    assert steps[0] <= steps[1] <= steps[2]


def test_a_layer_pays_the_gap_before_each_of_its_kernels_per_micro_batch():
    # Megatron-Core on Transformer Engine: 12 kernels forward, 20 backward, 0.9 us before each
    # (Gray 2019): 10.8 us forward and 18.0 us backward per layer and micro-batch
    forward_s, backward_s = layer_kernel_gaps_s()
    assert forward_s == pytest.approx(12 * 0.9e-6) and backward_s == pytest.approx(20 * 0.9e-6)
