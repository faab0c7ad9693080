"""Presets of the 3D-parallel planner: GPUs, the nodes they ship in, and software generations.

A request names a node preset (``dgx-h100``), a GPU (``h100-sxm``) or a software
generation (``megatron-lm-2021``); :mod:`partitioners.parallel3d.specs` turns those into
the cluster and training specs the cost model reads.

Two kinds of number meet in a :class:`GPUSpec`. Hardware facts (peaks, memory, links, SM
count) are read from :mod:`partitioners.hardware.catalogue`, the one catalogue the placement
inventory reads too, where each is written once with its source. The kernel ceilings
(``gemm_efficiency_max``, ``fp8_gemm_efficiency_max``, ``nvls_allreduce_speedup``,
:data:`HOPPER_IN_TRAINING`) are this planner's model of how much of that hardware software
reaches, measured or fitted on kernels, collectives and published runs; they live here, each
with its measurement.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from partitioners.errors import InvalidInput
from partitioners.hardware.catalogue import NODES as CATALOGUE_NODES

__all__ = [
    "GPUSpec",
    "GPU_SPECS",
    "GPU_ARCHITECTURES",
    "HOPPER_IN_TRAINING",
    "FLASH_ATTENTION_SPEED",
    "NODE_PRESETS",
    "SOFTWARE_PRESETS",
    "SOFTWARE_SEARCH",
    "RANK_ORDERS",
    "SoftwareSearch",
    "gpu_spec_by_name",
]


@dataclass(frozen=True)
class GPUSpec:
    """One accelerator type and the node it usually ships in, as the planner sees them.

    Peaks, memory, links, SM count and architecture are the catalogue's
    (:mod:`partitioners.hardware.catalogue`); ``gemm_efficiency_max``,
    ``fp8_gemm_efficiency_max`` and ``nvls_allreduce_speedup`` are the planner's kernel
    ceilings. Bandwidths are per GPU and per direction, as a rank can drive them: NVLink
    figures are the datasheet's bidirectional total halved; the inter-node figure is the
    GPU's own NIC (DGX/HGX systems have one NIC per GPU, rail-optimised).
    """

    name: str
    peak_flops_per_s: Mapping[str, float]
    memory_bytes: float
    hbm_bandwidth_bytes_per_s: float
    intra_node_bandwidth_bytes_per_s: float
    inter_node_bandwidth_bytes_per_s: float
    gpus_per_node: int
    sm_count: int
    # Asymptotic fraction of dense peak cuBLAS sustains through a training run as every
    # GEMM dimension grows (the cost model scales it down by d / (d + 200) per
    # dimension). Two measured factors: (1) an 8192^3 GEMM lands on the "maximum
    # achievable matmul FLOPS" (MAMF) measured by S. Bekman (ml-engineering,
    # compute/accelerator: A100 SXM 267.9 TFLOP/s, H100 SXM 792.1), a short burst at
    # boost clock; (2) times the clock the chip holds once pinned at its power limit,
    # which a training run is for its whole length (see _SUSTAINED_OVER_BURST_*).
    gemm_efficiency_max: float
    # All-reduce among all the GPUs of a node with NVLink SHARP (NVLS: the NVSwitch
    # reduces in the switch; NCCL >= 2.17 picks it by default where the switch has it),
    # as a speed-up over the ring on the same links. H100: NCCL's maintainer gives a
    # peak all-reduce busBw of ~480 GB/s on 8 GPUs against ~370 GB/s for the ring and
    # every other collective (S. Jeaugey, NVIDIA/nccl-tests#212, 2024; "a 30%
    # improvement using NVLink SHARP", NVIDIA/nccl#1442): 480 / 370. Only all-reduce
    # gains, and only across a full 8-GPU NVSwitch domain (with 2-4 GPUs NVLS measures
    # as the ring, NVIDIA/nccl#1455). 1.0 where there is no NVLS (A100's NVSwitch gen 2)
    # or no measurement at hand.
    nvls_allreduce_speedup: float = 1.0
    # The same ceiling for FP8 GEMMs, where measured; None means as for 16-bit. FP8 runs
    # further below its datasheet peak: Bekman's FP8 (float8_e4m3fn) MAMF on H100 SXM is
    # 1,402.6 of 1,979 TFLOP/s (70.9%) against 794.5 of 989 (80.3%) for BF16 (ml-engineering,
    # "Maximum Achievable Matmul FLOPS comparison table").
    fp8_gemm_efficiency_max: float | None = None
    # GPU generation, for what a software generation's kernels reach on it
    # (FLASH_ATTENTION_SPEED): "ampere", "hopper" or "blackwell".
    architecture: str = "ampere"
    # Power at load (the datasheet's TDP) and held idle (CUDA context up, an estimate), from
    # the catalogue ([POWER]); None where it gives none. They price a step in joules
    # (partitioners.parallel3d.energy).
    board_power_w: float | None = None
    idle_power_w: float | None = None


# ------------------------------------------------------------------- kernel ceilings
# The hardware figures come from partitioners.hardware.catalogue; what follows is the
# planner's own model of how much of them software reaches, fitted or measured on kernels
# and collectives, not read off a spec sheet.

# Sustained over burst tensor throughput, i.e. what a GEMM keeps once the board sits at
# its power limit (training runs there for hours) over what a short benchmark burst at
# boost clock reaches.
# A100: NVIDIA computes its HPL peak at the clock an A100 sustains at its 400 W limit,
# 1,305 MHz, against its 1,410 MHz boost (G. Lockwood, "Peak FLOPS", glennklockwood.com).
_SUSTAINED_OVER_BURST_A100 = 1305.0 / 1410.0
# Hopper (700 W): S. Bekman's maximum *sustainable* matmul FLOPS on H200 (same SMs,
# clocks and power limit as H100 SXM), 755 TFLOP/s, against its burst MAMF of 834
# (ml-engineering, "Maximum Achievable and Sustainable Matmul FLOPS").
_SUSTAINED_OVER_BURST_HOPPER = 755.0 / 834.0
# B200 (1,000 W): same source, MSMF 1,429 against MAMF 1,745 TFLOP/s.
_SUSTAINED_OVER_BURST_B200 = 1429.0 / 1745.0
# What of that ceiling a Hopper GPU keeps inside a training run, relative to what an A100
# keeps of its own (for the A100, MAMF times the sustained clock already reproduces the
# SC21 and Korthikanti et al. runs within 7%). The same software training the same models
# on both (MosaicML LLM Foundry's published MPT benchmarks, 1B-30B, sequence 2048-4096, 8
# GPUs of each: scripts/train/benchmarking/README.md) ran 2.1-2.3x faster on H100 where the
# microbenchmark ceilings predict 2.6-2.8x; 0.81 of the Hopper ceiling matches the median of
# the seven pairs (fitted and printed by ``python -m bench.hopper_in_training``). Its cause is
# not isolated (clock under the power cap of a whole busy node, kernels' distance from their
# best shapes); it holds up on runs not used to fit it (NVIDIA's Megatron-Bridge H100
# benchmarks, see bench.parallel3d).
HOPPER_IN_TRAINING = 0.81
# Hopper's FP8 GEMM ceiling at burst clock, by the same convention as the BF16 one (MAMF
# over the 0.930 saturation of its best shape): H100 SXM FP8 MAMF 1,402.6 / 1,979 = 0.709
# (S. Bekman, ml-engineering). H200 and H800 have the same SMs and clocks.
_FP8_BURST_HOPPER = (1402.6 / 1979.0) / 0.930
# GEMM ceilings at burst clock: MAMF at 8192^3 (S. Bekman, ml-engineering) over the catalogue
# peak, over (8192 / 8392)^3 = 0.930, the saturation of that shape. A100 SXM: 267.9 / 312 =
# 0.859 -> 0.92; H100 SXM: 792.1 / 989 = 0.801 -> 0.86 (these two ratios were taken against the
# datasheet's rounded 989 TFLOP/s and are kept as fitted; against the whitepaper's 989.4 they
# differ by 0.04%); B200: 1,745 / 2,250 = 0.776 -> 0.834.
_GEMM_BURST_AMPERE = 0.92
_GEMM_BURST_HOPPER = 0.86
_GEMM_BURST_B200 = 0.834
# GEMM ceilings inside a training run (burst x sustained clock, and for Hopper x
# HOPPER_IN_TRAINING). No in-training factor for B200 like Hopper's: no same-software
# comparison with an A100 to fit one from.
_GEMM_AMPERE = _GEMM_BURST_AMPERE * _SUSTAINED_OVER_BURST_A100
_GEMM_HOPPER = _GEMM_BURST_HOPPER * _SUSTAINED_OVER_BURST_HOPPER * HOPPER_IN_TRAINING
_FP8_GEMM_HOPPER = _FP8_BURST_HOPPER * _SUSTAINED_OVER_BURST_HOPPER * HOPPER_IN_TRAINING
_GEMM_B200 = _GEMM_BURST_B200 * _SUSTAINED_OVER_BURST_B200
# NVLink SHARP all-reduce speed-up over the ring within a full NVSwitch gen 3 node (H100,
# H200): NCCL's maintainer measures ~480 GB/s busBw against ~370 GB/s for the ring on 8 H100
# (NVIDIA/nccl-tests#212); ~475 GB/s on 8 H200 (NVIDIA/nccl-tests#272). Not claimed for the
# H800, whose cut NVLink has no such measurement at hand.
_NVLS_NVSWITCH3 = 480.0 / 370.0


@dataclass(frozen=True)
class _KernelCeilings:
    """What the planner's model says software reaches on one GPU (see the constants above)."""

    gemm_efficiency_max: float
    fp8_gemm_efficiency_max: float | None = None
    nvls_allreduce_speedup: float = 1.0


# The dtypes a training run computes in, the ones the planner reads of a GPU's peaks.
_TRAINING_DTYPES = ("bf16", "fp16", "fp8")

# Planner GPU name -> (the catalogue node it usually ships in, its kernel ceilings). The GPU's
# figures and the node's links are read from partitioners.hardware.catalogue.
_PLANNER_GPUS: dict[str, tuple[str, _KernelCeilings]] = {
    "a100-80gb": ("dgx-a100", _KernelCeilings(_GEMM_AMPERE)),
    "a800-80gb": ("hgx-a800", _KernelCeilings(_GEMM_AMPERE)),
    "a100-40gb": ("dgx-a100-40gb", _KernelCeilings(_GEMM_AMPERE)),
    "h100-sxm": ("dgx-h100", _KernelCeilings(_GEMM_HOPPER, _FP8_GEMM_HOPPER, _NVLS_NVSWITCH3)),
    "h800-sxm": ("hgx-h800", _KernelCeilings(_GEMM_HOPPER, _FP8_GEMM_HOPPER)),
    "h200-sxm": ("dgx-h200", _KernelCeilings(_GEMM_HOPPER, _FP8_GEMM_HOPPER, _NVLS_NVSWITCH3)),
    "b200": ("dgx-b200", _KernelCeilings(_GEMM_B200)),
}


def _planner_gpu(name: str, node_name: str, ceilings: _KernelCeilings) -> GPUSpec:
    """The planner's view of a catalogue GPU in its usual node, with the planner's kernel ceilings."""
    node = CATALOGUE_NODES[node_name]
    gpu = node.accelerator
    if gpu.key != name or gpu.sm_count is None:
        raise ValueError(f"catalogue node {node_name!r} does not carry GPU {name!r} with its SM count")
    return GPUSpec(
        name=name,
        peak_flops_per_s={
            dtype: gpu.dense_peak_flops_per_s[dtype]
            for dtype in _TRAINING_DTYPES
            if dtype in gpu.dense_peak_flops_per_s
        },
        memory_bytes=gpu.memory_bytes,
        hbm_bandwidth_bytes_per_s=gpu.memory_bandwidth_bytes_per_s,
        intra_node_bandwidth_bytes_per_s=node.intra_node_link.bandwidth_bytes_per_s,
        inter_node_bandwidth_bytes_per_s=node.inter_node_link.bandwidth_bytes_per_s,
        gpus_per_node=node.devices_per_node,
        sm_count=gpu.sm_count,
        gemm_efficiency_max=ceilings.gemm_efficiency_max,
        nvls_allreduce_speedup=ceilings.nvls_allreduce_speedup,
        fp8_gemm_efficiency_max=ceilings.fp8_gemm_efficiency_max,
        architecture=gpu.architecture,
        board_power_w=gpu.board_power_w,
        idle_power_w=gpu.idle_power_w,
    )


#: Planner GPU name -> its figures (from the catalogue) and kernel ceilings (the planner's model).
GPU_SPECS: dict[str, GPUSpec] = {
    name: _planner_gpu(name, node, ceilings) for name, (node, ceilings) in _PLANNER_GPUS.items()
}

# Speed of each FlashAttention generation against the newest one a GPU generation runs,
# which the cost model's flash-attention rate stands for (FlashAttention-2 on Ampere,
# FlashAttention-3 on Hopper). On A100, FlashAttention-2 gives "around 2x speedup compared
# to FlashAttention" (T. Dao, "FlashAttention-2", 2023, abstract; 1.7-3.0x in its Sec. 4.1,
# and 1.3-2.5x over the Triton port). On H100, FlashAttention-2 reaches 35% of peak where
# FlashAttention-3 reaches 75% (J. Shah et al., "FlashAttention-3", 2024, abstract), and
# FlashAttention-1 is taken at half of FlashAttention-2 there too. FlashAttention-3 runs
# on Hopper only. No measured ratios for Blackwell: there only the newest is modelled.
FLASH_ATTENTION_SPEED: dict[str, dict[int, float]] = {
    "ampere": {1: 0.5, 2: 1.0},
    "hopper": {1: 0.5 * 0.35 / 0.75, 2: 0.35 / 0.75, 3: 1.0},
}
GPU_ARCHITECTURES = ("ampere", "hopper", "blackwell", "unknown")

# The catalogue nodes a cluster may name as a preset, each to its GPU's GPU_SPECS entry. Every
# one has the links of its GPU's usual node (tests/partitioners/hardware/test_catalogue.py holds
# this), so naming the node or the GPU gives the same cluster. Other catalogue nodes (gb200-nvl72,
# ...) reach the planner as inventory presets.
_PLANNER_NODE_NAMES = (
    "dgx-a100",
    "dgx-a100-40gb",
    "dgx-h100",
    "hgx-h100",
    "dgx-h200",
    "hgx-h800",
    "hgx-a800",
    "dgx-b200",
)
NODE_PRESETS: dict[str, str] = {name: CATALOGUE_NODES[name].accelerator.key for name in _PLANNER_NODE_NAMES}


def gpu_spec_by_name(name: str) -> GPUSpec:
    """The :data:`GPU_SPECS` entry a name means: its key, or the one key it begins (``"h100"``).

    A name that begins more than one key (``"a100"``: 40 or 80 GB) is refused with
    the candidates rather than guessed.
    """
    key = name.strip().lower()
    if key in GPU_SPECS:
        return GPU_SPECS[key]
    matches = sorted(spec_name for spec_name in GPU_SPECS if spec_name.startswith(key)) if key else []
    if len(matches) == 1:
        return GPU_SPECS[matches[0]]
    if matches:
        raise InvalidInput(f"gpu {name!r} is ambiguous: one of {matches}", field="cluster.gpu", code="ambiguous-gpu")
    raise InvalidInput(f"unknown gpu {name!r}; known: {sorted(GPU_SPECS)}", field="cluster.gpu", code="unknown-gpu")


# Software generations, as the TrainingSpec fields each set: what the framework of the time
# did by itself. ``training.software`` picks one; fields given next to it override it.
SOFTWARE_PRESETS: dict[str, dict[str, Any]] = {
    # Megatron-LM as its authors ran it for SC21 (Narayanan et al. 2021, examples/sc21): no
    # flash attention (Dao et al., 2022) and no sequence parallelism (Korthikanti et al.,
    # 2022); tensor-parallel collectives in line, gradients reduced after the backward pass,
    # weight gradients accumulated by a separate kernel; the fp16 optimizer's fp32 gradient
    # copy and every in-flight stage output kept (see the TrainingSpec fields); GPT's 0.1
    # dropout. Megatron-DeepSpeed (BLOOM, MT-NLG) branched from this code.
    "megatron-lm-2021": {
        "flash_attention": False,
        "sequence_parallel": False,
        "overlap_grad_reduce": False,
        "overlap_tp_backward": False,
        "gradient_accumulation_fusion": False,
        "overlap_p2p_comm": False,
        "fp32_grad_copy_kept": True,
        "stage_outputs_kept": True,
        "dropout": True,
        "partial_recompute": False,
        "selective_recompute": False,
    },
    # Megatron-LM as released with sequence parallelism and selective recomputation
    # (Korthikanti et al. 2022): asynchronous backward tensor-parallel collectives and
    # gradient-accumulation fusion, still no flash attention, gradients reduced after the
    # backward pass, dropout on.
    "megatron-lm-2022": {
        "flash_attention": False,
        "sequence_parallel": True,
        "overlap_grad_reduce": False,
        "overlap_p2p_comm": False,
        "dropout": True,
    },
    # Megatron-DeepSpeed (BigScience's BLOOM, MT-NLG): the 2021 Megatron-LM code, whose
    # flags it keeps, on DeepSpeed's pipeline engine and ZeRO-1 optimizer.
    "megatron-deepspeed": {
        "flash_attention": False,
        "sequence_parallel": False,
        "overlap_grad_reduce": False,
        "overlap_tp_backward": False,
        "gradient_accumulation_fusion": False,
        "overlap_p2p_comm": False,
        "dropout": True,
        "partial_recompute": False,
        "selective_recompute": False,
    },
    # Megatron-Core with Transformer Engine: the TrainingSpec defaults.
    "megatron-core": {},
    # DeepSeek's HAI-LLM (DeepSeek-AI, DeepSeek-V3 Technical Report, 2024, Sec. 3.2-3.3): the
    # DualPipe schedule, whose paired forward and backward chunks hide the expert all-to-all;
    # dispatch once per destination node (node-limited routing, its DeepEP kernels); FP8
    # GEMMs cast from the higher-precision weights the optimizer updates.
    "hai-llm": {
        "pipeline_schedule": "dualpipe",
        "expert_dispatch": "node-deduplicated",
        "overlap_ep_comm": True,
        "fp8_params": False,
    },
    # torchtitan (PyTorch-native: FSDP2, DTensor tensor parallelism with sequence-parallel
    # norms, torch.distributed.pipelining): no Megatron-style asynchronous backward
    # tensor-parallel collectives (async TP needs torch.compile: enable_async_tensor_parallel),
    # gradients reduced in fp32 under the backward by FSDP/DDP, no gradient-accumulation
    # fusion into the GEMM, no partial block recomputation by count.
    "torchtitan": {
        # its expert parallelism exchanges tokens with all_to_all_single, one message per (token, expert)
        "expert_dispatch": "all-to-all",
        "overlap_tp_backward": False,
        "gradient_accumulation_fusion": False,
        "partial_recompute": False,
        "selective_recompute": False,
    },
}


# Rank orders a layout may take, innermost dimension first (Megatron-Core's RankGenerator
# spelling). "tp-cp-ep-dp-pp" is Megatron-Core's default ``--order`` and what Megatron-LM
# always did (its 2021 initialize_model_parallel built tensor groups of consecutive
# ranks, data-parallel groups next and pipeline groups outermost); torchtitan's device mesh
# ["pp", "dp_replicate", "dp_shard", "cp", "tp"] (outermost first) is the same order. With
# a small tensor group it puts data-parallel peers on one node and pipeline stages a node
# apart. "tp-cp-ep-pp-dp" is Megatron-Core's ``--use-tp-pp-dp-mapping``: pipeline stages
# side by side, data-parallel replicas outermost.
RANK_ORDERS: tuple[str, ...] = ("tp-cp-ep-dp-pp", "tp-cp-ep-pp-dp")


@dataclass(frozen=True)
class SoftwareSearch:
    """What a software generation can run, which bounds the planner's search.

    A request's constraints narrow this further; a constraint outside it is refused
    (the code could not run that layout).
    """

    zero_stages: tuple[int, ...]
    recompute: tuple[str, ...]
    uneven_pipeline: bool
    context_parallel: bool
    expert_parallel: bool
    rank_orders: tuple[str, ...]
    # Model chunks of a stage may hold different layer counts (an interleaving depth that
    # does not divide a stage's layers): Megatron-Core's --pipeline-model-parallel-layout.
    uneven_chunks: bool
    source: str
    # an interleaved (virtual-stage) pipeline schedule; DeepSpeed's pipeline engine has none
    interleaving: bool = True
    # pipeline schedules it runs (partitioners.parallel3d.schedules), its default first
    pipeline_schedules: tuple[str, ...] = ("1f1b",)


SOFTWARE_SEARCH: dict[str, SoftwareSearch] = {
    "megatron-lm-2021": SoftwareSearch(
        zero_stages=(0,),
        recompute=("none", "full"),
        uneven_pipeline=False,
        context_parallel=False,
        expert_parallel=False,
        rank_orders=("tp-cp-ep-dp-pp",),
        uneven_chunks=False,
        source="Megatron-LM as of SC21 (examples/sc21): no distributed optimizer (no ZeRO), "
        "--checkpoint-activations only (full recomputation of every layer), "
        "'num_layers must be divisible by pipeline_model_parallel_size' (megatron/model/transformer.py), "
        "interleaving by --num-layers-per-virtual-pipeline-stage (whole chunks), no context or expert "
        "parallelism, ranks tensor-data-pipeline (mpu.initialize_model_parallel)",
    ),
    "megatron-lm-2022": SoftwareSearch(
        zero_stages=(0, 1),
        recompute=("none", "selective", "full"),
        uneven_pipeline=False,
        context_parallel=False,
        expert_parallel=False,
        rank_orders=("tp-cp-ep-dp-pp",),
        uneven_chunks=False,
        source="Megatron-LM as released with Korthikanti et al. 2022: adds --recompute-granularity "
        "selective and sequence parallelism, and the distributed optimizer (--use-distributed-optimizer, "
        "ZeRO-1: docs/distrib_optimizer.md); still even pipeline stages, whole interleaved chunks, "
        "no ZeRO-2/3, no context or expert parallelism",
    ),
    "torchtitan": SoftwareSearch(
        zero_stages=(0, 2, 3),
        recompute=("none", "op-sac", "full"),
        uneven_pipeline=True,
        context_parallel=True,
        expert_parallel=True,
        rank_orders=("tp-cp-ep-dp-pp",),
        uneven_chunks=False,
        source="pytorch/torchtitan (torchtitan/config/job_config.py): DDP or FSDP2 (data_parallel_shard_degree; "
        "fsdp_reshard_after_forward never is ZeRO-2), no ZeRO-1; activation_checkpoint mode none, full or "
        "selective (op-level SAC); pipeline split points; pipeline_parallel_schedule 1F1B, Interleaved1F1B or "
        "DualPipeV; one device mesh [pp, dp, cp, tp]",
        pipeline_schedules=("1f1b", "dualpipev"),
    ),
    "megatron-deepspeed": SoftwareSearch(
        zero_stages=(0, 1),
        recompute=("none", "full"),
        uneven_pipeline=True,
        context_parallel=False,
        expert_parallel=False,
        rank_orders=("tp-cp-ep-dp-pp",),
        uneven_chunks=False,
        interleaving=False,
        source="Megatron-DeepSpeed (BLOOM, MT-NLG, GPT-NeoX's lineage): Megatron-LM of 2021 on DeepSpeed's "
        "pipeline engine, whose PipelineModule balances layers over stages (partition_method), runs plain "
        "1F1B without virtual stages, and combines with ZeRO-1 only; topology pipe-data-model, model innermost",
    ),
    "hai-llm": SoftwareSearch(
        zero_stages=(1,),
        recompute=("none", "selective", "full"),
        uneven_pipeline=False,
        context_parallel=False,
        expert_parallel=True,
        rank_orders=("tp-cp-ep-dp-pp",),
        uneven_chunks=False,
        interleaving=False,
        source="DeepSeek's HAI-LLM as the DeepSeek-V2 and V3 reports describe it: ZeRO-1 data parallelism, "
        "expert parallelism, DualPipe (V3) or zero-bubble (V2) pipelines without virtual stages",
        pipeline_schedules=("dualpipe", "zero-bubble", "1f1b"),
    ),
    "megatron-core": SoftwareSearch(
        zero_stages=(0, 1, 2, 3),
        recompute=("none", "selective", "full"),
        uneven_pipeline=True,
        context_parallel=True,
        expert_parallel=True,
        rank_orders=RANK_ORDERS,
        uneven_chunks=True,
        source="Megatron-Core with Transformer Engine (and, for ZeRO-2/3, an FSDP stack such as "
        "Megatron-FSDP or torchtitan): --decoder-first/last-pipeline-num-layers and "
        "--pipeline-model-parallel-layout, --context-parallel-size, --expert-model-parallel-size, "
        "--order / --use-tp-pp-dp-mapping",
    ),
}
