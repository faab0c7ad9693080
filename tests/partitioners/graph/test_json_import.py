"""JSON graph ingestion: the documented form becomes arrays; every bad input says where."""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest

from partitioners.errors import InputTooLarge, InvalidInput
from partitioners.graph.canonical import graph_to_json, model_hash
from partitioners.graph.hypergraph import TENSOR_ACTIVATION, TENSOR_INPUT, TENSOR_PARAMETER, graph_summary
from partitioners.graph.json_import import graph_from_json


def _mlp() -> dict:
    """x -> fc1 (w1) -> relu -> fc2 (w2) -> y, float32, batch 2."""
    return {
        "name": "mlp",
        "nodes": [
            {"name": "fc1", "op": "MatMul", "inputs": ["x", "w1"], "outputs": ["h"], "flops": 2 * 2 * 4 * 8},
            {"name": "relu", "op": "Relu", "inputs": ["h"], "outputs": ["a"], "flops": 16},
            {"name": "fc2", "op": "MatMul", "inputs": ["a", "w2"], "outputs": ["y"], "flops": 2 * 2 * 8 * 3},
        ],
        "tensors": [
            {"name": "x", "bytes": 32, "shape": [2, 4], "dtype": "float32"},
            {"name": "w1", "bytes": 128, "shape": [4, 8], "dtype": "float32", "kind": "parameter"},
            {"name": "h", "bytes": 64, "shape": [2, 8], "dtype": "float32"},
            {"name": "a", "bytes": 64, "shape": [2, 8], "dtype": "float32"},
            {"name": "w2", "bytes": 96, "shape": [8, 3], "dtype": "float32", "kind": "parameter"},
            {"name": "y", "bytes": 24, "shape": [2, 3], "dtype": "float32"},
        ],
    }


def _error(doc: dict, **limits) -> InvalidInput:
    with pytest.raises(InvalidInput) as info:
        graph_from_json(doc, **limits)
    return info.value


def test_json_graph_becomes_csr_arrays():
    graph = graph_from_json(_mlp())
    assert graph.op_names.tolist() == ["fc1", "relu", "fc2"]
    assert [graph.tensor_names[t] for t in graph.inputs_of(2)] == ["a", "w2"]
    assert graph.tensor_producer.tolist() == [-1, -1, 0, 1, -1, 2]
    assert graph.consumers_of(3).tolist() == [2]
    assert graph.op_flops.tolist() == [128.0, 16.0, 96.0]
    assert graph.tensor_shapes[1] == (4, 8)
    assert graph.tensor_dtypes[5] == "float32"


def test_unproduced_tensor_is_input_or_parameter_by_kind():
    graph = graph_from_json(_mlp())
    assert graph.tensor_kind.tolist() == [
        TENSOR_INPUT, TENSOR_PARAMETER, TENSOR_ACTIVATION, TENSOR_ACTIVATION, TENSOR_PARAMETER, TENSOR_ACTIVATION,
    ]  # fmt: skip
    assert graph.op_param_bytes.tolist() == [128.0, 0.0, 96.0]


def test_node_param_bytes_overrides_parameter_tensors():
    doc = _mlp()
    doc["nodes"][1]["param_bytes"] = 1000
    graph = graph_from_json(doc)
    assert graph.op_param_bytes.tolist() == [128.0, 1000.0, 96.0]
    assert graph_summary(graph)["parameter_bytes"] == 128 + 96 + 1000


def test_missing_flops_are_estimated_from_shapes():
    doc = _mlp()
    for node in doc["nodes"]:
        del node["flops"]
    graph = graph_from_json(doc)
    # MatMul 2*M*N*K, Relu one per output element
    assert graph.op_flops.tolist() == [2 * 2 * 8 * 4, 16.0, 2 * 2 * 3 * 8]
    assert graph.warnings == []


def test_missing_flops_without_shapes_use_output_bytes_and_warn():
    doc = _mlp()
    for tensor in doc["tensors"]:
        del tensor["shape"]
    del doc["nodes"][1]["flops"]
    graph = graph_from_json(doc)
    assert graph.op_flops[1] == 64 / 4
    assert len(graph.warnings) == 1 and graph.warnings[0].startswith('1 operator has neither "flops"')


def test_unknown_op_type_is_estimated_elementwise_with_a_warning():
    doc = _mlp()
    doc["nodes"][1]["op"] = "MyCustomActivation"
    del doc["nodes"][1]["flops"]
    graph = graph_from_json(doc)
    assert graph.op_flops[1] == 16.0
    assert any("MyCustomActivation" in w for w in graph.warnings)


def test_device_types_are_kept_per_operator():
    doc = _mlp()
    doc["nodes"][0]["device_types"] = ["H100", "A100"]
    graph = graph_from_json(doc)
    assert graph.op_device_types.tolist() == [("H100", "A100"), None, None]
    assert graph_from_json(_mlp()).op_device_types is None


def test_too_many_ops_is_rejected_before_building():
    doc = _mlp()
    doc["nodes"].append({"this entry": "is not even valid"})
    err = _error(doc, max_ops=3)
    assert isinstance(err, InputTooLarge)
    assert err.code == "too-many-ops" and "4 operators" in err.detail


def test_too_many_tensors_is_rejected():
    err = _error(_mlp(), max_tensors=5)
    assert isinstance(err, InputTooLarge) and err.code == "too-many-tensors"


def test_empty_graph_is_rejected():
    err = _error({"name": "e", "nodes": [], "tensors": []})
    assert err.code == "empty-graph"


def test_consumed_but_undeclared_tensor_is_unknown():
    doc = _mlp()
    doc["nodes"][2]["inputs"] = ["a", "w3"]
    err = _error(doc)
    assert err.code == "unknown-tensor"
    assert err.field == "nodes[2].inputs[1]"
    assert "'w3'" in err.detail and "'fc2'" in err.detail


def test_written_but_undeclared_tensor_is_unknown():
    doc = _mlp()
    doc["nodes"][1]["outputs"] = ["a2"]
    err = _error(doc)
    assert (err.code, err.field) == ("unknown-tensor", "nodes[1].outputs[0]")


def test_two_producers_for_one_tensor_are_rejected():
    doc = _mlp()
    doc["nodes"][2]["outputs"] = ["h"]
    err = _error(doc)
    assert err.code == "duplicate-producer"
    assert "'fc1'" in err.detail and "'fc2'" in err.detail and "'h'" in err.detail


@pytest.mark.parametrize(
    ("section", "index", "key", "value"),
    [
        ("tensors", 2, "bytes", -1),
        ("tensors", 2, "bytes", math.inf),
        ("tensors", 2, "bytes", math.nan),
        ("nodes", 1, "flops", -5.0),
        ("nodes", 1, "flops", math.nan),
        ("nodes", 1, "param_bytes", -math.inf),
        ("tensors", 0, "bytes", 10**400),  # a JSON integer no double can hold
        ("nodes", 0, "flops", -(10**400)),
    ],
)
def test_negative_or_non_finite_numbers_are_rejected(section, index, key, value):
    doc = _mlp()
    doc[section][index][key] = value
    err = _error(doc)
    assert err.code == "invalid-number"
    assert err.field == f"{section}[{index}].{key}"


@pytest.mark.parametrize(
    ("section", "index", "key", "value"),
    [
        ("tensors", 2, "bytes", 2**50 + 1),  # over a pebibyte
        ("nodes", 1, "param_bytes", 1e300),
        ("nodes", 1, "flops", 1.7e308),  # doubled for the backward pass it was infinite, and a 500
    ],
)
def test_sizes_and_flop_counts_no_hardware_has_are_rejected(section, index, key, value):
    doc = _mlp()
    doc[section][index][key] = value
    err = _error(doc)
    assert (err.code, err.field) == ("invalid-number", f"{section}[{index}].{key}")
    assert "from 0 to" in err.detail


def test_duplicate_op_name_is_rejected():
    doc = _mlp()
    doc["nodes"][2]["name"] = "fc1"
    err = _error(doc)
    assert (err.code, err.field) == ("duplicate-op", "nodes[2].name")


def test_duplicate_tensor_name_is_rejected():
    doc = _mlp()
    doc["tensors"].append({"name": "h", "bytes": 1})
    err = _error(doc)
    assert (err.code, err.field) == ("duplicate-tensor", "tensors[6].name")


def test_cycle_is_rejected_naming_an_operator_on_it():
    doc = _mlp()
    doc["nodes"][0]["inputs"] = ["x", "w1", "a"]  # fc1 reads relu's output
    err = _error(doc)
    assert err.code == "cycle"
    assert "'fc1'" in err.detail or "'relu'" in err.detail
    assert "fc2" not in err.detail


@pytest.mark.parametrize(
    ("mutate", "field"),
    [
        (lambda d: d["nodes"][1].pop("op"), "nodes[1].op"),
        (lambda d: d["nodes"][1].update(inputs="h"), "nodes[1].inputs"),
        (lambda d: d["nodes"][1].update(inputs=[3]), "nodes[1].inputs[0]"),
        (lambda d: d["nodes"][1].update(flops="16"), "nodes[1].flops"),
        (lambda d: d["nodes"][1].update(flops=True), "nodes[1].flops"),
        (lambda d: d["nodes"][0].update(device_types="H100"), "nodes[0].device_types"),
        (lambda d: d["tensors"][3].pop("bytes"), "tensors[3].bytes"),
        (lambda d: d["tensors"][3].update(shape=[2, -8]), "tensors[3].shape"),
        (lambda d: d["tensors"][3].update(shape=[2, "seq"]), "tensors[3].shape"),
        (lambda d: d["tensors"][3].update(shape=[2**64]), "tensors[3].shape"),
        (lambda d: d["tensors"][3].update(kind="weights"), "tensors[3].kind"),
        (lambda d: d["nodes"][0].update(device_types=[]), "nodes[0].device_types"),
        (lambda d: d.update(warnings="not a list"), "warnings"),
        (lambda d: d["tensors"].__setitem__(3, "a"), "tensors[3]"),
    ],
)
def test_malformed_entry_is_located_exactly(mutate, field):
    doc = _mlp()
    mutate(doc)
    err = _error(doc)
    assert err.field == field


def test_parameter_kind_on_a_produced_tensor_is_rejected():
    doc = _mlp()
    doc["tensors"][2]["kind"] = "parameter"
    err = _error(doc)
    assert (err.code, err.field) == ("kind-mismatch", "tensors[2].kind")


def test_graph_to_json_round_trips_with_the_same_hash():
    doc = _mlp()
    doc["nodes"][1]["param_bytes"] = 7
    doc["nodes"][0]["device_types"] = ["H100"]
    graph = graph_from_json(doc)
    again = graph_from_json(graph_to_json(graph))
    assert model_hash(again) == model_hash(graph)

    def by_name(g):
        return dict(zip(g.op_names.tolist(), g.op_param_bytes.tolist()))

    assert by_name(again) == by_name(graph) == {"fc1": 128.0, "relu": 7.0, "fc2": 96.0}
    assert graph_to_json(again) == graph_to_json(graph)


def test_graph_to_json_lists_nodes_and_tensors_in_name_order():
    canonical = graph_to_json(graph_from_json(_mlp()))
    assert [n["name"] for n in canonical["nodes"]] == ["fc1", "fc2", "relu"]
    assert [t["name"] for t in canonical["tensors"]] == ["a", "h", "w1", "w2", "x", "y"]
    assert canonical["tensors"][2] == {
        "name": "w1",
        "bytes": 128,
        "shape": [4, 8],
        "dtype": "float32",
        "kind": "parameter",
    }


def test_graph_summary_totals():
    summary = graph_summary(graph_from_json(_mlp()))
    assert summary == {
        "name": "mlp",
        "n_ops": 3,
        "n_tensors": 6,
        "total_flops": 240.0,
        "parameter_bytes": 224.0,
        "activation_bytes": 152.0,
        "input_bytes": 32.0,
        "n_warnings": 0,
    }


def test_ingestion_does_not_modify_the_document():
    doc = _mlp()
    for node in doc["nodes"]:
        del node["flops"]
    before = copy.deepcopy(doc)
    graph_from_json(doc)
    assert doc == before


def test_arrays_have_documented_dtypes():
    graph = graph_from_json(_mlp())
    assert graph.input_ptr.dtype == np.int64 and graph.tensor_kind.dtype == np.int8
    assert graph.op_flops.dtype == np.float64


def test_null_dimension_is_an_unknown_dimension_and_round_trips():
    doc = _mlp()
    doc["tensors"][3]["shape"] = [None, 8]
    graph = graph_from_json(doc)
    assert graph.tensor_shapes[3] == (None, 8)
    canonical = graph_to_json(graph)
    assert canonical["tensors"][0]["shape"] == [None, 8]
    assert model_hash(graph_from_json(canonical)) == model_hash(graph)
    assert model_hash(graph) != model_hash(graph_from_json(_mlp()))


def test_json_form_of_a_synthetic_graph_rebuilds_the_same_arrays():
    from partitioners.graph.generators import synthetic_graph_json, synthetic_hypergraph

    built = synthetic_hypergraph(500, seed=3)
    graph = graph_from_json(synthetic_graph_json(500, seed=3))
    assert graph.op_names.tolist() == built.op_names.tolist()
    assert graph.tensor_names.tolist() == built.tensor_names.tolist()
    for field in ("input_ptr", "input_tensors", "output_ptr", "output_tensors", "consumer_ptr", "consumer_ops"):
        assert np.array_equal(getattr(graph, field), getattr(built, field)), field
    assert np.array_equal(graph.tensor_kind, built.tensor_kind)
    assert np.array_equal(graph.tensor_bytes, np.trunc(built.tensor_bytes))  # the JSON form writes int(bytes)
    assert np.array_equal(graph.op_flops, built.op_flops)
    assert np.array_equal(graph.op_param_bytes, built.op_param_bytes)


@pytest.mark.parametrize(
    ("mutate", "field", "suggestion"),
    [
        (lambda d: d["nodes"][1].update(flop=1e20), "nodes[1].flop", "flops"),
        (lambda d: d["tensors"][4].update(byte=96), "tensors[4].byte", "bytes"),
        (lambda d: d.update(tensor=[]), "tensor", "tensors"),
    ],
)
def test_a_misspelt_field_is_rejected_naming_it_and_the_field_meant(mutate, field, suggestion):
    doc = _mlp()
    mutate(doc)
    err = _error(doc)
    assert (err.code, err.field) == ("unknown-field", field)
    assert f'did you mean "{suggestion}"?' in err.detail


def test_a_misspelt_required_field_is_reported_as_unknown_rather_than_missing():
    doc = _mlp()
    doc["nodes"][1]["nmae"] = doc["nodes"][1].pop("name")
    err = _error(doc)
    assert (err.code, err.field) == ("unknown-field", "nodes[1].nmae")


def test_an_unprintable_unknown_field_is_named_escaped():
    doc = _mlp()
    doc["nodes"][0]["a\x00b"] = 1
    err = _error(doc)
    assert err.field == "nodes[0].'a\\x00b'"
    assert "\x00" not in err.detail


@pytest.mark.parametrize(("section", "index", "code"), [("nodes", 1, "invalid-node"), ("tensors", 0, "invalid-tensor")])
def test_an_empty_name_is_rejected(section, index, code):
    doc = _mlp()
    doc[section][index]["name"] = ""
    err = _error(doc)
    assert (err.code, err.field) == (code, f"{section}[{index}].name")


def test_the_stored_form_with_its_warnings_is_read_back():
    doc = _mlp()
    doc["nodes"][1]["op"] = "FancyOp"
    del doc["nodes"][1]["flops"]  # estimated, with a warning that the stored form carries
    stored = graph_to_json(graph_from_json(doc))
    assert "warnings" in stored
    assert graph_from_json(stored).warnings == stored["warnings"]


# ------------------------------------------------------------------ the compiler's own times


def _timed(*times: object) -> dict:
    nodes = [
        {"name": f"n{i}", "op": "Relu", "inputs": [f"t{i}"], "outputs": [f"t{i + 1}"], "time_s": t}
        for i, t in enumerate(times)
    ]
    return {"nodes": nodes, "tensors": [{"name": f"t{i}", "bytes": 4} for i in range(len(times) + 1)]}


def test_a_node_time_in_seconds_applies_to_every_device_and_absent_ones_are_nan():
    g = graph_from_json(_timed(1e-3, None))
    assert g.op_time_keys == ("*",)
    np.testing.assert_array_equal(g.op_time_s[:, 0], [1e-3, np.nan])


def test_a_node_time_object_gives_one_column_per_device_type():
    g = graph_from_json(_timed({"h100": 1e-3, "a100": 2e-3}, 5e-4))
    assert g.op_time_keys == ("*", "a100", "h100")
    np.testing.assert_array_equal(g.op_time_s, [[np.nan, 2e-3, 1e-3], [5e-4, np.nan, np.nan]])


def test_a_graph_without_node_times_carries_none():
    assert graph_from_json(_mlp()).op_time_s is None


def test_a_negative_node_time_names_the_field():
    with pytest.raises(InvalidInput) as err:
        graph_from_json(_timed(1e-3, -1.0))
    assert err.value.field == "nodes[1].time_s" and err.value.code == "invalid-number"


def test_a_node_time_that_is_not_a_number_names_the_field():
    with pytest.raises(InvalidInput) as err:
        graph_from_json(_timed({"h100": "fast"}))
    assert err.value.field == "nodes[0].time_s"


def test_node_times_survive_the_canonical_form_and_enter_the_model_hash():
    g = graph_from_json(_timed({"h100": 1e-3}, 2e-3))
    again = graph_from_json(graph_to_json(g))
    np.testing.assert_array_equal(again.op_time_s, g.op_time_s)
    assert model_hash(again) == model_hash(g) != model_hash(graph_from_json(_timed({"h100": 1e-3}, 3e-3)))
