"""Random valid-looking plan requests (tests/service/random_requests.py): a plan or a 4xx, never a 5xx.

A structural fuzz of this kind found 500s the schema-driven fuzz (test_fuzz_openapi)
did not: a named strategy with nothing to build, a training graph without parameters.
Those cases have their own tests; these seeds keep looking on every run. Set
HYPERPLACE_RANDOM_REQUESTS to run more.
"""

from __future__ import annotations

import os

import pytest

from tests.service.random_requests import random_plan_request

N_REQUESTS = int(os.environ.get("HYPERPLACE_RANDOM_REQUESTS", "100"))


@pytest.mark.parametrize("seed", range(N_REQUESTS))
def test_a_random_request_gets_a_plan_or_a_problem_never_a_server_error(client, seed):
    response = client.post("/v1/plans", json=random_plan_request(seed))
    assert response.status_code < 500, response.text
    if response.status_code in (200, 201):
        plan_id = response.json()["id"]
        for view in ("trace", "view"):
            assert client.get(f"/v1/plans/{plan_id}/{view}").status_code == 200
    else:
        assert response.headers["content-type"].startswith("application/problem+json")
