"""Communication time: tensor, pipeline, expert and context-parallel exchanges (partitioners.parallel3d.comm, cost).

Expected values are worked by hand from the published formulas the docstrings
cite: Narayanan et al. SC21 (FLOPs, bubble), Korthikanti et al. 2022 (activation
memory), ZeRO (bytes per parameter per stage).
"""

from __future__ import annotations

import numpy as np
import pytest

from partitioners.hardware.collectives import LinkSpec, allreduce_time_s, p2p_time_s
from partitioners.parallel3d import cost as parallel3d_cost
from partitioners.parallel3d.comm import OVERLAP_COMPUTE_SLOWDOWN, chunked_collective_time_s, overlapped_time_s
from partitioners.parallel3d.cost import (
    _NVLINK_EFFICIENCY,
    _P2P_SYNC_S,
    _context_parallel_merge_s,
    _device_rates,
    predict_layouts,
)
from partitioners.parallel3d.planner import evaluate_layouts
from tests.partitioners.parallel3d.layouts import layouts
from tests.partitioners.parallel3d.shapes import (
    A100_NODE,
    GPT_SMALL,
    cluster_spec,
    layout_specs,
    model_spec,
    training_spec,
)


def test_tensor_parallel_time_is_four_allreduces_per_layer_plus_the_embedding_on_nvlink():
    model = model_spec(GPT_SMALL)
    cluster = cluster_spec(A100_NODE)
    # the 2021 code: every collective in line
    training = training_spec({"global_batch_sequences": 4, "overlap_tp_backward": False})
    pred = predict_layouts(model, cluster, training, layouts(dp=2, tp=4, mbs=1))
    link = LinkSpec(cluster.intra_node_bandwidth_bytes_per_s * _NVLINK_EFFICIENCY, cluster.intra_node_latency_s)
    one = allreduce_time_s(32 * 64 * 2, 4, link)  # s x h bf16 activations of one micro-batch
    micro_batches, n_layers = 2, 2
    # 2 forward + 2 backward per layer, and one forward for the vocabulary-parallel embedding rows
    assert float(pred["tp_comm_s"][0]) == pytest.approx(micro_batches * (n_layers * 4 * one + one))


def test_nvlink_sharp_speeds_up_full_node_tensor_allreduces_but_not_sequence_parallel_rings():
    model = model_spec({**GPT_SMALL, "num_attention_heads": 8})
    h100 = cluster_spec({"preset": "dgx-h100", "nodes": 1})
    ring_only = cluster_spec({"preset": "dgx-h100", "nodes": 1, "nvls_allreduce_speedup": 1.0})
    assert h100.nvls_allreduce_speedup == pytest.approx(480 / 370)  # busBw, NVIDIA/nccl-tests#212

    def tp_s(cluster, sp, **lay):
        # every collective in line, so the time scales with the link (none hides under a GEMM)
        training = training_spec({"global_batch_sequences": 4, "sequence_parallel": sp, "overlap_tp_backward": False})
        return float(predict_layouts(model, cluster, training, layouts(**lay))["tp_comm_s"][0])

    # all-reduces across the 8 GPUs of a node run 480/370 times faster with NVLS ...
    assert tp_s(h100, False, tp=8) * 480 / 370 == pytest.approx(tp_s(ring_only, False, tp=8))
    # ... sequence parallelism's all-gather / reduce-scatter do not use it ...
    assert tp_s(h100, True, tp=8) == pytest.approx(tp_s(ring_only, True, tp=8))
    # ... and on four GPUs NVLS measures as the ring (NVIDIA/nccl#1455)
    assert tp_s(h100, False, tp=4, dp=2) == pytest.approx(tp_s(ring_only, False, tp=4, dp=2))


def test_every_batched_pipeline_exchange_pays_transfer_and_a_host_synchronisation():
    model = model_spec({**GPT_SMALL, "num_layers": 4})
    cluster = cluster_spec(A100_NODE)
    training = training_spec({"global_batch_sequences": 4, "overlap_p2p_comm": False})
    pred = predict_layouts(model, cluster, training, layouts(pp=2, v=2, mbs=1))
    link = LinkSpec(cluster.intra_node_bandwidth_bytes_per_s * _NVLINK_EFFICIENCY, cluster.intra_node_latency_s)
    # 4 micro-batches x 2 directions x 2 chunks, s x h bf16 activations over NVLink, plus
    # Megatron's torch.cuda.synchronize() after each batched send/recv
    one = p2p_time_s(32 * 64 * 2, link) + _P2P_SYNC_S
    assert float(pred["pp_comm_s"][0]) == pytest.approx(4 * 2 * 2 * one)


def test_overlapped_interleaved_exchanges_run_under_the_chunk_that_waits_for_them():
    # Megatron-Core overlap_p2p_comm: each send/recv posted asynchronously, no device sync;
    # a 4096-wide layer's chunk covers its 16 MiB exchange, which still slows it
    model = model_spec(
        {"num_layers": 8, "hidden_size": 4096, "num_attention_heads": 32, "seq_length": 2048, "vocab_size": 32000}
    )
    cluster = cluster_spec(A100_NODE)
    training = training_spec({"global_batch_sequences": 8})
    pred = predict_layouts(model, cluster, training, layouts(pp=4, v=2, mbs=1))
    link = LinkSpec(cluster.intra_node_bandwidth_bytes_per_s * _NVLINK_EFFICIENCY, cluster.intra_node_latency_s)
    one = p2p_time_s(2048 * 4096 * 2, link)
    assert float(pred["pp_comm_s"][0]) == pytest.approx(8 * 2 * 2 * OVERLAP_COMPUTE_SLOWDOWN * one)


def test_1f1b_keeps_the_batched_pipeline_exchange_whatever_the_overlap_setting():
    model = model_spec({**GPT_SMALL, "num_layers": 4})
    cluster = cluster_spec(A100_NODE)
    pp_comm = {
        overlap: float(
            predict_layouts(
                model,
                cluster,
                training_spec({"global_batch_sequences": 4, "overlap_p2p_comm": overlap}),
                layouts(pp=2, v=1),
            )["pp_comm_s"][0]
        )
        for overlap in (False, True)
    }
    assert pp_comm[True] == pp_comm[False] > 0


def test_a_collective_hidden_under_compute_still_costs_the_slowdown_it_causes():
    # Lee et al. 2025: overlapped computation runs 18.9% slower on average
    assert pytest.approx(0.189) == OVERLAP_COMPUTE_SLOWDOWN
    assert float(overlapped_time_s(1.0, 3.0)) == pytest.approx(0.189)  # fully hidden
    assert float(overlapped_time_s(3.0, 1.0)) == pytest.approx(2.0 + 0.189)  # 1 s hidden, 2 s exposed
    assert float(overlapped_time_s(1.0, 3.0, 0.25)) == pytest.approx(0.25 + 0.75 * 0.189)  # a floor stays out


def test_a_collective_issued_chunk_by_chunk_leaves_only_the_last_share_and_any_queue_exposed():
    slow = OVERLAP_COMPUTE_SLOWDOWN
    # 4 shares of 1 s launched 2 s apart: three hide, the last trails whole
    assert float(chunked_collective_time_s(4.0, 1.0, 4, 2.0)) == pytest.approx(1.0 + 3.0 * slow)
    # launched 0.5 s apart, each share waits for the one before: 3 x 0.5 s more trails
    assert float(chunked_collective_time_s(4.0, 1.0, 4, 0.5)) == pytest.approx(2.5 + 1.5 * slow)
    # never more than the whole collective
    assert float(chunked_collective_time_s(4.0, 1.0, 4, 0.0)) == pytest.approx(4.0)


def test_overlapping_expert_all_to_all_hides_it_under_another_micro_batch_but_still_slows_it():
    # 64 experts over ep=16 across two nodes: the all-to-all leaves NVLink
    model = model_spec(
        {
            "num_layers": 4,
            "hidden_size": 4096,
            "num_attention_heads": 32,
            "seq_length": 4096,
            "vocab_size": 32000,
            "moe": {"num_experts": 64, "experts_per_token": 8, "expert_ffn_hidden_size": 1408},
        }
    )
    cluster = cluster_spec({"preset": "dgx-h100", "nodes": 2})
    lay = layouts(dp=16, ep=16, mbs=1)
    exposed = {}
    for overlap in (False, True):
        training = training_spec({"global_batch_sequences": 16, "overlap_ep_comm": overlap})
        exposed[overlap] = float(predict_layouts(model, cluster, training, lay)["ep_comm_s"][0])
    assert 0.0 < exposed[True] < exposed[False]
    # wholly hidden, what stays is the slowdown of the computation it ran under (Lee et al. 2025)
    assert exposed[True] >= OVERLAP_COMPUTE_SLOWDOWN * exposed[False] - 1e-12


def test_an_overlapped_all_to_all_longer_than_the_block_it_is_paired_with_stays_partly_exposed():
    # the layer's computation (10.5 s) could cover all four exchanges (4 s) together, but the
    # backward's combine runs only under the forward's attention (0.5 s)
    a2a = np.array([1.0])
    exposed = parallel3d_cost._paired_expert_exchange_s(
        a2a,
        attention_fwd_s=np.array([0.5]),
        mlp_fwd_s=np.array([3.0]),
        attention_bwd_s=np.array([1.0]),
        mlp_bwd_s=np.array([6.0]),
    )
    hidden = 4.0 - 0.5
    assert exposed[0] == pytest.approx(0.5 + OVERLAP_COMPUTE_SLOWDOWN * hidden)


def test_context_parallel_merges_cost_a_rank_the_same_at_every_cp_and_nothing_without_it():
    # Transformer Engine folds each ring step's partial output (forward) and dq / dkv
    # (backward) into a running bf16 tensor: 6 bytes per element and step over the local
    # tokens, so s x mbs elements per rank at any cp
    model = model_spec(
        {**GPT_SMALL, "hidden_size": 1024, "num_attention_heads": 8, "num_kv_heads": 2, "seq_length": 8192}
    )
    rates = _device_rates(cluster_spec(A100_NODE), training_spec({"global_batch_sequences": 8}))
    cps = np.array([1.0, 2.0, 4.0, 8.0])
    forward, backward = _context_parallel_merge_s(model, rates, 8192 / cps, np.ones(4), cps)
    assert forward[0] == backward[0] == 0.0
    assert forward[1:] == pytest.approx(np.full(3, 8192 * 6 * 1024 / rates.hbm_achieved_bytes_per_s))
    assert backward[1:] == pytest.approx(np.full(3, 8192 * 6 * (1024 + 2 * 256) / rates.hbm_achieved_bytes_per_s))


def test_a_context_parallel_step_charges_the_merges_to_compute_and_recomputes_the_forward_ones(monkeypatch):
    model = {**GPT_SMALL, "num_layers": 4, "hidden_size": 1024, "num_attention_heads": 8, "seq_length": 8192}

    def compute_s(recompute):
        layout = [{"tp": 1, "pp": 1, "cp": 2, "micro_batch_size": 1, "recompute": recompute}]
        return evaluate_layouts(
            model_spec(model),
            cluster_spec(A100_NODE),
            training_spec({"global_batch_sequences": 4}),
            layout_specs(layout),
        )[0].time_breakdown_s["compute_s"]

    charged = {rc: compute_s(rc) for rc in ("none", "full")}
    merges = parallel3d_cost._context_parallel_merge_s(
        model_spec(model),
        parallel3d_cost._device_rates(cluster_spec(A100_NODE), training_spec({"global_batch_sequences": 8})),
        np.array([4096.0]),
        np.array([1.0]),
        np.array([2.0]),
    )
    monkeypatch.setattr(parallel3d_cost, "_context_parallel_merge_s", lambda *args: (np.zeros(1), np.zeros(1)))
    free = {rc: compute_s(rc) for rc in ("none", "full")}
    # 4 layers, one micro-batch per rank (4 sequences over dp 4 on the node's 8 GPUs)
    forward, backward = float(merges[0][0]), float(merges[1][0])
    assert charged["none"] - free["none"] == pytest.approx(4 * (forward + backward))
    assert charged["full"] - free["full"] == pytest.approx(4 * (2 * forward + backward))


@pytest.mark.parametrize("sequence_parallel", [False, True])
def test_a_parallel_block_reduces_its_attention_and_mlp_outputs_once(sequence_parallel):
    # with every tensor-parallel collective in line: 2 + 2 all-reduce equivalents per layer
    # for a sequential block, 1 + 2 (or 1.5 + 1.5 with sequence parallelism) for a parallel one
    training = {"global_batch_sequences": 64, "sequence_parallel": sequence_parallel, "overlap_tp_backward": False}
    layout = [{"tp": 8, "pp": 1, "cp": 1, "micro_batch_size": 1, "recompute": "none"}]

    def tp_comm_s(layers, parallel):
        model = {
            **GPT_SMALL,
            "num_layers": layers,
            "hidden_size": 1024,
            "num_attention_heads": 8,
            "seq_length": 2048,
            "parallel_attention_mlp": parallel,
        }
        return evaluate_layouts(
            model_spec(model), cluster_spec(A100_NODE), training_spec(training), layout_specs(layout)
        )[0].time_breakdown_s["tp_comm_s"]

    # four more sequential layers isolate the layers' share from the embedding's all-reduce
    sequential_layer_s = (tp_comm_s(8, False) - tp_comm_s(4, False)) / 4
    assert tp_comm_s(4, False) - tp_comm_s(4, True) == pytest.approx(4 * sequential_layer_s / 4)
