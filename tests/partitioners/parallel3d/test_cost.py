"""Step time of a layout (partitioners.parallel3d.cost).

Expected values are worked by hand from the published formulas the docstrings
cite: Narayanan et al. SC21 (FLOPs, bubble), Korthikanti et al. 2022 (activation
memory), ZeRO (bytes per parameter per stage).
"""

from __future__ import annotations

import pytest

from partitioners.hardware.collectives import LinkSpec, allreduce_time_s
from partitioners.parallel3d.comm import OVERLAP_COMPUTE_SLOWDOWN
from partitioners.parallel3d.cost import (
    _NVLINK_EFFICIENCY,
    pipeline_bubble_fraction,
    pipeline_time_s,
    predict_layouts,
)
from partitioners.parallel3d.flops import parameter_counts
from partitioners.parallel3d.kernels import gradient_accumulation_time_s
from partitioners.parallel3d.planner import evaluate_layouts
from partitioners.parallel3d.stages import (
    RECOMPUTE_FULL,
    RECOMPUTE_SELECTIVE,
)
from tests.partitioners.parallel3d.layouts import layouts
from tests.partitioners.parallel3d.shapes import (
    A100_NODE,
    GPT_SMALL,
    cluster_spec,
    constraints_spec,
    layout_specs,
    model_spec,
    training_spec,
)


def test_pipeline_bubble_is_p_minus_1_over_v_m():
    assert float(pipeline_bubble_fraction(4, 1, 8)) == pytest.approx(3 / 8)
    assert float(pipeline_bubble_fraction(4, 2, 8)) == pytest.approx(3 / 16)


def test_predicted_bubble_fraction_uses_micro_batches_per_pipeline():
    model = model_spec({**GPT_SMALL, "num_layers": 8})
    cluster = cluster_spec(A100_NODE)
    training = training_spec({"global_batch_sequences": 32})
    pred = predict_layouts(model, cluster, training, layouts(dp=2, pp=4, mbs=2, v=2))
    # m = 32 / (2 x 2) = 8 micro-batches: the bubble is (4-1)/(2*8) of the ideal time with
    # equal stages, a little less here (fill and drain pass at the mean stage's pace, the
    # steady state at the slowest's: the last stage also has the logits)
    assert float(pred["num_micro_batches"][0]) == 8
    ideal_s = float(pred["pipeline_s"][0] - pred["bubble_s"][0])
    assert 0.8 * ideal_s * 3 / 16 < float(pred["bubble_s"][0]) <= ideal_s * 3 / 16


def test_bubble_fraction_is_the_idle_share_of_the_step_even_with_fewer_micro_batches_than_stages():
    model = model_spec({**GPT_SMALL, "num_layers": 8})
    cluster = cluster_spec(A100_NODE)
    training = training_spec({"global_batch_sequences": 1})
    pred = predict_layouts(model, cluster, training, layouts(pp=4, mbs=1, v=2))
    # (p-1)/(v m) = 3/2: the bubble is longer than the work, yet no more than the whole step
    assert 0.5 < float(pred["bubble_fraction"][0]) < 1.0
    assert float(pred["bubble_fraction"][0]) == pytest.approx(float(pred["bubble_s"][0] / pred["step_time_s"][0]))


@pytest.mark.parametrize(
    "lay",
    [
        {"dp": 2, "tp": 2, "pp": 2, "mbs": 1, "v": 2, "zero": 1, "recompute": RECOMPUTE_FULL},
        {"dp": 8, "zero": 0},
        {"dp": 2, "tp": 4, "zero": 3, "recompute": RECOMPUTE_SELECTIVE},
    ],
)
def test_time_breakdown_accounts_for_the_whole_step(lay):
    model = model_spec({**GPT_SMALL, "num_layers": 8})
    cluster = cluster_spec(A100_NODE)
    training = training_spec({"global_batch_sequences": 32})
    pred = predict_layouts(model, cluster, training, layouts(**lay))
    parts = (
        "compute_s",
        "tp_comm_s",
        "cp_comm_s",
        "ep_comm_s",
        "pp_comm_s",
        "bubble_s",
        "dp_comm_exposed_s",
        "optimizer_s",
    )
    assert sum(float(pred[k][0]) for k in parts) == pytest.approx(float(pred["step_time_s"][0]))


def test_a_two_stage_pipeline_is_paced_by_its_two_stages_not_by_a_full_middle_one():
    # 7 layers on 2 stages: 4 on one, 3 on the other, MoE on 4 of them. The full 4-layer
    # "middle" stage with its share of MoE layers rounded up does not exist at pp 2, so it
    # must not pace the steady state: the bubble stays >= 0 and the parts add up.
    model = model_spec(
        {
            "num_layers": 7,
            "hidden_size": 2048,
            "num_attention_heads": 8,
            "num_kv_heads": 4,
            "vocab_size": 1,
            "seq_length": 2048,
            "moe": {
                "num_experts": 60,
                "experts_per_token": 8,
                "expert_ffn_hidden_size": 2048,
                "moe_layers": [1, 3, 5, 6],
            },
        }
    )
    cluster = cluster_spec({"preset": "dgx-h100", "nodes": 1})
    training = training_spec({"global_batch_sequences": 2})
    pred = predict_layouts(model, cluster, training, layouts(tp=4, pp=2, mbs=1, v=4))
    assert float(pred["bubble_s"][0]) > 0.0
    parts = (
        "compute_s",
        "tp_comm_s",
        "cp_comm_s",
        "ep_comm_s",
        "pp_comm_s",
        "bubble_s",
        "dp_comm_exposed_s",
        "optimizer_s",
    )
    assert sum(float(pred[k][0]) for k in parts) == pytest.approx(float(pred["step_time_s"][0]))


def test_pipeline_of_equal_stages_takes_m_plus_p_minus_1_over_v_stage_times():
    # SC21 Sec. 2.2: (m + (p-1)/v) t
    assert float(pipeline_time_s(2.0, 2.0, 2.0, 4, 2, 8)) == pytest.approx((8 + 3 / 2) * 2.0)
    assert float(pipeline_time_s(2.0, 2.0, 2.0, 1, 1, 8)) == pytest.approx(16.0)


def test_unequal_pipeline_runs_at_the_slowest_stage_and_fills_at_the_mean():
    # first 1.1 s (embedding), two middle stages 1.0 s, last 1.5 s (logits); p = 4, v = 1, m = 8:
    # steady state 8 x 1.5, fill and drain 3 x mean(1.1, 1.0, 1.0, 1.5) = 3 x 1.15
    assert float(pipeline_time_s(1.1, 1.0, 1.5, 4, 1, 8)) == pytest.approx(8 * 1.5 + 3 * 1.15)
    # two stages: no middle one
    assert float(pipeline_time_s(1.2, 9.9, 1.0, 2, 1, 4)) == pytest.approx(4 * 1.2 + 1.1)


def test_unfused_gradient_accumulation_costs_ten_bytes_per_parameter_and_micro_batch():
    # Megatron 2021: main_grad.add_(grad) reads the bf16 gradient and reads and writes the
    # fp32 accumulator once per micro-batch; a fused wgrad GEMM does it in its epilogue
    model = model_spec({**GPT_SMALL, "num_layers": 4})
    cluster = cluster_spec(A100_NODE)
    step_s = {}
    for fused in (True, False):
        training = training_spec({"global_batch_sequences": 8, "gradient_accumulation_fusion": fused})
        step_s[fused] = [
            float(predict_layouts(model, cluster, training, layouts(mbs=mbs))["step_time_s"][0]) for mbs in (1, 8)
        ]
    counts = parameter_counts(model)
    one = float(gradient_accumulation_time_s(counts.total, 4, cluster.hbm_bandwidth_bytes_per_s * 0.8))
    assert one == pytest.approx(counts.total * 10.0 / (cluster.hbm_bandwidth_bytes_per_s * 0.8))
    # (the stage's parameters leave out only the final LayerNorm's h)
    assert step_s[False][0] - step_s[True][0] == pytest.approx(8 * one, rel=1e-3)  # 8 micro-batches of 1
    assert step_s[False][1] - step_s[True][1] == pytest.approx(1 * one, rel=1e-3)  # 1 micro-batch of 8


def test_tied_embeddings_add_a_first_last_stage_gradient_allreduce_only_with_a_pipeline():
    cluster = cluster_spec(A100_NODE)
    training = training_spec({"global_batch_sequences": 4})
    link = LinkSpec(cluster.intra_node_bandwidth_bytes_per_s * _NVLINK_EFFICIENCY, cluster.intra_node_latency_s)
    dp_s = {}
    for tied in (False, True):
        model = model_spec({**GPT_SMALL, "tie_embeddings": tied})
        dp_s[tied] = [
            float(predict_layouts(model, cluster, training, layouts(pp=pp, tp=2))["dp_comm_exposed_s"][0])
            for pp in (1, 2)
        ]
    # fp32 gradient of the V/t x h embedding shard, all-reduced between the two stages
    expected = allreduce_time_s(4.0 * 100 * 64 / 2, 2, link)
    assert dp_s[True][1] - dp_s[False][1] == pytest.approx(expected)
    assert dp_s[True][0] == dp_s[False][0] == 0.0


@pytest.mark.parametrize("sequence_parallel, in_line", [(False, 2), (True, 3)])
def test_async_backward_collectives_hide_under_large_column_parallel_gemms(sequence_parallel, in_line):
    # Megatron's column-parallel linears reduce their input gradient (and, with sequence
    # parallelism, re-gather their input) asynchronously under their own GEMMs: with large
    # GEMMs only the forward's two all-reduce equivalents stay in line, plus, with sequence
    # parallelism, the output-gradient all-gathers of the two row-parallel linears (one more)
    model = model_spec(
        {"num_layers": 4, "hidden_size": 8192, "num_attention_heads": 64, "seq_length": 4096, "vocab_size": 32000}
    )
    cluster = cluster_spec({"preset": "dgx-h100", "nodes": 1})
    lay = layouts(dp=1, tp=8, mbs=1)
    t = {}
    for overlap in (False, True):
        training = training_spec(
            {"global_batch_sequences": 8, "sequence_parallel": sequence_parallel, "overlap_tp_backward": overlap}
        )
        t[overlap] = float(predict_layouts(model, cluster, training, lay)["tp_comm_s"][0])
    # per micro-batch: 4 layers x (4 -> in_line) collectives, plus the embedding's one in both;
    # the two column-parallel linears' hidden all-reduce's worth each still slows the GEMMs
    # under it (Lee et al. 2025)
    hidden = 4 * 2 * OVERLAP_COMPUTE_SLOWDOWN
    assert t[True] == pytest.approx(t[False] * (4 * in_line + hidden + 1) / (4 * 4 + 1))


def test_fp8_linears_run_against_the_measured_fp8_gemm_ceiling():
    # H100 FP8 MAMF is 70.9% of its peak against 80.3% for BF16 (Bekman): an FP8 linear
    # is not the BF16 one at twice the speed
    h100 = cluster_spec({"preset": "dgx-h100", "nodes": 1})
    assert h100.fp8_gemm_efficiency_max / h100.gemm_efficiency_max == pytest.approx(
        (1402.6 / 1979) / (794.5 / 989), rel=0.01
    )
    as_bf16 = cluster_spec({"preset": "dgx-h100", "nodes": 1, "fp8_gemm_efficiency_max": h100.gemm_efficiency_max})
    model = model_spec(
        {"num_layers": 4, "hidden_size": 8192, "num_attention_heads": 64, "seq_length": 4096, "vocab_size": 32000}
    )
    training = training_spec({"global_batch_sequences": 8, "precision": "fp8"})
    lay = layouts(dp=8, mbs=1)
    measured = float(predict_layouts(model, h100, training, lay)["compute_s"][0])
    idealised = float(predict_layouts(model, as_bf16, training, lay)["compute_s"][0])
    assert measured > idealised


def test_overlapping_tp_communication_hides_it_under_the_gemms():
    model = model_spec(
        {"num_layers": 4, "hidden_size": 8192, "num_attention_heads": 64, "seq_length": 4096, "vocab_size": 32000}
    )
    cluster = cluster_spec({"preset": "dgx-h100", "nodes": 1})
    plain = training_spec({"global_batch_sequences": 8, "overlap_tp_backward": False})
    overlapped = training_spec({"global_batch_sequences": 8, "overlap_tp_comm": True})
    lay = layouts(dp=1, tp=8, mbs=1)
    exposed = float(predict_layouts(model, cluster, overlapped, lay)["tp_comm_s"][0])
    full = float(predict_layouts(model, cluster, plain, lay)["tp_comm_s"][0])
    # with large GEMMs to hide under, only the first/last chunk (1/8) of each of the 4 x 4
    # layer collectives shows, and the hidden 7/8 slow the GEMMs they run under; the
    # embedding's all-reduce has no GEMM to hide under
    hidden = 4 * 4 * 7 / 8 * OVERLAP_COMPUTE_SLOWDOWN
    assert exposed == pytest.approx(full * (4 * 4 / 8 + hidden + 1) / (4 * 4 + 1))


def test_faster_nvlink_never_slows_a_fixed_layout_whose_end_stages_hold_different_layers():
    # 3 layers on 2 stages, the first two MoE: which end sheds the short layer must follow the
    # layers it would hold, not the average layer, or a cheaper embedding all-reduce tips the
    # two MoE layers onto one stage and the step slows down
    model = {
        "num_layers": 3,
        "hidden_size": 12288,
        "num_attention_heads": 48,
        "num_kv_heads": 8,
        "vocab_size": 7,
        "seq_length": 1000,
        "moe": {"num_experts": 60, "experts_per_token": 6, "expert_ffn_hidden_size": 14336, "moe_layers": [0, 1]},
    }
    # megatron-lm-2022's flags, on a stack that runs experts and uneven stages
    training = {
        "global_batch_sequences": 256,
        "precision": "fp8",
        "flash_attention": False,
        "overlap_grad_reduce": False,
        "overlap_p2p_comm": False,
        "dropout": True,
    }
    layout = [
        {
            "tp": 2,
            "pp": 2,
            "ep": 4,
            "etp": 2,
            "virtual_stages": 1,
            "micro_batch_size": 4,
            "zero_stage": 1,
            "recompute": "none",
        }
    ]
    nvlink = cluster_spec({"preset": "dgx-h100", "nodes": 2}).intra_node_bandwidth_bytes_per_s
    steps = [
        evaluate_layouts(
            model_spec(model),
            cluster_spec({"preset": "dgx-h100", "nodes": 2, "intra_node_bandwidth_bytes_per_s": nvlink * factor}),
            training_spec(training),
            layout_specs(layout),
        )[0].step_time_s
        for factor in (1.0, 1.2, 2.0)
    ]
    assert steps == sorted(steps, reverse=True)


def test_an_expensive_output_layer_moves_layers_off_the_last_stage():
    # a 256K vocabulary makes the logits cost several layers of this small model
    model = model_spec(
        {"num_layers": 13, "hidden_size": 1024, "num_attention_heads": 8, "seq_length": 2048, "vocab_size": 256000}
    )
    pred = predict_layouts(model, cluster_spec(A100_NODE), training_spec({"global_batch_sequences": 16}), layouts(pp=4))
    assert (float(pred["first_stage_layers"][0]), float(pred["last_stage_layers"][0])) == (4.0, 1.0)


def test_the_output_layer_runs_at_the_16_bit_rate_in_an_fp8_run():
    # DeepSeek-V3 (Sec. 3.3.1) and Megatron-Core keep the output head out of FP8: what a
    # larger vocabulary adds to the step is the same in an FP8 run as in a BF16 one
    cluster = cluster_spec({"preset": "dgx-h100", "nodes": 1})
    added = {}
    for precision in ("bf16", "fp8"):
        training = training_spec({"global_batch_sequences": 8, "precision": precision})
        compute = [
            float(
                predict_layouts(model_spec({**GPT_SMALL, "vocab_size": vocab}), cluster, training, layouts(dp=8))[
                    "compute_s"
                ][0]
            )
            for vocab in (1000, 64000)
        ]
        added[precision] = compute[1] - compute[0]
    assert added["fp8"] == pytest.approx(added["bf16"], rel=1e-9)


def test_layers_not_divisible_by_pp_rejected_only_when_uneven_stages_are_disallowed():
    model = {**GPT_SMALL, "num_layers": 6}
    strict = evaluate_layouts(
        model_spec(model),
        cluster_spec(A100_NODE),
        training_spec({"global_batch_sequences": 8}),
        layout_specs([{"pp": 4}]),
        constraints_spec({"allow_uneven_pp": False}),
    )[0]
    lenient = evaluate_layouts(
        model_spec(model),
        cluster_spec(A100_NODE),
        training_spec({"global_batch_sequences": 8}),
        layout_specs([{"pp": 4}]),
    )[0]
    assert any("6 layers are not divisible by pp=4" in r for r in strict.reasons)
    assert lenient.fits and any("uneven stages" in n for n in lenient.notes)


def test_a_model_shrunk_to_width_one_is_predicted_no_slower_than_a_small_one():
    # sub-tile matrix dimensions are charged once (their padded tile), not once per effect
    cluster = {"gpu": "h100", "num_nodes": 1, "gpus_per_node": 1}
    small = {"num_layers": 1, "hidden_size": 64, "num_attention_heads": 1, "vocab_size": 1000, "seq_length": 128}

    def step_s(**shrunk):
        (prediction,) = evaluate_layouts(
            model_spec({**small, **shrunk}),
            cluster_spec(cluster),
            training_spec({"global_batch_sequences": 1}),
            layout_specs([{"micro_batch_size": 1}]),
        )
        return prediction.step_time_s

    reference = step_s()
    for shrunk in ({"hidden_size": 1}, {"seq_length": 1}, {"vocab_size": 1}):
        assert step_s(**shrunk) <= reference


def test_a_72_gpu_nvlink_rack_keeps_a_36_way_tensor_group_inside_its_domain():
    model = {**GPT_SMALL, "num_layers": 8, "hidden_size": 9216, "num_attention_heads": 72, "seq_length": 4096}
    layout = [{"tp": 36, "pp": 1, "cp": 1}]
    training = {"global_batch_sequences": 16}
    (rack,) = evaluate_layouts(
        model_spec(model),
        cluster_spec({"preset": "gb200-nvl72", "nodes": 1}),
        training_spec(training),
        layout_specs(layout),
    )
    (nodes,) = evaluate_layouts(
        model_spec(model),
        cluster_spec({"preset": "dgx-b200", "nodes": 9}),
        training_spec(training),
        layout_specs(layout),
    )
    assert not any("spans" in reason for reason in rack.reasons)
    assert any("nodes of 8 GPUs: its per-layer all-reduces would leave" in reason for reason in nodes.reasons)
    assert rack.time_breakdown_s["tp_comm_s"] < nodes.time_breakdown_s["tp_comm_s"] / 5
