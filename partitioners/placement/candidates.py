"""The candidate strategies: each a pure function of a :class:`PlacementContext` returning a :class:`Proposal`.

One batch of a modern CNN or transformer has little parallelism, so no single
partitioner is best across the regimes the engine meets (memory-bound models,
micro-batched pipelines, wide graphs on many devices). ``strategy="auto"``
therefore proposes one placement per strategy below and lets the simulator judge
(:mod:`partitioners.placement.scoring`); :func:`candidate_schedule` says which
strategies apply to a request and in which order they are worth their simulation.

``single``
    Everything on the fastest device (:func:`single_device`).
``heft``, ``heft-contention``
    HEFT list scheduling [1]_ (:func:`heft`); the second also models link-port
    contention the way the simulator does [2]_, which matters most across nodes.
``metis-k``
    Hypergraph-aware METIS [3]_ on ``k`` devices with part weights proportional to
    device speed (:func:`metis_k_way`); across node groups it is hierarchical:
    level 1 splits the graph between groups (slow links), level 2 splits each
    group's share between its devices. ``metis-edge-cut-k`` is the textbook
    edge-cut baseline (:func:`metis_edge_cut`).
``pipeline-k``
    Contiguous split of a topological order into ``k`` stages [4]_ [5]_, balanced by
    time within each device's memory (:func:`pipeline_stages`).
``hybrid-SxR``
    ``S`` pipeline stages, each replicated on ``R`` devices taking micro-batches
    round-robin (replica-per-device when ``S == 1``) (:func:`hybrid_replicas`).

A proposal may break the device-type lists or, in pipeline mode, the acyclic stage
order; scoring repairs both (:mod:`partitioners.placement.repairs`).

References
----------
.. [1] H. Topcuoglu, S. Hariri, M.-Y. Wu, "Performance-Effective and
   Low-Complexity Task Scheduling for Heterogeneous Computing", IEEE TPDS 13(3),
   2002.
.. [2] O. Sinnen, L. A. Sousa, "Communication Contention in Task Scheduling",
   IEEE TPDS 16(6), 2005.
.. [3] G. Karypis, V. Kumar, "A Fast and High Quality Multilevel Scheme for
   Partitioning Irregular Graphs", SIAM J. Sci. Comput. 20(1), 1998.
.. [4] Y. Huang et al., "GPipe: Efficient Training of Giant Neural Networks using
   Pipeline Parallelism", NeurIPS 2019.
.. [5] D. Narayanan et al., "PipeDream: Generalized Pipeline Parallelism for DNN
   Training", SOSP 2019.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import numpy as np

from partitioners.graph.transforms import PHASE_FORWARD
from partitioners.placement.context import PlacementContext
from partitioners.placement.heft import heft_schedule
from partitioners.placement.metis_adapter import induced_subgraph, metis_graph, metis_partition
from partitioners.placement.pipeline import hybrid_layout, stage_of_origin
from partitioners.placement.repairs import devices_in_groups_allowed, groups_allowed, keep_on_allowed_devices

__all__ = [
    "CLASSIC_HEFT_MAX_OPS",
    "EDGE_CUT_MAX_OPS",
    "HEFT_BUDGET_SCALE",
    "Proposal",
    "CandidateSchedule",
    "single_device",
    "most_efficient_device",
    "heft",
    "heft_tight",
    "metis_k_way",
    "metis_edge_cut",
    "pipeline_stages",
    "hybrid_replicas",
    "candidate_schedule",
    "device_counts",
    "hybrid_shapes",
]

#: Above this many operators only the contention-aware HEFT runs (each HEFT pass costs seconds;
#: the classic one has not won a case in bench/placement.py).
CLASSIC_HEFT_MAX_OPS = 60_000
#: Graphs up to this many (expanded) operators also try flat edge-cut METIS.
EDGE_CUT_MAX_OPS = 50_000
#: HEFT charges parameters (and saved activations) against this share of each memory budget.
HEFT_BUDGET_SCALE = 0.85
#: Pipeline and hybrid splits plan each stage's memory to this share of its smallest budget.
STAGE_BUDGET_SCALE = 0.9


@dataclass(frozen=True, eq=False)
class Proposal:
    """A placement a strategy proposes, before repairs and scoring.

    Attributes
    ----------
    strategy : str
        The candidate's name (``"heft-contention"``, ``"metis-8"``, ``"hybrid-2x4"``...).
    placement : numpy.ndarray of int64, shape (n_ops,)
        Device of every operator of the expanded graph.
    priority : numpy.ndarray of float64 or None
        Operator priorities for the simulator (larger runs first); ``None`` lets the
        simulator use critical-path priorities.
    note : str
        What the user should know about how it was built.
    """

    strategy: str
    placement: np.ndarray
    priority: np.ndarray | None = None
    note: str = ""


def single_device(ctx: PlacementContext) -> Proposal:
    """Everything on the fastest device every operator may run on.

    When device types leave no such device, everything on the fastest one with the
    restricted operators moved to devices of their types.
    """
    d = int(ctx.devices[0])
    c = ctx.constraint
    names = ctx.inventory.device_names
    if c is None:
        return Proposal("single", np.full(ctx.n_ops, d, dtype=np.int64), note=f"device {names[d]}")
    rows = np.unique(c.op_allowed_set)
    common = ctx.devices[c.allowed[np.ix_(rows, ctx.devices)].all(axis=0)]
    if common.shape[0]:
        d = int(common[0])
        return Proposal("single", np.full(ctx.n_ops, d, dtype=np.int64), note=f"device {names[d]}")
    placement, moved = keep_on_allowed_devices(ctx, np.full(ctx.n_ops, d, dtype=np.int64))
    return Proposal(
        "single",
        placement,
        note=(f"device {names[d]}; no device takes every operator's type, {moved} operators on devices of their types"),
    )


def most_efficient_device(ctx: PlacementContext) -> Proposal | None:
    """Everything on the device whose one-device step costs the least energy (or energy x delay).

    :func:`single_device` takes the fastest device; in a heterogeneous inventory a slower
    device of lower power can finish the same work on fewer joules. Each usable device
    that takes every operator is priced as a one-device plan (its time is the sum of its
    operator times; the usable devices left idle pay idle power when counted).
    ``None`` when that device is the fastest one, or device types restrict operators.
    """
    inv = ctx.inventory
    active, idle = inv.device_active_power_w, inv.device_idle_power_w
    if ctx.constraint is not None or active is None or idle is None:
        return None
    devices = ctx.devices
    time_s = ctx.op_times_s[:, devices].sum(axis=0)
    held_idle_w = float(idle[devices].sum()) if ctx.options.count_idle_devices else 0.0
    energy_j = time_s * (active[devices] + held_idle_w - (idle[devices] if ctx.options.count_idle_devices else 0.0))
    cost = energy_j * time_s if ctx.options.objective == "energy_delay" else energy_j
    d = int(devices[int(np.argmin(cost))])
    if d == int(devices[0]):
        return None
    return Proposal("single-efficient", np.full(ctx.n_ops, d, dtype=np.int64), note=f"device {inv.device_names[d]}")


def _heft_schedule(ctx: PlacementContext, *, contention: bool, budget_scale: float) -> tuple[np.ndarray, np.ndarray]:
    """HEFT [1]_ over every usable device: its placement, and its order as simulator priorities.

    Parameters and (in training) saved activations are charged against
    ``budget_scale`` times each device's memory budget.
    """
    e = ctx.expanded
    static = None
    if e.mode == "training":
        static = np.where(e.op_phase == PHASE_FORWARD, ctx.graph.op_output_bytes(), 0.0)
    c = ctx.constraint
    sched = heft_schedule(
        ctx.graph,
        ctx.op_times_s,
        *ctx.link_tables,
        ctx.levels,
        devices=ctx.devices,
        device_group=ctx.inventory.device_group,
        param_budget_bytes=ctx.memory_budget_bytes * budget_scale,
        op_static_bytes=static,
        contention=contention,
        op_allowed_set=None if c is None else c.op_allowed_set,
        allowed_devices=None if c is None else c.allowed,
    )
    priority = np.empty(ctx.n_ops, dtype=np.float64)
    priority[sched.order] = np.arange(ctx.n_ops, 0, -1, dtype=np.float64)
    return sched.placement, priority


def heft(ctx: PlacementContext, *, contention: bool) -> Proposal:
    """HEFT list scheduling [1]_ on every usable device; with ``contention``, link ports
    are modelled as the simulator models them [2]_ (``heft-contention``)."""
    placement, priority = _heft_schedule(ctx, contention=contention, budget_scale=HEFT_BUDGET_SCALE)
    note = f"{ctx.devices.shape[0]} devices offered" + (", link ports modelled" if contention else "")
    return Proposal("heft-contention" if contention else "heft", placement, priority, note)


def heft_tight(ctx: PlacementContext, budget_scale: float) -> Proposal:
    """Contention-aware HEFT with the memory budget scaled down to ``budget_scale``.

    For memory-bound requests: when no candidate fits, HEFT again with the budget
    it overran shrunk by its overshoot.
    """
    placement, priority = _heft_schedule(ctx, contention=True, budget_scale=budget_scale)
    return Proposal("heft-contention/tight", placement, priority, f"memory budget x{budget_scale:.2f}")


def metis_edge_cut(ctx: PlacementContext) -> Proposal:
    """Flat METIS k-way [3]_ on the plain operator graph's edge cut, speed-proportional parts.

    The textbook baseline (it over-counts fan-out, see DESIGN.md); kept as a
    candidate on small graphs so ``auto`` is never beaten by it.
    """
    devices = ctx.devices
    mg = metis_graph(ctx.graph, ctx.reference_times_s, hypergraph=False)
    parts = metis_partition(mg, len(devices), speeds=ctx.device_speed[devices], seed=ctx.options.seed)
    return Proposal(f"metis-edge-cut-{devices.shape[0]}", devices[parts], note="plain edge cut")


def metis_k_way(ctx: PlacementContext, k: int) -> Proposal:
    """Hypergraph-aware METIS [3]_ on the first ``k`` usable devices, parts proportional to speed.

    On one node group, one k-way split. Across groups, hierarchical: level 1 splits
    the graph between groups (slow links) with parts proportional to each group's
    total speed, level 2 splits each group's share between its devices. Restricted
    operators move to a group that has their types between the levels, and to an
    allowed device of that group after level 2.
    """
    devices = ctx.devices[:k]
    speed = ctx.device_speed
    mg = ctx.hypergraph_metis
    groups = ctx.inventory.device_group[devices]
    uniq_groups = list(dict.fromkeys(groups.tolist()))
    seed = ctx.options.seed
    name = f"metis-{k}"
    if len(uniq_groups) == 1:
        parts = metis_partition(mg, len(devices), speeds=speed[devices], seed=seed)
        return Proposal(name, devices[parts])
    placement = np.empty(ctx.n_ops, dtype=np.int64)
    group_speed = np.array([speed[devices[groups == g]].sum() for g in uniq_groups])
    gparts = metis_partition(mg, len(uniq_groups), speeds=group_speed, seed=seed)
    group_devices = np.zeros((len(uniq_groups), ctx.inventory.n_devices), dtype=bool)
    for gi, g in enumerate(uniq_groups):
        group_devices[gi, devices[groups == g]] = True
    if ctx.constraint is not None:
        gparts = groups_allowed(ctx, gparts, group_devices, group_speed)
    for gi, g in enumerate(uniq_groups):
        verts = np.flatnonzero(gparts == gi)
        devs = devices[groups == g]
        if verts.shape[0] == 0:
            continue
        sub = induced_subgraph(mg, verts)
        p = metis_partition(sub, len(devs), speeds=speed[devs], seed=seed)
        placement[verts] = devs[p]
    if ctx.constraint is not None:
        placement = devices_in_groups_allowed(ctx, placement, gparts, group_devices)
    return Proposal(name, placement)


def _stage_layout(ctx: PlacementContext, stages: int, replicas: int) -> tuple[np.ndarray, bool]:
    """``stages`` contiguous stages of a topological order, each on ``replicas`` devices.

    Returns the placement and whether every stage's memory estimate fits its budget.
    """
    devs = ctx.devices[: stages * replicas]
    stage_devices = [devs[s * replicas : (s + 1) * replicas] for s in range(stages)]
    profile = ctx.origin_profile
    stage_speed = np.array([ctx.device_speed[d].sum() for d in stage_devices])
    stage_budget = np.array([ctx.memory_budget_bytes[d].min() for d in stage_devices]) * STAGE_BUDGET_SCALE
    stage, ok = stage_of_origin(
        ctx.expanded, profile.topological_order, profile.time_s, profile.resident_bytes, stage_speed, stage_budget
    )
    placement = hybrid_layout(ctx.expanded, stage, stage_devices, ctx.reference_times_s)
    return placement, ok


def _over_budget_note(ok: bool) -> str:
    return "" if ok else "stage memory estimate over budget"


def pipeline_stages(ctx: PlacementContext, k: int) -> Proposal:
    """A contiguous split of a topological order into ``k`` stages, one device each [4]_ [5]_,
    balanced by time within each device's memory."""
    placement, ok = _stage_layout(ctx, k, 1)
    return Proposal(f"pipeline-{k}", placement, note=_over_budget_note(ok))


def hybrid_replicas(ctx: PlacementContext, stages: int, replicas: int) -> Proposal:
    """``stages`` pipeline stages, each replicated on ``replicas`` devices that take
    micro-batches round-robin."""
    placement, ok = _stage_layout(ctx, stages, replicas)
    return Proposal(f"hybrid-{stages}x{replicas}", placement, note=_over_budget_note(ok))


#: A candidate not yet built: call it with the context to get its proposal.
Builder = Callable[[PlacementContext], Proposal]


@dataclass(frozen=True)
class CandidateSchedule:
    """Which candidates a request tries, in order.

    Attributes
    ----------
    essential : tuple of callables
        Scored whatever the simulation budget: the first of each family, both HEFT
        variants, on small graphs the edge-cut METIS baseline, and pure data
        parallelism (``hybrid-1xR``) when the one-device plan fits.
    extra : tuple of callables
        Scored in order while the simulation budget lasts.
    """

    essential: tuple[Builder, ...]
    extra: tuple[Builder, ...]


def candidate_schedule(ctx: PlacementContext, *, low_memory: bool) -> CandidateSchedule:
    """The multi-device candidates for ``ctx.options.strategy``, most promising family first.

    ``low_memory`` (the one-device plan does not fit) puts pipeline splits and HEFT
    (which respect memory) before replicas (which hold their stage's weights again).
    """
    want = ctx.options.strategy
    n = ctx.n_ops
    k_max = int(ctx.devices.shape[0])
    group_sizes = [int(x) for x in np.unique(ctx.inventory.device_group[ctx.devices], return_counts=True)[1]]
    sizes = sorted(device_counts(k_max, group_sizes), reverse=True)
    families: dict[str, list[Builder]] = {"hybrid": [], "heft": [], "pipeline": [], "metis": []}
    n_essential = {"heft": 2, "metis": 2 if n <= EDGE_CUT_MAX_OPS else 1}
    if ctx.micro_batches > 1:
        shapes = hybrid_shapes(ctx.micro_batches, k_max, low_memory)
        data_parallel = (1, min(ctx.micro_batches, k_max))
        if not low_memory and data_parallel in shapes[1:]:
            # pure data parallelism (every device a whole replica, no activation crossing a
            # link) is what a model that fits one device usually runs best as: always scored
            shapes.remove(data_parallel)
            shapes.insert(1, data_parallel)
            n_essential["hybrid"] = 2
        families["hybrid"] = [partial(hybrid_replicas, stages=s, replicas=r) for s, r in shapes]
    families["heft"] = [partial(heft, contention=True)]
    if n <= CLASSIC_HEFT_MAX_OPS or want == "heft":
        families["heft"].append(partial(heft, contention=False))
    families["pipeline"] = [partial(pipeline_stages, k=k) for k in sizes]
    families["metis"] = [partial(metis_k_way, k=k) for k in sizes]
    if n <= EDGE_CUT_MAX_OPS:
        # the edge-cut baseline as one more essential candidate (cheap at this size)
        families["metis"].insert(1, metis_edge_cut)
    order = ["pipeline", "heft", "hybrid", "metis"] if low_memory else ["hybrid", "heft", "pipeline", "metis"]
    chosen = [f for f in order if want in ("auto", f) and families[f]]
    return CandidateSchedule(
        essential=tuple(b for f in chosen for b in families[f][: n_essential.get(f, 1)]),
        extra=tuple(b for f in chosen for b in families[f][n_essential.get(f, 1) :]),
    )


def device_counts(k_max: int, group_sizes: list[int]) -> list[int]:
    """Device counts worth trying: powers of two below ``k_max``, group boundaries, ``k_max``."""
    sizes = {k_max}
    k = 2
    while k < k_max:
        sizes.add(k)
        k *= 2
    acc = 0
    for s in group_sizes:
        acc += s
        if acc < k_max:
            sizes.add(acc)
    return sorted(sizes)


def hybrid_shapes(m: int, k_max: int, low_memory: bool) -> list[tuple[int, int]]:
    """``(stages, replicas)`` layouts worth trying, most promising first.

    Replicas only help up to ``m`` (one micro-batch each). Without memory pressure,
    layouts using the most devices come first (they use the parallelism); under
    pressure, fewer replicas first (each replica holds its stage's weights again).
    """
    combos: set[tuple[int, int]] = set()
    r = 1
    while r <= min(m, k_max):
        s_max = k_max // r
        for s in {s_max, *[x for x in (1, 2, 4, 8) if x < s_max]}:
            if r > 1:
                combos.add((s, r))
        r *= 2
    if min(m, k_max) > 1:
        combos.add((1, min(m, k_max)))
    if low_memory:
        return sorted(combos, key=lambda c: (c[1], -c[0]))
    return sorted(combos, key=lambda c: (-(c[0] * c[1]), -c[1]))
