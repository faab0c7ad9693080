"""Specification of ``strategy="exact"`` (partitioners.placement.exact): CP-SAT on small graphs.

Hand-built graphs on the ideal cost model whose optimum is known, and a property
test that the solver reaches the lower bound where the bound is tight.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from partitioners.errors import InvalidInput
from partitioners.graph.generators import synthetic_hypergraph
from partitioners.graph.hypergraph import graph_from_ops
from partitioners.placement.engine import PlacementOptions, place
from partitioners.placement.exact import EXACT_MAX_OPS
from tests.partitioners.hardware.test_device_types import fast_fast_slow, with_device_types
from tests.partitioners.placement.test_bounds import independent_ops
from tests.partitioners.placement.test_engine import IDEAL, MS, chain, cluster, two_chains

EXACT = PlacementOptions(strategy="exact", time_limit_s=5.0)


def fork_join(widths: tuple[float, ...]):
    """A source, parallel branches of the given lengths (ms), a sink; 1-byte tensors."""
    ops = [("src", "MatMul", MS, ["x"], ["s"])]
    sizes = {"x": 1.0, "s": 1.0, "y": 1.0}
    joins = []
    for i, w in enumerate(widths):
        ops.append((f"b{i}", "MatMul", w * MS, ["s"], [f"o{i}"]))
        sizes[f"o{i}"] = 1.0
        joins.append(f"o{i}")
    ops.append(("sink", "MatMul", MS, joins, ["y"]))
    return graph_from_ops("fork-join", ops, sizes)


def test_exact_on_one_device_runs_everything_there_at_the_bound():
    r = place(chain(5), cluster(1), EXACT, cost_model=IDEAL)
    assert r.exact is not None and r.exact.status == "optimal"
    assert r.makespan_s == pytest.approx(5e-3)
    assert r.optimality_gap == pytest.approx(0.0, abs=1e-9)


def test_exact_puts_independent_chains_on_separate_devices():
    r = place(two_chains(4), cluster(4), EXACT, cost_model=IDEAL)
    assert r.exact.status == "optimal"
    assert r.makespan_s == pytest.approx(4e-3)
    assert r.devices_used == 2


def test_exact_balances_independent_operators_to_the_load_bound():
    r = place(independent_ops(6), cluster(3), EXACT, cost_model=IDEAL)
    assert r.exact.status == "optimal"
    assert r.makespan_s == pytest.approx(2e-3)
    assert r.bounds.binding in ("load", "load-window", "exact")
    assert r.optimality_gap == pytest.approx(0.0, abs=1e-6)


def test_exact_packs_branches_onto_devices_optimally():
    # branches of 3, 2, 2, 1 ms on two devices: 1 + max(3 + 1, 2 + 2) + 1 = 6 ms, plus the transfers
    r = place(fork_join((3.0, 2.0, 2.0, 1.0)), cluster(2), EXACT, cost_model=IDEAL)
    assert r.exact.status == "optimal"
    assert r.makespan_s == pytest.approx(6e-3, rel=1e-3)


def test_the_exact_bound_is_a_lower_bound_of_the_plan():
    r = place(synthetic_hypergraph(25, lanes=3, seed=4), cluster(3), EXACT, cost_model=IDEAL)
    assert r.exact.bound_s <= r.makespan_s * (1 + 1e-9)
    assert r.exact.bound_s <= r.exact.objective_s * (1 + 1e-9)


def test_exact_keeps_parameters_within_each_budget():
    g = chain(4, tensor_bytes=1e5, param_bytes=600_000.0)
    r = place(g, cluster(4, hbm_bytes=1_000_000), EXACT, cost_model=IDEAL)
    assert r.feasible
    assert r.devices_used == 4


def test_exact_respects_device_types():
    g = with_device_types(chain(4), every=2, types=("slow",))
    inv = fast_fast_slow()
    r = place(g, inv, EXACT, cost_model=IDEAL)
    restricted = np.arange(0, 4, 2)
    assert set(inv.device_types[r.placement[restricted]].tolist()) == {"slow"}


def test_exact_is_never_worse_than_auto():
    g = synthetic_hypergraph(40, lanes=4, seed=7)
    inv = cluster(4)
    auto = place(g, inv, cost_model=IDEAL)
    exact = place(g, inv, PlacementOptions(strategy="exact", time_limit_s=2.0), cost_model=IDEAL)
    assert exact.chosen.makespan_s <= auto.chosen.makespan_s * (1 + 1e-12)


def test_the_same_request_gives_the_same_optimal_plan():
    a = place(fork_join((3.0, 2.0, 1.0)), cluster(2), EXACT, cost_model=IDEAL)
    b = place(fork_join((3.0, 2.0, 1.0)), cluster(2), EXACT, cost_model=IDEAL)
    assert a.exact.status == b.exact.status == "optimal"
    assert np.array_equal(a.placement, b.placement)


def test_a_graph_beyond_the_exact_size_is_refused_with_advice():
    with pytest.raises(InvalidInput, match="ask for 'auto'") as err:
        place(synthetic_hypergraph(EXACT_MAX_OPS + 1), cluster(2), EXACT, cost_model=IDEAL)
    assert err.value.field == "options.strategy"


@pytest.mark.parametrize("limit", [0.0, -1.0, 301.0, float("nan")])
def test_a_time_limit_out_of_range_is_refused(limit):
    with pytest.raises(InvalidInput) as err:
        PlacementOptions(strategy="exact", time_limit_s=limit)
    assert err.value.field == "options.time_limit_s"


@settings(max_examples=15, deadline=None)
@given(
    branches=st.lists(st.integers(1, 4), min_size=1, max_size=5),
    n_devices=st.integers(1, 4),
)
def test_exact_reaches_the_bound_where_the_critical_path_dominates(branches, n_devices):
    # as many devices as branches (or one): no branch waits for another, the longest path is optimal
    n_devices = n_devices if n_devices == 1 else len(branches)
    g = fork_join(tuple(float(b) for b in branches))
    r = place(g, cluster(max(n_devices, 1)), EXACT, cost_model=IDEAL)
    assert r.exact.status == "optimal"
    assert r.makespan_s >= r.bounds.lower_bound_s * (1 - 1e-9)
    assert r.optimality_gap <= 1e-3  # 1-byte tensors: transfers of a nanosecond


def test_exact_says_infeasible_when_no_placement_holds_the_parameters_and_keeps_the_heuristic_plan():
    g = chain(2, tensor_bytes=1000.0, param_bytes=2_000_000.0)
    opts = PlacementOptions(strategy="exact", time_limit_s=5.0, allow_infeasible=True)
    r = place(g, cluster(2, hbm_bytes=1_000_000), opts, cost_model=IDEAL)
    assert r.exact.status == "infeasible"
    assert not r.feasible
    assert "exact" not in r.bounds.by_bound_s
