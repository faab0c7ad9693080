"""What of its GEMM ceiling a Hopper GPU keeps in training, fitted against an A100 on the same software.

``bench/hopper_in_training.py`` prints the fit and explains it; the pairs and the fit live
here so that the test holding ``HOPPER_IN_TRAINING`` to its fit reads the same data.
This is a constant fitted to published figures (the pairs below, from LLM Foundry's
"H100 80GB BF16" and "A100 80GB" tables).
"""

from __future__ import annotations

import functools

import numpy as np

from partitioners.parallel3d.presets import GPU_SPECS, HOPPER_IN_TRAINING
from partitioners.parallel3d.published.llm_foundry import (
    A100_FLASH_ATTENTION,
    H100_FLASH_ATTENTION,
    predicted_tokens_per_gpu,
)

# (model, sequence, GPUs, micro-batch, activation checkpointing,
#  H100 gradient accumulation, H100 tokens/s per GPU, A100 gradient accumulation, A100 tokens/s per GPU):
# every model and sequence length the two tables share with the same GPU count, micro-batch, checkpointing and
# mixed-precision mode (their 70B rows differ: "bf16 PURE" on A100, "amp_bf16" on H100; left out).
PAIRS = [
    ("1b", 2048, 8, 14, False, 1, 45455, 4, 20513),
    ("3b", 4096, 8, 5, False, 6, 20964, 6, 9457),
    ("7b", 2048, 8, 6, False, 1, 10643, 2, 4641),
    ("7b", 4096, 8, 16, True, 2, 8611, 2, 3684),
    ("13b", 2048, 8, 2, False, 1, 4792, 3, 2262),
    ("13b", 4096, 8, 10, True, 3, 4717, 3, 2060),
    ("30b", 2048, 8, 3, True, 21, 2002, 21, 916),
]


@functools.cache
def _a100_tokens_per_gpu() -> tuple[float, ...]:
    """The A100 side of every pair: it does not depend on the Hopper factor, so it is computed once."""
    return tuple(
        predicted_tokens_per_gpu({"preset": "dgx-a100"}, name, seq, gpus, mbs, ga_a, ckpt, A100_FLASH_ATTENTION)
        for name, seq, gpus, mbs, ckpt, _, _, ga_a, _ in PAIRS
    )


def speedup_ratios(hopper_factor: float) -> list[tuple[str, float, float]]:
    """(pair, predicted H100/A100 speed-up, published speed-up) with the Hopper ceilings at ``hopper_factor``."""
    h100 = GPU_SPECS["h100-sxm"]
    microbenchmark = h100.gemm_efficiency_max / HOPPER_IN_TRAINING
    cluster_h100 = {"preset": "dgx-h100", "gemm_efficiency_max": microbenchmark * hopper_factor}
    out = []
    for (name, seq, gpus, mbs, ckpt, ga_h, pub_h, _, pub_a), pred_a in zip(PAIRS, _a100_tokens_per_gpu()):
        pred_h = predicted_tokens_per_gpu(cluster_h100, name, seq, gpus, mbs, ga_h, ckpt, H100_FLASH_ATTENTION)
        out.append((f"MPT-{name} seq {seq}, {gpus} GPUs{' ckpt' if ckpt else ''}", pred_h / pred_a, pub_h / pub_a))
    return out


def fitted_factor(lo: float = 0.5, hi: float = 1.2, steps: int = 30) -> float:
    """The Hopper factor at which the median of predicted over published speed-up is 1 (bisection)."""
    for _ in range(steps):
        mid = 0.5 * (lo + hi)
        median = float(np.median([pred / pub for _, pred, pub in speedup_ratios(mid)]))
        lo, hi = (lo, mid) if median > 1.0 else (mid, hi)
    return 0.5 * (lo + hi)
