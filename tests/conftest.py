"""Shared fixtures: one real database per test session, apps and authenticated clients.

The suite runs twice (``make test``): once on SQLite (a temp file) and once on
the throwaway PostgreSQL that ``scripts/with-postgres.sh`` starts, selected by
``HYPERPLACE_TEST_POSTGRES_URL``. The schema always comes from the migrations.
Tests isolate themselves by tenant: each client fixture gets a fresh tenant and
key, so no test sees another's rows.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from hypothesis import settings as hypothesis_settings

from service.app import create_app
from service.settings import Settings
from service.storage.db import make_engine, make_session_factory
from service.storage.migrate import upgrade_to_head
from service.storage.tenants import get_or_create_tenant, issue_api_key

POSTGRES_URL = os.environ.get("HYPERPLACE_TEST_POSTGRES_URL")

# CI (.ci/run sets CI) replays the same property-test examples on every run, so a red build
# is a change's doing, not a new draw; a developer's runs draw new examples each time and
# keep the failures they find in .hypothesis/ until fixed.
hypothesis_settings.register_profile("ci", derandomize=True)
if os.environ.get("CI"):
    hypothesis_settings.load_profile("ci")

FIXTURES = Path(__file__).parent / "fixtures"


def pytest_report_header(config) -> str:
    return f"hyperplace database under test: {'postgresql' if POSTGRES_URL else 'sqlite'}"


def pytest_collection_modifyitems(config, items) -> None:
    if POSTGRES_URL:
        return
    skip = pytest.mark.skip(reason="needs PostgreSQL (runs in the PostgreSQL pass of make test)")
    for item in items:
        if "postgres_only" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def database_url(tmp_path_factory) -> str:
    url = POSTGRES_URL or f"sqlite:///{tmp_path_factory.mktemp('db') / 'hyperplace.sqlite3'}"
    engine = make_engine(url)
    upgrade_to_head(engine)
    engine.dispose()
    return url


@pytest.fixture(scope="session")
def dialect(database_url) -> str:
    return "postgresql" if database_url.startswith("postgresql") else "sqlite"


def make_settings(database_url: str, **overrides) -> Settings:
    values = dict(
        database_url=database_url,
        auth="required",
        embedded_worker=False,
        log_level="WARNING",
        api_key_secret="test-secret",
        max_body_bytes=8 * 1024 * 1024,
    )
    values.update(overrides)
    return Settings(**values)


@pytest.fixture(scope="session")
def settings(database_url) -> Settings:
    return make_settings(database_url)


@pytest.fixture(scope="session")
def app(settings):
    return create_app(settings)


@pytest.fixture(scope="session")
def session_factory(database_url):
    engine = make_engine(database_url)
    yield make_session_factory(engine)
    engine.dispose()


@pytest.fixture(scope="session")
def base_client(app) -> Iterator[TestClient]:
    with TestClient(app, raise_server_exceptions=False) as client:
        yield client


def new_api_key(
    session_factory, settings: Settings, scopes=("read", "write", "moe"), tenant_name: str | None = None
) -> tuple[str, str]:
    """A fresh tenant (unless named) and an API key for it: ``(tenant_id, key)``."""
    with session_factory() as session, session.begin():
        tenant = get_or_create_tenant(session, tenant_name or f"tenant-{uuid.uuid4().hex[:12]}")
        issued = issue_api_key(session, tenant, settings.api_key_secret, scopes=tuple(scopes))
    return issued.tenant_id, issued.api_key


class TenantClient:
    """A TestClient view that sends one tenant's key on every request."""

    def __init__(self, client: TestClient, tenant_id: str, api_key: str) -> None:
        self._client = client
        self.tenant_id = tenant_id
        self.api_key = api_key
        self.headers = {"Authorization": f"Bearer {api_key}"}

    def request(self, method: str, url: str, **kwargs):
        headers = {**self.headers, **kwargs.pop("headers", {})}
        return self._client.request(method, url, headers=headers, **kwargs)

    def get(self, url: str, **kwargs):
        return self.request("GET", url, **kwargs)

    def post(self, url: str, **kwargs):
        return self.request("POST", url, **kwargs)

    def delete(self, url: str, **kwargs):
        return self.request("DELETE", url, **kwargs)


@pytest.fixture
def client(base_client, session_factory, settings) -> TenantClient:
    tenant_id, key = new_api_key(session_factory, settings)
    return TenantClient(base_client, tenant_id, key)


@pytest.fixture
def other_client(base_client, session_factory, settings) -> TenantClient:
    tenant_id, key = new_api_key(session_factory, settings)
    return TenantClient(base_client, tenant_id, key)
