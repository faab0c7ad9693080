"""Per-GPU memory: activations, model state, fragmentation (partitioners.parallel3d.memory).

Expected values are worked by hand from the published formulas the docstrings
cite: Narayanan et al. SC21 (FLOPs, bubble), Korthikanti et al. 2022 (activation
memory), ZeRO (bytes per parameter per stage).
"""

from __future__ import annotations

import numpy as np
import pytest

from partitioners.parallel3d.cost import (
    gradient_bucket_count,
    predict_layouts,
)
from partitioners.parallel3d.flops import parameter_counts
from partitioners.parallel3d.memory import (
    ACTIVATION_FRAGMENTATION,
    ACTIVATION_FRAGMENTATION_HIGH,
    activation_bytes_per_layer,
    fragmentation_that_fills,
    model_state_bytes,
)
from partitioners.parallel3d.planner import evaluate_layouts
from partitioners.parallel3d.stages import (
    RECOMPUTE_FULL,
    RECOMPUTE_NONE,
    RECOMPUTE_SELECTIVE,
)
from tests.partitioners.parallel3d.layouts import layouts, selective_saving_bytes
from tests.partitioners.parallel3d.shapes import (
    A100_NODE,
    GPT_SMALL,
    cluster_spec,
    layout_specs,
    model_spec,
    training_spec,
)

_EIGHT_LAYERS = {
    "num_layers": 8,
    "hidden_size": 4096,
    "num_attention_heads": 32,
    "seq_length": 2048,
    "vocab_size": 32000,
}


_NO_RECOMPUTE = [{"tp": 1, "pp": 1, "cp": 1, "micro_batch_size": 4, "recompute": "none", "zero_stage": 0}]


@pytest.mark.parametrize(
    ("tp", "sequence_parallel", "recompute", "coefficient"),
    [
        # Korthikanti et al. 2022, Table 2, in units of s b h bytes (a=4, s=32, h=64: 5as/h = 10)
        (1, False, RECOMPUTE_NONE, 34 + 10),
        (4, False, RECOMPUTE_NONE, 10 + 24 / 4 + 10 / 4),
        (4, True, RECOMPUTE_NONE, 34 / 4 + 10 / 4),
        (4, True, RECOMPUTE_SELECTIVE, 34 / 4),
        (4, True, RECOMPUTE_FULL, 2 / 4),
    ],
)
def test_activation_memory_per_layer_matches_korthikanti_table_2(tp, sequence_parallel, recompute, coefficient):
    model = model_spec(GPT_SMALL)
    training = training_spec(
        {"global_batch_sequences": 1, "flash_attention": False, "sequence_parallel": sequence_parallel, "dropout": True}
    )
    s, b, h = 32, 3, 64
    got = activation_bytes_per_layer(model, training, np.array([s * b]), np.array([tp]), np.array([recompute]))
    assert float(got[0]) == pytest.approx(coefficient * s * b * h)


def test_flash_attention_never_stores_the_score_matrix():
    model = model_spec(GPT_SMALL)
    training = training_spec(
        {"global_batch_sequences": 1, "flash_attention": True, "sequence_parallel": True, "dropout": True}
    )
    got = activation_bytes_per_layer(model, training, np.array([32]), np.array([1]), np.array([RECOMPUTE_NONE]))
    # 34 s h bytes plus the fp32 log-sum-exp per head (4 a bytes per token)
    assert float(got[0]) == pytest.approx(32 * (34 * 64 + 4 * 4))


def test_without_dropout_no_masks_are_kept_and_attention_keeps_only_the_softmax_output():
    # Korthikanti's 34sbh + 5as^2b less the two residual masks (2sbh), the attention mask
    # (as^2b) and the dropout output (2as^2b): 32sbh + 2as^2b
    model = model_spec(GPT_SMALL)
    training = training_spec({"global_batch_sequences": 1, "flash_attention": False, "sequence_parallel": False})
    s, h, a = 32, 64, 4
    got = activation_bytes_per_layer(model, training, np.array([s]), np.array([1]), np.array([RECOMPUTE_NONE]))
    assert float(got[0]) == pytest.approx(s * (32 * h + 2 * a * s))


def test_fp8_linears_keep_their_saved_gemm_inputs_in_one_byte():
    # Transformer Engine saves the FP8 cast of each GEMM input: the two LayerNorm outputs
    # (2h -> h each) and the MLP activation output (8h -> 4h for a 4h GeLU MLP); the
    # projection adds an FP8 copy (h) of the attention output flash attention keeps in bf16
    model = model_spec(GPT_SMALL)
    training = training_spec({"global_batch_sequences": 1, "sequence_parallel": False})
    s, h = 32, 64
    kept = {}
    for fp8 in (False, True):
        kept[fp8] = float(
            activation_bytes_per_layer(
                model, training, np.array([s]), np.array([1]), np.array([RECOMPUTE_NONE]), fp8_gemm_inputs=fp8
            )[0]
        )
    assert kept[False] - kept[True] == pytest.approx(s * (h + h + 4 * h - h))


def test_selective_recomputation_under_flash_attention_rebuilds_the_norm_and_activation_outputs():
    # no score matrix is stored to drop; the two norms' outputs (2 bytes per element,
    # sequence-sharded) are rebuilt from their kept inputs, and the 4h GeLU output (2 bytes,
    # split over tp) from the kept up-projection output
    training = training_spec({"global_batch_sequences": 1})
    saved = selective_saving_bytes(model_spec(GPT_SMALL), training, tokens=32, tp=2)
    assert saved == pytest.approx(32 * (2 * 2 * 64 + 2 * 4 * 64) / 2)


def test_selective_recomputation_in_an_moe_layer_rebuilds_the_experts_activation_output():
    model = model_spec(
        {
            **GPT_SMALL,
            "gated_mlp": True,
            "moe": {"num_experts": 4, "experts_per_token": 2, "expert_ffn_hidden_size": 16, "shared_experts": 1},
        }
    )
    training = training_spec({"global_batch_sequences": 1})
    norms = 32 * 2 * 2 * 64
    # two routed copies and one shared expert each keep a 16-wide, 2-byte activation output
    assert selective_saving_bytes(model, training, tokens=32, tp=1, moe_layer=True) == pytest.approx(
        norms + 32 * (2 + 1) * 16 * 2
    )
    # a dense layer of the same model keeps its 4h-wide one
    assert selective_saving_bytes(model, training, tokens=32, tp=1, moe_layer=False) == pytest.approx(
        norms + 32 * 4 * 64 * 2
    )


def test_selective_recomputation_fits_llama3_405b_as_meta_trained_it_without_checkpointing():
    # Llama 3 Herd of Models, Sec. 3.3.2 and Table 4: tp 8, cp 1, pp 16, dp 64 on 8,192
    # H100s, 8K sequences, "without activation checkpointing"; keeping every norm and
    # SwiGLU output would not fit the first pipeline stage in 80 GB
    model = {
        "num_layers": 126,
        "hidden_size": 16384,
        "num_attention_heads": 128,
        "num_kv_heads": 8,
        "ffn_hidden_size": 53248,
        "gated_mlp": True,
        "seq_length": 8192,
        "vocab_size": 128256,
    }
    layout = {"tp": 8, "pp": 16, "cp": 1, "dp": 64}
    cluster, training = {"preset": "dgx-h100", "nodes": 1024}, {"global_batch_sequences": 2048}
    kept_all, rebuilt = evaluate_layouts(
        model_spec(model),
        cluster_spec(cluster),
        training_spec(training),
        layout_specs([{**layout, "recompute": "none"}, {**layout, "recompute": "selective"}]),
    )
    assert not kept_all.fits
    assert rebuilt.fits


def test_selective_recomputation_under_flash_attention_costs_a_memory_bound_pass_not_flops():
    model = model_spec(GPT_SMALL)
    cluster = cluster_spec(A100_NODE)
    training = training_spec({"global_batch_sequences": 8})
    pred = {
        rc: predict_layouts(model, cluster, training, layouts(dp=8, recompute=rc))
        for rc in (RECOMPUTE_NONE, RECOMPUTE_SELECTIVE)
    }
    assert float(pred[RECOMPUTE_SELECTIVE]["compute_s"][0]) > float(pred[RECOMPUTE_NONE]["compute_s"][0])
    assert float(pred[RECOMPUTE_SELECTIVE]["hardware_flops_per_step"][0]) == float(
        pred[RECOMPUTE_NONE]["hardware_flops_per_step"][0]
    )


@pytest.mark.parametrize(
    ("zero", "bytes_per_param"),
    [
        # bf16 weights 2 + fp32 grads 4 + fp32 Adam state 12, sharded over dp = 8 by stage
        (0, 2 + 4 + 12),
        (1, 2 + 4 + 12 / 8),
        (2, 2 + (4 + 12) / 8),
        (3, (2 + 4 + 12) / 8),
    ],
)
def test_weights_gradients_optimizer_bytes_per_parameter_by_zero_stage(zero, bytes_per_param):
    model = model_spec(GPT_SMALL)
    cluster = cluster_spec(A100_NODE)
    training = training_spec({"global_batch_sequences": 8})
    pred = predict_layouts(model, cluster, training, layouts(dp=8, zero=zero))
    state = pred["parameters_bytes"] + pred["gradients_bytes"] + pred["optimizer_state_bytes"]
    assert float(state[0]) == pytest.approx(bytes_per_param * parameter_counts(model).total, rel=1e-3)


def test_zero_shards_expert_state_only_over_the_ranks_that_hold_the_same_experts():
    # dp x cp = 16 ranks share every dense parameter; with ep = 8 only 2 of them hold the same experts
    training = training_spec({"global_batch_sequences": 8})
    _, _, optimizer_state = model_state_bytes(
        np.array([1.6e9]),
        np.array([8e9]),
        np.array([1]),
        np.array([16.0]),
        np.array([2.0]),
        training,
        fp8_linears=False,
    )
    assert float(optimizer_state[0]) == pytest.approx(12 * (1.6e9 / 16 + 8e9 / 2))


@pytest.mark.parametrize(
    ("fp8_params", "bytes_per_linear_weight"),
    [
        (True, 1 + 1),  # FP8 data and its FP8 transpose (Hopper's FP8 GEMMs read only "TN")
        (False, 2 + 1 + 1),  # beside the 16-bit weight they are cast from
    ],
)
def test_fp8_runs_hold_linear_weights_in_fp8_and_transposed_and_the_embedding_in_16_bits(
    fp8_params, bytes_per_linear_weight
):
    training = training_spec({"global_batch_sequences": 8, "precision": "fp8", "fp8_params": fp8_params})
    linear, embedding = 1e9, 0.25e9
    weights = float(
        model_state_bytes(
            np.array([linear + embedding]),
            np.array([0.0]),
            np.array([0]),
            np.array([8.0]),
            np.array([1.0]),
            training,
            fp8_linears=True,
            unquantized_params=embedding,
        )[0][0]
    )
    assert weights == pytest.approx(bytes_per_linear_weight * linear + 2 * embedding)


def test_16_bit_runs_hold_two_bytes_of_every_weight():
    training = training_spec({"global_batch_sequences": 8})
    weights = float(
        model_state_bytes(
            np.array([1e9]),
            np.array([0.0]),
            np.array([0]),
            np.array([8.0]),
            np.array([1.0]),
            training,
            fp8_linears=False,
        )[0][0]
    )
    assert weights == pytest.approx(2e9)


def test_fp8_weights_are_gathered_in_one_byte_by_the_distributed_optimizer():
    model = model_spec({**GPT_SMALL, "hidden_size": 4096, "num_attention_heads": 32})
    cluster = cluster_spec({"preset": "dgx-h100", "nodes": 2})
    totals = {}
    for fp8_params in (False, True):
        training = training_spec(
            {"global_batch_sequences": 16, "precision": "fp8", "fp8_params": fp8_params, "overlap_grad_reduce": False}
        )
        totals[fp8_params] = float(
            predict_layouts(model, cluster, training, layouts(dp=16, zero=1))["dp_comm_total_s"][0]
        )
    assert totals[True] < totals[False]


def test_interleaving_leaves_less_of_the_gradient_reduction_trailing_the_pipeline():
    # Megatron-Core reduces each model chunk once its last backward is done: only the last
    # chunk's share trails the pipeline, the others run under later chunks' backwards
    model = model_spec(
        {"num_layers": 16, "hidden_size": 4096, "num_attention_heads": 32, "seq_length": 2048, "vocab_size": 51200}
    )
    cluster = cluster_spec({"preset": "dgx-a100", "nodes": 4})
    training = training_spec({"global_batch_sequences": 64})
    exposed = {
        v: float(predict_layouts(model, cluster, training, layouts(dp=8, pp=4, v=v, zero=1))["dp_comm_exposed_s"][0])
        for v in (1, 2, 4)
    }
    total = float(predict_layouts(model, cluster, training, layouts(dp=8, pp=4, v=4, zero=1))["dp_comm_total_s"][0])
    assert exposed[4] < exposed[2] < exposed[1]
    assert exposed[4] > total / 4 / 2  # the last chunk's reduce-scatter (2/3 of the bytes in fp32) stays out


def test_without_overlapped_gradient_reduction_interleaving_hides_none_of_it():
    model = model_spec(
        {"num_layers": 16, "hidden_size": 4096, "num_attention_heads": 32, "seq_length": 2048, "vocab_size": 51200}
    )
    cluster = cluster_spec({"preset": "dgx-a100", "nodes": 4})
    training = training_spec({"global_batch_sequences": 64, "overlap_grad_reduce": False})
    pred = predict_layouts(model, cluster, training, layouts(dp=8, pp=4, v=4, zero=1))
    assert float(pred["dp_comm_exposed_s"][0]) == pytest.approx(float(pred["dp_comm_total_s"][0]))


def test_gradient_buckets_grow_with_the_data_parallel_size_so_large_dp_pays_fewer_latencies():
    # Megatron-Core: max(40M, 1M x dp) parameters per bucket
    params = np.array([1.95e9, 1.95e9])
    assert gradient_bucket_count(params, np.array([8, 384]), True).tolist() == [49, 6]


def test_without_overlapped_gradient_reduction_each_buffer_is_reduced_in_one_collective():
    assert gradient_bucket_count(np.array([1.95e9]), np.array([8]), False).tolist() == [1]


def test_a_larger_data_parallel_group_spends_less_of_its_reduction_on_latency():
    model = model_spec({**GPT_SMALL, "num_layers": 8, "hidden_size": 4096, "num_attention_heads": 32})
    cluster = cluster_spec({"preset": "dgx-h100", "nodes": 64})
    training = training_spec({"global_batch_sequences": 512})
    pred = predict_layouts(model, cluster, training, layouts(dp=512, zero=1))
    unbucketed = training_spec({"global_batch_sequences": 512, "overlap_grad_reduce": False})
    one_call = predict_layouts(model, cluster, unbucketed, layouts(dp=512, zero=1))
    # 1.6B parameters fill four 512M-parameter buckets: four latencies, not forty
    assert float(pred["dp_comm_total_s"][0]) < 1.1 * float(one_call["dp_comm_total_s"][0])


def test_zero_3_hides_its_gathers_under_computation_even_without_overlapped_gradient_reduction():
    # DeepSpeed stage 3 and FSDP prefetch by construction; Megatron's DDP flag does not govern them
    model = model_spec({**GPT_SMALL, "hidden_size": 4096, "num_attention_heads": 32})
    cluster = cluster_spec({"preset": "dgx-a100", "nodes": 2})
    training = training_spec({"global_batch_sequences": 64, "overlap_grad_reduce": False})
    pred = {z: predict_layouts(model, cluster, training, layouts(dp=16, mbs=4, zero=z)) for z in (2, 3)}
    assert float(pred[2]["dp_comm_exposed_s"][0]) == pytest.approx(float(pred[2]["dp_comm_total_s"][0]))
    assert float(pred[3]["dp_comm_exposed_s"][0]) < float(pred[3]["dp_comm_total_s"][0])


@pytest.mark.parametrize("zero", [2, 3])
def test_zero_2_and_3_under_a_pipeline_hold_zero_1_bytes_between_micro_batches(zero):
    # torch.distributed.pipelining keeps an FSDP stage's weights and gradients whole until its last backward
    model = model_spec({**GPT_SMALL, "num_layers": 4})
    cluster = cluster_spec(A100_NODE)
    training = training_spec({"global_batch_sequences": 16})
    keys = ("parameters_bytes", "gradients_bytes", "optimizer_state_bytes", "buffers_bytes", "memory_bytes")
    held = {z: predict_layouts(model, cluster, training, layouts(dp=4, pp=2, zero=z)) for z in (1, zero)}
    assert {k: float(held[zero][k][0]) for k in keys} == {k: float(held[1][k][0]) for k in keys}


def test_deferred_zero_2_moves_zero_1_bytes_but_cannot_hide_its_reduce_scatter_behind_a_backward():
    model = model_spec({**GPT_SMALL, "num_layers": 4})
    cluster = cluster_spec({"preset": "dgx-a100", "nodes": 2})
    training = training_spec({"global_batch_sequences": 16})
    pred = {z: predict_layouts(model, cluster, training, layouts(dp=8, pp=2, zero=z)) for z in (1, 2)}
    assert float(pred[2]["dp_comm_total_s"][0]) == pytest.approx(float(pred[1]["dp_comm_total_s"][0]))
    assert float(pred[2]["dp_comm_exposed_s"][0]) > float(pred[1]["dp_comm_exposed_s"][0])


def test_an_fsdp_layout_with_a_pipeline_is_predicted_and_says_its_sharding_is_deferred():
    # Llama 3 405B trained with FSDP and pp = 16 (Llama Team 2024, Sec. 3.3.2)
    model = {**GPT_SMALL, "num_layers": 4}
    (prediction,) = evaluate_layouts(
        model_spec(model),
        cluster_spec(A100_NODE),
        training_spec({"global_batch_sequences": 16}),
        layout_specs([{"tp": 1, "pp": 2, "zero_stage": 3, "recompute": "none"}]),
    )
    assert prediction.reasons == ()
    assert any("deferred" in note for note in prediction.notes)


def test_a_learned_position_table_sits_whole_on_every_tensor_rank_of_the_first_stage():
    # GPT-2/3: s x h positions, replicated across the tensor group (SC21 eq. 2's s term)
    cluster = cluster_spec(A100_NODE)
    training = training_spec({"global_batch_sequences": 8})
    params = {}
    for learned in (False, True):
        model = model_spec({**GPT_SMALL, "learned_position_embeddings": learned})
        params[learned] = float(predict_layouts(model, cluster, training, layouts(tp=2, pp=2))["parameters_bytes"][0])
    assert params[True] - params[False] == pytest.approx(2.0 * 32 * 64)  # bf16 weights, not halved by tp=2


def test_first_pipeline_stage_keeps_p_micro_batches_of_activations():
    # 1F1B: the first stage holds p micro-batches x L/p layers = L layers' worth (Korthikanti Sec. 4.2.3)
    model = model_spec({**GPT_SMALL, "num_layers": 8, "vocab_size": 8})
    cluster = cluster_spec(A100_NODE)
    training = training_spec(
        {"global_batch_sequences": 16, "flash_attention": False, "sequence_parallel": False, "dropout": True}
    )
    per_layer = float(
        activation_bytes_per_layer(model, training, np.array([32]), np.array([1]), np.array([RECOMPUTE_NONE]))[0]
    )
    pred = predict_layouts(model, cluster, training, layouts(dp=1, pp=4))
    embedding_masks = 4 * 32 * 64  # one byte per element, p micro-batches in flight
    expected = (8 * per_layer + embedding_masks) * (1 + ACTIVATION_FRAGMENTATION)
    assert float(pred["activations_bytes"][0]) == pytest.approx(expected)


def test_a_middle_stage_fuller_than_the_shortened_first_one_sets_the_activation_peak():
    # 14 layers on 8 stages: the ends keep 1 layer each, the second stage 2 layers x 7
    # micro-batches in flight against the first's 1 x 8 (Llama 3 405B's 8 x 15 against 7 x 16)
    model = model_spec({**GPT_SMALL, "num_layers": 14, "vocab_size": 8})
    cluster = cluster_spec(A100_NODE)
    training = training_spec({"global_batch_sequences": 16})
    per_layer = float(
        activation_bytes_per_layer(model, training, np.array([32]), np.array([1]), np.array([RECOMPUTE_NONE]))[0]
    )
    pred = predict_layouts(model, cluster, training, layouts(dp=1, pp=8))
    assert (int(pred["first_stage_layers"][0]), int(pred["last_stage_layers"][0])) == (1, 1)
    assert float(pred["activations_bytes"][0]) == pytest.approx(2 * 7 * per_layer * (1 + ACTIVATION_FRAGMENTATION))


def test_a_prediction_names_the_pipeline_rank_whose_memory_it_reports():
    model = {**GPT_SMALL, "num_layers": 14, "vocab_size": 8}
    (prediction,) = evaluate_layouts(
        model_spec(model),
        cluster_spec(A100_NODE),
        training_spec({"global_batch_sequences": 16}),
        layout_specs([{"dp": 1, "tp": 1, "pp": 8, "virtual_stages": 1, "micro_batch_size": 1}]),
    )
    assert prediction.memory.fullest_stage == 1
    assert prediction.memory.to_dict()["fullest_stage"] == 1


@pytest.mark.parametrize(("grad_bytes", "extra_bytes_per_param"), [(2, 4), (4, 0)])
def test_a_kept_fp32_gradient_copy_costs_four_bytes_per_parameter_only_over_16_bit_gradients(
    grad_bytes, extra_bytes_per_param
):
    # Megatron-LM 2021: main_param.grad = main_grad.float() survives zero_grad; over an fp32
    # buffer .float() is the buffer itself
    model = model_spec(GPT_SMALL)
    cluster = cluster_spec(A100_NODE)
    grads = {}
    for kept in (False, True):
        training = training_spec(
            {"global_batch_sequences": 8, "grad_bytes_per_param": grad_bytes, "fp32_grad_copy_kept": kept}
        )
        grads[kept] = float(predict_layouts(model, cluster, training, layouts(dp=8))["gradients_bytes"][0])
    assert grads[True] - grads[False] == pytest.approx(extra_bytes_per_param * parameter_counts(model).total, rel=1e-3)


def test_torch_ddp_bucket_copy_costs_one_more_gradient_per_parameter():
    # DistributedDataParallel without gradient_as_bucket_view keeps gradients and buckets
    model = model_spec(GPT_SMALL)
    cluster = cluster_spec(A100_NODE)
    grads = {}
    for copy in (False, True):
        training = training_spec({"global_batch_sequences": 8, "grad_bytes_per_param": 2, "ddp_bucket_copy": copy})
        grads[copy] = float(predict_layouts(model, cluster, training, layouts(dp=8))["gradients_bytes"][0])
    assert grads[True] - grads[False] == pytest.approx(2 * parameter_counts(model).total, rel=1e-3)


def test_kept_stage_outputs_add_one_residual_stream_per_micro_batch_in_flight():
    # Megatron-LM before deallocate_output_tensor: each in-flight micro-batch's stage output
    # (s x b x h, 2 bytes) stays until its backward; the first of 4 stages has 4 in flight
    model = model_spec({**GPT_SMALL, "num_layers": 8, "vocab_size": 8})
    cluster = cluster_spec(A100_NODE)
    activations = {}
    for kept in (False, True):
        training = training_spec(
            {
                "global_batch_sequences": 16,
                "flash_attention": False,
                "sequence_parallel": False,
                "stage_outputs_kept": kept,
            }
        )
        activations[kept] = float(predict_layouts(model, cluster, training, layouts(pp=4))["activations_bytes"][0])
    assert activations[True] - activations[False] == pytest.approx(4 * 32 * 64 * 2 * (1 + ACTIVATION_FRAGMENTATION))


def test_layout_known_to_run_out_of_memory_is_predicted_not_to_fit():
    # GPT-3 175B without recomputation on 64 A100-80GB (tp 8, pp 8): Korthikanti et al. 2022
    # needed selective recomputation to fit it
    gpt3 = {"num_layers": 96, "hidden_size": 12288, "num_attention_heads": 96, "seq_length": 2048, "vocab_size": 51200}
    (pred,) = evaluate_layouts(
        model_spec(gpt3),
        cluster_spec({"preset": "dgx-a100", "nodes": 8}),
        training_spec({"global_batch_sequences": 64, "flash_attention": False, "dropout": True}),
        layout_specs(
            [{"tp": 8, "pp": 8, "micro_batch_size": 1, "recompute": "none", "zero_stage": 0, "virtual_stages": 1}]
        ),
    )
    assert any(r.startswith("out of memory") for r in pred.reasons)


def test_fragmentation_that_fills_is_where_activations_reach_capacity():
    # 20 GiB of other state + 11 GiB of activations counted at 10% (10 GiB raw): 40 GiB fills at 100%
    gib = 1024**3
    assert fragmentation_that_fills(31 * gib, 11 * gib, 40 * gib, ACTIVATION_FRAGMENTATION) == pytest.approx(1.0)
    assert fragmentation_that_fills(31 * gib, 11 * gib, 31 * gib, ACTIVATION_FRAGMENTATION) == pytest.approx(
        ACTIVATION_FRAGMENTATION
    )


def test_layout_that_fits_only_at_low_allocator_fragmentation_is_noted_as_tight():
    model = {"num_layers": 8, "hidden_size": 4096, "num_attention_heads": 32, "seq_length": 2048, "vocab_size": 32000}
    layout = [{"tp": 1, "pp": 1, "micro_batch_size": 4, "recompute": "none", "zero_stage": 0}]
    training = {"global_batch_sequences": 32, "flash_attention": False}
    (roomy,) = evaluate_layouts(
        model_spec(model),
        cluster_spec({"gpu": "a100-80gb", "num_nodes": 1}),
        training_spec(training),
        layout_specs(layout),
    )
    activations_at_high_end = roomy.memory.activations_bytes * (
        (1 + ACTIVATION_FRAGMENTATION_HIGH) / (1 + ACTIVATION_FRAGMENTATION) - 1
    )
    capacity = roomy.memory.total_bytes + activations_at_high_end / 2
    (tight,) = evaluate_layouts(
        model_spec(model),
        cluster_spec({"gpu": "a100-80gb", "num_nodes": 1, "memory_bytes": capacity}),
        training_spec(training),
        layout_specs(layout),
    )
    assert roomy.fits and not any(n.startswith("tight memory") for n in roomy.notes)
    assert tight.fits and any(n.startswith("tight memory") for n in tight.notes)


def test_an_mfu_above_one_from_counting_the_whole_attention_matrix_is_explained_in_the_notes():
    # 128K tokens through a narrow model: attention is nearly all the work, and SC21's count
    # of the whole s x s matrix is twice what causal kernels compute
    model = {
        "num_layers": 12,
        "hidden_size": 2048,
        "num_attention_heads": 8,
        "num_kv_heads": 1,
        "ffn_hidden_size": 1,
        "vocab_size": 1,
        "seq_length": 131072,
    }
    (long_context,) = evaluate_layouts(
        model_spec(model),
        cluster_spec({"preset": "dgx-a100", "nodes": 4}),
        training_spec({"global_batch_sequences": 64}),
        layout_specs([{"tp": 1, "pp": 2}]),
    )
    (short_context,) = evaluate_layouts(
        model_spec({**model, "seq_length": 2048}),
        cluster_spec({"preset": "dgx-a100", "nodes": 4}),
        training_spec({"global_batch_sequences": 64}),
        layout_specs([{"tp": 1, "pp": 2}]),
    )
    assert long_context.mfu > 1.0 > long_context.mfu_causal
    assert any(n.startswith(f"mfu {long_context.mfu:.2f} is above 1") for n in long_context.notes)
    assert not any("is above 1" in n for n in short_context.notes)


def test_each_layout_reports_the_allocator_fragmentation_at_which_it_stops_fitting():
    model = {"num_layers": 8, "hidden_size": 4096, "num_attention_heads": 32, "seq_length": 2048, "vocab_size": 32000}
    layout = [{"tp": 1, "pp": 1, "micro_batch_size": 4, "recompute": "none", "zero_stage": 0}]
    (pred,) = evaluate_layouts(
        model_spec(model),
        cluster_spec({"gpu": "a100-80gb", "num_nodes": 1}),
        training_spec({"global_batch_sequences": 32}),
        layout_specs(layout),
    )
    memory = pred.memory
    fills_at = memory.to_dict()["fragmentation_that_fills"]
    # the same activations, counted at that waste instead of the predicted 10%, are exactly capacity
    raw_activations = memory.activations_bytes / (1 + ACTIVATION_FRAGMENTATION)
    assert memory.total_bytes - memory.activations_bytes + raw_activations * (1 + fills_at) == pytest.approx(
        memory.capacity_bytes
    )
    assert fills_at > ACTIVATION_FRAGMENTATION  # it fits as predicted


def test_a_stated_allocator_fragmentation_is_counted_on_the_activations_instead_of_the_default():
    cluster = {"gpu": "a100-80gb", "num_nodes": 1}
    (default,) = evaluate_layouts(
        model_spec(_EIGHT_LAYERS),
        cluster_spec(cluster),
        training_spec({"global_batch_sequences": 32}),
        layout_specs(_NO_RECOMPUTE),
    )
    (wasteful,) = evaluate_layouts(
        model_spec(_EIGHT_LAYERS),
        cluster_spec(cluster),
        training_spec({"global_batch_sequences": 32, "activation_fragmentation": 0.3}),
        layout_specs(_NO_RECOMPUTE),
    )
    assert wasteful.memory.activations_bytes == pytest.approx(
        default.memory.activations_bytes * 1.3 / (1 + ACTIVATION_FRAGMENTATION)
    )
    extra = wasteful.memory.activations_bytes - default.memory.activations_bytes
    assert wasteful.memory.total_bytes == pytest.approx(default.memory.total_bytes + extra)
    assert wasteful.memory.to_dict()["activation_fragmentation"] == 0.3


def test_the_fragmentation_at_which_a_layout_fills_does_not_depend_on_the_fragmentation_counted():
    cluster = {"gpu": "a100-80gb", "num_nodes": 1}
    fills_at = [
        evaluate_layouts(
            model_spec(_EIGHT_LAYERS),
            cluster_spec(cluster),
            training_spec({"global_batch_sequences": 32, "activation_fragmentation": counted}),
            layout_specs(_NO_RECOMPUTE),
        )[0].memory.fragmentation_that_fills
        for counted in (0.0, 0.1, 0.25)
    ]
    assert fills_at == pytest.approx([fills_at[0]] * 3)


def test_a_layout_tight_at_the_default_fragmentation_runs_out_of_memory_at_a_measured_higher_one():
    (roomy,) = evaluate_layouts(
        model_spec(_EIGHT_LAYERS),
        cluster_spec({"gpu": "a100-80gb", "num_nodes": 1}),
        training_spec({"global_batch_sequences": 32}),
        layout_specs(_NO_RECOMPUTE),
    )
    # capacity at which the layout fills at 20% allocator waste: tight at 10%, out of memory at 25%
    raw_activations = roomy.memory.activations_bytes / (1 + ACTIVATION_FRAGMENTATION)
    capacity = roomy.memory.total_bytes - roomy.memory.activations_bytes + 1.2 * raw_activations
    cluster = {"gpu": "a100-80gb", "num_nodes": 1, "memory_bytes": capacity}
    (tight,) = evaluate_layouts(
        model_spec(_EIGHT_LAYERS),
        cluster_spec(cluster),
        training_spec({"global_batch_sequences": 32}),
        layout_specs(_NO_RECOMPUTE),
    )
    (measured,) = evaluate_layouts(
        model_spec(_EIGHT_LAYERS),
        cluster_spec(cluster),
        training_spec({"global_batch_sequences": 32, "activation_fragmentation": 0.25}),
        layout_specs(_NO_RECOMPUTE),
    )
    assert tight.fits and any(n.startswith("tight memory") for n in tight.notes)
    assert not measured.fits and any(r.startswith("out of memory") for r in measured.reasons)


def test_a_parallel_block_keeps_the_layer_input_once_for_both_norms():
    training = training_spec({"global_batch_sequences": 1, "sequence_parallel": True})
    tokens, tp, none = np.array([32.0]), np.array([4.0]), np.array([RECOMPUTE_NONE])
    kept = {
        parallel: float(
            activation_bytes_per_layer(
                model_spec({**GPT_SMALL, "parallel_attention_mlp": parallel}), training, tokens, tp, none
            )[0]
        )
        for parallel in (False, True)
    }
    # the sequential block's second norm input (attention output plus residual): 2 bytes x h,
    # sequence-sharded over tp
    assert kept[False] - kept[True] == pytest.approx(32 * 2 * 64 / 4)
