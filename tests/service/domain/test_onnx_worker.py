"""ONNX imports run in worker processes whose address space is capped: what the importer
returns or raises comes back unchanged, a model that needs more memory than the cap is
refused, and a worker that dies takes only its own import with it."""

from __future__ import annotations

import dataclasses
import os
import signal
import threading
from pathlib import Path

import anyio
import numpy as np
import pytest
from onnx import TensorProto, helper

from partitioners.errors import InputTooLarge, InvalidInput
from partitioners.graph.onnx_import import graph_from_onnx_bytes
from service.domain import onnx_worker
from service.domain.ingest import ingest_onnx_graph
from service.domain.onnx_worker import OnnxImportPool
from service.errors import ServerBusy
from tests.service.live_server import wait_until

# The workers import this module, under their cap, to run the stand-in tasks below:
# what only a test needs (the app, its client) is imported in that test.
ONNX_DIR = Path(__file__).resolve().parents[2] / "fixtures" / "onnx"
#: The fixtures need at most 23 MiB over a worker's start-up footprint.
SMALL_CAP_BYTES = 64 * 2**20


def rank_doubling_gather_chain(length: int) -> bytes:
    """``Gather(x, x)`` ``length`` times from a [1, 1] input: rank 2**length + 1 at the end.

    A few hundred bytes; ONNX shape inference's memory doubles with every operator
    (an import of 18 takes about 60 MiB, 20 about 220 MiB, 26 more than most machines have).
    """
    nodes = [helper.make_node("Gather", [f"t{i}", f"t{i}"], [f"t{i + 1}"]) for i in range(length)]
    graph = helper.make_graph(
        nodes,
        "gather-chain",
        [helper.make_tensor_value_info("t0", TensorProto.INT64, [1, 1])],
        [helper.make_tensor_value_info(f"t{length}", TensorProto.INT64, None)],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()


# Tasks that stand in for the import in the worker (looked up there by module and name).


def _die_mid_import(data, dims, max_ops):
    os.kill(os.getpid(), signal.SIGKILL)


def _worker_pid(data, dims, max_ops) -> int:
    return os.getpid()


def _allocate_twice_the_cap(data, dims, max_ops):
    bytearray(2 * SMALL_CAP_BYTES)


@pytest.fixture(scope="module")
def pool():
    pool = OnnxImportPool(SMALL_CAP_BYTES, workers=1)
    yield pool
    pool.close()


def test_a_graph_imported_in_a_worker_is_the_graph_imported_in_process(pool):
    data = (ONNX_DIR / "resnet50.onnx").read_bytes()
    dims = {"batch": 2, "sequence": 8}  # 'sequence' names no dimension: a warning
    in_process = graph_from_onnx_bytes(data, dims=dims, max_ops=None)
    in_worker = pool.import_graph(data, dims=dims, max_ops=None)
    assert in_worker.warnings == in_process.warnings and in_worker.warnings
    for field in dataclasses.fields(in_process):
        expected, got = getattr(in_process, field.name), getattr(in_worker, field.name)
        if isinstance(expected, np.ndarray):
            assert got.dtype == expected.dtype and np.array_equal(got, expected), field.name
        else:
            assert got == expected, field.name


@pytest.mark.parametrize(
    ("fixture", "dims", "max_ops", "error"),
    [
        ("lstm_seq2seq", {}, None, InvalidInput),  # unbound-dim
        ("gpt2", {"batch": 1, "sequence": 100_000_000}, None, InvalidInput),  # absurd-size
        ("resnet50", {"batch": 1}, 3, InputTooLarge),  # too-many-ops
    ],
)
def test_the_importers_errors_come_back_from_the_worker_with_their_field_code_and_detail(
    pool, fixture, dims, max_ops, error
):
    data = (ONNX_DIR / f"{fixture}.onnx").read_bytes()
    with pytest.raises(error) as in_process:
        graph_from_onnx_bytes(data, dims=dims, max_ops=max_ops)
    with pytest.raises(error) as in_worker:
        pool.import_graph(data, dims=dims, max_ops=max_ops)
    assert type(in_worker.value) is type(in_process.value)
    assert (in_worker.value.field, in_worker.value.code, in_worker.value.detail) == (
        in_process.value.field,
        in_process.value.code,
        in_process.value.detail,
    )


def test_an_import_that_needs_more_than_the_cap_is_refused_as_too_large_naming_the_setting(pool, monkeypatch):
    monkeypatch.setattr(onnx_worker, "_import_in_worker", _allocate_twice_the_cap)
    with pytest.raises(InputTooLarge) as refused:
        pool.import_graph(b"model", dims={}, max_ops=None)
    assert (refused.value.field, refused.value.code) == ("model", "import-memory")
    assert "more than 64 MiB" in refused.value.detail and "HYPERPLACE_ONNX_IMPORT_MEMORY_BYTES" in refused.value.detail


def test_a_rank_doubling_gather_chain_over_the_cap_is_refused_naming_the_setting(pool):
    with pytest.raises(InvalidInput) as refused:  # 413 import-memory, or 422 import-crashed when ONNX died of it
        pool.import_graph(rank_doubling_gather_chain(20), dims={}, max_ops=None)
    assert refused.value.code in ("import-memory", "import-crashed")
    assert "HYPERPLACE_ONNX_IMPORT_MEMORY_BYTES" in refused.value.detail
    assert len(pool.import_graph(rank_doubling_gather_chain(4), dims={}, max_ops=None).op_names) == 4


def test_a_worker_that_dies_mid_import_fails_that_import_and_the_next_gets_a_new_worker(pool, monkeypatch):
    first = pool.import_graph(
        (ONNX_DIR / "lstm_seq2seq.onnx").read_bytes(), dims={"batch": 1, "source": 4, "target": 3}, max_ops=None
    )
    monkeypatch.setattr(onnx_worker, "_import_in_worker", _die_mid_import)
    with pytest.raises(InvalidInput) as refused:
        pool.import_graph(b"model", dims={}, max_ops=None)
    assert refused.value.code == "import-crashed" and refused.value.field == "model"
    monkeypatch.undo()
    again = pool.import_graph(
        (ONNX_DIR / "lstm_seq2seq.onnx").read_bytes(), dims={"batch": 1, "source": 4, "target": 3}, max_ops=None
    )
    assert list(again.op_names) == list(first.op_names)


def test_a_worker_killed_while_idle_is_replaced_without_failing_the_next_import(pool, monkeypatch):
    monkeypatch.setattr(onnx_worker, "_import_in_worker", _worker_pid)
    pid = pool.import_graph(b"model", dims={}, max_ops=None)
    monkeypatch.undo()
    os.kill(pid, signal.SIGKILL)
    graph = pool.import_graph(rank_doubling_gather_chain(3), dims={}, max_ops=None)
    assert len(graph.op_names) == 3


def test_a_zero_cap_imports_in_this_process(monkeypatch):
    monkeypatch.setattr(onnx_worker, "_import_in_worker", _die_mid_import)  # a worker would die
    ingested = ingest_onnx_graph(rank_doubling_gather_chain(3), dims={}, max_ops=10, memory_bytes=0)
    assert ingested.source_format == "onnx" and len(ingested.graph.op_names) == 3


def test_an_apps_import_workers_stop_when_the_app_stops(database_url, monkeypatch):
    from fastapi.testclient import TestClient

    from service.app import create_app
    from tests.conftest import make_settings

    cap_bytes = 96 * 2**20  # a cap no other app in the tests uses: its own pool
    with TestClient(create_app(make_settings(database_url, onnx_import_memory_bytes=cap_bytes))):
        monkeypatch.setattr(onnx_worker, "_import_in_worker", _worker_pid)
        pid = onnx_worker.import_onnx_graph(b"model", dims={}, max_ops=None)  # the app's cap by default
        os.kill(pid, 0)  # running
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


# ------------------------------------------------------------------ time limits and cancellation


def _sleep_forever(data, dims, max_ops):
    import time

    while True:
        time.sleep(1)


def _counting_sleep(data, dims, max_ops):
    """Record this run in the file ``data`` names, then never finish."""
    with open(data, "a") as runs:
        runs.write(f"{os.getpid()}\n")
    _sleep_forever(data, dims, max_ops)


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return Path(f"/proc/{pid}/stat").read_text().split(") ")[1].startswith("Z")


def test_an_import_past_its_time_limit_is_refused_naming_the_setting_and_its_worker_killed_not_retried(
    monkeypatch, tmp_path
):
    pool = OnnxImportPool(SMALL_CAP_BYTES, workers=1, timeout_s=3.0)  # counted from the worker's start-up on
    runs = tmp_path / "runs"
    try:
        monkeypatch.setattr(onnx_worker, "_import_in_worker", _counting_sleep)
        with pytest.raises(InputTooLarge) as refused:
            pool.import_graph(str(runs), dims={}, max_ops=None)
        assert (refused.value.field, refused.value.code) == ("model", "import-timeout")
        assert "HYPERPLACE_ONNX_IMPORT_TIMEOUT_S" in refused.value.detail
        (pid,) = map(int, runs.read_text().split())  # one run: not tried again
        wait_until(lambda: _gone(pid), timeout_s=30)
        monkeypatch.undo()
        assert len(pool.import_graph(rank_doubling_gather_chain(3), dims={}, max_ops=None).op_names) == 3
    finally:
        pool.close()


def test_a_cancelled_import_kills_its_worker(monkeypatch, tmp_path):
    pool = OnnxImportPool(SMALL_CAP_BYTES, workers=1, timeout_s=600)
    runs = tmp_path / "runs"
    monkeypatch.setattr(onnx_worker, "_import_in_worker", _counting_sleep)

    async def cancel_once_running() -> None:
        async with anyio.create_task_group() as group:
            group.start_soon(lambda: pool.import_graph_async(str(runs), dims={}, max_ops=None))
            while not runs.exists():
                await anyio.sleep(0.05)
            group.cancel_scope.cancel()

    try:
        anyio.run(cancel_once_running)
        (pid,) = map(int, runs.read_text().split())
        wait_until(lambda: _gone(pid), timeout_s=30)
    finally:
        pool.close()


def test_an_import_that_finds_every_worker_busy_waits_then_is_503_with_retry_after(monkeypatch, tmp_path):
    pool = OnnxImportPool(SMALL_CAP_BYTES, workers=1, timeout_s=600, wait_s=0.5)
    runs = tmp_path / "runs"
    monkeypatch.setattr(onnx_worker, "_import_in_worker", _counting_sleep)

    async def second_while_first_runs() -> ServerBusy:
        async with anyio.create_task_group() as group:
            group.start_soon(lambda: pool.import_graph_async(str(runs), dims={}, max_ops=None))
            while not runs.exists():
                await anyio.sleep(0.05)
            with pytest.raises(ServerBusy) as busy:
                await pool.import_graph_async(b"model", dims={}, max_ops=None)
            group.cancel_scope.cancel()
        return busy.value

    try:
        busy = anyio.run(second_while_first_runs)
        assert busy.status == 503 and busy.headers["Retry-After"] == "1" and "ONNX imports" in busy.detail
    finally:
        pool.close()


def test_closing_the_pool_kills_an_import_still_running_which_ends_with_503_not_a_second_try(monkeypatch, tmp_path):
    pool = OnnxImportPool(SMALL_CAP_BYTES, workers=1, timeout_s=600)
    runs = tmp_path / "runs"
    monkeypatch.setattr(onnx_worker, "_import_in_worker", _counting_sleep)
    outcome: list[BaseException] = []

    def import_in_a_thread() -> None:
        try:
            pool.import_graph(str(runs), dims={}, max_ops=None)
        except BaseException as exc:
            outcome.append(exc)

    thread = threading.Thread(target=import_in_a_thread)
    thread.start()
    wait_until(runs.exists, timeout_s=60)
    (pid,) = map(int, runs.read_text().split())
    pool.close()
    assert _gone(pid)
    thread.join(60)
    assert isinstance(outcome[0], ServerBusy) and outcome[0].status == 503
    assert len(runs.read_text().split()) == 1
