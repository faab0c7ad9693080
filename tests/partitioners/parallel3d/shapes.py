"""Test helper: small models and clusters the planner's specifications share."""

from __future__ import annotations

__all__ = ["GPT_SMALL", "A100_NODE", "RECOMPUTE_MODEL", "RECOMPUTE_CLUSTER"]

GPT_SMALL = {"num_layers": 2, "hidden_size": 64, "num_attention_heads": 4, "seq_length": 32, "vocab_size": 100}

A100_NODE = {"preset": "dgx-a100", "nodes": 1}

RECOMPUTE_MODEL = {"num_layers": 32, "hidden_size": 1024, "num_attention_heads": 8, "vocab_size": 32000,
                    "seq_length": 2048}

RECOMPUTE_CLUSTER = {"preset": "dgx-h100", "nodes": 1}

