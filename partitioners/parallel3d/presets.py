"""Presets of the 3D-parallel planner: GPUs, the nodes they ship in, and software generations.

Every number is from a public spec sheet, paper or measurement, named beside it. A
request names a node preset (``dgx-h100``), a GPU (``h100-sxm``) or a software
generation (``megatron-lm-2021``); :mod:`partitioners.parallel3d.specs` turns those into
the cluster and training specs the cost model reads.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from partitioners.errors import InvalidInput

__all__ = [
    "GPUSpec",
    "GPU_SPECS",
    "GPU_ARCHITECTURES",
    "HOPPER_IN_TRAINING",
    "FLASH_ATTENTION_SPEED",
    "NODE_PRESETS",
    "SOFTWARE_PRESETS",
    "gpu_spec_by_name",
]

_GIB = 1024**3


@dataclass(frozen=True)
class GPUSpec:
    """One accelerator type and the node it usually ships in.

    Bandwidths are per GPU and per direction, as a rank can drive them: NVLink
    figures are the datasheet's bidirectional total halved; the inter-node figure
    is the GPU's own NIC (DGX/HGX systems have one NIC per GPU, rail-optimised).
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

# Memory is what the CUDA driver hands a process (``cudaDeviceProp.totalGlobalMem``, the
# "total capacity" PyTorch's out-of-memory message prints), a little under the HBM on the
# datasheet: A100-SXM4-80GB 79.35 GiB, A100-40GB 39.59 GiB, H100 80GB HBM3 79.11 GiB
# (vllm-project/vllm#27508), H200 139.80 GiB, B200 178.35 GiB, as those messages report.
GPU_SPECS: dict[str, GPUSpec] = {
    # NVIDIA A100 Tensor Core GPU datasheet (2021): BF16 dense 312 TFLOP/s, 80 GB HBM2e at
    # 2,039 GB/s (SXM), NVLink 600 GB/s (bidirectional), 108 SMs (A100 whitepaper).
    # DGX A100 user guide: 8x ConnectX-6 200 Gb/s HDR InfiniBand, one per GPU -> 25 GB/s.
    # GEMM ceiling: burst 0.92 (267.9 / 312 = 0.859 at 8192^3, over (8192 / 8392)^3 = 0.930),
    # times the sustained clock.
    "a100-80gb": GPUSpec("a100-80gb", {"bf16": 312e12, "fp16": 312e12}, 79.35 * _GIB, 2.039e12,
                         300e9, 25e9, 8, 108, 0.92 * _SUSTAINED_OVER_BURST_A100),
    # A800 SXM4 80GB (export variant): A100 figures with NVLink cut to 400 GB/s bidirectional.
    "a800-80gb": GPUSpec("a800-80gb", {"bf16": 312e12, "fp16": 312e12}, 79.35 * _GIB, 2.039e12,
                         200e9, 25e9, 8, 108, 0.92 * _SUSTAINED_OVER_BURST_A100),
    # Same datasheet, 40 GB HBM2 at 1,555 GB/s.
    "a100-40gb": GPUSpec("a100-40gb", {"bf16": 312e12, "fp16": 312e12}, 39.59 * _GIB, 1.555e12,
                         300e9, 25e9, 8, 108, 0.92 * _SUSTAINED_OVER_BURST_A100),
    # NVIDIA H100 Tensor Core GPU datasheet (SXM5): BF16 dense 989 TFLOP/s, FP8 dense
    # 1,979 TFLOP/s (the sheet's 1,979/3,958 figures are with sparsity), 80 GB HBM3 at
    # 3.35 TB/s, NVLink 900 GB/s bidirectional, 132 SMs. DGX H100: 8x ConnectX-7 400 Gb/s.
    # GEMM ceiling: burst 0.86 (792.1 / 989 = 0.801 at 8192^3, over 0.930), times the
    # sustained clock; FP8 burst 0.762 (1,402.6 / 1,979 = 0.709, over 0.930), times the same;
    # both times HOPPER_IN_TRAINING.
    "h100-sxm": GPUSpec("h100-sxm", {"bf16": 989e12, "fp16": 989e12, "fp8": 1979e12}, 79.11 * _GIB,
                        3.35e12, 450e9, 50e9, 8, 132, 0.86 * _SUSTAINED_OVER_BURST_HOPPER * HOPPER_IN_TRAINING,
                        480.0 / 370.0, _FP8_BURST_HOPPER * _SUSTAINED_OVER_BURST_HOPPER * HOPPER_IN_TRAINING,
                        architecture="hopper"),
    # H800 SXM5 (export variant): H100 SXM compute and memory, NVLink cut to 400 GB/s
    # bidirectional (NVIDIA H800 product brief; DeepSeek-V3 report, Sec. 3.1).
    "h800-sxm": GPUSpec("h800-sxm", {"bf16": 989e12, "fp16": 989e12, "fp8": 1979e12}, 79.11 * _GIB,
                        3.35e12, 200e9, 50e9, 8, 132, 0.86 * _SUSTAINED_OVER_BURST_HOPPER * HOPPER_IN_TRAINING,
                        fp8_gemm_efficiency_max=_FP8_BURST_HOPPER * _SUSTAINED_OVER_BURST_HOPPER * HOPPER_IN_TRAINING,
                        architecture="hopper"),
    # NVIDIA H200 datasheet: same compute as H100 SXM, 141 GB HBM3e at 4.8 TB/s.
    # Same NVLink 4 / NVSwitch gen 3 as H100: all-reduce busBw ~475 GB/s measured on 8 H200
    # (NVIDIA/nccl-tests#272), so the H100 NVLS figure.
    "h200-sxm": GPUSpec("h200-sxm", {"bf16": 989e12, "fp16": 989e12, "fp8": 1979e12}, 139.80 * _GIB,
                        4.8e12, 450e9, 50e9, 8, 132, 0.86 * _SUSTAINED_OVER_BURST_HOPPER * HOPPER_IN_TRAINING,
                        480.0 / 370.0, _FP8_BURST_HOPPER * _SUSTAINED_OVER_BURST_HOPPER * HOPPER_IN_TRAINING,
                        architecture="hopper"),
    # NVIDIA HGX B200 datasheet: per GPU BF16 dense 2.25 PFLOP/s, FP8 dense 4.5 PFLOP/s,
    # 180 GB HBM3e at 8 TB/s, NVLink 5 1.8 TB/s bidirectional; DGX B200 8x 400 Gb/s NICs.
    # GEMM ceiling: burst 0.834 (Bekman's B200 MAMF, 1,745 / 2,250 = 0.776, over 0.930 as
    # for the others), times the sustained clock. No in-training factor like Hopper's: no
    # same-software comparison with an A100 to fit one from.
    "b200": GPUSpec("b200", {"bf16": 2.25e15, "fp16": 2.25e15, "fp8": 4.5e15}, 178.35 * _GIB, 8.0e12,
                    900e9, 50e9, 8, 148, 0.834 * _SUSTAINED_OVER_BURST_B200, architecture="blackwell"),
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

# Node presets as the shared inventory names them; they map onto GPU_SPECS.
NODE_PRESETS: dict[str, str] = {
    "dgx-a100": "a100-80gb",
    "dgx-a100-40gb": "a100-40gb",
    "dgx-h100": "h100-sxm",
    "hgx-h100": "h100-sxm",
    "dgx-h200": "h200-sxm",
    "hgx-h800": "h800-sxm",
    "hgx-a800": "a800-80gb",
    "dgx-b200": "b200",
}


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
    "megatron-lm-2021": {"flash_attention": False, "sequence_parallel": False, "overlap_grad_reduce": False,
                         "overlap_tp_backward": False, "gradient_accumulation_fusion": False, "overlap_p2p_comm": False,
                         "fp32_grad_copy_kept": True, "stage_outputs_kept": True, "dropout": True,
                         "partial_recompute": False, "selective_recompute": False},
    # Megatron-LM as released with sequence parallelism and selective recomputation
    # (Korthikanti et al. 2022): asynchronous backward tensor-parallel collectives and
    # gradient-accumulation fusion, still no flash attention, gradients reduced after the
    # backward pass, dropout on.
    "megatron-lm-2022": {"flash_attention": False, "sequence_parallel": True, "overlap_grad_reduce": False,
                         "overlap_p2p_comm": False, "dropout": True},
    # Megatron-Core with Transformer Engine: the TrainingSpec defaults.
    "megatron-core": {},
}
