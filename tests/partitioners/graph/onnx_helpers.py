"""Small ONNX models built in memory for the importer's tests, and how to read its warnings."""

from __future__ import annotations

import pathlib
import re

import numpy as np
from onnx import TensorProto, external_data_helper, helper, numpy_helper

__all__ = [
    "FIXTURES",
    "expanding_functions",
    "external_weight",
    "folded_count",
    "int64_tensor",
    "linear_relu",
    "tiny_model",
    "warnings_besides_folding",
]

FIXTURES = pathlib.Path(__file__).resolve().parents[2] / "fixtures" / "onnx"
_FOLDING_NOTE = re.compile(r"^(\d+) ONNX nodes folded away as constants")


def folded_count(warnings: list[str]) -> int:
    """How many nodes the import says it folded away (its one warning line about it)."""
    counts = [int(m.group(1)) for m in map(_FOLDING_NOTE.match, warnings) if m]
    assert len(counts) <= 1
    return counts[0] if counts else 0


def warnings_besides_folding(warnings: list[str]) -> list[str]:
    return [w for w in warnings if not _FOLDING_NOTE.match(w)]


def external_weight(name: str, dims: list[int]) -> TensorProto:
    """A float initializer whose bytes live in a file that does not exist."""
    tensor = helper.make_tensor(name, TensorProto.FLOAT, dims, np.zeros(dims, dtype=np.float32).tobytes(), raw=True)
    external_data_helper.set_external_data(tensor, location="missing.bin", offset=0, length=len(tensor.raw_data))
    tensor.data_location = TensorProto.EXTERNAL
    tensor.ClearField("raw_data")
    return tensor


def tiny_model(nodes, inputs, outputs, initializers=(), opset=17) -> bytes:
    graph = helper.make_graph(nodes, "tiny", inputs, outputs, initializer=list(initializers))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    return model.SerializeToString()


def linear_relu(batch_dim="batch") -> bytes:
    # x [batch, 4] @ W [4, 3] -> h [batch, 3] -> relu -> y
    return tiny_model(
        [
            helper.make_node("MatMul", ["x", "W"], ["h"], name="fc"),
            helper.make_node("Relu", ["h"], ["y"], name="act"),
        ],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch_dim, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch_dim, 3])],
        [external_weight("W", [4, 3])],
    )


def int64_tensor(name: str, value) -> TensorProto:
    """An int64 initializer holding ``value`` (shapes, indices, scalars)."""
    return numpy_helper.from_array(np.array(value, dtype=np.int64), name)


def expanding_functions(depth: int, calls_per_level: int = 2) -> bytes:
    """Local functions ``f0..f<depth>``: ``f0`` one ``Relu``, ``f_k`` calls ``f_(k-1)``
    ``calls_per_level`` times in a row; the graph calls ``f<depth>`` once. A few KB that
    expand to ``calls_per_level ** depth`` operators (issue 55's F1 at depth 40)."""
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("local", 1)]
    functions = [helper.make_function("local", "f0", ["x"], ["y"], [helper.make_node("Relu", ["x"], ["y"])], opsets)]
    for k in range(1, depth + 1):
        names = ["x", *(f"t{i}" for i in range(1, calls_per_level)), "y"]
        calls = [
            helper.make_node(f"f{k - 1}", [names[i]], [names[i + 1]], domain="local") for i in range(calls_per_level)
        ]
        functions.append(helper.make_function("local", f"f{k}", ["x"], ["y"], calls, opsets))
    graph = helper.make_graph(
        [helper.make_node(f"f{depth}", ["x"], ["y"], domain="local", name="call")],
        "expanding-functions",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])],
    )
    return helper.make_model(graph, functions=functions, opset_imports=opsets).SerializeToString()
