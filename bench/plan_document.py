"""What the plan's ``schedule`` costs a submission: time and stored bytes, against the plan without it.

A plan computed in a request is placed (``place``), described (``plan_document``) and
stored compressed (``pack_json``). The schedule is built once, for the final plan, in
the second step and stored in the third; this prints each step's seconds (best of
``--repeat``) and the stored bytes, with the same document's figures without the
schedule as the baseline measured in the same run, on synthetic layered DAGs placed on
one DGX H100 node.

Run: ``.venv/bin/python -m bench.plan_document`` (``--sizes 10000,100000``).
"""

from __future__ import annotations

import argparse
import time
import tracemalloc

from partitioners.graph.generators import synthetic_hypergraph
from partitioners.hardware.inventory import preset_inventory
from partitioners.placement.engine import PlacementOptions, place
from service.domain import plan_document as document
from service.storage.blobs import pack_json


def _best_of(repeat: int, work) -> tuple[float, object]:
    best, value = float("inf"), None
    for _ in range(repeat):
        started = time.perf_counter()
        value = work()
        best = min(best, time.perf_counter() - started)
    return best, value


def _allocated_mb(work) -> float:
    tracemalloc.start()
    kept = work()
    allocated = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    del kept
    return allocated / 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="10000")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    inventory = preset_inventory("dgx-h100", 1)
    print(
        f"{'ops':>8} {'place_s':>8} {'document_s':>10} {'schedule_s':>10} {'pack_s':>7} {'pack_without_s':>14} "
        f"{'stored_MB':>9} {'without_MB':>10} {'holdings':>9} {'schedule_MB':>11} {'tensors_MB':>10}"
    )
    for n in (int(s) for s in args.sizes.split(",") if s):
        graph = synthetic_hypergraph(n, seed=0)
        place_s, result = _best_of(args.repeat, lambda g=graph: place(g, inventory, PlacementOptions()))
        document_s, (_, _, body) = _best_of(args.repeat, lambda r=result: document.plan_document(r, inventory))
        schedule_s, _ = _best_of(args.repeat, lambda r=result: document.schedule_document(r, inventory))
        pack_s, stored = _best_of(args.repeat, lambda b=body: pack_json(b))
        without = {k: v for k, v in body.items() if k != "schedule"}
        pack_without_s, stored_without = _best_of(args.repeat, lambda b=without: pack_json(b))
        schedule_mb = _allocated_mb(lambda r=result: document.schedule_document(r, inventory))
        tensors_mb = _allocated_mb(lambda r=result: document._tensors(r, inventory))
        print(
            f"{n:>8} {place_s:>8.3f} {document_s:>10.3f} {schedule_s:>10.3f} {pack_s:>7.3f} {pack_without_s:>14.3f} "
            f"{len(stored) / 1e6:>9.2f} {len(stored_without) / 1e6:>10.2f} {len(body['schedule']['holdings']):>9} "
            f"{schedule_mb:>11.0f} {tensors_mb:>10.0f}",
            flush=True,
        )


if __name__ == "__main__":
    main()
