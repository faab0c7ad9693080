"""HTTP semantics every route shares: entity tags and If-None-Match (RFC 9110 8.8.3, 13.1.2),
HEAD wherever GET is served, and one answer for a body that is not JSON or fits no schema."""

from __future__ import annotations

import pytest

from service.api.params import none_match
from tests.service.graphs import diamond_graph, plan_request


def _plan(client, name: str) -> dict:
    response = client.post("/v1/plans", json=plan_request(diamond_graph(name)))
    assert response.status_code == 201, response.text
    return response.json()


# ----------------------------------------------------------------------------- entity tags


def test_the_summary_and_the_full_plan_carry_different_etags(client):
    plan = _plan(client, "etag-per-detail")
    full = client.get(f"/v1/plans/{plan['id']}")
    summary = client.get(f"/v1/plans/{plan['id']}", params={"detail": "summary"})
    assert full.json() != summary.json()
    assert full.headers["etag"] != summary.headers["etag"]


def test_the_summarys_etag_does_not_revalidate_the_full_plan(client):
    plan = _plan(client, "etag-cross")
    summary_tag = client.get(f"/v1/plans/{plan['id']}", params={"detail": "summary"}).headers["etag"]
    response = client.get(f"/v1/plans/{plan['id']}", headers={"If-None-Match": summary_tag})
    assert response.status_code == 200
    assert response.json()["ops"] == plan["ops"]


def test_the_summary_revalidates_with_its_own_etag(client):
    plan = _plan(client, "etag-summary")
    summary = client.get(f"/v1/plans/{plan['id']}", params={"detail": "summary"})
    again = client.get(
        f"/v1/plans/{plan['id']}", params={"detail": "summary"}, headers={"If-None-Match": summary.headers["etag"]}
    )
    assert again.status_code == 304 and again.headers["etag"] == summary.headers["etag"]


def test_a_cached_answer_does_not_share_its_etag_with_the_plan_read_back(client):
    """The repeat POST's body says ``cached: true``; the GET's says false."""
    first = client.post("/v1/plans", json=plan_request(diamond_graph("etag-cached")))
    repeat = client.post("/v1/plans", json=plan_request(diamond_graph("etag-cached")))
    read_back = client.get(f"/v1/plans/{first.json()['id']}")
    assert repeat.json()["cached"] is True and read_back.json()["cached"] is False
    assert repeat.headers["etag"] != read_back.headers["etag"]
    assert first.headers["etag"] == read_back.headers["etag"]  # the 201's body is the one read back


@pytest.mark.parametrize(
    "header",
    [
        '"0123", {tag}',
        '{tag}, "0123"',
        "W/{tag}",
        '"0123",W/{tag}',
        "*",
    ],
)
def test_if_none_match_is_compared_as_a_list_of_weak_tags(client, header):
    plan = _plan(client, "etag-list")
    tag = client.get(f"/v1/plans/{plan['id']}").headers["etag"]
    response = client.get(f"/v1/plans/{plan['id']}", headers={"If-None-Match": header.format(tag=tag)})
    assert response.status_code == 304, header
    assert response.headers["etag"] == tag and response.content == b""


@pytest.mark.parametrize("header", ['"0123"', '"0123", W/"4567"', "garbage", '""'])
def test_if_none_match_naming_only_other_tags_gets_the_plan(client, header):
    plan = _plan(client, "etag-miss")
    response = client.get(f"/v1/plans/{plan['id']}", headers={"If-None-Match": header})
    assert response.status_code == 200 and response.json()["id"] == plan["id"]


def test_an_entity_tag_may_hold_a_comma():
    assert none_match('"a,b", "c"', '"a,b"')
    assert not none_match('"a,b", "c"', '"a"')


def test_if_none_match_star_matches_only_with_an_existing_plan(client):
    response = client.get("/v1/plans/00000000-0000-0000-0000-000000000000", headers={"If-None-Match": "*"})
    assert response.status_code == 404


# ----------------------------------------------------------------------------- HEAD


def test_head_on_a_plan_answers_the_get_headers_without_a_body(client):
    plan = _plan(client, "head")
    get = client.get(f"/v1/plans/{plan['id']}")
    head = client.request("HEAD", f"/v1/plans/{plan['id']}")
    assert head.status_code == 200 and head.content == b""
    for name in ("etag", "content-type", "content-length"):
        assert head.headers[name] == get.headers[name]


def test_head_revalidates_like_get(client):
    plan = _plan(client, "head-304")
    tag = client.get(f"/v1/plans/{plan['id']}").headers["etag"]
    assert client.request("HEAD", f"/v1/plans/{plan['id']}", headers={"If-None-Match": tag}).status_code == 304


def test_head_on_a_route_that_serves_no_get_is_still_405(client):
    response = client.request("HEAD", "/v1/moe/rebalance")
    assert response.status_code == 405 and response.headers["allow"] == "POST"


def test_a_head_request_is_counted_as_head_under_its_route_template(client, base_client):
    plan = _plan(client, "head-metrics")
    client.request("HEAD", f"/v1/plans/{plan['id']}")
    assert 'method="HEAD",route="/v1/plans/{plan_id}",status="200"' in base_client.get("/metrics").text


# ----------------------------------------------------------------------------- field problems


def test_a_preset_inventory_out_of_range_is_reported_against_the_preset_form(client):
    response = client.post("/v1/plans", json={**plan_request(), "inventory": {"preset": "dgx-h100", "nodes": 0}})
    assert response.status_code == 422
    problem = response.json()
    assert problem["detail"].startswith(
        "body.inventory.PresetInventory.nodes: Input should be greater than or equal to 1"
    )
    assert problem["errors"][0]["field"] == "body.inventory.PresetInventory.nodes"
    # the explicit form's complaints are kept, after it
    assert {error["field"] for error in problem["errors"][1:]} == {
        "body.inventory.InventoryDocument.groups",
        "body.inventory.InventoryDocument.preset",
        "body.inventory.InventoryDocument.nodes",
    }


def test_an_explicit_inventory_with_no_groups_is_reported_against_the_explicit_form(client):
    response = client.post("/v1/plans", json={**plan_request(), "inventory": {"name": "empty", "groups": []}})
    assert response.status_code == 422
    assert response.json()["detail"].startswith(
        "body.inventory.InventoryDocument.groups: List should have at least 1 item"
    )


def test_a_value_sent_wrong_is_named_before_a_field_not_sent(client):
    response = client.post("/v1/plans", json={"inventory": {"nodes": 0}})
    assert response.json()["errors"][0]["type"] == "greater_than_equal"


# ----------------------------------------------------------------------------- bodies that are not JSON

UNREADABLE_BODIES = {
    "malformed": (
        b'{"a": 1, ',
        "The body is not valid JSON: Expecting property name enclosed in double quotes: line 1 column 10 (char 9).",
    ),
    "nested-100000-deep": (
        b"[" * 100_000 + b"]" * 100_000,
        "The body is not JSON this service can read: it is nested too deeply.",
    ),
    "not-utf-8": ('{"name": "\xe9"}'.encode("latin-1"), "The body is not valid JSON: 'utf-8' codec can't decode"),
    "integer-of-5000-digits": (
        b'{"n": ' + b"9" * 5000 + b"}",
        "The body is not JSON this service can read: Exceeds the limit (4300 digits)",
    ),
}
JSON_ROUTES = [
    "/v1/plans",
    "/v1/moe/rebalance",
    "/v1/parallel/plan",
    "/v1/plans/00000000-0000-0000-0000-000000000000/feedback",
    "/v1/plans/00000000-0000-0000-0000-000000000000/replan",
]


@pytest.mark.parametrize("route", JSON_ROUTES)
@pytest.mark.parametrize("case", sorted(UNREADABLE_BODIES))
def test_a_body_that_is_not_json_gets_the_same_clear_422_on_every_route(client, route, case):
    body, says = UNREADABLE_BODIES[case]
    response = client.post(route, content=body, headers={"Content-Type": "application/json"})
    assert response.status_code == 422, response.text
    assert response.headers["content-type"].startswith("application/problem+json")
    problem = response.json()
    assert problem["type"].endswith("/invalid-input")
    assert problem["detail"].startswith(says), problem["detail"]
