"""Placement quality and planning time: hyperplace against baselines measured in the same run.

Cases: the repository's ONNX fixtures (inference and training, 1 and 8 / 4
micro-batches, plus pipeline-mode training) and synthetic layered DAGs of 10^4,
10^5 and 10^6 operators, on 1x4, 1x8 and 2x8 H100 (DGX preset). For every case
it prints the simulated makespan of hyperplace (``strategy="auto"``) and of the
baselines on the same expanded graph and the same simulator:

* ``one``: every operator on one device;
* ``metis``: METIS k-way on the plain operator graph's edge cut, all devices, equal parts;
* ``pipe``: contiguous pipeline split of a topological order, all devices, balanced by time;
* ``heft``: HEFT list scheduling on all devices (simulated with its own priorities);

(in pipeline mode a baseline whose stage graph is cyclic is not a valid answer and
does not count as the best), then hyperplace's speedup over one device and over
the best baseline, its peak
memory against capacity, bytes moved, whether its stage graph is acyclic, level-3
tier-capacity violations, and planning seconds (parsing included: ONNX bytes for
the fixtures, graph JSON for the synthetic DAGs). A summary line checks the
targets of issue 5. A last table (:mod:`bench.optimality`) gives every case's lower
bound and optimality gap and, for graphs of up to ``EXACT_MAX_OPS`` operators, the
plan of ``strategy="exact"`` (10 s limit each).

A last section (issue 52) scores hyperplace and every baseline, Mt-KaHyPar included
where ``import mtkahypar`` works, with the same simulator under the ``roofline`` cost
profile (peak compute, no launch cost: the model partitioner papers use), on the
fixtures' micro-batched runs and synthetic DAGs, and checks its targets.

Run: ``.venv/bin/python -m bench.placement`` (about ten minutes on two cores, plus about 10 s per case within
``strategy="exact"``'s reach: 7 per cluster);
``--quick`` drops the 10^6 case and the 1x8 cluster; ``--roofline only`` runs just the
roofline section (about two minutes), ``--roofline no`` leaves it out.
"""

from __future__ import annotations

import argparse
import math
import pathlib
import time
from dataclasses import replace

import numpy as np

from bench import fusion_energy, optimality
from partitioners.costmodel.costs import link_time_tables
from partitioners.costmodel.simulator import prepare_simulation, simulate
from partitioners.graph.generators import synthetic_graph_json
from partitioners.graph.hypergraph import op_levels
from partitioners.graph.json_import import graph_from_json
from partitioners.graph.onnx_import import graph_from_onnx_bytes
from partitioners.graph.transforms import PHASE_BACKWARD, PHASE_FORWARD
from partitioners.hardware.inventory import inventory_from_json
from partitioners.placement.engine import PlacementOptions, place
from partitioners.placement.heft import heft_schedule
from partitioners.placement.metis_adapter import metis_graph, metis_partition
from partitioners.placement.pipeline import hybrid_layout, quotient_is_acyclic, stage_of_origin

FIXTURES = pathlib.Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "onnx"
MODELS = {
    "resnet50": ("resnet50.onnx", {"batch": 32}),
    "bert": ("bert_base.onnx", {"batch": 8, "sequence": 512}),
    "gpt2": ("gpt2.onnx", {"batch": 8, "sequence": 512}),
    "lstm": ("lstm_seq2seq.onnx", {"batch": 32, "source": 64, "target": 64}),
}
# (mode, micro_batches, pipeline)
FIXTURE_RUNS = [
    ("inference", 1, False),
    ("inference", 8, False),
    ("training", 1, False),
    ("training", 4, False),
    ("training", 4, True),
]


def phase_acyclic(expanded, placement):
    """Stage graph acyclic on forward edges and on gradient edges (the pipeline condition)."""
    g = expanded.graph
    src, dst, _ = g.op_edges()
    ok = True
    for phase in (PHASE_FORWARD, PHASE_BACKWARD):
        mask = (expanded.op_phase[src] == phase) & (expanded.op_phase[dst] == phase)
        ok = ok and (not mask.any() or quotient_is_acyclic(g, placement, mask))
    return ok


def baselines(expanded, inventory, ctx, devices, seed=0, pipeline=False):
    """Makespans and validity of the four baselines on the placed graph.

    A baseline is valid when it fits in memory and, in pipeline mode, when its
    forward stage graph is acyclic (a cyclic plan cannot run as a pipeline).
    """
    g = expanded.graph
    times = ctx.op_times_s[:, ctx.device_profile]
    budget = inventory.device_memory_bytes
    out = {}

    def run(name, placement, priority=None):
        sim = simulate(g, inventory, placement, context=ctx, priority=priority, record_timeline=True)
        used = np.unique(placement)
        frac = float(np.max(sim.peak_memory_bytes[used] / budget[used]))
        valid = frac <= 1.0 and (not pipeline or phase_acyclic(expanded, placement))
        out[name] = (sim.makespan_s, valid)

    total = times.sum(axis=0)
    run("one", np.full(g.n_ops, int(np.argmin(total)), dtype=np.int64))
    k = len(devices)
    mg = metis_graph(g, times[:, devices[0]], hypergraph=False)
    run("metis", devices[metis_partition(mg, k, seed=seed)])
    n_origin = int(expanded.op_origin.max()) + 1
    weight = np.bincount(expanded.op_origin, weights=times[:, devices[0]], minlength=n_origin)
    fwd = np.flatnonzero(expanded.op_phase == PHASE_FORWARD)
    lv = op_levels(g)
    origin_level = np.zeros(n_origin, dtype=np.int64)
    np.maximum.at(origin_level, expanded.op_origin[fwd], lv[fwd])
    order = np.lexsort((np.arange(n_origin), origin_level))
    stage, _ = stage_of_origin(expanded, order, weight, None, np.ones(k))
    run("pipe", hybrid_layout(expanded, stage, [np.array([d]) for d in devices], times[:, devices[0]]))
    lat, spb = link_time_tables(inventory)
    h = heft_schedule(g, times, lat, spb, lv, devices=devices, device_group=inventory.device_group)
    prio = np.empty(g.n_ops)
    prio[h.order] = np.arange(g.n_ops, 0, -1)
    run("heft", h.placement, prio)
    return out


def run_case(label, parse, inventory, options, parallel):
    t0 = time.perf_counter()
    graph = parse()
    result = place(graph, inventory, options)
    plan_s = time.perf_counter() - t0
    ctx = prepare_simulation(result.graph, inventory)
    base = baselines(
        result.expanded, inventory, ctx, np.arange(inventory.n_devices), seed=options.seed, pipeline=options.pipeline
    )
    one = base["one"][0]
    feasible_base = [v[0] for v in base.values() if v[1]]
    best_base = min(feasible_base) if feasible_base else min(v[0] for v in base.values())
    mk = result.makespan_s
    mk_hbm = result.chosen.makespan_s
    cap = inventory.device_memory_bytes
    peak_frac = float(np.max(result.simulation.peak_memory_bytes / cap))
    acyclic = phase_acyclic(result.expanded, result.placement)
    row = {
        "case": label,
        "ops": result.graph.n_ops,
        "hyper_ms": mk * 1e3,
        **{f"{k}_ms": v[0] * 1e3 for k, v in base.items()},
        "x_one": one / mk,
        "x_best": best_base / mk,
        "x_best_hbm": best_base / mk_hbm,
        "x_one_hbm": one / mk_hbm,
        "hbm_ms": mk_hbm * 1e3,
        "peak/cap": peak_frac,
        "comm_GB": result.simulation.comm_bytes / 1e9,
        "acyclic": acyclic,
        "tier_viol": result.memory_plan.capacity_violations,
        "plan_s": plan_s,
        "strategy": result.strategy,
        "feasible": result.feasible,
        "any_base_feasible": bool(feasible_base),
        "parallel": parallel,
        "pipeline": options.pipeline,
    }
    row.update(optimality.case_fields(result, parse, inventory, options))
    print(
        f"{label:<34} {row['ops']:>8} {row['hyper_ms']:>9.3f} {row['hbm_ms']:>9.3f} "
        + " ".join(f"{base[k][0] * 1e3:>8.3f}{' ' if base[k][1] else '*'}" for k in ("one", "metis", "pipe", "heft"))
        + f" {row['x_one']:>6.2f} {row['x_best']:>6.2f} {row['x_best_hbm']:>6.2f} "
        f"{row['peak/cap']:>6.2f}{'' if row['feasible'] else '!'} {row['comm_GB']:>8.2f} "
        f"{'yes' if acyclic else 'no':>4} {row['tier_viol']:>3} {plan_s:>7.2f}  {result.strategy}",
        flush=True,
    )
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="skip 10^6 operators and the 1x8 cluster")
    ap.add_argument("--sizes", default="10000,100000,1000000")
    ap.add_argument("--clusters", default="1x4,1x8,2x8")
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--no-synthetic", action="store_true")
    ap.add_argument("--no-fixtures", action="store_true")
    ap.add_argument("--no-fusion-energy", action="store_true", help="skip bench.fusion_energy's tables")
    ap.add_argument(
        "--roofline", choices=("with", "only", "no"), default="with", help="the roofline-profile section (issue 52)"
    )
    ap.add_argument("--roofline-clusters", default="1x4,2x8")
    ap.add_argument("--roofline-sizes", default="10000")
    args = ap.parse_args()
    if args.roofline == "only":
        roofline_section(
            args.roofline_clusters.split(","),
            args.models.split(","),
            [int(s) for s in args.roofline_sizes.split(",") if s],
        )
        return
    clusters = args.clusters.split(",")
    sizes = [int(s) for s in args.sizes.split(",") if s]
    if args.quick:
        clusters = [c for c in clusters if c != "1x8"]
        sizes = [s for s in sizes if s < 1_000_000]
    print(
        f"{'case':<34} {'ops':>8} {'hyper_ms':>9} {'hbm_ms':>9} {'one_ms':>9} {'metis_ms':>9} {'pipe_ms':>9} {'heft_ms':>9} "
        f"{'x_one':>6} {'x_best':>6} {'xb_hbm':>6} {'peak':>6} {'comm_GB':>8} {'acyc':>4} {'tv':>3} {'plan_s':>7}  strategy"
    )
    rows = []
    for cl in clusters:
        nodes, per = (int(x) for x in cl.split("x"))
        inv_full = inventory_from_json({"preset": "dgx-h100", "nodes": nodes})
        opts_devices = nodes * per
        if not args.no_fixtures:
            for model in args.models.split(","):
                fname, dims = MODELS[model]
                data = (FIXTURES / fname).read_bytes()
                for mode, m, pipe in FIXTURE_RUNS:
                    opts = PlacementOptions(
                        mode=mode, micro_batches=m, pipeline=pipe, max_devices=opts_devices, allow_infeasible=True
                    )
                    label = f"{model}/{mode[:5]}/m{m}{'/pipe' if pipe else ''}/{cl}"
                    inv = inv_full if opts_devices == inv_full.n_devices else _first(inv_full, opts_devices)
                    rows.append(
                        run_case(label, lambda d=data, dm=dims: graph_from_onnx_bytes(d, dims=dm), inv, opts, m > 1)
                    )
        if not args.no_synthetic:
            inv = inv_full if opts_devices == inv_full.n_devices else _first(inv_full, opts_devices)
            for n in sizes:
                doc = synthetic_graph_json(n, seed=0)
                opts = PlacementOptions(allow_infeasible=True)
                rows.append(run_case(f"synthetic-{n}/{cl}", lambda d=doc: graph_from_json(d), inv, opts, True))
    _summary(rows)
    optimality.print_table(rows)
    if not args.no_fusion_energy:
        print()
        fusion_energy.main(args.models.split(","))
    if args.roofline == "with":
        roofline_section(
            args.roofline_clusters.split(","),
            args.models.split(","),
            [int(s) for s in args.roofline_sizes.split(",") if s],
        )


def _first(inv, k):
    from partitioners.hardware.inventory import without_devices

    return without_devices(inv, inv.device_names[k:].tolist())


def _summary(rows):
    par = [r for r in rows if r["parallel"]]
    geo = math.exp(sum(math.log(r["x_best"]) for r in par) / len(par)) if par else float("nan")
    geo_hbm = math.exp(sum(math.log(r["x_best_hbm"]) for r in par) / len(par)) if par else float("nan")
    worse_best = [r["case"] for r in rows if r["x_best_hbm"] < 0.999]
    worse_one = [r["case"] for r in rows if r["x_one_hbm"] < 0.999]
    infeasible = [r["case"] for r in rows if not r["feasible"] and r["any_base_feasible"]]
    big = [r for r in rows if r["case"].startswith("synthetic-") and r["ops"] >= 100_000]
    cyclic = [r["case"] for r in rows if r["pipeline"] and not r["acyclic"]]
    print()
    print(
        f"geomean speedup over best baseline where parallelism exists: {geo:.3f} with level-3 tiers, "
        f"{geo_hbm:.3f} placement alone (target >= 1.15)"
    )
    print(f"worse than best baseline (placement alone): {len(worse_best)} {worse_best}")
    print(f"worse than one device (placement alone): {len(worse_one)} {worse_one}")
    print(f"infeasible where a baseline was feasible: {len(infeasible)} {infeasible}")
    print(f"tier-capacity violations: {sum(r['tier_viol'] for r in rows)}")
    print(f"pipeline-mode cyclic stage graphs: {len(cyclic)} {cyclic}")
    for r in big:
        print(
            f"{r['case']}: {r['x_one']:.2f}x over one device ({r['x_one_hbm']:.2f}x placement alone; target >= 3), planned in {r['plan_s']:.1f} s"
        )


# ---------------------------------------------------------------- under the roofline profile (issue 52)

#: Cases of the roofline section: the fixtures' runs with more than one micro-batch where the
#: graph has parallelism to place, their one-batch inference as a control, and synthetic DAGs.
ROOFLINE_FIXTURE_RUNS = [
    ("inference", 1, False),
    ("inference", 8, False),
    ("training", 4, False),
    ("training", 4, True),
]


def mtkahypar_placement(graph, times_s, devices, seed=0):
    """Mt-KaHyPar (connectivity objective, 3% imbalance) on the operator hypergraph, or None if not installed.

    Nets are activation tensors (producer and consumers), weighted by bytes; operators
    weigh their time on the first device; both quantised to integers >= 1.
    """
    try:
        import mtkahypar
    except ImportError:
        return None
    k = len(devices)
    counts = np.diff(graph.consumer_ptr)
    nets = []
    net_w = []
    producer = graph.tensor_producer
    for t in np.flatnonzero((producer >= 0) & (counts > 0)).tolist():
        pins = sorted(
            {int(producer[t]), *graph.consumer_ops[graph.consumer_ptr[t] : graph.consumer_ptr[t + 1]].tolist()}
        )
        if len(pins) > 1:
            nets.append(pins)
            net_w.append(graph.tensor_bytes[t])
    scale_n = 1e6 / max(float(times_s.max()), 1e-30)
    node_w = np.maximum(1, np.round(times_s * scale_n)).astype(np.int64).tolist()
    scale_e = 1e6 / max(max(net_w, default=1.0), 1e-30)
    edge_w = [max(1, round(w * scale_e)) for w in net_w]
    mtkahypar.set_seed(seed)
    if "init" not in _MTK_INIT:  # Mt-KaHyPar may be initialised once per process
        _MTK_INIT["init"] = mtkahypar.initialize(1)
    init = _MTK_INIT["init"]
    context = init.context_from_preset(mtkahypar.PresetType.DEFAULT)
    context.set_partitioning_parameters(k, 0.03, mtkahypar.Objective.KM1)
    context.logging = False
    hg = init.create_hypergraph(context, graph.n_ops, len(nets), nets, node_w, edge_w)
    part = hg.partition(context)
    return np.asarray(devices)[np.array([part.block_id(v) for v in range(graph.n_ops)], dtype=np.int64)]


_MTK_INIT: dict = {}


def roofline_case(label, graph, inventory, options, parallel):
    """Hyperplace (``strategy="auto"``) and every baseline on one graph, all timed by the ``roofline`` profile."""
    from partitioners.costmodel.profiles import CostModelSpec, resolve_cost_model

    spec = CostModelSpec("roofline")
    t0 = time.perf_counter()
    result = place(graph, inventory, replace(options, cost_model=spec))
    plan_s = time.perf_counter() - t0
    model = resolve_cost_model(spec, inventory)
    ctx = prepare_simulation(result.graph, inventory, cost_model=model)
    devices = np.arange(inventory.n_devices)
    base = baselines(result.expanded, inventory, ctx, devices, seed=options.seed, pipeline=options.pipeline)
    times = ctx.op_times_s[:, ctx.device_profile]
    mtk = mtkahypar_placement(result.graph, times[:, 0], devices, seed=options.seed)
    if mtk is not None:
        sim = simulate(result.graph, inventory, mtk, context=ctx, record_timeline=True)
        frac = float(np.max(sim.peak_memory_bytes[np.unique(mtk)] / inventory.device_memory_bytes[np.unique(mtk)]))
        ok = frac <= 1.0 and (not options.pipeline or phase_acyclic(result.expanded, mtk))
        base["mtkahypar"] = (sim.makespan_s, ok)
    valid = [v[0] for v in base.values() if v[1]]
    best = min(valid) if valid else min(v[0] for v in base.values())
    mk_hbm = result.chosen.makespan_s
    row = {
        "case": label,
        "ops": result.graph.n_ops,
        "x_best": best / mk_hbm,
        "x_one": base["one"][0] / mk_hbm,
        "parallel": parallel,
        "pipeline": options.pipeline,
        "plan_s": plan_s,
    }
    cols = " ".join(
        f"{base[k][0] * 1e3:>9.4f}{' ' if base[k][1] else '*'}" if k in base else f"{'-':>9} "
        for k in ("one", "metis", "mtkahypar", "pipe", "heft")
    )
    print(
        f"{label:<32} {row['ops']:>7} {result.makespan_s * 1e3:>9.4f} {mk_hbm * 1e3:>9.4f} {cols} "
        f"{row['x_one']:>6.2f} {row['x_best']:>6.2f} {plan_s:>6.2f}  {result.strategy}",
        flush=True,
    )
    return row


def roofline_section(clusters, models, sizes):
    """Every strategy and baseline scored by the same simulator under the ``roofline`` profile, with the targets."""
    print()
    print("under the roofline profile (peak compute and bandwidth, no launch cost), placement alone judged:")
    print(
        f"{'case':<32} {'ops':>7} {'hyper_ms':>9} {'hbm_ms':>9} {'one_ms':>10} {'metis_ms':>10} {'mtkhp_ms':>10} "
        f"{'pipe_ms':>10} {'heft_ms':>10} {'x_one':>6} {'x_best':>6} {'plan_s':>6}  strategy"
    )
    rows = []
    for cl in clusters:
        nodes, per = (int(x) for x in cl.split("x"))
        inv_full = inventory_from_json({"preset": "dgx-h100", "nodes": nodes})
        inv = inv_full if nodes * per == inv_full.n_devices else _first(inv_full, nodes * per)
        for model in models:
            fname, dims = MODELS[model]
            graph = graph_from_onnx_bytes((FIXTURES / fname).read_bytes(), dims=dims)
            for mode, m, pipe in ROOFLINE_FIXTURE_RUNS:
                opts = PlacementOptions(mode=mode, micro_batches=m, pipeline=pipe, allow_infeasible=True)
                label = f"{model}/{mode[:5]}/m{m}{'/pipe' if pipe else ''}/{cl}"
                rows.append(roofline_case(label, graph, inv, opts, m > 1))
        for n in sizes:
            graph = graph_from_json(synthetic_graph_json(n, seed=0))
            rows.append(roofline_case(f"synthetic-{n}/{cl}", graph, inv, PlacementOptions(allow_infeasible=True), True))
    par = [r for r in rows if r["parallel"]]
    geo = math.exp(sum(math.log(r["x_best"]) for r in par) / len(par)) if par else float("nan")
    behind = [f"{r['case']} ({r['x_best']:.3f})" for r in rows if r["x_best"] < 0.99]
    slower = [f"{r['case']} ({r['x_one']:.3f})" for r in rows if r["x_one"] < 0.999]
    free = [r for r in par if not r["pipeline"]]
    geo_free = math.exp(sum(math.log(r["x_best"]) for r in free) / len(free)) if free else float("nan")
    print(f"roofline: geomean over the best baseline where parallelism exists: {geo:.3f} (target >= 1.15)")
    print(
        f"roofline: the same without pipeline mode (where cyclic baselines do not count): {geo_free:.3f} "
        f"over {len(free)} cases"
    )
    print(f"roofline: behind the best baseline by more than 1%: {len(behind)} {behind}")
    print(f"roofline: slower than one device: {len(slower)} {slower}")
    return rows


if __name__ == "__main__":
    main()
