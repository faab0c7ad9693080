"""Local moves that lower a layer's hottest GPU (see :mod:`partitioners.moe.rebalance`).

:func:`swap_refine` swaps copies between the hottest GPUs and light partners (the
refinement step of Karmarkar and Karp's differencing method, 1982) and, when
repairing a placement in service, hands one copy of a hot GPU to another expert;
:func:`adjust_counts` gives copies to experts that need more (hot ones, and ones
that lost copies on failed GPUs). Both rank moves by copies written, counting
cross-node copies more, and stop at a budget (:class:`MoveContext`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from partitioners.moe.packing import PlacementState, holds

__all__ = ["OriginalPlacement", "MoveContext", "swap_refine", "adjust_counts", "fill_empty_slots"]

# Swap refinement: the hottest GPUs handled per iteration, and light partners for each.
_HOT_PER_ITER = 4
# ... times this many once no more than _FEW_LAYERS layers are still above their goal.
_FEW_LAYERS = 16
_FEW_LAYERS_FACTOR = 2
_SWAP_PARTNERS = 4
# A fresh plan's wide pass (see swap_refine) pairs each hot GPU with at least this many.
_WIDE_PARTNERS = 16
# Repairing a placement in service pairs each hot GPU with fewer light partners: its moves
# are few per layer and ranked by copies written, and half the partners halve the work of
# an iteration for the same copies and balance (bench/moe.py drift and failure rows).
_REPAIR_PARTNERS = 2
# With this many slots per GPU or more, a repair pairs each hot GPU with one light partner
# (plus its node's): the candidate swaps grow with the square of the slots, and at 9 slots
# (256 experts on 32 GPUs) one partner costs 2% more copies for 20% less time, while at
# 5 slots it costs 10-17% more copies for no time (bench/moe.py drift and failure rows).
_ONE_PARTNER_FROM_SLOTS = 7
# A one-copy re-assignment checks the other hosts of the copy among this many of the hottest GPUs.
_HOST_LOOKUP = 8
# Gainers of new copies first look for a slot among this many of the lightest GPUs.
_GAINER_GPUS = 16
# In ranking repair moves, a copy read from another node costs this much more than
# one read inside the node (inter-node links are several times slower than NVLink).
_CROSS_NODE_WRITE_COST = 0.5
# Where a new copy lands: among slots of similar resulting load (this fraction of the
# layer's mean GPU load), prefer one whose node already holds the expert.
_CROSS_NODE_PENALTY = 2e-3


@dataclass(frozen=True)
class OriginalPlacement:
    """The placement being repaired, with where its copies sit by node (the two always go together)."""

    slots: np.ndarray  # (L, A, S) slots before this call, -1 empty
    node_has: np.ndarray  # (L, nodes, E + 1) some original copy on that node


@dataclass
class MoveContext:
    """What the move search needs beyond the state: original placement, nodes, budget."""

    node_of_gpu: np.ndarray  # (A,) node of each available GPU
    node_gpus: np.ndarray | None = None  # (nodes, gpus_per_node) available GPUs of each node, -1 padded
    original: OriginalPlacement | None = None  # set when repairing a current placement
    node_local: bool = False
    budget: int | None = None  # copies that may still be written
    budget_bound: bool = False  # set when the budget ruled out a move that would have helped
    count_cap: np.ndarray | None = None  # (L,) per-replica load an expert may reach by giving up a copy


def swap_refine(
    state: PlacementState,
    layers: np.ndarray,
    goal_load: np.ndarray,
    max_iters: int,
    ctx: MoveContext,
    wide_goal_load: np.ndarray | None = None,
) -> None:
    """Move load off the hottest GPUs by swaps (and, when repairing, by re-assigning a copy).

    Each iteration handles the ``t`` most loaded GPUs of every layer at once,
    each paired with its own disjoint set of light partners (hot GPU ``i`` gets
    the ``i``-th, ``i+t``-th, ... lightest), so the chosen swaps touch disjoint
    GPUs and apply together. A swap of replica ``a`` on hot GPU ``m`` with
    replica ``b`` (or an empty slot) on partner ``g`` is allowed when it creates no
    duplicate and brings ``max(load_m, load_g)`` below ``load_m``.

    When repairing a current placement (``ctx.original`` set) the hottest GPU may
    also hand one of its copies to another expert: the slot of ``a`` (which keeps
    other copies, and whose per-replica load stays under ``ctx.count_cap``) gets
    a copy of the coldest expert ``c`` not on ``m``. That writes one copy instead
    of a swap's two and spreads ``a``'s load over its other GPUs; it is allowed
    when ``m`` and every other host of ``a`` end below ``load_m``. Moves are then
    ranked by cost, not just by balance: a move that brings ``m`` to the goal
    with the fewest copies written wins (a copy crossing nodes counts more),
    otherwise the one with the largest gain per copy. A fresh plan just takes
    the lowest resulting maximum.

    Only GPUs above the goal move, and a layer stops when its hottest GPU has no
    improving move, so no copy moves without lowering the layer's maximum. With
    ``wide_goal_load`` (a fresh plan) a layer stopped that way above it gets one
    more pass towards it in which its hottest GPU is paired with every other GPU
    (a few light partners miss swaps that a middling GPU could take), so a fresh
    plan is not left where the repair of the same placement on the next report
    would still find moves.
    """
    gpus = state.slots.shape[1]
    if gpus < 2 or layers.size == 0:
        return
    stalled = _swap_rounds(state, layers, goal_load, max_iters, ctx, wide=False)
    if wide_goal_load is not None and stalled.size and gpus > 2:
        _swap_rounds(state, stalled, wide_goal_load, max_iters, ctx, wide=True)


def _swap_rounds(
    state: PlacementState, layers: np.ndarray, goal_load: np.ndarray, max_iters: int, ctx: MoveContext, *, wide: bool
) -> np.ndarray:
    """Iterations of :func:`swap_refine`; returns the layers that stopped above their goal for want of a move.

    ``wide``: the hot GPUs of an iteration share every other GPU as partners.
    """
    gpus = state.slots.shape[1]
    no_layers = np.zeros(0, dtype=np.int64)
    original = ctx.original
    repairing = original is not None
    partners = _REPAIR_PARTNERS if repairing else _SWAP_PARTNERS
    slots_per_gpu = state.slots.shape[2]
    mean_load = np.maximum(state.load.sum(axis=1) / gpus, 1e-300)
    active = layers[state.gpu_load[layers].max(axis=1) > goal_load[layers]]
    stalled = [no_layers]
    for _ in range(max_iters):
        if active.size == 0:
            return np.concatenate(stalled)
        if ctx.budget is not None and ctx.budget <= 0:
            ctx.budget_bound = True
            return no_layers
        n = active.size
        if wide:
            # every GPU a partner of some hot GPU, at least _WIDE_PARTNERS of them each
            t = max(1, min(_HOT_PER_ITER, gpus // _WIDE_PARTNERS))
            k = (gpus - t) // t
        else:
            # the last few layers take more hot GPUs per iteration: an iteration costs about
            # the same for a few layers whatever t is, so they finish in fewer of them
            t = max(1, min(_HOT_PER_ITER * (1 if n > _FEW_LAYERS else _FEW_LAYERS_FACTOR), gpus // 2))
            k = max(
                1, min(partners if not repairing or slots_per_gpu < _ONE_PARTNER_FROM_SLOTS else 1, (gpus - t) // t)
            )
        l3 = active[:, None, None]
        gl = state.gpu_load[active]
        order = np.argsort(gl, axis=1)
        hot = order[:, ::-1][:, :t]  # (n, t) heaviest first
        part = order[:, : t * k].reshape(n, k, t).transpose(0, 2, 1)  # (n, t, k), disjoint from hot
        part_ok = None
        if repairing and ctx.node_gpus is not None and ctx.node_gpus.shape[0] > 1:
            part, part_ok = _add_node_partner(gl, hot, part, ctx.node_of_gpu, ctx.node_gpus)
        rows_n = np.arange(n)
        hot_load = gl[rows_n[:, None], hot]
        part_load = gl[np.arange(n)[:, None, None], part]
        goal = goal_load[active][:, None]
        mean = mean_load[active][:, None]
        e_hot = state.slots[active[:, None], hot]  # (n, t, S)
        p_hot = state.per_replica[l3, e_hot]
        e_part = state.slots[active[:, None, None], part]  # (n, t, k, S)
        p_part = state.per_replica[active[:, None, None, None], e_part]
        delta = p_hot[:, :, :, None, None] - p_part[:, :, None, :, :]  # (n, t, S_hot, k, S_part)
        new_max = np.maximum(hot_load[:, :, None, None, None] - delta, part_load[:, :, None, :, None] + delta)
        tiny = 1e-9 * mean
        above = hot_load > goal
        valid = new_max < (hot_load - tiny)[:, :, None, None, None]
        valid &= ((e_hot >= 0) & above[:, :, None])[:, :, :, None, None]
        if part_ok is not None:
            valid &= part_ok[:, :, None, :, None]
        # the partner's copy must not already be on the hot GPU, nor the hot copy on the partner
        valid &= ~holds(e_hot[:, :, None, None, :], e_part)[:, :, None, :, :]  # (n, t, k, S_part)
        valid &= ~holds(e_part[:, :, None, :, :], e_hot[:, :, :, None])[..., None]  # (n, t, S_hot, k)
        if original is None:
            key = np.where(valid, new_max, np.inf).reshape(n, t, -1)
            best = key.argmin(axis=2)
            ok = np.isfinite(key[rows_n[:, None], np.arange(t)[None, :], best])
            replace = np.zeros(n, dtype=bool)
        else:
            has = original.node_has
            node_hot = ctx.node_of_gpu[hot]
            node_part = ctx.node_of_gpu[part]
            hot_to_part = has[active[:, None, None, None], node_part[:, :, None, :], e_hot[:, :, :, None]]  # (n,t,S,k)
            part_to_hot = has[active[:, None, None, None], node_hot[:, :, None, None], e_part] | (
                e_part < 0
            )  # (n,t,k,S)
            if ctx.node_local:
                valid &= hot_to_part[..., None] & part_to_hot[:, :, None, :, :]
            # small integers (-2..2 copies) in int8: these arrays are the size of every candidate swap
            cross = (~hot_to_part)[..., None].astype(np.int8) + (~part_to_hot)[:, :, None, :, :].astype(np.int8)
            orig_hot = original.slots[active[:, None], hot]  # (n, t, S)
            orig_part = original.slots[active[:, None, None], part]  # (n, t, k, S)
            old_w = (e_hot != orig_hot)[:, :, :, None, None].astype(np.int8)
            old_w = old_w + ((e_part != orig_part) & (e_part >= 0))[:, :, None, :, :].astype(np.int8)
            new_w = (e_part[:, :, None, :, :] != orig_hot[:, :, :, None, None]) & (e_part >= 0)[:, :, None, :, :]
            new_w = new_w.astype(np.int8) + (e_hot[:, :, :, None, None] != orig_part[:, :, None, :, :]).astype(np.int8)
            writes = new_w - old_w
            if ctx.budget is not None:
                valid &= writes <= ctx.budget
            key = _move_key(
                valid,
                new_max,
                hot_load[:, :, None, None, None],
                goal[:, :, None, None, None],
                mean[:, :, None, None, None],
                writes,
                cross,
            )
            key = key.reshape(n, t, -1)
            best = key.argmin(axis=2)
            pick_rows, pick_cols = rows_n[:, None], np.arange(t)[None, :]
            best_key = key[pick_rows, pick_cols, best]
            ok = np.isfinite(best_key)
            w_best = writes.reshape(n, t, -1)[pick_rows, pick_cols, best]
            # one-copy re-assignment on the hottest GPU of each layer
            r_key, r_slot, r_expert, r_writes = _best_replace(
                state, active, hot[:, 0], hot_load[:, 0], goal[:, 0], mean[:, 0], ctx, original
            )
            replace = np.isfinite(r_key) & (r_key < best_key[:, 0])
            ok[replace] = False  # a re-assignment changes many GPUs: alone in its layer this round
            w_best = np.where(ok, w_best, 0)
            if ctx.budget is not None:
                spend = np.concatenate([np.maximum(w_best, 0).ravel(), np.where(replace, np.maximum(r_writes, 0), 0)])
                if spend.sum() > ctx.budget:
                    ctx.budget_bound = True
                    gain_key = np.concatenate(
                        [np.where(ok, best_key, np.inf).ravel(), np.where(replace, r_key, np.inf)]
                    )
                    rank = np.argsort(gain_key, kind="stable")
                    keep = np.zeros(spend.size, dtype=bool)
                    keep[rank[np.cumsum(spend[rank]) <= ctx.budget]] = True
                    keep &= np.isfinite(gain_key)
                    ok &= keep[: n * t].reshape(n, t)
                    replace &= keep[n * t :]
                ctx.budget -= int(np.where(ok, w_best, 0).sum() + np.where(replace, r_writes, 0).sum())
            if replace.any():
                rows = np.flatnonzero(replace)
                lay_r = active[rows]
                g_r = hot[rows, 0]
                old = state.slots[lay_r, g_r, r_slot[rows]].copy()
                state.slots[lay_r, g_r, r_slot[rows]] = r_expert[rows]
                np.subtract.at(state.counts, (lay_r, old), 1)
                np.add.at(state.counts, (lay_r, r_expert[rows]), 1)
                state.refresh(lay_r)
        if not ok.any() and not replace.any():
            stalled.append(active)
            return np.concatenate(stalled)
        i_hot, k_part, j_part = np.unravel_index(best, new_max.shape[2:])
        rows, cols = np.nonzero(ok)
        lay_sel = active[rows]
        g_hot = hot[rows, cols]
        g_part = part[rows, cols, k_part[rows, cols]]
        i_sel, j_sel = i_hot[rows, cols], j_part[rows, cols]
        a = state.slots[lay_sel, g_hot, i_sel].copy()
        b = state.slots[lay_sel, g_part, j_sel].copy()
        state.slots[lay_sel, g_hot, i_sel] = b
        state.slots[lay_sel, g_part, j_sel] = a
        d = state.per_replica[lay_sel, a] - state.per_replica[lay_sel, b]
        state.gpu_load[lay_sel, g_hot] -= d
        state.gpu_load[lay_sel, g_part] += d
        above_goal = state.gpu_load[active].max(axis=1) > goal_load[active]
        moved = ok[:, 0] | replace
        stalled.append(active[~moved & above_goal])
        active = active[moved & above_goal]
    return np.concatenate(stalled)


def _add_node_partner(
    gl: np.ndarray, hot: np.ndarray, part: np.ndarray, node_of_gpu: np.ndarray, node_gpus: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Append to each hot GPU's partners the lightest free GPU of its own node (moves that stay on NVLink).

    Free means neither hot nor anyone's partner this round, so the partner sets
    stay disjoint; of two hot GPUs on one node only the heavier gets one.
    Returns partners ``(n, t, k + 1)`` and which of them may be used.
    """
    n, t, k = part.shape
    rows = np.arange(n)
    taken = np.zeros(gl.shape, dtype=bool)
    taken[rows[:, None], hot] = True
    taken[rows[:, None, None], part] = True
    node_hot = node_of_gpu[hot]
    members = node_gpus[node_hot]  # (n, t, gpus_per_node)
    free = (members >= 0) & ~taken[rows[:, None, None], members]
    member_load = np.where(free, gl[rows[:, None, None], members], np.inf)
    pick = member_load.argmin(axis=2)
    ok = np.isfinite(np.take_along_axis(member_load, pick[:, :, None], axis=2)[:, :, 0])
    shares = (node_hot[:, :, None] == node_hot[:, None, :]) & np.tri(t, k=-1, dtype=bool)[None]
    ok &= ~shares.any(axis=2)
    extra = np.where(ok, np.take_along_axis(members, pick[:, :, None], axis=2)[:, :, 0], part[:, :, 0])
    part = np.concatenate([part, extra[:, :, None]], axis=2)
    usable = np.concatenate([np.ones((n, t, k), dtype=bool), ok[:, :, None]], axis=2)
    return part, usable


def _move_key(
    valid: np.ndarray,
    new_max: np.ndarray,
    hot_load: np.ndarray,
    goal: np.ndarray,
    mean: np.ndarray,
    writes: np.ndarray,
    cross: np.ndarray,
) -> np.ndarray:
    """Rank of a repair move, lower is better (``inf`` when not allowed).

    Moves that bring the hot GPU to its goal rank first, by copies written (a
    cross-node copy counts ``1 + _CROSS_NODE_WRITE_COST``), then by the resulting maximum; the others by
    gain per copy written.
    """
    out = np.full(valid.shape, np.inf)
    if not valid.any():
        return out
    # score only the allowed moves: their coordinates once, then each operand read there
    # (a size-1 axis at index 0), cheaper than full-size arithmetic or masks over broadcasts
    at = np.nonzero(valid)

    def pick(array: np.ndarray) -> np.ndarray:
        picked: np.ndarray = array[tuple(c if size > 1 else 0 for c, size in zip(at, array.shape))]
        return picked

    new_max, hot_load, goal, mean = pick(new_max), pick(hot_load), pick(goal), pick(mean)
    cost = pick(writes) + _CROSS_NODE_WRITE_COST * pick(cross)
    cost = np.maximum(cost, 0.25)
    reaching = cost + new_max / np.where(hot_load > 0, hot_load, 1.0)  # in [cost, cost + 1)
    not_reaching = 1e3 - (hot_load - new_max) / mean / cost
    out[valid] = np.where(new_max <= goal, reaching, not_reaching)
    return out


def _best_replace(
    state: PlacementState,
    active: np.ndarray,
    hot: np.ndarray,
    hot_load: np.ndarray,
    goal: np.ndarray,
    mean: np.ndarray,
    ctx: MoveContext,
    original: OriginalPlacement,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Best one-copy re-assignment on GPU ``hot`` of each layer: (key, slot, new expert, writes)."""
    n = active.size
    gpus, slots_per_gpu = state.slots.shape[1:]
    experts = state.load.shape[1]
    slots = state.slots[active]  # (n, A, S)
    e_hot = slots[np.arange(n), hot]  # (n, S)
    counts = np.concatenate([state.counts[active], np.zeros((n, 1), dtype=np.int64)], axis=1)
    load = np.concatenate([state.load[active], np.zeros((n, 1))], axis=1)
    e_safe = np.where(e_hot >= 0, e_hot, experts)
    r_a = counts[np.arange(n)[:, None], e_safe]
    w_a = load[np.arange(n)[:, None], e_safe]
    p_a = state.per_replica[active[:, None], e_hot]
    can_give = (e_hot >= 0) & (r_a >= 2)
    if ctx.count_cap is not None:
        can_give &= w_a / np.maximum(r_a - 1, 1) <= ctx.count_cap[active][:, None]
    rise = w_a / np.maximum(r_a * (r_a - 1), 1)  # what each other host of a gains
    # heaviest other host of a: looked up among the next hottest GPUs; past them, the
    # load of the first GPU not looked at bounds it from above
    gl = state.gpu_load[active]
    look = min(_HOST_LOOKUP, gpus - 1)
    others = np.where(np.arange(gpus)[None, :] == hot[:, None], -np.inf, gl)  # hot GPU sorts last
    order = np.argsort(-others, axis=1)[:, : look + 1]
    top = order[:, :look]
    top_slots = slots[np.arange(n)[:, None], top]  # (n, look, S)
    hosts = (top_slots[:, None, :, :] == e_hot[:, :, None, None]).any(axis=3)  # (n, S, look)
    top_load = gl[np.arange(n)[:, None], top]
    beyond_load = gl[np.arange(n), order[:, look]] if gpus - 1 > look else np.full(n, -np.inf)
    host_max = np.maximum(np.where(hosts, top_load[:, None, :], -np.inf).max(axis=2), beyond_load[:, None]) + rise
    # the expert to receive the slot: coldest next copy that the hot GPU does not hold
    nxt = np.where(counts[:, :experts] < gpus, load[:, :experts] / (counts[:, :experts] + 1), np.inf)
    few = min(slots_per_gpu + 1, experts)  # one of these is not on the hot GPU
    cand = (
        np.argpartition(nxt, few - 1, axis=1)[:, :few]
        if few < experts
        else np.broadcast_to(np.arange(experts), (n, experts))
    )
    cand_value = nxt[np.arange(n)[:, None], cand]
    ranked = np.argsort(cand_value, axis=1)
    cand = cand[np.arange(n)[:, None], ranked]
    free = ~holds(e_hot[:, None, :], cand) & np.isfinite(cand_value[np.arange(n)[:, None], ranked])
    first = free.argmax(axis=1)
    c = cand[np.arange(n), first]
    c_ok = free[np.arange(n), first]
    p_c = nxt[np.arange(n), c]
    new_hot = hot_load[:, None] - p_a + np.where(c_ok, p_c, 0.0)[:, None]
    new_max = np.maximum(new_hot, host_max)
    valid = can_give & c_ok[:, None] & (new_max < hot_load[:, None] - 1e-9 * mean[:, None])
    orig = original.slots[active, hot]  # (n, S)
    writes = (c[:, None] != orig).astype(np.int64) - (e_hot != orig)
    has_local = original.node_has[active, ctx.node_of_gpu[hot], c]
    has_any = original.node_has[active, :, c].any(axis=1)
    cross = np.broadcast_to((~has_local & has_any)[:, None], valid.shape).astype(np.int64)
    if ctx.node_local:
        valid &= (has_local | ~has_any)[:, None]
    if ctx.budget is not None:
        valid &= writes <= ctx.budget
    key = _move_key(valid, new_max, hot_load[:, None], goal[:, None], mean[:, None], writes, cross)
    slot = key.argmin(axis=1)
    rows = np.arange(n)
    return key[rows, slot], slot, c, writes[rows, slot]


def adjust_counts(
    state: PlacementState,
    layers: np.ndarray,
    cap: np.ndarray,
    floor: np.ndarray,
    ctx: MoveContext,
    priority: np.ndarray,
) -> None:
    """Give extra copies to experts whose per-replica load exceeds ``cap`` or whose count is below ``floor``.

    ``floor`` restores copies lost on unavailable GPUs, so a failure moves the
    failed GPU's replicas elsewhere instead of piling their load on the survivors.

    Each new copy overwrites, on the GPU where the result is lightest, either an
    empty slot or a copy of an expert that keeps per-replica load <= ``cap``
    without it. Lost experts (no copy at all) come first; under a budget, layers
    with higher ``priority`` spend first.
    """
    if layers.size == 0:
        return
    load = state.load[layers]
    gpus = state.slots.shape[1]
    counts = state.counts[layers]
    safe_cap = np.where(cap[layers] > 0, cap[layers], 1.0)
    need = np.clip(np.ceil(load / safe_cap[:, None]), 1, gpus).astype(np.int64)
    need = np.where(load > 0, need, 1)
    need = np.maximum(need, np.minimum(floor[layers], gpus))
    deficit = np.maximum(need - counts, 0)
    if not deficit.any():
        return
    surplus = np.zeros((layers.size, load.shape[1] + 1), dtype=np.int64)
    surplus[:, :-1] = np.maximum(counts - need, 0)
    surplus[:, -1] = 1 << 40  # empty slots are always free to take
    # gainer copies per layer: lost experts first, then by resulting per-replica load
    width = int(deficit.sum(axis=1).max())
    # one entry per copy to add, all layers at once: (row, expert, n-th new copy of it)
    row_of, expert_of = np.nonzero(deficit)
    reps = deficit[row_of, expert_of]
    row_e, expert_e = np.repeat(row_of, reps), np.repeat(expert_of, reps)
    starts = np.cumsum(reps) - reps
    nth = np.arange(row_e.size) - np.repeat(starts, reps)
    have = counts[row_e, expert_e]
    lost_e = (have == 0) & (nth == 0)
    restore_e = nth < np.minimum(floor[layers], gpus)[row_e, expert_e] - have
    key = np.where(lost_e, np.inf, load[row_e, expert_e] / (have + nth + 1))
    order = np.lexsort((-key, row_e))  # by layer, then lost experts and largest per-replica load first
    row_e, expert_e, lost_e, restore_e = row_e[order], expert_e[order], lost_e[order], restore_e[order]
    first = np.searchsorted(row_e, np.arange(layers.size))
    col = np.arange(row_e.size) - first[row_e]
    gainers = np.full((layers.size, width), -1, dtype=np.int64)
    mandatory = np.zeros((layers.size, width), dtype=bool)
    restoring = np.zeros((layers.size, width), dtype=bool)  # a copy lost on an unavailable GPU coming back
    gainers[row_e, col] = expert_e
    mandatory[row_e, col] = lost_e
    restoring[row_e, col] = restore_e
    mean_load = state.load.sum(axis=1) / gpus
    # each expert's busiest host, as the call found them (refreshed per copy only for lost copies)
    busiest = _busiest_host(state, layers)
    for step in range(width):
        b = gainers[:, step]
        go = b >= 0
        if not go.any():
            break
        if ctx.budget is not None:
            # lost experts always go (the caller checked the budget covers them all);
            # the rest share what the lost experts still to come leave over
            spare = ctx.budget - int(mandatory[:, step:].sum())
            optional = np.flatnonzero(go & ~mandatory[:, step])
            if optional.size > max(spare, 0):
                ctx.budget_bound = True
            optional = optional[np.argsort(-priority[layers[optional]], kind="stable")][: max(spare, 0)]
            go = go & mandatory[:, step]
            go[optional] = True
            if not go.any():
                continue
        rows = np.flatnonzero(go)
        lay = layers[rows]
        bb = b[rows]
        mand = mandatory[rows, step] | restoring[rows, step]
        if step and mand.any():
            busiest[rows] = _busiest_host(state, lay)  # lost copies: each donor's hosts as they are now
        # the lightest GPUs first; rows that find nothing there look at every GPU
        near = min(_GAINER_GPUS, gpus)
        light = np.argsort(state.gpu_load[lay], axis=1)[:, :near]
        g, k = _gainer_slot(state, rows, lay, bb, mand, surplus, light, ctx, mean_load, busiest)
        retry = np.flatnonzero(g < 0)
        if retry.size and near < gpus:
            everywhere = np.broadcast_to(np.arange(gpus), (retry.size, gpus))
            g[retry], k[retry] = _gainer_slot(
                state, rows[retry], lay[retry], bb[retry], mand[retry], surplus, everywhere, ctx, mean_load, busiest
            )
        found = g >= 0
        rows, lay, bb, g, k = rows[found], lay[found], bb[found], g[found], k[found]
        if rows.size == 0:
            continue
        a = state.slots[lay, g, k].copy()
        state.slots[lay, g, k] = bb
        surplus[rows, a] -= a >= 0
        np.subtract.at(state.counts, (lay[a >= 0], a[a >= 0]), 1)
        np.add.at(state.counts, (lay, bb), 1)
        state.refresh(lay)
        if ctx.budget is not None:
            ctx.budget -= rows.size


def _gainer_slot(
    state: PlacementState,
    rows: np.ndarray,
    lay: np.ndarray,
    bb: np.ndarray,
    mand: np.ndarray,
    surplus: np.ndarray,
    gpus_to_try: np.ndarray,
    ctx: MoveContext,
    mean_load: np.ndarray,
    busiest: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:
    """Slot for a new copy of ``bb`` among ``gpus_to_try`` (per row): lightest result; (-1, -1) if none.

    A lost copy (an expert that lost every one, or a copy lost on an unavailable GPU)
    may take any copy of an expert that has another one (one always exists, since
    experts <= slots); other gainers only take copies above their expert's need, or
    empty slots. The score is the larger of the receiving GPU's new load and that of
    the donor's busiest other host, which takes a share of the copy given up, so a
    lost copy replaces a copy of an expert with many (each host gains little).
    """
    n, _width = gpus_to_try.shape
    slots_per_gpu = state.slots.shape[2]
    cand = state.slots[lay[:, None], gpus_to_try]  # (n, width, S)
    counts_pad = np.concatenate([state.counts[lay], np.zeros((n, 1), dtype=np.int64)], axis=1)
    flat = cand.reshape(n, -1)
    donor = counts_pad[np.arange(n)[:, None], np.where(flat >= 0, flat, counts_pad.shape[1] - 1)] >= 2
    spare_copy = surplus[rows[:, None], flat] > 0
    ok = np.where(mand[:, None], donor | (flat < 0), spare_copy)
    ok &= np.repeat(~holds(cand, bb[:, None]), slots_per_gpu, axis=1)
    cross: float | np.ndarray = 0.0
    if ctx.original is not None:
        node_has = ctx.original.node_has
        has_node = node_has[lay[:, None], ctx.node_of_gpu[gpus_to_try], bb[:, None]]  # (n, width)
        # reduced over an axis of a 2-D array: always an array (numpy types ndarray.any as bool | array)
        has_any: np.ndarray = node_has[lay, :, bb].any(axis=1)  # type: ignore[assignment]
        if ctx.node_local:
            ok &= np.repeat(has_node | ~has_any[:, None], slots_per_gpu, axis=1)
        cross = np.repeat((~has_node & has_any[:, None]).astype(np.float64), slots_per_gpu, axis=1)
    new_pr = state.load[lay, bb] / (state.counts[lay, bb] + 1)
    gpu_load = np.repeat(state.gpu_load[lay[:, None], gpus_to_try], slots_per_gpu, axis=1)
    given_up = state.per_replica[lay[:, None], flat]
    result = gpu_load - given_up + new_pr[:, None]
    # the donor's other hosts share the copy given up: the busiest of them must stay light too
    # the donor's other hosts share the copy given up: the busiest of them must stay light too
    rows_n = np.arange(n)
    donor_count = counts_pad[rows_n[:, None], np.where(flat >= 0, flat, counts_pad.shape[1] - 1)]
    rise = given_up / np.maximum(donor_count - 1, 1)
    result = np.maximum(result, busiest[rows[:, None], flat] + rise)
    # a copy its expert needs is taken only when no spare one will do (but a lost copy may take any)
    penalty = (_CROSS_NODE_PENALTY * cross + 1e6 * (~spare_copy & ~mand[:, None])) * mean_load[lay][:, None]
    score = np.where(ok, result + penalty, np.inf)
    pick = score.argmin(axis=1)
    found = np.isfinite(score[np.arange(n), pick])
    g = np.where(found, gpus_to_try[np.arange(n), pick // slots_per_gpu], -1)
    k = np.where(found, pick % slots_per_gpu, -1)
    return g, k


def _busiest_host(state: PlacementState, lay: np.ndarray) -> np.ndarray:
    """``out[i, e]``: the largest load among the GPUs holding expert ``e`` in layer ``lay[i]``
    (``-inf`` for an expert without a copy and in the last column, index -1, for empty slots).

    One scatter-maximum over the slots for all rows at once (``ufunc.at`` on numpy >= 2 is
    tens of times faster than sorting the slots by expert).
    """
    n = lay.size
    experts = state.load.shape[1]
    slots = state.slots[lay].reshape(n, -1)
    slots_per_gpu = state.slots.shape[2]
    key = (np.arange(n)[:, None] * (experts + 1) + np.where(slots >= 0, slots, experts)).ravel()
    value = np.repeat(state.gpu_load[lay], slots_per_gpu, axis=1).ravel()
    out = np.full(n * (experts + 1), -np.inf)
    np.maximum.at(out, key, value)
    out = out.reshape(n, experts + 1)
    out[:, -1] = -np.inf
    return out


def fill_empty_slots(state: PlacementState, layers: np.ndarray, goal_load: np.ndarray, ctx: MoveContext) -> None:
    """Give every empty slot of an available GPU a new copy (a GPU back from failure, emptied slots).

    An empty slot serves nothing, and filling it writes one copy and moves no other:
    each takes, one slot per layer per round, a copy of the expert whose busiest host is
    the hottest GPU (ties: the largest per-replica load), among those whose split share
    still fits on the GPU under ``goal_load`` (and that the GPU does not hold yet), so
    the new copy relieves the hottest GPUs without overloading the GPU being filled. Under a budget the layers with the hottest such
    copy (relative to their mean) go first.
    """
    gpus, slots_per_gpu = state.slots.shape[1:]
    experts = state.load.shape[1]
    for _ in range(gpus * slots_per_gpu):
        if layers.size == 0:
            return
        empty = (state.slots[layers] < 0).reshape(layers.size, -1)
        layers = layers[empty.any(axis=1)]
        if layers.size == 0:
            return
        n = layers.size
        pick = (state.slots[layers] < 0).reshape(n, -1).argmax(axis=1)
        g, k = pick // slots_per_gpu, pick % slots_per_gpu
        held = np.zeros((n, experts + 1), dtype=bool)
        held[np.arange(n)[:, None], state.slots[layers, g]] = True
        counts = state.counts[layers]
        hot = state.per_replica[layers, :-1]
        eligible = ~held[:, :experts] & (counts < gpus)
        if ctx.node_local and ctx.original is not None:
            # only experts with a copy on this GPU's node (or none anywhere: from storage)
            node_has = ctx.original.node_has[layers, :, :experts]
            eligible &= node_has[np.arange(n), ctx.node_of_gpu[g]] | ~node_has.any(axis=1)
        # the copy that relieves the busiest GPUs most, among those whose split share still
        # fits under the goal on this GPU (else the lightest share): the expert whose busiest
        # host is hottest, ties by per-replica load
        share = state.load[layers] / (counts + 1)
        room = goal_load[layers] - state.gpu_load[layers, g]
        # an expert without any copy must come back, whether or not its share fits
        fits = eligible & ((share <= room[:, None]) | (counts == 0))
        mean = np.maximum(state.load[layers].sum(axis=1) / gpus, 1e-300)[:, None]
        busiest = np.maximum(_busiest_host(state, layers)[:, :experts], 0.0) / mean
        # an expert without any copy takes an empty slot before anything else: it must come back
        key = np.where(counts == 0, np.finfo(np.float64).max, busiest + 1e-3 * hot / mean)
        score = np.where(fits, key, -np.inf)
        use_fit = score.max(axis=1) > -np.inf
        fallback = np.where(eligible, np.where(counts == 0, np.finfo(np.float64).max, -share), -np.inf)
        score = np.where(use_fit[:, None], score, fallback)
        expert = score.argmax(axis=1)
        gain = score[np.arange(n), expert]  # ranks the layers under a budget
        go = gain > -np.inf
        if ctx.budget is not None:
            # copies owed to experts without any (here or in layers repaired later) are
            # written whatever the budget: the rest of it is what optional fills may spend
            lost = go & (counts[np.arange(n), expert] == 0)
            spare = ctx.budget - int((state.counts == 0).sum())
            optional = go & ~lost
            if optional.sum() > max(spare, 0):
                ctx.budget_bound = True
                rank = np.argsort(np.argsort(-np.where(optional, gain, -np.inf), kind="stable"), kind="stable")
                go = lost | (optional & (rank < max(spare, 0)))
        if not go.any():
            return
        lay, g, k, expert = layers[go], g[go], k[go], expert[go]
        state.slots[lay, g, k] = expert
        np.add.at(state.counts, (lay, expert), 1)
        state.refresh(lay)
        if ctx.budget is not None:
            ctx.budget -= int(lay.size)
        layers = layers[go]
