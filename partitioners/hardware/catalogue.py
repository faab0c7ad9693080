"""The one catalogue of accelerators and the nodes they ship in, every figure with its source.

Two consumers read it: the placement inventory's presets
(:data:`partitioners.hardware.inventory.PRESETS`, :func:`~partitioners.hardware.inventory.preset_inventory`)
and the 3D-parallel planner's GPUs and nodes (:data:`partitioners.parallel3d.presets.GPU_SPECS`,
``NODE_PRESETS``). Before this module each kept its own copy, and the copies drifted (989.4 against
989 TFLOP/s for the H100, 180 GB against 178.35 GiB for the B200).

Only *hardware facts* live here: what a vendor's spec sheet or whitepaper states, or what the
CUDA driver reports (the memory a process can allocate). How much of it software reaches (GEMM
ceilings, NVLink SHARP speed-ups, the in-training factor fitted to published runs) are terms of
the planner's cost model and stay in :mod:`partitioners.parallel3d.presets`.

Conventions: peak FLOP/s are *dense* tensor-core figures (spec sheets print the 2:4-sparsity
figure first; dense is half of it); link bandwidths are per GPU and per direction, what one rank
can drive (NVLink's bidirectional total halved; between nodes, the GPU's own NIC rail: DGX/HGX
systems have one NIC per GPU); memory tiers are listed outermost first, main memory (HBM, or
GDDR on workstation cards) first.

References
----------
.. [A100] NVIDIA A100 Tensor Core GPU datasheet (2021) and "NVIDIA A100 Tensor Core GPU
   Architecture" whitepaper (2020).
.. [A800] NVIDIA's A800 announcement (7 November 2022, as Reuters reported it) and its
   distributors' listings: the A100 SXM4 80GB, same compute and memory, with NVLink at
   400 GB/s instead of 600 GB/s.
.. [DGXA100] NVIDIA DGX A100 datasheet (2020) and DGX A100 User Guide: 8x ConnectX-6 200 Gb/s
   HDR InfiniBand, one per GPU.
.. [H100] NVIDIA H100 Tensor Core GPU datasheet (2023) and "NVIDIA H100 Tensor Core GPU
   Architecture" whitepaper (2022).
.. [DGXH100] NVIDIA DGX H100 datasheet / DGX H100 User Guide, "Hardware Overview": 8x
   ConnectX-7 400 Gb/s InfiniBand NDR, one per GPU.
.. [H800] NVIDIA H800 product brief; DeepSeek-AI, "DeepSeek-V3 Technical Report" (2024),
   Sec. 3.1 (H800 nodes: NVLink within, InfiniBand across).
.. [H200] NVIDIA H200 Tensor Core GPU datasheet (2024).
.. [B200] NVIDIA DGX B200 datasheet (2024) and HGX B200 specifications (nvidia.com
   /data-center/hgx, 2024): 8-GPU totals, divided by 8 here.
.. [GB200] NVIDIA GB200 NVL72 specifications (nvidia.com/data-center/gb200-nvl72, 2024):
   72-GPU rack totals, divided by 72 here; DGX GB200 datasheet (2024) for the ConnectX-7
   400 Gb/s scale-out port per GPU.
.. [L40S] NVIDIA L40S datasheet (2023).
.. [ASCEND] Huawei Atlas 800T A2 training server and Ascend 910B figures as reported
   publicly (Huawei does not publish a single datasheet; see the entries' comments).
.. [PCIE4] PCI-SIG, PCI Express Base Specification 4.0 (16 GT/s per lane, 128b/130b
   encoding: 31.5 GB/s per direction for x16).
.. [ETH100G] IEEE 802.3ba-2010, 100 Gb/s Ethernet: 12.5 GB/s.
.. [DRIVER] The memory the CUDA driver hands a process (``cudaDeviceProp.totalGlobalMem``, the
   "total capacity" PyTorch's out-of-memory message prints), a little under the HBM on the
   datasheet: H100 80GB HBM3 79.11 GiB (vllm-project/vllm#27508); A100-SXM4-80GB 79.35 GiB,
   A100-40GB 39.59 GiB, H200 139.80 GiB, B200 178.35 GiB as those messages report.
.. [CCH100] Chips and Cheese, "Nvidia's H100: Funny L2, and Tons of Bandwidth" (2023): ~5.5 TB/s
   of L2 bandwidth measured on H100 PCIe, a lower bound for SXM.
.. [JIA18] Z. Jia et al., "Dissecting the NVIDIA Volta GPU Architecture via Microbenchmarking"
   (2018): V100 L2 bandwidth 2,155 GB/s.
.. [NVLAT] A. Li et al., "Evaluating Modern GPU Interconnect: PCIe, NVLink, NV-SLI, NVSwitch and
   GPUDirect", IEEE TPDS 31(1), 2020 (microsecond-level GPU-GPU latencies over
   NVLink/NVSwitch; ~10 us over PCIe).
.. [IBLAT] NVIDIA ConnectX-7 product brief (sub-microsecond adapter latency) and nccl-tests
   small-message all-reduce latencies across nodes of a few microseconds; 5 us end to end.
.. [POWER] Board power at load: the maximum TDP / TBP each datasheet above states (A100 SXM4
   400 W, H100/H800/H200 SXM 700 W, L40S 350 W [A100] [H100] [H200] [L40S]; B200 1,000 W per
   GPU in HGX B200 [B200]; 1,200 W per Blackwell GPU of GB200 NVL72 as NVIDIA's partners list
   it [GB200]; Ascend 910B ~400 W as reported [ASCEND]). Idle power is an *estimate*: a GPU a
   job holds but does not use keeps its CUDA context, which costs 26-50 W over bare idle on
   HBM parts and 66 W on GDDR6 (S. S. Vadari, "The Model Parking Tax", arXiv:2605.23918,
   2026, measured on H100, A100, L40S); with bare idle of ~30-60 W that is ~55 W (A100),
   ~75 W (Hopper), ~100 W (L40S). Blackwell and Ascend: the Hopper figure scaled by board
   power, ~11% of it.
.. [LINKPJ] Energy per bit moved: NVLink-C2C 1.3 pJ/bit and PCIe Gen 5 25x that (~32 pJ/bit)
   ("NVIDIA Grace Hopper Superchip Architecture" whitepaper, 2023). Board-level NVLink through
   NVSwitch is unpublished: *estimate* 5 pJ/bit (two long-reach SerDes ends and a switch
   hop, a few pJ/bit each). InfiniBand NDR: *estimate* 130 pJ/bit from power over line rate:
   two ConnectX-7 adapters (~20 W each at 400 Gb/s, product brief) and one Quantum-2 switch
   hop (~750 W over 64 x 400 Gb/s, QM9700 datasheet).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from partitioners.hardware.collectives import LinkSpec

__all__ = [
    "ACCELERATORS",
    "NODES",
    "REFERENCES",
    "Accelerator",
    "MemoryTier",
    "Node",
]

GB = 1e9
TB = 1e12
GiB = 2**30
MiB = 2**20
KiB = 2**10

#: Short reference key -> the public document it stands for (see the module docstring).
REFERENCES: Mapping[str, str] = MappingProxyType(
    {
        "A100": "NVIDIA A100 Tensor Core GPU datasheet (2021); NVIDIA A100 Tensor Core GPU Architecture whitepaper (2020)",
        "A800": "NVIDIA's A800 announcement (7 November 2022, reported by Reuters): A100 with NVLink at 400 GB/s",
        "DGXA100": "NVIDIA DGX A100 datasheet (2020); DGX A100 User Guide",
        "H100": "NVIDIA H100 Tensor Core GPU datasheet (2023); NVIDIA H100 Tensor Core GPU Architecture whitepaper (2022)",
        "DGXH100": "NVIDIA DGX H100 datasheet; DGX H100 User Guide, Hardware Overview",
        "H800": "NVIDIA H800 product brief; DeepSeek-V3 Technical Report (2024), Sec. 3.1",
        "H200": "NVIDIA H200 Tensor Core GPU datasheet (2024)",
        "B200": "NVIDIA DGX B200 datasheet (2024); HGX B200 specifications, nvidia.com/data-center/hgx (2024)",
        "GB200": "NVIDIA GB200 NVL72 specifications, nvidia.com/data-center/gb200-nvl72 (2024); DGX GB200 datasheet",
        "L40S": "NVIDIA L40S datasheet (2023)",
        "ASCEND": "Huawei Atlas 800T A2 and Ascend 910B figures as reported publicly",
        "PCIE4": "PCI-SIG, PCI Express Base Specification 4.0",
        "ETH100G": "IEEE 802.3ba-2010, 100 Gb/s Ethernet",
        "DRIVER": "cudaDeviceProp.totalGlobalMem as PyTorch's out-of-memory message reports it (vllm-project/vllm#27508)",
        "CCH100": "Chips and Cheese, Nvidia's H100: Funny L2, and Tons of Bandwidth (2023)",
        "JIA18": "Z. Jia et al., Dissecting the NVIDIA Volta GPU Architecture via Microbenchmarking (2018)",
        "NVLAT": "A. Li et al., Evaluating Modern GPU Interconnect, IEEE TPDS 31(1), 2020",
        "IBLAT": "NVIDIA ConnectX-7 product brief; nccl-tests small-message latencies across nodes",
        "POWER": "Datasheet TDP/TBP per GPU; idle estimated from S. S. Vadari, The Model Parking Tax, arXiv:2605.23918",
        "LINKPJ": "NVIDIA Grace Hopper Superchip Architecture whitepaper (2023); ConnectX-7 and QM9700 power (estimate)",
    }
)


@dataclass(frozen=True)
class MemoryTier:
    """One level of a device's memory: its size and the bandwidth the device reads it at."""

    name: str
    capacity_bytes: float
    bandwidth_bytes_per_s: float

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("a memory tier needs a name")
        for label, value in (
            ("capacity_bytes", self.capacity_bytes),
            ("bandwidth_bytes_per_s", self.bandwidth_bytes_per_s),
        ):
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"memory tier {self.name!r}: {label} must be a positive finite number, got {value!r}")


@dataclass(frozen=True)
class Accelerator:
    """One accelerator model as its vendor describes it.

    Attributes
    ----------
    key : str
        Catalogue key, lower case (``"h100-sxm"``); the 3D planner's GPU name.
    device_type : str
        The device type an inventory preset gives its devices (``"H100-SXM5-80GB"``).
    architecture : str
        Generation (``"ampere"``, ``"hopper"``, ``"blackwell"``, ``"ada"``, ``"davinci"``).
    dense_peak_flops_per_s : Mapping[str, float]
        Dense peak by dtype; a dtype the vendor publishes no figure for is absent (fp8 on A100).
    memory_tiers : tuple[MemoryTier, ...]
        Outermost first; the first is main memory, at the capacity a process can allocate.
    sm_count : int or None
        Streaming multiprocessors, where the planner's kernel model needs them.
    sources : tuple[str, ...]
        :data:`REFERENCES` keys behind the figures.
    board_power_w : float or None
        Power drawn running kernels: the datasheet's maximum TDP / TBP [POWER].
    idle_power_w : float or None
        Power drawn held by a job but idle (CUDA context up, no kernel) [POWER].
    """

    key: str
    device_type: str
    architecture: str
    dense_peak_flops_per_s: Mapping[str, float]
    memory_tiers: tuple[MemoryTier, ...]
    sm_count: int | None
    sources: tuple[str, ...]
    board_power_w: float | None = None
    idle_power_w: float | None = None

    def __post_init__(self) -> None:
        if not self.key or self.key != self.key.lower():
            raise ValueError(f"accelerator key {self.key!r} must be a non-empty lower-case name")
        if "bf16" not in self.dense_peak_flops_per_s:
            # the inventory's default dtype: every preset must be able to time an operator in it
            raise ValueError(f"accelerator {self.key!r} needs a bf16 peak")
        for dtype, peak in self.dense_peak_flops_per_s.items():
            if not (math.isfinite(peak) and peak > 0):
                raise ValueError(f"accelerator {self.key!r}: peak {dtype} must be positive and finite, got {peak!r}")
        if not self.memory_tiers:
            raise ValueError(f"accelerator {self.key!r} needs its main memory as the first tier")
        if len({tier.name for tier in self.memory_tiers}) != len(self.memory_tiers):
            raise ValueError(f"accelerator {self.key!r} lists a memory tier twice")
        if self.sm_count is not None and self.sm_count < 1:
            raise ValueError(f"accelerator {self.key!r}: sm_count must be positive")
        if (self.board_power_w is None) != (self.idle_power_w is None):
            raise ValueError(f"accelerator {self.key!r}: give both board and idle power, or neither")
        if self.board_power_w is not None and self.idle_power_w is not None:
            if not 0 <= self.idle_power_w <= self.board_power_w:
                raise ValueError(f"accelerator {self.key!r}: idle power must lie in [0, board power]")
        _check_sources(self.key, self.sources)
        object.__setattr__(self, "dense_peak_flops_per_s", MappingProxyType(dict(self.dense_peak_flops_per_s)))

    @property
    def memory_bytes(self) -> float:
        """Main-memory capacity a process can allocate."""
        return self.memory_tiers[0].capacity_bytes

    @property
    def memory_bandwidth_bytes_per_s(self) -> float:
        """Main-memory bandwidth."""
        return self.memory_tiers[0].bandwidth_bytes_per_s


# Energy per bit moved [LINKPJ]: NVLink / HCCS within a node (estimate), PCIe Gen 4-5 (25x
# NVLink-C2C's 1.3 pJ/bit), a NIC-to-NIC hop through one switch (estimate; Ethernet as InfiniBand).
_NVLINK_PJ_PER_BIT = 5.0
_PCIE_PJ_PER_BIT = 32.0
_NIC_PJ_PER_BIT = 130.0


@dataclass(frozen=True)
class Node:
    """A node (or NVLink domain) of identical accelerators: how many, and the two link classes.

    Attributes
    ----------
    name : str
        Preset name (``"dgx-h100"``).
    accelerator : Accelerator
    devices_per_node : int
    intra_node_link : LinkSpec
        Between two devices of the node (NVSwitch, HCCS, PCIe), per direction.
    inter_node_link : LinkSpec
        From one device to a device of another node: the device's own NIC rail, per direction.
    group_prefix, device_prefix : str
        How an inventory names the node and its devices (``"node0/gpu3"``, ``"rack1/gpu70"``).
    sources : tuple[str, ...]
        :data:`REFERENCES` keys behind the device count and the links.
    intra_node_energy_pj_per_bit, inter_node_energy_pj_per_bit : float
        Energy per bit moved over each link class [LINKPJ]; by default NVLink-class within
        the node and a NIC hop through a switch across nodes.
    """

    name: str
    accelerator: Accelerator
    devices_per_node: int
    intra_node_link: LinkSpec
    inter_node_link: LinkSpec
    sources: tuple[str, ...]
    group_prefix: str = "node"
    device_prefix: str = "gpu"
    intra_node_energy_pj_per_bit: float = _NVLINK_PJ_PER_BIT
    inter_node_energy_pj_per_bit: float = _NIC_PJ_PER_BIT

    def __post_init__(self) -> None:
        if self.devices_per_node < 1:
            raise ValueError(f"node {self.name!r} needs at least one device")
        for label, link in (("intra_node_link", self.intra_node_link), ("inter_node_link", self.inter_node_link)):
            if not (math.isfinite(link.bandwidth_bytes_per_s) and link.bandwidth_bytes_per_s > 0):
                raise ValueError(f"node {self.name!r}: {label} bandwidth must be positive and finite")
            if not (math.isfinite(link.latency_s) and link.latency_s >= 0):
                raise ValueError(f"node {self.name!r}: {label} latency must be non-negative and finite")
        _check_sources(self.name, self.sources)


def _check_sources(what: str, sources: tuple[str, ...]) -> None:
    if not sources:
        raise ValueError(f"{what!r} names no source for its figures")
    unknown = [key for key in sources if key not in REFERENCES]
    if unknown:
        raise ValueError(f"{what!r} cites {unknown}, which REFERENCES does not hold")


# ------------------------------------------------------------------------ accelerators

# A100 SXM4 [A100]: bf16/fp16 dense 312 TFLOP/s, tf32 156, fp32 (non-tensor) 19.5; no fp8.
# 108 SMs (whitepaper). L2 40 MB; 164 KB shared memory per SM, read at 128 B/clk/SM x 1.41 GHz
# x 108 SMs = 19.5 TB/s (derived from the whitepaper). L2 bandwidth: 2.3x V100's per the
# whitepaper, with V100's measured at 2,155 GB/s [JIA18]: 4.96 TB/s.
_A100_PEAKS = {"bf16": 312e12, "fp16": 312e12, "tf32": 156e12, "fp32": 19.5e12}
_A100_ON_CHIP = (MemoryTier("L2", 40 * MiB, 4.96 * TB), MemoryTier("SMEM", 108 * 164 * KiB, 19.5 * TB))

# H100 SXM5 [H100]: dense tensor-core peaks from the whitepaper: bf16/fp16 989.4 TFLOP/s
# (132 SMs x 4 tensor cores x 1,024 FLOP/clk x 1.83 GHz), fp8 1,978.9, tf32 494.7; fp32
# (non-tensor) 66.9 (the datasheet rounds them to 989 and 1,979). L2 50 MB (whitepaper);
# shared memory up to 228 KB per SM x 132 SMs, read at 128 B/clk/SM x 132 SMs x 1.83 GHz
# = 30.9 TB/s. L2 bandwidth is unpublished: ~5.5 TB/s as measured on H100 PCIe [CCH100].
# H800 and H200 carry the same GH100 die at the same clocks [H800] [H200].
_HOPPER_PEAKS = {"bf16": 989.4e12, "fp16": 989.4e12, "fp8": 1978.9e12, "tf32": 494.7e12, "fp32": 66.9e12}
_HOPPER_ON_CHIP = (MemoryTier("L2", 50 * MiB, 5.5 * TB), MemoryTier("SMEM", 132 * 228 * KiB, 30.9 * TB))

ACCELERATORS: Mapping[str, Accelerator] = MappingProxyType(
    {
        acc.key: acc
        for acc in (
            # [A100] HBM2e "80 GB" = 80 GiB (5 stacks of 16 GiB; nvidia-smi shows 81,920 MiB) at
            # 2,039 GB/s, of which the driver hands a process 79.35 GiB [DRIVER].
            Accelerator(
                "a100-80gb",
                "A100-SXM4-80GB",
                "ampere",
                _A100_PEAKS,
                (MemoryTier("HBM", 79.35 * GiB, 2.039 * TB), *_A100_ON_CHIP),
                108,
                ("A100", "DRIVER", "JIA18", "POWER"),
                board_power_w=400.0,
                idle_power_w=55.0,
            ),
            # [A100] the 40 GB part: HBM2 at 1,555 GB/s, 39.59 GiB to a process [DRIVER]; same die.
            Accelerator(
                "a100-40gb",
                "A100-SXM4-40GB",
                "ampere",
                _A100_PEAKS,
                (MemoryTier("HBM", 39.59 * GiB, 1.555 * TB), *_A100_ON_CHIP),
                108,
                ("A100", "DRIVER", "JIA18", "POWER"),
                board_power_w=400.0,
                idle_power_w=55.0,
            ),
            # [A800] export variant of the A100 SXM4 80GB: the same chip and memory, NVLink cut (see its node).
            Accelerator(
                "a800-80gb",
                "A800-SXM4-80GB",
                "ampere",
                _A100_PEAKS,
                (MemoryTier("HBM", 79.35 * GiB, 2.039 * TB), *_A100_ON_CHIP),
                108,
                ("A800", "A100", "DRIVER", "POWER"),
                board_power_w=400.0,
                idle_power_w=55.0,
            ),
            # [H100] HBM3 "80 GB" = 80 GiB (5 stacks of 16 GiB; nvidia-smi shows 81,559 MiB) at 3.35 TB/s,
            # of which the driver hands a process 79.11 GiB [DRIVER].
            Accelerator(
                "h100-sxm",
                "H100-SXM5-80GB",
                "hopper",
                _HOPPER_PEAKS,
                (MemoryTier("HBM", 79.11 * GiB, 3.35 * TB), *_HOPPER_ON_CHIP),
                132,
                ("H100", "DRIVER", "CCH100", "POWER"),
                board_power_w=700.0,
                idle_power_w=75.0,
            ),
            # [H800] export variant of the H100 SXM5: H100 compute and memory, NVLink cut (see its node).
            Accelerator(
                "h800-sxm",
                "H800-SXM5-80GB",
                "hopper",
                _HOPPER_PEAKS,
                (MemoryTier("HBM", 79.11 * GiB, 3.35 * TB), *_HOPPER_ON_CHIP),
                132,
                ("H800", "H100", "DRIVER", "CCH100", "POWER"),
                board_power_w=700.0,
                idle_power_w=75.0,
            ),
            # [H200] same compute as H100 SXM; 141 GB HBM3e at 4.8 TB/s, 139.80 GiB to a process [DRIVER].
            Accelerator(
                "h200-sxm",
                "H200-SXM5-141GB",
                "hopper",
                _HOPPER_PEAKS,
                (MemoryTier("HBM", 139.80 * GiB, 4.8 * TB), *_HOPPER_ON_CHIP),
                132,
                ("H200", "H100", "DRIVER", "CCH100", "POWER"),
                board_power_w=700.0,
                idle_power_w=75.0,
            ),
            # [B200] HGX B200 8-GPU totals with sparsity: fp8 72 PFLOP/s, bf16/fp16 36, tf32 18; fp32
            # 600 TFLOP/s; 1,440 GB HBM3e at 64 TB/s. Per GPU, dense = half the sparse figure: fp8 4.5 PF,
            # bf16 2.25 PF, tf32 1.125 PF, fp32 75 TF; "180 GB" at 8 TB/s, of which the driver hands a
            # process 178.35 GiB [DRIVER]. 148 SMs as the CUDA device properties report them
            # (multiProcessorCount). L2 and shared-memory sizes are in no public datasheet: only HBM.
            Accelerator(
                "b200",
                "B200",
                "blackwell",
                {"bf16": 2.25e15, "fp16": 2.25e15, "fp8": 4.5e15, "tf32": 1.125e15, "fp32": 75e12},
                (MemoryTier("HBM", 178.35 * GiB, 8 * TB),),
                148,
                ("B200", "DRIVER", "POWER"),
                board_power_w=1000.0,
                idle_power_w=110.0,
            ),
            # [GB200] NVL72 rack totals with sparsity: fp8 720 PF, bf16/fp16 360 PF, tf32 180 PF; fp32
            # 5,760 TF; up to 13.4 TB HBM3e at 576 TB/s. Per GPU dense: fp8 5 PF, bf16 2.5 PF, tf32
            # 1.25 PF, fp32 80 TF; 186 GB (13.4 TB / 72) at 8 TB/s. No driver figure at hand.
            Accelerator(
                "gb200",
                "B200-GB200",
                "blackwell",
                {"bf16": 2.5e15, "fp16": 2.5e15, "fp8": 5e15, "tf32": 1.25e15, "fp32": 80e12},
                (MemoryTier("HBM", 13.4 * TB / 72, 8 * TB),),
                None,
                ("GB200", "POWER"),
                board_power_w=1200.0,
                idle_power_w=130.0,
            ),
            # [ASCEND] fp16/bf16 ~320 TFLOP/s dense (Huawei's 910 was 256 TFLOP/s fp16; the 910B is
            # reported at ~320); 64 GB HBM2e reported at 1.6 TB/s. fp32, fp8: no public figure (fp8
            # unsupported). Approximate: replace with vendor figures if known.
            Accelerator(
                "ascend-910b",
                "Ascend-910B",
                "davinci",
                {"bf16": 320e12, "fp16": 320e12},
                (MemoryTier("HBM", 64 * GB, 1.6 * TB),),
                None,
                ("ASCEND", "POWER"),
                board_power_w=400.0,
                idle_power_w=55.0,
            ),
            # [L40S] bf16/fp16 tensor 362.05 TFLOP/s with sparsity -> 181 dense; fp8 733 sparse -> 366
            # dense; fp32 91.6 TFLOP/s; 48 GB GDDR6 at 864 GB/s. L2 bandwidth unpublished: GDDR6 only.
            Accelerator(
                "l40s",
                "L40S",
                "ada",
                {"bf16": 181e12, "fp16": 181e12, "fp8": 366e12, "fp32": 91.6e12},
                (MemoryTier("GDDR6", 48 * GB, 864 * GB),),
                None,
                ("L40S", "POWER"),
                board_power_w=350.0,
                idle_power_w=100.0,
            ),
        )
    }
)

# ------------------------------------------------------------------------------ nodes

# Latencies: ~2 us GPU to GPU over NVLink/NVSwitch [NVLAT]; 5 us end to end across an
# InfiniBand/RoCE NIC [IBLAT]. The same figures stand for Ascend's HCCS and RoCE.
_NVLINK_LATENCY_S = 2e-6
_NIC_LATENCY_S = 5e-6
# One ConnectX-7 400 Gb/s NDR port per GPU = 50 GB/s per direction [DGXH100] [B200] [GB200];
# one ConnectX-6 200 Gb/s HDR port per GPU = 25 GB/s [DGXA100].
_NDR_400G = LinkSpec(bandwidth_bytes_per_s=50 * GB, latency_s=_NIC_LATENCY_S)
_HDR_200G = LinkSpec(bandwidth_bytes_per_s=25 * GB, latency_s=_NIC_LATENCY_S)
# NVLink per GPU, bidirectional total halved: NVLink 3 (A100) 600 GB/s -> 300; NVLink 4
# (H100, H200) 900 GB/s -> 450; NVLink 5 (B200) 1.8 TB/s -> 900; the export parts' 400 GB/s
# (A800, H800) -> 200.
_NVLINK3 = LinkSpec(bandwidth_bytes_per_s=300 * GB, latency_s=_NVLINK_LATENCY_S)
_NVLINK4 = LinkSpec(bandwidth_bytes_per_s=450 * GB, latency_s=_NVLINK_LATENCY_S)
_NVLINK5 = LinkSpec(bandwidth_bytes_per_s=900 * GB, latency_s=_NVLINK_LATENCY_S)
_NVLINK_EXPORT = LinkSpec(bandwidth_bytes_per_s=200 * GB, latency_s=_NVLINK_LATENCY_S)

NODES: Mapping[str, Node] = MappingProxyType(
    {
        node.name: node
        for node in (
            # DGX A100 [DGXA100]: 8 x A100 SXM 80GB on NVSwitch gen 2, NVLink 3; 8 x ConnectX-6 HDR.
            Node(
                "dgx-a100",
                ACCELERATORS["a100-80gb"],
                8,
                _NVLINK3,
                _HDR_200G,
                ("DGXA100", "A100", "NVLAT", "IBLAT", "LINKPJ"),
            ),
            # DGX A100 320GB [DGXA100]: the same system with 8 x A100 SXM 40GB.
            Node(
                "dgx-a100-40gb",
                ACCELERATORS["a100-40gb"],
                8,
                _NVLINK3,
                _HDR_200G,
                ("DGXA100", "A100", "NVLAT", "IBLAT", "LINKPJ"),
            ),
            # HGX A800 [A800]: 8 x A800 with NVLink at 400 GB/s bidirectional; NICs as in DGX A100.
            Node(
                "hgx-a800",
                ACCELERATORS["a800-80gb"],
                8,
                _NVLINK_EXPORT,
                _HDR_200G,
                ("A800", "DGXA100", "NVLAT", "IBLAT", "LINKPJ"),
            ),
            # DGX H100 [DGXH100]: 8 x H100 SXM on NVSwitch gen 3, NVLink 4; 8 x ConnectX-7 NDR.
            Node(
                "dgx-h100",
                ACCELERATORS["h100-sxm"],
                8,
                _NVLINK4,
                _NDR_400G,
                ("DGXH100", "H100", "NVLAT", "IBLAT", "LINKPJ"),
            ),
            # HGX H100 8-GPU: the DGX H100 baseboard in other vendors' servers, one 400 Gb/s NIC per GPU.
            Node(
                "hgx-h100",
                ACCELERATORS["h100-sxm"],
                8,
                _NVLINK4,
                _NDR_400G,
                ("DGXH100", "H100", "NVLAT", "IBLAT", "LINKPJ"),
            ),
            # DGX H200 [H200]: 8 x H200 on the same NVLink 4 / NVSwitch gen 3, 8 x ConnectX-7 NDR.
            Node(
                "dgx-h200",
                ACCELERATORS["h200-sxm"],
                8,
                _NVLINK4,
                _NDR_400G,
                ("H200", "DGXH100", "NVLAT", "IBLAT", "LINKPJ"),
            ),
            # HGX H800 [H800]: 8 x H800 with NVLink at 400 GB/s bidirectional; InfiniBand across nodes,
            # one 400 Gb/s NIC per GPU.
            Node(
                "hgx-h800",
                ACCELERATORS["h800-sxm"],
                8,
                _NVLINK_EXPORT,
                _NDR_400G,
                ("H800", "DGXH100", "NVLAT", "IBLAT", "LINKPJ"),
            ),
            # DGX B200 [B200]: 8 x B200 on NVLink 5; 8 x ConnectX-7 400 Gb/s.
            Node(
                "dgx-b200",
                ACCELERATORS["b200"],
                8,
                _NVLINK5,
                _NDR_400G,
                ("B200", "NVLAT", "IBLAT", "LINKPJ"),
            ),
            # GB200 NVL72 [GB200]: 72 GPUs in one NVLink domain per rack, 130 TB/s aggregate = 1.8 TB/s
            # per GPU bidirectional = 900 GB/s per direction; one ConnectX-7 400 Gb/s port per GPU
            # between racks (DGX GB200 datasheet).
            Node(
                "gb200-nvl72",
                ACCELERATORS["gb200"],
                72,
                _NVLINK5,
                _NDR_400G,
                ("GB200", "NVLAT", "IBLAT", "LINKPJ"),
                group_prefix="rack",
            ),
            # Atlas 800T A2 [ASCEND]: 8 x Ascend 910B in an HCCS full mesh; each NPU has 7 HCCS links of
            # 56 GB/s (392 GB/s aggregate), so one peer pair gets 56 GB/s. Scale-out: 8 x 200 GbE RoCE =
            # 25 GB/s per NPU. Latencies as NVLink / InfiniBand.
            Node(
                "ascend-910b",
                ACCELERATORS["ascend-910b"],
                8,
                LinkSpec(56 * GB, _NVLINK_LATENCY_S),
                _HDR_200G,
                ("ASCEND", "NVLAT", "IBLAT", "LINKPJ"),
                device_prefix="npu",
            ),
            # Workstation: 4 x L40S [L40S] with no NVLink, peer to peer over PCIe 4.0 x16 [PCIE4] =
            # 31.5 GB/s per direction, ~10 us [NVLAT]; machines joined by 100 GbE [ETH100G] = 12.5 GB/s, 10 us.
            Node(
                "pcie-workstation",
                ACCELERATORS["l40s"],
                4,
                LinkSpec(31.5 * GB, 10e-6),
                LinkSpec(12.5 * GB, 10e-6),
                ("L40S", "PCIE4", "NVLAT", "ETH100G", "LINKPJ"),
                group_prefix="host",
                intra_node_energy_pj_per_bit=_PCIE_PJ_PER_BIT,
            ),
        )
    }
)
