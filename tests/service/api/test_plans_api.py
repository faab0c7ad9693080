"""POST /v1/plans and the read side, on the database under test."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from partitioners.graph.generators import synthetic_graph_json
from tests.service.graphs import diamond_graph, measured_timeline, plan_request

ONNX_DIR = Path(__file__).parents[2] / "fixtures" / "onnx"


def test_a_json_submission_answers_201_with_a_full_plan(client):
    response = client.post("/v1/plans", json=plan_request())
    assert response.status_code == 201, response.text
    plan = response.json()
    assert response.headers["location"] == f"/v1/plans/{plan['id']}"
    assert plan["status"] == "done"
    assert set(plan["ops"]) == {"a", "b", "c", "d"}
    assert plan["summary"]["makespan_s"] > 0
    assert plan["summary"]["feasible"] is True
    assert plan["candidates"] and any(c["strategy"] == plan["strategy"] for c in plan["candidates"])
    for _tensor, placements in plan["tensors"].items():
        for placement in placements:
            assert placement["offset"] >= 0 and placement["tier"]


def test_the_same_request_returns_the_stored_plan_without_recomputing(client):
    first = client.post("/v1/plans", json=plan_request(diamond_graph("cache-me")))
    second = client.post("/v1/plans", json=plan_request(diamond_graph("cache-me")))
    assert first.status_code == 201 and second.status_code == 200
    assert second.json()["id"] == first.json()["id"]
    assert second.json()["cached"] is True


def test_node_order_in_the_file_does_not_change_the_model_hash(client):
    graph = diamond_graph("order")
    reordered = dict(graph, nodes=list(reversed(graph["nodes"])), tensors=list(reversed(graph["tensors"])))
    first = client.post("/v1/plans", json=plan_request(graph)).json()
    second = client.post("/v1/plans", json=plan_request(reordered))
    assert second.status_code == 200
    assert second.json()["model_hash"] == first["model_hash"]


def test_the_same_graph_posted_in_another_node_order_gets_the_same_plan(client, other_client):
    graph = synthetic_graph_json(300, seed=2)
    reordered = dict(graph, nodes=list(reversed(graph["nodes"])), tensors=list(reversed(graph["tensors"])))
    first = client.post("/v1/plans", json=plan_request(graph)).json()
    second = other_client.post("/v1/plans", json=plan_request(reordered)).json()  # another tenant: no cache hit
    assert second["id"] != first["id"]
    assert second["ops"] == first["ops"] and second["summary"]["makespan_s"] == first["summary"]["makespan_s"]


def test_other_options_make_a_new_plan(client):
    first = client.post("/v1/plans", json=plan_request(diamond_graph("opts"))).json()
    second = client.post("/v1/plans", json=plan_request(diamond_graph("opts"), micro_batches=4))
    assert second.status_code == 201
    assert second.json()["id"] != first["id"]


def test_a_plan_reads_back_with_an_etag_and_304_when_unchanged(client):
    plan = client.post("/v1/plans", json=plan_request(diamond_graph("etag"))).json()
    response = client.get(f"/v1/plans/{plan['id']}")
    assert response.status_code == 200
    assert response.json()["ops"] == plan["ops"]
    again = client.get(f"/v1/plans/{plan['id']}", headers={"If-None-Match": response.headers["etag"]})
    assert again.status_code == 304


def test_model_summary_reports_operators_flops_and_parameters(client):
    plan = client.post("/v1/plans", json=plan_request(diamond_graph("summary"))).json()
    model = client.get(f"/v1/models/{plan['model_hash']}").json()
    assert model["n_ops"] == 4 and model["n_tensors"] == 8
    assert model["total_flops"] == pytest.approx(4e9 + 8e9 + 8e9 + 1e6)
    assert model["parameter_bytes"] == 24_000_000


def test_plans_of_a_model_are_listed_newest_first_with_keyset_pages(client):
    graph = diamond_graph("paged")
    ids = [client.post("/v1/plans", json=plan_request(graph, seed=seed)).json()["id"] for seed in range(5)]
    model_hash = client.get(f"/v1/plans/{ids[0]}").json()["model_hash"]
    seen, cursor = [], None
    while True:
        params = {"limit": 2} | ({"cursor": cursor} if cursor else {})
        page = client.get(f"/v1/models/{model_hash}/plans", params=params).json()
        seen += [item["id"] for item in page["items"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert seen == list(reversed(ids))


def test_plans_of_a_model_filter_by_status(client):
    plan = client.post("/v1/plans", json=plan_request(diamond_graph("filter"))).json()
    done = client.get(f"/v1/models/{plan['model_hash']}/plans", params={"status": "done"}).json()
    queued = client.get(f"/v1/models/{plan['model_hash']}/plans", params={"status": "queued"}).json()
    assert [p["id"] for p in done["items"]] == [plan["id"]]
    assert queued["items"] == []


def test_a_bad_cursor_is_a_422(client):
    response = client.get("/v1/models/" + "a" * 64 + "/plans", params={"cursor": "garbage"})
    assert response.status_code == 422


def test_a_deleted_plan_is_gone(client):
    plan = client.post("/v1/plans", json=plan_request(diamond_graph("delete-me"))).json()
    assert client.delete(f"/v1/plans/{plan['id']}").status_code == 204
    assert client.get(f"/v1/plans/{plan['id']}").status_code == 404


def test_a_stored_graph_can_be_planned_again_by_its_id(client):
    plan = client.post("/v1/plans", json=plan_request(diamond_graph("by-id"))).json()
    graph_id = client.get(f"/v1/models/{plan['model_hash']}").json()["id"]
    response = client.post("/v1/plans", json={"graph_id": graph_id, "inventory": {"preset": "dgx-h100", "nodes": 2}})
    assert response.status_code == 201, response.text
    assert response.json()["model_hash"] == plan["model_hash"]


def test_the_trace_is_chrome_trace_json_with_device_tracks(client):
    plan = client.post("/v1/plans", json=plan_request(diamond_graph("trace"))).json()
    trace = client.get(f"/v1/plans/{plan['id']}/trace").json()
    events = trace["traceEvents"]
    complete = [e for e in events if e["ph"] == "X"]
    assert {e["name"] for e in complete} >= {"a", "b", "c", "d"}
    for event in complete:
        assert {"ts", "dur", "pid", "tid"} <= set(event) and event["dur"] >= 0
    assert any(e["ph"] == "M" for e in events)


def test_an_onnx_model_is_accepted_as_multipart(client):
    path = ONNX_DIR / "gpt2.onnx"
    response = client.post(
        "/v1/plans",
        files={"model": (path.name, path.read_bytes(), "application/octet-stream")},
        data={
            "inventory": json.dumps({"preset": "dgx-h100", "nodes": 1}),
            "options": json.dumps({"dims": {"batch": 1, "sequence": 128}}),
        },
    )
    assert response.status_code == 201, response.text
    plan = response.json()
    assert plan["status"] == "done" and len(plan["ops"]) > 100
    assert client.get(f"/v1/models/{plan['model_hash']}").json()["source_format"] == "onnx"


def test_a_405_on_a_plan_allows_every_method_the_plan_route_serves(client):
    plan = client.post("/v1/plans", json=plan_request(diamond_graph("allow"))).json()
    response = client.request("PUT", f"/v1/plans/{plan['id']}")
    assert response.status_code == 405
    assert {m.strip() for m in response.headers["allow"].split(",")} == {"GET", "HEAD", "DELETE"}
    for method in ("GET", "HEAD"):
        assert client.request(method, f"/v1/plans/{plan['id']}").status_code == 200
    assert client.delete(f"/v1/plans/{plan['id']}").status_code == 204


def test_an_inventory_default_dtype_times_the_plan_at_that_peak_and_is_another_plan(client):
    # the diamond's declared tensors are float32: timed at bf16 the plan says so; at fp32 it is slower and silent
    bf16 = client.post("/v1/plans", json=plan_request(diamond_graph("dtype"))).json()
    body = plan_request(diamond_graph("dtype"))
    body["inventory"]["default_dtype"] = "fp32"
    response = client.post("/v1/plans", json=body)
    assert response.status_code == 201, response.text
    fp32 = response.json()
    assert fp32["inventory_hash"] != bf16["inventory_hash"]
    assert fp32["summary"]["makespan_s"] > 2 * bf16["summary"]["makespan_s"]
    assert any("timed at the bf16 peak" in note for note in bf16["notes"])
    assert not any("peak" in note for note in fp32["notes"])


def test_a_default_dtype_the_preset_does_not_publish_is_a_422_naming_it(client):
    body = plan_request(diamond_graph("dtype-unknown"), preset="ascend-910b")
    body["inventory"]["default_dtype"] = "tf32"
    response = client.post("/v1/plans", json=body)
    assert response.status_code == 422
    assert "inventory.default_dtype" in response.text and "bf16, fp16" in response.text


def test_a_plan_on_a_preset_states_the_energy_of_one_step(client):
    plan = client.post("/v1/plans", json=plan_request(diamond_graph("energy"))).json()
    energy = plan["summary"]["energy"]
    assert plan["summary"]["energy_j"] == pytest.approx(energy["compute_j"] + energy["idle_j"] + energy["transfer_j"])
    assert energy["devices_counted"] == 8  # a DGX H100's eight GPUs, held whether used or not


def test_the_energy_objective_needs_power_figures_on_every_device(client):
    request = plan_request(diamond_graph("no-power"), objective="energy")
    request["inventory"] = {
        "groups": [
            {
                "name": "g0",
                "devices": [
                    {
                        "name": "d0",
                        "peak_flops": 1e14,
                        "memory_tiers": [{"name": "HBM", "capacity_bytes": 1e10, "bandwidth_bytes_per_s": 1e12}],
                    }
                ],
                "link": {"bandwidth_bytes_per_s": 1e9},
            }
        ]
    }
    response = client.post("/v1/plans", json=request)
    assert response.status_code == 422
    assert "d0" in response.json()["detail"]


def mlp_graph(name: str) -> dict:
    """x -> MatMul -> Add(bias) -> Relu -> MatMul -> y, 1 MB activations."""

    def node(name: str, op: str, inputs: list[str], outputs: list[str]) -> dict:
        return {"name": name, "op": op, "inputs": inputs, "outputs": outputs, "flops": 1e9}

    def tensor(name: str) -> dict:
        return {"name": name, "bytes": 1e6, **({"kind": "parameter"} if name[0] in "wb" else {})}

    return {
        "name": name,
        "nodes": [
            node("mm1", "MatMul", ["x", "w1"], ["h1"]),
            node("bias", "Add", ["h1", "b1"], ["h2"]),
            node("relu", "Relu", ["h2"], ["h3"]),
            node("mm2", "MatMul", ["h3", "w2"], ["y"]),
        ],
        "tensors": [tensor(t) for t in ("x", "w1", "h1", "b1", "h2", "h3", "w2", "y")],
    }


def test_a_fused_plan_lists_its_kernels_and_places_them_as_units(client):
    graph = mlp_graph("fused")
    plan = client.post("/v1/plans", json=plan_request(graph, fusion="compiler")).json()
    assert plan["fusion_groups"] == [{"name": "mm1", "ops": ["mm1", "bias", "relu"], "bytes_saved": 4e6}]
    assert set(plan["ops"]) == {"mm1", "mm2"}
    assert not {"h1", "h2"} & set(plan["tensors"])  # kept on chip: no memory-tier holdings
    assert plan["summary"]["fusion"] == {
        "mode": "compiler",
        "groups": 1,
        "ops_fused": 3,
        "launches_saved": 2,
        "bytes_saved": 4e6,
    }
    unfused = client.post("/v1/plans", json=plan_request(graph)).json()
    assert unfused["id"] != plan["id"] and "fusion_groups" not in unfused


def test_a_fused_plan_takes_feedback_on_its_kernels(client):
    graph = mlp_graph("fused-feedback")
    plan = client.post("/v1/plans", json=plan_request(graph, fusion="compiler")).json()
    response = client.post(f"/v1/plans/{plan['id']}/feedback", json={"timeline": measured_timeline(plan)})
    assert response.status_code == 201, response.text


def test_a_plan_answer_carries_its_lower_bound_and_optimality_gap(client):
    plan = client.post("/v1/plans", json=plan_request(diamond_graph("bounded"))).json()
    summary = plan["summary"]
    assert 0 < summary["lower_bound_s"] <= summary["makespan_s"]
    assert summary["optimality_gap"] == pytest.approx(summary["makespan_s"] / summary["lower_bound_s"] - 1)
    assert summary["lower_bound_by"] in summary["lower_bounds_s"]
    assert summary["exact"] is None


def test_strategy_exact_answers_with_the_solver_outcome(client):
    request = plan_request(diamond_graph("exact"))
    request["options"] = {"strategy": "exact", "time_limit_s": 2.0}
    response = client.post("/v1/plans", json=request)
    assert response.status_code == 201, response.text
    summary = response.json()["summary"]
    assert summary["exact"]["status"] in ("optimal", "feasible")
    # the solver times operators in main memory, as the candidates are scored
    assert summary["exact"]["bound_s"] <= summary["makespan_before_tiers_s"] * (1 + 1e-9)


def test_an_exact_time_limit_out_of_range_is_a_422(client):
    request = plan_request(diamond_graph("exact-limit"))
    request["options"] = {"strategy": "exact", "time_limit_s": 3600}
    response = client.post("/v1/plans", json=request)
    assert response.status_code == 422
    assert "time_limit_s" in response.text


def test_strategy_exact_with_a_long_time_limit_is_planned_as_a_job(client):
    request = plan_request(diamond_graph("exact-job"))
    request["options"] = {"strategy": "exact", "time_limit_s": 30.0}
    response = client.post("/v1/plans", json=request)
    assert response.status_code == 202, response.text
    assert response.json()["status"] == "queued"
