"""MoE expert re-placement: balance, slots moved and time per call, against baselines.

Run: ``.venv/bin/python -m bench.moe [--quick] [--repeats N]``

Shapes are DeepSeek-V3's (58 MoE layers x 256 routed experts, 8 GPUs per node)
at EP32 / EP64, plus 512 experts x 128 GPUs. Loads are synthetic: each layer
has its own Zipf-like popularity (exponent drawn in [0.3, 0.9], a random expert
order) and a report is a multinomial sample of ``TOKENS_PER_LAYER`` routed
tokens (tokens x top-k) from it. Scenarios, each starting from the plan made for
the first sample:

- ``fresh``: first placement (no current one);
- ``resampled``: a new sample of the same popularity (the load has not really changed);
- ``drift``: 10% of the experts trade popularity among themselves (hot experts cool, cold ones heat up);
- ``gpu-failure``: a resample with GPU 5 unavailable.

Baselines measured in the same run: greedy LPT (EPLB's two steps done one item
at a time: give a spare slot to the expert with the largest per-replica load,
then put replicas, largest first, on the least-loaded GPU with a free slot that
does not hold the expert yet), and the lower bound of :func:`partitioners.moe.lower_bound`.
EPLB's ``rebalance_experts`` is timed as well when an ``eplb`` module is
importable (it is not vendored here); otherwise that column says ``-``.
"""

from __future__ import annotations

import argparse
import heapq
import importlib
import time

import numpy as np

from partitioners.moe import balance_stats, rebalance

TOKENS_PER_LAYER = 8 * 131072  # top-8 routing of 128k tokens per report window
GPUS_PER_NODE = 8


def popularity(layers: int, experts: int, rng: np.random.Generator) -> np.ndarray:
    """Per-layer Zipf-like routing probabilities over a random expert order."""
    exponent = rng.uniform(0.3, 0.9, size=(layers, 1))
    ranks = np.argsort(rng.random((layers, experts)), axis=1) + 1.0
    weight = ranks ** (-exponent) * rng.lognormal(0.0, 0.2, size=(layers, experts))
    return weight / weight.sum(axis=1, keepdims=True)


def sample(pop: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Token counts of one report: a multinomial draw per layer."""
    return np.stack([rng.multinomial(TOKENS_PER_LAYER, row) for row in pop]).astype(np.float64)


def drift(pop: np.ndarray, rng: np.random.Generator, fraction: float = 0.1) -> np.ndarray:
    """Shuffle the popularity of ``fraction`` of the experts among themselves, per layer."""
    out = pop.copy()
    layers, experts = pop.shape
    k = max(2, int(round(fraction * experts)))
    for layer in range(layers):
        chosen = rng.choice(experts, size=k, replace=False)
        out[layer, chosen] = out[layer, rng.permutation(chosen)]
    return out


def greedy_lpt(load: np.ndarray, num_gpus: int, slots_per_gpu: int) -> np.ndarray:
    """Baseline: greedy replica counts, then LPT one replica at a time (physical_to_logical)."""
    layers, experts = load.shape
    out = np.full((layers, num_gpus * slots_per_gpu), -1, dtype=np.int64)
    n_fill = min(num_gpus * slots_per_gpu, experts * num_gpus)
    for layer in range(layers):
        w = load[layer]
        counts = np.ones(experts, dtype=np.int64)
        heap = [(-w[e], e) for e in range(experts)]
        heapq.heapify(heap)
        for _ in range(n_fill - experts):
            while True:
                _, e = heapq.heappop(heap)
                if counts[e] < num_gpus:
                    break
            counts[e] += 1
            if counts[e] < num_gpus:
                heapq.heappush(heap, (-w[e] / counts[e], e))
        items = np.repeat(np.arange(experts), counts)
        size = w[items] / counts[items]
        gpu_load = np.zeros(num_gpus)
        free = np.full(num_gpus, slots_per_gpu)
        holds = np.zeros((num_gpus, experts), dtype=bool)
        for idx in np.argsort(-size, kind="stable"):
            e = items[idx]
            score = np.where((free > 0) & ~holds[:, e], gpu_load, np.inf)
            g = int(score.argmin())
            out[layer, g * slots_per_gpu + slots_per_gpu - free[g]] = e
            free[g] -= 1
            holds[g, e] = True
            gpu_load[g] += size[idx]
    return out


def _eplb():
    try:
        return importlib.import_module("eplb")
    except Exception:  # noqa: BLE001 - optional comparison, any import failure means "skip"
        return None


def eplb_plan(module, load: np.ndarray, num_nodes: int, num_gpus: int, slots_per_gpu: int):
    """EPLB's global policy (``num_groups=1``) as physical_to_logical, or None if unavailable."""
    import torch  # present whenever eplb imports

    phy2log, _, _ = module.rebalance_experts(
        torch.from_numpy(load), num_gpus * slots_per_gpu, 1, num_nodes, num_gpus
    )
    return phy2log.numpy()


def _timed(fn, repeats: int):
    times = []
    result = None
    for _ in range(repeats):
        start = time.perf_counter()
        result = fn()
        times.append((time.perf_counter() - start) * 1e3)
    return result, float(np.median(times)), float(np.percentile(times, 99))


def run_shape(layers: int, experts: int, num_gpus: int, spare_per_gpu: int, repeats: int, seed: int, eplb) -> list[str]:
    rng = np.random.default_rng(seed)
    slots_per_gpu = experts // num_gpus + spare_per_gpu
    num_nodes = num_gpus // GPUS_PER_NODE
    cluster = dict(num_nodes=num_nodes, gpus_per_node=GPUS_PER_NODE, slots_per_gpu=slots_per_gpu)
    pop = popularity(layers, experts, rng)
    first = sample(pop, rng)
    base = rebalance(first, **cluster)
    scenarios = [
        ("fresh", first, None, ()),
        ("resampled", sample(pop, rng), base.physical_to_logical, ()),
        ("drift", sample(drift(pop, rng), rng), base.physical_to_logical, ()),
        ("gpu-failure", sample(pop, rng), base.physical_to_logical, (5,)),
    ]
    rows = []
    total_slots = layers * num_gpus * slots_per_gpu
    for name, load, current, down in scenarios:
        result, med, p99 = _timed(
            lambda: rebalance(load, current_physical_to_logical=current, unavailable_gpus=down, expert_bytes=44_040_192, **cluster),
            repeats,
        )
        avail = num_gpus - len(down)
        load_for_lpt = load
        start = time.perf_counter()
        lpt = greedy_lpt(load_for_lpt, avail, slots_per_gpu)
        lpt_ms = (time.perf_counter() - start) * 1e3
        if down:  # baseline placement on the surviving GPUs, mapped back to physical slots
            phys = np.full((layers, num_gpus, slots_per_gpu), -1, dtype=np.int64)
            phys[:, np.setdiff1d(np.arange(num_gpus), down)] = lpt.reshape(layers, avail, slots_per_gpu)
            lpt = phys.reshape(layers, -1)
        lpt_stats = balance_stats(load, lpt, unavailable_gpus=down, **cluster)
        eplb_cell = "-"
        if eplb is not None and not down:
            start = time.perf_counter()
            plan = eplb_plan(eplb, load, num_nodes, num_gpus, slots_per_gpu)
            eplb_ms = (time.perf_counter() - start) * 1e3
            es = balance_stats(load, plan, **cluster)
            moved = "" if current is None else f" {100 * (plan != current).mean():.0f}%mv"
            eplb_cell = f"{es.mean:.3f}/{es.worst:.3f} {eplb_ms:.0f}ms{moved}"
        before = "-" if result.balance_before is None else f"{result.balance_before.mean:.3f}/{result.balance_before.worst:.3f}"
        moved = 100.0 * result.migrations.count / total_slots
        rows.append(
            f"{experts:>4}x{num_gpus:<4} {name:<12} {before:>11} "
            f"{result.balance_after.mean:.3f}/{result.balance_after.worst:.3f} "
            f"{lpt_stats.mean:.3f}/{lpt_stats.worst:.3f} "
            f"{result.lower_bound.mean:.3f}/{result.lower_bound.worst:.3f} "
            f"{moved:6.2f} {result.migrations.cross_node_count:>6} {result.migrations.from_storage_count:>6} "
            f"{med:7.1f} {p99:7.1f} {lpt_ms:8.0f}  {eplb_cell}"
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--quick", action="store_true", help="EP64 only, 5 repeats")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    shapes = [(58, 256, 64, 1), (58, 256, 32, 1), (58, 256, 64, 2), (58, 512, 128, 1)]
    repeats = args.repeats
    if args.quick:
        shapes, repeats = shapes[:1], 5
    eplb = _eplb()
    print(f"tokens per layer per report: {TOKENS_PER_LAYER}; repeats: {repeats}; EPLB: {'yes' if eplb else 'not importable, skipped'}")
    print("balance = max/mean GPU load, mean/worst over layers; moved = % of all slots written")
    print(
        f"{'shape':<9} {'scenario':<12} {'before':>11} {'hyperplace':<11} {'greedy LPT':<11} {'lower bnd':<11} "
        f"{'moved%':>6} {'xnode':>6} {'store':>6} {'med ms':>7} {'p99 ms':>7} {'LPT ms':>8}  EPLB"
    )
    for layers, experts, gpus, spare in shapes:
        for row in run_shape(layers, experts, gpus, spare, repeats, args.seed, eplb):
            print(row + ("" if spare == 1 else f"  (+{spare} spare/GPU)"))


if __name__ == "__main__":
    main()
