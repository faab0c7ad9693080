"""FLOP formulas: 2 FLOPs per multiply-accumulate, 1 per pointwise output element.

Every expected value is worked out by hand in the comment beside it.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from partitioners.graph.flops import estimate_flops, estimate_op_flops, flop_formula_known


def test_matmul_counts_two_flops_per_multiply_accumulate():
    # [2, 3, 4] @ [4, 5] -> [2, 3, 5]: 30 outputs, each a dot product of length 4
    assert estimate_flops("MatMul", [(2, 3, 4), (4, 5)], [(2, 3, 5)]) == (2 * 30 * 4, None)


def test_batched_attention_scores_matmul():
    # Q K^T for batch 1, 12 heads, sequence 128, head size 64: [1,12,128,64] @ [1,12,64,128]
    # -> 1*12*128*128 outputs of length-64 dot products
    flops = estimate_flops("MatMul", [(1, 12, 128, 64), (1, 12, 64, 128)], [(1, 12, 128, 128)]).flops
    assert flops == 2 * 12 * 128 * 128 * 64


def test_gemm_with_transposed_weight_and_bias():
    # A [8, 16], B [32, 16] with transB -> [8, 32]; 2*8*32*16 MAC FLOPs + 8*32 bias adds
    flops = estimate_flops("Gemm", [(8, 16), (32, 16), (32,)], [(8, 32)], {"transB": 1}).flops
    assert flops == 2 * 8 * 32 * 16 + 8 * 32


def test_conv_counts_kernel_times_input_channels_per_output_and_bias():
    # ResNet stem: 64 filters 7x7x3, output [1, 64, 112, 112]
    # 2 * 802816 outputs * 147 + 802816 bias adds = 236_830_720
    flops = estimate_flops("Conv", [(1, 3, 224, 224), (64, 3, 7, 7), (64,)], [(1, 64, 112, 112)]).flops
    assert flops == 236_830_720


def test_grouped_conv_uses_channels_per_group():
    # depthwise 3x3 on 32 channels (group=32): W [32, 1, 3, 3], out [1, 32, 10, 10]
    flops = estimate_flops("Conv", [(1, 32, 10, 10), (32, 1, 3, 3)], [(1, 32, 10, 10)], {"group": 32}).flops
    assert flops == 2 * 3200 * 9


def test_conv_transpose_scatters_each_input_element():
    # X [1, 4, 5, 5], W [4, 2, 3, 3] -> every one of 100 inputs feeds 2*9 outputs
    flops = estimate_flops("ConvTranspose", [(1, 4, 5, 5), (4, 2, 3, 3)], [(1, 2, 11, 11)]).flops
    assert flops == 2 * 100 * 18


def test_layer_normalization_is_seven_flops_per_element():
    flops = estimate_flops("LayerNormalization", [(2, 128, 768), (768,), (768,)], [(2, 128, 768)]).flops
    assert flops == 7 * 2 * 128 * 768


def test_softmax_is_five_flops_per_element():
    assert estimate_flops("Softmax", [(1, 12, 128, 128)], [(1, 12, 128, 128)]).flops == 5 * 12 * 128 * 128


def test_reduction_counts_each_input_element_once():
    assert estimate_flops("ReduceMean", [(4, 10, 6)], [(4, 1, 6)]).flops == 240


def test_max_pool_counts_window_per_output():
    # ResNet max pool: 3x3 window, output [1, 64, 56, 56]
    flops = estimate_flops("MaxPool", [(1, 64, 112, 112)], [(1, 64, 56, 56)], {"kernel_shape": [3, 3]}).flops
    assert flops == 64 * 56 * 56 * 9


def test_global_average_pool_reads_every_input_element():
    assert estimate_flops("GlobalAveragePool", [(1, 2048, 7, 7)], [(1, 2048, 1, 1)]).flops == 2048 * 49


def test_elementwise_is_one_flop_per_output_element():
    assert estimate_flops("Add", [(3, 4), (4,)], [(3, 4)]) == (12.0, None)
    assert estimate_flops("Gelu", [(3, 4)], [(3, 4)]).flops == 12


def test_gather_and_shape_ops_cost_no_flops():
    # an embedding lookup copies rows: bytes, not arithmetic
    assert estimate_flops("Gather", [(30522, 768), (1, 128)], [(1, 128, 768)]) == (0.0, None)
    assert estimate_flops("Reshape", [(2, 6), (2,)], [(3, 4)]) == (0.0, None)
    assert estimate_flops("Constant", [], [(4,)]) == (0.0, None)


def test_lstm_gates_bias_and_cell_update():
    # seq 10, batch 2, input 8, hidden 4, one direction: W [1, 16, 8], R [1, 16, 4], B [1, 32]
    # per step and batch row: 2*16*(8+4) = 384 gate FLOPs + 32 bias adds + 9*4 = 36 pointwise
    shapes = [(10, 2, 8), (1, 16, 8), (1, 16, 4), (1, 32)]
    assert estimate_flops("LSTM", shapes, [(10, 1, 2, 4)]).flops == (384 + 32 + 36) * 10 * 2


def test_bidirectional_gru_counts_both_directions():
    # seq 5, batch 1, input 3, hidden 2, two directions, no bias: W [2, 6, 3], R [2, 6, 2]
    # per step and direction: 2*6*(3+2) = 60 + 8*2 = 16 pointwise
    assert estimate_flops("GRU", [(5, 1, 3), (2, 6, 3), (2, 6, 2)], [(5, 2, 1, 2)]).flops == 76 * 5 * 2


def test_einsum_contraction_counts_every_index_combination_twice():
    # "bij,bjk->bik" with b=2, i=3, j=4, k=5: 2*3*4*5 multiply-adds
    flops = estimate_flops("Einsum", [(2, 3, 4), (2, 4, 5)], [(2, 3, 5)], {"equation": b"bij,bjk->bik"}).flops
    assert flops == 2 * 120


def test_contrib_attention_counts_projection_scores_context_and_softmax():
    # B=1, S=4, D_in=8, weights [8, 24] (D=8), 2 heads:
    # projection 2*1*4*8*24 = 1536; Q K^T and P V 2 * 2*1*4*4*8 = 512; softmax 5*1*2*4*4 = 160
    flops = estimate_flops("Attention", [(1, 4, 8), (8, 24), (24,)], [(1, 4, 8)], {"num_heads": 2}).flops
    assert flops == 1536 + 512 + 160


def test_unknown_operator_falls_back_to_output_elements_and_says_so():
    estimate = estimate_flops("MyCustomOp", [(2, 5)], [(2, 5), (3,)])
    assert estimate.flops == 13
    assert "MyCustomOp" in estimate.note
    assert not flop_formula_known("MyCustomOp")


def test_unknown_shapes_fall_back_with_a_note():
    estimate = estimate_flops("MatMul", [(None, 4), (4, 5)], [(None, 5)])
    assert estimate.flops == 0.0
    assert estimate.note is not None


def test_pair_form_reports_whether_a_formula_applied():
    assert estimate_op_flops("Relu", [(4,)], [(4,)]) == (4.0, True)
    assert estimate_op_flops("Mystery", [(4,)], [(4,)]) == (4.0, False)


@pytest.mark.parametrize("op_type", ["MatMul", "Gemm", "Conv", "ConvTranspose", "LSTM", "Einsum", "MaxPool"])
def test_formula_ops_with_malformed_shapes_fall_back_instead_of_raising(op_type):
    estimate = estimate_flops(op_type, [(3,), ()], [(3,)])
    assert estimate.note is not None


def test_multi_head_attention_counts_scores_context_and_softmax():
    # com.microsoft.MultiHeadAttention, projected inputs: query [1, 4, 8], key [1, 6, 8], 2 heads
    # Q K^T and P V: 2 * (2 * 1*4*6*8) = 768; softmax 5 * 1*2*4*6 = 240
    flops = estimate_flops("MultiHeadAttention", [(1, 4, 8), (1, 6, 8), (1, 6, 8)], [(1, 4, 8)], {"num_heads": 2}).flops
    assert flops == 768 + 240


def test_inference_batch_norm_is_a_scale_and_a_shift_per_element():
    assert estimate_flops("BatchNormalization", [(2, 3, 4, 4), (3,), (3,), (3,), (3,)], [(2, 3, 4, 4)]).flops == 2 * 96


_dims = st.one_of(st.none(), st.integers(0, 2**40))
_shapes = st.one_of(st.none(), st.lists(_dims, max_size=5).map(tuple))


@settings(max_examples=300, deadline=None)
@given(
    op_type=st.sampled_from(
        [
            "MatMul",
            "Gemm",
            "Conv",
            "ConvTranspose",
            "LSTM",
            "GRU",
            "RNN",
            "Einsum",
            "MaxPool",
            "Softmax",
            "LayerNormalization",
            "ReduceSum",
            "Attention",
            "MultiHeadAttention",
            "Add",
            "Reshape",
            "Unknown",
            "QLinearMatMul",
            "QLinearConv",
            "MatMulNBits",
            "GroupQueryAttention",
            "DequantizeLinear",
        ]
    ),
    inputs=st.lists(_shapes, max_size=4),
    outputs=st.lists(_shapes, max_size=2),
)
def test_any_shapes_give_a_finite_non_negative_estimate_never_an_exception(op_type, inputs, outputs):
    attrs = {"kernel_shape": [3, 3], "equation": "ij,jk->ik", "num_heads": 2}
    flops, _note = estimate_flops(op_type, inputs, outputs, attrs)
    assert flops >= 0 and flops == flops and flops != float("inf")


def test_quantized_matmul_counts_like_its_float_form():
    # QLinearMatMul(a, a_scale, a_zp, b, b_scale, b_zp, y_scale, y_zp): [4, 8] x [8, 2]
    shapes = [(4, 8), (), (), (8, 2), (), (), (), ()]
    assert estimate_flops("QLinearMatMul", shapes, [(4, 2)]) == (2 * 8 * 8, None)
    assert estimate_flops("MatMulInteger", [(4, 8), (8, 2)], [(4, 2)]) == (2 * 8 * 8, None)


def test_quantized_conv_uses_the_weight_at_input_three_and_the_bias_at_eight():
    # W [8, 3, 3, 3], out [1, 8, 4, 4]: 2 * 128 * 27 MAC FLOPs + 128 bias adds
    shapes = [(1, 3, 6, 6), (), (), (8, 3, 3, 3), (), (), (), (), (8,)]
    assert estimate_flops("QLinearConv", shapes, [(1, 8, 4, 4)]).flops == 2 * 128 * 27 + 128


def test_four_bit_matmul_reads_k_from_its_attributes():
    # com.microsoft.MatMulNBits: A [1, 16, 4096] x packed B, K=4096, N=11008
    flops = estimate_flops("MatMulNBits", [(1, 16, 4096), (11008, 128, 16)], [(1, 16, 11008)], {"K": 4096, "N": 11008})
    assert flops.flops == 2 * 16 * 11008 * 4096


def test_group_query_attention_attends_over_past_and_new_tokens():
    # query [1, 2, 64] (4 heads of 16), key [1, 2, 32] (2 kv heads), past_key [1, 2, 6, 16]
    # attended length 6 + 2 = 8: Q K^T and P V 2 * (2 * 1*2*8*64) = 4096; softmax 5 * 1*4*2*8 = 320
    shapes = [(1, 2, 64), (1, 2, 32), (1, 2, 32), (1, 2, 6, 16), (1, 2, 6, 16)]
    flops = estimate_flops("GroupQueryAttention", shapes, [(1, 2, 64)], {"num_heads": 4, "kv_num_heads": 2}).flops
    assert flops == 4096 + 320


def test_dequantize_is_two_flops_per_element():
    assert estimate_flops("DequantizeLinear", [(3, 5), (), ()], [(3, 5)]) == (30.0, None)
