"""POST /v1/plans honours each node's ``device_types``, and refuses types the cluster lacks."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import func, select

from service.app import create_app
from service.storage.models import Plan
from tests.conftest import TenantClient, make_settings, new_api_key


def _device(name: str, device_type: str, peak_flops: float) -> dict:
    return {
        "name": name,
        "type": device_type,
        "peak_flops": peak_flops,
        "memory_tiers": [{"name": "HBM", "capacity_bytes": 8e10, "bandwidth_bytes_per_s": 2e12}],
    }


FAST_FAST_SLOW = {
    "name": "mixed",
    "groups": [
        {
            "name": "node",
            "devices": [_device("fast0", "fast", 1e15), _device("fast1", "fast", 1e15), _device("s", "slow", 1e13)],
            "link": {"bandwidth_bytes_per_s": 1e11, "latency_s": 1e-6},
        }
    ],
}


def eight_ops(device_types: list[str], name: str = "eight-slow-ops") -> dict:
    """The user's reproduction: eight independent operators that may run only on ``device_types``."""
    return {
        "name": name,
        "nodes": [
            {
                "name": f"op{i}",
                "op": "MatMul",
                "inputs": ["x"],
                "outputs": [f"y{i}"],
                "flops": 1e12,
                "device_types": device_types,
            }
            for i in range(8)
        ],
        "tensors": [{"name": "x", "bytes": 1e6}] + [{"name": f"y{i}", "bytes": 1e6} for i in range(8)],
    }


def _problem(response, status: int) -> dict:
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/problem+json")
    return response.json()


def test_a_plan_puts_operators_only_on_devices_of_their_types(client):
    response = client.post("/v1/plans", json={"graph": eight_ops(["slow"]), "inventory": FAST_FAST_SLOW, "options": {}})
    assert response.status_code == 201, response.text
    plan = response.json()
    assert plan["ops"] == {f"op{i}": "s" for i in range(8)}
    # predicted on that placement: 8 x 1 TFLOP in turn on the 10 TFLOP/s device takes at least 0.8 s
    assert plan["summary"]["makespan_s"] >= 0.8
    assert set(plan["summary"]["peak_memory_bytes"]) == {"s"}


def test_an_operator_whose_types_no_device_has_is_422_naming_it_and_the_type(client):
    body = _problem(
        client.post("/v1/plans", json={"graph": eight_ops(["tpu-v5"]), "inventory": FAST_FAST_SLOW, "options": {}}),
        422,
    )
    assert "'op0'" in body["detail"] and "tpu-v5" in body["detail"]
    assert body["type"].endswith("no-device-of-type")


@pytest.fixture(scope="module")
def queueing_client(database_url):
    """A service that queues every graph as a job (``sync_max_ops=0``)."""
    job_settings = make_settings(database_url, sync_max_ops=0)
    with TestClient(create_app(job_settings), raise_server_exceptions=False) as client:
        yield client, job_settings


def test_a_graph_that_would_be_queued_is_refused_at_once_when_its_types_match_no_device(
    queueing_client, session_factory
):
    client, job_settings = queueing_client
    tenant_id, key = new_api_key(session_factory, job_settings)
    tenant = TenantClient(client, tenant_id, key)
    graph = eight_ops(["tpu-v5"], name="queued-types")
    _problem(tenant.post("/v1/plans", json={"graph": graph, "inventory": FAST_FAST_SLOW, "options": {}}), 422)
    with session_factory() as session:
        assert session.scalar(select(func.count()).select_from(Plan).where(Plan.tenant_id == tenant_id)) == 0
