"""3D-parallel layout planning (``POST /v1/parallel/plan``): the request, generated from the planner's specs, and
the answer.

The request's blocks are generated from the frozen dataclasses of
:mod:`partitioners.parallel3d.specs`: every field, its bounds and its description come
from the field's declaration there (:func:`~partitioners.parallel3d.spec_fields.spec_field`),
so the schema and the planner hold the same limits and defaults. Only the shorthand
forms (a cluster ``preset``/``gpu``/``inventory``, a training ``software`` generation, a
model's Hugging Face config) are written here. ``service.domain.parallel`` maps a
validated request onto the dataclasses in one place.
"""

from __future__ import annotations

import dataclasses
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag, create_model

from partitioners.parallel3d.huggingface import HUGGINGFACE_MODEL_TYPES
from partitioners.parallel3d.launch import FRAMEWORKS
from partitioners.parallel3d.planner import REJECTION_REASONS
from partitioners.parallel3d.presets import NODE_PRESETS, RANK_ORDERS
from partitioners.parallel3d.spec_fields import FieldRule, field_rule
from partitioners.parallel3d.specs import (
    MAX_EVALUATED_LAYOUTS,
    MAX_LAYERS,
    MAX_NODES,
    MAX_RANK_MAP_RANKS,
    MAX_TOKENS,
    MAX_TOP_K,
    MAX_WIDTH,
    RECOMPUTE_MODES,
    ZERO_STAGES,
    ClusterSpec,
    Constraints,
    LayoutSpec,
    MLASpec,
    ModelSpec,
    MoESpec,
    TrainingSpec,
)
from service.schemas.common import Name, PositiveFloat, RequestModel
from service.schemas.plans import InventoryDocument, PresetInventory

__all__ = [
    "ParallelPlanRequest",
    "ParallelPlanAnswer",
    "SearchAnswer",
    "EvaluateAnswer",
    "LayoutAnswer",
    "RankMapAnswer",
]


# --------------------------------------------------------------------------- request, from the specs


def _annotation(rule: FieldRule) -> Any:
    """The pydantic type of a field declared with ``rule`` (strict, bounded, as every request field)."""
    if rule.kind == "count":
        return Annotated[int, Field(ge=rule.ge, le=rule.le)]
    if rule.kind == "flag":
        return bool
    if rule.kind == "positive":
        return Annotated[float, Field(gt=0, le=rule.le, allow_inf_nan=False)]
    if rule.kind == "number":
        return Annotated[float, Field(ge=rule.ge, le=rule.le, lt=rule.lt, allow_inf_nan=False)]
    if rule.kind == "choice":
        return Literal[rule.choices]  # type: ignore[valid-type]
    if rule.kind == "name":
        return Name
    if rule.kind == "layers":
        return Annotated[list[Annotated[int, Field(ge=0, le=MAX_LAYERS)]], Field(max_length=MAX_LAYERS)]
    if rule.kind == "rates":
        return Annotated[dict[Name, PositiveFloat], Field(max_length=int(rule.le))]
    raise TypeError(f"no schema for a {rule.kind!r} field: give it an override")


def _schema_from_spec(
    spec: type,
    name: str,
    doc: str,
    *,
    overrides: dict[str, Any] | None = None,
    defaults_from_elsewhere: bool = False,
    required_from_elsewhere: bool = False,
    extra: dict[str, Any] | None = None,
) -> type[RequestModel]:
    """A request model with one field per field of the dataclass ``spec``.

    Required fields stay required and others default to the dataclass's default; with
    ``defaults_from_elsewhere`` (a cluster preset or a software generation supplies
    them) the others default to None, which the domain drops before reading the spec, and
    with ``required_from_elsewhere`` (a cluster preset gives every figure) so do the
    required ones. ``overrides`` gives a field's
    type where its rule is ``custom``; ``extra`` adds the shorthand fields of the request.
    """
    overrides = overrides or {}
    definitions: dict[str, Any] = {}
    for field in dataclasses.fields(spec):
        rule = field_rule(field)
        annotation = overrides.get(field.name) or _annotation(rule)
        required = field.default is dataclasses.MISSING
        if required and not required_from_elsewhere:
            definitions[field.name] = (annotation, Field(description=rule.doc))
        elif field.default is None or defaults_from_elsewhere:
            definitions[field.name] = (annotation | None, Field(None, description=rule.doc))
        else:
            definitions[field.name] = (annotation, Field(_shown(field.default), description=rule.doc))
    definitions.update(extra or {})
    return create_model(name, __base__=RequestModel, __doc__=doc, **definitions)


def _shown(default: Any) -> Any:
    """A dataclass default as JSON shows it (tuples as lists)."""
    return list(default) if isinstance(default, tuple) else default


MoeBlock = _schema_from_spec(MoESpec, "MoeBlock", MoESpec.__doc__.splitlines()[0])
MlaBlock = _schema_from_spec(
    MLASpec, "MlaBlock", "Multi-head latent attention (DeepSeek-V2/V3), named as in the Hugging Face config."
)
TransformerShape = _schema_from_spec(
    ModelSpec,
    "TransformerShape",
    "A decoder-only transformer's shape.",
    overrides={"moe": MoeBlock, "mla": MlaBlock},
    # MLA's widths may also sit beside the other fields under the Hugging Face config's names
    extra={
        name: (
            Annotated[int, Field(ge=0, le=MAX_WIDTH)] | None,
            Field(None, description=f"MLA's {name} given beside the other fields (read as mla.{name})."),
        )
        for name in ("kv_lora_rank", "q_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")
    },
)


class HuggingFaceModel(RequestModel):
    """A model described by its Hugging Face ``config.json``, plus the sequence length the run trains at."""

    huggingface_config: dict[str, Any] = Field(
        max_length=1000,
        description="The parsed config.json (or one holding a text_config). Read by model_type: "
        f"{', '.join(HUGGINGFACE_MODEL_TYPES)}.",
    )
    seq_length: int = Field(
        ge=1,
        le=MAX_TOKENS,
        description="Training sequence length (max_position_embeddings is only the longest the model supports).",
    )


def _model_kind(value: Any) -> str:
    if isinstance(value, dict):
        return "@huggingface" if "huggingface_config" in value else "@shape"
    return "@huggingface" if isinstance(value, HuggingFaceModel) else "@shape"


# The shape fields, or a Hugging Face config: told apart by the huggingface_config key so that
# a bad request gets the errors of the form it meant, not of both. Tags begin with "@": they
# are not fields, and problem answers leave them out of error paths (service.api.problems).
ModelDescription = Annotated[
    Annotated[TransformerShape, Tag("@shape")] | Annotated[HuggingFaceModel, Tag("@huggingface")],
    Discriminator(_model_kind),
]

ClusterShape = _schema_from_spec(
    ClusterSpec,
    "ClusterShape",
    "A cluster: a preset with a node count, a GPU model with a node count, or every figure.",
    defaults_from_elsewhere=True,
    required_from_elsewhere=True,
    overrides={"inter_node_bandwidth_bytes_per_s": PositiveFloat},
    extra={
        "preset": (
            Name | None,
            Field(
                None,
                description=f"A node preset ({', '.join(sorted(NODE_PRESETS))}) or an "
                "inventory preset; its figures apply unless given.",
            ),
        ),
        "gpu": (Name | None, Field(None, description="A GPU model whose figures apply unless given.")),
        "nodes": (Annotated[int, Field(ge=1, le=MAX_NODES)] | None, Field(None, description="Same as num_nodes.")),
        "inventory": (
            InventoryDocument | PresetInventory | None,
            Field(
                None,
                description="Or a hyperplace inventory (identical nodes of one GPU type) instead of the fields above.",
            ),
        ),
    },
)

TrainingSettings = _schema_from_spec(
    TrainingSpec,
    "TrainingSettings",
    "Batch, precision and the software stack; a field left out takes ``software``'s value, else the default.",
    defaults_from_elsewhere=True,
)

LayoutConstraints = _schema_from_spec(
    Constraints,
    "LayoutConstraints",
    "Limits on the search; a size left out is searched.",
    overrides={
        "zero_stages": Annotated[
            list[Annotated[int, Field(ge=ZERO_STAGES[0], le=ZERO_STAGES[-1])]],
            Field(min_length=1, max_length=len(ZERO_STAGES)),
        ],
        "recompute": Annotated[
            list[Literal[RECOMPUTE_MODES]],  # type: ignore[valid-type]
            Field(min_length=1, max_length=len(RECOMPUTE_MODES)),
        ],
    },
)

Layout = _schema_from_spec(LayoutSpec, "Layout", LayoutSpec.__doc__.splitlines()[0])


class ParallelPlanRequest(RequestModel):
    """Model shape + cluster + training settings -> ranked dp x tp x pp (x cp x ep) layouts."""

    model: ModelDescription
    cluster: ClusterShape  # type: ignore[valid-type]
    training: TrainingSettings  # type: ignore[valid-type]
    constraints: LayoutConstraints | None = None  # type: ignore[valid-type]
    evaluate: list[Layout] | None = Field(  # type: ignore[valid-type]
        None, max_length=MAX_EVALUATED_LAYOUTS, description="Predict these layouts instead of searching."
    )
    top_k: int = Field(10, ge=1, le=MAX_TOP_K)
    rank_map_limit: int = Field(
        1024, ge=0, le=MAX_RANK_MAP_RANKS, description="How many ranks of the top layout's rank map to return."
    )


# --------------------------------------------------------------------------- the answer


class _Answer(BaseModel):
    model_config = ConfigDict(extra="forbid")


class MemoryPerGpu(_Answer):
    """Predicted peak bytes per GPU on the fullest pipeline stage, by kind."""

    parameters_bytes: float
    gradients_bytes: float
    optimizer_state_bytes: float
    activations_bytes: float
    buffers_bytes: float
    total_bytes: float
    capacity_bytes: float
    activation_fragmentation: float = Field(description="Allocator waste counted on the activations, a share.")
    fullest_stage: int = Field(description="Pipeline rank of the stage whose memory this is.")
    fragmentation_that_fills: float | None = Field(
        description="Allocator waste on activations at which this footprint reaches capacity; null without activations."
    )


class LaunchAnswer(_Answer):
    """One framework's configuration for the layout, or why it cannot express it."""

    framework: Literal[FRAMEWORKS]  # type: ignore[valid-type]
    config: str | None = Field(
        description="Megatron-Core arguments, a torchtitan TOML or a DeepSpeed JSON; null when unavailable."
    )
    unavailable: str | None = Field(description="Why the framework cannot run this layout as its config states it.")
    notes: list[str]


class LayoutAnswer(_Answer):
    """One layout and what the planner predicts for it."""

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
    recompute: Literal[RECOMPUTE_MODES]  # type: ignore[valid-type]
    recompute_num_layers: int
    rank_order: Literal[RANK_ORDERS]  # type: ignore[valid-type]
    sequence_parallel: bool
    step_time_s: float
    tokens_per_s: float
    mfu: float
    mfu_causal: float
    mfu_note: str
    hfu: float
    mfu_at_precision_peak: float = Field(
        description="mfu against the dense peak of the training precision (FP8's for an FP8 run); mfu uses bf16's."
    )
    bubble_fraction: float
    time_breakdown_s: dict[str, float]
    memory_per_gpu: MemoryPerGpu
    fits: bool
    reasons: list[str] = Field(description="Why the layout cannot run; empty when it can.")
    notes: list[str]
    tie_with_best: bool
    launch: dict[Literal[FRAMEWORKS], LaunchAnswer] = Field(  # type: ignore[valid-type]
        description="How Megatron-Core, torchtitan and DeepSpeed would be told to run this layout."
    )
    energy_per_step_j: float | None = Field(
        description="Joules one step draws on all the layout's GPUs: busy time x board power + the rest of the "
        "step x idle power (docs/parallel3d.md, Energy); null without the cluster's power figures."
    )
    tokens_per_joule: float | None = Field(description="Tokens trained per joule; null without power figures.")


class RankRow(_Answer):
    """One rank: its mesh coordinates and the GPU it runs on."""

    rank: int
    dp: int
    pp: int
    tp: int
    cp: int
    ep: int
    device: int
    node: int
    local_gpu: int


class RankMapAnswer(_Answer):
    """The first ``rank_map_limit`` ranks of a layout's rank map, and the mesh they come from."""

    num_ranks: int
    order: str
    mesh_shape: list[int]
    mesh_dim_names: list[str]
    coord_names: list[str]
    ranks: list[RankRow]
    truncated: bool


class AssumptionAnswer(_Answer):
    """One physical term the run's software settings were resolved into, and its source."""

    name: str
    value: str
    source: str


class SearchAnswer(_Answer):
    """A search: ranked candidates, faster-looking layouts that cannot run, and the top one's rank map."""

    mode: Literal["search"]
    model: TransformerShape = Field(  # type: ignore[valid-type]
        description="The shape planned (what a Hugging Face config was read as)."
    )
    assumptions: list[AssumptionAnswer] = Field(
        description="What the prediction assumed about the stack (collective overlap, dispatch, extra bytes), "
        "each with its source."
    )
    num_gpus: int
    feasible: bool
    model_parameters: float
    model_flops_per_step: float
    searched_layouts: int
    candidates: list[LayoutAnswer]
    rejected_better_looking: list[LayoutAnswer]
    rejection_counts: dict[Literal[REJECTION_REASONS], int]  # type: ignore[valid-type]
    notes: list[str]
    rank_map: RankMapAnswer | None
    compute_s: float


class EvaluatedLayout(LayoutAnswer):
    """A layout given to evaluate, predicted, with its own rank map."""

    rank_map: RankMapAnswer


class EvaluateAnswer(_Answer):
    """Predictions of the layouts given under ``evaluate``, in order."""

    mode: Literal["evaluate"]
    model: TransformerShape = Field(  # type: ignore[valid-type]
        description="The shape planned (what a Hugging Face config was read as)."
    )
    assumptions: list[AssumptionAnswer] = Field(
        description="What the prediction assumed about the stack (collective overlap, dispatch, extra bytes), "
        "each with its source."
    )
    predictions: list[EvaluatedLayout]
    compute_s: float


ParallelPlanAnswer = Annotated[SearchAnswer | EvaluateAnswer, Field(discriminator="mode")]
