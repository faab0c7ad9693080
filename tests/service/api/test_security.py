"""Security: tenants never see each other, every route needs a key with its one scope,
keys live only as HMACs and can be revoked from the CLI, error bodies leak nothing,
and request ids tie responses to log lines.

The route-by-route tests walk the OpenAPI schema at test time, so a route added
later is covered (or fails loudly until its path parameter has an owner object).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import re
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select
from sqlalchemy.exc import ProgrammingError

from service.app import create_app
from service.storage import plans as plans_repo
from service.storage.models import ApiKey
from service.storage.tenants import get_tenant_by_name
from tests.conftest import TenantClient, make_settings, new_api_key
from tests.service.graphs import diamond_graph, measured_timeline, plan_request
from tests.service.live_server import start_server, wait_until

REPO = Path(__file__).parents[3]
SCOPES = ("read", "write", "moe")


def _operations(app) -> list[tuple[str, str, list[str]]]:
    """(method, path, path parameters) of every /v1 operation the schema lists."""
    document = app.openapi()
    out = []
    for path, operations in document["paths"].items():
        if not path.startswith("/v1/"):
            continue
        for method, operation in operations.items():
            params = [p["name"] for p in operation.get("parameters", []) if p["in"] == "path"]
            out.append((method.upper(), path, params))
    return out


def _owned_objects(client: TenantClient) -> dict[str, str]:
    """One object of every kind a path parameter can name, owned by ``client``'s tenant."""
    plan = client.post("/v1/plans", json=plan_request(diamond_graph(f"private-{uuid.uuid4().hex[:8]}"))).json()
    deployment = f"private-{uuid.uuid4().hex[:8]}"
    moe = {
        "deployment": deployment,
        "model": {"num_moe_layers": 1, "num_logical_experts": 4},
        "cluster": {"num_nodes": 1, "gpus_per_node": 2, "slots_per_gpu": 3},
        "load": [[1.0, 2.0, 3.0, 4.0]],
    }
    assert client.post("/v1/moe/rebalance", json=moe).status_code == 200
    objects = {
        "plan_id": plan["id"],
        "model_hash": plan["model_hash"],
        "name": deployment,
        "inventory_hash": plan["inventory_hash"],
    }
    feedback = client.post(f"/v1/plans/{plan['id']}/feedback", json={"timeline": measured_timeline(plan)})
    if feedback.status_code == 201:
        objects["feedback_id"] = feedback.json()["id"]
    return objects


#: Valid bodies for the POST routes under an object, so a 404 is about the object, not the body.
BODIES_BY_SUFFIX = {
    "feedback": {"timeline": {"ops": [{"name": "a", "start_s": 0.0, "duration_s": 1e-3}]}},
    "replan": {},
    "applied": {"placement_version": 1},
}


def _body_for(path: str) -> dict | None:
    return next((body for suffix, body in BODIES_BY_SUFFIX.items() if path.endswith(suffix)), None)


@pytest.fixture
def owner_objects(client) -> dict[str, str]:
    return _owned_objects(client)


def test_another_tenants_objects_are_404_on_every_route_and_absent_from_every_list(
    app, client, other_client, owner_objects
):
    secrets = set(owner_objects.values())
    checked = []
    for method, path, params in _operations(app):
        if not params:
            continue
        missing = [p for p in params if p not in owner_objects]
        assert not missing, f"{method} {path}: no owned object for {missing}; extend _owned_objects"
        url = path.format(**owner_objects)
        if method == "GET":
            assert client.get(url).status_code in (200, 404), f"owner: {method} {url}"
        response = (
            other_client.request(method, url, json=_body_for(path))
            if method == "POST"
            else other_client.request(method, url)
        )
        listing = response.status_code == 200 and response.json().get("items") == []
        assert response.status_code == 404 or listing, (
            f"{method} {path} answered {response.status_code} to another tenant"
        )
        assert not any(secret in response.text for secret in secrets if secret not in url), (
            f"{method} {path} leaked an id"
        )
        checked.append(f"{method} {path}")
    assert (
        client.get(f"/v1/plans/{owner_objects['plan_id']}").status_code == 200
    )  # DELETE by the other tenant did nothing
    assert client.get(f"/v1/moe/deployments/{owner_objects['name']}").status_code == 200
    assert len(checked) >= 10


def test_the_owner_can_read_what_the_other_tenant_cannot(client, other_client, owner_objects):
    """The 404s above are isolation, not broken paths: the same reads work for the owner."""
    for url in (
        f"/v1/plans/{owner_objects['plan_id']}",
        f"/v1/models/{owner_objects['model_hash']}",
        f"/v1/moe/deployments/{owner_objects['name']}",
    ):
        assert client.get(url).status_code == 200, url
        assert other_client.get(url).status_code == 404, url


def test_a_deployment_name_is_per_tenant(client, other_client):
    """Two tenants may use the same deployment name; each sees only its own history."""
    moe = {
        "deployment": "shared-name",
        "model": {"num_moe_layers": 1, "num_logical_experts": 4},
        "cluster": {"num_nodes": 1, "gpus_per_node": 2, "slots_per_gpu": 3},
        "load": [[1.0, 2.0, 3.0, 4.0]],
    }
    assert client.post("/v1/moe/rebalance", json=moe).json()["version"] == 1
    assert other_client.post("/v1/moe/rebalance", json=moe).json()["version"] == 1
    assert client.get("/v1/moe/deployments/shared-name").json()["current_version"] == 1


def test_every_v1_route_needs_a_key(app, base_client):
    for method, path, params in _operations(app):
        url = path.format(
            **{p: "00000000-0000-0000-0000-000000000000" if p != "model_hash" else "a" * 64 for p in params}
        )
        response = base_client.request(method, url, json={} if method == "POST" else None)
        assert response.status_code == 401, f"{method} {path} answered {response.status_code} without a key"


def test_every_v1_route_needs_exactly_its_one_scope(app, base_client, session_factory, settings):
    keys = {scope: new_api_key(session_factory, settings, scopes=(scope,))[1] for scope in SCOPES}
    for method, path, params in _operations(app):
        url = path.format(
            **{p: "00000000-0000-0000-0000-000000000000" if p != "model_hash" else "a" * 64 for p in params}
        )
        allowed = []
        for scope, key in keys.items():
            response = base_client.request(
                method, url, json={} if method == "POST" else None, headers={"Authorization": f"Bearer {key}"}
            )
            assert response.status_code != 401, f"{method} {path} with a '{scope}' key"
            if response.status_code != 403:
                allowed.append(scope)
        assert len(allowed) == 1, f"{method} {path} accepts scopes {allowed}"


@pytest.mark.parametrize(
    ("method", "path", "scope"),
    [
        ("POST", "/v1/plans", "write"),
        ("GET", "/v1/plans/x", "read"),
        ("DELETE", "/v1/plans/x", "write"),
        ("POST", "/v1/moe/rebalance", "moe"),
    ],
)
def test_the_documented_scope_of_a_route(base_client, session_factory, settings, method, path, scope):
    for other in SCOPES:
        key = new_api_key(session_factory, settings, scopes=(other,))[1]
        response = base_client.request(
            method, path, json={} if method == "POST" else None, headers={"Authorization": f"Bearer {key}"}
        )
        assert (response.status_code == 403) == (other != scope), (other, response.status_code)


def test_a_stored_key_hash_is_the_hmac_of_the_key_under_the_secret(session_factory, settings):
    tenant_id, key = new_api_key(session_factory, settings)
    with session_factory() as session:
        row = session.scalar(select(ApiKey).where(ApiKey.tenant_id == tenant_id))
    assert row.key_hash == hmac.new(settings.api_key_secret.encode(), key.encode(), hashlib.sha256).hexdigest()
    assert row.key_hash != hashlib.sha256(key.encode()).hexdigest()  # a bare hash would be guessable offline


def test_a_key_table_read_with_another_secret_authenticates_nobody(database_url, session_factory, settings):
    _, key = new_api_key(session_factory, settings)
    other_secret = create_app(make_settings(database_url, api_key_secret="a-different-secret"))
    with TestClient(other_secret, raise_server_exceptions=False) as client:
        assert client.get("/v1/plans/x", headers={"Authorization": f"Bearer {key}"}).status_code == 401


def _cli(database_url: str, *args: str) -> subprocess.CompletedProcess:
    env = dict(
        os.environ,
        HYPERPLACE_DATABASE_URL=database_url,
        HYPERPLACE_API_KEY_SECRET="test-secret",
        HYPERPLACE_LOG_LEVEL="WARNING",
    )
    return subprocess.run(
        [sys.executable, "-m", "service.cli", *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=120
    )


def test_a_key_revoked_with_the_cli_gets_401(base_client, database_url):
    tenant = f"cli-{uuid.uuid4().hex[:8]}"
    created = _cli(database_url, "keys", "create", "--tenant", tenant, "--scopes", "read")
    assert created.returncode == 0, created.stderr
    key = created.stdout.strip().splitlines()[-1]
    headers = {"Authorization": f"Bearer {key}"}
    assert base_client.get("/v1/plans/x", headers=headers).status_code == 404
    listed = _cli(database_url, "keys", "list", "--tenant", tenant)
    assert key not in listed.stdout  # listing shows prefixes, never keys
    key_id = listed.stdout.split()[0]
    assert _cli(database_url, "keys", "revoke", key_id).returncode == 0
    assert base_client.get("/v1/plans/x", headers=headers).status_code == 401
    assert "revoked" in _cli(database_url, "keys", "list", "--tenant", tenant).stdout


def test_listing_the_keys_of_an_unknown_tenant_says_so_and_creates_no_tenant(database_url, session_factory):
    tenant = f"nobody-{uuid.uuid4().hex[:8]}"
    listed = _cli(database_url, "keys", "list", "--tenant", tenant)
    assert listed.returncode == 1 and f"no tenant named {tenant}" in listed.stderr
    with session_factory() as session:
        assert get_tenant_by_name(session, tenant) is None


@pytest.fixture
def leaky_client(app, client, monkeypatch):
    """The plan repository fails with database and Python errors that carry SQL and paths."""

    def fail(*_args, **_kwargs):
        raise ProgrammingError(
            "SELECT secret_column FROM plans WHERE tenant_id = 'x'", {}, Exception('relation "plans" does not exist')
        )

    monkeypatch.setattr(plans_repo, "get_plan", fail)
    return client


def test_a_database_error_body_holds_no_sql_and_no_trace(leaky_client):
    response = leaky_client.get("/v1/plans/some-plan")
    assert response.status_code == 500
    assert response.headers["content-type"].startswith("application/problem+json")
    for leak in ("SELECT", "secret_column", "relation", "Traceback", 'File "', ".py", "psycopg", "sqlalchemy"):
        assert leak not in response.text, leak
    assert response.json()["instance"] == f"urn:request:{response.headers['x-request-id']}"


def test_an_unexpected_error_body_holds_no_trace(client, monkeypatch):
    def boom(*_args, **_kwargs):
        raise RuntimeError("internal detail /work/main/service/secret.py line 12")

    monkeypatch.setattr(plans_repo, "get_plan", boom)
    response = client.get("/v1/plans/some-plan")
    assert response.status_code == 500
    assert (
        "internal detail" not in response.text and "secret.py" not in response.text and "Traceback" not in response.text
    )


@pytest.fixture(scope="module")
def logged_server(database_url, tmp_path_factory):
    live = start_server(database_url, tmp_path_factory.mktemp("security") / "server.log", log_level="INFO")
    yield live
    live.stop()


def _log_lines(server) -> list[dict]:
    lines = []
    for raw in server.logs().splitlines():
        try:
            lines.append(json.loads(raw))
        except json.JSONDecodeError:
            continue
    return lines


def test_a_request_id_is_answered_and_logged_with_the_request(logged_server, session_factory, settings):
    tenant_id, key = new_api_key(session_factory, settings)
    with logged_server.client(key) as client:
        response = client.get("/v1/plans/no-such-plan", headers={"X-Request-ID": "trace-abc-123"})
    assert response.headers["x-request-id"] == "trace-abc-123"
    assert response.json()["instance"] == "urn:request:trace-abc-123"
    # The line is written once the response has gone out: wait for it.
    logged = wait_until(
        lambda: [line for line in _log_lines(logged_server) if line.get("request_id") == "trace-abc-123"], timeout_s=30
    )
    assert logged[-1]["status"] == 404 and logged[-1]["route"] == "/v1/plans/{plan_id}"
    assert logged[-1]["tenant"] == tenant_id


def test_a_request_without_an_id_gets_a_fresh_one_in_the_answer_and_the_log(logged_server, session_factory, settings):
    _, key = new_api_key(session_factory, settings)
    with logged_server.client(key) as client:
        response = client.get("/v1/plans/no-such-plan-either")
    request_id = response.headers["x-request-id"]
    assert re.fullmatch(r"[0-9a-f]{32}", request_id)
    wait_until(lambda: any(line.get("request_id") == request_id for line in _log_lines(logged_server)), timeout_s=30)


def test_a_request_id_cannot_inject_log_lines(logged_server):
    response = __import__("httpx").get(f"{logged_server.base_url}/healthz", headers={"X-Request-ID": 'x" injected=1 {'})
    assert response.headers["x-request-id"] != 'x" injected=1 {'
    assert re.fullmatch(r"[0-9a-f]{32}", response.headers["x-request-id"])


def test_keys_never_reach_the_logs(logged_server, session_factory, settings):
    _, key = new_api_key(session_factory, settings)
    with logged_server.client(key) as client:
        client.post("/v1/plans", json=plan_request(diamond_graph("logged")))
        client.get("/v1/plans/x")
    with logged_server.client("hp_wrong_" + key[-20:]) as client:
        client.get("/v1/plans/x", headers={"X-Request-ID": "last-of-the-key-test"})
    wait_until(lambda: "last-of-the-key-test" in logged_server.logs(), timeout_s=30)
    logs = logged_server.logs()
    assert key not in logs and key[-20:] not in logs
