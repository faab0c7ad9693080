"""Activation recomputation: partial, full and selective, as searched and evaluated (partitioners.parallel3d.planner).

Expected values are worked by hand from the published formulas the docstrings
cite: Narayanan et al. SC21 (FLOPs, bubble), Korthikanti et al. 2022 (activation
memory), ZeRO (bytes per parameter per stage).
"""

from __future__ import annotations

import numpy as np
import pytest

from partitioners.errors import InvalidInput
from partitioners.parallel3d.cost import predict_layouts
from partitioners.parallel3d.flops import hardware_flops_per_step, model_flops_per_step
from partitioners.parallel3d.memory import (
    ACTIVATION_FRAGMENTATION,
    activation_bytes_per_layer,
)
from partitioners.parallel3d.planner import (
    evaluate_layouts,
    plan_parallel_layout,
)
from partitioners.parallel3d.stages import (
    RECOMPUTE_FULL,
    RECOMPUTE_NONE,
    RECOMPUTE_SELECTIVE,
)
from tests.partitioners.parallel3d.layouts import layouts
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

_PARTIAL_MODEL = {
    "num_layers": 16,
    "hidden_size": 4096,
    "num_attention_heads": 32,
    "seq_length": 4096,
    "vocab_size": 32000,
}


_PARTIAL_LAYOUT = {"tp": 1, "pp": 1, "dp": 8, "micro_batch_size": 2, "zero_stage": 1}


# 36 GiB: the layout needs ~46 GiB without recomputation, ~40 GiB with selective
# recomputation and ~31 GiB recomputing every layer
_PARTIAL_CLUSTER = {"gpu": "a100-80gb", "num_nodes": 1, "memory_bytes": 36 * 2**30}


def test_partial_recomputation_keeps_the_activations_of_the_layers_it_does_not_recompute():
    # 8 layers on one stage, the first 2 recomputed: 2 layer inputs + 6 whole layers, plus the
    # rest of the one layer rebuilt at a time during backward (its input is already held)
    model = model_spec({**GPT_SMALL, "num_layers": 8})
    cluster = cluster_spec(A100_NODE)
    training = training_spec({"global_batch_sequences": 8})
    tokens, tp = np.array([32]), np.array([1])
    whole = float(activation_bytes_per_layer(model, training, tokens, tp, np.array([RECOMPUTE_NONE]))[0])
    layer_input = float(activation_bytes_per_layer(model, training, tokens, tp, np.array([RECOMPUTE_FULL]))[0])
    none = float(predict_layouts(model, cluster, training, layouts(dp=8))["activations_bytes"][0])
    partial = float(
        predict_layouts(model, cluster, training, layouts(dp=8, recompute=RECOMPUTE_FULL, recompute_layers=2))[
            "activations_bytes"
        ][0]
    )
    assert partial - none == pytest.approx(
        (2 * (layer_input - whole) + whole - layer_input) * (1 + ACTIVATION_FRAGMENTATION)
    )


@pytest.mark.parametrize("recompute", [RECOMPUTE_SELECTIVE, RECOMPUTE_FULL])
def test_a_recomputed_layer_is_whole_again_during_its_backward(recompute):
    # one layer, one micro-batch: at its backward the recomputed layer holds exactly what keeping
    # it would have held (full: all but the input checkpoint, counted once; selective without
    # flash attention: the s x s scores), so the peak is the same as without recomputation
    model = model_spec({**GPT_SMALL, "num_layers": 1})
    cluster = cluster_spec(A100_NODE)
    training = training_spec({"global_batch_sequences": 8, "flash_attention": False})
    none, recomputed = (
        float(predict_layouts(model, cluster, training, layouts(dp=8, recompute=rc))["activations_bytes"][0])
        for rc in (RECOMPUTE_NONE, recompute)
    )
    assert recomputed == pytest.approx(none)


def test_recomputation_saves_activation_memory_on_every_layer_but_the_one_it_rebuilds():
    model = model_spec({**GPT_SMALL, "num_layers": 8})
    cluster = cluster_spec(A100_NODE)
    training = training_spec({"global_batch_sequences": 8, "flash_attention": False})
    tokens, tp = np.array([32]), np.array([1])
    whole, selective = (
        float(activation_bytes_per_layer(model, training, tokens, tp, np.array([rc]))[0])
        for rc in (RECOMPUTE_NONE, RECOMPUTE_SELECTIVE)
    )
    none, kept = (
        float(predict_layouts(model, cluster, training, layouts(dp=8, recompute=rc))["activations_bytes"][0])
        for rc in (RECOMPUTE_NONE, RECOMPUTE_SELECTIVE)
    )
    assert none - kept == pytest.approx(7 * (whole - selective) * (1 + ACTIVATION_FRAGMENTATION))


def test_partial_recomputation_repeats_the_forward_of_only_the_layers_it_covers():
    model = model_spec({**GPT_SMALL, "num_layers": 8})
    cluster = cluster_spec(A100_NODE)
    training = training_spec({"global_batch_sequences": 8})
    compute = {
        k: float(
            predict_layouts(model, cluster, training, layouts(dp=8, recompute=RECOMPUTE_FULL, recompute_layers=k))[
                "compute_s"
            ][0]
        )
        for k in (0, 2, 8)
    }
    assert compute[2] - compute[0] == pytest.approx(0.25 * (compute[8] - compute[0]))
    hardware = hardware_flops_per_step(model, 8, RECOMPUTE_FULL, 0.25) - model_flops_per_step(model, 8)
    assert float(hardware) == pytest.approx(
        0.25 * float(hardware_flops_per_step(model, 8, RECOMPUTE_FULL) - model_flops_per_step(model, 8))
    )


def test_full_recomputation_covers_the_fewest_layers_that_fit_with_room_for_allocator_waste():
    training = {"global_batch_sequences": 64}
    (chosen,) = evaluate_layouts(
        model_spec(_PARTIAL_MODEL),
        cluster_spec(_PARTIAL_CLUSTER),
        training_spec(training),
        layout_specs([_PARTIAL_LAYOUT]),
    )
    k = chosen.recompute_num_layers
    assert chosen.recompute == "full"
    (one_fewer,) = evaluate_layouts(
        model_spec(_PARTIAL_MODEL),
        cluster_spec(_PARTIAL_CLUSTER),
        training_spec(training),
        layout_specs([{**_PARTIAL_LAYOUT, "recompute_num_layers": k - 1}]),
    )
    (every_layer,) = evaluate_layouts(
        model_spec(_PARTIAL_MODEL),
        cluster_spec(_PARTIAL_CLUSTER),
        training_spec(training),
        layout_specs([{**_PARTIAL_LAYOUT, "recompute_num_layers": 16}]),
    )
    assert 1 < k < 16 and chosen.fits
    assert not any(n.startswith("tight memory") for n in chosen.notes)
    assert any(n.startswith("partial recomputation: the first") for n in chosen.notes)
    assert not one_fewer.fits or any(n.startswith("tight memory") for n in one_fewer.notes)
    assert chosen.step_time_s < every_layer.step_time_s


def test_the_2021_software_recomputes_every_layer():
    training = {"global_batch_sequences": 64, "software": "megatron-lm-2021"}
    plan = plan_parallel_layout(
        model_spec({**_PARTIAL_MODEL, "seq_length": 1024}),
        cluster_spec({**_PARTIAL_CLUSTER, "memory_bytes": 80 * 2**30}),  # no ZeRO in 2021: the whole state
        training_spec(training),
        constraints_spec({"tp": 1, "pp": 1, "micro_batch_size": 2, "recompute": ["full"]}),
    )
    assert plan.candidates[0].recompute_num_layers == 16


def test_a_layout_stated_as_full_recomputation_recomputes_every_layer():
    # published runs that say "full activation recomputation" recomputed all of them
    (pred,) = evaluate_layouts(
        model_spec(_PARTIAL_MODEL),
        cluster_spec(_PARTIAL_CLUSTER),
        training_spec({"global_batch_sequences": 64}),
        layout_specs([{**_PARTIAL_LAYOUT, "recompute": "full"}]),
    )
    assert pred.recompute_num_layers == 16
    assert not any(n.startswith("partial recomputation") for n in pred.notes)


def test_a_stated_recompute_layer_count_implies_full_recomputation_and_is_kept():
    (pred,) = evaluate_layouts(
        model_spec(_PARTIAL_MODEL),
        cluster_spec(_PARTIAL_CLUSTER),
        training_spec({"global_batch_sequences": 64}),
        layout_specs([{**_PARTIAL_LAYOUT, "recompute_num_layers": 12}]),
    )
    assert (pred.recompute, pred.recompute_num_layers) == ("full", 12)
    assert pred.to_dict()["recompute_num_layers"] == 12


def test_a_recompute_layer_count_of_zero_is_invalid_input():
    with pytest.raises(InvalidInput) as err:
        plan_parallel_layout(
            model_spec(_PARTIAL_MODEL),
            cluster_spec(_PARTIAL_CLUSTER),
            training_spec({"global_batch_sequences": 64}),
            constraints_spec({"recompute_num_layers": 0}),
        )
    assert err.value.field == "constraints.recompute_num_layers"


def test_recompute_num_layers_alone_constrains_the_search_to_full_recomputation_of_that_many_layers():
    plan = plan_parallel_layout(
        model_spec(RECOMPUTE_MODEL),
        cluster_spec(RECOMPUTE_CLUSTER),
        training_spec({"global_batch_sequences": 64}),
        constraints_spec({"recompute_num_layers": 8}),
        with_rank_map=False,
    )
    assert plan.candidates
    assert all(c.recompute == "full" and c.recompute_num_layers == 8 for c in plan.candidates)


@pytest.mark.parametrize(
    ("constraints", "field"),
    [
        ({"recompute": ["none"], "recompute_num_layers": 8}, "constraints.recompute_num_layers"),
        ({"recompute_num_layers": 33}, "constraints.recompute_num_layers"),
        ({"pp": 4, "max_pp": 2}, "constraints.pp"),
    ],
)
def test_constraints_that_contradict_each_other_or_the_model_are_invalid_input(constraints, field):
    with pytest.raises(InvalidInput) as err:
        plan_parallel_layout(
            model_spec(RECOMPUTE_MODEL),
            cluster_spec(RECOMPUTE_CLUSTER),
            training_spec({"global_batch_sequences": 64}),
            constraints_spec(constraints),
        )
    assert err.value.field == field


def test_an_evaluated_recompute_num_layers_is_predicted_as_asked_or_refused_naming_it():
    layout = {"tp": 1, "pp": 2, "recompute": "full"}
    (asked,) = evaluate_layouts(
        model_spec(RECOMPUTE_MODEL),
        cluster_spec(RECOMPUTE_CLUSTER),
        training_spec({"global_batch_sequences": 64}),
        layout_specs([{**layout, "recompute_num_layers": 15}]),
    )
    # 15 layers of a chunk: only 1F1B's 16-layer chunks have them, not an interleaved split
    assert (asked.recompute_num_layers, asked.virtual_stages) == (15, 1)
    for too_many in (20, 1000):
        with pytest.raises(InvalidInput) as err:
            evaluate_layouts(
                model_spec(RECOMPUTE_MODEL),
                cluster_spec(RECOMPUTE_CLUSTER),
                training_spec({"global_batch_sequences": 64}),
                layout_specs([{**layout, "recompute_num_layers": too_many}]),
            )
        assert err.value.field == "evaluate[0].recompute_num_layers"


def test_the_2021_software_searches_no_selective_recomputation_and_refuses_it_when_asked():
    training = {"global_batch_sequences": 64, "software": "megatron-lm-2021"}
    plan = plan_parallel_layout(
        model_spec(RECOMPUTE_MODEL), cluster_spec(RECOMPUTE_CLUSTER), training_spec(training), with_rank_map=False
    )
    assert plan.candidates and all(c.recompute != "selective" for c in plan.candidates)
    with pytest.raises(InvalidInput) as err:
        evaluate_layouts(
            model_spec(RECOMPUTE_MODEL),
            cluster_spec(RECOMPUTE_CLUSTER),
            training_spec(training),
            layout_specs([{"tp": 8, "recompute": "selective"}]),
        )
    assert err.value.field == "evaluate[0].recompute"
    with pytest.raises(InvalidInput) as err:
        plan_parallel_layout(
            model_spec(RECOMPUTE_MODEL),
            cluster_spec(RECOMPUTE_CLUSTER),
            training_spec(training),
            constraints_spec({"recompute": ["selective"]}),
        )
    assert err.value.field == "constraints.recompute"


def test_op_level_checkpointing_keeps_less_than_everything_and_more_than_full_recomputation():
    model = model_spec({**RECOMPUTE_MODEL_FOR_SAC})
    cluster = cluster_spec({"preset": "dgx-h100", "nodes": 1})
    training = training_spec({"global_batch_sequences": 8, "software": "torchtitan"})
    base = {"tp": 2, "pp": 1, "micro_batch_size": 1, "zero_stage": 3}
    none, op_sac, full = evaluate_layouts(
        model,
        cluster,
        training,
        layout_specs([{**base, "recompute": mode} for mode in ("none", "op-sac", "full")]),
    )
    assert full.memory.activations_bytes < op_sac.memory.activations_bytes < none.memory.activations_bytes
    # it repeats about half the forward's matmuls: more work than none, less than full
    assert none.hfu * none.step_time_s < op_sac.hfu * op_sac.step_time_s < full.hfu * full.step_time_s
    assert none.step_time_s < op_sac.step_time_s < full.step_time_s


RECOMPUTE_MODEL_FOR_SAC = {
    "num_layers": 8,
    "hidden_size": 4096,
    "num_attention_heads": 32,
    "num_kv_heads": 8,
    "ffn_hidden_size": 14336,
    "gated_mlp": True,
    "seq_length": 8192,
    "vocab_size": 32000,
}


def test_selective_recomputation_keeps_the_split_of_keeping_everything_on_uneven_moe_stages():
    # 9 layers on 4 stages, the first two MoE: balanced on recomputed work, the split once moved
    # an MoE layer onto the first stage and needed 6.94 GB against 6.29 GB keeping everything
    model = {
        "num_layers": 9,
        "hidden_size": 2048,
        "num_attention_heads": 16,
        "seq_length": 2048,
        "vocab_size": 32000,
        "moe": {"num_experts": 8, "experts_per_token": 2, "expert_ffn_hidden_size": 1024, "moe_layers": [0, 1]},
    }
    layout = {"tp": 1, "pp": 4, "cp": 1, "ep": 1, "virtual_stages": 1, "micro_batch_size": 1, "zero_stage": 1}
    kept, selective = evaluate_layouts(
        model_spec(model),
        cluster_spec({"preset": "dgx-h100", "nodes": 1}),
        training_spec({"global_batch_sequences": 16}),
        layout_specs([{**layout, "recompute": "none"}, {**layout, "recompute": "selective"}]),
    )
    assert selective.memory.total_bytes <= kept.memory.total_bytes
