"""Choose a dp x tp x pp (x cp x ep) layout for transformer training, and map ranks to GPUs.

Before an operator graph is placed, a large-model job must split its GPUs into
data-, tensor-, pipeline-, context- and expert-parallel groups. This module
enumerates every layout the cluster admits (tensor parallel sizes up to a node,
pipeline sizes up to the layer count, context/expert sizes, micro-batch sizes,
virtual pipeline stages, ZeRO stages 0-3 and recomputation modes), predicts each
one's step time and per-GPU memory with the vectorised analytic model of
:mod:`partitioners.parallel3d.cost` (memory: :mod:`partitioners.parallel3d.memory`),
rejects those that cannot run (with the reason), ranks the rest, and lays the best one
out on the physical GPUs.

Entry points: :func:`plan_parallel_layout` (search), :func:`evaluate_layouts`
(predict given layouts) and :func:`rank_map`. They take the typed inputs of
:mod:`partitioners.parallel3d.specs` (built from JSON-shaped mappings by
:func:`~partitioners.parallel3d.spec_fields.spec_from_mapping`; the HTTP answer is
composed in ``service.domain.parallel``) and return dataclasses with ``to_dict()`` for
JSON. The rank map is returned as numpy arrays for the top
candidate only (100,000 ranks is large); the caller chooses how much to serialise.

Rank order follows Megatron-Core's ``RankGenerator`` convention (innermost first) and is
searched: ``"tp-cp-ep-dp-pp"`` (Megatron-Core's default, torchtitan's mesh: a stage's
data-parallel peers next to each other, pipeline stages outermost) or ``"tp-cp-ep-pp-dp"``
(``--use-tp-pp-dp-mapping``: neighbouring pipeline stages on neighbouring GPUs, replicas
outermost, where only the gradient reduction travels). Tensor-parallel groups are always
consecutive GPUs (one NVLink/NVSwitch domain). What a software generation can run bounds
the search (``presets.SOFTWARE_SEARCH``), and every candidate carries the launch configs
that run it (:mod:`partitioners.parallel3d.launch`).

References
----------
.. [1] D. Narayanan et al., "Efficient Large-Scale Language Model Training on GPU
   Clusters Using Megatron-LM", SC21 (FLOPs per step, 1F1B and interleaved
   schedules, bubble ``(p-1)/(vm)``, tp within a node then pp across nodes).
.. [2] V. Korthikanti et al., "Reducing Activation Recomputation in Large
   Transformer Models", MLSys 2023 (activation memory, sequence parallelism,
   selective recomputation, MFU vs HFU).
.. [3] S. Rajbhandari et al., "ZeRO: Memory Optimizations Toward Training Trillion
   Parameter Models", SC20 (16 B/parameter mixed-precision Adam, stages 1-3).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from typing import Any

import numpy as np
import numpy.typing as npt

from partitioners.errors import Infeasible, InvalidInput
from partitioners.parallel3d.arrays import BoolArray, FloatArray, IntArray
from partitioners.parallel3d.cost import predict_layouts
from partitioners.parallel3d.effective import effective_terms
from partitioners.parallel3d.energy import step_energy_j
from partitioners.parallel3d.flops import model_flops_per_step, parameter_counts
from partitioners.parallel3d.launch import LaunchConfig, LaunchLayout, launch_configs
from partitioners.parallel3d.memory import (
    ACTIVATION_FRAGMENTATION,
    ACTIVATION_FRAGMENTATION_HIGH,
    bytes_at_high_fragmentation,
    fragmentation_that_fills,
    zero_stage_held,
)
from partitioners.parallel3d.presets import RANK_ORDERS, SOFTWARE_SEARCH
from partitioners.parallel3d.specs import (
    MAX_TOP_K,
    RECOMPUTE_MODES,
    ClusterSpec,
    Constraints,
    LayoutSpec,
    ModelSpec,
    TrainingSpec,
    check_precision_runs,
    flash_attention_speed,
)
from partitioners.parallel3d.stages import (
    ORDER_DP_INSIDE,
    RECOMPUTE_FULL,
    RECOMPUTE_NONE,
    RECOMPUTE_OP_SAC,
    RECOMPUTE_SELECTIVE,
    LayoutArrays,
    microbatch_group_size,
    middle_stages_short,
    stage_layer_split,
)

__all__ = [
    "MemoryBreakdown",
    "LayoutPrediction",
    "RankMap",
    "ParallelPlan",
    "REJECTION_REASONS",
    "plan_parallel_layout",
    "evaluate_layouts",
    "enumerate_layouts",
    "rank_map",
]

_GIB = 1024.0**3
_MICRO_BATCH_SIZES = (1, 2, 4, 8, 16)
# Uneven model chunks (Megatron-Core's --pipeline-model-parallel-layout) are searched up to
# this depth; depths that divide a stage's layers are searched whatever their size.
_MAX_UNEVEN_VIRTUAL_STAGES = 16
# Interleaving deeper than this many chunks, or in uneven chunks, is searched only while
# the bubble it removes is worth having: up to twice the depth that brings SC21's (p - 1) / (v m) down to this
# share of the step. Past it a deeper schedule gains less than the planner's tie
# tolerance and costs 2 more pipeline exchanges per micro-batch and chunk.
_BUBBLE_FLOOR = 0.01
_MAX_CP = 32
_CHUNK = 100_000  # candidates costed per vectorised pass
_RECOMPUTE_CODE = {
    "none": RECOMPUTE_NONE,
    "selective": RECOMPUTE_SELECTIVE,
    "full": RECOMPUTE_FULL,
    "op-sac": RECOMPUTE_OP_SAC,
}

# Reasons a layout cannot run, in the order they are reported (bit positions).
REJECTION_REASONS: tuple[str, ...] = (
    "tp-crosses-node",
    "heads-not-divisible-by-tp",
    "more-stages-than-layers",
    "layers-not-divisible-by-pp",
    "batch-not-divisible",
    "out-of-memory",
)


@dataclass(frozen=True)
class MemoryBreakdown:
    """Predicted peak bytes per GPU, by kind, on the fullest pipeline stage: the first (the
    most micro-batches in flight, and the embedding), the last (the logits) or, when the
    first is a layer short and there are more stages than layers per stage, a middle one
    (``(p - 1) q`` layer-micro-batches against ``p (q - 1)`` on the second under
    Megatron's schedules; see ``stage_activation_bytes``). ``fullest_stage`` is that
    stage's pipeline rank.
    """

    parameters_bytes: float
    gradients_bytes: float
    optimizer_state_bytes: float
    activations_bytes: float
    buffers_bytes: float
    total_bytes: float
    capacity_bytes: float
    fullest_stage: int = 0
    activation_fragmentation: float = ACTIVATION_FRAGMENTATION

    @property
    def fragmentation_that_fills(self) -> float | None:
        """Caching-allocator waste on activations at which this footprint reaches capacity.

        The prediction counts ``activation_fragmentation`` (the request's; 10% unless it
        says otherwise); a user who knows their stack wastes more (30% is the high end
        GMLake measured) can compare. None when the layout keeps no activations to fragment.
        """
        if self.activations_bytes <= 0.0:
            return None
        return fragmentation_that_fills(
            self.total_bytes, self.activations_bytes, self.capacity_bytes, self.activation_fragmentation
        )

    def to_dict(self) -> dict[str, float | int | None]:
        return {
            **{k: float(getattr(self, k)) for k in self.__dataclass_fields__ if k != "fullest_stage"},
            "fullest_stage": self.fullest_stage,
            "fragmentation_that_fills": self.fragmentation_that_fills,
        }


@dataclass(frozen=True)
class LayoutPrediction:
    """One layout and what the model predicts for it.

    ``mfu`` counts model FLOPs only (no recomputation) against the bf16 dense
    peak, attention over the whole ``s x s`` matrix (SC21, Megatron-LM);
    ``mfu_causal`` the same over the causal half (Megatron-Bridge's count, see
    ``model_flops_per_step``): compare a published MFU with the one of its
    convention. ``hfu`` adds recomputed FLOPs and the KV projections that tensor
    ranks beyond the KV heads repeat. ``etp`` is the expert tensor-parallel size:
    ``tp`` (routed experts split over the tensor ranks) or 1 (folded: whole experts,
    the ``ep`` expert groups cut from tensor x context x data-parallel ranks).
    ``recompute_num_layers`` is how many layers of
    each model chunk full recomputation covers (Megatron-LM's
    ``--recompute-num-layers``, block method), 0 without it. ``rank_order`` is how ranks
    are laid out, innermost first (``presets.RANK_ORDERS``; :func:`rank_map`). ``reasons`` is empty
    for a layout that can run; otherwise it says why not.
    """

    dp: int
    tp: int
    pp: int
    cp: int
    ep: int
    etp: int
    virtual_stages: int
    micro_batch_size: int
    num_micro_batches: int
    zero_stage: int
    recompute: str
    recompute_num_layers: int
    rank_order: str
    # Sequence parallelism (Korthikanti et al. 2022) on this layout: the run's setting where
    # the tensor group has more than one rank (with one there is nothing to split)
    sequence_parallel: bool
    step_time_s: float
    tokens_per_s: float
    mfu: float
    mfu_causal: float
    hfu: float
    # mfu against the dense peak of the precision the linear layers run in (the FP8 peak
    # for an FP8 run, twice the bf16 one on Hopper), where mfu keeps the bf16 peak that
    # published tables use; the same as mfu for 16-bit runs
    mfu_at_precision_peak: float
    bubble_fraction: float
    time_breakdown_s: Mapping[str, float]
    memory: MemoryBreakdown
    reasons: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()
    tie_with_best: bool = False
    # how each framework would be told to run it (partitioners.parallel3d.launch)
    launch: tuple[LaunchConfig, ...] = ()
    # joules one step draws on all the layout's GPUs, and the tokens it trains per joule
    # (partitioners.parallel3d.energy); None where the cluster gives no power figures
    energy_per_step_j: float | None = None
    tokens_per_joule: float | None = None

    @property
    def fits(self) -> bool:
        return not self.reasons

    @property
    def mesh(self) -> tuple[int, int, int, int, int]:
        return (self.dp, self.pp, self.tp, self.cp, self.ep)

    def to_dict(self) -> dict[str, Any]:
        return {
            "dp": self.dp,
            "tp": self.tp,
            "pp": self.pp,
            "cp": self.cp,
            "ep": self.ep,
            "etp": self.etp,
            "virtual_stages": self.virtual_stages,
            "micro_batch_size": self.micro_batch_size,
            "num_micro_batches": self.num_micro_batches,
            "zero_stage": self.zero_stage,
            "recompute": self.recompute,
            "recompute_num_layers": self.recompute_num_layers,
            "rank_order": self.rank_order,
            "sequence_parallel": self.sequence_parallel,
            "step_time_s": self.step_time_s,
            "tokens_per_s": self.tokens_per_s,
            "mfu": self.mfu,
            "mfu_causal": self.mfu_causal,
            "mfu_note": "model FLOPs only (Narayanan et al. SC21 count, no recomputation) / bf16 dense peak; "
            "mfu_causal counts attention over the causal half only (Megatron-Bridge's Model TFLOP/s); "
            "sliding-window and chunked layers count only the scores inside their window or chunk",
            "hfu": self.hfu,
            "mfu_at_precision_peak": self.mfu_at_precision_peak,
            "bubble_fraction": self.bubble_fraction,
            "time_breakdown_s": dict(self.time_breakdown_s),
            "memory_per_gpu": self.memory.to_dict(),
            "fits": self.fits,
            "reasons": list(self.reasons),
            "notes": list(self.notes),
            "tie_with_best": self.tie_with_best,
            "launch": {config.framework: config.to_dict() for config in self.launch},
            "energy_per_step_j": self.energy_per_step_j,
            "tokens_per_joule": self.tokens_per_joule,
        }


@dataclass(frozen=True)
class RankMap:
    """Every rank's mesh coordinates and the GPU it runs on, computed for the ranks asked for.

    ``coords[r]`` is ``(dp, pp, tp, cp, ep)`` of rank ``r`` (columns named by
    ``COORD_NAMES``); ``device[r]`` the global GPU index (``node * gpus_per_node +
    local_gpu``). ``mesh_shape``/``mesh_dim_names`` describe the same layout as a
    row-major torch ``DeviceMesh`` (outermost first); when ``ep > 1`` the data-parallel
    dimension is split into ``edp`` (outer) and ``ep`` (inner), ``dp = edp * ep``, or, with
    folded experts, into ``dp_outer`` and ``dp_inner`` (``order`` says which; see
    :func:`rank_map`).

    A rank's coordinates are a closed-form function of its index, so the map stores the
    mesh and computes rows on demand: :meth:`ranks` for a range, ``to_dict`` for the
    ranks an answer returns. A cluster may have tens of millions of GPUs, where the whole
    map would take gigabytes; ``coords`` and the other whole-map arrays build it in full
    (and keep it), for callers that want every rank.
    """

    COORD_NAMES = ("dp", "pp", "tp", "cp", "ep")

    num_ranks: int
    gpus_per_node: int
    tp: int
    pp: int
    cp: int
    ep: int
    # folded experts (etp 1 with tp > 1): data-parallel replicas side by side in one expert
    # group, ``dp_inner``; 0 when experts are not folded
    folded_inner: int
    mesh_shape: tuple[int, ...]
    mesh_dim_names: tuple[str, ...]
    order: str = "tp-cp-ep-pp-dp"
    # rank order tp-cp-ep-dp-pp: every data-parallel peer inside a pipeline stage's block
    pipeline_outermost: bool = False

    def ranks(
        self,
        start: int = 0,
        stop: int | None = None,
    ) -> tuple[npt.NDArray[np.int32], IntArray, npt.NDArray[np.int32], npt.NDArray[np.int32]]:
        """``(coords, device, node, local_gpu)`` of ranks ``start`` to ``stop`` (exclusive)."""
        stop = self.num_ranks if stop is None else min(stop, self.num_ranks)
        r = np.arange(max(start, 0), max(stop, start, 0), dtype=np.int64)
        tp, pp, cp, ep = self.tp, self.pp, self.cp, self.ep
        if self.pipeline_outermost:
            block = self.num_ranks // pp  # tp x cp x dp consecutive ranks per stage
            dp_c = (r % block) // (tp * cp)
            ep_c = (r % block) % ep if self.folded_inner else dp_c % ep
            columns = [dp_c, r // block, r % tp, (r // tp) % cp, ep_c]
        elif self.folded_inner:
            inner = self.folded_inner
            block = tp * cp * inner
            dp_c = (r // (block * pp)) * inner + (r // (tp * cp)) % inner
            columns = [dp_c, (r // block) % pp, r % tp, (r // tp) % cp, (r % block) % ep]
        else:
            ep_c = (r // (tp * cp)) % ep
            columns = [(r // (tp * cp * ep * pp)) * ep + ep_c, (r // (tp * cp * ep)) % pp, r % tp, (r // tp) % cp, ep_c]
        coords = np.stack(columns, axis=1).astype(np.int32)
        return coords, r, (r // self.gpus_per_node).astype(np.int32), (r % self.gpus_per_node).astype(np.int32)

    @functools.cached_property
    def _whole(self) -> tuple[npt.NDArray[np.int32], IntArray, npt.NDArray[np.int32], npt.NDArray[np.int32]]:
        return self.ranks()

    @property
    def coords(self) -> npt.NDArray[np.int32]:
        return self._whole[0]

    @property
    def device(self) -> IntArray:
        return self._whole[1]

    @property
    def node(self) -> npt.NDArray[np.int32]:
        return self._whole[2]

    @property
    def local_gpu(self) -> npt.NDArray[np.int32]:
        return self._whole[3]

    def to_dict(self, limit: int | None = 1024) -> dict[str, Any]:
        n = self.num_ranks
        k = n if limit is None else min(n, max(limit, 0))
        coords, device, node, local_gpu = (column.tolist() for column in self.ranks(0, k))
        return {
            "num_ranks": int(n),
            "order": self.order,
            "mesh_shape": list(self.mesh_shape),
            "mesh_dim_names": list(self.mesh_dim_names),
            "coord_names": list(self.COORD_NAMES),
            "ranks": [
                {
                    "rank": r,
                    **dict(zip(self.COORD_NAMES, coords[r])),
                    "device": device[r],
                    "node": node[r],
                    "local_gpu": local_gpu[r],
                }
                for r in range(k)
            ],
            "truncated": k < n,
        }


@dataclass(frozen=True)
class ParallelPlan:
    """Ranked layouts for one request, the better-looking ones that were rejected, and the rank map."""

    num_gpus: int
    candidates: tuple[LayoutPrediction, ...]
    rejected: tuple[LayoutPrediction, ...]
    rejection_counts: Mapping[str, int]
    searched: int
    model_parameters: float
    model_flops_per_step: float
    rank_map: RankMap | None
    notes: tuple[str, ...] = field(default=())

    @property
    def feasible(self) -> bool:
        return bool(self.candidates)

    def infeasible_error(self) -> Infeasible:
        """An :class:`Infeasible` a handler can raise (422) when nothing fits."""
        return Infeasible("; ".join(self.notes) or "no layout can run", field="model", code="no-layout-fits")

    def to_dict(self, rank_map_limit: int | None = 1024) -> dict[str, Any]:
        return {
            "num_gpus": self.num_gpus,
            "feasible": self.feasible,
            "model_parameters": self.model_parameters,
            "model_flops_per_step": self.model_flops_per_step,
            "searched_layouts": self.searched,
            "candidates": [c.to_dict() for c in self.candidates],
            "rejected_better_looking": [c.to_dict() for c in self.rejected],
            "rejection_counts": dict(self.rejection_counts),
            "notes": list(self.notes),
            "rank_map": None if self.rank_map is None else self.rank_map.to_dict(rank_map_limit),
        }


# --------------------------------------------------------------------- enumeration


def _divisors(n: int) -> list[int]:
    small = [d for d in range(1, int(n**0.5) + 1) if n % d == 0]
    return sorted(set(small + [n // d for d in small]))


def expert_groups_fit(dp: int, tp: int, cp: int, ep: int, etp: int) -> bool:
    """Whether ``ep`` expert groups can be cut from a stage's ranks, split over ``etp`` tensor ranks.

    With experts split over the tensor ranks (``etp = tp``, Megatron-Core's default) an
    expert group takes one rank of each of ``ep`` data-parallel replicas: ``ep`` divides
    ``dp``. Folded (``etp = 1``; Liu et al., "MoE Parallel Folding", arXiv:2504.14960,
    2025; Megatron-Core's "Parallel Folding", Yan et al., arXiv:2603.07685, 2026) it takes
    ``ep`` consecutive ranks of the ``tp x cp x dp`` a stage has: a divisor
    of ``tp x cp``, or whole ``tp x cp`` blocks of ``ep / (tp cp)`` replicas (see
    :func:`rank_map`).
    """
    if etp == tp:
        return dp % ep == 0
    if etp != 1:
        return False
    block = tp * cp
    return block % ep == 0 if ep <= block else ep % block == 0 and dp % (ep // block) == 0


def _expert_tensor_sizes(model: ModelSpec, training: TrainingSpec, tp: int) -> tuple[int, ...]:
    """The expert tensor-parallel sizes a search tries at ``tp``: experts split over the tensor
    ranks and, for MoE models under sequence parallelism, folded (their tokens come from its
    shards; Megatron-Core asks for sequence parallelism with MoE and tensor parallelism)."""
    return (tp, 1) if model.moe is not None and training.sequence_parallel and tp > 1 else (tp,)


def _rows_in(rows: IntArray, keep: BoolArray, wanted: set[tuple[int, ...]]) -> BoolArray:
    """Of ``rows`` (one layout key per row), those kept and in ``wanted``."""
    inside = np.zeros(len(rows), dtype=bool)
    if not wanted:
        return inside
    where = np.flatnonzero(keep)
    keys = np.array(sorted(wanted), dtype=np.int64)
    both = np.concatenate([keys, rows[where]])
    _, ids = np.unique(both, axis=0, return_inverse=True)
    ids = ids.reshape(-1)
    inside[where] = np.isin(ids[len(keys) :], ids[: len(keys)])
    return inside


def _interleaving_depths(q: int, uneven_chunks: bool, given: int | None) -> IntArray:
    """Model chunks per stage a search tries for stages of ``q`` layers.

    1 (plain 1F1B), every divisor of ``q`` (chunks of ``q / v`` layers: Megatron-LM's
    ``--num-layers-per-virtual-pipeline-stage``; a stage of 23 layers interleaves 23
    one-layer chunks), and, where the software places layers chunk by chunk
    (Megatron-Core's ``--pipeline-model-parallel-layout``), uneven depths up to
    ``_MAX_UNEVEN_VIRTUAL_STAGES``, whose chunks differ by one layer. Of the depths whose
    longest chunk has ``c`` layers only the smallest, ``ceil(q / c)``, is tried: the
    pipeline fills and drains at the pace of its longest chunk, so a deeper one has the
    same bubble and more exchanges (for ``q = 23``: 1, 2, 3, 4, 5, 6, 8, 12, 23). A depth
    the constraints fix is tried where the stage can have it.
    """
    divisors = set(_divisors(q))
    depths = set(divisors)
    if uneven_chunks:
        longest = range(-(-q // _MAX_UNEVEN_VIRTUAL_STAGES), q + 1)
        depths |= {-(-q // c) for c in longest}
    if given is not None:
        depths = {given} if given in divisors or (uneven_chunks and given <= q) else set()
    return np.array(sorted(depths), dtype=np.int64)


def _rank_orders(training: TrainingSpec, constraints: Constraints) -> list[int]:
    """Positions in RANK_ORDERS a search tries: the constraint's, else those the software offers."""
    if constraints.rank_order is not None:
        return [RANK_ORDERS.index(constraints.rank_order)]
    return [RANK_ORDERS.index(order) for order in SOFTWARE_SEARCH[training.software].rank_orders]


def within_software(
    cons: Constraints, training: TrainingSpec, model: ModelSpec, where: str = "constraints"
) -> Constraints:
    """The constraints narrowed to what ``training.software`` can run (``SOFTWARE_SEARCH``).

    A software generation is a search space as well as a set of flags: Megatron-LM of 2021
    had no ZeRO, no uneven pipeline stages, no context or expert parallelism and only full
    recomputation, so a plan for it proposes none of them. A constraint that asks for
    something the software cannot run, and nothing it can, is refused.
    """
    allowed = SOFTWARE_SEARCH[training.software]
    name = training.software

    # a layout names one ZeRO stage where constraints list several
    field_names = {"zero_stages": "zero_stage"} if where != "constraints" else {}

    def refuse(field_name: str, what: str, runs: str) -> InvalidInput:
        path = f"{where}.{field_names.get(field_name, field_name)}"
        return InvalidInput(
            f"{path}: {what}, which training.software={name!r} cannot run (it runs {runs})",
            field=path,
            code="not-in-this-software",
        )

    if training.pipeline_schedule not in allowed.pipeline_schedules:
        raise InvalidInput(
            f"training.pipeline_schedule: {training.pipeline_schedule!r}, which training.software={name!r} "
            f"cannot run (it runs {list(allowed.pipeline_schedules)})",
            field="training.pipeline_schedule",
            code="not-in-this-software",
        )
    zero = tuple(z for z in cons.zero_stages if z in allowed.zero_stages)
    if not zero:
        raise refuse("zero_stages", f"ZeRO stages {list(cons.zero_stages)}", f"ZeRO stages {list(allowed.zero_stages)}")
    recompute = tuple(r for r in cons.recompute if r in allowed.recompute)
    if not recompute:
        raise refuse("recompute", f"recomputation {list(cons.recompute)}", f"recomputation {list(allowed.recompute)}")
    changes: dict[str, Any] = {"zero_stages": zero, "recompute": recompute}
    if not allowed.uneven_pipeline:
        changes["allow_uneven_pp"] = False
    if not allowed.context_parallel:
        if cons.cp not in (None, 1):
            raise refuse("cp", f"context parallelism cp={cons.cp}", "no context parallelism")
        changes["cp"] = 1
    if not allowed.expert_parallel and model.moe is not None:
        if cons.ep not in (None, 1):
            raise refuse("ep", f"expert parallelism ep={cons.ep}", "no expert parallelism")
        changes["ep"] = 1
    if cons.rank_order is not None and cons.rank_order not in allowed.rank_orders:
        raise refuse("rank_order", f"rank order {cons.rank_order}", f"rank orders {list(allowed.rank_orders)}")
    return replace(cons, **changes)


def _outside_software(layout: Mapping[str, Any], training: TrainingSpec, model: ModelSpec) -> tuple[str, ...]:
    """Notes on what an evaluated layout states that ``training.software`` could not run.

    A published layout is predicted as published (Megatron-DeepSpeed ran ZeRO-1 and uneven
    stages on code branched from Megatron-LM of 2021); the note says which part the named
    generation's own code did not have.
    """
    allowed = SOFTWARE_SEARCH[training.software]
    found = []
    if "zero_stage" in layout and layout["zero_stage"] not in allowed.zero_stages:
        found.append(f"ZeRO-{layout['zero_stage']}")
    if "recompute" in layout and layout["recompute"] not in allowed.recompute:
        found.append(f"{layout['recompute']} recomputation")
    if layout.get("cp", 1) > 1 and not allowed.context_parallel:
        found.append("context parallelism")
    if layout.get("ep", 1) > 1 and not allowed.expert_parallel:
        found.append("expert parallelism")
    if "rank_order" in layout and layout["rank_order"] not in allowed.rank_orders:
        found.append(f"rank order {layout['rank_order']}")
    if "pp" in layout and model.num_layers % int(layout["pp"]) and not allowed.uneven_pipeline:
        found.append("uneven pipeline stages")
    if not found:
        return ()
    return (
        f"{', '.join(found)}: not something training.software={training.software!r} could run itself "
        "(see its search space); predicted as stated",
    )


def enumerate_layouts(
    model: ModelSpec,
    cluster: ClusterSpec,
    training: TrainingSpec,
    constraints: Constraints,
    depths: str = "all",
    deepen: set[tuple[int, ...]] | None = None,
) -> LayoutArrays:
    """Every candidate layout the constraints allow, as parallel arrays.

    ``depths`` picks the interleaving depths: "all", "shallow" (1 and the divisors of a
    stage's layers up to ``_MAX_UNEVEN_VIRTUAL_STAGES``) or "deep" (the others, uneven
    or deeper), the latter only for the ``(dp, tp, pp, cp, ep, etp, order, mbs)`` in
    ``deepen`` when given (see :func:`_search`).

    Structural impossibilities are never generated (``dp`` must be an integer,
    ``ep`` must divide the experts and fit the ranks (:func:`expert_groups_fit`; MoE
    models with ``tp > 1`` are searched with experts split over the tensor ranks and,
    with sequence parallelism, folded), interleaving needs ``pp > 2`` (``pp > 1``
    with asynchronous pipeline exchanges), a depth :func:`_interleaving_depths` allows (a
    divisor of the layers per stage, or uneven chunks where the software has them) and
    micro-batches that fill its groups: whole rounds of ``pp``, or larger groups with
    ``training.flexible_microbatch_groups``). Both rank orders are generated where they
    place groups differently.
    Layouts that are well-formed but cannot run (tp across a node, heads not
    divisible, out of memory, ...) are generated so the answer can say why they
    lost. Tensor-parallel sizes are powers of two up to two nodes (those beyond
    one node only to report them), pipeline sizes every divisor up to the layer
    count, context-parallel sizes powers of two (flash attention only). ZeRO-2/3
    with a pipeline are left out while ZeRO-1 is allowed: they hold the same bytes.
    """
    n_gpus = cluster.num_gpus
    gpn = cluster.gpus_per_node
    batch = training.global_batch_sequences
    if constraints.tp is not None:
        tps = [constraints.tp]
    else:
        tps = [t for t in (1, 2, 4, 8, 16, 32, 64) if t <= 2 * gpn and n_gpus % t == 0]
    if constraints.cp is not None:
        cps = [constraints.cp]
    elif training.flash_attention:
        cps = [
            c
            for c in (1, 2, 4, 8, 16, 32)
            if c <= _MAX_CP and (c == 1 or (model.seq_length % (2 * c) == 0 and model.seq_length // c >= 1024))
        ]
    else:
        cps = [1]
    if constraints.ep is not None:
        eps = [constraints.ep]
    elif model.moe is not None:
        eps = _divisors(model.moe.num_experts)
    else:
        eps = [1]
    max_pp = model.num_layers if constraints.max_pp is None else min(constraints.max_pp, model.num_layers)
    orders = _rank_orders(training, constraints)
    schedule = effective_terms(training).schedule
    rows = []
    for tp in tps:
        for cp in cps:
            if n_gpus % (tp * cp):
                continue
            rest = n_gpus // (tp * cp)
            pps = [constraints.pp] if constraints.pp is not None else [p for p in _divisors(rest) if p <= max_pp]
            for pp in pps:
                if rest % pp or (schedule.needs_even_pipeline and pp > 1 and pp % 2):
                    continue
                dp = rest // pp
                for ep in eps:
                    if model.moe is not None and model.moe.num_experts % ep:
                        continue
                    for etp in _expert_tensor_sizes(model, training, tp):
                        if constraints.etp is not None and etp != constraints.etp:
                            continue
                        if expert_groups_fit(dp, tp, cp, ep, etp):
                            # the order matters only with data-parallel peers and pipeline
                            # stages both to place inside a node; otherwise the first allowed
                            # stands for all (they cost the same)
                            inner = tp * cp * (ep if etp == tp else max(ep // (tp * cp), 1))
                            both = pp > 1 and dp > 1 and inner < gpn
                            for order in orders if both else orders[:1]:
                                rows.append((dp, tp, pp, cp, ep, etp, order))
    if not rows:
        return LayoutArrays(*(np.zeros(0, dtype=np.int64) for _ in fields(LayoutArrays)))
    mesh = np.array(rows, dtype=np.int64)

    mbss = np.array([constraints.micro_batch_size] if constraints.micro_batch_size else _MICRO_BATCH_SIZES)
    uneven_chunks = SOFTWARE_SEARCH[training.software].uneven_chunks
    # schedules other than 1F1B fix the model chunks a rank holds (DualPipeV's V is
    # modelled in its idle time and memory, partitioners.parallel3d.schedules)
    interleaving = SOFTWARE_SEARCH[training.software].interleaving and not schedule.fixed_chunks
    zeros = np.array(sorted(set(constraints.zero_stages)))
    rcs = np.array(
        sorted({_RECOMPUTE_CODE[r] for r in constraints.recompute if r != "selective" or training.selective_recompute}),
        dtype=np.int64,
    )
    # (mesh, micro-batch, v) first: most of those fail on their own, before each survivor
    # is crossed with the ZeRO stages and recomputation modes (in the same order as one
    # grid over all five would give: mesh, micro-batch, v, ZeRO, recomputation)
    # interleaving depths depend on the layers per stage: one grid per stage length
    q_mesh = -(-model.num_layers // mesh[:, 2])
    parts = []
    for q_value in np.unique(q_mesh):
        q_depths = (
            _interleaving_depths(int(q_value), uneven_chunks, constraints.virtual_stages)
            if interleaving
            else np.array([1] if constraints.virtual_stages in (None, 1) else [], dtype=np.int64)
        )
        rows_q = np.flatnonzero(q_mesh == q_value)
        grid = np.meshgrid(rows_q, np.arange(len(mbss)), q_depths, indexing="ij")
        parts.append(np.stack([g.reshape(-1) for g in grid]))
    i_mesh, i_mbs, v = np.concatenate(parts, axis=1) if parts else np.zeros((3, 0), dtype=np.int64)
    # in the order one grid over mesh, micro-batch and v would give
    sort = np.lexsort((v, i_mbs, i_mesh))
    i_mesh, i_mbs, v = i_mesh[sort], i_mbs[sort], v[sort]
    dp, pp = mesh[i_mesh, 0], mesh[i_mesh, 2]
    mbs = mbss[i_mbs]
    # micro-batch sizes above the per-replica batch are meaningless
    per_replica = np.maximum(batch // dp, 1)
    keep = mbs <= np.maximum(per_replica, 1)
    if constraints.micro_batch_size:
        keep[:] = True
    m = np.ceil(batch / (dp * mbs))
    # v chunks of q/v layers on full stages; shorter stages get one shorter (even empty)
    # chunk. --decoder-first/last-pipeline-num-layers cannot say that (each stage's layers
    # must divide by v); Megatron-Core's --pipeline-model-parallel-layout can, placing an
    # identity op in an empty chunk (Megatron-LM MR 2795, "flexible asymmetric VPP")
    q = np.ceil(model.num_layers / pp)
    # Megatron-LM's interleaved 1F1B schedule needs micro-batch groups it can fill
    # (microbatch_group_size: whole rounds of pp, or with Megatron-Core larger groups) and,
    # with batched synchronous exchanges, more than two stages
    # (with two, each rank's batched send and receive go to the same peer: "pipeline-model-
    # parallel size should be greater than 2 to avoid having multiple p2p sends and recvs
    # between same 2 ranks per communication batch", arguments.py). With asynchronous
    # exchanges (--overlap-p2p-comm) two stages are enough: Megatron-Bridge's Qwen3-30B-A3B
    # H100 recipe interleaves pp 2 x vp 24.
    min_interleaved_pp = 2 if training.overlap_p2p_comm else 3
    groups_fit = microbatch_group_size(m.astype(np.int64), pp, training.flexible_microbatch_groups) > 0
    keep &= (v == 1) | ((pp >= min_interleaved_pp) & groups_fit)
    if constraints.virtual_stages is None:
        worth = 2.0 * (pp - 1) / (np.maximum(m, 1.0) * _BUBBLE_FLOOR)
        shallow = (q % v == 0) & (v <= _MAX_UNEVEN_VIRTUAL_STAGES)
        keep &= shallow | (v <= worth)
        if depths == "shallow":
            keep &= shallow
        elif depths == "deep":
            keep &= ~shallow
            if deepen is not None:
                keys = np.stack([mesh[i_mesh, j] for j in range(7)] + [mbs], axis=1)
                keep &= _rows_in(keys, keep, deepen)
    survivors = np.flatnonzero(keep)
    per_survivor = len(zeros) * len(rcs)
    i_mesh, i_mbs, v = (np.repeat(index[survivors], per_survivor) for index in (i_mesh, i_mbs, v))
    i_z = np.tile(np.repeat(np.arange(len(zeros)), len(rcs)), len(survivors))
    i_rc = np.tile(np.arange(len(rcs)), len(survivors) * len(zeros))
    dp, tp, pp, cp, ep, etp, order = (mesh[i_mesh, j] for j in range(7))
    mbs = mbss[i_mbs]
    q = np.ceil(model.num_layers / pp)
    keep = np.ones(len(i_mesh), dtype=bool)
    zero = zeros[i_z]
    if 1 in constraints.zero_stages:
        # under a pipeline ZeRO-2/3 hold ZeRO-1's bytes, so they are searched only where
        # ZeRO-1 is not allowed
        keep &= zero_stage_held(zero, pp) == zero
    rc = rcs[i_rc]
    # full recomputation starts out covering every layer of a model chunk, the longest one
    # where chunks are uneven (see _search)
    chunk_layers = np.ceil(q / v).astype(np.int64)
    if constraints.recompute_num_layers is not None:
        if constraints.recompute_num_layers < model.num_layers:
            # an explicit count of layers per chunk: only chunks that have that many (a count
            # of the model's layers or more means every layer of each chunk)
            keep &= (rc != RECOMPUTE_FULL) | (chunk_layers >= constraints.recompute_num_layers)
        chunk_layers = np.minimum(chunk_layers, constraints.recompute_num_layers)
    recompute_layers = np.where(rc == RECOMPUTE_FULL, chunk_layers, 0)
    return LayoutArrays(
        dp[keep],
        tp[keep],
        pp[keep],
        cp[keep],
        ep[keep],
        etp[keep],
        mbs[keep],
        v[keep],
        zero[keep],
        rc[keep],
        recompute_layers[keep],
        order[keep],
    )


def _reason_bits(
    model: ModelSpec,
    cluster: ClusterSpec,
    training: TrainingSpec,
    constraints: Constraints,
    lay: LayoutArrays,
    pred: Mapping[str, FloatArray],
) -> IntArray:
    bits = np.zeros(len(lay), dtype=np.int64)

    def mark(name: str, mask: BoolArray | bool) -> None:
        nonlocal bits
        bits |= np.where(mask, 1 << REJECTION_REASONS.index(name), 0)

    mark("tp-crosses-node", (lay.tp > cluster.gpus_per_node) | (cluster.gpus_per_node % lay.tp != 0))
    # each rank takes whole query heads and whole KV heads, replicated past the KV head
    # count (ModelSpec.kv_shards): the KV heads must divide tp or be divided by it
    mark(
        "heads-not-divisible-by-tp",
        (model.num_attention_heads % lay.tp != 0) | ((model.kv_heads % lay.tp != 0) & (lay.tp % model.kv_heads != 0)),
    )
    _, first, last = stage_layer_split(model.num_layers, lay.pp)
    mark("more-stages-than-layers", (lay.pp > model.num_layers) | (first < 1) | (last < 1))
    if not constraints.allow_uneven_pp:
        mark("layers-not-divisible-by-pp", model.num_layers % lay.pp != 0)
    mark("batch-not-divisible", training.global_batch_sequences % (lay.dp * lay.mbs) != 0)
    mark("out-of-memory", pred["memory_bytes"] > cluster.memory_bytes)
    return bits


def _reason_text(
    name: str, model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, d: Mapping[str, Any], memory_bytes: float
) -> str:
    if name == "tp-crosses-node":
        if d["tp"] <= cluster.gpus_per_node:
            return (
                f"tp={d['tp']} does not divide the {cluster.gpus_per_node} GPUs of a node: some tensor-parallel "
                "groups would straddle two nodes and their per-layer all-reduces leave the NVLink domain"
            )
        return (
            f"tp={d['tp']} spans {d['tp'] / cluster.gpus_per_node:g} nodes of {cluster.gpus_per_node} GPUs: "
            "its per-layer all-reduces would leave the NVLink/NVSwitch domain"
        )
    if name == "heads-not-divisible-by-tp":
        if model.num_attention_heads % d["tp"]:
            return f"{model.num_attention_heads} attention heads are not divisible by tp={d['tp']}"
        return (
            f"{model.kv_heads} KV heads are neither divisible by tp={d['tp']} nor divide it "
            "(each rank needs whole KV heads, replicated when tp exceeds them)"
        )
    if name == "more-stages-than-layers":
        return f"pp={d['pp']} leaves a pipeline stage without layers ({model.num_layers} layers)"
    if name == "layers-not-divisible-by-pp":
        return f"{model.num_layers} layers are not divisible by pp={d['pp']} (uneven stages not allowed)"
    if name == "batch-not-divisible":
        return (
            f"global batch {training.global_batch_sequences} is not a multiple of dp x micro-batch = "
            f"{d['dp']} x {d['mbs']}"
        )
    return (
        f"out of memory: needs {memory_bytes / _GIB:.1f} GiB per GPU, {cluster.memory_bytes / _GIB:.1f} GiB available"
    )


def _prediction(
    i: int,
    lay: LayoutArrays,
    pred: Mapping[str, FloatArray],
    bits: IntArray,
    model: ModelSpec,
    cluster: ClusterSpec,
    training: TrainingSpec,
    tie: bool = False,
    notes: tuple[str, ...] = (),
) -> LayoutPrediction:
    d = {k: int(getattr(lay, k)[i]) for k in ("dp", "tp", "pp", "cp", "ep", "etp", "mbs", "v", "zero", "recompute")}
    order = RANK_ORDERS[int(lay.order[i])]
    reasons = tuple(
        _reason_text(name, model, cluster, training, d, float(pred["memory_bytes"][i]))
        for j, name in enumerate(REJECTION_REASONS)
        if bits[i] >> j & 1
    )
    extra = list(notes)
    if model.moe is not None:
        extra.append(MOE_HOST_TIME_NOTE)
    q, first, last = (int(pred[k][i]) for k in ("layers_per_stage", "first_stage_layers", "last_stage_layers"))
    if d["pp"] > 1 and (q != last or q != first):
        middle_short = int(middle_stages_short(model.num_layers, d["pp"], q, first, last))
        middle = ""
        if middle_short == 1:
            middle = f"; the stage after the first holds {q - 1}"
        elif middle_short > 1:
            middle = f"; the {middle_short} stages after the first hold {q - 1}"
        extra.append(
            f"uneven stages: at most {q} layers per stage, {first} on the first (which also holds "
            f"the embedding) and {last} on the last (which also holds the output layer){middle}"
        )
        if d["v"] > 1 and (first % d["v"] or last % d["v"] or middle_short):
            # per-stage layer counts that v does not divide: Megatron-Core states them with
            # --pipeline-model-parallel-layout, which may leave a chunk empty; the
            # --decoder-first/last-pipeline-num-layers flags need counts that v divides
            extra.append(
                f"{d['pp']} stages x {d['v']} model chunks for {model.num_layers} layers: some chunks "
                f"hold fewer layers{' (or none)' if d['pp'] * d['v'] > model.num_layers else ''}, which "
                "Megatron-Core states with --pipeline-model-parallel-layout"
            )
    if d["v"] > 1 and q % d["v"]:
        longest = -(-q // d["v"])
        extra.append(
            f"{d['v']} model chunks of a {q}-layer stage differ in size (at most {longest} layers, which pace "
            "the pipeline's fill and drain), which Megatron-Core states with --pipeline-model-parallel-layout"
        )
    memory = MemoryBreakdown(
        parameters_bytes=float(pred["parameters_bytes"][i]),
        gradients_bytes=float(pred["gradients_bytes"][i]),
        optimizer_state_bytes=float(pred["optimizer_state_bytes"][i]),
        activations_bytes=float(pred["activations_bytes"][i]),
        buffers_bytes=float(pred["buffers_bytes"][i]),
        total_bytes=float(pred["memory_bytes"][i]),
        capacity_bytes=float(cluster.memory_bytes),
        fullest_stage=int(pred["fullest_stage"][i]),
        activation_fragmentation=training.activation_fragmentation,
    )
    memory_note = _tight_memory_note(memory) if not reasons else None
    if memory_note:
        extra.append(memory_note)
    if zero_stage_held(d["zero"], d["pp"]) != d["zero"]:
        extra.append(
            f"ZeRO-{d['zero']} under a pipeline is deferred, as PyTorch FSDP runs it with "
            "torch.distributed.pipelining: weights and gradients stay whole across the micro-batches "
            "(ZeRO-1's memory) and are reduce-scattered once, after the last backward (DeepSpeed "
            "refuses ZeRO-2/3 with pipeline parallelism)"
        )
    micro_batches = int(pred["num_micro_batches"][i])
    if d["v"] > 1 and micro_batches % d["pp"]:
        group = int(
            microbatch_group_size(np.array([micro_batches]), np.array([d["pp"]]), training.flexible_microbatch_groups)[
                0
            ]
        )
        extra.append(
            f"{micro_batches} micro-batches are not a multiple of pp={d['pp']}: the interleaved schedule "
            f"takes them in groups of {group} (Megatron-Core --microbatch-group-size-per-virtual-"
            f"pipeline-stage {group}), {(d['v'] - 1) * (group - d['pp'])} more model chunks in flight"
        )
    chunk_layers = q // d["v"]
    recompute_layers = int(lay.recompute_layers[i])
    if d["recompute"] == RECOMPUTE_FULL and recompute_layers < chunk_layers:
        extra.append(
            f"partial recomputation: the first {recompute_layers} of the {chunk_layers} layers of each "
            f"model chunk are recomputed, the rest keep their activations (Megatron-LM "
            f"--recompute-method block --recompute-num-layers {recompute_layers})"
        )
    mfu = float(pred["mfu"][i])
    peak_bf16 = cluster.peak_flops_per_s.get("bf16") or max(cluster.peak_flops_per_s.values())
    if mfu > 1.0:
        extra.append(
            f"mfu {mfu:.2f} is above 1 because the SC21 count it follows takes attention over the whole "
            "s x s matrix, twice the causal work the kernels do, and attention dominates at this "
            f"sequence length; mfu_causal ({float(pred['mfu_causal'][i]):.2f}) counts what runs"
        )
    breakdown = {
        k: float(pred[k][i])
        for k in (
            "compute_s",
            "tp_comm_s",
            "cp_comm_s",
            "ep_comm_s",
            "pp_comm_s",
            "bubble_s",
            "dp_comm_exposed_s",
            "dp_comm_total_s",
            "optimizer_s",
        )
    }
    launch = launch_configs(
        model,
        training,
        LaunchLayout(
            dp=d["dp"],
            tp=d["tp"],
            pp=d["pp"],
            cp=d["cp"],
            ep=d["ep"],
            etp=d["etp"],
            virtual_stages=d["v"],
            micro_batch_size=d["mbs"],
            zero_stage=d["zero"],
            recompute=RECOMPUTE_MODES[d["recompute"]],
            recompute_num_layers=recompute_layers,
            rank_order=order,
            layers_per_stage=q,
            first_stage_layers=first,
            last_stage_layers=last,
        ),
    )
    step_time_s = float(pred["step_time_s"][i])
    energy_j = tokens_per_joule = None
    if cluster.board_power_w is not None and cluster.idle_power_w is not None:
        num_gpus = d["dp"] * d["tp"] * d["pp"] * d["cp"]
        energy_j = float(
            step_energy_j(num_gpus, step_time_s, float(pred["busy_s"][i]), cluster.board_power_w, cluster.idle_power_w)
        )
        tokens_per_joule = float(pred["tokens_per_s"][i]) * step_time_s / energy_j
    return LayoutPrediction(
        dp=d["dp"],
        tp=d["tp"],
        pp=d["pp"],
        cp=d["cp"],
        ep=d["ep"],
        etp=d["etp"],
        virtual_stages=d["v"],
        micro_batch_size=d["mbs"],
        num_micro_batches=int(pred["num_micro_batches"][i]),
        zero_stage=d["zero"],
        recompute=RECOMPUTE_MODES[d["recompute"]],
        recompute_num_layers=recompute_layers,
        rank_order=order,
        sequence_parallel=training.sequence_parallel and d["tp"] > 1,
        step_time_s=step_time_s,
        tokens_per_s=float(pred["tokens_per_s"][i]),
        mfu=mfu,
        mfu_causal=float(pred["mfu_causal"][i]),
        hfu=float(pred["hfu"][i]),
        mfu_at_precision_peak=mfu * peak_bf16 / cluster.peak_flops_per_s.get(training.precision, peak_bf16),
        bubble_fraction=float(pred["bubble_fraction"][i]),
        time_breakdown_s=breakdown,
        memory=memory,
        reasons=reasons,
        notes=tuple(extra),
        tie_with_best=tie,
        launch=launch,
        energy_per_step_j=energy_j,
        tokens_per_joule=tokens_per_joule,
    )


# bench/parallel3d.py: with the host's per-expert work charged (kernels.HOST_S_PER_EXPERT_OP, fitted
# on Megatron-Bridge's three H100 MoE benchmarks), those rows are predicted within 6% and four of
# the five Megatron-MoE-ModelZoo Qwen3-235B layouts within 14%; the fifth, Megatron-FSDP, ran 1.5x
# faster than predicted
MOE_HOST_TIME_NOTE = (
    "MoE layers count the host's work per local expert (Megatron-Core's alltoall dispatcher syncs each layer, "
    "then each expert's GEMMs and FP8 casts are prepared and issued one by one: 45 us per operation, fitted on "
    "Megatron-Bridge's H100 MoE benchmarks); a stack that captures MoE layers in CUDA graphs or fuses the "
    "grouped GEMM does not pay it. Published H100 MoE runs of one model in five layouts were predicted within "
    "14% in four, and 1.5x too slow for Megatron-FSDP: read MoE step times as uncertain by 15% or more"
)


def _tight_memory_note(memory: MemoryBreakdown) -> str | None:
    """Say so when a layout fits only if the allocator wastes little.

    Activations are counted with the request's caching-allocator fragmentation (10%, the
    low end of what GMLake, Guo et al., ASPLOS 2024, measured in LLM training, unless it
    states its own); at the 30% high end such a layout would not fit. The prediction
    stands; the note tells the user the margin is inside the model's uncertainty.
    """
    fills_at = memory.fragmentation_that_fills
    if fills_at is None or fills_at >= ACTIVATION_FRAGMENTATION_HIGH:
        return None
    total_bytes, capacity_bytes = memory.total_bytes, memory.capacity_bytes
    worst_bytes = bytes_at_high_fragmentation(total_bytes, memory.activations_bytes, memory.activation_fragmentation)
    return (
        f"tight memory: {total_bytes / _GIB:.1f} of {capacity_bytes / _GIB:.1f} GiB fits with "
        f"{memory.activation_fragmentation:.0%} allocator fragmentation of activations but not with "
        f"{ACTIVATION_FRAGMENTATION_HIGH:.0%} ({worst_bytes / _GIB:.1f} GiB); measure peak memory before a long run"
    )


def _tight_memory(pred: Mapping[str, FloatArray], index: IntArray, capacity_bytes: float, counted: float) -> BoolArray:
    """True where a layout fits only with less allocator waste than ``ACTIVATION_FRAGMENTATION_HIGH``
    (its prediction counted ``counted``)."""
    return (
        bytes_at_high_fragmentation(pred["memory_bytes"][index], pred["activations_bytes"][index], counted)
        > capacity_bytes
    )


def _best_per_split(index: IntArray, lay: LayoutArrays, step: FloatArray) -> IntArray:
    """Of the candidates at ``index``, the fastest one per (tp, pp) pair, fastest first.

    The tensor- and pipeline-parallel sizes are the choice a user makes first (they fix
    the model's split; dp, cp and ep then share out the rest of the GPUs), so each ranked
    candidate is a different split, with the context- and expert-parallel sizes that serve
    it best, rather than near-copies of one split that differ in cp by a fraction of a
    percent. ``constraints`` (fixed cp or ep) or ``evaluate`` compare those.
    """
    if index.size == 0:
        return index
    # equal predictions (context parallelism can mirror data parallelism exactly): simpler first
    order = index[np.lexsort((lay.ep[index], lay.cp[index], step[index], lay.pp[index], lay.tp[index]))]
    key = np.stack([lay.tp[order], lay.pp[order]], axis=1)
    first = np.ones(order.size, dtype=bool)
    first[1:] = np.any(key[1:] != key[:-1], axis=1)
    best = order[first]
    return best[np.lexsort((lay.ep[best], lay.cp[best], step[best]))]


# --------------------------------------------------------------------- public API


def _check_sizes(sizes: Mapping[str, int | None], model: ModelSpec, num_gpus: int, where: str) -> None:
    """Fixed group sizes (of ``constraints`` or of one evaluated layout) that no layout could have."""
    for name in ("tp", "pp", "cp"):
        value = sizes.get(name)
        if value is not None and num_gpus % value:
            raise InvalidInput(
                f"{where}.{name}={value} does not divide the {num_gpus} GPUs of the cluster",
                field=f"{where}.{name}",
                code="does-not-divide",
            )
    ep = sizes.get("ep")
    if ep is not None and model.moe is None and ep != 1:
        raise InvalidInput(f"{where}.ep > 1 needs a model with an MoE block", field=f"{where}.ep", code="no-experts")
    if ep is not None and model.moe is not None and model.moe.num_experts % ep:
        raise InvalidInput(
            f"{where}.ep={ep} does not divide {model.moe.num_experts} experts",
            field=f"{where}.ep",
            code="does-not-divide",
        )


def _checked(
    model_spec: ModelSpec, cluster_spec: ClusterSpec, training_spec: TrainingSpec, constraints: Constraints | None
) -> tuple[ModelSpec, ClusterSpec, TrainingSpec, Constraints]:
    """What ties the inputs together: the GPUs run the precision and FlashAttention asked for, and the
    constraints agree with the model, the software and the cluster."""
    flash_attention_speed(cluster_spec, training_spec)  # a FlashAttention generation the GPUs run
    check_precision_runs(cluster_spec, training_spec)
    cons = _consistent(Constraints() if constraints is None else constraints, model_spec)
    cons = within_software(cons, training_spec, model_spec)
    if not training_spec.selective_recompute and cons.recompute == ("selective",):
        raise InvalidInput(
            "constraints.recompute allows only selective recomputation, which this software "
            "(training.selective_recompute false, as in megatron-lm-2021) does not have",
            field="constraints.recompute",
            code="not-in-this-software",
        )
    _check_sizes(
        {"tp": cons.tp, "pp": cons.pp, "cp": cons.cp, "ep": cons.ep}, model_spec, cluster_spec.num_gpus, "constraints"
    )
    return model_spec, cluster_spec, training_spec, cons


def _consistent(cons: Constraints, model: ModelSpec) -> Constraints:
    """Constraints that do not contradict each other or the model; ``recompute_num_layers``
    alone implies full recomputation (Megatron-LM's ``--recompute-num-layers`` goes with
    ``--recompute-granularity full``)."""
    if cons.pp is not None and cons.max_pp is not None and cons.pp > cons.max_pp:
        raise InvalidInput(
            f"constraints.pp={cons.pp} is more than constraints.max_pp={cons.max_pp}",
            field="constraints.pp",
            code="contradiction",
        )
    rnl = cons.recompute_num_layers
    if rnl is None:
        return cons
    if rnl > model.num_layers:
        raise InvalidInput(
            f"constraints.recompute_num_layers={rnl} is more than the model's {model.num_layers} layers",
            field="constraints.recompute_num_layers",
            code="out-of-range",
        )
    if "full" not in cons.recompute:
        raise InvalidInput(
            f"constraints.recompute_num_layers={rnl} recomputes layers fully, which "
            f"constraints.recompute {list(cons.recompute)} leaves out",
            field="constraints.recompute_num_layers",
            code="contradiction",
        )
    return replace(cons, recompute=("full",))


def _predict(
    model_spec: ModelSpec, cluster_spec: ClusterSpec, training_spec: TrainingSpec, lay: LayoutArrays
) -> dict[str, FloatArray]:
    if len(lay) <= _CHUNK:
        return predict_layouts(model_spec, cluster_spec, training_spec, lay)
    # bounded working memory: ~100 float64 temporaries per candidate
    parts = [
        predict_layouts(model_spec, cluster_spec, training_spec, lay.take(slice(i, i + _CHUNK)))
        for i in range(0, len(lay), _CHUNK)
    ]
    return {key: np.concatenate([part[key] for part in parts]) for key in parts[0]}


def _search(
    model_spec: ModelSpec, cluster_spec: ClusterSpec, training_spec: TrainingSpec, cons: Constraints
) -> tuple[LayoutArrays, dict[str, FloatArray], IntArray]:
    """Every layout, predicted, with its rejection bits.

    Interleaving depths come in two rounds. Shallow ones (1 and the divisors of a stage's
    layers up to ``_MAX_UNEVEN_VIRTUAL_STAGES``) are tried everywhere; deeper or uneven ones
    only for the (mesh, micro-batch) pairs that could still win: a deeper schedule only
    shrinks the bubble and the exposed data-parallel reduction (its exchanges and memory
    grow), so a pair whose fitting shallow variants, less those two, are already slower
    than the best layout found cannot be rescued by depth.
    """
    if cons.virtual_stages is not None:
        return _search_round(model_spec, cluster_spec, training_spec, cons, "all", None)
    lay, pred, bits = _search_round(model_spec, cluster_spec, training_spec, cons, "shallow", None)
    valid = np.flatnonzero(bits == 0)
    if len(lay) == 0 or valid.size == 0:
        deepen: set[tuple[int, ...]] = set()
    else:
        step = pred["step_time_s"]
        best = float(step[valid].min()) * (1.0 + cons.tie_tolerance)
        floor = step - pred["bubble_s"] - pred["dp_comm_exposed_s"]
        hopeful = valid[floor[valid] < best]
        keys = np.stack(
            [getattr(lay, name)[hopeful] for name in ("dp", "tp", "pp", "cp", "ep", "etp", "order", "mbs")], axis=1
        )
        deepen = {tuple(row) for row in np.unique(keys, axis=0).tolist()}
    if not deepen:
        return lay, pred, bits
    lay2, pred2, bits2 = _search_round(model_spec, cluster_spec, training_spec, cons, "deep", deepen)
    if len(lay2) == 0:
        return lay, pred, bits
    joined = LayoutArrays(*(np.concatenate([getattr(lay, f.name), getattr(lay2, f.name)]) for f in fields(lay)))
    return joined, {key: np.concatenate([pred[key], pred2[key]]) for key in pred}, np.concatenate([bits, bits2])


def _search_round(
    model_spec: ModelSpec,
    cluster_spec: ClusterSpec,
    training_spec: TrainingSpec,
    cons: Constraints,
    depths: str,
    deepen: set[tuple[int, ...]] | None,
) -> tuple[LayoutArrays, dict[str, FloatArray], IntArray]:
    lay = enumerate_layouts(model_spec, cluster_spec, training_spec, cons, depths, deepen)
    if len(lay) == 0:
        return lay, {}, np.zeros(0, dtype=np.int64)
    pred = _predict(model_spec, cluster_spec, training_spec, lay)
    if training_spec.partial_recompute and cons.recompute_num_layers is None:
        lay, pred = _fewest_recomputed_layers(model_spec, cluster_spec, training_spec, lay, pred)
    bits = _reason_bits(model_spec, cluster_spec, training_spec, cons, lay, pred)
    return lay, pred, bits


def _fewest_recomputed_layers(
    model_spec: ModelSpec,
    cluster_spec: ClusterSpec,
    training_spec: TrainingSpec,
    lay: LayoutArrays,
    pred: dict[str, FloatArray],
) -> tuple[LayoutArrays, dict[str, FloatArray]]:
    """Cut full recomputation down to the fewest layers per model chunk that fit with headroom.

    Recomputing a layer trades its kept activations for a repeated forward pass;
    a layout that fits with k of its chunk's c layers recomputed runs faster than
    with all c. Footprints are affine in k per pipeline stage, so the worst stage's
    (a maximum of affine functions, hence convex) lies below the line between k = 0
    and k = c: the k read off that line fits. "Headroom" means fitting at the high
    end of allocator fragmentation (``ACTIVATION_FRAGMENTATION_HIGH``), as a
    practitioner leaves room before a long run; where even all c layers cannot give
    that, the fewest that fit at the low end, and where nothing fits, all c.
    """
    full = np.flatnonzero((lay.recompute == RECOMPUTE_FULL) & (lay.recompute_layers > 1))
    if full.size == 0:
        return lay, pred
    sub = lay.take(full)
    chunk_layers = sub.recompute_layers.astype(float)
    at_none = _predict(
        model_spec, cluster_spec, training_spec, replace(sub, recompute_layers=np.zeros_like(sub.recompute_layers))
    )
    capacity = float(cluster_spec.memory_bytes)

    def least_fraction(at_zero: FloatArray | float, at_all: FloatArray | float) -> FloatArray:
        """Smallest share of layers at which the line from ``at_zero`` to ``at_all`` is within capacity."""
        drop = np.maximum(at_zero - at_all, 1e-9)
        return np.where(at_all <= capacity, np.clip((at_zero - capacity) / drop, 0.0, 1.0), np.inf)

    counted = training_spec.activation_fragmentation
    roomy = least_fraction(
        bytes_at_high_fragmentation(at_none["memory_bytes"], at_none["activations_bytes"], counted),
        bytes_at_high_fragmentation(pred["memory_bytes"][full], pred["activations_bytes"][full], counted),
    )
    tight = least_fraction(at_none["memory_bytes"], pred["memory_bytes"][full])
    share = np.where(np.isfinite(roomy), roomy, np.where(np.isfinite(tight), tight, 1.0))
    layers = np.clip(np.ceil(share * chunk_layers - 1e-9), 1.0, chunk_layers).astype(np.int64)
    changed = layers < sub.recompute_layers
    if not np.any(changed):
        return lay, pred
    where = full[changed]
    recompute_layers = lay.recompute_layers.copy()
    recompute_layers[where] = layers[changed]
    lay = replace(lay, recompute_layers=recompute_layers)
    again = _predict(model_spec, cluster_spec, training_spec, lay.take(where))
    for key, val in again.items():
        pred[key][where] = val
    return lay, pred


def plan_parallel_layout(
    model: ModelSpec,
    cluster: ClusterSpec,
    training: TrainingSpec,
    constraints: Constraints | None = None,
    *,
    top_k: int = 10,
    with_rank_map: bool = True,
) -> ParallelPlan:
    """Search dp x tp x pp x cp x ep layouts and rank them by predicted step time.

    Parameters
    ----------
    model, cluster, training, constraints
        The typed inputs (:mod:`partitioners.parallel3d.specs`); from JSON-shaped
        mappings, :func:`~partitioners.parallel3d.spec_fields.spec_from_mapping` builds them.
    top_k : int
        Number of ranked candidates returned, each the fastest variant
        (cp, ep, micro-batch, v, ZeRO, recomputation) of a distinct (tp, pp) pair.
    with_rank_map : bool
        Build the rank -> GPU map of the top candidate.

    Returns
    -------
    ParallelPlan
        Candidates fastest first; layouts within ``constraints.tie_tolerance``
        (3% by default) of the best are flagged ``tie_with_best`` and, among those, ones
        that would still fit at the high end of allocator fragmentation come first (a
        tight layout may not run at all: SC21's Figure 17 layout, predicted to fit at the
        low end, ran out of memory), each group fastest first. Inside the tolerance the
        prediction still orders layouts better than a fixed preference for fewer
        pipeline stages did (planned with the defaults, BLOOM-176B, GPT-NeoX-20B and
        MT-NLG 530B get their published split first by speed, not by depth). ``rejected``
        lists faster-looking layouts that cannot run, with the reason. ``feasible`` is
        False when nothing fits; ``notes`` then says what would have to change.

    Raises
    ------
    InvalidInput
        Malformed input (zero GPUs, heads not dividing the hidden size, a fixed
        tp that does not divide the GPU count, ...).
    """
    if not 1 <= top_k <= MAX_TOP_K:
        raise InvalidInput(f"top_k must be in 1..{MAX_TOP_K}", field="top_k", code="out-of-range")
    model_spec, cluster_spec, training_spec, cons = _checked(model, cluster, training, constraints)
    lay, pred, bits = _search(model_spec, cluster_spec, training_spec, cons)
    counts = parameter_counts(model_spec)
    mflops = model_flops_per_step(model_spec, training_spec.global_batch_sequences)
    rejection_counts = {name: int(np.count_nonzero(bits >> j & 1)) for j, name in enumerate(REJECTION_REASONS)}
    if len(lay) == 0:
        note = _why_no_layout(model_spec, cluster_spec, training_spec, cons)
        return ParallelPlan(cluster_spec.num_gpus, (), (), rejection_counts, 0, counts.total, mflops, None, (note,))
    step = pred["step_time_s"]
    valid = np.flatnonzero(bits == 0)
    ranked = _best_per_split(valid, lay, step)
    notes: list[str] = []
    candidates: list[LayoutPrediction] = []
    if ranked.size:
        best_time = step[ranked[0]]
        in_band = step[ranked] <= best_time * (1.0 + cons.tie_tolerance)
        band = ranked[in_band]
        tight = _tight_memory(pred, band, float(cluster_spec.memory_bytes), training_spec.activation_fragmentation)
        band = band[np.lexsort((step[band], tight))]
        ordered = np.concatenate([band, ranked[~in_band]])[:top_k]
        for i in ordered:
            tie = bool(step[i] <= best_time * (1.0 + cons.tie_tolerance))
            tie_note: tuple[str, ...] = ()
            if tie and band.size > 1:
                tie_note = (
                    f"within {cons.tie_tolerance:.1%} of the fastest prediction "
                    f"({best_time:.3f} s): a tie at the model's accuracy; ties rank layouts with room for "
                    "allocator waste first, fastest first within each group",
                )
            candidates.append(
                _prediction(int(i), lay, pred, bits, model_spec, cluster_spec, training_spec, tie, tie_note)
            )
        threshold = step[ordered[0]]
    else:
        threshold = np.inf
        notes.extend(_why_nothing_fits(model_spec, cluster_spec, training_spec, lay, pred, bits, rejection_counts))
    rejected_idx = np.flatnonzero((bits != 0) & (step < threshold))
    rejected = tuple(
        _prediction(int(i), lay, pred, bits, model_spec, cluster_spec, training_spec)
        for i in _best_per_split(rejected_idx, lay, step)[:5]
    )
    if candidates and model_spec.moe is not None:
        candidates[0] = _with_moe_alternatives(model_spec, cluster_spec, training_spec, cons, candidates[0])
    top_map = None
    if with_rank_map and candidates:
        top_map = rank_map(cluster_spec, candidates[0])
    return ParallelPlan(
        cluster_spec.num_gpus,
        tuple(candidates),
        rejected,
        rejection_counts,
        len(lay),
        counts.total,
        mflops,
        top_map,
        tuple(notes),
    )


# The MoE options a stack can switch, as Megatron-Core names them: the dispatcher (DeepEP's
# node-deduplicated flex dispatcher, or the alltoall one) and the expert all-to-all paired
# with another micro-batch's computation (DualPipe-style 1F1B overlap).
_MOE_ALTERNATIVES: tuple[tuple[str, Any, str], ...] = (
    ("expert_dispatch", "node-deduplicated", "--moe-token-dispatcher-type flex --moe-enable-deepep"),
    ("expert_dispatch", "all-to-all", "--moe-token-dispatcher-type alltoall"),
    ("overlap_ep_comm", True, "--overlap-moe-expert-parallel-comm"),
)


def _with_moe_alternatives(
    model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, cons: Constraints, best: LayoutPrediction
) -> LayoutPrediction:
    """The best MoE layout with notes on what each MoE option the run did not take would change.

    The defaults follow current MoE stacks (node-deduplicated dispatch, no all-to-all
    overlap); the planner predicts the same layout with each alternative, so the answer
    says what it assumed and what switching would gain.
    """
    if best.ep <= 1:
        return best
    layout = LayoutSpec(
        **{name: getattr(best, name) for name in ("dp", "tp", "pp", "cp", "ep", "etp", "virtual_stages")},
        micro_batch_size=best.micro_batch_size,
        zero_stage=best.zero_stage,
        recompute=best.recompute,
        recompute_num_layers=best.recompute_num_layers or None,
        rank_order=best.rank_order,
    )
    notes = []
    for name, value, flags in _MOE_ALTERNATIVES:
        if getattr(training, name) == value:
            continue
        try:
            (other,) = evaluate_layouts(model, cluster, replace(training, **{name: value}), [layout], cons)
        except InvalidInput:
            continue
        change = other.step_time_s / best.step_time_s - 1.0
        notes.append(
            f"assumed {name}={getattr(training, name)!r}; with {flags} this layout is "
            f"predicted {abs(change):.1%} {'faster' if change < 0 else 'slower'} ({other.step_time_s:.3f} s)"
        )
    return replace(best, notes=best.notes + tuple(notes)) if notes else best


# constraints that can leave no layout at all, in the order a note blames them
_EMPTYING_CONSTRAINTS = (
    "virtual_stages",
    "recompute_num_layers",
    "micro_batch_size",
    "etp",
    "ep",
    "cp",
    "pp",
    "max_pp",
    "tp",
)


def _why_no_layout(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, cons: Constraints) -> str:
    """Which fixed constraint leaves no layout to search: the first whose removal leaves some."""
    for name in _EMPTYING_CONSTRAINTS:
        value = getattr(cons, name)
        if value is None:
            continue
        unset: dict[str, Any] = {name: None}
        relaxed = replace(cons, **unset)
        if name == "recompute_num_layers" and cons.recompute == ("full",):
            relaxed = replace(relaxed, recompute=RECOMPUTE_MODES)
        if len(enumerate_layouts(model, cluster, training, relaxed)):
            why = {
                "virtual_stages": f"interleaving {value} model chunks per stage needs a pipeline whose stages hold "
                f"a multiple of {value} of the {model.num_layers} layers and micro-batches in "
                "whole rounds of pp",
                "recompute_num_layers": f"no pipeline split gives model chunks of {value} layers or more",
            }.get(name, f"no layout of {cluster.num_gpus} GPUs has it with the other constraints")
            return f"constraints.{name}={value} leaves no layout to search: {why}"
    return (
        f"no layout of {cluster.num_gpus} GPUs satisfies the constraints "
        f"(fixed sizes must multiply to a divisor of the GPU count)"
    )


def _why_nothing_fits(
    model: ModelSpec,
    cluster: ClusterSpec,
    training: TrainingSpec,
    lay: LayoutArrays,
    pred: Mapping[str, FloatArray],
    bits: IntArray,
    counts: Mapping[str, int],
) -> list[str]:
    """Sentences saying why no layout can run and what would have to change."""
    notes = [
        (
            "no layout can run: "
            + ", ".join(f"{n} {name}" for name, n in counts.items() if n)
            + f" (of {len(lay)} layouts searched)"
        )
    ]
    oom_bit = 1 << REJECTION_REASONS.index("out-of-memory")
    in_memory_but_blocked = (bits & oom_bit) == 0
    for j, name in enumerate(REJECTION_REASONS[:-1]):
        blocked = in_memory_but_blocked & ((bits >> j & 1) == 1)
        if not np.any(blocked):
            continue
        i = int(np.flatnonzero(blocked)[np.argmin(pred["step_time_s"][blocked])])
        d = {k: int(getattr(lay, k)[i]) for k in ("dp", "tp", "pp", "cp", "ep", "etp", "mbs", "v", "zero", "recompute")}
        notes.append(
            f"tp={d['tp']} pp={d['pp']} cp={d['cp']} ep={d['ep']} would fit in memory, but "
            + _reason_text(name, model, cluster, training, d, float(pred["memory_bytes"][i]))
        )
    structural_ok = (bits & ~oom_bit) == 0
    if np.any(structural_ok):
        i = int(np.flatnonzero(structural_ok)[np.argmin(pred["memory_bytes"][structural_ok])])
        params = parameter_counts(model).total
        notes.append(
            f"the smallest footprint of a well-formed layout is {pred['memory_bytes'][i] / _GIB:.1f} GiB per GPU "
            f"(tp={lay.tp[i]}, pp={lay.pp[i]}, ZeRO-{lay.zero[i]}, {RECOMPUTE_MODES[lay.recompute[i]]} "
            f"recomputation) against {cluster.memory_bytes / _GIB:.1f} GiB; the {params / 1e9:.1f}B parameters "
            f"alone need {16 * params / 1e12:.2f} TB of weights, gradients and Adam state, the "
            f"{cluster.num_gpus} GPUs hold {cluster.num_gpus * cluster.memory_bytes / 1e12:.2f} TB"
        )
    if counts.get("batch-not-divisible"):
        notes.append(
            f"the global batch of {training.global_batch_sequences} sequences must be a multiple of "
            "dp x micro-batch; a batch or GPU count with common factors opens more layouts"
        )
    if counts.get("layers-not-divisible-by-pp") or counts.get("more-stages-than-layers"):
        notes.append(f"{model.num_layers} layers: allow uneven pipeline stages or choose a pp that divides them")
    return notes


def evaluate_layouts(
    model: ModelSpec,
    cluster: ClusterSpec,
    training: TrainingSpec,
    layouts: Sequence[LayoutSpec],
    constraints: Constraints | None = None,
) -> list[LayoutPrediction]:
    """Predict given layouts instead of searching (the request's ``"evaluate"``).

    Each layout may fix any of ``dp``, ``tp``, ``pp``, ``cp``, ``ep``,
    ``virtual_stages``, ``micro_batch_size``, ``zero_stage``, ``recompute``,
    ``recompute_num_layers`` (which implies full recomputation; ``recompute: "full"``
    without it means every layer, as published runs report full recomputation); fields
    left out are chosen as the search would (the prediction says what it chose:
    an unstated interleaving depth is searched like recomputation or micro-batch
    size, so ``virtual_stages: 1`` asks for plain 1F1B). A layout that cannot run
    is still predicted, with ``reasons`` saying why. Errors name the layout as the
    request's ``evaluate[k]``.
    """
    model_spec, cluster_spec, run_training, base = _checked(model, cluster, training, constraints)
    user_uneven = (Constraints() if constraints is None else constraints).allow_uneven_pp
    results = []
    for k, spec in enumerate(layouts):
        where = f"evaluate[{k}]"
        if not isinstance(spec, LayoutSpec):
            raise InvalidInput(f"{where} must be a LayoutSpec", field=where, code="not-an-object")
        layout = spec.given()
        # sequence parallelism is the layout's where it states it, else the run's
        sequence_parallel = layout.pop("sequence_parallel", run_training.sequence_parallel)
        training_spec = replace(run_training, sequence_parallel=bool(sequence_parallel))
        _check_sizes(layout, model_spec, cluster_spec.num_gpus, where)
        if layout.get("recompute") == "selective" and not training_spec.selective_recompute:
            raise InvalidInput(
                f"{where}.recompute: selective recomputation is not in this software "
                "(training.selective_recompute false, as in megatron-lm-2021)",
                field=f"{where}.recompute",
                code="not-in-this-software",
            )
        if layout.get("recompute_num_layers", 0) > model_spec.num_layers:
            raise InvalidInput(
                f"{where}.recompute_num_layers={layout['recompute_num_layers']} is more than the "
                f"model's {model_spec.num_layers} layers",
                field=f"{where}.recompute_num_layers",
                code="out-of-range",
            )
        dp = layout.get("dp")
        fixed: dict[str, Any] = {
            "tp": layout.get("tp", base.tp),
            "pp": layout.get("pp", base.pp),
            "cp": layout.get("cp", base.cp),
            "ep": layout.get("ep", base.ep),
            "etp": layout.get("etp", base.etp),
            "micro_batch_size": layout.get("micro_batch_size", base.micro_batch_size),
            "virtual_stages": layout.get("virtual_stages", base.virtual_stages),
            "zero_stages": (layout["zero_stage"],) if "zero_stage" in layout else base.zero_stages,
            "recompute": (layout["recompute"],) if "recompute" in layout else base.recompute,
            "recompute_num_layers": layout.get("recompute_num_layers", base.recompute_num_layers) or None,
            # a pipeline size the layout states is predicted as stated, even split or not
            "allow_uneven_pp": base.allow_uneven_pp if "pp" not in layout else user_uneven,
            "max_pp": None,
            "rank_order": layout.get("rank_order", base.rank_order),
        }
        if layout.get("recompute_num_layers") == 0 and "recompute" not in layout:
            # no layer fully recomputed: what else the constraints allow
            fixed["recompute"] = tuple(mode for mode in base.recompute if mode != "full")
            if not fixed["recompute"]:
                raise InvalidInput(
                    f"{where}: recompute_num_layers 0 leaves no recomputation mode that constraints.recompute allows",
                    field=f"{where}.recompute_num_layers",
                    code="contradiction",
                )
        elif layout.get("recompute_num_layers") and "recompute" not in layout:
            fixed["recompute"] = ("full",)
        elif layout.get("recompute") == "full" and "recompute_num_layers" not in layout:
            # a layout stated as full recomputation (as the papers report theirs) recomputes every layer
            fixed["recompute_num_layers"] = model_spec.num_layers
        # what the layout leaves out is chosen within the software's search space (base is
        # narrowed to it); what it states is predicted as stated, with a note where the
        # software could not run it
        cons = Constraints(**{key: val for key, val in fixed.items() if val is not None})
        outside = _outside_software(layout, training_spec, model_spec)
        lay, pred, bits = _search(model_spec, cluster_spec, training_spec, cons)
        if dp is not None and len(lay):
            keep = lay.dp == int(dp)
            lay, pred, bits = lay.take(keep), {key: val[keep] for key, val in pred.items()}, bits[keep]
        if len(lay) == 0:
            raise _impossible_layout(layout, model_spec, cluster_spec.num_gpus, training_spec, where)
        step = pred["step_time_s"]
        valid = np.flatnonzero(bits == 0)
        pool = valid if valid.size else np.arange(len(lay))
        if not valid.size:
            # the least-broken variant: fewest reasons, then fastest
            n_reasons = np.array([bin(int(b)).count("1") for b in bits[pool]])
            pool = pool[n_reasons == n_reasons.min()]
        i = int(pool[np.argmin(step[pool])])
        prediction = _prediction(i, lay, pred, bits, model_spec, cluster_spec, training_spec)
        results.append(replace(prediction, notes=prediction.notes + outside) if outside else prediction)
    return results


def _impossible_layout(
    layout: Mapping[str, Any], model: ModelSpec, num_gpus: int, training: TrainingSpec, where: str
) -> InvalidInput:
    """The error for an evaluated layout no variant of which can be built, naming the first cause."""
    tp, pp, cp, ep = (int(layout.get(key, 1)) for key in ("tp", "pp", "cp", "ep"))
    etp = layout.get("etp")
    if etp is not None and "tp" in layout and etp not in ((1, tp) if model.moe is not None else (tp,)):
        allowed = f"1 or tp={tp}" if model.moe is not None else f"tp={tp} (a model without experts)"
        return InvalidInput(
            f"layout {dict(layout)}: etp (the expert tensor-parallel size) must be {allowed}",
            field=f"{where}.etp",
            code="out-of-range",
        )
    if etp == 1 and tp > 1 and not training.sequence_parallel:
        return InvalidInput(
            f"layout {dict(layout)}: folded experts (etp 1 under tp {tp}) dispatch from the "
            "sequence-parallel shards; turn training.sequence_parallel on",
            field=f"{where}.etp",
            code="contradiction",
        )
    fixed_mesh = all(key in layout for key in ("tp", "pp")) and ("cp" in layout or not training.flash_attention)
    if fixed_mesh and num_gpus % (tp * pp * cp) == 0:
        dp = layout.get("dp", num_gpus // (tp * pp * cp))
        folds = (etp,) if etp is not None else _expert_tensor_sizes(model, training, tp)
        if dp * tp * pp * cp == num_gpus and not any(expert_groups_fit(dp, tp, cp, ep, e) for e in folds):
            return InvalidInput(
                f"layout {dict(layout)}: {ep} expert groups cannot be cut from dp={dp} x tp={tp} "
                f"x cp={cp}: ep must divide dp (experts split over the tensor ranks, etp = tp) "
                "or, folded (etp = 1), divide tp x cp or be a multiple of it that divides "
                "tp x cp x dp in whole blocks",
                field=f"{where}.ep",
                code="does-not-divide",
            )
    rnl = layout.get("recompute_num_layers") or 0
    if (
        0 < rnl < model.num_layers
        and "pp" in layout
        and -(-model.num_layers // pp) // int(layout.get("virtual_stages", 1)) < rnl
    ):
        chunk = -(-model.num_layers // pp) // int(layout.get("virtual_stages", 1))
        return InvalidInput(
            f"layout {dict(layout)}: recompute_num_layers={rnl} counts layers of one model chunk, "
            f"and a chunk of pp={pp} x virtual_stages={layout.get('virtual_stages', 1)} holds "
            f"{chunk} of the {model.num_layers} layers",
            field=f"{where}.recompute_num_layers",
            code="out-of-range",
        )
    schedule = effective_terms(training).schedule
    if schedule.needs_even_pipeline and pp > 1 and pp % 2:
        return InvalidInput(
            f"layout {dict(layout)}: the {schedule.name} schedule runs micro-batches from both ends of "
            "the pipeline and needs an even pp",
            field=f"{where}.pp",
            code="schedule-not-possible",
        )
    if layout.get("virtual_stages", 1) > 1 and schedule.fixed_chunks:
        return InvalidInput(
            f"layout {dict(layout)}: the {schedule.name} schedule fixes the model chunks of a rank; "
            "virtual_stages belongs to the 1f1b schedule",
            field=f"{where}.virtual_stages",
            code="schedule-not-possible",
        )
    if layout.get("virtual_stages", 1) > 1:
        fewest_stages = 2 if training.overlap_p2p_comm else 3
        return InvalidInput(
            f"layout {dict(layout)}: an interleaved schedule (virtual_stages > 1) needs "
            f"pp >= {fewest_stages}, virtual_stages dividing the layers per stage and "
            "micro-batches that fill groups of pp (a multiple of pp; with "
            "flexible_microbatch_groups, larger groups whose last is empty or at least pp) "
            "(Megatron-LM's interleaved 1F1B; pp 2 only with overlap_p2p_comm)",
            field=f"{where}.virtual_stages",
            code="interleaving-not-possible",
        )
    return InvalidInput(
        f"layout {dict(layout)} does not multiply out to the {num_gpus} GPUs "
        "(dp x tp x pp x cp must equal the GPU count, ep must divide the experts and fit the "
        "ranks)",
        field=where,
        code="layout-does-not-match-cluster",
    )


def rank_map(cluster: ClusterSpec, layout: LayoutPrediction | LayoutSpec) -> RankMap:
    """Map every rank to mesh coordinates and a GPU in the layout's rank order (innermost first).

    ``tp-cp-ep-dp-pp`` (Megatron-Core's default ``--order``, torchtitan's mesh; a layout that
    names none): a pipeline stage is ``tp x cp x dp`` consecutive ranks, data-parallel
    peers ``tp x cp`` apart (on one node when the tensor group is small), stages a block
    apart. ``tp-cp-ep-pp-dp`` (``--use-tp-pp-dp-mapping``), as follows.

    Rank ``r`` runs on GPU ``r`` (node-major numbering). With ``tp`` innermost a
    tensor-parallel group is ``tp`` consecutive GPUs, inside one node whenever
    ``tp`` divides ``gpus_per_node``; pipeline neighbours are ``tp*cp*ep`` GPUs
    apart (the same or the next node); data-parallel peers are
    ``tp*cp*ep*pp`` apart, i.e. on different nodes once a model replica fills a node.

    Folded experts (``etp = 1`` with ``tp > 1``) take ``ep`` consecutive ranks of a
    stage instead: the order is ``tp-cp-dp_inner-pp-dp_outer`` with ``dp_inner = ep /
    (tp cp)`` replicas (1 when ``ep`` divides ``tp cp``) next to each other, so an expert
    group is the NVLink neighbourhood of its tensor group, and its ``ep`` coordinate is a
    rank's place in it.
    """
    spec = cluster
    given = layout.given() if isinstance(layout, LayoutSpec) else None
    get: Callable[[str], int] = (
        (lambda k: int(getattr(layout, k))) if given is None else (lambda k: int(given.get(k, 1)))
    )
    order = str(layout.rank_order or RANK_ORDERS[0])
    tp, pp, cp, ep = get("tp"), get("pp"), get("cp"), get("ep")
    etp = get("etp") if given is None or "etp" in given else tp
    n = spec.num_gpus
    shape: tuple[int, ...]
    names: tuple[str, ...]
    if tp * pp * cp <= 0 or n % (tp * pp * cp):
        raise InvalidInput(
            f"tp x pp x cp = {tp * pp * cp} does not divide {n} GPUs", field="layout", code="does-not-divide"
        )
    dp = n // (tp * pp * cp)
    if given is not None and "dp" in given and get("dp") != dp:
        raise InvalidInput(f"dp x tp x pp x cp must equal {n} GPUs", field="layout.dp", code="does-not-divide")
    if etp not in (1, tp):
        raise InvalidInput(f"etp={etp} must be 1 or tp={tp}", field="layout.etp", code="out-of-range")
    if etp < tp:
        if not expert_groups_fit(dp, tp, cp, ep, etp):
            raise InvalidInput(
                f"{ep} folded expert groups cannot be cut from tp={tp} x cp={cp} x dp={dp}",
                field="layout.ep",
                code="does-not-divide",
            )
        inner = max(1, ep // (tp * cp))
        if order == RANK_ORDERS[ORDER_DP_INSIDE]:
            return RankMap(
                n, spec.gpus_per_node, tp, pp, cp, ep, dp, (pp, dp, cp, tp), ("pp", "dp", "cp", "tp"), order, True
            )
        if inner > 1:
            shape, names = (dp // inner, pp, inner, cp, tp), ("dp_outer", "pp", "dp_inner", "cp", "tp")
        else:
            shape, names = (dp, pp, cp, tp), ("dp", "pp", "cp", "tp")
        return RankMap(n, spec.gpus_per_node, tp, pp, cp, ep, inner, shape, names, order="tp-cp-dp_inner-pp-dp_outer")
    if dp % ep:
        raise InvalidInput(f"ep={ep} must divide dp={dp}", field="layout.ep", code="does-not-divide")
    if order == RANK_ORDERS[ORDER_DP_INSIDE]:
        if ep > 1:
            shape, names = (pp, dp // ep, ep, cp, tp), ("pp", "edp", "ep", "cp", "tp")
        else:
            shape, names = (pp, dp, cp, tp), ("pp", "dp", "cp", "tp")
        return RankMap(n, spec.gpus_per_node, tp, pp, cp, ep, 0, shape, names, order, True)
    if ep > 1:
        shape, names = (dp // ep, pp, ep, cp, tp), ("edp", "pp", "ep", "cp", "tp")
    else:
        shape, names = (dp, pp, cp, tp), ("dp", "pp", "cp", "tp")
    return RankMap(n, spec.gpus_per_node, tp, pp, cp, ep, 0, shape, names, order)
