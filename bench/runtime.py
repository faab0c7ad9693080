"""Measured truth on this machine: plans run with ONNX Runtime, predicted vs measured, before and after feedback.

For each ONNX fixture (ResNet-50, BERT-base, GPT-2, the LSTM seq2seq) the script

1. describes this machine as an inventory of 1 and of 2 logical CPU devices, from a
   microbenchmark it runs first: peak FP32 FLOP/s of a numpy matmul (best of 5, all cores),
   memory bandwidth of a large array copy (read + write bytes, best of 5), and the
   hand-over latency between two host threads (the "link" between logical devices, which
   share memory). A device of k of the n cores gets k/n of the peak and of the bandwidth;
2. plans the model on each inventory through the HTTP service (in-process, a fresh SQLite
   database per model, so no model's feedback calibrates another's);
3. runs each plan (``service.client.onnx_runner``): one ONNX Runtime session per part,
   outputs checked against the unsplit model, ``--steps`` measured steps after 2 warm-up
   ones, per-operator times from ONNX Runtime's profiler;
4. prints the plan's predicted makespan next to the measured median step and the median
   per-operator relative error (the plan's trace against the profiler), then posts the
   timeline as feedback and prints the service's accuracy before and after calibration
   (``GET /v1/plans/{id}/accuracy``), and the re-plan with the calibrated model, run and
   measured the same way.

Run: ``python -m bench.runtime`` (several minutes on two cores), ``--quick`` (short
sequences, 3 steps), ``--models resnet50,lstm`` to pick fixtures; ``--print-inventory 2``
prints this machine as an inventory of two CPU devices and stops (the README's "Run it").
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import platform
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
from fastapi.testclient import TestClient

from service.app import create_app
from service.client.onnx_runner import PlanRunner, compare_with_plan, example_inputs, prepare_model
from service.settings import Settings

ROOT = pathlib.Path(__file__).resolve().parent.parent
ONNX = ROOT / "tests" / "fixtures" / "onnx"
MODELS = {
    "resnet50": ("resnet50.onnx", {"batch": 1}, {"batch": 1}),
    "bert": ("bert_base.onnx", {"batch": 1, "sequence": 128}, {"batch": 1, "sequence": 32}),
    "gpt2": ("gpt2.onnx", {"batch": 1, "sequence": 128}, {"batch": 1, "sequence": 32}),
    "lstm": ("lstm_seq2seq.onnx", {"batch": 1, "source": 32, "target": 32}, {"batch": 1, "source": 16, "target": 16}),
}


def measure_machine() -> dict:
    """Peak FP32 FLOP/s (numpy matmul), memory bandwidth (array copy) and thread hand-over latency."""
    n = 1024
    a = np.random.default_rng(0).standard_normal((n, n), dtype=np.float32)
    b = np.random.default_rng(1).standard_normal((n, n), dtype=np.float32)
    a @ b  # warm-up: BLAS threads start
    best = min(_timed(lambda: a @ b) for _ in range(5))
    flops = 2.0 * n**3 / best
    src = np.ones(64 * 1024 * 1024 // 4, dtype=np.float32)  # 64 MiB, beyond any last-level cache here
    dst = np.empty_like(src)
    np.copyto(dst, src)
    best = min(_timed(lambda: np.copyto(dst, src)) for _ in range(5))
    bandwidth = 2.0 * src.nbytes / best
    with ThreadPoolExecutor(max_workers=1) as pool:
        pool.submit(int).result()
        handover = float(np.median([_timed(lambda: pool.submit(int).result()) for _ in range(200)]))
    return {
        "cores": os.cpu_count() or 1,
        "peak_flops": flops,
        "bandwidth_bytes_per_s": bandwidth,
        "handover_s": handover,
        "cpu": platform.processor() or platform.machine(),
    }


def _timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def cpu_inventory(machine: dict, n_devices: int) -> dict:
    """This machine as ``n_devices`` logical CPU devices, each with an equal share of the cores."""
    share = 1.0 / n_devices
    device = {
        "type": "host-cpu",
        "peak_flops": {"fp32": machine["peak_flops"] * share},
        "memory_tiers": [
            {"name": "dram", "capacity_bytes": 8e9, "bandwidth_bytes_per_s": machine["bandwidth_bytes_per_s"] * share}
        ],
    }
    return {
        "name": f"this-host-{n_devices}",
        "default_dtype": "fp32",
        "groups": [
            {
                "name": "host",
                "devices": [{"name": f"cpu{d}", **device} for d in range(n_devices)],
                # logical devices share memory: a boundary tensor is handed over, not copied
                "link": {"bandwidth_bytes_per_s": machine["bandwidth_bytes_per_s"], "latency_s": machine["handover_s"]},
            }
        ],
    }


def _check(response, status=(200, 201)):
    if response.status_code not in status:
        raise SystemExit(
            f"{response.request.method} {response.request.url.path}: {response.status_code} {response.text[:500]}"
        )
    return response.json()


def _measure(prepared, plan: dict, trace: dict, steps: int) -> tuple[dict, object]:
    # no spinning: on a machine shared with other work, spinning intra-op threads measure the neighbours
    with PlanRunner(prepared, plan, spin=False) as runner:
        result = runner.run(example_inputs(prepared), steps=steps, warmup=2)
    return compare_with_plan(prepared, plan, result, trace), result


def run_model(name: str, machine: dict, *, quick: bool, steps: int) -> list[dict]:
    fname, dims, quick_dims = MODELS[name]
    dims = quick_dims if quick else dims
    data = (ONNX / fname).read_bytes()
    prepared = prepare_model(data, dims)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        settings = Settings(
            database_url=f"sqlite:///{tmp}/bench.sqlite3",
            auth="disabled",
            embedded_worker=False,
            auto_migrate=True,
            log_level="WARNING",
            sync_max_ops=10**7,
            max_body_bytes=512 * 1024 * 1024,
        )
        with TestClient(create_app(settings)) as client:
            for n_devices in (1, 2):
                plan = _check(
                    client.post(
                        "/v1/plans",
                        files={"model": (fname, data, "application/octet-stream")},
                        data={
                            "inventory": json.dumps(cpu_inventory(machine, n_devices)),
                            "options": json.dumps({"dims": dims}),
                        },
                    )
                )
                trace = _check(client.get(f"/v1/plans/{plan['id']}/trace"))
                before, result = _measure(prepared, plan, trace, steps)
                _check(
                    client.post(
                        f"/v1/plans/{plan['id']}/feedback",
                        json={"format": "simple", "match": "name", "timeline": result.timeline()},
                    )
                )
                accuracy = _check(client.get(f"/v1/plans/{plan['id']}/accuracy"))
                replan = _check(client.post(f"/v1/plans/{plan['id']}/replan", json={}))
                replan_trace = _check(client.get(f"/v1/plans/{replan['id']}/trace"))
                after, _ = _measure(prepared, replan, replan_trace, steps)
                rows.append(
                    {
                        "model": name,
                        "dims": dims,
                        "devices": n_devices,
                        "used": plan["summary"]["devices_used"],
                        "strategy": plan["strategy"],
                        "parts": len(result.parts),
                        "ops": len(plan["ops"]),
                        "max_abs_diff": max(d[0] for d in result.diffs.values()),
                        "before": before,
                        "accuracy": accuracy,
                        "replan": after,
                        "replan_used": replan["summary"]["devices_used"],
                    }
                )
    return rows


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{1e3 * x:.2f}"


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.0f}%"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", default=",".join(MODELS), help="comma-separated subset of " + ", ".join(MODELS))
    parser.add_argument("--quick", action="store_true", help="short sequences and 3 measured steps")
    parser.add_argument("--steps", type=int, default=None, help="measured steps per run (default 10, quick 3)")
    parser.add_argument(
        "--print-inventory",
        type=int,
        metavar="N",
        help="print this machine as an inventory of N CPU devices (JSON) and stop",
    )
    args = parser.parse_args()
    steps = args.steps or (3 if args.quick else 10)
    machine = measure_machine()
    if args.print_inventory:
        print(json.dumps(cpu_inventory(machine, args.print_inventory), indent=1))
        return
    print(
        f"machine: {machine['cores']} cores ({machine['cpu']}), numpy matmul peak "
        f"{machine['peak_flops'] / 1e9:.1f} GFLOP/s fp32, copy bandwidth {machine['bandwidth_bytes_per_s'] / 1e9:.1f} "
        f"GB/s, thread hand-over {machine['handover_s'] * 1e6:.0f} us; {steps} measured steps after 2 warm-up"
    )
    rows = []
    for name in args.models.split(","):
        if name:
            rows += run_model(name, machine, quick=args.quick, steps=steps)
    print()
    head = (
        f"{'model':9s} {'dims':28s} {'dev':>3s} {'used':>4s} {'parts':>5s} | {'predicted':>9s} {'measured':>9s} "
        f"{'unsplit':>8s} | {'makespan err':>14s} | {'op median err':>14s} | {'re-plan: used':>13s} {'pred':>8s} "
        f"{'measured':>9s}"
    )
    print(head + "   (times in ms; errors before -> after one feedback round)")
    print("-" * len(head))
    for r in rows:
        b, acc, re = r["before"], r["accuracy"], r["replan"]
        dims = ",".join(f"{k}={v}" for k, v in r["dims"].items())
        print(
            f"{r['model']:9s} {dims:28s} {r['devices']:3d} {r['used']:4d} {r['parts']:5d} | "
            f"{_ms(b['predicted_makespan_s']):>9s} {_ms(b['measured_makespan_s']):>9s} {_ms(b['unsplit_step_s']):>8s} | "
            f"{_arrow(acc, 'makespan_rel_error'):>14s} | {_arrow(acc, 'op_median_rel_error'):>14s} | "
            f"{r['replan_used']:13d} {_ms(re['predicted_makespan_s']):>8s} {_ms(re['measured_makespan_s']):>9s}"
        )
    print()
    print("predicted: the plan's makespan; measured: median wall time of a step run as planned (ONNX Runtime,")
    print("one session per part); unsplit: the whole model in one session with every core. Errors are the")
    print("service's (GET /v1/plans/{id}/accuracy): the plan's simulated step against the measured timeline's")
    print("(profiled kernels on the host clock), and the median over operators of |predicted - measured| / measured.")
    print("re-plan: POST .../replan with the calibration, run and measured the same way.")
    if rows:
        before = float(np.median([r["accuracy"]["before"]["makespan_rel_error"] for r in rows]))
        after = float(np.median([r["accuracy"]["after"]["makespan_rel_error"] for r in rows]))
        op_before = float(np.median([r["accuracy"]["before"]["op_median_rel_error"] for r in rows]))
        op_after = float(np.median([r["accuracy"]["after"]["op_median_rel_error"] for r in rows]))
        print()
        print(
            f"median over rows: makespan error {_pct(before)} -> {_pct(after)}, "
            f"per-operator error {_pct(op_before)} -> {_pct(op_after)}"
        )


def _arrow(accuracy: dict, key: str) -> str:
    return f"{_pct(accuracy['before'][key])} -> {_pct(accuracy['after'][key])}"


if __name__ == "__main__":
    main()
