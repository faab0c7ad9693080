"""Inputs of the 3D-parallel planner: model shape, cluster, training settings, constraints, layouts.

Each input is a frozen dataclass and its fields are the one definition of it: every
field is declared with :func:`~partitioners.parallel3d.spec_fields.spec_field` (its
default, a one-line description, its limits), and the class's one ``__post_init__``
checks them all, then what ties fields together, raising
:class:`partitioners.errors.InvalidInput` with the field's dotted path
(``model.moe.num_experts``). :func:`~partitioners.parallel3d.spec_fields.spec_from_mapping`
builds any of them from a JSON-shaped mapping, and the HTTP schema
(``service.schemas.parallel``) is generated from the same declarations, so a limit or
a default is stated here once. Units are in the names (``_bytes``, ``_per_s``, ``_s``).

Shorthand forms a mapping may use stand for fields: a model's Hugging Face
``config.json`` (:mod:`partitioners.parallel3d.huggingface`), a training
``software`` generation (:data:`~partitioners.parallel3d.presets.SOFTWARE_PRESETS`),
and a cluster's ``preset`` or ``gpu`` with a node count, or a shared inventory
(``"groups": [...]``, or ``"inventory"``) read by :func:`cluster_from_inventory`
(identical nodes only). The GPU and node presets of
:mod:`partitioners.parallel3d.presets` keep what the planner needs beyond the inventory
(SM count, GEMM ceiling) and win for ``dgx-a100``/``dgx-h100``/... because the
inventory caps presets at 4,096 nodes while this planner must answer for 100,000 GPUs.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any, ClassVar

import numpy as np
import numpy.typing as npt

from partitioners.errors import InvalidInput
from partitioners.hardware.inventory import (
    BANDWIDTH_RANGE_BYTES_PER_S,
    CAPACITY_RANGE_BYTES,
    LATENCY_RANGE_S,
    PEAK_FLOPS_RANGE,
    Inventory,
    inventory_from_json,
    preset_inventory,
    within,
)
from partitioners.hardware.inventory import PRESETS as INVENTORY_PRESETS
from partitioners.parallel3d.arrays import FloatArray
from partitioners.parallel3d.huggingface import model_fields_from_huggingface
from partitioners.parallel3d.presets import (
    FLASH_ATTENTION_SPEED,
    GPU_ARCHITECTURES,
    GPU_SPECS,
    NODE_PRESETS,
    RANK_ORDERS,
    SOFTWARE_PRESETS,
    gpu_spec_by_name,
)
from partitioners.parallel3d.schedules import PIPELINE_SCHEDULES
from partitioners.parallel3d.spec_fields import (
    MAX_COUNT,
    as_list,
    check_declared_fields,
    is_finite_number,
    positive_float,
    positive_int,
    reject_unknown,
    spec_field,
)

__all__ = [
    "ACTIVATION_FRAGMENTATION",
    "MAX_COUNT",
    "MAX_LAYERS",
    "MAX_EXPERTS",
    "MAX_NODES",
    "MAX_GPUS_PER_NODE",
    "MAX_WIDTH",
    "MAX_HEADS",
    "MAX_TOKENS",
    "MAX_PEAK_DTYPES",
    "MAX_EVALUATED_LAYOUTS",
    "MAX_TOP_K",
    "MAX_RANK_MAP_RANKS",
    "PRECISIONS",
    "OPTIMIZERS",
    "FP8_SCALINGS",
    "EXPERT_DISPATCH_MODES",
    "RECOMPUTE_MODES",
    "ZERO_STAGES",
    "GRADIENT_BYTES_PER_PARAM",
    "FLASH_ATTENTION_VERSIONS",
    "MoESpec",
    "MLASpec",
    "AttentionProjection",
    "ModelSpec",
    "ClusterSpec",
    "TrainingSpec",
    "Constraints",
    "LayoutSpec",
    "LAYOUT_FIELDS",
    "kv_shard_count",
    "cluster_from_inventory",
    "check_precision_runs",
    "flash_attention_speed",
]

# --------------------------------------------------------------------------- limits and choices

# The largest counts accepted: beyond any model or cluster built, and small enough that
# enumerating their divisors stays instant.
MAX_LAYERS = 100_000
MAX_EXPERTS = 65_536
MAX_NODES = 100_000
MAX_GPUS_PER_NODE = 1024
# Power of one GPU, in watts: the catalogue's largest is 1,200 W (a GB200 NVL72 Blackwell
# GPU, partitioners.hardware.catalogue [POWER]); 10 kW bounds any one device.
MAX_POWER_W = 10_000.0
MAX_WIDTH = 10**6  # hidden size, latent ranks, expert FFN width
MAX_HEADS = 100_000  # attention heads, KV heads, a head's width
MAX_TOKENS = 10**8  # sequence length, vocabulary, batch, windows and chunks
MAX_PEAK_DTYPES = 16  # entries of cluster.peak_flops_per_s
# Layouts one request may ask to predict ("evaluate"); each is a small search of its own.
MAX_EVALUATED_LAYOUTS = 64
# Ranked candidates a search returns, and ranks of a rank map an answer carries.
MAX_TOP_K = 100
MAX_RANK_MAP_RANKS = 200_000

PRECISIONS: tuple[str, ...] = ("bf16", "fp16", "fp8")
OPTIMIZERS: tuple[str, ...] = ("adam", "adamw")
FP8_SCALINGS: tuple[str, ...] = ("delayed", "current")
EXPERT_DISPATCH_MODES: tuple[str, ...] = ("all-to-all", "node-deduplicated")
# Recomputation variants: "selective" is Megatron's (Korthikanti et al. 2022: the attention
# core, or under flash attention the cheap element-wise outputs); "full" recomputes whole
# blocks from their input (Megatron's full granularity, the per-block checkpointing of FSDP
# stacks, torchtitan's mode "full"); "op-sac" is torchtitan's per-operator selective
# checkpointing (mode "selective", selective_ac_option "op": the outputs of attention and of
# every other matmul saved, the rest recomputed).
RECOMPUTE_MODES: tuple[str, ...] = ("none", "selective", "full", "op-sac")
ZERO_STAGES: tuple[int, ...] = (0, 1, 2, 3)
GRADIENT_BYTES_PER_PARAM: tuple[int, ...] = (2, 4)
FLASH_ATTENTION_VERSIONS: tuple[int, ...] = (1, 2, 3)
# Activations are allocated and freed every micro-batch in blocks of many sizes; the
# caching allocator's reserved-but-unusable share is 10-30% in LLM training
# (Guo et al., "GMLake", ASPLOS 2024). Counted at the low end on activations unless a
# request states its own (``training.activation_fragmentation``); the planner notes
# layouts that would not fit at the high end (memory.ACTIVATION_FRAGMENTATION_HIGH).
ACTIVATION_FRAGMENTATION = 0.10


def _refuse(root: str, name: str, detail: str, code: str) -> InvalidInput:
    """The error for a field of a spec, by its path under the spec's root."""
    return InvalidInput(detail, field=f"{root}.{name}" if name else root, code=code)


@dataclass(frozen=True)
class MoESpec:
    """Mixture-of-Experts block: routed experts, top-k, expert FFN width, shared experts."""

    ROOT: ClassVar[str] = "model.moe"

    num_experts: int = spec_field(kind="count", le=MAX_EXPERTS, doc="Routed experts per MoE layer.")
    experts_per_token: int = spec_field(kind="count", le=1024, doc="Experts each token is routed to (top-k).")
    expert_ffn_hidden_size: int = spec_field(kind="count", le=MAX_WIDTH, doc="Hidden width of one expert's FFN.")
    shared_experts: int = spec_field(
        0, kind="count", ge=0, le=1024, doc="Experts every token passes through beside the routed ones."
    )
    # e.g. DeepSeek-V3 keeps its first three layers dense.
    moe_layers: tuple[int, ...] | None = spec_field(
        None, kind="layers", doc="Indices of the MoE layers; default every layer."
    )
    # Group-limited routing: the experts are split into ``num_groups`` consecutive groups
    # and a token's experts come from its ``group_topk`` best groups (Megatron-Core's
    # --moe-router-num-groups / --moe-router-group-topk, Hugging Face's n_group /
    # topk_group). DeepSeek-V3 has 8 and 4: with its 8 expert-parallel nodes, one group a
    # node, a token reaches at most 4 nodes ("node-limited routing", DeepSeek-V3 Technical
    # Report, Sec. 2.1.2). None: no limit. It saves network bytes only with
    # ``TrainingSpec.expert_dispatch = "node-deduplicated"``.
    num_groups: int | None = spec_field(
        None,
        kind="count",
        le=MAX_EXPERTS,
        doc="Group-limited routing: expert groups (DeepSeek-V3: 8; Megatron --moe-router-num-groups).",
    )
    group_topk: int | None = spec_field(
        None,
        kind="count",
        le=MAX_EXPERTS,
        doc="Groups a token's experts come from (DeepSeek-V3: 4; Megatron --moe-router-group-topk).",
    )

    def __post_init__(self) -> None:
        check_declared_fields(self)
        root = self.ROOT
        if self.experts_per_token > self.num_experts:
            raise _refuse(
                root,
                "experts_per_token",
                f"experts_per_token {self.experts_per_token} exceeds num_experts {self.num_experts}",
                "topk-above-experts",
            )
        if (self.num_groups is None) != (self.group_topk is None):
            raise _refuse(
                root,
                "group_topk" if self.group_topk is None else "num_groups",
                f"{root}.num_groups and {root}.group_topk come together",
                "missing-field",
            )
        # both or neither are set (checked above); naming both lets the checker see it
        if (
            self.num_groups is not None
            and self.group_topk is not None
            and (self.num_experts % self.num_groups or self.group_topk > self.num_groups)
        ):
            raise _refuse(
                root,
                "num_groups",
                f"num_groups {self.num_groups} must divide num_experts "
                f"{self.num_experts} and group_topk {self.group_topk} must not exceed it",
                "groups-do-not-divide-experts",
            )


@dataclass(frozen=True)
class MLASpec:
    """Multi-head latent attention (DeepSeek-AI, "DeepSeek-V2", 2024, Sec. 2.1).

    Keys and values come from one shared latent of ``kv_lora_rank`` per token (plus a
    ``qk_rope_head_dim``-wide rotary key shared by all heads), queries from a latent of
    ``q_lora_rank`` (None: a full-rank query projection). Per head, queries and keys
    are ``qk_nope_head_dim + qk_rope_head_dim`` wide and values ``v_head_dim``; in
    training the up-projections materialise them per head (Megatron-Core's
    MLASelfAttention). Field names are the Hugging Face config's; DeepSeek-V3 has
    1536 / 512 / 128 / 64 / 128.
    """

    ROOT: ClassVar[str] = "model.mla"

    kv_lora_rank: int = spec_field(kind="count", le=MAX_WIDTH, doc="Width of the shared key-value latent.")
    qk_nope_head_dim: int = spec_field(kind="count", le=MAX_HEADS, doc="Per-head query-key width without rotary.")
    qk_rope_head_dim: int = spec_field(
        kind="count", ge=0, le=MAX_HEADS, doc="Width of the rotary key shared by all heads."
    )
    v_head_dim: int = spec_field(kind="count", le=MAX_HEADS, doc="Per-head value width.")
    q_lora_rank: int | None = spec_field(
        None, kind="count", le=MAX_WIDTH, doc="Width of the query latent; None: a full-rank query projection."
    )

    def __post_init__(self) -> None:
        check_declared_fields(self)


def kv_shard_count(tp: FloatArray | float, kv_heads: int) -> FloatArray:
    """How many ways tensor parallelism splits K and V: ``tp`` up to the KV head count.

    With more tensor-parallel ranks than KV heads (multi-query attention, or GQA with
    few groups) each KV head is replicated on ``tp / kv_heads`` ranks, every rank
    projecting and keeping the KV head its query heads read. That is how StarCoder's
    multi-query attention ran at tp 4 (bigcode-project/Megatron-LM, ``ParallelAttention``:
    the key-value linear is a plain linear on every tensor-parallel rank), and how it
    is costed here. Megatron-Core accepts such layouts since 0.16 (``num_query_groups``
    below the tensor-parallel size) by another route, which is not modelled: the fused
    QKV weight stays split by rows and each replica set all-gathers the QKV activation.
    The replicated KV weights' gradient all-reduce across the tensor group
    (``h x 2 x head width`` per layer, like the LayerNorm gains') is left out.
    """
    shards: FloatArray = np.minimum(np.asarray(tp, dtype=float), kv_heads)
    return shards


@dataclass(frozen=True)
class AttentionProjection:
    """One linear of the attention block and how tensor parallelism splits it.

    ``split`` is "column" (output features sharded, Megatron's ColumnParallelLinear),
    "row" (input features sharded, RowParallelLinear) or "replicated" (whole on every
    tensor-parallel rank, as MLA's down-projections are in Megatron-Core). ``reads`` says
    what its input is: "norm" (the LayerNorm output), "latent" (an MLA latent, after its
    RMSNorm) or "heads" (the attention heads' output).
    """

    in_width: int
    out_width: int
    split: str
    reads: str
    # Of ``out_width``, the K and V columns of a fused QKV projection, and how many KV heads
    # they hold. A column split hands every rank whole KV heads, so past ``kv_heads`` ranks
    # they are replicated, not cut (:func:`kv_shard_count`).
    kv_out_width: int = 0
    kv_heads: int = 1

    def out_per_rank(self, tp: FloatArray | float) -> FloatArray | float:
        """Output features one tensor-parallel rank computes."""
        if self.split != "column":
            return self.out_width
        tp = np.asarray(tp, dtype=float)
        return (self.out_width - self.kv_out_width) / tp + self.kv_out_width / kv_shard_count(tp, self.kv_heads)

    def in_per_rank(self, tp: FloatArray | float) -> FloatArray | float:
        """Input features one tensor-parallel rank reads."""
        return self.in_width / np.asarray(tp, dtype=float) if self.split == "row" else self.in_width


# MLASpec's fields, named as a Hugging Face config names them
_MLA_FIELD_NAMES = ("kv_lora_rank", "q_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")


@dataclass(frozen=True)
class ModelSpec:
    """Decoder-only transformer shape (GPT/Llama family), as Megatron-LM arguments name it.

    A mapping may instead give ``huggingface_config`` (a model's ``config.json``, read
    by :mod:`partitioners.parallel3d.huggingface`) and ``seq_length``.
    """

    ROOT: ClassVar[str] = "model"

    num_layers: int = spec_field(kind="count", le=MAX_LAYERS, doc="Transformer layers.")
    hidden_size: int = spec_field(kind="count", le=MAX_WIDTH, doc="Width of the residual stream.")
    num_attention_heads: int = spec_field(kind="count", le=MAX_HEADS, doc="Query heads.")
    seq_length: int = spec_field(kind="count", le=MAX_TOKENS, doc="Training sequence length in tokens.")
    vocab_size: int = spec_field(kind="count", le=MAX_TOKENS, doc="Vocabulary size.")
    num_kv_heads: int | None = spec_field(
        None,
        kind="count",
        le=MAX_HEADS,
        doc="KV heads (GQA groups; 1: multi-query attention); default "
        "num_attention_heads. Past this many tensor-parallel ranks each KV head is replicated.",
    )
    ffn_hidden_size: int | None = spec_field(
        None, kind="count", le=10 * MAX_WIDTH, doc="Hidden width of the MLP; default 4 x hidden_size."
    )
    gated_mlp: bool = spec_field(False, kind="flag", doc="SwiGLU (Llama): three FFN matrices instead of two.")
    # Attention and MLP read the same layer input and their outputs are added to it
    # together, x + attn(norm(x)) + mlp(norm(x)) (GPT-J; GPT-NeoX ``use_parallel_residual``;
    # PaLM's "parallel layers", Chowdhery et al. 2022, Sec. 2; Falcon ``parallel_attn``):
    # the two row-parallel outputs are summed before one tensor-parallel reduction.
    parallel_attention_mlp: bool = spec_field(
        False,
        kind="flag",
        doc="Attention and MLP read the same input and are summed before one tensor-parallel "
        "reduction (GPT-J, GPT-NeoX use_parallel_residual, PaLM, Falcon parallel_attn).",
    )
    tie_embeddings: bool = spec_field(False, kind="flag", doc="The output layer shares the input embedding.")
    # GPT-2/3 learn an s x h position table (SC21 eq. 2's ``s`` term); Megatron-LM keeps it
    # on the first stage, whole on every tensor-parallel rank. Llama's rotary
    # embeddings have no parameters.
    learned_position_embeddings: bool = spec_field(
        False, kind="flag", doc="GPT-2/3-style learned position table (s x h)."
    )
    moe: MoESpec | None = spec_field(None, kind="custom", doc="Mixture-of-Experts block; None: a dense model.")
    # Width of one attention head (Megatron-LM's ``--kv-channels``, Hugging Face's
    # ``head_dim``). None = hidden_size / num_attention_heads; Qwen3 and Gemma set it
    # apart, so their query and projection widths differ from the hidden size.
    head_dim: int | None = spec_field(
        None, kind="count", le=MAX_HEADS, doc="Width of one attention head; default hidden_size / heads."
    )
    mla: MLASpec | None = spec_field(
        None,
        kind="custom",
        doc="Multi-head latent attention (DeepSeek-V2/V3), named as in the Hugging Face config.",
    )
    # Multi-token prediction depth (DeepSeek-V3: 1). Each module predicts one token
    # further ahead: the final hidden state and the next token's embedding, normed and
    # concatenated, are projected from 2h to h, run through one more transformer layer
    # (of the last layer's kind) and the shared output head (DeepSeek-V3 Technical
    # Report, Sec. 2.2). It runs on the last pipeline stage, which then also keeps a
    # copy of the embedding, as Megatron-Core's MTP does.
    mtp_layers: int = spec_field(
        0,
        kind="count",
        ge=0,
        le=100,
        doc="Multi-token prediction depth (DeepSeek-V3: 1), run on the last pipeline stage.",
    )
    # Sliding-window attention (Mistral 7B v0.1, Gemma 2/3, Phi-3, StarCoder2): each query
    # attends to the ``sliding_window`` latest tokens only, on the ``sliding_window_layers``
    # (indices; None = every layer). The other layers attend to the whole causal prefix.
    # Context-parallel exchanges are counted as for full attention (Transformer Engine's
    # ring passes every K/V chunk whatever the window).
    sliding_window: int | None = spec_field(
        None,
        kind="count",
        le=MAX_TOKENS,
        doc="Sliding-window attention: each query attends to this many latest "
        "tokens (Mistral 7B v0.1: 4096) on sliding_window_layers.",
    )
    sliding_window_layers: tuple[int, ...] | None = spec_field(
        None, kind="layers", doc="Indices of the sliding-window layers; default every layer."
    )
    # Chunked attention (Llama 4's ``attention_chunk_size``, "iRoPE"): the sequence is cut
    # into chunks of this many tokens and a query attends causally inside its own chunk,
    # on the ``chunked_attention_layers`` (None = every layer).
    attention_chunk_size: int | None = spec_field(
        None,
        kind="count",
        le=MAX_TOKENS,
        doc="Chunked attention: queries attend causally inside chunks of this "
        "many tokens (Llama 4: 8192) on chunked_attention_layers.",
    )
    chunked_attention_layers: tuple[int, ...] | None = spec_field(
        None, kind="layers", doc="Indices of the chunked-attention layers; default every layer."
    )

    def __post_init__(self) -> None:
        """Check the fields, then the shape they make together.

        Raises
        ------
        InvalidInput
            When a size is not a positive integer, the hidden size is not a multiple of
            the head count (and no ``head_dim`` is given), the KV heads do not divide
            the query heads, local-attention layers are missing their size or overlap,
            or an MoE layer index is out of range.
        """
        check_declared_fields(self)
        for name, kind in (("moe", MoESpec), ("mla", MLASpec)):
            if getattr(self, name) is not None and not isinstance(getattr(self, name), kind):
                raise _refuse("model", name, f"model.{name} must be an object", "not-an-object")
        if self.mla is not None and (self.head_dim is not None or self.kv_heads != self.num_attention_heads):
            raise _refuse(
                "model",
                "mla",
                "model.mla sets the head widths and gives every head its own keys and "
                "values; leave head_dim and num_kv_heads out",
                "mla-with-head-fields",
            )
        if self.head_dim is None and self.mla is None and self.hidden_size % self.num_attention_heads:
            raise _refuse(
                "model",
                "hidden_size",
                f"hidden_size {self.hidden_size} is not a multiple of num_attention_heads {self.num_attention_heads}",
                "heads-do-not-divide-hidden",
            )
        if self.num_attention_heads % self.kv_heads:
            raise _refuse(
                "model",
                "num_kv_heads",
                f"num_kv_heads {self.kv_heads} must divide num_attention_heads {self.num_attention_heads} (GQA groups)",
                "kv-heads-do-not-divide-heads",
            )
        self._check_local_attention()
        if (
            self.moe is not None
            and self.moe.moe_layers is not None
            and any(i >= self.num_layers for i in self.moe.moe_layers)
        ):
            raise _refuse(
                "model",
                "moe.moe_layers",
                f"moe_layers indexes a layer >= num_layers ({self.num_layers})",
                "layer-out-of-range",
            )

    def _check_local_attention(self) -> None:
        """Sliding-window and chunked layers name existing layers, each under its own size, none under both."""
        kinds = (
            ("sliding_window", "sliding_window_layers", "the window's width in tokens"),
            ("attention_chunk_size", "chunked_attention_layers", "the chunk's length in tokens"),
        )
        for size_name, layers_name, size_meaning in kinds:
            layers = getattr(self, layers_name)
            if layers is None:
                continue
            if getattr(self, size_name) is None:
                raise _refuse(
                    "model", size_name, f"model.{layers_name} needs model.{size_name}, {size_meaning}", "missing-field"
                )
            if any(i >= self.num_layers for i in layers):
                raise _refuse(
                    "model",
                    layers_name,
                    f"{layers_name} indexes a layer >= num_layers ({self.num_layers})",
                    "layer-out-of-range",
                )
        if self.sliding_window is not None and self.attention_chunk_size is not None:
            every = set(range(self.num_layers))
            windowed = every if self.sliding_window_layers is None else set(self.sliding_window_layers)
            chunked = every if self.chunked_attention_layers is None else set(self.chunked_attention_layers)
            if windowed & chunked:
                raise _refuse(
                    "model",
                    "chunked_attention_layers",
                    f"layers {sorted(windowed & chunked)[:8]} are "
                    "both sliding-window and chunked; a layer attends one way",
                    "attention-kinds-overlap",
                )

    @classmethod
    def from_shorthand(cls, data: Mapping[str, Any], where: str) -> Mapping[str, Any]:
        """A mapping's model fields: a Hugging Face ``config.json`` read into them, or the mapping itself.

        MLA's widths may be given beside the other fields under the Hugging Face config's own
        names (``kv_lora_rank``, ``q_lora_rank``, ``qk_nope_head_dim``, ``qk_rope_head_dim``,
        ``v_head_dim``), as a DeepSeek config states them; they are read as ``mla``.
        """
        if "huggingface_config" not in data:
            flat = [name for name in _MLA_FIELD_NAMES if name in data]
            if not flat:
                return data
            if data.get("mla") is not None:
                raise InvalidInput(
                    f"{where}.{flat[0]} is an MLA width given beside {where}.mla: give the widths in one place",
                    field=f"{where}.{flat[0]}",
                    code="conflicting-fields",
                )
            rest = {k: v for k, v in data.items() if k not in _MLA_FIELD_NAMES}
            return {**rest, "mla": {name: data[name] for name in flat}}
        reject_unknown(data, {"huggingface_config", "seq_length"}, where)
        if "seq_length" not in data:
            raise InvalidInput(
                f"{where}.seq_length is required next to {where}.huggingface_config: the sequence "
                "length the run trains at (max_position_embeddings is the longest the model "
                "supports)",
                field=f"{where}.seq_length",
                code="missing-field",
            )
        return {**model_fields_from_huggingface(data["huggingface_config"]), "seq_length": data["seq_length"]}

    def to_dict(self) -> dict[str, Any]:
        """The shape as ``spec_from_mapping(ModelSpec, ...)`` reads it (fields left at None omitted).

        E.g. to echo the shape a Hugging Face config was read as.
        """

        def plain(value: Any) -> Any:
            if isinstance(value, (MoESpec, MLASpec)):
                return {
                    f.name: plain(getattr(value, f.name)) for f in fields(value) if getattr(value, f.name) is not None
                }
            return list(value) if isinstance(value, tuple) else value

        return {f.name: plain(getattr(self, f.name)) for f in fields(self) if getattr(self, f.name) is not None}

    @property
    def mtp_layer_is_moe(self) -> bool:
        """Whether the multi-token-prediction layers are MoE layers (as the model's last layer is)."""
        if self.moe is None:
            return False
        return self.moe.moe_layers is None or self.num_layers - 1 in self.moe.moe_layers

    @property
    def kv_heads(self) -> int:
        return self.num_kv_heads or self.num_attention_heads

    def kv_shards(self, tp: FloatArray | float) -> FloatArray:
        """How many ways tensor parallelism splits this model's K and V (:func:`kv_shard_count`)."""
        return kv_shard_count(tp, self.kv_heads)

    @property
    def ffn(self) -> int:
        return self.ffn_hidden_size or 4 * self.hidden_size

    @property
    def head_size(self) -> int:
        return self.head_dim or self.hidden_size // self.num_attention_heads

    @property
    def query_width(self) -> int:
        """Width of Q over all heads: ``num_attention_heads`` times the query-key head width."""
        if self.mla is not None:
            return self.num_attention_heads * (self.mla.qk_nope_head_dim + self.mla.qk_rope_head_dim)
        return self.num_attention_heads * self.head_size

    @property
    def key_width(self) -> int:
        """Width of K per token: the KV heads (GQA) times the head width; every head's under MLA."""
        return self.query_width if self.mla is not None else self.kv_heads * self.head_size

    @property
    def value_width(self) -> int:
        """Width of V per token (under MLA, ``num_attention_heads * v_head_dim``)."""
        return self.num_attention_heads * self.mla.v_head_dim if self.mla is not None else self.key_width

    @property
    def context_width(self) -> int:
        """Width of the attention output that enters the output projection."""
        return self.num_attention_heads * self.mla.v_head_dim if self.mla is not None else self.query_width

    @property
    def latent_width(self) -> int:
        """Per-token width of MLA's down-projected latents (query, key-value, rotary key); 0 otherwise."""
        if self.mla is None:
            return 0
        return (self.mla.q_lora_rank or 0) + self.mla.kv_lora_rank + self.mla.qk_rope_head_dim

    @property
    def attention_projections(self) -> tuple[AttentionProjection, ...]:
        """The attention block's linears in forward order (fused QKV and output projection for MHA/GQA)."""
        h = self.hidden_size
        if self.mla is None:
            return (
                AttentionProjection(
                    h,
                    self.query_width + 2 * self.key_width,
                    "column",
                    "norm",
                    kv_out_width=2 * self.key_width,
                    kv_heads=self.kv_heads,
                ),
                AttentionProjection(self.query_width, h, "row", "heads"),
            )
        mla = self.mla
        query = (
            (
                AttentionProjection(h, mla.q_lora_rank, "replicated", "norm"),
                AttentionProjection(mla.q_lora_rank, self.query_width, "column", "latent"),
            )
            if mla.q_lora_rank
            else (AttentionProjection(h, self.query_width, "column", "norm"),)
        )
        return query + (
            AttentionProjection(h, mla.kv_lora_rank + mla.qk_rope_head_dim, "replicated", "norm"),
            AttentionProjection(
                mla.kv_lora_rank, self.num_attention_heads * (mla.qk_nope_head_dim + mla.v_head_dim), "column", "latent"
            ),
            AttentionProjection(self.context_width, h, "row", "heads"),
        )

    def _local_layer_count(self, size: int | None, layers: tuple[int, ...] | None) -> int:
        if size is None:
            return 0
        return self.num_layers if layers is None else len(set(layers))

    @property
    def attention_score_share(self) -> float:
        """Mean share of a causal attention's score work that the model's layers do.

        1 without local attention. Query ``i`` (from 1) of a causal layer scores ``i``
        keys: ``s(s+1)/2`` over a sequence of ``s``. Under a sliding window ``w`` it scores
        ``min(i, w)``, ``w(w+1)/2 + (s-w)w`` in all (Beltagy et al., "Longformer", 2020,
        Sec. 3.1: linear in ``s``); inside chunks of ``c`` it scores its position in the
        chunk, ``c(c+1)/2`` a whole chunk. Score FLOPs and the flash-attention kernels'
        time scale by the share; a kernel that materialises the whole ``s x s`` matrix
        and masks it (no flash attention) saves nothing.
        """
        s = self.seq_length
        causal = s * (s + 1) / 2
        share = 1.0
        windowed = self._local_layer_count(self.sliding_window, self.sliding_window_layers)
        w = self.sliding_window
        if windowed and w is not None and w < s:  # windowed > 0 only with a window
            share -= windowed / self.num_layers * (1.0 - (w * (w + 1) / 2 + (s - w) * w) / causal)
        chunked = self._local_layer_count(self.attention_chunk_size, self.chunked_attention_layers)
        c = self.attention_chunk_size
        if chunked and c is not None and c < s:  # chunked > 0 only with a chunk size
            whole, rest = divmod(s, c)
            share -= chunked / self.num_layers * (1.0 - (whole * c * (c + 1) / 2 + rest * (rest + 1) / 2) / causal)
        return share

    @property
    def num_moe_layers(self) -> int:
        if self.moe is None:
            return 0
        if self.moe.moe_layers is None:
            return self.num_layers
        return len(set(self.moe.moe_layers))


# The GPU whose measured kernel ceilings stand for its generation when a cluster is given
# by its figures and an architecture only.
_ARCHITECTURE_REFERENCE_GPU = {"ampere": "a100-80gb", "hopper": "h100-sxm", "blackwell": "b200"}
# the cluster fields a mapping must give when it names neither a preset nor a GPU
_CLUSTER_FIGURES = (
    "gpus_per_node",
    "num_nodes",
    "peak_flops_per_s",
    "memory_bytes",
    "intra_node_bandwidth_bytes_per_s",
    "inter_node_bandwidth_bytes_per_s",
)


@dataclass(frozen=True)
class ClusterSpec:
    """Homogeneous GPU cluster: ``num_nodes`` nodes of ``gpus_per_node`` GPUs.

    Bandwidths per GPU per direction; latencies are the alpha term of the shared
    alpha-beta collectives (``partitioners.hardware.collectives``). A mapping may name a
    ``preset`` (``{"preset": "dgx-h100", "nodes": 8}``) or a ``gpu``
    (``{"gpu": "a100-80gb", "num_nodes": 4}``) whose figures the fields it gives amend,
    or a shared inventory (``groups``, or ``inventory``) of identical nodes.
    """

    ROOT: ClassVar[str] = "cluster"

    gpus_per_node: int = spec_field(kind="count", le=MAX_GPUS_PER_NODE, doc="GPUs per node (NVLink domain).")
    num_nodes: int = spec_field(kind="count", le=MAX_NODES, doc="Nodes.")
    peak_flops_per_s: Mapping[str, float] = spec_field(
        kind="rates",
        le=MAX_PEAK_DTYPES,
        doc='Dense tensor-core peak FLOP/s of one GPU by dtype, e.g. {"bf16": 9.89e14}.',
    )
    memory_bytes: float = spec_field(kind="positive", doc="Memory of one GPU in bytes.")
    intra_node_bandwidth_bytes_per_s: float = spec_field(
        kind="positive", doc="Intra-node (NVLink) bandwidth per GPU per direction."
    )
    # infinite for a one-node cluster read from an inventory without an inter-node link
    inter_node_bandwidth_bytes_per_s: float = spec_field(
        kind="custom", doc="Inter-node (InfiniBand) bandwidth per GPU per direction."
    )
    # Without a figure, a mapping assumes A100-class HBM per unit of compute (2 TB/s per
    # 312 TFLOP/s).
    hbm_bandwidth_bytes_per_s: float = spec_field(kind="positive", doc="HBM bandwidth of one GPU.")
    name: str = spec_field("custom", kind="name", doc="What the cluster is called in answers.")
    sm_count: int = spec_field(108, kind="count", le=10_000, doc="Streaming multiprocessors per GPU.")
    gemm_efficiency_max: float = spec_field(
        0.8, kind="positive", le=1, why="(a fraction of peak)", doc="Best share of peak a large GEMM reaches."
    )
    # NCCL small-message latency per ring step, intra-node NVLink vs inter-node
    # InfiniBand: a few microseconds each (nccl-tests small-message all-reduce times).
    intra_node_latency_s: float = spec_field(
        2e-6,
        kind="number",
        ge=LATENCY_RANGE_S[0],
        le=LATENCY_RANGE_S[1],
        doc="Intra-node latency per ring step, in seconds.",
    )
    inter_node_latency_s: float = spec_field(
        5e-6,
        kind="number",
        ge=LATENCY_RANGE_S[0],
        le=LATENCY_RANGE_S[1],
        doc="Inter-node latency per ring step, in seconds.",
    )
    # NVLink SHARP all-reduce speed-up over the ring within a full node (see GPUSpec).
    nvls_allreduce_speedup: float = spec_field(
        1.0,
        kind="number",
        ge=1,
        le=10,
        why="(a speed-up over the ring) from 1 to 10",
        doc="In-switch (NVLink SHARP) all-reduce speed-up over the ring.",
    )
    # FP8 GEMM ceiling where it differs from the 16-bit one (see GPUSpec); None: the same.
    fp8_gemm_efficiency_max: float | None = spec_field(
        None,
        kind="positive",
        le=1,
        why="(a fraction of peak)",
        doc="FP8 GEMM ceiling as a fraction of the FP8 peak, if not the 16-bit one.",
    )
    # GPU generation (see GPUSpec); "unknown" for a cluster given by its figures alone.
    architecture: str = spec_field(
        "unknown",
        kind="choice",
        choices=GPU_ARCHITECTURES,
        code="unknown-architecture",
        doc="GPU generation, for which FlashAttention generations run and how fast (a preset or gpu sets it).",
    )

    # Power of one GPU at load (TDP) and held idle by the job, for the energy of a step
    # (partitioners.parallel3d.energy); a preset or gpu sets them from the catalogue.
    board_power_w: float | None = spec_field(
        None,
        kind="positive",
        le=MAX_POWER_W,
        why="(watts)",
        doc="Power of one GPU running kernels (board power, TDP), in watts; a preset or gpu sets it.",
    )
    idle_power_w: float | None = spec_field(
        None,
        kind="number",
        ge=0,
        le=MAX_POWER_W,
        why=f"(watts) from 0 to {MAX_POWER_W:g}",
        doc="Power of one GPU held by the job but idle (CUDA context up), in watts; a preset or gpu sets it.",
    )

    def __post_init__(self) -> None:
        """Check the fields and that the rates lie in the ranges an inventory accepts."""
        check_declared_fields(self)
        if (self.board_power_w is None) != (self.idle_power_w is None):
            raise InvalidInput(
                "cluster.board_power_w and cluster.idle_power_w go together: give both or neither",
                field="cluster.idle_power_w" if self.idle_power_w is None else "cluster.board_power_w",
                code="missing-field",
            )
        if self.board_power_w is not None and self.idle_power_w is not None and self.idle_power_w > self.board_power_w:
            raise InvalidInput(
                f"cluster.idle_power_w ({self.idle_power_w:g} W) is above cluster.board_power_w "
                f"({self.board_power_w:g} W)",
                field="cluster.idle_power_w",
                code="out-of-range",
            )
        inter = self.inter_node_bandwidth_bytes_per_s
        if not (isinstance(inter, float) and math.isinf(inter) and inter > 0 and self.num_nodes == 1):
            object.__setattr__(
                self,
                "inter_node_bandwidth_bytes_per_s",
                positive_float(inter, "cluster.inter_node_bandwidth_bytes_per_s"),
            )
        # a one-node cluster from an inventory has no inter-node link (infinite bandwidth)
        for dtype, peak in self.peak_flops_per_s.items():
            within(peak, f"cluster.peak_flops_per_s.{dtype}", PEAK_FLOPS_RANGE, "FLOP/s")
        for name in (
            "hbm_bandwidth_bytes_per_s",
            "intra_node_bandwidth_bytes_per_s",
            "inter_node_bandwidth_bytes_per_s",
        ):
            value = getattr(self, name)
            if not (name.startswith("inter") and math.isinf(value) and self.num_nodes == 1):
                within(value, f"cluster.{name}", BANDWIDTH_RANGE_BYTES_PER_S, "B/s")
        within(self.memory_bytes, "cluster.memory_bytes", CAPACITY_RANGE_BYTES, "bytes")

    @property
    def num_gpus(self) -> int:
        return self.gpus_per_node * self.num_nodes

    @classmethod
    def from_shorthand(cls, data: Mapping[str, Any], where: str) -> Mapping[str, Any] | ClusterSpec:
        """A mapping's cluster fields: a preset's or GPU's figures amended by those given, or an inventory's."""
        if "groups" in data:
            return cluster_from_inventory(inventory_from_json(data))
        if "inventory" in data:
            reject_unknown(data, {"inventory"}, where)
            return cluster_from_inventory(inventory_from_json(data["inventory"]))
        reject_unknown(data, {f.name for f in fields(cls)} | {"preset", "gpu", "nodes"}, where)
        gpu_name = data.get("gpu")
        if "preset" in data:
            preset = str(data["preset"]).lower()
            if preset not in NODE_PRESETS:
                if preset in INVENTORY_PRESETS:
                    # an inventory preset is a whole node description: nothing else may amend it
                    reject_unknown(data, {"preset", "nodes", "num_nodes"}, where)
                    nodes = data.get("nodes", data.get("num_nodes", 1))
                    return cluster_from_inventory(
                        preset_inventory(preset, 1), num_nodes=positive_int(nodes, f"{where}.nodes", maximum=MAX_NODES)
                    )
                known = sorted(set(NODE_PRESETS) | set(INVENTORY_PRESETS))
                raise InvalidInput(
                    f"unknown cluster preset {data['preset']!r}; known: {known}",
                    field=f"{where}.preset",
                    code="unknown-preset",
                )
            if (
                gpu_name is not None
                and gpu_spec_by_name(str(gpu_name)).name != gpu_spec_by_name(NODE_PRESETS[preset]).name
            ):
                raise InvalidInput(
                    f"{where}.gpu={gpu_name!r} conflicts with {where}.preset={data['preset']!r}, "
                    f"whose GPU is {NODE_PRESETS[preset]!r}: give one of them",
                    field=f"{where}.gpu",
                    code="conflicting-fields",
                )
            gpu_name = NODE_PRESETS[preset]
        base: dict[str, Any] = {}
        if gpu_name is not None:
            gpu = gpu_spec_by_name(str(gpu_name))
            base = {
                "name": data.get("preset", gpu.name),
                "gpus_per_node": gpu.gpus_per_node,
                "peak_flops_per_s": dict(gpu.peak_flops_per_s),
                "memory_bytes": gpu.memory_bytes,
                "hbm_bandwidth_bytes_per_s": gpu.hbm_bandwidth_bytes_per_s,
                "intra_node_bandwidth_bytes_per_s": gpu.intra_node_bandwidth_bytes_per_s,
                "inter_node_bandwidth_bytes_per_s": gpu.inter_node_bandwidth_bytes_per_s,
                "sm_count": gpu.sm_count,
                "gemm_efficiency_max": gpu.gemm_efficiency_max,
                "nvls_allreduce_speedup": gpu.nvls_allreduce_speedup,
                "fp8_gemm_efficiency_max": gpu.fp8_gemm_efficiency_max,
                "architecture": gpu.architecture,
                "board_power_w": gpu.board_power_w,
                "idle_power_w": gpu.idle_power_w,
            }
        if gpu_name is None and str(data.get("architecture", "")).lower() in _ARCHITECTURE_REFERENCE_GPU:
            # figures without a GPU name: the kernel ceilings measured on that generation
            # (a GEMM never reaches the datasheet peak, and Hopper's share is lower than
            # Ampere's, see GPUSpec.gemm_efficiency_max), unless the cluster gives its own
            reference = gpu_spec_by_name(_ARCHITECTURE_REFERENCE_GPU[str(data["architecture"]).lower()])
            base = {
                "gemm_efficiency_max": reference.gemm_efficiency_max,
                "fp8_gemm_efficiency_max": reference.fp8_gemm_efficiency_max,
                "sm_count": reference.sm_count,
            }
        merged = {**base, **{k: v for k, v in data.items() if k not in ("preset", "gpu", "nodes")}}
        if "nodes" in data and "num_nodes" not in data:
            merged["num_nodes"] = data["nodes"]
        for name in _CLUSTER_FIGURES:
            if name not in merged:
                raise InvalidInput(
                    f"{where}.{name} is required (or give a preset / gpu)",
                    field=f"{where}.{name}",
                    code="missing-field",
                )
        peaks = merged["peak_flops_per_s"]
        if "hbm_bandwidth_bytes_per_s" not in merged and isinstance(peaks, Mapping):
            peak = max((v for v in peaks.values() if is_finite_number(v)), default=312e12)
            merged["hbm_bandwidth_bytes_per_s"] = 2.039e12 * peak / 312e12
        return merged


@dataclass(frozen=True)
class TrainingSpec:
    """Training settings that fix the work of one optimizer step and the software stack.

    The software flags describe the framework build (Megatron-LM 2021 had no flash
    attention, no sequence parallelism and reduced gradients after the backward
    pass; Megatron-Core today has all three), because they change both time and
    memory; defaults are today's.
    A mapping may name a ``software`` generation
    (:data:`~partitioners.parallel3d.presets.SOFTWARE_PRESETS`) whose flags apply unless given.
    """

    ROOT: ClassVar[str] = "training"

    global_batch_sequences: int = spec_field(
        kind="count", le=MAX_TOKENS, doc="Sequences per optimizer step (the global batch)."
    )
    # The framework generation: its flags are the defaults of the fields below
    # (SOFTWARE_PRESETS) and what it can run bounds the search (SOFTWARE_SEARCH: ZeRO
    # stages, recomputation, uneven stages, context and expert parallelism, rank orders).
    software: str = spec_field(
        "megatron-core",
        kind="choice",
        choices=tuple(SOFTWARE_PRESETS),
        code="unknown-software",
        doc="The framework generation: its behaviour is the default of the flags, and what it can run "
        "bounds the search (megatron-lm-2021: no ZeRO, no uneven stages, full recomputation only; "
        "default megatron-core).",
    )
    # "bf16", "fp16" (with loss scaling, same peak) or "fp8"
    precision: str = spec_field(
        "bf16",
        kind="choice",
        choices=PRECISIONS,
        code="unknown-precision",
        doc="GEMM precision: bf16, fp16 (with loss scaling, same peak) or fp8.",
    )
    optimizer: str = spec_field(
        "adam",
        kind="choice",
        choices=OPTIMIZERS,
        code="unknown-optimizer",
        why=" (only Adam is modelled)",
        doc="Mixed-precision Adam (AdamW's decoupled weight decay keeps the same state).",
    )
    flash_attention: bool = spec_field(True, kind="flag", doc="Flash attention (default on).")
    # Which FlashAttention generation (1, 2 or 3) the stack runs; None: the newest the GPU
    # runs (2 on Ampere, 3 on Hopper), as today's frameworks do. Older ones are slower
    # (FLASH_ATTENTION_SPEED): MosaicML's LLM Foundry A100 table reads within 5% on average
    # with FlashAttention-1, and 67% high at 65,536 tokens with the newest (bench.llm_foundry).
    flash_attention_version: int | None = spec_field(
        None,
        kind="count",
        le=FLASH_ATTENTION_VERSIONS[-1],
        doc="FlashAttention generation the stack runs (default: the newest the GPU runs, 2 on Ampere and 3 on "
        "Hopper); 1 runs at half of 2's speed, 2 at 35/75 of 3's on Hopper.",
    )
    sequence_parallel: bool = spec_field(True, kind="flag", doc="Sequence parallelism (default on).")
    overlap_grad_reduce: bool = spec_field(
        True, kind="flag", doc="Data-parallel reduction under the backward pass (default on)."
    )
    # Tensor-parallel collectives pipelined under GEMMs (Megatron --tp-comm-overlap); opt-in.
    overlap_tp_comm: bool = spec_field(
        False,
        kind="flag",
        doc="Tensor-parallel collectives pipelined under the GEMMs (Megatron --tp-comm-overlap, Transformer "
        "Engine userbuffers; default off).",
    )
    # Under the interleaved schedule, pipeline sends and receives posted asynchronously and
    # waited for only when the next model chunk needs them (Megatron-Core
    # ``overlap_p2p_comm``, which NeMo's and Megatron-Bridge's recipes turn on whenever
    # virtual pipeline stages are used, with ``batch_p2p_comm`` off); 1F1B keeps the
    # batched, synchronised exchange.
    overlap_p2p_comm: bool = spec_field(
        True,
        kind="flag",
        doc="Under the interleaved schedule, pipeline sends and receives run asynchronously under the next model "
        "chunk's computation (Megatron-Core overlap_p2p_comm; default on).",
    )
    # The interleaved schedule may take micro-batches in groups larger than pp, so a
    # micro-batch count that pp does not divide can still interleave (Megatron-Core
    # ``--microbatch-group-size-per-virtual-pipeline-stage``; see
    # parallel3d_stages.microbatch_group_size). Off by default: Megatron-Core's group size
    # defaults to pp ("Default ... to pipeline_parallel_size", ModelParallelConfig), which
    # asks for a multiple of pp as Megatron-LM always did.
    flexible_microbatch_groups: bool = spec_field(
        False,
        kind="flag",
        doc="The interleaved schedule may take micro-batches in groups larger than pp, so a count pp does not "
        "divide still interleaves (default off: its default group is pp).",
    )
    # Backward tensor-parallel collectives of the column-parallel linears launched
    # asynchronously under their GEMMs: the input-gradient all-reduce (reduce-scatter with
    # sequence parallelism) under the weight-gradient GEMM, and with sequence parallelism
    # the input's re-all-gather under the input-gradient GEMM (Megatron-LM
    # ``linear_with_grad_accumulation_and_async_allreduce``, on by default since 2022,
    # ``--no-async-tensor-model-parallel-allreduce`` turns it off). The 2021 code had not.
    overlap_tp_backward: bool = spec_field(
        True,
        kind="flag",
        doc="Backward tensor-parallel collectives overlap the GEMMs (Megatron async all-reduce; default on).",
    )
    # Megatron keeps fp32 "main_grad" buffers (4 B/param); DeepSpeed ZeRO keeps bf16 (2 B).
    grad_bytes_per_param: int = spec_field(
        4,
        kind="count",
        ge=GRADIENT_BYTES_PER_PARAM[0],
        le=GRADIENT_BYTES_PER_PARAM[-1],
        doc="Gradient buffer bytes per parameter: 4 for fp32 accumulation (Megatron's default), 2 with gradients "
        "reduced in bf16 (DeepSpeed).",
    )
    # Caching-allocator waste counted on top of activations (reserved but unusable
    # between the blocks of many sizes a step allocates and frees). A user who measured
    # their stack (torch.cuda.memory_reserved against memory_allocated at the peak)
    # states theirs.
    activation_fragmentation: float = spec_field(
        ACTIVATION_FRAGMENTATION,
        kind="number",
        ge=0,
        le=1,
        why="from 0 (no allocator waste) to 1 (as much again as the activations)",
        doc="Caching-allocator waste counted on top of activations, as a share of them (default 0.10, the low end"
        " GMLake measured).",
    )
    # Weight gradients accumulated inside the weight-gradient GEMM (Megatron-LM
    # ``--gradient-accumulation-fusion``, cuBLAS/CUTLASS ``wgrad_gemm_accum_fp32``, default
    # since 2022). Without it every micro-batch writes a separate gradient that a second
    # kernel adds into the accumulation buffer: extra HBM traffic per parameter and
    # micro-batch (see parallel3d_kernels.gradient_accumulation_time_s).
    gradient_accumulation_fusion: bool = spec_field(
        True,
        kind="flag",
        doc="Weight gradients accumulated inside the weight-gradient GEMM (Megatron --gradient-accumulation-"
        "fusion; default on).",
    )
    # The fp16 optimizer of Megatron-LM before 2022 kept the fp32 copy of every gradient
    # it made for the master weights (``main_param.grad = model_param.main_grad.float()``)
    # from one step to the next: its ``zero_grad`` cleared only "float16_groups &
    # fp32_from_fp32_groups". The later code also frees fp32_from_float16_groups "as a
    # memory optimization" (megatron/optimizer/optimizer.py). With 2-byte gradient buffers
    # that copy is 4 more bytes per parameter through the forward and backward passes;
    # with fp32 buffers ``.float()`` returns the buffer itself and costs nothing.
    fp32_grad_copy_kept: bool = spec_field(
        False,
        kind="flag",
        doc="The fp16 optimizer keeps its fp32 copy of every gradient between steps (Megatron-LM before 2022; "
        "default off).",
    )
    # Megatron-LM before 2022 kept every in-flight micro-batch's pipeline-stage output
    # until that micro-batch's backward; ``deallocate_output_tensor`` (schedules.py)
    # later freed its data right after the send, as only its ``grad_fn`` is needed.
    stage_outputs_kept: bool = spec_field(
        False,
        kind="flag",
        doc="Every in-flight micro-batch's pipeline-stage output is kept until its backward (Megatron-LM before "
        "2022; default off).",
    )
    # PyTorch DistributedDataParallel copies every gradient into its all-reduce buckets
    # unless ``gradient_as_bucket_view=True`` (off by default), which "can reduce peak
    # memory usage, where the saved memory size will be equal to the total gradients
    # size" (torch.nn.parallel.DistributedDataParallel docs): one more gradient's bytes
    # per parameter. Megatron-LM's own DDP and ZeRO-style buffers need no copy.
    ddp_bucket_copy: bool = spec_field(
        False,
        kind="flag",
        doc="PyTorch DDP copies every gradient into its all-reduce buckets (gradient_as_bucket_view off; default off).",
    )
    # Without sequence parallelism every tensor rank holds the whole activation a pipeline
    # stage sends. Megatron-LM's scatter/gather sends each rank's 1/t of it across the
    # stage boundary and all-gathers it over NVLink on the receiving node (Narayanan et al.,
    # SC21, Sec. 4.1; on by default, ``--no-scatter-gather-tensors-in-pipeline`` turns it
    # off, and then each rank sends the whole tensor). With sequence parallelism the
    # activation is already split and this changes nothing.
    pipeline_scatter_gather: bool = spec_field(
        True,
        kind="flag",
        doc="Without sequence parallelism, each tensor rank sends 1/t of a pipeline stage's output and the "
        "receiving node all-gathers it over NVLink (Megatron-LM's default, SC21 Sec. 4.1); off: every rank "
        "sends it whole.",
    )
    # The pipeline schedule (partitioners.parallel3d.schedules): Megatron-LM's 1F1B,
    # interleaved where the search picks virtual stages (default); ZB-H1's deferred weight
    # gradients; DeepSeek's DualPipe (two weight copies, paired chunks) or its half, DualPipeV.
    # What a software generation can run is in SOFTWARE_SEARCH.
    pipeline_schedule: str = spec_field(
        "1f1b",
        kind="choice",
        choices=tuple(PIPELINE_SCHEDULES),
        code="unknown-pipeline-schedule",
        doc="1f1b (Megatron-LM's, interleaved where virtual stages pay; default), zero-bubble (ZB-H1), "
        "dualpipe (DeepSeek-V3: micro-batches from both ends, two weight copies) or dualpipev (its V-shaped half).",
    )
    # Expert-parallel all-to-all (dispatch and combine) hidden under the computation of
    # another micro-batch, a forward chunk paired with a backward one: DeepSeek-V3's
    # DualPipe ("overlap the computation and communication within a pair of individual
    # forward and backward chunks", DeepSeek-AI, DeepSeek-V3 Technical Report, 2024,
    # Sec. 3.2.1) and Megatron-Core's ``--overlap-moe-expert-parallel-comm``. Opt-in.
    overlap_ep_comm: bool = spec_field(
        False,
        kind="flag",
        doc="Expert-parallel all-to-all hidden under another micro-batch's computation (DeepSeek-V3 DualPipe, "
        "Megatron --overlap-moe-expert-parallel-comm; default off).",
    )
    # How tokens reach their experts. "all-to-all": one message per (token, expert) pair,
    # 16-bit (Megatron-Core's alltoall token dispatcher). "node-deduplicated": DeepSeek-V3's
    # dispatch (its DeepEP kernels; Megatron-Core's flex dispatcher): once per destination
    # node over the network, then NVLink to the experts, in FP8 when the run is FP8; see
    # parallel3d_comm.deduplicated_dispatch_time_s. The default is what current MoE stacks run
    # across nodes: DeepSeek's own, and NVIDIA's Megatron-Bridge recipes for DeepSeek-V3 and
    # Qwen3-30B-A3B on H100 (flex dispatcher on DeepEP/HybridEP, perf_recipes/deepseek/h100,
    # perf_recipes/qwen/h100); a stack on the alltoall dispatcher (Megatron-Core's own default,
    # torchtitan) says so.
    expert_dispatch: str = spec_field(
        "node-deduplicated",
        kind="choice",
        choices=EXPERT_DISPATCH_MODES,
        code="unknown-expert-dispatch",
        doc="node-deduplicated: once per destination node over the network, then NVLink (DeepSeek-V3, DeepEP, "
        "Megatron-Core's flex dispatcher; default), FP8 in FP8 runs; all-to-all: one 16-bit message per "
        "(token, expert) pair (Megatron-Core's alltoall dispatcher).",
    )
    # Tokens the busiest expert receives over the mean, which paces the experts' GEMMs and
    # the all-to-all: dropless routing with an auxiliary balancing loss still leaves it
    # ~20% above (the 1.2-1.25 capacity factors budgeted by GShard, Lepikhin et al. 2021,
    # and Switch, Fedus et al. 2022). 1.0 where routing is forced to balance, as
    # Megatron-Bridge's MoE benchmarks do ("we force-balance the token distribution").
    expert_load_imbalance: float = spec_field(
        1.2,
        kind="number",
        ge=1,
        le=64,
        why="from 1 (every expert as busy as the mean) to 64",
        doc="Tokens of the busiest expert over the mean (default 1.2, an auxiliary-loss balanced router; 1 for "
        "force-balanced benchmarks).",
    )
    # Dropout on the attention probabilities and on the two residual branches (GPT-2/3 and
    # Megatron-LM's default, 0.1). Llama, Mistral, Nemotron-4, Falcon and most models trained
    # since 2023 use none, and PyTorch's dropout at p = 0 returns its input without making
    # a mask (aten ``_dropout_impl``), so the default is off: no masks are kept.
    dropout: bool = spec_field(
        False,
        kind="flag",
        doc="Attention and residual dropout (GPT-2/3, Megatron's 0.1): its masks are kept for backward. Default "
        "off, as for Llama-style models.",
    )
    # Selective recomputation (Korthikanti et al. 2022: rebuild the attention scores, or with
    # flash attention the cheap element-wise outputs, in the backward pass). Megatron-LM
    # released it in 2022 (``--recompute-granularity selective``); the 2021 code had only
    # full recomputation (``--checkpoint-activations``).
    selective_recompute: bool = spec_field(
        True,
        kind="flag",
        doc="Selective recomputation is searched (Megatron --recompute-granularity selective, 2022; default on; "
        "off in megatron-lm-2021).",
    )
    # Full recomputation may cover only the first k layers of each model chunk, the others
    # keeping all their activations (Megatron-LM ``--recompute-granularity full
    # --recompute-method block --recompute-num-layers k``, per virtual pipeline stage when
    # interleaved; NeMo's "partial transformer layer recomputation ... when recomputing a
    # few transformer layers help to reduce enough GPU memory for model to fit", NeMo
    # activation-recomputation docs). The planner then recomputes the fewest layers that
    # fit with headroom. The 2021 code recomputed every layer (``--checkpoint-activations``).
    partial_recompute: bool = spec_field(
        True,
        kind="flag",
        doc="Full recomputation may cover only some layers of each model chunk (Megatron --recompute-method "
        "block); the planner then recomputes the fewest that fit (default on).",
    )
    # FP8 runs keep each linear weight in FP8 only, gathered in FP8 by the distributed
    # optimizer from its fp32 master copy (Transformer Engine ``fp8_model_init``;
    # Megatron-Core ``--fp8-param-gather``, set by NeMo's FP8 precision recipes,
    # ``fp8_param_gather=True``, and NVIDIA's FP8 benchmark configs, ``fp8_params: true``).
    # Off: a 16-bit weight plus Transformer Engine's FP8 cast of it. Hopper's FP8 GEMMs
    # read only the "TN" layout, so the backward's transposed weight is a second FP8 copy
    # either way (Transformer Engine, "Handling transposes").
    fp8_params: bool = spec_field(
        True,
        kind="flag",
        doc="FP8 runs keep linear weights in FP8 only and gather them in FP8 (Megatron --fp8-param-gather; "
        "default on); off: a 16-bit weight beside its FP8 cast.",
    )
    # How FP8 scales are chosen (precision "fp8" only): "delayed" from the amax history of
    # past steps (Transformer Engine's default DelayedScaling recipe), or "current" from the
    # tensor itself (Float8CurrentScaling), which costs one more pass over every operand.
    fp8_scaling: str = spec_field(
        "delayed",
        kind="choice",
        choices=FP8_SCALINGS,
        code="unknown-fp8-scaling",
        doc="FP8 scales from the amax history (delayed, default) or from each tensor itself (current, one more pass).",
    )

    def __post_init__(self) -> None:
        """Check the fields; only Adam and bf16/fp16/fp8 are modelled."""
        check_declared_fields(self)
        if self.flash_attention_version is not None and not self.flash_attention:
            raise _refuse(
                "training",
                "flash_attention_version",
                "training.flash_attention_version is given but flash_attention is off",
                "contradiction",
            )
        if self.grad_bytes_per_param not in GRADIENT_BYTES_PER_PARAM:
            raise _refuse(
                "training",
                "grad_bytes_per_param",
                "training.grad_bytes_per_param must be 2 (bf16) or 4 (fp32)",
                "out-of-range",
            )

    @classmethod
    def from_shorthand(cls, data: Mapping[str, Any], where: str) -> Mapping[str, Any]:
        """A mapping's training fields: a ``software`` generation's flags, amended by the fields given."""
        if data.get("software") is None:
            return {k: v for k, v in data.items() if k != "software"}
        reject_unknown(data, {f.name for f in fields(cls)}, where)
        name = str(data["software"]).lower()
        if name not in SOFTWARE_PRESETS:
            raise InvalidInput(
                f"{where}.software must be one of {sorted(SOFTWARE_PRESETS)}, got {name!r}",
                field=f"{where}.software",
                code="unknown-software",
            )
        return {**SOFTWARE_PRESETS[name], **{k: v for k, v in data.items() if k != "software"}, "software": name}


@dataclass(frozen=True)
class Constraints:
    """Optional limits on the search; None means "search it"."""

    ROOT: ClassVar[str] = "constraints"

    tp: int | None = spec_field(None, kind="count", doc="Tensor-parallel size; default: searched.")
    pp: int | None = spec_field(None, kind="count", doc="Pipeline-parallel size; default: searched.")
    max_pp: int | None = spec_field(None, kind="count", doc="Largest pipeline-parallel size searched.")
    cp: int | None = spec_field(None, kind="count", doc="Context-parallel size; default: searched.")
    ep: int | None = spec_field(None, kind="count", doc="Expert-parallel size; default: searched.")
    # Expert tensor-parallel size: tp (experts split like the dense MLP) or 1 (MoE parallel
    # folding); None searches both for MoE models.
    etp: int | None = spec_field(
        None,
        kind="count",
        doc="Expert tensor-parallel size: tp (routed experts split over the tensor ranks, Megatron-Core's "
        "default) or 1 (MoE parallel folding); default: both.",
    )
    micro_batch_size: int | None = spec_field(None, kind="count", doc="Sequences per micro-batch; default: searched.")
    virtual_stages: int | None = spec_field(
        None, kind="count", doc="Model chunks per pipeline stage (interleaved schedule); default: searched."
    )
    zero_stages: tuple[int, ...] = spec_field(ZERO_STAGES, kind="custom", doc="ZeRO stages searched, drawn from 0..3.")
    recompute: tuple[str, ...] = spec_field(
        RECOMPUTE_MODES,
        kind="custom",
        doc="Recomputation modes searched, drawn from none, selective (Megatron's), full (per block), op-sac "
        "(torchtitan's per-op selective checkpointing); the software bounds them.",
    )
    # Layers of each model chunk that full recomputation covers (Megatron-LM's
    # ``--recompute-num-layers`` with the block method); None lets the planner choose the
    # fewest that fit (all of them when ``training.partial_recompute`` is off).
    recompute_num_layers: int | None = spec_field(
        None,
        kind="count",
        doc="Layers of each model chunk full recomputation covers (Megatron --recompute-num-layers); default: the"
        " fewest that fit.",
    )
    allow_uneven_pp: bool = spec_field(
        True, kind="flag", doc="Pipeline stages may hold different layer counts (default on)."
    )
    rank_order: str | None = spec_field(
        None,
        kind="choice",
        choices=RANK_ORDERS,
        code="unknown-rank-order",
        doc="Rank order, innermost first: tp-cp-ep-dp-pp (Megatron-Core's default, torchtitan's) or "
        "tp-cp-ep-pp-dp (Megatron-Core --use-tp-pp-dp-mapping); default: both, as the software allows.",
    )
    # Layouts within this fraction of the best step time are reported as ties and ranked
    # those with room for allocator waste first, fastest first within each group. 3%: the
    # model's own error on published layouts (bench/parallel3d.py: mean |MFU/HFU error|
    # 2.9% over SC21, as the authors ran it in fp16, and Korthikanti 2022), so a smaller
    # gap is not evidence that one layout is faster.
    tie_tolerance: float = spec_field(
        0.03,
        kind="number",
        ge=0,
        lt=0.5,
        doc="Layouts within this fraction of the best step time are reported as ties (default 0.03).",
    )

    def __post_init__(self) -> None:
        check_declared_fields(self)
        stages = self.zero_stages
        if isinstance(stages, (int, str)) or not isinstance(stages, (list, tuple)) or not stages:
            raise _refuse(
                "constraints", "zero_stages", "constraints.zero_stages must be a non-empty list of 0..3", "out-of-range"
            )
        stages = tuple(positive_int(z, "constraints.zero_stages[]", allow_zero=True) for z in stages)
        if any(z not in ZERO_STAGES for z in stages):
            raise _refuse(
                "constraints",
                "zero_stages",
                f"constraints.zero_stages must be drawn from 0..3, got {list(stages)}",
                "out-of-range",
            )
        modes = [self.recompute] if isinstance(self.recompute, str) else self.recompute
        modes = tuple(
            str(m).lower()
            for m in as_list(modes, "constraints.recompute", f"a list drawn from {list(RECOMPUTE_MODES)}")
        )
        if not modes or any(m not in RECOMPUTE_MODES for m in modes):
            raise _refuse(
                "constraints",
                "recompute",
                f"constraints.recompute must be drawn from {list(RECOMPUTE_MODES)}",
                "out-of-range",
            )
        object.__setattr__(self, "zero_stages", stages)
        object.__setattr__(self, "recompute", modes)


LAYOUT_FIELDS: tuple[str, ...] = (
    "dp",
    "tp",
    "pp",
    "cp",
    "ep",
    "etp",
    "virtual_stages",
    "micro_batch_size",
    "zero_stage",
    "recompute",
    "recompute_num_layers",
    "rank_order",
    "sequence_parallel",
)


@dataclass(frozen=True)
class LayoutSpec:
    """One layout to predict (a request's ``evaluate[k]``): the sizes it fixes; None: chosen as the search would.

    ``recompute_num_layers`` counts the layers of each model chunk that full
    recomputation covers: 0 beside ``none`` or ``selective`` (as every candidate reports
    it, so a candidate sent back as it came is predicted as it was), at least 1 beside
    ``full``; given alone, 0 means "no full recomputation" and more means ``full``.
    """

    ROOT: ClassVar[str] = "layout"

    dp: int | None = spec_field(None, kind="count", doc="Data-parallel size.")
    tp: int | None = spec_field(None, kind="count", doc="Tensor-parallel size.")
    pp: int | None = spec_field(None, kind="count", doc="Pipeline-parallel size.")
    cp: int | None = spec_field(None, kind="count", doc="Context-parallel size.")
    ep: int | None = spec_field(None, kind="count", doc="Expert-parallel size.")
    etp: int | None = spec_field(
        None,
        kind="count",
        doc="Expert tensor-parallel size: tp or 1 (folded experts, expert groups cut from tp x cp x dp ranks).",
    )
    virtual_stages: int | None = spec_field(None, kind="count", doc="Model chunks per pipeline stage.")
    micro_batch_size: int | None = spec_field(None, kind="count", doc="Sequences per micro-batch.")
    zero_stage: int | None = spec_field(
        None, kind="count", ge=ZERO_STAGES[0], le=ZERO_STAGES[-1], doc="ZeRO stage, 0..3."
    )
    recompute: str | None = spec_field(None, kind="choice", choices=RECOMPUTE_MODES, doc="Recomputation mode.")
    recompute_num_layers: int | None = spec_field(
        None,
        kind="count",
        ge=0,
        doc="Layers of each model chunk full recomputation covers: 0 with 'none' or "
        "'selective' (as candidates report it), at least 1 with 'full'; alone, more than 0 implies 'full'.",
    )
    rank_order: str | None = spec_field(
        None,
        kind="choice",
        choices=RANK_ORDERS,
        code="unknown-rank-order",
        doc="Rank order, innermost first: tp-cp-ep-dp-pp or tp-cp-ep-pp-dp.",
    )
    sequence_parallel: bool | None = spec_field(
        None,
        kind="flag",
        doc="Sequence parallelism on this layout (shards norms and dropouts over the tensor ranks); default: "
        "training.sequence_parallel.",
    )

    def __post_init__(self) -> None:
        check_declared_fields(self)
        layers, mode, root = self.recompute_num_layers, self.recompute, self.ROOT
        if layers == 0 and mode == "full":
            raise _refuse(
                root,
                "recompute_num_layers",
                f"{root}: recompute 'full' with recompute_num_layers 0 "
                "recomputes no layer; give at least 1, or leave it out to recompute every layer",
                "contradiction",
            )
        if layers is not None and layers > 0 and mode in ("none", "selective"):
            raise _refuse(
                root,
                "recompute_num_layers",
                f"{root}: recompute_num_layers counts fully recomputed "
                f"layers, so it needs recompute 'full' (got {mode!r}; 0 goes with {mode!r})",
                "contradiction",
            )

    def given(self) -> dict[str, Any]:
        """The fields this layout fixes (those not None), as a request states them."""
        return {name: getattr(self, name) for name in LAYOUT_FIELDS if getattr(self, name) is not None}


def cluster_from_inventory(inventory: Inventory, num_nodes: int | None = None) -> ClusterSpec:
    """The planner's view of a shared :class:`~partitioners.hardware.inventory.Inventory`.

    The 3D planner assumes identical nodes of identical GPUs (every data-parallel
    replica must run at the same speed), so it takes one group's figures: devices
    per group, the first device's peaks by dtype, main-memory capacity and
    bandwidth, the intra-group link and the inter-group link. ``num_nodes``
    replaces the group count (a one-node preset inventory scaled to 100,000 GPUs
    stays a few numbers). SM count and GEMM ceiling come from :data:`GPU_SPECS`
    when the device type names a GPU there, else defaults.

    Raises
    ------
    InvalidInput
        A heterogeneous inventory (mixed device types or group sizes).
    """
    types = set(inventory.device_types.tolist())
    sizes = np.bincount(inventory.device_group, minlength=inventory.n_groups)
    if len(types) != 1 or sizes.min() != sizes.max():
        raise InvalidInput(
            f"the 3D-parallel planner needs identical nodes of one GPU type; this inventory has device types "
            f"{sorted(types)} and group sizes {sorted(set(sizes.tolist()))}",
            field="cluster.groups",
            code="heterogeneous-cluster",
        )
    device_type = str(inventory.device_types[0])
    key = device_type.lower()
    known = next(
        (
            spec
            for name, spec in (
                ("a100", GPU_SPECS["a100-80gb"]),
                ("a800", GPU_SPECS["a800-80gb"]),
                ("h100", GPU_SPECS["h100-sxm"]),
                ("h800", GPU_SPECS["h800-sxm"]),
                ("h200", GPU_SPECS["h200-sxm"]),
                ("b200", GPU_SPECS["b200"]),
            )
            if name in key
        ),
        None,
    )
    peaks = {
        dtype: float(values[0])
        for dtype, values in inventory.device_peak_flops_by_dtype.items()
        if math.isfinite(float(values[0])) and float(values[0]) > 0
    }
    if inventory.default_dtype not in peaks:
        peaks[inventory.default_dtype] = float(inventory.device_peak_flops[0])
    memory_bytes = float(inventory.device_memory_bytes[0])
    if known is not None and known.memory_bytes <= memory_bytes <= 1.02 * known.memory_bytes:
        # the datasheet HBM of a GPU we know: the driver exposes a little less (see GPU_SPECS)
        memory_bytes = known.memory_bytes
    return ClusterSpec(
        gpus_per_node=int(sizes[0]),
        num_nodes=int(num_nodes if num_nodes is not None else inventory.n_groups),
        peak_flops_per_s=peaks,
        memory_bytes=memory_bytes,
        intra_node_bandwidth_bytes_per_s=float(inventory.group_link_bandwidth_bytes_per_s[0]),
        inter_node_bandwidth_bytes_per_s=float(inventory.inter_link.bandwidth_bytes_per_s),
        hbm_bandwidth_bytes_per_s=float(inventory.device_memory_bandwidth_bytes_per_s[0]),
        name=inventory.preset or inventory.name,
        sm_count=known.sm_count if known else 108,
        gemm_efficiency_max=known.gemm_efficiency_max if known else 0.8,
        intra_node_latency_s=float(inventory.group_link_latency_s[0]),
        inter_node_latency_s=float(inventory.inter_link.latency_s),
        nvls_allreduce_speedup=known.nvls_allreduce_speedup if known else 1.0,
        fp8_gemm_efficiency_max=known.fp8_gemm_efficiency_max if known else None,
        architecture=known.architecture if known else "unknown",
        board_power_w=_first_power(inventory.device_active_power_w),
        idle_power_w=_first_power(inventory.device_idle_power_w),
    )


def _first_power(watts: npt.NDArray[np.float64] | None) -> float | None:
    """An inventory's power figure for its (identical) devices, or None where it has none."""
    if watts is None or not math.isfinite(float(watts[0])):
        return None
    return float(watts[0])


def check_precision_runs(cluster: ClusterSpec, training: TrainingSpec) -> None:
    """Refuse a precision the cluster's GPUs have no tensor-core peak for.

    FP8 GEMMs need Hopper or later (an A100 has no FP8 tensor cores, NVIDIA A100 datasheet);
    predicting such a run at the bf16 rate would silently answer another question. 16-bit
    precisions fall back to the GPU's 16-bit peak, which every GPU has.
    """
    if training.precision == "fp8" and "fp8" not in cluster.peak_flops_per_s:
        raise InvalidInput(
            f"training.precision='fp8' needs FP8 tensor cores, and the cluster's GPUs "
            f"({cluster.name}) have no FP8 peak: use bf16, or give cluster.peak_flops_per_s.fp8",
            field="training.precision",
            code="not-on-this-gpu",
        )


def flash_attention_speed(cluster: ClusterSpec, training: TrainingSpec) -> float:
    """Speed of the stack's FlashAttention against the newest the cluster's GPUs run (1.0).

    Raises
    ------
    InvalidInput
        A generation the GPU does not run (FlashAttention-3 before Hopper), or one asked
        of a GPU without measured ratios (Blackwell, or a cluster given by its figures
        alone without ``architecture``).
    """
    version = training.flash_attention_version
    if version is None or not training.flash_attention:
        return 1.0
    speeds = FLASH_ATTENTION_SPEED.get(cluster.architecture)
    if speeds is None:
        raise InvalidInput(
            f"training.flash_attention_version={version}: no measured FlashAttention speeds for "
            f"{cluster.architecture!r} GPUs (known: {sorted(FLASH_ATTENTION_SPEED)}); leave it out "
            "for the newest kernel",
            field="training.flash_attention_version",
            code="unknown-architecture",
        )
    if version not in speeds:
        raise InvalidInput(
            f"training.flash_attention_version={version} does not run on {cluster.architecture} "
            f"GPUs (they run {sorted(speeds)})",
            field="training.flash_attention_version",
            code="not-on-this-gpu",
        )
    return speeds[version]
