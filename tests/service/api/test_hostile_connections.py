"""Issue 55 against a real server process: one upload, one header, one slow or vanishing
client, or a few hundred idle connections must not take the service down.

For each case: the answer the misbehaving client gets; that meanwhile ``/healthz``
answers every probe within a second and another tenant's plan submission succeeds; and
that afterwards the server's resident memory and open descriptors are back within 10%
of where they started. The server runs with short deadlines (2 s for a request head, a
body's grace period 2 s, 3 s per ONNX import) so that each case ends in seconds; the
limits themselves are the ones production runs with (service/server.py,
service/api/middleware.py, service/domain/onnx_worker.py).
"""

from __future__ import annotations

import asyncio
import json
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import httpx
import pytest

from tests.conftest import new_api_key
from tests.service.graphs import diamond_graph, plan_request
from tests.service.hostile_clients import (
    HealthProbe,
    Usage,
    children_of,
    expanding_functions_onnx,
    half_closed_body,
    half_open_connections,
    oversized_header,
    post_onnx,
    slow_body,
    usage,
)
from tests.service.live_server import LiveServer, start_server, wait_until

T = TypeVar("T")
#: 2^23 operators once its functions are inlined: under the server's operator limit here
#: (2^24), and ONNX shape inference takes far longer than the 3 s an import may take
#: (about 40 s on a 2-core development machine).
SLOW_TO_IMPORT = expanding_functions_onnx(23)
FAST_SETTINGS = dict(
    header_timeout_s="2",
    body_read_grace_s="2",
    onnx_import_timeout_s="3",
    onnx_import_wait_s="1",
    max_graph_ops=str(2**24),
    log_level="INFO",
)


@pytest.fixture(scope="module")
def keys(session_factory, settings) -> tuple[str, str]:
    """The misbehaving tenant's key, and another tenant's."""
    return new_api_key(session_factory, settings)[1], new_api_key(session_factory, settings)[1]


@pytest.fixture(scope="module")
def server(database_url, tmp_path_factory, keys):
    live = start_server(database_url, tmp_path_factory.mktemp("hostile-connections") / "server.log", **FAST_SETTINGS)
    _warm_up(live, keys)
    yield live
    live.stop()


def _small_onnx() -> bytes:
    """Two operators with static shapes: imported and planned in well under a second."""
    return expanding_functions_onnx(1)


def _other_tenants_plan(server: LiveServer, key: str, seed: int) -> int:
    body = plan_request(diamond_graph(), seed=seed)
    with server.client(key, timeout_s=60) as client:
        return client.post("/v1/plans", json=body).status_code


def _warm_up(server: LiveServer, keys: tuple[str, str]) -> None:
    """What every case does once, so that the baseline includes it: both import workers
    started, a plan, a large body parsed, and a burst of requests at once, which grows the
    database pool to its overflow (with SQLite, closed connections' descriptors then stay
    open while another connection holds a lock, and are reused: a steady state)."""
    _crowd(server, keys[0])
    for _ in range(2):
        threads = [
            threading.Thread(target=post_onnx, args=(server.base_url, keys[0], _small_onnx())),
            threading.Thread(target=post_onnx, args=(server.base_url, keys[0], _small_onnx())),
            threading.Thread(target=_other_tenants_plan, args=(server, keys[1], 0)),
            threading.Thread(target=_large_body_status, args=(server, keys[1])),
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()


def _large_body_status(server: LiveServer, key: str) -> int:
    """A valid plan padded to 2 MiB: a body that takes its bytes from the body budget."""
    body = json.dumps(plan_request(diamond_graph())) + " " * (2 * 2**20)
    with server.client(key, timeout_s=60) as client:
        return client.post("/v1/plans", content=body, headers={"Content-Type": "application/json"}).status_code


_seeds = iter(range(1, 10_000))


def _during(server: LiveServer, keys: tuple[str, str], attack: Callable[[], T]) -> T:
    """Run ``attack`` while probing ``/healthz`` and submitting another tenant's plan; check both,
    and that memory and descriptors come back. Returns what the attack returned."""
    start = usage(server.pid)
    outcome: list[T] = []
    with HealthProbe(server.base_url) as probe:
        attacker = threading.Thread(target=lambda: outcome.append(attack()))
        attacker.start()
        other = _other_tenants_plan(server, keys[1], next(_seeds))
        attacker.join()
    assert probe.failures == [], probe.failures
    assert probe.worst_s < 1.0, f"/healthz took {probe.worst_s:.2f} s"
    assert other in (200, 201)
    _back_within_ten_percent(server, start)
    return outcome[0]


def _back_within_ten_percent(server: LiveServer, start: Usage) -> None:
    def recovered() -> bool:
        return usage(server.pid).within(start, 0.10)

    try:
        wait_until(recovered, timeout_s=30)
    except AssertionError:
        raise AssertionError(f"started at {start}, now {usage(server.pid)}") from None


# ----------------------------------------------------------------------------- F1


def test_an_onnx_model_of_functions_that_expand_to_2_to_the_40_operators_is_413_naming_the_limit(server, keys):
    status, _ = _during(server, keys, lambda: post_onnx(server.base_url, keys[0], expanding_functions_onnx(40)))
    assert status == 413


def test_an_import_past_its_time_limit_is_413_and_the_next_import_gets_a_fresh_worker(server, keys):
    with httpx.Client(base_url=server.base_url, headers={"Authorization": f"Bearer {keys[0]}"}, timeout=120) as client:
        response = _during(
            server,
            keys,
            lambda: client.post(
                "/v1/plans",
                files={"model": ("model.onnx", SLOW_TO_IMPORT, "application/octet-stream")},
                data={"inventory": json.dumps({"preset": "dgx-h100"})},
            ),
        )
    assert response.status_code == 413
    assert response.json()["errors"][0]["type"] == "import-timeout"
    assert post_onnx(server.base_url, keys[0], _small_onnx())[0] in (200, 201)


def test_a_client_that_gives_up_on_an_import_ends_it_and_its_worker(server, keys):
    workers_before = children_of(server.pid)

    def give_up_after_a_second() -> tuple[int | None, float]:
        return post_onnx(server.base_url, keys[0], SLOW_TO_IMPORT, timeout_s=1.0)

    status, _ = _during(server, keys, give_up_after_a_second)
    assert status is None  # the client gave up
    wait_until(lambda: '"status": 499' in server.logs(), timeout_s=30)
    # the worker that ran it is gone (killed at the disconnect, not at the 3 s limit: no 413)
    wait_until(lambda: not workers_before <= children_of(server.pid), timeout_s=30)
    assert '"import-timeout"' not in server.logs().split('"status": 499')[-1]


async def _uploads_at_once(server: LiveServer, key: str, count: int) -> list[int]:
    """``count`` small ONNX uploads at once, from one thread (45 client threads would compete
    with the health probe for this test process's interpreter lock)."""
    async with httpx.AsyncClient(base_url=server.base_url, headers={"Authorization": f"Bearer {key}"}) as client:

        async def upload() -> int:
            response = await client.post(
                "/v1/plans",
                files={"model": ("model.onnx", _small_onnx(), "application/octet-stream")},
                data={"inventory": json.dumps({"preset": "dgx-h100"})},
                timeout=60,
            )
            return response.status_code

        return list(await asyncio.gather(*(upload() for _ in range(count))))


def _crowd(server: LiveServer, key: str) -> list[int]:
    """Two uploads that hold both import workers for their 3 s, then 45 small uploads at once."""
    slow = [threading.Thread(target=post_onnx, args=(server.base_url, key, SLOW_TO_IMPORT)) for _ in range(2)]
    for thread in slow:
        thread.start()
    time.sleep(1.0)  # both are importing (each for up to its 3 s)
    statuses = asyncio.run(_uploads_at_once(server, key, 45))
    for thread in slow:
        thread.join()
    return statuses


def test_uploads_that_find_both_import_workers_busy_get_503_with_retry_after_holding_no_thread(server, keys):
    statuses = _during(server, keys, lambda: _crowd(server, keys[0]))
    assert len(statuses) == 45 and set(statuses) <= {200, 201, 503}
    assert 503 in statuses


# ----------------------------------------------------------------------------- F2-F4


def test_a_64_mib_header_is_431_after_the_first_32_kib(server, keys):
    status, _, sent = _during(server, keys, lambda: oversized_header(server.port, 64 * 2**20))
    assert status == 431
    assert sent < 64 * 2**20


def test_a_body_sent_a_byte_a_second_is_408_and_gives_its_share_of_the_body_budget_back(server, keys):
    status, _, sent = _during(server, keys, lambda: slow_body(server.port, keys[0], declared_bytes=64 * 2**20))
    assert status == 408
    assert sent < 60
    assert _large_body_status(server, keys[1]) in (200, 201)  # not 503: the budget is free again


def test_three_hundred_half_open_connections_are_closed_by_the_head_deadline(server, keys):
    opened, answers, _ = _during(server, keys, lambda: half_open_connections(server.port, 300, hold_s=60))
    assert opened == 300
    assert answers == {408: 300}


def test_past_the_connection_cap_a_new_connection_evicts_the_longest_half_open_one(database_url, tmp_path):
    capped = start_server(database_url, tmp_path / "server.log", max_connections="50", header_timeout_s="30")
    try:
        with HealthProbe(capped.base_url) as probe:
            opened, answers, _ = half_open_connections(capped.port, 80, hold_s=10)
        assert opened == 80
        # the 30 oldest evicted (a few more to let the health probes in); the rest held until the client let go
        assert set(answers) <= {408, -1} and answers[408] >= 80 - 50 and answers[408] + answers[-1] == 80
        assert probe.failures == []  # health checks got in all along
    finally:
        capped.stop()


def test_past_the_connection_cap_with_every_connection_in_a_request_a_new_one_is_503(database_url, tmp_path, keys):
    capped = start_server(database_url, tmp_path / "server.log", max_connections="3", body_read_grace_s="30")
    held: list[socket.socket] = []
    try:
        for _ in range(3):  # requests whose bodies never come
            sock = socket.create_connection(("127.0.0.1", capped.port), timeout=10)
            sock.sendall(
                f"POST /v1/plans HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {keys[0]}\r\n"
                "Content-Type: application/json\r\nContent-Length: 100\r\n\r\n".encode()
            )
            held.append(sock)
        response = httpx.get(f"{capped.base_url}/healthz", timeout=10)
        assert response.status_code == 503 and response.headers["retry-after"] == "1"
        assert "HYPERPLACE_MAX_CONNECTIONS" in response.json()["detail"]
    finally:
        for sock in held:
            sock.close()
        capped.stop()


# ----------------------------------------------------------------------------- F5


def test_a_client_that_half_closes_mid_body_is_counted_as_499_not_a_server_error(server, keys):
    _during(server, keys, lambda: half_closed_body(server.port, keys[0]))
    wait_until(lambda: '"client disconnected"' in server.logs(), timeout_s=30)
    assert "unhandled error" not in server.logs()
    metrics = httpx.get(f"{server.base_url}/metrics", timeout=10).text
    assert 'route="/v1/plans",status="499"' in metrics
    assert 'status="500"' not in metrics


# ----------------------------------------------------------------------------- SIGTERM


def test_sigterm_stops_a_server_with_an_import_running_within_its_grace_period(database_url, tmp_path, keys):
    live = start_server(
        database_url,
        tmp_path / "server.log",
        shutdown_grace_s="2",
        onnx_import_timeout_s="600",
        max_graph_ops=str(2**30),
        log_level="INFO",
    )
    answers: list[int | None] = []
    try:
        post_onnx(live.base_url, keys[0], expanding_functions_onnx(1))  # the worker has started
        workers = children_of(live.pid)
        uploading = threading.Thread(
            target=lambda: answers.append(post_onnx(live.base_url, keys[0], expanding_functions_onnx(26), 120.0)[0])
        )
        uploading.start()
        wait_until(lambda: _busy(workers), 60)  # 2^26 operators: ONNX inference takes minutes
        live.process.send_signal(signal.SIGTERM)
        try:
            live.process.wait(2 + 10 + 10)  # grace, the hard stop after it, and slack for a loaded machine
        except subprocess.TimeoutExpired:
            pytest.fail(f"the server ignored SIGTERM: {live.logs()[-2000:]}")
        for pid in workers:
            wait_until(lambda pid=pid: not Path(f"/proc/{pid}").exists(), timeout_s=30)
        uploading.join(60)
        assert answers == [None]  # the import was still running: it was stopped, not answered
    finally:
        live.stop()


def _busy(pids: set[int]) -> bool:
    """Whether one of ``pids`` is running on a CPU now (state R)."""
    for pid in pids:
        try:
            if Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[1].startswith("R"):
                return True
        except OSError:
            pass
    return False
