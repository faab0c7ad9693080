"""The plan's ``schedule`` over HTTP: in every full answer, left out of summaries, null on older plans."""

from __future__ import annotations

from sqlalchemy import select

from partitioners.graph.generators import synthetic_graph_json
from partitioners.hardware.inventory import preset_inventory
from service.storage.blobs import pack_json, unpack_json
from service.storage.models import Plan
from tests.service.graphs import plan_request
from tests.service.schedule_check import GraphShape, violations


def _capacities(inventory) -> dict[tuple[str, str], float]:
    return {
        (str(name), tier): float(inventory.tier_capacity_bytes[d, k])
        for d, name in enumerate(inventory.device_names.tolist())
        for k, tier in enumerate(inventory.tier_names)
    }


def test_a_created_plans_schedule_replays_against_the_posted_graph(client):
    graph = synthetic_graph_json(200, lanes=6, seed=4)
    response = client.post("/v1/plans", json=plan_request(graph, nodes=2, strategy="metis"))
    assert response.status_code == 201, response.text
    plan = response.json()
    assert len(set(plan["ops"].values())) > 1
    assert plan["schedule"]["transfers"], "a plan over two devices moves tensors"
    assert violations(plan, GraphShape.of_json(graph), _capacities(preset_inventory("dgx-h100", 2))) == []


def test_a_read_plan_has_the_schedule_it_was_answered_with_and_a_summary_has_none(client):
    created = client.post("/v1/plans", json=plan_request(synthetic_graph_json(50, seed=8))).json()
    full = client.get(f"/v1/plans/{created['id']}").json()
    summary = client.get(f"/v1/plans/{created['id']}", params={"detail": "summary"}).json()
    assert full["schedule"] == created["schedule"]
    assert "schedule" not in summary and "ops" not in summary


def test_a_micro_batched_plan_tags_each_operator_with_its_micro_batch(client):
    plan = client.post("/v1/plans", json=plan_request(synthetic_graph_json(30, seed=5), micro_batches=3)).json()
    entries = [entry for device in plan["schedule"]["devices"] for entry in device["ops"]]
    assert sorted({entry["micro_batch"] for entry in entries}) == [0, 1, 2]
    assert len(entries) == len(plan["ops"]) == 90


def test_a_plan_stored_before_plans_carried_a_schedule_is_served_with_schedule_null(client, session_factory):
    created = client.post("/v1/plans", json=plan_request(synthetic_graph_json(20, seed=9))).json()
    with session_factory() as session, session.begin():
        row = session.scalars(select(Plan).where(Plan.id == created["id"])).one()
        body = unpack_json(row.result)
        del body["schedule"]
        row.result = pack_json(body)
    response = client.get(f"/v1/plans/{created['id']}")
    assert response.status_code == 200
    assert response.json()["schedule"] is None and response.json()["ops"] == created["ops"]
