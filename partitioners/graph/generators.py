"""Synthetic layered DAGs for benchmarks: as large as asked, with known parallelism.

Operators sit in ``lanes`` parallel streams that mostly feed themselves and now
and then read a neighbour's output, like the branches of an Inception block or
the experts of a mixture, so total work over critical path is roughly the lane
count (about 15 for the default 18 lanes). Sizes and FLOPs are log-normal so no two
operators cost the same. Everything is built from numpy arrays, so 10^6
operators take about a second.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from partitioners.graph.hypergraph import Hypergraph, build_hypergraph
from partitioners.graph.json_import import GraphJson, NodeJson, TensorJson

__all__ = ["synthetic_hypergraph", "synthetic_graph_json", "diamond_graph_json"]


#: :func:`_layout`'s columns, per operator: first input (op id), whether it has one,
#: second input, whether it has one, FLOPs, output bytes, whether it has weights, weight bytes.
_Layout = tuple[
    npt.NDArray[np.int64],
    npt.NDArray[np.bool_],
    npt.NDArray[np.int64],
    npt.NDArray[np.bool_],
    npt.NDArray[np.float64],
    npt.NDArray[np.float64],
    npt.NDArray[np.bool_],
    npt.NDArray[np.float64],
]


def _layout(n_ops: int, lanes: int, seed: int) -> _Layout:
    rng = np.random.default_rng(seed)
    op_ids = np.arange(n_ops, dtype=np.int64)
    level = op_ids // lanes
    lane = op_ids % lanes
    # first input: same lane on the previous level (80%) or a random lane there
    jump = rng.random(n_ops) < 0.2
    src_lane = np.where(jump, rng.integers(0, lanes, n_ops), lane)
    first = (level - 1) * lanes + src_lane
    # second input for 30%: any lane one to three levels back
    back = rng.integers(1, 4, n_ops)
    second = (level - back) * lanes + rng.integers(0, lanes, n_ops)
    has_second = (rng.random(n_ops) < 0.3) & (second >= 0) & (second < op_ids)
    has_first = (level > 0) & (first < n_ops)
    flops = rng.lognormal(mean=np.log(2e9), sigma=0.6, size=n_ops)
    out_bytes = np.round(rng.lognormal(mean=np.log(4e6), sigma=0.7, size=n_ops))
    has_param = rng.random(n_ops) < 0.5
    param_bytes = np.round(rng.lognormal(mean=np.log(8e6), sigma=0.5, size=n_ops)) * has_param
    return first, has_first, second, has_second, flops, out_bytes, has_param, param_bytes


def synthetic_hypergraph(n_ops: int, *, lanes: int = 18, seed: int = 0) -> Hypergraph:
    """A layered DAG of ``n_ops`` operators in ``lanes`` streams, built directly as arrays.

    Tensors: one activation output per operator (id = op id), one parameter per
    operator that has weights (ids after the activations) and one graph input read
    by the first level.
    """
    first, has_first, second, has_second, flops, out_bytes, has_param, param_bytes = _layout(n_ops, lanes, seed)
    n_params = int(has_param.sum())
    input_tensor = n_ops + n_params
    param_id = np.full(n_ops, -1, dtype=np.int64)
    param_id[has_param] = n_ops + np.arange(n_params)
    first_input = np.where(has_first, first, input_tensor)

    counts = 1 + has_second.astype(np.int64) + has_param.astype(np.int64)
    input_ptr = np.zeros(n_ops + 1, dtype=np.int64)
    np.cumsum(counts, out=input_ptr[1:])
    input_tensors = np.empty(int(input_ptr[-1]), dtype=np.int64)
    input_tensors[input_ptr[:-1]] = first_input
    cursor = input_ptr[:-1] + 1
    input_tensors[cursor[has_second]] = second[has_second]
    cursor = cursor + has_second
    input_tensors[cursor[has_param]] = param_id[has_param]

    n_tensors = n_ops + n_params + 1
    tensor_bytes = np.concatenate([out_bytes, param_bytes[has_param], [float(out_bytes[:lanes].mean())]])
    is_param = np.zeros(n_tensors, dtype=bool)
    is_param[n_ops : n_ops + n_params] = True
    op_names = np.array([f"op{i}" for i in range(n_ops)], dtype=object)
    tensor_names = np.array(
        [f"t{i}" for i in range(n_ops)] + [f"w{i}" for i in np.flatnonzero(has_param)] + ["input"],
        dtype=object,
    )
    op_types = np.where(has_param, "MatMul", "Add").astype(object)
    return build_hypergraph(
        name=f"synthetic-{n_ops}",
        op_names=op_names,
        op_types=op_types,
        op_flops=flops,
        input_ptr=input_ptr,
        input_tensors=input_tensors,
        output_ptr=np.arange(n_ops + 1, dtype=np.int64),
        output_tensors=np.arange(n_ops, dtype=np.int64),
        tensor_names=tensor_names,
        tensor_bytes=tensor_bytes,
        tensor_is_parameter=is_param,
    )


def synthetic_graph_json(n_ops: int, *, lanes: int = 18, seed: int = 0) -> GraphJson:
    """The same DAG as :func:`synthetic_hypergraph` in the service's JSON graph form."""
    graph = synthetic_hypergraph(n_ops, lanes=lanes, seed=seed)
    names = graph.tensor_names
    nodes: list[NodeJson] = []
    for op in range(n_ops):
        nodes.append(
            {
                "name": graph.op_names[op],
                "op": graph.op_types[op],
                "inputs": [names[t] for t in graph.inputs_of(op)],
                "outputs": [names[t] for t in graph.outputs_of(op)],
                "flops": float(graph.op_flops[op]),
            }
        )
    tensors: list[TensorJson] = []
    for t in range(graph.n_tensors):
        tensor: TensorJson = {"name": names[t], "bytes": int(graph.tensor_bytes[t])}
        if graph.tensor_kind[t] == 2:
            tensor["kind"] = "parameter"
        tensors.append(tensor)
    return {"name": graph.name, "nodes": nodes, "tensors": tensors}


def diamond_graph_json(name: str = "diamond", *, scale: float = 1.0) -> GraphJson:
    """x -> a -> (b, c) -> d: the smallest graph with a fork, a join and parameters (API tests, load test)."""
    mb = 1_000_000
    return {
        "name": name,
        "nodes": [
            {"name": "a", "op": "MatMul", "inputs": ["x", "wa"], "outputs": ["ya"], "flops": 4e9 * scale},
            {"name": "b", "op": "MatMul", "inputs": ["ya", "wb"], "outputs": ["yb"], "flops": 8e9 * scale},
            {"name": "c", "op": "MatMul", "inputs": ["ya", "wc"], "outputs": ["yc"], "flops": 8e9 * scale},
            {"name": "d", "op": "Add", "inputs": ["yb", "yc"], "outputs": ["out"], "flops": 1e6},
        ],
        "tensors": [
            {"name": "x", "bytes": 4 * mb, "shape": [1024, 1024], "dtype": "float32"},
            {"name": "wa", "bytes": 8 * mb, "kind": "parameter"},
            {"name": "wb", "bytes": 8 * mb, "kind": "parameter"},
            {"name": "wc", "bytes": 8 * mb, "kind": "parameter"},
            {"name": "ya", "bytes": 4 * mb},
            {"name": "yb", "bytes": 4 * mb},
            {"name": "yc", "bytes": 4 * mb},
            {"name": "out", "bytes": 4 * mb},
        ],
    }
