"""Fit what of its GEMM ceiling a Hopper GPU keeps in training, against an A100 on the same software.

Run: ``.venv/bin/python -m bench.hopper_in_training`` (a second or two).

The A100 ceiling (Bekman's MAMF times the clock the board holds at its power limit)
reproduces the SC21 and Korthikanti et al. runs (``bench.parallel3d``). Whether the
Hopper ceiling, built the same way, transfers as well is a question of the H100 against
the A100 with everything else equal: MosaicML published LLM Foundry throughput for the
same MPT models, sequence lengths, micro-batches and software on both
(mosaicml/llm-foundry, scripts/train/benchmarking/README.md, tables "H100 80GB BF16" and
"A100 80GB with 1600 Gbps node-node interconnect (RoCE)"; PyTorch FSDP FULL_SHARD, flash
attention, bf16). For every pair this prints the H100-over-A100 speed-up the cost model
predicts and the published one; the factor on the Hopper ceilings that makes the median
ratio of the two 1 is the baseline-free figure, printed next to the constant the planner
ships (``partitioners.parallel3d.presets.HOPPER_IN_TRAINING``). Attention runs as
``bench.llm_foundry`` finds it ran in those tables: FlashAttention-1 on the A100,
FlashAttention-2 on the H100 (with the newest on both the fit moves from 0.814 to 0.805).
"""

from __future__ import annotations

import numpy as np

from partitioners.parallel3d.presets import HOPPER_IN_TRAINING
from partitioners.parallel3d.published.hopper import fitted_factor, speedup_ratios


def main() -> None:
    print("== H100 over A100 on the same software (LLM Foundry MPT benchmarks) ==")
    print(f"{'pair':<34}{'pred (no factor)':>17}{'pred (shipped)':>16}{'published':>11}{'shipped/pub':>13}")
    raw = speedup_ratios(1.0)
    shipped = speedup_ratios(HOPPER_IN_TRAINING)
    for (name, pred_raw, pub), (_, pred, _) in zip(raw, shipped):
        print(f"{name:<34}{pred_raw:>17.2f}{pred:>16.2f}{pub:>11.2f}{pred / pub - 1:>+13.1%}")
    errs = np.array([pred / pub - 1 for _, pred, pub in shipped])
    raw_errs = np.array([pred / pub - 1 for _, pred, pub in raw])
    print(
        f"median error of the predicted speed-up: {np.median(raw_errs):+.1%} with the microbenchmark ceiling, "
        f"{np.median(errs):+.1%} with HOPPER_IN_TRAINING = {HOPPER_IN_TRAINING}"
    )
    print(f"fitted factor (median ratio 1): {fitted_factor():.3f}   shipped: {HOPPER_IN_TRAINING}")


if __name__ == "__main__":
    main()
