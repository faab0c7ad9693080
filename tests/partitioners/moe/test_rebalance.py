"""MoE expert re-placement: valid placements, balance near the bound, few moves, clear errors."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from partitioners.errors import Infeasible, InvalidInput
from partitioners.moe.rebalance import balance_stats, lower_bound, rebalance, replica_counts

CLUSTER_SMALL = dict(num_nodes=1, gpus_per_node=2, slots_per_gpu=3)


def _zipf_load(layers: int, experts: int, seed: int, tokens: int = 1 << 22) -> np.ndarray:
    rng = np.random.default_rng(seed)
    ranks = np.argsort(rng.random((layers, experts)), axis=1) + 1.0
    weight = ranks**-0.7
    return np.round(tokens * weight / weight.sum(axis=1, keepdims=True))


def _gpu_of_slot(placement: np.ndarray, slots_per_gpu: int) -> np.ndarray:
    return np.broadcast_to(np.arange(placement.shape[1]) // slots_per_gpu, placement.shape)


def _assert_valid(result, experts: int, num_gpus: int, slots_per_gpu: int, unavailable=()) -> None:
    p2l = result.physical_to_logical
    layers = p2l.shape[0]
    assert p2l.shape == (layers, num_gpus * slots_per_gpu)
    per_gpu = p2l.reshape(layers, num_gpus, slots_per_gpu)
    for layer in range(layers):
        held = p2l[layer][p2l[layer] >= 0]
        assert set(held.tolist()) == set(range(experts)), "every expert has a copy"
        for gpu in range(num_gpus):
            copies = per_gpu[layer, gpu][per_gpu[layer, gpu] >= 0]
            assert copies.size == np.unique(copies).size, "no GPU holds two copies of one expert"
        assert (per_gpu[layer, list(unavailable)] == -1).all(), "unavailable GPUs hold nothing"
        counts = np.bincount(held, minlength=experts)
        assert result.logical_count[layer].tolist() == counts.tolist()


# ----------------------------------------------------------------------------- fresh plans


def test_hot_expert_is_replicated_until_every_gpu_carries_the_mean():
    result = rebalance(np.array([[8.0, 1.0, 1.0, 1.0, 1.0]]), num_nodes=1, gpus_per_node=2, slots_per_gpu=3)
    assert result.logical_count.tolist() == [[2, 1, 1, 1, 1]]
    assert result.balance_after.worst == pytest.approx(1.0)
    _assert_valid(result, 5, 2, 3)


def test_fresh_plan_fills_every_slot_when_experts_can_spread():
    load = _zipf_load(3, 32, seed=1)
    result = rebalance(load, num_nodes=2, gpus_per_node=4, slots_per_gpu=5)
    assert (result.physical_to_logical >= 0).all()
    assert result.logical_count.sum(axis=1).tolist() == [40, 40, 40]


def test_fresh_plan_on_skewed_load_is_within_three_percent_of_perfect_balance():
    load = _zipf_load(6, 64, seed=2)
    result = rebalance(load, num_nodes=2, gpus_per_node=8, slots_per_gpu=5)
    assert result.lower_bound.worst == pytest.approx(1.0)
    assert result.balance_after.worst <= 1.03
    assert result.balance_after.mean <= 1.01


def test_fresh_plan_reports_every_copy_as_a_write_from_storage():
    load = _zipf_load(2, 8, seed=3)
    result = rebalance(load, num_nodes=1, gpus_per_node=4, slots_per_gpu=3, expert_bytes=100)
    assert result.migrations.count == 2 * 12
    assert result.migrations.from_storage_count == result.migrations.count
    assert result.migrations.total_bytes == 2400
    assert result.balance_before is None
    assert set(result.layer_action.tolist()) == {"replanned"}


def test_logical_to_physical_lists_the_slots_of_each_expert():
    load = _zipf_load(2, 10, seed=4)
    result = rebalance(load, num_nodes=1, gpus_per_node=4, slots_per_gpu=4)
    for layer in range(2):
        for expert in range(10):
            slots = result.logical_to_physical[layer, expert]
            slots = slots[slots >= 0]
            assert slots.tolist() == np.flatnonzero(result.physical_to_logical[layer] == expert).tolist()


def test_more_slots_per_gpu_than_experts_leaves_slots_empty_rather_than_duplicating():
    result = rebalance(np.array([[5.0, 1.0]]), num_nodes=1, gpus_per_node=2, slots_per_gpu=3)
    assert result.logical_count.tolist() == [[2, 2]]
    _assert_valid(result, 2, 2, 3)
    assert (result.physical_to_logical == -1).sum() == 2


def test_layer_without_load_counts_as_balanced():
    result = rebalance(np.zeros((1, 6)), num_nodes=1, gpus_per_node=3, slots_per_gpu=2)
    assert result.balance_after.worst == 1.0
    assert result.lower_bound.worst == 1.0
    _assert_valid(result, 6, 3, 2)


def test_hierarchical_policy_keeps_each_group_inside_one_node_when_that_costs_no_balance():
    rng = np.random.default_rng(16)
    load = np.round(rng.uniform(900, 1100, size=(2, 32)))  # groups about equally loaded
    result = rebalance(load, num_nodes=2, gpus_per_node=4, slots_per_gpu=5, num_expert_groups=4)
    assert result.layer_policy.tolist() == ["hierarchical", "hierarchical"]
    node_of_slot = np.arange(40) // 20
    for layer in range(2):
        for group in range(4):
            in_group = (result.physical_to_logical[layer] // 8 == group) & (result.physical_to_logical[layer] >= 0)
            assert np.unique(node_of_slot[in_group]).size == 1
    _assert_valid(result, 32, 8, 5)


def test_one_skewed_group_per_node_falls_back_to_the_global_policy():
    load = np.ones((1, 32))
    load[0, :8] = 10.0  # group 0 is hot: a node holding it alone would carry most of the load
    result = rebalance(load, num_nodes=4, gpus_per_node=2, slots_per_gpu=5, num_expert_groups=4)
    assert result.layer_policy.tolist() == ["global"]
    assert result.balance_after.worst < 1.05


# ----------------------------------------------------------------------------- lower bound


def test_lower_bound_of_uniform_load_is_one():
    assert lower_bound(np.ones((2, 16)), num_gpus=4, slots_per_gpu=4).tolist() == [1.0, 1.0]


def test_lower_bound_is_hot_expert_split_over_every_copy_it_can_have():
    # 7 experts in 8 slots: the hot one gets at most 2 copies, so some GPU carries 12 / 2 = 6
    # while the mean is 18 / 4 = 4.5
    load = np.array([[12.0, 1, 1, 1, 1, 1, 1]])
    bound = lower_bound(load, num_gpus=4, slots_per_gpu=2)
    assert bound[0] == pytest.approx(6 / 4.5, rel=1e-6)
    assert bound[0] <= 6 / 4.5
    result = rebalance(load, num_nodes=1, gpus_per_node=4, slots_per_gpu=2)
    assert result.balance_after.worst == pytest.approx(7 / 4.5)  # the hot copies each share a GPU


def test_replica_counts_fill_the_slots_and_favour_the_hot_expert():
    counts = replica_counts(np.array([[100.0, 10.0, 10.0, 10.0]]), num_gpus=4, slots_per_gpu=2)
    # greedy: 100 -> 50 -> 33 -> 25 (at most one copy per GPU), then the largest per-replica load is 10
    assert counts[0, 0] == 4
    assert sorted(counts[0, 1:].tolist()) == [1, 1, 2]


def test_loads_too_small_to_split_count_as_no_load_and_never_read_below_balanced():
    # 5e-324 tokens split over two replicas underflow to 0 on every GPU
    load = np.array([[5e-324, 0.0, 0.0, 5e-324]])
    result = rebalance(load, num_nodes=1, gpus_per_node=2, slots_per_gpu=3)
    assert result.balance_after.worst == 1.0
    again = rebalance(
        load, current_physical_to_logical=result.physical_to_logical, num_nodes=1, gpus_per_node=2, slots_per_gpu=3
    )
    assert again.balance_before.worst == again.balance_after.worst == 1.0


@pytest.mark.parametrize(
    ("option", "value", "field"),
    [
        ("gpus_per_node", 2**70, "cluster.gpus_per_node"),  # numpy cannot even allocate the slots
        ("unavailable_gpus", [["a", "b"]], "cluster.unavailable_gpus"),
        ("unavailable_gpus", [[1]], "cluster.unavailable_gpus"),  # a list of numbers, not of lists
        ("unavailable_gpus", 0, "cluster.unavailable_gpus"),
        ("expert_bytes", float("inf"), "model.expert_bytes"),
        ("max_replicas_moved", float("nan"), "max_replicas_moved"),
        ("min_improvement", None, "min_improvement"),
        ("min_improvement", [1], "min_improvement"),
        ("node_local", np.array([1.0, 2.0]), "node_local"),
        ("num_logical_experts", "four", "model.num_logical_experts"),
    ],
)
def test_malformed_options_are_invalid_input_naming_the_field(option, value, field):
    with pytest.raises(InvalidInput) as err:
        rebalance(np.ones((2, 4)), **{**CLUSTER_SMALL, option: value})
    assert err.value.field == field


# ----------------------------------------------------------------------------- incremental


def _migrations_applied(current: np.ndarray, result) -> np.ndarray:
    """The placement a runtime has after copying ``result.migrations`` into ``current``
    and emptying the slots the new placement leaves empty."""
    applied = current.copy()
    m = result.migrations
    applied[m.layer, m.slot] = m.logical_expert
    applied[result.physical_to_logical == -1] = -1
    return applied


def _deployed(load, **cluster):
    return rebalance(load, **cluster).physical_to_logical


CLUSTER = dict(num_nodes=2, gpus_per_node=4, slots_per_gpu=5)


def test_unchanged_load_keeps_the_current_placement_and_says_so():
    load = _zipf_load(4, 32, seed=5)
    current = _deployed(load, **CLUSTER)
    result = rebalance(load, current_physical_to_logical=current, **CLUSTER)
    assert result.kept_current
    assert result.migrations.count == 0
    assert (result.physical_to_logical == current).all()
    assert result.reason.startswith("kept the current placement: no layer's max/mean would improve by more than")


def test_sampling_noise_alone_moves_nothing():
    rng = np.random.default_rng(6)
    pop = _zipf_load(4, 32, seed=6, tokens=10**9)
    pop = pop / pop.sum(axis=1, keepdims=True)
    first = np.stack([rng.multinomial(200_000, p) for p in pop]).astype(float)
    again = np.stack([rng.multinomial(200_000, p) for p in pop]).astype(float)
    current = _deployed(first, **CLUSTER)
    result = rebalance(again, current_physical_to_logical=current, **CLUSTER)
    assert result.migrations.count == 0


def test_loads_given_as_fractions_are_still_rebalanced_when_clearly_off():
    load = _zipf_load(2, 32, seed=17)
    current = _deployed(load, **CLUSTER)
    drifted = load[:, ::-1] / load.sum(axis=1, keepdims=True)  # shares, not token counts
    result = rebalance(drifted, current_physical_to_logical=current, **CLUSTER)
    assert not result.kept_current
    assert result.balance_after.worst < result.balance_before.worst - 0.1


def test_a_cold_expert_turning_hot_gets_a_new_copy_not_a_reshuffle():
    load = _zipf_load(1, 32, seed=7)
    current = _deployed(load, **CLUSTER)
    drifted = load.copy()
    coldest = int(np.argmin(drifted[0]))
    drifted[0, coldest] = drifted[0].max()
    result = rebalance(drifted, current_physical_to_logical=current, ignore_sampling_noise=False, **CLUSTER)
    assert result.logical_count[0, coldest] > 1
    assert result.layer_action.tolist() == ["moved"]
    assert result.migrations.count < 0.5 * current.size
    assert result.balance_after.worst <= result.balance_before.worst - 0.1
    _assert_valid(result, 32, 8, 5)


def test_max_replicas_moved_is_a_hard_cap():
    load = _zipf_load(4, 32, seed=8)
    current = _deployed(load, **CLUSTER)
    drifted = load[:, ::-1].copy()  # popularity reversed: everything wants to move
    for cap in (0, 3, 17):
        result = rebalance(drifted, current_physical_to_logical=current, max_replicas_moved=cap, **CLUSTER)
        assert result.migrations.count <= cap
        _assert_valid(result, 32, 8, 5)


def _hot_expert_moved_to_the_end():
    """A placement in service for one hot expert, and a load where another expert is hot."""
    cluster = dict(num_nodes=1, gpus_per_node=4, slots_per_gpu=3)
    current = rebalance(np.array([[900.0, 80, 70, 60, 50, 40, 30, 20]]), **cluster).physical_to_logical
    return current, np.array([[1.0, 1, 1, 1, 1, 1, 1, 900]]), cluster


def test_a_zero_move_cap_that_keeps_an_imbalanced_placement_names_the_cap_not_a_small_gain():
    current, load, cluster = _hot_expert_moved_to_the_end()
    result = rebalance(load, current_physical_to_logical=current, max_replicas_moved=0, **cluster)
    assert result.kept_current and result.balance_after.worst > 3.0
    assert "max_replicas_moved=0" in result.reason
    assert "would improve by more than" not in result.reason
    assert "a fresh plan reaches 1.00" in result.reason


def test_a_cap_too_small_to_reach_a_fresh_plan_is_named_in_the_reason():
    current, load, cluster = _hot_expert_moved_to_the_end()
    result = rebalance(load, current_physical_to_logical=current, max_replicas_moved=1, **cluster)
    assert result.migrations.count == 1 and result.balance_after.worst > 1.5
    assert "max_replicas_moved=1 is too small" in result.reason


def test_a_cap_that_does_not_bind_is_not_blamed():
    current, load, cluster = _hot_expert_moved_to_the_end()
    result = rebalance(load, current_physical_to_logical=current, max_replicas_moved=100, **cluster)
    assert result.balance_after.worst < 1.01
    assert "max_replicas_moved" not in result.reason


def test_a_move_cap_on_a_first_placement_is_reported_as_not_applied():
    result = rebalance(np.array([[8.0, 1.0, 1.0, 1.0, 1.0]]), max_replicas_moved=0, **CLUSTER_SMALL)
    assert result.migrations.count == 6  # every slot loaded from storage
    assert result.reason == (
        "no current placement: fresh plan (max_replicas_moved not applied: there is no placement in service"
        " to move copies from)"
    )


def test_node_local_that_rules_out_a_fresh_plan_is_named_in_the_reason():
    load = _zipf_load(4, 32, seed=14)
    current = _deployed(load, **CLUSTER)
    drifted = load[:, ::-1].copy()
    free = rebalance(drifted, current_physical_to_logical=current, **CLUSTER)
    local = rebalance(drifted, current_physical_to_logical=current, node_local=True, **CLUSTER)
    assert local.balance_after.worst > free.balance_after.worst + 0.1
    assert "node_local=true rules out" in local.reason
    assert "node_local" not in free.reason


def test_failed_gpu_is_emptied_and_its_only_copies_recreated():
    load = _zipf_load(3, 32, seed=9)
    current = _deployed(load, **CLUSTER)
    result = rebalance(load, current_physical_to_logical=current, unavailable_gpus=[2], **CLUSTER)
    _assert_valid(result, 32, 8, 5, unavailable=[2])
    only_there = [
        (layer, e)
        for layer in range(3)
        for e in set(current[layer, 10:15].tolist())
        if (current[layer] == e).sum() == 1
    ]
    for layer, e in only_there:
        rows = (result.migrations.layer == layer) & (result.migrations.logical_expert == e)
        assert rows.any() and (result.migrations.source_gpu[rows] == -1).all()


def test_cap_below_the_experts_that_lost_every_copy_is_infeasible():
    load = _zipf_load(1, 32, seed=10)
    current = _deployed(load, **CLUSTER)
    current[0, :5] = -1  # GPU 0 emptied: its single-copy experts are gone
    lost = 32 - np.unique(current[0][current[0] >= 0]).size
    assert lost > 0
    with pytest.raises(Infeasible) as info:
        rebalance(load, current_physical_to_logical=current, max_replicas_moved=lost - 1, **CLUSTER)
    assert info.value.field == "max_replicas_moved"


def test_two_copies_of_one_expert_on_a_gpu_are_repaired():
    load = _zipf_load(1, 8, seed=11)
    current = _deployed(load, num_nodes=1, gpus_per_node=2, slots_per_gpu=5)
    current[0, 1] = current[0, 0]  # as EPLB sometimes leaves it
    result = rebalance(load, current_physical_to_logical=current, num_nodes=1, gpus_per_node=2, slots_per_gpu=5)
    _assert_valid(result, 8, 2, 5)


def test_migrations_turn_the_current_placement_into_the_new_one():
    load = _zipf_load(3, 32, seed=12)
    current = _deployed(load, **CLUSTER)
    result = rebalance(load[:, ::-1].copy(), current_physical_to_logical=current, expert_bytes=7, **CLUSTER)
    assert (_migrations_applied(current, result) == result.physical_to_logical).all()
    m = result.migrations
    assert (m.slot // 5 == m.gpu).all()
    assert m.total_bytes == 7 * m.count


def test_a_copy_is_read_from_the_destination_node_when_one_is_there():
    load = _zipf_load(3, 32, seed=13)
    current = _deployed(load, **CLUSTER)
    result = rebalance(load[:, ::-1].copy(), current_physical_to_logical=current, **CLUSTER)
    m = result.migrations
    for layer, gpu, expert, source, cross in zip(m.layer, m.gpu, m.logical_expert, m.source_gpu, m.cross_node):
        holders = np.flatnonzero(current[layer] == expert) // 5
        same_node = holders[holders // 4 == gpu // 4]
        if same_node.size:
            assert source in same_node and not cross
        elif holders.size:
            assert cross and source in holders


def test_node_local_writes_no_copy_across_nodes():
    load = _zipf_load(3, 32, seed=14)
    current = _deployed(load, **CLUSTER)
    result = rebalance(load[:, ::-1].copy(), current_physical_to_logical=current, node_local=True, **CLUSTER)
    assert result.migrations.cross_node_count == 0
    _assert_valid(result, 32, 8, 5)


def test_balance_before_is_the_current_placement_under_the_new_load():
    load = _zipf_load(2, 32, seed=15)
    current = _deployed(load, **CLUSTER)
    drifted = load[:, ::-1].copy()
    result = rebalance(drifted, current_physical_to_logical=current, **CLUSTER)
    expected = balance_stats(drifted, current, **CLUSTER)
    assert result.balance_before.per_layer.tolist() == expected.per_layer.tolist()
    assert result.balance_after.mean < result.balance_before.mean


def test_result_as_dict_is_plain_json():
    import json

    load = _zipf_load(2, 32, seed=18)
    current = _deployed(load, **CLUSTER)
    result = rebalance(load[:, ::-1].copy(), current_physical_to_logical=current, expert_bytes=5, **CLUSTER)
    answer = json.loads(json.dumps(result.as_dict()))
    assert answer["physical_to_logical"] == result.physical_to_logical.tolist()
    assert answer["migrations"]["count"] == len(answer["migrations"]["slot"]) == result.migrations.count
    assert answer["migrations"]["total_bytes"] == 5 * result.migrations.count
    assert answer["balance_before"]["worst"] == result.balance_before.worst
    assert answer["layer_action"] == result.layer_action.tolist()


# The acceptance report's case: two layers, 8 experts, 4 GPUs x 3 slots.
UAT_LOAD = np.array([[900.0, 80, 70, 60, 50, 40, 30, 20], [10.0, 20, 30, 40, 50, 60, 70, 800]])
UAT_CLUSTER = dict(num_nodes=1, gpus_per_node=4, slots_per_gpu=3)


def test_a_current_placement_hosting_no_copy_of_a_loaded_expert_has_unbounded_balance_before():
    only_expert_0 = np.zeros((2, 12), dtype=np.int64)  # experts 1..7 receive tokens nobody can serve
    result = rebalance(UAT_LOAD, current_physical_to_logical=only_expert_0, **UAT_CLUSTER)
    assert np.isinf(result.balance_before.per_layer).all()  # it read 0.72 and 0.009, below the bound of 1
    assert result.balance_before.worst == result.balance_before.mean == np.inf
    assert result.balance_before.unhosted_lists() == [[1, 2, 3, 4, 5, 6, 7]] * 2
    assert "no copy of 14 expert(s)" in result.reason and "layer 0: 1, 2, 3, 4, 5, 6, 7" in result.reason
    _assert_valid(result, 8, 4, 3)


def test_an_all_empty_current_placement_is_replaced_and_its_balance_before_is_unbounded():
    empty = np.full((2, 12), -1, dtype=np.int64)
    result = rebalance(UAT_LOAD, current_physical_to_logical=empty, **UAT_CLUSTER)
    assert np.isinf(result.balance_before.per_layer).all()  # it read 1.0, perfect balance
    assert result.balance_before.unhosted_lists() == [list(range(8))] * 2
    assert result.migrations.from_storage_count == result.migrations.count > 0  # nothing to copy from
    _assert_valid(result, 8, 4, 3)


def test_an_expert_without_load_and_without_a_copy_leaves_balance_before_finite():
    load = np.array([[40.0, 30.0, 20.0, 0.0]])
    current = np.array([[0, 1, 2, 0]])  # expert 3 has no copy, but no tokens either
    result = rebalance(load, current_physical_to_logical=current, num_nodes=1, gpus_per_node=2, slots_per_gpu=2)
    assert result.balance_before.per_layer.tolist() == [pytest.approx(50.0 / 45.0)]  # GPUs carry 20+30 and 20+20
    assert result.balance_before.unhosted_lists() == [[]]
    _assert_valid(result, 4, 2, 2)


def test_balance_stats_of_a_placement_missing_a_loaded_expert_is_unbounded_and_names_it():
    stats = balance_stats(UAT_LOAD, np.zeros((2, 12), dtype=np.int64), **UAT_CLUSTER)
    assert np.isinf(stats.per_layer).all()
    assert stats.unhosted_lists() == [[1, 2, 3, 4, 5, 6, 7]] * 2


def test_a_copy_lost_on_an_unavailable_gpu_makes_balance_before_unbounded_for_its_layer_only():
    current = np.array([[0, 1, 2, 3, 4, 5, 6, 7, 0, 1, 2, 3]] * 2)
    result = rebalance(UAT_LOAD, current_physical_to_logical=current, unavailable_gpus=[2], **UAT_CLUSTER)
    # GPU 2 held experts 6 and 7 alone (and a copy of 0): both layers load them, so both are unbounded
    assert result.balance_before.unhosted_lists() == [[6, 7], [6, 7]]
    load = UAT_LOAD.copy()
    load[0, 6:] = 0.0  # layer 0 no longer sends them tokens
    result = rebalance(load, current_physical_to_logical=current, unavailable_gpus=[2], **UAT_CLUSTER)
    assert np.isfinite(result.balance_before.per_layer[0]) and np.isinf(result.balance_before.per_layer[1])


def test_balance_after_is_what_balance_stats_reports_for_the_returned_placement():
    load = _zipf_load(3, 32, seed=19)
    current = _deployed(load, **CLUSTER)
    result = rebalance(load[:, ::-1].copy(), current_physical_to_logical=current, unavailable_gpus=[3], **CLUSTER)
    measured = balance_stats(load[:, ::-1].copy(), result.physical_to_logical, unavailable_gpus=[3], **CLUSTER)
    assert measured.per_layer.tolist() == result.balance_after.per_layer.tolist()
    assert (result.balance_after.per_layer >= result.lower_bound.per_layer).all()


def test_unbounded_balance_is_null_in_json_with_the_unhosted_experts_per_layer():
    import json

    result = rebalance(UAT_LOAD, current_physical_to_logical=np.zeros((2, 12), dtype=np.int64), **UAT_CLUSTER)
    answer = json.loads(json.dumps(result.as_dict(), allow_nan=False))
    assert answer["balance_before"] == {
        "per_layer": [None, None],
        "mean": None,
        "worst": None,
        "unhosted_experts": [[1, 2, 3, 4, 5, 6, 7]] * 2,
    }
    assert "unhosted_experts" not in answer["balance_after"]


# ----------------------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    "load, code",
    [
        (np.ones(8), "bad-shape"),
        (np.ones((2, 7)), "bad-shape"),
        (np.array([[1.0, -1.0] * 4]), "negative-load"),
        (np.array([[1.0, np.nan] * 4]), "non-finite-load"),
        (np.array([[1.0, np.inf] * 4]), "non-finite-load"),
    ],
)
def test_bad_load_is_rejected_naming_the_field(load, code):
    with pytest.raises(InvalidInput) as info:
        rebalance(load, num_nodes=1, gpus_per_node=2, slots_per_gpu=4, num_logical_experts=8)
    assert info.value.field == "load"
    assert info.value.code == code


def test_more_experts_than_available_slots_is_rejected():
    with pytest.raises(InvalidInput) as info:
        rebalance(np.ones((1, 9)), num_nodes=1, gpus_per_node=2, slots_per_gpu=5, unavailable_gpus=[1])
    assert info.value.field == "cluster.slots_per_gpu"
    assert "9 logical experts" in info.value.detail


def test_placement_naming_an_unknown_expert_is_rejected():
    current = np.zeros((1, 8), dtype=np.int64)
    current[0, 3] = 12
    with pytest.raises(InvalidInput) as info:
        rebalance(np.ones((1, 4)), num_nodes=1, gpus_per_node=2, slots_per_gpu=4, current_physical_to_logical=current)
    assert info.value.field == "current_placement.physical_to_logical"
    assert info.value.code == "unknown-expert"
    assert "[0][3] = 12" in info.value.detail


def test_placement_of_the_wrong_shape_is_rejected():
    with pytest.raises(InvalidInput) as info:
        rebalance(
            np.ones((1, 4)), num_nodes=1, gpus_per_node=2, slots_per_gpu=4, current_physical_to_logical=np.zeros((1, 7))
        )
    assert info.value.field == "current_placement.physical_to_logical"


def test_expert_groups_must_divide_the_experts():
    with pytest.raises(InvalidInput) as info:
        rebalance(np.ones((1, 8)), num_nodes=1, gpus_per_node=2, slots_per_gpu=4, num_expert_groups=3)
    assert info.value.field == "model.num_expert_groups"


def test_unknown_unavailable_gpu_is_rejected():
    with pytest.raises(InvalidInput) as info:
        rebalance(np.ones((1, 4)), num_nodes=1, gpus_per_node=2, slots_per_gpu=4, unavailable_gpus=[2])
    assert info.value.field == "cluster.unavailable_gpus"


# ----------------------------------------------------------------------------- properties


@st.composite
def _cases(draw):
    nodes = draw(st.integers(1, 3))
    per_node = draw(st.integers(1, 4))
    gpus = nodes * per_node
    slots = draw(st.integers(1, 4))
    down = draw(st.lists(st.integers(0, gpus - 1), unique=True, max_size=gpus - 1))
    avail = gpus - len(down)
    experts = draw(st.integers(1, avail * slots))
    layers = draw(st.integers(1, 3))
    load = np.array(
        draw(
            st.lists(
                st.lists(st.integers(0, 10_000), min_size=experts, max_size=experts), min_size=layers, max_size=layers
            )
        ),
        dtype=float,
    )
    current = None
    if draw(st.booleans()):
        current = np.array(
            draw(
                st.lists(
                    st.lists(st.integers(-1, experts - 1), min_size=gpus * slots, max_size=gpus * slots),
                    min_size=layers,
                    max_size=layers,
                )
            )
        )
    cap = draw(st.one_of(st.none(), st.integers(0, 40)))
    noise = draw(st.booleans())
    groups = draw(st.one_of(st.none(), st.sampled_from([d for d in range(1, experts + 1) if experts % d == 0])))
    node_local = draw(st.booleans())
    cluster = dict(num_nodes=nodes, gpus_per_node=per_node, slots_per_gpu=slots)
    return load, cluster, down, current, cap, noise, groups, node_local


def _cluster(num_nodes: int, gpus_per_node: int, slots_per_gpu: int) -> dict:
    return dict(num_nodes=num_nodes, gpus_per_node=gpus_per_node, slots_per_gpu=slots_per_gpu)


def _hosts_every_expert(current: np.ndarray, cluster: dict, down: list[int], num_experts: int) -> np.ndarray:
    """Per layer, whether ``current`` holds a copy of every expert on an available GPU."""
    gpus = cluster["num_nodes"] * cluster["gpus_per_node"]
    per_gpu = current.reshape(current.shape[0], gpus, cluster["slots_per_gpu"])
    available = [gpu for gpu in range(gpus) if gpu not in down]
    return np.array([set(range(num_experts)) <= set(layer[available].ravel().tolist()) for layer in per_gpu])


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_cases())
# duplicates of one expert everywhere: four experts lost, the cap covers exactly them
@example((np.array([[0.0, 0, 0, 0, 1]]), _cluster(2, 3, 4), [], np.zeros((1, 24), dtype=int), 4, False, None, False))
# two layers lost an expert, a third has every one: the cap of 2 leaves nothing for the third
@example(
    (
        np.zeros((3, 3)),
        _cluster(1, 2, 3),
        [],
        np.array([[0, 0, 0, 0, 0, 1], [0, 0, 0, 0, 0, 1], [0, 0, 0, 0, 1, 2]]),
        2,
        False,
        None,
        False,
    )
)
def test_every_placement_is_valid_and_never_beats_the_bound(case):
    load, cluster, down, current, cap, noise, groups, node_local = case
    options = dict(
        unavailable_gpus=down,
        max_replicas_moved=cap,
        ignore_sampling_noise=noise,
        num_expert_groups=groups,
        node_local=node_local,
    )
    try:
        result = rebalance(load, current_physical_to_logical=current, **options, **cluster)
    except Infeasible:
        assert cap is not None and current is not None
        return
    gpus = cluster["num_nodes"] * cluster["gpus_per_node"]
    _assert_valid(result, load.shape[1], gpus, cluster["slots_per_gpu"], unavailable=down)
    assert (result.balance_after.per_layer >= result.lower_bound.per_layer - 1e-9).all()
    if current is not None:  # inf where the current placement cannot serve its load, never below the bound
        # the bound holds for placements with a copy of every expert: one that left an
        # unloaded expert out served all of its load and may measure below it
        complete = _hosts_every_expert(current, cluster, down, load.shape[1])
        assert (result.balance_before.per_layer[complete] >= result.lower_bound.per_layer[complete] - 1e-9).all()
    if cap is not None and current is not None:  # a first placement loads, it moves nothing
        assert result.migrations.count <= cap
    if node_local:
        assert result.migrations.cross_node_count == 0
    if current is not None:  # the migrations are exactly the slots that change
        assert (_migrations_applied(current, result) == result.physical_to_logical).all()
    again = rebalance(load, current_physical_to_logical=current, **options, **cluster)
    assert (again.physical_to_logical == result.physical_to_logical).all()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_cases())
# water-filled counts give the hot expert three copies where a cold expert's second evens the GPUs
@example((np.array([[0.0, 0, 1, 2]]), _cluster(1, 3, 2), [], None, None, False, None, False))
# seven GPUs: the fresh swaps' few light partners miss the moves a middling GPU takes
@example(
    (
        np.array([[0.0, 0, 0, 0, 0, 53, 1, 109, 0, 109, 696, 1108, 910, 0, 3973, 1, 312, 1985]]),
        _cluster(2, 4, 4),
        [0],
        None,
        None,
        False,
        None,
        False,
    )
)
# groups of two experts on one-GPU nodes with three slots: the hierarchical plan leaves slots empty
@example((np.zeros((1, 4)), _cluster(2, 1, 3), [], None, None, False, 2, False))
# a hierarchical plan the repair improves by handing a copy across groups
@example((np.array([[0.0, 281, 176, 0, 106, 668]]), _cluster(2, 3, 2), [], None, None, False, 2, False))
def test_a_placement_made_for_a_load_is_kept_for_that_load(case):
    load, cluster, down, _, _, noise, groups, _ = case
    made = rebalance(load, unavailable_gpus=down, num_expert_groups=groups, **cluster)
    again = rebalance(
        load,
        current_physical_to_logical=made.physical_to_logical,
        unavailable_gpus=down,
        num_expert_groups=groups,
        ignore_sampling_noise=noise,
        **cluster,
    )
    assert again.kept_current
    assert again.migrations.count == 0


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 10_000), st.integers(2, 6), st.integers(3, 5))
def test_fresh_plan_is_never_more_than_one_percent_worse_than_greedy_lpt(seed, per_node, slots):
    gpus = 2 * per_node
    experts = gpus * (slots - 1)
    load = _zipf_load(2, experts, seed=seed, tokens=100_000)
    result = rebalance(load, num_nodes=2, gpus_per_node=per_node, slots_per_gpu=slots)
    from partitioners.moe.baselines import greedy_lpt

    lpt = balance_stats(load, greedy_lpt(load, gpus, slots), num_nodes=2, gpus_per_node=per_node, slots_per_gpu=slots)
    assert (result.balance_after.per_layer <= lpt.per_layer * 1.01 + 1e-12).all()


def test_a_current_placement_without_a_copy_of_an_unloaded_expert_is_completed_and_the_reason_says_so():
    # expert 1 received no tokens and has no copy: the current placement measures 1.0, below the
    # bound of 2.0 that any placement hosting both experts must reach
    result = rebalance(
        np.array([[1.0, 0.0]]),
        num_nodes=1,
        gpus_per_node=2,
        slots_per_gpu=1,
        current_physical_to_logical=np.array([[0, 0]]),
    )
    assert result.balance_before.per_layer[0] == pytest.approx(1.0)
    assert result.lower_bound.per_layer[0] == pytest.approx(2.0)
    assert sorted(result.physical_to_logical[0].tolist()) == [0, 1]
    assert "no copy of 1 expert(s) that received no load (layer 0: 1)" in result.reason


# ----------------------------------------------------------------------------- failure, return, budgets

# Four GPUs of two slots: experts 0-3 once (100 tokens), experts 4 and 5 twice (200 tokens,
# 100 per copy), so every GPU carries 200.
HAND = dict(num_nodes=1, gpus_per_node=4, slots_per_gpu=2)
HAND_LOAD = np.array([[100.0, 100.0, 100.0, 100.0, 200.0, 200.0]])
HAND_PLACEMENT = np.array([[0, 4, 1, 4, 2, 5, 3, 5]])


def test_a_failed_gpu_costs_one_copy_per_expert_it_alone_held_when_that_is_as_balanced_as_can_be():
    # GPU 3 fails with expert 3 (its only copy) and one copy of expert 5. The three
    # survivors have six slots for six experts: one copy each, and the best packing puts
    # a 200 with a 100 on every GPU, max 300 over mean 800/3 = 1.125, the best any placement
    # can do (lower_bound ignores whole slots and says 1.0). Writing expert 3 over one copy
    # of expert 4 reaches it with one copy.
    result = rebalance(HAND_LOAD, current_physical_to_logical=HAND_PLACEMENT, unavailable_gpus=[3], **HAND)
    assert result.lost_experts == 1
    assert result.migrations.count == 1
    assert result.migrations.logical_expert.tolist() == [3] and result.migrations.replaced_expert.tolist() == [4]
    assert result.migrations.source_gpu.tolist() == [-1]  # from storage: no copy survives
    assert result.balance_after.worst == pytest.approx(1.125)


def test_a_returning_gpu_is_refilled_by_one_copy_per_empty_slot():
    failed = rebalance(HAND_LOAD, current_physical_to_logical=HAND_PLACEMENT, unavailable_gpus=[3], **HAND)
    back = rebalance(HAND_LOAD, current_physical_to_logical=failed.physical_to_logical, **HAND)
    # GPU 3 comes back empty: its two slots take a second copy of the two 200-token
    # experts (each single again), and every GPU carries 200
    assert back.migrations.count == 2
    assert sorted(back.migrations.logical_expert.tolist()) == [4, 5]
    assert set(back.migrations.gpu.tolist()) == {3}
    assert back.balance_after.worst == pytest.approx(1.0)


# DeepSeek-V3's shape: 58 MoE layers x 256 experts on 64 GPUs (8 nodes) of 5 slots.
DSV3_64 = dict(num_nodes=8, gpus_per_node=8, slots_per_gpu=5)


def _dsv3_failure(repair_budget: int):
    load = _zipf_load(58, 256, seed=34)
    current = _deployed(load, **DSV3_64)
    resampled = _zipf_load(58, 256, seed=34, tokens=(1 << 22) + 4096)
    failed = rebalance(
        resampled, current_physical_to_logical=current, unavailable_gpus=[5], repair_budget=repair_budget, **DSV3_64
    )
    return resampled, failed


def test_a_failure_at_deepseek_v3_shape_writes_at_most_one_and_a_half_copies_per_lost_expert_plus_its_budget():
    repair_budget = int(0.05 * 58 * 64 * 5)
    _, failed = _dsv3_failure(repair_budget)
    assert failed.lost_experts > 0
    assert failed.migrations.count <= 1.5 * failed.lost_experts + repair_budget
    _assert_valid(failed, 256, 64, 5, unavailable=[5])


def test_a_failure_with_no_repair_budget_writes_one_copy_per_lost_expert_and_says_the_budget_bound():
    _, failed = _dsv3_failure(0)
    assert failed.migrations.count == failed.lost_experts
    assert (failed.migrations.source_gpu == -1).all()  # each from storage: no copy survived
    assert failed.bound_by == "repair_budget"


def test_a_returning_gpu_at_deepseek_v3_shape_writes_one_copy_per_empty_slot_and_stops():
    load, failed = _dsv3_failure(int(0.05 * 58 * 64 * 5))
    back = rebalance(load, current_physical_to_logical=failed.physical_to_logical, **DSV3_64)
    assert back.migrations.count == 58 * 5  # GPU 5's five slots in every layer
    assert set(back.migrations.gpu.tolist()) == {5}
    _assert_valid(back, 256, 64, 5)


def _drifted(load: np.ndarray, seed: int) -> np.ndarray:
    """The hot half of the experts trade popularity with the cold half."""
    rng = np.random.default_rng(seed)
    out = load.copy()
    for layer in range(load.shape[0]):
        order = np.argsort(-load[layer])
        swap = rng.permutation(order.size // 2)
        out[layer, order[: order.size // 2]] = load[layer, order[order.size // 2 :][swap]]
        out[layer, order[order.size // 2 :][swap]] = load[layer, order[: order.size // 2]]
    return out


def test_a_move_budget_caps_the_copies_written_for_balance_and_the_answer_says_it_bound():
    load = _zipf_load(4, 32, seed=30)
    current = _deployed(load, **CLUSTER)
    result = rebalance(_drifted(load, 1), current_physical_to_logical=current, move_budget=6, **CLUSTER)
    assert result.migrations.count <= 6
    assert result.bound_by == "move_budget" and "the move budget (6 copies" in result.reason


def test_a_failure_rebuilds_its_lost_experts_even_past_the_move_budget():
    load = _zipf_load(2, 32, seed=31)
    current = _deployed(load, **CLUSTER)
    result = rebalance(load, current_physical_to_logical=current, unavailable_gpus=[1], move_budget=0, **CLUSTER)
    assert result.lost_experts > 0
    assert result.migrations.count == result.lost_experts  # the lost experts, and nothing for balance
    _assert_valid(result, 32, 8, 5, unavailable=[1])


def test_moves_stop_at_the_balance_target_rather_than_the_best_balance():
    load = _zipf_load(6, 32, seed=32)
    current = _deployed(load, **CLUSTER)
    drifted = _drifted(load, 2)
    tight = rebalance(drifted, current_physical_to_logical=current, balance_target=1.0, **CLUSTER)
    loose = rebalance(drifted, current_physical_to_logical=current, balance_target=1.05, **CLUSTER)
    assert loose.migrations.count < tight.migrations.count
    assert loose.balance_after.worst <= 1.05 + 1e-9 and loose.bound_by == "balance_target"


def test_eplb_maps_of_a_stored_placement_match_the_answer():
    from partitioners.moe.rebalance import eplb_maps

    result = rebalance(_zipf_load(2, 16, seed=33), **CLUSTER)
    logical_to_physical, counts = eplb_maps(result.physical_to_logical, 16)
    assert logical_to_physical == result.logical_to_physical_lists()
    assert (counts == result.logical_count).all()
