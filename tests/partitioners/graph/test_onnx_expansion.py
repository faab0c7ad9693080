"""The operators a model expands to are counted before shape inference expands them:
functions inlined, control-flow bodies counted once, each function's count kept."""

from __future__ import annotations

import onnx
import pytest
from onnx import TensorProto, helper

from partitioners.errors import InputTooLarge, InvalidInput
from partitioners.graph.onnx_expansion import expanded_op_count
from partitioners.graph.onnx_import import graph_from_onnx_bytes
from tests.partitioners.graph.onnx_helpers import expanding_functions

OPSETS = [helper.make_opsetid("", 17), helper.make_opsetid("local", 1)]


def _value(name: str) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, [4])


def _model(nodes, functions=()) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "m", [_value("x")], [_value("y")])
    return helper.make_model(graph, functions=list(functions), opset_imports=OPSETS)


def _branch(nodes, name: str) -> onnx.GraphProto:
    return helper.make_graph(nodes, name, [], [_value("y")])


def test_a_function_called_twice_per_level_forty_deep_counts_two_to_the_fortieth():
    assert expanded_op_count(onnx.load_model_from_string(expanding_functions(40))) == 2**40


def test_a_model_without_functions_or_bodies_counts_its_nodes():
    relus = [helper.make_node("Relu", ["x"], ["a"]), helper.make_node("Relu", ["a"], ["y"])]
    assert expanded_op_count(_model(relus)) == 2


def test_a_function_call_counts_as_its_body_not_as_an_operator_of_its_own():
    body = [helper.make_node("Relu", ["x"], ["t"]), helper.make_node("Neg", ["t"], ["y"])]
    pair = helper.make_function("local", "pair", ["x"], ["y"], body, OPSETS)
    calls = [
        helper.make_node("pair", ["x"], ["a"], domain="local"),
        helper.make_node("pair", ["a"], ["y"], domain="local"),
    ]
    assert expanded_op_count(_model(calls, [pair])) == 4


def test_an_if_counts_itself_and_both_branches_and_calls_inside_them_are_inlined():
    then_branch = _branch([helper.make_node("f3", ["x"], ["y"], domain="local")], "then")
    else_branch = _branch([helper.make_node("Relu", ["x"], ["y"])], "else")
    model = onnx.load_model_from_string(expanding_functions(3))
    del model.graph.node[:]
    model.graph.node.append(helper.make_node("If", ["x"], ["y"], then_branch=then_branch, else_branch=else_branch))
    assert expanded_op_count(model) == 1 + 2**3 + 1


def test_a_loop_body_counts_once_whatever_its_trip_count():
    body = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"]), helper.make_node("Identity", ["c"], ["c_out"])],
        "body",
        [
            helper.make_tensor_value_info("i", TensorProto.INT64, []),
            helper.make_tensor_value_info("c", TensorProto.BOOL, []),
        ],
        [helper.make_tensor_value_info("c_out", TensorProto.BOOL, []), _value("y")],
    )
    loop = helper.make_node("Loop", ["n", "cond"], ["y"], body=body)
    assert expanded_op_count(_model([loop])) == 3


def test_a_chain_of_ten_thousand_functions_is_counted_without_exhausting_the_stack():
    functions = [helper.make_function("local", "f0", ["x"], ["y"], [helper.make_node("Relu", ["x"], ["y"])], OPSETS)]
    for k in range(1, 10_000):
        call = helper.make_node(f"f{k - 1}", ["x"], ["y"], domain="local")
        functions.append(helper.make_function("local", f"f{k}", ["x"], ["y"], [call], OPSETS))
    model = _model([helper.make_node("f9999", ["x"], ["y"], domain="local")], functions)
    assert expanded_op_count(model) == 1


def test_functions_that_call_each_other_in_a_cycle_are_malformed():
    ping = helper.make_function(
        "local", "ping", ["x"], ["y"], [helper.make_node("pong", ["x"], ["y"], domain="local")], OPSETS
    )
    pong = helper.make_function(
        "local", "pong", ["x"], ["y"], [helper.make_node("ping", ["x"], ["y"], domain="local")], OPSETS
    )
    with pytest.raises(InvalidInput) as refused:
        expanded_op_count(_model([helper.make_node("ping", ["x"], ["y"], domain="local")], [ping, pong]))
    assert refused.value.code == "malformed-onnx" and "calls itself" in refused.value.detail


def test_the_importer_refuses_a_model_that_expands_past_the_limit_before_inferring_its_shapes():
    # 2^40 operators: shape inference would never finish, so a prompt answer is the proof
    with pytest.raises(InputTooLarge) as refused:
        graph_from_onnx_bytes(expanding_functions(40), max_ops=1_000_000)
    assert (refused.value.field, refused.value.code) == ("model", "too-many-ops")
    assert "1.1e+12 operators" in refused.value.detail and "1000000" in refused.value.detail


def test_the_importer_takes_a_model_that_expands_within_the_limit():
    graph = graph_from_onnx_bytes(expanding_functions(3), max_ops=8)
    assert graph.n_ops == 1  # the call stays one operator of the placement graph
