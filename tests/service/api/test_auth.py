"""API keys, scopes and tenant isolation: another tenant's objects are 404, never 403."""

from __future__ import annotations

from service.storage.tenants import revoke_api_key
from tests.conftest import TenantClient, new_api_key
from tests.service.graphs import diamond_graph, plan_request


def test_a_request_without_a_key_is_401_problem_json(base_client):
    response = base_client.get("/v1/plans/some-id")
    assert response.status_code == 401
    assert response.headers["content-type"].startswith("application/problem+json")
    assert response.headers["www-authenticate"] == "Bearer"
    assert "Authorization: Bearer" in response.json()["detail"]


def test_an_unknown_key_is_401(base_client):
    response = base_client.get("/v1/plans/some-id", headers={"Authorization": "Bearer hp_nope_nope"})
    assert response.status_code == 401


def test_a_revoked_key_stops_working(base_client, session_factory, settings):
    tenant_id, key = new_api_key(session_factory, settings)
    client = TenantClient(base_client, tenant_id, key)
    assert client.get("/v1/plans/unknown").status_code == 404
    from sqlalchemy import select

    from service.storage.models import ApiKey

    with session_factory() as session, session.begin():
        key_id = session.scalar(select(ApiKey.id).where(ApiKey.tenant_id == tenant_id))
        revoke_api_key(session, key_id)
    assert client.get("/v1/plans/unknown").status_code == 401


def test_keys_are_stored_only_as_hmac_hashes(session_factory, settings):
    from sqlalchemy import select

    from service.storage.models import ApiKey

    tenant_id, key = new_api_key(session_factory, settings)
    with session_factory() as session:
        row = session.scalar(select(ApiKey).where(ApiKey.tenant_id == tenant_id))
    assert key not in (row.key_hash, row.prefix, row.name)
    secret_part = key.split("_", 2)[2]  # token_urlsafe may itself contain "_"
    assert len(row.key_hash) == 64 and secret_part not in row.key_hash


def test_a_read_only_key_cannot_submit_plans(base_client, session_factory, settings):
    tenant_id, key = new_api_key(session_factory, settings, scopes=("read",))
    response = TenantClient(base_client, tenant_id, key).post("/v1/plans", json=plan_request())
    assert response.status_code == 403


def test_another_tenants_plan_is_404_and_absent_from_lists(client, other_client):
    plan = client.post("/v1/plans", json=plan_request(diamond_graph("private"))).json()
    for path in (
        f"/v1/plans/{plan['id']}",
        f"/v1/plans/{plan['id']}/trace",
        f"/v1/plans/{plan['id']}/view",
        f"/v1/models/{plan['model_hash']}",
    ):
        response = other_client.get(path)
        assert response.status_code == 404, path
    assert other_client.get(f"/v1/models/{plan['model_hash']}/plans").json()["items"] == []
    assert other_client.delete(f"/v1/plans/{plan['id']}").status_code == 404
    assert client.get(f"/v1/plans/{plan['id']}").status_code == 200


def test_another_tenants_graph_id_cannot_be_planned(client, other_client):
    plan = client.post("/v1/plans", json=plan_request(diamond_graph("graph-id-private"))).json()
    graph_id = client.get(f"/v1/models/{plan['model_hash']}").json()["id"]
    response = other_client.post("/v1/plans", json={"graph_id": graph_id, "inventory": {"preset": "dgx-h100"}})
    assert response.status_code == 404


def test_the_same_model_in_two_tenants_gives_two_independent_plans(client, other_client):
    mine = client.post("/v1/plans", json=plan_request(diamond_graph("shared-model")))
    theirs = other_client.post("/v1/plans", json=plan_request(diamond_graph("shared-model")))
    assert mine.status_code == theirs.status_code == 201
    assert mine.json()["id"] != theirs.json()["id"]
