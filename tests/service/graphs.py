"""Small request bodies shared by the API tests."""

from __future__ import annotations

import copy

from partitioners.graph.generators import diamond_graph_json as diamond_graph

__all__ = ["LLAMA_70B", "diamond_graph", "measured_timeline", "parallel_plan_request", "plan_request"]


def plan_request(graph: dict | None = None, *, preset: str = "dgx-h100", nodes: int = 1, **options) -> dict:
    return {
        "graph": copy.deepcopy(graph or diamond_graph()),
        "inventory": {"preset": preset, "nodes": nodes},
        "options": options,
    }


def measured_timeline(plan: dict) -> dict:
    """A measured timeline in the simple form, one 1 ms run of every operator of ``plan``
    on the device the plan put it on (what a profiler would send back)."""
    ops, start_s = [], 0.0
    for name, device in sorted(plan["ops"].items()):
        ops.append({"name": name, "device": device, "start_s": start_s, "duration_s": 1e-3})
        start_s += 1e-3
    return {"ops": ops}


LLAMA_70B = {
    "num_layers": 80,
    "hidden_size": 8192,
    "num_attention_heads": 64,
    "num_kv_heads": 8,
    "ffn_hidden_size": 28672,
    "vocab_size": 128256,
    "seq_length": 4096,
    "gated_mlp": True,
}


def parallel_plan_request(**overrides) -> dict:
    """A ``POST /v1/parallel/plan`` body: a Llama-70B shape on 64 H100s, top 3, 64 ranks of the map."""
    request = {
        "model": LLAMA_70B,
        "cluster": {"preset": "dgx-h100", "nodes": 8},
        "training": {"global_batch_sequences": 1024},
        "top_k": 3,
        "rank_map_limit": 64,
    }
    request.update(overrides)
    return request
