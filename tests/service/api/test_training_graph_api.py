"""POST /v1/plans of an exported training step (docs/api.md, "Exported training steps"):
planned as the step it is, its parameters, gradients and optimizer state counted on the
devices that hold them, and its gradient reduction in the traffic.

The graph is tests/partitioners/training_step.py: w1 4,000 and w2 2,000 bytes, gradients
as large, two Adam moments per parameter.
"""

from __future__ import annotations

from tests.partitioners.training_step import mlp_training_step


def _device(name: str) -> dict:
    return {
        "name": name,
        "type": "T",
        "peak_flops": 1e12,
        "memory_tiers": [{"name": "HBM", "capacity_bytes": 1e9, "bandwidth_bytes_per_s": 1e15}],
    }


PAIR = {
    "name": "pair",
    "groups": [{"name": "node", "devices": [_device("d0"), _device("d1")], "link": {"bandwidth_bytes_per_s": 1e9}}],
}


def _plan(client, options: dict) -> dict:
    response = client.post("/v1/plans", json={"graph": mlp_training_step(), "inventory": PAIR, "options": options})
    assert response.status_code in (200, 201), response.text
    return response.json()


def test_a_training_step_on_one_device_counts_parameters_gradients_and_optimizer_state(client):
    plan = _plan(client, {"mode": "training", "strategy": "single"})
    assert plan["summary"]["training_state_bytes"] == {
        "d0": {"parameters": 4000 + 2000, "gradients": 4000 + 2000, "optimizer_state": 2 * 4000 + 2 * 2000}
    }
    assert plan["summary"]["peak_memory_bytes"]["d0"] >= 6000 + 6000 + 12000
    assert set(plan["ops"]) == {n["name"] for n in mlp_training_step()["nodes"]}  # nothing synthesised


def test_a_data_parallel_plan_of_two_micro_batches_moves_each_gradient_share_once(client):
    plan = _plan(client, {"mode": "training", "micro_batches": 2, "strategy": "hybrid"})
    assert plan["strategy"] == "hybrid-1x2"
    ops = plan["ops"]
    assert {ops["fc1@mb0"], ops["adam_w1"]} == {"d0"} and {ops["fc1@mb1"], ops["adam_w2"]} == {"d1"}
    # adam_w1 (d0) reads dw1@mb1 from d1: 4,000 / 2; adam_w2 (d1) reads dw2@mb0 from d0: 2,000 / 2
    moved = sorted((t["tensor"], t["src"], t["dst"], t["bytes"]) for t in plan["transfers"])
    assert moved == [("dw1@mb1", "d1", ["d0"], 2000.0), ("dw2@mb0", "d0", ["d1"], 1000.0)]
    assert plan["summary"]["comm_bytes"] == 3000.0
    assert plan["summary"]["training_state_bytes"] == {
        "d0": {"parameters": 6000.0, "gradients": 2000 + 2000 + 1000.0, "optimizer_state": 8000.0},
        "d1": {"parameters": 6000.0, "gradients": 2000 + 1000 + 1000.0, "optimizer_state": 4000.0},
    }


def test_inference_mode_on_a_training_step_plans_the_step_and_notes_why(client):
    plan = _plan(client, {"mode": "inference", "strategy": "single"})
    assert plan["summary"]["training_state_bytes"]["d0"]["optimizer_state"] == 12000.0
    assert any("options.mode is 'inference'" in note for note in plan["notes"])


def test_a_gradient_of_an_unknown_parameter_is_a_422_naming_it(client):
    graph = mlp_training_step()
    graph["tensors"][7]["of"] = "w3"
    response = client.post("/v1/plans", json={"graph": graph, "inventory": PAIR, "options": {}})
    assert response.status_code == 422, response.text
    body = response.json()
    assert "'w3'" in body["detail"] and "'dw1'" in body["detail"]


def test_a_stored_training_step_plans_again_from_storage_with_its_roles(client):
    first = _plan(client, {"mode": "training", "strategy": "single"})
    stored = client.get(f"/v1/models/{first['model_hash']}").json()
    response = client.post(
        "/v1/plans",
        json={
            "graph_id": stored["id"],
            "inventory": PAIR,
            "options": {"mode": "training", "strategy": "single", "seed": 1},
        },
    )
    assert response.status_code == 201, response.text
    again = response.json()
    assert again["model_hash"] == first["model_hash"]
    assert again["summary"]["training_state_bytes"] == first["summary"]["training_state_bytes"]
