"""Published large-model training runs used to validate the 3D-parallel planner.

Each row is a model shape, a cluster, a batch, the layout the authors used and
what they measured, with the source. ``software`` records the framework of the
time (it changes both time and memory: Megatron-LM in 2021 had no flash
attention, no sequence parallelism, no distributed optimizer and used full
activation recomputation), and ``search`` the choices that existed then.

Sources
-------
SC21
    D. Narayanan, M. Shoeybi, J. Casper, P. LeGresley, M. Patwary, V. Korthikanti,
    D. Vainbrand, P. Kashinkunti, J. Bernauer, B. Catanzaro, A. Phanishayee,
    M. Zaharia, "Efficient Large-Scale Language Model Training on GPU Clusters Using
    Megatron-LM", SC21, arXiv:2104.04473, Table 1 (weak scaling, GPT, sequence 2048,
    vocabulary 51,200, Selene DGX A100 80 GB nodes; the Megatron-LM README states
    the 80 GB parts). "Achieved teraFLOP/s per GPU" counts recomputed FLOPs (their
    eq. 3 with the factor 96), i.e. it is a hardware-FLOPs utilisation.
KORTHIKANTI22
    V. Korthikanti, J. Casper, S. Lym, L. McAfee, M. Andersch, M. Shoeybi,
    B. Catanzaro, "Reducing Activation Recomputation in Large Transformer Models",
    MLSys 2023, arXiv:2205.05198, Table 3 (configurations: data-parallel size 1,
    global batch = GPU count, micro-batch 1, 22B with micro-batch 4) and the MFU/HFU
    table reproduced in the NVIDIA/Megatron-LM README ("22B 41.5% / 43.7%, 175B
    51.4% / 52.8%, 530B 56.0% / 57.0%, 1T 56.3% / 57.0%"), sequence parallelism +
    selective recomputation. Memory: their Figure 1 shows the tensor-parallel
    baseline without recomputation above the 80 GB of an A100 for these models,
    and sequence parallelism + selective recomputation under it (the runs above).
MEGATRON_BRIDGE_H100
    NVIDIA NeMo Megatron-Bridge, "Performance Summary" (docs/performance-summary.md and
    its archive, containers 25.11 and 26.02), DGX-H100 pre-training rows in FP8
    (current scaling) with the layouts of the recipes that produced them
    (scripts/performance/configs/llama: llama3_workload_base_configs.py,
    llama31_workload_base_configs.py, llama3[1]_llm_pretrain.py): no recomputation, no
    offloading, gradients reduced in bf16 (``grad_reduce_in_fp32 = False``) and
    tensor-parallel communication overlap (Transformer Engine userbuffers). A benchmark of
    today's stack, not a production run: it checks the memory model of that stack (these
    layouts ran) and the H100 FP8 speed.
MEGATRON_BRIDGE_H100_MOE
    The same summary's DGX-H100 mixture-of-experts rows (NeMo 26.02: GPT-OSS 120B,
    Qwen3-30B-A3B, Qwen3-235B-A22B) with their recipes' layouts, experts never split over
    tensor ranks (Qwen3-235B's 32 expert ranks folded over tp 2 x dp 16). Also outside the
    targets: force-balanced expert load, a benchmark of the MoE cost model.
MODELZOO_QWEN3_H100
    NVIDIA's Megatron-MoE-ModelZoo H100 table: Qwen3-235B-A22B on 256 H100s in five layouts
    (expert parallelism across or inside nodes, DeepEP or all-to-all dispatch, all-to-all
    overlap, FSDP, pipeline 1 to 32) with their step times. A controlled comparison of the
    MoE cost model, outside the targets.
NEMO_2407_H100
    NVIDIA NeMo 24.07 "Performance Benchmarks" (docs/source/performance/performance_summary.md),
    DGX-H100 FP8 pre-training: GPT-3, Llama 2 and 3, Nemotron; layouts as published,
    recomputation left to the planner (the table does not state it). Also a check of
    today's stack, outside the targets.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from partitioners.parallel3d.spec_fields import spec_from_mapping
from partitioners.parallel3d.specs import ClusterSpec, Constraints, ModelSpec, TrainingSpec

__all__ = [
    "specs_of",
    "constraints_of",
    "A100_PEAK_BF16_FLOPS",
    "SC21_TABLE1",
    "KORTHIKANTI22",
    "KNOWN_OUT_OF_MEMORY",
    "SC21_FIGURE17_MEMORY",
    "SC21_COMPARISONS",
    "KORTHIKANTI22_RECOMPUTE_COMPARISON",
    "MEGATRON_BRIDGE_H100",
    "NEMO_2407_H100",
    "MEGATRON_BRIDGE_H100_MOE",
    "MEGATRON_BRIDGE_H100_MOE_OTHER_CONTAINERS",
    "MODELZOO_QWEN3_H100",
    "LLAMA3_405B_TABLE4",
    "BIGSCIENCE_LAYOUT_SEARCH",
    "JEAN_ZAY_INTER_NODE_BYTES_PER_S",
    "JEAN_ZAY_FITTED_INTER_NODE_BYTES_PER_S",
    "gpt",
]

# NVIDIA A100 datasheet: 312 TFLOP/s dense BF16/FP16.
A100_PEAK_BF16_FLOPS = 312e12


def specs_of(
    model: Mapping[str, Any], cluster: Mapping[str, Any], training: Mapping[str, Any]
) -> tuple[ModelSpec, ClusterSpec, TrainingSpec]:
    """The planner's inputs for a run below, whose fields are written as a request would send them."""
    return (
        spec_from_mapping(ModelSpec, model),
        spec_from_mapping(ClusterSpec, cluster),
        spec_from_mapping(TrainingSpec, training),
    )


def constraints_of(search: Mapping[str, Any] | None) -> Constraints | None:
    """A run's search constraints (None: the defaults)."""
    return None if search is None else spec_from_mapping(Constraints, search)


# Megatron-LM of 2021: no flash attention, no sequence parallelism, tensor-parallel
# all-reduces in line (the asynchronous input-gradient all-reduce came in 2022).
# Precision as the authors ran it: examples/sc21/CONFIG.sh passes ``--fp16 --loss-scale
# 8192`` and not ``--accumulate-allreduce-grads-in-fp32``, which Megatron-LM turns on by
# itself only for bf16; so gradients were accumulated and all-reduced in 2-byte fp16.
# Its fp16 optimizer kept the fp32 copy of those gradients between steps, and its
# 1F1B schedule kept every in-flight micro-batch's stage output until the backward
# (TrainingSpec.fp32_grad_copy_kept, stage_outputs_kept). Megatron-LM's dropout defaults
# (--hidden-dropout and --attention-dropout 0.1) were on, as in GPT-3; Korthikanti et al.
# count the masks they keep.
SC21_SOFTWARE = {"software": "megatron-lm-2021", "precision": "fp16", "grad_bytes_per_param": 2}
# What Megatron-LM of 2021-2022 could run (no ZeRO, even pipeline stages: "num_layers must
# be divisible by pipeline_model_parallel_size", ParallelTransformer in
# megatron/model/transformer.py; full recomputation only in 2021) is the software preset's
# own search space (presets.SOFTWARE_SEARCH): the rows add no constraint of their own.
SC21_SEARCH = None
# Megatron-LM as released with sequence parallelism: its column-parallel linears run the
# backward reduce-scatter / all-gather asynchronously under their GEMMs
# (LinearWithGradAccumulationAndAsyncCommunication), so overlap_tp_backward keeps its default
# (True) -- an assumption: the paper does not say so for its runs.
KORTHIKANTI_SOFTWARE = {"software": "megatron-lm-2022"}
KORTHIKANTI_SEARCH = None


def gpt(layers: int, hidden: int, heads: int) -> dict[str, Any]:
    """A GPT-3-style model as the two papers define it (4h MLP, MHA, sequence 2048, vocabulary 51,200).

    Input and output embeddings are tied: SC21 eq. (2), ``P = 12lh^2(1 + 13/(12h) + (V+s)/(12lh))``,
    counts the ``V h`` word embedding once (Megatron-LM's GPT shares it with the output layer),
    and the ``s h`` learned position table.
    """
    return {
        "num_layers": layers,
        "hidden_size": hidden,
        "num_attention_heads": heads,
        "seq_length": 2048,
        "vocab_size": 51200,
        "tie_embeddings": True,
        "learned_position_embeddings": True,
    }


# (name, heads, hidden, layers, tp, pp, GPUs, global batch, achieved TFLOP/s per GPU,
#  micro-batch, virtual stages, DDP). Micro-batch, interleaving depth and data-parallel
# implementation are those of the authors' script for the table,
# NVIDIA/Megatron-LM examples/sc21/run_table_1.sh (MBS; v = layers / pp /
# --num-layers-per-virtual-pipeline-stage; DDP=torch or local; all with
# --recompute-method uniform, i.e. full recomputation).
_SC21_ROWS = [
    ("1.7B", 24, 2304, 24, 1, 1, 32, 512, 137, 16, 1, "torch"),
    ("3.6B", 32, 3072, 30, 2, 1, 64, 512, 138, 16, 1, "torch"),
    ("7.5B", 32, 4096, 36, 4, 1, 128, 512, 142, 16, 1, "torch"),
    ("18.4B", 48, 6144, 40, 8, 1, 256, 1024, 135, 8, 1, "torch"),
    ("39.1B", 64, 8192, 48, 8, 2, 512, 1536, 138, 4, 1, "local"),
    ("76.1B", 80, 10240, 60, 8, 4, 1024, 1792, 140, 2, 3, "local"),
    ("145.6B", 96, 12288, 80, 8, 8, 1536, 2304, 148, 2, 2, "local"),
    ("310.1B", 128, 16384, 96, 8, 16, 1920, 2160, 155, 1, 2, "local"),
    ("529.6B", 128, 20480, 105, 8, 35, 2520, 2520, 163, 1, 3, "local"),
    ("1008.0B", 160, 25600, 128, 8, 64, 3072, 3072, 163, 1, 1, "local"),
]

# PyTorch DistributedDataParallel all-reduces gradient buckets while the backward pass
# runs (Li et al., "PyTorch Distributed", VLDB 2020), in the parameters' precision (fp16
# here, see SC21_SOFTWARE), into buckets that copy the gradients (no
# gradient_as_bucket_view then). Megatron's local DDP reduced its contiguous gradient
# buffer after the backward pass (SC21_SOFTWARE).
_DDP_SOFTWARE = {
    "torch": {"overlap_grad_reduce": True, "ddp_bucket_copy": True},
    "local": {},
}

SC21_TABLE1 = [
    {
        "source": "SC21 Table 1",
        "name": f"GPT-{name}",
        "model": gpt(layers, hidden, heads),
        "cluster": {"preset": "dgx-a100", "nodes": gpus // 8},
        "training": {"global_batch_sequences": batch, **SC21_SOFTWARE, **_DDP_SOFTWARE[ddp]},
        "search": SC21_SEARCH,
        "published": {
            "tp": tp,
            "pp": pp,
            "micro_batch_size": mbs,
            "virtual_stages": v,
            "recompute": "full",
            "zero_stage": 0,
        },
        "published_hfu": tflops * 1e12 / A100_PEAK_BF16_FLOPS,
        "published_mfu": None,
    }
    for name, heads, hidden, layers, tp, pp, gpus, batch, tflops, mbs, v, ddp in _SC21_ROWS
]

# (name, heads, hidden, layers, tp, pp, GPUs, global batch, micro-batch, MFU, HFU)
_KORTHIKANTI_ROWS = [
    ("22B", 64, 6144, 48, 8, 1, 8, 4, 4, 0.415, 0.437),
    ("175B", 96, 12288, 96, 8, 8, 64, 64, 1, 0.514, 0.528),
    ("530B", 128, 20480, 105, 8, 35, 280, 280, 1, 0.560, 0.570),
    ("1T", 160, 25600, 128, 8, 64, 512, 512, 1, 0.563, 0.570),
]

KORTHIKANTI22: list[dict[str, Any]] = [
    {
        "source": "Korthikanti et al. 2022, Table 3 + MFU/HFU table",
        "name": f"GPT-{name}",
        "model": gpt(layers, hidden, heads),
        "cluster": {"preset": "dgx-a100", "nodes": gpus // 8},
        "training": {"global_batch_sequences": batch, "precision": "bf16", **KORTHIKANTI_SOFTWARE},
        "search": KORTHIKANTI_SEARCH,
        # the paper names no interleaving: Megatron-LM's default, plain 1F1B (v = 1)
        "published": {
            "tp": tp,
            "pp": pp,
            "micro_batch_size": mbs,
            "virtual_stages": 1,
            "recompute": "selective",
            "zero_stage": 0,
        },
        "published_hfu": hfu,
        "published_mfu": mfu,
    }
    for name, heads, hidden, layers, tp, pp, gpus, batch, mbs, mfu, hfu in _KORTHIKANTI_ROWS
]

# Layouts the same paper reports as not fitting in 80 GB: the tensor-parallel baseline
# (no sequence parallelism, no recomputation) of each Korthikanti configuration (their Figure 1).
KNOWN_OUT_OF_MEMORY = [
    {
        **row,
        "name": row["name"] + " tp-only, no recompute",
        "training": {**row["training"], "sequence_parallel": False},
        "published": {**row["published"], "recompute": "none", "virtual_stages": 1},
    }
    for row in KORTHIKANTI22
]


# Korthikanti et al.'s own side-by-side figure (abstract): the 530B model on 2,240 A100s
# "achieve[s] a Model Flops Utilization of 54.2%, which is 29% faster than the 42.1% we
# achieve using recomputation", i.e. sequence parallelism + selective recomputation against
# the tensor-parallel baseline with full recomputation (no sequence parallelism), same
# layout: (t, p) = (8, 35) as in Table 3, so d = 8. The abstract gives no batch; assumed
# 2,240 (d x the 280 micro-batches of Table 3's 280-GPU configuration); 1,920-2,520 move the
# predicted MFU by under 1.5%.
KORTHIKANTI22_RECOMPUTE_COMPARISON = {
    "source": "Korthikanti et al. 2022, abstract",
    "name": "GPT-530B on 2240 GPUs",
    "model": KORTHIKANTI22[2]["model"],
    "cluster": {"preset": "dgx-a100", "nodes": 280},
    "search": KORTHIKANTI_SEARCH,
    "cases": [
        {
            "label": "sequence parallel + selective recomputation",
            "training": {"global_batch_sequences": 2240, "precision": "bf16", **KORTHIKANTI_SOFTWARE},
            "layout": {
                "tp": 8,
                "pp": 35,
                "micro_batch_size": 1,
                "virtual_stages": 1,
                "recompute": "selective",
                "zero_stage": 0,
            },
            "published_mfu": 0.542,
        },
        {
            "label": "full recomputation, no sequence parallelism",
            "training": {
                "global_batch_sequences": 2240,
                "precision": "bf16",
                **KORTHIKANTI_SOFTWARE,
                "sequence_parallel": False,
            },
            "layout": {
                "tp": 8,
                "pp": 35,
                "micro_batch_size": 1,
                "virtual_stages": 1,
                "recompute": "full",
                "zero_stage": 0,
            },
            "published_mfu": 0.421,
        },
    ],
}


# SC21 Sec. 5.6 / Figure 17: the 145.6B model on 128 GPUs, (t, p) = (8, 16), micro-batch 1,
# non-interleaved 1F1B, without activation recomputation (NVIDIA/Megatron-LM
# examples/sc21/run_figure_17.sh, ACTIVATION_RECOMPUTATION=NO). "Activation recomputation is
# needed to support larger batch sizes" and recomputation's best throughput is "up to 2x
# higher than the best throughput achieved without activation recomputation (for a smaller
# batch size)". With 1F1B the first stage holds min(m, p) micro-batches, so memory stops
# growing at batch 16: the curve without recomputation can only end below 16, i.e. batch 16
# (16 micro-batches in flight) does not fit in 80 GB. Batch 8 is plotted without it (fits).
SC21_FIGURE17_MEMORY = [
    {
        "source": "SC21 Sec. 5.6, Figure 17 (run_figure_17.sh)",
        "name": f"GPT-145.6B (8,16) no recompute, batch {batch}",
        "model": gpt(80, 12288, 96),
        "cluster": {"preset": "dgx-a100", "nodes": 16},
        "training": {"global_batch_sequences": batch, **SC21_SOFTWARE},
        "search": SC21_SEARCH,
        "published": {
            "tp": 8,
            "pp": 16,
            "micro_batch_size": 1,
            "virtual_stages": 1,
            "recompute": "none",
            "zero_stage": 0,
        },
        "fits": fits,
    }
    for batch, fits in ((8, True), (16, False))
]

# The same figure's throughput, which says where the curve without recomputation ends: at
# large batches recomputation's throughput is "up to 2x higher than the best throughput
# achieved without activation recomputation (for a smaller batch size)", and at small
# batches recomputation "leads to up to 33% lower throughput" (Sec. 5.6). run_figure_17.sh
# sweeps batch 1-256 with and without recomputation. bench.parallel3d reads the "2x" against
# the predicted throughput: the batch it points to is the largest one run without recomputation.
SC21_FIGURE17_THROUGHPUT = {
    "source": "SC21 Sec. 5.6, Figure 17",
    "row": SC21_FIGURE17_MEMORY[0],
    "batches": (1, 2, 4, 8, 16, 32, 64, 128, 256),
    "stated_best_ratio": 2.0,
    "stated_small_batch_loss": 0.33,
}


def _sc21_point(
    label: str,
    layers: int,
    hidden: int,
    heads: int,
    nodes: int,
    tp: int,
    pp: int,
    micro_batch_size: int = 1,
    virtual_stages: int = 1,
    **training: Any,
) -> dict[str, Any]:
    """One bar of an SC21 figure: a GPT shape on DGX A100 nodes, run as examples/sc21 ran it
    (``training``: flags the figure changes on top of SC21_SOFTWARE)."""
    return {
        "label": label,
        "model": gpt(layers, hidden, heads),
        "cluster": {"preset": "dgx-a100", "nodes": nodes},
        "layout": {
            "tp": tp,
            "pp": pp,
            "micro_batch_size": micro_batch_size,
            "virtual_stages": virtual_stages,
            "recompute": "full",
            "zero_stage": 0,
        },
        "training": training,
    }


# SC21's controlled comparisons (Sec. 5.3-5.5 and 5.9, Figures 11-16 and 18): one model on one cluster,
# layouts that differ in a single choice, measured side by side in "achieved teraFLOP/s per
# GPU" (recomputation counted). Shapes, layouts, batches and flags are those of the
# authors' scripts (NVIDIA/Megatron-LM examples/sc21/run_figure_1[1-68].sh: micro-batch 1
# unless varied, full recomputation, DDP=local). What is checked is the finding each
# section states in its text (paraphrased here), not bar heights read off a plot:
#   "peak": the named layout is the fastest at every batch;
#   "decreasing": throughput falls from each layout to the next at every batch;
#   "larger-batch-scales-better": from the first layout to the last, the larger batch loses less;
#   "gap-closing": the second layout beats the first at every batch, by less as the batch grows;
#   "faster": the second beats the first at every batch (the stated gain is printed beside).
SC21_COMPARISONS = [
    {
        "figure": "Figure 11",
        "section": "5.3.1",
        "finding": "larger-batch-scales-better",
        "what": "weak scaling of pipeline parallelism: 3 layers of the 20480-wide GPT per stage, tp 8, one node per stage",
        "claim": "per-GPU throughput falls as the pipeline grows, and less at the larger batch, whose bubble is "
        "amortised over more micro-batches",
        "batches": (8, 128),
        "points": [_sc21_point(f"pp {pp}", 3 * pp, 20480, 128, pp, 8, pp) for pp in (1, 2, 4, 8)],
    },
    {
        "figure": "Figure 12",
        "section": "5.3.2",
        "finding": "gap-closing",
        "what": "GPT-175B, (t, p) = (8, 12) on 96 GPUs, 1F1B against the interleaved schedule (2 layers per model chunk)",
        "claim": "the interleaved schedule is faster, and the gap closes as the batch grows (smaller bubble of "
        "the default schedule, more point-to-point traffic in the interleaved one)",
        "batches": (12, 24, 36, 48, 60),
        "points": [
            _sc21_point("1F1B", 96, 12288, 96, 12, 8, 12),
            _sc21_point("interleaved", 96, 12288, 96, 12, 8, 12, virtual_stages=4),
        ],
    },
    {
        "figure": "Figure 13",
        "section": "5.4.1",
        "finding": "peak",
        "expected": "(8, 8)",
        "what": "GPT-162.2B (32 layers, hidden 20480) on 64 GPUs, t x p = 64",
        "claim": "throughput peaks with tensor parallelism over the 8 GPUs of a node and pipeline parallelism "
        "across nodes: (t, p) = (8, 8)",
        "batches": (32, 128),
        "points": [_sc21_point(f"({64 // pp}, {pp})", 32, 20480, 128, 8, 64 // pp, pp) for pp in (2, 4, 8, 16, 32)],
    },
    {
        "figure": "Figure 14",
        "section": "5.4.2",
        "finding": "decreasing",
        "what": "GPT-5.9B (32 layers, hidden 3840) on 64 GPUs, tp 1, p x d = 64",
        "claim": "throughput falls as the pipeline-parallel size grows at each batch size: pipelines are for "
        "models that do not fit, data parallelism for scale",
        "batches": (32, 512),
        "points": [_sc21_point(f"pp {pp}", 32, 3840, 32, 8, 1, pp) for pp in (2, 4, 8, 16, 32)],
    },
    {
        "figure": "Figure 15",
        "section": "5.4.3",
        "finding": "decreasing",
        "what": "GPT-5.9B on 64 GPUs, pp 1, t x d = 64",
        "claim": "throughput falls as the tensor-parallel size grows: its all-reduces run every micro-batch, "
        "across nodes past 8, on ever smaller matrix multiplications",
        "batches": (32, 128, 512),
        "points": [_sc21_point(f"tp {tp}", 32, 3840, 32, 8, tp, 1) for tp in (2, 4, 8, 16, 32)],
    },
    {
        "figure": "Figure 16",
        "section": "5.5",
        "finding": "peak",
        "expected": "micro-batch 2",
        "what": "GPT-91B (32 layers, hidden 15360), (t, p) = (8, 8) on 64 GPUs, micro-batch 1-8",
        "claim": "the best micro-batch size for this model is 2: larger ones use the GPU better but leave fewer "
        "micro-batches to fill the pipeline",
        "batches": (128, 512),
        "points": [
            _sc21_point(f"micro-batch {mbs}", 32, 15360, 128, 8, 8, 8, micro_batch_size=mbs) for mbs in (1, 2, 4, 8)
        ],
    },
    {
        "figure": "Figure 18",
        "section": "5.9",
        "finding": "faster",
        "stated_gain": 0.11,
        "what": "GPT-175B, (t, p) = (8, 12) interleaved on 96 GPUs, pipeline sends whole or scattered over the "
        "tensor ranks and all-gathered over NVLink",
        "claim": "the scatter/gather optimization raises throughput, by up to 11% where the schedule communicates "
        "most (interleaving, large batches)",
        "batches": (12, 24, 36, 48, 60),
        "points": [
            _sc21_point("whole", 96, 12288, 96, 12, 8, 12, virtual_stages=4, pipeline_scatter_gather=False),
            _sc21_point("scatter/gather", 96, 12288, 96, 12, 8, 12, virtual_stages=4),
        ],
    },
]


# Llama 3 shapes (Meta's model cards: 70B 80 x 8192, 64 heads, 8 KV heads, FFN 28,672;
# 405B 126 x 16,384, 128 heads, 8 KV heads, FFN 53,248; vocabulary 128,256; SwiGLU, no dropout).
_LLAMA3_70B = {
    "num_layers": 80,
    "hidden_size": 8192,
    "num_attention_heads": 64,
    "num_kv_heads": 8,
    "ffn_hidden_size": 28672,
    "gated_mlp": True,
    "seq_length": 8192,
    "vocab_size": 128256,
}
_LLAMA31_405B = {
    "num_layers": 126,
    "hidden_size": 16384,
    "num_attention_heads": 128,
    "num_kv_heads": 8,
    "ffn_hidden_size": 53248,
    "gated_mlp": True,
    "seq_length": 8192,
    "vocab_size": 128256,
}
_BRIDGE_SOFTWARE = {"precision": "fp8", "fp8_scaling": "current", "grad_bytes_per_param": 2, "overlap_tp_comm": True}

# (name, model, GPUs, global batch, tp, pp, cp, virtual stages, container, tokens/s per GPU)
_BRIDGE_ROWS = [
    ("Llama3-70B", _LLAMA3_70B, 64, 128, 4, 8, 1, 5, "25.11", 1602),
    ("Llama3-70B", _LLAMA3_70B, 64, 256, 4, 8, 1, 5, "26.02", 1621),
    ("Llama3.1-405B", _LLAMA31_405B, 1024, 512, 8, 8, 2, 8, "25.11", 292),
    ("Llama3.1-405B", _LLAMA31_405B, 1024, 1536, 8, 8, 2, 8, "26.02", 311),
]

MEGATRON_BRIDGE_H100 = [
    {
        "source": f"Megatron-Bridge performance summary, NeMo {container}, DGX-H100 FP8-CS",
        "name": f"{name} FP8 batch {batch}",
        "model": model,
        "cluster": {"preset": "dgx-h100", "nodes": gpus // 8},
        "training": {"global_batch_sequences": batch, **_BRIDGE_SOFTWARE},
        "search": None,
        "published": {
            "tp": tp,
            "pp": pp,
            "cp": cp,
            "virtual_stages": v,
            "micro_batch_size": 1,
            "recompute": "none",
            "zero_stage": 1,
        },
        "published_tokens_per_s_per_gpu": float(tokens_per_gpu),
    }
    for name, model, gpus, batch, tp, pp, cp, v, container, tokens_per_gpu in _BRIDGE_ROWS
]


# NVIDIA NeMo 24.07 performance summary (NVIDIA/NeMo docs/source/performance/performance_summary.md,
# "pre-training performance ... at FP8 precision", DGX-H100): layouts (TP, PP, CP, VP, micro-batch),
# global batches and tokens/s per GPU of its pre-training table, which does not say whether a
# run recomputed activations: the planner chooses. Gradients reduced in bf16 and tensor-parallel
# overlap are assumed as in the Megatron-Bridge recipes above; FP8 with delayed scaling, the
# Transformer Engine default of the time. Shapes: GPT-3 as NeMo's gpt3 configs (4h MLP, tied
# embeddings, learned positions, the GPT-2 vocabulary padded to 50,304); Llama 2 and 3 as Meta's
# model cards; Nemotron-8B as NeMo-Framework-Launcher's (32 x 4096, FFN 16,384, 32 heads, sequence
# 4,096; squared-ReLU MLP, i.e. not gated) with the 256,000-token Nemotron vocabulary; Nemotron-4
# 340B as its technical report (96 x 18,432, 96 heads, 8 KV heads, FFN 73,728). The table's
# Nemotron-22B is left out: its shape is not published.
def _nemo_gpt3(layers: int, hidden: int, heads: int) -> dict[str, Any]:
    return {**gpt(layers, hidden, heads), "vocab_size": 50304}


def _llama2(layers: int, hidden: int, heads: int, kv_heads: int, ffn: int) -> dict[str, Any]:
    return {
        "num_layers": layers,
        "hidden_size": hidden,
        "num_attention_heads": heads,
        "num_kv_heads": kv_heads,
        "ffn_hidden_size": ffn,
        "gated_mlp": True,
        "seq_length": 4096,
        "vocab_size": 32000,
    }


_NEMOTRON = {"seq_length": 4096, "vocab_size": 256000}
_NEMO_2407_SOFTWARE = {"precision": "fp8", "grad_bytes_per_param": 2, "overlap_tp_comm": True}
# (name, model, GPUs, global batch, micro-batch, tp, pp, cp, virtual stages, tokens/s per GPU)
_NEMO_2407_ROWS = [
    ("GPT3-5B", _nemo_gpt3(24, 4096, 32), 64, 2048, 4, 1, 1, 1, 1, 22521),
    ("GPT3-20B", _nemo_gpt3(44, 6144, 48), 64, 256, 2, 2, 1, 1, 1, 5851),
    ("GPT3-175B", _nemo_gpt3(96, 12288, 96), 128, 256, 1, 4, 8, 1, 6, 726),
    ("GPT3-175B", _nemo_gpt3(96, 12288, 96), 512, 2048, 2, 4, 8, 1, 6, 782),
    ("Llama2-7B", _llama2(32, 4096, 32, 32, 11008), 8, 128, 1, 1, 1, 1, 1, 16847),
    ("Llama2-13B", _llama2(40, 5120, 40, 40, 13824), 16, 128, 1, 1, 4, 1, 10, 8646),
    ("Llama2-70B", _llama2(80, 8192, 64, 8, 28672), 64, 128, 1, 4, 4, 1, 20, 1707),
    (
        "Nemotron-8B",
        {"num_layers": 32, "hidden_size": 4096, "num_attention_heads": 32, "ffn_hidden_size": 16384, **_NEMOTRON},
        64,
        256,
        4,
        2,
        1,
        1,
        1,
        12701,
    ),
    (
        "Nemotron-4-340B",
        {
            "num_layers": 96,
            "hidden_size": 18432,
            "num_attention_heads": 96,
            "num_kv_heads": 8,
            "ffn_hidden_size": 73728,
            **_NEMOTRON,
        },
        128,
        32,
        1,
        8,
        8,
        1,
        12,
        322,
    ),
    (
        "Llama3-8B",
        {**_LLAMA3_70B, "num_layers": 32, "hidden_size": 4096, "num_attention_heads": 32, "ffn_hidden_size": 14336},
        8,
        128,
        1,
        1,
        1,
        2,
        1,
        12036,
    ),
    ("Llama3-70B", _LLAMA3_70B, 64, 128, 1, 4, 4, 2, 5, 1533),
]

NEMO_2407_H100 = [
    {
        "source": "NeMo 24.07 performance summary, DGX-H100 FP8",
        "name": f"{name} FP8 batch {batch}",
        "model": model,
        "cluster": {"preset": "dgx-h100", "nodes": gpus // 8},
        "training": {"global_batch_sequences": batch, **_NEMO_2407_SOFTWARE},
        "search": None,
        "published": {"tp": tp, "pp": pp, "cp": cp, "virtual_stages": v, "micro_batch_size": mbs, "zero_stage": 1},
        "published_tokens_per_s_per_gpu": float(tokens_per_gpu),
    }
    for name, model, gpus, batch, mbs, tp, pp, cp, v, tokens_per_gpu in _NEMO_2407_ROWS
]


# DeepSeek-V3 (DeepSeek-AI, "DeepSeek-V3 Technical Report", arXiv:2412.19437, 2024): shape
# from its Hugging Face config.json (61 layers, the first 3 dense; MLA; 256 routed experts
# in 8 groups, 8 per token from at most 4 groups, 1 shared). Sec. 3.1-3.3: 2048 H800 GPUs, 16-way pipeline
# (DualPipe, which overlaps the expert all-to-all with another micro-batch's computation),
# 64-way expert parallelism over 8 nodes, ZeRO-1 data parallelism, no tensor parallelism;
# node-deduplicated dispatch in FP8, FP8 GEMMs, RMSNorm and MLA up-projections recomputed;
# batch 15,360 sequences of 4,096 tokens after its ramp. Table 1: 180K H800 GPU hours per
# trillion tokens, i.e. 10^12 / (180,000 x 3,600) = 1,543 tokens/s per GPU, averaged over
# the whole run (its batch ramp and anything else the GPU hours include). Its
# multi-token-prediction module (one more layer and output head) is not modelled.
DEEPSEEK_V3 = {
    "num_layers": 61,
    "hidden_size": 7168,
    "num_attention_heads": 128,
    "ffn_hidden_size": 18432,
    "gated_mlp": True,
    "seq_length": 4096,
    "vocab_size": 129280,
    "mla": {
        "q_lora_rank": 1536,
        "kv_lora_rank": 512,
        "qk_nope_head_dim": 128,
        "qk_rope_head_dim": 64,
        "v_head_dim": 128,
    },
    "moe": {
        "num_experts": 256,
        "experts_per_token": 8,
        "expert_ffn_hidden_size": 2048,
        "shared_experts": 1,
        "moe_layers": list(range(3, 61)),
        "num_groups": 8,
        "group_topk": 4,
    },
}
DEEPSEEK_V3_H800 = {
    "source": "DeepSeek-V3 Technical Report, Sec. 3 and Table 1",
    "name": "DeepSeek-V3 671B FP8",
    "model": DEEPSEEK_V3,
    "cluster": {"preset": "hgx-h800", "nodes": 256},
    # its own framework casts each weight to FP8 (128 x 128 blocks) for the GEMMs from the
    # higher-precision copy the optimizer updates (Sec. 3.3), not NVIDIA's FP8-only weights
    "training": {
        "global_batch_sequences": 15360,
        "precision": "fp8",
        "expert_dispatch": "node-deduplicated",
        "overlap_ep_comm": True,
        "fp8_params": False,
    },
    "search": None,
    "published": {"tp": 1, "pp": 16, "ep": 64, "cp": 1, "recompute": "selective", "zero_stage": 1},
    "published_tokens_per_s_per_gpu": 1e12 / (180_000 * 3600),
}


# Megatron-Bridge's H100 mixture-of-experts rows (performance summary archive, NeMo 26.02
# container, "DGX-H100": model, GPUs, precision, GBS, MBS, sequence 4096, TP, PP, VP, EP,
# tokens/s per GPU; "we force-balance the token distribution among experts and all
# benchmarks are token-dropless"), with the recipes that produced them
# (scripts/performance/configs/{qwen,gpt_oss}/*_workload_base_configs.py): experts never
# split over tensor ranks (``expert_tensor_parallel_size=1``), so Qwen3-235B's 32 expert
# ranks are folded over tp 2 x dp 16; its expert all-to-all overlapped with computation
# (``moe_a2a_overlap``); GPT-OSS recomputing its norms and expert activations
# (``recompute_modules=["layernorm", "moe_act"]``, the planner's selective mode under flash
# attention). Shapes from the models' Hugging Face configs (Qwen3: 128 experts, 8 per token,
# 4 KV heads of 128; GPT-OSS 120B: 128 experts, 4 per token, 128-token windows on every
# other layer).
_QWEN3_30B_A3B = {
    "num_layers": 48,
    "hidden_size": 2048,
    "num_attention_heads": 32,
    "num_kv_heads": 4,
    "head_dim": 128,
    "ffn_hidden_size": 6144,
    "gated_mlp": True,
    "seq_length": 4096,
    "vocab_size": 151936,
    "moe": {"num_experts": 128, "experts_per_token": 8, "expert_ffn_hidden_size": 768},
}
_QWEN3_235B_A22B = {
    **_QWEN3_30B_A3B,
    "num_layers": 94,
    "hidden_size": 4096,
    "num_attention_heads": 64,
    "ffn_hidden_size": 12288,
    "moe": {"num_experts": 128, "experts_per_token": 8, "expert_ffn_hidden_size": 1536},
}
_GPT_OSS_120B = {
    "num_layers": 36,
    "hidden_size": 2880,
    "num_attention_heads": 64,
    "num_kv_heads": 8,
    "head_dim": 64,
    "ffn_hidden_size": 2880,
    "gated_mlp": True,
    "seq_length": 4096,
    "vocab_size": 201088,
    "sliding_window": 128,
    "sliding_window_layers": list(range(0, 36, 2)),
    "moe": {"num_experts": 128, "experts_per_token": 4, "expert_ffn_hidden_size": 2880},
}
# the alltoall token dispatcher of these recipes (moe_token_dispatcher_type "alltoall")
_BRIDGE_MOE_SOFTWARE = {
    "grad_bytes_per_param": 2,
    "overlap_tp_comm": True,
    "expert_load_imbalance": 1.0,
    "expert_dispatch": "all-to-all",
}
_BRIDGE_FP8 = {"precision": "fp8", "fp8_scaling": "current"}

MEGATRON_BRIDGE_H100_MOE = [
    {
        "source": "Megatron-Bridge performance summary, NeMo 26.02, DGX-H100",
        "name": "GPT-OSS-120B BF16 batch 1280",
        "model": _GPT_OSS_120B,
        "cluster": {"preset": "dgx-h100", "nodes": 8},
        "training": {"global_batch_sequences": 1280, "precision": "bf16", **_BRIDGE_MOE_SOFTWARE},
        "search": None,
        "published": {
            "tp": 1,
            "pp": 4,
            "cp": 1,
            "ep": 8,
            "virtual_stages": 1,
            "micro_batch_size": 1,
            "recompute": "selective",
            "zero_stage": 1,
        },
        "published_tokens_per_s_per_gpu": 5993.0,
    },
    {
        "source": "Megatron-Bridge performance summary, NeMo 26.02, DGX-H100",
        "name": "Qwen3-30B-A3B FP8 batch 1024",
        "model": _QWEN3_30B_A3B,
        "cluster": {"preset": "dgx-h100", "nodes": 2},
        "training": {"global_batch_sequences": 1024, **_BRIDGE_FP8, **_BRIDGE_MOE_SOFTWARE},
        "search": None,
        "published": {"tp": 1, "pp": 2, "cp": 1, "ep": 8, "virtual_stages": 12, "micro_batch_size": 1, "zero_stage": 1},
        "published_tokens_per_s_per_gpu": 5113.0,
    },
    {
        "source": "Megatron-Bridge performance summary, NeMo 26.02, DGX-H100",
        "name": "Qwen3-235B-A22B FP8 batch 8192",
        "model": _QWEN3_235B_A22B,
        "cluster": {"preset": "dgx-h100", "nodes": 32},
        "training": {"global_batch_sequences": 8192, "overlap_ep_comm": True, **_BRIDGE_FP8, **_BRIDGE_MOE_SOFTWARE},
        "search": None,
        "published": {
            "tp": 2,
            "pp": 8,
            "cp": 1,
            "ep": 32,
            "etp": 1,
            "virtual_stages": 4,
            "micro_batch_size": 1,
            "zero_stage": 1,
        },
        "published_tokens_per_s_per_gpu": 1633.0,
    },
]


# The same summary's DGX-H100 MoE rows from other containers (performance-summary-archive.md),
# NOT used in the fit of the host time per expert operation: the 25.11 recipes ran other batch
# and micro-batch sizes (GPT-OSS 4-sequence micro-batches at batch 512, Qwen3-30B-A3B 2-sequence
# ones at vp 24), 25.09 ran DeepSeek-V3 dropless on 1,024 GPUs (DeepSeek's 128 x 128 / 1 x 128
# FP8 blocks; the flex dispatcher, which its H100 recipe runs on HybridEP, node-deduplicated:
# perf_recipes/deepseek/h100/deepseek_v3.py), and 26.02.01 ran Qwen3-30B-A3B in the 26.02 layout 77% faster (9,058 against 5,113
# tokens/s per GPU): a software change, which is why the fitted constant belongs to the 26.02
# stack. Recomputation is left to the planner (the tables do not state it).
_BRIDGE_OTHER_ROWS: list[tuple[str, str, dict[str, Any], int, int, dict[str, Any], dict[str, Any], float]] = [
    (
        "25.11",
        "GPT-OSS-120B BF16 batch 512",
        _GPT_OSS_120B,
        8,
        512,
        {"precision": "bf16"},
        {"tp": 1, "pp": 4, "ep": 8, "virtual_stages": 1, "micro_batch_size": 4},
        5630.0,
    ),
    (
        "25.11",
        "Qwen3-30B-A3B FP8 batch 512",
        _QWEN3_30B_A3B,
        2,
        512,
        _BRIDGE_FP8,
        {"tp": 1, "pp": 2, "ep": 8, "virtual_stages": 24, "micro_batch_size": 2},
        5275.0,
    ),
    (
        "25.11",
        "Qwen3-235B-A22B FP8 batch 2048",
        _QWEN3_235B_A22B,
        32,
        2048,
        {**_BRIDGE_FP8, "overlap_ep_comm": True},
        {"tp": 2, "pp": 8, "ep": 32, "etp": 1, "virtual_stages": 4, "micro_batch_size": 1},
        1575.0,
    ),
    (
        "25.09",
        "DeepSeek-V3 FP8 batch 8192",
        DEEPSEEK_V3,
        128,
        8192,
        {**_BRIDGE_FP8, "expert_dispatch": "node-deduplicated"},
        {"tp": 2, "pp": 8, "ep": 64, "etp": 1, "virtual_stages": 4, "micro_batch_size": 1},
        1297.0,
    ),
    (
        "26.02.01",
        "Qwen3-30B-A3B FP8 batch 1024",
        _QWEN3_30B_A3B,
        2,
        1024,
        _BRIDGE_FP8,
        {"tp": 1, "pp": 2, "ep": 8, "virtual_stages": 12, "micro_batch_size": 1},
        9058.0,
    ),
]
MEGATRON_BRIDGE_H100_MOE_OTHER_CONTAINERS: list[dict[str, Any]] = [
    {
        "source": f"Megatron-Bridge performance summary archive, NeMo {container}, DGX-H100",
        "name": f"{name} ({container})",
        "model": model,
        "cluster": {"preset": "dgx-h100", "nodes": nodes},
        "training": {"global_batch_sequences": batch, **_BRIDGE_MOE_SOFTWARE, **precision},
        "search": None,
        "published": {"cp": 1, "zero_stage": 1, **layout},
        "published_tokens_per_s_per_gpu": tokens,
    }
    for container, name, model, nodes, batch, precision, layout, tokens in _BRIDGE_OTHER_ROWS
]


# Five layouts of one MoE model measured side by side on one H100 cluster with one code base:
# NVIDIA's Megatron-MoE-ModelZoo (github.com/yanring/Megatron-MoE-ModelZoo,
# best_practice/qwen3/readme.md, "Performance Results", H100: 256 GPUs, InfiniBand 8x50 GB/s per
# node), Qwen3-235B-A22B, sequence 4096, batch 2048, BF16, with the step time of each. Its
# scripts (sbatch_benchmarking.sh, model_configs/benchmarking/Qwen3-235B-A22B.yaml): distributed
# optimizer with overlapped gradient reduction and parameter gather, sequence parallelism,
# --tp-comm-overlap for BF16, no dropout, untied embeddings, whole experts
# (--expert-tensor-parallel-size 1), dropless routing with an auxiliary loss (the table does
# not say force-balanced, so the default imbalance). "DeepEP": the flex dispatcher on
# DeepEP's kernels, which cross the network once per node; "A2A": Megatron-Core's alltoall
# dispatcher; "+1f1b overlap": --overlap-moe-expert-parallel-comm; "FSDP On": Megatron-FSDP,
# weights, gradients and optimizer state sharded (ZeRO-3); recompute "norm, act" is
# --recompute-modules layernorm moe_act, the planner's selective recomputation.
# "A2A" rows: Megatron-Core's alltoall dispatcher; "DeepEP" rows state the flex dispatcher
_MODELZOO_SOFTWARE = {"precision": "bf16", "overlap_tp_comm": True, "dropout": False, "expert_dispatch": "all-to-all"}
_DEEPEP = {"expert_dispatch": "node-deduplicated"}


def _modelzoo_row(label: str, layout: dict[str, Any], published_step_s: float, **training: Any) -> dict[str, Any]:
    return {
        "source": "Megatron-MoE-ModelZoo best_practice/qwen3/readme.md, H100 table",
        "name": label,
        "model": _QWEN3_235B_A22B,
        "cluster": {"preset": "dgx-h100", "nodes": 32},
        "training": {"global_batch_sequences": 2048, **_MODELZOO_SOFTWARE, **training},
        "published": {"etp": 1, "micro_batch_size": 1, "zero_stage": 1, **layout},
        "published_step_s": published_step_s,
    }


MODELZOO_QWEN3_H100 = [
    _modelzoo_row(
        "DeepEP, cross-node ep",
        {"tp": 2, "pp": 8, "ep": 32, "virtual_stages": 4, "recompute": "selective"},
        19.7,
        **_DEEPEP,
    ),
    _modelzoo_row(
        "DeepEP, cross-node ep, a2a overlap",
        {"tp": 2, "pp": 8, "ep": 32, "virtual_stages": 4, "recompute": "selective"},
        17.6,
        overlap_ep_comm=True,
        **_DEEPEP,
    ),
    _modelzoo_row(
        "DeepEP, node ep, FSDP",
        {"tp": 2, "pp": 1, "ep": 8, "micro_batch_size": 4, "zero_stage": 3, "recompute": "full"},
        17.6,
        **_DEEPEP,
    ),
    _modelzoo_row(
        "A2A, node ep, pp 32", {"tp": 2, "pp": 32, "ep": 8, "virtual_stages": 3, "recompute": "selective"}, 24.2
    ),
    _modelzoo_row(
        "DeepEP, node ep, tp 4", {"tp": 4, "pp": 8, "ep": 8, "virtual_stages": 4, "recompute": "none"}, 29.0, **_DEEPEP
    ),
]


# Llama 3 405B pre-training as its report states it (Llama Team, "The Llama 3 Herd of
# Models", 2024, Table 4: GPUs, TP, CP, PP, DP, sequence length, batch size per DP group,
# tokens per batch, TFLOPs per GPU, BF16 MFU; H100 80 GB at 700 W, eight to a server). 16M
# tokens a batch: 2,048 sequences of 8,192 tokens, 128 of 131,072. The report does not say
# how it counts attention FLOPs; its FSDP, uneven end stages and interleaved schedule are
# what the planner's megatron-core search space holds. (GPUs, dp, cp, sequence, batch,
# TFLOP/s per GPU)
_LLAMA3_TABLE4_ROWS = [
    (8192, 64, 1, 8192, 2048, 430),
    (16384, 128, 1, 8192, 2048, 400),
    (16384, 8, 16, 131072, 128, 380),
]
LLAMA3_405B_TABLE4: list[dict[str, Any]] = [
    {
        "source": "Llama Team 2024, Table 4",
        "name": f"Llama3-405B seq {seq} on {gpus}",
        "model": {**_LLAMA31_405B, "seq_length": seq},
        "cluster": {"preset": "dgx-h100", "nodes": gpus // 8},
        "training": {"global_batch_sequences": batch},
        "search": None,
        "published": {"tp": 8, "pp": 16, "cp": cp, "dp": dp},
        "published_tflops_per_gpu": tflops,
    }
    for gpus, dp, cp, seq, batch, tflops in _LLAMA3_TABLE4_ROWS
]


# BigScience's search for BLOOM's layout (bigscience-workshop/bigscience,
# train/tr11-176B-ml/chronicles-prequel.md, 2022-02-25 tables "Tweaking TP" and "some more configs
# with lower PP"; the cluster in train/tr11-176B-ml/README.md): a 181B GPT (72 layers, hidden 14336,
# 64 heads, sequence 2048, the 250k vocabulary, GeLU, dropout 0.1) on 48 Jean Zay nodes of 8 A100
# 80 GB, 4 Omni-Path links of 100 Gb/s per node; Megatron-DeepSpeed with its fp16 optimizer
# ("grad accumulates in fp16", before the BF16 optimizer) and DeepSpeed's activation
# checkpointing of every layer. Fifteen layouts measured side by side (hardware TFLOP/s per
# GPU, the 4*2 coefficient with recomputation), and three that ran out of memory. A controlled
# comparison, outside the targets: the cluster is not a DGX.
_BIGSCIENCE_181B = {
    "num_layers": 72,
    "hidden_size": 14336,
    "num_attention_heads": 64,
    "seq_length": 2048,
    "vocab_size": 250880,
    "ffn_hidden_size": 4 * 14336,
    "gated_mlp": False,
}
# 4 x 100 Gb/s Omni-Path per node over its 8 GPUs, as built
JEAN_ZAY_INTER_NODE_BYTES_PER_S = 4 * 12.5e9 / 8
# FITTED on the fifteen rows below: the inter-node bandwidth per GPU NCCL reached on that
# fabric, the value that minimises the median |error| of the predicted TFLOP/s
# (`python -m bench.parallel3d` prints the scan); 20% of the links' rate.
JEAN_ZAY_FITTED_INTER_NODE_BYTES_PER_S = 1.25e9
# (dp, tp, pp, micro-batch, global batch, measured TFLOP/s per GPU)
_BIGSCIENCE_SEARCH_ROWS = [
    (8, 4, 12, 2, 2048, 145.92),
    (16, 4, 6, 2, 2048, 144.31),
    (8, 4, 12, 4, 2048, 144.08),
    (16, 2, 12, 2, 2048, 143.30),
    (8, 8, 6, 4, 2048, 141.27),
    (6, 8, 8, 4, 2016, 140.24),
    (12, 8, 4, 4, 2016, 138.22),
    (4, 8, 12, 4, 2048, 137.70),
    (16, 4, 6, 4, 2048, 137.66),
    (8, 2, 24, 1, 2048, 134.88),
    (8, 2, 24, 2, 2048, 131.33),
    (12, 8, 4, 2, 2016, 126.43),
    (4, 4, 24, 1, 2048, 123.44),
    (24, 8, 2, 2, 2016, 116.58),
    (24, 8, 2, 1, 2016, 109.11),
]
BIGSCIENCE_LAYOUT_SEARCH: dict[str, Any] = {
    "source": "bigscience-workshop/bigscience, train/tr11-176B-ml/chronicles-prequel.md (2022-02-25)",
    "model": _BIGSCIENCE_181B,
    "cluster": {"preset": "dgx-a100", "nodes": 48},
    "training": {
        "software": "megatron-deepspeed",
        "precision": "fp16",
        "grad_bytes_per_param": 2,
        "dropout": True,
    },
    "rows": [
        {
            "published": {"dp": dp, "tp": tp, "pp": pp, "micro_batch_size": mbs, "recompute": "full", "zero_stage": 1},
            "global_batch_sequences": batch,
            "published_tflops_per_gpu": tflops,
        }
        for dp, tp, pp, mbs, batch, tflops in _BIGSCIENCE_SEARCH_ROWS
    ],
    # layouts the same tables report out of memory (dp, tp, pp, micro-batch)
    "out_of_memory": [
        {"dp": 32, "tp": 2, "pp": 6, "micro_batch_size": 2, "recompute": "full", "zero_stage": 1},
        {"dp": 32, "tp": 2, "pp": 6, "micro_batch_size": 1, "recompute": "full", "zero_stage": 1},
        {"dp": 48, "tp": 8, "pp": 1, "micro_batch_size": 1, "recompute": "full", "zero_stage": 1},
    ],
}
