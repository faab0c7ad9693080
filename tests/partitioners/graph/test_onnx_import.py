"""ONNX import: bytes in, hypergraph with sizes and FLOPs out, weights never read.

Binding dims, what is malformed, the limits, references, unknown operators, control flow
and names. Constant folding, the exported fixtures and memory have their own files.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from partitioners.errors import InputTooLarge, InvalidInput
from partitioners.graph.canonical import model_hash
from partitioners.graph.hypergraph import ROLE_ABSENT, TENSOR_INPUT, TENSOR_PARAMETER, TENSOR_ROLE_GRADIENT
from partitioners.graph.onnx_import import graph_from_onnx_bytes
from tests.partitioners.graph.onnx_helpers import (
    FIXTURES,
    external_weight,
    folded_count,
    linear_relu,
    tiny_model,
    warnings_besides_folding,
)


def test_weights_pointing_to_missing_external_data_are_parameters_sized_from_dims():
    graph = graph_from_onnx_bytes(linear_relu(), dims={"batch": 2})
    w = graph.tensor_names.tolist().index("W")
    assert graph.tensor_kind[w] == TENSOR_PARAMETER
    assert graph.tensor_bytes[w] == 4 * 3 * 4
    assert graph.tensor_shapes[w] == (4, 3)
    assert graph.tensor_dtypes[w] == "float32"
    assert graph.op_param_bytes.tolist() == [48.0, 0.0]


def test_bound_dims_give_exact_sizes_and_flops():
    graph = graph_from_onnx_bytes(linear_relu(), dims={"batch": 8})
    names = graph.tensor_names.tolist()
    assert graph.tensor_kind[names.index("x")] == TENSOR_INPUT
    assert graph.tensor_bytes[names.index("x")] == 8 * 4 * 4
    assert graph.tensor_bytes[names.index("h")] == 8 * 3 * 4  # found by shape inference
    # MatMul: 2 * (8*3 outputs) * 4; Relu: 24 outputs
    assert graph.op_flops.tolist() == [2 * 24 * 4, 24]
    assert graph.warnings == []


def test_shapes_computed_from_bound_dims_are_folded_so_downstream_flops_are_exact():
    # Reshape to [batch, seq, 2, 4] with a target computed as Shape(x)[0:rank-1] ++ [2, 4]:
    # plain ONNX inference cannot see through the computed Slice end, folding can.
    def i64(name, values):
        tensor = helper.make_tensor(name, TensorProto.INT64, [len(values)], values)
        return helper.make_node("Constant", [], [name], value=tensor)

    nodes = [
        helper.make_node("Shape", ["x"], ["s"], name="shape"),
        i64("zero", [0]),
        i64("one", [1]),
        i64("tail", [2, 4]),
        helper.make_node("Shape", ["s"], ["rank"], name="rank"),
        helper.make_node("Sub", ["rank", "one"], ["end"], name="end"),
        helper.make_node("Slice", ["s", "zero", "end"], ["lead"], name="lead"),
        helper.make_node("Concat", ["lead", "tail"], ["target"], name="target", axis=0),
        helper.make_node("Reshape", ["x", "target"], ["r"], name="reshape"),
        helper.make_node("MatMul", ["r", "W"], ["y"], name="fc"),
    ]
    data = tiny_model(
        nodes,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq", 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [external_weight("W", [4, 3])],
    )
    graph = graph_from_onnx_bytes(data, dims={"batch": 2, "seq": 5})
    # the shape arithmetic is folded away (8 nodes): only the Reshape and MatMul are operators
    assert graph.op_types.tolist() == ["Reshape", "MatMul"]
    assert graph.op_flops[-1] == 2 * (2 * 5 * 2 * 3) * 4  # [2,5,2,4] @ [4,3]
    assert graph.tensor_shapes[graph.tensor_names.tolist().index("y")] == (2, 5, 2, 3)
    assert folded_count(graph.warnings) == 8 and warnings_besides_folding(graph.warnings) == []


def test_inline_weights_give_the_same_graph_as_missing_external_ones():
    def linear(weight):
        return tiny_model(
            [helper.make_node("MatMul", ["x", "W"], ["y"], name="fc")],
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 300])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 300])],
            [weight],
        )

    values = np.random.default_rng(0).standard_normal((300, 300)).astype(np.float32)
    inline = graph_from_onnx_bytes(linear(onnx.numpy_helper.from_array(values, "W")))
    external = graph_from_onnx_bytes(linear(external_weight("W", [300, 300])))
    assert inline.tensor_bytes.tolist() == external.tensor_bytes.tolist() == [1200.0, 360_000.0, 1200.0]
    assert model_hash(inline) == model_hash(external)


def test_dims_that_match_no_input_are_reported():
    graph = graph_from_onnx_bytes(linear_relu(), dims={"batch": 2, "sequense": 128})
    assert any("sequense" in w for w in graph.warnings)


def test_unbound_dynamic_dim_is_named():
    with pytest.raises(InvalidInput, match="'batch'") as info:
        graph_from_onnx_bytes(linear_relu())
    assert info.value.code == "unbound-dim"
    assert info.value.field == "dims"


def test_every_unbound_dim_is_listed():
    data = tiny_model(
        [helper.make_node("Relu", ["x"], ["y"])],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "sequence", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
    )
    with pytest.raises(InvalidInput, match=r"'batch'.*'sequence'.*are not bound"):
        graph_from_onnx_bytes(data, dims={})


def test_negative_declared_dims_count_as_unknown_never_as_negative_bytes():
    data = tiny_model(
        [helper.make_node("Relu", ["x"], ["y"])],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [-3, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
    )
    graph = graph_from_onnx_bytes(data)
    assert graph.tensor_bytes.tolist() == [0.0, 0.0]
    assert any("0 bytes" in w for w in graph.warnings)


@pytest.mark.parametrize("value", [0, -1, 2.5, True, 2**40])
def test_dim_values_must_be_positive_int32(value):
    with pytest.raises(InvalidInput) as info:
        graph_from_onnx_bytes(linear_relu(), dims={"batch": value})
    assert info.value.code == "invalid-dims"


def test_a_binding_that_makes_a_tensor_absurdly_large_is_rejected():
    data = tiny_model(
        [helper.make_node("Relu", ["x"], ["y"], name="act")],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4096, 4096])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
    )
    with pytest.raises(InvalidInput, match="'x'") as info:  # 2^31 * 2^24 * 4 bytes > 2^50
        graph_from_onnx_bytes(data, dims={"batch": 2**31 - 1})
    assert info.value.code == "absurd-size"


def test_a_tile_whose_constant_repeats_overflow_64_bits_is_absurd_not_a_tensor_of_unknown_size():
    # 4 x 2^62 elements wraps around in ONNX inference's int64 and would come back shapeless, planned as 0 bytes
    data = tiny_model(
        [helper.make_node("Tile", ["x", "repeats"], ["y"], name="tile")],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [onnx.numpy_helper.from_array(np.array([2**62], dtype=np.int64), "repeats")],
    )
    with pytest.raises(InvalidInput, match="'tile'") as info:
        graph_from_onnx_bytes(data)
    assert (info.value.field, info.value.code) == ("model", "absurd-size")


def test_an_expand_to_a_huge_constant_shape_inside_a_branch_is_absurd():
    shape = helper.make_node(
        "Constant", [], ["shape"], value=onnx.numpy_helper.from_array(np.array([10**9] * 3, dtype=np.int64))
    )
    branch = helper.make_graph(
        [shape, helper.make_node("Expand", ["x", "shape"], ["y"], name="expand")],
        "then",
        [],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
    )
    data = tiny_model(
        [helper.make_node("If", ["c"], ["y"], then_branch=branch, else_branch=branch, name="if")],
        [
            helper.make_tensor_value_info("c", TensorProto.BOOL, []),
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [1]),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
    )
    with pytest.raises(InvalidInput, match="'expand'") as info:
        graph_from_onnx_bytes(data)
    assert info.value.code == "absurd-size"


def test_empty_bytes_are_rejected_as_no_graph():
    with pytest.raises(InvalidInput) as info:
        graph_from_onnx_bytes(b"")
    assert info.value.code == "malformed-onnx"


def test_garbage_bytes_are_malformed():
    with pytest.raises(InvalidInput) as info:
        graph_from_onnx_bytes(b"\xff\xfe this is not protobuf \x00\x01" * 10)
    assert info.value.code == "malformed-onnx"


def test_truncated_file_is_malformed():
    data = (FIXTURES / "resnet50.onnx").read_bytes()
    with pytest.raises(InvalidInput) as info:
        graph_from_onnx_bytes(data[: len(data) // 2], dims={"batch": 1})
    assert info.value.code == "malformed-onnx"


def test_graph_without_nodes_is_rejected():
    data = tiny_model([], [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])], [])
    with pytest.raises(InvalidInput) as info:
        graph_from_onnx_bytes(data)
    assert info.value.code == "malformed-onnx"


def test_operator_limit_is_checked_before_anything_else():
    with pytest.raises(InputTooLarge) as info:
        graph_from_onnx_bytes(linear_relu(), max_ops=1)  # dims unbound: never reached
    assert info.value.code == "too-many-ops"


def test_reading_an_undefined_tensor_names_it():
    data = tiny_model(
        [helper.make_node("Add", ["x", "ghost"], ["y"], name="add")],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
    )
    with pytest.raises(InvalidInput, match="'ghost'") as info:
        graph_from_onnx_bytes(data)
    assert info.value.code == "unknown-tensor"


def test_two_writers_of_one_tensor_are_rejected():
    data = tiny_model(
        [
            helper.make_node("Relu", ["x"], ["y"], name="first"),
            helper.make_node("Neg", ["x"], ["y"], name="second"),
        ],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
    )
    with pytest.raises(InvalidInput, match="'second'") as info:
        graph_from_onnx_bytes(data)
    assert info.value.code == "duplicate-producer"


def test_unknown_operator_type_is_kept_with_an_estimate_and_a_warning():
    data = tiny_model(
        [helper.make_node("FancyOp", ["x"], ["y"], name="fancy", domain="example.custom")],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 5])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 5])],
    )
    model = onnx.load_model_from_string(data)
    model.opset_import.append(helper.make_opsetid("example.custom", 1))
    graph = graph_from_onnx_bytes(model.SerializeToString())
    assert graph.op_types.tolist() == ["FancyOp"]
    assert graph.op_flops.tolist() == [15.0]  # one per output element
    assert any("FancyOp" in w for w in graph.warnings)


def _if_node(name: str, cond: str, outer: str, out: str, depth: int) -> onnx.NodeProto:
    """An If whose branches read ``outer`` from the enclosing graph, nested ``depth`` deep."""

    def branch(tag: str, level: int) -> onnx.GraphProto:
        result = f"{tag}{level}_out"
        if level == 0 or tag == "else":  # only the then-branch nests: depth, not 2^depth
            nodes = [helper.make_node("Relu", [outer], [result])]
        else:
            nodes = [_if_node(f"{name}_{tag}{level}", cond, outer, result, level - 1)]
        outputs = [helper.make_tensor_value_info(result, TensorProto.FLOAT, [4])]
        return helper.make_graph(nodes, f"{tag}{level}", [], outputs)

    return helper.make_node(
        "If", [cond], [out], name=name, then_branch=branch("then", depth), else_branch=branch("else", depth)
    )


def test_control_flow_is_one_opaque_operator_reading_outer_tensors():
    data = tiny_model(
        [
            helper.make_node("Relu", ["x"], ["hidden"], name="pre"),
            _if_node("branch", "cond", "hidden", "y", depth=0),
        ],
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [4]),
            helper.make_tensor_value_info("cond", TensorProto.BOOL, []),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])],
    )
    graph = graph_from_onnx_bytes(data)
    assert graph.op_names.tolist() == ["pre", "branch"]
    reads = sorted(graph.tensor_names[graph.inputs_of(1)].tolist())
    assert reads == ["cond", "hidden"]  # the branch body's read of "hidden" is a dependency
    assert any("'branch'" in w and "opaque" in w for w in graph.warnings)


def _nested_if_model(depth: int) -> bytes:
    """A model whose If nests ``depth`` levels, spliced as raw protobuf bytes.

    The protobuf runtime refuses to *build* messages nested past its depth limit, so
    each level wraps the serialized inner graph by hand (field 6 of AttributeProto is
    the graph, field 5 of NodeProto the attribute, field 1 of GraphProto the node).
    """

    def varint(n: int) -> bytes:
        out = bytearray()
        while True:
            low, n = n & 0x7F, n >> 7
            out.append(low | (0x80 if n else 0))
            if not n:
                return bytes(out)

    def field(number: int, payload: bytes) -> bytes:
        return varint(number << 3 | 2) + varint(len(payload)) + payload

    def out_info(name: str) -> onnx.ValueInfoProto:
        return helper.make_tensor_value_info(name, TensorProto.FLOAT, [4])

    leaf = helper.make_graph([helper.make_node("Relu", ["x"], ["y0"])], "leaf", [], [out_info("y0")])
    inner = leaf.SerializeToString()
    leaf_else = helper.make_graph([helper.make_node("Neg", ["x"], ["e"])], "else", [], [out_info("e")])
    for level in range(1, depth + 1):
        node = helper.make_node("If", ["cond"], [f"y{level}"], name=f"if{level}")
        node.attribute.append(helper.make_attribute("else_branch", leaf_else))
        then = helper.make_attribute("then_branch", helper.make_graph([], "placeholder", [], []))
        then.ClearField("g")
        node_bytes = node.SerializeToString() + field(5, then.SerializeToString() + field(6, inner))
        last = level == depth
        wrapper = helper.make_graph(
            [],
            "top" if last else f"level{level}",
            [
                helper.make_tensor_value_info("x", TensorProto.FLOAT, [4]),
                helper.make_tensor_value_info("cond", TensorProto.BOOL, []),
            ]
            if last
            else [],
            [out_info(f"y{level}")],
        )
        inner = wrapper.SerializeToString() + field(1, node_bytes)
    model = helper.make_model(helper.make_graph([], "m", [], []), opset_imports=[helper.make_opsetid("", 17)])
    model.ClearField("graph")
    return model.SerializeToString() + field(7, inner)


def test_nested_subgraphs_are_walked_to_a_bounded_depth_with_a_warning():
    graph = graph_from_onnx_bytes(_nested_if_model(20))
    assert graph.op_names.tolist() == ["if20"]
    assert sorted(graph.tensor_names[graph.inputs_of(0)].tolist()) == ["cond", "x"]
    assert any("deeper than 16" in w for w in graph.warnings)


def test_nesting_past_the_protobuf_limit_is_malformed_not_a_crash():
    with pytest.raises(InvalidInput) as info:
        graph_from_onnx_bytes(_nested_if_model(400))
    assert info.value.code == "malformed-onnx"


def test_unnamed_nodes_get_names_that_do_not_depend_on_file_order():
    def tiny(order):
        nodes = [helper.make_node("Relu", ["x"], ["a"]), helper.make_node("Neg", ["x"], ["b"])]
        return tiny_model(
            [nodes[i] for i in order],
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
            [helper.make_tensor_value_info(t, TensorProto.FLOAT, [2]) for t in ("a", "b")],
        )

    first, second = graph_from_onnx_bytes(tiny([0, 1])), graph_from_onnx_bytes(tiny([1, 0]))
    assert sorted(first.op_names.tolist()) == ["Neg(b)", "Relu(a)"]
    assert model_hash(first) == model_hash(second)


def test_hash_ignores_weight_values_but_not_shapes():
    def with_weight(dims, fill):
        w = helper.make_tensor("W", TensorProto.FLOAT, dims, np.full(dims, fill, dtype=np.float32).flatten().tolist())
        return tiny_model(
            [helper.make_node("MatMul", ["x", "W"], ["y"], name="fc")],
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
            [w],
        )

    base = model_hash(graph_from_onnx_bytes(with_weight([4, 3], 0.5)))
    assert model_hash(graph_from_onnx_bytes(with_weight([4, 3], -2.0))) == base
    assert model_hash(graph_from_onnx_bytes(with_weight([4, 5], 0.5))) != base


def _ort_training_model() -> bytes:
    """ONNX Runtime's training-model layout: the weight W a graph input, its gradient W_grad an output."""
    return tiny_model(
        [
            helper.make_node("MatMul", ["x", "W"], ["y"], name="fc"),
            helper.make_node("Transpose", ["x"], ["xT"], name="fc_grad_transpose"),
            helper.make_node("MatMul", ["xT", "y"], ["W_grad"], name="fc_grad"),
        ],
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4]),
            helper.make_tensor_value_info("W", TensorProto.FLOAT, [4, 3]),
        ],
        [
            helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3]),
            helper.make_tensor_value_info("W_grad", TensorProto.FLOAT, [4, 3]),
        ],
    )


def test_a_weight_grad_output_is_read_as_that_weights_gradient():
    graph = graph_from_onnx_bytes(_ort_training_model())
    names = graph.tensor_names.tolist()
    w, w_grad = names.index("W"), names.index("W_grad")
    assert graph.tensor_role[w_grad] == TENSOR_ROLE_GRADIENT and graph.tensor_of[w_grad] == w
    assert graph.tensor_kind[w] == TENSOR_PARAMETER  # a graph input of ONNX Runtime's training model
    assert graph.tensor_role[names.index("y")] == ROLE_ABSENT
    assert any("'<weight>_grad'" in warning for warning in graph.warnings)


def test_a_model_without_weight_gradients_declares_no_training_roles():
    graph = graph_from_onnx_bytes(linear_relu(), dims={"batch": 2})
    assert graph.tensor_role is None and graph.tensor_of is None
