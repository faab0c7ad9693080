"""``options.cost_model``, node ``time_s`` and per-device cost models through ``POST /v1/plans``."""

from __future__ import annotations

import copy

import numpy as np

from partitioners.costmodel.profiles import cost_model_spec_from_json
from partitioners.graph.canonical import canonical_graph
from partitioners.graph.generators import synthetic_graph_json
from partitioners.graph.json_import import graph_from_json
from partitioners.hardware.inventory import preset_inventory
from partitioners.placement.engine import PlacementOptions, place
from tests.service.graphs import diamond_graph, plan_request


def test_summary_echoes_the_profile_and_parameters_that_timed_the_plan(client):
    response = client.post(
        "/v1/plans",
        json=plan_request(diamond_graph("echo"), cost_model={"profile": "roofline", "link_efficiency": 0.9}),
    )
    assert response.status_code == 201, response.text
    echoed = response.json()["summary"]["cost_model"]
    assert echoed["profile"] == "roofline" and echoed["link_efficiency"] == 0.9 and echoed["launch_overhead_s"] == 0.0


def test_a_profile_name_alone_is_enough(client):
    plan = client.post("/v1/plans", json=plan_request(diamond_graph("by-name"), cost_model="cuda-graphs")).json()
    assert plan["summary"]["cost_model"]["profile"] == "cuda-graphs"


def test_a_plan_without_a_cost_model_is_timed_by_the_eager_profile_from_one_host(client):
    echoed = client.post("/v1/plans", json=plan_request(diamond_graph("default"))).json()["summary"]["cost_model"]
    assert (echoed["profile"], echoed["launch"]) == ("eager", "single-controller")


def test_another_cost_model_is_another_cache_entry(client):
    first = client.post("/v1/plans", json=plan_request(diamond_graph("cm-cache"))).json()
    second = client.post("/v1/plans", json=plan_request(diamond_graph("cm-cache"), cost_model="roofline"))
    assert second.status_code == 201 and second.json()["id"] != first["id"]


def test_the_default_profile_named_or_left_out_is_the_same_cache_entry(client):
    first = client.post("/v1/plans", json=plan_request(diamond_graph("cm-same"))).json()
    second = client.post("/v1/plans", json=plan_request(diamond_graph("cm-same"), cost_model={"profile": "eager"}))
    assert second.status_code == 200 and second.json()["id"] == first["id"]


def test_an_unknown_profile_is_a_422_naming_the_field(client):
    response = client.post("/v1/plans", json=plan_request(diamond_graph("bad-profile"), cost_model="tpu-magic"))
    assert response.status_code == 422
    assert any(e["field"].startswith("body.options.cost_model.profile") for e in response.json()["errors"])


def test_a_negative_launch_overhead_is_a_422_naming_the_field(client):
    response = client.post(
        "/v1/plans", json=plan_request(diamond_graph("bad-launch"), cost_model={"launch_overhead_s": -1e-6})
    )
    assert response.status_code == 422
    assert any(e["field"] == "body.options.cost_model.launch_overhead_s" for e in response.json()["errors"])


def test_node_times_are_counted_in_the_summary(client):
    graph = copy.deepcopy(diamond_graph("timed"))
    graph["nodes"][0]["time_s"] = 1e-3
    graph["nodes"][1]["time_s"] = {"H100-SXM5-80GB": 2e-3, "A100-SXM4-80GB": 3e-3}
    summary = client.post("/v1/plans", json=plan_request(graph)).json()["summary"]
    n_ops = len(graph["nodes"])
    assert summary["cost_sources"] == {"node_time_s": 2, "calibration": 0, "roofline": n_ops - 2}


def test_a_device_cost_model_in_the_inventory_times_that_device(client):
    device = {
        "name": "gpu0",
        "type": "gpu",
        "peak_flops": 1e15,
        "memory_tiers": [{"name": "hbm", "capacity_bytes": 8e10, "bandwidth_bytes_per_s": 3e12}],
        "cost_model": {"launch_overhead_s": 1e-3},
    }
    inventory = {"name": "one", "groups": [{"name": "g", "devices": [device], "link": {"bandwidth_bytes_per_s": 1e11}}]}
    body = {"graph": diamond_graph("slow-launch"), "inventory": inventory, "options": {"cost_model": "roofline"}}
    summary = client.post("/v1/plans", json=body).json()["summary"]
    n_ops = len(diamond_graph()["nodes"])
    assert summary["makespan_s"] >= n_ops * 1e-3
    assert summary["cost_model"]["device_overrides"] == {"gpu0": {"launch_overhead_s": 1e-3}}


def test_a_roofline_plan_through_the_api_has_the_figures_and_schedule_of_the_engine_in_process(client):
    graph = synthetic_graph_json(200, seed=4)
    answer = client.post("/v1/plans", json=plan_request(graph, cost_model="roofline", micro_batches=2)).json()
    options = PlacementOptions(micro_batches=2, cost_model=cost_model_spec_from_json("roofline"))
    local = place(canonical_graph(graph_from_json(graph)), preset_inventory("dgx-h100"), options)
    assert answer["summary"]["makespan_s"] == local.makespan_s
    assert answer["strategy"] == local.strategy
    names = local.graph.op_names
    for row in answer["schedule"]["devices"]:
        device = int(np.flatnonzero(preset_inventory("dgx-h100").device_names == row["device"])[0])
        mine = np.flatnonzero(local.simulation.op_device == device)
        order = mine[np.lexsort((mine, local.simulation.op_start_s[mine]))]
        assert [entry["op"] for entry in row["ops"]] == names[order].tolist()
