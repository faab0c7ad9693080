"""POST /v1/moe/rebalance and deployments: balanced, valid, sticky on noise, tenant-scoped."""

from __future__ import annotations

import numpy as np
import pytest

SLOTS_PER_GPU = 3
GPUS = 8


def _load(seed: int, layers: int = 4, experts: int = 16) -> list[list[float]]:
    rng = np.random.default_rng(seed)
    popularity = 1.0 / np.arange(1, experts + 1) ** 1.1
    return (rng.poisson(20000 * popularity / popularity.sum(), size=(layers, experts)) + 1).astype(float).tolist()


def _request(load, **extra) -> dict:
    return {
        "model": {"num_moe_layers": len(load), "num_logical_experts": len(load[0]), "expert_bytes": 1000},
        "cluster": {"num_nodes": 2, "gpus_per_node": GPUS // 2, "slots_per_gpu": SLOTS_PER_GPU},
        "load": load,
        **extra,
    }


def _valid(placement: list[list[int]], experts: int, unavailable=()) -> None:
    array = np.asarray(placement)
    for layer in array:
        assert set(range(experts)) <= set(layer.tolist())
        per_gpu = layer.reshape(GPUS, SLOTS_PER_GPU)
        for gpu, slots in enumerate(per_gpu):
            copies = slots[slots >= 0]
            assert len(copies) == len(set(copies.tolist())), "two copies of one expert on one GPU"
            if gpu in unavailable:
                assert (slots == -1).all()


def test_a_fresh_rebalance_is_valid_and_not_worse_than_its_lower_bound(client):
    load = _load(0)
    response = client.post("/v1/moe/rebalance", json=_request(load))
    assert response.status_code == 200, response.text
    body = response.json()
    _valid(body["physical_to_logical"], 16)
    assert body["balance_after"]["worst"] >= body["lower_bound"]["worst"] - 1e-9
    assert body["balance_after"]["mean"] < 1.10
    assert body["compute_ms"] >= 0


def test_a_deployment_remembers_its_placement_and_keeps_it_on_noise(client):
    first = client.post("/v1/moe/rebalance", json=_request(_load(1), deployment="serve-a")).json()
    assert first["version"] == 1
    noisy = (np.asarray(_load(1)) * np.random.default_rng(9).uniform(0.995, 1.005, size=(4, 16))).tolist()
    second = client.post("/v1/moe/rebalance", json={"load": noisy, "deployment": "serve-a"}).json()
    assert second["version"] == 2
    assert second["migrations"]["count"] == 0 and second["kept_current"] is True
    state = client.get("/v1/moe/deployments/serve-a").json()
    assert state["current_version"] == 2
    assert state["physical_to_logical"] == first["physical_to_logical"]
    assert [h["version"] for h in state["history"]] == [2, 1]


def test_a_failed_gpu_gets_no_experts(client):
    body = client.post("/v1/moe/rebalance", json=_request(_load(2), cluster={"num_nodes": 2, "gpus_per_node": 4, "slots_per_gpu": 3, "unavailable_gpus": [5]})).json()
    _valid(body["physical_to_logical"], 16, unavailable={5})


def test_max_replicas_moved_is_never_exceeded(client):
    first = client.post("/v1/moe/rebalance", json=_request(_load(3))).json()
    drifted = np.asarray(_load(4))[:, ::-1].tolist()  # the hot experts change
    body = client.post(
        "/v1/moe/rebalance",
        json=_request(drifted, current_placement={"physical_to_logical": first["physical_to_logical"]}, max_replicas_moved=5),
    ).json()
    assert body["migrations"]["count"] <= 5
    _valid(body["physical_to_logical"], 16)


@pytest.mark.parametrize(
    "change",
    [
        {"load": [[1.0, 2.0]]},  # wrong shape
        {"load": [[-1.0] * 16] * 4},  # negative
        {"model": {"num_moe_layers": 4, "num_logical_experts": 100}},  # more experts than slots
        {"current_placement": {"physical_to_logical": [[99] * 24] * 4}},  # an expert that does not exist
    ],
)
def test_bad_moe_input_is_a_422_naming_the_field(client, change):
    request = _request(_load(5))
    request.update(change)
    response = client.post("/v1/moe/rebalance", json=request)
    assert response.status_code == 422, response.text
    assert response.headers["content-type"].startswith("application/problem+json")


def test_another_tenants_deployment_is_404(client, other_client):
    client.post("/v1/moe/rebalance", json=_request(_load(6), deployment="private-moe"))
    assert other_client.get("/v1/moe/deployments/private-moe").status_code == 404
    response = other_client.post("/v1/moe/rebalance", json={"load": _load(6), "deployment": "private-moe"})
    assert response.status_code == 422  # unknown to this tenant: model and cluster are required


def test_a_deployment_that_grows_starts_from_a_fresh_plan(client):
    client.post("/v1/moe/rebalance", json=_request(_load(7), deployment="growing"))
    bigger = _request(_load(7), deployment="growing")
    bigger["cluster"] = {"num_nodes": 4, "gpus_per_node": 4, "slots_per_gpu": SLOTS_PER_GPU}
    response = client.post("/v1/moe/rebalance", json=bigger)
    assert response.status_code == 200, response.text
    assert len(response.json()["physical_to_logical"][0]) == 16 * SLOTS_PER_GPU
    assert client.get("/v1/moe/deployments/growing").json()["current_version"] == 2
