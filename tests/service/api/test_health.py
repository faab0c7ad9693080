"""Operations endpoints: liveness, readiness, metrics, docs."""

import pytest
from fastapi.testclient import TestClient

from service.app import create_app
from service.schemas.health import NotReady
from service.storage.db import make_engine, make_session_factory
from tests.conftest import make_settings, new_api_key


def test_healthz_answers_ok_without_a_key(base_client):
    response = base_client.get("/healthz")
    assert response.status_code == 200
    assert response.json() == {"status": "ok"}


@pytest.mark.parametrize("path", ["/healthz", "/readyz"])
def test_head_on_a_health_check_answers_200_without_a_body(base_client, path):
    get = base_client.get(path)
    head = base_client.head(path)
    assert head.status_code == 200 and head.content == b""
    assert head.headers["content-length"] == get.headers["content-length"]


def test_readyz_reports_the_migrated_revision(base_client, app):
    response = base_client.get("/readyz")
    assert response.status_code == 200
    assert response.json()["revision"] == app.state.head_revision


def test_metrics_count_requests_by_route_template_not_raw_path(client, base_client):
    client.get("/v1/plans/00000000-0000-0000-0000-00000000abcd")
    text = base_client.get("/metrics").text
    assert 'route="/v1/plans/{plan_id}"' in text
    assert "00000000abcd" not in text
    assert "hyperplace_http_request_duration_seconds_bucket" in text


def test_openapi_docs_are_served(base_client):
    assert base_client.get("/docs").status_code == 200
    assert "/v1/plans" in base_client.get("/openapi.json").json()["paths"]


def test_every_response_carries_a_request_id(base_client):
    response = base_client.get("/healthz", headers={"X-Request-ID": "trace-123"})
    assert response.headers["x-request-id"] == "trace-123"


def test_app_refuses_to_start_on_an_unmigrated_database(tmp_path):
    app = create_app(make_settings(f"sqlite:///{tmp_path / 'empty.sqlite3'}"))
    try:
        with TestClient(app):
            raise AssertionError("the app started on an unmigrated database")
    except RuntimeError as exc:
        assert "hyperplace migrate" in str(exc)


def test_auto_migrate_brings_a_new_database_to_head(tmp_path):
    app = create_app(make_settings(f"sqlite:///{tmp_path / 'new.sqlite3'}", auto_migrate=True))
    with TestClient(app) as client:
        assert client.get("/readyz").json()["status"] == "ready"


def test_docs_requests_are_labelled_by_their_path(base_client):
    base_client.get("/openapi.json")
    assert 'route="/openapi.json"' in base_client.get("/metrics").text


def test_readyz_on_an_unmigrated_database_is_a_503_saying_which_revision_it_needs(tmp_path):
    app = create_app(make_settings(f"sqlite:///{tmp_path / 'empty.sqlite3'}"))
    response = TestClient(app).get("/readyz")  # no lifespan: the app would refuse to start
    assert response.status_code == 503 and response.headers["Retry-After"] == "5"
    assert response.json() == {
        "status": "unavailable",
        "database": "not migrated",
        "revision": None,
        "head": app.state.head_revision,
    }
    NotReady.model_validate_json(response.content)


def test_readyz_on_an_unreachable_database_is_a_503_naming_only_the_error_class(tmp_path):
    app = create_app(make_settings(f"sqlite:///{tmp_path / 'no-such-directory' / 'db.sqlite3'}"))
    response = TestClient(app).get("/readyz")
    assert response.status_code == 503 and response.headers["Retry-After"] == "5"
    assert response.json() == {"status": "unavailable", "database": "unreachable", "detail": "OperationalError"}
    NotReady.model_validate_json(response.content)


def test_a_request_that_finds_every_database_connection_taken_is_503_with_retry_after_not_500(
    database_url, session_factory
):
    app = create_app(make_settings(database_url))
    # a pool of one connection, held by the test: the request waits 0.2 s for it, then gives up
    engine = make_engine(database_url, pool_size=1, max_overflow=0, pool_timeout=0.2)
    app.state.session_factory = make_session_factory(engine)
    _, key = new_api_key(session_factory, app.state.settings)
    try:
        with TestClient(app, raise_server_exceptions=False) as client, engine.connect():
            response = client.get(
                "/v1/plans/00000000-0000-0000-0000-000000000001", headers={"Authorization": f"Bearer {key}"}
            )
            assert client.get("/healthz").status_code == 200  # never touches the pool
    finally:
        engine.dispose()
    assert response.status_code == 503 and response.headers["retry-after"]
    assert response.headers["content-type"].startswith("application/problem+json")
    assert "database connection" in response.json()["detail"]
