"""Predicted against measured throughput of MosaicML's MPT benchmarks, 512 to 65,536 tokens a sequence.

Run: ``.venv/bin/python -m bench.llm_foundry`` (a few seconds).

MosaicML published the training throughput of its MPT models (125M to 30B parameters)
on 8 GPUs for sequence lengths from 512 to 65,536 (mosaicml/llm-foundry,
scripts/train/benchmarking/README.md, commit 061f2c7: tables "A100 80GB with 1600 Gbps
node-node interconnect (RoCE)" and "H100 80GB BF16"; PyTorch FSDP FULL_SHARD, bf16,
flash attention, with or without activation checkpointing). Across sequence lengths at a
fixed model the share of the step spent in attention goes from a few percent to most of
it, so the tables test the cost model's attention kernel apart from its GEMMs.

With the newest FlashAttention each GPU runs (the planner's default), the error grows
with the sequence length on both GPUs. The tables do not name their attention kernel;
with FlashAttention-1 on the A100 (half of FlashAttention-2's speed, Dao 2023) the trend
goes flat, and with FlashAttention-2 on the H100 (35/75 of FlashAttention-3's, Shah et
al. 2024) it nearly does: the remaining error is then the rest of the model's. This
prints both, row by row and per sequence length, and the error statistics.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np

from partitioners.parallel3d import evaluate_layouts

# MPT shapes (llm-foundry scripts/train/yamls/pretrain/mpt-*.yaml): d_model, heads, layers;
# vocabulary 50,368, 4x GELU MLP, ALiBi, tied embeddings, no dropout.
MPT_SHAPES = {"125m": (768, 12, 12), "350m": (1024, 16, 24), "760m": (1536, 12, 24), "1b": (2048, 16, 24),
              "3b": (2560, 20, 32), "7b": (4096, 32, 32), "13b": (5120, 40, 40), "30b": (7168, 56, 48)}

# Every 8-GPU row of each table: model, sequence length, micro-batch, gradient accumulation,
# activation checkpointing (T/F), published tokens/s per GPU.
A100_80GB_ROWS = """
30b 8192 1 21 T 574 | 30b 4096 1 21 T 814 | 30b 2048 3 21 T 916 | 30b 1024 6 21 T 946 | 30b 512 12 21 T 967
13b 32768 1 3 T 1016 | 13b 16384 3 3 T 1431 | 13b 8192 5 3 T 1795 | 13b 4096 10 3 T 2060 | 13b 2048 2 3 F 2262
13b 1024 40 3 T 2330 | 7b 65536 1 2 T 1013 | 7b 32768 2 2 T 1672 | 7b 16384 4 2 T 2453 | 7b 8192 8 2 T 3206
7b 4096 16 2 T 3684 | 7b 2048 6 2 F 4641 | 7b 1024 64 2 T 4357 | 3b 65536 1 2 T 1767 | 3b 32768 3 6 T 3029
3b 16384 1 6 F 5529 | 3b 8192 3 6 F 7695 | 3b 4096 5 6 F 9457 | 3b 2048 10 2 F 10811 | 3b 1024 20 6 F 11580
3b 512 40 6 F 12127 | 1b 65536 1 2 T 3044 | 1b 32768 1 4 F 6275 | 1b 16384 2 4 F 9956 | 1b 8192 3 4 F 13814
1b 4096 7 4 F 17807 | 1b 2048 14 4 F 20513 | 1b 1024 18 4 F 22112 | 1b 512 56 4 F 23148
760m 65536 1 2 T 4143 | 760m 32768 1 2 F 8802 | 760m 16384 3 2 F 14274 | 760m 8192 6 2 F 20933
760m 4096 12 2 F 27351 | 760m 2048 24 2 F 32434 | 760m 1024 48 2 F 29765 | 760m 512 96 2 F 29446
350m 65536 1 2 F 7524 | 350m 32768 2 2 F 13652 | 350m 16384 4 2 F 23559 | 350m 8192 8 2 F 36569
350m 4096 16 2 F 49555 | 350m 2048 32 2 F 58782 | 350m 1024 64 2 F 64813 | 350m 512 128 2 F 69330
125m 65536 1 2 F 20368 | 125m 32768 2 2 F 36407 | 125m 16384 4 2 F 60040 | 125m 8192 8 2 F 90392
125m 4096 16 2 F 118396 | 125m 2048 32 2 F 141737 | 125m 1024 64 2 F 156468 | 125m 512 128 2 F 165681
"""
H100_80GB_ROWS = """
30b 8192 1 21 T 1384 | 30b 4096 1 21 T 1802 | 30b 2048 3 21 T 2002 | 30b 1024 6 21 T 2084
13b 32768 1 3 T 1976 | 13b 16384 3 3 T 2985 | 13b 4096 10 3 T 4717 | 13b 2048 2 1 F 4792 | 13b 1024 40 3 T 5502
7b 65536 1 2 T 1956 | 7b 32768 2 2 T 3318 | 7b 8192 8 2 T 6935 | 7b 4096 16 2 T 8611 | 7b 2048 6 1 F 10643
7b 1024 64 2 T 10203 | 3b 65536 1 2 T 3262 | 3b 32768 3 6 T 5873 | 3b 16384 1 6 F 11152 | 3b 8192 3 6 F 16578
3b 4096 5 6 F 20964 | 3b 1024 20 6 F 27046 | 3b 512 40 6 F 27965 | 1b 65536 1 2 T 5506 | 1b 32768 1 4 F 12025
1b 16384 2 4 F 19649 | 1b 8192 3 4 F 29157 | 1b 4096 7 4 F 38535 | 1b 2048 14 1 F 45455 | 1b 1024 18 4 F 48910
1b 512 56 4 F 52275 | 760m 32768 1 2 F 16291 | 760m 16384 3 2 F 27815 | 760m 8192 6 2 F 41825
760m 4096 12 2 F 55459 | 760m 2048 24 2 F 63147 | 760m 1024 48 2 F 78581 | 760m 512 96 2 F 83749
"""

# The FlashAttention generation each table is compared with beside the newest: the one that
# explains it (see the module docstring).
A100_FLASH_ATTENTION = 1
H100_FLASH_ATTENTION = 2
# (table, preset, rows, FlashAttention generation)
TABLES = [("A100 80GB", "dgx-a100", A100_80GB_ROWS, A100_FLASH_ATTENTION),
          ("H100 80GB", "dgx-h100", H100_80GB_ROWS, H100_FLASH_ATTENTION)]


def published_rows(table: str) -> Iterator[tuple[str, int, int, int, bool, float]]:
    """(model, sequence, micro-batch, accumulation, checkpointing, tokens/s per GPU) of a table above."""
    for row in table.replace("\n", " | ").split("|"):
        if row.strip():
            name, seq, mbs, accumulation, ckpt, tokens = row.split()
            yield name, int(seq), int(mbs), int(accumulation), ckpt == "T", float(tokens)


def predicted_tokens_per_gpu(cluster: Mapping[str, Any], name: str, seq: int, mbs: int, accumulation: int,
                             checkpointing: bool, flash_attention_version: int | None) -> float:
    """The cost model's tokens/s per GPU for one MPT run on one 8-GPU node, laid out as it ran (FSDP)."""
    hidden, heads, layers = MPT_SHAPES[name]
    model = {"num_layers": layers, "hidden_size": hidden, "num_attention_heads": heads, "seq_length": seq,
             "vocab_size": 50368, "tie_embeddings": True}
    layout = {"tp": 1, "pp": 1, "cp": 1, "dp": 8, "micro_batch_size": mbs, "zero_stage": 3,
              "recompute": "full" if checkpointing else "none"}
    training = {"global_batch_sequences": mbs * accumulation * 8, "flash_attention_version": flash_attention_version}
    (prediction,) = evaluate_layouts(model, {**cluster, "nodes": 1}, training, [layout])
    return prediction.tokens_per_s / 8


def table_errors(preset: str, table: str, flash_attention_version: int | None) -> list[tuple[str, int, bool, float]]:
    """(model, sequence, checkpointing, predicted / published - 1) for every row."""
    return [(name, seq, ckpt,
             predicted_tokens_per_gpu({"preset": preset}, name, seq, mbs, acc, ckpt, flash_attention_version)
             / published - 1.0)
            for name, seq, mbs, acc, ckpt, published in published_rows(table)]


def _summary(errors: list[tuple[str, int, bool, float]]) -> str:
    e = np.array([err for *_, err in errors])
    by_seq: dict[int, list[float]] = {}
    for _, seq, _, err in errors:
        by_seq.setdefault(seq, []).append(err)
    per_seq = " ".join(f"{seq}:{np.median(v):+.0%}" for seq, v in sorted(by_seq.items()))
    return (f"median {np.median(e):+.1%}, mean |err| {np.mean(np.abs(e)):.1%}, within 10%: "
            f"{np.count_nonzero(np.abs(e) < 0.10)}/{e.size}; median by sequence length: {per_seq}")


def main() -> None:
    for title, preset, table, version in TABLES:
        newest = table_errors(preset, table, None)
        older = table_errors(preset, table, version)
        print(f"== {title}: predicted / published tokens/s per GPU - 1 (LLM Foundry MPT, 8 GPUs) ==")
        print(f"{'run':<30}{'newest FA':>11}{f'FA-{version}':>9}")
        for (name, seq, ckpt, err_newest), (*_, err_older) in zip(newest, older):
            print(f"{f'MPT-{name} seq {seq}' + (' ckpt' if ckpt else ''):<30}{err_newest:>+11.1%}{err_older:>+9.1%}")
        print(f"newest FlashAttention: {_summary(newest)}")
        print(f"FlashAttention-{version}:       {_summary(older)}")
        print()


if __name__ == "__main__":
    main()
