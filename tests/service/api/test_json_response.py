"""Documents the routes build themselves are written as the JSON json.dumps would write."""

from __future__ import annotations

import json

from service.api.json_response import DocumentResponse


def test_a_document_is_written_as_the_same_json_values():
    document = {
        "id": "p-1",
        "name": "ünïcode",
        "devices": [0, 1, 2],
        "makespan_s": 1.25e-05,
        "big": 1e16,
        "nested": {"ok": True, "none": None, "pair": (3, 4)},
        7: "int key",
    }
    body = DocumentResponse(document).body
    assert json.loads(body) == json.loads(json.dumps(document))


def test_non_finite_floats_are_written_as_null_not_as_invalid_json():
    body = DocumentResponse({"worst": float("inf"), "mean": float("nan"), "count": 3}).body
    assert json.loads(body) == {"worst": None, "mean": None, "count": 3}
    assert b"Infinity" not in body and b"NaN" not in body


def test_a_document_response_says_it_is_json():
    response = DocumentResponse({"a": 1}, status_code=201, headers={"Location": "/v1/plans/x"})
    assert response.status_code == 201 and response.headers["content-type"] == "application/json"
    assert response.headers["location"] == "/v1/plans/x"
