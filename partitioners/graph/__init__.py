"""The computation graph: a hypergraph in numpy arrays, and how graphs get into it.

- :mod:`~partitioners.graph.hypergraph`: :class:`Hypergraph` (numpy arrays, CSR relations),
  :func:`build_hypergraph`, :func:`topological_order`, :func:`op_levels`, :func:`graph_summary`.
- :mod:`~partitioners.graph.json_import`: :func:`graph_from_json`, the JSON form and its checks.
- :mod:`~partitioners.graph.canonical`: the name order, :func:`model_hash`,
  :func:`canonical_graph` (the graph renumbered into name order) and :func:`graph_to_json`.
- :mod:`~partitioners.graph.onnx_import`: :func:`graph_from_onnx_bytes`.
- :mod:`~partitioners.graph.flops`: :func:`estimate_flops` per operator type from shapes.
- :mod:`~partitioners.graph.transforms`: :func:`expand_graph` (backward pass, optimizer
  step, micro-batch copies).
- :mod:`~partitioners.graph.generators` and :mod:`~partitioners.graph.synthetic_onnx`:
  synthetic graphs for tests and benchmarks.
"""

from partitioners.graph.canonical import NameOrder, canonical_graph, graph_to_json, model_hash, name_order
from partitioners.graph.hypergraph import Hypergraph, build_hypergraph, graph_summary, op_levels, topological_order
from partitioners.graph.json_import import graph_from_json
from partitioners.graph.onnx_import import graph_from_onnx_bytes
from partitioners.graph.transforms import ExpandedGraph, expand_graph

__all__ = [
    "ExpandedGraph",
    "Hypergraph",
    "NameOrder",
    "build_hypergraph",
    "canonical_graph",
    "expand_graph",
    "graph_from_json",
    "graph_from_onnx_bytes",
    "graph_summary",
    "graph_to_json",
    "model_hash",
    "name_order",
    "op_levels",
    "topological_order",
]
