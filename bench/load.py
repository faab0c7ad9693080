"""Loopback load test: a real ``hyperplace serve`` on PostgreSQL under mixed traffic.

Run: ``.venv/bin/python -m bench.load [--duration-s 20] [--clients 8] [--max-requests 20000]``
(or ``--database-url postgresql+psycopg://...`` to use a database you started;
without one the script re-runs itself under ``scripts/with-postgres.sh``, which
starts a throwaway PostgreSQL 15 and deletes it afterwards).

The script migrates the database, issues an API key, starts ``python -m
service.cli serve`` on a free loopback port, and for a fixed duration (and at
most ``--max-requests`` requests) runs ``--clients`` threads, each with its own
keep-alive connection, sending this mix at the same time:

- ``POST /v1/plans``: small graphs (a 4-operator fork-join, or a 60-operator
  synthetic graph), a new seed each time (so each is planned, not served from
  the cache), and one in five a repeat of an earlier request (served from the store);
- ``GET /v1/plans/{plan_id}``: reads of plans created so far (summary or full);
- ``POST /v1/moe/rebalance``: a load report for the client's own deployment
  (8 layers x 64 experts on 2 x 8 GPUs), the stored placement updated each time.

It prints throughput, p50/p99 latency per route and the error count (any
non-2xx answer or transport error; it must be 0), then stops the server and
exits non-zero if there was an error. Nothing leaves 127.0.0.1.
"""

from __future__ import annotations

import argparse
import os
import random
import subprocess
import sys
import threading
import time
from collections import defaultdict
from pathlib import Path

import httpx
import numpy as np

from bench.server import ServerFailed, running_server

REPO = Path(__file__).parents[1]
SECRET = "bench-load-secret"

__all__ = ["main"]


class Recorder:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.latency_s: dict[str, list[float]] = defaultdict(list)
        self.errors: dict[str, list[str]] = defaultdict(list)
        self.count = 0
        self.plan_ids: list[str] = []
        self.submissions: list[dict] = []

    def record(self, route: str, elapsed_s: float, error: str | None) -> None:
        with self.lock:
            self.count += 1
            self.latency_s[route].append(elapsed_s)
            if error:
                self.errors[route].append(error)


def _client_loop(
    base_url: str, api_key: str, index: int, deadline: float, max_requests: int, rec: Recorder, graphs: dict
) -> None:
    rng = random.Random(index)
    load_rng = np.random.default_rng(index)
    deployment = f"load-{index}"
    moe_first = {
        "deployment": deployment,
        "model": {"num_moe_layers": 8, "num_logical_experts": 64},
        "cluster": {"num_nodes": 2, "gpus_per_node": 8, "slots_per_gpu": 5},
    }
    moe_started = False
    seed = index * 1_000_000
    with httpx.Client(base_url=base_url, headers={"Authorization": f"Bearer {api_key}"}, timeout=120) as client:
        while time.monotonic() < deadline:
            with rec.lock:
                if rec.count >= max_requests:
                    return
                known = list(rec.plan_ids[-200:])
                earlier = rng.choice(rec.submissions) if rec.submissions else None
            draw = rng.random()
            if draw < 0.4 or not known:
                route = "POST /v1/plans"
                if earlier is not None and rng.random() < 0.2:
                    body = earlier
                else:
                    seed += 1
                    graph = graphs["diamond"] if rng.random() < 0.7 else graphs["synthetic"]
                    body = {
                        "graph": graph,
                        "inventory": {"preset": "dgx-h100", "nodes": 1},
                        "options": {"seed": seed % (2**31 - 1)},
                    }
                request = ("POST", "/v1/plans", {"json": body})
                expected = (200, 201)
            elif draw < 0.8:
                route = "GET /v1/plans/{plan_id}"
                detail = "summary" if rng.random() < 0.5 else "full"
                request = ("GET", f"/v1/plans/{rng.choice(known)}", {"params": {"detail": detail}})
                expected = (200,)
            else:
                route = "POST /v1/moe/rebalance"
                load = load_rng.zipf(1.6, size=(8, 64)).clip(max=1e6).astype(float).tolist()
                body = {**moe_first, "load": load} if not moe_started else {"deployment": deployment, "load": load}
                request = ("POST", "/v1/moe/rebalance", {"json": body})
                expected = (200,)
            method, url, kwargs = request
            started = time.perf_counter()
            error = None
            try:
                response = client.request(method, url, **kwargs)
                if response.status_code not in expected:
                    error = f"{response.status_code} {response.text[:200]}"
            except httpx.HTTPError as exc:
                error = f"{type(exc).__name__}: {exc}"
                response = None
            elapsed_s = time.perf_counter() - started
            rec.record(route, elapsed_s, error)
            if error is None and route == "POST /v1/plans":
                with rec.lock:
                    rec.plan_ids.append(response.json()["id"])
                    rec.submissions.append(kwargs["json"])
            if error is None and route == "POST /v1/moe/rebalance":
                moe_started = True


def _peak_rss_mb(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def run(database_url: str, duration_s: float, clients: int, max_requests: int, workers: int) -> int:
    from service.storage.db import make_engine, make_session_factory
    from service.storage.migrate import upgrade_to_head
    from service.storage.tenants import get_or_create_tenant, issue_api_key

    engine = make_engine(database_url)
    upgrade_to_head(engine)
    with make_session_factory(engine)() as session, session.begin():
        api_key = issue_api_key(
            session, get_or_create_tenant(session, f"load-{os.getpid()}-{time.time_ns()}"), SECRET
        ).api_key
    engine.dispose()

    try:
        with running_server(
            database_url, workers=workers, auth="required", api_key_secret=SECRET, embedded_worker="false"
        ) as (
            base_url,
            server,
        ):
            rec, wall_s = _drive(base_url, api_key, duration_s, clients, max_requests)
            _report(rec, wall_s, clients, workers, database_url, _peak_rss_mb(server.pid))
    except ServerFailed as exc:
        print(exc, file=sys.stderr)
        return 2
    return 1 if sum(len(v) for v in rec.errors.values()) else 0


def _drive(base_url: str, api_key: str, duration_s: float, clients: int, max_requests: int) -> tuple[Recorder, float]:
    """Warm up, then run the client threads until the deadline; ``(recorder, wall seconds)``."""
    from partitioners.graph.generators import diamond_graph_json, synthetic_graph_json

    graphs = {"diamond": diamond_graph_json("load-diamond"), "synthetic": synthetic_graph_json(60, seed=7)}
    rec = Recorder()
    # Warm-up: one of each, not counted (imports, first connections, the MoE deployment).
    warm = Recorder()
    _client_loop(base_url, api_key, 10_000, time.monotonic() + 2.0, 20, warm, graphs)
    started = time.monotonic()
    threads = [
        threading.Thread(
            target=_client_loop, args=(base_url, api_key, i, started + duration_s, max_requests, rec, graphs)
        )
        for i in range(clients)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return rec, time.monotonic() - started


def _report(rec: Recorder, wall_s: float, clients: int, workers: int, database_url: str, rss_mb: float | None) -> None:
    errors = sum(len(v) for v in rec.errors.values())
    dialect = database_url.split(":", 1)[0]
    load1, _, _ = os.getloadavg()
    print(
        f"hyperplace load test: {clients} clients, {workers} server worker(s), {dialect}, {wall_s:.1f} s wall, "
        f"{os.cpu_count()} CPUs, 1-min load average {load1:.1f} at the end (the clients share the machine)"
    )
    print(f"{'route':<28} {'requests':>9} {'req/s':>8} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8} {'errors':>7}")
    for route in sorted(rec.latency_s):
        samples = np.asarray(rec.latency_s[route]) * 1000
        p50, p99 = np.percentile(samples, [50, 99])
        print(
            f"{route:<28} {samples.size:>9} {samples.size / wall_s:>8.1f} {p50:>8.1f} {p99:>8.1f} {samples.max():>8.1f} {len(rec.errors[route]):>7}"
        )
    print(f"{'all':<28} {rec.count:>9} {rec.count / wall_s:>8.1f} {'':>8} {'':>8} {'':>8} {errors:>7}")
    if rss_mb is not None:
        print(
            f"server process peak RSS: {rss_mb:.0f} MiB (the uvicorn parent; workers are separate processes)"
            if workers > 1
            else f"server peak RSS: {rss_mb:.0f} MiB"
        )
    for route, messages in rec.errors.items():
        for message in messages[:5]:
            print(f"error {route}: {message}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--database-url",
        default=None,
        help="PostgreSQL URL (default: a throwaway cluster via scripts/with-postgres.sh)",
    )
    parser.add_argument("--duration-s", type=float, default=20.0)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--max-requests", type=int, default=20_000)
    parser.add_argument("--workers", type=int, default=1, help="uvicorn worker processes")
    args = parser.parse_args(argv)
    if not 0 < args.duration_s <= 600 or not 0 < args.clients <= 64 or not 0 < args.max_requests <= 1_000_000:
        parser.error("duration 0-600 s, clients 1-64, max-requests up to 10^6")
    url = args.database_url or os.environ.get("HYPERPLACE_TEST_POSTGRES_URL")
    if url is None:
        # Re-run under a throwaway PostgreSQL that the wrapper deletes afterwards.
        command = [
            str(REPO / "scripts" / "with-postgres.sh"),
            sys.executable,
            "-m",
            "bench.load",
            *(argv if argv is not None else sys.argv[1:]),
        ]
        return subprocess.call(command, cwd=REPO)
    return run(url, args.duration_s, args.clients, args.max_requests, args.workers)


if __name__ == "__main__":
    raise SystemExit(main())
