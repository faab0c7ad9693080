"""The computation graph: a hypergraph in numpy arrays, and how graphs get into it.

- :mod:`~partitioners.graph.hypergraph`: :class:`Hypergraph`, :func:`graph_from_json`,
  :func:`graph_to_json`, :func:`model_hash`, :func:`topological_order`, :func:`graph_summary`.
- :mod:`~partitioners.graph.onnx_import`: :func:`graph_from_onnx_bytes`.
- :mod:`~partitioners.graph.flops`: :func:`estimate_flops` per operator type from shapes.
- :mod:`~partitioners.graph.transforms`: :func:`expand_graph` (backward pass, optimizer
  step, micro-batch copies).
- :mod:`~partitioners.graph.generators` and :mod:`~partitioners.graph.synthetic_onnx`:
  synthetic graphs for tests and benchmarks.
"""

from partitioners.graph.hypergraph import (
    Hypergraph,
    build_hypergraph,
    graph_from_json,
    graph_summary,
    graph_to_json,
    model_hash,
    topological_order,
)
from partitioners.graph.onnx_import import graph_from_onnx_bytes
from partitioners.graph.transforms import ExpandedGraph, expand_graph

__all__ = [
    "ExpandedGraph",
    "Hypergraph",
    "build_hypergraph",
    "expand_graph",
    "graph_from_json",
    "graph_from_onnx_bytes",
    "graph_summary",
    "graph_to_json",
    "model_hash",
    "topological_order",
]
