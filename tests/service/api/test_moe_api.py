"""POST /v1/moe/rebalance and deployments: balanced, valid, sticky on noise, tenant-scoped."""

from __future__ import annotations

import numpy as np
import pytest

SLOTS_PER_GPU = 3
GPUS = 8
FULL = "/v1/moe/rebalance?include=placement,layers"  # the maps and per-layer figures, which these tests read


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
    response = client.post(FULL, json=_request(load))
    assert response.status_code == 200, response.text
    body = response.json()
    _valid(body["physical_to_logical"], 16)
    assert body["balance_after"]["worst"] >= body["lower_bound"]["worst"] - 1e-9
    assert body["balance_after"]["mean"] < 1.10
    assert body["compute_ms"] >= 0


def test_a_deployment_remembers_its_placement_and_keeps_it_on_noise(client):
    first = client.post(FULL, json=_request(_load(1), deployment="serve-a")).json()
    assert first["version"] == 1
    noisy = (np.asarray(_load(1)) * np.random.default_rng(9).uniform(0.995, 1.005, size=(4, 16))).tolist()
    second = client.post(FULL, json={"load": noisy, "deployment": "serve-a"}).json()
    assert second["version"] == 2
    assert second["migrations"]["count"] == 0 and second["kept_current"] is True
    state = client.get("/v1/moe/deployments/serve-a").json()
    assert state["current_version"] == 2
    assert state["physical_to_logical"] == first["physical_to_logical"]
    assert [h["version"] for h in state["history"]] == [2, 1]


def test_a_failed_gpu_gets_no_experts(client):
    body = client.post(
        FULL,
        json=_request(
            _load(2), cluster={"num_nodes": 2, "gpus_per_node": 4, "slots_per_gpu": 3, "unavailable_gpus": [5]}
        ),
    ).json()
    _valid(body["physical_to_logical"], 16, unavailable={5})


def test_max_replicas_moved_is_never_exceeded(client):
    first = client.post(FULL, json=_request(_load(3))).json()
    drifted = np.asarray(_load(4))[:, ::-1].tolist()  # the hot experts change
    body = client.post(
        FULL,
        json=_request(
            drifted, current_placement={"physical_to_logical": first["physical_to_logical"]}, max_replicas_moved=5
        ),
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
    response = client.post(FULL, json=request)
    assert response.status_code == 422, response.text
    assert response.headers["content-type"].startswith("application/problem+json")


def test_another_tenants_deployment_is_404(client, other_client):
    client.post(FULL, json=_request(_load(6), deployment="private-moe"))
    assert other_client.get("/v1/moe/deployments/private-moe").status_code == 404
    response = other_client.post("/v1/moe/rebalance", json={"load": _load(6), "deployment": "private-moe"})
    assert response.status_code == 422  # unknown to this tenant: model and cluster are required


def test_a_deployment_that_grows_starts_from_a_fresh_plan(client):
    client.post(FULL, json=_request(_load(7), deployment="growing"))
    bigger = _request(_load(7), deployment="growing")
    bigger["cluster"] = {"num_nodes": 4, "gpus_per_node": 4, "slots_per_gpu": SLOTS_PER_GPU}
    response = client.post(FULL, json=bigger)
    assert response.status_code == 200, response.text
    assert len(response.json()["physical_to_logical"][0]) == 16 * SLOTS_PER_GPU
    assert client.get("/v1/moe/deployments/growing").json()["current_version"] == 2


UAT_REQUEST = {
    "model": {"num_moe_layers": 2, "num_logical_experts": 8, "expert_bytes": 44040192},
    "cluster": {"num_nodes": 1, "gpus_per_node": 4, "slots_per_gpu": 3},
    "load": [[900, 80, 70, 60, 50, 40, 30, 20], [10, 20, 30, 40, 50, 60, 70, 800]],
}


def test_a_current_placement_hosting_no_copy_of_a_loaded_expert_reports_balance_before_as_null(client):
    request = {**UAT_REQUEST, "current_placement": {"physical_to_logical": [[0] * 12] * 2}}
    response = client.post(FULL, json=request)
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["balance_before"] == {  # it read 0.72 and 0.009, below the lower bound of 1
        "per_layer": [None, None],
        "mean": None,
        "worst": None,
        "unhosted_experts": [[1, 2, 3, 4, 5, 6, 7]] * 2,
    }
    assert "no copy of 14 expert(s)" in body["reason"]
    assert body["balance_after"]["worst"] >= body["lower_bound"]["worst"]
    assert all(set(range(8)) <= set(layer) for layer in body["physical_to_logical"])  # every expert re-created


def test_an_all_empty_current_placement_gets_a_full_placement_and_a_null_balance_before(client):
    request = {**UAT_REQUEST, "current_placement": {"physical_to_logical": [[-1] * 12] * 2}}
    response = client.post(FULL, json=request)
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["balance_before"]["per_layer"] == [None, None]  # it read 1.0, perfect balance
    assert body["balance_before"]["unhosted_experts"] == [list(range(8))] * 2
    assert body["migrations"]["from_storage_count"] == body["migrations"]["count"]


def test_a_deployment_whose_placement_lost_an_expert_records_a_null_balance_before_in_its_history(client):
    client.post(FULL, json={**UAT_REQUEST, "deployment": "lossy"})
    request = {**UAT_REQUEST, "deployment": "lossy", "current_placement": {"physical_to_logical": [[0] * 12] * 2}}
    assert client.post(FULL, json=request).status_code == 200
    history = client.get("/v1/moe/deployments/lossy").json()["history"]
    assert history[0]["balance"]["before"] == {"mean": None, "worst": None}


@pytest.mark.parametrize(
    "name",
    ["a/b", "a%2Fb", "a b", "a?b", "a#b", ".", "..", ".hidden", "-leading-dash", "naïve", "tab\t", "line\n", "x" * 201],
)
def test_a_deployment_name_that_cannot_be_read_back_is_a_422_naming_the_field(client, name):
    response = client.post(FULL, json={**UAT_REQUEST, "deployment": name})
    assert response.status_code == 422, response.text
    assert response.headers["content-type"].startswith("application/problem+json")
    assert [error["field"] for error in response.json()["errors"]] == ["body.deployment"]


@pytest.mark.parametrize("name", ["my-moe", "serve_v1.2", "A", "9", "x" * 200, "fuzz-deployment"])
def test_a_deployment_name_of_letters_digits_dots_dashes_and_underscores_is_read_back(client, name):
    assert client.post(FULL, json={**UAT_REQUEST, "deployment": name}).status_code == 200
    response = client.get(f"/v1/moe/deployments/{name}")
    assert response.status_code == 200, response.text
    assert response.json()["name"] == name


def test_reading_a_deployment_by_a_name_no_deployment_can_have_is_a_422_naming_it(client):
    response = client.get("/v1/moe/deployments/a%20b")
    assert response.status_code == 422, response.text
    assert [error["field"] for error in response.json()["errors"]] == ["path.name"]


def test_a_deployment_kept_by_a_zero_move_cap_says_the_cap_is_why(client):
    first = client.post(FULL, json={**UAT_REQUEST, "deployment": "capped"})
    assert first.status_code == 200, first.text
    hot_last = [[1, 1, 1, 1, 1, 1, 1, 900]] * 2
    body = client.post(
        "/v1/moe/rebalance", json={"deployment": "capped", "load": hot_last, "max_replicas_moved": 0}
    ).json()
    assert body["kept_current"] is True and body["balance_after"]["worst"] > 3.0
    assert body["reason"].startswith("kept the current placement: max_replicas_moved=0 lets no copy be written")
    assert "would improve by more than" not in body["reason"]


# ----------------------------------------------------------------------------- the runtime protocol


def _skewed(hot: int) -> list[list[float]]:
    """One expert of 16 carrying most tokens, per layer: moving it forces migrations."""
    load = np.full((4, 16), 100.0)
    load[:, hot] = 5000.0
    return load.tolist()


def test_an_answer_names_its_placement_version_in_the_body_and_the_etag(client):
    response = client.post("/v1/moe/rebalance", json=_request(_load(20), deployment="etag"))
    body = response.json()
    assert body["placement_version"] == 1 and body["placement_etag"] == "v1"
    assert response.headers["etag"] == '"v1"'
    stateless = client.post("/v1/moe/rebalance", json=_request(_load(20)))
    assert stateless.json()["placement_version"] is None
    assert stateless.headers["etag"] == f'"{stateless.json()["placement_etag"]}"'


def test_an_answer_that_keeps_the_placement_is_a_few_hundred_bytes_and_keeps_its_version(client):
    client.post("/v1/moe/rebalance", json=_request(_load(21), deployment="small"))
    response = client.post("/v1/moe/rebalance", json={"load": _load(21), "deployment": "small", "placement_version": 1})
    body = response.json()
    assert body["kept_current"] is True and body["placement_version"] == 1 and body["version"] == 2
    assert len(response.content) < 1500
    assert "physical_to_logical" not in body


def test_the_full_placement_comes_on_request_or_by_get(client):
    first = client.post(FULL, json=_request(_load(22), deployment="maps")).json()
    read = client.get("/v1/moe/deployments/maps")
    assert read.headers["etag"] == '"v1"'
    state = read.json()
    assert state["placement_version"] == 1
    for key in ("physical_to_logical", "logical_to_physical", "logical_count"):
        assert state[key] == first[key]


def test_a_report_against_a_stale_version_is_a_409_naming_the_current_one(client):
    client.post("/v1/moe/rebalance", json=_request(_skewed(0), deployment="stale"))
    moved = client.post("/v1/moe/rebalance", json={"load": _skewed(9), "deployment": "stale", "placement_version": 1})
    assert moved.json()["placement_version"] == 2
    response = client.post(
        "/v1/moe/rebalance", json={"load": _skewed(9), "deployment": "stale", "placement_version": 1}
    )
    assert response.status_code == 409
    assert "the current one is version 2" in response.json()["detail"]


def test_a_preview_records_nothing(client):
    client.post("/v1/moe/rebalance", json=_request(_skewed(0), deployment="preview"))
    preview = client.post("/v1/moe/rebalance", json={"load": _skewed(9), "deployment": "preview", "apply": False})
    body = preview.json()
    assert body["applied"] is False and body["migrations"]["count"] > 0 and body["placement_version"] == 1
    state = client.get("/v1/moe/deployments/preview").json()
    assert (state["current_version"], state["placement_version"]) == (1, 1)


def test_a_partly_applied_answer_leaves_the_deployment_on_what_was_really_deployed(client):
    first = client.post(FULL, json=_request(_skewed(0), deployment="partial")).json()
    answer = client.post(FULL, json={"load": _skewed(9), "deployment": "partial"}).json()
    migrations = answer["migrations"]
    assert migrations["count"] >= 2
    confirmed = client.post(
        "/v1/moe/deployments/partial/applied", json={"placement_version": 2, "migrations_completed": [0]}
    )
    assert confirmed.status_code == 200, confirmed.text
    assert confirmed.json()["migrations_applied"] == 1 and confirmed.json()["placement_version"] == 3
    expected = np.asarray(first["physical_to_logical"])
    expected[migrations["layer"][0], migrations["slot"][0]] = migrations["logical_expert"][0]
    state = client.get("/v1/moe/deployments/partial").json()
    assert state["physical_to_logical"] == expected.tolist()
    assert [h["status"] for h in state["history"]] == ["confirmed", "partially applied", "answered"]
    # the next report starts from what is deployed: the copies not made are asked for again
    again = client.post("/v1/moe/rebalance", json={"load": _skewed(9), "deployment": "partial", "placement_version": 3})
    assert again.json()["based_on_version"] == 3 and again.json()["migrations"]["count"] >= 1


def test_a_fully_applied_answer_is_marked_applied(client):
    client.post("/v1/moe/rebalance", json=_request(_load(23), deployment="full"))
    confirmed = client.post("/v1/moe/deployments/full/applied", json={"placement_version": 1})
    assert confirmed.json()["status"] == "applied" and confirmed.json()["placement_version"] == 1
    assert client.get("/v1/moe/deployments/full").json()["history"][0]["status"] == "applied"


def test_confirming_a_stale_version_is_a_409_and_an_unknown_migration_a_422(client):
    client.post("/v1/moe/rebalance", json=_request(_skewed(0), deployment="confirm"))
    client.post("/v1/moe/rebalance", json={"load": _skewed(9), "deployment": "confirm"})
    stale = client.post("/v1/moe/deployments/confirm/applied", json={"placement_version": 1})
    assert stale.status_code == 409 and "version 2" in stale.json()["detail"]
    unknown = client.post(
        "/v1/moe/deployments/confirm/applied", json={"placement_version": 2, "migrations_completed": [10**6]}
    )
    assert unknown.status_code == 422
    assert client.post("/v1/moe/deployments/nobody/applied", json={"placement_version": 1}).status_code == 404


def test_unavailable_gpus_carry_over_to_load_only_reports_until_the_cluster_is_sent_again(client):
    down = {"num_nodes": 2, "gpus_per_node": 4, "slots_per_gpu": SLOTS_PER_GPU, "unavailable_gpus": [5]}
    client.post("/v1/moe/rebalance", json=_request(_load(24), deployment="failing"))
    client.post(FULL, json={"load": _load(24), "deployment": "failing", "cluster": down})
    later = client.post(FULL, json={"load": _load(25), "deployment": "failing"}).json()
    _valid(later["physical_to_logical"], 16, unavailable={5})  # still down without saying so again
    back = {**down, "unavailable_gpus": []}
    returned = client.post(FULL, json={"load": _load(25), "deployment": "failing", "cluster": back}).json()
    slots = np.asarray(returned["physical_to_logical"]).reshape(4, GPUS, SLOTS_PER_GPU)
    assert (slots[:, 5] >= 0).all()  # the returning GPU is refilled
    assert returned["budget"]["copies_written"] == returned["migrations"]["count"]


def test_include_eplb_gives_the_maps_under_eplbs_names_as_padded_arrays(client):
    body = client.post("/v1/moe/rebalance?include=placement,eplb", json=_request(_load(26))).json()
    assert body["physical_to_logical_map"] == body["physical_to_logical"]
    padded = np.asarray(body["logical_to_physical_map"])  # a rectangular array, -1 padded
    assert padded.shape[:2] == (4, 16) and padded.shape[2] == max(max(row) for row in body["logical_count"])
    for layer in range(4):
        for expert in range(16):
            slots = padded[layer, expert]
            assert slots[slots >= 0].tolist() == body["logical_to_physical"][layer][expert]


def test_a_failure_with_a_zero_repair_budget_writes_only_its_lost_experts_and_says_that_budget_bound(client):
    down = {"num_nodes": 2, "gpus_per_node": 4, "slots_per_gpu": SLOTS_PER_GPU, "unavailable_gpus": [5]}
    client.post("/v1/moe/rebalance", json=_request(_load(27), deployment="repairing"))
    failed = client.post(
        "/v1/moe/rebalance", json={"load": _load(27), "deployment": "repairing", "cluster": down, "repair_budget": 0}
    ).json()
    budget = failed["budget"]
    assert budget["lost_experts"] > 0 and budget["repair_budget"] == 0
    assert failed["migrations"]["count"] == budget["lost_experts"]
    assert budget["bound"] == "repair_budget"
