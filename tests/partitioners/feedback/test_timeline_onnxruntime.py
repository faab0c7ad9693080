"""ONNX Runtime's own profile read as a timeline: node kernels by name, fences ignored, runs as steps.

The profile is recorded here, by onnxruntime on the CPU, from the small CNN fixture
(graph-only: its weights are given values of their declared shapes first).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from partitioners.feedback.timeline import parse_timeline

ort = pytest.importorskip("onnxruntime")

MODEL = Path(__file__).resolve().parents[2] / "fixtures" / "feedback" / "small_cnn.onnx"
RUNS = 3


@pytest.fixture(scope="module")
def ort_profile(tmp_path_factory) -> tuple[list, list[str]]:
    model = onnx.load_model_from_string(MODEL.read_bytes())
    rng = np.random.default_rng(0)
    for k, tensor in enumerate(model.graph.initializer):
        if tensor.data_location == onnx.TensorProto.EXTERNAL:
            values = rng.uniform(0.5, 1.5, size=tuple(tensor.dims)).astype(np.float32)
            model.graph.initializer[k].CopyFrom(numpy_helper.from_array(values, tensor.name))
    options = ort.SessionOptions()
    options.enable_profiling = True
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    options.profile_file_prefix = str(tmp_path_factory.mktemp("ort") / "small_cnn")
    session = ort.InferenceSession(model.SerializeToString(), sess_options=options, providers=["CPUExecutionProvider"])
    x = rng.standard_normal((1, 3, 32, 32)).astype(np.float32)
    for _ in range(RUNS):
        session.run(None, {"input": x})
    events = json.loads(Path(session.end_profiling()).read_text())
    return events, [node.name for node in model.graph.node]


def test_node_kernels_are_named_as_the_onnx_nodes(ort_profile):
    events, node_names = ort_profile
    assert any(e["name"].endswith("_kernel_time") for e in events)
    timeline = parse_timeline(events)
    assert set(timeline.name) == set(node_names)


def test_onnx_runtime_fences_are_counted_as_ignored():
    """Older ONNX Runtime versions write zero-length fences around each kernel."""
    kernel = {"cat": "Node", "ph": "X", "pid": 1, "tid": 1, "ts": 10, "dur": 5, "name": "conv_kernel_time"}
    fences = [{**kernel, "name": f"conv{suffix}", "dur": 0} for suffix in ("_fence_before", "_fence_after")]
    timeline = parse_timeline([fences[0], kernel, fences[1]])
    assert timeline.name == ["conv"] and timeline.ignored["onnxruntime fence"] == 2


def test_each_onnx_runtime_run_is_a_step(ort_profile):
    events, node_names = ort_profile
    timeline = parse_timeline(events)
    assert timeline.ignored["onnxruntime session"] >= RUNS  # loading and initialisation besides the runs
    steps, counts = np.unique(timeline.step, return_counts=True)
    assert steps.tolist() == list(range(RUNS))
    assert counts.tolist() == [len(node_names)] * RUNS
