"""The end of a plan's life, on the database under test: what DELETE takes with it.

Deleting a plan deletes its timelines, forgets the Idempotency-Keys that answered
with the plan or one of its timelines (a retry with one is a new request: it plans
again and binds the key anew), and refits the calibration its timelines fed from
the inventory's remaining timelines, as a new version (empty when none is left).
Requests racing the delete for the same plan answer 404, not a 409 to retry.
"""

from __future__ import annotations

import pytest
from sqlalchemy import func, select

from service.domain import feedback as feedback_domain
from service.domain.planning import delete_plan
from service.storage import plans as plans_repo
from service.storage.models import IdempotencyKey
from tests.service.graphs import diamond_graph, measured_timeline, plan_request


def _plan(client, name: str, **options) -> dict:
    response = client.post("/v1/plans", json=plan_request(diamond_graph(name), **options))
    assert response.status_code == 201, response.text
    return response.json()


def _timeline(plan: dict, duration_s: float) -> dict:
    """Every operator of ``plan`` measured at ``duration_s`` (hundreds of times the model's figure)."""
    timeline = measured_timeline(plan)
    for index, op in enumerate(timeline["ops"]):
        op.update(start_s=index * duration_s, duration_s=duration_s)
    return {"timeline": timeline}


def _keys_of(session_factory, tenant_id: str) -> int:
    with session_factory() as session:
        return session.scalar(
            select(func.count()).select_from(IdempotencyKey).where(IdempotencyKey.tenant_id == tenant_id)
        )


# ----------------------------------------------------------------------------- Idempotency-Keys


def test_a_retry_with_the_key_of_a_deleted_plan_plans_again_and_the_key_then_names_the_new_plan(client):
    body, key = plan_request(diamond_graph("key-after-delete")), {"Idempotency-Key": "plan-then-delete"}
    first = client.post("/v1/plans", json=body, headers=key).json()
    assert client.delete(f"/v1/plans/{first['id']}").status_code == 204
    again = client.post("/v1/plans", json=body, headers=key)
    assert again.status_code == 201, again.text
    assert again.json()["id"] != first["id"]
    assert client.get(f"/v1/plans/{again.json()['id']}").status_code == 200
    replay = client.post("/v1/plans", json=body, headers=key)
    assert (replay.status_code, replay.json()["id"]) == (201, again.json()["id"])


def test_a_replan_retried_with_the_key_of_its_deleted_child_replans_again(client):
    parent = _plan(client, "replan-key-after-delete")
    body, key = {"load_report": {"slow_devices": {"node0/gpu0": 2.0}}}, {"Idempotency-Key": "replan-then-delete"}
    child = client.post(f"/v1/plans/{parent['id']}/replan", json=body, headers=key).json()
    assert client.delete(f"/v1/plans/{child['id']}").status_code == 204
    again = client.post(f"/v1/plans/{parent['id']}/replan", json=body, headers=key)
    assert again.status_code == 201, again.text
    assert again.json()["id"] != child["id"] and again.json()["parent_id"] == parent["id"]


def test_deleting_a_plan_deletes_every_key_that_answered_with_it_or_its_timelines(client, session_factory):
    body = plan_request(diamond_graph("keys-deleted"))
    plan = client.post("/v1/plans", json=body, headers={"Idempotency-Key": "made-it"}).json()
    cached = client.post("/v1/plans", json=body, headers={"Idempotency-Key": "found-it-cached"})
    timeline = client.post(
        f"/v1/plans/{plan['id']}/feedback", json=_timeline(plan, 1e-3), headers={"Idempotency-Key": "its-timeline"}
    )
    assert (cached.status_code, timeline.status_code) == (200, 201)
    assert _keys_of(session_factory, client.tenant_id) == 3
    assert client.delete(f"/v1/plans/{plan['id']}").status_code == 204
    assert _keys_of(session_factory, client.tenant_id) == 0


def test_the_key_of_a_deleted_plans_timeline_is_free_for_another_timeline(client):
    deleted, kept = _plan(client, "fb-key"), _plan(client, "fb-key", seed=1)
    key = {"Idempotency-Key": "timeline-key"}
    assert (
        client.post(f"/v1/plans/{deleted['id']}/feedback", json=_timeline(deleted, 1e-3), headers=key).status_code
        == 201
    )
    assert client.delete(f"/v1/plans/{deleted['id']}").status_code == 204
    response = client.post(f"/v1/plans/{kept['id']}/feedback", json=_timeline(kept, 1e-3), headers=key)
    assert response.status_code == 201, response.text


def test_a_key_still_naming_a_plan_that_no_longer_exists_plans_again(client, session_factory):
    """Keys stored before deletes forgot them: the plan row went, the key stayed."""
    body, key = plan_request(diamond_graph("orphaned-key")), {"Idempotency-Key": "orphaned"}
    first = client.post("/v1/plans", json=body, headers=key).json()
    with session_factory() as session, session.begin():
        assert plans_repo.delete_plan(session, client.tenant_id, first["id"])
    again = client.post("/v1/plans", json=body, headers=key)
    assert again.status_code == 201, again.text
    assert client.get(f"/v1/plans/{again.json()['id']}").status_code == 200
    assert client.post("/v1/plans", json=body, headers=key).json()["id"] == again.json()["id"]


# ----------------------------------------------------------------------------- calibration


def test_deleting_the_only_plan_with_timelines_leaves_an_empty_calibration_as_a_new_version(client):
    plan = _plan(client, "only-timelines")
    assert client.post(f"/v1/plans/{plan['id']}/feedback", json=_timeline(plan, 0.5)).status_code == 201
    before = client.get(f"/v1/calibrations/{plan['inventory_hash']}").json()
    assert before["n_timelines"] == 1 and before["factors"]["type_class"]
    assert client.delete(f"/v1/plans/{plan['id']}").status_code == 204
    after = client.get(f"/v1/calibrations/{plan['inventory_hash']}").json()
    assert after["version"] == before["version"] + 1
    assert after["n_timelines"] == 0 and after["factors"]["n_observations"] == 0
    assert after["factors"]["type_class"] == [] and after["factors"]["device_class"] == []


def test_a_replan_after_every_timeline_was_deleted_is_the_one_made_before_any_timeline(client):
    measured, other = _plan(client, "calibrated-then-deleted"), _plan(client, "replanned-later", seed=1)
    uncalibrated = client.post(f"/v1/plans/{other['id']}/replan", json={})
    assert client.post(f"/v1/plans/{measured['id']}/feedback", json=_timeline(measured, 0.5)).status_code == 201
    calibrated = client.post(f"/v1/plans/{other['id']}/replan", json={})
    assert calibrated.status_code == 201 and calibrated.json()["replan"]["calibration_version"] == 1
    assert client.delete(f"/v1/plans/{measured['id']}").status_code == 204
    after = client.post(f"/v1/plans/{other['id']}/replan", json={})
    assert (after.status_code, after.json()["id"]) == (200, uncalibrated.json()["id"])
    assert after.json()["replan"]["calibration_version"] is None


def test_deleting_one_of_two_measured_plans_refits_the_calibration_from_the_other_alone(client, other_client):
    deleted, kept = _plan(client, "two-measured"), _plan(client, "two-measured", seed=1)
    assert client.post(f"/v1/plans/{deleted['id']}/feedback", json=_timeline(deleted, 1e-3)).status_code == 201
    assert client.post(f"/v1/plans/{kept['id']}/feedback", json=_timeline(kept, 0.5)).status_code == 201
    assert client.delete(f"/v1/plans/{deleted['id']}").status_code == 204
    refitted = client.get(f"/v1/calibrations/{kept['inventory_hash']}").json()
    # another tenant who only ever measured the kept plan's run
    alone = _plan(other_client, "two-measured", seed=1)
    assert alone["ops"] == kept["ops"]
    expected = other_client.post(f"/v1/plans/{alone['id']}/feedback", json=_timeline(alone, 0.5)).json()["calibration"]
    assert (refitted["version"], refitted["n_timelines"]) == (3, 1)
    assert refitted["factors"] == expected["factors"]


def test_deleting_a_plan_without_timelines_leaves_the_calibration_as_it_is(client):
    measured, unmeasured = _plan(client, "measured"), _plan(client, "unmeasured", seed=1)
    assert client.post(f"/v1/plans/{measured['id']}/feedback", json=_timeline(measured, 0.5)).status_code == 201
    before = client.get(f"/v1/calibrations/{measured['inventory_hash']}").json()
    assert client.delete(f"/v1/plans/{unmeasured['id']}").status_code == 204
    assert client.get(f"/v1/calibrations/{measured['inventory_hash']}").json() == before


# ----------------------------------------------------------------------------- racing the delete


def test_a_replan_whose_parent_is_deleted_while_it_plans_is_404(client, session_factory, monkeypatch):
    parent = _plan(client, "deleted-mid-replan")
    place = feedback_domain._place_against_parent

    def delete_parent_then_place(*args, **kwargs):
        with session_factory() as session, session.begin():
            assert delete_plan(session, client.tenant_id, parent["id"])
        return place(*args, **kwargs)

    monkeypatch.setattr(feedback_domain, "_place_against_parent", delete_parent_then_place)
    response = client.post(f"/v1/plans/{parent['id']}/replan", json={})
    assert response.status_code == 404, response.text
    assert parent["id"] in response.json()["detail"]


@pytest.mark.postgres_only  # SQLite's writer lock keeps the delete out until the timeline is stored
def test_a_timeline_whose_plan_is_deleted_while_it_is_stored_is_404(client, session_factory, monkeypatch):
    plan = _plan(client, "deleted-mid-feedback")
    observations = feedback_domain._observations

    def delete_plan_then_observe(*args, **kwargs):
        with session_factory() as session, session.begin():
            assert delete_plan(session, client.tenant_id, plan["id"])
        return observations(*args, **kwargs)

    monkeypatch.setattr(feedback_domain, "_observations", delete_plan_then_observe)
    response = client.post(f"/v1/plans/{plan['id']}/feedback", json=_timeline(plan, 1e-3))
    assert response.status_code == 404, response.text
