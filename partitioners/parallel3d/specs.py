"""Inputs of the 3D-parallel planner: model shape, cluster, training settings, constraints.

Plain frozen dataclasses, each with a ``*_from_dict`` parser that validates what
a caller (or the HTTP handler) sends and raises
:class:`partitioners.errors.InvalidInput` naming the field, so a bad request
becomes a 422 that says what to fix.

Clusters: the shared inventory JSON (``"groups": [...]``) and the presets of
:mod:`partitioners.hardware.inventory` are accepted through :func:`cluster_from_inventory`
(identical nodes only). The GPU and node presets of :mod:`partitioners.parallel3d.presets`
keep what the planner needs beyond the inventory (SM count, GEMM ceiling) and win for
``dgx-a100``/``dgx-h100``/... because the inventory caps presets at 4,096 nodes
while this planner must answer for 100,000 GPUs. Descriptions may instead give every
figure explicitly.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any

import numpy as np

from partitioners.errors import InvalidInput
from partitioners.hardware.inventory import PRESETS as INVENTORY_PRESETS
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
from partitioners.parallel3d.huggingface import model_fields_from_huggingface
from partitioners.parallel3d.presets import (
    FLASH_ATTENTION_SPEED,
    GPU_ARCHITECTURES,
    GPU_SPECS,
    NODE_PRESETS,
    SOFTWARE_PRESETS,
    gpu_spec_by_name,
)
from partitioners.parallel3d.field_checks import (
    MAX_COUNT,
    as_list,
    flag,
    is_finite_number,
    positive_float,
    positive_int,
    reject_unknown,
)

__all__ = [
    "ACTIVATION_FRAGMENTATION",
    "MAX_COUNT",
    "MAX_LAYERS",
    "MAX_EXPERTS",
    "MAX_NODES",
    "MAX_GPUS_PER_NODE",
    "EXPERT_DISPATCH_MODES",
    "MoESpec",
    "MLASpec",
    "AttentionProjection",
    "ModelSpec",
    "ClusterSpec",
    "TrainingSpec",
    "Constraints",
    "RECOMPUTE_MODES",
    "model_from_dict",
    "cluster_from_dict",
    "kv_shard_count",
    "cluster_from_inventory",
    "training_from_dict",
    "check_precision_runs",
    "flash_attention_speed",
    "constraints_from_dict",
    "LAYOUT_FIELDS",
    "layout_from_dict",
]

RECOMPUTE_MODES: tuple[str, ...] = ("none", "selective", "full")
# Activations are allocated and freed every micro-batch in blocks of many sizes; the
# caching allocator's reserved-but-unusable share is 10-30% in LLM training
# (Guo et al., "GMLake", ASPLOS 2024). Counted at the low end on activations unless a
# request states its own (``training.activation_fragmentation``); the planner notes
# layouts that would not fit at the high end (parallel3d_memory.ACTIVATION_FRAGMENTATION_HIGH).
ACTIVATION_FRAGMENTATION = 0.10
EXPERT_DISPATCH_MODES: tuple[str, ...] = ("all-to-all", "node-deduplicated")


@dataclass(frozen=True)
class MoESpec:
    """Mixture-of-Experts block: routed experts, top-k, expert FFN width, shared experts.

    ``moe_layers`` lists the layer indices that are MoE (None: every layer), e.g.
    DeepSeek-V3 keeps its first three layers dense.
    """

    num_experts: int
    experts_per_token: int
    expert_ffn_hidden_size: int
    shared_experts: int = 0
    moe_layers: tuple[int, ...] | None = None
    # Group-limited routing: the experts are split into ``num_groups`` consecutive groups
    # and a token's experts come from its ``group_topk`` best groups (Megatron-Core's
    # --moe-router-num-groups / --moe-router-group-topk, Hugging Face's n_group /
    # topk_group). DeepSeek-V3 has 8 and 4: with its 8 expert-parallel nodes, one group a
    # node, a token reaches at most 4 nodes ("node-limited routing", DeepSeek-V3 Technical
    # Report, Sec. 2.1.2). None: no limit. It saves network bytes only with
    # ``TrainingSpec.expert_dispatch = "node-deduplicated"``.
    num_groups: int | None = None
    group_topk: int | None = None


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

    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int
    q_lora_rank: int | None = None


def kv_shard_count(tp: np.ndarray | float, kv_heads: int) -> np.ndarray:
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
    return np.minimum(np.asarray(tp, dtype=float), kv_heads)


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

    def out_per_rank(self, tp: np.ndarray | float) -> np.ndarray | float:
        """Output features one tensor-parallel rank computes."""
        if self.split != "column":
            return self.out_width
        tp = np.asarray(tp, dtype=float)
        return (self.out_width - self.kv_out_width) / tp + self.kv_out_width / kv_shard_count(tp, self.kv_heads)

    def in_per_rank(self, tp: np.ndarray | float) -> np.ndarray | float:
        """Input features one tensor-parallel rank reads."""
        return self.in_width / np.asarray(tp, dtype=float) if self.split == "row" else self.in_width


@dataclass(frozen=True)
class ModelSpec:
    """Decoder-only transformer shape (GPT/Llama family), as Megatron-LM arguments name it."""

    num_layers: int
    hidden_size: int
    num_attention_heads: int
    seq_length: int
    vocab_size: int
    num_kv_heads: int | None = None  # GQA query groups; None = multi-head attention
    ffn_hidden_size: int | None = None  # None = 4 * hidden_size
    gated_mlp: bool = False  # SwiGLU (Llama): three FFN matrices instead of two
    # Attention and MLP read the same layer input and their outputs are added to it
    # together, x + attn(norm(x)) + mlp(norm(x)) (GPT-J; GPT-NeoX ``use_parallel_residual``;
    # PaLM's "parallel layers", Chowdhery et al. 2022, Sec. 2; Falcon ``parallel_attn``):
    # the two row-parallel outputs are summed before one tensor-parallel reduction.
    parallel_attention_mlp: bool = False
    tie_embeddings: bool = False
    # GPT-2/3 learn an s x h position table (SC21 eq. 2's ``s`` term); Megatron-LM keeps it
    # on the first stage, whole on every tensor-parallel rank. Llama's rotary
    # embeddings have no parameters.
    learned_position_embeddings: bool = False
    moe: MoESpec | None = None
    # Width of one attention head (Megatron-LM's ``--kv-channels``, Hugging Face's
    # ``head_dim``). None = hidden_size / num_attention_heads; Qwen3 and Gemma set it
    # apart, so their query and projection widths differ from the hidden size.
    head_dim: int | None = None
    mla: MLASpec | None = None
    # Multi-token prediction depth (DeepSeek-V3: 1). Each module predicts one token
    # further ahead: the final hidden state and the next token's embedding, normed and
    # concatenated, are projected from 2h to h, run through one more transformer layer
    # (of the last layer's kind) and the shared output head (DeepSeek-V3 Technical
    # Report, Sec. 2.2). It runs on the last pipeline stage, which then also keeps a
    # copy of the embedding, as Megatron-Core's MTP does.
    mtp_layers: int = 0
    # Sliding-window attention (Mistral 7B v0.1, Gemma 2/3, Phi-3, StarCoder2): each query
    # attends to the ``sliding_window`` latest tokens only, on the ``sliding_window_layers``
    # (indices; None = every layer). The other layers attend to the whole causal prefix.
    # Context-parallel exchanges are counted as for full attention (Transformer Engine's
    # ring passes every K/V chunk whatever the window).
    sliding_window: int | None = None
    sliding_window_layers: tuple[int, ...] | None = None
    # Chunked attention (Llama 4's ``attention_chunk_size``, "iRoPE"): the sequence is cut
    # into chunks of this many tokens and a query attends causally inside its own chunk,
    # on the ``chunked_attention_layers`` (None = every layer).
    attention_chunk_size: int | None = None
    chunked_attention_layers: tuple[int, ...] | None = None

    def to_dict(self) -> dict[str, Any]:
        """The shape as ``model_from_dict`` reads it (fields left at None omitted), e.g. to echo one read from a config."""
        def plain(value: Any) -> Any:
            if isinstance(value, (MoESpec, MLASpec)):
                return {f.name: plain(getattr(value, f.name)) for f in fields(value)
                        if getattr(value, f.name) is not None}
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

    def kv_shards(self, tp: np.ndarray | float) -> np.ndarray:
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
            return (AttentionProjection(h, self.query_width + 2 * self.key_width, "column", "norm",
                                        kv_out_width=2 * self.key_width, kv_heads=self.kv_heads),
                    AttentionProjection(self.query_width, h, "row", "heads"))
        mla = self.mla
        query = (AttentionProjection(h, mla.q_lora_rank, "replicated", "norm"),
                 AttentionProjection(mla.q_lora_rank, self.query_width, "column", "latent")) if mla.q_lora_rank \
            else (AttentionProjection(h, self.query_width, "column", "norm"),)
        return query + (
            AttentionProjection(h, mla.kv_lora_rank + mla.qk_rope_head_dim, "replicated", "norm"),
            AttentionProjection(mla.kv_lora_rank, self.num_attention_heads * (mla.qk_nope_head_dim + mla.v_head_dim),
                                "column", "latent"),
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
        if windowed and self.sliding_window < s:
            w = self.sliding_window
            share -= windowed / self.num_layers * (1.0 - (w * (w + 1) / 2 + (s - w) * w) / causal)
        chunked = self._local_layer_count(self.attention_chunk_size, self.chunked_attention_layers)
        if chunked and self.attention_chunk_size < s:
            whole, rest = divmod(s, self.attention_chunk_size)
            c = self.attention_chunk_size
            share -= chunked / self.num_layers * (1.0 - (whole * c * (c + 1) / 2 + rest * (rest + 1) / 2) / causal)
        return share

    @property
    def num_moe_layers(self) -> int:
        if self.moe is None:
            return 0
        if self.moe.moe_layers is None:
            return self.num_layers
        return len(set(self.moe.moe_layers))


@dataclass(frozen=True)
class ClusterSpec:
    """Homogeneous GPU cluster: ``num_nodes`` nodes of ``gpus_per_node`` GPUs.

    Bandwidths per GPU per direction; latencies are the alpha term of the shared
    alpha-beta collectives (``partitioners.hardware.collectives``).
    """

    gpus_per_node: int
    num_nodes: int
    peak_flops_per_s: Mapping[str, float]
    memory_bytes: float
    intra_node_bandwidth_bytes_per_s: float
    inter_node_bandwidth_bytes_per_s: float
    hbm_bandwidth_bytes_per_s: float
    name: str = "custom"
    sm_count: int = 108
    gemm_efficiency_max: float = 0.8
    # NCCL small-message latency per ring step, intra-node NVLink vs inter-node
    # InfiniBand: a few microseconds each (nccl-tests small-message all-reduce times).
    intra_node_latency_s: float = 2e-6
    inter_node_latency_s: float = 5e-6
    # NVLink SHARP all-reduce speed-up over the ring within a full node (see GPUSpec).
    nvls_allreduce_speedup: float = 1.0
    # FP8 GEMM ceiling where it differs from the 16-bit one (see GPUSpec); None: the same.
    fp8_gemm_efficiency_max: float | None = None
    # GPU generation (see GPUSpec); "unknown" for a cluster given by its figures alone.
    architecture: str = "unknown"

    @property
    def num_gpus(self) -> int:
        return self.gpus_per_node * self.num_nodes


@dataclass(frozen=True)
class TrainingSpec:
    """Training settings that fix the work of one optimizer step and the software stack.

    The software flags describe the framework build (Megatron-LM 2021 had no flash
    attention, no sequence parallelism and reduced gradients after the backward
    pass; Megatron-Core today has all three), because they change both time and
    memory; defaults are today's.
    """

    global_batch_sequences: int
    precision: str = "bf16"  # "bf16", "fp16" (with loss scaling, same peak) or "fp8"
    optimizer: str = "adam"
    flash_attention: bool = True
    # Which FlashAttention generation (1, 2 or 3) the stack runs; None: the newest the GPU
    # runs (2 on Ampere, 3 on Hopper), as today's frameworks do. Older ones are slower
    # (FLASH_ATTENTION_SPEED): MosaicML's LLM Foundry A100 table reads within 5% on average
    # with FlashAttention-1, and 67% high at 65,536 tokens with the newest (bench.llm_foundry).
    flash_attention_version: int | None = None
    sequence_parallel: bool = True
    overlap_grad_reduce: bool = True
    # Tensor-parallel collectives pipelined under GEMMs (Megatron --tp-comm-overlap); opt-in.
    overlap_tp_comm: bool = False
    # Under the interleaved schedule, pipeline sends and receives posted asynchronously and
    # waited for only when the next model chunk needs them (Megatron-Core
    # ``overlap_p2p_comm``, which NeMo's and Megatron-Bridge's recipes turn on whenever
    # virtual pipeline stages are used, with ``batch_p2p_comm`` off); 1F1B keeps the
    # batched, synchronised exchange.
    overlap_p2p_comm: bool = True
    # The interleaved schedule may take micro-batches in groups larger than pp, so a
    # micro-batch count that pp does not divide can still interleave (Megatron-Core
    # ``--microbatch-group-size-per-virtual-pipeline-stage``; see
    # parallel3d_stages.microbatch_group_size). Off by default: Megatron-Core's group size
    # defaults to pp ("Default ... to pipeline_parallel_size", ModelParallelConfig), which
    # asks for a multiple of pp as Megatron-LM always did.
    flexible_microbatch_groups: bool = False
    # Backward tensor-parallel collectives of the column-parallel linears launched
    # asynchronously under their GEMMs: the input-gradient all-reduce (reduce-scatter with
    # sequence parallelism) under the weight-gradient GEMM, and with sequence parallelism
    # the input's re-all-gather under the input-gradient GEMM (Megatron-LM
    # ``linear_with_grad_accumulation_and_async_allreduce``, on by default since 2022,
    # ``--no-async-tensor-model-parallel-allreduce`` turns it off). The 2021 code had not.
    overlap_tp_backward: bool = True
    # Megatron keeps fp32 "main_grad" buffers (4 B/param); DeepSpeed ZeRO keeps bf16 (2 B).
    grad_bytes_per_param: int = 4
    # Caching-allocator waste counted on top of activations (reserved but unusable
    # between the blocks of many sizes a step allocates and frees). A user who measured
    # their stack (torch.cuda.memory_reserved against memory_allocated at the peak)
    # states theirs.
    activation_fragmentation: float = ACTIVATION_FRAGMENTATION
    # Weight gradients accumulated inside the weight-gradient GEMM (Megatron-LM
    # ``--gradient-accumulation-fusion``, cuBLAS/CUTLASS ``wgrad_gemm_accum_fp32``, default
    # since 2022). Without it every micro-batch writes a separate gradient that a second
    # kernel adds into the accumulation buffer: extra HBM traffic per parameter and
    # micro-batch (see parallel3d_kernels.gradient_accumulation_time_s).
    gradient_accumulation_fusion: bool = True
    # The fp16 optimizer of Megatron-LM before 2022 kept the fp32 copy of every gradient
    # it made for the master weights (``main_param.grad = model_param.main_grad.float()``)
    # from one step to the next: its ``zero_grad`` cleared only "float16_groups &
    # fp32_from_fp32_groups". The later code also frees fp32_from_float16_groups "as a
    # memory optimization" (megatron/optimizer/optimizer.py). With 2-byte gradient buffers
    # that copy is 4 more bytes per parameter through the forward and backward passes;
    # with fp32 buffers ``.float()`` returns the buffer itself and costs nothing.
    fp32_grad_copy_kept: bool = False
    # Megatron-LM before 2022 kept every in-flight micro-batch's pipeline-stage output
    # until that micro-batch's backward; ``deallocate_output_tensor`` (schedules.py)
    # later freed its data right after the send, as only its ``grad_fn`` is needed.
    stage_outputs_kept: bool = False
    # PyTorch DistributedDataParallel copies every gradient into its all-reduce buckets
    # unless ``gradient_as_bucket_view=True`` (off by default), which "can reduce peak
    # memory usage, where the saved memory size will be equal to the total gradients
    # size" (torch.nn.parallel.DistributedDataParallel docs): one more gradient's bytes
    # per parameter. Megatron-LM's own DDP and ZeRO-style buffers need no copy.
    ddp_bucket_copy: bool = False
    # Without sequence parallelism every tensor rank holds the whole activation a pipeline
    # stage sends. Megatron-LM's scatter/gather sends each rank's 1/t of it across the
    # stage boundary and all-gathers it over NVLink on the receiving node (Narayanan et al.,
    # SC21, Sec. 4.1; on by default, ``--no-scatter-gather-tensors-in-pipeline`` turns it
    # off, and then each rank sends the whole tensor). With sequence parallelism the
    # activation is already split and this changes nothing.
    pipeline_scatter_gather: bool = True
    # Expert-parallel all-to-all (dispatch and combine) hidden under the computation of
    # another micro-batch, a forward chunk paired with a backward one: DeepSeek-V3's
    # DualPipe ("overlap the computation and communication within a pair of individual
    # forward and backward chunks", DeepSeek-AI, DeepSeek-V3 Technical Report, 2024,
    # Sec. 3.2.1) and Megatron-Core's ``--overlap-moe-expert-parallel-comm``. Opt-in.
    overlap_ep_comm: bool = False
    # How tokens reach their experts. "all-to-all": one message per (token, expert) pair,
    # 16-bit (Megatron-Core's alltoall token dispatcher). "node-deduplicated": DeepSeek-V3's
    # dispatch (its DeepEP kernels; Megatron-Core's flex dispatcher): once per destination
    # node over the network, then NVLink to the experts, in FP8 when the run is FP8; see
    # parallel3d_comm.deduplicated_dispatch_time_s.
    expert_dispatch: str = "all-to-all"
    # Tokens the busiest expert receives over the mean, which paces the experts' GEMMs and
    # the all-to-all: dropless routing with an auxiliary balancing loss still leaves it
    # ~20% above (the 1.2-1.25 capacity factors budgeted by GShard, Lepikhin et al. 2021,
    # and Switch, Fedus et al. 2022). 1.0 where routing is forced to balance, as
    # Megatron-Bridge's MoE benchmarks do ("we force-balance the token distribution").
    expert_load_imbalance: float = 1.2
    # Dropout on the attention probabilities and on the two residual branches (GPT-2/3 and
    # Megatron-LM's default, 0.1). Llama, Mistral, Nemotron-4, Falcon and most models trained
    # since 2023 use none, and PyTorch's dropout at p = 0 returns its input without making
    # a mask (aten ``_dropout_impl``), so the default is off: no masks are kept.
    dropout: bool = False
    # Selective recomputation (Korthikanti et al. 2022: rebuild the attention scores, or with
    # flash attention the cheap element-wise outputs, in the backward pass). Megatron-LM
    # released it in 2022 (``--recompute-granularity selective``); the 2021 code had only
    # full recomputation (``--checkpoint-activations``).
    selective_recompute: bool = True
    # Full recomputation may cover only the first k layers of each model chunk, the others
    # keeping all their activations (Megatron-LM ``--recompute-granularity full
    # --recompute-method block --recompute-num-layers k``, per virtual pipeline stage when
    # interleaved; NeMo's "partial transformer layer recomputation ... when recomputing a
    # few transformer layers help to reduce enough GPU memory for model to fit", NeMo
    # activation-recomputation docs). The planner then recomputes the fewest layers that
    # fit with headroom. The 2021 code recomputed every layer (``--checkpoint-activations``).
    partial_recompute: bool = True
    # FP8 runs keep each linear weight in FP8 only, gathered in FP8 by the distributed
    # optimizer from its fp32 master copy (Transformer Engine ``fp8_model_init``;
    # Megatron-Core ``--fp8-param-gather``, set by NeMo's FP8 precision recipes,
    # ``fp8_param_gather=True``, and NVIDIA's FP8 benchmark configs, ``fp8_params: true``).
    # Off: a 16-bit weight plus Transformer Engine's FP8 cast of it. Hopper's FP8 GEMMs
    # read only the "TN" layout, so the backward's transposed weight is a second FP8 copy
    # either way (Transformer Engine, "Handling transposes").
    fp8_params: bool = True
    # How FP8 scales are chosen (precision "fp8" only): "delayed" from the amax history of
    # past steps (Transformer Engine's default DelayedScaling recipe), or "current" from the
    # tensor itself (Float8CurrentScaling), which costs one more pass over every operand.
    fp8_scaling: str = "delayed"


@dataclass(frozen=True)
class Constraints:
    """Optional limits on the search; None means "search it"."""

    tp: int | None = None
    pp: int | None = None
    max_pp: int | None = None
    cp: int | None = None
    ep: int | None = None
    # Expert tensor-parallel size: tp (experts split like the dense MLP) or 1 (MoE parallel
    # folding); None searches both for MoE models.
    etp: int | None = None
    micro_batch_size: int | None = None
    virtual_stages: int | None = None
    zero_stages: tuple[int, ...] = (0, 1, 2, 3)
    recompute: tuple[str, ...] = RECOMPUTE_MODES
    # Layers of each model chunk that full recomputation covers (Megatron-LM's
    # ``--recompute-num-layers`` with the block method); None lets the planner choose the
    # fewest that fit (all of them when ``training.partial_recompute`` is off).
    recompute_num_layers: int | None = None
    allow_uneven_pp: bool = True
    # Layouts within this fraction of the best step time are reported as ties and ranked
    # those with room for allocator waste first, fastest first within each group. 3%: the
    # model's own error on published layouts (bench/parallel3d.py: mean |MFU/HFU error|
    # 2.9% over SC21, as the authors ran it in fp16, and Korthikanti 2022), so a smaller
    # gap is not evidence that one layout is faster.
    tie_tolerance: float = 0.03


# --------------------------------------------------------------------------- parsing


# The largest counts accepted (the HTTP schema states the same bounds): beyond any model or
# cluster built, and small enough that enumerating their divisors stays instant.
MAX_LAYERS = 100_000
MAX_EXPERTS = 65_536
MAX_NODES = 100_000
MAX_GPUS_PER_NODE = 1024


def _check_block(data: Any, spec_type: type, where: str) -> None:
    """A nested block (``model.moe``, ``model.mla``) must be an object naming only ``spec_type``'s fields."""
    if not isinstance(data, Mapping):
        raise InvalidInput(f"{where} must be an object", field=where, code="not-an-object")
    reject_unknown(data, {f.name for f in fields(spec_type)}, where)


def _moe_from_dict(data: Mapping[str, Any] | MoESpec | None) -> MoESpec | None:
    if data is None or isinstance(data, MoESpec):
        return data
    _check_block(data, MoESpec, "model.moe")
    return MoESpec(
        num_experts=positive_int(data.get("num_experts"), "model.moe.num_experts", maximum=MAX_EXPERTS),
        experts_per_token=positive_int(data.get("experts_per_token"), "model.moe.experts_per_token"),
        expert_ffn_hidden_size=positive_int(data.get("expert_ffn_hidden_size"), "model.moe.expert_ffn_hidden_size"),
        shared_experts=positive_int(data.get("shared_experts", 0), "model.moe.shared_experts", allow_zero=True),
        moe_layers=_layer_indices(data, "moe_layers", "model.moe"),
        num_groups=_optional_positive(data, "num_groups", "model.moe"),
        group_topk=_optional_positive(data, "group_topk", "model.moe"),
    )


def _mla_from_dict(data: Mapping[str, Any] | MLASpec | None) -> MLASpec | None:
    if data is None or isinstance(data, MLASpec):
        return data
    _check_block(data, MLASpec, "model.mla")
    for name in ("kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"):
        if name not in data:
            raise InvalidInput(f"model.mla.{name} is required", field=f"model.mla.{name}", code="missing-field")
    return MLASpec(
        kv_lora_rank=positive_int(data["kv_lora_rank"], "model.mla.kv_lora_rank"),
        qk_nope_head_dim=positive_int(data["qk_nope_head_dim"], "model.mla.qk_nope_head_dim"),
        qk_rope_head_dim=positive_int(data["qk_rope_head_dim"], "model.mla.qk_rope_head_dim", allow_zero=True),
        v_head_dim=positive_int(data["v_head_dim"], "model.mla.v_head_dim"),
        q_lora_rank=_optional_positive(data, "q_lora_rank", "model.mla"),
    )


def _optional_positive(data: Mapping[str, Any], name: str, where: str = "model") -> int | None:
    """``data[name]`` as a positive integer, or None where it is absent or null."""
    return None if data.get(name) is None else positive_int(data[name], f"{where}.{name}")


def _layer_indices(data: Mapping[str, Any], name: str, where: str = "model") -> tuple[int, ...] | None:
    """``data[name]`` as a tuple of layer indices, or None where it is absent or null."""
    if data.get(name) is None:
        return None
    indices = tuple(positive_int(i, f"{where}.{name}[]", allow_zero=True)
                    for i in as_list(data[name], f"{where}.{name}", "a list of layer indices"))
    if len(set(indices)) < len(indices):
        twice = next(i for i in indices if indices.count(i) > 1)
        raise InvalidInput(f"{where}.{name} lists layer {twice} more than once", field=f"{where}.{name}",
                           code="duplicate-layer")
    return indices


def _check_local_attention(spec: ModelSpec) -> None:
    """Sliding-window and chunked layers name existing layers, each under its own size, none under both."""
    kinds = (("sliding_window", "sliding_window_layers", "the window's width in tokens"),
             ("attention_chunk_size", "chunked_attention_layers", "the chunk's length in tokens"))
    for size_name, layers_name, size_meaning in kinds:
        layers = getattr(spec, layers_name)
        if layers is None:
            continue
        if getattr(spec, size_name) is None:
            raise InvalidInput(f"model.{layers_name} needs model.{size_name}, {size_meaning}",
                               field=f"model.{size_name}", code="missing-field")
        if any(i >= spec.num_layers for i in layers):
            raise InvalidInput(f"{layers_name} indexes a layer >= num_layers ({spec.num_layers})",
                               field=f"model.{layers_name}", code="layer-out-of-range")
    if spec.sliding_window is not None and spec.attention_chunk_size is not None:
        every = set(range(spec.num_layers))
        windowed = every if spec.sliding_window_layers is None else set(spec.sliding_window_layers)
        chunked = every if spec.chunked_attention_layers is None else set(spec.chunked_attention_layers)
        if windowed & chunked:
            raise InvalidInput(f"layers {sorted(windowed & chunked)[:8]} are both sliding-window and chunked; "
                               "a layer attends one way", field="model.chunked_attention_layers",
                               code="attention-kinds-overlap")


def model_from_dict(data: Mapping[str, Any] | ModelSpec) -> ModelSpec:
    """Validate a model description (``dict`` as sent over HTTP) into a :class:`ModelSpec`.

    The description holds the shape fields, or ``huggingface_config`` (a model's
    ``config.json``, read by :mod:`partitioners.parallel3d.huggingface`) and ``seq_length``.

    Raises
    ------
    InvalidInput
        When a size is not a positive integer, the hidden size is not a multiple of
        the head count (and no ``head_dim`` is given), the KV heads do not divide
        the query heads, or the MoE block is inconsistent (top-k above the expert
        count, a layer index out of range).
    """
    if isinstance(data, ModelSpec):
        spec = data
    else:
        if not isinstance(data, Mapping):
            raise InvalidInput("model must be an object", field="model", code="not-an-object")
        if "huggingface_config" in data:
            reject_unknown(data, {"huggingface_config", "seq_length"}, "model")
            if "seq_length" not in data:
                raise InvalidInput("model.seq_length is required next to model.huggingface_config: the sequence "
                                   "length the run trains at (max_position_embeddings is the longest the model "
                                   "supports)", field="model.seq_length", code="missing-field")
            data = {**model_fields_from_huggingface(data["huggingface_config"]), "seq_length": data["seq_length"]}
        names = {f.name for f in fields(ModelSpec)}
        reject_unknown(data, names, "model")
        required = ("num_layers", "hidden_size", "num_attention_heads", "seq_length", "vocab_size")
        for name in required:
            if name not in data:
                raise InvalidInput(f"model.{name} is required", field=f"model.{name}", code="missing-field")
        spec = ModelSpec(
            num_layers=positive_int(data["num_layers"], "model.num_layers", maximum=MAX_LAYERS),
            hidden_size=positive_int(data["hidden_size"], "model.hidden_size"),
            num_attention_heads=positive_int(data["num_attention_heads"], "model.num_attention_heads"),
            seq_length=positive_int(data["seq_length"], "model.seq_length"),
            vocab_size=positive_int(data["vocab_size"], "model.vocab_size"),
            num_kv_heads=_optional_positive(data, "num_kv_heads"),
            ffn_hidden_size=_optional_positive(data, "ffn_hidden_size"),
            gated_mlp=flag(data.get("gated_mlp", False), "model.gated_mlp"),
            parallel_attention_mlp=flag(data.get("parallel_attention_mlp", False), "model.parallel_attention_mlp"),
            tie_embeddings=flag(data.get("tie_embeddings", False), "model.tie_embeddings"),
            learned_position_embeddings=flag(data.get("learned_position_embeddings", False),
                                             "model.learned_position_embeddings"),
            moe=_moe_from_dict(data.get("moe")),
            head_dim=_optional_positive(data, "head_dim"),
            mla=_mla_from_dict(data.get("mla")),
            mtp_layers=positive_int(data.get("mtp_layers", 0), "model.mtp_layers", allow_zero=True),
            sliding_window=_optional_positive(data, "sliding_window"),
            sliding_window_layers=_layer_indices(data, "sliding_window_layers"),
            attention_chunk_size=_optional_positive(data, "attention_chunk_size"),
            chunked_attention_layers=_layer_indices(data, "chunked_attention_layers"),
        )
    if spec.mla is not None and (spec.head_dim is not None or spec.kv_heads != spec.num_attention_heads):
        raise InvalidInput("model.mla sets the head widths and gives every head its own keys and values; "
                           "leave head_dim and num_kv_heads out", field="model.mla", code="mla-with-head-fields")
    if spec.head_dim is None and spec.mla is None and spec.hidden_size % spec.num_attention_heads:
        raise InvalidInput(
            f"hidden_size {spec.hidden_size} is not a multiple of num_attention_heads {spec.num_attention_heads}",
            field="model.hidden_size", code="heads-do-not-divide-hidden")
    if spec.num_attention_heads % spec.kv_heads:
        raise InvalidInput(
            f"num_kv_heads {spec.kv_heads} must divide num_attention_heads {spec.num_attention_heads} (GQA groups)",
            field="model.num_kv_heads", code="kv-heads-do-not-divide-heads")
    _check_local_attention(spec)
    if spec.moe is not None:
        moe = spec.moe
        if moe.experts_per_token > moe.num_experts:
            raise InvalidInput(
                f"experts_per_token {moe.experts_per_token} exceeds num_experts {moe.num_experts}",
                field="model.moe.experts_per_token", code="topk-above-experts")
        if (moe.num_groups is None) != (moe.group_topk is None):
            raise InvalidInput("model.moe.num_groups and model.moe.group_topk come together",
                               field="model.moe.group_topk" if moe.group_topk is None else "model.moe.num_groups",
                               code="missing-field")
        if moe.num_groups is not None and (moe.num_experts % moe.num_groups or moe.group_topk > moe.num_groups):
            raise InvalidInput(f"num_groups {moe.num_groups} must divide num_experts {moe.num_experts} and "
                               f"group_topk {moe.group_topk} must not exceed it", field="model.moe.num_groups",
                               code="groups-do-not-divide-experts")
        if moe.moe_layers is not None and any(i >= spec.num_layers for i in moe.moe_layers):
            raise InvalidInput(f"moe_layers indexes a layer >= num_layers ({spec.num_layers})",
                               field="model.moe.moe_layers", code="layer-out-of-range")
    return spec


# The GPU whose measured kernel ceilings stand for its generation when a cluster is given
# by its figures and an architecture only.
_ARCHITECTURE_REFERENCE_GPU = {"ampere": "a100-80gb", "hopper": "h100-sxm", "blackwell": "b200"}


def cluster_from_dict(data: Mapping[str, Any] | ClusterSpec) -> ClusterSpec:
    """Validate a cluster description into a :class:`ClusterSpec`.

    Accepted forms: ``{"preset": "dgx-h100", "nodes": 8}`` (``num_nodes`` also
    accepted), ``{"gpu": "a100-80gb", "num_nodes": 4}`` with optional overrides,
    or every figure explicitly (``gpus_per_node``, ``num_nodes``,
    ``peak_flops_per_s`` by dtype, ``memory_bytes``, ``hbm_bandwidth_bytes_per_s``,
    ``intra_node_bandwidth_bytes_per_s``, ``inter_node_bandwidth_bytes_per_s``).
    """
    if isinstance(data, ClusterSpec):
        spec = data
    elif isinstance(data, Inventory):
        spec = cluster_from_inventory(data)
    else:
        if not isinstance(data, Mapping):
            raise InvalidInput("cluster must be an object", field="cluster", code="not-an-object")
        if "groups" in data:
            return cluster_from_inventory(inventory_from_json(data))
        allowed = {f.name for f in fields(ClusterSpec)} | {"preset", "gpu", "nodes"}
        reject_unknown(data, allowed, "cluster")
        gpu_name = data.get("gpu")
        if "preset" in data:
            preset = str(data["preset"]).lower()
            if preset not in NODE_PRESETS:
                if preset in INVENTORY_PRESETS:
                    # an inventory preset is a whole node description: nothing else may amend it
                    reject_unknown(data, {"preset", "nodes", "num_nodes"}, "cluster")
                    nodes = data.get("nodes", data.get("num_nodes", 1))
                    return cluster_from_inventory(preset_inventory(preset, 1),
                                                  num_nodes=positive_int(nodes, "cluster.nodes", maximum=MAX_NODES))
                raise InvalidInput(
                    f"unknown cluster preset {data['preset']!r}; known: {sorted(set(NODE_PRESETS) | set(INVENTORY_PRESETS))}",
                    field="cluster.preset", code="unknown-preset")
            if gpu_name is not None and gpu_spec_by_name(str(gpu_name)).name != \
                    gpu_spec_by_name(NODE_PRESETS[preset]).name:
                raise InvalidInput(f"cluster.gpu={gpu_name!r} conflicts with cluster.preset={data['preset']!r}, "
                                   f"whose GPU is {NODE_PRESETS[preset]!r}: give one of them",
                                   field="cluster.gpu", code="conflicting-fields")
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
            }
        if gpu_name is None and str(data.get("architecture", "")).lower() in _ARCHITECTURE_REFERENCE_GPU:
            # figures without a GPU name: the kernel ceilings measured on that generation
            # (a GEMM never reaches the datasheet peak, and Hopper's share is lower than
            # Ampere's, see GPUSpec.gemm_efficiency_max), unless the cluster gives its own
            reference = gpu_spec_by_name(_ARCHITECTURE_REFERENCE_GPU[str(data["architecture"]).lower()])
            base = {"gemm_efficiency_max": reference.gemm_efficiency_max,
                    "fp8_gemm_efficiency_max": reference.fp8_gemm_efficiency_max, "sm_count": reference.sm_count}
        merged = {**base, **{k: v for k, v in data.items() if k not in ("preset", "gpu", "nodes")}}
        if "nodes" in data and "num_nodes" not in data:
            merged["num_nodes"] = data["nodes"]
        for name in ("gpus_per_node", "num_nodes", "peak_flops_per_s", "memory_bytes",
                     "intra_node_bandwidth_bytes_per_s", "inter_node_bandwidth_bytes_per_s"):
            if name not in merged:
                raise InvalidInput(f"cluster.{name} is required (or give a preset / gpu)",
                                   field=f"cluster.{name}", code="missing-field")
        peaks = merged["peak_flops_per_s"]
        if not isinstance(peaks, Mapping) or not peaks:
            raise InvalidInput("cluster.peak_flops_per_s must map dtype -> FLOP/s, e.g. {'bf16': 9.89e14}",
                               field="cluster.peak_flops_per_s", code="not-an-object")
        spec = ClusterSpec(
            gpus_per_node=positive_int(merged["gpus_per_node"], "cluster.gpus_per_node", maximum=MAX_GPUS_PER_NODE),
            num_nodes=positive_int(merged["num_nodes"], "cluster.num_nodes", maximum=MAX_NODES),
            peak_flops_per_s={str(k).lower(): positive_float(v, f"cluster.peak_flops_per_s.{k}")
                              for k, v in peaks.items()},
            memory_bytes=positive_float(merged["memory_bytes"], "cluster.memory_bytes"),
            intra_node_bandwidth_bytes_per_s=positive_float(merged["intra_node_bandwidth_bytes_per_s"],
                                                             "cluster.intra_node_bandwidth_bytes_per_s"),
            inter_node_bandwidth_bytes_per_s=positive_float(merged["inter_node_bandwidth_bytes_per_s"],
                                                             "cluster.inter_node_bandwidth_bytes_per_s"),
            # Without a figure, assume A100-class HBM per unit of compute (2 TB/s per 312 TFLOP/s).
            hbm_bandwidth_bytes_per_s=positive_float(
                merged.get("hbm_bandwidth_bytes_per_s",
                           2.039e12 * max(peaks.values()) / 312e12), "cluster.hbm_bandwidth_bytes_per_s"),
            name=str(merged.get("name", "custom")),
            sm_count=positive_int(merged.get("sm_count", 108), "cluster.sm_count"),
            gemm_efficiency_max=positive_float(merged.get("gemm_efficiency_max", 0.8),
                                                "cluster.gemm_efficiency_max"),
            intra_node_latency_s=positive_float(merged.get("intra_node_latency_s", 2e-6),
                                                 "cluster.intra_node_latency_s"),
            inter_node_latency_s=positive_float(merged.get("inter_node_latency_s", 5e-6),
                                                 "cluster.inter_node_latency_s"),
            nvls_allreduce_speedup=positive_float(merged.get("nvls_allreduce_speedup", 1.0),
                                                   "cluster.nvls_allreduce_speedup"),
            fp8_gemm_efficiency_max=None if merged.get("fp8_gemm_efficiency_max") is None else positive_float(
                merged["fp8_gemm_efficiency_max"], "cluster.fp8_gemm_efficiency_max"),
            architecture=str(merged.get("architecture", "unknown")).lower(),
        )
        if spec.architecture not in GPU_ARCHITECTURES:
            raise InvalidInput(f"cluster.architecture must be one of {list(GPU_ARCHITECTURES)}, "
                               f"got {spec.architecture!r}", field="cluster.architecture", code="unknown-architecture")
    _check_rates(spec)
    if spec.nvls_allreduce_speedup < 1:
        raise InvalidInput("cluster.nvls_allreduce_speedup is a speed-up over the ring (>= 1)",
                           field="cluster.nvls_allreduce_speedup", code="out-of-range")
    for name in ("gemm_efficiency_max", "fp8_gemm_efficiency_max"):
        if (getattr(spec, name) or 0.0) > 1:
            raise InvalidInput(f"cluster.{name} is a fraction of peak (<= 1)",
                               field=f"cluster.{name}", code="out-of-range")
    return spec


def _check_rates(spec: ClusterSpec) -> None:
    """The cluster's rates lie in the ranges an inventory accepts (see partitioners.hardware.inventory);
    a one-node cluster from an inventory has no inter-node link (infinite bandwidth)."""
    for dtype, peak in spec.peak_flops_per_s.items():
        within(peak, f"cluster.peak_flops_per_s.{dtype}", PEAK_FLOPS_RANGE, "FLOP/s")
    for name in ("hbm_bandwidth_bytes_per_s", "intra_node_bandwidth_bytes_per_s", "inter_node_bandwidth_bytes_per_s"):
        value = getattr(spec, name)
        if not (name.startswith("inter") and math.isinf(value) and spec.num_nodes == 1):
            within(value, f"cluster.{name}", BANDWIDTH_RANGE_BYTES_PER_S, "B/s")
    for name in ("intra_node_latency_s", "inter_node_latency_s"):
        within(getattr(spec, name), f"cluster.{name}", LATENCY_RANGE_S, "s")
    within(spec.memory_bytes, "cluster.memory_bytes", CAPACITY_RANGE_BYTES, "bytes")


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
            f"{sorted(types)} and group sizes {sorted(set(sizes.tolist()))}", field="cluster.groups",
            code="heterogeneous-cluster")
    device_type = str(inventory.device_types[0])
    key = device_type.lower()
    known = next((spec for name, spec in (("a100", GPU_SPECS["a100-80gb"]), ("a800", GPU_SPECS["a800-80gb"]),
                                          ("h100", GPU_SPECS["h100-sxm"]), ("h800", GPU_SPECS["h800-sxm"]),
                                          ("h200", GPU_SPECS["h200-sxm"]), ("b200", GPU_SPECS["b200"]))
                  if name in key), None)
    peaks = {dtype: float(values[0]) for dtype, values in inventory.device_peak_flops_by_dtype.items()
             if math.isfinite(float(values[0])) and float(values[0]) > 0}
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
    )


def training_from_dict(data: Mapping[str, Any] | TrainingSpec) -> TrainingSpec:
    """Validate training settings; only Adam and bf16/fp8 are modelled (the issue's scope).

    ``software`` names a :data:`SOFTWARE_PRESETS` entry whose fields apply unless given.
    """
    if isinstance(data, TrainingSpec):
        spec = data
    else:
        if not isinstance(data, Mapping):
            raise InvalidInput("training must be an object", field="training", code="not-an-object")
        reject_unknown(data, {f.name for f in fields(TrainingSpec)} | {"software"}, "training")
        if data.get("software") is not None:
            name = str(data["software"]).lower()
            if name not in SOFTWARE_PRESETS:
                raise InvalidInput(f"training.software must be one of {sorted(SOFTWARE_PRESETS)}, got {name!r}",
                                   field="training.software", code="unknown-software")
            data = {**SOFTWARE_PRESETS[name], **{k: v for k, v in data.items() if k != "software"}}
        if "global_batch_sequences" not in data:
            raise InvalidInput("training.global_batch_sequences is required",
                               field="training.global_batch_sequences", code="missing-field")
        spec = TrainingSpec(
            global_batch_sequences=positive_int(data["global_batch_sequences"], "training.global_batch_sequences"),
            precision=str(data.get("precision", "bf16")).lower(),
            optimizer=str(data.get("optimizer", "adam")).lower(),
            flash_attention=flag(data.get("flash_attention", True), "training.flash_attention"),
            flash_attention_version=_optional_positive(data, "flash_attention_version", "training"),
            sequence_parallel=flag(data.get("sequence_parallel", True), "training.sequence_parallel"),
            overlap_grad_reduce=flag(data.get("overlap_grad_reduce", True), "training.overlap_grad_reduce"),
            overlap_tp_comm=flag(data.get("overlap_tp_comm", False), "training.overlap_tp_comm"),
            overlap_p2p_comm=flag(data.get("overlap_p2p_comm", True), "training.overlap_p2p_comm"),
            flexible_microbatch_groups=flag(data.get("flexible_microbatch_groups", False),
                                            "training.flexible_microbatch_groups"),
            overlap_tp_backward=flag(data.get("overlap_tp_backward", True), "training.overlap_tp_backward"),
            grad_bytes_per_param=positive_int(data.get("grad_bytes_per_param", 4), "training.grad_bytes_per_param"),
            activation_fragmentation=_fragmentation(data.get("activation_fragmentation", ACTIVATION_FRAGMENTATION)),
            gradient_accumulation_fusion=flag(data.get("gradient_accumulation_fusion", True),
                                              "training.gradient_accumulation_fusion"),
            fp32_grad_copy_kept=flag(data.get("fp32_grad_copy_kept", False), "training.fp32_grad_copy_kept"),
            stage_outputs_kept=flag(data.get("stage_outputs_kept", False), "training.stage_outputs_kept"),
            ddp_bucket_copy=flag(data.get("ddp_bucket_copy", False), "training.ddp_bucket_copy"),
            pipeline_scatter_gather=flag(data.get("pipeline_scatter_gather", True), "training.pipeline_scatter_gather"),
            overlap_ep_comm=flag(data.get("overlap_ep_comm", False), "training.overlap_ep_comm"),
            expert_dispatch=str(data.get("expert_dispatch", "all-to-all")).lower(),
            expert_load_imbalance=_load_imbalance(data.get("expert_load_imbalance", 1.2)),
            dropout=flag(data.get("dropout", False), "training.dropout"),
            fp8_scaling=str(data.get("fp8_scaling", "delayed")).lower(),
            partial_recompute=flag(data.get("partial_recompute", True), "training.partial_recompute"),
            selective_recompute=flag(data.get("selective_recompute", True), "training.selective_recompute"),
            fp8_params=flag(data.get("fp8_params", True), "training.fp8_params"),
        )
    if spec.precision not in ("bf16", "fp16", "fp8"):
        raise InvalidInput(f"training.precision must be 'bf16', 'fp16' or 'fp8', got {spec.precision!r}",
                           field="training.precision", code="unknown-precision")
    if spec.fp8_scaling not in ("delayed", "current"):
        raise InvalidInput(f"training.fp8_scaling must be 'delayed' or 'current', got {spec.fp8_scaling!r}",
                           field="training.fp8_scaling", code="unknown-fp8-scaling")
    if spec.expert_dispatch not in EXPERT_DISPATCH_MODES:
        raise InvalidInput(f"training.expert_dispatch must be one of {list(EXPERT_DISPATCH_MODES)}, "
                           f"got {spec.expert_dispatch!r}", field="training.expert_dispatch",
                           code="unknown-expert-dispatch")
    if spec.optimizer not in ("adam", "adamw"):
        raise InvalidInput(f"training.optimizer: only Adam is modelled, got {spec.optimizer!r}",
                           field="training.optimizer", code="unknown-optimizer")
    if spec.flash_attention_version is not None:
        if spec.flash_attention_version not in (1, 2, 3):
            raise InvalidInput("training.flash_attention_version must be 1, 2 or 3",
                               field="training.flash_attention_version", code="out-of-range")
        if not spec.flash_attention:
            raise InvalidInput("training.flash_attention_version is given but flash_attention is off",
                               field="training.flash_attention_version", code="contradiction")
    if spec.grad_bytes_per_param not in (2, 4):
        raise InvalidInput("training.grad_bytes_per_param must be 2 (bf16) or 4 (fp32)",
                           field="training.grad_bytes_per_param", code="out-of-range")
    return spec


def _fragmentation(value: Any) -> float:
    """``training.activation_fragmentation``: a share of the activations' bytes, from 0 to 1."""
    if not is_finite_number(value) or not 0.0 <= value <= 1.0:
        raise InvalidInput(f"training.activation_fragmentation must be a number from 0 (no allocator waste) to 1 "
                           f"(as much again as the activations), got {value!r}",
                           field="training.activation_fragmentation", code="out-of-range")
    return float(value)


def _load_imbalance(value: Any) -> float:
    """``training.expert_load_imbalance``: a number from 1 (balanced) to 64."""
    if not is_finite_number(value) or not 1.0 <= value <= 64.0:
        raise InvalidInput(f"training.expert_load_imbalance must be a number from 1 (every expert as busy as "
                           f"the mean) to 64, got {value!r}", field="training.expert_load_imbalance",
                           code="out-of-range")
    return float(value)


def check_precision_runs(cluster: ClusterSpec, training: TrainingSpec) -> None:
    """Refuse a precision the cluster's GPUs have no tensor-core peak for.

    FP8 GEMMs need Hopper or later (an A100 has no FP8 tensor cores, NVIDIA A100 datasheet);
    predicting such a run at the bf16 rate would silently answer another question. 16-bit
    precisions fall back to the GPU's 16-bit peak, which every GPU has.
    """
    if training.precision == "fp8" and "fp8" not in cluster.peak_flops_per_s:
        raise InvalidInput(f"training.precision='fp8' needs FP8 tensor cores, and the cluster's GPUs "
                           f"({cluster.name}) have no FP8 peak: use bf16, or give cluster.peak_flops_per_s.fp8",
                           field="training.precision", code="not-on-this-gpu")


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
        raise InvalidInput(f"training.flash_attention_version={version}: no measured FlashAttention speeds for "
                           f"{cluster.architecture!r} GPUs (known: {sorted(FLASH_ATTENTION_SPEED)}); leave it out "
                           "for the newest kernel", field="training.flash_attention_version",
                           code="unknown-architecture")
    if version not in speeds:
        raise InvalidInput(f"training.flash_attention_version={version} does not run on {cluster.architecture} "
                           f"GPUs (they run {sorted(speeds)})", field="training.flash_attention_version",
                           code="not-on-this-gpu")
    return speeds[version]


def constraints_from_dict(data: Mapping[str, Any] | Constraints | None) -> Constraints:
    """Validate optional search constraints (fixed tp, max pp, allowed ZeRO stages, ...)."""
    if data is None:
        return Constraints()
    if isinstance(data, Constraints):
        spec = data
    else:
        if not isinstance(data, Mapping):
            raise InvalidInput("constraints must be an object", field="constraints", code="not-an-object")
        reject_unknown(data, {f.name for f in fields(Constraints)}, "constraints")
        kwargs: dict[str, Any] = {}
        for name in ("tp", "pp", "max_pp", "cp", "ep", "etp", "micro_batch_size", "virtual_stages",
                     "recompute_num_layers"):
            if data.get(name) is not None:
                kwargs[name] = positive_int(data[name], f"constraints.{name}")
        if "zero_stages" in data:
            stages = data["zero_stages"]
            if isinstance(stages, (int, str)) or not isinstance(stages, Sequence) or not stages:
                raise InvalidInput("constraints.zero_stages must be a non-empty list of 0..3",
                                   field="constraints.zero_stages", code="out-of-range")
            kwargs["zero_stages"] = tuple(positive_int(z, "constraints.zero_stages[]", allow_zero=True)
                                          for z in stages)
        if "recompute" in data:
            modes = data["recompute"]
            if isinstance(modes, str):
                modes = [modes]
            modes = as_list(modes, "constraints.recompute", f"a list drawn from {list(RECOMPUTE_MODES)}")
            kwargs["recompute"] = tuple(str(m).lower() for m in modes)
        if "allow_uneven_pp" in data:
            kwargs["allow_uneven_pp"] = flag(data["allow_uneven_pp"], "constraints.allow_uneven_pp")
        if "tie_tolerance" in data:
            tolerance = data["tie_tolerance"]
            if isinstance(tolerance, bool) or not isinstance(tolerance, (int, float)) or not math.isfinite(tolerance):
                raise InvalidInput(f"constraints.tie_tolerance must be a number, got {tolerance!r}",
                                   field="constraints.tie_tolerance", code="out-of-range")
            kwargs["tie_tolerance"] = float(tolerance)
        spec = Constraints(**kwargs)
    if not spec.zero_stages or any(z not in (0, 1, 2, 3) for z in spec.zero_stages):
        raise InvalidInput(f"constraints.zero_stages must be drawn from 0..3, got {list(spec.zero_stages)}",
                           field="constraints.zero_stages", code="out-of-range")
    if not spec.recompute or any(m not in RECOMPUTE_MODES for m in spec.recompute):
        raise InvalidInput(f"constraints.recompute must be drawn from {list(RECOMPUTE_MODES)}",
                           field="constraints.recompute", code="out-of-range")
    if not 0 <= spec.tie_tolerance < 0.5:
        raise InvalidInput("constraints.tie_tolerance must be in [0, 0.5)", field="constraints.tie_tolerance",
                           code="out-of-range")
    return spec


LAYOUT_FIELDS: tuple[str, ...] = ("dp", "tp", "pp", "cp", "ep", "etp", "virtual_stages", "micro_batch_size",
                                  "zero_stage", "recompute", "recompute_num_layers")


def layout_from_dict(data: Any, where: str) -> dict[str, Any]:
    """Validate one layout to predict (a request's ``evaluate[k]``): the fields it fixes.

    Each field is checked under its own name (``evaluate[0].tp``), so an error points
    at the layout, not at search constraints. ``recompute_num_layers`` counts the
    layers of each model chunk that full recomputation covers: 0 beside ``none`` or
    ``selective`` (as every candidate reports it, so a candidate sent back as it came
    is predicted as it was), at least 1 beside ``full``; given alone, 0 means "no full
    recomputation" and more means ``full``. Returns the given fields, checked, with
    ``recompute`` lower-cased; absent and null fields are left out.
    """
    if not isinstance(data, Mapping):
        raise InvalidInput(f"{where} must be an object", field=where, code="not-an-object")
    reject_unknown(data, set(LAYOUT_FIELDS), where)
    layout: dict[str, Any] = {}
    for name in ("dp", "tp", "pp", "cp", "ep", "etp", "virtual_stages", "micro_batch_size"):
        if data.get(name) is not None:
            layout[name] = positive_int(data[name], f"{where}.{name}")
    if data.get("zero_stage") is not None:
        layout["zero_stage"] = positive_int(data["zero_stage"], f"{where}.zero_stage", allow_zero=True, maximum=3)
    if data.get("recompute") is not None:
        mode = data["recompute"]
        if not isinstance(mode, str) or mode.lower() not in RECOMPUTE_MODES:
            raise InvalidInput(f"{where}.recompute must be one of {list(RECOMPUTE_MODES)}, got {mode!r}",
                               field=f"{where}.recompute", code="out-of-range")
        layout["recompute"] = mode.lower()
    if data.get("recompute_num_layers") is not None:
        layers = positive_int(data["recompute_num_layers"], f"{where}.recompute_num_layers", allow_zero=True)
        mode = layout.get("recompute")
        if layers == 0 and mode == "full":
            raise InvalidInput(f"{where}: recompute 'full' with recompute_num_layers 0 recomputes no layer; "
                               "give at least 1, or leave it out to recompute every layer",
                               field=f"{where}.recompute_num_layers", code="contradiction")
        if layers > 0 and mode in ("none", "selective"):
            raise InvalidInput(f"{where}: recompute_num_layers counts fully recomputed layers, so it needs "
                               f"recompute 'full' (got {mode!r}; 0 goes with {mode!r})",
                               field=f"{where}.recompute_num_layers", code="contradiction")
        layout["recompute_num_layers"] = layers
    return layout
