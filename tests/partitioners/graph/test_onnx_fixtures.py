"""ONNX import of real exports (tests/fixtures/onnx/make_fixtures.py) against analytic counts,
and of corrupted bytes."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper

from partitioners.errors import InvalidInput
from partitioners.graph import onnx_import
from partitioners.graph.canonical import graph_to_json, model_hash
from partitioners.graph.hypergraph import graph_summary
from partitioners.graph.json_import import graph_from_json
from partitioners.graph.onnx_import import graph_from_onnx_bytes
from tests.partitioners.graph.onnx_helpers import (
    FIXTURES,
    folded_count,
    tiny_model,
    warnings_besides_folding,
)

# --- exported fixtures (tests/fixtures/onnx/make_fixtures.py) -----------------------


def _resnet50_flops(image: int = 224) -> float:
    """Analytic ResNet-50 FLOPs: 2 per conv/fc MAC (He et al. 2016, table 1 geometry)."""
    macs = 0
    size = image // 2  # 7x7/2 stem
    macs += size * size * 64 * 3 * 49
    size //= 2  # 3x3/2 max pool
    in_ch = 64
    for width, blocks, stride in [(64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2)]:
        for i in range(blocks):
            s = stride if i == 0 else 1
            out_size = size // s
            macs += size * size * width * in_ch  # 1x1 reduce
            macs += out_size * out_size * width * width * 9  # 3x3 (carries the stride)
            macs += out_size * out_size * width * 4 * width  # 1x1 expand
            if i == 0:
                macs += out_size * out_size * width * 4 * in_ch  # projection shortcut
            in_ch, size = width * 4, out_size
    macs += 2048 * 1000  # classifier
    return 2.0 * macs


def _transformer_flops(layers: int, d_model: int, seq: int) -> float:
    """Matrix products of a transformer stack, 2 FLOPs per MAC (Kaplan et al. 2020, table 1):
    per layer and token 12 d^2 MACs of projections and MLP, plus 2 s d for Q K^T and P V."""
    return 2.0 * layers * (12 * d_model**2 * seq + 2 * seq**2 * d_model)


def test_resnet50_fixture_matches_the_analytic_flop_and_parameter_counts():
    graph = graph_from_onnx_bytes((FIXTURES / "resnet50.onnx").read_bytes(), dims={"batch": 1})
    summary = graph_summary(graph)
    assert graph.n_ops == 122  # 53 Conv (BN folded in), 49 Relu, 16 Add, pools, Flatten, Gemm
    assert (graph.op_types == "Conv").sum() == 53
    assert summary["total_flops"] == pytest.approx(_resnet50_flops(), rel=0.05)  # ~8.2e9
    # torch counts 25,557,032 parameters, including BN gamma and beta (2 x 26,560); the
    # export folds each BN into a conv bias (1 x 26,560): 25,530,472 float32 values.
    assert summary["parameter_bytes"] == 4 * 25_530_472
    assert graph.warnings == []


def test_resnet50_batch_scales_flops_linearly():
    data = (FIXTURES / "resnet50.onnx").read_bytes()
    one = graph_from_onnx_bytes(data, dims={"batch": 1}).op_flops.sum()
    eight = graph_from_onnx_bytes(data, dims={"batch": 8}).op_flops.sum()
    assert eight == pytest.approx(8 * one)


# Parameter counts printed by make_fixtures.py (sum of p.numel() over the torch module);
# every parameter is a float32 initializer in the export, so parameter bytes are 4x these.
BERT_PARAMETERS = 108_891_648  # BertModel, bert-base-uncased geometry, no pooler
GPT2_PARAMETERS = 124_439_808  # GPT2Model, gpt2 (small) geometry, no LM head


def test_bert_base_fixture_matches_the_analytic_flop_and_parameter_counts():
    graph = graph_from_onnx_bytes((FIXTURES / "bert_base.onnx").read_bytes(), dims={"batch": 1, "sequence": 128})
    summary = graph_summary(graph)
    # 977 exported nodes; the 552 Constant nodes and shape computations fold away once
    # batch and sequence are bound (ONNX Runtime's constant folding), leaving 425 operators
    assert graph.n_ops == 425
    assert (graph.op_types == "MatMul").sum() == 12 * 8  # Q, K, V, scores, context, out, 2 x MLP
    assert summary["total_flops"] == pytest.approx(_transformer_flops(12, 768, 128), rel=0.05)  # ~22.4e9
    # the weights, plus 8,000 bytes of folded constants (position ids, attention mask, shape vectors)
    assert summary["parameter_bytes"] == 4 * BERT_PARAMETERS + 8_000
    assert folded_count(graph.warnings) == 552
    assert warnings_besides_folding(graph.warnings) == []  # every shape resolved once batch and sequence are bound


def test_gpt2_fixture_matches_the_analytic_flop_and_parameter_counts():
    graph = graph_from_onnx_bytes((FIXTURES / "gpt2.onnx").read_bytes(), dims={"batch": 1, "sequence": 128})
    summary = graph_summary(graph)
    # 2262 exported nodes, 1787 of them Constant nodes and shape computations folded away
    assert graph.n_ops == 475
    # GPT-2's Conv1D layers export as Gemm (QKV, out, 2 x MLP per layer), attention as MatMul
    assert ((graph.op_types == "Gemm").sum(), (graph.op_types == "MatMul").sum()) == (48, 24)
    assert summary["total_flops"] == pytest.approx(_transformer_flops(12, 768, 128), rel=0.05)
    # the weights, plus 70,536 bytes of folded constants: the 128 x 128 float causal mask
    # (65,536 bytes), position ids and shape vectors
    assert summary["parameter_bytes"] == 4 * GPT2_PARAMETERS + 70_536
    assert folded_count(graph.warnings) == 1787 and warnings_besides_folding(graph.warnings) == []


def test_gpt2_imports_with_no_constant_or_shape_operators_once_dims_are_bound():
    graph = graph_from_onnx_bytes((FIXTURES / "gpt2.onnx").read_bytes(), dims={"batch": 1, "sequence": 128})
    shape_ops = {"Constant", "ConstantOfShape", "Shape", "Unsqueeze", "Squeeze", "Concat", "Slice", "Range"}
    assert set(graph.op_types.tolist()) & shape_ops == set()
    # what remains reads a runtime tensor: the two embedding lookups are the only Gathers
    assert sorted(graph.op_names[graph.op_types == "Gather"].tolist()) == ["/model/wpe/Gather", "/model/wte/Gather"]


def _import_without_folding(monkeypatch, data: bytes, dims: dict) -> onnx_import.Hypergraph:
    """The import with every node kept as an operator, as before folding."""
    with monkeypatch.context() as patch:
        patch.setattr(onnx_import, "_folded_nodes", lambda graph, values: np.zeros(len(graph.node), dtype=bool))
        return graph_from_onnx_bytes(data, dims=dims)


@pytest.mark.parametrize(
    ("fixture", "dims"),
    [
        ("bert_base", {"batch": 2, "sequence": 64}),
        ("gpt2", {"batch": 1, "sequence": 128}),
        ("lstm_seq2seq", {"batch": 1, "source": 20, "target": 16}),
    ],
)
def test_folding_changes_neither_the_flops_nor_the_tensor_bytes_of_the_operators_it_keeps(monkeypatch, fixture, dims):
    data = (FIXTURES / f"{fixture}.onnx").read_bytes()
    folded = graph_from_onnx_bytes(data, dims=dims)
    whole = _import_without_folding(monkeypatch, data, dims)
    assert whole.n_ops - folded.n_ops == folded_count(folded.warnings) > 0
    kept = [whole.op_names.tolist().index(name) for name in folded.op_names.tolist()]
    assert whole.op_types[kept].tolist() == folded.op_types.tolist()
    assert whole.op_flops[kept].tolist() == folded.op_flops.tolist()

    def tensor_bytes(graph, ops, ptr, ids):
        return [{graph.tensor_names[t]: graph.tensor_bytes[t] for t in ids[ptr[op] : ptr[op + 1]]} for op in ops]

    assert tensor_bytes(whole, kept, whole.input_ptr, whole.input_tensors) == tensor_bytes(
        folded, range(folded.n_ops), folded.input_ptr, folded.input_tensors
    )
    assert tensor_bytes(whole, kept, whole.output_ptr, whole.output_tensors) == tensor_bytes(
        folded, range(folded.n_ops), folded.output_ptr, folded.output_tensors
    )


def test_lstm_seq2seq_fixture_counts_both_recurrences():
    graph = graph_from_onnx_bytes(
        (FIXTURES / "lstm_seq2seq.onnx").read_bytes(), dims={"batch": 1, "source": 20, "target": 16}
    )
    by_type = {t: graph.op_flops[graph.op_types == t].sum() for t in set(graph.op_types.tolist())}
    # per step: 2 * 1024 * (128 + 256) gates + 2048 bias + 9 * 256 cell update = 790_784
    assert by_type["LSTM"] == 790_784 * (20 + 16)
    assert by_type["MatMul"] == 2 * 16 * 1000 * 256  # projection to the vocabulary
    # torch: 1,175,528 parameters (embedding 128k, two LSTMs 2 x 395,264, linear 257k), plus
    # 1,032 bytes of folded constants (the zero initial state and a shape vector)
    assert graph_summary(graph)["parameter_bytes"] == 4 * 1_175_528 + 1_032


def test_a_constant_of_a_data_type_onnx_does_not_know_is_input_error_or_a_graph_not_a_crash():
    # found by the corrupted-bytes property below: a flipped byte gave a Constant data_type 39
    value = helper.make_tensor("v", TensorProto.FLOAT, [2], [1.0, 2.0])
    value.data_type = 39
    data = tiny_model(
        [
            helper.make_node("Constant", [], ["c"], name="const", value=value),
            helper.make_node("Add", ["x", "c"], ["y"], name="add"),
        ],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
    )
    try:
        graph = graph_from_onnx_bytes(data)
    except InvalidInput:
        return
    assert graph.op_types.tolist() == ["Add"]  # the Constant is a parameter tensor


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cut=st.integers(0, 10_000), flips=st.lists(st.tuples(st.integers(0, 10_000), st.integers(1, 255)), max_size=4))
def test_corrupted_bytes_give_invalid_input_or_a_graph_never_another_error(cut, flips):
    data = bytearray((FIXTURES / "lstm_seq2seq.onnx").read_bytes())
    for position, mask in flips:
        data[position % len(data)] ^= mask
    data = bytes(data[: len(data) - cut % len(data)])
    try:
        graph = graph_from_onnx_bytes(data, dims={"batch": 1, "source": 4, "target": 3})
    except InvalidInput:
        return
    assert graph.n_ops >= 1
    assert (graph.tensor_bytes >= 0).all() and (graph.op_flops >= 0).all()


@pytest.mark.parametrize(
    ("fixture", "dims"),
    [("resnet50", {"batch": 2}), ("lstm_seq2seq", {"batch": 1, "source": 5, "target": 4})],
)
def test_imported_graph_round_trips_through_canonical_json_with_the_same_hash(fixture, dims):
    graph = graph_from_onnx_bytes((FIXTURES / f"{fixture}.onnx").read_bytes(), dims=dims)
    again = graph_from_json(graph_to_json(graph))
    assert model_hash(again) == model_hash(graph)
    assert again.op_flops.sum() == graph.op_flops.sum()
