"""canonical_graph: the graph renumbered into name order by permutation.

It must be, field for field, what writing the graph as JSON and reading it back
gives (the graph a worker plans from storage), with the ingest warnings kept; and it
must hash, and write, as the graph it came from.
"""

from __future__ import annotations

import copy
import pathlib

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from partitioners.graph.canonical import canonical_graph, graph_to_json, model_hash, name_order
from partitioners.graph.generators import synthetic_graph_json, synthetic_hypergraph
from partitioners.graph.hypergraph import Hypergraph, graph_from_ops
from partitioners.graph.json_import import graph_from_json
from partitioners.graph.onnx_import import graph_from_onnx_bytes
from tests.partitioners.graph.test_model_hash import graph_docs

FIXTURES = pathlib.Path(__file__).resolve().parents[2] / "fixtures" / "onnx"
_ARRAYS = (
    "op_names",
    "op_types",
    "op_flops",
    "op_param_bytes",
    "tensor_names",
    "tensor_bytes",
    "tensor_kind",
    "tensor_producer",
    "input_ptr",
    "input_tensors",
    "output_ptr",
    "output_tensors",
    "consumer_ptr",
    "consumer_ops",
)


def _round_trip(graph: Hypergraph) -> Hypergraph:
    """What storage gives back: the JSON form read again (the warnings are the graph's own)."""
    again = graph_from_json(graph_to_json(graph))
    assert again.warnings == list(graph.warnings)
    return again


def assert_same_graph(actual: Hypergraph, expected: Hypergraph) -> None:
    """Every field equal, including dtypes, -0.0 against 0.0 and None against an empty list."""
    assert actual.name == expected.name
    for field in _ARRAYS:
        a, e = getattr(actual, field), getattr(expected, field)
        assert a.dtype == e.dtype, field
        assert a.shape == e.shape, field
        assert a.tolist() == e.tolist(), field
        if a.dtype == np.float64:  # the sign of zero too
            assert (np.signbit(a) == np.signbit(e)).all(), field
    assert actual.tensor_shapes == expected.tensor_shapes
    assert actual.tensor_dtypes == expected.tensor_dtypes
    assert actual.warnings == expected.warnings
    if expected.op_device_types is None:
        assert actual.op_device_types is None
    else:
        assert actual.op_device_types is not None
        assert actual.op_device_types.dtype == object and actual.op_device_types.ndim == 1
        assert actual.op_device_types.tolist() == expected.op_device_types.tolist()


def _check(graph: Hypergraph) -> None:
    canonical = canonical_graph(graph)
    assert_same_graph(canonical, _round_trip(graph))
    assert model_hash(canonical) == model_hash(_round_trip(graph))
    assert graph_to_json(canonical) == graph_to_json(graph)
    order = name_order(graph)
    assert model_hash(graph, order) == model_hash(graph)
    assert_same_graph(canonical_graph(graph, order), canonical)


@settings(max_examples=80, deadline=None)
@given(graph_docs(), st.randoms(use_true_random=False))
def test_canonical_graph_is_the_json_round_trip_of_random_graphs(doc, rng):
    shuffled = copy.deepcopy(doc)
    rng.shuffle(shuffled["nodes"])
    rng.shuffle(shuffled["tensors"])
    _check(graph_from_json(shuffled))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_canonical_graph_is_the_json_round_trip_of_synthetic_graphs(seed):
    _check(graph_from_json(synthetic_graph_json(400, seed=seed)))
    _check(synthetic_hypergraph(300, seed=seed))


@pytest.mark.parametrize("fixture", ["bert_base.onnx", "gpt2.onnx", "lstm_seq2seq.onnx", "resnet50.onnx"])
def test_canonical_graph_is_the_json_round_trip_of_onnx_imports(fixture):
    dims = {"batch": 2, "sequence": 16, "source": 8, "target": 8}
    data = (FIXTURES / fixture).read_bytes()
    graph = graph_from_onnx_bytes(data, dims={k: v for k, v in dims.items() if k.encode() in data})
    _check(graph)


def test_the_json_forms_normalisations_are_kept():
    """-0.0 bytes fold to 0.0; an all-absent shape, dtype or device column is None; param_bytes
    equal to the parameter tensors read are derived; the rest stays."""
    doc = {
        "name": "edges",
        "nodes": [
            {"name": "b", "op": "MatMul", "inputs": ["x", "w"], "outputs": ["y"], "flops": -0.0, "param_bytes": 64},
            {
                "name": "a",
                "op": "Relu",
                "inputs": ["y"],
                "outputs": ["z"],
                "flops": 3.5,
                "param_bytes": 10.25,
                "device_types": None,
            },
        ],
        "tensors": [
            {"name": "z", "bytes": 2.5, "shape": None, "dtype": None},
            {"name": "x", "bytes": -0.0},
            {"name": "w", "bytes": 64, "kind": "parameter"},
            {"name": "y", "bytes": 8},
        ],
        "warnings": ["carried"],
    }
    graph = graph_from_json(doc)
    _check(graph)
    canonical = canonical_graph(graph)
    assert canonical.op_names.tolist() == ["a", "b"]
    assert canonical.tensor_names.tolist() == ["w", "x", "y", "z"]
    assert not np.signbit(canonical.tensor_bytes).any()
    assert np.signbit(canonical.op_flops[1])  # flops keep their sign, as the JSON form writes it
    assert canonical.op_param_bytes.tolist() == [10.25, 64.0]
    assert canonical.tensor_shapes is None and canonical.tensor_dtypes is None
    assert canonical.op_device_types is None
    assert canonical.warnings == ["carried"]


def test_all_absent_columns_of_a_hand_built_graph_become_none():
    graph = graph_from_ops("ops", [("f", "Relu", 1.0, ["x"], ["y"])], {"x": 4.0, "y": 4.0})
    listed = Hypergraph(
        **{
            **graph.__dict__,
            "tensor_shapes": [None, None],
            "tensor_dtypes": [None, None],
            "op_device_types": np.array([None], dtype=object),
        }
    )
    _check(listed)
    canonical = canonical_graph(listed)
    assert canonical.tensor_shapes is None and canonical.tensor_dtypes is None and canonical.op_device_types is None


def test_a_graph_without_tensors_keeps_an_empty_dtype_column_as_the_json_reader_does():
    graph = graph_from_ops("bare", [("only", "Custom", 5.0, [], [])], {})
    _check(graph)
    assert canonical_graph(graph).tensor_dtypes == []


def test_device_restrictions_and_partial_shapes_are_permuted_with_their_owners():
    doc = {
        "name": "restricted",
        "nodes": [
            {
                "name": "z_op",
                "op": "MatMul",
                "inputs": ["in"],
                "outputs": ["mid"],
                "flops": 1.0,
                "device_types": ["gpu", "tpu"],
            },
            {"name": "a_op", "op": "Relu", "inputs": ["mid"], "outputs": ["out"], "flops": 2.0},
        ],
        "tensors": [
            {"name": "out", "bytes": 16, "shape": [2, None], "dtype": "float16"},
            {"name": "mid", "bytes": 16},
            {"name": "in", "bytes": 16, "shape": [4], "dtype": "float32"},
        ],
    }
    graph = graph_from_json(doc)
    _check(graph)
    canonical = canonical_graph(graph)
    assert canonical.op_device_types.tolist() == [None, ("gpu", "tpu")]
    assert canonical.tensor_shapes == [(4,), None, (2, None)]
    assert canonical.tensor_dtypes == ["float32", None, "float16"]
