"""Pipeline schedules (partitioners.parallel3d.schedules): idle time, what a rank holds, where each runs."""

from __future__ import annotations

import numpy as np
import pytest

from partitioners.errors import InvalidInput
from partitioners.parallel3d.effective import effective_terms
from partitioners.parallel3d.planner import evaluate_layouts, plan_parallel_layout
from partitioners.parallel3d.schedules import PIPELINE_SCHEDULES, idle_stage_times
from tests.partitioners.parallel3d.shapes import cluster_spec, layout_specs, model_spec, training_spec

# a 48-layer model on 16 H100 nodes: deep enough for 16 stages, small batch so the bubble shows
_MODEL = {
    "num_layers": 48,
    "hidden_size": 6144,
    "num_attention_heads": 48,
    "num_kv_heads": 8,
    "ffn_hidden_size": 16384,
    "gated_mlp": True,
    "seq_length": 4096,
    "vocab_size": 32000,
}
_CLUSTER = {"preset": "dgx-h100", "nodes": 16}


def _evaluate(schedule: str, software: str = "hai-llm", cluster=_CLUSTER, **layout):
    training = training_spec({"global_batch_sequences": 64, "software": software, "pipeline_schedule": schedule})
    (prediction,) = evaluate_layouts(model_spec(_MODEL), cluster_spec(cluster), training, layout_specs([layout]))
    return prediction


def test_1f1b_idles_p_minus_1_over_v_stage_times():
    assert idle_stage_times(PIPELINE_SCHEDULES["1f1b"], np.array([8.0]), np.array([2.0]))[0] == pytest.approx(3.5)


def test_zero_bubble_idles_a_third_of_1f1b_without_recomputation():
    pp = np.array([16.0])
    assert idle_stage_times(PIPELINE_SCHEDULES["zero-bubble"], pp, np.ones(1))[0] == pytest.approx(
        idle_stage_times(PIPELINE_SCHEDULES["1f1b"], pp, np.ones(1))[0] / 3
    )


def test_dualpipe_idles_as_deepseek_v3_table_2_gives():
    # (p/2 - 1)(F&B + B - 3W) with F = W = 1/3, B = 2/3, F&B = F + B of one stage time
    assert idle_stage_times(PIPELINE_SCHEDULES["dualpipe"], np.array([16.0]), np.ones(1))[0] == pytest.approx(
        7 * (1 + 2 / 3 - 1)
    )


def test_full_recomputation_leaves_the_weight_gradient_less_of_a_stage_to_fill_the_bubble():
    pp, v = np.array([8.0]), np.ones(1)
    assert (
        idle_stage_times(PIPELINE_SCHEDULES["zero-bubble"], pp, v, 1.0)[0]
        > idle_stage_times(PIPELINE_SCHEDULES["zero-bubble"], pp, v, 0.0)[0]
    )


def test_dualpipe_shortens_the_step_of_a_deep_pipeline_with_few_micro_batches():
    layout = {"tp": 8, "pp": 16, "micro_batch_size": 1, "zero_stage": 1, "recompute": "full"}
    one_f_one_b = _evaluate("1f1b", **layout)
    dualpipe = _evaluate("dualpipe", **layout)
    assert dualpipe.time_breakdown_s["bubble_s"] < one_f_one_b.time_breakdown_s["bubble_s"] / 2
    assert dualpipe.step_time_s < one_f_one_b.step_time_s


def test_dualpipe_ranks_hold_two_stages_weights_and_one_more_micro_batch():
    layout = {"tp": 8, "pp": 16, "micro_batch_size": 1, "zero_stage": 1, "recompute": "full"}
    one_f_one_b = _evaluate("1f1b", **layout)
    dualpipe = _evaluate("dualpipe", **layout)
    assert dualpipe.memory.parameters_bytes > 1.5 * one_f_one_b.memory.parameters_bytes
    assert dualpipe.memory.activations_bytes > one_f_one_b.memory.activations_bytes
    # ZeRO-1 shards each stage's optimizer state over the 2 x dp ranks that hold it
    assert dualpipe.memory.optimizer_state_bytes < 1.5 * one_f_one_b.memory.optimizer_state_bytes


def test_hai_llm_plans_dualpipe_on_even_pipelines_without_virtual_stages():
    training = training_spec({"global_batch_sequences": 64, "software": "hai-llm"})
    plan = plan_parallel_layout(model_spec(_MODEL), cluster_spec(_CLUSTER), training, with_rank_map=False)
    assert plan.candidates
    assert all(c.pp == 1 or c.pp % 2 == 0 for c in plan.candidates)
    assert all(c.virtual_stages == 1 for c in plan.candidates)
    assumed = {term.name: term.value for term in effective_terms(training).assumptions}
    assert assumed["pipeline schedule"] == "dualpipe"
    assert assumed["expert all-to-all"].startswith("paired")


def test_a_schedule_the_software_cannot_run_is_refused_naming_the_field():
    with pytest.raises(InvalidInput) as refused:
        plan_parallel_layout(
            model_spec(_MODEL),
            cluster_spec(_CLUSTER),
            training_spec({"global_batch_sequences": 64, "pipeline_schedule": "dualpipe"}),
        )
    assert refused.value.field == "training.pipeline_schedule"
    assert refused.value.code == "not-in-this-software"


def test_dualpipe_with_an_odd_pipeline_is_refused():
    with pytest.raises(InvalidInput) as refused:
        _evaluate("dualpipe", cluster={"preset": "dgx-h100", "nodes": 6}, tp=8, pp=3)
    assert refused.value.code == "schedule-not-possible"


def test_dualpipev_launches_as_torchtitans_dualpipev_schedule_and_not_in_megatron():
    prediction = _evaluate("dualpipev", software="torchtitan", tp=8, pp=4, zero_stage=3, recompute="full")
    configs = {config.framework: config for config in prediction.launch}
    assert 'pipeline_parallel_schedule = "DualPipeV"' in configs["torchtitan"].config
    assert configs["megatron"].config is None
    assert "dualpipev" in configs["megatron"].unavailable


def test_a_single_stage_holds_one_copy_of_its_weights_under_dualpipe():
    layout = {"tp": 8, "pp": 1, "micro_batch_size": 1, "zero_stage": 1, "recompute": "full"}
    one_f_one_b = _evaluate("1f1b", **layout)
    dualpipe = _evaluate("dualpipe", **layout)
    assert dualpipe.memory.parameters_bytes == pytest.approx(one_f_one_b.memory.parameters_bytes)
    assert dualpipe.step_time_s == pytest.approx(one_f_one_b.step_time_s)
