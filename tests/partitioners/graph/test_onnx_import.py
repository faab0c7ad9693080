"""ONNX import: bytes in, hypergraph with sizes and FLOPs out, weights never read."""

from __future__ import annotations

import json
import os
import pathlib
import re
import subprocess
import sys

import numpy as np
import onnx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, external_data_helper, helper

from partitioners.errors import InputTooLarge, InvalidInput
from partitioners.graph.canonical import graph_to_json, model_hash
from partitioners.graph.hypergraph import TENSOR_INPUT, TENSOR_PARAMETER, graph_summary
from partitioners.graph.json_import import graph_from_json
from partitioners.graph import onnx_import
from partitioners.graph.onnx_import import graph_from_onnx_bytes

FIXTURES = pathlib.Path(__file__).resolve().parents[2] / "fixtures" / "onnx"
_FOLDING_NOTE = re.compile(r"^(\d+) ONNX nodes folded away as constants")


def _folded(warnings: list[str]) -> int:
    """How many nodes the import says it folded away (its one warning line about it)."""
    counts = [int(m.group(1)) for m in map(_FOLDING_NOTE.match, warnings) if m]
    assert len(counts) <= 1
    return counts[0] if counts else 0


def _other_warnings(warnings: list[str]) -> list[str]:
    return [w for w in warnings if not _FOLDING_NOTE.match(w)]


def _external_weight(name: str, dims: list[int]) -> TensorProto:
    """A float initializer whose bytes live in a file that does not exist."""
    tensor = helper.make_tensor(name, TensorProto.FLOAT, dims, np.zeros(dims, dtype=np.float32).tobytes(), raw=True)
    external_data_helper.set_external_data(tensor, location="missing.bin", offset=0, length=len(tensor.raw_data))
    tensor.data_location = TensorProto.EXTERNAL
    tensor.ClearField("raw_data")
    return tensor


def _model(nodes, inputs, outputs, initializers=(), opset=17) -> bytes:
    graph = helper.make_graph(nodes, "tiny", inputs, outputs, initializer=list(initializers))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    return model.SerializeToString()


def _linear_relu(batch_dim="batch") -> bytes:
    # x [batch, 4] @ W [4, 3] -> h [batch, 3] -> relu -> y
    return _model(
        [
            helper.make_node("MatMul", ["x", "W"], ["h"], name="fc"),
            helper.make_node("Relu", ["h"], ["y"], name="act"),
        ],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch_dim, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch_dim, 3])],
        [_external_weight("W", [4, 3])],
    )


def test_weights_pointing_to_missing_external_data_are_parameters_sized_from_dims():
    graph = graph_from_onnx_bytes(_linear_relu(), dims={"batch": 2})
    w = graph.tensor_names.tolist().index("W")
    assert graph.tensor_kind[w] == TENSOR_PARAMETER
    assert graph.tensor_bytes[w] == 4 * 3 * 4
    assert graph.tensor_shapes[w] == (4, 3)
    assert graph.tensor_dtypes[w] == "float32"
    assert graph.op_param_bytes.tolist() == [48.0, 0.0]


def test_bound_dims_give_exact_sizes_and_flops():
    graph = graph_from_onnx_bytes(_linear_relu(), dims={"batch": 8})
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
    data = _model(
        nodes,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq", 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [_external_weight("W", [4, 3])],
    )
    graph = graph_from_onnx_bytes(data, dims={"batch": 2, "seq": 5})
    # the shape arithmetic is folded away (8 nodes): only the Reshape and MatMul are operators
    assert graph.op_types.tolist() == ["Reshape", "MatMul"]
    assert graph.op_flops[-1] == 2 * (2 * 5 * 2 * 3) * 4  # [2,5,2,4] @ [4,3]
    assert graph.tensor_shapes[graph.tensor_names.tolist().index("y")] == (2, 5, 2, 3)
    assert _folded(graph.warnings) == 8 and _other_warnings(graph.warnings) == []


def test_inline_weights_give_the_same_graph_as_missing_external_ones():
    def linear(weight):
        return _model(
            [helper.make_node("MatMul", ["x", "W"], ["y"], name="fc")],
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 300])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 300])],
            [weight],
        )

    values = np.random.default_rng(0).standard_normal((300, 300)).astype(np.float32)
    inline = graph_from_onnx_bytes(linear(onnx.numpy_helper.from_array(values, "W")))
    external = graph_from_onnx_bytes(linear(_external_weight("W", [300, 300])))
    assert inline.tensor_bytes.tolist() == external.tensor_bytes.tolist() == [1200.0, 360_000.0, 1200.0]
    assert model_hash(inline) == model_hash(external)


def test_dims_that_match_no_input_are_reported():
    graph = graph_from_onnx_bytes(_linear_relu(), dims={"batch": 2, "sequense": 128})
    assert any("sequense" in w for w in graph.warnings)


def test_unbound_dynamic_dim_is_named():
    with pytest.raises(InvalidInput, match="'batch'") as info:
        graph_from_onnx_bytes(_linear_relu())
    assert info.value.code == "unbound-dim"
    assert info.value.field == "dims"


def test_every_unbound_dim_is_listed():
    data = _model(
        [helper.make_node("Relu", ["x"], ["y"])],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "sequence", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
    )
    with pytest.raises(InvalidInput, match="'batch'.*'sequence'.*are not bound"):
        graph_from_onnx_bytes(data, dims={})


def test_negative_declared_dims_count_as_unknown_never_as_negative_bytes():
    data = _model(
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
        graph_from_onnx_bytes(_linear_relu(), dims={"batch": value})
    assert info.value.code == "invalid-dims"


def test_a_binding_that_makes_a_tensor_absurdly_large_is_rejected():
    data = _model(
        [helper.make_node("Relu", ["x"], ["y"], name="act")],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4096, 4096])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
    )
    with pytest.raises(InvalidInput, match="'x'") as info:  # 2^31 * 2^24 * 4 bytes > 2^50
        graph_from_onnx_bytes(data, dims={"batch": 2**31 - 1})
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
    data = _model([], [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])], [])
    with pytest.raises(InvalidInput) as info:
        graph_from_onnx_bytes(data)
    assert info.value.code == "malformed-onnx"


def test_operator_limit_is_checked_before_anything_else():
    with pytest.raises(InputTooLarge) as info:
        graph_from_onnx_bytes(_linear_relu(), max_ops=1)  # dims unbound: never reached
    assert info.value.code == "too-many-ops"


def test_reading_an_undefined_tensor_names_it():
    data = _model(
        [helper.make_node("Add", ["x", "ghost"], ["y"], name="add")],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
    )
    with pytest.raises(InvalidInput, match="'ghost'") as info:
        graph_from_onnx_bytes(data)
    assert info.value.code == "unknown-tensor"


def test_two_writers_of_one_tensor_are_rejected():
    data = _model(
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
    data = _model(
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


def _constant_matmul(weight: np.ndarray) -> bytes:
    """x [2, n] @ W, with W a ``Constant`` node rather than an initializer."""
    return _model(
        [
            helper.make_node("Constant", [], ["W"], name="const", value=onnx.numpy_helper.from_array(weight)),
            helper.make_node("MatMul", ["x", "W"], ["y"], name="fc"),
        ],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, weight.shape[0]])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
    )


def test_a_constant_feeding_a_matmul_imports_as_one_operator_reading_a_parameter_tensor():
    # ONNX Runtime and TensorRT load a Constant as an initializer: no kernel, no transfer
    graph = graph_from_onnx_bytes(_constant_matmul(np.ones((4, 3), dtype=np.float32)))
    assert graph.op_types.tolist() == ["MatMul"]
    w = graph.tensor_names.tolist().index("W")
    assert graph.tensor_kind[w] == TENSOR_PARAMETER and graph.tensor_producer[w] == -1
    assert graph.tensor_bytes[w] == 4 * 3 * 4 and graph.tensor_shapes[w] == (4, 3)
    assert graph.op_param_bytes.tolist() == [48.0]
    assert graph.op_flops.tolist() == [2 * (2 * 3) * 4]
    assert _folded(graph.warnings) == 1


def test_a_constant_too_large_to_fold_is_a_parameter_of_its_full_size():
    # 300 x 300 is over FOLD_MAX_ELEMENTS: its values are never read, but it is still a
    # weight written in the file, not a kernel
    weight = np.ones((300, 300), dtype=np.float32)
    assert weight.size > onnx_import.FOLD_MAX_ELEMENTS
    graph = graph_from_onnx_bytes(_constant_matmul(weight))
    assert graph.op_types.tolist() == ["MatMul"]
    w = graph.tensor_names.tolist().index("W")
    assert graph.tensor_kind[w] == TENSOR_PARAMETER
    assert graph.tensor_bytes[w] == 300 * 300 * 4


def test_a_folded_constant_is_sized_from_its_value_when_shape_inference_fails(monkeypatch):
    def failing(*args, **kwargs):
        raise RuntimeError("inference bug")

    monkeypatch.setattr(onnx.shape_inference, "infer_shapes", failing)
    graph = graph_from_onnx_bytes(_constant_matmul(np.ones((4, 3), dtype=np.float32)))
    w = graph.tensor_names.tolist().index("W")
    assert graph.tensor_bytes[w] == 4 * 3 * 4 and graph.tensor_dtypes[w] == "float32"
    assert any(w.startswith("ONNX shape inference failed") for w in graph.warnings)


def test_a_computed_value_too_large_to_fold_stays_an_operator_of_its_full_size():
    # ConstantOfShape([300, 300]) is known, but over FOLD_MAX_ELEMENTS: left to run time
    data = _model(
        [
            helper.make_node("ConstantOfShape", ["shape"], ["W"], name="fill",
                             value=helper.make_tensor("v", TensorProto.FLOAT, [1], [1.0])),
            helper.make_node("MatMul", ["x", "W"], ["y"], name="fc"),
        ],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 300])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [_int64("shape", [300, 300])],
    )
    graph = graph_from_onnx_bytes(data)
    assert graph.op_types.tolist() == ["ConstantOfShape", "MatMul"]
    assert graph.tensor_bytes[graph.tensor_names.tolist().index("W")] == 300 * 300 * 4
    assert _folded(graph.warnings) == 0


def test_a_shape_gather_unsqueeze_concat_chain_on_a_bound_input_leaves_only_the_reshape():
    # x [batch, 6] -> Reshape(x, [Shape(x)[0], 2, 3]), as exporters write a view
    def const(name, values):
        return helper.make_node("Constant", [], [name], value=helper.make_tensor(name, TensorProto.INT64,
                                                                                  [len(values)], values))

    nodes = [
        helper.make_node("Shape", ["x"], ["s"], name="shape"),
        helper.make_node("Constant", [], ["zero"], value=helper.make_tensor("zero", TensorProto.INT64, [], [0])),
        helper.make_node("Gather", ["s", "zero"], ["b"], name="gather", axis=0),
        const("axes", [0]),
        helper.make_node("Unsqueeze", ["b", "axes"], ["b1"], name="unsqueeze"),
        const("tail", [2, 3]),
        helper.make_node("Concat", ["b1", "tail"], ["target"], name="concat", axis=0),
        helper.make_node("Reshape", ["x", "target"], ["y"], name="reshape"),
    ]
    data = _model(
        nodes,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 6])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
    )
    graph = graph_from_onnx_bytes(data, dims={"batch": 4})
    assert graph.op_types.tolist() == ["Reshape"]
    names = graph.tensor_names.tolist()
    assert sorted(names) == ["target", "x", "y"]  # intermediate shape values read by no operator are gone
    target = names.index("target")
    assert graph.tensor_kind[target] == TENSOR_PARAMETER and graph.tensor_bytes[target] == 3 * 8
    assert graph.tensor_shapes[names.index("y")] == (4, 2, 3)
    assert graph.warnings == ["7 ONNX nodes folded away as constants (Constant nodes, and shape computations "
                              "whose values are known once dims are bound): their outputs are parameter "
                              "tensors, not operators"]


def test_a_folded_node_that_writes_a_graph_output_stays_an_operator():
    # every output of the model is still produced by a placed operator
    data = _model(
        [helper.make_node("Shape", ["x"], ["s"], name="shape"), helper.make_node("Relu", ["x"], ["y"], name="act")],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 6])],
        [helper.make_tensor_value_info("s", TensorProto.INT64, None),
         helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
    )
    graph = graph_from_onnx_bytes(data, dims={"batch": 4})
    assert graph.op_types.tolist() == ["Shape", "Relu"]
    assert _folded(graph.warnings) == 0


def test_an_initializer_read_only_by_folded_nodes_is_not_reported_as_unused():
    data = _model(
        [helper.make_node("Shape", ["x"], ["s"], name="shape"),
         helper.make_node("Gather", ["s", "index"], ["b"], name="gather", axis=0),
         helper.make_node("Mul", ["x", "b"], ["y"], name="scale")],
        [helper.make_tensor_value_info("x", TensorProto.INT64, ["batch", 6])],
        [helper.make_tensor_value_info("y", TensorProto.INT64, None)],
        [_int64("index", 1)],
    )
    graph = graph_from_onnx_bytes(data, dims={"batch": 4})
    assert graph.op_types.tolist() == ["Mul"]
    assert _folded(graph.warnings) == 2 and _other_warnings(graph.warnings) == []


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
    data = _model(
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
        return _model(
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
        return _model(
            [helper.make_node("MatMul", ["x", "W"], ["y"], name="fc")],
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
            [w],
        )

    base = model_hash(graph_from_onnx_bytes(with_weight([4, 3], 0.5)))
    assert model_hash(graph_from_onnx_bytes(with_weight([4, 3], -2.0))) == base
    assert model_hash(graph_from_onnx_bytes(with_weight([4, 5], 0.5))) != base


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
    assert _folded(graph.warnings) == 552
    assert _other_warnings(graph.warnings) == []  # every shape resolved once batch and sequence are bound


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
    assert _folded(graph.warnings) == 1787 and _other_warnings(graph.warnings) == []


def test_gpt2_imports_with_no_constant_or_shape_operators_once_dims_are_bound():
    graph = graph_from_onnx_bytes((FIXTURES / "gpt2.onnx").read_bytes(), dims={"batch": 1, "sequence": 128})
    shape_ops = {"Constant", "ConstantOfShape", "Shape", "Unsqueeze", "Squeeze", "Concat", "Slice", "Range"}
    assert set(graph.op_types.tolist()) & shape_ops == set()
    # what remains reads a runtime tensor: the two embedding lookups are the only Gathers
    assert sorted(graph.op_names[graph.op_types == "Gather"].tolist()) == ["/model/wpe/Gather", "/model/wte/Gather"]


def _import_without_folding(monkeypatch, data: bytes, dims: dict) -> "onnx_import.Hypergraph":
    """The import with every node kept as an operator, as before folding."""
    with monkeypatch.context() as patch:
        patch.setattr(onnx_import, "_folded_nodes", lambda graph, values: np.zeros(len(graph.node), dtype=bool))
        return graph_from_onnx_bytes(data, dims=dims)


@pytest.mark.parametrize(
    ("fixture", "dims"),
    [("bert_base", {"batch": 2, "sequence": 64}), ("gpt2", {"batch": 1, "sequence": 128}),
     ("lstm_seq2seq", {"batch": 1, "source": 20, "target": 16})],
)
def test_folding_changes_neither_the_flops_nor_the_tensor_bytes_of_the_operators_it_keeps(monkeypatch, fixture, dims):
    data = (FIXTURES / f"{fixture}.onnx").read_bytes()
    folded = graph_from_onnx_bytes(data, dims=dims)
    whole = _import_without_folding(monkeypatch, data, dims)
    assert whole.n_ops - folded.n_ops == _folded(folded.warnings) > 0
    kept = [whole.op_names.tolist().index(name) for name in folded.op_names.tolist()]
    assert whole.op_types[kept].tolist() == folded.op_types.tolist()
    assert whole.op_flops[kept].tolist() == folded.op_flops.tolist()

    def tensor_bytes(graph, ops, ptr, ids):
        return [{graph.tensor_names[t]: graph.tensor_bytes[t] for t in ids[ptr[op]:ptr[op + 1]]} for op in ops]

    assert tensor_bytes(whole, kept, whole.input_ptr, whole.input_tensors) == tensor_bytes(
        folded, range(folded.n_ops), folded.input_ptr, folded.input_tensors)
    assert tensor_bytes(whole, kept, whole.output_ptr, whole.output_tensors) == tensor_bytes(
        folded, range(folded.n_ops), folded.output_ptr, folded.output_tensors)


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
    data = _model(
        [helper.make_node("Constant", [], ["c"], name="const", value=value),
         helper.make_node("Add", ["x", "c"], ["y"], name="add")],
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


# --------------------------------------------------------------------------------------
# Memory: an upload of a few hundred bytes, or dims bound to 10^8, must not make the
# importer build values, or ONNX build shape data, in proportion to the tensor sizes.
# --------------------------------------------------------------------------------------


def _int64(name: str, value) -> TensorProto:
    return onnx.numpy_helper.from_array(np.array(value, dtype=np.int64), name)


def _built_values(monkeypatch) -> list[int]:
    """Sizes of every value the constant folding builds, recorded as it builds them."""
    sizes: list[int] = []
    evaluate = onnx_import._eval_node

    def recording(node, args, in_shapes):
        outputs = evaluate(node, args, in_shapes)
        sizes.extend(int(np.asarray(x).size) for x in outputs or [])
        return outputs

    monkeypatch.setattr(onnx_import, "_eval_node", recording)
    return sizes


def test_gpt2_with_a_sequence_of_a_hundred_million_is_rejected_naming_the_size_limit():
    with pytest.raises(InvalidInput, match=r"over the 1\.13e\+15-byte limit") as info:
        graph_from_onnx_bytes((FIXTURES / "gpt2.onnx").read_bytes(), dims={"batch": 1, "sequence": 100_000_000})
    assert info.value.code == "absurd-size"
    assert info.value.field == "dims"
    assert "[1, 12, 100000000, 100000000]" in info.value.detail  # the attention scores, named with their shape


_OUTPUT_LARGER_THAN_INPUTS = {
    "Range": helper.make_node("Range", ["zero", "hundred", "one"], ["y"]),
    "ConstantOfShape": helper.make_node("ConstantOfShape", ["shape_100"], ["y"]),
    "Expand": helper.make_node("Expand", ["one_1d", "shape_100"], ["y"]),
    "Add": helper.make_node("Add", ["column_8", "row_8"], ["y"]),
    "Where": helper.make_node("Where", ["mask_column_8", "column_8", "row_8"], ["y"]),
    "Gather": helper.make_node("Gather", ["matrix_2x8", "indices_8"], ["y"]),
    "Concat": helper.make_node("Concat", ["vector_16", "vector_16"], ["y"], axis=0),
}


@pytest.mark.parametrize("op_type", sorted(_OUTPUT_LARGER_THAN_INPUTS))
def test_constant_folding_checks_an_outputs_size_before_building_it(monkeypatch, op_type):
    monkeypatch.setattr(onnx_import, "FOLD_MAX_ELEMENTS", 16)  # every input fits, no output does
    constants = [
        _int64("zero", 0), _int64("one", 1), _int64("hundred", 100), _int64("one_1d", [1]),
        _int64("shape_100", [100]), _int64("column_8", np.zeros((8, 1))), _int64("row_8", np.zeros((1, 8))),
        onnx.numpy_helper.from_array(np.ones((8, 1), dtype=bool), "mask_column_8"),
        _int64("matrix_2x8", np.zeros((2, 8))), _int64("indices_8", np.zeros(8)), _int64("vector_16", np.arange(16)),
    ]  # fmt: skip
    node = _OUTPUT_LARGER_THAN_INPUTS[op_type]
    data = _model([node], [], [helper.make_tensor_value_info("y", TensorProto.INT64, None)], constants)
    built = _built_values(monkeypatch)
    graph = graph_from_onnx_bytes(data)
    assert graph.n_ops == 1
    assert max(built, default=0) <= 16


def test_constant_folding_stops_at_its_total_budget_with_a_warning(monkeypatch):
    monkeypatch.setattr(onnx_import, "FOLD_BUDGET_ELEMENTS", 40)  # two folds of 16 elements, not three
    nodes = [helper.make_node("Neg", [f"t{i}"], [f"t{i + 1}"]) for i in range(5)]
    data = _model(nodes, [], [helper.make_tensor_value_info("t5", TensorProto.INT64, None)], [_int64("t0", np.arange(16))])
    graph = graph_from_onnx_bytes(data)
    assert graph.n_ops == 3  # the two folded Negs are constants, not operators
    assert _folded(graph.warnings) == 2
    assert any(w.startswith("constant folding stopped at 40 folded elements") for w in graph.warnings)


def _import_under_a_memory_cap(data: bytes, dims: dict[str, int], cap_bytes: int = 1 << 30) -> dict:
    """Import ``data`` in a child Python whose address space is capped (RLIMIT_AS), and
    report what it got: allocations past the cap fail there instead of in the test run."""
    script = (
        "import json, resource, sys\n"
        f"resource.setrlimit(resource.RLIMIT_AS, ({cap_bytes}, {cap_bytes}))\n"
        "from partitioners.graph.onnx_import import graph_from_onnx_bytes\n"
        "graph = graph_from_onnx_bytes(sys.stdin.buffer.read(), dims=json.loads(sys.argv[1]))\n"
        "print(json.dumps({'shapes': dict(zip(graph.tensor_names.tolist(), graph.tensor_shapes)),"
        " 'warnings': graph.warnings}))\n"
    )
    threads = {name: "1" for name in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")}
    done = subprocess.run(
        [sys.executable, "-c", script, json.dumps(dims)],
        input=data,
        capture_output=True,
        cwd=pathlib.Path(__file__).resolve().parents[3],
        env={**os.environ, **threads},
    )
    assert done.returncode == 0, done.stderr.decode(errors="replace")[-2000:]
    return json.loads(done.stdout)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="RLIMIT_AS is enforced on Linux")
def test_a_range_node_with_a_huge_output_is_imported_within_a_memory_cap():
    data = _model(  # Range(0, 10^10, 1) -> Cast: under 200 bytes describing two 80 GB tensors
        [
            helper.make_node("Range", ["start", "limit", "delta"], ["r"], name="range"),
            helper.make_node("Cast", ["r"], ["y"], name="cast", to=TensorProto.INT64),
        ],
        [],
        [helper.make_tensor_value_info("y", TensorProto.INT64, None)],
        [_int64("start", 0), _int64("limit", 10**10), _int64("delta", 1)],
    )
    imported = _import_under_a_memory_cap(data, {})
    assert imported["shapes"]["r"] == imported["shapes"]["y"] == [10**10]
    assert imported["warnings"] == []


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="RLIMIT_AS is enforced on Linux")
def test_shape_vectors_that_double_at_every_operator_are_inferred_within_a_memory_cap():
    # 786 bytes: 40 Concats of a vector with itself. ONNX data propagation alone would
    # hold 2^41 entries for the last one.
    nodes = [helper.make_node("Concat", [f"c{i}", f"c{i}"], [f"c{i + 1}"], axis=0) for i in range(40)]
    data = _model(nodes, [], [helper.make_tensor_value_info("c40", TensorProto.INT64, None)], [_int64("c0", [1, 2])])
    imported = _import_under_a_memory_cap(data, {})
    assert imported["shapes"]["c40"] == [2**41]
    # c1..c15 (up to 2^16 elements, FOLD_MAX_ELEMENTS) fold away; the 25 longer Concats stay
    assert _folded(imported["warnings"]) == 15 and _other_warnings(imported["warnings"]) == []


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="RLIMIT_AS is enforced on Linux")
def test_a_runtime_vector_bound_to_a_huge_length_is_inferred_within_a_memory_cap():
    # positions[sequence] through a chain of shape operators, sequence = 10^8: ONNX data
    # propagation would hold 10^8 entries per operator.
    nodes = [helper.make_node("Cast", [f"t{i}"], [f"t{i + 1}"], to=TensorProto.INT64) for i in range(20)]
    nodes[0].input[0] = "positions"
    data = _model(
        nodes,
        [helper.make_tensor_value_info("positions", TensorProto.INT64, ["sequence"])],
        [helper.make_tensor_value_info("t20", TensorProto.INT64, None)],
    )
    imported = _import_under_a_memory_cap(data, {"sequence": 100_000_000})
    assert imported["shapes"]["t20"] == [100_000_000]
    assert imported["warnings"] == []


def test_running_out_of_memory_in_shape_inference_is_raised_not_read_as_unknown_sizes(monkeypatch):
    # other inference failures leave sizes to the declared shapes, with a warning; this one
    # would plan every tensor at 0 bytes, so it goes to the caller (the service caps memory)
    def out_of_memory(*args, **kwargs):
        raise MemoryError("std::bad_alloc")

    monkeypatch.setattr(onnx.shape_inference, "infer_shapes", out_of_memory)
    with pytest.raises(MemoryError):
        graph_from_onnx_bytes((FIXTURES / "resnet50.onnx").read_bytes(), dims={"batch": 1})


def test_a_declared_rank_over_the_limit_is_malformed():
    data = _model(
        [helper.make_node("Relu", ["x"], ["y"], name="act")],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1] * (onnx_import.MAX_RANK + 1))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
    )
    with pytest.raises(InvalidInput, match="graph input 'x' has 65 dimensions") as info:
        graph_from_onnx_bytes(data)
    assert info.value.code == "malformed-onnx"
    assert info.value.field == "graph.input[0]"


def test_unsqueeze_axes_longer_than_the_rank_limit_are_malformed():
    data = _model(
        [helper.make_node("Unsqueeze", ["x"], ["y"], name="grow", axes=list(range(onnx_import.MAX_RANK + 1)))],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        opset=11,
    )
    with pytest.raises(InvalidInput, match="attribute 'axes' has 65 dimensions") as info:
        graph_from_onnx_bytes(data)
    assert info.value.field == "graph.node[0]"


def _inference_passes(monkeypatch, data: bytes, dims: dict) -> list[bool]:
    """The ``data_prop`` flag of every ONNX shape inference one import runs."""
    passes: list[bool] = []
    infer = onnx_import._infer

    def counted(model, warnings, *, data_prop):
        passes.append(data_prop)
        return infer(model, warnings, data_prop=data_prop)

    monkeypatch.setattr(onnx_import, "_infer", counted)
    graph_from_onnx_bytes(data, dims=dims)
    return passes


def test_a_model_that_static_inference_shapes_whole_is_inferred_once_without_data_propagation(monkeypatch):
    # ResNet-50 computes no shape at run time: once the batch is bound, one pass knows every tensor
    assert _inference_passes(monkeypatch, (FIXTURES / "resnet50.onnx").read_bytes(), {"batch": 2}) == [False]


def test_inference_stops_once_a_round_has_shaped_every_operator_output(monkeypatch):
    # GPT-2's head splits read the activation's shape: data propagation is needed once, and
    # after its Shape chains are folded a static pass shapes everything, so no round follows
    passes = _inference_passes(monkeypatch, (FIXTURES / "gpt2.onnx").read_bytes(), {"batch": 8, "sequence": 128})
    assert passes == [False, True, False]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="RLIMIT_AS is enforced on Linux")
def test_a_long_external_vector_feeding_shape_operators_is_imported_within_a_memory_cap():
    # a graph-only 10^9-element int64 weight concatenated with a shape and reshaped by it:
    # data propagation sees its dims and never a value, as it would see a stand-in
    weight = TensorProto()
    weight.name, weight.data_type = "w", TensorProto.INT64
    weight.dims.append(10**9)
    weight.data_location = TensorProto.EXTERNAL
    entry = weight.external_data.add()
    entry.key, entry.value = "location", "weights.bin"
    data = _model(
        [
            helper.make_node("Shape", ["x"], ["s"], name="shape"),
            helper.make_node("Concat", ["s", "w"], ["c"], name="concat", axis=0),
            helper.make_node("Size", ["c"], ["n"], name="size"),
            helper.make_node("Relu", ["x"], ["y"], name="relu"),
        ],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4]),
         helper.make_tensor_value_info("n", TensorProto.INT64, [])],
        [weight],
    )
    imported = _import_under_a_memory_cap(data, {"batch": 2})
    assert imported["shapes"]["c"] == [10**9 + 2]
    assert imported["shapes"]["y"] == [2, 4]
