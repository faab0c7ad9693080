"""MoE expert rebalancing requests and responses (EPLB vocabulary)."""

from __future__ import annotations

from typing import Annotated

from pydantic import AwareDatetime, Field, StringConstraints

from partitioners.moe.rebalance import MAX_NODES, MAX_OPTION, MAX_PER_NODE
from service.schemas.common import RequestModel, ResponseModel

__all__ = [
    "DEPLOYMENT_NAME_MAX_LENGTH",
    "DEPLOYMENT_NAME_PATTERN",
    "DeploymentName",
    "MoeModel",
    "MoeCluster",
    "MoePlacementIn",
    "MoeRebalanceRequest",
    "BalanceRead",
    "MigrationsRead",
    "MoeRebalanceResponse",
    "BalanceSummary",
    "HistoryBalance",
    "MoeDeploymentConfig",
    "MoeHistoryEntry",
    "MoeDeploymentRead",
    "BudgetRead",
    "MoeAppliedRequest",
    "MoeAppliedResponse",
]

Load = Annotated[float, Field(ge=0, le=1e15, allow_inf_nan=False, strict=True)]  # tokens; bounded so sums stay finite
ExpertId = Annotated[int, Field(ge=-1, le=1_000_000)]
# A deployment is read back at /v1/moe/deployments/{name}, one path segment: a name with "/",
# "%", "?", "#", a space or a leading "." (".", "..") could be stored but never read back.
DEPLOYMENT_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]*$"
DEPLOYMENT_NAME_MAX_LENGTH = 200  # the moe_deployments.name column
DeploymentName = Annotated[
    str,
    StringConstraints(min_length=1, max_length=DEPLOYMENT_NAME_MAX_LENGTH, pattern=DEPLOYMENT_NAME_PATTERN),
    Field(
        description="Letters, digits, '.', '_' and '-', starting with a letter or digit; read back at "
        "GET /v1/moe/deployments/{name}."
    ),
]


class MoeModel(RequestModel):
    num_moe_layers: int = Field(ge=1, le=1024)
    num_logical_experts: int = Field(ge=1, le=65_536)
    num_expert_groups: int | None = Field(None, ge=1, le=65_536)
    expert_bytes: int = Field(
        0, ge=0, le=MAX_OPTION, description="Bytes of one expert's weights (sizes the migrations)."
    )


class MoeCluster(RequestModel):
    num_nodes: int = Field(ge=1, le=MAX_NODES)
    gpus_per_node: int = Field(ge=1, le=MAX_PER_NODE)
    slots_per_gpu: int = Field(ge=1, le=MAX_PER_NODE)
    unavailable_gpus: list[Annotated[int, Field(ge=0, le=10**6)]] = Field(default_factory=list, max_length=100_000)


class MoePlacementIn(RequestModel):
    physical_to_logical: list[Annotated[list[ExpertId], Field(max_length=1 << 22)]] = Field(
        max_length=1024, description="Per layer, the logical expert in each physical slot (-1 empty)."
    )


class MoeRebalanceRequest(RequestModel):
    """Load per logical expert per layer -> new expert-to-GPU placement.

    With a ``deployment`` name the service keeps the current placement, so a
    runtime may send only ``load``; ``model`` and ``cluster`` are then remembered.
    """

    model: MoeModel | None = None
    cluster: MoeCluster | None = None
    load: list[Annotated[list[Load], Field(max_length=65_536)]] = Field(
        max_length=1024, description="Tokens per logical expert, a layers x experts matrix."
    )
    current_placement: MoePlacementIn | None = None
    max_replicas_moved: int | None = Field(
        None, ge=0, le=10**9, description="Hard cap on expert copies written by this call."
    )
    min_improvement: float | None = Field(
        None, ge=0, le=10, allow_inf_nan=False, description="Keep the placement unless max/mean improves by more."
    )
    node_local: bool = Field(False, description="Only copy experts within a node.")
    deployment: DeploymentName | None = None
    balance_target: float | None = Field(
        None,
        ge=1,
        le=10,
        allow_inf_nan=False,
        description="Max/mean at which a repaired layer stops moving copies (default HYPERPLACE_MOE_BALANCE_TARGET).",
    )
    move_budget: int | None = Field(
        None,
        ge=0,
        le=10**9,
        description="Copies this call may write for balance, on top of re-creating experts that lost every copy"
        " (default HYPERPLACE_MOE_MOVE_BUDGET_FRACTION of the physical slots).",
    )
    repair_budget: int | None = Field(
        None,
        ge=0,
        le=10**9,
        description="Copies a GPU failure may write for balance on the survivors, on top of one copy for each"
        " expert that lost every copy (default HYPERPLACE_MOE_REPAIR_BUDGET_FRACTION of the physical slots);"
        " a returning GPU writes one copy per empty slot and stops.",
    )
    placement_version: int | None = Field(
        None,
        ge=0,
        le=2**31 - 1,
        description="The deployment's placement version the runtime is running (the ETag of the answer it applied);"
        " a report against another one is a 409 naming the current one.",
    )
    apply: bool = Field(True, description="false: preview; the deployment and its history stay as they are.")


class BalanceRead(ResponseModel):
    """Max over mean GPU load (>= 1). null where a placement holds no copy of an expert that
    receives load: it cannot serve those tokens, so no max/mean describes it."""

    mean: float | None
    worst: float | None
    per_layer: list[float | None] | None = Field(None, description="Per layer; with ?include=layers.")
    unhosted_experts: list[list[int]] | None = Field(
        None, description="Per layer, the experts that receive load but have no copy; present only when there are any."
    )


class MigrationsRead(ResponseModel):
    """Expert copies to write, column-wise: copy i writes ``logical_expert[i]`` of ``layer[i]`` into ``slot[i]`` on ``gpu[i]``."""

    count: int
    cross_node_count: int
    from_storage_count: int
    total_bytes: int
    slots_moved_fraction: float
    layer: list[int]
    gpu: list[int]
    slot: list[int]
    logical_expert: list[int]
    replaced_expert: list[int] = Field(
        description="The expert the slot held before (-1: empty); a runtime that could not complete copy i keeps it."
    )
    source_gpu: list[int] = Field(
        description="A GPU holding the expert now (same node preferred); -1: load from storage."
    )
    cross_node: list[bool]


class BudgetRead(ResponseModel):
    """What stopped the moves: the balance target (every changed layer reached it) or a copy budget."""

    bound: str = Field(
        description="'balance_target', 'move_budget' (the soft budget for balance copies), 'repair_budget' (the"
        " budget of a GPU failure's balance copies), 'max_replicas_moved' (the hard cap) or 'none' (nothing moved)."
    )
    balance_target: float
    move_budget: int | None
    repair_budget: int | None = Field(
        None, description="The failure's balance budget used (null when no GPU failed or returned in this call)."
    )
    max_replicas_moved: int | None
    copies_written: int
    bytes_written: int
    lost_experts: int = Field(description="Experts that had no copy on an available GPU (re-created first).")


class MoeRebalanceResponse(ResponseModel):
    """The copies to write and the placement version they lead to; the maps (EPLB's vocabulary) on request.

    ``deployment`` and ``version`` are present only when the request named a deployment.
    ``physical_to_logical``, ``logical_to_physical`` and ``logical_count`` come with
    ``?include=placement``; per-layer figures (``per_layer``, ``layer_action``,
    ``layer_policy``) with ``?include=layers``.
    """

    physical_to_logical: list[list[int]] | None = None
    logical_to_physical: list[list[list[int]]] | None = Field(
        None, description="Per layer, per logical expert, its physical slots."
    )
    logical_count: list[list[int]] | None = None
    physical_to_logical_map: list[list[int]] | None = Field(
        None, description="With ?include=eplb: physical_to_logical under EPLB's (vLLM's, SGLang's) name."
    )
    logical_to_physical_map: list[list[list[int]]] | None = Field(
        None,
        description="With ?include=eplb: per layer, per logical expert, its physical slots padded with -1 to the"
        " largest replica count (vLLM pads to num_redundant_experts + 1: pad on the runtime's side).",
    )
    placement_version: int | None = Field(
        description="The deployment's placement version after this answer (its ETag); null without a deployment."
    )
    placement_etag: str = Field(description="The ETag header: the placement version, or a hash of the placement.")
    based_on_version: int | None = Field(description="The placement version the answer started from.")
    applied: bool = Field(description="Whether the deployment took the answer (false: apply=false, a preview).")
    budget: BudgetRead
    balance_before: BalanceRead | None
    balance_after: BalanceRead
    lower_bound: BalanceRead
    migrations: MigrationsRead
    slots_moved_fraction: float
    kept_current: bool
    reason: str = Field(
        description="Why the layers changed or stayed: a gain within min_improvement (plus sampling noise), or the"
        " constraint (max_replicas_moved, node_local) that ruled out a better placement, with the max/mean a fresh"
        " plan would reach."
    )
    layer_action: list[str] | None = None
    layer_policy: list[str] | None = None
    compute_ms: float
    deployment: str | None = None
    version: int | None = None


class BalanceSummary(ResponseModel):
    """Max over mean GPU load, mean and worst over layers (null: a loaded expert had no copy)."""

    mean: float | None
    worst: float | None


class HistoryBalance(ResponseModel):
    before: BalanceSummary | None = Field(description="The placement the report found (null: none, a fresh plan).")
    after: BalanceSummary


class MoeDeploymentConfig(ResponseModel):
    """The shape the deployment was last reported with, as the request gave it."""

    model: MoeModel
    cluster: MoeCluster


class MoeHistoryEntry(ResponseModel):
    version: int
    kept_current: bool
    slots_moved: int
    balance: HistoryBalance | None
    status: str = Field(
        description="'answered' (a report), 'applied' or 'partially applied' (the runtime confirmed it), "
        "'confirmed' (the placement a partial confirmation left deployed)."
    )
    placement_version: int = Field(description="The deployment's placement version after this row.")
    created_at: AwareDatetime


class MoeDeploymentRead(ResponseModel):
    name: str
    config: MoeDeploymentConfig
    current_version: int
    placement_version: int = Field(description="The version that set the current placement (its ETag).")
    physical_to_logical: list[list[int]] | None = Field(description="The current placement (null: no report yet).")
    logical_to_physical: list[list[list[int]]] | None = Field(
        None, description="Per layer, per logical expert, its physical slots."
    )
    logical_count: list[list[int]] | None = None
    history: list[MoeHistoryEntry] = Field(description="The newest reports first, at most ``history`` of them.")


class MoeAppliedRequest(RequestModel):
    """What the runtime applied of an answer: all of it, or the migrations it completed."""

    placement_version: int = Field(
        ge=1, le=2**31 - 1, description="The placement version of the answer applied (its ETag)."
    )
    migrations_completed: list[Annotated[int, Field(ge=0, le=1 << 31)]] | None = Field(
        None,
        max_length=1 << 22,
        description="Indices into that answer's migrations that were completed; absent: all of them.",
    )


class MoeAppliedResponse(ResponseModel):
    deployment: str
    placement_version: int = Field(description="What the next report starts from (its ETag).")
    placement_etag: str
    status: str = Field(description="'applied' (all) or 'partially applied'.")
    migrations_applied: int
    migrations_reverted: int = Field(description="Copies not completed: their slots keep the expert they held.")
