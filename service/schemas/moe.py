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


class BalanceRead(ResponseModel):
    """Max over mean GPU load (>= 1). null where a placement holds no copy of an expert that
    receives load: it cannot serve those tokens, so no max/mean describes it."""

    mean: float | None
    worst: float | None
    per_layer: list[float | None]
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
    source_gpu: list[int] = Field(
        description="A GPU holding the expert now (same node preferred); -1: load from storage."
    )
    cross_node: list[bool]


class MoeRebalanceResponse(ResponseModel):
    """The new placement (EPLB's maps), its balance against the old one and the lower bound, and the copies to write.

    ``deployment`` and ``version`` are present only when the request named a deployment.
    """

    physical_to_logical: list[list[int]]
    logical_to_physical: list[list[list[int]]] = Field(description="Per layer, per logical expert, its physical slots.")
    logical_count: list[list[int]]
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
    layer_action: list[str]
    layer_policy: list[str]
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
    balance: HistoryBalance
    created_at: AwareDatetime


class MoeDeploymentRead(ResponseModel):
    name: str
    config: MoeDeploymentConfig
    current_version: int
    physical_to_logical: list[list[int]] | None = Field(description="The current placement (null: no report yet).")
    history: list[MoeHistoryEntry] = Field(description="The newest reports first, at most ``history`` of them.")
