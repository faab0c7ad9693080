"""Plan requests and responses (the shapes of DESIGN.md, versioned under /v1).

Response models declare every field an answer carries (``extra="forbid"``): the
tests validate real answers against them (``tests/service/api/test_plan_answers.py``), so
a field the service sends is a field OpenAPI documents.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field

from service.schemas.common import Name, NonNegativeFloat, PositiveFloat, RequestModel, Text

__all__ = [
    "PlanOptions",
    "GraphDocument",
    "InventoryDocument",
    "PresetInventory",
    "PlanCreate",
    "Answer",
    "PlanSummary",
    "ExactSummary",
    "PlanRead",
    "ReplanSummary",
    "ChromeTrace",
    "Candidate",
    "Transfer",
    "TensorPlacement",
    "PlanSchedule",
    "GraphRead",
]

MAX_LIST = 2_000_000

#: The operator classes efficiencies are given for (partitioners.costmodel.costs.OP_CLASS_NAMES).
OpClass = Literal["matmul", "conv", "attention", "norm", "elementwise", "reduction", "data-movement", "other"]
#: Lowest fraction of peak a caller may set (partitioners.costmodel.profiles.MIN_EFFICIENCY).
Efficiency = Annotated[float, Field(ge=1e-3, le=1, allow_inf_nan=False, strict=True)]
LaunchSeconds = Annotated[float, Field(ge=0, le=1.0, allow_inf_nan=False, strict=True)]


class DeviceCostModel(RequestModel):
    """Cost-model parameters of a device (or every device of a group) where devices differ."""

    launch_overhead_s: LaunchSeconds | None = Field(None, description="Seconds per operator launch on this device.")
    compute_efficiency: dict[OpClass, Efficiency] | None = Field(
        None, description="Achievable fraction of peak FLOP/s per operator class on this device."
    )
    memory_efficiency: Efficiency | None = Field(None, description="Achievable fraction of memory bandwidth.")


class CostModelOptions(DeviceCostModel):
    """The cost model that times the plan: a named profile, and parameters that override it (docs/costmodel.md)."""

    profile: Literal["roofline", "eager", "cuda-graphs"] = Field(
        "eager",
        description="roofline: peak compute and bandwidth, no launch cost (what partitioner papers use); eager: "
        "one kernel launch per operator from the host (~5 us), measured efficiencies (the default); cuda-graphs: "
        "a compiled runtime replaying CUDA graphs (~0.5 us per kernel, launched per device).",
    )
    link_efficiency: Efficiency | None = Field(None, description="Achievable fraction of every link's bandwidth.")
    launch: Literal["single-controller", "per-device"] | None = Field(
        None,
        description="single-controller: one host thread issues every device's kernels (PyTorch, ONNX Runtime with "
        "several GPUs in one process), so launches serialise across devices; per-device: one process per device.",
    )


def _profile_name_as_object(value: object) -> object:
    """``"roofline"`` is short for ``{"profile": "roofline"}``."""
    return {"profile": value} if isinstance(value, str) else value


class PlanOptions(RequestModel):
    """How to place. Every field has a default; ``{}`` is a valid options object (strict
    types, as every request body: see RequestModel)."""

    objective: Literal["makespan", "throughput", "communication", "energy", "energy_delay"] = Field(
        "makespan",
        description="makespan: one step's time; throughput: steady stream of micro-batches; communication: bytes "
        "moved; energy: joules per step; energy_delay: joules x makespan (energy needs the devices' power figures).",
    )
    mode: Literal["inference", "training"] = Field(
        "inference",
        description="training synthesises the backward pass and counts weights + gradients + optimizer state; "
        "a graph that declares its own training step (operator roles, gradient or optimizer_state tensors) "
        "is planned as that step whatever the mode.",
    )
    micro_batches: int = Field(
        1, ge=1, le=256, description="The graph is one micro-batch; plan for this many sharing parameters."
    )
    pipeline: bool = Field(False, description="Parts must form an acyclic stage order.")
    max_devices: int | None = Field(None, ge=1, le=100_000)
    memory_headroom_fraction: float = Field(
        0.0, ge=0.0, le=0.9, allow_inf_nan=False, description="Capacity kept free on every device."
    )
    strategy: Annotated[str, Field(pattern=r"^[a-z0-9_-]{1,32}$")] = Field(
        "auto",
        description="auto runs every applicable strategy and keeps the best; single, heft, metis, pipeline, hybrid "
        "force one family; exact solves graphs of up to 400 operators (after expansion) with CP-SAT within "
        "time_limit_s.",
    )
    time_limit_s: float = Field(
        10.0,
        gt=0.0,
        le=300.0,
        allow_inf_nan=False,
        description="strategy exact: the solver's time limit in seconds (the plan answers within about a second "
        "more); other strategies ignore it.",
    )
    seed: int = Field(0, ge=0, le=2**31 - 1)
    fusion: Literal["none", "elementwise", "compiler"] = Field(
        "none",
        description="Fuse operators into kernels before placing them as units: elementwise (TorchInductor's "
        "pointwise fusion) or compiler (XLA / TensorRT: epilogues into GEMMs, pointwise into reductions). none: "
        "the graph is already the compiler's fused graph.",
    )
    count_idle_devices: bool = Field(
        True,
        description="A step's energy includes the idle power of usable devices the plan leaves unused "
        "(false when the job frees them).",
    )
    cost_model: Annotated[CostModelOptions | None, BeforeValidator(_profile_name_as_object)] = Field(
        None,
        description='The cost model: a profile name ("roofline", "eager", "cuda-graphs") or an object with a '
        "profile and parameters overriding it; left out: the eager profile, launched from one host.",
    )
    dims: dict[
        Annotated[str, Field(min_length=1, max_length=100, pattern=r"^[^\x00]*$")],
        Annotated[int, Field(ge=1, le=2**31 - 1)],
    ] = Field(
        default_factory=dict, max_length=64, description='ONNX dynamic dimensions, e.g. {"batch": 8, "sequence": 2048}.'
    )


# The graph documents below describe, for the OpenAPI schema, what
# ``partitioners.graph.json_import.graph_from_json`` accepts: the ingester validates posted graphs
# itself (fast on 10^6 nodes), and rejects the same unknown fields and empty names.


class NodeDocument(RequestModel):
    name: Name
    op: Name
    inputs: list[Name] = Field(max_length=10_000)
    outputs: list[Name] = Field(max_length=10_000)
    flops: NonNegativeFloat | None = None
    param_bytes: NonNegativeFloat | None = None
    device_types: list[Name] | None = Field(None, min_length=1, max_length=64)
    role: Literal["forward", "backward", "optimizer"] | None = Field(
        None,
        description="In an exported training step: what the operator does (absent: forward). Optimizer "
        "operators run once per step, after every micro-batch's backward operators.",
    )
    time_s: NonNegativeFloat | dict[Name, NonNegativeFloat] | None = Field(
        None,
        description="The operator's time measured or estimated by the compiler, in seconds, for every device or "
        "per device type; the planner uses it instead of its roofline (plus the launch overhead).",
    )


class TensorDocument(RequestModel):
    name: Name
    bytes: NonNegativeFloat
    shape: list[Annotated[int, Field(ge=0, le=2**63 - 1)] | None] | None = Field(
        None,
        max_length=16,
        description="Dimensions; null for one the exporter could not resolve. Bind symbolic ones first.",
    )
    dtype: Name | None = None
    kind: Literal["activation", "input", "parameter", "gradient", "optimizer_state"] | None = Field(
        None,
        description="Absent: from the structure. gradient: written by an operator, needs 'of'; optimizer_state: "
        "resident and updated in place (no operator writes it).",
    )
    of: Name | None = Field(None, description="The parameter tensor a gradient or optimizer state belongs to.")


class GraphDocument(RequestModel):
    """A computation graph: operators with named input/output tensors."""

    name: Annotated[str, Field(max_length=200, pattern=r"^[^\x00]*$")] = ""
    nodes: list[NodeDocument] = Field(max_length=MAX_LIST)
    tensors: list[TensorDocument] = Field(default_factory=list, max_length=MAX_LIST)
    warnings: list[Text] | None = Field(
        None, max_length=1000, description="Import notes a stored graph document carries; kept with the graph."
    )


class MemoryTierDocument(RequestModel):
    name: Name
    capacity_bytes: PositiveFloat
    bandwidth_bytes_per_s: PositiveFloat


class LinkDocument(RequestModel):
    bandwidth_bytes_per_s: PositiveFloat
    latency_s: NonNegativeFloat = 0.0
    energy_pj_per_bit: NonNegativeFloat | None = Field(None, description="Energy per bit moved over this link.")


class DeviceDocument(RequestModel):
    name: Name = Field(description="Unique across the whole inventory (every group); a repeated name is a 422.")
    type: Name = "gpu"
    peak_flops: PositiveFloat | dict[Name, PositiveFloat]
    memory_tiers: list[MemoryTierDocument] = Field(min_length=1, max_length=8)
    active_power_w: NonNegativeFloat | None = Field(None, description="Power running kernels (board power, TDP).")
    idle_power_w: NonNegativeFloat | None = Field(None, description="Power held by a job but idle.")
    cost_model: DeviceCostModel | None = Field(None, description="Cost-model parameters of this device.")


_DEFAULT_DTYPE_HELP = (
    "The dtype whose peak FLOP/s times every operator: a key of each device's peak_flops (bf16 when left out; "
    "a preset has the dtypes its spec sheet gives, e.g. tf32 and fp32 for the H100, to time an fp32 export as it runs)."
)


class GroupDocument(RequestModel):
    name: Name = Field(description="Unique in the inventory; a repeated name is a 422 (plans report traffic by group).")
    devices: list[DeviceDocument] = Field(min_length=1, max_length=4096)
    link: LinkDocument
    cost_model: DeviceCostModel | None = Field(
        None, description="Cost-model parameters of every device of the group (a device's own win)."
    )


class InventoryDocument(RequestModel):
    """An explicit cluster: groups (nodes, NVSwitch domains) of devices with memory tiers and links."""

    name: Name = "cluster"
    default_dtype: Name | None = Field(None, description=_DEFAULT_DTYPE_HELP)
    groups: list[GroupDocument] = Field(min_length=1, max_length=4096)
    link: LinkDocument | None = None


class PresetInventory(RequestModel):
    """A named cluster preset expanded to ``nodes`` nodes."""

    preset: Name
    nodes: int = Field(1, ge=1, le=4096)
    default_dtype: Name | None = Field(None, description=_DEFAULT_DTYPE_HELP)


class PlanCreate(RequestModel):
    """JSON form of ``POST /v1/plans``: a graph (or a stored graph's id), an inventory and options."""

    graph: GraphDocument | None = None
    graph_id: Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9-]+$")] | None = None
    inventory: InventoryDocument | PresetInventory
    options: PlanOptions = Field(default_factory=PlanOptions)


class Answer(BaseModel):
    """A response body whose every field is declared: an undeclared key fails validation."""

    model_config = ConfigDict(extra="forbid")


class Candidate(Answer):
    strategy: str
    makespan_s: float | None = None
    feasible: bool
    comm_bytes: float | None = None
    devices_used: int | None = None
    planning_s: float | None = None
    note: str = ""


class Transfer(Answer):
    tensor: str
    src: str
    dst: list[str]
    bytes: float
    link_class: str


class TensorPlacement(Answer):
    device: str
    tier: str | None = Field(description="Memory tier; null when the plan is infeasible and the tensor fits nowhere.")
    offset: int


class ScheduledOp(Answer):
    op: str = Field(description="Operator of the placed graph, as in ops.")
    start_s: float
    end_s: float
    micro_batch: int | None = Field(
        None, description="Micro-batch the operator belongs to; only on micro-batched plans, absent on optimizer steps."
    )


class DeviceSchedule(Answer):
    device: str
    ops: list[ScheduledOp] = Field(description="The device's operators in execution order, one at a time.")


class ScheduledTransfer(Answer):
    tensor: str
    src: str
    dst: list[str] = Field(description="The receiving device (one per entry: each destination is its own transfer).")
    link_class: str
    bytes: float
    start_s: float
    end_s: float = Field(description="The tensor is on dst from here on; its consumers there start no earlier.")


class TierHolding(Answer):
    tensor: str
    device: str
    tier: str | None = Field(description="Memory tier; null when the plan is infeasible and the tensor fits nowhere.")
    offset_bytes: int
    size_bytes: int = Field(description="Aligned size: the holding owns [offset_bytes, offset_bytes + size_bytes).")
    live_from_s: float
    live_until_s: float = Field(
        description="The holding owns its range in [live_from_s, live_until_s): another holding of the same tier "
        "reuses it only outside that interval."
    )


class PlanSchedule(Answer):
    """The order and times the plan's prediction assumes (docs/api.md "The schedule")."""

    devices: list[DeviceSchedule]
    transfers: list[ScheduledTransfer]
    holdings: list[TierHolding]


class ReplanSummary(Answer):
    parent_id: str
    calibration_version: int | None
    parent_makespan_s: float = Field(description="The parent's placement under the calibrated model (and load report).")
    kept_makespan_s: float = Field(description="The parent's placement with only operators on gone devices moved.")
    makespan_s: float = Field(
        description="The new placement under the same model, operands in main memory like "
        "the two above (the plan's summary.makespan_s also counts its memory tiers)."
    )
    gain_s: float
    gain_fraction: float
    ops_moved: int
    ops_displaced: int
    ops_total: int
    minimal_movement: bool
    kept_parent: bool = Field(False, description="The predicted gain was under min_gain_fraction: nothing moved.")
    slow_devices: dict[str, float]
    gone_devices: list[str]


class FusionSummary(Answer):
    mode: str
    groups: int = Field(description="Fused kernels of more than one operator.")
    ops_fused: int = Field(description="Operators inside those kernels.")
    launches_saved: int = Field(description="Kernel launches the fusion removes.")
    bytes_saved: float = Field(description="Main-memory traffic the fusion removes (intermediates written and read).")


class FusionGroup(Answer):
    name: str = Field(description="The placed operator: the group's first operator.")
    ops: list[str] = Field(description="Its operators in topological order.")
    bytes_saved: float


class StepEnergySummary(Answer):
    compute_j: float = Field(description="Busy time x active power over the counted devices.")
    idle_j: float = Field(description="Idle time x idle power over the counted devices.")
    transfer_j: float = Field(description="Bytes between devices x their link's energy per byte.")
    devices_counted: int = Field(description="Devices used, plus the usable ones left idle when counted.")


class TrainingStateBytes(Answer):
    parameters: float
    gradients: float
    optimizer_state: float


class ExactSummary(Answer):
    status: Literal["optimal", "feasible", "infeasible", "unknown"] = Field(
        description="optimal: the solver proved its plan optimal under its model; feasible: the best found when the "
        "time limit ended; infeasible: no placement keeps the parameters within the budgets; unknown: nothing "
        "found in time (the heuristic plan stands)."
    )
    bound_s: float | None = Field(
        None,
        description="The lower bound the solver proved on its model's makespan, operators timed in main memory: it "
        "bounds makespan_before_tiers_s (level-3 tiers can make makespan_s faster still); null when infeasible.",
    )
    objective_s: float | None = Field(None, description="The model's makespan of the solver's plan.")
    solve_time_s: float = Field(description="Seconds the solver searched.")


class PlanSummary(Answer):
    makespan_s: float
    comm_bytes: float
    comm_bytes_by_link_class: dict[str, float]
    peak_memory_bytes: dict[str, float]
    peak_memory_by_tier_bytes: dict[str, dict[str, float]]
    capacity_bytes: dict[str, float]
    imbalance: float
    feasible: bool
    devices_used: int
    one_device_makespan_s: float | None = Field(None, description="The best one-device candidate, main memory only.")
    makespan_before_tiers_s: float | None = Field(
        None, description="The chosen placement scored like the candidates (main memory only), before level-3 tiers."
    )
    timed_with_tiers: bool | None = Field(
        None,
        description="makespan_s and the trace time each operator with its tensors at their tiers' bandwidths; "
        "runtime feedback is compared with those times.",
    )
    infeasible_reason: str | None = None
    energy_j: float | None = Field(
        None, description="Energy of one step (devices' busy and idle power, transfers); null without power figures."
    )
    energy: StepEnergySummary | None = None
    fusion: FusionSummary | None = Field(None, description="The fused kernels, when options.fusion fuses.")

    training_state_bytes: dict[str, TrainingStateBytes] | None = Field(
        None,
        description="Training plans: per device used, the bytes of parameters, gradients and optimizer state it "
        "holds (part of peak_memory_bytes).",
    )
    lower_bound_s: float | None = Field(
        None,
        description="No plan of this request (any placement on the devices the options allow, under the same cost "
        "model and constraints) has a simulated makespan below this; docs/placement.md, 'How good is a plan'.",
    )
    optimality_gap: float | None = Field(
        None, description="makespan_s / lower_bound_s - 1: how far above the best possible this plan may be, at most."
    )
    lower_bound_by: str | None = Field(
        None,
        description="The bound that gives lower_bound_s: critical-path, load, load-window, memory-cut or exact.",
    )
    lower_bounds_s: dict[str, float] | None = Field(None, description="Every bound computed, by name.")
    exact: ExactSummary | None = Field(None, description="strategy exact: what the CP-SAT solver found.")
    planning_s: float | None = Field(None, description="Seconds the placement took (this plan's computation).")
    cost_model: dict[str, Any] | None = Field(
        None, description="The profile and the resolved parameters (calibration included) that timed the plan."
    )
    cost_sources: dict[str, int] | None = Field(
        None,
        description="How many operators were timed each way: node_time_s (the graph's own), calibration, roofline.",
    )
    replan: ReplanSummary | None = Field(None, description="A re-plan's gains and moves against its parent.")


class PlanRead(Answer):
    id: str
    model_hash: str
    inventory_hash: str
    status: Literal["queued", "running", "done", "failed"]
    progress: float
    error: str | None = None
    cached: bool = False
    parent_id: str | None = None
    created_at: datetime
    finished_at: datetime | None = None
    options: dict[str, Any]
    strategy: str | None = None
    summary: PlanSummary | None = None
    candidates: list[Candidate] | None = None
    ops: dict[str, str] | None = None
    tensors: dict[str, list[TensorPlacement]] | None = None
    transfers: list[Transfer] | None = None
    fusion_groups: list[FusionGroup] | None = Field(
        None, description="Each fused kernel of several operators; ops and the schedule name it by its first operator."
    )
    schedule: PlanSchedule | None = Field(
        None,
        description="Operator order per device, transfers and tier holdings with predicted times; left out by "
        "detail=summary, null for plans stored before plans carried it.",
    )
    warnings: list[str] = Field(default_factory=list, description="What importing the graph could not resolve.")
    notes: list[str] = Field(
        default_factory=list,
        description="What the planner assumed or could not do for this plan: the dtype whose peak timed it when the "
        "graph's tensors are of another, memory tiers it did not re-time.",
    )
    links: dict[str, str] = Field(default_factory=dict)


class GraphRead(Answer):
    id: str
    model_hash: str
    name: str
    source_format: str
    n_ops: int
    n_tensors: int
    total_flops: float
    parameter_bytes: float
    activation_bytes: float
    warnings: list[str]
    created_at: datetime


class ChromeTrace(Answer):
    """A plan's simulated timeline in the Trace Event Format (opens in Perfetto and chrome://tracing)."""

    traceEvents: list[dict[str, Any]] = Field(description="Complete (X), counter (C), flow and metadata (M) events.")
    displayTimeUnit: str = "ms"
    otherData: dict[str, Any] = Field(default_factory=dict, description="Graph and inventory names, makespan, bytes.")
