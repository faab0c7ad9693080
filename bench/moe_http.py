"""MoE rebalancing through HTTP: latency per kind of call, answer sizes, and a bounded load test.

Run: ``.venv/bin/python -m bench.moe_http [--calls 30] [--seconds 30] [--clients 8]``

Starts ``hyperplace serve`` (uvicorn, embedded SQLite, authentication off) on a
free loopback port, then

1. plays a serving runtime against one deployment per shape (DeepSeek-V3: 58 layers x
   256 experts, 64 and 32 GPUs of 5 and 9 slots): a first report with model and cluster
   (``fresh``, five new deployments), then load-only reports, each naming the placement version it runs:
   ``unchanged`` (a new multinomial sample of the same popularity), ``drift`` (10% of
   the experts trade popularity, a new drift each call, applied and confirmed), and
   ``failure`` / ``return`` pairs (GPU ``k`` unavailable, then back, sent as the
   cluster). It prints p50/p99 latency, answer bytes, churn, balance, and for
   failures the copies written per expert lost and how many calls wrote more than the
   issue's bound (``>cap``: 1.5 x lost experts + the answer's ``budget.repair_budget``), per kind of call;
2. runs ``--clients`` concurrent clients for ``--seconds`` against the 256 x 64
   shape (stateless calls with the current placement in the body) and prints
   throughput, p50/p99 and the error count.

Baselines measured in the same run: the in-process call's time (``compute_ms``, what
the server spent in the rebalancer; the rest is HTTP, validation, JSON and the
database) and greedy LPT (``partitioners.moe.baselines``) on the same loads, its
balance and in-process time. Loopback only; every loop is bounded in count and time.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import threading
import time

import httpx
import numpy as np

from bench.moe import GPUS_PER_NODE, drift, popularity, sample, slot_balance
from bench.server import running_server
from partitioners.moe.baselines import greedy_lpt


def _percentile(values: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(values), q)) if values else float("nan")


def _request(load: np.ndarray, num_gpus: int, slots_per_gpu: int, deployment: str | None = None, current=None) -> dict:
    body = {
        "model": {"num_moe_layers": load.shape[0], "num_logical_experts": load.shape[1], "expert_bytes": 44_040_192},
        "cluster": _cluster(num_gpus, slots_per_gpu),
        "load": load.tolist(),
    }
    if deployment:
        body["deployment"] = deployment
    if current is not None:
        body["current_placement"] = {"physical_to_logical": current}
    return body


def _cluster(num_gpus: int, slots_per_gpu: int, down: tuple[int, ...] = ()) -> dict:
    return {
        "num_nodes": num_gpus // GPUS_PER_NODE,
        "gpus_per_node": GPUS_PER_NODE,
        "slots_per_gpu": slots_per_gpu,
        "unavailable_gpus": list(down),
    }


def latency(
    base: str, layers: int, experts: int, num_gpus: int, calls: int, seed: int, fresh_calls: int = 5
) -> list[str]:
    """One deployment played as a runtime would; a row per kind of call."""
    slots_per_gpu = experts // num_gpus + 1
    rng = np.random.default_rng(seed)
    pop = popularity(layers, experts, rng)
    name = f"bench-{experts}x{num_gpus}-{seed}"
    total_slots = layers * num_gpus * slots_per_gpu
    stats: dict[str, dict[str, list]] = {}
    lpt: dict[str, tuple[float, float]] = {}

    def record(kind: str, response: httpx.Response, elapsed_ms: float, load: np.ndarray, down=()) -> dict:
        response.raise_for_status()
        body = response.json()
        row = stats.setdefault(
            kind, {k: [] for k in ("ms", "bytes", "moved", "mean", "compute", "per_lost", "over_cap")}
        )
        row["ms"].append(elapsed_ms)
        row["bytes"].append(len(response.content))
        row["moved"].append(body["migrations"]["count"] / total_slots)
        row["mean"].append(body["balance_after"]["mean"])
        row["compute"].append(body["compute_ms"])
        budget = body["budget"]
        if budget["lost_experts"]:
            row["per_lost"].append(body["migrations"]["count"] / budget["lost_experts"])
            # the bound: 1.5 copies per lost expert plus the balance (repair) budget
            cap = 1.5 * budget["lost_experts"] + (budget["repair_budget"] or 0)
            row["over_cap"].append(body["migrations"]["count"] > cap)
        if kind not in lpt:  # greedy LPT on the same load: a fresh plan (it rewrites most slots)
            avail = num_gpus - len(down)
            started = time.perf_counter()
            plan = greedy_lpt(load, avail, slots_per_gpu)
            lpt_ms = (time.perf_counter() - started) * 1000
            phys = np.full((layers, num_gpus, slots_per_gpu), -1, dtype=np.int64)
            phys[:, np.setdiff1d(np.arange(num_gpus), down)] = plan.reshape(layers, avail, slots_per_gpu)
            lpt[kind] = (slot_balance(load, phys.reshape(layers, -1), num_gpus, down)[0], lpt_ms)
        return body

    def post(client: httpx.Client, kind: str, body: dict, load: np.ndarray, down=()) -> dict:
        started = time.perf_counter()
        response = client.post("/v1/moe/rebalance", json=body)
        return record(kind, response, (time.perf_counter() - started) * 1000, load, down)

    with httpx.Client(base_url=base, timeout=30) as client:
        for k in range(fresh_calls):  # first reports of new deployments; the last one is played on
            load = sample(pop, rng)
            fresh_name = name if k == fresh_calls - 1 else f"{name}-fresh-{k}"
            body = _request(load, num_gpus, slots_per_gpu, fresh_name)
            version = post(client, "fresh", body, load)["placement_version"]
        for _ in range(calls):
            load = sample(pop, rng)
            body = {"load": load.tolist(), "deployment": name, "placement_version": version}
            version = post(client, "unchanged", body, load)["placement_version"]
        for _ in range(max(1, calls // 3)):
            pop = drift(pop, rng)
            load = sample(pop, rng)
            body = {"load": load.tolist(), "deployment": name, "placement_version": version}
            version = post(client, "drift", body, load)["placement_version"]
            confirm = client.post(f"/v1/moe/deployments/{name}/applied", json={"placement_version": version})
            confirm.raise_for_status()
        for _ in range(max(1, calls // 6)):
            down = (int(rng.integers(num_gpus)),)
            load = sample(pop, rng)
            body = {
                "load": load.tolist(),
                "deployment": name,
                "placement_version": version,
                "cluster": _cluster(num_gpus, slots_per_gpu, down),
            }
            version = post(client, "failure", body, load, down)["placement_version"]
            load = sample(pop, rng)
            body = {**body, "load": load.tolist(), "placement_version": version}
            body["cluster"] = _cluster(num_gpus, slots_per_gpu)
            version = post(client, "return", body, load)["placement_version"]
    rows = []
    for kind, row in stats.items():
        per_lost = f"{statistics.fmean(row['per_lost']):5.1f}" if row["per_lost"] else "    -"
        over_cap = f"{sum(row['over_cap']):>4}" if row["over_cap"] else "   -"
        rows.append(
            f"{experts:>4}x{num_gpus:<4} {layers:>3} {kind:<9} {len(row['ms']):>4} "
            f"{_percentile(row['ms'], 50):7.1f} {_percentile(row['ms'], 99):7.1f} "
            f"{_percentile(row['compute'], 50):7.1f} {statistics.fmean(row['bytes']):9.0f} "
            f"{100 * statistics.fmean(row['moved']):6.2f} {statistics.fmean(row['mean']):7.4f} {per_lost} {over_cap}"
            f"   {lpt[kind][0]:7.4f} {lpt[kind][1]:7.0f}"
        )
    return rows


def load_test(base: str, clients: int, seconds: float, seed: int) -> str:
    layers, experts, num_gpus = 58, 256, 64
    slots_per_gpu = experts // num_gpus + 1
    rng = np.random.default_rng(seed)
    pop = popularity(layers, experts, rng)
    bodies = [sample(pop, rng) for _ in range(16)]
    with httpx.Client(base_url=base, timeout=30) as client:
        current = client.post(
            "/v1/moe/rebalance?include=placement", json=_request(bodies[0], num_gpus, slots_per_gpu)
        ).json()["physical_to_logical"]
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
    parser.add_argument("--calls", type=int, default=30, help="unchanged reports per shape (drift: a third)")
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-load-test", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as workdir:
        database_url = f"sqlite:///{workdir}/bench.sqlite3"
        with running_server(database_url, auth="disabled", auto_migrate="true") as (base, _process):
            print(
                f"{'shape':<9} {'L':>3} {'call':<9} {'n':>4} {'p50 ms':>7} {'p99 ms':>7} {'cmp ms':>7} {'bytes':>9} "
                f"{'mv%':>6} {'mean':>7} {'xlost':>5} {'>cap':>4}   {'LPT mean':>7} {'LPT ms':>7}"
            )
            with httpx.Client(base_url=base, timeout=30) as client:  # warm-up: imports, first connection
                warm = sample(popularity(58, 256, np.random.default_rng(args.seed + 1)), np.random.default_rng(0))
                client.post("/v1/moe/rebalance", json=_request(warm, 64, 5)).raise_for_status()
            for num_gpus in (64, 32):
                for row in latency(base, 58, 256, num_gpus, args.calls, args.seed):
                    print(row, flush=True)
            if not args.no_load_test:
                print(load_test(base, args.clients, args.seconds, args.seed))


if __name__ == "__main__":
    main()
