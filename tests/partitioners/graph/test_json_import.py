"""JSON graph ingestion: the documented form becomes arrays; every bad input says where."""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest

from partitioners.errors import InputTooLarge, InvalidInput
from partitioners.graph.canonical import canonical_graph, graph_to_json, model_hash
from partitioners.graph.hypergraph import (
    OP_ROLE_BACKWARD,
    OP_ROLE_OPTIMIZER,
    ROLE_ABSENT,
    TENSOR_ACTIVATION,
    TENSOR_INPUT,
    TENSOR_PARAMETER,
    TENSOR_ROLE_GRADIENT,
    TENSOR_ROLE_OPTIMIZER_STATE,
    declares_training,
    graph_summary,
)
from partitioners.graph.json_import import graph_from_json
from tests.partitioners.training_step import mlp_training_step


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


# --- exported training steps: operator roles, gradients and optimizer state ---


def test_training_roles_are_read_into_arrays():
    graph = graph_from_json(mlp_training_step())
    role = dict(zip(graph.op_names.tolist(), graph.op_role.tolist()))
    assert role == {
        "fc1": ROLE_ABSENT, "fc2": ROLE_ABSENT, "loss_grad": OP_ROLE_BACKWARD, "fc2_grad_w": OP_ROLE_BACKWARD,
        "fc2_grad_x": OP_ROLE_BACKWARD, "fc1_grad_w": OP_ROLE_BACKWARD, "adam_w1": OP_ROLE_OPTIMIZER,
        "adam_w2": OP_ROLE_OPTIMIZER,
    }  # fmt: skip
    names = graph.tensor_names.tolist()
    of = {names[t]: names[p] for t, p in enumerate(graph.tensor_of.tolist()) if p >= 0}
    assert of == {"dw1": "w1", "dw2": "w2", "w1.m": "w1", "w1.v": "w1", "w2.m": "w2", "w2.v": "w2"}
    kinds = dict(zip(names, graph.tensor_role.tolist()))
    assert kinds["dw1"] == TENSOR_ROLE_GRADIENT and kinds["w1.m"] == TENSOR_ROLE_OPTIMIZER_STATE
    assert kinds["w1"] == kinds["h"] == ROLE_ABSENT
    assert (graph.op_role.dtype, graph.tensor_role.dtype, graph.tensor_of.dtype) == (np.int8, np.int8, np.int64)
    assert declares_training(graph)


def test_optimizer_state_is_resident_like_a_parameter_and_a_gradient_is_written():
    graph = graph_from_json(mlp_training_step())
    kind = dict(zip(graph.tensor_names.tolist(), graph.tensor_kind.tolist()))
    assert kind["w1.m"] == kind["w1"] == TENSOR_PARAMETER
    assert kind["dw1"] == TENSOR_ACTIVATION


def test_a_graph_without_roles_has_no_role_arrays_and_keeps_its_hash():
    graph = graph_from_json(_mlp())
    assert graph.op_role is graph.tensor_role is graph.tensor_of is None
    assert not declares_training(graph)


def test_forward_roles_alone_do_not_make_a_training_step():
    doc = _mlp()
    for node in doc["nodes"]:
        node["role"] = "forward"
    assert not declares_training(graph_from_json(doc))


def test_a_gradient_of_an_unknown_tensor_is_rejected_naming_it():
    doc = mlp_training_step()
    doc["tensors"][7]["of"] = "w3"
    err = _error(doc)
    assert (err.code, err.field) == ("unknown-tensor", "tensors[7].of")
    assert "'dw1'" in err.detail and "'w3'" in err.detail


def test_a_gradient_of_a_tensor_that_is_not_a_parameter_is_rejected():
    doc = mlp_training_step()
    doc["tensors"][7]["of"] = "h"
    err = _error(doc)
    assert (err.code, err.field) == ("kind-mismatch", "tensors[7].of")
    assert "'h'" in err.detail and '"parameter"' in err.detail


def test_a_gradient_without_its_parameter_is_rejected():
    doc = mlp_training_step()
    del doc["tensors"][7]["of"]
    err = _error(doc)
    assert (err.code, err.field) == ("invalid-tensor", "tensors[7].of")


def test_of_on_a_tensor_that_is_neither_gradient_nor_optimizer_state_is_rejected():
    doc = mlp_training_step()
    doc["tensors"][1]["of"] = "w1"
    err = _error(doc)
    assert (err.code, err.field) == ("invalid-tensor", "tensors[1].of")


def test_a_gradient_no_operator_writes_is_rejected():
    doc = mlp_training_step()
    doc["nodes"][5]["outputs"] = ["dw1_other"]
    doc["tensors"].append({"name": "dw1_other", "bytes": 4000})
    err = _error(doc)
    assert (err.code, err.field) == ("kind-mismatch", "tensors[7].kind")
    assert "gradient" in err.detail


def test_optimizer_state_an_operator_writes_is_rejected_explaining_in_place_updates():
    doc = mlp_training_step()
    doc["nodes"][6]["outputs"] = ["w1.m"]
    err = _error(doc)
    assert (err.code, err.field) == ("kind-mismatch", "tensors[9].kind")
    assert "in place" in err.detail


@pytest.mark.parametrize(
    ("mutate", "field"),
    [
        (lambda d: d["nodes"][2].update(role="update"), "nodes[2].role"),
        (lambda d: d["nodes"][2].update(role=1), "nodes[2].role"),
        (lambda d: d["tensors"][7].update(of=["w1"]), "tensors[7].of"),
        (lambda d: d["tensors"][7].update(kind="grad"), "tensors[7].kind"),
    ],
)
def test_malformed_training_fields_are_located_exactly(mutate, field):
    doc = mlp_training_step()
    mutate(doc)
    assert _error(doc).field == field


def test_training_roles_round_trip_through_the_stored_form_with_the_same_hash():
    graph = graph_from_json(mlp_training_step())
    stored = graph_to_json(graph)
    by_name = {t["name"]: t for t in stored["tensors"]}
    assert by_name["dw1"] == {"name": "dw1", "bytes": 4000, "kind": "gradient", "of": "w1"}
    assert by_name["w2.v"] == {"name": "w2.v", "bytes": 2000, "kind": "optimizer_state", "of": "w2"}
    roles = {n["name"]: n.get("role") for n in stored["nodes"]}
    assert roles["fc1"] is None and roles["fc1_grad_w"] == "backward" and roles["adam_w1"] == "optimizer"
    again = graph_from_json(stored)
    assert model_hash(again) == model_hash(graph)
    assert graph_to_json(again) == stored
    assert model_hash(canonical_graph(graph)) == model_hash(graph)


@pytest.mark.parametrize(
    "mutate",
    [
        lambda d: d["nodes"][2].update(role="forward"),  # a role changed
        lambda d: d["nodes"][0].update(role="forward"),  # a role given where it was left out
        lambda d: d["tensors"][10].update(of="w2"),  # optimizer state of another parameter
        lambda d: d["tensors"][10].pop("of"),  # optimizer state of no named parameter
        lambda d: d["tensors"][8].update(kind="activation", of=None),  # a gradient that is a plain activation
    ],
)
def test_graphs_that_differ_only_in_training_roles_hash_differently(mutate):
    doc = mlp_training_step()
    mutate(doc)
    assert model_hash(graph_from_json(doc)) != model_hash(graph_from_json(mlp_training_step()))


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
