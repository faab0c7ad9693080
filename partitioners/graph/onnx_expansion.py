"""How many operators an ONNX model expands to, counted before anything expands it.

Why: a model's local functions are inlined wherever they are called, and ONNX shape
inference walks every call. A function that calls the one before it twice, forty deep
(``f0`` one ``Relu``, ``f_k`` two calls of ``f_(k-1)``, the graph one call of ``f40``),
is a 3 KB file that expands to 2^40 operators: inference never finishes. Counting the
expansion costs one pass over each function body and each graph, with each function's
count kept once computed, so a file whose expansion is astronomical is counted in
microseconds and refused before inference sees it.

What counts (the ONNX IR's function semantics [1]): a call of a local function is its
body, inlined (the call itself is not an operator once inlined); any other node is one
operator, plus the operators of the graphs it holds (``If`` branches, ``Loop`` and
``Scan`` bodies), each counted once, as inference walks each once, whatever the trip
count at run time.

References
----------
[1] ONNX IR specification, "Functions", https://onnx.ai/onnx/repo-docs/IR.html#functions
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import onnx
from onnx import AttributeProto

from partitioners.errors import InvalidInput

__all__ = ["expanded_op_count"]

_FunctionKey = tuple[str, str, str]


def _key(domain: str, name: str, overload: str) -> _FunctionKey:
    return ("" if domain == "ai.onnx" else domain, name, overload)


def expanded_op_count(model: onnx.ModelProto) -> int:
    """Operators ``model`` holds once its local functions are inlined and its subgraphs counted.

    An exact (unbounded) integer: ``2**40`` for the file described above.

    Raises
    ------
    InvalidInput
        ``malformed-onnx`` when a local function calls itself, directly or through others
        (inlining it would never end).
    """
    functions = {_key(f.domain, f.name, getattr(f, "overload", "")): f for f in model.functions}
    counted: dict[_FunctionKey, int] = {}

    def called(node: onnx.NodeProto) -> _FunctionKey | None:
        key = _key(node.domain, node.op_type, getattr(node, "overload", ""))
        return key if key in functions else None

    def calls(nodes: Iterable[onnx.NodeProto]) -> Iterator[_FunctionKey]:
        for node in nodes:
            key = called(node)
            if key is not None:
                yield key
            for graph in _subgraphs(node):
                yield from calls(graph.node)

    def nodes_count(nodes: Iterable[onnx.NodeProto]) -> int:
        """Operators of ``nodes`` once every function they call is counted."""
        total = 0
        for node in nodes:
            key = called(node)
            if key is not None:
                total += counted[key]
                continue
            total += 1 + sum(nodes_count(graph.node) for graph in _subgraphs(node))
        return total

    # Depth first with an explicit stack: a chain of 10,000 functions, each calling the
    # next, is a small file too, and must not exhaust Python's recursion limit.
    for root in calls(model.graph.node):
        stack, on_path = [root], set()
        while stack:
            key = stack[-1]
            if key in counted:
                stack.pop()
                continue
            pending = [callee for callee in calls(functions[key].node) if callee not in counted]
            if not pending:
                counted[key] = nodes_count(functions[key].node)
                on_path.discard(key)
                stack.pop()
                continue
            for callee in pending:
                if callee in on_path or callee == key:
                    raise InvalidInput(
                        f"local function '{callee[1]}' (domain '{callee[0]}') calls itself, directly or through "
                        "other functions; inlining it would never end",
                        field="model",
                        code="malformed-onnx",
                    )
            on_path.add(key)
            stack.extend(pending)
    return nodes_count(model.graph.node)


def _subgraphs(node: onnx.NodeProto) -> Iterator[onnx.GraphProto]:
    """The graphs a node holds (``If`` branches, ``Loop`` and ``Scan`` bodies)."""
    for attr in node.attribute:
        if attr.type == AttributeProto.GRAPH:
            yield attr.g
        elif attr.type == AttributeProto.GRAPHS:
            yield from attr.graphs
