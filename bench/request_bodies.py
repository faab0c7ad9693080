"""Peak server memory while several large JSON bodies arrive at once, with and without the body budget.

Run: ``.venv/bin/python -m bench.request_bodies [--clients 6] [--layers 256]`` (about a minute; 1.5 with ``--clients 10``).

Each client sends one valid ``POST /v1/moe/rebalance`` whose load matrix is ``--layers`` x
8,000 experts on 64 GPUs of 128 slots (512 layers is about ``HYPERPLACE_MOE_MAX_SLOTS``),
all at the same moment, to a real ``hyperplace serve``. The figure is the server's peak
resident memory (``VmHWM``) over its idle footprint, for

- the baseline, measured in the same run: the budget of bodies in flight
  (``HYPERPLACE_MAX_BODY_BYTES_IN_FLIGHT``) set far above the total, i.e. no budget;
- the default budget, with ``HYPERPLACE_BODY_WAIT_S`` raised so that every request is
  answered and both runs do the same work.

A single request is measured first, which shows the memory per body byte. The budget
trades memory for queueing: the wall time of both runs is printed too, and the longest
``/healthz`` answer while the bodies were handled (a thread holding the GIL in one long
C call, such as encoding a large answer, stalls every other request).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import threading
import time
from collections import Counter

import httpx
import numpy as np

from bench.server import running_server
from service.settings import Settings

EXPERTS, GPUS, SLOTS_PER_GPU = 8000, 64, 128
MIB = 1024 * 1024


def moe_body(layers: int, seed: int = 0) -> bytes:
    load = np.random.default_rng(seed).integers(1, 100_000, size=(layers, EXPERTS))
    return json.dumps(
        {
            "model": {"num_moe_layers": layers, "num_logical_experts": EXPERTS, "expert_bytes": 44_040_192},
            "cluster": {"num_nodes": GPUS // 8, "gpus_per_node": 8, "slots_per_gpu": SLOTS_PER_GPU},
            "load": load.tolist(),
        }
    ).encode()


def resident_bytes(pid: int, field: str) -> int:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {field} in /proc/{pid}/status")


def burst(body: bytes, clients: int, **settings: str) -> tuple[float, float, float, Counter]:
    """Peak memory over idle (bytes), wall seconds, the longest ``/healthz`` answer meanwhile
    (seconds) and the status counts of ``clients`` simultaneous posts."""
    statuses: Counter = Counter()
    health_s: list[float] = []
    with (
        tempfile.TemporaryDirectory() as tmp,
        running_server(f"sqlite:///{tmp}/bench.sqlite", auto_migrate="true", **settings) as (base, process),
    ):
        idle = resident_bytes(process.pid, "VmRSS")
        start = threading.Barrier(clients)

        def post() -> None:
            start.wait()
            try:
                response = httpx.post(
                    f"{base}/v1/moe/rebalance", content=body, headers={"content-type": "application/json"}, timeout=900
                )
                statuses[response.status_code] += 1
            except httpx.HTTPError as error:
                statuses[type(error).__name__] += 1

        done = threading.Event()

        def probe_health() -> None:
            with httpx.Client(timeout=60) as probe:
                while not done.is_set():
                    asked = time.monotonic()
                    probe.get(f"{base}/healthz")
                    health_s.append(time.monotonic() - asked)
                    done.wait(0.05)

        threads = [threading.Thread(target=post) for _ in range(clients)]
        prober = threading.Thread(target=probe_health)
        began = time.monotonic()
        prober.start()
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        wall_s = time.monotonic() - began
        done.set()
        prober.join()
        peak = resident_bytes(process.pid, "VmHWM")
    return peak - idle, wall_s, max(health_s), statuses


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--clients", type=int, default=6)
    parser.add_argument("--layers", type=int, default=256)
    args = parser.parse_args()
    body = moe_body(args.layers)
    budget = Settings.model_fields["max_body_bytes_in_flight"].default
    print(
        f"== {args.clients} simultaneous MoE rebalances of {args.layers} x {EXPERTS} "
        f"({len(body) / MIB:.1f} MiB of JSON each, {args.clients * len(body) / MIB:.0f} MiB in all) =="
    )
    one, one_s, one_health_s, _ = burst(body, 1)
    print(
        f"one request alone: peak +{one / MIB:,.0f} MiB ({one / len(body):.0f}x its body), {one_s:.1f} s, "
        f"longest /healthz meanwhile {one_health_s * 1000:.0f} ms"
    )
    rows = [
        ("no budget (baseline)", {"max_body_bytes_in_flight": str(2**40)}),
        (f"budget {budget / MIB:.0f} MiB (default)", {"body_wait_s": "900"}),
    ]
    results = []
    for label, settings in rows:
        peak, wall_s, health_s, statuses = burst(body, args.clients, **settings)
        results.append(peak)
        answered = ", ".join(f"{count} x {status}" for status, count in sorted(statuses.items(), key=str))
        print(
            f"{label:<28} peak +{peak / MIB:>7,.0f} MiB   wall {wall_s:6.1f} s   longest /healthz "
            f"{health_s * 1000:5.0f} ms   answers: {answered}"
        )
    print(f"peak memory with the default budget: {results[1] / results[0]:.2f}x the baseline's")


if __name__ == "__main__":
    main()
