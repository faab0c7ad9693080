"""Fusion on and off, and the energy objectives, on the ONNX fixtures.

Two tables, each from plans made in this run (no figure is fitted):

1. Fusion: every fixture planned for inference on 4 H100s (DGX preset) with
   ``fusion`` none / elementwise / compiler: kernels launched (operators of the placed
   graph), main-memory traffic the cost model charges (each kernel's inputs and outputs),
   the bytes fusion saves, predicted makespan and planning seconds.
2. Energy: every fixture planned on 8 H100s, and on a mixed cluster of one DGX H100
   node and one 4 x L40S workstation, with ``objective`` makespan / energy /
   energy_delay: makespan, joules per step (``summary.energy_j``: busy x board power
   + idle x idle power + transfers), devices used. ``held`` counts the idle power of
   usable devices the plan leaves unused; ``freed`` does not (``count_idle_devices``).

Run: ``.venv/bin/python -m bench.fusion_energy`` (a few minutes on two cores);
``bench.placement`` runs it at the end unless ``--no-fusion-energy``.
"""

from __future__ import annotations

import argparse
import pathlib
import time

from partitioners.graph.onnx_import import graph_from_onnx_bytes
from partitioners.hardware.inventory import Inventory, inventory_from_json, inventory_to_json
from partitioners.placement.engine import PlacementOptions, place

FIXTURES = pathlib.Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "onnx"
MODELS = {
    "resnet50": ("resnet50.onnx", {"batch": 32}),
    "bert": ("bert_base.onnx", {"batch": 8, "sequence": 512}),
    "gpt2": ("gpt2.onnx", {"batch": 8, "sequence": 512}),
    "lstm": ("lstm_seq2seq.onnx", {"batch": 32, "source": 64, "target": 64}),
}


def mixed_cluster() -> Inventory:
    """One DGX H100 node and one 4 x L40S PCIe workstation joined by the workstation's 100 GbE."""
    dgx = inventory_to_json(inventory_from_json({"preset": "dgx-h100", "nodes": 1}))
    workstation = inventory_to_json(inventory_from_json({"preset": "pcie-workstation", "nodes": 1}))
    link = workstation["groups"][0]["link"]
    return inventory_from_json(
        {"name": "mixed", "groups": dgx["groups"] + workstation["groups"], "link": {**link, "latency_s": 10e-6}}
    )


def fusion_table(models: list[str]) -> None:
    inv = inventory_from_json({"preset": "dgx-h100", "nodes": 1})
    print(
        f"{'model':<9} {'fusion':<12} {'kernels':>8} {'hbm_GB':>8} {'saved_GB':>9} {'makespan_ms':>12} "
        f"{'x_unfused':>9} {'plan_s':>7}"
    )
    for model in models:
        fname, dims = MODELS[model]
        graph = graph_from_onnx_bytes((FIXTURES / fname).read_bytes(), dims=dims)
        base_ms = None
        for fusion in ("none", "elementwise", "compiler"):
            t0 = time.perf_counter()
            result = place(graph, inv, PlacementOptions(max_devices=4, fusion=fusion, allow_infeasible=True))
            plan_s = time.perf_counter() - t0
            placed = result.graph
            hbm_gb = float((placed.op_input_bytes() + placed.op_output_bytes()).sum()) / 1e9
            saved_gb = 0.0 if result.fusion is None else float(result.fusion.bytes_saved.sum()) / 1e9
            ms = result.makespan_s * 1e3
            base_ms = base_ms or ms
            print(
                f"{model:<9} {fusion:<12} {placed.n_ops:>8} {hbm_gb:>8.2f} {saved_gb:>9.2f} {ms:>12.3f} "
                f"{base_ms / ms:>9.2f} {plan_s:>7.2f}"
            )


def energy_table(models: list[str]) -> None:
    clusters = {"8xH100": inventory_from_json({"preset": "dgx-h100", "nodes": 1}), "H100+L40S": mixed_cluster()}
    print(
        f"{'model':<9} {'cluster':<10} {'objective':<13} {'idle':<6} {'makespan_ms':>12} {'energy_J':>10} "
        f"{'devices':>7}  strategy"
    )
    for model in models:
        fname, dims = MODELS[model]
        graph = graph_from_onnx_bytes((FIXTURES / fname).read_bytes(), dims=dims)
        for cluster, inv in clusters.items():
            for objective in ("makespan", "energy", "energy_delay"):
                for held in (True, False):
                    options = PlacementOptions(objective=objective, count_idle_devices=held, allow_infeasible=True)
                    result = place(graph, inv, options)
                    assert result.energy is not None
                    print(
                        f"{model:<9} {cluster:<10} {objective:<13} {'held' if held else 'freed':<6} "
                        f"{result.makespan_s * 1e3:>12.3f} {result.energy.total_j:>10.3f} "
                        f"{result.devices_used:>7}  {result.strategy}"
                    )


def main(models: list[str] | None = None) -> None:
    models = models or list(MODELS)
    print("== fusion on 4 x H100 (inference) ==")
    fusion_table(models)
    print()
    print("== energy objectives ==")
    energy_table(models)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=",".join(MODELS))
    main(ap.parse_args().models.split(","))
