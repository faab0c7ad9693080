"""Small request bodies shared by the API tests."""

from __future__ import annotations

import copy


def diamond_graph(name: str = "diamond", scale: float = 1.0) -> dict:
    """x -> a -> (b, c) -> d: a fork-join with a parameter on every operator."""
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


def plan_request(graph: dict | None = None, *, preset: str = "dgx-h100", nodes: int = 1, **options) -> dict:
    return {"graph": copy.deepcopy(graph or diamond_graph()), "inventory": {"preset": preset, "nodes": nodes}, "options": options}
