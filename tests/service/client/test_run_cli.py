"""``hyperplace run``: a plan file run for real, and what it refuses, as one line and exit 2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from service.cli import app
from service.client.onnx_runner import prepare_model

MODEL = Path(__file__).resolve().parents[2] / "fixtures" / "feedback" / "small_cnn.onnx"
runner = CliRunner()


def _text(result) -> str:
    return " ".join(result.output.replace("│", " ").split())


@pytest.fixture
def plan_file(tmp_path):
    """A two-GPU plan of the model at batch 1, as ``hyperplace plan --out`` writes one."""
    model = prepare_model(MODEL.read_bytes(), {"batch": 1})
    names = model.graph.op_names.tolist()
    ops = {name: f"node0/gpu{(2 * i) // len(names)}" for i, name in enumerate(names)}
    plan = {"id": None, "status": "done", "model_hash": model.model_hash, "options": {"dims": {"batch": 1}}, "ops": ops}
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(plan))
    return path


def test_run_maps_plan_devices_and_prints_the_output_check(plan_file):
    result = runner.invoke(
        app,
        [
            "run",
            str(MODEL),
            "--plan",
            str(plan_file),
            "--steps",
            "1",
            "--map",
            "node0/gpu0=cpu:0",
            "--map",
            "node0/gpu1=cpu:1",
        ],
    )
    assert result.exit_code == 0, result.output
    assert "output output: max abs diff 0" in _text(result)
    assert "step (makespan)" in result.output


def test_run_names_the_devices_this_machine_lacks(plan_file):
    result = runner.invoke(app, ["run", str(MODEL), "--plan", str(plan_file), "--steps", "1"])
    assert result.exit_code == 2
    assert "the plan's devices are not on this machine: node0/gpu0 (needs cuda:0" in _text(result)
    assert "--map node0/gpu0=cpu:0" in _text(result)


def test_run_refuses_a_plan_made_with_other_dims(plan_file):
    result = runner.invoke(app, ["run", str(MODEL), "--plan", str(plan_file), "--dims", "batch=2"])
    assert result.exit_code == 2
    assert "error: the plan is for model" in _text(result) and "plan this model, with the same dims" in _text(result)


def test_run_refuses_a_file_onnx_cannot_read(plan_file, tmp_path):
    broken = tmp_path / "broken.onnx"
    broken.write_bytes(MODEL.read_bytes()[:100])
    result = runner.invoke(app, ["run", str(broken), "--plan", str(plan_file)])
    assert result.exit_code == 2
    assert "error: cannot read the model: the upload is not a readable ONNX model" in _text(result)


def test_feedback_needs_a_plan_stored_on_a_server(plan_file):
    args = ["run", str(MODEL), "--plan", str(plan_file), "--steps", "1", "--feedback"]
    result = runner.invoke(app, [*args, "--map", "node0/gpu0=cpu:0", "--map", "node0/gpu1=cpu:0"])
    assert result.exit_code == 2
    assert "--feedback needs a plan stored on a server" in _text(result)
