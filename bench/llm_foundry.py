"""Predicted against measured throughput of MosaicML's MPT benchmarks, 512 to 65,536 tokens a sequence.

Run: ``.venv/bin/python -m bench.llm_foundry`` (a few seconds).

MosaicML published the training throughput of its MPT models (125M to 70B parameters) on
8 to 128 GPUs for sequence lengths from 512 to 65,536 (mosaicml/llm-foundry,
scripts/train/benchmarking/README.md, commit 061f2c7: tables "A100 80GB with 1600 Gbps
node-node interconnect (RoCE)", "H100 80GB BF16" and "A100 40GB with 1600 Gbps node-node
interconnect (RoCE)"; PyTorch FSDP FULL_SHARD, flash attention, with or without activation
checkpointing). Across sequence lengths at a fixed model the share of the step spent in
attention goes from a few percent to most of it, so the tables test the cost model's
attention kernel apart from its GEMMs; the multi-node rows test FSDP over the network.

With the newest FlashAttention each GPU runs (the planner's default), the error grows
with the sequence length on every table. The tables do not name their attention kernel;
with FlashAttention-1 on the A100s (half of FlashAttention-2's speed, Dao 2023) the trend
goes flat, and with FlashAttention-2 on the H100 (35/75 of FlashAttention-3's, Shah et
al. 2024) it nearly does: the remaining error is then the rest of the model's. This
prints both, row by row, per sequence length and over 8 GPUs, with the error statistics.
"""

from __future__ import annotations

import numpy as np

from partitioners.parallel3d.published.llm_foundry import TABLES, table_errors


def _summary(errors: list[tuple[str, int, int, bool, float]]) -> str:
    e = np.array([err for *_, err in errors])
    by_seq: dict[int, list[float]] = {}
    for _, seq, _, _, err in errors:
        by_seq.setdefault(seq, []).append(err)
    per_seq = " ".join(f"{seq}:{np.median(v):+.0%}" for seq, v in sorted(by_seq.items()))
    multi_node = [err for _, _, gpus, _, err in errors if gpus > 8]
    across = f"; over 8 GPUs median {np.median(multi_node):+.1%} (n={len(multi_node)})" if multi_node else ""
    return (
        f"median {np.median(e):+.1%}, mean |err| {np.mean(np.abs(e)):.1%}, within 10%: "
        f"{np.count_nonzero(np.abs(e) < 0.10)}/{e.size}{across}; median by sequence length: {per_seq}"
    )


def main() -> None:
    for title, preset, table, version, grad_bytes in TABLES:
        newest = table_errors(preset, table, None, grad_bytes)
        older = table_errors(preset, table, version, grad_bytes)
        print(f"== {title}: predicted / published tokens/s per GPU - 1 (LLM Foundry MPT) ==")
        print(f"{'run':<36}{'newest FA':>11}{f'FA-{version}':>9}")
        for (name, seq, gpus, ckpt, err_newest), (*_, err_older) in zip(newest, older):
            label = f"MPT-{name} seq {seq}, {gpus} GPUs" + (" ckpt" if ckpt else "")
            print(f"{label:<36}{err_newest:>+11.1%}{err_older:>+9.1%}")
        print(f"newest FlashAttention: {_summary(newest)}")
        print(f"FlashAttention-{version}:       {_summary(older)}")
        print()


if __name__ == "__main__":
    main()
