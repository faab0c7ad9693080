"""ONNX import memory: an upload of a few hundred bytes, or dims bound to 10^8, must not make the
importer build values, or ONNX build shape data, in proportion to the tensor sizes."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from partitioners.errors import InvalidInput
from partitioners.graph import onnx_import
from partitioners.graph.onnx_import import graph_from_onnx_bytes
from tests.partitioners.graph.onnx_helpers import (
    FIXTURES,
    folded_count,
    int64_tensor,
    tiny_model,
    warnings_besides_folding,
)


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
        int64_tensor("zero", 0), int64_tensor("one", 1), int64_tensor("hundred", 100), int64_tensor("one_1d", [1]),
        int64_tensor("shape_100", [100]), int64_tensor("column_8", np.zeros((8, 1))), int64_tensor("row_8", np.zeros((1, 8))),
        onnx.numpy_helper.from_array(np.ones((8, 1), dtype=bool), "mask_column_8"),
        int64_tensor("matrix_2x8", np.zeros((2, 8))), int64_tensor("indices_8", np.zeros(8)), int64_tensor("vector_16", np.arange(16)),
    ]  # fmt: skip
    node = _OUTPUT_LARGER_THAN_INPUTS[op_type]
    data = tiny_model([node], [], [helper.make_tensor_value_info("y", TensorProto.INT64, None)], constants)
    built = _built_values(monkeypatch)
    graph = graph_from_onnx_bytes(data)
    assert graph.n_ops == 1
    assert max(built, default=0) <= 16


def test_constant_folding_stops_at_its_total_budget_with_a_warning(monkeypatch):
    monkeypatch.setattr(onnx_import, "FOLD_BUDGET_ELEMENTS", 40)  # two folds of 16 elements, not three
    nodes = [helper.make_node("Neg", [f"t{i}"], [f"t{i + 1}"]) for i in range(5)]
    data = tiny_model(
        nodes, [], [helper.make_tensor_value_info("t5", TensorProto.INT64, None)], [int64_tensor("t0", np.arange(16))]
    )
    graph = graph_from_onnx_bytes(data)
    assert graph.n_ops == 3  # the two folded Negs are constants, not operators
    assert folded_count(graph.warnings) == 2
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
    threads = dict.fromkeys(("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"), "1")
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
    data = tiny_model(  # Range(0, 10^10, 1) -> Cast: under 200 bytes describing two 80 GB tensors
        [
            helper.make_node("Range", ["start", "limit", "delta"], ["r"], name="range"),
            helper.make_node("Cast", ["r"], ["y"], name="cast", to=TensorProto.INT64),
        ],
        [],
        [helper.make_tensor_value_info("y", TensorProto.INT64, None)],
        [int64_tensor("start", 0), int64_tensor("limit", 10**10), int64_tensor("delta", 1)],
    )
    imported = _import_under_a_memory_cap(data, {})
    assert imported["shapes"]["r"] == imported["shapes"]["y"] == [10**10]
    assert imported["warnings"] == []


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="RLIMIT_AS is enforced on Linux")
def test_shape_vectors_that_double_at_every_operator_are_inferred_within_a_memory_cap():
    # 786 bytes: 40 Concats of a vector with itself. ONNX data propagation alone would
    # hold 2^41 entries for the last one.
    nodes = [helper.make_node("Concat", [f"c{i}", f"c{i}"], [f"c{i + 1}"], axis=0) for i in range(40)]
    data = tiny_model(
        nodes, [], [helper.make_tensor_value_info("c40", TensorProto.INT64, None)], [int64_tensor("c0", [1, 2])]
    )
    imported = _import_under_a_memory_cap(data, {})
    assert imported["shapes"]["c40"] == [2**41]
    # c1..c15 (up to 2^16 elements, FOLD_MAX_ELEMENTS) fold away; the 25 longer Concats stay
    assert folded_count(imported["warnings"]) == 15 and warnings_besides_folding(imported["warnings"]) == []


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="RLIMIT_AS is enforced on Linux")
def test_a_runtime_vector_bound_to_a_huge_length_is_inferred_within_a_memory_cap():
    # positions[sequence] through a chain of shape operators, sequence = 10^8: ONNX data
    # propagation would hold 10^8 entries per operator.
    nodes = [helper.make_node("Cast", [f"t{i}"], [f"t{i + 1}"], to=TensorProto.INT64) for i in range(20)]
    nodes[0].input[0] = "positions"
    data = tiny_model(
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
    data = tiny_model(
        [helper.make_node("Relu", ["x"], ["y"], name="act")],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1] * (onnx_import.MAX_RANK + 1))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
    )
    with pytest.raises(InvalidInput, match="graph input 'x' has 65 dimensions") as info:
        graph_from_onnx_bytes(data)
    assert info.value.code == "malformed-onnx"
    assert info.value.field == "graph.input[0]"


def test_unsqueeze_axes_longer_than_the_rank_limit_are_malformed():
    data = tiny_model(
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
    data = tiny_model(
        [
            helper.make_node("Shape", ["x"], ["s"], name="shape"),
            helper.make_node("Concat", ["s", "w"], ["c"], name="concat", axis=0),
            helper.make_node("Size", ["c"], ["n"], name="size"),
            helper.make_node("Relu", ["x"], ["y"], name="relu"),
        ],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
        [
            helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4]),
            helper.make_tensor_value_info("n", TensorProto.INT64, []),
        ],
        [weight],
    )
    imported = _import_under_a_memory_cap(data, {"batch": 2})
    assert imported["shapes"]["c"] == [10**9 + 2]
    assert imported["shapes"]["y"] == [2, 4]
