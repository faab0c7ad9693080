"""Energy of a training step and tokens per joule (partitioners.parallel3d.energy).

The model: every GPU of the layout draws its board power while it computes and its idle
power for the rest of the step (pipeline bubble, exposed communication).
"""

from __future__ import annotations

import pytest

from partitioners.errors import InvalidInput
from partitioners.parallel3d.energy import step_energy_j
from partitioners.parallel3d.planner import evaluate_layouts
from tests.partitioners.parallel3d.shapes import (
    RECOMPUTE_CLUSTER,
    RECOMPUTE_MODEL,
    cluster_spec,
    layout_specs,
    model_spec,
    training_spec,
)


def test_a_step_costs_busy_time_at_board_power_and_the_rest_at_idle_power():
    # 8 GPUs, a 2 s step computing 1.5 s of it, 700 W busy and 75 W idle:
    # 8 x (1.5 x 700 + 0.5 x 75) = 8 x 1087.5 = 8,700 J
    assert float(step_energy_j(8, 2.0, 1.5, 700.0, 75.0)) == pytest.approx(8700.0)


def test_busy_time_beyond_the_step_is_clipped_to_it():
    assert float(step_energy_j(1, 1.0, 1.2, 700.0, 75.0)) == pytest.approx(700.0)


def _predict(cluster: dict, layout: dict):
    (prediction,) = evaluate_layouts(
        model_spec(RECOMPUTE_MODEL),
        cluster_spec(cluster),
        training_spec({"global_batch_sequences": 64}),
        layout_specs([layout]),
    )
    return prediction


def test_a_layout_on_h100_is_priced_from_its_compute_time_and_the_catalogues_power():
    # dgx-h100: 700 W at load, 75 W held idle (partitioners.hardware.catalogue [POWER]); 8 GPUs
    # of pp 2 x dp 4, whose bubble and exposed communication are idle time
    prediction = _predict(RECOMPUTE_CLUSTER, {"tp": 1, "pp": 2})
    breakdown = prediction.time_breakdown_s
    busy = breakdown["compute_s"] + breakdown["optimizer_s"]
    idle = prediction.step_time_s - busy
    assert breakdown["bubble_s"] > 0 and idle >= breakdown["bubble_s"]
    assert prediction.energy_per_step_j == pytest.approx(8 * (busy * 700.0 + idle * 75.0))
    tokens = 64 * RECOMPUTE_MODEL["seq_length"]
    assert prediction.tokens_per_joule == pytest.approx(tokens / prediction.energy_per_step_j)


def test_a_cluster_without_power_figures_reports_no_energy():
    prediction = _predict({**RECOMPUTE_CLUSTER, "board_power_w": None, "idle_power_w": None}, {"tp": 1, "pp": 1})
    assert prediction.energy_per_step_j is None and prediction.tokens_per_joule is None


def test_power_figures_given_by_the_request_replace_the_presets():
    stock = _predict(RECOMPUTE_CLUSTER, {"tp": 1, "pp": 1})
    capped = _predict({**RECOMPUTE_CLUSTER, "board_power_w": 350.0, "idle_power_w": 75.0}, {"tp": 1, "pp": 1})
    assert capped.step_time_s == stock.step_time_s
    assert capped.energy_per_step_j < stock.energy_per_step_j


def test_idle_power_above_board_power_is_refused_naming_the_field():
    with pytest.raises(InvalidInput) as error:
        cluster_spec({**RECOMPUTE_CLUSTER, "board_power_w": 300.0, "idle_power_w": 400.0})
    assert error.value.field == "cluster.idle_power_w"


def test_board_power_without_idle_power_is_refused():
    with pytest.raises(InvalidInput) as error:
        cluster_spec({"preset": "dgx-h100", "nodes": 1, "idle_power_w": None})
    assert "board_power_w" in str(error.value) and "idle_power_w" in str(error.value)
