"""MoE rebalancing through HTTP: latency per call and a bounded concurrent load test.

Run: ``.venv/bin/python -m bench.moe_http [--seconds 30] [--clients 8]``

Starts ``hyperplace serve`` (uvicorn, embedded SQLite, authentication off) on a
free loopback port, then

1. sends deployment reports one after another (each a fresh multinomial sample of
   the same popularity, so the server runs the incremental path against the stored
   placement) and prints p50/p99 latency, for DeepSeek-V3 shapes (58 layers x 256
   experts, 64 GPUs, 5 slots per GPU) and 512 experts x 128 GPUs;
2. runs ``--clients`` concurrent clients for ``--seconds`` against the 256 x 64
   shape (stateless calls with the current placement in the body) and prints
   throughput, p50/p99 and the error count.

The baseline measured in the same run is the in-process call of
``partitioners.moe.rebalance.rebalance`` on the same inputs: the difference is what HTTP,
validation, JSON and the database cost. Loopback only; every loop is bounded in
count and time.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import threading
import time

import httpx
import numpy as np

from bench.moe import GPUS_PER_NODE, popularity, sample
from bench.server import running_server
from partitioners.moe.rebalance import rebalance


def _percentile(values: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(values), q)) if values else float("nan")


def _request(load: np.ndarray, num_gpus: int, slots_per_gpu: int, deployment: str | None = None, current=None) -> dict:
    body = {
        "model": {"num_moe_layers": load.shape[0], "num_logical_experts": load.shape[1], "expert_bytes": 44_040_192},
        "cluster": {
            "num_nodes": num_gpus // GPUS_PER_NODE,
            "gpus_per_node": GPUS_PER_NODE,
            "slots_per_gpu": slots_per_gpu,
        },
        "load": load.tolist(),
    }
    if deployment:
        body["deployment"] = deployment
    if current is not None:
        body["current_placement"] = {"physical_to_logical": current}
    return body


def latency(base: str, layers: int, experts: int, num_gpus: int, calls: int, seed: int) -> str:
    slots_per_gpu = experts // num_gpus + 1
    rng = np.random.default_rng(seed)
    pop = popularity(layers, experts, rng)
    loads = [sample(pop, rng) for _ in range(calls + 1)]
    name = f"bench-{experts}x{num_gpus}-{seed}"
    http_ms, inprocess_ms, moved = [], [], []
    with httpx.Client(base_url=base, timeout=30) as client:
        first = client.post("/v1/moe/rebalance", json=_request(loads[0], num_gpus, slots_per_gpu, name))
        first.raise_for_status()
        current = np.asarray(first.json()["physical_to_logical"])
        for load in loads[1:]:
            started = time.perf_counter()
            response = client.post("/v1/moe/rebalance", json=_request(load, num_gpus, slots_per_gpu, name))
            http_ms.append((time.perf_counter() - started) * 1000)
            response.raise_for_status()
            moved.append(response.json()["slots_moved_fraction"])
            started = time.perf_counter()
            rebalance(
                load,
                num_nodes=num_gpus // GPUS_PER_NODE,
                gpus_per_node=GPUS_PER_NODE,
                slots_per_gpu=slots_per_gpu,
                current_physical_to_logical=current,
                expert_bytes=44_040_192,
            )
            inprocess_ms.append((time.perf_counter() - started) * 1000)
    return (
        f"{experts:>4}x{num_gpus:<4} {layers:>3} layers  HTTP p50 {_percentile(http_ms, 50):6.1f} ms  p99 {_percentile(http_ms, 99):6.1f} ms"
        f"   in-process p50 {_percentile(inprocess_ms, 50):6.1f} ms  p99 {_percentile(inprocess_ms, 99):6.1f} ms"
        f"   slots moved mean {100 * statistics.fmean(moved):.2f}%  ({calls} calls)"
    )


def load_test(base: str, clients: int, seconds: float, seed: int) -> str:
    layers, experts, num_gpus = 58, 256, 64
    slots_per_gpu = experts // num_gpus + 1
    rng = np.random.default_rng(seed)
    pop = popularity(layers, experts, rng)
    bodies = [sample(pop, rng) for _ in range(16)]
    with httpx.Client(base_url=base, timeout=30) as client:
        current = client.post("/v1/moe/rebalance", json=_request(bodies[0], num_gpus, slots_per_gpu)).json()[
            "physical_to_logical"
        ]
    requests = [_request(load, num_gpus, slots_per_gpu, current=current) for load in bodies]
    latencies: list[float] = []
    errors = [0]
    lock = threading.Lock()
    stop_at = time.monotonic() + seconds

    def worker(index: int) -> None:
        with httpx.Client(base_url=base, timeout=30) as client:
            k = index
            while time.monotonic() < stop_at:
                started = time.perf_counter()
                try:
                    ok = client.post("/v1/moe/rebalance", json=requests[k % len(requests)]).status_code == 200
                except httpx.HTTPError:
                    ok = False
                elapsed = (time.perf_counter() - started) * 1000
                with lock:
                    latencies.append(elapsed)
                    errors[0] += 0 if ok else 1
                k += clients

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(clients)]
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(seconds + 60)
    wall = time.perf_counter() - started
    return (
        f"load test: {clients} clients x {seconds:.0f} s, 256x64x58: {len(latencies)} requests, "
        f"{len(latencies) / wall:.1f} req/s, p50 {_percentile(latencies, 50):.1f} ms, p99 {_percentile(latencies, 99):.1f} ms, "
        f"errors {errors[0]}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=40)
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as workdir:
        database_url = f"sqlite:///{workdir}/bench.sqlite3"
        with running_server(database_url, auth="disabled", auto_migrate="true") as (base, _process):
            print(latency(base, 58, 256, 64, args.calls, args.seed))
            print(latency(base, 58, 512, 128, args.calls, args.seed))
            print(load_test(base, args.clients, args.seconds, args.seed))


if __name__ == "__main__":
    main()
