"""The ``hyperplace plan`` command offline (no server, no database): usage errors are one line, not a traceback."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from service.cli import app
from tests.service.graphs import diamond_graph

runner = CliRunner()


@pytest.fixture
def graph_file(tmp_path):
    path = tmp_path / "diamond.json"
    path.write_text(json.dumps(diamond_graph()))
    return path


def _plan(*args: str):
    return runner.invoke(app, ["plan", *args])


def _text(result) -> str:
    """The command's output as one line of words (rich wraps usage errors in a box)."""
    return " ".join(result.output.replace("│", " ").split())


def test_plan_offline_writes_the_plan_json_and_prints_the_makespan(graph_file, tmp_path):
    out = tmp_path / "plan.json"
    result = _plan(str(graph_file), "--preset", "dgx-h100", "--out", str(out))
    assert result.exit_code == 0, result.output
    assert "makespan" in result.output
    assert json.loads(out.read_text())["summary"]["makespan_s"] > 0


def test_an_inventory_file_that_is_not_json_is_a_usage_error(graph_file, tmp_path):
    inventory = tmp_path / "inventory.json"
    inventory.write_text("not json")
    result = _plan(str(graph_file), "--inventory", str(inventory))
    assert result.exit_code == 2
    assert "is not JSON" in _text(result) and "Traceback" not in result.output


def test_a_model_file_that_is_not_json_is_a_usage_error(tmp_path):
    model = tmp_path / "model.json"
    model.write_text("{")
    result = _plan(str(model))
    assert result.exit_code == 2 and "is not JSON" in _text(result)


@pytest.mark.parametrize("dim", ["batch=abc", "batch=0", "batch=1.5"])
def test_a_dimension_that_is_not_a_positive_integer_is_a_usage_error(graph_file, dim):
    result = _plan(str(graph_file), "-d", dim)
    assert result.exit_code == 2 and "--dim batch must be a positive integer" in _text(result)


def test_a_bad_plan_option_is_named(graph_file):
    result = _plan(str(graph_file), "-o", "micro_batches=0")
    assert result.exit_code == 2 and "micro_batches" in result.output and "Traceback" not in result.output
