"""A software generation bounds the search (presets.SOFTWARE_SEARCH), and the rank order is searched.

Megatron-LM of 2021 had no distributed optimizer, only full recomputation, even pipeline
stages and no context or expert parallelism (examples/sc21; megatron/model/transformer.py);
a plan for it proposes none of those. Rank orders are Megatron-Core's ``--order``
default (``tp-cp-ep-dp-pp``) and ``--use-tp-pp-dp-mapping`` (``tp-cp-ep-pp-dp``).
"""

from __future__ import annotations

import pytest

from partitioners.errors import InvalidInput
from partitioners.parallel3d.planner import evaluate_layouts, plan_parallel_layout
from partitioners.parallel3d.presets import SOFTWARE_PRESETS, SOFTWARE_SEARCH
from tests.partitioners.parallel3d.shapes import (
    cluster_spec,
    constraints_spec,
    layout_specs,
    model_spec,
    training_spec,
)

# 30 layers: pipelines of 4 or 8 stages would be uneven
_MODEL = {"num_layers": 30, "hidden_size": 4096, "num_attention_heads": 32, "seq_length": 2048, "vocab_size": 51200}
_CLUSTER = {"preset": "dgx-a100", "nodes": 8}


def _plan(software: str, constraints: dict | None = None):
    training = training_spec({"global_batch_sequences": 512, "software": software})
    return plan_parallel_layout(
        model_spec(_MODEL),
        cluster_spec(_CLUSTER),
        training,
        None if constraints is None else constraints_spec(constraints),
        top_k=20,
        with_rank_map=False,
    )


def test_every_software_preset_states_its_search_space():
    assert set(SOFTWARE_SEARCH) == set(SOFTWARE_PRESETS)


def test_megatron_lm_2021_proposes_no_zero_no_selective_recompute_and_no_uneven_stages():
    plan = _plan("megatron-lm-2021")
    assert plan.candidates
    for candidate in plan.candidates:
        assert candidate.zero_stage == 0
        assert candidate.recompute in ("none", "full")
        assert _MODEL["num_layers"] % candidate.pp == 0
        assert candidate.cp == 1
        assert candidate.rank_order == "tp-cp-ep-dp-pp"


def test_an_evaluated_uneven_layout_is_predicted_as_stated_with_a_note_where_the_software_had_no_uneven_stages():
    layout = layout_specs([{"tp": 8, "pp": 4, "virtual_stages": 1, "zero_stage": 0, "recompute": "full"}])

    def predict(software: str):
        training = training_spec({"global_batch_sequences": 512, "software": software})
        (prediction,) = evaluate_layouts(model_spec(_MODEL), cluster_spec(_CLUSTER), training, layout)
        return prediction

    today, old = predict("megatron-core"), predict("megatron-lm-2021")
    assert today.fits and old.fits
    assert not any("uneven pipeline stages" in note for note in today.notes)
    assert any("uneven pipeline stages" in note and "megatron-lm-2021" in note for note in old.notes)


def test_a_constraint_the_software_cannot_run_is_refused_by_name():
    with pytest.raises(InvalidInput) as error:
        _plan("megatron-lm-2021", {"zero_stages": [3]})
    assert error.value.field == "constraints.zero_stages" and error.value.code == "not-in-this-software"


def test_a_published_layout_outside_the_software_is_predicted_with_a_note_not_refused():
    # Megatron-DeepSpeed ran ZeRO-1 on code branched from Megatron-LM of 2021
    (prediction,) = evaluate_layouts(
        model_spec(_MODEL),
        cluster_spec(_CLUSTER),
        training_spec({"global_batch_sequences": 512, "software": "megatron-lm-2021"}),
        layout_specs([{"tp": 8, "pp": 2, "zero_stage": 1}]),
    )
    assert prediction.zero_stage == 1
    assert any(note.startswith("ZeRO-1: not something") for note in prediction.notes)


def test_data_parallel_peers_on_one_node_reduce_gradients_faster_than_across_nodes():
    # tp 1, pp 2 on 2 nodes: tp-cp-ep-dp-pp keeps a stage's 8 replicas on one NVLink node
    model = {**_MODEL, "num_layers": 32, "hidden_size": 2048, "num_attention_heads": 16}
    cluster = cluster_spec({"preset": "dgx-a100", "nodes": 2})
    training = training_spec({"global_batch_sequences": 64, "overlap_grad_reduce": False})
    layout = {"tp": 1, "pp": 2, "virtual_stages": 1, "micro_batch_size": 1, "zero_stage": 0, "recompute": "none"}
    inside, outside = evaluate_layouts(
        model_spec(model),
        cluster,
        training,
        layout_specs([{**layout, "rank_order": "tp-cp-ep-dp-pp"}, {**layout, "rank_order": "tp-cp-ep-pp-dp"}]),
    )
    assert inside.rank_order == "tp-cp-ep-dp-pp" and outside.rank_order == "tp-cp-ep-pp-dp"
    assert inside.time_breakdown_s["dp_comm_total_s"] < outside.time_breakdown_s["dp_comm_total_s"]
    assert inside.time_breakdown_s["pp_comm_s"] > outside.time_breakdown_s["pp_comm_s"]


def test_a_stage_of_a_prime_number_of_layers_can_interleave_one_layer_chunks():
    # 92 layers on 4 stages: 23 a stage, whose only interleaving depths are 1 and 23 with whole chunks
    model = {**_MODEL, "num_layers": 92}
    training = training_spec({"global_batch_sequences": 64, "software": "megatron-lm-2022"})
    plan = plan_parallel_layout(
        model_spec(model),
        cluster_spec(_CLUSTER),
        training,
        constraints_spec({"tp": 8, "pp": 4}),
        with_rank_map=False,
    )
    (best,) = plan.candidates
    assert best.virtual_stages in (1, 23)
    (interleaved,) = evaluate_layouts(
        model_spec(model), cluster_spec(_CLUSTER), training, layout_specs([{"tp": 8, "pp": 4, "virtual_stages": 23}])
    )
    assert interleaved.bubble_fraction < 0.05


def test_uneven_chunks_are_searched_where_megatron_core_places_layers_chunk_by_chunk():
    model = {**_MODEL, "num_layers": 92}
    layout = layout_specs([{"tp": 8, "pp": 4, "virtual_stages": 5}])

    def notes(software: str) -> tuple[str, ...]:
        training = training_spec({"global_batch_sequences": 64, "software": software})
        (prediction,) = evaluate_layouts(model_spec(model), cluster_spec(_CLUSTER), training, layout)
        return prediction.notes

    assert any("--pipeline-model-parallel-layout" in note for note in notes("megatron-core"))
    with pytest.raises(InvalidInput):
        notes("megatron-lm-2022")


def test_torchtitan_searches_its_own_recomputation_variants_and_no_zero_1():
    plan = _plan("torchtitan")
    for candidate in plan.candidates:
        assert candidate.recompute in ("none", "op-sac", "full")
        assert candidate.zero_stage in (0, 2, 3)
        assert candidate.rank_order == "tp-cp-ep-dp-pp"


def test_megatron_deepspeed_runs_zero_1_and_uneven_stages_but_no_interleaving():
    plan = _plan("megatron-deepspeed", {"zero_stages": [1], "pp": 4})
    assert plan.candidates
    for candidate in plan.candidates:
        assert candidate.zero_stage == 1 and candidate.virtual_stages == 1 and candidate.pp == 4
