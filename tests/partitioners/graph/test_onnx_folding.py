"""ONNX import: constants and shape computations folded away, never built at full size."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper

from partitioners.graph import onnx_import
from partitioners.graph.hypergraph import TENSOR_PARAMETER
from partitioners.graph.onnx_import import graph_from_onnx_bytes
from tests.partitioners.graph.onnx_helpers import (
    folded_count,
    int64_tensor,
    tiny_model,
    warnings_besides_folding,
)


def _constant_matmul(weight: np.ndarray) -> bytes:
    """x [2, n] @ W, with W a ``Constant`` node rather than an initializer."""
    return tiny_model(
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
    assert folded_count(graph.warnings) == 1


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
    data = tiny_model(
        [
            helper.make_node(
                "ConstantOfShape",
                ["shape"],
                ["W"],
                name="fill",
                value=helper.make_tensor("v", TensorProto.FLOAT, [1], [1.0]),
            ),
            helper.make_node("MatMul", ["x", "W"], ["y"], name="fc"),
        ],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 300])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [int64_tensor("shape", [300, 300])],
    )
    graph = graph_from_onnx_bytes(data)
    assert graph.op_types.tolist() == ["ConstantOfShape", "MatMul"]
    assert graph.tensor_bytes[graph.tensor_names.tolist().index("W")] == 300 * 300 * 4
    assert folded_count(graph.warnings) == 0


def test_a_shape_gather_unsqueeze_concat_chain_on_a_bound_input_leaves_only_the_reshape():
    # x [batch, 6] -> Reshape(x, [Shape(x)[0], 2, 3]), as exporters write a view
    def const(name, values):
        return helper.make_node(
            "Constant", [], [name], value=helper.make_tensor(name, TensorProto.INT64, [len(values)], values)
        )

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
    data = tiny_model(
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
    assert graph.warnings == [
        "7 ONNX nodes folded away as constants (Constant nodes, and shape computations "
        "whose values are known once dims are bound): their outputs are parameter "
        "tensors, not operators"
    ]


def test_a_folded_node_that_writes_a_graph_output_stays_an_operator():
    # every output of the model is still produced by a placed operator
    data = tiny_model(
        [helper.make_node("Shape", ["x"], ["s"], name="shape"), helper.make_node("Relu", ["x"], ["y"], name="act")],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 6])],
        [
            helper.make_tensor_value_info("s", TensorProto.INT64, None),
            helper.make_tensor_value_info("y", TensorProto.FLOAT, None),
        ],
    )
    graph = graph_from_onnx_bytes(data, dims={"batch": 4})
    assert graph.op_types.tolist() == ["Shape", "Relu"]
    assert folded_count(graph.warnings) == 0


def test_an_initializer_read_only_by_folded_nodes_is_not_reported_as_unused():
    data = tiny_model(
        [
            helper.make_node("Shape", ["x"], ["s"], name="shape"),
            helper.make_node("Gather", ["s", "index"], ["b"], name="gather", axis=0),
            helper.make_node("Mul", ["x", "b"], ["y"], name="scale"),
        ],
        [helper.make_tensor_value_info("x", TensorProto.INT64, ["batch", 6])],
        [helper.make_tensor_value_info("y", TensorProto.INT64, None)],
        [int64_tensor("index", 1)],
    )
    graph = graph_from_onnx_bytes(data, dims={"batch": 4})
    assert graph.op_types.tolist() == ["Mul"]
    assert folded_count(graph.warnings) == 2 and warnings_besides_folding(graph.warnings) == []
