"""The service against its own OpenAPI schema (schemathesis, bounded examples).

Every operation the schema lists at test time is fuzzed with schema-valid and
schema-violating requests, sent with a real API key. For each response:

- no 5xx (``not_a_server_error``);
- the status is one the operation documents (``status_code_conformance``);
- the content type and the body match what is documented for that status
  (``content_type_conformance``, ``response_schema_conformance``);
- documented response headers are present (``response_headers_conformance``);
- a request that violates the schema is rejected with a 4xx (``negative_data_rejection``).

Random graphs and load matrices are almost never *valid* (a random tensor name
has no producer), so the success paths are also driven with hand-written valid
requests and checked against the same schema.

Examples are bounded (``HYPERPLACE_FUZZ_EXAMPLES``, default 30 per operation) and
deterministic, so the file runs in well under a minute on two cores; raise the count
and set ``HYPERPLACE_FUZZ_RANDOM=1`` for a longer hunt.
"""

from __future__ import annotations

import os

import pytest
import schemathesis
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, reject, settings
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    negative_data_rejection,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from service.app import create_app
from tests.conftest import make_settings, new_api_key
from tests.service.graphs import diamond_graph, plan_request

FUZZ_EXAMPLES = int(os.environ.get("HYPERPLACE_FUZZ_EXAMPLES", "30"))
#: Negative examples past this many JSON values (e.g. 4097 groups of 4097 devices,
#: one over a maxItems) cost a minute to serialise on the client and end in the
#: body-size limit's 413, which test_hostile_inputs covers directly.
MAX_GENERATED_VALUES = 20_000

CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
    response_headers_conformance,
]


def _openapi_document() -> dict:
    """The schema as the service publishes it; building it touches no database."""
    return create_app(make_settings("sqlite:///:memory:")).openapi()


#: Operations whose schema is so large that schemathesis' coverage phase (boundary
#: values for every field, built at collection) takes ~25 s on two cores: fuzzed
#: with the examples and fuzzing phases only.
NO_COVERAGE_PHASE = ["/v1/parallel/plan"]


def _load_schema(document: dict, *, coverage_phase: bool):
    loaded = schemathesis.openapi.from_dict(document)
    loaded.config.generation.update(
        modes=[GenerationMode.POSITIVE, GenerationMode.NEGATIVE], max_examples=FUZZ_EXAMPLES
    )
    loaded.config.phases.coverage.enabled = coverage_phase
    # A schema-violating body may also be too large: 413 is a rejection too.
    rejection = loaded.config.checks.negative_data_rejection
    rejection.expected_statuses = [*rejection.expected_statuses, "413"]
    return loaded


# Loaded at import (schemathesis' fixture-based loader does not work with pytest 9);
# requests go to the module's app, passed to each call.
_DOCUMENT = _openapi_document()
schema = _load_schema(_DOCUMENT, coverage_phase=True).exclude(path=NO_COVERAGE_PHASE)
large_schema = _load_schema(_DOCUMENT, coverage_phase=False).include(path=NO_COVERAGE_PHASE)


@pytest.fixture(scope="module")
def fuzz_settings(database_url):
    return make_settings(database_url)


@pytest.fixture(scope="module")
def fuzz_app(fuzz_settings):
    app = create_app(fuzz_settings)
    with TestClient(app):  # run the lifespan once (migration check)
        yield app


@pytest.fixture(scope="module")
def fuzz_key(fuzz_app, session_factory, fuzz_settings) -> str:
    _, key = new_api_key(session_factory, fuzz_settings)
    return key


def _too_many_values(value, budget: int = MAX_GENERATED_VALUES) -> bool:
    stack, seen = [value], 0
    while stack:
        item = stack.pop()
        seen += 1
        if seen > budget:
            return True
        if isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, (list, tuple)):
            stack.extend(item)
    return False


def _fuzz(case, fuzz_app, fuzz_key) -> None:
    if _too_many_values(case.body):
        reject()
    case.call_and_validate(
        app=fuzz_app,
        headers={"Authorization": f"Bearer {fuzz_key}"},
        checks=CHECKS,
        additional_checks=[negative_data_rejection],
    )


#: Deterministic in CI; HYPERPLACE_FUZZ_RANDOM=1 draws new examples each run (for a hunt).
FUZZ_SETTINGS = settings(
    max_examples=FUZZ_EXAMPLES,
    deadline=None,
    suppress_health_check=list(HealthCheck),
    derandomize=os.environ.get("HYPERPLACE_FUZZ_RANDOM") != "1",
)


@schema.parametrize()
@FUZZ_SETTINGS
def test_every_operation_honours_its_schema(case, fuzz_app, fuzz_key):
    _fuzz(case, fuzz_app, fuzz_key)


@large_schema.parametrize()
@FUZZ_SETTINGS
def test_every_large_operation_honours_its_schema(case, fuzz_app, fuzz_key):
    _fuzz(case, fuzz_app, fuzz_key)


def _call(fuzz_app, fuzz_key, method: str, path: str, **case_kwargs):
    """One hand-written request, validated against the schema like a generated one."""
    case = schema[path][method].Case(**case_kwargs)
    return case.call_and_validate(app=fuzz_app, headers={"Authorization": f"Bearer {fuzz_key}"}, checks=CHECKS)


def test_the_operations_endpoints_match_the_schema(fuzz_app, fuzz_key):
    for path in ("/healthz", "/readyz", "/metrics"):
        assert _call(fuzz_app, fuzz_key, "GET", path).status_code == 200


def test_a_valid_plan_and_every_read_of_it_match_the_schema(fuzz_app, fuzz_key):
    created = _call(
        fuzz_app,
        fuzz_key,
        "POST",
        "/v1/plans",
        body=plan_request(diamond_graph("fuzz-valid")),
        media_type="application/json",
    )
    assert created.status_code == 201
    plan = created.json()
    again = _call(
        fuzz_app,
        fuzz_key,
        "POST",
        "/v1/plans",
        body=plan_request(diamond_graph("fuzz-valid")),
        media_type="application/json",
    )
    assert again.status_code == 200
    ids = {"plan_id": plan["id"]}
    assert _call(fuzz_app, fuzz_key, "GET", "/v1/plans/{plan_id}", path_parameters=ids).status_code == 200
    assert (
        _call(
            fuzz_app, fuzz_key, "GET", "/v1/plans/{plan_id}", path_parameters=ids, query={"detail": "summary"}
        ).status_code
        == 200
    )
    assert _call(fuzz_app, fuzz_key, "GET", "/v1/plans/{plan_id}/trace", path_parameters=ids).status_code == 200
    assert _call(fuzz_app, fuzz_key, "GET", "/v1/plans/{plan_id}/view", path_parameters=ids).status_code == 200
    by_model = {"model_hash": plan["model_hash"]}
    assert _call(fuzz_app, fuzz_key, "GET", "/v1/models/{model_hash}", path_parameters=by_model).status_code == 200
    assert (
        _call(
            fuzz_app, fuzz_key, "GET", "/v1/models/{model_hash}/plans", path_parameters=by_model, query={"limit": 1}
        ).status_code
        == 200
    )
    assert _call(fuzz_app, fuzz_key, "DELETE", "/v1/plans/{plan_id}", path_parameters=ids).status_code == 204


def test_a_valid_moe_rebalance_and_its_deployment_match_the_schema(fuzz_app, fuzz_key):
    body = {
        "model": {"num_moe_layers": 2, "num_logical_experts": 4},
        "cluster": {"num_nodes": 1, "gpus_per_node": 2, "slots_per_gpu": 3},
        "load": [[1.0, 2.0, 3.0, 40.0], [5.0, 5.0, 5.0, 5.0]],
        "deployment": "fuzz-deployment",
    }
    assert (
        _call(fuzz_app, fuzz_key, "POST", "/v1/moe/rebalance", body=body, media_type="application/json").status_code
        == 200
    )
    follow_up = {"deployment": "fuzz-deployment", "load": [[40.0, 2.0, 3.0, 1.0], [5.0, 5.0, 5.0, 5.0]]}
    assert (
        _call(
            fuzz_app, fuzz_key, "POST", "/v1/moe/rebalance", body=follow_up, media_type="application/json"
        ).status_code
        == 200
    )
    read = _call(fuzz_app, fuzz_key, "GET", "/v1/moe/deployments/{name}", path_parameters={"name": "fuzz-deployment"})
    assert read.status_code == 200 and read.json()["current_version"] == 2


def test_a_valid_3d_parallel_search_and_evaluation_match_the_schema(fuzz_app, fuzz_key):
    """The 3D answer against its declared response model; small shapes keep the search instant."""
    operation = large_schema["/v1/parallel/plan"]["POST"]
    body = {
        "model": {
            "num_layers": 4,
            "hidden_size": 256,
            "num_attention_heads": 8,
            "seq_length": 512,
            "vocab_size": 1000,
            "moe": {"num_experts": 4, "experts_per_token": 2, "expert_ffn_hidden_size": 128},
        },
        "cluster": {"preset": "dgx-h100", "nodes": 2},
        "training": {"global_batch_sequences": 32},
        "top_k": 2,
        "rank_map_limit": 8,
    }
    for request in (body, {**body, "evaluate": [{"tp": 2, "pp": 2}, {"tp": 1, "ep": 4, "etp": 1}]}):
        case = operation.Case(body=request, media_type="application/json")
        response = case.call_and_validate(app=fuzz_app, headers={"Authorization": f"Bearer {fuzz_key}"}, checks=CHECKS)
        assert response.status_code == 200, response.text


# ----------------------------------------------------------------------------- the schema itself


def _request_schemas(document: dict):
    """(where, schema) of every parameter and request body of every operation."""
    for path, operations in document["paths"].items():
        for method, operation in operations.items():
            for parameter in operation.get("parameters", []):
                yield f"{method.upper()} {path} {parameter['in']}:{parameter['name']}", parameter.get("schema", {})
            for media_type, content in operation.get("requestBody", {}).get("content", {}).items():
                yield f"{method.upper()} {path} {media_type}", content.get("schema", {})


def _walk(document: dict, schema, where: str, seen: frozenset = frozenset()):
    """Every sub-schema reachable from ``schema``, refs resolved against the document."""
    if not isinstance(schema, dict):
        return
    if "$ref" in schema:
        name = schema["$ref"].removeprefix("#/components/schemas/")
        assert name in document.get("components", {}).get("schemas", {}), f"{where}: unresolvable $ref {schema['$ref']}"
        if name not in seen:
            yield from _walk(document, document["components"]["schemas"][name], f"{where}->{name}", seen | {name})
        return
    yield where, schema
    for keyword in ("anyOf", "oneOf", "allOf"):
        for option in schema.get(keyword, []):
            yield from _walk(document, option, where, seen)
    for name, sub in schema.get("properties", {}).items():
        yield from _walk(document, sub, f"{where}.{name}", seen)
    for keyword, suffix in (("items", "[]"), ("additionalProperties", "{}"), ("propertyNames", "<key>")):
        if isinstance(schema.get(keyword), dict):
            yield from _walk(document, schema[keyword], where + suffix, seen)


def test_every_request_integer_is_bounded_and_every_typed_list_has_a_maximum():
    """Integers have both bounds; lists of typed items a maxItems (free-form documents, whose
    items are unconstrained, are bounded by the body-size limit instead); refs resolve."""
    unbounded = []
    for where, root in _request_schemas(_DOCUMENT):
        for place, schema in _walk(_DOCUMENT, root, where):
            kind = schema.get("type")
            if kind == "integer":
                low = "minimum" in schema or "exclusiveMinimum" in schema
                high = "maximum" in schema or "exclusiveMaximum" in schema
                if not (low and high):
                    unbounded.append(f"integer {place}")
            if kind == "array" and schema.get("items") and "maxItems" not in schema:
                unbounded.append(f"array {place}")
    assert unbounded == []
