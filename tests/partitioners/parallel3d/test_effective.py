"""The run's flags resolve into physical terms in one place (partitioners.parallel3d.effective)."""

from __future__ import annotations

from partitioners.parallel3d.effective import TP_ASYNC_BACKWARD, TP_IN_LINE, TP_PIPELINED, effective_terms
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
