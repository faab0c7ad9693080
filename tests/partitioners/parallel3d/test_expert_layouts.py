"""Expert-parallel layouts: split and folded experts (partitioners.parallel3d.planner).

Expected values are worked by hand from the published formulas the docstrings
cite: Narayanan et al. SC21 (FLOPs, bubble), Korthikanti et al. 2022 (activation
memory), ZeRO (bytes per parameter per stage).
"""

from __future__ import annotations

import pytest

from partitioners.errors import InvalidInput
from partitioners.parallel3d.flops import parameter_counts
from partitioners.parallel3d.planner import (
    evaluate_layouts,
    expert_groups_fit,
    plan_parallel_layout,
)
from tests.partitioners.parallel3d.shapes import (
    A100_NODE,
    GPT_SMALL,
    cluster_spec,
    constraints_spec,
    layout_specs,
    model_spec,
    training_spec,
)

MOE_BLOCKS = {
    "num_layers": 4,
    "hidden_size": 2048,
    "num_attention_heads": 16,
    "seq_length": 4096,
    "vocab_size": 32000,
    "moe": {"num_experts": 16, "experts_per_token": 2, "expert_ffn_hidden_size": 1408},
}


def _folded_and_split(num_layers: int = 4, **training) -> dict[int, object]:
    """The same (tp 2, ep 2) layout on 8 H100s with experts split over the tensor ranks and folded."""
    layout = {"tp": 2, "pp": 1, "cp": 1, "ep": 2, "micro_batch_size": 1, "recompute": "none", "zero_stage": 1}
    return {
        etp: evaluate_layouts(
            model_spec({**MOE_BLOCKS, "num_layers": num_layers}),
            cluster_spec({"preset": "dgx-h100", "nodes": 1}),
            training_spec({"global_batch_sequences": 8, **training}),
            layout_specs([{**layout, "etp": etp}]),
        )[0]
        for etp in (2, 1)
    }


def test_moe_layouts_use_expert_parallel_sizes_that_divide_experts_and_dp_or_fold_over_tensor_ranks():
    model = {
        **GPT_SMALL,
        "num_layers": 4,
        "moe": {"num_experts": 6, "experts_per_token": 2, "expert_ffn_hidden_size": 64},
    }
    plan = plan_parallel_layout(
        model_spec(model), cluster_spec(A100_NODE), training_spec({"global_batch_sequences": 64}), top_k=50
    )
    assert plan.feasible
    assert all(6 % c.ep == 0 for c in plan.candidates)
    assert all(c.dp % c.ep == 0 for c in plan.candidates if c.etp == c.tp)
    assert all((c.tp * c.cp) % c.ep == 0 or c.ep % (c.tp * c.cp) == 0 for c in plan.candidates if c.etp < c.tp)
    assert max(c.ep for c in plan.candidates) > 1


def test_expert_groups_split_over_tensor_ranks_come_from_dp_and_folded_ones_from_whole_tensor_blocks():
    assert expert_groups_fit(dp=4, tp=2, cp=1, ep=4, etp=2)
    assert not expert_groups_fit(dp=2, tp=2, cp=1, ep=4, etp=2)
    assert expert_groups_fit(dp=2, tp=2, cp=1, ep=4, etp=1)  # two tensor pairs
    assert expert_groups_fit(dp=1, tp=8, cp=1, ep=4, etp=1)  # half a tensor group
    assert not expert_groups_fit(dp=2, tp=2, cp=1, ep=8, etp=1)  # four pairs, two replicas
    assert not expert_groups_fit(dp=4, tp=4, cp=1, ep=4, etp=2)  # etp is tp or 1


def test_folded_experts_are_whole_so_each_gpu_holds_tp_times_the_expert_weights():
    by_etp = _folded_and_split()
    counts = parameter_counts(model_spec(MOE_BLOCKS))
    expert_weight_bytes = 2.0 * counts.experts_per_layer * MOE_BLOCKS["num_layers"]
    extra = by_etp[1].memory.parameters_bytes - by_etp[2].memory.parameters_bytes
    assert extra == pytest.approx(expert_weight_bytes / 2 - expert_weight_bytes / 4)


def test_folded_moe_layers_run_no_tensor_parallel_collectives_in_their_expert_block():
    # every layer is MoE: only attention's half of each layer's collectives remains (the
    # embedding's reduction, the same either way, drops out of the difference of 8 and 4 layers)
    four, eight = (_folded_and_split(n, overlap_tp_backward=False) for n in (4, 8))
    per_four_layers = {
        etp: eight[etp].time_breakdown_s["tp_comm_s"] - four[etp].time_breakdown_s["tp_comm_s"] for etp in (2, 1)
    }
    assert per_four_layers[1] == pytest.approx(per_four_layers[2] / 2)


def test_an_expert_tensor_parallel_size_other_than_one_or_tp_is_invalid_input():
    with pytest.raises(InvalidInput) as err:
        evaluate_layouts(
            model_spec(MOE_BLOCKS),
            cluster_spec({"preset": "dgx-h100", "nodes": 1}),
            training_spec({"global_batch_sequences": 8}),
            layout_specs([{"tp": 4, "pp": 1, "cp": 1, "ep": 2, "etp": 2}]),
        )
    assert err.value.field == "evaluate[0].etp"
    assert "must be 1 or tp=4" in str(err.value)


def test_folded_experts_without_sequence_parallelism_are_invalid_input_naming_it():
    with pytest.raises(InvalidInput) as err:
        evaluate_layouts(
            model_spec(MOE_BLOCKS),
            cluster_spec({"preset": "dgx-h100", "nodes": 1}),
            training_spec({"global_batch_sequences": 8, "sequence_parallel": False}),
            layout_specs([{"tp": 2, "pp": 1, "cp": 1, "ep": 2, "etp": 1}]),
        )
    assert err.value.field == "evaluate[0].etp"
    assert "sequence_parallel" in str(err.value)


def test_a_dense_model_keeps_etp_equal_to_tp():
    (pred,) = evaluate_layouts(
        model_spec({**GPT_SMALL, "num_layers": 4}),
        cluster_spec(A100_NODE),
        training_spec({"global_batch_sequences": 8}),
        layout_specs([{"tp": 2, "pp": 1, "cp": 1}]),
    )
    assert pred.etp == 2
    with pytest.raises(InvalidInput) as err:
        evaluate_layouts(
            model_spec({**GPT_SMALL, "num_layers": 4}),
            cluster_spec(A100_NODE),
            training_spec({"global_batch_sequences": 8}),
            layout_specs([{"tp": 2, "pp": 1, "cp": 1, "etp": 1}]),
        )
    assert "a model without experts" in str(err.value)


def test_force_balanced_routing_is_faster_than_the_default_twenty_percent_busiest_expert():
    balanced, default = (_folded_and_split(expert_load_imbalance=imbalance)[1] for imbalance in (1.0, 1.2))
    assert balanced.time_breakdown_s["ep_comm_s"] == pytest.approx(
        default.time_breakdown_s["ep_comm_s"] / 1.2, rel=0.05
    )
    assert balanced.step_time_s < default.step_time_s


def test_moe_predictions_say_they_count_gpu_work_only_and_dense_ones_do_not():
    (moe,) = evaluate_layouts(
        model_spec(MOE_BLOCKS),
        cluster_spec({"preset": "dgx-h100", "nodes": 1}),
        training_spec({"global_batch_sequences": 8}),
        layout_specs([{"tp": 1, "ep": 8}]),
    )
    (dense,) = evaluate_layouts(
        model_spec({**GPT_SMALL, "num_layers": 4}),
        cluster_spec(A100_NODE),
        training_spec({"global_batch_sequences": 8}),
        layout_specs([{"tp": 1}]),
    )
    assert any(note.startswith("MoE layers count the host's work per local expert") for note in moe.notes)
    assert not any(note.startswith("MoE layers") for note in dense.notes)


def test_a_constraint_on_etp_keeps_the_search_to_split_or_folded_experts():
    for etp in (1, 2):
        plan = plan_parallel_layout(
            model_spec(MOE_BLOCKS),
            cluster_spec({"preset": "dgx-h100", "nodes": 1}),
            training_spec({"global_batch_sequences": 8}),
            constraints_spec({"tp": 2, "etp": etp}),
            with_rank_map=False,
        )
        assert plan.feasible and {c.etp for c in plan.candidates} == {etp}


_EIGHT_LAYER_MOE = {
    "num_layers": 8,
    "hidden_size": 4096,
    "num_attention_heads": 32,
    "num_kv_heads": 8,
    "seq_length": 4096,
    "vocab_size": 32000,
    "gated_mlp": True,
    "moe": {"num_experts": 64, "experts_per_token": 8, "expert_ffn_hidden_size": 1536},
}


def _best_moe_notes(training: dict, ep: int) -> tuple[str, ...]:
    from partitioners.parallel3d.planner import plan_parallel_layout
    from tests.partitioners.parallel3d.shapes import cluster_spec, constraints_spec, model_spec, training_spec

    plan = plan_parallel_layout(
        model_spec(_EIGHT_LAYER_MOE),
        cluster_spec({"preset": "dgx-h100", "nodes": 4}),
        training_spec({"global_batch_sequences": 256, **training}),
        constraints_spec({"ep": ep}),
        with_rank_map=False,
    )
    return plan.candidates[0].notes


def test_the_best_moe_layout_says_what_the_alltoall_dispatcher_and_all_to_all_overlap_would_change():
    notes = _best_moe_notes({}, ep=8)
    # node-deduplicated dispatch is the default: the note offers the alltoall dispatcher instead
    assert any("assumed expert_dispatch='node-deduplicated'" in note for note in notes)
    assert any("--moe-token-dispatcher-type alltoall" in note and "predicted" in note for note in notes)
    assert not any("--moe-enable-deepep" in note for note in notes)
    assert any("--overlap-moe-expert-parallel-comm" in note for note in notes)


def test_a_run_on_the_alltoall_dispatcher_is_told_what_deepep_would_change():
    notes = _best_moe_notes({"expert_dispatch": "all-to-all"}, ep=16)
    assert any("--moe-enable-deepep" in note and "faster" in note for note in notes)
