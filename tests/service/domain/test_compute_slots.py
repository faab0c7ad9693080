"""Heavy computations a few at a time: graph placements inside requests
(HYPERPLACE_SYNC_PLAN_SLOTS) and 3D-parallel searches (HYPERPLACE_PARALLEL_PLAN_SLOTS)."""

from __future__ import annotations

import asyncio
import threading
import time

import anyio
import pytest
from fastapi.testclient import TestClient

from service.app import create_app
from service.domain.compute_slots import ComputeSlots
from service.errors import ServerBusy
from tests.conftest import make_settings
from tests.service.graphs import diamond_graph, parallel_plan_request, plan_request


@pytest.fixture
def one_slot(database_url):
    """A server with one slot of each kind, waiting 50 ms for one; the test may take them."""
    settings = make_settings(
        database_url,
        auth="disabled",
        sync_plan_slots=1,
        sync_plan_wait_s=0.05,
        parallel_plan_slots=1,
        parallel_plan_wait_s=0.05,
    )
    app = create_app(settings)
    with TestClient(app, raise_server_exceptions=False) as client:
        yield client, app.state


def test_a_submission_that_finds_every_planning_slot_busy_is_queued_as_a_job(one_slot):
    client, state = one_slot
    with state.planning_slots.hold() as held:
        assert held
        queued = client.post("/v1/plans", json=plan_request(diamond_graph("busy-slot", scale=1.5)))
    assert queued.status_code == 202, queued.text
    assert queued.json()["status"] == "queued" and queued.headers["Location"] == f"/v1/plans/{queued.json()['id']}"
    planned = client.post("/v1/plans", json=plan_request(diamond_graph("free-slot", scale=2.5)))
    assert planned.status_code == 201 and planned.json()["status"] == "done"


def test_a_replan_that_finds_every_planning_slot_busy_is_answered_503_with_retry_after(one_slot):
    client, state = one_slot
    parent = client.post("/v1/plans", json=plan_request(diamond_graph("replan-busy", scale=3.5))).json()
    with state.planning_slots.hold():
        busy = client.post(f"/v1/plans/{parent['id']}/replan", json={})
    assert busy.status_code == 503 and busy.headers["Retry-After"] == "1"
    assert busy.json()["type"].endswith("server-busy")
    assert client.post(f"/v1/plans/{parent['id']}/replan", json={}).status_code == 201


def test_a_search_that_finds_every_parallel_slot_taken_is_answered_503_with_retry_after(one_slot):
    client, state = one_slot
    with state.parallel_plan_slots.hold() as held:  # a search in progress
        assert held
        busy = client.post("/v1/parallel/plan", json=parallel_plan_request())
    assert busy.status_code == 503 and busy.headers["Retry-After"] == "1"
    assert busy.headers["content-type"].startswith("application/problem+json")
    assert busy.json()["type"].endswith("server-busy") and "busy" in busy.json()["detail"]
    assert client.post("/v1/parallel/plan", json=parallel_plan_request()).status_code == 200


def test_a_search_that_fails_gives_its_slot_back(one_slot):
    client, _ = one_slot
    bad = client.post(
        "/v1/parallel/plan", json=parallel_plan_request(training={"global_batch_sequences": 1024, "precision": "fp4"})
    )
    assert bad.status_code == 422
    assert client.post("/v1/parallel/plan", json=parallel_plan_request()).status_code == 200


# ----------------------------------------------------------------------------- the mechanism itself
# One ComputeSlots serves a thread that asks "now, or within wait_s" (planning) and a
# coroutine that waits on the event loop (3D searches); these pin down how they share it.


def _eventually(condition, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.001)


def test_hold_takes_a_free_slot_and_refuses_when_all_are_taken():
    slots = ComputeSlots("tests", 2, 0.0)
    with slots.hold() as first, slots.hold() as second:
        assert first and second and slots.taken == 2
        with slots.hold(wait=True) as third:  # wait_s 0: waiting means not waiting at all
            assert not third
        assert slots.taken == 2
    assert slots.taken == 0


def test_a_waiting_thread_gets_the_slot_given_back_within_wait_s():
    slots = ComputeSlots("tests", 1, 5.0)
    got: list[tuple[bool, int]] = []

    def wait_for_a_slot() -> None:
        with slots.hold(wait=True) as held:
            got.append((held, slots.taken))

    with slots.hold() as held:
        assert held
        waiter = threading.Thread(target=wait_for_a_slot)
        waiter.start()
        _eventually(lambda: slots.waiting == 1)
    waiter.join(5)
    assert got == [(True, 1)] and slots.taken == 0 and slots.waiting == 0


def test_a_thread_that_waits_in_vain_leaves_the_line_and_the_count_as_they_were():
    slots = ComputeSlots("tests", 1, 0.02)
    with slots.hold() as held:
        started = time.monotonic()
        with slots.hold(wait=True) as late:
            assert held and not late
        assert time.monotonic() - started >= 0.02
        assert slots.taken == 1 and slots.waiting == 0
    assert slots.taken == 0


def test_a_caller_trying_now_never_overtakes_one_that_waits():
    slots = ComputeSlots("tests", 1, 5.0)
    order: list[str] = []

    async def scenario() -> None:
        with slots.hold() as held:  # the one slot, taken in this thread
            assert held
            waiting = asyncio.ensure_future(slots.run(order.append, "waited"))
            await anyio.sleep(0.01)
            assert slots.waiting == 1
        # given back: it passed to the coroutine in line, so a try-now finds none free
        with slots.hold() as now:
            order.append("now" if now else "refused")
        await waiting
        with slots.hold() as later:
            order.append("later" if later else "refused")

    anyio.run(scenario)
    assert order == ["refused", "waited", "later"]
    assert slots.taken == 0 and slots.waiting == 0


def test_a_coroutine_that_waits_in_vain_is_told_the_server_is_busy_and_leaks_nothing():
    slots = ComputeSlots("3D-parallel searches", 1, 0.02)

    async def scenario() -> None:
        with slots.hold(), pytest.raises(ServerBusy) as busy:
            await slots.run(lambda: None)
        assert busy.value.status == 503 and busy.value.headers["Retry-After"] == "1"
        assert "all 1 slots for 3D-parallel searches are busy" in busy.value.detail
        assert await slots.run(lambda: "ran") == "ran"

    anyio.run(scenario)
    assert slots.taken == 0 and slots.waiting == 0


def test_a_cancelled_waiter_gives_up_its_place_and_any_slot_that_reached_it():
    slots = ComputeSlots("tests", 1, 5.0)

    async def scenario() -> None:
        with slots.hold():
            with anyio.move_on_after(0.02):  # the client went away while it waited
                await slots.run(lambda: None)
            assert slots.waiting == 0
        assert slots.taken == 0

    anyio.run(scenario)


def test_work_that_raises_gives_its_slot_back():
    slots = ComputeSlots("tests", 1, 0.0)

    def fail() -> None:
        raise ValueError("bad input")

    async def scenario() -> None:
        with pytest.raises(ValueError):
            await slots.run(fail)

    anyio.run(scenario)
    assert slots.taken == 0


def test_no_more_run_at_once_than_there_are_slots_and_each_waiter_gets_one():
    slots = ComputeSlots("tests", 2, 10.0)
    running, most, ran = 0, 0, 0
    lock = threading.Lock()

    def work() -> None:
        nonlocal running, most, ran
        with lock:
            running += 1
            ran += 1
            most = max(most, running)
        time.sleep(0.01)
        with lock:
            running -= 1

    def in_a_thread() -> None:
        with slots.hold(wait=True) as held:
            assert held
            work()

    async def scenario() -> None:
        threads = [threading.Thread(target=in_a_thread) for _ in range(4)]
        for thread in threads:
            thread.start()
        async with anyio.create_task_group() as group:
            for _ in range(6):
                group.start_soon(slots.run, work)
        for thread in threads:
            thread.join(10)

    anyio.run(scenario)
    assert ran == 10 and most <= 2  # everyone got a slot in the end, never more than two at once
    assert slots.taken == 0 and slots.waiting == 0


@pytest.mark.parametrize(("slots", "wait_s"), [(0, 1.0), (1, -1.0), (1, float("nan"))])
def test_slots_refuse_a_count_below_one_and_a_negative_wait(slots, wait_s):
    with pytest.raises(ValueError):
        ComputeSlots("tests", slots, wait_s)
