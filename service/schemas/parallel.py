"""3D-parallel layout planning requests (``POST /v1/parallel/plan``)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Discriminator, Field, Tag

from partitioners.parallel3d.huggingface import HUGGINGFACE_MODEL_TYPES
from partitioners.parallel3d.specs import MAX_EXPERTS, MAX_GPUS_PER_NODE, MAX_LAYERS, MAX_NODES
from service.schemas.common import Name, PositiveFloat, RequestModel
from service.schemas.plans import InventoryDocument, PresetInventory

__all__ = ["ParallelPlanRequest"]

Count = Annotated[int, Field(ge=1, le=10**7)]


class MoeBlock(RequestModel):
    num_experts: int = Field(ge=1, le=MAX_EXPERTS)
    experts_per_token: int = Field(ge=1, le=1024)
    expert_ffn_hidden_size: int = Field(ge=1, le=10**6)
    shared_experts: int = Field(0, ge=0, le=1024)
    moe_layers: list[Annotated[int, Field(ge=0, le=100_000)]] | None = Field(None, max_length=100_000)
    num_groups: int | None = Field(None, ge=1, le=65_536, description="Group-limited routing: expert groups "
                                   "(DeepSeek-V3: 8; Megatron --moe-router-num-groups).")
    group_topk: int | None = Field(None, ge=1, le=65_536, description="Groups a token's experts come from "
                                   "(DeepSeek-V3: 4; Megatron --moe-router-group-topk).")


class MlaBlock(RequestModel):
    """Multi-head latent attention (DeepSeek-V2/V3), named as in the Hugging Face config."""

    kv_lora_rank: int = Field(ge=1, le=10**6)
    qk_nope_head_dim: int = Field(ge=1, le=100_000)
    qk_rope_head_dim: int = Field(ge=0, le=100_000)
    v_head_dim: int = Field(ge=1, le=100_000)
    q_lora_rank: int | None = Field(None, ge=1, le=10**6, description="None: a full-rank query projection.")


class TransformerShape(RequestModel):
    num_layers: int = Field(ge=1, le=MAX_LAYERS)
    hidden_size: int = Field(ge=1, le=10**6)
    num_attention_heads: int = Field(ge=1, le=100_000)
    num_kv_heads: int | None = Field(None, ge=1, le=100_000,
                                     description="KV heads (GQA groups; 1: multi-query attention); default "
                                     "num_attention_heads. Past this many tensor-parallel ranks each KV head is "
                                     "replicated.")
    head_dim: int | None = Field(None, ge=1, le=100_000,
                                 description="Width of one attention head; default hidden_size / heads.")
    ffn_hidden_size: int | None = Field(None, ge=1, le=10**7)
    vocab_size: int = Field(ge=1, le=10**8)
    seq_length: int = Field(ge=1, le=10**8)
    gated_mlp: bool = False
    parallel_attention_mlp: bool = Field(
        False, description="Attention and MLP read the same input and are summed before one tensor-parallel "
        "reduction (GPT-J, GPT-NeoX use_parallel_residual, PaLM, Falcon parallel_attn).")
    tie_embeddings: bool = False
    learned_position_embeddings: bool = Field(False, description="GPT-2/3-style learned position table (s x h).")
    mtp_layers: int = Field(0, ge=0, le=100, description="Multi-token prediction depth (DeepSeek-V3: 1), "
                            "run on the last pipeline stage.")
    sliding_window: int | None = Field(None, ge=1, le=10**8,
                                       description="Sliding-window attention: each query attends to this many "
                                       "latest tokens (Mistral 7B v0.1: 4096) on sliding_window_layers.")
    sliding_window_layers: list[Annotated[int, Field(ge=0, le=MAX_LAYERS)]] | None = Field(
        None, max_length=MAX_LAYERS, description="Indices of the sliding-window layers; default every layer.")
    attention_chunk_size: int | None = Field(None, ge=1, le=10**8,
                                             description="Chunked attention: queries attend causally inside "
                                             "chunks of this many tokens (Llama 4: 8192) on "
                                             "chunked_attention_layers.")
    chunked_attention_layers: list[Annotated[int, Field(ge=0, le=MAX_LAYERS)]] | None = Field(
        None, max_length=MAX_LAYERS, description="Indices of the chunked-attention layers; default every layer.")
    moe: MoeBlock | None = None
    mla: MlaBlock | None = None


class HuggingFaceModel(RequestModel):
    """A model described by its Hugging Face ``config.json``, plus the sequence length the run trains at."""

    huggingface_config: dict[str, Any] = Field(
        max_length=1000, description="The parsed config.json (or one holding a text_config). Read by model_type: "
        f"{', '.join(HUGGINGFACE_MODEL_TYPES)}.")
    seq_length: int = Field(ge=1, le=10**8, description="Training sequence length (max_position_embeddings is only "
                            "the longest the model supports).")


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


class ClusterShape(RequestModel):
    """A cluster: a preset with a node count, a GPU model with a node count, or every figure."""

    preset: Name | None = None
    gpu: Name | None = None
    nodes: int | None = Field(None, ge=1, le=MAX_NODES)
    num_nodes: int | None = Field(None, ge=1, le=MAX_NODES)
    gpus_per_node: int | None = Field(None, ge=1, le=MAX_GPUS_PER_NODE)
    peak_flops_per_s: dict[Name, PositiveFloat] | None = Field(None, max_length=16)
    memory_bytes: PositiveFloat | None = None
    hbm_bandwidth_bytes_per_s: PositiveFloat | None = None
    intra_node_bandwidth_bytes_per_s: PositiveFloat | None = None
    inter_node_bandwidth_bytes_per_s: PositiveFloat | None = None
    intra_node_latency_s: PositiveFloat | None = None
    inter_node_latency_s: PositiveFloat | None = None
    sm_count: int | None = Field(None, ge=1, le=10_000)
    gemm_efficiency_max: float | None = Field(None, gt=0, le=1, allow_inf_nan=False)
    fp8_gemm_efficiency_max: float | None = Field(
        None, gt=0, le=1, allow_inf_nan=False, description="FP8 GEMM ceiling as a fraction of the FP8 peak, if not the 16-bit one."
    )
    nvls_allreduce_speedup: float | None = Field(
        None, ge=1, le=10, allow_inf_nan=False, description="In-switch (NVLink SHARP) all-reduce speed-up over the ring."
    )
    architecture: Literal["ampere", "hopper", "blackwell", "unknown"] | None = Field(
        None, description="GPU generation, for which FlashAttention generations run and how fast (a preset or gpu "
        "sets it)."
    )
    name: Name | None = None
    inventory: InventoryDocument | PresetInventory | None = Field(
        None, description="Or a hyperplace inventory (identical nodes of one GPU type) instead of the fields above."
    )


class TrainingSettings(RequestModel):
    """Batch, precision and the software stack; a flag left out takes ``software``'s value, else the default."""

    global_batch_sequences: int = Field(ge=1, le=10**8)
    precision: Literal["bf16", "fp16", "fp8"] = "bf16"
    optimizer: Literal["adam", "adamw"] = Field(
        "adam", description="Mixed-precision Adam (AdamW's decoupled weight decay keeps the same state).")
    software: Literal["megatron-lm-2021", "megatron-lm-2022", "megatron-core"] | None = Field(
        None, description="The framework generation whose behaviour the flags default to (default: megatron-core)."
    )
    flash_attention: bool | None = Field(None, description="Flash attention (default on).")
    flash_attention_version: int | None = Field(
        None, ge=1, le=3, description="FlashAttention generation the stack runs (default: the newest the GPU runs, 2 on Ampere "
        "and 3 on Hopper); 1 runs at half of 2's speed, 2 at 35/75 of 3's on Hopper.")
    sequence_parallel: bool | None = Field(None, description="Sequence parallelism (default on).")
    overlap_grad_reduce: bool | None = Field(None, description="Data-parallel reduction under the backward pass "
                                             "(default on).")
    overlap_tp_backward: bool | None = Field(None, description="Backward tensor-parallel collectives overlap the "
                                             "GEMMs (Megatron async all-reduce; default on).")
    overlap_tp_comm: bool | None = Field(None, description="Tensor-parallel collectives pipelined under the GEMMs "
                                         "(Megatron --tp-comm-overlap, Transformer Engine userbuffers; default off).")
    overlap_p2p_comm: bool | None = Field(None, description="Under the interleaved schedule, pipeline sends and "
                                          "receives run asynchronously under the next model chunk's computation "
                                          "(Megatron-Core overlap_p2p_comm, on in NeMo's and Megatron-Bridge's "
                                          "recipes with virtual stages; default on).")
    flexible_microbatch_groups: bool | None = Field(None, description="The interleaved schedule may take "
                                                    "micro-batches in groups larger than pp, so a count pp does not "
                                                    "divide still interleaves (Megatron-Core --microbatch-group-size-"
                                                    "per-virtual-pipeline-stage set above pp; default off: its "
                                                    "default group is pp).")
    grad_bytes_per_param: int | None = Field(None, ge=2, le=4, description="Gradient buffer bytes per parameter: 4 "
                                             "for fp32 accumulation (Megatron's bf16 default), 2 with gradients "
                                             "reduced in bf16 (grad_reduce_in_fp32 off, DeepSpeed).")
    activation_fragmentation: float | None = Field(None, ge=0, le=1, allow_inf_nan=False, description="Caching-"
                                                   "allocator waste counted on top of activations, as a share of "
                                                   "them (default 0.10, the low end GMLake measured; a stack "
                                                   "measured to waste more states its own).")
    overlap_ep_comm: bool | None = Field(None, description="Expert-parallel all-to-all hidden under another "
                                         "micro-batch's computation (DeepSeek-V3 DualPipe, Megatron "
                                         "--overlap-moe-expert-parallel-comm; default off).")
    expert_load_imbalance: float | None = Field(None, ge=1, le=64, allow_inf_nan=False, description="Tokens of the "
                                                "busiest expert over the mean (default 1.2, an auxiliary-loss "
                                                "balanced router; 1 for force-balanced benchmarks).")
    expert_dispatch: Literal["all-to-all", "node-deduplicated"] | None = Field(
        None, description="all-to-all: one 16-bit message per (token, expert) pair (default); node-deduplicated: "
        "once per destination node over the network, then NVLink (DeepSeek-V3, DeepEP), FP8 in FP8 runs.")
    fp8_scaling: Literal["delayed", "current"] | None = Field(None, description="FP8 scales from the amax history "
                                                              "(delayed, default) or from each tensor itself "
                                                              "(current, one more pass).")
    pipeline_scatter_gather: bool | None = Field(None, description="Without sequence parallelism, each tensor rank "
                                                 "sends 1/t of a pipeline stage's output and the receiving node "
                                                 "all-gathers it over NVLink (Megatron-LM's default, SC21 Sec. 4.1); "
                                                 "off: every rank sends it whole.")
    dropout: bool | None = Field(None, description="Attention and residual dropout (GPT-2/3, Megatron's 0.1): its "
                                 "masks are kept for backward. Default off, as for Llama-style models.")
    partial_recompute: bool | None = Field(None, description="Full recomputation may cover only some layers of each "
                                           "model chunk (Megatron --recompute-method block); the planner then "
                                           "recomputes the fewest that fit (default on; off in megatron-lm-2021).")
    selective_recompute: bool | None = Field(None, description="Selective recomputation is searched (Megatron "
                                             "--recompute-granularity selective, 2022; default on; off in "
                                             "megatron-lm-2021, which had only full recomputation).")
    fp8_params: bool | None = Field(None, description="FP8 runs keep linear weights in FP8 only and gather them in "
                                    "FP8 (Megatron --fp8-param-gather, NeMo's FP8 recipes; default on); off: a "
                                    "16-bit weight beside its FP8 cast.")


class LayoutConstraints(RequestModel):
    tp: Count | None = None
    pp: Count | None = None
    max_pp: Count | None = None
    cp: Count | None = None
    ep: Count | None = None
    etp: Count | None = Field(None, description="Expert tensor-parallel size: tp (routed experts split over the "
                              "tensor ranks, Megatron-Core's default) or 1 (MoE parallel folding); default: both.")
    micro_batch_size: Count | None = None
    virtual_stages: Count | None = None
    zero_stages: list[Annotated[int, Field(ge=0, le=3)]] | None = Field(None, min_length=1, max_length=4)
    recompute: list[Literal["none", "selective", "full"]] | None = Field(None, min_length=1, max_length=3)
    recompute_num_layers: Count | None = Field(None, description="Layers of each model chunk full recomputation "
                                               "covers (Megatron --recompute-num-layers); default: the fewest "
                                               "that fit.")
    allow_uneven_pp: bool | None = None
    tie_tolerance: float | None = Field(None, ge=0, le=1, allow_inf_nan=False)


class Layout(RequestModel):
    dp: Count | None = None
    tp: Count | None = None
    pp: Count | None = None
    cp: Count | None = None
    ep: Count | None = None
    etp: Count | None = Field(None, description="Expert tensor-parallel size: tp or 1 (folded experts, expert "
                              "groups cut from tp x cp x dp ranks).")
    virtual_stages: Count | None = None
    micro_batch_size: Count | None = None
    zero_stage: int | None = Field(None, ge=0, le=3)
    recompute: Literal["none", "selective", "full"] | None = None
    recompute_num_layers: Annotated[int, Field(ge=0, le=10**7)] | None = Field(
        None, description="Layers of each model chunk full recomputation covers: 0 with 'none' or 'selective' "
        "(as candidates report it), at least 1 with 'full'; alone, more than 0 implies 'full'.")


class ParallelPlanRequest(RequestModel):
    """Model shape + cluster + training settings -> ranked dp x tp x pp (x cp x ep) layouts."""

    model: ModelDescription
    cluster: ClusterShape
    training: TrainingSettings
    constraints: LayoutConstraints | None = None
    evaluate: list[Layout] | None = Field(None, max_length=64, description="Predict these layouts instead of searching.")
    top_k: int = Field(10, ge=1, le=100)
    rank_map_limit: int = Field(1024, ge=0, le=200_000, description="How many ranks of the top layout's rank map to return.")

