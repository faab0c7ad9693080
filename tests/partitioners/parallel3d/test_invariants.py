"""Invariants of the planner checked with hypothesis.

Expected values are worked by hand from the published formulas the docstrings
cite: Narayanan et al. SC21 (FLOPs, bubble), Korthikanti et al. 2022 (activation
memory), ZeRO (bytes per parameter per stage).
"""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from partitioners.errors import InvalidInput
from partitioners.parallel3d.cost import predict_layouts
from partitioners.parallel3d.planner import (
    enumerate_layouts,
    evaluate_layouts,
    plan_parallel_layout,
)
from tests.partitioners.parallel3d.shapes import (
    A100_NODE,
    cluster_spec,
    constraints_spec,
    layout_specs,
    model_spec,
    training_spec,
)


@settings(max_examples=15, deadline=None)
@given(
    layers=st.integers(2, 12),
    heads_exp=st.integers(2, 4),
    batch=st.sampled_from([8, 16, 24, 64]),
    nodes=st.integers(1, 2),
)
def test_every_ranked_layout_uses_all_gpus_splits_the_batch_and_fits(layers, heads_exp, batch, nodes):
    heads = 2**heads_exp
    model = {
        "num_layers": layers,
        "hidden_size": 64 * heads,
        "num_attention_heads": heads,
        "seq_length": 512,
        "vocab_size": 1000,
    }
    plan = plan_parallel_layout(
        model_spec(model),
        cluster_spec({"preset": "dgx-a100", "nodes": nodes}),
        training_spec({"global_batch_sequences": batch}),
        top_k=20,
    )
    for c in plan.candidates:
        assert c.dp * c.tp * c.pp * c.cp == 8 * nodes
        assert batch % (c.dp * c.micro_batch_size) == 0
        assert c.memory.total_bytes <= c.memory.capacity_bytes and not c.reasons
    times = [c.step_time_s for c in plan.candidates if not c.tie_with_best]
    assert times == sorted(times)


@settings(max_examples=40, deadline=None)
@given(
    layers=st.integers(2, 13),
    moe_layers=st.sets(st.integers(0, 12)),
    experts_exp=st.integers(1, 6),
    top_k=st.sampled_from([1, 2, 8]),
    vocab=st.sampled_from([256, 32000]),
    batch=st.sampled_from([2, 8, 64]),
    nodes=st.sampled_from([1, 2]),
)
def test_every_searched_layouts_time_parts_are_non_negative_and_add_up_to_its_step(
    layers, moe_layers, experts_exp, top_k, vocab, batch, nodes
):
    # dense or MoE layers anywhere (uneven stages hold different MoE shares), small or large vocabularies
    model = {
        "num_layers": layers,
        "hidden_size": 2048,
        "num_attention_heads": 16,
        "num_kv_heads": 4,
        "seq_length": 2048,
        "vocab_size": vocab,
    }
    moe_layers = sorted(i for i in moe_layers if i < layers)
    if moe_layers:
        experts = 2**experts_exp
        model["moe"] = {
            "num_experts": experts,
            "experts_per_token": min(top_k, experts),
            "expert_ffn_hidden_size": 2048,
            "moe_layers": moe_layers,
        }
    spec = model_spec(model)
    cluster = cluster_spec({"preset": "dgx-h100", "nodes": nodes})
    training = training_spec({"global_batch_sequences": batch})
    lay = enumerate_layouts(spec, cluster, training, constraints_spec(None))
    pred = predict_layouts(spec, cluster, training, lay)
    parts = np.stack(
        [
            pred[k]
            for k in (
                "compute_s",
                "tp_comm_s",
                "cp_comm_s",
                "ep_comm_s",
                "pp_comm_s",
                "bubble_s",
                "dp_comm_exposed_s",
                "optimizer_s",
            )
        ]
    )
    assert np.all(parts >= 0.0)
    np.testing.assert_allclose(parts.sum(axis=0), pred["step_time_s"], rtol=1e-9)


@settings(max_examples=60, deadline=None)
@given(
    layers=st.integers(2, 13),
    moe_layers=st.sets(st.integers(0, 12)),
    pp=st.sampled_from([1, 2, 4]),
    tp=st.sampled_from([1, 2, 4]),
    field=st.sampled_from(["inter_node_bandwidth_bytes_per_s", "intra_node_bandwidth_bytes_per_s", "peak_flops_per_s"]),
)
def test_faster_hardware_never_slows_a_fixed_layout(layers, moe_layers, pp, tp, field):
    model = {
        "num_layers": layers,
        "hidden_size": 4096,
        "num_attention_heads": 32,
        "num_kv_heads": 8,
        "seq_length": 2048,
        "vocab_size": 32000,
    }
    moe_layers = sorted(i for i in moe_layers if i < layers)
    if moe_layers:
        model["moe"] = {
            "num_experts": 16,
            "experts_per_token": 2,
            "expert_ffn_hidden_size": 4096,
            "moe_layers": moe_layers,
        }
    cluster = {"preset": "dgx-h100", "nodes": 2}
    spec = cluster_spec(cluster)
    faster_value = (
        {k: 1.5 * v for k, v in spec.peak_flops_per_s.items()}
        if field == "peak_flops_per_s"
        else 1.5 * getattr(spec, field)
    )
    training = {"global_batch_sequences": 64}
    layout = [
        {
            "tp": tp,
            "pp": pp,
            "cp": 1,
            "ep": 2 if moe_layers else 1,
            "virtual_stages": 1,
            "micro_batch_size": 1,
            "zero_stage": 1,
            "recompute": "none",
        }
    ]
    (base,) = evaluate_layouts(model_spec(model), cluster_spec(cluster), training_spec(training), layout_specs(layout))
    (faster,) = evaluate_layouts(
        model_spec(model), cluster_spec({**cluster, field: faster_value}), training_spec(training), layout_specs(layout)
    )
    assert faster.step_time_s <= base.step_time_s * (1 + 1e-12)


@settings(max_examples=60, deadline=None)
@given(
    layers=st.integers(1, 9),
    moe_layers=st.sets(st.integers(0, 8)),
    pp=st.sampled_from([1, 2, 4]),
    seq=st.sampled_from([2048, 16384]),
    flash=st.booleans(),
    recompute=st.sampled_from(["selective", "full", "op-sac"]),
)
def test_recomputation_never_needs_more_memory_than_keeping_everything(layers, moe_layers, pp, seq, flash, recompute):
    model = {
        "num_layers": layers,
        "hidden_size": 2048,
        "num_attention_heads": 16,
        "seq_length": seq,
        "vocab_size": 32000,
    }
    moe_layers = sorted(i for i in moe_layers if i < layers)
    if moe_layers:
        model["moe"] = {
            "num_experts": 8,
            "experts_per_token": 2,
            "expert_ffn_hidden_size": 1024,
            "moe_layers": moe_layers,
        }
    training = {"global_batch_sequences": 16, "flash_attention": flash}
    if recompute == "op-sac":
        training["software"] = "torchtitan"  # its variant, and its ZeRO stages (no ZeRO-1)
    cluster = {"preset": "dgx-h100", "nodes": 1}
    zero_stage = 0 if recompute == "op-sac" else 1
    layout = {"tp": 1, "pp": pp, "cp": 1, "ep": 1, "virtual_stages": 1, "micro_batch_size": 1, "zero_stage": zero_stage}
    try:
        kept, recomputed = evaluate_layouts(
            model_spec(model),
            cluster_spec(cluster),
            training_spec(training),
            layout_specs([{**layout, "recompute": "none"}, {**layout, "recompute": recompute}]),
        )
    except InvalidInput:  # more stages than layers
        assert pp > layers
        return
    assert recomputed.memory.total_bytes <= kept.memory.total_bytes * (1 + 1e-12)


@settings(max_examples=10, deadline=None)
@given(memory_gib=st.sampled_from([16, 24, 40, 80]), layers=st.sampled_from([8, 12, 16]))
def test_more_memory_per_gpu_never_slows_the_best_layout(memory_gib, layers):
    model = {
        "num_layers": layers,
        "hidden_size": 4096,
        "num_attention_heads": 32,
        "seq_length": 2048,
        "vocab_size": 32000,
    }
    base = {"gpu": "a100-80gb", "num_nodes": 1}
    small = plan_parallel_layout(
        model_spec(model),
        cluster_spec({**base, "memory_bytes": memory_gib * 2**30}),
        training_spec({"global_batch_sequences": 64}),
        constraints_spec({"tie_tolerance": 0.0}),
        with_rank_map=False,
    )
    large = plan_parallel_layout(
        model_spec(model),
        cluster_spec({**base, "memory_bytes": 2 * memory_gib * 2**30}),
        training_spec({"global_batch_sequences": 64}),
        constraints_spec({"tie_tolerance": 0.0}),
        with_rank_map=False,
    )
    if small.feasible:
        assert large.candidates[0].step_time_s <= small.candidates[0].step_time_s


@settings(max_examples=15, deadline=None)
@given(tp_exp=st.integers(0, 3), fewer_exp=st.integers(0, 4), more_exp=st.integers(0, 4))
def test_fewer_kv_heads_never_cost_a_rank_more_memory_or_compute(tp_exp, fewer_exp, more_exp):
    # (not step time: a larger QKV projection hides more of the asynchronous backward
    # all-reduce, so the step can shrink as KV heads are added)
    fewer, more = sorted((2**fewer_exp, 2**more_exp))
    model = {"num_layers": 4, "hidden_size": 2048, "num_attention_heads": 16, "seq_length": 2048, "vocab_size": 32000}
    layout = [{"tp": 2**tp_exp, "pp": 1, "cp": 1, "micro_batch_size": 1, "zero_stage": 1, "recompute": "none"}]
    (small,) = evaluate_layouts(
        model_spec({**model, "num_kv_heads": fewer}),
        cluster_spec(A100_NODE),
        training_spec({"global_batch_sequences": 64}),
        layout_specs(layout),
    )
    (large,) = evaluate_layouts(
        model_spec({**model, "num_kv_heads": more}),
        cluster_spec(A100_NODE),
        training_spec({"global_batch_sequences": 64}),
        layout_specs(layout),
    )
    assert not small.reasons and not large.reasons
    assert small.memory.total_bytes <= large.memory.total_bytes * (1 + 1e-12)
    assert small.time_breakdown_s["compute_s"] <= large.time_breakdown_s["compute_s"] * (1 + 1e-12)
