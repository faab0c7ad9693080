"""Throughput of the schedule simulator on synthetic DAGs over 2 x DGX H100 (16 GPUs).

For each size the script times, on the same graph and placement:

* ``baseline``: one pure-Python pass over every edge in reverse topological order
  (the upward-rank computation, :func:`partitioners.costmodel.simulator.critical_path_priority`),
  i.e. the cheapest O(V + E) interpreted loop; the simulator cannot beat it by
  much, so ``sim/base`` says how much the event loop costs on top;
* ``prepare``: :func:`prepare_simulation` (op time table, topological order, lists);
* ``full``: :func:`simulate` with the timeline and the memory sweep;
* ``fast``: ``record_timeline=False`` with the priority passed in (timeline and
  traffic, no memory sweep);
* ``est``: :func:`estimate_makespan_s` with the priority passed in (makespan only:
  what a placement search pays per candidate).

Times are wall clock (``*_s``) plus the process CPU time of the full run
(``full_cpu_s``), which stays meaningful when other jobs share the cores.

Run: ``.venv/bin/python -m bench.simulate [--sizes 10000 100000 1000000] [--placement random|round-robin]``
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from partitioners.costmodel.simulator import critical_path_priority, estimate_makespan_s, prepare_simulation, simulate
from partitioners.graph.generators import synthetic_hypergraph
from partitioners.hardware.inventory import preset_inventory


def _placement(n_ops: int, n_devices: int, kind: str, seed: int) -> np.ndarray:
    if kind == "round-robin":
        return np.arange(n_ops, dtype=np.int64) % n_devices
    if kind == "lanes":
        # synthetic graphs put op i in lane i % 18: keep lanes together
        return (np.arange(n_ops, dtype=np.int64) % 18) % n_devices
    return np.random.default_rng(seed).integers(0, n_devices, n_ops)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000, 1_000_000])
    parser.add_argument("--placement", choices=["random", "round-robin", "lanes"], default="random")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    inv = preset_inventory("dgx-h100", 2)
    header = (
        f"{'ops':>9} {'placement':>11} {'base_s':>7} {'prep_s':>7} {'full_s':>7} {'fast_s':>7} {'est_s':>7} "
        f"{'full_cpu_s':>10} {'full_s/Mop':>10} {'est_s/Mop':>10} {'sim/base':>8} {'makespan_s':>10} {'comm_GB':>9} {'peak_GB':>8}"
    )
    print(f"inventory: {inv.name} ({inv.n_devices} devices)")
    print(header)
    for n in args.sizes:
        g = synthetic_hypergraph(n, seed=args.seed)
        placement = _placement(n, inv.n_devices, args.placement, args.seed)

        t0 = time.perf_counter()
        ctx = prepare_simulation(g, inv)
        prep_s = time.perf_counter() - t0

        dur = ctx.op_times_s[np.arange(n), ctx.device_profile[placement]]
        t0 = time.perf_counter()
        prio = critical_path_priority(g, inv, placement, dur, context=ctx)
        base_s = time.perf_counter() - t0

        t0 = time.perf_counter()
        c0 = time.process_time()
        full = simulate(g, inv, placement, context=ctx)
        full_s = time.perf_counter() - t0
        full_cpu_s = time.process_time() - c0

        t0 = time.perf_counter()
        fast = simulate(g, inv, placement, context=ctx, priority=prio, record_timeline=False)
        fast_s = time.perf_counter() - t0
        assert fast.makespan_s == full.makespan_s

        t0 = time.perf_counter()
        est = estimate_makespan_s(g, inv, placement, context=ctx, priority=prio)
        est_s = time.perf_counter() - t0
        assert est == full.makespan_s

        mops = n / 1e6
        print(
            f"{n:>9} {args.placement:>11} {base_s:>7.2f} {prep_s:>7.2f} {full_s:>7.2f} {fast_s:>7.2f} {est_s:>7.2f} "
            f"{full_cpu_s:>10.2f} {full_s / mops:>10.2f} {est_s / mops:>10.2f} {full_s / base_s:>8.1f} {full.makespan_s:>10.4f} "
            f"{full.comm_bytes / 1e9:>9.1f} {full.peak_memory_bytes.max() / 1e9:>8.1f}"
        )


if __name__ == "__main__":
    main()
