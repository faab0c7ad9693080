"""A value of the wrong JSON type is a 422 naming its field on every route, never read as
something else: ``"yes"`` is not ``true``, ``"no"`` not ``false``, ``"64"`` not 64."""

from __future__ import annotations

import pytest

from tests.service.graphs import plan_request

PARALLEL_REQUEST = {
    "model": {"num_layers": 8, "hidden_size": 1024, "num_attention_heads": 8, "vocab_size": 32000, "seq_length": 2048},
    "cluster": {"preset": "dgx-h100", "nodes": 1},
    "training": {"global_batch_sequences": 64},
}
MOE_REQUEST = {
    "model": {"num_moe_layers": 1, "num_logical_experts": 4},
    "cluster": {"num_nodes": 1, "gpus_per_node": 2, "slots_per_gpu": 2},
    "load": [[4.0, 3.0, 2.0, 1.0]],
}


def _with(request: dict, block: str, field: str, value) -> dict:
    return {**request, block: {**request[block], field: value}}


@pytest.mark.parametrize(
    ("block", "field", "value"),
    [
        ("model", "gated_mlp", "yes"),
        ("model", "num_layers", "8"),
        ("cluster", "nodes", "1"),
    ],
)
def test_a_parallel_plan_field_of_the_wrong_type_is_a_422_naming_it(client, block, field, value):
    response = client.post("/v1/parallel/plan", json=_with(PARALLEL_REQUEST, block, field, value))
    assert response.status_code == 422, response.text
    assert field in response.json()["detail"]


def test_the_same_parallel_plan_with_json_types_is_answered(client):
    response = client.post("/v1/parallel/plan", json=_with(PARALLEL_REQUEST, "model", "gated_mlp", True))
    assert response.status_code == 200, response.text


def test_a_moe_cluster_size_given_as_text_is_a_422_naming_it(client):
    response = client.post("/v1/moe/rebalance", json=_with(MOE_REQUEST, "cluster", "num_nodes", "1"))
    assert response.status_code == 422, response.text
    assert "num_nodes" in response.json()["detail"]


def test_a_replan_flag_given_as_text_is_a_422_and_makes_no_plan(client):
    plan = client.post("/v1/plans", json=plan_request()).json()
    plans_of_the_model = f"/v1/models/{plan['model_hash']}/plans"
    before = client.get(plans_of_the_model).json()
    response = client.post(f"/v1/plans/{plan['id']}/replan", json={"use_calibration": "no"})
    assert response.status_code == 422, response.text
    assert "use_calibration" in response.json()["detail"]
    assert client.get(plans_of_the_model).json() == before
