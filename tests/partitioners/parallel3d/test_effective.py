"""The run's flags resolve into physical terms in one place (partitioners.parallel3d.effective)."""

from __future__ import annotations

import pytest

from partitioners.parallel3d.effective import TP_ASYNC_BACKWARD, TP_IN_LINE, TP_PIPELINED, effective_terms
from partitioners.parallel3d.kernels import HOST_S_PER_EXPERT_OP, expert_host_issue_time_s
from tests.partitioners.parallel3d.shapes import training_spec


def _terms(**flags):
    return effective_terms(training_spec({"global_batch_sequences": 8, **flags}))


def test_pipelined_tensor_parallel_collectives_replace_the_asynchronous_backward_ones():
    assert _terms(overlap_tp_comm=True, overlap_tp_backward=True).tp_overlap == TP_PIPELINED
    assert _terms().tp_overlap == TP_ASYNC_BACKWARD
    assert _terms(software="megatron-lm-2021").tp_overlap == TP_IN_LINE


def test_scatter_gather_pipeline_sends_matter_only_without_sequence_parallelism():
    assert _terms(pipeline_scatter_gather=False).pipeline_send == "shard"
    assert _terms(sequence_parallel=False).pipeline_send == "shard-then-gather"
    assert _terms(sequence_parallel=False, pipeline_scatter_gather=False).pipeline_send == "whole"


def test_an_fp32_gradient_copy_costs_nothing_when_gradients_are_fp32_already():
    assert _terms(fp32_grad_copy_kept=True).fp32_gradient_copy_bytes == 0.0
    assert _terms(fp32_grad_copy_kept=True, grad_bytes_per_param=2).fp32_gradient_copy_bytes == 4.0


def test_every_assumption_names_its_source():
    terms = _terms(software="megatron-lm-2022")
    assert terms.assumptions and all(a.source and a.value for a in terms.assumptions)


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ({"precision": "bf16"}, (2.0, 4.0)),  # a GEMM per linear forward; input and weight gradient backward
        ({"precision": "fp8", "fp8_scaling": "delayed"}, (4.0, 6.0)),  # + one cast of each quantized operand
        ({"precision": "fp8", "fp8_scaling": "current"}, (6.0, 8.0)),  # + an amax pass before each cast
    ],
)
def test_the_host_issues_each_local_experts_gemms_and_casts_one_by_one(fields, expected):
    terms = effective_terms(training_spec({"global_batch_sequences": 8, **fields}))
    assert (terms.expert_host_ops_forward, terms.expert_host_ops_backward) == expected


def test_the_host_time_of_an_expert_mlp_grows_with_its_local_experts():
    # Qwen3-30B-A3B on ep 8: 16 local experts, 14 operations each forward + backward in FP8
    # with current scaling, at 45 us each: 16 x 14 x 45 us = 10.08 ms per layer and micro-batch
    assert float(expert_host_issue_time_s(16, 14.0)) == pytest.approx(16 * 14 * HOST_S_PER_EXPERT_OP)
    assert float(expert_host_issue_time_s(16, 14.0)) == pytest.approx(10.08e-3)
