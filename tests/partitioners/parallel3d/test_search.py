"""The layout search and its reasons (partitioners.parallel3d.planner).

Expected values are worked by hand from the published formulas the docstrings
cite: Narayanan et al. SC21 (FLOPs, bubble), Korthikanti et al. 2022 (activation
memory), ZeRO (bytes per parameter per stage).
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from partitioners.errors import InvalidInput
from partitioners.parallel3d.planner import (
    enumerate_layouts,
    evaluate_layouts,
    plan_parallel_layout,
)
from tests.partitioners.parallel3d.shapes import (
    A100_NODE,
    GPT_SMALL,
    RECOMPUTE_CLUSTER,
    RECOMPUTE_MODEL,
    cluster_spec,
    constraints_spec,
    layout_specs,
    model_spec,
    training_spec,
)

SMALL_MOE = {
    **GPT_SMALL,
    "num_layers": 8,
    "moe": {"num_experts": 16, "experts_per_token": 2, "expert_ffn_hidden_size": 128},
}


_LAYOUT_FIELDS = (
    "dp",
    "tp",
    "pp",
    "cp",
    "ep",
    "virtual_stages",
    "micro_batch_size",
    "zero_stage",
    "recompute",
    "recompute_num_layers",
)


def test_small_model_on_one_node_is_pure_data_parallel():
    gpt2_small = {
        "num_layers": 12,
        "hidden_size": 768,
        "num_attention_heads": 12,
        "seq_length": 1024,
        "vocab_size": 50257,
    }
    plan = plan_parallel_layout(
        model_spec(gpt2_small), cluster_spec(A100_NODE), training_spec({"global_batch_sequences": 256})
    )
    best = plan.candidates[0]
    assert (best.dp, best.tp, best.pp) == (8, 1, 1)


def test_each_ranked_candidate_is_a_different_tensor_and_pipeline_split():
    llama_70b = {
        "num_layers": 80,
        "hidden_size": 8192,
        "num_attention_heads": 64,
        "num_kv_heads": 8,
        "ffn_hidden_size": 28672,
        "gated_mlp": True,
        "seq_length": 8192,
        "vocab_size": 128256,
    }
    plan = plan_parallel_layout(
        model_spec(llama_70b),
        cluster_spec({"preset": "dgx-h100", "nodes": 8}),
        training_spec({"global_batch_sequences": 128}),
        top_k=6,
        with_rank_map=False,
    )
    splits = [(c.tp, c.pp) for c in plan.candidates]
    assert len(splits) == 6
    assert len(set(splits)) == len(splits)


def test_layouts_within_the_tolerance_of_the_fastest_are_flagged_as_ties():
    plan = plan_parallel_layout(
        model_spec({**GPT_SMALL, "num_layers": 4}),
        cluster_spec(A100_NODE),
        training_spec({"global_batch_sequences": 64}),
        constraints_spec({"tie_tolerance": 0.4}),
    )
    fastest = min(c.step_time_s for c in plan.candidates)
    ties = [c for c in plan.candidates if c.tie_with_best]
    assert len(ties) >= 2
    assert all(c.step_time_s <= fastest * 1.4 for c in ties)
    assert all(c.step_time_s > fastest * 1.4 for c in plan.candidates if not c.tie_with_best)


def test_ties_rank_fastest_first_among_the_roomy_ones_and_then_among_the_tight_ones():
    gpt_13b = {
        "num_layers": 64,
        "hidden_size": 8192,
        "num_attention_heads": 64,
        "seq_length": 2048,
        "vocab_size": 51200,
    }
    plan = plan_parallel_layout(
        model_spec(gpt_13b),
        cluster_spec({"preset": "dgx-a100", "nodes": 2}),
        training_spec({"global_batch_sequences": 128}),
        constraints_spec({"tie_tolerance": 0.3}),
        with_rank_map=False,
    )
    order = [
        (any(n.startswith("tight memory") for n in c.notes), c.step_time_s) for c in plan.candidates if c.tie_with_best
    ]
    assert sum(not tight for tight, _ in order) >= 2
    assert order == sorted(order)


def test_ties_that_fit_only_if_the_allocator_wastes_little_rank_after_the_roomy_ones():
    gpt_13b = {
        "num_layers": 64,
        "hidden_size": 8192,
        "num_attention_heads": 64,
        "seq_length": 2048,
        "vocab_size": 51200,
    }
    plan = plan_parallel_layout(
        model_spec(gpt_13b),
        cluster_spec({"preset": "dgx-a100", "nodes": 2}),
        training_spec({"global_batch_sequences": 128}),
        constraints_spec({"tie_tolerance": 0.3}),
        with_rank_map=False,
    )
    tight = [any(n.startswith("tight memory") for n in c.notes) for c in plan.candidates if c.tie_with_best]
    assert True in tight and False in tight
    assert tight == sorted(tight)


def test_interleaving_needs_whole_rounds_of_micro_batches_and_two_stages_or_three_with_batched_exchanges():
    model = model_spec({**GPT_SMALL, "num_layers": 24})
    cluster = cluster_spec({"preset": "dgx-a100", "nodes": 2})
    fewest_stages = {}
    for overlap_p2p_comm in (True, False):
        training = training_spec(
            {"global_batch_sequences": 24, "overlap_p2p_comm": overlap_p2p_comm, "flexible_microbatch_groups": False}
        )
        lay = enumerate_layouts(model, cluster, training, constraints_spec(None))
        interleaved = lay.v > 1
        fewest_stages[overlap_p2p_comm] = lay.pp[interleaved].min()
        micro_batches = np.ceil(24 / (lay.dp * lay.mbs))
        assert np.all(micro_batches[interleaved] % lay.pp[interleaved] == 0)
    # 16 GPUs: pp 2, then 4 (3 does not divide them)
    assert fewest_stages == {True: 2, False: 4}


def test_evaluate_searches_an_unstated_interleaving_depth_and_keeps_a_stated_one():
    model = {"num_layers": 48, "hidden_size": 4096, "num_attention_heads": 32, "seq_length": 2048, "vocab_size": 51200}
    cluster = {"preset": "dgx-a100", "nodes": 4}
    training = {"global_batch_sequences": 64}
    fixed = {"tp": 8, "pp": 4, "micro_batch_size": 1, "recompute": "none", "zero_stage": 1}
    (searched,) = evaluate_layouts(
        model_spec(model), cluster_spec(cluster), training_spec(training), layout_specs([fixed])
    )
    by_depth = {
        v: evaluate_layouts(
            model_spec(model),
            cluster_spec(cluster),
            training_spec(training),
            layout_specs([{**fixed, "virtual_stages": v}]),
        )[0]
        for v in (1, 2, 3, 4, 6, 12)
    }
    fastest = min(by_depth.values(), key=lambda p: p.step_time_s)
    assert searched.virtual_stages == fastest.virtual_stages > 1
    assert searched.step_time_s == pytest.approx(fastest.step_time_s)
    assert by_depth[1].virtual_stages == 1


def test_an_interleaved_two_stage_pipeline_runs_with_asynchronous_pipeline_exchanges():
    # Megatron-LM asks for pp > 2 only when interleaved sends and receives are batched
    # (overlap_p2p_comm off); Megatron-Bridge's Qwen3-30B-A3B H100 recipe runs pp 2 x vp 24
    (pred,) = evaluate_layouts(
        model_spec({**GPT_SMALL, "num_layers": 8}),
        cluster_spec(A100_NODE),
        training_spec({"global_batch_sequences": 8}),
        layout_specs([{"tp": 1, "pp": 2, "virtual_stages": 2}]),
    )
    assert (pred.pp, pred.virtual_stages) == (2, 2)


def test_evaluating_an_interleaved_two_stage_pipeline_with_batched_exchanges_is_invalid_input_naming_the_rule():
    with pytest.raises(InvalidInput) as err:
        evaluate_layouts(
            model_spec({**GPT_SMALL, "num_layers": 8}),
            cluster_spec(A100_NODE),
            training_spec({"global_batch_sequences": 8, "overlap_p2p_comm": False}),
            layout_specs([{"tp": 1, "pp": 2, "virtual_stages": 2}]),
        )
    assert err.value.code == "interleaving-not-possible"
    assert "pp >= 3" in str(err.value)


def test_evaluating_expert_groups_the_ranks_cannot_hold_names_ep_not_the_schedule():
    # 8 GPUs at tp 2, pp 2: dp 2, and 8 expert ranks are neither a divisor of dp nor whole tp blocks of it
    with pytest.raises(InvalidInput) as err:
        evaluate_layouts(
            model_spec(SMALL_MOE),
            cluster_spec(A100_NODE),
            training_spec({"global_batch_sequences": 8}),
            layout_specs([{"tp": 2, "pp": 2, "cp": 1, "ep": 8, "virtual_stages": 2}]),
        )
    assert err.value.code == "does-not-divide"
    assert err.value.field == "evaluate[0].ep"
    assert "8 expert groups cannot be cut from dp=2 x tp=2 x cp=1" in str(err.value)


def test_expert_groups_larger_than_dp_are_folded_over_the_tensor_ranks():
    # Megatron-Bridge's Qwen3-235B-A22B H100 recipe: tp 2, ep 32 on 256 GPUs at pp 8 (dp 16)
    (pred,) = evaluate_layouts(
        model_spec(SMALL_MOE),
        cluster_spec(A100_NODE),
        training_spec({"global_batch_sequences": 8}),
        layout_specs([{"tp": 2, "pp": 2, "cp": 1, "ep": 4}]),
    )
    assert (pred.dp, pred.ep, pred.etp) == (2, 4, 1)
    assert pred.fits


def test_heads_not_divisible_by_tp_is_rejected_with_reason():
    model = {**GPT_SMALL, "hidden_size": 96, "num_attention_heads": 6}
    (pred,) = evaluate_layouts(
        model_spec(model),
        cluster_spec(A100_NODE),
        training_spec({"global_batch_sequences": 8}),
        layout_specs([{"tp": 4}]),
    )
    assert not pred.fits
    assert any("not divisible by tp=4" in r for r in pred.reasons)


def test_tp_crossing_a_node_is_rejected_with_reason():
    (pred,) = evaluate_layouts(
        model_spec({**GPT_SMALL, "num_attention_heads": 16}),
        cluster_spec({"preset": "dgx-a100", "nodes": 2}),
        training_spec({"global_batch_sequences": 8}),
        layout_specs([{"tp": 16}]),
    )
    assert any("spans 2 nodes" in r for r in pred.reasons)


def test_tp_that_does_not_divide_a_node_is_rejected_as_straddling_nodes():
    cluster = {
        "gpus_per_node": 6,
        "num_nodes": 2,
        "peak_flops_per_s": {"bf16": 1e15},
        "memory_bytes": 8e10,
        "intra_node_bandwidth_bytes_per_s": 4e11,
        "inter_node_bandwidth_bytes_per_s": 5e10,
    }
    (pred,) = evaluate_layouts(
        model_spec({**GPT_SMALL, "num_attention_heads": 4}),
        cluster_spec(cluster),
        training_spec({"global_batch_sequences": 12}),
        layout_specs([{"tp": 4}]),
    )
    assert any("does not divide the 6 GPUs of a node" in r for r in pred.reasons)


def test_model_too_large_for_the_cluster_answers_infeasible_with_a_reason():
    huge = {"num_layers": 48, "hidden_size": 16384, "num_attention_heads": 128, "seq_length": 2048, "vocab_size": 51200}
    plan = plan_parallel_layout(model_spec(huge), cluster_spec(A100_NODE), training_spec({"global_batch_sequences": 8}))
    assert not plan.feasible and plan.candidates == ()
    assert plan.notes[0].startswith("no layout can run") and "out-of-memory" in plan.notes[0]
    assert any("smallest footprint" in note for note in plan.notes)
    assert plan.infeasible_error().code == "no-layout-fits"


def test_layer_count_no_allowed_pp_divides_answers_with_the_blocking_reason():
    # 7 layers on 8 GPUs without ZeRO: tp <= 4 (4 heads) and pp in {2, 4, 8} would fit, but none
    # divides 7; pp = 1 runs out of memory
    model = {"num_layers": 7, "hidden_size": 16384, "num_attention_heads": 4, "seq_length": 2048, "vocab_size": 51200}
    plan = plan_parallel_layout(
        model_spec(model),
        cluster_spec(A100_NODE),
        training_spec({"global_batch_sequences": 8}),
        constraints_spec({"allow_uneven_pp": False, "zero_stages": [0]}),
    )
    assert not plan.feasible
    assert plan.rejection_counts["layers-not-divisible-by-pp"] > 0
    assert any("7 layers are not divisible by pp" in note for note in plan.notes)


def test_faster_looking_rejected_layouts_are_reported_with_reasons():
    gpt3 = {"num_layers": 96, "hidden_size": 12288, "num_attention_heads": 96, "seq_length": 2048, "vocab_size": 51200}
    plan = plan_parallel_layout(
        model_spec(gpt3),
        cluster_spec({"preset": "dgx-a100", "nodes": 8}),
        training_spec({"global_batch_sequences": 64}),
    )
    assert plan.feasible
    assert all(r.reasons and r.step_time_s < plan.candidates[0].step_time_s for r in plan.rejected)


def test_plan_is_json_serialisable_and_deterministic():
    args = (
        model_spec({**GPT_SMALL, "num_layers": 4}),
        cluster_spec({"preset": "dgx-h100", "nodes": 2}),
        training_spec({"global_batch_sequences": 64}),
    )
    first = json.dumps(plan_parallel_layout(*args).to_dict(rank_map_limit=4))
    assert first == json.dumps(plan_parallel_layout(*args).to_dict(rank_map_limit=4))


def test_costing_in_chunks_gives_the_same_plan(monkeypatch):
    import partitioners.parallel3d.planner as planner

    args = (
        model_spec({**GPT_SMALL, "num_layers": 4}),
        cluster_spec({"preset": "dgx-a100", "nodes": 2}),
        training_spec({"global_batch_sequences": 64}),
    )
    whole = plan_parallel_layout(*args).to_dict(rank_map_limit=0)
    monkeypatch.setattr(planner, "_CHUNK", 7)
    assert plan_parallel_layout(*args).to_dict(rank_map_limit=0) == whole


def test_evaluate_keeps_the_fixed_fields_and_fills_the_rest():
    (pred,) = evaluate_layouts(
        model_spec({**GPT_SMALL, "num_layers": 4}),
        cluster_spec(A100_NODE),
        training_spec({"global_batch_sequences": 64}),
        layout_specs([{"tp": 2, "pp": 2, "zero_stage": 1}]),
    )
    assert (pred.dp, pred.tp, pred.pp, pred.zero_stage) == (2, 2, 2, 1)
    assert pred.fits and pred.micro_batch_size >= 1


@pytest.mark.parametrize("recompute", ["none", "selective", "full"])
def test_a_candidate_sent_back_to_evaluate_is_predicted_as_it_was(recompute):
    args = (
        model_spec({**GPT_SMALL, "num_layers": 8}),
        cluster_spec({"preset": "dgx-a100", "nodes": 2}),
        training_spec({"global_batch_sequences": 64}),
    )
    plan = plan_parallel_layout(*args, constraints_spec({"recompute": [recompute]}))
    for candidate in plan.candidates[:3]:
        layout = {name: value for name, value in candidate.to_dict().items() if name in _LAYOUT_FIELDS}
        (again,) = evaluate_layouts(*args, layout_specs([layout]))
        searched = candidate.to_dict()
        # whether it ties with the fastest is a fact about the search, not the layout
        searched["notes"] = [note for note in searched["notes"] if not note.startswith("within")]
        searched["tie_with_best"] = False
        assert again.to_dict() == searched


@pytest.mark.parametrize(
    ("layout", "field"),
    [
        ({"tp": 3}, "evaluate[0].tp"),
        ({"pp": 0}, "evaluate[0].pp"),
        ({"zero_stage": 4}, "evaluate[0].zero_stage"),
        ({"recompute": "some"}, "evaluate[0].recompute"),
        ({"ep": 2}, "evaluate[0].ep"),
        ({"tpp": 2}, "evaluate[0].tpp"),
    ],
)
def test_a_bad_evaluated_layout_is_invalid_input_naming_its_field(layout, field):
    with pytest.raises(InvalidInput) as err:
        evaluate_layouts(
            model_spec(GPT_SMALL),
            cluster_spec(A100_NODE),
            training_spec({"global_batch_sequences": 64}),
            layout_specs([layout]),
        )
    assert err.value.field == field and "evaluate[0]" in str(err.value)


def test_recompute_num_layers_beside_selective_recomputation_is_a_contradiction():
    with pytest.raises(InvalidInput, match="needs recompute 'full'") as err:
        evaluate_layouts(
            model_spec(GPT_SMALL),
            cluster_spec(A100_NODE),
            training_spec({"global_batch_sequences": 64}),
            layout_specs([{"recompute": "selective", "recompute_num_layers": 2}]),
        )
    assert err.value.field == "evaluate[0].recompute_num_layers"


def test_a_virtual_stage_count_no_split_admits_is_the_reason_given_for_an_empty_answer():
    plan = plan_parallel_layout(
        model_spec(RECOMPUTE_MODEL),
        cluster_spec(RECOMPUTE_CLUSTER),
        # whole chunks only (megatron-core would place 32 / 3 layers in uneven chunks)
        training_spec({"global_batch_sequences": 64, "software": "megatron-lm-2022"}),
        constraints_spec({"virtual_stages": 3}),
        with_rank_map=False,
    )
    assert not plan.candidates
    assert plan.notes[0].startswith("constraints.virtual_stages=3 leaves no layout")
