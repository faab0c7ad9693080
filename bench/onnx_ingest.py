"""ONNX import speed against the floor of parsing and shape-inferring the same model.

For the repository's ONNX fixtures and for GPT-style exports of growing depth
(``partitioners.graph.synthetic_onnx``: dynamic batch and sequence axes, the exporter's
``Shape -> Gather -> Unsqueeze -> Concat -> Reshape`` chains), measures:

* the floor: ``onnx.load_model_from_string`` of the bytes, the input dims bound, and one
  ``onnx.shape_inference.infer_shapes(..., data_prop=True)``: what any importer that
  sizes tensors must do;
* ``graph_from_onnx_bytes`` with the same dims: what hyperplace does (validation,
  binding, inference with constant folding, size checks, operators and FLOPs);
* the ratio of the two, from CPU seconds (``time.process_time``, the median of
  ``--repeats`` runs) because the work is single-threaded and CPU time stays honest on
  a shared, busy machine.

Run: ``.venv/bin/python -m bench.onnx_ingest`` (``--layers 12 120`` for a quick run).
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import onnx

from partitioners.graph.onnx_import import graph_from_onnx_bytes
from partitioners.graph.synthetic_onnx import synthetic_transformer_onnx

FIXTURES = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "onnx"
# the symbolic input dims of each fixture and of the synthetic exports, bound as a user would
DIMS = {"batch": 8, "sequence": 128, "source": 16, "target": 16}


def _floor(data: bytes, dims: dict[str, int]) -> None:
    model = onnx.load_model_from_string(data)
    for value in model.graph.input:
        for dim in value.type.tensor_type.shape.dim:
            if dim.HasField("dim_param") and dim.dim_param in dims:
                dim.dim_value = dims[dim.dim_param]
    onnx.shape_inference.infer_shapes(model, data_prop=True)


def _cpu_s(run, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.process_time()
        run()
        times.append(time.process_time() - start)
    return statistics.median(times)


def measure(label: str, data: bytes, repeats: int) -> None:
    dims = {name: value for name, value in DIMS.items() if name.encode() in data}
    n_nodes = len(onnx.load_model_from_string(data).graph.node)
    floor_s = _cpu_s(lambda: _floor(data, dims), repeats)
    graph = graph_from_onnx_bytes(data, dims=dims)
    import_s = _cpu_s(lambda: graph_from_onnx_bytes(data, dims=dims), repeats)
    print(
        f"{label:<24}{n_nodes:>9}{graph.n_ops:>9}{len(data) / 1e6:>9.1f}{floor_s:>13.3f}{import_s:>14.3f}"
        f"{import_s / max(floor_s, 1e-9):>7.1f}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, nargs="+", default=[12, 120, 1200])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    print(f"{'model':<24}{'nodes':>9}{'ops':>9}{'file_MB':>9}{'floor_cpu_s':>13}{'import_cpu_s':>14}{'ratio':>7}")
    for path in sorted(FIXTURES.glob("*.onnx")):
        measure(path.stem, path.read_bytes(), args.repeats)
    for layers in args.layers:
        measure(f"synthetic-gpt-{layers}", synthetic_transformer_onnx(layers), args.repeats if layers < 1000 else 1)


if __name__ == "__main__":
    main()
