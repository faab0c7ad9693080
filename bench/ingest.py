"""JSON graph ingestion speed against the floor of parsing the same file.

For each size, writes ``partitioners.graph.generators.synthetic_graph_json(n_ops)`` to a temporary
file, then in a fresh subprocess (so peak memory is that size's alone) measures:

* ``json.loads`` of the file's text: the floor, work any ingestion must do;
* ``graph_from_json`` (validation, arrays, cycle check) + ``model_hash`` on the
  parsed document: what hyperplace adds;
* the ratio of the two (target: <= 5x, and < 10 s at 10^6 operators), from CPU
  seconds (``time.process_time``) because the work is single-threaded and CPU time
  stays honest on a shared, busy machine; wall seconds are printed beside it;
* peak resident memory of the subprocess (``ru_maxrss``) and of the parsed
  document alone measured the same way, as its baseline.

Run: ``.venv/bin/python -m bench.ingest`` (``--sizes 10000 100000`` for a quick run).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

_CHILD = r"""
import json, resource, sys, time
from partitioners.graph.canonical import model_hash
from partitioners.graph.json_import import graph_from_json
path, mode = sys.argv[1], sys.argv[2]
text = open(path).read()
c0, t0 = time.process_time(), time.perf_counter()
doc = json.loads(text)
c1, t1 = time.process_time(), time.perf_counter()
if mode == "ingest":
    graph = graph_from_json(doc)
    digest = model_hash(graph)
c2, t2 = time.process_time(), time.perf_counter()
print(json.dumps({"loads_s": t1 - t0, "ingest_s": t2 - t1, "loads_cpu_s": c1 - c0, "ingest_cpu_s": c2 - c1,
                  "maxrss_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss}))
"""


def _run(path: Path, mode: str) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", _CHILD, str(path), mode],
        check=True,
        capture_output=True,
        text=True,
        cwd=Path(__file__).resolve().parent.parent,
    )
    return json.loads(out.stdout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000, 1_000_000])
    args = parser.parse_args()
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from partitioners.graph.generators import synthetic_graph_json

    print(
        f"{'n_ops':>9} {'file_MB':>8} {'loads_cpu_s':>11} {'ingest+hash_cpu_s':>17} {'ratio':>6} "
        f"{'loads_wall_s':>12} {'ingest+hash_wall_s':>18} {'peak_MiB':>9} {'loads_only_peak_MiB':>20}"
    )
    with tempfile.TemporaryDirectory() as tmp:
        for n_ops in args.sizes:
            path = Path(tmp) / f"graph-{n_ops}.json"
            path.write_text(json.dumps(synthetic_graph_json(n_ops)))
            size_mb = path.stat().st_size / 1e6
            baseline = _run(path, "loads")
            measured = _run(path, "ingest")
            ratio = measured["ingest_cpu_s"] / measured["loads_cpu_s"]
            print(
                f"{n_ops:>9} {size_mb:>8.1f} {measured['loads_cpu_s']:>11.2f} {measured['ingest_cpu_s']:>17.2f} "
                f"{ratio:>6.2f} {measured['loads_s']:>12.2f} {measured['ingest_s']:>18.2f} "
                f"{measured['maxrss_kib'] / 1024:>9.0f} {baseline['maxrss_kib'] / 1024:>20.0f}",
                flush=True,
            )
            path.unlink()


if __name__ == "__main__":
    main()
