"""MosaicML's published MPT throughput (LLM Foundry), and the planner's predictions of it.

The tables and the way each row ran are described in ``bench/llm_foundry.py``, which prints
the comparison; the rows live here so that the tests and the bench read the same data.

Source: mosaicml/llm-foundry, scripts/train/benchmarking/README.md, commit 061f2c7: tables
"A100 80GB with 1600 Gbps node-node interconnect (RoCE)", "H100 80GB BF16" and "A100 40GB
with 1600 Gbps node-node interconnect (RoCE)"; PyTorch FSDP FULL_SHARD, flash attention.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from partitioners.parallel3d.planner import evaluate_layouts
from partitioners.parallel3d.published.runs import specs_of
from partitioners.parallel3d.spec_fields import spec_from_mapping
from partitioners.parallel3d.specs import LayoutSpec

# MPT shapes (llm-foundry scripts/train/yamls/pretrain/mpt-*.yaml): d_model, heads, layers;
# vocabulary 50,368, 4x GELU MLP, ALiBi, tied embeddings, no dropout.
MPT_SHAPES = {
    "125m": (768, 12, 12),
    "350m": (1024, 16, 24),
    "760m": (1536, 12, 24),
    "1b": (2048, 16, 24),
    "3b": (2560, 20, 32),
    "7b": (4096, 32, 32),
    "13b": (5120, 40, 40),
    "30b": (7168, 56, 48),
    "70b": (8192, 64, 80),
}


# Rows: model, sequence length, GPUs, micro-batch, gradient accumulation, activation
# checkpointing (T/F), published tokens/s per GPU. Every "amp_bf16" row of the 80GB tables
# (their two 70B rows on A100 ran "bf16 PURE" and are left out).
A100_80GB_ROWS = """
30b 8192 8 1 21 T 574 | 30b 4096 8 1 21 T 814 | 30b 2048 8 3 21 T 916 | 30b 1024 8 6 21 T 946 | 30b 512 8 12 21 T 967
13b 32768 8 1 3 T 1016 | 13b 16384 8 3 3 T 1431 | 13b 8192 8 5 3 T 1795 | 13b 4096 8 10 3 T 2060 | 13b 2048 8 2 3 F 2262
13b 1024 8 40 3 T 2330 | 7b 65536 8 1 2 T 1013 | 7b 32768 8 2 2 T 1672 | 7b 16384 8 4 2 T 2453 | 7b 8192 8 8 2 T 3206
7b 4096 8 16 2 T 3684 | 7b 2048 8 6 2 F 4641 | 7b 1024 8 64 2 T 4357 | 3b 65536 8 1 2 T 1767 | 3b 32768 8 3 6 T 3029
3b 16384 8 1 6 F 5529 | 3b 8192 8 3 6 F 7695 | 3b 4096 8 5 6 F 9457 | 3b 2048 8 10 2 F 10811 | 3b 1024 8 20 6 F 11580
3b 512 8 40 6 F 12127 | 1b 65536 8 1 2 T 3044 | 1b 32768 8 1 4 F 6275 | 1b 16384 8 2 4 F 9956 | 1b 8192 8 3 4 F 13814
1b 4096 8 7 4 F 17807 | 1b 2048 8 14 4 F 20513 | 1b 1024 8 18 4 F 22112 | 1b 512 8 56 4 F 23148
760m 65536 8 1 2 T 4143 | 760m 32768 8 1 2 F 8802 | 760m 16384 8 3 2 F 14274 | 760m 8192 8 6 2 F 20933
760m 4096 8 12 2 F 27351 | 760m 2048 8 24 2 F 32434 | 760m 1024 8 48 2 F 29765 | 760m 512 8 96 2 F 29446
350m 65536 8 1 2 F 7524 | 350m 32768 8 2 2 F 13652 | 350m 16384 8 4 2 F 23559 | 350m 8192 8 8 2 F 36569
350m 4096 8 16 2 F 49555 | 350m 2048 8 32 2 F 58782 | 350m 1024 8 64 2 F 64813 | 350m 512 8 128 2 F 69330
125m 65536 8 1 2 F 20368 | 125m 32768 8 2 2 F 36407 | 125m 16384 8 4 2 F 60040 | 125m 8192 8 8 2 F 90392
125m 4096 8 16 2 F 118396 | 125m 2048 8 32 2 F 141737 | 125m 1024 8 64 2 F 156468 | 125m 512 8 128 2 F 165681
"""


H100_80GB_ROWS = """
30b 8192 8 1 21 T 1384 | 30b 4096 8 1 21 T 1802 | 30b 2048 8 3 21 T 2002 | 30b 1024 8 6 21 T 2084
13b 32768 8 1 3 T 1976 | 13b 16384 8 3 3 T 2985 | 13b 4096 8 10 3 T 4717 | 13b 2048 8 2 1 F 4792 | 13b 1024 8 40 3 T 5502
7b 65536 8 1 2 T 1956 | 7b 32768 8 2 2 T 3318 | 7b 8192 8 8 2 T 6935 | 7b 4096 8 16 2 T 8611 | 7b 2048 8 6 1 F 10643
7b 1024 8 64 2 T 10203 | 3b 65536 8 1 2 T 3262 | 3b 32768 8 3 6 T 5873 | 3b 16384 8 1 6 F 11152 | 3b 8192 8 3 6 F 16578
3b 4096 8 5 6 F 20964 | 3b 1024 8 20 6 F 27046 | 3b 512 8 40 6 F 27965 | 1b 65536 8 1 2 T 5506 | 1b 32768 8 1 4 F 12025
1b 16384 8 2 4 F 19649 | 1b 8192 8 3 4 F 29157 | 1b 4096 8 7 4 F 38535 | 1b 2048 8 14 1 F 45455 | 1b 1024 8 18 4 F 48910
1b 512 8 56 4 F 52275 | 760m 32768 8 1 2 F 16291 | 760m 16384 8 3 2 F 27815 | 760m 8192 8 6 2 F 41825
760m 4096 8 12 2 F 55459 | 760m 2048 8 24 2 F 63147 | 760m 1024 8 48 2 F 78581 | 760m 512 8 96 2 F 83749
70b 2048 64 8 4 T 1039 | 70b 2048 32 2 16 T 882 | 30b 2048 32 14 3 T 2308 | 30b 2048 16 10 3 T 2263
13b 2048 64 2 1 F 4800 | 13b 2048 32 2 1 F 4811 | 13b 2048 16 2 1 F 4767 | 3b 2048 64 6 3 F 22525
3b 2048 32 6 3 F 23021 | 3b 2048 16 10 3 F 24142 | 1b 2048 64 20 1 F 44402 | 1b 2048 32 20 1 F 45130
1b 2048 16 20 1 F 46037 | 760m 2048 32 24 1 F 67971 | 760m 2048 16 24 1 F 68551
"""


# "A100 40GB with 1600 Gbps node-node interconnect (RoCE)": every row, 8 to 128 GPUs, "bf16 PURE"
# (gradients reduced in bf16).
A100_40GB_ROWS = """
70b 2048 128 4 1 T 376 | 70b 2048 64 2 1 T 276 | 30b 2048 128 6 1 T 865 | 30b 2048 32 4 1 T 857
13b 8192 8 1 16 T 1407 | 13b 4096 8 2 16 T 1603 | 13b 2048 128 16 1 T 1972 | 13b 2048 64 16 1 T 1976
13b 2048 32 14 1 T 1998 | 13b 2048 16 10 1 T 1993 | 13b 2048 8 4 16 T 1668 | 13b 1024 8 8 16 T 1727
13b 512 8 16 16 T 1763 | 7b 16384 8 1 4 T 2249 | 7b 8192 8 3 4 T 2887 | 7b 4096 8 6 4 T 3366
7b 2048 128 18 1 T 3623 | 7b 2048 64 18 1 T 3665 | 7b 2048 32 18 1 T 3725 | 7b 2048 16 16 1 T 3645
7b 2048 8 12 4 T 3679 | 7b 1024 8 24 4 T 3854 | 7b 512 8 48 4 T 3895 | 3b 32768 8 1 4 T 2955
3b 16384 8 2 8 T 4465 | 3b 8192 8 1 8 F 7149 | 3b 4096 8 2 8 F 8777 | 3b 2048 128 6 1 F 9538
3b 2048 64 6 1 F 9736 | 3b 2048 32 6 1 F 9914 | 3b 2048 16 5 1 F 9750 | 3b 2048 8 5 8 F 10065
3b 1024 8 10 8 F 10731 | 3b 512 8 20 8 F 11324 | 1b 32768 8 1 4 T 5095 | 1b 16384 8 1 8 F 9715
1b 8192 8 2 8 F 13474 | 1b 4096 8 4 8 F 16856 | 1b 2048 128 10 1 F 18647 | 1b 2048 64 10 1 F 19001
1b 2048 32 10 1 F 15555 | 1b 2048 16 8 1 F 19085 | 1b 2048 8 8 8 F 19271 | 1b 1024 8 16 8 F 20959
1b 512 8 32 8 F 21782 | 760m 32768 8 1 4 T 7183 | 760m 16384 8 1 4 F 13914 | 760m 8192 8 3 4 F 20106
760m 4096 8 6 4 F 25863 | 760m 2048 128 12 1 F 28940 | 760m 2048 64 12 1 F 29344 | 760m 2048 32 12 1 F 29648
760m 2048 16 12 1 F 29607 | 760m 2048 8 12 4 F 30173 | 760m 1024 8 24 4 F 33422 | 760m 512 8 48 4 F 34938
350m 32768 8 1 4 F 13416 | 350m 16384 8 2 4 F 22896 | 350m 8192 8 4 4 F 34933 | 350m 4096 8 8 4 F 46833
350m 2048 128 18 1 F 51934 | 350m 2048 64 18 1 F 52689 | 350m 2048 32 18 1 F 53811 | 350m 2048 16 18 1 F 55413
350m 2048 8 16 4 F 55995 | 350m 1024 8 32 4 F 62523 | 350m 512 8 64 4 F 66284 | 125m 32768 8 1 4 F 32651
125m 16384 8 2 3 F 55484 | 125m 8192 8 5 3 F 86858 | 125m 4096 8 13 3 F 115162 | 125m 2048 128 26 1 F 123936
125m 2048 64 26 1 F 125234 | 125m 2048 32 26 1 F 127122 | 125m 2048 16 26 1 F 130535 | 125m 2048 8 26 3 F 136334
125m 1024 8 52 3 F 148289 | 125m 512 8 104 3 F 156735
"""


# The FlashAttention generation each table is compared with beside the newest: the one that
# explains it (see the module docstring).
A100_FLASH_ATTENTION = 1


H100_FLASH_ATTENTION = 2


# (table, preset, rows, FlashAttention generation, gradient bytes per parameter)
TABLES = [
    ("A100 80GB", "dgx-a100", A100_80GB_ROWS, A100_FLASH_ATTENTION, 4),
    ("H100 80GB", "dgx-h100", H100_80GB_ROWS, H100_FLASH_ATTENTION, 4),
    ("A100 40GB", "dgx-a100-40gb", A100_40GB_ROWS, A100_FLASH_ATTENTION, 2),
]


def published_rows(table: str) -> Iterator[tuple[str, int, int, int, int, bool, float]]:
    """(model, sequence, GPUs, micro-batch, accumulation, checkpointing, tokens/s per GPU) of a table above."""
    for row in table.replace("\n", " | ").split("|"):
        if row.strip():
            name, seq, gpus, mbs, accumulation, ckpt, tokens = row.split()
            yield name, int(seq), int(gpus), int(mbs), int(accumulation), ckpt == "T", float(tokens)


def predicted_tokens_per_gpu(
    cluster: Mapping[str, Any],
    name: str,
    seq: int,
    gpus: int,
    mbs: int,
    accumulation: int,
    checkpointing: bool,
    flash_attention_version: int | None,
    grad_bytes_per_param: int = 4,
) -> float:
    """The cost model's tokens/s per GPU for one MPT run on nodes of 8 GPUs, laid out as it ran (FSDP)."""
    hidden, heads, layers = MPT_SHAPES[name]
    model = {
        "num_layers": layers,
        "hidden_size": hidden,
        "num_attention_heads": heads,
        "seq_length": seq,
        "vocab_size": 50368,
        "tie_embeddings": True,
    }
    layout = {
        "tp": 1,
        "pp": 1,
        "cp": 1,
        "dp": gpus,
        "micro_batch_size": mbs,
        "zero_stage": 3,
        "recompute": "full" if checkpointing else "none",
    }
    training = {
        "global_batch_sequences": mbs * accumulation * gpus,
        "flash_attention_version": flash_attention_version,
        "grad_bytes_per_param": grad_bytes_per_param,
    }
    (prediction,) = evaluate_layouts(
        *specs_of(model, {**cluster, "nodes": gpus // 8}, training), [spec_from_mapping(LayoutSpec, layout)]
    )
    return prediction.tokens_per_s / gpus


def table_errors(
    preset: str, table: str, flash_attention_version: int | None, grad_bytes_per_param: int
) -> list[tuple[str, int, int, bool, float]]:
    """(model, sequence, GPUs, checkpointing, predicted / published - 1) for every row."""
    return [
        (
            name,
            seq,
            gpus,
            ckpt,
            predicted_tokens_per_gpu(
                {"preset": preset}, name, seq, gpus, mbs, acc, ckpt, flash_attention_version, grad_bytes_per_param
            )
            / published
            - 1.0,
        )
        for name, seq, gpus, mbs, acc, ckpt, published in published_rows(table)
    ]
