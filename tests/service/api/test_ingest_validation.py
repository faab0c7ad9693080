"""What a plan submission may hold: every field the forms do not have, every empty name,
every option of the wrong type is a 422 naming it, and an ONNX upload is sized before
anything of that size is built."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper
from sqlalchemy import func, select

from service.storage.models import Graph, Plan
from tests.service.graphs import diamond_graph, plan_request

ONNX_DIR = Path(__file__).resolve().parents[2] / "fixtures" / "onnx"
PRESET = {"preset": "dgx-h100", "nodes": 1}


def _problem(response, status: int = 422) -> dict:
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/problem+json")
    return response.json()


def _fields(body: dict) -> list[str]:
    return [error["field"] for error in body.get("errors") or []]


def _stored(session_factory, tenant_id: str) -> tuple[int, int]:
    with session_factory() as session:
        plans = session.scalar(select(func.count()).select_from(Plan).where(Plan.tenant_id == tenant_id))
        graphs = session.scalar(select(func.count()).select_from(Graph).where(Graph.tenant_id == tenant_id))
    return plans, graphs


def _upload(client, model: bytes, options: dict, inventory: dict = PRESET):
    return client.post(
        "/v1/plans",
        files={"model": ("model.onnx", model, "application/octet-stream")},
        data={"inventory": json.dumps(inventory), "options": json.dumps(options)},
    )


@pytest.mark.parametrize(
    ("mutate", "field"),
    [
        (lambda g: g["nodes"][1].update(flop=1e20), "nodes[1].flop"),
        (lambda g: g["tensors"][4].update(byte=1), "tensors[4].byte"),
        (lambda g: g.update(edges=[]), "edges"),
    ],
)
def test_a_field_the_graph_form_does_not_have_is_422_naming_it(client, session_factory, mutate, field):
    graph = diamond_graph()
    mutate(graph)
    body = _problem(client.post("/v1/plans", json=plan_request(graph)))
    assert body["type"].endswith("unknown-field")
    assert _fields(body) == [field]
    assert _stored(session_factory, client.tenant_id) == (0, 0)


def test_a_misspelt_node_field_is_answered_with_the_field_meant(client):
    graph = diamond_graph()
    graph["nodes"][1]["flop"] = graph["nodes"][1].pop("flops")
    body = _problem(client.post("/v1/plans", json=plan_request(graph)))
    assert 'did you mean "flops"?' in body["detail"]


@pytest.mark.parametrize(("section", "index"), [("nodes", 0), ("tensors", 0)])
def test_an_empty_name_is_422(client, session_factory, section, index):
    graph = diamond_graph()
    graph[section][index]["name"] = ""
    body = _problem(client.post("/v1/plans", json=plan_request(graph)))
    assert _fields(body) == [f"{section}[{index}].name"]
    assert _stored(session_factory, client.tenant_id) == (0, 0)


@pytest.mark.parametrize(
    ("option", "value"),
    [("pipeline", "yes"), ("pipeline", 1), ("micro_batches", "4"), ("micro_batches", 4.0), ("seed", "7"),
     ("max_devices", "8"), ("memory_headroom_fraction", "0.1")],
)  # fmt: skip
def test_an_option_of_the_wrong_type_is_422_not_coerced(client, session_factory, option, value):
    body = _problem(client.post("/v1/plans", json=plan_request(**{option: value})))
    assert _fields(body) == [f"body.options.{option}"]
    assert _stored(session_factory, client.tenant_id) == (0, 0)


def test_a_preset_node_count_given_as_text_is_422(client):
    request = plan_request()
    request["inventory"]["nodes"] = "2"
    body = _problem(client.post("/v1/plans", json=request))
    assert _fields(body)[0] == "body.inventory.PresetInventory.nodes"  # the form meant comes first


def test_an_onnx_upload_with_options_of_the_wrong_type_is_422_naming_them(client):
    model = (ONNX_DIR / "resnet50.onnx").read_bytes()
    body = _problem(_upload(client, model, {"dims": {"batch": "1"}, "pipeline": "yes"}))
    assert sorted(_fields(body)) == ["form.options.dims.batch", "form.options.pipeline"]


def test_gpt2_bound_to_a_sequence_of_a_hundred_million_is_422_naming_the_tensor_and_the_limit(client, session_factory):
    model = (ONNX_DIR / "gpt2.onnx").read_bytes()
    body = _problem(_upload(client, model, {"dims": {"batch": 1, "sequence": 100_000_000}}))
    assert body["type"].endswith("absurd-size")
    assert "[1, 12, 100000000, 100000000]" in body["detail"] and "byte limit" in body["detail"]
    assert _stored(session_factory, client.tenant_id) == (0, 0)


def test_an_onnx_range_over_ten_billion_elements_is_sized_and_found_too_large_for_one_gpu(client):
    start, limit, delta = (numpy_helper.from_array(np.array(v, dtype=np.int64), n) for n, v in
                           (("start", 0), ("limit", 10**10), ("delta", 1)))  # fmt: skip
    graph = helper.make_graph(
        [helper.make_node("Range", ["start", "limit", "delta"], ["r"], name="range"),
         helper.make_node("Cast", ["r"], ["y"], name="cast", to=TensorProto.FLOAT)],
        "range",
        [],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        initializer=[start, limit, delta],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()
    body = _problem(_upload(client, model, {}))  # a 200-byte upload; r and y are never built
    assert body["type"].endswith("does-not-fit") and body["title"] == "Does not fit"
    assert "needs 120.00 GB" in body["detail"]  # r: 10^10 int64, y: 10^10 float32, both live in the Cast


@pytest.fixture(scope="module")
def small_import_cap_client(database_url, session_factory):
    """A service whose ONNX imports may use 64 MiB over their worker's footprint."""
    from fastapi.testclient import TestClient

    from service.app import create_app
    from tests.conftest import TenantClient, make_settings, new_api_key

    settings = make_settings(database_url, onnx_import_memory_bytes=64 * 2**20)
    with TestClient(create_app(settings), raise_server_exceptions=False) as test_client:
        tenant_id, key = new_api_key(session_factory, settings)
        yield TenantClient(test_client, tenant_id, key)


def test_an_onnx_model_whose_import_needs_more_than_the_cap_is_a_4xx_and_the_server_plans_on(
    small_import_cap_client, session_factory
):
    from tests.service.domain.test_onnx_worker import rank_doubling_gather_chain

    client = small_import_cap_client
    response = _upload(client, rank_doubling_gather_chain(20), {})  # 531 bytes, about 220 MiB to import
    assert response.status_code in (413, 422), response.text  # 422 when ONNX died of running out
    body = _problem(response, response.status_code)
    assert body["type"].endswith(("import-memory", "import-crashed")) and _fields(body) == ["model"]
    assert "HYPERPLACE_ONNX_IMPORT_MEMORY_BYTES" in body["detail"]
    assert _stored(session_factory, client.tenant_id) == (0, 0)
    onnx_plan = _upload(client, (ONNX_DIR / "resnet50.onnx").read_bytes(), {"dims": {"batch": 1}})
    assert onnx_plan.status_code == 201, onnx_plan.text
    assert client.post("/v1/plans", json=plan_request()).status_code == 201


def test_an_onnx_import_whose_worker_dies_is_a_422_and_the_next_upload_is_planned(client, monkeypatch):
    from service.domain import onnx_worker
    from tests.service.domain.test_onnx_worker import _die_mid_import

    model = (ONNX_DIR / "resnet50.onnx").read_bytes()
    monkeypatch.setattr(onnx_worker, "_import_in_worker", _die_mid_import)
    body = _problem(_upload(client, model, {"dims": {"batch": 1}}))
    assert body["type"].endswith("import-crashed") and _fields(body) == ["model"]
    monkeypatch.undo()
    response = _upload(client, model, {"dims": {"batch": 1}})
    assert response.status_code == 201, response.text
