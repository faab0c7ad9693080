"""Specifications of the planner's expert dispatch and multi-head latent attention.

Expected values are worked by hand from the DeepSeek-V2/V3 technical reports (MLA,
node-limited routing, node-deduplicated dispatch) and the alpha-beta collectives
of ``partitioners.hardware.collectives``.
"""

from __future__ import annotations

import numpy as np
import pytest

from partitioners.errors import InvalidInput
from partitioners.hardware.collectives import LinkSpec, hierarchical_alltoall_time_s
from partitioners.parallel3d.comm import (
    deduplicated_dispatch_time_s,
    expected_distinct,
    expert_alltoall_time_s,
    expert_group_placement,
    nodes_within_reach,
)
from partitioners.parallel3d.cost import predict_layouts
from partitioners.parallel3d.flops import hardware_flops_per_step, model_flops_per_step, parameter_counts
from partitioners.parallel3d.memory import ACTIVATION_FRAGMENTATION, activation_bytes_per_layer, stage_activation_bytes
from partitioners.parallel3d.planner import evaluate_layouts
from partitioners.parallel3d.published.runs import DEEPSEEK_V3
from partitioners.parallel3d.stages import RECOMPUTE_NONE, RECOMPUTE_SELECTIVE, end_stage_moe_layers
from tests.partitioners.parallel3d.layouts import layouts, selective_saving_bytes
from tests.partitioners.parallel3d.shapes import cluster_spec, layout_specs, model_spec, training_spec

NVLINK = LinkSpec(bandwidth_bytes_per_s=400e9, latency_s=2e-6)
IB = LinkSpec(bandwidth_bytes_per_s=50e9, latency_s=5e-6)

SMALL_MLA = {
    "num_layers": 2,
    "hidden_size": 64,
    "num_attention_heads": 4,
    "seq_length": 32,
    "vocab_size": 100,
    "mla": {"q_lora_rank": 24, "kv_lora_rank": 16, "qk_nope_head_dim": 8, "qk_rope_head_dim": 4, "v_head_dim": 8},
}


# ---------------------------------------------------------------- expert-parallel placement


def test_expert_group_members_sharing_a_node_follow_the_tensor_and_context_stride():
    local, groups = expert_group_placement(np.array([1, 2, 8, 1]), np.array([16, 16, 4, 4]), 8)
    assert local.tolist() == [8, 4, 1, 4]
    assert groups.tolist() == [2, 4, 4, 1]


def test_an_expert_group_spanning_two_nodes_sends_half_its_all_to_all_over_the_network():
    n_bytes = 64e6
    spanning = expert_alltoall_time_s(np.array([n_bytes]), np.array([1]), np.array([16]), 8, NVLINK, IB)
    assert spanning[0] == pytest.approx(hierarchical_alltoall_time_s(n_bytes, 8, 2, NVLINK, IB))
    # 8 of 16 peers are remote: half the buffer crosses the network, not 15/16 of it
    assert spanning[0] == pytest.approx(8 * IB.latency_s + n_bytes / 2 / IB.bandwidth_bytes_per_s)


def test_an_expert_group_inside_one_node_exchanges_over_nvlink_only():
    inside = expert_alltoall_time_s(np.array([64e6]), np.array([1]), np.array([8]), 8, NVLINK, IB)
    assert inside[0] == pytest.approx(7 * NVLINK.latency_s + 7 / 8 * 64e6 / NVLINK.bandwidth_bytes_per_s)


# ---------------------------------------------------------------- node-deduplicated dispatch


def test_expected_distinct_nodes_of_eight_experts_on_four_nodes():
    assert float(expected_distinct(4, 8)) == pytest.approx(4 * (1 - 0.75**8))
    assert float(expected_distinct(1, 8)) == 1.0


def test_group_limited_routing_with_a_group_a_node_caps_the_network_bytes_of_a_deduplicated_dispatch():
    # DeepSeek-V3: 8 groups, 4 per token, ep 64 over 8 nodes -- one group a node
    token_bytes = 10e6
    args = dict(experts_per_token=8, stride=np.array([1]), ep=np.array([64]), gpus_per_node=8, intra=NVLINK, inter=IB)
    limited = deduplicated_dispatch_time_s(np.array([token_bytes]), num_groups=8, group_topk=4, **args)[0]
    unlimited = deduplicated_dispatch_time_s(np.array([token_bytes]), num_groups=None, group_topk=None, **args)[0]
    # at most 4 of 8 nodes: 4 (1 - (3/4)^8) reached, 7/8 of them remote
    remote = 4 * (1 - 0.75**8) * 7 / 8
    assert limited == pytest.approx(7 * IB.latency_s + token_bytes * remote / IB.bandwidth_bytes_per_s)
    assert unlimited == pytest.approx(
        7 * IB.latency_s + token_bytes * 8 * (1 - (7 / 8) ** 8) * 7 / 8 / IB.bandwidth_bytes_per_s
    )
    assert limited < unlimited


def test_a_wider_expert_group_lets_a_token_reach_more_nodes_through_the_same_groups():
    # 8 groups over 32 nodes: each group covers 4 nodes, 4 groups 16 of them
    assert nodes_within_reach(np.array([32.0]), 8, 4)[0] == 16.0
    assert nodes_within_reach(np.array([8.0]), 8, 4)[0] == 4.0
    # 8 groups on 2 nodes, four on each: 4 groups land on 2 (1 - (1/2)^4) nodes
    assert nodes_within_reach(np.array([2.0]), 8, 4)[0] == pytest.approx(2 * (1 - 0.5**4))
    assert nodes_within_reach(np.array([32.0]), None, None)[0] == 32.0


def test_routing_groups_must_divide_the_experts_and_come_in_pairs():
    moe = dict(DEEPSEEK_V3["moe"])
    for bad, field in (({"num_groups": 7}, "model.moe.num_groups"), ({"group_topk": None}, "model.moe.group_topk")):
        with pytest.raises(InvalidInput) as err:
            model_spec({**DEEPSEEK_V3, "moe": {**moe, **bad}})
        assert err.value.field == field


def test_deduplication_sends_fewer_network_bytes_than_one_message_per_expert():
    tokens_bytes = 10e6  # one copy of the micro-batch's tokens
    dedup = deduplicated_dispatch_time_s(
        np.array([tokens_bytes]), 8, 8, 4, np.array([1]), np.array([64]), 8, NVLINK, IB
    )[0]
    per_expert = expert_alltoall_time_s(np.array([8 * tokens_bytes]), np.array([1]), np.array([64]), 8, NVLINK, IB)[0]
    # ~3.2 remote nodes per token (7 peers to reach) against 8 x 56/64 = 7 remote expert
    # copies (56 peers)
    remote = 4 * (1 - 0.75**8) * 7 / 8
    assert dedup == pytest.approx(7 * IB.latency_s + tokens_bytes * remote / IB.bandwidth_bytes_per_s)
    assert per_expert == pytest.approx(56 * IB.latency_s + tokens_bytes * 7 / IB.bandwidth_bytes_per_s)


def test_the_planner_charges_deduplicated_fp8_dispatch_less_than_the_all_to_all():
    cluster = cluster_spec({"preset": "hgx-h800", "nodes": 8})
    model = model_spec(DEEPSEEK_V3)
    lay = layouts(dp=64, ep=64, mbs=1)
    ep_comm = {}
    for dispatch in ("all-to-all", "node-deduplicated"):
        training = training_spec({"global_batch_sequences": 64, "precision": "fp8", "expert_dispatch": dispatch})
        ep_comm[dispatch] = float(predict_layouts(model, cluster, training, lay)["ep_comm_s"][0])
    assert 0.0 < ep_comm["node-deduplicated"] < 0.5 * ep_comm["all-to-all"]


def test_an_unknown_expert_dispatch_is_invalid_input():
    with pytest.raises(InvalidInput) as err:
        training_spec({"global_batch_sequences": 8, "expert_dispatch": "broadcast"})
    assert err.value.field == "training.expert_dispatch"


# ---------------------------------------------------------------- multi-head latent attention


def test_deepseek_v3_counts_its_published_671b_parameters_37b_active():
    counts = parameter_counts(model_spec(DEEPSEEK_V3))
    # DeepSeek-V3 Technical Report: "671B total parameters with 37B activated for each
    # token" (the multi-token-prediction module, 14B more, is not part of the count)
    assert counts.total == pytest.approx(671e9, rel=0.005)
    assert counts.active_per_token == pytest.approx(37e9, rel=0.03)


def test_mla_attention_parameters_are_its_five_projections_and_two_latent_norms():
    h, a, q_r, kv_r, nope, rope, v = 64, 4, 24, 16, 8, 4, 8
    expected = (
        h * q_r + q_r * a * (nope + rope) + h * (kv_r + rope) + kv_r * a * (nope + v) + a * v * h + q_r + kv_r + 2 * h
    )
    counts = parameter_counts(model_spec(SMALL_MLA))
    assert counts.attention_per_layer == expected
    # the down-projections and latent norms are whole on every tensor-parallel rank
    assert counts.attention_replicated_per_layer == h * q_r + h * (kv_r + rope) + q_r + kv_r
    replicated = counts.attention_replicated_per_layer
    assert float(counts.attention_per_gpu(4)) == pytest.approx((expected - replicated) / 4 + replicated)


def test_mla_scores_run_over_the_query_key_width_and_the_value_width():
    # per token and layer, QK^T costs 2 s a (nope + rope) and attention x V 2 s a v_head_dim;
    # everything else is the same per token at any sequence length
    long, short = (model_spec({**SMALL_MLA, "seq_length": s}) for s in (32, 1))
    per_token_gap = model_flops_per_step(long, 1) / 32 - model_flops_per_step(short, 1) / 1
    assert per_token_gap == pytest.approx(3 * 2 * 2 * (32 - 1) * (4 * (8 + 4) + 4 * 8))


def test_selective_recomputation_under_mla_rebuilds_queries_keys_and_values_from_the_latents():
    model = model_spec(SMALL_MLA)
    training = training_spec({"global_batch_sequences": 1})
    q, k, v = 4 * 12, 4 * 12, 4 * 8
    norm_outputs = 64 + 64 + (24 + 16 + 4)  # elements: the two layer norms' outputs and the normed latents
    activation_output = 4 * 64  # the 4h GeLU MLP's, rebuilt in every layer
    saved = selective_saving_bytes(model, training, tokens=32, tp=1)
    assert saved == pytest.approx(32 * 2 * (q + k + v + norm_outputs + activation_output))
    # ... and executes the two up-projections once more, beside the attention scores
    up_flops = 2 * (24 * 4 * 12 + 16 * 4 * (8 + 8)) * model.num_layers * 32
    score_flops = 2 * 32 * (4 * 12 + 4 * 8) * model.num_layers * 32
    hardware = hardware_flops_per_step(model, 1, np.array([RECOMPUTE_SELECTIVE, RECOMPUTE_NONE]))
    assert hardware[0] - hardware[1] == pytest.approx(up_flops + score_flops)


def test_mla_refuses_head_dim_and_grouped_kv_heads():
    for extra in ({"head_dim": 16}, {"num_kv_heads": 2}):
        with pytest.raises(InvalidInput) as err:
            model_spec({**SMALL_MLA, **extra})
        assert err.value.code == "mla-with-head-fields"


def test_mla_needs_its_ranks_and_head_widths():
    with pytest.raises(InvalidInput) as err:
        model_spec({**SMALL_MLA, "mla": {"kv_lora_rank": 16}})
    assert err.value.field == "model.mla.qk_nope_head_dim"


def test_deepseek_v3_published_layout_fits_with_up_projection_recomputation():
    # 2048 H800, tp 1, pp 16, ep 64 (DeepSeek-V3 Technical Report, Sec. 3.2)
    training = {
        "global_batch_sequences": 15360,
        "precision": "fp8",
        "expert_dispatch": "node-deduplicated",
        "overlap_ep_comm": True,
    }
    layouts_asked = [{"tp": 1, "pp": 16, "ep": 64, "cp": 1, "recompute": rc} for rc in ("none", "selective")]
    none, selective = evaluate_layouts(
        model_spec(DEEPSEEK_V3),
        cluster_spec({"preset": "hgx-h800", "nodes": 256}),
        training_spec(training),
        layout_specs(layouts_asked),
    )
    assert any(reason.startswith("out of memory") for reason in none.reasons)
    assert not selective.reasons
    assert selective.memory.activations_bytes < none.memory.activations_bytes


def test_the_end_stages_hold_the_model_s_own_first_and_last_layers_dense_or_moe():
    def moe_at_ends(num_layers, moe_layers, first, last, per_stage=4.0, moe_per_stage=4.0, v=1.0):
        counts = end_stage_moe_layers(
            num_layers, moe_layers, True, np.array(first, float), np.array(last, float), per_stage, moe_per_stage, v
        )
        return [list(c) for c in counts]

    # DeepSeek-V3: layers 0-2 dense, 3-60 MoE
    assert moe_at_ends(61, tuple(range(3, 61)), [4, 2], [1, 3]) == [[1, 0], [1, 3]]
    # MoE every other layer (1, 3, 5, 7)
    assert moe_at_ends(8, (1, 3, 5, 7), [3], [3]) == [[1], [2]]
    # every layer MoE
    assert moe_at_ends(8, None, [3], [2]) == [[3], [2]]
    # interleaved, 4 chunks of one layer per rank: the first rank's first chunk is layer 0
    # (dense), its other three come from inside the model (MoE)
    assert moe_at_ends(61, tuple(range(3, 61)), [4], [4], v=4.0) == [[3], [4]]


def test_deepseek_v3_with_its_prediction_module_still_fits_its_published_layout():
    # the module sends the spare layers to the first stage, which holds the three dense
    # layers: lighter in activations than MoE layers, so the published layout still fits
    training = {
        "global_batch_sequences": 15360,
        "precision": "fp8",
        "expert_dispatch": "node-deduplicated",
        "overlap_ep_comm": True,
        "fp8_params": False,
    }
    (published,) = evaluate_layouts(
        model_spec({**DEEPSEEK_V3, "mtp_layers": 1}),
        cluster_spec({"preset": "hgx-h800", "nodes": 256}),
        training_spec(training),
        layout_specs([{"tp": 1, "pp": 16, "ep": 64, "cp": 1, "recompute": "selective"}]),
    )
    assert not published.reasons


# ---------------------------------------------------------------- multi-token prediction

SMALL_MTP_MOE = {
    "num_layers": 4,
    "hidden_size": 64,
    "num_attention_heads": 4,
    "seq_length": 32,
    "vocab_size": 100,
    "gated_mlp": True,
    "moe": {
        "num_experts": 4,
        "experts_per_token": 2,
        "expert_ffn_hidden_size": 16,
        "shared_experts": 1,
        "moe_layers": [1, 2, 3],
    },
}


def test_a_multi_token_prediction_module_adds_a_layer_of_the_last_kind_a_2h_projection_and_two_norms():
    # DeepSeek-V3 Sec. 2.2: the embedding and the output head are shared with the main model
    without, with_one = (parameter_counts(model_spec({**SMALL_MTP_MOE, "mtp_layers": d})) for d in (0, 1))
    moe_layer = without.attention_per_layer + without.experts_per_layer + without.moe_shared_per_layer
    assert with_one.total - without.total == pytest.approx(moe_layer + 2 * 64 * 64 + 2 * 64)


def test_multi_token_prediction_flops_add_a_layer_its_projection_and_a_second_pass_through_the_output_head():
    h, s, v = 64, 32, 100
    plain = {**SMALL_MTP_MOE, "moe": None}
    per_token = {d: model_flops_per_step(model_spec({**plain, "mtp_layers": d}), 1) / s for d in (0, 1)}
    layer = 2 * (4 * h * h) + 2 * s * (h + h) + 2 * 3 * h * (4 * h)  # projections, scores, SwiGLU MLP
    assert per_token[1] - per_token[0] == pytest.approx(3 * (layer + 2 * (2 * h) * h + 2 * h * v))


def test_multi_token_prediction_runs_on_the_last_pipeline_stage():
    cluster = cluster_spec({"preset": "dgx-a100", "nodes": 1})
    training = training_spec({"global_batch_sequences": 8})
    # seven dense layers on three stages of three: the two left over come off the ends, one
    # each, until the module loads the last stage and both come off it
    seven = {**SMALL_MTP_MOE, "num_layers": 7, "moe": None}
    pred = {
        d: predict_layouts(model_spec({**seven, "mtp_layers": d}), cluster, training, layouts(dp=2, pp=3))
        for d in (0, 1)
    }
    assert [(pred[d]["first_stage_layers"][0], pred[d]["last_stage_layers"][0]) for d in (0, 1)] == [(2, 2), (3, 1)]
    assert pred[1]["step_time_s"][0] > pred[0]["step_time_s"][0]


def test_a_negative_multi_token_prediction_depth_is_invalid_input():
    with pytest.raises(InvalidInput) as err:
        model_spec({**SMALL_MTP_MOE, "mtp_layers": -1})
    assert err.value.field == "model.mtp_layers"


def test_the_last_stage_keeps_one_micro_batch_of_the_modules_layer_input_and_logits():
    training = training_spec({"global_batch_sequences": 8, "sequence_parallel": False})
    tokens, tp, rc = np.array([32.0]), np.array([1.0]), np.array([RECOMPUTE_NONE])
    one = np.array([1.0])
    last = {}
    for d in (0, 1):
        model = model_spec({**SMALL_MTP_MOE, "moe": None, "mtp_layers": d})
        last[d] = stage_activation_bytes(
            model, training, tokens, tp, rc, 0.0 * one, 2 * one, 0 * one, 2 * one, 2 * one, 2 * one, one, 4 * one
        ).last_bytes
    layer = float(activation_bytes_per_layer(model, training, tokens, tp, rc)[0])
    logits = 4 * 32 * 100  # fp32
    normed_input = 2 * 2 * 64 * 32  # the concatenated 2h input of the projection, bf16
    assert last[1][0] - last[0][0] == pytest.approx((layer + logits + normed_input) * (1 + ACTIVATION_FRAGMENTATION))


def test_mla_widths_given_under_their_hugging_face_names_beside_the_other_fields_are_read_as_mla():
    widths = {"q_lora_rank": 24, "kv_lora_rank": 16, "qk_nope_head_dim": 8, "qk_rope_head_dim": 4, "v_head_dim": 8}
    shape = {"num_layers": 2, "hidden_size": 64, "num_attention_heads": 4, "seq_length": 32, "vocab_size": 100}
    flat = model_spec({**shape, **widths})
    nested = model_spec({**shape, "mla": widths})
    assert flat == nested and flat.mla is not None and flat.mla.kv_lora_rank == 16


def test_mla_widths_in_two_places_are_refused():
    shape = {"num_layers": 2, "hidden_size": 64, "num_attention_heads": 4, "seq_length": 32, "vocab_size": 100}
    widths = {"kv_lora_rank": 16, "qk_nope_head_dim": 8, "qk_rope_head_dim": 4, "v_head_dim": 8}
    with pytest.raises(InvalidInput) as error:
        model_spec({**shape, "kv_lora_rank": 16, "mla": widths})
    assert error.value.field == "model.kv_lora_rank"
