"""Conventions a prediction states: the peak utilisation is measured against, sequence parallelism per layout."""

from __future__ import annotations

import pytest

from partitioners.parallel3d.planner import evaluate_layouts
from tests.partitioners.parallel3d.shapes import cluster_spec, layout_specs, model_spec, training_spec

_LLAMA = {
    "num_layers": 16,
    "hidden_size": 4096,
    "num_attention_heads": 32,
    "num_kv_heads": 8,
    "ffn_hidden_size": 14336,
    "gated_mlp": True,
    "seq_length": 8192,
    "vocab_size": 128256,
}


def _predict(training: dict, layouts: list[dict]):
    return evaluate_layouts(
        model_spec(_LLAMA),
        cluster_spec({"preset": "dgx-h100", "nodes": 1}),
        training_spec({"global_batch_sequences": 64, **training}),
        layout_specs(layouts),
    )


def test_an_fp8_run_reports_its_utilisation_against_the_fp8_peak_as_well():
    (prediction,) = _predict({"precision": "fp8"}, [{"tp": 2, "pp": 1}])
    # H100 SXM: 1,979 dense FP8 TFLOP/s against 989 bf16 (NVIDIA H100 datasheet)
    assert prediction.mfu_at_precision_peak == pytest.approx(prediction.mfu / 2.0, rel=0.01)


def test_a_16_bit_run_has_one_utilisation():
    (prediction,) = _predict({}, [{"tp": 2, "pp": 1}])
    assert prediction.mfu_at_precision_peak == prediction.mfu


def test_sequence_parallelism_is_a_layout_field_that_shards_activations():
    layout = {"tp": 4, "pp": 1, "micro_batch_size": 1, "zero_stage": 1, "recompute": "none"}
    sharded, whole = _predict({}, [{**layout, "sequence_parallel": True}, {**layout, "sequence_parallel": False}])
    assert sharded.sequence_parallel and not whole.sequence_parallel
    assert sharded.memory.activations_bytes < whole.memory.activations_bytes


def test_a_single_tensor_rank_has_nothing_to_split_in_sequence():
    (prediction,) = _predict({}, [{"tp": 1, "pp": 1, "zero_stage": 3}])
    assert not prediction.sequence_parallel
