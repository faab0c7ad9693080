"""Issue 55's hostile clients against a real ``hyperplace serve``: each case's answer, how long
it took, and the worst ``/healthz`` latency meanwhile.

Run: ``.venv/bin/python -m bench.hostile`` (about a minute on a 2-core machine).

The server runs with the production limits (service/settings.py defaults), except that
an ONNX import may take 10 s (``HYPERPLACE_ONNX_IMPORT_TIMEOUT_S``, 120 s in production)
and a graph may expand to 2^24 operators (``HYPERPLACE_MAX_GRAPH_OPS``), so that the
2^23-operator model below reaches the time limit instead of the operator count. The
baseline row is ``/healthz`` probed the same way with nothing else running, in the same
run. Every ``/healthz`` probe opens a new connection, every 0.1 s; "other tenant" is a
small JSON plan submitted by a second tenant while the case runs.
"""

from __future__ import annotations

import argparse
import signal
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

from bench.server import running_server
from service.server import raise_descriptor_limit
from service.settings import Settings
from service.storage.db import make_engine, make_session_factory
from service.storage.migrate import upgrade_to_head
from service.storage.tenants import get_or_create_tenant, issue_api_key
from tests.service.graphs import diamond_graph, plan_request
from tests.service.hostile_clients import (
    HealthProbe,
    expanding_functions_onnx,
    half_closed_body,
    half_open_connections,
    oversized_header,
    post_onnx,
    slow_body,
    usage,
)

SECRET = "bench-secret"


def _key(session_factory, name: str) -> str:
    with session_factory() as session, session.begin():
        tenant = get_or_create_tenant(session, name)
        return issue_api_key(session, tenant, SECRET, scopes=("read", "write")).api_key


def _other_tenant(base_url: str, key: str, seed: int) -> int:
    import httpx

    body = plan_request(diamond_graph(), seed=seed)
    return httpx.post(
        f"{base_url}/v1/plans", json=body, headers={"Authorization": f"Bearer {key}"}, timeout=60
    ).status_code


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--connections", type=int, default=3000, help="half-open connections (F4; above the 2,048 cap by default)"
    )
    parser.add_argument("--floods", type=int, default=3, help="F4 repeated this often at the end, memory after each")
    args = parser.parse_args()
    raise_descriptor_limit()  # this process holds the half-open connections' other ends
    with tempfile.TemporaryDirectory() as directory:
        url = f"sqlite:///{Path(directory) / 'bench.sqlite3'}"
        engine = make_engine(url)
        upgrade_to_head(engine)
        session_factory = make_session_factory(engine)
        attacker, other = _key(session_factory, "attacker"), _key(session_factory, "other")
        settings = dict(auth="required", api_key_secret=SECRET, onnx_import_timeout_s="10", max_graph_ops=str(2**24))
        with running_server(url, **settings) as (base_url, process):
            port = int(base_url.rsplit(":", 1)[1])
            post_onnx(base_url, attacker, expanding_functions_onnx(1))  # start the import workers
            _other_tenant(base_url, other, 0)
            defaults = Settings.model_fields
            print(
                f"server limits: head {defaults['max_header_bytes'].default} B in "
                f"{defaults['header_timeout_s'].default:g} s, body {defaults['body_min_bytes_per_s'].default} B/s "
                f"after {defaults['body_read_grace_s'].default:g} s, import 10 s, operators 2^24"
            )
            cases: list[tuple[str, Callable[[], object]]] = [
                ("no attack (baseline)", lambda: time.sleep(3) or ("-", 3.0)),
                ("F1 functions 2^40 ops", lambda: post_onnx(base_url, attacker, expanding_functions_onnx(40))),
                ("F1 2^23 ops, import timeout", lambda: post_onnx(base_url, attacker, expanding_functions_onnx(23))),
                (
                    "F1 client gives up after 1 s",
                    lambda: post_onnx(base_url, attacker, expanding_functions_onnx(23), 1.0),
                ),
                ("F2 64 MiB header", lambda: oversized_header(port, 64 * 2**20)),
                ("F3 64 MiB body at 1 B/s", lambda: slow_body(port, attacker)),
                (
                    f"F4 {args.connections} half-open connections",
                    lambda: half_open_connections(port, args.connections, 60),
                ),
                ("F5 half-closed body", lambda: half_closed_body(port, attacker)),
            ]
            start = usage(process.pid)
            print(f"server at start: {start.rss_bytes / 2**20:.0f} MiB resident, {start.descriptors} descriptors")
            print(
                f"{'case':<34} {'answer':>10} {'time_s':>7} {'healthz_worst_ms':>17} {'probes':>7} {'other_tenant':>13}"
            )
            for seed, (label, attack) in enumerate(cases, start=1):
                outcome: list[object] = []
                with HealthProbe(base_url) as probe:
                    thread = threading.Thread(target=lambda attack=attack, outcome=outcome: outcome.append(attack()))
                    thread.start()
                    other_status = _other_tenant(base_url, other, seed)
                    thread.join()
                result = outcome[0]
                if isinstance(result[1], dict):  # F4: (opened, answers by status, seconds)
                    answer, answer_s = "+".join(f"{n}x{status}" for status, n in result[1].items()), result[2]
                else:  # (status, seconds, ...)
                    answer, answer_s = ("none" if result[0] is None else result[0]), result[1]
                failed = f" ({len(probe.failures)} failed)" if probe.failures else ""
                print(
                    f"{label:<34} {answer!s:>10} {answer_s:>7.2f} {probe.worst_s * 1000:>17.0f} "
                    f"{len(probe.latencies_s):>7}{failed} {other_status:>13}"
                )
            time.sleep(5)
            end = usage(process.pid)
            print(f"server at end: {end.rss_bytes / 2**20:.0f} MiB resident, {end.descriptors} descriptors")
            after = []
            for _ in range(args.floods):  # memory the first flood took stays with the allocator: is it reused?
                half_open_connections(port, args.connections, 60)
                time.sleep(2)
                after.append(f"{usage(process.pid).rss_bytes / 2**20:.0f}")
            if after:
                print(f"resident MiB after {args.floods} more floods of {args.connections}: {', '.join(after)}")
        grace_s = Settings.model_fields["shutdown_grace_s"].default
        # 2^26 operators: an import that takes minutes
        long_import = {**settings, "onnx_import_timeout_s": "600", "max_graph_ops": str(2**30)}
        with running_server(url, **long_import) as (base_url, process):
            post_onnx(base_url, attacker, expanding_functions_onnx(1))
            upload = threading.Thread(target=post_onnx, args=(base_url, attacker, expanding_functions_onnx(26), 120.0))
            upload.start()
            time.sleep(2)  # the import runs
            started = time.perf_counter()
            process.send_signal(signal.SIGTERM)
            process.wait(grace_s + 60)
            print(
                f"SIGTERM with an import running: exited {time.perf_counter() - started:.1f} s later "
                f"(HYPERPLACE_SHUTDOWN_GRACE_S {grace_s:g} s, hard stop 10 s after), exit status {process.returncode}"
            )
            upload.join()
        engine.dispose()


if __name__ == "__main__":
    main()
