"""MoE expert re-placement: balance, slots moved and time per call, against baselines.

Run: ``.venv/bin/python -m bench.moe [--quick] [--repeats N] [--repair-curve]``

Shapes are DeepSeek-V3's (58 MoE layers x 256 routed experts, 8 GPUs per node)
at EP32 / EP64, plus 512 experts x 128 GPUs. Loads are synthetic: each layer
has its own Zipf-like popularity (exponent drawn in [0.3, 0.9], a random expert
order) and a report is a multinomial sample of ``TOKENS_PER_LAYER`` routed
tokens (tokens x top-k) from it. Scenarios, each starting from the plan made for
the first sample:

- ``fresh``: first placement (no current one);
- ``resampled``: a new sample of the same popularity (the load has not really changed);
- ``drift``: 10% of the experts trade popularity among themselves (hot experts cool, cold ones heat up);
- ``drift 20%``: the same with 20% of the experts;
- ``gpu-failure``: a resample with GPU 5 unavailable (``lost`` = experts whose only copy was there;
  ``x lost`` = copies written over lost experts; ``cap`` = 1.5 x lost + the repair budget, the
  issue's bound on the copies a failure writes);
- ``gpu-return``: GPU 5 back, from the placement the failure left (its slots empty).

Incremental calls run as the service does by default: balance target
``DEFAULT_BALANCE_TARGET``, a move budget of ``MOVE_BUDGET_FRACTION`` of the slots
(``HYPERPLACE_MOE_MOVE_BUDGET_FRACTION``) and a repair budget (a failure's copies for
balance, on top of its lost experts) of ``REPAIR_BUDGET_FRACTION``
(``HYPERPLACE_MOE_REPAIR_BUDGET_FRACTION``); ``bound`` says which one stopped the moves.

Baselines measured in the same run: greedy LPT (EPLB's two steps done one item
at a time: give a spare slot to the expert with the largest per-replica load,
then put replicas, largest first, on the least-loaded GPU with a free slot that
does not hold the expert yet), and the lower bound of :func:`partitioners.moe.rebalance.lower_bound`.
EPLB's ``rebalance_experts`` is timed as well when an ``eplb`` module is
importable (it is not vendored here: put DeepSeek's ``eplb.py`` on ``PYTHONPATH``
and run with a Python that has torch, e.g. ``.venv-eplb/bin/python``); otherwise
that column says ``-``. Every balance figure counts each slot as serving
``load / copies``, so EPLB's occasional two copies of one expert on one GPU are
charged as the runtime would charge them.
"""

from __future__ import annotations

import argparse
import importlib
import time

import numpy as np

from partitioners.moe.baselines import greedy_lpt
from partitioners.moe.rebalance import rebalance

TOKENS_PER_LAYER = 8 * 131072  # top-8 routing of 128k tokens per report window
EXPERT_BYTES = 3 * 7168 * 2048  # DeepSeek-V3 routed expert: gate, up, down projections at 1 byte (FP8)
GPUS_PER_NODE = 8
MOVE_BUDGET_FRACTION = 0.14  # the service's default (service/settings.py, moe_move_budget_fraction)
REPAIR_BUDGET_FRACTION = 0.08  # the service's default (service/settings.py, moe_repair_budget_fraction)


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
    k = max(2, round(fraction * experts))
    for layer in range(layers):
        chosen = rng.choice(experts, size=k, replace=False)
        out[layer, chosen] = out[layer, rng.permutation(chosen)]
    return out


def slot_balance(load: np.ndarray, p2l: np.ndarray, num_gpus: int, down=()) -> tuple[float, float]:
    """Mean and worst max/mean GPU load, with each slot serving ``load / copies`` (copies counted per slot).

    Counting per slot (not per GPU) charges a plan that puts two copies of one
    expert on one GPU (EPLB can) for exactly what the runtime would send there.
    """
    layers, experts = load.shape
    p2l = p2l.reshape(layers, num_gpus, -1).copy()
    p2l[:, list(down)] = -1
    flat = p2l.reshape(layers, -1)
    counts = np.stack([np.bincount(row[row >= 0], minlength=experts) for row in flat])
    per_slot = np.concatenate([load / np.maximum(counts, 1), np.zeros((layers, 1))], axis=1)
    gpu_load = np.take_along_axis(per_slot, np.where(flat >= 0, flat, experts), axis=1).reshape(p2l.shape).sum(axis=2)
    ratio = gpu_load.max(axis=1) / (load.sum(axis=1) / (num_gpus - len(down)))
    return float(ratio.mean()), float(ratio.max())


def duplicate_layers(p2l: np.ndarray, num_gpus: int) -> int:
    """Layers where some GPU holds two copies of one expert."""
    per_gpu = np.sort(p2l.reshape(p2l.shape[0], num_gpus, -1), axis=2)
    dup = (per_gpu[:, :, 1:] == per_gpu[:, :, :-1]) & (per_gpu[:, :, 1:] >= 0)
    return int(dup.any(axis=(1, 2)).sum())


def _eplb():
    try:
        return importlib.import_module("eplb")
    except Exception:
        return None


def eplb_plan(module, load: np.ndarray, num_nodes: int, num_gpus: int, slots_per_gpu: int, groups: int) -> np.ndarray:
    """EPLB's ``rebalance_experts`` as physical_to_logical (global policy when ``groups`` is 1)."""
    import torch  # present whenever eplb imports

    phy2log, _, _ = module.rebalance_experts(
        torch.from_numpy(load), num_gpus * slots_per_gpu, groups, num_nodes, num_gpus
    )
    return phy2log.numpy()


def _timed(fn, repeats: int):
    """Result, median and p99 wall ms, median CPU ms (the machine is shared: CPU time shows the cost itself)."""
    wall, cpu = [], []
    result = None
    for _ in range(repeats):
        start, start_cpu = time.perf_counter(), time.process_time()
        result = fn()
        wall.append((time.perf_counter() - start) * 1e3)
        cpu.append((time.process_time() - start_cpu) * 1e3)
    return result, float(np.median(wall)), float(np.percentile(wall, 99)), float(np.median(cpu))


def _cell(pair: tuple[float, float]) -> str:
    return f"{pair[0]:.3f}/{pair[1]:.3f}"


def run_shape(layers: int, experts: int, num_gpus: int, spare_per_gpu: int, repeats: int, seed: int, eplb) -> list[str]:
    rng = np.random.default_rng(seed)
    slots_per_gpu = experts // num_gpus + spare_per_gpu
    num_nodes = num_gpus // GPUS_PER_NODE
    cluster = dict(num_nodes=num_nodes, gpus_per_node=GPUS_PER_NODE, slots_per_gpu=slots_per_gpu)
    pop = popularity(layers, experts, rng)
    first = sample(pop, rng)
    base = rebalance(first, **cluster).physical_to_logical
    drifted = drift(pop, rng)
    total_slots = layers * num_gpus * slots_per_gpu
    budget = int(MOVE_BUDGET_FRACTION * total_slots)
    repair = int(REPAIR_BUDGET_FRACTION * total_slots)
    failure_load = sample(pop, rng)
    failed = rebalance(
        failure_load,
        current_physical_to_logical=base,
        unavailable_gpus=(5,),
        move_budget=budget,
        repair_budget=repair,
        **cluster,
    )
    scenarios = [
        ("fresh", first, None, (), None),
        ("fresh, 8 groups", first, None, (), 8),
        ("resampled", sample(pop, rng), base, (), None),
        ("drift", sample(drifted, rng), base, (), None),
        ("drift 20%", sample(drift(pop, rng, 0.2), rng), base, (), None),
        ("gpu-failure", failure_load, base, (5,), None),
        ("gpu-return", sample(pop, rng), failed.physical_to_logical, (), None),
    ]
    rows = []
    for name, load, current, down, groups in scenarios:
        result, med, p99, cpu = _timed(
            lambda load=load, current=current, down=down, groups=groups: rebalance(
                load,
                current_physical_to_logical=current,
                unavailable_gpus=down,
                num_expert_groups=groups,
                expert_bytes=EXPERT_BYTES,
                move_budget=budget,
                repair_budget=repair,
                **cluster,
            ),
            repeats,
        )
        avail = num_gpus - len(down)
        start = time.perf_counter()
        lpt = greedy_lpt(load, avail, slots_per_gpu)
        lpt_ms = (time.perf_counter() - start) * 1e3
        if down:  # baseline on the surviving GPUs, mapped back to physical slots
            phys = np.full((layers, num_gpus, slots_per_gpu), -1, dtype=np.int64)
            phys[:, np.setdiff1d(np.arange(num_gpus), down)] = lpt.reshape(layers, avail, slots_per_gpu)
            lpt = phys.reshape(layers, -1)
        eplb_cell = "-"
        if eplb is not None and not down:
            start = time.perf_counter()
            plan = eplb_plan(eplb, load, num_nodes, num_gpus, slots_per_gpu, groups or 1)
            eplb_ms = (time.perf_counter() - start) * 1e3
            moved = "" if current is None else f" mv {100 * (plan != current).mean():.0f}%"
            eplb_cell = f"{_cell(slot_balance(load, plan, num_gpus))} {eplb_ms:5.0f}ms{moved} dup {duplicate_layers(plan, num_gpus)}"
        before = "-" if current is None else _cell(slot_balance(load, current, num_gpus, down))
        after = _cell(slot_balance(load, result.physical_to_logical, num_gpus, down))
        moved = "-" if current is None else f"{100.0 * result.migrations.count / total_slots:6.2f}"
        label = name if spare_per_gpu == 1 else f"{name} +{spare_per_gpu}sp"
        lost = result.lost_experts
        per_lost = f"{result.migrations.count / lost:5.1f}" if lost else "    -"
        # the bound on a failure: 1.5 copies per lost expert plus the repair budget
        cap = f"{int(1.5 * lost + repair):>6}" if lost else "     -"
        rows.append(
            f"{experts:>4}x{num_gpus:<4} {label:<20} {before:>11} {after} {_cell(slot_balance(load, lpt, num_gpus, down))} "
            f"{_cell((result.lower_bound.mean, result.lower_bound.worst))} "
            f"{moved:>6} {result.migrations.count:>6} {cap} {result.migrations.total_bytes / 1e9:6.1f} {lost:>4} {per_lost} "
            f"{result.bound_by[:14]:<14} {result.migrations.cross_node_count:>5} {med:6.1f} {p99:6.1f} {cpu:6.1f} "
            f"{lpt_ms:6.0f}  {eplb_cell}"
        )
        if name == "resampled":
            # noise check: is a plan fitted to this report better on the next one than the kept placement?
            upcoming = sample(pop, rng)
            fitted = rebalance(load, **cluster).physical_to_logical
            noise_rows.append(
                f"{experts}x{num_gpus}: next report, kept placement {_cell(slot_balance(upcoming, current, num_gpus))}"
                f" vs fresh plan fitted to this report {_cell(slot_balance(upcoming, fitted, num_gpus))}"
            )
    return rows


noise_rows: list[str] = []


def repair_curve(layers: int, experts: int, num_gpus: int, seed: int) -> list[str]:
    """A failure of GPU 5 repaired under several repair budgets: copies written against balance."""
    rng = np.random.default_rng(seed)
    slots_per_gpu = experts // num_gpus + 1
    cluster = dict(num_nodes=num_gpus // GPUS_PER_NODE, gpus_per_node=GPUS_PER_NODE, slots_per_gpu=slots_per_gpu)
    pop = popularity(layers, experts, rng)
    base = rebalance(sample(pop, rng), **cluster).physical_to_logical
    load = sample(pop, rng)
    total_slots = layers * num_gpus * slots_per_gpu
    rows = []
    for fraction in (0.0, 0.02, 0.05, 0.08, None):
        repair = None if fraction is None else int(fraction * total_slots)
        result = rebalance(
            load, current_physical_to_logical=base, unavailable_gpus=(5,), repair_budget=repair, **cluster
        )
        label = "unbounded" if fraction is None else f"{fraction:.0%} ({repair})"
        rows.append(
            f"{experts:>4}x{num_gpus:<4} {label:<14} {result.lost_experts:>5} {result.migrations.count:>6} "
            f"{_cell((result.balance_after.mean, result.balance_after.worst))} {result.bound_by}"
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--quick", action="store_true", help="EP64 and EP32 only, 5 repeats")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--repair-curve", action="store_true", help="only: a GPU failure's copies against balance per repair budget"
    )
    args = parser.parse_args()
    if args.repair_curve:
        print(f"{'shape':<9} {'repair budget':<14} {'lost':>5} {'copies':>6} {'mean/worst':<11} bound")
        for gpus in (64, 32):
            for row in repair_curve(58, 256, gpus, args.seed):
                print(row, flush=True)
        return
    shapes = [(58, 256, 64, 1), (58, 256, 32, 1), (58, 256, 64, 2), (58, 512, 128, 1)]
    repeats = args.repeats
    if args.quick:
        shapes, repeats = shapes[:2], 5
    eplb = _eplb()
    print(
        f"tokens per layer per report: {TOKENS_PER_LAYER}; repeats: {repeats}; EPLB: {'yes' if eplb else 'not importable, skipped'}"
    )
    print(
        "balance = max/mean GPU load, mean/worst over layers; mv% = % of all slots written; GB = bytes written;"
        " xnode = copies read across nodes; greedy LPT is a fresh plan every call (it rewrites most slots)"
    )
    print(
        f"{'shape':<9} {'scenario':<20} {'before':>11} {'hyperplace':<11} {'greedy LPT':<11} {'lower bnd':<11} "
        f"{'mv%':>6} {'copies':>6} {'cap':>6} {'GB':>6} {'lost':>4} {'xlost':>5} {'bound':<14} {'xnode':>5} {'med ms':>6} "
        f"{'p99 ms':>6} {'cpu ms':>6} {'LPT ms':>6}  EPLB (balance, time, mv%, layers with 2 copies on a GPU)"
    )
    for layers, experts, gpus, spare in shapes:
        for row in run_shape(layers, experts, gpus, spare, repeats, args.seed, eplb):
            print(row, flush=True)
    print("sampling-noise check (why 'resampled' keeps the placement):")
    for row in noise_rows:
        print("  " + row)


if __name__ == "__main__":
    main()
