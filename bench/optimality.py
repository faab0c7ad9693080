"""How good are hyperplace's plans: makespan against the lower bound, and the exact optimum where CP-SAT reaches.

For synthetic layered DAGs of 10^2, 10^3 and 10^4 operators (five seeds each) on
1x4 and 1x8 H100 (DGX preset) it plans with ``strategy="auto"`` and prints the
plan's makespan, its lower bound (``summary.lower_bound_s``: the largest of the
bounds of :mod:`partitioners.placement.bounds`), which bound binds, the gap
``makespan / bound - 1`` and the planning seconds (with the seconds the bounds took); for graphs within the exact
solver's reach (``EXACT_MAX_OPS``) it also plans with ``strategy="exact"``
(``--exact-limit`` seconds) and prints the solver's plan, its status and the bound
it proved. The closing lines give the median gap of ``auto`` per size, and how
much ``exact`` improved on ``auto``.

The bounds count level-3 memory tiers at their best (an operator's memory traffic
at the fastest tier that could hold each tensor), since the plan's makespan counts
them; the same bounds with operators in main memory bound ``hbm_ms``, the plan as
scored before level 3, and their gap (``gap_hbm``) is the placement's alone. The
solver times operators in main memory, so its plan and bound compare with ``hbm_ms``.

``bench.placement`` calls :func:`case_fields` for each of its cases and
:func:`print_table` at the end, so its run prints the same columns for its cases.

``--model-build`` times only what a large-neighbourhood search over windows of a
10^3- or 10^4-operator plan would pay first: building and loading the CP model.

Run: ``PYTHONPATH=. .venv/bin/python -m bench.optimality`` (about five minutes on two
cores; ``--quick``: seeds 0-1 and the 1x4 cluster only).
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from dataclasses import replace

from partitioners.graph.generators import synthetic_hypergraph
from partitioners.graph.hypergraph import Hypergraph
from partitioners.hardware.inventory import Inventory, inventory_from_json, without_devices
from partitioners.placement.bounds import MEMORY_CUT_MAX_DEVICES, lower_bounds
from partitioners.placement.context import placement_context
from partitioners.placement.engine import PlacementOptions, PlacementResult, place
from partitioners.placement.exact import EXACT_MAX_OPS

#: ``strategy="exact"``'s time limit in the bench runs.
EXACT_TIME_LIMIT_S = 10.0


def case_fields(
    result: PlacementResult,
    parse: Callable[[], Hypergraph],
    inventory: Inventory,
    options: PlacementOptions,
    time_limit_s: float = EXACT_TIME_LIMIT_S,
) -> dict:
    """The bound and gap of ``result``; with ``strategy="exact"`` run too when the graph is within its reach."""
    b = result.bounds
    row = {
        "bound_ms": b.lower_bound_s * 1e3 if b is not None else float("nan"),
        "bound_by": b.binding if b is not None else "",
        "gap": result.optimality_gap if result.optimality_gap is not None else float("nan"),
        "exact_ms": None,
        "exact_hbm_ms": None,
        "exact_status": "",
        "exact_bound_ms": None,
        "exact_s": None,
    }
    if result.graph.n_ops > EXACT_MAX_OPS:
        return row
    t0 = time.perf_counter()
    exact = place(parse(), inventory, replace(options, strategy="exact", time_limit_s=time_limit_s))
    row["exact_s"] = time.perf_counter() - t0
    row["exact_ms"] = exact.makespan_s * 1e3
    row["exact_hbm_ms"] = exact.chosen.makespan_s * 1e3
    if exact.exact is not None:
        row["exact_status"] = exact.exact.status
        row["exact_bound_ms"] = exact.exact.bound_s * 1e3
    return row


def print_table(rows: list[dict]) -> None:
    """One line per case: makespan, bound, gap and (within reach) the exact solver's plan."""
    print()
    print("How good is a plan (docs/placement.md, 'How good is a plan')")
    print(
        f"{'case':<34} {'ops':>7} {'plan_ms':>9} {'hbm_ms':>9} {'bound_ms':>9} {'by':<13} {'gap':>6} "
        f"{'exact_ms':>9} {'ex_hbm_ms':>9} {'ex_bound':>9} {'status':<8} {'exact_s':>7}"
    )
    for r in rows:
        ex = r.get("exact_ms")
        print(
            f"{r['case']:<34} {r['ops']:>7} {r['hyper_ms']:>9.4f} {r['hbm_ms']:>9.4f} {r['bound_ms']:>9.4f} "
            f"{r['bound_by']:<13} {r['gap']:>6.3f} "
            + (
                f"{ex:>9.4f} {r['exact_hbm_ms']:>9.4f} {r['exact_bound_ms']:>9.4f} {r['exact_status']:<8} "
                f"{r['exact_s']:>7.2f}"
                if ex is not None
                else f"{'-':>9} {'-':>9} {'-':>9} {'':<8} {'-':>7}"
            ),
            flush=True,
        )


def main_memory_bound(graph: Hypergraph, inventory: Inventory, options: PlacementOptions) -> tuple[float, str, float]:
    """``(bound_s, binding, seconds)``: the bound with operators in main memory (what bounds the plan before
    level 3, ``hbm_ms``), and the seconds the plan's own bounds take (the share of planning time they add)."""
    ctx = placement_context(graph, inventory, options)
    link = ctx.link_tables if inventory.n_devices <= MEMORY_CUT_MAX_DEVICES else None
    budget = ctx.memory_budget_bytes
    t0 = time.perf_counter()
    lower_bounds(ctx.simulation, ctx.devices, memory_budget_bytes=budget, link_tables=link)
    seconds = time.perf_counter() - t0
    main = lower_bounds(ctx.simulation, ctx.devices, memory_budget_bytes=budget, link_tables=link, tiers=False)
    return main.lower_bound_s, main.binding, seconds


def model_build(sizes: tuple[int, ...] = (1_000, 10_000), devices: int = 4) -> None:
    """What a large-neighbourhood search over windows of a big plan would pay before searching: the seconds
    to build and load the CP model of the whole graph (1 ms of search), next to ``auto``'s planning time."""
    from partitioners.costmodel.simulator import simulate
    from partitioners.placement.exact import exact_schedule

    inv = _inventory(1, devices)
    for n in sizes:
        graph = synthetic_hypergraph(n, seed=0)
        opts = PlacementOptions()
        t0 = time.perf_counter()
        result = place(graph, inv, opts)
        auto_s = time.perf_counter() - t0
        ctx = placement_context(graph, inv, opts)
        sim = simulate(ctx.graph, inv, result.placement, context=ctx.simulation)
        t0 = time.perf_counter()
        exact_schedule(ctx, result.placement, sim.op_start_s, sim.makespan_s, time_limit_s=0.001)
        print(
            f"{n:>6} ops on 1x{devices}: auto plans in {auto_s:.2f} s; the CP model takes "
            f"{time.perf_counter() - t0:.2f} s to build and load (1 ms of search)",
            flush=True,
        )


def _inventory(nodes: int, per: int) -> Inventory:
    inv = inventory_from_json({"preset": "dgx-h100", "nodes": nodes})
    if per * nodes < inv.n_devices:
        inv = without_devices(inv, inv.device_names[per * nodes :].tolist())
    return inv


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="seeds 0-1 and the 1x4 cluster only")
    ap.add_argument("--sizes", default="100,300,1000,10000")
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--clusters", default="1x4,1x8")
    ap.add_argument("--exact-limit", type=float, default=EXACT_TIME_LIMIT_S)
    ap.add_argument("--model-build", action="store_true", help="only time building the CP model at 10^3, 10^4 ops")
    args = ap.parse_args()
    if args.model_build:
        model_build()
        return
    clusters = args.clusters.split(",")
    seeds = args.seeds
    if args.quick:
        clusters, seeds = clusters[:1], min(seeds, 2)
    rows = []
    for cl in clusters:
        nodes, per = (int(x) for x in cl.split("x"))
        inv = _inventory(nodes, per)
        for n in (int(s) for s in args.sizes.split(",") if s):
            for seed in range(seeds):
                t0 = time.perf_counter()
                graph = synthetic_hypergraph(n, seed=seed)
                opts = PlacementOptions(allow_infeasible=True, seed=seed)
                result = place(graph, inv, opts)
                plan_s = time.perf_counter() - t0
                row = {
                    "case": f"synthetic-{n}/s{seed}/{cl}",
                    "size": n,
                    "cluster": cl,
                    "ops": result.graph.n_ops,
                    "hyper_ms": result.makespan_s * 1e3,
                    "hbm_ms": result.chosen.makespan_s * 1e3,
                    "plan_s": plan_s,
                    "strategy": result.strategy,
                }
                main_s, main_by, row["bounds_s"] = main_memory_bound(graph, inv, opts)
                row["bound_hbm_ms"], row["bound_hbm_by"] = main_s * 1e3, main_by
                row["gap_hbm"] = row["hbm_ms"] / row["bound_hbm_ms"] - 1
                row.update(case_fields(result, lambda g=graph: g, inv, opts, args.exact_limit))
                rows.append(row)
                print(
                    f"{row['case']:<28} {row['ops']:>6} auto {row['hyper_ms']:.4f} ms (hbm {row['hbm_ms']:.4f}) "
                    f"bound {row['bound_ms']:.4f} ({row['bound_by']}) gap {row['gap']:.3f}; main memory: bound "
                    f"{row['bound_hbm_ms']:.4f} ({row['bound_hbm_by']}) gap {row['gap_hbm']:.3f}; planned {plan_s:.2f} s "
                    f"(bounds {row['bounds_s']:.3f} s)"
                    + (
                        f"; exact {row['exact_ms']:.4f} ms (hbm {row['exact_hbm_ms']:.4f}, {row['exact_status']}, "
                        f"bound {row['exact_bound_ms']:.4f}) in {row['exact_s']:.1f} s"
                        if row["exact_ms"] is not None
                        else ""
                    ),
                    flush=True,
                )
    print_table(rows)
    print()
    for cl in clusters:
        for n in sorted({r["size"] for r in rows}):
            sel = [r for r in rows if r["size"] == n and r["cluster"] == cl]
            if not sel:
                continue
            gaps = [r["gap"] for r in sel]
            line = (
                f"{cl} {n:>6} ops: median gap of auto {statistics.median(gaps):.3f} "
                f"(main memory {statistics.median(r['gap_hbm'] for r in sel):.3f}) "
                f"(min {min(gaps):.3f}, max {max(gaps):.3f}), median planning {statistics.median(r['plan_s'] for r in sel):.2f} s "
                f"of which bounds {statistics.median(r['bounds_s'] for r in sel):.3f} s"
            )
            ex = [r for r in sel if r["exact_ms"] is not None]
            if ex:
                gains = [r["hbm_ms"] / r["exact_hbm_ms"] - 1 for r in ex]
                line += (
                    f"; exact (main memory) vs auto: median {statistics.median(gains) * 100:.2f}% faster, "
                    f"{sum(r['exact_status'] == 'optimal' for r in ex)}/{len(ex)} proven optimal, "
                    f"longest {max(r['exact_s'] for r in ex):.1f} s"
                )
            print(line)


if __name__ == "__main__":
    main()
