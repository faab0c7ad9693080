"""Every route says what it answers, and its answers are what it says.

1. Walking ``app.routes``: a route answering JSON declares a ``response_model`` (a
   pydantic model, or a list of them), or a model in ``responses`` for its success
   status; a route answering something else (HTML, Prometheus text) declares that
   content in ``responses``; only a 204 declares nothing. The published OpenAPI document
   then gives every success answer a schema with properties or a ``$ref``.
2. Answers go through their models. FastAPI validates what a handler returns against
   its ``response_model`` before it sends it (``/healthz``, ``/readyz``, the MoE
   deployment read, ...). ``POST /v1/moe/rebalance`` is the exception, on purpose: its
   answer grows to 192 MB at ``HYPERPLACE_MOE_MAX_SLOTS`` and is written straight by
   pydantic-core (``service.api.json_response``); validating it as well cost 1.2x-5.8x
   the encoding (8 ms on DeepSeek-V3's shape, 375 ms on 128 layers x 2,048 experts)
   and a second copy of it in memory. Its answers are validated here instead, in every
   form the service gives them, against the model that forbids undeclared fields; and
   schemathesis checks each fuzzed answer against the published schema
   (``test_fuzz_openapi``).
"""

from __future__ import annotations

import typing

import pytest
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute, iter_route_contexts
from pydantic import BaseModel, Field

from service.app import create_app
from service.schemas.moe import MoeDeploymentRead, MoeRebalanceResponse
from tests.conftest import make_settings


def _app():
    return create_app(make_settings("sqlite:///:memory:"))  # building the routes touches no database


def _routes() -> list[tuple[str, str, APIRoute]]:
    """(method, full path, route) of every documented operation, routers included at any depth."""
    found = []
    for context in iter_route_contexts(_app().routes):
        route = context.original_route
        if isinstance(route, APIRoute) and route.include_in_schema:
            found.extend((method, context.path, route) for method in sorted(route.methods))
    return found


def _is_model(annotation) -> bool:
    """A pydantic model, or a list / union of them (``None`` allowed in a union), ``Annotated`` or not."""
    if isinstance(annotation, type):
        return issubclass(annotation, BaseModel)
    if typing.get_origin(annotation) is typing.Annotated:  # e.g. a union with a discriminator
        return _is_model(typing.get_args(annotation)[0])
    args = [arg for arg in typing.get_args(annotation) if arg is not type(None)]
    return (
        typing.get_origin(annotation) in (list, typing.Union, type(int | None))
        and bool(args)
        and all(_is_model(arg) for arg in args)
    )


def _answers_json(route: APIRoute) -> bool:
    response_class = getattr(route.response_class, "value", route.response_class)  # DefaultPlaceholder
    return issubclass(response_class, JSONResponse)


def _declares_its_answer(route: APIRoute) -> bool:
    status = route.status_code or 200
    if status == 204:
        return True
    success = route.responses.get(status) or route.responses.get(str(status)) or {}
    if _is_model(success.get("model")):
        return True
    if _answers_json(route):
        return _is_model(route.response_model)
    return bool(success.get("content")) and all("schema" in media for media in success["content"].values())


def test_every_route_declares_what_it_answers():
    undeclared = {(method, path) for method, path, route in _routes() if not _declares_its_answer(route)}
    assert undeclared == set(), "declare a response_model (or responses= for non-JSON)"


def _describes(schema: dict) -> bool:
    """A schema that says what is in the answer: a model, properties, items, or a union of those."""
    options = schema.get("oneOf") or schema.get("anyOf")
    if options:
        return all(_describes(option) for option in options)
    return "$ref" in schema or "properties" in schema or "items" in schema


def test_the_published_schema_describes_every_success_answer():
    document = _app().openapi()
    vague = set()
    for path, operations in document["paths"].items():
        for method, operation in operations.items():
            for status, response in operation["responses"].items():
                for media_type, content in (response.get("content") or {}).items() if status.startswith("2") else ():
                    if media_type.endswith("json") and not _describes(content.get("schema", {})):
                        vague.add((method.upper(), path))
    assert vague == set(), vague


def test_the_contract_test_sees_through_included_routers():
    paths = {(method, path) for method, path, _ in _routes()}
    assert {
        ("GET", "/healthz"),
        ("POST", "/v1/moe/rebalance"),
        ("GET", "/v1/moe/deployments/{name}"),
        ("DELETE", "/v1/plans/{plan_id}"),
    } <= paths


@pytest.mark.parametrize(
    ("annotation", "is_model"),
    [
        (MoeRebalanceResponse, True),
        (list[MoeRebalanceResponse], True),
        (MoeRebalanceResponse | None, True),
        (typing.Annotated[MoeRebalanceResponse | MoeDeploymentRead, Field(discriminator="name")], True),
        (dict, False),
        (dict[str, str], False),
        (None, False),
        (list[dict], False),
        (MoeRebalanceResponse | dict, False),
    ],
)
def test_only_pydantic_models_count_as_a_declared_answer(annotation, is_model):
    assert _is_model(annotation) is is_model


# ----------------------------------------------------------------------------- MoE answers, validated


def _checked(model: type[BaseModel], response) -> BaseModel:
    """The answer read strictly by its model: no undeclared field, and nothing the model would change."""
    assert response.status_code == 200, response.text
    parsed = model.model_validate_json(response.content)
    assert parsed.model_dump(mode="json", exclude_unset=True) == response.json()
    return parsed


UAT = {
    "model": {"num_moe_layers": 2, "num_logical_experts": 8, "expert_bytes": 44040192},
    "cluster": {"num_nodes": 1, "gpus_per_node": 4, "slots_per_gpu": 3},
    "load": [[900, 80, 70, 60, 50, 40, 30, 20], [10, 20, 30, 40, 50, 60, 70, 800]],
}


@pytest.mark.parametrize(
    "request_body",
    [
        pytest.param(UAT, id="fresh"),
        pytest.param(
            {**UAT, "cluster": {**UAT["cluster"], "unavailable_gpus": [1]}, "node_local": True}, id="failed-gpu"
        ),
        pytest.param({**UAT, "current_placement": {"physical_to_logical": [[0] * 12] * 2}}, id="unhosted-experts"),
        pytest.param({**UAT, "current_placement": {"physical_to_logical": [[-1] * 12] * 2}}, id="all-empty"),
        pytest.param(
            {
                **UAT,
                "current_placement": {"physical_to_logical": [list(range(8)) + [0, 1, 2, 3]] * 2},
                "max_replicas_moved": 1,
            },
            id="capped",
        ),
        pytest.param({**UAT, "model": {**UAT["model"], "num_expert_groups": 4}}, id="expert-groups"),
    ],
)
def test_every_form_of_a_rebalance_answer_is_what_its_model_declares(client, request_body):
    for include in ("", "?include=placement", "?include=placement,layers,eplb"):
        _checked(MoeRebalanceResponse, client.post(f"/v1/moe/rebalance{include}", json=request_body))


def test_a_deployments_answers_and_its_read_are_what_their_models_declare(client):
    first = _checked(MoeRebalanceResponse, client.post("/v1/moe/rebalance", json={**UAT, "deployment": "contract"}))
    assert (first.deployment, first.version) == ("contract", 1)
    again = {"deployment": "contract", "load": [[1, 1, 1, 1, 1, 1, 1, 900]] * 2, "max_replicas_moved": 0}
    assert _checked(MoeRebalanceResponse, client.post("/v1/moe/rebalance", json=again)).version == 2
    read = _checked(MoeDeploymentRead, client.get("/v1/moe/deployments/contract"))
    assert [entry.version for entry in read.history] == [2, 1] and read.history[1].balance.before is None
