"""Pipeline stages: layer splits and micro-batch groups (partitioners.parallel3d.stages).

Expected values are worked by hand from the published formulas the docstrings
cite: Narayanan et al. SC21 (FLOPs, bubble), Korthikanti et al. 2022 (activation
memory), ZeRO (bytes per parameter per stage).
"""

from __future__ import annotations

import numpy as np
import pytest

from partitioners.parallel3d.memory import (
    ACTIVATION_FRAGMENTATION,
    activation_bytes_per_layer,
    stage_activation_bytes,
)
from partitioners.parallel3d.planner import evaluate_layouts
from partitioners.parallel3d.stages import (
    RECOMPUTE_NONE,
    balanced_end_layers,
    microbatch_group_size,
    stage_layer_split,
)
from tests.partitioners.parallel3d.shapes import (
    A100_NODE,
    GPT_SMALL,
    RECOMPUTE_MODEL,
    cluster_spec,
    layout_specs,
    model_spec,
    training_spec,
)


def _small_stages(num_layers: int):
    """GPT_SMALL with ``num_layers`` layers, 32 tokens, tp 1, no recomputation: the model, the
    training, a one-element 1.0, tokens, tp, recompute and one layer's activation bytes."""
    model = model_spec({**GPT_SMALL, "num_layers": num_layers})
    training = training_spec({"global_batch_sequences": 16, "flexible_microbatch_groups": True})
    one = np.array([1.0])
    tokens, tp, rc = np.array([32.0]), one, np.array([RECOMPUTE_NONE])
    return model, training, one, tokens, tp, rc, float(activation_bytes_per_layer(model, training, tokens, tp, rc)[0])


def test_interleaved_micro_batch_groups_are_pp_or_the_smallest_megatron_core_accepts():
    m, pp = np.array([120, 32, 250, 15, 7]), np.array([16, 8, 4, 2, 8])
    # 120 = 6 x 20; 250 = 50 x 5; 15 = 5 x 3; 7 micro-batches cannot fill 8 stages
    assert list(microbatch_group_size(m, pp, flexible=True)) == [20, 8, 5, 3, 0]
    assert list(microbatch_group_size(m, pp, flexible=False)) == [0, 8, 0, 0, 0]


def test_a_micro_batch_count_pp_does_not_divide_interleaves_only_with_flexible_groups_asked_for():
    model = {"num_layers": 16, "hidden_size": 1024, "num_attention_heads": 8, "seq_length": 2048, "vocab_size": 32000}
    # dp 2: 5 micro-batches per pipeline, one group of 5; Megatron-Core's default group is pp
    flexible, strict, default = (
        evaluate_layouts(
            model_spec(model),
            cluster_spec({"preset": "dgx-h100", "nodes": 1}),
            training_spec({"global_batch_sequences": 10, **flag}),
            layout_specs([{"tp": 1, "pp": 4, "cp": 1, "micro_batch_size": 1}]),
        )[0]
        for flag in ({"flexible_microbatch_groups": True}, {"flexible_microbatch_groups": False}, {})
    )
    assert flexible.virtual_stages > 1 and any("groups of 5" in note for note in flexible.notes)
    assert strict.virtual_stages == default.virtual_stages == 1


def test_a_larger_micro_batch_group_keeps_more_model_chunks_in_flight_on_the_first_stage():
    model, training, one, tokens, tp, rc, per_layer = _small_stages(8)

    def first_stage_bytes(m: int) -> float:
        # 4 stages of 2 layers, 2 chunks of 1 layer each
        return float(
            stage_activation_bytes(
                model,
                training,
                tokens,
                tp,
                rc,
                0.0 * one,
                2 * one,
                0 * one,
                2 * one,
                2 * one,
                4 * one,
                2 * one,
                m * one,
            ).first_bytes[0]
        )

    # 2(p - 1) + (v - 1) N + 1 chunks of one layer: N = 4 at 16 micro-batches, 5 at 15
    assert first_stage_bytes(16) == pytest.approx(11 * per_layer * (1 + ACTIVATION_FRAGMENTATION))
    assert first_stage_bytes(15) == pytest.approx(12 * per_layer * (1 + ACTIVATION_FRAGMENTATION))


def test_middle_stages_shed_leftover_layers_nearest_the_first_stage():
    # 13 layers on 8 stages of 2: the ends keep 1 each and the second stage sheds the third
    # short layer (1 x 7 in flight); the third stage's 2 x 6 is then the peak (first: 1 x 8)
    model, training, one, tokens, tp, rc, per_layer = _small_stages(13)
    stages = stage_activation_bytes(
        model, training, tokens, tp, rc, 0.0 * one, 2 * one, 0 * one, one, one, 8 * one, one, 16 * one
    )
    assert (float(stages.middle_rank[0]), float(stages.middle_layers[0])) == (2, 2)
    assert float(stages.middle_bytes[0]) == pytest.approx(2 * 6 * per_layer * (1 + ACTIVATION_FRAGMENTATION))
    assert float(stages.first_bytes[0]) == pytest.approx(1 * 8 * per_layer * (1 + ACTIVATION_FRAGMENTATION))


def test_the_uneven_stage_note_says_which_middle_stages_are_a_layer_short():
    model = {**GPT_SMALL, "num_layers": 13, "vocab_size": 8}
    (prediction,) = evaluate_layouts(
        model_spec(model),
        cluster_spec(A100_NODE),
        training_spec({"global_batch_sequences": 16}),
        layout_specs([{"dp": 1, "tp": 1, "pp": 8, "virtual_stages": 1}]),
    )
    (note,) = [n for n in prediction.notes if n.startswith("uneven stages")]
    assert note.endswith("; the stage after the first holds 1")


@pytest.mark.parametrize(
    ("layers", "pp", "split"),
    [
        (126, 16, (8, 7, 7)),  # Llama 3 405B: one layer fewer on each end (Llama 3 paper, Sec. 3.3.2)
        (96, 8, (12, 12, 12)),  # even
        (95, 8, (12, 12, 11)),  # one short: off the last stage
        (96, 31, (4, 3, 3)),  # many short: the ends and some middle stages hold one fewer
        (80, 1, (80, 80, 80)),
    ],
)
def test_uneven_pipeline_stages_take_the_shortfall_from_both_ends_first(layers, pp, split):
    q, first, last = stage_layer_split(layers, np.array([pp]))
    assert (float(q[0]), float(first[0]), float(last[0])) == split


@pytest.mark.parametrize(
    ("q", "short", "pp", "extras", "ends"),
    [
        (8, 2, 16, (0.05, 0.65), (7, 7)),  # Llama 3 405B: a cheap head, one layer off each end
        (12, 1, 8, (0.05, 0.65), (12, 11)),  # one short: off the slower last stage
        (4, 3, 16, (0.1, 2.5), (4, 1)),  # a head worth 2.5 layers takes the last stage down to one
        (4, 3, 16, (0.1, 0.2), (3, 3)),  # ends no slower than a middle stage: the rest shorten middle stages
        (5, 1, 2, (0.1, 0.0), (4, 5)),  # two stages: the short layer comes off an end, here the first
    ],
)
def test_the_stage_that_also_embeds_or_computes_logits_sheds_the_short_layers(q, short, pp, extras, ends):
    first, last = balanced_end_layers(
        np.array([q], dtype=float),
        np.array([short], dtype=float),
        np.array([pp], dtype=float),
        np.array([extras[0]]),
        np.array([extras[1]]),
    )
    assert (float(first[0]), float(last[0])) == ends


def test_an_end_stage_of_cheap_dense_layers_keeps_them_when_the_layer_costs_say_so():
    # DeepSeek-V3's shape: 61 layers on 16 stages of 4, the first three dense at a third of an
    # MoE layer's time. Counted as average layers the first stage would shed one; counted as
    # what they are, 3 x 1/3 + 1 + the embedding is under a middle stage's 4, so it keeps four
    def end_layer_units(first, last):
        dense_on_first = np.minimum(first, 3.0)
        return first - dense_on_first * (2.0 / 3.0), last

    args = (np.array([4.0]), np.array([3.0]), np.array([16.0]), np.array([0.1]), np.array([0.3]))
    assert tuple(float(x[0]) for x in balanced_end_layers(*args)) == (3.0, 3.0)
    assert tuple(float(x[0]) for x in balanced_end_layers(*args, end_layer_units)) == (4.0, 3.0)


def test_end_stage_balancing_stops_once_no_layout_moves_a_layer():
    # 55,440 layers on 50,400 two-layer stages leave 45,360 layers short; each end can give up
    # only one, so the balancing is two rounds and a round that moves nothing, not 45,360
    rounds = []

    def end_layer_units(first, last):
        rounds.append(1)
        return first, last

    first, last = balanced_end_layers(
        np.array([2.0]), np.array([45_360.0]), np.array([50_400.0]), np.array([0.1]), np.array([1.5]), end_layer_units
    )
    assert (float(first[0]), float(last[0])) == (1.0, 1.0)
    assert len(rounds) == 3


def test_interleaved_uneven_stages_say_they_need_an_explicit_pipeline_layout():
    model = {**RECOMPUTE_MODEL, "num_layers": 11}  # stages of 4, 4 and 3 layers: 3 is no multiple of 2
    cluster = {"gpu": "h100", "num_nodes": 1, "gpus_per_node": 3}
    (prediction,) = evaluate_layouts(
        model_spec(model),
        cluster_spec(cluster),
        training_spec({"global_batch_sequences": 6}),
        layout_specs([{"tp": 1, "pp": 3, "virtual_stages": 2, "micro_batch_size": 1}]),
    )
    assert any("--pipeline-model-parallel-layout" in note for note in prediction.notes)
