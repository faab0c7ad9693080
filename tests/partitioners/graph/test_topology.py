"""Topological order and levels: producers first, depth = longest path, cycles named."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from partitioners.errors import InvalidInput
from partitioners.graph.hypergraph import graph_from_ops, op_levels, topological_order


def _diamond():
    # a -> (b, c) -> d, listed consumers-first so file order is not topological
    ops = [
        ("d", "Add", 1.0, ["tb", "tc"], ["td"]),
        ("c", "Relu", 1.0, ["ta"], ["tc"]),
        ("b", "Relu", 1.0, ["ta"], ["tb"]),
        ("a", "MatMul", 1.0, ["x", "w"], ["ta"]),
    ]
    sizes = dict.fromkeys(["x", "w", "ta", "tb", "tc", "td"], 4.0)
    return graph_from_ops("diamond", ops, sizes, parameters={"w"})


def test_topological_order_puts_producers_before_consumers():
    graph = _diamond()
    order = [graph.op_names[i] for i in topological_order(graph)]
    assert order == ["a", "c", "b", "d"]  # level by level, ascending id within a level


def test_op_levels_is_longest_path_depth():
    ops = [
        ("a", "Relu", 1.0, ["x"], ["ta"]),
        ("b", "Relu", 1.0, ["ta"], ["tb"]),
        ("c", "Relu", 1.0, ["tb"], ["tc"]),
        ("skip", "Add", 1.0, ["ta", "tc"], ["ts"]),  # depth 3 via c, not 1 via a
    ]
    graph = graph_from_ops("g", ops, dict.fromkeys(["x", "ta", "tb", "tc", "ts"], 1.0))
    assert op_levels(graph).tolist() == [0, 1, 2, 3]


def test_operator_reading_two_outputs_of_one_producer_waits_for_it_once():
    ops = [
        ("split", "Split", 1.0, ["x"], ["l", "r"]),
        ("join", "Add", 1.0, ["l", "r"], ["y"]),
    ]
    graph = graph_from_ops("g", ops, dict.fromkeys(["x", "l", "r", "y"], 1.0))
    assert op_levels(graph).tolist() == [0, 1]


def test_cycle_raises_invalid_input_naming_an_operator_on_it():
    ops = [
        ("entry", "Relu", 1.0, ["x"], ["te"]),
        ("p", "Add", 1.0, ["te", "tq"], ["tp"]),
        ("q", "Relu", 1.0, ["tp"], ["tq"]),
        ("after", "Relu", 1.0, ["tq"], ["ty"]),
    ]
    graph = graph_from_ops("g", ops, dict.fromkeys(["x", "te", "tp", "tq", "ty"], 1.0))
    with pytest.raises(InvalidInput) as info:
        topological_order(graph)
    assert info.value.code == "cycle"
    assert "'p'" in info.value.detail or "'q'" in info.value.detail
    assert "entry" not in info.value.detail and "after" not in info.value.detail


def test_self_loop_is_a_cycle():
    graph = graph_from_ops("g", [("loop", "Add", 1.0, ["x", "t"], ["t"])], {"x": 1.0, "t": 1.0})
    with pytest.raises(InvalidInput, match="'loop'") as info:
        op_levels(graph)
    assert info.value.code == "cycle"


def test_empty_graph_has_empty_order():
    graph = graph_from_ops("empty", [], {})
    assert topological_order(graph).tolist() == []
    assert topological_order(graph).dtype == np.int64


@st.composite
def _random_dags(draw):
    n = draw(st.integers(1, 30))
    ops = []
    for i in range(n):
        preds = draw(st.lists(st.integers(0, i - 1), max_size=3)) if i else []
        ops.append((f"o{i}", "Add", 1.0, [f"t{p}" for p in preds] or ["x"], [f"t{i}"]))
    perm = draw(st.permutations(range(n)))
    return [ops[i] for i in perm], n


@settings(max_examples=60, deadline=None)
@given(_random_dags())
def test_levels_and_order_respect_every_edge(dag):
    ops, n = dag
    graph = graph_from_ops("g", ops, {"x": 1.0} | {f"t{i}": 1.0 for i in range(n)})
    order = topological_order(graph)
    levels = op_levels(graph)
    assert sorted(order.tolist()) == list(range(n))
    position = np.empty(n, dtype=np.int64)
    position[order] = np.arange(n)
    src, dst, _ = graph.op_edges()
    assert (position[src] < position[dst]).all()
    assert (levels[src] < levels[dst]).all()
    # every operator at level k > 0 has a predecessor at level k - 1 (depth is tight)
    for op in np.flatnonzero(levels > 0):
        assert (levels[src[dst == op]] == levels[op] - 1).any()


def _fan(width: int):
    """source -> width parallel ops -> join -> tail chain of 3: mixes wide and narrow levels."""
    ops = [("src", "Relu", 1.0, ["x"], ["s"])]
    ops += [(f"p{i}", "Relu", 1.0, ["s"], [f"p{i}"]) for i in range(width)]
    ops += [("join", "Concat", 1.0, [f"p{i}" for i in range(width)], ["j"])]
    ops += [(f"c{i}", "Relu", 1.0, ["j" if i == 0 else f"c{i - 1}"], [f"c{i}"]) for i in range(3)]
    tensors = ["x", "s", "j"] + [f"p{i}" for i in range(width)] + [f"c{i}" for i in range(3)]
    return graph_from_ops("fan", ops, dict.fromkeys(tensors, 1.0))


def test_wide_level_between_narrow_ones():
    graph = _fan(100)
    levels = dict(zip(graph.op_names.tolist(), op_levels(graph).tolist()))
    assert levels["src"] == 0 and levels["p57"] == 1 and levels["join"] == 2 and levels["c2"] == 5
    assert topological_order(graph).tolist()[:3] == [0, 1, 2]


@settings(max_examples=40, deadline=None)
@given(_random_dags(), st.sampled_from([0, 1, 2, 5]))
def test_result_does_not_depend_on_the_narrow_level_switch(dag, threshold):
    import partitioners.graph.hypergraph as graph_module

    ops, n = dag
    graph = graph_from_ops("g", ops, {"x": 1.0} | {f"t{i}": 1.0 for i in range(n)})
    expected = (topological_order(graph).tolist(), op_levels(graph).tolist())
    saved = graph_module._NARROW_LEVEL
    graph_module._NARROW_LEVEL = threshold
    try:
        assert (topological_order(graph).tolist(), op_levels(graph).tolist()) == expected
    finally:
        graph_module._NARROW_LEVEL = saved
