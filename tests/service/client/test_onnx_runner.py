"""The ONNX Runtime executor on the real fixtures: cut along a plan, run, same outputs, clear refusals.

Plans here are written by hand (operator -> device), which is what a plan's ``ops`` is:
contiguous slices of the file order (an acyclic chain of devices) and round-robin
assignments (every device sends to every other: the quotient graph is cyclic).
Dims are small (batch 1, sequences of 8) so every fixture runs in seconds.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from partitioners.graph.onnx_import import onnx_operator_names
from partitioners.hardware.inventory import inventory_from_json
from partitioners.placement.engine import PlacementOptions, place
from service.client.onnx_runner import (
    PlanRunner,
    RunError,
    compare_outputs,
    cut_plan,
    example_inputs,
    prepare_model,
    resolve_devices,
    run_plan,
)
from service.domain.plan_document import plan_document

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
MODELS = {
    "resnet50": (FIXTURES / "onnx" / "resnet50.onnx", {"batch": 1}),
    "bert_base": (FIXTURES / "onnx" / "bert_base.onnx", {"batch": 1, "sequence": 8}),
    "gpt2": (FIXTURES / "onnx" / "gpt2.onnx", {"batch": 1, "sequence": 8}),
    "lstm_seq2seq": (FIXTURES / "onnx" / "lstm_seq2seq.onnx", {"batch": 1, "source": 6, "target": 5}),
    "small_cnn": (FIXTURES / "feedback" / "small_cnn.onnx", {"batch": 1}),
}


@pytest.fixture(scope="module")
def prepared_models() -> dict:
    return {}


def prepared(cache: dict, name: str):
    if name not in cache:
        path, dims = MODELS[name]
        cache[name] = prepare_model(path.read_bytes(), dims)
    return cache[name]


def sliced_plan(model, n_devices: int) -> dict:
    names = model.graph.op_names.tolist()
    ops = {name: f"host/cpu{(i * n_devices) // len(names)}" for i, name in enumerate(names)}
    return {"model_hash": model.model_hash, "options": {"dims": model.dims}, "ops": ops}


def round_robin_plan(model, n_devices: int) -> dict:
    names = model.graph.op_names.tolist()
    ops = {name: f"host/cpu{i % n_devices}" for i, name in enumerate(names)}
    return {"model_hash": model.model_hash, "options": {"dims": model.dims}, "ops": ops}


def run_once(model, plan: dict, **kwargs):
    with PlanRunner(model, plan, gpus=0, **kwargs) as runner:
        return runner.run(example_inputs(model), steps=1, warmup=0)


@pytest.mark.parametrize("n_devices", [2, 4])
@pytest.mark.parametrize("name", list(MODELS))
def test_every_fixture_split_over_logical_cpu_devices_reproduces_the_unsplit_outputs(prepared_models, name, n_devices):
    model = prepared(prepared_models, name)
    result = run_once(model, sliced_plan(model, n_devices))
    assert {p.device for p in result.parts} == {f"host/cpu{d}" for d in range(n_devices)}
    assert set(result.diffs) == {o.name for o in model.model.graph.output}
    for max_abs, max_rel in result.diffs.values():
        assert np.isfinite(max_abs) and max_abs <= 1e-4 and np.isfinite(max_rel)


@pytest.mark.parametrize("name", ["resnet50", "lstm_seq2seq", "small_cnn", "bert_base"])
def test_a_cyclic_split_runs_as_acyclic_parts_with_the_unsplit_outputs(prepared_models, name):
    model = prepared(prepared_models, name)
    plan = round_robin_plan(model, 2)
    parts = cut_plan(model, plan["ops"])
    assert len(parts) > 2  # a device's operators split into several parts
    available = set(model.input_shapes)
    for part in parts:  # every part reads only what ran before it
        assert set(part.inputs) <= available
        available |= set(part.outputs)
    result = run_once(model, plan)
    assert all(max_abs <= 1e-4 for max_abs, _ in result.diffs.values())


@pytest.mark.parametrize("name", list(MODELS))
def test_every_plan_operator_is_exactly_one_renamed_onnx_node(prepared_models, name):
    model = prepared(prepared_models, name)
    placed = [n.name for i, n in enumerate(model.model.graph.node) if i not in model.folded]
    assert sorted(placed) == sorted(model.graph.op_names.tolist())
    assert len(set(placed)) == len(placed)


def test_unnamed_and_repeated_node_names_map_to_the_importers_operator_names():
    path, dims = MODELS["small_cnn"]
    original = onnx.load_model_from_string(path.read_bytes())
    for i, node in enumerate(original.graph.node):
        node.name = "" if i % 2 else "same"
    data = original.SerializeToString()
    model = prepare_model(data, dims)
    expected = onnx_operator_names(onnx.load_model_from_string(data).graph.node)
    assert [n.name for n in model.model.graph.node] == expected
    assert "Conv(" in " ".join(expected) and "same#1" in expected
    result = run_once(model, sliced_plan(model, 2))
    assert {op["name"] for op in result.ops} <= set(model.graph.op_names.tolist())
    assert len({op["name"] for op in result.ops}) >= len(expected) - 2  # the profiler saw (almost) every node


def test_the_measured_timeline_names_plan_operators_and_devices_per_step(prepared_models):
    model = prepared(prepared_models, "small_cnn")
    plan = sliced_plan(model, 2)
    with PlanRunner(model, plan, gpus=0) as runner:
        result = runner.run(example_inputs(model), steps=3, warmup=1)
    assert len(result.step_wall_s) == 3
    assert {op["step"] for op in result.ops} == {0, 1, 2}
    for op in result.ops:
        assert plan["ops"][op["name"]] == op["device"]
        assert op["duration_s"] >= 0 and op["start_s"] >= 0
    assert result.transfers and all(t["src"] != t["dst"] for t in result.transfers)


def two_branch_model() -> bytes:
    """x -> Relu -> a; x -> Sigmoid -> b; Add(a, b) -> y: two operators that can run in either order."""
    nodes = [
        helper.make_node("Relu", ["x"], ["a"], name="relu"),
        helper.make_node("Sigmoid", ["x"], ["b"], name="sigmoid"),
        helper.make_node("Add", ["a", "b"], ["y"], name="add"),
    ]
    graph = helper.make_graph(
        nodes,
        "branches",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()


def test_parts_run_in_the_plans_schedule_order_when_it_has_one():
    model = prepare_model(two_branch_model(), {"batch": 2})
    ops = {"relu": "cpu:0", "sigmoid": "cpu:1", "add": "cpu:2"}
    assert [p.device for p in cut_plan(model, ops)] == ["cpu:0", "cpu:1", "cpu:2"]
    schedule = {
        "devices": [
            {"device": "cpu:0", "ops": [{"op": "relu", "start_s": 2.0, "end_s": 3.0}]},
            {"device": "cpu:1", "ops": [{"op": "sigmoid", "start_s": 0.0, "end_s": 1.0}]},
            {"device": "cpu:2", "ops": [{"op": "add", "start_s": 3.0, "end_s": 4.0}]},
        ],
        "transfers": [],
        "holdings": [],
    }
    assert [p.device for p in cut_plan(model, ops, schedule)] == ["cpu:1", "cpu:0", "cpu:2"]
    _, result = run_plan(two_branch_model(), {"ops": ops, "schedule": schedule}, dims={"batch": 2}, steps=1, warmup=0)
    assert result.diffs["y"][0] == 0.0


def test_a_plan_missing_an_operator_fails_naming_it(prepared_models):
    model = prepared(prepared_models, "small_cnn")
    plan = sliced_plan(model, 2)
    dropped = model.graph.op_names.tolist()[3]
    del plan["ops"][dropped]
    with pytest.raises(RunError, match=f"no device for operator '{dropped}'"):
        PlanRunner(model, plan, gpus=0)


def test_a_plan_on_devices_the_machine_lacks_names_them_and_map_moves_them(prepared_models):
    model = prepared(prepared_models, "small_cnn")
    plan = sliced_plan(model, 2)
    plan["ops"] = {name: device.replace("host/cpu", "node0/gpu") for name, device in plan["ops"].items()}
    with pytest.raises(RunError, match=r"node0/gpu0 \(needs cuda:0; this machine has 0 CUDA"):
        PlanRunner(model, plan, gpus=0)
    result = run_once(model, plan, device_map={"node0/gpu0": "cpu:0", "node0/gpu1": "cpu:1"})
    assert result.devices == {"node0/gpu0": "cpu:0", "node0/gpu1": "cpu:1"}


def test_a_device_with_no_cpu_or_gpu_name_is_named_in_the_error():
    with pytest.raises(RunError, match=r"node0/npu3 .no CPU or GPU by that name.*--map node0/npu3=cpu:0"):
        resolve_devices(["node0/npu3"], gpus=0)


def test_a_plan_for_another_model_hash_is_refused(prepared_models):
    model = prepared(prepared_models, "small_cnn")
    plan = sliced_plan(model, 2)
    plan["model_hash"] = "0" * 64
    with pytest.raises(RunError, match="plan is for model 000000000000"):
        PlanRunner(model, plan, gpus=0)


def test_a_plan_made_with_other_dims_is_another_model():
    path, _ = MODELS["small_cnn"]
    at_one = prepare_model(path.read_bytes(), {"batch": 1})
    at_two = prepare_model(path.read_bytes(), {"batch": 2})
    with pytest.raises(RunError, match=re.escape("with dims {'batch': 2}")):
        PlanRunner(at_two, sliced_plan(at_one, 2), gpus=0)


def test_training_and_micro_batched_plans_are_refused(prepared_models):
    model = prepared(prepared_models, "small_cnn")
    for options in ({"mode": "training"}, {"micro_batches": 4}):
        plan = sliced_plan(model, 2)
        plan["options"] = options
        with pytest.raises(RunError, match="run inference plans of one micro-batch"):
            PlanRunner(model, plan, gpus=0)


def test_a_model_onnx_runtime_cannot_load_is_a_clear_error():
    node = helper.make_node("Frobnicate", ["x"], ["y"], name="f", domain="com.example")
    graph = helper.make_graph(
        [node],
        "custom",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
    )
    data = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.example", 1)]
    ).SerializeToString()
    with pytest.raises(RunError, match="ONNX Runtime cannot load"):
        run_plan(data, {"ops": {"f": "cpu:0"}}, steps=1, warmup=0)


def test_an_output_beyond_tolerance_fails_naming_it():
    reference = {"logits": np.ones((2, 3), np.float32), "ids": np.arange(3)}
    assert compare_outputs(reference, dict(reference))["logits"] == (0.0, 0.0)
    off = {"logits": reference["logits"] + np.float32(0.01), "ids": reference["ids"]}
    with pytest.raises(RunError, match="output 'logits' differs"):
        compare_outputs(reference, off)


def test_graph_only_weights_are_generated_deterministically():
    path, dims = MODELS["resnet50"]
    first = prepare_model(path.read_bytes(), dims)
    second = prepare_model(path.read_bytes(), dims)
    assert first.generated_weights == 77
    a = onnx.numpy_helper.to_array(first.model.graph.initializer[0])
    b = onnx.numpy_helper.to_array(second.model.graph.initializer[0])
    assert np.array_equal(a, b) and np.all(np.isfinite(a))


def test_an_unbound_dimension_is_named():
    path, _ = MODELS["bert_base"]
    with pytest.raises(RunError, match="'sequence'"):
        prepare_model(path.read_bytes(), {"batch": 1})


def test_inputs_of_the_wrong_dtype_are_a_clear_error(prepared_models):
    model = prepared(prepared_models, "small_cnn")
    feeds = {name: value.astype(np.float64) for name, value in example_inputs(model).items()}
    with (
        PlanRunner(model, sliced_plan(model, 2), gpus=0) as runner,
        pytest.raises(RunError, match="cannot run the model on these inputs"),
    ):
        runner.run(feeds, steps=1, warmup=0)


def two_cpu_inventory():
    device = {
        "type": "cpu",
        "peak_flops": 1e11,
        "memory_tiers": [{"name": "DRAM", "capacity_bytes": 1e10, "bandwidth_bytes_per_s": 1e10}],
    }
    return inventory_from_json(
        {
            "groups": [
                {
                    "name": "host",
                    "devices": [{"name": "host/cpu0", **device}, {"name": "host/cpu1", **device}],
                    "link": {"bandwidth_bytes_per_s": 1e10},
                }
            ]
        }
    )


def test_a_fused_plan_runs_its_kernels_operators_together_and_reports_them_as_kernels(prepared_models):
    model = prepared(prepared_models, "gpt2")
    inventory = two_cpu_inventory()
    result = place(model.graph, inventory, PlacementOptions(fusion="compiler", strategy="metis"))
    _, _, body = plan_document(result, inventory)
    plan = {"model_hash": model.model_hash, "options": {"dims": model.dims}, **body}
    assert plan["fusion_groups"]
    with PlanRunner(model, plan, gpus=0) as runner:
        run = runner.run(example_inputs(model), steps=1, warmup=0)
    assert all(max_abs <= 1e-4 for max_abs, _ in run.diffs.values())
    members = {m for g in plan["fusion_groups"] for m in g["ops"][1:]}
    measured = {op["name"] for op in run.ops}
    assert measured <= set(plan["ops"]) and not measured & members
